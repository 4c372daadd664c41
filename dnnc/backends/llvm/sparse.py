"""The sparse-weights template for CPUs: SparseConv (a 1x1 conv) and SparseDense kernels
(`sparse_problems.SparseProblem`), weights in CSR rows (one an output), the activations
dense.

As "Fast Sparse ConvNets" (Elsen et al., CVPR 2020) and XNNPACK's f32-spmm do it: a block of
`places` places (a 1x1 conv's consecutive pixels of one image) is the unit; for each output
row j of the block, its accumulators (a vector register per `lanes` places) add
values[e] * X[columns[e], block] for each nonzero e of row j, a broadcast weight and one
vector load of the activations a vector: the activations' block (depth x places) stays in L1
while every row reads it, the weights stream once per block. A row's chain of dependent
multiply-adds is split over `splits` sets of accumulators (the FMA's latency), summed when
the row ends; the bias and the fused consumers apply where the row is stored. A SparseDense
(A [m, K] holding a row's k together) first copies its block of rows transposed into a
local [K, places] buffer, so that the same loop reads places contiguously; its outputs are
stored a row of Y apart. The worker pool shares (image, place block, row group) units.

Skipping a zero weight drops its term x * 0, which IEEE makes NaN for a NaN or infinite x
(the dense product's, NumPy's and onnxruntime's result). So a block adds x - x (0, or NaN
for a non-finite x) over its activations to a per-place flag as it packs them (a pass of its
own where they are not packed); a block with a flagged place runs its last slice's rows in a
second version, where each row checks the flagged places exactly (`_Flag.fix`) and puts NaN
into their sums before the bias and the epilogue.

Knobs (`SparseConfig`): places, splits, prefetch (each row fetches the entries of a row a few
ahead: `PREFETCH_ROWS`), row_groups (chunks of rows split into that many units,
by default as many units as the threads where the blocks are fewer: a 7x7 image is one block;
each unit packs its block's activations again, so one thread takes one group: resnet50's 7x7
layers at 90% zeros took 0.65-0.88x the time in 1 group than in 2 at 1 thread (CPU time),
0.86-0.93x in 2 than in 4 at 2 threads (wall, interleaved), shared znver5). It never serves
a dense product (those are MatMul / Conv kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ..sparse_problems import SparseProblem, sparse_product
from ..space import Constraint, Space, Template
from .conv import parallel_kind

MIN_PARALLEL_WORK = 1 << 15
"""Multiply-adds below which the kernel runs on one thread (a parallel region costs a few
microseconds to start)."""


PREFETCH_ROWS = 4
"""A row fetches the cache lines of the entries of the row 4 after it in the slice
(`_Block.prefetch`): a slice's rows' entries lie a row apart (`encode_csr` keeps a row's
slices together), so the hardware's stream prefetchers missed each row's first lines, and a
model's weights come from memory. 1 thread, CPU time, znver4, the caches flushed between
calls: BERT-base's 3072->768 at 128 tokens, 70% zeros 4.68-5.18 -> 3.83-4.08 ms, 90%
2.77-2.88 -> 2.00-2.18 ms; 768->768 at 70% 1.24-1.79 -> 1.07-1.09 ms (2 rows ahead as good)."""
LINE_ENTRIES = 16
"""Entries (4-byte values or columns) in a 64-byte cache line."""


@dataclass(frozen=True)
class SparseConfig:
    places: int       # places a block computes (vectors of lanes; a narrower last block)
    splits: int       # accumulator sets a row's nonzeros are dealt over
    row_groups: int   # units the rows of a block are split into
    pack: bool = True  # a conv's block of pixels copied contiguous first (SparseDense: always)
    prefetch: bool = True  # rows fetch the entries of a row PREFETCH_ROWS ahead


def space(p: SparseProblem, machine) -> Space:
    lanes = machine.vector_bits // 32
    widths = {v * lanes for v in (1, 2, 3, 4)} | ({p.places} if p.places < 4 * lanes else set())
    chunks = -(-p.rows // chunk_rows(p, lanes))
    groups = [g for g in (1, 2, 4, 8, 16, 32, 64) if g <= chunks]
    return Space("sparse", SparseConfig, {"places": sorted(widths), "splits": (1, 2, 4),
                                          "row_groups": groups, "pack": (False, True),
                                          "prefetch": (False, True)},
                 [Constraint(f"places <= {max(p.places, lanes)} (the places, at least a "
                             f"vector): a wider block computes nothing more",
                             lambda c: c.places <= max(p.places, lanes)),
                  Constraint("pack for a SparseDense (A's rows are transposed into the block) "
                             "and a windowed SparseConv (its columns are runs of the padded "
                             "planes)", lambda c: c.pack or not (p.transposed or p.windowed))])


WIDE_SLICES = 3
"""A SparseDense or 1x1 SparseConv whose rows span at most this many slices computes 4
vectors of places a block (else 2): each entry's weight and column loaded, and each row set
up, once for twice the multiply-adds, at the cost of twice the partial sums between slices.
1 thread, shared znver5, CPU time, against 2 vectors: BERT-base's products at 128 tokens 768
deep (3 slices) 1.14-1.17x faster at 70% zeros, 1.0-1.05x at 90%, 3072 deep (12 slices)
0.72x at 90% (the partial sums, 768 rows x 4 vectors a block, leave L1: those keep 2);
1x1 convs of mobilenet_v2's and resnet50's at 90% (1 to 3 slices) 0.98-1.19x, at 70% up to
1.21x. (find_sparsity's estimate still counts 2 vectors: it errs towards dense.)"""


def default(p: SparseProblem, machine) -> SparseConfig:
    lanes, threads = machine.vector_bits // 32, machine.threads
    # one block where the places are few (a 7x7 image's 49: computed as 4 vectors), else
    # two vectors of them (four where the rows span few slices, WIDE_SLICES)
    vectors = 4 if not p.windowed and p.slices <= WIDE_SLICES else 2
    places = p.places if p.places <= 4 * lanes else vectors * lanes
    blocks = p.batch * -(-p.places // places)
    groups = 1
    chunks = -(-p.rows // chunk_rows(p, lanes))
    while blocks * groups < threads and groups * 2 <= min(chunks, 64):
        groups *= 2
    # one slice: a row's entries follow the row before's, a stream the hardware prefetches
    return SparseConfig(places, 2, groups, prefetch=p.slices > 1)


def chunk_rows(p: SparseProblem, lanes: int) -> int:
    """Rows computed as one chunk: a SparseDense's a vector of them, stored as a vector along
    a row of Y (row by row, its places' outputs are a row of Y apart: at N = 3072 floats, 12
    KB, all 32 of a block fell in one L1 set, and BERT's FFN at 99.9% zeros took 68% of the
    dense product's time); a SparseConv's one (a row's places are contiguous in Y)."""
    return min(lanes, p.rows) if p.transposed else 1


def build(p: SparseProblem, config: SparseConfig, machine) -> L.PrimFunc:
    width = config.places
    full, rest = divmod(p.places, width)
    blocks = full + (rest > 0)
    rows = chunk_rows(p, machine.vector_bits // 32)
    chunks = -(-p.rows // rows)
    groups = config.row_groups
    per_group = -(-chunks // groups)
    units = p.batch * blocks * groups
    t = L.Var("t")
    b, pb, g = t // (blocks * groups), (t // groups) % blocks, t % groups
    # partial sums between slices: a workspace slot per unit (`codegen.workspace_params`:
    # the caller's memory, as dense.py's packed A), [unit, row of its group, place]
    part = L.Buffer("part", T.float32, (units * per_group * rows * width,), L.Scope.GLOBAL) \
        if p.slices > 1 else None
    window = _Window(p) if p.windowed else None
    geometry = _Rows(rows, chunks, groups, per_group, b, g, t, part, window)
    lanes = machine.vector_bits // 32

    def block(w: int, p0: L.Expr) -> L.Stmt:
        cw = computed_width(w, lanes, p.transposed or config.pack or p.windowed)
        return _Block(p, config, geometry, w, cw, p0).stmt()

    if full and rest:
        unit = L.If(pb < full, block(width, pb * width), block(rest, L.const(full * width)))
    elif full:
        unit = block(width, pb * width)
    else:
        unit = block(rest, L.const(0))
    kind = parallel_kind(machine.threads, p.batch * p.places * p.nnz, MIN_PARALLEL_WORK) \
        if units > 1 else L.ForKind.SERIAL
    views = {buffer.name: buffer for buffer in (p.x, p.y)}
    params = tuple(views.get(x.name, x) for x in p.params)
    body = L.For(t, units, unit, kind)
    if window is not None:
        body = window.around(body, kind)
    if part is not None:
        body = L.Allocate(part, body)
    return L.simplify(L.PrimFunc(p.name, params, body))


def _index(e: L.Expr) -> L.Expr:
    """An int32 CSR entry as an index."""
    return L.Cast(T.int64, e)


@dataclass(frozen=True)
class _Rows:
    """How a unit's rows are laid out: chunks of `rows` rows, `per_group` chunks of the
    `chunks` for each of `groups` groups; unit t computes group g of image b."""

    rows: int
    chunks: int
    groups: int
    per_group: int
    b: L.Expr
    g: L.Expr
    t: L.Var
    part: L.Buffer | None
    window: "_Window | None"


def computed_width(width: int, lanes: int, packed: bool) -> int:
    """The places a block of `width` computes: whole vectors (a power of two below one) where
    its activations are packed (the padding zero, never stored); an odd width's accumulators
    were built lane by lane (a 7x7 image's 49 places as blocks of 32 and 17: 1.8x the time
    the cost rule's count of vector operations gave)."""
    if not packed or width == 1 or width % lanes == 0:
        return width
    if width < lanes:
        return 1 << (width - 1).bit_length()
    return -(-width // lanes) * lanes


class _Block:
    """The unit's chunks of rows on the block of `width` places from p0 (computed as `cw`),
    slice by slice (`stmt`): a slice's activations packed (`_pack`), then each row's entries
    of that slice added to its partial sums (`geo.part`, the unit's slot of the workspace,
    between slices)."""

    def __init__(self, p: SparseProblem, config: SparseConfig, geo: _Rows, width: int,
                 cw: int, p0: L.Expr):
        self.p, self.config, self.geo, self.width, self.cw, self.p0 = \
            p, config, geo, width, cw, p0
        self.splits, self.b = config.splits, geo.b
        self.vec = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        self.jc, self.r, self.lane, self.sl, self.rr = \
            L.Var("jc"), L.Var("r"), L.Var("l"), L.Var("s"), L.Var("rr")
        self.ch = geo.g * geo.per_group + self.jc
        self.j = self.ch * geo.rows + self.rr
        self.packed = p.transposed or config.pack or p.windowed
        self.block = L.Buffer("xt", T.float32, (min(p.slice_depth, p.depth) * cw,),
                              L.Scope.LOCAL)
        self.tile = L.Buffer("tile", T.float32, (geo.rows * width,), L.Scope.LOCAL)
        self.acc = L.Buffer("acc", T.float32, (self.splits * cw,), L.Scope.LOCAL)
        self.first, self.count = L.Var("first"), L.Var("count")
        self.wv, self.col = L.Var("wv", T.float32), L.Var("col")
        self.flag = _Flag(p, geo.window, width, cw, self.b, p0)

    def x_at(self, col: L.Expr) -> L.Expr:
        """The activation of column `col` at the block's place `lane` (packed: a column of
        the slice)."""
        if self.packed:
            return self.block[(col - self.sl * self.p.slice_depth) * self.cw + self.lane]
        return self.p.x_at(self.b, col, self.p0 + self.lane)

    def update(self, entry: L.Expr, s: int) -> L.Stmt:
        """Entry `entry`'s weight times its column's activations added to accumulator set s."""
        p, acc, lane = self.p, self.acc, self.lane
        at = s * self.cw + lane
        return L.Let(self.wv, p.values[entry], L.Let(self.col, _index(p.columns[entry]), L.For(
            lane, self.cw, L.Store(acc, (at,), L.call("fma", self.wv, self.x_at(self.col),
                                                      acc[at])), self.vec)))

    def row(self, start: bool, end: bool, fixing: bool) -> L.Stmt:
        """Row j (row rr of chunk ch) on slice sl's entries: from zero or its partial sums,
        into its partial sums, the chunk's tile or through the epilogue to Y (`fixing`: NaN
        added where a flagged place meets a zero weight, `_Flag.fix`)."""
        p, geo, acc, lane, vec = self.p, self.geo, self.acc, self.lane, self.vec
        splits, cw, width, first, count = self.splits, self.cw, self.width, self.first, \
            self.count
        b, j, r, rr, p0 = self.b, self.j, self.r, self.rr, self.p0
        # (the unit's slots are config.places wide: a narrower last block's too, else its
        # slots would reach into another unit's)
        slot = ((geo.t * geo.per_group + self.jc) * geo.rows + rr) * self.config.places + lane
        init = L.For(lane, splits * cw, L.Store(acc, (lane,), L.const(0.0)), vec)
        if not start:
            init = L.seq(init, L.For(lane, width, L.Store(acc, (lane,), geo.part[slot]), vec))
        whole = count // splits
        main = L.For(r, whole, L.seq(*(self.update(first + r * splits + s, s)
                                       for s in range(splits))))
        tail = L.For(r, count - whole * splits, self.update(first + whole * splits + r, 0))
        if fixing:
            tail = L.seq(tail, self.flag.fix(j, acc, vec))
        total = sum((acc[s * cw + lane] for s in range(1, splits)), acc[lane])
        if not end:
            store = L.Store(geo.part, (slot,), total)
        elif p.transposed:
            store = L.Store(self.tile, (rr * width + lane,), total)
        elif geo.window is not None:
            store = geo.window.store(b, j, p0 + lane, total)
        else:
            store = L.Store(p.y, p.y_at(b, j, p0 + lane), p.finish(total, b, j, p0 + lane))
        return L.Allocate(acc, L.Let(first, _index(p.starts[j, self.sl]), L.Let(
            count, _index(p.starts[j, self.sl + 1]) - first,
            L.seq(self.prefetch(j) if self.config.prefetch else None, init, main, tail,
                  L.For(lane, width, store, vec)))))

    def prefetch(self, j: L.Expr) -> L.Stmt:
        """The cache lines of the entries (values and columns) that row j + PREFETCH_ROWS
        holds in this slice fetched ahead (`L.Prefetch`, a line of LINE_ENTRIES at a time;
        none past the last row)."""
        p, k = self.p, L.Var("k")
        ahead = L.minimum(j + PREFETCH_ROWS, p.rows - 1)
        first, end = L.Var("pf"), L.Var("pe")
        at = L.minimum(first + k * LINE_ENTRIES, end - 1)
        lines = L.For(k, (end - first + 2 * LINE_ENTRIES - 1) // LINE_ENTRIES,
                      L.seq(L.Prefetch(p.values[at]), L.Prefetch(p.columns[at])))
        return L.Let(first, _index(p.starts[ahead, self.sl]), L.Let(
            end, _index(p.starts[ahead, self.sl + 1]), L.If(end > first, lines)))

    def chunk(self, start: bool, end: bool, rows: int, fixing: bool) -> L.Stmt:
        """Chunk ch's first `rows` rows; a SparseDense's tile then stored a row of Y (its
        places' outputs of the chunk's rows) at a time."""
        p, lane, rr, b, p0 = self.p, self.lane, self.rr, self.b, self.p0
        body = L.For(rr, rows, self.row(start, end, fixing))
        if end and p.transposed:
            jv = self.ch * self.geo.rows + rr
            kind = L.ForKind.VECTORIZED if rows >= 2 else L.ForKind.UNROLLED
            out = L.For(lane, self.width, L.For(rr, rows, L.Store(
                p.y, p.y_at(b, jv, p0 + lane), p.finish(self.tile[rr * self.width + lane], b,
                                                        jv, p0 + lane)), kind))
            body = L.Allocate(self.tile, L.seq(body, out))
        return body

    def chunks(self, start: bool, end: bool) -> L.Stmt:
        """The unit's chunks on slice sl, its activations packed first; on the last slice
        (`end`), in a second version with the fix-up for a block with a flagged place."""
        p, geo, flag = self.p, self.geo, self.flag
        last_rows = p.rows - (geo.chunks - 1) * geo.rows

        def rows_of(fixing: bool) -> L.Stmt:
            body = self.chunk(start, end, geo.rows, fixing)
            if last_rows != geo.rows:
                body = L.If(self.ch < geo.chunks - 1, body,
                            self.chunk(start, end, last_rows, fixing))
            if geo.per_group * geo.groups != geo.chunks:
                body = L.If(self.ch < geo.chunks, body)
            return L.For(self.jc, geo.per_group, body)

        stage = rows_of(False)
        if end:   # the rows again with the fix-up, for a block with a flagged place
            stage = L.If(flag.raised, rows_of(True), stage)
            if self.packed:   # every slice packed (this one below): the block's flag
                stage = L.seq(flag.summary, stage)
        args = (self.block, flag.bad, self.width, self.cw, self.p0, self.b, self.sl, self.vec)
        if geo.window is not None:
            stage = L.seq(geo.window.pack(*args), stage)
        elif self.packed:
            stage = L.seq(_pack(p, *args), stage)
        return stage

    def stmt(self) -> L.Stmt:
        """The block's slices: the first from zero, the middle ones between partial sums,
        the last through the epilogue."""
        sl, flag, last = self.sl, self.flag, self.p.slices - 1
        if last == 0:
            stages = L.substitute(self.chunks(True, True), {sl: L.const(0)})
        else:
            middle = L.Var("sm")
            stages = L.seq(L.substitute(self.chunks(True, False), {sl: L.const(0)}),
                           L.For(middle, last - 1, L.substitute(self.chunks(False, False),
                                                               {sl: middle + 1})),
                           L.substitute(self.chunks(False, True), {sl: L.const(last)}))
        stages = L.Allocate(self.block, stages) if self.packed else \
            L.seq(flag.scan(self.vec), flag.summary, stages)
        return flag.around(stages, self.vec)


def _pairwise(terms: list) -> L.Expr:
    """The sum of `terms` added in pairs (a tree of log2 depth): a block's flags summed one
    after another were a chain of `width` dependent adds, 64 x 4 cycles of latency a block of
    a 1x1 conv (NaN wherever a term is NaN, in any order)."""
    while len(terms) > 1:
        terms = [a + b for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) & ~1:]
    return terms[0]


def _nonfinite(x: L.Expr) -> L.Expr:
    """x - x: 0 for a finite x, NaN for a NaN or infinite one."""
    return x - x


class _Flag:
    """A block's non-finite activations (the module's docstring): `bad` [cw] adds x - x
    per place (`flagged` where NaN), `any` [1] its sum, NaN where some place is flagged."""

    def __init__(self, p: SparseProblem, window: "_Window | None", width: int, cw: int, b,
                 p0: L.Expr):
        self.p, self.window, self.width, self.cw, self.b, self.p0 = p, window, width, cw, b, p0
        self.bad = L.Buffer("bad", T.float32, (cw,), L.Scope.LOCAL)
        self.any = L.Buffer("anybad", T.float32, (1,), L.Scope.LOCAL)
        self.counts = L.Buffer("nfc", T.int32, (2,), L.Scope.LOCAL)
        self.nans = L.Buffer("nans", T.float32, (cw,), L.Scope.LOCAL)
        self.raised = L.ne(self.any[0], self.any[0])
        self.summary = L.Store(self.any, (L.const(0),),
                               _pairwise([self.bad[i] for i in range(width)]))

    def around(self, body: L.Stmt, vec) -> L.Stmt:
        lane = L.Var("l")
        zero = L.For(lane, self.cw, L.Store(self.bad, (lane,), L.const(0.0)), vec)
        return L.Allocate(self.bad, L.Allocate(self.any, L.seq(zero, body)))

    def scan(self, vec) -> L.Stmt:
        """The flags of a block whose activations are read in place (not packed)."""
        k, lane = L.Var("k"), L.Var("l")
        return L.For(k, self.p.depth, L.For(lane, self.width, L.Store(
            self.bad, (lane,), self.bad[lane] + _nonfinite(self.at(k, lane))), vec))

    def at(self, col: L.Expr, lane: L.Expr) -> L.Expr:
        """The activation of column `col` at the block's place `lane`, where it is kept."""
        if self.window is not None:
            return self.window.xpad[self.window.start(self.b, col, self.p0) + lane]
        return self.p.x_at(self.b, col, self.p0 + lane)

    def fix(self, j: L.Expr, acc: L.Buffer, vec) -> L.Stmt:
        """For a block with a flagged place: row j's sum of each flagged place made NaN
        if a non-finite activation of that place meets a zero weight of the row, the dense
        product's x * 0: the place's non-finite columns counted, and those among the row's
        entries; fewer of the latter, one has a zero weight (a stored zero's term is in the
        sum already). The NaNs gathered in `nans` [cw] first, then added to acc (the first
        of its accumulator sets) whole vectors at a time: acc indexed by a place alone would
        keep the accumulators out of registers (the 1x1 convs took 1.3-1.6x the time)."""
        p, lane, k, e = self.p, L.Var("l"), L.Var("k"), L.Var("e")
        cnt, nans = self.counts, self.nans

        def count(slot: int, col: L.Expr) -> L.Stmt:
            d = _nonfinite(self.at(col, lane))
            return L.Store(cnt, (L.const(slot),), cnt[slot] + L.Select(
                L.ne(d, d), L.const(1, T.int32), L.const(0, T.int32)))

        last = p.starts.shape[1] - 1
        place = L.seq(
            L.Store(cnt, (L.const(0),), L.const(0, T.int32)),
            L.Store(cnt, (L.const(1),), L.const(0, T.int32)),
            L.For(k, p.depth, count(0, k)),
            L.For(e, _index(p.starts[j, last]) - _index(p.starts[j, 0]),
                  count(1, _index(p.columns[_index(p.starts[j, 0]) + e]))),
            L.If(cnt[1] < cnt[0], L.Store(nans, (lane,), self.bad[lane])))
        flagged = L.ne(self.bad[lane], self.bad[lane])
        zero = L.For(lane, self.cw, L.Store(nans, (lane,), L.const(0.0)), vec)
        gather = L.For(lane, self.width, L.If(flagged, place))
        # over all cw places (those past the width computed, never stored): whole vectors
        add = L.For(lane, self.cw, L.Store(acc, (lane,), acc[lane] + nans[lane]), vec)
        return L.Allocate(cnt, L.Allocate(nans, L.seq(zero, gather, add)))


def _pack(p: SparseProblem, block: L.Buffer, bad: L.Buffer, width: int, cw: int,
          p0: L.Expr, b, sl, vec) -> L.Stmt:
    """Slice sl's activations of the block, [slice columns, cw] contiguous (a SparseDense's
    rows of A transposed), the places past `width` zero; columns past the depth are not
    read."""
    k, lane = L.Var("k"), L.Var("l")
    depth = L.minimum(L.const(p.slice_depth), p.depth - sl * p.slice_depth)
    copy = L.For(lane, width, L.Store(
        block, (k * cw + lane,), p.x_at(b, sl * p.slice_depth + k, p0 + lane)), vec)
    if cw > width:
        copy = L.seq(copy, L.For(lane, cw - width, L.Store(block, (k * cw + width + lane,),
                                                           L.const(0.0)), vec))
    return L.For(k, depth, L.seq(copy, _flag_column(bad, block, k, cw, vec)))


def _flag_column(bad: L.Buffer, block: L.Buffer, k, cw: int, vec) -> L.Stmt:
    """Packed column k's non-finite activations added to the block's flags (`_Flag`), over
    all cw places (those past the width zero): whole vectors."""
    lane = L.Var("l")
    return L.For(lane, cw, L.Store(bad, (lane,), bad[lane] + _nonfinite(
        block[k * cw + lane])), vec)


class _Window:
    """A windowed SparseConv's padded planes and scratch output (workspaces): each image's
    planes copied once into sh x sw phases of the padded plane with zeros around (`around`,
    before the units: phase (py, px) holds padded pixels (i sh + py, j sw + px), [rows, wq]),
    blocks of places q of the phases' flattened grid (q = oy * wq + ox) reading column (c, ky,
    kx) at phase (ky % sh, kx % sw)'s q + (ky // sh) * wq + kx // sw, contiguous in q
    (`pack`); their sums stored to the scratch (`store`), then each output row read back
    through the bias and the epilogue (`around`, after), the columns from ow on dropped: what
    `depthwise._depthwise_flat` does for one channel, and its phases for a stride."""

    def __init__(self, p: SparseProblem):
        self.p = p
        (self.kh, self.kw), (self.top, self.left) = p.kernel, p.begins
        self.sh, self.sw = p.strides
        self.wq = p.phase_width
        oh = p.anchor_dims[2]
        self.channels = p.depth // (self.kh * self.kw)
        self.phases = self.sh * self.sw
        self.rows = oh + (self.kh - 1) // self.sh + 1
        self.plane = self.rows * self.wq + (self.kw - 1) // self.sw + 1   # the last tap's
        self.used = sorted({(ky % self.sh, kx % self.sw) for ky in range(self.kh)
                            for kx in range(self.kw)})
        self.xpad = L.Buffer("xpad", T.float32, (
            p.batch * self.channels * self.phases * self.plane,), L.Scope.GLOBAL)
        self.ysc = L.Buffer("ysc", T.float32, (p.batch * p.rows * p.places,), L.Scope.GLOBAL)

    def start(self, b, col: L.Expr, p0: L.Expr) -> L.Expr:
        """Where column `col` of place p0 lies in the padded planes."""
        c, ky, kx = col // (self.kh * self.kw), (col // self.kw) % self.kh, col % self.kw
        phase = (ky % self.sh) * self.sw + kx % self.sw
        return ((b * self.channels + c) * self.phases + phase) * self.plane + p0 + \
            (ky // self.sh) * self.wq + kx // self.sw

    def pack(self, block: L.Buffer, bad: L.Buffer, width: int, cw: int, p0: L.Expr, b, sl,
             vec) -> L.Stmt:
        """Slice sl's columns of the block, each a run of a phase (and the block's
        non-finite flags, `_Flag`)."""
        p, k, lane = self.p, L.Var("k"), L.Var("l")
        start = self.start(b, sl * p.slice_depth + k, p0)
        copy = L.For(lane, width, L.Store(block, (k * cw + lane,), self.xpad[start + lane]),
                     vec)
        if cw > width:
            copy = L.seq(copy, L.For(lane, cw - width, L.Store(
                block, (k * cw + width + lane,), L.const(0.0)), vec))
        depth = L.minimum(L.const(p.slice_depth), p.depth - sl * p.slice_depth)
        return L.For(k, depth, L.seq(copy, _flag_column(bad, block, k, cw, vec)))

    def store(self, b, j, q, total) -> L.Stmt:
        return L.Store(self.ysc, ((b * self.p.rows + j) * self.p.places + q,), total)

    def _fill(self, nc: L.Var, py: int, px: int) -> L.Stmt:
        """Phase (py, px) of plane nc: zeros, then the image's pixels that fall in it (rows
        i with i sh + py - top inside the image, columns likewise: strided loads)."""
        p = self.p
        h, wid = p.image_hw
        i, j = L.Var("i"), L.Var("j")
        base = (nc * self.phases + py * self.sw + px) * self.plane
        vec = L.ForKind.VECTORIZED
        i0 = max(-(-(self.top - py) // self.sh), 0)
        i1 = min(self.rows, -(-(self.top + h - py) // self.sh))
        j0 = max(-(-(self.left - px) // self.sw), 0)
        j1 = min(self.wq, -(-(self.left + wid - px) // self.sw))
        zero = L.For(i, self.plane, L.Store(self.xpad, (base + i,), L.const(0.0)), vec)
        if i1 <= i0 or j1 <= j0:
            return zero
        copy = L.For(i, i1 - i0, L.For(j, j1 - j0, L.Store(
            self.xpad, (base + (i + i0) * self.wq + j + j0,),
            p.x[nc // self.channels, nc % self.channels, (i + i0) * self.sh + py - self.top,
                (j + j0) * self.sw + px - self.left]), vec))
        return L.seq(zero, copy)

    def around(self, units: L.Stmt, kind: L.ForKind) -> L.Stmt:
        """The planes padded into their phases, `units`, the output rows read back."""
        p = self.p
        _, _, oh, ow = p.anchor_dims
        nc, ix, row = L.Var("nc"), L.Var("ix"), L.Var("row")
        pad = L.For(nc, p.batch * self.channels, L.seq(
            *(self._fill(nc, py, px) for py, px in self.used)), kind)
        n, m, oy = row // (p.rows * oh), (row // oh) % p.rows, row % oh
        value = self.ysc[(n * p.rows + m) * p.places + oy * self.wq + ix]
        index = (n, m, L.const(0), oy * ow + ix) if p.flat_reads else (n, m, oy, ix)
        out = L.For(row, p.batch * p.rows * oh, L.For(ix, ow, L.Store(
            p.y, (n, m, oy, ix), p.finish_at(value, m, index)), L.ForKind.VECTORIZED), kind)
        return L.Allocate(self.xpad, L.Allocate(self.ysc, L.seq(pad, units, out)))


SPARSE = Template("sparse", sparse_product, lambda p: p.x.dtype is T.float32, space, default,
                  build)
