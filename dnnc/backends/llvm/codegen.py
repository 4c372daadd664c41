"""Render operator-IR PrimFuncs as LLVM IR (llvmlite's IR builder).

Each PrimFunc becomes `void @name(ptr noalias %buf..., i64 %size...)`; a `_packed` twin taking
`(ptr args, ptr sizes)` arrays lets tests and the runtime call any kernel through one ctypes
signature. Parallel loops are outlined into `@name_par<k>(ptr closure, i64 start, i64 end)`
and handed to the runtime's `dnnc_parallel_for`.

Values live in registers in their *compute* type: float16 and bfloat16 are computed in float32
(rounded to their precision at casts and stores), bool is i1 (i8 in memory). Integer `//` and
`%` floor as in Python, cheaply when bounds prove both operands non-negative; float `%` is fmod.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ...ir import loop as L
from ...ir import types as T

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), \
    ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()

_INT_BITS = {1: I8, 2: I16, 4: I32, 8: I64}


def compute_type(dtype: T.DType) -> ir.Type:
    """The register type values of `dtype` are computed in."""
    if dtype.kind == "b":
        return I1
    if dtype.is_int:
        return _INT_BITS[dtype.itemsize]
    return F64 if dtype is T.float64 else F32


def memory_type(dtype: T.DType) -> ir.Type:
    """The type `dtype` is stored as."""
    if dtype.kind == "b":
        return I8
    if dtype is T.float16:
        return F16
    if dtype is T.bfloat16:
        return I16
    return compute_type(dtype)


# intrinsics with an LLVM counterpart (vectorisable by LLVM); the rest call libm
_LLVM_INTRINSIC = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt",
                   "sin": "llvm.sin", "cos": "llvm.cos", "floor": "llvm.floor",
                   "ceil": "llvm.ceil", "round": "llvm.roundeven", "trunc": "llvm.trunc",
                   "pow": "llvm.pow", "tan": "llvm.tan", "asin": "llvm.asin",
                   "acos": "llvm.acos", "atan": "llvm.atan", "sinh": "llvm.sinh",
                   "cosh": "llvm.cosh", "tanh": "llvm.tanh", "fma": "llvm.fmuladd"}
_LIBM = {"erf": "erf", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
         "log1p": "log1p", "expm1": "expm1", "fmod": "fmod", "atan2": "atan2"}


class CodegenError(Exception):
    """A PrimFunc the LLVM backend cannot render (a compiler bug or a GPU-only construct)."""


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
        suffix = {F32: "f32", F64: "f64"}.get(ty) or f"i{ty.width}"
        return self.declare(f"{name}.{suffix}", ty, [ty] * nargs)

    def add(self, func: L.PrimFunc, noalias: bool = True) -> ir.Function:
        """Render `func`; returns the LLVM function."""
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
        bounds: dict[L.Var, L.Bounds] = {}
        for k, v in enumerate(f.size_vars):
            arg = fn.args[len(f.params) + k]
            arg.name = _c_name(v.name)
            env[v] = arg
            bounds[v] = L.Bounds(1, None)
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        buffers = {b.name: fn.args[k] for k, b in enumerate(f.params)}
        emitter = _Emitter(self, fn, builder, env, bounds, buffers)
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
                 env: dict, bounds: dict, buffers: dict):
        self.fb = fb
        self.mb = fb.mb
        self.fn = fn
        self.b = builder
        self.env = env          # Var -> ir.Value
        self.bounds = bounds    # Var -> Bounds, for cheap division
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

    # -- statements --------------------------------------------------------------------------

    def stmt(self, s: L.Stmt) -> None:
        if isinstance(s, L.Seq):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, L.For):
            if s.kind is L.ForKind.PARALLEL:
                self.parallel_for(s)
            elif s.kind.is_gpu_block or s.kind.is_gpu_thread:
                raise CodegenError(f"{self.fb.func.name}: loop bound to {s.kind.value} cannot "
                                   f"run on a CPU")
            elif s.kind is L.ForKind.UNROLLED and isinstance(s.extent, L.Const):
                self.unrolled_for(s)
            elif s.kind is L.ForKind.VECTORIZED and isinstance(s.extent, L.Const) and \
                    2 <= s.extent.value <= 64 and _vectorizable(s.body):
                _VectorLoop(self, s).emit()
            else:
                self.serial_for(s)
        elif isinstance(s, L.Store):
            ptr = self.address(s.buffer, s.indices)
            value = self.expr(s.value)
            self.b.store(self.to_memory(value, s.buffer.dtype), ptr)
        elif isinstance(s, L.Let):
            self.env[s.var] = self.expr(s.value)
            self.bounds[s.var] = L.bounds(s.value, self.bounds)
            self.stmt(s.body)
        elif isinstance(s, L.If):
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
        elif isinstance(s, L.Allocate):
            self.allocate(s)
        elif isinstance(s, L.Barrier):
            raise CodegenError(f"{self.fb.func.name}: barriers are GPU-only")
        else:
            raise CodegenError(f"cannot render {s!r}")

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
        hi_bound = L.bounds(s.extent, self.bounds).hi
        self.bounds[s.var] = L.Bounds(0, None if hi_bound is None else hi_bound - 1)
        self.stmt(s.body)
        nxt = self.b.add(phi, ir.Constant(I64, 1), flags=["nsw"])
        phi.add_incoming(nxt, self.b.block)
        self.b.branch(header)
        self.b.position_at_end(exit_)

    def unrolled_for(self, s: L.For) -> None:
        """The body once per iteration, the loop variable a constant in each copy."""
        for k in range(s.extent.value):
            self.env[s.var] = ir.Constant(I64, k)
            self.bounds[s.var] = L.Bounds(k, k)
            self.stmt(s.body)

    def parallel_for(self, s: L.For) -> None:
        """Outline the loop body into `f(closure, start, end)`; run it on the pool."""
        captured_vars = sorted((v for v in L.free_vars(s.body) if v != s.var),
                               key=lambda v: v.name)
        captured_vars += [v for v in self._shape_vars(s.body) if v not in captured_vars]
        names = sorted({n.buffer.name for n in L.walk(s.body)
                        if isinstance(n, (L.Load, L.Store))} & set(self.buffers))
        missing = [v.name for v in captured_vars if v not in self.env]
        if missing:
            raise CodegenError(f"{self.fb.func.name}: unbound {missing} in a parallel loop")
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
        inner = _Emitter(self.fb, outlined, ob, env, dict(self.bounds), buffers)
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
        if static and size * buf.dtype.itemsize <= 1 << 16:
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
            raise CodegenError(f"{self.fb.func.name}: buffer {buf.name} is not in scope")
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
        if dtype.kind == "b":
            return self.b.zext(value, I8)
        if dtype is T.float16:
            return self.b.fptrunc(value, F16)
        if dtype is T.bfloat16:
            return self.b.trunc(self.b.lshr(self._round_bf16_bits(value), ir.Constant(I32, 16)),
                                I16)
        return value

    def from_memory(self, value: ir.Value, dtype: T.DType) -> ir.Value:
        if dtype.kind == "b":
            return self.b.icmp_unsigned("!=", value, ir.Constant(I8, 0))
        if dtype is T.float16:
            return self.b.fpext(value, F32)
        if dtype is T.bfloat16:
            wide = self.b.shl(self.b.zext(value, I32), ir.Constant(I32, 16))
            return self.b.bitcast(wide, F32)
        return value

    def _round_bf16_bits(self, value: ir.Value) -> ir.Value:
        """float32 bits rounded to bfloat16 (nearest even; NaN stays NaN)."""
        bits = self.b.bitcast(value, I32)
        lsb = self.b.and_(self.b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
        rounded = self.b.add(bits, self.b.add(ir.Constant(I32, 0x7FFF), lsb))
        is_nan = self.b.fcmp_unordered("uno", value, value)
        return self.b.select(is_nan, self.b.or_(bits, ir.Constant(I32, 0x400000)), rounded)

    # -- expressions -------------------------------------------------------------------------

    def expr(self, e: L.Expr) -> ir.Value:
        if isinstance(e, L.Const):
            return self.constant(e.value, e.dtype)
        if isinstance(e, L.Var):
            try:
                return self.env[e]
            except KeyError:
                raise CodegenError(f"{self.fb.func.name}: variable {e.name} is unbound") \
                    from None
        if isinstance(e, L.Load):
            ptr = self.address(e.buffer, e.indices)
            return self.from_memory(self.b.load(ptr, typ=memory_type(e.buffer.dtype)),
                                    e.buffer.dtype)
        if isinstance(e, L.BinOp):
            return self.binop(e)
        if isinstance(e, L.Cast):
            return self.cast(self.expr(e.value), e.value.dtype, e.dtype)
        if isinstance(e, L.Select):
            return self.b.select(self.expr(e.cond), self.expr(e.true), self.expr(e.false))
        if isinstance(e, L.Call):
            return self.call(e)
        if isinstance(e, L.Reduce):
            raise CodegenError(f"{self.fb.func.name}: Reduce must be lowered before codegen")
        raise CodegenError(f"cannot render {e!r}")

    def constant(self, value, dtype: T.DType) -> ir.Constant:
        ty = compute_type(dtype)
        if dtype.kind == "b":
            return ir.Constant(I1, int(bool(value)))
        if dtype.is_int:
            return ir.Constant(ty, int(value))
        value = float(value)
        if dtype is T.float16:
            value = float(__import__("numpy").float16(value))
        elif dtype is T.bfloat16:
            value = float(T.bfloat16.np.type(value))
        return ir.Constant(ty, value)

    def binop(self, e: L.BinOp) -> ir.Value:
        a, b = self.expr(e.a), self.expr(e.b)
        dt = e.a.dtype
        op = e.op
        bld = self.b
        if op in ("and", "or"):
            return bld.and_(a, b) if op == "and" else bld.or_(a, b)
        if dt.is_float:
            if op in L.COMPARE:
                return bld.fcmp_unordered("!=", a, b) if op == "!=" else \
                    bld.fcmp_ordered(op, a, b)
            if op == "+":
                out = bld.fadd(a, b)
            elif op == "-":
                out = bld.fsub(a, b)
            elif op == "*":
                out = bld.fmul(a, b)
            elif op == "/":
                out = bld.fdiv(a, b)
            elif op == "//":
                out = bld.call(self.mb.intrinsic("llvm.floor", a.type), [bld.fdiv(a, b)])
            elif op == "%":
                out = bld.frem(a, b)
            elif op in ("min", "max"):
                # NaN-propagating, as NumPy's minimum / maximum
                name = "llvm.minimum" if op == "min" else "llvm.maximum"
                out = bld.call(self.mb.intrinsic(name, a.type, 2), [a, b])
            else:
                raise CodegenError(f"operator {op} on floats")
            return self._round_to(out, dt)
        signed = dt.kind == "i"
        if op in L.COMPARE:
            return bld.icmp_signed(op, a, b) if signed else bld.icmp_unsigned(op, a, b)
        if op == "+":
            return bld.add(a, b)
        if op == "-":
            return bld.sub(a, b)
        if op == "*":
            return bld.mul(a, b)
        if op in ("min", "max"):
            pick = (bld.icmp_signed if signed else bld.icmp_unsigned)(
                "<" if op == "min" else ">", a, b)
            return bld.select(pick, a, b)
        if op == "&":
            return bld.and_(a, b)
        if op == "|":
            return bld.or_(a, b)
        if op == "^":
            return bld.xor(a, b)
        if op == "<<":
            return bld.shl(a, b)
        if op == ">>":
            return bld.ashr(a, b) if signed else bld.lshr(a, b)
        if op in ("//", "%", "/"):
            return self.int_divmod(op, e, a, b, signed)
        raise CodegenError(f"operator {op} on integers")

    def int_divmod(self, op, e: L.BinOp, a, b, signed: bool) -> ir.Value:
        """Integer `/` (truncating), `//` and `%` (floor) without a trap: x / 0 and x % 0 are
        0, MIN / -1 wraps to MIN and MIN % -1 is 0, as the numpy target's (`ir/ops/
        elementwise.py`). LLVM's sdiv by 0 or of MIN by -1 is undefined even where a select
        discards it, so the divisor itself is made safe (1) first; by 1 the quotient of MIN
        is MIN and the remainder 0, as wanted, and a zero divisor's result becomes 0."""
        bld = self.b
        ba, bb = L.bounds(e.a, self.bounds), L.bounds(e.b, self.bounds)
        by_zero = None
        if bb.lo is None or bb.lo <= 0:   # (index arithmetic divides by positive constants)
            zero, one = ir.Constant(b.type, 0), ir.Constant(b.type, 1)
            by_zero = bld.icmp_signed("==", b, zero)
            unsafe = by_zero
            if signed and (bb.lo is None or bb.lo <= -1) and (bb.hi is None or bb.hi >= -1):
                minimum = ir.Constant(a.type, -(1 << (a.type.width - 1)))
                overflow = bld.and_(bld.icmp_signed("==", a, minimum),
                                    bld.icmp_signed("==", b, ir.Constant(b.type, -1)))
                unsafe = bld.or_(unsafe, overflow)
            b = bld.select(unsafe, one, b)
        out = self._divmod(op, a, b, signed, ba, bb)
        if by_zero is not None:
            out = bld.select(by_zero, ir.Constant(out.type, 0), out)
        return out

    def _divmod(self, op, a, b, signed: bool, ba: L.Bounds, bb: L.Bounds) -> ir.Value:
        """`a op b` for a divisor that does not trap."""
        bld = self.b
        if not signed:
            return bld.udiv(a, b) if op in ("//", "/") else bld.urem(a, b)
        if op == "/":  # C division
            return bld.sdiv(a, b)
        if ba.lo is not None and ba.lo >= 0 and bb.lo is not None and bb.lo > 0:
            return bld.udiv(a, b) if op in ("//", "/") else bld.urem(a, b)
        q = bld.sdiv(a, b)
        r = bld.srem(a, b)
        zero = ir.Constant(a.type, 0)
        # floor semantics: adjust when the remainder is non-zero and signs differ
        adjust = bld.and_(bld.icmp_signed("!=", r, zero),
                          bld.icmp_signed("!=", bld.icmp_signed("<", r, zero),
                                          bld.icmp_signed("<", b, zero)))
        if op == "//":
            return bld.sub(q, bld.zext(adjust, a.type))
        return bld.select(adjust, bld.add(r, b), r)

    def _round_to(self, value: ir.Value, dtype: T.DType) -> ir.Value:
        """Round a float32 register to float16 / bfloat16 precision (others unchanged)."""
        if dtype is T.float16:
            return self.b.fpext(self.b.fptrunc(value, F16), F32)
        if dtype is T.bfloat16:
            bits = self.b.and_(self._round_bf16_bits(value), ir.Constant(I32, 0xFFFF0000))
            return self.b.bitcast(bits, F32)
        return value

    def cast(self, v: ir.Value, src: T.DType, dst: T.DType) -> ir.Value:
        bld = self.b
        if src is dst:
            return v
        ty = compute_type(dst)
        if dst.kind == "b":
            if src.is_float:
                return bld.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
            return bld.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        if src.kind == "b":
            return bld.uitofp(v, ty) if dst.is_float else bld.zext(v, ty)
        if src.is_float and dst.is_float:
            if src is T.float64 and dst is T.float16:
                return self._round_to(self._f64_to_f32_odd(v), dst)
            if v.type != ty:
                v = bld.fpext(v, ty) if ty == F64 else bld.fptrunc(v, ty)
            return self._round_to(v, dst)
        if src.is_float:
            return bld.fptosi(v, ty) if dst.kind == "i" else bld.fptoui(v, ty)
        if dst.is_float:
            out = bld.sitofp(v, ty) if src.kind == "i" else bld.uitofp(v, ty)
            return self._round_to(out, dst)
        if ty.width < v.type.width:
            return bld.trunc(v, ty)
        if ty.width > v.type.width:
            return bld.sext(v, ty) if src.kind == "i" else bld.zext(v, ty)
        return v

    def _f64_to_f32_odd(self, v: ir.Value) -> ir.Value:
        """float64 -> float32 rounded to odd, so that a second rounding to float16 equals
        NumPy's single one (1 + 2**-11 + 2**-40 would tie at float32 and round down); a
        direct fptrunc to half needs __truncdfhf2, which the JIT's process may lack."""
        bld = self.b
        r = bld.fptrunc(v, F32)
        back = bld.fpext(r, F64)
        fabs = self.mb.intrinsic("llvm.fabs", F64)
        bits = bld.bitcast(r, I32)
        # round toward zero: one step down in magnitude when rounding went up
        up = bld.fcmp_ordered(">", bld.call(fabs, [back]), bld.call(fabs, [v]))
        bits = bld.select(up, bld.sub(bits, ir.Constant(I32, 1)), bits)
        inexact = bld.fcmp_ordered("!=", back, v)
        bits = bld.select(inexact, bld.or_(bits, ir.Constant(I32, 1)), bits)
        return bld.bitcast(bits, F32)

    def call(self, e: L.Call) -> ir.Value:
        bld = self.b
        args = [self.expr(a) for a in e.args]
        x = args[0]
        dt = e.args[0].dtype
        name = e.name
        if name == "bitcast":  # through the memory representations, which share a width
            bits = bld.bitcast(self.to_memory(x, dt), memory_type(e.dtype))
            return self.from_memory(bits, e.dtype)
        if name == "isnan":
            return bld.fcmp_unordered("uno", x, x) if dt.is_float else ir.Constant(I1, 0)
        if name == "isinf":
            if not dt.is_float:
                return ir.Constant(I1, 0)
            absx = bld.call(self.mb.intrinsic("llvm.fabs", x.type), [x])
            return bld.fcmp_ordered("==", absx, ir.Constant(x.type, math.inf))
        if name == "not":  # logical not, as np.logical_not (any dtype in, bool out)
            if dt.kind == "b":
                return bld.xor(x, ir.Constant(x.type, 1))
            if dt.is_float:
                return bld.fcmp_ordered("==", x, ir.Constant(x.type, 0.0))
            return bld.icmp_unsigned("==", x, ir.Constant(x.type, 0))
        if name == "neg":
            return bld.fneg(x) if dt.is_float else bld.sub(ir.Constant(x.type, 0), x)
        if name == "abs":
            if dt.is_float:
                return bld.call(self.mb.intrinsic("llvm.fabs", x.type), [x])
            if dt.kind == "u":
                return x
            neg = bld.icmp_signed("<", x, ir.Constant(x.type, 0))
            return bld.select(neg, bld.sub(ir.Constant(x.type, 0), x), x)
        if name == "sign":
            zero = ir.Constant(x.type, 0.0 if dt.is_float else 0)
            one = ir.Constant(x.type, 1.0 if dt.is_float else 1)
            minus = ir.Constant(x.type, -1.0 if dt.is_float else -1)
            if dt.is_float:
                pos = bld.select(bld.fcmp_ordered(">", x, zero), one, zero)
                out = bld.select(bld.fcmp_ordered("<", x, zero), minus, pos)
                return bld.select(bld.fcmp_unordered("uno", x, x), x, out)
            gt = bld.icmp_signed(">", x, zero) if dt.kind == "i" else \
                bld.icmp_unsigned(">", x, zero)
            pos = bld.select(gt, one, zero)
            if dt.kind == "u":
                return pos
            return bld.select(bld.icmp_signed("<", x, zero), minus, pos)
        if not dt.is_float:
            raise CodegenError(f"intrinsic {name} on {dt.name}")
        if name == "sigmoid":
            ex = bld.call(self.mb.intrinsic("llvm.exp", x.type), [bld.fneg(x)])
            out = bld.fdiv(ir.Constant(x.type, 1.0), bld.fadd(ir.Constant(x.type, 1.0), ex))
        elif name == "rsqrt":
            sq = bld.call(self.mb.intrinsic("llvm.sqrt", x.type), [x])
            out = bld.fdiv(ir.Constant(x.type, 1.0), sq)
        elif name in _LLVM_INTRINSIC:
            out = bld.call(self.mb.intrinsic(_LLVM_INTRINSIC[name], x.type, len(args)), args)
        elif name in _LIBM:
            fname = _LIBM[name] + ("f" if x.type == F32 else "")
            out = bld.call(self.mb.declare(fname, x.type, [x.type] * len(args)), args)
        else:
            raise CodegenError(f"no LLVM rendering for intrinsic {name}")
        return self._round_to(out, e.dtype)


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


_VECTOR_INTRINSIC = {"fma": "llvm.fmuladd", "exp": "llvm.exp", "log": "llvm.log",
                     "sqrt": "llvm.sqrt", "floor": "llvm.floor", "ceil": "llvm.ceil",
                     "round": "llvm.roundeven", "trunc": "llvm.trunc", "abs": "llvm.fabs"}


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
        self.em.bounds[self.var] = L.Bounds(0, self.lanes - 1)
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
        if kind is True and dtype is not T.bfloat16:
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
        if dtype.kind == "b":
            return self.b.zext(vec, ir.VectorType(I8, self.lanes))
        if dtype is T.float16:
            return self.b.fptrunc(vec, ir.VectorType(F16, self.lanes))
        return vec

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
        free = L.free_vars(e)
        if self.var not in free and not (free & set(self.vectors)):
            return self.em.expr(e), False
        if e == self.var:
            return ir.Constant(ir.VectorType(I64, self.lanes), list(range(self.lanes))), True
        if isinstance(e, L.Var) and e in self.vectors:
            return self.vectors[e], True
        if isinstance(e, L.Load):
            stride = self._lane_stride(e.indices)
            kind = {0: False, 1: True}.get(stride)
            dtype = e.buffer.dtype
            if stride in (2, 3, 4) and dtype in (T.float32, T.float64):
                return self._strided_load(e, stride), True
            if kind is True and dtype is not T.bfloat16:
                ptr = self._base_address(e.buffer, e.indices)
                mem = ir.VectorType(memory_type(dtype), self.lanes)
                ptr = self.b.bitcast(ptr, ir.PointerType(mem))
                vec = self.b.load(ptr, typ=mem, align=dtype.itemsize)
                if dtype.kind == "b":
                    vec = self.b.icmp_unsigned("!=", vec, ir.Constant(mem, [0] * self.lanes))
                elif dtype is T.float16:
                    vec = self.b.fpext(vec, self.vtype(dtype))
                return vec, True
            return self.lanewise(e), True
        if isinstance(e, L.BinOp) and e.op in ("+", "-", "*", "/", "min", "max") and \
                e.a.dtype.is_float and e.a.dtype in (T.float32, T.float64):
            a, b = self._both(e.a, e.b)
            if e.op in ("min", "max"):
                name = "llvm.minimum" if e.op == "min" else "llvm.maximum"
                return self.b.call(self._intrinsic(name, a.type, 2), [a, b]), True
            fn = {"+": self.b.fadd, "-": self.b.fsub, "*": self.b.fmul, "/": self.b.fdiv}[e.op]
            return fn(a, b), True
        if isinstance(e, L.BinOp) and e.op in ("+", "-", "*") and e.a.dtype.is_int:
            a, b = self._both(e.a, e.b)
            fn = {"+": self.b.add, "-": self.b.sub, "*": self.b.mul}[e.op]
            return fn(a, b), True
        if isinstance(e, L.Call) and e.name in _VECTOR_INTRINSIC and \
                e.dtype in (T.float32, T.float64):
            args = [self._as_vector(a) for a in e.args]
            fn = self._intrinsic(_VECTOR_INTRINSIC[e.name], args[0].type, len(args))
            return self.b.call(fn, args), True
        if isinstance(e, L.Select) and e.dtype in (T.float32, T.float64):
            cond = self._as_vector(e.cond)
            a, b = self._both(e.true, e.false)
            return self.b.select(cond, a, b), True
        if isinstance(e, L.BinOp) and e.op in L.COMPARE and e.a.dtype in (T.float32,
                                                                            T.float64):
            a, b = self._both(e.a, e.b)
            if e.op == "!=":
                return self.b.fcmp_unordered("!=", a, b), True
            return self.b.fcmp_ordered(e.op, a, b), True
        return self.lanewise(e), True

    def _as_vector(self, e: L.Expr) -> ir.Value:
        value, is_vector = self.expr(e)
        return value if is_vector else self.splat(value)

    def _both(self, a: L.Expr, b: L.Expr):
        return self._as_vector(a), self._as_vector(b)

    def _intrinsic(self, name: str, ty: ir.VectorType, nargs: int) -> ir.Function:
        elem = "f32" if ty.element == F32 else "f64"
        return self.em.mb.declare(f"{name}.v{ty.count}{elem}", ty, [ty] * nargs)
