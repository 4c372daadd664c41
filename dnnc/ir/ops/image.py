"""Image ops: Resize, GridSample, AffineGrid, RoiAlign.

Resampling references work in float64 and cast back to the input's element type (integers round
half to even and saturate, as ONNX's Resize does). Resize is separable: it resamples one axis at a
time with per-axis taps and weights. These references are the oracle, written for clarity; they
must never depend on a backend.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import types as T
from ..compute import NoCompute, compute, reduce_axis, reduce_sum
from ..loop import INDEX, Cast, Select, call, const, eq, logical_and, logical_or, maximum, \
    minimum
from .index_exprs import const_int
from .infer import check_dtype, normalize_axis
from .registry import Pattern, register_op

FLOATS = T.FLOAT_DTYPES
NUMERIC = T.FLOAT_DTYPES + T.INT_DTYPES


def _to_dtype(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 results back to `dtype`: integers round half to even and saturate."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(y), info.min, info.max).astype(dtype)
    return y.astype(dtype)


def _present(a):
    """An optional 1-D input; an empty tensor means absent (as exporters write for opset 11)."""
    return None if a is None or np.asarray(a).size == 0 else np.asarray(a)


# -- compute-rule helpers ------------------------------------------------------------------------

_stage_ids = itertools.count()


def _stage(hint: str) -> str:
    """A unique name for a rule's stage or reduce axis (two nodes may share one kernel)."""
    return f"{hint}{next(_stage_ids)}"


def _input(inputs, i):
    """Input i's Tensor, None when absent (lowering passes trailing absent inputs too)."""
    return inputs[i] if i < len(inputs) else None


def _acc_dtype(dtype: T.DType) -> T.DType:
    """What resampling sums in: float32 for float32 and narrower floats; float64 for float64
    and integers (an int32 pixel needs more than float32's 24 bits, and integer results round
    as the float64 reference does)."""
    return T.float32 if dtype.is_float and dtype.itemsize <= 4 else T.float64


def _as(dtype: T.DType, e):
    return e if e.dtype is dtype else Cast(dtype, e)


def _from_acc(v, dtype: T.DType):
    """An accumulated value as `dtype`: integers round half to even and saturate."""
    if dtype.is_float:
        return _as(dtype, v)
    info = np.iinfo(dtype.np)
    v = call("round", v)
    v = maximum(minimum(v, const(float(info.max), v.dtype)), const(float(info.min), v.dtype))
    return Cast(dtype, v)


def _clamped_index(f, last):
    """An integer-valued float `f` as an index in [0, last]. NaN and infinities land inside too:
    NaN > 0 is false, so the Select picks 0 (a float-to-int cast of NaN or of a value out of
    range is undefined in LLVM and C, so the clamp happens before the cast)."""
    zero = const(0.0, f.dtype)
    return Cast(INDEX, Select(f > zero, minimum(f, Cast(f.dtype, const(last))), zero))


def _keys_expr(t, a: float):
    """`_keys` in loop IR."""
    t = call("abs", t)
    near = (t * (a + 2) - (a + 3)) * t * t + 1.0
    far = ((t * a - 5 * a) * t + 8 * a) * t - 4 * a
    return Select(t <= 1.0, near, Select(t < 2.0, far, const(0.0, t.dtype)))


# -- Resize --------------------------------------------------------------------------------------

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _resize_axes(axes, rank: int) -> list[int]:
    if axes is None:
        return list(range(rank))
    return [a + rank if a < 0 else a for a in axes]


def resize_plan(in_shape, axes, scales, sizes, policy):
    """Per-axis (output size, scale) for resized `axes`; other axes keep their size, scale 1."""
    out = list(in_shape)
    scale = [1.0] * len(in_shape)
    if sizes is not None:
        ratios = [float(s) / in_shape[a] for a, s in zip(axes, sizes)]
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(axes)
            sizes = [int(common * in_shape[a] + 0.5) for a in axes]  # round half up
        for a, s, r in zip(axes, sizes, ratios):
            out[a], scale[a] = int(s), r
    else:
        for a, s in zip(axes, scales):
            scale[a] = float(s)
            out[a] = int(math.floor(float(s) * in_shape[a]))
    return out, scale


