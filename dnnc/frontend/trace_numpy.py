"""How NumPy calls on traced arrays become registered ops: the dispatch tables of `dnnc.trace`.

`UFUNCS` maps a ufunc to its handler (one helper, `_elementwise`, for the ops that are one
registered op; `_composite` for small graphs), with operands cast to the loop NumPy resolves
(NEP 50), and `FUNCTIONS` maps a NumPy function (reductions, shape functions, einsum, ...) to
its handler; `getitem` translates indexing. A handler must never compute a value at trace time
nor accept what NumPy would refuse: a call it cannot translate exactly raises `TraceError`.
The tracer and the trace it records live in `trace.py`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..errors import TraceError
from ..ir.graph import Value
from .trace import Trace, TracerArray, as_value, check_dtype, find_trace, is_weak, lift, \
    np_type, wrap


# ---------------------------------------------------------------------------------------------
# Ufuncs: one helper for every elementwise op


def _resolve(ufunc, where: str, operands) -> tuple[np.dtype, ...]:
    """NumPy's loop for these operands: (input dtypes..., output dtype)."""
    try:
        return ufunc.resolve_dtypes(tuple(np_type(x) for x in operands) + (None,) * ufunc.nout)
    except Exception as exc:  # NumPy has no loop: the same error NumPy would raise
        raise TraceError(f"{where}: NumPy has no loop for these operands: {exc}") from None


def _elementwise(op: str, **attrs) -> Callable:
    """A ufunc handler: operands cast to NumPy's loop dtypes, then the registered op."""

    def handler(where, ufunc, *operands):
        trace = find_trace(operands)
        dtypes = _resolve(ufunc, where, operands)
        values = [as_value(trace, x, d, where) for x, d in zip(operands, dtypes)]
        out = trace.add(where, op, *values, **attrs)[0]
        check_dtype(out, dtypes[-1], where)
        return wrap(trace, out)

    return handler


def _composite(build: Callable) -> Callable:
    """A ufunc handler whose op is a small graph: `build(where, values, out_dtype) -> Value`
    on operands already cast to NumPy's loop dtypes."""

    def handler(where, ufunc, *operands):
        trace = find_trace(operands)
        dtypes = _resolve(ufunc, where, operands)
        values = [as_value(trace, x, d, where) for x, d in zip(operands, dtypes)]
        out = build(trace, where, values, dtypes)
        check_dtype(out, dtypes[-1], where)
        return wrap(trace, out)

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


def reduction(op: str, where: str, x, axis=None, dtype=None, keepdims=False,
            out_dtype: np.dtype | None = None, **unsupported) -> TracerArray:
    """Reduce<op> over `axis` (None: all) with NumPy's accumulator dtype `out_dtype`."""
    x = _tracer(x, where)
    unsupported = {k: v for k, v in unsupported.items() if v is not None}
    if unsupported:
        raise TraceError(f"{where}: arguments {sorted(unsupported)} are not supported")
    trace = x._trace
    target = np.dtype(dtype) if dtype is not None else (out_dtype or x.dtype)
    value = as_value(trace, x, target, where)
    axes = _axes(x, axis, where)
    if axes == []:  # no axes: NumPy returns the (cast) array
        return wrap(trace, value)
    axes_value = None if axes is None else trace.const(np.array(axes, np.int64))
    out = trace.add(where, op, value, axes_value, keepdims=int(bool(keepdims)))[0]
    return wrap(trace, out)


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
    return reduction("ReduceSum", "numpy.sum", x, axis, dtype, keepdims,
                   _sum_dtype(x.dtype), out=out, **kw)


def _prod(x, axis=None, dtype=None, out=None, keepdims=False, **kw):
    x = _tracer(x, "numpy.prod")
    return reduction("ReduceProd", "numpy.prod", x, axis, dtype, keepdims,
                   _sum_dtype(x.dtype), out=out, **kw)


def _mean(x, axis=None, dtype=None, out=None, keepdims=False, **kw):
    x = _tracer(x, "numpy.mean")
    return reduction("ReduceMean", "numpy.mean", x, axis, dtype, keepdims,
                   _mean_dtype(x.dtype), out=out, **kw)


