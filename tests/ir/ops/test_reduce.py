"""Reductions, arg-extremes, scans and the softmax family: references against naive loops,
inference with symbolic dims, errors, the ONNX importers of every opset against onnxruntime,
and the compute rules against the references."""

import itertools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.frontend.onnx import ONNX_FROM_DTYPE
from dnnc.ir import types as T
from dnnc.ir.compute import NoCompute, apply_rule, evaluate, placeholder, run_rule
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.registry import get_op, infer_node

RNG = np.random.default_rng(20240611)


def _run(op, inputs, attrs=None, consts=(), num_outputs=1, verify=True):
    """Run one op through the interpreter (which checks dtype and shape against infer).

    Inputs whose index is in `consts` become constants (so infer can read them)."""
    g = Graph("t")
    values, feed = [], []
    for i, x in enumerate(inputs):
        if x is None:
            values.append(None)
        elif i in consts:
            values.append(Value(f"c{i}", T.TensorType(T.DType.from_numpy(x.dtype), x.shape),
                                const=x))
        else:
            values.append(g.add_input(f"x{i}", T.TensorType(T.DType.from_numpy(x.dtype),
                                                            x.shape)))
            feed.append(x)
    g.outputs = g.add_node(op, values, attrs or {}, num_outputs=num_outputs)
    if verify:  # (re-inference names run-time dims afresh, which verify reads as a change)
        g.verify()
    return run_graph(g, feed)


def _infer(op, types, attrs=None, consts=None, num_outputs=1):
    g = Graph("t")
    consts = consts or {}
    values = []
    for i, t in enumerate(types):
        if t is None:
            values.append(None)
        elif i in consts:
            values.append(Value(f"c{i}", t, const=consts[i]))
        else:
            values.append(g.add_input(f"x{i}", t))
    return [v.type for v in g.add_node(op, values, attrs or {}, num_outputs=num_outputs)]


def _random(shape, dtype):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(1, 5, size=shape).astype(dtype)
    return RNG.uniform(0.2, 2.0, size=shape).astype(dtype)


# -- Reduce* against a naive loop ----------------------------------------------------------------

NAIVE = {
    "ReduceSum": sum,
    "ReduceMean": lambda v: sum(v) / len(v),
    "ReduceMax": max,
    "ReduceMin": min,
    "ReduceProd": math.prod,
    "ReduceL1": lambda v: sum(abs(a) for a in v),
    "ReduceL2": lambda v: math.sqrt(sum(a * a for a in v)),
    "ReduceLogSum": lambda v: math.log(sum(v)),
    "ReduceLogSumExp": lambda v: math.log(sum(math.exp(a) for a in v)),
    "ReduceSumSquare": lambda v: sum(a * a for a in v),
}


def _naive_reduce(fn, x, axes, keepdims):
    axes = sorted(a % x.ndim for a in axes) if axes else list(range(x.ndim))
    kept = [i for i in range(x.ndim) if i not in axes]
    out_shape = [1 if i in axes else x.shape[i] for i in range(x.ndim)] if keepdims \
        else [x.shape[i] for i in kept]
    out = np.empty([x.shape[i] for i in kept])
    for idx in itertools.product(*(range(x.shape[i]) for i in kept)):
        vals = []
        for red in itertools.product(*(range(x.shape[i]) for i in axes)):
            full = [0] * x.ndim
            for i, k in zip(kept, idx):
                full[i] = k
            for i, k in zip(axes, red):
                full[i] = k
            vals.append(float(x[tuple(full)]))
        out[idx] = fn(vals)
    return out.reshape(out_shape)


@pytest.mark.parametrize("op", sorted(NAIVE))
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([1], 0), ([-1], 1), ([0, 2], 0),
                                           ([2, 0], 1)])
def test_reductions_match_naive_loop(op, axes, keepdims):
    x = _random((3, 4, 5), np.float32)
    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
    got, = _run(op, inputs, {"keepdims": keepdims}, consts={1})
    want = _naive_reduce(NAIVE[op], x, axes, keepdims)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("op", sorted(NAIVE))
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
def test_reductions_keep_dtype(op, dtype):
    if op in ("ReduceLogSum", "ReduceLogSumExp") and np.dtype(dtype).kind in "iu":
        pytest.skip("log reductions of integers are undefined past opset 18")
    x = _random((4, 6), dtype)
    got, = _run(op, [x, np.array([1], np.int64)], {"keepdims": 0}, consts={1})
    assert got.dtype == x.dtype and got.shape == (4,)
    want = _naive_reduce(NAIVE[op], x, [1], 0)
    if np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal(got, np.trunc(want).astype(dtype))
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == np.float16 else 1e-12)


