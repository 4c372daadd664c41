"""The cuda channels-last convolution on tensor cores: ConvNHWC (`convert_layout`'s
"nhwc_conv" at tf32, fp16 and bf16) as an implicit GEMM on `mma.py`'s product.

Y[img, oy, ox, o] = sum over k = (ky, kx, c) of X[img, oy sh - ph + ky dh, ox sw - pw + kx dw,
c] W[o, ky, kx, c] is a product of the patches [M = images x output pixels, K = kh kw C] and
the weights viewed as [N = out channels, K], both contiguous along k, so both tiles are
k-major (ldmatrix without .trans) and Y [pixel, o] is the NHWC output itself, stored a lane's
two adjacent channels at a time. A patch's run of channels of one tap (ky, kx) is contiguous
in X: where C fills whole 16-byte chunks (8 fp16 / bf16, 4 tf32 elements) each chunk of a
patch row is one `cp.async` (`Operand.chunk`), zero-filled (src-size 0) where the tap falls in
the padding, as CUTLASS's analytic implicit-GEMM iterator (a pointwise conv's patches are
X itself, a plain [pixels, C] array); otherwise (a stem's 3 channels,
float32 storage at fp16) the patches go through registers element by element (`mma.py`'s
`_Tile._load`), padding read as 0. The weights, a plain [N, K] array, are copied by cp.async
when K fills whole chunks (at tf32 as they are: `convert_layout` rounded them to tf32 once,
`Operand.rounded`). The bias and the fused epilogue apply on the store
(`Conv2dNHWC.finish`). Knobs: `mma.product_space`'s, searched by the tuner, the `wgmma`
knob on sm_90 among them (both tiles k-major, as wgmma.py's swizzle takes them), which the
default takes where the dense default does (`default`). A pointwise conv's two operands are
plain arrays (viewed [1, rows, k]: the TMA producer's maps take them so), and deeper than
SHALLOW_K it takes the dense default's rules, the TMA producer among them (`pointwise`,
`DENSE_RULE_PRECISIONS`). Where C fills whole 128-byte rows (64 16-bit channels) the patches
carry TMA's im2col view of X too (`Im2col`, as CUTLASS's sm_90 convolutions): with the TMA
producer a k tile of them is one `cp.async.bulk.tensor ... im2col` box, the tap its offsets,
in the swizzle wgmma reads; such a conv deeper than SHALLOW_K takes the dense default's
rules as a pointwise one does (`im2col_copied`).

A grouped ConvNHWC (not depthwise) whose channels a group fill whole chunks (RegNet's 8 at
fp16 and tf32) is one product a group on the grid's z (`mma_product`'s batch): group g's
patches read its channels [g C/G, (g + 1) C/G), its weights are W's rows of its outputs (W
viewed [G, M/G, K]), its results go to its output channels. Before, such convs ran on the
default one-thread-an-output template in NCHW and kept their neighbours NCHW; an H200 ran
RegNetY-400MF at batch 32 in tf32 1.81x torch's time (issue 31's "no cliffs").

Never used at fp32 (its `Template.precisions`): fp32 compiles keep NCHW. Never used for a
depthwise ConvNHWC (depthwise_nhwc.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.packed import channels_fill_chunks
from .. import problems
from ..space import Space, Template
from .dense import MAX_GRID_YZ, Operand
from .device import gpu_of
from . import mma, wgmma
from .mma import (PRECISIONS, SHALLOW_K, TensorCoreConfig, choose, mma_product,
                  producer_by_default, product_space, staged_by_default, wgmma_by_default)


def gemm(p: problems.Conv2dNHWC) -> tuple[int, int, int]:
    """(M, N, K) of the implicit product of one group: pixels, the group's out channels,
    kh kw C / group."""
    images, _, _, _ = p.x_dims
    oc, kh, kw, cg = p.w_dims
    _, oh, ow, _ = p.y_dims
    return images * oh * ow, oc // p.group, kh * kw * cg


def applies(p: problems.Conv2dNHWC) -> bool:
    """One group, or several (not depthwise: depthwise_nhwc.py) whose channels a group fill
    whole 16-byte chunks (a patch's run of a group's channels at a tap is then whole
    cp.async copies: `convert_layout` makes no other grouped ConvNHWC) and whose groups fit
    the grid's z (`MAX_GRID_YZ`)."""
    if p.group == 1:
        return True
    return not p.depthwise and channels_fill_chunks(p.w_dims[3], p.x.dtype.itemsize) and \
        p.group <= MAX_GRID_YZ


def pointwise(p: problems.Conv2dNHWC) -> bool:
    """Whether `p`'s patches are X itself, a plain [pixels, C] array (a 1x1 conv of stride 1,
    unpadded): then both operands are plain arrays, as a dense product's."""
    _, kh, kw, _ = p.w_dims
    return (kh, kw, *p.strides, *p.begins) == (1, 1, 1, 1, 0, 0) and \
        tuple(p.y_dims[1:3]) == tuple(p.x_dims[1:3])


