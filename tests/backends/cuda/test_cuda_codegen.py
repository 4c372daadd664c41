"""The cuda renderer and schedules without a GPU.

- the renderer on hand-built PrimFuncs: guards, barriers, restrict, workspace parameters,
  launches, dtypes and literals;
- the schedules' results computed on the CPU: a scheduled PrimFunc with its GPU loops run
  serially (a block's threads one after another between barriers, which is CUDA's meaning
  for these schedules: no thread reads what another writes before the next barrier) through
  the llvm renderer, against the NumPy reference, for every kernel of every zoo model and
  sampled configs of every template on shapes with tails (tests/backends/cuda/
  test_host_semantics.py runs the rendered CUDA C itself on the host);
- where nvcc is on PATH, `nvcc -arch=sm_90 --ptx` of the modules rendered for every zoo
  model and a sample of node-suite kernels.
"""

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from cuda_kernels import (MACHINE, SMALL, programs, reference, renamed, suite_cases,
                          suite_sample, zoo_model, zoo_programs)
from dnnc.backends.cuda.codegen import (CudaCodegenError, c_name, render_func, render_module,
                                        stages)
from dnnc.backends.cuda.schedules import DEFAULT, ROWS, schedule_kernel, template_for
from dnnc.backends.llvm.codegen import ModuleBuilder
from dnnc.backends.llvm.cpu import host_target
from dnnc.backends.llvm.jit import JITModule
from dnnc.backends.lower import lower_group
from dnnc.frontend.onnx import import_onnx
from dnnc.errors import ConfigError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value

ZOO = sorted(SMALL)


# -- harness -------------------------------------------------------------------------------------


def emulated(func: L.PrimFunc) -> L.PrimFunc:
    """`func` with its GPU loops serial and its barriers gone: what one block's threads do,
    one after another between barriers. A LOCAL buffer allocated outside the thread loops
    (a dense tile's accumulators, which live across barriers) gets one copy per thread. A
    warp shuffle reads another thread's copy as it was when its thread loop began (the
    schedules give each shuffle step a thread loop of its own: CUDA's lockstep warp)."""
    gpu = {k for k in L.ForKind if k.value.startswith(("blockIdx", "threadIdx"))}
    copies: dict[str, L.Buffer] = {}
    snapshots: dict[str, L.Buffer] = {}

    def expr(e, t):
        def rule(n):
            if isinstance(n, L.Load) and n.buffer.name in copies:
                return L.Load(copies[n.buffer.name], (t,) + n.indices)
            if isinstance(n, L.Call) and n.name in L.SHUFFLES:
                return shuffle(n, t)
            return None
        return L.transform(e, rule)

    def shuffle(n, t):
        load, lanes = n.args[0], n.args[1].value
        assert isinstance(load, L.Load) and load.buffer.name in snapshots, \
            f"a shuffle of {L.print_expr(load)}: not a thread's own copy"
        if n.name == "shfl_xor":
            partner = L.BinOp("^", t, L.const(lanes))
        else:   # shfl_down: the lane `lanes` above, or this lane past the warp
            partner = L.Select(t % 32 + lanes < 32, t + lanes, t)
        return L.Load(snapshots[load.buffer.name], (partner,) + load.indices[1:])

    def snapshot(loop):
        """The copies the shuffles in `loop` read, saved before it runs."""
        names = {n.args[0].buffer.name for n in L.walk(loop.body)
                 if isinstance(n, L.Call) and n.name in L.SHUFFLES}
        saves = []
        for name in sorted(names):
            copy = copies[name]
            snap = L.Buffer(f"{name}_snap{len(snapshots)}", copy.dtype, copy.shape, copy.scope)
            snapshots[name] = snap
            index = tuple(L.Var(f"{name}_s{k}") for k in range(len(copy.shape)))
            save = L.Store(snap, index, L.Load(copy, index))
            for v, d in reversed(list(zip(index, copy.shape))):
                save = L.For(v, d, save)
            saves.append((snap, save))
        return saves

    def stmt(s, t):
        if isinstance(s, L.For):
            inner = s.var if s.kind.is_gpu_thread else t
            saves = snapshot(s) if s.kind.is_gpu_thread else []
            out = L.For(s.var, s.extent, stmt(s.body, inner),
                        L.ForKind.SERIAL if s.kind in gpu else s.kind)
            for snap, save in saves:
                out = L.Allocate(snap, L.seq(save, out))
            return out
        if isinstance(s, L.Allocate):
            b = s.buffer
            threads = [n.extent.value for n in L.walk(s.body)
                       if isinstance(n, L.For) and n.kind.is_gpu_thread]
            if b.scope is L.Scope.LOCAL and t is None and threads:
                copies[b.name] = L.Buffer(b.name, b.dtype, (max(threads),) + b.shape, b.scope)
                return L.Allocate(copies[b.name], stmt(s.body, t))
            return L.Allocate(b, stmt(s.body, t))
        if isinstance(s, L.Seq):
            return L.seq(*(stmt(x, t) for x in s.stmts if not isinstance(x, L.Barrier)))
        if isinstance(s, L.Let):
            return L.Let(s.var, expr(s.value, t), stmt(s.body, t))
        if isinstance(s, L.If):
            return L.If(expr(s.cond, t), stmt(s.then, t),
                        None if s.orelse is None else stmt(s.orelse, t))
        if isinstance(s, L.Store):
            indices = tuple(expr(i, t) for i in s.indices)
            if s.buffer.name in copies:
                return L.Store(copies[s.buffer.name], (t,) + indices, expr(s.value, t))
            return L.Store(s.buffer, indices, expr(s.value, t))
        return s

    return L.PrimFunc(func.name, func.params, stmt(func.body, None), func.size_vars,
                      func.attrs)


def run_on_cpu(funcs: list[L.PrimFunc], arrays: dict[str, list[np.ndarray]]) -> None:
    """Run each of `funcs` emulated (`emulated`) on its arrays (params in order), in place."""
    mb = ModuleBuilder("cuda_emulated")
    for f in funcs:
        mb.add(emulated(f))
    jm = JITModule(str(mb), host_target(), 0)
    for f in funcs:
        fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
            jm.address(f"{c_name(f.name)}_packed"))
        ptrs = (ctypes.c_void_p * len(f.params))(*[a.ctypes.data for a in arrays[f.name]])
        fn(ptrs, (ctypes.c_int64 * 1)())