def test_bool_max_min():
    x = RNG.random((3, 4)) > 0.5
    x[0] = False
    got_max, = _run("ReduceMax", [x, np.array([1], np.int64)], {"keepdims": 0}, consts={1})
    got_min, = _run("ReduceMin", [x, np.array([1], np.int64)], {"keepdims": 0}, consts={1})
    np.testing.assert_array_equal(got_max, [any(r) for r in x])
    np.testing.assert_array_equal(got_min, [all(r) for r in x])


IDENTITY = {"ReduceSum": 0, "ReduceMean": np.nan, "ReduceProd": 1, "ReduceMax": -np.inf,
            "ReduceMin": np.inf, "ReduceL1": 0, "ReduceL2": 0, "ReduceLogSum": -np.inf,
            "ReduceLogSumExp": -np.inf, "ReduceSumSquare": 0}


@pytest.mark.parametrize("op", sorted(IDENTITY))
def test_empty_set_gives_identity(op):
    x = np.zeros((2, 0, 4), np.float32)
    got, = _run(op, [x, np.array([1], np.int64)], {"keepdims": 1}, consts={1})
    assert got.shape == (2, 1, 4)
    np.testing.assert_array_equal(got, np.full((2, 1, 4), IDENTITY[op], np.float32))


def test_empty_set_of_integers_gives_type_bounds():
    x = np.zeros((0, 3), np.int32)
    lo, = _run("ReduceMax", [x, np.array([0], np.int64)], {"keepdims": 0}, consts={1})
    hi, = _run("ReduceMin", [x, np.array([0], np.int64)], {"keepdims": 0}, consts={1})
    assert lo.tolist() == [np.iinfo(np.int32).min] * 3
    assert hi.tolist() == [np.iinfo(np.int32).max] * 3


def test_empty_axes_reduce_all_or_noop():
    x = _random((2, 3), np.float32)
    empty = np.zeros(0, np.int64)
    everything, = _run("ReduceSum", [x, empty], {"keepdims": 0}, consts={1})
    np.testing.assert_allclose(everything, x.astype(np.float64).sum(), rtol=1e-6)
    same, = _run("ReduceSum", [x, empty], {"noop_with_empty_axes": 1}, consts={1})
    np.testing.assert_array_equal(same, x)
    same, = _run("ReduceMax", [x], {"noop_with_empty_axes": 1})
    np.testing.assert_array_equal(same, x)


def test_runtime_axes_input():
    x = _random((2, 3, 4), np.float32)
    got, = _run("ReduceMean", [x, np.array([0, 2], np.int64)], {"keepdims": 0}, verify=False)
    np.testing.assert_allclose(got, _naive_reduce(NAIVE["ReduceMean"], x, [0, 2], 0),
                               rtol=1e-6)


# -- inference ---------------------------------------------------------------------------------

F = T.TensorType


def test_reduce_infer_keeps_symbolic_dims():
    x = F(T.float32, ("N", 3, "S"))
    axes = {1: np.array([1], np.int64)}
    assert _infer("ReduceSum", [x, F(T.int64, (1,))], {"keepdims": 0}, axes) == \
        [F(T.float32, ("N", "S"))]
    assert _infer("ReduceMax", [x, F(T.int64, (1,))], {}, {1: np.array([-1], np.int64)}) == \
        [F(T.float32, ("N", 3, 1))]
    assert _infer("ReduceL2", [x], {"keepdims": 0}) == [F(T.float32, ())]
    assert _infer("ReduceL2", [x], {"noop_with_empty_axes": 1}) == [x]


def test_reduce_infer_with_runtime_axes():
    x = F(T.float32, ("N", 1, 5))
    kept, = _infer("ReduceSum", [x, F(T.int64, (2,))])
    assert kept.rank == 3 and kept.shape[1] == 1 and all(isinstance(d, str) for d in
                                                         (kept.shape[0], kept.shape[2]))
    dropped, = _infer("ReduceSum", [x, F(T.int64, (2,))], {"keepdims": 0})
    assert dropped.rank == 1
    with pytest.raises(ShapeError, match="length is unknown"):
        _infer("ReduceSum", [x, F(T.int64, ("K",))], {"keepdims": 0})


