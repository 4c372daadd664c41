"""Tensor expressions: how an op's `compute` rule says what each output element is.

A `Tensor` is a named n-d array defined either as a placeholder (a kernel input) or by an
expression over its output index variables (`compute(shape, fn)`), with reductions over
`reduce_axis`es. Reading a tensor (`t[i, j]`) is a `Load` of its buffer, so lowering can inline
a producer's expression into its consumer or materialise it, and the expression language is the
operator IR's own (`ir/loop/`). Stages beyond the outputs (softmax's row max and sum) are
ordinary Tensors that lowering materialises.

`evaluate(tensors, feeds)` interprets a compute DAG with NumPy, vectorised over whole index
grids: the check that a compute rule means what the op's reference `evaluate` means, before
any backend exists.

This module must not import a backend or the graph.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from . import types as T
from .loop import index_checks
from .loop import (
    BinOp, Buffer, Call, Cast, Const, Expr, IterVar, Load, Reduce, Select, Var, const, walk)

_names = itertools.count()


def dim_expr(d: T.Dim) -> Expr:
    """A graph dim as an index expression: 4 -> 4, "N" -> N, "2*N*S" -> N * S * 2."""
    if isinstance(d, (int, np.integer)):
        return const(int(d))
    if d.startswith("("):
        return Var(d)
    coef, names = T._parse(d)
    e: Expr | None = None
    for name in names:
        e = Var(name) if e is None else e * Var(name)
    return e if coef == 1 else e * coef


@dataclass(frozen=True, eq=False)
class Tensor(Buffer):
    """A buffer of a compute DAG: a placeholder (`body` None) or `body` over index `axes`.

    Reading it (`t[i, j]`) is a `Load` whose buffer is the Tensor itself, so walking an
    expression finds its producers. Tensors compare by identity.
    """

    axes: tuple[Var, ...] = ()
    body: Expr | None = None
    # a placeholder's contents when known at compile time (shape inputs, weights)
    value: np.ndarray | None = None

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def as_buffer(self) -> Buffer:
        """The plain buffer a backend stores this tensor in."""
        return Buffer(self.name, self.dtype, self.shape, self.scope)


def producers(t: Tensor) -> list[Tensor]:
    """The tensors `t`'s body reads, in first-read order."""
    if t.body is None:
        return []
    seen: dict[int, Tensor] = {}
    for n in walk(t.body):
        if isinstance(n, Load) and isinstance(n.buffer, Tensor):
            seen.setdefault(id(n.buffer), n.buffer)
    return list(seen.values())


def placeholder(name: str, dtype: T.DType, shape, value: np.ndarray | None = None) -> Tensor:
    return Tensor(name, dtype, tuple(d if isinstance(d, Expr) else dim_expr(d) for d in shape),
                  value=value)


class NoCompute(Exception):
    """Raised by a compute rule for a node it cannot express as loops (a shape that depends on
    data, an input that must be known at compile time but is not); the node then runs as a
    host fallback, which compiled models count and `dnnc inspect` lists."""


def compute(shape, fn, name: str = "", dtype: T.DType | None = None) -> Tensor:
    """A tensor whose element at index vars `i...` is `fn(i...)`."""
    shape = tuple(d if isinstance(d, Expr) else dim_expr(d) for d in shape)
    name = name or f"t{next(_names)}"
    axes = tuple(Var(f"{name}_i{k}") for k in range(len(shape)))
    body = const(fn(*axes))
    if dtype is not None and body.dtype is not dtype:
        body = Cast(dtype, body)
    return Tensor(name, body.dtype, shape, axes=axes, body=body)


def broadcast_load(t: Tensor, index) -> Expr:
    """`t` read at an output index under NumPy broadcasting: trailing axes align, and axes of
    extent 1 are read at 0."""
    index = tuple(index)
    lead = len(index) - t.ndim
    idx = tuple(const(0) if d == const(1) else index[lead + k] for k, d in enumerate(t.shape))
    return t[idx] if idx else t[()]


def reduce_axis(extent, name: str = "") -> IterVar:
    extent = extent if isinstance(extent, Expr) else dim_expr(extent)
    return IterVar(Var(name or f"r{next(_names)}"), extent)


def _reducer(combiner: str):
    def reduce(source: Expr, axes, where: Expr | None = None) -> Reduce:
        axes = tuple(axes) if isinstance(axes, (list, tuple)) else (axes,)
        return Reduce(combiner, source, axes, where)

    reduce.__name__ = f"reduce_{combiner}"
    reduce.__doc__ = f"The {combiner} of `source` over `axes` (where `where` holds)."
    return reduce


reduce_sum = _reducer("sum")
reduce_prod = _reducer("prod")
reduce_max = _reducer("max")
reduce_min = _reducer("min")
reduce_all = _reducer("and")
reduce_any = _reducer("or")


# ---------------------------------------------------------------------------------------------
# NumPy interpretation of compute DAGs (vectorised over index grids)


class ComputeEvalError(Exception):
    pass


