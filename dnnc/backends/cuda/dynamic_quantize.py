"""The cuda DynamicQuantizeLinear (`cuda_dynamic_quantize`): x's range, scale and zero point
and every element quantized in two launches, as quantize_dynamic's files run one before
each integer product (BERT-base at batch 8: 48 of them).

Both launches read x in chunks of `lanes` elements (one float4 where x's size is a multiple
of 4; four halves, one 8-byte load, of an x store_half left in its half type: widened as
they are used), a thread's share grid-strided (consecutive threads on consecutive chunks), `unroll`
chunks loaded into registers before any is used: the loads in flight decide a kernel that
moves bytes and does little else (4.3 TB/s times HBM's ~0.8 us latency is ~3.4 MB in flight;
132 SMs x 1024 threads x 4 float4 is 8.6 MB; one float a thread at a time was 0.5).

Launch 1: `blocks` blocks (a few a SM) each write their share's max and min, each thread's
running from 0 (the reference widens the range to include 0: the same result), met across
the warp by a butterfly of shuffles and across the block's warps in shared memory, to a
workspace of partials. Launch 2: every block reduces all partials itself (a few thousand
floats from L2: no third launch, no atomics, no grid-wide wait) the same way, forms the
scale and zero point as the reference does (`quantized_problems.dynamic_scale`,
`dynamic_zero_point`: max and min are exact in any order, so the results are the
reference's bit for bit), block 0's thread 0 stores them, and its threads quantize their
share (four uint8 results a 32-bit store). The generic lowering (`ir/ops/quant.py`'s stages)
took 7 launches, 4 of them one block or one thread.

This module builds loop IR; it must never render C or launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.linalg import widen
from ..quantized_problems import (DynamicQuantize, DynamicRange, dynamic_quantize,
                                  dynamic_quantized, dynamic_range, dynamic_scale,
                                  dynamic_zero_point)
from ..space import Space, Template
from .attention import _butterfly
from .device import gpu_of
from .threads import WARP


@dataclass(frozen=True)
class QuantizeConfig:
    """Knobs of cuda_dynamic_quantize: threads a block, blocks a SM (both launches), chunks a
    thread loads before using any."""

    threads: int = 256
    blocks_per_sm: int = 4
    unroll: int = 4


def space(p: DynamicQuantize | DynamicRange, machine) -> Space:
    return Space("cuda_dynamic_quantize", QuantizeConfig,
                 {"threads": (128, 256, 512, 1024), "blocks_per_sm": (1, 2, 4, 8),
                  "unroll": (1, 2, 4, 8)}, [])


def default(p: DynamicQuantize | DynamicRange, machine) -> QuantizeConfig:
    return QuantizeConfig()


def _lanes(size: int) -> int:
    """Elements a chunk: a float4 where x's size allows (x is aligned, as every parameter)."""
    return 4 if size % 4 == 0 else 1


