"""Define-by-run tracing of NumPy code: `dnnc.trace(fn, *example_args) -> Graph` (`dnnc.jit`,
in compiler/jit.py, compiles traced functions per signature).

The array arguments of `fn` become `TracerArray`s, which implement NumPy's `__array_ufunc__`
and `__array_function__` protocols and the ndarray methods a model uses; each NumPy call on
them appends registered ops to a Graph. Python control flow runs at trace time, so the graph
records the path taken; arrays that are not tracers (closed over, or computed from shapes)
become constants. Dtypes follow NumPy's own rules (NEP 50): the ufunc's loop is resolved by
NumPy (`ufunc.resolve_dtypes`), operands are cast to it, and the registered op must agree.
Translations live in two dispatch tables, keyed by ufunc and by NumPy function, in
`trace_numpy.py`; anything else raises `TraceError` naming the function. This module holds the
trace, the tracer and its operands; it never evaluates a graph and never imports a backend.
"""

from __future__ import annotations

import inspect
import math
from typing import Callable

import numpy as np

from ..errors import ArgumentError, DNNCError, TraceError
from ..ir import types as T
from ..ir.graph import Graph, Value
from .onnx import constant_value

__all__ = ["trace", "trace_graph", "TracerArray"]


# ---------------------------------------------------------------------------------------------
# The trace being recorded and its arrays


class Trace:
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


_FAST_POWERS = {2: np.square, 1: np.positive, 0.5: np.sqrt, -1: np.reciprocal}
"""Scalar exponents `ndarray.__pow__` evaluates by another ufunc (numpy fast_scalar_power)."""


