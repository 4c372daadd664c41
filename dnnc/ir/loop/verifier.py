"""The operator IR's invariants, checked by `verify(func)`: scoping of vars and buffers, index
arity and dtypes, and GPU placement rules (block/thread loops, shared memory, barriers, warp
shuffles).

A failure raises `LoopIRError`: a compiler bug, not a user error. It must never modify a
function nor accept one a backend could not render.
"""

from __future__ import annotations

import math

from .. import types as T
from .nodes import (
    INTEGER_MMA, LDMATRIX_COUNTS, MMA_REGISTERS, MMA_SHAPES, PACKS, SHUFFLES, SPARSE_MMA,
    SPARSE_MMA_REGISTERS, TILE_PRECISIONS,
    TILE_REGISTERS, Allocate, AsyncCommit, AsyncWait, Barrier, BinOp, Call, ClusterBarrier, Const,
    CopyAsync, IM2COL_RANK,
    For, If, LdMatrix, Let, Load, MBARRIER_OPS, Mbarrier, Mma, Prefetch, PrimFunc, ProxyFence,
    Reduce, Scope, Select, Seq, Store, TILE_ROWS, TMA_RANK, TileProduct, TmaLoad, Var, WGMMA_K, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait)
from .printer import print_expr
from .traversal import walk


class LoopIRError(Exception):
    """A PrimFunc breaks an invariant of the operator IR (a compiler bug, not a user error)."""


def verify(func: PrimFunc, placement: bool = True) -> None:
    """Check scoping of vars and buffers, index arity, dtypes, and (with `placement`) GPU
    placement rules. The backends verify before rendering without `placement`: each renderer
    places GPU loops, shared memory and barriers by its own rules and refuses what it cannot."""
    params = {b.name: b for b in func.params}
    if len(params) != len(func.params):
        raise LoopIRError(f"{func.name}: duplicate parameter names")
    scope_vars = set(func.size_vars)
    for b in func.params:
        if b.scope is not Scope.GLOBAL:
            raise LoopIRError(f"{func.name}: parameter {b.name} must be in global scope")
        _check_expr_vars(func, b.shape, scope_vars)
    _verify_stmt(func, func.body, scope_vars, dict(params), set(), placement)


def _check_expr_vars(func, exprs, scope_vars) -> None:
    for e in exprs:
        for n in walk(e):
            if isinstance(n, Reduce):
                raise LoopIRError(f"{func.name}: Reduce must be lowered before a PrimFunc")
            if isinstance(n, Var) and n not in scope_vars:
                raise LoopIRError(f"{func.name}: variable {n.name} used out of scope")
            if isinstance(n, BinOp):
                if n.a.dtype is not n.b.dtype:
                    raise LoopIRError(f"{func.name}: {print_expr(n)} mixes dtypes "
                                      f"{n.a.dtype.name} and {n.b.dtype.name}")
            if isinstance(n, Select) and n.true.dtype is not n.false.dtype:
                raise LoopIRError(f"{func.name}: {print_expr(n)} mixes dtypes")


def _check_access(func, buffer, indices, buffers) -> None:
    known = buffers.get(buffer.name)
    if known is None:
        raise LoopIRError(f"{func.name}: buffer {buffer.name} is neither a parameter nor "
                          f"allocated here")
    if known != buffer and not _is_view(known, buffer):
        raise LoopIRError(f"{func.name}: buffer {buffer.name} accessed with another type")
    if len(indices) != len(buffer.shape):
        raise LoopIRError(f"{func.name}: {buffer.name} has rank {len(buffer.shape)}, "
                          f"accessed with {len(indices)} indices")
    for i in indices:
        if not i.dtype.is_int:
            raise LoopIRError(f"{func.name}: index {print_expr(i)} of {buffer.name} is not "
                              f"an integer")


