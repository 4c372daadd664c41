"""ONNX importers for image ops.

dnnc's Resize has the opset-19 meaning. Older forms translate: Resize-10 and Upsample had only
scales and used asymmetric coordinates with "simple" nearest rounding (floor when enlarging, ceil
when shrinking, per axis, as onnxruntime), opset 11-12 wrote absent roi/scales as empty tensors.
GridSample-16 named its modes bilinear/bicubic; RoiAlign-10 had output_half_pixel coordinates.
"""

from __future__ import annotations

import numpy as np

from ...ir import types as T
from ..onnx import ImportContext, direct, onnx_op


def _simple_nearest_resize(ctx: ImportContext, x, scales, mode: str):
    """Resize with pre-opset-11 semantics: asymmetric coordinates, 'simple' nearest rounding."""
    if mode in ("linear", "bilinear"):
        return ctx.emit("Resize", [x, None, scales],
                        {"mode": "linear", "coordinate_transformation_mode": "asymmetric"})
    if mode != "nearest":
        raise ctx.fail(f"mode {mode!r} is not supported (nearest or linear)")
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric"}
    values = scales.const
    if values is None:  # unknown scales: assume enlarging, the operator's purpose
        return ctx.emit("Resize", [x, None, scales], dict(attrs, nearest_mode="floor"))
    values = values.astype(np.float32)
    shrink = [i for i, s in enumerate(values) if s < 1]
    grow = [i for i, s in enumerate(values) if s >= 1]
    if not shrink or not grow:
        return ctx.emit("Resize", [x, None, scales],
                        dict(attrs, nearest_mode="ceil" if shrink else "floor"))
    # nearest resampling is separable: shrink the ceil-rounded axes, then the others
    first = ctx.add("Resize", x, None, ctx.const(values[shrink], T.float32),
                    axes=shrink, nearest_mode="ceil", **attrs)
    return ctx.emit("Resize", [first, None, ctx.const(values[grow], T.float32)],
                    dict(attrs, axes=grow, nearest_mode="floor"))


@onnx_op("Upsample", since=7)
def import_upsample_attr(ctx: ImportContext):
    scales = ctx.const(np.asarray(ctx.attrs["scales"], np.float32), T.float32)
    return _simple_nearest_resize(ctx, ctx.inputs[0], scales, ctx.attrs.get("mode", "nearest"))


@onnx_op("Upsample", since=9)
def import_upsample(ctx: ImportContext):
    return _simple_nearest_resize(ctx, ctx.inputs[0], ctx.inputs[1],
                                  ctx.attrs.get("mode", "nearest"))


@onnx_op("Resize", since=10)
def import_resize_10(ctx: ImportContext):
    return _simple_nearest_resize(ctx, ctx.inputs[0], ctx.inputs[1],
                                  ctx.attrs.get("mode", "nearest"))


def _drop_empty(value):
    return None if value is not None and value.type.numel == 0 else value


@onnx_op("Resize", since=11)
def import_resize_11(ctx: ImportContext):
    attrs = dict(ctx.attrs)
    if attrs.get("coordinate_transformation_mode") == "tf_half_pixel_for_nn":
        raise ctx.fail("coordinate_transformation_mode 'tf_half_pixel_for_nn' (removed in "
                       "opset 13) is not supported")
    inputs = [ctx.inputs[0]] + [_drop_empty(ctx.input(i)) for i in (1, 2, 3)]
    if attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize":
        inputs[1] = None  # roi only matters for tf_crop_and_resize
    return ctx.emit("Resize", inputs, attrs)


@onnx_op("Resize", since=18)
def import_resize_18(ctx: ImportContext):
    inputs = [ctx.inputs[0]] + [_drop_empty(ctx.input(i)) for i in (1, 2, 3)]
    if ctx.attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize":
        inputs[1] = None
    return ctx.emit("Resize", inputs, ctx.attrs)


_GRID_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


@onnx_op("GridSample", since=16)
def import_grid_sample_16(ctx: ImportContext):
    attrs = dict(ctx.attrs)
    mode = attrs.get("mode", "bilinear")
    if mode not in _GRID_MODES_16:
        raise ctx.fail(f"mode {mode!r} is not one of bilinear, nearest, bicubic")
    attrs["mode"] = _GRID_MODES_16[mode]
    return ctx.emit("GridSample", ctx.inputs, attrs)


direct("GridSample", since=20)
direct("AffineGrid", since=20)


@onnx_op("RoiAlign", since=10)
def import_roi_align_10(ctx: ImportContext):
    return ctx.emit("RoiAlign", ctx.inputs,
                    dict(ctx.attrs, coordinate_transformation_mode="output_half_pixel"))


direct("RoiAlign", since=16)
