"""Reductions and scans: Reduce*, ArgMax/ArgMin, CumSum/CumProd, Softmax/LogSoftmax/Hardmax.

References follow the newest ONNX semantics (axes as an input, `noop_with_empty_axes`, reduction
over an empty set giving the op's identity). float16 and bfloat16 are computed in float32 and
cast back; integer reductions stay in the input's integer type (NumPy would widen to int64).
This module never reads ONNX: older opsets are translated by `frontend/onnx_ops/reduce.py`.

Compute rules mirror the references stage by stage: a statistic that several output elements
read (softmax's row max and row sum, an arg-extreme's value) is its own stage, so lowering
materialises it once instead of recomputing it per element.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import batching
from .. import types as T
from ..compute import (NoCompute, compute, reduce_axis, reduce_all, reduce_any, reduce_max,
                       reduce_min, reduce_prod, reduce_sum)
from ..loop import Cast, Select, call, const, eq, logical_or
from .infer import check_dtype, normalize_axis, reduced_shape
from ..flops import per_output
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


# -- helpers of compute rules (norm.py and loss.py use them too) -------------------------------

_stage_ids = itertools.count()


def stage_name(hint: str) -> str:
    """A unique name for a rule's stage: stages of one fused group must not share a name."""
    return f"{hint}{next(_stage_ids)}"


def wide_dtype(dtype: T.DType) -> T.DType:
    """The type the references accumulate in: float32 for 16-bit floats, else `dtype`."""
    return T.float32 if dtype.name in _HALF else dtype


def widen(e):
    """`e` cast to its accumulation type (a no-op for 32- and 64-bit types)."""
    return e if wide_dtype(e.dtype) is e.dtype else Cast(wide_dtype(e.dtype), e)


def input_at(inputs, k: int):
    """Input k's Tensor, or None when absent (trailing optional inputs may be left off)."""
    return inputs[k] if k < len(inputs) else None


def count_of(axes, dtype: T.DType):
    """How many elements reduce axes span, as a `dtype` expression (the divisor of a mean)."""
    n = const(1)
    for a in axes:
        n = n * a.extent
    return Cast(dtype, n)


def spread(ndim: int, given: dict, rest) -> tuple:
    """A rank-`ndim` index: axis d is `given[d]` where given, else the next of `rest`."""
    rest = iter(rest)
    return tuple(given[d] if d in given else next(rest) for d in range(ndim))


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


def _rule_axes(axes) -> list[int]:
    """The `axes` input of a rule: absent or a known empty list give []; a run-time list
    (its values unknown when compiling) cannot be lowered."""
    if axes is None:
        return []
    if axes.value is None:
        if axes.shape[0] == const(0):
            return []
        raise NoCompute("the reduced axes are computed at run time")
    return _axes_list(axes.value)


def _reduction_rule(body):
    """The compute rule of a Reduce* op. `body(reduction, out)` builds the output Tensor, where
    `reduction(*i)` gives (the input element read at output index i and fresh reduce axes,
    those axes) for one Reduce over the reduced axes."""

    def rule(inputs, outputs, keepdims, noop_with_empty_axes):
        x, out = inputs[0], outputs[0]
        axes = _rule_axes(input_at(inputs, 1))
        if not axes and noop_with_empty_axes:
            return [compute(out.shape, lambda *i: x[i], name=stage_name("copy"),
                            dtype=out.dtype)]
        axes = sorted({a % x.ndim for a in axes}) if axes else list(range(x.ndim))

        def reduction(*i):
            r = [reduce_axis(x.shape[a]) for a in axes]
            kept = [v for d, v in enumerate(i) if d not in axes] if keepdims else i
            return x[spread(x.ndim, {a: v.var for a, v in zip(axes, r)}, kept)], r

        return [body(reduction, out)]

    return rule


