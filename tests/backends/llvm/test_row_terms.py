"""A row's terms stored by its sum and read back, and divisions by a row's statistic made
products (`dnnc/backends/llvm/row_terms.py`): softmax against NumPy on fresh random rows
(split with tails, too short to split, NaN and infinite elements), and the rewrite refused
where the sum does not visit the whole row or the last stage reads the input again."""

import numpy as np
import pytest

import dnnc
from dnnc.backends.llvm.row_terms import reciprocal, reuse_row_terms
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [(8, 16, 256), (48, 197), (64, 100), (64, 7)])
def test_softmax_stores_its_terms_once_and_matches_numpy(rng, shape):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    g.outputs = [g.add("Softmax", x, axis=-1)]
    compiled = dnnc.compile(g, target="llvm")
    a = (rng.standard_normal(shape) * 4).astype(np.float32)
    (got,) = compiled.run(a)
    np.testing.assert_allclose(got, _softmax(a), rtol=2e-6, atol=1e-7)
    loop = compiled.runtime.source("loop")
    assert "rcp" in loop
    if shape[-1] >= 32:          # split sums store their terms (7-wide rows are flattened)
        assert "term" in loop
    bad = a.copy()
    bad[..., 0, 3] = np.nan
    bad[..., 1, 5] = np.inf
    (got,) = compiled.run(bad)
    with np.errstate(invalid="ignore"):
        want = _softmax(bad)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[..., 2:, :], want[..., 2:, :], rtol=2e-6, atol=1e-7)


def _row(n: int, sum_extent: int, extra_read: bool = False):
    """The stages of a softmax-like row: acc = sum over sum_extent of exp(x[r]), s[0] = acc,
    y[j] = exp(x[j]) / s[0] over n (times x[j] when extra_read)."""
    x = L.Buffer("x", T.float32, (L.const(n),))
    y = L.Buffer("y", T.float32, (L.const(n),))
    s = L.Buffer("s", T.float32, (L.const(1),))
    acc = L.Buffer("acc", T.float32, (L.const(1),), L.Scope.LOCAL)
    r, j = L.Var("r"), L.Var("j")
    zero = L.const(0)
    total = L.Allocate(acc, L.seq(
        L.Store(acc, (zero,), L.const(0.0, T.float32)),
        L.For(r, sum_extent, L.Store(acc, (zero,), acc[zero] + L.call("exp", x[r]))),
        L.Store(s, (zero,), acc[zero])))
    value = L.call("exp", x[j]) / s[zero]
    if extra_read:
        value = value * x[j]
    return L.Seq((total, L.For(j, n, L.Store(y, (j,), value)))), s


def test_terms_are_stored_where_the_sum_visits_the_whole_row():
    row, _ = _row(64, 64)
    out = reuse_row_terms(row)
    assert out is not None
    stores = [x for x in L.walk(out) if isinstance(x, L.Store) and x.buffer.name == "y"]
    assert len(stores) == 2 and not any(isinstance(x, L.Call) for x in L.walk(out.stmts[-1]))


@pytest.mark.parametrize("sum_extent,extra_read", [(32, False), (64, True)])
def test_terms_are_not_stored_for_part_of_a_row_or_a_second_read(sum_extent, extra_read):
    row, _ = _row(64, sum_extent, extra_read)
    assert reuse_row_terms(row) is None


def test_reciprocal_only_of_the_kernels_own_statistics():
    row, s = _row(64, 64)
    last = row.stmts[-1]
    assert reciprocal(last, frozenset()) is None           # s a parameter: kept a division
    out = reciprocal(last, frozenset({s.name}))
    assert isinstance(out, L.Let) and not any(
        isinstance(x, L.BinOp) and x.op == "/" for x in L.walk(out.body))