def _is_view(known, buffer) -> bool:
    """`buffer` reads `known`'s memory in another shape: same dtype, scope and element count
    (a 1x1 convolution's [n, c, h * w] view of an [n, c, h, w] tensor). Symbolic dims must
    match as a multiset, constant dims by their product."""
    def size(b):
        dims = [d.value if isinstance(d, Const) else d for d in b.shape]
        fixed = [d for d in dims if isinstance(d, int)]
        return math.prod(fixed), sorted(repr(d) for d in dims if not isinstance(d, int))

    return known.dtype is buffer.dtype and known.scope is buffer.scope and \
        size(known) == size(buffer)


def _check_shuffle(func, call: Call, gpu: set) -> None:
    """A warp shuffle runs on a GPU's threads, from a constant lane offset below 32."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: {call.name} outside a threadIdx.x loop")
    if len(call.args) != 2 or call.dtype is not call.args[0].dtype:
        raise LoopIRError(f"{func.name}: {print_expr(call)} is not {call.name}(value, lanes)")
    lanes = call.args[1]
    if not (isinstance(lanes, Const) and lanes.dtype.is_int and 0 <= lanes.value < 32):
        raise LoopIRError(f"{func.name}: {print_expr(call)}: the lane offset must be a "
                          f"constant in [0, 32)")


def _check_cluster_load(func, call: Call, gpu: set) -> None:
    """A cluster load runs on a GPU's threads and reads a shared float32 element of a block of
    the cluster, given by its rank."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: cluster_load outside a threadIdx.x loop")
    if len(call.args) != 2 or not _is_place(call.args[0], Scope.SHARED, T.float32) or \
            call.dtype is not T.float32 or not call.args[1].dtype.is_int:
        raise LoopIRError(f"{func.name}: {print_expr(call)} is not cluster_load(a shared "
                          f"float32 element, an integer rank) giving float32")


def _check_load_word(func, call: Call) -> None:
    """A word load reads the place of a global element of one byte, giving uint32."""
    if len(call.args) != 1 or not isinstance(call.args[0], Load) or \
            call.args[0].buffer.scope is not Scope.GLOBAL or \
            call.args[0].dtype.itemsize != 1 or call.dtype is not T.uint32:
        raise LoopIRError(f"{func.name}: {print_expr(call)} is not load_word(a global "
                          f"element of one byte) giving uint32")


def _check_dot_bf16x2(func, call: Call) -> None:
    """A bf16 pair product: a float32 accumulator and two uint32 words of bf16 pairs."""
    types = tuple(a.dtype for a in call.args)
    if types != (T.float32, T.uint32, T.uint32) or call.dtype is not T.float32:
        raise LoopIRError(f"{func.name}: {print_expr(call)} is not dot_bf16x2(float32 acc, "
                          f"uint32 a, uint32 b) giving float32")


def _check_pack(func, call: Call) -> None:
    """A pack makes a uint32 register of float32 values: one for tf32, two for the others."""
    arity = 1 if call.name == PACKS["tf32"] else 2
    if len(call.args) != arity or call.dtype is not T.uint32 or \
            any(a.dtype is not T.float32 for a in call.args):
        raise LoopIRError(f"{func.name}: {print_expr(call)} is not {call.name} of {arity} "
                          f"float32 value(s) giving uint32")


