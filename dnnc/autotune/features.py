"""A fixed-length feature vector per scheduled PrimFunc, read from the operator IR alone, so one
cost model serves every task and template (AutoTVM's loop features, simplified).

For the innermost statements (stores), each with the loops around it:
- per loop level, outermost first, up to `LEVELS` levels: log2 of the extent and the kind
  (serial, parallel, vectorized, unrolled, GPU block, GPU thread) as a one-hot;
- the iterations it runs (log2), the loads and stores it does per iteration, the arithmetic
  operations and the calls (exp, erf, ...) per iteration;
- the bytes it touches per buffer scope (global, shared, local), as log2 of the distinct
  elements its accesses can reach (the product of the extents of the loops its indices use),
  and the innermost loop's stride-1 accesses (vectorisable loads).
A kernel's vector is the mean over its statements weighted by their iterations (so the hot
statements dominate), plus kernel-wide counts: statements, loops, parallel and vectorised
extents, local and shared allocation bytes, and the prefetches a call makes (log2). Every
entry is finite; the length is `LENGTH`.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import loop as L

LEVELS = 6
KINDS = ("serial", "parallel", "vectorized", "unrolled", "block", "thread")
_PER_LEVEL = 1 + len(KINDS)
_PER_STMT = LEVELS * _PER_LEVEL + 9
LENGTH = _PER_STMT + 7


def _kind(kind: L.ForKind) -> int:
    if kind.value.startswith("blockIdx"):
        return KINDS.index("block")
    if kind.value.startswith("threadIdx"):
        return KINDS.index("thread")
    return KINDS.index(kind.value)


def _log2(x: float) -> float:
    return math.log2(x) if x > 1 else 0.0


def features(func: L.PrimFunc) -> np.ndarray:
    """The feature vector of a scheduled PrimFunc (static extents assumed; a symbolic extent
    counts as 1)."""
    total = np.zeros(_PER_STMT)
    counts = {"stmts": 0, "loops": 0, "parallel": 0, "vector": 0, "local": 0, "shared": 0,
              "prefetches": 0.0}

    def extent(loop: L.For) -> int:
        return loop.extent.value if isinstance(loop.extent, L.Const) else 1

    def visit(s, loops: list[L.For]):
        if isinstance(s, L.For):
            counts["loops"] += 1
            if s.kind is L.ForKind.PARALLEL or s.kind.value.startswith("blockIdx"):
                counts["parallel"] += extent(s)
            if s.kind is L.ForKind.VECTORIZED:
                counts["vector"] = max(counts["vector"], extent(s))
            visit(s.body, loops + [s])
        elif isinstance(s, L.Allocate):
            size = 1
            for d in s.buffer.shape:
                size *= d.value if isinstance(d, L.Const) else 1
            scope = s.buffer.scope.value
            if scope in ("local", "shared"):
                counts[scope] += size * s.buffer.dtype.itemsize
            visit(s.body, loops)
        elif isinstance(s, (L.Seq,)):
            for x in s.stmts:
                visit(x, loops)
        elif isinstance(s, (L.Let,)):
            visit(s.body, loops)
        elif isinstance(s, L.If):
            visit(s.then, loops)
            if s.orelse is not None:
                visit(s.orelse, loops)
        elif isinstance(s, L.Store):
            counts["stmts"] += 1
            vec, iters = _statement(s, loops)
            total[:] += vec * iters
            counts["iters"] = counts.get("iters", 0.0) + iters
        elif isinstance(s, L.Prefetch):
            counts["prefetches"] += math.prod(extent(loop) for loop in loops)

    visit(func.body, [])
    head = total / max(counts.get("iters", 0.0), 1.0)   # weighted by each store's iterations
    tail = np.array([_log2(counts["stmts"]), _log2(counts["loops"]),
                     _log2(counts["parallel"]), _log2(counts["vector"]),
                     _log2(counts["local"]), _log2(counts["shared"]),
                     _log2(counts["prefetches"])])
    return np.concatenate([head, tail])


def _statement(store: L.Store, loops: list[L.For]) -> tuple[np.ndarray, float]:
    """A store's features and how many times it runs."""
    vec = np.zeros(_PER_STMT)
    for k, loop in enumerate(loops[:LEVELS]):
        base = k * _PER_LEVEL
        ext = loop.extent.value if isinstance(loop.extent, L.Const) else 1
        vec[base] = _log2(ext)
        vec[base + 1 + _kind(loop.kind)] = 1.0
    iters = 1.0
    for loop in loops:
        iters *= loop.extent.value if isinstance(loop.extent, L.Const) else 1
    loads = [n for n in L.walk(store.value) if isinstance(n, L.Load)]
    ops = sum(1 for n in L.walk(store.value) if isinstance(n, L.BinOp))
    calls = sum(1 for n in L.walk(store.value) if isinstance(n, L.Call))
    inner = loops[-1].var if loops else None
    extents = {loop.var: (loop.extent.value if isinstance(loop.extent, L.Const) else 1)
               for loop in loops}
    reach = {"global": 0.0, "shared": 0.0, "local": 0.0}
    unit_stride = 0
    for access in loads + [store]:
        used = set().union(*(L.free_vars(i) for i in access.indices)) if access.indices \
            else set()
        elements = 1
        for var in used:
            elements *= extents.get(var, 1)
        scope = access.buffer.scope.value
        reach[scope] = max(reach[scope], elements * access.buffer.dtype.itemsize)
        if inner is not None and access.indices and \
                inner in L.free_vars(access.indices[-1]) and \
                not any(inner in L.free_vars(i) for i in access.indices[:-1]):
            unit_stride += 1
    base = LEVELS * _PER_LEVEL
    vec[base:base + 9] = [_log2(iters), len(loads), 1.0, ops, calls,
                          _log2(reach["global"]), _log2(reach["shared"]),
                          _log2(reach["local"]), unit_stride]
    return vec, iters
