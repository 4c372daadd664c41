"""The cuda tensor-core templates: dense products and convolutions on `mma.sync` when the
compile's precision (`Target.precision`) is tf32, fp16 or bf16; fp32 compiles never see
them.

A block computes a `block_m` x `block_n` tile of Y (blockIdx.z: the batch; blockIdx.x down
GROUP_ROWS row tiles, then across the column tiles, then the next group, so that blocks
running together share operand tiles in L2 (`_grouped`); blockIdx.y and x when fewer row
tiles) with `warps_m` x `warps_n` warps; warp (wy, wx) owns a
(block_m / warps_m) x (block_n / warps_n) part of it, a grid of 16 x 8 mma tiles, each with
4 fp32 accumulators a lane (`L.Mma`'s C fragment).

Shared memory. k goes in tiles of `block_k` through a ring of `stages` slots, each holding
both operands' tiles already in the precision's type (`_Tile`): 16-bit elements two to a
word for fp16 and bf16, 32-bit words for tf32 (rounded once as they are staged through
registers; copied as float32 by cp.async and rounded as fragments). A tile is
rows of 16-byte chunks (8 16-bit or 4 tf32 elements) along the dimension the operand is
contiguous in, k or its rows (i of A, j of B; tf32 always k: ldmatrix cannot transpose 32-bit
elements); chunk c of row o sits at chunk c ^ f(o) (an XOR swizzle, f in `_Tile.word`) so
that the 8 rows an ldmatrix reads at one chunk and the 8 chunks a phase of stores writes fall
in distinct banks, without padding. An operand stored in global memory as a plain array
(`Operand.array`) in the tile's type (the 16-bit precision's; for tf32 float32 contiguous
along k) whose contiguous extent is a multiple of a chunk is copied with `cp.async`
(`L.CopyAsync`, 16 bytes, zero-filled past m, n or k), a group a k tile; any other (fp32
storage at fp16 / bf16, tf32 operands contiguous along their rows, a convolution's gathered
patches, an odd extent) goes through
registers: loaded a k tile ahead (4 elements a vector load where no edge needs checking), then
rounded / packed to the precision and stored as 16-byte chunks after the tile's product.
Loop: `stages - 1` tiles are fetched ahead; at each k tile the thread waits for its oldest
copy group, one barrier, the fetch of the tile `stages - 1` ahead into the slot freed by the
previous tile, then the product of this tile.

Fragments. Per mma step of k (8 for tf32, 16 for fp16 and bf16) each warp loads its A
fragments (one `ldmatrix.x4` per 16 rows) and B fragments (one per 16 columns: two mma
tiles), `.trans` where the tile's rows are the operand's rows (16-bit only; tf32 moves its
32-bit elements as pairs of 16-bit ones, which an 8 x 8 b16 matrix holds in PTX's tf32
fragment order), double buffered: step s + 1's while step s's mmas run. The epilogue stores each accumulator through the
problem's store (Gemm's scaling and bias, the fused epilogue, the layout tail; a conv's
bias), guarded at the edges. `split_k` > 1 splits k over blockIdx.z as dense.py does (partial
sums in a workspace, a second launch adds them; with `cluster_split` on sm_90 the slices'
blocks form a cluster that sums them through distributed shared memory: CLUSTER_SPLITS).

Which kernels: every dense / batched matmul of at least 16 rows and ungrouped conv2d (an
implicit GEMM, patches gathered as conv.py does) that the fp32 templates would tile; the
matrix-vector products (fewer than 16 rows) keep the gemv template (an mma would idle most
of a 16-row tile), depthwise convolutions the default one. Channels-last convolutions
(ConvNHWC) are `conv_nhwc.py`'s, on this product with the patches copied by cp.async
(`Operand.chunk`).

Shared tiles beyond 48 KiB (up to MAX_SHARED_BYTES) are one dynamic pool (codegen.py).

On sm_90 the `wgmma` knob swaps the warps' mma.sync for warpgroups' wgmma.mma_async on the
same shared tiles (`wgmma.py`, which says why it is a knob), in the dense and conv spaces
at every precision; the dense default picks it on sm_90 at fp16 and bf16, and at tf32 where
both operands hold tf32 values (`WGMMA_DEFAULT`, `WGMMA_PRECISIONS`, `wgmma_by_default`;
DNNC_WGMMA=0 turns it off, =1 on at tf32 always), with the TMA producer where TMA copies its
operands (`PRODUCER_DEFAULT`, `tf32_copied`).

With the `staged` knob (staged.py) results go through shared memory and are stored in
vector runs, through epilogues that read memory too; the defaults stage a 16-bit Y
(`staged_by_default`). Not yet: the next k
tile's first fragments loaded before this tile's last mmas (CUTLASS's overlap of the
barrier); fp32 operands at fp16 / bf16 and tf32 operands
contiguous along their rows through cp.async (converting or transposing in shared memory);
measured EFFICIENCY figures.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace

from ...ir import loop as L
from ...ir import types as T
from ...ir.target import GPU
from .. import problems
from ..space import Constraint, Space, Template
from . import conv as conv_template
from . import dense as dense_template
from .dense import MAX_GRID_YZ, MIN_SPLIT_K, SPLITS, Operand, min_blocks
from .device import REFERENCE, gpu_of, has_wgmma

PRECISIONS = ("tf32", "fp16", "bf16")
"""The precisions these templates serve (`Template.precisions`)."""

STORAGE = {"fp16": T.float16, "bf16": T.bfloat16, "s8": T.int8, "u8": T.uint8}
"""A 16-bit precision's element type: an operand stored so is copied with cp.async (s8, u8:
int8.py's integer precisions, A's type: 4 a word, tiles along k as tf32's, int32 sums)."""

WARP = 32
CHUNK_WORDS = 4
"""Words of a 16-byte chunk: a row of an ldmatrix matrix, one cp.async, one vector store."""

MAX_SHARED_BYTES = 99 << 10
"""A block's shared tiles at most: what sm_86 and sm_89 allow (sm_80: 163 KiB, sm_90: 227
KiB); beyond 48 KiB the renderer makes them one dynamic pool (`codegen.STATIC_SHARED_BYTES`).
"""

MAX_WGMMA_SHARED_BYTES = 227 << 10
"""A block's shared tiles at most with the `wgmma` knob (sm_90 only: its limit)."""

MAX_ACCUMULATORS = 128
"""fp32 accumulators a lane at most (a 64 x 64 warp tile): beyond, registers spill."""

# (block_m, block_n, warps_m, warps_n) a default tries, largest first, and the fraction of the
# tensor cores' peak each is guessed to reach (a rough ranking, not measured yet:
# bench/gpu_kernels.py --precision measures it); each with the deepest k tile (`_deepest`)
# that DEFAULT_STAGES slots fit in MAX_SHARED_BYTES. 64 x 64 warp tiles for the large ones
# (CUTLASS's and Triton's choice on sm_80: 128 accumulators a lane, no spills)
DEFAULTS = ((128, 256, 2, 4), (128, 128, 2, 4), (128, 64, 2, 2), (64, 128, 2, 2),
            (64, 64, 2, 2), (32, 64, 1, 2), (32, 32, 1, 2), (16, 32, 1, 2))
EFFICIENCY = (0.75, 0.7, 0.55, 0.55, 0.4, 0.25, 0.15, 0.08)
DEFAULT_STAGES = 3
# the model's throughput is the device's tf32 tensor-core figure (`GPU.tensor_flops`, for
# every precision), a split costs as in dense.py
LAUNCH_S = 2e-6

GROUP_ROWS = 8
"""Row tiles a group of consecutive blocks runs down before moving across (`_grouped`)."""

CLUSTER_SPLITS = (2, 4, 8)
"""k slices a `cluster_split` product may have: the blocks of one output tile's slices form
a cluster (at most 8 blocks: the portable size on sm_90), each stages its float32 sums in its
shared memory and sums a 1 / split_k share of the tile's rows over the cluster's blocks
(`staged.cluster_results`): one launch, no float32 partials in global memory."""


PRODUCER_WARPS = 4
"""Warps of the `producer` knob's copying threads (wgmma.py): a warpgroup. One warp (a
quarter of the arrivals, 288 threads a 128 x 256 block) spilled: its 96 copies a lane keep
their addresses in registers across the k loop, and ptxas allocates the block's registers
for its busiest thread (NVRTC, sm_90a: 128 x 256 tiles 840 bytes of spills at 168
registers)."""


@dataclass(frozen=True)
class TensorCoreConfig:
    """Knobs of the tensor-core templates."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warps_m: int = 2
    warps_n: int = 4
    stages: int = 3      # shared slots of the k ring (stages - 1 tiles fetched ahead)
    split_k: int = 1     # k slices summed by a second launch (fills the GPU when m n is small)
    wgmma: bool = False  # warpgroups of warps_m / 4 x warps_n issue wgmma (sm_90: wgmma.py)
    early_refill: bool = False   # with wgmma: a second barrier a k tile, stages - 1 ahead
    refill_first: bool = False   # with wgmma: a k tile's refill issued before its wgmmas
    staged: bool = False   # results through shared memory, stored in runs of a row (staged.py)
    cluster_split: bool = False   # with wgmma: the k slices of a tile one cluster, summed in it
    # with wgmma: PRODUCER_WARPS more copy the k tiles (mbarriers), by cp.async (True) or
    # by TMA (PRODUCERS' "tma": one thread's bulk tensor copies, wgmma.py)
    producer: bool | str = False

    @property
    def threads(self) -> int:
        """The block's threads: its warps', and the producer's (`producer`)."""
        return WARP * (self.warps_m * self.warps_n + PRODUCER_WARPS * bool(self.producer))


PRODUCERS = (False, True, "tma")
"""The `producer` knob's values: none (the warps copy), a warpgroup copying by cp.async, a
warpgroup one thread of which copies by TMA (fp16 / bf16 operands, and float32 ones holding
tf32 values at tf32)."""
TMA_PRECISIONS = ("tf32", "fp16", "bf16")
"""Precisions whose k tiles TMA copies (a box row of 128 bytes: 64 16-bit elements, 32 float32
ones; at tf32 only operands holding tf32 values already, `Operand.rounded`: TMA copies words
as they lie and wgmma ignores their low bits, so an operand to round keeps the plain loop)."""


STAGES = (2, 3, 4, 5, 8)
"""The stages knob's values: 8 slots for WGMMA_TALL_TILE's 128 x 64 block (its ring of 24 KiB
slots, the depth session 50's sweep timed it at)."""


