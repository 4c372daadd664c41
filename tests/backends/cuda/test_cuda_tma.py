"""TMA on sm_90a (`prelude.TMA_PRELUDE`, `tensor_map.py`, `L.TmaLoad`, the wgmma template's
`producer="tma"`): the tensor maps' limits checked on the host; the IR's TMA copy and
"expect_tx" barrier verified, printed, rendered (the kernel's tensor-map arguments named by
parameter and box) and refused by llvm; on host threads (test_host_semantics.py's shim: a
map is a plain struct, a copy lands at once in the swizzle and completes its bytes on the
barrier) a copy means what the IR says, and the template's TMA producer's products are
within the precision's bound (both layouts, edges, batches, split k, cluster sums, staged
results, operands TMA cannot copy falling back); NVRTC compiles them and the PTX helpers
for sm_90a (no GPU needed) without spills; on an H100 / H200 (`gpu`) a tensor map's box
lands in shared memory exactly where `wgmma._SwizzledTile` puts it (K-major and MN-major),
the template's products are within the bound with maps `tensor_map.kernel_map` built, and
a warp-specialised product written by hand (`tma.py`: one elected producer thread's copies,
`setmaxnreg` moving its registers to two consumer warpgroups) is within the bound too.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace

import numpy as np
import pytest

from dnnc.backends.cuda import device, mma, tensor_map, tma, wgmma
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.dense import Operand
from dnnc.backends.cuda.prelude import MMA_PRELUDE, PRELUDE, TMA_PRELUDE, WGMMA_PRELUDE
from dnnc.errors import DeviceError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from cuda_kernels import nvrtc_compiled
from test_cuda_mma_pipeline import check, operands, product

on_host = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


def W(*args, **kw):
    return mma.TensorCoreConfig(*args, wgmma=True, **kw)


# (precision, m, n, k, batch, config, operand dtype, trans_a, trans_b): the template's TMA
# producer; the last two cannot copy by TMA (an fp32 operand; a K-major B of k 300, rows
# not 16-byte strided): the plain loop, no producer
TMA_CASES = [
    ("fp16", 128, 128, 384, 1, W(64, 128, 64, 4, 1, 3, producer="tma"), T.float16, False,
     False),
    ("bf16", 136, 200, 296, 2, W(128, 128, 64, 8, 1, 3, producer="tma"), T.bfloat16, True,
     False),
    ("bf16", 72, 136, 712, 1, W(64, 128, 64, 4, 1, 5, 2, producer="tma"), T.bfloat16, False,
     True),
    ("fp16", 104, 200, 520, 1, W(128, 192, 64, 8, 1, 3, producer="tma", staged=True),
     T.float16, True, False),
    ("fp16", 128, 192, 512, 1, W(64, 192, 64, 4, 1, 5, 4, producer="tma",
                                 cluster_split=True), T.float16, False, False),
    ("fp16", 200, 512, 1096, 1, W(128, 256, 64, 8, 1, 4, producer="tma"), T.float16, False,
     True),
    ("bf16", 100, 136, 300, 1, W(64, 128, 64, 4, 1, 3, producer="tma"), T.float32, True,
     True),
    ("fp16", 96, 136, 300, 1, W(128, 128, 64, 8, 1, 4, producer="tma", staged=True),
     T.float16, False, True),
    ("bf16", 200, 136, 3080, 1, W(128, 64, 64, 8, 1, 8, producer="tma", staged=True),
     T.bfloat16, False, False),
]
TMA_DEVICE_CASES = TMA_CASES + [
    ("fp16", 4096, 4096, 4096, 1, W(128, 256, 64, 8, 1, 4, producer="tma", staged=True),
     T.float16, False, False),
    ("bf16", 1024, 768, 3072, 1, W(64, 192, 64, 4, 1, 6, 2, producer="tma"), T.bfloat16,
     False, False),
    ("fp16", 8192, 3072, 768, 1, W(128, 192, 64, 8, 1, 5, producer="tma", staged=True),
     T.float16, False, True),
    ("bf16", 128, 768, 3072, 1, W(64, 64, 64, 4, 1, 4, producer="tma"), T.bfloat16, False,
     False),
    ("fp16", 1024, 768, 3072, 1, W(128, 64, 64, 8, 1, 8, producer="tma", staged=True),
     T.float16, False, False),
]
"""What NVRTC compiles (and the GPU runs): TMA_CASES and the bench's shapes."""

