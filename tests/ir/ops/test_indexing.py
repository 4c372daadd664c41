"""Indexing ops: references against onnxruntime (single-node models) and naive loops, symbolic
inference (shape arithmetic, data-dependent sizes), old-opset importers and error cases."""

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import dnnc
from dnnc.errors import IndexRangeError, ShapeError
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.registry import SymDim, from_dims, get_op

RNG = np.random.default_rng(20240611)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _ints(lo, hi, shape, dtype=np.int64):
    return RNG.integers(lo, hi, shape).astype(dtype)


def _distinct(n, shape, dtype=np.int64):
    """Distinct indices in [-n, n) (negatives included), one row per leading position."""
    rows = [RNG.permutation(n)[:shape[-1]] for _ in range(int(np.prod(shape[:-1])))]
    idx = np.array(rows).reshape(shape)
    return np.where(RNG.random(shape) < 0.5, idx - n, idx).astype(dtype)


def _single_node_model(op_type, inputs, attrs, num_outputs, opset, consts=()):
    names = [f"in{i}" for i in range(len(inputs))]
    outs = [f"out{i}" for i in range(num_outputs)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype),
                                                  x.shape)
                    for i, (n, x) in enumerate(zip(names, inputs)) if i not in consts]
    inits = [numpy_helper.from_array(x, n) for i, (n, x) in enumerate(zip(names, inputs))
             if i in consts]
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _run_both(op_type, inputs, attrs=None, num_outputs=1, opset=21, consts=()):
    model = _single_node_model(op_type, inputs, attrs or {}, num_outputs, opset, consts)
    feeds = {f"in{i}": x for i, x in enumerate(inputs) if i not in consts}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = dnnc.compile(model, target="numpy").run(*[x for i, x in enumerate(inputs)
                                                    if i not in consts])
    return got, want


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# -- against onnxruntime ---------------------------------------------------------------------------

