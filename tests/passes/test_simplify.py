"""simplify: each rule on a small graph — what it changes, what it must leave alone — and the
meaning kept (numpy target before and after)."""

import numpy as np

import dnnc
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.simplify import simplify


def _const(name, array):
    array = np.asarray(array, np.float32)
    return Value(name, T.TensorType(T.float32, array.shape), const=array)


def _conv_bn(rng, const_stats=True, extra_use=False, bias=True):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 3, 6, 6)))
    w = _const("w", rng.standard_normal((4, 3, 3, 3)))
    args = [x, w] + ([_const("b", rng.standard_normal(4))] if bias else [])
    y = g.add("Conv", *args, pads=[1, 1, 1, 1], name="conv")
    stats = [_const(n, rng.standard_normal(4)) for n in ("scale", "bias", "mean")]
    var = _const("var", rng.random(4) + 0.5)
    if not const_stats:
        stats[0] = g.add_input("scale", T.TensorType(T.float32, (4,)))
    z = g.add("BatchNormalization", y, *stats, var, epsilon=1e-3, name="bn")
    g.outputs = [z] + ([y] if extra_use else [])
    return g


def _run(g, feeds):
    return dnnc.compile(g, target="numpy").run(*feeds)


def test_batch_norm_folds_into_the_conv_before_it():
    rng = np.random.default_rng()
    for bias in (True, False):
        g = _conv_bn(rng, bias=bias)
        x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
        before = _run(g, [x])
        assert simplify(g) == 1
        g.verify()
        assert [n.op for n in g.nodes] == ["Conv"]
        np.testing.assert_allclose(_run(g, [x])[0], before[0], rtol=1e-5, atol=1e-5)


def test_batch_norm_stays_when_it_cannot_fold():
    rng = np.random.default_rng()
    assert simplify(_conv_bn(rng, const_stats=False)) == 0      # statistics are inputs
    assert simplify(_conv_bn(rng, extra_use=True)) == 0         # the conv's output is read too


def test_identity_and_inference_dropout_disappear():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3)))
    a = g.add("Identity", x)
    b = g.add("Relu", a)
    c = g.add("Dropout", b)
    g.outputs = [g.add("Exp", c)]
    assert simplify(g) == 2
    assert [n.op for n in g.nodes] == ["Relu", "Exp"]
    assert g.nodes[0].inputs[0] is x


def test_training_dropout_and_an_identity_output_stay():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3)))
    ratio = Value("r", T.TensorType(T.float32, ()), const=np.array(0.5, np.float32))
    mode = g.add_input("training", T.TensorType(T.bool_, ()))
    d = g.add("Dropout", x, ratio, mode, seed=0)
    g.outputs = [d, g.add("Identity", x)]
    assert simplify(g) == 0
