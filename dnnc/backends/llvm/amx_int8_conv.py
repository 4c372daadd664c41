"""int8 convs of any window on AMX tiles as blocks of Y^T (`AMX_CONV_T_INT8`): where a
QuantizedConvPacked (one group, not a pointwise one: `amx_int8.AMX_POINTWISE_INT8`) has at
least as many output pixels as weight words an output channel, so that copying the weights
into tiles of W^T costs less than `amx_int8.AMX_CONV_INT8`'s stores, a pixel's channels a
plane apart (resnet50's 3x3s at 56^2 and 28^2: 3136 and 784 pixels against 144 and 288 words;
not at 14^2 and 7^2, nor the folded stem).

The geometry is `amx_conv`'s (`ConvGeometry`: the image in S x S phases on a grid as wide as a
row's reads, a `TileProduct` run a tap) with the operands swapped: A is the weights, copied
once a call into `wt` [channel tiles, taps, steps, 16 channels, 16 words of 4 input channels];
B the image made once a call into `ximgt` [images, phases, k16, plane] words, a row one group
of 4 channels over the phase's grid pixels, made a vector of pixels at a time (its padding,
the zero point's bytes, in loops of their own), so that a tap's B tile is 16 groups at 16
consecutive grid pixels shifted by the tap. A block's C^T rows are output channels: a grid
row's pixels inside OW are stored as one vector of the NCHW plane. uint8 activations are B:
tdpbsud ("s8u8"); int8 tdpbssd. Knobs `AmxInt8Config` (row tiles output channels, column
tiles grid pixels). It must never read the image, the weights or its workspaces outside what
they hold, nor be chosen for a target without the tiles (its Template's `features`).
"""

from __future__ import annotations

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.quantized import GROUP_COLUMNS, GROUP_DEPTH
from ..quantized_problems import QuantizedConvProblem, quantized_conv
from ..space import Space, Template
from . import amx_conv
from .amx import AMX_INT8_FEATURES
from .amx_int8 import (ROWS, TILE_WORDS, AmxInt8Config, tile_precision, y_t_default,
                       y_t_space)
from .int8 import cast_to, pointwise, requantized, zero_point


