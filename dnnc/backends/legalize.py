"""Legalize: rewrite a scheduled PrimFunc so that only a renderer's primitive ops remain.

The operator IR says what an op *means* (`BinOp`: integer division never traps, float `//`
floors; `sigmoid`, `sign`, `isinf`, ... as NumPy's); a renderer should only say how its machine
*spells* primitive ops. This pass bridges the two once, for every renderer:

- `sigmoid(x)` -> 1 / (1 + exp(neg(x))), `rsqrt(x)` -> 1 / sqrt(x); `sign`, `isnan`, `isinf`,
  `not`, and integer `abs` / `neg` -> compares, selects and arithmetic;
- float `x // y` -> floor(x / y), float `x % y` -> fmod(x, y);
- integer `/`, `//`, `%` -> `idiv` / `irem` (C's truncating quotient and remainder: undefined,
  as LLVM's sdiv or C's `/`, for a zero divisor or MIN / -1) on a divisor made safe *before*
  dividing (a select after the division would not help: the division is already undefined),
  plus the floor fix-up; loop bounds drop the guard and pick unsigned division where they
  prove it safe, as `i // 4` in index arithmetic;
- float16 / bfloat16 arithmetic -> float32 arithmetic rounded back after every op (NumPy's
  result, bit for bit), so narrow floats only move: loads, stores, lets, selects, and casts
  to and from float32; float64 -> float16 goes through float32 rounded to odd (one rounding,
  as NumPy), and bfloat16 <-> float32 casts become integer bit operations;
- `dot_bf16x2` (a bf16 pair product, `ir/loop/nodes.INTRINSICS`) -> two float32 fmas of its
  halves, unless the renderer emits it (llvm on a CPU with AVX512_BF16);
- float -> integer casts -> `ftoi` of a value made in range first, and selects: the result
  is defined for every input (NaN, +-inf, out of range: docs/semantics.md), so no renderer
  relies on LLVM's poison (fptosi out of range) or C's undefined behaviour (CUDA's cvt
  saturates, x86's gives MIN, constant folding anything).

Rules are small functions `(expr, ctx) -> Expr | None`, each naming its identity, in RULES (a
table in the order they are tried: promotion of narrow floats first, so that an expansion
never runs in float16). A renderer passes the names of the rules whose ops it renders
natively (a fast sigmoid, a native rsqrt, a bfloat16 conversion instruction); those are
skipped and `check_legal` accepts their ops.

Legalize must never change a result: every rule is an identity of the IR's semantics, bit
for bit (tests/backends/test_legalize.py). It never reorders memory accesses or changes loop
structure and never asks which target it serves: only the `native` set. An operand a rule reads
more than once is bound by a `Let` around its statement, so expansions never duplicate work
nor grow the tree exponentially; hoisting is safe because an expression has no side effects
and evaluates all of its operands (a `Select` evaluates both sides).

New primitive calls, which exist only after legalize (or where a template proves the range):
`idiv(a, b)` and `irem(a, b)`, and `ftoi(x)` (a float32/float64 truncated toward zero to int32
or int64, defined only where the result fits).
`check_index` (a gather's run-time index check, `loop.index_checks`) is left to the renderers:
no rule rewrites it, and binding it in a Let runs it once, as its value is needed.
"""

from __future__ import annotations

from typing import Callable

from ..ir import loop as L
from ..ir import types as T

NARROW_FLOATS = (T.float16, T.bfloat16)
_UNSIGNED = {1: T.uint8, 2: T.uint16, 4: T.uint32, 8: T.uint64}
_SIGNED = {1: T.int8, 2: T.int16, 4: T.int32, 8: T.int64}


class IllegalOpError(Exception):
    """A PrimFunc still holds ops its renderer does not render (a compiler bug)."""


# ---------------------------------------------------------------------------------------------
# Rules


