"""The cuda 2:4 templates: Sparse24Dense kernels (cuda_sparse24, `sparse_problems.
Sparse24Problem`) and Sparse24ConvNHWC ones (cuda_sparse24_conv, `Sparse24ConvProblem`: the
channels-last conv's implicit GEMM, conv_nhwc.py's `implicit_gemm` patches and store), their
weights with at most 2 nonzeros in every 4 consecutive k, compressed and their metadata built
at compile time (`ir/ops/sparse.py`'s `encode_2of4`), on the sparse tensor cores (`L.Mma` at
precision sp_fp16 / sp_bf16: mma.sp m16n8k32, fp32 accumulators; on sm_90 `L.Wgmma` at those
precisions: wgmma.mma_async.sp m64nNk32).

It is mma.py's product (`mma_product`, `_WarpTiles`) with the weights as the mma's A
operand, the sparse one: the product computed is Y^T = W X^T, W's rows (the outputs, j) down
a block's `block_m`, the activations' rows (the places, i: a conv's output pixels, whose
patches are gathered as conv_nhwc.py gathers them) across its `block_n`. Each k tile
of `block_k` (a multiple of 32) rings through the same shared slots (cp.async, XOR-swizzled
16-byte chunks), three tiles a slot: W's kept values (`block_k` / 2 of a row: `_Tile` over
the compressed [n, k / 2]), X's rows (`block_k` each, as a dense B along k) and the
metadata (`_Metadata`: a 16-row tile's 16 words a 32-k step, contiguous in the encoded
layout, so one cp.async a 16 bytes). A warp's step of 32 k loads, for each of its 16-row
tiles, A's fragment by one ldmatrix.x4 (as a dense 16 x 16 step: the compressed tile is
one) and its metadata word (lane 4 g + p reads word (g, p % 2)), for each of its 8-place
tiles B's 4 registers by one ldmatrix.x4 (8 places x 32 k), double buffered as mma.py does;
then one mma.sp per (row tile, place tile). The results are stored through the problem's
store transposed back (accumulator (j, i) to Y[i, j]): the bias, the fused epilogue
(activation, residual) and a layout tail apply as for the dense templates
(`problems.Dense.finish`, the store dense.py builds).

On sm_90 the `wgmma` knob runs the same product on warpgroups (`_SparseWarpgroups`, on
wgmma.py's block): per sparse step of 32 k and m64 tile of W's rows one wgmma.mma_async.sp
(`L.Wgmma` at a sparse precision) reading W's kept values and X's rows from shared memory
through descriptors, each warp's metadata word (the mma.sp word of its 16 rows) from the
metadata ring into registers, two sets taken by turns of k tiles (`register_sets`: the wgmmas
still running read the other). A k tile is 128 k (W's 64 kept values a row one 128-byte swizzle
row, X's 128 two: `_Panels`, two panels of 64 k, wgmma's K-major rows being 128 bytes) or 64 k
(`WARPGROUP_K`: W's 32 a row in half a swizzle row, `_HalfRows`; X's 64 one row, as the dense
product's k tile). mma.sync.sp on Hopper runs at about half wgmma's rate, which is why the
mma.sp product ran 1.29-1.34x slower than the dense fp16 wgmma default on BERT-base b8's
products (H200, session 40). With the `staged` knob (warpgroups only) the results go through
shared memory transposed (staged.py's `transposed_results`: Y runs along W's rows) and are
stored in runs of 4 of a place's outputs, not 2 bytes a lane.

Why the 2:4 product lost to dense fp16 (session 44, H200: 2:4 / dense 1.04-2.10 at the
k-128 default), measured on an H200 in session 45 (bench/gpu_sparse24.py --all and a
build without the scan): X's k tile of 128 doubled B's slot, so the rings that fit dense tiles did not
(64 x 64 at k 64, staged, against k 128: resnet50 b32's 1x1 1024->256 1.18 against 1.71,
1x1 256->64 1.12 against 1.48; BERT b8's 768->768 1.37 against 1.34); and the non-finite
scan, whose work a thread grows with the block's places, is still the largest cost (built
without it, 64 x 128 ran BERT's 768->768 at 1.20 for 1.75, 64 x 192 the 1x1 1024->256 at
1.62 for 2.47), so the narrow tiles win (WARPGROUP_TILES). Staging the results gained up to
10% (128 x 128 on BERT 1.69 against 1.86). At the rule's tiles 2:4 / dense was 1.12-1.18 on
these three layers. Session 46 (H200, 15 layers, bench/gpu_sparse24.py --all --scanned):
the flags from the block's sums (below) instead of the scan, and WARPGROUP_TILES refitted,
took 2:4 / dense from a geomean of 1.157 to 1.015 (0.84 to 1.18; faster than dense on 6):
still short of issue 34's 0.77. Session 47 (H200): the race that made warpgroups of more
than 64 places wrong found (the metadata registers: `_SparseWarpgroups.register_sets`) and
256 x 64 added to WARPGROUP_TILES: 0.993 in a run where session 46's tiles gave 1.022 (a
second call, HEAD's tree against this one: 0.987 against 1.011 and 1.008); the wide
warpgroups, now correct, were the best tile on 3 of the 15 layers only.

Knobs: mma.py's `TensorCoreConfig` (block_k of 32, 64 or 128; it must divide k, and split_k
the k tiles: no tile reads past k, whose metadata would be zero-filled; with wgmma 64 or
128, `refill_first`, not `early_refill`, and `staged`). The default on sm_90 where k is a
multiple of 64 is a WARPGROUP_TILES tile (SCANNED_TILES where the block's k tiles are
scanned; `_warpgroup_default`: the one whose busiest SM has least to do); elsewhere
`mma.choose`'s mma.sync tile for depth k / 2 at the deepest block_k of 64 or 32 that fits in
3 stages.

Skipping a pruned weight drops its x * 0 term, which IEEE makes NaN for a non-finite x (the
dense product's result). The block flags its places holding a non-finite activation; after
the k loop an accumulator of a flagged place becomes NaN where one of the place's non-finite
activations sits at a pruned position of its row (the rare path, `_fix`: the place's row and
the metadata read again from global memory), as the CSR template's non-finite counts do
(cuda/sparse.py). Where the block's rows are whole runs of the weights' `covering_rows`
(each k kept by one of them: the problem's `cover`, from the constant metadata), the flags
come from the sums, once after the k loop (`_seen`: x times a kept value, a kept zero too,
is not finite for a non-finite x); elsewhere, as each k tile's B tile lands in shared
memory, the threads test its chunks' halves for an exponent of all ones (a chunk's 16 bytes
one load, one add and two masks a word: `_flags`). The scan was the product's largest cost
(session 45).
They never serve a dense product, nor weights without the 2:4 encoding, nor a grouped conv.
"""

