"""Render scheduled operator-IR PrimFuncs as one CUDA C translation unit (NVRTC-ready).

The interface the cuda runtime codes against:

    render_module(funcs: list[tuple[L.PrimFunc, bool]]) -> CudaModule
        `funcs` is `Program.unique`: each scheduled PrimFunc and whether its buffers may be
        declared `__restrict__` (noalias; never a buffer the kernel both writes and reads:
        threads of one launch communicate through it).
    CudaModule.source: str            one translation unit; every kernel `extern "C" __global__`;
                                      no #include (only what NVRTC has built in)
    CudaModule.kernels: dict[str, CudaKernel]   keyed by PrimFunc name
    CudaKernel.launches: list[Launch] run in this order, every one with the SAME arguments
    CudaKernel.workspace: list[int]   byte sizes of the PrimFunc's top-level GLOBAL scratch
                                      Allocates, in order (the runtime carves them from device
                                      memory, each aligned as cudaMalloc's, 256 bytes)
    CudaKernel.tensor_maps: list[TensorMapArg]   the tensor maps its `L.TmaLoad`s read, in
                                      order: each the parameter it describes (its index), its
                                      dtype, extents, byte strides and box (the runtime encodes
                                      each once the parameter's address is known, 128 bytes in
                                      device memory, `tensor_map.py`)
    Launch.name, .grid, .block, .shared_bytes
        the `__global__` symbol, (x, y, z) blocks and threads, dynamic shared memory bytes
        (0 unless the stage's shared buffers pass STATIC_SHARED_BYTES or it holds an
        `L.Wgmma`: then all of them, carved from one dynamic pool)

Every `__global__` takes, in order, one pointer per PrimFunc parameter (the element type's
pointer, `const` for buffers it never stores), then one pointer per workspace buffer
(`unsigned char*`-compatible: declared with its element type), then one per tensor map
(`const unsigned long long*`, the map's 16 words). Shapes are static.

A PrimFunc's body, inside its top-level GLOBAL Allocates (the workspace), is a sequence of
*stages* (`stages`); each stage becomes one `__global__` function and one launch (launches
run in stream order, which is the grid-wide synchronisation stages need between them). A
stage's launch size is read from its GPU-bound loops: grid = the largest extent of its
blockIdx loops per axis, block = the largest extent of its threadIdx loops per axis. A GPU
loop renders as its index variable (`blockIdx.x`, ...), guarded by `if (v < extent)` where
its extent is below the launch size (so several thread loops of different extents can
share one block between barriers); a stage without GPU loops runs on one thread.

The PrimFunc's accesses become single row-major offsets simplified with the loop bounds
(`indices.linearize`), it is legalized (`backends/legalize.py`), its index arithmetic goes to
32 bits where interval bounds allow (`indices.narrow_indices`), and every remaining primitive is spelled
through tables, as tinygrad's `code_for_op`: `_BINARY`, `_CALLS`, `_CASTS` and
`_BITCASTS`, and the statement / loop-kind / expression dispatch tables. Types: bool as
`bool`, integers as their C types, float32/float64 as float/double; float16 and bfloat16 are
stored as `unsigned short` bits (legalize leaves them only loads, stores, selects, bit casts
and conversions to and from float32): float16 converts through PTX `cvt` in two small device
functions of the prelude (what cuda_fp16.h does, without needing its header), bfloat16
likewise (`dnnc_f2bf`: `cvt.rn.bf16.f32` with legalize's NaN, NATIVE's `bf16_cast`; before
sm_80 legalize's integer bit operations). Index arithmetic is `long long` (the IR's int64)
unless `narrow_indices` proves 32 bits enough. int8 / uint8 become float32 by their bits
(`_BYTE_CASTS`; the difference of two, a dequantization, `_BYTE_BITS`), not by the conversion
pipe's I2F.
Warp shuffles (`L.SHUFFLES`) are `__shfl_xor_sync` / `__shfl_down_sync` over the full warp.
A gather's run-time index check (`L.index_checks`) is the prelude's `dnnc_check_index`, on the
kernel's error record (its last parameter, device memory the runtime reads back).
Tensor-core products (`L.Mma`) call a device function of `MMA_PRELUDE` per precision: inline
PTX `mma.sync.aligned` on the accumulators in place (sm_80 and newer); its operand registers
come from the `L.PACKS` intrinsics, the prelude's conversions (tf32: `cvt.rna.tf32.f32`;
fp16 / bf16: `cvt.rn.f16x2.f32` / `cvt.rn.bf16x2.f32`, two values a register), or from
shared memory through `L.LdMatrix` (`ldmatrix.sync.aligned`); `L.CopyAsync`, `L.AsyncCommit`
and `L.AsyncWait` are `cp.async.cg` (16 bytes, the source size zero-filling the rest),
`cp.async.commit_group` and `cp.async.wait_group`; both take shared addresses through
`cvta.to.shared`. A module holds that prelude only when it uses it. Warpgroup products
(`L.Wgmma`, its fence, commit and wait, `L.ProxyFence`) call `WGMMA_PRELUDE`'s functions
(`wgmma.mma_async` with matrix descriptors built from the operands' shared addresses); a
module using them holds its `ARCH_SPECIFIC` line (compiled for sm_90a), and a stage using
them takes all its shared buffers from the dynamic pool, each from a multiple of
`L.SWIZZLE_BYTES` (the descriptors' swizzle is of absolute shared addresses). A stage holding
`L.ClusterBarrier`s is launched in clusters of their size along z (`__cluster_dims__`, a
compile-time attribute: a plain launch honours it); they and `cluster_load` (a load through
the generic address `mapa` gives: `ld.shared::cluster`) are WGMMA_PRELUDE's too, and so are
`L.Mbarrier`'s operations (`mbarrier.init`, `mbarrier.arrive`, `cp.async.mbarrier.arrive.noinc`,
`mbarrier.arrive.expect_tx`, a `mbarrier.try_wait.parity` loop). `L.TmaLoad` is TMA_PRELUDE's
`cp.async.bulk.tensor.3d` from its map's kernel argument; in a stage holding one, each
mbarrier init is followed by `fence.mbarrier_init` (the copy engine then sees it).
Math calls are CUDA's accurate ones (expf, erff, ..., within 2 ulp), never the `__expf`
intrinsics. Signed integer overflow wraps in the IR; in C it is undefined, which nvcc does
not exploit in this straight-line code (noted, not guarded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...ir import loop as L
from ...ir import types as T
from ..legalize import check_legal, legalize
from .device import STATIC_SHARED_BYTES
from .indices import CudaCodegenError, linearize, narrow_indices
from .prelude import MMA_PRELUDE, PRELUDE, TMA_PRELUDE, WGMMA_N, WGMMA_PRELUDE

ERRORS = L.index_checks.INDEX_ERRORS
CHECKS_HOIST_FROM = frozenset({L.ForKind.SERIAL, L.ForKind.UNROLLED, L.ForKind.VECTORIZED})
"""Loops an index check that does not change in them is hoisted out of: a thread's own loops
(a GPU-bound loop is its launch's threads, each checking its own index)."""

NATIVE: frozenset[str] = frozenset({"dot_u8s8x4", "bf16_cast"})
"""Legalize rules whose ops this renderer renders itself: the int8 dot product (dp4a,
PRELUDE's `dnnc_dp4a`) and the bfloat16 <-> float32 casts (PRELUDE's `dnnc_f2bf`, one
`cvt.rn.bf16.f32` where the GPU has it, with legalize's NaN: a cast is then one expression, so
a pair of them is stored as one vector, as float16's); no others (CUDA's rsqrtf is not
correctly rounded; its half conversions are the prelude's)."""


TENSOR_CORE_NODES = (L.Mma, L.LdMatrix, L.CopyAsync, L.AsyncCommit, L.AsyncWait)
"""Statements rendered through MMA_PRELUDE."""

WGMMA_NODES = (L.Wgmma, L.WgmmaFence, L.WgmmaCommit, L.WgmmaWait, L.ProxyFence,
               L.ClusterBarrier, L.Mbarrier, L.TmaLoad)
"""Statements rendered through WGMMA_PRELUDE (which uses MMA_PRELUDE's shared addresses);
`L.TmaLoad` and an "expect_tx" `L.Mbarrier` through TMA_PRELUDE too."""

MAP_PREFIX = "dnnc_map"
"""A kernel's tensor-map parameters are named this and their place among its maps."""

C_TYPES: dict[T.DType, str] = {
    T.bool_: "bool", T.int8: "signed char", T.int16: "short", T.int32: "int",
    T.int64: "long long", T.uint8: "unsigned char", T.uint16: "unsigned short",
    T.uint32: "unsigned int", T.uint64: "unsigned long long", T.float32: "float",
    T.float64: "double", T.float16: "unsigned short", T.bfloat16: "unsigned short",
}
"""dtype -> the C type it is stored and computed in (narrow floats: their bits)."""

# a stage allocating more shared memory than `STATIC_SHARED_BYTES` (device.py) takes it as one
# dynamic pool (`DNNC_SHARED_POOL`, `Launch.shared_bytes`: the runtime raises the function's
# limit to it, `device.allow_shared`), each shared buffer a pointer into it
SHARED_POOL = "dnnc_shared_pool"

# the most threads a block may have and blocks a grid axis may have (CUDA's limits)
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class Launch:
    name: str                      # the __global__ symbol
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0          # dynamic shared memory
    cluster: int = 1               # blocks a cluster along z (its __cluster_dims__)


@dataclass(frozen=True)
class TensorMapArg:
    """A tensor map a kernel takes (`L.TensorMap` with its tensor named by place): the map of
    parameter `param` (its index among the PrimFunc's) of `dtype` (a NumPy name); `im2col`:
    an im2col map's corners and traversal strides (`L.TensorMap.im2col`), empty for a tiled
    one."""

    param: int
    dtype: str
    extents: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    im2col: tuple[int, ...] = ()


@dataclass
class CudaKernel:
    launches: list[Launch]
    workspace: list[int] = field(default_factory=list)
    tensor_maps: list[TensorMapArg] = field(default_factory=list)


@dataclass
class CudaModule:
    source: str
    kernels: dict[str, CudaKernel]


def render_module(funcs: list[tuple[L.PrimFunc, bool]]) -> CudaModule:
    """One translation unit holding every function of `funcs` ((PrimFunc, noalias) pairs)."""
    parts = []
    kernels: dict[str, CudaKernel] = {}
    for func, noalias in funcs:
        text, kernel = render_func(func, noalias)
        parts.append(text)
        kernels[func.name] = kernel
    nodes = [n for func, _ in funcs for n in L.walk(func.body)]
    uses_wgmma = any(isinstance(n, WGMMA_NODES) or isinstance(n, L.Call) and
                     n.name == "cluster_load" for n in nodes)
    uses_mma = uses_wgmma or any(isinstance(n, TENSOR_CORE_NODES) or isinstance(n, L.Call) and
                                 n.name in L.PACKS.values() for n in nodes)
    uses_tma = any(isinstance(n, L.TmaLoad) or isinstance(n, L.Mbarrier) and
                   n.op == "expect_tx" for n in nodes)
    return CudaModule("\n".join([PRELUDE] + [MMA_PRELUDE] * uses_mma +
                                [WGMMA_PRELUDE] * uses_wgmma + [TMA_PRELUDE] * uses_tma +
                                parts), kernels)


def tensor_maps(func: L.PrimFunc) -> list[L.TensorMap]:
    """The distinct tensor maps `func`'s TMA copies read, in the order they first appear."""
    return list(dict.fromkeys(n.map for n in L.walk(func.body) if isinstance(n, L.TmaLoad)))


def render_func(func: L.PrimFunc, noalias: bool = True) -> tuple[str, CudaKernel]:
    """The `__global__` functions of one PrimFunc (legalized here) and their launches."""
    if func.size_vars:
        raise CudaCodegenError(f"{func.name}: shapes must be static, not {func.size_vars}")
    try:   # a schedule's type slip must stop here, not corrupt memory at run time
        L.verify(func, placement=False)
    except L.LoopIRError as exc:
        raise CudaCodegenError(str(exc)) from None
    maps = tensor_maps(func)
    places = {b.name: k for k, b in enumerate(func.params)}
    map_args = [TensorMapArg(places[m.tensor.name], m.tensor.dtype.name, m.extents,
                             m.strides, m.box, m.im2col) for m in maps]
    func = legalize(linearize(L.index_checks.hoist(func, CHECKS_HOIST_FROM)), NATIVE)
    check_legal(func, NATIVE)
    func = narrow_indices(func)
    workspace, body = stages(func.body)
    stored = {n.buffer.name for n in L.walk(func.body) if isinstance(n, L.Store)} | \
        ({ERRORS.name} if L.index_checks.has_checks(func.body) else set())
    loaded = {n.buffer.name for n in L.walk(func.body) if isinstance(n, L.Load)}

    def restrict(b: L.Buffer) -> str:
        # a buffer one thread writes and other threads then read in the same launch (a row's
        # mean written by thread 0, read by all after a barrier) is not `__restrict__`: the
        # qualifier tells nvcc that nothing else changes it during the kernel, and nvcc then
        # dropped the store (a LayerNorm's 1/std stayed unwritten on an H100)
        written_and_read = b.name in stored and b.name in loaded
        return " __restrict__" if noalias and not written_and_read else ""

    params = [f"{'' if b.name in stored else 'const '}{C_TYPES[b.dtype]}*{restrict(b)} "
              f"{c_name(b.name)}" for b in func.params]
    params += [f"{C_TYPES[b.dtype]}*{restrict(b)} {c_name(b.name)}" for b in workspace]
    params += [f"const unsigned long long* __restrict__ {MAP_PREFIX}{k}"
               for k in range(len(maps))]
    base = c_name(func.name)
    texts, launches = [], []
    for k, stage in enumerate(body):
        name = base if len(body) == 1 else f"{base}_s{k}"
        grid, block = launch_dims(stage, func.name)
        em = _Emitter(func.name, grid, block)
        em.maps = {m: f"{MAP_PREFIX}{k}" for k, m in enumerate(maps)}
        em.tma = any(isinstance(n, L.TmaLoad) for n in L.walk(stage))
        align = L.SWIZZLE_BYTES if any(isinstance(n, (L.Wgmma, L.TmaLoad))
                                       for n in L.walk(stage)) else 16
        pool = shared_pool_bytes(stage, align)
        if shared_bytes(stage, align) > STATIC_SHARED_BYTES or align > 16:
            em.pool, em.pool_align = 0, align   # one dynamic pool, buffers carved from it
            em.emit(1, f"DNNC_SHARED_POOL({SHARED_POOL}, {pool});")
        em.emit(1, "DNNC_GRID_DEPENDENCY();")   # (programmatic.py: before any global access)
        em.stmt(stage, 1)
        threads = math.prod(block)
        cluster = _cluster_size(stage, func.name)
        dims = f" __cluster_dims__(1, 1, {cluster})" if cluster > 1 else ""
        texts.append(f'extern "C" __global__ void __launch_bounds__({threads}){dims}\n'
                     f"{name}({', '.join(params)}) {{\n" + "\n".join(em.lines) + "\n}\n")
        launches.append(Launch(name, grid, block, pool if em.pool is not None else 0, cluster))
    sizes = []
    for b in workspace:
        shape = L.static_shape(b.shape)
        if shape is None:
            raise CudaCodegenError(f"{func.name}: scratch {b.name} has a symbolic shape")
        sizes.append(max(1, math.prod(shape)) * b.dtype.itemsize)
    return "\n".join(texts), CudaKernel(launches, sizes, map_args)


def _cluster_size(stage: L.Stmt, name: str) -> int:
    """Blocks a cluster (along z) of a stage: what its `L.ClusterBarrier`s say, 1 without
    them."""
    sizes = {n.size for n in L.walk(stage) if isinstance(n, L.ClusterBarrier)}
    if len(sizes) > 1:
        raise CudaCodegenError(f"{name}: clusters of {sorted(sizes)} blocks in one launch")
    return sizes.pop() if sizes else 1


def _shared_size(b: L.Buffer, align: int) -> int:
    return -(-max(1, math.prod(L.static_shape(b.shape) or (1,))) * b.dtype.itemsize //
             align) * align


def shared_bytes(stage: L.Stmt, align: int = 16) -> int:
    """Bytes of every shared buffer a stage allocates, each from an `align`-byte boundary
    (what static `__shared__` arrays take: nvcc gives each its own)."""
    return sum(_shared_size(n.buffer, align) for n in L.walk(stage)
               if isinstance(n, L.Allocate) and n.buffer.scope is L.Scope.SHARED)


def shared_pool_bytes(s: L.Stmt, align: int = 16) -> int:
    """Bytes of the dynamic pool a stage needs: the most its shared buffers take at once, a
    buffer's memory free once its Allocate's body ends (`_Emitter.allocate` reuses it)."""
    if isinstance(s, L.Allocate):
        own = _shared_size(s.buffer, align) if s.buffer.scope is L.Scope.SHARED else 0
        return own + shared_pool_bytes(s.body, align)
    if isinstance(s, L.Seq):
        return max((shared_pool_bytes(x, align) for x in s.stmts), default=0)
    if isinstance(s, L.If):
        return max(shared_pool_bytes(s.then, align),
                   0 if s.orelse is None else shared_pool_bytes(s.orelse, align))
    if isinstance(s, (L.For, L.Let)):
        return shared_pool_bytes(s.body, align)
    return 0


def stages(body: L.Stmt) -> tuple[list[L.Buffer], list[L.Stmt]]:
    """A PrimFunc body as (its top-level GLOBAL scratch buffers, its stages in order): the
    statements of its sequence inside those Allocates, each run as one launch."""
    workspace: list[L.Buffer] = []
    out: list[L.Stmt] = []

    def visit(s: L.Stmt) -> None:
        if isinstance(s, L.Allocate) and s.buffer.scope is L.Scope.GLOBAL:
            workspace.append(s.buffer)
            visit(s.body)
        elif isinstance(s, L.Seq):
            for x in s.stmts:
                visit(x)
        else:
            out.append(s)

    visit(body)
    return workspace, out


_AXES = {kind: (k % 3) for k, kind in enumerate(
    (L.ForKind.BLOCK_X, L.ForKind.BLOCK_Y, L.ForKind.BLOCK_Z,
     L.ForKind.THREAD_X, L.ForKind.THREAD_Y, L.ForKind.THREAD_Z))}


def launch_dims(stage: L.Stmt, name: str = "") -> tuple[tuple, tuple]:
    """(grid, block) of a stage: per axis, the largest extent of its GPU loops (1 without)."""
    grid, block = [1, 1, 1], [1, 1, 1]
    for n in L.walk(stage):
        if isinstance(n, L.For) and n.kind in _AXES:
            if not isinstance(n.extent, L.Const):
                raise CudaCodegenError(f"{name}: loop {n.var.name} bound to {n.kind.value} "
                                       f"has a symbolic extent")
            dims = grid if n.kind.is_gpu_block else block
            axis = _AXES[n.kind]
            dims[axis] = max(dims[axis], n.extent.value)
    if math.prod(block) > MAX_BLOCK_THREADS:
        raise CudaCodegenError(f"{name}: a block of {block} threads exceeds "
                               f"{MAX_BLOCK_THREADS}")
    if any(g > m for g, m in zip(grid, MAX_GRID)):
        raise CudaCodegenError(f"{name}: grid {grid} exceeds CUDA's {MAX_GRID}")
    return tuple(grid), tuple(block)


def c_name(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


# ---------------------------------------------------------------------------------------------
# Op tables: emitters take rendered operand strings and the result's dtype, and return C.


def _class(dtype: T.DType) -> str:
    """`dtype`'s key in the op tables: f(loat), s(igned), u(nsigned), b(ool), h(alf bits)."""
    if dtype in (T.float16, T.bfloat16):
        return "h"
    if dtype.is_float:
        return "f"
    return "b" if dtype.kind == "b" else "s" if dtype.kind == "i" else "u"


def _wrap(text: str, dtype: T.DType) -> str:
    """C promotes integers narrower than int (and bool) to int: the IR's result is cast
    back, so that it wraps at its own width."""
    return f"(({C_TYPES[dtype]})({text}))" if dtype.itemsize < 4 or dtype.kind == "b" \
        else f"({text})"


def _infix(op: str) -> Callable:
    return lambda a, b, dt: f"({a} {op} {b})"


def _int_infix(op: str) -> Callable:
    return lambda a, b, dt: _wrap(f"{a} {op} {b}", dt)


def _func(name: str) -> Callable:
    return lambda *args: f"{name}({', '.join(args[:-1])})"


_BINARY: dict[tuple[str, str], Callable] = {
    **{("f", op): _infix(op) for op in ("+", "-", "*", "/")},
    ("f", "min"): _func("dnnc_fmin"), ("f", "max"): _func("dnnc_fmax"),
    # C's ordered compares are false on NaN and != is true on it: IEEE's, NumPy's
    **{(c, op): _infix(op) for c in "fsub" for op in L.COMPARE},
    **{(c, op): _int_infix(op) for c in "sub" for op in ("+", "-", "*", "&", "|", "^")},
    **{(c, op): _int_infix(op) for c in "su" for op in ("<<", ">>")},  # >>: arithmetic on s
    **{(c, op): _func(fn) for c in "su" for op, fn in (("min", "dnnc_imin"),
                                                       ("max", "dnnc_imax"))},
    # not && and ||: the IR's expressions evaluate every operand (no side effects, loads in
    # range), and C's short circuit became branches around a copy's bounds checks
    ("b", "and"): _infix("&"), ("b", "or"): _infix("|"),
}
"""(class of the operands, BinOp op) -> emitter(a, b, result dtype)."""

_BINARY_BY_NUMBER: dict[tuple[str, str], Callable] = {
    ("f", "min"): _func("dnnc_fmin_k"), ("f", "max"): _func("dnnc_fmax_k"),
}
"""(class, op) -> emitter where b is a constant other than NaN (a clamp's bound, Relu's 0):
min and max as one unordered compare and a select, the same results as `_BINARY`'s (a clamp
to a byte's range was 8 instructions, 4 here)."""

_MATH = ("exp", "log", "sqrt", "tanh", "erf", "floor", "ceil", "trunc", "sin", "cos", "tan",
         "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "fmod",
         "log1p", "expm1", "atan2", "fma")


def _libm(name: str) -> Callable:
    """CUDA's math function `name` for double, `name`f for float."""
    def emit(*args):
        *xs, dt = args
        return f"{name}{'f' if dt is T.float32 else ''}({', '.join(xs)})"
    return emit


def _shuffle(name: str) -> Callable:
    """`__shfl_xor_sync` / `__shfl_down_sync` over the full warp."""
    def emit(x, lanes, dt):
        return _wrap(f"__{name}_sync(0xffffffffu, {x}, {lanes})", dt)
    return emit


_CALLS: dict[tuple[str, str], Callable] = {
    **{("f", name): _libm(name) for name in _MATH},
    ("f", "abs"): _libm("fabs"),
    ("f", "round"): _libm("rint"),   # half to even, as NumPy's round
    ("f", "neg"): lambda x, dt: f"(-({x}))",   # (not `--1.0f` for a negative literal)
    # legalize's primitives: C's truncating quotient and remainder (divisor made safe)
    **{(c, "idiv"): _int_infix("/") for c in "su"},
    **{(c, "irem"): _int_infix("%") for c in "su"},
    ("f", "ftoi"): lambda x, dt: _convert(x, dt),   # (its operand made in range by legalize)
    # the whole warp takes part (L.SHUFFLES); narrow types go through int and back
    **{(c, name): _shuffle(name) for c in "fsubh" for name in L.SHUFFLES},
    # tensor-core operand registers (MMA_PRELUDE)
    ("f", "pack_tf32"): _func("dnnc_tf32"), ("f", "pack_fp16x2"): _func("dnnc_f16x2"),
    ("f", "pack_bf16x2"): _func("dnnc_bf16x2"),
    ("s", "dot_u8s8x4"): _func("dnnc_dp4a"),   # (PRELUDE)
}
"""(class of the first argument, Call name) -> emitter(*args, result dtype)."""


def _convert(x: str, dt: T.DType) -> str:
    return f"(({C_TYPES[dt]})({x}))"


_CASTS: dict[tuple[str, str], Callable] = {
    # (no float -> integer: legalize writes `ftoi` of a value in range, as C leaves an
    # out-of-range conversion undefined and CUDA's cvt.rzi saturates)
    **{(a, b): _convert for a in "fsub" for b in "fsu" if not (a == "f" and b in "su")},
    **{(a, "b"): (lambda x, dt: f"(({x}) != 0)") for a in "fsu"},   # NaN: true
    ("h", "f"): lambda x, dt: f"dnnc_h2f({x})",   # (float16 <-> float32 only, after legalize)
    ("f", "h"): lambda x, dt: f"dnnc_f2h({x})",
}
"""(source class, destination class) -> emitter(value, destination dtype)."""

_BF16_CASTS: dict[tuple[T.DType, T.DType], Callable] = {
    (T.float32, T.bfloat16): _func("dnnc_f2bf"), (T.bfloat16, T.float32): _func("dnnc_bf2f"),
}
"""The bfloat16 casts (NATIVE's `bf16_cast`; legalize leaves no other): (source, destination)
-> emitter."""

_BYTE_CASTS: dict[tuple[T.DType, T.DType], Callable] = {
    (T.int8, T.float32): _func("dnnc_s8_to_f32"), (T.uint8, T.float32): _func("dnnc_u8_to_f32"),
}
"""8-bit integers to float32 by their bits (PRELUDE's): a quantized epilogue's dequantizations
off the conversion pipe, which a residual 1x1 conv's epilogue filled (docs/cuda_backend.md)."""

_BYTE_BITS = {T.int8: "dnnc_s8_bits", T.uint8: "dnnc_u8_bits"}
"""An 8-bit type -> PRELUDE's function of a value's float 2**23 + offset + b: float(a) -
float(b) of two of one type (x - zero point) is the difference of theirs, one FADD."""


def _byte_difference(e: L.BinOp) -> str | None:
    """`_BYTE_BITS`' function where `e` is float32(a) - float32(b) of two 8-bit integers of one
    type, else None."""
    if e.op != "-" or e.dtype is not T.float32 or not all(
            isinstance(x, L.Cast) for x in (e.a, e.b)) or e.a.value.dtype is not \
            e.b.value.dtype:
        return None
    return _BYTE_BITS.get(e.a.value.dtype)


_BITCASTS: dict[tuple[T.DType, T.DType], Callable] = {
    (T.float32, T.uint32): _func("__float_as_uint"),
    (T.float32, T.int32): _func("__float_as_int"),
    (T.uint32, T.float32): _func("__uint_as_float"),
    (T.int32, T.float32): _func("__int_as_float"),
    (T.float64, T.int64): _func("__double_as_longlong"),
    (T.int64, T.float64): _func("__longlong_as_double"),
    (T.float64, T.uint64): lambda x, dt: f"((unsigned long long)__double_as_longlong({x}))",
    (T.uint64, T.float64): lambda x, dt: f"__longlong_as_double((long long)({x}))",
    # a bool's byte is 0 or 1: its bits as a byte are its value (the other way a byte of 2
    # would have to stay 2 in a bool, which C cannot hold: no entry)
    (T.bool_, T.uint8): _convert,
    (T.bool_, T.int8): _convert,
}
"""(source, destination) -> emitter for bit casts between differently stored types; types of
one storage (float16, bfloat16 and 16-bit integers; signed and unsigned of a width) convert
as C integers, which keeps the bits."""


def _float_literal(value: float, dtype: T.DType) -> str:
    if math.isfinite(value):
        text = repr(float(dtype.np.type(value)))   # exact: the double holding the value
        return text + ("f" if dtype is T.float32 else "")
    if dtype is T.float32:
        bits = int(np.array(value, np.float32).view(np.uint32))
        return f"__uint_as_float({bits:#x}u)"
    bits = int(np.array(value, np.float64).view(np.uint64))
    return f"__longlong_as_double({bits:#x}LL)"


def _int_literal(value: int, dtype: T.DType) -> str:
    bits = 8 * dtype.itemsize
    if dtype.kind == "u":
        return f"{value}u" if bits == 32 else f"{value}ULL" if bits == 64 else \
            _convert(str(value), dtype)
    if value == -(1 << (bits - 1)) and bits >= 32:   # (no literal for MIN itself)
        return f"({value + 1}{'LL' if bits == 64 else ''} - 1)"
    text = f"{value}LL" if bits == 64 else str(value)
    return text if bits >= 32 else _convert(text, dtype)


class _Emitter:
    """Renders one stage's statements as C lines and expressions as strings."""

    def __init__(self, func: str, grid: tuple, block: tuple):
        self.func = func
        self.grid = grid
        self.block = block
        self.lines: list[str] = []
        self.divisors: dict[L.Var, int] = {}   # of the lets in scope (alignment proofs)
        self.pool: int | None = None   # bytes of the dynamic shared pool carved so far
        self.pool_align = 16           # each buffer of it from a multiple of this
        self.pool_used = 0             # bytes of the pool any buffer has held so far
        self.maps: dict[L.TensorMap, str] = {}   # the function's tensor maps' parameters
        self.tma = False               # the stage holds a TMA copy

    def fail(self, what: str):
        raise CudaCodegenError(f"{self.func}: {what}")

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    # -- statements (dispatched through _STMT) -----------------------------------------------

    def stmt(self, s: L.Stmt, depth: int) -> None:
        emit = _STMT.get(type(s))
        if emit is None:
            self.fail(f"cannot render {s!r}")
        emit(self, s, depth)

    def seq(self, s: L.Seq, depth: int) -> None:
        for x in s.stmts:
            self.stmt(x, depth)

    def loop(self, s: L.For, depth: int) -> None:
        _LOOP[s.kind](self, s, depth)

    def serial_for(self, s: L.For, depth: int, pragma: str = "") -> None:
        if pragma:
            self.emit(depth, pragma)
        v = c_name(s.var.name)
        self.emit(depth, f"for (long long {v} = 0; {v} < {self.expr(s.extent)}; ++{v}) {{")
        self.stmt(s.body, depth + 1)
        self.emit(depth, "}")

    def unrolled_for(self, s: L.For, depth: int) -> None:
        self.serial_for(s, depth, "#pragma unroll")

    def gpu_for(self, s: L.For, depth: int) -> None:
        """The loop's variable is the block's or thread's index on its axis; guarded where
        the launch has more blocks or threads on that axis than the loop iterations."""
        axis = _AXES[s.kind]
        size = (self.grid if s.kind.is_gpu_block else self.block)[axis]
        v = c_name(s.var.name)
        self.emit(depth, f"{{ const long long {v} = {s.kind.value};")
        if s.extent.value < size and s.kind is L.ForKind.THREAD_X and \
                s.extent.value % 32 == 0 and size % 32 == 0 and \
                any(isinstance(n, L.Wgmma) for n in L.walk(s.body)):
            # whole warps: a condition ptxas sees is the warp's (a wgmma on a path it deems
            # divergent is serialized, C7518), from lane 0 (WGMMA_PRELUDE)
            self.emit(depth + 1, f"if (dnnc_warp_index() < {s.extent.value // 32}u) {{")
            self.stmt(s.body, depth + 2)
            self.emit(depth + 1, "}")
        elif s.extent.value < size:
            self.emit(depth + 1, f"if ({v} < {s.extent.value}LL) {{")
            self.stmt(s.body, depth + 2)
            self.emit(depth + 1, "}")
        else:
            self.stmt(s.body, depth + 1)
        self.emit(depth, "}")

    def store(self, s: L.Store, depth: int) -> None:
        self.emit(depth, f"{self.address(s.buffer, s.indices)} = {self.expr(s.value)};")

    def let(self, s: L.Let, depth: int) -> None:
        self.emit(depth, f"{{ const {C_TYPES[s.var.dtype]} {c_name(s.var.name)} = "
                         f"{self.expr(s.value)};")
        if s.var.dtype.is_int:
            self.divisors[s.var] = L.divisor(s.value, self.divisors)
        self.stmt(s.body, depth + 1)
        self.divisors.pop(s.var, None)
        self.emit(depth, "}")

    def vector_for(self, s: L.For, depth: int) -> None:
        """A vectorized loop of one store, `dst[g(v)] = value(v)`, in one vector access each
        side where alignment is proven (`_vector_access`: the offset `base + v` with `base`
        a proven multiple of the lanes, `L.divisor`, in a buffer that is aligned: a
        parameter or workspace, 256 bytes; shared, declared 16):

        - `value` a load `src[base + v]`: one `float4` (`float2`, ...) load, then the lanes;
        - `dst[base + v]` with `value` reading registers only (or the vector load): the
          lanes' values computed into one vector, stored with one `float4` (...) store;

        both at once when both hold (a register copy either way round, or a global copy);
        any other vectorized loop is unrolled, lane by lane."""
        load = _vector_load(s, self.divisors)
        store = _vector_store(s, self.divisors, load is not None)
        if load is None and store is None:
            self.unrolled_for(s, depth)
            return
        lanes = range(s.extent.value)
        at = [L.substitute(s.body, {s.var: L.const(lane, s.var.dtype)}) for lane in lanes]
        name = f"{c_name(s.var.name)}_vec"
        self.emit(depth, "{")
        if load is not None:
            ctype, base = load
            src = s.body.value.buffer
            self.emit(depth + 1, f"const {ctype} {name} = *reinterpret_cast<const {ctype}*>("
                                 f"&{self.address(src, (base,))});")
            values = [f"{name}.{'xyzw'[lane]}" for lane in lanes]
        else:
            values = [self.expr(x.value) for x in at]
        if store is not None:
            ctype, base = store
            self.emit(depth + 1, f"*reinterpret_cast<{ctype}*>(&"
                                 f"{self.address(s.body.buffer, (base,))}) = "
                                 f"{ctype}{{{', '.join(values)}}};")
        else:
            for x, value in zip(at, values):
                self.emit(depth + 1, f"{self.address(x.buffer, x.indices)} = {value};")
        self.emit(depth, "}")

    def if_(self, s: L.If, depth: int) -> None:
        self.emit(depth, f"if ({self.expr(s.cond)}) {{")
        self.stmt(s.then, depth + 1)
        if s.orelse is not None:
            self.emit(depth, "} else {")
            self.stmt(s.orelse, depth + 1)
        self.emit(depth, "}")

    def allocate(self, s: L.Allocate, depth: int) -> None:
        b = s.buffer
        storage = _STORAGE.get(b.scope)
        if storage is None:
            self.fail(f"GLOBAL scratch {b.name} must be allocated at the top of the function")
        shape = L.static_shape(b.shape)
        if shape is None:
            self.fail(f"{b.scope.value} buffer {b.name} has a symbolic shape")
        self.emit(depth, "{")
        if b.scope is L.Scope.SHARED and self.pool is not None:
            start = self.pool
            if start < self.pool_used:   # memory an ended buffer held: every thread past it
                self.emit(depth + 1, "__syncthreads();")
            self.emit(depth + 1, f"{C_TYPES[b.dtype]}* const {c_name(b.name)} = "
                                 f"reinterpret_cast<{C_TYPES[b.dtype]}*>({SHARED_POOL} + "
                                 f"{start});")
            self.pool += _shared_size(b, self.pool_align)
            self.pool_used = max(self.pool_used, self.pool)
            self.stmt(s.body, depth + 1)
            self.pool = start            # the buffer ends with its body: its memory is free
            self.emit(depth, "}")
            return
        align = "__align__(16) " if b.scope is L.Scope.SHARED else ""
        self.emit(depth + 1, f"{storage}{align}{C_TYPES[b.dtype]} {c_name(b.name)}"
                             f"[{max(1, math.prod(shape))}];")
        self.stmt(s.body, depth + 1)
        self.emit(depth, "}")

    def prefetch(self, s: L.Prefetch, depth: int) -> None:
        """Nothing: a CPU template's cache hint (`L.Prefetch` changes no value)."""

    def barrier(self, s: L.Barrier, depth: int) -> None:
        self.emit(depth, "__syncthreads();")

    def mma(self, s: L.Mma, depth: int) -> None:
        """`dnnc_mma_<precision>(&acc[offset], a..., b...)` (MMA_PRELUDE)."""
        args = ", ".join(self.expr(x) for x in s.a + s.b)
        self.emit(depth, f"dnnc_mma_{s.precision}(&{self.address(s.acc, (s.offset,))}, "
                         f"{args});")

    def ldmatrix(self, s: L.LdMatrix, depth: int) -> None:
        """`dnnc_ldmatrix_x<count>[_trans](&dst, &src)` (MMA_PRELUDE)."""
        self.emit(depth, f"dnnc_ldmatrix_x{s.count}{'_trans' if s.trans else ''}"
                         f"(&{self.load(s.dst)}, &{self.load(s.src)});")

    def copy_async(self, s: L.CopyAsync, depth: int) -> None:
        """`dnnc_cp_async(&dst, &src, bytes)` (MMA_PRELUDE)."""
        self.emit(depth, f"dnnc_cp_async(&{self.load(s.dst)}, &{self.load(s.src)}, "
                         f"(int)({self.expr(s.src_bytes)}));")

    def async_commit(self, s: L.AsyncCommit, depth: int) -> None:
        self.emit(depth, "dnnc_cp_async_commit();")

    def async_wait(self, s: L.AsyncWait, depth: int) -> None:
        self.emit(depth, f"dnnc_cp_async_wait<{s.pending}>();")

    def wgmma(self, s: L.Wgmma, depth: int) -> None:
        """`dnnc_wgmma_<precision>_n<n><A MN-major, B MN-major>(&acc, desc a, desc b)`
        (WGMMA_PRELUDE; a sparse precision's metadata register last), each descriptor
        `dnnc_wgmma_desc(&start, leading, stride)`."""
        if s.n not in WGMMA_N:
            self.fail(f"wgmma n={s.n}: the prelude has n in {WGMMA_N}")
        a, b = (f"dnnc_wgmma_desc(&{self.load(x)}, {lead}u, {stride}u)"
                for x, (lead, stride) in ((s.a, s.a_offsets), (s.b, s.b_offsets)))
        meta = "" if s.meta is None else f", {self.expr(s.meta)}"
        self.emit(depth, f"dnnc_wgmma_{s.precision}_n{s.n}<{int(s.a_mn_major)}, "
                         f"{int(s.b_mn_major)}>(&{self.load(s.acc)}, {a}, {b}{meta});")

    def wgmma_fence(self, s: L.WgmmaFence, depth: int) -> None:
        self.emit(depth, "dnnc_wgmma_fence();")

    def wgmma_commit(self, s: L.WgmmaCommit, depth: int) -> None:
        self.emit(depth, "dnnc_wgmma_commit();")

    def wgmma_wait(self, s: L.WgmmaWait, depth: int) -> None:
        self.emit(depth, f"dnnc_wgmma_wait<{s.pending}, {s.count}>(&{self.load(s.acc)});")

    def proxy_fence(self, s: L.ProxyFence, depth: int) -> None:
        self.emit(depth, "dnnc_fence_proxy_async();")

    def cluster_barrier(self, s: L.ClusterBarrier, depth: int) -> None:
        self.emit(depth, "dnnc_cluster_sync();")

    def mbarrier(self, s: L.Mbarrier, depth: int) -> None:
        """`dnnc_mbarrier_<op>(&bar[, value])` (WGMMA_PRELUDE; expect_tx TMA_PRELUDE's); an
        init in a stage with TMA copies fenced for the copy engine (`fence.mbarrier_init`)."""
        value = "" if s.value is None else f", (unsigned)({self.expr(s.value)})"
        self.emit(depth, f"dnnc_mbarrier_{s.op}(&{self.load(s.bar)}{value});")
        if s.op == "init" and self.tma:
            self.emit(depth, "dnnc_fence_mbarrier_init();")

    def tma_load(self, s: L.TmaLoad, depth: int) -> None:
        """`dnnc_tma_load_3d(&dst, map, &bar, x, y, z)` (TMA_PRELUDE), the map the kernel's
        argument of that name; from an im2col map `dnnc_tma_load_im2col_4d(&dst, map, &bar,
        c, w, h, n, dw, dh)`."""
        coords = ", ".join(f"(int)({self.expr(c)})" for c in (*s.coords, *s.offsets))
        copy = "dnnc_tma_load_im2col_4d" if s.map.im2col else "dnnc_tma_load_3d"
        self.emit(depth, f"{copy}(&{self.load(s.dst)}, {self.maps[s.map]}, "
                         f"&{self.load(s.bar)}, {coords});")

    # -- expressions (dispatched through _EXPR) ----------------------------------------------

    def expr(self, e: L.Expr) -> str:
        emit = _EXPR.get(type(e))
        if emit is None:
            self.fail(f"cannot render {e!r}")
        return emit(self, e)

    def address(self, buf: L.Buffer, indices) -> str:
        """`name[offset]`: after `linearize` every access has one index, its offset."""
        (offset,) = indices
        return f"{c_name(buf.name)}[{self.expr(offset)}]"

    def constant(self, e: L.Const) -> str:
        dtype = e.dtype
        if dtype.kind == "b":
            return "true" if e.value else "false"
        if dtype in (T.float16, T.bfloat16):
            bits = int(np.array(e.value, dtype.np).view(np.uint16))
            return f"((unsigned short){bits:#x})"
        if dtype.is_float:
            return _float_literal(e.value, dtype)
        return _int_literal(int(e.value), dtype)

    def var(self, e: L.Var) -> str:
        return c_name(e.name)

    def load(self, e: L.Load) -> str:
        return self.address(e.buffer, e.indices)

    def select(self, e: L.Select) -> str:
        return f"({self.expr(e.cond)} ? {self.expr(e.true)} : {self.expr(e.false)})"

    def binop(self, e: L.BinOp) -> str:
        bits = _byte_difference(e)
        if bits is not None:
            return f"({bits}({self.expr(e.a.value)}) - {bits}({self.expr(e.b.value)}))"
        key = (_class(e.a.dtype), e.op)
        emit = _BINARY.get(key)
        if isinstance(e.b, L.Const) and e.b.dtype.is_float and not math.isnan(e.b.value):
            emit = _BINARY_BY_NUMBER.get(key, emit)
        if emit is None:
            self.fail(f"no CUDA rendering for operator {e.op} on {e.a.dtype.name} "
                      f"(legalized?)")
        return emit(self.expr(e.a), self.expr(e.b), e.dtype)

    def call(self, e: L.Call) -> str:
        args = [self.expr(a) for a in e.args]
        src = e.args[0].dtype
        if e.name == "bitcast":
            if C_TYPES[src] == C_TYPES[e.dtype]:
                return args[0]
            emit = _BITCASTS.get((src, e.dtype))
            same_width = src.itemsize == e.dtype.itemsize
            if emit is None and same_width and (src.is_int or src in (T.float16, T.bfloat16)):
                emit = _convert   # integers of one width (and 16-bit float bits)
            if emit is None:
                self.fail(f"no CUDA bit cast from {src.name} to {e.dtype.name}")
            return emit(args[0], e.dtype)
        if e.name == "cluster_load":   # (WGMMA_PRELUDE) the element's place, not its value
            return f"dnnc_cluster_load(&{self.load(e.args[0])}, (unsigned)({args[1]}))"
        if e.name == "load_word":
            return self.load_word(e.args[0])
        if e.name == L.index_checks.CHECK:   # (PRELUDE)
            return f"dnnc_check_index({', '.join(args)}, {c_name(ERRORS.name)})"
        emit = _CALLS.get((_class(src), e.name))
        if emit is None:
            self.fail(f"no CUDA rendering for intrinsic {e.name} on {src.name} (legalized?)")
        return emit(*args, e.dtype)

    def load_word(self, at: L.Load) -> str:
        """`load_word(at)`: `dnnc_load_word(&at)` (PRELUDE) where the byte offset is a proven
        multiple of 4 (`L.divisor`; `at` a global element: a parameter or workspace, whose
        start is aligned), else its four bytes one at a time, the first lowest."""
        *lead, last = at.indices
        if not lead and L.divisor(last, self.divisors) % 4 == 0:
            return f"dnnc_load_word(&{self.load(at)})"
        return "(" + " | ".join(
            f"((unsigned)(unsigned char)({self.load(L.Load(at.buffer, (*lead, last + k)))})"
            f" << {8 * k})" for k in range(4)) + ")"

    def cast(self, e: L.Cast) -> str:
        src, dst = e.value.dtype, e.dtype
        value = self.expr(e.value)
        if src is dst:
            return value
        emit = _BF16_CASTS.get((src, dst)) if T.bfloat16 in (src, dst) else \
            _BYTE_CASTS.get((src, dst)) or _CASTS.get((_class(src), _class(dst)))
        if emit is None:
            self.fail(f"no CUDA cast from {src.name} to {dst.name} (legalized?)")
        return emit(value, dst)

    def reduce(self, e: L.Reduce) -> str:
        self.fail("Reduce must be lowered before codegen")


_STORAGE = {L.Scope.LOCAL: "", L.Scope.SHARED: "__shared__ "}
"""Scope of a nested Allocate -> its C declaration's qualifier (GLOBAL: the workspace)."""

_STMT: dict[type, Callable] = {
    L.Seq: _Emitter.seq, L.For: _Emitter.loop, L.Store: _Emitter.store, L.Let: _Emitter.let,
    L.If: _Emitter.if_, L.Allocate: _Emitter.allocate, L.Barrier: _Emitter.barrier,
    L.Mma: _Emitter.mma, L.LdMatrix: _Emitter.ldmatrix, L.CopyAsync: _Emitter.copy_async,
    L.AsyncCommit: _Emitter.async_commit, L.AsyncWait: _Emitter.async_wait,
    L.Wgmma: _Emitter.wgmma, L.WgmmaFence: _Emitter.wgmma_fence,
    L.WgmmaCommit: _Emitter.wgmma_commit, L.WgmmaWait: _Emitter.wgmma_wait,
    L.ProxyFence: _Emitter.proxy_fence, L.Prefetch: _Emitter.prefetch,
    L.ClusterBarrier: _Emitter.cluster_barrier, L.Mbarrier: _Emitter.mbarrier,
    L.TmaLoad: _Emitter.tma_load,
}
_LOOP: dict[L.ForKind, Callable] = {
    L.ForKind.SERIAL: _Emitter.serial_for, L.ForKind.PARALLEL: _Emitter.serial_for,
    L.ForKind.VECTORIZED: _Emitter.vector_for, L.ForKind.UNROLLED: _Emitter.unrolled_for,
    **{kind: _Emitter.gpu_for for kind in _AXES},
}
"""Loop kind -> emitter: a parallel loop runs serially within a thread (a GPU schedule binds
loops to blocks and threads instead); a vectorized one is a vector load where proven."""

_VECTOR_TYPES = {(T.float32, 2): "float2", (T.float32, 4): "float4", (T.int32, 2): "int2",
                 (T.int32, 4): "int4", (T.uint32, 2): "uint2", (T.uint32, 4): "uint4",
                 **{(dt, n): f"ushort{n}" for dt in (T.float16, T.bfloat16) for n in (2, 4)},
                 (T.int8, 4): "char4", (T.uint8, 4): "uchar4"}
"""(element type, lanes) -> the CUDA vector type a vectorized loop loads or stores (float16
and bfloat16 as their bits, `unsigned short`; int8 and uint8 four to a 32-bit access)."""


def _vector_load(s: L.For, divisors: dict) -> tuple[str, L.Expr] | None:
    """(vector type, base offset) when vectorized loop `s` is `dst[g(v)] = src[base + v]`
    with `src` and `base` aligned (`_vector_access`); else None."""
    body = s.body
    if not (isinstance(body, L.Store) and isinstance(body.value, L.Load)):
        return None
    return _vector_access(body.value.buffer, body.value.indices, s, divisors)


def _vector_store(s: L.For, divisors: dict, loaded: bool) -> tuple[str, L.Expr] | None:
    """(vector type, base offset) when vectorized loop `s` is `dst[base + v] = value(v)`
    with `dst` and `base` aligned (`_vector_access`) and `value` reading registers only
    (LOCAL buffers: no lane's store changes what another lane reads, so all lanes may be
    computed before the one store) or being the loop's vector load (`loaded`); else None."""
    body = s.body
    if not isinstance(body, L.Store) or not loaded and any(
            isinstance(n, L.Load) and n.buffer.scope is not L.Scope.LOCAL
            for n in L.walk(body.value)):
        return None
    return _vector_access(body.buffer, body.indices, s, divisors)


def _vector_access(buffer: L.Buffer, indices: tuple, s: L.For, divisors: dict
                   ) -> tuple[str, L.Expr] | None:
    """(vector type, base offset) when `buffer[indices]` over the lanes of vectorized loop
    `s` is `buffer[base + v]`, `buffer` is aligned (not LOCAL: registers have no address
    worth a vector access) and `base` a proven multiple of the lanes; else None."""
    lanes = s.extent
    if not isinstance(lanes, L.Const):
        return None
    ctype = _VECTOR_TYPES.get((buffer.dtype, lanes.value))
    if ctype is None or buffer.scope is L.Scope.LOCAL:
        return None
    (index,) = indices
    if not _plus_lane(index, s.var):
        return None
    base = L.substitute(index, {s.var: L.const(0, s.var.dtype)})
    return (ctype, base) if L.divisor(base, divisors) % lanes.value == 0 else None


def _plus_lane(e: L.Expr, v: L.Var) -> bool:
    """Whether `e` is (something free of v) + v, through integer casts and sums."""
    if e == v:
        return True
    if isinstance(e, L.Cast) and e.dtype.is_int and e.value.dtype.is_int:
        return _plus_lane(e.value, v)
    if isinstance(e, L.BinOp) and e.op == "+":
        a_has, b_has = (v in L.free_vars(x) for x in (e.a, e.b))
        return (a_has != b_has) and _plus_lane(e.a if a_has else e.b, v)
    return False


_EXPR: dict[type, Callable] = {
    L.Const: _Emitter.constant, L.Var: _Emitter.var, L.Load: _Emitter.load,
    L.BinOp: _Emitter.binop, L.Call: _Emitter.call, L.Cast: _Emitter.cast,
    L.Select: _Emitter.select, L.Reduce: _Emitter.reduce,
}