def test_reduce_shape_arith_follows_symbols():
    g = Graph("t")
    x = g.add_input("x", F(T.float32, ("N", 3, 4)))
    shape = g.add("Shape", x) if _has_op("Shape") else None
    if shape is None:
        pytest.skip("Shape is not registered yet")
    numel = g.add("ReduceProd", shape, keepdims=0)
    assert g.nodes[-1].outputs[0].known is not None
    assert numel.known.reshape(-1)[0].dim == "12*N"


def _has_op(name):
    from dnnc.ir.ops.registry import is_registered

    return is_registered(name)


@pytest.mark.parametrize("op,types,attrs,consts,match", [
    ("ReduceSum", [F(T.float32, (2, 3)), F(T.int64, (1,))], {}, {1: np.array([2])}, "axis 2"),
    ("ReduceSum", [F(T.float32, (2, 3)), F(T.int64, (2,))], {}, {1: np.array([1, -1])},
     "twice"),
    ("ReduceSum", [F(T.bool_, (2, 3))], {}, None, "must be one of"),
    ("ReduceMean", [F(T.float32, (2, 3)), F(T.int32, (1,))], {}, None, "axes"),
    ("ArgMax", [F(T.float32, (2, 3))], {"axis": 2}, None, "axis 2"),
    ("CumSum", [F(T.float32, (2, 3)), F(T.int64, (2,))], {}, None, "scalar"),
    ("CumSum", [F(T.float32, (2, 3)), F(T.int64, ())], {}, {1: np.array(-3)}, "axis -3"),
    ("Softmax", [F(T.int32, (2, 3))], {}, None, "must be one of"),
    ("Hardmax", [F(T.float32, (2, 3))], {"axis": 3}, None, "axis 3"),
])
def test_errors(op, types, attrs, consts, match):
    consts = {k: v.astype(types[k].dtype.np) for k, v in (consts or {}).items()}
    with pytest.raises(ShapeError, match=match):
        _infer(op, types, attrs, consts)


# -- ArgMax / ArgMin -----------------------------------------------------------------------------


def _naive_arg(x, axis, keepdims, last, better):
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], np.int64)
    for idx in np.ndindex(*moved.shape[:-1]):
        row = moved[idx]
        best = 0
        for k in range(1, len(row)):
            if better(row[k], row[best]) or (last and row[k] == row[best]):
                best = k
        out[idx] = best
    return np.expand_dims(out, axis) if keepdims else out


@pytest.mark.parametrize("op,better", [("ArgMax", lambda a, b: a > b),
                                       ("ArgMin", lambda a, b: a < b)])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (1, 0, 1), (-1, 1, 1), (2, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_arg_extremes_with_ties(op, better, axis, keepdims, last, dtype):
    x = RNG.integers(0, 3, size=(3, 4, 5)).astype(dtype)  # small range: many ties
    got, = _run(op, [x], {"axis": axis, "keepdims": keepdims, "select_last_index": last})
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _naive_arg(x, axis % 3, keepdims, last, better))


def test_arg_infer_symbolic():
    assert _infer("ArgMin", [F(T.float32, ("N", 7, "S"))], {"axis": 1, "keepdims": 0}) == \
        [F(T.int64, ("N", "S"))]


# -- CumSum / CumProd ----------------------------------------------------------------------------


def _naive_scan(x, axis, exclusive, reverse, op, identity):
    moved = np.moveaxis(x, axis, -1).astype(np.float64)
    out = np.empty_like(moved)
    n = moved.shape[-1]
    for idx in np.ndindex(*moved.shape[:-1]):
        for k in range(n):
            span = range(k + 1, n) if reverse else range(k)
            if not exclusive:
                span = range(k, n) if reverse else range(k + 1)
            acc = identity
            for j in span:
                acc = op(acc, moved[idx + (j,)])
            out[idx + (k,)] = acc
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("op,fn,identity", [("CumSum", lambda a, b: a + b, 0),
                                            ("CumProd", lambda a, b: a * b, 1)])
@pytest.mark.parametrize("axis,exclusive,reverse", [(0, 0, 0), (1, 1, 0), (-1, 0, 1),
                                                    (1, 1, 1)])