def _elementwise_of(fn, hint: str):
    """A Reduce* body from `fn(x, axes)`: the output element from the read element and the
    reduce axes (a Reduce expression, perhaps finished: a mean divides, L2 takes a root)."""

    def body(reduction, out):
        return compute(out.shape, lambda *i: fn(*reduction(*i)), name=stage_name(hint),
                       dtype=out.dtype)

    return body


def reduction(name: str, fn, dtypes=NUMERIC, expr=None, **options):
    """Register Reduce<name>: `fn(x, axes tuple, keepdims)` computes on the widened input;
    `expr(x, axes)` is its loop-IR form (see `_elementwise_of`), or `body` in `options` a
    rule body of several stages (see `_reduction_rule`)."""
    body = options.pop("body", None) or _elementwise_of(expr, name[6:].lower())

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

    return register_op(name, pattern=Pattern.REDUCE, batched=batching.reducing,
                       infer=_reduce_infer(dtypes),
                       evaluate=evaluate, attrs={"keepdims": 1, "noop_with_empty_axes": 0},
                       inputs=(1, 2), compute=_reduction_rule(body), params=(1,), **options)


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


def _float_dtype(dtype: T.DType) -> T.DType:
    """The type of a reduction whose result is fractional: float64 for integers."""
    return wide_dtype(dtype) if dtype.is_float else T.float64


def _mean_expr(x, r):
    dtype = _float_dtype(x.dtype)  # integers: a float64 mean, truncated by the output cast
    return reduce_sum(Cast(dtype, x), r) / count_of(r, dtype)


def _l2_expr(x, r):
    x = Cast(_float_dtype(x.dtype), x)
    return call("sqrt", reduce_sum(x * x, r))


def _max_expr(x, r):
    return reduce_any(x, r) if x.dtype.kind == "b" else reduce_max(x, r)


def _min_expr(x, r):
    return reduce_all(x, r) if x.dtype.kind == "b" else reduce_min(x, r)


def _log_sum_exp_body(reduction, out):
    """Two stages, as the reference: the max, then log(sum(exp(x - max))) + max, where a max
    that is not finite (all -inf, an empty set, a NaN) shifts by 0."""

    def top_of(*i):
        x, r = reduction(*i)
        return reduce_max(Cast(_float_dtype(x.dtype), x), r)

    top = compute(out.shape, top_of, name=stage_name("logsumexp_max"))

    def element(*i):
        x, r = reduction(*i)
        t = top[i]
        shift = Select(logical_or(call("isnan", t), call("isinf", t)), const(0.0, t.dtype), t)
        return call("log", reduce_sum(call("exp", Cast(t.dtype, x) - shift), r)) + shift

    return compute(out.shape, element, name=stage_name("logsumexp"), dtype=out.dtype)


reduction("ReduceSum", _sum, shape_arith=True, expr=lambda x, r: reduce_sum(widen(x), r))
reduction("ReduceProd", _prod, shape_arith=True, expr=lambda x, r: reduce_prod(widen(x), r))
reduction("ReduceMean", _mean, expr=_mean_expr)
reduction("ReduceMax", _max, ORDERED, expr=_max_expr)
reduction("ReduceMin", _min, ORDERED, expr=_min_expr)
reduction("ReduceL1", lambda x, axes, keepdims: _sum(np.abs(x), axes, keepdims),
          expr=lambda x, r: reduce_sum(call("abs", widen(x)), r))
reduction("ReduceL2", _l2, expr=_l2_expr)
reduction("ReduceSumSquare", lambda x, axes, keepdims: _sum(x * x, axes, keepdims),
          expr=lambda x, r: reduce_sum(widen(x) * widen(x), r))
reduction("ReduceLogSum", _log_sum,
          expr=lambda x, r: call("log", reduce_sum(Cast(_float_dtype(x.dtype), x), r)))
reduction("ReduceLogSumExp", _log_sum_exp, body=_log_sum_exp_body)

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