def _f32(x: L.Expr) -> L.Expr:
    """`x` (a narrow float) as float32: exact; constants rounded to their own precision."""
    if isinstance(x, L.Const):
        return L.Const(float(x.dtype.np.type(x.value)), T.float32)
    return L.Cast(T.float32, x)


def _narrow_float(e, ctx):
    """float16/bfloat16 `a op b` -> narrow(f32(a) op f32(b)); `f(x)` -> narrow(f(f32(x)));
    compares and predicates compare in float32 (exact); a cast from or to anything other
    than float32 goes through float32. Rounding after every op is NumPy's float16 result."""
    if isinstance(e, L.BinOp) and e.a.dtype in NARROW_FLOATS:
        out = L.BinOp(e.op, _f32(e.a), _f32(e.b))
        return out if e.dtype.kind == "b" else L.Cast(e.a.dtype, out)
    if isinstance(e, L.Call) and e.name != "bitcast" and \
            any(a.dtype in NARROW_FLOATS for a in e.args):
        out = L.Call(e.name, tuple(_f32(a) if a.dtype in NARROW_FLOATS else a
                                   for a in e.args),
                     T.float32 if e.dtype in NARROW_FLOATS else e.dtype)
        return L.Cast(e.dtype, out) if e.dtype in NARROW_FLOATS else out
    if isinstance(e, L.Cast) and e.value.dtype is not e.dtype:
        src, dst = e.value.dtype, e.dtype
        if src in NARROW_FLOATS and dst is not T.float32:
            return L.Cast(dst, _f32(e.value))
        if dst in NARROW_FLOATS and src not in (T.float32, T.float64):
            return L.Cast(dst, L.Cast(T.float32, e.value))
        if dst is T.bfloat16 and src is T.float64:   # (two roundings, as before legalize)
            return L.Cast(dst, L.Cast(T.float32, e.value))
    return None


def _f16_from_f64(e, ctx):
    """float16(x: f64) -> float16(float32 of x rounded to odd): rounding to float32 first and
    then to float16 would round twice (1 + 2**-11 + 2**-40 ties at float32 and then rounds
    down); rounding to odd keeps the sticky bit, so the second rounding equals one."""
    if not (isinstance(e, L.Cast) and e.dtype is T.float16 and e.value.dtype is T.float64):
        return None
    x = ctx.bind(e.value)
    r = ctx.bind(L.Cast(T.float32, x))
    back = ctx.bind(L.Cast(T.float64, r))
    bits = ctx.bind(L.call("bitcast", r, dtype=T.int32))
    # toward zero: one step down in magnitude where rounding went up
    up = L.call("abs", back) > L.call("abs", x)
    toward_zero = ctx.bind(L.Select(up, bits - L.Const(1, T.int32), bits))
    inexact = L.logical_or(back < x, back > x)   # (ordered: a NaN stays as it is)
    odd = L.Select(inexact, L.BinOp("|", toward_zero, L.Const(1, T.int32)), toward_zero)
    return L.Cast(T.float16, L.call("bitcast", odd, dtype=T.float32))


def _bf16_cast(e, ctx):
    """bfloat16(x: f32) -> the top half of x's bits rounded to nearest even (a NaN stays a
    quiet NaN); float32(x: bf16) -> x's bits shifted into the top half."""
    if not isinstance(e, L.Cast):
        return None
    if e.dtype is T.bfloat16 and e.value.dtype is T.float32:
        x = ctx.bind(e.value)
        bits = ctx.bind(L.call("bitcast", x, dtype=T.uint32))
        lsb = L.BinOp("&", L.BinOp(">>", bits, L.Const(16, T.uint32)), L.Const(1, T.uint32))
        rounded = bits + (L.Const(0x7FFF, T.uint32) + lsb)
        quiet = L.BinOp("|", bits, L.Const(0x400000, T.uint32))
        top = L.Select(L.call("isnan", x), quiet, rounded)
        half = L.Cast(T.uint16, L.BinOp(">>", top, L.Const(16, T.uint32)))
        return L.call("bitcast", half, dtype=T.bfloat16)
    if e.dtype is T.float32 and e.value.dtype is T.bfloat16:
        bits = L.Cast(T.uint32, L.call("bitcast", e.value, dtype=T.uint16))
        return L.call("bitcast", L.BinOp("<<", bits, L.Const(16, T.uint32)), dtype=T.float32)
    return None


