"""Shape ops: the ONNX importers of every opset and the references against onnxruntime (or a
naive loop where onnxruntime lacks the op), symbolic shape inference through the shape arithmetic
exporters write, and errors."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.frontend.onnx import ONNX_FROM_DTYPE, import_onnx
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.registry import SymDim

RNG = np.random.default_rng(7031)


def _rand(*shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(1, 100, shape).astype(dtype)
    return (RNG.standard_normal(shape) + 0.5).astype(dtype)


def _i64(*values):
    return np.array(values, np.int64)


def _model(op, inputs, attrs, opset, num_outputs, consts):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    outs = [f"out{k}" for k in range(num_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    graph_inputs, inits = [], []
    for i, x in enumerate(inputs):
        if x is None:
            continue
        if i in consts:
            inits.append(numpy_helper.from_array(x, names[i]))
        else:
            elem = ONNX_FROM_DTYPE[T.DType.from_numpy(x.dtype).name]
            graph_inputs.append(helper.make_tensor_value_info(names[i], elem, x.shape))
    graph = helper.make_graph([node], op, graph_inputs,
                              [onnx.ValueInfoProto(name=o) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _dnnc(op, inputs, attrs, opset, num_outputs=1, consts=()):
    model = _model(op, inputs, attrs, opset, num_outputs, consts)
    feeds = [x for i, x in enumerate(inputs) if x is not None and i not in consts]
    return model, dnnc.compile(model, target="numpy").run(*feeds)


def _check_ort(op, inputs, attrs=None, opset=21, num_outputs=1, consts=()):
    model, got = _dnnc(op, inputs, attrs or {}, opset, num_outputs, consts)
    feeds = {f"in{i}": x for i, x in enumerate(inputs) if x is not None and i not in consts}
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if g.dtype.kind == "f":  # Range: onnxruntime accumulates, dnnc computes start + i*delta
            np.testing.assert_allclose(g, w, rtol=1e-6)
        else:
            np.testing.assert_array_equal(g, w)


X4 = _rand(2, 3, 4, 5)
CASES = [
    # (op, inputs, attrs, opset, outputs, constant input indices)
    ("Shape", [X4], {}, 21, 1, ()),
    ("Shape", [X4], {"start": 1, "end": -1}, 21, 1, ()),
    ("Shape", [X4], {"start": -9, "end": 10}, 21, 1, ()),
    ("Size", [X4], {}, 21, 1, ()),
    ("Reshape", [X4, _i64(0, -1, 5)], {}, 21, 1, (1,)),
    ("Reshape", [X4, _i64(2, 0, -1)], {}, 21, 1, ()),
    ("Reshape", [np.zeros((0, 3), np.float32), _i64(3, 0)], {"allowzero": 1}, 21, 1, ()),
    ("Reshape", [X4, _i64(-1)], {}, 7, 1, (1,)),
    ("Transpose", [X4], {}, 21, 1, ()),
    ("Transpose", [X4], {"perm": [2, 0, 3, 1]}, 7, 1, ()),
    ("Flatten", [X4], {"axis": 0}, 21, 1, ()),
    ("Flatten", [X4], {"axis": -2}, 21, 1, ()),
    ("Flatten", [X4], {"axis": 4}, 9, 1, ()),
    ("Squeeze", [_rand(1, 3, 1, 2), _i64(-2)], {}, 21, 1, (1,)),
    ("Squeeze", [_rand(1, 3, 1, 2), _i64(0, 2)], {}, 21, 1, ()),
    ("Squeeze", [_rand(1, 3, 1, 2)], {}, 21, 1, ()),
    ("Squeeze", [_rand(1, 3, 1, 2)], {"axes": [0]}, 11, 1, ()),
    ("Unsqueeze", [_rand(3, 2), _i64(0, -1)], {}, 21, 1, (1,)),
    ("Unsqueeze", [_rand(3, 2), _i64(3, 1)], {}, 21, 1, ()),
    ("Unsqueeze", [_rand(3, 2)], {"axes": [1]}, 9, 1, ()),
    ("Unsqueeze", [_rand(3, 2)], {"axes": [-1, 0]}, 11, 1, ()),
    ("Concat", [_rand(2, 3), _rand(2, 1), _rand(2, 4)], {"axis": -1}, 21, 1, ()),
    ("Concat", [_rand(2, 3, dtype=np.int32), _rand(1, 3, dtype=np.int32)], {"axis": 0}, 7, 1,
     ()),
    ("Split", [_rand(7, 2)], {"num_outputs": 3}, 18, 3, ()),
    ("Split", [_rand(2, 6)], {"axis": 1, "num_outputs": 2}, 18, 2, ()),
    ("Split", [_rand(2, 6), _i64(1, 4, 1)], {"axis": -1}, 18, 3, (1,)),
    ("Split", [_rand(2, 6), _i64(2, 4)], {"axis": 1}, 13, 2, ()),
    ("Split", [_rand(6, 2)], {}, 13, 3, ()),
    ("Split", [_rand(6, 2)], {"split": [1, 5]}, 11, 2, ()),
    ("Split", [_rand(6, 2)], {}, 7, 2, ()),
    ("Slice", [X4, _i64(1, -3), _i64(100, -1), _i64(0, 3)], {}, 21, 1, (1, 2, 3)),
    ("Slice", [X4, _i64(-1, 10), _i64(-100, 0), _i64(2, 1), _i64(-2, -1)], {}, 21, 1,
     (1, 2, 3, 4)),
    ("Slice", [X4, _i64(4, 0), _i64(0, 3), _i64(3, 0), _i64(-1, 2)], {}, 21, 1, ()),
    ("Slice", [X4, _i64(0), _i64(2)], {}, 10, 1, ()),
    ("Slice", [X4], {"starts": [1, 0], "ends": [1000, -1], "axes": [1, 3]}, 9, 1, ()),
    ("Slice", [X4], {"starts": [-2], "ends": [2 ** 62]}, 7, 1, ()),
    ("Expand", [_rand(3, 1), _i64(2, 1, 4)], {}, 21, 1, (1,)),
    ("Expand", [_rand(2, 3, 1), _i64(3, 1)], {}, 8, 1, ()),
    ("Tile", [_rand(2, 3), _i64(2, 3)], {}, 21, 1, (1,)),
    ("Tile", [_rand(2, 3, dtype=np.int64), _i64(1, 2)], {}, 7, 1, ()),
    ("Pad", [_rand(3, 4), _i64(1, 2, 0, 1), np.array(1.5, np.float32)], {}, 21, 1, (1,)),
    ("Pad", [_rand(3, 4), _i64(1, 2, 2, 1)], {"mode": "reflect"}, 21, 1, ()),
    ("Pad", [_rand(3, 4), _i64(2, 1, 2, 3)], {"mode": "edge"}, 21, 1, ()),
    ("Pad", [_rand(3, 4), _i64(2, 1, 2, 3)], {"mode": "wrap"}, 21, 1, ()),
    ("Pad", [_rand(2, 3, 4), _i64(1, 3), None, _i64(-1)], {}, 21, 1, (1, 3)),
    ("Pad", [_rand(3, 4), _i64(-1, 1, 1, -2)], {}, 21, 1, ()),
    ("Pad", [_rand(3, 4, dtype=np.int32), _i64(0, 1, 2, 0)], {}, 13, 1, ()),
    ("Pad", [_rand(3, 4)], {"pads": [0, 1, 2, 0], "value": 2.5}, 7, 1, ()),
    ("Pad", [_rand(3, 4)], {"pads": [1, 1, 1, 1], "mode": "edge"}, 7, 1, ()),
    ("ConstantOfShape", [_i64(2, 3)], {}, 21, 1, (0,)),
    ("ConstantOfShape", [_i64(3, 1, 2)],
     {"value": helper.make_tensor("v", onnx.TensorProto.INT32, [1], [7])}, 9, 1, ()),
    ("Range", [np.array(2, np.int64), np.array(13, np.int64), np.array(3, np.int64)], {}, 21,
     1, ()),
    ("Range", [np.array(10, np.int32), np.array(4, np.int32), np.array(-2, np.int32)], {}, 11,
     1, (0, 1, 2)),
    ("Range", [np.array(0.5, np.float32), np.array(2.9, np.float32),
               np.array(0.3, np.float32)], {}, 21, 1, ()),
    ("Trilu", [_rand(2, 4, 5)], {}, 21, 1, ()),
    ("Trilu", [_rand(4, 5), np.array(-1, np.int64)], {"upper": 0}, 14, 1, ()),
    ("Trilu", [_rand(4, 5, dtype=np.int32), np.array(2, np.int64)], {"upper": 1}, 14, 1, (1,)),
    ("EyeLike", [_rand(3, 5)], {"k": 1}, 21, 1, ()),
    ("EyeLike", [_rand(4, 3)], {"k": -2, "dtype": onnx.TensorProto.INT32}, 9, 1, ()),
    ("DepthToSpace", [_rand(2, 8, 3, 2)], {"blocksize": 2}, 21, 1, ()),
    ("DepthToSpace", [_rand(1, 18, 2, 2)], {"blocksize": 3, "mode": "CRD"}, 13, 1, ()),
    ("DepthToSpace", [_rand(1, 8, 2, 2)], {"blocksize": 2}, 7, 1, ()),
    ("SpaceToDepth", [_rand(2, 3, 4, 6)], {"blocksize": 2}, 13, 1, ()),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, outputs, consts", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_against_onnxruntime(op, inputs, attrs, opset, outputs, consts):
    _check_ort(op, inputs, attrs, opset, outputs, consts)


def test_space_to_depth_crd_inverts_depth_to_space_crd():
    # SpaceToDepth gained `mode` at opset 28, which onnxruntime does not run yet
    x = _rand(2, 12, 3, 2)
    _, (y,) = _dnnc("DepthToSpace", [x], {"blocksize": 2, "mode": "CRD"}, 21)
    _, (back,) = _dnnc("SpaceToDepth", [y], {"blocksize": 2, "mode": "CRD"}, 28)
    np.testing.assert_array_equal(back, x)
    n, c, h, w = y.shape
    for ci in range(c):  # naive loop: CRD output channel = depth * b*b + row * b + column
        for i in range(h // 2):
            for j in range(w // 2):
                for r in range(2):
                    for q in range(2):
                        assert back[0, ci * 4 + r * 2 + q, i, j] == y[0, ci, 2 * i + r, 2 * j + q]


@pytest.mark.parametrize("shape, axes", [((3, 6), None), ((7, 4, 5), [0, -1])])
def test_center_crop_pad_naive(shape, axes):
    x = _rand(*shape)
    target = _i64(*[5, 3, 2][:len(axes) if axes else len(shape)])
    attrs = {} if axes is None else {"axes": axes}
    _, (y,) = _dnnc("CenterCropPad", [x, target], attrs, 18)
    axes = list(range(len(shape))) if axes is None else [a % len(shape) for a in axes]
    want_shape = list(shape)
    for a, t in zip(axes, target):
        want_shape[a] = int(t)
    assert y.shape == tuple(want_shape)
    # naive: each output index maps to input index + offset (crop) or - offset (pad)
    offsets = [0] * len(shape)
    for a in axes:
        offsets[a] = (shape[a] - want_shape[a]) // 2 if shape[a] > want_shape[a] \
            else -((want_shape[a] - shape[a]) // 2)
    for idx in np.ndindex(*want_shape):
        src = tuple(i + o for i, o in zip(idx, offsets))
        inside = all(0 <= s < d for s, d in zip(src, shape))
        assert y[idx] == (x[src] if inside else 0)


def test_range_float16_accumulates_in_stash_type():
    args = [np.array(v, np.float16) for v in (1000.0, 1100.0, 0.7)]
    _, (y,) = _dnnc("Range", args, {}, 27)
    want = (1000.0 + np.arange(143, dtype=np.float32) * np.float32(np.float16(0.7)))
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, want.astype(np.float16))


# -- symbolic inference ------------------------------------------------------------------------


def _graph(*shapes, dtype=T.float32):
    g = Graph("t")
    return g, [g.add_input(f"x{i}", T.TensorType(dtype, s)) for i, s in enumerate(shapes)]


def _const(g, values, dtype=np.int64):
    return Value(g.fresh_name("c"), T.TensorType(T.DType.from_numpy(dtype), np.shape(values)),
                 const=np.array(values, dtype))


def test_pytorch_shape_chain_keeps_batch_symbolic():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch.onnx writes x.view(B, -1)."""
    g, (x,) = _graph(("N", 3, 4))
    shape = g.add("Shape", x)
    batch = g.add("Gather", shape, _const(g, 0), axis=0)
    batch1 = g.add("Unsqueeze", batch, _const(g, [0]))
    target = g.add("Concat", batch1, _const(g, [-1]), axis=0)
    y = g.add("Reshape", x, target)
    assert [d.dim if isinstance(d, SymDim) else d for d in target.known] == ["N", -1]
    assert y.type.shape == ("N", 12)
    g.outputs = [y]
    for n in (2, 5):
        data = _rand(n, 3, 4)
        (out,) = run_graph(g, [data])
        np.testing.assert_array_equal(out, data.reshape(n, 12))