_NP_BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum,
              "max": np.maximum, "==": np.equal, "!=": np.not_equal, "<": np.less,
              "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
              "and": np.logical_and, "or": np.logical_or, "&": np.bitwise_and,
              "|": np.bitwise_or, "^": np.bitwise_xor, "<<": np.left_shift,
              ">>": np.right_shift}


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


_NP_CALL = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
            "tanh": np.tanh, "erf": _erf, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
            "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.round,
            "trunc": np.trunc, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
            "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
            "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "pow": np.power,
            "fmod": np.fmod, "isnan": np.isnan, "isinf": np.isinf, "not": np.logical_not,
            "neg": np.negative, "log1p": np.log1p, "expm1": np.expm1, "sign": np.sign,
            "atan2": np.arctan2, "fma": lambda a, b, c: a * b + c}

_NP_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "and": np.all,
              "or": np.any}


def _identity(combiner: str, dtype: np.dtype):
    if combiner in ("sum", "or"):
        return np.zeros((), dtype)
    if combiner in ("prod", "and"):
        return np.ones((), dtype)
    if dtype.kind == "f":
        return np.array(-np.inf if combiner == "max" else np.inf, dtype)
    if dtype.kind == "b":
        return np.array(combiner == "min", dtype)
    info = np.iinfo(dtype)
    return np.array(info.min if combiner == "max" else info.max, dtype)


class _Evaluator:
    """Evaluates expressions where every Var is bound to an index grid (broadcastable)."""

    def __init__(self, arrays: dict[str, np.ndarray], sizes: dict[str, int]):
        self.arrays = arrays
        self.sizes = sizes

    def int_value(self, e: Expr) -> int:
        return int(self.eval(e, {}))

    def eval(self, e: Expr, env: dict[Var, np.ndarray]):
        if isinstance(e, Const):
            return np.array(e.value, e.dtype.np)
        if isinstance(e, Var):
            if e in env:
                return env[e]
            if e.name in self.sizes:
                return np.array(self.sizes[e.name], np.int64)
            raise ComputeEvalError(f"unbound variable {e.name}")
        if isinstance(e, BinOp):
            a, b = self.eval(e.a, env), self.eval(e.b, env)
            with np.errstate(all="ignore"):
                if e.op == "/" and e.dtype.is_float:
                    return np.true_divide(a, b).astype(e.dtype.np)
                if e.op in ("/", "//", "%") and not e.dtype.is_float:
                    # by 0: 0; MIN by -1: the quotient wraps to MIN (see BinOp)
                    a, b = np.asarray(a, e.dtype.np), np.asarray(b, e.dtype.np)
                    safe = b
                    if e.dtype.np.kind == "i":
                        safe = np.where((a == np.iinfo(a.dtype).min) & (b == -1), 1, b)
                    safe = np.where(b == 0, 1, safe).astype(e.dtype.np)
                    if e.op == "/":  # C division, truncating toward zero
                        q = np.floor_divide(a, safe)
                        out = q + ((q < 0) & (q * safe != a))
                    else:
                        out = np.floor_divide(a, safe) if e.op == "//" else np.mod(a, safe)
                    return np.where(b == 0, 0, out).astype(e.dtype.np)
                if e.op in ("//", "%"):
                    out = np.floor_divide(a, b) if e.op == "//" else np.fmod(a, b)
                    return out.astype(e.dtype.np)
                return _NP_BINARY[e.op](a, b).astype(e.dtype.np)
        if isinstance(e, Call) and e.name == "bitcast":
            value = np.ascontiguousarray(self.eval(e.args[0], env))
            return value.view(e.dtype.np).reshape(value.shape)
        if isinstance(e, Call) and e.name == index_checks.CHECK:
            return index_checks.evaluate(*(self.eval(a, env) for a in e.args))
        if isinstance(e, Call):
            args = [self.eval(a, env) for a in e.args]
            with np.errstate(all="ignore"):
                if e.dtype.is_float and e.name not in ("isnan", "isinf") and \
                        args[0].dtype.itemsize < 4:
                    args = [a.astype(np.float32) for a in args]
                return np.asarray(_NP_CALL[e.name](*args)).astype(e.dtype.np)
        if isinstance(e, Cast):
            with np.errstate(all="ignore"):
                return self.eval(e.value, env).astype(e.dtype.np)
        if isinstance(e, Select):
            return np.where(self.eval(e.cond, env), self.eval(e.true, env),
                            self.eval(e.false, env)).astype(e.dtype.np)
        if isinstance(e, Load):
            array = self.arrays[e.buffer.name]
            idx = [self.eval(i, env).astype(np.int64) for i in e.indices]
            if array.ndim == 0:
                shape = np.broadcast_shapes(*(np.shape(i) for i in idx)) if idx else ()
                return np.broadcast_to(array, shape)
            # out-of-range reads only happen under a false condition; clamp, the value is unused
            idx = [np.clip(i, 0, max(n - 1, 0)) for i, n in zip(idx, array.shape)]
            return array[tuple(idx)]
        if isinstance(e, Reduce):
            return self.reduce(e, env)
        raise ComputeEvalError(f"cannot evaluate {e!r}")

    def reduce(self, e: Reduce, env):
        depth = max((np.ndim(v) for v in env.values()), default=0)
        inner = dict(env)
        extents = [self.int_value(a.extent) for a in e.axes]
        for k, (axis, n) in enumerate(zip(e.axes, extents)):
            shape = [1] * (depth + len(extents))
            shape[depth + k] = n
            inner[axis.var] = np.arange(n, dtype=np.int64).reshape(shape)
        # keep index grids of the outer vars aligned with the new trailing axes
        inner = {v: (g.reshape(np.shape(g) + (1,) * len(extents)) if v in env else g)
                 for v, g in inner.items()}
        src = self.eval(e.source, inner)
        full = np.broadcast_shapes(np.shape(src), *(np.shape(g) for g in inner.values()))
        src = np.broadcast_to(src, full)
        axes = tuple(range(len(full) - len(extents), len(full)))
        dtype = e.dtype.np
        wide = np.float32 if e.dtype.is_float and dtype.itemsize < 4 else dtype
        src = src.astype(wide)
        if e.condition is not None:
            cond = np.broadcast_to(self.eval(e.condition, inner), full)
            src = np.where(cond, src, _identity(e.combiner, np.dtype(wide)))
        if any(n == 0 for n in extents):
            return np.broadcast_to(_identity(e.combiner, dtype),
                                   full[:len(full) - len(extents)])
        with np.errstate(all="ignore"):
            return _NP_REDUCE[e.combiner](src, axis=axes).astype(dtype)


