"""A TMA-fed, warp-specialised wgmma product written as CUDA C text (sm_90a), written before
the loop IR rendered TMA (issue 31); the wgmma template's `producer="tma"` now builds the same
block (wgmma.py), and this one stays as the hand-written reference it is timed against
(bench/gpu_gemm_ab.py, one H200: the template's time 0.95 to 1.07 of this one's at 128 x 128
to 256, up to 1.11 at 128 x 64, where this one's `setmaxnreg` and `elect.sync` may be what
the template lacks) and tested on the GPU
(tests/backends/cuda/test_cuda_tma.py). It is not a template: no compile path reaches it.

Y [m, n] = A [m, k] B [k, n], 16-bit operands stored row-major (A K-major, B MN-major, as a
half-storage model's products with B stored [k, n]), fp32 sums, Y in the operands' 16-bit
type. A block computes 128 x `block_n` of Y (`block_n` 64, 128, 192 or 256) with 3
warpgroups: two consumers of 64 rows each issue wgmma m64n<block_n>k16 from the 128-byte
swizzle (`wgmma._SwizzledTile`'s layouts, the same descriptors as wgmma.py's), one
producer whose elected thread alone copies each k tile by TMA (`prelude.TMA_PRELUDE`): A's
128 x 64 box, B's block_n / 64 boxes of 64 x 64 (one 128-byte swizzle atom each), counted
on the slot's `full` mbarrier in bytes (expect_tx), after waiting for the slot's `empty`
(one arrival a consumer warp, once its wgmmas of the tile are done). `setmaxnreg` gives the
producer 40 registers and the consumers 232 (384 threads start at 168: CUTLASS's split).
Tiles past m, n or k read TMA's zeros; the results stored from registers or (`staged`)
through shared memory. m, n and k are compile-time constants (a run-time k
loop's trip count had ptxas serialize the wgmmas, C7515). Blocks go in groups of 8 block
rows (as `mma.py`'s tile order) for L2 reuse. The tensor maps come in global memory, A's
then B's (`tensor_map.operand_map`: A boxes of 128 rows, B of 64 k rows).
"""

from __future__ import annotations

from .prelude import MMA_PRELUDE, PRELUDE, TMA_PRELUDE, WGMMA_PRELUDE

BLOCK_M, BLOCK_K = 128, 64
"""Rows of a block (two consumer warpgroups of m64) and its k tile (one swizzle row)."""
THREADS = 384
MAX_SHARED = 227 * 1024
"""An sm_90 block's dynamic shared memory at most."""

