"""precision="bf16" on the llvm target: the `dot_bf16x2` intrinsic as vdpbf16ps and as its
fp32 fallback, bf16 dense products against the NumPy reference of bf16-rounded operands, the
option, stats and artifacts, and every zoo model within the bf16 accuracy contract."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

from dnnc.backends.llvm import bf16
from dnnc.backends.llvm.codegen import ModuleBuilder
from dnnc.backends.llvm.cpu import host_target
from dnnc.backends.llvm.jit import JITModule
from dnnc.ir import loop as L
from dnnc.ir import types as T

HAS_BF16 = bf16.BF16_FEATURES <= host_target().feature_set
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512_BF16")


def bf16_pairs(rng, shape) -> np.ndarray:
    """uint32 words of two random bf16 numbers each (finite, normal or zero)."""
    halves = rng.standard_normal(shape + (2,)).astype(ml_dtypes.bfloat16)
    return np.ascontiguousarray(halves).view(np.uint32).reshape(shape)


def dot_reference(acc, a, b) -> np.ndarray:
    """acc + hi(a) hi(b) + lo(a) lo(b), the high product added first, in float32."""
    def half(x, high):
        bits = (x & np.uint32(0xFFFF0000)) if high else (x << np.uint32(16))
        return bits.view(np.float32).astype(np.float64)
    high = (acc.astype(np.float64) + half(a, True) * half(b, True)).astype(np.float32)
    return (high.astype(np.float64) + half(a, False) * half(b, False)).astype(np.float32)


def dot_kernel(lanes: int, rows: int, name: str = "dot_bf16x2",
               dtype: T.DType = T.float32) -> L.PrimFunc:
    """y[r, j] = name(acc[r, j], a[r], b[r, j]) (dot_bf16x2; test_int8's dot_u8s8x4 with
    int32 sums): a broadcast over `lanes` vector lanes, as the dense micro-kernel does."""
    acc = L.Buffer("acc", dtype, (rows, lanes))
    a = L.Buffer("a", T.uint32, (rows,))
    b = L.Buffer("b", T.uint32, (rows, lanes))
    y = L.Buffer("y", dtype, (rows, lanes))
    r, j = L.Var("r"), L.Var("j")
    kind = L.ForKind.VECTORIZED if lanes > 1 else L.ForKind.SERIAL
    body = L.For(r, rows, L.For(j, lanes, L.Store(y, (r, j), L.call(
        name, acc[r, j], a[r], b[r, j], dtype=dtype)), kind))
    return L.PrimFunc(f"dot{lanes}", (acc, a, b, y), body)


def run_dot(lanes: int, features: frozenset, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    rng = np.random.default_rng(seed)
    rows = 5
    acc = rng.standard_normal((rows, lanes)).astype(np.float32)
    a, b = bf16_pairs(rng, (rows,)), bf16_pairs(rng, (rows, lanes))
    y = np.empty_like(acc)
    func = dot_kernel(lanes, rows)
    mb = ModuleBuilder("dot", features)
    mb.add(func)
    jm = JITModule(str(mb), host_target(), 2)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
        jm.address(f"{func.name}_packed"))
    arrays = (acc, a, b, y)
    fn((ctypes.c_void_p * 4)(*[x.ctypes.data for x in arrays]), (ctypes.c_int64 * 1)())
    return y, dot_reference(acc, a[:, None], b), str(mb)


@pytest.mark.parametrize("lanes", [1, 4, 6, 8, 16, 24, 32])
def test_dot_bf16x2_fallback_is_two_fmas_of_the_halves(lanes):
    got, want, ir_text = run_dot(lanes, frozenset(), seed=lanes)
    assert "dpbf16ps" not in ir_text
    np.testing.assert_array_equal(got, want)


@needs_bf16
@pytest.mark.parametrize("lanes", [1, 4, 6, 8, 16, 24, 32])
def test_dot_bf16x2_is_vdpbf16ps_where_the_cpu_has_it(lanes):
    got, want, ir_text = run_dot(lanes, host_target().feature_set, seed=100 + lanes)
    assert "llvm.x86.avx512bf16.dpbf16ps" in ir_text
    # normal operands: vdpbf16ps gives the fallback's sums (it differs on denormals only)
    np.testing.assert_array_equal(got, want)


def test_native_needs_every_bf16_feature():
    assert bf16.native(frozenset({"avx512bf16", "avx512vl", "avx512f"})) == {"dot_bf16x2"}
    assert bf16.native(frozenset({"avx512bf16"})) == frozenset()
    assert bf16.native(frozenset({"avx2"})) == frozenset()


# ---------------------------------------------------------------------------------------------
# the option, stats and artifacts


@pytest.fixture(scope="module")
def mlp():
    from dnnc import zoo

    return zoo.build("mlp", batch=4, hidden=(64,), in_features=48, classes=10)


def test_llvm_takes_bf16_and_refuses_what_it_does_not_compute_in(mlp):
    import dnnc
    from dnnc.errors import ArgumentError

    assert dnnc.compile(mlp, "llvm", cache=False).stats["precision"] == "fp32"
    assert dnnc.compile(mlp, "llvm", precision="bf16", cache=False).stats["precision"] == "bf16"
    for other in ("tf32", "fp16"):
        with pytest.raises(ArgumentError, match=f"precision='{other}' is not one the llvm "
                                                f"target computes in; it takes fp32, bf16"):
            dnnc.compile(mlp, "llvm", precision=other)
    with pytest.raises(ArgumentError, match="precision does not apply to the numpy target"):
        dnnc.compile(mlp, "numpy", precision="bf16")


def test_artifact_records_bf16_and_a_cpu_without_avx512_bf16_refuses_it(mlp, tmp_path,
                                                                        monkeypatch):
    import dataclasses

    import dnnc
    from dnnc.backends.llvm import cpu
    from dnnc.errors import ArtifactError

    model = dnnc.compile(mlp, "llvm", precision="bf16", cache=False)
    path = tmp_path / "mlp.dnnc"
    model.save(path)
    x = np.random.default_rng(7).standard_normal((4, 48)).astype(np.float32)
    loaded = dnnc.load(path)
    assert loaded.stats["precision"] == "bf16"
    np.testing.assert_array_equal(loaded(x), model(x))
    host = cpu.host_target()
    if "avx512bf16" not in host.feature_set:
        return
    without = ",".join("-avx512bf16" if f == "+avx512bf16" else f
                       for f in host.features.split(","))
    monkeypatch.setattr(cpu, "host_target", lambda: dataclasses.replace(host,
                                                                        features=without))
    with pytest.raises(ArtifactError, match="compiled at precision bf16 .* AVX512_BF16 "
                                            r"\(vdpbf16ps\); this machine .* lacks avx512bf16"):
        dnnc.load(path)


# ---------------------------------------------------------------------------------------------
# dense products


def matmul_model(m: int, k: int, n: int, seed: int, bias: bool):
    """Y = X @ W (+ b) with constant W (and b), X [m, k] an input: a packed dense product."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["P" if bias else "Y"])]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        nodes.append(helper.make_node("Add", ["P", "b"], ["Y"]))
    graph = helper.make_graph(
        nodes, "mm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), inits


def reference(x, inits, rounded: bool = True) -> np.ndarray:
    """X @ W + b exactly (float64), X and W rounded to bf16 (to nearest even) first."""
    from onnx import numpy_helper

    def operand(v):
        return v.astype(ml_dtypes.bfloat16).astype(np.float64) if rounded else \
            v.astype(np.float64)
    arrays = [numpy_helper.to_array(t) for t in inits]
    y = operand(x) @ operand(arrays[0])
    return y + arrays[1] if len(arrays) > 1 else y


SHAPES = [(1, 64, 10, True), (5, 47, 33, False), (70, 96, 64, True), (130, 600, 100, True),
          (12, 513, 48, False)]
"""(m, k, n, bias): one row, odd k, rows over several blocks, k over several slices of 256
(partial sums in the output), an odd k over two slices."""


def fallback_cpu():
    """This CPU without AVX512_BF16 and without AMX tiles (an AMX host kept them: its
    MatMuls and 1x1 convs went to the tiles, on the device host's Emerald Rapids)."""
    from dnnc.backends.llvm.cpu import cpu_from

    return cpu_from(None, "-avx512bf16,-amx-bf16")


def vdpbf16ps_cpu():
    """This CPU without AMX tiles: its bf16 products on vdpbf16ps (or its fallback) even on a
    Sapphire Rapids (test_amx.py tests the tiles)."""
    from dnnc.backends.llvm.cpu import cpu_from

    return cpu_from(None, "-amx-bf16")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])))