def poisoned(dtype: np.dtype, shape) -> np.ndarray:
    """An output buffer that is wrong unless written: NaN for floats, 0x5A bytes else."""
    out = np.empty(shape, dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        out[...] = np.nan
    else:
        out.view(np.uint8)[...] = 0x5A
    return out


def check_program_on_cpu(graph, program, values):
    """Every kernel of `program` run emulated on its reference inputs, against its reference
    outputs (rtol 1e-4, atol 1e-5)."""
    funcs, arrays, expected = [], {}, {}
    for kernel in program.kernels:
        if kernel.func.name in arrays:
            name = f"{kernel.func.name}_{len(funcs)}"
            func = L.PrimFunc(name, kernel.func.params, kernel.func.body)
        else:
            func, name = kernel.func, kernel.func.name
        ins = [np.ascontiguousarray(v.const if v.const is not None else values[v.name])
               for v in kernel.inputs]
        outs = [poisoned(np.dtype(v.type.dtype.np), v.type.shape) for v in kernel.outputs]
        funcs.append(func)
        arrays[name] = ins + outs
        expected[name] = [values[v.name] for v in kernel.outputs]
    run_on_cpu(funcs, arrays)
    for name, want in expected.items():
        got = arrays[name][-len(want):]
        for g, w in zip(got, want):
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True,
                                           err_msg=name)
            else:
                np.testing.assert_array_equal(g, w, err_msg=name)


def _graph(op, shape, dtype=T.float32, **attrs):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, shape))
    g.outputs = [g.add(op, x, **attrs)]
    return g


def _kernel(op, shape, dtype=T.float32, **attrs):
    g = _graph(op, shape, dtype, **attrs)
    return lower_group(list(g.nodes), f"k_{op}")


# -- the renderer on hand-built kernels --------------------------------------------------------