def _dot_bf16x2(e, ctx):
    """dot_bf16x2(acc, a, b) -> fma(lo(a), lo(b), fma(hi(a), hi(b), acc)), with hi(x) =
    bitcast<f32>(x & 0xffff0000) and lo(x) = bitcast<f32>(x << 16): the products of 8-bit
    significands are exact in float32, so each fma rounds only its sum, as `vdpbf16ps` does
    (but for its flushed denormals)."""
    if not (isinstance(e, L.Call) and e.name == "dot_bf16x2"):
        return None
    acc, a, b = e.args
    a, b = ctx.bind(a), ctx.bind(b)

    def half(x, high: bool) -> L.Expr:
        bits = L.BinOp("&", x, L.Const(0xFFFF0000, T.uint32)) if high else \
            L.BinOp("<<", x, L.Const(16, T.uint32))
        return L.call("bitcast", bits, dtype=T.float32)

    high = L.call("fma", half(a, True), half(b, True), acc)
    return L.call("fma", half(a, False), half(b, False), high)


def _dot_u8s8x4(e, ctx):
    """dot_u8s8x4(acc, a, b) -> acc + sum over bytes t of ((a >> 8t) & 0xff) * ((b << (24 - 8t))
    >> 24 arithmetic) in int32: the widening path (exact; no int16 step that could saturate
    as vpmaddubsw's does), shifts, ands and multiplies that vectorise on any CPU."""
    if not (isinstance(e, L.Call) and e.name == "dot_u8s8x4"):
        return None
    acc, a, b = e.args
    a = ctx.bind(a)
    b = ctx.bind(L.call("bitcast", b, dtype=T.int32))
    total = acc
    for t in range(4):
        byte = L.BinOp("&", L.BinOp(">>", a, L.Const(8 * t, T.uint32)), L.Const(0xFF, T.uint32))
        signed = L.BinOp(">>", L.BinOp("<<", b, L.Const(24 - 8 * t, T.int32)),
                         L.Const(24, T.int32))
        total = total + L.call("bitcast", byte, dtype=T.int32) * signed
    return total


def _pack_u8x4(e, ctx):
    """pack_u8x4(b0, b1, b2, b3) -> uint32(b0) | uint32(b1) << 8 | uint32(b2) << 16 |
    uint32(b3) << 24."""
    if not (isinstance(e, L.Call) and e.name == "pack_u8x4"):
        return None
    word = None
    for t, byte in enumerate(e.args):
        part = L.Cast(T.uint32, byte)
        part = part if t == 0 else L.BinOp("<<", part, L.Const(8 * t, T.uint32))
        word = part if word is None else L.BinOp("|", word, part)
    return word


