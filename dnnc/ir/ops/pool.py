"""Pooling ops: the windowed pools (MaxPool, AveragePool, LpPool), their global forms and
MaxUnpool.

Layout is ONNX's channels-first (N, C, D1, ..., Dn). A reference pool reduces one strided view
of the padded input per kernel offset; nothing loops over output pixels in Python. A compute
rule is one reduction over its window, padding and ceil_mode overhang excluded by a `where`
condition so that no load outside the input is ever taken; the geometry is `window.py`'s, as
for the references.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from .. import batching
from .. import types as T
from ..compute import NoCompute, compute, reduce_axis, reduce_max, reduce_min, reduce_sum
from ..loop import Expr, call, const, eq, logical_and, maximum, minimum
from .infer import check_dtype
from .linalg import acc_dtype, widen
from ..flops import Count, numel, per_input
from .registry import REQUIRED, Pattern, register_op
from .window import Windows, check_image, compute_dtype, kernel_axes, kernel_offsets, \
    pad_for_windows, reduced_axes, spatial_attrs, window_attrs, window_dims, window_geometry, \
    window_slices

FLOATS = T.FLOAT_DTYPES


# -- windowed pools ----------------------------------------------------------------------------


def _pool_windows(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, fill):
    """(views, outs, begins, ends, strides, dilations) of the pooling windows over x."""
    nd = x.ndim - 2
    strides, dilations, pads = window_attrs(nd, strides, dilations, pads)
    outs, begins, ends = window_geometry(x.shape[2:], kernel_shape, strides, dilations, pads,
                                         auto_pad, ceil_mode)
    xp = pad_for_windows(x, outs, kernel_shape, strides, dilations, begins, fill)
    views = list(window_slices(xp, outs, kernel_shape, strides, dilations))
    return views, outs, begins, ends, strides, dilations


def _window_coords(outs, kernel, strides, dilations, begins, axis):
    """Input positions (out, k) that the windows of one axis read."""
    return (np.arange(outs[axis])[:, None] * strides[axis] - begins[axis]
            + np.arange(kernel[axis])[None, :] * dilations[axis])


def _window_counts(outs, kernel, strides, dilations, begins, lo, hi):
    """How many window positions fall in [lo_i, hi_i) on every axis, shaped like the output."""
    count = np.ones((), np.int64)
    for i in range(len(outs)):
        pos = _window_coords(outs, kernel, strides, dilations, begins, i)
        per_axis = ((pos >= lo[i]) & (pos < hi[i])).sum(axis=1)
        count = np.multiply.outer(count, per_axis)
    return count


def max_pool(x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None):
    """Max over each window, and the flat index of its (first) maximum, as ONNX's Indices:
    row-major over (N, C, *spatial), or column-major over the spatial axes (storage_order 1)."""
    # (float16 and bfloat16, whose NumPy kind is "V", compared as float32: exact)
    work = x.astype(np.float32) if x.dtype in (np.float16, T.bfloat16.np) else x
    fill = -np.inf if work.dtype.kind == "f" else np.iinfo(work.dtype).min
    views, outs, begins, _, strides, dilations = _pool_windows(
        work, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, fill)
    # running maximum; a later equal value never replaces an earlier one, and a NaN wins (it
    # propagates, as in np.max, Max, ReduceMax and the compute rule)
    y, best = views[0].copy(), np.zeros(views[0].shape, np.intp)
    for j, view in enumerate(views[1:], 1):
        better = view > y
        if work.dtype.kind == "f":
            better |= np.isnan(view) & ~np.isnan(y)
        np.copyto(y, view, where=better)
        np.copyto(best, j, where=better)
    y = y.astype(x.dtype, copy=False)
    # flat input index of each maximum
    sizes = x.shape[2:]
    nd = len(sizes)
    offsets = np.array(list(itertools.product(*(range(k) for k in kernel_shape))))
    spatial = np.zeros(best.shape, np.int64)
    order = range(nd) if storage_order == 0 else reversed(range(nd))
    for i in order:
        o = np.arange(outs[i]).reshape((-1,) + (1,) * (nd - 1 - i))
        pos = o * strides[i] - begins[i] + offsets[best, i] * dilations[i]
        spatial = spatial * sizes[i] + pos
    planes = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(
        x.shape[:2] + (1,) * nd)
    return y, planes * math.prod(sizes) + spatial


def average_pool(x, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    """Mean over each window: of its input pixels, or (count_include_pad) of its pixels inside
    the padded input; a ceil_mode overhang past the end pad never counts."""
    acc = compute_dtype(x.dtype)
    views, outs, begins, ends, strides, dilations = _pool_windows(
        x.astype(acc, copy=False), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0)
    total = functools.reduce(np.add, views)
    sizes = x.shape[2:]
    if count_include_pad:
        lo, hi = [-b for b in begins], [n + e for n, e in zip(sizes, ends)]
    else:
        lo, hi = [0] * len(sizes), list(sizes)
    count = _window_counts(outs, kernel_shape, strides, dilations, begins, lo, hi)
    return (total / np.maximum(count, 1).astype(acc)).astype(x.dtype)


def lp_pool(x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
            pads=None, strides=None):
    """(sum of |x|^p over each window)^(1/p); padding contributes zero."""
    acc = compute_dtype(x.dtype)
    powered = np.abs(x.astype(acc, copy=False)) ** p
    views = _pool_windows(powered, kernel_shape, strides, dilations, pads, auto_pad,
                          ceil_mode, 0)[0]
    return (functools.reduce(np.add, views) ** (1.0 / p)).astype(x.dtype)


def _pool_infer(dtypes, indices=False):
    def infer(ctx):
        check_dtype(ctx, 0, dtypes)
        nd = check_image(ctx)
        kernel, strides, dilations, pads = spatial_attrs(ctx, nd, ctx.attrs["kernel_shape"])
        if ctx.attrs.get("storage_order", 0) not in (0, 1):
            raise ctx.fail(f"storage_order must be 0 or 1, given {ctx.attrs['storage_order']}")
        xs = ctx.shape(0)
        outs = window_dims(ctx, xs[2:], kernel, strides, dilations, pads,
                            ctx.attrs["auto_pad"], ctx.attrs.get("ceil_mode", 0))
        shape = tuple(xs[:2]) + tuple(outs)
        types = [T.TensorType(ctx.dtype(0), shape)]
        if indices:
            types.append(T.TensorType(T.int64, shape))
        return types

    return infer


def window_maximum(x, win: Windows, kernel, n, c, o) -> Expr:
    """The maximum of NCHW `x` over image n's, channel c's window at output position `o`
    (`win`'s geometry), the positions outside x left out."""
    rk = kernel_axes(kernel)
    pos, inside = win.reads(o, kernel_offsets(rk))
    return reduce_max(x[(n, c, *pos)], reduced_axes(*rk), where=inside)


def _max_pool_rule(inputs, outputs, **attrs):
    """The window maximum; Indices as a second stage: the first kernel offset (C order, as
    the reference's strict `>` keeps) holding that maximum, decoded into a flat position."""
    x = inputs[0]
    kernel = attrs["kernel_shape"]
    win = Windows.of(x, outputs[0].shape, kernel, attrs)
    y = compute(outputs[0].shape,
                lambda n, c, *o: window_maximum(x, win, kernel, n, c, o), "max_pool", x.dtype)
    if len(outputs) == 1:
        return [y]
    nd = len(kernel)
    after = [math.prod(kernel[i + 1:]) for i in range(nd)]   # C-order strides of offsets

    def first_max(n, c, *o):
        rk = kernel_axes(kernel)
        ks = kernel_offsets(rk)
        pos, inside = win.reads(o, ks)
        # clamped, the load stays inside x where `inside` is false (a condition is not lazy)
        safe = [minimum(maximum(p, 0), size - 1) for p, size in zip(pos, win.sizes)]
        hit = eq(x[(n, c, *safe)], y[(n, c, *o)])
        j = sum((k * a for k, a in zip(ks, after)), const(0))
        return reduce_min(j, reduced_axes(*rk), where=hit if inside is None
                          else logical_and(inside, hit))

    best = compute(outputs[0].shape, first_max, "max_pool_offset", T.int64)
    total = math.prod(kernel)

    def flat_index(n, c, *o):
        # a window wholly in padding has no hit: the reference then reports offset 0
        j = minimum(best[(n, c, *o)], total - 1)
        pos = [win.start(i, o[i]) + (j // after[i]) % kernel[i] * win.dilations[i]
               for i in range(nd)]
        order = range(nd) if attrs["storage_order"] == 0 else reversed(range(nd))
        spatial = const(0)
        for i in order:
            spatial = spatial * win.sizes[i] + pos[i]
        plane = n * x.shape[1] + c
        return plane * math.prod(win.sizes[1:], start=win.sizes[0]) + spatial

    return [y, compute(outputs[0].shape, flat_index, "max_pool_indices", T.int64)]


def _average_pool_rule(inputs, outputs, **attrs):
    """Window sum over the pixels inside x, divided by a count computed in closed form per
    axis: of the positions inside x, or (count_include_pad) inside the padded extent."""
    x = inputs[0]
    out = outputs[0]
    kernel = attrs["kernel_shape"]
    win = Windows.of(x, out.shape, kernel, attrs)
    acc = acc_dtype(out.dtype)

    def element(n, c, *o):
        rk = kernel_axes(kernel)
        pos, inside = win.reads(o, kernel_offsets(rk))
        total = reduce_sum(widen(acc, x[(n, c, *pos)]), reduced_axes(*rk), where=inside)
        count = const(1)
        for i, oi in enumerate(o):
            if attrs["count_include_pad"]:
                lo, hi = -win.begins[i], win.sizes[i] + win.ends[i]
            else:
                lo, hi = 0, win.sizes[i]
            count = count * win.count(i, oi, lo, hi)
        return total / widen(acc, maximum(count, 1))

    return [compute(out.shape, element, "average_pool", out.dtype)]


def _power(v: Expr, p: int) -> Expr:
    """v ** p as the reference's NumPy computes it (squares and roots by their fast paths)."""
    if p == 1:
        return v
    if p == 2:
        return v * v
    return call("pow", v, const(p, v.dtype))


def _root(v: Expr, p: int) -> Expr:
    if p == 1:
        return v
    if p == 2:
        return call("sqrt", v)
    return call("pow", v, const(1.0 / p, v.dtype))


def _lp_pool_rule(inputs, outputs, **attrs):
    x = inputs[0]
    out = outputs[0]
    kernel, p = attrs["kernel_shape"], attrs["p"]
    win = Windows.of(x, out.shape, kernel, attrs)
    acc = acc_dtype(out.dtype)

    def element(n, c, *o):
        rk = kernel_axes(kernel)
        pos, inside = win.reads(o, kernel_offsets(rk))
        v = call("abs", widen(acc, x[(n, c, *pos)]))
        return _root(reduce_sum(_power(v, p), reduced_axes(*rk), where=inside), p)

    return [compute(out.shape, element, "lp_pool", out.dtype)]


POOL_ATTRS = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None,
              "kernel_shape": REQUIRED, "pads": None, "strides": None}

def window_flops(node) -> Count:
    """One per window element of each output element."""
    return numel(node.outputs[0]) * math.prod(node.attrs["kernel_shape"])


register_op("MaxPool", pattern=Pattern.OPAQUE, evaluate=max_pool, outputs=(1, 2),
            infer=_pool_infer(FLOATS + (T.int8, T.uint8), indices=True),
            attrs={**POOL_ATTRS, "storage_order": 0}, compute=_max_pool_rule,
            flops=window_flops,
            batched=batching.data_input)
register_op("AveragePool", pattern=Pattern.OPAQUE, evaluate=average_pool,
            infer=_pool_infer(FLOATS), attrs={**POOL_ATTRS, "count_include_pad": 0},
            compute=_average_pool_rule, flops=window_flops,
            batched=batching.data_input)
register_op("LpPool", pattern=Pattern.OPAQUE, evaluate=lp_pool, infer=_pool_infer(FLOATS),
            attrs={**POOL_ATTRS, "p": 2}, compute=_lp_pool_rule, flops=window_flops,
            batched=batching.data_input)

# -- global pools ------------------------------------------------------------------------------


def _global_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    nd = check_image(ctx)
    return [T.TensorType(ctx.dtype(0), tuple(ctx.shape(0)[:2]) + (1,) * nd)]


def _spatial_axes(x):
    return tuple(range(2, x.ndim))


def global_average_pool(x):
    acc = compute_dtype(x.dtype)
    return x.mean(axis=_spatial_axes(x), keepdims=True, dtype=acc).astype(x.dtype)


def global_lp_pool(x, p=2):
    acc = compute_dtype(x.dtype)
    total = (np.abs(x.astype(acc, copy=False)) ** p).sum(axis=_spatial_axes(x), keepdims=True)
    return (total ** (1.0 / p)).astype(x.dtype)


def _global_rule(reducer, name):
    """A global pool's rule: `reducer(x, x[n, c, *r], r, acc)` over spatial reduce axes r."""

    def rule(inputs, outputs, **attrs):
        x = inputs[0]
        out = outputs[0]
        acc = acc_dtype(out.dtype)

        def element(n, c, *_):
            r = [reduce_axis(d, f"r{i}") for i, d in enumerate(x.shape[2:])]
            return reducer(x, x[(n, c, *(a.var for a in r))], r, acc, **attrs)

        return [compute(out.shape, element, name, out.dtype)]

    return rule


def _global_mean(x, v, r, acc):
    count = math.prod(x.shape[3:], start=x.shape[2])
    return reduce_sum(widen(acc, v), r) / widen(acc, count)


def _global_lp(x, v, r, acc, p):
    return _root(reduce_sum(_power(call("abs", widen(acc, v)), p), r), p)


register_op("GlobalAveragePool", pattern=Pattern.REDUCE, infer=_global_infer,
            evaluate=global_average_pool,
            compute=_global_rule(_global_mean, "global_average_pool"),
            batched=batching.data_input)
register_op("GlobalMaxPool", pattern=Pattern.REDUCE, infer=_global_infer,
            evaluate=lambda x: x.max(axis=_spatial_axes(x), keepdims=True),
            compute=_global_rule(lambda x, v, r, acc: reduce_max(v, r), "global_max_pool"),
            batched=batching.data_input)
register_op("GlobalLpPool", pattern=Pattern.REDUCE, infer=_global_infer,
            evaluate=global_lp_pool, attrs={"p": 2},
            compute=_global_rule(_global_lp, "global_lp_pool"), flops=per_input(2),
            batched=batching.data_input)

# -- MaxUnpool ---------------------------------------------------------------------------------


def _unpool_sizes(sizes, kernel, strides, pads):
    nd = len(sizes)
    return [(n - 1) * s - pads[i] - pads[nd + i] + k
            for i, (n, k, s) in enumerate(zip(sizes, kernel, strides))]


def max_unpool(x, indices, output_shape=None, kernel_shape=None, pads=None, strides=None):
    """Scatter x to the flat positions in `indices` of the tensor MaxPool read (its default
    shape), zeros elsewhere; a larger output_shape pads that tensor at the end of each axis."""
    nd = x.ndim - 2
    strides, _, pads = window_attrs(nd, strides, None, pads)
    default = tuple(x.shape[:2]) + tuple(_unpool_sizes(x.shape[2:], kernel_shape, strides, pads))
    y = np.zeros(math.prod(default), x.dtype)
    y[indices.reshape(-1)] = x.reshape(-1)
    y = y.reshape(default)
    if output_shape is None:
        return y
    out = np.zeros(tuple(int(v) for v in output_shape), x.dtype)
    out[tuple(slice(0, min(a, b)) for a, b in zip(default, out.shape))] = \
        y[tuple(slice(0, min(a, b)) for a, b in zip(default, out.shape))]
    return out


def _max_unpool_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    check_dtype(ctx, 1, (T.int64,), "indices")
    check_dtype(ctx, 2, (T.int64,), "output_shape")
    nd = check_image(ctx)
    kernel, strides, _, pads = spatial_attrs(ctx, nd, ctx.attrs["kernel_shape"])
    xs = ctx.shape(0)
    if ctx.has(2):
        dims = ctx.dims(2)
        if dims is None:
            dims = [ctx.fresh_dim() for _ in range(nd + 2)]
        if len(dims) != nd + 2:
            raise ctx.fail(f"output_shape must have {nd + 2} entries, given {dims}")
        return [T.TensorType(ctx.dtype(0), dims)]
    dims = [T.dim_add(T.dim_mul(n, s), k - s - pads[i] - pads[nd + i])
            for i, (n, k, s) in enumerate(zip(xs[2:], kernel, strides))]
    return [T.TensorType(ctx.dtype(0), tuple(xs[:2]) + tuple(dims))]


def _max_unpool_rule(inputs, outputs, **attrs):
    raise NoCompute("MaxUnpool scatters to data-dependent positions; it runs on the host")


register_op("MaxUnpool", pattern=Pattern.OPAQUE, infer=_max_unpool_infer, evaluate=max_unpool,
            inputs=(2, 3), attrs={"kernel_shape": REQUIRED, "pads": None, "strides": None},
            compute=_max_unpool_rule)
