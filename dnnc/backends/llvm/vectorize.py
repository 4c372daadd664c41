"""Explicit vectorisation of the LLVM renderer's VECTORIZED loops of constant extent.

`VectorLoop` turns `for v in range(lanes): body` (stores and lets only: `vectorizable`) into
straight-line vector code: loads and stores contiguous in `v` become vector memory operations
(constant strides 2 to 4 a wide load and a shuffle), arithmetic vector instructions from the op
tables of `primitives.py`, and anything else is computed lane by lane through the scalar
emitter (`codegen.py`), which is always correct. It must never change what a loop computes,
only how many lanes one instruction does: the `_VECTOR_*` tables below list what is known to
give the scalar code's result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from llvmlite import ir

from ...ir import loop as L
from ...ir import types as T
from .primitives import BINARY, CALLS, CASTS, I8, I32, I64, cast_class, compute_type, \
    memory_type, op_class

if TYPE_CHECKING:
    from .codegen import FunctionEmitter


def vectorizable(body: L.Stmt) -> bool:
    """Bodies of stores and lets only (no control flow) become straight-line vector code."""
    if isinstance(body, L.Seq):
        return all(vectorizable(x) for x in body.stmts)
    if isinstance(body, L.Let):
        return vectorizable(body.body)
    return isinstance(body, L.Store)


def _lane_coefficient(e: L.Expr, var: L.Var, vector_vars, free=L.free_vars) -> int | None:
    """The coefficient of `var` in `e` when `e` is affine in it (0: invariant), else None
    (`free`: an expression's free variables)."""
    used = free(e)
    if var not in used and not (used & vector_vars):
        return 0
    if e == var:
        return 1
    if isinstance(e, L.BinOp) and e.op in ("+", "-"):
        a = _lane_coefficient(e.a, var, vector_vars, free)
        b = _lane_coefficient(e.b, var, vector_vars, free)
        if a is None or b is None:
            return None
        return a + b if e.op == "+" else a - b
    if isinstance(e, L.BinOp) and e.op == "*":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, L.Const):
                cx = _lane_coefficient(x, var, vector_vars, free)
                return None if cx is None else cx * y.value
    return None


TABLE_BYTES = 256
"""A byte table `_table_lookup` reads in registers: one entry per 8-bit value."""
_VECTOR_FLOATS = (T.float32, T.float64)
_VECTOR_BINARY = {("f", op) for op in ("+", "-", "*", "/", "min", "max", *L.COMPARE)} | \
    {(c, op) for c in "su" for op in ("+", "-", "*", "&", "|", "^", "<<", ">>", "min", "max")}
"""`BINARY` entries emitted as vector instructions (floats: on _VECTOR_FLOATS); the bit
operations serve legalized bfloat16 conversions, integer min / max int8 max pooling."""
_VECTOR_CALLS = {"fma", "exp", "log", "sqrt", "floor", "ceil", "round", "trunc", "abs", "neg",
                 "dot_bf16x2"}
"""`CALLS` entries emitted as vector intrinsics on _VECTOR_FLOATS; the rest lane by lane."""
_STRIDED_INTS = (T.int32, T.uint32)
"""Integer loads at a constant stride of 2 to 4 done as one load and a shuffle, as floats'
(the int8 depthwise template's stride-2 taps)."""
_VECTOR_INT_CALLS = {"dot_u8s8x4"}
"""`CALLS` entries emitted as vector intrinsics on int32 (vpdpbusd)."""
_VECTOR_SELECTS = (T.float32, T.float64, T.uint32)
"""Selects of these dtypes are vector selects (uint32: bfloat16 rounding's NaN case)."""
_VECTOR_CASTS = ((T.float16, T.float32, T.float64), (T.uint16, T.uint32),
                 (T.int8, T.uint8, T.int32, T.uint32, T.float32))
"""Casts within one of these groups are vector instructions: float16 and bfloat16 data
computed in float32 (fpext / fptrunc, and the zext / trunc of bfloat16's bits); 8-bit and
32-bit integers and their conversions to float32 (int8 kernels' operands and epilogues). Float to
integer (legalize's `ftoi`) stays lane by lane."""


