"""convert_layout's "nhwc_conv" and sink_transposes: convolutions of the cuda target at a
reduced precision run channels-last, with Transposes only at the edges of a chain of them;
meaning preserved; fp32 and llvm untouched."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.backends.registry import REGISTRY
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.target import Target
from dnnc.passes.convert_layout import convert_layout
from dnnc.ir.ops.packed import round_tf32
from dnnc.passes.manager import optimize
from dnnc.passes.sink_transposes import sink_transposes

NHWC = Target("cuda", arch="sm_90", layouts=("nhwc_conv",), precision="tf32")


def _const(rng, name, shape):
    """A float32 constant of tf32 values: at tf32 the rewrite rounds a one-group conv's
    weights to tf32 (`round_tf32`, tested in test_cuda_nhwc), so that the layout's own
    exactness is what these tests compare."""
    return Value(name, T.TensorType(T.float32, shape),
                 const=round_tf32(rng.uniform(-1, 1, shape).astype(np.float32)))


def _block(rng, c=8):
    """A residual block as resnet's after simplify: conv(+bias) -> relu -> conv -> BN as
    Mul, Add of per-channel constants -> + the block's input -> clip, then a second block
    reading it, and a reshape-free pool at the end."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, c, 6, 6)))
    h = x
    for b in range(2):
        y = g.add("Conv", h, _const(rng, f"w{b}a", (c, c, 3, 3)), _const(rng, f"b{b}", (c,)),
                  pads=[1, 1, 1, 1])
        y = g.add("Relu", y)
        y = g.add("Conv", y, _const(rng, f"w{b}b", (c, c, 3, 3)), pads=[1, 1, 1, 1])
        y = g.add("Add", g.add("Mul", y, _const(rng, f"s{b}", (c, 1, 1))),
                  _const(rng, f"t{b}", (c, 1, 1)))
        h = g.add("Clip", g.add("Add", y, h), Value(f"lo{b}", T.TensorType(T.float32, ()),
                                                    const=np.float32(0)),
                  Value(f"hi{b}", T.TensorType(T.float32, ()), const=np.float32(6)))
    g.outputs = [g.add("GlobalAveragePool", h)]
    return g


def _run(g, x):
    return run_graph(g, [x])[0]


def test_convs_run_channels_last_between_the_edges(rng):
    g = _block(rng)
    x = rng.uniform(-1, 1, (2, 8, 6, 6)).astype(np.float32)
    want = _run(g, x)
    assert convert_layout(g, NHWC) == 4
    g.verify()
    ops = Counter(n.op for n in g.nodes)
    assert ops["ConvNHWC"] == 4 and ops["Conv"] == 0
    # one Transpose into the chain (the input; the residual Add reads it too), none between
    # the convolutions; the global pool a mean over the channels-last plane, its [N, C, 1, 1]
    # result a Reshape of [N, 1, 1, C] (no element moves)
    assert ops["Transpose"] == 1, [n.op for n in g.nodes]
    assert [n.op for n in g.nodes][0] == "Transpose"
    assert [n.op for n in g.nodes][-2:] == ["ReduceMean", "Reshape"]
    np.testing.assert_allclose(_run(g, x), want, rtol=1e-5, atol=1e-5)


