"""The cuda sparse-weights template: SparseDense and 1x1 SparseConv kernels
(`sparse_problems.SparseProblem`) as an unstructured sparse x dense product (SpMM), weights in
CSR rows (one an output), the activations dense, in fp32.

As Sputnik does it (Gale et al., "Sparse GPU Kernels for Deep Learning", SC 2020): C[j, p] =
sum over the entries e of row j of values[e] B[columns[e], p], B the activations [depth,
places] with places contiguous (a 1x1 conv's pixels of one image; a SparseDense's A [m, K]
first transposed into a workspace, `_transpose`, so its m rows are the places). A block takes
`block_rows` rows, one a subwarp of `subwarp` threads, by a tile of `subwarp * vector` places
(`vector` consecutive ones a thread, one 128-bit load of B an entry at vector 4): the rows in
the order of the op's `order` input (the row swizzle: rows sorted by nonzero count at compile
time, so a block's rows, and the blocks running together, carry similar work; without it the
natural order). Each subwarp copies `stage` entries of its row at a time (values and
columns, coalesced) into shared memory, every thread then reads them from there (a broadcast)
for its places; a full stage runs unrolled. The block's loop runs over the most entries any of
its rows holds (uniform: the barriers), each row's own count bounding its products. The bias,
the fused epilogue (activation, residual) and the rounding to Y's type apply where each
output is stored (`SparseProblem.finish`), as the dense templates do.

Skipping a pruned (zero) weight drops its term x * 0, which IEEE makes NaN for a NaN or
infinite x (the dense product's result). A first stage counts each place's non-finite
activations over slices of FLAG_DEPTH columns (`_flags`); a block sums its places' counts
into shared memory, and an output whose place has some makes its sum NaN unless every one of
them meets an entry of its row (its sum is then non-finite already: counted exactly, on
that rare path only), as the llvm template's `_Flag.fix`.

Staged (`SpmmConfig.staged`; the default where STAGED_PLACES says it pays): B's slices of
`slice_depth` columns (the CSR rows' slices, `starts[j, s]`: find_sparsity's GPU_SLICE_DEPTH)
are copied a tile of places at a time into shared memory by the whole block, and each subwarp
runs `row_steps` rows' entries of the slice against it (`_StagedSpmm`): an activation is read
from L2 once a block of `block_rows * row_steps` rows (128 by default: 12.8 entries use it at
90% zeros), not once an entry (the unstaged product's 2.7-4.2 TFLOP/s on an H200 were its L2
reads). A thread's places are runs of 4 (`SpmmConfig.width`: one 128-bit shared load an
entry each; at vector 8 two runs a subwarp's width apart, conflict-free), its rows' entry
ranges of the slice loaded before the staging (their latency hidden behind it). The staging
reads a SparseDense's A directly, 4 columns a thread where the depth allows (`stage_quads`:
a 128-bit load, stores down the slice's columns conflict-free) and flags the places holding
a non-finite activation, so the product is one kernel; an output of a flagged place counts
them over the depth on that rare path.

A windowed SparseConv (kh x kw, padded, strided) runs staged only: its places are its output
pixels (`gathered_product`), and the staging gathers column (c, ky, kx) of each from the
image (`_Operand.window`: zero in the padding), as an implicit GEMM's patches.

Knobs (`SpmmConfig`): subwarp, vector (1, 2, 4; 8 staged), block_rows, stage, staged,
row_steps. The arithmetic is fp32 FMAs with fp32 accumulation; operands are float32
(SparseDense / SparseConv are float32 ops). It never serves a dense product.

2:4 structured weights (Sparse24Dense) are sparse24.py's, on the sparse tensor cores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...errors import ConfigError
from ...ir import loop as L
from ...ir import types as T
from ..sparse_problems import SparseProblem, sparse_product
from ..space import Constraint, Space, Template
from .device import gpu_of

FLAG_DEPTH = 64
"""Columns whose non-finite activations one thread of `_flags` counts (per place): the
blocks then sum depth / FLAG_DEPTH counts per place, a sixth of a 90%-sparse row's work."""
TRANSPOSE_TILE = 32
TRANSPOSE_THREADS = 256
FLAG_THREADS = 256
MAX_GRID_YZ = 65535
MAX_SHARED_BYTES = 48 << 10
BLOCK_THREADS = 128
"""Threads a block of the default config aims for (4 warps), halved while the blocks
cannot fill the GPU twice over (`default`)."""
STAGE = 32
ENTRY_UNROLL = 4
"""Entries of a row a staged product's loop runs unrolled (their values', columns' and B's
loads issued together: the trip count is the row's, unknown to the compiler)."""
STAGED_PLACES = (512, 2048)
"""The places (an image's pixels; a SparseDense's rows of A) from which B is staged by
default: 512 where the depth is at most STAGED_SHALLOW, 2048 up to STAGED_DEEP; else the
unstaged product. Fitted (bench/gpu_sparse.py, H200, 90% zeros, session 54): staged won on
BERT-base's 768-deep products at batch 32 (4096 places) and resnet50's 1x1 convs of depth
64-256 at 784 and 3136 places (1.05-1.60x dense, against 0.70-1.23 unstaged), lost on
512-deep ones at 784 places, every 196- and 49-place layer (a tile of 32 or 64 half empty)
and 3072-deep BERT (0.71 against 0.93 unstaged)."""
STAGED_SHALLOW = 256
STAGED_DEEP = 1024
STAGED_ROWS = 128
"""Rows a block of the default staged config (256 threads, subwarps of 8): an activation
staged once serves 12.8 entries at 90% zeros (session 40's 32 rows served 3.2, and its
staging, not its multiply-adds, bounded it); fewer where the layer has fewer rows."""
WIDE_TILE_BLOCKS = 4
"""Blocks per SM from which the default staged config takes 8 places a thread (a tile of
64, two 128-bit loads an entry) over 4 (a tile of 32): the wider tile won where it left
many waves (BERT's 768->3072 at batch 32: 1536 blocks, 1.09x against 1.00; 1x1 256->64 at
3136 places) and lost where it left one and a half (768->768: 384 blocks, 0.89x)."""
MAX_SUMS = 32
"""Sums (registers) a thread of the staged product keeps."""
WINDOW_ROWS = 64
"""Rows of a windowed conv's default block: a gathered activation costs ~25 instructions
(its (c, ky, kx) and pixel decoded, bounds tested), 8 an entry-use at 32 rows and 10% of
weights, the multiply-add ~3: twice the rows halves that (rows' sums: 32 registers)."""


