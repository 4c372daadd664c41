"""The cuda int8 templates: QuantizedDense (cuda_int8_dense) and the one-group
QuantizedConvPacked (cuda_int8_conv2d, an implicit GEMM of the NCHW image) on the integer
tensor cores, `mma.sync.m16n8k32.row.col.s32.{s8,u8}.s8.s32` (`L.INTEGER_MMA`), with the
requantization fused where a tile stores.

The product is mma.py's (`mma_product`: blocks and warps, the cp.async ring of shared k tiles
with its XOR swizzle, ldmatrix fragments) at the integer precision of the activations' type,
"s8" or "u8": bytes four to a 32-bit word, tiles along k as tf32's are (an m16n8k32 A or B
fragment is, word for word, a tf32 m16n8k8 one), int32 accumulators. Rows i are A's (a dense
product's rows, a conv's output pixels of every image), columns j the weights' (output
channels). A dense A whose rows are whole 16-byte chunks (k a multiple of 16) and dense
weights in rows (`ir/ops/quantized.pack_rows`, convert_layout's "int8_dense_rows" for cuda)
are copied by cp.async; other operands go through registers a 32-bit word at a time
(`Operand.word`): weights in groups (`pack_groups`: 4 bytes of k a column, one load, read
through a uint32 view of the constant), a conv's patches (4 input channels at a tap,
`pack_conv_groups`' order: one position and bounds check, 4 byte loads; a pixel outside the
image reads as the activation's zero point, so that padding adds nothing after the
compensation), a dense A of another k (4 byte loads).

Zero points: the products sum A W exactly (u8 x s8 or s8 x s8: no + 128 shift, unlike the
CPU's vpdpbusd), and each result takes - za w_sums[j] (the weights' column sums, made at
compile time) before `finish_expr` (bias, the float32 scale, round half to even, the zero
point, saturation and a fused Relu / Clip), bit for bit the reference's and llvm's int8
templates'; then the group's fused consumers (`Epilogue`). Weights with a zero point
(QuantizedDense's `w_zp`) are not served here (the generic loops run them).

Knobs: mma.py's TensorCoreConfig tiles (block_m, block_n, block_k in bytes, warps, stages),
k unsplit; on sm_90 the `wgmma` knob (wgmma.py's m64nNk32 s8 / u8 form on the same shared
tiles, k tiles of 128 bytes, int32 accumulators), which the dense and channels-last conv
defaults take (`mma.wgmma_by_default`: s8 / u8 are among WGMMA_PRECISIONS; DNNC_WGMMA=0
keeps mma.sync), staging 8-bit results (`mma.staged_by_default`). This module builds loop
IR; it must never render C or launch.

Products of fewer than 16 rows (a GEMV: batch-1 classifier heads) take dp4a instead
(cuda_int8_gemv: `L.dot_u8s8x4`, which the cuda renderer emits as `dp4a.u32.s32`), a warp a
16-column panel of the weights.

A conv compiled for cuda runs channels-last where `convert_layout`'s "nhwc_conv" makes it a
QuantizedConvNHWC (int8_nhwc.py: patches by cp.async); this NCHW kernel serves the rest
(channels not static).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.quantized import GROUP_COLUMNS, GROUP_DEPTH, finish_expr
from ...ir.target import GPU
from ..quantized_problems import (QuantizedConvProblem, QuantizedDenseProblem, channel_param,
                                  quantized_conv, quantized_dense, scale_param)
from ..space import Constraint, Space, Template
from .dense import Operand, min_blocks
from .device import gpu_of, has_wgmma
from .mma import (DEFAULTS, EFFICIENCY, MAX_ACCUMULATORS, MAX_SHARED_BYTES,
                  MAX_WGMMA_SHARED_BYTES, MMA_UNDER_WGMMA, SHALLOW_K, SHALLOW_STAGED_OUTPUTS,
                  SHALLOW_STAGED_TILE, WARP, WGMMA_DEFAULTS, WGMMA_EFFICIENCY,
                  TensorCoreConfig, mma_product, resident, shared_bytes, staged_by_default,
                  wgmma_by_default)

BLOCK_K = (32, 64, 128)
"""k tiles in bytes: one, two or four m16n8k32 steps."""
DEFAULT_BLOCK_K, DEFAULT_STAGES = 64, 3
WGMMA_BLOCK_K = 128
"""The k tile (bytes) of the `wgmma` knob: one 128-byte swizzle row (wgmma.block_k)."""
"""A default's k tile (bytes, the 128-byte lines of fp16's 32-deep tile halved: two mma
steps a tile) and its stages (as mma.py's)."""


def precision(p) -> str:
    """The integer mma of problem `p`: A's type."""
    return "s8" if p.signed else "u8"


def space(name: str, p, arch: str | None = None) -> Space:
    """The tiles of an int8 product: mma.py's knobs, k unsplit; the `wgmma` knob (wgmma.py's
    s8 / u8 form) where `arch` has it (sm_90)."""
    from . import wgmma   # (it builds on mma.py's tiles)

    kind = precision(p)
    warpgroups = arch is not None and has_wgmma(arch)
    return Space(name, TensorCoreConfig, {
        "block_m": (16, 32, 64, 128, 256), "block_n": (32, 64, 128, 256),
        "block_k": BLOCK_K, "warps_m": (1, 2, 4, 8), "warps_n": (1, 2, 4),
        "stages": (2, 3, 4, 5), "split_k": (1,), "wgmma": (False, True)[:1 + warpgroups],
        "early_refill": (False, True)[:1 + warpgroups],
        "refill_first": (False, True)[:1 + warpgroups], "staged": (False, True),
    }, [Constraint("a warp's rows (block_m / warps_m) and columns (block_n / warps_n) "
                   "multiples of 16",
                   lambda c: c.block_m % (16 * c.warps_m) == 0 and
                   c.block_n % (16 * c.warps_n) == 0),
        Constraint(f"at most {MAX_ACCUMULATORS} accumulators a lane",
                   lambda c: c.wgmma or c.block_m * c.block_n // (
                       c.warps_m * c.warps_n * WARP) <= MAX_ACCUMULATORS),
        Constraint("with wgmma: k tiles of 128 bytes, warps_m a multiple of 4, a "
                   "warpgroup's columns 64, 128, 192 or 256 and rows whole m64 tiles, at most 128 "
                   "accumulators a thread, at least 3 stages (2 with early_refill)",
                   lambda c: not c.wgmma or wgmma.fits(c, kind)),
        Constraint("early_refill only with wgmma", lambda c: c.wgmma or not c.early_refill),
        Constraint("refill_first only with wgmma, not with early_refill",
                   lambda c: not c.refill_first or c.wgmma and not c.early_refill),
        Constraint(f"the stages' shared tiles within {MAX_SHARED_BYTES >> 10} KiB "
                   f"({MAX_WGMMA_SHARED_BYTES >> 10} KiB with wgmma)",
                   lambda c: shared_bytes(c, kind) <= (
                       MAX_WGMMA_SHARED_BYTES if c.wgmma else MAX_SHARED_BYTES))])


