"""The int8 dense template for CPUs (QuantizedDense): u8 x s8 dot products of 4 bytes into
int32 accumulators, the requantization fused where the tile stores.

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
weights' column sums. Tiles are shared by the worker pool, panel-major so that a panel
(K x 64 bytes) stays in L2 while the row tiles pass.

Knobs (`Int8Config`): mr (rows a tile), nr (16 or 32 columns). This module builds loop IR and
names features; it must never import llvmlite.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.quantized import GROUP_COLUMNS, GROUP_DEPTH, finish_expr
from ..quantized_dense import QuantizedDenseProblem, quantized_dense
from ..space import Constraint, Space, Template

VNNI512 = frozenset({"avx512vnni", "avx512vl"})
"""The features of vpdpbusd at 512, 256 and 128 bits."""
AVXVNNI = frozenset({"avxvnni"})
"""The features of the VEX vpdpbusd (256 and 128 bits)."""
MR = 6   # 6 x 2 panels = 12 zmm accumulators: vpdpbusd's latency (5) x 2 a cycle, + operands


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


def _channel(buffer: L.Buffer | None, j) -> L.Expr | None:
    """A scalar or per-column parameter at column j."""
    if buffer is None:
        return None
    if all(d == L.const(1) for d in buffer.shape):
        return buffer[(0,) * len(buffer.shape)] if buffer.shape else buffer[()]
    return buffer[j]


class _Tile:
    """The loop nest of one problem and config."""

    def __init__(self, p: QuantizedDenseProblem, config: Int8Config):
        self.p, self.mr, self.nr = p, config.mr, config.nr
        self.halves = config.nr // GROUP_COLUMNS
        self.a = L.Buffer(p.a.name, p.a.dtype, (p.m, p.k))
        self.w = L.Buffer(p.w.name, T.uint32, (-(-p.n // GROUP_COLUMNS), -(-p.k // GROUP_DEPTH),
                                               GROUP_COLUMNS))
        self.y = L.Buffer(p.y.name, p.y.dtype, (p.m, p.n))
        self.acc = L.Buffer("acc", T.int32, (self.mr * self.nr,), L.Scope.LOCAL)

    def params(self) -> tuple:
        views = {b.name: b for b in (self.a, self.w, self.y)}
        return tuple(views.get(x.name, x) for x in self.p.params)

    def word(self, row, g, guard: bool) -> L.Expr:
        """A's bytes 4g..4g+3 of `row` as one uint32 (byte t in bits 8t..8t+7; past K: 0),
        xor 0x80 per byte for int8 A."""
        p, word = self.p, None
        for t in range(GROUP_DEPTH):
            k = g * GROUP_DEPTH + t
            value = self.a[row, L.minimum(k, p.k - 1) if guard else k]
            byte = L.Cast(T.uint32, L.Cast(T.uint8, value))
            if guard:
                byte = L.Select(k < p.k, byte, L.Const(0, T.uint32))
            if p.signed:
                byte = L.BinOp("^", byte, L.Const(0x80, T.uint32))
            byte = byte if t == 0 else L.BinOp("<<", byte, L.Const(8 * t, T.uint32))
            word = byte if word is None else L.BinOp("|", word, byte)
        return word

    def update(self, i0, jp, g, guard: bool) -> L.Stmt:
        ii, jj, half, a = L.Var("ii"), L.Var("jj"), L.Var("h"), L.Var("a", T.uint32)
        at = ii * self.nr + half * GROUP_COLUMNS + jj
        panel = L.minimum(jp * self.halves + half, self.w.shape[0] - 1)
        dot = L.call("dot_u8s8x4", self.acc[at], a, self.w[panel, g, jj], dtype=T.int32)
        row = L.minimum(i0 + ii, self.p.m - 1)   # rows past M repeat the last; never stored
        return L.For(ii, self.mr, L.Let(a, self.word(row, g, guard), L.For(
            half, self.halves, L.For(jj, GROUP_COLUMNS, L.Store(self.acc, (at,), dot),
                                     L.ForKind.VECTORIZED), L.ForKind.UNROLLED)),
            L.ForKind.UNROLLED)

    def store(self, i0, jp) -> L.Stmt:
        """The tile's valid elements through the compensation, finish and epilogue."""
        p = self.p
        ii, jj = L.Var("si"), L.Var("sj")
        i, j = i0 + ii, jp * self.nr + jj
        za = L.Cast(T.int32, _channel(p.za, j))
        if p.signed:
            za = za + L.const(128, T.int32)
        acc = self.acc[ii * self.nr + jj] - za * p.sums[j]
        value = finish_expr(acc, *(_channel(b, j) for b in (p.bias, p.scale, p.y_zp)), p.out,
                            p.lo, p.hi)
        value = p.epilogue(value, p.anchor_index(i, j))
        value = value if value.dtype is p.y.dtype else L.Cast(p.y.dtype, value)
        width = L.minimum(L.const(self.nr), p.n - jp * self.nr)
        return L.For(ii, self.mr, L.If(i < p.m, L.For(jj, width, L.Store(self.y, (i, j), value))),
                     L.ForKind.UNROLLED)

    def body(self, threads: int) -> L.Stmt:
        p = self.p
        tiles, panels = -(-p.m // self.mr), -(-p.n // self.nr)
        t, g, z = L.Var("t"), L.Var("g"), L.Var("z")
        i0, jp = (t % tiles) * self.mr, t // tiles   # panel-major: a panel stays in L2
        whole = p.k // GROUP_DEPTH
        zero = L.For(z, self.mr * self.nr, L.Store(self.acc, (z,), L.const(0, T.int32)),
                     L.ForKind.VECTORIZED)
        parts = [zero, L.For(g, whole, self.update(i0, jp, g, False))]
        if p.k % GROUP_DEPTH:
            parts.append(self.update(i0, jp, L.const(whole), True))
        parts.append(self.store(i0, jp))
        kind = L.ForKind.PARALLEL if threads > 1 and tiles * panels > 1 else L.ForKind.SERIAL
        return L.For(t, tiles * panels, L.Allocate(self.acc, L.seq(*parts)), kind)


def build(p: QuantizedDenseProblem, config: Int8Config, machine) -> L.PrimFunc:
    tile = _Tile(p, config)
    return L.simplify(L.PrimFunc(p.name, tile.params(), tile.body(machine.threads)))


DENSE_INT8 = Template("dense_int8", quantized_dense, lambda p: True, space, default, build)
