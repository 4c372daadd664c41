"""The cuda tensor-core templates: dense products and convolutions on `mma.sync` when the
compile's precision (`Target.precision`) is tf32, fp16 or bf16; fp32 compiles never see
them.

A block computes a `block_m` x `block_n` tile of Y (blockIdx.y: row tiles, blockIdx.x:
column tiles, blockIdx.z: the batch) with `warps_m` x `warps_n` warps; warp (wy, wx) owns a
(block_m / warps_m) x (block_n / warps_n) part of it, a grid of 16 x 8 mma tiles, each with
4 fp32 accumulators a lane (`L.Mma`'s C fragment). k goes in slices of `block_k` through
shared memory as in dense.py (`_Staged`: fp32, k-major, double buffered, one barrier a
slice, 0 read past the operands' edges or k, so any m, n and k is computed exactly as the
precision allows), each k row of a tile padded by PAD words. Per mma step of k (8 for tf32,
16 for fp16 and bf16) each warp copies its A fragments (one per 16 rows) and B fragments
(one per 8 columns) from shared memory into operand registers (`FRAGMENTS`: PTX's layouts),
and runs one mma per (row tile, column tile). The operands are rounded to the precision once
(`L.PACKS`: the renderer's `cvt`): tf32 ones as they go into shared memory (the tile then
holds their tf32 bits as float32), fp16 and bf16 ones as a fragment register packs two of
them (once a step, not once an mma; shared memory holds fp32). The epilogue stores each
accumulator through the problem's store (Gemm's scaling and bias, the fused epilogue, the
layout tail; a conv's bias), guarded at the edges. `split_k` > 1 splits k over blockIdx.z as
dense.py does (partial sums in a workspace, a second launch adds them).

Which kernels: every dense / batched matmul of at least 16 rows and ungrouped conv2d (an
implicit GEMM, patches gathered as conv.py does) that the fp32 templates would tile; the
matrix-vector products (fewer than 16 rows) keep the gemv template (an mma would idle most
of a 16-row tile), depthwise convolutions the default one.

Not yet: ldmatrix, cp.async, fp16 / bf16 operands packed once into 16-bit shared tiles (each
warp packs the fragments it reads), vector stores.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ...ir.target import GPU
from .. import problems
from ..space import Constraint, Space, Template
from . import conv as conv_template
from . import dense as dense_template
from .dense import MAX_GRID_YZ, MAX_SHARED_BYTES, MIN_SPLIT_K, SPLITS, Operand, min_blocks
from .device import REFERENCE, gpu_of

PRECISIONS = ("tf32", "fp16", "bf16")
"""The precisions these templates serve (`Template.precisions`)."""

WARP = 32
PAD = 8
"""Words after each k row of a shared tile: a tf32 fragment read (lanes 4 g + t reading k row
t, element g) then hits 32 distinct banks (8 t + g), an fp16 one two lanes a bank."""

MAX_ACCUMULATORS = 128
"""fp32 accumulators a lane at most (a 64 x 64 warp tile): beyond, registers spill."""

# (block_m, block_n, block_k, warps_m, warps_n) a default tries, largest first, and the
# fraction of the tensor cores' peak each is guessed to reach (a rough ranking, not measured
# yet: bench/gpu_kernels.py --precision measures it)
# (the two largest take k 16 at a time: 32 would pass 48 KiB of shared memory)
DEFAULTS = ((128, 128, 16, 2, 4), (64, 128, 16, 2, 2), (64, 64, 32, 2, 2), (32, 64, 32, 1, 2),
            (32, 32, 32, 1, 2), (16, 32, 32, 1, 2))
EFFICIENCY = (0.5, 0.4, 0.3, 0.2, 0.12, 0.08)
# the model's throughput is the device's tf32 tensor-core figure (`GPU.tensor_flops`, for
# every precision), a split costs as in dense.py
LAUNCH_S = 2e-6


@dataclass(frozen=True)
class TensorCoreConfig:
    """Knobs of the tensor-core templates."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 16
    warps_m: int = 2
    warps_n: int = 4
    split_k: int = 1     # k slices summed by a second launch (fills the GPU when m n is small)

    @property
    def threads(self) -> int:
        return WARP * self.warps_m * self.warps_n