def _check_mma(func, s: Mma, gpu: set, buffers) -> None:
    """A tensor-core product runs on a GPU's threads, with a known precision, 4 + 2 uint32
    operand registers and fp32 registers of the thread as accumulators (int32 for the
    integer precisions)."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: mma outside a threadIdx.x loop")
    if s.precision not in MMA_SHAPES:
        raise LoopIRError(f"{func.name}: mma of unknown precision {s.precision!r} (one of "
                          f"{', '.join(MMA_SHAPES)})")
    registers = SPARSE_MMA_REGISTERS if s.precision in SPARSE_MMA else MMA_REGISTERS
    if (len(s.a), len(s.b)) != registers:
        raise LoopIRError(f"{func.name}: mma takes {registers} A and B registers a lane, "
                          f"not {(len(s.a), len(s.b))}")
    if any(x.dtype is not T.uint32 for x in s.a + s.b):
        made_by = PACKS.get(SPARSE_MMA.get(s.precision, s.precision), "packing bytes")
        raise LoopIRError(f"{func.name}: mma operands are uint32 registers (made by "
                          f"{made_by})")
    acc = T.int32 if s.precision in INTEGER_MMA else T.float32
    if s.acc.scope is not Scope.LOCAL or s.acc.dtype is not acc or \
            len(s.acc.shape) != 1 or not s.offset.dtype.is_int:
        raise LoopIRError(f"{func.name}: mma accumulates into a 1-d local {acc.name} buffer at "
                          f"an integer offset, not {s.acc.name}")
    _check_access(func, s.acc, (s.offset,), buffers)


def _check_ldmatrix(func, s: LdMatrix, gpu: set) -> None:
    """A warp's load of fragments: on a GPU's threads, from shared uint32 words into local
    uint32 registers, 1, 2 or 4 matrices."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: ldmatrix outside a threadIdx.x loop")
    if s.count not in LDMATRIX_COUNTS:
        raise LoopIRError(f"{func.name}: ldmatrix of {s.count} matrices (one of "
                          f"{LDMATRIX_COUNTS})")
    if not (isinstance(s.dst, Load) and s.dst.buffer.scope is Scope.LOCAL and
            isinstance(s.src, Load) and s.src.buffer.scope is Scope.SHARED and
            s.dst.dtype is T.uint32 and s.src.dtype is T.uint32):
        raise LoopIRError(f"{func.name}: ldmatrix loads shared uint32 words into local uint32 "
                          f"registers")


def _check_copy_async(func, s: CopyAsync, gpu: set) -> None:
    """An asynchronous copy: on a GPU's threads, global to shared, an integer byte count."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: cp.async outside a threadIdx.x loop")
    if not (isinstance(s.dst, Load) and s.dst.buffer.scope is Scope.SHARED and
            isinstance(s.src, Load) and s.src.buffer.scope is Scope.GLOBAL and
            s.src_bytes.dtype.is_int):
        raise LoopIRError(f"{func.name}: cp.async copies global memory to shared memory, "
                          f"an integer count of bytes")


def _is_place(x, scope: Scope, dtype) -> bool:
    return isinstance(x, Load) and x.buffer.scope is scope and x.dtype is dtype


def _check_wgmma(func, s: Wgmma, gpu: set) -> None:
    """A warpgroup's product: on a GPU's threads, a known precision (tf32, s8, u8 K-major
    only; a sparse one's A K-major, with its uint32 metadata), n a multiple of 8 up to 256,
    fp32 (s8, u8: int32) registers from shared uint32 words laid out at 16-byte offsets the
    descriptor can hold."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: wgmma outside a threadIdx.x loop")
    k_major = s.precision == "tf32" or s.precision in INTEGER_MMA
    if s.precision not in WGMMA_K or k_major and (s.a_mn_major or s.b_mn_major) or \
            s.precision in SPARSE_MMA and s.a_mn_major:
        raise LoopIRError(f"{func.name}: wgmma of precision {s.precision!r} (one of "
                          f"{', '.join(WGMMA_K)}; tf32 K-major only, s8 and u8 too, the "
                          f"sparse ones' A too) with these majors")
    if (s.meta is None) != (s.precision not in SPARSE_MMA) or \
            s.meta is not None and s.meta.dtype is not T.uint32:
        raise LoopIRError(f"{func.name}: a sparse wgmma (and only one) takes a uint32 "
                          f"metadata register")
    if s.n % 8 or not 8 <= s.n <= 256:
        raise LoopIRError(f"{func.name}: wgmma n={s.n} (a multiple of 8 up to 256)")
    acc = T.int32 if s.precision in INTEGER_MMA else T.float32
    if not (_is_place(s.acc, Scope.LOCAL, acc) and _is_place(s.a, Scope.SHARED, T.uint32)
            and _is_place(s.b, Scope.SHARED, T.uint32)):
        raise LoopIRError(f"{func.name}: wgmma reads shared uint32 words into local "
                          f"{acc.name} registers")
    if any(x % 16 or not 0 <= x < 1 << 18 for x in s.a_offsets + s.b_offsets):
        raise LoopIRError(f"{func.name}: wgmma layout offsets {s.a_offsets}, {s.b_offsets} "
                          f"are not 16-byte multiples below 256 KiB")