CASES = [
    # (op, inputs, attrs, outputs, opset, constant inputs)
    ("Gather", lambda: [_f32(3, 4, 5), _ints(-4, 4, (2, 3))], {"axis": 1}, 1, 13, ()),
    ("Gather", lambda: [_ints(0, 100, (5, 2), np.int32), np.array(-2, np.int32)], {}, 1, 13, ()),
    ("Gather", lambda: [_f32(6), _ints(0, 6, (4,))], {}, 1, 7, ()),
    ("GatherElements", lambda: [_f32(3, 4), _ints(-4, 4, (3, 6))], {"axis": -1}, 1, 13, ()),
    ("GatherElements", lambda: [_f32(3, 4, 2), _ints(-3, 3, (5, 4, 2))], {"axis": 0}, 1, 11, ()),
    ("GatherND", lambda: [_f32(2, 3, 4), _ints(-2, 2, (5, 2))], {}, 1, 13, ()),
    ("GatherND", lambda: [_f32(2, 3, 4, 5), _ints(0, 3, (2, 6, 2))], {"batch_dims": 1}, 1, 13,
     ()),
    ("GatherND", lambda: [_ints(0, 9, (2, 3, 4), np.int32), _ints(0, 3, (2, 4, 1))],
     {"batch_dims": 1}, 1, 12, ()),
    ("ScatterElements", lambda: [_f32(4, 5), _distinct(5, (4, 3)), _f32(4, 3)], {"axis": 1},
     1, 13, ()),
    ("Scatter", lambda: [_f32(4, 5), _distinct(4, (5, 3)).T.copy(), _f32(3, 5)], {"axis": 0},
     1, 10, ()),
    ("ScatterND", lambda: [_f32(4, 3, 2), np.array([[0], [-1], [2]]), _f32(3, 3, 2)], {}, 1,
     13, ()),
    ("ScatterND", lambda: [_f32(4, 3), _distinct(4, (5, 2)) % 3, _f32(5)], {}, 1, 11, ()),
    ("Compress", lambda: [_f32(3, 4), np.array([1, 0, 1, 1], bool)], {"axis": 1}, 1, 11, ()),
    ("Compress", lambda: [_f32(3, 2), RNG.random(5) < 0.5], {}, 1, 11, ()),
    ("NonZero", lambda: [_ints(0, 2, (3, 4, 2), np.int32)], {}, 1, 13, ()),
    ("NonZero", lambda: [(RNG.random((7,)) < 0.4)], {}, 1, 13, ()),
    ("TopK", lambda: [_f32(3, 7), np.array([3], np.int64)], {"axis": 1}, 2, 11, ()),
    ("TopK", lambda: [_f32(6, 4), np.array([2], np.int64)], {"axis": 0, "largest": 0}, 2, 11,
     ()),
    ("TopK", lambda: [_f32(2, 5)], {"k": 4}, 2, 9, ()),
    ("ReverseSequence", lambda: [_f32(5, 3, 2), np.array([5, 1, 3], np.int64)], {}, 1, 10, ()),
    ("ReverseSequence", lambda: [_f32(3, 5), np.array([2, 5, 0], np.int64)],
     {"batch_axis": 0, "time_axis": 1}, 1, 10, ()),
    ("OneHot", lambda: [_ints(-6, 8, (3, 4)), np.array(6, np.int64),
                        np.array([-1.5, 2.5], np.float32)], {"axis": 1}, 1, 11, ()),
    ("OneHot", lambda: [_ints(-4, 4, (5, 2), np.int32), np.array([4], np.float32),
                        np.array([0, 7], np.float32)], {}, 1, 11, ()),
    ("Unique", lambda: [_ints(0, 5, (3, 4))], {}, 4, 11, ()),
    ("Unique", lambda: [_ints(0, 5, (10,))], {"sorted": 0}, 4, 11, ()),
    ("Unique", lambda: [_ints(0, 2, (4, 3)).astype(np.float32)], {"axis": 0}, 4, 11, ()),
    ("Unique", lambda: [_ints(0, 2, (2, 5)).astype(np.float32)], {"axis": -1, "sorted": 0},
     4, 11, ()),
    ("NonMaxSuppression", lambda: [np.concatenate([RNG.random((2, 12, 2)),
                                                   RNG.random((2, 12, 2)) + 0.3], 2)
                                   .astype(np.float32),
                                   RNG.random((2, 3, 12)).astype(np.float32),
                                   np.array([4], np.int64), np.array([0.2], np.float32),
                                   np.array([0.3], np.float32)], {}, 1, 11, ()),
    ("NonMaxSuppression", lambda: [np.concatenate([RNG.random((1, 9, 2)) + 0.5,
                                                   RNG.random((1, 9, 2)) * 0.8 + 0.1], 2)
                                   .astype(np.float32),
                                   RNG.random((1, 2, 9)).astype(np.float32),
                                   np.array([9], np.int64), np.array([0.4], np.float32)],
     {"center_point_box": 1}, 1, 11, ()),
]


