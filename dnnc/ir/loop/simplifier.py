"""The operator IR's simplifier: rule tables over expressions, with bounds of loop variables.

`EXPR_RULES` is a table of small rule functions, each naming its identity and returning None for
"no match"; `simplify_expr` applies a table bottom-up to a fixpoint, and `simplify` walks
statements, feeding loop bounds to the rules. Rules must never change a program's meaning for
any value of its symbolic sizes (which are known only to be positive).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

from .. import types as T
from .nodes import (
    Allocate, BinOp, Call, Cast, Const, Expr, For, ForKind, If, Let, Load, Prefetch, PrimFunc,
    Select, Seq, Store, Var, seq)
from .traversal import _replace, substitute, transform


@dataclass(frozen=True)
class Bounds:
    """Inclusive integer bounds; None is unbounded."""

    lo: int | None
    hi: int | None

    def within(self, lo: int, hi: int) -> bool:
        return self.lo is not None and self.hi is not None and lo <= self.lo and self.hi <= hi


UNBOUNDED = Bounds(None, None)


def bounds(e: Expr, env: dict[Var, Bounds]) -> Bounds:
    """Bounds of an integer expression given bounds of its vars (interval arithmetic)."""
    if isinstance(e, Const) and e.dtype.is_int:
        return Bounds(e.value, e.value)
    if isinstance(e, Var):
        return env.get(e, UNBOUNDED)
    if isinstance(e, BinOp) and e.dtype.is_int:
        a, b = bounds(e.a, env), bounds(e.b, env)
        if e.op == "+":
            return Bounds(_opt(operator.add, a.lo, b.lo), _opt(operator.add, a.hi, b.hi))
        if e.op == "-":
            return Bounds(_opt(operator.sub, a.lo, b.hi), _opt(operator.sub, a.hi, b.lo))
        if e.op == "*" and None not in (a.lo, a.hi, b.lo, b.hi):
            corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
            return Bounds(min(corners), max(corners))
        if e.op == "*" and b.lo is not None and b.lo == b.hi and b.lo >= 0 and \
                a.lo is not None and a.lo >= 0:
            return Bounds(a.lo * b.lo, None if a.hi is None else a.hi * b.lo)
        if e.op == "//" and b.lo is not None and b.lo == b.hi and b.lo > 0:
            return Bounds(None if a.lo is None else a.lo // b.lo,
                          None if a.hi is None else a.hi // b.lo)
        if e.op == "%" and b.lo is not None and b.lo == b.hi and b.lo > 0:
            if a.within(0, b.lo - 1):
                return a
            return Bounds(0, b.lo - 1)
        if e.op == "//" and b.lo is not None and b.lo > 0 and a.lo is not None and a.lo >= 0:
            # a divisor known only to be positive (a block grouping's min(rows left, 8))
            return Bounds(0 if b.hi is None else a.lo // b.hi,
                          None if a.hi is None else a.hi // b.lo)
        if e.op == "%" and b.lo is not None and b.lo > 0:
            hi = None if b.hi is None else b.hi - 1
            if a.lo is not None and a.lo >= 0:
                hi = _opt_keep(min, a.hi, hi)
            return Bounds(0, hi)
        if e.op == "min":
            return Bounds(_opt(min, a.lo, b.lo), _opt_keep(min, a.hi, b.hi))
        if e.op == "max":
            return Bounds(_opt_keep(max, a.lo, b.lo), _opt(max, a.hi, b.hi))
    return UNBOUNDED


MAX_DIVISOR = 64


def divisor(e: Expr, env: dict[Var, int]) -> int:
    """A power of two (at most MAX_DIVISOR) known to divide the integer `e`, given those of
    its vars (`env`; a var not there: 1). Sound under wrapping, since every power of two up to
    MAX_DIVISOR divides 2**32 and 2**64: a vectorizer proves an offset aligned with it."""
    if isinstance(e, Const) and e.dtype.is_int:
        return math.gcd(int(e.value), MAX_DIVISOR)
    if isinstance(e, Var):
        return env.get(e, 1)
    if isinstance(e, Cast) and e.dtype.is_int and e.value.dtype.is_int:
        return divisor(e.value, env)
    if isinstance(e, Select):
        return math.gcd(divisor(e.true, env), divisor(e.false, env))
    if isinstance(e, BinOp) and e.dtype.is_int:
        a, b = divisor(e.a, env), divisor(e.b, env)
        if e.op in ("+", "-", "min", "max"):
            return math.gcd(a, b)
        if e.op == "*":
            return math.gcd(a * b, MAX_DIVISOR)
        if e.op == "%" and isinstance(e.b, Const):
            return math.gcd(a, b)
        if e.op == "<<" and isinstance(e.b, Const) and 0 <= e.b.value < 8:
            return math.gcd(a << int(e.b.value), MAX_DIVISOR)
    return 1


def _opt(fn, a, b):
    return None if a is None or b is None else fn(a, b)


def _opt_keep(fn, a, b):
    """min of upper bounds / max of lower bounds: one known side suffices."""
    if a is None:
        return b
    if b is None:
        return a
    return fn(a, b)


def _is_const(e, value=None) -> bool:
    return isinstance(e, Const) and (value is None or e.value == value)


def _int_const(e) -> int | None:
    return e.value if isinstance(e, Const) and e.dtype.is_int else None


_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul, "min": min, "max": max,
         "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
         ">": operator.gt, ">=": operator.ge, "&": operator.and_, "|": operator.or_,
         "^": operator.xor, "and": lambda a, b: a and b, "or": lambda a, b: a or b}


def _fold_constants(e, env):
    """c1 op c2 -> c (integer // and % follow floor semantics; float / folds too)."""
    if not isinstance(e, BinOp) or not (_is_const(e.a) and _is_const(e.b)):
        return None
    a, b = e.a.value, e.b.value
    if e.op in _FOLD:
        return Const(_FOLD[e.op](a, b), e.dtype) if e.op not in ("&", "|", "^") or \
            e.dtype.is_int else None
    if e.op in ("//", "%") and e.dtype.is_int and b not in (0, -1):   # (see BinOp)
        return Const(a // b if e.op == "//" else a % b, e.dtype)
    if e.op == "/" and e.dtype.is_float and b != 0:
        return Const(a / b, e.dtype)
    return None


def _identities(e, env):
    """x+0 -> x, 0+x -> x, x-0 -> x, x*1 -> x, 1*x -> x, x*0 -> 0 (ints), x//1 -> x,
    x%1 -> 0, x-x -> 0 (ints), min(x,x) -> x, max(x,x) -> x, x/1 -> x."""
    if not isinstance(e, BinOp):
        return None
    a, b, op = e.a, e.b, e.op
    if op == "+":
        if _is_const(b, 0):
            return a
        if _is_const(a, 0):
            return b
    if op == "-":
        if _is_const(b, 0):
            return a
        if a == b and e.dtype.is_int:
            return Const(0, e.dtype)
    if op == "*":
        if _is_const(b, 1):
            return a
        if _is_const(a, 1):
            return b
        if e.dtype.is_int and (_is_const(a, 0) or _is_const(b, 0)):
            return Const(0, e.dtype)
    if op in ("//", "/") and _is_const(b, 1):
        return a
    if op == "%" and _is_const(b, 1) and e.dtype.is_int:
        return Const(0, e.dtype)
    if op in ("min", "max") and a == b:
        return a
    return None


def _canonical_order(e, env):
    """c + x -> x + c, c * x -> x * c: constants to the right, so later rules see one form."""
    if isinstance(e, BinOp) and e.op in ("+", "*", "min", "max") and _is_const(e.a) and \
            not _is_const(e.b):
        return BinOp(e.op, e.b, e.a)
    return None


def _reassociate(e, env):
    """(x + c1) + c2 -> x + (c1+c2); (x * c1) * c2 -> x * (c1*c2); (x + c1) - c2 -> x + (c1-c2)."""
    if not (isinstance(e, BinOp) and e.dtype.is_int and _is_const(e.b)):
        return None
    a = e.a
    if isinstance(a, BinOp) and _is_const(a.b):
        if e.op == "+" and a.op == "+":
            return BinOp("+", a.a, Const(a.b.value + e.b.value, e.dtype))
        if e.op == "-" and a.op == "+":
            return BinOp("+", a.a, Const(a.b.value - e.b.value, e.dtype))
        if e.op == "*" and a.op == "*":
            return BinOp("*", a.a, Const(a.b.value * e.b.value, e.dtype))
    return None


def _div_mod(e, env):
    """Bounds-aware division by positive constants:
    (x*c)//c -> x; (x*c + y)//c -> x + y//c and (x*c + y)%c -> y%c when c > 0;
    x//c -> 0 and x%c -> x when 0 <= x < c; (x*(c*k))//c -> x*k; (x*(c*k))%c -> 0."""
    if not (isinstance(e, BinOp) and e.op in ("//", "%") and e.dtype.is_int):
        return None
    c = _int_const(e.b)
    if c is None or c <= 0:
        return None
    x = e.a
    if bounds(x, env).within(0, c - 1):
        return Const(0, e.dtype) if e.op == "//" else x
    if isinstance(x, BinOp) and x.op == "*":
        k = _int_const(x.b)
        if k is not None and k % c == 0:
            if e.op == "%":
                return Const(0, e.dtype)
            return x.a if k == c else BinOp("*", x.a, Const(k // c, e.dtype))
    if isinstance(x, BinOp) and x.op == "+":
        for left, right in ((x.a, x.b), (x.b, x.a)):
            if isinstance(left, BinOp) and left.op == "*":
                k = _int_const(left.b)
                if k is not None and k % c == 0:
                    scaled = left.a if k == c else BinOp("*", left.a, Const(k // c, e.dtype))
                    if e.op == "%":
                        return BinOp("%", right, e.b)
                    return BinOp("+", scaled, BinOp("//", right, e.b))
    return None


def _terms(e) -> list:
    """The addends of a chain of integer sums."""
    if isinstance(e, BinOp) and e.op == "+" and e.dtype.is_int:
        return _terms(e.a) + _terms(e.b)
    return [e]


def _sum(terms: list, dtype) -> Expr:
    out = terms[0]
    for t in terms[1:]:
        out = BinOp("+", out, t)
    return out


def _split_small_addend(e, env):
    """(x + y) % c -> x % c + y and (x + y) // c -> x // c, when every addend of x is a
    multiple of some g dividing c, x >= 0 and 0 <= y < g: x % c is then a multiple of g at
    most c - g, so adding y carries nothing into the quotient. (A vector lane y over an
    offset x aligned to the vector: `(j0 + v) % 64` -> `j0 % 64 + v`, which a vectorizer
    sees as base + lane.)"""
    if not (isinstance(e, BinOp) and e.op in ("//", "%") and e.dtype.is_int):
        return None
    c = _int_const(e.b)
    terms = _terms(e.a)
    if c is None or c <= 1 or len(terms) < 2:
        return None
    multiples = [divisor(t, {}) for t in terms]
    g = math.gcd(c, MAX_DIVISOR)
    while g > 1:
        x = [t for t, d in zip(terms, multiples) if d % g == 0]
        y = [t for t, d in zip(terms, multiples) if d % g != 0]
        if x and y and c % g == 0:
            xs, ys = _sum(x, e.dtype), _sum(y, e.dtype)
            lo = bounds(xs, env).lo
            if lo is not None and lo >= 0 and bounds(ys, env).within(0, g - 1):
                quotient = BinOp(e.op, xs, e.b)
                return quotient if e.op == "//" else BinOp("+", quotient, ys)
        g //= 2
    return None


def _scaled_terms(e, s: int = 1) -> list:
    """The addends of integer sum e as (x, k) pairs, e = sum of x * k, through constant
    multiples of inner sums ((a + b) * 4 -> (a, 4), (b, 4))."""
    if isinstance(e, BinOp) and e.op == "+" and e.dtype.is_int:
        return _scaled_terms(e.a, s) + _scaled_terms(e.b, s)
    if isinstance(e, BinOp) and e.op == "*" and e.dtype.is_int:
        for x, k in ((e.a, _int_const(e.b)), (e.b, _int_const(e.a))):
            if k is not None:
                return _scaled_terms(x, s * k)
    return [(e, s)]


def _quotient_of(e) -> tuple:
    """(x, d) for e = x // d1 // d2 ... of positive constants, d = d1 d2 ... (floor divisions
    by positive constants compose: (x // a) // b = x // (a b)); (e, 1) for any other e."""
    d = 1
    while isinstance(e, BinOp) and e.op == "//" and (_int_const(e.b) or 0) > 0:
        d *= e.b.value
        e = e.a
    return e, d


def _recombine_div_mod(e, env):
    """(x//c)*(c s) + (x%c)*s -> x*s among the addends of a sum, where the quotient may be
    spelt as nested divisions of x's own root: y//(a c) with x = y//a (floor division and
    modulo by positive constants: identities for every integer). Rows unravelled into
    (n, h, w) and ravelled again fold back to the row (`linearize`'s offsets through a
    layout tail); `_split_small_addend` leaves a lane beside them: (x//c)*c + (x%c + v) ->
    x + v."""
    if not (isinstance(e, BinOp) and e.op == "+" and e.dtype.is_int):
        return None
    scaled = _scaled_terms(e)
    for m, (q, s) in enumerate(scaled):
        c = _int_const(q.b) if isinstance(q, BinOp) and q.op == "%" else None
        if c is None or c <= 0:
            continue
        root, d = _quotient_of(q.a)
        for k, (p, s_p) in enumerate(scaled):
            if k != m and s_p == c * s and isinstance(p, BinOp) and p.op == "//" and \
                    _quotient_of(p) == (root, d * c):
                kept = [(q.a, s)] + [t for i, t in enumerate(scaled) if i not in (k, m)]
                return _sum([x if f == 1 else BinOp("*", x, Const(f, x.dtype))
                             for x, f in kept], e.dtype)
    return None


def _bounded_compare(e, env):
    """Comparisons and min/max decided by bounds (i < n with i in [0, n-1] -> true)."""
    if not (isinstance(e, BinOp) and e.a.dtype.is_int):
        return None
    a, b = bounds(e.a, env), bounds(e.b, env)
    verdict = None
    if e.op == "<":
        verdict = _decide(a.hi, b.lo, a.lo, b.hi, strict=True)
    elif e.op == "<=":
        verdict = _decide(a.hi, b.lo, a.lo, b.hi, strict=False)
    elif e.op == ">":
        verdict = _decide(b.hi, a.lo, b.lo, a.hi, strict=True)
    elif e.op == ">=":
        verdict = _decide(b.hi, a.lo, b.lo, a.hi, strict=False)
    elif e.op in ("min", "max"):
        a_le_b = _decide(a.hi, b.lo, a.lo, b.hi, strict=False)
        if a_le_b is not None:
            return (e.a if a_le_b else e.b) if e.op == "min" else (e.b if a_le_b else e.a)
        return None
    return None if verdict is None else Const(verdict, T.bool_)


def _decide(a_hi, b_lo, a_lo, b_hi, strict: bool):
    """True when a < b (or <=) for all values, False when never, None when unknown."""
    if a_hi is not None and b_lo is not None and (a_hi < b_lo if strict else a_hi <= b_lo):
        return True
    if a_lo is not None and b_hi is not None and (a_lo >= b_hi if strict else a_lo > b_hi):
        return False
    return None


def _select_const(e, env):
    """select(true, a, b) -> a; select(false, a, b) -> b; select(c, a, a) -> a."""
    if isinstance(e, Select):
        if _is_const(e.cond):
            return e.true if e.cond.value else e.false
        if e.true == e.false:
            return e.true
    return None


def _cast_same(e, env):
    """Cast to the value's own dtype -> the value; casts of constants fold."""
    if isinstance(e, Cast):
        if e.value.dtype is e.dtype:
            return e.value
        if isinstance(e.value, Const):
            if e.dtype.is_float:
                return Const(float(e.value.value), e.dtype)
            if e.dtype.is_int and e.value.dtype.is_int:
                return Const(int(e.value.value), e.dtype)
    return None


def _proven_index(e, env):
    """check_index(i, n, site) -> i when bounds prove -n <= i < n (nothing can fail)."""
    if isinstance(e, Call) and e.name == "check_index" and _is_const(e.args[1]):
        n = e.args[1].value
        if bounds(e.args[0], env).within(-n, n - 1):
            return e.args[0]
    return None


EXPR_RULES: list[Callable] = [_fold_constants, _canonical_order, _identities, _reassociate,
                              _div_mod, _split_small_addend, _recombine_div_mod,
                              _bounded_compare, _select_const, _cast_same, _proven_index]
"""Index and value rewrites; each takes (expr, var bounds) and returns a replacement or None."""


def simplify_expr(e: Expr, env: dict[Var, Bounds] | None = None,
                  rules: list[Callable] = EXPR_RULES) -> Expr:
    """Apply `rules` bottom-up until nothing changes."""
    env = env or {}

    def rewrite(node):
        if not isinstance(node, Expr):
            return None
        changed = False
        for _ in range(64):
            for rule in rules:
                out = rule(node, env)
                if out is not None and out != node:
                    # the replacement's own children may now match rules again
                    node = simplify_expr(out, env, rules) if not isinstance(out, (Var, Const)) \
                        else out
                    changed = True
                    break
            else:
                break
        return node if changed else None

    return transform(e, rewrite)


def simplify(node, env: dict[Var, Bounds] | None = None):
    """Simplify every expression in a statement or function, using loop bounds; loops of
    extent 1 become their body with the var replaced by 0; `if true` disappears."""
    if isinstance(node, PrimFunc):
        sizes = {v: Bounds(1, None) for v in node.size_vars}  # symbolic sizes are positive
        return _replace(node, {"body": simplify(node.body, {**sizes, **(env or {})})})
    if isinstance(node, Expr):
        return simplify_expr(node, env)
    env = dict(env or {})
    s = node
    if isinstance(s, For):
        extent = simplify_expr(s.extent, env)
        hi = bounds(extent, env).hi
        inner = dict(env)
        inner[s.var] = Bounds(0, None if hi is None else hi - 1)
        body = simplify(s.body, inner)
        if _is_const(extent, 1) and s.kind in (ForKind.SERIAL, ForKind.UNROLLED,
                                                ForKind.VECTORIZED, ForKind.PARALLEL):
            return simplify(substitute(body, {s.var: Const(0, s.var.dtype)}), env)
        return For(s.var, extent, body, s.kind)
    if isinstance(s, Store):
        return Store(s.buffer, tuple(simplify_expr(i, env) for i in s.indices),
                     simplify_expr(s.value, env))
    if isinstance(s, Let):
        value = simplify_expr(s.value, env)
        inner = dict(env)
        inner[s.var] = bounds(value, env)
        return Let(s.var, value, simplify(s.body, inner))
    if isinstance(s, If):
        cond = simplify_expr(s.cond, env)
        if _is_const(cond):
            if cond.value:
                return simplify(s.then, env)
            return simplify(s.orelse, env) if s.orelse is not None else Seq(())
        return If(cond, simplify(s.then, env),
                  None if s.orelse is None else simplify(s.orelse, env))
    if isinstance(s, Prefetch):
        return Prefetch(Load(s.at.buffer, tuple(simplify_expr(i, env) for i in s.at.indices)))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, simplify(s.body, env))
    if isinstance(s, Seq):
        return seq(*(simplify(x, env) for x in s.stmts))
    return s
