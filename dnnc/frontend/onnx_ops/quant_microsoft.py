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
bit on random inputs). MatMulNBits (onnxruntime's weight-only quantizer,
MatMulNBitsQuantizer) is a blocked DequantizeLinear of its constant weight, unpacked here,
feeding a MatMul; GatherBlockQuantized (its quantized embeddings) a Gather of the codes,
scales and zero points, dequantized after. This module only translates (unpacking packed
codes is reading a format); it never evaluates.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The `bits`-bit codes of uint8 bytes along the last axis, low bits first:
    [..., n] -> [..., n * 8 // bits] (MatMulNBits' packing of B and of its zero points)."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], -1)


NBITS = (2, 4, 8)
"""MatMulNBits' bit widths dnnc imports: those onnxruntime's CPU kernel runs (whole codes a
byte; its schema names 2 to 8)."""


def _refuses_matmul_nbits(node: onnx.NodeProto,
                          constants: dict[str, TensorProto | None]) -> str | None:
    """A MatMulNBits dnnc cannot translate: another bit width, a weight prepacked for an
    execution provider, B or zero_points not constants (they are unpacked at import), a
    g_idx that reorders K (act-order; a deprecated input) or is not a constant."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input) + [""] * (6 - len(node.input))
    bits = attrs.get("bits", 4)
    if bits not in NBITS:
        return f"bits={bits}: only {', '.join(map(str, NBITS))} are supported"
    if attrs.get("weight_prepacked", 0):
        return (f"weight_prepacked={attrs['weight_prepacked']}: B is prepacked for an "
                f"execution provider")
    for i, what in ((1, "B"), (3, "zero_points")):
        if inputs[i] and constants.get(inputs[i]) is None:
            return f"{what} is not a constant"
    if inputs[4]:
        g_idx = constants.get(inputs[4])
        k, block = attrs.get("K", 0), attrs.get("block_size", 0)
        if g_idx is None or not block or not np.array_equal(
                numpy_helper.to_array(g_idx).ravel(), np.arange(k) // block):
            return "g_idx that reorders K (act-order) is not supported"
    return None


def _ints(ctx: ImportContext, values: list[int]) -> Value:
    return ctx.const(np.array(values, np.int64))


def _first(ctx: ImportContext, x: Value, k: int, axis: int) -> Value:
    """x's first k entries along `axis` (a blocked K's padding dropped)."""
    if x.type.shape[axis] == k:
        return x
    return ctx.add("Slice", x, _ints(ctx, [0]), _ints(ctx, [k]), _ints(ctx, [axis]))


def _rows_of_blocks(ctx: ImportContext, t: Value, block: int, k: int) -> Value:
    """[blocks, n] -> [k, n]: each block's row repeated `block` times, cut to k rows."""
    blocks, n = t.type.shape
    t = ctx.add("Reshape", t, _ints(ctx, [blocks, 1, n]))
    t = ctx.add("Expand", t, _ints(ctx, [blocks, block, n]))
    return _first(ctx, ctx.add("Reshape", t, _ints(ctx, [blocks * block, n])), k, 0)


