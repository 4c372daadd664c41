"""The cuda DynamicQuantizeLinear (`cuda_dynamic_quantize`): x's range, scale and zero point
and every element quantized in one launch, as quantize_dynamic's files run one before each
integer product (BERT-base at batch 8: 48 of them).

x is read in chunks of `lanes` elements (one float4 where x's size is a multiple of 4),
`unroll` chunks a thread loaded into registers before any is used: the loads in flight
decide a kernel that moves bytes and does little else (4.3 TB/s times HBM's ~0.8 us latency
is ~3.4 MB in flight; 132 SMs x 1024 threads x 4 float4 is 8.6 MB; one float a thread at a
time was 0.5).

First the range, in pieces of `threads * unroll` chunks (a block's registers-full,
consecutive threads on consecutive chunks) that the blocks claim (an `L.ForKind.CLAIMED`
loop): a block takes the next piece no block has taken, meets its max and min, each
thread's running from 0 (the reference widens the range to include 0: the same result), by
a butterfly of shuffles across each warp and across the warps in shared memory, and writes
them to a workspace of partials; when no piece is left it waits until every piece is done.
That wait is a grid-wide barrier that cannot deadlock: a block waits only once every piece
has been taken, each by a block that was running when it took it and that finishes it
without waiting on anyone, so the wait ends however many blocks the GPU holds at once
(another stream's kernels, another model's launches, MPS, a graph replayed on a busy GPU:
blocks not yet started never hold a piece). The grid is not sized to what the GPU holds (no
occupancy argument, no cooperative launch): the host-thread shim, which runs one block
after another, passes the same kernel. Then every block reduces all partials itself (a few
hundred floats from L2) the same way, forms the scale and zero point as the reference does
(`quantized_problems.dynamic_scale`, `dynamic_zero_point`: max and min are exact in any
order, so the results are the reference's bit for bit), block 0's thread 0 stores them, and
its threads quantize their grid-strided share of x (read again, from L2; four uint8 results
a 32-bit store). Before, two launches (every block's share's partials, then every block the
whole range and its share); the generic lowering (`ir/ops/quant.py`'s stages) took 7
launches, 4 of them one block or one thread.

This module builds loop IR; it must never render C or launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ..quantized_problems import (DynamicQuantize, dynamic_quantize, dynamic_quantized,
                                  dynamic_scale, dynamic_zero_point)
from ..space import Space, Template
from .attention import _butterfly
from .device import gpu_of
from .threads import WARP


@dataclass(frozen=True)
class QuantizeConfig:
    """Knobs of cuda_dynamic_quantize: threads a block, blocks a SM (at most: no more than
    x's pieces), chunks a thread loads before using any (a piece's chunks a thread)."""

    threads: int = 256
    blocks_per_sm: int = 4
    unroll: int = 4


def space(p: DynamicQuantize, machine) -> Space:
    return Space("cuda_dynamic_quantize", QuantizeConfig,
                 {"threads": (128, 256, 512, 1024), "blocks_per_sm": (1, 2, 4, 8),
                  "unroll": (1, 2, 4, 8)}, [])


def default(p: DynamicQuantize, machine) -> QuantizeConfig:
    return QuantizeConfig()


def _lanes(p: DynamicQuantize) -> int:
    """Elements a chunk: a float4 where x's size allows (x is aligned, as every parameter)."""
    return 4 if p.size % 4 == 0 else 1


