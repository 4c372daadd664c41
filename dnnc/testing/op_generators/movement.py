"""Op generators for data movement: Reshape (and Flatten, and flatten as exporters write it),
Transpose, Concat, Split, Slice, Gather, Squeeze / Unsqueeze, Pad and Expand.

Each generator `gen_*(g)` appends nodes to the builder `g`, or raises `Rejected` when it cannot
apply. Data movement computes nothing, so an output is exact when its input is; a generator
must never make an index out of range that the spec does not clamp.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from ..graph_builder import BATCH, F32, Builder, Rejected


def gen_reshape(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    static = [d for d in x.shape[1:] if isinstance(d, int)]
    if x.rank >= 1 and not x.static(0) and len(static) < x.rank - 1:
        raise Rejected
    if g.chance(0.2):   # flatten as exported: Concat(Shape(x)[:1], [-1])
        if x.rank < 2:
            raise Rejected
        shape = g.node("Shape", [x], exact=True)[0]
        head = g.node("Slice", [shape, g.ints([0]), g.ints([1])], exact=True)[0]
        target = g.node("Concat", [head, g.ints([-1])], axis=0, exact=True)[0]
        # what inference needs to know of the target's value: [0, -1] reads the same
        g.data[target.name] = numpy_helper.from_array(np.array([0, -1], np.int64))
        g.node("Reshape", [x, target], exact=x.exact)
        return
    if g.chance(0.2):
        g.node("Flatten", [x], axis=int(g.rng.integers(0, x.rank + 1)), exact=x.exact)
        return
    rest = int(np.prod(x.shape[1:])) if all(x.static(i) for i in range(1, x.rank)) else None
    if rest is None:
        raise Rejected
    head = [0 if not x.static(0) or g.chance(0.5) else x.shape[0]] if x.rank else []
    factors = _split_factors(rest, g)
    if g.chance(0.3):
        factors[int(g.rng.integers(len(factors)))] = -1
    g.node("Reshape", [x, g.ints(head + factors)], exact=x.exact)


def _split_factors(n: int, g: Builder) -> list[int]:
    """n as a product of one to three factors, in random order, 1s allowed."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    a = g.choice(divisors)
    if g.chance(0.5):
        return [a, n // a]
    b = g.choice([d for d in divisors if (n // a) % d == 0])
    return [a, b, n // a // b]


def gen_transpose(g: Builder):
    x = g.pick(lambda v: v.rank >= 2, dtype=None)
    perm = [int(p) for p in g.rng.permutation(x.rank)]
    g.node("Transpose", [x], perm=perm, exact=x.exact)


def gen_concat(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axis = g.choice([a for a in range(x.rank) if x.static(a)] or [None])
    if axis is None:
        raise Rejected
    others = [v for v in g.usable(x.rounded) if v.dtype == x.dtype and v.rank == x.rank and
              all(a == axis or v.shape[a] == x.shape[a] for a in range(x.rank))]
    if g.chance(0.3):
        others.append(x)   # the same value twice: two uses by one node
    if not others or g.chance(0.3):
        shape = list(x.shape)
        shape[axis] = g.size()
        others.append(g.add_input(tuple(shape), x.dtype,
                                  "int" if x.dtype != F32 else "normal"))
    y = g.choice(others)
    parts = [x, y] if g.chance(0.5) else [y, x, y]
    g.node("Concat", parts, axis=axis - x.rank if g.chance(0.3) else axis,
           exact=all(p.exact for p in parts))


def gen_split(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axes = [a for a in range(x.rank) if x.static(a) and x.shape[a] >= 2]
    if not axes:
        raise Rejected
    axis = g.choice(axes)
    n = x.shape[axis]
    if g.chance(0.5) and n % 2 == 0:
        extra = {"num_outputs": 2} if g.opset >= 18 else {}
        g.node("Split", [x], n_out=2, axis=axis, exact=x.exact, **extra)
        return
    cut = int(g.rng.integers(1, n))
    sizes = g.ints([cut, n - cut])
    g.node("Split", [x, sizes], n_out=2, axis=axis, exact=x.exact)


def gen_slice(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axes = [a for a in range(x.rank) if x.static(a)]
    if not axes:
        raise Rejected
    chosen = sorted(set(g.choice(axes) for _ in range(2)))
    starts, ends, steps = [], [], []
    for a in chosen:
        n = x.shape[a]
        step = g.choice([1, 1, 2, -1, -2]) if n > 1 else 1
        lo, hi = sorted(int(v) for v in g.rng.integers(0, n + 1, 2))
        if hi == lo:
            hi = lo + 1
            if hi > n:
                lo, hi = n - 1, n
        if step > 0:
            start, end = lo, hi
        else:
            start, end = hi - 1, lo - 1
            if end < 0:
                end = -(2**63) if g.chance(0.5) else -n - 1   # clamped: through index 0
        if g.chance(0.3) and step > 0:
            start = start - n   # a negative index
        if g.chance(0.2) and step > 0 and end == n:
            end = 2**63 - 1     # INT64_MAX: to the end
        starts.append(start)
        ends.append(end)
        steps.append(step)
    inputs = [x, g.ints(starts), g.ints(ends), g.ints([a - x.rank if g.chance(0.3) else a
                                                        for a in chosen])]
    if any(s != 1 for s in steps) or g.chance(0.5):
        inputs.append(g.ints(steps))
    g.node("Slice", inputs, exact=x.exact)


def gen_gather(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axes = [a for a in range(x.rank) if x.static(a)]
    if not axes:
        raise Rejected
    axis = g.choice(axes)
    n = x.shape[axis]
    shape = g.choice([(), (g.size((1, 2, 3, 5)),), (2, g.size((1, 2, 3)))])
    idx = g.rng.integers(-n, n, shape)
    g.node("Gather", [x, g.ints(idx)], axis=axis - x.rank if g.chance(0.3) else axis,
           exact=x.exact)


def gen_squeeze(g: Builder):
    x = g.pick(dtype=None)
    ones = [a for a in range(x.rank) if x.shape[a] == 1]
    if ones and g.chance(0.6):
        g.node("Squeeze", [x, g.ints([g.choice(ones)])], exact=x.exact)
    elif x.rank < 5:
        g.node("Unsqueeze", [x, g.ints([int(g.rng.integers(-x.rank - 1, x.rank + 1))])],
               exact=x.exact)
    else:
        raise Rejected


def gen_pad(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    mode = g.choice(["constant", "constant", "reflect", "edge"])
    begin, end = [], []
    for a in range(x.rank):
        n = x.shape[a]
        if not isinstance(n, int) or g.chance(0.4):
            begin.append(0)
            end.append(0)
            continue
        limit = n - 1 if mode == "reflect" else 3   # reflect pads at most n - 1
        begin.append(int(g.rng.integers(0, limit + 1)))
        end.append(int(g.rng.integers(0, limit + 1)))
    inputs = [x, g.ints(begin + end)]
    if mode == "constant" and g.chance(0.5):
        inputs.append(g.const_node(np.asarray(1.5 if x.dtype == F32 else 2, x.dtype)))
    g.node("Pad", inputs, mode=mode, exact=x.exact)


def gen_expand(g: Builder):
    x = g.pick(lambda v: any(d == 1 for d in v.shape) or v.rank < 3, dtype=None)
    shape = [g.size((2, 3, 5)) if d == 1 and g.chance(0.6) else 1 if g.chance(0.2) else d
             for d in x.shape]
    if g.chance(0.3) and len(shape) < 4:
        shape = [g.size((2, 3))] + shape
    if BATCH in shape:
        shape = [1 if d == BATCH else d for d in shape]   # 1 broadcasts to the batch
    g.node("Expand", [x, g.ints(shape)], exact=x.exact)
