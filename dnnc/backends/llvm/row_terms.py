"""Rows that compute a term twice compute it once: a fused row loop (`schedules`' rows
template, after `_fuse_rows` and `_split_reduction`) whose sum adds a costly term f(r) of
each element and whose last stage stores g(f(j)) for every element j of the same row,

    for r in R: acc += f(r);  s[row] = acc;  for j in R: y[row, j] = g(f(j), s[row])

(softmax: f = exp(x - max), g = f / sum), stores each term into the output row while it
sums them and reads it back in the last stage, `y[row, r] = f(r); acc += f(r); ... y[row, j]
= g(y[row, j])`; and a division of a row by a value fixed along it becomes a product with
its reciprocal, computed once (`_reciprocal`). 1 thread, znver5, softmax [4, 4, 256, 256]:
0.68 -> 0.42 ms (onnxruntime 0.21, which does the same).

It never changes which elements a loop writes nor the order of a sum's additions: the
terms are the values the sum took; the rewrite applies only where the sum's loops visit
every element of the row once (their trip counts add up to the row) and nothing else in
the row reads or writes the output. A reciprocal changes a quotient by at most an ulp or
so, and only for divisors the kernel computed itself (a statistic of the row: softmax's
sum, a norm), never a graph input's.
"""

from __future__ import annotations

import itertools

from ...ir import loop as L
from ...ir import types as T

def reuse_row_terms(n, names=None):
    """A `Seq` of a row's stages with its last stage's terms stored by its sum (module
    docstring); None where nothing applies (an `L.transform` rule; `names` numbers the
    terms' variables)."""
    names = itertools.count() if names is None else names
    if not isinstance(n, L.Seq) or len(n.stmts) < 2:
        return None
    last = n.stmts[-1]
    if not (isinstance(last, L.For) and isinstance(last.extent, L.Const) and
            isinstance(last.body, L.Store)):
        return None
    j, store = last.var, last.body
    y, idx = store.buffer, store.indices
    if not idx or idx[-1] != j or any(j in L.free_vars(e) for e in idx[:-1]) or \
            y.scope is L.Scope.LOCAL or any(_touches(s, y) for s in n.stmts[:-1]):
        return None
    for term in _terms(store.value, j):
        if term.dtype is not y.dtype:   # y could not hold the term unrounded (fp16, uint8 Y)
            continue
        for k, stmt in enumerate(n.stmts[:-1]):
            found = _store_terms(stmt, term, j, y, idx, last.extent.value, names)
            if found is None:
                continue
            value = _replace(store.value, term, L.Load(y, idx))
            if any(isinstance(x, L.Load) and x.buffer.name != y.name and
                   j in L.free_vars(x) for x in L.walk(value)):
                continue       # y may share memory with an input the last stage reads
            stmts = list(n.stmts)
            stmts[k] = found
            stmts[-1] = L.For(j, last.extent, L.Store(y, idx, value), last.kind)
            return L.Seq(tuple(stmts))
    return None


def _terms(value: L.Expr, j: L.Var) -> list[L.Expr]:
    """Calls (exp, erf, ...: what costs) in `value` that depend on `j`, outermost first."""
    return [x for x in L.walk(value) if isinstance(x, L.Call) and j in L.free_vars(x)]


def _touches(s: L.Stmt, y: L.Buffer) -> bool:
    return any(isinstance(x, (L.Load, L.Store)) and x.buffer.name == y.name for x in L.walk(s))


def _replace(e: L.Expr, old: L.Expr, new: L.Expr) -> L.Expr:
    return L.transform(e, lambda x: new if x == old else None)


