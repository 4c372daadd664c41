"""Define-by-run tracing of NumPy code: `dnnc.trace(fn, *example_args) -> Graph` (`dnnc.jit`,
in compiler/jit.py, compiles traced functions per signature).

The array arguments of `fn` become `TracerArray`s, which implement NumPy's `__array_ufunc__`
and `__array_function__` protocols and the ndarray methods a model uses; each NumPy call on
them appends registered ops to a Graph. Python control flow runs at trace time, so the graph
records the path taken; arrays that are not tracers (closed over, or computed from shapes)
become constants. Dtypes follow NumPy's own rules (NEP 50): the ufunc's loop is resolved by
NumPy (`ufunc.resolve_dtypes`), operands are cast to it, and the registered op must agree.
Translations live in two dispatch tables, keyed by ufunc and by NumPy function; anything else
raises `TraceError` naming the function. This module never evaluates a graph and never
imports a backend.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import numpy as np

from ..errors import ArgumentError, DNNCError, TraceError
from ..ir import types as T
from ..ir.graph import Graph, Value
from .onnx import constant_value

__all__ = ["trace", "trace_graph", "TracerArray"]


# ---------------------------------------------------------------------------------------------
# The trace being recorded and its arrays


class _Trace:
    """The graph being built; tracers point at it."""

    def __init__(self, name: str):
        self.graph = Graph(name)
        self.consts = 0

    def const(self, array) -> Value:
        array = np.asarray(array)
        self.consts += 1
        try:
            return constant_value(f"const.{self.consts}", array)
        except DNNCError as exc:
            raise TraceError(f"a constant of dtype {array.dtype} cannot be traced: {exc}") \
                from None

    def add(self, where: str, op: str, *inputs: Value | None, num_outputs: int = 1,
            **attrs) -> list[Value]:
        """Append a node; an op refusing its inputs becomes a TraceError naming `where`."""
        try:
            return self.graph.add_node(op, list(inputs), attrs, num_outputs=num_outputs)
        except DNNCError as exc:
            raise TraceError(f"{where}: dnnc's {op} cannot take these operands "
                             f"({', '.join(str(v.type) for v in inputs if v is not None)}): "
                             f"{exc}") from None


def _dtype_of(dtype: np.dtype, where: str) -> T.DType:
    try:
        return T.DType.from_numpy(dtype)
    except TypeError:
        raise TraceError(f"{where}: dtype {dtype} is not supported by dnnc") from None


class TracerArray:
    """An array whose value is unknown at trace time: a Value of the graph being traced."""

    __array_priority__ = 1000  # Python operators with ndarrays defer to the tracer

    def __init__(self, trace: _Trace, value: Value):
        self._trace = trace
        self._value = value

    # -- what is known: type and shape ------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._value.type.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._value.type.dtype.np

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"TracerArray({self._value.type})"

    # -- what is not: values ------------------------------------------------------------------

    def __bool__(self):
        raise TraceError("the truth value of a traced array is unknown at trace time: Python "
                         "control flow may depend on shapes and constants, not on input values "
                         "(use np.where for a data-dependent choice)")

    def __array__(self, dtype=None, copy=None):
        raise TraceError("a traced array has no value at trace time and cannot become a NumPy "
                         "array (np.asarray, float(), a NumPy function dnnc does not trace)")

    def __float__(self):
        return self.__array__()

    __int__ = __index__ = __float__

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # -- the NumPy protocols ------------------------------------------------------------------

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        if kwargs.get("out") is not None or kwargs.get("where", True) is not True:
            raise TraceError(f"{name}: out= and where= are not supported when tracing")
        if method == "reduce" and ufunc in _UFUNC_REDUCTIONS:
            kwargs.pop("out", None)
            kwargs.setdefault("axis", 0)  # ufunc.reduce's default, unlike np.sum's
            return _reduce(_UFUNC_REDUCTIONS[ufunc], name, inputs[0], **kwargs)
        if method != "__call__" or ufunc not in UFUNCS:
            raise TraceError(f"{name} is not supported by dnnc.trace")
        if kwargs.pop("dtype", None) is not None or kwargs.pop("signature", None) is not None:
            raise TraceError(f"{name}: dtype= and signature= are not supported when tracing")
        kwargs.pop("out", None)
        kwargs.pop("where", None)
        if kwargs:
            raise TraceError(f"{name}: arguments {sorted(kwargs)} are not supported")
        return UFUNCS[ufunc](name, ufunc, *inputs)

    def __array_function__(self, func, types, args, kwargs):
        handler = FUNCTIONS.get(func)
        if handler is None:
            raise TraceError(f"numpy.{func.__name__} is not supported by dnnc.trace "
                             f"(supported: {', '.join(sorted(f.__name__ for f in FUNCTIONS))})")
        return handler(*args, **kwargs)

    # -- operators (through the ufuncs, as ndarray's own operators) ---------------------------

    def __add__(self, o):
        return np.add(self, o)

    def __radd__(self, o):
        return np.add(o, self)

    def __sub__(self, o):
        return np.subtract(self, o)

    def __rsub__(self, o):
        return np.subtract(o, self)

    def __mul__(self, o):
        return np.multiply(self, o)

    def __rmul__(self, o):
        return np.multiply(o, self)

    def __truediv__(self, o):
        return np.true_divide(self, o)

    def __rtruediv__(self, o):
        return np.true_divide(o, self)

    def __floordiv__(self, o):
        return np.floor_divide(self, o)

    def __rfloordiv__(self, o):
        return np.floor_divide(o, self)

    def __mod__(self, o):
        return np.remainder(self, o)

    def __rmod__(self, o):
        return np.remainder(o, self)

    def __pow__(self, o):
        # ndarray.__pow__ computes these scalar exponents by cheaper ufuncs; so do we
        fast = _FAST_POWERS.get(o) if type(o) in (int, float) else None
        return fast(self) if fast is not None else np.power(self, o)

    def __rpow__(self, o):
        return np.power(o, self)

    def __matmul__(self, o):
        return np.matmul(self, o)

    def __rmatmul__(self, o):
        return np.matmul(o, self)

    def __neg__(self):
        return np.negative(self)

    def __pos__(self):
        return np.positive(self)

    def __abs__(self):
        return np.absolute(self)

    def __invert__(self):
        return np.invert(self)

    def __and__(self, o):
        return np.bitwise_and(self, o)

    def __rand__(self, o):
        return np.bitwise_and(o, self)

    def __or__(self, o):
        return np.bitwise_or(self, o)

    def __ror__(self, o):
        return np.bitwise_or(o, self)

    def __xor__(self, o):
        return np.bitwise_xor(self, o)

    def __rxor__(self, o):
        return np.bitwise_xor(o, self)

    def __eq__(self, o):
        return np.equal(self, o)

    def __ne__(self, o):
        return np.not_equal(self, o)

    def __lt__(self, o):
        return np.less(self, o)

    def __le__(self, o):
        return np.less_equal(self, o)

    def __gt__(self, o):
        return np.greater(self, o)

    def __ge__(self, o):
        return np.greater_equal(self, o)

    __hash__ = object.__hash__

    def __getitem__(self, index):
        return _getitem(self, index)

    # -- ndarray methods ----------------------------------------------------------------------

    @property
    def T(self):
        return _transpose(self)

    def reshape(self, *shape, order="C"):
        return _reshape(self, shape[0] if len(shape) == 1 else shape, order=order)

    def transpose(self, *axes):
        return _transpose(self, axes[0] if len(axes) == 1 else (axes or None))

    def astype(self, dtype, copy=True):
        return _astype(self, dtype)

    def flatten(self):
        return _reshape(self, -1)

    ravel = flatten

    def swapaxes(self, a, b):
        return _swapaxes(self, a, b)

    def squeeze(self, axis=None):
        return _squeeze(self, axis)

    def sum(self, axis=None, dtype=None, keepdims=False):
        return _sum(self, axis, dtype, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False):
        return _mean(self, axis, dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return _max(self, axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        return _min(self, axis, keepdims=keepdims)

    def prod(self, axis=None, dtype=None, keepdims=False):
        return _prod(self, axis, dtype, keepdims=keepdims)

    def var(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return _var(self, axis, dtype, ddof=ddof, keepdims=keepdims)

    def std(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return _std(self, axis, dtype, ddof=ddof, keepdims=keepdims)

    def argmax(self, axis=None, keepdims=False):
        return _argmax(self, axis, keepdims=keepdims)

    def any(self, axis=None, keepdims=False):
        return _any(self, axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False):
        return _all(self, axis, keepdims=keepdims)

    def clip(self, min=None, max=None):
        return _clip(self, min, max)


# ---------------------------------------------------------------------------------------------
# Operands: tracers, arrays (strong types) and Python scalars (weak types, NEP 50)


def _find_trace(operands) -> _Trace:
    for x in operands:
        if isinstance(x, TracerArray):
            return x._trace
        if isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, TracerArray):
                    return y._trace
    raise TraceError("no traced array among the operands")  # a dispatch bug, never a user's


def _is_weak(x) -> bool:
    """Python int and float adopt the other operand's precision (NEP 50); a Python bool is
    NumPy's bool (the lowest type, so either way the same)."""
    return type(x) in (int, float)


