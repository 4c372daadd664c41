"""The Winograd F(m x m, 3x3) template for CPUs: 3x3, stride-1, one-group float32
convolutions whose filters convert_layout's "winograd_conv" transformed at compile time
(ConvWinograd; the tile m, 2, 4 or 6, read from the transformed filters' alpha^2 positions,
alpha = m + 2).

Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks" (2016): each m x m block
of an output channel's pixels (a tile) is A^T (sum over input channels c of U_c . V_c) A,
where V_c = B^T d_c B is the tile's alpha x alpha input patch of channel c transformed and
U_c = G g_c G^T the filter's (the matrices generated in `ir/ops/winograd.py`), `.`
elementwise. A tile's 9 m^2 multiply-adds per (input, output) channel pair become alpha^2
(F(2x2): 36 -> 16; F(4x4): 144 -> 36): one matrix product [tiles x C] by [C x M] per position
of the transformed tile. Two parallel loops:

1. the input transformed, a block of T tiles of a row of tiles a unit, into V [blocks,
   alpha^2, C, T] (a scratch buffer of the call: each block's alpha^2 [C, T] panels
   contiguous), the block's tiles in the vector lanes;
2. a unit a row of tile blocks and a block of NR output channels (the row's blocks one
   after another: see "Units" below): for each block and each of the alpha^2
   positions, T x NR accumulators summed over C, a step one broadcast V value times one
   NR-vector of U (the direct conv's micro-kernel, conv.py), kept in `m` [alpha^2, T, NR];
   then `m` transformed back into each tile's m x m pixels (the NR channels in the vector
   lanes) into `o` [m, T m, NR], and each channel's m rows of T m pixels stored from `o`
   as vectors through bias and the fused epilogue (`store_rows`). (One loop of tile
   blocks, each transforming its own input, left a 7x7 image's two blocks to two threads:
   2x slower than the direct conv at 2 threads.)

But where there are tile blocks enough for every thread, the two loops cost more than they
share out: a block's V, written by the thread that transformed it, is read by whichever
claims its products, so on every call the call's whole V moves between cores. On a 2-vCPU
znver4 (1.8 MB of V, 64 -> 64 channels at 56x56) the conv took 0.78 ms on 1 thread and
0.81 on 2, both threads busy throughout (perf: in the kernel, not waiting; two 1-thread
processes at once ran 0.87-0.95 ms each). `fused` makes it one loop of tile blocks again,
each unit padding the band of the input its patches read and transforming its block into
scratch of its own, then doing every channel block (a padded copy of the whole input,
written a plane a unit, moved between cores the same way: 0.75 ms at 64 -> 64, 0.46 with
the band): the default on more than one thread where each thread gets
FUSED_UNITS_PER_THREAD rows of blocks and the scratch is at most FUSED_SCRATCH
(`fused_by_default`). On 1 thread the two loops stay: a tile block's pass over every
channel block reads all of U (0.82 ms against 0.91 fused at 64 -> 64 @ 56).

Units: a thread writes whole rows of tiles, never one block of a row that another thread
writes the rest of. Blocks claimed one at a time (the pool's chunks are single units on
small images) went to alternate threads, and neighbouring blocks wrote the same cache lines
of every output plane (a 27-wide row in blocks of 14 pixels): znver5, 2 threads, 32 -> 64
@27 (squeezenet's expand) 260 us against 66 on 1 thread; with a row of blocks a unit 51.

Knobs (`WinogradConfig`): tiles, T of a block (its accumulators: T x NR); fused.

At precision bf16 (`Conv2d.pairs`: U in bf16 pairs of input channels) the input transform
computes two channels' patches at a time and stores them rounded to bf16 as one word per
(position, pair, tile), and a product step is one `dot_bf16x2` (vdpbf16ps) of a broadcast
word of V and an NR-vector of U's words: half the steps, the transforms unchanged in fp32.

Accuracy: B^T's and A^T's coefficients are exact in binary (the interpolation's other
factors are in G, applied in float64 at compile time); F(2x2)'s error is below the direct
conv's, F(4x4)'s about 5x it, F(6x6)'s about 20x (docs/llvm_backend.md, "Winograd
convolutions"). This module never serves any conv but ConvWinograd's
(`problems.winograd_conv2d`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Conv2d
from . import bf16
from ..space import Space, Template
from ...ir.ops.winograd import tile_of, winograd
from .conv import MR_BY_VECTOR_BITS, band_copy, pad_input, parallel_kind


@dataclass(frozen=True)
class WinogradConfig:
    tiles: int   # m x m output tiles a block (T): T x NR accumulators
    # one parallel loop of tile blocks, each transforming its own input into the unit's
    # scratch and then doing every channel block's products (no V shared across threads),
    # instead of the two loops (module docstring)
    fused: bool = False


def space(p: Conv2d, machine) -> Space:
    return Space("winograd", WinogradConfig, {"tiles": range(1, 25), "fused": (False, True)})


def default(p: Conv2d, machine) -> WinogradConfig:
    """Up to the direct conv's pixels a tile (8 x 2 vectors = 16 of AVX-512's 32 registers),
    as many as split a row of tiles evenly (a 7x7 output's 4 tiles: blocks of 4, not one
    block of 8 half past the image)."""
    most = MR_BY_VECTOR_BITS.get(machine.vector_bits, 4)
    tile = tile_of(L.static_shape(p.w.shape)[0])
    row = -(-p.y_dims[3] // tile)
    tiles = -(-row // -(-row // most))
    return WinogradConfig(tiles, fused_by_default(p, tile, row, tiles, machine.threads))


FUSED_UNITS_PER_THREAD = 3
"""Fused units (rows of tile blocks) a thread at least, for the default to fuse the input
transform into the products' units (`WinogradConfig.fused`): with fewer, one loop of tile
rows leaves threads idle (a 7x7 image's two blocks), which the two loops' channel blocks
share out. (Measured when a unit was one block; the tile rows of these layers were one
block each, but at 56x56 two.) 2 threads,
znver4, quiet host, two loops -> fused (ms): 64 -> 64 @ 28 (7 blocks) 0.31 -> 0.13, 128 ->
128 @ 28 0.58 -> 0.39, 256 -> 256 @ 14 (7 blocks) 0.56 -> 0.58, 512 -> 512 @ 7 1.09 -> 1.07;
16 threads keep the two loops at 56x56 (28 blocks)."""


FUSED_SCRATCH = 1 << 18
"""Bytes of a fused unit's transformed input (alpha^2 positions x C x T words) at most for
the default to fuse: above codegen's stack scratch (64 KiB) it is allocated a unit (128 -> 32
channels at 56x56, T = 7: 129 KiB a unit, 0.80 ms fused against 1.91 in two loops, 2 threads,
znver4)."""


def fused_by_default(p: Conv2d, tile: int, row: int, tiles: int, threads: int) -> bool:
    """Whether the default fuses (`WinogradConfig.fused`) F(tile) blocks of `tiles` of a
    row of `row` tiles: on more than one thread, with FUSED_UNITS_PER_THREAD units (rows of
    tile blocks) a thread, the unit's scratch within FUSED_SCRATCH."""
    n, c = p.x_dims[:2]
    rows = n * -(-p.y_dims[2] // tile)
    depth = -(-c // 2) if p.pairs else c
    scratch = (tile + 2) ** 2 * depth * tiles * 4
    return threads > 1 and rows >= FUSED_UNITS_PER_THREAD * threads and \
        scratch <= FUSED_SCRATCH


def _combine(row, values: list) -> L.Expr:
    """sum_k row[k] * values[k] for a row of exact coefficients: zeros left out, +-1 an add or
    a subtract, the sum started at a positive term where there is one."""
    terms = [(float(c), v) for c, v in zip(row, values) if c]
    terms.sort(key=lambda term: term[0] < 0)        # stable: the positive terms first
    total = None
    for c, v in terms:
        scaled = v if abs(c) == 1 else v * L.const(abs(c))
        if total is None:
            total = scaled if c > 0 else L.const(0.0) - scaled
        else:
            total = total + scaled if c > 0 else total - scaled
    return total


Bindings = list[tuple[L.Var, L.Expr]]
"""Let-bound intermediate values of a transform, in order (`bind` wraps a body in them)."""


def _sandwich(left, d, size: int, name: str) -> tuple[Bindings, list[list[L.Expr]]]:
    """left d left^T of a size x size tile (`d(a, b)` its element): left applied to each
    column, then to each row of the result. The first stage's sums are bound to variables
    (`name` b_i): every row of the second stage reads them, and inlined as expression trees
    they multiplied the code LLVM had to clean up (F(6x6): 75 s of a conv's compile)."""
    lets, cols = [], []
    for b in range(size):
        col = []
        for i, row in enumerate(left):
            value = _combine(row, [d(a, b) for a in range(size)])
            if isinstance(value, L.BinOp):
                var = L.Var(f"{name}{b}_{i}", T.float32)
                lets.append((var, value))
                value = var
            col.append(value)
        cols.append(col)                                   # cols[b][i] = (left d)[i][b]
    return lets, [[_combine(row, [cols[b][i] for b in range(size)]) for row in left]
                  for i in range(len(left))]


def bind(lets: Bindings, body: L.Stmt) -> L.Stmt:
    """`body` inside the Lets of `lets` (the first one outermost)."""
    for var, value in reversed(lets):
        body = L.Let(var, value, body)
    return body


def input_transform(d, m: int = 2, name: str = "bd") -> tuple[Bindings, list[list[L.Expr]]]:
    """B^T d B of an alpha x alpha patch (`d(a, b)` its element), F(m, 3)'s B^T
    (`ir/ops/winograd.py`; F(2, 3)'s [[1, 0, -1, 0], [0, 1, 1, 0], [0, 1, -1, 0],
    [0, 1, 0, -1]]): the bindings its values read, and the values."""
    return _sandwich(winograd(m).bt, d, m + 2, name)


def output_transform(mt, m: int = 2) -> tuple[Bindings, list[list[L.Expr]]]:
    """A^T mt A of an alpha x alpha tile (`mt(a, b)` its element): the bindings its values
    read, and the m x m pixels."""
    return _sandwich(winograd(m).at, mt, m + 2, "am")


def build(p: Conv2d, config: WinogradConfig, machine) -> L.PrimFunc:
    kernel = _Winograd(p, config, machine)
    # (U in bf16 pairs: the parameter as the uint32 words the body reads)
    params = tuple(kernel.u if x.name == kernel.u.name else x for x in p.params)
    return L.simplify(L.PrimFunc(p.name, params, kernel.body()))


class _Winograd:
    """The pieces of `build`: the tile geometry, the loop variables, a method per stage.

    A block is T consecutive tiles of one row of tiles (a row's last block runs past the
    image into zero padding: computed, never stored), so a block's patches start m columns
    apart: the input transform reads them as stride-m vectors."""

    def __init__(self, p: Conv2d, config: WinogradConfig, machine):
        self.p, self.t_n, self.fused = p, config.tiles, config.fused
        self.tile = tile_of(L.static_shape(p.w.shape)[0])    # m: m x m pixels a tile
        self.alpha = self.tile + 2                            # an alpha x alpha patch
        self.positions = self.alpha * self.alpha
        self.n, self.c = p.x_dims[:2]
        self.oc = p.w_dims[0]
        self.oh, self.ow = p.y_dims[2:]
        self.nr = p.packed_nr
        self.blocks = -(-self.oc // self.nr)
        self.th, self.tw = -(-self.oh // self.tile), -(-self.ow // self.tile)
        self.row_blocks = -(-self.tw // self.t_n)
        self.tblocks = self.th * self.row_blocks          # tile blocks an image
        self.par = parallel_kind(machine.threads,
                                 self.n * self.oc * self.oh * self.ow * self.c * 4)
        # every block's 4x4 patches inside the padded plane
        plane = dataclasses.replace(
            p, padded_hw=(self.tile * self.th + 2, self.tile * self.row_blocks * self.t_n + 2))
        self.xpad, self.pad_stmt = pad_input(plane, self.par)
        self.ic, self.t, self.jj, self.xi = (L.Var(v) for v in ("ic", "t", "j", "xi"))
        # steps of the products' reduction: input channels, or pairs of them (bf16)
        self.depth = -(-self.c // 2) if p.pairs else self.c
        # the transformed input: [image's tile block, position, channel, tile of the block],
        # a block's panels contiguous (what one unit of the products reads, in order; a
        # whole image's [16, C, tiles] put each channel's T values a row of tiles apart:
        # 3x slower at 64 channels 56x56); at bf16 a pair of channels a word
        self.v = L.Buffer("v", T.uint32 if p.pairs else T.float32,
                          (self.n * self.tblocks, self.positions, self.depth, self.t_n))
        # U as the products read it: at bf16 the uint32 words of its pairs
        self.u = L.Buffer(p.w.name, T.uint32, L.static_shape(p.w.shape)[:4]) if p.pairs \
            else p.w
        self.m = L.Buffer("m", T.float32, (self.positions * self.t_n * self.nr,))
        self.acc = L.Buffer("acc", T.float32, (self.t_n * self.nr,), L.Scope.LOCAL)
        # the output transform's results: [row of a tile, pixel of the block's row, channel]
        self.o = L.Buffer("o", T.float32, (self.tile * self.t_n * self.tile * self.nr,))

    def corner(self, block: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr, L.Expr]:
        """(image, first row, first column) of tile t of tile block `block` (of all images)."""
        bn, rest = block // self.tblocks, block % self.tblocks
        ty, txb = rest // self.row_blocks, rest % self.row_blocks
        return bn, ty * self.tile, (txb * self.t_n + t) * self.tile

    def body(self) -> L.Stmt:
        """The input padded, then transformed (parallel over tile blocks), then the products
        and the output transform (parallel over tile blocks and channel blocks: the small
        images' few tiles still share out); fused, one loop of tile blocks, each padding its
        own band of the input."""
        if self.fused:
            return self.fused_units()
        body = L.Allocate(self.v, L.seq(self.transform_input(), self.products_and_output()))
        if self.pad_stmt is None:
            return body
        return L.Allocate(self.xpad, L.seq(self.pad_stmt, body))

    def transform_input(self) -> L.Stmt:
        """V[block, ., ic, t] = B^T d B of the block's tile t's patch of channel ic, a unit a
        block, the block's tiles in the vector lanes (stride-m loads); at bf16 of channels
        2 ic and 2 ic + 1 (0 past C), one word of the two rounded."""
        block = L.Var("block")
        return L.For(block, self.n * self.tblocks, self.transform_block(block, self.v, block),
                     self.par)

    def transform_block(self, block: L.Expr, v_buf: L.Buffer, at: L.Expr,
                        band: L.Buffer | None = None) -> L.Stmt:
        """Tile block `block`'s transformed input into v_buf[at, ., ., .], its patches read
        from the padded input, or from `band` (`band_copy`'s) where given."""
        t, ic = self.t, self.ic
        bn, y0, x0 = self.corner(block, t)

        def patch(channel, name):
            if band is not None:
                return input_transform(lambda a, b: band[channel, a, t * self.tile + b],
                                       self.tile, name)
            return input_transform(lambda a, b: self.xpad[bn, channel, y0 + a, x0 + b],
                                   self.tile, name)

        alpha = self.alpha
        if self.p.pairs:
            (lets, lo), (more, hi) = patch(2 * ic, "lo"), \
                patch(L.minimum(2 * ic + 1, self.c - 1), "hi")
            lets = lets + more
            if self.c % 2:
                hi = [[L.Select(2 * ic + 1 < self.c, e, L.const(0.0)) for e in row]
                      for row in hi]
            v = [[bf16.pair(lo[a][b], hi[a][b]) for b in range(alpha)] for a in range(alpha)]
        else:
            lets, v = patch(ic, "bd")
        stores = [L.Store(v_buf, (at, a * alpha + b, ic, t), v[a][b])
                  for a in range(alpha) for b in range(alpha)]
        lanes = L.ForKind.VECTORIZED if self.t_n > 1 else L.ForKind.SERIAL
        return L.For(ic, self.depth, L.For(t, self.t_n, bind(lets, L.seq(*stores)), lanes))

    def products_and_output(self) -> L.Stmt:
        """One parallel unit a (image, channel block, row of tile blocks), a block at a time:
        the alpha^2 products into m, then m transformed into the tiles' pixels; tile rows
        inner, so a channel block's transformed filters stay in L2 for its tile blocks."""
        unit, b = L.Var("unit"), L.Var("bcol")
        per_image = self.th * self.blocks
        bn, rest = unit // per_image, unit % per_image
        ob, ty = rest // self.th, rest % self.th
        block = bn * self.tblocks + ty * self.row_blocks + b
        return L.For(unit, self.n * per_image, L.For(
            b, self.row_blocks, self.channel_block(block, ob, self.v, block)), self.par)

    def channel_block(self, block, ob, v_buf: L.Buffer, at: L.Expr) -> L.Stmt:
        """Channel block ob of tile block `block` (its transformed input v_buf[at]): the
        alpha^2 products into m, then m transformed into the tiles' pixels."""
        return L.Allocate(self.m, L.Allocate(self.o, L.seq(
            L.For(self.xi, self.positions, L.Allocate(self.acc, self.products(v_buf, at, ob))),
            self.transform_output(block, ob))))

    def fused_units(self) -> L.Stmt:
        """One parallel unit a row of tile blocks (`WinogradConfig.fused`), each block's input
        transformed into the unit's own scratch, then every channel block's products and
        output (a unit a block shared output lines between threads: "Units"). Where
        the input needs padding, the unit pads the band of it that its patches read
        (`band_copy`): a padded copy of the whole input, written a plane a unit, would move
        between cores like V."""
        row, b, ob = L.Var("brow"), L.Var("bcol"), L.Var("ob")
        block = row * self.row_blocks + b
        mine = L.Buffer("vt", self.v.dtype, (1,) + tuple(self.v.shape[1:]))
        zero = L.const(0)
        if self.pad_stmt is None:
            transform = self.transform_block(block, mine, zero)
        else:
            band = L.Buffer("xband", T.float32, (self.c, self.alpha, self.band_columns))
            transform = L.Allocate(band, L.seq(self.band_copy(block, band),
                                               self.transform_block(block, mine, zero, band)))
        unit = L.Allocate(mine, L.seq(
            transform, L.For(ob, self.blocks, self.channel_block(block, ob, mine, zero))))
        return L.For(row, self.n * self.th, L.For(b, self.row_blocks, unit), self.par)

    @property
    def band_columns(self) -> int:
        """Columns of the padded input a tile block's patches read."""
        return self.t_n * self.tile + 2

    def band_copy(self, block: L.Expr, band: L.Buffer) -> L.Stmt:
        """band[c, a, b] = the padded input's row y0 + a, column x0 + b of channel c, for
        tile block `block` at (y0, x0) (conv's `band_copy`)."""
        p = self.p
        bn, y0, x0 = self.corner(block, L.const(0))
        return band_copy(band, lambda c, row, col: p.x[bn, c, row, col], self.c, y0, x0,
                         p.x_dims[2:], p.begins)

    def products(self, v_buf: L.Buffer, v_at, ob) -> L.Stmt:
        """Position xi's T x NR accumulators over the input channels (of v_buf[v_at]), into
        m."""
        t, jj, nr, acc, xi = self.t, self.jj, self.nr, self.acc, self.xi
        vec, unrolled = L.ForKind.VECTORIZED, L.ForKind.UNROLLED
        a = L.Var("a", self.v.dtype)
        init = L.For(t, self.t_n, L.For(jj, nr, L.Store(acc, (t * nr + jj,), L.const(0.0)),
                                        vec), unrolled)
        u, at = self.u[xi, ob, self.ic, jj], t * nr + jj
        value = bf16.product(acc[at], a, u) if self.p.pairs else L.call("fma", a, u, acc[at])
        step = L.For(t, self.t_n, L.Let(a, v_buf[v_at, xi, self.ic, t], L.For(
            jj, nr, L.Store(acc, (at,), value), vec)), unrolled)
        keep = L.For(t, self.t_n, L.For(jj, nr, L.Store(
            self.m, ((xi * self.t_n + t) * nr + jj,), acc[t * nr + jj]), vec), unrolled)
        return L.seq(init, L.For(self.ic, self.depth, step), keep)

    def transform_output(self, block, ob) -> L.Stmt:
        """Each tile's m x m pixels of the NR channels, A^T m A, staged in `o`; then each
        channel's rows of the block through bias and epilogue into Y (`store_rows`)."""
        t, jj, nr, t_n, alpha, tile = self.t, self.jj, self.nr, self.t_n, self.alpha, self.tile
        lets, y = output_transform(
            lambda a, b: self.m[((a * alpha + b) * t_n + t) * nr + jj], tile)
        width = t_n * tile
        stores = [L.Store(self.o, (((i * width) + t * tile + j) * nr + jj,), y[i][j])
                  for i in range(tile) for j in range(tile)]
        _, _, x0 = self.corner(block, t)
        stage = L.For(t, t_n, L.If(x0 < tile * self.tw, L.For(
            jj, nr, bind(lets, L.seq(*stores)), L.ForKind.VECTORIZED)))
        return L.seq(stage, self.store_rows(block, ob))

    def store_rows(self, block, ob) -> L.Stmt:
        """Y's rows of tile block `block` and channel block ob from `o`: a channel at a time,
        each of its m rows of T m pixels one vector through bias and epilogue (contiguous in
        Y, as a residual the epilogue reads; a row's last block only its pixels inside the
        image). Stored straight from the transform, a pixel was NR scattered stores, one a
        lane (F(4x4), NR 32: 512 a tile), and LLVM's loop-load elimination and SLP
        vectorizer took time quadratic in them: 1.75 s of a 64 -> 64 @56 conv's 2.2 s of
        optimisation; 0.28 s in all now (docs/llvm_backend.md, "Compile time")."""
        p, jj, nr, tile = self.p, self.jj, self.nr, self.tile
        width = self.t_n * tile
        i, x = L.Var("i"), L.Var("x")
        bn, y0, x0 = self.corner(block, L.const(0))
        out_c = ob * nr + jj
        value = self.o[(i * width + x) * nr + jj]
        if p.bias is not None:
            value = value + p.bias[out_c]
        index = (bn, out_c, y0 + i, x0 + x)
        store = L.Store(p.y, index, p.epilogue(value, index))
        row = L.For(x, width, store, L.ForKind.VECTORIZED)
        last = self.ow - (self.row_blocks - 1) * width     # pixels of a row's last block
        if last < width:
            # the last block runs past the image: its pixels there computed, not stored
            row = L.If(x0 + width <= self.ow, row,
                       L.For(x, last, store, L.ForKind.VECTORIZED))
        if self.oh % tile:
            row = L.If(y0 + i < self.oh, row)
        rows = L.For(i, tile, row)
        if self.oc % nr:
            rows = L.If(out_c < self.oc, rows)
        return L.For(jj, nr, rows)


WINOGRAD = Template("winograd", problems.winograd_conv2d, lambda p: p.float32, space, default,
                    build)
