"""The operator IR: construction, printing, structural equality, verification, simplification.

The simplifier is checked two ways: a test per rule, and a property test evaluating random index
expressions before and after simplification at random points within the loop bounds."""

import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnc.ir import types as T
from dnnc.ir.loop import (
    Allocate, Barrier, BinOp, Bounds, Buffer, Cast, Const, For, ForKind, If, Let, Load,
    LoopIRError, PrimFunc, Reduce, IterVar, Scope, Select, Store, Var, call, const, eq,
    free_vars, maximum, minimum, seq, simplify, simplify_expr, static_shape, structural_equal,
    verify, walk)

i, j, k, n = Var("i"), Var("j"), Var("k"), Var("n")


def _copy_func():
    a = Buffer("A", T.float32, (n, 16))
    b = Buffer("B", T.float32, (n, 16))
    body = For(i, n, For(j, 16, Store(b, (i, j), call("exp", a[i, j])), ForKind.VECTORIZED),
               ForKind.PARALLEL)
    return PrimFunc("copy_exp", (a, b), body, (n,))


def test_printer_is_readable_and_stable():
    assert str(_copy_func()) == (
        "def copy_exp(A: float32[n, 16], B: float32[n, 16]) sizes(n):\n"
        "  for i in range(n):  # parallel\n"
        "    for j in range(16):  # vectorized\n"
        "      B[i, j] = exp(A[i, j])\n")


def test_printer_parenthesises_by_precedence():
    from dnnc.ir.loop import print_expr
    assert print_expr((i + j) * 4) == "(i + j) * 4"
    assert print_expr(i + j * 4) == "i + j * 4"
    assert print_expr(i - (j - k)) == "i - (j - k)"
    assert print_expr(Select(i < n, const(1.0), const(0.0))) == \
        "select(i < n, float32(1.0), float32(0.0))"


def test_gpu_primfunc_with_shared_memory_and_barrier_builds_and_prints():
    """A tiled GPU row-sum: block and thread axes, a shared tile, a barrier."""
    a = Buffer("A", T.float32, (n, 256))
    out = Buffer("out", T.float32, (n,))
    tile = Buffer("tile", T.float32, (256,), Scope.SHARED)
    acc = Buffer("acc", T.float32, (1,), Scope.LOCAL)
    bx, tx, r = Var("bx"), Var("tx"), Var("r")
    body = For(bx, n, For(tx, 256, Allocate(tile, seq(
        Store(tile, (tx,), a[bx, tx]),
        Barrier(),
        If(eq(tx, 0), Allocate(acc, seq(
            Store(acc, (0,), const(0.0)),
            For(r, 256, Store(acc, (0,), acc[0] + tile[r])),
            Store(out, (bx,), acc[0])))))), ForKind.THREAD_X), ForKind.BLOCK_X)
    f = PrimFunc("row_sum", (a, out), body, (n,))
    verify(f)
    text = str(f)
    assert "# blockIdx.x" in text and "# threadIdx.x" in text
    assert "tile = alloc(float32[256], scope=shared)" in text
    assert "barrier()" in text


def test_structural_equality_ignores_bound_variable_names():
    f = _copy_func()
    renamed = PrimFunc(f.name, f.params, For(Var("x"), n, For(Var("y"), 16, Store(
        f.params[1], (Var("x"), Var("y")), call("exp", f.params[0][Var("x"), Var("y")])),
        ForKind.VECTORIZED), ForKind.PARALLEL), (n,))
    assert renamed != f
    assert structural_equal(renamed, f)
    other = PrimFunc(f.name, f.params, For(i, n, For(j, 16, Store(
        f.params[1], (i, j), call("log", f.params[0][i, j])), ForKind.VECTORIZED),
        ForKind.PARALLEL), (n,))
    assert not structural_equal(other, f)


def test_static_shape_of_buffer_and_graph_dims():
    assert static_shape(Buffer("A", T.float32, (4, 16)).shape) == (4, 16)
    assert static_shape(Buffer("A", T.float32, (n, 16)).shape) is None
    assert static_shape((4, "N")) is None and static_shape((4, 5)) == (4, 5)


def test_free_vars():
    assert free_vars(For(i, n, Store(Buffer("B", T.int64, (n,)), (i,), i + k))) == {n, k}


@pytest.mark.parametrize("make, message", [
    (lambda a, b: Store(b, (i, j), a[i, j]), "out of scope"),
    (lambda a, b: For(i, n, For(j, 16, Store(b, (i,), a[i, j]))), "rank"),
    (lambda a, b: For(i, n, For(j, 16, Store(b, (i, j), Cast(T.float64, a[i, j])))),
     "storing float64"),
    (lambda a, b: For(i, n, For(j, 16, Store(Buffer("C", T.float32, (n, 16)), (i, j),
                                                a[i, j]))), "neither a parameter"),
    (lambda a, b: For(i, n, Barrier()), "barrier outside"),
    (lambda a, b: For(i, n, Allocate(Buffer("s", T.float32, (4,), Scope.SHARED), Barrier())),
     "shared buffer"),
    (lambda a, b: For(i, n, For(i, 16, Store(b, (i, i), a[i, i]))), "rebinds"),
    (lambda a, b: For(i, n, For(j, 16, Store(b, (i, j), a[i, j] + const(1, T.int64)))),
     "mixes dtypes"),
    (lambda a, b: For(i, n, For(j, 16, Store(b, (i, j), Reduce("sum", a[i, k], (
        IterVar(k, const(16)),))))), "Reduce"),
])
def test_verifier_rejects_broken_functions(make, message):
    a = Buffer("A", T.float32, (n, 16))
    b = Buffer("B", T.float32, (n, 16))
    with pytest.raises(LoopIRError, match=message):
        verify(PrimFunc("bad", (a, b), make(a, b), (n,)))