_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(384, 1) tma_product(
    const unsigned long long* __restrict__ maps, unsigned short* __restrict__ y) {
  constexpr int M = %(m)d, N = %(n)d, K = %(k)d, BN = %(bn)d, STAGES = %(stages)d;
  constexpr int TILES = (K + 63) / 64, A_WORDS = 128 * 32, B_WORDS = BN * 32;
  constexpr int ROWS = (M + 127) / 128, COLUMNS = (N + BN - 1) / BN;
  extern __shared__ __align__(1024) unsigned char pool[];
  unsigned* a_tile = (unsigned*)pool;
  unsigned* b_tile = (unsigned*)(pool + STAGES * A_WORDS * 4);
  unsigned long long* full = (unsigned long long*)(pool + STAGES * (A_WORDS + B_WORDS) * 4);
  unsigned long long* empty = full + STAGES;
  // blocks in groups of 8 block rows: a group's blocks share B's columns in L2
  const int tile = blockIdx.x, group = tile / (8 * COLUMNS);
  const int rows = min(ROWS - group * 8, 8), in_group = tile %% (8 * COLUMNS);
  const int by = group * 8 + in_group %% rows, bx = in_group / rows;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      dnnc_mbarrier_init(&full[s], 1);
      dnnc_mbarrier_init(&empty[s], 8);   // each consumer warp's lane 0
    }
    dnnc_fence_mbarrier_init();
  }
  __syncthreads();
  const unsigned warp = dnnc_warp_index();
  if (warp >= 8) {
    dnnc_setmaxnreg_dec<40>();
    if (warp == 8 && dnnc_elect_one()) {
      dnnc_prefetch_tensor_map(maps);
      dnnc_prefetch_tensor_map(maps + 16);
      for (int kt = 0; kt < TILES; ++kt) {
        const int slot = kt %% STAGES;
        if (kt >= STAGES) dnnc_mbarrier_wait(&empty[slot], (kt / STAGES + 1) %% 2);
        dnnc_mbarrier_expect_tx(&full[slot], (A_WORDS + B_WORDS) * 4);
        dnnc_tma_load_3d(a_tile + slot * A_WORDS, maps, &full[slot], kt * 64, by * 128, 0);
#pragma unroll
        for (int atom = 0; atom < BN / 64; ++atom)
          dnnc_tma_load_3d(b_tile + slot * B_WORDS + atom * 2048, maps + 16, &full[slot],
                           bx * BN + atom * 64, kt * 64, 0);
      }
    }
    return;
  }
  dnnc_setmaxnreg_inc<232>();
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const unsigned wy = warp / 4;
  for (int kt = 0; kt < TILES; ++kt) {
    const int slot = kt %% STAGES;
    dnnc_mbarrier_wait(&full[slot], kt / STAGES %% 2);
    dnnc_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {   // k steps of 16: A 32 bytes along its rows, B 16 rows
      const unsigned long long da = dnnc_wgmma_desc(
          a_tile + slot * A_WORDS + wy * 64 * 32 + ks * 8, 16, 1024);
      const unsigned long long db = dnnc_wgmma_desc(
          b_tile + slot * B_WORDS + ks * 16 * 32, 8192, 1024);
      dnnc_wgmma_%(precision)s_n%(bn)d<0, 1>(acc, da, db);
    }
    dnnc_wgmma_commit();
    dnnc_wgmma_wait<1, BN / 2>(acc);
    if (kt > 0 && threadIdx.x %% 32 == 0) dnnc_mbarrier_arrive(&empty[(kt - 1) %% STAGES]);
  }
  dnnc_wgmma_wait<0, BN / 2>(acc);
  const unsigned lane = threadIdx.x %% 32, g = lane / 4, q = lane %% 4;
  if constexpr (%(staged)d) {   // through shared memory: whole 16-byte runs of a row stored
    constexpr int PITCH = BN + 8;   // (halves a staged row: 8 rows' pairs in distinct banks)
    unsigned short* staged = (unsigned short*)pool;   // the ring, every k tile consumed
    asm volatile("bar.sync 1, 256;" ::: "memory");   // (the consumer warps only)
#pragma unroll
    for (int r = 0; r < BN / 2; r += 2) {
      const int i = wy * 64 + warp %% 4 * 16 + g + 8 * (r / 2 %% 2), j = r / 4 * 8 + 2 * q;
      *(unsigned*)&staged[i * PITCH + j] =
          (unsigned)%(convert)s(acc[r]) | (unsigned)%(convert)s(acc[r + 1]) << 16;
    }
    asm volatile("bar.sync 1, 256;" ::: "memory");
    for (int e = threadIdx.x; e < 128 * (BN / 8); e += 256) {
      const int il = e / (BN / 8), jl = e %% (BN / 8) * 8;
      const int i = by * 128 + il, j = bx * BN + jl;
      if (i < M && j < N)
        *(uint4*)&y[(long long)i * N + j] = *(const uint4*)&staged[il * PITCH + jl];
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < BN / 2; r += 2) {   // wgmma's D layout: register 4 nt + 2 half + v
    const int i = by * 128 + wy * 64 + warp %% 4 * 16 + g + 8 * (r / 2 %% 2);
    const int j = bx * BN + r / 4 * 8 + 2 * q;
    if (i < M && j + 1 < N) {
      *(unsigned*)&y[(long long)i * N + j] =
          (unsigned)%(convert)s(acc[r]) | (unsigned)%(convert)s(acc[r + 1]) << 16;
    } else if (i < M && j < N) {
      y[(long long)i * N + j] = %(convert)s(acc[r]);
    }
  }
}
"""


def shared_bytes(block_n: int, stages: int) -> int:
    """The ring's bytes (per slot A's 128 x 64 and B's 64 x block_n 16-bit elements), then
    its 2 x `stages` mbarriers."""
    return stages * (BLOCK_M + block_n) * BLOCK_K * 2 + 2 * stages * 8


def fits(block_n: int, stages: int) -> bool:
    """Whether the block is one this kernel runs: n64..256 wgmmas, 2 slots or more in an
    sm_90 block's shared memory."""
    return block_n in (64, 128, 192, 256) and stages >= 2 and \
        shared_bytes(block_n, stages) <= MAX_SHARED


def source(precision: str, m: int, n: int, k: int, block_n: int, stages: int,
           staged: bool = False) -> str:
    """The module (entry `tma_product(maps, y)`) of Y = A B at `precision` ("fp16" or
    "bf16") for these sizes and this block; n and k multiples of 8 (TMA's 16-byte strides).
    `staged`: the results go through shared memory (the ring, once consumed), stored in
    16-byte runs of a row, as `mma.py`'s staged results; else each thread's pairs from
    registers."""
    if precision not in ("fp16", "bf16") or not fits(block_n, stages) or n % 8 or k % 8:
        raise ValueError(f"no TMA product of {precision} {m}x{k}x{n} in 128 x {block_n} "
                         f"blocks of {stages} slots")
    return PRELUDE + MMA_PRELUDE + WGMMA_PRELUDE + TMA_PRELUDE + _KERNEL % dict(
        m=m, n=n, k=k, bn=block_n, stages=stages, precision=precision, staged=int(staged),
        convert="dnnc_f2h" if precision == "fp16" else "dnnc_f2bf")


def launch(m: int, n: int, block_n: int, stages: int) -> tuple:
    """(grid, block, dynamic shared bytes) of the kernel `source` gives."""
    blocks = -(-m // BLOCK_M) * -(-n // block_n)
    return (blocks,), (THREADS,), shared_bytes(block_n, stages)