def _np_type(x):
    """What NumPy's dtype resolution takes for an operand: a dtype, or a Python scalar type
    (weak: it adopts the other operand's precision)."""
    if isinstance(x, TracerArray):
        return x.dtype
    if _is_weak(x):
        return type(x)
    return np.asarray(x).dtype


def _as_value(trace: _Trace, x, dtype: np.dtype, where: str) -> Value:
    """Operand `x` as a Value of `dtype` (a Cast, or a constant converted as NumPy would)."""
    if isinstance(x, TracerArray):
        if x.dtype == dtype:
            return x._value
        return trace.add(where, "Cast", x._value, to=_dtype_of(dtype, where))[0]
    if _is_weak(x):
        try:
            return trace.const(np.asarray(x, dtype=dtype))  # NumPy 2 raises on overflow
        except OverflowError as exc:
            raise TraceError(f"{where}: {exc}") from None
    array = np.asarray(x)
    if array.dtype.kind not in "biuf":
        raise TraceError(f"{where}: operand of dtype {array.dtype} is not supported")
    return trace.const(array.astype(dtype, copy=False))


def _wrap(trace: _Trace, value: Value) -> TracerArray:
    return TracerArray(trace, value)


def _check_dtype(out: Value, expected: np.dtype, where: str) -> None:
    if out.type.dtype.np != expected:
        raise TraceError(f"{where}: NumPy computes {expected}, dnnc's op gives "
                         f"{out.type.dtype.name}; refusing a silently different result")


