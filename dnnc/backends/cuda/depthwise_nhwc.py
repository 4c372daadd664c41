"""The cuda channels-last depthwise convolution template: a depthwise ConvNHWC
(`convert_layout`'s "nhwc_conv" at tf32, fp16 and bf16; MobileNet's and EfficientNet's 3x3
and 5x5, ConvNeXt's 7x7), a block per tile of output pixels x a run of channels.

Y[img, oy, ox, c] = sum over (ky, kx) of W[c, ky, kx, 0] X[img, oy sh - ph + ky dh,
ox sw - pw + kx dw, c]. A block (blockIdx.z: the image, blockIdx.y: the run of `channels`
channels, blockIdx.x: the tile of `tile_h` x `tile_w` output pixels) copies the input window
its tile reads (tile + halo) into shared memory in the storage type, `vector` channels at a
time (one 16-byte float4 at tf32, one 8-byte ushort4 of 4 fp16 / bf16 channels; padding and
channels past C stored as 0), and the run's kh kw weights widened to float32. A thread then
takes `vector` adjacent channels of `rows` horizontally adjacent output pixels, a window row
at a time: the row's taps' weights to registers, then each window column its pixels read
with one vector load from shared memory (consecutive threads on consecutive channels: no
bank conflicts), used by every tap of every pixel that reads it; it accumulates in fp32
registers, adds the bias and rounds once through the fused epilogue
(`Conv2dNHWC.finish`: SiLU's Sigmoid and Mul, ReLU6's Clip), and stores the `vector`
channels with one vector store. Before it such a conv ran one thread per output on the
default template (efficientnet_b0 batch 32 fp16 on an H200: 1.50 ms over its 16 depthwise
kernels, against 0.92 ms for the NCHW `cuda_depthwise`; issue 31).

Knobs (`DepthwiseNHWCConfig`, searched by the tuner): the tile, output pixels a thread, the
run of channels a block and the vector width. Never used for a ConvNHWC that is not
depthwise (conv_nhwc.py) nor for NCHW convolutions (depthwise.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Constraint, Space, Template
from .dense import MAX_GRID_YZ, MAX_SHARED_BYTES

MAX_THREADS = 1024
VECTOR_BYTES = 16
"""The widest vector access: 4 float32; 16-bit types go as ushort4 (the widest vector type
the renderer has for them, 8 bytes)."""


@dataclass(frozen=True)
class DepthwiseNHWCConfig:
    """Knobs of the channels-last depthwise template."""

    tile_w: int = 8      # output columns a block
    tile_h: int = 8      # output rows a block
    rows: int = 1        # horizontally adjacent output pixels a thread
    channels: int = 32   # channels a block (a run: threads along it, `vector` each)
    vector: int = 4      # adjacent channels a thread, one vector access each way

    @property
    def threads(self) -> int:
        return self.channels // self.vector * (self.tile_w // self.rows) * self.tile_h


def window(p: problems.Conv2dNHWC, c: DepthwiseNHWCConfig) -> tuple[int, int]:
    """(rows, columns) of the input a tile reads."""
    _, kh, kw, _ = p.w_dims
    (sh, sw), (dh, dw) = p.strides, p.dilations
    return (c.tile_h - 1) * sh + (kh - 1) * dh + 1, (c.tile_w - 1) * sw + (kw - 1) * dw + 1


def shared_bytes(p: problems.Conv2dNHWC, c: DepthwiseNHWCConfig) -> int:
    """The window (storage type) and the run's weights (float32), each 16-byte aligned."""
    wh, ww = window(p, c)
    item = p.x.dtype.itemsize
    pad = lambda n: -(-n // 16) * 16   # noqa: E731
    return pad(wh * ww * c.channels * item) + pad(4 * p.w_dims[1] * p.w_dims[2] * c.channels)


def vector_widths(p: problems.Conv2dNHWC) -> tuple[int, ...]:
    """The vector widths the channels allow: dividing C (every vector whole and aligned) and
    at most 4 (the renderer's widest vector type)."""
    c = p.x_dims[3]
    return tuple(v for v in (1, 2, 4) if c % v == 0 and v * p.x.dtype.itemsize <= VECTOR_BYTES)


def applies(p: problems.Conv2dNHWC) -> bool:
    images, channels = p.x_dims[0], p.x_dims[3]
    return p.depthwise and images <= MAX_GRID_YZ and channels <= MAX_GRID_YZ


def space(p: problems.Conv2dNHWC, machine) -> Space:
    widths = vector_widths(p)
    return Space("cuda_depthwise_nhwc", DepthwiseNHWCConfig, {
        "tile_w": (1, 2, 4, 8, 16, 32), "tile_h": (1, 2, 4, 8, 16), "rows": (1, 2, 4, 8),
        "channels": (4, 8, 16, 32, 64, 128), "vector": (1, 2, 4)},
        [Constraint("rows divides tile_w", lambda c: c.tile_w % c.rows == 0),
         Constraint(f"vector divides C ({', '.join(map(str, widths))})",
                    lambda c: c.vector in widths),
         Constraint("vector divides channels", lambda c: c.channels % c.vector == 0),
         Constraint(f"32 to {MAX_THREADS} threads a block",
                    lambda c: 32 <= c.threads <= MAX_THREADS),
         Constraint("the window and weights within 48 KiB of shared memory",
                    lambda c: shared_bytes(p, c) <= MAX_SHARED_BYTES)])


def default(p: problems.Conv2dNHWC, machine) -> DepthwiseNHWCConfig:
    """The widest vector C allows; a run of 32 channels (16 or 8 where C is a multiple of
    those and not of 32, so that no block computes padding channels); an 8 x 8 tile (4 x 8
    on planes of 4 rows or fewer), 2 pixels a thread (the row's weights loaded once for both)
    on planes wider than 4; windows 5 or more wide take 4 pixels a thread (a row's loads
    shared by more taps: `_outputs`) and, on planes of 14 rows or more, 8 x 16 tiles (less
    halo a pixel); halved while the window exceeds shared memory or the block 1024 threads,
    doubled up to 128 threads where the run is narrow. On an H200 at fp16, batch 32
    (bench/gpu_depthwise.py), convnext_tiny's 7 x 7s at 56, 28, 14 and 7: 79.2, 53.1, 28.7
    and 16.2 us with 2 pixels a thread in 8 x 8 tiles, 69.4, 46.7, 25.5 and 13.5 with 4, and
    62.9, 36.3, 20.1 in 8 x 16 tiles (torch channels_last 101.8, 58.9, 32.6, 25.3)."""
    c, ow = p.x_dims[3], p.y_dims[2]
    vector = max(vector_widths(p))
    run = next((r for r in (32, 16, 8) if c % r == 0), 32)
    run = max(run, vector)
    wide = p.w_dims[2] >= 5
    rows = 4 if wide and ow > 4 else 2 if ow > 4 else 1
    tile_h = 4 if p.y_dims[1] <= 4 else 16 if wide and p.y_dims[1] >= 14 else 8
    config = DepthwiseNHWCConfig(8, tile_h, rows, run, vector)
    while config.threads < 128 and config.tile_h < 16:
        config = DepthwiseNHWCConfig(8, config.tile_h * 2, rows, run, vector)
    while (shared_bytes(p, config) > MAX_SHARED_BYTES or config.threads > MAX_THREADS) and \
            config.tile_h > 1:
        config = DepthwiseNHWCConfig(8, config.tile_h // 2, rows, run, vector)
    while config.threads < 32:
        config = DepthwiseNHWCConfig(8, config.tile_h, 1, run, vector)
        if config.threads < 32:
            config = DepthwiseNHWCConfig(8, config.tile_h, 1, max(run, 32), vector)
            break
    return config


def build(p: problems.Conv2dNHWC, c: DepthwiseNHWCConfig, machine) -> L.PrimFunc:
    """The scheduled kernel of `p` (see the module's docstring)."""
    images, h, wid, channels = p.x_dims
    _, kh, kw, _ = p.w_dims
    _, oh, ow, _ = p.y_dims
    x = L.Buffer(p.x.name, p.x.dtype, p.x_dims)
    w = L.Buffer(p.w.name, p.w.dtype, (channels, kh * kw))
    y = L.Buffer(p.y.name, p.y.dtype, p.y_dims)
    wh, ww = window(p, c)
    tiles_w = -(-ow // c.tile_w)
    tiles = tiles_w * -(-oh // c.tile_h)
    runs = -(-channels // c.channels)
    img, run, tile, t = L.Var("img"), L.Var("run"), L.Var("tile"), L.Var("t")
    x_tile = L.Buffer("x_tile", p.x.dtype, (wh * ww * c.channels,), L.Scope.SHARED)
    w_tile = L.Buffer("w_tile", T.float32, (kh * kw * c.channels,), L.Scope.SHARED)
    origin = (tile // tiles_w * c.tile_h, tile % tiles_w * c.tile_w, run * c.channels)
    load = L.For(t, c.threads, L.seq(_fill(p, c, x, x_tile, origin, img, t),
                                     _weights(p, c, w, w_tile, origin[2], t)),
                 L.ForKind.THREAD_X)
    compute = L.For(t, c.threads, _outputs(p, c, y, x_tile, w_tile, origin, img, t),
                    L.ForKind.THREAD_X)
    block = L.Allocate(x_tile, L.Allocate(w_tile, L.seq(load, L.Barrier(), compute)))
    body = L.For(img, images, L.For(run, runs, L.For(tile, tiles, block, L.ForKind.BLOCK_X),
                                    L.ForKind.BLOCK_Y), L.ForKind.BLOCK_Z)
    views = {w.name: w, x.name: x, y.name: y}
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


def _fill(p, c, x, x_tile, origin, img, t) -> L.Stmt:
    """The window into shared memory, a vector of channels a step, every thread a share:
    0 where the tap falls in the padding or past C (the If guards the read)."""
    _, h, wid, channels = p.x_dims
    (sh, sw), (ph, pw) = p.strides, p.begins
    wh, ww = window(p, c)
    oy0, ox0, c0 = origin
    groups = c.channels // c.vector
    e, step, v = L.Var("e"), L.Var("l"), L.Var("v")
    iy, ix = oy0 * sh - ph + e // groups // ww, ox0 * sw - pw + e // groups % ww
    ch = c0 + e % groups * c.vector
    inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < wid, ch < channels)
    at = e * c.vector
    copy = L.For(v, c.vector, L.Store(x_tile, (at + v,), x[img, iy, ix, ch + v]),
                 L.ForKind.VECTORIZED)
    zero = L.For(v, c.vector, L.Store(x_tile, (at + v,), L.const(0.0, x_tile.dtype)),
                 L.ForKind.VECTORIZED)
    count = wh * ww * groups
    return L.For(step, -(-count // c.threads), L.Let(e, step * c.threads + t, L.If(
        e < count, L.If(inside, copy, zero))))


def _weights(p, c, w, w_tile, c0, t) -> L.Stmt:
    """The run's weights into shared memory as float32, [tap, channel] (0 past C)."""
    channels, taps = p.x_dims[3], p.w_dims[1] * p.w_dims[2]
    e, step = L.Var("e"), L.Var("l")
    ch = c0 + e % c.channels
    value = L.Select(ch < channels, problems.widened(
        w[L.minimum(ch, channels - 1), e // c.channels]), L.const(0.0, T.float32))
    count = taps * c.channels
    return L.For(step, -(-count // c.threads), L.Let(e, step * c.threads + t, L.If(
        e < count, L.Store(w_tile, (e,), value))))


def _outputs(p, c, y, x_tile, w_tile, origin, img, t) -> L.Stmt:
    """A thread's `vector` channels of `rows` adjacent output pixels: fp32 sums over the
    taps from shared memory, then the epilogue and one vector store a pixel.

    A window row at a time (ky), sliding: the row's kw taps' weights go to registers once,
    then each input column the thread's pixels read in that row is loaded once and used by
    every (pixel r, tap kx) that reads it (r sw + kx dw = the column: unrolled here), so a row
    costs (rows - 1) sw + (kw - 1) dw + 1 window loads, not rows kw (a 7 x 7 conv, 4 pixels:
    10, not 28); the shared-memory loads bounded the one-load-a-tap form (convnext_tiny's
    7 x 7 at batch 32, fp16, H200: 0.46 TB/s)."""
    _, oh, ow, channels = p.y_dims
    _, kh, kw, _ = p.w_dims
    (sh, sw), (dh, dw) = p.strides, p.dilations
    _, ww = window(p, c)
    oy0, ox0, c0 = origin
    groups, across = c.channels // c.vector, c.tile_w // c.rows
    vec, rows = c.vector, c.rows
    lane, py, px = L.Var("lane"), L.Var("py"), L.Var("px")
    acc = L.Buffer("acc", T.float32, (rows * vec,), L.Scope.LOCAL)
    xin = L.Buffer("xin", x_tile.dtype, (vec,), L.Scope.LOCAL)
    wrow = L.Buffer("wrow", T.float32, (kw * vec,), L.Scope.LOCAL)
    out = L.Buffer("out", y.dtype, (vec,), L.Scope.LOCAL)
    r, v, ky, kx = L.Var("r"), L.Var("v"), L.Var("ky"), L.Var("kx")
    unrolled, vectorized = L.ForKind.UNROLLED, L.ForKind.VECTORIZED

    zero = L.For(r, rows * vec, L.Store(acc, (r,), L.const(0.0, T.float32)), unrolled)
    first = lane * vec
    weights = L.For(kx, kw, L.For(v, vec, L.Store(
        wrow, (kx * vec + v,), w_tile[(ky * kw + kx) * c.channels + first + v]), vectorized),
        unrolled)
    row = (py * sh + ky * dh) * ww + px * rows * sw
    columns = []
    for j in range((rows - 1) * sw + (kw - 1) * dw + 1):
        users = [(ri, ki) for ri in range(rows) for ki in range(kw) if ri * sw + ki * dw == j]
        if not users:
            continue
        read = L.For(v, vec, L.Store(xin, (v,), x_tile[(row + j) * c.channels + first + v]),
                     vectorized)
        fmas = [L.For(v, vec, L.Store(acc, (ri * vec + v,), L.call(
            "fma", problems.widened(xin[v]), wrow[ki * vec + v], acc[ri * vec + v],
            dtype=T.float32)), unrolled) for ri, ki in users]
        columns.append(L.seq(read, *fmas))
    taps = L.For(ky, kh, L.seq(weights, L.Allocate(xin, L.seq(*columns))),
                 unrolled if kh * kw <= 64 else L.ForKind.SERIAL)

    oy, ox, ch = oy0 + py, ox0 + px * rows + r, c0 + first
    finish = L.For(v, vec, L.Store(out, (v,), p.finish(acc[r * vec + v], (img, oy, ox, ch + v))),
                   unrolled)
    store = L.For(v, vec, L.Store(y, (img, oy, ox, ch + v), out[v]), vectorized)
    stores = L.For(r, rows, L.If(L.logical_and(oy < oh, ox < ow, ch < channels),
                                 L.seq(finish, store)), unrolled)
    body = L.Allocate(acc, L.Allocate(wrow, L.Allocate(out, L.seq(zero, taps, stores))))
    return L.Let(lane, t % groups, L.Let(py, t // groups // across, L.Let(
        px, t // groups % across, body)))


DEPTHWISE_NHWC = Template("cuda_depthwise_nhwc", problems.conv2d_nhwc, applies, space,
                          default, build)
