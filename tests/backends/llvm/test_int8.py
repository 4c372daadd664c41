"""int8 on the llvm target: the `dot_u8s8x4` intrinsic as AVX-512 VNNI's vpdpbusd, as
AVX-VNNI's (256-bit halves) and as the widening fallback (features forced off, as
test_bf16 does), the dense_int8 template against QuantizedDense's reference on odd sizes for
every activation and output type, and a dynamically quantized transformer through
dnnc.compile against onnxruntime."""

import ctypes

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.backends.llvm import int8
from dnnc.backends.llvm.codegen import ModuleBuilder
from dnnc.backends.llvm.cpu import cpu_from, host_target
from dnnc.backends.llvm.jit import JITModule
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.quantized import pack_groups, quantized_dense
from test_bf16 import dot_kernel

HOST = host_target().feature_set
FEATURE_PATHS = {
    "avx512vnni": (int8.VNNI512, "-amx-int8"),
    "avxvnni": (int8.AVXVNNI, "-amx-int8,-avx512vnni"),
    "widening": (frozenset(), "-amx-int8,-avx512vnni,-avxvnni"),
}
"""path -> (the features it needs, the --mattr that forces the others off: AMX-INT8's tiles
too, which test_amx_int8.py checks)."""


def _needs(path):
    features = FEATURE_PATHS[path][0]
    return pytest.mark.skipif(not features <= HOST, reason=f"this CPU lacks {path}")


PATHS = [pytest.param(p, marks=_needs(p)) for p in FEATURE_PATHS]


def run_dot(lanes: int, features: frozenset, seed: int):
    rng = np.random.default_rng(seed)
    rows = 5
    acc = rng.integers(-1 << 20, 1 << 20, (rows, lanes)).astype(np.int32)
    a = rng.integers(0, 1 << 32, (rows,), dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, (rows, lanes), dtype=np.uint64).astype(np.uint32)
    y = np.empty_like(acc)
    func = dot_kernel(lanes, rows, "dot_u8s8x4", T.int32)
    mb = ModuleBuilder("dot", features)
    mb.add(func)
    jm = JITModule(str(mb), host_target(), 2)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
        jm.address(f"{func.name}_packed"))
    fn((ctypes.c_void_p * 4)(*[x.ctypes.data for x in (acc, a, b, y)]), (ctypes.c_int64 * 1)())
    ua = a.view(np.uint8).reshape(rows, 1, 4).astype(np.int64)
    sb = b.view(np.int8).reshape(rows, lanes, 4).astype(np.int64)
    want = (acc + (ua * sb).sum(-1)).astype(np.int32)
    return y, want, str(mb)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("lanes", [1, 4, 8, 16, 24, 32])
def test_dot_u8s8x4_is_exact_on_every_feature_path(path, lanes):
    features = FEATURE_PATHS[path][0] | frozenset({"avx512f"})
    got, want, ir_text = run_dot(lanes, features, seed=lanes)
    assert ("vpdpbusd" in ir_text) == (path != "widening")
    np.testing.assert_array_equal(got, want)


def test_native_needs_a_vpdpbusd_form():
    assert int8.native(frozenset({"avx512vnni", "avx512vl"})) == {"dot_u8s8x4"}
    assert int8.native(frozenset({"avxvnni"})) == {"dot_u8s8x4"}
    assert int8.native(frozenset({"avx512vnni"})) == frozenset()
    assert int8.dot_widths(frozenset({"avxvnni"})) == (8, 4)


def _const(name, a):
    a = np.asarray(a)
    return Value(name, T.TensorType(T.DType.from_numpy(a.dtype), a.shape), const=a)