def test_depthwise_convs_convert_and_grouped_ones_keep_their_neighbours_nchw(rng):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 8, 5, 5)))
    d = g.add("Relu", g.add("Conv", x, _const(rng, "d", (8, 1, 3, 3)), group=8, pads=[1] * 4))
    g.outputs = [g.add("Conv", d, _const(rng, "p", (8, 8, 1, 1)))]
    xv = rng.uniform(-1, 1, (1, 8, 5, 5)).astype(np.float32)
    want = _run(g, xv)
    assert convert_layout(g, NHWC) == 2
    assert [n.op for n in g.nodes] == ["Transpose", "ConvNHWC", "Relu", "ConvNHWC", "Transpose"]
    np.testing.assert_allclose(_run(g, xv), want, rtol=1e-5, atol=1e-5)
    g = Graph("g")   # the same after a grouped conv of 4 groups of 2 channels (half a
    x = g.add_input("x", T.TensorType(T.float32, (1, 8, 5, 5)))   # 16-byte chunk): NCHW
    d = g.add("Relu", g.add("Conv", x, _const(rng, "d", (8, 2, 3, 3)), group=4, pads=[1] * 4))
    g.outputs = [g.add("Conv", d, _const(rng, "p", (8, 8, 1, 1)))]
    assert convert_layout(g, NHWC) == 0
    g = Graph("g")   # 2 groups of 4 float32 channels (a whole chunk): both channels-last
    x = g.add_input("x", T.TensorType(T.float32, (1, 8, 5, 5)))
    d = g.add("Relu", g.add("Conv", x, _const(rng, "d", (8, 4, 3, 3)), group=2, pads=[1] * 4))
    g.outputs = [g.add("Conv", d, _const(rng, "p", (8, 8, 1, 1)))]
    want = _run(g, xv)
    assert convert_layout(g, NHWC) == 2
    assert [n.op for n in g.nodes] == ["Transpose", "ConvNHWC", "Relu", "ConvNHWC", "Transpose"]
    assert g.nodes[1].attrs["group"] == 2
    np.testing.assert_allclose(_run(g, xv), want, rtol=1e-5, atol=1e-5)


def test_fp32_grouped_and_narrow_convs_are_left_alone(rng):
    assert convert_layout(_block(rng), replace(NHWC, precision="fp32")) == 0
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 8, 5, 5)))
    g.outputs = [g.add("Conv", x, _const(rng, "w", (8, 2, 3, 3)), group=4),   # grouped,
                 g.add("Conv", x, _const(rng, "v", (8, 8, 3, 3)), group=1)]   # half chunks
    assert convert_layout(g, NHWC) == 1                 # the ungrouped one


@pytest.mark.parametrize("dtype,channels,padded", [(T.float32, 3, 4), (T.float32, 6, 8),
                                                   (T.float16, 3, 8), (T.float16, 12, 16)])