@pytest.mark.parametrize("op, make, attrs, outputs, opset, consts", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_onnxruntime(op, make, attrs, outputs, opset, consts):
    got, want = _run_both(op, make(), attrs, outputs, opset, consts)
    _assert_same(got, want)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scatter_reductions_match_onnxruntime(reduction, dtype):
    data = _ints(-5, 6, (4, 5)).astype(dtype)
    indices = _ints(-4, 4, (6, 5))  # duplicates: every reduction has to accumulate them
    updates = _ints(-5, 6, (6, 5)).astype(dtype)
    got, want = _run_both("ScatterElements", [data, indices, updates],
                          {"axis": 0, "reduction": reduction}, opset=18)
    _assert_same(got, want)
    nd_indices = _ints(-4, 4, (7, 1))
    nd_updates = _ints(-5, 6, (7, 5)).astype(dtype)
    got, want = _run_both("ScatterND", [data, nd_indices, nd_updates],
                          {"reduction": reduction}, opset=18)
    _assert_same(got, want)


# -- against naive loops ---------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("dtype", [np.int32, np.uint64, np.float32, np.float16])
def test_topk_breaks_ties_by_lower_index(largest, dtype):
    x = _ints(0, 4, (3, 9)).astype(dtype)  # few distinct values: many ties
    values, indices = get_op("TopK").evaluate(x, np.array([5]), axis=-1, largest=largest,
                                              sorted=1)
    for row in range(3):
        sign = -1 if largest else 1
        order = sorted(range(9), key=lambda j: (sign * float(x[row, j]), j))[:5]
        assert indices[row].tolist() == order
        assert values[row].tolist() == x[row, order].tolist()
    assert values.dtype == dtype and indices.dtype == np.int64


def test_scatter_nd_slices_and_gather_nd_loop():
    data, idx = _f32(3, 4, 5), _ints(-3, 3, (2, 2, 1))
    got = get_op("GatherND").evaluate(data, idx, batch_dims=0)
    for i, j in itertools.product(range(2), range(2)):
        np.testing.assert_array_equal(got[i, j], data[idx[i, j, 0]])
    updates = _f32(2, 2, 4, 5)
    out = get_op("ScatterND").evaluate(data, idx, updates, reduction="add")
    want = data.copy()
    for i, j in itertools.product(range(2), range(2)):
        want[idx[i, j, 0]] += updates[i, j]
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_unique_unsorted_keeps_first_occurrence_order():
    x = np.array([[3, 1], [1, 7], [3, 0]], np.int8)
    y, first, inverse, counts = get_op("Unique").evaluate(x, axis=None, sorted=0)
    assert y.tolist() == [3, 1, 7, 0] and y.dtype == np.int8
    assert first.tolist() == [0, 1, 3, 5]
    assert inverse.tolist() == [0, 1, 1, 2, 0, 3]
    assert counts.tolist() == [2, 2, 1, 1]


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_each_batch_at_its_index(mode):
    cache, update = _f32(2, 3, 6, 4), _f32(2, 3, 3, 4)
    starts = np.array([1, 5 if mode == "circular" else 3], np.int64)
    out = get_op("TensorScatter").evaluate(cache, update, starts, axis=-2, mode=mode)
    want = cache.copy()
    for b, h, s in itertools.product(range(2), range(3), range(3)):
        want[b, h, (starts[b] + s) % 6] = update[b, h, s]
    np.testing.assert_array_equal(out, want)


def test_scatter_keeps_bfloat16():
    data = _f32(3, 4).astype(T.bfloat16.np)
    updates = _f32(2, 4).astype(T.bfloat16.np)
    out = get_op("ScatterElements").evaluate(data, np.array([[0, 1, 2, 0], [0, 1, 2, 0]]),
                                             updates, axis=0, reduction="add")
    assert out.dtype == T.bfloat16.np
    want = data.astype(np.float32)
    want[0, [0, 3]] += updates[0, [0, 3]].astype(np.float32) + updates[1, [0, 3]]
    np.testing.assert_allclose(out[0].astype(np.float32), want[0], rtol=2e-2)


# -- inference: symbolic dims, shape arithmetic, data-dependent sizes ------------------------------


def test_gather_keeps_symbolic_dims():
    g = Graph()
    x = g.add_input("x", T.TensorType(T.float32, ("N", 5, "S")))
    i = g.add_input("i", T.TensorType(T.int64, ("K", 2)))
    assert g.add("Gather", x, i, axis=1).type.shape == ("N", "K", 2, "S")
    assert g.add("GatherElements", x, g.add_input("j", T.TensorType(T.int32, ("N", 2, "S"))),
                 axis=1).type.shape == ("N", 2, "S")
    nd = g.add_input("nd", T.TensorType(T.int64, ("N", 7, 1)))
    assert g.add("GatherND", x, nd, batch_dims=1).type.shape == ("N", 7, "S")


def test_gather_follows_symbolic_shape_values():
    """Shape -> Gather(scalar) -> ... as PyTorch exports a dynamic batch."""
    g = Graph()
    shape = Value("shape", T.TensorType(T.int64, (3,)))
    shape.known = from_dims(["N", 3, "S"])
    g.inputs.append(shape)
    first = g.add("Gather", shape, Value("i", T.TensorType(T.int64, ()),
                                         const=np.array(0, np.int64)))
    assert first.type.shape == () and first.known.item() == SymDim("N")
    last_two = g.add("Gather", shape, Value("j", T.TensorType(T.int64, (2,)),
                                            const=np.array([-2, -1], np.int64)))
    assert list(last_two.known) == [3, SymDim("S")]
    nd = g.add("GatherND", shape, Value("k", T.TensorType(T.int64, (1, 1)),
                                        const=np.array([[2]], np.int64)))
    assert list(nd.known) == [SymDim("S")]


def test_data_dependent_sizes_are_fresh_symbols():
    g = Graph()
    x = g.add_input("x", T.TensorType(T.float32, ("N", 4)))
    nz = g.add("NonZero", x)
    assert nz.type.shape[0] == 2 and isinstance(nz.type.shape[1], str)
    outs = g.add_node("Unique", [x], {}, num_outputs=4)
    n = outs[0].type.shape[0]
    assert isinstance(n, str) and n != "N"
    assert [o.type.shape for o in outs] == [(n,), (n,), ("4*N",), (n,)]
    cond = g.add_input("c", T.TensorType(T.bool_, (4,)))
    comp = g.add("Compress", x, cond, axis=1).type.shape
    assert comp[0] == "N" and isinstance(comp[1], str)
    const_cond = Value("cc", T.TensorType(T.bool_, (4,)),
                       const=np.array([True, False, True, True]))
    assert g.add("Compress", x, const_cond, axis=1).type.shape == ("N", 3)
    k = g.add_input("k", T.TensorType(T.int64, (1,)))
    values, indices = g.add_node("TopK", [x, k], {"axis": 1}, num_outputs=2)
    assert values.type.shape[0] == "N" and isinstance(values.type.shape[1], str)
    const_k = Value("ck", T.TensorType(T.int64, (1,)), const=np.array([2], np.int64))
    values, indices = g.add_node("TopK", [x, const_k], {"axis": 1}, num_outputs=2)
    assert values.type == T.TensorType(T.float32, ("N", 2)) and indices.type.dtype is T.int64


def test_interpreter_binds_data_dependent_dims():
    g = Graph()
    x = g.add_input("x", T.TensorType(T.int32, ("N",)))
    outs = g.add_node("Unique", [x], {"sorted": 0}, num_outputs=4)
    g.outputs = [outs[0], g.add("NonZero", x)]
    y, nz = run_graph(g, [np.array([4, 0, 4, 2, 0], np.int32)])
    assert y.tolist() == [4, 0, 2] and nz.tolist() == [[0, 2, 3]]


def test_importers_translate_old_opsets():
    x = _f32(3, 6)
    model = _single_node_model("TopK", [x], {"k": 2, "axis": 0}, 2, opset=1)
    values, indices = dnnc.compile(model, target="numpy").run(x)
    np.testing.assert_array_equal(indices, np.argsort(-x, axis=0, kind="stable")[:2])
    model = _single_node_model("Scatter", [x, np.array([[1, 0, 5]]), _f32(1, 3)], {"axis": 1},
                               1, opset=9)
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes] == ["ScatterElements"]