def _int8_blocks(ctx: ImportContext, a: Value, block: int, k: int) -> Value:
    """A as onnxruntime's accuracy_level 4 reads it on x86 (MLAS's QuantizeARow_CompInt8):
    each row's blocks of `block` values along K quantized to int8 symmetrically, codes
    round_half_even(a * (127 / max|a|)) (0 in an all-zero block) times the scale
    max|a| / 127 -- the same product of A's and W's blocks that MLAS's int8 kernels sum."""
    rank, padded = a.type.rank, -(-k // block) * block

    def f32(value):
        return ctx.const(np.float32(value))

    if padded != k:
        a = ctx.add("Pad", a, _ints(ctx, [0, padded - k]), None, _ints(ctx, [rank - 1]))
    x = ctx.add("Reshape", a, _ints(ctx, [0] * (rank - 1) + [padded // block, block]))
    amax = ctx.add("ReduceMax", ctx.add("Abs", x), _ints(ctx, [rank]), keepdims=1)
    inverse = ctx.add("Where", ctx.add("Equal", amax, f32(0)), f32(0),
                      ctx.add("Div", f32(127), amax))
    x = ctx.add("Mul", ctx.add("Round", ctx.add("Mul", x, inverse)),
                ctx.add("Div", amax, f32(127)))
    return _first(ctx, ctx.add("Reshape", x, _ints(ctx, [0] * (rank - 1) + [padded])), k,
                  rank - 1)


@onnx_op("MatMulNBits", domain=MICROSOFT, refuses=_refuses_matmul_nbits)
def import_matmul_nbits(ctx: ImportContext):
    """A @ W (+ bias), W [K, N] of B's `bits`-bit codes q, blocked along K: (q - zero point)
    * scale, as onnxruntime's CPU kernel dequantizes B: zero points packed like B (uint8),
    8 / 128 / 2 where absent (the codes then less it, int8: the 4-bit ones int4 values),
    or float (then q * scale - scale * zero point, onnxruntime's order). A blocked
    DequantizeLinear of the unpacked constant codes feeds a MatMul, so fold_constants makes
    W float32 once. float16 / bfloat16 A is computed in float32 and rounded once, as
    onnxruntime's x86 kernel does. accuracy_level 4 (A may be int8) quantizes A's blocks
    as onnxruntime does (`_int8_blocks`); the other levels are float32 (which meets them)."""
    a, scales, zero_points, bias = ctx.input(0), ctx.input(2), ctx.input(3), ctx.input(5)
    try:
        k, n, block = (int(ctx.attrs[key]) for key in ("K", "N", "block_size"))
    except KeyError as missing:
        raise ctx.fail(f"attribute {missing} is required") from None
    bits = ctx.attrs.get("bits", 4)
    blocks = -(-k // block) if block > 0 else 0
    packed = ctx.value(1)
    if block <= 0 or block * bits % 8 or packed.dtype != np.uint8 or \
            packed.shape != (n, blocks, block * bits // 8):
        raise ctx.fail(f"expects B of uint8 [N, ceil(K / block_size), block_size * bits / 8] "
                       f"= [{n}, {blocks}, {block * bits // 8}] (K {k}, N {n}, block_size "
                       f"{block}, bits {bits}), given {packed.dtype} {list(packed.shape)}")
    if scales.type.numel != n * blocks:
        raise ctx.fail(f"expects scales of N * ceil(K / block_size) = {n * blocks} values, "
                       f"given {scales.type}")
    codes = np.ascontiguousarray(_unpack(packed, bits).reshape(n, -1)[:, :k].T)   # [K, N]
    scales_t = ctx.add("Transpose", ctx.add("Reshape", scales, _ints(ctx, [n, blocks])),
                       perm=[1, 0])
    f32 = T.float32
    dequantize = {"axis": 0, "block_size": block, "output_dtype": f32}
    zp = ctx.value(3)
    if zero_points is None:
        shifted = codes.astype(np.int16) - (1 << (bits - 1))
        w = ctx.add("DequantizeLinear", ctx.const(shifted.astype(np.int8)), scales_t,
                    None, **dequantize)
    elif zp.dtype == np.uint8:
        per_row = -(-blocks * bits // 8)
        if zp.size != n * per_row:
            raise ctx.fail(f"expects packed uint8 zero_points [N, ceil(ceil(K / block_size) "
                           f"* bits / 8)] = [{n}, {per_row}], given {list(zp.shape)}")
        zp_t = np.ascontiguousarray(_unpack(zp.reshape(n, per_row), bits)[:, :blocks].T)
        w = ctx.add("DequantizeLinear", ctx.const(codes), scales_t, ctx.const(zp_t),
                    **dequantize)
    else:
        if zp.size != n * blocks:
            raise ctx.fail(f"expects float zero_points [N, ceil(K / block_size)] = "
                           f"[{n}, {blocks}], given {list(zp.shape)}")
        zp_t = ctx.const(np.ascontiguousarray(zp.reshape(n, blocks).T).astype(np.float32))
        scale = _rows_of_blocks(ctx, ctx.add("Cast", scales_t, to=f32), block, k)
        w = ctx.add("Sub", ctx.add("Mul", ctx.const(codes.astype(np.float32)), scale),
                    ctx.add("Mul", scale, _rows_of_blocks(ctx, zp_t, block, k)))
    narrow = a.type.dtype != f32
    x = ctx.add("Cast", a, to=f32) if narrow else a
    if ctx.attrs.get("accuracy_level", 0) == 4:
        x = _int8_blocks(ctx, x, block, k)
    y = ctx.add("MatMul", x, w)
    if bias is not None:
        y = ctx.add("Add", y, ctx.add("Cast", bias, to=f32) if narrow else bias)
    return ctx.add("Cast", y, to=a.type.dtype) if narrow else y


def _refuses_gather_block_quantized(node: onnx.NodeProto,
                                    constants: dict[str, TensorProto | None]) -> str | None:
    """A GatherBlockQuantized dnnc cannot translate: data or zero points not constants
    (unpacked at import), float8 / float4 data, another bit width, or the gather axis the
    quantized one."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input) + [""] * (4 - len(node.input))
    data = constants.get(inputs[0])
    if data is None:
        return "data is not a constant"
    if inputs[3] and constants.get(inputs[3]) is None:
        return "zero_points is not a constant"
    if data.data_type not in (TensorProto.INT4, TensorProto.UINT4, TensorProto.UINT8):
        return f"{TensorProto.DataType.Name(data.data_type)} data (int4, uint4, uint8 are)"
    bits = attrs.get("bits", 4)
    if bits not in (NBITS if data.data_type == TensorProto.UINT8 else (4,)):
        return f"bits={bits} of {TensorProto.DataType.Name(data.data_type)} data"
    rank = len(data.dims)
    if rank and attrs.get("gather_axis", 0) % rank == attrs.get("quantize_axis", 1) % rank:
        return "gather_axis equal to quantize_axis is not supported"
    return None


@onnx_op("GatherBlockQuantized", domain=MICROSOFT, refuses=_refuses_gather_block_quantized)
def import_gather_block_quantized(ctx: ImportContext):
    """Gather of data quantized in blocks along `quantize_axis` (MatMulNBitsQuantizer's
    embeddings), as onnxruntime's CPU kernel computes it: float32((q - zero point) * scale),
    in the scales' type. The codes (int4 / uint4, or uint8 of `bits`-bit codes packed along
    the last axis) are gathered first, with their scales and zero points, and dequantized
    after (a blocked DequantizeLinear): the table stays one byte a value. Zero points absent:
    0 for int4 / uint4, 2^(bits - 1) for uint8 (taken off the codes, int8). An index out of
    range is an InputError here (onnxruntime's kernel gives zeros)."""
    indices, scales = ctx.input(1), ctx.input(2)
    codes = ctx.value(0)
    rank = codes.ndim
    bits = ctx.attrs.get("bits", 4)
    block = int(ctx.attrs.get("block_size", 128))
    gather_axis = ctx.attrs.get("gather_axis", 0) % rank
    quantize_axis = ctx.attrs.get("quantize_axis", 1) % rank
    uint8 = ctx.narrow(0) is None   # (else int4 / uint4, one value a byte already)
    if uint8 and (gather_axis != 0 or quantize_axis != rank - 1):
        raise ctx.fail("uint8 data is gathered along axis 0 and quantized along its last")
    if uint8 and bits < 8:
        codes = _unpack(codes, bits)
    if block <= 0 or scales.type.rank != rank or scales.type.shape[quantize_axis] != \
            -(-codes.shape[quantize_axis] // block):
        raise ctx.fail(f"expects scales of data's rank with ceil({codes.shape[quantize_axis]} "
                       f"/ block_size {block}) blocks along axis {quantize_axis}, given "
                       f"{scales.type}")
    zp = ctx.value(3)
    if zp is not None and uint8 and bits < 8:
        zp = _unpack(zp, bits)[..., :scales.type.shape[-1]]
    if zp is None and uint8:   # the default 2^(bits - 1), taken off the codes
        codes = (codes.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)

    def gather(v: Value | None) -> Value | None:
        return None if v is None else ctx.add("Gather", v, indices, axis=gather_axis)

    axis = quantize_axis if quantize_axis < gather_axis else \
        quantize_axis + indices.type.rank - 1
    return ctx.add("DequantizeLinear", gather(ctx.const(codes)), gather(scales),
                   gather(None if zp is None else ctx.const(np.ascontiguousarray(zp))),
                   axis=axis, block_size=block, output_dtype=scales.type.dtype)