def _float_to_int(e, ctx):
    """Float -> integer casts, defined for every input as x86's conversions (onnxruntime's
    and NumPy's results there; docs/semantics.md), with N the destination's bits:
    int32, int64: trunc(x) where it fits, else MIN (NaN and +-inf too) ->
      select(in, ftoi(select(in, x, 0)), MIN), in = -2**(N-1) <= x < 2**(N-1) (both bounds
      exact in float32 and float64; an x between -2**(N-1) - 1 and -2**(N-1) truncates to MIN,
      the fallback, anyway);
    int8, int16, uint8, uint16: int32(x) as above, then its low N bits: MIN's are 0, as
      ftoi(0)'s, so low bits of ftoi(select(in, x, 0)) with no second select; where x is
      clamped between constants inside int32 (a quantizer's saturation: min(max(v, lo), hi),
      NaN or in range) `in` is x == x;
    uint32, uint64: select(x >= 2**(N-1), sN(x - 2**(N-1)) ^ MIN, sN(x)) as unsigned bits,
      sN the signed conversion above (x - 2**(N-1) is exact where the result fits: Sterbenz).
    float16 and bfloat16 sources reach here as float32 (`narrow_float` runs first)."""
    if not (isinstance(e, L.Cast) and e.dtype.is_int and e.value.dtype.is_float) or \
            e.value.dtype in NARROW_FLOATS:
        return None
    src, dst = e.value.dtype, e.dtype
    bits = 8 * dst.itemsize
    if bits < 32:
        x = ctx.bind(e.value)
        inside = L.eq(x, x) if _clamped_inside_int32(e.value) else ctx.bind(
            L.logical_and(x >= L.Const(-(2.0 ** 31), src), x < L.Const(2.0 ** 31, src)))
        return L.Cast(dst, L.Call("ftoi", (L.Select(inside, x, L.Const(0.0, src)),), T.int32))
    signed = _SIGNED[dst.itemsize]
    minimum = L.const(-(1 << (bits - 1)), signed)
    half = L.Const(2.0 ** (bits - 1), src)
    x = ctx.bind(e.value)
    if dst.kind == "u":
        high = L.BinOp("^", L.Cast(signed, x - half), minimum)
        return L.Cast(dst, L.Select(x >= half, high, L.Cast(signed, x)))
    inside = ctx.bind(L.logical_and(x >= L.Const(-(2.0 ** (bits - 1)), src), x < half))
    safe = L.Select(inside, x, L.Const(0.0, src))
    return L.Select(inside, L.Call("ftoi", (safe,), dst), minimum)


def _clamped_inside_int32(x: L.Expr) -> bool:
    """Whether x is min(max(v, lo), hi) or max(min(v, hi), lo) of constants lo <= hi both
    inside int32's range: x is then in [lo, hi] or NaN (min and max propagate NaN)."""
    ops, bounds = [], []
    while isinstance(x, L.BinOp) and x.op in ("min", "max") and isinstance(x.b, L.Const):
        ops.append(x.op)
        bounds.append(x.b.value)
        x = x.a
    return sorted(ops) == ["max", "min"] and all(-(2.0 ** 31) <= b < 2.0 ** 31 for b in bounds)


def _sigmoid(e, ctx):
    """sigmoid(x) -> 1 / (1 + exp(neg(x)))."""
    if isinstance(e, L.Call) and e.name == "sigmoid":
        x = e.args[0]
        one = L.Const(1.0, x.dtype)
        return one / (one + L.call("exp", L.call("neg", x)))
    return None


def _rsqrt(e, ctx):
    """rsqrt(x) -> 1 / sqrt(x) (correctly rounded twice; an approximate rsqrt is not it)."""
    if isinstance(e, L.Call) and e.name == "rsqrt":
        x = e.args[0]
        return L.Const(1.0, x.dtype) / L.call("sqrt", x)
    return None


def _sign(e, ctx):
    """sign(x) -> select(x < 0, -1, select(x > 0, 1, 0)); unsigned: select(x > 0, 1, 0);
    float: NaN -> NaN (x itself)."""
    if not (isinstance(e, L.Call) and e.name == "sign"):
        return None
    x = ctx.bind(e.args[0])
    dt = x.dtype
    zero, one = L.const(0, dt), L.const(1, dt)
    out = L.Select(x > zero, one, zero)
    if dt.kind == "u":
        return out
    out = L.Select(x < zero, L.const(-1, dt), out)
    return L.Select(L.ne(x, x), x, out) if dt.is_float else out


def _isnan(e, ctx):
    """isnan(x) -> x != x (floats; `!=` is unordered); isnan(integer) -> false."""
    if isinstance(e, L.Call) and e.name == "isnan":
        x = e.args[0]
        if not x.dtype.is_float:
            return L.Const(False, T.bool_)
        x = ctx.bind(x)
        return L.ne(x, x)
    return None