# -- errors ---------------------------------------------------------------------------------------


def _graph_with(*types):
    g = Graph()
    return g, [g.add_input(f"x{i}", t) for i, t in enumerate(types)]


@pytest.mark.parametrize("op, types, attrs, message", [
    ("Gather", [T.TensorType(T.float32, (3, 4)), T.TensorType(T.int64, (2,))], {"axis": 2},
     "out of range"),
    ("Gather", [T.TensorType(T.float32, (3, 4)), T.TensorType(T.float32, (2,))], {},
     "indices"),
    ("GatherElements", [T.TensorType(T.float32, (3, 4)), T.TensorType(T.int64, (2,))], {},
     "same rank"),
    ("GatherND", [T.TensorType(T.float32, (3, 4)), T.TensorType(T.int64, (3, 2))],
     {"batch_dims": 1}, "do not fit"),
    ("ScatterElements", [T.TensorType(T.float32, (3,)), T.TensorType(T.int64, (2,)),
                         T.TensorType(T.float32, (2,))], {"reduction": "mean"}, "reduction"),
    ("ScatterND", [T.TensorType(T.float32, (3, 4)), T.TensorType(T.int64, (2, 1)),
                   T.TensorType(T.float32, (2, 3))], {}, "updates must have shape"),
    ("Compress", [T.TensorType(T.float32, (3, 4)), T.TensorType(T.bool_, (2, 2))], {},
     "1-D"),
    ("ReverseSequence", [T.TensorType(T.float32, (3, 4)), T.TensorType(T.int64, (4,))],
     {"batch_axis": 0, "time_axis": 0}, "batch_axis"),
    ("NonMaxSuppression", [T.TensorType(T.float32, (1, 3, 5)),
                           T.TensorType(T.float32, (1, 1, 3))], {}, "boxes must be"),
])
def test_bad_inputs_are_shape_errors(op, types, attrs, message):
    g, xs = _graph_with(*types)
    with pytest.raises(ShapeError, match=message):
        g.add(op, *xs, **attrs)