def _max(x, axis=None, out=None, keepdims=False, **kw):
    return reduction("ReduceMax", "numpy.max", x, axis, None, keepdims, out=out, **kw)


def _min(x, axis=None, out=None, keepdims=False, **kw):
    return reduction("ReduceMin", "numpy.min", x, axis, None, keepdims, out=out, **kw)


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
    return wrap(x._trace, out_value)


def _truth_reduction(op: str, where: str):
    """any / all: the truth values as int32 (Reduce* take no bool), Reduce{Max,Min}, bool."""

    def handler(x, axis=None, out=None, keepdims=False, **kw):
        x = _tracer(x, where)
        truth = astype(astype(x, bool), np.int32)
        return astype(reduction(op, where, truth, axis, None, keepdims, out=out, **kw), bool)

    return handler


_any = _truth_reduction("ReduceMax", "numpy.any")
_all = _truth_reduction("ReduceMin", "numpy.all")


UFUNC_REDUCTIONS = {np.add: "ReduceSum", np.multiply: "ReduceProd", np.maximum: "ReduceMax",
                     np.minimum: "ReduceMin"}
"""`ufunc.reduce` as a Reduce* op (axis=0 by default, as NumPy)."""


# ---------------------------------------------------------------------------------------------
# Shape ops


def _shape_of(x) -> tuple[int, ...]:
    return x.shape if isinstance(x, TracerArray) else np.shape(x)


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
    return wrap(x._trace, out)


def _transpose(x, axes=None):
    x = _tracer(x, "numpy.transpose")
    perm = list(range(x.ndim))[::-1] if axes is None else _axes(x, axes, "numpy.transpose")
    if sorted(perm) != list(range(x.ndim)):
        raise TraceError(f"numpy.transpose: axes {axes} are not a permutation")
    if perm == list(range(x.ndim)):
        return x
    return wrap(x._trace, x._trace.add("numpy.transpose", "Transpose", x._value, perm=perm)[0])


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


def astype(x, dtype):
    x = _tracer(x, "astype")
    dtype = np.dtype(dtype)
    where = f"astype({dtype})"
    if dtype == x.dtype:
        return x
    return wrap(x._trace, as_value(x._trace, x, dtype, where))


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
    return wrap(x._trace, out)


def _expand_dims(x, axis):
    x = _tracer(x, "numpy.expand_dims")
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    rank = x.ndim + len(axes)
    axes = sorted(int(a) % rank for a in axes)
    out = x._trace.add("numpy.expand_dims", "Unsqueeze", x._value,
                       x._trace.const(np.array(axes, np.int64)))[0]
    return wrap(x._trace, out)


def _broadcast_to(x, shape):
    x = _tracer(x, "numpy.broadcast_to")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if np.broadcast_shapes(x.shape, shape) != shape:
        raise TraceError(f"numpy.broadcast_to: cannot broadcast {x.shape} to {shape}")
    out = x._trace.add("numpy.broadcast_to", "Expand", x._value,
                       x._trace.const(np.array(shape, np.int64)))[0]
    return wrap(x._trace, out)


def _common(where: str, arrays, trace: Trace | None = None
            ) -> tuple[Trace, list[Value], np.dtype]:
    """A sequence of operands as Values of NumPy's common dtype (np.result_type)."""
    arrays = list(arrays)
    trace = trace or find_trace(arrays)
    dtype = np.result_type(*(np_type(a) if not is_weak(a) else a for a in arrays))
    return trace, [as_value(trace, a, dtype, where) for a in arrays], dtype


def _concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    if axis is None or out is not None or dtype is not None:
        raise TraceError("numpy.concatenate: axis=None, out= and dtype= are not supported")
    trace, values, _ = _common("numpy.concatenate", arrays)
    rank = len(_shape_of(arrays[0]))
    out_value = trace.add("numpy.concatenate", "Concat", *values, axis=int(axis) % rank)[0]
    return wrap(trace, out_value)


