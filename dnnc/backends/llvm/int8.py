"""The int8 templates for CPUs: dense_int8 (QuantizedDense) and conv_int8 (QuantizedConvPacked,
of one group or grouped): int32 sums of u8 x s8 products, the requantization fused where a
tile stores (depthwise_int8, a QuantizedConv of one channel a group: `depthwise_int8.py`).

The product is the loop-IR intrinsic `dot_u8s8x4(acc, a, b)` (`ir/loop/nodes.INTRINSICS`):
the renderer emits AVX-512 VNNI's `vpdpbusd` where the CPU has avx512vnni (with avx512vl for
the 256 / 128-bit forms) and AVX-VNNI's VEX `vpdpbusd` where that is the feature (256 / 128
bits; a 512-bit vector in two halves); elsewhere legalize expands it into the widening path
(bytes zero- / sign-extended to int32, multiplied and added: exact, where AVX2's vpmaddubsw
would saturate its int16 pair sums at 255 * 127 * 2 > 32767, so it is not used).

The micro-kernel is BLIS's shape on 4-byte groups: an MR x NR tile of int32 accumulators
(NR: one or two 16-column panels of the weights, whose rows of 4 k x 16 columns are one
64-byte vector each), a row's 4 bytes of A broadcast as one 32-bit word against each panel
vector, k in groups of 4 (a tail group of fewer read with a guard; the packed weights are
zero past K). Signed activations are read as A + 128 (the word xor 0x80808080), so that
sum (A - za) W = sum (A + 128) W - (za + 128) w_sums[j]: the zero point (a run-time value
where DynamicQuantizeLinear made it) is compensated once per output element from the
weights' column sums. A weights' zero point zw (uint8 weights, stored as int8 with zw =
their zero point - 128) takes zw[j] (sum_k A[i, k] - k za) more: each call first sums A's
rows into a workspace (`DenseTile.sum_rows`, which `amx_int8` shares). Tiles are shared by
the worker pool, panel-major so that a panel (K x 64 bytes) stays in L2 while the row tiles
pass.

The conv is the same micro-kernel as an implicit GEMM: rows are output pixels (of every
image: a 7x7 plane fills tiles as well as a 56x56 one), columns output channels, k the
groups (4 input channels, ky, kx) of `pack_conv_groups`; each call first packs the NCHW image
into words of 4 channels of a pixel (a workspace, the plane padded with the zero point, so
padding adds nothing after the compensation), from which a row's word of a group is one
load at the pixel's base plus the group's offset. A grouped conv's panel reads only its
groups' channels (`panel_span` from `panel_base`: regnet's groups of 8 channels, 2 a panel,
half its products zeros: 4.36 -> 0.12 ms for its first 3x3, 1 thread, where the generic
loops ran it), a tile of one panel where the next reads other channels. A pointwise conv
(one group) transposes the tile (`_PointwiseTile`) unless its image has fewer pixels than a
panel (`few_pixels`). A product under `conv.MIN_PARALLEL_MACS` runs on one thread.

Knobs (`Int8Config`): mr (rows a tile), nr (16 or 32 columns). This module builds loop IR and
names features; it must never import llvmlite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.quant import MAGIC, MAGIC_BITS
from ...ir.ops.quantized import GROUP_COLUMNS, GROUP_DEPTH, finish_expr, panel_base, panel_span
from ..quantized_problems import (DynamicQuantize, MaxPool8, QuantizedConvProblem,
                                  QuantizedDenseProblem, channel_param, dynamic_quantize,
                                  dynamic_quantized, dynamic_scale, dynamic_zero_point,
                                  max_pool8, quantized_conv, quantized_dense, scale_param,
                                  untailed_groups)
from ..space import Constraint, Space, Template
from .conv import parallel_kind

VNNI512 = frozenset({"avx512vnni", "avx512vl"})
"""The features of vpdpbusd at 512, 256 and 128 bits."""
AVXVNNI = frozenset({"avxvnni"})
"""The features of the VEX vpdpbusd (256 and 128 bits)."""
MR = 6   # 6 x 2 panels = 12 zmm accumulators: vpdpbusd's latency (5) x 2 a cycle, + operands
MR_NARROW = 8   # rows of a one-panel tile (a grouped conv's: its panels read different channels)


def dot_widths(features: frozenset[str]) -> tuple[int, ...]:
    """The int32 lanes of the vpdpbusd forms `features` give, widest first."""
    if VNNI512 <= features:
        return (16, 8, 4)
    if AVXVNNI <= features:
        return (8, 4)
    return ()


def native(features: frozenset[str]) -> frozenset[str]:
    """The legalize rules the renderer skips on a CPU with `features`: `dot_u8s8x4` where
    some vpdpbusd form runs."""
    return frozenset({"dot_u8s8x4"}) if dot_widths(features) else frozenset()


@dataclass(frozen=True)
class Int8Config:
    mr: int   # rows of a tile
    nr: int   # columns of a tile: whole 16-column panels


def space(p: QuantizedDenseProblem, machine) -> Space:
    return Space("dense_int8", Int8Config, {"mr": range(1, 9), "nr": [16, 32]}, [Constraint(
        f"mr <= m = {p.m}: a tile reaches no row past the last", lambda c: c.mr <= p.m)])


def default(p: QuantizedDenseProblem, machine) -> Int8Config:
    return Int8Config(min(MR, p.m), 32 if p.n > GROUP_COLUMNS else 16)


def zero_point(p, flipped: bool | None = None) -> L.Expr:
    """The activation's zero point as the products see it, int32: + 128 where int8 A is read
    flipped to A + 128 (`flipped`, by default where A is int8: the u8 x s8 vpdpbusd)."""
    za = L.Cast(T.int32, channel_param(p.za, 0))
    return za + L.const(128, T.int32) if (p.signed if flipped is None else flipped) else za


def requantized(p, acc: L.Expr, j) -> L.Expr:
    """Column (output channel) j's sum of (a - za)(w - zw) through the op's finish (bias,
    scale, zero point, lo / hi) in the anchor's type."""
    return finish_expr(acc, channel_param(p.bias, j), scale_param(p, j),
                       channel_param(p.y_zp, j), p.out, p.lo, p.hi)