def test_bool_and_or_render_without_short_circuit():
    """The IR evaluates every operand of and / or: C's && and || only added branches (a
    copy's bounds checks in the tensor-core kernels became BSSY/BSYNC regions)."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.bool_, (4, 8)))
    y = g.add_input("y", T.TensorType(T.bool_, (4, 8)))
    g.outputs = [g.add("Or", g.add("And", x, y), x)]
    text, _ = render_func(schedule_kernel(lower_group(list(g.nodes), "k_bool"), MACHINE))
    assert "&&" not in text and "||" not in text
    assert " & " in text and " | " in text


def test_elementwise_launch_covers_the_extent_with_a_guard():
    kernel = _kernel("Relu", (5, 77))
    text, k = render_func(schedule_kernel(kernel, MACHINE))
    (launch,) = k.launches
    assert launch.grid[0] * launch.block[0] >= 5 * 77 > (launch.grid[0] - 1) * launch.block[0]
    # the tail is guarded (in 32 bits: narrow_indices)
    assert re.search(r"if \(\(\(\(int\)\(\w+\)\) < 385\)\)", text)
    assert 'extern "C" __global__' in text and "__restrict__" in text
    assert "const float* __restrict__ v_x" in text             # an input is const


def test_every_kernel_waits_for_the_one_ahead_before_any_global_access():
    """Programmatic dependent launch (programmatic.py): every `__global__` function of a
    model's module (products, convs, attention, reductions, layout copies) starts with
    `DNNC_GRID_DEPENDENCY()`, after the shared pool's declaration at most, so that a kernel
    launched before the one ahead of it has finished reads nothing it has not written; and
    programmatic launches are refused before sm_90 and under DNNC_PDL=0."""
    from dnnc.backends.cuda import programmatic
    from cuda_kernels import zoo_programs

    for name in ("cnn", "bert"):
        _, progs = zoo_programs(name)
        for program in progs:
            source = render_module(program.unique).source
            bodies = re.findall(r'extern "C" __global__[^{]*\{\n([^\n]*)\n([^\n]*)', source)
            assert bodies
            for first, second in bodies:
                assert first.strip() == "DNNC_GRID_DEPENDENCY();" or (
                    first.strip().startswith("DNNC_SHARED_POOL(") and
                    second.strip() == "DNNC_GRID_DEPENDENCY();"), (first, second)
    assert not programmatic.supported("sm_80")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DNNC_PDL", "0")
        assert not programmatic.supported("sm_90")


@pytest.mark.parametrize("op,shape,attrs", [("Relu", (0, 5), {}),
                                            ("ReduceSum", (0, 7), {"keepdims": 0})])
def test_empty_tensors_launch_one_idle_block(op, shape, attrs):
    _, k = render_func(schedule_kernel(_kernel(op, shape, **attrs), MACHINE))
    assert all(min(launch.grid) >= 1 and min(launch.block) >= 1 for launch in k.launches)


@pytest.mark.parametrize("rows,narrow", [(4, True), (3, False)])
def test_index_arithmetic_in_32_bits_where_it_fits(rows, narrow):
    cols = 100 if narrow else 1 << 30      # 3 x 2**30 elements: offsets past int32
    x = L.Buffer("x", T.float32, (rows, cols))
    i, j = L.Var("i"), L.Var("j")
    body = L.For(i, rows, L.For(j, cols, L.Store(x, (i, j), L.const(1.0)), L.ForKind.THREAD_X),
                 L.ForKind.BLOCK_X)
    if not narrow:
        body = L.For(i, rows, L.For(j, 64, L.For(L.Var("k"), cols // 64, L.Store(
            x, (i, j * (cols // 64) + L.Var("k")), L.const(1.0))), L.ForKind.THREAD_X),
            L.ForKind.BLOCK_X)
    text, _ = render_func(L.PrimFunc("f", (x,), body))
    assert ("x[((long long)((((int)(j)) + (((int)(i)) * 100))))]" in text) == narrow
    assert ("(int)" in text) == narrow


@pytest.mark.parametrize("start,stride,lanes,vector", [
    (0, 4, 4, "float4"), (0, 8, 4, "float4"), (2, 4, 2, "float2"),   # proven multiples
    (1, 4, 4, None), (0, 3, 4, None), (0, 2, 4, None)])              # not proven
def test_a_vectorized_copy_is_one_vector_load_only_where_alignment_is_proven(
        start, stride, lanes, vector):
    src = L.Buffer("src", T.float32, (1024,))
    dst = L.Buffer("dst", T.float32, (1024,))
    t, e, v = L.Var("t"), L.Var("e"), L.Var("v")
    body = L.For(t, 64, L.Let(e, t * stride + start, L.For(
        v, lanes, L.Store(dst, (t * lanes + v,), src[e + v]), L.ForKind.VECTORIZED)),
        L.ForKind.THREAD_X)
    text, _ = render_func(L.PrimFunc("f", (src, dst), body))
    assert ("reinterpret_cast<const float" in text) == (vector is not None)
    if vector:
        assert f"const {vector} " in text and "v_vec.y" in text


@pytest.mark.parametrize("start,stride,whole", [(0, 4, True), (8, 12, True), (1, 4, False),
                                                (0, 6, False)])
def test_load_word_is_one_load_only_where_alignment_is_proven(start, stride, whole, tmp_path):
    """`load_word(x[e])` (staged.py's int8 residual loaded ahead): `dnnc_load_word` (one
    32-bit ld.global.cg) where e is a proven multiple of 4, else its four bytes one at a
    time; the same word either way on host threads; the verifier takes only a global
    element of one byte."""
    from test_host_semantics import host_library

    src = L.Buffer("src", T.int8, (1024,))
    dst = L.Buffer("dst", T.uint32, (64,))
    t, e = L.Var("t"), L.Var("e")
    word = L.call("load_word", src[e], dtype=T.uint32)
    func = L.PrimFunc("f", (src, dst), L.For(t, 64, L.Let(
        e, t * stride + start, L.Store(dst, (t,), word)), L.ForKind.THREAD_X))
    L.verify(func)
    module = render_module([(func, True)])
    assert ("dnnc_load_word(&" in module.source) == whole
    lib = host_library([(func, True)], tmp_path, module)
    x = np.random.default_rng(start).integers(-128, 128, 1024).astype(np.int8)
    got = np.zeros(64, np.uint32)
    args = (ctypes.c_void_p * 2)(x.ctypes.data, got.ctypes.data)
    (launch,) = module.kernels["f"].launches
    lib.dnnc_launch(ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p), args,
                    *[ctypes.c_uint(g) for g in launch.grid], ctypes.c_uint(launch.block[0]))
    at = np.arange(64) * stride + start
    assert np.array_equal(got, x.view(np.uint8)[at[:, None] + np.arange(4)].astype(
        np.uint32) @ (1 << 8 * np.arange(4, dtype=np.uint32)))
    wide = L.Buffer("wide", T.int32, (1024,))
    with pytest.raises(L.LoopIRError, match="not load_word"):
        L.verify(L.PrimFunc("g", (wide, dst), L.For(t, 64, L.Store(dst, (t,), L.call(
            "load_word", wide[t], dtype=T.uint32)), L.ForKind.THREAD_X)))


@pytest.mark.parametrize("dtype", [T.int8, T.uint8])
def test_bytes_become_floats_by_their_bits(dtype, tmp_path):
    """An 8-bit integer to float32 is PRELUDE's `dnnc_s8_to_f32` / `dnnc_u8_to_f32` (2**23
    + 128 + b or 2**23 + b as bits, less the offset: no I2F), the difference of two of one
    type (x - zero point) that of their bits' floats (`dnnc_s8_bits` / `dnnc_u8_bits`),
    exact for all 256 bytes on host threads."""
    from test_host_semantics import host_library

    src = L.Buffer("src", dtype, (256,))
    dst = L.Buffer("dst", T.float32, (256,))
    t = L.Var("t")
    f, zp = L.Cast(T.float32, src[t]), L.Cast(T.float32, src[L.const(7)])
    func = L.PrimFunc("f", (src, dst), L.For(t, 256, L.Store(
        dst, (t,), f * L.const(0.5) + (f - zp) * L.const(0.25)), L.ForKind.THREAD_X))
    module = render_module([(func, True)])
    kernel = module.source.split("__global__")[-1]
    sign = "s" if dtype is T.int8 else "u"
    assert f"dnnc_{sign}8_to_f32(" in kernel and f"dnnc_{sign}8_bits(" in kernel
    assert "(float)" not in kernel
    lib = host_library([(func, True)], tmp_path, module)
    x = np.arange(256).astype(np.uint8).view(dtype.np)
    got = np.zeros(256, np.float32)
    args = (ctypes.c_void_p * 2)(x.ctypes.data, got.ctypes.data)
    (launch,) = module.kernels["f"].launches
    lib.dnnc_launch(ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p), args,
                    *[ctypes.c_uint(g) for g in launch.grid], ctypes.c_uint(launch.block[0]))
    xf, zf = x.astype(np.float32), np.float32(x[7])
    assert np.array_equal(got, xf * np.float32(0.5) + (xf - zf) * np.float32(0.25))


def _register_store(start, stride, lanes, dtype=T.float32, dst_scope=L.Scope.GLOBAL,
                    value=None, name="f"):
    """t < 64 threads, each computing `lanes` values into registers, then a VECTORIZED loop
    storing them at dst[t * stride + start + v]."""
    src = L.Buffer("src", dtype, (1024,))
    dst = L.Buffer("dst", dtype, (1024,), dst_scope)
    reg = L.Buffer("reg", dtype, (lanes,), L.Scope.LOCAL)
    t, e, u, v = L.Var("t"), L.Var("e"), L.Var("u"), L.Var("v")
    stored = reg[v] if value is None else value(src, e, v)
    body = L.seq(L.For(u, lanes, L.Store(reg, (u,), src[t * lanes + u] * L.const(2, dtype)),
                       L.ForKind.UNROLLED),
                 L.For(v, lanes, L.Store(dst, (e + v,), stored), L.ForKind.VECTORIZED))
    if dst_scope is L.Scope.SHARED:
        body = L.seq(body, L.Store(src, (t,), dst[t]))
    body = L.For(t, 64, L.Let(e, t * stride + start, L.Allocate(reg, body)),
                 L.ForKind.THREAD_X)
    if dst_scope is L.Scope.SHARED:
        body = L.Allocate(dst, body)
    return L.PrimFunc(name, (src,) if dst_scope is L.Scope.SHARED else (src, dst), body)


@pytest.mark.parametrize("start,stride,lanes,vector", [
    (0, 4, 4, "float4"), (8, 8, 4, "float4"), (2, 4, 2, "float2"),   # proven multiples
    (1, 4, 4, None), (0, 3, 4, None), (0, 2, 4, None), (3, 4, 2, None)])   # not proven
def test_a_vectorized_store_is_one_vector_store_only_where_alignment_is_proven(
        start, stride, lanes, vector):
    func = _register_store(start, stride, lanes)
    L.verify(func)
    text, _ = render_func(func)
    assert ("reinterpret_cast<float" in text) == (vector is not None)
    if vector:
        assert text.count(f"*reinterpret_cast<{vector}*>(&dst[") == 1
        assert f"= {vector}{{reg[" in text
    else:   # a store a lane
        assert len(re.findall(r"\bdst\[[^\]]*\] = ", text)) == 1 and "#pragma unroll" in text


@pytest.mark.parametrize("case,text", [
    ("int32", "*reinterpret_cast<int4*>(&dst["),
    ("float16", "*reinterpret_cast<ushort4*>(&dst["),   # its bits
    ("bfloat16", "*reinterpret_cast<ushort2*>(&dst["),
    ("shared", "*reinterpret_cast<float4*>(&dst["),   # declared __align__(16)
    ("local", None),                                   # registers: no vector access
    ("reads global", None),   # a lane's value read from memory another lane may store
    ("vector copy", "*reinterpret_cast<float4*>(&dst["),   # a load and a store, both vector
])
def test_vector_stores_by_destination_and_value(case, text):
    func = {
        "int32": lambda: _register_store(0, 4, 4, dtype=T.int32),
        "float16": lambda: _register_store(0, 4, 4, dtype=T.float16),
        "bfloat16": lambda: _register_store(2, 2, 2, dtype=T.bfloat16),
        "shared": lambda: _register_store(0, 4, 4, dst_scope=L.Scope.SHARED),
        "local": lambda: _register_store(0, 4, 4, dst_scope=L.Scope.LOCAL),
        "reads global": lambda: _register_store(
            0, 4, 4, value=lambda src, e, v: src[e + v] * L.const(3.0)),
        "vector copy": lambda: _register_store(0, 4, 4, value=lambda src, e, v: src[e + v]),
    }[case]()
    if case == "local":   # (a LOCAL dst of the kernel's own: wrap it in an Allocate)
        body = func.body
        func = L.PrimFunc("f", func.params[:1], L.Allocate(func.params[1], body))
    source, _ = render_func(func)
    if text is None:
        assert "reinterpret_cast<float4*>" not in source
    else:
        assert text in source
    if case == "vector copy":
        assert "*reinterpret_cast<const float4*>(&src[" in source


STORE_CASES = [(0, 4, 4, T.float32), (8, 8, 4, T.float32), (2, 4, 2, T.float32),
               (1, 4, 4, T.float32), (3, 4, 2, T.float32), (0, 4, 4, T.int32),
               (5, 8, 4, T.int32), (0, 4, 4, T.float16), (2, 2, 2, T.float16),
               (1, 2, 2, T.float16)]
"""(start, stride, lanes, dtype) of register stores that threads do not overlap: vector
stores where aligned, a store a lane where not."""


def _store_cases(seed: int):
    """(func, src, dst, want) of every STORE_CASES kernel, `dst` poisoned with 7s."""
    rng = np.random.default_rng(seed)
    out = []
    for k, (start, stride, lanes, dtype) in enumerate(STORE_CASES):
        src = (rng.standard_normal(1024) * 100).astype(dtype.np)
        dst = np.full(1024, 7, dtype.np)
        want = dst.copy()
        for t in range(64):
            want[t * stride + start:t * stride + start + lanes] = \
                src[t * lanes:(t + 1) * lanes] * 2
        out.append((_register_store(start, stride, lanes, dtype, name=f"f{k}"), src, dst, want))
    return out


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_vector_stores_store_what_the_lanes_computed_on_host(tmp_path):
    """The rendered CUDA C on host threads (test_host_semantics' shim) against NumPy."""
    from test_host_semantics import host_library

    cases = _store_cases(11)
    pairs = [(func, True) for func, *_ in cases]
    module = render_module(pairs)
    lib = host_library(pairs, tmp_path, module)
    for func, src, dst, want in cases:
        args = (ctypes.c_void_p * 2)(src.ctypes.data, dst.ctypes.data)
        (launch,) = module.kernels[func.name].launches
        host = ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p)
        lib.dnnc_launch(host, args, *[ctypes.c_uint(g) for g in launch.grid],
                        ctypes.c_uint(launch.block[0]))
        np.testing.assert_array_equal(dst, want, err_msg=func.name)


