"""The cuda gemv template: matrix products with few rows (m < 16), split along k.

A product of one (or a few) rows — a classifier's fully connected layer at batch 1, an MLP —
has too few outputs for a thread each to fill the GPU, and a thread per output walks the
whole k serially. Here a block computes `cols` consecutive columns of every row: its
`cols * k_split` threads each take one column and one residue class of k (k = s, s +
k_split, ...), accumulating all m rows in registers, `unroll` k steps at a time (independent
loads in flight). B is read coalesced either way: with B [k, n] (columns contiguous)
consecutive threads take consecutive columns; with B [n, k] (`trans_b`, Gemm's usual
weights) consecutive threads take consecutive k of one column. The partial sums meet in
shared memory; after a barrier, a thread per (row, column) adds its `k_split` partials,
applies Gemm's scaling and bias and the fused epilogue (`Dense.finish`) and stores through
the layout tail, if any. Float16 and bfloat16 operands are widened to float32 as they are
read: fp32 arithmetic whatever the storage.
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


@dataclass(frozen=True)
class GemvConfig:
    cols: int = 32       # columns per block
    k_split: int = 8     # threads per column, each a residue class of k
    unroll: int = 4      # k steps per iteration of a thread's loop

    @property
    def threads(self) -> int:
        return self.cols * self.k_split


def applies(p: problems.Dense) -> bool:
    return not p.packed_panel and p.m < MAX_ROWS and p.batch <= MAX_GRID_Y


def space(p: problems.Dense, machine) -> Space:
    return Space("cuda_gemv", GemvConfig, {
        "cols": (4, 8, 16, 32, 64), "k_split": (1, 2, 4, 8, 16, 32, 64), "unroll": (1, 2, 4, 8),
    }, [Constraint("32 <= cols * k_split <= 1024 threads",
                   lambda c: 32 <= c.threads <= 1024),
        Constraint("partial sums (threads * rows) fit 48 KiB of shared memory",
                   lambda c: c.threads * p.m <= SHARED_FLOATS)])


def default(p: problems.Dense, machine) -> GemvConfig:
    """Loads of B coalesced, and blocks enough to keep every SM reading: 8 columns a block
    (B [k, n]: a warp reads 4 rows of 8 consecutive floats, whole 32-byte sectors; B [n, k]:
    a warp reads 32 consecutive k of one column), 32 threads along k (64 past k = 1024), 4
    columns a block where 8 would leave SMs idle (B [n, k] only: its reads stay whole), and
    8 k steps in flight a thread where its loop has that many, within the shared memory the
    rows' partials need. The previous default (B [k, n]: 32 columns a block, 8 along k; 4
    steps in flight) gave gpt2's decode products 24 to 96 blocks on an H200's 132 SMs:
    768 x 768 at batch 1 took 18 us against cuBLAS's 2.3 (torch.profiler, a decode step)."""
    cols, k_split = 8, (32 if p.k <= 1024 else 64)
    if p.trans_b and -(-p.n // cols) * p.batch < gpu_of(machine).sms:
        cols = 4
    while cols * k_split * p.m > SHARED_FLOATS and k_split > 8:
        k_split //= 2
    while cols * k_split * p.m > SHARED_FLOATS:
        cols //= 2
    return GemvConfig(cols, k_split, 8 if p.k >= 8 * k_split else 4)


def build(p: problems.Dense, c: GemvConfig, machine) -> L.PrimFunc:
    a = L.Buffer(p.a.name, p.a.dtype, p.a_dims)
    b = L.Buffer(p.b.name, p.b.dtype, (p.batch if p.b_batched else 1,) +
                 ((p.n, p.k) if p.trans_b else (p.k, p.n)))
    y = L.Buffer(p.y.name, p.y.dtype, (p.batch, p.m, p.n))
    y_full = L.Buffer(p.y.name, p.y.dtype, p.y_dims)
    m, n, k = p.m, p.n, p.k
    cols, ks, threads = c.cols, c.k_split, c.threads
    bi, bx, t, i = L.Var("bi"), L.Var("bx"), L.Var("t"), L.Var("i")
    col, s, j = L.Var("col"), L.Var("s"), L.Var("j")
    kk, u, kg, r = L.Var("kk"), L.Var("u"), L.Var("kg"), L.Var("r")
    bv = L.Var("bv", T.float32)
    partial = L.Buffer("partial", T.float32, (threads * m,), L.Scope.SHARED)
    acc = L.Buffer("acc", T.float32, (m,), L.Scope.LOCAL)
    total = L.Buffer("total", T.float32, (1,), L.Scope.LOCAL)
    zero = L.const(0.0, T.float32)

    def a_at(row, kx):
        return problems.widened(a[p.a_index(bi, row, kx)])

    def b_at(jx, kx):
        bb = bi if p.b_batched else L.const(0)
        return problems.widened(b[bb, jx, kx] if p.trans_b else b[bb, kx, jx])

    def rows(body):
        return L.For(i, m, body, L.ForKind.UNROLLED)

    def place(body):
        """A thread's column and k residue: consecutive threads along B's contiguous
        dimension."""
        first, second = (t // ks, t % ks) if p.trans_b else (t % cols, t // cols)
        return L.Let(col, first, L.Let(s, second, L.Let(j, bx * cols + col, body)))

    step = L.Let(kg, (kk * c.unroll + u) * ks + s, L.If(
        L.logical_and(kg < k, j < n),
        L.Let(bv, b_at(j, kg), rows(L.Store(acc, (i,), L.call(
            "fma", a_at(i, kg), bv, acc[i]))))))
    accumulate = L.For(t, threads, place(L.seq(
        rows(L.Store(acc, (i,), zero)),
        L.For(kk, -(-k // (ks * c.unroll)), L.For(u, c.unroll, step, L.ForKind.UNROLLED)),
        rows(L.Store(partial, ((i * ks + s) * cols + col,), acc[i])))), L.ForKind.THREAD_X)

    def store(row, value):
        target = y[bi, row, j] if p.store_index is None else \
            y_full[p.store_index(p.anchor_index(bi, row, j))]
        return L.Store(target.buffer, target.indices, p.finish(value, bi, row, j))

    e, q = L.Var("e"), L.Var("q")
    finish = L.For(t, threads, L.For(q, -(-(cols * m) // threads), L.Let(
        e, q * threads + t, L.If(e < cols * m, L.Let(col, e % cols, L.Let(
            r, e // cols, L.Let(j, bx * cols + col, L.If(j < n, L.seq(
                L.Store(total, (0,), zero),
                L.For(s, ks, L.Store(total, (0,), total[0] +
                                     partial[(r * ks + s) * cols + col]),
                      L.ForKind.UNROLLED if ks <= 8 else L.ForKind.SERIAL),
                store(r, total[0]))))))))), L.ForKind.THREAD_X)
    body = L.Allocate(partial, L.Allocate(acc, L.Allocate(total, L.seq(
        accumulate, L.Barrier(), finish))))
    out = L.For(bi, p.batch, L.For(bx, -(-n // cols), body, L.ForKind.BLOCK_X),
                L.ForKind.BLOCK_Y)
    views: dict[str, L.Buffer] = {}
    for x in (a, b, y if p.store_index is None else y_full, p.c):
        if x is not None:
            views.setdefault(x.name, x)   # A first, should A also be B
    return L.PrimFunc(p.name, tuple(views.get(x.name, x) for x in p.params), out)


GEMV = Template("cuda_gemv", problems.dense, applies, space, default, build)
