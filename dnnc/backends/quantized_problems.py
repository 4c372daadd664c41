"""The problem descriptors of QuantizedDense, QuantizedConvPacked and QuantizedConvNHWC
kernels (`ir/ops/quantized.py`), as the int8 templates read them: buffers, sizes, the epilogue's parameters and the group's fused
elementwise consumers. Target-neutral, like `problems.py`; it must never import a backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..ir import loop as L
from ..ir import types as T
from ..ir.ops.quantized import GROUP_COLUMNS
from .lower import Kernel, epilogue, layout_tail, store_index
from .problems import Epilogue, plane_geometry


@dataclass(frozen=True)
class QuantizedDenseProblem:
    """Y[i, j] = epilogue(finish(sum_k (A[i, k] - za) (W[k, j] - zw[j]))) for i < m, j < n
    (A's batch dims folded into rows; zw: `w_zp`, None where 0), W in 4-byte groups
    [ceil(n / 16), ceil(k / 4), 16, 4] or in rows (`rows`); `finish` is QuantizedDense's
    (bias, scale, zero point, lo / hi) in the anchor's type `out`."""

    name: str
    params: tuple
    a: L.Buffer
    za: L.Buffer
    w: L.Buffer
    sums: L.Buffer
    bias: L.Buffer | None
    scale: L.Buffer | None
    y_zp: L.Buffer | None
    y: L.Buffer
    m: int
    n: int
    k: int
    out: T.DType
    lo: int | None
    hi: int | None
    anchor_dims: tuple
    epilogue: Epilogue
    w_zp: L.Buffer | None = None
    # where Y stores the element computed at an anchor index, through the layout tail (a
    # Reshape / Transpose the target fuses after the epilogue: `Fusion.store_remaps`); None
    # without one (Y is the anchor's [..., n])
    store_index: Callable | None = None
    x_scale: L.Buffer | None = None   # a scalar factor of scale (QuantizedDense's x_scale)

    @property
    def signed(self) -> bool:
        """Whether A holds int8 (the u8 x s8 products then read A + 128)."""
        return self.a.dtype is T.int8

    @property
    def rows(self) -> bool:
        """Whether W is in rows [n, ceil(k / 16) * 16] (`pack_rows`), not in groups."""
        return len(self.w.shape) == 2

    def anchor_index(self, i, j) -> tuple:
        index = []
        for d in reversed(self.anchor_dims[1:-1]):
            index.append(i % d)
            i = i // d
        return (i,) + tuple(reversed(index)) + (j,)

    def epilogue_reads(self, buffer: L.Buffer) -> bool:
        """Whether the epilogue loads `buffer` (a residual add of A itself: then A keeps its
        own type, no template's view of it as words)."""
        value = self.epilogue(L.Var("acc", T.float32), self.anchor_index(L.Var("i"), L.Var("j")))
        return any(isinstance(n, L.Load) and n.buffer.name == buffer.name for n in L.walk(value))


def quantized_dense(kernel: Kernel) -> QuantizedDenseProblem | None:
    """The kernel's QuantizedDense anchor (first in its group, static shapes, a layout tail
    of known index maps) as a problem; None otherwise."""
    node = kernel.anchor
    where = store_index(kernel)
    if node is not kernel.nodes[0] or node.op != "QuantizedDense" or where is None:
        return None
    params = kernel.func.params
    a, za, w, sums, bias, scale, y_zp, w_zp, x_scale = _buffers(kernel, node, 9)
    anchor_dims = L.static_shape(node.outputs[0].type.shape)
    a_dims = L.static_shape(a.shape)
    if anchor_dims is None or a_dims is None:
        return None
    m, k, n = math.prod(a_dims[:-1]), a_dims[-1], node.attrs["n"]
    if min(m, n, k) == 0:
        return None
    return QuantizedDenseProblem(
        name=kernel.func.name, params=params, a=a, za=za, w=w, sums=sums, bias=bias,
        scale=scale, y_zp=y_zp, y=params[-1], m=m, n=n, k=k,
        out=node.outputs[0].type.dtype, lo=node.attrs["lo"], hi=node.attrs["hi"],
        anchor_dims=tuple(anchor_dims), epilogue=epilogue(kernel), w_zp=w_zp,
        store_index=where if layout_tail(kernel) else None, x_scale=x_scale)


def untailed_groups(p: QuantizedDenseProblem) -> bool:
    """Whether the product stores its anchor's layout (no layout tail) from weights in
    groups: what the templates of a target that fuses no tails and lays out no rows serve."""
    return p.store_index is None and not p.rows


@dataclass(frozen=True)
class QuantizedConvProblem:
    """A 2-D QuantizedConvPacked (one group) or depthwise QuantizedConv (W [M, 1, kh, kw]): Y[n, m, oy, ox] = epilogue(finish(sum over c,
    ky, kx of (X[n, c, oy sh + ky dh - ph, ox sw + kx dw - pw] - za) W[m, c, ky, kx])), a pixel
    outside the image adding nothing; W in 4-byte groups of channels at a tap
    (`pack_conv_groups`)."""

    name: str
    params: tuple
    x: L.Buffer
    za: L.Buffer
    w: L.Buffer
    sums: L.Buffer
    bias: L.Buffer | None
    scale: L.Buffer | None
    y_zp: L.Buffer | None
    y: L.Buffer
    x_dims: tuple          # [N, C, H, W]
    y_dims: tuple          # [N, M, OH, OW]
    kernel: tuple          # (kh, kw)
    strides: tuple
    dilations: tuple
    begins: tuple
    padded_hw: tuple
    out: T.DType
    lo: int | None
    hi: int | None
    epilogue: Epilogue
    group: int = 1
    tap_sums: L.Buffer | None = None   # QuantizedConvNHWC's w_tap_sums [M, kh * kw]
    x_scale = None                     # (a dense product's only: `scale_param`)

    @property
    def signed(self) -> bool:
        return self.x.dtype is T.int8

    @property
    def w_dims(self) -> tuple:
        """[M, C, kh, kw], as `problems.Conv2d`'s (the AMX conv's geometry reads both)."""
        return (self.y_dims[1], self.x_dims[1]) + tuple(self.kernel)

    @property
    def packed_nr(self) -> int:
        """Output channels of a packed panel of W (`pack_conv_groups`)."""
        return GROUP_COLUMNS


def quantized_conv(kernel: Kernel, op: str = "QuantizedConvPacked"
                   ) -> QuantizedConvProblem | None:
    """The kernel's 2-D `op` anchor (first in its group, static shapes, no layout tail) as a
    problem; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != op or layout_tail(kernel):
        return None
    buffers = _buffers(kernel, node)
    w_dims = L.static_shape(buffers[2].shape)
    if w_dims is None:
        return None
    kh_kw = tuple(node.attrs["kernel_shape"] or w_dims[2:])
    return _conv_problem(kernel, node, buffers, kh_kw, slice(2, 4), group=node.attrs["group"])


def quantized_conv_nhwc(kernel: Kernel) -> QuantizedConvProblem | None:
    """The kernel's 2-D QuantizedConvNHWC anchor (first in its group, static shapes, no
    layout tail) as a problem whose x_dims and y_dims are channels-last ([N, H, W, C], [N,
    OH, OW, M]) and w [M, kh, kw, C]; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != "QuantizedConvNHWC" or layout_tail(kernel):
        return None
    *buffers, taps = _buffers(kernel, node, 8)
    kh_kw = tuple(L.static_shape(node.inputs[2].type.shape)[1:3])
    return _conv_problem(kernel, node, buffers, kh_kw, slice(1, 3), tap_sums=taps)


