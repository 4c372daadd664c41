"""ONNX importers for indexing ops. Most map one-to-one from the opset they appeared in; older
forms are translated: TopK's `k` attribute (before 10) becomes the K input, and the deprecated
Scatter (9-10) is ScatterElements."""

from __future__ import annotations

from ...ir import types as T
from ..onnx import ImportContext, direct, onnx_op

# GatherND's batch_dims (12) and ScatterElements/ScatterND's reduction (16, max/min in 18) are
# attributes whose defaults give the older meaning, so one direct importer covers every opset.
for _name, _since in (("Gather", 1), ("GatherElements", 11), ("GatherND", 11),
                      ("ScatterElements", 11), ("ScatterND", 11), ("Compress", 9),
                      ("NonZero", 9), ("OneHot", 9), ("ReverseSequence", 10), ("Unique", 11),
                      ("NonMaxSuppression", 10), ("TensorScatter", 24)):
    direct(_name, since=_since)
direct("Scatter", since=9, op="ScatterElements")


@onnx_op("TopK", since=1)
def import_topk_attr(ctx: ImportContext):
    k = ctx.const([ctx.attrs["k"]], T.int64)
    return ctx.emit("TopK", [ctx.inputs[0], k], {"axis": ctx.attrs.get("axis", -1)})


direct("TopK", since=10)
