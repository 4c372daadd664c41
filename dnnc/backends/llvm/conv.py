"""The 2-D convolution schedule templates for CPUs: direct and pointwise (depthwise:
depthwise.py, which shares this module's plane padding and row blocks).

`conv2d` is direct convolution as an implicit GEMM. An image's output pixels, flattened, play
GEMM's rows (a tile may cross a row's end) and output channels its columns: an MR-pixel by NR-channel tile of the output stays in
accumulators while the reduction runs over input channels and the kernel window, each step
one broadcast input pixel times a vector of NR weights (the dense template's micro-kernel;
see dense.py). Weights are repacked per call into [channel block, in-channel, kh, kw, NR] so
the NR weights of a step are one contiguous vector (zero-padded past the last channel), unless
convert_layout packed them at compile time (ConvPacked); the input is copied once into a
zero-padded buffer so the inner loops never test bounds. Strips of an image's pixels (a row's
worth of tiles) are shared by the worker pool. Knobs (`ConvConfig`): mr (pixels), nr
(channels; a packed weight's block width fixes it), order (strips or channel blocks outside:
whichever reads fewer bytes past L2, `conv2d_order`), strips, chunk (input channels a slice of
the reduction), band (in rows order, each unit copies the band of the padded input its strip
reads instead of one padded copy of the whole input before the parallel loop).

`pointwise` (1x1, stride 1, unpadded) is a GEMM with the pixels in the vector lanes; knobs
(`PointwiseConfig`): channels and pixels per tile, and order (pixel or channel blocks
outside, `pointwise_order`); `pointwise_gemm` runs a strided, small-image or deep 1x1 conv
through the dense template instead (`pointwise_gemm_applies`).

Grouped convolutions (1 < group, not depthwise) run through `conv2d` and `pointwise`, each
group's channel slice a conv of its own: packed weights hold each group's channel blocks
(ConvPacked), the group is part of the one parallel loop, a tile never straddles two groups;
same knobs. Group 1 gives the loop IR it always did.

At precision bf16 (`Conv2d.pairs`: the weights packed in bf16 pairs of input channels, a
group's channels even) `conv2d` and `pointwise` read the image as bf16 pairs of channels made once a call
(`bf16.pair_planes`) and reduce over pairs, one `dot_bf16x2` (vdpbf16ps) a step; the GEMM of
`pointwise_gemm` is the dense template's.

The problem is a `problems.Conv2d` (float32 NCHW, static shapes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..problems import Conv2d
from ..space import Constraint, Space, Template
from . import bf16, dense

MIN_PARALLEL_MACS = 1 << 20
"""Multiply-adds below which a conv runs on one thread: waking the pool costs microseconds,
and a smaller layer is done in about that time."""

MR_BY_VECTOR_BITS = {512: 8}
"""Pixels per tile by vector width, else 4. AVX2 (16 ymm): 4 x 2 vectors, measured fastest of
3..14 x 1..4 on the resnet50 3x3 conv. AVX-512 (32 zmm): 8 x 2 = 16 accumulators, 10-25% faster
than 4 x 2 on the resnet and mobilenet convs (znver4)."""

POINTWISE_CHANNELS = {512: 8, 256: 6}
"""Output channels per pointwise tile by vector width, else 4: with two vectors of pixels,
8 x 2 = 16 accumulators of the 32 zmm registers, 6 x 2 = 12 of the 16 ymm (as BLIS's Haswell
6 x 16; on a Zen 3 EPYC, 2 threads, every pointwise kernel of mobilenet_v2 and resnet50 took
4.1 / 26.1-27.3 ms against 4.8-5.1 / 32.4-33.2 with 4 x 2)."""


def default_panel(vector_bits: int) -> int:
    """Output channels per tile (and per packed weight block): two vector registers of
    float32."""
    return 2 * vector_bits // 32


def parallel_kind(threads: int, work: int, minimum: int = MIN_PARALLEL_MACS) -> L.ForKind:
    """PARALLEL when there are threads to share and `work` reaches `minimum`."""
    return L.ForKind.PARALLEL if threads > 1 and work >= minimum else L.ForKind.SERIAL


def pad_input(p: Conv2d, par: L.ForKind) -> tuple[L.Buffer, L.Stmt | None]:
    """The input copied into a zero-padded buffer (None when no padding is needed): zero the
    plane, then copy the image into its middle, two simple loops LLVM vectorises (a
    per-element bounds test would not be)."""
    n, c, h, wid = p.x_dims
    hp, wp = p.padded_hw
    ph, pw = p.begins
    if (ph, pw) == (0, 0) and (hp, wp) == (h, wid):
        return p.x, None
    xpad = L.Buffer("xpad", T.float32, (n, c, hp, wp))
    nc, i_h, i_w = L.Var("pnc"), L.Var("ph"), L.Var("pw")
    i_n, i_c = nc // c, nc % c
    zero = L.For(i_h, hp, L.For(i_w, wp, L.Store(xpad, (i_n, i_c, i_h, i_w), L.const(0.0))))
    copy = L.For(i_h, h, L.For(i_w, wid, L.Store(xpad, (i_n, i_c, i_h + ph, i_w + pw),
                                                  p.x[i_n, i_c, i_h, i_w])))
    return xpad, L.For(nc, n * c, L.seq(zero, copy), par)


def band_copy(band: L.Buffer, value, channels: int, top: L.Expr, left: L.Expr | int,
              image_hw, begins) -> L.Stmt:
    """band[c, a, b] = the padded input's row `top` + a, column `left` + b of channel c, zero
    outside the image (rows and columns past the padded plane as well); `value(c, row, col)`
    reads the image at an unpadded row and column. A row inside the image is its left zeros,
    its copy and its right zeros, each a simple loop LLVM vectorises (a per-element bounds
    test would not be). The direct conv's and Winograd's bands of rows (`ConvConfig.band`,
    `WinogradConfig.fused`): a unit pads only the rows its windows read."""
    (h, wid), (ph, pw) = image_hw, begins
    rows, cols = L.static_shape(band.shape)[1:]
    ca, b = L.Var("bca"), L.Var("bb")
    c, a = ca // rows, ca % rows
    # the band's columns left of the image, and where the image ends (constants once
    # L.simplify folds them, where `left` is)
    first = L.minimum(L.maximum(pw - left, 0), cols)
    end = L.minimum(L.maximum(wid + pw - left, first), cols)
    row = top + a - ph
    zero = L.Const(0, band.dtype)

    def zeros(start, count) -> L.Stmt:
        return L.For(b, count, L.Store(band, (c, a, start + b), zero))
    inside = L.seq(zeros(0, first),
                   L.For(b, end - first, L.Store(band, (c, a, first + b),
                                                 value(c, row, left + first + b - pw))),
                   zeros(end, cols - end))
    # one loop of (channel, row) pairs, not a loop of rows in a loop of channels: LLVM
    # unrolled the rows and unswitched the channel loop on each row's test, copies of
    # copies of the three vectorised loops (64 -> 64 @56 F(4x4): 0.7 of its 0.9 s of
    # machine-code generation in loop strength reduction; docs/llvm_backend.md)
    return L.For(ca, channels * rows, L.If(
        L.logical_and(row >= 0, row < h), inside, zeros(0, cols)))


COPY_LANES = 16
"""Elements a vector of `pad_plane`'s strided copy holds."""


