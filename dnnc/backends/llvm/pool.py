"""The 2-D pooling schedule template for CPUs (MaxPool, AveragePool).

Per plane (image x channel): the input plane, when the windows reach into padding, is copied
into a cache-resident buffer filled with the pooling's identity (-inf for max, 0 for an
average that counts the padding), so the taps never test bounds; then each output row runs in
blocks of pixels, every tap one vector load (a shuffle of one load at stride 2 to 4) combined
into the accumulators. Planes are shared by the worker pool when the work pays for it.

The problem is a `problems.Pool2d`; averages that exclude padding from their divisor where a
window reaches into it (or whose windows ceil_mode lets run past the image) keep the default
schedule. Knob (`PoolConfig`): pixels per block.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Pool2d
from ..space import Space, Template
from .conv import PIXEL_BLOCKS, pad_plane, parallel_kind, row_in_vectors


@dataclass(frozen=True)
class PoolConfig:
    pixels: int    # output pixels per block of a row (a narrower block ends the row)


def applies(p: Pool2d) -> bool:
    """Not for averages whose divisor would vary at the borders."""
    return p.kind == "max" or not ((p.padded and not p.count_include_pad) or p.ceil_mode)


def space(p: Pool2d, machine) -> Space:
    return Space("pool2d", PoolConfig, {"pixels": PIXEL_BLOCKS})


def default(p: Pool2d, machine) -> PoolConfig:
    return PoolConfig(machine.vector_bits // 32)


def build(p: Pool2d, config: PoolConfig, machine) -> L.PrimFunc:
    from .schedules import MIN_PARALLEL_WORK   # (schedules imports this module's template)

    x, y = p.x, p.y
    n, c, h, wid = p.x_dims
    _, _, oh, ow = p.y_dims
    kh, kw = p.kernel_hw
    (sh, sw), (dh, dw) = p.strides, p.dilations
    is_max = p.kind == "max"
    fill = L.const(float("-inf") if is_max else 0.0)

    plane, row = L.Var("plane"), L.Var("row")
    bn, ch = plane // c, plane % c
    stmts = []
    if p.padded:
        src, copy = pad_plane(x, bn, ch, (h, wid), p.begins, p.padded_hw, fill.value)
        stmts.append(copy)

        def tap(i, j):
            return src[i, j]
    else:
        def tap(i, j):
            return x[bn, ch, i, j]

    r, s, jj = L.Var("r"), L.Var("s"), L.Var("j")

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (width,), L.Scope.LOCAL)
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        value = tap(row * sh + r * dh, (ow0 + jj) * sw + s * dw)
        combined = L.maximum(acc[jj], value) if is_max else acc[jj] + value
        init = L.For(jj, width, L.Store(acc, (jj,), fill), kind)
        taps = L.For(r, kh, L.For(s, kw, L.For(jj, width, L.Store(acc, (jj,), combined),
                                                kind)))
        out = acc[jj] if is_max else acc[jj] * L.const(1.0 / (kh * kw))
        store = L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), out), kind)
        return L.Allocate(acc, L.seq(init, taps, store))

    if is_max and (sh > 1 or sw > 1):
        rowmax, each_row = _separable_max_row(p, config, tap, row, bn, ch)
        stmts.append(L.Allocate(rowmax, L.For(row, oh, each_row)))
    else:
        stmts.append(L.For(row, oh, row_in_vectors(block, ow, config.pixels)))
    body = L.seq(*stmts)
    if p.padded:
        body = L.Allocate(src, body)
    par = parallel_kind(machine.threads, n * c * oh * ow * kh * kw, MIN_PARALLEL_WORK)
    main = L.For(plane, n * c, body, par)
    return L.simplify(L.PrimFunc(p.name, p.params, main))


def _separable_max_row(p: Pool2d, config: PoolConfig, tap, row: L.Var, bn, ch
                       ) -> tuple[L.Buffer, L.Stmt]:
    """Output row `row` of a strided max pool in two passes: the window's rows' maximum over
    every column the row's windows read (contiguous vector loads), into a row buffer (the
    returned buffer, allocated by the caller around its rows); then each output pixel the
    maximum of its window's columns of that buffer (at stride 2, one load and a shuffle). A
    max is the same in any order (NaN propagates), so the passes give the window's maximum
    exactly. The one pass's strided loads, kh of them a tap column, cost squeezenet's 3x3
    stride-2 pool of 96x109x109 312 us at 1 thread (znver5)."""
    y = p.y
    ow = p.y_dims[3]
    kh, kw = p.kernel_hw
    (sh, sw), (dh, dw) = p.strides, p.dilations
    cols = (ow - 1) * sw + (kw - 1) * dw + 1   # the columns the row's windows read
    rowmax = L.Buffer("rowmax", T.float32, (cols,))
    q, jj = L.Var("q"), L.Var("j")
    vec = L.ForKind.VECTORIZED
    value = tap(row * sh, q)
    for r in range(1, kh):
        value = L.maximum(value, tap(row * sh + r * dh, q))
    down = L.For(q, cols, L.Store(rowmax, (q,), value), vec)

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        kind = vec if width >= 2 else L.ForKind.UNROLLED
        out = rowmax[(ow0 + jj) * sw]
        for s in range(1, kw):
            out = L.maximum(out, rowmax[(ow0 + jj) * sw + s * dw])
        return L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), out), kind)

    return rowmax, L.seq(down, row_in_vectors(block, ow, config.pixels))


POOL2D = Template("pool2d", problems.pool2d, applies, space, default, build)
