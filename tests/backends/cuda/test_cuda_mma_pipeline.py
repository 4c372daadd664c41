"""The tensor-core pipeline of `backends/cuda/mma.py` (issue 31, item 2): 16-bit shared tiles
in a swizzled layout, fragments by `ldmatrix`, operands stored in 16 bits copied by `cp.async`
through a ring of `stages` slots.

- the IR: `LdMatrix`, `CopyAsync`, `AsyncCommit`, `AsyncWait` verified, printed, refused by
  llvm; on host threads (test_host_semantics.py's shim) they mean what the PTX ISA says,
  checked against a NumPy model of ldmatrix's layouts written from the ISA here;
- the layout: every ldmatrix matrix and every phase of 16-byte stores hits 8 distinct 16-byte
  bank groups (`_Tile.word`'s swizzle);
- numbers: products built with float32, float16 and bfloat16 operand buffers (both staging
  paths: cp.async and registers), A and B in either layout, edges, batches, split-k, stages 2
  to 4, a fused epilogue, against NumPy within test_cuda_precision.py's `bound`, on the host;
  compiled by NVRTC for sm_80 and sm_90 without spills where CuPy is; on a GPU (`gpu`).
"""

import ctypes
import re
import shutil
import subprocess
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from dnnc.backends.cuda import device, mma
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.dense import Operand
from dnnc.ir import loop as L
from dnnc.ir import types as T
from cuda_kernels import nvrtc_compiled
from test_cuda_precision import bound

C = mma.TensorCoreConfig
NUMPY = {T.float32: np.float32, T.float16: np.float16, T.bfloat16: ml_dtypes.bfloat16}

# (precision, m, n, k, batch, config, operand dtype, trans_a, trans_b)
CASES = [
    ("fp16", 64, 64, 64, 1, C(64, 64, 32, 2, 2, 3), T.float16, False, False),
    ("fp16", 40, 72, 100, 2, C(32, 32, 16, 1, 2, 2), T.float16, False, False),
    ("fp16", 40, 72, 104, 2, C(32, 32, 16, 1, 2, 4), T.float16, True, True),
    ("fp16", 40, 72, 104, 1, C(32, 64, 32, 2, 2, 3, 2), T.float16, False, True),
    ("bf16", 50, 48, 64, 1, C(64, 32, 32, 2, 2, 3), T.bfloat16, True, False),
    ("bf16", 40, 72, 100, 1, C(32, 32, 16, 1, 2, 2), T.float32, False, False),
    ("bf16", 40, 72, 100, 1, C(32, 32, 16, 1, 2, 3), T.float16, False, False),
    ("fp16", 33, 70, 90, 2, C(32, 64, 32, 2, 1, 3, 2), T.float32, True, True),
    ("fp16", 130, 136, 72, 1, C(128, 128, 16, 2, 2, 3), T.float16, False, True),
    ("bf16", 130, 264, 72, 1, C(128, 256, 32, 2, 4, 3), T.bfloat16, True, False),   # 72 KiB
    ("tf32", 40, 72, 100, 1, C(32, 32, 16, 1, 2, 3), T.float32, False, False),
    ("tf32", 40, 72, 100, 2, C(32, 32, 32, 2, 1, 2, 2), T.float32, True, True),
    ("tf32", 40, 72, 100, 1, C(32, 32, 16, 1, 2, 3), T.float32, True, False),
    ("fp16", 300, 100, 40, 2, C(16, 32, 16, 1, 2, 3), T.float16, False, False),   # grouped
    # results staged through shared memory: runs inside Y or past it whole (n % 4 = 0), the
    # staged tile reusing the ring's pool memory (48 KiB ring, 68 KiB tile), runs cut by Y's
    # last column (n % 4 != 0)
    ("fp16", 40, 72, 104, 1, C(32, 64, 32, 2, 2, 3, staged=True), T.float16, False, True),
    ("bf16", 130, 264, 72, 1, C(128, 128, 32, 2, 4, 3, staged=True), T.bfloat16, True, False),
    ("tf32", 40, 70, 100, 1, C(32, 32, 16, 1, 2, 3, staged=True), T.float32, False, False),
]
SMOKE = (0, 2, 5, 9, 10, 13, 14, 15, 16)
"""CASES run on host threads in every run (cp.async both layouts, registers, tf32); the rest
are `emulated_full`."""

