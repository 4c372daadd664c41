"""Integer ops the quantization pass makes (`passes/fuse_quantized.py`): QuantizedDense,
QuantizedConv and QuantizedConvPacked (weights in 4-byte groups of input channels at a tap,
`pack_conv_groups`; of one group, or of groups whose panels of 16 output channels read
`panel_span` input channels each), an int32 sum of u8/s8 activations times int8 weights with
the requantization fused as its epilogue; QuantizedTable, an 8-bit value through a table of its
256 results. Frontends never produce these ops; their references are the accuracy
contract the kernels are tested against bit for bit.

Both compute, for output channel n (a dense product's column, a conv's output channel):

    acc = sum (a - a_zero_point) * (w - w_zero_point[n])  +  bias[n]       int32, exact
    y   = acc                                       without scale
    y   = float32(acc) * scale[n]                   with scale, without y_zero_point
    y   = clamp(rint(float32(acc) * scale[n]) + y_zero_point, lo, hi)     quantized

where float32(acc) * scale[n] is one float32 product (scale: x_scale * w_scale[n] / y_scale
formed in float32, in that order, as onnxruntime's QLinearConv / QLinearMatMul / QGemm
form their output scales and MLAS requantizes), rint rounds half to even (ONNX
QuantizeLinear) and the clamp saturates to the output type, narrowed by `lo` / `hi` (a fused
Relu or Clip, in the output's integer domain). A conv pads with the activation's zero point
(padding adds nothing to the sum), as QLinearConv does.

QuantizedDense's `x_scale` (optional, a float32 scalar, known at run time: the activation's
DynamicQuantizeLinear scale) multiplies its scale first: scale[n] = x_scale * w_scale[n],
one float32 product, as onnxruntime's quantize_dynamic files form it (a Mul of the two
scales before the Mul of the converted sums), so that product needs no kernel of its own.

`w_sums[n]` = sum over k of w[k, n]: derived from the weights at compile time for the
u8 x s8 kernels' zero-point compensation (sum a w - a_zero_point * w_sums); the reference
checks it and never computes with it. `w_zero_point` (QuantizedDense only, absent: 0) is
int8, a scalar or one per column: uint8 weights with their zero point z are stored as
w - 128 with zero point z - 128 (the same differences, in the int8 operand of vpdpbusd);
kernels compensate it with the rows' sums of a. QuantizedDense's weights are packed in 4-byte groups
(`pack_groups`): [ceil(N / 16), ceil(K / 4), 16, 4], weight (k, n) at [n // 16, k // 4, n % 16,
k % 4]: 16 columns of 4 consecutive k in one 64-byte row, what one `vpdpbusd` reads as its
signed operand per 512-bit vector and what one AMX tile row (`tdpbusd`'s B) holds; or in rows
(`pack_rows`, where a target's layout asks: `convert_layout`'s "int8_dense_rows"): [N,
ceil(K / 16) * 16], column n's weights contiguous along k and zero past K, what a K-major
tensor-core tile copies 16 bytes at a time. The rank of w says which.
This module must never choose a target's layout beyond those two.
"""

from __future__ import annotations

import numpy as np

from .. import batching
from .. import types as T
from ..compute import NoCompute, compute, reduce_axis, reduce_sum
from ..flops import Count, has_input, numel
from ..graph import Value
from ..loop import Cast, Expr, const, minimum
from .conv import CONV_ATTRS, conv, conv_flops, conv_shape, conv_sum, scalar_or_per_channel
from .index_exprs import const_int
from .infer import check_dtype
from .linalg import widen
from .packed import NCHW_OF_NHWC, NHWC_OF_NCHW
from .quant import rounded_saturated, unfused
from .registry import REQUIRED, Pattern, infer_node, register_op

GROUP_COLUMNS = 16
"""Columns per packed panel: one 512-bit vector of int32 lanes, an AMX tile's 64-byte row."""
GROUP_DEPTH = 4
"""k per group: the 4 bytes one int32 lane of `vpdpbusd` / `tdpbusd` sums."""
ACTIVATIONS = (T.uint8, T.int8)
QUANT_ATTRS = {"lo": None, "hi": None}
INTEGER_PRODUCTS = ("QuantizedDense", "QuantizedConv", "QuantizedConvPacked", "QuantizedConvNHWC")
"""The ops of this module: products computed on integers (`dnnc inspect` counts them)."""


