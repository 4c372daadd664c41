"""Operator-IR nodes: expressions, statements, buffers and `PrimFunc`, with their constructors.

Expressions (`Var`, `Const`, `BinOp`, `Call`, `Cast`, `Select`, `Load`, `Reduce`) and statements
(`For`, `Store`, `Let`, `If`, `Allocate`, `Seq`, `Prefetch`, `Barrier`, `Mma`, `LdMatrix`,
`CopyAsync`, `AsyncCommit`, `AsyncWait`, `Wgmma`, `WgmmaFence`, `WgmmaCommit`, `WgmmaWait`, `ProxyFence`,
`ClusterBarrier`) are immutable dataclasses, so `==`
is structural equality and nodes hash. Arithmetic operators build expressions (`i * 4 + j`);
comparisons other than `==`/`!=` do too (`i < n`); use `eq(a, b)` / `ne(a, b)` for those two.

`Reduce` appears only in op `compute` rules (an output element as a reduction over reduce axes);
lowering turns it into loops. A `For` names how it runs: serial, parallel (CPU cores),
vectorized, unrolled, or bound to a GPU axis (blockIdx.x, threadIdx.y, ...); an `Allocate` names
its memory scope (global, shared, local).

Some statements are not target-neutral: `Mma`, a warp's tensor-core multiply-accumulate, whose
operand and accumulator layout is PTX's fragment layout (`mma.sync`), `LdMatrix`, a warp's
load of such fragments from shared memory (`ldmatrix`), and `CopyAsync` / `AsyncCommit` /
`AsyncWait`, copies from global to shared memory that complete later (`cp.async`), and
`Wgmma` with its fence, groups and wait, a warpgroup's asynchronous product of operands in
shared memory (sm_90a's `wgmma.mma_async`), with `ProxyFence`, and `ClusterBarrier`, the
barrier of a cluster of blocks whose shared memory its blocks read (`cluster_load`). Only a GPU
renderer that has warps and tensor cores renders them (the cuda one; llvm's refuses them as
GPU-only, and only the cuda tensor-core templates emit them). They live here, not in a
backend, because the shared traversals (printer, verifier, simplifier, the loop analyses)
must see them as statements like the others; their docstrings state their meaning exactly.
`LdMatrix`, `CopyAsync` and `Wgmma` name their addresses as `Load`s of the element there (a place,
not a value), so every pass that rewrites accesses rewrites them.

This module only defines the nodes: it never traverses, prints, verifies or rewrites them
(see `traversal`, `printer`, `verifier`, `simplifier`), and knows nothing of graphs, ONNX or any
backend beyond `Mma`'s fragment layout.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .. import types as T

INDEX = T.int64
"""The dtype of loop variables and index arithmetic."""


# ---------------------------------------------------------------------------------------------
# Expressions


class Expr:
    """Base of all expressions; arithmetic operators build `BinOp`s."""

    dtype: T.DType

    def __add__(self, o):
        return BinOp("+", self, const(o, self.dtype))

    def __radd__(self, o):
        return BinOp("+", const(o, self.dtype), self)

    def __sub__(self, o):
        return BinOp("-", self, const(o, self.dtype))

    def __rsub__(self, o):
        return BinOp("-", const(o, self.dtype), self)

    def __mul__(self, o):
        return BinOp("*", self, const(o, self.dtype))

    def __rmul__(self, o):
        return BinOp("*", const(o, self.dtype), self)

    def __truediv__(self, o):
        return BinOp("/", self, const(o, self.dtype))

    def __floordiv__(self, o):
        return BinOp("//", self, const(o, self.dtype))

    def __mod__(self, o):
        return BinOp("%", self, const(o, self.dtype))

    def __neg__(self):
        return BinOp("-", Const(0, self.dtype), self)

    def __lt__(self, o):
        return BinOp("<", self, const(o, self.dtype))

    def __le__(self, o):
        return BinOp("<=", self, const(o, self.dtype))

    def __gt__(self, o):
        return BinOp(">", self, const(o, self.dtype))

    def __ge__(self, o):
        return BinOp(">=", self, const(o, self.dtype))


@dataclass(frozen=True, eq=True)
class Var(Expr):
    """A loop variable, a let-bound name, or a symbolic size (a graph's symbolic dim)."""

    name: str
    dtype: T.DType = INDEX

    def __hash__(self):
        return hash(("Var", self.name))


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: int | float | bool
    dtype: T.DType = INDEX

    def __hash__(self):
        return hash(("Const", self.value, self.dtype.name))


ARITH = ("+", "-", "*", "/", "//", "%", "min", "max")
COMPARE = ("==", "!=", "<", "<=", ">", ">=")
LOGIC = ("and", "or")
BITWISE = ("&", "|", "^", "<<", ">>")


@dataclass(frozen=True, eq=True)
class BinOp(Expr):
    """On integers `//` and `%` are floor division and its modulo (Python's) and `/` divides
    truncating toward zero (C's); none traps: by 0 each gives 0, and MIN divided by -1 gives
    MIN (the quotient wraps; the remainder is 0). On floats `/` is true division, `//`
    floor(a / b) and `%` fmod. Comparisons and logic ops have dtype bool."""

    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> T.DType:
        return T.bool_ if self.op in COMPARE or self.op in LOGIC else self.a.dtype

    def __hash__(self):
        return hash(("BinOp", self.op, self.a, self.b))


INTRINSICS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "floor", "ceil",
              "round", "trunc", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
              "asinh", "acosh", "atanh", "pow", "fmod", "isnan", "isinf", "not", "neg",
              "log1p", "expm1", "sign", "atan2", "fma", "bitcast", "shfl_xor", "shfl_down",
              "pack_tf32", "pack_fp16x2", "pack_bf16x2", "check_index", "dot_bf16x2",
              "dot_u8s8x4", "pack_u8x4", "cluster_load", "load_word")
