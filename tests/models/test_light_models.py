"""The real models of onnx's backend test (`onnx/backend/test/data/light/light_*.onnx`: AlexNet,
DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512, opset 9,
with weights made by ConstantOfShape) import, infer their output shapes and reproduce the
output onnx stores beside each model.

The input is the one onnx's backend runner feeds them (`Runner.generate_dummy_data` with
`random=False`): `arange(n).reshape(shape) / n` as float32, unknown dims taken as 1. The
tolerance is the one onnx's model test case table gives each model (rtol 1e-3, 2e-3 for
DenseNet-121; atol 1e-7), compared the way its runner compares (`assert_allclose`).

The weights are constants, so most stored outputs are a uniform softmax (0.001 everywhere) that
says little; the second test therefore also compares the logits, the final Softmax's input,
with onnxruntime's on the same input.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import dnnc

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _onnx_tolerances() -> dict[str, tuple[float, float]]:
    """model name -> (rtol, atol), from onnx's own table of real-model test cases."""
    from onnx.backend.test.case.model import collect_testcases

    return {case.model_name: (case.rtol, case.atol) for case in collect_testcases()
            if case.kind == "real"}


TOLERANCES = _onnx_tolerances()
MODELS = sorted(p.stem[len("light_"):] for p in LIGHT_DIR.glob("light_*.onnx"))


def runner_input(value_info: onnx.ValueInfoProto) -> np.ndarray:
    """What onnx's backend runner feeds a light model (generate_dummy_data, random=False)."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                  for d in value_info.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def test_every_light_model_has_a_tolerance():
    assert MODELS and set(MODELS) <= set(TOLERANCES)


@pytest.mark.parametrize("name", MODELS)
def test_light_model(name):
    path = LIGHT_DIR / f"light_{name}.onnx"
    model = onnx.load(path)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [runner_input(vi) for vi in model.graph.input if vi.name not in initializers]
    expected = [numpy_helper.to_array(onnx.load_tensor(str(p)))
                for p in sorted(LIGHT_DIR.glob(f"light_{name}_output_*.pb"))]
    assert len(expected) == len(model.graph.output)

    compiled = dnnc.compile(str(path), target="numpy")
    # shape inference gives the stored outputs' static shapes and dtypes before anything runs
    for out_type, ref in zip(compiled.output_types, expected):
        assert out_type.shape == ref.shape and out_type.dtype.np == ref.dtype

    outputs = compiled.run(*inputs)
    rtol, atol = TOLERANCES[name]
    for out, ref in zip(outputs, expected):
        assert out.shape == ref.shape and out.dtype == ref.dtype
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_logits_match_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    model = onnx.load(LIGHT_DIR / f"light_{name}.onnx")
    last = model.graph.node[-1]
    if last.op_type != "Softmax":
        pytest.skip(f"{name} does not end in a Softmax")
    model.graph.output.append(helper.make_tensor_value_info(last.input[0],
                                                            onnx.TensorProto.FLOAT, None))
    initializers = {t.name for t in model.graph.initializer}
    feeds = {vi.name: runner_input(vi) for vi in model.graph.input if vi.name not in initializers}
    options = ort.SessionOptions()
    options.log_severity_level = 3  # unused initializers in the caffe2-exported models
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    logits = dnnc.compile(model, target="numpy").run(*feeds.values())[-1]
    expected = session.run([last.input[0]], feeds)[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-6)


ON_LLVM = [name for name in MODELS if name != "vgg19"]
"""The models the llvm test compiles: all but VGG-19, whose ops (3x3 convs, Relu, max pools,
Gemm) AlexNet's and ZFNet-512's are, and whose compile, the suite's longest test, takes ~25 s
(44 s until session 57 shrank its fused Winograd kernels' LLVM IR from ~23k lines each to
~4k: docs/llvm_backend.md, "Compile time"; most of the rest is its layout passes and the
code's Python and machine-code generation)."""


@pytest.mark.parametrize("name", ON_LLVM)
def test_light_model_on_llvm_matches_onnxruntime(rng, name):
    """The llvm target, no host fallbacks, on a fresh random input: every output and the
    logits (the final Softmax's input) equal onnxruntime's (rtol 1e-4, atol 1e-5)."""
    ort = pytest.importorskip("onnxruntime")
    model = onnx.load(LIGHT_DIR / f"light_{name}.onnx")
    last = model.graph.node[-1]
    if last.op_type == "Softmax":
        model.graph.output.append(helper.make_tensor_value_info(
            last.input[0], onnx.TensorProto.FLOAT, None))
    initializers = {t.name for t in model.graph.initializer}
    feeds = {vi.name: rng.standard_normal(runner_input(vi).shape).astype(np.float32)
             for vi in model.graph.input if vi.name not in initializers}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    compiled = dnnc.compile(model, target="llvm")
    assert compiled.stats["host_fallback_ops"] == 0, compiled.runtime.host_fallback_ops
    for got, want in zip(compiled.run(*feeds.values()), session.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
