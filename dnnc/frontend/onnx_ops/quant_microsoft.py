"""ONNX importers for the com.microsoft quantized ops onnxruntime's quantizer writes
(quantize_static in the operator format: QGemm, QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearSoftmax, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearConcat; quantize_dynamic of a file its transformer optimizer fused: QAttention) and
the ones its graph optimizer fuses into the files it saves (MatMulIntegerToFloat, DynamicQuantizeMatMul),
with onnxruntime's contrib-op semantics.

Each is the chain of default-domain ops it abbreviates: dequantize the integer inputs
(DequantizeLinear), the float op, quantize the result (QuantizeLinear) -- so fuse_quantized
takes the products among them (QGemm as Q(Gemm(DQ, DQ, DQ(bias))), the others as
MatMulInteger with its Cast and Mul) and the registry's references are their meaning --
except QLinearAdd, dnnc's op of MLAS's arithmetic (`ir/ops/quant.py`): its DQ-Add-Q chain
was one unit off on 8 values in a million, and a BERT of QLinearAdds at every residual and
bias drifted by 3 units of its output through two layers. QLinearMul of constant scales is
MLAS's own formula too (the exact integer product times one multiplier s_a s_b / s_c).
Where onnxruntime's kernel rounds otherwise (QLinearSoftmax and QLinearSigmoid through
tables), a quantized value may differ by one unit on a tie: issue 33's accuracy contract.
QLinearAveragePool adds y's zero point before rounding, as onnxruntime's kernel does (bit for
bit on random inputs). This module only translates; it never evaluates.
"""

from __future__ import annotations

import numpy as np

from ...ir import types as T
from ...ir.graph import Value
from ..onnx import MICROSOFT, ImportContext, direct, onnx_op


def _dq(ctx: ImportContext, x: Value, scale: Value, zero_point: Value | None,
        axis: int = 1) -> Value:
    return ctx.add("DequantizeLinear", x, scale, zero_point, axis=axis)


def _q(ctx: ImportContext, y: Value, scale: Value, zero_point: Value | None,
       like: Value) -> Value:
    """y quantized to `scale` and `zero_point`, of `like`'s type where the zero point is
    absent (onnxruntime's: the output has its input's type)."""
    return ctx.add("QuantizeLinear", y, scale, zero_point,
                   output_dtype=None if zero_point is not None else like.type.dtype)


def _binary(op: str):
    def importer(ctx: ImportContext):
        a, sa, za, b, sb, zb, sc = (ctx.input(k) for k in range(7))
        zc = ctx.input(7)
        y = ctx.add(op, _dq(ctx, a, sa, za), _dq(ctx, b, sb, zb))
        return _q(ctx, y, sc, zc, a)
    return importer


direct("QLinearAdd", domain=MICROSOFT)   # (its own op: MLAS's fused multiply-adds)


@onnx_op("QLinearMul", domain=MICROSOFT)
def import_qlinear_mul(ctx: ImportContext):
    """Of constant scales, as MLAS: the exact product (a - za)(b - zb) in float32 times
    the multiplier s_a s_b / s_c, rounded, plus y's zero point; else Q(DQ(a) DQ(b))."""
    a, sa, za, b, sb, zb, sc = (ctx.input(k) for k in range(7))
    zc = ctx.input(7)
    scales = [ctx.value(k) for k in (1, 4, 6)]
    if any(v is None for v in scales):
        return _binary("Mul")(ctx)
    one = ctx.const(np.float32(1.0))
    multiplier = ctx.const(np.float32(scales[0].reshape(())) * np.float32(scales[1].reshape(()))
                           / np.float32(scales[2].reshape(())))
    y = ctx.add("Mul", ctx.add("Mul", _dq(ctx, a, one, za), _dq(ctx, b, one, zb)), multiplier)
    return _q(ctx, y, one, zc, a)


def _unary(op: str, attrs):
    def importer(ctx: ImportContext):
        x, sx, zx, sy, zy = (ctx.input(k) for k in range(5))
        return _q(ctx, ctx.add(op, _dq(ctx, x, sx, zx), **attrs(ctx)), sy, zy, x)
    return importer


onnx_op("QLinearSigmoid", domain=MICROSOFT)(_unary("Sigmoid", lambda ctx: {}))
onnx_op("QLinearLeakyRelu", domain=MICROSOFT)(_unary(
    "LeakyRelu", lambda ctx: {"alpha": ctx.attrs.get("alpha", 0.01)}))
