"""TMA on sm_90a (`prelude.TMA_PRELUDE`, `tensor_map.py`): the tensor maps' limits checked on
the host; the PTX helpers compiled by NVRTC for sm_90a (no GPU needed); on an H100 / H200
(`gpu`) a tensor map's box lands in shared memory exactly where `wgmma._SwizzledTile` puts
it (K-major and MN-major), and a warp-specialised product (one elected producer thread's
TMA copies counted on mbarriers by bytes, `setmaxnreg` moving the producer's registers to
two consumer warpgroups issuing wgmmas from the 128-byte swizzle: `tma.py`, written by
hand, no loop-IR statement renders TMA yet) is within the precision's bound.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dnnc.backends.cuda import device, mma, tensor_map, tma, wgmma
from dnnc.backends.cuda.dense import Operand
from dnnc.backends.cuda.prelude import MMA_PRELUDE, PRELUDE, TMA_PRELUDE, WGMMA_PRELUDE
from dnnc.errors import DeviceError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from cuda_kernels import nvrtc_compiled

BOX = PRELUDE + MMA_PRELUDE + WGMMA_PRELUDE + TMA_PRELUDE + r"""
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
    dnnc_tma_load_3d(box, map, &bar, x, y, 0);
  }
  dnnc_mbarrier_wait(&bar, 0);
  for (unsigned i = threadIdx.x; i < bytes / 4; i += blockDim.x) out[i] = box[i];
}
"""
"""A kernel that copies one box by TMA and writes its shared bytes out as they lie."""


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


@pytest.mark.parametrize("precision,block_n,stages,staged", [
    ("fp16", 64, 4, False), ("bf16", 128, 6, True), ("fp16", 192, 5, False),
    ("bf16", 256, 4, False), ("fp16", 256, 4, True)])
def test_the_tma_product_compiles_for_sm90a(precision, block_n, stages, staged):
    """TMA_PRELUDE's copies, byte counts, election and register split are PTX NVRTC takes
    for sm_90a; the product's consumers keep their accumulators in registers (no spills)
    at the 168 registers 384 threads start with, its wgmmas unserialized (no C7515,
    C7517, C7518) and setmaxnreg kept."""
    nvrtc = pytest.importorskip("cupy.cuda").nvrtc
    source = tma.source(precision, 1000, 768, 3072, block_n, stages, staged)
    assert device.compile_arch("sm_90", source) == "sm_90a"
    prog, log = nvrtc_compiled(source, "sm_90a", "--ptxas-options=-v")
    ptx = nvrtc.getPTX(prog).decode()
    nvrtc.destroyProgram(prog)
    assert re.search(r"C75\d\d|setmaxnreg ignored", log) is None, log
    assert re.search(r"[1-9]\d* bytes spill", log) is None, log
    assert "Used 168 registers" in log, log
    for instruction in ("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::"
                        "complete_tx::bytes", "mbarrier.arrive.expect_tx", "elect.sync",
                        "setmaxnreg.inc.sync.aligned.u32 232",
                        "setmaxnreg.dec.sync.aligned.u32 40", "prefetch.tensormap",
                        "fence.mbarrier_init", f"wgmma.mma_async.sync.aligned.m64n{block_n}k16"):
        assert instruction in ptx, instruction


def test_the_tma_product_refuses_what_it_cannot_run():
    for args in (("tf32", 256, 256, 256, 128, 4), ("fp16", 256, 256, 256, 96, 4),
                 ("fp16", 256, 256, 256, 256, 5), ("fp16", 256, 250, 256, 128, 4),
                 ("fp16", 256, 256, 252, 128, 4)):
        with pytest.raises(ValueError):
            tma.source(*args)


def _module(source: str):
    import cupy as cp

    arch = device.gpu_arch()
    if not device.has_wgmma(arch):
        pytest.skip(f"TMA and wgmma need sm_90, not {arch}")
    raw = cp.cuda.function.Module()
    raw.load(device.nvrtc_compile(source, arch + "a", device.nvrtc_options(arch + "a")))
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

    fn = _module(BOX).get_function("tma_box")
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
@pytest.mark.parametrize("precision,m,k,n,block_n,stages,staged", [
    ("fp16", 256, 320, 128, 64, 4, False), ("fp16", 200, 200, 136, 64, 3, True),
    ("bf16", 300, 1024, 200, 128, 6, False), ("fp16", 1000, 768, 3072, 192, 5, True),
    ("bf16", 520, 3072, 768, 256, 4, True), ("fp16", 128, 4096, 256, 256, 2, False),
    ("bf16", 136, 512, 264, 256, 2, True)])
def test_the_tma_product_is_within_the_precision_s_bound(precision, m, k, n, block_n,
                                                         stages, staged, rng):
    """Y = A B (`tma.source`): one elected producer thread's TMA copies into the ring
    (`full` completed by bytes, `empty` by the 8 consumer warps; rings that wrap many
    times), setmaxnreg 40 / 232, two consumer warpgroups' wgmmas on the 128-byte swizzle;
    blocks past m and n and a k tile past k read TMA's zeros; results from registers or
    staged through the ring. Within the precision's bound
    of the float64 product (exact operands; the 16-bit output's own rounding allowed)."""
    import cupy as cp

    dtype = {"fp16": np.float16, "bf16": mma.STORAGE["bf16"].np}[precision]
    fn = _module(tma.source(precision, m, n, k, block_n, stages, staged)).get_function(
        "tma_product")
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32).astype(dtype)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32).astype(dtype)
    a_dev, b_dev = cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16))
    name = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    maps = cp.asarray(np.concatenate([
        tensor_map.operand_map(a_dev.data.ptr, name, (1, m, k), tma.BLOCK_M),
        tensor_map.operand_map(b_dev.data.ptr, name, (1, k, n), tma.BLOCK_K)]))
    y = cp.full((m, n), 0xffff, cp.uint16)   # (a NaN in either type)
    grid, block, shared = tma.launch(m, n, block_n, stages)
    device.allow_shared(fn, shared)
    fn(grid, block, (maps, y), shared_mem=shared)
    got = cp.asnumpy(y).view(dtype).astype(np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    u = 2.0 ** -11 if precision == "fp16" else 2.0 ** -8
    # exact products summed in fp32 (k 2^-24) by the tensor cores' adder (k 2^-23 more),
    # then Y's rounding to the 16-bit type
    limit = k * (2.0 ** -24 + 2.0 ** -23) * scale + u * np.abs(want)
    if precision == "fp16":
        limit += 2 * k * 2.0 ** -25   # (fp16 subnormals)
    assert np.isfinite(got).all()
    assert (np.abs(got - want) <= limit).all()
