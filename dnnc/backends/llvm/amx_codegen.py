"""Render the loop IR's `TileProduct` as AMX tile instructions: LLVM's
`llvm.x86.tileloadd64.internal`, `tilezero.internal`, the precision's dot (`amx.TILE_DOTS`:
`tdpbf16ps.internal`, `tdpbusd.internal`) and `tilestored64.internal` on values of type
`x86_amx`, whose tile configuration (`ldtilecfg`: C's tiles 16 rows of 64 bytes, A's and
B's a step's depth: 16 words, or the tail's fewer) LLVM emits itself. The k loop carries C's tiles in registers (phis), each step loading its A and B
tiles once for all of C's.

On a CPU without the tiles (`expand_tile_products`) a `TileProduct` becomes loops of the
same sums (`dot_bf16x2`, `dot_u8s8x4`, or s8 x s8 bytes widened to int32). It must never
decide where tiles may run (`amx.tile_features`, the templates' `features`).
"""

from __future__ import annotations

from llvmlite import ir

from ...ir import loop as L
from ...ir import types as T
from .amx import TILE_DOTS
from .primitives import I8, I16, I64, PTR

TILE_BYTES = 4 * L.TILE_ROWS
"""Bytes a tile row holds (16 fp32, 16 bf16 pairs or 16 int8 quads)."""


class _Tile(ir.Type):
    """LLVM's `x86_amx` (llvmlite spells no such type): a tile register's value."""

    def _to_string(self) -> str:
        return "x86_amx"

    def __eq__(self, other) -> bool:
        return isinstance(other, _Tile)

    def __hash__(self) -> int:
        return hash("x86_amx")


TILE = _Tile()


class _Intrinsics:
    """The tile intrinsics of one module, declared once (`ModuleBuilder.declare`)."""

    def __init__(self, mb, precision: str):
        shape = [I16, I16]
        self.load = mb.declare("llvm.x86.tileloadd64.internal", TILE, shape + [PTR, I64])
        self.zero = mb.declare("llvm.x86.tilezero.internal", TILE, shape)
        self.dot = mb.declare(TILE_DOTS[precision][0], TILE, [I16] * 3 + [TILE] * 3)
        self.store = mb.declare("llvm.x86.tilestored64.internal", ir.VoidType(),
                                shape + [PTR, I64, TILE])


def render(em, s: L.TileProduct) -> None:
    """Emit `s` (`TileProduct`) at the emitter `em`'s builder: C's tiles loaded (or zeroed),
    for each run a loop over its whole k steps carrying them in phis (straight-line for one
    step), then its tail step, stored."""
    b, ops = em.b, _Intrinsics(em.mb, s.precision)
    if s.tail:   # a function configures a tile register with one shape: the tail's kernel
        # inlined into the entry beside others of other shapes ran out of tile registers
        em.fn.attributes.add("noinline")
    rows, width = ir.Constant(I16, L.TILE_ROWS), ir.Constant(I16, TILE_BYTES)
    c0, a0, b0 = (em.address(x.buffer, x.indices) for x in (s.c, s.a, s.b))
    (a_row, a_tile, a_step), (b_row, b_tile, b_step) = s.a_layout, s.b_layout

    def at(base, words: int, step=None, per_step: int = 0):
        """base + 4 (words + step per_step) bytes."""
        offset = ir.Constant(I64, 4 * words)
        if step is not None and per_step:
            offset = b.add(offset, b.mul(step, ir.Constant(I64, 4 * per_step)))
        return b.gep(base, [offset], inbounds=True, source_etype=I8)

    def stride(words: int):
        return ir.Constant(I64, 4 * words)

    c_at = [[at(c0, 16 * r * s.c_row + 16 * j) for j in range(s.n_tiles)]
            for r in range(s.m_tiles)]
    if s.accumulate:
        acc = [[b.call(ops.load, [rows, width, c_at[r][j], stride(s.c_row)])
                for j in range(s.n_tiles)] for r in range(s.m_tiles)]
    else:
        acc = [[b.call(ops.zero, [rows, width]) for _ in range(s.n_tiles)]
               for _ in range(s.m_tiles)]

    def step(t, tiles, a_run: int, b_run: int, words: int = L.TILE_ROWS):
        """One step of k, `words` words deep: A's tiles `words` words wide, B's `words`
        rows (the shapes LLVM configures the tiles with)."""
        depth, k_rows = ir.Constant(I16, 4 * words), ir.Constant(I16, words)
        a_tiles = [b.call(ops.load, [rows, depth, at(a0, a_run + r * a_tile, t, a_step),
                                     stride(a_row)]) for r in range(s.m_tiles)]
        b_tiles = [b.call(ops.load, [k_rows, width, at(b0, b_run + j * b_tile, t, b_step),
                                     stride(b_row)]) for j in range(s.n_tiles)]
        return [[b.call(ops.dot, [rows, width, depth, tiles[r][j], a_tiles[r], b_tiles[j]])
                 for j in range(s.n_tiles)] for r in range(s.m_tiles)]

    for a_run, b_run in s.runs:   # (C's tiles carried from run to run)
        if s.steps > 1:
            acc = _steps(em, s, acc, lambda t, tiles: step(t, tiles, a_run, b_run))
        elif s.steps == 1:
            acc = step(None, acc, a_run, b_run)
        if s.tail:
            acc = step(ir.Constant(I64, s.steps), acc, a_run, b_run, s.tail)
    for r, j in _grid(s):
        b.call(ops.store, [rows, width, c_at[r][j], stride(s.c_row), acc[r][j]])