def test_narrow_convs_read_channels_padded_to_a_whole_chunk(rng, dtype, channels, padded):
    """A stem's 3 channels: zero channels (and zero weights) up to a 16-byte chunk, the conv
    channels-last like the others; the same values."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, (2, channels, 9, 9)))
    w = Value("w", T.TensorType(dtype, (8, channels, 3, 3)),
              const=rng.uniform(-1, 1, (8, channels, 3, 3)).astype(dtype.np))
    g.outputs = [g.add("Relu", g.add("Conv", x, w, pads=[1, 1, 1, 1], strides=[2, 2]))]
    xv = rng.uniform(-1, 1, (2, channels, 9, 9)).astype(dtype.np)
    want = run_graph(g, [xv])[0]
    assert convert_layout(g, replace(NHWC, precision="fp16")) == 1
    g.verify()
    pad = next(n for n in g.nodes if n.op == "Pad")
    conv = next(n for n in g.nodes if n.op == "ConvNHWC")
    assert conv.inputs[0] is pad.outputs[0] and pad.outputs[0].type.shape[-1] == padded
    assert conv.inputs[1].type.shape == (8, 3, 3, padded)
    np.testing.assert_allclose(run_graph(g, [xv])[0], want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype,precision,kernel,stride,pad,size", [
    (T.float16, "fp16", 7, 2, 3, 16),     # resnet's stem: a 4x4 conv of 12 channels (16)
    (T.bfloat16, "bf16", 7, 2, 3, 15),    # an odd image: the last block cropped
    (T.float16, "fp16", 5, 3, 1, 17)])    # stride 3: a 2x2 conv of 27 channels (32)
def test_strided_stems_read_their_inputs_space_to_depth(rng, dtype, precision, kernel,
                                                        stride, pad, size):
    """A strided stem of 3 channels whose patches copy at most FLOAT_S2D_MOST of their chunks
    so: a stride-1 ConvNHWC of its input's s x s space to depth (no Transpose of the input,
    no padding left in the conv), the channels padded to a whole chunk; the same values."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, (2, 3, size, size)))
    shape = (8, 3, kernel, kernel)
    w = Value("w", T.TensorType(dtype, shape), const=rng.uniform(-1, 1, shape).astype(dtype.np))
    b = Value("b", T.TensorType(dtype, (8,)), const=rng.uniform(-1, 1, 8).astype(dtype.np))
    g.outputs = [g.add("Relu", g.add("Conv", x, w, b, pads=[pad] * 4, strides=[stride] * 2))]
    xv = rng.uniform(-1, 1, (2, 3, size, size)).astype(dtype.np)
    want = run_graph(g, [xv])[0].astype(np.float32)
    assert convert_layout(g, replace(NHWC, precision=precision)) == 1
    g.verify()
    conv = next(n for n in g.nodes if n.op == "ConvNHWC")
    blocks, channels = -(-kernel // stride), stride * stride * 3
    padded = -(-channels // 8) * 8
    assert conv.inputs[1].type.shape == (8, blocks, blocks, padded)
    assert list(conv.attrs["strides"]) == [1, 1] and list(conv.attrs["pads"]) == [0] * 4
    assert [n.op for n in g.nodes][:5] == ["Pad", "Reshape", "Transpose", "Reshape", "Pad"]
    got = run_graph(g, [xv])[0].astype(np.float32)
    assert got.shape == want.shape
    unit = 2.0 ** -11 if dtype is T.float16 else 2.0 ** -8   # the stored output's roundings
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * unit * np.abs(want).max())


def test_inverse_transposes_cancel_and_others_stay(rng):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3, 4, 5)))
    t = g.add("Transpose", x, perm=[0, 2, 3, 1])
    r = g.add("Sigmoid", g.add("Mul", t, _const(rng, "s", (3,))))
    back = g.add("Transpose", r, perm=[0, 3, 1, 2])
    other = g.add("Transpose", r, perm=[3, 2, 1, 0])
    g.outputs = [back, g.add("ReduceSum", other, keepdims=1)]
    xv = rng.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32)
    want = run_graph(g, [xv])
    assert sink_transposes(g) > 0
    g.verify()
    ops = [n.op for n in g.nodes]
    assert ops.count("Transpose") == 3 and ops.index("Mul") == 0   # the Mul reads x itself
    for got, w in zip(run_graph(g, [xv]), want):
        np.testing.assert_allclose(got, w, rtol=1e-6)


