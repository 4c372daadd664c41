"""bf16 products for the llvm target (`precision="bf16"`): what the dense template needs to
multiply bf16-rounded operands with fp32 accumulation.

A constant B arrives packed in pairs along K (`ir/ops/linalg.pack_pairs`: each 32-bit word
holds B[2t, j] in its low half and B[2t + 1, j] in its high half, as AVX512_BF16's
`vdpbf16ps` reads its second operand); A is rounded to bf16 (to nearest even) and packed the
same way by the kernel, a tile at a time (`pack_rows`); the product is the loop-IR intrinsic
`dot_bf16x2(acc, a, b)` (`ir/loop/nodes.INTRINSICS`), which the llvm renderer emits as
`vdpbf16ps` where the CPU has AVX512_BF16 (`native`) and legalize expands into two fp32 FMAs
of the same operands elsewhere, so both give the same sums up to bf16's denormals, which
`vdpbf16ps` flushes.

This module builds loop IR and names features; it must never import llvmlite (the registry
entry reads `PRECISIONS` when the targets are listed) nor decide what a kernel's tiles are.
"""

from __future__ import annotations

from ...ir import loop as L
from ...ir import types as T

PRECISIONS = ("fp32", "bf16")
"""The values of the llvm target's `precision` option, the default first."""

BF16_FEATURES = frozenset({"avx512bf16", "avx512vl"})
"""The CPU features `vdpbf16ps` needs at every vector width (512-bit: avx512bf16; 128- and
256-bit: avx512vl too). A target lacking one computes `dot_bf16x2` in fp32 FMAs."""


def native(features: frozenset[str]) -> frozenset[str]:
    """The legalize rules the renderer skips on a CPU with `features`: `dot_bf16x2` where
    `vdpbf16ps` runs at every width."""
    return frozenset({"dot_bf16x2"}) if BF16_FEATURES <= features else frozenset()


def bits(x: L.Expr) -> L.Expr:
    """float32 `x` rounded to bf16 (to nearest even), its 16 bits in a uint32."""
    return L.Cast(T.uint32, L.call("bitcast", L.Cast(T.bfloat16, x), dtype=T.uint16))


def pair(lo: L.Expr, hi: L.Expr) -> L.Expr:
    """The uint32 word of float32 `lo` and `hi` rounded to bf16: lo in bits 0-15."""
    return L.BinOp("|", bits(lo), L.BinOp("<<", bits(hi), L.Const(16, T.uint32)))


def product(acc: L.Expr, a: L.Expr, b: L.Expr) -> L.Expr:
    """acc plus the pair products of words `a` and `b` (`dot_bf16x2`)."""
    return L.call("dot_bf16x2", acc, a, b, dtype=T.float32)