def test_symbolic_chain_through_onnx_import():
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=0, end=2),
             helper.make_node("Slice", ["s", "zero", "one"], ["b"]),
             helper.make_node("Slice", ["s", "one", "two"], ["t"]),
             helper.make_node("Mul", ["b", "t"], ["bt"]),
             helper.make_node("Concat", ["bt", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(_i64(v), n)
             for v, n in ((0, "zero"), (1, "one"), (2, "two"), (-1, "minus1"))]
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", 1, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", 1, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(model)
    assert g.outputs[0].type.shape == ("batch*seq", 8)
    compiled = dnnc.compile(model, target="numpy")
    for b, s in ((2, 3), (1, 7)):
        data = _rand(b, s, 8)
        np.testing.assert_array_equal(compiled.run(data)[0], data.reshape(b * s, 8))


@pytest.mark.parametrize("opset", [11, 13])
def test_torch_view_pattern_through_onnx_import(opset):
    """torch.onnx's x.view(x.size(0), -1): Constant scalar index, Gather, Unsqueeze, Concat."""
    const = helper.make_tensor("c", onnx.TensorProto.INT64, [], [0])
    minus1 = helper.make_tensor("m", onnx.TensorProto.INT64, [1], [-1])
    axes = helper.make_tensor("a", onnx.TensorProto.INT64, [1], [0])
    unsqueeze = helper.make_node("Unsqueeze", ["b"], ["b1"], axes=[0]) if opset < 13 else \
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"])
    nodes = [helper.make_node("Constant", [], ["zero"], value=const),
             helper.make_node("Constant", [], ["minus1"], value=minus1),
             helper.make_node("Constant", [], ["axes"], value=axes),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             unsqueeze,
             helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", 1, ["batch", 3, 5])],
        [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    assert import_onnx(model).outputs[0].type.shape == ("batch", 15)
    data = _rand(4, 3, 5)
    np.testing.assert_array_equal(dnnc.compile(model, target="numpy").run(data)[0],
                                  data.reshape(4, 15))


def test_shape_and_size_known_values():
    g, (x,) = _graph(("N", 3, "S"))
    s = g.add("Shape", x, start=-2)
    assert s.type.shape == (2,)
    assert list(s.known) == [3, SymDim("S")]
    size = g.add("Size", x)
    assert size.type.shape == () and size.known.reshape(()).item() == SymDim("3*N*S")


@pytest.mark.parametrize("shape, target, want", [
    (("N", 12), [0, 3, 4], ("N", 3, 4)),
    (("N", 12), [-1, 4], ("3*N", 4)),
    (("N", "S", 8), [0, 0, 2, -1], ("N", "S", 2, 4)),
    ((2, "S"), [-1], ("2*S",)),
])
def test_reshape_symbolic(shape, target, want):
    g, (x,) = _graph(shape)
    assert g.add("Reshape", x, _const(g, target)).type.shape == want


def test_reshape_with_run_time_shape_gets_fresh_dims():
    g, (x,) = _graph(("N", 12))
    s = g.add_input("shape", T.TensorType(T.int64, (3,)))
    y = g.add("Reshape", x, s)
    assert y.type.rank == 3 and all(isinstance(d, str) for d in y.type.shape)


def test_shape_driven_ops_stay_symbolic():
    g, (x,) = _graph(("N", "S"))
    shape = g.add("Shape", x)
    assert g.add("ConstantOfShape", shape).type == T.TensorType(T.float32, ("N", "S"))
    assert g.add("Expand", _const(g, [[1.0]], np.float32), shape).type.shape == ("N", "S")
    seq = g.add("Gather", shape, _const(g, 1), axis=0)
    assert g.add("Range", _const(g, 0), seq, _const(g, 1)).type.shape == ("S",)
    assert g.add("Tile", x, _const(g, [2, 3])).type.shape == ("2*N", "3*S")
    assert g.add("Unsqueeze", x, _const(g, [0, 3])).type.shape == (1, "N", "S", 1)
    y = g.add("Unsqueeze", x, _const(g, [1]))
    assert g.add("Squeeze", y, _const(g, [-2])).type.shape == ("N", "S")
    assert g.add("Concat", x, x, axis=1).type.shape == ("N", "2*S")
    assert g.add("Transpose", x).type.shape == ("S", "N")
    assert g.add("Flatten", y, axis=2).type.shape == ("N", "S")
    halves = g.add_node("Split", [x], {"axis": 1, "num_outputs": 2}, num_outputs=2)
    assert [h.type.shape for h in halves] == [("N", "(S//2)")] * 2
    padded = g.add("Pad", x, _const(g, [0, 2, 0, 3]))
    assert padded.type.shape[0] == "N" and isinstance(padded.type.shape[1], str)


@pytest.mark.parametrize("starts, ends, steps, want", [
    ([0], [2 ** 63 - 1], [1], "S"),
    ([1], [2 ** 31 - 1], [1], "(S+-1)"),
    ([-1], [2 ** 63 - 1], [1], 1),
    ([0], [4], [1], 4),
    ([-1], [-(2 ** 63)], [-1], "S"),
])
def test_slice_symbolic(starts, ends, steps, want):
    g, (x,) = _graph(("N", "S"))
    y = g.add("Slice", x, _const(g, starts), _const(g, ends), _const(g, [1]), _const(g, steps))
    assert y.type.shape == ("N", want)


def test_slice_to_symbolic_length():
    """pos_table[:, :S] with S read from another tensor's shape: S (position embeddings)."""
    g, (x, table) = _graph(("N", "S"), (1, 512))
    seq = g.add("Slice", g.add("Shape", x), _const(g, [1]), _const(g, [2]))
    y = g.add("Slice", table, _const(g, [0]), seq, _const(g, [1]))
    assert y.type.shape == (1, "S")
    g.outputs = [y]
    tab = _rand(1, 512)
    (out,) = run_graph(g, [_rand(2, 9), tab])
    np.testing.assert_array_equal(out, tab[:, :9])


def test_shape_arithmetic_values_follow_symbols():
    g, (x,) = _graph(("B", 4, "T"))
    s = g.add("Shape", x)
    tail = g.add("Slice", s, _const(g, [-1]), _const(g, [2 ** 63 - 1]))
    twice = g.add("Concat", tail, tail, axis=0)
    assert list(twice.known) == [SymDim("T"), SymDim("T")]
    assert list(g.add("Expand", tail, _const(g, [3])).known) == [SymDim("T")] * 3
    head = g.add("Squeeze", g.add("Slice", s, _const(g, [0]), _const(g, [1])), _const(g, [0]))
    assert head.type.shape == () and head.known.reshape(()).item() == SymDim("B")


# -- errors ------------------------------------------------------------------------------------


def _fails(build, match):
    with pytest.raises(ShapeError, match=match):
        build()


def test_errors():
    g, (x,) = _graph((2, 6))
    _fails(lambda: g.add("Reshape", x, _const(g, [5, -1])), "cannot reshape")
    _fails(lambda: g.add("Reshape", x, _const(g, [-1, -1])), "more than one -1")
    _fails(lambda: g.add("Reshape", x, _const(g, [4, 4])), "cannot reshape")
    _fails(lambda: g.add("Squeeze", x, _const(g, [1])), "cannot squeeze")
    _fails(lambda: g.add("Unsqueeze", x, _const(g, [0, 0])), "repeat")
    _fails(lambda: g.add("Transpose", x, perm=[0, 0]), "not a permutation")
    _fails(lambda: g.add("Concat", x, _const(g, [1.0], np.float32), axis=0), "rank")
    _fails(lambda: g.add("Concat", x, _const(g, [[1.0, 2.0]], np.float32), axis=0), "differ")
    _fails(lambda: g.add("Concat", x, x, axis=2), "out of range")
    _fails(lambda: g.add_node("Split", [x, _const(g, [2, 2])], {"axis": 1}, num_outputs=2),
           "does not sum")
    _fails(lambda: g.add("Pad", x, _const(g, [0, 0, 0, 0]), mode="mirror"), "mode")
    _fails(lambda: g.add("Pad", x, _const(g, [0, 0])), "2 entries")
    _fails(lambda: g.add("Pad", x, _const(g, [-3, 0, 0, 0])), "below size 0")
    _fails(lambda: g.add("Tile", x, _const(g, [2])), "one entry per axis")
    _fails(lambda: g.add("Slice", x, _const(g, [0]), _const(g, [1]), _const(g, [0]),
                         _const(g, [0])), "steps")
    _fails(lambda: g.add("Expand", x, _const(g, [3, 6])), "cannot expand")
    y = g.add_input("y", T.TensorType(T.float32, (1, 6, 2, 2)))
    _fails(lambda: g.add("DepthToSpace", y, blocksize=2), "blocksize")
    _fails(lambda: g.add("SpaceToDepth", y, blocksize=3), "divide")
    _fails(lambda: g.add("EyeLike", y), "2-D")
    _fails(lambda: g.add("Range", _const(g, [0, 1]), _const(g, 3), _const(g, 1)), "scalar")
    _fails(lambda: g.add("Range", _const(g, 0), _const(g, 3), _const(g, 0)), "delta")
    _fails(lambda: g.add("ConstantOfShape", g.add_input("s", T.TensorType(T.int64, ("K",)))),
           "static length")


# -- compute rules: each rule (interpreted) against the reference --------------------------------

from dnnc.ir.compute import NoCompute, apply_rule, evaluate, placeholder, run_rule  # noqa: E402
from dnnc.ir.ops.registry import get_op, infer_node  # noqa: E402

_BIG = 2 ** 63 - 1


def _reference(op, arrays, attrs):
    return get_op(op).run(arrays, {**get_op(op).attrs, **attrs})


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_array_equal(g, w)  # data movement: exact


def _check_rule(op, arrays, attrs=None, const_inputs=(), num_outputs=None):
    arrays = [None if a is None else np.asarray(a) for a in arrays]
    got = run_rule(op, arrays, attrs, const_inputs=const_inputs, num_outputs=num_outputs)
    _same(got, _reference(op, arrays, attrs or {}))


def _check_rule_symbolic(op, arrays, shapes, sizes, attrs=None, const_inputs=(), num_outputs=1):
    """The rule built on symbolic input shapes (`shapes[k]`, None: the array's), then run with
    the symbols bound to `sizes`."""
    arrays = [None if a is None else np.asarray(a) for a in arrays]
    values = [None if a is None else
              Value(f"in{k}", T.TensorType(T.DType.from_numpy(a.dtype), shapes[k] or a.shape),
                    const=a if k in const_inputs else None) for k, a in enumerate(arrays)]
    types, _, full = infer_node(op, values, dict(attrs or {}), num_outputs, op)
    tensors = [None if v is None else placeholder(v.name, v.type.dtype, v.type.shape,
                                                   value=v.const) for v in values]
    outs = apply_rule(op, tensors, full, types)
    feeds = {f"in{k}": a for k, a in enumerate(arrays) if a is not None}
    _same(evaluate(outs, feeds, sizes), _reference(op, arrays, attrs or {}))


def _x(rng, *shape, dtype=np.float32):
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


DTYPES = [np.float32, np.float16, np.int64, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, target, allowzero", [
    ((2, 3, 4), [4, -1], 0), ((2, 3, 4), [0, 12], 0), ((2, 3, 4), [2, 3, 2, 2], 0),
    ((6, 4), [2, 3, 4], 0), ((2, 3, 4), [24], 0), ((), [1], 0), ((1,), [], 0),
    ((2, 1, 6), [2, 6, 1], 0), ((0, 3), [3, 0], 1)])
def test_reshape_rule(rng, dtype, shape, target, allowzero):
    _check_rule("Reshape", [_x(rng, *shape, dtype=dtype), _i64(*target)], {"allowzero": allowzero},
                const_inputs=(1,))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, 4])