def _conv_problem(kernel: Kernel, node, buffers, kh_kw: tuple, plane: slice, **layout
                  ) -> QuantizedConvProblem | None:
    """The conv problem of `node` reading `buffers` (x, za, w, sums, bias, scale, y_zp), its
    image plane at `plane` of x's and y's dims (static, 4-D); None otherwise. `layout`:
    the fields one layout adds (group, tap_sums)."""
    x, za, w, sums, bias, scale, y_zp = buffers
    x_dims = L.static_shape(x.shape)
    y_dims = L.static_shape(node.outputs[0].type.shape)
    if x_dims is None or y_dims is None or len(x_dims) != 4 or 0 in y_dims:
        return None
    geometry = plane_geometry(node.attrs, x_dims[plane], kh_kw, y_dims[plane])
    if geometry is None:
        return None
    strides, dilations, begins, padded_hw = geometry
    return QuantizedConvProblem(
        name=kernel.func.name, params=kernel.func.params, x=x, za=za, w=w, sums=sums,
        bias=bias, scale=scale, y_zp=y_zp, y=kernel.func.params[-1], x_dims=tuple(x_dims),
        y_dims=tuple(y_dims), kernel=kh_kw, strides=tuple(strides),
        dilations=tuple(dilations), begins=tuple(begins), padded_hw=tuple(padded_hw),
        out=node.outputs[0].type.dtype, lo=node.attrs["lo"], hi=node.attrs["hi"],
        epilogue=epilogue(kernel), **layout)


