"""The int8 products on AMX tiles (Sapphire Rapids and later): QuantizedDense (`AMX_DENSE_INT8`),
a 1x1 stride-1 unpadded QuantizedConvPacked of one group (`AMX_POINTWISE_INT8`) and one of any
other window (`AMX_CONV_INT8`; `amx_int8_conv.py`'s Y^T over taps first where it applies; a
grouped one, or a pointwise one on fewer pixels than a tile row: `int8.CONV_INT8`), where the
target
has amx-tile and amx-int8; `int8.py`'s vpdpbusd templates serve every other CPU, and their
results are the same bits (int32 sums are exact; the finish is `int8.requantized`, the same
expression).

The tile dot takes the activation's signedness as it is (AMX has every pairing): tdpbusd
(`TileProduct` "u8s8") for uint8 activations as A against the int8 weights, tdpbssd ("s8s8")
for int8, tdpbsud ("s8u8") for uint8 as B (blocks of Y^T, the weights A); so no byte is
flipped to A + 128 and the zero point's compensation is za sum_k w[k, j]
(`int8.zero_point(p, flipped=False)`), once per output.

- **dense**: the weights stay as `pack_groups` made them, [ceil(N / 16), ceil(K / 4), 16]
  words of 4 k bytes: a B tile is 16 groups of a panel, rows 16 words apart, read in place;
  K's last partial step (ceil(K / 4) not a multiple of 16) is copied once a call into
  zero rows (`wtail`). A is made into whole tiles once a call (`atiles`: row tiles x k steps
  x 16 x 16 words, rows past M repeating the last, bytes past K zero). A block of row_tiles
  x col_tiles C tiles (col_tiles panels side by side; the last block the panels left)
  accumulates over K in tile registers, then its int32 sums go through the weights' zero
  point (`DenseTile.compensated`, from A's row sums), the finish and the fused consumers into
  Y, a tile row's columns one vector. The worker pool shares units of unit_rows x unit_cols
  blocks (`amx_dense.unit_cols` balances them).
- **conv**: `amx_conv`'s implicit GEMM (`tile_conv`: phases, the grid, a `TileProduct` run
  a tap, folding few channels) on words of 4 channels: the image packed with the zero point
  outside it (padding then adds nothing after the compensation), the weights `pack_conv_groups`'
  [panels, C4, kh, kw, 16] words, read in place where C4 fills whole steps. Panels are 16
  channels wide, so a block is one column tile (3 x 1 by default). Its stores are a pixel's
  channels, a plane apart in NCHW: it serves convs of fewer output pixels than weight words
  a channel (resnet50's 3x3s at 14^2 and 7^2) and the folded stem; `amx_int8_conv` the rest.
- **pointwise** (1x1, stride 1, unpadded: most of a ResNet's products): blocks of Y^T = W^T X,
  so that a C tile row is one output channel's consecutive pixels, stored as one vector of
  the plane (the pixel-rows tile scattered them; amx_dense's Y^T has the same reason). The
  weights are copied once a call into tiles of W^T (`wt`), the image into groups of 4
  channels by pixels (`xq`, the B operand: a tile row is one group at 16 pixels, made a vector
  of pixels at a time as `int8`'s pack makes `quads`; C under 64 channels one step of its
  groups, not padded to 16), a unit's pixels at a time (in row slices where those chunks
  are fewer than the threads), the units pixel-major where the image outweighs W^T so that
  a unit reads the pixels its own thread packed. Knobs `AmxInt8Config` (row tiles are
  output channels, column tiles pixels; 2 x 2 by default).

It must never be chosen for a target without the tiles (its Templates' `features`), nor read
A, the image or the weights outside what they hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.quantized import GROUP_COLUMNS, GROUP_DEPTH
from ..quantized_problems import (QuantizedConvProblem, QuantizedDenseProblem, quantized_conv,
                                  quantized_dense, untailed_groups)
from ..space import Constraint, Space, Template
from . import amx_conv
from .amx import AMX_INT8_FEATURES, TILES_FIT
from .amx_dense import power_of_two_below, unit_cols
from .int8 import (DenseTile, Int8Config, cast_to, dot_widths, pixel_vectors, pointwise,
                   requantized, zero_point)

ROWS = L.TILE_ROWS          # rows of a tile; words (4 bytes of k) of a tile row
TILE_WORDS = ROWS * ROWS    # words of a tile (1 KB)


def int8_products(features: frozenset[str]) -> str:
    """How a target of `features` computes int8 products (what `bench/` prints): AMX-INT8
    tiles, a vpdpbusd form, or int32 widening."""
    if AMX_INT8_FEATURES <= features:
        return "AMX-INT8 tiles (tdpbusd / tdpbssd / tdpbsud)"
    widths = dot_widths(features)
    if widths:
        return f"{'AVX-512 VNNI' if widths[0] == 16 else 'AVX-VNNI'} (vpdpbusd)"
    return "widening to int32 (no VNNI)"


def tile_precision(p, transposed: bool = False) -> str:
    """The `TileProduct` precision of a problem's activations: tdpbssd for int8, tdpbusd
    for uint8 (tdpbsud where the weights are A: blocks of Y^T)."""
    if p.signed:
        return "s8s8"
    return "s8u8" if transposed else "u8s8"


@dataclass(frozen=True)
class AmxInt8Config:
    row_tiles: int    # C tiles of a block along Y's rows
    col_tiles: int    # C tiles (16-column panels) of a block along Y's columns
    unit_rows: int    # row blocks of a worker-pool unit
    unit_cols: int    # column blocks of a worker-pool unit


class _Geometry:
    """The sizes a config gives a QuantizedDense: k steps, blocks, units."""

    def __init__(self, p: QuantizedDenseProblem, config: AmxInt8Config):
        self.config = config
        self.groups = -(-p.k // GROUP_DEPTH)        # words of k a row
        self.panels = -(-p.n // GROUP_COLUMNS)
        self.full_steps, self.tail = divmod(self.groups, ROWS)
        self.steps = self.full_steps + (self.tail > 0)
        self.bm, self.bn = ROWS * config.row_tiles, ROWS * config.col_tiles
        self.row_blocks = -(-p.m // self.bm)
        self.row_tiles = self.row_blocks * config.row_tiles
        self.col_blocks = -(-self.panels // config.col_tiles)
        self.last_tiles = self.panels - (self.col_blocks - 1) * config.col_tiles
        self.row_groups = -(-self.row_blocks // config.unit_rows)
        self.col_groups = -(-self.col_blocks // config.unit_cols)
        self.units = self.row_groups * self.col_groups


def space(p: QuantizedDenseProblem, machine) -> Space:
    row_blocks = [-(-p.m // (ROWS * r)) for r in (1, 2, 3)]
    col_blocks = [-(-p.n // (ROWS * c)) for c in (1, 2)]
    return Space("amx_dense_int8", AmxInt8Config, {
        "row_tiles": (1, 2, 3), "col_tiles": (1, 2), "unit_rows": (1, 2, 4, 8),
        "unit_cols": (1, 2, 4, 8, 16, 32, 64, 128)}, [
        TILES_FIT,
        Constraint(f"unit_rows < 2 * row blocks (m = {p.m}): no unit twice the rows",
                   lambda c: c.unit_rows < 2 * row_blocks[c.row_tiles - 1]),
        Constraint(f"unit_cols < 2 * column blocks (n = {p.n}): no unit twice the columns",
                   lambda c: c.unit_cols < 2 * col_blocks[c.col_tiles - 1])])


def default(p: QuantizedDenseProblem, machine) -> AmxInt8Config:
    """2 x 2 tiles where both extents have two (4 C tiles, 2 A and 2 B tiles a step: AMX's
    8 registers, as oneDNN's brgemm blocks), else 1 x 2 or 3 x 1; units of up to 4 row blocks
    (fewer where the threads would lack units) by the column blocks `unit_cols` balances
    (as `amx_dense.default`)."""
    two = p.n > ROWS
    cols = 2 if two else 1
    rows = max(1, min(2 if two else 3, -(-p.m // ROWS)))
    row_blocks, col_blocks = -(-p.m // (ROWS * rows)), -(-p.n // (ROWS * cols))
    threads = machine.threads
    unit_rows = max(1, min(4, row_blocks // threads if threads > 1 else row_blocks))
    unit_rows = power_of_two_below(min(unit_rows, row_blocks))
    return AmxInt8Config(rows, cols, unit_rows,
                         unit_cols(-(-row_blocks // unit_rows), col_blocks, threads))


def build(p: QuantizedDenseProblem, config: AmxInt8Config, machine) -> L.PrimFunc:
    g = _Geometry(p, config)
    tile = DenseTile(p, Int8Config(1, GROUP_COLUMNS))   # the views, A's row sums
    par = L.ForKind.PARALLEL if machine.threads > 1 else L.ForKind.SERIAL
    w = L.Buffer(p.w.name, T.uint32, (g.panels * g.groups * ROWS,))
    atiles = L.Buffer("atiles", T.uint32, (g.row_tiles * g.steps * TILE_WORDS,),
                      L.Scope.GLOBAL)
    wtail = L.Buffer("wtail", T.uint32, (g.panels * TILE_WORDS,), L.Scope.GLOBAL) \
        if g.tail else None
    stmts = [_pack_a(p, g, tile, atiles, par)]
    if wtail is not None:
        stmts.append(_pad_tail(g, w, wtail))
    if p.w_zp is not None:
        stmts.append(tile.sum_rows(machine.threads))
    stmts.append(_blocks(p, g, tile, atiles, w, wtail, par))
    body = L.seq(*stmts)
    for buffer in (atiles, wtail, tile.row_sums if p.w_zp is not None else None):
        if buffer is not None:
            body = L.Allocate(buffer, body)
    views = {b.name: b for b in (tile.a, w, tile.y)}
    params = tuple(views.get(x.name, x) for x in p.params)
    return L.simplify(L.PrimFunc(p.name, params, body))


def _pack_a(p: QuantizedDenseProblem, g: _Geometry, tile: DenseTile, atiles: L.Buffer,
            par: L.ForKind) -> L.Stmt:
    """`atiles`: word w of row ii of step t of row tile u, A's bytes 4 (16 t + w) .. + 3 of
    row 16 u + ii (the last row past M; bytes past K zero), unflipped; steps wholly inside
    K read without guards."""
    u, t, ii, w = L.Var("u"), L.Var("t"), L.Var("ii"), L.Var("w")
    row = L.minimum(u * ROWS + ii, p.m - 1)
    whole = p.k // GROUP_DEPTH // ROWS

    def run(first: int, count: int, guard: bool) -> L.Stmt:
        step = first + t
        word = tile.word(row, step * ROWS + w, guard, flip=False)
        store = L.Store(atiles, (((u * g.steps + step) * ROWS + ii) * ROWS + w,), word)
        return L.For(t, count, L.For(ii, ROWS, L.For(w, ROWS, store, L.ForKind.VECTORIZED)))

    parts = [run(0, whole, False)] if whole else []
    if g.steps > whole:
        parts.append(run(whole, g.steps - whole, True))
    return L.For(u, g.row_tiles, L.seq(*parts), par if g.row_tiles > 1 else L.ForKind.SERIAL)


def _pad_tail(g: _Geometry, w: L.Buffer, wtail: L.Buffer) -> L.Stmt:
    """`wtail`: each panel's last `tail` groups, then zero rows to a whole tile."""
    jp, q, j = L.Var("jp"), L.Var("q"), L.Var("j")
    group = g.full_steps * ROWS + L.minimum(q, g.tail - 1)
    value = L.Select(q < g.tail, w[(jp * g.groups + group) * ROWS + j], L.Const(0, T.uint32))
    return L.For(jp, g.panels, L.For(q, ROWS, L.For(
        j, ROWS, L.Store(wtail, ((jp * ROWS + q) * ROWS + j,), value), L.ForKind.VECTORIZED)))


def _products(p, g: _Geometry, cacc: L.Buffer, atiles: L.Buffer, w: L.Buffer,
              wtail: L.Buffer | None, rb, cb, col_tiles: int) -> list[L.Stmt]:
    """A block's tile products: the whole steps from the panels in place, the tail step
    from `wtail`."""
    c, precision = g.config, tile_precision(p)
    jp = cb * c.col_tiles
    a_at = rb * c.row_tiles * g.steps * TILE_WORDS
    a_layout = (ROWS, g.steps * TILE_WORDS, TILE_WORDS)
    out = []
    if g.full_steps:
        out.append(L.TileProduct(
            precision, cacc[0], atiles[a_at], w[jp * g.groups * ROWS], g.bn, a_layout,
            (ROWS, g.groups * ROWS, TILE_WORDS), c.row_tiles, col_tiles, g.full_steps,
            accumulate=False))
    if wtail is not None:
        out.append(L.TileProduct(
            precision, cacc[0], atiles[a_at + g.full_steps * TILE_WORDS],
            wtail[jp * TILE_WORDS], g.bn, a_layout, (ROWS, TILE_WORDS, 0), c.row_tiles,
            col_tiles, 1, accumulate=g.full_steps > 0))
    return out


def _blocks(p: QuantizedDenseProblem, g: _Geometry, tile: DenseTile, atiles: L.Buffer,
            w: L.Buffer, wtail, par: L.ForKind) -> L.Stmt:
    """Every unit's blocks (column blocks outside, row blocks inside: a block's B tiles read
    again from L1 by the unit's next row block), each its products and its store; the last
    column block with the panels left."""
    c = g.config
    v, cl, rl = L.Var("v"), L.Var("cl"), L.Var("rl")
    rb = v // g.col_groups * c.unit_rows + rl
    cb = v % g.col_groups * c.unit_cols + cl
    cacc = L.Buffer("cacc", T.int32, (g.bm * g.bn,), L.Scope.LOCAL)

    def block(col_tiles: int, width: int) -> L.Stmt:
        return L.seq(*_products(p, g, cacc, atiles, w, wtail, rb, cb, col_tiles),
                     _store(p, g, tile, cacc, rb, cb, width))

    last_width = p.n - (g.col_blocks - 1) * g.bn
    if g.last_tiles == c.col_tiles and last_width == g.bn:
        body = block(c.col_tiles, g.bn)
    else:   # the last column block: its panels, the columns left
        last = block(g.last_tiles, last_width)
        body = L.If(cb < g.col_blocks - 1, block(c.col_tiles, g.bn), last) \
            if g.col_blocks > 1 else last
    body = L.Allocate(cacc, body)
    rows = L.For(rl, c.unit_rows, L.If(rb < g.row_blocks, body)
                 if g.row_blocks % c.unit_rows else body)
    cols = L.For(cl, c.unit_cols, L.If(cb < g.col_blocks, rows)
                 if g.col_blocks % c.unit_cols else rows)
    return L.For(v, g.units, cols, par if g.units > 1 else L.ForKind.SERIAL)


def _store(p: QuantizedDenseProblem, g: _Geometry, tile: DenseTile, cacc: L.Buffer, rb, cb,
           width: int) -> L.Stmt:
    """The block's int32 sums through the compensations, the finish and the fused
    consumers into Y: its rows below M, `width` columns a row in one vector loop."""
    x, y = L.Var("sx"), L.Var("sy")
    i, j = rb * g.bm + x, cb * g.bn + y
    acc = tile.compensated(cacc[x * g.bn + y] - zero_point(p, False) * p.sums[j], i, j)
    value = p.epilogue(requantized(p, acc, j), p.anchor_index(i, j))
    store = L.Store(tile.y, (i, j), cast_to(value, p.y.dtype))
    return L.For(x, g.bm, L.If(i < p.m, L.For(
        y, width, store, L.ForKind.VECTORIZED if width >= 2 else L.ForKind.SERIAL)))


# -- conv ---------------------------------------------------------------------------------------


def conv_space(p: QuantizedConvProblem, machine) -> Space:
    return amx_conv.space(p, machine, transposed=False)


def conv_default(p: QuantizedConvProblem, machine) -> amx_conv.AmxConvConfig:
    return amx_conv.default_for(p, GROUP_DEPTH)


def conv_build(p: QuantizedConvProblem, config: amx_conv.AmxConvConfig,
               machine) -> L.PrimFunc:
    n, c, h, wid = p.x_dims
    m, _, kh, kw = p.w_dims
    g = amx_conv.ConvGeometry(p, config, GROUP_DEPTH)
    w5 = L.Buffer(p.w.name, T.uint32, (g.panels, g.pairs, kh, kw, GROUP_COLUMNS))
    # the zero point's byte in each byte of a word: a padding pixel adds nothing once the
    # compensation is taken
    pad = L.BinOp("&", L.Cast(T.uint32, zero_point(p, False)), L.Const(0xFF, T.uint32)) * \
        L.Const(0x01010101, T.uint32)

    def quad(bi, q, yy, xx) -> L.Expr:
        """Channels 4q .. 4q + 3 of pixel (yy, xx), a byte each (past C: channel C - 1,
        whose weights there are 0)."""
        word = None
        for t in range(GROUP_DEPTH):
            byte = L.Cast(T.uint32, L.Cast(T.uint8, p.x[bi, L.minimum(
                q * GROUP_DEPTH + t, c - 1), yy, xx]))
            byte = byte if t == 0 else L.BinOp("<<", byte, L.Const(8 * t, T.uint32))
            word = byte if word is None else L.BinOp("|", word, byte)
        return word

    def finish(acc: L.Expr, index: tuple) -> L.Expr:
        ch = index[1]
        value = requantized(p, acc - zero_point(p, False) * p.sums[ch], ch)
        return cast_to(p.epilogue(value, index), p.y.dtype)

    body = amx_conv.tile_conv(p, g, machine, w5, quad, pad, tile_precision(p), finish)
    params = tuple(w5 if x.name == w5.name else x for x in p.params)
    return L.simplify(L.PrimFunc(p.name, params, body))


# -- pointwise conv (blocks of Y^T) -------------------------------------------------------------


class _Pointwise:
    """The sizes a config gives a 1x1 stride-1 unpadded conv as blocks of Y^T = W^T X: rows
    the output channels (row_tiles tiles a block), columns an image's pixels (col_tiles)."""

    def __init__(self, p: QuantizedConvProblem, config: AmxInt8Config, threads: int = 1):
        n, c, h, w = p.x_dims
        self.config, self.images, self.channels = config, n, p.y_dims[1]
        self.pixels = h * w
        self.groups = -(-c // GROUP_DEPTH)              # words of k
        # k under one step: one step of its words (`TileProduct.tail`); else whole steps,
        # the last padded (a tail beside whole steps takes 4 more tile registers)
        self.tail = self.groups if self.groups < ROWS else 0
        self.steps = -(-self.groups // ROWS)
        self.whole = 0 if self.tail else self.steps
        self.rows = self.tail or self.steps * ROWS      # rows of `xq` an image
        self.bm, self.bn = ROWS * config.row_tiles, ROWS * config.col_tiles
        self.row_blocks = -(-self.channels // self.bm)
        self.col_blocks = -(-self.pixels // self.bn)
        self.width = self.col_blocks * self.bn          # a row of `xq`: whole pixel blocks
        self.row_groups = -(-self.row_blocks // config.unit_rows)
        self.col_groups = -(-self.col_blocks // config.unit_cols)
        self.units = n * self.row_groups * self.col_groups
        self.tiles = self.row_blocks * config.row_tiles     # tile rows of `wt`
        self.chunks = n * self.col_groups                    # `xq`'s units of pixels
        # a chunk's rows in slices where the chunks are fewer than the threads (a 14 x 14
        # plane of 576 channels: 7 chunks of 144 rows)
        self.slice_rows = -(-self.rows // max(1, min(self.rows, -(-threads // self.chunks))))
        self.slices = -(-self.rows // self.slice_rows)
        # the larger operand is read where it was made: units of one pixel group side by
        # side (their thread packed those pixels) where the image outweighs W^T, else units
        # of one channel group (their thread copied those tiles)
        self.pixel_major = self.rows * self.width * n >= self.tiles * self.steps * TILE_WORDS
        self.packs = max(self.chunks * self.slices, self.tiles)


def pointwise_space(p: QuantizedConvProblem, machine) -> Space:
    return y_t_space("amx_pointwise_int8", p.y_dims[1], p.x_dims[2] * p.x_dims[3])


def pointwise_default(p: QuantizedConvProblem, machine) -> AmxInt8Config:
    return y_t_default(p.y_dims[1], p.x_dims[2] * p.x_dims[3], p.x_dims[0], machine)


def y_t_space(name: str, m: int, pixels: int) -> Space:
    """The knobs of blocks of Y^T of `m` output channels (rows) by `pixels` an image."""
    row_blocks = [-(-m // (ROWS * r)) for r in (1, 2, 3)]
    col_blocks = [-(-pixels // (ROWS * c)) for c in (1, 2, 3)]
    return Space(name, AmxInt8Config, {
        "row_tiles": (1, 2, 3), "col_tiles": (1, 2, 3), "unit_rows": (1, 2, 4, 8),
        "unit_cols": (1, 2, 4, 8, 16, 32)}, [
        TILES_FIT,
        Constraint(f"unit_rows < 2 * channel blocks (M = {m})",
                   lambda c: c.unit_rows < 2 * row_blocks[c.row_tiles - 1]),
        Constraint(f"unit_cols < 2 * pixel blocks ({pixels} pixels)",
                   lambda c: c.unit_cols < 2 * col_blocks[c.col_tiles - 1])])


def y_t_default(m: int, pixels: int, n: int, machine) -> AmxInt8Config:
    """2 x 2 tiles where channels and pixels have two each, else 3 x 1 or 1 x 3; units of up
    to 4 channel blocks (fewer where the threads would lack units) by the pixel blocks
    `unit_cols` balances."""
    rows = 2 if m > ROWS else 1
    cols = 2 if pixels > ROWS else 1
    if rows == 1 and cols == 2:
        cols = 3
    elif cols == 1 and rows == 2:
        rows = 3
    row_blocks, col_blocks = -(-m // (ROWS * rows)), -(-pixels // (ROWS * cols))
    threads = machine.threads
    unit_rows = max(1, min(4, n * row_blocks // threads if threads > 1 else row_blocks))
    unit_rows = power_of_two_below(min(unit_rows, row_blocks))
    return AmxInt8Config(rows, cols, unit_rows, min(32, unit_cols(
        n * -(-row_blocks // unit_rows), col_blocks, threads)))


def pointwise_build(p: QuantizedConvProblem, config: AmxInt8Config, machine) -> L.PrimFunc:
    """Each call: the weights copied into tiles of W^T (`wt`: [channel tiles, steps, 16
    channels, 16 groups], zero past M and C) and the image into groups of 4 channels by pixels
    (`xq`: [images, groups, pixels rounded up to a block], zero past the pixels, vector rows
    as `int8`'s pack; groups: ceil(C / 4) where under 16, one step of that depth
    (`TileProduct.tail`: a 16-channel layer's image was three quarters zeros padded to 64
    bytes), else padded to whole steps with zero rows), both in one parallel region (a layer
    takes tens of us at 16 threads, so a region's fork and join count), then every block's
    tile product over C and its store, an output channel's pixels one vector of the NCHW
    plane."""
    g = _Pointwise(p, config, machine.threads)
    n, c, h, wid = p.x_dims
    par = L.ForKind.PARALLEL if machine.threads > 1 else L.ForKind.SERIAL
    w = L.Buffer(p.w.name, T.uint32, (-(-g.channels // GROUP_COLUMNS), g.groups,
                                      GROUP_COLUMNS))
    x = L.Buffer(p.x.name, p.x.dtype, (n, c, g.pixels))
    y = L.Buffer(p.y.name, p.y.dtype, (n, g.channels, g.pixels))
    wt = L.Buffer("wt", T.uint32, (g.tiles * g.steps * TILE_WORDS,), L.Scope.GLOBAL)
    xq = L.Buffer("xq", T.uint32, (n * g.rows * g.width,), L.Scope.GLOBAL)
    v = L.Var("v")
    # pack v: slice v of the image, and tile row v tiles // packs where v starts it
    # (tiles <= packs: at most one a pack, spread evenly as the blocks' units spread)
    starts = v * g.tiles % g.packs < g.tiles if g.tiles < g.packs else None
    weights = _pack_weights(g, w, wt, v * g.tiles // g.packs)
    image = _pack_pixels(p, g, x, xq, v)
    images = g.chunks * g.slices
    packs = L.seq(image if images == g.packs else L.If(v < images, image),
                  weights if starts is None else L.If(starts, weights))
    stmts = [L.For(v, g.packs, packs, par), _pointwise_blocks(p, g, wt, xq, y, par)]
    body = L.Allocate(wt, L.Allocate(xq, L.seq(*stmts)))
    views = {b.name: b for b in (w, x, y)}
    params = tuple(views.get(b.name, b) for b in p.params)
    return L.simplify(L.PrimFunc(p.name, params, body))


def _pack_weights(g: _Pointwise, w: L.Buffer, wt: L.Buffer, u: L.Expr) -> L.Stmt:
    """`wt`'s tile row `u` (16 output channels) over every step: channel ii's word q of step
    t is its group t x 16 + q, zero past M and C."""
    t, ii, q = L.Var("t"), L.Var("ii"), L.Var("q")
    ch, group = u * ROWS + ii, t * ROWS + q
    word = L.Select(L.logical_and(ch < g.channels, group < g.groups), w[
        L.minimum(ch, g.channels - 1) // GROUP_COLUMNS, L.minimum(group, g.groups - 1),
        L.minimum(ch, g.channels - 1) % GROUP_COLUMNS], L.Const(0, T.uint32))
    return L.For(t, g.steps, L.For(ii, ROWS, L.For(q, ROWS, L.Store(
        wt, (((u * g.steps + t) * ROWS + ii) * ROWS + q,), word), L.ForKind.VECTORIZED)))


def _pack_pixels(p: QuantizedConvProblem, g: _Pointwise, x: L.Buffer, xq: L.Buffer,
                 v: L.Expr) -> L.Stmt:
    """`xq`'s slice `v` (image, a unit's pixel blocks, `slice_rows` rows) in its rows (group
    kk), word px: channels 4 kk .. 4 kk + 3 of pixel px (past C: channel C - 1, whose weights
    are 0 in `wt`), a vector of pixels a block; zero past the pixels and for groups past C's
    (a padded step's)."""
    c, bn = p.x_dims[1], g.bn
    k, cl, px = L.Var("k"), L.Var("cl"), L.Var("px")
    chunk, kk = v // g.slices, v % g.slices * g.slice_rows + k
    bi, cb = chunk // g.col_groups, chunk % g.col_groups * g.config.unit_cols + cl
    word = None
    for t in range(GROUP_DEPTH):
        byte = L.Cast(T.uint32, L.Cast(T.uint8, x[bi, L.minimum(kk * GROUP_DEPTH + t, c - 1),
                                                  cb * bn + px]))
        byte = byte if t == 0 else L.BinOp("<<", byte, L.Const(8 * t, T.uint32))
        word = byte if word is None else L.BinOp("|", word, byte)
    vec = L.ForKind.VECTORIZED
    zero = L.Const(0, T.uint32)
    row = (bi * g.rows + kk) * g.width + cb * bn

    def block(count: int, value: L.Expr) -> L.Stmt:
        return L.For(px, count, L.Store(xq, (row + px,), value), vec)

    last = g.pixels - (g.col_blocks - 1) * bn
    pixels = block(bn, word)
    if last < bn:   # the last block: its pixels, then zeros
        pixels = L.If(cb < g.col_blocks - 1, pixels, L.seq(block(last, word), L.For(
            px, bn - last, L.Store(xq, (row + last + px,), zero), vec)))
    if g.rows > g.groups:
        pixels = L.If(kk < g.groups, pixels, block(bn, zero))
    blocks = L.For(cl, g.config.unit_cols, L.If(cb < g.col_blocks, pixels)
                   if g.col_blocks % g.config.unit_cols else pixels)
    return L.For(k, g.slice_rows, L.If(kk < g.rows, blocks)
                 if g.rows % g.slice_rows else blocks)


def _pointwise_blocks(p: QuantizedConvProblem, g: _Pointwise, wt: L.Buffer, xq: L.Buffer,
                      y: L.Buffer, par: L.ForKind) -> L.Stmt:
    """Every unit's blocks, channel blocks outside pixel blocks (a unit writes its planes
    front to back: amx_dense.ORDER_OF_Y_T's finding), each C^T over every step then its
    store; units of a pixel group side by side where `pixel_major` (the pack's chunk v is
    unit v's pixels then), else of a channel group."""
    c = g.config
    v, rl, cl = L.Var("v"), L.Var("rl"), L.Var("cl")
    per_image = g.row_groups * g.col_groups
    bi, rest = v // per_image, v % per_image
    if g.pixel_major:
        rb = rest % g.row_groups * c.unit_rows + rl
        cb = rest // g.row_groups * c.unit_cols + cl
    else:
        rb = rest // g.col_groups * c.unit_rows + rl
        cb = rest % g.col_groups * c.unit_cols + cl
    cacc = L.Buffer("cacc", T.int32, (g.bm * g.bn,), L.Scope.LOCAL)
    product = L.TileProduct(
        tile_precision(p, transposed=True), cacc[0],
        wt[rb * c.row_tiles * g.steps * TILE_WORDS],
        xq[bi * g.rows * g.width + cb * g.bn], g.bn,
        (ROWS, g.steps * TILE_WORDS, TILE_WORDS), (g.width, ROWS, ROWS * g.width),
        c.row_tiles, c.col_tiles, g.whole, accumulate=False, tail=g.tail)
    sx, sy = L.Var("sx"), L.Var("sy")
    ch, pix = rb * g.bm + sx, cb * g.bn + sy
    ow = p.y_dims[3]
    value = requantized(p, cacc[sx * g.bn + sy] - zero_point(p, False) * p.sums[ch], ch)
    store = L.Store(y, (bi, ch, pix), cast_to(p.epilogue(value, (bi, ch, pix // ow, pix % ow)),
                                              p.y.dtype))

    def line(width: int) -> L.Stmt:
        return L.For(sx, g.bm, L.If(ch < g.channels, L.For(
            sy, width, store, L.ForKind.VECTORIZED if width >= 2 else L.ForKind.SERIAL)))

    last = g.pixels - (g.col_blocks - 1) * g.bn
    stores = line(g.bn) if last == g.bn else L.If(cb < g.col_blocks - 1, line(g.bn),
                                                  line(last))
    block = L.Allocate(cacc, L.seq(product, stores))
    cols = L.For(cl, c.unit_cols, L.If(cb < g.col_blocks, block)
                 if g.col_blocks % c.unit_cols else block)
    rows = L.For(rl, c.unit_rows, L.If(rb < g.row_blocks, cols)
                 if g.row_blocks % c.unit_rows else cols)
    return L.For(v, g.units, rows, par if g.units > 1 else L.ForKind.SERIAL)


AMX_DENSE_INT8 = Template("amx_dense_int8", quantized_dense, untailed_groups, space,
                          default, build, features=AMX_INT8_FEATURES)

# a pointwise conv of fewer pixels than a tile's 16 columns (`int8.few_pixels`:
# squeeze-excitation's on a pooled [C, 1, 1]) goes to `int8.CONV_INT8`'s vpdpbusd rows: its
# tiles would be one column in 16 and the per-call copy of W^T costs more than its products
# (efficientnet_b0's 32 took 0.39 ms on tiles at 16 threads, 0.20 on one, against float32's
# 0.11 / 0.07; Emerald Rapids)
AMX_POINTWISE_INT8 = Template("amx_pointwise_int8", quantized_conv, pixel_vectors,
                              pointwise_space, pointwise_default, pointwise_build,
                              features=AMX_INT8_FEATURES)


def one_group(p: QuantizedConvProblem) -> bool:
    """A conv of one group (grouped ones: `int8.CONV_INT8`, whose panels read their groups'
    channels), not a pointwise one of few pixels (`int8.few_pixels`: AMX_POINTWISE_INT8's
    comment)."""
    return p.group == 1 and (pixel_vectors(p) or not pointwise(p))


AMX_CONV_INT8 = Template("amx_conv_int8", quantized_conv, one_group, conv_space,
                         conv_default, conv_build, features=AMX_INT8_FEATURES)