def dense_graph(rng, m, k, n, act, out, lo=None, hi=None, zw=None):
    """y = QuantizedDense(a, ...) -> Relu (a fused consumer); its inputs and reference (`zw`:
    the weights' zero point, "scalar" or "column")."""
    info = np.iinfo(act)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    g = Graph("q")
    a = g.add_input("a", T.TensorType(T.DType.from_numpy(np.dtype(act)), (2, m, k)))
    ins = [a, _const("za", act(rng.integers(info.min, info.max))), _const("w", pack_groups(w)),
           _const("s", w.astype(np.int32).sum(0).astype(np.int32))]
    if out != "int32":
        ins += [_const("b", rng.integers(-5000, 5000, n).astype(np.int32)),
                _const("sc", rng.uniform(2e-5, 2e-4, n).astype(np.float32))]
    if out in ("int8", "uint8"):
        ins.append(_const("yz", np.dtype(out).type(5)))
    if zw is not None:
        ins += [None] * (7 - len(ins))
        ins.append(_const("zw", rng.integers(-128, 128, () if zw == "scalar" else n)
                          .astype(np.int8)))
    y = g.add("QuantizedDense", *ins, n=n, lo=lo, hi=hi)
    g.outputs = [g.add("Relu", y)]
    x = rng.integers(info.min, info.max + 1, (2, m, k)).astype(act)
    want = np.maximum(quantized_dense(x, *[v if v is None else v.const for v in ins[1:]], n=n,
                                      lo=lo, hi=hi), 0)
    return g, x, want


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m,k,n,act,out", [
    (5, 37, 19, np.uint8, "int8"), (7, 64, 48, np.int8, "uint8"), (3, 9, 33, np.int8, "float32"),
    (1, 3, 1, np.uint8, "int32"), (13, 130, 70, np.int8, "int8"), (11, 96, 40, np.uint8, "int8")])
def test_dense_int8_equals_the_reference(path, m, k, n, act, out):
    """(K a multiple of 4: A read as words, `DenseTile.words`; else as bytes.)"""
    rng = np.random.default_rng(m * k * n)
    g, x, want = dense_graph(rng, m, k, n, act, out, lo=-100 if out == "int8" else None)
    mattr = FEATURE_PATHS[path][1]
    model = dnnc.compile(g, "llvm", cpu=None if mattr is None else cpu_from(None, mattr),
                         cache=False)
    source = model.source("llvm-ir")
    assert ("vpdpbusd" in source) == (path != "widening")
    got = model(x)
    assert got.dtype == want.dtype
    if out == "float32":   # (one float32 product each, as the reference: exact too)
        np.testing.assert_array_equal(got, want)
    else:
        assert np.array_equal(got, want)


@pytest.mark.parametrize("act", [np.int8, np.uint8])
def test_dense_int8_adding_its_own_input_reads_it_as_bytes(act):
    """QuantizedAdd(QuantizedDense(a), a) in one kernel (a QDQ residual around a product:
    fuzz seed 4500 case 53): A, which the epilogue reads as bytes, is not viewed as words
    (`DenseTile.words`; the verifier refused the kernel), and the result is the reference's."""
    rng = np.random.default_rng(53)
    g, x, _ = dense_graph(rng, 3, 16, 16, act, "uint8")
    relu = g.nodes[-1]
    y, a = relu.inputs[0], g.inputs[0]
    scalar = [_const(f"p{k}", v) for k, v in enumerate(
        (np.float32(0.05), np.uint8(5), np.float32(0.03), act(3), np.float32(0.07),
         np.uint8(9)))]
    g.nodes = [n for n in g.nodes if n is not relu]
    g.outputs = [g.add("QuantizedAdd", y, *scalar[:2], a, *scalar[2:])]
    model = dnnc.compile(g, "llvm", cache=False)
    assert len(model.profile(x, repeat=1)) == 1
    assert np.array_equal(model(x), dnnc.compile(g, "numpy")(x))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m,k,n,act,out,zw", [
    (5, 37, 19, np.uint8, "float32", "column"), (7, 64, 48, np.int8, "uint8", "scalar"),
    (1, 3, 1, np.uint8, "int32", "scalar"), (13, 130, 70, np.int8, "float32", "column")])
