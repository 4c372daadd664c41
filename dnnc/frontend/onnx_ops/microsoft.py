"""ONNX importers for the float com.microsoft ops onnxruntime's transformer optimizer
(`onnxruntime.transformers.optimizer`) writes into the files users then quantize with
quantize_dynamic: SkipLayerNormalization, BiasGelu, Gelu and FastGelu, each as the
default-domain ops it fuses, with onnxruntime's contrib-op semantics. (The quantized
com.microsoft ops are in `quant_microsoft.py`.) This module only translates.
"""

from __future__ import annotations

from ..onnx import MICROSOFT, ImportContext, onnx_op


@onnx_op("SkipLayerNormalization", domain=MICROSOFT)
def import_skip_layer_norm(ctx: ImportContext):
    """LayerNormalization over the last axis of input + skip (+ bias); outputs y, the mean,
    the inverse standard deviation and the sum input + skip + bias."""
    x, skip, gamma, beta, bias = (ctx.input(k) for k in range(5))
    total = ctx.add("Add", x, skip)
    if bias is not None:
        total = ctx.add("Add", total, bias)
    y, mean, inv_std = ctx.emit("LayerNormalization", [total, gamma, beta],
                                {"axis": -1, "epsilon": ctx.attrs.get("epsilon", 1e-12)},
                                num_outputs=3)
    return [y, mean, inv_std, total][:ctx.num_outputs]


@onnx_op("Gelu", domain=MICROSOFT)
def import_gelu(ctx: ImportContext):
    return ctx.add("Gelu", ctx.input(0))


@onnx_op("BiasGelu", domain=MICROSOFT)
def import_bias_gelu(ctx: ImportContext):
    """Gelu(A + B), erf's form."""
    return ctx.add("Gelu", ctx.add("Add", ctx.input(0), ctx.input(1)))


@onnx_op("FastGelu", domain=MICROSOFT)
def import_fast_gelu(ctx: ImportContext):
    """Gelu's tanh approximation of X (+ bias)."""
    x = ctx.input(0) if ctx.input(1) is None else ctx.add("Add", ctx.input(0), ctx.input(1))
    return ctx.add("Gelu", x, approximate="tanh")