def evaluate(outputs: list[Tensor], feeds: dict[str, np.ndarray],
             sizes: dict[str, int] | None = None) -> list[np.ndarray]:
    """Compute `outputs` from placeholder arrays `feeds` (by tensor name), stage by stage."""
    arrays = dict(feeds)
    ev = _Evaluator(arrays, dict(sizes or {}))
    for t in stages(outputs):
        if t.body is None:
            if t.name not in arrays:
                raise ComputeEvalError(f"no value fed for placeholder {t.name}")
            continue
        shape = tuple(ev.int_value(d) for d in t.shape)
        env = {}
        for k, (var, n) in enumerate(zip(t.axes, shape)):
            grid = [1] * len(shape)
            grid[k] = n
            env[var] = np.arange(n, dtype=np.int64).reshape(grid)
        value = ev.eval(t.body, env)
        arrays[t.name] = np.broadcast_to(value, shape).astype(t.dtype.np)  # a fresh copy
    return [arrays[t.name] for t in outputs]


def stages(outputs: list[Tensor]) -> list[Tensor]:
    """Every tensor `outputs` depend on, producers before their consumers."""
    order: list[Tensor] = []
    _postorder(outputs, order, set())
    return order


def _postorder(tensors, order, seen):
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        _postorder(producers(t), order, seen)
        order.append(t)



# ---------------------------------------------------------------------------------------------
# Running one op's compute rule (tests, and checks of new rules)


def apply_rule(op_name: str, inputs: list, attrs: dict, out_types: list) -> list[Tensor]:
    """Call op `op_name`'s compute rule; `inputs` are Tensors (None for absent ones)."""
    from .ops.registry import get_op

    op = get_op(op_name)
    if op.compute is None:
        raise NoCompute(f"{op_name} has no compute rule")
    out = op.compute(list(inputs), list(out_types), **attrs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for t, want in zip(outs, out_types):
        if t.dtype is not want.dtype or len(t.shape) != len(want.shape):
            raise ComputeEvalError(f"{op_name}'s compute rule gives {t.dtype.name} of rank "
                                   f"{len(t.shape)}; inferred {want}")
    return outs


def run_rule(op_name: str, arrays: list, attrs: dict | None = None, const_inputs=(),
             num_outputs: int | None = None) -> list[np.ndarray]:
    """Run an op's compute rule on NumPy arrays through `evaluate`: the same contract as
    `OpDef.run`, so tests compare the two. Inputs listed in `const_inputs` are compile-time
    constants (their values are visible to the rule, as shape inputs are in a model)."""
    from .graph import Value
    from .ops.registry import infer_node

    values = []
    for k, a in enumerate(arrays):
        if a is None:
            values.append(None)
            continue
        a = np.asarray(a)
        values.append(Value(f"in{k}", T.TensorType(T.DType.from_numpy(a.dtype), a.shape),
                            const=a if k in const_inputs else None))
    from .ops.registry import get_op
    nout = num_outputs or get_op(op_name).num_outputs[0]
    types, _, full = infer_node(op_name, values, dict(attrs or {}), nout, op_name)
    tensors = [None if v is None else placeholder(v.name, v.type.dtype, v.type.shape,
                                                   value=v.const) for v in values]
    outs = apply_rule(op_name, tensors, full, types)
    feeds = {f"in{k}": np.asarray(a) for k, a in enumerate(arrays) if a is not None}
    return evaluate(outs, feeds)