def quantized_depthwise(kernel: Kernel) -> QuantizedConvProblem | None:
    """A 2-D depthwise QuantizedConv (one channel a group, weights [M, 1, kh, kw]) as a
    problem; None otherwise."""
    p = quantized_conv(kernel, "QuantizedConv")
    if p is None or p.group != p.x_dims[1] or p.y_dims[1] != p.x_dims[1]:
        return None
    return p


@dataclass(frozen=True)
class MaxPool8:
    """A 2-D MaxPool of int8 / uint8 NCHW values (fuse_quantized keeps quantized values in
    their integers through it) alone in its kernel, static shapes."""

    name: str
    params: tuple
    x: L.Buffer
    y: L.Buffer
    x_dims: tuple
    y_dims: tuple
    kernel: tuple
    strides: tuple
    dilations: tuple
    begins: tuple
    padded_hw: tuple


def max_pool8(kernel: Kernel) -> MaxPool8 | None:
    """The kernel's int8 / uint8 MaxPool (one output, static 4-D shapes) as a problem."""
    node = kernel.anchor
    if len(kernel.nodes) != 1 or node.op != "MaxPool" or len(node.outputs) != 1 or \
            len(kernel.func.params) != 2:
        return None
    x, y = kernel.func.params
    xd, yd = L.static_shape(x.shape), L.static_shape(y.shape)
    if x.dtype not in (T.int8, T.uint8) or y.dtype is not x.dtype or xd is None or \
            yd is None or len(xd) != 4 or node.attrs.get("storage_order", 0):
        return None
    kernel_hw = tuple(node.attrs["kernel_shape"])
    geometry = plane_geometry(node.attrs, xd[2:], kernel_hw, yd[2:])
    if geometry is None:
        return None
    strides, dilations, begins, padded_hw = geometry
    return MaxPool8(kernel.func.name, kernel.func.params, x, y, tuple(xd), tuple(yd),
                    kernel_hw, tuple(strides), tuple(dilations), tuple(begins),
                    tuple(padded_hw))


def _buffers(kernel: Kernel, node, count: int = 7) -> list:
    """The kernel's buffer parameters of the node's first `count` inputs (None where
    absent)."""
    index = {id(v): k for k, v in enumerate(kernel.inputs)}
    inputs = (list(node.inputs) + [None] * count)[:count]
    return [None if v is None else kernel.func.params[index[id(v)]] for v in inputs]


