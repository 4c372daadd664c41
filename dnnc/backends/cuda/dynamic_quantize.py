"""The cuda DynamicQuantizeLinear (`cuda_dynamic_quantize`): x's range, scale and zero point
and every element quantized in two launches, as quantize_dynamic's files run one before
each integer product (BERT-base at batch 8: 48 of them).

Launch 1: `blocks` blocks (a few a SM) each take a grid-stride share of x (consecutive
threads on consecutive elements) and write their share's max and min, each thread's
running from 0 (the reference widens the range to include 0: the same result), met in
shared memory by a tree of halvings, to a workspace of partials. Launch 2: every block
reduces all partials itself (a few thousand floats from L2: no third launch, no atomics,
no grid-wide wait), forms the scale and zero point as the reference does
(`quantized_problems.dynamic_scale`, `dynamic_zero_point`: max and min are exact in any
order, so the results are the reference's bit for bit), block 0's thread 0 stores them, and
its threads quantize a grid-stride share of x. The generic lowering (`ir/ops/quant.py`'s
stages) took 7 launches, 4 of them one block or one thread.

This module builds loop IR; it must never render C or launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ..quantized_problems import (DynamicQuantize, dynamic_quantize, dynamic_quantized,
                                  dynamic_scale, dynamic_zero_point)
from ..space import Space, Template
from .device import gpu_of


@dataclass(frozen=True)
class QuantizeConfig:
    """Knobs of cuda_dynamic_quantize: threads a block, blocks a SM (both launches)."""

    threads: int = 256
    blocks_per_sm: int = 4


def space(p: DynamicQuantize, machine) -> Space:
    return Space("cuda_dynamic_quantize", QuantizeConfig,
                 {"threads": (128, 256, 512, 1024), "blocks_per_sm": (1, 2, 4, 8)}, [])


def default(p: DynamicQuantize, machine) -> QuantizeConfig:
    return QuantizeConfig()


def _grid(p: DynamicQuantize, c: QuantizeConfig, machine) -> int:
    """Blocks of each launch: blocks_per_sm a SM, fewer where x has fewer elements than
    threads."""
    return max(1, min(c.blocks_per_sm * gpu_of(machine).sms, -(-p.size // c.threads)))


def _block_range(t: L.Var, threads: int, hi: L.Buffer, lo: L.Buffer) -> L.Stmt:
    """The block's max and min into hi[0] and lo[0] (each thread's in hi[t], lo[t] before):
    halvings, a barrier after each."""
    steps = []
    half = threads // 2
    while half:
        steps += [L.For(t, threads, L.If(t < half, L.seq(
            L.Store(hi, (t,), L.maximum(hi[t], hi[t + half])),
            L.Store(lo, (t,), L.minimum(lo[t], lo[t + half])))), L.ForKind.THREAD_X),
            L.Barrier()]
        half //= 2
    return L.seq(*steps)


def build(p: DynamicQuantize, c: QuantizeConfig, machine) -> L.PrimFunc:
    """The two launches of `p` (see the module's docstring)."""
    f32, threads = T.float32, c.threads
    blocks = _grid(p, c, machine)
    x = L.Buffer(p.x.name, f32, (p.size,))
    y = L.Buffer(p.y.name, T.uint8, (p.size,))
    parts = L.Buffer("dq_parts", f32, (2 * blocks,), L.Scope.GLOBAL)
    hi = L.Buffer("dq_hi", f32, (threads,), L.Scope.SHARED)
    lo = L.Buffer("dq_lo", f32, (threads,), L.Scope.SHARED)
    run = L.Buffer("dq_run", f32, (2,), L.Scope.LOCAL)
    b, t, q, e = L.Var("b"), L.Var("t"), L.Var("q"), L.Var("e")
    zero = L.const(0.0, f32)

    def ranged(count: int, stride: int, first: L.Expr, read_hi, read_lo,
               after: L.Stmt) -> L.Stmt:
        """The block's range of items first, first + stride, ... below `count` (thread t's
        from item first + t; `read_hi(k)`, `read_lo(k)` item k's max and min) into hi[0] and
        lo[0], then `after`."""
        widen = L.Let(e, q * stride + first + t, L.If(e < count, L.seq(
            L.Store(run, (0,), L.maximum(run[0], read_hi(e))),
            L.Store(run, (1,), L.minimum(run[1], read_lo(e))))))
        own = L.Allocate(run, L.seq(
            L.Store(run, (0,), zero), L.Store(run, (1,), zero),
            L.For(q, -(-count // stride), widen),
            L.Store(hi, (t,), run[0]), L.Store(lo, (t,), run[1])))
        return L.Allocate(hi, L.Allocate(lo, L.seq(
            L.For(t, threads, own, L.ForKind.THREAD_X), L.Barrier(),
            _block_range(t, threads, hi, lo), after)))

    # launch 1: each block's share of x -> its partial max and min
    store_part = L.For(t, threads, L.If(L.eq(t, L.const(0)), L.seq(
        L.Store(parts, (b,), hi[0]), L.Store(parts, (blocks + b,), lo[0]))),
        L.ForKind.THREAD_X)
    partials = L.For(b, blocks, ranged(p.size, blocks * threads, b * threads, lambda k: x[k],
                                       lambda k: x[k], store_part), L.ForKind.BLOCK_X)

    # launch 2: every block the whole range from the partials, then its share quantized
    scale, z = L.Var("scale", f32), L.Var("z", f32)
    params = L.If(L.logical_and(L.eq(b, L.const(0)), L.eq(t, L.const(0))), L.seq(
        L.Store(p.scale, (), scale), L.Store(p.zero_point, (), L.Cast(T.uint8, z))))
    stride = blocks * threads
    quantize = L.For(q, -(-p.size // stride), L.Let(e, q * stride + b * threads + t, L.If(
        e < p.size, L.Store(y, (e,), L.Cast(T.uint8, dynamic_quantized(x[e], scale, z))))))
    top, bottom = hi[0], lo[0]
    finish = L.For(t, threads, L.Let(scale, dynamic_scale(top, bottom), L.Let(
        z, dynamic_zero_point(bottom, scale), L.seq(params, quantize))), L.ForKind.THREAD_X)
    whole = L.For(b, blocks, ranged(blocks, threads, L.const(0), lambda k: parts[k],
                                    lambda k: parts[blocks + k], finish), L.ForKind.BLOCK_X)
    views = {x.name: x, y.name: y}
    return L.PrimFunc(p.name, tuple(views.get(v.name, v) for v in p.params),
                      L.Allocate(parts, L.seq(partials, whole)))


DYNAMIC_QUANTIZE = Template("cuda_dynamic_quantize", dynamic_quantize, lambda p: True, space,
                            default, build)
