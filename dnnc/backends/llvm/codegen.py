"""Render operator-IR PrimFuncs as LLVM IR (llvmlite's IR builder).

Each PrimFunc becomes `void @name(ptr noalias %buf..., i64 %size...)`; a `_packed` twin taking
`(ptr args, ptr sizes)` arrays lets tests and the runtime call any kernel through one ctypes
signature. Parallel loops are outlined into `@name_par<k>(ptr closure, i64 start, i64 end)`
and handed to the runtime's `dnnc_parallel_for`.

A PrimFunc is legalized first (`backends/legalize.py`): what ops mean (sigmoid, sign, floor
division, integer division by zero, float16 arithmetic in float32, ...) is settled there, so
this module only says how LLVM spells the primitive ops that remain, in tables: `_BINARY`,
`_CALLS` and `_CASTS` ((operand class, op) -> emitter), and the statement, loop-kind and
expression dispatch tables. Values live in registers in their own type (float16 as `half`,
bfloat16 as its `i16` bits, which legalize only moves and converts), bool as i1 (i8 in memory).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from llvmlite import ir

from ...ir import loop as L
from ...ir import types as T
from ..legalize import check_legal, legalize

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), \
    ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()

STACK_SCRATCH = 1 << 16
"""Bytes a kernel's scratch buffer may have to live on the stack (else malloc'd)."""

_INT_BITS = {1: I8, 2: I16, 4: I32, 8: I64}
_FLOAT_TYPES = {T.float16: F16, T.float32: F32, T.float64: F64}
_FLOAT_BITS = {F16: 16, F32: 32, F64: 64}

NATIVE: frozenset[str] = frozenset()
"""Legalize rules whose ops this renderer renders itself: none. LLVM has no exact rsqrt or
sigmoid instruction, and its direct double -> half and float -> bfloat conversions call
compiler-rt helpers (__truncdfhf2, __truncsfbf2) the JIT's process may lack."""


def compute_type(dtype: T.DType) -> ir.Type:
    """The register type values of `dtype` are computed in."""
    if dtype.kind == "b":
        return I1
    return _FLOAT_TYPES.get(dtype) or _INT_BITS[dtype.itemsize]   # bfloat16: its bits


def memory_type(dtype: T.DType) -> ir.Type:
    """The type `dtype` is stored as."""
    return I8 if dtype.kind == "b" else compute_type(dtype)


def _class(dtype: T.DType) -> str:
    """`dtype`'s key in the op tables: f(loat), s(igned) or u(nsigned, bool included)."""
    return "f" if dtype.is_float else "s" if dtype.kind == "i" else "u"


def _cast_class(dtype: T.DType) -> str:
    """`dtype`'s key in `_CASTS`: as `_class`, with b(ool) apart."""
    return "b" if dtype.kind == "b" else _class(dtype)


