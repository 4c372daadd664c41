"""ONNX importers for quantization ops. Type-valued attributes (output_dtype, precision) become
DTypes; 0 means "not given". A 4-bit QuantizeLinear (int4 / uint4 zero point or output_dtype)
becomes one to int8 / uint8 with `bits` 4, its saturation range (`NARROW_FROM_ONNX`)."""

from __future__ import annotations

from ..onnx import (MICROSOFT, NARROW_FROM_ONNX, ONNX_FROM_DTYPE, ImportContext, direct,
                    dtype_from_onnx, onnx_op)


def _dtype_attr(ctx: ImportContext, name: str, narrow: bool = False):
    code = ctx.attrs.get(name, 0)
    return dtype_from_onnx(code, f"{ctx.op_type} node {ctx.name!r}", narrow) if code else None


def _onnx_type(ctx: ImportContext, i: int) -> int:
    """Input i's ONNX element type (4-bit ones told apart from the 8-bit ones holding them)."""
    return ctx.narrow(i) or ONNX_FROM_DTYPE[ctx.inputs[i].dtype.name]


@onnx_op("QuantizeLinear", since=10)
def import_quantize_linear(ctx: ImportContext):
    code = ctx.attrs.get("output_dtype", 0)
    if ctx.input(2) is not None:
        if code and code != _onnx_type(ctx, 2) and (code in NARROW_FROM_ONNX or ctx.narrow(2)):
            raise ctx.fail("output_dtype differs from the zero point's type")
        code = ctx.narrow(2) or code
    ctx.output_narrow = code if code in NARROW_FROM_ONNX else None
    attrs = {"axis": ctx.attrs.get("axis", 1), "block_size": ctx.attrs.get("block_size", 0),
             "output_dtype": _dtype_attr(ctx, "output_dtype", narrow=True),
             "saturate": ctx.attrs.get("saturate", 1),
             "precision": _dtype_attr(ctx, "precision"), "bits": 4 if ctx.output_narrow else 0}
    return ctx.emit("QuantizeLinear", ctx.inputs, attrs)


@onnx_op("DequantizeLinear", since=10)
def import_dequantize_linear(ctx: ImportContext):
    if ctx.input(2) is not None and ctx.narrow(0) != ctx.narrow(2):
        raise ctx.fail("x and its zero point are of one type (4-bit or not)")
    attrs = {"axis": ctx.attrs.get("axis", 1), "block_size": ctx.attrs.get("block_size", 0),
             "output_dtype": _dtype_attr(ctx, "output_dtype")}
    return ctx.emit("DequantizeLinear", ctx.inputs, attrs)


# onnxruntime's own QuantizeLinear / DequantizeLinear: opset 13's (per tensor or per `axis`),
# int4 / uint4 included; its quantizer writes them for 4-bit types below opset 21
onnx_op("QuantizeLinear", domain=MICROSOFT)(import_quantize_linear)
onnx_op("DequantizeLinear", domain=MICROSOFT)(import_dequantize_linear)

direct("DynamicQuantizeLinear", since=11)
direct("QLinearMatMul", since=10)
direct("QLinearConv", since=10)