def _source_coords(mode, out_len, in_len, scale, roi):
    """Output indices mapped to input coordinates (float64), per coordinate mode."""
    y = np.arange(out_len, dtype=np.float64)
    # align_corners and tf_crop_and_resize divide by the un-floored output length less one, as
    # the ONNX node suite's data does (onnxruntime uses the integer length; they differ only for
    # scales whose product with the input length is fractional)
    out_f = scale * in_len
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_f)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return np.zeros(out_len) if out_len == 1 else (y + 0.5) / scale - 0.5
    if mode == "align_corners":
        return np.zeros(out_len) if out_f == 1 else y * (in_len - 1) / (out_f - 1)
    if mode == "asymmetric":
        return y / scale
    start, end = roi  # tf_crop_and_resize
    if out_f == 1:
        return np.full(out_len, (end - start) * (in_len - 1) / 2 + start * (in_len - 1))
    return y * (end - start) * (in_len - 1) / (out_f - 1) + start * (in_len - 1)


def _nearest_index(x, nearest_mode):
    if nearest_mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    return np.floor(x) if nearest_mode == "floor" else np.ceil(x)


def _keys(t, a):
    """Keys' cubic convolution kernel with coefficient a (ONNX's cubic_coeff_a)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _taps_and_weights(x, in_len, scale, mode, cubic_coeff_a, antialias, exclude_outside):
    """Input indices (out, taps) and weights for linear/cubic resampling at coordinates x."""
    support = 1 if mode == "linear" else 2
    s = min(scale, 1.0) if antialias else 1.0  # antialias widens the kernel when downscaling
    first = int(math.floor(-support / s)) + 1
    k = np.arange(first, 2 - first)
    base = np.ceil(x) - 1  # the tap left of x; an integer x counts as the right end of a cell
    t = (k[None, :] - (x - base)[:, None]) * s
    w = np.clip(1 - np.abs(t), 0, 1) if mode == "linear" else _keys(t, cubic_coeff_a)
    idx = base.astype(np.int64)[:, None] + k[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
    if antialias or exclude_outside:
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return idx, w


def _resize_axis(data, axis, out_len, scale, roi, attrs):
    in_len = data.shape[axis]
    if out_len == 0:
        shape = list(data.shape)
        shape[axis] = 0
        return np.empty(shape)
    ctm = attrs["coordinate_transformation_mode"]
    x = _source_coords(ctm, out_len, in_len, scale, roi)
    if attrs["mode"] == "nearest":
        idx = np.clip(_nearest_index(x, attrs["nearest_mode"]), 0, in_len - 1).astype(np.int64)
        y = np.take(data, idx, axis=axis)
    else:
        idx, w = _taps_and_weights(x, in_len, scale, attrs["mode"], attrs["cubic_coeff_a"],
                                   attrs["antialias"], attrs["exclude_outside"])
        gathered = np.take(data, np.clip(idx, 0, in_len - 1), axis=axis)
        w = w.reshape((1,) * axis + w.shape + (1,) * (data.ndim - axis - 1))
        y = (gathered * w).sum(axis=axis + 1)
    if ctm == "tf_crop_and_resize":
        outside = ((x < 0) | (x > in_len - 1)).reshape((-1,) + (1,) * (data.ndim - axis - 1))
        y = np.where(outside, attrs["extrapolation_value"], y)
    return y


def resize(x, roi=None, scales=None, sizes=None, **attrs):
    roi, scales, sizes = _present(roi), _present(scales), _present(sizes)
    axes = _resize_axes(attrs["axes"], x.ndim)
    out, scale = resize_plan(x.shape, axes, scales, sizes, attrs["keep_aspect_ratio_policy"])
    if roi is not None:
        roi = roi.astype(np.float64)
    y = x.astype(np.float64)
    for i, a in enumerate(axes):
        box = (0.0, 1.0) if roi is None else (roi[i], roi[i + len(axes)])
        if math.isclose(scale[a], 1.0) and out[a] == x.shape[a] and box == (0.0, 1.0):
            continue  # identity along this axis
        y = _resize_axis(y, a, out[a], scale[a], box, attrs)
    return _to_dtype(y, x.dtype)


def _resize_infer(ctx):
    a = ctx.attrs
    check_dtype(ctx, 0, NUMERIC)
    for key, allowed in (("mode", ("nearest", "linear", "cubic")),
                         ("coordinate_transformation_mode", _COORD_MODES),
                         ("nearest_mode", _NEAREST_MODES),
                         ("keep_aspect_ratio_policy", _POLICIES)):
        if a[key] not in allowed:
            raise ctx.fail(f"{key}={a[key]!r} is not one of {', '.join(allowed)}")
    if a["antialias"] and a["mode"] == "nearest":
        raise ctx.fail("antialias applies to linear and cubic modes only")
    shape = ctx.shape(0)
    rank = len(shape)
    axes = [normalize_axis(ctx, ax, rank) for ax in (a["axes"] or range(rank))]
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {a['axes']} repeat an axis")
    given = [ctx.has(i) and ctx.type(i).numel != 0 for i in (1, 2, 3)]
    if given[1] == given[2]:
        raise ctx.fail("exactly one of scales and sizes must be given")
    if a["coordinate_transformation_mode"] == "tf_crop_and_resize" and not given[0]:
        raise ctx.fail("tf_crop_and_resize needs the roi input")
    which = 2 if given[1] else 3
    count = ctx.type(which).shape[0] if ctx.type(which).rank == 1 else None
    if count is None or isinstance(count, int) and count != len(axes):
        raise ctx.fail(f"{'scales' if which == 2 else 'sizes'} must hold one entry per "
                       f"resized axis ({len(axes)}), given {ctx.type(which)}")
    out = list(shape)
    if which == 2:
        scales = ctx.value(2)
        for i, ax in enumerate(axes):
            if scales is None:
                out[ax] = ctx.fresh_dim("resize")
            elif isinstance(shape[ax], int):
                out[ax] = int(math.floor(float(scales[i]) * shape[ax]))
            elif float(scales[i]) != 1.0:
                out[ax] = ctx.fresh_dim("resize")
    else:
        sizes = ctx.dims(3)
        static = sizes is not None and T.static_shape(sizes) is not None and \
            T.static_shape(shape[ax] for ax in axes) is not None
        if static and a["keep_aspect_ratio_policy"] != "stretch":
            out, _ = resize_plan(shape, axes, None, sizes, a["keep_aspect_ratio_policy"])
        elif sizes is not None and a["keep_aspect_ratio_policy"] == "stretch":
            for ax, d in zip(axes, sizes):
                out[ax] = d
        else:
            for ax in axes:
                out[ax] = ctx.fresh_dim("resize")
    return [T.TensorType(ctx.dtype(0), tuple(out))]


def _known(inputs, i: int, what: str):
    """An optional 1-D input's constant value; None when absent or empty."""
    t = _input(inputs, i)
    if t is None:
        return None
    if t.value is None:
        if any(d == const(0) for d in t.shape):
            return None
        raise NoCompute(f"Resize's {what} is known only at run time")
    return _present(t.value)