def _suffix(ty: ir.Type) -> str:
    """LLVM's overloaded-intrinsic suffix: f32, i64, v8f32, ..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    return {F16: "f16", F32: "f32", F64: "f64"}.get(ty) or f"i{ty.width}"


def _scalar(ty: ir.Type) -> ir.Type:
    return ty.element if isinstance(ty, ir.VectorType) else ty


def _zero(ty: ir.Type) -> ir.Constant:
    """0 of `ty`, a scalar or a vector type."""
    zero = 0.0 if _scalar(ty) in _FLOAT_BITS else 0
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [zero] * ty.count)
    return ir.Constant(ty, zero)


# ---------------------------------------------------------------------------------------------
# Op tables: each emitter takes the _Emitter (its builder `b`, its module `mb`) and LLVM
# values, scalars or vectors alike.


def _intrinsic(name: str) -> Callable:
    def emit(em, *args):
        return em.b.call(em.mb.intrinsic(name, args[0].type, len(args)), list(args))
    return emit


def _libm(name: str) -> Callable:
    """A C library call: `name` for double, `name`f for float (scalars only)."""
    def emit(em, *args):
        ty = args[0].type
        fname = name + ("f" if ty == F32 else "")
        return em.b.call(em.mb.declare(fname, ty, [ty] * len(args)), list(args))
    return emit


def _int_min_max(pred: str, signed: bool) -> Callable:
    def emit(em, a, b):
        cmp = em.b.icmp_signed if signed else em.b.icmp_unsigned
        return em.b.select(cmp(pred, a, b), a, b)
    return emit


_BINARY: dict[tuple[str, str], Callable] = {
    ("f", "+"): lambda em, a, b: em.b.fadd(a, b),
    ("f", "-"): lambda em, a, b: em.b.fsub(a, b),
    ("f", "*"): lambda em, a, b: em.b.fmul(a, b),
    ("f", "/"): lambda em, a, b: em.b.fdiv(a, b),
    # NaN-propagating, as NumPy's minimum / maximum (minnum would drop the NaN)
    ("f", "min"): _intrinsic("llvm.minimum"),
    ("f", "max"): _intrinsic("llvm.maximum"),
    # ordered compares are false on NaN; != is unordered, so true on NaN (IEEE, NumPy)
    **{("f", op): (lambda em, a, b, op=op: em.b.fcmp_ordered(op, a, b))
       for op in ("==", "<", "<=", ">", ">=")},
    ("f", "!="): lambda em, a, b: em.b.fcmp_unordered("!=", a, b),
    **{(c, op): fn for c in "su" for op, fn in (
        ("+", lambda em, a, b: em.b.add(a, b)), ("-", lambda em, a, b: em.b.sub(a, b)),
        ("*", lambda em, a, b: em.b.mul(a, b)), ("&", lambda em, a, b: em.b.and_(a, b)),
        ("|", lambda em, a, b: em.b.or_(a, b)), ("^", lambda em, a, b: em.b.xor(a, b)),
        ("<<", lambda em, a, b: em.b.shl(a, b)), ("and", lambda em, a, b: em.b.and_(a, b)),
        ("or", lambda em, a, b: em.b.or_(a, b)))},
    ("s", ">>"): lambda em, a, b: em.b.ashr(a, b),
    ("u", ">>"): lambda em, a, b: em.b.lshr(a, b),
    **{("s", op): (lambda em, a, b, op=op: em.b.icmp_signed(op, a, b)) for op in L.COMPARE},
    **{("u", op): (lambda em, a, b, op=op: em.b.icmp_unsigned(op, a, b)) for op in L.COMPARE},
    ("s", "min"): _int_min_max("<", True), ("s", "max"): _int_min_max(">", True),
    ("u", "min"): _int_min_max("<", False), ("u", "max"): _int_min_max(">", False),
}
"""(class of the operands, BinOp op) -> emitter(em, a, b)."""

_CALLS: dict[tuple[str, str], Callable] = {
    # intrinsics with an LLVM counterpart (vectorisable by LLVM); the rest call libm
    **{("f", name): _intrinsic(llvm) for name, llvm in (
        ("exp", "llvm.exp"), ("log", "llvm.log"), ("sqrt", "llvm.sqrt"), ("sin", "llvm.sin"),
        ("cos", "llvm.cos"), ("tan", "llvm.tan"), ("asin", "llvm.asin"),
        ("acos", "llvm.acos"), ("atan", "llvm.atan"), ("sinh", "llvm.sinh"),
        ("cosh", "llvm.cosh"), ("tanh", "llvm.tanh"), ("floor", "llvm.floor"),
        ("ceil", "llvm.ceil"), ("round", "llvm.roundeven"), ("trunc", "llvm.trunc"),
        ("pow", "llvm.pow"), ("fma", "llvm.fmuladd"), ("abs", "llvm.fabs"))},
    **{("f", name): _libm(name) for name in ("erf", "asinh", "acosh", "atanh", "log1p",
                                             "expm1", "fmod", "atan2")},
    ("f", "neg"): lambda em, x: em.b.fneg(x),
    # legalize's primitives: C's truncating quotient and remainder, the divisor made safe
    ("s", "idiv"): lambda em, a, b: em.b.sdiv(a, b),
    ("u", "idiv"): lambda em, a, b: em.b.udiv(a, b),
    ("s", "irem"): lambda em, a, b: em.b.srem(a, b),
    ("u", "irem"): lambda em, a, b: em.b.urem(a, b),
}
"""(class of the first argument, Call name) -> emitter(em, *args); `bitcast` is apart."""


def _resize(signed: bool) -> Callable:
    def emit(em, v, ty):
        src, dst = _scalar(v.type).width, _scalar(ty).width
        if dst < src:
            return em.b.trunc(v, ty)
        if dst > src:
            return em.b.sext(v, ty) if signed else em.b.zext(v, ty)
        return v
    return emit


def _float_resize(em, v, ty):
    src, dst = _FLOAT_BITS[_scalar(v.type)], _FLOAT_BITS[_scalar(ty)]
    if dst == src:
        return v
    return em.b.fpext(v, ty) if dst > src else em.b.fptrunc(v, ty)


_CASTS: dict[tuple[str, str], Callable] = {
    ("f", "f"): _float_resize,
    ("f", "s"): lambda em, v, ty: em.b.fptosi(v, ty),
    ("f", "u"): lambda em, v, ty: em.b.fptoui(v, ty),
    ("s", "f"): lambda em, v, ty: em.b.sitofp(v, ty),
    ("u", "f"): lambda em, v, ty: em.b.uitofp(v, ty),
    ("b", "f"): lambda em, v, ty: em.b.uitofp(v, ty),
    ("f", "b"): lambda em, v, ty: em.b.fcmp_unordered("!=", v, _zero(v.type)),  # NaN: true
    ("s", "b"): lambda em, v, ty: em.b.icmp_unsigned("!=", v, _zero(v.type)),
    ("u", "b"): lambda em, v, ty: em.b.icmp_unsigned("!=", v, _zero(v.type)),
    ("b", "s"): lambda em, v, ty: em.b.zext(v, ty),
    ("b", "u"): lambda em, v, ty: em.b.zext(v, ty),
    ("s", "s"): _resize(True), ("s", "u"): _resize(True),
    ("u", "s"): _resize(False), ("u", "u"): _resize(False),
}
"""(source class, destination class) -> emitter(em, value, destination type)."""


class CodegenError(Exception):
    """A PrimFunc the LLVM backend cannot render (a compiler bug or a GPU-only construct)."""


def workspace_params(func: L.PrimFunc) -> tuple[L.PrimFunc, list[L.Buffer]]:
    """`func` with the GLOBAL scratch buffers that wrap its whole body (static sizes: the
    dense template's packed A) as trailing parameters, and those buffers. The caller gives
    their memory (a segment's arena past its values, the tuner's arrays), so a call
    allocates nothing; scratch left in the body is still allocated per use (`allocate`)."""
    buffers, body = [], func.body
    while isinstance(body, L.Allocate) and body.buffer.scope is L.Scope.GLOBAL and \
            all(isinstance(d, L.Const) for d in body.buffer.shape):
        buffers.append(body.buffer)
        body = body.body
    if not buffers:
        return func, []
    return dataclasses.replace(func, params=tuple(func.params) + tuple(buffers), body=body), \
        buffers


class ModuleBuilder:
    """Collects kernels into one LLVM module."""

    def __init__(self, name: str = "dnnc"):
        self.module = ir.Module(name=name)
        self._decls: dict[str, ir.Function] = {}
        self.parallel_for = ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64]), "dnnc_parallel_for")

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self._decls.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
            self._decls[name] = fn
        return fn

    def intrinsic(self, name: str, ty: ir.Type, nargs: int = 1) -> ir.Function:
        """The overloaded intrinsic `name` on `ty` (scalar or vector): `llvm.exp.v8f32`."""
        return self.declare(f"{name}.{_suffix(ty)}", ty, [ty] * nargs)

    def add(self, func: L.PrimFunc, noalias: bool = True) -> ir.Function:
        """Legalize and render `func`; returns the LLVM function."""
        func = legalize(func, NATIVE)
        check_legal(func, NATIVE)   # (~1% of compile time: mobilenet_v2 44 ms of 5.7 s)
        return _FunctionBuilder(self, func, noalias).build()

    def add_entry(self, name: str, calls: list[tuple[str, list[tuple[str, int]]]]) -> None:
        """`void name(ptr slots, ptr arena)` calling kernels in order; each argument is
        ("ext", k): the pointer in slots[k], or ("arena", offset): arena + offset bytes."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name)
        slots, arena = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        for kernel, args in calls:
            values = []
            for kind, k in args:
                if kind == "ext":
                    slot = b.gep(slots, [ir.Constant(I64, k)], inbounds=True, source_etype=PTR)
                    values.append(b.load(slot, typ=PTR))
                else:
                    values.append(b.gep(arena, [ir.Constant(I64, k)], inbounds=True,
                                        source_etype=I8))
            b.call(self.module.globals[kernel], values)
        b.ret_void()

    def __str__(self) -> str:
        return str(self.module)


def _c_name(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


class _FunctionBuilder:
    def __init__(self, mb: ModuleBuilder, func: L.PrimFunc, noalias: bool):
        self.mb = mb
        self.func = func
        self.noalias = noalias
        self.name = _c_name(func.name)
        self.outlined = 0

    # -- entry points ------------------------------------------------------------------------

    def build(self) -> ir.Function:
        f = self.func
        arg_types = [PTR] * len(f.params) + [I64] * len(f.size_vars)
        fn = ir.Function(self.mb.module, ir.FunctionType(ir.VoidType(), arg_types), self.name)
        for k, b in enumerate(f.params):
            fn.args[k].name = _c_name(b.name)
            if self.noalias:
                fn.args[k].add_attribute("noalias")
        env: dict[L.Var, ir.Value] = {}
        for k, v in enumerate(f.size_vars):
            arg = fn.args[len(f.params) + k]
            arg.name = _c_name(v.name)
            env[v] = arg
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        buffers = {b.name: fn.args[k] for k, b in enumerate(f.params)}
        emitter = _Emitter(self, fn, builder, env, buffers)
        emitter.stmt(f.body)
        emitter.finish()
        self._packed(fn)
        return fn

    def _packed(self, fn: ir.Function) -> None:
        """`void name_packed(ptr args, ptr sizes)`: one signature for every kernel."""
        packed = ir.Function(self.mb.module, ir.FunctionType(ir.VoidType(), [PTR, PTR]),
                             f"{self.name}_packed")
        b = ir.IRBuilder(packed.append_basic_block("entry"))
        args = []
        nparams = len(self.func.params)
        for k in range(nparams):
            slot = b.gep(packed.args[0], [ir.Constant(I64, k)], inbounds=True, source_etype=PTR)
            args.append(b.load(slot, typ=PTR))
        for k in range(len(self.func.size_vars)):
            slot = b.gep(packed.args[1], [ir.Constant(I64, k)], inbounds=True, source_etype=I64)
            args.append(b.load(slot, typ=I64))
        b.call(fn, args)
        b.ret_void()

    def outline_name(self) -> str:
        self.outlined += 1
        return f"{self.name}_par{self.outlined}"


class _Emitter:
    """Emits statements and expressions of one LLVM function."""

    def __init__(self, fb: _FunctionBuilder, fn: ir.Function, builder: ir.IRBuilder,
                 env: dict, buffers: dict):
        self.fb = fb
        self.mb = fb.mb
        self.fn = fn
        self.b = builder
        self.env = env          # Var -> ir.Value
        self.buffers = buffers  # buffer name -> pointer
        self.strides: dict[str, list[ir.Value]] = {}
        # allocas go to a block of their own that runs once per call (see `finish`)
        self.allocas = ir.IRBuilder(fn.entry_basic_block)
        start = fn.append_basic_block("start")
        builder.position_at_end(start)
        self.start = start

    def finish(self) -> None:
        """Close the function: the alloca block falls through to the code."""
        self.b.ret_void()
        self.allocas.branch(self.start)

    def entry_alloca(self, ty: ir.Type, count: int = 1, name: str = "") -> ir.Value:
        """Stack memory allocated once per call, never inside a loop."""
        return self.allocas.alloca(ty, size=None if count == 1 else ir.Constant(I64, count),
                                   name=name)

    def fail(self, what: str):
        raise CodegenError(f"{self.fb.func.name}: {what}")

    # -- statements (dispatched through _STMT) -----------------------------------------------

    def stmt(self, s: L.Stmt) -> None:
        emit = _STMT.get(type(s))
        if emit is None:
            raise CodegenError(f"cannot render {s!r}")
        emit(self, s)

    def seq(self, s: L.Seq) -> None:
        for x in s.stmts:
            self.stmt(x)

    def loop(self, s: L.For) -> None:
        emit = _LOOP.get(s.kind)
        if emit is None:
            self.fail(f"loop bound to {s.kind.value} cannot run on a CPU")
        emit(self, s)

    def store(self, s: L.Store) -> None:
        ptr = self.address(s.buffer, s.indices)
        self.b.store(self.to_memory(self.expr(s.value), s.buffer.dtype), ptr)

    def let(self, s: L.Let) -> None:
        self.env[s.var] = self.expr(s.value)
        self.stmt(s.body)

    def if_(self, s: L.If) -> None:
        cond = self.expr(s.cond)
        if s.orelse is None:
            with self.b.if_then(cond):
                self.stmt(s.then)
        else:
            with self.b.if_else(cond) as (then, otherwise):
                with then:
                    self.stmt(s.then)
                with otherwise:
                    self.stmt(s.orelse)

    def mma(self, s: L.Mma) -> None:
        self.fail(f"mma ({s.precision} tensor-core product) is GPU-only")

    def barrier(self, s: L.Barrier) -> None:
        self.fail("barriers are GPU-only")

    # -- loops (dispatched through _LOOP by kind) --------------------------------------------

    def serial_for(self, s: L.For, start: ir.Value | None = None,
                   end: ir.Value | None = None) -> None:
        lo = start if start is not None else ir.Constant(I64, 0)
        hi = end if end is not None else self.expr(s.extent)
        pre = self.b.block
        header = self.fn.append_basic_block(f"{_c_name(s.var.name)}.header")
        body = self.fn.append_basic_block(f"{_c_name(s.var.name)}.body")
        exit_ = self.fn.append_basic_block(f"{_c_name(s.var.name)}.exit")
        self.b.branch(header)
        self.b.position_at_end(header)
        phi = self.b.phi(I64, name=_c_name(s.var.name))
        phi.add_incoming(lo, pre)
        self.b.cbranch(self.b.icmp_signed("<", phi, hi), body, exit_)
        self.b.position_at_end(body)
        self.env[s.var] = phi
        self.stmt(s.body)
        nxt = self.b.add(phi, ir.Constant(I64, 1), flags=["nsw"])
        phi.add_incoming(nxt, self.b.block)
        self.b.branch(header)
        self.b.position_at_end(exit_)

    def unrolled_for(self, s: L.For) -> None:
        """The body once per iteration, the loop variable a constant in each copy."""
        if not isinstance(s.extent, L.Const):
            return self.serial_for(s)
        for k in range(s.extent.value):
            self.env[s.var] = ir.Constant(I64, k)
            self.stmt(s.body)

    def vectorized_for(self, s: L.For) -> None:
        """Straight-line vector code for bodies without control flow, of 2 to 64 lanes."""
        if isinstance(s.extent, L.Const) and 2 <= s.extent.value <= 64 and \
                _vectorizable(s.body):
            return _VectorLoop(self, s).emit()
        self.serial_for(s)

    def parallel_for(self, s: L.For) -> None:
        """Outline the loop body into `f(closure, start, end)`; run it on the pool."""
        captured_vars = sorted((v for v in L.free_vars(s.body) if v != s.var),
                               key=lambda v: v.name)
        captured_vars += [v for v in self._shape_vars(s.body) if v not in captured_vars]
        names = sorted({n.buffer.name for n in L.walk(s.body)
                        if isinstance(n, (L.Load, L.Store))} & set(self.buffers))
        missing = [v.name for v in captured_vars if v not in self.env]
        if missing:
            self.fail(f"unbound {missing} in a parallel loop")
        values = [self.env[v] for v in captured_vars] + [self.buffers[n] for n in names]
        closure_ty = ir.LiteralStructType([v.type for v in values])
        closure = self.entry_alloca(closure_ty, name="closure")
        for k, v in enumerate(values):
            self.b.store(v, self.b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, k)],
                                       inbounds=True))
        outlined = ir.Function(self.mb.module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]),
                               self.fb.outline_name())
        outlined.linkage = "internal"
        ob = ir.IRBuilder(outlined.append_basic_block("entry"))
        env, buffers = {}, {}
        for k, v in enumerate(values):
            slot = ob.gep(outlined.args[0], [ir.Constant(I32, 0), ir.Constant(I32, k)],
                          inbounds=True, source_etype=closure_ty)
            loaded = ob.load(slot, typ=v.type)
            if k < len(captured_vars):
                env[captured_vars[k]] = loaded
            else:
                buffers[names[k - len(captured_vars)]] = loaded
        inner = _Emitter(self.fb, outlined, ob, env, buffers)
        inner.serial_for(s, start=outlined.args[1], end=outlined.args[2])
        inner.finish()
        self.b.call(self.mb.parallel_for, [outlined, closure, self.expr(s.extent)])

    def _shape_vars(self, node) -> list[L.Var]:
        out: list[L.Var] = []
        for n in L.walk(node):
            if isinstance(n, (L.Load, L.Store)):
                for d in n.buffer.shape:
                    for v in L.free_vars(d):
                        if v not in out:
                            out.append(v)
        return out

    def allocate(self, s: L.Allocate) -> None:
        buf = s.buffer
        ty = memory_type(buf.dtype)
        count = self.expr(_product(buf.shape))
        static = all(isinstance(d, L.Const) for d in buf.shape)
        size = math.prod(d.value for d in buf.shape) if static else None
        if static and size * buf.dtype.itemsize <= STACK_SCRATCH:
            # small scratch: on the stack, allocated once in the entry block
            ptr = self.entry_alloca(ty, max(size, 1), name=_c_name(buf.name))
            ptr.align = 64
            self.buffers[buf.name] = ptr
            self.stmt(s.body)
        else:
            malloc = self.mb.declare("malloc", PTR, [I64])
            free = self.mb.declare("free", ir.VoidType(), [PTR])
            nbytes = self.b.mul(count, ir.Constant(I64, buf.dtype.itemsize))
            ptr = self.b.call(malloc, [nbytes], name=_c_name(buf.name))
            self.buffers[buf.name] = ptr
            self.stmt(s.body)
            self.b.call(free, [ptr])
        del self.buffers[buf.name]
        self.strides.pop(buf.name, None)

    # -- memory ------------------------------------------------------------------------------

    def address(self, buf: L.Buffer, indices) -> ir.Value:
        """Row-major element address; static strides are folded as constants (LLVM folds
        constant index terms, so no IR-level simplification is needed here)."""
        base = self.buffers.get(buf.name)
        if base is None:
            self.fail(f"buffer {buf.name} is not in scope")
        offset: ir.Value | None = None
        stride: int | ir.Value = 1
        for idx, dim in reversed(list(zip(indices, buf.shape))):
            if isinstance(idx, L.Const) and idx.value == 0:
                term = None
            elif isinstance(stride, int):
                value = self.expr(idx)
                term = value if stride == 1 else self.b.mul(value, ir.Constant(I64, stride),
                                                            flags=["nsw"])
            else:
                term = self.b.mul(self.expr(idx), stride, flags=["nsw"])
            if term is not None:
                offset = term if offset is None else self.b.add(offset, term, flags=["nsw"])
            if isinstance(dim, L.Const) and isinstance(stride, int):
                stride = stride * dim.value
            else:
                dim_value = self.expr(dim)
                stride = self.b.mul(ir.Constant(I64, stride) if isinstance(stride, int)
                                    else stride, dim_value, flags=["nsw"])
        if offset is None:
            offset = ir.Constant(I64, 0)
        return self.b.gep(base, [offset], inbounds=True, source_etype=memory_type(buf.dtype))

    def to_memory(self, value: ir.Value, dtype: T.DType) -> ir.Value:
        """A register value as stored: bool's i1 widens to i8, the rest is stored as is."""
        return self.b.zext(value, I8) if dtype.kind == "b" else value

    def from_memory(self, value: ir.Value, dtype: T.DType) -> ir.Value:
        return self.b.icmp_unsigned("!=", value, ir.Constant(I8, 0)) if dtype.kind == "b" \
            else value

    # -- expressions (dispatched through _EXPR) ----------------------------------------------

    def expr(self, e: L.Expr) -> ir.Value:
        emit = _EXPR.get(type(e))
        if emit is None:
            raise CodegenError(f"cannot render {e!r}")
        return emit(self, e)

    def constant(self, e: L.Const) -> ir.Constant:
        dtype, value = e.dtype, e.value
        if dtype.kind == "b":
            return ir.Constant(I1, int(bool(value)))
        if dtype.is_int:
            return ir.Constant(compute_type(dtype), int(value))
        value = dtype.np.type(value)   # rounded to the dtype's own precision
        if dtype is T.bfloat16:
            return ir.Constant(I16, int(value.view("uint16")))
        return ir.Constant(compute_type(dtype), float(value))

    def var(self, e: L.Var) -> ir.Value:
        value = self.env.get(e)
        if value is None:
            self.fail(f"variable {e.name} is unbound")
        return value

    def load(self, e: L.Load) -> ir.Value:
        ptr = self.address(e.buffer, e.indices)
        return self.from_memory(self.b.load(ptr, typ=memory_type(e.buffer.dtype)),
                                e.buffer.dtype)

    def select(self, e: L.Select) -> ir.Value:
        return self.b.select(self.expr(e.cond), self.expr(e.true), self.expr(e.false))

    def binop(self, e: L.BinOp) -> ir.Value:
        emit = _BINARY.get((_class(e.a.dtype), e.op))
        if emit is None:
            self.fail(f"no LLVM rendering for operator {e.op} on {e.a.dtype.name} (legalized?)")
        return emit(self, self.expr(e.a), self.expr(e.b))

    def call(self, e: L.Call) -> ir.Value:
        args = [self.expr(a) for a in e.args]
        src = e.args[0].dtype
        if e.name == "bitcast":   # through the memory representations, which share a width
            bits = self.to_memory(args[0], src)
            ty = memory_type(e.dtype)
            return self.from_memory(bits if bits.type == ty else self.b.bitcast(bits, ty),
                                    e.dtype)
        emit = _CALLS.get((_class(src), e.name))
        if emit is None:
            self.fail(f"no LLVM rendering for intrinsic {e.name} on {src.name} (legalized?)")
        return emit(self, *args)

    def cast(self, e: L.Cast) -> ir.Value:
        value, src, dst = self.expr(e.value), e.value.dtype, e.dtype
        if src is dst:
            return value
        emit = _CASTS[_cast_class(src), _cast_class(dst)]
        return emit(self, value, compute_type(dst))

    def reduce(self, e: L.Reduce) -> ir.Value:
        self.fail("Reduce must be lowered before codegen")


