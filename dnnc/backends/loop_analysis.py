"""Loop-nest analysis and rewrites every target's schedules share.

What a loop's iterations share (`carried`: a loop may run its iterations on several cores or
GPU threads only when it carries nothing), which consecutive loops walk the same rows
(`fuse_row_loops`: softmax's max, sum and normalisation become one loop over rows), the
accumulator updates a reduction makes (`update_op`), how a load walks its buffer as a loop
counts (`steps_contiguously`: whether GPU threads on that loop read consecutive addresses;
`runs_in_order`: whether a thread's contiguous iterations touch contiguous elements), and
the small rewrites built on them (`fuse_until`, `rename_buffer`). Pure functions of the
operator IR: this module never chooses a schedule and never imports a backend.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import loop as L

COMBINERS = ("+", "*", "max", "min", "and", "or")
"""Associative update ops a reduction's accumulator may take (`update_op`)."""


def fuse_row_loops(stmts: list[L.Stmt]) -> list[L.Stmt]:
    """Consecutive loops over the same rows become one where each iteration only reads what
    the same iteration of the earlier loops wrote (softmax's row max, then its sum, then
    the output row): a row is done while it is in cache, and one parallel region runs."""
    out: list[L.Stmt] = []
    for s in stmts:
        prev = out[-1] if out else None
        if isinstance(s, L.For) and isinstance(prev, L.For) and s.kind == prev.kind and \
                isinstance(s.extent, L.Const) and s.extent == prev.extent:
            body = L.substitute(s.body, {s.var: prev.var})
            fused = L.For(prev.var, prev.extent, L.seq(prev.body, body), prev.kind)
            # (a loop carrying a reduction, as a split reduction's combining step, would
            # make the fused loop serial)
            if row_local(prev.body, body, prev.var, s.extent.value) and not carried(fused):
                out[-1] = fused
                continue
        out.append(s)
    return out

def levels(loop: L.For) -> list[L.For]:
    """The perfectly nested loops of constant extent from `loop` inwards."""
    out = [loop]
    while isinstance(out[-1].body, L.For) and isinstance(out[-1].body.extent, L.Const):
        out.append(out[-1].body)
    return out if isinstance(loop.extent, L.Const) else []


def fuse_levels(loop: L.For, depth: int) -> L.For:
    """The first `depth` perfectly nested loops of `loop` as one loop."""
    for _ in range(depth - 1):
        loop = fuse_until(loop, loop.extent.value * loop.body.extent.value)
    return loop


def rows_first(body: list[L.Stmt]) -> list[L.Stmt]:
    """Stages with their outer loops flattened: a reduction stage's down to its reductions
    (its rows), an elementwise stage's to the row count of the stage before it (then
    `fuse_row_loops` finds them equal: softmax's [b, h, s, s] output after its rows)."""
    out: list[L.Stmt] = []
    for s in body:
        nest = levels(s) if isinstance(s, L.For) else []
        if nest and not isinstance(nest[-1].body, L.Store):
            s = fuse_levels(s, len(nest))
        elif nest and out and isinstance(out[-1], L.For) and \
                isinstance(out[-1].extent, L.Const):
            s = fuse_until(s, out[-1].extent.value)
        out.append(s)
    return out


def accesses(s: L.Stmt) -> tuple[dict, dict]:
    """Buffers stored and loaded in `s`: name -> the set of index tuples used."""
    stores: dict[str, set] = {}
    loads: dict[str, set] = {}
    for n in L.walk(s):
        if isinstance(n, L.Store):
            stores.setdefault(n.buffer.name, set()).add(n.indices)
        elif isinstance(n, L.Load):
            loads.setdefault(n.buffer.name, set()).add(n.indices)
    return stores, loads

