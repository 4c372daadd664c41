"""The default schedule: row stages fused into one loop only where each row reads its own
results, float reductions with one partial result per lane (tails included), and the float32
exp / erf / tanh expansions (accuracy, overflow, NaN) — each against NumPy on fresh random inputs."""

import math

import numpy as np
import pytest

import dnnc
from dnnc.backends.llvm.schedules import Config, default_schedule
from dnnc.backends.loop_analysis import fuse_row_loops
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value


def _unary(op, n):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (n,)))
    g.outputs = [g.add(op, x)]
    return dnnc.compile(g, target="llvm")


def test_exp_expansion_is_accurate_and_keeps_specials(rng):
    x = np.concatenate([rng.uniform(-90, 90, 20000), rng.standard_normal(5000),
                        [0.0, -0.0, 88.7, 88.73, 100.0, -87.3, -87.4, -200.0,
                         np.inf, -np.inf, np.nan]]).astype(np.float32)
    got = _unary("Exp", x.size).run(x)[0]
    with np.errstate(over="ignore"):
        want = np.exp(x)
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)
    np.testing.assert_allclose(got[normal], want[normal], rtol=4e-7)   # 3 ulp at most
    assert np.all(np.isinf(got[want == np.inf]))              # overflow, +inf
    assert np.all(np.abs(got[~normal & np.isfinite(want)]) < 1.2e-38)   # underflow
    assert np.isnan(got[-1])


def test_erf_expansion_is_accurate_and_keeps_specials(rng):
    x = np.concatenate([rng.uniform(-6, 6, 20000), rng.standard_normal(5000) * 1e-3,
                        [0.0, 4.0, -4.0, 10.0, np.inf, -np.inf, np.nan]]).astype(np.float32)
    got = _unary("Erf", x.size).run(x)[0]
    want = np.vectorize(math.erf)(x[:-1].astype(np.float64))
    np.testing.assert_allclose(got[:-1], want, rtol=1e-6, atol=5e-7)
    assert np.isnan(got[-1])


def test_tanh_expansion_is_accurate_and_keeps_specials(rng):
    """Both branches (|x| below and above 0.625, and at it), saturation, -0.0 and NaN."""
    x = np.concatenate([rng.uniform(-12, 12, 20000), rng.standard_normal(5000) * 1e-3,
                        rng.uniform(0.6, 0.65, 1000) * rng.choice([-1, 1], 1000),
                        [0.625, -0.625, 9.5, -9.5, 100.0, np.inf, -np.inf, 0.0, -0.0, np.nan]]
                       ).astype(np.float32)
    got = _unary("Tanh", x.size).run(x)[0]
    want = np.tanh(x[:-1].astype(np.float64))
    np.testing.assert_allclose(got[:-1], want, rtol=3e-7, atol=0)   # 2 ulp at most
    assert np.signbit(got[-2]) and not np.signbit(got[-3])
    assert np.isnan(got[-1])


def test_sigmoid_expansion_is_accurate_and_keeps_specials(rng):
    """Sigmoid expanded with the vector exp (not legalize's libm exp): saturation at both
    ends, -0.0 and NaN."""
    x = np.concatenate([rng.uniform(-40, 40, 20000), rng.standard_normal(5000),
                        [88.0, -88.0, 89.0, -89.0, 200.0, -200.0, np.inf, -np.inf, 0.0, -0.0,
                         np.nan]]).astype(np.float32)
    got = _unary("Sigmoid", x.size).run(x)[0]
    with np.errstate(over="ignore"):   # sigmoid's own definition in float32: e^89 is inf
        want = np.float32(1.0) / (np.float32(1.0) + np.exp(-x[:-1]))
    np.testing.assert_allclose(got[:-1], want, rtol=1e-6, atol=0)
    assert np.isnan(got[-1])