def test_flatten_rule(rng, axis):
    _check_rule("Flatten", [_x(rng, 2, 3, 4, 5)], {"axis": axis})


def test_squeeze_unsqueeze_rules(rng):
    x = _x(rng, 2, 1, 3, 1, dtype=np.int64)
    _check_rule("Squeeze", [x, _i64(1, -1)], const_inputs=(1,))
    _check_rule("Squeeze", [x])
    _check_rule("Squeeze", [_x(rng, 1, 1)])
    _check_rule("Unsqueeze", [x, _i64(0, 5)], const_inputs=(1,))
    _check_rule("Unsqueeze", [_x(rng, 3, 4), _i64(-1, 1)], const_inputs=(1,))
    _check_rule("Unsqueeze", [np.float32(2.5), _i64(0)], const_inputs=(1,))


@pytest.mark.parametrize("perm", [None, [0, 2, 1, 3], [2, 0, 3, 1], [0, 1, 2, 3]])
def test_transpose_rule(rng, perm):
    _check_rule("Transpose", [_x(rng, 2, 3, 4, 5, dtype=np.float16)], {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_rule(rng, axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for k, n in enumerate((1, 0, 3)):  # an empty input among them
        shapes[k][axis] = n
    _check_rule("Concat", [_x(rng, *s) for s in shapes], {"axis": axis})
    _check_rule("Concat", [_x(rng, 2, 3)], {"axis": axis % 2})
    _check_rule("Concat", [_i64(1, 2), _i64(3), _i64(4, 5, 6)], {"axis": 0})


@pytest.mark.parametrize("split, attrs", [
    (None, {"num_outputs": 3}), (None, {"num_outputs": 2, "axis": -1}),
    (_i64(2, 0, 5), {"axis": 1}), (_i64(7), {"axis": 1})])
def test_split_rule(rng, split, attrs):
    x = _x(rng, 3, 7, 4)
    if attrs.get("axis") == -1:
        x = _x(rng, 3, 4, 5)
    count = attrs.get("num_outputs") or len(split)
    arrays = [x] if split is None else [x, split]
    _check_rule("Split", arrays, attrs, const_inputs=(1,), num_outputs=count)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1], [3], None, None), ([0, -3], [_BIG, -1], [1, 2], None),
    ([-1], [-_BIG], [0], [-1]), ([5], [0], [2], [-2]), ([0, 1], [9, 4], [-1, 0], [3, 2]),
    ([10], [20], [1], [1]), ([-10], [2], [2], [1]), ([3], [-10], [2], [-3]),
    ([2, 0], [2, 1], [0, 1], [1, 1]), ([100], [-100], [2], [-1])])
