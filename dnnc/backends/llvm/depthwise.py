"""The depthwise 2-D convolution template for CPUs (group == channels, one filter per channel,
NCHW float32): per plane, the input padded in a cache-resident buffer, then either each output
row in blocks of pixels (`_depthwise_rows`) or, at stride 1, blocks of the flattened padded
plane crossing rows (`_depthwise_flat`). It never serves a conv that is not depthwise.

The int8 depthwise template (`int8.DEPTHWISE_INT8`) is this nest on other `Values`: the plane
holds float32(x - zero point) (padding 0), the taps multiply float32 weights, and a sum (an
integer below 2**22 in magnitude, so every partial sum is exact in float32) is finished as
int32; a float32 fma runs as fast as an int32 multiply-add and needs no widening.

Knobs (`DepthwiseConfig`): pixels (a block's width), flat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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


@dataclass(frozen=True)
class Values:
    """What the nest reads and stores: `load(x element)` the float32 the padded plane holds
    (padding adds 0), `weight(w element)` a float32 tap, `finish(acc, ch, index)` channel ch's
    float32 sum as the value stored at `index` of y (bias, epilogue, the output's type)."""

    load: Callable
    weight: Callable
    finish: Callable


def float_values(p: Conv2d) -> Values:
    """A float32 conv's: elements as they are, the bias and the epilogue."""
    def finish(acc, ch, index):
        return p.epilogue(acc if p.bias is None else acc + p.bias[ch], index)
    return Values(lambda v: v, lambda v: v, finish)


FLAT_MAX_WIDTH = 32
"""Output rows narrower than this run a stride-1 depthwise conv flat by default (but a 3x3
window on rows of 7 or fewer): a 7- or 14-pixel row is one partial vector (or 4 + 2 + 1
lanes), where blocks of the flattened padded plane fill every lane. bench/depthwise.py, 1
thread, znver5, rows / flat: 5x5 1.17 (240x28x28) to 1.54 (1152x7x7); 3x3 384x14x14 1.20,
192x28x28 1.14, but 960x7x7 0.94 (its padded plane's copies cost what its 9 taps gain) and
56x56 or wider 0.85-0.96."""


def space(p: Conv2d, machine) -> Space:
    flat_ok = Constraint("flat needs stride 1 and no dilation",
                         lambda c: not c.flat or _flat_applies(p))
    return Space("depthwise", DepthwiseConfig, {"pixels": PIXEL_BLOCKS, "flat": (False, True)},
                 [flat_ok])


def _flat_applies(p: Conv2d) -> bool:
    return p.strides == (1, 1) and p.dilations == (1, 1)


def default(p: Conv2d, machine) -> DepthwiseConfig:
    lanes = machine.vector_bits // 32
    ow, kw = p.y_dims[3], p.w_dims[3]
    if _flat_applies(p) and ow < FLAT_MAX_WIDTH and (kw > 3 or ow > 7):
        return DepthwiseConfig(lanes, True)
    return DepthwiseConfig(lanes)


def build(p: Conv2d, config: DepthwiseConfig, machine, values: Values | None = None
          ) -> L.PrimFunc:
    """Depthwise 2-D convolution (group == channels, one filter per channel): per plane, the
    input padded in a cached buffer, then each output row in blocks of pixels, the window's
    taps broadcast from the filter; full blocks read the padded plane contiguously (at stride
    1; strided loads become one load and a shuffle), the row's tail runs narrower. `flat`
    (stride 1): `_depthwise_flat`."""
    n, c = p.x_dims[:2]
    _, _, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    # a plane's taps and its padded copy, against the threshold of the row templates (pool2d,
    # rows): a depthwise multiply-add is no GEMM's, mobilenet_v2's 3x3 convs on 7x7 planes
    # (960 channels, 0.42 M multiply-adds) ran on one thread under MIN_PARALLEL_MACS (Zen 3,
    # 2 threads: 0.057 -> 0.049 ms on both; 576 channels at stride 2, 0.052 -> 0.036)
    from .schedules import MIN_PARALLEL_WORK   # (schedules imports this module's templates)
    hp, wp = p.padded_hw
    par = parallel_kind(machine.threads, n * c * (oh * ow * kh * kw + hp * wp),
                        MIN_PARALLEL_WORK)
    plane = L.Var("plane")
    values = values or float_values(p)
    body = _depthwise_flat(p, config, plane, machine.vector_bits // 32, values) \
        if config.flat else _depthwise_rows(p, config, plane, values)
    return L.simplify(L.PrimFunc(p.name, p.params, L.For(plane, n * c, body, par)))


def _depthwise_rows(p: Conv2d, config: DepthwiseConfig, plane: L.Var, values: Values
                    ) -> L.Stmt:
    """Plane `plane`'s output rows in blocks of `pixels`."""
    w, y = p.w, p.y
    c = p.x_dims[1]
    _, _, kh, kw = p.w_dims
    _, _, oh, ow = p.y_dims
    (sh, sw), (dh, dw) = p.strides, p.dilations
    row = L.Var("row")
    bn, ch = plane // c, plane % c
    # a stride-2 window reads every other column: the plane is kept in phases (pad_plane),
    # so a tap's pixels are consecutive (Zen 3, 2 threads, 3x3 stride 2: c144 56x56 0.230 ->
    # 0.135 ms; c96 112x112, where copying the plane dominates, 0.348 -> 0.389 ms)
    phases = sw if sw > 1 and dw == 1 else 1
    xpad, pad_stmt = pad_plane(p.x, bn, ch, p.x_dims[2:], p.begins, p.padded_hw,
                               phases=phases, load=values.load)
    r, s, jj = L.Var("r"), L.Var("s"), L.Var("j")
    wv = L.Var("wv", T.float32)

    def tap_at(rr: L.Expr, col: L.Expr, ss: L.Expr) -> L.Expr:
        """The padded plane at row `rr`, column col * sw + ss * dw."""
        if phases == 1:
            return xpad[rr, col * sw + ss * dw]
        return xpad[rr, ss % phases, col + ss // phases]

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (width,), L.Scope.LOCAL)
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        init = L.For(jj, width, L.Store(acc, (jj,), L.const(0.0)), kind)
        tap = L.Let(wv, values.weight(w[ch, 0, r, s]), L.For(jj, width, L.Store(
            acc, (jj,), L.call("fma", tap_at(row * sh + r * dh, ow0 + jj, s), wv, acc[jj])),
            kind))
        value = values.finish(acc[jj], ch, (bn, ch, row, ow0 + jj))
        store = L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), value), kind)
        return L.Allocate(acc, L.seq(init, L.For(r, kh, L.For(s, kw, tap)), store))

    return L.Allocate(xpad, L.seq(pad_stmt, L.For(row, oh, row_in_vectors(block, ow,
                                                                          config.pixels))))