def pack_groups(w: np.ndarray) -> np.ndarray:
    """int8 [K, N] -> [ceil(N / 16), ceil(K / 4), 16, 4], zero-padded."""
    k, n = w.shape
    kp, npad = -(-k // GROUP_DEPTH) * GROUP_DEPTH, -(-n // GROUP_COLUMNS) * GROUP_COLUMNS
    full = np.zeros((kp, npad), np.int8)
    full[:k, :n] = w
    blocks = full.reshape(kp // GROUP_DEPTH, GROUP_DEPTH, npad // GROUP_COLUMNS, GROUP_COLUMNS)
    return np.ascontiguousarray(blocks.transpose(2, 0, 3, 1))


def unpack_groups(wp: np.ndarray, k: int, n: int) -> np.ndarray:
    """`pack_groups`' [K, N] back from its packing."""
    panels, groups = wp.shape[:2]
    full = wp.transpose(1, 3, 0, 2).reshape(groups * GROUP_DEPTH, panels * GROUP_COLUMNS)
    return full[:k, :n]


ROW_ALIGN = 16
"""k of a row of `pack_rows` is padded to a multiple of this (16 bytes: one cp.async chunk)."""


def pack_rows(w: np.ndarray) -> np.ndarray:
    """int8 [K, N] -> [N, ceil(K / ROW_ALIGN) * ROW_ALIGN], zero-padded: QuantizedDense's
    rows layout."""
    k, n = w.shape
    rows = np.zeros((n, -(-k // ROW_ALIGN) * ROW_ALIGN), np.int8)
    rows[:, :k] = w.T
    return rows


def dense_weights(w: np.ndarray, k: int, n: int) -> np.ndarray:
    """QuantizedDense's weights [K, N] from either layout (by rank: groups or rows)."""
    return unpack_groups(w, k, n) if w.ndim == 4 else w[:n, :k].T


def _check_epilogue(ctx, first: int, channels) -> T.DType:
    """Checks bias, scale and y_zero_point (inputs first..first + 2) for `channels` output
    channels; returns the output type."""
    bias, scale, zp = first, first + 1, first + 2
    for i, what in ((bias, "bias"), (scale, "scale")):
        if ctx.has(i) and ctx.shape(i) not in ((), (1,), (channels,)):
            raise ctx.fail(f"{what} is a scalar or one per output channel ({channels}), "
                           f"given {ctx.type(i)}")
    if ctx.has(bias):
        check_dtype(ctx, bias, (T.int32,), "bias")
    if ctx.has(scale):
        check_dtype(ctx, scale, (T.float32,), "scale")
    if ctx.has(zp):
        check_dtype(ctx, zp, ACTIVATIONS, "y_zero_point")
        if not ctx.has(scale):
            raise ctx.fail("a quantized output needs a scale")
        if ctx.shape(zp) not in ((), (1,)):
            raise ctx.fail(f"y_zero_point is a scalar, given {ctx.type(zp)}")
        return ctx.dtype(zp)
    return T.float32 if ctx.has(scale) else T.int32


def _check_activation(ctx, what: str) -> None:
    check_dtype(ctx, 0, ACTIVATIONS, what)
    if ctx.dtype(1) != ctx.dtype(0) or ctx.shape(1) not in ((), (1,)):
        raise ctx.fail(f"the zero point is a scalar of {what}'s type {ctx.dtype(0).name}, "
                       f"given {ctx.type(1)}")
    check_dtype(ctx, 2, (T.int8,), "w")
    check_dtype(ctx, 3, (T.int32,), "w_sums")


def _channel(p: np.ndarray | None, rank: int, axis: int) -> np.ndarray | None:
    """A scalar or per-channel parameter shaped to broadcast along `axis` of rank `rank`."""
    if p is None or p.size == 1:
        return None if p is None else p.reshape(())
    shape = [1] * rank
    shape[axis] = p.size
    return p.reshape(shape)


def finish(acc: np.ndarray, bias, scale, y_zero_point, lo, hi, axis: int) -> np.ndarray:
    """The epilogue of the module docstring on int32 sums `acc`, channels along `axis`."""
    if bias is not None:
        acc = acc + _channel(bias.astype(np.int32), acc.ndim, axis)
    if scale is None:
        return acc.astype(np.int32)
    y = acc.astype(np.float32) * _channel(scale.astype(np.float32), acc.ndim, axis)
    if y_zero_point is None:
        return y.astype(np.float32)
    out = y_zero_point.dtype
    low, high = clamp_bounds(T.DType.from_numpy(out), lo, hi)
    q = np.rint(y) + np.float32(y_zero_point.reshape(()))
    return np.clip(q, low, high).astype(out)


def clamp_bounds(dtype: T.DType, lo, hi) -> tuple[int, int]:
    """The output type's range narrowed by `lo` / `hi` (None: not narrowed)."""
    info = np.iinfo(dtype.np)
    return (info.min if lo is None else max(info.min, lo),
            info.max if hi is None else min(info.max, hi))


def _check_sums(w: np.ndarray, w_sums: np.ndarray) -> None:
    if not np.array_equal(w.astype(np.int64).sum(axis=0), w_sums):
        raise ValueError("w_sums are not the sums of the weights over k")


def finish_expr(acc: Expr, bias: Expr | None, scale: Expr | None, y_zp: Expr | None,
                out: T.DType, lo, hi) -> Expr:
    """`finish` on one int32 sum in loop IR (bias, scale, zero point: that channel's)."""
    if bias is not None:
        acc = acc + widen(T.int32, bias)
    if scale is None:
        return acc
    if y_zp is None:
        return Cast(T.float32, acc) * widen(T.float32, scale)
    # (vector code too: a float -> int cast is legalized lane by lane; the product is NaN
    # only where the scale is NaN or infinite, and gives the bits of its NaN as rounding then
    # adding did)
    return rounded_saturated(unfused(Cast(T.float32, acc), widen(T.float32, scale)),
                             Cast(T.float32, y_zp), out, *clamp_bounds(out, lo, hi))


def _optional(inputs, k: int):
    return inputs[k] if len(inputs) > k else None


# -- QuantizedDense -----------------------------------------------------------------------------


def _dense_infer(ctx):
    _check_activation(ctx, "a")
    if ctx.has(8):
        check_dtype(ctx, 8, (T.float32,), "x_scale")
        if ctx.shape(8) not in ((), (1,)) or not ctx.has(5):
            raise ctx.fail(f"x_scale is a scalar factor of a scale, given {ctx.type(8)}"
                           f"{'' if ctx.has(5) else ' without a scale'}")
    if ctx.has(7):
        check_dtype(ctx, 7, (T.int8,), "w_zero_point")
        if ctx.shape(7) not in ((), (1,), (ctx.attrs["n"],)):
            raise ctx.fail(f"w_zero_point is a scalar or one per column ({ctx.attrs['n']}), "
                           f"given {ctx.type(7)}")
    a, wp, n = ctx.shape(0), ctx.shape(2), ctx.attrs["n"]
    if len(a) >= 2 and len(wp) == 2:
        if wp[0] != n or isinstance(a[-1], int) and wp[1] != -(-a[-1] // ROW_ALIGN) * ROW_ALIGN:
            raise ctx.fail(f"w in rows is [N, ceil(K / {ROW_ALIGN}) * {ROW_ALIGN}], given "
                           f"{wp} for a {a} and {n} columns")
    elif len(a) < 2 or len(wp) != 4 or wp[2:] != (GROUP_COLUMNS, GROUP_DEPTH):
        raise ctx.fail(f"expects a of rank >= 2 and w in groups [ceil(N / 16), ceil(K / 4), "
                       f"16, 4] or rows [N, ceil(K / {ROW_ALIGN}) * {ROW_ALIGN}], given {a}, "
                       f"{wp}")
    elif isinstance(a[-1], int) and isinstance(wp[1], int) and \
            -(-a[-1] // GROUP_DEPTH) != wp[1]:
        raise ctx.fail(f"inner dimensions differ: a {a} and w in groups {wp}")
    elif isinstance(wp[0], int) and wp[0] != -(-n // GROUP_COLUMNS):
        raise ctx.fail(f"{n} columns are {-(-n // GROUP_COLUMNS)} panels, given {wp[0]}")
    if ctx.shape(3) != (n,):
        raise ctx.fail(f"w_sums has one entry per column ({n}), given {ctx.type(3)}")
    out = _check_epilogue(ctx, 4, n)
    return [T.TensorType(out, tuple(a[:-1]) + (n,))]


def quantized_dense(a, a_zero_point, w, w_sums, bias=None, scale=None, y_zero_point=None,
                    w_zero_point=None, x_scale=None, *, n, lo, hi):
    if x_scale is not None:
        scale = np.float32(x_scale.reshape(())) * scale.astype(np.float32)
    wk = dense_weights(w, a.shape[-1], n)
    _check_sums(wk, w_sums)
    wk = wk.astype(np.int64)
    if w_zero_point is not None:
        wk = wk - w_zero_point.astype(np.int64).reshape(-1)
    acc = np.matmul(a.astype(np.int64) - np.int64(a_zero_point.reshape(())), wk)
    return finish(acc.astype(np.int32), bias, scale, y_zero_point, lo, hi, -1)


def _dense_rule(inputs, outputs, *, n, lo, hi):
    a, za, w = inputs[0], inputs[1], inputs[2]
    bias, scale, y_zp, zw, x_scale = (_optional(inputs, k) for k in (4, 5, 6, 7, 8))
    out = outputs[0]
    k = reduce_axis(a.shape[-1], "k")

    def scale_at(j):
        s = scalar_or_per_channel(scale, j)
        return s if x_scale is None else scalar_or_per_channel(x_scale, j) * s

    def element(*idx):
        j = idx[-1]
        av = widen(T.int32, a[tuple(idx[:-1]) + (k.var,)]) - widen(T.int32,
                                                                    scalar_or_per_channel(za, j))
        wv = widen(T.int32, w[j, k.var] if len(w.shape) == 2 else
                   w[j // GROUP_COLUMNS, k.var // GROUP_DEPTH, j % GROUP_COLUMNS,
                     k.var % GROUP_DEPTH])
        if zw is not None:
            wv = wv - widen(T.int32, scalar_or_per_channel(zw, j))
        return finish_expr(reduce_sum(av * wv, k),
                           None if bias is None else scalar_or_per_channel(bias, j),
                           None if scale is None else scale_at(j),
                           None if y_zp is None else scalar_or_per_channel(y_zp, j),
                           out.dtype, lo, hi)

    return [compute(out.shape, element, "quantized_dense", out.dtype)]


register_op("QuantizedDense", pattern=Pattern.OUT_FUSABLE, infer=_dense_infer,
            evaluate=quantized_dense, inputs=(4, 9), compute=_dense_rule,
            attrs={"n": REQUIRED, **QUANT_ATTRS}, weights=(2, 3, 4, 7),
            flops=lambda node: 2 * numel(node.outputs[0]) * Count.of([node.inputs[0].shape[-1]]),
            batched=batching.data_input)


# -- QuantizedConv ------------------------------------------------------------------------------


def _conv_infer(ctx):
    _check_activation(ctx, "x")
    if ctx.type(2).rank < 3:
        raise ctx.fail(f"weights [M, C / group, *kernel], given {ctx.type(2)}")
    m = ctx.shape(2)[0]
    if ctx.shape(3) != (m,):
        raise ctx.fail(f"w_sums has one entry per output channel ({m}), given {ctx.type(3)}")
    out = _check_epilogue(ctx, 4, m)
    return [T.TensorType(out, conv_shape(ctx, 0, 2))]


def _conv_attrs(attrs: dict) -> dict:
    return {k: attrs[k] for k in CONV_ATTRS}


def quantized_conv(x, x_zero_point, w, w_sums, bias=None, scale=None, y_zero_point=None, *,
                   lo, hi, **attrs):
    _check_sums(w.reshape(w.shape[0], -1).T, w_sums)
    xi = x.astype(np.int32) - np.int32(x_zero_point.reshape(()))
    acc = conv(xi, w.astype(np.int32), None, **_conv_attrs(attrs))
    return finish(acc, bias, scale, y_zero_point, lo, hi, 1)


def _conv_rule(inputs, outputs, *, lo, hi, **attrs):
    x, zx, w = inputs[0], inputs[1], inputs[2]
    bias, scale, y_zp = (_optional(inputs, k) for k in (4, 5, 6))
    out = outputs[0]

    def term(xv, wv, m):
        # the zero point shifts loaded pixels only: padding adds 0, as the reference
        return (widen(T.int32, xv) - widen(T.int32, scalar_or_per_channel(zx, m))) * \
            widen(T.int32, wv)

    total = conv_sum(x, w, out.shape, {**CONV_ATTRS, **attrs}, term)

    def element(b, m, *o):
        return finish_expr(total(b, m, *o), *(
            None if p is None else scalar_or_per_channel(p, m) for p in (bias, scale, y_zp)),
            out.dtype, lo, hi)

    return [compute(out.shape, element, "quantized_conv", out.dtype)]


register_op("QuantizedConv", pattern=Pattern.OUT_FUSABLE, infer=_conv_infer,
            evaluate=quantized_conv, inputs=(4, 7), compute=_conv_rule,
            attrs={**CONV_ATTRS, **QUANT_ATTRS}, weights=(2, 3, 4),
            flops=lambda node: conv_flops(node.outputs[0], node.inputs[2].shape[1:],
                                          node.outputs[0], has_input(node, 4)),
            batched=batching.data_input)


# -- QuantizedConvPacked ------------------------------------------------------------------------


def conv_groups_matrix(w: np.ndarray) -> np.ndarray:
    """int8 [M, C, *kernel] (one group) -> the [K', M] matrix whose 4-row groups are 4
    input channels at one kernel tap: row ((c // 4) * taps + tap) * 4 + c % 4, channels
    past C zero (K' = ceil(C / 4) * taps * 4)."""
    m, c = w.shape[:2]
    c4 = -(-c // GROUP_DEPTH)
    full = np.zeros((m, c4 * GROUP_DEPTH) + w.shape[2:], np.int8)
    full[:, :c] = w
    taps = full.reshape(m, c4, GROUP_DEPTH, -1)          # [M, C4, 4, taps]
    return np.ascontiguousarray(taps.transpose(1, 3, 2, 0).reshape(-1, m))


def panel_span(m: int, c: int, group: int) -> int | None:
    """Input channels one packed panel (16 output channels) of a conv of M output and C input
    channels in `group` groups reads: C for one group; for several, those of the groups its
    channels belong to: C / group x 16 / (M / group) where M / group divides 16 (never past
    C), C / group where 16 divides M / group. None where neither, or where C / group is no
    multiple of 4 (a panel's channels would not start a 4-byte group)."""
    if group == 1:
        return c
    cin, cout = c // group, m // group
    if cin % GROUP_DEPTH:
        return None
    if GROUP_COLUMNS % cout == 0:
        return min(c, cin * (GROUP_COLUMNS // cout))
    return cin if cout % GROUP_COLUMNS == 0 else None


def panel_base(panel, m: int, c: int, group: int, lesser=min):
    """The first input channel of packed panel `panel` (an int, or loop IR with `lesser`
    `loop.minimum`): that of its first output channel's group, or C less `panel_span` where
    the span from there would pass C (the last panel of a conv whose M / group divides 16 but
    whose groups do not fill it)."""
    cin, cout = c // group, m // group
    return lesser(panel * GROUP_COLUMNS // cout * cin, c - panel_span(m, c, group))


def pack_conv_groups(w: np.ndarray, group: int = 1) -> np.ndarray:
    """int8 [M, C / group, *kernel] -> [ceil(M / 16), ceil(span / 4) * taps, 16, 4] (span:
    `panel_span`): `pack_groups` of `conv_groups_matrix`, a group of 4 input channels at one
    tap against 16 output channels in one 64-byte row. With several groups each panel is
    packed from `panel_base` on, over the whole-C weights (zero between groups: a product of
    another group's channel adds nothing)."""
    if group == 1:
        return pack_groups(conv_groups_matrix(w))
    m, cin = w.shape[:2]
    c, cout = cin * group, m // group
    span = panel_span(m, c, group)
    full = np.zeros((m, c) + w.shape[2:], np.int8)
    for g in range(group):
        full[g * cout:(g + 1) * cout, g * cin:(g + 1) * cin] = w[g * cout:(g + 1) * cout]
    return np.concatenate([pack_groups(conv_groups_matrix(
        full[jp * GROUP_COLUMNS:(jp + 1) * GROUP_COLUMNS, base:base + span]))
        for jp in range(-(-m // GROUP_COLUMNS)) for base in [panel_base(jp, m, c, group)]])


def unpack_conv_groups(wp: np.ndarray, m: int, c: int, kernel: tuple, group: int = 1
                       ) -> np.ndarray:
    """`pack_conv_groups`' [M, C / group, *kernel] back from its packing."""
    if group > 1:
        span, cin, cout = panel_span(m, c, group), c // group, m // group
        w = np.zeros((m, cin) + tuple(kernel), np.int8)
        for jp in range(wp.shape[0]):
            cols = min(GROUP_COLUMNS, m - jp * GROUP_COLUMNS)
            block = unpack_conv_groups(wp[jp:jp + 1], cols, span, kernel)
            base = panel_base(jp, m, c, group)
            for k in range(cols):
                first = (jp * GROUP_COLUMNS + k) // cout * cin - base
                w[jp * GROUP_COLUMNS + k] = block[k, first:first + cin]
        return w
    c4, taps = -(-c // GROUP_DEPTH), int(np.prod(kernel))
    matrix = unpack_groups(wp, c4 * taps * GROUP_DEPTH, m)
    full = matrix.reshape(c4, taps, GROUP_DEPTH, m).transpose(3, 0, 2, 1)
    return np.ascontiguousarray(full.reshape((m, c4 * GROUP_DEPTH) + tuple(kernel))[:, :c])


def _conv_packed_infer(ctx):
    _check_activation(ctx, "x")
    oc, kernel = ctx.attrs["oc"], tuple(ctx.attrs["kernel_shape"] or ())
    x, wp, group = ctx.shape(0), ctx.shape(2), ctx.attrs["group"]
    if not kernel or len(kernel) != len(x) - 2:
        raise ctx.fail(f"packed groups serve a given kernel_shape of rank {len(x) - 2}, "
                       f"given kernel {kernel}")
    taps = int(np.prod(kernel))
    if isinstance(x[1], int):
        span = None if x[1] % group or oc % group else panel_span(oc, x[1], group)
        if span is None:
            raise ctx.fail(f"{group} groups of {x[1]} input and {oc} output channels have no "
                           f"packed panels (panel_span)")
        if wp != (-(-oc // GROUP_COLUMNS), -(-span // GROUP_DEPTH) * taps, GROUP_COLUMNS,
                  GROUP_DEPTH):
            raise ctx.fail(f"weights of {oc} channels over {span} x {kernel} in groups are "
                           f"[{-(-oc // 16)}, {-(-span // 4) * taps}, 16, 4], given {wp}")
    if ctx.shape(3) != (oc,):
        raise ctx.fail(f"w_sums has one entry per output channel ({oc}), given {ctx.type(3)}")
    out = _check_epilogue(ctx, 4, oc)
    cin = x[1] // group if isinstance(x[1], int) else x[1]
    w = Value("w.unpacked", T.TensorType(T.float32, (oc, cin) + kernel))
    (conv_type,), _, _ = infer_node("Conv", [Value("x.f", T.TensorType(T.float32, x)), w],
                                    _conv_attrs(ctx.attrs), 1, ctx.node_name)
    return [T.TensorType(out, conv_type.shape)]


def quantized_conv_packed(x, x_zero_point, w, w_sums, bias=None, scale=None, y_zero_point=None,
                          *, oc, lo, hi, **attrs):
    full = unpack_conv_groups(w, oc, x.shape[1], tuple(attrs["kernel_shape"]), attrs["group"])
    return quantized_conv(x, x_zero_point, full, w_sums, bias, scale, y_zero_point, lo=lo, hi=hi,
                          **attrs)


def _conv_packed_rule(inputs, outputs, *, oc, lo, hi, **attrs):
    x, wp = inputs[0], inputs[2]
    kernel, group = tuple(attrs["kernel_shape"]), attrs["group"]
    taps = int(np.prod(kernel))
    c = const_int(x.shape[1])
    if group > 1 and c is None:
        raise NoCompute(f"the input channels {x.shape[1]} of {group} groups are not known")
    cin = x.shape[1] if group == 1 else c // group

    def weight(m, c_in, *k):
        tap = 0
        for d, i in zip(kernel, k):
            tap = tap * d + i
        if group > 1:   # the channel's place in its panel's span
            c_in = m // (oc // group) * cin + c_in - panel_base(m // GROUP_COLUMNS, oc, c,
                                                                 group, minimum)
        g = (c_in // GROUP_DEPTH) * taps + tap
        return wp[m // GROUP_COLUMNS, g, m % GROUP_COLUMNS, c_in % GROUP_DEPTH]

    # the unpacking stage has no reduction: lowering inlines it into the conv's loads
    w = compute((oc, cin) + kernel, weight, "unpack", T.int8)
    return _conv_rule([x, inputs[1], w] + list(inputs[3:]), outputs, lo=lo, hi=hi, **attrs)


register_op("QuantizedConvPacked", pattern=Pattern.OUT_FUSABLE, infer=_conv_packed_infer,
            evaluate=quantized_conv_packed, inputs=(4, 7), compute=_conv_packed_rule,
            attrs={**CONV_ATTRS, **QUANT_ATTRS, "oc": REQUIRED}, weights=(2, 3, 4),
            flops=lambda node: conv_flops(node.outputs[0], (
                node.inputs[0].shape[1] // node.attrs["group"],) + tuple(
                node.attrs["kernel_shape"]), node.outputs[0], has_input(node, 4)),
            batched=batching.data_input)


# -- QuantizedConvNHWC --------------------------------------------------------------------------
#
# QuantizedConvNHWC(x, x_zero_point, w, w_sums, bias, scale, y_zero_point, w_tap_sums) is
# QuantizedConv on channels-last tensors: x [N, H, W, C], w [M, kh, kw, C] (OHWI, one group),
# y [N, OH, OW, M]. `w_tap_sums` [M, kh * kw] (optional) holds each output channel's
# weights summed over C at each tap (row-major taps), derived at compile time like w_sums:
# a kernel that reads the padding as 0 rather than as the zero point adds back
# x_zero_point * w_tap_sums[m, tap] for each tap of a pixel's window that falls outside the
# image. The reference checks it and never computes with it.


def tap_sums(w: np.ndarray) -> np.ndarray:
    """int8 OHWI [M, kh, kw, C] -> int32 [M, kh * kw], the sums over C at each tap."""
    return w.astype(np.int32).sum(axis=3, dtype=np.int32).reshape(w.shape[0], -1)


def _nchw(shape) -> tuple:
    return tuple(shape[i] for i in NCHW_OF_NHWC)


def _conv_nhwc_infer(ctx):
    _check_activation(ctx, "x")
    x, w = ctx.shape(0), ctx.shape(2)
    if len(x) != 4 or len(w) != 4 or ctx.attrs["group"] != 1 or \
            (isinstance(x[3], int) and w[3] != x[3]):
        raise ctx.fail(f"channels-last x [N, H, W, C] and one group's w [M, kh, kw, C], "
                       f"given {x}, {w}, group {ctx.attrs['group']}")
    m = w[0]
    if ctx.shape(3) != (m,):
        raise ctx.fail(f"w_sums has one entry per output channel ({m}), given {ctx.type(3)}")
    if ctx.has(7):
        check_dtype(ctx, 7, (T.int32,), "w_tap_sums")
        if ctx.shape(7) != (m, w[1] * w[2]):
            raise ctx.fail(f"w_tap_sums is [{m}, {w[1] * w[2]}], given {ctx.type(7)}")
    out = _check_epilogue(ctx, 4, m)
    inputs = [Value("x.f", T.TensorType(T.float32, _nchw(x))),
              Value("w.f", T.TensorType(T.float32, _nchw(w)))]
    (conv_type,), _, _ = infer_node("Conv", inputs, _conv_attrs(ctx.attrs), 1, ctx.node_name)
    return [T.TensorType(out, tuple(conv_type.shape[i] for i in NHWC_OF_NCHW))]


def quantized_conv_nhwc(x, x_zero_point, w, w_sums, bias=None, scale=None, y_zero_point=None,
                        w_tap_sums=None, *, lo, hi, **attrs):
    if w_tap_sums is not None and not np.array_equal(tap_sums(w), w_tap_sums):
        raise ValueError("w_tap_sums are not the sums of the weights over C at each tap")
    y = quantized_conv(x.transpose(NCHW_OF_NHWC), x_zero_point, w.transpose(NCHW_OF_NHWC),
                       w_sums, bias, scale, y_zero_point, lo=lo, hi=hi, **attrs)
    return np.ascontiguousarray(y.transpose(NHWC_OF_NCHW))


def _conv_nhwc_rule(inputs, outputs, *, lo, hi, **attrs):
    x, zx, w = inputs[0], inputs[1], inputs[2]
    bias, scale, y_zp = (_optional(inputs, k) for k in (4, 5, 6))
    out = outputs[0]
    # channels-first views, inlined into the conv's loads (no reduction in them)
    xv, wv = (compute(_nchw(t.shape), lambda n, c, h, wid, t=t: t[n, h, wid, c],
                      f"{name}_nchw", t.dtype) for t, name in ((x, "x"), (w, "w")))

    def term(xe, we, m):
        return (widen(T.int32, xe) - widen(T.int32, scalar_or_per_channel(zx, m))) * \
            widen(T.int32, we)

    total = conv_sum(xv, wv, _nchw(out.shape), {**CONV_ATTRS, **attrs}, term)

    def element(b, oy, ox, m):
        return finish_expr(total(b, m, oy, ox), *(
            None if p is None else scalar_or_per_channel(p, m) for p in (bias, scale, y_zp)),
            out.dtype, lo, hi)

    return [compute(out.shape, element, "quantized_conv_nhwc", out.dtype)]


register_op("QuantizedConvNHWC", pattern=Pattern.OUT_FUSABLE, infer=_conv_nhwc_infer,
            evaluate=quantized_conv_nhwc, inputs=(4, 8), compute=_conv_nhwc_rule,
            attrs={**CONV_ATTRS, **QUANT_ATTRS}, weights=(2, 3, 4, 7),
            flops=lambda node: conv_flops(node.outputs[0], node.inputs[2].shape[1:],
                                          node.outputs[0], has_input(node, 4)),
            batched=batching.data_input)


# -- QuantizedTable -----------------------------------------------------------------------------


TABLE_SIZE = 256
"""Entries of a QuantizedTable: one per value of an 8-bit input, from the type's minimum."""


def _table_infer(ctx):
    check_dtype(ctx, 0, ACTIVATIONS, "x")
    check_dtype(ctx, 1, ACTIVATIONS, "table")
    if ctx.shape(1) != (TABLE_SIZE,):
        raise ctx.fail(f"the table has one entry per 8-bit value ({TABLE_SIZE}), given "
                       f"{ctx.type(1)}")
    return [T.TensorType(ctx.dtype(1), ctx.shape(0))]


def quantized_table(x, table):
    return table[x.astype(np.int32) - int(np.iinfo(x.dtype).min)]


def _table_rule(inputs, outputs):
    x, table = inputs
    out = outputs[0]
    low = int(np.iinfo(x.dtype.np).min)

    def element(*idx):
        return table[widen(T.int32, x[idx]) - const(low, T.int32)]

    return [compute(out.shape, element, "table", out.dtype)]


# y = table[x - min of x's type]: what an elementwise chain between quantizations of one 8-bit
# value computes (fuse_quantized's `tabled`), evaluated once for every value
register_op("QuantizedTable", pattern=Pattern.ELEMWISE, infer=_table_infer,
            evaluate=quantized_table, inputs=2, compute=_table_rule, params=(1,),
            batched=batching.data_input)
