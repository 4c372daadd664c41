"""The cuda channels-last int8 convolution: QuantizedConvNHWC (`convert_layout`'s "nhwc_conv"
of a one-group QuantizedConvPacked whose channels fill whole 16-byte chunks) as an implicit
GEMM on the integer tensor cores (`mma.py`'s product at int8.py's precisions "s8" / "u8"),
`cuda_int8_conv2d_nhwc`.

Y[img, oy, ox, o] = finish(sum over k = (ky, kx, c) of (X[img, oy sh - ph + ky dh, ox sw - pw
+ kx dw, c] - za) W[o, ky, kx, c]) is a product of the patches [M = images x output pixels,
K = kh kw C] and the weights [N = output channels, K], both contiguous along k (k-major
tiles), and Y [pixel, o] is the NHWC output itself. A patch's run of 16 channels at one tap
is 16 contiguous bytes of X: one `cp.async` (`Operand.chunk`), zero-filled (src-size 0) where
the tap falls in the padding, as conv_nhwc.py's fp16 patches; the weights, a plain [N, K]
array of int8 (read through a uint8 view when the activations are uint8: the tiles hold A's
type, mma's B is s8 either way), are copied by cp.async too. A 1x1 stride-1 unpadded conv's
patches are X itself, a plain [pixels, C] array.

Padding. ONNX pads a quantized conv with the activation's zero point (a padded tap adds
nothing), but cp.async fills with 0. The products sum X W over the taps inside the image,
the zero point's share is taken off over every tap (- za w_sums[o], as int8.py), so each tap
of a pixel's window outside the image gets back + za w_tap_sums[o, tap] (the weights of that
tap summed over C, made at compile time: QuantizedConvNHWC's w_tap_sums): exact, in int32,
before `finish_expr` (bias, the float32 scale, round half to even, the zero point,
saturation, a fused Relu / Clip), so the outputs are bit for bit the reference's, llvm's and
int8.py's NCHW kernel's. The correction is computed only for pixels whose window crosses
the image's border (a select on the pixel's row and column); a conv that reads no padding
has none. The register path (an operand `_copies_async` refuses) reads padding as 0 too,
so the correction is right whichever path copies the patches.

Knobs: int8.py's (`int8.space`: mma.py's TensorCoreConfig tiles, k tiles in bytes, stages,
on sm_90 the `wgmma` knob: wgmma.py's s8 / u8 form, both tiles K-major), searched by the
tuner; the default is `int8.choose`'s on the implicit GEMM (wgmma's tiles on sm_90, 8-bit
results staged: `mma.staged_by_default`).

This module builds loop IR; it must never render C or launch. Never used for a grouped or
depthwise conv, or channels that are not whole 16-byte chunks (those keep int8.py's NCHW
kernel).
"""

from __future__ import annotations

from ...ir import loop as L
from ...ir import types as T
from ..quantized_problems import QuantizedConvProblem, channel_param, quantized_conv_nhwc
from ..space import Space, Template
from .dense import Operand
from .device import gpu_of
from .int8 import _as, _finished, _word, choose, precision, space
from .mma import TensorCoreConfig, mma_product, staged_by_default, wgmma_by_default

CHUNK = 16
"""Channels of a cp.async chunk (16 bytes of int8)."""


def gemm(p: QuantizedConvProblem) -> tuple[int, int, int]:
    """(M, N, K) of the implicit product: pixels, output channels, kh kw C."""
    images, _, _, c = p.x_dims
    _, oh, ow, oc = p.y_dims
    return images * oh * ow, oc, p.kernel[0] * p.kernel[1] * c


def reads_padding(p: QuantizedConvProblem) -> bool:
    """Whether some output pixel's window has a tap outside the image."""
    _, h, wid, _ = p.x_dims
    return any(b > 0 for b in p.begins) or tuple(p.padded_hw) != (h, wid)


def applies(p: QuantizedConvProblem) -> bool:
    return p.group == 1 and p.x_dims[3] % CHUNK == 0 and (
        p.tap_sums is not None or not reads_padding(p))


def conv_space(p: QuantizedConvProblem, machine) -> Space:
    return space("cuda_int8_conv2d_nhwc", p, getattr(machine, "arch", None))


def conv_default(p: QuantizedConvProblem, machine) -> TensorCoreConfig:
    """`int8.choose`'s tile of the implicit GEMM (with the wgmma tiles on sm_90 where
    `mma.wgmma_by_default` says), staged where `mma.staged_by_default` says."""
    return staged_by_default(choose(*gemm(p), gpu_of(machine), wgmma_by_default(
        getattr(machine, "arch", None), precision(p))), p.y.dtype, precision(p))