def test_topk_k_larger_than_axis_is_an_error():
    g, (x,) = _graph_with(T.TensorType(T.float32, (3, 4)))
    k = Value("k", T.TensorType(T.int64, (1,)), const=np.array([5], np.int64))
    with pytest.raises(ShapeError, match="out of range"):
        g.add_node("TopK", [x, k], {}, num_outputs=2)


def test_out_of_range_gather_index_fails_in_the_reference():
    with pytest.raises(IndexError):
        get_op("Gather").evaluate(np.arange(3.0), np.array([3]), axis=0)


@pytest.mark.parametrize("op, args, attrs, index, bound", [
    ("Gather", (np.arange(3.0), np.array([0, -4])), {"axis": 0}, -4, 3),
    ("Gather", (np.zeros((2, 5)), np.array([[1, 2**62]])), {"axis": 1}, 2**62, 5),
    ("Gather", (np.zeros((2, 5)), np.array(7)), {"axis": 1}, 7, 5),   # a 0-d index
    ("GatherElements", (np.zeros((2, 3)), np.array([[0, 1, 2], [2, 3, 0]])), {"axis": 1}, 3, 3),
    ("GatherND", (np.zeros((2, 3)), np.array([[1, 2], [1, -10**6]])), {"batch_dims": 0},
     -10**6, 3),
    ("ScatterElements", (np.zeros(3), np.array([3]), np.ones(1)),
     {"axis": 0, "reduction": "none"}, 3, 3),
    ("ScatterND", (np.zeros((4, 2)), np.array([[4]]), np.ones((1, 2))), {"reduction": "none"},
     4, 4),
])
def test_out_of_range_indices_name_the_index_and_the_bound(op, args, attrs, index, bound):
    """Issue 30: the references refuse an index outside [-n, n - 1] with its value and n (the
    interpreter turns that into an InputError naming the node); none wraps or clamps it."""
    with pytest.raises(IndexRangeError, match=f"index {index} .* size {bound}") as info:
        get_op(op).evaluate(*args, **attrs)
    assert (info.value.index, info.value.bound) == (index, bound)


def test_one_hot_keeps_out_of_range_indices_as_all_off_rows():
    out = get_op("OneHot").evaluate(np.array([1, 5]), np.array([3]), np.array([0.0, 1.0]),
                                    axis=-1)
    np.testing.assert_array_equal(out, [[0, 1, 0], [0, 0, 0]])



# -- compute rules: each rule (interpreted) against the reference --------------------------------

from dnnc.ir.compute import NoCompute, apply_rule, evaluate, placeholder, run_rule  # noqa: E402
from dnnc.ir.ops.registry import infer_node  # noqa: E402


def _check_rule(op, arrays, attrs=None, const_inputs=(), num_outputs=None):
    arrays = [None if a is None else np.asarray(a) for a in arrays]
    want = get_op(op).run(arrays, {**get_op(op).attrs, **(attrs or {})})
    got = run_rule(op, arrays, attrs, const_inputs=const_inputs, num_outputs=num_outputs)
    _same(got, want)


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_array_equal(g, w)  # data movement: exact