# (m, n, k, batch, config, trans_a, trans_b, rounded): tf32 products of float32 operands; TMA
# copies those holding tf32 values already (`rounded`) and K-major (A [m, k], B [n, k]: boxes
# of 32 float32 by the block's rows); an MN-major B (through registers) or operands to round
# keep the plain loop
TF32_TMA_CASES = [
    (128, 128, 384, 1, W(64, 128, 32, 4, 1, 3, producer="tma"), False, True, True),
    (136, 200, 296, 2, W(128, 128, 32, 8, 1, 4, producer="tma"), False, True, True),
    (72, 136, 712, 1, W(64, 192, 32, 4, 1, 5, 2, producer="tma"), False, True, True),
    (104, 200, 520, 1, W(128, 64, 32, 8, 1, 8, producer="tma"), False, True, True),
    (100, 136, 300, 1, W(64, 128, 32, 4, 1, 3, producer="tma"), False, False, True),
    (100, 136, 300, 1, W(64, 128, 32, 4, 1, 3, producer="tma"), False, True, False),
]
TF32_TMA_DEVICE_CASES = TF32_TMA_CASES + [
    (4096, 4096, 4096, 1, W(128, 256, 32, 8, 1, 4, producer="tma"), False, True, True),
    (1024, 768, 3072, 1, W(128, 64, 32, 8, 1, 8, producer="tma"), False, True, True),
    (8192, 768, 3072, 1, W(128, 192, 32, 8, 1, 5, producer="tma"), False, True, True),
    (2048, 3072, 768, 1, W(128, 192, 32, 8, 1, 5, producer="tma"), False, True, True),
]
"""tf32's: what NVRTC compiles and the GPU runs (TF32_TMA_CASES and the bench's shapes)."""


def _tf32_case(case) -> tuple:
    """A TF32_TMA_CASES entry as TMA_CASES' (precision, ..., trans_b) and its `rounded`."""
    m, n, k, batch, config, trans_a, trans_b, rounded = case
    return ("tf32", m, n, k, batch, config, T.float32, trans_a, trans_b), rounded

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
                 (0x1000, "float32", (64, 8), (256,), (64, 8)),      # 256 bytes inner
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


# -- the loop IR's TMA copy ----------------------------------------------------------------------

def _copy_func(x_shape=(3, 100, 72), box=(64, 8, 1), coords=(16, 96, 1), dtype=T.float16):
    """One block: thread 0 makes a barrier, copies the box of x's map at `coords` into
    shared memory by TMA and announces its bytes; every thread waits, then the tile's words
    go to y as they lie."""
    x = L.Buffer("x", dtype, x_shape)
    rows = box[1] * box[2]
    y = L.Buffer("y", T.uint32, (rows * 32,))
    tile = L.Buffer("tile", T.uint32, (rows * 32,), L.Scope.SHARED)
    bar = L.Buffer("bar", T.uint64, (1,), L.Scope.SHARED)
    b, i, o = x_shape[::-1], 2, dtype.itemsize
    m = L.TensorMap(x, b, (b[0] * o, b[0] * b[1] * o), box)
    t, w = L.Var("t"), L.Var("w")
    one = L.eq(t, L.const(0))
    body = L.seq(
        L.For(t, 128, L.If(one, L.Mbarrier("init", bar[0], L.const(1))), L.ForKind.THREAD_X),
        L.Barrier(),
        L.For(t, 128, L.seq(
            # (the copy before its announcement: its bytes land first, the count below 0)
            L.If(one, L.seq(L.TmaLoad(tile[0], m, bar[0], tuple(L.const(c) for c in coords)),
                            L.Mbarrier("expect_tx", bar[0], L.const(m.box_bytes)))),
            L.Mbarrier("wait", bar[0], L.const(0)),
            L.For(w, rows * 32 // 128, L.Store(y, (w * 128 + t,), tile[w * 128 + t]),
                  L.ForKind.UNROLLED)), L.ForKind.THREAD_X))
    body = L.Allocate(bar, L.Allocate(tile, body))
    return L.PrimFunc("tma_copy", (x, y), L.For(L.Var("blk"), 1, body, L.ForKind.BLOCK_X)), m


