"""ONNX importers for elementwise ops: most map one-to-one (`direct`), from the opset where the
ONNX op took its current meaning (unary ops lost `consumed_inputs` in 6; binary ops gained
NumPy broadcasting in 7)."""

from __future__ import annotations

from onnx import TensorProto

from ...ir import types as T
from ..onnx import NARROW_FROM_ONNX, ImportContext, direct, dtype_from_onnx, onnx_op

for _name in ("Abs", "Neg", "Reciprocal", "Sqrt", "Exp", "Log", "Ceil", "Floor", "Relu",
              "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "PRelu"):
    direct(_name, since=6)
for _name in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "And", "Or",
              "Xor", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan"):
    direct(_name, since=7)
for _name in ("Sum", "Mean", "Max", "Min"):
    direct(_name, since=6)
for _name, _since in (("Not", 1), ("Identity", 1), ("Softplus", 1), ("Softsign", 1),
                      ("Sinh", 9), ("Cosh", 9), ("Asinh", 9), ("Acosh", 9), ("Atanh", 9),
                      ("Sign", 9), ("Erf", 9), ("IsNaN", 9), ("Shrink", 9), ("Where", 9),
                      ("IsInf", 10), ("Mod", 10), ("ThresholdedRelu", 10), ("Round", 11),
                      ("BitShift", 11), ("Celu", 12), ("LessOrEqual", 12),
                      ("GreaterOrEqual", 12), ("HardSwish", 14), ("Mish", 18),
                      ("BitwiseAnd", 18), ("BitwiseOr", 18), ("BitwiseXor", 18),
                      ("BitwiseNot", 18), ("Gelu", 20), ("Swish", 24)):
    direct(_name, since=_since)


@onnx_op("Cast", since=6)
def import_cast(ctx: ImportContext):
    # `saturate` only concerns float8 targets, which dnnc does not support
    code = ctx.attrs["to"]
    if code in NARROW_FROM_ONNX:
        return _cast_to_4_bits(ctx, code)
    to = dtype_from_onnx(code, f"Cast node {ctx.name!r}")
    return ctx.emit("Cast", ctx.inputs[:1], {"to": to})


@onnx_op("CastLike", since=15)
def import_cast_like(ctx: ImportContext):
    if ctx.narrow(1):
        return _cast_to_4_bits(ctx, ctx.narrow(1))
    return ctx.emit("Cast", ctx.inputs[:1], {"to": ctx.inputs[1].dtype})


def _cast_to_4_bits(ctx: ImportContext, code: int):
    """A Cast to int4 / uint4 as the reference casts (ml_dtypes: truncated toward zero, then
    wrapped to 4 bits, as to any integer type): through int32, the low 4 bits kept (int4:
    ((v + 8) & 15) - 8, their two's complement value), held as int8 / uint8."""
    v = ctx.add("Cast", ctx.inputs[0], to=T.int32)
    if code == TensorProto.INT4:
        v = ctx.add("Add", v, ctx.const(8, T.int32))
    v = ctx.add("BitwiseAnd", v, ctx.const(15, T.int32))
    if code == TensorProto.INT4:
        v = ctx.add("Sub", v, ctx.const(8, T.int32))
    ctx.output_narrow = code
    return ctx.emit("Cast", [v], {"to": NARROW_FROM_ONNX[code]})


@onnx_op("Clip", since=6)
def import_clip_attrs(ctx: ImportContext):
    x = ctx.inputs[0]
    lo = ctx.const(ctx.attrs.get("min", -3.4028234663852886e38), x.dtype)
    hi = ctx.const(ctx.attrs.get("max", 3.4028234663852886e38), x.dtype)
    return ctx.emit("Clip", [x, lo, hi])


direct("Clip", since=11)


@onnx_op("BitCast", since=26)
def import_bitcast(ctx: ImportContext):
    to = dtype_from_onnx(ctx.attrs["to"], f"BitCast node {ctx.name!r}")
    return ctx.emit("BitCast", ctx.inputs[:1], {"to": to})
