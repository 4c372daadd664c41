"""The bf16 dense products on AMX tiles (Sapphire Rapids and later): MatMulPacked and 1x1
ConvPacked (`PointwiseDense`) at precision bf16, where the target has amx-tile and amx-bf16.

A template of its own rather than a knob of `dense.py`: a knob is the tuner's to set and
every config of a space must run on the machine it is built for, while tiles run only where
the CPU has them; the template table's `features` filter (`space.Template`) makes the choice
a property of the target's feature string, as vdpbf16ps's is, and a machine without AMX never
sees this template, so its products are exactly as before. The tile blocking is a knob space
of its own (tiles, not vector registers), which the tuner searches like any other.

- **B** stays as `convert_layout` packed it ([panels, ceil(K / 2), NR] words of bf16 pairs
  along K, NR a multiple of 16): that is AMX's B layout already, a tile being 16 rows of
  pairs by 16 columns of a panel, rows NR words apart. Only K's tail (ceil(K / 2) not a
  multiple of 16) is copied, once a call, into a zero-padded buffer (`btail`: 16 rows a
  panel), so a tile never reads past B and the constants are the same on every CPU.
- **A** is rounded to bf16 pairs and packed once a call into whole tiles (`atiles`: [batch,
  row tiles, k steps, 16, 16] words, each A tile 1 KB contiguous), rows past M repeating the
  last (never stored), pairs past K zero (so B's padding multiplies zeros).
- **C**: a block of m_tiles x n_tiles tiles of 16 x 16 fp32 (2 x 2: 4 C tiles, 2 A and 2 B
  tiles a step, AMX's 8 registers, as oneDNN's brgemm blocks bf16) accumulates over the whole
  of K in tile registers (`TileProduct`), is stored to a local buffer, and the epilogue
  (alpha, bias, the fused consumers) is applied to those fp32 sums as rows < M and columns
  < N are stored.

The worker pool shares units of mc_blocks row blocks by nc_blocks column blocks (after A's
tiles are packed, in parallel over row tiles); knobs `AmxConfig`. It must never be chosen for
a target without the tiles (its Template's `features`) nor read B outside its panels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Dense
from ..space import Constraint, Space, Template
from . import bf16
from .amx import AMX_FEATURES
from .dense import DenseViews

ROWS = L.TILE_ROWS          # rows of a tile; words (bf16 pairs, fp32) of a tile row
TILE_WORDS = ROWS * ROWS    # words of a tile (1 KB)


@dataclass(frozen=True)
class AmxConfig:
    m_tiles: int     # C tiles of a block along the rows
    n_tiles: int     # C tiles of a block along the columns
    mc_blocks: int   # row blocks of a worker-pool unit
    nc_blocks: int   # column blocks of a worker-pool unit


def applies(p: Dense) -> bool:
    """B in bf16 pairs (MatMulPacked / a 1x1 ConvPacked at bf16) in panels of whole tiles."""
    return p.pairs and p.packed_panel % ROWS == 0 and not p.b_batched


class _Geometry:
    """The sizes a config gives a problem: steps of k, blocks, units."""

    def __init__(self, p: Dense, config: AmxConfig):
        self.p, self.config = p, config
        self.nr = p.packed_panel
        self.panels = p.b_dims[0]
        self.pairs = -(-p.k // 2)
        self.full_steps, self.tail = divmod(self.pairs, ROWS)
        self.steps = self.full_steps + (self.tail > 0)
        self.bm, self.bn = ROWS * config.m_tiles, ROWS * config.n_tiles
        row_tiles = -(-p.m // ROWS)
        self.row_tiles = -(-row_tiles // config.m_tiles) * config.m_tiles
        self.row_blocks = self.row_tiles // config.m_tiles
        self.col_blocks = -(-p.n // self.bn)
        self.row_groups = -(-self.row_blocks // config.mc_blocks)
        self.col_groups = -(-self.col_blocks // config.nc_blocks)
        self.units = p.batch * self.row_groups * self.col_groups


def space(p: Dense, machine) -> Space:
    nr = p.packed_panel
    constraints = [
        Constraint("m_tiles * n_tiles + m_tiles + n_tiles <= 8: C's tiles and a step's A and "
                   "B tiles fit AMX's 8 tile registers",
                   lambda c: c.m_tiles * c.n_tiles + c.m_tiles + c.n_tiles <= L.TILE_REGISTERS),
        Constraint(f"16 * n_tiles divides the panel width {nr}: a block's B tiles lie in one "
                   f"panel", lambda c: nr % (ROWS * c.n_tiles) == 0),
        Constraint(f"mc_blocks < 2 * row blocks (m = {p.m}): no unit twice the rows",
                   lambda c: c.mc_blocks < 2 * -(-p.m // (ROWS * c.m_tiles))),
        Constraint(f"nc_blocks < 2 * column blocks (n = {p.n}): no unit twice the columns",
                   lambda c: c.nc_blocks < 2 * -(-p.n // (ROWS * c.n_tiles))),
    ]
    return Space("amx_dense", AmxConfig, {
        "m_tiles": (1, 2, 3), "n_tiles": (1, 2), "mc_blocks": (1, 2, 4, 8),
        "nc_blocks": (1, 2, 4, 8, 16, 32, 64, 128)}, constraints)


def default(p: Dense, machine) -> AmxConfig:
    """2 x 2 tiles where the panel holds two (1 x 2 for one tile of rows, 3 x 1 where a panel
    is one tile wide); units of up to 4 row blocks by every column block, narrowed until the
    threads have a unit each where there are enough blocks."""
    two = p.packed_panel % (2 * ROWS) == 0 and p.n > ROWS
    n_tiles = 2 if two else 1
    m_tiles = max(1, min(2 if two else 3, -(-p.m // ROWS)))
    row_blocks = -(-p.m // (ROWS * m_tiles))
    col_blocks = -(-p.n // (ROWS * n_tiles))
    threads = machine.threads
    mc = max(1, min(4, p.batch * row_blocks // threads if threads > 1 else row_blocks))
    mc = _largest_power_of_two(min(mc, row_blocks))
    row_units = p.batch * -(-row_blocks // mc)
    nc = col_blocks
    if threads > 1 and row_units < threads:
        nc = -(-col_blocks // -(-threads // row_units))
    nc = min(128, _largest_power_of_two(nc) if nc < col_blocks else
             1 << (col_blocks - 1).bit_length())
    return AmxConfig(m_tiles, n_tiles, mc, nc)


def _largest_power_of_two(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def build(p: Dense, config: AmxConfig, machine) -> L.PrimFunc:
    g = _Geometry(p, config)
    views = DenseViews(p, g.nr)
    par = L.ForKind.PARALLEL if machine.threads > 1 else L.ForKind.SERIAL
    atiles = L.Buffer("atiles", T.uint32, (p.batch * g.row_tiles * g.steps * TILE_WORDS,),
                      L.Scope.GLOBAL)
    btail = L.Buffer("btail", T.uint32, (g.panels * ROWS * g.nr,), L.Scope.GLOBAL) \
        if g.tail else None
    parts = [_pack_a(p, g, views, atiles, par)]
    if btail is not None:
        parts.append(_pad_b_tail(g, views, btail))
    parts.append(_products(p, g, views, atiles, btail, par))
    body = L.seq(*parts)
    for buffer in (btail, atiles):
        if buffer is not None:
            body = L.Allocate(buffer, body)
    return L.simplify(L.PrimFunc(p.name, views.params(), body))


def _pack_a(p: Dense, g: _Geometry, views: DenseViews, atiles: L.Buffer,
            par: L.ForKind) -> L.Stmt:
    """`atiles`: each row tile's k steps as whole 16 x 16 tiles of bf16 pairs, the rows
    consecutive; rows past M repeat the last, pairs past K are zero. Steps wholly inside K
    read without guards, a word of 16 lanes a row (A stored [m, k]) or a row tile of 16
    lanes a word (A stored [k, m]: a 1x1 conv's image, pixels consecutive)."""
    u, t, ii, w = L.Var("u"), L.Var("t"), L.Var("ii"), L.Var("w")
    bi, r = u // g.row_tiles, u % g.row_tiles
    row = L.minimum(r * ROWS + ii, p.m - 1)
    k = p.k

    def word(step: L.Expr, guard: bool) -> L.Expr:
        k0 = 2 * (step * ROWS + w)
        if not guard:
            return bf16.pair(views.a_at(bi, row, k0), views.a_at(bi, row, k0 + 1))
        lo, hi = (L.Select(kk < k, views.a_at(bi, row, L.minimum(kk, k - 1)), L.const(0.0))
                  for kk in (k0, k0 + 1))
        return bf16.pair(lo, hi)

    def steps(first: L.Expr, count: int, guard: bool) -> L.Stmt:
        step = first + t
        store = L.Store(atiles, ((((u * g.steps + step) * ROWS) + ii) * ROWS + w,),
                        word(step, guard))
        if p.trans_a:   # rows (pixels) consecutive in A: a tile's column of words at a time
            inner = L.For(w, ROWS, L.For(ii, ROWS, store, L.ForKind.VECTORIZED))
        else:
            inner = L.For(ii, ROWS, L.For(w, ROWS, store, L.ForKind.VECTORIZED))
        return L.For(t, count, inner)

    whole = k // 2 // ROWS   # steps whose every pair lies inside K
    parts = [steps(L.const(0), whole, False)] if whole else []
    if g.steps > whole:
        parts.append(steps(L.const(whole), g.steps - whole, True))
    return L.For(u, p.batch * g.row_tiles, L.seq(*parts), par)


def _pad_b_tail(g: _Geometry, views: DenseViews, btail: L.Buffer) -> L.Stmt:
    """`btail`: each panel's last `tail` rows of pairs, then zero rows to a whole tile."""
    jp, q, j = L.Var("jp"), L.Var("q"), L.Var("j")
    first = g.full_steps * ROWS
    value = L.Select(q < g.tail, views.b[jp, first + L.minimum(q, g.tail - 1), j],
                     L.Const(0, T.uint32))
    return L.For(jp, g.panels, L.For(q, ROWS, L.For(
        j, g.nr, L.Store(btail, ((jp * ROWS + q) * g.nr + j,), value), L.ForKind.VECTORIZED)))


def _products(p: Dense, g: _Geometry, views: DenseViews, atiles: L.Buffer,
              btail: L.Buffer | None, par: L.ForKind) -> L.Stmt:
    """Every unit's blocks: column blocks outer (a block's B tiles read again from L1/L2 by
    the unit's next row block), row blocks inner."""
    c = g.config
    v, cl, rl = L.Var("v"), L.Var("cl"), L.Var("rl")
    per_batch = g.row_groups * g.col_groups
    bi = v // per_batch
    rb = (v % per_batch) // g.col_groups * c.mc_blocks + rl
    cb = v % g.col_groups * c.nc_blocks + cl
    block = _block(p, g, views, atiles, btail, bi, rb, cb)
    rows = L.For(rl, c.mc_blocks, L.If(rb < g.row_blocks, block)
                 if g.row_blocks % c.mc_blocks else block)
    cols = L.For(cl, c.nc_blocks, L.If(cb < g.col_blocks, rows)
                 if g.col_blocks % c.nc_blocks else rows)
    return L.For(v, g.units, cols, par if g.units > 1 else L.ForKind.SERIAL)


def _block(p: Dense, g: _Geometry, views: DenseViews, atiles: L.Buffer,
           btail: L.Buffer | None, bi, rb, cb) -> L.Stmt:
    """Row block rb, column block cb of batch bi: its tiles over the whole of K, then the
    epilogue from the fp32 sums (rows < M, columns < N)."""
    c = g.config
    cacc = L.Buffer("cacc", T.float32, (g.bm * g.bn,), L.Scope.LOCAL)
    j0 = cb * g.bn
    jp, c0 = j0 // g.nr, j0 % g.nr
    a_at = ((bi * g.row_tiles + rb * c.m_tiles) * g.steps) * TILE_WORDS
    a_layout = (ROWS, g.steps * TILE_WORDS, TILE_WORDS)
    parts = []
    if g.full_steps:
        parts.append(L.TileProduct(
            "bf16", cacc[0], atiles[a_at], views.b[jp, 0, c0], g.bn, a_layout,
            (g.nr, ROWS, ROWS * g.nr), c.m_tiles, c.n_tiles, g.full_steps, accumulate=False))
    if btail is not None:
        parts.append(L.TileProduct(
            "bf16", cacc[0], atiles[a_at + g.full_steps * TILE_WORDS],
            btail[jp * ROWS * g.nr + c0], g.bn, a_layout, (g.nr, ROWS, 0), c.m_tiles,
            c.n_tiles, 1, accumulate=g.full_steps > 0))
    parts.append(_store(p, g, views, cacc, bi, rb, cb))
    return L.Allocate(cacc, L.seq(*parts))


def _store(p: Dense, g: _Geometry, views: DenseViews, cacc: L.Buffer, bi, rb, cb) -> L.Stmt:
    """The block's fp32 sums through the epilogue into Y: rows < M, and a last column block
    of the columns left (a vector loop of constant width either way)."""
    ii, jj = L.Var("si"), L.Var("sj")
    i0, j0 = rb * g.bm, cb * g.bn

    def rows(width: int) -> L.Stmt:
        value = p.finish(cacc[ii * g.bn + jj], bi, i0 + ii, j0 + jj)
        target = views.y_at(bi, i0 + ii, j0, jj)
        return L.For(ii, g.bm, L.If(i0 + ii < p.m, L.For(
            jj, width, L.Store(target.buffer, target.indices, value),
            L.ForKind.VECTORIZED if width >= 2 else L.ForKind.SERIAL)))

    last = p.n - (g.col_blocks - 1) * g.bn
    if last == g.bn:
        return rows(g.bn)
    return L.If(cb < g.col_blocks - 1, rows(g.bn), rows(last))


AMX_DENSE = Template("amx_dense", problems.dense, applies, space, default, build,
                     precisions=("bf16",), features=AMX_FEATURES)
AMX_POINTWISE = Template("amx_pointwise", problems.pointwise_dense, applies, space, default,
                         build, precisions=("bf16",), features=AMX_FEATURES)
