"""in_place: a kernel that writes its output over one of its inputs (the memory plan's in-place
reuse, `backends/memory.py`) rendered with `noalias` buffers after all: that input's loads read
the output's buffer.

`plan._calls` renders such a kernel without `noalias`, and LLVM then runs none of its loops
vectorized: the overlap check it guards a vector loop with fails when the output lies on an
input, so the scalar loop runs. gpt2's tanh Gelu kernels in the int8 files quantize_static
writes (a pure elementwise chain whose output takes its input's block) took 24-50 ms each at 1
thread so, 8 ms for the whole model with the vector loops.

When every call of such a function passes its one written buffer and exactly one input at the
same arena place, with the same type, and no other of its arena buffers overlaps another, the
function is rewritten: that input's loads read the output's buffer (the same bytes, indexed
alike: the same values), so no buffer it reads or writes aliases another, and it is rendered
`noalias`. The input stays a parameter, read nowhere. A function whose calls alias otherwise
(another pair, a partial overlap, a different input from call to call) keeps its buffers
without `noalias`, as the plan gave it. This module must never change what a kernel computes.
"""

from __future__ import annotations

import math

from ...ir import loop as L
from ..plan import Call


def _bytes(buffer: L.Buffer) -> int | None:
    shape = L.static_shape(buffer.shape)
    return None if shape is None else math.prod(shape) * buffer.dtype.itemsize


def _aliased_input(func: L.PrimFunc, calls: list[Call]) -> int | None:
    """The position of the one input every call of `func` passes at its written buffer's
    place (same offset, size and type), when no other pair of its arena buffers overlaps."""
    stored = {n.buffer.name for n in L.walk(func.body) if isinstance(n, L.Store)}
    written = [k for k, b in enumerate(func.params) if b.name in stored]
    sizes = [_bytes(b) for b in func.params]
    if len(written) != 1 or not calls or None in sizes:
        return None
    out = written[0]
    found = set()
    for call in calls:
        spans = [(arg[1], arg[1] + sizes[k], k) for k, arg in enumerate(call.args)
                 if arg[0] == "arena" and k < len(sizes) and sizes[k]]
        pairs = [(a[2], b[2]) for i, a in enumerate(spans) for b in spans[i + 1:]
                 if a[0] < b[1] and b[0] < a[1]]
        if len(pairs) != 1 or out not in pairs[0]:
            return None
        (a, b), = pairs
        other = b if a == out else a
        if call.args[other] != call.args[out] or sizes[other] != sizes[out]:
            return None
        found.add(other)
    if len(found) != 1:
        return None
    k = found.pop()
    source, target = func.params[k], func.params[out]
    if (source.dtype, source.shape) != (target.dtype, target.shape):
        return None
    return k


def _reads_only(func: L.PrimFunc, buffer: L.Buffer) -> bool:
    """Whether `buffer` appears in `func`'s body in loads alone."""
    for n in L.walk(func.body):
        if isinstance(n, L.Load):
            continue
        if any(getattr(n, f, None) == buffer for f in ("buffer", "acc")):
            return False
    return True


def alias_free(unique: list[tuple[L.PrimFunc, bool]], calls: list[Call]
               ) -> list[tuple[L.PrimFunc, bool]]:
    """`unique` (function, noalias) with each in-place function whose calls alias one input
    with its output rewritten to read the output instead, and rendered `noalias`."""
    by_name: dict[str, list[Call]] = {}
    for call in calls:
        by_name.setdefault(call.func, []).append(call)
    out = []
    for func, noalias in unique:
        k = None if noalias else _aliased_input(func, by_name.get(func.name, []))
        if k is None or not _reads_only(func, func.params[k]):
            out.append((func, noalias))
            continue
        source = func.params[k]
        target = next(b for b in func.params if b.name in
                      {n.buffer.name for n in L.walk(func.body) if isinstance(n, L.Store)})
        body = L.transform(func.body, lambda n: L.Load(target, n.indices)
                           if isinstance(n, L.Load) and n.buffer == source else None)
        out.append((L.PrimFunc(func.name, func.params, body, func.size_vars, func.attrs), True))
    return out