def _grid(size: int, c: QuantizeConfig, machine) -> int:
    """Blocks of each launch: blocks_per_sm a SM, fewer where x has fewer chunks than
    threads."""
    chunks = size // _lanes(size)
    return max(1, min(c.blocks_per_sm * gpu_of(machine).sms, -(-chunks // c.threads)))


class BlockRange:
    """A block's range of values from 0: each thread's running max and min (`run`), met
    across the block's warps in shared memory (`hi`, `lo`); what both launches of a
    quantization and a producer's range epilogue (`range_epilogue.py`) share. `threads` is
    a whole number of warps."""

    def __init__(self, threads: int, t: L.Var):
        f32 = T.float32
        self.threads, self.t = threads, t
        self.warps = -(-threads // WARP)
        self.run = L.Buffer("dq_run", f32, (2,), L.Scope.LOCAL)
        self.hi = L.Buffer("dq_hi", f32, (self.warps,), L.Scope.SHARED)
        self.lo = L.Buffer("dq_lo", f32, (self.warps,), L.Scope.SHARED)

    def on_threads(self, body: L.Stmt) -> L.Stmt:
        return L.For(self.t, self.threads, body, L.ForKind.THREAD_X)

    def widen(self, top: L.Expr, bottom: L.Expr) -> L.Stmt:
        run = self.run
        return L.seq(L.Store(run, (0,), L.maximum(run[0], top)),
                     L.Store(run, (1,), L.minimum(run[1], bottom)))

    def block_range(self, own: L.Stmt, after) -> L.Stmt:
        """Each thread's range from 0 (`own`, block-level statements, widens `run`), met
        across the block: a butterfly of shuffles in each warp, its first lane's result into
        `hi` / `lo`, a barrier, then every thread the block's max and min from the warps',
        and `after(top, bottom)`. `hi` and `lo` live only after `own`: in a dynamic shared
        pool they may reuse memory of `own`'s shared buffers, so where it has any a barrier
        first waits for every warp to be done with them."""
        run, hi, lo, t = self.run, self.hi, self.lo, self.t
        zero = L.const(0.0)
        w = L.Var("w")
        shuffles = [self.on_threads(s) for pair in zip(_butterfly(run, (0,), "max", WARP),
                                                       _butterfly(run, (1,), "min", WARP))
                    for s in pair]
        shares = any(isinstance(n, L.Allocate) and n.buffer.scope is L.Scope.SHARED
                     for n in L.walk(own))
        meet = [L.Barrier()] * shares + [
            self.on_threads(L.If(L.eq(t % WARP, 0), L.seq(
                L.Store(hi, (t // WARP,), run[0]), L.Store(lo, (t // WARP,), run[1])))),
            L.Barrier(),
            self.on_threads(L.seq(L.For(w, self.warps, self.widen(hi[w], lo[w]),
                                        L.ForKind.UNROLLED),
                                  after(run[0], run[1])))]
        return L.Allocate(run, L.seq(
            self.on_threads(L.seq(L.Store(run, (0,), zero), L.Store(run, (1,), zero))),
            own, *shuffles, L.Allocate(hi, L.Allocate(lo, L.seq(*meet)))))

    def store_columns(self, top: L.Expr, bottom: L.Expr, parts: L.Buffer, pieces: int,
                      b: L.Expr, blocks: int) -> L.Stmt:
        """Block b's range (every thread holds it) into columns b, b + blocks, ... of
        `parts` (`pieces` maxima, then as many minima), a column a thread: every column
        written, so none holds an earlier call's range."""
        e, column = L.Var("e_range"), L.Var("column")
        each = -(-pieces // blocks)   # columns a block
        return L.For(e, -(-each // self.threads), L.Let(
            column, (e * self.threads + self.t) * blocks + b, L.If(column < pieces, L.seq(
                L.Store(parts, (column,), top), L.Store(parts, (pieces + column,), bottom)))))


class _Launch(BlockRange):
    """What both launches share: their block and thread variables, the block's range
    (`BlockRange`), the chunk registers."""

    def __init__(self, x: L.Buffer, size: int, c: QuantizeConfig, blocks: int):
        super().__init__(c.threads, L.Var("t"))
        self.c, self.blocks = c, blocks
        self.lanes = _lanes(size)
        self.chunks = size // self.lanes
        self.x = L.Buffer(x.name, x.dtype, (size,))
        self.b = L.Var("b")
        self.regs = L.Buffer("dq_x", x.dtype, (c.unroll * self.lanes,), L.Scope.LOCAL)

    def value(self, at: L.Expr) -> L.Expr:
        """Chunk register `at` as float32 (a half x widened: exact)."""
        return widen(T.float32, self.regs[at])

    def shares(self, each) -> L.Stmt:
        """The thread's chunks, `unroll` at a time: each group's chunks loaded into `regs`
        (zeros past x's end: 0 is in the range already), then `each(chunk, lane)` (the
        chunk's index, its first register) for every chunk of the group."""
        c, lanes, regs = self.c, self.lanes, self.regs
        stride = self.blocks * c.threads
        g, u, v = L.Var("g"), L.Var("u"), L.Var("v")
        chunk = L.Var("chunk")
        groups = -(-self.chunks // (stride * c.unroll))

        def at(body):
            return L.Let(chunk, (g * c.unroll + u) * stride + self.b * c.threads + self.t, body)

        load = L.If(chunk < self.chunks,
                    L.For(v, lanes, L.Store(regs, (u * lanes + v,), self.x[chunk * lanes + v]),
                          L.ForKind.VECTORIZED),
                    L.For(v, lanes, L.Store(regs, (u * lanes + v,), L.const(0.0, regs.dtype)),
                          L.ForKind.UNROLLED))
        return L.For(g, groups, L.seq(
            L.For(u, c.unroll, at(load), L.ForKind.UNROLLED),
            L.For(u, c.unroll, at(each(chunk, u * lanes)), L.ForKind.UNROLLED)))


def range_launch(x: L.Buffer, size: int, parts: L.Buffer, pieces: int, c: QuantizeConfig,
                 machine) -> L.Stmt:
    """Launch 1: at most `pieces` blocks, each its share of x's (`size` elements) max and
    min into its columns of `parts` (`pieces` maxima, then as many minima)."""
    blocks = min(_grid(size, c, machine), pieces)
    k = _Launch(x, size, c, blocks)

    def chunk_range(chunk, at):
        lane = L.Var("lane")
        return L.For(lane, k.lanes, k.widen(k.value(at + lane), k.value(at + lane)),
                     L.ForKind.UNROLLED)

    def store(top, bottom):
        return k.store_columns(top, bottom, parts, pieces, k.b, blocks)

    return L.For(k.b, blocks, L.Allocate(k.regs, k.block_range(
        k.on_threads(k.shares(chunk_range)), store)), L.ForKind.BLOCK_X)


def build(p: DynamicQuantize, c: QuantizeConfig, machine) -> L.PrimFunc:
    """The launches of `p` (see the module's docstring): two, or one where a producer
    took x's range (`p.x_range`)."""
    f32 = T.float32
    blocks = _grid(p.size, c, machine)
    k = _Launch(p.x, p.size, c, blocks)
    x, lanes, regs = k.x, k.lanes, k.regs
    y = L.Buffer(p.y.name, T.uint8, (p.size,))
    out = L.Buffer("dq_y", T.uint8, (lanes,), L.Scope.LOCAL)
    b, t, v, e = k.b, k.t, L.Var("v"), L.Var("e")
    first_thread = L.eq(t, L.const(0))
    if p.x_range is None:   # launch 1 into a workspace of partials, a column a block
        pieces = blocks
        parts = L.Buffer("dq_parts", f32, (2 * blocks,), L.Scope.GLOBAL)
        launches = [range_launch(x, p.size, parts, pieces, c, machine)]
    else:   # a producer's partials (DynamicRange's)
        pieces = p.pieces
        parts = L.Buffer(p.x_range.name, f32, (2 * pieces,))
        launches = []

    # the last launch: every block the whole range from the partials, then its share
    # quantized
    scale, z = L.Var("scale", f32), L.Var("z", f32)
    from_parts = k.on_threads(L.For(e, -(-pieces // c.threads), L.Let(
        v, e * c.threads + t, L.If(v < pieces, k.widen(parts[v], parts[pieces + v]))),
        L.ForKind.UNROLLED))

    def quantize(chunk, at):
        """The chunk's results into registers, then one store (a uchar4: values from
        registers only, `codegen.vector_for`)."""
        lane = L.Var("lane")
        return L.If(chunk < k.chunks, L.seq(
            L.For(lane, lanes, L.Store(out, (lane,), L.Cast(
                T.uint8, dynamic_quantized(k.value(at + lane), scale, z))), L.ForKind.UNROLLED),
            L.For(lane, lanes, L.Store(y, (chunk * lanes + lane,), out[lane]),
                  L.ForKind.VECTORIZED)))

    def finish(top, bottom):
        params = L.If(L.logical_and(L.eq(b, L.const(0)), first_thread), L.seq(
            L.Store(p.scale, (), scale), L.Store(p.zero_point, (), L.Cast(T.uint8, z))))
        return L.Let(scale, dynamic_scale(top, bottom), L.Let(
            z, dynamic_zero_point(bottom, scale), L.seq(params, k.shares(quantize))))

    launches.append(L.For(b, blocks, L.Allocate(regs, L.Allocate(out, k.block_range(
        from_parts, finish))), L.ForKind.BLOCK_X))
    views = {x.name: x, y.name: y, parts.name: parts}
    body = L.seq(*launches)
    return L.PrimFunc(p.name, tuple(views.get(v.name, v) for v in p.params),
                      body if p.x_range is not None else L.Allocate(parts, body))


def build_range(p: DynamicRange, c: QuantizeConfig, machine) -> L.PrimFunc:
    """A DynamicRange no producer took: launch 1 into its partials."""
    parts = L.Buffer(p.parts.name, T.float32, (2 * p.pieces,))
    x = L.Buffer(p.x.name, p.x.dtype, (p.size,))
    views = {x.name: x, parts.name: parts}
    return L.PrimFunc(p.name, tuple(views.get(v.name, v) for v in p.params),
                      range_launch(x, p.size, parts, p.pieces, c, machine))


DYNAMIC_QUANTIZE = Template("cuda_dynamic_quantize", dynamic_quantize, lambda p: True, space,
                            default, build)
DYNAMIC_RANGE = Template("cuda_dynamic_range", dynamic_range, lambda p: True, space, default,
                         build_range)