DEVICE_CASES = CASES + [
    ("fp16", 4096, 4096, 4096, 1, None, T.float16, False, False),
    ("fp16", 1024, 768, 3072, 1, C(128, 128, 32, 2, 2, 3), T.float16, False, False),
    ("bf16", 1024, 3072, 768, 1, None, T.bfloat16, False, True),
    ("fp16", 4096, 4096, 4096, 1, None, T.float32, False, False),
    ("tf32", 1024, 3072, 768, 1, None, T.float32, False, False),
]
"""What NVRTC compiles (and the GPU runs): CASES and the bench's shapes at their defaults."""


def product(precision, m, n, k, batch, config, dtype, trans_a, trans_b, name="mm",
            epilogue=True, rounded=False):
    """(PrimFunc, config) of Y = relu(A B + bias[j]) (batched, A and B in `dtype`, stored
    transposed when asked) on tensor cores at `precision`; Y = A B without `epilogue`;
    `rounded`: A and B hold tf32 values already (`Operand.rounded`)."""
    a = L.Buffer("a", dtype, (batch, k, m) if trans_a else (batch, m, k))
    b = L.Buffer("b", dtype, (batch, n, k) if trans_b else (batch, k, n))
    bias = L.Buffer("bias", T.float32, (n,))
    y = L.Buffer("y", T.float32, (batch, m, n))
    a_op = Operand((lambda bi, i, kk: a[bi, kk, i]) if trans_a else
                   (lambda bi, i, kk: a[bi, i, kk]), trans_a, True, rounded=rounded)
    b_op = Operand((lambda bi, j, kk: b[bi, j, kk]) if trans_b else
                   (lambda bi, j, kk: b[bi, kk, j]), not trans_b, True, rounded=rounded)
    config = config or mma.choose(m, n, k, batch, precision=precision)

    def store(bi, i, j, value):
        if not epilogue:
            return L.Store(y, (bi, i, j), value)
        return L.Store(y, (bi, i, j), L.maximum(value + bias[j], L.const(0.0, T.float32)))

    body = mma.mma_product(config, batch, m, n, k, a_op, b_op, store, precision=precision)
    return L.PrimFunc(name, (a, b, bias, y), body), config


def operands(rng, m, n, k, batch, dtype, trans_a, trans_b):
    """(A, B, bias) in float64 (A, B rounded to `dtype`) and the arrays the kernel reads."""
    a = rng.uniform(-1, 1, (batch, m, k)).astype(NUMPY[dtype])
    b = rng.uniform(-1, 1, (batch, k, n)).astype(NUMPY[dtype])
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    stored = [np.ascontiguousarray(a.transpose(0, 2, 1) if trans_a else a),
              np.ascontiguousarray(b.transpose(0, 2, 1) if trans_b else b), bias]
    return a.astype(np.float64), b.astype(np.float64), bias.astype(np.float64), stored


def check(precision, k, a, b, bias, got, gpu=False) -> float:
    """`got` against relu(a b + bias) (a b when `bias` is None) within the precision's
    bound; worst error / bound."""
    want = a @ b if bias is None else np.maximum(a @ b + bias, 0)
    limit = bound(precision, k, np.abs(a) @ np.abs(b), want, gpu=gpu)
    error = np.abs(got.astype(np.float64) - want)
    assert np.isfinite(got).all() and (error <= limit).all(), \
        f"worst error {error.max():.3g}, bound there {limit.flat[error.argmax()]:.3g}"
    return float((error / limit).max())


# -- the IR ---------------------------------------------------------------------------------------

