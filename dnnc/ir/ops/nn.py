"""Convolution and pooling ops: Conv, ConvTranspose, ConvInteger, DeformConv, Col2Im, the
windowed pools (MaxPool, AveragePool, LpPool), their global forms and MaxUnpool.

Layout is ONNX's channels-first (N, C, D1, ..., Dn). The references are short but not naive:
the numpy target runs whole models (ResNet-50) with them, so a convolution is one matmul over an
im2col matrix gathered with one strided slice per kernel offset, and a pool reduces the same
slices; nothing loops over output pixels in Python. `conv` is public for other families
(QLinearConv).

Compute rules are written as TVM's topi writes them: a convolution is one `reduce_sum` over
(input channel, kernel window) per output element and a pool one reduction over its window,
padding and ceil_mode overhang excluded by a `where` condition so that no load outside the
input is ever taken; padding decisions come from the same geometry helpers as the references.
`conv_sum` is public for QLinearConv.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from .. import types as T
from ..compute import (
    NoCompute, Tensor, compute, reduce_axis, reduce_max, reduce_min, reduce_sum)
from ..loop import Cast, Const, Expr, Select, call, const, eq, logical_and, maximum, minimum
from .infer import check_dtype, check_same_dtype
from .linalg import acc_dtype, widen
from .registry import REQUIRED, Pattern, register_op

FLOATS = T.FLOAT_DTYPES
SAME = ("SAME_UPPER", "SAME_LOWER")
AUTO_PADS = ("NOTSET", "VALID") + SAME

# -- window geometry --------------------------------------------------------------------------


def window_attrs(nd: int, strides=None, dilations=None, pads=None):
    """Strides, dilations and pads ([begin..., end...]) with ONNX's defaults filled in."""
    return (list(strides or [1] * nd), list(dilations or [1] * nd), list(pads or [0] * 2 * nd))


