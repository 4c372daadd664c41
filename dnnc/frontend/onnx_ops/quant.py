"""ONNX importers for quantization ops. Type-valued attributes (output_dtype, precision) become
DTypes; 0 means "not given"."""

from __future__ import annotations

from ..onnx import ImportContext, direct, dtype_from_onnx, onnx_op


def _dtype_attr(ctx: ImportContext, name: str):
    code = ctx.attrs.get(name, 0)
    return dtype_from_onnx(code, f"{ctx.op_type} node {ctx.name!r}") if code else None


@onnx_op("QuantizeLinear", since=10)
def import_quantize_linear(ctx: ImportContext):
    attrs = {"axis": ctx.attrs.get("axis", 1), "block_size": ctx.attrs.get("block_size", 0),
             "output_dtype": _dtype_attr(ctx, "output_dtype"),
             "saturate": ctx.attrs.get("saturate", 1),
             "precision": _dtype_attr(ctx, "precision")}
    return ctx.emit("QuantizeLinear", ctx.inputs, attrs)


@onnx_op("DequantizeLinear", since=10)
def import_dequantize_linear(ctx: ImportContext):
    attrs = {"axis": ctx.attrs.get("axis", 1), "block_size": ctx.attrs.get("block_size", 0),
             "output_dtype": _dtype_attr(ctx, "output_dtype")}
    return ctx.emit("DequantizeLinear", ctx.inputs, attrs)


direct("DynamicQuantizeLinear", since=11)
direct("QLinearMatMul", since=10)
direct("QLinearConv", since=10)
