"""The cuda dense template: batched matrix products tiled in shared memory, register-blocked.

A block computes a `tile_m` x `tile_n` tile of Y (blockIdx.y: row tiles, blockIdx.x: column
tiles, blockIdx.z: the batch) with (tile_m / thread_m) x (tile_n / thread_n) threads, each
accumulating a thread_m x thread_n block in registers. The k dimension goes in slices of
`tile_k`, double buffered: while the threads multiply slice s from one shared buffer, slice
s + 1 comes from global memory into their registers (`_Staged`), and is then stored into the
other buffer; one barrier a slice. Both slices are stored k-major (A transposed on the way;
each k row TILE_PAD floats longer than the tile, so the transposed stores spread over the
banks), so that a thread's rows of A and columns of B are consecutive shared words: a
thread's rows are runs of 4 (`_micro_tile`: rows 4 tm .. 4 tm + 3 and the same half a tile
further for thread_m = 8), copied at each k step into registers as one 128-bit shared load
each, then multiplied as an outer product (thread_m x thread_n FMAs from registers, the
structure of CUTLASS's SIMT SGEMM). A warp's threads take a 4 x 8 block of thread tiles
(`_thread_offsets`), so that a k step's shared loads are one wavefront each. The copies from
global memory walk the operand's contiguous dimension with consecutive threads, 4 elements a
thread as one 128-bit load where no bound needs checking (the tiles divide the product; the
renderer proves the alignment), else element by element, reading 0 past the operand's extent
or k through a clamped load; B's 4 elements go into shared memory as one 128-bit store
(rendered so; inside the k loop nvcc still splits it in four). The product's element then goes through Gemm's scaling and bias and the fused
epilogue (`Dense.finish`) and is stored through the layout tail, if any.

With `split_k` > 1 (products whose m x n tiles are too few to fill the GPU, as bert's
128-row projections or resnet50's last convolutions at batch 1), blockIdx.z runs over (batch,
k slice): each block sums its slice's k tiles into a global workspace of partial products,
and a second launch, a thread per output, adds the slices and stores as above. The default
config (`choose`) weighs the DEFAULTS tiles and splits with a rough model of their speed.

Operands stored in float16 or bfloat16 (`problems.STORAGE`) are copied into the registers
in their own type (4 of them one 64-bit load) and widened to float32 as they go into shared
memory: the arithmetic is fp32 whatever the storage; Y is stored in its own type (rounded once,
`Dense.finish`).

The tensor-core templates (`mma.py`) reuse `build` with their own product. Not yet: vector
stores of Y.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ...ir import loop as L
from ...ir import types as T
from ...ir.target import GPU
from .. import problems
from ..space import Constraint, Space, Template
from .device import REFERENCE, gpu_of

# the fewest blocks a default config aims for: two per SM (`min_blocks`), of FILL_THREADS
# threads each (a block of more or fewer threads counts for that many blocks of them)
BLOCKS_PER_SM = 2
FILL_THREADS = 128
# (tile_m, tile_n, tile_k, thread_m, thread_n) a default tries: 8 x 8 outputs a thread (64
# accumulators: the classic SGEMM blocking) in 128 x 64 (128 threads), 128 x 128 (256) and
# 64 x 64 (64) tiles, 4 x 8 in 32 x 64 (64 threads: many blocks for a few thousand rows),
# and two small tiles for products of a few rows
DEFAULTS = ((128, 64, 8, 8, 8), (128, 128, 8, 8, 8), (32, 64, 8, 4, 8), (64, 64, 8, 8, 8),
            (32, 32, 16, 2, 2), (16, 32, 16, 1, 2))
MAX_GRID_YZ = 65535
MAX_SHARED_BYTES = 48 << 10   # a block's static shared memory
# floats past each k row of a shared tile: a warp's transposed stores of A (8 rows x 4 k a
# warp, or 16 x 2 vectors) land in distinct banks, not 8 (or 2) to a bank
TILE_PAD = 4
SPLITS = (1, 2, 4, 8, 16)
MIN_SPLIT_K = 128    # the least k a split-k default gives one slice
# the default's model (`choose`): the device's fp32 FMA throughput and copy bandwidth (its
# `GPU` figures), a launch in a CUDA graph (GPU.md), and each DEFAULTS tile's fraction of the
# fp32 figure. The four large tiles' fractions were fitted (H200, every DEFAULTS tile x
# split_k 1, 2, 4 timed on vit_tiny's, ConvNeXt-T's and BERT's products at batch 32 and 8,
# twelve shapes from 1024 x 768 x 3072 to 100352 x 384 x 96: the default so chosen is within
# 3% of the fastest of them on average, worst 20%; the previous default, 128 x 128 first,
# was 33% slower on average), then refitted once the kernel took register fragments, 4 x 8
# warps and unchecked ragged edges (H200, vit_tiny's four products at batch 32 and 4096^3,
# every DEFAULTS tile and 64 x 128, 64 x 256, 128 x 256: the 8 x 8 tiles' TFLOP/s over the
# fp32 figure; the default so chosen within 0.2% of the fastest on average, against 13%
# with the earlier fractions, which chose 32 x 64 throughout); the two small ones are the
# H100's earlier figures
LAUNCH_S = 2e-6
EFFICIENCY = (0.6, 0.5, 0.5, 0.6, 0.15, 0.08)


@dataclass(frozen=True)
class DenseConfig:
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    thread_m: int = 4
    thread_n: int = 4
    split_k: int = 1     # k slices summed by a second launch (fills the GPU when m n is small)

    @property
    def threads(self) -> int:
        return (self.tile_m // self.thread_m) * (self.tile_n // self.thread_n)


def space(p: problems.Dense, machine) -> Space:
    return product_space("cuda_dense", p.k, p.batch)


def product_space(name: str, k: int, batch: int) -> Space:
    """The knobs of a tiled product of depth `k`, `batch` of them (dense and conv)."""
    return Space(name, DenseConfig, {
        "tile_m": (16, 32, 64, 128), "tile_n": (32, 64, 128, 256), "tile_k": (8, 16, 32),
        "thread_m": (1, 2, 4, 8), "thread_n": (1, 2, 4, 8), "split_k": SPLITS,
    }, [Constraint("32 <= (tile_m / thread_m) * (tile_n / thread_n) <= 1024 threads",
                   lambda c: c.thread_m <= c.tile_m and 32 <= c.threads <= 1024),
        Constraint("two shared buffers of each tile within 48 KiB (static shared memory)",
                   lambda c: 2 * 4 * c.tile_k * (c.tile_m + c.tile_n + 2 * TILE_PAD) <=
                   MAX_SHARED_BYTES),
        Constraint("split_k at most the k tiles, batch * split_k blocks on grid z",
                   lambda c: c.split_k <= -(-k // c.tile_k) and batch * c.split_k <= MAX_GRID_YZ)])


def default(p: problems.Dense, machine) -> DenseConfig:
    return choose(p.m, p.n, p.k, p.batch, gpu_of(machine))


def min_blocks(gpu: GPU) -> int:
    """The fewest blocks a product's default aims for on `gpu` (BLOCKS_PER_SM a SM)."""
    return BLOCKS_PER_SM * gpu.sms