"""`fma(a, b, c)` is a*b + c, fused where the target has it (kernels' inner products);
`dot_bf16x2(acc, a, b)` is acc + hi(a) hi(b) + lo(a) lo(b) in float32, where lo(x) and hi(x)
are the bfloat16 numbers in bits 0-15 and 16-31 of the uint32 x: the high pair's product
added first, each product exact and each sum rounded to nearest even (AVX512_BF16's
`vdpbf16ps` on one lane, whose denormal operands and results are zeros; a CPU's bf16 products);
`dot_u8s8x4(acc, a, b)` is int32 acc plus the four products of the unsigned bytes of uint32 a
and the signed bytes of uint32 b, exact (AVX-512 VNNI / AVX-VNNI `vpdpbusd` on one lane);
`pack_u8x4(b0, b1, b2, b3)` is the uint32 whose byte t (bits 8t to 8t + 7) is the uint8 bt
(vpdpbusd's operand of four bytes from four places: a window of a row of bytes);
`check_index(i, n, site)` is i, checked to lie in [-n, n-1] at run time (`index_checks`);
`bitcast(x, dtype=T)` reinterprets x's bits as the same-width type T; the shuffles are a
GPU warp's (`SHUFFLES`); the packs make tensor-core operand registers (`PACKS`);
`cluster_load(x, rank)` (GPU-only, sm_90) is the value the shared float32 element `x` (a
`Load`: a place, never evaluated here) holds in the shared memory of block `rank` of this
block's cluster (`ClusterBarrier`), read between two cluster barriers;
`load_word(x)` (GPU-only) is the uint32 whose bytes, lowest first, are the 1-byte global
element `x` (a `Load`: a place, never evaluated here) and the three after it, read (where
the renderer proves x's offset a multiple of 4) as one load that stays where it is issued
(through L2, not the read-only path: the GPU's assembler moves a read-only load down to its
first use, past barriers; staged.py's loads ahead of a k loop)."""

PACKS = {"tf32": "pack_tf32", "fp16": "pack_fp16x2", "bf16": "pack_bf16x2"}
"""Precision -> the intrinsic making an `Mma` operand register (uint32, PTX's .b32) from
float32 values, GPU-only: `pack_tf32(x)` is x rounded to tf32 (to nearest, ties away from
zero: PTX's cvt.rna.tf32.f32), its float32 bits; `pack_fp16x2(lo, hi)` and
`pack_bf16x2(lo, hi)` are lo and hi rounded to nearest even, lo in bits 0-15 and hi in bits
16-31 (cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32). CPU backends do not render them."""

SHUFFLES = ("shfl_xor", "shfl_down")
"""Warp shuffles, GPU-only: `shfl_xor(x, m)` is the value `x` has in the lane (this lane xor
m) of the same warp of 32 threads; `shfl_down(x, d)` the value in lane (this lane + d), or
this lane's own `x` when that is past lane 31 (CUDA's `__shfl_xor_sync` /
`__shfl_down_sync` over the full warp). `m` and `d` are int32 constants below 32. Every lane
of the warp must evaluate the shuffle together (the threadIdx.x loop holding it covers whole
warps, and any condition around it is the same for all 32 lanes): a reduction across a warp
without shared memory or a barrier. CPU backends do not render them."""


@dataclass(frozen=True, eq=True)
class Call(Expr):
    """An intrinsic (`exp`, `tanh`, `erf`, `sqrt`, ...) applied to arguments."""

    name: str
    args: tuple[Expr, ...]
    dtype: T.DType

    def __hash__(self):
        return hash(("Call", self.name, self.args))


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    dtype: T.DType
    value: Expr

    def __hash__(self):
        return hash(("Cast", self.dtype.name, self.value))


@dataclass(frozen=True, eq=True)
class Select(Expr):
    cond: Expr
    true: Expr
    false: Expr

    @property
    def dtype(self) -> T.DType:
        return self.true.dtype

    def __hash__(self):
        return hash(("Select", self.cond, self.true, self.false))


class Scope(str, enum.Enum):
    GLOBAL = "global"
    SHARED = "shared"   # per GPU block
    LOCAL = "local"     # per thread / registers


