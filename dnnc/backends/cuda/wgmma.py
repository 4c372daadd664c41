"""The warpgroup product of the tensor-core template on Hopper (sm_90a): the blocks of a dense
product or convolution as `mma.py` builds them, with `wgmma.mma_async` (`L.Wgmma`) in place
of warps' `mma.sync`, chosen by the template's `wgmma` knob.

Why a knob of `mma.py`'s template and not a template of its own: a template table takes the
first template that applies to a problem, and `applies` does not see the machine; as a knob,
the tuner searches both products in one space, and the default config (`mma.choose`) picks
by the machine's architecture and the problem's size. This module holds only the product;
the config, the space and the templates stay in `mma.py`.

A block computes a `block_m` x `block_n` tile of Y with (`warps_m` / 4) x `warps_n`
warpgroups (4 warps each): warpgroup (wy, wx) owns (block_m / (warps_m / 4)) rows in
m64 tiles and n = block_n / warps_n columns (64, 128 or 256); per k step of 16 (tf32: 8)
and m64 tile it issues one wgmma m64n<n>k16 (k8) reading both operands from shared memory
through matrix descriptors, its accumulators n / 2 fp32 registers a thread (`L.Wgmma`'s D
layout). At int8.py's integer precisions ("s8" / "u8": A's type, B s8) a k step is 32
bytes too (m64n<n>k32), the k tile 128 of them, both tiles K-major (as 8-bit tiles always
are), the accumulators int32.

Shared memory. k goes in tiles of 128 bytes (64 16-bit elements, 32 tf32) through a ring of
`stages` slots, as `mma._Tile` copies them (cp.async where the operand is stored in the
precision's type, else through registers; tf32 tiles always K-major, the float32 words a
thread copied rounded to tf32 in place once they have landed, as registers round those
they stage: wgmma ignores the low bits), laid out as wgmma's 128-byte swizzle wants it:
an operand contiguous along k (K-major) as rows of 128 bytes, chunk c of row r at chunk
c ^ r % 8 (the `_Tile` layout at this k tile; descriptor stride 1024 bytes between groups of
8 rows); an operand contiguous along its rows (MN-major: B stored [k, n], A stored [k, m])
in atoms of 64 of its rows, an atom k rows of 128 bytes, chunk c of row r at c ^ r % 8
(descriptor leading offset: an atom's bytes, stride 1024). Every slot starts at a multiple
of 1024 bytes (the renderer aligns the dynamic pool so: the swizzle is of addresses).

Loop: `stages - 2` tiles are fetched ahead. At tile kt each thread waits for its copies of
kt, fences them into the async proxy (`L.ProxyFence`), one barrier; the warpgroups issue
kt's wgmmas, commit them and wait until only those are in flight (kt - 1's are done);
then the fetch of tile kt + stages - 2 into the slot of tile kt - 2, which every warpgroup
has finished (each waited for it before the barrier the fetching thread passed). With
`early_refill`, a second barrier after that wait lets the fetch of tile kt + stages - 1
take the slot of kt - 1 (`stages - 1` tiles ahead, kt's wgmmas running across the
barrier): which pays is the GPU's to say. With `refill_first` the fetch of tile
kt + stages - 2 is issued right after the barrier, before kt's wgmmas (its slot, kt - 2's, is
free there already), not after the wait for kt - 1's: its copies start up to a k tile's
product earlier, while kt - 1's wgmmas still run, for no second barrier (issued between kt's
wgmmas' commit and the wait for kt - 1's instead, it took 4% longer, geometric mean of 27
fp16 shape-tile pairs on an H200, session 45, and was dropped). After the last tile, a wait
for all. A block whose wgmmas read registers each k tile loads (sparse24.py's metadata:
`register_sets` 2) takes k tiles by turns of as many, each its own registers, the odd
tiles after the loop. The epilogue stores each accumulator
through the problem's store, as `mma.py`'s, and `split_k` splits k as there (with
`cluster_split`, summed in the slices' cluster: `staged.cluster_results`).

The producer (the `producer` knob, session 47; CUTLASS's warp-specialised mainloop with
cp.async in place of TMA). The block gets a warpgroup more (`mma.PRODUCER_WARPS`, the last
128 threads), which alone copies: for each k tile of its slice it waits until the tile's
slot is `empty` (from the ring's second pass on), issues the tile's cp.asyncs and a
`cp.async.mbarrier.arrive.noinc` on the slot's `full` barrier (`L.Mbarrier`, 128 arrivals a
phase: each thread's copies landed). The consumer warpgroups run the whole k loop in one
guarded region: wait on `full` (the phase's parity), `fence.proxy.async`, the tile's
wgmmas, commit, wait for all but these, then lane 0 of each warp arrives on the previous
tile's `empty` (a warp's `wgmma.wait_group` is `.sync.aligned`: its lanes leave it
together). No `__syncthreads` in the loop. The barriers (2 x stages, made by one thread
before a block barrier) sit beside the ring, never reused by staged results. The consumers'
guard is `dnnc_warp_index()` (lane 0's warp, `__shfl_sync`): with a plain threadIdx.x
guard ptxas took the wgmmas for divergent and serialized them (C7518), and one k loop
inside one guard keeps wgmmas in flight from crossing a region's end (C7517). Where an
operand does not come by cp.async as it lies (through registers, tf32 rounded in place) the
config falls back to the plain loop, without the warpgroup.

The TMA producer (`producer="tma"`, session 49 at fp16 / bf16, session 51 at tf32): the
same warpgroup, but its first thread alone copies: per k tile it waits for the slot's
`empty`, announces the tile's bytes on its `full` barrier (`L.Mbarrier` "expect_tx", count
1) and issues the operands' boxes (`L.TmaLoad`: a K-major tile one box of 128 bytes of k (64
16-bit elements, 32 float32) by its rows, an MN-major one a box of 64 rows by 64 k an atom,
landing in the layouts above; `_SwizzledTile.tensor_map`), the maps kernel arguments the
runtime builds (`codegen.TensorMapArg`). A channels-last convolution's gathered patches whose
channels fill 128-byte rows come by TMA's im2col mode (`Operand.im2col`, session 53): a k
tile one box of a tap's 64 channels by the tile's pixels, the tap the copy's offsets. The
consumers need no proxy fence. An operand without a map (not a plain array of 16-bit
values, or of float32 ones holding tf32 values K-major, with 16-byte strides) makes the block
the plain loop's. The dense default takes it on 16-bit wgmma tiles and on tf32 ones whose
operands TMA copies (`mma.PRODUCER_DEFAULT`, `mma.tf32_copied`). Not done: `setmaxnreg`
and `elect.sync` (`tma.py` has them).

Which problems: `mma.py`'s spaces (dense, NCHW conv) and conv_nhwc.py's offer the knob on
sm_90 (`device.has_wgmma`) at every reduced precision; the dense and channels-last conv
defaults take it at fp16 / bf16 and at tf32 where both operands hold tf32 values
(`mma.WGMMA_DEFAULT`, `mma.wgmma_by_default`; DNNC_WGMMA=1 at tf32 always), the NCHW
conv default stays on mma.sync (its gathered patches come through registers: not measured).
int8.py's and int8_nhwc.py's spaces offer it at "s8" / "u8" on sm_90, and their defaults
take it (DNNC_WGMMA=0: mma.sync). sparse24.py's 2:4 product builds its sm_90 block on
`Warpgroups` (a third ring, the metadata's: `rings`; sparse wgmmas). Tried and dropped: a persistent form (132 blocks each looping over
output tiles, its cp.async ring running on into the next tile's first k tiles while this
one's results were stored) measured slower on an H200 at fp16 in and out: 4096^3 0.61-0.66
of cuBLAS against 0.76 unpersistent, 8192 x 768 x 3072 0.32 against 0.60 (the same
issuing threads then do the epilogue and the next tile's address arithmetic; a
warp-specialised producer is what would make it pay). Not done: MN-major
tf32 operands in shared memory (wgmma reads tf32 K-major only: such an operand is transposed
through registers, as mma.py does).
"""