_STMT: dict[type, Callable] = {
    L.Seq: _Emitter.seq, L.For: _Emitter.loop, L.Store: _Emitter.store, L.Let: _Emitter.let,
    L.If: _Emitter.if_, L.Allocate: _Emitter.allocate, L.Barrier: _Emitter.barrier,
    L.Mma: _Emitter.mma,
}
_LOOP: dict[L.ForKind, Callable] = {
    L.ForKind.SERIAL: _Emitter.serial_for, L.ForKind.PARALLEL: _Emitter.parallel_for,
    L.ForKind.UNROLLED: _Emitter.unrolled_for, L.ForKind.VECTORIZED: _Emitter.vectorized_for,
}
"""Loop kind -> emitter; GPU-bound kinds are missing on purpose (a CodegenError)."""
_EXPR: dict[type, Callable] = {
    L.Const: _Emitter.constant, L.Var: _Emitter.var, L.Load: _Emitter.load,
    L.BinOp: _Emitter.binop, L.Call: _Emitter.call, L.Cast: _Emitter.cast,
    L.Select: _Emitter.select, L.Reduce: _Emitter.reduce,
}


def _product(dims) -> L.Expr:
    out: L.Expr = L.const(1)
    for d in dims:
        out = out * d
    return L.simplify_expr(out)


