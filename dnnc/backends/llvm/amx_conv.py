"""bf16 convolutions of any window on AMX tiles (Sapphire Rapids and later): ConvPacked at
precision bf16 (one group) where the target has amx-tile and amx-bf16 and the conv is no
1x1 that `amx_dense`'s AMX_POINTWISE takes (3x3 at stride 1 and 2, the 7x7 stem, ...).

An implicit GEMM with no patches copied: Y's rows are output pixels, its columns output
channels, k runs over the window's taps (one `TileProduct` run each, C held in the tile
registers across them) and, within a tap, over the input channels' bf16 pairs.

- **The image** is made once a call into `ximg` [batch, phases, plane, K16] words: each
  pixel's pairs of channels (zero past C) side by side, K16 = the pairs rounded up to whole
  tile steps of 16, so a tile row (16 pairs of one pixel) is one 64-byte load and a tile's
  rows, consecutive pixels, lie K16 words apart. A stride S splits the zero-padded plane into
  S x S phases (row y of phase (a, b) is padded row y S + a, column x S + b), so that every
  tap reads its phase at stride 1 (as `conv.pad_plane`'s phases). Pixels are counted on a
  grid as wide as the phase's columns that a row's outputs read (OW + the widest tap's
  column shift): tap (r, s) of output pixel g then reads grid pixel g + dy Wg + dx of its
  phase, one constant offset a tap (a run's A offset), and the grid columns past OW are
  computed but never stored (3x3 at 56 wide: 58 columns, 3.4% more products; at 7 wide, 9).
- **fold** (few input channels: the stem's 3, 2 pairs): a window row's kw taps are folded
  into k, pixel (y, x) holding the pairs of its kw columns side by side (kw P words, rounded
  up to K16), and the runs are the kh rows alone: the stem's 7 x 16 words a pixel against
  49 x 16 unfolded (7x fewer products, most of them zeros). The default folds where that
  computes half the words or fewer (`default`). The taps are in k by the column phase they
  read (`ConvGeometry.tap_order`; the weights copied in that order), so that at dilation 1 a
  pixel's words are one run a phase of a row made once in column phases (`xrow`): the
  stem's image 260 -> 95 us on 1 thread (znver5), against making each of a pixel's 16
  words from two loads of its own.
- **The weights** are ConvPacked's bf16 pairs, [panels, P, kh, kw, NR] words: for a tap,
  rows of pairs kh kw NR words apart, which is AMX's B layout read in place, where P fills
  whole steps (ResNet's convs: C a multiple of 32). Otherwise (an odd P, or folded) they are
  copied once a call into `wtaps` [panels, K16, runs, NR], zero past k: a copy of the
  weights, against their products with every pixel.

A block is row_tiles x col_tiles C tiles (2 x 2 by default: 4 C tiles, 2 A and 2 B tiles a
step in AMX's 8 registers) of 16 grid pixels by 16 channels of one packed panel; its fp32
sums go through bias and the fused epilogue into Y ([N, M, OH, OW]: a pixel's channels a
plane apart, a scalar store each).

**rows_along "channels"** (a knob; blocks of Y^T, as `amx_dense`'s "n" for 1x1 convs): A is
the weights, copied once a call into `wrows` [M rounded up to blocks, runs, K16] (a tile row
one channel's 16 words of a run), B the image, made word-major into `ximg` [batch, phases,
K16, plane] (a tile row: one word of 16 consecutive grid pixels; a word's row of pixels is
made from loads at the stride S, vectorised, the columns outside the image apart). A block
is 16 row_tiles channels by 16 col_tiles pixels of one output row (blocks never cross a
row: a row's last block stores the pixels left, its other columns computed and dropped),
and a channel's pixels are stored along a tile row, one vector store per 16 pixels. With
the products rendered as loops ('loops' mode, so the tiles' share is out), on 1 znver5
thread: the stem's image 93 -> 59 us, image and store 337 -> 175 us; a 3x3 64 -> 64 conv
at 56^2, 47 -> 20 and 108 -> 42 us. On the tiles (16-thread AMX Xeon, whole kernel): the
stem 166 -> 146 us, but the 3x3s slower (64 -> 64 at 56^2 67 -> 105 us: its B rows start at
any pixel, not at a 64-byte line, and its weights are copied a call): the default for folded
convs only (`default`).

The worker pool shares the blocks (batch, pixel block, channel block; knob `order`: the
bigger operand's blocks outside, read once past L2). It must never be chosen for
a target without the tiles (its Template's `features`), nor read the image or the weights
outside what it wrote or ConvPacked holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Conv2d
from ..space import Constraint, Space, Template
from . import bf16
from .amx import AMX_FEATURES, TILES_FIT

ROWS = L.TILE_ROWS          # rows of a tile; words (bf16 pairs) of a tile row


@dataclass(frozen=True)
class AmxConvConfig:
    row_tiles: int    # C tiles of a block along its pixels
    col_tiles: int    # C tiles of a block along its output channels (within a panel)
    fold: bool        # a window row's taps folded into k (few input channels)
    # the parallel loop's outer blocks: "pixels" (a pixel block's image rows read again from
    # L1/L2 by each channel block) or "channels" (a channel block's weights from L2 by each
    # pixel block)
    order: str = "pixels"
    # what a C tile's rows are: "pixels" (A the image, B the weights: a pixel's channels
    # stored a plane apart) or "channels" (A the weights, B the image: blocks of Y^T, an
    # output channel's pixels stored along a tile row; module docstring)
    rows_along: str = "pixels"


def applies(p: Conv2d) -> bool:
    """A ConvPacked of bf16 pairs (one group) in panels of whole tiles, of a float32 image
    (as the vdpbf16ps `conv2d`: 16-bit storage takes the default template)."""
    return p.pairs and p.float32 and p.packed_nr % ROWS == 0 and p.group == 1


def _whole(words: int) -> int:
    """`words` rounded up to whole tile steps."""
    return -(-words // ROWS) * ROWS


class ConvGeometry:
    """The sizes a config gives a conv: k per pixel, runs (taps), phases, the pixel grid,
    the blocks."""

    def __init__(self, p: Conv2d, config: AmxConvConfig, per_word: int = 2):
        """`per_word`: channels a 32-bit word of the image holds (2 bf16, 4 bytes)."""
        n, c, h, w = p.x_dims
        self.oc, _, self.kh, self.kw = p.w_dims
        _, _, self.oh, self.ow = p.y_dims
        (self.sh, self.sw), (self.dh, self.dw) = p.strides, p.dilations
        self.config, self.fold = config, config.fold
        self.pairs = -(-c // per_word)   # words of a pixel's channels (pairs, or quads)
        self.words = self.kw * self.pairs if self.fold else self.pairs   # k a pixel, a run
        self.k16 = _whole(self.words)
        self.steps = self.k16 // ROWS
        self.col_phases = 1 if self.fold else self.sw
        self.phases = self.sh * self.col_phases
        dy_max = (self.kh - 1) * self.dh // self.sh
        dx_max = 0 if self.fold else (self.kw - 1) * self.dw // self.sw
        self.wg = self.ow + dx_max                 # grid columns
        self.grid = self.oh * self.wg              # grid pixels
        self.bm, self.bn = ROWS * config.row_tiles, ROWS * config.col_tiles
        self.transposed = config.rows_along == "channels"
        if self.transposed:   # blocks of bn pixels of one output row by bm channels
            self.line_blocks = -(-self.ow // self.bn)
            self.pixel_blocks = self.oh * self.line_blocks
            self.channel_blocks = -(-self.oc // self.bm)
            last_read = (self.oh - 1 + dy_max) * self.wg + self.line_blocks * self.bn + dx_max
        else:                 # blocks of bm consecutive grid pixels by bn channels
            self.pixel_blocks = -(-self.grid // self.bm)
            self.channel_blocks = -(-self.oc // self.bn)
            last_read = self.pixel_blocks * self.bm + dy_max * self.wg + dx_max
        # a phase's pixels: every row a tap reads, whole grid rows (the image is made a
        # row a unit of the worker pool)
        self.plane_rows = max(self.oh + dy_max, -(-last_read // self.wg))
        self.plane = self.plane_rows * self.wg
        self.nr = p.packed_nr
        self.panels = -(-self.oc // self.nr)
        self.taps = [(r, 0) for r in range(self.kh)] if self.fold else \
            [(r, s) for r in range(self.kh) for s in range(self.kw)]
        # weights read in place: ConvPacked's [panels, P, kh, kw, NR] words
        self.in_place = not self.fold and self.pairs % ROWS == 0 and not self.transposed
        # folded: a window row's taps in k by the column phase they read (`_phase_runs`)
        self.tap_order, self.phase_runs = list(range(self.kw)), None
        if self.fold and not self.transposed:
            self.tap_order, self.phase_runs, self.col_min, self.phase_cols = \
                _phase_runs(self, p.begins[1])

    def tap_at(self, kk: L.Expr) -> L.Expr:
        """The window column s of word kk of a folded pixel (its taps in `tap_order`)."""
        position = kk // self.pairs
        if self.tap_order == list(range(self.kw)):
            return position
        s = L.const(self.tap_order[-1])
        for k in range(len(self.tap_order) - 2, -1, -1):
            s = L.Select(L.eq(position, k), L.const(self.tap_order[k]), s)
        return s

    def weight_word(self, w5: L.Buffer, panel: L.Expr, column: L.Expr, t: L.Expr,
                    kk: L.Expr) -> L.Expr:
        """Word kk (zero past k) of tap run t's weights of the output channel at `column` of
        `panel` in ConvPacked's `w5` [panels, P, kh, kw, NR]."""
        if self.fold:   # run t is window row t, kk = (s's place in tap_order) P + q
            s, q, r = self.tap_at(kk), kk % self.pairs, t
        else:           # run t is tap (t // kw, t % kw), kk = q
            s, q, r = t % self.kw, kk, t // self.kw
        return L.Select(kk < self.words, w5[panel, L.minimum(q, self.pairs - 1), r,
                                            L.minimum(s, self.kw - 1), column],
                        L.Const(0, T.uint32))

    def grid_row(self, u: L.Expr) -> tuple:
        """(image, phase, row of the phase's grid) of the image's grid row `u`, the unit the
        image is made in."""
        return u // (self.phases * self.plane_rows), u // self.plane_rows % self.phases, \
            u % self.plane_rows

    def block(self, v: L.Expr) -> tuple:
        """(image, pixel block, channel block) of unit v of the products' parallel loop, the
        config's `order` outside."""
        per_image = self.pixel_blocks * self.channel_blocks
        bi, rest = v // per_image, v % per_image
        if self.config.order == "channels":
            return bi, rest % self.pixel_blocks, rest // self.pixel_blocks
        return bi, rest // self.channel_blocks, rest % self.channel_blocks

    def tap(self, index: int) -> tuple[int, int]:
        """(phase, grid pixels it is shifted by) of tap run `index`."""
        r, s = self.taps[index]
        a, dy = (r * self.dh) % self.sh, (r * self.dh) // self.sh
        b, dx = ((s * self.dw) % self.sw, (s * self.dw) // self.sw) if not self.fold else (0, 0)
        return a * self.col_phases + b, dy * self.wg + dx

    def run(self, index: int) -> tuple[int, int]:
        """(A, B) word offsets of tap run `index`: its phase's grid shifted by the tap, its
        weights' tap (the weights A and the image B where `transposed`)."""
        phase, shift = self.tap(index)
        if self.transposed:
            return (index * self.k16, phase * self.k16 * self.plane + shift)
        return ((phase * self.plane + shift) * self.k16, index * self.nr)


def _phase_runs(g: ConvGeometry, pw: int):
    """A folded window row's taps ordered by the column phase they read: output column x's
    tap s reads image column x S + s D - pw = (x + e) S + b, phase b, shift e. Where each
    phase's taps have consecutive shifts (dilation 1), a pixel's words are, phase by phase,
    one run of a phase-split image row: (tap order, [(b, e of its first tap, taps, first
    word)], the least shift, the phase columns a row needs). Otherwise (tap order 0..kw-1,
    None, 0, 0): each word is made on its own."""
    taps = sorted(((s * g.dw - pw) % g.sw, (s * g.dw - pw) // g.sw, s) for s in range(g.kw))
    runs, start = [], 0
    for b in sorted({t[0] for t in taps}):
        mine = [t for t in taps if t[0] == b]
        if any(later[1] != earlier[1] + 1 for earlier, later in zip(mine, mine[1:])):
            return list(range(g.kw)), None, 0, 0
        runs.append((b, mine[0][1], len(mine), start))
        start += len(mine) * g.pairs
    shifts = [t[1] for t in taps]
    return [t[2] for t in taps], runs, min(shifts), g.wg - 1 + max(shifts) - min(shifts) + 1


def space(p: Conv2d, machine, transposed: bool = True) -> Space:
    """The knobs; `transposed`: with blocks of Y^T (`rows_along` "channels"; the int8
    template's words are not laid out for them)."""
    nr = p.packed_nr
    return Space("amx_conv", AmxConvConfig, {
        "row_tiles": (1, 2, 3), "col_tiles": (1, 2), "fold": (False, True),
        "order": ("pixels", "channels"),
        "rows_along": ("pixels", "channels") if transposed else ("pixels",)}, [
        TILES_FIT,
        Constraint(f"16 * col_tiles divides the panel width {nr}: a block's B tiles lie in "
                   f"one panel", lambda c: c.rows_along == "channels" or
                   nr % (ROWS * c.col_tiles) == 0)])


def default(p: Conv2d, machine) -> AmxConvConfig:
    """2 x 2 tiles where the panel holds two column tiles and more than 16 channels are
    computed, else 3 x 1; folded where that computes half the words a pixel or fewer (kw P
    rounded up to whole steps, kh runs, against P rounded up, kh kw runs): the stem's 3
    channels, 112 against 784, not ResNet's 64 (288 both) nor 48 (240 against 288: the
    folded image, made each call, is kw times the pixels' pairs, ~1 word a cycle, against
    256 pair products a cycle on the tiles). Channel blocks outside where the weights
    outweigh the image operand, so that the bigger is read once past L2 (resnet50's 3x3
    512->512 at 7^2: 4.7 MB of weights, one pass over them, not one a pixel block), pixel
    blocks outside otherwise (its 64->64 at 56^2: 74 KB of weights, 430 KB of image).
    Blocks of Y^T (`rows_along` "channels") where folded: on the 16-thread AMX Xeon (kernel
    profile, one call) the stem 166 -> 146 us, while a 3x3 64 -> 64 at 56^2 went 67 -> 105
    and 16 -> 64 at 55^2 65 -> 71 us (every conv so: light_resnet50 1.31x, light_squeezenet
    1.08x)."""
    config = default_for(p, 2)
    if config.fold:   # (rows now channels: the pixels' tiles along the rows, at most 2)
        return AmxConvConfig(config.col_tiles, min(2, config.row_tiles), True, config.order,
                             "channels")
    return config


def default_for(p, per_word: int) -> AmxConvConfig:
    """`default` for an image of `per_word` channels a word (2 bf16, 4 bytes)."""
    c, (oc, _, kh, kw) = p.x_dims[1], p.w_dims
    words = -(-c // per_word)
    fold = kw > 1 and 2 * kh * _whole(kw * words) <= kh * kw * _whole(words)
    two = oc > ROWS and p.packed_nr % (2 * ROWS) == 0
    config = AmxConvConfig(2 if two else 3, 2 if two else 1, fold)
    g = ConvGeometry(p, config, per_word)
    weights = g.panels * g.k16 * len(g.taps) * g.nr
    image = p.x_dims[0] * g.phases * g.plane * g.k16
    return AmxConvConfig(config.row_tiles, config.col_tiles, fold,
                         "channels" if weights > image else "pixels")


def build(p: Conv2d, config: AmxConvConfig, machine) -> L.PrimFunc:
    # (weights in bf16 pairs: the parameter as the uint32 words the body reads)
    w5 = L.Buffer(p.w.name, T.uint32, L.static_shape(p.w.shape)[:5])
    body = tile_conv(p, ConvGeometry(p, config), machine, w5, _pair_of(p), L.Const(0, T.uint32),
                     "bf16", p.finish)
    params = tuple(w5 if x.name == w5.name else x for x in p.params)
    return L.simplify(L.PrimFunc(p.name, params, body))


def _pair_of(p: Conv2d):
    """The bf16 pair of channels (2q, 2q + 1) of image bi at (y, x) (zero past C)."""
    c = p.x_dims[1]

    def pair(bi, q, yy, xx) -> L.Expr:
        lo = p.x[bi, 2 * q, yy, xx]
        hi = p.x[bi, L.minimum(2 * q + 1, c - 1), yy, xx]
        if c % 2:
            hi = L.Select(2 * q + 1 < c, hi, L.const(0.0))
        return bf16.pair(lo, hi)
    return pair


def tile_conv(p, g: ConvGeometry, machine, w5: L.Buffer, word_of, pad: L.Expr, precision: str,
              finish) -> L.Stmt:
    """The body of a conv on the tiles, for a precision's words (`amx_int8` makes the int8
    one so): the image made into `ximg` (`word_of(bi, q, y, x)`: word q of a pixel's channels,
    `pad` outside the image), the weights (`w5`: [panels, words, kh, kw, NR] uint32) read in
    place or copied, every block's `TileProduct` and its store through `finish(acc, index)`."""
    par = L.ForKind.PARALLEL if machine.threads > 1 else L.ForKind.SERIAL
    ximg = L.Buffer("ximg", T.uint32, (p.x_dims[0] * g.phases * g.plane * g.k16,),
                    L.Scope.GLOBAL)
    if g.transposed:
        wrows = L.Buffer("wrows", T.uint32, (g.channel_blocks * g.bm * len(g.taps) * g.k16,),
                         L.Scope.GLOBAL)
        return L.Allocate(wrows, L.Allocate(ximg, L.seq(
            _image_by_words(p, g, ximg, par, word_of, pad), _weight_rows(g, w5, wrows, par),
            _products_transposed(p, g, ximg, wrows, par, precision, finish))))
    stmts = [_image(p, g, ximg, par, word_of, pad)]
    if g.in_place:
        weights = L.Buffer(p.w.name, T.uint32, (g.panels * g.pairs * len(g.taps) * g.nr,))
    else:
        weights = L.Buffer("wtaps", T.uint32, (g.panels * g.k16 * len(g.taps) * g.nr,),
                           L.Scope.GLOBAL)
        stmts.append(_weights(g, w5, weights, par))
    stmts.append(_products(p, g, ximg, weights, par, precision, finish))
    body = L.Allocate(ximg, L.seq(*stmts))
    if not g.in_place:
        body = L.Allocate(weights, body)
    return L.Allocate(_xrow(p, g), body) if g.phase_runs else body


def _image(p: Conv2d, g: ConvGeometry, ximg: L.Buffer, par: L.ForKind, word_of,
           pad: L.Expr) -> L.Stmt:
    """`ximg`: word kk of grid pixel (y, x) of phase (a, b) of image bi, word q of the
    channels (`word_of`) at padded row y S + a, column x S + b (folded: + s dw, kk = s P +
    q), `pad` past k or outside the image; a grid row a unit of the worker pool."""
    if g.phase_runs:
        return _phase_split_image(p, g, ximg, par, word_of, pad)
    n, c, h, w = p.x_dims
    (ph, pw) = p.begins
    u, px, kk = L.Var("u"), L.Var("px"), L.Var("kk")
    bi, phase, py = g.grid_row(u)
    a, b = phase // g.col_phases, phase % g.col_phases
    if g.fold:
        s, q = g.tap_at(kk), kk % g.pairs
        col = px * g.sw + s * g.dw - pw
    else:
        q = kk
        col = px * g.sw + b - pw
    row = py * g.sh + a - ph
    inside = L.logical_and(kk < g.words, row >= 0, row < h, col >= 0, col < w)
    yy, xx = L.minimum(L.maximum(row, 0), h - 1), L.minimum(L.maximum(col, 0), w - 1)
    word = L.Select(inside, word_of(bi, L.minimum(q, g.pairs - 1), yy, xx), pad)
    return L.For(u, n * g.phases * g.plane_rows, L.For(px, g.wg, L.For(
        kk, g.k16, L.Store(ximg, ((u * g.wg + px) * g.k16 + kk,), word))), par)


def _phase_split_image(p: Conv2d, g: ConvGeometry, ximg: L.Buffer, par: L.ForKind, word_of,
                       pad: L.Expr) -> L.Stmt:
    """`_image` of a fold whose phases' taps read consecutive columns: each grid row (a unit)
    first made as S column phases of its words (`xrow` [unit, S, phase columns, P]: word q of
    image column (c + least shift) S + b), then each pixel's words copied from it, a run a
    phase (`phase_runs`), pad past k. Two loads, a rounding and a select a word of the image
    instead of one of the pixel's kw P words (the stem: 115 x 2 x 2 words a row, not 112 x
    16)."""
    n, c, h, w = p.x_dims
    ph = p.begins[0]
    u, px, cc, q, j = L.Var("u"), L.Var("px"), L.Var("cc"), L.Var("q"), L.Var("j")
    bi, phase, py = g.grid_row(u)
    units, cols, xrow = n * g.phases * g.plane_rows, g.phase_cols, _xrow(p, g)
    row = py * g.sh + phase - ph
    rowy = L.minimum(L.maximum(row, 0), h - 1)
    make = []
    for b in range(g.sw):
        col = (cc + g.col_min) * g.sw + b
        inside = L.logical_and(row >= 0, row < h, col >= 0, col < w)
        word = L.Select(inside, word_of(bi, q, rowy, L.minimum(L.maximum(col, 0), w - 1)), pad)
        make.append(L.For(q, g.pairs, L.For(cc, cols, L.Store(
            xrow, (((u * g.sw + b) * cols + cc) * g.pairs + q,), word))))
    copies = []
    for b, e, taps, start in g.phase_runs:
        first = ((u * g.sw + b) * cols + px + e - g.col_min) * g.pairs
        copies.append(L.For(j, taps * g.pairs, L.Store(
            ximg, ((u * g.wg + px) * g.k16 + start + j,), xrow[first + j]), L.ForKind.VECTORIZED
            if taps * g.pairs >= 2 else L.ForKind.SERIAL))
    if g.k16 > g.words:
        copies.append(L.For(j, g.k16 - g.words, L.Store(
            ximg, ((u * g.wg + px) * g.k16 + g.words + j,), pad)))
    return L.For(u, units, L.seq(*make, L.For(px, g.wg, L.seq(*copies))), par)


def _xrow(p: Conv2d, g: ConvGeometry) -> L.Buffer:
    """`_phase_split_image`'s rows of column phases (allocated around the whole kernel, so
    that it is workspace in the arena, not memory a call)."""
    units = p.x_dims[0] * g.phases * g.plane_rows
    return L.Buffer("xrow", T.uint32, (units * g.sw * g.phase_cols * g.pairs,), L.Scope.GLOBAL)


def _weights(g: ConvGeometry, w5: L.Buffer, wtaps: L.Buffer, par: L.ForKind) -> L.Stmt:
    """`wtaps` [panels, K16, runs, NR]: row kk of run t's tap, zero past k."""
    jp, kk, t, j = L.Var("jp"), L.Var("kk"), L.Var("t"), L.Var("j")
    value = g.weight_word(w5, jp, j, t, kk)
    runs = len(g.taps)
    return L.For(jp, g.panels, L.For(kk, g.k16, L.For(t, runs, L.For(
        j, g.nr, L.Store(wtaps, (((jp * g.k16 + kk) * runs + t) * g.nr + j,), value),
        L.ForKind.VECTORIZED))), par)


def _products(p: Conv2d, g: ConvGeometry, ximg: L.Buffer, weights: L.Buffer,
              par: L.ForKind, precision: str, finish) -> L.Stmt:
    """Every block: one parallel loop over (image, pixel block, channel block), the blocks in
    the config's order, a block's tile product over every tap run, then its store."""
    c = g.config
    v = L.Var("v")
    bi, pb, cb = g.block(v)
    k_rows = g.pairs if g.in_place else g.k16     # rows of k a panel holds
    runs = len(g.taps)
    jp, c0 = cb * g.bn // g.nr, cb * g.bn % g.nr
    cacc = L.Buffer("cacc", L.TILE_PRECISIONS[precision], (g.bm * g.bn,), L.Scope.LOCAL)
    product = L.TileProduct(
        precision, cacc[0], ximg[(bi * g.phases * g.plane + pb * g.bm) * g.k16],
        weights[jp * k_rows * runs * g.nr + c0], g.bn, (g.k16, ROWS * g.k16, ROWS),
        (runs * g.nr, ROWS, ROWS * runs * g.nr), c.row_tiles, c.col_tiles, g.steps,
        accumulate=False, runs=tuple(g.run(i) for i in range(runs)))
    block = L.Allocate(cacc, L.seq(product, _store(p, g, cacc, bi, pb, cb, finish)))
    units = p.x_dims[0] * g.pixel_blocks * g.channel_blocks
    return L.For(v, units, block, par if units > 1 else L.ForKind.SERIAL)


def _store(p: Conv2d, g: ConvGeometry, cacc: L.Buffer, bi, pb, cb, finish) -> L.Stmt:
    """The block's sums through `finish` (bias and the epilogue) into Y: its grid pixels inside
    the output (columns below OW, rows below OH), a channel block's channels (the last one's
    below M) in one vector loop of constant width."""
    x, y = L.Var("sx"), L.Var("sy")
    gp = pb * g.bm + x
    oy, ox = gp // g.wg, gp % g.wg

    def line(width: int) -> L.Stmt:
        ch = cb * g.bn + y
        index = (bi, ch, oy, ox)
        store = L.Store(p.y, index, finish(cacc[x * g.bn + y], index))
        return L.For(x, g.bm, L.If(L.logical_and(ox < g.ow, gp < g.grid), L.For(
            y, width, store, L.ForKind.VECTORIZED if width >= 2 else L.ForKind.SERIAL)))

    last = g.oc - (g.channel_blocks - 1) * g.bn
    if last == g.bn:
        return line(g.bn)
    return L.If(cb < g.channel_blocks - 1, line(g.bn), line(last))


# -- blocks of Y^T (rows_along "channels") -----------------------------------------------------


def _image_by_words(p: Conv2d, g: ConvGeometry, ximg: L.Buffer, par: L.ForKind, word_of,
                    pad: L.Expr) -> L.Stmt:
    """`ximg` [batch, phases, K16, plane]: the B operand of blocks of Y^T, word kk of every
    grid pixel of a phase side by side (a B tile's row: 16 pixels' word kk). A unit is a grid
    row (image, row phase a, row y) of every column phase b and word: each word's row of
    pixels in three loops, the columns left of the image, inside it (loads at the stride
    S, a constant offset: LLVM vectorises them), right of it; `pad` outside the image and
    past k. Folded, word kk = s P + q is channel pair q at window column s."""
    n, c, h, w = p.x_dims
    ph, pw = p.begins
    u, q, px = L.Var("u"), L.Var("q"), L.Var("px")
    units = n * g.sh * g.plane_rows
    bi, a, py = u // (g.sh * g.plane_rows), u // g.plane_rows % g.sh, u % g.plane_rows
    row = py * g.sh + a - ph
    inside_row = L.logical_and(row >= 0, row < h)
    yy = L.minimum(L.maximum(row, 0), h - 1)

    def line(phase, kk: L.Expr, offset: int, word: L.Expr | None) -> L.Stmt:
        """Word kk's row of pixels of `phase` at grid row py: image column px S + offset."""
        at = (((bi * g.phases + phase) * g.k16 + kk) * g.plane_rows + py) * g.wg
        if word is None:
            return L.For(px, g.wg, L.Store(ximg, (at + px,), pad))
        lo = min(g.wg, max(0, -(offset // g.sw)))     # the first px of column >= 0
        hi = max(lo, min(g.wg, (w - 1 - offset) // g.sw + 1))
        parts = [L.For(px, lo, L.Store(ximg, (at + px,), pad))] if lo else []
        if hi > lo:
            value = L.Select(inside_row, word_of(bi, word, yy, (px + lo) * g.sw + offset), pad)
            parts.append(L.For(px, hi - lo, L.Store(ximg, (at + lo + px,), value)))
        if g.wg > hi:
            parts.append(L.For(px, g.wg - hi, L.Store(ximg, (at + hi + px,), pad)))
        return L.seq(*parts)

    rows = []
    for b in range(g.col_phases):
        phase = a * g.col_phases + b
        if g.fold:
            for s in range(g.kw):
                rows.append(L.For(q, g.pairs, line(phase, s * g.pairs + q, s * g.dw - pw, q)))
        else:
            rows.append(L.For(q, g.pairs, line(phase, q, b - pw, q)))
        if g.k16 > g.words:
            rows.append(L.For(q, g.k16 - g.words, line(phase, g.words + q, 0, None)))
    return L.For(u, units, L.seq(*rows), par)


def _weight_rows(g: ConvGeometry, w5: L.Buffer, wrows: L.Buffer, par: L.ForKind) -> L.Stmt:
    """`wrows` [channel blocks x bm, runs, K16]: output channel ch's words of run t, the A
    operand of blocks of Y^T (a tile row: 16 words of one channel), zero past k and past M;
    copied once a call from ConvPacked's [panels, P, kh, kw, NR]."""
    ch, t, kk = L.Var("ch"), L.Var("t"), L.Var("kk")
    oc = L.minimum(ch, g.oc - 1)
    value = L.Select(ch < g.oc, g.weight_word(w5, oc // g.nr, oc % g.nr, t, kk),
                     L.Const(0, T.uint32))
    runs = len(g.taps)
    return L.For(ch, g.channel_blocks * g.bm, L.For(t, runs, L.For(
        kk, g.k16, L.Store(wrows, ((ch * runs + t) * g.k16 + kk,), value))), par)


def _products_transposed(p: Conv2d, g: ConvGeometry, ximg: L.Buffer, wrows: L.Buffer,
                         par: L.ForKind, precision: str, finish) -> L.Stmt:
    """Every block of Y^T (bm channels by bn pixels of one output row): its tile product
    over every tap run, then its store, a channel's pixels along a row (a row's last block
    its remaining pixels)."""
    c = g.config
    v, x, y = L.Var("v"), L.Var("v_ch"), L.Var("v_px")
    bi, pb, cb = g.block(v)
    oy, j = pb // g.line_blocks, pb % g.line_blocks
    runs = len(g.taps)
    cacc = L.Buffer("cacc", L.TILE_PRECISIONS[precision], (g.bm * g.bn,), L.Scope.LOCAL)
    product = L.TileProduct(
        precision, cacc[0], wrows[cb * g.bm * runs * g.k16],
        ximg[bi * g.phases * g.k16 * g.plane + oy * g.wg + j * g.bn], g.bn,
        (runs * g.k16, ROWS * runs * g.k16, ROWS), (g.plane, ROWS, ROWS * g.plane),
        c.row_tiles, c.col_tiles, g.steps, accumulate=False,
        runs=tuple(g.run(i) for i in range(runs)))
    ch = cb * g.bm + x

    def line(width: int) -> L.Stmt:
        index = (bi, ch, oy, j * g.bn + y)
        store = L.For(y, width, L.Store(p.y, index, finish(cacc[x * g.bn + y], index)),
                      L.ForKind.VECTORIZED if width >= 2 else L.ForKind.SERIAL)
        return L.For(x, g.bm, L.If(ch < g.oc, store) if g.oc % g.bm else store)

    last = g.ow - (g.line_blocks - 1) * g.bn
    stores = line(g.bn) if last == g.bn else L.If(j < g.line_blocks - 1, line(g.bn), line(last))
    units = p.x_dims[0] * g.pixel_blocks * g.channel_blocks
    return L.For(v, units, L.Allocate(cacc, L.seq(product, stores)),
                 par if units > 1 else L.ForKind.SERIAL)


AMX_CONV = Template("amx_conv", problems.conv2d, applies, space, default, build,
                    precisions=("bf16",), features=AMX_FEATURES)
