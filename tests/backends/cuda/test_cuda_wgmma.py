"""The warpgroup product of `backends/cuda/wgmma.py` (issue 31, item 2, sm_90): wgmma on
shared tiles in the 128-byte swizzle, fed by the cp.async ring.

- the IR: `Wgmma` and its fence, commit and wait, `ProxyFence` verified, printed, refused by
  llvm; on host threads (test_host_semantics.py's shim: descriptors decoded, products run at
  the wait that completes their group) they mean what the PTX ISA says, checked against a
  NumPy model of the descriptor layouts and the D fragment written from the ISA here;
- the layout: `_SwizzledTile` puts chunk c of row r of an atom at c ^ r % 8, every slot and
  atom on a 1024-byte boundary, 8 consecutive chunks stored in 8 bank groups;
- numbers: products (fp16, bf16; operands in 16 bits by cp.async or fp32 through registers;
  tf32, K-major float32 by cp.async rounded in place or transposed through registers;
  A and B in either layout; edges, batches, split-k, stages 2 to 5, the early refill (its
  second barrier dropped, they fail), a fused epilogue) against NumPy within
  test_cuda_precision.py's `bound`, on the host; compiled by NVRTC for
  sm_90a without spills where CuPy is; on a GPU (`gpu`: an H100 / H200).
- the knob: in the space on sm_90 only; the default picks it on sm_90 only with
  DNNC_WGMMA=1 (or unset, once `mma.WGMMA_DEFAULT` is on); modules using it compile for sm_90a (`device.compile_arch`).
"""

import ctypes
import importlib.util
import re
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from dnnc.backends.cuda import device, mma, wgmma
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.dense import Operand
from dnnc.errors import CompileError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.target import Target
from cuda_kernels import nvrtc_compiled
from test_cuda_mma_pipeline import check, operands, product

C = mma.TensorCoreConfig
on_host = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


def W(*args, **kw):
    return C(*args, wgmma=True, **kw)


# (precision, m, n, k, batch, config, operand dtype, trans_a, trans_b)
CASES = [
    ("fp16", 128, 128, 384, 1, W(64, 128, 64, 4, 1, 3), T.float16, False, False),
    ("bf16", 130, 200, 100, 2, W(128, 128, 64, 8, 1, 3), T.bfloat16, True, True),
    ("bf16", 128, 128, 520, 1, W(128, 128, 64, 8, 1, 4), T.bfloat16, True, False),
    ("fp16", 70, 136, 200, 1, W(64, 128, 64, 4, 2, 4), T.float16, False, True),
    ("bf16", 64, 72, 136, 1, W(64, 64, 64, 4, 1, 5), T.bfloat16, True, False),
    ("fp16", 100, 130, 150, 1, W(64, 128, 64, 4, 1, 3, 2), T.float32, False, True),
    ("fp16", 200, 260, 72, 1, W(128, 256, 64, 8, 1, 3), T.float16, False, False),
    ("tf32", 100, 136, 200, 1, W(64, 128, 32, 4, 1, 3), T.float32, False, True),
    ("tf32", 70, 128, 100, 2, W(128, 128, 32, 8, 1, 4), T.float32, True, False),
    ("fp16", 128, 256, 520, 1, W(128, 128, 64, 8, 1, 2, early_refill=True), T.float16,
     False, False),
    ("bf16", 100, 130, 300, 1, W(64, 128, 64, 4, 1, 3, early_refill=True), T.float32,
     True, True),
    ("fp16", 70, 136, 200, 1, W(64, 128, 64, 4, 2, 4, staged=True), T.float16, False, True),
    # the refill issued before the wgmmas; warpgroups of 192 columns
    ("fp16", 200, 384, 520, 1, W(128, 192, 64, 8, 1, 4, refill_first=True), T.float16,
     False, False),
    ("bf16", 130, 200, 300, 2, W(128, 192, 64, 8, 1, 3, refill_first=True), T.float32,
     True, True),
    ("tf32", 100, 192, 200, 1, W(64, 192, 32, 4, 1, 4, refill_first=True), T.float32,
     False, True),
    ("fp16", 128, 200, 400, 1, W(128, 128, 64, 8, 1, 3, refill_first=True, staged=True),
     T.float16, True, False),
    # split k summed in clusters (the shim runs a cluster's blocks on concurrent threads)
    ("fp16", 128, 192, 512, 1, W(64, 192, 64, 4, 1, 5, 4, refill_first=True,
                                 cluster_split=True), T.float16, False, False),
    ("bf16", 100, 130, 300, 2, W(64, 128, 64, 4, 1, 4, 2, cluster_split=True), T.bfloat16,
     True, True),
    ("fp16", 70, 136, 700, 1, W(128, 128, 64, 8, 1, 3, 8, cluster_split=True), T.float32,
     False, True),
    ("tf32", 100, 192, 300, 1, W(64, 192, 32, 4, 1, 4, 4, refill_first=True,
                                 cluster_split=True), T.float32, False, True),
    # a split of 4 summed in clusters by 128 x 256 tiles (8 runs of 4 sums a thread)
    ("fp16", 200, 512, 1100, 1, W(128, 256, 64, 8, 1, 3, 4, cluster_split=True), T.float16,
     False, False),
    # the producer warpgroup's ring (mbarriers): edges, k past its tiles, both layouts,
    # batches, split k (summed by a launch, in clusters), staged results, more k tiles than
    # slots (each slot's barriers through several phases)
    ("fp16", 128, 128, 384, 1, W(64, 128, 64, 4, 1, 3, producer=True), T.float16, False,
     False),
    ("bf16", 136, 200, 296, 2, W(128, 128, 64, 8, 1, 4, producer=True), T.bfloat16, True,
     True),
    ("fp16", 72, 136, 712, 1, W(64, 128, 64, 4, 1, 5, 2, producer=True), T.float16, False,
     True),
    ("fp16", 104, 200, 520, 1, W(128, 192, 64, 8, 1, 3, producer=True, staged=True),
     T.float16, True, False),
    ("fp16", 128, 192, 512, 1, W(64, 192, 64, 4, 1, 5, 4, producer=True, cluster_split=True),
     T.float16, False, False),
    ("fp16", 200, 512, 1096, 1, W(128, 256, 64, 8, 1, 4, producer=True), T.float16, False,
     False),
    # operands cp.async cannot copy as they lie (fp32 through registers; 16-bit rows of an
    # odd extent): no producer, the warps copy
    ("bf16", 100, 130, 300, 1, W(64, 128, 64, 4, 1, 3, producer=True), T.float32, True,
     True),
    ("fp16", 100, 130, 300, 1, W(128, 128, 64, 8, 1, 4, producer=True, staged=True),
     T.float16, True, True),
]
SMOKE = (0, 1, 2, 5, 7, 9, 11, 12, 14, 16, 17, 21, 22, 23, 24, 25, 27, 28)
"""CASES run on host threads in every run; the rest are `emulated_full`."""