@dataclass(frozen=True)
class SpmmConfig:
    subwarp: int = 32     # threads sharing a row (its places split over them)
    vector: int = 4       # places a thread (runs of up to 4: one vector load of B each)
    block_rows: int = 4   # subwarps a block (each a row at a time)
    stage: int = 32       # entries of a row copied to shared memory at a time (B not staged)
    staged: bool = False  # B's slices staged in shared memory, a block's rows reading them
    row_steps: int = 1    # rows a subwarp takes in turn (staged)

    @property
    def threads(self) -> int:
        return self.subwarp * self.block_rows

    @property
    def width(self) -> int:
        """Places of one vector access of B (a 128-bit load at 4): a thread's `vector`
        places are runs of `width`, a subwarp's runs side by side (8 places a thread are two
        runs of 4 a tile's half apart: each load conflict-free, as a 4-place thread's)."""
        return min(self.vector, 4)

    def slot(self, lane: L.Expr, v: L.Expr) -> L.Expr:
        """The tile's place (0 .. tile - 1) of the thread's v-th place."""
        if self.vector == self.width:
            return lane * self.vector + v
        return v // self.width * (self.subwarp * self.width) + lane * self.width + \
            v % self.width

    @property
    def tile(self) -> int:
        """Places a block computes."""
        return self.subwarp * self.vector

    @property
    def block_span(self) -> int:
        """Rows a block computes."""
        return self.block_rows * self.row_steps

    @property
    def stride(self) -> int:
        """Floats between a staged slice's columns in shared memory: the tile and 4 (a
        SparseDense's A staged column by column: 4-way bank conflicts on the stores, not
        32; the vector loads stay 16-byte aligned)."""
        return self.tile + 4


def _staged_floats(c: SpmmConfig, p: SparseProblem) -> int:
    """The staged slice's floats, or a SparseDense's block of sums if more (`write_out`)."""
    out = c.tile * (c.block_span + 1) if p.transposed else 0
    return max(p.slice_depth * c.stride, out)


def _shared_bytes(c: SpmmConfig, p: SparseProblem) -> int:
    if c.staged:
        return _staged_floats(c, p) * 4 + c.tile * 4
    return c.block_rows * c.stage * 8 + c.tile * 4