class PairedA:
    """A tile's rows of A rounded to bf16 in pairs along K, packed once per row block and
    k-slice into the workspace `buffer` that every panel's tiles read: a tile's MR rows one
    after another, each its `slots` words (the slice's pairs, rounded up to whole vectors so
    that the packing loop stores whole vectors); or, with `k_major` (A stored [k, m]: a 1x1
    conv's NCHW image), pair by pair, each pair's MR words side by side. `a_at(bi, row, k)`
    reads A in float32."""

    def __init__(self, a_at, k: int, kc: int, mr: int, lanes: int, blocks: int, tiles: int,
                 k_major: bool = False):
        self.a_at, self.k, self.kc, self.mr, self.lanes = a_at, k, kc, mr, lanes
        self.tiles, self.k_major = tiles, k_major
        self.slots = -(-(-(-kc // 2)) // lanes) * lanes
        self.buffer = L.Buffer("apairs", T.uint32, (blocks * tiles * mr * self.slots,),
                               L.Scope.GLOBAL)

    def slot(self, block: L.Expr, tile: L.Expr, ii, t) -> L.Expr:
        """Where row ii of tile `tile` of row block `block` holds pair t of the slice."""
        if self.k_major:
            return ((block * self.tiles + tile) * self.slots + t) * self.mr + ii
        return ((block * self.tiles + tile) * self.mr + ii) * self.slots + t

    def pack(self, bi, row_of, kb, block: L.Expr, tile: L.Expr, whole_rows=None) -> L.Stmt:
        """Pairs of this k-slice for each row ii of the tile (`row_of(ii)`: rows past M repeat
        the last): whole pairs a vector of pairs at a time (A's even and odd k as two stride-2
        loads), the rest one by one, a k past K read as 0. k_major: pair by pair, the tile's
        rows a vector (two contiguous loads of A's k and k + 1 rows); `whole_rows`, a pair
        (condition, rows) where the condition says all MR rows are inside M, reads them as
        `rows(ii)` (no clamp: contiguous loads) when it holds."""
        ii, tv, lane, t = L.Var("pi"), L.Var("pv"), L.Var("pl"), L.Var("pt")
        start = kb * self.kc
        depth = L.minimum(L.const(self.kc), self.k - start)

        def word(t_expr, guard: bool, rows=row_of) -> L.Expr:
            k0 = start + 2 * t_expr
            row = rows(ii)
            if not guard:
                return pair(self.a_at(bi, row, k0), self.a_at(bi, row, k0 + 1))
            hi = self.a_at(bi, row, L.minimum(k0 + 1, self.k - 1))
            return pair(self.a_at(bi, row, k0), L.Select(k0 + 1 < self.k, hi, L.const(0.0)))

        if self.k_major:
            # (a vector along pairs would gather: a pair's two k a whole image apart, the
            # next pair two more; 960 -> 160 at 7x7, 1 thread, znver5: the pack cost 18 of 55 us)
            def pairs(rows) -> L.Stmt:
                kind = L.ForKind.VECTORIZED if self.mr >= 2 else L.ForKind.SERIAL
                full = L.For(t, depth // 2, L.For(ii, self.mr, L.Store(
                    self.buffer, (self.slot(block, tile, ii, t),), word(t, False, rows)), kind))
                odd = L.If(depth % 2 > 0, L.For(ii, self.mr, L.Store(
                    self.buffer, (self.slot(block, tile, ii, depth // 2),),
                    word(depth // 2, True, rows)), kind))
                return L.seq(full, odd)
            if whole_rows is None:
                return pairs(row_of)
            condition, rows = whole_rows
            return L.If(condition, pairs(rows), pairs(row_of))
        whole = depth // 2 // self.lanes   # vectors of pairs wholly inside the slice
        first = whole * self.lanes
        vectors = L.For(tv, whole, L.For(lane, self.lanes, L.Store(
            self.buffer, (self.slot(block, tile, ii, tv * self.lanes + lane),),
            word(tv * self.lanes + lane, False)), L.ForKind.VECTORIZED))
        rest = L.For(t, (depth + 1) // 2 - first, L.Store(
            self.buffer, (self.slot(block, tile, ii, first + t),), word(first + t, True)))
        return L.For(ii, self.mr, L.seq(vectors, rest), L.ForKind.UNROLLED)


def channel_pair(x: L.Buffer, c: int, i_n, i_t, row, col) -> L.Expr:
    """The word of channels 2t and 2t + 1 of NCHW `x` (C channels) at (row, col) of image
    i_n, rounded to bf16 (a channel past C as 0)."""
    hi = x[i_n, L.minimum(2 * i_t + 1, c - 1), row, col]
    if c % 2:
        hi = L.Select(2 * i_t + 1 < c, hi, L.const(0.0))
    return pair(x[i_n, 2 * i_t, row, col], hi)


def pair_planes(x: L.Buffer, x_dims, begins, padded_hw, par: L.ForKind) -> tuple[L.Buffer,
                                                                               L.Stmt]:
    """NCHW image `x` rounded to bf16 in pairs of channels, [N, ceil(C / 2), HP, WP] uint32
    (channels 2t and 2t + 1 of a pixel in one word, a channel past C as 0), zero-padded to
    the padded plane as `conv.pad_input` does: a conv's operand, made once a call (simple
    loops LLVM vectorises, as pad_input's). Unpadded, the planes are flat: [N, ceil(C / 2),
    H * W]."""
    n, c, h, wid = x_dims
    (hp, wp), (ph, pw) = padded_hw, begins
    pairs = -(-c // 2)
    nc, i_h, i_w = L.Var("pnc"), L.Var("ph"), L.Var("pw")
    i_n, i_t = nc // pairs, nc % pairs

    def word(row, col) -> L.Expr:
        return channel_pair(x, c, i_n, i_t, row, col)

    if (ph, pw) == (0, 0) and (hp, wp) == (h, wid):
        out = L.Buffer("xpairs", T.uint32, (n, pairs, h * wid))
        copy = L.For(i_w, h * wid, L.Store(out, (i_n, i_t, i_w), word(i_w // wid, i_w % wid)))
        return out, L.For(nc, n * pairs, copy, par)
    out = L.Buffer("xpairs", T.uint32, (n, pairs, hp, wp))
    copy = L.For(i_h, h, L.For(i_w, wid, L.Store(out, (i_n, i_t, i_h + ph, i_w + pw),
                                                  word(i_h, i_w))))
    zero = L.For(i_h, hp, L.For(i_w, wp, L.Store(out, (i_n, i_t, i_h, i_w),
                                                  L.Const(0, T.uint32))))
    return out, L.For(nc, n * pairs, L.seq(zero, copy), par)