def _depthwise_flat(p: Conv2d, config: DepthwiseConfig, plane: L.Var, lanes: int,
                    values: Values) -> L.Stmt:
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
                    xflat, ((i_h + ph) * wp + i_w + pw,), values.load(p.x[bn, ch, i_h, i_w])),
                    L.ForKind.VECTORIZED)))
    acc = L.Buffer("acc", T.float32, (pix,), L.Scope.LOCAL)
    wv = L.Var("wv", T.float32)
    tap = L.Let(wv, values.weight(w[ch, 0, r, s]), L.For(jj, pix, L.Store(acc, (jj,), L.call(
        "fma", xflat[q * pix + jj + r * wp + s], wv, acc[jj])), vec))
    sums = L.For(q, blocks, L.Allocate(acc, L.seq(
        L.For(jj, pix, L.Store(acc, (jj,), L.const(0.0)), vec),
        L.For(r, kh, L.For(s, kw, tap)),
        L.For(jj, pix, L.Store(yflat, (q * pix + jj,), acc[jj]), vec))))
    row = L.Var("row")

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        value = values.finish(yflat[row * wp + ow0 + jj], ch, (bn, ch, row, ow0 + jj))
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        return L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), value), kind)

    back = L.For(row, oh, row_in_vectors(block, ow, lanes))
    return L.Allocate(xflat, L.Allocate(yflat, L.seq(pad, sums, back)))


DEPTHWISE = Template("depthwise", problems.conv2d, lambda p: p.float32 and p.depthwise,
                     space, default, build)