def applies(p: QuantizedConvProblem) -> bool:
    """One group, not a pointwise conv, not folded (few input channels:
    `amx_conv.default_for`), and output pixels (of every image) at least the weight words of
    an output channel."""
    if p.group != 1 or pointwise(p) or amx_conv.default_for(p, GROUP_DEPTH).fold:
        return False
    kh, kw = p.kernel
    return p.x_dims[0] * p.y_dims[2] * p.y_dims[3] >= -(-p.x_dims[1] // GROUP_DEPTH) * kh * kw


def _geometry(p: QuantizedConvProblem, config: AmxInt8Config) -> amx_conv.ConvGeometry:
    """`amx_conv`'s geometry with blocks of col_tiles x 16 grid pixels, unfolded."""
    return amx_conv.ConvGeometry(p, amx_conv.AmxConvConfig(config.col_tiles, 1, False),
                              GROUP_DEPTH)


def _grid(p: QuantizedConvProblem) -> int:
    """Grid pixels of an image (a row as wide as its reads; no config changes it)."""
    return _geometry(p, AmxInt8Config(1, 1, 1, 1)).grid


def space(p: QuantizedConvProblem, machine) -> Space:
    return y_t_space("amx_conv_t_int8", p.y_dims[1], _grid(p))


def default(p: QuantizedConvProblem, machine) -> AmxInt8Config:
    return y_t_default(p.y_dims[1], _grid(p), p.x_dims[0], machine)


def build(p: QuantizedConvProblem, config: AmxInt8Config, machine) -> L.PrimFunc:
    g = _geometry(p, config)
    n, c, h, wid = p.x_dims
    m, _, kh, kw = p.w_dims
    par = L.ForKind.PARALLEL if machine.threads > 1 else L.ForKind.SERIAL
    taps = len(g.taps)
    w = L.Buffer(p.w.name, T.uint32, (g.panels, g.pairs * taps, GROUP_COLUMNS))
    tiles = -(-m // (ROWS * config.row_tiles)) * config.row_tiles
    wt = L.Buffer("wt", T.uint32, (tiles * taps * g.steps * TILE_WORDS,), L.Scope.GLOBAL)
    ximgt = L.Buffer("ximgt", T.uint32, (n * g.phases * g.k16 * g.plane,), L.Scope.GLOBAL)
    body = L.seq(_weights(g, w, wt, m, tiles, par), _image(p, g, ximgt, par),
                 _blocks(p, g, config, wt, ximgt, par))
    params = tuple(w if x.name == w.name else x for x in p.params)
    return L.simplify(L.PrimFunc(p.name, params, L.Allocate(wt, L.Allocate(ximgt, body))))


def _weights(g, w: L.Buffer, wt: L.Buffer, m: int, tiles: int, par: L.ForKind) -> L.Stmt:
    """`wt`: row ii (channel 16 u + ii) of step t of tap r of channel tile u, word q: the
    weights of input channels 4 (16 t + q) .. + 3 at the tap (zero past M and C)."""
    u, r, t, ii, q = (L.Var(v) for v in ("u", "r", "t", "ii", "q"))
    taps = len(g.taps)
    ch, group = u * ROWS + ii, t * ROWS + q
    cc, gc = L.minimum(ch, m - 1), L.minimum(group, g.pairs - 1)
    word = L.Select(L.logical_and(ch < m, group < g.pairs), w[
        cc // GROUP_COLUMNS, gc * taps + r, cc % GROUP_COLUMNS], L.Const(0, T.uint32))
    at = (((u * taps + r) * g.steps + t) * ROWS + ii) * ROWS + q
    return L.For(u, tiles, L.For(r, taps, L.For(t, g.steps, L.For(ii, ROWS, L.For(
        q, ROWS, L.Store(wt, (at,), word), L.ForKind.VECTORIZED)))),
        par if tiles > 1 else L.ForKind.SERIAL)


def _image(p: QuantizedConvProblem, g, ximgt: L.Buffer, par: L.ForKind) -> L.Stmt:
    """`ximgt`: row (image, phase (a, b), group kk, grid row py), grid pixel px: channels
    4 kk .. 4 kk + 3 (past C: channel C - 1, whose weights are 0) at padded row py S + a,
    column px S + b; the zero point's bytes outside the image (and for groups past C's).
    A row's columns inside the image are one loop of pixels, its padding two others."""
    n, c, h, wid = p.x_dims
    (ph, pw) = p.begins
    v, px = L.Var("v"), L.Var("px")
    py, kk = v % g.plane_rows, v // g.plane_rows % g.k16
    phase, bi = v // (g.plane_rows * g.k16) % g.phases, v // (g.plane_rows * g.k16 * g.phases)
    a, b = phase // g.col_phases, phase % g.col_phases
    row = py * g.sh + a - ph
    pad = L.BinOp("&", L.Cast(T.uint32, zero_point(p, False)), L.Const(0xFF, T.uint32)) * \
        L.Const(0x01010101, T.uint32)
    # grid columns before the image, and past it: col = px S + b - pw
    lo = L.minimum((pw - b + g.sw - 1) // g.sw, g.wg)
    hi = L.maximum(L.minimum((wid + pw - b + g.sw - 1) // g.sw, g.wg), lo)
    word = None
    for t in range(GROUP_DEPTH):
        byte = L.Cast(T.uint32, L.Cast(T.uint8, p.x[bi, L.minimum(kk * GROUP_DEPTH + t, c - 1),
                                                  row, (lo + px) * g.sw + b - pw]))
        byte = byte if t == 0 else L.BinOp("<<", byte, L.Const(8 * t, T.uint32))
        word = byte if word is None else L.BinOp("|", word, byte)
    vec = L.ForKind.VECTORIZED
    base = v * g.wg

    def pads(start, count) -> L.Stmt:
        return L.For(px, count, L.Store(ximgt, (base + start + px,), pad), vec)

    inner = L.seq(pads(0, lo), L.For(px, hi - lo, L.Store(ximgt, (base + lo + px,), word), vec),
                  pads(hi, g.wg - hi))
    inside = L.logical_and(row >= 0, row < h, kk < g.pairs)
    return L.For(v, n * g.phases * g.k16 * g.plane_rows, L.If(inside, inner, pads(0, g.wg)),
                 par)


def _blocks(p: QuantizedConvProblem, g, config: AmxInt8Config, wt: L.Buffer,
            ximgt: L.Buffer, par: L.ForKind) -> L.Stmt:
    """Every unit's blocks (channel blocks outside pixel blocks: a unit's W^T tiles read
    again from L1 by its next pixel block), each C^T over every tap and step, then its
    store."""
    m = p.y_dims[1]
    c = config
    taps = len(g.taps)
    bm, bn = ROWS * c.row_tiles, g.bm                 # channels, grid pixels a block
    row_blocks, col_blocks = -(-m // bm), g.pixel_blocks
    row_groups, col_groups = -(-row_blocks // c.unit_rows), -(-col_blocks // c.unit_cols)
    v, rl, cl = L.Var("v"), L.Var("rl"), L.Var("cl")
    per_image = row_groups * col_groups
    bi, rest = v // per_image, v % per_image
    rb = rest // col_groups * c.unit_rows + rl
    cb = rest % col_groups * c.unit_cols + cl
    cacc = L.Buffer("cacc", T.int32, (bm * bn,), L.Scope.LOCAL)
    runs = []
    for index in range(taps):
        phase, shift = g.tap(index)
        runs.append((index * g.steps * TILE_WORDS, phase * g.k16 * g.plane + shift))
    product = L.TileProduct(
        tile_precision(p, transposed=True), cacc[0],
        wt[rb * c.row_tiles * taps * g.steps * TILE_WORDS],
        ximgt[bi * g.phases * g.k16 * g.plane + cb * bn], bn,
        (ROWS, taps * g.steps * TILE_WORDS, TILE_WORDS), (g.plane, ROWS, ROWS * g.plane),
        c.row_tiles, c.col_tiles, g.steps, accumulate=False, runs=tuple(runs))
    block = L.Allocate(cacc, L.seq(product, _store(p, g, cacc, bi, rb * bm, cb * bn, bm, bn)))
    cols = L.For(cl, c.unit_cols, L.If(cb < col_blocks, block)
                 if col_blocks % c.unit_cols else block)
    rows = L.For(rl, c.unit_rows, L.If(rb < row_blocks, cols)
                 if row_blocks % c.unit_rows else cols)
    units = p.x_dims[0] * per_image
    return L.For(v, units, rows, par if units > 1 else L.ForKind.SERIAL)


def _store(p: QuantizedConvProblem, g, cacc: L.Buffer, bi, ch0, gp0, bm: int,
           bn: int) -> L.Stmt:
    """The block's sums through the compensation, the finish and the fused consumers into
    Y: for each channel below M, each grid row the block's pixels reach, the pixels inside
    OW one vector loop."""
    m, oh, ow = p.y_dims[1], p.y_dims[2], p.y_dims[3]
    x, dr, ox = L.Var("sx"), L.Var("sr"), L.Var("ox")
    ch = ch0 + x
    oy = gp0 // g.wg + dr
    first = L.maximum(gp0 - oy * g.wg, 0)                    # the row's first column here
    count = L.maximum(L.minimum(gp0 + bn - oy * g.wg, ow) - first, 0)
    col = first + ox
    value = requantized(p, cacc[x * bn + oy * g.wg + col - gp0] -
                        zero_point(p, False) * p.sums[ch], ch)
    index = (bi, ch, oy, col)
    store = L.Store(p.y, index, cast_to(p.epilogue(value, index), p.y.dtype))
    rows = L.For(dr, bn // g.wg + 2, L.If(oy < oh, L.For(ox, count, store,
                                                          L.ForKind.VECTORIZED)))
    return L.For(x, bm, L.If(ch < m, rows))


AMX_CONV_T_INT8 = Template("amx_conv_t_int8", quantized_conv, applies, space, default, build,
                           features=AMX_INT8_FEATURES)