def test_slice_rule(rng, starts, ends, axes, steps):
    arrays = [_x(rng, 4, 5, 6, dtype=np.int64), _i64(*starts), _i64(*ends)]
    if axes is not None or steps is not None:
        arrays.append(None if axes is None else _i64(*axes))
    if steps is not None:
        arrays.append(_i64(*steps))
    _check_rule("Slice", arrays, const_inputs=(1, 2, 3, 4))


def test_slice_rule_needs_known_starts_and_steps(rng):
    arrays = [_x(rng, 4, 5), _i64(1), _i64(3), _i64(1)]
    with pytest.raises(NoCompute, match="starts"):
        run_rule("Slice", arrays, const_inputs=(2, 3))
    with pytest.raises(NoCompute, match="steps"):
        run_rule("Slice", arrays + [_i64(2)], const_inputs=(1, 2, 3))
    with pytest.raises(NoCompute, match="run time"):  # run-time ends: an unknown size
        run_rule("Slice", arrays, const_inputs=(1, 3))


def test_expand_tile_rules(rng):
    _check_rule("Expand", [_x(rng, 3, 1), _i64(2, 1, 4)], const_inputs=(1,))
    _check_rule("Expand", [_x(rng, 1, dtype=np.int64), _i64(3)], const_inputs=(1,))
    _check_rule("Expand", [_x(rng, 2, 3), _i64(3)], const_inputs=(1,))
    _check_rule("Tile", [_x(rng, 2, 3, 4, dtype=np.float16), _i64(2, 1, 3)], const_inputs=(1,))
    with pytest.raises(NoCompute, match="run time"):
        run_rule("Tile", [_x(rng, 2, 3), _i64(1, 2)])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads, axes", [
    ([1, 2, 0, 3], None), ([0, 0, 2, 1], None), ([-1, 1, 2, -2], None), ([3, 4], [-1]),
    ([4, 7, 0, 0], None), ([0, 0], [0])])
