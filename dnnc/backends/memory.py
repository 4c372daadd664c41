"""Static memory planning over a final kernel order (`plan_memory`).

The input is the order kernels run in, as `Step`s (the values each reads and writes), the size
of every value and which values are *external* (inputs, outputs, constants: they live in their
own buffers and are not planned). The output is an offset for every other value in one arena,
aligned to `ALIGN` bytes, such that two values live at the same time never overlap.

Liveness: a value is live from the step that writes it to the last step that reads it (a value
nobody reads is live during its own step only). The planner never places a value over one that
is still live, so a value still needed later is never overwritten.

In-place: a step may name reads its single output may overwrite (`Step.inplace`): reads whose
element i is only read to write the output's element i, with the same byte size (a purely
elementwise kernel). The planner takes the first of them whose last reader is this very step
and that is not external; the output then shares that read's block (`MemoryPlan.inplace`).
Whoever renders the kernel must then not declare its buffers `noalias`.

Placement: two heuristics, the smaller arena wins:
- *greedy by size* (Pisarchyk & Lee 2020, "Efficient Memory Management for Deep Neural Net
  Inference", TFLite's offline planner): blocks largest first, each in the smallest gap left
  by the already-placed blocks whose lifetimes overlap it;
- *best fit* over the step order: each new block takes the smallest free block it fits in,
  freed neighbours coalesce, and a free block at the top of the arena grows in place.
Greedy by size is usually within a few percent of `live_lower_bound_bytes` on CNNs and
transformers; best fit wins on some long chains, where it is also exact.

This module is pure bookkeeping: it never looks at a graph, a kernel or a target. It is not a
graph pass: offsets need the final kernel order and concrete sizes, which exist only once a
segment is specialised to the shapes a call brings, so the shared orchestration
(`backends/plan.py`) runs it for every specialisation, from opt level 1.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Hashable, Iterable

ALIGN = 64
"""Offsets and sizes are multiples of a cache line (and of every vector width up to AVX-512)."""


@dataclass
class Step:
    """One kernel in run order: the keys of the values it reads and writes; `inplace`: reads
    its single write may overwrite (read only at the index it writes, same byte size)."""

    reads: list[Hashable]
    writes: list[Hashable]
    inplace: tuple = ()


@dataclass
class MemoryPlan:
    offsets: dict[Hashable, int]          # planned value -> byte offset in the arena
    arena_bytes: int
    naive_bytes: int                      # every planned value in a block of its own
    live_lower_bound_bytes: int           # the most bytes live at once, over the steps
    inplace: dict[Hashable, Hashable] = field(default_factory=dict)  # write -> read it took
    strategy: str = ""                    # the placement heuristic that won


def aligned(nbytes: int, align: int = ALIGN) -> int:
    """`nbytes` rounded up to `align`; at least one `align` block (even for empty values, so
    every value has an address of its own)."""
    return max(align, -(-nbytes // align) * align)


@dataclass
class _Block:
    """Values sharing one place (one value, or an in-place chain): [start, end] in steps."""

    size: int
    start: int
    end: int
    members: list = field(default_factory=list)


def plan_memory(steps: list[Step], sizes: dict[Hashable, int],
                external: Iterable[Hashable] = (), align: int = ALIGN,
                reuse: bool = True, views: dict | None = None) -> MemoryPlan:
    """Offsets in one arena for every value written by `steps` and not `external`. Without
    `reuse`, every value has a block of its own and nothing is in place (the layout of a
    pipeline without plan_memory: opt level 0, or bisecting a planner bug).

    `views` maps a value to (another value, byte offset): it lives inside that value (a
    concat's part, written where the concat would have copied it; a view of a view is
    resolved to the outermost). The outermost value is written by no step: its block lives
    from the first step that writes a part of it to the last that reads it or a part, and
    neither it nor its parts take part in in-place sharing."""
    external = set(external)
    within = {v: _outermost(v, views) for v in (views or {})}
    shared = set(within) | {root for root, _ in within.values()}

    def owner(v):
        return within[v][0] if v in within else v

    first: dict = {}
    last: dict = {}
    written: dict = {}
    for k, step in enumerate(steps):
        for v in step.writes:
            if v in external:
                continue
            if v in written:
                raise ValueError(f"value {v!r} is written twice (steps {written[v]} and {k})")
            written[v] = k
            first.setdefault(owner(v), k)
            last[owner(v)] = k
        for v in step.reads:
            if v in external:
                continue
            if owner(v) not in first:
                raise ValueError(f"step {k} reads {v!r}, which no earlier step writes and "
                                 f"which is not external")
            last[owner(v)] = k
    size = {v: aligned(sizes[v], align) for v in first}

    # in-place: a write joins the block of a read that dies at this step
    block_of: dict = {}
    blocks: list[_Block] = []
    inplace: dict = {}
    for k, step in enumerate(steps):
        taken = None
        if reuse and step.inplace and len(step.writes) == 1 and step.writes[0] in first and \
                step.writes[0] not in shared:
            out = step.writes[0]
            for v in step.inplace:
                if v in first and v not in shared and last[v] == k and \
                        sizes[v] == sizes[out] and v in step.reads:
                    taken = v
                    break
        for v in step.writes:
            v = owner(v)
            if v not in first or v in block_of:
                continue
            if taken is not None:
                block = block_of[taken]
                block.end = max(block.end, last[v])
                block.members.append(v)
                inplace[v] = taken
            else:
                block = _Block(size[v], k, last[v], [v])
                blocks.append(block)
            block_of[v] = block

    naive = sum(size.values())
    bound = _live_lower_bound(len(steps), first, last, size)
    if not reuse:
        offsets, top = {}, 0
        for b in blocks:
            offsets[b.members[0]] = top
            top += b.size
        offsets.update((v, offsets[root] + off) for v, (root, off) in within.items())
        return MemoryPlan(offsets, top, naive, bound, {}, "none")
    candidates = [(_greedy_by_size(blocks, align), "greedy by size"),
                  (_best_fit(blocks, len(steps)), "best fit")]
    (placed, arena), strategy = min(candidates, key=lambda c: c[0][1])
    offsets = {v: placed[id(b)] for b in blocks for v in b.members}
    offsets.update((v, offsets[root] + off) for v, (root, off) in within.items())
    return MemoryPlan(offsets, arena, naive, bound, inplace, strategy)


def _outermost(v, views: dict) -> tuple:
    """(the value `v` lies inside through `views`, followed to the end; its byte offset)."""
    offset, seen = 0, {v}
    while v in views:
        v, step = views[v]
        offset += step
        if v in seen:
            raise ValueError(f"views form a cycle through {v!r}")
        seen.add(v)
    return v, offset


def _live_lower_bound(n_steps: int, first: dict, last: dict, size: dict) -> int:
    """The most bytes live during one step (no in-place sharing counted)."""
    delta = [0] * (n_steps + 1)
    for v, k in first.items():
        delta[k] += size[v]
        delta[last[v] + 1] -= size[v]
    live = best = 0
    for d in delta:
        live += d
        best = max(best, live)
    return best


def _greedy_by_size(blocks: list[_Block], align: int) -> tuple[dict[int, int], int]:
    """Largest first (longer lifetimes first among equals), each block at the smallest gap
    between the placed blocks whose lifetimes overlap its own, else above them."""
    order = sorted(blocks, key=lambda b: (-b.size, -(b.end - b.start), b.start))
    placed: list[tuple[_Block, int]] = []
    offsets: dict[int, int] = {}
    top = 0
    for b in order:
        busy = sorted((off, off + o.size) for o, off in placed
                      if o.start <= b.end and b.start <= o.end)
        best = None   # (gap size, offset)
        cursor = 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= b.size and (best is None or gap < best[0]):
                best = (gap, cursor)
            cursor = max(cursor, hi)
        offset = best[1] if best is not None else cursor
        offsets[id(b)] = offset
        placed.append((b, offset))
        top = max(top, offset + b.size)
    return offsets, top


def _best_fit(blocks: list[_Block], n_steps: int) -> tuple[dict[int, int], int]:
    """Over the steps in order: blocks starting at a step take the smallest free block they
    fit in (or grow the arena's free top), blocks ending at it are freed and coalesced."""
    starting: dict[int, list[_Block]] = {}
    ending: dict[int, list[_Block]] = {}
    for b in blocks:
        starting.setdefault(b.start, []).append(b)
        ending.setdefault(b.end, []).append(b)
    free: list[list[int]] = []   # sorted [offset, size], adjacent ones always merged
    offsets: dict[int, int] = {}
    top = 0
    for k in range(n_steps):
        for b in sorted(starting.get(k, ()), key=lambda b: -b.size):
            fits = [j for j, (_, sz) in enumerate(free) if sz >= b.size]
            if fits:
                j = min(fits, key=lambda j: free[j][1])
                off, sz = free[j]
                if sz == b.size:
                    free.pop(j)
                else:
                    free[j] = [off + b.size, sz - b.size]
            elif free and free[-1][0] + free[-1][1] == top:
                off = free.pop()[0]   # the free top grows to the size needed
                top = off + b.size
            else:
                off = top
                top += b.size
            offsets[id(b)] = off
        for b in ending.get(k, ()):
            _release(free, offsets[id(b)], b.size)
    return offsets, top


def _release(free: list[list[int]], offset: int, size: int) -> None:
    """Return [offset, offset + size) to the sorted free list, merging with its neighbours."""
    j = bisect.bisect_left(free, [offset, size])
    free.insert(j, [offset, size])
    if j + 1 < len(free) and free[j][0] + free[j][1] == free[j + 1][0]:
        free[j][1] += free.pop(j + 1)[1]
    if j > 0 and free[j - 1][0] + free[j - 1][1] == free[j][0]:
        free[j - 1][1] += free.pop(j)[1]
