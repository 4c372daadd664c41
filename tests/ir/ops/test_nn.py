"""Convolution and pooling ops: references against onnxruntime and naive loops, symbolic-dim
inference, and errors."""

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph
from dnnc.ir.ops.conv import conv

ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
              np.float64: TensorProto.DOUBLE, np.uint8: TensorProto.UINT8,
              np.int8: TensorProto.INT8, np.int64: TensorProto.INT64, np.int32: TensorProto.INT32}


def _run_both(op, inputs, attrs, num_outputs=1, opset=22):
    """Run one ONNX node with onnxruntime and with dnnc's numpy target."""
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    outs = [f"o{k}" for k in range(num_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    present = [(n, x) for n, x in zip(names, inputs) if x is not None]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, ONNX_TYPES[x.dtype.type], x.shape) for n, x in present],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {n: x for n, x in present})
    got = dnnc.compile(model, target="numpy").run(*[x for _, x in present])
    return got, want


def _close(got, want, tol=1e-4):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                   rtol=tol, atol=tol)


def _naive_conv(x, w, b, strides, dilations, pads, group):
    """Direct definition: a loop over every output element."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    nd = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pads[i], pads[nd + i])
                                                          for i in range(nd)])
    outs = [(xp.shape[2 + i] - dilations[i] * (w.shape[2 + i] - 1) - 1) // strides[i] + 1
            for i in range(nd)]
    y = np.zeros((n, m, *outs))
    for b_i, o_c in itertools.product(range(n), range(m)):
        g = o_c // (m // group)
        for pos in itertools.product(*(range(o) for o in outs)):
            acc = 0.0
            for ci in range(cg):
                for kk in itertools.product(*(range(k) for k in w.shape[2:])):
                    src = tuple(p * s + k * d for p, s, k, d in zip(pos, strides, kk, dilations))
                    acc += xp[(b_i, g * cg + ci) + src] * w[(o_c, ci) + kk]
            y[(b_i, o_c) + pos] = acc + (0 if b is None else b[o_c])
    return y


CONV_CASES = [  # x shape, w shape, group, strides, dilations, pads
    ((2, 4, 7), (6, 2, 3), 2, [2], [1], [1, 0]),
    ((1, 3, 9, 8), (4, 3, 3, 2), 1, [2, 1], [1, 2], [1, 2, 0, 1]),
    ((2, 6, 6, 7), (6, 1, 3, 3), 6, [1, 2], [2, 1], [2, 1, 2, 1]),  # depthwise
    ((1, 4, 5, 4, 6), (2, 2, 2, 3, 2), 2, [1, 2, 2], [2, 1, 1], [0, 1, 1, 1, 0, 0]),
]


@pytest.mark.parametrize("xs,ws,group,strides,dilations,pads", CONV_CASES)
def test_conv_matches_direct_definition(xs, ws, group, strides, dilations, pads):
    rng = np.random.default_rng(len(xs) * 7 + group)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    got = conv(x, w, b, group=group, strides=strides, dilations=dilations, pads=pads)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _naive_conv(x, w, b, strides, dilations, pads, group),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_auto_pad_against_onnxruntime(auto_pad, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 9, 8)).astype(dtype)
    w = rng.standard_normal((6, 2, 3, 4)).astype(dtype)
    got, want = _run_both("Conv", [x, w], dict(auto_pad=auto_pad, group=2, strides=[2, 3]))
    _close(got, want, 2e-2 if dtype == np.float16 else 1e-4)


CONV_T_CASES = [  # x shape, w shape, attrs
    ((1, 2, 4), (2, 3, 3), dict(strides=[2], pads=[1, 0], output_padding=[1])),
    ((2, 4, 3, 4), (4, 2, 3, 2), dict(group=2, strides=[2, 3], dilations=[2, 1],
                                      pads=[1, 0, 0, 1])),
    ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2], output_shape=[8, 7])),
    ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2], output_shape=[5, 6])),
    ((1, 2, 3, 4), (2, 1, 3, 3), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ((1, 2, 3, 3, 2), (2, 2, 2, 3, 2), dict(strides=[1, 2, 2], pads=[0, 1, 0, 1, 0, 1])),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_T_CASES)
def test_conv_transpose_against_onnxruntime(xs, ws, attrs):
    rng = np.random.default_rng(sum(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)
    _close(*_run_both("ConvTranspose", [x, w, b], attrs))


def test_conv_transpose_is_the_adjoint_of_conv():
    # <conv(x), y> == <x, conv_transpose(y)> for the same weights and geometry
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 4, 9, 7))
    w = rng.standard_normal((6, 2, 3, 2))
    geo = dict(group=2, strides=[2, 3], dilations=[1, 2], pads=[1, 2, 0, 1])
    y = conv(x, w, **geo)
    r = rng.standard_normal(y.shape)
    out_pad = [1, 1]  # recovers the 9x7 input extent
    from dnnc.ir.ops.conv import conv_transpose
    back = conv_transpose(r, w, **geo, output_padding=out_pad)
    assert back.shape == x.shape
    np.testing.assert_allclose((y * r).sum(), (x * back).sum(), rtol=1e-10)


@pytest.mark.parametrize("xtype,wtype,per_channel", [(np.uint8, np.uint8, False),
                                                     (np.uint8, np.int8, True),
                                                     (np.int8, np.int8, False)])
def test_conv_integer_against_onnxruntime(xtype, wtype, per_channel):
    rng = np.random.default_rng(5)
    info = np.iinfo(xtype), np.iinfo(wtype)
    x = rng.integers(info[0].min, info[0].max, (1, 3, 6, 5), endpoint=True).astype(xtype)
    w = rng.integers(info[1].min, info[1].max, (4, 3, 2, 2), endpoint=True).astype(wtype)
    xz = np.array(rng.integers(0, 20), xtype)
    wz = rng.integers(0, 9, 4 if per_channel else ()).astype(wtype)
    if per_channel:  # onnxruntime's CPU kernel takes a scalar w_zero_point only
        got = dnnc.ir.ops.conv.conv_integer(x, w, xz, wz, pads=[1, 0, 0, 1])
        want = _naive_conv(x.astype(np.int64) - xz, w.astype(np.int64) - wz.reshape(4, 1, 1, 1),
                           None, [1, 1], [1, 1], [1, 0, 0, 1], 1)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
        return
    got, want = _run_both("ConvInteger", [x, w, xz, wz], dict(pads=[1, 0, 0, 1]), opset=10)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[0].dtype == np.int32


POOL_CASES = [  # x shape, attrs
    ((1, 2, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((2, 3, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1], ceil_mode=1)),
    ((1, 2, 8, 7), dict(kernel_shape=[2, 3], strides=[2, 2], dilations=[2, 1], ceil_mode=1)),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 7, 6), dict(kernel_shape=[2, 3], strides=[3, 2], auto_pad="SAME_LOWER")),
    ((1, 1, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1])),
]


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_values_and_indices(xs, attrs, storage_order):
    rng = np.random.default_rng(len(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    attrs = dict(attrs, storage_order=storage_order)
    if len(xs) == 5 and storage_order:
        pytest.skip("onnxruntime supports storage_order only for 2-D pools")
    _close(*_run_both("MaxPool", [x], attrs, num_outputs=2))


def test_max_pool_integer_types():
    rng = np.random.default_rng(2)
    for dtype in (np.uint8, np.int8):
        x = rng.integers(-100, 100, (1, 2, 5, 6)).astype(dtype)
        got, want = _run_both("MaxPool", [x], dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1]))
        np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_against_onnxruntime(xs, attrs, count_include_pad):
    rng = np.random.default_rng(len(xs) + 1)
    x = rng.standard_normal(xs).astype(np.float32)
    _close(*_run_both("AveragePool", [x], dict(attrs, count_include_pad=count_include_pad)))


@pytest.mark.parametrize("xs,attrs", [c for c in POOL_CASES if "ceil_mode" not in c[1]])
def test_lp_pool_against_onnxruntime(xs, attrs):
    rng = np.random.default_rng(len(xs) + 2)
    x = rng.standard_normal(xs).astype(np.float32)
    for p in (1, 2, 3):
        _close(*_run_both("LpPool", [x], dict(attrs, p=p), opset=18))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools_against_onnxruntime(op):
    rng = np.random.default_rng(4)
    for xs in ((2, 3, 5), (1, 4, 3, 6), (1, 2, 3, 2, 4)):
        _close(*_run_both(op, [rng.standard_normal(xs).astype(np.float32)], {}))


def test_global_lp_pool():
    # onnxruntime has no GlobalLpPool kernel; the definition is a p-norm over spatial axes
    from dnnc.ir.ops.pool import global_lp_pool
    x = np.random.default_rng(9).standard_normal((2, 3, 4, 5)).astype(np.float32)
    for p in (1, 2, 3):
        want = np.linalg.norm(x.reshape(2, 3, -1).astype(np.float64), ord=p, axis=-1)
        got = global_lp_pool(x, p=p)
        assert got.shape == (2, 3, 1, 1) and got.dtype == np.float32
        np.testing.assert_allclose(got[:, :, 0, 0], want, rtol=1e-5)


def test_max_unpool_inverts_max_pool():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    from dnnc.ir.ops.pool import max_pool, max_unpool
    y, idx = max_pool(x, kernel_shape=[2, 2], strides=[2, 2])
    back = max_unpool(y, idx, kernel_shape=[2, 2], strides=[2, 2])
    # every window keeps exactly its maximum, in place
    assert back.shape == x.shape
    np.testing.assert_array_equal(back[back != 0], x[back != 0])
    assert (back != 0).sum() == y.size
    _close(*_run_both("MaxUnpool", [y, idx], dict(kernel_shape=[2, 2], strides=[2, 2])))
    # a larger output_shape pads the unpooled tensor at the end (as ONNX's own test expects)
    got = max_unpool(y, idx, np.array([2, 3, 7, 9]), kernel_shape=[2, 2], strides=[2, 2])
    assert got.shape == (2, 3, 7, 9)
    np.testing.assert_array_equal(got[:, :, :6, :8], back)
    assert not got[:, :, 6:].any() and not got[:, :, :, 8:].any()


def test_col2im_is_the_adjoint_of_im2col():
    rng = np.random.default_rng(8)
    from dnnc.ir.ops.conv import col2im
    image, block = [6, 5], [2, 3]
    geo = dict(strides=[2, 1], dilations=[1, 2], pads=[1, 0, 0, 1])
    bh = (6 + 1 + 0 - 2) // 2 + 1
    bw = (5 + 0 + 1 - 5) // 1 + 1
    cols = rng.standard_normal((2, 3 * 6, bh * bw))
    img = col2im(cols, np.array(image), np.array(block), **geo)
    assert img.shape == (2, 3, 6, 5)
    # im2col of a random image, by the direct definition
    x = rng.standard_normal(img.shape)
    xp = np.pad(x, [(0, 0), (0, 0), (1, 0), (0, 1)])
    gathered = np.zeros_like(cols).reshape(2, 3, 6, bh, bw)
    for ki, kj, oi, oj in itertools.product(range(2), range(3), range(bh), range(bw)):
        gathered[:, :, ki * 3 + kj, oi, oj] = xp[:, :, oi * 2 + ki, oj + 2 * kj]
    np.testing.assert_allclose((gathered.reshape(cols.shape) * cols).sum(), (x * img).sum(),
                               rtol=1e-10)


# -- inference -----------------------------------------------------------------------------------


def _infer(op, types, attrs=None, consts=None, num_outputs=1):
    g = Graph()
    inputs = []
    for k, t in enumerate(types):
        if consts and k in consts:
            from dnnc.frontend.onnx import constant_value
            inputs.append(constant_value(f"c{k}", consts[k]))
        else:
            inputs.append(None if t is None else g.add_input(f"x{k}", t))
    return [o.type for o in g.add_node(op, inputs, attrs or {}, num_outputs=num_outputs)]


F32 = T.float32


def test_symbolic_batch_and_spatial_dims():
    w = T.TensorType(F32, (8, 3, 3, 3))
    out = _infer("Conv", [T.TensorType(F32, ("N", 3, 224, 224)), w],
                 dict(strides=[2, 2], pads=[1, 1, 1, 1]))[0]
    assert out.shape == ("N", 8, 112, 112)
    out = _infer("Conv", [T.TensorType(F32, ("N", 3, "H", "W")), w], dict(pads=[1, 1, 1, 1]))[0]
    assert out.shape == ("N", 8, "H", "W")
    out = _infer("Conv", [T.TensorType(F32, ("N", 3, "H", 10)), w],
                 dict(auto_pad="VALID", strides=[2, 2]))[0]
    assert out.shape[0] == "N" and isinstance(out.shape[2], str) and out.shape[3] == 4
    out = _infer("ConvTranspose", [T.TensorType(F32, ("N", 8, "H", 5)),
                                   T.TensorType(F32, (8, 2, 4, 4))],
                 dict(strides=[2, 2], pads=[1, 1, 1, 1], group=2))[0]
    assert out.shape == ("N", 4, "2*H", 10)
    outs = _infer("MaxPool", [T.TensorType(F32, ("B", 4, 11, 11))],
                  dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), num_outputs=2)
    assert outs[0].shape == ("B", 4, 5, 5) and outs[1] == T.TensorType(T.int64, ("B", 4, 5, 5))
    out = _infer("GlobalAveragePool", [T.TensorType(T.float16, ("B", 4, "H", "W"))])[0]
    assert out == T.TensorType(T.float16, ("B", 4, 1, 1))
    out = _infer("ConvInteger", [T.TensorType(T.uint8, ("N", 3, 5, 5)),
                                 T.TensorType(T.int8, (2, 3, 3, 3))])[0]
    assert out == T.TensorType(T.int32, ("N", 2, 3, 3))
    out = _infer("MaxUnpool", [T.TensorType(F32, ("N", 2, 3, 4)),
                               T.TensorType(T.int64, ("N", 2, 3, 4))],
                 dict(kernel_shape=[2, 2], strides=[2, 2]))[0]
    assert out.shape == ("N", 2, 6, 8)
    out = _infer("Col2Im", [T.TensorType(F32, ("N", 12, 20)), T.TensorType(T.int64, (2,)),
                            T.TensorType(T.int64, (2,))], {},
                 consts={1: np.array([5, 6]), 2: np.array([2, 2])})[0]
    assert out.shape == ("N", 3, 5, 6)


@pytest.mark.parametrize("op,types,attrs,message", [
    ("Conv", [(1, 4, 8, 8), (6, 3, 3, 3)], {}, "channels"),
    ("Conv", [(1, 4, 8, 8), (6, 2, 3, 3)], {"group": 4}, "channels"),
    ("Conv", [(1, 4, 8), (6, 4, 3, 3)], {}, "rank"),
    ("Conv", [(1, 4, 8, 8), (6, 4, 3, 3)], {"strides": [1]}, "strides"),
    ("Conv", [(1, 4, 2, 8), (6, 4, 3, 3)], {}, "does not fit"),
    ("Conv", [(1, 4, 8, 8), (6, 4, 3, 3)], {"auto_pad": "SAME"}, "auto_pad"),
    ("MaxPool", [(1, 4, 8, 8)], {"kernel_shape": [2]}, "kernel_shape"),
    ("MaxPool", [(4, 8)], {"kernel_shape": [2]}, "spatial"),
    ("AveragePool", [(1, 4, 8, 8)], {"kernel_shape": [2, 2], "pads": [0, 0, -1, 0]}, "pads"),
])
def test_bad_inputs_raise_shape_errors(op, types, attrs, message):
    with pytest.raises(ShapeError, match=message):
        _infer(op, [T.TensorType(F32, s) for s in types], attrs)


def test_missing_kernel_shape_is_reported():
    from dnnc.errors import ModelFormatError
    with pytest.raises(ModelFormatError, match="kernel_shape"):
        _infer("MaxPool", [T.TensorType(F32, (1, 2, 4, 4))])


def test_conv_rejects_integer_inputs():
    with pytest.raises(ShapeError, match="must be one of"):
        _infer("Conv", [T.TensorType(T.int32, (1, 2, 4, 4)), T.TensorType(T.int32, (1, 2, 1, 1))])


def test_deform_conv_with_zero_offsets_is_conv_and_shifts_sample():
    from dnnc.ir.ops.conv import deform_conv
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 4, 6, 7)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    geo = dict(group=2, strides=[2, 1], dilations=[1, 2], pads=[1, 0, 1, 2])
    want = conv(x, w, b, **geo)
    offset = np.zeros((2, 2 * 2 * 6) + want.shape[2:], np.float32)
    got = deform_conv(x, w, offset, b, offset_group=2, **geo)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # an integer offset of +1 row everywhere equals a conv of the input shifted up one row
    # (no top padding, where the two would differ)
    geo["pads"] = [0, 0, 1, 2]
    offset = np.zeros((2, 2 * 2 * 6) + conv(x, w, **geo).shape[2:], np.float32)
    offset[:, 0::2] = 1.0
    mask = np.ones((2, 2 * 6) + offset.shape[2:], np.float32)
    got = deform_conv(x, w, offset, None, mask, offset_group=2, **geo)
    shifted = np.concatenate([x[:, :, 1:], np.zeros_like(x[:, :, :1])], axis=2)
    np.testing.assert_allclose(got, conv(shifted, w, **geo), rtol=1e-5, atol=1e-5)


def test_causal_conv_with_state_streams():
    from dnnc.ir.ops.conv import causal_conv_with_state
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 3, 10)).astype(np.float32)
    w = rng.standard_normal((3, 1, 4)).astype(np.float32)
    whole, _ = causal_conv_with_state(x, w, activation="silu")
    first, state = causal_conv_with_state(x[:, :, :6], w, activation="silu")
    second, _ = causal_conv_with_state(x[:, :, 6:], w, None, state, activation="silu")
    np.testing.assert_allclose(np.concatenate([first, second], axis=2), whole, rtol=1e-6)
    plain = conv(np.pad(x, [(0, 0), (0, 0), (3, 0)]), w, group=3)
    np.testing.assert_allclose(whole, plain / (1 + np.exp(-plain)), rtol=1e-5, atol=1e-6)


# -- compute rules -------------------------------------------------------------------------------
# Each rule, interpreted by NumPy over its loop IR, against the op's reference on fresh inputs.

from dnnc.ir.compute import NoCompute, apply_rule, evaluate, placeholder, run_rule  # noqa: E402
from dnnc.ir.graph import Value  # noqa: E402
from dnnc.ir.ops.registry import get_op, infer_node  # noqa: E402


def _check_rule(op, arrays, attrs=None, tol=1e-4, num_outputs=1, dims=None):
    """Rule against reference; `dims` ({input: {axis: name}}) makes those input axes symbolic,
    their sizes (and the output's) bound only when the rule's tensors are evaluated."""
    attrs = dict(attrs or {})
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})
    if dims is None:
        got = run_rule(op, arrays, attrs, num_outputs=num_outputs)
    else:
        values = [None if a is None else Value(f"in{k}", T.TensorType(
            T.DType.from_numpy(a.dtype), tuple(dims.get(k, {}).get(ax, n)
                                               for ax, n in enumerate(a.shape))))
            for k, a in enumerate(arrays)]
        types, _, full = infer_node(op, values, attrs, num_outputs, op)
        sizes = {name: arrays[k].shape[ax] for k, m in dims.items() for ax, name in m.items()}
        for t, w in zip(types, want):
            sizes.update((d, n) for d, n in zip(t.shape, w.shape) if isinstance(d, str))
        tensors = [None if v is None else placeholder(v.name, v.type.dtype, v.type.shape)
                   for v in values]
        got = evaluate(apply_rule(op, tensors, full, types),
                       {f"in{k}": a for k, a in enumerate(arrays) if a is not None}, sizes)
    assert len(got) == num_outputs
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol)


def _randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


RULE_CONV_CASES = [
    ((1, 4, 8, 8), (6, 4, 3, 3), {}),
    ((2, 4, 9, 7), (6, 2, 3, 2), dict(group=2, strides=[2, 1], pads=[1, 0, 2, 1],
                                      dilations=[1, 2])),
    ((1, 4, 8), (4, 1, 3), dict(group=4, pads=[1, 1])),                         # depthwise
    ((1, 4, 8), (8, 1, 3), dict(group=4, pads=[2, 0], strides=[3])),            # multiplier 2
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 2])),
    ((1, 3, 7, 7), (4, 3, 1, 1), {}),                                           # pointwise
    ((1, 3, 7, 7), (3, 1, 1, 1), dict(group=3, pads=[1, 1, 1, 1])),             # all-pad rim
    ((1, 3, 7, 8), (4, 3, 3, 2), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 3, 7, 8), (4, 3, 3, 2), dict(auto_pad="SAME_LOWER", strides=[3, 2])),
    ((1, 3, 7, 8), (4, 3, 3, 2), dict(auto_pad="VALID", strides=[2, 3])),
]


@pytest.mark.parametrize("xs,ws,attrs", RULE_CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_rule(rng, xs, ws, attrs, dtype):
    x, w, b = _randn(rng, xs, dtype), _randn(rng, ws, dtype), _randn(rng, ws[:1], dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-4
    _check_rule("Conv", [x, w], attrs, tol)
    _check_rule("Conv", [x, w, b], attrs, tol)


@pytest.mark.parametrize("attrs", [dict(pads=[1, 1, 1, 1]),
                                   dict(auto_pad="SAME_UPPER", strides=[2, 2]),
                                   dict(auto_pad="SAME_LOWER", strides=[2, 3])])
def test_conv_rule_with_symbolic_batch_and_spatial_dims(rng, attrs):
    arrays = [_randn(rng, (2, 3, 7, 8)), _randn(rng, (4, 3, 3, 3)), _randn(rng, (4,))]
    _check_rule("Conv", arrays, attrs, dims={0: {0: "N", 2: "H", 3: "W"}})


@pytest.mark.parametrize("xtype,wtype,zps", [(np.uint8, np.int8, "per_channel"),
                                             (np.uint8, np.uint8, "scalar"),
                                             (np.int8, np.int8, None)])
def test_conv_integer_rule(rng, xtype, wtype, zps):
    x = rng.integers(0 if xtype == np.uint8 else -128, 128, (1, 3, 6, 6)).astype(xtype)
    w = rng.integers(-128 if wtype == np.int8 else 0, 128, (4, 3, 3, 3)).astype(wtype)
    arrays = [x, w]
    if zps:
        arrays += [np.array([7], xtype), rng.integers(0, 9, 4 if zps == "per_channel"
                                                      else ()).astype(wtype)]
    _check_rule("ConvInteger", arrays, dict(pads=[1, 0, 1, 2], strides=[2, 1]), tol=0)


RULE_CONV_T_CASES = [
    ((1, 4, 5, 5), (4, 3, 3, 3), {}),
    ((1, 4, 5, 6), (4, 2, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 0])),
    ((2, 4, 5, 6), (4, 1, 3, 2), dict(strides=[2, 3], group=2, dilations=[2, 1])),
    ((1, 3, 5), (3, 2, 4), dict(strides=[3], auto_pad="SAME_UPPER")),
    ((1, 3, 5), (3, 2, 4), dict(strides=[2], auto_pad="SAME_LOWER")),
    ((1, 3, 5, 5), (3, 2, 3, 3), dict(strides=[2, 2], output_shape=[12, 11])),
    ((1, 3, 4, 4, 4), (3, 2, 2, 2, 2), dict(strides=[2, 2, 2])),
    ((1, 4, 5, 5), (4, 1, 3, 3), dict(group=4, strides=[2, 2], pads=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("xs,ws,attrs", RULE_CONV_T_CASES)
def test_conv_transpose_rule(rng, xs, ws, attrs):
    x, w = _randn(rng, xs), _randn(rng, ws)
    _check_rule("ConvTranspose", [x, w], attrs)
    _check_rule("ConvTranspose", [x, w, _randn(rng, (ws[1] * attrs.get("group", 1),))], attrs)


def test_conv_transpose_rule_half_and_symbolic_dims(rng):
    x, w = _randn(rng, (2, 4, 5, 6)), _randn(rng, (4, 2, 3, 3))
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1], group=2)
    _check_rule("ConvTranspose", [x.astype(np.float16), w.astype(np.float16)], attrs, tol=1e-2)
    _check_rule("ConvTranspose", [x, w], attrs, dims={0: {0: "N", 2: "H", 3: "W"}})
    _check_rule("ConvTranspose", [x, w], dict(strides=[2, 2], auto_pad="SAME_UPPER"),
                dims={0: {0: "N", 2: "H"}})


RULE_POOL_CASES = [
    ((1, 2, 8, 8), dict(kernel_shape=[3, 3])),
    ((1, 2, 9, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((2, 3, 10), dict(kernel_shape=[4], strides=[3], ceil_mode=1)),
    ((1, 2, 11, 11), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 1])),
    ((1, 2, 7, 8), dict(kernel_shape=[2, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 2, 7, 8), dict(kernel_shape=[2, 3], auto_pad="SAME_LOWER", strides=[2, 3])),
    ((1, 2, 9, 9), dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 1, 2, 1], strides=[2, 2],
                        ceil_mode=1)),
    ((1, 1, 5, 6, 7), dict(kernel_shape=[2, 2, 3], strides=[2, 2, 2], pads=[1, 0, 1, 1, 0, 1])),
    ((1, 2, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="VALID")),
    ((1, 2, 5, 5), dict(kernel_shape=[1, 1], pads=[2, 2, 2, 2])),      # windows wholly in pads
]


@pytest.mark.parametrize("xs,attrs", RULE_POOL_CASES)
def test_max_pool_rule(rng, xs, attrs):
    x = _randn(rng, xs)
    for order in (0, 1):
        _check_rule("MaxPool", [x], dict(attrs, storage_order=order), num_outputs=2, tol=0)
    _check_rule("MaxPool", [x.astype(np.float16)], attrs, tol=0)
    # int8 with repeated values: the first maximum's index, as the reference
    xi = rng.integers(-100, 4, xs).astype(np.int8)
    _check_rule("MaxPool", [xi], attrs, num_outputs=2, tol=0)


@pytest.mark.parametrize("xs,attrs", RULE_POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_rule(rng, xs, attrs, count_include_pad):
    x = _randn(rng, xs)
    attrs = dict(attrs, count_include_pad=count_include_pad)
    _check_rule("AveragePool", [x], attrs)
    _check_rule("AveragePool", [x.astype(np.float16)], attrs, tol=3e-3)


@pytest.mark.parametrize("xs,attrs", RULE_POOL_CASES)
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool_rule(rng, xs, attrs, p):
    _check_rule("LpPool", [_randn(rng, xs)], dict(attrs, p=p))


def test_pool_rules_with_symbolic_dims(rng):
    x = _randn(rng, (2, 3, 11, 10))
    dims = {0: {0: "N", 2: "H", 3: "W"}}
    _check_rule("MaxPool", [x], dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
                num_outputs=2, dims=dims)
    _check_rule("AveragePool", [x], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                         count_include_pad=1), dims=dims)
    _check_rule("AveragePool", [x], dict(kernel_shape=[3, 3], strides=[2, 2],
                                         auto_pad="SAME_LOWER"), dims=dims)


@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}), ("GlobalMaxPool", {}),
                                      ("GlobalLpPool", {}), ("GlobalLpPool", {"p": 3})])
@pytest.mark.parametrize("xs", [(2, 3, 4, 5), (1, 2, 7), (1, 2, 3, 4, 2)])
def test_global_pool_rules(rng, op, attrs, xs):
    _check_rule(op, [_randn(rng, xs)], attrs)
    _check_rule(op, [_randn(rng, xs, np.float16)], attrs, tol=1e-2)
    _check_rule(op, [_randn(rng, xs)], attrs, dims={0: {0: "N", 2: "H"}})


def test_scatter_and_sampling_ops_have_no_compute_rule(rng):
    x = _randn(rng, (1, 1, 2, 2))
    with pytest.raises(NoCompute):
        run_rule("MaxUnpool", [x, np.array([0, 3, 8, 10]).reshape(1, 1, 2, 2)],
                 dict(kernel_shape=[2, 2], strides=[2, 2]))
    with pytest.raises(NoCompute):
        run_rule("Col2Im", [_randn(rng, (1, 4, 4)), np.array([3, 3]), np.array([2, 2])],
                 const_inputs=(1, 2))
    with pytest.raises(NoCompute):
        run_rule("DeformConv", [_randn(rng, (1, 1, 3, 3)), _randn(rng, (1, 1, 2, 2)),
                                np.zeros((1, 8, 2, 2), np.float32)])


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("length", [1, 2, 7])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state_rule(rng, k, length, activation):
    for dtype, tol in ((np.float32, 1e-5), (np.float16, 1e-2), (np.float64, 1e-12)):
        x, w = _randn(rng, (2, 3, length), dtype), _randn(rng, (3, 1, k), dtype)
        b, state = _randn(rng, (3,), dtype), _randn(rng, (2, 3, k - 1), dtype)
        attrs = {"activation": activation}
        _check_rule("CausalConvWithState", [x, w], attrs, tol, num_outputs=2)
        _check_rule("CausalConvWithState", [x, w, b, state], attrs, tol, num_outputs=2)
        _check_rule("CausalConvWithState", [x, w, None, state], attrs, tol)
    _check_rule("CausalConvWithState", [_randn(rng, (2, 3, length)), _randn(rng, (3, 1, k)),
                                        None, _randn(rng, (2, 3, k - 1))],
                {"activation": activation}, num_outputs=2,
                dims={0: {0: "N", 2: "L"}, 3: {0: "N"}})


@pytest.mark.parametrize("target", ["numpy", "llvm"])
def test_max_pool_propagates_nan(target):
    """A window holding a NaN gives NaN, as np.max, Max and ReduceMax do (found by the fuzzer:
    the reference's running `>` kept a NaN only when it came first in its window, so the numpy
    target disagreed with the llvm target's rule)."""
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 5)).astype(np.float32)
    x[0, 0, 1, 1] = x[0, 1, 3, 4] = np.nan
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])]),
        opset_imports=[helper.make_opsetid("", 18)])
    want = np.lib.stride_tricks.sliding_window_view(x, (2, 2), axis=(2, 3)).max(axis=(-2, -1))
    assert np.isnan(want).sum() == 6
    got = dnnc.compile(model.SerializeToString(), target=target)(x)
    np.testing.assert_array_equal(got, want)
