"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: references against naive loops,
inference, errors, the importers against onnxruntime, and the compute rules against the
references."""

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.ir import types as T
from dnnc.ir.compute import apply_rule, evaluate, placeholder, run_rule
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.registry import get_op, infer_node

RNG = np.random.default_rng(77)
F = T.TensorType


def _run(op, inputs, attrs, num_outputs=1):
    g = Graph("t")
    values = [None if x is None else
              g.add_input(f"x{i}", F(T.DType.from_numpy(x.dtype), x.shape))
              for i, x in enumerate(inputs)]
    g.outputs = g.add_node(op, values, attrs, num_outputs=num_outputs)
    g.verify()
    return run_graph(g, [x for x in inputs if x is not None])


def _naive(log_prob, target, weight, ignore_index, reduction):
    """Loop over every [n, d...] position: -w[t] * log_prob[n, t, d...]."""
    losses, weights = np.zeros(target.shape), np.zeros(target.shape)
    for pos in np.ndindex(*target.shape):
        t = int(target[pos])
        if ignore_index is not None and t == ignore_index:
            continue
        w = 1.0 if weight is None else float(weight[t])
        losses[pos] = -w * float(log_prob[(pos[0], t) + pos[1:]])
        weights[pos] = w
    if reduction == "none":
        return losses
    if reduction == "sum":
        return np.array(losses.sum())
    return np.array(losses.sum() / weights.sum())


def _naive_log_softmax(x):
    out = np.empty(x.shape)
    moved, res = np.moveaxis(x.astype(np.float64), 1, -1), np.moveaxis(out, 1, -1)
    for idx in np.ndindex(*moved.shape[:-1]):
        total = sum(math.exp(a) for a in moved[idx])
        res[idx] = [a - math.log(total) for a in moved[idx]]
    return out


CASES = [  # shape, weighted, ignore_index, reduction
    ((5, 4), False, None, "mean"),
    ((5, 4), True, None, "mean"),
    ((5, 4), True, 2, "sum"),
    ((3, 4, 6), False, 1, "mean"),
    ((3, 4, 6), True, -1, "none"),
    ((2, 3, 2, 5), True, 0, "mean"),
    ((2, 3, 2, 5), False, None, "none"),
    ((2, 3, 2, 2, 3), True, 7, "sum"),  # ignore_index outside [0, C)
]


def _inputs(shape, weighted, ignore_index, dtype=np.float32):
    x = RNG.normal(size=shape).astype(dtype)
    target = RNG.integers(0, shape[1], size=(shape[0],) + shape[2:]).astype(np.int64)
    if ignore_index is not None:
        target.reshape(-1)[::3] = ignore_index  # some positions are ignored
    weight = RNG.uniform(0.5, 2.0, size=shape[1]).astype(dtype) if weighted else None
    return x, target, weight


@pytest.mark.parametrize("shape,weighted,ignore_index,reduction", CASES)
def test_nll_loss(shape, weighted, ignore_index, reduction):
    x, target, weight = _inputs(shape, weighted, ignore_index)
    got, = _run("NegativeLogLikelihoodLoss", [x, target, weight],
                {"ignore_index": ignore_index, "reduction": reduction})
    want = _naive(x, target, weight, ignore_index, reduction)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,weighted,ignore_index,reduction", CASES)
def test_softmax_cross_entropy_loss(shape, weighted, ignore_index, reduction):
    x, target, weight = _inputs(shape, weighted, ignore_index)
    loss, log_prob = _run("SoftmaxCrossEntropyLoss", [x, target.astype(np.int32), weight],
                          {"ignore_index": ignore_index, "reduction": reduction},
                          num_outputs=2)
    want_log_prob = _naive_log_softmax(x)
    np.testing.assert_allclose(log_prob, want_log_prob, rtol=1e-5, atol=1e-6)
    want = _naive(want_log_prob, target, weight, ignore_index, reduction)
    assert loss.shape == want.shape and loss.dtype == np.float32
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)


def test_half_and_double_keep_dtype():
    for dtype, rtol in ((np.float16, 3e-3), (np.float64, 1e-12)):
        x, target, weight = _inputs((4, 5, 3), True, None, dtype)
        loss, = _run("SoftmaxCrossEntropyLoss", [x, target, weight], {})
        assert loss.dtype == dtype and loss.shape == ()
        want = _naive(_naive_log_softmax(x), target, weight, None, "mean")
        np.testing.assert_allclose(loss.astype(np.float64), want, rtol=rtol)


def test_infer_symbolic():
    g = Graph("t")
    x = g.add_input("x", F(T.float32, ("N", 10, "S")))
    t = g.add_input("t", F(T.int64, ("N", "S")))
    none, = g.add_node("NegativeLogLikelihoodLoss", [x, t], {"reduction": "none"})
    assert none.type == F(T.float32, ("N", "S"))
    loss, log_prob = g.add_node("SoftmaxCrossEntropyLoss", [x, t], {}, num_outputs=2)
    assert loss.type == F(T.float32, ()) and log_prob.type == x.type


@pytest.mark.parametrize("types,attrs,match", [
    ([F(T.float32, (4,)), F(T.int64, ())], {}, "rank >= 2"),
    ([F(T.float32, (4, 3)), F(T.int64, (4, 1))], {}, "rank 1"),
    ([F(T.float32, (4, 3)), F(T.int64, (5,))], {}, "does not match"),
    ([F(T.float32, (4, 3)), F(T.float32, (4,))], {}, "target"),
    ([F(T.float32, (4, 3)), F(T.int64, (4,))], {"reduction": "max"}, "reduction"),
    ([F(T.float32, (4, 3)), F(T.int64, (4,)), F(T.float64, (3,))], {}, "weight"),
])
def test_errors(types, attrs, match):
    g = Graph("t")
    values = [g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    for op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
        with pytest.raises(ShapeError, match=match):
            g.add_node(op, values, attrs)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("shape,weighted,ignore_index,reduction", CASES[1:6])
def test_importers_against_onnxruntime(op, opset, shape, weighted, ignore_index, reduction):
    x, target, weight = _inputs(shape, weighted, ignore_index)
    names = ["x", "t"] + (["w"] if weighted else [])
    inputs = [x, target] + ([weight] if weighted else [])
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    outputs = ["loss", "log_prob"] if op == "SoftmaxCrossEntropyLoss" else ["loss"]
    node = helper.make_node(op, names, outputs, **attrs)
    elems = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64}
    vi = [helper.make_tensor_value_info(n, elems[a.dtype.type], a.shape)
          for n, a in zip(names, inputs)]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    model = helper.make_model(helper.make_graph([node], "g", vi, outs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    want = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, dict(zip(names,
                                                                                       inputs)))
    got = dnnc.compile(model, "numpy").run(*inputs)
    for g_, w_ in zip(got, want):
        assert g_.dtype == w_.dtype and g_.shape == w_.shape
        np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-6)


# -- compute rules (loop IR, interpreted by NumPy) against the references ------------------------

LOSSES = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]


def _check_rule(op, arrays, attrs, num_outputs=1, tol=1e-5):
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})
    got = run_rule(op, arrays, attrs, num_outputs=num_outputs)
    assert len(got) == num_outputs
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol)


@pytest.mark.parametrize("op", LOSSES)
@pytest.mark.parametrize("shape,weighted,ignore_index,reduction", CASES)
def test_loss_rules(op, shape, weighted, ignore_index, reduction):
    x, target, weight = _inputs(shape, weighted, ignore_index)
    attrs = {"ignore_index": ignore_index, "reduction": reduction}
    _check_rule(op, [x, target, weight], attrs)
    _check_rule(op, [x, target.astype(np.int32)] + ([weight] if weighted else []), attrs)
    if op == "SoftmaxCrossEntropyLoss":
        _check_rule(op, [x, target, weight], attrs, num_outputs=2)


@pytest.mark.parametrize("op", LOSSES)
@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-3), (np.float64, 1e-12)])
def test_loss_rules_half_and_double(op, dtype, tol):
    x, target, weight = _inputs((4, 5, 3), True, 2, dtype)
    for reduction in ("none", "mean"):
        _check_rule(op, [x, target, weight], {"ignore_index": 2, "reduction": reduction},
                    num_outputs=2 if op == "SoftmaxCrossEntropyLoss" else 1, tol=tol)


@pytest.mark.parametrize("op", LOSSES)
def test_loss_rules_batch_dim(op):
    """Scores [N, C, S] and targets [N, S] with N symbolic, bound only when evaluating."""
    x, target, weight = _inputs((3, 4, 5), True, 1)
    values = [Value("x", F(T.float32, ("N", 4, 5))), Value("t", F(T.int64, ("N", 5))),
              Value("w", F(T.float32, (4,)))]
    for reduction in ("none", "mean"):
        attrs = {"ignore_index": 1, "reduction": reduction}
        types, _, full = infer_node(op, values, attrs, 1, op)
        tensors = [placeholder(v.name, v.type.dtype, v.type.shape) for v in values]
        got, = evaluate(apply_rule(op, tensors, full, types),
                        {"x": x, "t": target, "w": weight}, sizes={"N": 3})
        want = get_op(op).run([x, target, weight], attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