from __future__ import annotations

from dataclasses import replace

from ...ir import loop as L
from ...ir import types as T
from ..problems import widened
from ..sparse_problems import (Sparse24ConvProblem, Sparse24Problem, sparse24_conv_product,
                               sparse24_product)
from ..space import Constraint, Space, Template
from . import conv_nhwc
from . import wgmma
from .dense import MAX_GRID_YZ, SPLITS, Operand
from .device import gpu_of, has_wgmma
from .mma import (CHUNK_WORDS, MAX_ACCUMULATORS, MAX_SHARED_BYTES, MAX_WGMMA_SHARED_BYTES,
                  TensorCoreConfig, _accumulators, _allocated, _c, _over_threads, _Tile,
                  _WarpTiles, choose, mma_product)
from .staged import staging_bytes

PRECISIONS = ("fp16", "bf16")
SPARSE = {T.float16: ("fp16", "sp_fp16"), T.bfloat16: ("bf16", "sp_bf16")}
"""The kept values' type -> (the tiles' precision, the mma's sparse precision)."""
STEP_K = 32
"""k of an mma.sp step (16 kept values a row)."""
META_WORDS = 16
"""Metadata words of a 16-row tile a step: (g, p) for lanes 4 g + p, p < 2."""
DEFAULT_STAGES = 3
WARPGROUP_K = (64, 128)
"""k tiles of the warpgroup product: 128 (W's 64 kept values a row, one 128-byte swizzle
row; X's two) or 64 (W's 32 a row, half a swizzle row, two slots sharing the rows:
`_HalfRows`; X's one, as the dense product's): the shallower tile halves X's slot, so a
ring of as many slots as the dense product's fits beside as wide a tile."""