# ---------------------------------------------------------------------------------------------
# Explicit vectorisation of VECTORIZED loops of constant extent


def _vectorizable(body: L.Stmt) -> bool:
    """Bodies of stores and lets only (no control flow) become straight-line vector code."""
    if isinstance(body, L.Seq):
        return all(_vectorizable(x) for x in body.stmts)
    if isinstance(body, L.Let):
        return _vectorizable(body.body)
    return isinstance(body, L.Store)


def _lane_coefficient(e: L.Expr, var: L.Var, vector_vars) -> int | None:
    """The coefficient of `var` in `e` when `e` is affine in it (0: invariant), else None."""
    free = L.free_vars(e)
    if var not in free and not (free & vector_vars):
        return 0
    if e == var:
        return 1
    if isinstance(e, L.BinOp) and e.op in ("+", "-"):
        a = _lane_coefficient(e.a, var, vector_vars)
        b = _lane_coefficient(e.b, var, vector_vars)
        if a is None or b is None:
            return None
        return a + b if e.op == "+" else a - b
    if isinstance(e, L.BinOp) and e.op == "*":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, L.Const):
                cx = _lane_coefficient(x, var, vector_vars)
                return None if cx is None else cx * y.value
    return None


_VECTOR_FLOATS = (T.float32, T.float64)
_VECTOR_BINARY = {("f", op) for op in ("+", "-", "*", "/", "min", "max", *L.COMPARE)} | \
    {(c, op) for c in "su" for op in ("+", "-", "*", "&", "|", "^", "<<", ">>")}