def _resize_coord(mode: str, o, out_len: int, in_len: int, scale: float, box):
    """`_source_coords` of output index `o`, in float64 as the reference: in float32, 3 / 0.6f
    rounds to 5.0 instead of 4.9999998, and a floor picks another pixel."""
    y = Cast(T.float64, o)
    out_f = scale * in_len
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_f)
        return (y + 0.5) / scale + offset - 0.5  # the reference's order of operations
    if mode == "pytorch_half_pixel":
        return const(0.0, T.float64) if out_len == 1 else (y + 0.5) / scale - 0.5
    if mode == "align_corners":
        return const(0.0, T.float64) if out_f == 1 else y * (in_len - 1) / (out_f - 1)
    if mode == "asymmetric":
        return y / scale
    start, end = box  # tf_crop_and_resize
    if out_f == 1:
        return const((end - start) * (in_len - 1) / 2 + start * (in_len - 1), T.float64)
    return y * (end - start) * (in_len - 1) / (out_f - 1) + start * (in_len - 1)


def _nearest_expr(x, nearest_mode: str):
    if nearest_mode == "round_prefer_floor":
        return call("ceil", x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return call("floor", x + 0.5)
    return call("floor" if nearest_mode == "floor" else "ceil", x)


def _resize_taps(coord, out_len: int, in_len: int, scale: float, acc: T.DType, attrs):
    """One resampled axis's taps, as `_taps_and_weights`: (count, index stage, weight stage),
    both stages [out_len, count] (functions of one output axis: lowering may hoist them)."""
    linear = attrs["mode"] == "linear"
    s = min(scale, 1.0) if attrs["antialias"] else 1.0  # antialias widens the kernel
    first = int(math.floor(-(1 if linear else 2) / s)) + 1
    count = 2 - 2 * first

    def position(o, tap):  # (the tap's input index as a float, its offset from x)
        x = coord(o)
        base = call("ceil", x) - 1.0  # an integer x counts as the right end of a cell
        k = Cast(T.float64, tap + first)
        return base + k, (k - (x - base)) * s

    def raw_weight(o, tap):
        i, t = position(o, tap)
        w = maximum(minimum(1.0 - call("abs", t), 1.0), 0.0) if linear else \
            _keys_expr(t, attrs["cubic_coeff_a"])
        if attrs["exclude_outside"]:
            w = Select(logical_or(i < 0.0, i > in_len - 1.0), const(0.0, T.float64), w)
        return w

    raw = compute((out_len, count), raw_weight, name=_stage("resize_raw_weight"))
    if attrs["antialias"] or attrs["exclude_outside"]:  # weights renormalised to sum to 1
        k = reduce_axis(count, _stage("resize_k"))
        total = compute((out_len,), lambda o: reduce_sum(raw[o, k], k),
                        name=_stage("resize_total"))
        safe_total = compute((out_len,), lambda o: Select(eq(total[o], 0.0),
                                                          const(1.0, T.float64), total[o]))

        def weight(o, tap):
            return raw[o, tap] / safe_total[o]
    else:
        def weight(o, tap):
            return raw[o, tap]

    index = compute((out_len, count),
                    lambda o, tap: _clamped_index(position(o, tap)[0], in_len - 1),
                    name=_stage("resize_index"))
    weights = compute((out_len, count), lambda o, tap: _as(acc, weight(o, tap)),
                      name=_stage("resize_weight"))
    return count, index, weights


def _resize_rule(inputs, outputs, **attrs):
    """Nearest: a gather at per-axis indices. Linear and cubic: per resampled axis, a weighted
    sum over its taps (separable weights, one kernel, sums nested)."""
    x, out = inputs[0], outputs[0]
    ctm = attrs["coordinate_transformation_mode"]
    roi = _known(inputs, 1, "roi") if ctm == "tf_crop_and_resize" else None  # else unused
    scales, sizes = _known(inputs, 2, "scales"), _known(inputs, 3, "sizes")
    axes = _resize_axes(attrs["axes"], x.ndim)
    in_shape = [const_int(d) for d in x.shape]
    for i, a in enumerate(axes):  # a symbolic axis can only pass through unchanged
        if in_shape[a] is None and (scales is None or float(scales[i]) != 1.0):
            raise NoCompute("Resize of an axis of symbolic length: its output length and "
                            "scale are known only at run time")
    sizes_or_ones = [1 if d is None else d for d in in_shape]
    out_len, scale = resize_plan(sizes_or_ones, axes, scales, sizes,
                                 attrs["keep_aspect_ratio_policy"])
    coords = {}  # resampled axis -> its source coordinate as a function of the output index
    for i, a in enumerate(axes):
        box = (0.0, 1.0) if roi is None else (float(roi[i]), float(roi[i + len(axes)]))
        if in_shape[a] is None or (math.isclose(scale[a], 1.0) and out_len[a] == in_shape[a]
                                   and box == (0.0, 1.0)):
            continue  # identity along this axis, as the reference
        coords[a] = (lambda o, a=a, box=box: _resize_coord(ctm, o, out_len[a], in_shape[a],
                                                           scale[a], box))
    acc = _acc_dtype(x.dtype)

    def extrapolated(v, o, resampled):
        """tf_crop_and_resize: extrapolation_value where an axis in `resampled` samples
        outside the input."""
        if ctm != "tf_crop_and_resize" or not resampled:
            return v
        outside = logical_or(*(logical_or(c < 0.0, c > in_shape[a] - 1.0)
                               for a, c in ((a, coords[a](o[a])) for a in resampled)))
        value = _to_dtype(np.array(attrs["extrapolation_value"], np.float64), v.dtype.np)
        return Select(outside, const(value.item(), v.dtype), v)

    if attrs["mode"] == "nearest" or not coords:
        def element(*o):
            idx = list(o)
            for a, coord in coords.items():
                idx[a] = _clamped_index(_nearest_expr(coord(o[a]), attrs["nearest_mode"]),
                                        in_shape[a] - 1)
            return extrapolated(x[tuple(idx)], o, list(coords))

        return [compute(out.shape, element, name=_stage("resize"), dtype=out.dtype)]

    taps = {a: _resize_taps(coord, out_len[a], in_shape[a], scale[a], acc, attrs)
            for a, coord in coords.items()}

    def element(*o):
        # one sum per resampled axis, nested in the reference's order (the first axis
        # innermost), so results round as it does: integer outputs hit its exact .5 ties
        idx, tap_vars = list(o), {}
        for a, (count, index, _) in taps.items():
            tap_vars[a] = reduce_axis(count, _stage("resize_tap"))
            idx[a] = index[o[a], tap_vars[a].var]
        v = _as(acc, x[tuple(idx)])
        for a, (_, _, weights) in taps.items():
            v = reduce_sum(v * weights[o[a], tap_vars[a].var], tap_vars[a])
            v = extrapolated(v, o, [a])
        return _from_acc(v, x.dtype)

    return [compute(out.shape, element, name=_stage("resize"), dtype=out.dtype)]


register_op("Resize", pattern=Pattern.INJECTIVE, infer=_resize_infer, evaluate=resize,
            inputs=(1, 4), compute=_resize_rule,
            attrs={"antialias": 0, "axes": None, "coordinate_transformation_mode": "half_pixel",
                   "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
                   "keep_aspect_ratio_policy": "stretch", "mode": "nearest",
                   "nearest_mode": "round_prefer_floor"}, params=(1, 2, 3))


# -- GridSample ----------------------------------------------------------------------------------


def _reflect(v, lo, hi):
    """Reflect coordinates into [lo, hi] off its borders (as PyTorch's grid_sampler)."""
    span = hi - lo
    if span <= 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    d = np.where(below, lo - v, np.where(above, v - hi, 0.0))
    flips = np.floor(d / span)
    rest = d - flips * span
    even = flips % 2 == 0
    low_side = np.where(below, even, ~even)  # which border the point ends up measured from
    inside = np.where(low_side, lo + rest, hi - rest)
    return np.where(below | above, inside, v)


def grid_sample(x, grid, align_corners, mode, padding_mode):
    n, c, *dims = x.shape
    g = grid.astype(np.float64)[..., ::-1]  # grid's last axis lists x (innermost dim) first
    lows, highs, coords = [], [], []
    for k, d in enumerate(dims):
        v = g[..., k]
        v = (v + 1) / 2 * (d - 1) if align_corners else ((v + 1) * d - 1) / 2
        lo, hi = (0.0, d - 1.0) if align_corners else (-0.5, d - 0.5)
        if mode == "nearest":
            v = np.rint(v)  # half to even, as PyTorch
        if padding_mode == "border" and mode != "cubic":  # cubic clamps each tap instead,
            v = np.where((v < lo) | (v > hi), np.clip(v, 0, d - 1), v)  # as PyTorch
        elif padding_mode == "reflection":
            v = _reflect(v, lo, hi)
        lows.append(lo)
        highs.append(hi)
        coords.append(v)

    taps = []  # per spatial dim: list of (integer index array, weight array)
    for v in coords:
        if mode == "nearest":
            taps.append([(np.trunc(v).astype(np.int64), np.ones_like(v))])
            continue
        base = np.floor(v)
        t = v - base
        if mode == "linear":
            taps.append([(base.astype(np.int64), 1 - t), (base.astype(np.int64) + 1, t)])
        else:
            taps.append([(base.astype(np.int64) + k, _keys(t - k, -0.75)) for k in (-1, 0, 1, 2)])

    xf = x.astype(np.float64)
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    y = np.zeros((n,) + grid.shape[1:-1] + (c,))
    for combo in itertools.product(*taps):
        weight = np.ones(grid.shape[:-1])
        valid = np.ones(grid.shape[:-1], dtype=bool)
        index = []
        for k, (i, w) in enumerate(combo):
            d = dims[k]
            if padding_mode == "zeros":
                valid &= (i >= 0) & (i < d)
            elif padding_mode == "border":
                i = np.clip(i, 0, d - 1)
            else:
                i = np.trunc(_reflect(i.astype(np.float64), lows[k], highs[k])).astype(np.int64)
            index.append(np.clip(i, 0, d - 1))
            weight = weight * w
        vals = xf[(batch, slice(None), *index)]  # advanced dims first: (N, *out, C)
        y += np.where(valid, weight, 0.0)[..., None] * vals
    return _to_dtype(np.moveaxis(y, -1, 1), x.dtype)


def _grid_sample_infer(ctx):
    a = ctx.attrs
    check_dtype(ctx, 0, NUMERIC)
    check_dtype(ctx, 1, FLOATS, "grid")
    if a["mode"] not in ("linear", "nearest", "cubic"):
        raise ctx.fail(f"mode={a['mode']!r} is not one of linear, nearest, cubic")
    if a["padding_mode"] not in ("zeros", "border", "reflection"):
        raise ctx.fail(f"padding_mode={a['padding_mode']!r} is not one of zeros, border, "
                       f"reflection")
    xs, gs = ctx.shape(0), ctx.shape(1)
    r = len(xs) - 2
    if r < 1 or len(gs) != r + 2 or isinstance(gs[-1], int) and gs[-1] != r:
        raise ctx.fail(f"grid {ctx.type(1)} does not fit input {ctx.type(0)}: expected "
                       f"[N, out spatial dims ({r}), {r}]")
    if a["mode"] == "cubic" and r != 2:
        raise ctx.fail("cubic mode supports 2-D spatial inputs only")
    batch = T.broadcast_shapes((xs[0],), (gs[0],))[0]
    return [T.TensorType(ctx.dtype(0), (batch, xs[1]) + tuple(gs[1:-1]))]


def _reflect_expr(v, lo, hi):
    """`_reflect` in loop IR, as a fold of the period 2 (hi - lo) (v appears 6 times rather
    than the reference's ~30: it is inlined into every tap)."""
    span = hi - lo
    u = v - lo
    m = u - call("floor", u / (span * 2.0)) * (span * 2.0)  # in [0, 2 span)
    return Select(span > 0.0, lo + Select(m <= span, m, span * 2.0 - m), lo)


def _reflect_index(i, d, align_corners):
    """The reference's trunc(_reflect(i)) of an integer tap index, in integers: a fold of the
    period 2 (d - 1) (align_corners: the border pixels are not repeated) or 2 d. The result
    lies in [0, d) by construction."""
    if align_corners:
        period = maximum(d * 2 - 2, const(1))  # d == 1 folds everything onto 0
        m = i % period
        return Select(m < d, m, period - m)
    m = i % (d * 2)
    return Select(m < d, m, d * 2 - 1 - m)


def _grid_sample_rule(inputs, outputs, align_corners, mode, padding_mode, **_):
    """A sum over each spatial dim's taps (1 nearest, 2 linear, 4 cubic) of weighted input
    reads at positions read from the grid. Positions are data: every index is clamped or
    folded into the input (NaN and infinite grid values included) before it is loaded, and
    zeros padding is a `where=`."""
    x, grid, out = inputs[0], inputs[1], outputs[0]
    r = x.ndim - 2
    cdt = T.float64 if grid.dtype is T.float64 else T.float32  # coordinate arithmetic
    acc = _acc_dtype(x.dtype)
    first, count = {"nearest": (0, 1), "linear": (0, 2), "cubic": (-1, 4)}[mode]
    x_batch = (lambda n: const(0)) if x.shape[0] == const(1) else (lambda n: n)
    grid_batch = (lambda n: const(0)) if grid.shape[0] == const(1) else (lambda n: n)

    def bounds(k):  # the dim's length and the range reflection folds into, as floats
        d = Cast(cdt, x.shape[2 + k])
        return (d, const(0.0, cdt), d - 1.0) if align_corners else (d, const(-0.5, cdt), d - 0.5)

    def position(n, o, k):  # the sampling position along spatial dim k, as grid_sample
        d, lo, hi = bounds(k)
        g = _as(cdt, grid[(grid_batch(n),) + tuple(o) + (const(r - 1 - k),)])
        v = (g + 1.0) / 2.0 * (d - 1.0) if align_corners else ((g + 1.0) * d - 1.0) / 2.0
        if mode == "nearest":
            v = call("round", v)  # half to even, as PyTorch
        if padding_mode == "border" and mode != "cubic":
            v = Select(logical_or(v < lo, v > hi),
                       maximum(minimum(v, d - 1.0), const(0.0, cdt)), v)
        elif padding_mode == "reflection":
            v = _reflect_expr(v, lo, hi)
        return v

    def tap(v, k, t):
        """(input index, weight, in-bounds condition) of tap t (None: the only tap)."""
        d, lo, hi = bounds(k)
        if padding_mode == "reflection":
            # v lies in [lo, hi] unless the grid held NaN, infinities or values too large for
            # the fold to be exact: those read at lo, so the casts below stay defined
            safe = Select(logical_and(v >= lo, v <= hi), v, lo)
            if t is None:  # trunc of a folded position is inside already
                return Cast(INDEX, call("trunc", safe)), None, None
            i = Cast(INDEX, call("floor", safe)) + (t + first)
            offset = v - Cast(cdt, i)
            index = _reflect_index(i, x.shape[2 + k], align_corners)
            valid = None
        else:
            i = call("trunc", v) if t is None else call("floor", v) + Cast(cdt, t + first)
            offset = v - i
            index = _clamped_index(i, x.shape[2 + k] - 1)
            valid = logical_and(i >= 0.0, i < d)
        weight = None
        if mode == "linear":
            weight = 1.0 - call("abs", offset)
        elif mode == "cubic":
            weight = _keys_expr(offset, -0.75)
        return index, weight, valid

    # one stage per spatial dim: the sampling positions, shared by all channels and taps
    positions = [compute((out.shape[0],) + tuple(out.shape[2:]),
                         lambda n, *o, k=k: position(n, o, k), name=_stage("grid_position"))
                 for k in range(r)]

    def at(n, o, k):
        return positions[k][(n,) + tuple(o)]

    if mode == "nearest":
        def element(n, c, *o):
            taps = [tap(at(n, o, k), k, None) for k in range(r)]
            v = x[(x_batch(n), c) + tuple(i for i, _, _ in taps)]
            if padding_mode == "zeros":
                v = Select(logical_and(*(ok for _, _, ok in taps)), v, const(0, x.dtype))
            return v

        return [compute(out.shape, element, name=_stage("grid_sample"), dtype=out.dtype)]

    def element(n, c, *o):
        axes = [reduce_axis(count, _stage("grid_tap")) for _ in range(r)]
        taps = [tap(at(n, o, k), k, a.var) for k, a in enumerate(axes)]
        weight = taps[0][1]
        for _, w, _ in taps[1:]:
            weight = weight * w
        read = _as(acc, weight) * _as(acc, x[(x_batch(n), c) + tuple(i for i, _, _ in taps)])
        where = logical_and(*(ok for _, _, ok in taps)) if padding_mode == "zeros" else None
        return _from_acc(reduce_sum(read, axes, where=where), x.dtype)

    return [compute(out.shape, element, name=_stage("grid_sample"), dtype=out.dtype)]


register_op("GridSample", pattern=Pattern.OPAQUE, infer=_grid_sample_infer, evaluate=grid_sample,
            inputs=2, attrs={"align_corners": 0, "mode": "linear", "padding_mode": "zeros"},
            compute=_grid_sample_rule)


# -- AffineGrid ----------------------------------------------------------------------------------


def _base_coords(d: int, align_corners: int) -> np.ndarray:
    """Normalised coordinates in [-1, 1] of d pixels: corners or centres."""
    if align_corners:
        return np.linspace(-1.0, 1.0, d)
    return (2 * np.arange(d) + 1) / d - 1


def affine_grid(theta, size, align_corners):
    spatial = [int(d) for d in size[2:]]
    axes = [_base_coords(d, align_corners) for d in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    # homogeneous points (x, y[, z], 1): the innermost spatial dim comes first
    points = np.stack(list(mesh[::-1]) + [np.ones(spatial)], axis=-1)
    grid = np.einsum("...k,nik->n...i", points, theta.astype(np.float64))
    return grid.astype(theta.dtype)


def _affine_grid_infer(ctx):
    check_dtype(ctx, 0, FLOATS, "theta")
    check_dtype(ctx, 1, (T.int64,), "size")
    ts = ctx.shape(0)
    if len(ts) != 3 or (ts[1], ts[2]) not in ((2, 3), (3, 4)):
        raise ctx.fail(f"theta must be [N, 2, 3] or [N, 3, 4], given {ctx.type(0)}")
    r = ts[1]
    size = ctx.dims(1)
    if size is not None and len(size) != r + 2:
        raise ctx.fail(f"size must hold {r + 2} entries for theta {ctx.type(0)}")
    spatial = size[2:] if size is not None else [ctx.fresh_dim("grid") for _ in range(r)]
    return [T.TensorType(ctx.dtype(0), (ts[0], *spatial, r))]


def _affine_grid_rule(inputs, outputs, align_corners, **_):
    """grid[n, *s, i] = theta[n, i, r] + sum_k theta[n, i, k] * base coordinate k of s."""
    theta, size, out = inputs[0], inputs[1], outputs[0]
    if size.value is None:
        raise NoCompute("AffineGrid's size is known only at run time")
    spatial = [int(d) for d in np.asarray(size.value).reshape(-1)[2:]]
    r = len(spatial)
    cdt = T.float64 if theta.dtype is T.float64 else T.float32

    def base(j, d):  # `_base_coords`
        if not align_corners:
            return (Cast(cdt, j) * 2.0 + 1.0) / float(d) - 1.0
        return const(-1.0, cdt) if d == 1 else Cast(cdt, j) * (2.0 / (d - 1)) - 1.0

    def element(n, *rest):
        s, i = rest[:-1], rest[-1]
        total = _as(cdt, theta[n, i, r])
        for k in range(r):  # points list the innermost spatial dim first
            total = total + _as(cdt, theta[n, i, k]) * base(s[r - 1 - k], spatial[r - 1 - k])
        return total

    return [compute(out.shape, element, name=_stage("affine_grid"), dtype=out.dtype)]


register_op("AffineGrid", pattern=Pattern.OPAQUE, infer=_affine_grid_infer, evaluate=affine_grid,
            inputs=2, attrs={"align_corners": 0}, compute=_affine_grid_rule, params=(1,))


# -- RoiAlign ------------------------------------------------------------------------------------


def _bilinear_taps(pos, length):
    """Per sample coordinate: (low, high) indices and weights, zero outside [-1, length]."""
    outside = (pos < -1.0) | (pos > length)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    last = low >= length - 1
    low = np.where(last, length - 1, low)
    high = np.where(last, length - 1, low + 1)
    pos = np.where(last, low, pos)
    frac = pos - low
    w_low = np.where(outside, 0.0, 1 - frac)
    w_high = np.where(outside, 0.0, frac)
    return np.where(outside, 0, low), np.where(outside, 0, high), w_low, w_high


def roi_align(x, rois, batch_indices, coordinate_transformation_mode, mode, output_height,
              output_width, sampling_ratio, spatial_scale):
    n, c, height, width = x.shape
    xf = x.astype(np.float64)
    out = np.zeros((len(rois), c, output_height, output_width))
    offset = 0.5 if coordinate_transformation_mode == "half_pixel" else 0.0
    for r, (roi, b) in enumerate(zip(rois.astype(np.float64), batch_indices)):
        x0, y0, x1, y1 = roi * spatial_scale - offset
        roi_w, roi_h = x1 - x0, y1 - y0
        if not offset:  # output_half_pixel forces malformed ROIs to 1x1
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / output_height, roi_w / output_width
        grid_h = sampling_ratio if sampling_ratio > 0 else int(math.ceil(bin_h))
        grid_w = sampling_ratio if sampling_ratio > 0 else int(math.ceil(bin_w))
        # sample points: (pooled, grid) per axis
        ys = y0 + np.arange(output_height)[:, None] * bin_h + \
            (np.arange(grid_h)[None, :] + 0.5) * bin_h / grid_h
        xs = x0 + np.arange(output_width)[:, None] * bin_w + \
            (np.arange(grid_w)[None, :] + 0.5) * bin_w / grid_w
        yl, yh, wyl, wyh = _bilinear_taps(ys, height)
        xl, xh, wxl, wxh = _bilinear_taps(xs, width)
        img = xf[int(b)]

        def corner(yi, xi, wy, wx):  # weighted values, shape (C, oh, gh, ow, gw)
            vals = img[:, yi[:, :, None, None], xi[None, None, :, :]]
            return wy[:, :, None, None] * wx[None, None, :, :] * vals

        corners = [corner(yl, xl, wyl, wxl), corner(yl, xh, wyl, wxh),
                   corner(yh, xl, wyh, wxl), corner(yh, xh, wyh, wxh)]
        if mode == "avg":
            out[r] = sum(corners).sum(axis=(2, 4)) / max(grid_h * grid_w, 1)
        else:  # max over samples of the largest weighted corner (as onnxruntime)
            out[r] = np.max(np.maximum.reduce(corners), axis=(2, 4), initial=-np.inf) \
                if grid_h * grid_w else 0.0
    return out.astype(x.dtype)


def _roi_align_infer(ctx):
    a = ctx.attrs
    check_dtype(ctx, 0, FLOATS)
    check_dtype(ctx, 1, FLOATS, "rois")
    check_dtype(ctx, 2, (T.int64,), "batch_indices")
    if a["mode"] not in ("avg", "max"):
        raise ctx.fail(f"mode={a['mode']!r} is not one of avg, max")
    if a["coordinate_transformation_mode"] not in ("half_pixel", "output_half_pixel"):
        raise ctx.fail(f"coordinate_transformation_mode="
                       f"{a['coordinate_transformation_mode']!r} is not one of half_pixel, "
                       f"output_half_pixel")
    if ctx.type(0).rank != 4 or ctx.type(1).rank != 2 or ctx.type(2).rank != 1:
        raise ctx.fail(f"expects X [N, C, H, W], rois [R, 4], batch_indices [R], given "
                       f"{', '.join(str(t) for t in ctx.inputs)}")
    rois = T.broadcast_shapes((ctx.shape(1)[0],), (ctx.shape(2)[0],))[0]
    return [T.TensorType(ctx.dtype(0), (rois, ctx.shape(0)[1], a["output_height"],
                                        a["output_width"]))]


def _roi_align_rule(inputs, outputs, **attrs):
    raise NoCompute("RoiAlign: each ROI's box and (with sampling_ratio 0) its number of samples "
                    "per bin come from the rois data; it runs on the host")


register_op("RoiAlign", pattern=Pattern.OPAQUE, infer=_roi_align_infer, evaluate=roi_align,
            inputs=3,
            attrs={"coordinate_transformation_mode": "half_pixel", "mode": "avg",
                   "output_height": 1, "output_width": 1, "sampling_ratio": 0,
                   "spatial_scale": 1.0},
            compute=_roi_align_rule)