def test_positional_ops_do_not_take_a_transpose(rng):
    """An op with an axis, or parameter inputs, keeps its Transpose before it."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3, 4)))
    t = g.add("Transpose", x, perm=[0, 2, 1])
    shape = Value("shape", T.TensorType(T.int64, (3,)), const=np.array([2, 4, 3]))
    g.outputs = [g.add("Expand", t, shape)]
    assert sink_transposes(g) == 0


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_resnet18_has_no_transpose_between_its_convolutions(precision):
    """The cuda target's compile of resnet18 at a reduced precision: every conv
    channels-last, the stem's MaxPool too, one Transpose (at tf32 of the input, the
    3-channel stem's input padded to a chunk; at fp16 / bf16 the stem's space to depth's),
    the global pool a mean over the channels-last plane."""
    target = REGISTRY["cuda"].target(Target("cuda", arch="sm_90"), precision)
    graph = optimize(import_onnx(zoo.build("resnet18", size=32)), target, 3)
    ops = Counter(n.op for n in graph.nodes)
    assert ops["ConvNHWC"] == 20 and ops["Conv"] == 0
    assert ops["MaxPoolNHWC"] == 1 and ops["MaxPool"] == 0
    (transpose,) = [n for n in graph.nodes if n.op == "Transpose"]
    if precision == "tf32":
        source = transpose.inputs[0].producer   # the input
        assert ops["Pad"] == 1 and (source is None or source.op == "Cast")
    else:   # the image's and the channels' Pads, its 2 x 2 blocks moved to the channels
        assert ops["Pad"] == 2 and list(transpose.attrs["perm"]) == [0, 2, 4, 3, 5, 1]
    assert ops["ReduceMean"] == 1 and ops["GlobalAveragePool"] == 0


def test_fp32_cuda_compiles_are_unchanged(monkeypatch):
    """fp32 renders the same CUDA C with or without the layout (no NHWC at fp32)."""
    model = zoo.build("resnet18", size=32)
    with_layout = dnnc.compile(model, "cuda", render_only=True).source("cuda")
    monkeypatch.setitem(REGISTRY, "cuda", replace(REGISTRY["cuda"], layouts=()))
    assert dnnc.compile(model, "cuda", render_only=True).source("cuda") == with_layout
    assert "ConvNHWC" not in with_layout and "conv_nhwc" not in with_layout


@pytest.mark.parametrize("name,nhwc,transposes", [("resnet50", 53, 1), ("mobilenet_v2", 52, 1)])
def test_few_transposes_in_resnet50_and_mobilenet(name, nhwc, transposes):
    """resnet50: the block input two convs read is transposed once, the stem's MaxPool
    channels-last; mobilenet_v2: every conv channels-last with the stem (its input padded to
    a chunk); in both one Transpose, of the input; the global pool channels-last."""
    target = REGISTRY["cuda"].target(Target("cuda", arch="sm_90"), "fp16")
    graph = optimize(import_onnx(zoo.build(name, size=32)), target, 3)
    ops = Counter(n.op for n in graph.nodes)
    assert ops["ConvNHWC"] == nhwc and ops["Transpose"] == transposes and \
        ops["ReduceMean"] == 1


def test_duplicate_transposes_are_one(rng):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 2, 3, 4)))
    a = g.add("Transpose", x, perm=[0, 2, 3, 1])
    b = g.add("Transpose", x, perm=[0, 2, 3, 1])
    g.outputs = [g.add("Add", g.add("Relu", a), g.add("Sigmoid", b))]
    xv = rng.uniform(-1, 1, (1, 2, 3, 4)).astype(np.float32)
    want = run_graph(g, [xv])[0]
    sink_transposes(g)
    g.verify()
    assert [n.op for n in g.nodes].count("Transpose") == 1
    np.testing.assert_allclose(run_graph(g, [xv])[0], want, rtol=1e-6)


def test_a_small_broadcast_operand_is_read_through_a_reshape(rng):
    """Mul(T(a), s) with s [N, C, 1, 1] (or [C, 1, 1]) computed by the graph, not a constant
    (squeeze-and-excitation's scale): computed before the Transpose, s read through a
    Reshape to [N, 1, 1, C] (transposing it moves no element), made once for two readers; an
    operand whose transpose would move elements ([N, C, H, 1]) keeps the op after the
    Transpose."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3, 5, 4)))   # channels-last
    s = g.add_input("s", T.TensorType(T.float32, (2, 4, 1, 1)))
    c = g.add_input("c", T.TensorType(T.float32, (4, 1, 1)))
    y = g.add("Add", g.add("Transpose", x, perm=[0, 3, 1, 2]), g.add("Sigmoid", s))
    y = g.add("Sub", g.add("Mul", y, s), c)
    y = g.add("Mul", y, s)
    g.outputs = [g.add("Relu", g.add("Transpose", y, perm=[0, 2, 3, 1]))]
    feeds = [rng.uniform(-1, 1, v.type.shape).astype(np.float32) for v in g.inputs]
    want = run_graph(g, feeds)[0]
    assert sink_transposes(g) > 0
    g.verify()
    ops = Counter(n.op for n in g.nodes)
    # the Sigmoid's, s's (once) and c's Reshapes; no Transpose left (the two cancelled)
    assert ops["Transpose"] == 0 and ops["Reshape"] == 3, [n.op for n in g.nodes]
    np.testing.assert_allclose(run_graph(g, feeds)[0], want, rtol=1e-6)

    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3, 5, 4)))
    s = g.add_input("s", T.TensorType(T.float32, (2, 4, 3, 1)))
    g.outputs = [g.add("Relu", g.add("Transpose", g.add("Mul", g.add(
        "Transpose", x, perm=[0, 3, 1, 2]), s), perm=[0, 2, 3, 1]))]
    sink_transposes(g)
    assert [n.op for n in g.nodes] == ["Transpose", "Mul", "Relu", "Transpose"]   # no Reshape