@pytest.mark.parametrize("native", [True, False], ids=["vdpbf16ps", "fp32-fmas"])
def test_dense_bf16_is_the_product_of_bf16_rounded_operands(shape, native):
    """Both ways agree with the exact product of the bf16-rounded operands to fp32
    accumulation's error (k roundings of 2^-24), far inside bf16's own 2^-8."""
    import dnnc

    if native and not HAS_BF16:
        pytest.skip("this CPU has no AVX512_BF16")
    m, k, n, bias = shape
    model, inits = matmul_model(m, k, n, seed=m * 1000 + k, bias=bias)
    compiled = dnnc.compile(model, "llvm", precision="bf16", cache=False,
                            cpu=vdpbf16ps_cpu() if native else fallback_cpu())
    assert ("llvm.x86.avx512bf16.dpbf16ps" in compiled.source("llvm-ir")) == native
    assert "dot_bf16x2" in compiled.source("loop")   # the dense template's bf16 products
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    want = reference(x, inits)
    got = compiled(x)
    tolerance = k * 2.0 ** -22 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
    # not the product of the float32 operands: they were rounded
    assert np.abs(got - reference(x, inits, rounded=False)).max() > tolerance


# ---------------------------------------------------------------------------------------------
# the accuracy contract, whole models


SMALL = {"mlp": {}, "cnn": {}, "resnet18": {"size": 32}, "resnet50": {"size": 32},
         "mobilenet_v2": {"size": 32}, "bert": {"seq": 16, "vocab": 512},
         "bert_tiny": {"seq": 16, "vocab": 512},
         "bert_base": {"layers": 1, "seq": 16, "vocab": 512}}