# ---------------------------------------------------------------------------------------------
# Ufuncs: one helper for every elementwise op


def _resolve(ufunc, where: str, operands) -> tuple[np.dtype, ...]:
    """NumPy's loop for these operands: (input dtypes..., output dtype)."""
    try:
        return ufunc.resolve_dtypes(tuple(_np_type(x) for x in operands) + (None,) * ufunc.nout)
    except Exception as exc:  # NumPy has no loop: the same error NumPy would raise
        raise TraceError(f"{where}: NumPy has no loop for these operands: {exc}") from None


def _elementwise(op: str, **attrs) -> Callable:
    """A ufunc handler: operands cast to NumPy's loop dtypes, then the registered op."""

    def handler(where, ufunc, *operands):
        trace = _find_trace(operands)
        dtypes = _resolve(ufunc, where, operands)
        values = [_as_value(trace, x, d, where) for x, d in zip(operands, dtypes)]
        out = trace.add(where, op, *values, **attrs)[0]
        _check_dtype(out, dtypes[-1], where)
        return _wrap(trace, out)

    return handler


def _composite(build: Callable) -> Callable:
    """A ufunc handler whose op is a small graph: `build(where, values, out_dtype) -> Value`
    on operands already cast to NumPy's loop dtypes."""

    def handler(where, ufunc, *operands):
        trace = _find_trace(operands)
        dtypes = _resolve(ufunc, where, operands)
        values = [_as_value(trace, x, d, where) for x, d in zip(operands, dtypes)]
        out = build(trace, where, values, dtypes)
        _check_dtype(out, dtypes[-1], where)
        return _wrap(trace, out)

    return handler


def _by_kind(bool_op: str, int_op: str) -> Callable:
    """Bitwise ufuncs: logical on bool, bitwise on integers (as NumPy's loops)."""

    def build(trace, where, values, dtypes):
        op = bool_op if dtypes[0].kind == "b" else int_op
        return trace.add(where, op, *values)[0]

    return _composite(build)


def _square(trace, where, values, dtypes):
    return trace.add(where, "Mul", values[0], values[0])[0]


def _not_equal(trace, where, values, dtypes):
    eq = trace.add(where, "Equal", *values)[0]
    return trace.add(where, "Not", eq)[0]


def _floor_divide(trace, where, values, dtypes):
    if dtypes[0].kind not in "f":  # dnnc's integer Div truncates; NumPy's floors
        raise TraceError(f"{where}: integer floor division is not supported when tracing")
    q = trace.add(where, "Div", *values)[0]
    return trace.add(where, "Floor", q)[0]


def _identity(trace, where, values, dtypes):
    return trace.add(where, "Identity", values[0])[0]


UFUNCS: dict[Any, Callable] = {
    np.add: _elementwise("Add"), np.subtract: _elementwise("Sub"),
    np.multiply: _elementwise("Mul"), np.true_divide: _elementwise("Div"),
    np.power: _elementwise("Pow"), np.remainder: _elementwise("Mod", fmod=0),
    np.fmod: _elementwise("Mod", fmod=1), np.floor_divide: _composite(_floor_divide),
    np.maximum: _elementwise("Max"), np.minimum: _elementwise("Min"),
    np.matmul: _elementwise("MatMul"),
    np.negative: _elementwise("Neg"), np.positive: _composite(_identity),
    np.absolute: _elementwise("Abs"), np.sign: _elementwise("Sign"),
    np.reciprocal: _elementwise("Reciprocal"), np.square: _composite(_square),
    np.sqrt: _elementwise("Sqrt"), np.exp: _elementwise("Exp"), np.log: _elementwise("Log"),
    np.tanh: _elementwise("Tanh"), np.sin: _elementwise("Sin"), np.cos: _elementwise("Cos"),
    np.tan: _elementwise("Tan"), np.arcsin: _elementwise("Asin"),
    np.arccos: _elementwise("Acos"), np.arctan: _elementwise("Atan"),
    np.sinh: _elementwise("Sinh"), np.cosh: _elementwise("Cosh"),
    np.arcsinh: _elementwise("Asinh"), np.arccosh: _elementwise("Acosh"),
    np.arctanh: _elementwise("Atanh"), np.floor: _elementwise("Floor"),
    np.ceil: _elementwise("Ceil"), np.rint: _elementwise("Round"),
    np.equal: _elementwise("Equal"), np.not_equal: _composite(_not_equal),
    np.less: _elementwise("Less"), np.less_equal: _elementwise("LessOrEqual"),
    np.greater: _elementwise("Greater"), np.greater_equal: _elementwise("GreaterOrEqual"),
    np.logical_and: _elementwise("And"), np.logical_or: _elementwise("Or"),
    np.logical_xor: _elementwise("Xor"), np.logical_not: _elementwise("Not"),
    np.bitwise_and: _by_kind("And", "BitwiseAnd"), np.bitwise_or: _by_kind("Or", "BitwiseOr"),
    np.bitwise_xor: _by_kind("Xor", "BitwiseXor"), np.invert: _by_kind("Not", "BitwiseNot"),
}
"""NumPy ufunc -> handler(where, ufunc, *operands); matmul is a gufunc with the same rules."""