@pytest.mark.parametrize("dtype,axis_dtype", [(np.float32, np.int64), (np.int32, np.int32),
                                              (np.float16, np.int64)])
def test_scans(op, fn, identity, axis, exclusive, reverse, dtype, axis_dtype):
    x = _random((3, 5), dtype)
    got, = _run(op, [x, np.array(axis, axis_dtype)], {"exclusive": exclusive,
                                                      "reverse": reverse})
    assert got.dtype == x.dtype and got.shape == x.shape
    want = _naive_scan(x, axis % 2, exclusive, reverse, fn, identity)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=3e-3 if dtype == np.float16
                               else 1e-6)


def test_scan_infer_symbolic_with_runtime_axis():
    assert _infer("CumSum", [F(T.float32, ("N", 4)), F(T.int32, ())]) == \
        [F(T.float32, ("N", 4))]


# -- Softmax, LogSoftmax, Hardmax -------------------------------------------------------------


def _naive_rows(x, first_axis, fn):
    """Apply fn to every row of x viewed as [prod(:first_axis), prod(first_axis:)]."""
    rows = x.astype(np.float64).reshape(int(np.prod(x.shape[:first_axis])), -1)
    return np.array([fn(list(r)) for r in rows]).reshape(x.shape)


def _softmax_row(v):
    e = [math.exp(a) for a in v]
    return [a / sum(e) for a in e]


def _log_softmax_row(v):
    total = sum(math.exp(a) for a in v)
    return [a - math.log(total) for a in v]


def _hardmax_row(v):
    best = v.index(max(v))
    return [1.0 if k == best else 0.0 for k in range(len(v))]


ROWS = {"Softmax": _softmax_row, "LogSoftmax": _log_softmax_row, "Hardmax": _hardmax_row}


@pytest.mark.parametrize("op", sorted(ROWS))
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("coerce_2d", [0, 1])
def test_softmax_family(op, axis, coerce_2d):
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    if op == "Hardmax":
        x[0, 0, :2] = 5.0  # a tie: the first maximum wins
    got, = _run(op, [x], {"axis": axis, "coerce_2d": coerce_2d})
    if coerce_2d:
        want = _naive_rows(x, axis % 3, ROWS[op])
    else:
        moved = np.moveaxis(x, axis, -1)
        want = np.moveaxis(_naive_rows(moved, 2, ROWS[op]), -1, axis)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_softmax_large_and_half():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1e4, 0.0, 3.0]], np.float32)
    got, = _run("Softmax", [x])
    np.testing.assert_allclose(got, _naive_rows(x - x.max(1, keepdims=True), 1, _softmax_row),
                               rtol=1e-6)
    h = RNG.normal(size=(4, 8)).astype(np.float16)
    got, = _run("LogSoftmax", [h])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, _naive_rows(h, 1, _log_softmax_row), rtol=2e-3, atol=2e-3)


# -- importers across opsets, against onnxruntime -------------------------------------------


def _ort_and_dnnc(node, inputs, opset, initializers=(), out_elem=None):
    """Run a one-node ONNX model with onnxruntime and with dnnc (numpy target)."""
    names = [n for n in node.input if n and n not in {t.name for t in initializers}]
    vi = [helper.make_tensor_value_info(n, ONNX_FROM_DTYPE[T.DType.from_numpy(a.dtype).name],
                                        a.shape) for n, a in zip(names, inputs)]
    outs = [helper.make_tensor_value_info(o, out_elem or vi[0].type.tensor_type.elem_type, None)
            for o in node.output]
    graph = helper.make_graph([node], "g", vi, outs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    feeds = dict(zip(names, inputs))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = dnnc.compile(model, "numpy").run(*inputs)
    return got, want


def _check_against_ort(node, inputs, opset, initializers=(), out_elem=None):
    got, want = _ort_and_dnnc(node, inputs, opset, initializers, out_elem)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", sorted(NAIVE))
@pytest.mark.parametrize("opset", [7, 11, 13, 18])
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([1], 0), ([-1, 0], 1)])
def test_reduce_importers(op, opset, axes, keepdims):
    x = _random((3, 4, 2), np.float32)
    if opset < 11 and axes and min(axes) < 0:
        axes = [a % 3 for a in axes]  # negative axes came with opset 11
    axes_as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    inits = []
    if axes is not None and axes_as_input:
        inits = [onnx.numpy_helper.from_array(np.array(axes, np.int64), "axes")]
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    elif axes is not None:
        node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims)
    else:
        node = helper.make_node(op, ["x"], ["y"], keepdims=keepdims)
    _check_against_ort(node, [x], opset, inits)


