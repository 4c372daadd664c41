"""The bf16 dense products on AMX tiles (Sapphire Rapids and later): MatMulPacked and 1x1
ConvPacked (`PointwiseDense`) at precision bf16, where the target has amx-tile and amx-bf16.

A template of its own rather than a knob of `dense.py`: a knob is the tuner's to set and
every config of a space must run on the machine it is built for, while tiles run only where
the CPU has them; the template table's `features` filter (`space.Template`) makes the choice
a property of the target's feature string, as vdpbf16ps's is, and a machine without AMX never
sees this template, so its products are exactly as before. The tile blocking is a knob space
of its own (tiles, not vector registers), which the tuner searches like any other.

A block of row_tiles x col_tiles tiles of 16 x 16 fp32 (2 x 2: 4 C tiles, 2 A and 2 B tiles
a step, AMX's 8 registers, as oneDNN's brgemm blocks bf16) accumulates over the whole of K
in tile registers (`TileProduct`), is stored to a local buffer, and the epilogue (alpha,
bias, the fused consumers) is applied to those fp32 sums as they are stored. `rows_along`
says what a block's rows are:

- **"m"**: Y's rows (A's). B stays as `convert_layout` packed it ([panels, ceil(K / 2), NR]
  words of bf16 pairs along K, NR a multiple of 16): that is AMX's B layout already, a tile
  being 16 rows of pairs by 16 columns of a panel, rows NR words apart; only K's tail
  (ceil(K / 2) not a multiple of 16) is copied, once a call, into a zero-padded tile a panel
  (`btail`), so a tile never reads past B and the constants are the same on every CPU. A is
  rounded to bf16 pairs and packed once a call into whole tiles (`atiles`: [batch, row
  tiles, k steps, 16, 16] words, 1 KB a tile), rows past M repeating the last (never
  stored), pairs past K zero.
- **"n"**: Y's columns: blocks of Y^T = B^T A^T, for a 1x1 conv's NCHW output, where an
  output channel's pixels are consecutive: stored along a tile row, not one lane a channel
  apart (by count, not measured: a 32 x 32 block's 1024 scattered stores against 8
  tdpbf16ps, ~128 cycles, at 64 input channels). B's panels are copied once a call into whole tiles of B^T (`wtiles`), A
  into pairs of K by output pixels (`xpairs`: [batch, k steps x 16, pixels rounded up to a
  block], zero past K), the B operand.

The default takes "n" for a 1x1 conv of at least as many output pixels as pairs of input
channels (its stores outweigh copying the weights), "m" otherwise. The worker pool shares
units of unit_rows row blocks by unit_cols column blocks, after the packing (parallel over
tiles); knobs `AmxConfig`. It must never be chosen for a target without the tiles (its
Template's `features`), nor read B or the packed operands outside what it wrote.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Dense, PointwiseDense
from ..space import Constraint, Space, Template
from . import bf16
from .amx import AMX_FEATURES, TILES_FIT
from .dense import DenseViews

ROWS = L.TILE_ROWS          # rows of a tile; words (bf16 pairs, fp32) of a tile row
TILE_WORDS = ROWS * ROWS    # words of a tile (1 KB)


@dataclass(frozen=True)
class AmxConfig:
    rows_along: str   # "m": a block's rows are Y's rows; "n": Y's columns (blocks of Y^T)
    row_tiles: int    # C tiles of a block along its rows
    col_tiles: int    # C tiles of a block along its columns
    unit_rows: int    # row blocks of a worker-pool unit
    unit_cols: int    # column blocks of a worker-pool unit
    # a unit's outer loop: "columns" (its column blocks outside its row blocks: a column
    # block's B tiles read again from L1 by the next row block) or "rows" (a row block's
    # columns one after another: Y written a block row at a time, `default`)
    order: str = "columns"


def applies(p: Dense) -> bool:
    """B in bf16 pairs (MatMulPacked / a 1x1 ConvPacked at bf16) in panels of whole tiles."""
    return p.pairs and p.packed_panel % ROWS == 0 and not p.b_batched


class _Geometry:
    """The sizes a config gives a problem: k steps, blocks (rows R = m or n, columns S the
    other), units."""

    def __init__(self, p: Dense, config: AmxConfig):
        self.p, self.config = p, config
        self.along_m = config.rows_along == "m"
        self.r, self.s = (p.m, p.n) if self.along_m else (p.n, p.m)
        self.nr = p.packed_panel
        self.panels = p.b_dims[0]
        self.pairs = -(-p.k // 2)
        self.full_steps, self.tail = divmod(self.pairs, ROWS)
        self.steps = self.full_steps + (self.tail > 0)
        self.bm, self.bn = ROWS * config.row_tiles, ROWS * config.col_tiles
        row_tiles = -(-self.r // ROWS)
        self.row_tiles = -(-row_tiles // config.row_tiles) * config.row_tiles
        self.row_blocks = self.row_tiles // config.row_tiles
        self.col_blocks = -(-self.s // self.bn)
        self.row_groups = -(-self.row_blocks // config.unit_rows)
        self.col_groups = -(-self.col_blocks // config.unit_cols)
        self.units = p.batch * self.row_groups * self.col_groups


def _blocks(extent: int, tiles: int) -> int:
    return -(-extent // (ROWS * tiles))


def space(p: Dense, machine) -> Space:
    nr = p.packed_panel

    def extents(c):
        return (p.m, p.n) if c.rows_along == "m" else (p.n, p.m)

    constraints = [
        TILES_FIT,
        Constraint(f"rows_along == 'n' or 16 * col_tiles divides the panel width {nr}: a "
                   f"block's B tiles lie in one panel",
                   lambda c: c.rows_along == "n" or nr % (ROWS * c.col_tiles) == 0),
        Constraint(f"unit_rows < 2 * row blocks (m = {p.m}, n = {p.n}): no unit twice the "
                   f"rows", lambda c: c.unit_rows < 2 * _blocks(extents(c)[0], c.row_tiles)),
        Constraint(f"unit_cols < 2 * column blocks (m = {p.m}, n = {p.n}): no unit twice the "
                   f"columns",
                   lambda c: c.unit_cols < 2 * _blocks(extents(c)[1], c.col_tiles)),
    ]
    return Space("amx_dense", AmxConfig, {
        "rows_along": ("m", "n"), "row_tiles": (1, 2, 3), "col_tiles": (1, 2),
        "unit_rows": (1, 2, 4, 8), "unit_cols": (1, 2, 4, 8, 16, 32, 64, 128),
        "order": ("columns", "rows")}, constraints)


def default(p: Dense, machine) -> AmxConfig:
    """Blocks of Y^T for a 1x1 conv of at least as many pixels as pairs of input channels,
    of Y otherwise (module docstring); 2 x 2 tiles where both extents have two (along m, and
    the panel holds two), else 1 x 2 or 3 x 1; units of up to 4 row blocks (fewer where the
    threads would lack units) by the column blocks `unit_cols` balances; a unit's row
    blocks outside its column blocks for Y^T (`ORDER_OF_Y_T`), inside for Y."""
    along = "n" if isinstance(p, PointwiseDense) and p.m >= -(-p.k // 2) else "m"
    r, s = (p.m, p.n) if along == "m" else (p.n, p.m)
    two = s > ROWS and (along == "n" or p.packed_panel % (2 * ROWS) == 0)
    cols = 2 if two else 1
    rows = max(1, min(2 if two else 3, -(-r // ROWS)))
    row_blocks, col_blocks = _blocks(r, rows), _blocks(s, cols)
    threads = machine.threads
    unit_rows = max(1, min(4, p.batch * row_blocks // threads if threads > 1 else row_blocks))
    unit_rows = power_of_two_below(min(unit_rows, row_blocks))
    row_units = p.batch * -(-row_blocks // unit_rows)
    return AmxConfig(along, rows, cols, unit_rows, unit_cols(row_units, col_blocks, threads),
                     ORDER_OF_Y_T if along == "n" else "columns")


ORDER_OF_Y_T = "rows"
"""A unit's outer loop for blocks of Y^T (1x1 convs of many pixels): its row blocks (output
channels), so that Y's NCHW planes are written a block's 32 channels at a time, each plane
front to back, where column blocks outside kept 4 row blocks' 128 planes open at once, 128
bytes of each a block. Why: resnet50's 1x1 64->256 at 56^2, one thread on the Emerald Rapids
host, ran at 98 GFLOP/s on the tiles against 132 in fp32 (bench/amx_bf16.py), 1.05 ms: by
count its 6272 tdpbf16ps (16 cycles each) are ~0.05 ms and its packing (`xpairs`, 100 K
words; an image of that size is made in 0.05 ms on znver5) about as much, so the rest is
the blocks' stores, 3.2 MB of Y (inferred, not profiled: every line a demand miss while 128
planes advance at once, more write streams than the L2 streamer follows); with 2 k steps a
block has too little product to hide them (256->64, 8 steps: 217 GFLOP/s). At 16 threads a
unit holds one row block (`default`) and the order is moot. The other order stays in the
space (`order`); `bench/amx_bf16.py --shapes convs` times both."""


UNIT_COST = 0.25
"""What a unit costs besides its blocks, in blocks (`unit_cols`)."""


def unit_cols(row_units: int, col_blocks: int, threads: int) -> int:
    """Column blocks a unit: the power of two (at most 128, below twice the blocks) whose
    units the threads finish soonest, each thread taking the next unit when it is free
    (the pool's chunks are claimed so), a unit costing its blocks and `UNIT_COST`; the widest
    on a tie. bert-base's 768 x 768 at 128 tokens on 16 threads (4 row units, 24 column
    blocks): 2 (48 units, 3 rounds of 2 blocks), not 4 (24 units: a second round leaving 8
    threads idle); one thread: every column block in one unit."""
    best, best_cost, cols = 1, None, 1
    while cols < 2 * col_blocks and cols <= 128:
        sizes = [cols] * (col_blocks // cols) + ([col_blocks % cols] if col_blocks % cols
                                                 else [])
        free = [0.0] * min(threads, row_units * len(sizes))
        for size in sizes * row_units:
            heapq.heapreplace(free, free[0] + size + UNIT_COST)
        cost = max(free)
        if best_cost is None or cost <= best_cost + 1e-9:
            best, best_cost = cols, cost
        cols *= 2
    return best


def power_of_two_below(x: int) -> int:
    """The largest power of two at most x (1 for x < 2)."""
    return 1 << (max(1, x).bit_length() - 1)


def build(p: Dense, config: AmxConfig, machine) -> L.PrimFunc:
    g = _Geometry(p, config)
    views = DenseViews(p, g.nr)
    par = L.ForKind.PARALLEL if machine.threads > 1 else L.ForKind.SERIAL
    operands = _Operands(p, g, views) if g.along_m else _Transposed(p, g, views)
    body = L.seq(operands.packing(par), _products(p, g, views, operands, par))
    for buffer in reversed(operands.buffers):
        body = L.Allocate(buffer, body)
    return L.simplify(L.PrimFunc(p.name, views.params(), body))


class _Operands:
    """Blocks of Y ("m"): A packed into tiles (`atiles`), B's panels read in place (K's tail
    from `btail`)."""

    def __init__(self, p: Dense, g: _Geometry, views: DenseViews):
        self.p, self.g, self.views = p, g, views
        self.atiles = L.Buffer("atiles", T.uint32, (p.batch * g.row_tiles * g.steps *
                                                    TILE_WORDS,), L.Scope.GLOBAL)
        self.btail = L.Buffer("btail", T.uint32, (g.panels * ROWS * g.nr,),
                              L.Scope.GLOBAL) if g.tail else None
        self.buffers = [b for b in (self.atiles, self.btail) if b is not None]

    def packing(self, par: L.ForKind) -> L.Stmt:
        p, g = self.p, self.g
        u = L.Var("u")
        bi, r = u // g.row_tiles, u % g.row_tiles
        pack = L.For(u, p.batch * g.row_tiles, _tiles_of_rows(
            p, g.steps, lambda ii, kk: self.views.a_at(bi, L.minimum(r * ROWS + ii, p.m - 1),
                                                       kk),
            lambda t, ii, w: self.atiles[((u * g.steps + t) * ROWS + ii) * ROWS + w],
            p.trans_a), par)
        return pack if self.btail is None else L.seq(pack, self._pad_b_tail())

    def _pad_b_tail(self) -> L.Stmt:
        """`btail`: each panel's last `tail` rows of pairs, then zero rows to a whole tile."""
        g = self.g
        jp, q, j = L.Var("jp"), L.Var("q"), L.Var("j")
        value = L.Select(q < g.tail, self.views.b[jp, g.full_steps * ROWS +
                                                  L.minimum(q, g.tail - 1), j],
                         L.Const(0, T.uint32))
        return L.For(jp, g.panels, L.For(q, ROWS, L.For(
            j, g.nr, L.Store(self.btail, ((jp * ROWS + q) * g.nr + j,), value),
            L.ForKind.VECTORIZED)))

    def products(self, cacc: L.Buffer, bi, rb, cb) -> list[L.Stmt]:
        g, c = self.g, self.g.config
        jp, c0 = cb * g.bn // g.nr, cb * g.bn % g.nr
        a_at = ((bi * g.row_tiles + rb * c.row_tiles) * g.steps) * TILE_WORDS
        a_layout = (ROWS, g.steps * TILE_WORDS, TILE_WORDS)
        out = []
        if g.full_steps:
            out.append(L.TileProduct(
                "bf16", cacc[0], self.atiles[a_at], self.views.b[jp, 0, c0], g.bn, a_layout,
                (g.nr, ROWS, ROWS * g.nr), c.row_tiles, c.col_tiles, g.full_steps,
                accumulate=False))
        if self.btail is not None:
            out.append(L.TileProduct(
                "bf16", cacc[0], self.atiles[a_at + g.full_steps * TILE_WORDS],
                self.btail[jp * ROWS * g.nr + c0], g.bn, a_layout, (g.nr, ROWS, 0),
                c.row_tiles, c.col_tiles, 1, accumulate=g.full_steps > 0))
        return out


