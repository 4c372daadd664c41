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
    bm, bk = c.tile_m, c.tile_k
    a = L.Buffer(p.a.name, T.float32, (p.batch, p.k, p.m) if p.trans_a else (p.batch, p.m, p.k))
    b = L.Buffer(p.b.name, T.float32, (p.batch if p.b_batched else 1,) +
                 ((p.n, p.k) if p.trans_b else (p.k, p.n)))
    y = L.Buffer(p.y.name, p.y.dtype, (p.batch, p.m, p.n))
    y_full = L.Buffer(p.y.name, p.y.dtype, p.y_dims)
    bi, by, bx, kt = L.Var("bi"), L.Var("by"), L.Var("bx"), L.Var("kt")
    threads = c.threads
    across_m, across_n = c.tile_m // c.thread_m, c.tile_n // c.thread_n
    a_tile = L.Buffer("a_tile", T.float32, (bk * bm,), L.Scope.SHARED)
    b_tile = L.Buffer("b_tile", T.float32, (bk * c.tile_n,), L.Scope.SHARED)
    acc = L.Buffer("acc", T.float32, (c.thread_m * c.thread_n,), L.Scope.LOCAL)
    row0, col0, k0 = by * bm, bx * c.tile_n, kt * bk
    bb = bi if p.b_batched else L.const(0)

    def copy(tile, rows, contiguous_rows, load):
        """tile[kk * rows + r] = operand at (k0 + kk, r) for a bk x rows slice, consecutive
        threads walking the operand's contiguous dimension."""
        t, e = L.Var("t"), L.Var("e")
        count = bk * rows
        steps = -(-count // threads)
        if contiguous_rows:   # the slice's rows are contiguous in memory: r fastest
            r, kk = e % rows, e // rows
        else:
            r, kk = e // bk, e % bk
        body = L.Store(tile, (kk * rows + r,), load(r, kk))
        if steps * threads > count:
            body = L.If(e < count, body)
        return L.For(t, threads, L.For(L.Var("l"), steps, L.Let(
            e, L.Var("l") * threads + t, body), L.ForKind.UNROLLED), L.ForKind.THREAD_X)

    def a_value(r, kk):
        i, k = row0 + r, k0 + kk
        ci, ck = L.minimum(i, p.m - 1), L.minimum(k, p.k - 1)
        value = a[bi, ck, ci] if p.trans_a else a[bi, ci, ck]
        return L.Select(L.logical_and(i < p.m, k < p.k), value, L.const(0.0, T.float32))

    def b_value(r, kk):
        j, k = col0 + r, k0 + kk
        cj, ck = L.minimum(j, p.n - 1), L.minimum(k, p.k - 1)
        value = b[bb, cj, ck] if p.trans_b else b[bb, ck, cj]
        return L.Select(L.logical_and(j < p.n, k < p.k), value, L.const(0.0, T.float32))

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
        "fma", a_tile[kk * bm + tm + ii * across_m],
        b_tile[kk * c.tile_n + tn + jj * across_n], acc[slot]))), L.ForKind.UNROLLED))
    k_loop = L.For(kt, -(-p.k // bk), L.seq(
        copy(a_tile, bm, p.trans_a, a_value), copy(b_tile, c.tile_n, not p.trans_b, b_value),
        L.Barrier(), update, L.Barrier()))
    i, j = row0 + tm + ii * across_m, col0 + tn + jj * across_n
    if p.store_index is None:
        target = y[bi, i, j]
    else:
        target = y_full[p.store_index(p.anchor_index(bi, i, j))]
    store = per_thread(each(L.If(L.logical_and(i < p.m, j < p.n), L.Store(
        target.buffer, target.indices, p.finish(acc[slot], bi, i, j)))))
    body = L.Allocate(a_tile, L.Allocate(b_tile, L.Allocate(acc, L.seq(init, k_loop, store))))
    grid = L.For(bi, p.batch, L.For(by, -(-p.m // bm), L.For(
        bx, -(-p.n // c.tile_n), body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y),
        L.ForKind.BLOCK_Z)
    views: dict[str, L.Buffer] = {}
    for x in (a, b, y if p.store_index is None else y_full, p.c):
        if x is not None:
            views.setdefault(x.name, x)   # A first, should A also be B
    params = tuple(views.get(x.name, x) for x in p.params)
    return L.PrimFunc(p.name, params, grid)


DENSE = Template("cuda_dense", problems.dense, applies, space, default, build)
