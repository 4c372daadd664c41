"""TMA on sm_90a (`prelude.TMA_PRELUDE`, `tensor_map.py`): the tensor maps' limits checked on
the host; the PTX helpers compiled by NVRTC for sm_90a (no GPU needed); on an H100 / H200
(`gpu`) a tensor map's box lands in shared memory exactly where `wgmma._SwizzledTile` puts
it (K-major and MN-major), and a warp-specialised product (one elected producer thread's
TMA copies counted on mbarriers by bytes, `setmaxnreg` moving the producer's registers to
two consumer warpgroups issuing wgmmas from the 128-byte swizzle) is within fp16's bound.
The kernels here are written by hand: no loop-IR statement renders TMA yet.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dnnc.backends.cuda import device, tensor_map, wgmma
from dnnc.backends.cuda.dense import Operand
from dnnc.backends.cuda.prelude import MMA_PRELUDE, PRELUDE, TMA_PRELUDE, WGMMA_PRELUDE
from dnnc.errors import DeviceError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from cuda_kernels import nvrtc_compiled

STAGES = 4
BLOCK_M, BLOCK_N, BLOCK_K = 128, 64, 64
"""The product's block: two consumer warpgroups of 64 rows, n64 wgmmas, k tiles of 64."""

KERNELS = PRELUDE + MMA_PRELUDE + WGMMA_PRELUDE + TMA_PRELUDE + r"""
// one box of `map` at (x, y) into shared memory by TMA, then its bytes as they lie to `out`
extern "C" __global__ void tma_box(const unsigned long long* map, unsigned* out, int x, int y,
                                   unsigned bytes) {
  extern __shared__ unsigned char raw[];
  unsigned* box = (unsigned*)(((unsigned long long)raw + 1023) & ~1023ull);
  __shared__ unsigned long long bar;
  if (threadIdx.x == 0) {
    dnnc_mbarrier_init(&bar, 1);
    dnnc_fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x < 32 && dnnc_elect_one()) {
    dnnc_prefetch_tensor_map(map);
    dnnc_mbarrier_expect_tx(&bar, bytes);
    dnnc_tma_load_2d(box, map, &bar, x, y);
  }
  dnnc_mbarrier_wait(&bar, 0);
  for (unsigned i = threadIdx.x; i < bytes / 4; i += blockDim.x) out[i] = box[i];
}

#define STAGES %(stages)d
// Y [m, n] fp32 = A [m, k] B [k, n], fp16, A K-major, B MN-major ([k, n]): maps[0..15] A's
// (boxes 64 k x 128 rows), maps[16..31] B's (boxes 64 n x 64 k); warpgroups 0, 1 consume
// (64 rows each), warpgroup 2 produces (one elected thread)
extern "C" __global__ void __launch_bounds__(384, 1) tma_product(
    const unsigned long long* maps, float* y, int m, int n, int k) {
  extern __shared__ unsigned char raw[];
  unsigned char* pool = (unsigned char*)(((unsigned long long)raw + 1023) & ~1023ull);
  unsigned* a_tile = (unsigned*)pool;                       // STAGES x 16 KiB
  unsigned* b_tile = (unsigned*)(pool + STAGES * 16384);    // STAGES x 8 KiB
  __shared__ unsigned long long full[STAGES], empty[STAGES];
  const int tiles = (k + 63) / 64;
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
      for (int kt = 0; kt < tiles; ++kt) {
        const int slot = kt %% STAGES;
        if (kt >= STAGES) dnnc_mbarrier_wait(&empty[slot], (kt / STAGES + 1) %% 2);
        dnnc_mbarrier_expect_tx(&full[slot], 16384 + 8192);
        dnnc_tma_load_2d(a_tile + slot * 4096, maps, &full[slot], kt * 64, blockIdx.y * 128);
        dnnc_tma_load_2d(b_tile + slot * 2048, maps + 16, &full[slot], blockIdx.x * 64, kt * 64);
      }
    }
    return;
  }
  dnnc_setmaxnreg_inc<232>();
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  const unsigned wy = warp / 4;
  for (int kt = 0; kt < tiles; ++kt) {
    const int slot = kt %% STAGES;
    dnnc_mbarrier_wait(&full[slot], kt / STAGES %% 2);
    dnnc_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {   // k steps of 16: 32 bytes of a K-major row, 16 B rows
      unsigned long long da = dnnc_wgmma_desc(a_tile + slot * 4096 + wy * 64 * 32 + ks * 8,
                                              16, 1024);
      unsigned long long db = dnnc_wgmma_desc(b_tile + slot * 2048 + ks * 16 * 32, 8192, 1024);
      dnnc_wgmma_fp16_n64<0, 1>(acc, da, db);
    }
    dnnc_wgmma_commit();
    dnnc_wgmma_wait<1, 32>(acc);
    if (kt > 0 && threadIdx.x %% 32 == 0) dnnc_mbarrier_arrive(&empty[(kt - 1) %% STAGES]);
  }
  dnnc_wgmma_wait<0, 32>(acc);
  const unsigned lane = threadIdx.x %% 32, g = lane / 4, q = lane %% 4;
#pragma unroll
  for (int r = 0; r < 32; ++r) {   // wgmma's D layout: register 4 nt + 2 half + v
    const int i = blockIdx.y * 128 + wy * 64 + warp %% 4 * 16 + g + 8 * (r / 2 %% 2);
    const int j = blockIdx.x * 64 + r / 4 * 8 + 2 * q + r %% 2;
    if (i < m && j < n) y[(long long)i * n + j] = acc[r];
  }
}
""".replace("%(stages)d", str(STAGES)).replace("%%", "%")