class _Transposed:
    """Blocks of Y^T ("n"): B's panels copied into tiles of B^T (`wtiles`, rows the output
    columns), A into pairs of K by output rows (`xpairs`), the B operand."""

    def __init__(self, p: Dense, g: _Geometry, views: DenseViews):
        self.p, self.g, self.views = p, g, views
        self.width = g.col_blocks * g.bn   # a row of `xpairs`: Y's rows, whole blocks
        self.wtiles = L.Buffer("wtiles", T.uint32, (g.row_tiles * g.steps * TILE_WORDS,),
                               L.Scope.GLOBAL)
        self.xpairs = L.Buffer("xpairs", T.uint32, (p.batch * g.steps * ROWS * self.width,),
                               L.Scope.GLOBAL)
        self.buffers = [self.wtiles, self.xpairs]
        n, c, h, wid = p.image_dims if isinstance(p, PointwiseDense) else (0, 0, 0, 0)
        if isinstance(p, PointwiseDense) and tuple(p.strides) == (1, 1) and p.m == h * wid:
            flat = L.Buffer(p.a.name, p.a.dtype, (n, c, h * wid))
            self.a_at = lambda bi, i, kk: flat[bi, kk, i]
        else:
            self.a_at = views.a_at

    def packing(self, par: L.ForKind) -> L.Stmt:
        p, g = self.p, self.g
        u, t, ii, w = L.Var("u"), L.Var("t"), L.Var("ii"), L.Var("w")
        # wtiles: row ii of tile (u, t) is output column j = 16 u + ii, its pairs 16 t + w
        j, pair = u * ROWS + ii, t * ROWS + w
        jc = L.minimum(j, g.panels * g.nr - 1)
        word = L.Select(L.logical_and(pair < g.pairs, j < g.panels * g.nr),
                        self.views.b[jc // g.nr, L.minimum(pair, g.pairs - 1), jc % g.nr],
                        L.Const(0, T.uint32))
        weights = L.For(u, g.row_tiles, L.For(t, g.steps, L.For(ii, ROWS, L.For(
            w, ROWS, L.Store(self.wtiles, (((u * g.steps + t) * ROWS + ii) * ROWS + w,),
                             word), L.ForKind.VECTORIZED))), par)
        # xpairs: pair q of K for each output row i, zero past M (LLVM vectorises the rows:
        # a 1x1 stride-1 conv's pixels read as the flat plane they are)
        v, i = L.Var("v"), L.Var("i")
        bi, q = v // (g.steps * ROWS), v % (g.steps * ROWS)
        lo, hi = (L.Select(kk < p.k, self.a_at(bi, i, L.minimum(kk, p.k - 1)), L.const(0.0))
                  for kk in (2 * q, 2 * q + 1))
        rows = [L.For(i, p.m, L.Store(self.xpairs, (v * self.width + i,), bf16.pair(lo, hi)))]
        if self.width > p.m:
            rows.append(L.For(i, self.width - p.m, L.Store(
                self.xpairs, (v * self.width + p.m + i,), L.Const(0, T.uint32))))
        image = L.For(v, p.batch * g.steps * ROWS, L.seq(*rows), par)
        return L.seq(weights, image)

    def products(self, cacc: L.Buffer, bi, rb, cb) -> list[L.Stmt]:
        g, c = self.g, self.g.config
        a_at = (rb * c.row_tiles * g.steps) * TILE_WORDS
        b_at = bi * g.steps * ROWS * self.width + cb * g.bn
        return [L.TileProduct(
            "bf16", cacc[0], self.wtiles[a_at], self.xpairs[b_at], g.bn,
            (ROWS, g.steps * TILE_WORDS, TILE_WORDS), (self.width, ROWS, ROWS * self.width),
            c.row_tiles, c.col_tiles, g.steps, accumulate=False)]


def _tiles_of_rows(p: Dense, steps: int, a_at, slot, trans: bool) -> L.Stmt:
    """A row tile's k steps as whole 16 x 16 tiles of bf16 pairs (`slot(t, ii, w)`: where
    row ii's word w of step t goes; `a_at(ii, k)`: the tile's row ii at k), pairs past K
    zero. Steps wholly inside K read without guards, a word of 16 lanes a row (A stored
    [m, k]) or a row tile of 16 lanes a word (A stored [k, m]: a 1x1 conv's image, pixels
    consecutive)."""
    t, ii, w = L.Var("t"), L.Var("ii"), L.Var("w")
    k = p.k

    def word(step: L.Expr, guard: bool) -> L.Expr:
        k0 = 2 * (step * ROWS + w)
        if not guard:
            return bf16.pair(a_at(ii, k0), a_at(ii, k0 + 1))
        lo, hi = (L.Select(kk < k, a_at(ii, L.minimum(kk, k - 1)), L.const(0.0))
                  for kk in (k0, k0 + 1))
        return bf16.pair(lo, hi)

    def run(first: int, count: int, guard: bool) -> L.Stmt:
        store = L.Store(slot(first + t, ii, w).buffer, slot(first + t, ii, w).indices,
                        word(first + t, guard))
        if trans:
            inner = L.For(w, ROWS, L.For(ii, ROWS, store, L.ForKind.VECTORIZED))
        else:
            inner = L.For(ii, ROWS, L.For(w, ROWS, store, L.ForKind.VECTORIZED))
        return L.For(t, count, inner)

    whole = k // 2 // ROWS   # steps whose every pair lies inside K
    parts = [run(0, whole, False)] if whole else []
    if steps > whole:
        parts.append(run(whole, steps - whole, True))
    return L.seq(*parts)


def _products(p: Dense, g: _Geometry, views: DenseViews, operands, par: L.ForKind) -> L.Stmt:
    """Every unit's blocks: column blocks outer (a block's B tiles read again from L1/L2 by
    the unit's next row block), row blocks inner; the other way round with order "rows"."""
    c = g.config
    v, cl, rl = L.Var("v"), L.Var("cl"), L.Var("rl")
    per_batch = g.row_groups * g.col_groups
    bi = v // per_batch
    rb = (v % per_batch) // g.col_groups * c.unit_rows + rl
    cb = v % g.col_groups * c.unit_cols + cl
    cacc = L.Buffer("cacc", T.float32, (g.bm * g.bn,), L.Scope.LOCAL)
    block = L.Allocate(cacc, L.seq(*operands.products(cacc, bi, rb, cb),
                                   _store(p, g, views, cacc, bi, rb, cb)))

    def rows(inner: L.Stmt) -> L.Stmt:
        return L.For(rl, c.unit_rows, L.If(rb < g.row_blocks, inner)
                     if g.row_blocks % c.unit_rows else inner)

    def cols(inner: L.Stmt) -> L.Stmt:
        return L.For(cl, c.unit_cols, L.If(cb < g.col_blocks, inner)
                     if g.col_blocks % c.unit_cols else inner)

    unit = rows(cols(block)) if c.order == "rows" else cols(rows(block))
    return L.For(v, g.units, unit, par if g.units > 1 else L.ForKind.SERIAL)


def _store(p: Dense, g: _Geometry, views: DenseViews, cacc: L.Buffer, bi, rb, cb) -> L.Stmt:
    """The block's fp32 sums through the epilogue into Y: its rows within R, a tile row's
    columns (a last column block of the columns left) in one vector loop of constant width."""
    bm, bn = g.bm, g.bn
    x, y = L.Var("sx"), L.Var("sy")
    r0, s0 = rb * bm, cb * bn

    def line(width: int) -> L.Stmt:
        acc = cacc[x * bn + y]
        if g.along_m:
            value = p.finish(acc, bi, r0 + x, s0 + y)
            target = views.y_at(bi, r0 + x, s0, y)
            store = L.Store(target.buffer, target.indices, value)
        else:
            store = _store_transposed(p, views, acc, bi, s0 + y, r0 + x)
        return L.For(x, bm, L.If(r0 + x < g.r, L.For(
            y, width, store, L.ForKind.VECTORIZED if width >= 2 else L.ForKind.SERIAL)))

    last = g.s - (g.col_blocks - 1) * bn
    if last == bn:
        return line(bn)
    return L.If(cb < g.col_blocks - 1, line(bn), line(last))


def _store_transposed(p: Dense, views: DenseViews, acc: L.Expr, bi, i, j) -> L.Stmt:
    """Y[bi, i, j] from its fp32 sum, along i: a 1x1 conv's output channel j stored at its
    pixels in a row ([batch, n, m] NCHW, the epilogue read there too where its reads allow)."""
    if not isinstance(p, PointwiseDense):
        target = views.y_at(bi, i, j, L.const(0))
        return L.Store(target.buffer, target.indices, p.finish(acc, bi, i, j))
    return L.Store(L.Buffer(p.y.name, p.y.dtype, (p.batch, p.n, p.m)), (bi, j, i),
                   p.finish(acc, bi, i, j))   # (`PointwiseDense.epilogue_index`)


AMX_DENSE = Template("amx_dense", problems.dense, applies, space, default, build,
                     precisions=("bf16",), features=AMX_FEATURES)
AMX_POINTWISE = Template("amx_pointwise", problems.pointwise_dense, applies, space, default,
                         build, precisions=("bf16",), features=AMX_FEATURES)
