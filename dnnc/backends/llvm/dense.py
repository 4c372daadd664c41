"""The dense (MatMul / Gemm / MatMulPacked) schedule template for CPUs.

A register-blocked micro-kernel in the style of BLIS/GotoBLAS: an MR x NR block of C lives in
accumulators while k runs over a KC-long slice of A's rows and B's columns; NR is two vector
registers wide, so the fully unrolled block becomes broadcast-A / vector-B fused multiply-adds
(6 x 16 on AVX2: 12 ymm accumulators + B's 2 + A's broadcast, as BLIS's Haswell sgemm;
6 x 32 on AVX-512). Rows are split into MC-row blocks that the worker pool shares; k is split
into KC-deep slices so a slice of B stays in L2. Partial sums of earlier slices are kept in
the output itself; the epilogue (Gemm's alpha, beta*C, the fused consumers) applies after the
last slice.

A B that is not packed ahead (a run-time input: traced weights, attention's K and V) is
packed as the block runs: each panel's KC x NR slice copied into a contiguous local buffer
once per row block and read by its tiles (`MIN_PACK_TILES` or more), instead of every tile
reading B's rows a whole row of B apart (traced 128x768 @ 768x3072, 2 threads: 17 ms, from
about 27; with B packed at compile time 13 ms).

At precision bf16 (`Dense.pairs`: B packed in bf16 pairs along K) each tile's rows of A are
rounded to bf16 pairs once per row block and k-slice (`bf16.PairedA`, in the workspace every
panel reads) and the k loop runs over pairs, one `dot_bf16x2` (vdpbf16ps) per pair; kc stays
even so that no pair straddles two slices.

The problem is a `problems.Dense` (2-D products, batch dims of A folded into rows, and
batched products with equal batch dims). Knobs (`DenseConfig`): mr, nr, kc and mc_tiles
(MC = mc_tiles x MR); a packed B fixes nr to its panel width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..lower import STORE_REMAPS
from ..problems import Dense
from ..space import Constraint, Space, Template
from . import bf16

LAYOUT_TAILS = {op: frozenset(STORE_REMAPS) for op in problems.DENSE_OPS}
"""anchor op -> the layout ops after its epilogue this template stores through (fuse_ops'
`store_remaps`): the QKV projections write heads-first straight from the accumulators."""

MR = 6      # rows per tile: 6 x 2 vectors = 12 accumulators of AVX2's 16 ymm (BLIS Haswell)
MR_PAIRS_512 = 8
"""Rows per tile of a product in bf16 pairs on 512-bit vectors: 8 x 2 = 16 accumulators of
the 32 zmm, whose vdpbf16ps chains (latency ~6 cycles, two a cycle) 12 did not keep full.
Single products, 1 thread, znver5, CPU time, mr 6 / 8 / 10 / 12: 64x768x2304 505 / 442 / 487
/ 505 us, 64x3072x768 696 / 626 / 687 / 700, 3136x384x96 675 / 629 / 653 / 651, 196x1024x256
261 / 246 / 249 / 253; in float32 (FMA, latency 4) 8 rows were within 3% of 6 either way."""
KC = 256    # k per slice: a slice of B stays in L2
MC = 72     # rows per block at most (the worker pool's unit of work)
# row tiles a block must have for a B that is not packed ahead (a run-time input) to be
# packed panel by panel as the block runs: each copy is then read by that many tiles
MIN_PACK_TILES = 4


def default_panel(vector_bits: int) -> int:
    """Columns of B per tile (and per packed panel): two vector registers of float32."""
    return 2 * vector_bits // 32


@dataclass(frozen=True)
class DenseConfig:
    mr: int          # rows of a tile
    nr: int          # columns of a tile (a packed B's panel width)
    kc: int          # k per slice; partial sums of earlier slices wait in the output
    mc_tiles: int    # MR-row tiles per row block (the worker pool's unit)
    prefetch: bool = True   # a packed B's next panel fetched while this one's tiles run


def space(p: Dense, machine) -> Space:
    lanes = machine.vector_bits // 32
    widths = {v * lanes for v in (1, 2, 3, 4)} | ({p.packed_panel} if p.packed_panel else set())
    if p.y.dtype is T.float32:
        slices = {s for s in (16, 32, 64, 128, 256, 512, 1024) if s < p.k} | {p.k}
    else:
        slices = {p.k}   # partial sums cannot wait in an output of another type (a fused Cast)
    constraints = [Constraint(
        f"mc_tiles <= ceil(m / mr) with m = {p.m}: a row block reaches no tile past the last "
        f"row", lambda c: c.mc_tiles <= -(-p.m // c.mr))]
    if p.packed_panel:
        constraints.append(Constraint(
            f"nr == {p.packed_panel}: B is packed in panels of {p.packed_panel} columns",
            lambda c: c.nr == p.packed_panel))
    if p.pairs:
        constraints.append(Constraint(
            f"kc even or kc == k = {p.k}: B's bf16 pairs along k never straddle two slices",
            lambda c: c.kc % 2 == 0 or c.kc == p.k))
    return Space("dense", DenseConfig, {"mr": range(1, 9), "nr": sorted(widths),
                                        "kc": sorted(slices),
                                        "mc_tiles": range(1, min(p.m, 64) + 1),
                                        "prefetch": prefetch_choices(p)}, constraints)


def prefetch_choices(p: Dense) -> tuple:
    """The prefetch knob's values: both where a packed B has a next panel to fetch in its
    k-slice (two full panels or more), else on only (at most the next slice's first panel:
    off would be the same code but for that)."""
    return (False, True) if p.packed_panel and p.n // p.packed_panel >= 2 else (True,)


def default_rows(p: Dense, machine) -> int:
    """Rows of a full tile: MR, or MR_PAIRS_512 for bf16 pairs on 512-bit vectors."""
    return MR_PAIRS_512 if p.pairs and machine.vector_bits >= 512 else MR


def default(p: Dense, machine) -> DenseConfig:
    m, threads = p.m, machine.threads
    nr = p.packed_panel or default_panel(machine.vector_bits)
    rows = default_rows(p, machine)
    mc = max(rows, min(MC, -(-m // rows) * rows))
    blocks = -(-m // mc)
    if threads > 1 and p.batch == 1 and blocks >= threads:
        # row blocks in a multiple of the threads, as even as a tile's rows allow: 128 rows on 2
        # threads as 66 + 62 rather than 72 + 56 (the slower thread sets the time)
        blocks = -(-blocks // threads) * threads
        mc = max(rows, -(-(-(-m // blocks)) // rows) * rows)
    elif threads > 1 and p.batch * blocks < threads and p.n // nr >= 2:
        # fewer row blocks than threads: the pool shares (row block, panel) pairs (`loops`)
        mc = shared_block_tiles(-(-m // rows), mc // rows, p.batch * (p.n // nr), threads) * rows
    elif blocks > 1:
        # blocks as even as a tile's rows allow
        mc = max(rows, -(-(-(-m // blocks)) // rows) * rows)
    if threads > 1 and mc > rows and p.rows_contiguous:
        # a column's rows consecutive in the output (`column_store`): row blocks whole
        # cache lines of each column, so that no two threads write one line
        step = math.lcm(rows, max(1, 64 // p.y.dtype.itemsize))
        mc = mc // step * step if mc >= step else mc
    # fewer rows than a tile: a tile of m rows (a 6-row tile at m = 1 did six times the
    # FMAs, the five extra rows' never stored), k in one slice (the rows of A fit in L1)
    mr = min(rows, m)
    kc = min(KC, p.k) if p.y.dtype is T.float32 and m > rows else p.k
    return DenseConfig(mr, nr, kc, 1 if m < rows else mc // rows)


CHUNK_COST = 0.25
"""What a (row block, panel) pair costs besides its tiles, in tiles (`shared_block_tiles`)."""


def shared_block_tiles(tiles: int, most: int, panels: int, threads: int,
                       chunk_cost: float = CHUNK_COST) -> int:
    """Tiles per row block when the pool shares (row block, panel) pairs: the block size,
    at most `most`, whose pairs the threads finish soonest, counting each thread's rounds of
    pairs at (tiles + chunk_cost) each, the biggest block on a tie (a narrow last panel is
    not counted). 1024->256 at 14x14 (33 tiles, 8 panels) on 16 threads: 9-tile blocks, 32
    pairs in 2 rounds of 9.25, not 11-tile blocks, 24 pairs in 2 rounds of 11.25 that leave
    8 threads idle in the second."""
    best, best_cost = most, None
    for size in range(most, 0, -1):
        pairs = -(-tiles // size) * panels
        cost = -(-pairs // threads) * (size + chunk_cost)
        if best_cost is None or cost < best_cost:
            best, best_cost = size, cost
    return best


def build(p: Dense, config: DenseConfig, machine) -> L.PrimFunc:
    views = DenseViews(p, config.nr)
    body = _Blocking(p, config, views, machine.vector_bits // 32).loops(machine.threads)
    return L.simplify(L.PrimFunc(p.name, views.params(), body))


class DenseViews:
    """A, B and Y as the micro-kernel indexes them: the parameters viewed as 3-D [batch,
    rows, cols] (same pointers), B as its panels when packed, Y through the layout tail when
    the group has one."""

    def __init__(self, p: Dense, nr: int):
        self.p, self.nr = p, nr
        batch, m, n, k = p.batch, p.m, p.n, p.k
        self.a = L.Buffer(p.a.name, T.float32, p.a_dims)
        if p.pairs:   # each (pair of k, column) one 32-bit word of two bf16
            self.b = L.Buffer(p.b.name, T.uint32, p.b_dims[:3])
        elif p.packed_panel:
            self.b = L.Buffer(p.b.name, T.float32, p.b_dims)
        else:
            self.b = L.Buffer(p.b.name, T.float32, (batch if p.b_batched else 1,) +
                              ((n, k) if p.trans_b else (k, n)))
        self.y = L.Buffer(p.y.name, p.y.dtype, (batch, m, n))
        self.y_full = L.Buffer(p.y.name, p.y.dtype, p.y_dims)
        self.panels_contiguous = _panels_contiguous(p, nr)
        # a column's rows consecutive in the output (NCHW pixels of a 1x1 conv, a product
        # stored through a Transpose to channels first): a tile is stored a column at a time,
        # into Y viewed as one axis (`column_start`)
        self.rows_contiguous = not self.panels_contiguous and p.rows_contiguous
        self.y_flat = L.Buffer(p.y.name, p.y.dtype, (math.prod(p.y_dims),))

    def a_at(self, bi, i, kk) -> L.Expr:
        return self.a[self.p.a_index(bi, i, kk)]

    def b_at(self, bi, kk, j) -> L.Expr:
        """B[kk, j] (with B in pairs: the word of pair kk of column j)."""
        if self.p.packed_panel:
            return self.b[j // self.nr, kk, j % self.nr]
        bb = bi if self.p.b_batched else 0
        return self.b[bb, j, kk] if self.p.trans_b else self.b[bb, kk, j]

    def y_at(self, bi, i, j0, jj) -> L.Load:
        """The output element the product's element (bi, i, j0 + jj) is stored at (j0: the
        panel's first column)."""
        where = self.p.store_index
        if where is None:
            return self.y[bi, i, j0 + jj]
        if self.panels_contiguous:
            base = where(self.p.anchor_index(bi, i, j0))
            return self.y_full[base[:-1] + (base[-1] + jj,)]
        return self.y_full[where(self.p.anchor_index(bi, i, j0 + jj))]

    def column_start(self, bi, i, j) -> L.Expr:
        """Where the output element (bi, i, j) lies in `y_flat`: with `rows_contiguous`, rows
        i + 1, i + 2, ... of column j (of batch bi) follow it."""
        p = self.p
        place = L.const(0)
        for e, d in zip(p.store_index(p.anchor_index(bi, i, j)), p.y_dims):
            place = place * d + e
        return place

    def params(self) -> tuple:
        """The kernel's parameters with A, B and Y as viewed here."""
        p = self.p
        views: dict[str, L.Buffer] = {}
        for buffer in (self.a, self.b, self.y if p.store_index is None else self.y_full, p.c):
            if buffer is not None:
                views.setdefault(buffer.name, buffer)   # A first, should A also be B
        return tuple(views.get(x.name, x) for x in p.params)


