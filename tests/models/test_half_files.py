"""Half-precision ONNX files on llvm (issue 32, item 2): every zoo model converted to float16 by
onnxconverter_common (`zoo.float16`: float16 inputs and outputs, and float32 ones:
keep_io_types) compiles to
float32 kernels (passes/widen_half.py: no generic per-element loops, no host fallbacks), keeps
its declared output types, and matches onnxruntime on the same file, on fresh random inputs,
within the documented bound: `model_error_bound("fp16")` of the output's largest magnitude
(onnxruntime rounds intermediates to float16 in places, dnnc computes them in float32;
docs/llvm_backend.md, "Half-precision files"). A bfloat16 model computed in float32
(precision="fp32", or a CPU without vdpbf16ps) matches its float32 twin (the same weights,
exactly) up to the one rounding of its output to bfloat16; compiled with no precision named on
a CPU with vdpbf16ps, its products take bf16 operands (precision "bf16") and it matches the
twin within `model_error_bound("bf16")`."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc import zoo
from dnnc.backends.llvm.bf16 import BF16_FEATURES
from dnnc.backends.llvm.cpu import cpu_from, host_target
from dnnc.ir import types as T
from dnnc.ir.target import model_error_bound

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxconverter_common")

SMALL = {"mlp": {}, "cnn": {}, "resnet18": {"size": 32}, "resnet50": {"size": 32},
         "mobilenet_v2": {"size": 32}, "bert": {"seq": 16, "vocab": 512},
         "bert_tiny": {"seq": 16, "vocab": 512},
         "bert_base": {"layers": 1, "seq": 16, "vocab": 512}}
"""Each zoo model at a small size (every op of the full model), as the cuda tests' SMALL."""


def _fresh_rng():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return np.random.default_rng(seed), seed


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float32), want.astype(np.float32)
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("keep_io_types", [False, True], ids=["half-io", "float-io"])
@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_a_float16_zoo_file_runs_in_float32_within_the_bound_of_onnxruntime(name,
                                                                            keep_io_types):
    assert set(SMALL) == set(zoo.MODELS)
    model = zoo.float16(zoo.build(name, batch=1, **SMALL[name]), keep_io_types)
    rng, seed = _fresh_rng()
    feeds = zoo.inputs_for(model, rng)
    compiled = dnnc.compile(model, target="llvm", cache=False, progress=False)
    assert compiled.stats["host_fallback_ops"] == 0
    kernels = compiled.runtime.graph.nodes
    assert all(v.dtype not in (T.float16, T.bfloat16) for n in kernels if n.op != "Cast"
               for v in n.inputs + n.outputs), "float16 values inside the compiled graph"
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    outputs = compiled.run(*feeds.values())
    for out, ref in zip(outputs, expected, strict=True):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        assert _relative_error(out, ref) <= model_error_bound("fp16"), \
            f"{name}: {_relative_error(out, ref):.2e}, input seed {seed}"


def bf16_cnn(dtype: int, rng: np.random.Generator) -> onnx.ModelProto:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax on `dtype` (an ONNX
    element type) inputs, weights and outputs; the weights are bfloat16 values whatever
    `dtype` is (the float32 twin holds the same numbers)."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)

    def weight(name, shape):
        w = rng.standard_normal(shape).astype(np.float32) * 0.3
        return numpy_helper.from_array(w.astype(T.bfloat16.np).astype(np_type), name)

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["g"], transB=1),
             helper.make_node("Softmax", ["g"], ["y"])]
    graph = helper.make_graph(
        nodes, "bf16_cnn", [helper.make_tensor_value_info("x", dtype, [2, 3, 12, 12])],
        [helper.make_tensor_value_info("y", dtype, [2, 10])],
        [weight("w", (16, 3, 3, 3)), weight("b", (16,)), weight("fc", (10, 16)),
         weight("fb", (10,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _bf16_file_and_twin_output(rng, **options):
    x = rng.standard_normal((2, 3, 12, 12)).astype(T.bfloat16.np)
    model = bf16_cnn(TensorProto.BFLOAT16, np.random.default_rng(7))
    twin = bf16_cnn(TensorProto.FLOAT, np.random.default_rng(7))
    compiled = dnnc.compile(model, target="llvm", cache=False, progress=False, **options)
    assert compiled.stats["host_fallback_ops"] == 0
    (got,) = compiled.run(x)
    (want,) = ort.InferenceSession(twin.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32)})
    assert got.dtype == T.bfloat16.np and got.shape == want.shape
    return compiled, got.astype(np.float32), want


@pytest.mark.parametrize("how", ["fp32", "no vdpbf16ps"])
def test_a_bfloat16_file_in_float32_is_its_twin_rounded_once_at_the_output(rng, how):
    options = {"precision": "fp32"} if how == "fp32" else {
        "cpu": cpu_from(mattr="-avx512bf16")}
    compiled, got, want = _bf16_file_and_twin_output(rng, **options)
    assert compiled.stats["precision"] == "fp32"
    # each output rounded once to bfloat16 (unit roundoff 2**-8), plus float32 noise
    np.testing.assert_allclose(got, want, rtol=2.0 ** -8, atol=1e-6)


@pytest.mark.skipif(not BF16_FEATURES <= host_target().feature_set,
                    reason="this CPU has no vdpbf16ps (AVX512_BF16 and AVX512VL)")
def test_a_bfloat16_file_computes_its_products_in_bf16_where_the_cpu_has_vdpbf16ps(rng):
    compiled, got, want = _bf16_file_and_twin_output(rng)
    assert compiled.stats["precision"] == "bf16"
    assert _relative_error(got, want) <= model_error_bound("bf16")


def test_a_float16_file_stays_fp32_whatever_the_cpu():
    model = zoo.float16(zoo.build("mlp", batch=1), keep_io_types=True)
    assert dnnc.compile(model, target="llvm", cache=False,
                        progress=False).stats["precision"] == "fp32"