def test_dense_int8_with_a_weight_zero_point_equals_the_reference(path, m, k, n, act, out, zw):
    rng = np.random.default_rng(m * k * n + 1)
    g, x, want = dense_graph(rng, m, k, n, act, out, zw=zw)
    mattr = FEATURE_PATHS[path][1]
    model = dnnc.compile(g, "llvm", cpu=None if mattr is None else cpu_from(None, mattr),
                         cache=False)
    assert [r["template"] for r in model.profile(x, repeat=1)] == ["dense_int8"]
    got = model(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_a_dynamically_quantized_transformer_compiles_to_int8_dense_kernels(tmp_path):
    pytest.importorskip("onnxruntime")
    from dnnc.testing.quantized_files import onnxruntime_outputs, quantize_dynamic

    model = zoo.build("bert_tiny", seq=16, vocab=512)
    path = quantize_dynamic(model, tmp_path, "bert_tiny")
    feeds = zoo.inputs_for(model, np.random.default_rng(21))
    want = onnxruntime_outputs(path, feeds)[0]
    # (the VNNI path, where an AMX host's tiles would take the products: test_amx_int8.py)
    compiled = dnnc.compile(str(path), "llvm", cache=False, cpu=cpu_from(None, "-amx-int8"))
    assert compiled.source("llvm-ir").count("vpdpbusd") > 0 or not int8.native(HOST)
    np.testing.assert_allclose(compiled(**feeds), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def conv_graph(rng, n, c, h, w, m, k, stride, pad, act, out, group=1):
    """y = Relu(QuantizedConvPacked(x, ...)); its inputs and reference."""
    from dnnc.ir.ops.quantized import pack_conv_groups, quantized_conv_packed

    info = np.iinfo(act)
    wq = rng.integers(-128, 128, (m, c // group, k, k)).astype(np.int8)
    g = Graph("q")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(act)), (n, c, h, w)))
    ins = _conv_inputs(rng, x, act, pack_conv_groups(wq, group), wq, (1e-4, 1e-3), out)
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, oc=m,
                 lo=None, hi=None)
    g.outputs = [g.add("Relu", g.add("QuantizedConvPacked", *ins, group=group, **attrs))]
    xv = rng.integers(info.min, info.max + 1, (n, c, h, w)).astype(act)
    want = np.maximum(quantized_conv_packed(xv, *[v.const for v in ins[1:]], auto_pad="NOTSET",
                                            dilations=None, group=group, **attrs), 0)
    return g, xv, want


def _conv_inputs(rng, x, act, w, wq, scales, out) -> list:
    """A quantized conv's inputs: x, a random zero point of type `act`, weights `w` (wq as
    stored), wq's per-channel sums, a random int32 bias, per-channel scales drawn from
    `scales` and, where `out` is a type, its zero point 3."""
    info, channels = np.iinfo(act), wq.shape[0]
    ins = [x, _const("za", act(rng.integers(info.min, info.max))), _const("w", w),
           _const("s", wq.astype(np.int32).reshape(channels, -1).sum(1).astype(np.int32)),
           _const("b", rng.integers(-1000, 1000, channels).astype(np.int32)),
           _const("sc", rng.uniform(*scales, channels).astype(np.float32))]
    return ins + ([_const("yz", out(3))] if out is not None else [])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n,c,h,w,m,k,stride,pad,act,out", [
    (1, 5, 9, 7, 19, 3, 1, 1, np.uint8, np.int8), (2, 16, 8, 8, 40, 1, 1, 0, np.int8, np.uint8),
    (1, 3, 11, 11, 8, 3, 2, 1, np.int8, None), (1, 8, 7, 7, 33, 1, 2, 0, np.uint8, np.int8),
    (1, 6, 10, 10, 16, 7, 2, 3, np.int8, np.int8), (3, 20, 5, 7, 13, 1, 1, 0, np.uint8, np.int8),
    (1, 9, 9, 9, 70, 1, 1, 0, np.int8, None), (1, 1152, 1, 1, 48, 1, 1, 0, np.int8, np.int8),
    (3, 37, 3, 3, 20, 1, 1, 0, np.uint8, None)])