def _data(rng, *shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _indices(rng, n, shape, dtype=np.int64):
    """Random indices in [-n, n): negatives wrap."""
    return rng.integers(-n, n, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_rule(rng, dtype, axis, index_dtype):
    x = _data(rng, 4, 5, 6, dtype=dtype)
    n = x.shape[axis]
    _check_rule("Gather", [x, _indices(rng, n, (2, 3), index_dtype)], {"axis": axis})
    _check_rule("Gather", [x, _indices(rng, n, (), index_dtype)], {"axis": axis})
    for k in (-1, 2):  # a constant index: no load of it
        _check_rule("Gather", [x, np.array(k, index_dtype)], {"axis": axis}, const_inputs=(1,))
        _check_rule("Gather", [x, np.array([k], index_dtype)], {"axis": axis},
                    const_inputs=(1,))
    _check_rule("Gather", [x, _indices(rng, n, (7,), index_dtype)], {"axis": axis},
                const_inputs=(1,))


def test_gather_rule_clamps_bad_indices_instead_of_reading_outside(rng):
    x = _data(rng, 4, 3)
    got = run_rule("Gather", [x, np.array([9, -9], np.int64)])[0]
    np.testing.assert_array_equal(got, x[[3, 0]])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_rule(rng, axis):
    x = _data(rng, 4, 5, 3, dtype=np.int32)
    shape = [4, 5, 3]
    shape[axis] = 6
    _check_rule("GatherElements", [x, _indices(rng, x.shape[axis], tuple(shape), np.int32)],
                {"axis": axis})


@pytest.mark.parametrize("data, idx, batch_dims", [
    ((4, 5, 6), (3, 2), 0), ((4, 5, 6), (2, 3, 1), 0), ((4, 5, 6), (2, 3), 0),
    ((3, 5, 6), (3, 2, 1), 1), ((3, 4, 5, 6), (3, 4, 2), 2), ((3, 5, 6), (3, 2), 1)])
def test_gather_nd_rule(rng, data, idx, batch_dims):
    x = _data(rng, *data)
    k = idx[-1]
    dims = data[batch_dims:batch_dims + k]
    cols = [_indices(rng, d, idx[:-1] + (1,)) for d in dims]
    _check_rule("GatherND", [x, np.concatenate(cols, axis=-1)], {"batch_dims": batch_dims})


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.float32])
def test_one_hot_rule(rng, axis, index_dtype):
    idx = _indices(rng, 5, (3, 4)).astype(index_dtype)
    values = np.array([-1.5, 2.0], np.float32)
    _check_rule("OneHot", [idx, np.int64(5), values], {"axis": axis}, const_inputs=(1,))
    _check_rule("OneHot", [idx, np.array([5.0], np.float32), np.array([0, 1], np.int64)],
                {"axis": axis}, const_inputs=(1,))


@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence_rule(rng, batch_axis, time_axis):
    x = _data(rng, 4, 3, 2) if batch_axis == 1 else _data(rng, 3, 4, 2)
    lens = np.array([4, 1, 0], np.int64)
    _check_rule("ReverseSequence", [x, lens], {"batch_axis": batch_axis,
                                               "time_axis": time_axis})
    _check_rule("ReverseSequence", [x, lens.astype(np.int32)[[2, 0, 1]]],
                {"batch_axis": batch_axis, "time_axis": time_axis})


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("condition", [[1, 0, 1, 1, 0], [0, 1, 0, 1, 0], [0, 0, 1, 0, 0],
                                       [0, 0, 0, 0, 0], [1, 1, 0]])
def test_compress_rule(rng, axis, condition):
    x = _data(rng, 5, 5, dtype=np.int64)
    _check_rule("Compress", [x, np.array(condition, bool)], {"axis": axis}, const_inputs=(1,))