def choose(m: int, n: int, k: int, gpu: GPU, with_wgmma: bool = False) -> TensorCoreConfig:
    """The default tile of an m x n x k int8 product on `gpu`: of mma.py's DEFAULTS tiles
    (k tiles of DEFAULT_BLOCK_K bytes), the one its rough model (mma.choose's without
    splits: guessed efficiency, slowed where blocks cannot fill the GPU or leave a last wave
    part empty) says is fastest. resnet50 at batch 32 (100352 x 64 x 576 ... 1568 x 2048 x
    512) and BERT at batch 8 (1024 x 768 x 3072) take 64 x 64 to 128 x 256 tiles of 4 or 8
    warps; a product of a few dozen rows 16 x 32. `with_wgmma` (`mma.wgmma_by_default` of
    the arch and precision: on sm_90 unless DNNC_WGMMA=0) adds mma.py's
    WGMMA_DEFAULTS tiles and RESIDENT_TILE, k tiles of 128 bytes, and scales the others'
    guesses as mma.py does; a shallow product of many outputs takes SHALLOW_TILE there."""
    if with_wgmma and k <= SHALLOW_K and n >= SHALLOW_TILE.block_n and \
            m * n >= SHALLOW_OUTPUTS:
        return SHALLOW_TILE
    best, best_time = None, float("inf")
    for config, efficiency in _candidates(with_wgmma):
        if shared_bytes(config, "s8") > (MAX_WGMMA_SHARED_BYTES if config.wgmma else
                                         MAX_SHARED_BYTES):
            continue
        bm, bn = config.block_m, config.block_n
        if config.wgmma and 2 * m * n < -(-m // bm) * -(-n // bn) * bm * bn:
            continue   # mostly past the edges: a warpgroup's 64 rows for a few
        blocks = -(-m // bm) * -(-n // bn)
        # a wgmma block fills its SM's shared memory: one a SM is full; the blocks of
        # RESIDENT_TILE fill it together
        full = gpu.sms * (resident(config, "s8") if config == RESIDENT_TILE else 1) \
            if config.wgmma else min_blocks(gpu)
        fill = min(1.0, blocks / full)
        wave = gpu.sms * resident(config, "s8")
        waves = -(-blocks // wave) * wave / blocks if blocks > wave else 1.0
        seconds = 2 * blocks * bm * bn * k * waves / (gpu.tensor_flops * efficiency * fill)
        if seconds < best_time:
            best, best_time = config, seconds
    return best


SHALLOW_TILE = replace(SHALLOW_STAGED_TILE, block_k=WGMMA_BLOCK_K)
SHALLOW_OUTPUTS = SHALLOW_STAGED_OUTPUTS
"""Products of k at most SHALLOW_K (one or two k tiles), at least SHALLOW_TILE's columns and
SHALLOW_OUTPUTS results take mma.py's shallow staged tile (128 x 128 wgmma, 3 slots: two
blocks an SM) where wgmma is on offer: they are bound by their epilogue (requantizing and
storing every result after one or two k tiles), which a block of the 128 x 256 tile the
model chose ran alone on its SM (its shared ring, 4 slots of 48 KiB, and its 128
accumulators a thread: one block an SM). On an H200 (bench/gpu_int8.py, session 44) the
QDQ resnet50 at batch 32 took 1.79 ms with it against 2.17 without (its deep-tiles row),
its residual 1x1 convs of 64 input channels 0.10-0.12 ms (main's tile and epilogue before:
0.19-0.22; fp16: 0.051)."""


RESIDENT_TILE = TensorCoreConfig(64, 128, WGMMA_BLOCK_K, 4, 1, 3, wgmma=True)
RESIDENT_EFFICIENCY = 0.75
"""A wgmma tile of a shallow ring (3 slots of 24 KiB: three blocks an SM) that `choose`
tries beside WGMMA_DEFAULTS, rated full only when its SMs hold three blocks each (the others
hide a block's loads and epilogue behind its own deep ring, this one behind its SM's other
blocks). Fitted on an H200 (bench/gpu_int8_tiles.py, session 58: BERT-base b8's products,
each kernel alone): 1024 x 768 -> 3072 (k of six 128-byte tiles, Gelu in the epilogue)
took 12.9 us on it against 16.4 on the 128 x 256 tile the model chose before (96 blocks,
one an SM; 28.8 against 12.9 traced in the model) and 17.0 / 20.9 in 4 / 5 slots (two /
one an SM); where its blocks are fewer than the SMs' room it is slow (3072 -> 768: 96
blocks, 14.9 us against 10.0 in 4 slots and 11.3 on the 64 x 64 tile the model keeps).
BERT's product takes it from 0.72 up (resnet50's 25088 x 128 convs from 0.65, two more of
its convs from 0.8, untimed); at 0.75, between, eight of resnet50 b32's convs take it
(25088 x 128 x 1152 and x 512, 6272 x 512 x 1024): traced in the model they took 102.5 us
on it against 110.1 before (the model's kernels 1.034 ms against 1.044), though alone the
25088 x 128 x 512 one took 11.4 us against 8.8 on the 64 x 64 tile."""


def _candidates(with_wgmma: bool):
    """(config, guessed efficiency) of the tiles `choose` tries."""
    scale = MMA_UNDER_WGMMA if with_wgmma else 1.0
    for (bm, bn, wm, wn), efficiency in zip(DEFAULTS, EFFICIENCY):
        yield TensorCoreConfig(bm, bn, DEFAULT_BLOCK_K, wm, wn, DEFAULT_STAGES), \
            efficiency * scale
    if with_wgmma:
        for (bm, bn, wm, wn, stages, _), efficiency in zip(WGMMA_DEFAULTS, WGMMA_EFFICIENCY):
            if bn != 192:   # (not in this space: timed at fp16, bf16 and tf32 only)
                yield TensorCoreConfig(bm, bn, WGMMA_BLOCK_K, wm, wn, stages, wgmma=True), \
                    efficiency
        yield RESIDENT_TILE, RESIDENT_EFFICIENCY


def _finished(p, acc: L.Expr, j, shift: int = 0) -> L.Expr:
    """The int32 sum (A + shift) W of channel j with the zero point's share taken off (-
    (za + shift) w_sums[j]), through the op's `finish_expr`."""
    za = L.Cast(T.int32, channel_param(p.za, 0)) + L.const(shift, T.int32)
    return finish_expr(acc - za * p.sums[j], channel_param(p.bias, j), scale_param(p, j),
                       channel_param(p.y_zp, j), p.out, p.lo, p.hi)


def _as(value: L.Expr, dtype: T.DType) -> L.Expr:
    return value if value.dtype is dtype else L.Cast(dtype, value)


def _weights(w: L.Buffer) -> tuple[Operand, L.Buffer]:
    """The packed weights as B (row j: column / output channel j; k: bytes), staged a 32-bit
    word (4 k of a column) a load, consecutive threads on consecutive columns (16 of them
    one 64-byte run), and the uint32 view of them the kernel takes."""
    words = L.Buffer(w.name, T.uint32, tuple(w.shape[:3]))
    return Operand(lambda bi, j, kk: w[j // GROUP_COLUMNS, kk // GROUP_DEPTH,
                                       j % GROUP_COLUMNS, kk % GROUP_DEPTH], True,
                   word=lambda bi, j, kw: words[j // GROUP_COLUMNS, kw, j % GROUP_COLUMNS]), \
        words


def _row_weights(p: QuantizedDenseProblem) -> tuple[Operand, L.Buffer]:
    """Weights in rows (`pack_rows`: [n, k padded to 16 bytes], K-major as the tiles) as B,
    copied by cp.async, read as A's type (mma's B is s8 either way), and that view."""
    w = L.Buffer(p.w.name, T.int8 if p.signed else T.uint8, tuple(p.w.shape))
    return Operand(lambda bi, j, kk: w[j, kk], False, array=True,
                   word=lambda bi, j, kw: _word([w[j, kw * GROUP_DEPTH + e]
                                                 for e in range(GROUP_DEPTH)])), w


def _word(byte_values: list) -> L.Expr:
    """Four 8-bit values as the bytes of a uint32, the first lowest."""
    word = None
    for e, x in enumerate(byte_values):
        byte = L.Cast(T.uint32, x if x.dtype is T.uint8 else L.Cast(T.uint8, x))
        byte = byte if e == 0 else L.BinOp("<<", byte, L.const(8 * e, T.uint32))
        word = byte if word is None else L.BinOp("|", word, byte)
    return word


# -- QuantizedDense -------------------------------------------------------------------------------

def _output(p: QuantizedDenseProblem) -> tuple[L.Buffer, object]:
    """(Y as the kernel stores it, `put(i, j)`: where element (i, j) goes): Y as [m, n], or
    through the layout tail the group ends with (attention's Q, K and V projections written
    heads-first), Y's own shape at the remapped index."""
    if p.store_index is None:
        return L.Buffer(p.y.name, p.y.dtype, (p.m, p.n)), lambda i, j: (i, j)
    return p.y, lambda i, j: tuple(p.store_index(p.anchor_index(i, j)))


def dense_applies(p: QuantizedDenseProblem) -> bool:
    return p.w_zp is None and p.m >= GEMV_ROWS


def dense_space(p: QuantizedDenseProblem, machine) -> Space:
    return space("cuda_int8_dense", p, getattr(machine, "arch", None))


def dense_default(p: QuantizedDenseProblem, machine) -> TensorCoreConfig:
    """`choose`'s tile, staged where `mma.staged_by_default` says, float32 results (a
    dynamically quantized model's) as 8-bit ones: on an H200 BERT-base b8 took 1.57 ms so
    against 1.68 unstaged (fp16 1.31; bench/gpu_int8.py's staged-f32 row, session 44)."""
    stored = T.int8 if p.y.dtype is T.float32 else p.y.dtype
    return staged_by_default(choose(p.m, p.n, p.k, gpu_of(machine), wgmma_by_default(
        getattr(machine, "arch", None), precision(p))), stored, precision(p))


def dense_build(p: QuantizedDenseProblem, c: TensorCoreConfig, machine) -> L.PrimFunc:
    """Y[i, j] (A's batch dims folded into rows) on the integer tensor cores."""
    a = L.Buffer(p.a.name, p.a.dtype, (p.m, p.k))
    y, put = _output(p)

    def store(bi, i, j, acc):
        value = p.epilogue(_finished(p, acc, j), p.anchor_index(i, j))
        return L.Store(y, put(i, j), _as(value, y.dtype))

    def row_word(bi, i, kw):
        """4 k of row i (those past k: any value, their weights are 0)."""
        return _word([a[i, L.minimum(kw * GROUP_DEPTH + e, p.k - 1)]
                      for e in range(GROUP_DEPTH)])

    rows = Operand(lambda bi, i, kk: a[i, kk], False, array=True, word=row_word)
    weights, view = _row_weights(p) if p.rows else _weights(p.w)
    body = mma_product(c, 1, p.m, p.n, p.k, rows, weights, store, precision=precision(p))
    views = {a.name: a, y.name: y, view.name: view}
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


# -- QuantizedDense of few rows: dp4a ------------------------------------------------------------

GEMV_ROWS = 16
"""Products of fewer rows than an mma tile's 16 take dp4a (`cuda_int8_gemv`)."""


@dataclass(frozen=True)
class GemvConfig:
    """Knobs of cuda_int8_gemv: warps a block (each one 16-column panel of the weights)."""

    warps: int = 4


def gemv_applies(p: QuantizedDenseProblem) -> bool:
    return p.w_zp is None and p.m < GEMV_ROWS and not p.rows


def gemv_space(p: QuantizedDenseProblem, machine) -> Space:
    return Space("cuda_int8_gemv", GemvConfig, {"warps": (1, 2, 4, 8)})


def gemv_default(p: QuantizedDenseProblem, machine) -> GemvConfig:
    return GemvConfig()


def gemv_build(p: QuantizedDenseProblem, c: GemvConfig, machine) -> L.PrimFunc:
    """Y[i, j] for m < 16 rows: a warp a panel of 16 columns, lane l on column l % 16 and
    every other word of k from l // 16 (a warp's load: 2 words x 16 columns, 128 contiguous
    bytes of the packing), each row's sum in a register by `dot_u8s8x4` (dp4a: int8 A read
    as A + 128), the two halves added by one shuffle, stored by lanes 0-15."""
    a = L.Buffer(p.a.name, p.a.dtype, (p.m, p.k))
    y, put = _output(p)
    panels, words = -(-p.n // GROUP_COLUMNS), -(-p.k // GROUP_DEPTH)
    w = L.Buffer(p.w.name, T.uint32, (panels, words, GROUP_COLUMNS))
    shift = 128 if p.signed else 0
    b, t, s, r = L.Var("b"), L.Var("t"), L.Var("s"), L.Var("r")
    lane, panel, kw, wv = L.Var("lane"), L.Var("panel"), L.Var("kw"), L.Var("wv", T.uint32)
    acc = L.Buffer("acc", T.int32, (p.m,), L.Scope.LOCAL)
    col = panel * GROUP_COLUMNS + lane % GROUP_COLUMNS

    def row_word(i):
        word = _word([a[i, L.minimum(kw * GROUP_DEPTH + e, p.k - 1)]
                      for e in range(GROUP_DEPTH)])
        return L.BinOp("^", word, L.const(0x80808080, T.uint32)) if shift else word

    def each_row(body) -> L.Stmt:
        return L.For(r, p.m, body, L.ForKind.UNROLLED)

    dot = L.call("dot_u8s8x4", acc[r], row_word(r), wv, dtype=T.int32)
    step = L.Let(kw, s * 2 + lane // GROUP_COLUMNS, L.If(kw < words, L.Let(
        wv, w[L.minimum(panel, panels - 1), kw, lane % GROUP_COLUMNS],
        each_row(L.Store(acc, (r,), dot)))))
    value = p.epilogue(_finished(p, acc[r], col, shift), p.anchor_index(r, col))
    body = L.seq(
        each_row(L.Store(acc, (r,), L.const(0, T.int32))),
        L.For(s, -(-words // 2), step),
        each_row(L.Store(acc, (r,), acc[r] + L.call("shfl_xor", acc[r], L.const(16, T.int32),
                                                    dtype=T.int32))),
        L.If(L.logical_and(lane < GROUP_COLUMNS, col < p.n),
             each_row(L.Store(y, put(r, col), _as(value, y.dtype)))))
    threads = WARP * c.warps
    body = L.For(t, threads, L.Let(lane, t % WARP, L.Let(
        panel, b * c.warps + t // WARP, body)), L.ForKind.THREAD_X)
    body = L.For(b, -(-panels // c.warps), L.Allocate(acc, body), L.ForKind.BLOCK_X)
    views = {a.name: a, y.name: y, w.name: w}
    return L.PrimFunc(p.name, tuple(views.get(x.name, x) for x in p.params), body)


# -- QuantizedConvPacked --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Geometry:
    """An implicit GEMM's sizes: M output pixels of every image, N output channels, K the
    packed depth (ceil(C / 4) groups of 4 channels at each tap, 4 bytes a group)."""

    m: int
    n: int
    k: int
    taps: int


def _geometry(p: QuantizedConvProblem) -> _Geometry:
    images, c = p.x_dims[:2]
    _, oc, oh, ow = p.y_dims
    taps = p.kernel[0] * p.kernel[1]
    return _Geometry(images * oh * ow, oc, -(-c // GROUP_DEPTH) * taps * GROUP_DEPTH, taps)


def conv_applies(p: QuantizedConvProblem) -> bool:
    return p.group == 1 and len(p.kernel) == 2


def conv_space(p: QuantizedConvProblem, machine) -> Space:
    return space("cuda_int8_conv2d", p, getattr(machine, "arch", None))


def conv_default(p: QuantizedConvProblem, machine) -> TensorCoreConfig:
    g = _geometry(p)
    return choose(g.m, g.n, g.k, gpu_of(machine))


def conv_build(p: QuantizedConvProblem, c: TensorCoreConfig, machine) -> L.PrimFunc:
    """Y[img, j, oy, ox] as an implicit GEMM: row i the pixel (img, oy, ox), byte kk of the
    packed depth channel (kk // 4 // taps) 4 + kk % 4 at tap kk // 4 % taps."""
    g = _geometry(p)
    _, channels, h, wid = p.x_dims
    _, _, oh, ow = p.y_dims
    kwid = p.kernel[1]
    (sh, sw), (dh, dw), (ph, pw) = p.strides, p.dilations, p.begins
    x = p.x
    y = L.Buffer(p.y.name, p.y.dtype, (p.y_dims[0], g.n, oh * ow))
    za = channel_param(p.za, 0)

    def place(i, kw):
        """(image, first channel, row, column, whether inside the image) of word kw of
        pixel i's patch."""
        img, pix, tap = i // (oh * ow), i % (oh * ow), kw % g.taps
        iy = pix // ow * sh - ph + tap // kwid * dh
        ix = pix % ow * sw - pw + tap % kwid * dw
        inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < wid)
        return img, kw // g.taps * GROUP_DEPTH, L.minimum(L.maximum(iy, 0), h - 1), \
            L.minimum(L.maximum(ix, 0), wid - 1), inside

    def patch(bi, i, kk):
        img, first, iy, ix, inside = place(i, kk // GROUP_DEPTH)
        ch = first + kk % GROUP_DEPTH
        value = x[img, L.minimum(ch, channels - 1), iy, ix]
        return L.Select(L.logical_and(ch < channels, inside), value, za)

    def patch_word(bi, i, kw):
        """4 channels at a tap (those past C: any value, their weights are 0)."""
        img, first, iy, ix, inside = place(i, kw)
        word = _word([x[img, L.minimum(first + e, channels - 1), iy, ix]
                      for e in range(GROUP_DEPTH)])
        return L.Select(inside, word, _word([za] * GROUP_DEPTH))

    def store(bi, i, j, acc):
        img, pix = i // (oh * ow), i % (oh * ow)
        value = p.epilogue(_finished(p, acc, j), (img, j, pix // ow, pix % ow))
        return L.Store(y, (img, j, pix), _as(value, y.dtype))

    weights, words = _weights(p.w)
    body = mma_product(c, 1, g.m, g.n, g.k, Operand(patch, True, word=patch_word), weights,
                       store, precision=precision(p))
    views = {y.name: y, words.name: words}
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


INT8_DENSE = Template("cuda_int8_dense", quantized_dense, dense_applies, dense_space,
                      dense_default, dense_build)
INT8_GEMV = Template("cuda_int8_gemv", quantized_dense, gemv_applies, gemv_space, gemv_default,
                     gemv_build)
INT8_CONV2D = Template("cuda_int8_conv2d", quantized_conv, conv_applies, conv_space,
                       conv_default, conv_build)