def _arg_rule(largest: bool):
    """Two stages (a reduction over (value, index) pairs does not exist): the extreme value,
    then the least (or, for select_last_index, the greatest) index holding it. A NaN counts
    as the extreme, as np.argmax/argmin take the first NaN: the max/min stage propagates it
    and only NaNs then match."""

    def rule(inputs, outputs, axis, keepdims, select_last_index):
        x, out = inputs[0], outputs[0]
        axis = axis % x.ndim

        def at(i, k):  # x at an index i without the axis, with k on the axis
            return x[i[:axis] + (k,) + i[axis:]]

        def extreme_of(*i):
            k = reduce_axis(x.shape[axis])
            if x.dtype.kind == "b":
                return (reduce_any if largest else reduce_all)(at(i, k.var), k)
            return (reduce_max if largest else reduce_min)(at(i, k.var), k)

        extreme = compute(x.shape[:axis] + x.shape[axis + 1:], extreme_of,
                          name=stage_name("argmax_value" if largest else "argmin_value"))

        def index(*i):
            if keepdims:
                i = i[:axis] + i[axis + 1:]
            k = reduce_axis(x.shape[axis])
            v = at(i, k.var)
            hit = eq(v, extreme[i])
            if x.dtype.is_float:
                hit = logical_or(hit, call("isnan", v))
            return (reduce_max if select_last_index else reduce_min)(k.var, k, where=hit)

        return [compute(out.shape, index, name=stage_name("arg"), dtype=out.dtype)]

    return rule


for _name, _fn in (("ArgMax", np.argmax), ("ArgMin", np.argmin)):
    register_op(_name, pattern=Pattern.REDUCE, batched=batching.along_axis(),
                infer=_arg_infer, evaluate=_arg(_fn),
                attrs={"axis": 0, "keepdims": 1, "select_last_index": 0},
                compute=_arg_rule(_name == "ArgMax"))

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


def _scan_rule(reducer):
    """out[.., j, ..] reduces x[.., k, ..] over the k that come before j (k <= j; k < j when
    exclusive; mirrored when reverse): a `where=` filter over the whole axis. Quadratic in
    the axis length, as a scan written as a reduction is; a schedule may tile it."""

    def rule(inputs, outputs, exclusive, reverse):
        x, axis = inputs
        if axis.value is None:
            raise NoCompute("the scan axis is computed at run time")
        axis = int(np.asarray(axis.value).reshape(-1)[0]) % max(x.ndim, 1)

        def element(*i):
            k = reduce_axis(x.shape[axis])
            j = i[axis]
            before = (k.var > j if exclusive else k.var >= j) if reverse else \
                (k.var < j if exclusive else k.var <= j)
            return reducer(widen(x[i[:axis] + (k.var,) + i[axis + 1:]]), k, where=before)

        return [compute(outputs[0].shape, element, name=stage_name("scan"),
                        dtype=outputs[0].dtype)]

    return rule


register_op("CumSum", pattern=Pattern.OPAQUE, infer=_scan_infer, evaluate=_scan(np.cumsum, 0),
            attrs={"exclusive": 0, "reverse": 0}, inputs=2, compute=_scan_rule(reduce_sum), params=(1,))
register_op("CumProd", pattern=Pattern.OPAQUE, infer=_scan_infer,
            evaluate=_scan(np.cumprod, 1), attrs={"exclusive": 0, "reverse": 0}, inputs=2,
            compute=_scan_rule(reduce_prod), params=(1,))

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


