"""`loop.index_checks`: the run-time check of gather indices in the operator IR."""

import numpy as np
import pytest

from dnnc.errors import IndexRangeError
from dnnc.ir import loop as L
from dnnc.ir import types as T

CPU = frozenset({L.ForKind.SERIAL, L.ForKind.VECTORIZED})


def _row_copy(kind=L.ForKind.SERIAL, extent=8, store_ids=False):
    """for r: for c: y[r, c] = x[check(ids[r]), c] (and ids[r] rewritten in the loop)."""
    x, ids = L.Buffer("x", T.float32, (5, extent)), L.Buffer("ids", T.int64, (4,))
    y = L.Buffer("y", T.float32, (4, extent))
    r, c = L.Var("r"), L.Var("c")
    check = L.Call("check_index", (ids[r], L.const(5), L.const(3)), L.INDEX)
    body = L.Store(y, (r, c), x[L.minimum(L.maximum(check, 0), 4), c])
    if store_ids:
        body = L.seq(L.Store(ids, (r,), ids[r]), body)
    return L.PrimFunc("f", (x, ids, y), L.For(r, 4, L.For(c, extent, body, kind)))


def test_an_invariant_check_leaves_the_loop_once():
    out = L.index_checks.hoist(_row_copy(), CPU)
    inner = out.body.body   # for r: let _check0 = check(ids[r]) in for c: ...
    assert isinstance(inner, L.Let) and inner.value.name == "check_index"
    assert isinstance(inner.body, L.For) and not L.index_checks.has_checks(inner.body)
    assert L.index_checks.has_checks(out.body)   # still checked, once a row


def test_a_check_leaves_nested_loops_to_where_its_index_changes():
    func = _row_copy()
    r, inner = func.body.var, func.body.body
    a = L.Var("a")
    func = L.PrimFunc("f", func.params, L.For(r, 4, L.For(a, 3, inner)))   # r, a, c
    out = L.index_checks.hoist(func, CPU).body.body
    assert isinstance(out, L.Let) and isinstance(out.body, L.For)   # before the a loop
    lets = [n for n in L.walk(out.body) if isinstance(n, L.Let)]
    assert not lets and not L.index_checks.has_checks(out.body)     # none left inside


@pytest.mark.parametrize("why", ["kind", "extent 0", "stored"])
def test_a_check_stays_where_hoisting_could_change_it(why):
    func = _row_copy(kind=L.ForKind.UNROLLED) if why == "kind" else \
        _row_copy(extent=0) if why == "extent 0" else _row_copy(store_ids=True)
    assert L.index_checks.hoist(func, CPU) == func


def test_checks_are_emitted_only_with_a_site_and_stripped_for_identities():
    value, size = L.Var("i", L.INDEX), L.const(5)
    assert L.index_checks.checked(value, size) is value
    with L.index_checks.checking(2):
        call = L.index_checks.checked(value, size)
    assert call == L.Call("check_index", (value, size, L.Const(2, L.INDEX)), L.INDEX)
    assert L.index_checks.strip(call + 1) == value + 1
    func = L.PrimFunc("f", (), L.Store(L.Buffer("y", L.INDEX, (1,)), (L.const(0),), call))
    assert L.index_checks.with_errors(func).params == (L.index_checks.INDEX_ERRORS,)


def test_the_simplifier_drops_a_check_bounds_prove():
    i = L.Var("i", L.INDEX)
    check = L.Call("check_index", (i, L.const(5), L.const(0)), L.INDEX)
    assert L.simplify_expr(check, {i: L.Bounds(-5, 4)}) == i
    assert L.simplify_expr(check, {i: L.Bounds(0, 5)}) == check


def test_the_evaluator_raises_as_the_reference():
    values = np.array([0, -5, 4, 7])
    with pytest.raises(IndexRangeError, match="index 7 is out of range for an axis of size 5"):
        L.index_checks.evaluate(values, np.int64(5), np.int64(0))
    np.testing.assert_array_equal(L.index_checks.evaluate(values[:3], np.int64(5), 0),
                                  values[:3])