def test_pad_rule(rng, mode, pads, axes):
    arrays = [_x(rng, 3, 4), _i64(*pads), None]
    if axes is not None:
        arrays.append(_i64(*axes))
    _check_rule("Pad", arrays, {"mode": mode}, const_inputs=(1, 3))


def test_pad_rule_value_input_dtypes_and_errors(rng):
    x = _x(rng, 2, 3, dtype=np.int32)
    _check_rule("Pad", [x, _i64(1, 1, 0, 2), np.array(7, np.int32)], const_inputs=(1,))
    _check_rule("Pad", [_x(rng, 2, 3, dtype=np.float16), _i64(1, 0, 1, 2),
                        np.array([2.5], np.float16)], const_inputs=(1,))
    _check_rule("Pad", [_x(rng, 1, 3), _i64(0, 2, 0, 1)], {"mode": "reflect"}, const_inputs=(1,))
    _check_rule("Pad", [_x(rng, 2, 3), _i64(0, -2, 0, -1)], const_inputs=(1,))  # cropped away
    with pytest.raises(NoCompute, match="pads"):
        run_rule("Pad", [x, _i64(1, 1, 0, 2)])


@pytest.mark.parametrize("size, axes", [([4, 3], None), ([7, 8], None), ([2, 9], None),
                                        ([3], [-1]), ([5, 5], [0, 1])])
