"""ONNX importers for reductions, arg-extremes, scans and the softmax family.

Reduce* took `axes` as an input in opset 18 (ReduceSum in 13); before, the attribute becomes a
constant input. Softmax, LogSoftmax and Hardmax before opset 13 coerced the input to 2-D at
`axis` (default 1): dnnc's `coerce_2d` attribute keeps that meaning without extra reshapes.
"""

from __future__ import annotations

from ...ir import types as T
from ..onnx import ImportContext, direct, onnx_op

_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
               "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def import_reduce_axes_attr(ctx: ImportContext):
    """Opsets 1 to 17 (ReduceSum: 1 to 12): axes is an attribute, absent for all axes."""
    axes = ctx.attrs.get("axes")
    inputs = [ctx.inputs[0]]
    if axes is not None:
        if len(axes) == 0:  # an empty list meant "all axes" then; noop did not exist
            axes = None
        else:
            inputs.append(ctx.const(axes, T.int64))
    return ctx.emit(ctx.op_type, inputs, {"keepdims": ctx.attrs.get("keepdims", 1)})


for _name in _REDUCTIONS:
    onnx_op(_name, since=1)(import_reduce_axes_attr)
    direct(_name, since=13 if _name == "ReduceSum" else 18)

for _name in ("ArgMax", "ArgMin"):
    direct(_name, since=1)  # 11 allowed negative axes, 12 added select_last_index

direct("CumSum", since=11)
direct("CumProd", since=26)


def import_softmax_2d(ctx: ImportContext):
    """Opsets 1 to 12: the input is a matrix [prod(:axis), prod(axis:)], axis 1 by default."""
    return ctx.emit(ctx.op_type, ctx.inputs[:1], {"axis": ctx.attrs.get("axis", 1),
                                                  "coerce_2d": 1})


for _name in ("Softmax", "LogSoftmax", "Hardmax"):
    onnx_op(_name, since=1)(import_softmax_2d)
    direct(_name, since=13)