@pytest.mark.parametrize("c", [0.75, -0.75, 0.25, -1.5, 2.25, 3.75])
def test_pow_to_quarters_is_accurate_and_keeps_c99_specials(rng, c):
    """pow(x, c) for a constant multiple of 1/4 expanded into square roots and products (no
    libm powf a lane at a time; LRN's base ** 0.75): within 4 ulp of float64's pow, and C99's
    special values: negative x NaN, +-0 -> +0 (c > 0) or +inf (c < 0), -inf -> +inf or +0."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (40064,)))
    g.outputs = [g.add("Pow", x, Value("c", T.TensorType(T.float32, ()),
                                      const=np.array(c, np.float32)))]
    model = dnnc.compile(g, target="llvm", cache=False)
    assert "pow" not in model.source()
    xs = np.concatenate([rng.uniform(0, 10, 20000), np.exp(rng.uniform(-20, 20, 20000)),
                         [0.0, -0.0, -1.0, -2.5, np.inf, -np.inf, np.nan, 1.0, 1e-30, 3e38,
                          5e-39, 1e-45]] + [rng.uniform(1, 2, 52)]).astype(np.float32)
    got = model.run(xs)[0]
    with np.errstate(all="ignore"):
        want = np.power(xs.astype(np.float64), c)
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny) & \
        (np.abs(want) <= np.finfo(np.float32).max)
    # a root or two, up to 3 products and a reciprocal, each rounded: 4 ulp at most
    np.testing.assert_allclose(got[normal], want[normal], rtol=4.8e-7)
    special = dict(zip([0.0, -0.0, -1.0, -2.5, np.inf, -np.inf],
                       got[40000:40006].tolist()))
    assert np.isnan(got[40002]) and np.isnan(got[40003]) and np.isnan(got[40006])
    assert got[40000] == got[40001] == (0.0 if c > 0 else np.inf)
    assert not np.signbit(got[40000]) and not np.signbit(got[40001])
    assert got[40004] == (np.inf if c > 0 else 0.0) and got[40005] == got[40004], special


@pytest.mark.parametrize("n", [128, 100, 7])
def test_split_reductions_match_numpy_with_tails(rng, n):
    """n = 100: a 16-lane split leaves a tail of 4; n = 7 is too short to split."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (5, n)))
    axes = Value("axes", T.TensorType(T.int64, (1,)), const=np.array([1], np.int64))
    g.outputs = [g.add("ReduceSum", x, axes), g.add("ReduceMax", x, axes),
                 g.add("ReduceMin", x, axes)]
    compiled = dnnc.compile(g, target="llvm")
    a = rng.standard_normal((5, n)).astype(np.float32)
    a[2, n // 2] = np.nan          # max and min propagate NaN whichever lane holds it
    s, mx, mn = compiled.run(a)
    np.testing.assert_allclose(s, a.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, a.max(1, keepdims=True))
    np.testing.assert_array_equal(mn, a.min(1, keepdims=True))
    if n >= 32:
        assert "_lanes" in compiled.runtime.source("loop")


def test_split_reductions_over_several_vectors_fold_every_lane(rng):
    """A row of 256 takes 4 vectors of partial results (`reduce_vectors`), folded half into
    half: a NaN in any one of the 64 lanes reaches the max and the min, and the largest and
    smallest elements are found in whichever lane holds them."""
    n = 256
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (70, n)))
    axes = Value("axes", T.TensorType(T.int64, (1,)), const=np.array([1], np.int64))
    g.outputs = [g.add("ReduceSum", x, axes), g.add("ReduceMax", x, axes),
                 g.add("ReduceMin", x, axes)]
    compiled = dnnc.compile(g, target="llvm")
    a = rng.standard_normal((70, n)).astype(np.float32)
    for row in range(64):                   # rows 0-63: a NaN in lane `row`
        a[row, row + 64 * (row % 4)] = np.nan
    for row in range(64, 70):               # the rest: extremes in scattered lanes
        a[row, 7 * row % n] = 50.0
        a[row, 11 * row % n] = -50.0
    s, mx, mn = compiled.run(a)
    np.testing.assert_allclose(s[64:], a[64:].sum(1, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, a.max(1, keepdims=True))
    np.testing.assert_array_equal(mn, a.min(1, keepdims=True))
    assert "float32[64]" in compiled.runtime.source("loop")


@pytest.mark.parametrize("op,kwargs", [("Softmax", {"axis": -1}),
                                       ("LayerNormalization", {"axis": -1})])
def test_row_stages_run_as_one_parallel_loop(rng, op, kwargs):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 96, 80)))
    args = [x]
    if op == "LayerNormalization":
        args += [Value("s", T.TensorType(T.float32, (80,)),
                       const=rng.standard_normal(80).astype(np.float32)),
                 Value("b", T.TensorType(T.float32, (80,)),
                       const=rng.standard_normal(80).astype(np.float32))]
    g.outputs = [g.add(op, *args, **kwargs)]
    a = (rng.standard_normal((2, 96, 80)) * 4).astype(np.float32)
    want = dnnc.compile(g, target="numpy").run(a)[0]
    compiled = dnnc.compile(g, target="llvm")
    np.testing.assert_allclose(compiled.run(a)[0], want, rtol=1e-5, atol=1e-5)
    source = compiled.runtime.source("loop")
    assert source.count("for ") - source.count("for r") > 0
    outer = [line for line in source.splitlines() if line.startswith("  for ")]
    assert len(outer) == 1, source   # every stage inside the one row loop


