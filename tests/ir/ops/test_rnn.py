"""RNN, LSTM and GRU: every attribute and optional input against onnxruntime, a naive
single-step check, symbolic-dim inference for both layouts, and errors."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.frontend.onnx import ONNX_FROM_DTYPE
from dnnc.ir import types as T
from dnnc.ir.compute import NoCompute, run_rule
from dnnc.ir.graph import Graph
from dnnc.ir.ops.registry import get_op

RNG = np.random.default_rng(7130)
GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}
INPUT_NAMES = {"RNN": ["X", "W", "R", "B", "sequence_lens", "initial_h"],
               "GRU": ["X", "W", "R", "B", "sequence_lens", "initial_h"],
               "LSTM": ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]}


def _inputs(op, seq=4, batch=3, size=5, hidden=6, dirs=1, layout=0, bias=True,
            lens=None, init=False, peep=False):
    g = GATES[op]
    x_shape = (seq, batch, size) if layout == 0 else (batch, seq, size)
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    feed = {"X": RNG.standard_normal(x_shape).astype(np.float32),
            "W": (RNG.standard_normal((dirs, g * hidden, size)) * 0.5).astype(np.float32),
            "R": (RNG.standard_normal((dirs, g * hidden, hidden)) * 0.5).astype(np.float32)}
    if bias:
        feed["B"] = RNG.standard_normal((dirs, 2 * g * hidden)).astype(np.float32)
    if lens is not None:
        feed["sequence_lens"] = np.array(lens, np.int32)
    if init:
        feed["initial_h"] = RNG.standard_normal(state).astype(np.float32)
        if op == "LSTM":
            feed["initial_c"] = RNG.standard_normal(state).astype(np.float32)
    if peep:
        feed["P"] = RNG.standard_normal((dirs, 3 * hidden)).astype(np.float32)
    return feed


def _model(op, feed, outputs, opset, attrs):
    names = [n if n in feed else "" for n in INPUT_NAMES[op]]
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, outputs, **attrs)
    def elem(a):
        return ONNX_FROM_DTYPE[T.DType.from_numpy(a.dtype).name]

    ins = [helper.make_tensor_value_info(n, elem(feed[n]), feed[n].shape) for n in names if n]
    outs = [helper.make_tensor_value_info(o, elem(feed["X"]), None) for o in outputs if o]
    graph = helper.make_graph([node], "t", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), \
        [feed[n] for n in names if n], [o for o in outputs if o]


def _check_against_ort(op, feed, attrs, outputs=("Y", "Y_h"), opset=22, ort_opset=None):
    """dnnc at `opset` against onnxruntime at `ort_opset` (onnxruntime lacks layout=1: it
    runs the time-major transposed problem instead)."""
    attrs = {"hidden_size": feed["R"].shape[-1], **attrs}  # onnxruntime needs it
    model, args, names = _model(op, feed, list(outputs), opset, attrs)
    got = dnnc.compile(model, target="numpy").run(*args)
    batchwise = attrs.get("layout", 0) == 1
    ort_feed = {k: v.swapaxes(0, 1) if batchwise and k in ("X", "initial_h", "initial_c")
                else v for k, v in feed.items()}
    ort_attrs = {k: v for k, v in attrs.items() if k not in ("layout", "output_sequence")}
    ort_model, ort_args, _ = _model(op, ort_feed, list(outputs), ort_opset or opset, ort_attrs)
    sess = ort.InferenceSession(ort_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    want = sess.run(names, dict(zip([n for n in INPUT_NAMES[op] if n in feed], ort_args)))
    if batchwise:
        want = [w.transpose(2, 0, 1, 3) if w.ndim == 4 else w.swapaxes(0, 1) for w in want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


CASES = [
    # (op, input options, attributes)
    ("RNN", {}, {"hidden_size": 6}),
    ("RNN", {"dirs": 2, "init": True}, {"direction": "bidirectional"}),
    ("RNN", {"lens": [4, 2, 3]}, {"direction": "reverse"}),
    ("RNN", {"bias": False, "layout": 1, "init": True}, {"layout": 1}),
    ("RNN", {}, {"activations": ["Relu"], "clip": 1.5}),
    ("RNN", {"dirs": 2}, {"direction": "bidirectional",
                          "activations": ["LeakyRelu", "HardSigmoid"],
                          "activation_alpha": [0.3, 0.4], "activation_beta": [0.6]}),
    ("LSTM", {"init": True, "peep": True}, {}),
    ("LSTM", {"dirs": 2, "lens": [1, 4, 3], "init": True, "peep": True},
     {"direction": "bidirectional"}),
    ("LSTM", {"layout": 1, "init": True}, {"layout": 1, "clip": 0.7}),
    ("LSTM", {"lens": [3, 4, 2]}, {"input_forget": 1, "direction": "reverse"}),
    ("LSTM", {}, {"activations": ["HardSigmoid", "Softsign", "Elu"],
                  "activation_alpha": [0.3, 0.9]}),
    ("GRU", {"init": True}, {}),
    ("GRU", {"init": True}, {"linear_before_reset": 1}),
    ("GRU", {"dirs": 2, "lens": [2, 4, 1], "layout": 1, "init": True},
     {"direction": "bidirectional", "layout": 1, "linear_before_reset": 1}),
    ("GRU", {"bias": False}, {"direction": "reverse", "clip": 0.5,
                              "activations": ["Sigmoid", "Relu"]}),
]


@pytest.mark.parametrize("op,options,attrs", CASES)
def test_against_onnxruntime(op, options, attrs):
    feed = _inputs(op, **options)
    outputs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    _check_against_ort(op, feed, attrs, outputs)


def test_optional_outputs_and_old_opset():
    feed = _inputs("LSTM", init=True)
    _check_against_ort("LSTM", feed, {}, ("", "Y_h"), opset=7)
    _check_against_ort("LSTM", feed, {}, ("", "", "Y_c"), opset=14)
    feed = _inputs("GRU")
    _check_against_ort("GRU", feed, {"output_sequence": 1}, ("Y", "Y_h"), opset=3,
                       ort_opset=22)


def test_rnn_step_matches_formula():
    """One step of a single RNN: Y_h = tanh(x W^T + h R^T + Wb + Rb), written out."""
    feed = _inputs("RNN", seq=1, batch=2, size=3, hidden=4, init=True)
    model, args, _ = _model("RNN", feed, ["Y", "Y_h"], 22, {})
    y, y_h = dnnc.compile(model, target="numpy").run(*args)
    x, w, r, b, h = (feed[k][0] for k in ("X", "W", "R", "B", "initial_h"))
    want = np.empty((2, 4))
    for n in range(2):
        for j in range(4):
            acc = b[j] + b[4 + j] + sum(x[n, k] * w[j, k] for k in range(3)) + \
                sum(h[n, k] * r[j, k] for k in range(4))
            want[n, j] = np.tanh(acc)
    np.testing.assert_allclose(y_h[0], want, rtol=1e-5)
    np.testing.assert_allclose(y[0, 0], want, rtol=1e-5)


def test_float16_keeps_dtype():
    feed = {k: v.astype(np.float16) if v.dtype == np.float32 else v
            for k, v in _inputs("GRU", init=True).items()}
    model, args, _ = _model("GRU", feed, ["Y", "Y_h"], 22, {})
    y, y_h = dnnc.compile(model, target="numpy").run(*args)
    assert y.dtype == np.float16 and y_h.dtype == np.float16
    want = dnnc.compile(_model("GRU", {k: v.astype(np.float32) if v.dtype == np.float16
                                       else v for k, v in feed.items()}, ["Y", "Y_h"], 22,
                               {})[0], target="numpy").run(*[a.astype(np.float32)
                                                             for a in args])
    np.testing.assert_allclose(y, want[0], atol=2e-2)


def _infer(op, types, attrs, num_outputs):
    g = Graph("t")
    values = [None if t is None else g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    return [v.type for v in g.add_node(op, values, attrs, num_outputs=num_outputs)]


@pytest.mark.parametrize("layout", [0, 1])
def test_symbolic_batch_and_sequence(layout):
    f = T.float32
    x = ("S", "N", 5) if layout == 0 else ("N", "S", 5)
    state = (2, "N", 7) if layout == 0 else ("N", 2, 7)
    types = [T.TensorType(f, x), T.TensorType(f, (2, 28, 5)), T.TensorType(f, (2, 28, 7)),
             None, T.TensorType(T.int32, ("N",)), T.TensorType(f, state),
             T.TensorType(f, state)]
    y, y_h, y_c = _infer("LSTM", types, {"direction": "bidirectional", "layout": layout,
                                         "hidden_size": 7}, 3)
    assert y.shape == (("S", 2, "N", 7) if layout == 0 else ("N", "S", 2, 7))
    assert y_h.shape == state and y_c.shape == state


@pytest.mark.parametrize("attrs,types,match", [
    ({"direction": "sideways"}, None, "direction"),
    ({"activations": ["Gelu"]}, None, "activation"),
    ({"hidden_size": 5}, None, "hidden_size 5"),
    ({"direction": "bidirectional"}, None, "direction"),
    ({}, [(4, 3, 5), (1, 6, 4), (1, 6, 6)], "input 1"),
])
def test_errors(attrs, types, match):
    types = types or [(4, 3, 5), (1, 6, 5), (1, 6, 6)]
    with pytest.raises(ShapeError, match=match):
        _infer("RNN", [T.TensorType(T.float32, s) for s in types], attrs, 2)


# -- compute rules --------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["RNN", "LSTM", "GRU"])
def test_recurrences_say_why_they_have_no_loop_form(op):
    # explicit rules that raise NoCompute: the nodes run as host fallbacks, counted as such
    assert get_op(op).compute is not None
    feed = _inputs(op, init=True)
    arrays = [feed.get(name) for name in INPUT_NAMES[op][:6 if op != "LSTM" else 7]]
    with pytest.raises(NoCompute, match=f"{op}: a recurrence over time steps"):
        run_rule(op, arrays, {"hidden_size": 6}, num_outputs=2)
