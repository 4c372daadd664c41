"""The Winograd F(2x2, 3x3) template for CPUs: 3x3, stride-1, one-group float32 convolutions
whose filters convert_layout's "winograd_conv" transformed at compile time (ConvWinograd).

Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks" (2016): each 2x2 block of
an output channel's pixels (a tile) is A^T (sum over input channels c of U_c . V_c) A, where
V_c = B^T d_c B is the tile's 4x4 input patch of channel c transformed and U_c = G g_c G^T
the filter's (`ir/ops/packed.py: winograd_weights`), `.` elementwise. A tile's 36 multiply-adds
per (input, output) channel pair become 16: one matrix product [tiles x C] by [C x M] per
position of the 4x4 transformed tile. One unit of the parallel loop is a block of T tiles of
one image:

1. the block's input transformed into V [16, C, T] (each position a [C, T] panel);
2. for each block of NR output channels and each of the 16 positions, T x NR accumulators
   summed over C, a step one broadcast V value times one NR-vector of U (the direct conv's
   micro-kernel, conv.py), kept in `m` [16, T, NR];
3. `m` transformed back into each tile's 2x2 pixels, through bias and the fused epilogue.

Knob (`WinogradConfig`): tiles, T of a block (its accumulators: T x NR).

Accuracy: the transforms' coefficients are 0, +-1 and +-1/2 (exact), but a tile's result is
a sum of up to 16 products' sums with cancellations, so its rounding error is a few times the
direct conv's: docs/llvm_backend.md, "Winograd convolutions", has the measured figures.
This module never serves any conv but ConvWinograd's (`problems.winograd_conv2d`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Conv2d
from ..space import Space, Template
from .conv import MR_BY_VECTOR_BITS, pad_input, parallel_kind


@dataclass(frozen=True)
class WinogradConfig:
    tiles: int   # 2x2 output tiles a block (T): T x NR accumulators


def space(p: Conv2d, machine) -> Space:
    return Space("winograd", WinogradConfig, {"tiles": range(1, 25)})


def default(p: Conv2d, machine) -> WinogradConfig:
    # as the direct conv's pixels a tile: 8 x 2 vectors = 16 of AVX-512's 32 registers
    return WinogradConfig(MR_BY_VECTOR_BITS.get(machine.vector_bits, 4))


def input_transform(d) -> list[list[L.Expr]]:
    """B^T d B of a 4x4 patch (`d(a, b)` its element), F(2, 3)'s B^T = [[1, 0, -1, 0],
    [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]."""
    def bt(v):   # B^T applied to a column of four
        return [v[0] - v[2], v[1] + v[2], v[2] - v[1], v[1] - v[3]]

    cols = [bt([d(a, b) for a in range(4)]) for b in range(4)]      # cols[b][a] = (B^T d)[a][b]
    return [bt([cols[b][a] for b in range(4)]) for a in range(4)]   # [a][b] = (B^T d B)[a][b]


def output_transform(m) -> list[list[L.Expr]]:
    """A^T m A of a 4x4 tile (`m(a, b)` its element), F(2, 3)'s A^T = [[1, 1, 1, 0],
    [0, 1, -1, -1]]."""
    def at(v):
        return [v[0] + v[1] + v[2], v[1] - v[2] - v[3]]

    cols = [at([m(a, b) for a in range(4)]) for b in range(4)]      # cols[b][i] = (A^T m)[i][b]
    return [at([cols[b][i] for b in range(4)]) for i in range(2)]   # [i][j]


def build(p: Conv2d, config: WinogradConfig, machine) -> L.PrimFunc:
    return L.simplify(L.PrimFunc(p.name, p.params, _Winograd(p, config, machine).body()))


class _Winograd:
    """The pieces of `build`: the tile geometry, the loop variables, a method per stage."""

    def __init__(self, p: Conv2d, config: WinogradConfig, machine):
        self.p, self.t_n = p, config.tiles
        n, self.c = p.x_dims[:2]
        self.oc = p.w_dims[0]
        self.oh, self.ow = p.y_dims[2:]
        self.nr = p.packed_nr
        self.blocks = -(-self.oc // self.nr)
        self.th, self.tw = -(-self.oh // 2), -(-self.ow // 2)
        self.tiles_n = self.th * self.tw
        self.tblocks = -(-self.tiles_n // self.t_n)
        self.units = n * self.tblocks
        self.par = parallel_kind(machine.threads, n * self.oc * self.oh * self.ow * self.c * 4)
        # every tile's 4x4 patch inside the padded plane (a last odd row or column of the
        # output reads a zero row past the image's padding)
        plane = dataclasses.replace(p, padded_hw=(2 * self.th + 2, 2 * self.tw + 2))
        self.xpad, self.pad_stmt = pad_input(plane, self.par)
        self.unit, self.ic, self.t, self.jj, self.ob, self.xi = (
            L.Var(v) for v in ("unit", "ic", "t", "j", "ob", "xi"))
        self.bn, tb = self.unit // self.tblocks, self.unit % self.tblocks
        self.tile = tb * self.t_n + self.t
        self.v = L.Buffer("v", T.float32, (16, self.c, self.t_n))
        self.m = L.Buffer("m", T.float32, (16 * self.t_n * self.nr,))
        self.acc = L.Buffer("acc", T.float32, (self.t_n * self.nr,), L.Scope.LOCAL)

    def body(self) -> L.Stmt:
        unit = L.Allocate(self.v, L.Allocate(self.m, L.seq(
            self.transform_input(), L.For(self.ob, self.blocks, L.seq(
                L.For(self.xi, 16, L.Allocate(self.acc, self.products())),
                self.transform_output())))))
        stmts = ([self.pad_stmt] if self.pad_stmt is not None else []) + \
            [L.For(self.unit, self.units, unit, self.par)]
        body = L.seq(*stmts)
        return L.Allocate(self.xpad, body) if self.pad_stmt is not None else body

    def transform_input(self) -> L.Stmt:
        """V[., ic, t] = B^T d B of tile t's patch of channel ic (a tile past the image's last
        repeats the last: computed, never stored)."""
        tile = L.minimum(self.tile, self.tiles_n - 1)
        y0, x0 = (tile // self.tw) * 2, (tile % self.tw) * 2
        v = input_transform(lambda a, b: self.xpad[self.bn, self.ic, y0 + a, x0 + b])
        stores = [L.Store(self.v, (a * 4 + b, self.ic, self.t), v[a][b])
                  for a in range(4) for b in range(4)]
        return L.For(self.ic, self.c, L.For(self.t, self.t_n, L.seq(*stores)))

    def products(self) -> L.Stmt:
        """Position xi's T x NR accumulators over the input channels, into m."""
        t, jj, nr, acc, xi = self.t, self.jj, self.nr, self.acc, self.xi
        vec, unrolled = L.ForKind.VECTORIZED, L.ForKind.UNROLLED
        a = L.Var("a", T.float32)
        init = L.For(t, self.t_n, L.For(jj, nr, L.Store(acc, (t * nr + jj,), L.const(0.0)),
                                        vec), unrolled)
        step = L.For(t, self.t_n, L.Let(a, self.v[xi, self.ic, t], L.For(
            jj, nr, L.Store(acc, (t * nr + jj,), L.call(
                "fma", a, self.p.w[xi, self.ob, self.ic, jj], acc[t * nr + jj])), vec)),
            unrolled)
        keep = L.For(t, self.t_n, L.For(jj, nr, L.Store(
            self.m, ((xi * self.t_n + t) * nr + jj,), acc[t * nr + jj]), vec), unrolled)
        return L.seq(init, L.For(self.ic, self.c, step), keep)

    def transform_output(self) -> L.Stmt:
        """Each tile's 2x2 pixels of the NR channels, A^T m A, through bias and epilogue."""
        p, t, jj, nr, t_n = self.p, self.t, self.jj, self.nr, self.t_n
        y = output_transform(lambda a, b: self.m[((a * 4 + b) * t_n + t) * nr + jj])
        out_c = self.ob * nr + jj
        y0, x0 = (self.tile // self.tw) * 2, (self.tile % self.tw) * 2
        stores = []
        for i in range(2):
            for j in range(2):
                value = y[i][j]
                if p.bias is not None:
                    value = value + p.bias[L.minimum(out_c, self.oc - 1)]
                index = (self.bn, out_c, y0 + i, x0 + j)
                store = L.Store(p.y, index, p.epilogue(value, index))
                inside = [cond for cond, odd in ((y0 + i < self.oh, self.oh % 2 and i),
                                                 (x0 + j < self.ow, self.ow % 2 and j)) if odd]
                stores.append(L.If(L.logical_and(*inside), store) if inside else store)
        if self.oc % nr:
            channels = L.For(jj, nr, L.If(out_c < self.oc, L.seq(*stores)), L.ForKind.UNROLLED)
        else:
            channels = L.For(jj, nr, L.seq(*stores), L.ForKind.VECTORIZED)
        return L.For(t, t_n, L.If(self.tile < self.tiles_n, channels))


WINOGRAD = Template("winograd", problems.winograd_conv2d, lambda p: p.float32, space, default,
                    build)
