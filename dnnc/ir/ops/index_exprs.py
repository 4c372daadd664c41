"""Index expressions for compute rules of data-movement ops (shape, slicing, indexing,
attention): `add`/`mul`/`sub` that fold constants as they build, `ravel`/`unravel` between
row-major and linear indices, `clamp_index` so a load never leaves its buffer, and
`check_sizes_bound`, the precondition of a rule that takes sizes from inferred types.

Helpers only: nothing here registers an op or reads a graph.
"""

from __future__ import annotations

from .. import loop as L
from ..compute import NoCompute, dim_expr
from ..loop import Cast, Const, Expr, const, free_vars, maximum, minimum


def const_int(e: Expr) -> int | None:
    """An index expression's value when it is a constant."""
    return e.value if isinstance(e, Const) and e.dtype is L.INDEX else None


def add(a, b) -> Expr:
    """a + b, folded when either is a constant 0 or both are constants."""
    a, b = const(a), const(b)
    if const_int(b) == 0:
        return a
    if const_int(a) == 0:
        return b
    if const_int(a) is not None and const_int(b) is not None:
        return const(const_int(a) + const_int(b))
    return a - (-const_int(b)) if const_int(b) is not None and const_int(b) < 0 else a + b


def mul(a, b) -> Expr:
    """a * b, folded when either is a constant 0 or 1 or both are constants."""
    a, b = const(a), const(b)
    if const_int(a) == 0 or const_int(b) == 0:
        return const(0)
    if const_int(b) == 1:
        return a
    if const_int(a) == 1:
        return b
    if const_int(a) is not None and const_int(b) is not None:
        return const(const_int(a) * const_int(b))
    return a * b


def sub(a, b) -> Expr:
    """a - b, folded as `add`."""
    b = const(b)
    return add(a, -const_int(b)) if const_int(b) is not None else const(a) - b


def product(dims) -> Expr:
    """The product of index expressions (1 for none)."""
    out = const(1)
    for d in dims:
        out = mul(out, d)
    return out


def clamp_index(i: Expr, n: Expr) -> Expr:
    """`i` clamped into [0, n): what a load reads in the arm of a Select that is not taken, or
    at an out-of-range user index (as TVM's `take` mode "clip"), so it never leaves the buffer."""
    if const_int(n) == 1:
        return const(0)
    return minimum(maximum(i, 0), sub(n, 1))


def as_index(e: Expr) -> Expr:
    """An integer element (indices, lengths) as an index expression."""
    return e if e.dtype is L.INDEX else Cast(L.INDEX, e)


def scalar_load(t) -> Expr:
    """The one element of a scalar or one-element tensor."""
    return t[(const(0),) * t.ndim] if t.ndim else t[()]


def ravel(index, dims) -> Expr:
    """The row-major linear index of `index` in `dims` (axes of extent 1 are read at 0)."""
    flat = const(0)
    for i, d in zip(index, dims):
        if const_int(d) != 1:
            flat = add(mul(flat, d), i)
    return flat


def unravel(flat: Expr, dims) -> list[Expr]:
    """The row-major index in `dims` of linear index `flat`; the outermost axis of extent other
    than 1 needs no `%`, since `flat` is in range."""
    outer = next((k for k, d in enumerate(dims) if const_int(d) != 1), len(dims))
    out = []
    stride = const(1)
    for k in reversed(range(len(dims))):
        d = dims[k]
        if const_int(d) == 1:
            out.append(const(0))
            continue
        q = flat if const_int(stride) == 1 else flat // stride
        out.append(q if k == outer else q % d)
        stride = mul(stride, d)
    return out[::-1]


def check_sizes_bound(inputs, outputs, op: str) -> None:
    """A rule that does not read the value deciding its output size (a run-time shape input)
    relies on the inferred sizes; a size known only once that value is read (a fresh dim) has
    no loop form."""
    bound = {v for t in inputs if t is not None for d in t.shape for v in free_vars(d)}
    for out in outputs:
        for d in out.shape:
            if free_vars(dim_expr(d)) - bound:
                raise NoCompute(f"{op}: output size {d} is known only at run time")
