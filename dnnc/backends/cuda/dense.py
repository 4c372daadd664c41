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

Not yet: double buffering, vector loads, tensor cores.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class DenseConfig:
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    thread_m: int = 4
    thread_n: int = 4

    @property
    def threads(self) -> int:
        return (self.tile_m // self.thread_m) * (self.tile_n // self.thread_n)


def space(p: problems.Dense, machine) -> Space:
    return Space("cuda_dense", DenseConfig, {
        "tile_m": (16, 32, 64, 128), "tile_n": (32, 64, 128), "tile_k": (8, 16, 32),
        "thread_m": (1, 2, 4, 8), "thread_n": (1, 2, 4, 8),
    }, [Constraint("32 <= (tile_m / thread_m) * (tile_n / thread_n) <= 1024 threads",
                   lambda c: c.thread_m <= c.tile_m and 32 <= c.threads <= 1024)])


def default(p: problems.Dense, machine) -> DenseConfig:
    configs = [DenseConfig(*d) for d in DEFAULTS]
    for config in configs:
        if _blocks(p, config) >= MIN_BLOCKS:
            return config
    return configs[-1]


def _blocks(p: problems.Dense, c: DenseConfig) -> int:
    return -(-p.m // c.tile_m) * -(-p.n // c.tile_n) * p.batch


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
    k_loop = L.For(kt, -(-k // bk), L.seq(
        copy(a_tile, bm, row0, m, a), copy(b_tile, bn, col0, n, b), L.Barrier(), update,
        L.Barrier()))
    i, j = row0 + tm + ii * across_m, col0 + tn + jj * across_n
    done = per_thread(each(L.If(L.logical_and(i < m, j < n), store(bi, i, j, acc[slot]))))
    body = L.Allocate(a_tile, L.Allocate(b_tile, L.Allocate(acc, L.seq(init, k_loop, done))))
    return L.For(bi, batch, L.For(by, -(-m // bm), L.For(
        bx, -(-n // bn), body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y), L.ForKind.BLOCK_Z)


DENSE = Template("cuda_dense", problems.dense, applies, space, default, build)