# `opset`: the Softmax it replaced (before 13: rows of the flattened 2-D view)
onnx_op("QLinearSoftmax", domain=MICROSOFT)(_unary("Softmax", lambda ctx: {
    "axis": ctx.attrs.get("axis", -1), "coerce_2d": int(ctx.attrs.get("opset", 13) < 13)}))


def _channels_first(ctx: ImportContext) -> None:
    if ctx.attrs.get("channels_last", 0):
        raise ctx.fail("channels_last (NHWC) pooling is not supported")


@onnx_op("QLinearGlobalAveragePool", domain=MICROSOFT)
def import_qlinear_global_average_pool(ctx: ImportContext):
    _channels_first(ctx)
    x, sx, zx, sy, zy = (ctx.input(k) for k in range(5))
    return _q(ctx, ctx.add("GlobalAveragePool", _dq(ctx, x, sx, zx)), sy, zy, x)


@onnx_op("QLinearAveragePool", domain=MICROSOFT)
def import_qlinear_average_pool(ctx: ImportContext):
    """AveragePool of the dequantized x, quantized as onnxruntime's kernel does: the zero
    point added before rounding, round(mean / y_scale + y_zero_point) in float32 (ONNX's
    QuantizeLinear adds it after; the two part on about one value in a thousand)."""
    _channels_first(ctx)
    x, sx, zx, sy, zy = (ctx.input(k) for k in range(5))
    attrs = {k: v for k, v in ctx.attrs.items() if k != "channels_last"}
    y = ctx.add("Div", ctx.add("AveragePool", _dq(ctx, x, sx, zx), **attrs), sy)
    if zy is not None:
        y = ctx.add("Add", y, ctx.add("Cast", zy, to=T.float32))
    zero = ctx.const(np.zeros((), x.type.dtype.np))
    return _q(ctx, y, ctx.const(np.float32(1.0)), zero, x)


@onnx_op("QLinearConcat", domain=MICROSOFT)
def import_qlinear_concat(ctx: ImportContext):
    sy, zy = ctx.input(0), ctx.input(1)
    parts = ctx.inputs[2:]
    if len(parts) % 3 or not parts:
        raise ctx.fail(f"expects Y_scale, Y_zero_point and (X, X_scale, X_zero_point) "
                       f"triplets, given {len(ctx.inputs)} inputs")
    xs = [_dq(ctx, *parts[k:k + 3]) for k in range(0, len(parts), 3)]
    return _q(ctx, ctx.add("Concat", *xs, axis=ctx.attrs["axis"]), sy, zy, parts[0])


def _product_scale(ctx: ImportContext, a_scale: Value, b_scale: Value) -> Value:
    """a_scale * b_scale: a constant where both are, else a Mul."""
    if a_scale.const is not None and b_scale.const is not None:
        return ctx.const((np.float32(a_scale.const.reshape(())) *
                          b_scale.const.astype(np.float32)).astype(np.float32))
    return ctx.add("Mul", a_scale, b_scale)


@onnx_op("QGemm", domain=MICROSOFT)
def import_qgemm(ctx: ImportContext):
    """Y = alpha A' B' + C on the dequantized operands (C: int32 of scale a_scale * b_scale
    and zero point 0), quantized to y_scale / y_zero_point where given, else float32."""
    a, sa, za, b, sb, zb = (ctx.input(k) for k in range(6))
    c, sy, zy = ctx.input(6), ctx.input(7), ctx.input(8)
    trans_b = ctx.attrs.get("transB", 0)
    inputs = [_dq(ctx, a, sa, za), _dq(ctx, b, sb, zb, axis=0 if trans_b else 1)]
    if c is not None:
        inputs.append(_dq(ctx, c, _product_scale(ctx, sa, sb), None, axis=c.type.rank - 1))
    y = ctx.add("Gemm", *inputs, alpha=ctx.attrs.get("alpha", 1.0), beta=1.0,
                transA=ctx.attrs.get("transA", 0), transB=trans_b)
    return y if sy is None else _q(ctx, y, sy, zy, a)


def _integer_to_float(ctx: ImportContext, a, b, a_scale, b_scale, za, zb, bias) -> Value:
    """float32(MatMulInteger(a, b, za, zb)) * (a_scale * b_scale) [+ bias]."""
    acc = ctx.add("MatMulInteger", a, b, za, zb)
    y = ctx.add("Mul", ctx.add("Cast", acc, to=T.float32), _product_scale(ctx, a_scale, b_scale))
    return y if bias is None else ctx.add("Add", y, bias)