def test_conv_int8_equals_the_reference(path, n, c, h, w, m, k, stride, pad, act, out):
    """Odd channels (a group of 4 part zero), padding (the zero point), strides, batches;
    pointwise convs (the transposed tile) of pixels and channels that fill no whole tile, and
    of fewer pixels than a panel (pixel rows: squeeze-excitation's, one image and three)."""
    rng = np.random.default_rng(n * c * h * m * k)
    g, x, want = conv_graph(rng, n, c, h, w, m, k, stride, pad, act, out)
    mattr = FEATURE_PATHS[path][1]
    model = dnnc.compile(g, "llvm", cpu=None if mattr is None else cpu_from(None, mattr),
                         cache=False)
    assert ("vpdpbusd" in model.source("llvm-ir")) == (path != "widening")
    got = model(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("threads", [2, 16])
def test_a_product_too_small_to_share_runs_on_one_thread(threads):
    """A squeeze-excitation's 1x1 conv on a pooled image (55 K multiply-adds, under
    conv.MIN_PARALLEL_MACS) opens no parallel region, where waking the pool costs more than
    its products; a 1x1 conv over a 28 x 28 image (3.6 M) shares its tiles and its pack."""
    import dataclasses

    from dnnc.backends.llvm.schedules import schedule_kernel
    from dnnc.backends.registry import REGISTRY
    from dnnc.ir import loop as L
    from dnnc.ir.loop.traversal import walk
    from dnnc.backends.lower import lower_group

    rng = np.random.default_rng(threads)
    machine = dataclasses.replace(REGISTRY["llvm"].target(cpu_from(None, "-amx-int8")),
                                  threads=threads)
    for (c, h, m), regions in (((1152, 1, 48), 0), ((96, 28, 48), 2)):
        graph = conv_graph(rng, 1, c, h, h, m, 1, 1, 0, np.uint8, np.int8)[0]
        func = schedule_kernel(lower_group(graph.nodes, "k", outputs=graph.outputs), machine)
        assert sum(isinstance(s, L.For) and s.kind is L.ForKind.PARALLEL
                   for s in walk(func.body)) == regions


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n,c,h,w,m,k,stride,group,act,out", [
    (1, 48, 10, 9, 48, 3, 2, 6, np.uint8, np.int8),    # regnet's: 8 channels a group
    (1, 40, 7, 7, 40, 3, 1, 5, np.int8, np.uint8),     # the last panel's span clamped to C
    (2, 16, 6, 6, 16, 3, 1, 4, np.int8, None),         # 4 channels a group: 4 a panel
    (1, 16, 5, 5, 64, 3, 1, 2, np.uint8, np.int8),     # 32 a group: tiles of two panels
    (1, 12, 6, 5, 48, 1, 1, 3, np.int8, np.int8)])     # 1x1 of 16 a group (not pointwise)
def test_grouped_conv_int8_equals_the_reference(path, n, c, h, w, m, k, stride, group, act,
                                                out):
    """A grouped QuantizedConvPacked (panels over their groups' channels, `panel_span`) on
    conv_int8, bit for bit its reference, on every feature path."""
    rng = np.random.default_rng(n * c * h * m * k * group)
    g, x, want = conv_graph(rng, n, c, h, w, m, k, stride, 1, act, out, group)
    model = dnnc.compile(g, "llvm", cpu=cpu_from(None, FEATURE_PATHS[path][1]), cache=False)
    assert [r["template"] for r in model.profile(x, repeat=1)] == ["conv_int8"]
    got = model(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)


TABLE_READS = [pytest.param("", id="vpermi2b", marks=pytest.mark.skipif(
    "avx512vbmi" not in HOST, reason="this CPU lacks avx512vbmi")),
    pytest.param("-avx512vbmi", id="lanewise")]
"""--mattr of the two ways vectorize reads a 256-byte table: in registers (`_table_lookup`),
a lane at a time."""


@pytest.mark.parametrize("mattr", TABLE_READS)
@pytest.mark.parametrize("act,out", [(np.uint8, np.int8), (np.int8, np.uint8)])
def test_a_table_in_a_conv_epilogue_equals_the_reference(act, out, mattr):
    """QuantizedTable(QuantizedConvPacked(x)) in one kernel: the lookup's index computed in
    vector code (vectorize's gather), the table read in registers or a lane at a time."""
    from dnnc.ir.ops.quantized import quantized_table

    rng = np.random.default_rng(11)
    g, x, _ = conv_graph(rng, 1, 8, 9, 9, 48, 3, 1, 1, act, out)
    relu = g.nodes[-1]
    table = rng.integers(-128, 128, 256).astype(np.int8) if act is np.int8 else \
        rng.integers(0, 256, 256).astype(np.uint8)
    conv = relu.inputs[0]
    y = g.add("QuantizedTable", conv, _const("t", table))
    g.nodes = [n for n in g.nodes if n is not relu]
    g.outputs = [y]
    ref = dnnc.compile(g, "numpy")(x)
    model = dnnc.compile(g, "llvm", cpu=cpu_from(None, mattr or None), cache=False)
    assert len(model.profile(x, repeat=1)) == 1
    got = model(x)
    assert got.dtype == table.dtype and np.array_equal(got, ref)
    conv_only = Graph("q")
    conv_only.inputs, conv_only.nodes, conv_only.outputs = g.inputs, g.nodes[:-1], [conv]
    assert np.array_equal(ref, quantized_table(dnnc.compile(conv_only, "numpy")(x), table))


