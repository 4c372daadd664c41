"""Ops over weights stored in a packed layout: what `convert_layout` makes of an op whose
weights are constant, so a target's template streams them contiguously without repacking
them on every call. Frontends never produce these ops.

ConvPacked(x, w_packed, b) is Conv(x, unpack(w_packed), b) (with `precision` "bf16": of x
rounded to bf16 and the weights rounded to bf16 in pairs along C, `pack_conv_pairs`,
[group * ceil(M / group / NR), ceil(C / group / 2), *kernel, NR, 2], C / group even where
group > 1, so that a pair never straddles two groups): w_packed is
[group * ceil(M / group / NR), C / group, *kernel, NR], each group's M / group output
channels in blocks of NR of their own: channel j of group g at [g * ceil(M / group / NR) +
j // NR, ..., j % NR], channels past a group's last zero (so a block never straddles two
groups; with group 1, channel m at [m // NR, ..., m % NR]). `oc` (M) and the Conv attributes
are attributes.

MaxPoolNHWC(x) is a 2-D MaxPool (its Y only) of a channels-last x [N, H, W, C], y [N, OH,
OW, C], the MaxPool attributes as MaxPool's: what `sink_transposes` makes of a MaxPool
between two ConvNHWC, so the image stays channels-last across it (consecutive threads read
consecutive channels) instead of a Transpose each side.

ConvNHWC(x, w, b) is a 2-D Conv on channels-last tensors: x [N, H, W, C], w [M, kh, kw,
C / group] (OHWI), y [N, OH, OW, M], the Conv attributes as Conv's (pads, strides, dilations
over (H, W), group); `convert_layout`'s "nhwc_conv" makes it, ungrouped or grouped in
whole 16-byte chunks of channels a group for the cuda tensor-core template (a patch's
channels are contiguous: 16-byte cp.async copies) and depthwise (consecutive threads read
consecutive channels), with Transposes at its edges.
"""

from __future__ import annotations

import numpy as np

from .. import batching
from .. import types as T
from ..compute import compute
from ..graph import Value
from ..flops import has_input
from .conv import CONV_ATTRS, conv, conv_flops, conv_rule, conv_sum
from ..loop import Cast
from .linalg import PACKED_PRECISIONS, acc_dtype, widen
from .pool import POOL_ATTRS, max_pool, window_flops, window_maximum
from .window import Windows
from .registry import REQUIRED, Pattern, infer_node, register_op