class VectorLoop:
    """Straight-line vector code for `for v in range(L): body`: contiguous loads and stores
    become vector memory operations, arithmetic vector instructions, anything else is
    computed lane by lane (always correct, fast where it matters)."""

    def __init__(self, em: FunctionEmitter, loop: L.For):
        self.em = em
        self.b = em.b
        self.var = loop.var
        self.lanes = loop.extent.value
        self.body = loop.body
        self.vectors: dict[L.Var, ir.Value] = {}   # let-bound vector values
        self._free: dict[int, tuple[L.Expr, frozenset]] = {}   # `free`'s, by node

    def emit(self) -> None:
        self.stmt(self.body)

    def free(self, e: L.Expr) -> frozenset:
        """`e`'s free variables, each node's computed once from its children's: `expr` asks
        at every node of a tree, and `L.free_vars` walked each subtree again (a Winograd
        F(6x6) transform's sums: 350k walks, a third of its kernel's Python)."""
        known = self._free.get(id(e))
        if known is not None:
            return known[1]
        if isinstance(e, L.Var):
            used = frozenset((e,))
        elif isinstance(e, L.Reduce):   # (binds its axes)
            used = frozenset(L.free_vars(e))
        else:
            used = frozenset().union(*(self.free(x) for x in L.children(e)
                                       if isinstance(x, L.Expr)))
        self._free[id(e)] = (e, used)   # (e kept: its id is not reused while this lives)
        return used

    def vtype(self, dtype: T.DType) -> ir.VectorType:
        return ir.VectorType(compute_type(dtype), self.lanes)

    def splat(self, value: ir.Value) -> ir.Value:
        ty = ir.VectorType(value.type, self.lanes)
        undef = ir.Constant(ty, ir.Undefined)
        one = self.b.insert_element(undef, value, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, self.lanes),
                                                             [0] * self.lanes))

    def stmt(self, s: L.Stmt) -> None:
        if isinstance(s, L.Seq):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, L.Let):
            value, is_vector = self.expr(s.value)
            if is_vector:
                self.vectors[s.var] = value
            else:
                self.em.env[s.var] = value
            self.stmt(s.body)
            self.vectors.pop(s.var, None)
        else:
            self.store(s)

    def _lane_stride(self, indices) -> int | None:
        """Elements between consecutive lanes' addresses: 0 when every lane reads one element,
        k when lane i reads base + k * i along the last axis, None otherwise."""
        vectors = set(self.vectors)
        coefs = [_lane_coefficient(i, self.var, vectors, self.free) for i in indices]
        if any(c is None for c in coefs) or any(c != 0 for c in coefs[:-1]):
            return None
        return coefs[-1] if coefs else 0

    def _contiguous(self, indices) -> bool | None:
        """True: lanes are consecutive elements; False: all lanes one element; None: neither."""
        return {0: False, 1: True}.get(self._lane_stride(indices))

    def _strided_load(self, e: L.Load, stride: int) -> ir.Value:
        """Lanes at a constant stride: one contiguous load of the span the lanes cover (never
        past the last lane's element) and a shuffle picking every stride-th element, as
        LLVM's interleaved-access lowering does, instead of a scalar load per lane."""
        span = stride * (self.lanes - 1) + 1
        ptr = self._base_address(e.buffer, e.indices)
        mem = ir.VectorType(memory_type(e.buffer.dtype), span)
        wide = self.b.load(self.b.bitcast(ptr, ir.PointerType(mem)), typ=mem,
                           align=e.buffer.dtype.itemsize)
        picks = ir.Constant(ir.VectorType(I32, self.lanes),
                            [stride * k for k in range(self.lanes)])
        return self.b.shuffle_vector(wide, ir.Constant(mem, ir.Undefined), picks)

    def _gather(self, e: L.Load) -> ir.Value:
        """Lanes at computed places (a QuantizedTable's lookups): each index not affine in the
        lane a vector first, then one scalar load a lane, so that the index's arithmetic (an
        int8 conv's requantization) runs once in vector code, not once a lane."""
        if self._byte_table(e.buffer):
            return self._table_lookup(e.buffer, self._as_vector(e.indices[0]))
        indices, temps = [], []
        for k, i in enumerate(e.indices):
            if _lane_coefficient(i, self.var, set(self.vectors), self.free) is not None:
                indices.append(i)
                continue
            temp = L.Var(f"lane_index{k}", i.dtype)
            self.vectors[temp] = self._as_vector(i)
            indices.append(temp)
            temps.append(temp)
        try:
            return self.lanewise(L.Load(e.buffer, tuple(indices)))
        finally:
            for temp in temps:
                del self.vectors[temp]

    def _byte_table(self, buf: L.Buffer) -> bool:
        """Whether lookups in `buf` can be `_table_lookup`'s: 256 bytes (a QuantizedTable),
        a CPU with AVX-512 VBMI, at most 64 lanes."""
        extent = buf.shape[0] if len(buf.shape) == 1 else None
        return isinstance(extent, L.Const) and extent.value == TABLE_BYTES and \
            buf.dtype.itemsize == 1 and \
            self.lanes <= 64 and "avx512vbmi" in self.em.mb.features

    def _table_lookup(self, buf: L.Buffer, index: ir.Value) -> ir.Value:
        """The lanes' bytes of a 256-byte table at `index` (0..255): two vpermi2b, each
        over 128 bytes (its index's bit 6 picks the register), and bit 7 selects between
        them; a lane a scalar load and an insert took ~8 cycles a lane (convnext's GELU
        after a 3136 x 96 x 384 int8 dense product, 1 thread, znver4: 4.2 ms, 1.6 without)."""
        b, lanes = self.b, self.lanes
        bytes64 = ir.VectorType(I8, 64)
        base = self.em.address(buf, (L.const(0),))
        quarters = [b.load(b.gep(base, [ir.Constant(I64, 64 * q)], inbounds=True,
                                 source_etype=I8), typ=bytes64, align=1) for q in range(4)]
        index = b.trunc(index, ir.VectorType(I8, lanes))
        if lanes < 64:   # (the lanes past `lanes` look up entry index[0], unread)
            index = b.shuffle_vector(index, index, ir.Constant(
                ir.VectorType(I32, 64), list(range(lanes)) + [0] * (64 - lanes)))
        permute = self.em.mb.declare("llvm.x86.avx512.vpermi2var.qi.512", bytes64,
                                     [bytes64] * 3)
        low = b.call(permute, [quarters[0], index, quarters[1]])
        high = b.call(permute, [quarters[2], index, quarters[3]])
        upper = b.icmp_signed("<", index, ir.Constant(bytes64, [0] * 64))
        looked = b.select(upper, high, low)
        if lanes == 64:
            return looked
        return b.shuffle_vector(looked, looked, ir.Constant(ir.VectorType(I32, lanes),
                                                            list(range(lanes))))

    def _base_address(self, buf, indices):
        zero = {self.var: L.const(0)}
        return self.em.address(buf, tuple(L.substitute(i, zero) for i in indices))

    def store(self, s: L.Store) -> None:
        value, is_vector = self.expr(s.value)
        kind = self._contiguous(s.indices)
        dtype = s.buffer.dtype
        if kind is True:
            vec = value if is_vector else self.splat(value)
            ptr = self._base_address(s.buffer, s.indices)
            mem = self._to_memory(vec, dtype)
            ptr = self.b.bitcast(ptr, ir.PointerType(mem.type))
            self.b.store(mem, ptr, align=dtype.itemsize)
            return
        for k in range(self.lanes):   # scatter, lane by lane
            with self._lane(k, s.indices):
                lane_value = self.b.extract_element(value, ir.Constant(I32, k)) \
                    if is_vector else value
                ptr = self.em.address(s.buffer, s.indices)
                self.b.store(self.em.to_memory(lane_value, dtype), ptr)

    def _to_memory(self, vec, dtype):
        return self.b.zext(vec, ir.VectorType(I8, self.lanes)) if dtype.kind == "b" else vec

    def _lane(self, k: int, exprs):
        """Lane k's scalars of the loop variable and of the let-bound vectors that `exprs`
        read, in the scalar emitter's environment while inside. Only those: every vector in
        scope a lane was IR that LLVM deleted (a Winograd F(6x6) kernel's 55k lines)."""
        em, var, b = self.em, self.var, self.b
        used = frozenset().union(*(self.free(e) for e in exprs))
        vectors = {v: vec for v, vec in self.vectors.items() if v in used}

        class Lane:
            def __enter__(self_):
                self_.saved = {v: em.env.get(v) for v in [var, *vectors]}
                em.env[var] = ir.Constant(I64, k)
                for v, vec in vectors.items():
                    em.env[v] = b.extract_element(vec, ir.Constant(I32, k))

            def __exit__(self_, *exc):
                for v, old in self_.saved.items():
                    if old is None:
                        em.env.pop(v, None)
                    else:
                        em.env[v] = old

        return Lane()

    def lanewise(self, e: L.Expr) -> ir.Value:
        out = ir.Constant(self.vtype(e.dtype), ir.Undefined)
        for k in range(self.lanes):
            with self._lane(k, (e,)):
                out = self.b.insert_element(out, self.em.expr(e), ir.Constant(I32, k))
        return out

    def expr(self, e: L.Expr) -> tuple[ir.Value, bool]:
        """(value, is_vector): invariant expressions stay scalars; the rest is vector code
        where `_VECTOR_EXPR` has a vector emitter for the node, else lane by lane."""
        free = self.free(e)
        if self.var not in free and not (free & self.vectors.keys()):
            return self.em.expr(e), False
        if e == self.var:
            return ir.Constant(ir.VectorType(I64, self.lanes), list(range(self.lanes))), True
        emit = _VECTOR_EXPR.get(type(e))
        value = None if emit is None else emit(self, e)
        return (self.lanewise(e) if value is None else value), True

    # vector emitters: a vector value, or None for "lane by lane"

    def var(self, e: L.Var) -> ir.Value | None:
        return self.vectors.get(e)

    def load(self, e: L.Load) -> ir.Value | None:
        stride = self._lane_stride(e.indices)
        dtype = e.buffer.dtype
        if stride in (2, 3, 4) and (dtype in _VECTOR_FLOATS or dtype in _STRIDED_INTS):
            return self._strided_load(e, stride)
        if stride is None and dtype.kind != "b":
            return self._gather(e)
        if stride != 1:
            return None
        ptr = self._base_address(e.buffer, e.indices)
        mem = ir.VectorType(memory_type(dtype), self.lanes)
        ptr = self.b.bitcast(ptr, ir.PointerType(mem))
        vec = self.b.load(ptr, typ=mem, align=dtype.itemsize)
        if dtype.kind == "b":
            vec = self.b.icmp_unsigned("!=", vec, ir.Constant(mem, [0] * self.lanes))
        return vec

    def binop(self, e: L.BinOp) -> ir.Value | None:
        key = (op_class(e.a.dtype), e.op)
        if key not in _VECTOR_BINARY or (e.a.dtype.is_float and e.a.dtype not in _VECTOR_FLOATS):
            return None
        return BINARY[key](self.em, *self._both(e.a, e.b))

    def call(self, e: L.Call) -> ir.Value | None:
        if e.name == "bitcast" and e.dtype.kind != "b":
            value, ty = self._as_vector(e.args[0]), self.vtype(e.dtype)
            return value if value.type == ty else self.b.bitcast(value, ty)
        if e.name in _VECTOR_CALLS and e.dtype in _VECTOR_FLOATS:
            return CALLS["f", e.name](self.em, *[self._as_vector(a) for a in e.args])
        if e.name in _VECTOR_INT_CALLS and e.dtype is T.int32:
            return CALLS["s", e.name](self.em, *[self._as_vector(a) for a in e.args])
        if e.name == "pack_u8x4":
            return self.pack_u8x4(e)
        return None

    def pack_u8x4(self, e: L.Call) -> ir.Value:
        """Each lane's 4 bytes as one uint32 (`pack_u8x4`): the 4 byte vectors interleaved
        by one shuffle (where they are loads of a window of a row, the int8 depthwise
        template's words, LLVM makes the loads and the shuffle a few overlapping loads and a
        vpermt2b: 144 x 56 x 56 3x3 129 -> 107 us, 1 thread, znver4; the zero-extended bytes
        shifted and or'ed took 4 loads, 3 shifts and 2 ors a vector. One load of the
        window's span and a shuffle gave the same code at stride 1, and at stride 2 LLVM 22
        built its 34 bytes one at a time)."""
        parts = [self._as_vector(a) for a in e.args]
        lanes = self.lanes
        wide = [self.b.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, 2 * lanes),
                                                        list(range(2 * lanes))))
                for a, b in (parts[:2], parts[2:])]
        # byte t of lane k is part t's lane k: lane k of wide[t // 2]'s half t % 2
        picks = [t * lanes + k for k in range(lanes) for t in range(4)]
        bytes_ = self.b.shuffle_vector(*wide, ir.Constant(ir.VectorType(I32, 4 * lanes), picks))
        return self.b.bitcast(bytes_, self.vtype(T.uint32))

    def select(self, e: L.Select) -> ir.Value | None:
        if e.dtype not in _VECTOR_SELECTS:
            return None
        return self.b.select(self._as_vector(e.cond), *self._both(e.true, e.false))

    def cast(self, e: L.Cast) -> ir.Value | None:
        if not any(e.dtype in group and e.value.dtype in group for group in _VECTOR_CASTS):
            return None
        emit = CASTS[cast_class(e.value.dtype), cast_class(e.dtype)]
        return emit(self.em, self._as_vector(e.value), self.vtype(e.dtype))

    def _as_vector(self, e: L.Expr) -> ir.Value:
        value, is_vector = self.expr(e)
        return value if is_vector else self.splat(value)

    def _both(self, a: L.Expr, b: L.Expr):
        return self._as_vector(a), self._as_vector(b)


_VECTOR_EXPR: dict[type, Callable] = {
    L.Var: VectorLoop.var, L.Load: VectorLoop.load, L.BinOp: VectorLoop.binop,
    L.Call: VectorLoop.call, L.Select: VectorLoop.select, L.Cast: VectorLoop.cast,
}