@pytest.mark.gpu
def test_vector_stores_store_what_the_lanes_computed_on_gpu():
    import cupy as cp

    cases = _store_cases(12)
    module = render_module([(func, True) for func, *_ in cases])
    raw = cp.RawModule(code=module.source, options=("-std=c++17",))
    for func, src, dst, want in cases:
        args = (cp.asarray(src), cp.asarray(dst))
        (launch,) = module.kernels[func.name].launches
        raw.get_function(launch.name)(launch.grid, launch.block, args)
        np.testing.assert_array_equal(cp.asnumpy(args[1]), want, err_msg=func.name)


@pytest.mark.codegen
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_vector_stores_compile_with_nvcc(tmp_path):
    funcs = [func for func, *_ in _store_cases(0)]
    funcs.append(_register_store(0, 4, 4, dst_scope=L.Scope.SHARED, name="shared"))
    funcs.append(_register_store(2, 2, 2, dtype=T.bfloat16, name="bf16"))
    ptx(render_module([(f, True) for f in funcs]).source, tmp_path)


def test_no_restrict_when_buffers_may_alias():
    func = schedule_kernel(_kernel("Relu", (64,)), MACHINE)
    text, _ = render_func(func, noalias=False)
    assert "__restrict__" not in text


def test_softmax_rows_one_launch_shuffles_and_registers():
    kernel = _kernel("Softmax", (6, 300), axis=-1)
    assert template_for(kernel)[0] is ROWS
    func = schedule_kernel(kernel, MACHINE)
    text, k = render_func(func)
    assert len(k.launches) == 1                     # max, sum and output fused per row
    # 64 threads a row (300 / 8 elements a thread, to a power of two), 2 rows a block
    assert k.launches[0].grid == (3, 1, 1) and k.launches[0].block == (128, 1, 1)
    assert k.workspace == []                        # the row max and sum in registers
    assert text.count("__shfl_xor_sync(0xffffffffu, ") == 10   # 5 butterfly steps each
    assert text.count("__syncthreads();") == 2      # one exchange of 2 warps' partials each
    assert text.count("v_x[") == 1                  # the row read once, into registers
    params = re.search(r"k_Softmax\((.*?)\)", text).group(1).split(", ")
    assert len(params) == 2


def test_a_warp_per_row_needs_no_shared_memory_nor_barrier():
    from dnnc.backends.cuda.schedules import RowsConfig
    kernel = _kernel("Softmax", (10, 96), axis=-1)
    func = schedule_kernel(kernel, MACHINE, RowsConfig(row_threads=32, row_block=128))
    text, k = render_func(func)
    assert k.launches[0].grid == (3, 1, 1) and k.launches[0].block == (128, 1, 1)
    assert "__shared__" not in text and "__syncthreads" not in text
    assert "if ((((int)(i3)) < 10))" in text   # the last block's rows past the tenth (32-bit)
    assert "float v_x_row" in text and k.workspace == []


def test_stages_are_launches_in_order():
    x = L.Buffer("x", T.float32, (100,))
    y = L.Buffer("y", T.float32, (100,))
    tmp = L.Buffer("tmp", T.float32, (100,))
    i, j = L.Var("i"), L.Var("j")
    body = L.Allocate(tmp, L.seq(L.For(i, 100, L.Store(tmp, (i,), x[i] * 2.0)),
                                 L.For(j, 100, L.Store(y, (j,), tmp[99 - j]))))
    func = L.PrimFunc("two", (x, y), body)
    from dnnc.backends.cuda.schedules import Config, schedule
    scheduled = schedule(func, Config(threads=64))
    text, k = render_func(scheduled)
    assert [launch.name for launch in k.launches] == ["two_s0", "two_s1"]
    assert k.workspace == [400]
    assert all(launch.grid == (2, 1, 1) and launch.block == (64, 1, 1) for launch in k.launches)
    assert text.index("two_s0(") < text.index("two_s1(")
    # correct: the second stage reads what other threads of the first wrote
    xs = np.arange(100, dtype=np.float32)
    ys = poisoned(np.dtype(np.float32), (100,))
    run_on_cpu([scheduled], {"two": [xs, ys]})
    np.testing.assert_array_equal(ys, (xs * 2)[::-1])