from __future__ import annotations

import os
from dataclasses import replace

from ...ir import loop as L
from ...ir import types as T
from .dense import Operand
from .mma import CHUNK_WORDS, TMA_PRECISIONS, WARP, TensorCoreConfig, _allocated, _Tile

WARPGROUP = 4 * WARP
TILE_M = 64
"""Rows of one wgmma (m64)."""
WGMMA_N = (64, 128, 192, 256)
"""Columns a warpgroup's wgmma may have here (MN-major atoms are 64 wide; PTX allows any
multiple of 8 up to 256). 192: 128 x 192 blocks tile n = 768 in 4 (a transformer's 3072 ->
768 product: 128 x 256's 3 leave 1.45 waves of 132 SMs at 8192 rows, 128 x 128's 6 take
thinner tiles)."""
ROW_BYTES = 128
"""A swizzle row: a k tile's bytes (64 16-bit or 32 tf32 elements, `block_k`)."""
ATOM_ROWS = 64
"""Rows of an MN-major operand in one swizzle atom (128 bytes of 16-bit elements)."""
ROW_WORDS = 32
ROW_CHUNKS = 8
"""Words and 16-byte chunks of a 128-byte swizzle row."""


def block_k(precision: str) -> int:
    """The k tile at `precision`: one 128-byte swizzle row of its elements (128 of the
    integer precisions' bytes; at a sparse one, A's 64 kept values of 128 k)."""
    if precision in L.SPARSE_MMA:
        return ROW_BYTES
    return ROW_BYTES // (4 if precision == "tf32" else 1 if precision in L.INTEGER_MMA else 2)