def test_compress_rule_needs_a_known_condition(rng):
    with pytest.raises(NoCompute, match="condition"):
        run_rule("Compress", [_data(rng, 5, 2), np.ones(5, bool)], {"axis": 0})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_rule(rng, mode):
    cache, update = _data(rng, 3, 2, 6, 4), _data(rng, 3, 2, 2, 4)
    starts = np.array([0, 4, 2] if mode == "linear" else [5, 4, 1], np.int64)
    attrs = {"mode": mode, "axis": -2}
    _check_rule("TensorScatter", [cache, update, starts], attrs)
    _check_rule("TensorScatter", [cache, update], attrs)
    _check_rule("TensorScatter", [cache[:, :, :3], update[:, :, :2, :].copy()],
                {"mode": mode, "axis": 2})
    if mode == "circular":  # a run longer than the cache: its last lap is what remains
        _check_rule("TensorScatter", [cache[:, :, :3], _data(rng, 3, 2, 5, 4), starts], attrs)


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_index_copy_rule_and_reference(rng, axis):
    """IndexCopy: data with the updates at the index's positions along `axis` (negative ones
    wrap, the last of repeated ones wins), as torch's index_copy / index_put; the rule as the
    reference for a short index (a Select per position), a long one and one of a symbolic
    length (both through each position's last writer)."""
    from dnnc.ir.ops.indexing import INDEX_COPY_MOST

    data = _data(rng, 3, 4, 6)
    index = np.array([data.shape[axis] - 2, -1, 0], np.int64)
    shape = list(data.shape)
    shape[axis] = len(index)
    updates = _data(rng, *shape)
    want = data.copy()
    np.moveaxis(want, axis, 0)[index % data.shape[axis]] = np.moveaxis(updates, axis, 0)
    _same(get_op("IndexCopy").run([data, index, updates], {"axis": axis}), [want])
    _check_rule("IndexCopy", [data, index, updates], {"axis": axis})
    size = data.shape[axis]
    long = _indices(rng, size, (INDEX_COPY_MOST + 5,))   # (repeats: the last one wins)
    shape[axis] = len(long)
    updates = _data(rng, *shape)
    _check_rule("IndexCopy", [data, long, updates], {"axis": axis})
    values = [Value("d", T.TensorType(T.float32, data.shape)),
              Value("i", T.TensorType(T.int64, ("S",))),
              Value("u", T.TensorType(T.float32, tuple("S" if k == axis % 3 else d
                                                       for k, d in enumerate(data.shape))))]
    types, _, full = infer_node("IndexCopy", values, {"axis": axis}, 1, "c")
    outs = apply_rule("IndexCopy", [placeholder(v.name, v.type.dtype, v.type.shape)
                                    for v in values], full, types)
    for count in (1, 7, INDEX_COPY_MOST + 5):
        short, part = long[:count], np.take(updates, np.arange(count), axis=axis)
        got = evaluate(outs, {"d": data, "i": short, "u": part}, {"S": count})
        _same(got, get_op("IndexCopy").run([data, short, part], {"axis": axis}))


def test_rules_on_symbolic_batch(rng):
    n, s = 3, 4
    x, ids = _data(rng, 10, 8), _indices(rng, 10, (n, s))
    values = [Value("in0", T.TensorType(T.float32, (10, 8))),
              Value("in1", T.TensorType(T.int64, ("N", "S")))]
    types, _, full = infer_node("Gather", values, {}, 1, "g")
    outs = apply_rule("Gather", [placeholder(v.name, v.type.dtype, v.type.shape) for v in values],
                      full, types)
    got = evaluate(outs, {"in0": x, "in1": ids}, {"N": n, "S": s})
    _same(got, get_op("Gather").run([x, ids], {"axis": 0}))


@pytest.mark.parametrize("op, arrays, outputs", [
    ("ScatterElements", [_f32(3, 4), np.zeros((1, 4), np.int64), _f32(1, 4)], 1),
    ("ScatterND", [_f32(3, 4), np.zeros((1, 1), np.int64), _f32(1, 4)], 1),
    ("NonZero", [_f32(3, 4)], 1),
    ("TopK", [_f32(3, 4), np.array([2], np.int64)], 2),
    ("Unique", [_f32(6)], 4),
    ("NonMaxSuppression", [_f32(1, 3, 4), _f32(1, 1, 3)], 1)])
def test_ops_without_loop_form_are_no_compute(op, arrays, outputs):
    with pytest.raises(NoCompute):
        run_rule(op, arrays, num_outputs=outputs)