def test_tensor_maps_outside_tma_s_limits_are_refused():
    """Boxes wider than the swizzle's 128 bytes or past 256 a dimension, unaligned addresses
    or strides, unknown types: a DeviceError naming them, before the driver is asked."""
    for args in ((0x1000, "float16", (64, 8), (128,), (128, 8)),     # 256 bytes inner
                 (0x1000, "float16", (64, 512), (128,), (64, 512)),  # 512 rows
                 (0x1008, "float16", (64, 8), (128,), (64, 8)),      # address
                 (0x1000, "float16", (60, 8), (120,), (60, 8)),      # stride
                 (0x1000, "float64", (64, 8), (512,), (16, 8)),
                 (0x1000, "float16", (64, 8), (), (64, 8))):
        with pytest.raises(DeviceError):
            tensor_map.encode_tiled(*args)


def test_the_tma_helpers_compile_for_sm90a():
    """TMA_PRELUDE's copies, byte counts, election and register split are PTX NVRTC takes
    for sm_90a; the product keeps the consumers' accumulators in registers (no spills)."""
    nvrtc = pytest.importorskip("cupy.cuda").nvrtc
    prog, log = nvrtc_compiled(KERNELS, "sm_90a", "--ptxas-options=-v")
    ptx = nvrtc.getPTX(prog).decode()
    nvrtc.destroyProgram(prog)
    assert "setmaxnreg ignored" not in log, log
    assert re.search(r"[1-9]\d* bytes spill", log) is None, log
    for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::"
                        "complete_tx::bytes", "mbarrier.arrive.expect_tx", "elect.sync",
                        "setmaxnreg.inc.sync.aligned.u32 232",
                        "setmaxnreg.dec.sync.aligned.u32 40", "prefetch.tensormap",
                        "fence.mbarrier_init", "wgmma.mma_async.sync.aligned.m64n64k16"):
        assert instruction in ptx, instruction


def _module():
    import cupy as cp

    arch = device.gpu_arch()
    if not device.has_wgmma(arch):
        pytest.skip(f"TMA and wgmma need sm_90, not {arch}")
    raw = cp.cuda.function.Module()
    raw.load(device.nvrtc_compile(KERNELS, arch + "a", device.nvrtc_options(arch + "a")))
    return raw


def _placed(tile: wgmma._SwizzledTile, o: int, c: int) -> int:
    """The byte of slot 0 where `tile` holds chunk c (16 bytes) of its row o."""
    word = L.simplify_expr(tile.word(L.const(0), L.const(o), L.const(c)))
    assert isinstance(word, L.Const), word
    return word.value * 4