@pytest.mark.parametrize("mattr", TABLE_READS)
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_a_table_reads_every_entry_as_the_reference(act, mattr):
    """QuantizedTable on every 8-bit value (both 128-byte halves of the table, rows of 64
    and of 16 + 3 lanes) equals its reference."""
    from dnnc.ir.ops.quantized import quantized_table

    rng = np.random.default_rng(12)
    info = np.iinfo(act)
    table = rng.integers(info.min, info.max + 1, 256).astype(act)
    for shape in ((8, 64), (5, 19)):
        values = np.resize(np.arange(info.min, info.max + 1), shape[0] * shape[1])
        x = rng.permutation(values).astype(act).reshape(shape)
        g = Graph("t")
        g.inputs = [Value("x", T.TensorType(T.DType.from_numpy(np.dtype(act)), shape))]
        g.outputs = [g.add("QuantizedTable", g.inputs[0], _const("t", table))]
        model = dnnc.compile(g, "llvm", cpu=cpu_from(None, mattr or None), cache=False)
        assert np.array_equal(model(x), quantized_table(x, table))


@pytest.mark.parametrize("c,m,group", [(40, 40, 5), (16, 64, 2)])
def test_a_grouped_packed_conv_lowers_generically_to_its_reference(monkeypatch, c, m, group):
    """QuantizedConvPacked's loop-IR rule (what a target without an int8 template lowers,
    cuda's for groups) reads a grouped panel's weights where the reference does."""
    from dnnc.backends.llvm import schedules
    from dnnc.ir.ops.registry import Pattern

    monkeypatch.setitem(schedules.TEMPLATES, ("llvm", Pattern.OUT_FUSABLE), (schedules.ROWS,))
    rng = np.random.default_rng(c * m * group)
    g, x, want = conv_graph(rng, 1, c, 6, 5, m, 3, 1, 1, np.int8, np.int8, group)
    model = dnnc.compile(g, "llvm", cache=False)
    assert [r["template"] for r in model.profile(x, repeat=1)] == ["rows"]
    assert np.array_equal(model(x), want)


def depthwise_graph(rng, n, c, h, w, k, stride, pad, act, out, dilation=1):
    """y = Relu(QuantizedConv(x, ...)) of one channel a group; its input and reference."""
    from dnnc.ir.ops.quantized import quantized_conv

    info = np.iinfo(act)
    wq = rng.integers(-128, 128, (c, 1, k, k)).astype(np.int8)
    g = Graph("q")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(act)), (n, c, h, w)))
    ins = _conv_inputs(rng, x, act, wq, wq, (1e-3, 1e-2), out)
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=c,
                 dilations=[dilation, dilation], lo=None, hi=None)
    g.outputs = [g.add("Relu", g.add("QuantizedConv", *ins, **attrs))]
    xv = rng.integers(info.min, info.max + 1, (n, c, h, w)).astype(act)
    want = np.maximum(quantized_conv(xv, *[v.const for v in ins[1:]], auto_pad="NOTSET",
                                     **attrs), 0)
    return g, xv, want


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n,c,h,w,k,stride,pad,dilation,act,out", [
    (1, 5, 9, 7, 3, 1, 1, 1, np.uint8, np.int8), (2, 16, 8, 8, 3, 2, 1, 1, np.int8, np.uint8),
    (1, 3, 11, 11, 5, 1, 2, 1, np.int8, None), (1, 8, 7, 7, 3, 2, 0, 1, np.uint8, np.int8),
    (1, 4, 20, 37, 3, 1, 1, 1, np.int8, np.int8),     # rows of 37: two vectors and a tail
    (1, 6, 13, 13, 7, 3, 3, 1, np.int8, np.uint8),    # 7 taps a row: two words, stride 3
    (1, 5, 12, 12, 3, 1, 2, 2, np.uint8, np.int8),    # dilated: no phases
    (2, 3, 9, 10, 1, 2, 0, 1, np.int8, np.int8)])     # 1x1: one tap a word