def test_reduce_noop_with_empty_axes_import():
    x = _random((3, 4), np.float32)
    node = helper.make_node("ReduceMean", ["x"], ["y"], noop_with_empty_axes=1)
    _check_against_ort(node, [x], 18)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset,attrs", [(7, {}), (11, {"axis": -1, "keepdims": 0}),
                                         (13, {"axis": 1, "select_last_index": 1})])
def test_arg_importers(op, opset, attrs):
    x = RNG.integers(0, 3, size=(3, 4, 2)).astype(np.float32)
    _check_against_ort(helper.make_node(op, ["x"], ["y"], **attrs), [x], opset,
                       out_elem=onnx.TensorProto.INT64)


@pytest.mark.parametrize("op", sorted(ROWS))
@pytest.mark.parametrize("opset", [7, 11, 13])
@pytest.mark.parametrize("attrs", [{}, {"axis": 0}, {"axis": 2}, {"axis": -2}])
def test_softmax_importers_keep_old_2d_coercion(op, opset, attrs):
    if opset < 11 and attrs.get("axis", 0) < 0:
        pytest.skip("negative axes came with opset 11")
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    _check_against_ort(helper.make_node(op, ["x"], ["y"], **attrs), [x], opset)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 1)])
def test_cumsum_importer(exclusive, reverse):
    x = _random((3, 4), np.float32)
    axis = onnx.numpy_helper.from_array(np.array(1, np.int32), "axis")
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive,
                            reverse=reverse)
    _check_against_ort(node, [x], 14, [axis])


# -- compute rules (loop IR, interpreted by NumPy) against the references ------------------------

REDUCE_OPS = sorted(NAIVE)


