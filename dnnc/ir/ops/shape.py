"""Shape and layout ops: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
DepthToSpace, SpaceToDepth (each output element is one input element, moved).

These carry the shape arithmetic exporters write (Shape -> Gather -> Unsqueeze -> Concat ->
Reshape on a dynamic batch). Their `infer` reads shape-like inputs with `ctx.dims(i)` (known
values, possibly symbolic), so a Reshape fed by that chain still gets an exact symbolic shape;
only sizes that depend on run-time data get `ctx.fresh_dim()`. Ops marked `shape_arith` have
references that also run on object arrays holding `SymDim`s. Nothing here reads ONNX.

Compute rules are pure index arithmetic (Reshape: the row-major linear index recomputed with
`//` and `%`; Transpose: permuted indices), taking output sizes from the inferred types. Slicing
and joining ops are in `slicing.py`, tensors built from shapes and scalars in `creation.py`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import batching
from .. import types as T
from ..compute import compute, dim_expr
from ..loop import Select, const, eq
from ..types import Dim, TensorType, dim_div, dim_mul, dims_product
from .index_exprs import check_sizes_bound, product, ravel, unravel
from .infer import check_dtype, int_list, known_ints, normalize_axes, shape_length
from .registry import REQUIRED, Pattern, from_dims, register_op

INDEX = (T.int32, T.int64)


def _reshaped(x, out):
    """`x` read in row-major order into `out`'s shape: Reshape, Flatten, Squeeze, Unsqueeze.
    Axes equal at both ends map straight through; the middle goes through a linear index."""
    src = x.shape
    dst = tuple(dim_expr(d) for d in out.shape)
    p = 0
    while p < min(len(src), len(dst)) and src[p] == dst[p]:
        p += 1
    s = 0
    while s < min(len(src), len(dst)) - p and src[-1 - s] == dst[-1 - s]:
        s += 1

    def element(*i):
        middle = unravel(ravel(i[p:len(dst) - s], dst[p:len(dst) - s]), src[p:len(src) - s])
        return x[tuple(i[:p]) + tuple(middle) + tuple(i[len(dst) - s:])]

    return compute(out.shape, element, dtype=out.dtype)


# -- Shape, Size -----------------------------------------------------------------------------


def _shape_dims(ctx):
    # Python slicing clamps exactly as ONNX: negatives count from the end, then clip to [0, rank]
    return ctx.shape(0)[ctx.attrs["start"]:ctx.attrs["end"]]


def _shape_infer(ctx):
    return [TensorType(T.int64, (len(_shape_dims(ctx)),))]


def _shape_known(ctx):
    return from_dims(_shape_dims(ctx))


def shape(x, start, end):
    return np.array(x.shape[slice(start, end)], dtype=np.int64)


def _shape_rule(inputs, outputs, start, end):
    # the dims are index expressions already: constants, or the size vars of symbolic dims
    dims = inputs[0].shape[slice(start, end)]

    def element(i):
        value = dims[-1] if dims else const(0)
        for k in reversed(range(len(dims) - 1)):
            value = Select(eq(i, k), dims[k], value)
        return value

    return [compute(outputs[0].shape, element, dtype=T.int64)]


register_op("Shape", pattern=Pattern.OPAQUE, infer=_shape_infer, evaluate=shape,
            attrs={"start": 0, "end": None}, known=_shape_known, compute=_shape_rule)


def _size_known(ctx):
    return from_dims([dims_product(ctx.shape(0))], shape=())


def _size_rule(inputs, outputs):
    return [compute((), lambda: product(inputs[0].shape), dtype=T.int64)]


register_op("Size", pattern=Pattern.OPAQUE, infer=lambda ctx: [TensorType(T.int64, ())],
            evaluate=lambda x: np.array(x.size, dtype=np.int64), known=_size_known,
            compute=_size_rule)

# -- Reshape, Flatten, Squeeze, Unsqueeze, Transpose ---------------------------------------------


def _reshape_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "shape")
    n = shape_length(ctx, 1, "shape")
    target = ctx.dims(1)
    if target is None:
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in range(n))]
    src = ctx.shape(0)
    allowzero = ctx.attrs["allowzero"]
    out: list[Dim | None] = []
    for i, d in enumerate(target):
        if isinstance(d, int) and d < -1:
            raise ctx.fail(f"shape {target} holds {d}; sizes must be -1, 0 or positive")
        if d == 0 and not allowzero:
            if i >= len(src):
                raise ctx.fail(f"shape {target} copies dim {i} (a 0) of a rank-{len(src)} input")
            d = src[i]
        out.append(None if d == -1 else d)
    holes = [i for i, d in enumerate(out) if d is None]
    if len(holes) > 1:
        raise ctx.fail(f"shape {target} holds more than one -1")
    total = dims_product(src)
    rest = dims_product(d for d in out if d is not None)
    if holes:
        if isinstance(total, int) and isinstance(rest, int):
            if rest == 0 or total % rest:
                raise ctx.fail(f"cannot reshape {ctx.type(0)} to {target}")
            out[holes[0]] = total // rest
        else:
            out[holes[0]] = dim_div(total, rest)
    elif isinstance(total, int) and isinstance(rest, int) and total != rest:
        raise ctx.fail(f"cannot reshape {ctx.type(0)} ({total} elements) to {target}")
    return [ctx.type(0).with_shape(out)]


def reshape(data, shape, allowzero):
    target = int_list(shape)
    if not allowzero:
        target = [data.shape[i] if s == 0 else s for i, s in enumerate(target)]
    return data.reshape(target)


def _reshape_rule(inputs, outputs, allowzero):
    if inputs[1].value is None:
        check_sizes_bound(inputs, outputs, "Reshape")
    return [_reshaped(inputs[0], outputs[0])]


register_op("Reshape", pattern=Pattern.INJECTIVE, infer=_reshape_infer, evaluate=reshape,
            attrs={"allowzero": 0}, inputs=2, shape_arith=True, compute=_reshape_rule, params=(1,),
            batched=batching.reshaping)


def _flatten_infer(ctx):
    s = ctx.shape(0)
    axis = ctx.attrs["axis"]
    if not -len(s) <= axis <= len(s):
        raise ctx.fail(f"axis {axis} is out of range for rank {len(s)}")
    axis = axis + len(s) if axis < 0 else axis
    return [ctx.type(0).with_shape((dims_product(s[:axis]), dims_product(s[axis:])))]


def flatten(x, axis):
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


register_op("Flatten", pattern=Pattern.INJECTIVE, infer=_flatten_infer, evaluate=flatten,
            attrs={"axis": 1}, shape_arith=True,
            compute=lambda inputs, outputs, axis: [_reshaped(inputs[0], outputs[0])],
            batched=batching.reshaping)


def _squeeze_infer(ctx):
    s = ctx.shape(0)
    if not ctx.has(1):
        # symbolic dims are taken as not 1: an exporter that means to squeeze them passes axes
        return [ctx.type(0).with_shape(d for d in s if d != 1)]
    axes = known_ints(ctx, 1, "axes")
    if axes is None:  # run-time axes: only the output rank is known
        n = len(s) - shape_length(ctx, 1, "axes")
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in range(n))]
    axes = normalize_axes(ctx, axes, len(s))
    for a in axes:
        if isinstance(s[a], int) and s[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of size {s[a]} in {ctx.type(0)}")
    return [ctx.type(0).with_shape(d for i, d in enumerate(s) if i not in axes)]


def squeeze(x, axes=None):
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(int_list(axes)))


def _unit_axes_rule(op: str):
    """Squeeze and Unsqueeze: reshapes that drop or insert axes of extent 1; run-time axes
    leave the output shape unknown."""

    def rule(inputs, outputs):
        if len(inputs) > 1 and inputs[1] is not None and inputs[1].value is None:
            check_sizes_bound(inputs, outputs, op)
        return [_reshaped(inputs[0], outputs[0])]

    return rule


register_op("Squeeze", pattern=Pattern.INJECTIVE, infer=_squeeze_infer, evaluate=squeeze,
            inputs=(1, 2), shape_arith=True, compute=_unit_axes_rule("Squeeze"), params=(1,),
            batched=batching.reshaping)


def _unsqueeze_infer(ctx):
    axes = known_ints(ctx, 1, "axes")
    if axes is None:  # run-time axes: only the output rank is known
        n = ctx.type(0).rank + shape_length(ctx, 1, "axes")
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in range(n))]
    rank = ctx.type(0).rank + len(axes)
    axes = normalize_axes(ctx, axes, rank)
    rest = iter(ctx.shape(0))
    return [ctx.type(0).with_shape(1 if i in axes else next(rest) for i in range(rank))]


def unsqueeze(x, axes):
    return np.expand_dims(x, tuple(int_list(axes)))


register_op("Unsqueeze", pattern=Pattern.INJECTIVE, infer=_unsqueeze_infer, evaluate=unsqueeze,
            inputs=2, shape_arith=True, compute=_unit_axes_rule("Unsqueeze"), params=(1,),
            batched=batching.reshaping)


def _transpose_perm(ctx) -> list[int]:
    rank = ctx.type(0).rank
    perm = ctx.attrs["perm"]
    if perm is None:
        return list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        raise ctx.fail(f"perm {perm} is not a permutation of the {rank} axes")
    return list(perm)


def _transpose_infer(ctx):
    s = ctx.shape(0)
    return [ctx.type(0).with_shape(s[p] for p in _transpose_perm(ctx))]


def _transpose_rule(inputs, outputs, perm):
    x = inputs[0]
    perm = list(range(x.ndim))[::-1] if perm is None else perm

    def element(*i):
        src = [None] * x.ndim
        for p, a in enumerate(perm):  # output axis p is input axis perm[p]
            src[a] = i[p]
        return x[tuple(src)]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Transpose", pattern=Pattern.INJECTIVE, infer=_transpose_infer,
            evaluate=lambda x, perm: np.transpose(x, perm), attrs={"perm": None},
            shape_arith=True, compute=_transpose_rule,
            batched=batching.transpose)


# -- DepthToSpace, SpaceToDepth ------------------------------------------------------------------


def _depth_space_check(ctx) -> tuple[Dim, Dim, Dim, Dim, int]:
    if ctx.type(0).rank != 4:
        raise ctx.fail(f"input must be 4-D (N, C, H, W), given {ctx.type(0)}")
    b = ctx.attrs["blocksize"]
    if b < 1:
        raise ctx.fail(f"blocksize must be positive, given {b}")
    if ctx.attrs["mode"] not in ("DCR", "CRD"):
        raise ctx.fail(f"mode must be DCR or CRD, given {ctx.attrs['mode']!r}")
    return (*ctx.shape(0), b)


def _depth_to_space_infer(ctx):
    n, c, h, w, b = _depth_space_check(ctx)
    if isinstance(c, int) and c % (b * b):
        raise ctx.fail(f"channels {c} do not divide by blocksize² {b * b}")
    return [ctx.type(0).with_shape((n, dim_div(c, b * b), dim_mul(h, b), dim_mul(w, b)))]


def depth_to_space(x, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":  # channels ordered (block row, block column, depth)
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:              # CRD: channels ordered (depth, block row, block column)
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _depth_to_space_rule(inputs, outputs, blocksize, mode):
    x, out, b = inputs[0], outputs[0], blocksize
    depth = dim_expr(out.shape[1])

    def element(n, c, y, w):
        dy, dx = y % b, w % b
        # DCR: input channels ordered (block row, block column, depth); CRD: (depth, row, col)
        channel = (dy * b + dx) * depth + c if mode == "DCR" else c * (b * b) + dy * b + dx
        return x[n, channel, y // b, w // b]

    return [compute(out.shape, element, dtype=out.dtype)]


register_op("DepthToSpace", pattern=Pattern.INJECTIVE, infer=_depth_to_space_infer,
            evaluate=depth_to_space, attrs={"blocksize": REQUIRED, "mode": "DCR"},
            compute=_depth_to_space_rule,
            batched=batching.data_input)


def _space_to_depth_infer(ctx):
    n, c, h, w, b = _depth_space_check(ctx)
    for d in (h, w):
        if isinstance(d, int) and d % b:
            raise ctx.fail(f"spatial dims of {ctx.type(0)} do not divide by blocksize {b}")
    return [ctx.type(0).with_shape((n, dim_mul(c, b * b), dim_div(h, b), dim_div(w, b)))]


def space_to_depth(x, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    # DCR: output channels ordered (block row, block column, depth); CRD: (depth, row, column)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


def _space_to_depth_rule(inputs, outputs, blocksize, mode):
    x, out, b = inputs[0], outputs[0], blocksize
    depth = x.shape[1]

    def element(n, oc, y, w):
        # output channels ordered (block row, block column, depth) in DCR, (depth, row, col) in CRD
        if mode == "DCR":
            c, block = oc % depth, oc // depth
        else:
            c, block = oc // (b * b), oc % (b * b)
        return x[n, c, y * b + block // b, w * b + block % b]

    return [compute(out.shape, element, dtype=out.dtype)]


register_op("SpaceToDepth", pattern=Pattern.INJECTIVE, infer=_space_to_depth_infer,
            evaluate=space_to_depth, attrs={"blocksize": REQUIRED, "mode": "DCR"},
            compute=_space_to_depth_rule,
            batched=batching.data_input)
