"""Run-time checks of gather indices: the `check_index` intrinsic and the error record it writes.

`check_index(value, size, site)` (int64) is `value`, and when `value` lies outside
[-size, size - 1] it records `(site + 1, value, size)` in the kernel's error record, the
int64[3] buffer `INDEX_ERRORS` (a trailing parameter of a kernel that checks: `with_errors`);
the first error a call meets wins (a compare-and-swap on the first word), later ones leave it.
`site` is the checking node's position in its segment's nodes (a constant), so a runtime names
the node from its graph alone (an artifact needs nothing more). The kernel goes on with the
index clamped (no load ever leaves its buffer); the runtime keeps the record zeroed between
calls, reads its first word after every call and raises `InputError`
(`backends.executable.index_error`), so a bad call answers nothing and the next good one runs
normally.

The compute rules of the gathers emit the check (`checked`) for the node whose lowering
`checking(site)` announces; outside a program's lowering (a rule evaluated alone) no site is
known and no check is emitted. Unlike every other intrinsic, the check has an effect: passes
may duplicate, hoist or drop it with the value it guards (a dead index needs no check) but
must never drop it while keeping the value: `strip` is for identities (tuning task keys), not
for code. `hoist` (the renderers') does a check a loop repeats unchanged once before the loop.

This module must never import a backend or the graph.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools

import numpy as np

from ...errors import IndexRangeError
from .. import types as T
from .nodes import (INDEX, Allocate, Buffer, Call, Const, Expr, For, If, Let, Load, PrimFunc,
                    Seq, Stmt, Store, Var, const)
from .traversal import free_vars, transform, walk

CHECK = "check_index"
INDEX_ERRORS = Buffer("dnnc_index_errors", T.int64, (3,))
"""The error record: [site + 1 (0 while no index was out of range), the index, the size]."""

_SITE: contextvars.ContextVar[int | None] = contextvars.ContextVar("dnnc_check_site",
                                                                   default=None)


@contextlib.contextmanager
def checking(site: int | None):
    """Compute rules run inside emit checks naming `site` (a node's position in its segment)."""
    token = _SITE.set(site)
    try:
        yield
    finally:
        _SITE.reset(token)


def checked(value: Expr, size: Expr) -> Expr:
    """`value` (an index into an axis of `size`), checked at run time when a site is known."""
    site = _SITE.get()
    if site is None:
        return value
    return Call(CHECK, (value, const(size), Const(site, INDEX)), INDEX)


def has_checks(node) -> bool:
    return any(isinstance(n, Call) and n.name == CHECK for n in walk(node))


def with_errors(func: PrimFunc) -> PrimFunc:
    """`func` with the error record as its last parameter when its body checks an index."""
    if INDEX_ERRORS in func.params or not has_checks(func.body):
        return func
    return dataclasses.replace(func, params=tuple(func.params) + (INDEX_ERRORS,))


def strip(node):
    """`node` with every check replaced by the value it checks (what the code computes)."""
    def drop(n):
        if isinstance(n, Call) and n.name == CHECK:
            return strip(n.args[0])
        return None
    return transform(node, drop)


def evaluate(value: np.ndarray, size: np.ndarray, site: np.ndarray) -> np.ndarray:
    """The check on NumPy arrays (the compute-rule evaluator's): `value`, or the reference's
    `IndexRangeError` for its first out-of-range element."""
    value, size = np.asarray(value), np.broadcast_to(size, np.shape(value))
    bad = (value < -size) | (value >= size)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise IndexRangeError(int(value.reshape(-1)[first]), int(size.reshape(-1)[first]))
    return value


def recorded(record) -> tuple[int, int, int] | None:
    """(site, index, size) of the error a record holds, or None."""
    flag = int(record[0])
    return None if flag == 0 else (flag - 1, int(record[1]), int(record[2]))


def hoist(func: PrimFunc, kinds: frozenset) -> PrimFunc:
    """`func` with each check that a loop of one of `kinds` repeats unchanged (its variables
    bound outside the loop, its loads of buffers the loop never stores) done once before the
    loop, in a `Let`, and the value it checks read in the loop: a gather fused into a row's
    reductions checks its index once a row, and the row's loops stay free of the check's
    branch (LLVM does not hoist it: the branch stores). Only loops of constant extent above
    0: a loop that never runs would check nothing. A body without checks (most kernels')
    is returned at once: each loop's three walks of its body took 4.6 of zoo resnet18's
    19.4 s in the LLVM renderer's `ModuleBuilder.add` (cProfile), which had no check."""
    if not has_checks(func.body):
        return func
    names = {n.name for n in walk(func.body) if isinstance(n, Var)}
    fresh = (Var(f"_check{k}", INDEX) for k in itertools.count()
             if f"_check{k}" not in names)
    return dataclasses.replace(func, body=_hoist(func.body, kinds, fresh, set()))


def _hoist(s: Stmt, kinds: frozenset, fresh, made: set) -> Stmt:
    """`s` with its loops' invariant checks hoisted, inner loops first; `made`: the Lets'
    variables hoisting made, never read (an outer loop drops an inner one it hoists further)."""
    if isinstance(s, For):
        body = _hoist(s.body, kinds, fresh, made)
        if s.kind not in kinds or not (isinstance(s.extent, Const) and s.extent.value > 0):
            return For(s.var, s.extent, body, s.kind)
        inner = {n.var for n in walk(body) if isinstance(n, (For, Let))} | {s.var}
        stored = {n.buffer.name for n in walk(body) if isinstance(n, (Store, Allocate))}
        found = list(dict.fromkeys(
            n for n in walk(body) if isinstance(n, Call) and n.name == CHECK and
            not free_vars(n) & inner and not any(
                isinstance(m, Load) and m.buffer.name in stored for m in walk(n))))
        if not found:
            return For(s.var, s.extent, body, s.kind)
        done = {c: c.args[0] for c in found}

        def checked_before(n):
            if isinstance(n, Let) and n.var in made and n.value in done.values():
                return n.body   # an inner loop's hoisted check: now done before this loop
            return done.get(n) if isinstance(n, Call) else None

        out: Stmt = For(s.var, s.extent, transform(body, checked_before), s.kind)
        for c in reversed(found):
            var = next(fresh)
            made.add(var)
            out = Let(var, c, out)
        return out
    if isinstance(s, Seq):
        return Seq(tuple(_hoist(x, kinds, fresh, made) for x in s.stmts))
    if isinstance(s, Let):
        return Let(s.var, s.value, _hoist(s.body, kinds, fresh, made))
    if isinstance(s, If):
        return If(s.cond, _hoist(s.then, kinds, fresh, made),
                  None if s.orelse is None else _hoist(s.orelse, kinds, fresh, made))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _hoist(s.body, kinds, fresh, made))
    return s