DEVICE_CASES = CASES + [
    ("fp16", 4096, 4096, 4096, 1, W(128, 256, 64, 8, 1, 4), T.float16, False, False),
    ("bf16", 1024, 768, 3072, 1, W(128, 128, 64, 8, 1, 4), T.bfloat16, False, True),
    ("fp16", 8192, 3072, 768, 1, W(128, 256, 64, 8, 1, 4), T.float16, False, False),
    ("tf32", 4096, 4096, 4096, 1, W(128, 256, 32, 8, 1, 4), T.float32, False, True),
    ("tf32", 1024, 3072, 768, 1, W(128, 128, 32, 8, 1, 4), T.float32, False, False),
    ("fp16", 4096, 4096, 4096, 1, W(128, 256, 64, 8, 1, 4, early_refill=True), T.float16,
     False, False),
    ("fp16", 4096, 4096, 4096, 1, W(128, 256, 64, 8, 1, 4, refill_first=True), T.float16,
     False, False),
    ("bf16", 8192, 768, 3072, 1, W(128, 192, 64, 8, 1, 5, refill_first=True), T.bfloat16,
     False, False),
    ("tf32", 8192, 768, 3072, 1, W(128, 192, 32, 8, 1, 5, refill_first=True), T.float32,
     False, True),
] + [
    ("fp16", 512, 768, 3072, 1, W(64, 192, 64, 4, 1, 5, 4, refill_first=True,
                                  cluster_split=True), T.float16, False, False),
    ("bf16", 1024, 768, 3072, 1, W(128, 192, 64, 8, 1, 5, 4, refill_first=True,
                                   cluster_split=True), T.bfloat16, False, False),
] + [
    ("fp16", 4096, 4096, 4096, 1, W(128, 256, 64, 8, 1, 4, producer=True), T.float16, False,
     False),
    ("bf16", 1024, 768, 3072, 1, W(64, 192, 64, 4, 1, 6, 2, producer=True), T.bfloat16,
     False, False),
    ("fp16", 8192, 3072, 768, 1, W(128, 192, 64, 8, 1, 5, producer=True, staged=True),
     T.float16, False, False),
]
"""What NVRTC compiles (and the GPU runs): CASES and the bench's shapes."""


# -- the IR ---------------------------------------------------------------------------------------