def test_a_global_pool_of_a_channels_last_image_is_a_plane_mean(rng):
    """GlobalAveragePool(T(a)) (T: NHWC -> NCHW), or ReduceMean(T(a)) over (2, 3) keeping
    them (MobileNetV3's SE in plain torch: x.mean((2, 3), keepdim=True)), becomes
    ReduceMean(a, axes (1, 2)) then a Reshape to [N, C, 1, 1]; a pool of an NCHW value, or
    through another perm, or a mean over other axes, stays."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 4, 6, 5)))   # channels-last
    nchw = g.add("Transpose", g.add("Relu", x), perm=[0, 3, 1, 2])
    pooled = g.add("GlobalAveragePool", nchw)
    plane, channels = (Value(n, T.TensorType(T.int64, (2,)), const=np.array(a, np.int64))
                       for n, a in (("plane", [-1, 2]), ("c", [1, 2])))
    mean = g.add("ReduceMean", nchw, plane, keepdims=1)
    kept = g.add("ReduceMean", nchw, channels, keepdims=1)
    other = g.add("GlobalAveragePool", g.add("Transpose", x, perm=[0, 1, 3, 2]))
    g.outputs = [pooled, mean, kept, other, g.add("GlobalAveragePool", x)]
    xv = rng.uniform(-1, 1, (2, 4, 6, 5)).astype(np.float32)
    want = run_graph(g, [xv])
    assert sink_transposes(g) > 0
    g.verify()
    ops = Counter(n.op for n in g.nodes)
    assert ops["ReduceMean"] == 3 and ops["GlobalAveragePool"] == 2 and ops["Reshape"] == 2
    # the other perm's, and the one the mean over (C, H) reads
    assert ops["Transpose"] == 2, [n.op for n in g.nodes]
    for got, w in zip(run_graph(g, [xv]), want):
        np.testing.assert_allclose(got, w, rtol=1e-6)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0], ceil_mode=1),
    dict(kernel_shape=[3, 2], dilations=[2, 1], auto_pad="SAME_UPPER"),
])
def test_a_max_pool_between_channels_last_ops_runs_channels_last(rng, attrs):
    """MaxPool(T(a)) of a channels-last image becomes T(MaxPoolNHWC(a)): the Transpose moves
    past the pool and cancels against the next conv's; the meaning kept (padding, ceil_mode,
    dilations, auto_pad), also compiled (the compute rule) on llvm."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 7, 9, 5)))   # channels-last
    y = g.add("MaxPool", g.add("Transpose", x, perm=[0, 3, 1, 2]), **attrs)
    g.outputs = [g.add("Neg", g.add("Transpose", g.add("Relu", y), perm=[0, 2, 3, 1]))]
    xv = rng.uniform(-1, 1, (2, 7, 9, 5)).astype(np.float32)
    want = run_graph(g, [xv])[0]
    sink_transposes(g)
    g.verify()
    assert [n.op for n in g.nodes] == ["MaxPoolNHWC", "Relu", "Neg"]
    np.testing.assert_array_equal(run_graph(g, [xv])[0], want)
    np.testing.assert_array_equal(dnnc.compile(g, "llvm")(xv), want)


def test_a_max_pool_with_indices_stays_channels_first(rng):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 4, 4, 3)))
    y, indices = g.add_node("MaxPool", [g.add("Transpose", x, perm=[0, 3, 1, 2])],
                            {"kernel_shape": [2, 2]}, num_outputs=2)
    g.outputs = [y, indices]
    sink_transposes(g)
    assert [n.op for n in g.nodes] == ["Transpose", "MaxPool"]