@dataclass(frozen=True)
class TileModel:
    """A default's candidates and how `choose` rates them: each tile's fraction of the fp32
    figure, whether a block's fill counts its threads (blocks of FILL_THREADS) or only its
    count, whether a ragged edge's padding counts as work."""

    tiles: tuple
    efficiency: tuple
    by_threads: bool = True
    padded: bool = True


DENSE_MODEL = TileModel(DEFAULTS, EFFICIENCY)
"""The dense products' default model (fitted on the H200, above)."""

CONV_MODEL = TileModel(((128, 64, 8, 8, 8), (64, 64, 8, 8, 8), (64, 128, 8, 8, 8),
                        (128, 128, 8, 8, 8), (64, 64, 16, 4, 4), (32, 64, 16, 2, 4),
                        (32, 32, 16, 2, 2), (16, 32, 16, 1, 2)),
                       (0.6, 0.55, 0.5, 0.45, 0.3, 0.22, 0.15, 0.08), by_threads=False)
"""The implicit-GEMM convolutions' (conv.py), padding rows counted (a 128-row tile over 64
output channels computes half a tile of zeros). The four 8 x 8 tiles' fractions fitted on
the H200 (bench/gpu_conv.py --precision fp32 --shapes resnet18: resnet18's convolutions at
batch 32, 7 tiles x split_k 1, 2, 4, 8 timed: the default so chosen sums to 3.07 ms a call
of its convolutions against 3.00 for the fastest of each and 3.37 with the earlier model,
128 x 128 first; 64 x 256 and 128 x 256 were slower everywhere); the small ones are the
H100's earlier figures. The dense fit does not carry over (with it resnet18 at batch 32 once
ran 1.4x slower: the patch gather's cost, by block rather than by thread)."""