_FAST_POWERS = {2: np.square, 1: np.positive, 0.5: np.sqrt, -1: np.reciprocal}
"""Scalar exponents `ndarray.__pow__` evaluates by another ufunc (numpy fast_scalar_power)."""


# ---------------------------------------------------------------------------------------------
# Reductions (axes are an int64 input of dnnc's Reduce* ops)


def _tracer(x, where: str) -> TracerArray:
    if not isinstance(x, TracerArray):
        raise TraceError(f"{where}: expected a traced array, given {type(x).__name__}")
    return x


def _axes(x: TracerArray, axis, where: str) -> list[int] | None:
    if axis is None:
        return None
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = []
    for a in axes:
        if not -x.ndim <= a < x.ndim:
            raise TraceError(f"{where}: axis {a} is out of bounds for an array of "
                             f"dimension {x.ndim}")
        out.append(int(a) % x.ndim)
    return out


def _reduce(op: str, where: str, x, axis=None, dtype=None, keepdims=False,
            out_dtype: np.dtype | None = None, **unsupported) -> TracerArray:
    """Reduce<op> over `axis` (None: all) with NumPy's accumulator dtype `out_dtype`."""
    x = _tracer(x, where)
    unsupported = {k: v for k, v in unsupported.items() if v is not None}
    if unsupported:
        raise TraceError(f"{where}: arguments {sorted(unsupported)} are not supported")
    trace = x._trace
    target = np.dtype(dtype) if dtype is not None else (out_dtype or x.dtype)
    value = _as_value(trace, x, target, where)
    axes = _axes(x, axis, where)
    if axes == []:  # no axes: NumPy returns the (cast) array
        return _wrap(trace, value)
    axes_value = None if axes is None else trace.const(np.array(axes, np.int64))
    out = trace.add(where, op, value, axes_value, keepdims=int(bool(keepdims)))[0]
    return _wrap(trace, out)


def _sum_dtype(dtype: np.dtype) -> np.dtype:
    """NumPy's sum/prod accumulate small integers and bools in the platform int."""
    if dtype.kind == "b" or dtype.kind == "i" and dtype.itemsize < 8:
        return np.dtype(np.int64)
    if dtype.kind == "u" and dtype.itemsize < 8:
        return np.dtype(np.uint64)
    return dtype


def _mean_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype.kind in "biu" else dtype


def _sum(x, axis=None, dtype=None, out=None, keepdims=False, **kw):
    x = _tracer(x, "numpy.sum")
    return _reduce("ReduceSum", "numpy.sum", x, axis, dtype, keepdims,
                   _sum_dtype(x.dtype), out=out, **kw)


def _prod(x, axis=None, dtype=None, out=None, keepdims=False, **kw):
    x = _tracer(x, "numpy.prod")
    return _reduce("ReduceProd", "numpy.prod", x, axis, dtype, keepdims,
                   _sum_dtype(x.dtype), out=out, **kw)


def _mean(x, axis=None, dtype=None, out=None, keepdims=False, **kw):
    x = _tracer(x, "numpy.mean")
    return _reduce("ReduceMean", "numpy.mean", x, axis, dtype, keepdims,
                   _mean_dtype(x.dtype), out=out, **kw)


def _max(x, axis=None, out=None, keepdims=False, **kw):
    return _reduce("ReduceMax", "numpy.max", x, axis, None, keepdims, out=out, **kw)


def _min(x, axis=None, out=None, keepdims=False, **kw):
    return _reduce("ReduceMin", "numpy.min", x, axis, None, keepdims, out=out, **kw)


def _var(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kw):
    """NumPy's definition: mean(abs(x - x.mean(axis, keepdims=True))**2) * n / (n - ddof)."""
    x = _tracer(x, "numpy.var")
    if dtype is not None or out is not None or any(v is not None for v in kw.values()):
        raise TraceError("numpy.var: only axis, ddof and keepdims are supported")
    x = x.astype(_mean_dtype(x.dtype)) if x.dtype.kind in "biu" else x
    centred = x - _mean(x, axis, keepdims=True)
    var = _mean(centred * centred, axis, keepdims=keepdims)
    if ddof:
        axes = _axes(x, axis, "numpy.var")
        n = math.prod(x.shape[a] for a in (range(x.ndim) if axes is None else axes))
        var = var * (n / (n - ddof))
    return var


def _std(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kw):
    return np.sqrt(_var(x, axis, dtype, out, ddof, keepdims, **kw))


