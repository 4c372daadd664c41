"""Render operator-IR PrimFuncs as LLVM IR (llvmlite's IR builder).

Each PrimFunc becomes `void @name(ptr noalias %buf..., i64 %size...)`; a `_packed` twin taking
`(ptr args, ptr sizes)` arrays lets tests and the runtime call any kernel through one ctypes
signature. Parallel loops are outlined into `@name_par<k>(ptr closure, i64 start, i64 end)`
and handed to the runtime's `dnnc_parallel_for`.

A PrimFunc is legalized first (`backends/legalize.py`): what ops mean (sigmoid, sign, floor
division, integer division by zero, float16 arithmetic in float32, ...) is settled there, so
this module never decides what an op computes: it walks the loop IR through the statement,
loop-kind and expression dispatch tables below, and spells the primitive ops that remain
through the op tables of `primitives.py` (`BINARY`, `CALLS` and `CASTS`, (operand class, op)
-> emitter). VECTORIZED loops become vector code in `vectorize.py`. Values live in registers in
their own type (float16 as `half`, bfloat16 as its `i16` bits, which legalize only moves and
converts), bool as i1 (i8 in memory).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from llvmlite import ir

from ...ir import loop as L
from ...ir import types as T
from ..legalize import check_legal, legalize
from . import amx, amx_codegen, bf16, int8
from .primitives import BINARY, CALLS, CASTS, I1, I8, I16, I32, I64, PTR, cast_class, \
    compute_type, intrinsic_suffix, memory_type, op_class
from .vectorize import VectorLoop, vectorizable

ERRORS = L.index_checks.INDEX_ERRORS
CHECKS_HOIST_FROM = frozenset(k for k in L.ForKind if not (k.is_gpu_block or k.is_gpu_thread))
"""Loops an index check that does not change in them is hoisted out of (every CPU kind)."""

STACK_SCRATCH = 1 << 16
"""Bytes a kernel's scratch buffer may have to live on the stack (else malloc'd)."""

NATIVE: frozenset[str] = frozenset({"pack_u8x4"})
"""Legalize rules whose ops this renderer renders itself on every CPU: `pack_u8x4` (a window
of bytes one load and a shuffle in vector code, `vectorize.VectorLoop.pack_u8x4`). LLVM has
no exact rsqrt or sigmoid instruction, and its direct double -> half and float -> bfloat
conversions call compiler-rt helpers (__truncdfhf2, __truncsfbf2) the JIT's process may
lack."""


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

    def __init__(self, name: str = "dnnc", features: frozenset[str] = frozenset()):
        """`features`: the CPU's (`Target.feature_set`), which decide the ops rendered
        natively beyond `NATIVE` (`bf16.native`: vdpbf16ps) and whether tile products run on
        AMX (`amx.TILE_DOTS`)."""
        self.module = ir.Module(name=name)
        self.native = NATIVE | bf16.native(features) | int8.native(features)
        self.features = features
        # the precisions whose `TileProduct`s run on AMX tiles here; the others become loops
        self.tiles = frozenset(p for p, (_, needs) in amx.TILE_DOTS.items() if needs <= features)
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
        return self.declare(f"{name}.{intrinsic_suffix(ty)}", ty, [ty] * nargs)

    def add(self, func: L.PrimFunc, noalias: bool = True) -> ir.Function:
        """Verify, legalize and render `func`; returns the LLVM function."""
        try:   # a schedule's type slip must stop here, not corrupt memory at run time
            L.verify(func, placement=False)
        except L.LoopIRError as exc:
            raise CodegenError(str(exc)) from None
        func = amx_codegen.expand_tile_products(func, self.tiles)
        func = legalize(L.index_checks.hoist(func, CHECKS_HOIST_FROM), self.native)
        check_legal(func, self.native)   # (~1% of compile time: mobilenet_v2 44 ms of 5.7 s)
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
        emitter = FunctionEmitter(self, fn, builder, env, buffers)
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


class FunctionEmitter:
    """Emits statements and expressions of one LLVM function (an outlined parallel body is a
    function of its own, with an emitter of its own)."""

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

    def tile_product(self, s: L.TileProduct) -> None:
        if s.precision not in self.mb.tiles:   # (`ModuleBuilder.add` expands those)
            self.fail(f"{s.precision} tile product on a CPU without its tiles")
        amx_codegen.render(self, s)

    def barrier(self, s: L.Barrier) -> None:
        self.fail("barriers are GPU-only")

    def prefetch(self, s: L.Prefetch) -> None:
        """`llvm.prefetch` of the element's line: a read, kept in every cache level (the x86
        prefetcht0)."""
        fn = self.mb.declare("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        self.b.call(fn, [self.address(s.at.buffer, s.at.indices), ir.Constant(I32, 0),
                         ir.Constant(I32, 3), ir.Constant(I32, 1)])

    def warp_memory(self, s: L.Stmt) -> None:
        self.fail(f"{type(s).__name__} (ldmatrix, cp.async, wgmma) is GPU-only")

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
                vectorizable(s.body):
            return VectorLoop(self, s).emit()
        self.serial_for(s)

    def parallel_for(self, s: L.For) -> None:
        """Outline the loop body into `f(closure, start, end)`; run it on the pool."""
        captured_vars = sorted((v for v in L.free_vars(s.body) if v != s.var),
                               key=lambda v: v.name)
        captured_vars += [v for v in self._shape_vars(s.body) if v not in captured_vars]
        names = sorted(({n.buffer.name for n in L.walk(s.body)
                         if isinstance(n, (L.Load, L.Store))} |
                        ({ERRORS.name} if L.index_checks.has_checks(s.body) else set()))
                       & set(self.buffers))
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
        inner = FunctionEmitter(self.fb, outlined, ob, env, buffers)
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
        emit = BINARY.get((op_class(e.a.dtype), e.op))
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
        if e.name == L.index_checks.CHECK:
            return self.check_index(*args)
        if e.name == "ftoi":   # legalize's float -> int of a value in range: never poison
            return self.b.fptosi(args[0], compute_type(e.dtype))
        emit = CALLS.get((op_class(src), e.name))
        if emit is None:
            self.fail(f"no LLVM rendering for intrinsic {e.name} on {src.name} (legalized?)")
        return emit(self, *args)

    def check_index(self, value: ir.Value, size: ir.Value, site: ir.Value) -> ir.Value:
        """`value`; on a cold path when it lies outside [-size, size - 1] (one unsigned
        compare: value + size >= 2 size), (site + 1, value, size) written to the error record
        unless an error is there already (a cmpxchg on its first word: the first of a call
        wins, and parallel bodies race safely; the pool's join publishes the rest)."""
        record = self.buffers.get(ERRORS.name)
        if record is None:
            self.fail("check_index without the error record parameter (index_checks)")
        b = self.b
        bad = b.icmp_unsigned(">=", b.add(value, size), b.add(size, size))
        fail = self.fn.append_basic_block("index.bad")
        ok = self.fn.append_basic_block("index.ok")
        b.cbranch(bad, fail, ok).set_weights([1, 1 << 20])
        b.position_at_end(fail)
        pair = b.cmpxchg(record, ir.Constant(I64, 0), b.add(site, ir.Constant(I64, 1)),
                         "monotonic", "monotonic")
        with b.if_then(b.extract_value(pair, 1)):
            for k, word in ((1, value), (2, size)):
                b.store(word, b.gep(record, [ir.Constant(I64, k)], inbounds=True,
                                    source_etype=I64))
        b.branch(ok)
        b.position_at_end(ok)
        return value

    def cast(self, e: L.Cast) -> ir.Value:
        value, src, dst = self.expr(e.value), e.value.dtype, e.dtype
        if src is dst:
            return value
        emit = CASTS.get((cast_class(src), cast_class(dst)))
        if emit is None:
            self.fail(f"no LLVM cast from {src.name} to {dst.name} (legalized?)")
        return emit(self, value, compute_type(dst))

    def reduce(self, e: L.Reduce) -> ir.Value:
        self.fail("Reduce must be lowered before codegen")


_STMT: dict[type, Callable] = {
    L.Seq: FunctionEmitter.seq, L.For: FunctionEmitter.loop, L.Store: FunctionEmitter.store,
    L.Let: FunctionEmitter.let, L.If: FunctionEmitter.if_, L.Allocate: FunctionEmitter.allocate,
    L.Barrier: FunctionEmitter.barrier, L.Mma: FunctionEmitter.mma,
    L.Prefetch: FunctionEmitter.prefetch, L.TileProduct: FunctionEmitter.tile_product,
    **{kind: FunctionEmitter.warp_memory for kind in (
        L.LdMatrix, L.CopyAsync, L.AsyncCommit, L.AsyncWait, L.Wgmma, L.WgmmaFence,
        L.WgmmaCommit, L.WgmmaWait, L.ProxyFence, L.ClusterBarrier,
        L.Mbarrier, L.TmaLoad)},
}
_LOOP: dict[L.ForKind, Callable] = {
    L.ForKind.SERIAL: FunctionEmitter.serial_for,
    L.ForKind.PARALLEL: FunctionEmitter.parallel_for,
    L.ForKind.UNROLLED: FunctionEmitter.unrolled_for,
    L.ForKind.VECTORIZED: FunctionEmitter.vectorized_for,
}
"""Loop kind -> emitter; GPU-bound kinds are missing on purpose (a CodegenError)."""
_EXPR: dict[type, Callable] = {
    L.Const: FunctionEmitter.constant, L.Var: FunctionEmitter.var, L.Load: FunctionEmitter.load,
    L.BinOp: FunctionEmitter.binop, L.Call: FunctionEmitter.call, L.Cast: FunctionEmitter.cast,
    L.Select: FunctionEmitter.select, L.Reduce: FunctionEmitter.reduce,
}


def _product(dims) -> L.Expr:
    out: L.Expr = L.const(1)
    for d in dims:
        out = out * d
    return L.simplify_expr(out)