# -- simplifier rules, one test each --------------------------------------------------------------

J4 = {j: Bounds(0, 3), i: Bounds(0, 99)}


@pytest.mark.parametrize("before, after, env", [
    (const(3) + 4, const(7), {}),                               # constant folding
    (const(-7) // 2, const(-4), {}),                            # floor division
    (const(-7) % 2, const(1), {}),                              # floor modulo
    (i + 0, i, {}), (const(0) + i, i, {}), (i * 1, i, {}), (i * 0, const(0), {}),
    (i - i, const(0), {}), (i // 1, i, {}), (i % 1, const(0), {}),
    (minimum(i, i), i, {}),
    (const(2) * i, i * 2, {}),                                  # constants to the right
    ((i + 3) + 4, i + 7, {}), ((i * 2) * 3, i * 6, {}), ((i + 3) - 1, i + 2, {}),
    ((i * 4) // 4, i, {}), ((i * 8) // 4, i * 2, {}), ((i * 8) % 4, const(0), {}),
    ((i * 4 + j) // 4, i, J4),                                  # bounds-aware div
    ((i * 4 + j) % 4, j, J4),
    (j // 4, const(0), J4), (j % 4, j, J4),
    (((i * 4 + j) // 4) * 4 + (i * 4 + j) % 4, i * 4 + j, J4),  # recombination
    ((i * 4 + j) % 64, (i * 4) % 64 + j, J4),                   # a lane over an aligned base
    ((i * 4 + j) // 64, (i * 4) // 64, J4),
    ((i * 128 + k * 4 + j) % 64, k * 4 + j, {**J4, k: Bounds(0, 9)}),
    (((k * 4 + j) // 64) * 64 + (k * 4 + j) % 64, k * 4 + j, {**J4, k: Bounds(0, 99)}),
    (j < 4, const(True, T.bool_), J4), (j >= 4, const(False, T.bool_), J4),
    (minimum(j, 10), j, J4), (maximum(j, 10), const(10), J4),
    (Select(j < 4, i, j), i, J4), (Select(i < n, j, j), j, {}),
    (Cast(T.int64, i), i, {}), (Cast(T.float32, const(3)), const(3.0), {}),
])
def test_simplifier_rule(before, after, env):
    assert simplify_expr(before, env) == after


def test_simplifier_leaves_what_it_cannot_prove():
    assert simplify_expr(j // 4, {}) == j // 4                         # j unbounded
    assert simplify_expr((i * 4 + j) // 4, {}) == i + j // 4           # true for any j
    assert simplify_expr(j < n, J4) == (j < n)
    assert simplify_expr((i * 4 + k) % 64, {k: Bounds(0, 4)}) == (i * 4 + k) % 64   # k may carry
    assert simplify_expr((i * 4 + j) % 6, J4) == (i * 4 + j) % 6       # 4 does not divide 6
    assert simplify_expr((i * 4 + j) % 64, {i: Bounds(-2, 9), j: Bounds(0, 3)}) == \
        (i * 4 + j) % 64                                                # the base may be < 0
    x = Var("x", T.float32)
    assert simplify_expr(x * 0.0) == x * 0.0                           # NaN * 0 is NaN


def test_statement_simplification_uses_loop_bounds():
    a = Buffer("A", T.float32, (64,))
    b = Buffer("B", T.float32, (16, 4))
    body = For(i, 16, For(j, 4, If((i * 4 + j) < 64,
                                   Store(b, (i, j), a[((i * 4 + j) // 4) * 4 + j]))))
    out = simplify(PrimFunc("f", (a, b), body))
    assert out.body == For(i, 16, For(j, 4, Store(b, (i, j), a[i * 4 + j])))
    unit = simplify(For(k, 1, Store(b, (k, k), a[k])))
    assert unit == Store(b, (const(0), const(0)), a[0])


# -- property: simplification preserves the value of index expressions ---------------------------

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
        "%": operator.mod, "min": min, "max": max}


def _evaluate(e, values):
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return values[e]
    if isinstance(e, BinOp):
        a, b = _evaluate(e.a, values), _evaluate(e.b, values)
        if e.op in ("<", "<=", ">", ">=", "==", "!="):
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b,
                    "!=": a != b}[e.op]
        return _OPS[e.op](a, b)
    if isinstance(e, Select):
        return _evaluate(e.true if _evaluate(e.cond, values) else e.false, values)
    raise TypeError(e)


_leaves = st.sampled_from([i, j, k]) | st.integers(-3, 12).map(const)


def _extend(children):
    ops = st.sampled_from(["+", "-", "*", "min", "max"])
    arith = st.tuples(ops, children, children).map(lambda t: BinOp(t[0], t[1], t[2]))
    divmod_ = st.tuples(st.sampled_from(["//", "%"]), children, st.integers(1, 8)).map(
        lambda t: BinOp(t[0], t[1], const(t[2])))
    scaled = st.tuples(children, st.integers(1, 8), children).map(
        lambda t: t[0] * t[1] + t[2])
    return arith | divmod_ | scaled


_exprs = st.recursive(_leaves, _extend, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_exprs, st.integers(0, 7), st.integers(0, 3), st.integers(0, 15))
def test_simplification_preserves_values(e, vi, vj, vk):
    env = {i: Bounds(0, 7), j: Bounds(0, 3), k: Bounds(0, 15)}
    values = {i: vi, j: vj, k: vk}
    assert _evaluate(simplify_expr(e, env), values) == _evaluate(e, values)


@settings(max_examples=200, deadline=None)
@given(st.integers(-5000, 5000), st.integers(1, 9), st.integers(1, 9), st.integers(1, 6),
       st.integers(0, 3))
def test_an_unravelled_row_ravelled_again_folds_back(row, h, w, scale, lane):
    """(r // (h w)) * (h w s) + (r // w % h) * (w s) + (r % w) * s + j -> r * s + j (a
    channels-last tensor's (n, h, w) offset of a flat row, `linearize`): no division left,
    the same value for every row, negative ones too (floor division and modulo)."""
    e = (i // (h * w)) * (h * w * scale) + (i // w % h) * (w * scale) + (i % w) * scale + j
    out = simplify_expr(e, {j: Bounds(0, 3)})
    assert not any(isinstance(n, BinOp) and n.op in ("//", "%") for n in walk(out)), out
    assert _evaluate(out, {i: row, j: lane}) == _evaluate(e, {i: row, j: lane}) == \
        row * scale + lane
    # a multiple that does not match stays: x // 7 * 14 + x % 7 * 3 is no x * s
    assert simplify_expr((i // 7) * 14 + (i % 7) * 3) == (i // 7) * 14 + (i % 7) * 3


@pytest.mark.parametrize("dtype", [T.int8, T.int32, T.int64])
def test_integer_division_by_zero_and_min_by_minus_one_is_defined(dtype):
    """BinOp's rule (issue 10, item 3): by 0 every integer division gives 0; MIN / -1 and
    MIN // -1 wrap to MIN, MIN % -1 is 0. The evaluator follows it and the simplifier never
    folds such a division into a constant outside the type."""
    import numpy as np

    from dnnc.ir.compute import _Evaluator

    lo = int(np.iinfo(dtype.np).min)
    cases = [(7, 0, {"/": 0, "//": 0, "%": 0}), (lo, 0, {"/": 0, "//": 0, "%": 0}),
             (lo, -1, {"/": lo, "//": lo, "%": 0}), (-7, 2, {"/": -3, "//": -4, "%": 1})]
    for a, b, want in cases:
        for op, value in want.items():
            e = BinOp(op, Const(a, dtype), Const(b, dtype))
            assert int(_Evaluator({}, {}).eval(e, {})) == value, (a, op, b)
            folded = simplify_expr(e)
            if isinstance(folded, Const):
                assert folded.value == value, (a, op, b)


def test_bounds_of_a_division_by_a_divisor_known_only_to_be_positive():
    """A block grouping's tile // min(rows left, 8): bounded, so that legalize divides
    unsigned and the index arithmetic narrows to 32 bits (cuda's tensor-core kernels)."""
    from dnnc.ir.loop import bounds
    t = Var("t")
    env = {t: Bounds(0, 391)}
    divisor = minimum(98 - t // 32 * 8, 8)
    assert bounds(divisor, env) == Bounds(2, 8)
    assert bounds(t % 32 // divisor, env) == Bounds(0, 15)
    assert bounds(t // 32 * 8 + t % 32 % divisor, env) == Bounds(0, 103)
    assert bounds(i % divisor, {**env, i: Bounds(-5, 3)}) == Bounds(0, 7)   # floor's: >= 0
    assert bounds(t // n, {**env, n: Bounds(None, 4)}) == Bounds(None, None)   # n may be <= 0


@given(st.integers(0, 50), st.integers(0, 50), st.integers(1, 9), st.integers(0, 9),
       st.integers(0, 60), st.integers(0, 12))
@settings(max_examples=300, deadline=None)
def test_bounds_of_division_and_remainder_by_a_positive_range_hold(alo, aw, blo, bw, a, b):
    from dnnc.ir.loop import bounds
    ahi, bhi = alo + aw, blo + bw
    a, b = min(max(a, alo), ahi), min(max(b, blo), bhi)
    env = {i: Bounds(alo, ahi), j: Bounds(blo, bhi)}
    for e, value in ((i // j, a // b), (i % j, a % b)):
        r = bounds(e, env)
        assert (r.lo is None or r.lo <= value) and (r.hi is None or value <= r.hi)