def _loop(var, body):
    return L.For(var, L.const(8), body)


def test_row_fusion_refuses_a_read_of_another_row():
    """The second loop reads t[i + 1] (written by a later iteration of the first): fusing
    would read it before it is written. Reading t[i] fuses."""
    t = L.Buffer("t", T.float32, (L.const(9),))
    x = L.Buffer("x", T.float32, (L.const(9),))
    y = L.Buffer("y", T.float32, (L.const(9),))
    i, j = L.Var("i"), L.Var("j")
    first = _loop(i, L.Store(t, (i,), x[i] * 2.0))
    same = _loop(j, L.Store(y, (j,), t[j] + 1.0))
    other = _loop(j, L.Store(y, (j,), t[j + 1] + 1.0))
    assert len(fuse_row_loops([first, same])) == 1
    assert len(fuse_row_loops([first, other])) == 2
    halves = _loop(i, L.Store(t, (i // 2,), x[i]))   # iterations 2k and 2k+1 share t[k]
    assert len(fuse_row_loops([halves, _loop(j, L.Store(y, (j,), t[j // 2]))])) == 2
    writes_back = _loop(j, L.Store(x, (j,), t[j]))   # overwrites what the first loop reads
    assert len(fuse_row_loops([first, writes_back])) == 2
    func = L.PrimFunc("f", (x, t, y), L.seq(first, other))
    assert default_schedule(func, Config(), 2).body == L.seq(first, other)


def test_split_reduction_over_an_outer_axis(rng):
    """The reduced axis is not the innermost one: lanes read strided elements."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (3, 70, 5)))
    axes = Value("axes", T.TensorType(T.int64, (1,)), const=np.array([1], np.int64))
    g.outputs = [g.add("ReduceSum", x, axes, keepdims=0), g.add("ReduceMax", x, axes)]
    a = rng.standard_normal((3, 70, 5)).astype(np.float32)
    s, mx = dnnc.compile(g, target="llvm").run(a)
    np.testing.assert_allclose(s, a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, a.max(1, keepdims=True))


# -- parallel loops never carry a reduction (issue 10, item 2) -----------------------------


def _sum_all(shape):
    """`acc = 0; for r0, r1: acc += x[r0, r1]; y[] = acc`, as lowering writes a reduction
    with one output element."""
    x = L.Buffer("x", T.float32, tuple(L.const(d) for d in shape))
    y = L.Buffer("y", T.float32, ())
    acc = L.Buffer("acc", T.float32, (L.const(1),), L.Scope.LOCAL)
    r0, r1 = L.Var("r0"), L.Var("r1")
    zero = (L.const(0),)
    update = L.Store(acc, zero, L.Load(acc, zero) + x[r0, r1])
    body = L.Allocate(acc, L.seq(L.Store(acc, zero, L.const(0.0, T.float32)),
                                 L.loop_nest([(r0, shape[0]), (r1, shape[1])], update),
                                 L.Store(y, (), L.Load(acc, zero))))
    return L.PrimFunc("sum_all", (x, y), body)


def _parallel_loops(func):
    return [n for n in L.walk(func.body) if isinstance(n, L.For) and
            n.kind is L.ForKind.PARALLEL]


def test_carried_state_is_found():
    from dnnc.backends.loop_analysis import carried

    x = L.Buffer("x", T.float32, (L.const(64),))
    y = L.Buffer("y", T.float32, (L.const(64),))
    i = L.Var("i")
    own = L.For(i, 64, L.Store(y, (i,), x[i] + 1.0))
    assert carried(own) == set()
    # two iterations write one element (i // 2), or one reads its neighbour's
    assert carried(L.For(i, 64, L.Store(y, (i // 2,), x[i]))) == {"y"}
    assert carried(L.For(i, 63, L.Store(y, (i + 1,), y[i]))) == {"y"}
    # the fused index of two loops is the iteration's own
    assert carried(L.For(i, 64, L.Store(L.Buffer("z", T.float32, (L.const(8),) * 2),
                                         (i // 8, i % 8), x[i])) ) == set()
    func = _sum_all((64, 64))
    (loop,) = [n for n in L.walk(func.body) if isinstance(n, L.For) and n.var.name == "r0"]
    assert carried(loop) == {"acc"}


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_big_reduction_is_split_into_fixed_chunks(threads):
    func = default_schedule(_sum_all((256, 300)), Config(reduce_lanes=1), threads)
    chunked = [n for n in L.walk(func.body) if isinstance(n, L.For) and
               n.var.name.endswith("_c")]
    assert [c.extent for c in chunked] == [L.const(64)]
    assert len(_parallel_loops(func)) == (1 if threads > 1 else 0)
    for loop in _parallel_loops(func):
        assert loop is chunked[0] or loop.var == chunked[0].var
        stored = {n.buffer.name for n in L.walk(loop.body) if isinstance(n, L.Store)}
        assert "acc" not in stored and "y" not in stored
    # the same code at any thread count but for the parallel marks
    serial = default_schedule(_sum_all((256, 300)), Config(reduce_lanes=1), 1)
    unmarked = L.transform(func.body, lambda n: L.For(n.var, n.extent, n.body)
                           if isinstance(n, L.For) else None)
    assert L.print_stmt(unmarked) == L.print_stmt(serial.body)


def test_small_or_unsplittable_reduction_stays_serial():
    small = default_schedule(_sum_all((16, 16)), Config(), 2)
    assert _parallel_loops(small) == []
    # an update that is not `acc = acc op x` (ArgMax's, keeping an index) cannot be chunked
    func = _sum_all((256, 300))
    odd = L.transform(func.body, lambda n: L.Store(n.buffer, n.indices, L.Select(
        n.value.b > 0.5, n.value, n.value.b)) if isinstance(n, L.Store) and
        n.buffer.name == "acc" and isinstance(n.value, L.BinOp) else None)
    scheduled = default_schedule(L.PrimFunc("odd", func.params, odd), Config(), 2)
    assert _parallel_loops(scheduled) == []


# -- reductions over an outer axis read the rows along (`_columns`, issue 14 item 6) ---------


def _reduce(op, shape, axes, **attrs):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    a = Value("axes", T.TensorType(T.int64, (len(axes),)), const=np.array(axes, np.int64))
    g.outputs = [g.add(op, x, a, **attrs)]
    return g


@pytest.mark.parametrize("shape,axes", [((4096, 300), [0]), ((37, 1000), [0]), ((50, 17), [0]),
                                        ((9, 700, 260), [1]), ((3, 5), [0])])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"])
def test_reductions_over_an_outer_axis_match_numpy(rng, op, shape, axes):
    """Whole blocks of columns, the remaining columns, fewer columns than a vector."""
    model = dnnc.compile(_reduce(op, shape, axes, keepdims=0), target="llvm")
    a = rng.standard_normal(shape).astype(np.float32)
    got = model.run(a)[0]
    want = {"ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min,
            "ReduceMean": np.mean}[op](a.astype(np.float64), axis=tuple(axes))
    if op in ("ReduceMax", "ReduceMin"):
        np.testing.assert_array_equal(got, want.astype(np.float32))
    else:
        # the blocked sum's bound: a few roundings per level, not one per row
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * math.sqrt(shape[axes[0]]))


def test_a_column_reduction_reads_rows_along_in_parallel_blocks():
    model = dnnc.compile(_reduce("ReduceSum", (4096, 1024), [0], keepdims=0), target="llvm")
    source = model.source("loop")
    assert "_cols" in source
    (loop,) = [line for line in source.splitlines() if "_c in range(" in line]
    assert model.runtime.target.threads == 1 or "# parallel" in loop


def test_a_column_reduction_keeps_nan_and_long_sums_accurate(rng):
    a = (rng.standard_normal((20000, 64)) + 100).astype(np.float32)
    a[123, 7] = np.nan
    got = dnnc.compile(_reduce("ReduceSum", a.shape, [0], keepdims=0), target="llvm").run(a)[0]
    want = a.astype(np.float64).sum(0)
    assert np.isnan(got[7]) and np.isnan(want[7])
    keep = np.arange(64) != 7
    # a float32 running sum of 20000 values near 100 would be off by ~1e-4 relative
    np.testing.assert_allclose(got[keep], want[keep], rtol=2e-6)


def test_a_block_of_elements_per_iteration_is_not_carried():
    from dnnc.backends.loop_analysis import carried

    y = L.Buffer("y", T.float32, (L.const(256),))
    io, lane = L.Var("io"), L.Var("l")
    own = L.For(io, 4, L.For(lane, 64, L.Store(y, (io * 64 + lane,), L.const(1.0, T.float32))))
    assert carried(own) == set()
    # blocks that overlap (64 elements every 32) are shared
    overlap = L.For(io, 4, L.For(lane, 64, L.Store(y, (io * 32 + lane,),
                                                   L.const(1.0, T.float32))))
    assert carried(overlap) == {"y"}
