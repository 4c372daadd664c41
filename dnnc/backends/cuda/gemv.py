"""The cuda gemv template: matrix products with few rows (m < 16), split along k.

A product of one (or a few) rows — a classifier's fully connected layer at batch 1, an MLP,
a decode step's projections — has too few outputs for a thread each to fill the GPU, and a
thread per output walks the whole k serially. Here a block computes `cols` consecutive
columns of every row: its threads each take one residue class of k (k_split threads along
k) and `vector` consecutive elements of B's contiguous dimension at a step, accumulating
all m rows in registers, `unroll` steps at a time (independent loads in flight). With B
[k, n] (columns contiguous) a thread takes `vector` consecutive columns (cols / vector
threads across the block's columns), so each element of A it reads serves `vector`
columns; with B [n, k] (`trans_b`, Gemm's usual weights) a thread takes one column and
`vector` consecutive k a step (A's too). B's vectors are one 128-bit load where the renderer
proves them aligned (`vector` divides B's contiguous dimension), so a warp reads whole
32-byte sectors either way. The partial sums meet in shared memory; after a barrier,
`lanes` consecutive threads per (row, column) each add a share of its k_split partials and
combine them by a `shfl_xor` butterfly (a thread's serial sum of 32 to 128 partials was a
chain of dependent shared loads), and the first applies Gemm's scaling and bias and the
fused epilogue (`Dense.finish`) and stores through the layout tail, if any. Float16 and
bfloat16 operands are widened to float32 as they are read: fp32 arithmetic whatever the
storage.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Constraint, Space, Template
from .device import gpu_of

MAX_ROWS = 16            # fewer rows than this: dense.py's tiles would idle most threads
MAX_GRID_Y = 65535
SHARED_FLOATS = 12288    # the partial sums' shared memory: 48 KiB, static shared's limit
WARP = 32
BLOCK_THREADS = 256      # a default block's threads
LONG_K = 2048            # from this depth the default's block takes LONG_K_THREADS threads
LONG_K_THREADS = 512
VECTORS = (1, 2, 4)


@dataclass(frozen=True)
class GemvConfig:
    cols: int = 32       # columns per block
    k_split: int = 8     # threads along k, each a residue class of k
    unroll: int = 4      # k steps per iteration of a thread's loop
    vector: int = 1      # consecutive elements of B's contiguous dimension a thread's step


def across(p: problems.Dense, c: GemvConfig) -> int:
    """A block's threads across its columns: a column each with B [n, k], `vector` columns
    each with B [k, n]."""
    return c.cols if p.trans_b else c.cols // c.vector


def threads(p: problems.Dense, c: GemvConfig) -> int:
    return across(p, c) * c.k_split


def finish_lanes(p: problems.Dense, c: GemvConfig) -> int:
    """Threads that sum one output's k_split partials together (a power of two dividing
    k_split, at most a warp, all outputs at once)."""
    lanes = 1
    while 2 * lanes <= min(WARP, c.k_split) and \
            2 * lanes * c.cols * p.m <= threads(p, c):
        lanes *= 2
    return lanes


def applies(p: problems.Dense) -> bool:
    return not p.packed_panel and p.m < MAX_ROWS and p.batch <= MAX_GRID_Y


def space(p: problems.Dense, machine) -> Space:
    contiguous = p.k if p.trans_b else p.n
    return Space("cuda_gemv", GemvConfig, {
        "cols": (4, 8, 16, 32, 64), "k_split": (1, 2, 4, 8, 16, 32, 64, 128, 256),
        "unroll": (1, 2, 4, 8), "vector": VECTORS,
    }, [Constraint("vector divides cols and B's contiguous dimension (n; k with transB)",
                   lambda c: c.cols % c.vector == 0 and contiguous % c.vector == 0),
        Constraint("32 <= threads (k_split x cols, / vector with B [k, n]) <= 1024",
                   lambda c: c.cols % c.vector == 0 and 32 <= threads(p, c) <= 1024),
        Constraint("partial sums (rows x k_split x cols) fit 48 KiB of shared memory",
                   lambda c: p.m * c.k_split * c.cols <= SHARED_FLOATS)])


def default(p: problems.Dense, machine) -> GemvConfig:
    """Loads of B coalesced and 128 bits wide, and blocks enough to keep every SM reading:
    the widest `vector` dividing B's contiguous dimension, 8 columns a block (B [k, n]: a
    warp reads 16 rows of 8 consecutive floats, whole 32-byte sectors; B [n, k]: a warp
    reads 128 consecutive k of one column), 4 columns where 8 would leave SMs idle (B [n, k]
    only: its reads stay whole), BLOCK_THREADS threads (fewer where k has not that many
    steps), each step's loads in flight up to 8, within the shared memory the rows'
    partials need; from LONG_K deep, LONG_K_THREADS threads (256 along k), 4 columns where
    8 rows' partials would not fit 8. On an H200 (bench/gpu_kernels.py --graphs, weights
    L2-resident), against ff7e5e0's default (a float a step, 32 threads along k: an element
    of A read served one column, 8 loads of A a load of B at 8 rows): 1 x 768 x 768 2.4 us
    (3.1), 1 x 768 x 3072 3.8 (4.7), 8 x 768 x 768 4.8 (7.5), 8 x 768 x 2304 8.1 (9.2);
    k = 3072 (gpt2's second MLP product) took 5.4 (10.5) at 1 row and 9.8 (22.8) at 8 with
    256 threads; 4.4 with 512 threads unrolled 4 (the default unrolls 8 there: untimed),
    8.0 in 4 columns of 256 threads (the default at 8 rows)."""
    contiguous = p.k if p.trans_b else p.n
    vec = max(v for v in VECTORS if contiguous % v == 0)
    cols = 8
    if p.trans_b and -(-p.n // cols) * p.batch < gpu_of(machine).sms:
        cols = 4
    c = GemvConfig(cols, 1, 1, vec)
    step_k = vec if p.trans_b else 1
    block = LONG_K_THREADS if p.k >= LONG_K else BLOCK_THREADS
    ks = min(block // across(p, c), max(-(-WARP // across(p, c)), _pow2(-(-p.k // step_k))))
    if p.k >= LONG_K:   # (the threads along k kept, the columns halved, where rows' partials
        #                 would not fit: 8 x 3072 x 768 in 4 columns of 256 threads)
        while ks * cols * p.m > SHARED_FLOATS and cols > max(4, vec):
            cols //= 2
    while ks * cols * p.m > SHARED_FLOATS and ks > 8:
        ks //= 2
    steps = -(-p.k // (ks * step_k))
    return GemvConfig(cols, ks, min(8, _pow2(steps)), vec)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def build(p: problems.Dense, c: GemvConfig, machine) -> L.PrimFunc:
    a = L.Buffer(p.a.name, p.a.dtype, p.a_dims)
    b = L.Buffer(p.b.name, p.b.dtype, (p.batch if p.b_batched else 1,) +
                 ((p.n, p.k) if p.trans_b else (p.k, p.n)))
    y = L.Buffer(p.y.name, p.y.dtype, (p.batch, p.m, p.n))
    y_full = L.Buffer(p.y.name, p.y.dtype, p.y_dims)
    m, n, k = p.m, p.n, p.k
    cols, ks, vec, nt = c.cols, c.k_split, c.vector, threads(p, c)
    wide = across(p, c)
    per_col = 1 if p.trans_b else vec      # columns a thread
    step_k = vec if p.trans_b else 1       # k a thread's step takes
    bi, bx, t, i = L.Var("bi"), L.Var("bx"), L.Var("t"), L.Var("i")
    g, s, j, v = L.Var("g"), L.Var("s"), L.Var("j"), L.Var("v")
    kk, u, k0, r = L.Var("kk"), L.Var("u"), L.Var("k0"), L.Var("r")
    col, av = L.Var("col"), L.Var("av", T.float32)
    partial = L.Buffer("partial", T.float32, (m * cols * ks,), L.Scope.SHARED)
    acc = L.Buffer("acc", T.float32, (m * per_col,), L.Scope.LOCAL)
    bvec = L.Buffer("bvec", b.dtype, (vec,), L.Scope.LOCAL)
    avec = L.Buffer("avec", a.dtype, (vec,), L.Scope.LOCAL)
    total = L.Buffer("total", T.float32, (1,), L.Scope.LOCAL)
    zero = L.const(0.0, T.float32)
    bb = bi if p.b_batched else L.const(0)

    def a_at(row, kx):
        return a[p.a_index(bi, row, kx)]

    def unrolled(var, extent, body):
        return L.For(var, extent, body, L.ForKind.UNROLLED)

    def copy(buffer, element):
        """`buffer[v] = element(v)` for v < vector: one vector load where aligned."""
        return L.For(v, vec, L.Store(buffer, (v,), element(v)), L.ForKind.VECTORIZED)

    def place(body):
        """A thread's columns and k residue: consecutive threads along B's contiguous
        dimension."""
        first, second = (t // ks, t % ks) if p.trans_b else (t % wide, t // wide)
        return L.Let(g, first, L.Let(s, second, L.Let(j, bx * cols + g * per_col, body)))

    if p.trans_b:   # a column, `vector` consecutive k of B and of A's rows
        products = L.seq(copy(bvec, lambda x: b[bb, j, k0 + x]), unrolled(i, m, L.seq(
            copy(avec, lambda x: a_at(i, k0 + x)),
            unrolled(v, vec, L.Store(acc, (i,), L.call(
                "fma", problems.widened(avec[v]), problems.widened(bvec[v]), acc[i]))))))
    else:           # `vector` consecutive columns of B, each read of A serving them all
        products = L.seq(copy(bvec, lambda x: b[bb, k0, j + x]), unrolled(i, m, L.Let(
            av, problems.widened(a_at(i, k0)), unrolled(v, vec, L.Store(
                acc, (i * vec + v,), L.call("fma", av, problems.widened(bvec[v]),
                                            acc[i * vec + v]))))))
    step = L.Let(k0, ((kk * c.unroll + u) * ks + s) * step_k,
                 L.If(L.logical_and(k0 < k, j < n), products))
    slots = m * per_col
    accumulate = L.For(t, nt, place(L.seq(
        unrolled(i, slots, L.Store(acc, (i,), zero)),
        L.For(kk, -(-k // (ks * step_k * c.unroll)), unrolled(u, c.unroll, step)),
        unrolled(i, m, unrolled(v, per_col, L.Store(
            partial, (((i * cols) + g * per_col + v) * ks + s,), acc[i * per_col + v]))))),
        L.ForKind.THREAD_X)
    body = L.Allocate(partial, L.Allocate(acc, L.Allocate(bvec, L.Allocate(
        avec, L.Allocate(total, L.seq(accumulate, L.Barrier(), *_finish(
            p, c, partial, total, t, bi, bx, r, col, j, y, y_full)))))))
    out = L.For(bi, p.batch, L.For(bx, -(-n // cols), body, L.ForKind.BLOCK_X),
                L.ForKind.BLOCK_Y)
    views: dict[str, L.Buffer] = {}
    for x in (a, b, y if p.store_index is None else y_full, p.c):
        if x is not None:
            views.setdefault(x.name, x)   # A first, should A also be B
    return L.PrimFunc(p.name, tuple(views.get(x.name, x) for x in p.params), out)


def _finish(p: problems.Dense, c: GemvConfig, partial, total, t, bi, bx, r, col, j, y,
            y_full) -> list[L.Stmt]:
    """Thread loops summing each output's k_split partials (`finish_lanes` threads an
    output, combined by a butterfly of shuffles) and storing it through the epilogue."""
    m, n, cols, ks, nt = p.m, p.n, c.cols, c.k_split, threads(p, c)
    lanes = finish_lanes(p, c)
    outputs = cols * m   # (with lanes > 1, nt // lanes groups cover them all)
    e, q, w, lane = L.Var("e"), L.Var("q"), L.Var("w"), L.Var("lane")
    zero = L.const(0.0, T.float32)

    def output(body):
        """`body` for output e (row r, column j) of the block, where it exists."""
        return L.If(e < outputs, L.Let(col, e % cols, L.Let(r, e // cols, L.Let(
            j, bx * cols + col, L.If(j < n, body)))))

    def store(row, value):
        target = y[bi, row, j] if p.store_index is None else \
            y_full[p.store_index(p.anchor_index(bi, row, j))]
        return L.Store(target.buffer, target.indices, p.finish(value, bi, row, j))

    share = ks // lanes
    add = L.For(w, share, L.Store(total, (0,), total[0] + partial[
        (r * cols + col) * ks + w * lanes + lane]),
        L.ForKind.UNROLLED if share <= 32 else L.ForKind.SERIAL)
    if lanes == 1:
        return [L.For(t, nt, L.For(q, -(-outputs // nt), L.Let(e, q * nt + t, L.Let(
            lane, L.const(0), output(L.seq(L.Store(total, (0,), zero), add,
                                           store(r, total[0])))))), L.ForKind.THREAD_X)]

    def on_threads(body):
        return L.For(t, nt, L.Let(e, t // lanes, L.Let(lane, t % lanes, body)),
                     L.ForKind.THREAD_X)

    out = [on_threads(L.seq(L.Store(total, (0,), zero), output(add)))]
    mask = lanes // 2
    while mask:   # (every lane takes part in a shuffle: outside the If)
        out.append(on_threads(L.Store(total, (0,), total[0] + L.call(
            "shfl_xor", total[0], L.const(mask, T.int32)))))
        mask //= 2
    out.append(on_threads(L.If(L.eq(lane, 0), output(store(r, total[0])))))
    return out


GEMV = Template("cuda_gemv", problems.dense, applies, space, default, build)