def test_whole_tensor_reduction_shuffles_then_one_exchange():
    kernel = _kernel("ReduceSum", (37, 29), keepdims=0)
    func = schedule_kernel(kernel, MACHINE)
    text, k = render_func(func)
    (launch,) = k.launches
    assert launch.grid == (1, 1, 1) and launch.block == (256, 1, 1)
    assert text.count("__shfl_xor_sync") == 5       # across each warp
    assert text.count("__syncthreads();") == 1      # then the 8 warps' partials
    assert "__shared__ __align__(16) float acc1_warps_" in text and "[8];" in text


@pytest.mark.parametrize("dtype,needle", [
    (T.float16, "dnnc_h2f("), (T.bfloat16, "dnnc_bf2f("), (T.float64, "double"),
    (T.int8, "signed char"), (T.uint16, "unsigned short")])
def test_dtypes(dtype, needle):
    op = "Abs" if dtype.is_int else "Neg"
    text, _ = render_func(schedule_kernel(_kernel(op, (33,), dtype), MACHINE))
    assert needle in text


def test_literals():
    x = L.Buffer("x", T.float32, (4,))
    y = L.Buffer("y", T.float32, (4,))
    i = L.Var("i")
    value = L.Select(x[i] > L.const(float("inf"), T.float32), L.const(float("-inf"), T.float32),
                     x[i] + L.const(0.1, T.float32))
    func = L.PrimFunc("lit", (x, y), L.For(i, 4, L.Store(y, (i,), value), L.ForKind.THREAD_X))
    text, k = render_func(func)
    assert "__uint_as_float(0x7f800000u)" in text and "__uint_as_float(0xff800000u)" in text
    assert "0.10000000149011612f" in text           # the float32 nearest 0.1, exactly
    neg = L.PrimFunc("neg", (y,), L.For(i, 4, L.Store(y, (i,), L.call(
        "neg", L.const(-1.0, T.float32))), L.ForKind.THREAD_X))
    assert "(-(-1.0f))" in render_func(neg)[0]      # not `--1.0f`, a decrement
    assert k.launches[0].block == (4, 1, 1)


def test_global_scratch_inside_a_loop_is_refused():
    x = L.Buffer("x", T.float32, (4,))
    tmp = L.Buffer("tmp", T.float32, (4,))
    i = L.Var("i")
    func = L.PrimFunc("bad", (x,), L.For(i, 4, L.Allocate(tmp, L.Store(x, (i,), L.const(1.0))),
                                         L.ForKind.THREAD_X))
    with pytest.raises(CudaCodegenError, match="top of the function"):
        L.verify(func)
        render_func(func)


def test_stages_split_inside_scratch():
    a, b = L.Buffer("a", T.float32, (2,)), L.Buffer("b", T.float32, (2,))
    s1, s2 = L.Store(a, (0,), L.const(1.0)), L.Store(a, (1,), L.const(2.0))
    workspace, body = stages(L.Allocate(b, L.seq(s1, L.Allocate(a, s2))))
    assert [w.name for w in workspace] == ["b", "a"] and body == [s1, s2]


# -- schedules computed on the CPU -------------------------------------------------------------


@pytest.mark.parametrize("template", [DEFAULT, ROWS])
@pytest.mark.parametrize("op,shape,attrs", [
    ("Softmax", (3, 5, 70), {"axis": -1}), ("ReduceSum", (1, 130), {"keepdims": 0}),
    ("ArgMax", (7, 33, 9), {"axis": 1}),
    ("LayerNormalization", (4, 65), {"axis": -1})])
def test_every_config_is_correct(rng, template, op, shape, attrs):
    g = Graph("g")
    args = [g.add_input("x", T.TensorType(T.float32, shape))]
    if op == "LayerNormalization":
        args.append(Value("s", T.TensorType(T.float32, shape[-1:]),
                          const=rng.standard_normal(shape[-1:]).astype(np.float32)))
    g.outputs = [g.add(op, *args, **attrs)]
    node = list(g.nodes)[0]
    kernel = lower_group([node], "k")
    problem = template.problem(kernel)
    xs = rng.standard_normal(shape).astype(np.float32)
    want = reference(g, {"x": xs})[node.outputs[0].name]
    space = template.space(problem, MACHINE)
    configs = space.sample(np.random.default_rng(0), 12) + [template.default(problem, MACHINE)]
    funcs, arrays = [], {}
    for c, config in enumerate(configs):
        func = template.build(problem, space.check(config), MACHINE)
        func = L.PrimFunc(f"k{c}", func.params, func.body)
        L.verify(func)
        render_func(func)   # renders
        funcs.append(func)
        consts = [np.ascontiguousarray(v.const) for v in kernel.inputs if v.const is not None]
        arrays[func.name] = [xs] + consts + [poisoned(want.dtype, want.shape)]
    run_on_cpu(funcs, arrays)
    for func, config in zip(funcs, configs):
        np.testing.assert_allclose(arrays[func.name][-1], want, rtol=1e-4, atol=1e-5,
                                   err_msg=str(config))


def _accepts(space, config) -> bool:
    try:
        space.check(config)
    except ConfigError:
        return False
    return True


FULL = pytest.mark.emulated_full
"""Beyond the smoke set (conftest.py's tier): runs where nvcc or a GPU is present, or with
DNNC_FULL_CUDA_EMULATION=1."""


@pytest.mark.parametrize("case", [
    "17x13x37", pytest.param("33x70x65 transB", marks=FULL),
    pytest.param("2x20x9x33 batched", marks=FULL),
    pytest.param("3x16x40x24 shared-B relu", marks=FULL), "1x300x37 gemv",
    "3x70x65 transB gemv", "2x5x9x33 batched gemv", "2x3x40x24 shared-B relu gemv",
    # B's contiguous dimension a multiple of 4: a thread's step a vector of B (float4)
    "1x64x48 gemv", "8x48x32 relu gemv", "3x40x64 transB gemv", "2x4x32x24 batched gemv",
    # tiles that divide the product: vector loads from global
    pytest.param("64x48x96", marks=FULL), pytest.param("32x64x96 transB", marks=FULL),
    "2x32x16x64 batched"])