def row_local(first: L.Stmt, second: L.Stmt, var: L.Var, extent: int) -> bool:
    """Whether running `second` right after `first` for each value of `var` (instead of after
    all of `first`) keeps every read: what they share is written and read at one index that
    depends on `var` alone (the row) and differs for each of its values, and nothing
    `second` writes is touched by `first`."""
    if extent == 1:   # (one row: `first` then `second`, fused or not)
        return True
    w1, r1 = accesses(first)
    w2, r2 = accesses(second)
    for name in w2:
        if name in w1 or name in r1:
            return False
    for name, written in w1.items():
        if name not in r2 and name not in w2:
            continue
        if name in w2 or len(written) != 1 or r2[name] != written:
            return False
        (index,) = written
        used = set().union(*(L.free_vars(i) for i in index)) if index else set()
        if used != {var} or not injective(index, var, extent):
            return False
    return True

def injective(index: tuple, var: L.Var, extent: int) -> bool:
    """Whether each value of `var` in [0, extent) writes its own element (then the fused
    loop's reads see the same iteration's write, as the unfused order would)."""
    grid = np.arange(extent, dtype=np.int64)
    columns = evaluated(index, {var: grid}, grid.shape)
    if columns is None:
        return False
    rows = np.stack(columns, axis=1)
    return len(np.unique(rows, axis=0)) == extent

def steps_contiguously(load: L.Load, var: L.Var, extent: int) -> bool:
    """Whether `load` reads the next element of its buffer (row-major) for most steps of
    `var` over [0, extent) (its other variables held at 0): GPU threads consecutive in
    `var` then read consecutive addresses (a row's own elements, not a column's)."""
    offsets = flat_offsets(load, var, np.arange(min(extent, 64), dtype=np.int64))
    if offsets is None or len(offsets) < 2:
        return False
    return 2 * int(np.sum(np.diff(offsets) == 1)) >= len(offsets) - 1


def runs_in_order(access: L.Load | L.Store, var: L.Var, extent: int) -> bool:
    """Whether `access` (a load or a store) touches element base + `var` of its buffer
    (row-major) for `var` in [0, extent), base its offset at `var` = 0 (checked at 64
    points of the range and its first 64 values, its other variables held at 0: a row's
    start): a thread's contiguous iterations then touch contiguous elements, one vector
    access where their start is aligned."""
    points = np.unique(np.concatenate([np.arange(min(extent, 64)),
                                       np.linspace(0, extent - 1, 64).astype(np.int64)]))
    offsets = flat_offsets(access, var, points)
    return offsets is not None and bool(np.array_equal(offsets - offsets[0], points))


def flat_offsets(load: L.Load | L.Store, var: L.Var, points: np.ndarray
                 ) -> np.ndarray | None:
    """The row-major element offsets `load` (or a store) touches at `var` = each of `points`
    (its other variables held at 0); None when its buffer's shape is symbolic or an index is
    not computable here."""
    shape = L.static_shape(load.buffer.shape)
    if shape is None:
        return None
    env = {v: np.int64(0) for i in load.indices for v in L.free_vars(i)}
    env[var] = points
    columns = evaluated(load.indices, env, points.shape)
    if columns is None:
        return None
    offsets = np.zeros_like(points)
    for value, stride in zip(columns, np.cumprod((1,) + shape[:0:-1])[::-1]):
        offsets = offsets + value * int(stride)
    return offsets


def evaluated(index: tuple, env: dict, shape: tuple) -> list[np.ndarray] | None:
    """Each component of `index` over the grids `env` gives its variables (numpy arrays that
    broadcast to `shape`), as int64 arrays of that shape; None when a component is not
    computable here (a variable without a grid, an op the evaluator lacks)."""
    from ..ir.compute import ComputeEvalError, _Evaluator

    try:
        return [np.broadcast_to(_Evaluator({}, {}).eval(e, env), shape).astype(np.int64)
                for e in index]
    except (ComputeEvalError, KeyError):
        return None