class Rows:
    """The reduced axes of a softmax-like rule: `axes` of x (one, or with coerce_2d all from
    `axis` on), and the per-row statistics' shape (those axes of extent 1)."""

    def __init__(self, x, axes):
        self.x, self.axes = x, list(axes)
        self.shape = tuple(const(1) if d in self.axes else n for d, n in enumerate(x.shape))

    def reduce_axes(self):
        return [reduce_axis(self.x.shape[d]) for d in self.axes]

    def read(self, i, r):
        """x along a row: statistics index `i` with the row axes replaced by reduce axes r."""
        return self.x[spread(self.x.ndim, {d: a.var for d, a in zip(self.axes, r)},
                             [v for d, v in enumerate(i) if d not in self.axes])]

    def stat(self, i):
        """The statistics index of output index i."""
        return tuple(const(0) if d in self.axes else v for d, v in enumerate(i))

    def max(self, dtype, hint):
        """The row max stage, in `dtype`."""

        def top(*i):
            r = self.reduce_axes()
            return reduce_max(Cast(dtype, self.read(i, r)), r)

        return compute(self.shape, top, name=stage_name(hint))


def _rows(x, axis, coerce_2d) -> Rows:
    if x.ndim == 0:
        return Rows(x, [])  # one element: a row of one
    axis = axis % x.ndim
    return Rows(x, range(axis, x.ndim) if coerce_2d else [axis])


def _softmax_rule(log: bool):
    """Three stages, as the reference: the row max, the row sum of exp(x - max), then
    exp(x - max) / sum (or x - max - log(sum)); 16-bit floats in float32."""

    def rule(inputs, outputs, axis, coerce_2d):
        x, out = inputs[0], outputs[0]
        rows = _rows(x, axis, coerce_2d)
        dtype = wide_dtype(x.dtype)
        top = rows.max(dtype, "softmax_max")

        def total_of(*i):
            r = rows.reduce_axes()
            return reduce_sum(call("exp", Cast(dtype, rows.read(i, r)) - top[i]), r)

        total = compute(rows.shape, total_of, name=stage_name("softmax_sum"))

        def element(*i):
            shifted = Cast(dtype, x[i]) - top[rows.stat(i)]
            if log:
                return shifted - call("log", total[rows.stat(i)])
            return call("exp", shifted) / total[rows.stat(i)]

        return [compute(out.shape, element, name=stage_name("softmax"), dtype=out.dtype)]

    return rule


def _hardmax_rule(inputs, outputs, axis, coerce_2d):
    """1 at the first maximum of each row (first in row-major order over the row's axes; a
    NaN counts as the maximum, as np.argmax), else 0: the row max, the least linear index
    holding it, then a comparison."""
    x, out = inputs[0], outputs[0]
    rows = _rows(x, axis, coerce_2d)
    top = rows.max(x.dtype, "hardmax_max")

    def linear(index):  # the position within a row, row-major over the row's axes
        pos = const(0)
        for d, v in zip(rows.axes, index):
            pos = pos * x.shape[d] + v
        return pos

    def first_of(*i):
        r = rows.reduce_axes()
        v = rows.read(i, r)
        hit = logical_or(eq(v, top[i]), call("isnan", v))
        return reduce_min(linear([a.var for a in r]), r, where=hit)

    first = compute(rows.shape, first_of, name=stage_name("hardmax_first"))

    def element(*i):
        at_first = eq(linear([i[d] for d in rows.axes]), first[rows.stat(i)])
        return Select(at_first, const(1.0, out.dtype), const(0.0, out.dtype))

    return [compute(out.shape, element, name=stage_name("hardmax"), dtype=out.dtype)]


# FLOPs: max, subtract, exp, sum, divide per element; Hardmax only compares
for _name, _fn, _rule, _flops in (("Softmax", _softmax, _softmax_rule(False), 5),
                                  ("LogSoftmax", _log_softmax, _softmax_rule(True), 5),
                                  ("Hardmax", _hardmax, _hardmax_rule, 1)):
    register_op(_name, pattern=Pattern.REDUCE, batched=batching.along_axis(),
                infer=_softmax_infer, evaluate=_over_axis(_fn),
                attrs={"axis": -1, "coerce_2d": 0}, compute=_rule, flops=per_output(_flops))