@dataclass(frozen=True)
class DynamicQuantize:
    """A DynamicQuantizeLinear alone in its kernel, static shape: x (`size` elements of
    float32, or of a half type where store_half left it so) -> y (uint8), scale (float32) and
    zero point (uint8), as its reference; with `x_range` where a producer took x's range
    (DynamicRange's partials: `pieces` maxima, then as many minima)."""

    name: str
    params: tuple
    x: L.Buffer
    y: L.Buffer
    scale: L.Buffer
    zero_point: L.Buffer
    size: int
    x_range: L.Buffer | None = None
    pieces: int = 0


def dynamic_quantize(kernel: Kernel) -> DynamicQuantize | None:
    """The kernel's DynamicQuantizeLinear (its one node, static shape) as a problem."""
    node = kernel.anchor
    if len(kernel.nodes) != 1 or node.op != "DynamicQuantizeLinear" or \
            len(kernel.func.params) not in (4, 5):
        return None
    x, *x_range, y, scale, zero_point = kernel.func.params
    dims = L.static_shape(x.shape)
    pieces = L.static_shape(x_range[0].shape[1:]) if x_range else ()
    if dims is None or math.prod(dims) == 0 or pieces is None:
        return None
    return DynamicQuantize(kernel.func.name, kernel.func.params, x, y, scale, zero_point,
                           math.prod(dims), x_range[0] if x_range else None,
                           math.prod(pieces))


@dataclass(frozen=True)
class DynamicRange:
    """A DynamicRange alone in its kernel (no producer took it), static shape: x (`size`
    elements, float32 or half as DynamicQuantize's) -> its partials, `pieces` maxima then as
    many minima."""

    name: str
    params: tuple
    x: L.Buffer
    parts: L.Buffer
    size: int
    pieces: int


def dynamic_range(kernel: Kernel) -> DynamicRange | None:
    """The kernel's DynamicRange (its one node, static shape) as a problem."""
    if len(kernel.nodes) != 1 or kernel.anchor.op != "DynamicRange" or \
            len(kernel.func.params) != 2:
        return None
    x, parts = kernel.func.params
    dims = L.static_shape(x.shape)
    if dims is None or math.prod(dims) == 0:
        return None
    return DynamicRange(kernel.func.name, kernel.func.params, x, parts, math.prod(dims),
                        math.prod(L.static_shape(parts.shape[1:])))


def dynamic_scale(top: L.Expr, bottom: L.Expr) -> L.Expr:
    """DynamicQuantizeLinear's scale from x's range widened to include 0 (`top` >= 0 >=
    `bottom`), as its reference forms it."""
    return L.Select(L.eq(top, bottom), L.const(1.0), top - bottom) / L.const(255.0)


def dynamic_zero_point(bottom: L.Expr, scale: L.Expr) -> L.Expr:
    """Its zero point (an integral float32 in [0, 255]) from the range's `bottom` and the
    scale, as its reference forms it."""
    return L.call("round", L.minimum(L.maximum(L.const(0.0) - bottom / scale, L.const(0.0)),
                                     L.const(255.0)))


def dynamic_quantized(x: L.Expr, scale: L.Expr, zero: L.Expr) -> L.Expr:
    """x quantized at that scale and (float32) zero point: an integral float32 in [0, 255]."""
    return L.minimum(L.maximum(L.call("round", x / scale) + zero, L.const(0.0)),
                     L.const(255.0))


def scale_param(p: QuantizedDenseProblem | QuantizedConvProblem, j) -> L.Expr | None:
    """The scale of a product's channel j (None without one): its scale times its x_scale
    where it has one, one float32 product as the op's reference forms it."""
    scale = channel_param(p.scale, j)
    return scale if p.x_scale is None or scale is None else channel_param(p.x_scale, j) * scale


def channel_param(buffer: L.Buffer | None, j) -> L.Expr | None:
    """A quantization parameter (scale, zero point) of a product, scalar or per output
    channel, at channel j; None where the problem has none."""
    if buffer is None:
        return None
    if all(d == L.const(1) for d in buffer.shape):
        return buffer[(0,) * len(buffer.shape)] if buffer.shape else buffer[()]
    return buffer[j]
