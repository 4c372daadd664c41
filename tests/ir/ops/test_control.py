"""Control flow (If, Loop, Scan): ONNX models with subgraphs against naive Python loops and
onnxruntime, merged and widened types with symbolic dims, nested bodies reading outer values,
Graph.verify and printing of graph-valued attributes, and errors."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc.errors import DNNCError, ShapeError
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import types as T
from dnnc.ir.graph import Graph

RNG = np.random.default_rng(7311)
F = TensorProto.FLOAT


def _vi(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "m", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, *arrays):
    return dnnc.compile(model, target="numpy").run(*arrays)


def _ort(model, *arrays):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})


# -- If --------------------------------------------------------------------------------------


def _if_model():
    """then: x * 2 (shape [N, 3]); else: first row of x (shape [1, 3]) plus y."""
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [_vi("t")])
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", TensorProto.INT64,
                                                                         [1], [0])),
         helper.make_node("Constant", [], ["e"], value=helper.make_tensor("e", TensorProto.INT64,
                                                                         [1], [1])),
         helper.make_node("Slice", ["x", "s", "e"], ["row"]),
         helper.make_node("Add", ["row", "y"], ["u"])], "else", [], [_vi("u")])
    node = helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other,
                            name="choose")
    return _model([node], [_vi("c", TensorProto.BOOL, []), _vi("x", F, ["N", 3]),
                           _vi("y", F, [3])], [_vi("out")])


@pytest.mark.parametrize("cond", [True, False])
def test_if_runs_the_chosen_branch(cond):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    y = RNG.standard_normal(3).astype(np.float32)
    (got,) = _run(_if_model(), np.array(cond), x, y)
    want = x + x if cond else x[:1] + y
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_if_branches_of_different_shapes_merge_with_a_symbolic_dim():
    g = import_onnx(_if_model())
    out = g.outputs[0].type
    assert out.dtype is T.float32 and out.shape[1] == 3 and isinstance(out.shape[0], str)
    assert out.shape[0] != "N"  # N in one branch, 1 in the other
    g.verify()  # re-inference gives the same merged type
    text = str(g)
    assert "graph(choose.then_branch)" in text and "graph choose.else_branch()" in text


def test_if_branch_dtypes_must_agree():
    then = Graph("then")
    then.outputs = [then.add("Identity", _const(np.zeros(2, np.float32)))]
    other = Graph("else")
    other.outputs = [other.add("Identity", _const(np.zeros(2, np.int64)))]
    g = Graph()
    c = g.add_input("c", T.TensorType(T.bool_, ()))
    with pytest.raises(ShapeError, match="dtype and rank"):
        g.add("If", c, then_branch=then, else_branch=other)


def _const(array):
    from dnnc.frontend.onnx import constant_value

    return constant_value(f"k{RNG.integers(1 << 30)}", array)


# -- Loop ------------------------------------------------------------------------------------


def _loop_model(with_m=True, with_cond=True):
    """Carried: acc (grows by one row of `row` each step) and s (sum); scan output: s.
    The body stops when s exceeds `limit` (an outer value)."""
    body = helper.make_graph(
        [helper.make_node("Concat", ["acc_in", "row"], ["acc_out"], axis=0),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Add", ["s_in", "fi"], ["s_out"]),
         helper.make_node("Less", ["s_out", "limit"], ["go"]),
         helper.make_node("Identity", ["s_out"], ["s_scan"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("c", TensorProto.BOOL, []),
                 _vi("acc_in", F, None), _vi("s_in", F, None)],
        [_vi("go", TensorProto.BOOL, []), _vi("acc_out"), _vi("s_out"), _vi("s_scan")])
    node = helper.make_node("Loop", ["m" if with_m else "", "c0" if with_cond else "", "acc",
                                     "s"], ["acc_f", "s_f", "scans"], body=body, name="lp")
    inputs = [_vi("m", TensorProto.INT64, []), _vi("c0", TensorProto.BOOL, []),
              _vi("acc", F, [1, 2]), _vi("s", F, []), _vi("row", F, [1, 2]),
              _vi("limit", F, [])]
    if not with_m:
        inputs.pop(0)
    if not with_cond:
        inputs.pop(1 if with_m else 0)
    return _model([node], inputs, [_vi("acc_f"), _vi("s_f"), _vi("scans")])


def _loop_reference(m, cond, acc, s, row, limit):
    i, scans = 0, []
    while cond and (m is None or i < m):
        acc = np.concatenate([acc, row])
        s = np.float32(s + np.float32(i))
        cond = s < limit
        scans.append(s)
        i += 1
    return acc, np.array(s, np.float32), np.array(scans, np.float32)


@pytest.mark.parametrize("m, cond, limit, with_m, with_cond", [
    (5, True, 100.0, True, True),    # runs M times
    (9, True, 7.0, True, True),      # the body's condition stops it early
    (3, False, 100.0, True, True),   # never runs: carried values pass through, scans empty
    (None, True, 12.0, False, True),  # no M: runs until the condition fails
    (4, None, 100.0, True, False)])  # no cond input
def test_loop_matches_a_python_loop(m, cond, limit, with_m, with_cond):
    acc = RNG.standard_normal((1, 2)).astype(np.float32)
    s = np.array(RNG.standard_normal(), np.float32)
    row = RNG.standard_normal((1, 2)).astype(np.float32)
    args = ([np.array(m, np.int64)] if with_m else []) + \
        ([np.array(cond)] if with_cond else []) + [acc, s, row, np.array(limit, np.float32)]
    got = _run(_loop_model(with_m, with_cond), *args)
    want = _loop_reference(m, True if cond is None else cond, acc, s, row, limit)
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype and g_.shape == w.shape
        np.testing.assert_allclose(g_, w, rtol=1e-6)
    if with_m and with_cond:
        for g_, w in zip(got, _ort(_loop_model(), *args)):
            np.testing.assert_allclose(g_, w, rtol=1e-6)


def test_loop_widens_a_growing_carried_value_and_counts_trips_symbolically():
    g = import_onnx(_loop_model())
    acc, s, scans = (v.type for v in g.outputs)
    assert isinstance(acc.shape[0], str) and acc.shape[1] == 2  # grows: 1, 2, 3, ...
    assert s.shape == () and scans.shape == ("lp_trips",)
    body = g.nodes[0].attrs["body"]
    assert body.inputs[2].type == acc  # the body runs on the widened type
    g.verify()
    assert "graph lp.body(" in str(g)


def test_nested_bodies_read_values_of_every_enclosing_graph():
    """A Loop body holding an If whose branch reads the top graph's input."""
    then = helper.make_graph([helper.make_node("Add", ["v_in", "w"], ["r"])], "then", [],
                             [_vi("r")])
    other = helper.make_graph([helper.make_node("Sub", ["v_in", "w"], ["r2"])], "else", [],
                              [_vi("r2")])
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["odd_i"], to=TensorProto.BOOL),
         helper.make_node("If", ["odd_i"], ["v_out"], then_branch=then, else_branch=other)],
        "body", [_vi("i", TensorProto.INT64, []), _vi("c", TensorProto.BOOL, []),
                 _vi("v_in", F, [3])], [_vi("c", TensorProto.BOOL, []), _vi("v_out", F, [3])])
    model = _model([helper.make_node("Loop", ["m", "", "v"], ["v_f"], body=body)],
                   [_vi("m", TensorProto.INT64, []), _vi("v", F, [3]), _vi("w", F, [3])],
                   [_vi("v_f")])
    g = import_onnx(model)
    g.verify()
    v, w = RNG.standard_normal((2, 3)).astype(np.float32)
    (got,) = _run(model, np.array(3, np.int64), v, w)
    np.testing.assert_allclose(got, v - w + w + w, rtol=1e-6)  # i = 0, 1, 2: sub, add, add


