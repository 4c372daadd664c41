"""Shape-inference rules shared by many ops (each family module holds its op-specific ones)."""

from __future__ import annotations

import numpy as np

from ..types import Dim, DType, TensorType, broadcast_shapes
from .registry import InferContext


def same_as_input(ctx: InferContext) -> list[TensorType]:
    """Output 0 has input 0's type (unary elementwise ops)."""
    return [ctx.type(0)]


def broadcast_to(dtype: DType | None = None):
    """Rule: outputs broadcast all present inputs; dtype is `dtype` or input 0's."""

    def infer(ctx: InferContext) -> list[TensorType]:
        shapes = [t.shape for t in ctx.inputs if t is not None]
        return [TensorType(dtype or ctx.dtype(0), broadcast_shapes(*shapes))]

    return infer


def check_same_dtype(ctx: InferContext, *indices: int) -> None:
    """Inputs at `indices` (all present inputs when empty) share one element type."""
    idx = indices or [i for i in range(len(ctx.inputs)) if ctx.has(i)]
    dtypes = {ctx.dtype(i).name for i in idx if ctx.has(i)}
    if len(dtypes) > 1:
        raise ctx.fail(f"inputs must share one element type, given {sorted(dtypes)}")


def check_dtype(ctx: InferContext, i: int, allowed, what: str = "") -> None:
    """Input i's element type is one of `allowed` (DTypes)."""
    if ctx.has(i) and ctx.dtype(i) not in allowed:
        names = ", ".join(d.name for d in allowed)
        raise ctx.fail(f"input {i}{' (' + what + ')' if what else ''} must be one of "
                       f"{names}, given {ctx.dtype(i).name}")


def normalize_axis(ctx: InferContext, axis: int, rank: int) -> int:
    """An axis in [-rank, rank) as a non-negative index; raises ShapeError otherwise."""
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def reduced_shape(shape: tuple[Dim, ...], axes, keepdims: bool) -> tuple[Dim, ...]:
    """Shape after reducing `axes` (already normalised)."""
    axes = set(axes)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def int_list(values) -> list[int]:
    """An integer array's values, flattened, as Python ints."""
    return [int(v) for v in np.asarray(values).reshape(-1)]


def shape_length(ctx: InferContext, i: int, what: str) -> int:
    """The length of 1-D shape-like input i; it must be static to know the output rank."""
    shape = ctx.shape(i)
    if len(shape) != 1 or not isinstance(shape[0], int):
        raise ctx.fail(f"input {i} ({what}) must be a 1-D tensor of static length, "
                       f"given {ctx.type(i)}")
    return shape[0]


def known_ints(ctx: InferContext, i: int, what: str) -> list[int] | None:
    """Input i's values as ints when known exactly (axes, repeats, pads ...), else None."""
    value = ctx.value(i)
    if value is None:
        return None
    if value.dtype.kind not in "iu":
        raise ctx.fail(f"input {i} ({what}) must be an integer tensor, given {ctx.type(i)}")
    return int_list(value)


def normalize_axes(ctx: InferContext, axes, rank: int) -> list[int]:
    """`normalize_axis` of each of `axes`; raises ShapeError when one repeats."""
    out = [normalize_axis(ctx, int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        raise ctx.fail(f"axes {list(axes)} repeat an axis")
    return out
