"""Creation ops: tensors built from shapes and scalars, as NumPy's array-creation routines:
ConstantOfShape, Range, EyeLike, Trilu (tril/triu, a masked copy).

An output's size comes from an input's value (ConstantOfShape's shape, Range's bounds) when it
is known, else from `ctx.fresh_dim()`; a compute rule then refuses (`NoCompute`) where the size
is known only at run time. Nothing here reads ONNX.
"""

from __future__ import annotations

import math

import numpy as np

from .. import types as T
from ..compute import NoCompute, compute
from ..loop import Cast, Const, Select, const, eq
from ..types import TensorType, dim_sub
from .index_exprs import as_index, check_sizes_bound, mul, scalar_load
from .infer import check_dtype, check_same_dtype, int_list, shape_length
from .registry import Pattern, SymDim, register_op

INDEX = (T.int32, T.int64)


# -- ConstantOfShape, Range, EyeLike, Trilu ------------------------------------------------------


def _fill_value(value) -> np.ndarray:
    return np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)


def _constant_of_shape_infer(ctx):
    check_dtype(ctx, 0, (T.int64,), "shape")
    n = shape_length(ctx, 0, "shape")
    value = _fill_value(ctx.attrs["value"])
    if value.size != 1:
        raise ctx.fail(f"value must hold one element, given {value.size}")
    dtype = T.DType.from_numpy(value.dtype)
    dims = ctx.dims(0)
    if dims is None:
        dims = [ctx.fresh_dim() for _ in range(n)]
    elif any(isinstance(d, int) and d < 0 for d in dims):
        raise ctx.fail(f"shape {dims} holds a negative size")
    return [TensorType(dtype, tuple(dims))]


def constant_of_shape(shape, value=None):
    value = _fill_value(value)
    return np.full(int_list(shape), value[0], dtype=value.dtype)


def _constant_of_shape_rule(inputs, outputs, value):
    if inputs[0].value is None:
        check_sizes_bound(inputs, outputs, "ConstantOfShape")
    out = outputs[0]
    fill = const(_fill_value(value)[0].item(), out.dtype)
    return [compute(out.shape, lambda *i: fill, dtype=out.dtype)]


register_op("ConstantOfShape", pattern=Pattern.OPAQUE, infer=_constant_of_shape_infer,
            evaluate=constant_of_shape, attrs={"value": None}, shape_arith=True,
            compute=_constant_of_shape_rule, params=(0,))


