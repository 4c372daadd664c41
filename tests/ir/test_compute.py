"""Tensor expressions and their NumPy interpretation, checked against direct NumPy."""

import numpy as np
import pytest

from dnnc.ir import types as T
from dnnc.ir.compute import (
    compute, dim_expr, evaluate, placeholder, producers, reduce_axis, reduce_max, reduce_sum)
from dnnc.ir.loop import Select, Var, call, const, logical_and


def test_dim_expr_turns_symbolic_dims_into_index_expressions():
    assert dim_expr(4) == const(4)
    assert dim_expr("N") == Var("N")
    assert dim_expr("2*N*S") == Var("N") * Var("S") * 2


def _softmax(x):
    n, c = x.shape
    k1, k2 = reduce_axis(c, "k1"), reduce_axis(c, "k2")
    m = compute((n,), lambda i: reduce_max(x[i, k1], k1), "rowmax")
    e = compute((n, c), lambda i, j: call("exp", x[i, j] - m[i]), "e")
    s = compute((n,), lambda i: reduce_sum(e[i, k2], k2), "rowsum")
    return compute((n, c), lambda i, j: e[i, j] / s[i], "softmax")


def test_multi_stage_softmax_with_symbolic_batch(rng):
    x = placeholder("x", T.float32, ("N", 10))
    y = _softmax(x)
    assert [t.name for t in producers(y)] == ["e", "rowsum"]
    a = rng.standard_normal((4, 10)).astype(np.float32)
    out, = evaluate([y], {"x": a}, {"N": 4})
    ref = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(out, ref / ref.sum(1, keepdims=True), rtol=1e-6)


def test_matmul_reduction(rng):
    a, b = rng.standard_normal((3, 7)), rng.standard_normal((7, 5))
    x, w = placeholder("x", T.float64, (3, 7)), placeholder("w", T.float64, (7, 5))
    r = reduce_axis(7)
    y = compute((3, 5), lambda i, j: reduce_sum(x[i, r] * w[r, j], r))
    np.testing.assert_allclose(evaluate([y], {"x": a, "w": b})[0], a @ b, rtol=1e-12)


def test_conditional_reduction_is_a_padded_window(rng):
    """1-D max pool, kernel 3, pad 1: out-of-range taps are filtered by the condition."""
    a = rng.standard_normal(9).astype(np.float32)
    x = placeholder("x", T.float32, (9,))
    r = reduce_axis(3, "r")
    pos = lambda i: i + r.var - 1  # noqa: E731
    y = compute((9,), lambda i: reduce_max(
        x[pos(i)], r, where=logical_and(pos(i) >= 0, pos(i) < 9)))
    padded = np.pad(a, 1, constant_values=-np.inf)
    expected = np.max(np.lib.stride_tricks.sliding_window_view(padded, 3), axis=1)
    np.testing.assert_array_equal(evaluate([y], {"x": a})[0], expected)


def test_select_cast_and_empty_reduction(rng):
    x = placeholder("x", T.int32, (4, 0))
    r = reduce_axis(0)
    s = compute((4,), lambda i: reduce_sum(x[i, r], r))
    np.testing.assert_array_equal(evaluate([s], {"x": np.zeros((4, 0), np.int32)})[0],
                                  np.zeros(4, np.int32))
    v = placeholder("v", T.float32, (5,))
    relu = compute((5,), lambda i: Select(v[i] > 0.0, v[i], const(0.0)), dtype=T.float16)
    a = rng.standard_normal(5).astype(np.float32)
    out = evaluate([relu], {"v": a})[0]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, np.maximum(a, 0).astype(np.float16))


def test_missing_feed_is_reported():
    from dnnc.ir.compute import ComputeEvalError
    x = placeholder("x", T.float32, (2,))
    y = compute((2,), lambda i: x[i] * 2.0)
    with pytest.raises(ComputeEvalError, match="x"):
        evaluate([y], {})