class _Tile:
    """The loop nest of a QuantizedDense problem and config; `_ConvTile` reads its rows'
    words from an image instead."""

    def __init__(self, p, config: Int8Config, rows: int, columns: int, depth: int):
        self.p, self.mr, self.nr = p, config.mr, config.nr
        self.rows, self.columns = rows, columns
        self.macs = rows * columns * depth * GROUP_DEPTH   # (padded to whole groups)
        self.halves = config.nr // GROUP_COLUMNS
        self.w = L.Buffer(p.w.name, T.uint32, (-(-columns // GROUP_COLUMNS), depth,
                                               GROUP_COLUMNS))
        self.acc = L.Buffer("acc", T.int32, (self.mr * self.nr,), L.Scope.LOCAL)

    def views(self) -> tuple:
        return (self.w,)

    def params(self) -> tuple:
        views = {b.name: b for b in self.views()}
        return tuple(views.get(x.name, x) for x in self.p.params)

    def update(self, jp, g, word_of) -> L.Stmt:
        """acc += the tile's rows (`word_of(ii)`: row ii's word of group g) x panel jp's
        group g, MR rows unrolled."""
        jj, half, a = L.Var("jj"), L.Var("h"), L.Var("a", T.uint32)
        panel = L.minimum(jp * self.halves + half, self.w.shape[0] - 1)
        rows = []
        for ii in range(self.mr):
            at = ii * self.nr + half * GROUP_COLUMNS + jj
            dot = L.call("dot_u8s8x4", self.acc[at], a, self.w[panel, g, jj], dtype=T.int32)
            rows.append(L.Let(a, word_of(ii), L.For(half, self.halves, L.For(
                jj, GROUP_COLUMNS, L.Store(self.acc, (at,), dot), L.ForKind.VECTORIZED),
                L.ForKind.UNROLLED)))
        return L.seq(*rows)

    def finish(self, ii, i, j) -> L.Expr:
        """Element (ii, j) of the tile (row i) through the compensation and the op's
        finish."""
        p = self.p
        return requantized(p, self.compensated(self.acc[ii * self.nr + (j % self.nr)] -
                                               zero_point(p) * p.sums[j], i, j), j)

    def compensated(self, acc: L.Expr, i, j) -> L.Expr:
        """sum (a - za) w of element (i, j) less what the weights' zero point adds (none)."""
        return acc

    def store(self, i0, jp, put) -> L.Stmt:
        """`put(i, j, value)` for the tile's valid elements: a row of a whole tile one vector
        (the finish and the fused consumers' arithmetic, e.g. efficientnet's SiLU between
        quantizations, in vector code; lane by lane its stem's 3x3 took 0.62 ms, 1 thread),
        the last panel's narrower row lane by lane."""
        ii, jj = L.Var("si"), L.Var("sj")
        i, j = i0 + ii, jp * self.nr + jj
        element = put(i, j, self.finish(ii, i, j))
        whole = L.For(jj, self.nr, element, L.ForKind.VECTORIZED)
        part = L.For(jj, self.columns - jp * self.nr, element)
        return L.For(ii, self.mr, L.If(i < self.rows, L.If(
            jp * self.nr + self.nr <= self.columns, whole, part)), L.ForKind.UNROLLED)

    def kind(self, threads: int, units: int) -> L.ForKind:
        """PARALLEL for a loop of `units` where threads share the product: where it has
        `conv.MIN_PARALLEL_MACS` (a squeeze-excitation's 1x1 convs on a pooled image, 55 K
        multiply-adds, took 11-16 us in each of two regions at 16 threads, 2-9 us on one),
        and more than one unit."""
        return parallel_kind(threads if units > 1 else 1, self.macs)

    def nest(self, threads: int, tile_body) -> L.Stmt:
        """Every (row tile, panel), panel-major (a panel stays in L2 while row tiles pass),
        shared by the worker pool (`kind`): `tile_body(i0, jp)` after the accumulators are
        zeroed."""
        tiles, panels = -(-self.rows // self.mr), -(-self.columns // self.nr)
        t, z = L.Var("t"), L.Var("z")
        zero = L.For(z, self.mr * self.nr, L.Store(self.acc, (z,), L.const(0, T.int32)),
                     L.ForKind.VECTORIZED)
        body = L.Allocate(self.acc, L.seq(zero, tile_body((t % tiles) * self.mr, t // tiles)))
        return L.For(t, tiles * panels, body, self.kind(threads, tiles * panels))


class DenseTile(_Tile):
    def __init__(self, p: QuantizedDenseProblem, config: Int8Config):
        super().__init__(p, config, p.m, p.n, -(-p.k // GROUP_DEPTH))
        # A's rows as words where they are whole words and nothing reads A's bytes (the row
        # sums, an epilogue adding A itself): one 32-bit load (and xor) a word; int8 A's 4
        # byte loads, each flipped, LLVM assembled in 9 vector instructions a row and a step
        # (a 3136 x 96 x 384 QDQ product, 1 thread, znver4: 2.07 -> 1.41 ms)
        self.words = p.k % GROUP_DEPTH == 0 and p.w_zp is None and not p.epilogue_reads(p.a)
        self.a = L.Buffer(p.a.name, T.uint32, (p.m, p.k // GROUP_DEPTH)) if self.words else \
            L.Buffer(p.a.name, p.a.dtype, (p.m, p.k))
        self.y = L.Buffer(p.y.name, p.y.dtype, (p.m, p.n))
        self.row_sums = L.Buffer("a_row_sums", T.int32, (p.m,), L.Scope.GLOBAL)

    def views(self) -> tuple:
        return (self.a, self.w, self.y)

    def compensated(self, acc: L.Expr, i, j) -> L.Expr:
        """With the weights' zero point zw: sum (a - za)(w - zw) = sum (a - za) w
        - zw (sum a - k za), from the row's sum of a (`sum_rows`)."""
        p = self.p
        if p.w_zp is None:
            return acc
        shift = self.row_sums[i] - L.const(p.k, T.int32) * L.Cast(T.int32, channel_param(p.za, 0))
        return acc - L.Cast(T.int32, channel_param(p.w_zp, j)) * shift

    def sum_rows(self, threads: int) -> L.Stmt:
        """row_sums[i] = sum over k of A[i, k] (its values, int32): 16 lanes of partial sums
        a row, then their total."""
        p = self.p
        lanes = L.Buffer("row_lanes", T.int32, (GROUP_COLUMNS,), L.Scope.LOCAL)
        i, kk, lane = L.Var("ri"), L.Var("rk"), L.Var("rl")
        whole = p.k // GROUP_COLUMNS

        def add(at: L.Expr, k: L.Expr) -> L.Stmt:
            return L.Store(lanes, (at,), lanes[at] + L.Cast(T.int32, self.a[i, k]))

        vec = L.ForKind.VECTORIZED
        total = lanes[0]
        for t in range(1, GROUP_COLUMNS):
            total = total + lanes[t]
        body = L.seq(L.For(lane, GROUP_COLUMNS, L.Store(lanes, (lane,), L.const(0, T.int32)),
                           vec),
                     L.For(kk, whole, L.For(lane, GROUP_COLUMNS, add(
                         lane, kk * GROUP_COLUMNS + lane), vec)),
                     L.For(lane, p.k % GROUP_COLUMNS, add(
                         L.const(0), whole * GROUP_COLUMNS + lane)),
                     L.Store(self.row_sums, (i,), total))
        return L.For(i, p.m, L.Allocate(lanes, body), self.kind(threads, p.m))

    def word(self, row, g, guard: bool, flip: bool | None = None) -> L.Expr:
        """A's bytes 4g..4g+3 of `row` as one uint32 (byte t in bits 8t..8t+7; past K: 0),
        xor 0x80 per byte where `flip` (by default for int8 A)."""
        p, word = self.p, None
        flip = p.signed if flip is None else flip
        if self.words:
            whole = p.k // GROUP_DEPTH
            word = self.a[row, L.minimum(g, whole - 1) if guard else g]
            if guard:
                word = L.Select(g < whole, word, L.Const(0, T.uint32))
            return L.BinOp("^", word, L.Const(0x80808080, T.uint32)) if flip else word
        for t in range(GROUP_DEPTH):
            k = g * GROUP_DEPTH + t
            value = self.a[row, L.minimum(k, p.k - 1) if guard else k]
            byte = L.Cast(T.uint32, L.Cast(T.uint8, value))
            if guard:
                byte = L.Select(k < p.k, byte, L.Const(0, T.uint32))
            if flip:
                byte = L.BinOp("^", byte, L.Const(0x80, T.uint32))
            byte = byte if t == 0 else L.BinOp("<<", byte, L.Const(8 * t, T.uint32))
            word = byte if word is None else L.BinOp("|", word, byte)
        return word

    def body(self, threads: int) -> L.Stmt:
        p, g = self.p, L.Var("g")
        whole = p.k // GROUP_DEPTH

        def words(i0, guard: bool, group):
            # rows past M repeat the last; never stored
            return lambda ii: self.word(L.minimum(i0 + ii, p.m - 1), group, guard)

        def tile(i0, jp):
            parts = [L.For(g, whole, self.update(jp, g, words(i0, False, g)))]
            if p.k % GROUP_DEPTH:
                tail = L.const(whole)
                parts.append(self.update(jp, tail, words(i0, True, tail)))

            def put(i, j, value):
                value = p.epilogue(value, p.anchor_index(i, j))
                return L.Store(self.y, (i, j), cast_to(value, p.y.dtype))
            return L.seq(*parts, self.store(i0, jp, put))

        if p.w_zp is None:
            return self.nest(threads, tile)
        return L.Allocate(self.row_sums, L.seq(self.sum_rows(threads),
                                               self.nest(threads, tile)))


def cast_to(value: L.Expr, dtype: T.DType) -> L.Expr:
    """`value` as `dtype` (itself where it has that type)."""
    return value if value.dtype is dtype else L.Cast(dtype, value)


class _ConvTile(_Tile):
    """Rows are output pixels (of every image), columns output channels; each call first
    packs the image into words of 4 channels of a pixel, the plane padded with the zero
    point (`quads`, a workspace), which row ii's word of group (c4, ky, kx) is read from."""

    def __init__(self, p: QuantizedConvProblem, config: Int8Config):
        n, c, h, wid = p.x_dims
        self.c4 = -(-c // GROUP_DEPTH)
        # 4-channel groups a panel reads (of its groups' channels, from `panel_base` on)
        self.k4 = -(-panel_span(p.y_dims[1], c, p.group) // GROUP_DEPTH)
        self.hp, self.wp = p.padded_hw
        self.pixels = p.y_dims[2] * p.y_dims[3]
        kh, kw = p.kernel
        super().__init__(p, config, n * self.pixels, p.y_dims[1], self.k4 * kh * kw)
        self.y = L.Buffer(p.y.name, p.y.dtype, (n, p.y_dims[1], self.pixels))
        # (a pointwise tile's last pixel vector may read past the last plane: never stored)
        self.quads = L.Buffer("xquads", T.uint32, (n * self.c4 * self.hp * self.wp +
                                                   config.nr,), L.Scope.GLOBAL)

    def views(self) -> tuple:
        return (self.w, self.y)

    def pack(self, threads: int) -> L.Stmt:
        """quads[(n, c4, iy, ix)] = channels 4 c4 .. 4 c4 + 3 of padded pixel (iy, ix), a
        byte each (xor 0x80 for int8), the zero point outside the image, any channel past C
        read as channel C - 1 (its weights are 0)."""
        p = self.p
        n, c, h, wid = p.x_dims
        (ph, pw) = p.begins
        nc, iy, ix = L.Var("qnc"), L.Var("qy"), L.Var("qx")
        flip = 0x80808080 if p.signed else 0
        zero = L.Cast(T.uint32, L.Cast(T.uint8, channel_param(p.za, 0)))
        pad_word = L.BinOp("^", zero * L.Const(0x01010101, T.uint32), L.Const(flip, T.uint32))
        word = None
        for t in range(GROUP_DEPTH):
            ch = L.minimum((nc % self.c4) * GROUP_DEPTH + t, c - 1)
            byte = L.Cast(T.uint32, L.Cast(T.uint8, p.x[nc // self.c4, ch, iy - ph, ix]))
            byte = byte if t == 0 else L.BinOp("<<", byte, L.Const(8 * t, T.uint32))
            word = byte if word is None else L.BinOp("|", word, byte)
        word = L.BinOp("^", word, L.Const(flip, T.uint32))
        vec = L.ForKind.VECTORIZED

        def at(col):
            return ((nc * self.hp + iy) * self.wp + col,)

        def pads(start, count) -> L.Stmt:
            return L.For(ix, count, L.Store(self.quads, at(start + ix), pad_word), vec)

        # a row inside the image: its padding, then its pixels a vector at a time (4 stride-1
        # byte loads a word); rows outside it all padding
        inner = L.seq(pads(0, pw), L.For(ix, wid, L.Store(self.quads, at(pw + ix), word), vec),
                      pads(pw + wid, self.wp - pw - wid))
        rows = L.If(L.logical_and(iy >= ph, iy < ph + h), inner, pads(0, self.wp))
        return L.For(nc, n * self.c4, L.For(iy, self.hp, rows), self.kind(threads, n * self.c4))

    def body(self, threads: int) -> L.Stmt:
        p = self.p
        (kh, kw), (sh, sw), (dh, dw) = p.kernel, p.strides, p.dilations
        ow = p.y_dims[3]
        c4, ky, kx = L.Var("c4"), L.Var("ky"), L.Var("kx")
        plane = self.hp * self.wp

        def tile(i0, jp):
            bases = [L.Var(f"base{ii}") for ii in range(self.mr)]
            g = (c4 * kh + ky) * kw + kx
            first = 0 if p.group == 1 else panel_base(
                jp * self.halves, p.y_dims[1], p.x_dims[1], p.group, L.minimum) // GROUP_DEPTH
            offset = (first + c4) * plane + ky * dh * self.wp + kx * dw
            k_loops = L.For(c4, self.k4, L.For(ky, kh, L.For(kx, kw, self.update(
                jp, g, lambda ii: self.quads[bases[ii] + offset]))))
            for ii in reversed(range(self.mr)):
                row = L.minimum(i0 + ii, self.rows - 1)   # rows past the last repeat it
                img, pix = row // self.pixels, row % self.pixels
                base = (img * self.c4 * self.hp + (pix // ow) * sh) * self.wp + (pix % ow) * sw
                k_loops = L.Let(bases[ii], base, k_loops)

            def put(i, j, value):
                img, pix = i // self.pixels, i % self.pixels
                value = p.epilogue(value, (img, j, pix // ow, pix % ow))
                return L.Store(self.y, (img, j, pix), cast_to(value, p.y.dtype))
            return L.seq(k_loops, self.store(i0, jp, put))

        return L.Allocate(self.quads, L.seq(self.pack(threads), self.nest(threads, tile)))


def build(p: QuantizedDenseProblem, config: Int8Config, machine) -> L.PrimFunc:
    tile = DenseTile(p, config)
    return L.simplify(L.PrimFunc(p.name, tile.params(), tile.body(machine.threads)))


def conv_space(p: QuantizedConvProblem, machine) -> Space:
    rows = p.x_dims[0] * p.y_dims[2] * p.y_dims[3]
    return Space("conv_int8", Int8Config, {"mr": range(1, 9), "nr": [16, 32]}, [Constraint(
        f"mr <= rows = {rows}: a tile reaches no pixel past the last", lambda c: c.mr <= rows),
        Constraint(f"nr = 16 unless a tile's two panels read the same input channels (one "
                   f"group, or 32 | M / group; group {p.group})",
                   lambda c: c.nr == GROUP_COLUMNS or wide_panels(p))])


def wide_panels(p: QuantizedConvProblem) -> bool:
    """Whether two adjacent panels read the same input channels (a tile of 32 columns then
    shares a row's word between them)."""
    return p.group == 1 or (p.y_dims[1] // p.group) % (2 * GROUP_COLUMNS) == 0


def conv_default(p: QuantizedConvProblem, machine) -> Int8Config:
    rows = p.x_dims[0] * p.y_dims[2] * p.y_dims[3]
    if p.y_dims[1] > GROUP_COLUMNS and wide_panels(p):
        return Int8Config(min(MR, rows), 2 * GROUP_COLUMNS)
    return Int8Config(min(MR_NARROW, rows), GROUP_COLUMNS)


def conv_build(p: QuantizedConvProblem, config: Int8Config, machine) -> L.PrimFunc:
    tile = (_PointwiseTile if pixel_vectors(p) else _ConvTile)(p, config)
    return L.simplify(L.PrimFunc(p.name, tile.params(), tile.body(machine.threads)))


def pointwise(p: QuantizedConvProblem) -> bool:
    """A 1x1, stride-1, unpadded conv of one group: an image's pixels are consecutive words
    of `quads`, every channel an output's."""
    return p.group == 1 and p.kernel == (1, 1) and p.strides == (1, 1) and \
        tuple(p.begins) == (0, 0) and \
        tuple(p.padded_hw) == tuple(p.x_dims[2:])


def few_pixels(p: QuantizedConvProblem) -> bool:
    """An image of fewer output pixels than a panel's 16 columns: squeeze-excitation's 1x1
    convs on a pooled [C, 1, 1]. A vector of an image's pixels (the transposed tile, an AMX
    tile's rows) is then mostly padding, so such a pointwise conv takes `_ConvTile`'s rows
    of pixels of every image against vectors of output channels (efficientnet_b0's 32 took
    2.3-15 us each transposed, 0.3-1.5 us as rows, znver4, 1 thread)."""
    return p.y_dims[2] * p.y_dims[3] < GROUP_COLUMNS


def pixel_vectors(p: QuantizedConvProblem) -> bool:
    """A pointwise conv whose image fills a vector of pixels (not `few_pixels`): the
    transposed tile's here, an AMX tile's rows in `amx_int8.AMX_POINTWISE_INT8`."""
    return pointwise(p) and not few_pixels(p)


class _PointwiseTile(_ConvTile):
    """The transposed tile for a pointwise conv: MR output channels x NR consecutive pixels
    of one image (vectors of pixels' words against a broadcast weight word), so that the
    epilogue's parameters are a channel's scalars and a row of the tile is stored as one
    vector of the NCHW output (the pixel-rows tile scattered its stores: 16->96 at 112x112
    took 0.44 ms, 1 thread)."""

    def body(self, threads: int) -> L.Stmt:
        p = self.p
        n, m = p.x_dims[0], p.y_dims[1]
        pix_tiles, ch_tiles = -(-self.pixels // self.nr), -(-m // self.mr)
        t, c4, z = L.Var("t"), L.Var("c4"), L.Var("z")
        jj, a = L.Var("jj"), L.Var("a", T.uint32)
        img, rest = t // (pix_tiles * ch_tiles), t % (pix_tiles * ch_tiles)
        p0, m0 = (rest % pix_tiles) * self.nr, (rest // pix_tiles) * self.mr   # pixels inner
        plane = self.hp * self.wp
        rows = []
        for ii in range(self.mr):
            ch = L.minimum(m0 + ii, m - 1)   # channels past M repeat the last; never stored
            word = self.w[ch // GROUP_COLUMNS, c4, ch % GROUP_COLUMNS]
            at = ii * self.nr + jj
            pixels = self.quads[(img * self.c4 + c4) * plane + p0 + jj]
            rows.append(L.Let(a, word, L.For(jj, self.nr, L.Store(self.acc, (at,), L.call(
                "dot_u8s8x4", self.acc[at], pixels, a, dtype=T.int32)), L.ForKind.VECTORIZED)))
        zero = L.For(z, self.mr * self.nr, L.Store(self.acc, (z,), L.const(0, T.int32)),
                     L.ForKind.VECTORIZED)
        tile = L.seq(zero, L.For(c4, self.c4, L.seq(*rows)), self.store_rows(img, p0, m0))
        tiles = n * pix_tiles * ch_tiles
        main = L.For(t, tiles, L.Allocate(self.acc, tile), self.kind(threads, tiles))
        return L.Allocate(self.quads, L.seq(self.pack(threads), main))

    def store_rows(self, img, p0, m0) -> L.Stmt:
        p = self.p
        ii, jj = L.Var("si"), L.Var("sj")
        ch, pix = m0 + ii, p0 + jj
        value = requantized(p, self.acc[ii * self.nr + jj] - zero_point(p) * p.sums[ch], ch)
        ow = p.y_dims[3]
        value = p.epilogue(value, (img, ch, pix // ow, pix % ow))
        store = L.Store(self.y, (img, ch, pix), cast_to(value, p.y.dtype))
        whole = L.For(jj, self.nr, store, L.ForKind.VECTORIZED)
        part = L.For(jj, self.pixels - p0, store)
        return L.For(ii, self.mr, L.If(ch < p.y_dims[1], L.If(
            p0 + self.nr <= self.pixels, whole, part)), L.ForKind.UNROLLED)


@dataclass(frozen=True)
class PoolConfig:
    pixels: int   # output pixels a vector block of a row


def pool_space(p: MaxPool8, machine) -> Space:
    return Space("maxpool_int8", PoolConfig, {"pixels": [8, 16, 32, 64]}, [])


def pool_default(p: MaxPool8, machine) -> PoolConfig:
    return PoolConfig(machine.vector_bits // 32)


def pool_build(p: MaxPool8, config: PoolConfig, machine) -> L.PrimFunc:
    """Per plane (the worker pool's unit): the plane as int32 in a local buffer, the dtype's
    minimum around it (a tap never tests bounds), then each output row in blocks of pixels,
    a tap one vector load (a shuffle of one load at stride 2 to 4), the maximum an int32
    vector max, stored back in the 8-bit type."""
    n, c, h, wid = p.x_dims
    _, _, oh, ow = p.y_dims
    (kh, kw), (sh, sw), (dh, dw) = p.kernel, p.strides, p.dilations
    (ph, pw), (hp, wp) = p.begins, p.padded_hw
    low = L.const(int(np.iinfo(p.x.dtype.np).min), T.int32)
    plane = L.Buffer("xplane", T.int32, (hp * wp + config.pixels * sw,), L.Scope.LOCAL)
    nc, iy, ix, oy, ox, b = (L.Var(v) for v in ("nc", "iy", "ix", "oy", "ox", "b"))
    vec = L.ForKind.VECTORIZED
    fill = L.For(ix, hp * wp, L.Store(plane, (ix,), low), vec)
    copy = L.For(iy, h, L.For(ix, wid, L.Store(plane, ((iy + ph) * wp + pw + ix,), L.Cast(
        T.int32, p.x[nc // c, nc % c, iy, ix])), vec))
    x0 = b * config.pixels + ox
    best = None
    for ky in range(kh):
        for kx in range(kw):
            tap = plane[(oy * sh + ky * dh) * wp + x0 * sw + kx * dw]
            best = tap if best is None else L.maximum(best, tap)
    store = L.Store(p.y, (nc // c, nc % c, oy, x0), L.Cast(p.y.dtype, best))
    blocks = L.For(b, ow // config.pixels, L.For(ox, config.pixels, store, vec))
    rest = L.For(ox, ow % config.pixels, L.substitute(store, {b: L.const(ow // config.pixels)}))
    rows = L.For(oy, oh, L.seq(blocks, rest))
    kind = L.ForKind.PARALLEL if machine.threads > 1 and n * c > 1 else L.ForKind.SERIAL
    body = L.For(nc, n * c, L.Allocate(plane, L.seq(fill, copy, rows)), kind)
    return L.simplify(L.PrimFunc(p.name, p.params, body))


@dataclass(frozen=True)
class QuantizeConfig:
    chunk: int   # elements a task of the quantizing pass (the worker pool's unit)


def quantize_space(p: DynamicQuantize, machine) -> Space:
    return Space("dynamic_quantize", QuantizeConfig, {"chunk": [1024, 4096, 16384]}, [])


def quantize_default(p: DynamicQuantize, machine) -> QuantizeConfig:
    return QuantizeConfig(4096)


def _as_byte(q: L.Expr) -> L.Expr:
    """An integral float in [0, 255] as uint8 through the bits of q + 1.5 * 2**23 (vector
    code; a float -> int cast is legalized lane by lane)."""
    bits = L.call("bitcast", q + L.const(MAGIC), dtype=T.int32) - L.const(MAGIC_BITS, T.int32)
    return L.Cast(T.uint8, bits)


def quantize_build(p: DynamicQuantize, config: QuantizeConfig, machine) -> L.PrimFunc:
    """DynamicQuantizeLinear in two passes: x's range (16 lanes of running max and min, from
    0: the reference widens the range to include 0; max / min are exact in any order), the
    scale and zero point from it as the reference forms them; then every element quantized
    (x / scale rounded half to even, plus the zero point, clamped), chunks shared by the
    worker pool. The generic lowering took 0.20 ms for 128 x 3072 (1 thread) with its
    per-lane float -> uint8 conversions."""
    f32, lanes, vec = T.float32, GROUP_COLUMNS, L.ForKind.VECTORIZED
    x = L.Buffer(p.x.name, f32, (p.size,))
    y = L.Buffer(p.y.name, T.uint8, (p.size,))
    hi = L.Buffer("range_hi", f32, (lanes,), L.Scope.LOCAL)
    lo = L.Buffer("range_lo", f32, (lanes,), L.Scope.LOCAL)
    i, lane = L.Var("qi"), L.Var("ql")
    whole = p.size // lanes

    def widen_range(at: L.Expr, k: L.Expr) -> L.Stmt:
        return L.seq(L.Store(hi, (at,), L.maximum(hi[at], x[k])),
                     L.Store(lo, (at,), L.minimum(lo[at], x[k])))

    top, bottom = hi[0], lo[0]
    for t in range(1, lanes):
        top, bottom = L.maximum(top, hi[t]), L.minimum(bottom, lo[t])
    scale = L.Var("scale", f32)
    zero = L.Var("zero", f32)
    scale_value, zero_value = dynamic_scale(top, bottom), dynamic_zero_point(bottom, scale)
    params = L.seq(L.Store(p.scale, (), scale), L.Store(p.zero_point, (), _as_byte(zero)))
    ranges = L.Allocate(hi, L.Allocate(lo, L.seq(
        L.For(lane, lanes, L.seq(L.Store(hi, (lane,), L.const(0.0)),
                                 L.Store(lo, (lane,), L.const(0.0))), vec),
        L.For(i, whole, L.For(lane, lanes, widen_range(lane, i * lanes + lane), vec)),
        L.For(lane, p.size % lanes, widen_range(L.const(0), whole * lanes + lane)),
        L.Let(scale, scale_value, L.Let(zero, zero_value, params)))))
    s, z = L.Var("s", f32), L.Var("z", f32)

    def quantize(k: L.Expr) -> L.Stmt:
        return L.Store(y, (k,), _as_byte(dynamic_quantized(x[k], s, z)))

    chunk = config.chunk
    chunks = p.size // chunk
    kind = L.ForKind.PARALLEL if machine.threads > 1 and chunks > 1 else L.ForKind.SERIAL
    body = L.seq(L.For(i, chunks, L.For(lane, chunk, quantize(i * chunk + lane), vec), kind),
                 L.For(lane, p.size % chunk, quantize(chunks * chunk + lane), vec))
    body = L.Let(s, p.scale[()], L.Let(z, L.Cast(f32, p.zero_point[()]), body))
    params = tuple({x.name: x, y.name: y}.get(b.name, b) for b in p.params)
    return L.simplify(L.PrimFunc(p.name, params, L.seq(ranges, body)))


DENSE_INT8 = Template("dense_int8", quantized_dense, untailed_groups, space, default,
                      build)
CONV_INT8 = Template("conv_int8", quantized_conv, lambda p: True, conv_space, conv_default,
                     conv_build)
MAXPOOL_INT8 = Template("maxpool_int8", max_pool8, lambda p: True, pool_space, pool_default,
                        pool_build)
DYNAMIC_QUANTIZE = Template("dynamic_quantize", dynamic_quantize,
                            lambda p: p.x.dtype is T.float32,   # (no half storage on llvm)
                            quantize_space, quantize_default, quantize_build)
