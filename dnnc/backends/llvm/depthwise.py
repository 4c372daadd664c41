"""The depthwise 2-D convolution template for CPUs (group == channels, one filter per channel,
NCHW float32): per plane, the input padded in a cache-resident buffer, then either each output
row in blocks of pixels (`_depthwise_rows`) or, at stride 1, blocks of the flattened padded
plane crossing rows (`_depthwise_flat`); or, on small planes, a vector of channels at a time
(`_depthwise_channels`: the planes of a block of channels interleaved, as onnxruntime's and
oneDNN's NCHWc kernels hold them). It never serves a conv that is not depthwise.

Knobs (`DepthwiseConfig`): pixels (a block's width), flat, channels, rows (by rows: output
rows a block computes together).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Conv2d
from ..space import Constraint, Space, Template
from .conv import PIXEL_BLOCKS, pad_plane, parallel_kind, row_in_vectors


@dataclass(frozen=True)
class DepthwiseConfig:
    pixels: int    # output pixels per block of a row (a narrower block ends the row)
    flat: bool = False   # stride 1: blocks of the flattened padded plane, not of a row
    channels: bool = False   # a vector of channels a step, their planes interleaved
    rows: int = 1   # by rows: output rows a block computes, sharing their input rows' loads


def _finish(p: Conv2d, acc: L.Expr, ch, index) -> L.Expr:
    """Channel ch's sum as the value stored at `index` of y: the bias, the epilogue."""
    return p.epilogue(acc if p.bias is None else acc + p.bias[ch], index)


FLAT_MAX_WIDTH = 16
"""Output rows narrower than this run a stride-1 depthwise conv flat by default (but a 3x3
window on rows of 7 or fewer): a 7- or 14-pixel row is one partial vector (or 4 + 2 + 1
lanes), where blocks of the flattened padded plane fill every lane. bench/depthwise.py, 1
thread, znver5, rows / flat: 5x5 1.17 (240x28x28) to 1.54 (1152x7x7); 3x3 384x14x14 1.20,
192x28x28 1.14, but 960x7x7 0.94 (its padded plane's copies cost what its 9 taps gain) and
56x56 or wider 0.85-0.96. Since rows share their loads (`DEFAULT_ROWS`), 28-pixel rows run
faster by rows (2 threads, znver5, kernel alone: 192x28x28 3x3 21.9 -> 15.5 us, 240x28x28
5x5 58.5 -> 50.4, 120x28x28 5x5 32.9 -> 28.4) and 14-pixel ones stay flat (480x14x14 5x5
34.4 -> 33.3, 672x14x14 47.6 -> 51.7, 384x14x14 3x3 11.1 -> 12.7)."""

DEFAULT_ROWS = 4
"""Output rows a block by rows computes by default: their windows overlap, so a tap's vector
loaded once serves up to kh of them (most loads of a padded row cross a cache line: the
one-row block was bound by them). 2 threads, znver5, kernel alone, 1 -> 4 rows: 3x3 stride 1
32x112x112 60.7 -> 37.0 us, 144x56x56 65.0 -> 38.5, 96x56x56 48.2 -> 28.6; stride 2
96x112x112 95.1 -> 85.8, 144x56x56 35.0 -> 31.2, 576x14x14 14.5 -> 11.0; 5x5 stride 2
144x56x56 61.4 -> 43.3, 672x28x28 71.1 -> 56.8. (6 rows lost at 144x56x56: 68.2.)"""

ROW_BLOCKS = (1, 2, 3, 4)
"""Output rows a block by rows may compute together (`rows`)."""


CHANNELS_PLANE_BYTES = 32 << 10
"""A vector of channels' padded planes, interleaved, at most this big for `channels` (the
taps read it from L1)."""

CHANNELS_MAX_PIXELS = 16
"""Pixels a block of `channels` has at most: a vector of accumulators each, with the weight
and the loads in the rest of AVX-512's 32 registers."""


