"""The cuda conv2d template: an ungrouped NCHW convolution as an implicit GEMM.

Y[img, o, oy, ox] = sum over (c, ky, kx) of W[o, c, ky, kx] X[img, c, oy sh - ph + ky dh,
ox sw - pw + kx dw] is a product of W viewed as [M = out channels, K = C kh kw] and the
image's patches [K, N = images x output pixels], which are never materialised: the tiled
product of `dense.py` (`tiled_product`) gathers each patch element into shared memory as it
copies a B slice, padding read as 0 (consecutive threads take consecutive output pixels:
consecutive input columns at stride 1). The gather's integer work competes with the FMAs for
issue slots (a 128 x 128 tile's k loop was a third other instructions): every division is of
the pixel or k index itself (so that each is an unsigned 32-bit one), a tap's bounds are two
unsigned compares and its offset into the flat image one clamp. The bias and the fused
epilogue apply on the store (`Conv2d.finish`). A float16 or bfloat16 image or weights are
widened to float32 on their way into shared memory, as dense.py's operands. Depthwise convolutions have their own template
(depthwise.py); grouped ones keep the default template (one thread per output).
"""

from __future__ import annotations

import math

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Space, Template
from .dense import CONV_MODEL, DenseConfig, Operand, choose, product_space, tiled_product
from .device import gpu_of

MAX_GRID_Y = 65535


def space(p: problems.Conv2d, machine) -> Space:
    return product_space("cuda_conv2d", gemm(p)[2], 1)


def default(p: problems.Conv2d, machine) -> DenseConfig:
    return choose(*gemm(p), gpu=gpu_of(machine), model=CONV_MODEL)


def gemm(p: problems.Conv2d) -> tuple[int, int, int]:
    """(M, N, K) of the implicit product."""
    images, _, _, _ = p.x_dims
    oc, cg, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    return oc, images * oh * ow, cg * kh * kw


def applies(p: problems.Conv2d) -> bool:
    images, c = p.x_dims[:2]
    return p.group == 1 and not p.packed_nr and tuple(p.y_dims[:2]) == (images, p.w_dims[0]) \
        and -(-p.w_dims[0] // 16) <= MAX_GRID_Y


def build(p: problems.Conv2d, c, machine, product=None) -> L.PrimFunc:
    """The scheduled kernel of `p`: `product` (default `tiled_product`, as dense's `build`)
    on W and the gathered patches, the bias and epilogue on the store."""
    m, n, k = gemm(p)
    _, _, h, wid = p.x_dims
    oc, cg, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
    w = L.Buffer(p.w.name, p.w.dtype, (oc, k))
    x = L.Buffer(p.x.name, p.x.dtype, (math.prod(p.x_dims),))
    y = L.Buffer(p.y.name, p.y.dtype, p.y_dims)

    def divided(i, inner, outer):
        """(i // (inner outer), i // inner % outer, i % inner), each division of i itself
        (a remainder of a quotient was a signed one: legalize knows no bounds of a
        quotient's quotient)."""
        first = i // (inner * outer)
        return first, i // inner - first * outer, i % inner

    def patch(bi, j, kk):
        img, oy, ox = divided(j, ow, oh)
        ch, ky, kx = divided(kk, kw, kh)
        iy, ix = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
        # 0 <= iy < h as one unsigned compare (a negative iy wraps past h)
        inside = L.logical_and(L.Cast(T.uint32, iy) < L.const(h, T.uint32),
                               L.Cast(T.uint32, ix) < L.const(wid, T.uint32))
        # one clamp of the flat offset (a tap in the padding reads some element, then 0):
        # two integer instructions an element, not four on the row and column
        at = ((img * cg + ch) * h + iy) * wid + ix
        clamped = x[L.minimum(L.maximum(at, 0), x.shape[0] - 1)]
        return L.Select(inside, clamped, L.const(0.0, x.dtype))

    def store(bi, i, j, value):
        img, oy, ox = divided(j, ow, oh)
        index = (img, i, oy, ox)
        return L.Store(y, index, p.finish(value, index))

    weights = Operand(lambda bi, i, kk: w[i, kk], False, array=True)
    body = (product or tiled_product)(c, 1, m, n, k, weights, Operand(patch, True), store)
    views = {w.name: w, x.name: x, y.name: y}
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


CONV2D = Template("cuda_conv2d", problems.conv2d, applies, space, default, build)