@dataclass(frozen=True, eq=True)
class Buffer:
    """A named n-d array in a memory scope; row-major over `shape` (ints or size Vars)."""

    name: str
    dtype: T.DType
    shape: tuple[Expr, ...]
    scope: Scope = Scope.GLOBAL

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(const(d) if isinstance(d, int) else d
                                                for d in self.shape))

    def __getitem__(self, indices) -> "Load":
        if not isinstance(indices, tuple):
            indices = (indices,)
        return Load(self, tuple(const(i) for i in indices))

    def __hash__(self):
        return hash(("Buffer", self.name))


@dataclass(frozen=True, eq=True)
class Load(Expr):
    buffer: Buffer
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> T.DType:
        return self.buffer.dtype

    def __hash__(self):
        return hash(("Load", self.buffer.name, self.indices))


@dataclass(frozen=True, eq=True)
class IterVar:
    """A reduction axis: `var` ranges over [0, extent)."""

    var: Var
    extent: Expr

    def __hash__(self):
        return hash(("IterVar", self.var, self.extent))


REDUCE_COMBINERS = ("sum", "prod", "max", "min", "and", "or")


@dataclass(frozen=True, eq=True)
class Reduce(Expr):
    """`combiner` of `source` over the reduce axes (compute rules only)."""

    combiner: str
    source: Expr
    axes: tuple[IterVar, ...]
    # filters the reduced elements (a pooling window's padding, a masked softmax)
    condition: Expr | None = None

    @property
    def dtype(self) -> T.DType:
        return self.source.dtype

    def __hash__(self):
        return hash(("Reduce", self.combiner, self.source, self.axes, self.condition))