def test_tma_nodes_are_verified_printed_rendered_and_refused_by_llvm():
    """`L.TmaLoad` and an "expect_tx" `L.Mbarrier`: verified (box rows of 128 bytes, rank 3,
    16-byte strides, a parameter's map, shared places, inside the thread loops), printed,
    rendered as TMA_PRELUDE's calls on a tensor-map argument the kernel names by its
    parameter and box (after its workspace), the barriers' inits fenced for the copy
    engine; llvm refuses them."""
    from dnnc.backends.llvm.codegen import CodegenError, ModuleBuilder

    func, m = _copy_func()
    L.verify(func)
    text = str(func)
    assert "mbarrier_expect_tx(bar[0], 1024)" in text, text
    assert "tma_load(tile[0], x[72, 100, 3] strides [144, 14400] box [64, 8, 1] at " \
           "[16, 96, 1], bar[0])" in text, text
    module = render_module([(func, True)])
    assert TMA_PRELUDE in module.source and WGMMA_PRELUDE in module.source
    kernel = module.kernels["tma_copy"]
    assert kernel.tensor_maps == [codegen_arg(0, "float16", (72, 100, 3), (144, 14400),
                                              (64, 8, 1))]
    body = module.source[module.source.index('extern "C"'):]
    assert "const unsigned long long* __restrict__ dnnc_map0)" in body
    assert "dnnc_tma_load_3d(&tile[0LL], dnnc_map0, &bar[0LL], (int)(16LL), (int)(96LL), " \
           "(int)(1LL));" in body, body
    assert "dnnc_mbarrier_expect_tx(&bar[0LL], (unsigned)(1024LL));" in body
    assert body.index("dnnc_fence_mbarrier_init();") > body.index("dnnc_mbarrier_init(")
    assert "DNNC_SHARED_POOL" in body   # (the swizzle is of addresses: a 1024-aligned pool)
    x, tile, bar = func.params[0], L.Buffer("tile", T.uint32, (256,), L.Scope.SHARED), \
        L.Buffer("bar", T.uint64, (1,), L.Scope.SHARED)
    copy = next(n for n in L.walk(func.body) if isinstance(n, L.TmaLoad))
    other = L.Buffer("other", T.float16, (3, 100, 72))
    for bad, why in ((replace(copy, map=replace(m, box=(32, 8, 1))), "box rows of 128"),
                     (replace(copy, map=replace(m, strides=(136, 14400))), "multiples of 16"),
                     (replace(copy, map=replace(m, box=(64, 300, 1))), "at most 256"),
                     (replace(copy, coords=copy.coords[:2]), "rank 3"),
                     (replace(copy, map=replace(m, tensor=other)), "describes a parameter"),
                     (replace(copy, dst=func.params[1][0]), "shared uint32"),
                     (replace(copy, bar=tile[0]), "shared uint64")):
        swapped = L.transform(func.body, lambda n: bad if isinstance(n, L.TmaLoad) else None)
        with pytest.raises(L.LoopIRError, match=why):
            L.verify(replace(func, body=swapped))
    expect = next(n for n in L.walk(func.body) if isinstance(n, L.Mbarrier) and
                  n.op == "expect_tx")
    swapped = L.transform(func.body, lambda n: replace(expect, value=None)
                          if isinstance(n, L.Mbarrier) and n.op == "expect_tx" else None)
    with pytest.raises(L.LoopIRError, match="expect_tx takes an integer count"):
        L.verify(replace(func, body=swapped))
    serial = L.transform(func.body, lambda s: replace(s, kind=L.ForKind.SERIAL)
                         if isinstance(s, L.For) and s.kind is L.ForKind.THREAD_X and
                         any(isinstance(n, L.TmaLoad) for n in L.walk(s)) else None)
    with pytest.raises(L.LoopIRError, match="TMA copy outside a threadIdx.x loop"):
        L.verify(replace(func, body=serial))
    on_cpu = L.transform(func.body, lambda s: replace(s, kind=L.ForKind.SERIAL)
                         if isinstance(s, L.For) else None)
    with pytest.raises(CodegenError, match="GPU-only"):
        ModuleBuilder("m").add(replace(func, body=on_cpu))