def range_length(start, limit, delta) -> int:
    """ONNX Range's element count: max(ceil((limit - start) / delta), 0)."""
    if all(isinstance(v, (int, np.integer)) for v in (start, limit, delta)):
        return max(-((int(start) - int(limit)) // int(delta)), 0)
    return max(math.ceil((float(limit) - float(start)) / float(delta)), 0)


def _range_infer(ctx):
    check_same_dtype(ctx)
    check_dtype(ctx, 0, (T.int16, T.int32, T.int64) + T.FLOAT_DTYPES)
    if ctx.attrs["stash_type"] not in (T.float32, T.float64):
        raise ctx.fail(f"stash_type must be float32 or float64, given {ctx.attrs['stash_type']}")
    for i in range(3):
        if ctx.type(i).numel != 1:  # exporters also pass 1-element vectors
            raise ctx.fail(f"input {i} must be a scalar, given {ctx.type(i)}")
    values = [ctx.value(i) for i in range(3)]
    if all(v is not None for v in values):
        start, limit, delta = (v.item() for v in values)
        if delta == 0:
            raise ctx.fail("delta must not be 0")
        return [TensorType(ctx.dtype(0), (range_length(start, limit, delta),))]
    parts = [ctx.partial(i) for i in range(3)]
    if all(p is not None for p in parts):
        start, limit, delta = (p.reshape(()).item() for p in parts)
        if isinstance(limit, SymDim) and isinstance(start, int) and delta == 1:
            return [TensorType(ctx.dtype(0), (dim_sub(limit.dim, start),))]
    return [TensorType(ctx.dtype(0), (ctx.fresh_dim(),))]


def range_(start, limit, delta, stash_type=T.float32):
    n = range_length(start.item(), limit.item(), delta.item())
    if start.dtype == object:
        return np.array([start.item() + i * delta.item() for i in range(n)], dtype=object)
    if start.dtype.kind in "iu":
        return (start + np.arange(n, dtype=np.int64) * delta).astype(start.dtype)
    # float16 and bfloat16 accumulate in stash_type (ONNX 27); float32 as float64, as NumPy
    work = stash_type.np if start.dtype.itemsize < 4 else np.float64
    return (start.astype(work) + np.arange(n, dtype=work) * delta.astype(work)).astype(start.dtype)


def _range_rule(inputs, outputs, stash_type):
    start, limit, delta = inputs
    if start.value is None or delta.value is None:
        raise NoCompute("Range: start and delta must be known at compile time")
    if limit.value is None:
        check_sizes_bound(inputs, outputs, "Range")
    out = outputs[0]
    first, step = start.value.reshape(-1)[0].item(), delta.value.reshape(-1)[0].item()
    if out.dtype.is_int:
        return [compute(out.shape, lambda i: mul(i, step) + first, dtype=out.dtype)]
    # as the reference: float16/bfloat16 in stash_type, float32 and float64 in float64
    work = stash_type if out.dtype.itemsize < 4 else T.float64
    return [compute(out.shape, lambda i: Const(first, work) + Cast(work, i) * Const(step, work),
                    dtype=out.dtype)]


register_op("Range", pattern=Pattern.OPAQUE, infer=_range_infer, evaluate=range_, inputs=3,
            attrs={"stash_type": T.float32}, shape_arith=True, compute=_range_rule,
            params=(0, 1, 2))


def _eye_like_infer(ctx):
    if ctx.type(0).rank != 2:
        raise ctx.fail(f"input must be 2-D, given {ctx.type(0)}")
    return [TensorType(ctx.attrs["dtype"] or ctx.dtype(0), ctx.shape(0))]


def eye_like(x, dtype=None, k=0):
    return np.eye(x.shape[0], x.shape[1], k, dtype=(dtype.np if dtype else x.dtype))


def _eye_like_rule(inputs, outputs, dtype, k):
    out = outputs[0]
    one, zero = const(1, out.dtype), const(0, out.dtype)
    return [compute(out.shape, lambda i, j: Select(eq(j - i, k), one, zero), dtype=out.dtype)]


register_op("EyeLike", pattern=Pattern.OPAQUE, infer=_eye_like_infer, evaluate=eye_like,
            attrs={"dtype": None, "k": 0}, compute=_eye_like_rule)


def _trilu_infer(ctx):
    if ctx.type(0).rank < 2:
        raise ctx.fail(f"input must have rank 2 or more, given {ctx.type(0)}")
    check_dtype(ctx, 1, (T.int64,), "k")
    return [ctx.type(0)]


def trilu(x, k=None, upper=1):
    k = 0 if k is None else int(k)
    return np.triu(x, k) if upper else np.tril(x, k)


def _trilu_rule(inputs, outputs, upper):
    x, k = (list(inputs) + [None])[:2]
    if k is None:
        k = const(0)
    elif k.value is not None:
        k = const(int(k.value.reshape(-1)[0]))
    else:  # a run-time diagonal is just another operand
        k = as_index(scalar_load(k))
    zero = const(0, x.dtype)

    def element(*i):
        diagonal = i[-1] - i[-2]
        keep = diagonal >= k if upper else diagonal <= k
        return Select(keep, x[i], zero)

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Trilu", pattern=Pattern.INJECTIVE, infer=_trilu_infer, evaluate=trilu,
            attrs={"upper": 1}, inputs=(1, 2), compute=_trilu_rule, params=(1,))