class TracerArray:
    """An array whose value is unknown at trace time: a Value of the graph being traced."""

    __array_priority__ = 1000  # Python operators with ndarrays defer to the tracer

    def __init__(self, trace: Trace, value: Value):
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
        if method == "reduce" and ufunc in _numpy.UFUNC_REDUCTIONS:
            kwargs.pop("out", None)
            kwargs.setdefault("axis", 0)  # ufunc.reduce's default, unlike np.sum's
            return _numpy.reduction(_numpy.UFUNC_REDUCTIONS[ufunc], name, inputs[0], **kwargs)
        if method != "__call__" or ufunc not in _numpy.UFUNCS:
            raise TraceError(f"{name} is not supported by dnnc.trace")
        if kwargs.pop("dtype", None) is not None or kwargs.pop("signature", None) is not None:
            raise TraceError(f"{name}: dtype= and signature= are not supported when tracing")
        kwargs.pop("out", None)
        kwargs.pop("where", None)
        if kwargs:
            raise TraceError(f"{name}: arguments {sorted(kwargs)} are not supported")
        return _numpy.UFUNCS[ufunc](name, ufunc, *inputs)

    def __array_function__(self, func, types, args, kwargs):
        handler = _numpy.FUNCTIONS.get(func)
        if handler is None:
            supported = ", ".join(sorted(f.__name__ for f in _numpy.FUNCTIONS))
            raise TraceError(f"numpy.{func.__name__} is not supported by dnnc.trace "
                             f"(supported: {supported})")
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
        return _numpy.getitem(self, index)

    # -- ndarray methods ----------------------------------------------------------------------

    @property
    def T(self):
        return _handler(np.transpose)(self)

    def reshape(self, *shape, order="C"):
        return _handler(np.reshape)(self, shape[0] if len(shape) == 1 else shape, order=order)

    def transpose(self, *axes):
        return _handler(np.transpose)(self, axes[0] if len(axes) == 1 else (axes or None))

    def astype(self, dtype, copy=True):
        return _numpy.astype(self, dtype)

    def flatten(self):
        return _handler(np.reshape)(self, -1)

    ravel = flatten

    def swapaxes(self, a, b):
        return _handler(np.swapaxes)(self, a, b)

    def squeeze(self, axis=None):
        return _handler(np.squeeze)(self, axis)

    def sum(self, axis=None, dtype=None, keepdims=False):
        return _handler(np.sum)(self, axis, dtype, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False):
        return _handler(np.mean)(self, axis, dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return _handler(np.max)(self, axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        return _handler(np.min)(self, axis, keepdims=keepdims)

    def prod(self, axis=None, dtype=None, keepdims=False):
        return _handler(np.prod)(self, axis, dtype, keepdims=keepdims)

    def var(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return _handler(np.var)(self, axis, dtype, ddof=ddof, keepdims=keepdims)

    def std(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return _handler(np.std)(self, axis, dtype, ddof=ddof, keepdims=keepdims)

    def argmax(self, axis=None, keepdims=False):
        return _handler(np.argmax)(self, axis, keepdims=keepdims)

    def any(self, axis=None, keepdims=False):
        return _handler(np.any)(self, axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False):
        return _handler(np.all)(self, axis, keepdims=keepdims)

    def clip(self, min=None, max=None):
        return _handler(np.clip)(self, min, max)


def _handler(function: Callable) -> Callable:
    """The translation of NumPy `function` (ndarray methods share their function's)."""
    return _numpy.FUNCTIONS[function]


# ---------------------------------------------------------------------------------------------
# Operands: tracers, arrays (strong types) and Python scalars (weak types, NEP 50)


def find_trace(operands) -> Trace:
    for x in operands:
        if isinstance(x, TracerArray):
            return x._trace
        if isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, TracerArray):
                    return y._trace
    raise TraceError("no traced array among the operands")  # a dispatch bug, never a user's


def is_weak(x) -> bool:
    """Python int and float adopt the other operand's precision (NEP 50); a Python bool is
    NumPy's bool (the lowest type, so either way the same)."""
    return type(x) in (int, float)


def np_type(x):
    """What NumPy's dtype resolution takes for an operand: a dtype, or a Python scalar type
    (weak: it adopts the other operand's precision)."""
    if isinstance(x, TracerArray):
        return x.dtype
    if is_weak(x):
        return type(x)
    return np.asarray(x).dtype


def as_value(trace: Trace, x, dtype: np.dtype, where: str) -> Value:
    """Operand `x` as a Value of `dtype` (a Cast, or a constant converted as NumPy would)."""
    if isinstance(x, TracerArray):
        if x.dtype == dtype:
            return x._value
        return trace.add(where, "Cast", x._value, to=_dtype_of(dtype, where))[0]
    if is_weak(x):
        try:
            return trace.const(np.asarray(x, dtype=dtype))  # NumPy 2 raises on overflow
        except OverflowError as exc:
            raise TraceError(f"{where}: {exc}") from None
    array = np.asarray(x)
    if array.dtype.kind not in "biuf":
        raise TraceError(f"{where}: operand of dtype {array.dtype} is not supported")
    return trace.const(array.astype(dtype, copy=False))


def wrap(trace: Trace, value: Value) -> TracerArray:
    return TracerArray(trace, value)


def check_dtype(out: Value, expected: np.dtype, where: str) -> None:
    if out.type.dtype.np != expected:
        raise TraceError(f"{where}: NumPy computes {expected}, dnnc's op gives "
                         f"{out.type.dtype.name}; refusing a silently different result")


def lift(trace: Trace, x, where: str) -> TracerArray:
    """A closed-over array (or scalar) as a constant tracer, its dtype as NumPy's."""
    if isinstance(x, TracerArray):
        return x
    array = np.asarray(x)
    return wrap(trace, as_value(trace, array, array.dtype, where))


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
    t = Trace(getattr(fn, "__name__", "traced"))
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
            r = lift(t, r, f"output {k}")
        value = r._value
        # an output that is an input, a constant or another output gets a node of its own,
        # so every graph output is a distinct node's value (as ONNX requires)
        if value.producer is None or id(value) in seen:
            value = t.add(f"output {k}", "Identity", value)[0]
        seen.add(id(value))
        t.graph.outputs.append(value)
    t.graph.verify()
    return t.graph, isinstance(result, (tuple, list))


# The NumPy translations build on TracerArray, so they are imported after it; tracer methods
# reach them through the module at call time.
from . import trace_numpy as _numpy  # noqa: E402