def codegen_arg(*args):
    from dnnc.backends.cuda.codegen import TensorMapArg

    return TensorMapArg(*args)


@on_host
@pytest.mark.parametrize("x_shape,box,coords", [
    ((3, 100, 72), (64, 8, 1), (16, 96, 1)),     # past the rows' and columns' edges
    ((2, 40, 64), (64, 16, 2), (0, -4, 1)),      # before row 0, past the batches
    ((1, 256, 128), (64, 256, 1), (64, 0, 0))])  # 256 rows, inside
def test_a_tma_copy_on_host_means_what_the_ir_says(x_shape, box, coords, rng, tmp_path):
    """The box of a tensor map lands as `L.TmaLoad` says: element (i0, i1, i2) of the box
    from x at coords + i (zero outside x), box row i1 + box1 i2 at 128 bytes a row, its
    16-byte chunks in the 128-byte swizzle; its barrier's phase completes once the copy's
    bytes and the announcing arrival are in (the waiters read the tile after)."""
    from test_host_semantics import host_library, launch_on_host

    func, m = _copy_func(x_shape, box, coords)
    module = render_module([(func, True)])
    lib = host_library([(func, True)], tmp_path, module)
    x = rng.integers(1, 2 ** 16, x_shape, dtype=np.uint16).view(np.float16)
    rows = box[1] * box[2]
    y = np.zeros(rows * 32, np.uint32)
    launch_on_host(lib, module.kernels["tma_copy"], [x, y])
    got = y.view(np.uint16).reshape(rows, 64)
    padded = np.zeros((x_shape[0] + 8, x_shape[1] + 512, x_shape[2] + 128), np.uint16)
    padded[4:4 + x_shape[0], 256:256 + x_shape[1], :x_shape[2]] = x.view(np.uint16)
    want = np.zeros((rows, 64), np.uint16)
    for i2 in range(box[2]):
        for i1 in range(box[1]):
            r = i1 + box[1] * i2
            row = padded[4 + coords[2] + i2, 256 + coords[1] + i1,
                         coords[0]: coords[0] + 64]
            for c in range(8):   # chunk c of row r at chunk c ^ r % 8
                place = (c ^ r % 8) * 8
                want[r, place: place + 8] = row[8 * c: 8 * c + 8]
    np.testing.assert_array_equal(got, want)


# -- the template's TMA producer ------------------------------------------------------------------

def _tma_product(case, name="mm"):
    func, config = product(*case, name=name)
    return func, config


@on_host
@pytest.mark.parametrize("case", TMA_CASES, ids=[str(i) for i in range(len(TMA_CASES))])
def test_the_tma_producer_s_products_on_host_within_the_precision_bound(case, rng, tmp_path):
    """`producer="tma"`: the producer warpgroup's one thread announces each k tile's bytes on
    its slot's `full` barrier (count 1) and copies the operands' boxes by TMA (A K-major: one
    box of its block rows; MN-major: one a 64-row atom), no cp.async and no proxy fence in
    the block; the maps' extents the product's, so tiles past m, n and k read zeros. Where
    an operand has no map (fp32 through registers; rows not 16-byte strided) the block is
    the plain loop's: its warps copy, no producer warpgroup, no mbarrier."""
    from test_host_semantics import host_library, launch_on_host

    precision, m, n, k, batch, config, dtype, trans_a, trans_b = case
    func, config = _tma_product(case)
    module = render_module([(func, True)])
    info = module.kernels[func.name]
    body = module.source[module.source.index('extern "C"'):]
    runs = (m if trans_a else k, k if trans_b else n)
    by_tma = dtype is mma.STORAGE[precision] and all(x % 8 == 0 for x in runs)
    assert ("dnnc_tma_load_3d(" in body) == by_tma == (len(info.tensor_maps) == 2)
    assert ("dnnc_mbarrier_" in body) == by_tma
    assert info.launches[0].block[0] == (config.threads if by_tma else
                                         config.warps_m * config.warps_n * 32)
    if by_tma:
        assert "dnnc_cp_async(" not in body and "dnnc_fence_proxy_async" not in body
        assert [t.param for t in info.tensor_maps] == [0, 1]
        assert info.tensor_maps[0].extents[:2] == ((m, k) if trans_a else (k, m))
        assert info.tensor_maps[1].box == (64, 64 if not trans_b else config.block_n, 1)
    lib = host_library([(func, True)], tmp_path, module)
    a, b, bias, stored = operands(rng, m, n, k, batch, dtype, trans_a, trans_b)
    y = np.full((batch, m, n), np.nan, np.float32)
    launch_on_host(lib, info, stored + [y] + [np.full(size, 0xFF, np.uint8)
                                              for size in info.workspace])
    check(precision, k, a, b, bias, y)