def _isinf(e, ctx):
    """isinf(x) -> abs(x) == inf (floats); isinf(integer) -> false."""
    if isinstance(e, L.Call) and e.name == "isinf":
        x = e.args[0]
        if not x.dtype.is_float:
            return L.Const(False, T.bool_)
        return L.eq(L.call("abs", x), L.Const(float("inf"), x.dtype))
    return None


def _not(e, ctx):
    """not(x: bool) -> x ^ true; not(x: number) -> x == 0 (NumPy's logical_not)."""
    if isinstance(e, L.Call) and e.name == "not":
        x = e.args[0]
        if x.dtype.kind == "b":
            return L.BinOp("^", x, L.Const(True, T.bool_))
        return L.eq(x, L.const(0, x.dtype))
    return None


def _int_abs_neg(e, ctx):
    """neg(x: int) -> 0 - x; abs(x: int) -> select(x < 0, 0 - x, x); abs(x: uint) -> x
    (wrapping: abs(MIN) is MIN, as NumPy)."""
    if not (isinstance(e, L.Call) and e.name in ("abs", "neg") and e.args[0].dtype.is_int):
        return None
    x = e.args[0]
    zero = L.const(0, x.dtype)
    if e.name == "neg":
        return L.BinOp("-", zero, x)
    if x.dtype.kind == "u":
        return x
    x = ctx.bind(x)
    return L.Select(x < zero, L.BinOp("-", zero, x), x)


def _float_div_mod(e, ctx):
    """float x // y -> floor(x / y); float x % y -> fmod(x, y)."""
    if isinstance(e, L.BinOp) and e.dtype.is_float and e.op in ("//", "%"):
        if e.op == "//":
            return L.call("floor", L.BinOp("/", e.a, e.b))
        return L.call("fmod", e.a, e.b)
    return None


def _int_div_mod(e, ctx):
    """Integer a / b (truncating), a // b and a % b (floor), never trapping (BinOp's rule):
    b' = select(b == 0 or (a == MIN and b == -1), 1, b), the result 0 where b == 0 (by 1,
    MIN's quotient is MIN and its remainder 0, as wanted). Floor from truncation:
    q = idiv(a, b'), r = irem(a, b'), adjust = r != 0 and (r < 0) != (b' < 0);
    a // b' = q - adjust, a % b' = select(adjust, r + b', r). Bounds: no guard when b > 0;
    for signed a >= 0, b > 0, floor is the unsigned quotient (cheaper: a shift for 2**k)."""
    if not (isinstance(e, L.BinOp) and e.op in ("/", "//", "%") and e.dtype.is_int):
        return None
    dt, op = e.dtype, e.op
    signed = dt.kind == "i"
    ba, bb = ctx.bounds(e.a), ctx.bounds(e.b)
    name = "idiv" if op in ("/", "//") else "irem"
    if signed and op != "/" and ba.lo is not None and ba.lo >= 0 and \
            bb.lo is not None and bb.lo > 0:
        u = _UNSIGNED[dt.itemsize]
        return L.Cast(dt, L.Call(name, (L.Cast(u, e.a), L.Cast(u, e.b)), u))
    guarded = bb.lo is None or bb.lo <= 0
    floor = signed and op != "/"
    minus_one = signed and (bb.lo is None or bb.lo <= -1) and (bb.hi is None or bb.hi >= -1)
    a, b = e.a, e.b
    zero = L.const(0, dt)
    if floor or (guarded and minus_one):   # a read more than once
        a = ctx.bind(a)
    if guarded:
        b = ctx.bind(b)
        by_zero = ctx.bind(L.eq(b, zero))
        unsafe = by_zero
        if minus_one:
            minimum = L.const(-(1 << (8 * dt.itemsize - 1)), dt)
            unsafe = L.logical_or(unsafe, L.logical_and(L.eq(a, minimum), L.eq(b, -1)))
        b = L.Select(unsafe, L.const(1, dt), b)
    if not floor:
        out = L.Call(name, (a, b), dt)
    else:
        b = ctx.bind(b)
        r = ctx.bind(L.Call("irem", (a, b), dt))
        adjust = L.logical_and(L.ne(r, zero), L.ne(r < zero, b < zero))
        if op == "//":
            out = L.Call("idiv", (a, b), dt) - L.Cast(dt, adjust)
        else:
            adjust = ctx.bind(adjust)
            out = L.Select(adjust, r + b, r)
    return L.Select(by_zero, L.const(0, dt), out) if guarded else out