def space(p: Conv2d, machine) -> Space:
    flat_ok = Constraint("flat needs stride 1 and no dilation",
                         lambda c: not c.flat or _flat_applies(p))
    lanes = machine.vector_bits // 32
    channels_ok = Constraint(
        f"channels: not flat, pixels <= {CHANNELS_MAX_PIXELS}, and {lanes} padded planes "
        f"within {CHANNELS_PLANE_BYTES} bytes",
        lambda c: not c.channels or (not c.flat and c.pixels <= CHANNELS_MAX_PIXELS
                                     and _channels_fit(p, lanes)))
    rows_ok = Constraint("rows > 1 only by rows (not flat, not channels)",
                         lambda c: c.rows == 1 or not (c.flat or c.channels))
    return Space("depthwise", DepthwiseConfig, {"pixels": PIXEL_BLOCKS, "flat": (False, True),
                                                "channels": (False, True), "rows": ROW_BLOCKS},
                 [flat_ok, channels_ok, rows_ok])


def _channels_fit(p: Conv2d, lanes: int) -> bool:
    hp, wp = p.padded_hw
    return hp * wp * lanes * 4 <= CHANNELS_PLANE_BYTES


def _flat_applies(p: Conv2d) -> bool:
    return p.strides == (1, 1) and p.dilations == (1, 1)


CHANNELS_MAX_WIDTH = 7
"""Output rows at most this wide run a stride-1 depthwise conv a vector of channels at a time
by default (`channels`). Alone, 1 thread, znver5, CPU time, rows or flat -> channels:
1152x7x7 5x5 70.2 -> 44.8 us, 960x7x7 3x3 36.2 -> 28.9 us (onnxruntime 35.2, 22.7), but
14x14 planes lost (576x14x14 3x3 30.2 -> 96.1 us, 672x14x14 5x5 100.8 -> 140.2; at stride 2
1.3-2.9x): copying a plane into the interleaved buffer costs a scalar store a pixel, which
a 7x7 output's taps repay and a larger or strided one's do not. Whole models, 0 -> 7
(medians of 5 interleaved blocks of CPU time, one process): efficientnet_b0 0.979x,
mobilenet_v3_small 0.956x, mobilenet_v2 1.019x (its 960x7x7 3x3; within this shared host's
noise)."""


def _channels_default(p: Conv2d, lanes: int) -> bool:
    return (p.y_dims[3] <= CHANNELS_MAX_WIDTH and _flat_applies(p)
            and _channels_fit(p, lanes))


