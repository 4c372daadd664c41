"""The int8 depthwise conv template for CPUs (`depthwise_int8`: a depthwise QuantizedConv,
NCHW int8 / uint8, one filter per channel): int32 sums of u8 x s8 products four taps at a
time (`dot_u8s8x4`: vpdpbusd where the CPU has VNNI), the requantization fused where a block
stores.

A depthwise conv has no channel sum to take vpdpbusd's 4 bytes from; its 4 bytes are 4 taps
of a filter row instead. Per plane (the worker pool's unit): the plane's bytes copied into a
padded buffer (the zero point around it: padding then adds nothing after the compensation),
then `words`: for each padded row and output column, the bytes under taps 4g .. 4g + 3 of a
filter row as one uint32 (`pack_u8x4`: a vector of words one interleaving shuffle of 4
byte loads; at stride 2 the padded row is kept in phases, so these are consecutive bytes
too), xor 0x80808080 for int8 (read as x + 128, the u8 x s8 product's
operand); a filter row of kw taps is ceil(kw / 4) words, the taps past kw 0. An output pixel
is then sum over filter rows ky and groups g of dot(words[oy sh + ky dh, g, ox], w word
(ky, g)): a 3x3 window three vpdpbusd for a vector of 16 pixels (nine float32 fmas before),
each word built once and read by kh output rows. The compensation: sum (x - za) w =
sum (x' ) w - za' w_sums[ch] (x', za': as the products read them).

`flat` (stride 1): the words of the flattened padded plane, output q = row * wp + col the sum
over ky, g of dot(words[g, q + ky wp], ...), blocks of q crossing rows (a 7-pixel row fills
every lane), read back a row at a time through the finish, as `depthwise._depthwise_flat`.

Knobs (`DepthwiseInt8Config`): pixels (a block's width), flat. This module builds loop IR;
it must never import llvmlite.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ..quantized_problems import QuantizedConvProblem, channel_param, quantized_depthwise
from ..space import Constraint, Space, Template
from .conv import PIXEL_BLOCKS, pad_plane, row_in_vectors
from .depthwise import plane_parallel
from .int8 import cast_to, requantized, zero_point

TAPS = 4
"""Taps of a filter row one word holds (vpdpbusd's 4 bytes a lane)."""
FLIP = 0x80808080
"""Every byte of a word + 128 (mod 256): int8 x read as the uint8 x + 128."""


@dataclass(frozen=True)
class DepthwiseInt8Config:
    pixels: int          # output pixels a block of a row (a narrower block ends the row)
    flat: bool = False   # stride 1: blocks of the flattened padded plane, not of a row


def space(p: QuantizedConvProblem, machine) -> Space:
    return Space("depthwise_int8", DepthwiseInt8Config,
                 {"pixels": PIXEL_BLOCKS, "flat": (False, True)},
                 [Constraint("flat needs stride 1 and no dilation",
                             lambda c: not c.flat or _flat_applies(p))])


def _flat_applies(p: QuantizedConvProblem) -> bool:
    return p.strides == (1, 1) and p.dilations == (1, 1)


def default(p: QuantizedConvProblem, machine) -> DepthwiseInt8Config:
    """Flat where a row is narrower than two vectors (1 thread, znver4, rows / flat: 960x7x7
    3x3 71.2 / 59.7 us, 384x14x14 55.6 / 38.9, 192x28x28 48.8 / 48.5, 1152x7x7 5x5 156.7 /
    92.4, 240x28x28 5x5 109.8 / 94.3; 144x56x56 3x3 108.1 / 129.0)."""
    lanes = machine.vector_bits // 32
    return DepthwiseInt8Config(lanes, _flat_applies(p) and p.y_dims[3] < 2 * lanes)


def _word_count(n: int, lanes: int) -> int:
    """Words to build for `n`: whole vectors of `lanes`, then the rest rounded up to a power
    of two (a vector of 7 words, mobilenet_v2's 7x7 planes at stride 2, took 2.3x the time
    of 8: LLVM's code for odd-width shuffles)."""
    rest = n % lanes
    return n - rest + (1 << (rest - 1).bit_length() if rest else 0)


class _Plane:
    """The buffers and expressions of one plane (image bn, channel ch) of problem p."""

    def __init__(self, p: QuantizedConvProblem, plane: L.Var):
        self.p = p
        c = p.x_dims[1]
        self.bn, self.ch = plane // c, plane % c
        kh, kw = p.kernel
        self.groups = -(-kw // TAPS)
        self.wwords = L.Buffer("wwords", T.uint32, (kh * self.groups,), L.Scope.LOCAL)

    def weight_words(self) -> L.Stmt:
        """wwords[ky * groups + g] = taps 4g .. 4g + 3 of filter row ky, a byte each (0 past
        kw)."""
        p = self.p
        kh, kw = p.kernel
        stores = []
        for ky in range(kh):
            for g in range(self.groups):
                word = None
                for t in range(min(TAPS, kw - g * TAPS)):
                    byte = L.Cast(T.uint32, L.Cast(T.uint8, p.w[self.ch, 0, ky, g * TAPS + t]))
                    byte = byte if t == 0 else L.BinOp("<<", byte, L.Const(8 * t, T.uint32))
                    word = byte if word is None else L.BinOp("|", word, byte)
                stores.append(L.Store(self.wwords, (ky * self.groups + g,), word))
        return L.seq(*stores)

    def word(self, byte_at) -> L.Expr:
        """The uint32 of bytes `byte_at(t)` (t = 0..3; a uint8 expression each: loads of a
        window, one load and a shuffle in vector code), xor FLIP where x is int8."""
        word = L.call("pack_u8x4", *(byte_at(t) for t in range(TAPS)), dtype=T.uint32)
        return L.BinOp("^", word, L.Const(FLIP, T.uint32)) if self.p.signed else word

    def words(self, count: int, lanes: int, store) -> L.Stmt:
        """`store(g, i, word)` for each group g and i < count, `word(t)` -> the byte of tap t,
        in vectors of `lanes` words (a vector's bytes one load and a shuffle)."""
        i = L.Var("wi")

        def block(width: int, start: L.Expr, g: int) -> L.Stmt:
            kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
            return L.For(i, width, store(g, start + i), kind)

        return L.seq(*(row_in_vectors(lambda w, s, g=g: block(w, s, g), count, lanes)
                       for g in range(self.groups)))

    def dots(self, acc: L.Buffer, jj: L.Var, width: int, word_at) -> L.Stmt:
        """acc[jj] (jj < width) += the window's products: `word_at(ky, g)` pixel jj's word
        of filter row ky, group g."""
        kh = self.p.kernel[0]
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        steps = []
        for ky in range(kh):
            for g in range(self.groups):
                steps.append(L.For(jj, width, L.Store(acc, (jj,), L.call(
                    "dot_u8s8x4", acc[jj], word_at(ky, g), self.wwords[ky * self.groups + g],
                    dtype=T.int32)), kind))
        init = L.For(jj, width, L.Store(acc, (jj,), L.const(0, T.int32)), kind)
        return L.seq(init, *steps)

    def finish(self, acc: L.Expr, index: tuple) -> L.Expr:
        """Sum `acc` of the plane's channel through the compensation, the op's finish and the
        group's consumers, as the value stored at `index` of y."""
        p = self.p
        value = requantized(p, acc - zero_point(p) * p.sums[self.ch], self.ch)
        return cast_to(p.epilogue(value, index), p.y.dtype)


def _rows(p: QuantizedConvProblem, config: DepthwiseInt8Config, plane: L.Var, lanes: int
          ) -> L.Stmt:
    """Plane `plane`'s output rows in blocks of `pixels`, from the words of every padded row."""
    pl = _Plane(p, plane)
    _, _, oh, ow = p.y_dims
    kh, kw = p.kernel
    (sh, sw), (dh, dw) = p.strides, p.dilations
    hp, wp = p.padded_hw
    # at stride S > 1 the padded row is kept in S phases (`pad_plane`): the bytes of a tap
    # are then consecutive for consecutive pixels (a strided window of one load and a
    # shuffle took 5x the time: LLVM 22 built its 34 bytes one at a time)
    phases = sw if sw > 1 and dw == 1 else 1
    # the padded row reaches the last group's last tap (past kw: any byte, its weight 0)
    count = _word_count(ow, lanes)
    reach = (count - 1) * sw + (pl.groups * TAPS - 1) * dw + 1
    za = L.Cast(T.uint8, channel_param(p.za, 0))
    xpad, pad = pad_plane(p.x, pl.bn, pl.ch, p.x_dims[2:], p.begins, (hp, max(wp, reach)),
                          fill=za, phases=phases, dtype=T.uint8,
                          load=lambda v: L.Cast(T.uint8, v))

    def byte(iy, ox, offset: int) -> L.Expr:
        """The padded byte at row iy, column ox * sw + offset."""
        if phases == 1:
            return xpad[iy, ox * sw + offset]
        return xpad[iy, offset % phases, ox + offset // phases]

    words = L.Buffer("words", T.uint32, (hp, pl.groups, count))
    iy, jj, row = L.Var("wy"), L.Var("j"), L.Var("row")
    build = L.For(iy, hp, pl.words(count, lanes, lambda g, ox: L.Store(words, (iy, g, ox), pl.word(
        lambda t: byte(iy, ox, (g * TAPS + t) * dw)))))

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        acc = L.Buffer("acc", T.int32, (width,), L.Scope.LOCAL)
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        sums = pl.dots(acc, jj, width, lambda ky, g: words[row * sh + ky * dh, g, ow0 + jj])
        index = (pl.bn, pl.ch, row, ow0 + jj)
        store = L.For(jj, width, L.Store(p.y, index, pl.finish(acc[jj], index)), kind)
        return L.Allocate(acc, L.seq(sums, store))

    rows = L.For(row, oh, row_in_vectors(block, ow, config.pixels))
    return L.Allocate(xpad, L.Allocate(words, L.Allocate(pl.wwords, L.seq(
        pad, build, pl.weight_words(), rows))))


def _flat(p: QuantizedConvProblem, config: DepthwiseInt8Config, plane: L.Var, lanes: int
          ) -> L.Stmt:
    """Plane `plane` at stride 1 as a 1-D convolution of its padded plane flattened (as
    `depthwise._depthwise_flat`): output q = row * wp + col is the sum over ky, g of
    dot(words[g, q + ky wp], ...), the columns past the output's computed and dropped; each
    block's sums go to a scratch plane, then each output row is read back through the
    finish. The padded plane has pad bytes below it for the last block's taps."""
    pl = _Plane(p, plane)
    c, h, wid = p.x_dims[1:]
    kh, _ = p.kernel
    _, _, oh, ow = p.y_dims
    (ph, pw), (_, wp) = p.begins, p.padded_hw
    pix = config.pixels
    blocks = -(-oh * wp // pix)
    count = _word_count(blocks * pix + (kh - 1) * wp, lanes)   # the last block's last row
    size = count + pl.groups * TAPS                # bytes those words read
    za = L.Cast(T.uint8, channel_param(p.za, 0))
    xflat = L.Buffer("xplane", T.uint8, (size,))
    words = L.Buffer("words", T.uint32, (pl.groups, count))
    yflat = L.Buffer("yplane", T.int32, (blocks * pix,))
    i_h, i_w, q, jj, row = (L.Var(v) for v in ("ph", "pw", "q", "j", "row"))
    vec = L.ForKind.VECTORIZED
    pad = L.seq(L.For(i_h, size, L.Store(xflat, (i_h,), za), vec),
                L.For(i_h, h, L.For(i_w, wid, L.Store(
                    xflat, ((i_h + ph) * wp + i_w + pw,),
                    L.Cast(T.uint8, p.x[pl.bn, pl.ch, i_h, i_w])), vec)))
    build = pl.words(count, lanes, lambda g, i: L.Store(words, (g, i), pl.word(
        lambda t: xflat[i + g * TAPS + t])))
    acc = L.Buffer("acc", T.int32, (pix,), L.Scope.LOCAL)
    kind = vec if pix >= 2 else L.ForKind.UNROLLED
    sums = L.For(q, blocks, L.Allocate(acc, L.seq(
        pl.dots(acc, jj, pix, lambda ky, g: words[g, q * pix + jj + ky * wp]),
        L.For(jj, pix, L.Store(yflat, (q * pix + jj,), acc[jj]), kind))))

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        index = (pl.bn, pl.ch, row, ow0 + jj)
        value = pl.finish(yflat[row * wp + ow0 + jj], index)
        return L.For(jj, width, L.Store(p.y, index, value),
                     vec if width >= 2 else L.ForKind.UNROLLED)

    back = L.For(row, oh, row_in_vectors(block, ow, pix))
    return L.Allocate(xflat, L.Allocate(words, L.Allocate(yflat, L.Allocate(pl.wwords, L.seq(
        pad, build, pl.weight_words(), sums, back)))))


def build(p: QuantizedConvProblem, config: DepthwiseInt8Config, machine) -> L.PrimFunc:
    n, c = p.x_dims[:2]
    plane = L.Var("plane")
    lanes = machine.vector_bits // 32
    body = (_flat if config.flat else _rows)(p, config, plane, lanes)
    return L.simplify(L.PrimFunc(p.name, p.params, L.For(
        plane, n * c, body, plane_parallel(p, machine))))


DEPTHWISE_INT8 = Template("depthwise_int8", quantized_depthwise, lambda p: True, space,
                          default, build)