def test_center_crop_pad_rule(rng, size, axes):
    attrs = {} if axes is None else {"axes": axes}
    _check_rule("CenterCropPad", [_x(rng, 5, 6), _i64(*size)], attrs, const_inputs=(1,))


def test_constant_of_shape_and_range_rules():
    _check_rule("ConstantOfShape", [_i64(2, 3)], const_inputs=(0,))
    _check_rule("ConstantOfShape", [_i64(4)], {"value": np.array([1.5], np.float16)},
                const_inputs=(0,))
    _check_rule("ConstantOfShape", [_i64()], {"value": np.array([-3], np.int32)},
                const_inputs=(0,))
    _check_rule("ConstantOfShape", [_i64(2, 0)], {"value": np.array([True])}, const_inputs=(0,))
    for dtype, args in [(np.int64, (3, 20, 4)), (np.int32, (5, -7, -3)),
                        (np.float32, (0.5, 4.1, 0.3)), (np.float64, (1.0, -2.0, -0.25)),
                        (np.float16, (1000.0, 1100.0, 0.7)), (np.int16, (0, 0, 1))]:
        arrays = [np.array(v, dtype) for v in args]
        _check_rule("Range", arrays, const_inputs=(0, 1, 2))
    with pytest.raises(NoCompute, match="start"):
        run_rule("Range", [np.int64(0), np.int64(5), np.int64(1)], const_inputs=(1, 2))


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, 9])
def test_trilu_rule(rng, upper, k):
    x = _x(rng, 2, 4, 5, dtype=np.int64)
    if k is None:
        _check_rule("Trilu", [x], {"upper": upper})
        return
    _check_rule("Trilu", [x, np.int64(k)], {"upper": upper}, const_inputs=(1,))
    _check_rule("Trilu", [x, np.int64(k)], {"upper": upper})  # a run-time k