def _argmax(x, axis=None, out=None, keepdims=False):
    x = _tracer(x, "numpy.argmax")
    if out is not None:
        raise TraceError("numpy.argmax: out= is not supported")
    if axis is None:
        x, axis = _reshape(x, -1), 0
    out_value = x._trace.add("numpy.argmax", "ArgMax", x._value,
                             axis=_axes(x, axis, "numpy.argmax")[0],
                             keepdims=int(bool(keepdims)))[0]
    return _wrap(x._trace, out_value)


def _truth_reduction(op: str, where: str):
    """any / all: the truth values as int32 (Reduce* take no bool), Reduce{Max,Min}, bool."""

    def handler(x, axis=None, out=None, keepdims=False, **kw):
        x = _tracer(x, where)
        truth = _astype(_astype(x, bool), np.int32)
        return _astype(_reduce(op, where, truth, axis, None, keepdims, out=out, **kw), bool)

    return handler


_any = _truth_reduction("ReduceMax", "numpy.any")
_all = _truth_reduction("ReduceMin", "numpy.all")


_UFUNC_REDUCTIONS = {np.add: "ReduceSum", np.multiply: "ReduceProd", np.maximum: "ReduceMax",
                     np.minimum: "ReduceMin"}
"""`ufunc.reduce` as a Reduce* op (axis=0 by default, as NumPy)."""


# ---------------------------------------------------------------------------------------------
# Shape ops


def _shape_of(x) -> tuple[int, ...]:
    return x.shape if isinstance(x, TracerArray) else np.shape(x)


def _lift(trace: _Trace, x, where: str) -> TracerArray:
    """A closed-over array (or scalar) as a constant tracer, its dtype as NumPy's."""
    if isinstance(x, TracerArray):
        return x
    array = np.asarray(x)
    return _wrap(trace, _as_value(trace, array, array.dtype, where))


def _reshape(x, shape, order="C"):
    x = _tracer(x, "numpy.reshape")
    if order != "C":
        raise TraceError("numpy.reshape: only order='C' is supported")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    try:  # NumPy resolves -1 and checks the size, on a zero-stride stand-in
        new = np.broadcast_to(np.empty((), np.int8), x.shape).reshape(shape).shape
    except ValueError as exc:
        raise TraceError(f"numpy.reshape: {exc}") from None
    if new == x.shape:
        return x
    out = x._trace.add("numpy.reshape", "Reshape", x._value,
                       x._trace.const(np.array(new, np.int64)), allowzero=1)[0]
    return _wrap(x._trace, out)


def _transpose(x, axes=None):
    x = _tracer(x, "numpy.transpose")
    perm = list(range(x.ndim))[::-1] if axes is None else _axes(x, axes, "numpy.transpose")
    if sorted(perm) != list(range(x.ndim)):
        raise TraceError(f"numpy.transpose: axes {axes} are not a permutation")
    if perm == list(range(x.ndim)):
        return x
    return _wrap(x._trace, x._trace.add("numpy.transpose", "Transpose", x._value, perm=perm)[0])


def _swapaxes(x, axis1, axis2):
    perm = list(range(x.ndim))
    a, b = _axes(x, (axis1, axis2), "numpy.swapaxes")
    perm[a], perm[b] = perm[b], perm[a]
    return _transpose(x, perm)


