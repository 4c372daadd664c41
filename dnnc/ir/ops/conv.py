"""Convolution ops: Conv, ConvInteger, ConvTranspose, Col2Im, CausalConvWithState, DeformConv.

Layout is ONNX's channels-first (N, C, D1, ..., Dn). The references are short but not naive:
the numpy target runs whole models (ResNet-50) with them, so a convolution is one matmul over an
im2col matrix gathered with one strided slice per kernel offset; nothing loops over output
pixels in Python. `conv` is public for other families (QLinearConv, ConvPacked).

Compute rules are written as TVM's topi writes them: a convolution is one `reduce_sum` over
(input channel, kernel window) per output element, padding excluded by a `where` condition so
that no load outside the input is ever taken; padding decisions come from the same geometry
helpers (`window.py`) as the references. `conv_sum` is public for QLinearConv.
"""

from __future__ import annotations

import math

import numpy as np

from .. import batching
from .. import types as T
from ..compute import NoCompute, Tensor, compute, reduce_axis, reduce_sum
from ..loop import Cast, Const, Expr, Select, call, const, eq, logical_and, maximum, minimum
from .index_exprs import const_int
from .infer import check_dtype, check_same_dtype
from .linalg import acc_dtype, widen
from ..flops import Count, has_input, numel
from .registry import Pattern, register_op
from .window import AUTO_PADS, SAME, Windows, check_image, compute_dtype, kernel_axes, \
    kernel_offsets, pad_for_windows, reduced_axes, spatial_attrs, window_attrs, window_dims, \
    window_geometry, window_slices

FLOATS = T.FLOAT_DTYPES


def _exact_div(d: Expr, q: int):
    """d // q as an int when d is constant (q divides d, as inference checked)."""
    return d.value // q if isinstance(d, Const) else d // q


def _col2im(cols, image, kernel, strides, dilations, begins):
    """The adjoint of the im2col gather: adds cols[:, :, j, o] into image position
    o*s + j*d - begin, dropping what falls outside the image (cols: (N, C, K, *blocks))."""
    blocks = cols.shape[3:]
    full = [(b - 1) * s + d * (k - 1) + 1
            for b, s, d, k in zip(blocks, strides, dilations, kernel)]
    buf = np.zeros(cols.shape[:2] + tuple(full), cols.dtype)
    for j, view in enumerate(window_slices(buf, blocks, kernel, strides, dilations)):
        view += cols[:, :, j]
    out = np.zeros(cols.shape[:2] + tuple(image), cols.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for n, f, b in zip(image, full, begins):
        lo, hi = max(b, 0), min(f, b + n)
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - b, hi - b))
    out[tuple(dst)] = buf[tuple(src)]
    return out


# -- Conv, ConvInteger ------------------------------------------------------------------------


