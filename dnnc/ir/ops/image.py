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
        static = sizes is not None and all(isinstance(d, int) for d in sizes) and \
            all(isinstance(shape[ax], int) for ax in axes)
        if static and a["keep_aspect_ratio_policy"] != "stretch":
            out, _ = resize_plan(shape, axes, None, sizes, a["keep_aspect_ratio_policy"])
        elif sizes is not None and a["keep_aspect_ratio_policy"] == "stretch":
            for ax, d in zip(axes, sizes):
                out[ax] = d
        else:
            for ax in axes:
                out[ax] = ctx.fresh_dim("resize")
    return [T.TensorType(ctx.dtype(0), tuple(out))]


register_op("Resize", pattern=Pattern.INJECTIVE, infer=_resize_infer, evaluate=resize,
            inputs=(1, 4),
            attrs={"antialias": 0, "axes": None, "coordinate_transformation_mode": "half_pixel",
                   "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
                   "keep_aspect_ratio_policy": "stretch", "mode": "nearest",
                   "nearest_mode": "round_prefer_floor"})


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


register_op("GridSample", pattern=Pattern.OPAQUE, infer=_grid_sample_infer, evaluate=grid_sample,
            inputs=2, attrs={"align_corners": 0, "mode": "linear", "padding_mode": "zeros"})


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


register_op("AffineGrid", pattern=Pattern.OPAQUE, infer=_affine_grid_infer, evaluate=affine_grid,
            inputs=2, attrs={"align_corners": 0})


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


register_op("RoiAlign", pattern=Pattern.OPAQUE, infer=_roi_align_infer, evaluate=roi_align,
            inputs=3,
            attrs={"coordinate_transformation_mode": "half_pixel", "mode": "avg",
                   "output_height": 1, "output_width": 1, "sampling_ratio": 0,
                   "spatial_scale": 1.0})
