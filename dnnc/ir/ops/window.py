"""Sliding-window geometry shared by the convolution and pooling families (`conv.py`,
`pool.py`): ONNX's window attributes with their defaults, output sizes and resolved pads
(`window_geometry` for the references and inference, `rule_pads` over index expressions for
compute rules), the im2col views the references reduce, and `Windows`, which compute rules use
to address a window's input positions without ever loading outside the input.

Layout is ONNX's channels-first (N, C, D1, ..., Dn). Helpers only: nothing here registers an op.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import types as T
from ..compute import Tensor, reduce_axis
from ..loop import Const, Expr, const, logical_and, maximum, minimum
from .index_exprs import const_int

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


def kernel_axes(kernel, prefix="rk"):
    """One reduce axis per kernel axis; None for an axis of extent 1 (read at offset 0)."""
    return [None if k == 1 else reduce_axis(k, f"{prefix}{i}") for i, k in enumerate(kernel)]


def kernel_offsets(axes):
    """Each kernel axis's offset: its reduce var, or 0 where `kernel_axes` gave None."""
    return [const(0) if a is None else a.var for a in axes]


def reduced_axes(*axes):
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
        n, out, b, e = const_int(self.sizes[i]), self.outs[i], self.begins[i], self.ends[i]
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


def window_dims(ctx, sizes, kernel, strides, dilations, pads, auto_pad, ceil_mode=0):
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


def spatial_attrs(ctx, nd: int, kernel):
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


def check_image(ctx, i: int = 0, what: str = "input"):
    """Input i is (N, C, D1, ...) with at least one spatial axis; returns their count."""
    rank = ctx.type(i).rank
    if rank < 3:
        raise ctx.fail(f"{what} must be (N, C, D1, ...) with at least one spatial axis, "
                       f"given {ctx.type(i)}")
    return rank - 2


def pad_for_windows(x, outs, kernel, strides, dilations, begins, fill):
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


def window_slices(xp, outs, kernel, strides, dilations):
    """One strided view of xp per kernel offset, in C order: view j holds input o*s + j*d."""
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(j * d, j * d + (o - 1) * s + 1, s)
                      for j, d, o, s in zip(offset, dilations, outs, strides))
        yield xp[(slice(None), slice(None)) + index]


def compute_dtype(dtype):
    """Arithmetic type: float32 for 16-bit floats, float64 for integers (exact sums < 2**53,
    and BLAS), else the input's own."""
    if dtype.kind in "iub":
        return np.float64
    return np.float32 if dtype.itemsize < 4 else dtype