def test_dense_configs_are_correct(rng, case):
    from dnnc.backends.cuda.dense import DENSE, DenseConfig
    from dnnc.backends.cuda.gemv import GEMV, GemvConfig

    template = GEMV if "gemv" in case else DENSE
    dims = [int(d) for d in case.split()[0].split("x")]
    *batch, m, k, n = dims
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (*batch, m, k)))
    bv = rng.standard_normal(((*batch, k, n) if "batched" in case else (n, k) if "transB" in case
                              else (k, n))).astype(np.float32)
    b = Value("b", T.TensorType(T.float32, bv.shape), const=bv)
    if "transB" in case:
        cv = rng.standard_normal((n,)).astype(np.float32)
        out = g.add("Gemm", a, b, Value("c", T.TensorType(T.float32, (n,)), const=cv),
                    transB=1, alpha=0.5, beta=2.0)
    else:
        out = g.add("MatMul", a, b)
    if "relu" in case:
        out = g.add("Relu", out)
    g.outputs = [out]
    kernel = lower_group(list(g.nodes), "k", outputs=[out])
    problem = template.problem(kernel)
    assert problem is not None and template.applies(problem)
    xs = rng.standard_normal((*batch, m, k)).astype(np.float32)
    want = reference(g, {"a": xs})[out.name]
    space = template.space(problem, MACHINE)
    configs = space.sample(np.random.default_rng(1), 5) + [template.default(problem, MACHINE)]
    if template is DENSE:   # split-k: slices summed by a second launch; 4 x 4 micro-tiles;
        # warps of 4 x 8 thread tiles (128 x 128, 64 x 256)
        configs += [c for c in [DenseConfig(16, 32, 8, 1, 2, split) for split in (2, 4, 8)] +
                    [DenseConfig(32, 32, 8, 4, 4), DenseConfig(32, 64, 16, 8, 8),
                     DenseConfig(128, 128, 8, 8, 8), DenseConfig(64, 256, 8, 8, 8)]
                    if _accepts(space, c)]
    if template is GEMV:   # vectors of B, by default where they divide its rows
        configs += [c for c in [GemvConfig(8, 16, 2, 4), GemvConfig(4, 32, 1, 4),
                                GemvConfig(16, 8, 4, 2), GemvConfig(8, 64, 8, 4)]
                    if _accepts(space, c)]
    funcs, arrays, texts = [], {}, []
    for c, config in enumerate(configs):
        func = template.build(problem, space.check(config), MACHINE)
        func = L.PrimFunc(f"k{c}", func.params, func.body)
        L.verify(func)
        texts.append(render_func(func)[0])
        funcs.append(func)
        consts = [np.ascontiguousarray(v.const) for v in kernel.inputs if v.const is not None]
        arrays[func.name] = [xs] + consts + [poisoned(want.dtype, want.shape)]
    if template is DENSE and all(d % 16 == 0 for d in (m, k, n)):
        assert any("reinterpret_cast<const float4" in text for text in texts)
    if template is GEMV and (k if "transB" in case else n) % 4 == 0:   # (texts[5]: default's)
        assert "reinterpret_cast<const float4*>(&v_b[" in texts[5]
    run_on_cpu(funcs, arrays)
    for func, config in zip(funcs, configs):
        np.testing.assert_allclose(arrays[func.name][-1], want, rtol=1e-4, atol=1e-4,
                                   err_msg=str(config))


@pytest.mark.parametrize("m,k,n,trans_b,want", [
    (1, 768, 768, False, (8, 128, 8, 4)),    # gpt2's decode products, B [k, n]: a float4 of
    (8, 768, 2304, False, (8, 128, 8, 4)),   # B a step, 2 threads across 8 columns
    (1, 3072, 768, False, (8, 256, 8, 4)),   # deep: 512 threads
    (8, 3072, 768, False, (4, 256, 8, 4)),   # ... in 4 columns where 8 rows' partials don't fit
    (15, 768, 2304, False, (8, 64, 8, 4)),   # 15 rows' partials: fewer threads along k
    (1, 768, 5000, True, (8, 32, 8, 4)),     # B [n, k]: a float4 of k, a warp a column
    (1, 96, 48, True, (4, 32, 1, 4)),        # few columns: 4 a block; 24 steps of k
    (1, 300, 37, False, (8, 32, 8, 1)),      # an odd n: scalar columns
])
def test_gemv_default_geometry(m, k, n, trans_b, want):
    from dnnc.backends.cuda.gemv import GEMV, threads

    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (m, k)))
    b = Value("b", T.TensorType(T.float32, (n, k) if trans_b else (k, n)),
              const=np.ones((n, k) if trans_b else (k, n), np.float32))
    g.outputs = [g.add("Gemm", a, b, transB=1) if trans_b else g.add("MatMul", a, b)]
    problem = GEMV.problem(lower_group(list(g.nodes), "k", outputs=g.outputs))
    config = GEMV.default(problem, MACHINE)
    assert (config.cols, config.k_split, config.unroll, config.vector) == want
    assert GEMV.space(problem, MACHINE).check(config) == config
    assert threads(problem, config) <= 512


@pytest.mark.parametrize("dims", [(128, 128, 8, 8, 8), (64, 256, 8, 8, 8), (32, 64, 8, 4, 8),
                                  (64, 64, 16, 4, 4), (16, 32, 16, 1, 2), (32, 32, 8, 8, 8)])