def _grid(p: DynamicQuantize, c: QuantizeConfig, machine) -> int:
    """Blocks of the launch: blocks_per_sm a SM, fewer where x has fewer pieces (a block's
    registers-full of chunks, `_Launch.piece`)."""
    pieces = -(-(p.size // _lanes(p)) // (c.threads * c.unroll))
    return max(1, min(c.blocks_per_sm * gpu_of(machine).sms, pieces))


class _Launch:
    """What the range and the quantization share: the block and thread variables, a
    thread's running max and min (`run`), the block's warps' (`hi`, `lo` in shared memory),
    the chunk registers."""

    def __init__(self, p: DynamicQuantize, c: QuantizeConfig, blocks: int):
        f32 = T.float32
        self.c, self.blocks = c, blocks
        self.lanes = _lanes(p)
        self.chunks = p.size // self.lanes
        self.warps = -(-c.threads // WARP)
        self.x = L.Buffer(p.x.name, f32, (p.size,))
        self.b, self.t = L.Var("b"), L.Var("t")
        self.run = L.Buffer("dq_run", f32, (2,), L.Scope.LOCAL)
        self.regs = L.Buffer("dq_x", f32, (c.unroll * self.lanes,), L.Scope.LOCAL)
        self.ahead = L.Buffer("dq_ahead", f32, (c.unroll * self.lanes,), L.Scope.LOCAL)
        self.hi = L.Buffer("dq_hi", f32, (self.warps,), L.Scope.SHARED)
        self.lo = L.Buffer("dq_lo", f32, (self.warps,), L.Scope.SHARED)

    def on_threads(self, body: L.Stmt) -> L.Stmt:
        return L.For(self.t, self.c.threads, body, L.ForKind.THREAD_X)

    def widen(self, top: L.Expr, bottom: L.Expr) -> L.Stmt:
        run = self.run
        return L.seq(L.Store(run, (0,), L.maximum(run[0], top)),
                     L.Store(run, (1,), L.minimum(run[1], bottom)))

    def _chunks(self, index, body) -> L.Stmt:
        """`body(chunk, u)` for the thread's `unroll` chunks `index(u)`."""
        u, chunk = L.Var("u"), L.Var("chunk")
        return L.For(u, self.c.unroll, L.Let(chunk, index(u), body(chunk, u)),
                     L.ForKind.UNROLLED)

    def load(self, index, regs: L.Buffer) -> L.Stmt:
        """The thread's chunks `index(u)` into `regs` (zeros past x's end: 0 is in the range
        already)."""
        lanes, v = self.lanes, L.Var("v")
        return self._chunks(index, lambda chunk, u: L.If(
            chunk < self.chunks,
            L.For(v, lanes, L.Store(regs, (u * lanes + v,), self.x[chunk * lanes + v]),
                  L.ForKind.VECTORIZED),
            L.For(v, lanes, L.Store(regs, (u * lanes + v,), L.const(0.0)),
                  L.ForKind.UNROLLED)))

    def loaded(self, index, each, regs: L.Buffer) -> L.Stmt:
        """The thread's chunks `index(u)` loaded into `regs`, all before any is used, then
        `each(chunk, lane, regs)` (the chunk's index, its first register) for each."""
        return L.seq(self.load(index, regs), self._chunks(
            index, lambda chunk, u: each(chunk, u * self.lanes, regs)))

    def share(self, g) -> callable:
        """Chunk u of group `g` of the thread's share of x (grid-strided)."""
        c = self.c
        return lambda u: (g * c.unroll + u) * self.blocks * c.threads + self.b * c.threads + \
            self.t

    def ahead_of_time(self) -> L.Stmt:
        """The first group of the thread's share loaded into `ahead` (before the range: its
        loads then wait on nothing the range does)."""
        return self.load(self.share(0), self.ahead)

    def shares(self, each) -> L.Stmt:
        """`each` over the thread's share of x, `unroll` chunks at a time: the first group
        from `ahead` (`ahead_of_time`), the others loaded into `regs` (`loaded`)."""
        c, g = self.c, L.Var("g")
        groups = -(-self.chunks // (self.blocks * c.threads * c.unroll))
        first = self._chunks(self.share(0), lambda chunk, u: each(chunk, u * self.lanes,
                                                                   self.ahead))
        rest = L.For(g, groups - 1, self.loaded(self.share(g + 1), each, self.regs)) \
            if groups > 1 else None
        return L.seq(*[s for s in (first, rest) if s is not None])

    def piece(self, q: L.Expr, each) -> L.Stmt:
        """The thread's chunks of piece `q` (`threads * unroll` consecutive chunks, a block's
        registers-full), consecutive threads on consecutive chunks (`loaded`)."""
        c = self.c
        return self.loaded(lambda u: (q * c.unroll + u) * c.threads + self.t, each, self.regs)

    @property
    def pieces(self) -> int:
        return -(-self.chunks // (self.c.threads * self.c.unroll))

    def block_range(self, own: L.Stmt, after) -> L.Stmt:
        """Each thread's range from 0 (`own` widens `run`), met across the block: a butterfly
        of shuffles in each warp, its first lane's result into `hi` / `lo`, a barrier, then
        every thread the block's max and min from the warps', and `after(top, bottom)`."""
        run, hi, lo, t = self.run, self.hi, self.lo, self.t
        zero = L.const(0.0)
        w = L.Var("w")
        steps = [self.on_threads(L.seq(L.Store(run, (0,), zero), L.Store(run, (1,), zero),
                                       own))]
        steps += [self.on_threads(s) for pair in zip(_butterfly(run, (0,), "max", WARP),
                                                     _butterfly(run, (1,), "min", WARP))
                  for s in pair]
        steps += [self.on_threads(L.If(L.eq(t % WARP, 0), L.seq(
                      L.Store(hi, (t // WARP,), run[0]), L.Store(lo, (t // WARP,), run[1])))),
                  L.Barrier(),
                  self.on_threads(L.seq(L.For(w, self.warps, self.widen(hi[w], lo[w]),
                                              L.ForKind.UNROLLED),
                                        after(run[0], run[1])))]
        return L.Allocate(hi, L.Allocate(lo, L.Allocate(run, L.seq(*steps))))


def build(p: DynamicQuantize, c: QuantizeConfig, machine) -> L.PrimFunc:
    """The one launch of `p` (see the module's docstring)."""
    f32 = T.float32
    blocks = _grid(p, c, machine)
    k = _Launch(p, c, blocks)
    x, lanes, regs = k.x, k.lanes, k.regs
    pieces = k.pieces
    y = L.Buffer(p.y.name, T.uint8, (p.size,))
    out = L.Buffer("dq_y", T.uint8, (lanes,), L.Scope.LOCAL)
    parts = L.Buffer("dq_parts", f32, (2 * pieces,), L.Scope.GLOBAL)
    b, t, q, v, e = k.b, k.t, L.Var("q"), L.Var("v"), L.Var("e")
    first_thread = L.eq(t, L.const(0))

    def chunk_range(chunk, at, regs):
        lane = L.Var("lane")
        return L.For(lane, lanes, k.widen(regs[at + lane], regs[at + lane]), L.ForKind.UNROLLED)

    # the pieces claimed by the blocks: each piece's max and min into the partials
    def store_part(top, bottom):
        return L.If(first_thread, L.seq(L.Store(parts, (q,), top),
                                        L.Store(parts, (pieces + q,), bottom)))

    partials = L.For(q, pieces, k.block_range(k.piece(q, chunk_range), store_part),
                     L.ForKind.CLAIMED)

    # after them, every block: the whole range from the partials, then its share quantized
    scale, z = L.Var("scale", f32), L.Var("z", f32)
    from_parts = L.For(e, -(-pieces // c.threads), L.Let(v, e * c.threads + t, L.If(
        v < pieces, k.widen(parts[v], parts[pieces + v]))))

    def quantize(chunk, at, regs):
        """The chunk's results into registers, then one store (a uchar4: values from
        registers only, `codegen.vector_for`)."""
        lane = L.Var("lane")
        return L.If(chunk < k.chunks, L.seq(
            L.For(lane, lanes, L.Store(out, (lane,), L.Cast(
                T.uint8, dynamic_quantized(regs[at + lane], scale, z))), L.ForKind.UNROLLED),
            L.For(lane, lanes, L.Store(y, (chunk * lanes + lane,), out[lane]),
                  L.ForKind.VECTORIZED)))

    def finish(top, bottom):
        params = L.If(L.logical_and(L.eq(b, L.const(0)), first_thread), L.seq(
            L.Store(p.scale, (), scale), L.Store(p.zero_point, (), L.Cast(T.uint8, z))))
        return L.Let(scale, dynamic_scale(top, bottom), L.Let(
            z, dynamic_zero_point(bottom, scale), L.seq(params, k.shares(quantize))))

    whole = L.For(b, blocks, L.Allocate(regs, L.Allocate(k.ahead, L.Allocate(out, L.seq(
        k.on_threads(k.ahead_of_time()), partials, k.block_range(from_parts, finish))))),
        L.ForKind.BLOCK_X)
    views = {x.name: x, y.name: y}
    return L.PrimFunc(p.name, tuple(views.get(v.name, v) for v in p.params) +
                      (L.GRID_COUNTERS,), L.Allocate(parts, whole))


DYNAMIC_QUANTIZE = Template("cuda_dynamic_quantize", dynamic_quantize, lambda p: True, space,
                            default, build)
