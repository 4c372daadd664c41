"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, com.microsoft's QLinearAdd (MLAS's arithmetic: a fused multiply-add chain), and
QuantizedAdd (a QDQ file's Q(DQ(a) + DQ(b)) as one op, the chain's float32 arithmetic).

Integer types only (int8, uint8, int16, uint16; the float8 family is outside dnnc's dtypes
and rejected by the frontend). ONNX's int4 / uint4 are held as int8 / uint8 values within the
4-bit range (`frontend/onnx.py`'s NARROW_FROM_ONNX): QuantizeLinear's `bits` (4; 0: the
output type's own width) saturates to [-8, 7] / [0, 15]; every other op reads them as the
8-bit values they are. Scales and zero points are scalars, per-axis vectors, or (since opset
21) blocks along `axis`.

Compute rules mirror the references' arithmetic types exactly (float32 quotients, rint as
round-half-to-even, saturation by clamping) since a one-off rounding changes a quantized value.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..compute import (
    NoCompute, Tensor, broadcast_load, compute, reduce_axis, reduce_max, reduce_min, reduce_sum)
from ..loop import Cast, Const, Expr, Select, call, const, eq, maximum, minimum
from .index_exprs import unravel
from .infer import check_dtype, normalize_axis
from .linalg import matmul_operands, widen
from .conv import conv_flops, conv_sum, scalar_or_per_channel
from ..flops import Count, has_input, numel
from .registry import Pattern, register_op

QUANT_DTYPES = (T.uint8, T.int8, T.uint16, T.int16)


def expand_param(param: np.ndarray, shape: tuple, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point broadcastable against `shape`: scalar, per-axis or blocked."""
    if param.size == 1:
        return param.reshape(())
    if block_size:
        full = np.repeat(param, block_size, axis=axis)
        return np.take(full, np.arange(shape[axis]), axis=axis)
    dims = [1] * len(shape)
    dims[axis] = param.size
    return param.reshape(dims)


def param_at(p: Tensor, idx: tuple, axis: int, block_size: int) -> Expr:
    """A scale or zero point read at x's index `idx`, as `expand_param` broadcasts it."""
    if all(d == const(1) for d in p.shape):
        return p[(0,) * p.ndim] if p.ndim else p[()]
    if block_size:
        return p[tuple(i // block_size if k == axis else i for k, i in enumerate(idx))]
    return p[idx[axis]]


def quant_range(dtype: T.DType, bits: int = 0) -> tuple[int, int]:
    """The integers a quantization to `dtype` saturates to: its own range, or that of `bits`
    (a 4-bit type held in an 8-bit one) of its signedness."""
    if not bits:
        info = np.iinfo(dtype.np)
        return int(info.min), int(info.max)
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.kind == "i" else \
        (0, (1 << bits) - 1)


def _saturate(q: Expr, dtype: T.DType, bits: int = 0) -> Expr:
    """q (float) clamped to dtype's range (of `bits`: `quant_range`) and converted, as np.clip
    then astype."""
    lo, hi = quant_range(dtype, bits)
    return Cast(dtype, minimum(maximum(q, const(lo, q.dtype)), const(hi, q.dtype)))


MAGIC, MAGIC_BITS = 12582912.0, 0x4B400000
"""1.5 * 2**23 and its float32 bits: x + MAGIC holds integral x (|x| <= 2**22) in its low
mantissa bits."""


def rounded_saturated(x: Expr, zero_point: Expr, dtype: T.DType, lo: int, hi: int) -> Expr:
    """Cast(dtype, clamp(rint(x) + zero_point, lo, hi)) of float32 x and an integral float32
    zero point (lo, hi: integers of dtype's range), without a rounding or conversion
    instruction (a GPU's conversion pipe issues 16 a clock an SM, its adds 128): x + 1.5 *
    2**23 rounds x half to even where |x| <= 2**22 (an ulp of 1 there, 1.5 * 2**23 even) and
    is monotone beyond, the zero point is added exactly, the clamp to 1.5 * 2**23 + lo and +
    hi (constants) saturates, and the integer is read off the bits. Bit for bit for every
    x, infinities included; a NaN x gives the low bits of the NaN its adds make, where
    `_saturate`'s cast gives 0 (so only where x is never NaN). x must be no product: a
    compiler may contract a multiply and the rounding add into one fma, which rounds the
    exact product (`unfused` writes a product that no compiler contracts)."""
    bits = call("bitcast", minimum(maximum(x + const(MAGIC) + zero_point, const(MAGIC + lo)),
                                   const(MAGIC + hi)), dtype=T.int32)
    return Cast(dtype, bits - const(MAGIC_BITS, T.int32))


def unfused(a: Expr, b: Expr) -> Expr:
    """a * b (float32) as fma(a, b, 0): the same value but for a zero's sign (a rounding then
    takes it to the same integer), and no compiler contracts an fma with the add after it
    (NVVM keeps fmaf(a, b, 0.0f), and ptxas an FFMA, before `rounded_saturated`'s add)."""
    return call("fma", a, b, const(0.0, a.dtype))


def _rule_axis(x: Tensor, scale: Tensor, axis: int) -> int:
    """The references' axis: `axis` of a non-scalar scale, else unused."""
    per_tensor = all(d == const(1) for d in scale.shape)
    return axis % x.ndim if x.ndim and not per_tensor else 0


def _check_param(ctx, i: int, axis: int, block_size: int, what: str) -> None:
    """Per-tensor, per-axis or blocked shapes of a scale or zero point."""
    if not ctx.has(i):
        return
    x, p = ctx.shape(0), ctx.shape(i)
    if block_size:
        ok = len(p) == len(x) and all(
            (d == -(-x[k] // block_size) if k == axis else d == x[k])
            for k, d in enumerate(p) if isinstance(d, int) and isinstance(x[k], int))
    else:
        ok = len(p) == 0 or p == (1,) or (len(p) == 1 and (
            not isinstance(p[0], int) or not isinstance(x[axis], int) or p[0] == x[axis]))
    if not ok:
        raise ctx.fail(f"{what} of shape {p} fits neither per-tensor, per-axis (axis {axis}) "
                       f"nor block_size {block_size} quantization of shape {x}")


def _axis(ctx) -> int:
    """The quantization axis; only checked when the scale is not a scalar."""
    rank = len(ctx.shape(0))
    per_tensor = len(ctx.shape(1)) == 0 or ctx.shape(1) == (1,)
    return 0 if per_tensor or not rank else normalize_axis(ctx, ctx.attrs["axis"], rank)


# -- QuantizeLinear -----------------------------------------------------------------------------


def _quantize_infer(ctx):
    check_dtype(ctx, 0, T.FLOAT_DTYPES + (T.int32,), "x")
    axis = _axis(ctx)
    _check_param(ctx, 1, axis, ctx.attrs["block_size"], "y_scale")
    _check_param(ctx, 2, axis, ctx.attrs["block_size"], "y_zero_point")
    out = ctx.attrs["output_dtype"]
    if ctx.has(2):
        if out is not None and out != ctx.dtype(2):
            raise ctx.fail(f"output_dtype {out.name} differs from the zero point's type "
                           f"{ctx.dtype(2).name}")
        out = ctx.dtype(2)
    out = out or T.uint8
    if out not in QUANT_DTYPES:
        raise ctx.fail(f"cannot quantize to {out.name}")
    if ctx.attrs["bits"] not in (0, 4) or (ctx.attrs["bits"] and out.itemsize != 1):
        raise ctx.fail(f"bits {ctx.attrs['bits']} is neither 0 (the type's width) nor 4 in "
                       f"an 8-bit type ({out.name})")
    return [T.TensorType(out, ctx.shape(0))]


def quantize_linear(x, y_scale, y_zero_point=None, *, axis, block_size, output_dtype,
                    saturate, precision, bits=0):
    out = (y_zero_point.dtype if y_zero_point is not None
           else (output_dtype or T.uint8).np)
    axis = axis % x.ndim if x.ndim and y_scale.size > 1 else 0
    scale = expand_param(y_scale, x.shape, axis, block_size)
    if precision is not None:
        q = x.astype(precision.np) / scale.astype(precision.np)
    else:
        q = x.astype(np.float32) / scale.astype(np.float32)
    q = np.rint(q.astype(np.float32))
    if y_zero_point is not None:
        q = q + expand_param(y_zero_point, x.shape, axis, block_size).astype(np.float32)
    return np.clip(q, *quant_range(T.DType.from_numpy(out), bits)).astype(out)


def _quantize_rule(inputs, outputs, *, axis, block_size, output_dtype, saturate, precision,
                   bits):
    x, scale, zp = (list(inputs) + [None])[:3]
    out = outputs[0]
    axis = _rule_axis(x, scale, axis)
    div = precision or T.float32

    def element(*idx):
        q = widen(div, x[idx]) / widen(div, param_at(scale, idx, axis, block_size))
        q = call("round", widen(T.float32, q))
        if zp is not None:
            q = q + widen(T.float32, param_at(zp, idx, axis, block_size))
        return _saturate(q, out.dtype, bits)

    return [compute(out.shape, element, "quantize", out.dtype)]


register_op("QuantizeLinear", pattern=Pattern.ELEMWISE, infer=_quantize_infer,
            evaluate=quantize_linear, inputs=(2, 3), compute=_quantize_rule,
            attrs={"axis": 1, "block_size": 0, "output_dtype": None, "saturate": 1,
                   "precision": None, "bits": 0})


# -- DequantizeLinear ---------------------------------------------------------------------------


def _dequantize_infer(ctx):
    check_dtype(ctx, 0, QUANT_DTYPES + (T.int32,), "x")
    check_dtype(ctx, 1, T.FLOAT_DTYPES, "x_scale")
    if ctx.has(2) and ctx.dtype(2) != ctx.dtype(0):
        raise ctx.fail(f"zero point type {ctx.dtype(2).name} differs from x's "
                       f"{ctx.dtype(0).name}")
    axis = _axis(ctx)
    _check_param(ctx, 1, axis, ctx.attrs["block_size"], "x_scale")
    _check_param(ctx, 2, axis, ctx.attrs["block_size"], "x_zero_point")
    return [T.TensorType(ctx.attrs["output_dtype"] or ctx.dtype(1), ctx.shape(0))]


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis, block_size, output_dtype):
    axis = axis % x.ndim if x.ndim and x_scale.size > 1 else 0
    dx = x.astype(np.float32)
    if x_zero_point is not None:
        dx = dx - expand_param(x_zero_point, x.shape, axis, block_size).astype(np.float32)
    y = dx * expand_param(x_scale, x.shape, axis, block_size).astype(np.float32)
    return y.astype(output_dtype.np if output_dtype else x_scale.dtype)


def _dequantize_rule(inputs, outputs, *, axis, block_size, output_dtype):
    x, scale, zp = (list(inputs) + [None])[:3]
    axis = _rule_axis(x, scale, axis)

    def element(*idx):
        v = widen(T.float32, x[idx])
        if zp is not None:
            v = v - widen(T.float32, param_at(zp, idx, axis, block_size))
        return v * widen(T.float32, param_at(scale, idx, axis, block_size))

    return [compute(outputs[0].shape, element, "dequantize", outputs[0].dtype)]


register_op("DequantizeLinear", pattern=Pattern.ELEMWISE, infer=_dequantize_infer,
            evaluate=dequantize_linear, inputs=(2, 3), compute=_dequantize_rule,
            attrs={"axis": 1, "block_size": 0, "output_dtype": None})


# -- DynamicQuantizeLinear ----------------------------------------------------------------------


def _dynamic_quantize_infer(ctx):
    # float16 / bfloat16 beyond ONNX's float32: store_half hands a value already stored in the
    # half type over as it is (its float32 widening is exact: the same results)
    check_dtype(ctx, 0, (T.float32, T.float16, T.bfloat16), "x")
    if ctx.has(1):
        check_dtype(ctx, 1, (T.float32,), "x_range")
    return [T.TensorType(T.uint8, ctx.shape(0)), T.TensorType(T.float32, ()),
            T.TensorType(T.uint8, ())]


def _range_from_zero(x) -> tuple[np.ndarray, np.float32, np.float32]:
    """(x as float32: a half x widened, exact; max(x, 0); min(x, 0)): the range
    DynamicQuantizeLinear quantizes over, which DynamicRange's partials hold in pieces."""
    x = np.asarray(x).astype(np.float32)
    return (x, np.float32(max(0.0, float(np.max(x)) if x.size else 0.0)),
            np.float32(min(0.0, float(np.min(x)) if x.size else 0.0)))


def dynamic_quantize_linear(x, x_range=None):
    """uint8 asymmetric quantization over [min(x, 0), max(x, 0)], as ONNX specifies (a half
    x widened to float32 first: exact). The optional `x_range` (DynamicRange's partials of x,
    which the take_range pass adds) holds that range in pieces: the reference reads x
    itself, which gives the same."""
    x, hi, lo = _range_from_zero(x)
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    zero_point = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.clip(np.rint(x / scale) + zero_point, 0, 255)
    return (y.astype(np.uint8), np.array(scale, np.float32),
            np.array(zero_point, np.float32).astype(np.uint8))


DQ_PARTS = 1024
"""Partial results of DynamicQuantizeLinear's max and min over a tensor of more than
DQ_ONE_LEVEL elements (or of a symbolic size): partial b reduces elements b, b + DQ_PARTS,
... (neighbouring partials read neighbouring elements), then one reduction of the partials.
As one whole-tensor reduction a GPU ran it on one block: on an H200 each of dynamically
quantized BERT-base's 72 quantizations of [1024, 768] (batch 8) took 0.47 ms, 11.3 of the
model's 13.2 ms. max and min are exact in any order: the results are the same."""
DQ_ONE_LEVEL = 1 << 16


def _dynamic_quantize_rule(inputs, outputs):
    """Three stages: x's max and min (each a full reduction, in two levels past DQ_ONE_LEVEL
    elements: DQ_PARTS; or of x_range's partials where it is given), then scale, zero point
    and the elementwise quantization reading them."""
    given = len(inputs) > 1 and inputs[1] is not None
    return _quantized_outputs(inputs[0], _partials_range(inputs[1]) if given else
                              _whole_range(inputs[0]), outputs)


def _as_float32(buffer: Tensor):
    """x's element at an index as float32 (a half x widened: exact)."""
    return lambda index: widen(T.float32, buffer[index])


def _whole_range(buffer: Tensor) -> tuple[Tensor, Tensor]:
    """x's max and min, each a full reduction (two levels past DQ_ONE_LEVEL elements)."""
    f32 = T.float32
    x = _as_float32(buffer)
    dims = list(buffer.shape)
    size = const(1)
    for d in dims:
        size = size * d
    static = [d.value for d in dims if isinstance(d, Const)]
    two_levels = len(static) < len(dims) or int(np.prod(static)) > DQ_ONE_LEVEL

    def whole(reducer, name):
        if not dims:
            return compute((), lambda: x(()), name, f32)
        if not two_levels:
            def fn():
                r = [reduce_axis(d, f"r{i}") for i, d in enumerate(dims)]
                return reducer(x(tuple(a.var for a in r)), r)
            return compute((), fn, name, f32)
        step = reduce_axis((size + (DQ_PARTS - 1)) // DQ_PARTS, "rs")

        def part(b):
            flat = step.var * DQ_PARTS + b
            return reducer(x(tuple(unravel(flat, dims))), step, where=flat < size)
        parts = compute((DQ_PARTS,), part, f"{name}_parts", f32)
        r = reduce_axis(DQ_PARTS, "rp")
        return compute((), lambda: reducer(parts[r.var], r), name, f32)

    return whole(reduce_max, "dq_max"), whole(reduce_min, "dq_min")


def _partials_range(parts: Tensor) -> tuple[Tensor, Tensor]:
    """x's max and min from DynamicRange's partials (row 0 maxima, row 1 minima)."""
    dims = list(parts.shape[1:])

    def whole(row, reducer, name):
        def fn():
            r = [reduce_axis(d, f"r{i}") for i, d in enumerate(dims)]
            return reducer(parts[(row,) + tuple(a.var for a in r)], r)
        return compute((), fn, name, T.float32)

    return whole(0, reduce_max, "dq_max"), whole(1, reduce_min, "dq_min")


def _quantized_outputs(buffer: Tensor, extremes: tuple[Tensor, Tensor],
                       outputs) -> list[Tensor]:
    """y, scale and zero point of x from its max and min (`extremes`, scalar tensors)."""
    f32 = T.float32
    x = _as_float32(buffer)
    hi, lo = extremes
    # range widened to include 0, as the reference
    top, bottom = maximum(hi[()], const(0.0)), minimum(lo[()], const(0.0))
    scale = compute((), lambda: Select(eq(top, bottom), const(1.0), top - bottom)
                    / const(255.0), "dq_scale", f32)

    def zero_point():
        return call("round", minimum(maximum(const(0.0) - bottom / scale[()], const(0.0)),
                                     const(255.0)))

    zp = compute((), zero_point, "dq_zero_point", f32)
    y = compute(outputs[0].shape, lambda *i: _saturate(call("round", x(i) / scale[()])
                                                        + zp[()], T.uint8), "dq_y", T.uint8)
    return [y, scale, compute((), lambda: Cast(T.uint8, zp[()]), "dq_zp", T.uint8)]


register_op("DynamicQuantizeLinear", pattern=Pattern.OPAQUE, infer=_dynamic_quantize_infer,
            evaluate=dynamic_quantize_linear, inputs=(1, 2), outputs=3,
            compute=_dynamic_quantize_rule)


# -- DynamicRange (dnnc's: a DynamicQuantizeLinear's range taken where x is made) ---------------


RANGE_PIECES = 1024
"""Columns of DynamicRange's partials: a producer's kernel of at most this many blocks writes
each block's range into its own columns (on cuda BERT-base b8's layernorm rows, 1024 blocks,
and its products, 384); the quantization reads them all (8 KB, from L2)."""


def _dynamic_range_infer(ctx):
    check_dtype(ctx, 0, (T.float32, T.float16, T.bfloat16), "x")   # (as the quantization's)
    return [T.TensorType(T.float32, (2, RANGE_PIECES))]


def dynamic_range(x):
    """x's range in partials: row 0 maxima, row 1 minima, each column the max and min of
    some of x's elements and 0, every element in some column. Kernels choose the pieces
    (a block's stores: `backends/cuda/range_epilogue.py`); the reference's pieces are the
    whole tensor, every column the same."""
    _, hi, lo = _range_from_zero(x)
    return np.stack([np.full(RANGE_PIECES, hi, np.float32),
                     np.full(RANGE_PIECES, lo, np.float32)])


def _dynamic_range_rule(inputs, outputs):
    """Alone in a kernel (where no producer takes it): the reference's pieces, the whole
    range in every column, from DynamicQuantizeLinear's own reductions."""
    hi, lo = _whole_range(inputs[0])
    zero = const(0.0)
    return [compute(outputs[0].shape, lambda r, *_: Select(
        eq(r, const(0)), maximum(hi[()], zero), minimum(lo[()], zero)), "range", T.float32)]


register_op("DynamicRange", pattern=Pattern.OPAQUE, infer=_dynamic_range_infer,
            evaluate=dynamic_range, compute=_dynamic_range_rule,
            flops=lambda node: 2 * numel(node.inputs[0]))


# -- QLinearMatMul ------------------------------------------------------------------------------


def _qlinear_matmul_infer(ctx):
    from .linalg import matmul_shape

    check_dtype(ctx, 0, (T.int8, T.uint8), "a")
    check_dtype(ctx, 3, (T.int8, T.uint8), "b")
    out = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    return [T.TensorType(out, matmul_shape(ctx, ctx.shape(0), ctx.shape(3)))]


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point=None):
    acc = np.matmul(a.astype(np.int32) - a_zero_point.astype(np.int32),
                    b.astype(np.int32) - b_zero_point.astype(np.int32))
    # the multiplier is formed in the scales' own precision, as onnx's reference does
    multiplier = a_scale * b_scale / y_scale
    y = np.rint(acc * multiplier.astype(np.float64))
    out = a.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        y = y + y_zero_point.astype(np.float32)
    info = np.iinfo(out)
    return np.clip(y, info.min, info.max).astype(out)


def _requantize(acc: Expr, multiplier: Expr, y_zp: Expr | None, dtype: T.DType) -> Expr:
    """rint(acc * multiplier) + y's zero point, saturated: the references' float64 epilogue."""
    y = call("round", widen(T.float64, acc) * widen(T.float64, multiplier))
    if y_zp is not None:
        y = y + widen(T.float64, y_zp)
    return _saturate(y, dtype)


def _promote(*ts: Tensor) -> T.DType:
    return T.DType.from_numpy(np.result_type(*(t.dtype.np for t in ts)))


def _qlinear_matmul_rule(inputs, outputs):
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (list(inputs) + [None])[:8]
    out = outputs[0]
    k, indices = matmul_operands(a, b)
    # parameters broadcast as NumPy broadcasts them in the reference: zero points against
    # their operand, scales and y's zero point against the output
    for p, rank in ((a_zp, a.ndim), (b_zp, b.ndim), (a_scale, len(out.shape)),
                    (b_scale, len(out.shape)), (y_scale, len(out.shape)),
                    (y_zp, len(out.shape))):
        if p is not None and p.ndim > rank:
            raise NoCompute(f"a parameter of rank {p.ndim} broadcasts beyond rank {rank}")
    # the multiplier is formed in the scales' own precision, as the reference
    ms = _promote(a_scale, b_scale, y_scale)

    def element(*idx):
        ai, bi = indices(idx, k.var)
        av = widen(T.int32, a[ai]) - widen(T.int32, broadcast_load(a_zp, ai))
        bv = widen(T.int32, b[bi]) - widen(T.int32, broadcast_load(b_zp, bi))
        scales = [widen(ms, broadcast_load(t, idx)) for t in (a_scale, b_scale, y_scale)]
        zp = None if y_zp is None else broadcast_load(y_zp, idx)
        return _requantize(reduce_sum(av * bv, k), scales[0] * scales[1] / scales[2], zp,
                           out.dtype)

    return [compute(out.shape, element, "qlinear_matmul", out.dtype)]


register_op("QLinearMatMul", pattern=Pattern.OUT_FUSABLE, infer=_qlinear_matmul_infer,
            evaluate=qlinear_matmul, inputs=(7, 8), compute=_qlinear_matmul_rule,
            flops=lambda node: 2 * numel(node.outputs[0]) * Count.of([node.inputs[0].shape[-1]]))


# -- QLinearConv --------------------------------------------------------------------------------


def _qlinear_conv_infer(ctx):
    from .conv import conv_shape

    check_dtype(ctx, 0, (T.int8, T.uint8), "x")
    check_dtype(ctx, 3, (T.int8, T.uint8), "w")
    check_dtype(ctx, 8, (T.int32,), "B")
    out = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    return [T.TensorType(out, conv_shape(ctx, 0, 3))]


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point=None,
                 b=None, **conv_attrs):
    """Integer convolution of zero-point-shifted operands, requantized to y's scale."""
    from .conv import conv

    xi = x.astype(np.int32) - (0 if x_zero_point is None else x_zero_point.astype(np.int32))
    wi = w.astype(np.int32)
    if w_zero_point is not None:
        zp = w_zero_point.astype(np.int32)
        wi = wi - (zp.reshape((-1,) + (1,) * (w.ndim - 1)) if zp.size > 1 else zp)
    acc = conv(xi, wi, None, **conv_attrs)
    if b is not None:
        acc = acc + b.astype(np.int32).reshape((1, -1) + (1,) * (acc.ndim - 2))
    w_scale = w_scale.reshape((1, -1) + (1,) * (acc.ndim - 2)) if w_scale.size > 1 else w_scale
    y = np.rint(acc * (x_scale * w_scale / y_scale).astype(np.float64))
    out = x.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        y = y + y_zero_point.astype(np.float64)
    info = np.iinfo(out)
    return np.clip(y, info.min, info.max).astype(out)


def _qlinear_conv_rule(inputs, outputs, **attrs):
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b = (list(inputs) + [None] * 2)[:9]
    out = outputs[0]
    ms = _promote(x_scale, w_scale, y_scale)

    def term(xv, wv, m):
        # zero points shift loaded pixels only: padding stays 0, as the reference
        return ((widen(T.int32, xv) - widen(T.int32, scalar_or_per_channel(x_zp, m)))
                * (widen(T.int32, wv) - widen(T.int32, scalar_or_per_channel(w_zp, m))))

    total = conv_sum(x, w, out.shape, attrs, term)

    def element(n, m, *o):
        acc = total(n, m, *o)
        if b is not None:
            acc = acc + widen(T.int32, b[m])
        multiplier = (widen(ms, scalar_or_per_channel(x_scale, m))
                      * widen(ms, scalar_or_per_channel(w_scale, m))
                      / widen(ms, scalar_or_per_channel(y_scale, m)))
        zp = None if y_zp is None else scalar_or_per_channel(y_zp, m)
        return _requantize(acc, multiplier, zp, out.dtype)

    return [compute(out.shape, element, "qlinear_conv", out.dtype)]


register_op("QLinearConv", pattern=Pattern.OUT_FUSABLE, infer=_qlinear_conv_infer,
            evaluate=qlinear_conv, inputs=(8, 9), compute=_qlinear_conv_rule,
            # inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zp, B
            flops=lambda node: conv_flops(node.outputs[0], node.inputs[3].shape[1:],
                                          node.outputs[0], has_input(node, 8)),
            attrs={"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                   "pads": None, "strides": None})


# -- QLinearAdd (com.microsoft) -----------------------------------------------------------------


def _qlinear_add_infer(ctx):
    check_dtype(ctx, 0, (T.int8, T.uint8), "A")
    if ctx.dtype(3) != ctx.dtype(0):
        raise ctx.fail(f"A and B are of one type, given {ctx.dtype(0).name} and "
                       f"{ctx.dtype(3).name}")
    for i, what in ((1, "A_scale"), (2, "A_zero_point"), (4, "B_scale"), (5, "B_zero_point"),
                    (6, "C_scale"), (7, "C_zero_point")):
        if ctx.has(i) and ctx.shape(i) not in ((), (1,)):
            raise ctx.fail(f"{what} is a scalar, given {ctx.type(i)}")
    out = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    return [T.TensorType(out, T.broadcast_shapes(ctx.shape(0), ctx.shape(3)))]


def _fma(x: np.ndarray, y, z) -> np.ndarray:
    """x * y + z rounded once to float32: in float64, where the product of an 8-bit integer
    and a float32 and its sum with a float32 of like magnitude are exact."""
    return (np.asarray(x, np.float64) * np.float64(y) + np.asarray(z, np.float64)).astype(
        np.float32)


def _scalar(p: np.ndarray | None) -> np.float32:
    return np.float32(0) if p is None else np.float32(p.reshape(()))


def qlinear_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                c_zero_point=None):
    """onnxruntime's QLinearAdd as MLAS computes it: with r_a = s_a / s_c, r_b = s_b / s_c and
    fixed = z_c - (r_a z_a + r_b z_b) in float32, fma(a, r_a, fma(b, r_b, fixed)) rounded
    half to even and saturated; an operand of one value is folded into fixed first
    (fixed + a r_a, unfused)."""
    ra, rb = _scalar(a_scale) / _scalar(c_scale), _scalar(b_scale) / _scalar(c_scale)
    fixed = _scalar(c_zero_point) - (ra * _scalar(a_zero_point) + rb * _scalar(b_zero_point))
    af, bf = a.astype(np.float32), b.astype(np.float32)
    if a.size == 1 and b.size > 1:
        y = _fma(bf, rb, fixed + np.float32(af.reshape(())) * ra)
    elif b.size == 1 and a.size > 1:
        y = _fma(af, ra, fixed + np.float32(bf.reshape(())) * rb)
    else:
        y = _fma(af, ra, _fma(bf, rb, fixed))
    out = a.dtype if c_zero_point is None else c_zero_point.dtype
    y = np.broadcast_to(y, np.broadcast_shapes(a.shape, b.shape))
    info = np.iinfo(out)
    return np.clip(np.rint(y), info.min, info.max).astype(out)


def _qlinear_add_rule(inputs, outputs):
    a, sa, za, b, sb, zb, sc, zc = (list(inputs) + [None])[:8]
    out, f32 = outputs[0], T.float32

    def scalar(t: Tensor | None) -> Expr:
        if t is None:
            return const(0.0)
        return widen(f32, t[(0,) * t.ndim] if t.ndim else t[()])

    ra, rb = scalar(sa) / scalar(sc), scalar(sb) / scalar(sc)
    fixed = scalar(zc) - (ra * scalar(za) + rb * scalar(zb))
    one_a, one_b = (all(d == const(1) for d in t.shape) for t in (a, b))

    def element(*idx):
        av, bv = (widen(f32, broadcast_load(t, idx)) for t in (a, b))
        if one_a and not one_b:
            y = call("fma", bv, rb, fixed + av * ra)
        elif one_b and not one_a:
            y = call("fma", av, ra, fixed + bv * rb)
        else:
            y = call("fma", av, ra, call("fma", bv, rb, fixed))
        return _saturate(call("round", y), out.dtype)

    return [compute(out.shape, element, "qlinear_add", out.dtype)]


register_op("QLinearAdd", pattern=Pattern.BROADCAST, infer=_qlinear_add_infer,
            evaluate=qlinear_add, inputs=(7, 8), compute=_qlinear_add_rule)


# -- QuantizedAdd -------------------------------------------------------------------------------
#
# QuantizedAdd(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point) is
# QuantizeLinear(DequantizeLinear(a) + DequantizeLinear(b)) of scalar parameters, every step
# the chain's own float32 arithmetic: ((a - za) sa + (b - zb) sb) / sc, rounded half to even,
# plus zc, saturated (to 4 bits with `bits` 4, as the chain's Q). fuse_quantized makes it
# of a QDQ file's residual add so that the 8-bit operands reach a product's epilogue as they
# are (the chain's DequantizeLinear of the other operand was a float32 tensor of its own, a
# kernel and 4 bytes a value). Its `c_reciprocal` (None, or 1 / sc in float32 that
# `add_reciprocal` proved rounds as the quotient, alone or with one fma refinement:
# `c_refined`) makes the compute rule multiply instead of divide: the same results, and a
# GPU's division is ~10 instructions with a branch (resnet50 b32's int8 64 -> 256 residual
# conv on an H200: 0.11 ms dividing, 0.055 multiplying).


def add_reciprocal(a_dtype, a_scale, a_zero_point, b_dtype, b_scale, b_zero_point,
                   c_scale) -> tuple[float, bool] | None:
    """(1 / c_scale in float32, refined) where, for every pair of 8-bit operands, the
    quotient's rint is that of total * it (refined False) or of its one-step refinement
    q + (total - q c_scale) / c_scale's stand-in fma(fma(-q, c_scale, total), it, q), q =
    total * it (refined True), total their dequantized sum as the chain's float32 arithmetic
    forms it, with either product fused into the add as a compiler may contract it; each
    total's float32 neighbours, each fma fused or not, and each result's neighbours too
    (65536 pairs, checked at compile time); None where neither holds for all."""
    f32, f64 = np.float32, np.float64

    def dequantized(dtype, scale, zero_point):
        info = np.iinfo(dtype)
        q = np.arange(info.min, info.max + 1).astype(f32) - f32(zero_point)
        return q, q * f32(scale)

    def near(x):
        return np.concatenate([x, np.nextafter(x, f32(np.inf)), np.nextafter(x, f32(-np.inf))])

    qa, pa = dequantized(a_dtype, a_scale, a_zero_point)
    qb, pb = dequantized(b_dtype, b_scale, b_zero_point)
    fused_b = pa[:, None].astype(f64) + qb[None, :] * f64(f32(b_scale))
    fused_a = pb[None, :].astype(f64) + qa[:, None] * f64(f32(a_scale))
    totals = near(np.concatenate([(pa[:, None] + pb[None, :]).ravel(),
                                  fused_b.astype(f32).ravel(), fused_a.astype(f32).ravel()]))
    sc = f32(c_scale)
    reciprocal = f32(1) / sc
    if not np.isfinite(reciprocal):
        return None
    with np.errstate(all="ignore"):
        want = np.rint(totals / sc)
        q = totals * reciprocal
        if np.array_equal(want, np.rint(q)):
            return float(reciprocal), False
        fused_r, other_r = _fma32(-q, sc, totals)
        if not np.array_equal(fused_r, other_r):
            return None
        refined = [x for r in (fused_r, -q * sc + totals)
                   for x in (*_fma32(r, reciprocal, q), r * reciprocal + q)]
        same = all(np.array_equal(want, np.rint(x)) for x in refined)
    return (float(reciprocal), True) if same else None


def _fma32(a, b, c) -> tuple:
    """float32 fma(a, b, c) from float64 (a b exact there; the sum rounded twice): the result,
    and the other float32 where the float64 sum fell exactly between two (where rounding it
    twice may differ from rounding once); the result itself elsewhere."""
    f32, f64 = np.float32, np.float64
    exact = f64(a) * f64(b) + f64(c)
    y = exact.astype(f32)
    other = np.nextafter(y, np.where(exact > y, f32(np.inf), f32(-np.inf)).astype(f32))
    between = (f64(y) + f64(other)) / 2 == exact
    return y, np.where(between, other, y)


def _quantized_add_infer(ctx):
    for i, what in ((0, "a"), (3, "b")):
        check_dtype(ctx, i, (T.int8, T.uint8), what)
        if ctx.dtype(i + 2) != ctx.dtype(i):
            raise ctx.fail(f"{what}'s zero point is of its type {ctx.dtype(i).name}, given "
                           f"{ctx.dtype(i + 2).name}")
    check_dtype(ctx, 7, (T.int8, T.uint8), "c_zero_point")
    for i in (1, 2, 4, 5, 6, 7):
        if ctx.shape(i) != ():
            raise ctx.fail(f"input {i} is a scalar, given {ctx.type(i)}")
    for i in (1, 4, 6):
        check_dtype(ctx, i, (T.float32,), "a scale")
    if ctx.attrs["bits"] not in (0, 4):
        raise ctx.fail(f"bits {ctx.attrs['bits']} is neither 0 (the type's width) nor 4")
    return [T.TensorType(ctx.dtype(7), T.broadcast_shapes(ctx.shape(0), ctx.shape(3)))]


def quantized_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point,
                  c_reciprocal=None, c_refined=False, bits=0):
    """The chain, by its ops' references (`c_reciprocal`, `c_refined` change no result; `bits`
    is the QuantizeLinear's)."""
    per_tensor = {"axis": 1, "block_size": 0}
    total = dequantize_linear(a, a_scale, a_zero_point, output_dtype=None, **per_tensor) + \
        dequantize_linear(b, b_scale, b_zero_point, output_dtype=None, **per_tensor)
    return quantize_linear(total, c_scale, c_zero_point, output_dtype=None, saturate=1,
                           precision=None, bits=bits, **per_tensor)


def _quantized_add_rule(inputs, outputs, *, c_reciprocal, c_refined, bits):
    a, sa, za, b, sb, zb, sc, zc = inputs
    out, f32 = outputs[0], T.float32

    def element(*idx):
        def dequantized(t, s, z):   # DequantizeLinear's rule: (x - z) * s in float32
            return (widen(f32, broadcast_load(t, idx)) - widen(f32, z[()])) * widen(f32, s[()])

        total = dequantized(a, sa, za) + dequantized(b, sb, zb)
        if c_reciprocal is None:
            quotient = total / widen(f32, sc[()])
        else:
            reciprocal = const(c_reciprocal, f32)
            if c_refined:   # + (total - quotient sc) / sc, the remainder exact in an fma
                quotient = total * reciprocal
                remainder = call("fma", const(0.0, f32) - quotient, widen(f32, sc[()]), total)
                quotient = call("fma", remainder, reciprocal, quotient)
            else:
                quotient = unfused(total, reciprocal)
            # (add_reciprocal's quotients of every pair of operands are no NaN)
            return rounded_saturated(quotient, widen(f32, zc[()]), out.dtype,
                                     *quant_range(out.dtype, bits))
        return _saturate(call("round", quotient) + widen(f32, zc[()]), out.dtype, bits)

    return [compute(out.shape, element, "quantized_add", out.dtype)]


register_op("QuantizedAdd", pattern=Pattern.BROADCAST, infer=_quantized_add_infer,
            evaluate=quantized_add, inputs=8, compute=_quantized_add_rule,
            attrs={"c_reciprocal": None, "c_refined": False, "bits": 0})