def test_warps_take_4_by_8_blocks_of_thread_tiles(dims):
    from dnnc.backends.cuda.dense import DenseConfig, _thread_offsets

    c = DenseConfig(*dims)
    t = L.Var("t")
    offsets = [tuple(L.simplify_expr(L.substitute(e, {t: L.const(n)})).value
                     for e in _thread_offsets(c, t)) for n in range(c.threads)]
    across_m, across_n = c.tile_m // c.thread_m, c.tile_n // c.thread_n
    assert sorted(offsets) == [(r, q) for r in range(across_m) for q in range(across_n)]
    if across_m * across_n >= 32 and across_n >= 8 and across_m >= 4:
        for w in range(c.threads // 32):   # a warp: 4 consecutive rows x 8 consecutive columns
            rows, cols = zip(*offsets[32 * w:32 * w + 32])
            assert len(set(rows)) == 4 and len(set(cols)) == 8 and min(cols) % 8 == 0


@pytest.mark.parametrize("cfg", [
    dict(c=3, oc=5, h=9, w=7, k=3, stride=1, pad=1),
    pytest.param(dict(c=8, oc=20, h=11, w=13, k=3, stride=2, pad=1), marks=FULL),
    pytest.param(dict(c=5, oc=7, h=10, w=10, k=3, stride=1, pad=2, dilation=2), marks=FULL),
    pytest.param(dict(c=4, oc=17, h=6, w=6, k=1, stride=1, pad=0, batch=2), marks=FULL),
    pytest.param(dict(c=16, oc=32, h=8, w=8, k=1, stride=1, pad=0), marks=FULL)])
def test_conv_configs_are_correct(rng, cfg):
    from dnnc.backends.cuda.conv import CONV2D
    from dnnc.backends.cuda.dense import DenseConfig

    batch = cfg.get("batch", 1)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (batch, cfg["c"], cfg["h"], cfg["w"])))
    wv = (rng.standard_normal((cfg["oc"], cfg["c"], cfg["k"], cfg["k"])) * 0.2).astype(
        np.float32)
    bv = rng.standard_normal(cfg["oc"]).astype(np.float32)
    conv = g.add("Conv", x, Value("w", T.TensorType(T.float32, wv.shape), const=wv),
                 Value("b", T.TensorType(T.float32, bv.shape), const=bv),
                 pads=[cfg["pad"]] * 4, strides=[cfg["stride"]] * 2,
                 dilations=[cfg.get("dilation", 1)] * 2)
    out = g.add("Relu", conv)
    g.outputs = [out]
    kernel = lower_group(list(g.nodes), "k", outputs=[out])
    problem = CONV2D.problem(kernel)
    assert problem is not None and CONV2D.applies(problem)
    xs = rng.standard_normal((batch, cfg["c"], cfg["h"], cfg["w"])).astype(np.float32)
    want = reference(g, {"x": xs})[out.name]
    space = CONV2D.space(problem, MACHINE)
    configs = space.sample(np.random.default_rng(2), 4) + [CONV2D.default(problem, MACHINE)] + \
        [c for c in [DenseConfig(16, 32, 8, 1, 2, split) for split in (2, 4)] +
         [DenseConfig(64, 256, 8, 8, 8), DenseConfig(64, 128, 16, 8, 8)]
         if _accepts(space, c)]
    check_configs_on_cpu(CONV2D, problem, kernel, configs, xs, want, atol=1e-4)


@pytest.mark.parametrize("pos", [[5], [2, -1], [3, 3, 0]])
def test_a_cache_written_in_place_stores_only_its_rows(rng, pos):
    """IndexCopy computed in its cache's array (`plan.in_place_outputs`): one thread an
    updated element, stores at the written positions only, the last of a repeated one wins;
    emulated on the CPU over a cache whose other rows must stay as they were."""
    from dnnc.backends.plan import build_program, in_place_outputs, segment_groups
    from dnnc.ir.segments import plan_steps
    from dnnc.passes.manager import optimize

    g = Graph("cache")
    cache = g.add_input("cache", T.TensorType(T.float32, (2, 3, 8, 16)))
    index = g.add_input("pos", T.TensorType(T.int64, (len(pos),)))
    x = g.add_input("x", T.TensorType(T.float32, (2, 3, len(pos), 16)))
    g.outputs = [g.add("IndexCopy", cache, index, x, axis=2)]
    g.aliases = {0: 0}
    graph = optimize(g, MACHINE, 3)
    (step,) = plan_steps(graph)
    program = build_program(step, tuple(v.type.shape for v in step.inputs), (),
                            segment_groups(step, graph.groups),
                            lambda k: schedule_kernel(k, MACHINE), True,
                            in_place_outputs(graph, step))
    (kernel,) = program.kernels
    _, k = render_func(kernel.func)
    (launch,) = k.launches
    assert launch.grid[0] * launch.block[0] < 2 * 3 * 8 * 16   # not a pass over the cache
    old = rng.standard_normal((2, 3, 8, 16)).astype(np.float32)
    xs = rng.standard_normal((2, 3, len(pos), 16)).astype(np.float32)
    at = np.array(pos, np.int64)
    want = old.copy()
    want[:, :, at % 8] = xs
    out = old.copy()   # the cache's own array: the kernel reads and writes it there
    run_on_cpu([kernel.func], {kernel.func.name: [old.copy(), at, xs, out,
                                                  np.zeros(3, np.int64)][
        :len(kernel.func.params)]})
    np.testing.assert_array_equal(out, want)


def check_configs_on_cpu(template, problem, kernel, configs, x, want, rtol=1e-4, atol=1e-5):
    """`template` built under each of `configs` (checked against its space), verified,
    rendered, and run emulated on the CPU on `x` and the kernel's constants: each output
    against `want`."""
    space = template.space(problem, MACHINE)
    funcs, arrays = [], {}
    for c, config in enumerate(configs):
        func = template.build(problem, space.check(config), MACHINE)
        func = L.PrimFunc(f"k{c}", func.params, func.body)
        L.verify(func)
        render_func(func)
        funcs.append(func)
        ins = [x if v.const is None else np.ascontiguousarray(v.const) for v in kernel.inputs]
        arrays[func.name] = ins + [poisoned(want.dtype, want.shape)]
    run_on_cpu(funcs, arrays)
    for func, config in zip(funcs, configs):
        np.testing.assert_allclose(arrays[func.name][-1], want, rtol=rtol, atol=atol,
                                   err_msg=str(config))


@pytest.mark.parametrize("model", [m if m in ("mlp", "cnn") else pytest.param(m, marks=FULL)
                                   for m in ZOO])
def test_zoo_kernels_on_cpu(model):
    graph, progs = zoo_programs(model)
    from dnnc import zoo
    values = reference(graph, zoo.inputs_for(zoo_model(model), np.random.default_rng(0)))
    for program in progs:
        for func, _ in program.unique:
            L.verify(func)   # the schedules keep the IR's invariants (a let's dtype, ...)
        module = render_module(program.unique)
        for kernel in program.kernels:
            launches = module.kernels[kernel.func.name].launches
            assert launches and all(max(lc.block) <= 1024 for lc in launches)
        check_program_on_cpu(graph, program, values)


# -- nvcc, compile only ------------------------------------------------------------------------

nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def ptx(source: str, tmp_path) -> None:
    path = tmp_path / "module.cu"
    path.write_text(source)
    proc = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", "-std=c++17", "-o",
                           str(tmp_path / "module.ptx"), str(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _every_op() -> list[L.PrimFunc]:
    """One kernel per (dtype, op) of the IR: every BinOp, intrinsic, cast and bit cast on
    every dtype it takes, one thread per element."""
    funcs = []
    i = L.Var("i")

    def kernel(name, in_dtypes, out_dtype, fn):
        xs = tuple(L.Buffer(f"x{k}", d, (7,)) for k, d in enumerate(in_dtypes))
        y = L.Buffer("y", out_dtype, (7,))
        body = L.For(i, 7, L.Store(y, (i,), fn(*[x[i] for x in xs])), L.ForKind.THREAD_X)
        funcs.append(L.PrimFunc(f"f{len(funcs)}_{name}", xs + (y,), body))

    for dt in T.ALL_DTYPES:
        ops = [*L.COMPARE]
        if dt.kind != "b":
            ops += list(L.ARITH)
        if dt.is_int or dt.kind == "b":
            ops += list(L.BITWISE) if dt.kind != "b" else ["&", "|", "^"]
        if dt.kind == "b":
            ops += list(L.LOGIC)
        for op in ops:
            out = T.bool_ if op in L.COMPARE or op in L.LOGIC else dt
            kernel(f"{dt.name}_{op}", (dt, dt), out, lambda a, b, op=op: L.BinOp(op, a, b))
        if dt.is_float:   # against a number (codegen's _BINARY_BY_NUMBER): x's NaN, ties
            for op in ("min", "max"):
                for k, c in enumerate((0.0, -0.0, 1.5, float("inf"), float("-inf"))):
                    kernel(f"{dt.name}_{op}_by_{k}", (dt,), dt,
                           lambda a, op=op, c=c: L.BinOp(op, a, L.const(c, dt)))
        # (check_index: test_host_semantics.test_check_index_records_the_first_bad_index;
        # dot_bf16x2 and dot_u8s8x4, a CPU's bf16 and int8 products, pack_u8x4 their
        # operand: tests/backends/llvm/test_bf16.py and test_int8.py; cluster_load, a
        # shared element of another block: test_cuda_wgmma.py's cluster splits; load_word,
        # a place's word: test_load_word_is_one_load_only_where_alignment_is_proven)
        calls = [n for n in L.INTRINSICS if n not in ("bitcast", "fma", "pow", "fmod",
                                                      "atan2", "check_index", "dot_bf16x2",
                                                      "dot_u8s8x4", "pack_u8x4",
                                                      "cluster_load", "load_word", *L.SHUFFLES,
                                                      *L.PACKS.values())]
        if not dt.is_float:
            calls = ["abs", "neg", "sign", "not", "isnan", "isinf"] if dt.kind != "b" \
                else ["not"]
        for name in calls:
            kernel(f"{dt.name}_{name}", (dt,), T.bool_ if name in ("isnan", "isinf", "not")
                   else dt, lambda a, name=name: L.call(name, a))
        for name in L.SHUFFLES:
            kernel(f"{dt.name}_{name}", (dt,), dt,
                   lambda a, name=name: L.call(name, a, L.const(1, T.int32)))
        if dt.is_float:
            for name in ("fma", "pow", "fmod", "atan2"):
                arity = 3 if name == "fma" else 2
                kernel(f"{dt.name}_{name}", (dt,) * arity, dt,
                       lambda *a, name=name: L.call(name, *a))
        for dst in T.ALL_DTYPES:
            if dst is not dt:
                kernel(f"{dt.name}_to_{dst.name}", (dt,), dst,
                       lambda a, dst=dst: L.Cast(dst, a))
            if dst.itemsize == dt.itemsize and dst is not dt and T.bool_ not in (dt, dst):
                kernel(f"{dt.name}_as_{dst.name}", (dt,), dst,
                       lambda a, dst=dst: L.call("bitcast", a, dtype=dst))
    return funcs


@nvcc
def test_every_op_on_every_dtype_compiles(tmp_path):
    funcs = _every_op()
    assert len(funcs) > 500
    ptx(render_module([(f, True) for f in funcs]).source, tmp_path)


@nvcc
def test_zoo_modules_compile_with_nvcc(tmp_path):
    funcs = []
    for m, model in enumerate(ZOO):
        _, progs = zoo_programs(model)
        for p, program in enumerate(progs):
            funcs += renamed(program, f"m{m}p{p}_")
    ptx(render_module(funcs).source, tmp_path)


@nvcc
def test_node_suite_sample_compiles_with_nvcc(tmp_path):
    funcs = []
    for c, (name, case) in enumerate(suite_cases(suite_sample(60)).items()):
        try:
            graph = import_onnx(case.model)
            _, progs = programs(graph)
        except Exception as exc:   # a case dnnc cannot import is the conformance suite's
            if type(exc).__module__.startswith("dnnc"):
                continue
            raise
        for p, program in enumerate(progs):
            funcs += renamed(program, f"c{c}p{p}_")
    assert len(funcs) > 40
    ptx(render_module(funcs).source, tmp_path)


def test_the_gpu_checks_comparison_takes_equal_nans_and_infinities_as_exact():
    """gpu_check's `_error`: an element equal to its reference is exact, NaN and inf included
    (a NaN reference once made every case holding one fail with an 'infinite' error)."""
    from gpu_check import _error

    want = np.array([0.5, np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert _error(want.copy(), want) == (True, 0.0)
    assert _error(want.astype(np.float16), want.astype(np.float16)) == (True, 0.0)
    wrong = want.copy()
    wrong[4] = 1.5
    assert not _error(wrong, want)[0]
    wrong = want.copy()
    wrong[1] = 0.0   # a number where NaN is due
    assert not _error(wrong, want)[0]


def test_a_buffer_threads_communicate_through_is_not_restrict():
    """A LayerNorm whose row mean and 1/std stay in global scratch (rows not fused: written
    by a row's first thread, read by every thread). `__restrict__` on those buffers let
    nvcc drop the store on an H100 when one launch wrote and read them (every output NaN);
    inputs and the output stay `__restrict__`."""
    import re

    from dnnc.backends.cuda.codegen import render_module
    from dnnc.backends.cuda.schedules import RowsConfig, schedule_kernel
    from dnnc.backends.lower import lower_group
    from dnnc.ir.graph import Graph, Value
    from dnnc.ir.target import Target

    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 64, 768)))
    s = Value("s", T.TensorType(T.float32, (768,)), const=np.ones(768, np.float32))
    b = Value("b", T.TensorType(T.float32, (768,)), const=np.zeros(768, np.float32))
    g.outputs = [g.add("LayerNormalization", x, s, b, axis=-1, epsilon=1e-5, name="ln")]
    kernel = lower_group(g.nodes, "k", outputs=g.outputs)
    func = schedule_kernel(kernel, Target("cuda", arch="sm_90"),
                           RowsConfig(row_threads=128, fuse_rows=False))
    module = render_module([(func, True)])
    header = re.search(r"\bk_s0\(([^)]*)\)\s*\{", module.source).group(1)   # k_s0(...) {
    params = dict(reversed(re.match(r"(.*?)\s*(\w+)$", p.strip()).groups())
                  for p in header.split(","))
    assert len(module.kernels["k"].workspace) == 2
    scratch = [name for name in params if name.startswith("layernorm_")]
    assert len(scratch) == 2 and all("__restrict__" not in params[n] for n in scratch)
    assert "__restrict__" in params["v_x"] and "__restrict__" in params["v_ln"]