def nest_work(s: L.Stmt) -> int | None:
    """Iterations of the innermost statements of a loop nest (None when symbolic)."""
    if isinstance(s, L.For):
        if not isinstance(s.extent, L.Const):
            return None
        inner = nest_work(s.body)
        return None if inner is None else s.extent.value * inner
    if isinstance(s, L.Seq):
        parts = [nest_work(x) for x in s.stmts]
        return None if any(p is None for p in parts) else max(sum(parts), 1)
    if isinstance(s, (L.Allocate, L.Let)):
        return nest_work(s.body)
    if isinstance(s, L.If):
        return nest_work(s.then)
    return 1

def carried(loop: L.For) -> set[str]:
    """Buffers through which iterations of `loop` may see each other's work (so it must not
    run in parallel): written, and read or written at an element not the iteration's own.
    An element is an iteration's own when every access to the buffer has the same components
    that depend on the loop variable alone, and these differ for each of its values (the
    output rows of a stage); an accumulator's `acc[0]` has none. Buffers allocated inside
    the loop are private to an iteration. A loop of one iteration carries nothing."""
    if isinstance(loop.extent, L.Const) and loop.extent.value == 1:
        return set()
    private = {n.buffer.name for n in L.walk(loop.body) if isinstance(n, L.Allocate)}
    stores, loads = accesses(loop.body)
    carried = set()
    for name, written in stores.items():
        if name in private:
            continue
        indices = written | loads.get(name, set())
        keys = {own_components(index, loop.var) for index in indices}
        key = keys.pop()
        if keys or not key or not distinct_per_iteration(tuple(e for _, e in key), loop):
            if not (len(indices) == 1 and blocks_per_iteration(next(iter(indices)), loop)):
                carried.add(name)
    return carried

def blocks_per_iteration(index: tuple, loop: L.For, limit: int = 1 << 16) -> bool:
    """Whether the elements `index` reaches in one iteration of `loop` (its other variables
    those of loops inside it, over their whole ranges) are reached by no other iteration, as
    `out[io * 64 + l]` for l in range(64) is: a block of its own per iteration. Checked by
    evaluating the index over every combination (none when that passes `limit`)."""
    extents = {n.var: n.extent.value for n in L.walk(loop.body)
               if isinstance(n, L.For) and isinstance(n.extent, L.Const)}
    used = set().union(*(L.free_vars(e) for e in index)) - {loop.var}
    if not isinstance(loop.extent, L.Const) or loop.var not in \
            set().union(*(L.free_vars(e) for e in index)) or not used <= set(extents):
        return False
    names = sorted(used, key=lambda v: v.name)
    axes = [loop.extent.value] + [extents[v] for v in names]
    if math.prod(axes) > limit:
        return False
    grids = np.meshgrid(*(np.arange(n, dtype=np.int64) for n in axes), indexing="ij")
    env = dict(zip([loop.var, *names], grids))
    columns = evaluated(index, env, grids[0].shape)
    if columns is None:
        return False
    columns = [c.ravel() for c in columns]
    owner = grids[0].ravel()
    elements = np.unique(np.stack(columns + [owner], axis=1), axis=0)
    # each element appears with one owner: as many distinct elements as distinct (element,
    # owner) pairs
    return len(np.unique(elements[:, :-1], axis=0)) == len(elements)

def own_components(index: tuple, var: L.Var) -> tuple:
    """(position, component) of the index components that depend on `var` and nothing else."""
    return tuple((k, e) for k, e in enumerate(index) if L.free_vars(e) == {var})

def distinct_per_iteration(components: tuple, loop: L.For) -> bool:
    if loop.var in components:
        return True
    if not isinstance(loop.extent, L.Const):
        return False
    if mixed_radix(components, loop.var, loop.extent.value):
        return True
    if loop.extent.value > 1 << 16:
        return False   # not checked: taken as shared
    return injective(components, loop.var, loop.extent.value)