def _moveaxis(x, source, destination):
    x = _tracer(x, "numpy.moveaxis")
    src = _axes(x, source, "numpy.moveaxis")
    dst = _axes(x, destination, "numpy.moveaxis")
    order = [n for n in range(x.ndim) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return _transpose(x, order)


def _astype(x, dtype):
    x = _tracer(x, "astype")
    dtype = np.dtype(dtype)
    where = f"astype({dtype})"
    if dtype == x.dtype:
        return x
    return _wrap(x._trace, _as_value(x._trace, x, dtype, where))


def _squeeze(x, axis=None):
    x = _tracer(x, "numpy.squeeze")
    axes = [a for a in range(x.ndim) if x.shape[a] == 1] if axis is None \
        else _axes(x, axis, "numpy.squeeze")
    if any(x.shape[a] != 1 for a in axes):
        raise TraceError("numpy.squeeze: cannot select an axis to squeeze out which has size "
                         "not equal to one")
    if not axes:
        return x
    out = x._trace.add("numpy.squeeze", "Squeeze", x._value,
                       x._trace.const(np.array(axes, np.int64)))[0]
    return _wrap(x._trace, out)


def _expand_dims(x, axis):
    x = _tracer(x, "numpy.expand_dims")
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    rank = x.ndim + len(axes)
    axes = sorted(int(a) % rank for a in axes)
    out = x._trace.add("numpy.expand_dims", "Unsqueeze", x._value,
                       x._trace.const(np.array(axes, np.int64)))[0]
    return _wrap(x._trace, out)


def _broadcast_to(x, shape):
    x = _tracer(x, "numpy.broadcast_to")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if np.broadcast_shapes(x.shape, shape) != shape:
        raise TraceError(f"numpy.broadcast_to: cannot broadcast {x.shape} to {shape}")
    out = x._trace.add("numpy.broadcast_to", "Expand", x._value,
                       x._trace.const(np.array(shape, np.int64)))[0]
    return _wrap(x._trace, out)


def _common(where: str, arrays, trace: _Trace | None = None
            ) -> tuple[_Trace, list[Value], np.dtype]:
    """A sequence of operands as Values of NumPy's common dtype (np.result_type)."""
    arrays = list(arrays)
    trace = trace or _find_trace(arrays)
    dtype = np.result_type(*(_np_type(a) if not _is_weak(a) else a for a in arrays))
    return trace, [_as_value(trace, a, dtype, where) for a in arrays], dtype


def _concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    if axis is None or out is not None or dtype is not None:
        raise TraceError("numpy.concatenate: axis=None, out= and dtype= are not supported")
    trace, values, _ = _common("numpy.concatenate", arrays)
    rank = len(_shape_of(arrays[0]))
    out_value = trace.add("numpy.concatenate", "Concat", *values, axis=int(axis) % rank)[0]
    return _wrap(trace, out_value)


def _stack(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    arrays = list(arrays)
    trace = _find_trace(arrays)
    rank = len(_shape_of(arrays[0])) + 1
    axis = int(axis) % rank
    lifted = [_expand_dims(_lift(trace, a, "numpy.stack"), axis) for a in arrays]
    return _concatenate(lifted, axis=axis, out=out, dtype=dtype)


def _split(x, indices_or_sections, axis=0):
    x = _tracer(x, "numpy.split")
    axis = _axes(x, axis, "numpy.split")[0]
    n = x.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        if n % indices_or_sections:
            raise TraceError("numpy.split: array split does not result in an equal division")
        bounds = [n // indices_or_sections * k for k in range(indices_or_sections + 1)]
    else:
        bounds = [0] + [min(max(int(i) + (n if i < 0 else 0), 0), n)
                        for i in indices_or_sections] + [n]
    sizes = [max(b - a, 0) for a, b in zip(bounds, bounds[1:])]
    outs = x._trace.add("numpy.split", "Split", x._value,
                        x._trace.const(np.array(sizes, np.int64)), axis=axis,
                        num_outputs=len(sizes))
    return [_wrap(x._trace, v) for v in outs]


def _pad(x, pad_width, mode="constant", constant_values=0, **kwargs):
    x = _tracer(x, "numpy.pad")
    modes = {"constant": "constant", "reflect": "reflect", "edge": "edge"}
    if mode not in modes or kwargs:
        raise TraceError(f"numpy.pad: mode {mode!r} (or {sorted(kwargs)}) is not supported; "
                         f"supported modes: {', '.join(modes)}")
    widths = np.broadcast_to(np.asarray(pad_width, np.int64), (x.ndim, 2))
    pads = np.concatenate([widths[:, 0], widths[:, 1]]).astype(np.int64)
    trace = x._trace
    inputs = [x._value, trace.const(pads)]
    if mode == "constant":
        if not np.isscalar(constant_values):
            raise TraceError("numpy.pad: only a scalar constant_values is supported")
        inputs.append(trace.const(np.asarray(constant_values).astype(x.dtype)))
    return _wrap(trace, trace.add("numpy.pad", "Pad", *inputs, mode=modes[mode])[0])


def _where(condition, x=None, y=None):
    if x is None or y is None:
        raise TraceError("numpy.where with one argument (the indices of true elements) has a "
                         "data-dependent shape and cannot be traced")
    trace = _find_trace([condition, x, y])
    cond = _as_value(trace, condition, np.dtype(bool), "numpy.where")
    _, (xv, yv), _ = _common("numpy.where", [x, y], trace)
    return _wrap(trace, trace.add("numpy.where", "Where", cond, xv, yv)[0])


def _clip(a, a_min=None, a_max=None, out=None, **kwargs):
    if out is not None or kwargs:
        raise TraceError("numpy.clip: out= and other arguments are not supported")
    # NumPy's clip is minimum(maximum(a, a_min), a_max), with the same dtype rules
    if a_min is not None:
        a = np.maximum(a, a_min)
    if a_max is not None:
        a = np.minimum(a, a_max)
    return a


def _einsum(subscripts, *operands, out=None, optimize=False, dtype=None, **kwargs):
    if not isinstance(subscripts, str) or out is not None or dtype is not None or kwargs:
        raise TraceError("numpy.einsum: only a subscripts string and operands are supported")
    trace, values, _ = _common("numpy.einsum", operands)
    out_value = trace.add("numpy.einsum", "Einsum", *values,
                          equation=subscripts.replace(" ", ""))[0]
    return _wrap(trace, out_value)


def _dot(a, b, out=None):
    if out is not None or len(_shape_of(a)) > 2 or len(_shape_of(b)) > 2:
        raise TraceError("numpy.dot: only arrays of rank <= 2 (and no out=) are supported; "
                         "use @ / numpy.matmul")
    if len(_shape_of(a)) == 0 or len(_shape_of(b)) == 0:
        return np.multiply(a, b)
    return np.matmul(a, b)


def _like(fill):
    def handler(a, dtype=None, order="K", subok=True, shape=None, **kwargs):
        dtype = np.dtype(dtype) if dtype is not None else _np_type(a)
        shape = _shape_of(a) if shape is None else shape
        return fill(shape, dtype, **kwargs)   # static shape: a NumPy constant

    return handler


def _full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None):
    return _like(lambda s, d: np.full(s, fill_value, d))(a, dtype, shape=shape)


FUNCTIONS: dict[Callable, Callable] = {
    np.sum: _sum, np.mean: _mean, np.max: _max, np.amax: _max, np.min: _min, np.amin: _min,
    np.prod: _prod, np.var: _var, np.std: _std, np.argmax: _argmax, np.any: _any,
    np.all: _all,
    np.reshape: lambda a, shape=None, order="C", **kw: _reshape(a, kw.get("newshape", shape),
                                                                   order),
    np.transpose: _transpose, np.swapaxes: _swapaxes, np.moveaxis: _moveaxis,
    np.squeeze: _squeeze, np.expand_dims: _expand_dims, np.broadcast_to: _broadcast_to,
    np.concatenate: _concatenate, np.stack: _stack, np.split: _split, np.pad: _pad,
    np.where: _where, np.clip: _clip, np.einsum: _einsum, np.dot: _dot,
    np.shape: _shape_of, np.ndim: lambda a: len(_shape_of(a)),
    np.zeros_like: _like(np.zeros), np.ones_like: _like(np.ones), np.full_like: _full_like,
}
"""NumPy function -> handler, called with the function's own arguments."""


# ---------------------------------------------------------------------------------------------
# Indexing: basic (ints, slices, None, Ellipsis) and one integer-array index

_INT64_MIN = np.iinfo(np.int64).min


def _index_tuple(x: TracerArray, index) -> list:
    """The index as one entry per axis (None entries added), the Ellipsis spelled out."""
    items = list(index) if isinstance(index, tuple) else [index]
    ellipses = [k for k, i in enumerate(items) if i is Ellipsis]
    if len(ellipses) > 1:
        raise TraceError("an index can only have a single ellipsis ('...')")
    used = sum(1 for i in items if i is not None and i is not Ellipsis)
    if used > x.ndim:
        raise TraceError(f"too many indices for array: array is {x.ndim}-dimensional, but "
                         f"{used} were indexed")
    fill = [slice(None)] * (x.ndim - used)
    if ellipses:
        items[ellipses[0]:ellipses[0] + 1] = fill
    else:
        items += fill
    return items


def _is_array_index(i) -> bool:
    return isinstance(i, (TracerArray, np.ndarray, list))


def _check_no_masks(items) -> None:
    for i in items:
        if isinstance(i, (bool, np.bool_)) or \
                isinstance(i, (np.ndarray, TracerArray)) and i.dtype == bool or \
                isinstance(i, list) and np.asarray(i).dtype == bool:
            raise TraceError("boolean mask indexing has a data-dependent shape and cannot be "
                             "traced (use np.where)")


def _index_value(trace: _Trace, i, n: int, where: str) -> TracerArray:
    """An integer or integer-array index as an int64 tracer, constants checked and made
    non-negative at trace time."""
    if isinstance(i, TracerArray):
        if i.dtype.kind not in "iu":
            raise TraceError(f"arrays used as indices must be of integer type, given {i.dtype}")
        return _astype(i, np.int64)
    idx = np.asarray(i)
    if idx.dtype.kind not in "iu":
        raise TraceError(f"arrays used as indices must be of integer type, given {idx.dtype}")
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise TraceError(f"an index is out of bounds for an axis with size {n}")
    return _lift(trace, np.where(idx < 0, idx + n, idx).astype(np.int64), where)


def _advanced_getitem(x: TracerArray, items: list) -> TracerArray:
    """Several integer arrays (integers among them count as 0-d arrays), as NumPy: the
    broadcast index dims replace the indexed axes where these are adjacent, else lead.
    Slices first, then the indexed axes moved to the front for one GatherND."""
    where = "indexing"
    if any(i is None for i in items):
        raise TraceError("None (np.newaxis) together with several integer-array indices is "
                         "not supported when tracing")
    trace = x._trace
    basic = [i if isinstance(i, slice) else slice(None) for i in items]
    sliced = _getitem(x, tuple(basic)) if any(b != slice(None) for b in basic) else x
    adv = [k for k, i in enumerate(items) if not isinstance(i, slice)]
    rest = [k for k in range(x.ndim) if k not in adv]
    indices = [_index_value(trace, items[k], sliced.shape[k], where) for k in adv]
    batch = np.broadcast_shapes(*(t.shape for t in indices))
    stacked = _stack([_broadcast_to(t, batch) if t.shape != batch else t for t in indices],
                     axis=-1)
    data = _transpose(sliced, adv + rest)
    out = _wrap(trace, trace.add(where, "GatherND", data._value, stacked._value)[0])
    if adv == list(range(adv[0], adv[-1] + 1)) and adv[0] > 0:  # adjacent: dims stay there
        b, first = len(batch), adv[0]
        out = _transpose(out, [b + j for j in range(first)] + list(range(b))
                         + [b + j for j in range(first, len(rest))])
    return out


def _getitem(x: TracerArray, index) -> TracerArray:
    trace = x._trace
    where = "indexing"
    items = _index_tuple(x, index)
    _check_no_masks(items)
    arrays = [k for k, i in enumerate(items) if _is_array_index(i)]
    if arrays:
        advanced = [k for k, i in enumerate(items)
                    if _is_array_index(i) or isinstance(i, (int, np.integer))]
        if len(arrays) > 1 or advanced != list(range(advanced[0], advanced[-1] + 1)):
            return _advanced_getitem(x, items)
    starts, ends, steps, axes, squeeze, unsqueeze = [], [], [], [], [], []
    array_at = None
    axis = 0      # axis of x (Slice keeps the rank; Squeeze and Gather read x's axes)
    out_axis = 0  # axis of the result (Unsqueeze writes the result's axes)
    for i in items:
        if i is None:
            unsqueeze.append(out_axis)
            out_axis += 1
            continue
        n = x.shape[axis]
        if isinstance(i, (int, np.integer)):
            if not -n <= i < n:
                raise TraceError(f"index {i} is out of bounds for axis {axis} with size {n}")
            k = int(i) % n
            starts.append(k), ends.append(k + 1), steps.append(1), axes.append(axis)
            squeeze.append(axis)
        elif isinstance(i, slice):
            start, stop, step = i.indices(n)
            if (start, stop, step) != (0, n, 1):
                if step < 0 and stop < 0:
                    stop = _INT64_MIN  # "before index 0" (a negative end counts from the end)
                starts.append(start), ends.append(stop), steps.append(step), axes.append(axis)
            out_axis += 1
        elif _is_array_index(i):
            array_at = (axis, i)
            out_axis += len(_shape_of(i))
        else:
            raise TraceError(f"index of type {type(i).__name__} is not supported")
        axis += 1
    value = x._value
    if axes:
        consts = [trace.const(np.array(v, np.int64)) for v in (starts, ends, axes, steps)]
        value = trace.add(where, "Slice", value, *consts)[0]
    if array_at is not None:
        at, idx = array_at
        if not isinstance(idx, TracerArray):
            idx = np.asarray(idx)
            if idx.dtype.kind not in "iu":
                raise TraceError(f"arrays used as indices must be of integer type, "
                                 f"given {idx.dtype}")
            n = value.type.shape[at]
            if idx.size and (idx.min() < -n or idx.max() >= n):
                raise TraceError(f"an index is out of bounds for axis {at} with size {n}")
        index_value = _as_value(trace, idx, np.dtype(np.int64), where)
        value = trace.add(where, "Gather", value, index_value, axis=at)[0]
        # the index's dims replaced one axis: the later squeezes move by its rank - 1
        shift = len(_shape_of(idx)) - 1
        squeeze = [s + shift if s > at else s for s in squeeze]
    if squeeze:
        value = trace.add(where, "Squeeze", value, trace.const(np.array(squeeze, np.int64)))[0]
    if unsqueeze:
        value = trace.add(where, "Unsqueeze", value,
                          trace.const(np.array(unsqueeze, np.int64)))[0]
    return _wrap(trace, value)


# ---------------------------------------------------------------------------------------------
# trace


def is_array_arg(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic)) or \
        hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, TracerArray)