"""`_BINARY` entries emitted as vector instructions (floats: on _VECTOR_FLOATS); the bit
operations serve legalized bfloat16 conversions."""
_VECTOR_CALLS = {"fma", "exp", "log", "sqrt", "floor", "ceil", "round", "trunc", "abs", "neg"}
"""`_CALLS` entries emitted as vector intrinsics on _VECTOR_FLOATS; the rest lane by lane."""
_VECTOR_SELECTS = (T.float32, T.float64, T.uint32)
"""Selects of these dtypes are vector selects (uint32: bfloat16 rounding's NaN case)."""
_VECTOR_CASTS = ((T.float16, T.float32, T.float64), (T.uint16, T.uint32))
"""Casts within one of these groups are vector instructions: float16 and bfloat16 data
computed in float32 (fpext / fptrunc, and the zext / trunc of bfloat16's bits). Float to
integer stays lane by lane: out of range, LLVM's vector and scalar conversions differ (both
are undefined there, as in C; NumPy's result is the scalar one)."""


class _VectorLoop:
    """Straight-line vector code for `for v in range(L): body`: contiguous loads and stores
    become vector memory operations, arithmetic vector instructions, anything else is
    computed lane by lane (always correct, fast where it matters)."""

    def __init__(self, em: "_Emitter", loop: L.For):
        self.em = em
        self.b = em.b
        self.var = loop.var
        self.lanes = loop.extent.value
        self.body = loop.body
        self.vectors: dict[L.Var, ir.Value] = {}   # let-bound vector values

    def emit(self) -> None:
        self.stmt(self.body)

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
        coefs = [_lane_coefficient(i, self.var, set(self.vectors)) for i in indices]
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
            with self._lane(k):
                lane_value = self.b.extract_element(value, ir.Constant(I32, k)) \
                    if is_vector else value
                ptr = self.em.address(s.buffer, s.indices)
                self.b.store(self.em.to_memory(lane_value, dtype), ptr)

    def _to_memory(self, vec, dtype):
        return self.b.zext(vec, ir.VectorType(I8, self.lanes)) if dtype.kind == "b" else vec

    def _lane(self, k: int):
        em, var, vectors = self.em, self.var, self.vectors
        b = self.b

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
            with self._lane(k):
                out = self.b.insert_element(out, self.em.expr(e), ir.Constant(I32, k))
        return out

    def expr(self, e: L.Expr) -> tuple[ir.Value, bool]:
        """(value, is_vector): invariant expressions stay scalars; the rest is vector code
        where `_VECTOR_EXPR` has a vector emitter for the node, else lane by lane."""
        free = L.free_vars(e)
        if self.var not in free and not (free & set(self.vectors)):
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
        if stride in (2, 3, 4) and dtype in _VECTOR_FLOATS:
            return self._strided_load(e, stride)
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
        key = (_class(e.a.dtype), e.op)
        if key not in _VECTOR_BINARY or (e.a.dtype.is_float and e.a.dtype not in _VECTOR_FLOATS):
            return None
        return _BINARY[key](self.em, *self._both(e.a, e.b))

    def call(self, e: L.Call) -> ir.Value | None:
        if e.name == "bitcast" and e.dtype.kind != "b":
            value, ty = self._as_vector(e.args[0]), self.vtype(e.dtype)
            return value if value.type == ty else self.b.bitcast(value, ty)
        if e.name in _VECTOR_CALLS and e.dtype in _VECTOR_FLOATS:
            return _CALLS["f", e.name](self.em, *[self._as_vector(a) for a in e.args])
        return None

    def select(self, e: L.Select) -> ir.Value | None:
        if e.dtype not in _VECTOR_SELECTS:
            return None
        return self.b.select(self._as_vector(e.cond), *self._both(e.true, e.false))

    def cast(self, e: L.Cast) -> ir.Value | None:
        if not any(e.dtype in group and e.value.dtype in group for group in _VECTOR_CASTS):
            return None
        emit = _CASTS[_cast_class(e.value.dtype), _cast_class(e.dtype)]
        return emit(self.em, self._as_vector(e.value), self.vtype(e.dtype))

    def _as_vector(self, e: L.Expr) -> ir.Value:
        value, is_vector = self.expr(e)
        return value if is_vector else self.splat(value)

    def _both(self, a: L.Expr, b: L.Expr):
        return self._as_vector(a), self._as_vector(b)


_VECTOR_EXPR: dict[type, Callable] = {
    L.Var: _VectorLoop.var, L.Load: _VectorLoop.load, L.BinOp: _VectorLoop.binop,
    L.Call: _VectorLoop.call, L.Select: _VectorLoop.select, L.Cast: _VectorLoop.cast,
}