"""Zoo model -> options keeping it small (as the cuda tests' `cuda_kernels.SMALL`)."""

CLASSIFIERS = ("cnn", "resnet18", "mobilenet_v2")
"""Run on a batch of 64 images, their top-1 classes compared."""

TOP1_AGREEMENT = 0.95
"""Fraction of a batch whose top-1 class at bf16 is the fp32 reference's, at least (random
weights leave some logits nearly tied: 63 of 64 agree for each, on these inputs, on znver5;
62 to 64 on other seeds)."""


@pytest.mark.parametrize("name", list(SMALL))
def test_zoo_model_at_bf16_within_the_contract(name):
    """Every output within `model_error_bound("bf16")` (16 units of 2^-8 of its largest fp32
    magnitude, cuda's contract) of the fp32 NumPy reference, on fresh random inputs."""
    import dnnc
    from dnnc import zoo
    from dnnc.ir.target import model_error_bound

    batch = 64 if name in CLASSIFIERS else 1
    model = zoo.build(name, batch=batch, **SMALL[name])
    feeds = zoo.inputs_for(model, np.random.default_rng(sum(map(ord, name))))
    compiled = dnnc.compile(model, "llvm", precision="bf16", cache=False, cpu=vdpbf16ps_cpu())
    assert "dot_bf16x2" in compiled.source("loop")
    got = compiled.run(*feeds.values())
    want = dnnc.compile(model, "numpy").run(*feeds.values())
    for g, w in zip(got, want):
        worst = np.abs(g.astype(np.float64) - w).max() / np.abs(w).max()
        assert 0 < worst <= model_error_bound("bf16"), f"{name}: {worst:.3g}"
    if name in CLASSIFIERS:
        agree = (got[0].argmax(-1) == want[0].argmax(-1)).mean()
        assert agree >= TOP1_AGREEMENT, f"{name}: top-1 agrees on {agree:.1%}"