def _param_names(fn, count: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if params and params[-1].kind is inspect.Parameter.VAR_POSITIONAL:
        names += [f"{params[-1].name}{k}" for k in range(count)]
    return (names + [f"arg{k}" for k in range(count)])[:count]


def trace(fn: Callable, *example_args) -> Graph:
    """Run `fn` once on tracer arrays standing for `example_args` and return its Graph.

    Array arguments (NumPy arrays and scalars, or anything with `shape` and `dtype`) become
    graph inputs named after `fn`'s parameters; other arguments are passed through unchanged
    and fixed in the graph. `fn` returns a traced array or a tuple / list of them.
    """
    if not callable(fn):
        raise ArgumentError(f"dnnc.trace traces a function, not {type(fn).__name__}")
    return trace_graph(fn, example_args)[0]


def trace_graph(fn: Callable, example_args) -> tuple[Graph, bool]:
    """The traced Graph, and whether `fn` returned a tuple / list."""
    t = _Trace(getattr(fn, "__name__", "traced"))
    names = _param_names(fn, len(example_args))
    args = []
    for name, arg in zip(names, example_args):
        if is_array_arg(arg):
            dtype = _dtype_of(np.dtype(arg.dtype), f"argument {name!r}")
            value = t.graph.add_input(name, T.TensorType(dtype, tuple(int(d) for d in
                                                                      arg.shape)))
            args.append(TracerArray(t, value))
        else:
            args.append(arg)
    result = fn(*args)
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    seen = set()
    for k, r in enumerate(results):
        if not isinstance(r, TracerArray) or r._trace is not t:
            r = _lift(t, r, f"output {k}")
        value = r._value
        # an output that is an input, a constant or another output gets a node of its own,
        # so every graph output is a distinct node's value (as ONNX requires)
        if value.producer is None or id(value) in seen:
            value = t.add(f"output {k}", "Identity", value)[0]
        seen.add(id(value))
        t.graph.outputs.append(value)
    t.graph.verify()
    return t.graph, isinstance(result, (tuple, list))