# -- Scan ------------------------------------------------------------------------------------


def _scan_model(in_axes, in_dirs, out_axes, out_dirs, x_shape, y_shape):
    """State: running sum (shape of a slice of x); scan outputs: sum and sum * y-slice."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "xs"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "ys"], ["prod"]),
         helper.make_node("Identity", ["s_out"], ["s_scan"])],
        "body", [_vi("s_in"), _vi("xs"), _vi("ys")],
        [_vi("s_out"), _vi("s_scan"), _vi("prod")])
    node = helper.make_node("Scan", ["s0", "x", "y"], ["s_f", "sums", "prods"], body=body,
                            num_scan_inputs=2, scan_input_axes=in_axes,
                            scan_input_directions=in_dirs, scan_output_axes=out_axes,
                            scan_output_directions=out_dirs, name="sc")
    slice_shape = [d for i, d in enumerate(x_shape) if i != in_axes[0] % len(x_shape)]
    return _model([node], [_vi("s0", F, slice_shape), _vi("x", F, x_shape),
                           _vi("y", F, y_shape)], [_vi("s_f"), _vi("sums"), _vi("prods")])


def _scan_reference(s, x, y, in_axes, in_dirs, out_axes, out_dirs):
    xs, ys = np.moveaxis(x, in_axes[0], 0), np.moveaxis(y, in_axes[1], 0)
    if in_dirs[0]:
        xs = xs[::-1]
    if in_dirs[1]:
        ys = ys[::-1]
    sums, prods = [], []
    for t in range(xs.shape[0]):
        s = s + xs[t]
        sums.append(s)
        prods.append(s * ys[t])
    outs = []
    for seq, axis, rev in zip((sums, prods), out_axes, out_dirs):
        stacked = np.stack(seq[::-1] if rev else seq)
        outs.append(np.moveaxis(stacked, 0, axis))
    return [s] + outs


@pytest.mark.parametrize("in_axes, in_dirs, out_axes, out_dirs", [
    ([0, 0], [0, 0], [0, 0], [0, 0]),
    ([1, 0], [1, 0], [1, -1], [0, 1]),
    ([-1, 1], [0, 1], [2, 0], [1, 1])])
def test_scan_matches_a_python_loop_and_onnxruntime(in_axes, in_dirs, out_axes, out_dirs):
    seq = 5
    x_shape = [2, 3]
    x_shape.insert(in_axes[0] % 3, seq)
    y_shape = [2, 3]
    y_shape.insert(in_axes[1] % 3, seq)
    model = _scan_model(in_axes, in_dirs, out_axes, out_dirs, x_shape, y_shape)
    s0 = RNG.standard_normal((2, 3)).astype(np.float32)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    y = RNG.standard_normal(y_shape).astype(np.float32)
    got = _run(model, s0, x, y)
    want = _scan_reference(s0, x, y, in_axes, in_dirs, out_axes, out_dirs)
    for g_, w, o in zip(got, want, _ort(model, s0, x, y)):
        assert g_.shape == w.shape == o.shape
        np.testing.assert_allclose(g_, w, rtol=1e-5)
        np.testing.assert_allclose(g_, o, rtol=1e-5)


def test_scan_keeps_a_symbolic_sequence_length():
    model = _scan_model([0, 0], [0, 0], [1, 0], [0, 0], ["S", 2, 3], ["S", 2, 3])
    g = import_onnx(model)
    assert [v.type.shape for v in g.outputs] == [(2, 3), (2, "S", 3), ("S", 2, 3)]
    g.verify()


def test_scan8_runs_every_batch_sample():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "xs"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["s_scan"])],
        "body", [_vi("s_in", F, [2]), _vi("xs", F, [2])], [_vi("s_out"), _vi("s_scan")])
    model = _model([helper.make_node("Scan", ["", "s0", "x"], ["s_f", "scans"], body=body,
                                     num_scan_inputs=1, directions=[1])],
                   [_vi("s0", F, [3, 2]), _vi("x", F, [3, 4, 2])],
                   [_vi("s_f"), _vi("scans")], opset=8)
    s0 = RNG.standard_normal((3, 2)).astype(np.float32)
    x = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    s_f, scans = _run(model, s0, x)
    sums = s0[:, None, :] + np.cumsum(x[:, ::-1], axis=1)
    np.testing.assert_allclose(scans, sums, rtol=1e-5)
    np.testing.assert_allclose(s_f, sums[:, -1], rtol=1e-5)
    import_onnx(model).verify()


def test_scan_with_too_many_scan_inputs_is_an_error():
    body = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "body",
                             [_vi("a", F, [2])], [_vi("b")])
    model = _model([helper.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=2)],
                   [_vi("x", F, [3, 2])], [_vi("y")])
    with pytest.raises(DNNCError, match="num_scan_inputs"):
        import_onnx(model)


def test_loop_body_arity_is_checked():
    body = Graph("body")
    body.add_input("i", T.TensorType(T.int64, ()))
    c = body.add_input("c", T.TensorType(T.bool_, ()))
    body.outputs = [c]
    g = Graph()
    m = g.add_input("m", T.TensorType(T.int64, ()))
    v = g.add_input("v", T.TensorType(T.float32, (2,)))
    with pytest.raises(ShapeError, match="must take 3 inputs"):
        g.add_node("Loop", [m, None, v], {"body": body})


def test_loop_with_a_constant_count_and_a_passed_through_condition_has_static_scans():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Add", ["v_in", "w"], ["v_out"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("c", TensorProto.BOOL, []),
                 _vi("v_in", F, [3])], [_vi("c_out", TensorProto.BOOL, []), _vi("v_out"),
                                        _vi("v_out")])
    m = helper.make_tensor("m", TensorProto.INT64, [], [4])
    graph = helper.make_graph([helper.make_node("Loop", ["m", "", "v"], ["v_f", "vs"],
                                                body=body)], "m",
                              [_vi("v", F, [3]), _vi("w", F, [3])], [_vi("v_f"), _vi("vs")],
                              [m])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert import_onnx(model).outputs[1].type.shape == (4, 3)
    v, w = RNG.standard_normal((2, 3)).astype(np.float32)
    v_f, vs = _run(model, v, w)
    np.testing.assert_allclose(vs, v + np.arange(1, 5)[:, None] * w, rtol=1e-5)
    np.testing.assert_allclose(v_f, vs[-1])