def choose(m: int, n: int, k: int, batch: int = 1, gpu: GPU = REFERENCE,
           model: TileModel = DENSE_MODEL) -> DenseConfig:
    """The default config of an m x n x k product (`batch` of them) on `gpu`: of `model`'s
    tiles, each with k unsplit or split into slices at least MIN_SPLIT_K deep, the one a rough
    model says is fastest: the tiles' work (with `model.padded`, a ragged edge's padding
    included) at their measured efficiency, slowed where its blocks cannot fill the GPU
    (fewer than `min_blocks` blocks; with `model.by_threads`, blocks of FILL_THREADS), plus a
    split's cost (the partial sums written and read, one more launch)."""
    best, best_time = None, math.inf
    for dims, efficiency in zip(model.tiles, model.efficiency):
        for split in SPLITS:
            if split > 1 and (k < split * MIN_SPLIT_K or batch * split > MAX_GRID_YZ):
                break
            config = DenseConfig(*dims, split_k=split)
            blocks = _blocks(m, n, batch, config) * split
            if model.by_threads:
                fill = min(1.0, blocks * config.threads / (min_blocks(gpu) * FILL_THREADS))
            else:
                fill = min(1.0, blocks / min_blocks(gpu))
            work = -(-m // config.tile_m) * config.tile_m * -(-n // config.tile_n) * \
                config.tile_n if model.padded else m * n
            seconds = 2 * work * k * batch / (gpu.fp32_flops * efficiency * fill)
            if split > 1:
                seconds += 8 * m * n * batch * split / gpu.copy_bytes_per_s + LAUNCH_S
            if seconds < best_time:
                best, best_time = config, seconds
    return best


def _blocks(m: int, n: int, batch: int, c: DenseConfig) -> int:
    return -(-m // c.tile_m) * -(-n // c.tile_n) * batch


def applies(p: problems.Dense) -> bool:
    # packed B panels are the llvm layout; a matrix-vector product keeps one thread per
    # output (a 16-row tile would idle most threads)
    return not p.packed_panel and p.m >= 16 and p.batch <= MAX_GRID_YZ and \
        -(-p.m // 16) <= MAX_GRID_YZ


def build(p: problems.Dense, c, machine, product: Callable | None = None) -> L.PrimFunc:
    """The scheduled kernel of `p`: `product(c, batch, m, n, k, a, b, store)` (default
    `tiled_product`; the tensor-core one of `mma.py` takes the same arguments) with this
    problem's operands and store."""
    a = L.Buffer(p.a.name, p.a.dtype, p.a_dims)
    b = L.Buffer(p.b.name, p.b.dtype, (p.batch if p.b_batched else 1,) +
                 ((p.n, p.k) if p.trans_b else (p.k, p.n)))
    y = L.Buffer(p.y.name, p.y.dtype, (p.batch, p.m, p.n))
    y_full = L.Buffer(p.y.name, p.y.dtype, p.y_dims)

    def a_at(bi, i, k):
        return a[p.a_index(bi, i, k)]

    def b_at(bi, j, k):
        bb = bi if p.b_batched else L.const(0)
        return b[bb, j, k] if p.trans_b else b[bb, k, j]

    def store(bi, i, j, value):
        target = y[bi, i, j] if p.store_index is None else \
            y_full[p.store_index(p.anchor_index(bi, i, j))]
        return L.Store(target.buffer, target.indices, p.finish(value, bi, i, j))

    body = (product or tiled_product)(c, p.batch, p.m, p.n, p.k,
                                      Operand(a_at, p.trans_a, array=True, rounded=p.a_tf32),
                                      Operand(b_at, not p.trans_b, array=True,
                                              rounded=p.b_tf32), store)
    views: dict[str, L.Buffer] = {}
    for x in (a, b, y if p.store_index is None else y_full, p.c):
        if x is not None:
            views.setdefault(x.name, x)   # A first, should A also be B
    return L.PrimFunc(p.name, tuple(views.get(x.name, x) for x in p.params), body)


@dataclass(frozen=True)
class Operand:
    """How a tiled product reads one operand: `at(bi, row, k)` its element in its storage
    type (row: i of A, j of B; indices in range), and whether consecutive rows are
    consecutive in memory (else consecutive k are): the copy into shared memory walks that
    dimension fastest. `array`: `at` is a load of a plain global array whose last dimension
    is that contiguous one (a run along it is one span of memory: the tensor-core tiles may
    copy it with cp.async); a gather (a convolution's patches) is not. `chunk`, for a gather
    whose runs along k are contiguous in memory (a channels-last image's patches: a run of
    channels of one tap): `chunk(bi, row, k)` (indices in range) is (a load of element (row,
    k) of a plain global array whose following elements along its last dimension are (row,
    k + 1), ... up to the next multiple of 16 bytes, whether (row, k) is inside the operand
    rather than padding), so the tensor-core tiles copy the run with one zero-filling
    cp.async. `word`, for 8-bit elements (the integer tensor cores, int8.py): `word(bi, row,
    kw)` (indices in range) is elements (row, 4 kw) .. (row, 4 kw + 3) as the bytes of a
    uint32, the first lowest, so that the tiles stage a word at a time. `rounded`: its
    float32 values are tf32 values already (weights rounded at compile time,
    `packed.round_tf32`): a tf32 product's tiles copy them as they are, unrounded.
    `im2col`, for a gather that TMA's im2col mode copies (a channels-last convolution's
    patches: conv_nhwc.Im2col): `im2col.tensor_map(rows, k_tile)` is the map of a tile of
    `rows` patch rows by `k_tile` (or None where there is none), `im2col.place(row, k)` the
    copy's coordinates and offsets of the tile from patch row `row`, k `k` on."""

    at: Callable[[L.Expr, L.Expr, L.Expr], L.Expr]
    rows_contiguous: bool
    array: bool = False
    chunk: Callable | None = None
    word: Callable | None = None
    rounded: bool = False
    im2col: object | None = None

    @property
    def dtype(self) -> T.DType:
        """The operand's storage type (float32, float16 or bfloat16): what `at` reads."""
        zero = L.const(0)
        return self.at(zero, zero, zero).dtype


def tiled_product(c: DenseConfig, batch: int, m: int, n: int, k: int, a: Operand,
                  b: Operand, store: Callable) -> L.Stmt:
    """The blocks, threads and loops of Y[bi, i, j] = sum_k A[bi, i, k] B[bi, k, j] (see the
    module's docstring); `store(bi, i, j, value)` is the statement storing an element."""
    bm, bn, bk = c.tile_m, c.tile_n, c.tile_k
    bi, by, bx = L.Var("bi"), L.Var("by"), L.Var("bx")
    threads = c.threads
    tiles = -(-k // bk)
    per = -(-tiles // c.split_k)          # k tiles per slice
    past_k = k % bk != 0 or tiles % c.split_k != 0   # a tile reads past k
    acc = L.Buffer("acc", T.float32, (c.thread_m * c.thread_n,), L.Scope.LOCAL)
    row0, col0 = by * bm, bx * bn
    a_in = _Staged("a", bm, row0, m, a, bk, k, threads, past_k, bi)
    b_in = _Staged("b", bn, col0, n, b, bk, k, threads, past_k, bi)
    t, kk, ii, jj = L.Var("t"), L.Var("kk"), L.Var("ii"), L.Var("jj")
    tm, tn = L.Var("tm"), L.Var("tn")
    row, col = _micro_tile(c.thread_m, bm, tm), _micro_tile(c.thread_n, bn, tn)

    def per_thread(body):
        """`body` on every thread, with its row and column offsets tm and tn."""
        offset_m, offset_n = _thread_offsets(c, t)
        return L.For(t, threads, L.Let(tm, offset_m, L.Let(tn, offset_n, body)),
                     L.ForKind.THREAD_X)

    def each(body):
        return L.For(ii, c.thread_m, L.For(jj, c.thread_n, body, L.ForKind.UNROLLED),
                     L.ForKind.UNROLLED)

    slot = (ii * c.thread_n + jj,)
    init = per_thread(each(L.Store(acc, slot, L.const(0.0, T.float32))))

    a_frag = L.Buffer("a_frag", T.float32, (c.thread_m,), L.Scope.LOCAL)
    b_frag = L.Buffer("b_frag", T.float32, (c.thread_n,), L.Scope.LOCAL)

    def fragment(frag: L.Buffer, staged: _Staged, place: Callable, buf: L.Expr) -> L.Stmt:
        """A thread's rows of A (columns of B) at k step kk: registers <- shared memory, a
        run of 4 one 128-bit load."""
        (size,) = L.static_shape(frag.shape)
        run, r, v = min(4, size), L.Var(f"{frag.name}_r"), L.Var(f"{frag.name}_v")
        e = r * run + v
        return L.For(r, size // run, L.For(v, run, L.Store(
            frag, (e,), staged.tile[staged.at(buf, kk, place(e))]), L.ForKind.VECTORIZED),
            L.ForKind.UNROLLED)

    def update(buf):
        return per_thread(L.For(kk, bk, L.seq(
            fragment(a_frag, a_in, row, buf), fragment(b_frag, b_in, col, buf),
            each(L.Store(acc, slot, L.call("fma", a_frag[ii], b_frag[jj], acc[slot])))),
            L.ForKind.UNROLLED))

    def product(first: L.Expr) -> L.Stmt:
        """The k tiles first .. first + per - 1, double buffered: tile s + 1 comes from
        global memory into registers while tile s is multiplied from shared memory, then
        goes to the other shared buffer; one barrier a tile."""
        s = L.Var("ks")
        more = s + 1 < per
        loop = L.For(s, per, L.seq(
            a_in.load(first + s + 1, more), b_in.load(first + s + 1, more), update(s % 2),
            a_in.store((s + 1) % 2, more), b_in.store((s + 1) % 2, more), L.Barrier()))
        return L.seq(a_in.load(first, None), b_in.load(first, None), a_in.store(0, None),
                     b_in.store(0, None), L.Barrier(), loop)

    i, j = row0 + row(ii), col0 + col(jj)
    inside = L.logical_and(i < m, j < n)

    def block(body: L.Stmt) -> L.Stmt:
        for buffer in (a_in.tile, b_in.tile, a_in.stage, b_in.stage, acc, a_frag, b_frag):
            body = L.Allocate(buffer, body)
        return body

    grid = (-(-m // bm), -(-n // bn))
    if c.split_k == 1:
        done = per_thread(each(L.If(inside, store(bi, i, j, acc[slot]))))
        body = block(L.seq(init, product(L.const(0)), done))
        return L.For(bi, batch, L.For(by, grid[0], L.For(
            bx, grid[1], body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y), L.ForKind.BLOCK_Z)
    sk = L.Var("sk")

    def slice_block(bz: L.Var, partial: L.Buffer) -> L.Stmt:
        keep = L.Store(partial, (((sk * batch + bi) * m + i) * n + j,), acc[slot])
        body = block(L.seq(init, product(sk * per), per_thread(each(L.If(inside, keep)))))
        return L.Let(bi, bz // c.split_k, L.Let(sk, bz % c.split_k, body))

    return _split_k(c, batch, m, n, grid, store, slice_block, (by, bx))


WARP_COLUMNS = 8
"""Threads a warp's row of threads spans (a warp takes 4 x 8 thread tiles where the block has
that many, as CUTLASS's SIMT warps): a step of k then reads 4 distinct 128-bit words of A
and 8 of B a warp from shared memory, one wavefront each, against 2 and 16 (3 wavefronts)
with 2 rows of 16."""


def _thread_offsets(c: DenseConfig, t: L.Var) -> tuple[L.Expr, L.Expr]:
    """(row, column) of thread `t` among the block's (tile_m / thread_m) x (tile_n / thread_n)
    thread tiles: each warp a 4 x 8 block of them (WARP_COLUMNS), the warps row-major; a
    grid too small for that row-major throughout."""
    across_m, across_n = c.tile_m // c.thread_m, c.tile_n // c.thread_n
    cols = min(across_n, WARP_COLUMNS)
    rows = 32 // cols
    if across_m % rows or across_n % cols:
        return t // across_n, t % across_n
    warp, lane, warps_n = t // 32, t % 32, across_n // cols
    return warp // warps_n * rows + lane // cols, warp % warps_n * cols + lane % cols


def _micro_tile(size: int, tile: int, offset: L.Var) -> Callable[[L.Expr], L.Expr]:
    """Element e of a thread's `size` rows (or columns) of a `tile`: runs of up to 4
    consecutive ones (read from shared memory as one vector), the runs `tile / groups`
    apart, thread `offset` taking the offset-th run of each group."""
    run = min(4, size)
    spacing = tile // (size // run)
    return lambda e: e // run * spacing + offset * run + e % run


class _Staged:
    """One operand's bk x `rows` slices on their way to shared memory: copied from global
    memory into each thread's registers in the operand's storage type (`load`), later stored
    into one of the two shared buffers as float32 (`store`). Consecutive threads walk the
    operand's contiguous dimension, each reading 4 consecutive elements as one vector load
    where no bound needs checking (the renderer proves the alignment, or reads them one by
    one). Only k needs checking (`past_k`: 0 past it, element by element): a tile's rows
    past the operand's extent (a ragged edge) read the last row instead (a vector along the
    rows, the last whole vector), since they only reach products of rows (columns) of Y
    that are never stored."""

    def __init__(self, name: str, rows: int, first: L.Expr, extent: int, operand: Operand,
                 bk: int, k: int, threads: int, past_k: bool, bi: L.Var):
        self.rows, self.first, self.extent, self.operand = rows, first, extent, operand
        self.bk, self.k, self.threads, self.checked, self.bi = bk, k, threads, past_k, bi
        self.edge = extent % rows != 0
        self.lanes = 1 if past_k or self.edge and operand.rows_contiguous and extent % 4 \
            else 4
        self.groups = (rows if operand.rows_contiguous else bk) // self.lanes
        self.vectors = bk * rows // self.lanes
        self.steps = -(-self.vectors // threads)
        self.stride = rows + TILE_PAD
        self.tile = L.Buffer(f"{name}_tile", T.float32, (2 * bk * self.stride,),
                             L.Scope.SHARED)
        self.stage = L.Buffer(f"{name}_stage", operand.dtype, (self.steps * self.lanes,),
                              L.Scope.LOCAL)

    def _place(self, e: L.Expr, v: L.Expr) -> tuple[L.Expr, L.Expr]:
        """(row, k) within the slice of lane v of vector e."""
        if self.operand.rows_contiguous:
            return e % self.groups * self.lanes + v, e // self.groups
        return e // self.groups, e % self.groups * self.lanes + v

    def _each(self, when: L.Expr | None, body: Callable, kind: L.ForKind) -> L.Stmt:
        """body(step, e, v) for every lane of every vector of the slice, over the threads."""
        t, step, e, v = L.Var("t"), L.Var("l"), L.Var("e"), L.Var("v")
        inner = L.For(v, self.lanes, body(step, e, v), kind) if self.lanes > 1 else \
            body(step, e, L.const(0))
        if self.steps * self.threads > self.vectors:
            inner = L.If(e < self.vectors, inner)
        if when is not None:
            inner = L.If(when, inner)
        return L.For(t, self.threads, L.For(step, self.steps, L.Let(
            e, step * self.threads + t, inner), L.ForKind.UNROLLED), L.ForKind.THREAD_X)

    def load(self, kt: L.Expr, when: L.Expr | None) -> L.Stmt:
        """Registers <- k tile `kt` (0 past k; rows past the extent the last row's), if
        `when`."""
        def body(step, e, v):
            r, kk = self._place(e, v)
            row, kg = self.first + r, kt * self.bk + kk
            if self.edge and self.lanes > 1 and self.operand.rows_contiguous:
                base, _ = self._place(e, L.const(0))   # the vector, whole, inside
                row = L.minimum(self.first + base, self.extent - self.lanes) + v
            elif self.edge:
                row = L.minimum(row, self.extent - 1)
            if self.checked:
                value = L.Select(kg < self.k, self.operand.at(
                    self.bi, row, L.minimum(kg, self.k - 1)), L.const(0.0, self.stage.dtype))
            else:
                value = self.operand.at(self.bi, row, kg)
            return L.Store(self.stage, (step * self.lanes + v,), value)
        return self._each(when, body, L.ForKind.VECTORIZED)

    def at(self, buf: L.Expr, kk: L.Expr, r: L.Expr) -> L.Expr:
        """Row `r`, k `kk` of shared buffer `buf` (an offset into `tile`)."""
        return (buf * self.bk + kk) * self.stride + r

    def store(self, buf: L.Expr, when: L.Expr | None) -> L.Stmt:
        """Shared buffer `buf` <- the registers widened to float32, if `when` (a vector's
        lanes, consecutive rows, as one 128-bit store)."""
        def body(step, e, v):
            r, kk = self._place(e, v)
            return L.Store(self.tile, (self.at(buf, kk, r),),
                           problems.widened(self.stage[step * self.lanes + v]))
        return self._each(when, body, L.ForKind.VECTORIZED if self.operand.rows_contiguous
                          else L.ForKind.UNROLLED)


def _split_k(c: DenseConfig, batch: int, m: int, n: int, grid, store, block,
             tile_vars) -> L.Stmt:
    """Split-k as two launches over one workspace of `split_k` partial products: the tiled
    product with blockIdx.z over (batch, slice) writing its slice's partial sums (`block(bz,
    partial)` is a block's body), then a thread per output adding the slices and storing
    through `store` (scaling, bias, epilogue, layout tail)."""
    by, bx = tile_vars
    bz = L.Var("bz")
    partial = L.Buffer("partial_sums", T.float32, (c.split_k * batch * m * n,), L.Scope.GLOBAL)
    products = L.For(bz, batch * c.split_k, L.For(by, grid[0], L.For(
        bx, grid[1], block(bz, partial), L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y),
        L.ForKind.BLOCK_Z)
    total, threads = batch * m * n, 256
    ob, ot, e = L.Var("ob"), L.Var("ot"), L.Var("e")
    bi, i, j = e // (m * n), e // n % m, e % n
    value = partial[e]
    for s in range(1, c.split_k):
        value = value + partial[s * total + e]
    sums = L.For(ob, -(-total // threads), L.For(ot, threads, L.Let(
        e, ob * threads + ot, L.If(e < total, store(bi, i, j, value))), L.ForKind.THREAD_X),
        L.ForKind.BLOCK_X)
    return L.Allocate(partial, L.seq(products, sums))


DENSE = Template("cuda_dense", problems.dense, applies, space, default, build)