class _Blocking:
    """The loop nest: k-slices outermost (kb), then row blocks of MC rows (mb, shared by the
    worker pool; fused with the batch into bm), tiles of MR rows (ib), panels of NR columns
    (jp, then one narrower panel for the columns left; shared by the pool instead when there
    are fewer row blocks than threads), each tile an MR x NR block of accumulators."""

    def __init__(self, p: Dense, config: DenseConfig, views: DenseViews, lanes: int):
        self.p, self.views, self.lanes = p, views, lanes
        self.mr, self.nr, self.kc = config.mr, config.nr, config.kc
        self.mc = config.mc_tiles * config.mr
        self.prefetching = config.prefetch and bool(p.packed_panel)
        self.n_kb = -(-p.k // self.kc)
        self.bi, self.kb, self.mb, self.jp, self.ib = (
            L.Var(x) for x in ("b", "kb", "mb", "jp", "ib"))
        # A stored [k, m] (a 1x1 conv's NCHW image, Gemm's transA) is packed tile by tile
        # when two or more panels read it (`pack_a`); set by `loops`
        self.apack: L.Buffer | None = None
        self.ablock: L.Expr = L.const(0)
        # A rounded to bf16 in pairs, packed per row block, when B is in pairs (`loops`)
        self.paired: bf16.PairedA | None = None

    def loops(self, threads: int) -> L.Stmt:
        p, nr, bi, mb = self.p, self.nr, self.bi, self.mb
        n_main = (p.n // nr) * nr
        n_mb = -(-p.m // self.mc)
        # fewer row blocks than threads (a batch-1 classifier's m = 1, a short sequence, a
        # 14x14 image's pixels): the pool shares (row block, panel) pairs, one parallel loop
        # (alexnet's 9216 x 4096 layer at m = 1 ran on one of 16 cores: dnnc 4x onnxruntime;
        # 1024->256 at 14x14 as three row blocks, each a parallel loop of its 8 panels, kept
        # 8 of 16 cores busy: 3.4x)
        by_panels = threads > 1 and n_mb * p.batch < threads and n_main // nr >= 2
        if p.pairs:
            self.paired = bf16.PairedA(self.views.a_at, p.k, self.kc, self.mr, self.lanes,
                                       p.batch * n_mb, self.mc // self.mr, p.trans_a)
            self.apack, self.ablock = self.paired.buffer, bi * n_mb + mb
        elif p.trans_a and p.n >= 2 * nr:
            # a workspace (`codegen.workspace_params`: the caller's memory, nothing allocated
            # per call; malloc'd per row block it cost resnet50 5% at 1 thread), a slot per
            # row block
            self.apack = L.Buffer("apack", T.float32, (p.batch * n_mb * self.mc * self.kc,),
                                  L.Scope.GLOBAL)
            self.ablock = bi * n_mb + mb
        full = self.panel_tiles(n_main)
        tail = L.For(self.ib, self.mc // self.mr, self.tile(p.n - n_main, L.const(n_main))) \
            if p.n > n_main else None
        if by_panels:
            panels = n_main // nr + (tail is not None)
            t = L.Var("t")
            body = full if tail is None else \
                L.If(self.jp < n_main // nr, full, tail)
            body = L.substitute(body, {self.jp: t % panels})
            pairs = L.For(t, p.batch * n_mb * panels, L.substitute(
                body, {bi: (t // panels) // n_mb, mb: (t // panels) % n_mb}),
                L.ForKind.PARALLEL)
            if self.apack is None:
                return L.For(self.kb, self.n_kb, pairs)
            # every block's tiles packed first (the pool shares the tiles), then the pairs
            tiles, u = self.mc // self.mr, L.Var("u")
            blk = u // tiles
            pack = L.For(u, p.batch * n_mb * tiles, L.substitute(
                self.pack_a(), {bi: blk // n_mb, mb: blk % n_mb, self.ib: u % tiles}),
                L.ForKind.PARALLEL)
            return L.Allocate(self.apack, L.For(self.kb, self.n_kb, L.seq(pack, pairs)))
        parts = []
        if n_main:
            parts.append(L.For(self.jp, n_main // nr, full))
        if tail is not None:
            parts.append(tail)
        row_blocks = L.seq(*parts)
        if self.apack is not None:
            # each row block packs its own tiles of A, read by every panel
            row_blocks = L.seq(L.For(self.ib, self.mc // self.mr, self.pack_a()), row_blocks)
        kind = L.ForKind.PARALLEL if threads > 1 and n_mb * p.batch > 1 else L.ForKind.SERIAL
        if p.batch > 1:
            bm = L.Var("bm")
            inner = L.substitute(row_blocks, {bi: bm // n_mb, mb: bm % n_mb})
            outer = L.For(bm, p.batch * n_mb, inner, kind)
        else:
            outer = L.For(mb, n_mb, L.substitute(row_blocks, {bi: L.const(0)}), kind)
        nest = L.For(self.kb, self.n_kb, outer)
        return nest if self.apack is None else L.Allocate(self.apack, nest)

    def panel_tiles(self, n_main: int) -> L.Stmt:
        """The tiles of row block mb in full panel jp."""
        tiles = self.mc // self.mr
        if not self.p.packed_panel and n_main and tiles >= MIN_PACK_TILES:
            # B as the caller gave it (a run-time input): each panel's kc x nr slice copied
            # into a contiguous buffer once per row block, then read by every tile of the block
            panel = L.Buffer("bpanel", T.float32, (self.kc * self.nr,), L.Scope.LOCAL)
            return L.Allocate(panel, L.seq(
                self.pack(panel, self.jp * self.nr),
                L.For(self.ib, tiles, self.tile(self.nr, self.jp * self.nr, panel))))
        # panels outside tiles: a panel's kc x nr slice (32 KB at 256 x 32) is read by every
        # tile of the block from L1/L2, and the block's rows of A (MC x kc) stay in L2; tiles
        # outside panels streamed the whole kc slice of B (3 MB for 768x3072) from L3 once
        # per tile (Xeon, 2 threads, 128x768 @ 768x3072: 1.9 ms from 3.8, numpy 2.1)
        return L.For(self.ib, tiles, self.tile(self.nr, self.jp * self.nr))

    def pack(self, panel: L.Buffer, j0: L.Expr) -> L.Stmt:
        """`panel[k * nr + j]` = B[kb * kc + k, j0 + j] for the k of this slice."""
        nr, kk, jj = self.nr, L.Var("pk"), L.Var("pj")
        return L.For(kk, L.minimum(L.const(self.kc), self.p.k - self.kb * self.kc), L.For(
            jj, nr, L.Store(panel, (kk * nr + jj,),
                            self.views.b_at(self.bi, self.kb * self.kc + kk, j0 + jj)),
            L.ForKind.VECTORIZED))

    def a_slot(self, k_in_slice: L.Expr, ii) -> tuple:
        """Where packed A holds row i0 + ii (tile ib of block `ablock`), k = kb * kc +
        k_in_slice: each tile's MR rows side by side for every k of the slice."""
        tiles = self.mc // self.mr
        return ((((self.ablock * tiles + self.ib) * self.kc + k_in_slice) * self.mr + ii),)

    def pack_a(self) -> L.Stmt:
        """Tile ib of row block mb of A, this k-slice, into `apack` (`a_slot`): A stored
        [k, m] gives a tile's MR rows of one k side by side but the next k a row of the image
        away, so the k loop touched a new cache line per step and the slice's lines (K x
        pixels, 400 KB for 2048->512 at 7x7) outgrew L1: Zen 3, 1 thread, 2048->512 at 7x7
        2.24 ms, 2.5x the MatMul of the same sizes (onnxruntime 1.47). Rows past M repeat
        the last, as in `tile`."""
        p, mr, kc, kb = self.p, self.mr, self.kc, self.kb
        kk, ii = L.Var("pk"), L.Var("pi")
        i0 = self.mb * self.mc + self.ib * mr
        if self.paired is not None:
            return L.If(i0 < p.m, self.paired.pack(
                self.bi, lambda r: L.minimum(i0 + r, p.m - 1), kb, self.ablock, self.ib,
                (i0 + mr <= p.m, lambda r: i0 + r)))
        row = L.minimum(i0 + ii, p.m - 1)
        depth = L.minimum(L.const(kc), p.k - kb * kc)
        copy = L.For(kk, depth, L.For(ii, mr, L.Store(
            self.apack, self.a_slot(kk, ii), self.views.a_at(self.bi, row, kb * kc + kk)),
            L.ForKind.UNROLLED))
        return L.If(i0 < p.m, copy)

    def computed_width(self, width: int) -> int:
        """The columns a tile of `width` computes: a narrow last panel of packed B that is
        not whole vectors (24 columns of a 32-column panel with 16 lanes) computes whole
        vectors, its extra columns reading the panel's zero padding and never stored. Its
        odd-width accumulators were built lane by lane (AVX-512: 440->440 1x1 convs at 7x7,
        regnet_y_400mf's, 6-9x onnxruntime). With k in slices (their partial sums read
        back from Y) or B as given (no padding to read) it computes what it stores."""
        lanes = self.lanes
        if width % lanes == 0 or not self.p.packed_panel or self.n_kb > 1 or \
                (width < lanes and width & (width - 1) == 0):
            return width
        padded = 1 << (width - 1).bit_length() if width < lanes else -(-width // lanes) * lanes
        return padded if padded <= self.nr else width

    def tile(self, width: int, j0: L.Expr, panel: L.Buffer | None = None) -> L.Stmt:
        """One MR x width block of Y at rows i0.., columns j0..: init, k loop, store; B read
        from `panel` (this slice of the panel, packed by `pack`) where given."""
        pieces = vector_pieces(width, self.lanes)
        if panel is None and len(pieces) > 1 and self.computed_width(width) == width:
            return L.seq(*(self.tile(w, j0 + sum(pieces[:k])) for k, w in enumerate(pieces)))
        p, views, mr, kc, n_kb = self.p, self.views, self.mr, self.kc, self.n_kb
        bi, kb = self.bi, self.kb
        i0, kk, ii, jj = L.Var("i0"), L.Var("k"), L.Var("ii"), L.Var("jj")
        stored, width = width, self.computed_width(width)
        # a tile of few accumulator vectors (m = 1: one row of two) is a chain of dependent
        # FMAs, each waiting out the last's latency: k is then split over `splits` sets of
        # accumulators (8 chains in flight, as latency x FMAs a cycle needs), summed at the end
        vectors = mr * -(-width // self.lanes)
        splits = max(1, min(4, 8 // vectors))
        acc = L.Buffer("acc", T.float32, (splits * mr * width,), L.Scope.LOCAL)
        row = L.minimum(i0 + ii, p.m - 1)   # rows past M repeat the last row; never stored
        vec = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        by_columns = views.rows_contiguous and mr > 1   # (`column_store`)
        # later k-slices start from the partial sums the earlier ones left in the output (a
        # column's rows one vector where the tile is stored so)
        start = L.const(0.0) if n_kb == 1 or by_columns else \
            L.Select(L.eq(kb, 0), L.const(0.0), views.y_at(bi, row, j0, jj))
        init = L.For(ii, mr, L.For(jj, width, L.Store(acc, (ii * width + jj,), start), vec),
                     L.ForKind.UNROLLED)
        if n_kb > 1 and by_columns:
            init = L.seq(init, L.If(kb > 0, self.columns(i0, j0, width, lambda i, j, place:
                                                         L.Store(acc, (i * width + j,),
                                                                 views.y_flat[place]))))
        a = L.Var("a", T.uint32 if self.paired else T.float32)
        depth = L.minimum(L.const(kc), p.k - kb * kc)
        if self.paired is not None:
            depth = (depth + 1) // 2
        # (full panels only: a narrow last panel computed as a whole one is outside jp's loop)
        ahead = self.prefetch_ahead(depth) if self.prefetching and stored == self.nr and \
            panel is None else None

        def update(k_in_slice: L.Expr, part: int) -> L.Stmt:
            if ahead is not None:
                return L.seq(ahead(k_in_slice), step(k_in_slice, part))
            return step(k_in_slice, part)

        def step(k_in_slice: L.Expr, part: int) -> L.Stmt:
            at = part * mr * width + ii * width + jj
            if self.paired is not None:   # k_in_slice: a pair of the slice
                a_value = self.apack[self.paired.slot(self.ablock, self.ib, ii, k_in_slice)]
                b = views.b_at(bi, kb * (kc // 2) + k_in_slice, j0 + jj)
                value = bf16.product(acc[at], a, b)
            else:
                kglob = kb * kc + k_in_slice
                b = views.b_at(bi, kglob, j0 + jj) if panel is None else \
                    panel[k_in_slice * width + jj]
                a_value = views.a_at(bi, row, kglob) if self.apack is None else \
                    self.apack[self.a_slot(k_in_slice, ii)]
                value = L.call("fma", a, b, acc[at])
            return L.For(ii, mr, L.Let(a, a_value, L.For(
                jj, width, L.Store(acc, (at,), value), vec)), L.ForKind.UNROLLED)

        if splits == 1:
            kloop = L.For(kk, depth, update(kk, 0))
        else:
            zero = L.For(ii, (splits - 1) * mr, L.For(jj, width, L.Store(
                acc, (mr * width + ii * width + jj,), L.const(0.0)), vec), L.ForKind.UNROLLED)
            whole = depth // splits
            kloop = L.seq(zero, L.For(kk, whole, L.seq(*(
                update(kk * splits + part, part) for part in range(splits)))),
                L.For(kk, depth - whole * splits, update(whole * splits + kk, 0)),
                L.For(ii, mr, L.For(jj, width, L.Store(acc, (ii * width + jj,), sum(
                    (acc[part * mr * width + ii * width + jj] for part in range(1, splits)),
                    acc[ii * width + jj])), vec), L.ForKind.UNROLLED))
        if by_columns:
            store = self.column_store(acc, i0, j0, width, stored)
        else:
            target = views.y_at(bi, i0 + ii, j0, jj)
            store = L.For(ii, mr, L.If(i0 + ii < p.m, L.For(jj, stored, L.Store(
                target.buffer, target.indices,
                self.finished(acc[ii * width + jj], i0 + ii, j0 + jj)), vec)),
                L.ForKind.UNROLLED)
        body = L.Allocate(acc, L.seq(init, kloop, store))
        return L.Let(i0, self.mb * self.mc + self.ib * mr, L.If(i0 < p.m, body))


    def finished(self, value: L.Expr, i, j) -> L.Expr:
        """Y's element (row i, column j) from its sum `value`: through `Dense.finish` after
        the last k-slice, the partial sum itself after an earlier one."""
        done = self.p.finish(value, self.bi, i, j)
        if self.n_kb > 1:
            done = L.Select(L.eq(self.kb, self.n_kb - 1), done, value)
        return done

    def columns(self, i0: L.Expr, j0: L.Expr, count: int, body) -> L.Stmt:
        """`body(ii, jj, place)` for each of the tile's first `count` columns jj, its rows ii
        one vector (`place`: where row i0 + ii of column j0 + jj lies in `DenseViews.y_flat`,
        consecutive rows consecutive there: `DenseViews.rows_contiguous`): all MR rows, or a
        batch's last tile's rows only (tiles start at multiples of MR)."""
        ii, jj = L.Var("ii"), L.Var("jj")

        def rows(n: int) -> L.Stmt:
            place = self.views.column_start(self.bi, i0, j0 + jj) + ii
            kind = L.ForKind.VECTORIZED if n >= 2 else L.ForKind.UNROLLED
            return L.For(jj, count, L.For(ii, n, body(ii, jj, place), kind), L.ForKind.UNROLLED)
        last = self.p.m % self.mr
        return rows(self.mr) if not last else L.If(i0 + self.mr <= self.p.m, rows(self.mr),
                                                   rows(last))

    def column_store(self, acc: L.Buffer, i0: L.Expr, j0: L.Expr, width: int,
                     stored: int) -> L.Stmt:
        """The tile stored a column at a time, its rows one vector through the epilogue (a
        residual read as a vector too: `PointwiseDense.epilogue_index`), where the output
        holds a column's rows consecutively (`DenseViews.rows_contiguous`); a batch's last
        tile, short of MR rows, its rows only (`columns`). Stored a row at a time, each of
        the row's columns went to a plane of its own, one lane a store. Row / column stores,
        1 thread, znver5, CPU time (the same bits): convnext's 384 -> 96 at 56x56 through
        its Transpose to NCHW 845 / 767 us in bf16, 1160 / 1094 in float32; 1536 -> 384 at
        14x14 668 / 612 (bf16); 1x1 convs through `pointwise_gemm`, bf16: stride-2 256 ->
        512 at 56x56 569 / 518, 1024 -> 256 at 14x14 316 / 310. Until session 58 the
        epilogue ran a row at a time (a residual, and a later k-slice's partial sums, loaded
        a lane at a time) into a staged tile, and a short tile was stored a lane at a time:
        LLVM's SLP vectorizer and dead-store elimination took time quadratic in those lanes
        (docs/llvm_backend.md, "Compile time of the direct convolutions")."""
        return self.columns(i0, j0, stored, lambda ii, jj, place: L.Store(
            self.views.y_flat, (place,), self.finished(acc[ii * width + jj], i0 + ii,
                                                       j0 + jj)))

    def prefetch_ahead(self, depth: L.Expr):
        """k step -> the prefetches of a packed B's next panel (this k-slice's; the next
        slice's first panel after the last) that the step of tile ib makes: the block's tiles
        together touch each line of it once while they run this panel from L1/L2. A panel's
        slice lies a whole panel (k x nr words) after the last: 16 KB runs 48 KB apart for
        768-deep bf16 pairs, a new stream every 4 KB page, which the hardware prefetchers
        met cold each time; with weights larger than L3 (gpt2's 36 MB in bf16) a product ran
        at 0.75 of its speed with the weights cached, OpenVINO's at 0.8."""
        p, nr, views = self.p, self.nr, self.views
        panels = (p.n // nr)
        if panels < 2 and self.n_kb < 2:
            return None
        rows = self.p.b_dims[1]   # k (or pairs of k) of a panel
        tiles = self.mc // self.mr
        words = -(-nr // tiles)   # words of the next panel each step covers
        last = panels - 1
        nxt = self.jp + 1
        jn = L.Select(nxt <= last, nxt, L.const(0))
        kn = L.Select(nxt <= last, self.kb, L.minimum(self.kb + 1, L.const(self.n_kb - 1)))
        kc_rows = self.kc // 2 if self.paired is not None else self.kc
        end = depth * nr - 1

        def ahead(k_in_slice: L.Expr) -> L.Stmt:
            at = (self.ib * depth + k_in_slice) * words
            fetches = []
            for q in range(0, words, LINE_WORDS):
                w = L.minimum(at + q if q else at, end)
                row = L.minimum(kn * kc_rows + w // nr, L.const(rows - 1))
                fetches.append(L.Prefetch(views.b[jn, row, w % nr]))
            return L.seq(*fetches)
        return ahead


LINE_WORDS = 16   # 4-byte words of a 64-byte cache line


def vector_pieces(width: int, lanes: int) -> list[int]:
    """`width` columns as tiles the accumulators hold in whole registers: whole vectors, then
    halves, quarters, ... of one (20 with 16 lanes: 16 + 4). A 20-wide tile's accumulators
    straddled its vectors (an <20 x float> at offsets 20 apart): built lane by lane through
    the stack, mobilevit_xxs's attention [16 x 49 x 49] @ [49 x 20] took 8x onnxruntime's
    time (0.142 ms against 0.017)."""
    pieces = [width // lanes * lanes] if width >= lanes else []
    rest, size = width % lanes, lanes
    while rest:
        size //= 2
        if rest >= size:
            pieces.append(size)
            rest -= size
    return pieces


def _panels_contiguous(p: Dense, nr: int) -> bool:
    """Whether a layout tail keeps each panel's columns consecutive in the output (heads of
    64 columns hold whole 32-column panels): then a panel row is stored as one vector at its
    first column's place. Checked on every element (skipped, as False, past 4M)."""
    comps = p.store_grid(p.batch * p.m)
    if comps is None:
        return False
    n_main, cols = (p.n // nr) * nr, np.arange(p.n)
    first = np.where(cols < n_main, cols // nr * nr, n_main)
    for c in comps[:-1]:
        if not np.array_equal(c, c[:, first]):
            return False
    return bool(np.array_equal(comps[-1], comps[-1][:, first] + (cols - first)))


# (float32 and bf16 products: 16-bit storage takes the default template)
DENSE = Template("dense", problems.dense, lambda p: p.float32, space, default, build)