RULES: dict[str, Callable] = {
    "narrow_float": _narrow_float,
    "f16_from_f64": _f16_from_f64,
    "bf16_cast": _bf16_cast,
    "dot_bf16x2": _dot_bf16x2,
    "dot_u8s8x4": _dot_u8s8x4,
    "pack_u8x4": _pack_u8x4,
    "float_to_int": _float_to_int,
    "sigmoid": _sigmoid,
    "rsqrt": _rsqrt,
    "sign": _sign,
    "isnan": _isnan,
    "isinf": _isinf,
    "not": _not,
    "int_abs_neg": _int_abs_neg,
    "float_div_mod": _float_div_mod,
    "int_div_mod": _int_div_mod,
}
"""Rule name -> rule, tried in this order; `narrow_float` comes first so that an expansion on
float16 data runs in float32 and is rounded once, as the op it expands."""


# ---------------------------------------------------------------------------------------------
# The pass


def legalize(func: L.PrimFunc, native: frozenset[str] = frozenset()) -> L.PrimFunc:
    """`func` with every op a rule expands (except the rules named in `native`) expanded."""
    unknown = set(native) - set(RULES)
    if unknown:
        raise ValueError(f"unknown legalize rules {sorted(unknown)}; known: {sorted(RULES)}")
    return _Legalizer(func, [r for name, r in RULES.items() if name not in native]).run()


def illegal_ops(func: L.PrimFunc, native: frozenset[str] = frozenset()) -> list[str]:
    """The printed expressions of `func` that a rule not in `native` would still rewrite
    (and any Reduce): empty once `func` is legal for a renderer declaring `native`."""
    rules = [r for name, r in RULES.items() if name not in native]
    probe = _Probe()
    found: list[str] = []
    seen: set[int] = set()

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, L.Reduce) or isinstance(node, L.Expr) and \
                any(r(node, probe) is not None for r in rules):
            found.append(L.print_expr(node))
            return
        if isinstance(node, (L.Load, L.Store, L.Allocate)):
            for d in node.buffer.shape:
                visit(d)
        for child in L.children(node):
            visit(child)

    for b in func.params:
        for d in b.shape:
            visit(d)
    visit(func.body)
    return found


def check_legal(func: L.PrimFunc, native: frozenset[str] = frozenset()) -> None:
    """Raise IllegalOpError naming every op of `func` its renderer would have to expand."""
    found = illegal_ops(func, native)
    if found:
        raise IllegalOpError(f"{func.name}: not legalized: {', '.join(found[:8])}"
                             f"{', ...' if len(found) > 8 else ''}")


class _Probe:
    """The context `illegal_ops` matches rules with: nothing known, nothing bound."""

    @staticmethod
    def bounds(e):
        return L.UNBOUNDED

    @staticmethod
    def bind(e):
        return e


