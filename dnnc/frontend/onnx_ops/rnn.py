"""ONNX importers for RNN, LSTM and GRU.

Their meaning is the same in every opset (7 added nothing that changes results; 14 added
`layout`, whose default keeps the old form; 22 added bfloat16). Before opset 7 the ops also had
`output_sequence`, which only said whether the optional Y output is produced: dropped here.
"""

from __future__ import annotations

from ..onnx import ImportContext, onnx_op


def _import_recurrent(ctx: ImportContext):
    attrs = {k: v for k, v in ctx.attrs.items() if k != "output_sequence"}
    return ctx.emit(ctx.op_type, ctx.inputs, attrs)


for _name in ("RNN", "LSTM", "GRU"):
    onnx_op(_name, since=1)(_import_recurrent)