def _check_rule(op, arrays, attrs=None, consts=(), num_outputs=None, tol=1e-5):
    """The rule (through `run_rule`) against the op's reference on the same inputs."""
    attrs = attrs or {}
    want = get_op(op).run([None if a is None else np.asarray(a) for a in arrays],
                          {**get_op(op).attrs, **attrs})
    got = run_rule(op, arrays, attrs, const_inputs=consts, num_outputs=num_outputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (op, g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                       atol=tol, err_msg=op)
        else:
            np.testing.assert_array_equal(g, w, err_msg=op)


def _rule_with_batch_dim(op, arrays, attrs=None, consts=(), num_outputs=1):
    """Run the rule with axis 0 of input 0 a symbolic "N" (bound only when evaluating);
    returns the outputs' inferred types and values."""
    values = []
    for k, a in enumerate(arrays):
        shape = ("N",) + a.shape[1:] if k == 0 else a.shape
        values.append(Value(f"in{k}", T.TensorType(T.DType.from_numpy(a.dtype), shape),
                            const=a if k in consts else None))
    types, _, full = infer_node(op, values, dict(attrs or {}), num_outputs, op)
    tensors = [placeholder(v.name, v.type.dtype, v.type.shape, value=v.const) for v in values]
    outs = apply_rule(op, tensors, full, types)
    feeds = {f"in{k}": a for k, a in enumerate(arrays)}
    return types, evaluate(outs, feeds, sizes={"N": arrays[0].shape[0]})


def _rule_input(rng, dtype, shape=(3, 4, 5)):
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-4, 5, size=shape).astype(dtype)
    return rng.uniform(0.2, 2.0, size=shape).astype(dtype)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([1], 0), ([-1], 1), ([2, 0], 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_reduce_rules(rng, op, axes, keepdims, dtype):
    x = _rule_input(rng, dtype)
    if op == "ReduceLogSum" and dtype == np.int32:
        x = np.abs(x) + 1
    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
    _check_rule(op, inputs, {"keepdims": keepdims}, consts={1},
                tol=2e-3 if dtype == np.float16 else 1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_rules_empty_axes_empty_sets_and_batch_dim(rng, op):
    x = _rule_input(rng, np.float32)
    none = np.zeros(0, np.int64)
    _check_rule(op, [x, none], {"noop_with_empty_axes": 1}, consts={1})
    _check_rule(op, [x, none], {"noop_with_empty_axes": 0}, consts={1})
    _check_rule(op, [np.zeros((3, 0, 2), np.float32), np.array([1])], consts={1})
    _check_rule(op, [np.float32(1.5)])
    types, (got,) = _rule_with_batch_dim(op, [x, np.array([-1])], {"keepdims": 0}, consts={1})
    assert types[0].shape == ("N", 4)
    want, = get_op(op).run([x, np.array([-1])], {"keepdims": 0, "noop_with_empty_axes": 0})
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_reduce_rules_nan_inf_and_bool(rng):
    x = _rule_input(rng, np.float32)
    x[0, 1, 2], x[1, 2, :] = np.nan, -np.inf
    for op in ("ReduceMax", "ReduceMin", "ReduceLogSumExp", "ReduceSum"):
        _check_rule(op, [x, np.array([2])], consts={1})
    b = rng.random((3, 4)) > 0.5
    b[0], b[1] = True, False
    for op in ("ReduceMax", "ReduceMin"):
        _check_rule(op, [b, np.array([1])], consts={1})


def test_reduce_rule_needs_known_axes(rng):
    x = _rule_input(rng, np.float32)
    with pytest.raises(NoCompute, match="run time"):
        run_rule("ReduceSum", [x, np.array([1])], {"keepdims": 1})
    _check_rule("ReduceSum", [x, np.zeros(0, np.int64)])  # no axes is known without values


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (1, 0, 1), (-1, 1, 1), (2, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_arg_rules_ties_and_nan(rng, op, axis, keepdims, last, dtype):
    x = rng.integers(0, 3, (3, 4, 5)).astype(dtype)  # many ties
    if dtype == np.float32:
        x[0, 1, 2] = x[0, 1, 4] = x[2, 0, 0] = np.nan  # NaN is the extreme, as np.argmax
    _check_rule(op, [x], {"axis": axis, "keepdims": keepdims, "select_last_index": last})


def test_arg_rule_batch_dim(rng):
    x = _rule_input(rng, np.float32)
    types, (got,) = _rule_with_batch_dim("ArgMax", [x], {"axis": 1, "keepdims": 0})
    assert types[0].shape == ("N", 5)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("axis,exclusive,reverse", [(0, 0, 0), (1, 1, 0), (-1, 0, 1), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_scan_rules(rng, op, axis, exclusive, reverse, dtype):
    x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(dtype) \
        if dtype != np.int32 else _rule_input(rng, dtype)
    _check_rule(op, [x, np.array(axis)], {"exclusive": exclusive, "reverse": reverse},
                consts={1}, tol=3e-3 if dtype == np.float16 else 1e-5)


def test_scan_rule_needs_known_axis_and_keeps_batch_dim(rng):
    x = _rule_input(rng, np.float32)
    with pytest.raises(NoCompute, match="axis"):
        run_rule("CumSum", [x, np.array(1)])
    types, (got,) = _rule_with_batch_dim("CumSum", [x, np.array(0)], consts={1})
    assert types[0].shape == ("N", 4, 5)
    np.testing.assert_allclose(got, np.cumsum(x, axis=0), rtol=1e-5)


@pytest.mark.parametrize("op", sorted(ROWS))
@pytest.mark.parametrize("axis,coerce_2d", [(0, 0), (1, 0), (-1, 0), (0, 1), (1, 1), (-1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_softmax_family_rules(rng, op, axis, coerce_2d, dtype):
    x = (rng.standard_normal((3, 4, 5)) * 5).astype(dtype)
    if op == "Hardmax":
        x = np.round(x)  # ties: the first maximum wins
    _check_rule(op, [x], {"axis": axis, "coerce_2d": coerce_2d},
                tol=2e-3 if dtype == np.float16 else 1e-5)


@pytest.mark.parametrize("op", sorted(ROWS))
def test_softmax_family_rules_nan_scalar_and_batch_dim(rng, op):
    x = (rng.standard_normal((3, 4, 5)) * 50).astype(np.float32)
    x[0, 0, 3] = np.nan
    _check_rule(op, [x], {"axis": -1})
    _check_rule(op, [x], {"axis": 1, "coerce_2d": 1})
    _check_rule(op, [np.float32(2.5)])
    types, (got,) = _rule_with_batch_dim(op, [x], {"axis": 1, "coerce_2d": 1})
    assert types[0].shape == ("N", 4, 5)
    want, = get_op(op).run([x], {"axis": 1, "coerce_2d": 1})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