def _digit(e: L.Expr, var: L.Var) -> tuple[int, int | None] | None:
    """(d, m) when `e` is `var // d % m` (m None: no modulus; d 1: no division), in any
    nesting of divisions and moduli by constants that is one: `var // a // b` is
    `var // (a b)`, `(var // d % m) // a` is `var // (d a) % (m / a)` where a divides m,
    `(var // d % m) % a` is `var // d % a` where a divides m (what fusing three loops or
    more leaves: `k % 50176 // 224`, `k % 50176 % 224`); None for any other form."""
    if e == var:
        return 1, None
    if not (isinstance(e, L.BinOp) and e.op in ("//", "%") and isinstance(e.b, L.Const)
            and e.b.value > 0):
        return None
    inner = _digit(e.a, var)
    if inner is None:
        return None
    d, m = inner
    a = e.b.value
    if e.op == "//":
        if m is None:
            return d * a, None
        return (d * a, m // a) if m % a == 0 else None
    return (d, a) if m is None or m % a == 0 else None


def mixed_radix(components: tuple, var: L.Var, extent: int) -> bool:
    """Whether `components` are digits of `var` in a mixed radix that determine it on
    [0, extent): each `var // d % m`, the smallest d 1, each next d dividing the d m
    below it, and the largest without a modulus or with d m >= extent. (What fusing loops
    (`fuse_until`) leaves of their indices: a proof of injectivity at any extent, where
    `injective` would have to evaluate every value.)"""
    digits = [_digit(e, var) for e in components]
    if not digits or None in digits:
        return False
    digits.sort(key=lambda dm: (dm[0], -(dm[1] or 0)))
    if digits[0][0] != 1:
        return False
    for (d, m), (d_next, _) in zip(digits, digits[1:]):
        if m is None:
            return True     # (d, None) alone determines var // d and, with below, var
        if (d * m) % d_next != 0:
            return False
    d, m = digits[-1]
    return m is None or d * m >= extent

def update_op(body: L.Stmt, acc: L.Buffer) -> str | None:
    """`op` when every access to `acc` in `body` is an update `acc[0] = acc[0] (op) x` (x not
    reading acc), all with one associative `op`; else None."""
    zero = (L.const(0),)
    ops, loads = set(), 0
    for n in L.walk(body):
        if isinstance(n, L.Load) and n.buffer.name == acc.name:
            loads += 1
        elif isinstance(n, L.Store) and n.buffer.name == acc.name:
            v = n.value
            if n.indices != zero or not isinstance(v, L.BinOp) or v.op not in COMBINERS or \
                    v.a != L.Load(acc, zero):
                return None
            ops.add(v.op)
    stores = sum(1 for n in L.walk(body) if isinstance(n, L.Store) and n.buffer.name == acc.name)
    return ops.pop() if len(ops) == 1 and loads == stores else None

def rename_buffer(node, old: L.Buffer, new: L.Buffer):
    """`node` with every access to `old` made to `new`."""
    def rule(n):
        if isinstance(n, L.Load) and n.buffer.name == old.name:
            return L.Load(new, n.indices)
        if isinstance(n, L.Store) and n.buffer.name == old.name:
            return L.Store(new, n.indices, n.value)
        return None

    return L.transform(node, rule)

def fuse_until(loop: L.For, want: int) -> L.For:
    """`loop` fused with the perfectly nested loops inside it until it has `want` iterations
    (or nothing is left to fuse)."""
    extent = loop.extent
    if not isinstance(extent, L.Const) or extent.value >= want:
        return loop
    inner = loop.body
    if not isinstance(inner, L.For) or not isinstance(inner.extent, L.Const):
        return loop
    n_in = inner.extent.value
    fused = L.Var(f"{loop.var.name}_{inner.var.name}")
    body = L.substitute(inner.body, {loop.var: fused // n_in, inner.var: fused % n_in})
    merged = L.For(fused, L.const(extent.value * n_in), body)
    return fuse_until(merged, want)