def _stack(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    arrays = list(arrays)
    trace = find_trace(arrays)
    rank = len(_shape_of(arrays[0])) + 1
    axis = int(axis) % rank
    lifted = [_expand_dims(lift(trace, a, "numpy.stack"), axis) for a in arrays]
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
    return [wrap(x._trace, v) for v in outs]


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
    return wrap(trace, trace.add("numpy.pad", "Pad", *inputs, mode=modes[mode])[0])


def _where(condition, x=None, y=None):
    if x is None or y is None:
        raise TraceError("numpy.where with one argument (the indices of true elements) has a "
                         "data-dependent shape and cannot be traced")
    trace = find_trace([condition, x, y])
    cond = as_value(trace, condition, np.dtype(bool), "numpy.where")
    _, (xv, yv), _ = _common("numpy.where", [x, y], trace)
    return wrap(trace, trace.add("numpy.where", "Where", cond, xv, yv)[0])


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
    return wrap(trace, out_value)


def _dot(a, b, out=None):
    if out is not None or len(_shape_of(a)) > 2 or len(_shape_of(b)) > 2:
        raise TraceError("numpy.dot: only arrays of rank <= 2 (and no out=) are supported; "
                         "use @ / numpy.matmul")
    if len(_shape_of(a)) == 0 or len(_shape_of(b)) == 0:
        return np.multiply(a, b)
    return np.matmul(a, b)


def _like(fill):
    def handler(a, dtype=None, order="K", subok=True, shape=None, **kwargs):
        dtype = np.dtype(dtype) if dtype is not None else np_type(a)
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


def _index_value(trace: Trace, i, n: int, where: str) -> TracerArray:
    """An integer or integer-array index as an int64 tracer, constants checked and made
    non-negative at trace time."""
    if isinstance(i, TracerArray):
        if i.dtype.kind not in "iu":
            raise TraceError(f"arrays used as indices must be of integer type, given {i.dtype}")
        return astype(i, np.int64)
    idx = np.asarray(i)
    if idx.dtype.kind not in "iu":
        raise TraceError(f"arrays used as indices must be of integer type, given {idx.dtype}")
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise TraceError(f"an index is out of bounds for an axis with size {n}")
    return lift(trace, np.where(idx < 0, idx + n, idx).astype(np.int64), where)


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
    sliced = getitem(x, tuple(basic)) if any(b != slice(None) for b in basic) else x
    adv = [k for k, i in enumerate(items) if not isinstance(i, slice)]
    rest = [k for k in range(x.ndim) if k not in adv]
    indices = [_index_value(trace, items[k], sliced.shape[k], where) for k in adv]
    batch = np.broadcast_shapes(*(t.shape for t in indices))
    stacked = _stack([_broadcast_to(t, batch) if t.shape != batch else t for t in indices],
                     axis=-1)
    data = _transpose(sliced, adv + rest)
    out = wrap(trace, trace.add(where, "GatherND", data._value, stacked._value)[0])
    if adv == list(range(adv[0], adv[-1] + 1)) and adv[0] > 0:  # adjacent: dims stay there
        b, first = len(batch), adv[0]
        out = _transpose(out, [b + j for j in range(first)] + list(range(b))
                         + [b + j for j in range(first, len(rest))])
    return out


def getitem(x: TracerArray, index) -> TracerArray:
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
        index_value = as_value(trace, idx, np.dtype(np.int64), where)
        value = trace.add(where, "Gather", value, index_value, axis=at)[0]
        # the index's dims replaced one axis: the later squeezes move by its rank - 1
        shift = len(_shape_of(idx)) - 1
        squeeze = [s + shift if s > at else s for s in squeeze]
    if squeeze:
        value = trace.add(where, "Squeeze", value, trace.const(np.array(squeeze, np.int64)))[0]
    if unsqueeze:
        value = trace.add(where, "Unsqueeze", value,
                          trace.const(np.array(unsqueeze, np.int64)))[0]
    return wrap(trace, value)