def _single_wgmma(precision="fp16", n=64, a_mn=False, b_mn=False):
    """One warpgroup: x (A then B, as uint32 words, each operand's bytes as the descriptor
    layouts place them) copied into a shared pool buffer, fenced into the async proxy, one
    wgmma, its group committed and waited for, the accumulators into y."""
    e = 4 if precision == "tf32" else 2
    k = L.WGMMA_K[precision]
    a_bytes, b_bytes = _extent(64, k, e, a_mn), _extent(n, k, e, b_mn)
    words = (a_bytes + b_bytes) // 4
    x = L.Buffer("x", T.uint32, (words,))
    y = L.Buffer("y", T.float32, (128 * n // 2,))
    tile = L.Buffer("tile", T.uint32, (words,), L.Scope.SHARED)
    acc = L.Buffer("acc", T.float32, (n // 2,), L.Scope.LOCAL)
    t, r, s = L.Var("t"), L.Var("r"), L.Var("s")
    copy = L.For(s, -(-words // 128), L.If(s * 128 + t < words, L.Store(
        tile, (s * 128 + t,), x[s * 128 + t])), L.ForKind.SERIAL)
    product_ = L.seq(
        L.For(r, n // 2, L.Store(acc, (r,), L.const(0.0, T.float32)), L.ForKind.UNROLLED),
        L.WgmmaFence(),
        L.Wgmma(precision, n, acc[0], tile[0], tile[a_bytes // 4], a_mn, b_mn,
                _OFFSETS[a_mn], _OFFSETS[b_mn]),
        L.WgmmaCommit(), L.WgmmaWait(0, acc[0], n // 2),
        L.For(r, n // 2, L.Store(y, (t * (n // 2) + r,), acc[r]), L.ForKind.UNROLLED))
    body = L.Allocate(tile, L.seq(
        L.For(t, 128, L.seq(copy, L.ProxyFence()), L.ForKind.THREAD_X), L.Barrier(),
        L.For(t, 128, L.Allocate(acc, product_), L.ForKind.THREAD_X)))
    return L.PrimFunc(f"one_{precision}_{n}_{int(a_mn)}{int(b_mn)}", (x, y),
                      L.For(L.Var("b"), 1, body, L.ForKind.BLOCK_X)), a_bytes


# (leading, stride) bytes of the test's layouts: K-major 8-row groups 1024 apart; MN-major
# atoms 2048 apart (16 k rows of 128 bytes), 8-row groups of k 1024 apart
_OFFSETS = {False: (16, 1024), True: (2048, 1024)}


def _extent(x: int, k: int, e: int, mn: bool) -> int:
    """Bytes of an operand of x rows (A's m or B's n) and depth k in the test's layout."""
    return -(-x // 64) * 2048 if mn else x // 8 * 1024


def _place(x: int, kk: int, e: int, mn: bool) -> int:
    """The byte of element (x, kk) in the test's layout, from the PTX ISA's canonical
    layouts with the 128-byte swizzle (16-byte chunk c of a 128-byte row r at c ^ r % 8)."""
    leading, stride = _OFFSETS[mn]
    o = x // 64 * leading + x % 64 * e + kk // 8 * stride + kk % 8 * 128 if mn else \
        x // 8 * stride + x % 8 * 128 + kk * e
    return _swizzled(o)


def test_wgmma_nodes_are_verified_printed_and_refused_by_llvm():
    from dnnc.backends.llvm.codegen import CodegenError, ModuleBuilder

    func, _ = _single_wgmma(b_mn=True)
    L.verify(func)
    text = str(func)
    for line in ("wgmma_m64n64_fp16(acc[0], a=tile[0] k-major (16, 1024), b=tile[2048] "
                 "mn-major (2048, 1024))", "wgmma_fence()", "wgmma_commit()",
                 "wgmma_wait(0, acc[0]:+32)", "fence_proxy_async()"):
        assert line in text, text
    wgmma_of = lambda f: (lambda s: f(s) if isinstance(s, L.Wgmma) else None)   # noqa: E731
    for change, message in ((lambda s: replace(s, n=12), "n=12"),
                            (lambda s: replace(s, precision="tf32"), "tf32 K-major only"),
                            (lambda s: replace(s, a=s.acc), "shared uint32 words"),
                            (lambda s: replace(s, a_offsets=(8, 1024)), "16-byte multiples"),
                            # a sparse one takes its metadata, K-major A; a dense one none
                            (lambda s: replace(s, precision="sp_fp16"), "metadata register"),
                            (lambda s: replace(s, meta=L.const(0, T.uint32)),
                             "metadata register"),
                            (lambda s: replace(s, precision="sp_bf16", a_mn_major=True,
                                               meta=L.const(0, T.uint32)), "A too")):
        with pytest.raises(L.LoopIRError, match=message):
            L.verify(L.transform(func, wgmma_of(change)))
    sparse = L.transform(func, wgmma_of(lambda s: replace(s, precision="sp_fp16",
                                                          meta=L.const(7, T.uint32))))
    L.verify(sparse)
    assert "wgmma_m64n64_sp_fp16(acc[0], a=tile[0] k-major (16, 1024)" in str(sparse) and \
        "meta=uint32(7))" in str(sparse)
    serial = L.transform(func.body, lambda s: replace(s, kind=L.ForKind.SERIAL)
                         if isinstance(s, L.For) and s.kind is L.ForKind.THREAD_X else None)
    with pytest.raises(L.LoopIRError, match="wgmma outside a threadIdx.x loop"):
        L.verify(replace(func, body=serial))
    on_cpu = L.transform(func.body, lambda s: replace(s, kind=L.ForKind.SERIAL)
                         if isinstance(s, L.For) and s.kind is not L.ForKind.UNROLLED else None)
    on_cpu = L.transform(on_cpu, lambda s: L.seq() if isinstance(s, L.Barrier) else None)
    with pytest.raises(CodegenError, match="wgmma.*GPU-only"):
        ModuleBuilder("m").add(replace(func, body=on_cpu))


def _model(raw: np.ndarray, a_bytes: int, precision: str, n: int, a_mn: bool, b_mn: bool):
    """y [thread, register] of one wgmma on the bytes `raw`, from the PTX ISA: the operands
    read through `_place`, thread t (warp w, g, q) holding D[16 w + g + 8 (r // 2 % 2),
    8 (r // 4) + 2 q + r % 2] in register r."""
    e = 4 if precision == "tf32" else 2
    k = L.WGMMA_K[precision]
    kind = {"tf32": np.float32, "fp16": np.float16, "bf16": None}[precision]

    def value(offset: int) -> float:
        bits = raw[offset: offset + e]
        if precision == "bf16":
            return float(np.frombuffer(b"\0\0" + bits.tobytes(), np.float32)[0])
        if precision == "tf32":
            word = np.frombuffer(bits.tobytes(), np.uint32)[0] & np.uint32(0xFFFFE000)
            return float(np.array(word, np.uint32).view(np.float32))
        return float(np.frombuffer(bits.tobytes(), kind)[0])

    a = np.array([[value(_place(i, kk, e, a_mn)) for kk in range(k)] for i in range(64)])
    b = np.array([[value(a_bytes + _place(j, kk, e, b_mn)) for j in range(n)]
                  for kk in range(k)])
    d = a @ b
    out = np.zeros((128, n // 2))
    for t in range(128):
        w, g, q = t // 32, t % 32 // 4, t % 4
        for r in range(n // 2):
            out[t, r] = d[16 * w + g + 8 * (r // 2 % 2), 8 * (r // 4) + 2 * q + r % 2]
    return out


@on_host
@pytest.mark.parametrize("precision,n,a_mn,b_mn", [
    ("fp16", 64, False, False), ("bf16", 128, True, True), ("fp16", 64, False, True),
    ("tf32", 64, False, False)])
def test_wgmma_on_host_means_what_ptx_says(precision, n, a_mn, b_mn, tmp_path, rng):
    from test_host_semantics import host_library

    func, a_bytes = _single_wgmma(precision, n, a_mn, b_mn)
    module = render_module([(func, True)])
    lib = host_library([(func, True)], tmp_path, module)
    words = func.params[0].shape[0].value
    dtype = {"tf32": np.float32, "fp16": np.float16, "bf16": np.float32}[precision]
    values = rng.uniform(-2, 2, words * 4 // (4 if precision == "tf32" else 2)).astype(dtype)
    if precision == "bf16":   # bf16 bits: float32's high halves
        values = (values.view(np.uint32) >> 16).astype(np.uint16)
    x = np.frombuffer(values.tobytes(), np.uint32).copy()
    y = np.full(128 * n // 2, np.nan, np.float32)
    args = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
    (launch,) = module.kernels[func.name].launches
    lib.dnnc_launch(ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p), args,
                    *[ctypes.c_uint(g) for g in launch.grid], ctypes.c_uint(launch.block[0]))
    want = _model(np.frombuffer(x.tobytes(), np.uint8), a_bytes, precision, n, a_mn, b_mn)
    np.testing.assert_allclose(y.reshape(128, n // 2), want, rtol=1e-5, atol=1e-5)


# -- the layout -----------------------------------------------------------------------------------

@pytest.mark.parametrize("rows_contiguous,rows", [(False, 128), (True, 128), (True, 256)])
def test_swizzled_tiles_are_wgmma_layouts_without_bank_conflicts(rows_contiguous, rows):
    """Each slot's chunks a permutation of it, 8 consecutive stored chunks in 8 16-byte bank
    groups, and each element where `_place`'s layout (the descriptor's, at the slot's and
    atom's start) has it."""
    bi = L.Var("bi")
    operand = Operand(lambda b, i, kk: L.Buffer("x", T.float16, (rows, 64))[i, kk],
                      rows_contiguous, True)
    tile = wgmma._SwizzledTile("a", rows, L.const(0), rows, operand, 64, 64, 256, False, bi,
                               "fp16", 3)
    o, c = L.Var("o"), L.Var("c")
    for slot in range(3):
        chunks = [tuple(_value(x) for x in tile._chunk_of(L.const(e)))
                  for e in range(tile.chunks)]
        stored = [_value(tile.word(L.const(slot), o, c), {o: x, c: y}) for x, y in chunks]
        assert len(set(stored)) == tile.chunks
        assert min(stored) == slot * tile.slot_words and (slot * tile.slot_words * 4) % 1024 == 0
        for first in range(0, tile.chunks, 8):
            assert len({w // 4 % 8 for w in stored[first: first + 8]}) == 8
        for x, kk in ((0, 0), (5, 9), (70, 33), (rows - 1, 63)):
            row, chunk = (kk, x // 8) if rows_contiguous else (x, kk // 8)
            inner = (x if rows_contiguous else kk) % 8
            word = _value(tile.word(L.const(slot), L.const(row), L.const(chunk)))
            byte = word * 4 + inner * 2 - slot * tile.slot_words * 4
            # MN-major: atoms of 64 rows, each 64 k rows of 128 bytes; K-major: rows of 128
            want = x // 64 * 64 * 128 + _swizzled(kk * 128 + x % 64 * 2) if rows_contiguous \
                else _swizzled(x * 128 + kk * 2)
            assert byte == want, (slot, x, kk, byte, want)


def _swizzled(o: int) -> int:
    """Byte o of a 1024-byte aligned block in the 128-byte swizzle."""
    return o ^ ((o >> 7) % 8 << 4)


def _value(e: L.Expr, env: dict | None = None) -> int:
    out = L.simplify_expr(L.substitute(e, {v: L.const(x) for v, x in (env or {}).items()}))
    assert isinstance(out, L.Const), out
    return out.value


# -- numbers --------------------------------------------------------------------------------------

def _run_on_host(case, rng, tmp_path):
    from test_host_semantics import host_library, launch_on_host

    precision, m, n, k, batch, config, dtype, trans_a, trans_b = case
    func, config = product(*case)
    module = render_module([(func, True)])
    source = module.source
    assert "dnnc_wgmma_" + precision in source and "dnnc_ldmatrix" not in source.split(
        'extern "C"', 1)[1]
    runs = (m if trans_a else k, k if trans_b else n)   # the operands' contiguous extents
    if precision == "tf32":   # float32 K-major operands (A [m, k], B [n, k]) by cp.async
        copies = (not trans_a or trans_b) and k % 4 == 0
    else:
        copies = dtype is mma.STORAGE[precision] and any(x % 8 == 0 for x in runs)
    assert ("dnnc_cp_async(&" in source) == copies
    kernels = source[source.index('extern "C"'):]
    assert ("dnnc_tf32(" in kernels) == (precision == "tf32")   # (rounded: in place, staged)
    assert all(x.shared_bytes > 0 for x in module.kernels[func.name].launches[:1])
    lib = host_library([(func, True)], tmp_path, module)
    a, b, bias, stored = operands(rng, m, n, k, batch, dtype, trans_a, trans_b)
    y = np.full((batch, m, n), np.nan, np.float32)
    info = module.kernels[func.name]
    arrays = stored + [y] + [np.full(size, 0xFF, np.uint8) for size in info.workspace]
    launch_on_host(lib, info, arrays)
    return check(precision, k, a, b, bias, y)


@on_host
@pytest.mark.parametrize("case", [
    CASES[i] if i in SMOKE else pytest.param(CASES[i], marks=pytest.mark.emulated_full)
    for i in range(len(CASES))], ids=[str(i) for i in range(len(CASES))])
def test_wgmma_products_on_host_within_the_precision_bound(case, rng, tmp_path):
    assert wgmma.fits(case[5], case[0])
    _run_on_host(case, rng, tmp_path)


def test_every_case_compiles_for_sm90a_without_spills():
    """NVRTC (where CuPy is) compiles every case and the bench's shapes for sm_90a, to
    wgmma, without register spills (the sm_90 target refuses wgmma: why `compile_arch`)."""
    nvrtc = pytest.importorskip("cupy.cuda").nvrtc
    funcs = [(product(*case, name=f"case{i}")[0], True) for i, case in enumerate(DEVICE_CASES)]
    source = render_module(funcs).source
    assert device.compile_arch("sm_90", source) == "sm_90a"
    prog, log = nvrtc_compiled(source, "sm_90a", "--ptxas-options=-v")
    assert "wgmma" not in log.lower() or "serialized" not in log.lower(), log[-4000:]
    # nor a wait ptxas injected to read accumulators in flight (C7517: results read inside
    # the k loop would make every step wait for its wgmmas)
    assert "C7517" not in log, log[-4000:]
    spills = dict(re.findall(r"Compiling entry function '(\w+)' for '\w+'\n.*\n.*?"
                             r"(\d+) bytes spill stores", log))
    assert len(spills) >= len(funcs), log[-4000:]
    assert all(int(x) == 0 for x in spills.values()), spills
    ptx = nvrtc.getPTX(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in ptx
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned 1" in ptx
    nvrtc.destroyProgram(prog)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_every_case_compiles_with_nvcc_for_sm90a(tmp_path):
    """nvcc's sm_90a target (the -gencode form: HOPPER.md) takes the module too."""
    funcs = [(product(*case, name=f"case{i}")[0], True) for i, case in enumerate(DEVICE_CASES)]
    path = tmp_path / "module.cu"
    path.write_text(render_module(funcs).source)
    proc = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "--ptx",
                           "-std=c++17", "-o", str(tmp_path / "module.ptx"), str(path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ptx = (tmp_path / "module.ptx").read_text()
    for instruction in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
                        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32",
                        "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                        "fence.proxy.async.shared::cta", "cp.async.cg.shared.global"):
        assert instruction in ptx, instruction


@pytest.mark.gpu
@pytest.mark.parametrize("case", DEVICE_CASES, ids=[str(i) for i in range(len(DEVICE_CASES))])
def test_wgmma_products_on_the_gpu_within_the_precision_bound(case, rng):
    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"wgmma needs sm_90, not {device.gpu_arch()}")
    func, _ = product(*case)
    product_on_the_gpu_within_the_bound(func, case, rng)


def product_on_the_gpu_within_the_bound(func: L.PrimFunc, case, rng,
                                        rounded: bool = False) -> None:
    """`func` (a product of `case`'s operands) compiled by NVRTC for this GPU, launched on
    fresh operands (its arguments: the operands, Y, its workspace, then its tensor maps,
    built by `tensor_map.kernel_map` from the operands' addresses) and checked against the
    precision's bound; `rounded`: the operands rounded to tf32 first (`Operand.rounded`
    products read them as they lie)."""
    import cupy as cp

    from dnnc.backends.cuda import tensor_map

    precision, m, n, k, batch, config, dtype, trans_a, trans_b = case
    module = render_module([(func, True)])
    arch = device.compile_arch(device.gpu_arch(), module.source)   # sm_90a
    raw = cp.cuda.function.Module()
    raw.load(device.nvrtc_compile(module.source, arch, device.nvrtc_options(arch)))
    a, b, bias, stored = operands(rng, m, n, k, batch, dtype, trans_a, trans_b)
    if rounded:
        from dnnc.ir.ops.packed import round_tf32

        stored[:2] = [round_tf32(x) for x in stored[:2]]
        a, b = ((x.transpose(0, 2, 1) if trans else x).astype(np.float64)
                for x, trans in zip(stored[:2], (trans_a, trans_b)))
    arrays = [cp.asarray(x.view(np.uint16) if x.dtype.itemsize == 2 else x) for x in stored]
    y = cp.full((batch, m, n), np.nan, cp.float32)
    info = module.kernels[func.name]
    params = arrays + [y]
    maps = [cp.asarray(tensor_map.kernel_map(t, params[t.param].data.ptr))
            for t in info.tensor_maps]
    args = tuple(params + [cp.empty(size, cp.uint8) for size in info.workspace] + maps)
    for launch in info.launches:
        fn = raw.get_function(launch.name)
        device.allow_shared(fn, launch.shared_bytes)
        fn(launch.grid, launch.block, args, shared_mem=launch.shared_bytes)
    check(precision, k, a, b, bias, cp.asnumpy(y), gpu=True)


@on_host
@pytest.mark.parametrize("name,precision,config", [
    ("gemm_relu_33x70x50", "fp16", W(64, 64, 64, 4, 1, 3)),
    ("batched_3x20x48x40", "bf16", W(64, 64, 64, 4, 1, 4)),
    ("conv3x3_pad", "bf16", W(64, 64, 64, 4, 1, 3)),
    pytest.param("dense_64x256x64", "fp16", W(64, 128, 64, 4, 2, 3, 2),
                 marks=pytest.mark.emulated_full),
    pytest.param("conv1x1_stride2", "tf32", W(64, 64, 32, 4, 1, 3),
                 marks=pytest.mark.emulated_full)])
def test_graph_products_with_the_knob_on_host(name, precision, config, rng, tmp_path):
    """Products of ONNX graphs (Gemm with bias and relu, a batched MatMul, a MatMul with
    split-k, implicit-GEMM convolutions: patches gathered through registers) scheduled for
    cuda at `precision` with a wgmma config through the template, within the precision's
    bound on host threads."""
    from test_cuda_precision import PRODUCTS, _program, bound
    from test_host_semantics import host_library, program_on_host
    from cuda_kernels import reference
    from dnnc.frontend.onnx import import_onnx

    make, k = PRODUCTS[name]
    model_of = make(rng)
    model, x = model_of(False)
    graph, program = _program(model, precision, config)
    module = render_module(program.unique)
    assert f"dnnc_wgmma_{precision}_n{config.block_n // config.warps_n}<" in module.source
    lib = host_library(program.unique, tmp_path, module)
    name_in, out = graph.inputs[0].name, graph.outputs[0].name
    got = program_on_host(lib, module, program, {name_in: x})[out]
    want = reference(graph, {name_in: x})[out]
    abs_model, abs_x = model_of(True)
    abs_graph = import_onnx(abs_model)
    scale = reference(abs_graph, {abs_graph.inputs[0].name: abs_x})[abs_graph.outputs[0].name]
    error = np.abs(got.astype(np.float64) - want)
    assert np.isfinite(got).all() and (error <= bound(precision, k, scale, want)).all()


@on_host
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False)])
def test_tf32_operands_that_are_tf32_values_are_read_as_they_land(trans_a, trans_b, rng,
                                                                   tmp_path):
    """A and B holding tf32 values already (`Operand.rounded`: passes/store_tf32.py has their
    producers store them so): the K-major tiles are not rounded in shared memory, nor the
    staged words in registers (no `dnnc_tf32` in the kernel), and the products are the ones
    rounding would give, within the bound."""
    from test_host_semantics import host_library, launch_on_host

    from dnnc.ir.ops.packed import round_tf32

    m, n, k = 100, 136, 200
    case = ("tf32", m, n, k, 1, W(64, 128, 32, 4, 1, 3), T.float32, trans_a, trans_b)
    func, _ = product(*case, rounded=True)
    module = render_module([(func, True)])
    kernels = module.source[module.source.index('extern "C"'):]
    assert "dnnc_wgmma_tf32" in kernels and "dnnc_tf32(" not in kernels
    lib = host_library([(func, True)], tmp_path, module)
    _, _, bias, stored = operands(rng, m, n, k, 1, T.float32, trans_a, trans_b)
    stored[:2] = [round_tf32(x) for x in stored[:2]]
    a = (stored[0].transpose(0, 2, 1) if trans_a else stored[0]).astype(np.float64)
    b = (stored[1].transpose(0, 2, 1) if trans_b else stored[1]).astype(np.float64)
    y = np.full((1, m, n), np.nan, np.float32)
    info = module.kernels[func.name]
    launch_on_host(lib, info, stored + [y] + [np.full(size, 0xFF, np.uint8)
                                             for size in info.workspace])
    check("tf32", k, a, b, bias, y)


def test_a_cluster_split_is_one_launch_in_clusters_without_partials():
    """A `cluster_split` product: one launch of split_k-block clusters along z, no workspace,
    two cluster barriers around the sums read from the cluster's shared tiles (PTX's
    barrier.cluster, mapa, ld.shared::cluster); the two-launch split of the same tiles has
    its partials' workspace and a second launch."""
    case = next(c for c in DEVICE_CASES if c[1:4] == (512, 768, 3072) and c[5].cluster_split)
    func, config = product(*case)
    text = str(func)
    assert text.count("cluster_barrier(4)") == 2 and "cluster_load(slice_sums[" in text
    module = render_module([(func, True)])
    info = module.kernels[func.name]
    assert len(info.launches) == 1 and info.workspace == []
    assert info.launches[0].grid[2] == 4   # batch 1 x 4 slices: one cluster down z
    assert "__launch_bounds__(128) __cluster_dims__(1, 1, 4)" in module.source
    two = render_module([(product(*case[:5], replace(config, cluster_split=False), *case[6:],
                                  name="two")[0], True)])
    assert len(two.kernels["two"].launches) == 2 and two.kernels["two"].workspace
    assert "__cluster_dims__" not in two.source
    if importlib.util.find_spec("cupy") is not None:
        prog, _ = nvrtc_compiled(module.source, "sm_90a")
        ptx = pytest.importorskip("cupy.cuda").nvrtc.getPTX(prog)
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        for instruction in ("barrier.cluster.arrive.release.aligned",
                            "barrier.cluster.wait.acquire.aligned", "mapa.u64",
                            "ld.shared::cluster.f32", ".reqnctapercluster 1, 1, 4"):
            assert instruction in ptx, instruction


def test_cluster_nodes_are_verified_printed_and_refused_by_llvm():
    from dnnc.backends.llvm.codegen import CodegenError, ModuleBuilder

    x = L.Buffer("x", T.float32, (4,))
    tile = L.Buffer("tile", T.float32, (128,), L.Scope.SHARED)
    t = L.Var("t")

    def func(value, size=2, threads=True):
        load = L.For(t, 128, L.Store(x, (t % 4,), value), L.ForKind.THREAD_X if threads
                     else L.ForKind.SERIAL)
        body = L.Allocate(tile, L.seq(L.ClusterBarrier(size), load, L.ClusterBarrier(size)))
        return L.PrimFunc("f", (x,), L.For(L.Var("b"), 2, body, L.ForKind.BLOCK_Z))

    good = func(L.call("cluster_load", tile[t], L.const(1), dtype=T.float32))
    L.verify(good)
    assert "cluster_barrier(2)" in str(good) and "cluster_load(tile[t], 1)" in str(good)
    with pytest.raises(L.LoopIRError, match="a cluster of 16 blocks"):
        L.verify(func(L.const(0.0, T.float32), size=16))
    with pytest.raises(L.LoopIRError, match="not cluster_load"):
        L.verify(func(L.call("cluster_load", x[t % 4], L.const(1), dtype=T.float32)))
    with pytest.raises(L.LoopIRError, match="outside a threadIdx.x loop"):
        L.verify(func(L.call("cluster_load", tile[t], L.const(1), dtype=T.float32),
                      threads=False))
    on_cpu = L.transform(good.body, lambda s: replace(s, kind=L.ForKind.SERIAL)
                         if isinstance(s, L.For) else None)
    with pytest.raises(CodegenError, match="GPU-only"):
        ModuleBuilder("m").add(replace(good, body=on_cpu))


def test_mbarrier_nodes_are_verified_printed_and_refused_by_llvm():
    from dnnc.backends.llvm.codegen import CodegenError, ModuleBuilder

    x = L.Buffer("x", T.float32, (4,))
    bars = L.Buffer("bars", T.uint64, (2,), L.Scope.SHARED)
    t, kt = L.Var("t"), L.Var("kt")

    def func(*ops, threads=True):
        body = L.For(t, 128, L.seq(*ops, L.Store(x, (t % 4,), L.const(0.0, T.float32))),
                     L.ForKind.THREAD_X if threads else L.ForKind.SERIAL)
        return L.PrimFunc("f", (x,), L.For(L.Var("b"), 2, L.Allocate(bars, body),
                                            L.ForKind.BLOCK_X))

    good = func(L.Mbarrier("init", bars[0], L.const(128)), L.Mbarrier("arrive", bars[0]),
                L.Mbarrier("copy_arrive", bars[1]),
                L.For(kt, 3, L.Mbarrier("wait", bars[0], kt % 2)))
    L.verify(good)
    text = str(good)
    for line in ("mbarrier_init(bars[0], 128)", "mbarrier_arrive(bars[0])",
                 "mbarrier_copy_arrive(bars[1])", "mbarrier_wait(bars[0], kt % 2)"):
        assert line in text, text
    source = render_module([(good, True)]).source
    for call in ("dnnc_mbarrier_init(&bars[", "dnnc_mbarrier_copy_arrive(&bars[",
                 "dnnc_mbarrier_wait(&bars["):
        assert call in source
    for bad, why in ((L.Mbarrier("init", bars[0], L.Var("n")), "init takes a positive"),
                     (L.Mbarrier("init", bars[0], L.const(0)), "init takes a positive"),
                     (L.Mbarrier("wait", bars[0]), "wait takes an integer parity"),
                     (L.Mbarrier("arrive", bars[0], L.const(1)), "arrive takes no value"),
                     (L.Mbarrier("expect", bars[0]), "one of"),
                     (L.Mbarrier("arrive", x[0]), "shared uint64")):
        with pytest.raises(L.LoopIRError, match=why):
            L.verify(func(bad))
    with pytest.raises(L.LoopIRError, match="outside a threadIdx.x loop"):
        L.verify(func(L.Mbarrier("arrive", bars[0]), threads=False))
    on_cpu = L.transform(good.body, lambda s: replace(s, kind=L.ForKind.SERIAL)
                         if isinstance(s, L.For) else None)
    with pytest.raises(CodegenError, match="GPU-only"):
        ModuleBuilder("m").add(replace(good, body=on_cpu))


def test_the_producer_warpgroup_copies_through_mbarriers():
    """With `producer` a block is its warps and a warpgroup more (the last), which alone
    issues the cp.asyncs, one `copy_arrive` a k tile on its slot's `full` barrier (128
    arrivals), the consumers waiting on it and releasing the slot through `empty` (a warp's
    lane 0 each), the barriers 1024 bytes beside the ring; the consumers' guard is lane 0's
    warp index (ptxas then knows the wgmmas in it are not divergent: C7518); operands
    cp.async cannot copy as they lie leave the block as it was, the warps copying."""
    case = next(c for c in CASES if c[5].producer and c[5].staged and c[1] == 104)
    assert case[5].block_n == 192   # (104 x 200, k 520, fp16, staged)
    func, config = product(*case)
    assert config.threads == 256 + 128 and mma.shared_bytes(config, "fp16") == \
        mma.shared_bytes(replace(config, producer=False), "fp16") + 1024
    text = str(func)
    assert text.count("cp_async(") == 2 and text.count("mbarrier_copy_arrive(") == 1
    assert "mbarrier_init(k_bars[0], 128)" in text and "mbarrier_init(k_bars[3], 8)" in text
    assert text.count("barrier()") == 2   # the barriers made, the staged tile filled
    module = render_module([(func, True)])
    (launch,) = module.kernels[func.name].launches
    assert launch.block == (384, 1, 1)
    assert "if (dnnc_warp_index() < 8u)" in module.source
    fallback = next(c for c in CASES if c[5].producer and c[6] is T.float32)
    func, config = product(*fallback)
    assert "mbarrier" not in str(func)
    assert render_module([(func, True)]).kernels[func.name].launches[0].block == (128, 1, 1)
    if importlib.util.find_spec("cupy") is not None:
        prog, log = nvrtc_compiled(module.source, "sm_90a", "--ptxas-options=-v")
        assert "C7517" not in log and "C7518" not in log, log[-2000:]
        ptx = pytest.importorskip("cupy.cuda").nvrtc.getPTX(prog)
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        for instruction in ("cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                            "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64",
                            "mbarrier.arrive.release.cta.shared::cta.b64",
                            "mbarrier.init.shared::cta.b64", "shfl.sync.idx.b32"):
            assert instruction in ptx, instruction


# -- the knob -------------------------------------------------------------------------------------

def test_the_knob_is_searched_on_sm90_only():
    def values(precision, arch):
        space = mma.product_space("s", 4096, 1, precision, arch)
        return dict((x.name, x.values) for x in space.knobs)["wgmma"]

    assert values("fp16", "sm_90") == (False, True) == values("bf16", "sm_90a") == \
        values("tf32", "sm_90")
    assert values("fp16", "sm_80") == (False,) == values("fp16", None) == \
        values("bf16", "sm_100")
    space = mma.product_space("s", 4096, 1, "fp16", "sm_90")
    space.check(W(128, 256, 64, 8, 1, 4))
    mma.product_space("s", 4096, 1, "tf32", "sm_90").check(W(128, 256, 32, 8, 1, 4))
    for bad in (W(128, 256, 32, 8, 1, 4), W(128, 256, 64, 2, 4, 4), W(128, 256, 64, 8, 1, 2),
                W(256, 256, 64, 8, 1, 4)):
        with pytest.raises(Exception, match="with wgmma"):
            space.check(bad)


def test_cluster_split_is_searched_on_sm90_with_wgmma_and_its_splits():
    def values(arch):
        space = mma.product_space("s", 4096, 1, "fp16", arch)
        return dict((x.name, x.values) for x in space.knobs)["cluster_split"]

    assert values("sm_90") == (False, True) and values("sm_80") == (False,)
    space = mma.product_space("s", 4096, 1, "fp16", "sm_90")
    space.check(W(64, 192, 64, 4, 1, 5, 4, cluster_split=True))
    space.check(W(128, 128, 64, 8, 1, 3, 8, cluster_split=True))
    for bad in (C(64, 64, 32, 2, 2, 3, 2, cluster_split=True),      # mma.sync
                W(64, 192, 64, 4, 1, 5, 16, cluster_split=True),    # 16 blocks a cluster
                W(64, 192, 64, 4, 1, 5, 1, cluster_split=True)):    # nothing split
        with pytest.raises(Exception, match="cluster_split only"):
            space.check(bad)


def test_the_producer_is_searched_with_wgmma_and_taken_by_the_default(monkeypatch):
    """The `producer` knob is in the sm_90 space, with wgmma only, not with the refill knobs;
    the dense default's 16-bit wgmma tiles take the TMA producer (DNNC_PRODUCER unset:
    `PRODUCER_DEFAULT`, test_cuda_tma.py) and keep their tiles, never a producer with
    DNNC_PRODUCER=0, the cp.async one on every wgmma tile with =1."""
    from dnnc.backends.cuda.device import REFERENCE

    def values(arch):
        space = mma.product_space("s", 4096, 1, "fp16", arch)
        return dict((x.name, x.values) for x in space.knobs)["producer"]

    assert values("sm_90") == (False, True, "tma") and values("sm_80") == (False,)
    space = mma.product_space("s", 4096, 1, "fp16", "sm_90")
    space.check(W(128, 256, 64, 8, 1, 4, producer=True))
    for bad in (C(64, 64, 32, 2, 2, 3, producer=True),
                W(128, 128, 64, 8, 1, 5, refill_first=True, producer=True),
                W(128, 256, 64, 8, 1, 2, early_refill=True, producer=True)):
        with pytest.raises(Exception, match="producer only"):
            space.check(bad)
    monkeypatch.delenv(mma.DNNC_PRODUCER, raising=False)

    def default(m, k, n, precision="fp16"):
        c = mma.choose(m, n, k, 1, REFERENCE, precision, wgmma=True, staged=True)
        return mma.producer_by_default(mma.staged_by_default(c, T.float16, precision),
                                       precision, k)

    for precision in ("fp16", "bf16"):
        for shape, tile in (((4096, 4096, 4096), (128, 256)), ((8192, 768, 3072), (128, 256)),
                            ((128, 768, 3072), (64, 64)), ((128, 3072, 768), (64, 64)),
                            ((1024, 3072, 768), (128, 64)), ((2048, 3072, 768), (64, 192)),
                            ((8192, 3072, 768), (128, 192))):
            c = default(*shape, precision)
            assert (c.block_m, c.block_n) == tile and c.producer == "tma", (shape, c)
            assert not c.refill_first and space.check(c) == c
    # (at tf32 `mma.dense_default` asks for it only where TMA copies both operands:
    # test_deep_products_whose_tiles_leave_sms_idle_split_k_on_wgmma)
    assert default(4096, 4096, 4096, "tf32").producer == "tma"
    monkeypatch.setenv(mma.DNNC_PRODUCER, "0")
    assert not default(4096, 4096, 4096).producer
    monkeypatch.setenv(mma.DNNC_PRODUCER, "1")
    assert default(1024, 3072, 768).producer is True and default(8192, 768, 3072).producer
    assert not mma.producer_by_default(C(64, 64, 32, 2, 2, 3), "fp16", 4096).producer


def test_the_default_picks_wgmma_on_sm90_at_16_bit_precisions(monkeypatch):
    from dnnc.backends import problems   # noqa: F401  (the templates' problems)

    monkeypatch.delenv("DNNC_WGMMA", raising=False)
    assert mma.wgmma_by_default("sm_90", "fp16") and mma.wgmma_by_default("sm_90", "bf16")
    assert not mma.wgmma_by_default("sm_90", "tf32") and not mma.wgmma_by_default("sm_80")
    # at tf32 where both operands are tf32 values already (passes/store_tf32.py)
    assert mma.wgmma_by_default("sm_90", "tf32", rounded=True)
    monkeypatch.setenv("DNNC_WGMMA", "0")
    assert not mma.choose(4096, 4096, 4096, wgmma=False).wgmma
    assert not mma.wgmma_by_default("sm_90")
    monkeypatch.setenv("DNNC_WGMMA", "1")
    assert mma.wgmma_by_default("sm_90") and mma.wgmma_by_default("sm_90a")
    assert mma.wgmma_by_default("sm_90", "tf32")
    assert not mma.wgmma_by_default("sm_80") and not mma.wgmma_by_default(None)
    big = mma.choose(4096, 4096, 4096, wgmma=True)
    assert big.wgmma and (big.block_m, big.block_n) == (128, 256) and wgmma.fits(big, "fp16")
    assert not mma.choose(16, 64, 64, wgmma=True).wgmma   # mostly past the edges
    for precision in ("tf32", "fp16", "bf16"):   # the defaults lie in the space
        for m, n, k in ((4096, 4096, 4096), (8192, 768, 3072), (1024, 3072, 768),
                        (300, 200, 100)):
            config = mma.choose(m, n, k, precision=precision, wgmma=True)
            space = mma.product_space("x", k, 1, precision, "sm_90")
            assert space.check(config) == config


def test_the_default_stages_the_products_of_16_bit_outputs(monkeypatch):
    """`mma.staged_by_default`: a product storing float16 / bfloat16, wgmma or mma.sync, is
    staged (its tile within the shared limit: not mma.sync's 128 x 256), a float32 one or a
    split one is not;
    DNNC_STAGED=0 turns it off; a model at fp16 renders the staged epilogue."""
    import dnnc
    from dnnc import zoo

    monkeypatch.delenv("DNNC_STAGED", raising=False)
    big = mma.choose(4096, 4096, 4096, wgmma=True)
    plain = C(128, 128, 32, 2, 4, 3)
    for config in (big, plain):
        for y in (T.float16, T.bfloat16):
            staged = mma.staged_by_default(config, y, "fp16")
            assert staged == replace(config, staged=True)
            assert mma.product_space("x", 4096, 1, "fp16", "sm_90").check(staged) == staged
        assert mma.staged_by_default(config, T.float32, "fp16") == config
    split = replace(big, split_k=2)
    assert mma.staged_by_default(split, T.float16, "fp16") == split
    wide = mma.choose(4096, 4096, 4096, wgmma=False)   # 128 x 256: its tile past 99 KiB
    assert mma.staged_by_default(wide, T.float16, "fp16") == wide
    monkeypatch.setenv("DNNC_STAGED", "0")
    assert mma.staged_by_default(big, T.float16, "fp16") == big
    assert not mma.results_staged(T.float16)
    monkeypatch.delenv("DNNC_WGMMA", raising=False)
    model = zoo.build("mlp", hidden=(2048,), in_features=1024, classes=512, batch=4096)
    for switch in ("1", "0"):
        monkeypatch.setenv("DNNC_STAGED", switch)
        source = dnnc.compile(model, "cuda", precision="fp16", render_only=True).source("cuda")
        assert ("y_tile" in source) == (switch == "1") and "dnnc_wgmma_fp16" in source


def test_shallow_products_of_16_bit_outputs_take_the_staged_wgmma_tile(monkeypatch):
    """Products of k at most SHALLOW_K with at least SHALLOW_STAGED_OUTPUTS results: with a
    16-bit Y (staged) the default is SHALLOW_STAGED_TILE staged, with a float32 Y the mma.sync
    tiles stored directly (SHALLOW_LARGE_TILE for the largest); smaller ones keep the mma.sync
    tiles, staged with a 16-bit Y."""
    from types import SimpleNamespace

    from dnnc.backends.cuda.device import REFERENCE

    monkeypatch.delenv("DNNC_STAGED", raising=False)
    monkeypatch.delenv("DNNC_WGMMA", raising=False)
    machine = Target("cuda", arch="sm_90", gpu=REFERENCE)
    for precision in ("fp16", "bf16"):
        machine = replace(machine, precision=precision)
        half = mma.STORAGE[precision]
        for m, k, n in ((6304, 192, 576), (100352, 96, 384), (25088, 192, 768), (197, 192, 576)):
            for y in (half, T.float32):
                p = SimpleNamespace(m=m, n=n, k=k, batch=1, a_tf32=False, b_tf32=False,
                                    y=SimpleNamespace(dtype=y))   # (what the default reads)
                config = mma.dense_default(p, machine)
                large = m * n >= mma.SHALLOW_STAGED_OUTPUTS
                if y is half and large:
                    assert config == replace(mma.SHALLOW_STAGED_TILE, staged=True)
                else:
                    assert not config.wgmma and config.staged == (y is half)
                    if y is T.float32 and m * n >= mma.SHALLOW_LARGE:
                        assert config == mma.SHALLOW_LARGE_TILE
                space = mma.dense_space(p, machine)
                assert space.check(config) == config


def test_deep_products_whose_tiles_leave_sms_idle_split_k_on_wgmma(monkeypatch):
    """bert b8's fc2 (1024 x 3072 x 768: 64 tiles of 64 x 192 for 132 SMs) splits k on wgmma
    tiles at tf32 (tf32 operands): by default in 2 on 64 x 192 tiles summed by a second
    launch (the model counts the busiest SM's blocks, so 192 blocks of 64 x 64 do not rate
    as one full wave); with DNNC_CLUSTER_SPLIT=1 summed in clusters, its split blocks within
    one wave. At fp16 and bf16 one wave of WGMMA_TALL_TILE unsplit beats both. The 4096-row
    product keeps its unsplit tile either way. At tf32 a B stored [n, k] (as tf32_dense
    stores a weight: `mma.tf32_copied`) gets the TMA producer, a B stored [k, n] (through
    registers) none, its refill knobs kept."""
    from types import SimpleNamespace

    from dnnc.backends.cuda.device import REFERENCE

    monkeypatch.delenv("DNNC_WGMMA", raising=False)
    machine = Target("cuda", arch="sm_90", gpu=REFERENCE)
    for switch in (None, "1"):
        if switch is None:
            monkeypatch.delenv(mma.DNNC_CLUSTER_SPLIT, raising=False)
        else:
            monkeypatch.setenv(mma.DNNC_CLUSTER_SPLIT, switch)
        for precision, trans_b in (("fp16", False), ("bf16", False), ("tf32", False),
                                   ("tf32", True)):
            machine = replace(machine, precision=precision)
            y = mma.STORAGE.get(precision, T.float32)
            for m in (1024, 4096):
                p = SimpleNamespace(m=m, n=768, k=3072, batch=1, a_tf32=precision == "tf32",
                                    b_tf32=precision == "tf32", trans_a=False,
                                    trans_b=trans_b, packed_panel=0, pairs=False,
                                    y=SimpleNamespace(dtype=y))
                config = mma.dense_default(p, machine)
                assert (config.producer == "tma") == (precision != "tf32" or trans_b)
                split = m == 1024 and precision == "tf32"
                assert config.wgmma and (config.split_k > 1) == split
                assert config.cluster_split == (split and switch == "1")
                if m == 1024 and not split:
                    assert (config.block_m, config.block_n, config.split_k) == (128, 64, 1)
                elif config.cluster_split:
                    blocks = -(-m // config.block_m) * -(-768 // config.block_n)
                    assert blocks * config.split_k <= mma.CLUSTER_WAVES * REFERENCE.sms
                elif m == 1024:
                    assert (config.block_m, config.block_n, config.split_k) == (64, 192, 2)
                    assert not config.staged
                assert mma.dense_space(p, machine).check(config) == config


def test_the_default_models_a_wgmma_k_tile_s_fixed_cost(monkeypatch):
    """At fp16 / bf16 the dense default rates its wgmma tiles by their k tiles' fixed cost
    (mma.WGMMA_TILE_S; H200, session 46, same call): 512 x 3072 x 768 splits 64 x 192 tiles
    in 4 (10.8 us against the efficiencies' 64 x 64 unsplit, 12.6 / 13.0), 256 x 3072 x 768
    64 x 128 in 4 (8.4 against 64 x 64 split 2's 9.4), 1000^3 takes 64 x 128 (10.4 against
    13.3); no slice is shallower than WGMMA_MIN_SLICE_TILES k tiles (vit's 197 x 768 x 192
    stays unsplit: 4.5 us against split 4's 4.9); 1024 x 3072 x 768, one wave of 128 x 64
    blocks 48 k tiles deep, takes WGMMA_TALL_TILE unsplit (session 50: 12.5 / 12.4 us
    against 64 x 192 split 2's 13.3), 2048 x 3072 x 768 (two waves of it) does not; a
    convolution's GEMM keeps the efficiencies."""
    from dnnc.backends.cuda.device import REFERENCE

    monkeypatch.delenv("DNNC_WGMMA", raising=False)
    monkeypatch.delenv(mma.DNNC_CLUSTER_SPLIT, raising=False)
    for precision in ("fp16", "bf16"):
        for (m, k, n), tile in (((512, 3072, 768), (64, 192, 4)),
                                ((256, 3072, 768), (64, 128, 4)),
                                ((1000, 1000, 1000), (64, 128, 1)),
                                ((197, 768, 192), (64, 64, 1)),
                                ((1024, 3072, 768), (128, 64, 1)),
                                ((2048, 3072, 768), (64, 192, 1)),
                                ((4096, 4096, 4096), (128, 256, 1))):
            c = mma.choose(m, n, k, 1, REFERENCE, precision, wgmma=True, staged=True)
            assert c.wgmma and (c.block_m, c.block_n, c.split_k) == tile, (m, k, n, c)
            assert c.split_k == 1 or -(-k // c.block_k) >= c.split_k * mma.WGMMA_MIN_SLICE_TILES
    assert mma.choose(512, 768, 3072, 1, REFERENCE, "fp16", wgmma=True, staged=True) != \
        mma.choose(512, 768, 3072, 1, REFERENCE, "fp16", wgmma=True, shallow_rule=False,
                   staged=True)   # a convolution's GEMM keeps the efficiencies' 64 x 64


def test_tf32_products_whose_operands_tma_copies_are_rated_as_16_bit_ones(monkeypatch):
    """At tf32 with both operands tf32 values stored K-major (`tf32_copied`) the dense
    default rates wgmma tiles by WGMMA_TILE_S's model at WGMMA_TF32_TILE_S' figures (the TMA
    lone-block line at half rate) at any number of outputs (session 51, H200, us against
    cuBLAS tf32): 128 x 768 x 3072 64 x 64 wgmma (6.8 / 10.6; mma.sync's 32 x 64 9.6), 2048 x
    3072 x 768 64 x 192 unsplit (31.5 / 37.3; the 16-bit figures split 128 x 192 in 2, 34.7),
    1024 x 3072 x 768 64 x 192 split 2 (20.4 / 24.8; WGMMA_TALL_TILE 21.7); without it tf32
    keeps the efficiencies and TF32_WGMMA_OUTPUTS (mma.sync at 128 rows); a convolution's
    GEMM (shallow_rule off) too."""
    from dnnc.backends.cuda.device import REFERENCE

    monkeypatch.delenv(mma.DNNC_CLUSTER_SPLIT, raising=False)
    for (m, k, n), tile in (((128, 768, 3072), (64, 64, 1)), ((2048, 3072, 768), (64, 192, 1)),
                            ((1024, 3072, 768), (64, 192, 2)),
                            ((4096, 4096, 4096), (128, 256, 1))):
        c = mma.choose(m, n, k, 1, REFERENCE, "tf32", wgmma=True, tf32_copied=True)
        assert c.wgmma and (c.block_m, c.block_n, c.split_k) == tile, (m, k, n, c)
        assert c.block_k == 32
    assert not mma.choose(128, 3072, 768, 1, REFERENCE, "tf32", wgmma=True).wgmma
    assert not mma.choose(128, 3072, 768, 1, REFERENCE, "tf32", wgmma=True,
                          shallow_rule=False, tf32_copied=True).wgmma
    assert not mma.choose(197, 192, 768, 1, REFERENCE, "tf32", wgmma=True,
                          tf32_copied=True).wgmma   # (shallow: k <= SHALLOW_K)
    # a tf32 k tile of 128 bytes costs a 16-bit one's time at half the rate
    tile = W(64, 192, 32, 4, 1, 5)
    assert mma._wgmma_seconds(tile, 3072, 132, REFERENCE, "tf32") == pytest.approx(
        96 * (mma.WGMMA_TALL_TILE_S + 2 * 64 * 192 * 32 / (mma.WGMMA_TALL_SM_FLOPS / 2)) +
        mma.WGMMA_EPILOGUE_S * 64 * 192 / (128 * 128))


def test_modules_using_wgmma_compile_for_sm90a():
    func, _ = product(*CASES[0])
    source = render_module([(func, True)]).source
    plain = render_module([(product("fp16", 64, 64, 64, 1, C(64, 64, 32, 2, 2, 3),
                                    T.float16, False, False)[0], True)]).source
    assert device.compile_arch("sm_90", source) == "sm_90a"
    assert device.compile_arch("sm_90a", source) == "sm_90a"
    assert device.compile_arch("sm_90", plain) == "sm_90"
    assert device.compile_arch("sm_80", plain) == "sm_80"
    with pytest.raises(CompileError, match="sm_90a only"):
        device.compile_arch("sm_80", source)
    assert Target("cuda", arch="sm_90").arch == "sm_90"


def test_a_model_compiles_to_wgmma_by_default_on_sm90_with_the_switch(monkeypatch):
    """dnnc.compile for the (reference, sm_90) GPU: with DNNC_WGMMA=1 its large products
    take the wgmma default and the module says it needs sm_90a; with 0, mma.sync."""
    import dnnc
    from dnnc import zoo
    from dnnc.backends.cuda.prelude import ARCH_SPECIFIC

    model = zoo.build("mlp", hidden=(2048,), in_features=1024, classes=512, batch=4096)
    for switch in (True, False):
        monkeypatch.setenv("DNNC_WGMMA", "1" if switch else "0")
        source = dnnc.compile(model, "cuda", precision="bf16", render_only=True).source("cuda")
        kernels = source[source.index('extern "C"'):]
        assert ("dnnc_wgmma_bf16_n256<" in kernels) == switch
        assert ("dnnc_mma_bf16(" in kernels) != switch
        assert (ARCH_SPECIFIC in source) == switch


def test_a_model_at_tf32_takes_wgmma_where_its_operands_are_tf32_values(monkeypatch):
    """At tf32 with DNNC_WGMMA unset: the first product reads the graph's input (rounded in
    its tiles: mma.sync), the second the first's output, which store_tf32 had stored as tf32
    values (wgmma, nothing rounded); the module compiles for sm_90a where CuPy is."""
    import dnnc
    from dnnc import zoo

    monkeypatch.delenv("DNNC_WGMMA", raising=False)
    model = zoo.build("mlp", hidden=(2048,), in_features=1024, classes=512, batch=4096)
    module = dnnc.compile(model, "cuda", precision="tf32", render_only=True)
    source = module.source("cuda")
    kernels = source[source.index('extern "C"'):].split('extern "C"')[1:]
    uses = [("dnnc_wgmma_tf32" in k, "dnnc_tf32(" in k) for k in kernels
            if "dnnc_wgmma_tf32" in k or "dnnc_mma_tf32(" in k]
    assert uses == [(False, True), (True, False)], uses
    if importlib.util.find_spec("cupy") is not None:
        nvrtc_compiled(source, device.compile_arch("sm_90", source))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_a_model_runs_on_wgmma_on_the_gpu(precision, monkeypatch):
    """The runtime's path on an H100 / H200: the model above compiled with DNNC_WGMMA=1
    (its module built for sm_90a by the executable), its output within the precision's
    model bound of the numpy target's."""
    import dnnc
    from dnnc import zoo
    from dnnc.ir.target import model_error_bound

    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"wgmma needs sm_90, not {device.gpu_arch()}")
    monkeypatch.setenv("DNNC_WGMMA", "1")
    model = zoo.build("mlp", hidden=(2048,), in_features=1024, classes=512, batch=4096)
    (x,) = zoo.inputs_for(model, np.random.default_rng(0)).values()
    want = np.asarray(dnnc.compile(model, "numpy")(x), np.float64)
    compiled = dnnc.compile(model, "cuda", precision=precision, outputs="numpy")
    assert "dnnc_wgmma_" in compiled.source("cuda")
    got = np.asarray(compiled(x), np.float64)
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error <= model_error_bound(precision), error