def product_space(name: str, k: int, batch: int) -> Space:
    """The knobs of a tensor-core product of depth `k`, `batch` of them (dense and conv)."""
    return Space(name, TensorCoreConfig, {
        "block_m": (16, 32, 64, 128, 256), "block_n": (32, 64, 128, 256),
        "block_k": (16, 32, 64), "warps_m": (1, 2, 4), "warps_n": (1, 2, 4), "split_k": SPLITS,
    }, [Constraint("a warp's rows (block_m / warps_m) a multiple of 16, its columns "
                   "(block_n / warps_n) of 8",
                   lambda c: c.block_m % (16 * c.warps_m) == 0 and
                   c.block_n % (8 * c.warps_n) == 0),
        Constraint(f"at most {MAX_ACCUMULATORS} accumulators a lane",
                   lambda c: _accumulators(c) <= MAX_ACCUMULATORS),
        Constraint("two padded shared buffers of each tile within 48 KiB",
                   lambda c: _shared_bytes(c) <= MAX_SHARED_BYTES),
        Constraint("split_k at most the k tiles, batch * split_k blocks on grid z",
                   lambda c: c.split_k <= -(-k // c.block_k) and
                   batch * c.split_k <= MAX_GRID_YZ)])


def _accumulators(c: TensorCoreConfig) -> int:
    return (c.block_m // c.warps_m) * (c.block_n // c.warps_n) // WARP


def _shared_bytes(c: TensorCoreConfig) -> int:
    return 2 * 4 * c.block_k * (c.block_m + c.block_n + 2 * PAD)


def choose(m: int, n: int, k: int, batch: int = 1, gpu: GPU = REFERENCE
           ) -> TensorCoreConfig:
    """The default config of an m x n x k product (`batch` of them) on `gpu`, as
    dense.choose: of the DEFAULTS tiles, each with k unsplit or split into slices at least
    MIN_SPLIT_K deep, the one a rough model says is fastest (its guessed EFFICIENCY, slowed
    where its blocks cannot fill the GPU, plus a split's cost)."""
    best, best_time = None, math.inf
    for dims, efficiency in zip(DEFAULTS, EFFICIENCY):
        for split in SPLITS:
            if split > 1 and (k < split * MIN_SPLIT_K or batch * split > MAX_GRID_YZ):
                break
            config = TensorCoreConfig(*dims, split_k=split)
            blocks = -(-m // config.block_m) * -(-n // config.block_n) * batch
            fill = min(1.0, blocks * split / min_blocks(gpu))
            seconds = 2 * m * n * k * batch / (gpu.tensor_flops * efficiency * fill)
            if split > 1:
                seconds += 8 * m * n * batch * split / gpu.copy_bytes_per_s + LAUNCH_S
            if seconds < best_time:
                best, best_time = config, seconds
    return best


# -- PTX's fragment layouts -----------------------------------------------------------------

def _a_tf32(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return g + 8 * (e % 2), t + 4 * (e // 2)


def _b_tf32(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return t + 4 * e, g


def _a_16bit(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return g + 8 * (e // 2 % 2), 2 * t + (e % 2 + 8 * (e // 4))


def _b_16bit(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return 2 * t + (e % 2 + 8 * (e // 2)), g


def _c(r: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return g + 8 * (r // 2), 2 * t + r % 2


FRAGMENTS = {"tf32": (_a_tf32, _b_tf32), "fp16": (_a_16bit, _b_16bit),
             "bf16": (_a_16bit, _b_16bit)}
"""Precision -> (A's element e of a lane -> (row, k), B's element e -> (k, column)) within
one mma tile, for the lane's g = lane // 4 and t = lane % 4 (PTX ISA, "Matrix Fragments for
mma.m16n8k8" (.tf32) and "mma.m16n8k16" (.f16 / .bf16)); `_c` is the accumulators' (row,
column), the same for all three."""


# -- the product ------------------------------------------------------------------------------

def mma_product(c: TensorCoreConfig, batch: int, m: int, n: int, k: int, a: Operand,
                b: Operand, store, *, precision: str) -> L.Stmt:
    """The blocks, warps and loops of Y[bi, i, j] = sum_k A[bi, i, k] B[bi, k, j] on tensor
    cores at `precision` (see the module's docstring); the arguments as dense.tiled_product's."""
    w = _WarpTiles(c, batch, m, n, k, a, b, precision)
    bi, by, bx = w.bi, w.by, w.bx
    grid = (-(-m // w.bm), -(-n // w.bn))
    if c.split_k == 1:
        done = w.each_result(lambda i, j, value: store(bi, i, j, value))
        body = w.block(L.seq(w.init(), w.product(L.const(0)), done))
        return L.For(bi, batch, L.For(by, grid[0], L.For(
            bx, grid[1], body, L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y), L.ForKind.BLOCK_Z)
    sk = L.Var("sk")

    def slice_block(bz: L.Var, partial: L.Buffer) -> L.Stmt:
        keep = w.each_result(lambda i, j, value: L.Store(
            partial, (((sk * batch + bi) * m + i) * n + j,), value))
        body = w.block(L.seq(w.init(), w.product(sk * w.per), keep))
        return L.Let(bi, bz // c.split_k, L.Let(sk, bz % c.split_k, body))

    return dense_template._split_k(c, batch, m, n, grid, store, slice_block, (by, bx))


class _WarpTiles:
    """One block of a tensor-core product: its operands' tiles in shared memory (`a_in`,
    `b_in`), each warp's fragments and accumulators in registers, and the statements
    `mma_product` assembles from them (zeroing, the k loop, the results)."""

    def __init__(self, c: TensorCoreConfig, batch: int, m: int, n: int, k: int, a: Operand,
                 b: Operand, precision: str):
        self.c, self.m, self.n, self.precision = c, m, n, precision
        self.mm, self.mn, self.mk = L.MMA_SHAPES[precision]
        self.bm, self.bn, self.bk = bm, bn, bk = c.block_m, c.block_n, c.block_k
        self.wm, self.wn = bm // c.warps_m, bn // c.warps_n
        # mma tiles of a warp, down and across
        self.tm, self.tn = tm, tn = self.wm // self.mm, self.wn // self.mn
        tiles = -(-k // bk)
        self.per = -(-tiles // c.split_k)           # k tiles per slice
        past_k = k % bk != 0 or tiles % c.split_k != 0
        self.bi, self.by, self.bx = bi, by, bx = L.Var("bi"), L.Var("by"), L.Var("bx")
        self.row0, self.col0 = by * bm, bx * bn
        self.a_in = dense_template._Staged("a", bm, self.row0, m, a, bk, k, c.threads,
                                           past_k or m % bm != 0, bi, PAD)
        self.b_in = dense_template._Staged("b", bn, self.col0, n, b, bk, k, c.threads,
                                           past_k or n % bn != 0, bi, PAD)
        ra, rb = L.MMA_REGISTERS
        self.acc = L.Buffer("acc", T.float32, (tm * tn * 4,), L.Scope.LOCAL)
        self.a_frag = L.Buffer("a_frag", T.uint32, (tm * ra,), L.Scope.LOCAL)
        self.b_frag = L.Buffer("b_frag", T.uint32, (tn * rb,), L.Scope.LOCAL)
        self.t, self.wy, self.wx, self.g, self.q = (L.Var(x) for x in ("t", "wy", "wx", "g",
                                                                       "q"))
        self.mi, self.ni = L.Var("mi"), L.Var("ni")

    def per_thread(self, body: L.Stmt) -> L.Stmt:
        """`body` on every thread: its warp's place (wy, wx) and its lane's g and q (PTX's
        groupID and threadID_in_group)."""
        c, t = self.c, self.t
        used = L.free_vars(body)
        for var, value in reversed(((self.wy, t // WARP // c.warps_n),
                                    (self.wx, t // WARP % c.warps_n),
                                    (self.g, t % WARP // 4), (self.q, t % 4))):
            if var in used:
                body = L.Let(var, value, body)
        return L.For(t, c.threads, body, L.ForKind.THREAD_X)

    def init(self) -> L.Stmt:
        """Every accumulator zeroed."""
        r = L.Var("r")
        return self.per_thread(L.For(r, self.tm * self.tn * 4, L.Store(
            self.acc, (r,), L.const(0.0, T.float32)), L.ForKind.UNROLLED))

    def update(self, buf: L.Expr) -> L.Stmt:
        """The slice in shared buffer `buf`, an mma step of k at a time: the warp's A and B
        fragments into registers, then an mma per (row tile, column tile)."""
        ra, rb = L.MMA_REGISTERS
        mi, ni, tm, tn = self.mi, self.ni, self.tm, self.tn
        ks, ai, bj = L.Var("ks"), L.Var("ai"), L.Var("bj")
        first = buf * self.bk + ks * self.mk    # the step's first k row in the tile
        a_place, b_place = FRAGMENTS[self.precision]

        def a_element(e: int) -> L.Expr:
            row, kk = a_place(e, self.g, self.q)
            return self.a_in.tile[(first + kk) * self.a_in.stride + self.wy * self.wm +
                                  ai * self.mm + row]

        def b_element(e: int) -> L.Expr:
            kk, col = b_place(e, self.g, self.q)
            return self.b_in.tile[(first + kk) * self.b_in.stride + self.wx * self.wn +
                                  bj * self.mn + col]

        mma = L.Mma(self.precision, self.acc, (mi * tn + ni) * 4,
                    tuple(self.a_frag[mi * ra + r] for r in range(ra)),
                    tuple(self.b_frag[ni * rb + r] for r in range(rb)))
        # each fragment rounded and packed once a step, then read by every mma using it
        a_loads = [L.Store(self.a_frag, (ai * ra + r,), self._register(a_element, r))
                   for r in range(ra)]
        b_loads = [L.Store(self.b_frag, (bj * rb + r,), self._register(b_element, r))
                   for r in range(rb)]
        step = L.seq(
            L.For(ai, tm, L.seq(*a_loads), L.ForKind.UNROLLED),
            L.For(bj, tn, L.seq(*b_loads), L.ForKind.UNROLLED),
            L.For(mi, tm, L.For(ni, tn, mma, L.ForKind.UNROLLED), L.ForKind.UNROLLED))
        return self.per_thread(L.For(ks, self.bk // self.mk, step, L.ForKind.UNROLLED))

    def _register(self, element, r: int) -> L.Expr:
        """Operand register r: its elements rounded and packed (L.PACKS); tf32's were
        rounded on their way into shared memory (`_staged`): their bits."""
        if self.precision == "tf32":
            return L.call("bitcast", element(r), dtype=T.uint32)
        per_register = 2   # fp16 and bf16 elements a register
        return L.call(L.PACKS[self.precision],
                      *(element(r * per_register + h) for h in range(per_register)),
                      dtype=T.uint32)

    def _staged(self, value: L.Expr) -> L.Expr:
        """A tf32 operand rounded once, as it goes into shared memory (an element is read by
        several warps: rounding it there costs fewer conversions than in each fragment):
        pack_tf32's bits as the float32 they are; fp16 and bf16 stay fp32 there (a register
        packs two elements of consecutive k, which one thread's copy does not hold)."""
        return L.call("bitcast", L.call(L.PACKS[self.precision], value, dtype=T.uint32),
                      dtype=T.float32)

    def product(self, first: L.Expr) -> L.Stmt:
        """k tiles first .. first + per - 1, double buffered as dense.tiled_product's."""
        a_in, b_in, per = self.a_in, self.b_in, self.per
        convert = self._staged if self.precision == "tf32" else None
        s = L.Var("kt")
        more = s + 1 < per
        loop = L.For(s, per, L.seq(
            a_in.load(first + s + 1, more), b_in.load(first + s + 1, more),
            self.update(s % 2),
            a_in.store((s + 1) % 2, more, convert), b_in.store((s + 1) % 2, more, convert),
            L.Barrier()))
        return L.seq(a_in.load(first, None), b_in.load(first, None),
                     a_in.store(0, None, convert), b_in.store(0, None, convert), L.Barrier(),
                     loop)

    def each_result(self, body) -> L.Stmt:
        """`body(i, j, accumulator)` for each of the thread's results, if inside Y."""
        mi, ni = self.mi, self.ni
        out = []
        for rr in range(4):
            row, col = _c(rr, self.g, self.q)
            i = self.row0 + self.wy * self.wm + mi * self.mm + row
            j = self.col0 + self.wx * self.wn + ni * self.mn + col
            out.append(L.If(L.logical_and(i < self.m, j < self.n),
                            body(i, j, self.acc[(mi * self.tn + ni) * 4 + rr])))
        return self.per_thread(L.For(mi, self.tm, L.For(ni, self.tn, L.seq(*out),
                                                        L.ForKind.UNROLLED),
                                     L.ForKind.UNROLLED))

    def block(self, body: L.Stmt) -> L.Stmt:
        """`body` with the block's shared tiles and the thread's registers allocated."""
        for buffer in (self.a_in.tile, self.b_in.tile, self.a_in.stage, self.b_in.stage,
                       self.acc, self.a_frag, self.b_frag):
            body = L.Allocate(buffer, body)
        return body


# -- the templates ----------------------------------------------------------------------------

def _product(machine) -> functools.partial:
    return functools.partial(mma_product, precision=machine.precision)


def dense_space(p: problems.Dense, machine) -> Space:
    return product_space("cuda_mma_dense", p.k, p.batch)


def dense_default(p: problems.Dense, machine) -> TensorCoreConfig:
    return choose(p.m, p.n, p.k, p.batch, gpu=gpu_of(machine))


def dense_build(p: problems.Dense, c: TensorCoreConfig, machine) -> L.PrimFunc:
    return dense_template.build(p, c, machine, product=_product(machine))


def conv_space(p: problems.Conv2d, machine) -> Space:
    return product_space("cuda_mma_conv2d", conv_template.gemm(p)[2], 1)


def conv_default(p: problems.Conv2d, machine) -> TensorCoreConfig:
    return choose(*conv_template.gemm(p), gpu=gpu_of(machine))


def conv_build(p: problems.Conv2d, c: TensorCoreConfig, machine) -> L.PrimFunc:
    return conv_template.build(p, c, machine, product=_product(machine))


MMA_DENSE = Template("cuda_mma_dense", problems.dense, dense_template.applies, dense_space,
                     dense_default, dense_build, precisions=PRECISIONS)
MMA_CONV2D = Template("cuda_mma_conv2d", problems.conv2d, conv_template.applies, conv_space,
                      conv_default, conv_build, precisions=PRECISIONS)