DENSE_RULE_PRECISIONS = ("fp16", "bf16")
"""Where a pointwise conv deeper than SHALLOW_K takes the dense default's rules (`default`);
tf32 keeps the conv's (untimed there)."""


IM2COL_LIMIT = 1 << 7
"""A 4-d im2col map's corners lie in [-IM2COL_LIMIT, IM2COL_LIMIT) and a copy's offsets
(the filter tap) below it (the driver's and PTX's ranges for rank 4)."""


@dataclass(frozen=True)
class Im2col:
    """TMA's im2col view of `p`'s patches (`Operand.im2col`; CUTLASS's sm_90 convolutions take
    their activations so): X [N, H, W, C] as a 4-d map (c, w, h, n), a tile's box k_tile
    channels of one tap (ky, kx) for `rows` patch rows, i.e. output pixels: TMA walks them
    in the order ox, oy, image from the tile's first pixel, each at (ox sw - pw, oy sh - ph)
    plus the tap's offsets (kx dw, ky dh), zeros in the padding and past the last image
    (`L.TensorMap.im2col`). The spatial corners bound the walk to the output's positions:
    lower -pad, upper the last output's position less the last input's."""

    p: problems.Conv2dNHWC
    x: L.Buffer

    def tensor_map(self, rows: int, k_tile: int) -> L.TensorMap | None:
        """The map of tiles of `rows` patch rows by `k_tile` (one 128-byte swizzle row of
        channels of one tap), or None where TMA has none: C not a multiple of k_tile, more
        than 256 rows, corners or offsets past IM2COL_LIMIT, strides past 8."""
        p = self.p
        images, h, w, c = p.x_dims
        _, kh, kw, _ = p.w_dims
        _, oh, ow, _ = p.y_dims
        (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
        e = p.x.dtype.itemsize
        lower = (-pw, -ph)
        upper = (lower[0] + (ow - 1) * sw - (w - 1), lower[1] + (oh - 1) * sh - (h - 1))
        if p.x.dtype not in (T.float16, T.bfloat16) or c % k_tile or \
                k_tile * e != wgmma.ROW_BYTES or not 1 <= rows <= 256 or \
                not all(-IM2COL_LIMIT <= x < IM2COL_LIMIT for x in lower + upper) or \
                max((kw - 1) * dw, (kh - 1) * dh) >= IM2COL_LIMIT or \
                not (1 <= sw <= 8 and 1 <= sh <= 8):
            return None
        return L.TensorMap(self.x, (c, w, h, images), (c * e, w * c * e, h * w * c * e),
                           (k_tile, rows), (*lower, *upper, sw, sh))

    def place(self, row: L.Expr, kk: L.Expr) -> tuple[tuple, tuple]:
        """(coordinates (c, w, h, n), offsets (w, h)) of the box from patch row `row`, k
        `kk` (a multiple of the k tile) on: its first pixel's position and channel, the tap."""
        p = self.p
        c = p.x_dims[3]
        _, _, kw, _ = p.w_dims
        _, oh, ow, _ = p.y_dims
        (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
        img, oy, ox = row // (oh * ow), row // ow % oh, row % ow
        ky, kx = kk // (kw * c), kk // c % kw
        return (kk % c, ox * sw - pw, oy * sh - ph, img), (kx * dw, ky * dh)


def im2col_copied(p: problems.Conv2dNHWC, machine) -> bool:
    """Whether TMA's im2col mode copies `p`'s patches (a wgmma tile's 128 rows: `Im2col`) at
    `machine`'s precision (16-bit: the patches are X's elements as they lie)."""
    return machine.precision in DENSE_RULE_PRECISIONS and not pointwise(p) and \
        p.group == 1 and \
        p.x.dtype is mma.STORAGE[machine.precision] and \
        Im2col(p, L.Buffer(p.x.name, p.x.dtype, p.x_dims)).tensor_map(
            128, wgmma.block_k(machine.precision)) is not None


def space(p: problems.Conv2dNHWC, machine) -> Space:
    return product_space("cuda_mma_conv2d_nhwc", gemm(p)[2], p.group, machine.precision,
                         getattr(machine, "arch", None))


def default(p: problems.Conv2dNHWC, machine) -> TensorCoreConfig:
    """`mma.choose`'s config of the implicit GEMM, the wgmma tiles among its candidates where
    the dense default has them (`wgmma_by_default`: sm_90 at fp16 / bf16). On an H200 at
    fp16, batch 32 (bench/gpu_conv.py), resnet50's convolutions but the stem: 2.21 ms weighted
    on mma.sync's default tiles, 1.87 so chosen (within 1.03 of the fastest tile timed at
    each shape; cuDNN channels_last 1.90). Not SHALLOW_K's rule (measured on dense products):
    resnet50's 1x1 convs of 256 input channels took 32 x 64 mma.sync tiles by it, 55.2 us at
    256@56 -> 64 against 35.7 on the 64 x 64 wgmma tile, 36.4 at 256@14 -> 1024 against 29.6
    (H200, fp16, batch 32, bench/gpu_conv.py). Its results staged as a dense product's
    (`staged_by_default`). A conv whose operands TMA copies (`pointwise`, `im2col_copied`)
    deeper than SHALLOW_K at DENSE_RULE_PRECISIONS takes the dense default's rules
    (WGMMA_TILE_S's model, the TMA producer): on an H200 (fp16, batch 32, bench/gpu_conv.py,
    session 53) resnet50's 3x3 convs of 512 channels went from 0.58-0.60 of cuDNN (128 x 256
    split 4) to 1.06-1.09 (128 x 64, 8 slots), of 256 from 0.84-0.86 to 1.40-1.42 (128 x
    128), of 128 from 1.08 to 1.20 (64 x 128); of 64 1.32 -> 1.28 (64 x 64)."""
    m, n, k = gemm(p)
    dense = p.group == 1 and k > SHALLOW_K and machine.precision in DENSE_RULE_PRECISIONS \
        and (pointwise(p) or im2col_copied(p, machine))
    chosen = staged_by_default(choose(
        m, n, k, p.group, gpu=gpu_of(machine), precision=machine.precision,
        wgmma=wgmma_by_default(getattr(machine, "arch", None), machine.precision,
                               p.x_tf32 and p.w_tf32),
        shallow_rule=False, latency=dense), p.y.dtype, machine.precision)
    return producer_by_default(chosen, machine.precision, k) if dense else chosen


def build(p: problems.Conv2dNHWC, c: TensorCoreConfig, machine) -> L.PrimFunc:
    """The scheduled kernel of `p`: `mma_product` on the gathered patches and the weights,
    the bias and epilogue on the store."""
    m, n, k = gemm(p)
    patches, store, views = implicit_gemm(p)
    # (3-D: TMA's map of a plain array; a group's weights [n, k] at bi)
    w = L.Buffer(p.w.name, p.w.dtype, (p.group, n, k))
    weights = Operand(lambda bi, j, kk: w[bi, j, kk], False, array=True, rounded=p.w_tf32)
    body = mma_product(c, p.group, m, n, k, patches, weights, store,
                       precision=machine.precision)
    views[w.name] = w
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


def implicit_gemm(p: problems.Conv2dNHWC) -> tuple[Operand, Callable, dict]:
    """(the patches as the product's operand: row i an output pixel, k = (ky, kx, c) over
    group bi's channels c; the store of the result of pixel i, group bi's output channel j:
    `store(bi, i, j, value)`; the views of X and Y the kernel takes, by name) of `p`'s
    implicit GEMM (also sparse24.py's, whose weights are 2:4), one product a group."""
    m, n, k = gemm(p)
    _, h, wid, _ = p.x_dims
    oc, kh, kw, ch = p.w_dims
    _, oh, ow, _ = p.y_dims
    (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
    x = L.Buffer(p.x.name, p.x.dtype, p.x_dims)
    y = L.Buffer(p.y.name, p.y.dtype, p.y_dims)

    def pixel(i):
        """(image, output row, output column) of output pixel i."""
        return i // (oh * ow), i // ow % oh, i % ow

    def tap(bi, i, kk):
        """(X's element of group bi's patch row i at k = kk, clamped into X; whether it is
        inside)."""
        img, oy, ox = pixel(i)
        ky, kx = kk // (kw * ch), kk // ch % kw
        iy, ix = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
        inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < wid)
        c = kk % ch if p.group == 1 else bi * ch + kk % ch
        return x[img, L.minimum(L.maximum(iy, 0), h - 1), L.minimum(L.maximum(ix, 0), wid - 1),
                 c], inside

    def patch(bi, i, kk):
        value, inside = tap(bi, i, kk)
        return L.Select(inside, value, L.const(0.0, x.dtype))

    def store(bi, i, j, value):
        img, oy, ox = pixel(i)
        index = (img, oy, ox, j if p.group == 1 else bi * n + j)
        return L.Store(y, index, p.finish(value, index))

    # (TMA's im2col view walks all of X's channels: one group's only)
    patches = Operand(patch, False, chunk=tap, rounded=p.x_tf32,
                      im2col=Im2col(p, x) if p.group == 1 else None)
    if pointwise(p) and p.group == 1:
        # a pointwise conv's patches are X itself, [pixels, C]: a plain array (3-D, as
        # the TMA producer's maps take one)
        flat = L.Buffer(p.x.name, p.x.dtype, (1, m, ch))
        patches = Operand(lambda bi, i, kk: flat[0, i, kk], False, array=True,
                          rounded=p.x_tf32)
        x = flat
    return patches, store, {x.name: x, y.name: y}


MMA_CONV2D_NHWC = Template("cuda_mma_conv2d_nhwc", problems.conv2d_nhwc, applies, space,
                           default, build, precisions=PRECISIONS)