def pad_plane(x: L.Buffer, bn: L.Expr, ch: L.Expr, image_hw, begins, padded_hw,
              fill: float | L.Expr = 0.0, phases: int = 1, load=None,
              dtype: T.DType = T.float32) -> tuple[L.Buffer, L.Stmt]:
    """Plane (bn, ch) of NCHW `x` copied into a [hp, wp] buffer filled with `fill` around it:
    done inside the loop over planes, it stays in cache for the taps that read it (a whole
    padded image would go out to memory and back: at 3x3 depthwise that copy cost more than
    the convolution). With `phases` S > 1 the buffer is [hp, S, ceil(wp / S)], column c at
    [c % S, c // S]: a tap of a stride-S window then reads consecutive elements for
    consecutive output pixels (one vector load, not S loads and a shuffle). `load` makes an
    element of x the value the plane holds (default: itself), of `dtype`, as `fill` (a value
    or an expression: int8's zero point)."""
    (h, wid), (ph, pw), (hp, wp) = image_hw, begins, padded_hw
    if load is not None:
        x = _Loaded(x, load)
    i_h, i_w = L.Var("ph"), L.Var("pw")
    fill = fill if isinstance(fill, L.Expr) else L.const(fill)
    phases = max(phases, 1)
    cols = -(-wp // phases)
    plane = L.Buffer("xplane", dtype, (hp, phases, cols) if phases > 1 else (hp, wp))
    i_p = L.Var("pp")

    def at(row, phase, col):
        return (row, phase, col) if phases > 1 else (row, col)

    def fill_rows(first: int, count: int) -> list[L.Stmt]:   # whole rows of `fill`
        if count <= 0:
            return []
        inner = L.For(i_w, cols, L.Store(plane, at(i_h + first, i_p, i_w), fill))
        return [L.For(i_h, count, L.For(i_p, phases, inner) if phases > 1 else
                      L.substitute(inner, {i_p: L.const(0)}))]

    def fill_cols(phase: int, first: int, count: int) -> list[L.Stmt]:   # in row i_h + ph
        if count <= 0:
            return []
        return [L.For(i_w, count, L.Store(plane, at(i_h + ph, L.const(phase), i_w + first),
                                          fill))]

    # a phase's columns are copied in vectors of COPY_LANES (at stride S one wide load and a
    # shuffle each: with scalar loads and stores, one an element, a 2-vCPU znver4 VM ran the
    # 3x3 stride-2 layers no faster on 2 threads than on 1, for reasons not established)
    # where the vectoriser takes the load: float32 planes of float32 images
    vectors = phases > 1 and load is None and dtype == T.float32 and x.dtype == T.float32
    # only the border is filled (the image's rows are written once, not filled first: a
    # whole-plane fill before the copy doubled the stores, and at 2 threads the 3x3 stride-2
    # 96 x 112 x 112 layer ran no faster than at 1)
    row = []
    for phase in range(phases):
        # padded column j * S + phase holds image column j * S + phase - pw where that is
        # inside the image: j from ceil((pw - phase) / S) to ceil((wid + pw - phase) / S)
        lo, hi = max(0, -(-(pw - phase) // phases)), -(-(wid + pw - phase) // phases)
        row += fill_cols(phase, 0, min(lo, cols))

        def copy(width: int, start, phase=phase, lo=lo) -> L.Stmt:
            col = i_w + start + lo
            kind = L.ForKind.VECTORIZED if vectors and width >= 2 else L.ForKind.SERIAL
            return L.For(i_w, width, L.Store(plane, at(i_h + ph, L.const(phase), col),
                                             x[bn, ch, i_h, col * phases + (phase - pw)]),
                         kind)
        if hi > lo:
            row.append(row_in_vectors(copy, hi - lo, COPY_LANES) if vectors else
                       copy(hi - lo, L.const(0)))
        row += fill_cols(phase, max(hi, lo), cols - max(hi, lo))
    return plane, L.seq(*fill_rows(0, ph), L.For(i_h, h, L.seq(*row)),
                        *fill_rows(ph + h, hp - ph - h))


class _Loaded:
    """A buffer read through `load` (`pad_plane`'s x[...] as the float32 its plane holds)."""

    def __init__(self, x: L.Buffer, load):
        self.x, self.load = x, load

    def __getitem__(self, index) -> L.Expr:
        return self.load(self.x[index])


def row_in_vectors(block, width: int, lanes: int) -> L.Stmt:
    """A row of `width` pixels as `block(lanes, start)` for each whole block of `lanes`
    pixels, then one narrower `block(rest, start)`."""
    pb = L.Var("pb")
    full = width // lanes
    parts = []
    if full:
        parts.append(L.For(pb, full, block(lanes, pb * lanes)))
    if width % lanes:
        parts.append(block(width % lanes, L.const(full * lanes)))
    return L.seq(*parts)


PIXEL_BLOCKS = range(1, 33)
"""Pixels per block a row-in-blocks template (depthwise, pool) may take: 1 to 32 (two AVX-512
vectors); a block of one pixel is scalar code, wider blocks are vector code, the row's tail
one narrower block."""


def _channel_blocks(packed_nr: int, vector_bits: int) -> tuple[list[int], list[Constraint]]:
    """Output channels per tile (one to four vectors, a packed block's width) and, for packed
    weights, the constraint that the tile is one block."""
    lanes = vector_bits // 32
    widths = {v * lanes for v in (1, 2, 3, 4)} | ({packed_nr} if packed_nr else set())
    fixed = [Constraint(f"nr == {packed_nr}: the weights are packed in blocks of "
                        f"{packed_nr} channels", lambda c: c.nr == packed_nr)] \
        if packed_nr else []
    return sorted(widths), fixed


# -- direct ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvConfig:
    mr: int    # output pixels per tile
    nr: int    # output channels per tile
    # the parallel loop's order: "rows" (strips of a row's worth of output pixels outside
    # channel blocks: a strip's input is read once, every block's weights once per strip)
    # or "blocks" (channel blocks outside strips: a block's weights are read once, the input
    # once per block)
    order: str = "rows"
    # strips an image's tiles are split into, a strip the parallel loop's unit of pixels;
    # 0: one a row (a row's worth of tiles, ceil(OW / MR), each)
    strips: int = 0
    # input channels per slice of the reduction, each slice run over a span of CHUNK_TILES
    # tiles before the next (their partial sums kept in a buffer): the slice's weights stay
    # in L1 for the span; 0: every input channel in one pass a tile
    chunk: int = 0
    # "rows" order, where the input needs a copy (padding, or bf16 pairs): each unit
    # (group, strip) copies the band of the padded input its strip reads into scratch of its
    # own, instead of one copy of the whole input made before the parallel loop, whose
    # planes, written a plane a thread, every thread then reads (`_DirectConv.band_fill`)
    band: bool = False


L2_BYTES = 1 << 20
"""What the order choice assumes stays in a core's L2 between reuses (1-2 MB on the Xeons
and EPYCs we run on)."""


def conv2d_space(p: Conv2d, machine) -> Space:
    widths, constraints = _channel_blocks(p.packed_nr, machine.vector_bits)
    pixels = p.y_dims[2] * p.y_dims[3]
    constraints = constraints + [Constraint(
        f"strips <= ceil({pixels} / mr): a strip has a tile at least",
        lambda c: c.strips <= -(-pixels // c.mr))]
    constraints = constraints + [Constraint(
        "band only in rows order: in blocks order a strip would be copied once a block",
        lambda c: not c.band or c.order == "rows")]
    return Space("conv2d", ConvConfig, {"mr": range(1, 17), "nr": widths,
                                        "order": ("rows", "blocks"), "strips": STRIPS,
                                        "chunk": CHUNKS, "band": (False, True)},
                 constraints)


STRIPS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
"""The conv2d space's strip counts (0: one strip a row)."""

STRIP_COST = 1.0
"""What a strip costs besides its tiles, in tiles: its channel block's weights read again
(NR x K floats against a tile's MR x NR x K multiply-adds; `conv2d_strips`)."""


def run_count(inner: int, outer: int, threads: int) -> int:
    """Runs to split `inner` blocks into, for each of `outer` blocks, a run one parallel unit:
    as few as the threads allow (`dense.shared_block_tiles`, a run costing STRIP_COST blocks
    besides its own), as the next count of STRIPS."""
    runs = -(-inner // dense.shared_block_tiles(inner, inner, outer, threads, STRIP_COST))
    return min((s for s in STRIPS if s >= runs), default=STRIPS[-1])


def conv2d_default(p: Conv2d, machine) -> ConvConfig:
    lanes = machine.vector_bits // 32
    nr = p.packed_nr or default_panel(machine.vector_bits)
    # as many accumulators whatever NR is: a one-vector-wide block takes twice the pixels
    mr = MR_BY_VECTOR_BITS.get(machine.vector_bits, 4) * max(2 // max(nr // lanes, 1), 1)
    order = conv2d_order(p, nr)
    return ConvConfig(mr, nr, order, conv2d_strips(p, mr, nr, machine.threads)
                      if order == "blocks" else 0, conv2d_chunk(p, nr),
                      conv2d_band(order, machine.threads))


def conv2d_band(order: str, threads: int) -> bool:
    """Whether the default copies a band a unit (`ConvConfig.band`): in rows order on more
    than one thread, where one padded copy of the whole input, written a plane a thread,
    moves between the cores that read it. 2 threads, quiet znver4 host, whole copy -> band:
    3x3 stride-2 stem 0.20 -> 0.16 ms, 16 -> 24 stride 2 at 112 0.22 -> 0.16, 64 -> 128
    stride 2 at 56 0.63 -> 0.59, 7x7 stem 1.18 -> 1.16; bf16 0.12 -> 0.10, 0.33 -> 0.30
    (docs/llvm_backend.md, "Winograd convolutions"). On 1 thread the band's copies (a
    window's rows again for each strip) cost more than they save on small-channel convs
    (8 -> 16 at 112: 0.27 -> 0.55 ms on the device host's Xeon)."""
    return order == "rows" and threads > 1


def conv2d_chunk(p: Conv2d, nr: int) -> int:
    """Input channels per slice of the reduction: the most of CHUNKS that keeps the slice's
    weights for one channel block (chunk x kh x kw x NR floats) within CHUNK_WEIGHT_BYTES,
    at least 8; 0 (one pass) when every input channel fits. A tile reads its block's weights for every
    input channel: at 256 -> 256 3x3 that is 147 KB, from L2 for every tile, which bounded the
    multiply-adds by L2's bandwidth (vgg19's 256->256 at 56x56 1.43x onnxruntime, 2 threads)."""
    cg, kh, kw = p.w_dims[1:]
    per_channel = kh * kw * nr * 4
    if cg * per_channel <= CHUNK_WEIGHT_BYTES:
        return 0
    chunk = max([c for c in CHUNKS if 0 < c and c * per_channel <= CHUNK_WEIGHT_BYTES] or [8])
    return chunk if chunk < cg else 0   # a 7x7 stem's 3 channels on AVX-512: one pass


CHUNKS = (0, 8, 16, 24, 32, 48, 64, 128, 256)
"""The conv2d space's input channels per reduction slice (0: one pass)."""


CHUNK_WEIGHT_BYTES = 16 << 10
"""Weights of a channel block one reduction slice reads (`conv2d_chunk`): half of a 32 KB L1,
the rest for the span's input rows and partial sums."""

CHUNK_TILES = 16
"""Tiles a reduction slice runs over before the next (`ConvConfig.chunk`): their partial sums,
16 x MR x NR floats (4 KB at 4 x 16), stay in L1."""


def conv2d_strips(p: Conv2d, mr: int, nr: int, threads: int) -> int:
    """Strips per image with channel blocks outside strips: strips as long as the threads
    allow (`dense.shared_block_tiles`, the channel blocks as its panels), so that a thread
    runs one block's tiles one after another, its weights in that core's L2, rather than a
    row's worth of tiles per claim, each block's weights pulled into up to a strip count of
    cores (resnet50's 3x3 512->512 at 7x7, 16 threads: a row's worth, 7 strips, was 2.3x
    onnxruntime in the model)."""
    n = p.x_dims[0]
    tiles = -(-(p.y_dims[2] * p.y_dims[3]) // mr)
    blocks = n * p.group * -(-(p.w_dims[0] // p.group) // nr)
    return run_count(tiles, blocks, threads)


def conv2d_order(p: Conv2d, nr: int) -> str:
    """The loop order reading fewer bytes from beyond L2: rows outside re-read the weights
    (past L2) once per output row, blocks outside re-read the input (past L2) once per
    channel block. resnet50's 3x3 512->512 conv at 7x7 (9.4 MB of weights, 7 rows): 1.1 ms
    alone but 2.0 ms among the model's other layers with rows outside, as its weights came
    from memory 7 times (Xeon, 2 threads)."""
    n, c, h, wid = p.x_dims
    oc, cg, kh, kw = p.w_dims
    oh = p.y_dims[2]
    weights = oc * cg * kh * kw * 4
    inputs = n * c * h * wid * 4
    rows_cost = weights * (n * oh if weights > L2_BYTES else 1)
    blocks_cost = inputs * (-(-(oc // p.group) // nr) if inputs > L2_BYTES else 1)
    return "blocks" if blocks_cost < rows_cost else "rows"


def conv2d_build(p: Conv2d, config: ConvConfig, machine) -> L.PrimFunc:
    """Direct convolution, MR pixels by NR channels a tile. A grouped conv is `group` such
    convolutions side by side: its packed weights hold each group's channel blocks, and
    the group is the parallel loop's outermost part, so the tiles of one group, which share its
    weights and its input channels, run one after another on a thread. The parallel loop runs
    over (group, strip of an image's pixels, channel block) in the order the config says
    (`conv2d_order`)."""
    conv = _DirectConv(p, config, machine)
    stmts = [conv.pad_stmt] if conv.pad_stmt is not None else []
    wpk, pack = conv.packed_weights()
    if pack is not None:
        stmts.append(pack)
    stmts.append(conv.parallel_loop(wpk))
    body = L.seq(*stmts)
    if not p.packed_nr:
        body = L.Allocate(wpk, body)
    if conv.pad_stmt is not None:
        body = L.Allocate(conv.xpad, body)
    # (weights in bf16 pairs: the parameter as the uint32 words the body reads)
    params = tuple(wpk if x.name == wpk.name else x for x in p.params)
    return L.simplify(L.PrimFunc(p.name, params, body))


class _DirectConv:
    """The pieces of `conv2d_build`: the geometry of its tiles, strips and channel blocks,
    the loop variables they share, and a method per part of the kernel (the weights packed,
    a tile's reduction, its store, a strip's tiles, the parallel loop)."""

    def __init__(self, p: Conv2d, config: ConvConfig, machine):
        self.p, self.config = p, config
        n = p.x_dims[0]
        self.oc, self.cg, self.kh, self.kw = oc, cg, kh, kw = p.w_dims
        _, _, oh, self.ow = p.y_dims
        ow = self.ow
        self.mr, self.nr = mr, nr = config.mr, config.nr
        self.groups = groups = p.group
        self.mg = oc // groups               # output channels of a group
        self.ocb_n = ocb_n = -(-self.mg // nr)   # channel blocks of a group
        self.par = parallel_kind(machine.threads, n * oc * oh * ow * cg * kh * kw)
        # steps of the reduction over input channels: channels, or pairs of them
        self.depth = -(-cg // 2) if p.pairs else cg
        self.q, self.ic, self.r, self.s, self.jj = (L.Var(v) for v in ("q", "ic", "r", "s",
                                                                       "j"))
        self.ii, self.pb = L.Var("ii"), L.Var("pb")
        self.acc = L.Buffer("acc", T.float32, (mr * nr,), L.Scope.LOCAL)
        # an image's output pixels, flattened, in tiles of MR: a tile may run on past a row's
        # end into the next row (each broadcast is a load of its own), so only the image's
        # last tile is partial (at 7x7 and MR 4: 13 tiles for 49 pixels, not 14 for 56; at
        # 14x14 49 for 196, not 56); the image's tiles in the config's count of strips, by
        # default one a row
        self.pixels_n = oh * ow
        self.tiles_n = -(-self.pixels_n // mr)
        self.strip_tiles = -(-self.tiles_n // config.strips) if config.strips else \
            -(-ow // mr)
        strips_n = -(-self.tiles_n // self.strip_tiles)
        # one parallel loop over (group, image strip, channel block), its order the config's:
        # (group, strip) outside the block for "rows", (group, block) outside the strip for
        # "blocks"
        rows = n * strips_n
        self.outer, self.ob = L.Var("t"), L.Var("ob")
        if config.order == "blocks":
            g, inner = self.outer // (ocb_n * rows), self.outer % (ocb_n * rows)
            self.ob_of, image_strip = inner // rows, inner % rows
            self.extent = groups * ocb_n * rows
        else:
            g, image_strip = self.outer // rows, self.outer % rows
            self.ob_of, self.extent = None, groups * rows
        if groups == 1:
            g = None
            self.channel0, self.block0 = L.const(0), self.ob
        else:   # (in pairs of channels at bf16: a group's channels are even)
            self.channel0, self.block0 = g * self.depth, g * ocb_n + self.ob
        self.bn, self.strip = image_strip // strips_n, image_strip % strips_n
        self.p0 = (self.strip * self.strip_tiles + self.pb) * mr
        self.in_group = self.ob * nr + self.jj                  # output channel in its group
        self.out_c = self.in_group if groups == 1 else g * self.mg + self.in_group
        # the input the reduction reads: a band of the padded input a unit, the whole input
        # padded (or paired) once a call, or the input itself
        self.band_rows = self.banded_rows(strips_n) if config.band and \
            config.order == "rows" else 0
        if self.band_rows:
            self.xpad = L.Buffer("xband", T.uint32 if p.pairs else T.float32,
                                 (self.depth, self.band_rows, p.padded_hw[1]))
            self.pad_stmt = None
        elif p.pairs:   # the image and the weights in bf16 pairs of input channels
            self.xpad, self.pad_stmt = bf16.pair_planes(p.x, p.x_dims, p.begins, p.padded_hw,
                                                        self.par)
        else:
            self.xpad, self.pad_stmt = pad_input(p, self.par)

    def banded_rows(self, strips_n: int) -> int:
        """Rows of the padded input the most a strip's windows read (`ConvConfig.band`), or 0
        where the input is read as it is (no padding, not paired)."""
        p = self.p
        if not p.pairs and tuple(p.begins) == (0, 0) and \
                tuple(p.padded_hw) == tuple(p.x_dims[2:]):
            return 0
        span = self.strip_tiles * self.mr
        below = max((min((s + 1) * span, self.pixels_n) - 1) // self.ow - s * span // self.ow
                      for s in range(strips_n))
        return below * p.strides[0] + (self.kh - 1) * p.dilations[0] + 1

    def band_top(self) -> L.Expr:
        """The padded input's row that the band's first row holds: the strip's first output
        row's first window row."""
        return (self.strip * (self.strip_tiles * self.mr)) // self.ow * self.p.strides[0]

    def band_fill(self) -> L.Stmt:
        """The unit's band (`band_copy`): the padded input's rows from band_top on, every
        column, of the group's channels (bf16: its pairs of channels)."""
        p = self.p
        if p.pairs:
            def value(c, row, col):
                return bf16.channel_pair(p.x, p.x_dims[1], self.bn, self.channel0 + c, row, col)
        else:
            def value(c, row, col):
                return p.x[self.bn, self.channel0 + c, row, col]
        return band_copy(self.xpad, value, self.depth, self.band_top(), 0, p.x_dims[2:],
                         p.begins)

    def packed_weights(self) -> tuple[L.Buffer, L.Stmt | None]:
        """The weights as [channel block, in-channel, kh, kw, NR] (zero past a group's last
        channel), and the loop packing them (None: convert_layout packed them)."""
        p, nr, mg, ocb_n, groups = self.p, self.nr, self.mg, self.ocb_n, self.groups
        q, ic, r, s, jj = self.q, self.ic, self.r, self.s, self.jj
        if p.pairs:   # each (pair of channels, tap, output channel) one word of two bf16
            return L.Buffer(p.w.name, T.uint32, L.static_shape(p.w.shape)[:5]), None
        if p.packed_nr:
            return p.w, None   # convert_layout packed the weights at compile time
        wpk = L.Buffer("wpack", T.float32, (groups * ocb_n, self.cg, self.kh, self.kw, nr))
        if groups == 1:
            o, first = q * nr + jj, L.const(0)
        else:   # block q is block q % ocb_n of group q // ocb_n
            o, first = (q % ocb_n) * nr + jj, (q // ocb_n) * mg
        wval = L.Select(o < mg, p.w[first + L.minimum(o, mg - 1), ic, r, s], L.const(0.0))
        return wpk, L.For(q, groups * ocb_n, L.For(ic, self.cg, L.For(r, self.kh, L.For(
            s, self.kw, L.For(jj, nr, L.Store(wpk, (q, ic, r, s, jj), wval))))))

    def init(self) -> L.Stmt:
        """The tile's accumulators zeroed."""
        ii, jj, nr = self.ii, self.jj, self.nr
        return L.For(ii, self.mr, L.For(jj, nr, L.Store(self.acc, (ii * nr + jj,),
                                                        L.const(0.0)),
                                        L.ForKind.VECTORIZED), L.ForKind.UNROLLED)

    def reduction(self, wpk: L.Buffer) -> L.For:
        """The reduction over (in-channel, kh, kw) as three loops; the weights of one step are
        one contiguous NR-vector, the input one broadcast pixel per accumulator row."""
        p, ii, jj, nr, ic, r, s, acc = (self.p, self.ii, self.jj, self.nr, self.ic, self.r,
                                        self.s, self.acc)
        (sh, sw), (dh, dw) = p.strides, p.dilations
        ow = self.ow
        a = L.Var("a", T.uint32 if p.pairs else T.float32)
        # pixels past the image's end repeat; not stored
        pix = L.minimum(self.p0 + ii, self.pixels_n - 1)
        row, col = (pix // ow) * sh + r * dh, (pix % ow) * sw + s * dw
        if self.band_rows:
            load = self.xpad[ic, row - self.band_top(), col]
        elif len(self.xpad.shape) == 3:   # (bf16 pairs of an unpadded image: flat planes)
            load = self.xpad[self.bn, self.channel0 + ic, row * p.padded_hw[1] + col]
        else:
            load = self.xpad[self.bn, self.channel0 + ic, row, col]
        w, at = wpk[self.block0, ic, r, s, jj], ii * nr + jj
        value = bf16.product(acc[at], a, w) if p.pairs else L.call("fma", a, w, acc[at])
        step = L.For(ii, self.mr, L.Let(a, load, L.For(
            jj, nr, L.Store(acc, (at,), value), L.ForKind.VECTORIZED)), L.ForKind.UNROLLED)
        return L.For(ic, self.depth, L.For(r, self.kh, L.For(s, self.kw, step)))

    def store(self) -> L.Stmt:
        """The tile's results through bias and the fused epilogue into Y, a channel at a
        time: its MR pixels, consecutive in an NCHW plane whether or not the tile crosses a
        row's end, one vector (the accumulators transposed in registers; a residual the
        epilogue reads one vector too, where its reads allow `flat_epilogue_reads`); the
        image's last tile, short of MR pixels, its pixels only. Until session 58 the epilogue
        ran a pixel at a time across the NR channels (a residual loaded a lane at a time),
        and a tile crossing a row's end or the image's was stored a lane at a time, through
        the epilogue again: 64 -> 64 3x3 stride 2 at 56x56 with a residual took 1.49 CPU s of
        LLVM's optimisation, 0.14 now, its outputs the same bits (docs/llvm_backend.md,
        "Compile time of the direct convolutions")."""
        p, ii, jj, nr, mr, acc = self.p, self.ii, self.jj, self.nr, self.mr, self.acc
        bn, out_c, ow = self.bn, self.out_c, self.ow
        # Y with each plane's pixels one axis: a channel's MR pixels one contiguous store
        y = L.Buffer(p.y.name, p.y.dtype, (p.y_dims[0], self.oc, self.pixels_n))
        px = self.p0 + ii
        value = acc[ii * nr + jj]
        if p.bias is not None:
            value = value + p.bias[out_c]
        value = p.epilogue(value, (bn, out_c, L.const(0), px) if p.flat_epilogue_reads else
                           (bn, out_c, px // ow, px % ow))

        def channels(pixels: int) -> L.Stmt:
            kind = L.ForKind.VECTORIZED if pixels >= 2 else L.ForKind.UNROLLED
            one = L.For(ii, pixels, L.Store(y, (bn, out_c, px), value), kind)
            if self.mg % nr:   # a group's last block: its channels past the group not stored
                one = L.If(self.in_group < self.mg, one)
            return L.For(jj, nr, one, L.ForKind.UNROLLED)
        last = self.pixels_n - (self.tiles_n - 1) * mr   # pixels of the image's last tile
        if last == mr:
            return channels(mr)
        return L.If(self.p0 + mr <= self.pixels_n, channels(mr), channels(last))

    def strip_tiles_loop(self, wpk: L.Buffer) -> L.Stmt:
        """A strip's tiles, each reduced and stored; with a chunk, the reduction in slices
        of `chunk` input channels, each slice over a span of up to CHUNK_TILES tiles before
        the next, partial sums waiting in `part` between slices."""
        strip_tiles, tiles_n, cg, pb = self.strip_tiles, self.tiles_n, self.depth, self.pb
        init, reduction, store = self.init(), self.reduction(wpk), self.store()
        strip_len = L.const(strip_tiles) if tiles_n % strip_tiles == 0 else \
            L.minimum(L.const(strip_tiles), tiles_n - self.strip * strip_tiles)  # last: short
        chunk = -(-self.config.chunk // 2) if self.p.pairs else self.config.chunk
        chunk = chunk if 0 < chunk < cg else 0
        if not chunk:
            return L.For(pb, strip_len, L.Allocate(self.acc, L.seq(init, reduction, store)))
        ii, jj, mr, nr, acc = self.ii, self.jj, self.mr, self.nr, self.acc
        span = min(CHUNK_TILES, strip_tiles)
        slices = -(-cg // chunk)
        part = L.Buffer("part", T.float32, (span * mr * nr,), L.Scope.LOCAL)
        kc, icl, sp, pt = (L.Var(v) for v in ("kc", "icl", "sp", "pt"))
        at = (pt * mr + ii) * nr + jj
        resume = L.For(ii, mr, L.For(jj, nr, L.Store(acc, (ii * nr + jj,), part[at]),
                                     L.ForKind.VECTORIZED), L.ForKind.UNROLLED)
        save = L.For(ii, mr, L.For(jj, nr, L.Store(part, (at,), acc[ii * nr + jj]),
                                   L.ForKind.VECTORIZED), L.ForKind.UNROLLED)
        depth = L.const(chunk) if cg % chunk == 0 else L.minimum(L.const(chunk),
                                                                 cg - kc * chunk)
        sliced = L.For(icl, depth, L.substitute(reduction.body, {self.ic: kc * chunk + icl}))
        tile = L.Allocate(acc, L.seq(L.If(L.eq(kc, 0), init, resume), sliced,
                                     L.If(kc < slices - 1, save, store)))
        tiles = L.minimum(L.const(span), strip_len - sp * span)
        return L.Allocate(part, L.For(sp, (strip_len + (span - 1)) // span, L.For(
            kc, slices, L.For(pt, tiles, L.substitute(tile, {pb: sp * span + pt})))))

    def parallel_loop(self, wpk: L.Buffer) -> L.For:
        """The one parallel loop over (group, image strip, channel block)."""
        pixels = self.strip_tiles_loop(wpk)
        if self.ob_of is None:
            unit = L.For(self.ob, self.ocb_n, pixels)
            if self.band_rows:
                unit = L.Allocate(self.xpad, L.seq(self.band_fill(), unit))
            return L.For(self.outer, self.extent, unit, self.par)
        return L.For(self.outer, self.extent, L.Let(self.ob, self.ob_of, pixels), self.par)


# -- pointwise ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PointwiseConfig:
    channels: int    # output channels per tile
    pixels: int      # consecutive pixels per tile (in the vector lanes)
    # the parallel loop's order inside a group: "pixels" (pixel blocks outside channel
    # blocks: an input block stays in L1 while every channel block reads it) or "channels"
    # (channel blocks outside: a block's weights are read once)
    order: str = "pixels"
    # runs the inner blocks (the order's second) are split into, a run one unit of the
    # parallel loop whose blocks one thread does one after another; 0: every block a unit
    runs: int = 0


def pointwise_space(p: Conv2d, machine) -> Space:
    # blocks no bigger than the layer: a last partial block starts earlier instead (see
    # `pointwise_build`)
    lanes = machine.vector_bits // 32
    mg, hw = p.w_dims[0] // p.group, p.x_dims[2] * p.x_dims[3]
    return Space("pointwise", PointwiseConfig,
                 {"channels": range(1, min(mg, max(POINTWISE_CHANNELS.values())) + 1),
                  "pixels": range(1, min(hw, 4 * lanes) + 1),
                  "order": ("pixels", "channels"), "runs": STRIPS})


def pointwise_default(p: Conv2d, machine) -> PointwiseConfig:
    mg, hw = p.w_dims[0] // p.group, p.x_dims[2] * p.x_dims[3]
    channels = min(POINTWISE_CHANNELS.get(machine.vector_bits, 4), mg)
    pixels = min(2 * machine.vector_bits // 32, hw)
    order = pointwise_order(p, channels, pixels)
    return PointwiseConfig(channels, pixels, order,
                           pointwise_runs(p, channels, pixels, order, machine.threads))


def pointwise_runs(p: Conv2d, channels: int, pixels: int, order: str, threads: int) -> int:
    """Runs of the inner blocks per outer block: as few as the threads allow
    (`dense.shared_block_tiles`, the outer blocks as its panels, a run costing one block
    besides its own: the input block, or the weights, read again), so one thread reuses
    what a run's blocks share from its own L2, where one unit a block sent consecutive
    blocks to different cores (resnet50's 512->128 at 28x28, 16 threads: 2.1x
    onnxruntime's time in the model)."""
    mg, hw = p.w_dims[0] // p.group, p.x_dims[2] * p.x_dims[3]
    cbs, pbs = -(-mg // channels), -(-hw // pixels)
    inner, outer = (pbs, cbs) if order == "channels" else (cbs, pbs)
    return run_count(inner, outer * p.x_dims[0] * p.group, threads)


def pointwise_order(p: Conv2d, channels: int, pixels: int) -> str:
    """As `conv2d_order`: the weights past L2 re-read once per pixel block, or the input
    past L2 once per channel block, whichever reads fewer bytes."""
    mg, hw = p.w_dims[0] // p.group, p.x_dims[2] * p.x_dims[3]
    weights = p.w_dims[0] * p.w_dims[1] * 4
    inputs = p.x_dims[0] * p.x_dims[1] * hw * 4
    pixels_cost = weights * (p.x_dims[0] * -(-hw // pixels) if weights > L2_BYTES else 1)
    channels_cost = inputs * (-(-mg // channels) if inputs > L2_BYTES else 1)
    return "channels" if channels_cost < pixels_cost else "pixels"


def _pointwise_operands(p: Conv2d, par: L.ForKind) -> tuple:
    """(the image as [N, C, H * W], the weights, the reduction's steps, the statement making
    the image's operand or None) as `pointwise_build` reads them: with bf16 pairs (one
    group), the image's channel pairs made once a call and the weights' uint32 words."""
    n, c, h, wid = p.x_dims
    if not p.pairs:
        return L.Buffer(p.x.name, T.float32, (n, c, h * wid)), p.w, p.w_dims[1], None
    xf, pairing = bf16.pair_planes(p.x, p.x_dims, (0, 0), (h, wid), par)
    w = L.Buffer(p.w.name, T.uint32, L.static_shape(p.w.shape)[:5])
    return xf, w, -(-p.w_dims[1] // 2), pairing


def pointwise_build(p: Conv2d, config: PointwiseConfig, machine) -> L.PrimFunc:
    """A 1x1 stride-1 unpadded conv as a GEMM with the pixels in the vector lanes: an
    output tile is CM channels by PW consecutive pixels, each step one broadcast weight per
    channel times the input channel's pixel vectors. NCHW keeps an image's pixels
    contiguous, so every load and every store is a whole vector (the channel-vector tile of
    `conv2d_build` would store its outputs one lane at a time: at 24 input channels that
    cost more than the multiply-adds). A grouped conv is one such GEMM a group (its input
    channels by its output channels), the groups between the images and the pixel blocks
    of the one parallel loop; a tile never straddles two groups."""
    n, _, h, wid = p.x_dims
    oc, cg = p.w_dims[:2]
    ow = p.y_dims[3]
    then = p.epilogue
    bias, y = p.bias, p.y
    groups = p.group
    mg = oc // groups
    hw = h * wid
    yf = L.Buffer(y.name, y.dtype, (n, oc, hw))
    ic, cm, q, t = L.Var("ic"), L.Var("cm"), L.Var("q"), L.Var("t")
    a = L.Var("a", T.uint32 if p.pairs else T.float32)
    nr = p.packed_nr
    blocks = -(-mg // nr) if nr else 0   # packed blocks a group
    par = parallel_kind(machine.threads, n * oc * hw * cg)
    xf, w, depth, pairing = _pointwise_operands(p, par)

    def product(acc_at, image):   # the step's multiply-add into acc_at
        if p.pairs:
            return bf16.product(acc_at, a, image)
        return L.call("fma", a, image, acc_at)

    def weight(g, j):   # output channel j of group g (None: the only group)
        if not nr:
            return w[j if g is None else g * mg + j, ic, 0, 0]
        if g is None:
            return w[j // nr, ic, 0, 0, j % nr]
        return w[g * blocks + j // nr, ic, 0, 0, j % nr]

    def block(bn, g, j0, p0, channels: int, width: int) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (channels * width,), L.Scope.LOCAL)
        vec = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        ci = ic if g is None else g * depth + ic   # (depth: pairs of channels at bf16)
        init = L.For(cm, channels, L.For(q, width, L.Store(acc, (cm * width + q,),
                                                             L.const(0.0)), vec),
                     L.ForKind.UNROLLED)
        step = L.For(cm, channels, L.Let(a, weight(g, j0 + cm), L.For(q, width, L.Store(
            acc, (cm * width + q,), product(acc[cm * width + q], xf[bn, ci, p0 + q])),
            vec)), L.ForKind.UNROLLED)
        o = j0 + cm if g is None else g * mg + j0 + cm
        px = p0 + q
        value = acc[cm * width + q]
        if bias is not None:
            value = value + bias[o]
        # the epilogue reads its other inputs at the 4-d index; where they all have the
        # output's shape (or broadcast over whole images) the flat pixel is the same element
        value = then(value, (bn, o, L.const(0), px) if p.flat_epilogue_reads else
                     (bn, o, px // ow, px % ow))
        store = L.For(cm, channels, L.For(q, width, L.Store(yf, (bn, o, px), value), vec),
                      L.ForKind.UNROLLED)
        return L.Allocate(acc, L.seq(init, L.For(ic, depth, step), store))

    # a last block of channels or pixels that would be partial starts earlier instead,
    # overlapping the one before (its values are computed twice, identically): every block
    # has the full width, no narrow tail code
    cms, pws = config.channels, config.pixels
    cbs, pbs = -(-mg // cms), -(-hw // pws)
    # "pixels": channel blocks inner, an input block (C x PW pixels) stays in L1 while every
    # channel block uses it; "channels": pixel blocks inner, a channel block's weights stay
    # in L1 while every pixel block uses them
    # the inner blocks in `runs` runs of `per_run` blocks, a run one unit of the parallel loop
    inner_n, outer_n = (pbs, cbs) if config.order == "channels" else (cbs, pbs)
    runs = min(config.runs, inner_n) or inner_n
    per_run = -(-inner_n // runs)
    runs = -(-inner_n // per_run)
    units = outer_n * runs
    if groups == 1:
        bn, g, unit = t // units, None, t % units
    else:
        bn, g = t // (groups * units), (t // units) % groups
        unit = t % units
    r = L.Var("r")
    outer_b, inner_b = unit // runs, (unit % runs) * per_run + r
    cb, pb = (outer_b, inner_b) if config.order == "channels" else (inner_b, outer_b)
    j0 = L.minimum(cb * cms, mg - cms) if mg % cms else cb * cms
    p0 = L.minimum(pb * pws, hw - pws) if hw % pws else pb * pws
    tile = block(bn, g, j0, p0, cms, pws)
    if per_run == 1:
        run = L.substitute(tile, {r: L.const(0)})
    elif inner_n % per_run == 0:
        run = L.For(r, per_run, tile)
    else:   # the last run is short
        run = L.For(r, L.minimum(L.const(per_run), inner_n - (unit % runs) * per_run), tile)
    main = L.For(t, n * groups * units, run, par)
    if pairing is None:
        return L.simplify(L.PrimFunc(p.name, p.params, main))
    # (weights in bf16 pairs: the parameter as the uint32 words the body reads)
    params = tuple(w if v.name == w.name else v for v in p.params)
    return L.simplify(L.PrimFunc(p.name, params, L.Allocate(xf, L.seq(pairing, main))))


def pointwise_gemm_applies(p: problems.PointwiseDense) -> bool:
    """Whether a 1x1 conv runs as the dense template's GEMM (`Conv2d.as_dense`: output pixels
    as rows, output channels in the vectors, stored back one lane at a time) rather than
    `pointwise_build` or `conv2d_build`: strided ones (ResNet's downsampling 1x1 stride-2:
    `conv2d_build` re-reads each input pixel's line for every tap step), small images, whose
    pixel vectors would overlap (49 pixels in four blocks of 16: 31% of the multiply-adds
    twice), and images of at most 16x16 with 512 or more input channels (a pointwise tile
    streams all of K with no slicing). Zen 3, 2 threads, against onnxruntime: 2048->512 at
    7x7 1.97 -> 1.40x, 320->1280 1.64 -> 1.43x, 1024->256 at 14x14 1.42 -> 1.11x, with k in
    slices of up to 1024 512->1000 at 13x13 (squeezenet's last) 1.30 -> 1.11x, 512->512 at
    14x14 1.30 -> 1.04x, 576->96 1.18 -> 1.03x; with fewer input channels the GEMM lost or
    tied (96->576 at 14x14 1.00 -> 1.12x, 384->64 at 13x13 0.90 -> 1.00x, 128->512 at
    28x28 0.97 -> 1.06x, 512->128 at 28x28 0.84 -> 0.88x)."""
    if not p.float32:   # (16-bit storage: the default template computes it)
        return False
    if tuple(p.strides) != (1, 1):
        return True
    return p.m <= GEMM_MAX_PIXELS or (p.m <= 256 and p.k >= 512)


def pointwise_gemm_default(p: problems.PointwiseDense, machine) -> dense.DenseConfig:
    """The dense template's default with k sliced at most 1024 deep, not 256: a later slice
    starts from the partial sums the earlier left in the output, which NCHW stores (and
    reloads) a lane at a time (Zen 3, 2 threads: 1024->256 at 14x14 0.773 -> 0.707 ms;
    2048->512 at 7x7 1.023 -> 0.861; 512->2048 at 7x7 0.960 -> 0.853)."""
    config = dense.default(p, machine)
    config = dataclasses.replace(config, mc_tiles=whole_image_tiles(p, config, machine.threads))
    if config.kc == p.k:
        return config   # one slice already (few rows, or an output partial sums cannot wait in)
    return dataclasses.replace(config, kc=min(p.k, GEMM_SLICE))


def whole_image_tiles(p: problems.PointwiseDense, config: dense.DenseConfig,
                      threads: int) -> int:
    """`config`'s row tiles a block, or every pixel of an image in one block where the dense
    default split an image's pixels only to share (row block, panel) pairs between threads
    (`dense.shared_block_tiles`) while the panels alone give every thread one: NCHW stores a
    row block's pixels into a run of each channel's plane, so two blocks of a plane write the
    cache line where they meet, and on a small image (a 7x7 plane's 49 pixels: no block
    boundary falls on a line's) a split makes threads write the same lines. znver5, 2
    threads, alone: 960 -> 160 at 7x7 (5 panels) 63-64 us in 3-tile blocks, 55 whole (1
    thread 87); 576 -> 160 38 -> 34.5."""
    whole = -(-p.m // config.mr)
    if threads > 1 and config.mc_tiles < whole and whole * config.mr <= dense.MC and \
            p.batch * (p.n // config.nr) >= threads:
        return whole
    return config.mc_tiles


GEMM_SLICE = 1024
"""k per slice of `pointwise_gemm` (see `pointwise_gemm_default`)."""


GEMM_MAX_PIXELS = 64
"""Pixels an image has at most for every pointwise conv on it to run as a GEMM (7x7 and
8x8 images; see `pointwise_gemm_applies`)."""


POINTWISE_GEMM = Template("pointwise_gemm", problems.pointwise_dense, pointwise_gemm_applies,
                          dense.space, pointwise_gemm_default, dense.build)
# (float32 only: 16-bit storage takes the default template)
CONV2D = Template("conv2d", problems.conv2d, lambda p: p.float32 and (p.group == 1 or
                                                                       p.grouped),
                  conv2d_space, conv2d_default, conv2d_build)
POINTWISE = Template("pointwise", problems.conv2d, lambda p: p.float32 and p.pointwise,
                     pointwise_space, pointwise_default, pointwise_build)