def _steps(em, s: L.TileProduct, acc, step):
    """A loop over the run's `steps` whole steps, C's tiles carried in phis; their values
    after it."""
    b = em.b
    head = b.block
    body = em.fn.append_basic_block("tiles.k")
    done = em.fn.append_basic_block("tiles.done")
    b.branch(body)
    b.position_at_end(body)
    t = b.phi(I64, "t")
    t.add_incoming(ir.Constant(I64, 0), head)
    phis = [[b.phi(TILE, f"c{r}{j}") for j in range(s.n_tiles)] for r in range(s.m_tiles)]
    for r, j in _grid(s):
        phis[r][j].add_incoming(acc[r][j], head)
    out = step(t, phis)
    t_next = b.add(t, ir.Constant(I64, 1))
    t.add_incoming(t_next, b.block)
    for r, j in _grid(s):
        phis[r][j].add_incoming(out[r][j], b.block)
    b.cbranch(b.icmp_unsigned("<", t_next, ir.Constant(I64, s.steps)), body, done)
    b.position_at_end(done)
    return out


def _grid(s: L.TileProduct):
    return [(r, j) for r in range(s.m_tiles) for j in range(s.n_tiles)]


def expand_tile_products(func: L.PrimFunc, tiles: frozenset[str]) -> L.PrimFunc:
    """`func` with each `TileProduct` of a precision not in `tiles` (those the CPU has) as
    loops of the same sums (`_expanded`): what a CPU without AMX runs of a tile template
    (tests check the templates' packing, edges and epilogue so)."""
    def rewrite(node):
        if isinstance(node, L.TileProduct) and node.precision not in tiles:
            return _expanded(node)
        return None

    if not any(isinstance(n, L.TileProduct) for n in L.walk(func.body)):
        return func
    return L.PrimFunc(func.name, func.params, L.transform(func.body, rewrite), func.size_vars,
                      func.attrs)


def _flat(place: L.Load) -> tuple[L.Buffer, L.Expr]:
    """A place's buffer viewed 1-D (the same memory, by name) and its element's offset."""
    buffer, offset, stride = place.buffer, L.const(0), L.const(1)
    for index, dim in reversed(list(zip(place.indices, buffer.shape))):
        offset = offset + index * stride
        stride = stride * dim
    return L.Buffer(buffer.name, buffer.dtype, (L.simplify_expr(stride),), buffer.scope), \
        L.simplify_expr(offset)


def _quads(a_type: T.DType, b_type: T.DType):
    """acc + the four products of a's and b's bytes (of those types), in int32."""
    def dot(acc: L.Expr, a: L.Expr, b: L.Expr) -> L.Expr:
        for t in range(4):
            x, y = (L.Cast(T.int32, L.Cast(dtype, w if t == 0 else L.BinOp(
                ">>", w, L.Const(8 * t, T.uint32)))) for w, dtype in ((a, a_type), (b, b_type)))
            acc = acc + x * y
        return acc
    return dot


_DOTS = {
    "bf16": lambda acc, a, b: L.call("dot_bf16x2", acc, a, b, dtype=T.float32),
    "u8s8": lambda acc, a, b: L.call("dot_u8s8x4", acc, a, b, dtype=T.int32),
    "s8s8": _quads(T.int8, T.int8),
    "s8u8": _quads(T.int8, T.uint8),
}
"""Precision -> one word of A against one of B, added to acc, as loop IR (`_expanded`)."""


def _expanded(s: L.TileProduct) -> L.Stmt:
    """`s` as loops: each row of each C tile summed in a 16-lane local vector, one dot of
    the precision (`_DOTS`) per (run, step, word) and column, in that order (the tail's
    words last in each run)."""
    dot_of = _DOTS[s.precision]
    (c, c0), (a, a0), (b, b0) = (_flat(x) for x in (s.c, s.a, s.b))
    (a_row, a_tile, a_step), (b_row, b_tile, b_step) = s.a_layout, s.b_layout
    r, j, i, t, q, col = (L.Var(f"tile_{x}") for x in ("r", "j", "i", "t", "q", "col"))
    word = L.Var("tile_a", T.uint32)
    acc_type = L.TILE_PRECISIONS[s.precision]
    acc = L.Buffer("tile_acc", acc_type, (L.TILE_ROWS,), L.Scope.LOCAL)
    rows = L.TILE_ROWS
    c_at = c0 + (rows * r + i) * s.c_row + rows * j + col
    vec = L.ForKind.VECTORIZED
    start = c[c_at] if s.accumulate else L.const(0, acc_type)
    init = L.For(col, rows, L.Store(acc, (col,), start), vec)

    def words(a_run: int, b_run: int, step: L.Expr, count: int) -> L.Stmt:
        """The dots of `count` words of k at `step`."""
        dot = L.Let(word, a[a0 + a_run + r * a_tile + step * a_step + i * a_row + q], L.For(
            col, rows, L.Store(acc, (col,), dot_of(
                acc[col], word, b[b0 + b_run + step * b_step + j * b_tile + q * b_row + col])),
            vec))
        return L.For(q, count, dot)

    def run(a_run: int, b_run: int) -> L.Stmt:
        whole = L.For(t, s.steps, words(a_run, b_run, t, rows)) if s.steps else None
        tail = words(a_run, b_run, L.const(s.steps), s.tail) if s.tail else None
        return L.seq(*(x for x in (whole, tail) if x is not None))

    done = L.For(col, rows, L.Store(c, (c_at,), acc[col]), vec)
    row = L.Allocate(acc, L.seq(init, *(run(*offsets) for offsets in s.runs), done))
    return L.For(r, s.m_tiles, L.For(j, s.n_tiles, L.For(i, rows, row)))