def conv(x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    """ONNX Conv on NumPy arrays (any number of spatial axes, groups, dilations).

    Float inputs give their own dtype; integer inputs (zero points already subtracted) give
    exact int32 sums, as ConvInteger and QLinearConv need.
    """
    nd = x.ndim - 2
    kernel = list(kernel_shape or w.shape[2:])
    strides, dilations, pads = window_attrs(nd, strides, dilations, pads)
    outs, begins, _ = window_geometry(x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    acc = compute_dtype(x.dtype)
    n, m = x.shape[0], w.shape[0]
    xp = pad_for_windows(x.astype(acc, copy=False), outs, kernel, strides, dilations, begins, 0)
    # im2col: (N, C, K, *outs) -> (N, G, C/G*K, P), matching w's (M, C/G, *kernel) layout
    cols = np.stack(list(window_slices(xp, outs, kernel, strides, dilations)), axis=2)
    cols = cols.reshape(n, group, -1, math.prod(outs))
    wm = w.astype(acc, copy=False).reshape(group, m // group, -1)
    y = np.matmul(wm, cols).reshape((n, m) + tuple(outs))
    if b is not None:
        y += b.astype(acc, copy=False).reshape((m,) + (1,) * nd)
    if x.dtype.kind in "iu":
        return np.rint(y).astype(np.int32)
    return y.astype(x.dtype, copy=False)


def conv_shape(ctx, x_i=0, w_i=1):
    """(N, M, *out) of a convolution of input x_i with weights w_i; checks channels."""
    nd = check_image(ctx, x_i)
    xs, ws = ctx.shape(x_i), ctx.shape(w_i)
    if len(ws) != nd + 2:
        raise ctx.fail(f"weights must have rank {nd + 2} for this input, given {ctx.type(w_i)}")
    kernel = ctx.attrs.get("kernel_shape") or ws[2:]
    if T.static_shape(kernel) is None:
        raise ctx.fail(f"kernel_shape is needed when the weights' shape {ctx.type(w_i)} is "
                       f"symbolic")
    kernel, strides, dilations, pads = spatial_attrs(ctx, nd, kernel)
    group = ctx.attrs["group"]
    if group < 1:
        raise ctx.fail(f"group must be positive, given {group}")
    c, m, cg = xs[1], ws[0], ws[1]
    if isinstance(c, int) and isinstance(cg, int) and c != cg * group:
        raise ctx.fail(f"input has {c} channels but weights expect {cg} x group {group}")
    if isinstance(m, int) and m % group:
        raise ctx.fail(f"{m} output channels do not split into {group} groups")
    outs = window_dims(ctx, xs[2:], kernel, strides, dilations, pads,
                        ctx.attrs.get("auto_pad", "NOTSET"))
    return (xs[0], m) + tuple(outs)


def _check_bias(ctx, i, m):
    if ctx.has(i):
        shape = ctx.shape(i)
        if len(shape) != 1 or (isinstance(m, int) and isinstance(shape[0], int)
                               and shape[0] != m):
            raise ctx.fail(f"bias must have shape [{m}], given {ctx.type(i)}")


def _conv_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    check_same_dtype(ctx)
    shape = conv_shape(ctx)
    _check_bias(ctx, 2, shape[1])
    return [T.TensorType(ctx.dtype(0), shape)]


CONV_ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
              "pads": None, "strides": None}


def conv_sum(x: Tensor, w: Tensor, out_shape, attrs, term):
    """A convolution's sum as `fn(n, m, *o)`: reduce_sum over the group's input channels c and
    the kernel offsets of `term(x value, w value, m)`, padding excluded by `where`."""
    kernel = [const_int(d) for d in w.shape[2:]]
    if None in kernel:
        kernel = attrs.get("kernel_shape")
        if not kernel:
            raise NoCompute(f"kernel sizes {w.shape[2:]} are not known")
    win = Windows.of(x, out_shape, kernel, attrs)
    group, cg = attrs["group"], w.shape[1]
    mg = _exact_div(w.shape[0], group)    # output channels per group
    rc = None if cg == const(1) else reduce_axis(cg, "rc")
    rk = kernel_axes(kernel)
    axes = reduced_axes(rc, *rk)

    def total(n, m, *o):
        c = const(0) if rc is None else rc.var
        g = m if isinstance(mg, int) and mg == 1 else m // mg    # m's group
        ic = c if group == 1 else g * cg + c
        ks = kernel_offsets(rk)
        pos, inside = win.reads(o, ks)
        return reduce_sum(term(x[(n, ic, *pos)], w[(m, c, *ks)], m), axes, where=inside)

    return total


def conv_rule(inputs, outputs, **attrs):
    x, w, b = (list(inputs) + [None])[:3]
    out = outputs[0]
    acc = acc_dtype(out.dtype)
    total = conv_sum(x, w, out.shape, attrs, lambda xv, wv, m: widen(acc, xv) * widen(acc, wv))

    def element(n, m, *o):
        y = total(n, m, *o)
        return y if b is None else y + widen(acc, b[m])

    return [compute(out.shape, element, "conv", out.dtype)]


def conv_flops(each, window, out, bias: bool) -> Count:
    """2 per multiply-add: each element of `each` (the output; ConvTranspose: the input, which
    it scatters) meets a `window` of weights (dims C_in/group x kernel, or ConvTranspose's
    C_out/group x kernel), + one per output element for a bias."""
    flops = 2 * numel(each) * Count.of(window)
    return flops + numel(out) if bias else flops


register_op("Conv", pattern=Pattern.OUT_FUSABLE, infer=_conv_infer, evaluate=conv,
            attrs=CONV_ATTRS, inputs=(2, 3), compute=conv_rule, weights=(1, 2),
            flops=lambda node: conv_flops(node.outputs[0], node.inputs[1].shape[1:],
                                          node.outputs[0], has_input(node, 2)),
            batched=batching.data_input)


def _zero_point(zp, shape):
    if zp is None:
        return np.int32(0)
    return zp.astype(np.int32).reshape(shape if zp.size > 1 else ())


def conv_integer(x, w, x_zero_point=None, w_zero_point=None, **attrs):
    nd = x.ndim - 2
    xi = x.astype(np.int32) - _zero_point(x_zero_point, ())
    wi = w.astype(np.int32) - _zero_point(w_zero_point, (-1,) + (1,) * (nd + 1))
    return conv(xi, wi, **attrs)


def _conv_integer_infer(ctx):
    int8s = (T.int8, T.uint8)
    for i, what in ((0, "x"), (1, "w"), (2, "x_zero_point"), (3, "w_zero_point")):
        check_dtype(ctx, i, int8s, what)
    check_same_dtype(ctx, 0, 2)
    check_same_dtype(ctx, 1, 3)
    if ctx.has(2) and ctx.type(2).numel != 1:
        raise ctx.fail(f"x_zero_point must be a scalar, given {ctx.type(2)}")
    shape = conv_shape(ctx)
    if ctx.has(3) and ctx.type(3).numel not in (1, shape[1]):
        raise ctx.fail(f"w_zero_point must be a scalar or one per output channel, "
                       f"given {ctx.type(3)}")
    return [T.TensorType(T.int32, shape)]


def scalar_or_per_channel(p: Tensor | None, m: Expr) -> Expr:
    """A zero point or scale in int32 or its own float type: the tensor's one value, or entry
    m of a vector of one per output channel."""
    if p is None:
        return const(0, T.int32)
    if all(d == const(1) for d in p.shape):
        return p[(0,) * p.ndim] if p.ndim else p[()]
    if p.ndim != 1:
        raise NoCompute(f"a per-channel parameter of shape {p.shape} is not a vector")
    return p[m]


def _conv_integer_rule(inputs, outputs, **attrs):
    x, w, x_zp, w_zp = (list(inputs) + [None] * 2)[:4]
    out = outputs[0]

    def term(xv, wv, m):
        # zero points are subtracted from loaded pixels only: padding stays 0, as the reference
        xz, wz = scalar_or_per_channel(x_zp, m), scalar_or_per_channel(w_zp, m)
        return (widen(T.int32, xv) - widen(T.int32, xz)) * (widen(T.int32, wv) -
                                                            widen(T.int32, wz))

    return [compute(out.shape, conv_sum(x, w, out.shape, attrs, term), "conv_integer",
                    T.int32)]


register_op("ConvInteger", pattern=Pattern.OUT_FUSABLE, infer=_conv_integer_infer,
            evaluate=conv_integer, attrs=CONV_ATTRS, inputs=(2, 4), compute=_conv_integer_rule,
            flops=lambda node: conv_flops(node.outputs[0], node.inputs[1].shape[1:],
                                          node.outputs[0], False),
            batched=batching.data_input)

# -- ConvTranspose, Col2Im ---------------------------------------------------------------------


def transpose_geometry(sizes, kernel, strides, dilations, pads, output_padding=None,
                       output_shape=None, auto_pad="NOTSET"):
    """Output sizes and begin pads of a transposed convolution over static input sizes.

    Output position o is full-result position o + begin, the full result being
    s*(n-1) + d*(k-1) + 1 + output_padding long. A given output_shape (or SAME) fixes the
    sizes and the pads follow; a negative total pad only extends the end.
    """
    nd = len(sizes)
    output_padding = list(output_padding or [0] * nd)
    if output_shape:
        output_shape = list(output_shape)[-nd:]
    outs, begins = [], []
    for i, n in enumerate(sizes):
        full = strides[i] * (n - 1) + dilations[i] * (kernel[i] - 1) + 1 + output_padding[i]
        if output_shape or auto_pad in SAME:
            out = output_shape[i] if output_shape else n * strides[i]
            total = full - out
            begin = 0 if total < 0 else (total // 2 if auto_pad == "SAME_UPPER"
                                         else total - total // 2)
        else:
            begin = 0 if auto_pad == "VALID" else pads[i]
            end = 0 if auto_pad == "VALID" else pads[nd + i]
            out = full - begin - end
        outs.append(out)
        begins.append(begin)
    return outs, begins


def conv_transpose(x, w, b=None, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    nd = x.ndim - 2
    kernel = list(w.shape[2:])
    strides, dilations, pads = window_attrs(nd, strides, dilations, pads)
    outs, begins = transpose_geometry(x.shape[2:], kernel, strides, dilations, pads,
                                      output_padding, output_shape, auto_pad)
    acc = compute_dtype(x.dtype)
    n, c, mg = x.shape[0], x.shape[1], w.shape[1]
    xm = x.astype(acc, copy=False).reshape(n, group, c // group, -1)
    # (G, M/G*K, C/G) @ (N, G, C/G, P): every input pixel's contribution per kernel offset
    wm = w.astype(acc, copy=False).reshape(group, c // group, -1).transpose(0, 2, 1)
    cols = np.matmul(wm, xm).reshape((n, mg * group, math.prod(kernel)) + x.shape[2:])
    y = _col2im(cols, outs, kernel, strides, dilations, begins)
    if b is not None:
        y += b.astype(acc, copy=False).reshape((-1,) + (1,) * nd)
    return y.astype(x.dtype, copy=False)


def _conv_transpose_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    check_same_dtype(ctx)
    nd = check_image(ctx)
    xs, ws = ctx.shape(0), ctx.shape(1)
    if len(ws) != nd + 2 or T.static_shape(ws[2:]) is None:
        raise ctx.fail(f"weights must have rank {nd + 2} with static kernel sizes, "
                       f"given {ctx.type(1)}")
    kernel, strides, dilations, pads = spatial_attrs(ctx, nd, ws[2:])
    a = ctx.attrs
    if a["auto_pad"] not in AUTO_PADS:
        raise ctx.fail(f"auto_pad must be one of {', '.join(AUTO_PADS)}, given "
                       f"{a['auto_pad']!r}")
    group, c, cg = a["group"], xs[1], ws[0]
    if group < 1 or (isinstance(c, int) and isinstance(cg, int) and c != cg):
        raise ctx.fail(f"input has {c} channels but weights have {cg} (group {group})")
    out_pad = list(a["output_padding"] or [0] * nd)
    output_shape = a["output_shape"]
    if len(out_pad) != nd or (output_shape and len(output_shape) not in (nd, nd + 2)):
        raise ctx.fail(f"output_padding / output_shape do not match {nd} spatial axes")
    m = T.dim_mul(ws[1], group)
    _check_bias(ctx, 2, m)
    dims = []
    for i, size in enumerate(xs[2:]):
        if output_shape:
            dims.append(list(output_shape)[-nd:][i])
        elif isinstance(size, int):
            dims.append(transpose_geometry([size], kernel[i:i + 1], strides[i:i + 1],
                                           dilations[i:i + 1], [pads[i], pads[nd + i]],
                                           out_pad[i:i + 1], None, a["auto_pad"])[0][0])
        elif a["auto_pad"] in SAME:
            dims.append(T.dim_mul(size, strides[i]))
        else:
            trim = 0 if a["auto_pad"] == "VALID" else pads[i] + pads[nd + i]
            extra = dilations[i] * (kernel[i] - 1) + 1 + out_pad[i] - strides[i] - trim
            dims.append(T.dim_add(T.dim_mul(size, strides[i]), extra))
    if any(isinstance(d, int) and d < 1 for d in dims):
        raise ctx.fail(f"output spatial shape {dims} is empty")
    return [T.TensorType(ctx.dtype(0), (xs[0], m) + tuple(dims))]


def _conv_transpose_rule(inputs, outputs, *, auto_pad, dilations, group, kernel_shape,
                         output_padding, output_shape, pads, strides):
    """Gather form of the scatter: output o sums x[i] * w[k] over the (i, k) with
    i*s + k*d = o + begin, i.e. over kernel offsets k where (o + begin - k*d) is a multiple
    of s whose quotient i lies inside x."""
    x, w, b = (list(inputs) + [None])[:3]
    out = outputs[0]
    nd = x.ndim - 2
    kernel = [const_int(d) for d in w.shape[2:]]
    strides, dilations, pads = window_attrs(nd, strides, dilations, pads)
    sizes = [const_int(d) for d in x.shape[2:]]
    if None in sizes and output_shape:
        raise NoCompute("the pads of a given output_shape depend on symbolic input sizes")
    # without output_shape the begin pads do not depend on the input sizes
    _, begins = transpose_geometry([1] * nd if None in sizes else sizes, kernel, strides,
                                   dilations, pads, output_padding, output_shape, auto_pad)
    acc = acc_dtype(out.dtype)
    cg, mg = _exact_div(w.shape[0], group), w.shape[1]
    rc = None if isinstance(cg, int) and cg == 1 else reduce_axis(cg, "rc")
    rk = kernel_axes(kernel)
    axes = reduced_axes(rc, *rk)

    def element(n, m, *o):
        c = const(0) if rc is None else rc.var
        g, mm = (const(0), m) if group == 1 else (m // mg, m % mg)
        ic = c if group == 1 else g * cg + c
        ks = kernel_offsets(rk)
        pos, conds = [], []
        for i, (oi, k) in enumerate(zip(o, ks)):
            s, d = strides[i], dilations[i]
            t = oi + begins[i] - (k if d == 1 else k * d)
            p = t if s == 1 else t // s
            if s != 1:
                conds.append(eq(t % s, 0))
            conds += [t >= 0, p < x.shape[2 + i]]
            pos.append(p)
        y = reduce_sum(widen(acc, x[(n, ic, *pos)]) * widen(acc, w[(ic, mm, *ks)]), axes,
                       where=logical_and(*conds))
        return y if b is None else y + widen(acc, b[m])

    return [compute(out.shape, element, "conv_transpose", out.dtype)]


register_op("ConvTranspose", pattern=Pattern.OUT_FUSABLE, infer=_conv_transpose_infer,
            evaluate=conv_transpose, inputs=(2, 3), weights=(1, 2),
            attrs={**CONV_ATTRS, "output_padding": None, "output_shape": None},
            compute=_conv_transpose_rule,
            flops=lambda node: conv_flops(node.inputs[0], node.inputs[1].shape[1:],
                                          node.outputs[0], has_input(node, 2)),
            batched=batching.data_input)


def col2im(x, image_shape, block_shape, dilations=None, pads=None, strides=None):
    image, kernel = [int(v) for v in image_shape], [int(v) for v in block_shape]
    nd = len(image)
    strides, dilations, pads = window_attrs(nd, strides, dilations, pads)
    blocks, begins, _ = window_geometry(image, kernel, strides, dilations, pads)
    n, ck, length = x.shape
    if length != math.prod(blocks):
        raise ValueError(f"input has {length} blocks, the geometry gives {blocks}")
    cols = x.reshape((n, ck // math.prod(kernel), math.prod(kernel)) + tuple(blocks))
    return _col2im(cols, image, kernel, strides, dilations, begins).astype(x.dtype, copy=False)


def _col2im_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "image_shape")
    check_dtype(ctx, 2, (T.int64,), "block_shape")
    if ctx.type(0).rank != 3:
        raise ctx.fail(f"input must be (N, C*prod(block_shape), L), given {ctx.type(0)}")
    image, block = ctx.dims(1), ctx.value(2)
    n, ck = ctx.shape(0)[:2]
    if block is None:
        return [T.TensorType(ctx.dtype(0), (n, ctx.fresh_dim()) + tuple(
            ctx.fresh_dim() for _ in range(ctx.shape(1)[0])))]
    kernel = [int(v) for v in block]
    if image is None:
        image = [ctx.fresh_dim() for _ in kernel]
    spatial_attrs(ctx, len(kernel), kernel)
    k = math.prod(kernel)
    if isinstance(ck, int) and ck % k:
        raise ctx.fail(f"input channels {ck} are not a multiple of prod(block_shape) {k}")
    return [T.TensorType(ctx.dtype(0), (n, T.dim_div(ck, k)) + tuple(image))]


def _col2im_rule(inputs, outputs, **attrs):
    raise NoCompute("Col2Im is a scatter-add; it runs on the host")


register_op("Col2Im", pattern=Pattern.OPAQUE, infer=_col2im_infer, evaluate=col2im, inputs=3,
            attrs={"dilations": None, "pads": None, "strides": None}, compute=_col2im_rule)

# -- CausalConvWithState ------------------------------------------------------------------------


def causal_conv_with_state(x, weight, bias=None, past_state=None, activation="none"):
    """Depthwise causal 1-D conv over [past_state, x] (zeros when no state), an optional fused
    SiLU, and the last k-1 positions of that sequence as the next state."""
    n, c, _ = x.shape
    k = weight.shape[2]
    past = np.zeros((n, c, k - 1), x.dtype) if past_state is None else past_state
    padded = np.concatenate([past, x], axis=2)
    y = conv(padded, weight, bias, group=c)
    if activation in ("silu", "swish"):
        y32 = y.astype(np.float32)
        y = (y32 / (1 + np.exp(-y32))).astype(x.dtype)
    return y, padded[:, :, padded.shape[2] - (k - 1):]


def _causal_conv_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    check_same_dtype(ctx)
    if ctx.attrs["activation"] not in ("none", "silu", "swish"):
        raise ctx.fail(f"activation must be none, silu or swish, given "
                       f"{ctx.attrs['activation']!r}")
    xs, ws = ctx.shape(0), ctx.shape(1)
    if len(xs) != 3 or len(ws) != 3 or not isinstance(ws[2], int) or ws[1] != 1:
        raise ctx.fail(f"input must be (N, C, L) and weight (C, 1, k), given {ctx.type(0)} "
                       f"and {ctx.type(1)}")
    if isinstance(xs[1], int) and isinstance(ws[0], int) and xs[1] != ws[0]:
        raise ctx.fail(f"input has {xs[1]} channels, weight {ws[0]}")
    _check_bias(ctx, 2, xs[1])
    state = (xs[0], xs[1], ws[2] - 1)
    if ctx.has(3) and len(ctx.shape(3)) != 3:
        raise ctx.fail(f"past_state must be {state}, given {ctx.type(3)}")
    return [ctx.type(0), T.TensorType(ctx.dtype(0), state)]


def _causal_conv_rule(inputs, outputs, activation):
    """The depthwise conv as one reduce_sum over the kernel window of [past_state, x], read
    through a Select on the position (both loads clamped in bounds), plus bias, then the SiLU
    in float32 as the reference; the next state is the sequence's last k-1 positions."""
    x, w, b, past = (list(inputs) + [None] * 2)[:4]
    y_type = outputs[0]
    acc = acc_dtype(x.dtype)
    k = w.shape[2].value
    length = x.shape[2]

    def padded(n, c, u):  # [past_state (or zeros), x] at position u
        new = x[n, c, maximum(u - (k - 1), 0) if k > 1 else u]
        if k == 1:
            return new
        old = const(0.0, x.dtype) if past is None else past[n, c, minimum(u, k - 2)]
        return Select(u < k - 1, old, new)

    def conv_at(n, c, t):
        r = reduce_axis(k, "r")
        y = reduce_sum(widen(acc, padded(n, c, t + r.var)) * widen(acc, w[c, 0, r.var]), r)
        y = y if b is None else y + widen(acc, b[c])
        y = Cast(x.dtype, y) if y.dtype is not x.dtype else y
        if activation in ("silu", "swish"):
            y32 = Cast(T.float32, y) if y.dtype is not T.float32 else y
            y = y32 / (1 + call("exp", -y32))
        return y

    out = [compute(y_type.shape, conv_at, "causal_conv", y_type.dtype)]
    if len(outputs) > 1:
        state = compute(outputs[1].shape, lambda n, c, s: padded(n, c, length + s),
                        "causal_conv_state", outputs[1].dtype)
        out.append(state)
    return out


register_op("CausalConvWithState", pattern=Pattern.OPAQUE, infer=_causal_conv_infer,
            evaluate=causal_conv_with_state, inputs=(2, 4), outputs=(1, 2),
            attrs={"activation": "none"}, compute=_causal_conv_rule)

# -- DeformConv --------------------------------------------------------------------------------


def _bilinear(img, y, x):
    """img (N, G, C, H, W) sampled at float positions y, x (N, G, *S), zero outside."""
    h, w = img.shape[-2:]
    y0, x0 = np.floor(y), np.floor(x)
    out = 0
    n_i = np.arange(img.shape[0]).reshape((-1,) + (1,) * (y.ndim - 1))
    g_i = np.arange(img.shape[1]).reshape((1, -1) + (1,) * (y.ndim - 2))
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            yi = np.clip(yy, 0, h - 1).astype(np.intp)
            xi = np.clip(xx, 0, w - 1).astype(np.intp)
            v = img[n_i, g_i, :, yi, xi]            # (N, G, *S, C)
            out = out + v * (wy * wx * inside)[..., None]
    return out


def deform_conv(x, w, offset, b=None, mask=None, dilations=None, group=1, kernel_shape=None,
                offset_group=1, pads=None, strides=None):
    n, c, h, wd = x.shape
    kernel = list(kernel_shape or w.shape[2:])
    strides, dilations, pads = window_attrs(2, strides, dilations, pads)
    outs, begins, _ = window_geometry((h, wd), kernel, strides, dilations, pads)
    acc = compute_dtype(x.dtype)
    k = math.prod(kernel)
    og = offset_group
    off = offset.astype(acc).reshape(n, og, k, 2, *outs)
    # base sampling positions (K, oH, oW) for each axis, plus the learned offsets
    ky, kx = np.meshgrid(np.arange(kernel[0]), np.arange(kernel[1]), indexing="ij")
    oy, ox = np.arange(outs[0]), np.arange(outs[1])
    base_y = (oy[None, :, None] * strides[0] - begins[0]
              + ky.reshape(-1, 1, 1) * dilations[0])
    base_x = (ox[None, None, :] * strides[1] - begins[1]
              + kx.reshape(-1, 1, 1) * dilations[1])
    img = x.astype(acc).reshape(n, og, c // og, h, wd)
    cols = _bilinear(img, base_y + off[:, :, :, 0], base_x + off[:, :, :, 1])  # N,og,K,oH,oW,C/og
    if mask is not None:
        cols = cols * mask.astype(acc).reshape(n, og, k, *outs)[..., None]
    cols = np.moveaxis(cols, -1, 2).reshape(n, group, -1, math.prod(outs))   # (c, k) order
    m = w.shape[0]
    y = np.matmul(w.astype(acc).reshape(group, m // group, -1), cols).reshape(n, m, *outs)
    if b is not None:
        y += b.astype(acc).reshape(m, 1, 1)
    return y.astype(x.dtype)


def _deform_conv_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    check_same_dtype(ctx)
    if ctx.type(0).rank != 4:
        raise ctx.fail(f"only 2-D DeformConv is supported, given input {ctx.type(0)}")
    shape = conv_shape(ctx)
    _check_bias(ctx, 3, shape[1])
    return [T.TensorType(ctx.dtype(0), shape)]


def _deform_conv_rule(inputs, outputs, **attrs):
    raise NoCompute("DeformConv samples x at data-dependent positions; it runs on the host")


register_op("DeformConv", pattern=Pattern.OPAQUE, infer=_deform_conv_infer,
            evaluate=deform_conv, inputs=(3, 5),
            attrs={"dilations": None, "group": 1, "kernel_shape": None,
                   "offset_group": 1, "pads": None, "strides": None},
            compute=_deform_conv_rule)