def space(p: SparseProblem, machine) -> Space:
    return Space("cuda_spmm", SpmmConfig, {
        "subwarp": (4, 8, 16, 32), "vector": (1, 2, 4, 8), "block_rows": (1, 2, 4, 8, 16, 32),
        "stage": (16, 32, 64, 128), "staged": (False, True), "row_steps": (1, 2, 4, 8, 16),
    }, [Constraint("32 <= subwarp * block_rows <= 1024 threads",
                   lambda c: 32 <= c.threads <= 1024),
        Constraint("stage a multiple of subwarp (each thread copies whole rounds)",
                   lambda c: c.stage % c.subwarp == 0),
        Constraint(f"vector divides the places ({p.places}): B's vector loads stay aligned "
                   f"and inside", lambda c: p.places % c.vector == 0),
        Constraint("staged B, or entries, and place counts within 48 KiB (static shared "
                   "memory)", lambda c: _shared_bytes(c, p) <= MAX_SHARED_BYTES),
        Constraint("one row a subwarp unless B is staged; staged, the stage knob unused "
                   "(at its default)",
                   lambda c: c.row_steps == 1 if not c.staged else c.stage == STAGE),
        Constraint(f"at most {MAX_SUMS} sums a thread (row_steps * vector)",
                   lambda c: c.row_steps * c.vector <= MAX_SUMS),
        Constraint("vector 8 staged, its tile dividing the places (a thread's two runs of "
                   "places inside together)",
                   lambda c: c.vector < 8 or c.staged and p.places % c.tile == 0),
        Constraint("a windowed conv's B staged (only the staging gathers its windows)",
                   lambda c: c.staged or not p.windowed),
        Constraint("row groups and images within the grid's y and z",
                   lambda c: -(-p.rows // c.block_span) <= MAX_GRID_YZ and
                   p.batch <= MAX_GRID_YZ)])


def default(p: SparseProblem, machine) -> SpmmConfig:
    """B staged where it pays (`_staged_default`; a windowed conv always); else the widest
    vector dividing the places, a subwarp as wide as the places need (4 to 32),
    BLOCK_THREADS threads, fewer rows a block while the blocks are under two per SM."""
    vector = next(v for v in (4, 2, 1) if p.places % v == 0)
    sms = gpu_of(machine).sms
    staged = _staged_default(p, vector, sms)
    if staged is not None:
        return staged
    lanes = -(-p.places // vector)
    subwarp = min(32, max(4, 1 << (lanes - 1).bit_length()))
    rows = max(1, BLOCK_THREADS // subwarp)
    tiles = -(-p.places // (subwarp * vector))
    while rows > 1 and (rows // 2) * subwarp >= 32 and \
            p.batch * tiles * -(-p.rows // rows) < 2 * sms:
        rows //= 2
    while -(-p.rows // rows) > MAX_GRID_YZ:
        rows *= 2
    return SpmmConfig(subwarp, vector, rows, max(STAGE, subwarp))


def _staged_default(p: SparseProblem, vector: int, sms: int) -> SpmmConfig | None:
    """A product's or 1x1 conv's staged config where STAGED_PLACES says staging pays:
    subwarps of 8, 256 threads, STAGED_ROWS rows a block (fewer for fewer rows), 8 places a
    thread where WIDE_TILE_BLOCKS says so, else 4. A windowed conv's: the widest subwarp (32
    to 8) whose staged slice fits in shared memory, BLOCK_THREADS threads, WINDOW_ROWS rows a
    block (32 where it has fewer). None where none is in the space."""
    if p.windowed:
        span = WINDOW_ROWS if p.rows >= WINDOW_ROWS else 32
        for subwarp in (32, 16, 8):
            rows = BLOCK_THREADS // subwarp
            c = SpmmConfig(subwarp, vector, rows, STAGE, True, max(1, span // rows))
            if _in_space(c, p):
                return c
        return None
    shallow, deep = STAGED_PLACES
    if p.places < shallow or p.depth > STAGED_DEEP or \
            p.depth > STAGED_SHALLOW and p.places < deep:
        return None
    steps = min(STAGED_ROWS // 32, max(1, 1 << (-(-p.rows // 32) - 1).bit_length()))
    wide = SpmmConfig(8, 8, 32, STAGE, True, steps)
    blocks = p.batch * -(-p.places // wide.tile) * -(-p.rows // wide.block_span)
    if p.depth >= STAGED_SHALLOW and blocks >= WIDE_TILE_BLOCKS * sms and _in_space(wide, p):
        return wide
    c = SpmmConfig(8, 4, 32, STAGE, True, steps)
    return c if _in_space(c, p) else None


def _in_space(c: SpmmConfig, p: SparseProblem) -> bool:
    try:
        space(p, None).check(c)
    except ConfigError:
        return False
    return True


def applies(p: SparseProblem) -> bool:
    """float32; a windowed conv only where a staged config fits (its slices' depth)."""
    return p.x.dtype is T.float32 and p.batch <= MAX_GRID_YZ and \
        (not p.windowed or _staged_default(p, 1, 0) is not None)


def gathered_product(kernel) -> SparseProblem | None:
    """`sparse_product`'s problem as this template reads it: a windowed SparseConv's places
    its output pixels (oy OW + ox; Y viewed [N, M, OH OW]), its columns (c, ky, kx)
    gathered from the image by `_Operand.at` (no padded planes: the staging gathers)."""
    p = sparse_product(kernel)
    if p is None or not p.windowed:
        return p
    oh, ow = p.anchor_dims[2:]
    return replace(p, places=oh * ow, y=L.Buffer(p.y.name, p.y.dtype, (p.batch, p.rows,
                                                                      oh * ow)))


def _index(e: L.Expr) -> L.Expr:
    return L.Cast(T.int64, e)


def _nonfinite(x: L.Expr) -> L.Expr:
    """1 (int32) where x is NaN or infinite (x - x is NaN), else 0."""
    d = x - x
    return L.Select(L.ne(d, d), L.const(1, T.int32), L.const(0, T.int32))


class _Operand:
    """B as the SpMM reads it: `at(b, column, place)`, from A transposed into a workspace
    (SparseDense, `workspace`), A itself (SparseDense, B staged: the staging transposes) or
    the image itself (SparseConv)."""

    def __init__(self, p: SparseProblem, workspace: bool):
        self.p = p
        self.xt = L.Buffer("spmm_xt", T.float32, (p.depth * p.places,), L.Scope.GLOBAL) \
            if p.transposed and workspace else None

    def at(self, b, col, place) -> L.Expr:
        if self.xt is not None:
            return self.xt[col * self.p.places + place]
        if self.p.windowed:
            return self.window(b, col, place)
        return self.p.x_at(b, col, place)

    def window(self, b, col, place) -> L.Expr:
        """A windowed SparseConv's column (c, ky, kx) at output pixel `place`: the image's
        pixel under the window, 0 in the padding (indices clamped: both sides are read)."""
        p = self.p
        (kh, kw), (sh, sw), (top, left) = p.kernel, p.strides, p.begins
        (h, w), ow = p.image_hw, p.anchor_dims[3]
        iy = place // ow * sh + col // kw % kh - top
        ix = place % ow * sw + col % kw - left
        inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < w)
        clamp = lambda i, n: L.maximum(L.minimum(i, n - 1), 0)   # noqa: E731
        return L.Select(inside, p.x[b, col // (kh * kw), clamp(iy, h), clamp(ix, w)],
                        L.const(0.0))


def _transpose(p: SparseProblem, xt: L.Buffer) -> L.Stmt:
    """xt[k, i] = A[i, k] through 32 x 33 shared tiles (coalesced both ways)."""
    n = TRANSPOSE_TILE
    t, bp, bk, i = L.Var("tt"), L.Var("tpb"), L.Var("tkb"), L.Var("ti")
    tile = L.Buffer("xt_tile", T.float32, (n * (n + 1),), L.Scope.SHARED)
    rows = TRANSPOSE_THREADS // n
    ty, tx = t // n, t % n

    def phase(body):
        return L.For(t, TRANSPOSE_THREADS, L.For(i, n // rows, body, L.ForKind.UNROLLED),
                     L.ForKind.THREAD_X)

    place, k = bp * n + ty + i * rows, bk * n + tx
    load = phase(L.If(L.logical_and(place < p.places, k < p.depth), L.Store(
        tile, ((ty + i * rows) * (n + 1) + tx,), p.x[place, k])))
    kk, place2 = bk * n + ty + i * rows, bp * n + tx
    store = phase(L.If(L.logical_and(kk < p.depth, place2 < p.places), L.Store(
        xt, (kk * p.places + place2,), tile[tx * (n + 1) + ty + i * rows])))
    body = L.Allocate(tile, L.seq(load, L.Barrier(), store))
    return L.For(bk, -(-p.depth // n), L.For(bp, -(-p.places // n), body, L.ForKind.BLOCK_X),
                 L.ForKind.BLOCK_Y)


def _flags(p: SparseProblem, b_op: _Operand, part: L.Buffer) -> L.Stmt:
    """part[b, kc, place] = the non-finite activations of `place` among columns kc
    FLAG_DEPTH .. (kc + 1) FLAG_DEPTH - 1, a thread each (consecutive threads, consecutive
    places: coalesced)."""
    slices = -(-p.depth // FLAG_DEPTH)
    total = p.batch * slices * p.places
    ob, ot, e, c = L.Var("fb"), L.Var("ft"), L.Var("fe"), L.Var("fc")
    count = L.Buffer("nf_count", T.int32, (1,), L.Scope.LOCAL)
    b, kc, place = e // (slices * p.places), e // p.places % slices, e % p.places
    col = kc * FLAG_DEPTH + c
    add = L.Store(count, (L.const(0),), count[0] + _nonfinite(b_op.at(b, col, place)))
    if p.depth % FLAG_DEPTH:
        add = L.If(col < p.depth, add)
    body = L.Allocate(count, L.seq(
        L.Store(count, (L.const(0),), L.const(0, T.int32)),
        L.For(c, FLAG_DEPTH, add, L.ForKind.UNROLLED),
        L.Store(part, (e,), count[0])))
    return L.For(ob, -(-total // FLAG_THREADS), L.For(ot, FLAG_THREADS, L.Let(
        e, ob * FLAG_THREADS + ot, L.If(e < total, body)), L.ForKind.THREAD_X),
        L.ForKind.BLOCK_X)


class _Spmm:
    """The product's stage (the module's docstring): its block's phases, each over every
    thread, barriers between them."""

    def __init__(self, p: SparseProblem, c: SpmmConfig, b_op: _Operand, part: L.Buffer):
        self.p, self.c, self.b_op, self.part = p, c, b_op, part
        self.bx, self.by, self.bz = L.Var("sbx"), L.Var("sby"), L.Var("sbz")
        self.t, self.r, self.lane = L.Var("st"), L.Var("sr"), L.Var("sl")
        self.sv = L.Buffer("spmm_values", T.float32, (c.block_rows * c.stage,),
                           L.Scope.SHARED)
        self.sc = L.Buffer("spmm_columns", T.int32, (c.block_rows * c.stage,),
                           L.Scope.SHARED)
        self.nfs = L.Buffer("spmm_nonfinite", T.int32, (c.tile,), L.Scope.SHARED)
        self.acc = L.Buffer("acc", T.float32, (c.vector,), L.Scope.LOCAL)
        self.xr = L.Buffer("b_vec", T.float32, (c.vector,), L.Scope.LOCAL)
        # the thread's row: (j, first entry, end); the block's most entries a row
        self.row = L.Buffer("row_of", T.int32, (3,), L.Scope.LOCAL)
        self.most = L.Buffer("most", T.int32, (1,), L.Scope.LOCAL)
        self.count = L.Buffer("nf_row", T.int32, (1,), L.Scope.LOCAL)
        self.last = p.starts.shape[1].value - 1

    def per_thread(self, body: L.Stmt) -> L.Stmt:
        c = self.c
        return L.For(self.t, c.threads, L.Let(self.r, self.t // c.subwarp, L.Let(
            self.lane, self.t % c.subwarp, body)), L.ForKind.THREAD_X)

    def place(self) -> L.Expr:
        """The thread's first place."""
        return self.bx * self.c.tile + self.lane * self.c.vector

    def row_at(self, q: L.Expr) -> L.Expr:
        """The row at position q of the swizzled order (q clamped to the rows)."""
        q = L.minimum(q, self.p.rows - 1)
        return _index(self.p.order[q]) if self.p.order is not None else q

    def entries(self, j: L.Expr) -> tuple[L.Expr, L.Expr]:
        return _index(self.p.starts[j, 0]), _index(self.p.starts[j, self.last])

    def setup(self) -> L.Stmt:
        """Each thread's row and the block's most entries, zero sums; the block's places'
        non-finite counts summed into shared memory."""
        p, c = self.p, self.c
        q = self.by * c.block_rows + self.r
        j, i = L.Var("sj"), L.Var("si")
        first, end = self.entries(j)
        valid = q < p.rows
        row = L.Let(j, self.row_at(q), L.seq(
            L.Store(self.row, (L.const(0),), L.Cast(T.int32, j)),
            L.Store(self.row, (L.const(1),), L.Select(valid, L.Cast(T.int32, first),
                                                      L.const(0, T.int32))),
            L.Store(self.row, (L.const(2),), L.Select(valid, L.Cast(T.int32, end),
                                                      L.const(0, T.int32)))))
        jm = L.Var("sjm")
        f2, e2 = self.entries(jm)
        most = L.seq(L.Store(self.most, (L.const(0),), L.const(0, T.int32)), L.For(
            i, c.block_rows, L.If(self.by * c.block_rows + i < p.rows, L.Let(
                jm, self.row_at(self.by * c.block_rows + i), L.Store(
                    self.most, (L.const(0),), L.maximum(self.most[0], L.Cast(
                        T.int32, e2 - f2)))))))
        v = L.Var("sv0")
        zero = L.For(v, c.vector, L.Store(self.acc, (v,), L.const(0.0)), L.ForKind.UNROLLED)
        return L.seq(self.per_thread(L.seq(row, most, zero)), self._nonfinite_counts(),
                     L.Barrier())

    def _nonfinite_counts(self) -> L.Stmt:
        p, c = self.p, self.c
        slices = -(-p.depth // FLAG_DEPTH)
        rounds = -(-c.tile // c.threads)
        i, kc = L.Var("sni"), L.Var("snk")
        slot = i * c.threads + self.t
        place = self.bx * c.tile + slot
        total = L.seq(L.Store(self.count, (L.const(0),), L.const(0, T.int32)), L.For(
            kc, slices, L.Store(self.count, (L.const(0),), self.count[0] + self.part[
                (self.bz * slices + kc) * p.places + place]), L.ForKind.UNROLLED))
        body = L.If(place < p.places, L.seq(total, L.Store(self.nfs, (slot,), self.count[0])),
                    L.Store(self.nfs, (slot,), L.const(0, T.int32)))
        if rounds * c.threads > c.tile:
            body = L.If(slot < c.tile, body)
        return L.For(self.t, c.threads, L.For(i, rounds, body, L.ForKind.UNROLLED),
                     L.ForKind.THREAD_X)

    def copy(self, ch: L.Expr) -> L.Stmt:
        """Stage ch of each row's entries into shared memory (a subwarp's threads take
        consecutive entries)."""
        c = self.c
        i = L.Var("sci")
        slot = i * c.subwarp + self.lane
        e = _index(self.row[1]) + ch * c.stage + slot
        at = (self.r * c.stage + slot,)
        return self.per_thread(L.For(i, c.stage // c.subwarp, L.If(
            e < _index(self.row[2]), L.seq(L.Store(self.sv, at, self.p.values[e]),
                                           L.Store(self.sc, at, self.p.columns[e]))),
            L.ForKind.UNROLLED))

    def multiply(self, ch: L.Expr) -> L.Stmt:
        """Each thread's places times the staged entries of its row (all of a full stage
        unrolled, else as many as the row has left)."""
        p, c = self.p, self.c
        i, v, w, col = L.Var("smi"), L.Var("smv"), L.Var("smw", T.float32), L.Var("smc")
        slot = self.r * c.stage + i
        place = self.place()
        step = L.Let(w, self.sv[slot], L.Let(col, _index(self.sc[slot]), L.seq(
            L.For(v, c.vector, L.Store(self.xr, (v,), self.b_op.at(self.bz, col, place + v)),
                  L.ForKind.VECTORIZED),
            L.For(v, c.vector, L.Store(self.acc, (v,), L.call(
                "fma", w, self.xr[v], self.acc[v])), L.ForKind.UNROLLED))))
        left = _index(self.row[2]) - _index(self.row[1]) - ch * c.stage
        body = L.If(left >= c.stage, L.For(i, c.stage, step, L.ForKind.UNROLLED),
                    L.For(i, L.maximum(left, 0), step))
        if p.places % c.tile:
            body = L.If(place < p.places, body)
        return self.per_thread(body)

    def finish(self) -> L.Stmt:
        """Each output through `store`; the thread's row from `setup`."""
        p, c = self.p, self.c
        inside = self.by * c.block_rows + self.r < p.rows
        if p.places % c.tile:
            inside = L.logical_and(inside, self.place() < p.places)
        return self.per_thread(L.If(inside, self.store(
            _index(self.row[0]), _index(self.row[1]), _index(self.row[2]), 0)))

    def store(self, j: L.Expr, first: L.Expr, end: L.Expr, at: int) -> L.Stmt:
        """Row j's outputs of the thread (its entries first .. end - 1; its sums from acc[at]
        on): NaN where its place's non-finite activations meet a pruned weight (the module's
        docstring), then through the bias and epilogue to Y."""
        p, c = self.p, self.c
        v, e, nf = L.Var("sfv"), L.Var("sfe"), L.Var("sfn", T.int32)
        place = self.bx * c.tile + c.slot(self.lane, v)
        s = self.acc[at + v]
        nan = L.Store(self.acc, (at + v,), L.const(float("nan")))
        counted, total = self.nonfinite_total(place, nf)
        recount = L.seq(
            counted, L.Store(self.count, (L.const(0),), L.const(0, T.int32)),
            L.For(e, end - first, L.Store(self.count, (L.const(0),), self.count[
                0] + _nonfinite(self.b_op.at(self.bz, _index(p.columns[first + e]), place)))),
            L.If(self.count[0] < total, nan))
        fix = L.If(nf > 0, L.If(L.eq(s - s, s - s), nan, recount))
        b = self.bz if not p.transposed else L.const(0)
        store = self.out(j, v, at) if self.out is not None else \
            L.Store(p.y, p.y_at(b, j, place), p.finish(self.acc[at + v], b, j, place))
        return L.For(v, c.vector, L.Let(nf, self.nfs[c.slot(self.lane, v)],
                                        L.seq(fix, store)), L.ForKind.UNROLLED)

    out = None
    """(j, v, at) -> the statement keeping sum acc[at + v] for a later store (None: `store`
    stores it to Y)."""

    def nonfinite_total(self, place: L.Expr, nf: L.Expr) -> tuple[L.Stmt, L.Expr]:
        """(what counts them, the count) of the non-finite activations of `place`, on the
        rare path: `nf`, the block's count."""
        return L.seq(), nf

    def build(self) -> L.Stmt:
        p, c = self.p, self.c
        ch = L.Var("sch")
        chunks = (_index(self.most[0]) + (c.stage - 1)) // c.stage
        body = L.seq(self.setup(), L.For(ch, chunks, L.seq(
            self.copy(ch), L.Barrier(), self.multiply(ch), L.Barrier())), self.finish())
        for buffer in (self.sv, self.sc, self.nfs, self.acc, self.xr, self.row, self.most,
                       self.count):
            body = L.Allocate(buffer, body)
        return L.For(self.bz, p.batch, L.For(self.by, -(-p.rows // c.block_rows), L.For(
            self.bx, -(-p.places // c.tile), body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y),
            L.ForKind.BLOCK_Z)


class _StagedSpmm(_Spmm):
    """The product with B staged (`SpmmConfig.staged`): for each slice of `slice_depth`
    columns, the block copies B's [slice, tile] into shared memory (`stage_b`), then each
    subwarp runs its `row_steps` rows' entries of that slice (`starts[j, s]` ..) against it
    (`multiply_slice`): an activation read from L2 once a block serves its `block_span`
    rows, where the unstaged product reads it from L2 (or L1) once an entry."""

    def __init__(self, p: SparseProblem, c: SpmmConfig, b_op: _Operand, part: L.Buffer):
        super().__init__(p, c, b_op, part)
        self.sb = L.Buffer("spmm_b", T.float32, (_staged_floats(c, p),), L.Scope.SHARED)
        if p.transposed:
            self.out = self.keep
        self.acc = L.Buffer("acc", T.float32, (c.row_steps * c.vector,), L.Scope.LOCAL)
        self.row = L.Buffer("row_of", T.int32, (c.row_steps,), L.Scope.LOCAL)
        self.total = L.Buffer("nf_total", T.int32, (1,), L.Scope.LOCAL)
        # each row's entries of the slice (first, end), loaded before the staging: their
        # latency hides behind it, not in front of the row's first multiply-add
        self.bounds = L.Buffer("row_bounds", T.int32, (2 * c.row_steps,), L.Scope.LOCAL)
        self.quad = L.Buffer("a_quad", T.float32, (4,), L.Scope.LOCAL)

    def row_at(self, q: L.Expr) -> L.Expr:
        """A SparseDense's rows in their natural order (a block's rows are a run of Y's
        columns: `write_out`), an image's swizzled."""
        return super().row_at(q) if not self.p.transposed else L.minimum(q, self.p.rows - 1)

    def keep(self, j: L.Expr, v: L.Expr, at) -> L.Stmt:
        """A SparseDense's sum into shared memory at (its place, its row) of the block."""
        c = self.c
        row = at // c.vector * c.block_rows + self.r
        return L.Store(self.sb, (c.slot(self.lane, v) * (c.block_span + 1) + row,),
                       self.acc[at + v])

    def write_out(self) -> L.Stmt:
        """Y[place, j] of the block's kept sums through the bias and epilogue, consecutive
        threads storing consecutive j of a place (coalesced; from `out`: a thread's own
        rows are 8 to 64 columns of Y apart, each store a sector)."""
        p, c = self.p, self.c
        span, i = c.block_span, L.Var("swi")
        idx = i * c.threads + self.t
        row, pl = idx % span, idx // span
        j, place = self.by * span + row, self.bx * c.tile + pl
        body = L.If(L.logical_and(j < p.rows, place < p.places), L.Store(
            p.y, p.y_at(L.const(0), j, place), p.finish(self.sb[pl * (span + 1) + row],
                                                          L.const(0), j, place)))
        rounds = -(-(span * c.tile) // c.threads)
        if rounds * c.threads > span * c.tile:
            body = L.If(idx < span * c.tile, body)
        return L.For(self.t, c.threads, L.For(i, rounds, body, L.ForKind.UNROLLED),
                     L.ForKind.THREAD_X)

    def position(self, step) -> L.Expr:
        """The position (in the swizzled order) of the thread's row of step `step`."""
        c = self.c
        return self.by * c.block_span + step * c.block_rows + self.r

    def setup(self) -> L.Stmt:
        """The thread's rows, zero sums, no place flagged."""
        c = self.c
        i, v, f = L.Var("ssi"), L.Var("ssv"), L.Var("ssf")
        rows = L.For(i, c.row_steps, L.Store(self.row, (i,), L.Cast(
            T.int32, self.row_at(self.position(i)))), L.ForKind.UNROLLED)
        zero = L.For(v, c.row_steps * c.vector, L.Store(self.acc, (v,), L.const(0.0)),
                     L.ForKind.UNROLLED)
        rounds = -(-c.tile // c.threads)
        slot = f * c.threads + self.t
        clear = L.Store(self.nfs, (slot,), L.const(0, T.int32))
        if rounds * c.threads > c.tile:
            clear = L.If(slot < c.tile, clear)
        return self.per_thread(L.seq(rows, zero, L.For(f, rounds, clear, L.ForKind.UNROLLED)))

    def stage_b(self, s: L.Expr) -> L.Stmt:
        """sb[k, place] = B[s slice_depth + k, the tile's place] (zero past the depth or the
        places): an image's places vector by vector (consecutive threads, consecutive
        places), a windowed conv's one by one (gathered), A's columns one by one
        (consecutive threads, consecutive columns of a row of A: coalesced, the transpose
        done by the stores)."""
        p, c = self.p, self.c
        sd, i, v = p.slice_depth, L.Var("sgi"), L.Var("sgv")
        idx = i * c.threads + self.t
        if self.quads:
            return self.stage_quads(s)
        if p.transposed:
            width, total = 1, sd * c.tile
            k, pl = idx % sd, idx // sd
        elif p.windowed:   # gathered a pixel at a time, consecutive threads along ox
            width, total = 1, sd * c.tile
            k, pl = idx // c.tile, idx % c.tile
        else:
            width, total = c.width, sd * (c.tile // c.width)
            k, pl = idx // (c.tile // c.width), idx % (c.tile // c.width) * c.width
        col, place = s * sd + k, self.bx * c.tile + pl
        at = k * c.stride + pl
        copy = L.seq(
            L.For(v, width, L.Store(self.sb, (at + v,), self.b_op.at(self.bz, col, place + v)),
                  L.ForKind.VECTORIZED),
            # a place's flag, set by any thread staging a non-finite activation of it (the
            # same value stored by all: no race); `nonfinite_total` counts them if needed
            L.For(v, width, L.If(L.ne(_nonfinite(self.sb[at + v]), 0), L.Store(
                self.nfs, (pl + v,), L.const(1, T.int32))), L.ForKind.UNROLLED))
        zero = L.For(v, width, L.Store(self.sb, (at + v,), L.const(0.0)), L.ForKind.VECTORIZED)
        body = L.If(L.logical_and(col < p.depth, place < p.places), copy, zero)
        return self._over_threads(i, idx, total, body)

    def _over_threads(self, i: L.Var, idx: L.Expr, total, body: L.Stmt) -> L.Stmt:
        """`body` for every `idx` (= i * threads + t) below `total`: the block's threads
        take `rounds` of it each, unrolled, the last round guarded where it runs past."""
        threads = self.c.threads
        rounds = -(-total // threads)
        if rounds * threads > total:
            body = L.If(idx < total, body)
        return L.For(self.t, threads, L.For(i, rounds, body, L.ForKind.UNROLLED),
                     L.ForKind.THREAD_X)

    @property
    def quads(self) -> bool:
        """A SparseDense's A staged 4 columns a thread (`stage_quads`): its depth and
        slices in whole 128-bit loads."""
        return self.p.transposed and self.p.depth % 4 == 0 and self.p.slice_depth % 4 == 0

    def stage_quads(self, s: L.Expr) -> L.Stmt:
        """`stage_b` for a SparseDense of `quads`: a thread loads 4 columns of a row of A
        (one 128-bit load) and stores them down a column of the slice, consecutive threads
        consecutive places (conflict-free stores; one column a thread, consecutive threads
        consecutive columns, stored 4 (+ 4) floats apart: 8-way bank conflicts)."""
        p, c = self.p, self.c
        sd, i, v = p.slice_depth, L.Var("sgi"), L.Var("sgv")
        idx = i * c.threads + self.t
        total = sd // 4 * c.tile
        kq, pl = idx // c.tile, idx % c.tile
        col, place = s * sd + kq * 4, self.bx * c.tile + pl
        at = kq * 4 * c.stride + pl
        copy = L.seq(
            L.For(v, 4, L.Store(self.quad, (v,), p.x[place, col + v]), L.ForKind.VECTORIZED),
            L.For(v, 4, L.Store(self.sb, (at + v * c.stride,), self.quad[v]),
                  L.ForKind.UNROLLED),
            # a place's flag, as `stage_b`'s (the same value stored by all: no race)
            L.For(v, 4, L.If(L.ne(_nonfinite(self.quad[v]), 0), L.Store(
                self.nfs, (pl,), L.const(1, T.int32))), L.ForKind.UNROLLED))
        zero = L.For(v, 4, L.Store(self.sb, (at + v * c.stride,), L.const(0.0)),
                     L.ForKind.UNROLLED)
        body = L.If(L.logical_and(col < p.depth, place < p.places), copy, zero)
        return self._over_threads(i, idx, total, body)

    def load_bounds(self, s: L.Expr) -> L.Stmt:
        """Each thread's rows' (first, end) entries of slice s into `bounds` (an empty
        range for a row past the last)."""
        p, c = self.p, self.c
        i, j = L.Var("sbi"), L.Var("sbj")
        inside = self.position(i) < p.rows
        return self.per_thread(L.For(i, c.row_steps, L.Let(j, _index(self.row[i]), L.seq(
            L.Store(self.bounds, (2 * i,), L.Select(inside, p.starts[j, s],
                                                    L.const(0, T.int32))),
            L.Store(self.bounds, (2 * i + 1,), L.Select(inside, p.starts[j, s + 1],
                                                        L.const(0, T.int32))))),
            L.ForKind.UNROLLED))

    def multiply_slice(self, s: L.Expr) -> L.Stmt:
        """Each thread's rows' entries of slice s times its places of the staged slice,
        ENTRY_UNROLL at a time (their loads in flight together) and the rest one by one;
        a thread's places in runs of `width` (one vector load of the slice each)."""
        p, c = self.p, self.c
        i, q, u, r, v = L.Var("smi"), L.Var("smq"), L.Var("smu"), L.Var("smr"), L.Var("smv")
        first, end = L.Var("smf", T.int32), L.Var("smn", T.int32)
        runs, width = c.vector // c.width, c.width

        def step(e: L.Expr, tag: str) -> L.Stmt:
            w, col = L.Var(f"smw{tag}", T.float32), L.Var(f"smc{tag}", T.int32)
            e = first + L.Cast(T.int32, e)
            base = (col - L.Cast(T.int32, s) * p.slice_depth) * c.stride + \
                L.Cast(T.int32, self.lane) * width
            loads = [L.For(v, width, L.Store(self.xr, (h * width + v,), self.sb[
                base + h * (c.subwarp * width) + L.Cast(T.int32, v)]), L.ForKind.VECTORIZED)
                for h in range(runs)]
            return L.Let(w, p.values[e], L.Let(col, p.columns[e], L.seq(*loads, L.For(
                v, c.vector, L.Store(self.acc, (i * c.vector + v,), L.call(
                    "fma", w, self.xr[v], self.acc[i * c.vector + v])), L.ForKind.UNROLLED))))

        n, k = _index(end - first), ENTRY_UNROLL
        entries = L.seq(
            L.For(q, n // k, L.For(u, k, step(q * k + u, "q"), L.ForKind.UNROLLED)),
            L.For(r, n - n // k * k, step(n // k * k + r, "r")))
        row = L.Let(first, self.bounds[2 * i], L.Let(end, self.bounds[2 * i + 1], entries))
        return self.per_thread(L.For(i, c.row_steps, row, L.ForKind.UNROLLED))

    def nonfinite_total(self, place: L.Expr, nf: L.Expr) -> tuple[L.Stmt, L.Expr]:
        """The place's non-finite activations counted over the whole depth (`nf` only
        flags the place: the rare path)."""
        k = L.Var("snt")
        return L.seq(L.Store(self.total, (L.const(0),), L.const(0, T.int32)), L.For(
            k, self.p.depth, L.Store(self.total, (L.const(0),), self.total[0] + _nonfinite(
                self.b_op.at(self.bz, k, place))))), self.total[0]

    def finish(self) -> L.Stmt:
        p, c = self.p, self.c
        i, j, first, end = L.Var("sfi"), L.Var("sfj"), L.Var("sff"), L.Var("sfz")
        f, e = self.entries(j)
        inside = self.position(i) < p.rows
        if p.places % c.tile:
            inside = L.logical_and(inside, self.place() < p.places)
        return self.per_thread(L.For(i, c.row_steps, L.If(inside, L.Let(
            j, _index(self.row[i]), L.Let(first, f, L.Let(end, e, self.store(
                j, first, end, i * c.vector))))), L.ForKind.UNROLLED))

    def build(self) -> L.Stmt:
        p, c = self.p, self.c
        s = L.Var("sls")
        done = [self.finish()] if not p.transposed else \
            [L.Barrier(), self.finish(), L.Barrier(), self.write_out()]
        body = L.seq(self.setup(), L.For(s, p.slices, L.seq(
            L.Barrier(), self.load_bounds(s), self.stage_b(s), L.Barrier(),
            self.multiply_slice(s))), *done)
        for buffer in (self.sb, self.nfs, self.acc, self.xr, self.row, self.count, self.total,
                       self.bounds, self.quad):
            body = L.Allocate(buffer, body)
        return L.For(self.bz, p.batch, L.For(self.by, -(-p.rows // c.block_span), L.For(
            self.bx, -(-p.places // c.tile), body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y),
            L.ForKind.BLOCK_Z)


def build(p: SparseProblem, config: SpmmConfig, machine) -> L.PrimFunc:
    b_op = _Operand(p, workspace=not config.staged)
    if config.staged:   # one kernel: the staging transposes and flags
        body = _StagedSpmm(p, config, b_op, None).build()
    else:
        part = L.Buffer("spmm_flags", T.int32,
                        (p.batch * -(-p.depth // FLAG_DEPTH) * p.places,), L.Scope.GLOBAL)
        stages = [_flags(p, b_op, part), _Spmm(p, config, b_op, part).build()]
        if b_op.xt is not None:
            stages.insert(0, _transpose(p, b_op.xt))
        body = L.Allocate(part, L.seq(*stages))
        if b_op.xt is not None:
            body = L.Allocate(b_op.xt, body)
    views = {buffer.name: buffer for buffer in (p.x, p.y)}
    params = tuple(views.get(x.name, x) for x in p.params)
    return L.PrimFunc(p.name, params, body)


SPMM = Template("cuda_spmm", gathered_product, applies, space, default, build)