def _warp_memory_func(trans: bool = False, count: int = 4, threads: bool = True):
    """A warp copying x (8 x 8 count 16-bit words as uint32 pairs) into shared memory with
    cp.async (chunk 1 of each row zero-filled: src_bytes 0), then ldmatrix into y."""
    x = L.Buffer("x", T.uint32, (8 * count * 4,))
    y = L.Buffer("y", T.uint32, (32 * count,))
    tile = L.Buffer("tile", T.uint32, (8 * count * 4,), L.Scope.SHARED)
    regs = L.Buffer("regs", T.uint32, (count,), L.Scope.LOCAL)
    t, r = L.Var("t"), L.Var("r")
    kind = L.ForKind.THREAD_X if threads else L.ForKind.SERIAL
    copy = L.For(t, 32, L.If(t < 8 * count, L.CopyAsync(
        tile[t * 4], x[t * 4], L.Select(L.eq(t, 1), L.const(0), L.const(16)))), kind)
    load = L.For(t, 32, L.seq(
        L.LdMatrix(regs[0], tile[t % (8 * count) * 4], count, trans),
        L.For(r, count, L.Store(y, (t * count + r,), regs[r]), L.ForKind.UNROLLED)), kind)
    body = L.Allocate(tile, L.Allocate(regs, L.seq(copy, L.AsyncCommit(), L.AsyncWait(0),
                                                    L.Barrier(), load)))
    return L.PrimFunc(f"warp_memory_{count}{'_t' if trans else ''}", (x, y),
                      L.For(L.Var("b"), 1, body, L.ForKind.BLOCK_X))


def test_warp_memory_nodes_are_verified_printed_and_refused_by_llvm():
    from dnnc.backends.llvm.codegen import CodegenError, ModuleBuilder

    func = _warp_memory_func(trans=True)
    L.verify(func)
    text = str(func)
    for line in ("ldmatrix_x4_trans(regs[0], tile[", "cp_async(tile[t * 4], x[t * 4], ",
                 "cp_async_commit()", "cp_async_wait(0)"):
        assert line in text, text
    with pytest.raises(L.LoopIRError, match="(cp.async|ldmatrix) outside a threadIdx.x loop"):
        L.verify(_warp_memory_func(threads=False))
    with pytest.raises(L.LoopIRError, match="ldmatrix of 3 matrices"):
        L.verify(L.transform(func, lambda s: replace(s, count=3)
                             if isinstance(s, L.LdMatrix) else None))
    with pytest.raises(L.LoopIRError, match="cp.async copies global memory to shared"):
        L.verify(L.transform(func, lambda s: replace(s, dst=s.src, src=s.dst)
                             if isinstance(s, L.CopyAsync) else None))
    serial = L.transform(func.body, lambda s: replace(s, kind=L.ForKind.SERIAL)
                         if isinstance(s, L.For) and s.kind is not L.ForKind.UNROLLED
                         else None)
    with pytest.raises(CodegenError, match="GPU-only"):
        ModuleBuilder("m").add(replace(func, body=serial))


def _ldmatrix_model(rows: np.ndarray, count: int, trans: bool) -> np.ndarray:
    """Registers [lane, q] of an ldmatrix of matrices rows[8 q: 8 q + 8] (each [8, 8]
    16-bit), written from the PTX ISA: lane l gets row l // 4, columns 2 (l % 4) and + 1 of
    matrix q (transposed: rows 2 (l % 4) and + 1, column l // 4), the first low."""
    out = np.zeros((32, count), np.uint64)
    for lane in range(32):
        g, pair = lane // 4, lane % 4
        for q in range(count):
            m = rows[8 * q: 8 * q + 8].astype(np.uint64)
            lo, hi = (m[2 * pair, g], m[2 * pair + 1, g]) if trans else \
                (m[g, 2 * pair], m[g, 2 * pair + 1])
            out[lane, q] = lo | hi << 16
    return out.astype(np.uint32)


@pytest.mark.parametrize("count,trans", [(4, False), (4, True), (2, True), (1, False)])
def test_ldmatrix_and_cp_async_on_host_mean_what_ptx_says(count, trans, tmp_path, rng):
    from test_host_semantics import host_library

    func = _warp_memory_func(trans, count)
    module = render_module([(func, True)])
    lib = host_library([(func, True)], tmp_path, module)
    x = rng.integers(0, 1 << 16, (8 * count, 8), dtype=np.uint16)
    y = np.zeros(32 * count, np.uint32)
    args = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
    (launch,) = module.kernels[func.name].launches
    lib.dnnc_launch(ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p), args,
                    *[ctypes.c_uint(g) for g in launch.grid], ctypes.c_uint(launch.block[0]))
    landed = x.copy()
    landed[1] = 0                      # row 1's copy read 0 bytes: zeros
    np.testing.assert_array_equal(y.reshape(32, count), _ldmatrix_model(landed, count, trans))


