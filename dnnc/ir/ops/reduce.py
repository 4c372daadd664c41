"""Reductions and scans: Reduce*, ArgMax/ArgMin, CumSum/CumProd, Softmax/LogSoftmax/Hardmax.

References follow the newest ONNX semantics (axes as an input, `noop_with_empty_axes`, reduction
over an empty set giving the op's identity). float16 and bfloat16 are computed in float32 and
cast back; integer reductions stay in the input's integer type (NumPy would widen to int64).
This module never reads ONNX: older opsets are translated by `frontend/onnx_ops/reduce.py`.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .infer import check_dtype, normalize_axis, reduced_shape
from .registry import Pattern, register_op

FLOATS = T.FLOAT_DTYPES
NUMERIC = T.FLOAT_DTYPES + T.INT_DTYPES
ORDERED = NUMERIC + (T.bool_,)
_HALF = ("float16", "bfloat16")


def _wide(x: np.ndarray) -> np.ndarray:
    """x in a type fit for accumulation: float32 for 16-bit floats, else unchanged."""
    return x.astype(np.float32) if x.dtype.name in _HALF else x


def _axes_list(axes) -> list[int]:
    return [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


# -- Reduce* -----------------------------------------------------------------------------------


def _reduce_infer(dtypes):
    def infer(ctx):
        check_dtype(ctx, 0, dtypes)
        check_dtype(ctx, 1, (T.int64,), "axes")
        x = ctx.type(0)
        keepdims = bool(ctx.attrs["keepdims"])
        if ctx.has(1) and ctx.type(1).rank != 1:
            raise ctx.fail(f"axes must be a 1-D tensor, given {ctx.type(1)}")
        axes = ctx.value(1)
        if ctx.has(1) and axes is None:
            count = ctx.shape(1)[0]
            if count == 0:
                axes = np.zeros(0, np.int64)
            elif keepdims:  # which dims collapse to 1 is known only at run time
                return [x.with_shape(d if d == 1 else ctx.fresh_dim() for d in x.shape)]
            elif isinstance(count, int):
                return [x.with_shape(ctx.fresh_dim() for _ in range(x.rank - count))]
            else:
                raise ctx.fail("axes is computed at run time and its length is unknown, so "
                               "the output rank (keepdims=0) cannot be inferred")
        axes = _axes_list(axes)
        if not axes:
            if ctx.attrs["noop_with_empty_axes"]:
                return [x]
            axes = list(range(x.rank))
        norm = [normalize_axis(ctx, a, x.rank) for a in axes]
        if len(set(norm)) != len(norm):
            raise ctx.fail(f"axes {axes} name an axis twice")
        return [x.with_shape(reduced_shape(x.shape, norm, keepdims))]

    return infer


def reduction(name: str, fn, dtypes=NUMERIC, **options):
    """Register Reduce<name>: `fn(x, axes tuple, keepdims)` computes on the widened input."""

    def evaluate(x, axes=None, keepdims=1, noop_with_empty_axes=0):
        axes = _axes_list(axes)
        if not axes:
            if noop_with_empty_axes:
                return x.copy()
            axes = list(range(x.ndim))
        axes = tuple(sorted(a % x.ndim for a in axes)) if x.ndim else ()
        if x.dtype == object:  # known shape values holding SymDims (shape arithmetic)
            return fn(x, axes, bool(keepdims))
        return np.asarray(fn(_wide(x), axes, bool(keepdims))).astype(x.dtype)

    return register_op(name, pattern=Pattern.REDUCE, infer=_reduce_infer(dtypes),
                       evaluate=evaluate, attrs={"keepdims": 1, "noop_with_empty_axes": 0},
                       inputs=(1, 2), **options)


def _sum(x, axes, keepdims):
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=None if x.dtype == object else x.dtype)


def _prod(x, axes, keepdims):
    return np.prod(x, axis=axes, keepdims=keepdims,
                   dtype=None if x.dtype == object else x.dtype)


def _max(x, axes, keepdims):
    # the empty-set identity: -inf for floats, False, or the type's least value
    lowest = -np.inf if x.dtype.kind == "f" else False if x.dtype.kind == "b" \
        else np.iinfo(x.dtype).min
    return np.max(x, axis=axes, keepdims=keepdims, initial=lowest)


def _min(x, axes, keepdims):
    highest = np.inf if x.dtype.kind == "f" else True if x.dtype.kind == "b" \
        else np.iinfo(x.dtype).max
    return np.min(x, axis=axes, keepdims=keepdims, initial=highest)


def _mean(x, axes, keepdims):
    count = int(np.prod([x.shape[a] for a in axes]))
    total = np.sum(x, axis=axes, keepdims=keepdims, dtype=np.float64 if x.dtype.kind in "iu"
                   else x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count if count else np.full_like(total, np.nan)
    return np.trunc(mean) if x.dtype.kind in "iu" else mean  # ints truncate, as C


def _l2(x, axes, keepdims):
    s = np.sum(np.square(x.astype(np.float64) if x.dtype.kind in "iu" else x), axis=axes,
               keepdims=keepdims)
    return np.sqrt(s)


def _log_sum(x, axes, keepdims):
    with np.errstate(divide="ignore"):
        return np.log(np.sum(x, axis=axes, keepdims=keepdims, dtype=_float_of(x)))


def _log_sum_exp(x, axes, keepdims):
    x = x.astype(_float_of(x))
    top = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0)  # all -inf (or empty): no shift needed
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - top), axis=axes, keepdims=True)) + top
    return out if keepdims else np.squeeze(out, axis=axes)


def _float_of(x):
    return x.dtype if x.dtype.kind == "f" else np.float64


reduction("ReduceSum", _sum, shape_arith=True)
reduction("ReduceProd", _prod, shape_arith=True)
reduction("ReduceMean", _mean)
reduction("ReduceMax", _max, ORDERED)
reduction("ReduceMin", _min, ORDERED)
reduction("ReduceL1", lambda x, axes, keepdims: _sum(np.abs(x), axes, keepdims))
reduction("ReduceL2", _l2)
reduction("ReduceSumSquare", lambda x, axes, keepdims: _sum(x * x, axes, keepdims))
reduction("ReduceLogSum", _log_sum)
reduction("ReduceLogSumExp", _log_sum_exp)

# -- ArgMax / ArgMin ---------------------------------------------------------------------------


def _arg_infer(ctx):
    check_dtype(ctx, 0, ORDERED)
    x = ctx.type(0)
    axis = normalize_axis(ctx, ctx.attrs["axis"], x.rank)
    if x.shape[axis] == 0:
        raise ctx.fail(f"cannot take the arg-extreme over axis {axis} of size 0")
    return [T.TensorType(T.int64, reduced_shape(x.shape, [axis], bool(ctx.attrs["keepdims"])))]


def _arg(fn):
    def evaluate(x, axis=0, keepdims=1, select_last_index=0):
        x = _wide(x)
        if select_last_index:  # search the reversed axis; the first hit there is the last
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=bool(keepdims))
        else:
            idx = fn(x, axis=axis, keepdims=bool(keepdims))
        return np.asarray(idx, dtype=np.int64)

    return evaluate


for _name, _fn in (("ArgMax", np.argmax), ("ArgMin", np.argmin)):
    register_op(_name, pattern=Pattern.REDUCE, infer=_arg_infer, evaluate=_arg(_fn),
                attrs={"axis": 0, "keepdims": 1, "select_last_index": 0})

# -- CumSum / CumProd --------------------------------------------------------------------------


def _scan_infer(ctx):
    check_dtype(ctx, 0, NUMERIC)
    check_dtype(ctx, 1, (T.int32, T.int64), "axis")
    if ctx.type(1).numel != 1 or ctx.type(1).rank > 1:
        raise ctx.fail(f"axis must be a scalar, given {ctx.type(1)}")
    axis = ctx.value(1)
    if axis is not None:
        normalize_axis(ctx, int(axis.reshape(-1)[0]), ctx.type(0).rank)
    return [ctx.type(0)]


def _scan(fn, identity):
    def evaluate(x, axis, exclusive=0, reverse=0):
        axis = int(np.asarray(axis).reshape(-1)[0]) % max(x.ndim, 1)
        y = _wide(x)
        if reverse:
            y = np.flip(y, axis)
        out = fn(y, axis=axis, dtype=y.dtype)
        if exclusive:  # shift by one along axis, the identity first
            head = np.full_like(np.take(out, [0], axis=axis), identity)
            out = np.concatenate([head, np.take(out, range(out.shape[axis] - 1), axis=axis)],
                                 axis=axis)
        if reverse:
            out = np.flip(out, axis)
        return np.ascontiguousarray(out).astype(x.dtype)

    return evaluate


register_op("CumSum", pattern=Pattern.OPAQUE, infer=_scan_infer, evaluate=_scan(np.cumsum, 0),
            attrs={"exclusive": 0, "reverse": 0}, inputs=2)
register_op("CumProd", pattern=Pattern.OPAQUE, infer=_scan_infer,
            evaluate=_scan(np.cumprod, 1), attrs={"exclusive": 0, "reverse": 0}, inputs=2)

# -- Softmax, LogSoftmax, Hardmax --------------------------------------------------------------
# `coerce_2d=1` is the meaning before ONNX opset 13: the input is viewed as a matrix
# [prod(shape[:axis]), prod(shape[axis:])] and the op runs over its rows (all axes >= axis).


def _softmax_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    normalize_axis(ctx, ctx.attrs["axis"], max(ctx.type(0).rank, 1))
    return [ctx.type(0)]


def _over_axis(fn):
    """The reference for one axis, with the old 2-D coercion handled by a reshape."""

    def evaluate(x, axis=-1, coerce_2d=0):
        y = _wide(x)
        if x.ndim == 0:
            out = fn(y.reshape(1), 0).reshape(())
        elif coerce_2d:
            axis = axis % x.ndim
            matrix = (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))
            out = fn(y.reshape(matrix), 1).reshape(x.shape)
        else:
            out = fn(y, axis % x.ndim)
        return out.astype(x.dtype)

    return evaluate


def _softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _hardmax(x, axis):
    if x.shape[axis] == 0:
        return np.zeros_like(x)
    first = np.expand_dims(np.argmax(x, axis=axis), axis)  # the first maximum wins
    out = np.zeros_like(x)
    np.put_along_axis(out, first, 1, axis=axis)
    return out


for _name, _fn in (("Softmax", _softmax), ("LogSoftmax", _log_softmax),
                   ("Hardmax", _hardmax)):
    register_op(_name, pattern=Pattern.OPAQUE, infer=_softmax_infer, evaluate=_over_axis(_fn),
                attrs={"axis": -1, "coerce_2d": 0})