def product_space(name: str, k: int, batch: int, precision: str, arch: str | None = None
                  ) -> Space:
    """The knobs of a tensor-core product of depth `k`, `batch` of them (dense and conv), at
    `precision`; the `wgmma` knob on where `arch` has it (sm_90)."""
    from . import wgmma   # (it builds on this module's tiles)

    warpgroups = arch is not None and has_wgmma(arch)
    return Space(name, TensorCoreConfig, {
        "block_m": (16, 32, 64, 128, 256), "block_n": (32, 64, 128, 192, 256),
        "block_k": (16, 32, 64), "warps_m": (1, 2, 4, 8), "warps_n": (1, 2, 4),
        "stages": STAGES, "split_k": SPLITS, "wgmma": (False, True)[:1 + warpgroups],
        "early_refill": (False, True)[:1 + warpgroups],
        "refill_first": (False, True)[:1 + warpgroups], "staged": (False, True),
        "cluster_split": (False, True)[:1 + warpgroups],
        "producer": PRODUCERS[:1 + 2 * warpgroups],
    }, [Constraint("a warp's rows (block_m / warps_m) and columns (block_n / warps_n) "
                   "multiples of 16",
                   lambda c: c.block_m % (16 * c.warps_m) == 0 and
                   c.block_n % (16 * c.warps_n) == 0),
        Constraint(f"at most {MAX_ACCUMULATORS} accumulators a lane",
                   lambda c: c.wgmma or _accumulators(c) <= MAX_ACCUMULATORS),
        Constraint(f"with wgmma: k tiles of {wgmma.block_k(precision)} (128 bytes), warps_m "
                   "a multiple of 4, a warpgroup's columns 64, 128, 192 or 256 and rows whole "
                   "m64 tiles, at most 128 accumulators a thread, at least 3 stages (2 "
                   "with early_refill)",
                   lambda c: not c.wgmma or wgmma.fits(c, precision)),
        Constraint("early_refill only with wgmma", lambda c: c.wgmma or not c.early_refill),
        Constraint("refill_first only with wgmma, not with early_refill",
                   lambda c: not c.refill_first or c.wgmma and not c.early_refill),
        Constraint(f"cluster_split only with wgmma, a split_k of {CLUSTER_SPLITS} dividing "
                   "block_m", lambda c: not c.cluster_split or c.wgmma and
                   c.split_k in CLUSTER_SPLITS and c.block_m % c.split_k == 0),
        Constraint("producer only with wgmma, neither early_refill nor refill_first",
                   lambda c: not c.producer or c.wgmma and not c.early_refill and
                   not c.refill_first),
        Constraint(f"a TMA producer only at {' or '.join(TMA_PRECISIONS)}",
                   lambda c: c.producer != "tma" or precision in TMA_PRECISIONS),
        Constraint(f"the stages' shared tiles (and staged results) within "
                   f"{MAX_SHARED_BYTES >> 10} KiB ({MAX_WGMMA_SHARED_BYTES >> 10} KiB with "
                   "wgmma)",
                   lambda c: shared_bytes(c, precision) <= _shared_limit(c)),
        Constraint("split_k at most the k tiles, batch * split_k blocks on grid z",
                   lambda c: c.split_k <= -(-k // c.block_k) and
                   batch * c.split_k <= MAX_GRID_YZ)])


def _accumulators(c: TensorCoreConfig) -> int:
    return (c.block_m // c.warps_m) * (c.block_n // c.warps_n) // WARP


def shared_bytes(c: TensorCoreConfig, precision: str) -> int:
    """Bytes of shared memory a block of config `c` takes at `precision`: its ring of
    tiles, or the staged results where they take more (they reuse the ring's memory), and
    with `producer` its barriers' 1024 bytes (beside them: never reused)."""
    ring = c.stages * c.block_k * (c.block_m + c.block_n) * _element_bytes(precision)
    barriers = L.SWIZZLE_BYTES if c.producer else 0   # the producer's mbarriers (wgmma.py)
    if c.staged and c.split_k == 1 or c.cluster_split and c.split_k > 1:
        from .staged import staging_bytes   # (it builds on this module's tiles)
        return max(ring, staging_bytes(c)) + barriers
    return ring + barriers


def _shared_limit(c: TensorCoreConfig) -> int:
    return MAX_WGMMA_SHARED_BYTES if c.wgmma else MAX_SHARED_BYTES


def _element_bytes(precision: str) -> int:
    return 4 if precision == "tf32" else 1 if precision in L.INTEGER_MMA else 2


def _deepest(block_m: int, block_n: int, precision: str) -> int:
    """The largest block_k of at most 32 whose DEFAULT_STAGES slots fit in shared memory."""
    for bk in (32, 16):
        config = TensorCoreConfig(block_m, block_n, bk, stages=DEFAULT_STAGES)
        if shared_bytes(config, precision) <= MAX_SHARED_BYTES:
            return bk
    return 16


WGMMA_DEFAULTS = ((128, 256, 8, 1, 4, False), (128, 192, 8, 1, 5, True),
                  (128, 128, 8, 1, 5, True), (64, 192, 4, 1, 5, True), (64, 128, 4, 1, 5, True),
                  (64, 64, 4, 1, 4, False))
WGMMA_EFFICIENCY = (0.95, 0.85, 0.75, 0.8, 0.5, 0.6)
DENSE_WGMMA_EFFICIENCY = (0.95, 0.85, 0.75, 0.8, 0.6, 0.6)
CONV_WGMMA_EFFICIENCY = (0.95, 0.85, 0.75, 0.8, 0.65, 0.6)
"""(block_m, block_n, warps_m, warps_n, stages, refill_first) the default tries with the
`wgmma` knob (warpgroups down m: 64 x 256, 64 x 192, 64 x 128 or 64 x 64 each, as CUTLASS's
sm_90 kernels), k tiles of 128 bytes, and their guessed fractions of the peak on DEFAULTS'
scale (wgmma's peak is about 1.5 times mma.sync's on Hopper), fitted on an H200 sweep
(bench/gpu_kernels.py --variant-set pipeline, fp16 stored in and out and tf32, eight shapes of
4096^3, the 8192-row FFN and the vit b32 / bert b8 / convnext b32 products of k >= 768): the
model's pick is within 1.04 of the fastest tile timed on average (1.17 with the tiles before;
worst 1.43, bert b8's fc2 at tf32, which keeps mma.sync: TF32_WGMMA_OUTPUTS).
- 128 x 256, 4 stages: the fastest at 4096^3 and 8192 x 768 x 3072 (n 3072), where
  `refill_first` took 1-2% longer.
- 128 x 192 and 64 x 192 (`refill_first`) where n is 192, 384 or 768: 8192 x 3072 x 768 (m x k x
  n) 68.7-69.7 us against 82.9 for the 128 x 128 default then (fp16; tf32 131 against 155),
  convnext's 6272 x 1536 x 384 19.0 against 24.2, 25088 x 768 x 192 21.9 against 26.5, 1568 x 3072
  x 768 22.3 against 26.1 (tf32 43.5 against 52.9).
- 128 x 128 in 5 stages, `refill_first`: 5-11% faster with it at every shape timed (4096^3 fp16
  261 us against 281; 8192 x 3072 x 768 74.1 against 82.9).
- 64 x 64 (one warpgroup, 4 stages) for products of a few hundred rows (batch 1: vit's 197,
  bert's 128): on an H200 at fp16 the fastest tile at all seven such shapes timed, 7.1 to 10.6
  us, against the 64 x 128 default's 7.1 to 12.6; `refill_first` within 2% either way.
- DENSE_WGMMA_EFFICIENCY, the dense products' (convolutions kept these: their tiles were not
  timed): 64 x 128 0.5 -> 0.6 (session 45's H200 sweep, .devrun/s45_sweep.py: fp16 / bf16 in
  and out, 17 transformer shapes, 7 wgmma tiles x splits each, graphs interleaved with
  cuBLAS): it was the fastest tile at 256 x 768 x 3072 (6.3 / 6.2 us against 64 x 64's 6.8 /
  6.8) and 1024 x 768 x 768 (6.4 / 6.1 against 7.0 / 6.8); the default's time over the fastest
  timed, geometric mean of the 34 shape-precision pairs, 1.005 (worst 1.05) against 1.016
  (1.12).
- CONV_WGMMA_EFFICIENCY, the convolutions' (WGMMA_EFFICIENCY but 64 x 128 0.5 -> 0.65;
  int8.py's products keep WGMMA_EFFICIENCY, untimed with it) (session 52, H200, fp16,
  batch 32, bench/gpu_conv.py, two rounds in one call): resnet50's 3 x 3 convs of 128
  channels (H 56 stride 2, H 28) moved from 64 x 64 to 64 x 128 (5 stages, refill_first,
  staged), 0.0296-0.0301 ms -> 0.0240-0.0245 (cuDNN 0.026: 0.87-0.89 -> 1.08); the 23 shapes
  weighted 1.154 / 1.164 -> 1.136 / 1.136 ms, no other shape moved on the H200 (resnet50's
  1x1 convs deeper than SHALLOW_K take the dense rule: conv_nhwc.py; tf32's keep mma.sync).
  The sweep also fits one line to every lone block's k tile: 190 ns + its FLOPs at 6.25
  TFLOP/s (77% of an SM's peak), from 64 x 64's 258 ns to 128 x 256's 875: a fixed cost a
  k tile that neither the proxy fence (dropping it: 0.97-1.03) nor the refill's place moves."""

SM_SHARED_BYTES = 227 << 10
"""Shared memory of an SM on sm_90 (sm_80: 163 KiB; the model counts sm_90's): with the
block's threads and registers (its accumulators and ~64 more a thread) it bounds the blocks an
SM holds at once, `resident`. Blocks past a whole number of such waves wait for a wave of
their own: the model counts whole waves (a block's time in a wave as its share of the SM).
A wgmma block is taken to fill its SM alone, so its wave is one block an SM: the busiest SM's
blocks count, whatever else fits beside them (192 blocks of 64 x 64 on 132 SMs rate as two,
not as one wave of three). With WGMMA_SPLIT_S this was fitted on an H200 sweep (session 44's
device run: CUDA graphs, 16-bit in and out, tf32 operands tf32 values; M x 3072 x
768 for M = 128 ... 2048 with 8 to 15 tiles and splits each, batch-1 and 1024-row 768 x 768 /
768 x 192 products): the default's time over the fastest timed, geometric mean over the 50
of 51 shape-precision pairs whose pick was timed, 1.020 (worst 1.46: tf32's 512 x 3072 x 768
on mma.sync, 22.2 us against 15.2 for 64 x 192 wgmma split 4), against 1.048 for whole waves,
6 us and wgmma at tf32 from 1M outputs, 1.029 with 6 us; the best of 32 (wave rule, split
cost 3 to 6 us, TF32_WGMMA_OUTPUTS) triples scored. Moved, us, this default / the one before
/ cuBLAS (fp16, bf16, tf32):

| m x k x n | fp16 | bf16 | tf32 |
| --- | --- | --- | --- |
| 1024 x 3072 x 768 (bert b8 fc2: 64 x 192 split 2) | 16.1 / 20.6 / 11.5 | 15.7 / 20.4 / 11.0 | 24.7 / 36.1 / 24.2 |
| 256 x 3072 x 768 (64 x 192 split 8) | 8.6 / 9.1 / 8.3 | 8.2 / 8.7 / 7.4 | - |
| 128 x 3072 x 768 (64 x 64 split 4, was 8) | 6.9 / 6.7 / 8.6 | - | - |
| 1024 x 768 x 768, 256 x 768 x 3072 (tf32: wgmma 64 x 64) | - | - | 11.5 / 14.3 / 10.8, 11.2 / 13.5 / 10.9 |

resnet50's 3x3 convs of 512 channels (1568 x 4608 x 512 at batch 32) moved from 64 x 64 to
128 x 256 split 4: 35.0 / 35.4 and 35.5 / 36.4 us (cuDNN 23.9, 22.4; 128 x 128 split 2 took
30.5, 31.0: not the model's pick). Left below 0.8 of cuBLAS: 512 x 3072 x 768 at fp16 (13.0
us unsplit 64 x 64, which the model rates faster than 64 x 192 split 4's 10.7; cuBLAS 8.2: now
WGMMA_TILE_S's pick) and 1024 x 3072 x 768 (0.71), where a split's second launch and fp32
partials take their share (a split summed inside the kernel would not pay them)."""

WGMMA_SPLIT_S = 5e-6
"""What a split of k costs a wgmma product beyond its partials' traffic (the second launch,
the blocks' longer prologue): on an H200 at fp16, 64 x 64 split in 2 took 1.8 to 7.2 us more
than unsplit at bert's and vit's batch-1 shapes (launched back to back), where the model with
LAUNCH_S chose splits of 4 and 8. Refitted with the wave of one wgmma block an SM on graph
timings (SM_SHARED_BYTES): 6 us kept 128 x 3072 x 768 off wgmma (mma.sync 128 x 64 split 16,
8.4 us at fp16 against 6.7 for 64 x 64 split 8), 4 and 5 us scored alike, 3 us and less moved
products timed only at fp16 (bf16's 512 x 3072 x 768, vit's 197 x 768 x 192) to untimed
splits."""

WGMMA_TILE_S = 190e-9
WGMMA_EPILOGUE_S = 2.25e-6
WGMMA_PARTIALS_S = 2e-6
WGMMA_PARTIALS_IN_L2 = 1.5
WGMMA_MIN_SLICE_TILES = 8
"""The dense default's model of its wgmma tiles at fp16 / bf16 (`_wgmma_seconds`), in place of
the guessed efficiencies (which leave out a k tile's fixed cost) for products deeper than
SHALLOW_K: a block's k tiles one after another, each WGMMA_TILE_S plus its FLOPs at an SM's
share of the peak (2 tensor_flops / sms), then its results, WGMMA_EPILOGUE_S a 128 x 128
tile's worth; blocks in waves of one an SM; a split's second launch WGMMA_PARTIALS_S plus its
float32 partials written and read at WGMMA_PARTIALS_IN_L2 times the copy bandwidth (they stay
in L2), each slice at least WGMMA_MIN_SLICE_TILES k tiles. Fitted on session 46's three H200
sweeps (316 timings, fp16 / bf16 in and out, graphs interleaved with cuBLAS: 64 x 64 to 128 x
256 tiles, splits 1 to 8, the 15 transformer shapes, 4096^3 and five more; session 45's
lone-block fit had the same 190 ns and 6.25 TFLOP/s an SM): rms error of a time 16%; of each
of 77 shape sweeps' timed configs it picks one within 1.003 of the fastest on average (worst
1.07: 128 x 768 x 768 unsplit at bf16, 4.4 us against split 4's 4.1). The slice floor: the
model leaves out what shallow slices pay (blocks sharing an SM, a block's prologue), and
slices of 3 and 6 tiles lost or tied (197 x 768 x 192 64 x 64 split 4 4.9 us against 4.5
unsplit; 256 x 3072 x 768 64 x 192 split 8 8.3 against 64 x 128 split 4's 8.4). Moved, same
call (us, fp16 / bf16, cuBLAS): 512 x 3072 x 768 64 x 64 -> 64 x 192 split 4 12.6 / 13.0 ->
10.8 / 10.8 (8.1 / 8.7), 256 x 3072 x 768 64 x 64 split 2 -> 64 x 128 split 4 9.4 / 9.3 -> 8.4
/ 8.4 (7.7 / 7.8), 1000^3 64 x 64 -> 64 x 128 13.3 / 13.6 -> 10.4 / 11.1 (7.5 / 8.4); every
other transformer shape and 4096^3 keeps its tile."""

WGMMA_TALL_TILE = TensorCoreConfig(128, 64, 64, 8, 1, 8, wgmma=True)
WGMMA_TALL_TILE_S = 140e-9
WGMMA_TALL_SM_FLOPS = 8.3e12
WGMMA_TALL_MIN_TILES = 48
"""A dense fp16 / bf16 product's 128 x 64 wgmma block (two warpgroups of 64 x 64 sharing B's
tile, 8 slots, with the TMA producer the default gives it), offered unsplit where its blocks
fill at most one wave (one an SM) and k is at least WGMMA_TALL_MIN_TILES k tiles deep, timed
as a lone block is: a k tile WGMMA_TALL_TILE_S plus its FLOPs at WGMMA_TALL_SM_FLOPS, its
launch and results included (session 50's H200 sweep, bench/gpu_gemm_ab.py --sweep: lone
blocks over 48 k tiles with TMA, 64 x 64 to 128 x 256, fit that line within 9%; 128 x 64
245-254 ns a tile). WGMMA_TILE_S's model, fitted without a producer, rates the block as 64 x
128 (363 ns a tile) and never took it; in one wave no block shares its SM, so the lone
block's time is the product's. The same sweep: 1024 x 3072 x 768 (96 blocks) 128 x 64
unsplit 12.1 / 12.2 us (fp16 / bf16) against the default's 64 x 192 split 2 13.3 (cuBLAS
10.4 at bf16); taken by the default (bench/gpu_kernels.py --graphs, 16-bit in and out, one
call) 12.5 / 12.4 us against cuBLAS's 11.6 / 11.1 (0.93 / 0.89, was 0.81 / 0.79), no other
of issue 31's 30 cells moved. Shallower one-wave products (256 x 768 x 3072: 12 tiles, 128 x
64 4.8 us against 5.2) are left to the model: the line's launch and results were spread
over 48 tiles."""

WGMMA_TF32_TILE_S = WGMMA_TALL_TILE_S
WGMMA_TF32_SM_FLOPS = WGMMA_TALL_SM_FLOPS / 2
"""A tf32 k tile in WGMMA_TILE_S's model of a dense product whose operands TMA copies
(`tf32_copied`): WGMMA_TALL_TILE_S plus its FLOPs at half WGMMA_TALL_SM_FLOPS (tf32's rate),
the TMA producer's lone-block line (WGMMA_TILE_S' 190 ns and 6.25 TFLOP/s an SM were fitted
without a producer). On session 51's H200 call (bench/gpu_gemm_ab.py --precisions tf32: 69
timings of TMA tiles over issue 31's 15 shapes, graphs interleaved with cuBLAS) it put each
time within 10% rms (log), against 32% for WGMMA_TILE_S' figures at tf32's rate, and of the
tiles timed at each shape picked one within 1.011 of the fastest on average (worst 1.10:
256 x 768 x 3072, 64 x 128 8.1 us against 128 x 64's 7.4; WGMMA_TILE_S' figures 1.018,
2048 x 3072 x 768 split in 2 on 128 x 192, 34.7 us against 64 x 192's 31.3)."""

CLUSTER_SPLIT_S = 4e-6
"""What a `cluster_split` costs a wgmma product in the model (its blocks' staged tiles summed
over the cluster through distributed shared memory, two cluster barriers; no second launch,
no float32 partials in global memory), where DNNC_CLUSTER_SPLIT=1 lets the default take one
(only for split blocks within CLUSTER_WAVES waves). Off by default: on an H200 (session 45's
sweep, fp16 / bf16 in and out) the cluster sum cost more than the second launch it saves.
64 x 64 split 4 at 128 x 3072 x 768 took 7.5 us summed in clusters against 6.5 in two
launches; 64 x 192 split 4 at 512 x 3072 x 768 22.8 (256 blocks: clusters of 4 on GPCs of
one 64 x 192 block an SM) against session 44's 10.7; at 128 rows, in one wave, 11.9 against
9.1, of which 5.2 is the k loop: about 6.7 us to stage and sum 48 KiB a block through scalar
`ld.shared::cluster` loads. It won only at vit's 197 x 768 x 192 (64 x 64 split 4: 4.7 us
against 5.0 unsplit). With it on, the default's time over the fastest timed (geometric mean
of 34 shape-precision pairs) went from 1.005 to 1.12 (CLUSTER_SPLIT_S 8 us), 1.22 (4 us), 1.59
(1 us). The tuner may still pick it (the knob stays in the space)."""

CLUSTER_WAVES = 1
"""The most waves (blocks an SM at once: one for a wgmma block) a cluster split's blocks
may take in the default (see CLUSTER_SPLIT_S)."""

DNNC_CLUSTER_SPLIT = "DNNC_CLUSTER_SPLIT"
"""=1: the dense default may sum a split of k in its cluster (CLUSTER_SPLIT_S); unset or 0,
every split is summed by a second launch."""

MMA_UNDER_WGMMA = 0.75
"""mma.sync's tiles' efficiencies where wgmma is on offer. First fitted on a sweep whose
mma.sync rows at fp16 were not what they said (bench/gpu_kernels.py's variants inherited
the default's wgmma knob and fell outside the space: only wgmma tiles were timed). Timed
right (H200, fp16 stored, eleven shapes of vit, bert and convnext at batch 1 and 32),
mma.sync's small tiles are the fastest at some of them (6304 x 192 x 576: 32 x 64 14.0 us
against the best wgmma tile's 19.4), but a search over this value, the small tiles'
efficiencies and the wgmma split cost left 0.75 the best this throughput model does
(chosen within 1.13 of the fastest on average, worst 1.47): what it lacks is the latency
of a block's k loop, which products of k = 192 are bound by."""

SHALLOW_K = 256
SHALLOW_EFFICIENCY = (0.3, 0.35, 0.4, 0.4, 0.5, 0.6, 0.45, 0.3)
"""Products of k at most SHALLOW_K where wgmma is on offer (the dense products at fp16 and
bf16 on sm_90, what was measured; convolutions and tf32 keep EFFICIENCY) but for those
SHALLOW_STAGED_TILE takes (a staged 16-bit Y of SHALLOW_STAGED_OUTPUTS or more): each DEFAULTS
tile's guessed efficiency there, and no wgmma tile. A block of a few k tiles spends its
time filling its pipeline and storing its outputs, which small tiles in many blocks overlap: on an H200 at fp16, 6304 x 192 x 576
(vit's qkv at batch 32) took 14.0 us in 32 x 64 tiles, 17.2 in 64 x 64, 19.4 in the best
wgmma tile, 21.8 in 128 x 128; a `dnnc tune` of vit at batch 32 took one of its k = 192
products from 42.7 us (the wgmma default) to 20.3 (32 x 64, mma.sync). At vit's batch-1
shapes (197 rows) 16 x 32 to 64 x 64 were within 10% of each other."""

SHALLOW_LARGE = 8 << 20
SHALLOW_LARGE_TILE = TensorCoreConfig(128, 128, 64, 2, 2, 3)
"""Shallow products (k at most SHALLOW_K, where wgmma is on offer) of at least SHALLOW_LARGE
outputs take SHALLOW_LARGE_TILE (k tiles of 64, mma.sync): on an H200 at fp16 it was the
fastest tile timed at convnext_tiny's batch-32 products of k 96 and 192 (100352 x 96 x 384:
66.2 us against 78.7 for the 32 x 64 of SHALLOW_EFFICIENCY, cuBLAS 61.1; 25088 x 192 x 768:
41.4 against 51.1, cuBLAS 45.5), where at vit's 6304 x 192 x 576 (3.6 M outputs) 32 x 64 was
(14.0 against 19.7)."""

SHALLOW_STAGED_OUTPUTS = 1 << 20
SHALLOW_STAGED_TILE = TensorCoreConfig(128, 128, 64, 8, 1, 3, wgmma=True, refill_first=True)
"""Shallow products (k at most SHALLOW_K, where wgmma is on offer) of at least
SHALLOW_STAGED_OUTPUTS results that are staged (`results_staged`: a 16-bit Y) take
SHALLOW_STAGED_TILE (its k tile the precision's `wgmma.block_k`), staged: they are bound by
storing Y, which the staged tile stores in whole lines, and a few k tiles need few slots (3:
two blocks an SM). On an H200 (bench/gpu_kernels.py --graphs, 16-bit in and out, us, against
the defaults before: 32 x 64 x 32 or 128 x 128 x 64 mma.sync stored directly; cuBLAS):

| m x k x n | fp16 | fp16 before | cuBLAS | bf16 | bf16 before | cuBLAS |
| --- | --- | --- | --- | --- | --- | --- |
| 6304 x 192 x 768 (vit b32 fc1) | 10.4 | 13.4 | 6.8 | 9.6 | 13.9 | 6.7 |
| 100352 x 96 x 384 (convnext b32) | 49.3 | 78.5 | 33.1 | 49.8 | 87.5 | 32.9 |
| 25088 x 192 x 768 (convnext b32) | 28.9 | 44.7 | 21.5 | 28.9 | 50.8 | 21.4 |

5 slots took 10.1 / 58.8 / 32.3 us at fp16 (128 x 128 x 64 mma.sync staged 11.5 / 44.2 /
29.0, at bf16 12.7 / 51.0 / 31.1; 64 x 64 wgmma staged 9.1 / 57.1 / 34.9). A second run: vit's
6304 x 192 x 576 6.3 us (cuBLAS 6.6; 10.9 before); of 8 tiles with more blocks an SM none
faster at every shape: 128 x 64 wgmma (3 slots) 8.2 us at vit's fc1 but 52.5 / 29.9 at
convnext's (this tile 50.4 / 29.3), 128 x 64 x 32 mma.sync 46.2 at 100352 x 96 x 384 but 33.9
at 25088 x 192 x 768."""

SHALLOWEST_K = 32
"""mma.sync tiles whose k tile would be shallower (128 x 256 at tf32: 16 deep in 3 stages)
are not tried: at tf32 on an H200, 100352 x 96 x 384 ran 185 us so against 88.7 for
128 x 128 x 32 (cuBLAS 89.3)."""

WGMMA_DEFAULT = True
"""Whether the default config may pick the `wgmma` knob on sm_90 at WGMMA_PRECISIONS when
DNNC_WGMMA is unset (DNNC_WGMMA=0 turns it off; =1 on at every precision). On an H200
(.devrun/wgmma.sh, fp16 then bf16 against cuBLAS): the wgmma default 0.65 / 0.64 at
4096^3 (mma.sync's 0.42 / 0.41), 0.58 / 0.54 at 8192 x 768 x 3072, 0.55 / 0.52 at 8192 x
3072 x 768, 0.73 and 0.65 at 1024 rows (mma.sync 0.70, 0.63); the GPU tests of the product
and of bert_base and mlp at fp16 / bf16 passed."""

WGMMA_PRECISIONS = ("fp16", "bf16", "s8", "u8")
"""Where the default takes wgmma unasked (and at tf32 where both operands are tf32 values
already, `wgmma_by_default`); s8 / u8: int8.py's integer products (DNNC_WGMMA=0 keeps them on
mma.sync): on an H200 a QDQ resnet50 at batch 32 took 2.44 ms so against 2.86 on mma.sync
(bench/gpu_int8.py, 8-bit results staged). At tf32 rounding in the tiles (K-major 32-bit tiles) the same run had
it slower than mma.sync but at 8192 x 768 x 3072 (0.23 against 0.35 at 8192 x 3072 x 768,
0.37 against 0.62 at 1024 x 768 x 3072). Models agree: with DNNC_WGMMA=1 at tf32, batch 32
(H200, bench/gpu_versus.py), resnet18 took 3.83 ms against 1.96 on mma.sync, convnext_tiny
7.94 against 5.24."""


TF32_WGMMA_OUTPUTS = 3 << 18
"""At tf32 (operands tf32 values already: `wgmma_by_default`) the default offers wgmma tiles
only to products deeper than SHALLOW_K with at least this many outputs, unless TMA copies
both operands (`tf32_copied`, session 51: then at any number, as at fp16 / bf16); the others
keep mma.sync's tiles and EFFICIENCY. On an H200 (without TMA; bench/gpu_kernels.py,
operands tf32 values, against cuBLAS tf32): wgmma 0.49 at 4096^3 (mma.sync 0.31), 0.68 at
8192 x 768 x 3072 (0.40), 0.47 at 8192 x 3072 x 768 (0.37), 0.80 at 1024 x 768 x 3072 (0.75), but 0.54 at 1024 x 3072 x
768 (0.8 M outputs) where mma.sync split 4 ways took 0.64; lowered to 1024 x 768 outputs
(bert b8's) with the wave of one wgmma block an SM (SM_SHARED_BYTES' figures: 1024 x 3072 x
768 0.98 of cuBLAS split in 2 on 64 x 192, 1024 x 768 x 768 0.94 against 0.76 on mma.sync);
below, wgmma split 4 was faster at 128 to 512 x 3072 x 768 too (512: 15.2 us against 22.2),
not taken: its batch-1 products untimed; end to end (bench/gpu_env_ab.py,
batch 32) resnet18 gained 13% with wgmma on every conv, where convnext_tiny, whose dense
products are mostly 96 to 384 deep, lost 23% and bert_hf at batch 8 (1024 rows) 14%."""


def wgmma_by_default(arch: str | None, precision: str = "fp16", rounded: bool = False) -> bool:
    """Whether the default config may pick the `wgmma` knob: on sm_90, where DNNC_WGMMA=1,
    or, where WGMMA_DEFAULT and it is unset, at WGMMA_PRECISIONS and at tf32 when both
    operands are `rounded` (tf32 values already, `packed.holds_tf32`: the tiles then round
    nothing, see WGMMA_PRECISIONS)."""
    switch = os.environ.get("DNNC_WGMMA")
    on = WGMMA_DEFAULT and (precision in WGMMA_PRECISIONS or precision == "tf32" and rounded) \
        if switch is None else switch == "1"
    return on and arch is not None and has_wgmma(arch)


def _latency_rule(precision: str, tf32_copied: bool) -> bool:
    """Whether a dense product's wgmma tiles are rated by WGMMA_TILE_S's model (and
    WGMMA_TALL_TILE offered): at fp16 and bf16, and at tf32 where both operands reach the
    tiles as they lie (`tf32_copied`: tf32 values, K-major, copied by TMA). A k tile is 128
    bytes a row at each, so a tf32 one (32 deep at half the 16-bit rate) takes a 16-bit one's
    time (at tf32 WGMMA_TF32_TILE_S' figures). Session 51's H200 calls (bench/gpu_gemm_ab.py
    --precisions tf32, B [n, k]): the wgmma tiles so chosen, with TMA, took 1.48 to 1.75 of
    cuBLAS tf32 at 128 to 512 x 3072 x 768 and 128 x 768 x 3072, where TF32_WGMMA_OUTPUTS'
    mma.sync tiles took 0.96 to 1.09."""
    return precision in ("fp16", "bf16") or precision == "tf32" and tf32_copied


def _candidates(precision: str, with_wgmma: bool, k: int, outputs: int,
                shallow_rule: bool = True, staged: bool = False, tf32_copied: bool = False):
    """(config without split, guessed efficiency) of the tiles the default tries for a
    product of depth `k` and `outputs` results (m n, every batch); `shallow_rule`: whether
    SHALLOW_K's tiles and DENSE_WGMMA_EFFICIENCY apply (dense products; a convolution's
    do not: CONV_WGMMA_EFFICIENCY); `staged`: whether its
    results will be staged (`results_staged`: a 16-bit Y); `tf32_copied`: see `choose`."""
    from . import wgmma   # (it builds on this module's tiles)

    if precision == "tf32" and (k <= SHALLOW_K or not (shallow_rule and tf32_copied) and
                                outputs < TF32_WGMMA_OUTPUTS):
        with_wgmma = False
    shallow = shallow_rule and with_wgmma and k <= SHALLOW_K
    if shallow and staged and outputs >= SHALLOW_STAGED_OUTPUTS:
        yield replace(SHALLOW_STAGED_TILE, block_k=wgmma.block_k(precision)), 1.0
        return
    if shallow and outputs >= SHALLOW_LARGE:
        yield SHALLOW_LARGE_TILE, 1.0
        return
    scale = MMA_UNDER_WGMMA if with_wgmma and not shallow else 1.0
    for (bm, bn, wm, wn), efficiency in zip(DEFAULTS, SHALLOW_EFFICIENCY if shallow else
                                            EFFICIENCY):
        bk = _deepest(bm, bn, precision)
        if bk >= SHALLOWEST_K:
            yield TensorCoreConfig(bm, bn, bk, wm, wn, DEFAULT_STAGES), efficiency * scale
    if not with_wgmma or shallow:
        return
    for (bm, bn, wm, wn, stages, first), efficiency in zip(
            WGMMA_DEFAULTS, DENSE_WGMMA_EFFICIENCY if shallow_rule else CONV_WGMMA_EFFICIENCY):
        yield TensorCoreConfig(bm, bn, wgmma.block_k(precision), wm, wn, stages, wgmma=True,
                               refill_first=first), efficiency


def choose(m: int, n: int, k: int, batch: int = 1, gpu: GPU = REFERENCE,
           precision: str = "fp16", wgmma: bool = False,
           shallow_rule: bool = True, staged: bool = False,
           cluster_split: bool = False, tf32_copied: bool = False,
           latency: bool | None = None) -> TensorCoreConfig:
    """The default config of an m x n x k product (`batch` of them) on `gpu`, as
    dense.choose: of the DEFAULTS tiles (and with `wgmma` the WGMMA_DEFAULTS), each with k
    unsplit or split into slices at least MIN_SPLIT_K deep, the one a rough model says is
    fastest (its guessed efficiency, slowed where its blocks cannot fill the GPU or leave
    the last of their waves part empty, a wgmma block's wave one block an SM: SM_SHARED_BYTES,
    plus a split's cost; a dense product's wgmma tiles at fp16 / bf16 by WGMMA_TILE_S's
    model of their k tiles instead). Tiles count whole: a ragged edge's tile issues all its
    products (on an H200 at fp16, 100352 x 384 x 96 in 128 x 256 tiles took 92 us, in 128 x
    128 ones 59).
    `shallow_rule`: SHALLOW_K's tiles for shallow products (dense ones; see SHALLOW_EFFICIENCY);
    `staged`: the results will be staged (`results_staged`; SHALLOW_STAGED_TILE);
    `cluster_split`: a wgmma tile's split of CLUSTER_SPLITS may be summed in its cluster
    (CLUSTER_SPLIT_S), else every split is summed by a second launch. Where WGMMA_TALL_TILE
    fills one wave of a deep fp16 / bf16 product, it is rated by its lone-block line too.
    `tf32_copied`: at tf32, both operands of a dense product reach the tiles as they lie
    (tf32 values, K-major: what TMA copies): its wgmma tiles are rated as fp16's are
    (`_latency_rule`), at any number of outputs; else tf32 keeps the efficiencies and
    TF32_WGMMA_OUTPUTS.
    `latency`: whether the wgmma tiles are rated by WGMMA_TILE_S's model (and WGMMA_TALL_TILE
    offered) at `_latency_rule`'s precisions; default `shallow_rule` (dense products; a
    pointwise convolution's operands are copied as theirs are: conv_nhwc.py)."""
    best, best_time = None, math.inf
    latency_rule = (shallow_rule if latency is None else latency) and \
        _latency_rule(precision, tf32_copied)
    for base, efficiency in _candidates(precision, wgmma, k, m * n * batch, shallow_rule,
                                        staged, tf32_copied):
        bm, bn = base.block_m, base.block_n
        blocks = -(-m // bm) * -(-n // bn) * batch
        if base.wgmma and 2 * m * n * batch < blocks * bm * bn:
            continue   # mostly past the edges: a warpgroup's 64 rows for a few
        # a wgmma block fills its SM: one a SM is full, a second one's waits (SM_SHARED_BYTES)
        full = gpu.sms if base.wgmma else min_blocks(gpu)
        wave = gpu.sms if base.wgmma else gpu.sms * resident(base, precision)
        latency = base.wgmma and latency_rule
        for split in SPLITS:
            if split > 1 and (k < split * MIN_SPLIT_K or batch * split > MAX_GRID_YZ or
                              latency and k < split * WGMMA_MIN_SLICE_TILES * base.block_k):
                break
            config = replace(base, split_k=split)
            count = blocks * split
            fill = min(1.0, count / full)
            waves = -(-count // wave) * wave / count if count > wave else 1.0
            seconds = _wgmma_seconds(config, k, count, gpu, precision) if latency else \
                2 * blocks * bm * bn * k * waves / (gpu.tensor_flops * efficiency * fill)
            options = [(config, seconds)]
            if split > 1:
                partials = 8 * m * n * batch * split / gpu.copy_bytes_per_s
                options = [(config, seconds + (
                    partials / WGMMA_PARTIALS_IN_L2 + WGMMA_PARTIALS_S if latency else
                    partials + (WGMMA_SPLIT_S if base.wgmma else LAUNCH_S)))]
                if cluster_split and base.wgmma and split in CLUSTER_SPLITS and \
                        bm % split == 0 and count <= CLUSTER_WAVES * wave:
                    options.append((replace(config, cluster_split=True),
                                    seconds + CLUSTER_SPLIT_S))
            for option, option_seconds in options:
                if option_seconds < best_time:
                    best, best_time = option, option_seconds
    tall = _tall_seconds(m, n, k, batch, gpu, precision) if wgmma and latency_rule and \
        k > SHALLOW_K else None
    if tall is not None and tall < best_time:
        from . import wgmma as wg   # (it builds on this module's tiles)
        best = replace(WGMMA_TALL_TILE, block_k=wg.block_k(precision))
    return best


def _tall_seconds(m: int, n: int, k: int, batch: int, gpu: GPU,
                  precision: str) -> float | None:
    """WGMMA_TALL_TILE's time at an m x n x k product (`batch` of them), unsplit, where its
    blocks fill at most one wave and k is WGMMA_TALL_MIN_TILES tiles deep, else None."""
    from . import wgmma as wg   # (it builds on this module's tiles)

    c = WGMMA_TALL_TILE
    blocks = -(-m // c.block_m) * -(-n // c.block_n) * batch
    block_k = wg.block_k(precision)
    k_tiles = -(-k // block_k)
    if blocks > gpu.sms or k_tiles < WGMMA_TALL_MIN_TILES:
        return None
    sm_flops = WGMMA_TALL_SM_FLOPS / (2 if precision == "tf32" else 1)   # (tf32: half rate)
    return k_tiles * (WGMMA_TALL_TILE_S + 2 * c.block_m * c.block_n * block_k / sm_flops)


def _wgmma_seconds(c: TensorCoreConfig, k: int, blocks: int, gpu: GPU,
                   precision: str = "fp16") -> float:
    """The time of `blocks` wgmma blocks of config `c` at `precision` (`_latency_rule`'s)
    over depth `k` split in c.split_k, as WGMMA_TILE_S's model says, before a split's second
    launch."""
    k_tiles = -(-k // c.block_k)
    tiles = -(-k_tiles // c.split_k)
    tile_s, sm_rate = (WGMMA_TF32_TILE_S, WGMMA_TF32_SM_FLOPS) if precision == "tf32" else \
        (WGMMA_TILE_S, 2 * gpu.tensor_flops / gpu.sms)
    block = tiles * (tile_s + 2 * c.block_m * c.block_n * c.block_k / sm_rate) + \
        WGMMA_EPILOGUE_S * c.block_m * c.block_n / (128 * 128)
    return -(-blocks // gpu.sms) * block


def resident(c: TensorCoreConfig, precision: str) -> int:
    """Blocks of config `c` an SM holds at once (SM_SHARED_BYTES' model)."""
    from . import wgmma   # (it builds on this module's tiles)

    accumulators = wgmma.accumulators(c) if c.wgmma else _accumulators(c)
    return max(1, min(SM_SHARED_BYTES // shared_bytes(c, precision), 2048 // c.threads,
                      65536 // (c.threads * (accumulators + 64)), 32))


def _c(r: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    """The (row, column) of accumulator r of lane (g = lane // 4, t = lane % 4) in a 16 x 8
    mma tile (PTX ISA, "Matrix Fragments for mma.m16n8k8 / k16", the same for all three)."""
    return g + 8 * (r // 2), 2 * t + r % 2


# -- the product ------------------------------------------------------------------------------

def mma_product(c: TensorCoreConfig, batch: int, m: int, n: int, k: int, a: Operand,
                b: Operand, store, *, precision: str, tiles=None) -> L.Stmt:
    """The blocks, warps and loops of Y[bi, i, j] = sum_k A[bi, i, k] B[bi, k, j] on tensor
    cores at `precision` (see the module's docstring; with the `wgmma` knob, wgmma.py's
    warpgroups); the arguments as dense.tiled_product's. `tiles`: the class of a block's
    tiles where it is another (sparse24.py's, A 2:4 sparse), called as `_WarpTiles`."""
    if tiles is None and c.wgmma:
        from .wgmma import Warpgroups as tiles   # (it builds on this module's tiles)
    elif tiles is None:
        tiles = _WarpTiles
    w = tiles(c, batch, m, n, k, a, b, precision)
    bi, by, bx = w.bi, w.by, w.bx
    grid = (-(-m // w.bm), -(-n // w.bn))
    if c.split_k == 1:
        if c.staged:
            from .staged import staged_block   # (it builds on this module's tiles)
            body = staged_block(w, L.seq(w.init(), w.product(L.const(0))), store)
        else:
            done = w.each_result(lambda i, j, value: store(bi, i, j, value))
            body = w.block(L.seq(w.init(), w.product(L.const(0)), done))
        return L.For(bi, batch, _grouped(body, grid, by, bx), L.ForKind.BLOCK_Z)
    sk = L.Var("sk")
    if c.cluster_split:
        from .staged import cluster_results   # (it builds on this module's tiles)
        bz = L.Var("bz")
        body = w.block(L.seq(w.init(), w.product(sk * w.per)), cluster_results(w, store, sk))
        body = L.Let(bi, bz // c.split_k, L.Let(sk, bz % c.split_k, body))
        return L.For(bz, batch * c.split_k, _grouped(body, grid, by, bx), L.ForKind.BLOCK_Z)

    def slice_block(bz: L.Var, partial: L.Buffer) -> L.Stmt:
        keep = w.each_result(lambda i, j, value: L.Store(
            partial, (((sk * batch + bi) * m + i) * n + j,), value))
        body = w.block(L.seq(w.init(), w.product(sk * w.per), keep))
        return L.Let(bi, bz // c.split_k, L.Let(sk, bz % c.split_k, body))

    return dense_template._split_k(c, batch, m, n, grid, store, slice_block, (by, bx))


def _grouped(body: L.Stmt, grid: tuple[int, int], by: L.Var, bx: L.Var) -> L.Stmt:
    """`body` over the (row tile by, column tile bx) of a grid of `grid` tiles, one block
    each: where there are more than GROUP_ROWS row tiles, blockIdx.x runs down GROUP_ROWS
    rows at a time, then across (blocks running together share their A rows and B columns
    in L2, as Triton's grouped ordering), else over blockIdx.y and x."""
    rows, columns = grid
    if rows <= GROUP_ROWS:
        return L.For(by, rows, L.For(bx, columns, body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y)
    tile, within = L.Var("tile"), L.Var("in_group")
    first = tile // (GROUP_ROWS * columns) * GROUP_ROWS
    height = L.minimum(rows - first, GROUP_ROWS)   # the last group's may be less
    return L.For(tile, rows * columns, L.Let(within, tile % (GROUP_ROWS * columns), L.Let(
        by, first + within % height, L.Let(bx, within // height, body))), L.ForKind.BLOCK_X)


def _over_threads(threads: int, count: int, body):
    """`body(step, e)` for items e < count, item e on thread e % threads at its step
    e // threads. e is the expression step * threads + t, not a variable, so that the
    simplifier sees e % d = t % d for d dividing `threads`: the staged epilogue's columns
    are then the same at every step, and NVCC loads their parameters once (an int8 conv's
    128 x 256 tile: 12 loads of scales, sums and biases a thread, not 384). Where `body`
    returns a tuple of statements, a tuple of such loops, one each, on the same thread and
    step variables (statements run apart, each over every step: the staged epilogue's
    prefetch and its finishing)."""
    t, step = L.Var("t"), L.Var("l")
    steps = -(-count // threads)
    e = step * threads + t

    def loop(inner: L.Stmt) -> L.Stmt:
        if steps * threads > count:
            inner = L.If(e < count, inner)
        return L.For(t, threads, L.For(step, steps, inner, L.ForKind.UNROLLED),
                     L.ForKind.THREAD_X)

    inner = body(step, e)
    return tuple(map(loop, inner)) if isinstance(inner, tuple) else loop(inner)


class _Tile:
    """One operand's k tiles in a ring of `stages` shared slots, in the precision's type (see
    the module's docstring): the copies into a slot (`fetch`, or `issue` then `finish`) and
    each lane's row address of an ldmatrix (`fragment_row`)."""

    def __init__(self, name: str, rows: int, first: L.Expr, extent: int, operand: Operand,
                 bk: int, k: int, threads: int, checked: bool, bi: L.Var, precision: str,
                 stages: int):
        self.rows, self.first, self.extent, self.operand = rows, first, extent, operand
        self.bk, self.k, self.threads, self.checked, self.bi = bk, k, threads, checked, bi
        self.precision = precision
        self.per_word = 4 // _element_bytes(precision)     # elements a 32-bit word
        self.chunk = CHUNK_WORDS * self.per_word            # elements a chunk
        # the tile's rows run along k (ldmatrix) or along the operand's rows (.trans: 16-bit)
        self.k_inner = _element_bytes(precision) != 2 or not operand.rows_contiguous
        inner, self.outer = (bk, rows) if self.k_inner else (rows, bk)
        self.row_words = inner // self.per_word
        self.per_row = self.row_words // CHUNK_WORDS        # chunks a tile row
        self.slot_words = self.outer * self.row_words
        self.chunks = self.outer * self.per_row
        self.steps = -(-self.chunks // threads)
        # consecutive threads take consecutive chunks of a row where the tile's rows run
        # along the operand's contiguous dimension, else consecutive rows
        self.along = self.k_inner != operand.rows_contiguous
        self.tile = L.Buffer(f"{name}_tile", T.uint32, (stages * self.slot_words,),
                             L.Scope.SHARED)
        sample = operand.at(bi, L.const(0), L.const(0))
        self.dtype = sample.dtype
        self.asynchronous = _copies_async(operand, sample, precision)
        self.words = self.per_word == 4   # 8-bit elements: staged a word at a time
        if self.words and operand.word is None:
            raise ValueError(f"{name}: 8-bit operands are staged by words (Operand.word)")
        self.stage = L.Buffer(f"{name}_stage", T.uint32 if self.words else self.dtype,
                              (self.steps * (CHUNK_WORDS if self.words else self.chunk),),
                              L.Scope.LOCAL)

    # -- the shared layout ------------------------------------------------------------------

    def word(self, slot: L.Expr, o: L.Expr, c: L.Expr) -> L.Expr:
        """The first word of chunk c of tile row o in `slot`: the chunk XOR-swizzled with
        the row, so that 8 consecutive rows at one chunk (an ldmatrix matrix) and 8
        consecutive chunks (a phase of 16-byte stores) fall in 8 distinct 16-byte bank
        groups of the 128 bytes."""
        place = c
        if self.per_row > 1:
            rows_a_line = max(1, 8 // self.per_row)     # tile rows in 128 bytes
            place = L.BinOp("^", c, o // rows_a_line % min(self.per_row, 8))
        return slot * self.slot_words + o * self.row_words + place * CHUNK_WORDS

    def _chunk_of(self, e: L.Expr) -> tuple[L.Expr, L.Expr]:
        """(tile row, chunk) of the slot's chunk e (the copies' order)."""
        if self.along:
            return e // self.per_row, e % self.per_row
        return e % self.outer, e // self.outer

    def _element(self, o: L.Expr, c: L.Expr, x) -> tuple[L.Expr, L.Expr]:
        """(operand row, k) within the tile of element x of chunk c of tile row o."""
        inner = c * self.chunk + x
        return (o, inner) if self.k_inner else (inner, o)

    def _each_chunk(self, when: L.Expr | None, body) -> L.Stmt:
        def visit(step, e):
            o, c = L.Var("chunk_row"), L.Var("chunk")
            ro, rc = self._chunk_of(e)
            inner = L.Let(o, ro, L.Let(c, rc, body(step, o, c)))
            return inner if when is None else L.If(when, inner)
        return _over_threads(self.threads, self.chunks, visit)

    # -- copies into a slot -----------------------------------------------------------------

    def fetch(self, kt: L.Expr, slot: L.Expr) -> L.Stmt:
        """k tile `kt` into `slot`, at once (the ring's first tiles)."""
        return L.seq(self.issue(kt, slot, None), self.finish(slot, None))

    def issue(self, kt: L.Expr, slot: L.Expr, when: L.Expr | None) -> L.Stmt:
        """The start of k tile `kt`'s way into `slot`, if `when`: its cp.asyncs, or its loads
        into registers (`finish` stores them)."""
        if self.asynchronous:
            return self._each_chunk(when, lambda step, o, c: self._copy(kt, slot, o, c))
        return self._each_chunk(when, lambda step, o, c: self._load(kt, step, o, c))

    def finish(self, slot: L.Expr, when: L.Expr | None) -> L.Stmt | None:
        """The registers `issue` loaded, in the precision's type, into `slot` (nothing for
        cp.async)."""
        if self.asynchronous:
            return None

        def body(step, o, c):
            v = L.Var("w")
            return L.For(v, CHUNK_WORDS, L.Store(self.tile, (self.word(slot, o, c) + v,),
                                                 self._packed(step, v)), L.ForKind.VECTORIZED)
        return self._each_chunk(when, body)

    def _global(self, kt: L.Expr, o: L.Expr, c: L.Expr, x) -> tuple[L.Expr, L.Expr]:
        row, kk = self._element(o, c, x)
        return self.first + row, kt * self.bk + kk

    def _copy(self, kt: L.Expr, slot: L.Expr, o: L.Expr, c: L.Expr) -> L.Stmt:
        """One chunk's cp.async: all of it inside the operand or none (its contiguous
        extent is a multiple of the chunk), 0 bytes read outside, from an address clamped to
        a chunk inside."""
        row, kg = self._global(kt, o, c, 0)
        dst = self.tile[self.word(slot, o, c)]
        if self.operand.chunk is not None:   # a gather: padding zero-filled too
            bounds = [row < self.extent, kg < self.k] if self.checked else []
            if self.checked:
                row, kg = L.minimum(row, self.extent - 1), L.minimum(kg, self.k - self.chunk)
            src, inside = self.operand.chunk(self.bi, row, kg)
            return L.CopyAsync(dst, src, L.Select(L.logical_and(*bounds, inside),
                                                  L.const(16), L.const(0)))
        if not self.checked:
            return L.CopyAsync(dst, self.operand.at(self.bi, row, kg), L.const(16))
        edge = (1, self.chunk) if self.k_inner else (self.chunk, 1)
        inside = L.logical_and(row < self.extent, kg < self.k)
        # along k whole chunks: an operand whose rows are padded past k (int8 weights in
        # rows) copies its last chunk from its start, not from k - chunk
        k_end = -(-self.k // self.chunk) * self.chunk if self.k_inner else self.k
        src = self.operand.at(self.bi, L.minimum(row, self.extent - edge[0]),
                              L.minimum(kg, k_end - edge[1]))
        return L.CopyAsync(dst, src, L.Select(inside, L.const(16), L.const(0)))

    def _load(self, kt: L.Expr, step: L.Expr, o: L.Expr, c: L.Expr) -> L.Stmt:
        """One chunk's elements into registers: 4 at a time (a vector load) along the
        operand's contiguous dimension where nothing needs checking, else one by one, 0
        outside the operand or k."""
        if self.words:
            return self._load_words(kt, step, o, c)
        zero = L.const(0.0, self.dtype)

        def element(x) -> L.Expr:
            row, kg = self._global(kt, o, c, x)
            if not self.checked:
                return self.operand.at(self.bi, row, kg)
            return L.Select(L.logical_and(row < self.extent, kg < self.k), self.operand.at(
                self.bi, L.minimum(row, self.extent - 1), L.minimum(kg, self.k - 1)), zero)

        slot = step * self.chunk
        if self.along and not self.checked:
            v = L.Var("v")
            return L.seq(*(L.For(v, 4, L.Store(self.stage, (slot + h + v,), element(h + v)),
                                 L.ForKind.VECTORIZED) for h in range(0, self.chunk, 4)))
        return L.seq(*(L.Store(self.stage, (slot + x,), element(x))
                       for x in range(self.chunk)))

    def _load_words(self, kt: L.Expr, step: L.Expr, o: L.Expr, c: L.Expr) -> L.Stmt:
        """One chunk's 4 words of 8-bit elements into registers (`Operand.word`), 0 outside
        the operand or k."""
        out = []
        for x in range(CHUNK_WORDS):
            row, kg = self._global(kt, o, c, x * self.per_word)
            if not self.checked:
                value = self.operand.word(self.bi, row, kg // self.per_word)
            else:
                value = L.Select(L.logical_and(row < self.extent, kg < self.k),
                                 self.operand.word(self.bi, L.minimum(row, self.extent - 1),
                                                   L.minimum(kg, self.k - 1) // self.per_word),
                                 L.const(0, T.uint32))
            out.append(L.Store(self.stage, (step * CHUNK_WORDS + x,), value))
        return L.seq(*out)

    def _packed(self, step: L.Expr, v: L.Expr) -> L.Expr:
        """Word v of the chunk staged at `step`, in the precision's type: a tf32 element
        rounded (`pack_tf32`), or two 16-bit ones (their bits when the operand is stored so,
        else rounded from float32), the first in the low half; four 8-bit ones as staged
        (`Operand.word`)."""
        if self.words:
            return self.stage[step * CHUNK_WORDS + v]
        at = step * self.chunk + v * self.per_word
        values = [self.stage[at + h] for h in range(self.per_word)]
        if self.precision == "tf32":
            return L.call("bitcast" if self.operand.rounded else "pack_tf32",
                          _as_float32(values[0]), dtype=T.uint32)
        if self.dtype is STORAGE[self.precision]:
            lo, hi = (L.Cast(T.uint32, L.call("bitcast", x, dtype=T.uint16)) for x in values)
            return L.BinOp("|", lo, L.BinOp("<<", hi, L.const(16, T.uint32)))
        return L.call(L.PACKS[self.precision], *map(_as_float32, values), dtype=T.uint32)

    # -- fragments --------------------------------------------------------------------------

    def fragment_row(self, slot: L.Expr, ks: int, base8: L.Expr, lane: L.Expr,
                     a_side: bool) -> L.Expr:
        """This lane's row address (a word of the tile) of an ldmatrix.x4 of mma step `ks` of
        the tile in `slot`, for the 16 operand rows from 8 base8 on: matrix q = lane // 8 is
        A's (rows half q % 2, k half q // 2) (registers a0..a3), or B's (rows half q // 2,
        k half q % 2) (b0, b1 of two mma tiles); row lane % 8 of it."""
        q, j = lane // 8, lane % 8
        rows_half, k_half = (q % 2, q // 2) if a_side else (q // 2, q % 2)
        if self.k_inner:   # tile rows: operand rows; chunks: 2 a step along k
            return self.word(slot, base8 * 8 + rows_half * 8 + j, ks * 2 + k_half)
        return self.word(slot, ks * 16 + k_half * 8 + j, base8 + rows_half)


def _copies_async(operand: Operand, sample: L.Expr, precision: str) -> bool:
    """Whether the operand goes to shared memory by cp.async: a plain array
    (`Operand.array`) stored in the type the tile holds (the 16-bit precision's; float32 for
    tf32, contiguous along k: its fragments are rounded after ldmatrix) whose contiguous
    extent is a multiple of a chunk (every chunk 16-byte aligned, inside or outside as a
    whole), or a gather whose runs along k are (`Operand.chunk`: the same conditions on the
    array it reads)."""
    if operand.chunk is not None and not operand.rows_contiguous:
        zero = L.const(0)
        sample = operand.chunk(zero, zero, zero)[0]
    elif not operand.array:
        return False
    if not isinstance(sample, L.Load):
        return False
    stored, extent = sample.buffer.dtype, sample.buffer.shape[-1]
    if precision == "tf32":
        fits, chunk = stored is T.float32 and not operand.rows_contiguous, CHUNK_WORDS
    else:
        fits, chunk = stored is STORAGE[precision], CHUNK_WORDS * 4 // _element_bytes(precision)
    return fits and sample.buffer.scope is L.Scope.GLOBAL and isinstance(extent, L.Const) \
        and extent.value % chunk == 0


def _as_float32(x: L.Expr) -> L.Expr:
    return x if x.dtype is T.float32 else L.Cast(T.float32, x)


class _WarpTiles:
    """One block of a tensor-core product: its operands' tiles in shared memory (`a_in`,
    `b_in`), each warp's fragments and accumulators in registers, and the statements
    `mma_product` assembles from them (zeroing, the k loop, the results)."""

    def __init__(self, c: TensorCoreConfig, batch: int, m: int, n: int, k: int, a: Operand,
                 b: Operand, precision: str):
        self.c, self.m, self.n, self.precision = c, m, n, precision
        self.mm, self.mn, self.mk = L.MMA_SHAPES[precision]
        self.bm, self.bn, self.bk = bm, bn, bk = c.block_m, c.block_n, c.block_k
        self.wm, self.wn = bm // c.warps_m, bn // c.warps_n
        # mma tiles of a warp, down and across
        self.tm, self.tn = tm, tn = self.wm // self.mm, self.wn // self.mn
        tiles = -(-k // bk)
        self.per = -(-tiles // c.split_k)           # k tiles per slice
        past_k = k % bk != 0 or tiles % c.split_k != 0
        self.bi, self.by, self.bx = bi, by, bx = L.Var("bi"), L.Var("by"), L.Var("bx")
        self.row0, self.col0 = by * bm, bx * bn
        self.a_in = _Tile("a", bm, self.row0, m, a, bk, k, c.threads, past_k or m % bm != 0,
                          bi, precision, c.stages)
        self.b_in = _Tile("b", bn, self.col0, n, b, bk, k, c.threads, past_k or n % bn != 0,
                          bi, precision, c.stages)
        ra, rb = L.MMA_REGISTERS
        self.acc_type = T.int32 if precision in L.INTEGER_MMA else T.float32
        self.acc = L.Buffer("acc", self.acc_type, (tm * tn * 4,), L.Scope.LOCAL)
        # two sets of fragments: one step's loaded while the other's mmas run
        self.a_frag = L.Buffer("a_frag", T.uint32, (2 * tm * ra,), L.Scope.LOCAL)
        self.b_frag = L.Buffer("b_frag", T.uint32, (2 * tn * rb,), L.Scope.LOCAL)
        self.t, self.wy, self.wx, self.g, self.q, self.lane = (
            L.Var(x) for x in ("t", "wy", "wx", "g", "q", "lane"))
        self.mi, self.ni = L.Var("mi"), L.Var("ni")

    def per_thread(self, body: L.Stmt) -> L.Stmt:
        """`body` on every thread: its warp's place (wy, wx), its lane and the lane's g and q
        (PTX's groupID and threadID_in_group)."""
        c, t = self.c, self.t
        used = L.free_vars(body)
        for var, value in reversed(((self.wy, t // WARP // c.warps_n),
                                    (self.wx, t // WARP % c.warps_n), (self.lane, t % WARP),
                                    (self.g, t % WARP // 4), (self.q, t % 4))):
            if var in used:
                body = L.Let(var, value, body)
        return L.For(t, c.threads, body, L.ForKind.THREAD_X)

    def init(self) -> L.Stmt:
        """Every accumulator zeroed."""
        r = L.Var("r")
        return self.per_thread(L.For(r, self.tm * self.tn * 4, L.Store(
            self.acc, (r,), L.const(0, self.acc_type)), L.ForKind.UNROLLED))

    def _fragments(self, slot: L.Expr, ks: int, half: int) -> L.Stmt:
        """The warp's A and B fragments of mma step `ks` into register set `half`."""
        ra, rb = L.MMA_REGISTERS
        ai, bj = L.Var("ai"), L.Var("bj")
        a_rows = self.wy * (self.wm // 8) + ai * 2      # in 8s
        b_rows = self.wx * (self.wn // 8) + bj * 2
        loads = []
        for tile, frag, first, rows, index, a_side in (
                (self.a_in, self.a_frag, (half * self.tm + ai) * ra, a_rows, ai, True),
                (self.b_in, self.b_frag, (half * self.tn + bj * 2) * rb, b_rows, bj, False)):
            body = [L.LdMatrix(frag[first], tile.tile[tile.fragment_row(
                slot, ks, rows, self.lane, a_side)], 4, not tile.k_inner)]
            if self.precision == "tf32" and tile.asynchronous and not tile.operand.rounded:
                # fp32 as copied: round
                body += [L.Store(frag, (first + r,), L.call("pack_tf32", L.call(
                    "bitcast", frag[first + r], dtype=T.float32), dtype=T.uint32))
                    for r in range(4)]
            loads.append(L.For(index, self.tm if a_side else self.tn // 2, L.seq(*body),
                               L.ForKind.UNROLLED))
        return L.seq(*loads)

    def update(self, slot: L.Expr) -> L.Stmt:
        """The k tile in shared `slot`, an mma step of k at a time: step s + 1's fragments
        loaded (ldmatrix) while step s's mmas run, one per (row tile, column tile)."""
        ra, rb = L.MMA_REGISTERS
        mi, ni, tm, tn = self.mi, self.ni, self.tm, self.tn
        steps = self.bk // self.mk
        body = [self._fragments(slot, 0, 0)]
        for ks in range(steps):
            if ks + 1 < steps:
                body.append(self._fragments(slot, ks + 1, (ks + 1) % 2))
            half = ks % 2
            mma = L.Mma(self.precision, self.acc, (mi * tn + ni) * 4,
                        tuple(self.a_frag[(half * tm + mi) * ra + r] for r in range(ra)),
                        tuple(self.b_frag[(half * tn + ni) * rb + r] for r in range(rb)))
            body.append(L.For(mi, tm, L.For(ni, tn, mma, L.ForKind.UNROLLED),
                              L.ForKind.UNROLLED))
        return self.per_thread(L.seq(*body))

    def rings(self) -> tuple:
        """What each k tile copies into shared memory: the operands' tiles (a subclass may
        add one: sparse24.py's metadata)."""
        return self.a_in, self.b_in

    def product(self, first: L.Expr) -> L.Stmt:
        """k tiles first .. first + per - 1 through the ring of `stages` slots: the first
        stages - 1 fetched ahead; then at each tile kt, wait for its copies and the barrier,
        start tile kt + stages - 1's way into the slot tile kt - 1 freed, multiply tile kt,
        finish the started tile's way (registers into shared memory)."""
        tiles, stages, per = self.rings(), self.c.stages, self.per
        asynchronous = any(x.asynchronous for x in tiles)
        commit = [L.AsyncCommit()] if asynchronous else []
        ahead = []
        for s in range(stages - 1):
            if s < per:
                ahead += [x.fetch(first + s, L.const(s)) for x in tiles]
            ahead += commit
        kt = L.Var("kt")
        coming = kt + (stages - 1)
        more, slot = coming < per, coming % stages
        loop = L.For(kt, per, L.seq(
            *([L.AsyncWait(stages - 2)] if asynchronous else []), L.Barrier(),
            *(x.issue(first + coming, slot, more) for x in tiles), *commit,
            self.update(kt % stages), *(x.finish(slot, more) for x in tiles)))
        return L.seq(*ahead, loop)

    def each_result(self, body, within_tile: bool = False) -> L.Stmt:
        """`body(i, j, accumulator)` for each of the thread's results, if inside Y: a lane's
        two results of a row are adjacent columns, stored as one vector (a warp's stores then
        fill whole 32-byte sectors) where no tile passes Y's edges and `body` allows it (a
        store of registers: the renderer's proof). `within_tile`: (i, j) within the block's
        tile, every result (the staged epilogue's copy into shared memory)."""
        mi, ni, v = self.mi, self.ni, L.Var("v")
        exact = within_tile or self.m % self.bm == 0 and self.n % self.bn == 0
        row0, col0 = (L.const(0), L.const(0)) if within_tile else (self.row0, self.col0)
        out = []
        for half in range(2):   # accumulators 2 half, 2 half + 1: row g + 8 half
            row, col = _c(2 * half, self.g, self.q)
            i = row0 + self.wy * self.wm + mi * self.mm + row
            j = col0 + self.wx * self.wn + ni * self.mn + col
            at = (mi * self.tn + ni) * 4 + 2 * half
            if exact:
                out.append(L.For(v, 2, body(i, j + v, self.acc[at + v]),
                                 L.ForKind.VECTORIZED))
                continue
            out += [L.If(L.logical_and(i < self.m, j + r < self.n),
                         body(i, j + r, self.acc[at + r])) for r in range(2)]
        return self.per_thread(L.For(mi, self.tm, L.For(ni, self.tn, L.seq(*out),
                                                        L.ForKind.UNROLLED),
                                     L.ForKind.UNROLLED))

    def block(self, body: L.Stmt, after: L.Stmt | None = None) -> L.Stmt:
        """`body` with the block's shared tiles and the thread's registers allocated, then
        `after` (if any) with the registers only (the tiles' memory free: staged.py)."""
        return _allocated(body, after, [self.a_in.tile, self.b_in.tile] + [
            x.stage for x in (self.a_in, self.b_in) if not x.asynchronous],
            [self.acc, self.a_frag, self.b_frag])


def _allocated(body: L.Stmt, after: L.Stmt | None, tiles: list, registers: list) -> L.Stmt:
    """`body` inside Allocates of `tiles`, then `after`, both inside those of `registers`."""
    for buffer in tiles:
        body = L.Allocate(buffer, body)
    if after is not None:
        body = L.seq(body, after)
    for buffer in registers:
        body = L.Allocate(buffer, body)
    return body


# -- the templates ----------------------------------------------------------------------------

def _product(machine) -> functools.partial:
    return functools.partial(mma_product, precision=machine.precision)


def dense_space(p: problems.Dense, machine) -> Space:
    return product_space("cuda_mma_dense", p.k, p.batch, machine.precision,
                         getattr(machine, "arch", None))


def tf32_copied(p: problems.Dense) -> bool:
    """Whether both operands of dense product `p` reach a tf32 product's tiles as they lie:
    tf32 values (`a_tf32`, `b_tf32`: passes/store_tf32.py), A stored [m, k] and B [n, k] or
    in one-column panels (convert_layout's tf32_dense), float32 arrays: what TMA copies (a
    B stored [k, n] comes through registers, transposed)."""
    return p.a_tf32 and p.b_tf32 and not p.trans_a and not p.pairs and \
        (p.trans_b if not p.packed_panel else p.packed_panel == 1)


def dense_default(p: problems.Dense, machine) -> TensorCoreConfig:
    precision = machine.precision
    copied = precision == "tf32" and tf32_copied(p)
    chosen = staged_by_default(choose(
        p.m, p.n, p.k, p.batch, gpu_of(machine), precision,
        wgmma=wgmma_by_default(getattr(machine, "arch", None), precision,
                               p.a_tf32 and p.b_tf32), staged=results_staged(p.y.dtype),
        cluster_split=os.environ.get(DNNC_CLUSTER_SPLIT) == "1", tf32_copied=copied),
        p.y.dtype, precision)
    if precision == "tf32" and not copied:   # (no TMA: the plain loop's refill knobs)
        return chosen
    return producer_by_default(chosen, precision, p.k)


DNNC_PRODUCER = "DNNC_PRODUCER"
"""=tma: the dense default gives every wgmma tile it picks at fp16 and bf16 the TMA producer
(`producer="tma"`, wgmma.py; the plain loop where an operand has no tensor map); unset: the
same for products deeper than SHALLOW_K (PRODUCER_DEFAULT); =1: the cp.async producer on every
wgmma tile; =0: neither."""

PRODUCER_DEFAULT = "tma"
"""The producer the dense default gives a 16-bit wgmma tile (DNNC_PRODUCER unset). Session 49,
one H200, bench/gpu_gemm_ab.py (fp16 / bf16 in and out, B [k, n], graphs interleaved with
cuBLAS, every result within the bound): the default's tile with the TMA producer against
without a producer (session 47's cp.async one where it took it) reached 0.8 of cuBLAS on 29
of the 30 transformer / 4096^3 cells against 14 (two calls), faster everywhere but 512 x 768 x
3072 (within 0.02 either way), e.g. fp16 8192 x 768 x 3072 0.71 -> 0.88, 2048 x 3072 x 768
0.73 -> 0.96, 4096^3 0.92 -> 0.99 (the cp.async producer's); the cp.async producer was slower
than TMA on every tile timed (docs/cuda_backend.md, "TMA in the template").
Shallow products (k <= SHALLOW_K, SHALLOW_STAGED_TILE's) were not timed with it: they keep
the plain loop. At tf32 (session 51) the dense default gives it to a wgmma tile whose
operands TMA copies (`tf32_copied`; else the plain loop with its refill knobs): one H200,
bench/gpu_gemm_ab.py --precisions tf32 (B [n, k], tf32 values), the same tile with TMA
against without, of cuBLAS tf32: 4096^3 0.84 -> 1.01, 8192 x 768 x 3072 0.87 -> 0.96,
8192 x 3072 x 768 0.90 -> 1.13, 2048 x 3072 x 768 0.88 -> 1.16 (64 x 192), 1024 x 768 x 3072
1.37 -> 1.64; faster at every tile timed both ways."""


def producer_by_default(c: TensorCoreConfig, precision: str, k: int) -> TensorCoreConfig:
    """Default config `c` of a product of depth `k` with the producer DNNC_PRODUCER (else
    PRODUCER_DEFAULT, at TMA_PRECISIONS, deeper than SHALLOW_K) names, `c` a wgmma tile and
    its ring and barriers within the limit (its refill knobs off: the producer refills)."""
    switch = os.environ.get(DNNC_PRODUCER)
    if switch is None:
        switch = PRODUCER_DEFAULT if k > SHALLOW_K else "0"
    value: bool | str = {"tma": "tma", "1": True}.get(switch, False)
    if not c.wgmma or not value or value == "tma" and precision not in TMA_PRECISIONS:
        return c
    produced = replace(c, producer=value, refill_first=False, early_refill=False)
    return produced if shared_bytes(produced, precision) <= _shared_limit(produced) else c


STAGED_OUTPUTS = (T.float16, T.bfloat16, T.int8, T.uint8)
"""Outputs whose products the default stages (staged.py) unless DNNC_STAGED=0: a direct
store of a 16-bit Y writes a lane's 4 bytes, a warp's store 8 rows of 16 bytes (an 8-bit Y,
int8.py's requantized results: 2 bytes, rows of 8; a QDQ resnet50 at batch 32 on wgmma,
H200: 2.44 ms staged against 2.74 direct), where the staged one stores runs of a row. On an
H200 (bench/gpu_kernels.py, fp16 stored in and out, against cuBLAS's fp16 product): wgmma
4096^3 0.82 staged against 0.76 direct (128 x 256, 4
stages), 8192 x 768 x 3072 0.77 against 0.60, 8192 x 3072 x 768 0.70 against 0.66 (128 x 128,
5 stages), 6304 x 192 x 576 0.87 against 0.35 (128 x 128, 5 stages, --graphs); mma.sync
(--graphs, fp16 and bf16) staged as fast or faster at every tile timed: 4096^3 128 x 128 x 64
0.53 against 0.50, 128 x 768 x 3072 64 x 64 x 32 0.66 against 0.54 (bf16), 32 x 64 within 2% (8-bit
results on mma.sync are staged too, untimed). A float32 Y's direct stores fill whole sectors (what staged.py's A/B measured: no gain) and
stay direct."""


def results_staged(y: T.DType) -> bool:
    """Whether the default stages the results of a product storing a `y` output
    (STAGED_OUTPUTS; never with DNNC_STAGED=0)."""
    return y in STAGED_OUTPUTS and os.environ.get("DNNC_STAGED") != "0"


def staged_by_default(c: TensorCoreConfig, y: T.DType, precision: str) -> TensorCoreConfig:
    """Default config `c` of a product storing a `y` output, staged where `results_staged`
    says (k unsplit, its staged tile within the shared limit)."""
    staged = replace(c, staged=True)
    if c.split_k == 1 and results_staged(y) and \
            shared_bytes(staged, precision) <= _shared_limit(staged):
        return staged
    return c


def dense_build(p: problems.Dense, c: TensorCoreConfig, machine) -> L.PrimFunc:
    return dense_template.build(p, c, machine, product=_product(machine))


def conv_space(p: problems.Conv2d, machine) -> Space:
    return product_space("cuda_mma_conv2d", conv_template.gemm(p)[2], 1, machine.precision,
                         getattr(machine, "arch", None))


def conv_default(p: problems.Conv2d, machine) -> TensorCoreConfig:
    return choose(*conv_template.gemm(p), gpu=gpu_of(machine), precision=machine.precision)


def conv_build(p: problems.Conv2d, c: TensorCoreConfig, machine) -> L.PrimFunc:
    return conv_template.build(p, c, machine, product=_product(machine))


MMA_DENSE = Template("cuda_mma_dense", problems.dense, dense_template.applies, dense_space,
                     dense_default, dense_build, precisions=PRECISIONS)
MMA_CONV2D = Template("cuda_mma_conv2d", problems.conv2d, conv_template.applies, conv_space,
                      conv_default, conv_build, precisions=PRECISIONS)
