"""The operator IR: target-neutral loop nests that every backend renders.

Expressions (`Var`, `Const`, `BinOp`, `Call`, `Cast`, `Select`, `Load`, `Reduce`) and statements
(`For`, `Store`, `Let`, `If`, `Allocate`, `Seq`, `Barrier`) are immutable dataclasses, so `==`
is structural equality and nodes hash. Arithmetic operators build expressions (`i * 4 + j`);
comparisons other than `==`/`!=` do too (`i < n`); use `eq(a, b)` / `ne(a, b)` for those two.

`Reduce` appears only in op `compute` rules (an output element as a reduction over reduce axes);
lowering turns it into loops. A `For` names how it runs: serial, parallel (CPU cores),
vectorized, unrolled, or bound to a GPU axis (blockIdx.x, threadIdx.y, ...); an `Allocate` names
its memory scope (global, shared, local). Backends must never need a second IR.

This module knows nothing of graphs, ONNX or any backend.
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass, field, fields
from typing import Callable, Iterator

from . import types as T

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
              "log1p", "expm1", "sign", "atan2", "fma", "bitcast")
"""`fma(a, b, c)` is a*b + c, fused where the target has it (kernels' inner products);
`bitcast(x, dtype=T)` reinterprets x's bits as the same-width type T."""


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
class Barrier(Stmt):
    """All threads of a GPU block wait here (__syncthreads)."""

    def __hash__(self):
        return hash("Barrier")


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
        return print_func(self)


# ---------------------------------------------------------------------------------------------
# Traversal


def children(node) -> Iterator:
    """The IR nodes directly inside `node` (Exprs, Stmts, Buffers, IterVars)."""
    for f in fields(node):
        value = getattr(node, f.name)
        if isinstance(value, (Expr, Stmt, IterVar)):
            yield value
        elif isinstance(value, tuple):
            for item in value:
                if isinstance(item, (Expr, Stmt, IterVar)):
                    yield item


def walk(node) -> Iterator:
    """Every node under `node`, pre-order, `node` included."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(children(n))))


def transform(node, fn: Callable):
    """Rebuild `node` bottom-up: children first, then `fn(rebuilt)`; `fn` returns a
    replacement or None to keep the node."""
    changes = {}
    for f in fields(node):
        value = getattr(node, f.name)
        if isinstance(value, (Expr, Stmt, IterVar)):
            new = transform(value, fn)
            if new is not value:
                changes[f.name] = new
        elif isinstance(value, tuple) and any(isinstance(v, (Expr, Stmt, IterVar))
                                              for v in value):
            new = tuple(transform(v, fn) if isinstance(v, (Expr, Stmt, IterVar)) else v
                        for v in value)
            if any(a is not b for a, b in zip(new, value)):
                changes[f.name] = new
    if changes:
        node = _replace(node, changes)
    out = fn(node)
    return node if out is None else out


def _replace(node, changes: dict):
    values = {f.name: getattr(node, f.name) for f in fields(node)}
    values.update(changes)
    return type(node)(**values)


def substitute(node, mapping: dict):
    """Replace Vars (by Var) with Exprs."""
    if not mapping:
        return node
    return transform(node, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def free_vars(node) -> set[Var]:
    """Vars read in `node` that it does not bind itself."""
    bound: set[Var] = set()
    used: set[Var] = set()
    for n in walk(node):
        if isinstance(n, (For, Let)):
            bound.add(n.var)
        elif isinstance(n, IterVar):
            bound.add(n.var)
        elif isinstance(n, Var):
            used.add(n)
    return used - bound


# ---------------------------------------------------------------------------------------------
# Printer


_PRECEDENCE = {"or": 1, "and": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
               "|": 4, "^": 5, "&": 6, "<<": 7, ">>": 7, "+": 8, "-": 8, "*": 9, "/": 9,
               "//": 9, "%": 9}


def print_expr(e: Expr, parent: int = 0) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        if e.dtype is INDEX or e.dtype.kind == "b":
            return repr(e.value)
        return f"{e.dtype.name}({e.value!r})"
    if isinstance(e, BinOp):
        if e.op in ("min", "max"):
            return f"{e.op}({print_expr(e.a)}, {print_expr(e.b)})"
        p = _PRECEDENCE[e.op]
        text = f"{print_expr(e.a, p)} {e.op} {print_expr(e.b, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, Call):
        return f"{e.name}({', '.join(print_expr(a) for a in e.args)})"
    if isinstance(e, Cast):
        return f"{e.dtype.name}({print_expr(e.value)})"
    if isinstance(e, Select):
        return (f"select({print_expr(e.cond)}, {print_expr(e.true)}, "
                f"{print_expr(e.false)})")
    if isinstance(e, Load):
        return f"{e.buffer.name}[{', '.join(print_expr(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(f"{a.var.name} < {print_expr(a.extent)}" for a in e.axes)
        where = "" if e.condition is None else f" if {print_expr(e.condition)}"
        return f"{e.combiner}({print_expr(e.source)} for {axes}{where})"
    raise TypeError(f"not an expression: {e!r}")


def print_stmt(s: Stmt, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(s, For):
        kind = "" if s.kind is ForKind.SERIAL else f"  # {s.kind.value}"
        return (f"{pad}for {s.var.name} in range({print_expr(s.extent)}):{kind}\n"
                + print_stmt(s.body, indent + 1))
    if isinstance(s, Store):
        idx = ", ".join(print_expr(i) for i in s.indices)
        return f"{pad}{s.buffer.name}[{idx}] = {print_expr(s.value)}\n"
    if isinstance(s, Let):
        return f"{pad}{s.var.name} = {print_expr(s.value)}\n" + print_stmt(s.body, indent)
    if isinstance(s, If):
        text = f"{pad}if {print_expr(s.cond)}:\n" + print_stmt(s.then, indent + 1)
        if s.orelse is not None:
            text += f"{pad}else:\n" + print_stmt(s.orelse, indent + 1)
        return text
    if isinstance(s, Allocate):
        b = s.buffer
        dims = ", ".join(print_expr(d) for d in b.shape)
        return (f"{pad}{b.name} = alloc({b.dtype.name}[{dims}], scope={b.scope.value})\n"
                + print_stmt(s.body, indent))
    if isinstance(s, Seq):
        return "".join(print_stmt(x, indent) for x in s.stmts)
    if isinstance(s, Barrier):
        return f"{pad}barrier()\n"
    raise TypeError(f"not a statement: {s!r}")


def print_func(f: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {b.dtype.name}[{', '.join(print_expr(d) for d in b.shape)}]"
                       for b in f.params)
    sizes = f" sizes({', '.join(v.name for v in f.size_vars)})" if f.size_vars else ""
    return f"def {f.name}({params}){sizes}:\n" + print_stmt(f.body, 1)


# ---------------------------------------------------------------------------------------------
# Verifier


class LoopIRError(Exception):
    """A PrimFunc breaks an invariant of the operator IR (a compiler bug, not a user error)."""


def verify(func: PrimFunc) -> None:
    """Check scoping of vars and buffers, index arity, dtypes, and GPU placement rules."""
    params = {b.name: b for b in func.params}
    if len(params) != len(func.params):
        raise LoopIRError(f"{func.name}: duplicate parameter names")
    scope_vars = set(func.size_vars)
    for b in func.params:
        if b.scope is not Scope.GLOBAL:
            raise LoopIRError(f"{func.name}: parameter {b.name} must be in global scope")
        _check_expr_vars(func, b.shape, scope_vars)
    _verify_stmt(func, func.body, scope_vars, dict(params), gpu=set())


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
    if known != buffer:
        raise LoopIRError(f"{func.name}: buffer {buffer.name} accessed with another type")
    if len(indices) != len(buffer.shape):
        raise LoopIRError(f"{func.name}: {buffer.name} has rank {len(buffer.shape)}, "
                          f"accessed with {len(indices)} indices")
    for i in indices:
        if not i.dtype.is_int:
            raise LoopIRError(f"{func.name}: index {print_expr(i)} of {buffer.name} is not "
                              f"an integer")


def _verify_stmt(func, s, scope_vars, buffers, gpu: set) -> None:
    def exprs(*es):
        _check_expr_vars(func, es, scope_vars)
        for e in es:
            for n in walk(e):
                if isinstance(n, Load):
                    _check_access(func, n.buffer, n.indices, buffers)

    if isinstance(s, For):
        exprs(s.extent)
        if s.var in scope_vars:
            raise LoopIRError(f"{func.name}: loop variable {s.var.name} rebinds a name")
        inner_gpu = gpu
        if s.kind.is_gpu_block or s.kind.is_gpu_thread:
            if s.kind.value in gpu:
                raise LoopIRError(f"{func.name}: {s.kind.value} bound twice")
            if s.kind.is_gpu_block and any(k.startswith("threadIdx") for k in gpu):
                raise LoopIRError(f"{func.name}: {s.kind.value} inside a thread loop")
            inner_gpu = gpu | {s.kind.value}
        _verify_stmt(func, s.body, scope_vars | {s.var}, buffers, inner_gpu)
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
        _verify_stmt(func, s.body, scope_vars | {s.var}, buffers, gpu)
    elif isinstance(s, If):
        exprs(s.cond)
        if s.cond.dtype.kind != "b":
            raise LoopIRError(f"{func.name}: condition {print_expr(s.cond)} is not bool")
        _verify_stmt(func, s.then, scope_vars, buffers, gpu)
        if s.orelse is not None:
            _verify_stmt(func, s.orelse, scope_vars, buffers, gpu)
    elif isinstance(s, Allocate):
        b = s.buffer
        if b.name in buffers:
            raise LoopIRError(f"{func.name}: buffer {b.name} allocated twice")
        if b.scope is Scope.SHARED and not any(k.startswith("blockIdx") for k in gpu):
            raise LoopIRError(f"{func.name}: shared buffer {b.name} outside a GPU block loop")
        _check_expr_vars(func, b.shape, scope_vars)
        _verify_stmt(func, s.body, scope_vars, {**buffers, b.name: b}, gpu)
    elif isinstance(s, Seq):
        for x in s.stmts:
            _verify_stmt(func, x, scope_vars, buffers, gpu)
    elif isinstance(s, Barrier):
        if not any(k.startswith("threadIdx") for k in gpu):
            raise LoopIRError(f"{func.name}: barrier outside a GPU thread loop")
    else:
        raise LoopIRError(f"{func.name}: not a statement: {s!r}")


# ---------------------------------------------------------------------------------------------
# Simplifier: rule tables over expressions, with bounds of loop variables


@dataclass(frozen=True)
class Bounds:
    """Inclusive integer bounds; None is unbounded."""

    lo: int | None
    hi: int | None

    def within(self, lo: int, hi: int) -> bool:
        return self.lo is not None and self.hi is not None and lo <= self.lo and self.hi <= hi


UNBOUNDED = Bounds(None, None)


def bounds(e: Expr, env: dict[Var, Bounds]) -> Bounds:
    """Bounds of an integer expression given bounds of its vars (interval arithmetic)."""
    if isinstance(e, Const) and e.dtype.is_int:
        return Bounds(e.value, e.value)
    if isinstance(e, Var):
        return env.get(e, UNBOUNDED)
    if isinstance(e, BinOp) and e.dtype.is_int:
        a, b = bounds(e.a, env), bounds(e.b, env)
        if e.op == "+":
            return Bounds(_opt(operator.add, a.lo, b.lo), _opt(operator.add, a.hi, b.hi))
        if e.op == "-":
            return Bounds(_opt(operator.sub, a.lo, b.hi), _opt(operator.sub, a.hi, b.lo))
        if e.op == "*" and None not in (a.lo, a.hi, b.lo, b.hi):
            corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
            return Bounds(min(corners), max(corners))
        if e.op == "*" and b.lo is not None and b.lo == b.hi and b.lo >= 0 and \
                a.lo is not None and a.lo >= 0:
            return Bounds(a.lo * b.lo, None if a.hi is None else a.hi * b.lo)
        if e.op == "//" and b.lo is not None and b.lo == b.hi and b.lo > 0:
            return Bounds(None if a.lo is None else a.lo // b.lo,
                          None if a.hi is None else a.hi // b.lo)
        if e.op == "%" and b.lo is not None and b.lo == b.hi and b.lo > 0:
            if a.within(0, b.lo - 1):
                return a
            return Bounds(0, b.lo - 1)
        if e.op == "min":
            return Bounds(_opt(min, a.lo, b.lo), _opt_keep(min, a.hi, b.hi))
        if e.op == "max":
            return Bounds(_opt_keep(max, a.lo, b.lo), _opt(max, a.hi, b.hi))
    return UNBOUNDED


def _opt(fn, a, b):
    return None if a is None or b is None else fn(a, b)


def _opt_keep(fn, a, b):
    """min of upper bounds / max of lower bounds: one known side suffices."""
    if a is None:
        return b
    if b is None:
        return a
    return fn(a, b)


def _is_const(e, value=None) -> bool:
    return isinstance(e, Const) and (value is None or e.value == value)


def _int_const(e) -> int | None:
    return e.value if isinstance(e, Const) and e.dtype.is_int else None


_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul, "min": min, "max": max,
         "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
         ">": operator.gt, ">=": operator.ge, "&": operator.and_, "|": operator.or_,
         "^": operator.xor, "and": lambda a, b: a and b, "or": lambda a, b: a or b}


def _fold_constants(e, env):
    """c1 op c2 -> c (integer // and % follow floor semantics; float / folds too)."""
    if not isinstance(e, BinOp) or not (_is_const(e.a) and _is_const(e.b)):
        return None
    a, b = e.a.value, e.b.value
    if e.op in _FOLD:
        return Const(_FOLD[e.op](a, b), e.dtype) if e.op not in ("&", "|", "^") or \
            e.dtype.is_int else None
    if e.op in ("//", "%") and e.dtype.is_int and b not in (0, -1):   # (see BinOp)
        return Const(a // b if e.op == "//" else a % b, e.dtype)
    if e.op == "/" and e.dtype.is_float and b != 0:
        return Const(a / b, e.dtype)
    return None


def _identities(e, env):
    """x+0 -> x, 0+x -> x, x-0 -> x, x*1 -> x, 1*x -> x, x*0 -> 0 (ints), x//1 -> x,
    x%1 -> 0, x-x -> 0 (ints), min(x,x) -> x, max(x,x) -> x, x/1 -> x."""
    if not isinstance(e, BinOp):
        return None
    a, b, op = e.a, e.b, e.op
    if op == "+":
        if _is_const(b, 0):
            return a
        if _is_const(a, 0):
            return b
    if op == "-":
        if _is_const(b, 0):
            return a
        if a == b and e.dtype.is_int:
            return Const(0, e.dtype)
    if op == "*":
        if _is_const(b, 1):
            return a
        if _is_const(a, 1):
            return b
        if e.dtype.is_int and (_is_const(a, 0) or _is_const(b, 0)):
            return Const(0, e.dtype)
    if op in ("//", "/") and _is_const(b, 1):
        return a
    if op == "%" and _is_const(b, 1) and e.dtype.is_int:
        return Const(0, e.dtype)
    if op in ("min", "max") and a == b:
        return a
    return None


def _canonical_order(e, env):
    """c + x -> x + c, c * x -> x * c: constants to the right, so later rules see one form."""
    if isinstance(e, BinOp) and e.op in ("+", "*", "min", "max") and _is_const(e.a) and \
            not _is_const(e.b):
        return BinOp(e.op, e.b, e.a)
    return None


def _reassociate(e, env):
    """(x + c1) + c2 -> x + (c1+c2); (x * c1) * c2 -> x * (c1*c2); (x + c1) - c2 -> x + (c1-c2)."""
    if not (isinstance(e, BinOp) and e.dtype.is_int and _is_const(e.b)):
        return None
    a = e.a
    if isinstance(a, BinOp) and _is_const(a.b):
        if e.op == "+" and a.op == "+":
            return BinOp("+", a.a, Const(a.b.value + e.b.value, e.dtype))
        if e.op == "-" and a.op == "+":
            return BinOp("+", a.a, Const(a.b.value - e.b.value, e.dtype))
        if e.op == "*" and a.op == "*":
            return BinOp("*", a.a, Const(a.b.value * e.b.value, e.dtype))
    return None


def _div_mod(e, env):
    """Bounds-aware division by positive constants:
    (x*c)//c -> x; (x*c + y)//c -> x + y//c and (x*c + y)%c -> y%c when c > 0;
    x//c -> 0 and x%c -> x when 0 <= x < c; (x*(c*k))//c -> x*k; (x*(c*k))%c -> 0."""
    if not (isinstance(e, BinOp) and e.op in ("//", "%") and e.dtype.is_int):
        return None
    c = _int_const(e.b)
    if c is None or c <= 0:
        return None
    x = e.a
    if bounds(x, env).within(0, c - 1):
        return Const(0, e.dtype) if e.op == "//" else x
    if isinstance(x, BinOp) and x.op == "*":
        k = _int_const(x.b)
        if k is not None and k % c == 0:
            if e.op == "%":
                return Const(0, e.dtype)
            return x.a if k == c else BinOp("*", x.a, Const(k // c, e.dtype))
    if isinstance(x, BinOp) and x.op == "+":
        for left, right in ((x.a, x.b), (x.b, x.a)):
            if isinstance(left, BinOp) and left.op == "*":
                k = _int_const(left.b)
                if k is not None and k % c == 0:
                    scaled = left.a if k == c else BinOp("*", left.a, Const(k // c, e.dtype))
                    if e.op == "%":
                        return BinOp("%", right, e.b)
                    return BinOp("+", scaled, BinOp("//", right, e.b))
    return None


def _recombine_div_mod(e, env):
    """(x//c)*c + x%c -> x."""
    if not (isinstance(e, BinOp) and e.op == "+" and e.dtype.is_int):
        return None
    for p, q in ((e.a, e.b), (e.b, e.a)):
        if isinstance(p, BinOp) and p.op == "*" and isinstance(p.a, BinOp) and \
                p.a.op == "//" and isinstance(q, BinOp) and q.op == "%" and \
                p.a.a == q.a and p.a.b == q.b == p.b:
            return q.a
    return None


def _bounded_compare(e, env):
    """Comparisons and min/max decided by bounds (i < n with i in [0, n-1] -> true)."""
    if not (isinstance(e, BinOp) and e.a.dtype.is_int):
        return None
    a, b = bounds(e.a, env), bounds(e.b, env)
    verdict = None
    if e.op == "<":
        verdict = _decide(a.hi, b.lo, a.lo, b.hi, strict=True)
    elif e.op == "<=":
        verdict = _decide(a.hi, b.lo, a.lo, b.hi, strict=False)
    elif e.op == ">":
        verdict = _decide(b.hi, a.lo, b.lo, a.hi, strict=True)
    elif e.op == ">=":
        verdict = _decide(b.hi, a.lo, b.lo, a.hi, strict=False)
    elif e.op in ("min", "max"):
        a_le_b = _decide(a.hi, b.lo, a.lo, b.hi, strict=False)
        if a_le_b is not None:
            return (e.a if a_le_b else e.b) if e.op == "min" else (e.b if a_le_b else e.a)
        return None
    return None if verdict is None else Const(verdict, T.bool_)


def _decide(a_hi, b_lo, a_lo, b_hi, strict: bool):
    """True when a < b (or <=) for all values, False when never, None when unknown."""
    if a_hi is not None and b_lo is not None and (a_hi < b_lo if strict else a_hi <= b_lo):
        return True
    if a_lo is not None and b_hi is not None and (a_lo >= b_hi if strict else a_lo > b_hi):
        return False
    return None


def _select_const(e, env):
    """select(true, a, b) -> a; select(false, a, b) -> b; select(c, a, a) -> a."""
    if isinstance(e, Select):
        if _is_const(e.cond):
            return e.true if e.cond.value else e.false
        if e.true == e.false:
            return e.true
    return None


def _cast_same(e, env):
    """Cast to the value's own dtype -> the value; casts of constants fold."""
    if isinstance(e, Cast):
        if e.value.dtype is e.dtype:
            return e.value
        if isinstance(e.value, Const):
            if e.dtype.is_float:
                return Const(float(e.value.value), e.dtype)
            if e.dtype.is_int and e.value.dtype.is_int:
                return Const(int(e.value.value), e.dtype)
    return None


EXPR_RULES: list[Callable] = [_fold_constants, _canonical_order, _identities, _reassociate,
                              _div_mod, _recombine_div_mod, _bounded_compare, _select_const,
                              _cast_same]
"""Index and value rewrites; each takes (expr, var bounds) and returns a replacement or None."""


def simplify_expr(e: Expr, env: dict[Var, Bounds] | None = None,
                  rules: list[Callable] = EXPR_RULES) -> Expr:
    """Apply `rules` bottom-up until nothing changes."""
    env = env or {}

    def rewrite(node):
        if not isinstance(node, Expr):
            return None
        changed = False
        for _ in range(64):
            for rule in rules:
                out = rule(node, env)
                if out is not None and out != node:
                    # the replacement's own children may now match rules again
                    node = simplify_expr(out, env, rules) if not isinstance(out, (Var, Const)) \
                        else out
                    changed = True
                    break
            else:
                break
        return node if changed else None

    return transform(e, rewrite)


def simplify(node, env: dict[Var, Bounds] | None = None):
    """Simplify every expression in a statement or function, using loop bounds; loops of
    extent 1 become their body with the var replaced by 0; `if true` disappears."""
    if isinstance(node, PrimFunc):
        sizes = {v: Bounds(1, None) for v in node.size_vars}  # symbolic sizes are positive
        return _replace(node, {"body": simplify(node.body, {**sizes, **(env or {})})})
    if isinstance(node, Expr):
        return simplify_expr(node, env)
    env = dict(env or {})
    s = node
    if isinstance(s, For):
        extent = simplify_expr(s.extent, env)
        hi = bounds(extent, env).hi
        inner = dict(env)
        inner[s.var] = Bounds(0, None if hi is None else hi - 1)
        body = simplify(s.body, inner)
        if _is_const(extent, 1) and s.kind in (ForKind.SERIAL, ForKind.UNROLLED,
                                                ForKind.VECTORIZED, ForKind.PARALLEL):
            return simplify(substitute(body, {s.var: Const(0, s.var.dtype)}), env)
        return For(s.var, extent, body, s.kind)
    if isinstance(s, Store):
        return Store(s.buffer, tuple(simplify_expr(i, env) for i in s.indices),
                     simplify_expr(s.value, env))
    if isinstance(s, Let):
        value = simplify_expr(s.value, env)
        inner = dict(env)
        inner[s.var] = bounds(value, env)
        return Let(s.var, value, simplify(s.body, inner))
    if isinstance(s, If):
        cond = simplify_expr(s.cond, env)
        if _is_const(cond):
            if cond.value:
                return simplify(s.then, env)
            return simplify(s.orelse, env) if s.orelse is not None else Seq(())
        return If(cond, simplify(s.then, env),
                  None if s.orelse is None else simplify(s.orelse, env))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, simplify(s.body, env))
    if isinstance(s, Seq):
        return seq(*(simplify(x, env) for x in s.stmts))
    return s


def structural_equal(a, b) -> bool:
    """Equality up to the names of bound loop and let variables."""
    return _alpha_normal(a) == _alpha_normal(b)


def _alpha_normal(node):
    counter = iter(range(1 << 30))
    renames: dict[Var, Var] = {}
    binders = [n for n in walk(node) if isinstance(n, (For, Let, IterVar))]
    for b in binders:
        if b.var not in renames:
            renames[b.var] = Var(f"_v{next(counter)}", b.var.dtype)
    return substitute(node, renames)