@on_host
@pytest.mark.parametrize("case", TF32_TMA_CASES, ids=[str(i) for i in range(len(TF32_TMA_CASES))])
def test_the_tma_producer_copies_tf32_values_on_host_within_the_bound(case, rng, tmp_path):
    """At tf32, K-major float32 operands holding tf32 values (`Operand.rounded`, as
    passes/store_tf32.py stores them) are copied by TMA as they lie: maps of float32 in boxes
    of 32 k (128 bytes) by the block's rows, no rounding in the kernel; an MN-major B or an
    operand to round keeps the plain loop (no producer). Within the tf32 bound of the
    rounded operands' product."""
    from test_host_semantics import host_library, launch_on_host

    from dnnc.ir.ops.packed import round_tf32

    full, rounded = _tf32_case(case)
    _, m, n, k, batch, config, dtype, trans_a, trans_b = full
    func, config = product(*full, name="mm", rounded=rounded)
    module = render_module([(func, True)])
    info = module.kernels[func.name]
    body = module.source[module.source.index('extern "C"'):]
    by_tma = rounded and trans_b and not trans_a
    assert ("dnnc_tma_load_3d(" in body) == by_tma == (len(info.tensor_maps) == 2)
    assert info.launches[0].block[0] == (config.threads if by_tma else
                                         config.warps_m * config.warps_n * 32)
    if by_tma:
        assert "dnnc_cp_async(" not in body and "dnnc_tf32(" not in body
        assert [(t.dtype, t.box) for t in info.tensor_maps] == [
            ("float32", (32, config.block_m, 1)), ("float32", (32, config.block_n, 1))]
        assert info.tensor_maps[0].extents[:2] == (k, m)
        assert info.tensor_maps[1].strides[0] == 4 * k
    lib = host_library([(func, True)], tmp_path, module)
    _, _, bias, stored = operands(rng, m, n, k, batch, dtype, trans_a, trans_b)
    if rounded:
        stored[:2] = [round_tf32(x) for x in stored[:2]]
    a = (stored[0].transpose(0, 2, 1) if trans_a else stored[0]).astype(np.float64)
    b = (stored[1].transpose(0, 2, 1) if trans_b else stored[1]).astype(np.float64)
    y = np.full((batch, m, n), np.nan, np.float32)
    launch_on_host(lib, info, stored + [y] + [np.full(size, 0xFF, np.uint8)
                                              for size in info.workspace])
    check("tf32", k, a, b, bias, y)