def fits(c: TensorCoreConfig, precision: str) -> bool:
    """Whether config `c` is one this product runs at `precision`: k tiles of a 128-byte
    row (`block_k`), warpgroups of 4 warps down m, each owning whole m64 tiles and 64, 128,
    192 or 256 columns, 128 accumulators a thread at most, and at least 3 slots (2 tiles ahead
    of the one being multiplied is stages - 2; with `early_refill`, 2 slots)."""
    if c.block_k != block_k(precision) or c.warps_m % 4 or c.stages < 3 - c.early_refill:
        return False
    rows, columns = c.block_m // (c.warps_m // 4), c.block_n // c.warps_n
    return c.block_m % (c.warps_m // 4) == 0 and rows % TILE_M == 0 and \
        c.block_n % c.warps_n == 0 and columns in WGMMA_N and \
        accumulators(c) <= 128


def accumulators(c: TensorCoreConfig) -> int:
    """fp32 accumulators a thread holds under config `c` (its warpgroup's m64 tiles' n / 2)."""
    rows, columns = c.block_m // max(1, c.warps_m // 4), c.block_n // c.warps_n
    return rows // TILE_M * columns // 2


class _SwizzledTile(_Tile):
    """An operand's k tiles in wgmma's 128-byte swizzle (see the module's docstring): a
    K-major tile is `_Tile`'s layout (its rows then 128 bytes); an MN-major one is in atoms
    of 64 operand rows."""

    def word(self, slot: L.Expr, o: L.Expr, c: L.Expr) -> L.Expr:
        if self.k_inner:
            return super().word(slot, o, c)
        return slot * self.slot_words + c // ROW_CHUNKS * (self.bk * ROW_WORDS) + \
            o * ROW_WORDS + L.BinOp("^", c % ROW_CHUNKS, o % 8) * CHUNK_WORDS

    def round_in_place(self, slot: L.Expr) -> L.Stmt | None:
        """At tf32, the float32 words this thread's cp.asyncs brought into `slot` rounded to
        tf32 where they lie (wgmma ignores their low mantissa bits: rounding first keeps
        the precision's bound); nothing otherwise (registers staged them rounded)."""
        if self.precision != "tf32" or not self.asynchronous or self.operand.rounded or \
                os.environ.get("DNNC_TF32_TRUNCATE") == "1":
            return None

        def body(step, o, c):
            v = L.Var("w")
            word = self.word(slot, o, c) + v
            return L.For(v, CHUNK_WORDS, L.Store(self.tile, (word,), L.call(
                "pack_tf32", L.call("bitcast", self.tile[word], dtype=T.float32),
                dtype=T.uint32)), L.ForKind.UNROLLED)
        return self._each_chunk(None, body)

    def descriptor(self, slot: L.Expr, first: L.Expr, ks: int) -> tuple[L.Load, tuple]:
        """(the first word, the (leading, stride) byte offsets) of the operand rows from
        `first` (a multiple of 64) on at k step `ks` (32 bytes: 16 elements, tf32 8) of
        `slot`."""
        base = slot * self.slot_words
        if self.k_inner:   # rows of 128 bytes: 8 of them 1024 bytes apart; k 32 bytes a step
            return self.tile[base + first * ROW_WORDS + ks * 8], (16, L.SWIZZLE_BYTES)
        atom_bytes = self.bk * ROW_WORDS * 4   # (16-bit only: tf32 tiles are K-major)
        start = base + first // ATOM_ROWS * (self.bk * ROW_WORDS) + ks * 16 * ROW_WORDS
        return self.tile[start], (atom_bytes, L.SWIZZLE_BYTES)

    def tensor_map(self) -> tuple[L.TensorMap, bool] | None:
        """The map TMA copies this operand's k tiles through (boxes of 64 elements along its
        contiguous dimension: a K-major tile's k by its rows, an MN-major atom's 64 rows by
        the k tile: `L.TmaLoad` lands them in this layout), and whether its third dimension
        is the batch (else one matrix serves every batch); None unless the operand is a plain
        array [batch or 1, outer, inner] read as it lies (cp.async's condition: 16-bit, or at
        tf32 float32 K-major holding tf32 values already, `Operand.rounded`, which the tile
        then never rounds), its rows 16-byte strided (TMA's strides). A box row is 128
        bytes: 64 16-bit elements, 32 float32 (a K-major tf32 tile's k). The map's extents are
        the product's (m or n, and k), so a box past them reads zeros, as the ring's copies do.
        A gather with an im2col map (`Operand.im2col`: a convolution's patches, 16-bit,
        K-major) takes that map, each box a k tile of the tile's patch rows."""
        op = self.operand
        if op.im2col is not None and self.asynchronous and self.k_inner and \
                self.precision in TMA_PRECISIONS and self.precision != "tf32":
            tensor_map = op.im2col.tensor_map(self.rows, self.bk)
            return None if tensor_map is None else (tensor_map, False)
        if self.precision not in TMA_PRECISIONS or not self.asynchronous or \
                op.chunk is not None or op.word is not None or not op.array or \
                self.precision == "tf32" and not op.rounded:
            return None
        row, kk = L.Var("tma_row"), L.Var("tma_k")
        sample = op.at(self.bi, row, kk)
        if not isinstance(sample, L.Load) or sample.buffer.scope is not L.Scope.GLOBAL:
            return None
        shape = L.static_shape(sample.buffer.shape)
        outer, inner = (kk, row) if op.rows_contiguous else (row, kk)
        if shape is None or len(shape) != 3 or sample.indices[1:] != (outer, inner):
            return None
        batched = sample.indices[0] == self.bi
        if not batched and sample.indices[0] != L.const(0):
            return None
        _, outer_extent, inner_extent = shape
        extents = (self.extent, self.k) if op.rows_contiguous else (self.k, self.extent)
        if extents[0] > inner_extent or extents[1] > outer_extent:
            return None
        e = sample.dtype.itemsize
        if inner_extent * e % 16 or e * self.bk != ROW_BYTES:
            return None
        box = (ROW_BYTES // e, self.bk if op.rows_contiguous else self.rows, 1)
        return L.TensorMap(sample.buffer, (*extents, shape[0] if batched else 1),
                           (inner_extent * e, outer_extent * inner_extent * e), box), batched

    def tma_copies(self, tensor_map: L.TensorMap, batched: bool, kt: L.Expr, slot: L.Expr,
                   bar: L.Load) -> list[L.Stmt]:
        """k tile `kt` into `slot` by TMA through `tensor_map` (what the method of that name
        gave), completing on `bar`: one box for a K-major tile (from an im2col map, the
        tile's patch rows, `Operand.im2col`), one an atom of 64 rows for an MN-major one."""
        z = self.bi if batched else L.const(0)
        base = slot * self.slot_words
        if tensor_map.im2col:
            coords, offsets = self.operand.im2col.place(self.first, kt * self.bk)
            return [L.TmaLoad(self.tile[base], tensor_map, bar, coords, offsets)]
        if self.k_inner:
            return [L.TmaLoad(self.tile[base], tensor_map, bar, (kt * self.bk, self.first, z))]
        return [L.TmaLoad(self.tile[base + a * (self.bk * ROW_WORDS)], tensor_map, bar,
                          (self.first + a * ATOM_ROWS, kt * self.bk, z))
                for a in range(self.rows // ATOM_ROWS)]


class Warpgroups:
    """One block of a warpgroup product: its operands' tiles in shared memory, each
    warpgroup's accumulators in registers, and the statements `mma.mma_product` assembles
    from them (zeroing, the k loop, the results)."""

    def __init__(self, c: TensorCoreConfig, batch: int, m: int, n: int, k: int, a: Operand,
                 b: Operand, precision: str):
        self.c, self.m, self.n, self.precision = c, m, n, precision
        self.bm, self.bn, self.bk = bm, bn, bk = c.block_m, c.block_n, c.block_k
        self.groups_n = c.warps_n
        self.rows, self.cols = bm // (c.warps_m // 4), bn // c.warps_n
        self.tm = self.rows // TILE_M                 # m64 tiles of a warpgroup
        self.mk = L.WGMMA_K[precision]
        tiles = -(-k // bk)
        self.per = -(-tiles // c.split_k)             # k tiles per slice
        past_k = k % bk != 0 or tiles % c.split_k != 0
        self.bi, self.by, self.bx = bi, by, bx = L.Var("bi"), L.Var("by"), L.Var("bx")
        self.row0, self.col0 = by * bm, bx * bn
        self.consumers = WARP * c.warps_m * c.warps_n   # the threads issuing wgmmas

        def tiles(threads: int) -> tuple[_SwizzledTile, _SwizzledTile]:
            return (_SwizzledTile("a", bm, self.row0, m, a, bk, k, threads,
                                  past_k or m % bm != 0, bi, precision, c.stages),
                    _SwizzledTile("b", bn, self.col0, n, b, bk, k, threads,
                                  past_k or n % bn != 0, bi, precision, c.stages))
        self.producers = c.threads - self.consumers   # (mma.PRODUCER_WARPS' threads)
        self.a_in, self.b_in = tiles(self.producers if c.producer else self.consumers)
        # TMA where both operands have a map
        maps = [x.tensor_map() for x in (self.a_in, self.b_in)] \
            if c.producer == "tma" else []
        self.maps = maps if maps and all(maps) else None
        if c.producer == "tma" and self.maps is None:   # the plain loop (the cp.async
            self.c = c = replace(c, producer=False)     # producer lost to it on most tiles)
            self.a_in, self.b_in = tiles(self.consumers)
        # the producer copies only what cp.async brings as it lies (not through registers,
        # nor rounded in place at tf32): elsewhere its warpgroup idles, the warps copy
        self.producer = c.producer and all(
            x.asynchronous and x.round_in_place(L.const(0)) is None
            for x in (self.a_in, self.b_in))
        if c.producer and not self.producer:   # (no idle warpgroup in the block either)
            self.c = c = replace(c, producer=False)
            self.a_in, self.b_in = tiles(self.consumers)
        self.tma = self.producer and self.maps is not None
        self.bars = L.Buffer("k_bars", T.uint64, (2 * c.stages,), L.Scope.SHARED)
        self.count = self.tm * self.cols // 2
        self.acc_type = T.int32 if precision in L.INTEGER_MMA else T.float32
        self.acc = L.Buffer("acc", self.acc_type, (self.count,), L.Scope.LOCAL)
        self.t, self.wy, self.wx, self.warp, self.g, self.q = (
            L.Var(x) for x in ("t", "wy", "wx", "warp", "g", "q"))
        self.mi = L.Var("mi")

    def per_thread(self, body: L.Stmt) -> L.Stmt:
        """`body` on every thread: its warpgroup's place (wy, wx), its warp within the
        warpgroup and its lane's g and q (PTX's groupID and threadID_in_group)."""
        t = self.t
        used = L.free_vars(body)
        for var, value in reversed(((self.wy, t // WARPGROUP // self.groups_n),
                                    (self.wx, t // WARPGROUP % self.groups_n),
                                    (self.warp, t % WARPGROUP // WARP),
                                    (self.g, t % WARP // 4), (self.q, t % 4))):
            if var in used:
                body = L.Let(var, value, body)
        return L.For(t, self.consumers, body, L.ForKind.THREAD_X)

    def _producing(self, body) -> L.Stmt:
        """`body(p)` on the producer's threads, the block's last (from `consumers` on), p
        its thread's place among them."""
        u = L.Var("u")
        return L.For(u, self.c.threads, L.If(u >= self.consumers, body(u - self.consumers)),
                     L.ForKind.THREAD_X)

    def init(self) -> L.Stmt:
        """Every accumulator zeroed; with the producer, its barriers made (a k slot's `full`
        awaits each producer thread's copies, by TMA its one thread's arrival and bytes; its
        `empty` each consumer warp's arrival)."""
        r = L.Var("r")
        zero = self.per_thread(L.For(r, self.count, L.Store(
            self.acc, (r,), L.const(0, self.acc_type)), L.ForKind.UNROLLED))
        if not self.producer:
            return zero
        stages = self.c.stages
        copying = 1 if self.tma else self.producers
        made = [L.Mbarrier("init", self.bars[s], L.const(
            copying if s < stages else self.consumers // WARP))
            for s in range(2 * stages)]
        return L.seq(zero, self._producing(lambda p: L.If(L.eq(p, L.const(0)), L.seq(*made))),
                     L.Barrier())

    register_sets = 1
    """k tiles a turn of the k loop takes, each its own set of the registers `update` loads
    for its wgmmas (`turn`): sparse24.py's metadata words take 2, so that a tile's words never
    go into registers the previous tile's wgmmas, still running, read."""

    def update(self, slot: L.Expr, turn: int = 0) -> L.Stmt:
        """The k tile in shared `slot`: per k step (16, tf32 8) and m64 tile one wgmma of
        the warpgroup's columns, then the group committed and all but it waited for."""
        return self.per_thread(self._updated(slot))

    def _updated(self, slot: L.Expr) -> L.Stmt:
        """`update`'s statements on one thread."""
        body = [L.WgmmaFence()]
        for ks in range(self.bk // self.mk):
            for mi in range(self.tm):
                a, a_offsets = self.a_in.descriptor(slot, self.wy * self.rows + mi * TILE_M,
                                                    ks)
                b, b_offsets = self.b_in.descriptor(slot, self.wx * self.cols, ks)
                body.append(L.Wgmma(self.precision, self.cols,
                                    self.acc[mi * (self.cols // 2)], a, b,
                                    not self.a_in.k_inner, not self.b_in.k_inner,
                                    a_offsets, b_offsets))
        body += [L.WgmmaCommit(), L.WgmmaWait(1, self.acc[0], self.count)]
        return L.seq(*body)

    def rings(self) -> tuple:
        """What each k tile copies into shared memory: the operands' tiles (a subclass may
        add one: sparse24.py's metadata)."""
        return self.a_in, self.b_in

    def _produced(self, first: L.Expr) -> L.Stmt:
        """k tiles first .. first + per - 1 through the ring, copied by the producer's
        warpgroup (the `producer` knob, see the module's docstring)."""
        stages, per, kt = self.c.stages, self.per, L.Var("kt")
        slot = kt % stages
        full, empty = self.bars[slot], self.bars[stages + slot]

        def copies(p: L.Expr) -> L.Stmt:
            if self.tma:   # one thread: the tile's bytes announced, its boxes copied
                loads = [copy for x, (m, batched) in zip(self.rings(), self.maps)
                         for copy in x.tma_copies(m, batched, first + kt, slot, full)]
                tile_bytes = sum(copy.map.box_bytes for copy in loads)
                return L.If(L.eq(p, L.const(0)), L.For(kt, per, L.seq(
                    L.If(kt >= stages, L.Mbarrier("wait", empty, (kt // stages + 1) % 2)),
                    L.Mbarrier("expect_tx", full, L.const(tile_bytes)), *loads)))
            issued = []
            for x in self.rings():   # each a loop over the producer's threads
                loop = x.issue(first + kt, slot, None)
                assert isinstance(loop, L.For) and loop.kind is L.ForKind.THREAD_X
                issued.append(L.Let(loop.var, p, loop.body))
            return L.For(kt, per, L.seq(
                L.If(kt >= stages, L.Mbarrier("wait", empty, (kt // stages + 1) % 2)),
                *issued, L.Mbarrier("copy_arrive", full)))
        # one thread loop around the k loop: the wgmmas in flight never cross the end of
        # a guarded region (ptxas would wait for them there, C7517)
        # (TMA writes through the async proxy the wgmmas read: no proxy fence)
        fence = [] if self.tma else [L.ProxyFence()]
        consumed = self.per_thread(L.seq(L.For(kt, per, L.seq(
            L.Mbarrier("wait", full, kt // stages % 2), *fence, self._updated(slot),
            L.If(L.logical_and(kt > 0, L.eq(self.t % WARP, L.const(0))),   # a warp's
                 L.Mbarrier("arrive", self.bars[stages + (kt + stages - 1) % stages])))),
            L.WgmmaWait(0, self.acc[0], self.count)))
        return L.seq(self._producing(copies), consumed)

    def product(self, first: L.Expr) -> L.Stmt:
        """k tiles first .. first + per - 1 through the ring (see the module's docstring)."""
        if self.producer:
            return self._produced(first)
        tiles, stages, per = self.rings(), self.c.stages, self.per
        early = self.c.early_refill
        ahead = stages - 1 if early else stages - 2
        asynchronous = any(x.asynchronous for x in tiles)
        commit = [L.AsyncCommit()] if asynchronous else []
        prologue = []
        for s in range(ahead):
            if s < per:
                prologue += [x.fetch(first + s, L.const(s)) for x in tiles]
            prologue += commit
        fence = self.per_thread(L.ProxyFence())
        first_refill = self.c.refill_first

        def tile(kt: L.Expr, turn: int) -> L.Stmt:
            coming = kt + ahead
            more, slot = coming < per, coming % stages
            refill = [*(x.issue(first + coming, slot, more) for x in tiles), *commit]
            return L.seq(
                *([self.per_thread(L.AsyncWait(ahead - 1))] if asynchronous else []),
                *(x.round_in_place(kt % stages) for x in tiles), fence,
                L.Barrier(), *(refill if first_refill else []), self.update(kt % stages, turn),
                *([L.Barrier()] if early else []), *([] if first_refill else refill),
                *(x.finish(slot, more) for x in tiles))

        kt, sets = L.Var("kt"), self.register_sets
        turn = [tile(kt, 0)] if sets == 1 else [tile(kt * sets + s, s) for s in range(sets)]
        loop = L.seq(L.For(kt, per // sets, L.seq(*turn)), *(
            tile(L.const(per // sets * sets + s), s) for s in range(per % sets)))
        done = self.per_thread(L.WgmmaWait(0, self.acc[0], self.count))
        return L.seq(*prologue, loop, done)

    def each_result(self, body, within_tile: bool = False) -> L.Stmt:
        """`body(i, j, accumulator)` for each of the thread's results, if inside Y (the D
        layout of `L.Wgmma`); a lane's two results of a row as one vector where no tile
        passes Y's edges (as `mma._WarpTiles.each_result`, `within_tile` too)."""
        exact = within_tile or self.m % self.bm == 0 and self.n % self.bn == 0
        row0, col0 = (L.const(0), L.const(0)) if within_tile else (self.row0, self.col0)
        mi, tile, v = self.mi, L.Var("nt"), L.Var("v")
        out = []
        for half in range(2):   # registers 4 nt + 2 half (+ 1): row g + 8 half
            i = row0 + self.wy * self.rows + mi * TILE_M + self.warp * 16 + self.g + 8 * half
            j = col0 + self.wx * self.cols + tile * 8 + 2 * self.q
            at = mi * (self.cols // 2) + tile * 4 + 2 * half
            if exact:
                out.append(L.For(v, 2, body(i, j + v, self.acc[at + v]),
                                 L.ForKind.VECTORIZED))
                continue
            out += [L.If(L.logical_and(i < self.m, j + r < self.n),
                         body(i, j + r, self.acc[at + r])) for r in range(2)]
        return self.per_thread(L.For(mi, self.tm, L.For(tile, self.cols // 8, L.seq(*out),
                                                        L.ForKind.UNROLLED),
                                     L.ForKind.UNROLLED))

    def block(self, body: L.Stmt, after: L.Stmt | None = None) -> L.Stmt:
        """`body` with the block's shared tiles and the thread's registers allocated, then
        `after` (as `mma._WarpTiles.block`)."""
        out = _allocated(body, after, [self.a_in.tile, self.b_in.tile] + [
            x.stage for x in (self.a_in, self.b_in) if not x.asynchronous], [self.acc])
        # the barriers outside the tiles: memory an mbarrier held is not reused
        return L.Allocate(self.bars, out) if self.producer else out