@pytest.mark.parametrize("k", [0, 1, -2, 7])
def test_eye_like_rule(rng, k):
    _check_rule("EyeLike", [_x(rng, 3, 5)], {"k": k})
    _check_rule("EyeLike", [_x(rng, 4, 2)], {"k": k, "dtype": T.int32})
    _check_rule("EyeLike", [_x(rng, 3, 3, dtype=np.int64)], {"k": k, "dtype": T.bool_})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("b", [2, 3])
def test_depth_space_rules(rng, mode, b):
    _check_rule("DepthToSpace", [_x(rng, 2, 2 * b * b, 3, 2)], {"blocksize": b, "mode": mode})
    _check_rule("SpaceToDepth", [_x(rng, 2, 3, 2 * b, 3 * b)], {"blocksize": b, "mode": mode})


def test_shape_and_size_rules(rng):
    x = _x(rng, 2, 3, 4, 5)
    for start, end in [(0, None), (1, 3), (-2, None), (0, -1), (3, 1), (-9, 9)]:
        _check_rule("Shape", [x], {"start": start, "end": end})
    _check_rule("Shape", [np.float32(1.0)])
    _check_rule("Size", [x])
    _check_rule("Size", [np.float32(1.0)])


def test_rules_on_symbolic_batch(rng):
    n = 5
    _check_rule_symbolic("Reshape", [_x(rng, n, 3, 4), _i64(0, 12)], [("N", 3, 4), None], {"N": n},
                         const_inputs=(1,))
    _check_rule_symbolic("Reshape", [_x(rng, n, 3, 4), _i64(-1, 4)], [("N", 3, 4), None], {"N": n},
                         const_inputs=(1,))
    _check_rule_symbolic("Flatten", [_x(rng, n, 3, 4)], [("N", 3, 4)], {"N": n})
    _check_rule_symbolic("Transpose", [_x(rng, n, 3, 4)], [("N", 3, 4)], {"N": n},
                         {"perm": [2, 0, 1]})
    _check_rule_symbolic("Concat", [_x(rng, n, 2), _x(rng, n, 3)], [("N", 2), ("N", 3)], {"N": n},
                         {"axis": 1})
    _check_rule_symbolic("Concat", [_x(rng, n, 2), _x(rng, 3, 2)], [("N", 2), None],
                         {"N": n, "(N+3)": n + 3}, {"axis": 0})
    _check_rule_symbolic("Slice", [_x(rng, n, 6), _i64(-2), _i64(_BIG), _i64(0)],
                         [("N", 6), None, None, None], {"N": n}, const_inputs=(1, 2, 3))
    _check_rule_symbolic("Slice", [_x(rng, n, 6), _i64(1, -1), _i64(_BIG, -_BIG), _i64(0, 1),
                                   _i64(1, -2)],
                         [("N", 6), None, None, None, None], {"N": n, "(N+-1)": n - 1},
                         const_inputs=(1, 2, 3, 4))
    _check_rule_symbolic("Pad", [_x(rng, n, 4), _i64(0, 2, 0, 1)], [("N", 4), None], {"N": n},
                         {"mode": "reflect"}, const_inputs=(1,))
    _check_rule_symbolic("Shape", [_x(rng, n, 3)], [("N", 3)], {"N": n})
    _check_rule_symbolic("Size", [_x(rng, n, 3)], [("N", 3)], {"N": n})
    _check_rule_symbolic("Expand", [_x(rng, n, 1), _i64(1, 4)], [("N", 1), None], {"N": n},
                         const_inputs=(1,))
    _check_rule_symbolic("CenterCropPad", [_x(rng, n, 4), _i64(4, 3)], [("N", 4), None], {"N": n},
                         const_inputs=(1,))
    _check_rule_symbolic("Trilu", [_x(rng, n, 4, 4)], [("N", 4, 4)], {"N": n})


def test_run_time_shapes_without_a_size_are_no_compute():
    g_types = [T.TensorType(T.float32, (2, 3, 4)), T.TensorType(T.int64, (2,))]
    values = [Value("in0", g_types[0]), Value("in1", g_types[1])]
    types, _, full = infer_node("Reshape", values, {}, 1, "r")
    tensors = [placeholder(v.name, v.type.dtype, v.type.shape) for v in values]
    with pytest.raises(NoCompute, match="run time"):
        apply_rule("Reshape", tensors, full, types)
    values = [Value("in0", T.TensorType(T.int64, (2,)))]
    types, _, full = infer_node("ConstantOfShape", values, {}, 1, "c")
    with pytest.raises(NoCompute, match="run time"):
        apply_rule("ConstantOfShape", [placeholder("in0", T.int64, (2,))], full, types)