def pack_conv_weights(w: np.ndarray, nr: int, group: int = 1) -> np.ndarray:
    """[M, C / group, *kernel] -> [group * ceil(M / group / nr), C / group, *kernel, nr],
    each group's channels zero-padded to whole blocks."""
    m = w.shape[0]
    mg = m // group
    blocks = -(-mg // nr)
    padded = np.zeros((group, blocks * nr) + w.shape[1:], w.dtype)
    padded[:, :mg] = w.reshape((group, mg) + w.shape[1:])
    lead = padded.reshape((group * blocks, nr) + w.shape[1:])
    return np.ascontiguousarray(np.moveaxis(lead, 1, -1))


def round_tf32(a: np.ndarray) -> np.ndarray:
    """float32 `a` rounded to tf32's 10 mantissa bits as PTX's `cvt.rna.tf32.f32` rounds
    (to nearest, ties away from zero; infinities and NaN kept), still float32: weights so
    rounded once at compile time need no rounding in a tf32 product's tiles."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits)
    return rounded.astype(np.uint32).view(np.float32).reshape(np.shape(a))


def is_tf32(a: np.ndarray) -> bool:
    """Whether every element of float32 `a` is a tf32 value (its 13 low mantissa bits 0, or
    it is not finite)."""
    a = np.asarray(a)
    if a.dtype != np.float32:
        return False
    bits = np.ascontiguousarray(a).view(np.uint32)
    return bool(np.all(((bits & 0x1FFF) == 0) | ((bits & 0x7F800000) == 0x7F800000)))


VALUE_PRESERVING = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
                              "Identity"})
"""Ops whose output holds exactly their first input's values, rearranged."""


def holds_tf32(v: Value) -> bool:
    """Whether float32 value `v` holds tf32 values only: a constant of them (`round_tf32`),
    or the output of a RoundTF32 (passes/store_tf32.py), through VALUE_PRESERVING ops."""
    while v.const is None and v.producer is not None and v.producer.op in VALUE_PRESERVING:
        v = v.producer.inputs[0]
    if v.const is not None:
        return is_tf32(v.const)
    return v.producer is not None and v.producer.op == "RoundTF32"


def pack_conv_pairs(w: np.ndarray, nr: int, group: int = 1) -> np.ndarray:
    """[M, C / group, *kernel] float32 -> [group * ceil(M / group / nr), ceil(C / group / 2),
    *kernel, nr, 2] bfloat16 (rounded to nearest even): `pack_conv_weights`' blocks with
    input channels 2t and 2t + 1 side by side (one 32-bit word, as vdpbf16ps reads an
    operand), C / group padded with a zero channel when odd."""
    m, c = w.shape[:2]
    even = np.zeros((m, -(-c // 2) * 2) + w.shape[2:], np.float32)
    even[:, :c] = w
    blocks = pack_conv_weights(even, nr, group)   # [B, 2 C2, *kernel, nr]
    pairs = blocks.reshape((blocks.shape[0], -1, 2) + blocks.shape[2:])
    return np.ascontiguousarray(np.moveaxis(pairs, 2, -1)).astype(T.bfloat16.np)


def unpack_conv_pairs(wp: np.ndarray, oc: int, c: int, group: int = 1) -> np.ndarray:
    """`pack_conv_pairs`' [M, C / group, *kernel] (as float32; `c`: C / group) back from its
    packing."""
    blocks = np.moveaxis(wp.astype(np.float32), -1, 2)
    blocks = blocks.reshape((blocks.shape[0], -1) + blocks.shape[3:])
    return unpack_conv_weights(blocks, oc, group)[:, :c]


def unpack_conv_weights(wp: np.ndarray, oc: int, group: int = 1) -> np.ndarray:
    blocks, nr = wp.shape[0] // group, wp.shape[-1]
    full = np.moveaxis(wp, -1, 1).reshape((group, blocks * nr) + wp.shape[1:-1])
    return full[:, :oc // group].reshape((oc,) + wp.shape[1:-1])


def _conv_attrs(attrs: dict) -> dict:
    return {k: attrs[k] for k in CONV_ATTRS}


def _unpacked_type(wp: T.TensorType, oc: int, c) -> T.TensorType:
    """The weights' [M, C / group, *kernel] type (`c`: C / group where B is in pairs)."""
    if c is None:
        return T.TensorType(wp.dtype, (oc,) + tuple(wp.shape[1:-1]))
    return T.TensorType(T.float32, (oc, c) + tuple(wp.shape[2:-2]))


def _conv_packed_infer(ctx):
    wp = ctx.type(1)
    oc, group = ctx.attrs["oc"], ctx.attrs.get("group") or 1
    precision = ctx.attrs.get("precision", "fp32")   # (graphs saved before precisions)
    pairs = precision == "bf16"
    if precision not in PACKED_PRECISIONS:
        raise ctx.fail(f"precision must be one of {', '.join(PACKED_PRECISIONS)}, not "
                       f"{precision!r}")
    channels = ctx.type(0).shape[1]
    if pairs and (ctx.type(0).dtype is not T.float32 or wp.dtype is not T.bfloat16 or
                  wp.rank < 4 or wp.shape[-1] != 2 or
                  (group > 1 and (not isinstance(channels, int) or channels % (2 * group))) or
                  -(-channels // 2) // group != wp.shape[1]):
        raise ctx.fail(f"bf16 pairs are weights [blocks, ceil(C / group / 2), *kernel, NR, "
                       f"2] (C / group even where group > 1) for a float32 image, given "
                       f"{wp} for {ctx.type(0)} in {group} group(s)")
    if wp.rank < 3:
        raise ctx.fail(f"packed weights need rank >= 3, given {wp}")
    blocks, nr = wp.shape[0], wp.shape[-2 if pairs else -1]
    if isinstance(blocks, int) and isinstance(nr, int) and \
            blocks != group * -(-(oc // group) // nr):
        raise ctx.fail(f"packed weights of {oc} output channels in {group} group(s) have "
                       f"{group * -(-(oc // group) // nr)} blocks of {nr}, given {blocks}")
    c = (channels if group == 1 else channels // group) if pairs else None
    w = Value("w.unpacked", _unpacked_type(wp, oc, c))
    inputs = [ctx.values[0], w] + ([ctx.values[2]] if ctx.has(2) else [])
    types, _, _ = infer_node("Conv", inputs, _conv_attrs(ctx.attrs), 1, ctx.node_name)
    return types


def conv_packed(x, wp, b=None, *, oc, precision="fp32", **attrs):
    group = attrs.get("group") or 1
    if precision == "bf16":   # the image rounded to bf16 too
        w = unpack_conv_pairs(wp, oc, x.shape[1] // group, group)
        return conv(x.astype(T.bfloat16.np).astype(np.float32), w, b, **_conv_attrs(attrs))
    return conv(x, unpack_conv_weights(wp, oc, group), b,
                **_conv_attrs(attrs))


def _conv_packed_pairs_rule(inputs, outputs, *, oc, **attrs):
    """ConvPacked at bf16: the image rounded to bf16 and the weights read from their pairs,
    both stages inlined into the conv's loads."""
    x, wp = inputs[0], inputs[1]
    group = attrs.get("group") or 1
    block = _block_of(oc, group, wp.shape[0] // group, wp.shape[-2])
    shape = (oc, x.shape[1] // group) + tuple(wp.shape[2:-2])
    w = compute(shape, lambda m, c, *rest: Cast(T.float32, wp[
        (block(m)[0], c // 2) + rest + (block(m)[1], c % 2)]), "unpack", T.float32)
    xr = compute(x.shape, lambda *i: Cast(T.float32, Cast(T.bfloat16, x[i])), "round",
                 T.float32)
    return conv_rule([xr, w] + list(inputs[2:]), outputs, **_conv_attrs(attrs))


def _block_of(oc: int, group: int, blocks: int, nr: int):
    """(the block, the lane) of output channel m in packed weights of `blocks` blocks of `nr`
    a group."""
    mg = oc // group

    def block(m):
        if group == 1:
            return m // nr, m % nr
        j = m % mg
        return (m // mg) * blocks + j // nr, j % nr
    return block


def _conv_packed_rule(inputs, outputs, *, oc, precision="fp32", **attrs):
    if precision == "bf16":
        return _conv_packed_pairs_rule(inputs, outputs, oc=oc, **attrs)
    x, wp = inputs[0], inputs[1]
    group = attrs.get("group") or 1
    shape = (oc,) + tuple(wp.shape[1:-1])
    block = _block_of(oc, group, wp.shape[0] // group, wp.shape[-1])
    # the unpacking stage has no reduction: lowering inlines it into the conv's loads
    w = compute(shape, lambda m, *rest: wp[(block(m)[0],) + rest + (block(m)[1],)], "unpack",
                wp.dtype)
    return conv_rule([x, w] + list(inputs[2:]), outputs, **_conv_attrs(attrs))


def _conv_packed_flops(node):
    """Conv's, over the weights' window [C_in/group, *kernel]: the packed weights'
    [blocks, C_in/group, *kernel, NR], or in pairs [blocks, ceil(C_in/2), *kernel, NR, 2]."""
    wp = node.inputs[1].shape
    group = node.attrs.get("group") or 1
    window = (node.inputs[0].shape[1] // group,) + tuple(wp[2:-2]) \
        if node.attrs.get("precision") == "bf16" else wp[1:-1]
    return conv_flops(node.outputs[0], window, node.outputs[0], has_input(node, 2))


register_op("ConvPacked", pattern=Pattern.OUT_FUSABLE, infer=_conv_packed_infer,
            evaluate=conv_packed, attrs={**CONV_ATTRS, "oc": REQUIRED, "precision": "fp32"},
            inputs=(2, 3), compute=_conv_packed_rule,
            flops=_conv_packed_flops,
            batched=batching.data_input)


NCHW_OF_NHWC = (0, 3, 1, 2)
"""The Transpose perm taking an NHWC tensor to NCHW (OHWI weights to OIHW)."""
NHWC_OF_NCHW = (0, 2, 3, 1)
"""The Transpose perm taking an NCHW tensor to NHWC (OIHW weights to OHWI)."""


CHUNK_BYTES = 16
"""A cp.async copy's bytes: cuda's channels-last convs copy a patch's channels in such chunks
(`convert_layout` converts convs whose channels fill them whole)."""


def channels_fill_chunks(channels: int, itemsize: int) -> bool:
    """Whether a run of `channels` values of `itemsize` bytes is whole `CHUNK_BYTES` chunks:
    the condition on a grouped ConvNHWC's channels a group (convert_layout makes no other;
    cuda's tensor-core conv takes each group's patches as whole copies)."""
    return channels * itemsize % CHUNK_BYTES == 0


def _nchw_type(t: T.TensorType) -> T.TensorType:
    return T.TensorType(t.dtype, tuple(t.shape[i] for i in NCHW_OF_NHWC))


def _conv_nhwc_infer(ctx):
    for i, what in ((0, "x"), (1, "w")):
        if ctx.type(i).rank != 4:
            raise ctx.fail(f"ConvNHWC's {what} has rank 4, given {ctx.type(i)}")
    inputs = [Value("x.nchw", _nchw_type(ctx.type(0))),
              Value("w.oihw", _nchw_type(ctx.type(1)))] + \
        ([ctx.values[2]] if ctx.has(2) else [])
    (out,), _, _ = infer_node("Conv", inputs, _conv_attrs(ctx.attrs), 1, ctx.node_name)
    return [T.TensorType(out.dtype, tuple(out.shape[i] for i in NHWC_OF_NCHW))]


def conv_nhwc(x, w, b=None, **attrs):
    y = conv(x.transpose(NCHW_OF_NHWC), w.transpose(NCHW_OF_NHWC), b, **_conv_attrs(attrs))
    return np.ascontiguousarray(y.transpose(NHWC_OF_NCHW))


def _conv_nhwc_rule(inputs, outputs, **attrs):
    x, w = inputs[0], inputs[1]
    # channels-first views, inlined into the conv's loads (no reduction in them)
    views = [compute(tuple(t.shape[i] for i in NCHW_OF_NHWC),
                     lambda n, c, h, wid, t=t: t[n, h, wid, c], f"{name}_nchw", t.dtype)
             for t, name in ((x, "x"), (w, "w"))]
    b = inputs[2] if len(inputs) > 2 else None
    (out,) = outputs
    acc = acc_dtype(out.dtype)
    nchw = tuple(out.shape[i] for i in NCHW_OF_NHWC)
    total = conv_sum(*views, nchw, {**CONV_ATTRS, **attrs},
                     lambda xv, wv, m: widen(acc, xv) * widen(acc, wv))

    def element(n, oy, ox, m):
        y = total(n, m, oy, ox)
        return y if b is None else y + widen(acc, b[m])

    return [compute(out.shape, element, "conv_nhwc", out.dtype)]


register_op("ConvNHWC", pattern=Pattern.OUT_FUSABLE, infer=_conv_nhwc_infer,
            evaluate=conv_nhwc, attrs=CONV_ATTRS, inputs=(2, 3), compute=_conv_nhwc_rule,
            flops=lambda node: conv_flops(node.outputs[0], node.inputs[1].shape[1:],
                                          node.outputs[0], has_input(node, 2)),
            batched=batching.data_input)


def _max_pool_nhwc_infer(ctx):
    if ctx.type(0).rank != 4:
        raise ctx.fail(f"MaxPoolNHWC's x has rank 4, given {ctx.type(0)}")
    (out,), _, _ = infer_node("MaxPool", [Value("x.nchw", _nchw_type(ctx.type(0)))],
                              ctx.attrs, 1, ctx.node_name)
    return [T.TensorType(out.dtype, tuple(out.shape[i] for i in NHWC_OF_NCHW))]


def max_pool_nhwc(x, **attrs):
    y = max_pool(x.transpose(NCHW_OF_NHWC), **attrs)[0]
    return np.ascontiguousarray(y.transpose(NHWC_OF_NCHW))


def _max_pool_nhwc_rule(inputs, outputs, **attrs):
    """The window maximum (as MaxPool's Y), read through a channels-first view of x."""
    x, (out,) = inputs[0], outputs
    view = compute(tuple(x.shape[i] for i in NCHW_OF_NHWC),
                   lambda n, c, h, wid: x[n, h, wid, c], "x_nchw", x.dtype)
    kernel = attrs["kernel_shape"]
    win = Windows.of(view, tuple(out.shape[i] for i in NCHW_OF_NHWC), kernel, attrs)
    return [compute(out.shape, lambda n, oy, ox, c: window_maximum(
        view, win, kernel, n, c, (oy, ox)), "max_pool_nhwc", x.dtype)]


register_op("MaxPoolNHWC", pattern=Pattern.OPAQUE, infer=_max_pool_nhwc_infer,
            evaluate=max_pool_nhwc, attrs=POOL_ATTRS, compute=_max_pool_nhwc_rule,
            flops=window_flops, batched=batching.data_input)
