"""ONNX importers for signal ops.

DFT-17 took `axis` as an attribute (default 1); from opset 20 it is an optional input (default
-2), dnnc's form. Window and mel generators name their element type by ONNX code.
"""

from __future__ import annotations

from ...ir import types as T
from ..onnx import ImportContext, direct, dtype_from_onnx, onnx_op


@onnx_op("DFT", since=17)
def import_dft_17(ctx: ImportContext):
    attrs = dict(ctx.attrs)
    axis = ctx.const(attrs.pop("axis", 1), T.int64)
    return ctx.emit("DFT", [ctx.inputs[0], ctx.input(1), axis], attrs)


direct("DFT", since=20)
direct("STFT", since=17)


def _output_datatype(ctx: ImportContext) -> dict:
    attrs = dict(ctx.attrs)
    code = attrs.get("output_datatype", 1)  # 1 = FLOAT
    attrs["output_datatype"] = dtype_from_onnx(code, f"{ctx.op_type} node {ctx.name!r}")
    return attrs


def import_generator(ctx: ImportContext):
    return ctx.emit(ctx.op_type, ctx.inputs, _output_datatype(ctx))


for _name in ("HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"):
    onnx_op(_name, since=17)(import_generator)