class _Legalizer:
    """One pass over a PrimFunc: statements in order with the bounds of the loop and let
    variables in scope (as the renderer had them), expressions bottom-up through the rules."""

    def __init__(self, func: L.PrimFunc, rules: list[Callable]):
        self.func = func
        self.rules = rules
        self.env: dict[L.Var, L.Bounds] = {v: L.Bounds(1, None) for v in func.size_vars}
        self.taken = {n.name for n in L.walk(func.body) if isinstance(n, L.Var)} | \
            {v.name for v in func.size_vars}
        self.fresh = 0
        self.buffers: dict[L.Buffer, L.Buffer] = {}
        self.bindings: list[tuple[L.Var, L.Expr]] | None = None   # the statement's Lets
        self.bound: dict[L.Expr, L.Var] = {}
        self.memo: dict[int, tuple[L.Expr, L.Expr]] = {}
        self.origin: dict[int, tuple[L.Expr, L.Expr]] = {}   # id -> (node, its original)

    def run(self) -> L.PrimFunc:
        f = self.func
        params = tuple(self.buffer(b) for b in f.params)
        return L.PrimFunc(f.name, params, self.stmt(f.body), f.size_vars, f.attrs)

    # -- context for rules ------------------------------------------------------------------

    def bounds(self, e: L.Expr) -> L.Bounds:
        """Bounds of `e`, read from the expression it was legalized from (rewritten index
        arithmetic, such as an unsigned division, hides them)."""
        return L.bounds(self._origin(e), self.env)

    def bind(self, e: L.Expr) -> L.Expr:
        """A name for `e` that can be read many times: a Let around the current statement."""
        if isinstance(e, (L.Var, L.Const)) or self.bindings is None:
            return e
        e = self.expr(e)
        known = self.bound.get(e)
        if known is not None:
            return known
        while True:
            self.fresh += 1
            name = f"_t{self.fresh}"
            if name not in self.taken:
                break
        var = L.Var(name, e.dtype)
        self.env[var] = self.bounds(e)
        self.bindings.append((var, e))
        self.bound[e] = var
        return var

    # -- statements -------------------------------------------------------------------------

    def stmt(self, s: L.Stmt) -> L.Stmt:
        emit = _STATEMENTS.get(type(s))
        if emit is None:
            raise IllegalOpError(f"{self.func.name}: cannot legalize {s!r}")
        return emit(self, s)

    def own(self, legalize_head: Callable):
        """Run `legalize_head` (a statement's own expressions, not its body) with bindings
        of its own; returns its result and the statement with those Lets around it."""
        outer = self.bindings, self.memo, self.bound
        self.bindings, self.memo, self.bound = [], {}, {}
        try:
            head = legalize_head()
            bindings = self.bindings
        finally:
            self.bindings, self.memo, self.bound = outer

        def wrap(out: L.Stmt) -> L.Stmt:
            for var, value in reversed(bindings):
                out = L.Let(var, value, out)
            return out
        return head, wrap

    # each statement's body is a statement of its own, inside the scope of its head's Lets

    def seq(self, s: L.Seq) -> L.Stmt:
        return L.seq(*(self.stmt(x) for x in s.stmts))

    def allocate(self, s: L.Allocate) -> L.Stmt:
        return L.Allocate(self.buffer(s.buffer), self.stmt(s.body))

    def barrier(self, s: L.Barrier) -> L.Stmt:
        return s

    def loop(self, s: L.For) -> L.Stmt:
        def head():
            extent = self.expr(s.extent)
            hi = L.bounds(s.extent, self.env).hi
            self.env[s.var] = L.Bounds(0, None if hi is None else hi - 1)
            return extent
        extent, wrap = self.own(head)
        return wrap(L.For(s.var, extent, self.stmt(s.body), s.kind))

    def let(self, s: L.Let) -> L.Stmt:
        def head():
            value = self.expr(s.value)
            self.env[s.var] = L.bounds(s.value, self.env)
            return value
        value, wrap = self.own(head)
        return wrap(L.Let(s.var, value, self.stmt(s.body)))

    def if_(self, s: L.If) -> L.Stmt:
        cond, wrap = self.own(lambda: self.expr(s.cond))
        return wrap(L.If(cond, self.stmt(s.then),
                         None if s.orelse is None else self.stmt(s.orelse)))

    def store(self, s: L.Store) -> L.Stmt:
        (buffer, indices, value), wrap = self.own(lambda: (
            self.buffer(s.buffer), tuple(self.expr(i) for i in s.indices), self.expr(s.value)))
        return wrap(L.Store(buffer, indices, value))

    def mma(self, s: L.Mma) -> L.Stmt:
        (acc, offset, a, b), wrap = self.own(lambda: (
            self.buffer(s.acc), self.expr(s.offset), tuple(self.expr(x) for x in s.a),
            tuple(self.expr(x) for x in s.b)))
        return wrap(L.Mma(s.precision, acc, offset, a, b))

    def leaf(self, s: L.Stmt) -> L.Stmt:
        """A statement of expressions only (prefetches, ldmatrix, cp.async, wgmma and their
        groups and fences, tile products): each legal."""
        out, wrap = self.own(lambda: L.map_exprs(s, self.expr))
        return wrap(out)

    def buffer(self, b: L.Buffer) -> L.Buffer:
        """`b` with its shape legal (once per buffer, so every access names the same one;
        templates may read a parameter through a view of another shape, under its name)."""
        known = self.buffers.get(b)
        if known is None:
            outer = self.bindings, self.memo
            self.bindings, self.memo = None, {}
            shape = tuple(self.expr(d) for d in b.shape)
            self.bindings, self.memo = outer
            known = b if shape == b.shape else L.Buffer(b.name, b.dtype, shape, b.scope)
            self.buffers[b] = known
        return known

    # -- expressions ------------------------------------------------------------------------

    def expr(self, e: L.Expr) -> L.Expr:
        hit = self.memo.get(id(e))
        if hit is not None:
            return hit[1]
        out = self._children(e)
        for rule in self.rules:
            new = rule(out, self)
            if new is not None:
                self.origin.setdefault(id(new), (new, self._origin(out)))
                out = self.expr(new)
                break
        self.memo[id(e)] = (e, out)
        self.memo[id(out)] = (out, out)
        self.origin.setdefault(id(out), (out, e))
        return out

    def _origin(self, e: L.Expr) -> L.Expr:
        """The expression `e` was legalized from, through every rewrite (each entry holds
        its node, so that no other node can take its id while the pass runs)."""
        for _ in range(64):   # (a chain is as long as the rewrites of one node)
            hit = self.origin.get(id(e))
            if hit is None or hit[1] is e:
                break
            e = hit[1]
        return e

    def _children(self, e: L.Expr) -> L.Expr:
        if isinstance(e, (L.Var, L.Const)):
            return e
        if isinstance(e, L.Load):
            return L.Load(self.buffer(e.buffer), tuple(self.expr(i) for i in e.indices))
        changes = {}
        for name, value in _fields(e).items():
            if isinstance(value, L.Expr):
                new = self.expr(value)
            elif isinstance(value, tuple) and value and isinstance(value[0], L.Expr):
                new = tuple(self.expr(v) for v in value)
                if all(x is y for x, y in zip(new, value)):
                    continue
            else:
                continue
            if new is not value:
                changes[name] = new
        return type(e)(**{**_fields(e), **changes}) if changes else e


_STATEMENTS: dict[type, Callable] = {
    L.Seq: _Legalizer.seq, L.Allocate: _Legalizer.allocate, L.Barrier: _Legalizer.barrier,
    L.For: _Legalizer.loop, L.Let: _Legalizer.let, L.If: _Legalizer.if_,
    L.Store: _Legalizer.store, L.Mma: _Legalizer.mma,
    **{kind: _Legalizer.leaf for kind in (L.Prefetch, L.LdMatrix, L.CopyAsync, L.AsyncCommit,
                                          L.AsyncWait, L.Wgmma, L.WgmmaFence, L.WgmmaCommit, L.WgmmaWait,
                                          L.ProxyFence, L.ClusterBarrier, L.Mbarrier, L.TmaLoad,
                                          L.TileProduct)},
}


def _fields(node) -> dict:
    return {name: getattr(node, name) for name in L.field_names(node)}