def test_depthwise_int8_equals_the_reference(path, n, c, h, w, k, stride, pad, dilation, act,
                                             out, monkeypatch):
    """Both nests (rows, and flat where it applies), each with blocks of 16 pixels and of 5
    (a row's tail narrower), on every feature path, bit for bit the reference."""
    import dataclasses

    from dnnc.backends.llvm import depthwise_int8, schedules
    from dnnc.ir.ops.registry import Pattern

    key = ("llvm", Pattern.OUT_FUSABLE)
    templates = schedules.TEMPLATES[key]
    rng = np.random.default_rng(n * c * h * w * k * stride * dilation)
    g, x, want = depthwise_graph(rng, n, c, h, w, k, stride, pad, act, out, dilation)
    mattr = FEATURE_PATHS[path][1]
    flats = (False, True) if stride == dilation == 1 else (False,)
    for flat in flats:
        for pixels in (16, 5):
            config = depthwise_int8.DepthwiseInt8Config(pixels, flat)
            chosen = dataclasses.replace(schedules.DEPTHWISE_INT8, default=lambda p, m: config)
            monkeypatch.setitem(schedules.TEMPLATES, key, tuple(
                chosen if t is schedules.DEPTHWISE_INT8 else t for t in templates))
            model = dnnc.compile(g, "llvm", cpu=cpu_from(None, mattr), cache=False)
            assert [r["template"] for r in model.profile(x, repeat=1)] == ["depthwise_int8"]
            assert ("vpdpbusd" in model.source("llvm-ir")) == (path != "widening")
            got = model(x)
            assert got.dtype == want.dtype and np.array_equal(got, want), config


def test_depthwise_int8_default_runs_narrow_rows_flat():
    """Flat where a row is narrower than two vectors at stride 1; by rows otherwise."""
    cases = {(7, 1): True, (28, 1): True, (56, 1): False, (14, 2): False}
    for (side, stride), flat in cases.items():
        rng = np.random.default_rng(side)
        g, x, _ = depthwise_graph(rng, 1, 8, side * stride, side * stride, 3, stride, 1,
                                  np.int8, np.int8)
        model = dnnc.compile(g, "llvm", cache=False)
        assert model.profile(x, repeat=1)[0]["template"] == "depthwise_int8"
        assert ("yplane" in model.source("loop")) == flat, (side, stride)


def test_depthwise_int8_sums_of_many_taps_are_exact():
    """The largest sums (an 11x11 window: 121 taps of 255 x -128, -3949440) in int32: a
    12x12 window too (past float32's exact integers, where the float nest on integers
    stopped), bit for bit the reference."""
    from dnnc.ir.ops.quantized import quantized_conv

    for k in (11, 12):
        rng = np.random.default_rng(k)
        c, size = 3, 13
        wq = np.full((c, 1, k, k), -128, np.int8)
        wq[1] = 127
        g = Graph("q")
        x = g.add_input("x", T.TensorType(T.uint8, (1, c, size, size)))
        ins = [x, _const("za", np.uint8(0)), _const("w", wq),
               _const("s", wq.astype(np.int32).reshape(c, -1).sum(1).astype(np.int32)),
               _const("b", np.array([-7, 5, 1 << 20], np.int32)),
               _const("sc", np.full(c, 1e-4, np.float32))]
        attrs = dict(kernel_shape=[k, k], strides=[1, 1], pads=[k // 2, k // 2, k - 1 - k // 2,
                                                                k - 1 - k // 2],
                     group=c, lo=None, hi=None)
        g.outputs = [g.add("QuantizedConv", *ins, **attrs)]
        xv = np.full((1, c, size, size), 255, np.uint8)
        xv[0, 2] = rng.integers(0, 256, (size, size))
        want = quantized_conv(xv, *[v.const for v in ins[1:]], auto_pad="NOTSET",
                              dilations=None, **attrs)
        model = dnnc.compile(g, "llvm", cache=False)
        assert [r["template"] for r in model.profile(xv, repeat=1)] == ["depthwise_int8"]
        assert np.array_equal(model(xv), want) and want.min() < -390   # (the sums, scaled)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("k,stride,pad,size", [(3, 2, 1, 13), (2, 2, 0, 8), (3, 1, 1, 37)])
def test_maxpool_int8_equals_the_reference(dtype, k, stride, pad, size):
    """MaxPool on quantized values (fuse_quantized's move): the maxpool_int8 template, its
    padding the type's minimum, against the registry's reference."""
    from dnnc.ir.ops.registry import get_op

    rng = np.random.default_rng(k * size)
    info = np.iinfo(dtype)
    g = Graph("p")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(dtype)), (2, 3, size, size)))
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    g.outputs = [g.add("MaxPool", x, **attrs)]
    xv = rng.integers(info.min, info.max + 1, (2, 3, size, size)).astype(dtype)
    want = get_op("MaxPool").run([xv], g.nodes[0].attrs)[0]
    model = dnnc.compile(g, "llvm", cache=False)
    assert [r["template"] for r in model.profile(xv, repeat=1)] == ["maxpool_int8"]
    got = model(xv)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("shape,kind", [((3, 37), "normal"), ((2, 64, 100), "normal"),
                                        ((5, 1000), "positive"), ((4, 17), "zeros"),
                                        ((1,), "negative")])