def _padding_share(p: QuantizedConvProblem, img_pixel, j) -> L.Expr:
    """za times the weights of channel j at the taps of the pixel's window outside the image
    (0 for a pixel whose window is inside): what the zero-filled padding left out."""
    _, h, wid, _ = p.x_dims
    kh, kw = p.kernel
    (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
    oy, ox = img_pixel
    iy, ix = oy * sh - ph, ox * sw - pw
    taps = L.Buffer(p.tap_sums.name, T.int32, (p.y_dims[3], kh * kw))
    zero = L.const(0, T.int32)
    share = None
    for ky in range(kh):
        for kx in range(kw):
            y, x = iy + ky * dh, ix + kx * dw
            outside = L.logical_or(y < 0, y >= h, x < 0, x >= wid)
            term = L.Select(outside, taps[j, ky * kw + kx], zero)
            share = term if share is None else share + term
    border = L.logical_or(iy < 0, iy + (kh - 1) * dh >= h, ix < 0, ix + (kw - 1) * dw >= wid)
    za = L.Cast(T.int32, channel_param(p.za, 0))
    return L.Select(border, za * share, zero)


def conv_build(p: QuantizedConvProblem, c: TensorCoreConfig, machine) -> L.PrimFunc:
    """The scheduled kernel: `mma_product` on the patches (cp.async chunks, padding 0) and
    the k-major weights, the padding's share added back and the requantization on the
    store."""
    m, n, k = gemm(p)
    _, h, wid, ch = p.x_dims
    _, oh, ow, _ = p.y_dims
    kh, kw = p.kernel
    (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
    byte = T.int8 if p.signed else T.uint8   # the tiles' type: A's
    x = L.Buffer(p.x.name, p.x.dtype, p.x_dims)
    w = L.Buffer(p.w.name, byte, (n, k))
    y = L.Buffer(p.y.name, p.y.dtype, (m, n))
    padded = reads_padding(p)

    def pixel(i):
        """(image, output row, output column) of output pixel i."""
        return i // (oh * ow), i // ow % oh, i % ow

    def place(i, kk):
        """(image, row, column, channel) of patch row i at k = kk, clamped into X; whether
        it is inside."""
        img, oy, ox = pixel(i)
        ky, kx = kk // (kw * ch), kk // ch % kw
        iy, ix = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
        inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < wid)
        return (img, L.minimum(L.maximum(iy, 0), h - 1), L.minimum(L.maximum(ix, 0), wid - 1),
                kk % ch), inside

    def chunk(bi, i, kk):
        at, inside = place(i, kk)
        return x[at], inside

    def patch(bi, i, kk):
        at, inside = place(i, kk)
        return L.Select(inside, x[at], L.const(0, x.dtype))

    def patch_word(bi, i, kword):
        """4 channels at a tap (C is whole chunks: never past it), 0 in the padding."""
        (img, iy, ix, first), inside = place(i, kword * 4)
        word = _word([x[img, iy, ix, first + e] for e in range(4)])
        return L.Select(inside, word, L.const(0, T.uint32))

    def store(bi, i, j, acc):
        """Y as [pixels, channels] (the NHWC tensor itself): a staged run's 4 results are
        one 32-bit store, its index free of the pixel's row and column."""
        img, oy, ox = pixel(i)
        if padded:
            acc = acc + _padding_share(p, (oy, ox), j)
        value = p.epilogue(_finished(p, acc, j), (img, oy, ox, j))
        return L.Store(y, (i, j), _as(value, y.dtype))

    patches = Operand(patch, False, chunk=chunk, word=patch_word)
    if (kh, kw, sh, sw) == (1, 1, 1, 1) and not padded and (oh, ow) == (h, wid):
        # a pointwise conv's patches are X itself, [pixels, C]: a plain array
        flat = L.Buffer(p.x.name, p.x.dtype, (m, ch))
        patches = Operand(lambda bi, i, kk: flat[i, kk], False, array=True,
                          word=lambda bi, i, kword: _word([flat[i, kword * 4 + e]
                                                           for e in range(4)]))
        x = flat
    weights = Operand(lambda bi, j, kk: w[j, kk], False, array=True,
                      word=lambda bi, j, kword: _word([w[j, kword * 4 + e] for e in range(4)]))
    body = mma_product(c, 1, m, n, k, patches, weights, store, precision=precision(p))
    views = {w.name: w, x.name: x, y.name: y}
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


INT8_CONV2D_NHWC = Template("cuda_int8_conv2d_nhwc", quantized_conv_nhwc, applies, conv_space,
                            conv_default, conv_build)