@pytest.mark.gpu
@pytest.mark.parametrize("rows_contiguous", [False, True])
def test_a_tma_box_lands_where_the_swizzled_tile_puts_it(rows_contiguous, rng):
    """A 16-bit operand [outer, inner] (K-major: rows x k; MN-major: k x columns): the box
    at (inner 64, outer 64) of a tensor map, 64 inner elements by `box rows` outer ones,
    lands byte for byte as `_SwizzledTile` lays a k tile (K-major: its 128 block rows;
    MN-major: a 64-column atom of its 64 k rows), and past the tensor's edge as zeros."""
    import cupy as cp

    fn = _module().get_function("tma_box")
    outer, inner = (150, 200) if not rows_contiguous else (100, 136)
    box_rows = 128 if not rows_contiguous else 64
    x = rng.integers(1, 2 ** 16, (outer, inner), dtype=np.uint16)   # (no zeros)
    x_dev = cp.asarray(x)
    m = cp.asarray(tensor_map.operand_map(x_dev.data.ptr, "uint16", (1, outer, inner),
                                          box_rows))
    nbytes = box_rows * 128
    out = cp.zeros(nbytes // 4, cp.uint32)
    device.allow_shared(fn, nbytes + 1024)
    fn((1,), (128,), (m, out, np.int32(64), np.int32(64), np.uint32(nbytes)),
       shared_mem=nbytes + 1024)
    got = cp.asnumpy(out).view(np.uint16)
    # the consumers' tile: K-major rows = block rows, MN-major rows = k (one 64-wide atom)
    operand = Operand(lambda b, i, kk: L.Buffer("x", T.float16, (256, 64))[i, kk],
                      rows_contiguous, True)
    tile = wgmma._SwizzledTile("a", box_rows if not rows_contiguous else 64, L.const(0), 256,
                               operand, 64, 64, 128, False, L.Var("bi"), "fp16", 1)
    assert tile.k_inner != rows_contiguous
    want = np.zeros(nbytes // 2, np.uint16)
    for r in range(box_rows):
        for c in range(8):
            at = _placed(tile, r, c) // 2
            i, j = 64 + r, 64 + 8 * c
            if i < outer:
                part = x[i, j: min(j + 8, inner)]
                want[at: at + len(part)] = part
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(256, 320, 128), (200, 200, 136), (128, 1024, 64)])
def test_a_tma_fed_warp_specialised_product_is_within_fp16_s_bound(m, k, n, rng):
    """Y = A B at fp16 operands, fp32 sums: one elected producer thread's TMA copies into a
    4-slot ring (`full` completed by bytes, `empty` by the 8 consumer warps), setmaxnreg
    40 / 232, two consumer warpgroups' wgmmas on the 128-byte swizzle; tiles past m, n and
    k read TMA's zeros. Within fp16's bound of the float64 product (exact operands)."""
    import cupy as cp

    fn = _module().get_function("tma_product")
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    a_dev, b_dev = cp.asarray(a), cp.asarray(b)
    maps = cp.asarray(np.concatenate([
        tensor_map.operand_map(a_dev.data.ptr, "float16", (1, m, k), BLOCK_M),
        tensor_map.operand_map(b_dev.data.ptr, "float16", (1, k, n), BLOCK_K)]))
    y = cp.full((m, n), np.nan, cp.float32)
    shared = STAGES * (BLOCK_M + BLOCK_N) * BLOCK_K * 2 + 1024
    device.allow_shared(fn, shared)
    fn((-(-n // BLOCK_N), -(-m // BLOCK_M)), (384,), (maps, y, np.int32(m), np.int32(n),
                                                       np.int32(k)), shared_mem=shared)
    got = cp.asnumpy(y)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    # exact fp16 products summed in fp32 (k 2^-24) by the tensor cores' adder (k 2^-23 more)
    assert np.isfinite(got).all()
    assert (np.abs(got - want) <= k * (2.0 ** -24 + 2.0 ** -23) * scale).all()