def test_the_tma_producer_s_products_compile_for_sm90a_without_spills():
    """NVRTC compiles the TMA cases and the bench's shapes for sm_90a: TMA copies and byte
    counts in the PTX, no spills, the wgmmas not serialized (no C7515-C7518)."""
    nvrtc = pytest.importorskip("cupy.cuda").nvrtc
    funcs = [(_tma_product(case, f"case{i}")[0], True)
             for i, case in enumerate(TMA_DEVICE_CASES)] + [
        (product(*full, name=f"tf32_case{i}", rounded=rounded)[0], True)
        for i, (full, rounded) in enumerate(map(_tf32_case, TF32_TMA_DEVICE_CASES))]
    source = render_module(funcs).source
    assert device.compile_arch("sm_90", source) == "sm_90a"
    prog, log = nvrtc_compiled(source, "sm_90a", "--ptxas-options=-v")
    ptx = nvrtc.getPTX(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    nvrtc.destroyProgram(prog)
    assert re.search(r"C75\d\d", log) is None, log[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) >= len(funcs) and all(int(x) == 0 for x in spills), log[-4000:]
    for instruction in ("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::"
                        "complete_tx::bytes", "mbarrier.arrive.expect_tx",
                        "fence.mbarrier_init", "wgmma.mma_async.sync.aligned.m64n256k16",
                        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32"):
        assert instruction in ptx, instruction


def test_the_tma_producer_is_a_value_of_the_producer_knob():
    """The sm_90 space's `producer` knob takes "tma" beside False and True, at fp16, bf16 and
    tf32; sm_80's has none of them."""
    def values(arch, precision="fp16"):
        space = mma.product_space("s", 4096, 1, precision, arch)
        return dict((x.name, x.values) for x in space.knobs)["producer"]

    assert values("sm_90") == (False, True, "tma") and values("sm_80") == (False,)
    mma.product_space("s", 4096, 1, "bf16", "sm_90").check(
        W(128, 256, 64, 8, 1, 4, producer="tma"))
    mma.product_space("s", 4096, 1, "tf32", "sm_90").check(
        W(128, 256, 32, 8, 1, 4, producer="tma"))
    assert W(128, 256, 64, 8, 1, 4, producer="tma").threads == 384


@pytest.mark.parametrize("switch", [None, "tma"])
def test_the_dense_default_gives_every_wgmma_tile_the_tma_producer(switch, monkeypatch):
    """DNNC_PRODUCER unset (PRODUCER_DEFAULT, products deeper than SHALLOW_K) or =tma: the
    dense default's wgmma tiles take producer "tma" at fp16, bf16 and tf32 (the refill knobs
    off; at tf32 the default takes wgmma only where both operands hold tf32 values, which
    TMA copies), not on mma.sync; =1 the cp.async producer, =0 none."""
    if switch is None:
        monkeypatch.delenv(mma.DNNC_PRODUCER, raising=False)
    else:
        monkeypatch.setenv(mma.DNNC_PRODUCER, switch)
    tile = W(64, 192, 64, 4, 1, 5, 2, refill_first=True)
    for precision in ("fp16", "bf16"):
        c = mma.producer_by_default(tile, precision, 768)
        assert c == replace(tile, producer="tma", refill_first=False)
    assert mma.producer_by_default(replace(tile, block_k=32), "tf32", 768) == replace(
        tile, block_k=32, producer="tma", refill_first=False)
    assert not mma.producer_by_default(mma.TensorCoreConfig(64, 64, 32, 2, 2, 3), "fp16",
                                       768).producer
    if switch is None:   # shallow products: untimed with it, the plain loop
        assert mma.producer_by_default(tile, "fp16", mma.SHALLOW_K) == tile
    monkeypatch.setenv(mma.DNNC_PRODUCER, "1")
    assert mma.producer_by_default(tile, "fp16", 768).producer is True
    monkeypatch.setenv(mma.DNNC_PRODUCER, "0")
    assert mma.producer_by_default(tile, "fp16", 768) == tile


@pytest.mark.gpu
@pytest.mark.parametrize("case", TMA_DEVICE_CASES,
                         ids=[str(i) for i in range(len(TMA_DEVICE_CASES))])
def test_the_tma_producer_s_products_on_the_gpu_within_the_precision_bound(case, rng):
    """On an H100 / H200: each kernel's tensor maps built by `tensor_map.kernel_map` from
    its `TensorMapArg`s and the operands' addresses, passed after the workspace."""
    from test_cuda_wgmma import product_on_the_gpu_within_the_bound

    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"TMA and wgmma need sm_90, not {device.gpu_arch()}")
    func, _ = _tma_product(case)
    product_on_the_gpu_within_the_bound(func, case, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("case", TF32_TMA_DEVICE_CASES,
                         ids=[str(i) for i in range(len(TF32_TMA_DEVICE_CASES))])
def test_the_tma_producer_s_tf32_products_on_the_gpu_within_the_bound(case, rng):
    """On an H100 / H200, tf32: float32 maps of operands holding tf32 values (rounded here
    first, as the kernels producing them store them), within the bound."""
    from test_cuda_wgmma import product_on_the_gpu_within_the_bound

    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"TMA and wgmma need sm_90, not {device.gpu_arch()}")
    full, rounded = _tf32_case(case)
    func, _ = product(*full, name="mm", rounded=rounded)
    product_on_the_gpu_within_the_bound(func, full, rng, rounded=rounded)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_a_model_runs_on_the_tma_producer_on_the_gpu(precision, monkeypatch, tmp_path):
    """The runtime's path on an H100 / H200 with DNNC_PRODUCER=tma: the executable encodes
    each kernel's tensor maps once the frame's arena is allocated (and again for a caller's
    array read in place: its graph's maps), an artifact carries their description and the
    loaded model builds them again; every output within the precision's model bound of the
    numpy target's."""
    import cupy as cp

    import dnnc
    from dnnc import zoo
    from dnnc.ir.target import model_error_bound

    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"TMA and wgmma need sm_90, not {device.gpu_arch()}")
    monkeypatch.setenv(mma.DNNC_PRODUCER, "tma")
    model = zoo.build("mlp", hidden=(2048,), in_features=1024, classes=512, batch=4096)
    (x,) = zoo.inputs_for(model, np.random.default_rng(0)).values()
    want = np.asarray(dnnc.compile(model, "numpy")(x), np.float64)
    compiled = dnnc.compile(model, "cuda", precision=precision, outputs="numpy")
    assert "dnnc_tma_load_3d(" in compiled.source("cuda")

    def error(got) -> float:
        return np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()

    assert error(compiled(x)) <= model_error_bound(precision)
    x_dev = cp.asarray(x)
    for _ in range(3):   # the second call captures a graph on x_dev's address
        assert error(compiled(x_dev)) <= model_error_bound(precision)
    compiled.save(tmp_path / "m.dnnc")
    loaded = dnnc.load(tmp_path / "m.dnnc")
    assert error(loaded(x)) <= model_error_bound(precision)