def _check_mbarrier(func, s: Mbarrier, gpu: set) -> None:
    """A barrier object's operation: on a GPU's threads, a shared uint64 object, a constant
    count to init, an integer parity to wait on, nothing to arrive with."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: mbarrier outside a threadIdx.x loop")
    if s.op not in MBARRIER_OPS or not _is_place(s.bar, Scope.SHARED, T.uint64):
        raise LoopIRError(f"{func.name}: mbarrier {s.op!r} (one of {MBARRIER_OPS}) on a "
                          f"shared uint64 object")
    takes = {"init": "a positive integer constant", "wait": "an integer parity",
             "expect_tx": "an integer count of bytes"}.get(s.op)
    if s.op == "init":
        fits = isinstance(s.value, Const) and s.value.dtype.is_int and \
            0 < s.value.value < 1 << 20
    elif s.op in ("wait", "expect_tx"):
        fits = s.value is not None and s.value.dtype.is_int
    else:
        fits = s.value is None
    if not fits:
        raise LoopIRError(f"{func.name}: mbarrier {s.op} takes {takes or 'no value'}")


SWIZZLE_ROW = 128
"""Bytes of a `TmaLoad` box's innermost row (the 128-byte swizzle's span)."""


def _check_tma_load(func, s: TmaLoad, gpu: set) -> None:
    """A bulk tensor copy: on a GPU's threads, into shared uint32 words on a shared uint64
    barrier, from a map of a global parameter of rank `TMA_RANK` whose boxes' rows are one
    128-byte swizzle row, at most 256 a dimension, strides multiples of 16 bytes, one integer
    coordinate a dimension; from an im2col map (`TensorMap.im2col`) of rank IM2COL_RANK, a box
    of (channels, pixels), a lower corner, upper corner and traversal stride (1 to 8) a
    spatial dimension, and an offset a spatial dimension."""
    if "threadIdx.x" not in gpu:
        raise LoopIRError(f"{func.name}: TMA copy outside a threadIdx.x loop")
    if not (_is_place(s.dst, Scope.SHARED, T.uint32) and
            _is_place(s.bar, Scope.SHARED, T.uint64)):
        raise LoopIRError(f"{func.name}: a TMA copy lands in shared uint32 words, counted "
                          f"on a shared uint64 barrier")
    m = s.map
    if m.tensor.scope is not Scope.GLOBAL or m.tensor.name not in {b.name for b in func.params}:
        raise LoopIRError(f"{func.name}: a tensor map describes a parameter, not "
                          f"{m.tensor.name}")
    rank = IM2COL_RANK if m.im2col else TMA_RANK
    spatial = rank - 2
    boxed = 2 if m.im2col else rank
    if m.im2col and not (len(m.im2col) == 3 * spatial and len(s.offsets) == spatial and
                         all(1 <= x <= 8 for x in m.im2col[2 * spatial:]) and
                         all(x.dtype.is_int for x in s.offsets)) or \
            not m.im2col and s.offsets:
        raise LoopIRError(f"{func.name}: tensor map of {m.tensor.name}: im2col {m.im2col} "
                          f"with {len(s.offsets)} offsets (an im2col map's corners and "
                          f"strides, 1 to 8, and an offset a spatial dimension)")
    if not (len(m.extents) == len(s.coords) == rank and len(m.box) == boxed and
            len(m.strides) == rank - 1 and all(x > 0 for x in m.extents) and
            all(1 <= b <= 256 for b in m.box) and all(x > 0 and x % 16 == 0 for x in m.strides)
            and m.box[0] * m.tensor.dtype.itemsize == SWIZZLE_ROW and
            all(c.dtype.is_int for c in s.coords)):
        raise LoopIRError(f"{func.name}: tensor map of {m.tensor.name} (extents {m.extents}, "
                          f"strides {m.strides}, box {m.box}, at {len(s.coords)} coordinates): "
                          f"rank {rank}, box rows of {SWIZZLE_ROW} bytes, at most 256 a "
                          f"dimension, strides multiples of 16 bytes")


def _check_tile_product(func, s: TileProduct, gpu: set) -> None:
    """A tile unit's product: on a CPU (outside the GPU loops), a known precision, C's places
    of its accumulator type, uint32 operands, at most `TILE_REGISTERS` tiles at once, a step
    at least (whole or the tail's, of fewer than 16 words), and positive strides (rows of 16 elements never overlapping)."""
    if gpu:
        raise LoopIRError(f"{func.name}: tile product inside the GPU loops")
    acc = TILE_PRECISIONS.get(s.precision)
    if acc is None:
        raise LoopIRError(f"{func.name}: tile product of unknown precision {s.precision!r} "
                          f"(one of {', '.join(TILE_PRECISIONS)})")
    if not (isinstance(s.c, Load) and s.c.dtype is acc and isinstance(s.a, Load) and
            s.a.dtype is T.uint32 and isinstance(s.b, Load) and s.b.dtype is T.uint32):
        raise LoopIRError(f"{func.name}: a {s.precision} tile product accumulates into "
                          f"{acc.name} places from uint32 words")
    if not s.runs or any(len(r) != 2 or min(r) < 0 for r in s.runs):
        raise LoopIRError(f"{func.name}: tile product runs {s.runs} (one at least, of "
                          f"offsets (A, B) at least 0)")
    if min(s.m_tiles, s.n_tiles, s.steps + (s.tail > 0)) < 1 or s.steps < 0 or \
            s.registers > TILE_REGISTERS or not 0 <= s.tail < TILE_ROWS:
        raise LoopIRError(f"{func.name}: tile product of {s.m_tiles} x {s.n_tiles} tiles "
                          f"({s.registers} registers of {TILE_REGISTERS}), {s.steps} steps, a "
                          f"last step of {s.tail} words (0 to {TILE_ROWS - 1})")
    if s.c_row < 16 or s.a_layout[0] < 16 or s.b_layout[0] < 16 or \
            min(s.a_layout + s.b_layout) < 0:
        raise LoopIRError(f"{func.name}: tile product strides {s.c_row}, {s.a_layout}, "
                          f"{s.b_layout} (rows of 16 words at least apart)")


def _verify_stmt(func, s, scope_vars, buffers, gpu: set, placement: bool) -> None:
    def exprs(*es):
        _check_expr_vars(func, es, scope_vars)
        for e in es:
            for n in walk(e):
                if isinstance(n, Load):
                    _check_access(func, n.buffer, n.indices, buffers)
                elif isinstance(n, Call) and n.name in SHUFFLES:
                    if placement:
                        _check_shuffle(func, n, gpu)
                elif isinstance(n, Call) and n.name in PACKS.values():
                    _check_pack(func, n)
                elif isinstance(n, Call) and n.name == "dot_bf16x2":
                    _check_dot_bf16x2(func, n)
                elif isinstance(n, Call) and n.name == "cluster_load" and placement:
                    _check_cluster_load(func, n, gpu)
                elif isinstance(n, Call) and n.name == "load_word":
                    _check_load_word(func, n)

    if isinstance(s, For):
        exprs(s.extent)
        if s.var in scope_vars:
            raise LoopIRError(f"{func.name}: loop variable {s.var.name} rebinds a name")
        inner_gpu = gpu
        if s.kind.is_gpu_block or s.kind.is_gpu_thread:
            if placement and s.kind.value in gpu:
                raise LoopIRError(f"{func.name}: {s.kind.value} bound twice")
            if placement and s.kind.is_gpu_block and any(k.startswith("threadIdx") for k in gpu):
                raise LoopIRError(f"{func.name}: {s.kind.value} inside a thread loop")
            inner_gpu = gpu | {s.kind.value}
        _verify_stmt(func, s.body, scope_vars | {s.var}, buffers, inner_gpu, placement)
    elif isinstance(s, Store):
        exprs(*s.indices, s.value)
        _check_access(func, s.buffer, s.indices, buffers)
        if s.value.dtype is not s.buffer.dtype:
            raise LoopIRError(f"{func.name}: storing {s.value.dtype.name} into "
                              f"{s.buffer.dtype.name} buffer {s.buffer.name}")
    elif isinstance(s, Let):
        exprs(s.value)
        if s.var.dtype is not s.value.dtype:
            raise LoopIRError(f"{func.name}: let {s.var.name} has the wrong dtype")
        _verify_stmt(func, s.body, scope_vars | {s.var}, buffers, gpu, placement)
    elif isinstance(s, If):
        exprs(s.cond)
        if s.cond.dtype.kind != "b":
            raise LoopIRError(f"{func.name}: condition {print_expr(s.cond)} is not bool")
        _verify_stmt(func, s.then, scope_vars, buffers, gpu, placement)
        if s.orelse is not None:
            _verify_stmt(func, s.orelse, scope_vars, buffers, gpu, placement)
    elif isinstance(s, Allocate):
        b = s.buffer
        if b.name in buffers:
            raise LoopIRError(f"{func.name}: buffer {b.name} allocated twice")
        if placement and b.scope is Scope.SHARED and \
                not any(k.startswith("blockIdx") for k in gpu):
            raise LoopIRError(f"{func.name}: shared buffer {b.name} outside a GPU block loop")
        _check_expr_vars(func, b.shape, scope_vars)
        _verify_stmt(func, s.body, scope_vars, {**buffers, b.name: b}, gpu, placement)
    elif isinstance(s, Seq):
        for x in s.stmts:
            _verify_stmt(func, x, scope_vars, buffers, gpu, placement)
    elif isinstance(s, Mma):
        _check_mma(func, s, gpu if placement else {"threadIdx.x"}, buffers)
        exprs(s.offset, *s.a, *s.b)
    elif isinstance(s, LdMatrix):
        _check_ldmatrix(func, s, gpu if placement else {"threadIdx.x"})
        exprs(s.dst, s.src)
    elif isinstance(s, Prefetch):
        exprs(s.at)
    elif isinstance(s, CopyAsync):
        _check_copy_async(func, s, gpu if placement else {"threadIdx.x"})
        exprs(s.dst, s.src, s.src_bytes)
    elif isinstance(s, Wgmma):
        _check_wgmma(func, s, gpu if placement else {"threadIdx.x"})
        exprs(s.acc, s.a, s.b)
    elif isinstance(s, TileProduct):
        _check_tile_product(func, s, gpu if placement else set())
        exprs(s.c, s.a, s.b)
    elif isinstance(s, WgmmaWait):
        if s.pending < 0 or s.count < 0 or not (_is_place(s.acc, Scope.LOCAL, T.float32) or
                                                 _is_place(s.acc, Scope.LOCAL, T.int32)):
            raise LoopIRError(f"{func.name}: wgmma wait for {s.pending} groups, {s.count} "
                              f"local float32 (int32) registers")
        exprs(s.acc)
    elif isinstance(s, Mbarrier):
        _check_mbarrier(func, s, gpu if placement else {"threadIdx.x"})
        exprs(s.bar, *(() if s.value is None else (s.value,)))
    elif isinstance(s, TmaLoad):
        _check_tma_load(func, s, gpu if placement else {"threadIdx.x"})
        exprs(s.dst, s.bar, *s.coords, *s.offsets)
    elif isinstance(s, AsyncWait):
        if s.pending < 0:
            raise LoopIRError(f"{func.name}: cp.async wait for {s.pending} groups")
    elif isinstance(s, (Barrier, AsyncCommit, WgmmaFence, WgmmaCommit, ProxyFence,
                        ClusterBarrier)):
        if isinstance(s, ClusterBarrier) and not 2 <= s.size <= 8:
            raise LoopIRError(f"{func.name}: a cluster of {s.size} blocks (2 to 8)")
        # inside a thread loop, or between the thread loops of one block (its threads' phases)
        if placement and not gpu:
            raise LoopIRError(f"{func.name}: barrier outside the GPU loops")
    else:
        raise LoopIRError(f"{func.name}: not a statement: {s!r}")