def shared_bytes(c: TensorCoreConfig) -> int:
    """A block's ring: per slot W's kept values (block_k / 2 a row; with `wgmma` at k tiles
    of 64 an even count of slots, `_HalfRows`), X's block_k a place (2 bytes each) and the
    metadata words, or the staged results where they take more; and the places' non-finite
    flags (with `wgmma`, each buffer from a 1024-byte boundary, as the renderer carves
    them)."""
    align = L.SWIZZLE_BYTES if c.wgmma else 4
    up = lambda x: -(-x // align) * align   # noqa: E731
    kept = -(-c.stages // 2) * 2 if c.wgmma and c.block_k < wgmma.ROW_BYTES else c.stages
    ring = sum(up(x) for x in (kept * c.block_k * c.block_m,
                               c.stages * c.block_k * c.block_n * 2,
                               c.stages * c.block_m // 16 * c.block_k // STEP_K * META_WORDS * 4))
    if c.staged and c.split_k == 1:
        ring = max(ring, up(staging_bytes(c, transposed=True)))
    return ring + up(c.block_n * 4)


def _fits(c: TensorCoreConfig, precision: str) -> bool:
    """Whether config `c` is one the product runs: with `wgmma` (sm_90), warpgroup tiles
    (`wgmma.fits` at the sparse precision, whose k tile is 128: A's 64 kept a row one
    swizzle row; or k tiles of 64, `WARPGROUP_K`); without, mma.sync's (warp tiles of whole
    16 x 16 mma tiles, their accumulators bounded)."""
    if c.wgmma:
        return c.block_k in WARPGROUP_K and \
            wgmma.fits(replace(c, block_k=wgmma.block_k(precision)), precision)
    return c.block_k <= 128 and c.block_m % (16 * c.warps_m) == 0 and \
        c.block_n % (16 * c.warps_n) == 0 and _accumulators(c) <= MAX_ACCUMULATORS


def _dims(p) -> tuple[int, int, int, T.DType]:
    """(rows of W, places, k, the kept values' type) of a Sparse24Problem or a
    Sparse24ConvProblem (its implicit GEMM: the output pixels the places)."""
    if isinstance(p, Sparse24ConvProblem):
        places, rows, k = conv_nhwc.gemm(p)
        return rows, places, k, p.w.dtype
    return p.n, p.m, p.k, p.b.dtype


def _limit(c: TensorCoreConfig) -> int:
    return MAX_WGMMA_SHARED_BYTES if c.wgmma else MAX_SHARED_BYTES


def space(p, machine) -> Space:
    rows, places, k, dtype = _dims(p)
    tiles = lambda c: k // c.block_k   # noqa: E731
    name = "cuda_sparse24_conv" if isinstance(p, Sparse24ConvProblem) else "cuda_sparse24"
    arch = getattr(machine, "arch", None)
    warpgroups = (False, True)[:1 + (arch is not None and has_wgmma(arch))]
    sparse = SPARSE[dtype][1]
    return Space(name, TensorCoreConfig, {
        "block_m": (16, 32, 64, 128, 256), "block_n": (32, 64, 128, 192, 256),
        "block_k": (32, 64, 128), "warps_m": (1, 2, 4, 8), "warps_n": (1, 2, 4),
        "stages": (2, 3, 4, 5), "split_k": SPLITS, "wgmma": warpgroups,
        "early_refill": (False,), "refill_first": warpgroups, "staged": warpgroups,
    }, [Constraint("without wgmma: a warp's rows (block_m / warps_m) and columns (block_n / "
                   f"warps_n) multiples of 16, at most {MAX_ACCUMULATORS} accumulators a "
                   "lane; with wgmma (sm_90): k tiles of 64 or 128, warps_m a multiple of 4, a "
                   f"warpgroup's columns one of {wgmma.WGMMA_N} and rows whole m64 tiles, at "
                   "most 128 accumulators a thread, at least 3 stages",
                   lambda c: _fits(c, sparse)),
        Constraint("refill_first only with wgmma", lambda c: c.wgmma or not c.refill_first),
        Constraint("staged results only with wgmma, k unsplit",
                   lambda c: not c.staged or c.wgmma and c.split_k == 1),
        Constraint(f"block_k divides k ({k}), split_k the k tiles",
                   lambda c: k % c.block_k == 0 and tiles(c) % c.split_k == 0),
        Constraint(f"the stages' shared tiles within {MAX_SHARED_BYTES >> 10} KiB "
                   f"({MAX_WGMMA_SHARED_BYTES >> 10} KiB with wgmma)",
                   lambda c: shared_bytes(c) <= _limit(c)),
        Constraint("split_k slices on grid z", lambda c: c.split_k <= MAX_GRID_YZ)])


WARPGROUP_TILES = (
    (TensorCoreConfig(64, 64, 64, 4, 1, 4, wgmma=True, staged=True), 0.4),
    (TensorCoreConfig(128, 64, 64, 8, 1, 4, wgmma=True, staged=True), 0.6),
    (TensorCoreConfig(256, 64, 64, 8, 1, 4, wgmma=True, staged=True), 0.7))
"""(tile, its share of the sparse tensor cores' rate as the rule weighs it) the warpgroup
default chooses from (`_warpgroup_default`) where the tile's rows are whole runs of the
weights' `covering_rows`, so that no k tile is scanned: W's rows x places, k tiles of 64,
results staged. Measured (H200, fp16, bench/gpu_sparse24.py --all, 2:4 / dnnc dense fp16,
15 layers of BERT-base b8 and resnet50 b32; session 47, one run): 256 x 64 (two warpgroups
of 128 rows: X's tile read once for twice the rows) the better where W has 256 rows or more
and its blocks fill the SMs (1x1 1024->256 0.96 for 1.07 at 128 x 64, 256->1024 0.98 for
1.02, 128->512 1.10 for 1.18, 512->2048 1.05 for 1.19, 64->256 1.08 for 1.09, 3x3 256->256
0.88 for 0.95), 128 x 64 on BERT and where 256-row blocks leave SMs idle (1x1 2048->512 @7
0.90 for 1.22), 64 x 64 where W has 64 rows (1x1 256->64 1.08, 3x3 64->64 1.06); the shares
(any of 256 x 64's from 0.65 to 0.8) pick the best of the three on all 15 (geomean 0.993
against 1.022 for session 46's two tiles in the same run; the best of all 10 tiles timed on
each layer 0.980). Warpgroups of 128 to 256 places (`wgmma.WGMMA_N`),
correct since session 47, were the best on 3 layers (1x1 512->128 128 x 192 0.88 for 0.99,
3x3 256->256 128 x 128 0.85, BERT 768->3072 128 x 128 1.09 for 1.13) and 1.3-2.7 elsewhere:
not in the table."""

SCANNED_TILES = (
    (TensorCoreConfig(64, 64, 64, 4, 1, 4, wgmma=True, staged=True), 0.45),
    (TensorCoreConfig(128, 64, 64, 8, 1, 4, wgmma=True, staged=True), 0.55))
"""WARPGROUP_TILES' counterpart for weights whose rows do not keep every column (each k
tile scanned). Measured (H200, fp16, bench/gpu_sparse24.py --all, 2:4 / dnnc dense fp16): BERT b8
768->768 128 x 64 1.15, 64 x 64 1.37; resnet50 b32 1x1 1024->256 64 x 64 1.18, 128 x 64
1.22; 1x1 256->64 @56 64 x 64 1.12, 128 x 64 1.37: the best of 17 configs on each. Wider
tiles lost everywhere (64 x 128 1.38-1.75, 128 x 128 1.31-1.69, 64 x 192 1.56-2.97; 128 x 192
and up 1.86-3.62): the non-finite scan's work a thread grows with the places (built without
it, 64 x 128 ran BERT's 768->768 at 1.20 for 1.75, 64 x 192 the 1x1 1024->256 at 1.62 for
2.47). The shares put 128 x 64 ahead where 64 x 64 takes two waves to its one (BERT) and
behind where 64 x 64's waves are fewer per row (the 1x1 convs)."""


def default(p, machine) -> TensorCoreConfig:
    """On sm_90 where k is a multiple of 64, a WARPGROUP_TILES tile (`_warpgroup_default`);
    else `mma.choose`'s mma.sync tile for depth k / 2, its k tile the deepest of 64 or 32
    dividing k that fits DEFAULT_STAGES slots; k unsplit unless the split divides the k
    tiles."""
    rows, places, k, dtype = _dims(p)
    precision, sparse = SPARSE[dtype]
    arch = getattr(machine, "arch", None)
    if arch is not None and has_wgmma(arch) and k % min(WARPGROUP_K) == 0:
        whole = [(c, share) for c, share in WARPGROUP_TILES
                 if p.cover and c.block_m % p.cover == 0]
        return _warpgroup_default(whole or SCANNED_TILES, rows, places, gpu_of(machine).sms)
    base = choose(rows, places, k // 2, 1, gpu_of(machine), precision)
    for bk in (64, 32):
        c = replace(base, block_k=bk, stages=DEFAULT_STAGES, wgmma=False, staged=False,
                    early_refill=False, refill_first=False)
        if k % bk == 0 and shared_bytes(c) <= MAX_SHARED_BYTES:
            break
    if (k // c.block_k) % c.split_k:
        c = replace(c, split_k=1)
    return c


def _warpgroup_default(tiles, rows: int, places: int, sms: int) -> TensorCoreConfig:
    """The tile of `tiles` (WARPGROUP_TILES' entries or SCANNED_TILES) whose busiest SM has
    least to do: its blocks' products (ceil(blocks / sms) of them; a ragged edge's tile
    counts whole) over the tile's share of the rate."""
    def seconds(entry):
        c, efficiency = entry
        blocks = -(-rows // c.block_m) * -(-places // c.block_n)
        return -(-blocks // sms) * c.block_m * c.block_n / efficiency
    return min(tiles, key=seconds)[0]


def applies(p) -> bool:
    rows, _, k, dtype = _dims(p)
    x = p.x if isinstance(p, Sparse24ConvProblem) else p.a
    return dtype in SPARSE and k % STEP_K == 0 and rows % 16 == 0 and \
        x.dtype in (T.float32, dtype)


class _Metadata:
    """The metadata's k tiles in a ring of shared slots (the ring's third tile), copied by
    cp.async: a slot holds the block's 16-row tiles' words [row tile, step, g, p], each row
    tile's steps one run of the encoded layout (16 bytes a copy, zero-filled past n)."""

    asynchronous = True

    def __init__(self, meta: L.Buffer, rows: int, first: L.Expr, n: int, bk: int, k: int,
                 threads: int, stages: int):
        """`first`: the block's first 16-row tile."""
        self.meta, self.first, self.threads = meta, first, threads
        self.row_tiles, self.steps, self.k_steps = rows // 16, bk // STEP_K, k // STEP_K
        self.tiles_n = n // 16
        self.slot_words = self.row_tiles * self.steps * META_WORDS
        self.tile = L.Buffer("meta_tile", T.uint32, (stages * self.slot_words,),
                             L.Scope.SHARED)

    def word(self, slot: L.Expr, tile: L.Expr, ks: int, g: L.Expr, p: L.Expr) -> L.Expr:
        return slot * self.slot_words + (tile * self.steps + ks) * META_WORDS + g * 2 + p

    def issue(self, kt: L.Expr, slot: L.Expr, when: L.Expr | None) -> L.Stmt:
        per_tile = self.steps * META_WORDS // 4    # 16-byte chunks a row tile

        def visit(step, e):
            tile, chunk = e // per_tile, e % per_tile
            jt = self.first + tile
            src = (L.minimum(jt, self.tiles_n - 1) * self.k_steps + kt * self.steps) * \
                META_WORDS + chunk * 4
            copy = L.CopyAsync(self.tile[slot * self.slot_words + tile * per_tile * 4 +
                                         chunk * 4], self.meta[src],
                               L.Select(jt < self.tiles_n, L.const(16), L.const(0)))
            return copy if when is None else L.If(when, copy)
        return _over_threads(self.threads, self.row_tiles * per_tile, visit)

    def fetch(self, kt: L.Expr, slot: L.Expr) -> L.Stmt:
        return self.issue(kt, slot, None)

    def finish(self, slot: L.Expr, when: L.Expr | None) -> None:
        return None

    def round_in_place(self, slot: L.Expr) -> None:
        return None


class _NonFinite:
    """What both blocks of the 2:4 product share (the module's docstring's last paragraph):
    the places' non-finite flags, set after the k loop from the block's own sums where its
    rows keep every k (`_seen`), else as each k tile of B lands (`_flags`), and then the
    accumulators of flagged places made NaN where one of the place's non-finite activations
    sits at a pruned position of its row (`_recount`, from `_fix`; each block's `_results`
    walks its accumulators' layout). Mixed in before the block's product class."""

    transposed_results = True
    """Y^T = W X^T: Y runs along the block's rows (W's), which a staged epilogue stores."""

    def _sparse(self, meta: L.Buffer, sparse: str, k: int, places: int, cover: int) -> None:
        # places of the block whose activations hold a NaN or an infinity (`_seen`, `_flags`)
        self.flags = L.Buffer("nonfinite", T.int32, (self.bn,), L.Scope.SHARED)
        self.exponent = 0x7c00 if sparse == "sp_fp16" else 0x7f80
        self.meta, self.sparse, self.k, self.places = meta, sparse, k, places
        # the block's rows whole runs of `cover` (`covering_rows`): its sums see every
        # non-finite activation, so no k tile is scanned
        self.scanned = not (cover and self.bm % cover == 0)

    def scan(self, slot: L.Expr) -> L.Stmt:
        """`_flags` of the k tile in `slot` where the block's rows do not keep every k."""
        return self._flags(slot) if self.scanned else L.seq()

    def init(self) -> L.Stmt:
        """The accumulators zeroed, and the block's places' flags (before the k loop's
        first barrier)."""
        return L.seq(super().init(), _over_threads(self.c.threads, self.bn, lambda step, e: L.Store(
            self.flags, (e,), L.const(0, T.int32))))

    def _flags(self, slot: L.Expr) -> L.Stmt:
        """Each place of the B tile in `slot` holding a half whose exponent is all ones (a NaN
        or an infinity) flagged: a chunk's 4 words tested at once a thread."""
        b, mask = self.b_in, self.exponent
        both, carry = L.const(mask | mask << 16, T.uint32), L.const(
            (mask & -mask) | (mask & -mask) << 16, T.uint32)
        top = L.const(0x80008000, T.uint32)

        def visit(step, e):
            o, c, v = *b._chunk_of(e), L.Var("v")
            words = L.Buffer("scanned", T.uint32, (CHUNK_WORDS,), L.Scope.LOCAL)
            # one 16-byte load a chunk (4 loads of a word each were 4-way bank conflicts:
            # a warp's 8 rows of 16-byte chunks span the banks only at 16 bytes a lane)
            load = L.For(v, CHUNK_WORDS, L.Store(words, (v,), b.tile[b.word(slot, o, c) + v]),
                         L.ForKind.VECTORIZED)
            bits = None
            for x in range(CHUNK_WORDS):   # exponent all ones: its lowest bit carries into 15
                t = L.BinOp("&", L.BinOp("+", L.BinOp("&", words[x], both), carry), top)
                bits = t if bits is None else L.BinOp("|", bits, t)
            return L.Allocate(words, L.seq(load, L.If(L.ne(bits, L.const(0, T.uint32)), L.Store(
                self.flags, (o,), L.const(1, T.int32)))))
        return _over_threads(self.c.threads, b.chunks, visit)

    def _seen(self) -> L.Stmt:
        """Each place with a non-finite sum flagged: x times a kept value is not finite for a
        non-finite x, and the block's rows keep every k (`covering_rows`), so every place
        holding one has one (a non-finite weight flags its places too: `_fix` is exact)."""
        def seen(j, local, at):
            d = self.acc[at] - self.acc[at]
            return L.If(L.ne(d, d), L.Store(self.flags, (local,), L.const(1, T.int32)))
        return self._results(None, seen)

    def _fix(self) -> L.Stmt:
        """`_recount` for each accumulator of a flagged place (its flag read once a lane)."""
        return self._results(self._flagged, lambda j, local, at: self._recount(
            j, self.col0 + local, at))

    def each_result(self, body, within_tile: bool = False) -> L.Stmt:
        """The product class's, after the flags from the sums (`_seen`, unless `scanned`) and
        the non-finite fix (`_fix`)."""
        seen = L.seq() if self.scanned else self._seen()
        return L.seq(seen, L.Barrier(), self._fix(), super().each_result(body, within_tile))

    def _flagged(self, local: L.Expr) -> L.Expr:
        """Whether the block's place `local` is inside X and flagged."""
        return L.logical_and(self.col0 + local < self.places,
                             L.ne(self.flags[local], L.const(0, T.int32)))

    def _recount(self, j: L.Expr, place: L.Expr, at: L.Expr) -> L.Stmt:
        """Accumulator `at` (row j of W, `place`) NaN where one of the place's non-finite
        activations sits at a pruned position of row j (the dense product's x * 0: the rare
        path, reading the activations and the metadata from global memory)."""
        gg, q = L.Var("fg"), L.Var("fq")
        count = L.Buffer("pruned_nonfinite", T.int32, (1,), L.Scope.LOCAL)
        steps = self.k // STEP_K

        def kept(c):   # the column in its group of kept value c of row j
            word = self.meta[((j // 16 * steps + c // 16) * 8 + j % 8) * 2 + c % 16 // 8]
            shift = L.Cast(T.uint32, (j % 16 // 8) * 16 + 2 * (c % 8))
            return L.Cast(T.int64, L.BinOp("&", L.BinOp(">>", word, shift),
                                           L.const(3, T.uint32)))

        x = widened(self.b_in.operand.at(self.bi, place, gg * 4 + q))
        d = x - x
        pruned = L.logical_and(L.ne(q, kept(2 * gg)), L.ne(q, kept(2 * gg + 1)))
        add = L.If(L.logical_and(pruned, L.ne(d, d)), L.Store(count, (L.const(0),), L.const(
            1, T.int32)))
        return L.If(j < self.m, L.Allocate(count, L.seq(
            L.Store(count, (L.const(0),), L.const(0, T.int32)),
            L.For(gg, self.k // 4, L.For(q, 4, add)),
            L.If(L.ne(count[0], L.const(0, T.int32)), L.Store(self.acc, (at,), L.const(
                float("nan")))))))


class _SparseTiles(_NonFinite, _WarpTiles):
    """A block of the 2:4 product on mma.sp (the module's docstring): mma.py's block with A's
    tile over the kept values, the metadata's ring beside it, and sparse mma steps of 32 k."""

    def __init__(self, c: TensorCoreConfig, batch: int, m: int, n: int, k: int, a: Operand,
                 b: Operand, precision: str, *, meta: L.Buffer, sparse: str, cover: int):
        super().__init__(c, batch, m, n, k, a, b, precision)
        self.mk = STEP_K
        self.a_in = _Tile("a", self.bm, self.row0, m, a, self.bk // 2, k // 2, c.threads,
                          m % self.bm != 0, self.bi, precision, c.stages)
        self.meta_in = _Metadata(meta, self.bm, self.by * (self.bm // 16), m, self.bk, k,
                                 c.threads, c.stages)
        if not self.b_in.k_inner:
            raise ValueError("2:4 products read B's rows along k (ldmatrix of 8 x 32)")
        self.a_frag = L.Buffer("a_frag", T.uint32, (2 * self.tm * 4,), L.Scope.LOCAL)
        self.b_frag = L.Buffer("b_frag", T.uint32, (2 * self.tn * 4,), L.Scope.LOCAL)
        self.e_frag = L.Buffer("e_frag", T.uint32, (2 * self.tm,), L.Scope.LOCAL)
        self._sparse(meta, sparse, k, n, cover)

    def rings(self) -> tuple:
        return self.a_in, self.b_in, self.meta_in

    def _results(self, when, each) -> L.Stmt:
        """`each(j, local, at)` for a lane's accumulators (row j of W, the block's place
        `local`, register `at`), a place's (place tile ni, column h) under `when(local)`
        (None: always)."""
        mi, ni, h, r = self.mi, self.ni, L.Var("fh"), L.Var("fr")
        row, _ = _c(2 * r + h, self.g, self.q)    # (g + 8 r, 2 q + h)
        j = self.row0 + self.wy * self.wm + mi * 16 + row
        local = self.wx * self.wn + ni * 8 + 2 * self.q + h
        body = L.For(mi, self.tm, L.For(r, 2, each(j, local, (mi * self.tn + ni) * 4 + 2 * r +
                                                   h), L.ForKind.UNROLLED), L.ForKind.UNROLLED)
        return self.per_thread(L.For(ni, self.tn, L.For(h, 2, body if when is None else L.If(
            when(local), body), L.ForKind.UNROLLED), L.ForKind.UNROLLED))

    def _fragments(self, slot: L.Expr, ks: int, half: int) -> L.Stmt:
        """The warp's A fragments and metadata words and its B fragments of step `ks` into
        register set `half`."""
        ai, bj = L.Var("ai"), L.Var("bj")
        lane, tm, tn = self.lane, self.tm, self.tn
        a_rows = self.wy * (self.wm // 8) + ai * 2      # in 8s
        a = L.seq(
            L.LdMatrix(self.a_frag[(half * tm + ai) * 4], self.a_in.tile[
                self.a_in.fragment_row(slot, ks, a_rows, lane, True)], 4,
                not self.a_in.k_inner),
            L.Store(self.e_frag, (half * tm + ai,), self.meta_in.tile[self.meta_in.word(
                slot, self.wy * tm + ai, ks, self.g, self.q % 2)]))
        place = (self.wx * tn + bj) * 8 + lane % 8
        b = L.LdMatrix(self.b_frag[(half * tn + bj) * 4], self.b_in.tile[self.b_in.word(
            slot, place, ks * 4 + lane // 8)], 4, False)
        return L.seq(L.For(ai, tm, a, L.ForKind.UNROLLED), L.For(bj, tn, b, L.ForKind.UNROLLED))

    def update(self, slot: L.Expr) -> L.Stmt:
        """The k tile in shared `slot`, 32 k a step: step s + 1's fragments loaded while step
        s's mma.sp run, one per (row tile, place tile)."""
        mi, ni, tm, tn = self.mi, self.ni, self.tm, self.tn
        steps = self.bk // STEP_K
        body = [self._fragments(slot, 0, 0)]
        flags = self.scan(slot)
        for ks in range(steps):
            if ks + 1 < steps:
                body.append(self._fragments(slot, ks + 1, (ks + 1) % 2))
            half = ks % 2
            mma = L.Mma(self.sparse, self.acc, (mi * tn + ni) * 4,
                        tuple(self.a_frag[(half * tm + mi) * 4 + r] for r in range(4)),
                        tuple(self.b_frag[(half * tn + ni) * 4 + r] for r in range(4)) +
                        (self.e_frag[half * tm + mi],))
            body.append(L.For(mi, tm, L.For(ni, tn, mma, L.ForKind.UNROLLED),
                              L.ForKind.UNROLLED))
        return L.seq(flags, self.per_thread(L.seq(*body)))

    def block(self, body: L.Stmt, after: L.Stmt | None = None) -> L.Stmt:
        return _allocated(body, after, [self.a_in.tile, self.b_in.tile, self.meta_in.tile] +
                          [x.stage for x in (self.a_in, self.b_in) if not x.asynchronous],
                          [self.flags, self.acc, self.a_frag, self.b_frag, self.e_frag])


class _Panels(wgmma._SwizzledTile):
    """B's k tile of the warpgroup product (128 k, twice a 128-byte swizzle row) as two
    panels of 64 k, the second after the first, each in `_SwizzledTile`'s K-major layout
    (wgmma's K-major rows are 128 bytes): chunk c of row o at panel c // 8, chunk
    c % 8 ^ o % 8 of its row."""

    def word(self, slot: L.Expr, o: L.Expr, c: L.Expr) -> L.Expr:
        return slot * self.slot_words + c // wgmma.ROW_CHUNKS * (self.rows * wgmma.ROW_WORDS) + \
            o * wgmma.ROW_WORDS + L.BinOp("^", c % wgmma.ROW_CHUNKS, o % 8) * CHUNK_WORDS

    def descriptor(self, slot: L.Expr, first: L.Expr, ks: int) -> tuple[L.Load, tuple]:
        """(the first word, the offsets) of the rows from `first` at sparse step `ks` (32 k,
        64 bytes: half a panel's row)."""
        panel, half = divmod(ks, 2)
        return self.tile[slot * self.slot_words + panel * (self.rows * wgmma.ROW_WORDS) +
                         first * wgmma.ROW_WORDS + half * (wgmma.ROW_WORDS // 2)], \
            (16, L.SWIZZLE_BYTES)


class _HalfRows(wgmma._SwizzledTile):
    """W's kept values at k tiles of 64 (`WARPGROUP_K`): 32 a row, 64 bytes, half a
    128-byte swizzle row; two slots of the ring share one slot of rows (`_SwizzledTile`'s
    K-major layout), slot s in the row's half s % 2: chunk c of row o at (c + 4 (s % 2)) ^
    o % 8. A descriptor's start 64 bytes into a row is as a dense k step's 32 bytes in:
    the swizzle is of the address."""

    def __init__(self, name: str, rows: int, first: L.Expr, extent: int, operand: Operand,
                 bk: int, k: int, threads: int, checked: bool, bi: L.Var, precision: str,
                 stages: int):
        super().__init__(name, rows, first, extent, operand, bk, k, threads, checked, bi,
                         precision, stages)
        self.slot_words = self.outer * wgmma.ROW_WORDS   # of a pair of slots
        self.tile = L.Buffer(self.tile.name, T.uint32, (-(-stages // 2) * self.slot_words,),
                             L.Scope.SHARED)

    def word(self, slot: L.Expr, o: L.Expr, c: L.Expr) -> L.Expr:
        return slot // 2 * self.slot_words + o * wgmma.ROW_WORDS + \
            L.BinOp("^", c + slot % 2 * self.per_row, o % 8) * CHUNK_WORDS

    def descriptor(self, slot: L.Expr, first: L.Expr, ks: int) -> tuple[L.Load, tuple]:
        """(the first word, the offsets) of the rows from `first` at sparse step `ks` (16
        kept values, 32 bytes) of `slot`."""
        return self.tile[slot // 2 * self.slot_words + first * wgmma.ROW_WORDS +
                         slot % 2 * (wgmma.ROW_WORDS // 2) + ks * 8], (16, L.SWIZZLE_BYTES)


class _SparseWarpgroups(_NonFinite, wgmma.Warpgroups):
    """A block of the 2:4 product on sm_90's warpgroups (`wgmma` knob): wgmma.py's block with
    A's tile over the kept values (64 a row, one swizzle row: k tiles of 128), B's k tile in
    two panels (`_Panels`), the metadata's ring beside them, and per sparse step of 32 k
    and m64 tile one wgmma.mma_async.sp, each warp's metadata word read from the ring (the
    mma.sp word of its 16 rows: `L.Wgmma`)."""

    def __init__(self, c: TensorCoreConfig, batch: int, m: int, n: int, k: int, a: Operand,
                 b: Operand, precision: str, *, meta: L.Buffer, sparse: str, cover: int):
        super().__init__(c, batch, m, n, k, a, b, precision)
        self.mk = STEP_K
        kept = wgmma._SwizzledTile if self.bk == wgmma.ROW_BYTES else _HalfRows
        self.a_in = kept("a", self.bm, self.row0, m, a, self.bk // 2, k // 2, c.threads,
                         m % self.bm != 0, self.bi, precision, c.stages)
        self.b_in = _Panels("b", self.bn, self.col0, n, b, self.bk, k, c.threads,
                            n % self.bn != 0, self.bi, precision, c.stages)
        if not (self.a_in.k_inner and self.b_in.k_inner):
            raise ValueError("2:4 warpgroup products read both operands along k")
        self.meta_in = _Metadata(meta, self.bm, self.by * (self.bm // 16), m, self.bk, k,
                                 c.threads, c.stages)
        self.e_frag = L.Buffer("e_frag", T.uint32, (self.register_sets * self.bk // STEP_K *
                                                    self.tm,), L.Scope.LOCAL)
        self._sparse(meta, sparse, k, n, cover)

    def rings(self) -> tuple:
        return self.a_in, self.b_in, self.meta_in

    register_sets = 2
    """The metadata words' register sets, a k tile's each in turn (`Warpgroups.product`'s
    turns of two k tiles): a sparse wgmma reads its metadata register as it runs, not as it
    is issued (PTX: a wgmma's input registers are not to be written until a wait completes
    it), and tile kt + 1's words are loaded while tile kt's wgmmas still run (`wgmma.
    wait_group 1`). With one set, NVCC's SASS for a k loop it kept rolled loaded them into
    the registers of the running wgmmas (nvdisasm: LDS R88 after HGMMA.SP ... R88 before
    the WARPGROUP.DEPBAR): the race of session 46, whose products were wrong by 0.05-0.18 of
    the output's scale on an H200 at warpgroups of 128 and more places (the SASS of every
    tile had the hazard; none of 64 places showed it). With two, the words go into the set whose
    wgmmas the last wait completed (a wait of 0 before the loads, as CUTLASS's sm_90 sparse
    mainloop does, would idle the tensor cores between k tiles)."""

    def update(self, slot: L.Expr, turn: int = 0) -> L.Stmt:
        """The k tile in `slot`: its metadata words into register set `turn`, then (after
        the fence: PTX orders a wgmma's input registers written before it only through one,
        and an H200 gave wrong products with the words loaded after it) per sparse step and
        m64 tile one sparse wgmma of the warpgroup's columns, the group committed; the
        places' flags of the tile while its wgmmas run (they only read it); then all groups
        but it waited for (as `Warpgroups.update`)."""
        loads, products = [], []
        for ks in range(self.bk // STEP_K):
            for mi in range(self.tm):
                first = self.wy * self.rows + mi * wgmma.TILE_M
                a, a_offsets = self.a_in.descriptor(slot, first, ks)
                b, b_offsets = self.b_in.descriptor(slot, self.wx * self.cols, ks)
                at = (turn * self.bk // STEP_K + ks) * self.tm + mi
                loads.append(L.Store(self.e_frag, (at,), self.meta_in.tile[self.meta_in.word(
                    slot, first // 16 + self.warp, ks, self.g, self.q % 2)]))
                products.append(L.Wgmma(self.sparse, self.cols,
                                        self.acc[mi * (self.cols // 2)], a, b, False, False,
                                        a_offsets, b_offsets, self.e_frag[at]))
        return L.seq(self.per_thread(L.seq(*loads, L.WgmmaFence(), *products,
                                           L.WgmmaCommit())), self.scan(slot),
                     self.per_thread(L.WgmmaWait(1, self.acc[0], self.count)))

    def _results(self, when, each) -> L.Stmt:
        """`each(j, local, at)` for a thread's accumulators (`L.Wgmma`'s D layout: register
        4 nt + 2 r + h at row 16 warp + g + 8 r, column 8 nt + 2 q + h of its m64 tile), a
        place's under `when(local)` (None: always)."""
        mi, nt, h, r = self.mi, L.Var("fnt"), L.Var("fh"), L.Var("fr")
        j = self.row0 + self.wy * self.rows + mi * wgmma.TILE_M + self.warp * 16 + self.g + \
            8 * r
        local = self.wx * self.cols + nt * 8 + 2 * self.q + h
        body = L.For(mi, self.tm, L.For(r, 2, each(j, local, mi * (self.cols // 2) + nt * 4 +
                                                   2 * r + h), L.ForKind.UNROLLED),
                     L.ForKind.UNROLLED)
        return self.per_thread(L.For(nt, self.cols // 8, L.For(
            h, 2, body if when is None else L.If(when(local), body), L.ForKind.UNROLLED),
            L.ForKind.UNROLLED))

    def block(self, body: L.Stmt, after: L.Stmt | None = None) -> L.Stmt:
        """The rings' tiles for `body`; the flags (read by the results' `_fix`, a staged
        tile's stores after it: not in the ring's memory) and registers for both."""
        return _allocated(body, after, [self.a_in.tile, self.b_in.tile, self.meta_in.tile] +
                          [x.stage for x in (self.a_in, self.b_in) if not x.asynchronous],
                          [self.flags, self.acc, self.e_frag])


def _blocks(meta: L.Buffer, sparse: str, cover: int):
    """`mma_product`'s `tiles`: a config's block of the 2:4 product (warpgroups with the
    `wgmma` knob, else mma.sp warps) over weights of `covering_rows` `cover`."""
    def tiles(c: TensorCoreConfig, *args):
        kind = _SparseWarpgroups if c.wgmma else _SparseTiles
        return kind(c, *args, meta=meta, sparse=sparse, cover=cover)
    return tiles


def build(p: Sparse24Problem, c: TensorCoreConfig, machine) -> L.PrimFunc:
    """Y[i, j] on the sparse tensor cores: W (n rows of k / 2 kept values) as the mma's A,
    the places as its columns, each result stored at (place, output) through the problem's
    finish (bias, epilogue, layout tail)."""
    precision, sparse = SPARSE[p.b.dtype]
    a = L.Buffer(p.a.name, p.a.dtype, (p.m, p.k))
    values = L.Buffer(p.b.name, p.b.dtype, (p.n, p.k // 2))
    meta = L.Buffer(p.meta.name, T.uint32, (p.n // 16 * (p.k // STEP_K) * META_WORDS,))
    y = L.Buffer(p.y.name, p.y.dtype, (p.m, p.n))
    y_full = L.Buffer(p.y.name, p.y.dtype, p.y_dims)

    def store(bi, j, i, value):   # the product's (row j of W, place i)
        target = y[i, j] if p.store_index is None else \
            y_full[p.store_index(p.anchor_index(bi, i, j))]
        return L.Store(target.buffer, target.indices, p.finish(value, bi, i, j))

    tiles = _blocks(meta, sparse, p.cover)
    body = mma_product(c, 1, p.n, p.m, p.k, Operand(lambda bi, j, kk: values[j, kk], False,
                                                    array=True),
                       Operand(lambda bi, i, kk: a[i, kk], False, array=True), store,
                       precision=precision, tiles=tiles)
    views = {x.name: x for x in (a, values, meta, y if p.store_index is None else y_full)}
    return L.PrimFunc(p.name, tuple(views.get(x.name, x) for x in p.params), body)


def conv_build(p: Sparse24ConvProblem, c: TensorCoreConfig, machine) -> L.PrimFunc:
    """A channels-last conv's implicit GEMM (conv_nhwc.py's patches, store and views) on the
    sparse tensor cores: W (M rows of K / 2 kept values) as the mma's A, the output pixels
    as its columns."""
    precision, sparse = SPARSE[p.w.dtype]
    places, rows, k = conv_nhwc.gemm(p)
    patches, store, views = conv_nhwc.implicit_gemm(p)
    values = L.Buffer(p.w.name, p.w.dtype, (rows, k // 2))
    meta = L.Buffer(p.meta.name, T.uint32, (rows // 16 * (k // STEP_K) * META_WORDS,))
    tiles = _blocks(meta, sparse, p.cover)
    body = mma_product(c, 1, rows, places, k, Operand(lambda bi, j, kk: values[j, kk], False,
                                                      array=True),
                       patches, lambda bi, j, i, value: store(bi, i, j, value),
                       precision=precision, tiles=tiles)
    views.update({values.name: values, meta.name: meta})
    return L.PrimFunc(p.name, tuple(views.get(x.name, x) for x in p.params), body)


SPARSE24 = Template("cuda_sparse24", sparse24_product, applies, space, default, build,
                    precisions=PRECISIONS)
SPARSE24_CONV = Template("cuda_sparse24_conv", sparse24_conv_product, applies, space, default,
                         conv_build, precisions=PRECISIONS)
