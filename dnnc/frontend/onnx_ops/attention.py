"""ONNX importers for attention ops. Attention took its current meaning in opset 23 (24 added
`nonpad_kv_seqlen`, 25 the sliding-window attributes and forbade head counts on 4-D inputs,
which 23 and 24 ignored); `softmax_precision` arrives as an ONNX type code."""

from __future__ import annotations

from ..onnx import ImportContext, direct, dtype_from_onnx, onnx_op


@onnx_op("Attention", since=23)
def import_attention(ctx: ImportContext):
    attrs = dict(ctx.attrs)
    if "softmax_precision" in attrs:
        attrs["softmax_precision"] = dtype_from_onnx(attrs["softmax_precision"],
                                                     f"Attention node {ctx.name!r}")
    if ctx.opset < 25 and ctx.inputs[0] is not None and ctx.inputs[0].type.rank == 4:
        attrs.pop("q_num_heads", None)
        attrs.pop("kv_num_heads", None)
    return ctx.emit("Attention", ctx.inputs, attrs)


direct("RotaryEmbedding", since=23)
direct("SwiGLU", since=28)