# ---------------------------------------------------------------------------------------------
# convolutions


def conv_model(c: int, m: int, size: int, kernel: int, stride: int, pad: int, seed: int,
               group: int = 1):
    """Y = Conv(X, W, b) with constant W and b, X [1, c, size, size] an input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, c // group, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    out = (size + 2 * pad - kernel) // stride + 1
    node = helper.make_node("Conv", ["X", "W", "b"], ["Y"], kernel_shape=[kernel, kernel],
                            strides=[stride, stride], pads=[pad] * 4, group=group)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                       [1, c, size, size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, m, out, out])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w, b


def conv_reference(model, x, w, rounded: bool = True) -> np.ndarray:
    """The conv of X and W rounded to bf16 (float64 sums, by the numpy target's conv)."""
    import dnnc
    from onnx import numpy_helper

    def operand(v):
        return v.astype(ml_dtypes.bfloat16).astype(np.float64) if rounded else \
            v.astype(np.float64)
    exact = type(model)()
    exact.CopyFrom(model)
    exact.graph.initializer[0].CopyFrom(numpy_helper.from_array(operand(w), "W"))
    for t in list(exact.graph.initializer[1:]):
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                           t.name))
    from onnx import TensorProto
    for vi in list(exact.graph.input) + list(exact.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    return dnnc.compile(exact, "numpy").run(operand(x))[0]


CONVS = [(3, 40, 17, 3, 1, 1), (16, 32, 12, 3, 2, 1), (8, 16, 10, 3, 1, 0),
         (33, 64, 20, 1, 1, 0), (64, 48, 9, 1, 2, 0), (5, 16, 21, 7, 2, 3)]
"""(C, M, size, kernel, stride, pad): a stem's 3 channels (odd: a zero channel pads the last
pair), a strided 3x3, an unpadded 3x3 (flat planes of pairs), a 1x1 (pointwise: pixels in
the lanes), a strided 1x1 (the dense template's GEMM), a 7x7."""


@pytest.mark.parametrize("shape", CONVS, ids=lambda s: "c{}m{}s{}k{}st{}p{}".format(*s))
@pytest.mark.parametrize("native", [True, False], ids=["vdpbf16ps", "fp32-fmas"])
def test_conv_bf16_is_the_conv_of_bf16_rounded_operands(shape, native):
    import dnnc

    if native and not HAS_BF16:
        pytest.skip("this CPU has no AVX512_BF16")
    c, m, size, kernel = shape[:4]
    model, w, _ = conv_model(*shape, seed=c * 100 + m)
    compiled = dnnc.compile(model, "llvm", precision="bf16", cache=False,
                            cpu=vdpbf16ps_cpu() if native else fallback_cpu())
    assert [n.attrs["precision"] for n in compiled.graph.nodes] == ["bf16"]   # ConvPacked
    assert "dot_bf16x2" in compiled.source("loop")
    assert ("llvm.x86.avx512bf16.dpbf16ps" in compiled.source("llvm-ir")) == native
    x = np.random.default_rng(size).standard_normal((1, c, size, size)).astype(np.float32)
    want = conv_reference(model, x, w)
    got = compiled(x)
    tolerance = c * kernel * kernel * 2.0 ** -22 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
    assert np.abs(got - conv_reference(model, x, w, rounded=False)).max() > tolerance


GROUPED = [(48, 48, 14, 3, 1, 1, 6), (24, 30, 11, 3, 2, 1, 3), (48, 24, 10, 1, 1, 0, 3),
           (12, 24, 9, 1, 2, 0, 3), (16, 32, 9, 3, 1, 1, 2), (15, 30, 8, 3, 1, 1, 3)]
"""(C, M, size, kernel, stride, pad, group): RegNet's 8 channels a group, a strided 3x3 of 10
outputs a group (a partial block), a grouped 1x1 (pointwise), a strided grouped 1x1 (conv2d),
AlexNet-like group 2; 5 channels a group (odd: the conv stays float32, as pairs would straddle
two groups)."""


@pytest.mark.parametrize("shape", GROUPED, ids=lambda s: "c{}m{}s{}k{}st{}p{}g{}".format(*s))
@pytest.mark.parametrize("native", [True, False], ids=["vdpbf16ps", "fp32-fmas"])
@pytest.mark.parametrize("band", [False, True])
def test_grouped_conv_bf16_is_the_conv_of_bf16_rounded_operands(shape, native, band,
                                                                 monkeypatch):
    """A grouped conv of an even number of channels a group multiplies in bf16 pairs too,
    each group's pairs its own (the image's pairs read from the group's first pair); with
    `band`, each unit copies its band of pairs."""
    import dnnc
    from dnnc.backends.llvm import conv

    if native and not HAS_BF16:
        pytest.skip("this CPU has no AVX512_BF16")
    monkeypatch.setattr(conv, "conv2d_band", lambda order, threads: band)
    monkeypatch.setattr(conv, "conv2d_order", lambda p, nr: "rows")
    c, m, size, kernel, stride, pad, group = shape
    model, w, _ = conv_model(*shape[:6], seed=c * 100 + m, group=group)
    compiled = dnnc.compile(model, "llvm", precision="bf16", cache=False,
                            cpu=vdpbf16ps_cpu() if native else fallback_cpu())
    paired = (c // group) % 2 == 0
    assert [n.attrs.get("precision", "fp32") for n in compiled.graph.nodes] == \
        ["bf16" if paired else "fp32"]
    direct = (kernel, stride) != (1, 1)   # (a grouped 1x1: the pointwise template)
    copied = paired or pad > 0   # (float32 unpadded: the image read as it is)
    assert ("xband = alloc" in compiled.source("loop")) == (band and direct and copied)
    x = np.random.default_rng(size).standard_normal((1, c, size, size)).astype(np.float32)
    want = conv_reference(model, x, w, rounded=paired)
    tolerance = c // group * kernel * kernel * 2.0 ** -22 * np.abs(want).max()
    np.testing.assert_allclose(compiled(x), want, rtol=0, atol=tolerance)


def test_tuning_at_bf16_applies_to_bf16_compiles_only(mlp, tmp_path):
    """dnnc.tune(precision="bf16"): every config measured on the bf16 kernels (pairs), its
    records keyed ":bf16", applied to a bf16 compile and to no fp32 one."""
    import json

    import dnnc

    log = tmp_path / "tune.jsonl"
    dnnc.tune(mlp, "llvm", log=log, trials=4, precision="bf16")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records and all(r["target"].endswith(":bf16") for r in records)
    tuned = dnnc.compile(mlp, "llvm", precision="bf16", tuning_log=log, cache=False)
    assert tuned.stats["tuned_kernels"] == tuned.stats["kernels"] == 2
    with pytest.warns(Warning):   # (TuningLogWarning: no record applies at fp32)
        assert dnnc.compile(mlp, "llvm", tuning_log=log, cache=False).stats[
            "tuned_kernels"] == 0
    x = np.random.default_rng(3).standard_normal((4, 48)).astype(np.float32)
    want = dnnc.compile(mlp, "numpy")(x)
    assert np.abs(tuned(x) - want).max() <= 1e-2 * np.abs(want).max()