@onnx_op("MatMulIntegerToFloat", domain=MICROSOFT)
def import_matmul_integer_to_float(ctx: ImportContext):
    a, b, sa, sb, za, zb, bias = (ctx.input(k) for k in range(7))
    return _integer_to_float(ctx, a, b, sa, sb, za, zb, bias)


@onnx_op("DynamicQuantizeMatMul", domain=MICROSOFT)
def import_dynamic_quantize_matmul(ctx: ImportContext):
    """MatMulIntegerToFloat of A's DynamicQuantizeLinear and B."""
    a, b, sb, zb, bias = (ctx.input(k) for k in range(5))
    aq, sa, za = ctx.emit("DynamicQuantizeLinear", [a], {}, num_outputs=3)
    return _integer_to_float(ctx, aq, b, sa, sb, za, zb, bias)


def _attention_mask(ctx: ImportContext, mask: Value, seq: int, fill: float) -> Value:
    """QAttention's int32 mask_index as Attention's additive float mask: 0 where a key is
    attended, `fill` (mask_filter_value) where not, as onnxruntime adds it. [batch]: each
    row's key count (right padding); [batch, keys]: 1 / 0 per key; [batch, seq, keys]: per
    query too."""
    batch = mask.type.shape[0]
    if mask.type.rank == 1:
        keys = ctx.const(np.arange(seq, dtype=np.int32).reshape(1, seq))
        lengths = ctx.add("Reshape", mask, ctx.const(np.array([batch, 1], np.int64)))
        attended = ctx.add("Less", keys, lengths)
        shape = [batch, 1, 1, seq]
    elif mask.type.rank in (2, 3):
        attended = ctx.add("Not", ctx.add("Equal", mask, ctx.const(np.int32(0))))
        shape = [batch, 1, 1, seq] if mask.type.rank == 2 else [batch, 1, seq, seq]
    else:
        raise ctx.fail(f"mask_index of rank {mask.type.rank} is not supported (only [batch], "
                       f"[batch, keys] and [batch, seq, keys])")
    additive = ctx.add("Where", attended, ctx.const(np.float32(0.0)),
                       ctx.const(np.float32(fill)))
    return ctx.add("Reshape", additive, ctx.const(np.array(shape, np.int64)))


@onnx_op("QAttention", domain=MICROSOFT)
def import_qattention(ctx: ImportContext):
    """Self-attention of a quantized input: Q, K and V are the thirds of
    MatMulInteger(input, weight) * (input_scale * weight_scale) + bias (fuse_quantized's
    integer product), then Attention over `num_heads` heads (scale 1/sqrt(head size) unless
    given; `unidirectional`: causal), the mask_index as an additive mask_filter_value. The
    past / present cache and rotary embeddings are not supported."""
    x, w, bias, sx, sw, mask, zx, zw, past = (ctx.input(k) for k in range(9))
    if past is not None or ctx.num_outputs > 1:
        raise ctx.fail("the past / present key-value cache is not supported")
    if ctx.attrs.get("do_rotary", 0):
        raise ctx.fail("do_rotary is not supported")
    if x.type.rank != 3 or w.type.rank != 2 or not isinstance(w.type.shape[1], int) or \
            w.type.shape[1] % 3:
        raise ctx.fail(f"expects input [batch, seq, in] and weight [in, 3 * hidden], given "
                       f"{x.type} and {w.type}")
    hidden, heads = w.type.shape[1] // 3, ctx.attrs["num_heads"]
    qkv = _integer_to_float(ctx, x, w, sx, sw, zx, zw, bias)
    q, k, v = ctx.emit("Split", [qkv, ctx.const(np.array([hidden] * 3, np.int64))],
                       {"axis": -1}, num_outputs=3)
    inputs = [q, k, v]
    if mask is not None:
        inputs.append(_attention_mask(ctx, mask, x.type.shape[1],
                                      ctx.attrs.get("mask_filter_value", -10000.0)))
    scale = ctx.attrs.get("scale", 0.0)
    return ctx.add("Attention", *inputs, q_num_heads=heads, kv_num_heads=heads,
                   is_causal=int(ctx.attrs.get("unidirectional", 0)),
                   scale=float(scale) if scale else None)