def _store_terms(stmt: L.Stmt, term: L.Expr, j: L.Var, y: L.Buffer, idx: tuple,
                 extent: int, names) -> L.Stmt | None:
    """`stmt` with each `part[l] = part[l] + term(e)` (a float32 sum's update, e the element
    it adds) also storing term(e) at y[..., e]; None unless such updates exist and their trip
    counts add up to `extent` (each element of the row once)."""
    source = next((x for x in L.walk(term) if isinstance(x, L.Load) and x.indices and
                   x.indices[-1] == j), None)
    if source is None:
        return None
    visits = []

    def rule(s, trips: int):
        if not isinstance(s, L.Store) or s.buffer.scope is not L.Scope.LOCAL or \
                s.buffer.dtype is not T.float32 or not isinstance(s.value, L.BinOp) or \
                s.value.op != "+" or s.value.a != L.Load(s.buffer, s.indices):
            return None
        at = _element(s.value.b, source)
        if at is None or s.value.b != L.substitute(term, {j: at}):
            return None
        visits.append(trips)
        t = L.Var(f"term{next(names)}", T.float32)
        return L.Let(t, s.value.b, L.seq(
            L.Store(y, idx[:-1] + (at,), t),
            L.Store(s.buffer, s.indices, L.BinOp("+", L.Load(s.buffer, s.indices), t))))

    out = _rewrite(stmt, rule, 1)
    if not visits or out is None or sum(visits) != extent:
        return None
    return out


def _element(e: L.Expr, source: L.Load) -> L.Expr | None:
    """The last index of `e`'s load of `source`'s buffer at `source`'s other indices."""
    for x in L.walk(e):
        if isinstance(x, L.Load) and x.buffer.name == source.buffer.name and \
                x.indices[:-1] == source.indices[:-1]:
            return x.indices[-1]
    return None


def _rewrite(s: L.Stmt, rule, trips: int) -> L.Stmt | None:
    """`s` with `rule(store, trips)` applied to its stores (trips: the product of the
    enclosing loops' extents inside `s`); None where a loop's extent is not a constant."""
    if isinstance(s, L.Store):
        out = rule(s, trips)
        return s if out is None else out
    if isinstance(s, L.For):
        if not isinstance(s.extent, L.Const):
            return None
        body = _rewrite(s.body, rule, trips * s.extent.value)
        if body is None:
            return None
        kind = L.ForKind.SERIAL if body is not s.body and s.kind is L.ForKind.VECTORIZED \
            else s.kind
        return L.For(s.var, s.extent, body, kind)
    if isinstance(s, L.Seq):
        parts = [_rewrite(x, rule, trips) for x in s.stmts]
        return None if None in parts else L.Seq(tuple(parts))
    if isinstance(s, (L.Allocate, L.Let)):
        body = _rewrite(s.body, rule, trips)
        if body is None:
            return None
        return L.Allocate(s.buffer, body) if isinstance(s, L.Allocate) else \
            L.Let(s.var, s.value, body)
    return s


def reciprocal(n, internal: frozenset, names=None):
    """`for j: y[.., j] = a(j) / d` with d fixed along j and read only from `internal` (the
    buffers the kernel allocates, not its parameters) becomes `r = 1 / d; for j: y[.., j] =
    a(j) * r`: a vector division costs several products' time (an `L.transform` rule)."""
    if not isinstance(n, L.For) or not isinstance(n.body, L.Store) or \
            not isinstance(n.extent, L.Const) or n.extent.value < 4:
        return None
    divisors = []
    for x in L.walk(n.body.value):
        if isinstance(x, L.BinOp) and x.op == "/" and x.dtype is T.float32 and \
                n.var not in L.free_vars(x.b) and x.b not in divisors and \
                any(isinstance(e, L.Load) for e in L.walk(x.b)) and \
                all(e.buffer.name in internal for e in L.walk(x.b) if isinstance(e, L.Load)):
            divisors.append(x.b)
    if not divisors:
        return None
    names = itertools.count() if names is None else names
    body, lets = n.body, []
    for d in divisors:
        r = L.Var(f"rcp{next(names)}", T.float32)
        lets.append((r, L.BinOp("/", L.const(1.0, T.float32), d)))
        body = L.transform(body, lambda x, d=d, r=r: L.BinOp("*", x.a, r) if isinstance(
            x, L.BinOp) and x.op == "/" and x.b == d else None)
    out: L.Stmt = L.For(n.var, n.extent, body, n.kind)
    for r, v in reversed(lets):
        out = L.Let(r, v, out)
    return out


def reuse_terms(body: L.Stmt) -> L.Stmt:
    """`body` with `reuse_row_terms` and then `reciprocal` applied everywhere (the new
    variables numbered from 0: the same kernel gives the same code)."""
    names = itertools.count()
    body = L.transform(body, lambda n: reuse_row_terms(n, names))
    internal = frozenset(x.buffer.name for x in L.walk(body) if isinstance(x, L.Allocate))
    return L.transform(body, lambda n: reciprocal(n, internal, names))