def const(value, dtype: T.DType | None = None) -> Expr:
    """`value` as an Expr: Exprs pass through, Python numbers become `Const`s."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, IterVar):  # a reduce axis used as an index
        return value.var
    if dtype is None:
        dtype = T.bool_ if isinstance(value, bool) else INDEX if isinstance(value, int) \
            else T.float32
    if dtype.is_float:
        value = float(value)
    elif dtype.kind == "b":
        value = bool(value)
    else:
        value = int(value)
    return Const(value, dtype)


def eq(a, b) -> BinOp:
    a = const(a)
    return BinOp("==", a, const(b, a.dtype))


def ne(a, b) -> BinOp:
    a = const(a)
    return BinOp("!=", a, const(b, a.dtype))


def minimum(a, b) -> BinOp:
    a = const(a)
    return BinOp("min", a, const(b, a.dtype))


def maximum(a, b) -> BinOp:
    a = const(a)
    return BinOp("max", a, const(b, a.dtype))


def logical_and(*conds) -> Expr:
    """All of `conds` (true when none are given)."""
    out: Expr | None = None
    for c in conds:
        out = c if out is None else BinOp("and", out, c)
    return Const(True, T.bool_) if out is None else out


def logical_or(*conds) -> Expr:
    out: Expr | None = None
    for c in conds:
        out = c if out is None else BinOp("or", out, c)
    return Const(False, T.bool_) if out is None else out


def call(name: str, *args, dtype: T.DType | None = None) -> Call:
    if name not in INTRINSICS:
        raise ValueError(f"unknown intrinsic {name!r}")
    args = tuple(const(a) for a in args)
    return Call(name, args, dtype or (T.bool_ if name in ("isnan", "isinf", "not")
                                      else args[0].dtype))


def static_shape(shape) -> tuple[int, ...] | None:
    """A buffer shape (index expressions, or ints) as ints when every dim is a constant, None
    when any is symbolic; graph shapes pass through unchanged (`types.static_shape`)."""
    return T.static_shape(d.value if isinstance(d, Const) else d for d in shape)


# ---------------------------------------------------------------------------------------------
# Statements


class Stmt:
    """Base of all statements."""


class ForKind(str, enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    BLOCK_X = "blockIdx.x"
    BLOCK_Y = "blockIdx.y"
    BLOCK_Z = "blockIdx.z"
    THREAD_X = "threadIdx.x"
    THREAD_Y = "threadIdx.y"
    THREAD_Z = "threadIdx.z"

    @property
    def is_gpu_block(self) -> bool:
        return self.value.startswith("blockIdx")

    @property
    def is_gpu_thread(self) -> bool:
        return self.value.startswith("threadIdx")


@dataclass(frozen=True, eq=True)
class For(Stmt):
    """`for var in [0, extent)`, run as `kind` says."""

    var: Var
    extent: Expr
    body: Stmt
    kind: ForKind = ForKind.SERIAL

    def __post_init__(self):
        object.__setattr__(self, "extent", const(self.extent))

    def __hash__(self):
        return hash(("For", self.var, self.extent, self.body, self.kind))


@dataclass(frozen=True, eq=True)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr

    def __post_init__(self):
        object.__setattr__(self, "indices", tuple(const(i) for i in self.indices))

    def __hash__(self):
        return hash(("Store", self.buffer.name, self.indices, self.value))


@dataclass(frozen=True, eq=True)
class Let(Stmt):
    var: Var
    value: Expr
    body: Stmt

    def __hash__(self):
        return hash(("Let", self.var, self.value, self.body))


@dataclass(frozen=True, eq=True)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None

    def __hash__(self):
        return hash(("If", self.cond, self.then, self.orelse))


@dataclass(frozen=True, eq=True)
class Allocate(Stmt):
    """`buffer` exists (in its scope) for the duration of `body`."""

    buffer: Buffer
    body: Stmt

    def __hash__(self):
        return hash(("Allocate", self.buffer, self.body))


@dataclass(frozen=True, eq=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]

    def __hash__(self):
        return hash(("Seq", self.stmts))


@dataclass(frozen=True, eq=True)
class Prefetch(Stmt):
    """A hint that the element `at` names (a `Load` used as an address, never evaluated) will
    be read soon: its cache line is fetched towards the caches (llvm's `llvm.prefetch`, which
    never faults). It changes no value; a backend may render nothing for it."""

    at: Load

    def __hash__(self):
        return hash(("Prefetch", self.at))


@dataclass(frozen=True, eq=True)
class Barrier(Stmt):
    """All threads of a GPU block wait here (__syncthreads)."""

    def __hash__(self):
        return hash("Barrier")


MMA_SHAPES = {"tf32": (16, 8, 8), "fp16": (16, 8, 16), "bf16": (16, 8, 16),
              "sp_fp16": (16, 8, 32), "sp_bf16": (16, 8, 32), "s8": (16, 8, 32),
              "u8": (16, 8, 32)}
"""Precision -> (m, n, k) of its warp-level tensor-core product (`Mma`): PTX's
mma.sync.aligned.m16n8k8 for tf32 operands, m16n8k16 for fp16 and bf16, fp32 accumulators;
the sparse ones (`SPARSE_MMA`) mma.sp.sync.aligned.m16n8k32 with A 2:4 sparse; m16n8k32 for
the integer ones (`INTEGER_MMA`)."""

SPARSE_MMA = {"sp_fp16": "fp16", "sp_bf16": "bf16"}
"""The sparse tensor cores' precisions (`Mma` on a 2:4 sparse A) -> their operands' type
(whose `PACKS` intrinsic makes their registers)."""

INTEGER_MMA = ("s8", "u8")
"""The integer `Mma` precisions, named by A's type (B is int8): PTX's
mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.s8.s32, int32 accumulators, exact."""


@dataclass(frozen=True, eq=True)
class Mma(Stmt):
    """One warp's tensor-core matrix multiply-accumulate, D = A B + C, in place on C (PTX's
    `mma.sync.aligned.m16n8k{8,16}.row.col.f32.<p>.<p>.f32`; shapes in `MMA_SHAPES`).

    A is m x k, B is k x n, C is m x n fp32, each spread over the 32 lanes of a warp as
    PTX's fragments. With g = lane // 4 and t = lane % 4, this lane holds A's elements e
    (tf32: A[g + 8 (e % 2), t + 4 (e // 2)], e < 4; fp16 / bf16: A[g + 8 (e // 2 % 2),
    2 t + e % 2 + 8 (e // 4)], e < 8), B's elements e (tf32: B[t + 4 e, g], e < 2; fp16 /
    bf16: B[2 t + e % 2 + 8 (e // 2), g], e < 4) and C[g + 8 (r // 2), 2 t + r % 2] in
    `acc[offset + r]` (LOCAL float32), r < 4.

    `a` (4) and `b` (2) are the lane's operand registers, uint32 made by the precision's
    pack intrinsic (`PACKS`) or holding such bits: for tf32 element r in register r; for
    fp16 and bf16 elements 2 r and 2 r + 1 in register r, the first in the low half. The
    products of the rounded operands are summed in fp32 into C. Every lane of the warp runs
    it together (a threadIdx.x loop of whole warps, no lane-dependent condition around it).
    CPU backends do not render it.

    The sparse precisions (`SPARSE_MMA`: mma.sp m16n8k32, A 2:4 sparse along k) take A as
    its kept 16 x 16 (two of every 4 consecutive k of a row, in order), in the fp16
    fragment layout above (`a`, 4 registers), B's 32 x 8 elements e < 8 B[2 t + e % 2 + 8
    (e // 2), g] in 4 registers, then the metadata register (`b` holds 5): lanes with t < 2
    give it (sparsity selector 0), its bits 2 i, 2 i + 1 (i < 8) the position within its
    group of 4 of kept element i of row g's kept columns 8 t .. 8 t + 7, bits 16 + 2 i of
    row g + 8's.

    The integer precisions (`INTEGER_MMA`) hold A's bytes A[g + 8 (r % 2), 4 t + 16 (r // 2)
    + e] in byte e of register r and B's bytes B[4 t + 16 r + e, g] in byte e of b[r], and
    sum exactly into int32 accumulators. CPU backends do not render it."""

    precision: str
    acc: Buffer
    offset: Expr
    a: tuple[Expr, ...]
    b: tuple[Expr, ...]

    def __hash__(self):
        return hash(("Mma", self.precision, self.acc.name, self.offset, self.a, self.b))


MMA_REGISTERS = (4, 2)
"""The operand registers of A and of B a lane passes to an `Mma` (every dense precision)."""
SPARSE_MMA_REGISTERS = (4, 5)
"""Those of a sparse one (`SPARSE_MMA`): B's 4, then the metadata."""

LDMATRIX_COUNTS = (1, 2, 4)


@dataclass(frozen=True, eq=True)
class LdMatrix(Stmt):
    """A warp's collective load of `count` 8 x 8 matrices of 16-bit elements from shared
    memory into operand registers (PTX's `ldmatrix.sync.aligned.m8n8.x{count}[.trans]
    .shared.b16`).

    `src` (a Load of a SHARED uint32 buffer, used as an address, never evaluated) is this
    lane's row: lanes 8 q .. 8 q + 7 give rows 0..7 of matrix q, each 16 bytes (8 elements,
    4 words) from `src`'s word on, 16-byte aligned; lanes past 8 count give none. `dst` (a Load
    of a LOCAL uint32 buffer, as a place) is the first of `count` registers: register q of
    lane l gets matrix q's elements (row l // 4, columns 2 (l % 4) and 2 (l % 4) + 1), the
    first in the low half; with `trans`, its elements (rows 2 (l % 4) and 2 (l % 4) + 1,
    column l // 4). 32-bit elements move as pairs of 16-bit ones (without `trans`: register
    q then holds element (l // 4, l % 4) of an 8 x 4 matrix of words). Every lane of the warp
    runs it together, as `Mma`. CPU backends do not render it."""

    dst: Load
    src: Load
    count: int = 4
    trans: bool = False

    def __hash__(self):
        return hash(("LdMatrix", self.dst, self.src, self.count, self.trans))


ASYNC_COPY_BYTES = 16


@dataclass(frozen=True, eq=True)
class CopyAsync(Stmt):
    """One thread's asynchronous copy of 16 bytes from global to shared memory (PTX's
    `cp.async.cg.shared.global` with a source size): the first `src_bytes` (an integer in
    [0, 16]) bytes from `src`'s element on, then zeros; `dst` and `src` (Loads used as
    addresses, never evaluated: a SHARED and a GLOBAL buffer) 16-byte aligned. The copy
    lands at some time before this thread's `AsyncWait` that leaves its group complete;
    other threads see it after that wait and a `Barrier`. CPU backends do not render it."""

    dst: Load
    src: Load
    src_bytes: Expr

    def __hash__(self):
        return hash(("CopyAsync", self.dst, self.src, self.src_bytes))


@dataclass(frozen=True, eq=True)
class AsyncCommit(Stmt):
    """This thread's `CopyAsync`s since its last commit become one group (`cp.async
    .commit_group`; a group may be empty)."""

    def __hash__(self):
        return hash("AsyncCommit")


@dataclass(frozen=True, eq=True)
class AsyncWait(Stmt):
    """This thread waits until at most `pending` of its committed groups are incomplete
    (`cp.async.wait_group`): the older ones have landed in shared memory."""

    pending: int = 0

    def __hash__(self):
        return hash(("AsyncWait", self.pending))


WGMMA_K = {"tf32": 8, "fp16": 16, "bf16": 16, "s8": 32, "u8": 32, "sp_fp16": 32,
           "sp_bf16": 32}
"""Precision -> the k of a `Wgmma` (PTX's wgmma.mma_async m64nNk8 for tf32, k16 for fp16 and
bf16, k32 for the integer precisions `INTEGER_MMA`, A's type, B s8): 32 bytes of k either
way; k32 for the sparse ones (`SPARSE_MMA`: wgmma.mma_async.sp, A's 16 kept a row 32
bytes)."""

SWIZZLE_BYTES = 1024
"""A `Wgmma` operand layout's swizzle repeats every 1024 bytes (8 rows of 128): the shared
buffers its operands live in start at a multiple of it."""


@dataclass(frozen=True, eq=True)
class Wgmma(Stmt):
    """A warpgroup's asynchronous tensor-core product D += A B (PTX's `wgmma.mma_async.sync
    .aligned.m64n<n>k<k>.f32.<p>.<p>`, k in `WGMMA_K`), A 64 x k and B k x n read from shared
    memory, D 64 x n fp32 in registers.

    A warpgroup is 128 consecutive threads from a multiple of 128 (4 warps); all of them
    run it together. Thread t of it (warp w = t // 32, g = t % 32 // 4, q = t % 4) holds
    D[16 w + g + 8 (r // 2 % 2), 8 (r // 4) + 2 q + r % 2] in register r < n / 2 from `acc`
    (a Load of a LOCAL float32 buffer, as a place) on.

    `a` and `b` (Loads of SHARED uint32 buffers, used as addresses) start each operand's
    layout (PTX's matrix descriptor: 128-byte swizzle, base offset 0). Element (x, kk) of
    an operand (x: A's row i or B's column j) is at byte `start + o` swizzled, where
    K-major (`*_mn_major` False): o = (x // 8) stride + (x % 8) 128 + kk e, and MN-major:
    o = (x // 64) leading + (x % 64) e + (kk // 8) stride + (kk % 8) 128, with e the
    element's bytes (2; tf32 4, K-major only) and (leading, stride) the operand's
    `*_offsets` in bytes; the swizzle of shared address p is p ^ ((p >> 7) % 8 << 4) (16-byte
    chunk c of a 128-byte row r of a 1024-byte aligned block at chunk c ^ r % 8). Operands
    are the precision's bits (fp16 / bf16 elements; tf32 read from float32 words, the low
    13 mantissa bits ignored); products summed in fp32. At the integer precisions
    (`INTEGER_MMA`: s8 or u8 A, s8 B, K-major only, e = 1) `acc` is int32 and the products'
    sums exact (`.s32.<p>.s8`).

    At the sparse precisions (`SPARSE_MMA`: wgmma.mma_async.sp m64nNk32, A 2:4 sparse along
    k, K-major only) A's layout holds its kept 64 x 16 (two of every 4 consecutive k of a
    row, in order: element (i, c) at kk = c above), B's is k32's, and `meta` is the thread's
    metadata register, as a sparse `Mma`'s for the 16 rows of its warp: lanes with q < 2
    give it (sparsity selector 0), its bits 2 c, 2 c + 1 (c < 8) the position within its
    group of 4 of kept element c of row 16 w + g's kept columns 8 q .. 8 q + 7, bits 16 + 2 c
    of row 16 w + g + 8's.

    It only starts: `acc` holds the result after a `WgmmaCommit` and the `WgmmaWait` that
    completes that group; until then neither the registers nor the shared operands may be
    touched. Shared memory written by ordinary stores or `CopyAsync` reaches it only
    through a `ProxyFence` by the writing thread before a `Barrier`; `acc` written by
    ordinary stores only through a `WgmmaFence`. CPU backends do not render it."""

    precision: str
    n: int
    acc: Load
    a: Load
    b: Load
    a_mn_major: bool = False
    b_mn_major: bool = False
    a_offsets: tuple[int, int] = (16, SWIZZLE_BYTES)
    b_offsets: tuple[int, int] = (16, SWIZZLE_BYTES)
    meta: Expr | None = None

    def __hash__(self):
        return hash(("Wgmma", self.precision, self.n, self.acc, self.a, self.b,
                     self.a_mn_major, self.b_mn_major, self.a_offsets, self.b_offsets,
                     self.meta))


@dataclass(frozen=True, eq=True)
class WgmmaFence(Stmt):
    """The warpgroup's accesses of registers before it are ordered before its next `Wgmma`
    (`wgmma.fence.sync.aligned`): needed before the first `Wgmma` and after registers it
    accumulates into are written otherwise."""

    def __hash__(self):
        return hash("WgmmaFence")


@dataclass(frozen=True, eq=True)
class WgmmaCommit(Stmt):
    """The warpgroup's `Wgmma`s since its last commit become one group
    (`wgmma.commit_group.sync.aligned`)."""

    def __hash__(self):
        return hash("WgmmaCommit")


@dataclass(frozen=True, eq=True)
class WgmmaWait(Stmt):
    """The warpgroup waits until at most `pending` of its committed `Wgmma` groups are
    incomplete (`wgmma.wait_group.sync.aligned`): the older ones' accumulators (the `count`
    registers from `acc`, a Load of a LOCAL float32 (integer precisions: int32) buffer as a
    place) hold their results
    and their shared operands may be written again."""

    pending: int
    acc: Load
    count: int

    def __hash__(self):
        return hash(("WgmmaWait", self.pending, self.acc, self.count))


@dataclass(frozen=True, eq=True)
class ProxyFence(Stmt):
    """This thread's writes of shared memory before it (stores, `CopyAsync`s that have
    landed) become visible to the asynchronous proxy that `Wgmma` reads through, for those
    who pass a later `Barrier` (`fence.proxy.async.shared::cta`)."""

    def __hash__(self):
        return hash("ProxyFence")


@dataclass(frozen=True, eq=True)
class ClusterBarrier(Stmt):
    """All threads of the `size` blocks of this block's cluster wait here; shared memory
    written before it is visible to every block of the cluster after it (sm_90's
    `barrier.cluster.arrive.release` / `wait.acquire`). A cluster is `size` blocks consecutive
    along blockIdx.z (blockIdx.z // size the same): a kernel holding one launches so
    (`__cluster_dims__(1, 1, size)`), and every block of it passes the same barriers."""

    size: int

    def __hash__(self):
        return hash(("ClusterBarrier", self.size))


MBARRIER_OPS = ("init", "arrive", "copy_arrive", "expect_tx", "wait")


@dataclass(frozen=True, eq=True)
class Mbarrier(Stmt):
    """One thread's operation on a shared-memory barrier object (sm_90's `mbarrier`): `bar`
    (a Load of a SHARED uint64 buffer, used as a place, never evaluated) is the object.

    - "init": it counts `value` (an integer constant) arrivals a phase, its phase 0 pending
      (one thread initialises it, then a `Barrier` before any other use);
    - "arrive": one arrival, ordering this thread's memory accesses before it (release);
    - "copy_arrive": one arrival once every `CopyAsync` this thread issued before it has
      landed (PTX's `cp.async.mbarrier.arrive.noinc`: the count at init includes it);
    - "expect_tx": one arrival, and the phase awaits `value` (an integer expression) bytes
      more from `TmaLoad`s completing on it (`mbarrier.arrive.expect_tx`);
    - "wait": this thread waits until the phase of parity `value` (an integer 0 or 1, an
      expression) has completed (`try_wait.parity`, acquire): what the arrivals of that
      phase ordered before them is then visible to it.

    A phase completes when its count of arrivals has come and the bytes its "expect_tx"
    arrivals announced have landed (a `TmaLoad`'s may land before its announcement: the
    byte count goes below zero within the phase); the next begins at once. A waiter must
    not fall two phases behind (parity names one of two). CPU backends do not render it."""

    op: str
    bar: Load
    value: Expr | None = None

    def __hash__(self):
        return hash(("Mbarrier", self.op, self.bar, self.value))


TMA_RANK = 3
"""Dimensions of a tiled `TensorMap` (the prelude's copy is `cp.async.bulk.tensor.3d`)."""
IM2COL_RANK = 4
"""Dimensions of an im2col `TensorMap`: an NHWC tensor, (c, w, h, n) innermost first (the
prelude's copy is `cp.async.bulk.tensor.4d ... im2col`)."""


@dataclass(frozen=True, eq=True)
class TensorMap:
    """What a tensor map describes (sm_90's `CUtensorMap`, built on the host once the
    tensor's address is known: a kernel argument, not an IR node): global `tensor` (a
    function parameter) viewed as `extents` elements a dimension, innermost first, the first
    dimension contiguous and dimension d + 1 `strides[d]` bytes apart; a `TmaLoad` copies one
    `box` of it (box[0] elements of the innermost dimension: 128 bytes, one swizzle row).

    With `im2col` (an IM2COL_RANK tensor (c, w, h, n), TMA's im2col mode, as CUTLASS's sm_90
    convolutions take their activations): the spatial dimensions' lower corners, upper
    corners and traversal strides, w then h (a conv's -pad_begin, pad_end - (kernel - 1)
    dilation, and its strides); a box is (box[0] channels, box[1] pixels): from the pixel
    at the copy's coordinates, box[1] pixels in the order w, h, n, stepping by the traversal
    strides within [lower, extent - 1 + upper] of each spatial dimension, each pixel's
    box[0] channels read at its position plus the copy's `offsets` (the filter tap), zeros
    outside the tensor; pixel p lands as box row p."""

    tensor: Buffer
    extents: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    im2col: tuple[int, ...] = ()

    @property
    def box_bytes(self) -> int:
        """Bytes a copy of one box brings (the zeros past the tensor's edges included)."""
        return math.prod(self.box) * self.tensor.dtype.itemsize

    def __hash__(self):
        return hash(("TensorMap", self.tensor.name, self.extents, self.strides, self.box,
                     self.im2col))


@dataclass(frozen=True, eq=True)
class TmaLoad(Stmt):
    """One thread's bulk tensor copy (sm_90's TMA, `cp.async.bulk.tensor`): the box of `map`
    whose first element is at `coords` (integer expressions, innermost first, in elements)
    into shared memory from `dst` on (a Load of a SHARED uint32 buffer, used as a place,
    1024-byte aligned), its bytes completing on barrier `bar` (a Load of a SHARED uint64
    buffer, as `Mbarrier`'s) in the phase current when they land.

    Box element (i_0, i_1, i_2) is tensor element coords + i, or zero where one coordinate
    lies outside [0, extent); it lands in box row r = i_1 + box_1 i_2 at byte r 128 + i_0 e
    (e the element's bytes) from `dst`, in the 128-byte swizzle (16-byte chunk c of row r at
    chunk c ^ r % 8: `Wgmma`'s K-major layout of a tile whose rows are 128 bytes). The
    copy is asynchronous: `dst` may be read once a wait on `bar` saw the phase complete, by
    `Wgmma` directly (no `ProxyFence`: the copy writes through the async proxy). CPU
    backends do not render it.

    From an im2col map (`TensorMap.im2col`), `coords` (c, w, h, n) name the box's first pixel
    (its traversal position, the tap not added) and `offsets` (w, h: integer expressions,
    each 0 to 255) the filter tap added to every pixel's position; box pixel p's channel i
    lands at byte p 128 + i e, swizzled as above."""

    dst: Load
    map: TensorMap
    bar: Load
    coords: tuple[Expr, ...]
    offsets: tuple[Expr, ...] = ()

    def __hash__(self):
        return hash(("TmaLoad", self.dst, self.map, self.bar, self.coords, self.offsets))


TILE_ROWS = 16
"""Rows of a `TileProduct` tile, and 32-bit words a row holds (64 bytes)."""

TILE_PRECISIONS = {"bf16": T.float32, "u8s8": T.int32, "s8s8": T.int32, "s8u8": T.int32}
"""Precision -> the accumulator type of a `TileProduct`: bf16 pairs summed in float32, quads
of bytes (A's signedness, then B's) summed in int32."""


@dataclass(frozen=True, eq=True)
class TileProduct(Stmt):
    """A CPU tile unit's block of products, C += A B in place (C = A B without
    `accumulate`): `m_tiles` x `n_tiles` tiles of C, each 16 x 16 accumulators of
    `TILE_PRECISIONS[precision]`, k in `steps` steps of 16 words a row (AMX's tdpbf16ps /
    tdpbusd; 8 tile registers hold C's tiles, a step's A tiles and its B tiles).

    `c`, `a` and `b` (Loads used as places, never evaluated) start the operands; offsets
    count 4-byte elements. C tile (r, s) row i is the 16 elements from c + (16 r + i) c_row
    + 16 s. A tile (r, t) row i is the 16 uint32 words from a + r a_tile + t a_step + i a_row
    (`a_layout` = (a_row, a_tile, a_step)); B tile (t, s) row p the 16 words from b + t b_step
    + s b_tile + p b_row (`b_layout` = (b_row, b_tile, b_step)). Then C[r, s][i, j] (+)=
    sum over t and p of dot(A[r, t][i, p], B[t, s][p, j]): for bf16, lo(x) lo(y) + hi(x)
    hi(y) of the bfloat16 numbers in each word's bits 0-15 and 16-31, in float32 (each
    product exact, sums rounded to nearest even, denormal operands and results zero); for
    u8s8, s8s8 and s8u8, the four products of A's and B's bytes, unsigned or signed as the
    name says (A's first), summed in int32 with wraparound (tdpbusd, tdpbssd, tdpbsud). `runs`:
    (A, B) offsets in words of k's runs of `steps` steps each, one after another with C in
    the tile registers (a convolution's taps; by default one run at offset 0). `tail`: each
    run's last step, after its `steps` whole ones, holds only `tail` words of k (0: none),
    A's rows `tail` words wide and B `tail` rows (tiles configured that size: k's padding
    neither packed nor multiplied). A function configures each tile register with one shape,
    so a tail beside whole steps holds registers of both (`registers`). GPU backends do not
    render it."""

    precision: str
    c: Load
    a: Load
    b: Load
    c_row: int
    a_layout: tuple[int, int, int]
    b_layout: tuple[int, int, int]
    m_tiles: int
    n_tiles: int
    steps: int
    accumulate: bool = True
    runs: tuple[tuple[int, int], ...] = ((0, 0),)
    tail: int = 0

    def __hash__(self):
        return hash(("TileProduct", self.precision, self.c, self.a, self.b, self.c_row,
                     self.a_layout, self.b_layout, self.m_tiles, self.n_tiles, self.steps,
                     self.accumulate, self.runs, self.tail))

    @property
    def tiles(self) -> int:
        """Tile registers the block holds at once: C's, a step's A and B tiles."""
        return self.m_tiles * self.n_tiles + self.m_tiles + self.n_tiles

    @property
    def registers(self) -> int:
        """Tile registers the product takes: `tiles`, and where a tail follows whole steps
        its A and B tiles too (a register keeps one shape in a function)."""
        return self.tiles + (self.m_tiles + self.n_tiles if self.tail and self.steps else 0)


TILE_REGISTERS = 8
"""Tile registers a `TileProduct` block may hold at once (AMX's tmm0-tmm7)."""


def mma_fragments(precision: str) -> tuple[int, int]:
    """(elements of A, of B) a lane holds in an `Mma` of `precision`."""
    m, n, k = MMA_SHAPES[precision]
    return m * k // 32, k * n // 32


def seq(*stmts: Stmt) -> Stmt:
    """A Seq, flattened; one statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def loop_nest(vars_extents, body: Stmt, kind: ForKind = ForKind.SERIAL) -> Stmt:
    """Nested serial loops, outermost first."""
    for var, extent in reversed(list(vars_extents)):
        body = For(var, extent, body, kind)
    return body


@dataclass(frozen=True, eq=True)
class PrimFunc:
    """One kernel: buffer parameters (inputs then outputs), symbolic size vars, a body."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    size_vars: tuple[Var, ...] = ()
    attrs: tuple[tuple[str, object], ...] = field(default_factory=tuple)

    def __hash__(self):
        return hash(("PrimFunc", self.name, self.params, self.body))

    def __str__(self) -> str:
        from .printer import print_func  # the printer imports these nodes
        return print_func(self)