def _value(e: L.Expr, env: dict) -> int:
    out = L.simplify_expr(L.substitute(e, {v: L.const(x) for v, x in env.items()}))
    assert isinstance(out, L.Const), out
    return out.value


@pytest.mark.parametrize("precision,rows_contiguous,rows,bk", [
    ("fp16", False, 128, 16), ("fp16", False, 128, 32), ("fp16", False, 64, 64),
    ("fp16", True, 128, 32), ("fp16", True, 32, 16), ("tf32", False, 64, 16),
    ("tf32", True, 128, 32)])
def test_the_swizzle_leaves_no_bank_conflicts(precision, rows_contiguous, rows, bk):
    """Each ldmatrix matrix (8 lanes' 16-byte rows) and each 8 consecutive chunks stored
    fall in 8 distinct 16-byte groups of the 32 banks, in every slot."""
    bi = L.Var("bi")
    operand = Operand(lambda b, i, kk: L.Buffer("x", T.float32, (rows, bk))[i, kk],
                      rows_contiguous, True)
    tile = mma._Tile("a", rows, L.const(0), rows, operand, bk, bk, 128, False, bi, precision,
                     3)
    lane = L.Var("lane")
    for slot in range(3):
        for ks in range(bk // L.MMA_SHAPES[precision][2]):
            for base in range(0, rows // 8, 2):
                for a_side in (True, False):
                    words = [_value(tile.fragment_row(L.const(slot), ks, L.const(base), lane,
                                                      a_side), {lane: x}) for x in range(32)]
                    for q in range(4):
                        groups = {w // 4 % 8 for w in words[8 * q: 8 * q + 8]}
                        assert len(groups) == 8, (slot, ks, base, q, words)
        o, c = L.Var("o"), L.Var("c")
        chunks = [tuple(_value(x, {}) for x in tile._chunk_of(L.const(e)))   # threads' order
                  for e in range(tile.chunks)]
        stored = [_value(tile.word(L.const(slot), o, c), {o: x, c: y}) for x, y in chunks]
        assert len(set(stored)) == tile.chunks    # a permutation of the slot's chunks
        for first in range(0, tile.chunks, 8):
            assert len({w // 4 % 8 for w in stored[first: first + 8]}) == 8


def test_blocks_run_down_groups_of_row_tiles():
    """19 row tiles x 4 column tiles: blockIdx.x over all 76, down 8 row tiles a group (the
    last group 3), then across; each (row tile, column tile) once."""
    func, _ = product(*CASES[13])
    (launch,) = render_module([(func, True)]).kernels["mm"].launches
    assert launch.grid == (76, 1, 2)
    loop = next(n for n in L.walk(func.body) if isinstance(n, L.For) and
                n.kind is L.ForKind.BLOCK_X)
    lets, node = {}, loop.body
    while isinstance(node, L.Let):
        lets[node.var.name], node = node, node.body
    seen = []
    for tile in range(76):
        env = {loop.var: tile}
        env[lets["in_group"].var] = _value(lets["in_group"].value, env)
        seen.append(tuple(_value(lets[v].value, env) for v in ("by", "bx")))
    assert sorted(seen) == [(y, x) for y in range(19) for x in range(4)]
    assert seen[:10] == [(y, 0) for y in range(8)] + [(0, 1), (1, 1)]
    assert seen[64:] == [(16 + y % 3, y // 3) for y in range(12)]


def test_shared_tiles_beyond_48k_are_one_dynamic_pool():
    small, _ = product("fp16", 64, 64, 64, 1, C(64, 64, 32, 2, 2, 3), T.float16, False, False)
    large, _ = product("fp16", 128, 256, 64, 1, C(128, 256, 32, 2, 4, 3), T.float16, False,
                       False, name="large")
    module = render_module([(small, True), (large, True)])
    assert [x.shared_bytes for x in module.kernels["mm"].launches] == [0]
    assert [x.shared_bytes for x in module.kernels["large"].launches] == [3 * 32 * 384 * 2]
    assert module.source.count("DNNC_SHARED_POOL(dnnc_shared_pool, 73728);") == 1
    assert "unsigned int* const a_tile = reinterpret_cast<unsigned int*>(dnnc_shared_pool + " \
        in module.source


# -- numbers --------------------------------------------------------------------------------------

def _run_on_host(case, rng, tmp_path, epilogue=True):
    from test_host_semantics import host_library, launch_on_host

    precision, m, n, k, batch, config, dtype, trans_a, trans_b = case
    func, config = product(*case, epilogue=epilogue)
    module = render_module([(func, True)])
    source = module.source
    assert "dnnc_ldmatrix_x4(&" in source or "dnnc_ldmatrix_x4_trans(&" in source
    copies = dtype is mma.STORAGE.get(precision, T.float32) and \
        (precision != "tf32" or not (trans_a and not trans_b))   # (some operand k-major)
    assert ("dnnc_cp_async(&" in source) == copies
    kernels = source[source.index('extern "C"'):]
    assert ("dnnc_tf32(" in kernels) == (precision == "tf32")   # (rounded: staged, fragments)
    lib = host_library([(func, True)], tmp_path, module)
    a, b, bias, stored = operands(rng, m, n, k, batch, dtype, trans_a, trans_b)
    y = np.full((batch, m, n), np.nan, np.float32)
    info = module.kernels[func.name]
    arrays = stored + [y] + [np.full(size, 0xFF, np.uint8) for size in info.workspace]
    launch_on_host(lib, info, arrays)
    return check(precision, k, a, b, bias if epilogue else None, y)


@pytest.mark.parametrize("case", [
    CASES[i] if i in SMOKE else pytest.param(CASES[i], marks=pytest.mark.emulated_full)
    for i in range(len(CASES))], ids=[str(i) for i in range(len(CASES))])
def test_products_on_host_within_the_precision_bound(case, rng, tmp_path):
    worst = _run_on_host(case, rng, tmp_path)
    if case[6] is T.float32:   # the kernel rounded the operands: the emulation is not fp32's
        assert worst > 0.01


def test_results_of_whole_tiles_are_stored_as_vectors(rng, tmp_path):
    """Tiles that divide Y, a store of registers: each lane's two adjacent results of a row
    as one float2 (a bias read from memory, or an edge, keeps them one by one)."""
    case = CASES[0]
    plain = render_module([(product(*case, epilogue=False)[0], True)]).source
    assert plain.count("*reinterpret_cast<float2*>(&y[") == 2   # rows g and g + 8
    assert "float2*>(&y[" not in render_module([(product(*case)[0], True)]).source
    assert "float2*>(&y[" not in render_module([(product(*CASES[1], epilogue=False)[0],
                                                 True)]).source
    _run_on_host(case, rng, tmp_path, epilogue=False)


def test_staged_results_reuse_the_ring_and_store_runs_as_vectors():
    """A staged epilogue (cuda/staged.py): the tile of results takes the pool memory the
    operands' ring held, after a barrier (the pool is the larger of the two, not their sum),
    and each run of 4 results is one vector load from it and one vector store of Y, the bias
    read in the same runs."""
    func, config = product(*CASES[15])
    module = render_module([(func, True)])
    assert module.kernels[func.name].launches[0].shared_bytes == mma.shared_bytes(
        config, "bf16") == 128 * 136 * 4
    source = module.source
    assert "float* const y_tile = reinterpret_cast<float*>(dnnc_shared_pool + 0);" in source
    assert source.count("__syncthreads();\n") >= 1
    assert "const float4 v_vec = *reinterpret_cast<const float4*>(&y_tile[" in source
    assert "*reinterpret_cast<float4*>(&y[" in source
    plain = render_module([(product(*CASES[15][:5], replace(CASES[15][5], staged=False),
                                    *CASES[15][6:])[0], True)]).source
    assert "y_tile" not in plain and "float4*>(&y[" not in plain


def test_every_case_compiles_for_sm80_and_sm90_without_spills():
    """NVRTC (where CuPy is) compiles every case and the bench's shapes: no register spills
    in the bench's (64 x 64 warp tiles, up to 240 registers), at most 16 bytes in the small
    edge cases (ptxas spills 12 bytes of case 1, a 56-register kernel, on sm_90: not
    pressure)."""
    pytest.importorskip("cupy.cuda")   # NVRTC
    funcs = [(product(*case, name=f"case{i}")[0], True) for i, case in enumerate(DEVICE_CASES)]
    source = render_module(funcs).source
    for arch in ("sm_80", "sm_90"):
        _, log = nvrtc_compiled(source, arch, "--ptxas-options=-v")
        spills = dict(re.findall(r"Compiling entry function '(\w+)' for '\w+'\n.*\n.*?"
                                 r"(\d+) bytes spill stores", log))
        assert len(spills) >= len(funcs), log[-4000:]
        for name, spilled in spills.items():
            case = int(re.match(r"case(\d+)", name).group(1))
            assert int(spilled) <= (16 if case < len(CASES) else 0), (arch, name, spilled)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_case_compiles_with_nvcc_to_ldmatrix_and_cp_async(arch, tmp_path):
    funcs = [(product(*case, name=f"case{i}")[0], True) for i, case in enumerate(DEVICE_CASES)]
    path = tmp_path / "module.cu"
    path.write_text(render_module(funcs).source)
    proc = subprocess.run(["nvcc", f"-arch={arch}", "--ptx", "-std=c++17", "-o",
                           str(tmp_path / "module.ptx"), str(path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ptx = (tmp_path / "module.ptx").read_text()
    for instruction in ("ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                        "cp.async.cg.shared.global", "cp.async.commit_group",
                        "cp.async.wait_group 1", "mma.sync.aligned.m16n8k16.row.col.f32.bf16",
                        "mma.sync.aligned.m16n8k8.row.col.f32.tf32"):
        assert instruction in ptx, instruction


@pytest.mark.parametrize("precision", [
    p if p == "fp16" else pytest.param(p, marks=pytest.mark.emulated_full)
    for p in ("tf32", "fp16", "bf16")])
def test_convolutions_under_several_configs_on_host(precision, rng, tmp_path):
    """The implicit GEMM (weights k-major, gathered patches rows-major: ldmatrix .trans)
    through registers, under stages 2..4, split-k and narrow and wide warp tiles."""
    from test_cuda_precision import PRODUCTS, _check_on_host

    make, k = PRODUCTS["conv3x3_pad"]
    model_of = make(rng)
    for n, config in enumerate((C(32, 32, 16, 2, 1, 2), C(32, 64, 32, 1, 2, 4, 2),
                                C(64, 32, 16, 2, 2, 3, 4))):
        _check_on_host(model_of, k, precision, tmp_path / str(n), config)


@pytest.mark.gpu
@pytest.mark.parametrize("case", DEVICE_CASES[:len(CASES) + 2],
                         ids=[str(i) for i in range(len(CASES) + 2)])
def test_products_on_the_gpu_within_the_precision_bound(case, rng):
    import cupy as cp

    precision, m, n, k, batch, config, dtype, trans_a, trans_b = case
    func, config = product(*case)
    module = render_module([(func, True)])
    raw = cp.RawModule(code=module.source, options=("-std=c++17",))
    a, b, bias, stored = operands(rng, m, n, k, batch, dtype, trans_a, trans_b)
    arrays = [cp.asarray(x.view(np.uint16) if x.dtype.itemsize == 2 else x) for x in stored]
    y = cp.full((batch, m, n), np.nan, cp.float32)
    info = module.kernels[func.name]
    args = tuple(arrays + [y] + [cp.empty(size, cp.uint8) for size in info.workspace])
    for launch in info.launches:
        fn = raw.get_function(launch.name)
        device.allow_shared(fn, launch.shared_bytes)   # (as the runtime's executable does)
        fn(launch.grid, launch.block, args, shared_mem=launch.shared_bytes)
    check(precision, k, a, b, bias, cp.asnumpy(y), gpu=True)