def test_dynamic_quantize_equals_the_reference(shape, kind):
    """DynamicQuantizeLinear's own template (range, then quantization): bit for bit the
    reference's y, scale and zero point, ties of x / scale included."""
    from dnnc.ir.ops.quant import dynamic_quantize_linear

    rng = np.random.default_rng(sum(shape))
    x = {"normal": lambda: rng.standard_normal(shape) * 3,
         "positive": lambda: rng.uniform(0.5, 4.0, shape),
         "zeros": lambda: np.zeros(shape),
         "negative": lambda: -rng.uniform(1.0, 2.0, shape)}[kind]().astype(np.float32)
    if kind == "normal":   # exact ties: x a half-integer multiple of its scale
        x.reshape(-1)[:8] = (np.arange(8) + 0.5) * (x.max() - x.min()) / np.float32(255)
    g = Graph("dq")
    xv = g.add_input("x", T.TensorType(T.float32, shape))
    g.outputs = g.add_node("DynamicQuantizeLinear", [xv], num_outputs=3)
    model = dnnc.compile(g, "llvm", cache=False)
    assert [r["template"] for r in model.profile(x, repeat=1)] == ["dynamic_quantize"]
    for got, want in zip(model(x), dynamic_quantize_linear(x)):
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("lanes,offsets", [(1, (0, 1, 2, 3)), (16, (0, 1, 2, 3)),
                                           (8, (0, 2, 1, 5)), (7, (3, 0, 0, 9))])
def test_pack_u8x4_puts_byte_t_in_bits_8t(lanes, offsets):
    """`pack_u8x4` of 4 loads of a byte row (a window, as depthwise_int8's words, or bytes
    anywhere), scalar and in vector code of odd widths, against NumPy's view of the bytes."""
    from dnnc.ir import loop as L

    rows = 3
    src = L.Buffer("src", T.uint8, (rows, 64))
    y = L.Buffer("y", T.uint32, (rows, lanes))
    r, j = L.Var("r"), L.Var("j")
    kind = L.ForKind.VECTORIZED if lanes > 1 else L.ForKind.SERIAL
    word = L.call("pack_u8x4", *(src[r, j * 2 + d] for d in offsets), dtype=T.uint32)
    func = L.PrimFunc("pack", (src, y), L.For(r, rows, L.For(j, lanes, L.Store(
        y, (r, j), word), kind)))
    mb = ModuleBuilder("pack", HOST)
    mb.add(func)
    assert "shufflevector" in str(mb) or lanes == 1
    jm = JITModule(str(mb), host_target(), 2)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(jm.address("pack_packed"))
    a = np.random.default_rng(lanes).integers(0, 256, (rows, 64)).astype(np.uint8)
    got = np.zeros((rows, lanes), np.uint32)
    fn((ctypes.c_void_p * 2)(a.ctypes.data, got.ctypes.data), (ctypes.c_int64 * 1)())
    cols = np.arange(lanes)[:, None] * 2 + np.array(offsets)[None, :]
    want = np.ascontiguousarray(a[:, cols]).view(np.uint32)[..., 0]
    assert np.array_equal(got, want)
