"""The cuda dense template: batched matrix products tiled in shared memory, register-blocked.

A block computes a `tile_m` x `tile_n` tile of Y (blockIdx.y: row tiles, blockIdx.x: column
tiles, blockIdx.z: the batch) with (tile_m / thread_m) x (tile_n / thread_n) threads, each
accumulating a thread_m x thread_n block in registers. The k dimension goes in slices of
`tile_k`: the block's threads copy the A and B slices into shared memory (consecutive threads
read consecutive elements of the operand's contiguous dimension; out-of-range elements read
as 0 through a clamped load), a barrier, every thread does tile_k rank-1 updates of its block
from shared memory (unrolled fused multiply-adds), a barrier. A thread's rows are
`tm, tm + tile_m / thread_m, ...` and its columns `tn, tn + tile_n / thread_n, ...`, so that
a warp reads consecutive shared words (no bank conflicts) and stores consecutive columns.
The product's element then goes through Gemm's scaling and bias and the fused epilogue
(`Dense.finish`) and is stored through the layout tail, if any.

With `split_k` > 1 (products whose m x n tiles are too few to fill the GPU, as bert's
128-row projections or resnet50's last convolutions at batch 1), blockIdx.z runs over (batch,
k slice): each block sums its slice's k tiles into a global workspace of partial products,
and a second launch, a thread per output, adds the slices and stores as above. The default
config (`choose`) weighs the DEFAULTS tiles and splits with a rough model of their speed.

Not yet: double buffering, vector loads, tensor cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Constraint, Space, Template

# the fewest blocks a default config aims for: two per SM of an H100 (132 SMs)
MIN_BLOCKS = 264
# (tile_m, tile_n, tile_k, thread_m, thread_n) a default tries, largest first: 128 x 128 with
# 8 x 8 per thread is the classic SGEMM blocking (64 accumulators, 256 threads)
DEFAULTS = ((128, 128, 8, 8, 8), (64, 64, 16, 4, 4), (32, 64, 16, 2, 4), (32, 32, 16, 2, 2),
            (16, 32, 16, 1, 2))
MAX_GRID_YZ = 65535
SPLITS = (1, 2, 4, 8, 16)
MIN_SPLIT_K = 128    # the least k a split-k default gives one slice
# the default's model (`choose`), from H100 measurements: fp32 FMA peak, device copy
# bandwidth (GPU.md), a launch in a CUDA graph, and each DEFAULTS tile's fraction of peak
FP32_FLOPS = 51e12
COPY_BYTES_PER_S = 2.9e12
LAUNCH_S = 2e-6
EFFICIENCY = (0.5, 0.3, 0.22, 0.15, 0.08)


@dataclass(frozen=True)
class DenseConfig:
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    thread_m: int = 4
    thread_n: int = 4
    split_k: int = 1     # k slices summed by a second launch (fills the GPU when m n is small)

    @property
    def threads(self) -> int:
        return (self.tile_m // self.thread_m) * (self.tile_n // self.thread_n)


def space(p: problems.Dense, machine) -> Space:
    return product_space("cuda_dense", p.k, p.batch)


def product_space(name: str, k: int, batch: int) -> Space:
    """The knobs of a tiled product of depth `k`, `batch` of them (dense and conv)."""
    return Space(name, DenseConfig, {
        "tile_m": (16, 32, 64, 128), "tile_n": (32, 64, 128), "tile_k": (8, 16, 32),
        "thread_m": (1, 2, 4, 8), "thread_n": (1, 2, 4, 8), "split_k": SPLITS,
    }, [Constraint("32 <= (tile_m / thread_m) * (tile_n / thread_n) <= 1024 threads",
                   lambda c: c.thread_m <= c.tile_m and 32 <= c.threads <= 1024),
        Constraint("split_k at most the k tiles, batch * split_k blocks on grid z",
                   lambda c: c.split_k <= -(-k // c.tile_k) and batch * c.split_k <= MAX_GRID_YZ)])


def default(p: problems.Dense, machine) -> DenseConfig:
    return choose(p.m, p.n, p.k, p.batch)


def choose(m: int, n: int, k: int, batch: int = 1) -> DenseConfig:
    """The default config of an m x n x k product (`batch` of them): of the DEFAULTS tiles,
    each with k unsplit or split into slices at least MIN_SPLIT_K deep, the one a rough model
    says is fastest: the product's time at the tiles' measured efficiency (EFFICIENCY),
    slowed where its blocks cannot fill the GPU (fewer than MIN_BLOCKS), plus a split's cost
    (the partial sums written and read, one more launch)."""
    best, best_time = None, math.inf
    for dims, efficiency in zip(DEFAULTS, EFFICIENCY):
        for split in SPLITS:
            if split > 1 and (k < split * MIN_SPLIT_K or batch * split > MAX_GRID_YZ):
                break
            config = DenseConfig(*dims, split_k=split)
            fill = min(1.0, _blocks(m, n, batch, config) * split / MIN_BLOCKS)
            seconds = 2 * m * n * k * batch / (FP32_FLOPS * efficiency * fill)
            if split > 1:
                seconds += 8 * m * n * batch * split / COPY_BYTES_PER_S + LAUNCH_S
            if seconds < best_time:
                best, best_time = config, seconds
    return best


def _blocks(m: int, n: int, batch: int, c: DenseConfig) -> int:
    return -(-m // c.tile_m) * -(-n // c.tile_n) * batch


def applies(p: problems.Dense) -> bool:
    # packed B panels are the llvm layout; a matrix-vector product keeps one thread per
    # output (a 16-row tile would idle most threads)
    return not p.packed_panel and p.m >= 16 and p.batch <= MAX_GRID_YZ and \
        -(-p.m // 16) <= MAX_GRID_YZ


def build(p: problems.Dense, c: DenseConfig, machine) -> L.PrimFunc:
    a = L.Buffer(p.a.name, T.float32, (p.batch, p.k, p.m) if p.trans_a else (p.batch, p.m, p.k))
    b = L.Buffer(p.b.name, T.float32, (p.batch if p.b_batched else 1,) +
                 ((p.n, p.k) if p.trans_b else (p.k, p.n)))
    y = L.Buffer(p.y.name, p.y.dtype, (p.batch, p.m, p.n))
    y_full = L.Buffer(p.y.name, p.y.dtype, p.y_dims)

    def a_at(bi, i, k):
        return a[bi, k, i] if p.trans_a else a[bi, i, k]

    def b_at(bi, j, k):
        bb = bi if p.b_batched else L.const(0)
        return b[bb, j, k] if p.trans_b else b[bb, k, j]

    def store(bi, i, j, value):
        target = y[bi, i, j] if p.store_index is None else \
            y_full[p.store_index(p.anchor_index(bi, i, j))]
        return L.Store(target.buffer, target.indices, p.finish(value, bi, i, j))

    body = tiled_product(c, p.batch, p.m, p.n, p.k, Operand(a_at, p.trans_a),
                         Operand(b_at, not p.trans_b), store)
    views: dict[str, L.Buffer] = {}
    for x in (a, b, y if p.store_index is None else y_full, p.c):
        if x is not None:
            views.setdefault(x.name, x)   # A first, should A also be B
    return L.PrimFunc(p.name, tuple(views.get(x.name, x) for x in p.params), body)


@dataclass(frozen=True)
class Operand:
    """How a tiled product reads one operand: `at(bi, row, k)` its element (row: i of A, j of
    B; indices in range), and whether consecutive rows are consecutive in memory (else
    consecutive k are): the copy into shared memory walks that dimension fastest."""

    at: Callable[[L.Expr, L.Expr, L.Expr], L.Expr]
    rows_contiguous: bool


def tiled_product(c: DenseConfig, batch: int, m: int, n: int, k: int, a: Operand,
                  b: Operand, store: Callable) -> L.Stmt:
    """The blocks, threads and loops of Y[bi, i, j] = sum_k A[bi, i, k] B[bi, k, j] (see the
    module's docstring); `store(bi, i, j, value)` is the statement storing an element."""
    bm, bn, bk = c.tile_m, c.tile_n, c.tile_k
    bi, by, bx, kt = L.Var("bi"), L.Var("by"), L.Var("bx"), L.Var("kt")
    threads = c.threads
    across_m, across_n = bm // c.thread_m, bn // c.thread_n
    a_tile = L.Buffer("a_tile", T.float32, (bk * bm,), L.Scope.SHARED)
    b_tile = L.Buffer("b_tile", T.float32, (bk * bn,), L.Scope.SHARED)
    acc = L.Buffer("acc", T.float32, (c.thread_m * c.thread_n,), L.Scope.LOCAL)
    row0, col0, k0 = by * bm, bx * bn, kt * bk

    def copy(tile: L.Buffer, rows: int, first: L.Expr, extent: int, operand: Operand):
        """tile[kk * rows + r] = the operand at (first + r, k0 + kk) for a bk x rows slice
        (0 past the operand's extent or k), consecutive threads walking its contiguous
        dimension."""
        t, e, step = L.Var("t"), L.Var("e"), L.Var("l")
        count = bk * rows
        steps = -(-count // threads)
        r, kk = (e % rows, e // rows) if operand.rows_contiguous else (e // bk, e % bk)
        row, kg = first + r, k0 + kk
        value = operand.at(bi, L.minimum(row, extent - 1), L.minimum(kg, k - 1))
        body = L.Store(tile, (kk * rows + r,), L.Select(
            L.logical_and(row < extent, kg < k), value, L.const(0.0, T.float32)))
        if steps * threads > count:
            body = L.If(e < count, body)
        return L.For(t, threads, L.For(step, steps, L.Let(e, step * threads + t, body),
                                       L.ForKind.UNROLLED), L.ForKind.THREAD_X)

    t, kk, ii, jj = L.Var("t"), L.Var("kk"), L.Var("ii"), L.Var("jj")
    tm, tn = L.Var("tm"), L.Var("tn")

    def per_thread(body):
        """`body` on every thread, with its row and column offsets tm and tn."""
        return L.For(t, threads, L.Let(tm, t // across_n, L.Let(tn, t % across_n, body)),
                     L.ForKind.THREAD_X)

    def each(body):
        return L.For(ii, c.thread_m, L.For(jj, c.thread_n, body, L.ForKind.UNROLLED),
                     L.ForKind.UNROLLED)

    slot = (ii * c.thread_n + jj,)
    init = per_thread(each(L.Store(acc, slot, L.const(0.0, T.float32))))
    update = per_thread(L.For(kk, bk, each(L.Store(acc, slot, L.call(
        "fma", a_tile[kk * bm + tm + ii * across_m], b_tile[kk * bn + tn + jj * across_n],
        acc[slot]))), L.ForKind.UNROLLED))
    slice_ = L.seq(copy(a_tile, bm, row0, m, a), copy(b_tile, bn, col0, n, b), L.Barrier(),
                   update, L.Barrier())
    i, j = row0 + tm + ii * across_m, col0 + tn + jj * across_n
    inside = L.logical_and(i < m, j < n)
    grid = (-(-m // bm), -(-n // bn))
    if c.split_k == 1:
        k_loop = L.For(kt, -(-k // bk), slice_)
        done = per_thread(each(L.If(inside, store(bi, i, j, acc[slot]))))
        body = L.Allocate(a_tile, L.Allocate(b_tile, L.Allocate(acc, L.seq(init, k_loop, done))))
        return L.For(bi, batch, L.For(by, grid[0], L.For(
            bx, grid[1], body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y), L.ForKind.BLOCK_Z)
    return _split_k(c, batch, m, n, k, grid, store, lambda bz, sk, partial: L.Let(
        bi, bz // c.split_k, L.Let(sk, bz % c.split_k, L.Allocate(a_tile, L.Allocate(
            b_tile, L.Allocate(acc, L.seq(init, _slices(c, k, kt, sk, slice_), per_thread(
                each(L.If(inside, L.Store(partial, (((sk * batch + bi) * m + i) * n + j,),
                                                   acc[slot])))))))))),
        (by, bx))


def _slices(c: DenseConfig, k: int, kt: L.Var, sk: L.Var, body: L.Stmt) -> L.Stmt:
    """The k tiles of slice `sk` of `c.split_k`, `body` run with `kt` the tile (a tile past
    k reads zeros: the copies clamp and select)."""
    per = -(-(-(-k // c.tile_k)) // c.split_k)
    step = L.Var("ks")
    return L.For(step, per, L.Let(kt, sk * per + step, body))


def _split_k(c: DenseConfig, batch: int, m: int, n: int, k: int, grid, store, block,
             tile_vars) -> L.Stmt:
    """Split-k as two launches over one workspace of `split_k` partial products: the tiled
    product with blockIdx.z over (batch, slice) writing its slice's partial sums (`block(bz,
    sk, partial)` is a block's body), then a thread per output adding the slices and storing
    through `store` (scaling, bias, epilogue, layout tail)."""
    by, bx = tile_vars
    bz, sk = L.Var("bz"), L.Var("sk")
    partial = L.Buffer("partial_sums", T.float32, (c.split_k * batch * m * n,), L.Scope.GLOBAL)
    products = L.For(bz, batch * c.split_k, L.For(by, grid[0], L.For(
        bx, grid[1], block(bz, sk, partial), L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y),
        L.ForKind.BLOCK_Z)
    total, threads = batch * m * n, 256
    ob, ot, e = L.Var("ob"), L.Var("ot"), L.Var("e")
    bi, i, j = e // (m * n), e // n % m, e % n
    value = partial[e]
    for s in range(1, c.split_k):
        value = value + partial[s * total + e]
    sums = L.For(ob, -(-total // threads), L.For(ot, threads, L.Let(
        e, ob * threads + ot, L.If(e < total, store(bi, i, j, value))), L.ForKind.THREAD_X),
        L.ForKind.BLOCK_X)
    return L.Allocate(partial, L.seq(products, sums))


DENSE = Template("cuda_dense", problems.dense, applies, space, default, build)
