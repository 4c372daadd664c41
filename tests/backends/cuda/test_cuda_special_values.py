"""Special values on the cuda target. On the GPU (`gpu` tier: skipped without one): float ->
integer casts of NaN, +-inf and huge values give docs/semantics.md's table (as on numpy and
llvm: tests/backends/test_float_to_int.py), and a batch of the fuzzer's special-values cases
(+-inf, NaN, +-1e30, +-FLT_MAX, +-0, subnormals in the inputs; softmax chains over such rows)
agrees with the numpy target and onnxruntime outside the documented differences. On the host
(test_host_semantics.py's g++ emulation of the rendered CUDA C): every kernel of those cases
against the NumPy reference, so a GPU-only difference (its math library, FMA contraction)
tells itself apart from a schedule's.

    python -m pytest -n 0 -m gpu tests/backends/cuda/test_cuda_special_values.py
    DNNC_FULL_CUDA_EMULATION=1 python -m pytest -n 0 tests/backends/cuda/test_cuda_special_values.py
"""

import shutil

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dnnc
from cuda_kernels import programs, reference
from dnnc.backends.cuda.codegen import render_module
from dnnc.frontend.onnx import import_onnx
from dnnc.testing import fuzz
from dnnc.testing.generate import generate
from dnnc.testing.special import CAST_PROBES, INT_TYPES, cast_model
from test_host_semantics import host_library, run_on_host

SOURCES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
           "float64": np.float64}


@pytest.mark.gpu
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_float_to_int_casts_on_the_gpu_give_the_numpy_targets_table(source):
    with np.errstate(over="ignore"):
        x = np.array(CAST_PROBES, np.float64).astype(SOURCES[source])
    model = cast_model(source, len(x))
    want = dnnc.compile(model, target="numpy").run(x=x)
    for opt_level in (0, 3):
        got = dnnc.compile(model, target="cuda", opt_level=opt_level).run(x=x, to="numpy")
        for to, g, w in zip(INT_TYPES, got, want):
            bad = np.nonzero(g != w)[0]
            assert not bad.size, (f"{source} -> {to}, opt {opt_level}: (x, gpu, numpy) "
                                  f"{[(float(x[i]), g[i], w[i]) for i in bad[:8]]}")


BF16_PROBES = np.array([
    0x3F800000, 0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x80000000, 0x00000001,
    0x00408000, 0x80C18000, 0x7F7FFFFF, 0xFF7F8000, 0x7F800000, 0xFF800000, 0x7FC12345,
    0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0x3EAAAAAB, 0xC2F6E979], np.uint32).view(np.float32)
"""float32 values whose bfloat16 casts tell roundings apart: ties to even either way, just
below a tie, zeros, subnormals (a tie among them), FLT_MAX and its negative tie (to infinity),
infinities, NaNs of either sign with payloads (quiet and signaling), ordinary values."""


@pytest.mark.gpu
def test_bfloat16_casts_on_the_gpu_are_the_numpy_targets_bit_for_bit():
    """float32 -> bfloat16 -> float32 on the GPU (the renderer's native `dnnc_f2bf`: one
    cvt.rn.bf16.f32, NaNs as legalize keeps them) bit for bit as the numpy target's, a NaN
    a NaN of its sign (payloads are not the semantics': docs/semantics.md)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(BF16_PROBES)])
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)]
    outputs = [helper.make_tensor_value_info(n, t, [len(BF16_PROBES)])
               for n, t in (("h", TensorProto.BFLOAT16), ("y", TensorProto.FLOAT))]
    model = helper.make_model(helper.make_graph(nodes, "bf16_casts", [x], outputs),
                              opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = helper.find_min_ir_version_for(model.opset_import)
    model = model.SerializeToString()
    want = dnnc.compile(model, target="numpy").run(x=BF16_PROBES)
    nan = np.isnan(BF16_PROBES)
    for opt_level in (0, 3):
        got = dnnc.compile(model, target="cuda", opt_level=opt_level).run(x=BF16_PROBES,
                                                                          to="numpy")
        for name, g, w in zip(("h", "y"), got, want):
            g32, w32 = (np.asarray(v, np.float32) for v in (g, w))
            assert np.isnan(g32[nan]).all() and \
                (np.signbit(g32[nan]) == np.signbit(BF16_PROBES[nan])).all(), name
            bits = {"h": np.uint16, "y": np.uint32}[name]
            g, w = g[~nan].view(bits), w[~nan].view(bits)
            bad = np.nonzero(g != w)[0]
            assert not bad.size, (f"{name}, opt {opt_level}: (x, gpu, numpy) "
                                  f"{[(BF16_PROBES[~nan][i], hex(g[i]), hex(w[i])) for i in bad]}")


@pytest.mark.gpu
@pytest.mark.parametrize("opt_level", [0, 3])
def test_special_values_fuzz_batch_on_the_gpu_finds_nothing(opt_level, tmp_path):
    args = fuzz.parse_args(["--special", "--cases", "60", "--seed", "41", "--target", "cuda",
                            "--opt-level", str(opt_level), "--out", str(tmp_path),
                            "--no-minimize", "--quiet"])
    summary = fuzz.fuzz(args)
    assert not fuzz.has_finding(summary), fuzz.summary_text(summary)


def _on_host(model: onnx.ModelProto, inputs: dict, tmp_path) -> list[str]:
    """Every cuda kernel of `model` run on the host against the NumPy reference: problems."""
    graph, progs = programs(import_onnx(model))
    values = reference(graph, inputs)
    problems = []
    for p, program in enumerate(progs):
        module = render_module(program.unique)
        lib = host_library(program.unique, tmp_path / f"p{p}", module)
        problems += run_on_host(lib, module, program, values)
    return problems


def _softmax_chain(rows: int, length: int) -> onnx.ModelProto:
    """ReduceMax -> Sub -> Exp -> ReduceSum -> Div over the last axis, as exporters write it."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["s"]), helper.make_node("Exp", ["s"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axes"], ["t"], keepdims=1),
             helper.make_node("Div", ["e", "t"], ["y"])]
    shape = [rows, length]
    graph = helper.make_graph(nodes, "softmax_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("length", [7, 300])
def test_softmax_chain_over_special_rows_on_host(length, tmp_path):
    """Rows holding +inf, -inf, only -inf, NaN, +-FLT_MAX: NaN where a row holds an
    infinity or NaN (inf - inf), as numpy and onnxruntime, never inf."""
    x = np.random.default_rng(0).standard_normal((6, length)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, 5] = -np.inf
    x[2] = -np.inf
    x[3, 1] = np.nan
    x[4, :2] = (3.4028235e38, -3.4028235e38)
    assert not _on_host(_softmax_chain(6, length), {"x": x}, tmp_path)


@pytest.mark.emulated_full
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_special_values_fuzz_cases_on_host(tmp_path):
    problems = []
    for index in range(40):
        case = generate(41, index, special=True)
        if case.symbolic:   # (the host emulation runs static shapes)
            continue
        problems += [f"case {index}: {p}" for p in
                     _on_host(case.model, case.draw_inputs(0), tmp_path / f"c{index}")]
    assert not problems, "\n".join(problems[:20])