def _channels_pixels(ow: int) -> int:
    """Pixels a block of `channels`: a row's in as few even blocks as CHANNELS_MAX_PIXELS
    allows (a 14-pixel row one block, 28 two of 14)."""
    parts = -(-ow // CHANNELS_MAX_PIXELS)
    return -(-ow // parts)


def default(p: Conv2d, machine) -> DepthwiseConfig:
    lanes = machine.vector_bits // 32
    ow, kw = p.y_dims[3], p.w_dims[3]
    if _channels_default(p, lanes):
        return DepthwiseConfig(_channels_pixels(ow), channels=True)
    if _flat_applies(p) and ow < FLAT_MAX_WIDTH and (kw > 3 or ow > 7):
        return DepthwiseConfig(lanes, True)
    return DepthwiseConfig(lanes, rows=DEFAULT_ROWS)


def build(p: Conv2d, config: DepthwiseConfig, machine) -> L.PrimFunc:
    """Depthwise 2-D convolution (group == channels, one filter per channel): per plane, the
    input padded in a cached buffer, then each output row in blocks of pixels, the window's
    taps broadcast from the filter; full blocks read the padded plane contiguously (at stride
    1; strided loads become one load and a shuffle), the row's tail runs narrower. `flat`
    (stride 1): `_depthwise_flat`."""
    n, c = p.x_dims[:2]
    _, _, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    par = plane_parallel(p, machine)
    plane = L.Var("plane")
    lanes = machine.vector_bits // 32
    if config.channels:
        blocks = -(-c // lanes)
        return L.simplify(L.PrimFunc(p.name, p.params, L.For(
            plane, n * blocks, _depthwise_channels(p, config, plane, lanes), par)))
    body = _depthwise_flat(p, config, plane, lanes) if config.flat else \
        _depthwise_rows(p, config, plane)
    return L.simplify(L.PrimFunc(p.name, p.params, L.For(plane, n * c, body, par)))


def plane_parallel(p, machine) -> L.ForKind:
    """The loop over a depthwise conv's planes (float32 or int8): parallel where a plane's
    taps and its padded copy, summed, reach the row templates' threshold (pool2d, rows): a
    depthwise multiply-add is no GEMM's, mobilenet_v2's 3x3 convs on 7x7 planes (960
    channels, 0.42 M multiply-adds) ran on one thread under MIN_PARALLEL_MACS (Zen 3, 2
    threads: 0.057 -> 0.049 ms on both; 576 channels at stride 2, 0.052 -> 0.036)."""
    from .schedules import MIN_PARALLEL_WORK   # (schedules imports this module's templates)
    n, c = p.x_dims[:2]
    _, _, oh, ow = p.y_dims
    kh, kw = p.w_dims[2:]
    hp, wp = p.padded_hw
    return parallel_kind(machine.threads, n * c * (oh * ow * kh * kw + hp * wp),
                         MIN_PARALLEL_WORK)


def _depthwise_rows(p: Conv2d, config: DepthwiseConfig, plane: L.Var) -> L.Stmt:
    """Plane `plane`'s output rows, `rows` at a time, each in blocks of `pixels`: a block's
    output rows share the input rows their windows overlap on, each tap's vector loaded once
    and multiplied into every output row it reaches (a 3x3 window over 4 output rows loads 6
    input rows' taps for 4 rows' sums, not 12; the tap loads, most of them crossing a cache
    line, bounded the one-row block)."""
    w, y = p.w, p.y
    c = p.x_dims[1]
    _, _, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    (sh, sw), (dh, dw) = p.strides, p.dilations
    bn, ch = plane // c, plane % c
    # a stride-2 window reads every other column: the plane is kept in phases (pad_plane),
    # so a tap's pixels are consecutive (Zen 3, 2 threads, 3x3 stride 2: c144 56x56 0.230 ->
    # 0.135 ms; c96 112x112, where copying the plane dominates, 0.348 -> 0.389 ms; the copy
    # in vectors since, znver4, kernel alone, 2 threads: c96 112x112 0.25 -> 0.135-0.157 ms,
    # onnxruntime 0.126-0.140; c144 56x56 0.093 -> 0.046)
    phases = sw if sw > 1 and dw == 1 else 1
    xpad, pad_stmt = pad_plane(p.x, bn, ch, p.x_dims[2:], p.begins, p.padded_hw,
                               phases=phases)
    jj = L.Var("j")

    def tap_at(rr: L.Expr, col: L.Expr, ss: int) -> L.Expr:
        """The padded plane at row `rr`, column col * sw + ss * dw."""
        if phases == 1:
            return xpad[rr, col * sw + ss * dw]
        return xpad[rr, ss % phases, col + ss // phases]

    def block(count: int, row0: L.Expr, width: int, ow0: L.Expr) -> L.Stmt:
        """Output rows row0 .. row0 + count - 1, pixels ow0 .. ow0 + width - 1."""
        acc = L.Buffer("acc", T.float32, (count * width,), L.Scope.LOCAL)
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        init = L.For(jj, count * width, L.Store(acc, (jj,), L.const(0.0)), kind)
        # each input row the block reads (offset ro * sh + r * dh from row0 * sh), its taps
        # in turn, each into every output row ro whose window row r reads it
        reach: dict[int, list[tuple[int, int]]] = {}
        for ro in range(count):
            for r in range(kh):
                reach.setdefault(ro * sh + r * dh, []).append((ro, r))
        taps = []
        for offset in sorted(reach):
            for s in range(kw):
                for ro, r in reach[offset]:
                    at = ro * width + jj
                    taps.append(L.For(jj, width, L.Store(acc, (at,), L.call(
                        "fma", tap_at(row0 * sh + offset, ow0 + jj, s), w[ch, 0, r, s],
                        acc[at])), kind))
        stores = []
        for ro in range(count):
            index = (bn, ch, row0 + ro, ow0 + jj)
            stores.append(L.For(jj, width, L.Store(
                y, index, _finish(p, acc[ro * width + jj], ch, index)), kind))
        return L.Allocate(acc, L.seq(init, *taps, *stores))

    rb = L.Var("rb")
    count = min(config.rows, oh)   # (more rows than the plane has: all of them at once)
    parts = [L.For(rb, oh // count, row_in_vectors(
        lambda width, ow0: block(count, rb * count, width, ow0), ow, config.pixels))]
    if oh % count:
        parts.append(row_in_vectors(lambda width, ow0: block(
            oh % count, L.const(oh // count * count), width, ow0), ow, config.pixels))
    return L.Allocate(xpad, L.seq(pad_stmt, *parts))


def _depthwise_flat(p: Conv2d, config: DepthwiseConfig, plane: L.Var, lanes: int
                    ) -> L.Stmt:
    """Plane `plane` at stride 1 as a 1-D convolution of its padded plane flattened: output
    q = row * wp + col (col < wp, the columns past the output's computed and dropped) is the
    sum over taps (r, s) of padded[q + r * wp + s] w[r, s], so a block of `pixels`
    consecutive q crosses rows and fills every lane of a 7-pixel row's plane; the block's
    sums go to a scratch plane, then each output row is read back from it through bias and
    the epilogue. The padded plane has zero rows below it for the last block's taps."""
    w, y = p.w, p.y
    c, h, wid = p.x_dims[1:]
    _, _, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    (ph, pw), (_, wp) = p.begins, p.padded_hw
    pix = config.pixels
    blocks = -(-oh * wp // pix)
    size = blocks * pix + (kh - 1) * wp + kw - 1        # the last block's last tap
    bn, ch = plane // c, plane % c
    xflat = L.Buffer("xplane", T.float32, (size,))
    yflat = L.Buffer("yplane", T.float32, (blocks * pix,))
    i_h, i_w, q, jj, r, s = (L.Var(v) for v in ("ph", "pw", "q", "j", "r", "s"))
    vec = L.ForKind.VECTORIZED if pix >= 2 else L.ForKind.UNROLLED
    pad = L.seq(L.For(i_h, size, L.Store(xflat, (i_h,), L.const(0.0)), L.ForKind.VECTORIZED),
                L.For(i_h, h, L.For(i_w, wid, L.Store(
                    xflat, ((i_h + ph) * wp + i_w + pw,), p.x[bn, ch, i_h, i_w]),
                    L.ForKind.VECTORIZED)))
    acc = L.Buffer("acc", T.float32, (pix,), L.Scope.LOCAL)
    wv = L.Var("wv", T.float32)
    tap = L.Let(wv, w[ch, 0, r, s], L.For(jj, pix, L.Store(acc, (jj,), L.call(
        "fma", xflat[q * pix + jj + r * wp + s], wv, acc[jj])), vec))
    sums = L.For(q, blocks, L.Allocate(acc, L.seq(
        L.For(jj, pix, L.Store(acc, (jj,), L.const(0.0)), vec),
        L.For(r, kh, L.For(s, kw, tap)),
        L.For(jj, pix, L.Store(yflat, (q * pix + jj,), acc[jj]), vec))))
    row = L.Var("row")

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        value = _finish(p, yflat[row * wp + ow0 + jj], ch, (bn, ch, row, ow0 + jj))
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        return L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), value), kind)

    back = L.For(row, oh, row_in_vectors(block, ow, lanes))
    return L.Allocate(xflat, L.Allocate(yflat, L.seq(pad, sums, back)))


def _depthwise_channels(p: Conv2d, config: DepthwiseConfig, block: L.Var, lanes: int
                        ) -> L.Stmt:
    """Block `block` (image block // blocks, channels from (block % blocks) * lanes) a vector
    of channels at a time: their planes copied, padded, into one interleaved buffer
    ([hp, wp, lanes]: a pixel's channels one vector) and their taps into [kh, kw, lanes]; then
    each output row in blocks of `pixels`, a vector of accumulators a pixel, every tap one
    full-width multiply-add per pixel whatever the plane's width (a 7-pixel row by rows fills
    7 of 16 lanes); each channel's pixels stored from the accumulators transposed in
    registers. A last block of fewer channels than lanes runs narrower."""
    c = p.x_dims[1]
    blocks = -(-c // lanes)
    full, tail = c // lanes, c % lanes
    bn, cb = block // blocks, block % blocks
    if not tail:
        return _channels_block(p, config, bn, cb * lanes, lanes)
    narrow = _channels_block(p, config, bn, L.const(full * lanes), tail)
    if not full:
        return narrow
    return L.If(cb < full, _channels_block(p, config, bn, cb * lanes, lanes), narrow)


def _channels_block(p: Conv2d, config: DepthwiseConfig, bn: L.Expr, c0: L.Expr,
                    width: int) -> L.Stmt:
    """`width` channels from `c0` of image `bn` (`_depthwise_channels`)."""
    h, wid = p.x_dims[2:]
    _, _, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    (ph, pw), (hp, wp) = p.begins, p.padded_hw
    (sh, sw), (dh, dw) = p.strides, p.dilations
    xt = L.Buffer("xlanes", T.float32, (hp * wp * width,))
    wt = L.Buffer("wlanes", T.float32, (kh * kw * width,))
    i, i_h, i_w, ll, r, s, jj, row = (L.Var(v) for v in ("i", "ph", "pw", "l", "r", "s", "j",
                                                         "row"))
    vec, unrolled = L.ForKind.VECTORIZED, L.ForKind.UNROLLED
    zero = L.For(i, hp * wp * width, L.Store(xt, (i,), L.const(0.0)), vec)
    # a pixel's channels a vector (a gather from their planes, one store), not a channel's
    # pixels a scalar store each (2 threads, znver5, kernel alone: 960x7x7 3x3 13.1 -> 10.2
    # us, 1152x7x7 5x5 20.6 -> 17.6; 1 thread 22.5 -> 18.6, 39.1 -> 33.3)
    copy = L.For(i_h, h, L.For(i_w, wid, L.For(ll, width, L.Store(
        xt, (((i_h + ph) * wp + i_w + pw) * width + ll,), p.x[bn, c0 + ll, i_h, i_w]),
        vec)))
    taps = L.For(r, kh, L.For(s, kw, L.For(ll, width, L.Store(
        wt, ((r * kw + s) * width + ll,), p.w[c0 + ll, 0, r, s]), vec)))

    def pixels(n: int, ow0: L.Expr) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (n * width,), L.Scope.LOCAL)
        at = jj * width + ll
        init = L.For(jj, n, L.For(ll, width, L.Store(acc, (at,), L.const(0.0)), vec),
                     unrolled)
        x_at = xt[((row * sh + r * dh) * wp + (ow0 + jj) * sw + s * dw) * width + ll]
        step = L.For(jj, n, L.For(ll, width, L.Store(acc, (at,), L.call(
            "fma", x_at, wt[(r * kw + s) * width + ll], acc[at])), vec), unrolled)
        value = acc[at]
        if p.bias is not None:
            value = value + p.bias[c0 + ll]
        value = p.epilogue(value, (bn, c0 + ll, row, ow0 + jj))
        finish = []
        if _reads_only(value, (acc, p.bias)) and value.dtype is T.float32:
            # applied in the accumulators, a vector of channels a step: by the stored rows a
            # 7-pixel row filled 7 of 16 lanes (1 thread, znver4, CPU time, two runs:
            # 1152x7x7 5x5 + SiLU 139-149 -> 101-129 us, 960x7x7 3x3 + SiLU 86-108 -> 65-66,
            # + ReLU 0.89-0.96x)
            finish = [L.For(jj, n, L.For(ll, width, L.Store(acc, (at,), value), vec),
                            unrolled)]
            value = acc[at]
        kind = vec if n >= 2 else unrolled
        store = L.For(ll, width, L.For(jj, n, L.Store(p.y, (bn, c0 + ll, row, ow0 + jj),
                                                      value), kind), unrolled)
        return L.Allocate(acc, L.seq(init, L.For(r, kh, L.For(s, kw, step)), *finish, store))

    rows = L.For(row, oh, row_in_vectors(pixels, ow, config.pixels))
    return L.Allocate(xt, L.Allocate(wt, L.seq(zero, copy, taps, rows)))


def _reads_only(e: L.Expr, buffers) -> bool:
    """Whether expression `e` loads from no buffer but `buffers` (None entries ignored)."""
    names = {b.name for b in buffers if b is not None}
    return all(x.buffer.name in names for x in L.walk(e) if isinstance(x, L.Load))


DEPTHWISE = Template("depthwise", problems.conv2d, lambda p: p.float32 and p.depthwise,
                     space, default, build)