@pytest.mark.gpu
def test_the_tma_producer_s_maps_stay_bounded_over_many_callers_arrays(monkeypatch):
    """A serving loop on the runtime's path with DNNC_PRODUCER=tma: 3 * GRAPHS_PER_FRAME
    device arrays (two contents, each array at its own address), each called twice (the
    second call captures a graph with its own tensor maps): every output within the model
    bound, at most GRAPHS_PER_FRAME graphs a frame and one dropped graph's maps waiting, and
    the CuPy pool's bytes in use no higher after the last third than after the second (a
    dropped graph's maps are freed once it has run: `_CompiledSegment._retire`)."""
    import cupy as cp

    import dnnc
    from dnnc import zoo
    from dnnc.backends.cuda.executable import GRAPHS_PER_FRAME
    from dnnc.ir.target import model_error_bound

    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"TMA and wgmma need sm_90, not {device.gpu_arch()}")
    monkeypatch.setenv(mma.DNNC_PRODUCER, "tma")
    model = zoo.build("mlp", hidden=(2048,), in_features=1024, classes=512, batch=4096)
    rng = np.random.default_rng(3)
    (name, x), = zoo.inputs_for(model, rng).items()
    xs = [x, rng.standard_normal(x.shape).astype(x.dtype)]
    reference = dnnc.compile(model, "numpy")
    wants = [np.asarray(reference(v), np.float64) for v in xs]
    compiled = dnnc.compile(model, "cuda", precision="fp16", outputs="numpy")
    assert "dnnc_tma_load_3d(" in compiled.source("cuda")
    arrays = [cp.asarray(xs[i % 2]) for i in range(3 * GRAPHS_PER_FRAME)]
    pool = cp.get_default_memory_pool()
    used = []
    for third in range(3):
        for i in range(third * GRAPHS_PER_FRAME, (third + 1) * GRAPHS_PER_FRAME):
            for _ in range(2):
                got = np.asarray(compiled(arrays[i]), np.float64)
                want = wants[i % 2]
                error = np.abs(got - want).max() / np.abs(want).max()
                assert error <= model_error_bound("fp16"), (i, error)
        cp.cuda.Device().synchronize()
        used.append(pool.used_bytes())
    frames = [seg.frames.frame for seg in compiled.runtime.compiled_segments()
              if getattr(seg.frames, "frame", None) is not None]
    assert any(f.maps is not None for f in frames)
    for f in frames:
        assert len(f.graphs) <= GRAPHS_PER_FRAME and len(f.retired) <= 1, \
            (len(f.graphs), len(f.retired))
    assert used[2] <= used[1], used
