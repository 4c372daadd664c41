"""ONNX importers for shape ops (Reshape, Transpose, Concat, Slice, ...) and Constant.

dnnc's shape ops follow the newest ONNX forms; older opsets' attributes (Squeeze/Unsqueeze
`axes` before 13, Split `split` before 13, Slice bounds before 10, Pad `pads`/`value` before 11)
become constant inputs here.
"""

from __future__ import annotations

import numpy as np

from ...ir import types as T
from ..onnx import ImportContext, direct, dtype_from_onnx, onnx_op


@onnx_op("Constant", since=1)
def import_constant(ctx: ImportContext):
    """Constant becomes a constant value, not a node."""
    attrs = ctx.attrs
    if "value" in attrs:
        array = attrs["value"]
    elif "value_float" in attrs:
        array = np.array(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        array = np.array(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        array = np.array(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        array = np.array(attrs["value_ints"], np.int64)
    elif "sparse_value" in attrs:
        array = np.asarray(attrs["sparse_value"])
    else:
        raise ctx.fail(f"has no supported value attribute (given {sorted(attrs)})")
    return ctx.const(array)


for _name, _since in (("Shape", 1), ("Size", 1), ("Transpose", 1), ("Flatten", 1),
                      ("DepthToSpace", 1), ("SpaceToDepth", 1), ("Concat", 4), ("Reshape", 5),
                      ("Tile", 6), ("Expand", 8), ("ConstantOfShape", 9), ("Slice", 10),
                      ("Pad", 11), ("Range", 11), ("Squeeze", 13), ("Unsqueeze", 13),
                      ("Trilu", 14), ("CenterCropPad", 18), ("Split", 18)):
    direct(_name, since=_since)


def _axes_const(ctx: ImportContext, key: str = "axes"):
    axes = ctx.attrs.get(key)
    return None if axes is None else ctx.const(axes, T.int64)


@onnx_op("Squeeze", since=1)
def import_squeeze_attr(ctx: ImportContext):
    """Before opset 13, axes was an attribute."""
    return ctx.emit("Squeeze", [ctx.inputs[0], _axes_const(ctx)])


@onnx_op("Unsqueeze", since=1)
def import_unsqueeze_attr(ctx: ImportContext):
    """Before opset 13, axes was a (required) attribute."""
    if "axes" not in ctx.attrs:
        raise ctx.fail("needs the axes attribute")
    return ctx.emit("Unsqueeze", [ctx.inputs[0], _axes_const(ctx)])


@onnx_op("Split", since=2)
def import_split_attr(ctx: ImportContext):
    """Before opset 13, split sizes were an attribute; without them the outputs split evenly."""
    sizes = _axes_const(ctx, "split")
    return _split(ctx, [ctx.inputs[0], sizes])


@onnx_op("Split", since=13)
def import_split_input(ctx: ImportContext):
    """Opsets 13 to 17: split sizes are an input; without it the outputs split evenly."""
    return _split(ctx, ctx.inputs[:2])


def _split(ctx: ImportContext, inputs):
    axis = ctx.attrs.get("axis", 0)
    if len(inputs) > 1 and inputs[1] is not None:
        return ctx.emit("Split", inputs, {"axis": axis})
    return ctx.emit("Split", inputs[:1], {"axis": axis, "num_outputs": ctx.num_outputs})


@onnx_op("Slice", since=1)
def import_slice_attr(ctx: ImportContext):
    """Before opset 10, starts, ends and axes were attributes and there were no steps."""
    for key in ("starts", "ends"):
        if key not in ctx.attrs:
            raise ctx.fail(f"needs the {key} attribute")
    return ctx.emit("Slice", [ctx.inputs[0], _axes_const(ctx, "starts"),
                              _axes_const(ctx, "ends"), _axes_const(ctx)])


@onnx_op("Pad", since=2)
def import_pad_attr(ctx: ImportContext):
    """Before opset 11, pads and the fill value were attributes."""
    x = ctx.inputs[0]
    if "pads" not in ctx.attrs:
        raise ctx.fail("needs the pads attribute")
    value = ctx.const(ctx.attrs.get("value", 0.0), x.dtype)
    return ctx.emit("Pad", [x, _axes_const(ctx, "pads"), value],
                    {"mode": ctx.attrs.get("mode", "constant")})


@onnx_op("Range", since=27)
def import_range(ctx: ImportContext):
    """Opset 27 added stash_type, the accumulation type of float16 and bfloat16 ranges."""
    stash = dtype_from_onnx(ctx.attrs.get("stash_type", 1), f"Range node {ctx.name!r}")
    return ctx.emit("Range", ctx.inputs, {"stash_type": stash})


@onnx_op("EyeLike", since=9)
def import_eye_like(ctx: ImportContext):
    attrs = {"k": ctx.attrs.get("k", 0)}
    if "dtype" in ctx.attrs:
        attrs["dtype"] = dtype_from_onnx(ctx.attrs["dtype"], f"EyeLike node {ctx.name!r}")
    return ctx.emit("EyeLike", ctx.inputs, attrs)