def window_geometry(sizes, kernel, strides, dilations, pads, auto_pad="NOTSET", ceil_mode=0):
    """Output sizes and resolved begin/end pads of a sliding window over static input sizes.

    Window o of an axis reads input positions o*s - begin + j*d for j < k. SAME pads so that
    out = ceil(n / s), the odd pixel at the end (SAME_UPPER) or the beginning (SAME_LOWER);
    ceil_mode keeps a last partial window only if it starts inside the input or its begin pad.
    """
    nd = len(sizes)
    outs, begins, ends = [], [], []
    for i, n in enumerate(sizes):
        k, s, d = kernel[i], strides[i], dilations[i]
        span = d * (k - 1) + 1
        if auto_pad in SAME:
            out = -(-n // s)
            total = max(0, (out - 1) * s + span - n)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            end = total - begin
        elif auto_pad == "VALID":
            begin = end = 0
            out = (n - span) // s + 1
        else:
            begin, end = pads[i], pads[nd + i]
            room = n + begin + end - span
            out = room // s + 1
            if ceil_mode:
                out = -(-room // s) + 1
                if (out - 1) * s >= n + begin:
                    out -= 1
        outs.append(out)
        begins.append(begin)
        ends.append(end)
    return outs, begins, ends


def rule_pads(sizes, kernel, strides, dilations, pads, auto_pad="NOTSET", ceil_mode=0):
    """Begin and end pads of sliding windows over input sizes given as Exprs, for compute
    rules: window_geometry's own ints on a static axis; on a symbolic axis only SAME pads
    depend on the size, and they are window_geometry's formula written over Exprs."""
    nd = len(sizes)
    begins, ends = [], []
    for i, n in enumerate(sizes):
        k, s, d = kernel[i], strides[i], dilations[i]
        if isinstance(n, Const) or auto_pad not in SAME:
            size = n.value if isinstance(n, Const) else 1 << 30  # pads independent of n
            _, b, e = window_geometry([size], [k], [s], [d], [pads[i], pads[nd + i]],
                                      auto_pad, ceil_mode)
            begins.append(b[0])
            ends.append(e[0])
            continue
        span = d * (k - 1) + 1
        # total = max(0, (ceil(n / s) - 1) * s + span - n), constant when s is 1
        total = max(0, span - 1) if s == 1 else maximum((n + (s - 1)) // s * s + (span - s) - n,
                                                        0)
        begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        begins.append(begin)
        ends.append(total - begin)
    return begins, ends


def _static(e: Expr) -> int | None:
    return e.value if isinstance(e, Const) else None


def _exact_div(d: Expr, q: int):
    """d // q as an int when d is constant (q divides d, as inference checked)."""
    return d.value // q if isinstance(d, Const) else d // q


def _kernel_axes(kernel, prefix="rk"):
    """One reduce axis per kernel axis; None for an axis of extent 1 (read at offset 0)."""
    return [None if k == 1 else reduce_axis(k, f"{prefix}{i}") for i, k in enumerate(kernel)]


def _offsets(axes):
    return [const(0) if a is None else a.var for a in axes]


def _reduced(*axes):
    """The reduce axes in use; an extent-1 axis when there are none, so that a `where` still
    guards the single load."""
    used = [a for a in axes if a is not None]
    return used or [reduce_axis(1, "r1")]


class Windows:
    """The sliding windows of a conv or pool over x's spatial axes, for compute rules:
    window o of an axis reads input position o*s - begin + k*d at kernel offset k."""

    def __init__(self, x: Tensor, out_shape, kernel, strides, dilations, begins, ends,
                 ceil_mode=0):
        self.sizes = list(x.shape[2:])
        self.outs = [d if isinstance(d, int) else None for d in out_shape[2:]]
        self.kernel, self.strides, self.dilations = list(kernel), strides, dilations
        self.begins, self.ends, self.ceil_mode = begins, ends, ceil_mode

    @classmethod
    def of(cls, x: Tensor, out_shape, kernel, attrs):
        nd = x.ndim - 2
        strides, dilations, pads = window_attrs(nd, attrs.get("strides"),
                                                attrs.get("dilations"), attrs.get("pads"))
        ceil_mode = attrs.get("ceil_mode", 0)
        begins, ends = rule_pads(x.shape[2:], kernel, strides, dilations, pads,
                                 attrs["auto_pad"], ceil_mode)
        return cls(x, out_shape, kernel, strides, dilations, begins, ends, ceil_mode)

    def start(self, i: int, o: Expr) -> Expr:
        """The input position window o of axis i begins at (its kernel offset 0)."""
        s, b = self.strides[i], self.begins[i]
        pos = o if s == 1 else o * s
        return pos if isinstance(b, int) and b == 0 else pos - b

    def reads(self, o, ks):
        """Input positions read at kernel offsets ks by output position o, and the condition
        that all are inside x (None when no window leaves x)."""
        pos, conds = [], []
        for i, (oi, k) in enumerate(zip(o, ks)):
            d = self.dilations[i]
            p = self.start(i, oi) + (k if d == 1 else k * d)
            pos.append(p)
            if not (isinstance(self.begins[i], int) and self.begins[i] <= 0):
                conds.append(p >= 0)
            if self._may_overhang(i):
                conds.append(p < self.sizes[i])
        return pos, (logical_and(*conds) if conds else None)

    def _may_overhang(self, i: int) -> bool:
        """Whether a window of axis i can read past the input's end."""
        n, out, b, e = _static(self.sizes[i]), self.outs[i], self.begins[i], self.ends[i]
        span = self.dilations[i] * (self.kernel[i] - 1) + 1
        if n is not None and out is not None and isinstance(b, int):
            return (out - 1) * self.strides[i] - b + span > n
        return bool(self.ceil_mode) or not (isinstance(e, int) and e <= 0)

    def count(self, i: int, o: Expr, lo, hi) -> Expr:
        """How many of window o's positions on axis i fall in [lo, hi)."""
        k, d = self.kernel[i], self.dilations[i]
        start = self.start(i, o)
        if d == 1:
            first, last = maximum(lo - start, 0), minimum(hi - 1 - start, k - 1)
        else:  # k >= ceil((lo - start) / d) and k <= floor((hi - 1 - start) / d)
            first = maximum(-((start - lo) // d), 0)
            last = minimum((hi - 1 - start) // d, k - 1)
        return maximum(last - first + 1, 0)


def _window_dims(ctx, sizes, kernel, strides, dilations, pads, auto_pad, ceil_mode=0):
    """Output dims of a sliding window; symbolic input sizes stay symbolic where exact."""
    if auto_pad not in AUTO_PADS:
        raise ctx.fail(f"auto_pad must be one of {', '.join(AUTO_PADS)}, given {auto_pad!r}")
    nd = len(sizes)
    if min(strides) < 1 or min(dilations) < 1 or min(kernel) < 1:
        raise ctx.fail("kernel_shape, strides and dilations must be positive")
    if any(isinstance(n, int) for n in sizes):
        static = [n if isinstance(n, int) else 1 << 30 for n in sizes]
        outs = window_geometry(static, kernel, strides, dilations, pads, auto_pad, ceil_mode)[0]
    dims = []
    for i, n in enumerate(sizes):
        if isinstance(n, int):
            if outs[i] < 1:
                raise ctx.fail(f"the window (kernel {kernel[i]}, dilation {dilations[i]}) does "
                               f"not fit spatial axis {i} of size {n} with its padding")
            dims.append(outs[i])
            continue
        span = dilations[i] * (kernel[i] - 1) + 1
        begin, end = pads[i], pads[nd + i]
        if strides[i] != 1:
            dims.append(ctx.fresh_dim())
        elif auto_pad in SAME:
            dims.append(n)
        elif auto_pad == "VALID":
            dims.append(T.dim_add(n, 1 - span))
        elif ceil_mode and end >= span:
            dims.append(ctx.fresh_dim())
        else:
            dims.append(T.dim_add(n, begin + end - span + 1))
    return dims


def _spatial_attrs(ctx, nd: int, kernel):
    """Checks the window attributes' lengths; returns (kernel, strides, dilations, pads)."""
    a = ctx.attrs
    strides, dilations, pads = window_attrs(nd, a.get("strides"), a.get("dilations"),
                                            a.get("pads"))
    for name, vals, want in (("kernel_shape", kernel, nd), ("strides", strides, nd),
                             ("dilations", dilations, nd), ("pads", pads, 2 * nd)):
        if len(vals) != want:
            raise ctx.fail(f"{name} has {len(vals)} entries, {want} expected for {nd} "
                           f"spatial axes")
    if min(pads) < 0:
        raise ctx.fail(f"pads must not be negative, given {pads}")
    return list(kernel), strides, dilations, pads


def _check_image(ctx, i: int = 0, what: str = "input"):
    rank = ctx.type(i).rank
    if rank < 3:
        raise ctx.fail(f"{what} must be (N, C, D1, ...) with at least one spatial axis, "
                       f"given {ctx.type(i)}")
    return rank - 2


def _pad_for_windows(x, outs, kernel, strides, dilations, begins, fill):
    """x padded (or cropped) to exactly the extent the windows read, window 0 at index 0."""
    nd = len(outs)
    crop = [slice(None)] * 2
    widths = [(0, 0)] * 2
    for i in range(nd):
        need = (outs[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
        begin, end = begins[i], need - x.shape[2 + i] - begins[i]
        crop.append(slice(max(0, -begin), x.shape[2 + i] - max(0, -end)))
        widths.append((max(0, begin), max(0, end)))
    x = x[tuple(crop)]
    if any(w != (0, 0) for w in widths):
        x = np.pad(x, widths, constant_values=fill)
    return x


def _window_slices(xp, outs, kernel, strides, dilations):
    """One strided view of xp per kernel offset, in C order: view j holds input o*s + j*d."""
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(j * d, j * d + (o - 1) * s + 1, s)
                      for j, d, o, s in zip(offset, dilations, outs, strides))
        yield xp[(slice(None), slice(None)) + index]


def _col2im(cols, image, kernel, strides, dilations, begins):
    """The adjoint of the im2col gather: adds cols[:, :, j, o] into image position
    o*s + j*d - begin, dropping what falls outside the image (cols: (N, C, K, *blocks))."""
    blocks = cols.shape[3:]
    full = [(b - 1) * s + d * (k - 1) + 1
            for b, s, d, k in zip(blocks, strides, dilations, kernel)]
    buf = np.zeros(cols.shape[:2] + tuple(full), cols.dtype)
    for j, view in enumerate(_window_slices(buf, blocks, kernel, strides, dilations)):
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


def _compute_dtype(dtype):
    """Arithmetic type: float32 for 16-bit floats, float64 for integers (exact sums < 2**53,
    and BLAS), else the input's own."""
    if dtype.kind in "iub":
        return np.float64
    return np.float32 if dtype.itemsize < 4 else dtype


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
    acc = _compute_dtype(x.dtype)
    n, m = x.shape[0], w.shape[0]
    xp = _pad_for_windows(x.astype(acc, copy=False), outs, kernel, strides, dilations, begins, 0)
    # im2col: (N, C, K, *outs) -> (N, G, C/G*K, P), matching w's (M, C/G, *kernel) layout
    cols = np.stack(list(_window_slices(xp, outs, kernel, strides, dilations)), axis=2)
    cols = cols.reshape(n, group, -1, math.prod(outs))
    wm = w.astype(acc, copy=False).reshape(group, m // group, -1)
    y = np.matmul(wm, cols).reshape((n, m) + tuple(outs))
    if b is not None:
        y += b.astype(acc, copy=False).reshape((m,) + (1,) * nd)
    if x.dtype.kind in "iu":
        return np.rint(y).astype(np.int32)
    return y.astype(x.dtype, copy=False)


def _conv_shape(ctx, x_i=0, w_i=1):
    """(N, M, *out) of a convolution of input x_i with weights w_i; checks channels."""
    nd = _check_image(ctx, x_i)
    xs, ws = ctx.shape(x_i), ctx.shape(w_i)
    if len(ws) != nd + 2:
        raise ctx.fail(f"weights must have rank {nd + 2} for this input, given {ctx.type(w_i)}")
    kernel = ctx.attrs.get("kernel_shape") or ws[2:]
    if not all(isinstance(k, int) for k in kernel):
        raise ctx.fail(f"kernel_shape is needed when the weights' shape {ctx.type(w_i)} is "
                       f"symbolic")
    kernel, strides, dilations, pads = _spatial_attrs(ctx, nd, kernel)
    group = ctx.attrs["group"]
    if group < 1:
        raise ctx.fail(f"group must be positive, given {group}")
    c, m, cg = xs[1], ws[0], ws[1]
    if isinstance(c, int) and isinstance(cg, int) and c != cg * group:
        raise ctx.fail(f"input has {c} channels but weights expect {cg} x group {group}")
    if isinstance(m, int) and m % group:
        raise ctx.fail(f"{m} output channels do not split into {group} groups")
    outs = _window_dims(ctx, xs[2:], kernel, strides, dilations, pads,
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
    shape = _conv_shape(ctx)
    _check_bias(ctx, 2, shape[1])
    return [T.TensorType(ctx.dtype(0), shape)]


CONV_ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
              "pads": None, "strides": None}


def conv_sum(x: Tensor, w: Tensor, out_shape, attrs, term):
    """A convolution's sum as `fn(n, m, *o)`: reduce_sum over the group's input channels c and
    the kernel offsets of `term(x value, w value, m)`, padding excluded by `where`."""
    kernel = [_static(d) for d in w.shape[2:]]
    if None in kernel:
        kernel = attrs.get("kernel_shape")
        if not kernel:
            raise NoCompute(f"kernel sizes {w.shape[2:]} are not known")
    win = Windows.of(x, out_shape, kernel, attrs)
    group, cg = attrs["group"], w.shape[1]
    mg = _exact_div(w.shape[0], group)    # output channels per group
    rc = None if cg == const(1) else reduce_axis(cg, "rc")
    rk = _kernel_axes(kernel)
    axes = _reduced(rc, *rk)

    def total(n, m, *o):
        c = const(0) if rc is None else rc.var
        g = m if isinstance(mg, int) and mg == 1 else m // mg    # m's group
        ic = c if group == 1 else g * cg + c
        ks = _offsets(rk)
        pos, inside = win.reads(o, ks)
        return reduce_sum(term(x[(n, ic, *pos)], w[(m, c, *ks)], m), axes, where=inside)

    return total


def _conv_rule(inputs, outputs, **attrs):
    x, w, b = (list(inputs) + [None])[:3]
    out = outputs[0]
    acc = acc_dtype(out.dtype)
    total = conv_sum(x, w, out.shape, attrs, lambda xv, wv, m: widen(acc, xv) * widen(acc, wv))

    def element(n, m, *o):
        y = total(n, m, *o)
        return y if b is None else y + widen(acc, b[m])

    return [compute(out.shape, element, "conv", out.dtype)]


register_op("Conv", pattern=Pattern.OUT_FUSABLE, infer=_conv_infer, evaluate=conv,
            attrs=CONV_ATTRS, inputs=(2, 3), compute=_conv_rule)


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
    shape = _conv_shape(ctx)
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
            evaluate=conv_integer, attrs=CONV_ATTRS, inputs=(2, 4), compute=_conv_integer_rule)

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
    acc = _compute_dtype(x.dtype)
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
    nd = _check_image(ctx)
    xs, ws = ctx.shape(0), ctx.shape(1)
    if len(ws) != nd + 2 or not all(isinstance(k, int) for k in ws[2:]):
        raise ctx.fail(f"weights must have rank {nd + 2} with static kernel sizes, "
                       f"given {ctx.type(1)}")
    kernel, strides, dilations, pads = _spatial_attrs(ctx, nd, ws[2:])
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
    kernel = [_static(d) for d in w.shape[2:]]
    strides, dilations, pads = window_attrs(nd, strides, dilations, pads)
    sizes = [_static(d) for d in x.shape[2:]]
    if None in sizes and output_shape:
        raise NoCompute("the pads of a given output_shape depend on symbolic input sizes")
    # without output_shape the begin pads do not depend on the input sizes
    _, begins = transpose_geometry([1] * nd if None in sizes else sizes, kernel, strides,
                                   dilations, pads, output_padding, output_shape, auto_pad)
    acc = acc_dtype(out.dtype)
    cg, mg = _exact_div(w.shape[0], group), w.shape[1]
    rc = None if isinstance(cg, int) and cg == 1 else reduce_axis(cg, "rc")
    rk = _kernel_axes(kernel)
    axes = _reduced(rc, *rk)

    def element(n, m, *o):
        c = const(0) if rc is None else rc.var
        g, mm = (const(0), m) if group == 1 else (m // mg, m % mg)
        ic = c if group == 1 else g * cg + c
        ks = _offsets(rk)
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
            evaluate=conv_transpose, inputs=(2, 3),
            attrs={**CONV_ATTRS, "output_padding": None, "output_shape": None},
            compute=_conv_transpose_rule)


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
    _spatial_attrs(ctx, len(kernel), kernel)
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
    acc = _compute_dtype(x.dtype)
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
    shape = _conv_shape(ctx)
    _check_bias(ctx, 3, shape[1])
    return [T.TensorType(ctx.dtype(0), shape)]


def _deform_conv_rule(inputs, outputs, **attrs):
    raise NoCompute("DeformConv samples x at data-dependent positions; it runs on the host")


register_op("DeformConv", pattern=Pattern.OPAQUE, infer=_deform_conv_infer,
            evaluate=deform_conv, inputs=(3, 5),
            attrs={"dilations": None, "group": 1, "kernel_shape": None,
                   "offset_group": 1, "pads": None, "strides": None},
            compute=_deform_conv_rule)

# -- windowed pools ----------------------------------------------------------------------------


def _pool_windows(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, fill):
    """(views, outs, begins, ends, strides, dilations) of the pooling windows over x."""
    nd = x.ndim - 2
    strides, dilations, pads = window_attrs(nd, strides, dilations, pads)
    outs, begins, ends = window_geometry(x.shape[2:], kernel_shape, strides, dilations, pads,
                                         auto_pad, ceil_mode)
    xp = _pad_for_windows(x, outs, kernel_shape, strides, dilations, begins, fill)
    views = list(_window_slices(xp, outs, kernel_shape, strides, dilations))
    return views, outs, begins, ends, strides, dilations


def _window_coords(outs, kernel, strides, dilations, begins, axis):
    """Input positions (out, k) that the windows of one axis read."""
    return (np.arange(outs[axis])[:, None] * strides[axis] - begins[axis]
            + np.arange(kernel[axis])[None, :] * dilations[axis])


def _window_counts(outs, kernel, strides, dilations, begins, lo, hi):
    """How many window positions fall in [lo_i, hi_i) on every axis, shaped like the output."""
    count = np.ones((), np.int64)
    for i in range(len(outs)):
        pos = _window_coords(outs, kernel, strides, dilations, begins, i)
        per_axis = ((pos >= lo[i]) & (pos < hi[i])).sum(axis=1)
        count = np.multiply.outer(count, per_axis)
    return count


def max_pool(x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None):
    """Max over each window, and the flat index of its (first) maximum, as ONNX's Indices:
    row-major over (N, C, *spatial), or column-major over the spatial axes (storage_order 1)."""
    work = x.astype(np.float32) if x.dtype.kind == "f" and x.dtype.itemsize < 4 else x
    fill = -np.inf if work.dtype.kind == "f" else np.iinfo(work.dtype).min
    views, outs, begins, _, strides, dilations = _pool_windows(
        work, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, fill)
    # running maximum; a later equal value never replaces an earlier one, and a NaN wins (it
    # propagates, as in np.max, Max, ReduceMax and the compute rule)
    y, best = views[0].copy(), np.zeros(views[0].shape, np.intp)
    for j, view in enumerate(views[1:], 1):
        better = view > y
        if work.dtype.kind == "f":
            better |= np.isnan(view) & ~np.isnan(y)
        np.copyto(y, view, where=better)
        np.copyto(best, j, where=better)
    y = y.astype(x.dtype, copy=False)
    # flat input index of each maximum
    sizes = x.shape[2:]
    nd = len(sizes)
    offsets = np.array(list(itertools.product(*(range(k) for k in kernel_shape))))
    spatial = np.zeros(best.shape, np.int64)
    order = range(nd) if storage_order == 0 else reversed(range(nd))
    for i in order:
        o = np.arange(outs[i]).reshape((-1,) + (1,) * (nd - 1 - i))
        pos = o * strides[i] - begins[i] + offsets[best, i] * dilations[i]
        spatial = spatial * sizes[i] + pos
    planes = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(
        x.shape[:2] + (1,) * nd)
    return y, planes * math.prod(sizes) + spatial


def average_pool(x, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    """Mean over each window: of its input pixels, or (count_include_pad) of its pixels inside
    the padded input; a ceil_mode overhang past the end pad never counts."""
    acc = _compute_dtype(x.dtype)
    views, outs, begins, ends, strides, dilations = _pool_windows(
        x.astype(acc, copy=False), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0)
    total = functools.reduce(np.add, views)
    sizes = x.shape[2:]
    if count_include_pad:
        lo, hi = [-b for b in begins], [n + e for n, e in zip(sizes, ends)]
    else:
        lo, hi = [0] * len(sizes), list(sizes)
    count = _window_counts(outs, kernel_shape, strides, dilations, begins, lo, hi)
    return (total / np.maximum(count, 1).astype(acc)).astype(x.dtype)


def lp_pool(x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
            pads=None, strides=None):
    """(sum of |x|^p over each window)^(1/p); padding contributes zero."""
    acc = _compute_dtype(x.dtype)
    powered = np.abs(x.astype(acc, copy=False)) ** p
    views = _pool_windows(powered, kernel_shape, strides, dilations, pads, auto_pad,
                          ceil_mode, 0)[0]
    return (functools.reduce(np.add, views) ** (1.0 / p)).astype(x.dtype)


def _pool_infer(dtypes, indices=False):
    def infer(ctx):
        check_dtype(ctx, 0, dtypes)
        nd = _check_image(ctx)
        kernel, strides, dilations, pads = _spatial_attrs(ctx, nd, ctx.attrs["kernel_shape"])
        if ctx.attrs.get("storage_order", 0) not in (0, 1):
            raise ctx.fail(f"storage_order must be 0 or 1, given {ctx.attrs['storage_order']}")
        xs = ctx.shape(0)
        outs = _window_dims(ctx, xs[2:], kernel, strides, dilations, pads,
                            ctx.attrs["auto_pad"], ctx.attrs.get("ceil_mode", 0))
        shape = tuple(xs[:2]) + tuple(outs)
        types = [T.TensorType(ctx.dtype(0), shape)]
        if indices:
            types.append(T.TensorType(T.int64, shape))
        return types

    return infer


def _max_pool_rule(inputs, outputs, **attrs):
    """The window maximum; Indices as a second stage: the first kernel offset (C order, as
    the reference's strict `>` keeps) holding that maximum, decoded into a flat position."""
    x = inputs[0]
    kernel = attrs["kernel_shape"]
    win = Windows.of(x, outputs[0].shape, kernel, attrs)

    def window_max(n, c, *o):
        rk = _kernel_axes(kernel)
        pos, inside = win.reads(o, _offsets(rk))
        return reduce_max(x[(n, c, *pos)], _reduced(*rk), where=inside)

    y = compute(outputs[0].shape, window_max, "max_pool", x.dtype)
    if len(outputs) == 1:
        return [y]
    nd = len(kernel)
    after = [math.prod(kernel[i + 1:]) for i in range(nd)]   # C-order strides of offsets

    def first_max(n, c, *o):
        rk = _kernel_axes(kernel)
        ks = _offsets(rk)
        pos, inside = win.reads(o, ks)
        # clamped, the load stays inside x where `inside` is false (a condition is not lazy)
        safe = [minimum(maximum(p, 0), size - 1) for p, size in zip(pos, win.sizes)]
        hit = eq(x[(n, c, *safe)], y[(n, c, *o)])
        j = sum((k * a for k, a in zip(ks, after)), const(0))
        return reduce_min(j, _reduced(*rk), where=hit if inside is None
                          else logical_and(inside, hit))

    best = compute(outputs[0].shape, first_max, "max_pool_offset", T.int64)
    total = math.prod(kernel)

    def flat_index(n, c, *o):
        # a window wholly in padding has no hit: the reference then reports offset 0
        j = minimum(best[(n, c, *o)], total - 1)
        pos = [win.start(i, o[i]) + (j // after[i]) % kernel[i] * win.dilations[i]
               for i in range(nd)]
        order = range(nd) if attrs["storage_order"] == 0 else reversed(range(nd))
        spatial = const(0)
        for i in order:
            spatial = spatial * win.sizes[i] + pos[i]
        plane = n * x.shape[1] + c
        return plane * math.prod(win.sizes[1:], start=win.sizes[0]) + spatial

    return [y, compute(outputs[0].shape, flat_index, "max_pool_indices", T.int64)]


def _average_pool_rule(inputs, outputs, **attrs):
    """Window sum over the pixels inside x, divided by a count computed in closed form per
    axis: of the positions inside x, or (count_include_pad) inside the padded extent."""
    x = inputs[0]
    out = outputs[0]
    kernel = attrs["kernel_shape"]
    win = Windows.of(x, out.shape, kernel, attrs)
    acc = acc_dtype(out.dtype)

    def element(n, c, *o):
        rk = _kernel_axes(kernel)
        pos, inside = win.reads(o, _offsets(rk))
        total = reduce_sum(widen(acc, x[(n, c, *pos)]), _reduced(*rk), where=inside)
        count = const(1)
        for i, oi in enumerate(o):
            if attrs["count_include_pad"]:
                lo, hi = -win.begins[i], win.sizes[i] + win.ends[i]
            else:
                lo, hi = 0, win.sizes[i]
            count = count * win.count(i, oi, lo, hi)
        return total / widen(acc, maximum(count, 1))

    return [compute(out.shape, element, "average_pool", out.dtype)]


def _power(v: Expr, p: int) -> Expr:
    """v ** p as the reference's NumPy computes it (squares and roots by their fast paths)."""
    if p == 1:
        return v
    if p == 2:
        return v * v
    return call("pow", v, const(p, v.dtype))


def _root(v: Expr, p: int) -> Expr:
    if p == 1:
        return v
    if p == 2:
        return call("sqrt", v)
    return call("pow", v, const(1.0 / p, v.dtype))


def _lp_pool_rule(inputs, outputs, **attrs):
    x = inputs[0]
    out = outputs[0]
    kernel, p = attrs["kernel_shape"], attrs["p"]
    win = Windows.of(x, out.shape, kernel, attrs)
    acc = acc_dtype(out.dtype)

    def element(n, c, *o):
        rk = _kernel_axes(kernel)
        pos, inside = win.reads(o, _offsets(rk))
        v = call("abs", widen(acc, x[(n, c, *pos)]))
        return _root(reduce_sum(_power(v, p), _reduced(*rk), where=inside), p)

    return [compute(out.shape, element, "lp_pool", out.dtype)]


POOL_ATTRS = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None,
              "kernel_shape": REQUIRED, "pads": None, "strides": None}

register_op("MaxPool", pattern=Pattern.OPAQUE, evaluate=max_pool, outputs=(1, 2),
            infer=_pool_infer(FLOATS + (T.int8, T.uint8), indices=True),
            attrs={**POOL_ATTRS, "storage_order": 0}, compute=_max_pool_rule)
register_op("AveragePool", pattern=Pattern.OPAQUE, evaluate=average_pool,
            infer=_pool_infer(FLOATS), attrs={**POOL_ATTRS, "count_include_pad": 0},
            compute=_average_pool_rule)
register_op("LpPool", pattern=Pattern.OPAQUE, evaluate=lp_pool, infer=_pool_infer(FLOATS),
            attrs={**POOL_ATTRS, "p": 2}, compute=_lp_pool_rule)

# -- global pools ------------------------------------------------------------------------------


def _global_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    nd = _check_image(ctx)
    return [T.TensorType(ctx.dtype(0), tuple(ctx.shape(0)[:2]) + (1,) * nd)]


def _spatial_axes(x):
    return tuple(range(2, x.ndim))


def global_average_pool(x):
    acc = _compute_dtype(x.dtype)
    return x.mean(axis=_spatial_axes(x), keepdims=True, dtype=acc).astype(x.dtype)


def global_lp_pool(x, p=2):
    acc = _compute_dtype(x.dtype)
    total = (np.abs(x.astype(acc, copy=False)) ** p).sum(axis=_spatial_axes(x), keepdims=True)
    return (total ** (1.0 / p)).astype(x.dtype)


def _global_rule(reducer, name):
    """A global pool's rule: `reducer(x, x[n, c, *r], r, acc)` over spatial reduce axes r."""

    def rule(inputs, outputs, **attrs):
        x = inputs[0]
        out = outputs[0]
        acc = acc_dtype(out.dtype)

        def element(n, c, *_):
            r = [reduce_axis(d, f"r{i}") for i, d in enumerate(x.shape[2:])]
            return reducer(x, x[(n, c, *(a.var for a in r))], r, acc, **attrs)

        return [compute(out.shape, element, name, out.dtype)]

    return rule


def _global_mean(x, v, r, acc):
    count = math.prod(x.shape[3:], start=x.shape[2])
    return reduce_sum(widen(acc, v), r) / widen(acc, count)


def _global_lp(x, v, r, acc, p):
    return _root(reduce_sum(_power(call("abs", widen(acc, v)), p), r), p)


register_op("GlobalAveragePool", pattern=Pattern.REDUCE, infer=_global_infer,
            evaluate=global_average_pool,
            compute=_global_rule(_global_mean, "global_average_pool"))
register_op("GlobalMaxPool", pattern=Pattern.REDUCE, infer=_global_infer,
            evaluate=lambda x: x.max(axis=_spatial_axes(x), keepdims=True),
            compute=_global_rule(lambda x, v, r, acc: reduce_max(v, r), "global_max_pool"))
register_op("GlobalLpPool", pattern=Pattern.REDUCE, infer=_global_infer,
            evaluate=global_lp_pool, attrs={"p": 2},
            compute=_global_rule(_global_lp, "global_lp_pool"))

# -- MaxUnpool ---------------------------------------------------------------------------------


def _unpool_sizes(sizes, kernel, strides, pads):
    nd = len(sizes)
    return [(n - 1) * s - pads[i] - pads[nd + i] + k
            for i, (n, k, s) in enumerate(zip(sizes, kernel, strides))]


def max_unpool(x, indices, output_shape=None, kernel_shape=None, pads=None, strides=None):
    """Scatter x to the flat positions in `indices` of the tensor MaxPool read (its default
    shape), zeros elsewhere; a larger output_shape pads that tensor at the end of each axis."""
    nd = x.ndim - 2
    strides, _, pads = window_attrs(nd, strides, None, pads)
    default = tuple(x.shape[:2]) + tuple(_unpool_sizes(x.shape[2:], kernel_shape, strides, pads))
    y = np.zeros(math.prod(default), x.dtype)
    y[indices.reshape(-1)] = x.reshape(-1)
    y = y.reshape(default)
    if output_shape is None:
        return y
    out = np.zeros(tuple(int(v) for v in output_shape), x.dtype)
    out[tuple(slice(0, min(a, b)) for a, b in zip(default, out.shape))] = \
        y[tuple(slice(0, min(a, b)) for a, b in zip(default, out.shape))]
    return out


def _max_unpool_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    check_dtype(ctx, 1, (T.int64,), "indices")
    check_dtype(ctx, 2, (T.int64,), "output_shape")
    nd = _check_image(ctx)
    kernel, strides, _, pads = _spatial_attrs(ctx, nd, ctx.attrs["kernel_shape"])
    xs = ctx.shape(0)
    if ctx.has(2):
        dims = ctx.dims(2)
        if dims is None:
            dims = [ctx.fresh_dim() for _ in range(nd + 2)]
        if len(dims) != nd + 2:
            raise ctx.fail(f"output_shape must have {nd + 2} entries, given {dims}")
        return [T.TensorType(ctx.dtype(0), dims)]
    dims = [T.dim_add(T.dim_mul(n, s), k - s - pads[i] - pads[nd + i])
            for i, (n, k, s) in enumerate(zip(xs[2:], kernel, strides))]
    return [T.TensorType(ctx.dtype(0), tuple(xs[:2]) + tuple(dims))]


def _max_unpool_rule(inputs, outputs, **attrs):
    raise NoCompute("MaxUnpool scatters to data-dependent positions; it runs on the host")


register_op("MaxUnpool", pattern=Pattern.OPAQUE, infer=_max_unpool_infer, evaluate=max_unpool,
            inputs=(2, 3), attrs={"kernel_shape": REQUIRED, "pads": None, "strides": None},
            compute=_max_unpool_rule)
