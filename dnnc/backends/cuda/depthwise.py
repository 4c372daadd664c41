"""The cuda depthwise convolution template: one filter per channel (MobileNet's and
EfficientNet's 3x3 and 5x5, ConvNeXt's 7x7), a block per tile of one channel's output plane.

Y[img, ch, oy, ox] = sum over (ky, kx) of W[ch, 0, ky, kx] X[img, ch, oy sh - ph + ky dh,
ox sw - pw + kx dw]. A block (blockIdx.z: the image, blockIdx.y: the channel, blockIdx.x:
the tile) copies the input window its `tile_h` x `tile_w` outputs read (with the halo; padding
read as 0) and the channel's kh kw weights into shared memory once (float16 or bfloat16 ones
widened to float32 on the way), then each thread computes
`rows` outputs of one column (vertically adjacent) in fp32, adds the bias and stores through
the fused epilogue (`Conv2d.finish`: one rounding to the anchor's type), guarded at the
plane's edges. Before it, such a convolution ran one thread per output reading its kh kw
inputs from global memory (the default template): 6% of the card's bandwidth on ConvNeXt's
7x7 at batch 32 (issue 31).

Never used for ungrouped or grouped-but-not-depthwise convolutions (conv.py, mma.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Constraint, Space, Template
from .dense import MAX_GRID_YZ, MAX_SHARED_BYTES

MAX_THREADS = 1024


@dataclass(frozen=True)
class DepthwiseConfig:
    """Knobs of the depthwise template."""

    tile_w: int = 32    # output columns a block
    tile_h: int = 8     # output rows a block
    rows: int = 1       # output rows a thread (tile_h / rows threads down)

    @property
    def threads(self) -> int:
        return self.tile_w * self.tile_h // self.rows


def window(p: problems.Conv2d, c: DepthwiseConfig) -> tuple[int, int]:
    """(rows, columns) of the input a tile reads."""
    _, _, kh, kw = p.w_dims
    (sh, sw), (dh, dw) = p.strides, p.dilations
    return (c.tile_h - 1) * sh + (kh - 1) * dh + 1, (c.tile_w - 1) * sw + (kw - 1) * dw + 1


def _shared_bytes(p: problems.Conv2d, c: DepthwiseConfig) -> int:
    wh, ww = window(p, c)
    return 4 * (wh * ww + p.w_dims[2] * p.w_dims[3])


def applies(p: problems.Conv2d) -> bool:
    images, channels = p.x_dims[:2]
    return p.depthwise and images <= MAX_GRID_YZ and channels <= MAX_GRID_YZ


def space(p: problems.Conv2d, machine) -> Space:
    return Space("cuda_depthwise", DepthwiseConfig, {
        "tile_w": (8, 16, 32, 64), "tile_h": (1, 2, 4, 8, 16, 32), "rows": (1, 2, 4)},
        [Constraint("rows divides tile_h", lambda c: c.tile_h % c.rows == 0),
         Constraint(f"32 to {MAX_THREADS} threads a block",
                    lambda c: 32 <= c.threads <= MAX_THREADS),
         Constraint("the window and weights within 48 KiB of shared memory",
                    lambda c: _shared_bytes(p, c) <= MAX_SHARED_BYTES)])


def default(p: problems.Conv2d, machine) -> DepthwiseConfig:
    """A tile about as wide as the plane (8 to 32 columns), 2 rows a thread where the plane
    has 16 rows or more, and enough rows for 128 to 256 threads where the plane has them."""
    _, _, oh, ow = p.y_dims
    tile_w = 8 if ow <= 8 else 16 if ow <= 16 else 32
    rows = 2 if oh >= 16 else 1
    tile_h = rows
    while tile_h * 2 <= max(oh, rows) and tile_w * tile_h * 2 // rows <= 256:
        tile_h *= 2
    while tile_w * tile_h // rows < 32:
        tile_h *= 2
    config = DepthwiseConfig(tile_w, tile_h, rows)
    return config if _shared_bytes(p, config) <= MAX_SHARED_BYTES else DepthwiseConfig(8, 4)


def build(p: problems.Conv2d, c: DepthwiseConfig, machine) -> L.PrimFunc:
    """The scheduled kernel of `p` (see the module's docstring)."""
    images, channels, h, wid = p.x_dims
    _, _, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
    x = L.Buffer(p.x.name, p.x.dtype, p.x_dims)
    w = L.Buffer(p.w.name, p.w.dtype, (channels, kh * kw))
    y = L.Buffer(p.y.name, p.y.dtype, p.y_dims)
    wh, ww = window(p, c)
    tiles_w = -(-ow // c.tile_w)
    tiles = tiles_w * -(-oh // c.tile_h)
    img, ch, tile, t = L.Var("img"), L.Var("ch"), L.Var("tile"), L.Var("t")
    oy0, ox0 = tile // tiles_w * c.tile_h, tile % tiles_w * c.tile_w
    x_tile = L.Buffer("x_tile", T.float32, (wh * ww,), L.Scope.SHARED)
    w_tile = L.Buffer("w_tile", T.float32, (kh * kw,), L.Scope.SHARED)
    threads = c.threads

    # the window (padding as 0) and the weights into shared memory, every thread a share
    e, step = L.Var("e"), L.Var("l")
    iy, ix = oy0 * sh - ph + e // ww, ox0 * sw - pw + e % ww
    inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < wid)
    clamped = x[img, ch, L.minimum(L.maximum(iy, 0), h - 1),
                L.minimum(L.maximum(ix, 0), wid - 1)]
    copy = L.Store(x_tile, (e,), L.Select(inside, problems.widened(clamped),
                                          L.const(0.0, T.float32)))
    fill = L.For(step, -(-(wh * ww) // threads), L.Let(e, step * threads + t, L.If(
        e < wh * ww, copy)))
    weights = L.For(step, -(-(kh * kw) // threads), L.Let(e, step * threads + t, L.If(
        e < kh * kw, L.Store(w_tile, (e,), problems.widened(w[ch, e])))))
    load = L.For(t, threads, L.seq(fill, weights), L.ForKind.THREAD_X)

    # each thread: `rows` outputs of one column
    across = c.tile_w
    ty, tx = L.Var("ty"), L.Var("tx")
    acc = L.Buffer("acc", T.float32, (c.rows,), L.Scope.LOCAL)
    r, ky, kx = L.Var("r"), L.Var("ky"), L.Var("kx")
    zero = L.For(r, c.rows, L.Store(acc, (r,), L.const(0.0, T.float32)), L.ForKind.UNROLLED)
    at = ((ty * c.rows + r) * sh + ky * dh) * ww + tx * sw + kx * dw
    update = L.Store(acc, (r,), L.call("fma", x_tile[at], w_tile[ky * kw + kx], acc[r],
                                       dtype=T.float32))
    small = L.ForKind.UNROLLED if kh * kw <= 64 else L.ForKind.SERIAL
    taps = L.For(ky, kh, L.For(kx, kw, L.For(r, c.rows, update, L.ForKind.UNROLLED), small),
                 small)
    oy, ox = oy0 + ty * c.rows + r, ox0 + tx
    index = (img, ch, oy, ox)
    store = L.For(r, c.rows, L.If(L.logical_and(oy < oh, ox < ow),
                                  L.Store(y, index, p.finish(acc[r], index))),
                  L.ForKind.UNROLLED)
    compute = L.For(t, threads, L.Let(ty, t // across, L.Let(tx, t % across, L.Allocate(
        acc, L.seq(zero, taps, store)))), L.ForKind.THREAD_X)

    block = L.Allocate(x_tile, L.Allocate(w_tile, L.seq(load, L.Barrier(), compute)))
    body = L.For(img, images, L.For(ch, channels, L.For(tile, tiles, block, L.ForKind.BLOCK_X),
                                    L.ForKind.BLOCK_Y), L.ForKind.BLOCK_Z)
    views = {w.name: w, x.name: x, y.name: y}
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


DEPTHWISE = Template("cuda_depthwise", problems.conv2d, applies, space, default, build)
