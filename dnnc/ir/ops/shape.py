"""Shape ops: Shape, Size, Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Concat, Split, Slice,
Expand, Tile, Pad, ConstantOfShape, Range, Trilu, EyeLike, DepthToSpace, SpaceToDepth,
CenterCropPad.

These carry the shape arithmetic exporters write (Shape -> Gather -> Unsqueeze -> Concat ->
Reshape on a dynamic batch). Their `infer` reads shape-like inputs with `ctx.dims(i)` (known
values, possibly symbolic), so a Reshape fed by that chain still gets an exact symbolic shape;
only sizes that depend on run-time data get `ctx.fresh_dim()`. Ops marked `shape_arith` have
references that also run on object arrays holding `SymDim`s. Nothing here reads ONNX.

Compute rules are pure index arithmetic (Reshape: the row-major linear index recomputed with
`//` and `%`; Transpose: permuted indices; Concat: a Select chain over the inputs). They take
output sizes from the inferred types, so a shape input's value is only needed where it says
more than the output shape does (Slice starts and steps, Pad pads). Every load stays in bounds
even in the arm of a Select not taken, since backends may evaluate both arms (LLVM `select`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import loop as L
from .. import types as T
from ..compute import NoCompute, broadcast_load, compute, dim_expr
from ..loop import Cast, Const, Expr, Select, const, eq, free_vars, logical_and, \
    maximum, minimum
from ..types import Dim, TensorType, broadcast_shapes, dim_add, dim_div, dim_mul, dim_sub, \
    dims_product
from .infer import check_dtype, check_same_dtype, normalize_axis
from .registry import REQUIRED, Pattern, SymDim, from_dims, register_op

INDEX = (T.int32, T.int64)

# Slice bounds at or beyond this mean "to the end" (exporters write INT32_MAX or INT64_MAX).
_TO_END = 2 ** 31 - 1


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def _shape_length(ctx, i: int, what: str) -> int:
    """The length of 1-D shape-like input i; it must be static to know the output rank."""
    shape = ctx.shape(i)
    if len(shape) != 1 or not isinstance(shape[0], int):
        raise ctx.fail(f"input {i} ({what}) must be a 1-D tensor of static length, "
                       f"given {ctx.type(i)}")
    return shape[0]


def _known_ints(ctx, i: int, what: str) -> list[int] | None:
    """Input i's values as ints when known exactly (axes, repeats, pads ...), else None."""
    value = ctx.value(i)
    if value is None:
        return None
    if value.dtype.kind not in "iu":
        raise ctx.fail(f"input {i} ({what}) must be an integer tensor, given {ctx.type(i)}")
    return _ints(value)


def _normalize_axes(ctx, axes, rank: int) -> list[int]:
    out = [normalize_axis(ctx, int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        raise ctx.fail(f"axes {list(axes)} repeat an axis")
    return out


# -- compute-rule helpers (also used by indexing.py) ----------------------------------------------


def _int(e: Expr) -> int | None:
    """An index expression's value when it is a constant."""
    return e.value if isinstance(e, Const) and e.dtype is L.INDEX else None


def add(a, b) -> Expr:
    """a + b, folded when either is a constant 0 or both are constants."""
    a, b = const(a), const(b)
    if _int(b) == 0:
        return a
    if _int(a) == 0:
        return b
    if _int(a) is not None and _int(b) is not None:
        return const(_int(a) + _int(b))
    return a - (-_int(b)) if _int(b) is not None and _int(b) < 0 else a + b


def mul(a, b) -> Expr:
    """a * b, folded when either is a constant 0 or 1 or both are constants."""
    a, b = const(a), const(b)
    if _int(a) == 0 or _int(b) == 0:
        return const(0)
    if _int(b) == 1:
        return a
    if _int(a) == 1:
        return b
    if _int(a) is not None and _int(b) is not None:
        return const(_int(a) * _int(b))
    return a * b


def sub(a, b) -> Expr:
    """a - b, folded as `add`."""
    b = const(b)
    return add(a, -_int(b)) if _int(b) is not None else const(a) - b


def product(dims) -> Expr:
    """The product of index expressions (1 for none)."""
    out = const(1)
    for d in dims:
        out = mul(out, d)
    return out


def clamp_index(i: Expr, n: Expr) -> Expr:
    """`i` clamped into [0, n): what a load reads in the arm of a Select that is not taken, or
    at an out-of-range user index (as TVM's `take` mode "clip"), so it never leaves the buffer."""
    if _int(n) == 1:
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
        if _int(d) != 1:
            flat = add(mul(flat, d), i)
    return flat


def unravel(flat: Expr, dims) -> list[Expr]:
    """The row-major index in `dims` of linear index `flat`; the outermost axis of extent other
    than 1 needs no `%`, since `flat` is in range."""
    outer = next((k for k, d in enumerate(dims) if _int(d) != 1), len(dims))
    out = []
    stride = const(1)
    for k in reversed(range(len(dims))):
        d = dims[k]
        if _int(d) == 1:
            out.append(const(0))
            continue
        q = flat if _int(stride) == 1 else flat // stride
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
    n = _shape_length(ctx, 1, "shape")
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
    target = _ints(shape)
    if not allowzero:
        target = [data.shape[i] if s == 0 else s for i, s in enumerate(target)]
    return data.reshape(target)


def _reshape_rule(inputs, outputs, allowzero):
    if inputs[1].value is None:
        check_sizes_bound(inputs, outputs, "Reshape")
    return [_reshaped(inputs[0], outputs[0])]


register_op("Reshape", pattern=Pattern.INJECTIVE, infer=_reshape_infer, evaluate=reshape,
            attrs={"allowzero": 0}, inputs=2, shape_arith=True, compute=_reshape_rule, params=(1,))


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
            compute=lambda inputs, outputs, axis: [_reshaped(inputs[0], outputs[0])])


def _squeeze_infer(ctx):
    s = ctx.shape(0)
    if not ctx.has(1):
        # symbolic dims are taken as not 1: an exporter that means to squeeze them passes axes
        return [ctx.type(0).with_shape(d for d in s if d != 1)]
    axes = _known_ints(ctx, 1, "axes")
    if axes is None:  # run-time axes: only the output rank is known
        n = len(s) - _shape_length(ctx, 1, "axes")
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in range(n))]
    axes = _normalize_axes(ctx, axes, len(s))
    for a in axes:
        if isinstance(s[a], int) and s[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of size {s[a]} in {ctx.type(0)}")
    return [ctx.type(0).with_shape(d for i, d in enumerate(s) if i not in axes)]


def squeeze(x, axes=None):
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(_ints(axes)))


def _unit_axes_rule(op: str):
    """Squeeze and Unsqueeze: reshapes that drop or insert axes of extent 1; run-time axes
    leave the output shape unknown."""

    def rule(inputs, outputs):
        if len(inputs) > 1 and inputs[1] is not None and inputs[1].value is None:
            check_sizes_bound(inputs, outputs, op)
        return [_reshaped(inputs[0], outputs[0])]

    return rule


register_op("Squeeze", pattern=Pattern.INJECTIVE, infer=_squeeze_infer, evaluate=squeeze,
            inputs=(1, 2), shape_arith=True, compute=_unit_axes_rule("Squeeze"), params=(1,))


def _unsqueeze_infer(ctx):
    axes = _known_ints(ctx, 1, "axes")
    if axes is None:  # run-time axes: only the output rank is known
        n = ctx.type(0).rank + _shape_length(ctx, 1, "axes")
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in range(n))]
    rank = ctx.type(0).rank + len(axes)
    axes = _normalize_axes(ctx, axes, rank)
    rest = iter(ctx.shape(0))
    return [ctx.type(0).with_shape(1 if i in axes else next(rest) for i in range(rank))]


def unsqueeze(x, axes):
    return np.expand_dims(x, tuple(_ints(axes)))


register_op("Unsqueeze", pattern=Pattern.INJECTIVE, infer=_unsqueeze_infer, evaluate=unsqueeze,
            inputs=2, shape_arith=True, compute=_unit_axes_rule("Unsqueeze"), params=(1,))


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
            shape_arith=True, compute=_transpose_rule)

# -- Concat, Split -------------------------------------------------------------------------------


def _concat_infer(ctx):
    check_same_dtype(ctx)
    shapes = [t.shape for t in ctx.inputs]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ctx.fail(f"inputs must share one rank, given {', '.join(map(str, ctx.inputs))}")
    axis = normalize_axis(ctx, ctx.attrs["axis"], rank)
    out = []
    for i in range(rank):
        column = [s[i] for s in shapes]
        if i == axis:
            size: Dim = 0
            for d in column:
                size = dim_add(size, d)
            out.append(size)
            continue
        fixed = {d for d in column if isinstance(d, int)}
        if len(fixed) > 1:
            raise ctx.fail(f"inputs differ in dim {i}: {', '.join(map(str, ctx.inputs))}")
        out.append(fixed.pop() if fixed else column[0])
    return [ctx.type(0).with_shape(out)]


def _concat_rule(inputs, outputs, axis):
    out = outputs[0]
    axis %= len(out.shape)
    parts = [t for t in inputs if _int(t.shape[axis]) != 0] or inputs[:1]
    begins = [const(0)]
    for t in parts[:-1]:
        begins.append(add(begins[-1], t.shape[axis]))

    def element(*i):
        # a Select chain from the last input back; each input's index is clamped on the sides
        # where a position of another input can reach it
        value = None
        for k in reversed(range(len(parts))):
            t, j = parts[k], sub(i[axis], begins[k])
            if _int(t.shape[axis]) == 1:
                j = const(0)
            elif 0 < k < len(parts) - 1:
                j = clamp_index(j, t.shape[axis])
            elif k > 0:
                j = maximum(j, 0)
            elif len(parts) > 1:
                j = minimum(j, sub(t.shape[axis], 1))
            load = t[tuple(i[:axis]) + (j,) + tuple(i[axis + 1:])]
            value = load if value is None else \
                Select(i[axis] < begins[k + 1], load, value)
        return value

    return [compute(out.shape, element, dtype=out.dtype)]


register_op("Concat", pattern=Pattern.INJECTIVE, infer=_concat_infer,
            evaluate=lambda *xs, axis: np.concatenate(xs, axis=axis), attrs={"axis": REQUIRED},
            inputs=(1, None), shape_arith=True, compute=_concat_rule)


def split_sizes(dim: int, count: int) -> list[int]:
    """Sizes of `count` chunks of `dim`: equal, the last smaller when it does not divide."""
    chunk = -(-dim // count)
    return [min(chunk, max(dim - chunk * k, 0)) for k in range(count)]


def _split_infer(ctx):
    s = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attrs["axis"], len(s))
    dim = s[axis]
    count = ctx.attrs["num_outputs"]
    if ctx.has(1):
        if count is not None:
            raise ctx.fail("give either the split input or num_outputs, not both")
        n = _shape_length(ctx, 1, "split")
        sizes = _known_ints(ctx, 1, "split")
        if sizes is None:
            sizes = [ctx.fresh_dim() for _ in range(n)]
        elif isinstance(dim, int) and sum(sizes) != dim:
            raise ctx.fail(f"split {sizes} does not sum to dim {axis} of {ctx.type(0)}")
        elif any(v < 0 for v in sizes):
            raise ctx.fail(f"split {sizes} holds a negative size")
    else:
        if count is None or count < 1:
            raise ctx.fail("needs the split input or a positive num_outputs")
        if isinstance(dim, int):
            sizes = split_sizes(dim, count)
        else:  # a symbolic dim is taken to divide evenly
            sizes = [dim_div(dim, count)] * count
    return [ctx.type(0).with_shape(s[:axis] + (size,) + s[axis + 1:]) for size in sizes]


def split(x, split=None, axis=0, num_outputs=None):
    sizes = _ints(split) if split is not None else split_sizes(x.shape[axis], num_outputs)
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _split_rule(inputs, outputs, axis, num_outputs):
    x = inputs[0]
    if len(inputs) > 1 and inputs[1] is not None and inputs[1].value is None:
        check_sizes_bound(inputs, outputs, "Split")
    axis %= x.ndim
    parts, begin = [], const(0)
    for out in outputs:  # each output's size along the axis is in its inferred type
        def element(*i, begin=begin):
            return x[tuple(i[:axis]) + (add(i[axis], begin),) + tuple(i[axis + 1:])]

        parts.append(compute(out.shape, element, dtype=out.dtype))
        begin = add(begin, dim_expr(out.shape[axis]))
    return parts


register_op("Split", pattern=Pattern.INJECTIVE, infer=_split_infer, evaluate=split,
            attrs={"axis": 0, "num_outputs": None}, inputs=(1, 2), outputs=(1, None),
            shape_arith=True, compute=_split_rule, params=(1,))

# -- Slice -------------------------------------------------------------------------------------


def _slice_length(ctx, dim: Dim, start: Dim, end: Dim, step: int) -> Dim:
    """Length of dim[start:end:step]; a symbolic dim is taken to be at least as large as any
    constant bound (as symbolic shape inference in exporters assumes)."""
    if isinstance(dim, int) and isinstance(start, int) and isinstance(end, int):
        return len(range(*slice(start, end, step).indices(dim)))
    if step == 1 and start == 0 and (end == dim or isinstance(end, int) and end >= _TO_END):
        return dim
    if step == 1 and start == 0 and isinstance(end, str):
        return end  # x[:n] with a symbolic n: n (as position tables sliced to a length)
    if isinstance(start, int) and isinstance(end, int):
        if step == 1 and end >= _TO_END:
            return dim_sub(dim, start) if start >= 0 else -start
        if step == 1 and 0 <= start <= end:
            return end - start
        if step == -1 and start == -1 and end <= -_TO_END:
            return dim
    return ctx.fresh_dim()


def _slice_infer(ctx):
    for i in range(1, 5):
        check_dtype(ctx, i, INDEX, ("starts", "ends", "axes", "steps")[i - 1])
    s = ctx.shape(0)
    n = _shape_length(ctx, 1, "starts")
    axes = _known_ints(ctx, 3, "axes") if ctx.has(3) else list(range(n))
    if axes is None:
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in s)]
    axes = _normalize_axes(ctx, axes, len(s))
    starts, ends = ctx.dims(1), ctx.dims(2)
    steps = _known_ints(ctx, 4, "steps") if ctx.has(4) else [1] * n
    out = list(s)
    for k, a in enumerate(axes):
        if starts is None or ends is None or steps is None:
            out[a] = ctx.fresh_dim()
            continue
        if steps[k] == 0:
            raise ctx.fail("steps must not be 0")
        out[a] = _slice_length(ctx, s[a], starts[k], ends[k], steps[k])
    return [ctx.type(0).with_shape(out)]


def slice_(x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = range(len(starts)) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    index = [slice(None)] * x.ndim
    # NumPy's basic slicing clamps starts and ends exactly as ONNX Slice does, either direction
    for a, b, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(b, e, st)
    return x[tuple(index)].copy()


def _slice_begin(dim: Expr, start: int, step: int) -> Expr:
    """Where dim[start::step] begins, clamped as Python slicing clamps (either direction)."""
    if step > 0:
        lo, hi = 0, dim
    else:
        lo, hi = -1, sub(dim, 1)
    if _int(dim) is not None:
        begin = start + _int(dim) if start < 0 else start
        return const(min(max(begin, lo), _int(hi)))
    return maximum(add(dim, start), lo) if start < 0 else minimum(hi, start)


def _slice_rule(inputs, outputs):
    x, starts, ends, axes, steps = (list(inputs) + [None] * 5)[:5]
    if any(t is not None and t.value is None for t in (starts, axes, steps)):
        raise NoCompute("Slice: starts, axes and steps must be known at compile time")
    if ends.value is None:  # the ends only decide the output size: take it from the type
        check_sizes_bound(inputs, outputs, "Slice")
    starts = _ints(starts.value)
    axes = range(len(starts)) if axes is None else [a % x.ndim for a in _ints(axes.value)]
    steps = [1] * len(starts) if steps is None else _ints(steps.value)
    begins = {a: (_slice_begin(x.shape[a], b, st), st) for a, b, st in zip(axes, starts, steps)}

    def element(*i):
        src = list(i)
        for a, (begin, step) in begins.items():
            src[a] = add(begin, mul(i[a], step)) if step > 0 else sub(begin, mul(i[a], -step))
        return x[tuple(src)]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Slice", pattern=Pattern.INJECTIVE, infer=_slice_infer, evaluate=slice_,
            inputs=(3, 5), shape_arith=True, compute=_slice_rule, params=(1, 2, 3, 4))

# -- Expand, Tile, Pad, CenterCropPad ------------------------------------------------------------


def _expand_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "shape")
    n = _shape_length(ctx, 1, "shape")
    s = ctx.shape(0)
    target = ctx.dims(1)
    if target is None:
        # a dim other than 1 survives broadcasting; a 1 (or a missing dim) takes the target's
        rank = max(n, len(s))
        padded = (1,) * (rank - len(s)) + tuple(s)
        return [ctx.type(0).with_shape(ctx.fresh_dim() if d == 1 else d for d in padded)]
    try:
        return [ctx.type(0).with_shape(broadcast_shapes(s, tuple(target)))]
    except ValueError:
        raise ctx.fail(f"cannot expand {ctx.type(0)} to {target}") from None


def expand(x, shape):
    out = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return np.broadcast_to(x, out).copy()


def _expand_rule(inputs, outputs):
    if inputs[1].value is None:
        check_sizes_bound(inputs, outputs, "Expand")
    x, out = inputs[0], outputs[0]
    return [compute(out.shape, lambda *i: broadcast_load(x, i), dtype=out.dtype)]


register_op("Expand", pattern=Pattern.BROADCAST, infer=_expand_infer, evaluate=expand,
            inputs=2, shape_arith=True, compute=_expand_rule, params=(1,))


def _tile_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "repeats")
    s = ctx.shape(0)
    if _shape_length(ctx, 1, "repeats") != len(s):
        raise ctx.fail(f"repeats must have one entry per axis of {ctx.type(0)}")
    repeats = ctx.dims(1)
    if repeats is None:
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in s)]
    return [ctx.type(0).with_shape(dim_mul(d, r) for d, r in zip(s, repeats))]


def _tile_rule(inputs, outputs):
    x, repeats = inputs
    if repeats.value is None:
        check_sizes_bound(inputs, outputs, "Tile")
        repeats = [None] * x.ndim
    else:
        repeats = _ints(repeats.value)

    def element(*i):
        # an axis repeated once needs no `%`
        return x[tuple(i[k] if r == 1 else i[k] % d
                       for k, (d, r) in enumerate(zip(x.shape, repeats)))]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Tile", pattern=Pattern.INJECTIVE, infer=_tile_infer,
            evaluate=lambda x, repeats: np.tile(x, _ints(repeats)), inputs=2, shape_arith=True,
            compute=_tile_rule, params=(1,))

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "pads")
    if ctx.attrs["mode"] not in PAD_MODES:
        raise ctx.fail(f"mode {ctx.attrs['mode']!r} is not one of {', '.join(PAD_MODES)}")
    if ctx.has(2):
        check_same_dtype(ctx, 0, 2)
        if ctx.type(2).numel not in (None, 1):
            raise ctx.fail(f"constant_value must hold one element, given {ctx.type(2)}")
    s = ctx.shape(0)
    if ctx.has(3):
        axes = _known_ints(ctx, 3, "axes")
        if axes is None:
            return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in s)]
        axes = _normalize_axes(ctx, axes, len(s))
    else:
        axes = list(range(len(s)))
    if _shape_length(ctx, 1, "pads") != 2 * len(axes):
        raise ctx.fail(f"pads must hold 2 entries per padded axis ({2 * len(axes)}), "
                       f"given {ctx.type(1)}")
    pads = ctx.dims(1)
    out = list(s)
    for k, a in enumerate(axes):
        if pads is None:
            out[a] = ctx.fresh_dim()
        else:
            out[a] = dim_add(dim_add(s[a], pads[k]), pads[k + len(axes)])
            if isinstance(out[a], int) and out[a] < 0:
                raise ctx.fail(f"pads {pads} crop axis {a} of {ctx.type(0)} below size 0")
    return [ctx.type(0).with_shape(out)]


def pad(data, pads, constant_value=None, axes=None, mode="constant"):
    pads = _ints(pads)
    axes = range(data.ndim) if axes is None else [a % data.ndim for a in _ints(axes)]
    n = len(pads) // 2
    width = [(0, 0)] * data.ndim
    crop = [slice(None)] * data.ndim
    for k, a in enumerate(axes):
        begin, end = pads[k], pads[k + n]
        # negative pads remove elements: crop first, then pad with what remains
        crop[a] = slice(max(-begin, 0), data.shape[a] - max(-end, 0))
        width[a] = (max(begin, 0), max(end, 0))
    data = data[tuple(crop)]
    if mode == "constant":
        value = 0 if constant_value is None or constant_value.size == 0 \
            else constant_value.reshape(-1)[0]
        return np.pad(data, width, mode="constant", constant_values=value)
    return np.pad(data, width, mode=mode)


def _pad_source(i: Expr, dim: Expr, begin: int, end: int, mode: str):
    """Where output position `i` of a padded axis reads, and the condition for reading there
    (None: always; constant mode reads the fill value elsewhere)."""
    crop = max(-begin, 0)
    before, after = max(begin, 0), max(end, 0)
    size = sub(dim, crop + max(-end, 0))  # what remains of the axis after negative pads crop it
    j = sub(i, before)
    inside = []
    if mode in ("constant", "edge"):
        if before:
            inside.append(j >= 0)
        if after:
            inside.append(j < size)
        if before and after:
            j = clamp_index(j, size)
        elif before:
            j = maximum(j, 0)
        elif after:
            j = minimum(j, sub(size, 1))
    elif before or after:
        if mode == "wrap":
            j = j % size
        else:  # reflect without repeating the edge: a triangle wave of period 2 (size - 1)
            period = const(max(2 * _int(size) - 2, 1)) if _int(size) is not None \
                else maximum(sub(mul(size, 2), 2), 1)
            r = j % period
            j = Select(r < size, r, sub(period, r))
    cond = logical_and(*inside) if mode == "constant" and inside else None
    return add(j, crop), cond


def _pad_rule(inputs, outputs, mode):
    x, pads, fill, axes = (list(inputs) + [None] * 4)[:4]
    if pads.value is None or axes is not None and axes.value is None:
        raise NoCompute("Pad: pads and axes must be known at compile time")
    pads = _ints(pads.value)
    axes = range(x.ndim) if axes is None else [a % x.ndim for a in _ints(axes.value)]
    n = len(pads) // 2
    widths = {a: (pads[k], pads[k + n]) for k, a in enumerate(axes) if pads[k] or pads[k + n]}
    out = outputs[0]
    if fill is None or _int(product(fill.shape)) == 0:
        fill = const(0, out.dtype)
    else:
        fill = scalar_load(fill)

    def element(*i):
        src, conds = list(i), []
        for a, (begin, end) in widths.items():
            src[a], cond = _pad_source(i[a], x.shape[a], begin, end, mode)
            if cond is not None:
                conds.append(cond)
        value = x[tuple(src)]
        return Select(logical_and(*conds), value, fill) if conds else value

    if mode == "constant" and any(_int(x.shape[a]) is not None and x.shape[a].value
                                  + min(b, 0) + min(e, 0) <= 0 for a, (b, e) in widths.items()):
        return [compute(out.shape, lambda *i: fill, dtype=out.dtype)]  # cropped to nothing
    return [compute(out.shape, element, dtype=out.dtype)]


register_op("Pad", pattern=Pattern.INJECTIVE, infer=_pad_infer, evaluate=pad,
            attrs={"mode": "constant"}, inputs=(2, 4), compute=_pad_rule, params=(1, 2, 3))


def _center_crop_pad_infer(ctx):
    check_dtype(ctx, 1, INDEX, "shape")
    s = ctx.shape(0)
    axes = ctx.attrs["axes"]
    axes = list(range(len(s))) if axes is None else _normalize_axes(ctx, axes, len(s))
    if _shape_length(ctx, 1, "shape") != len(axes):
        raise ctx.fail(f"shape must hold one size per axis ({len(axes)}), given {ctx.type(1)}")
    sizes = ctx.dims(1)
    out = list(s)
    for k, a in enumerate(axes):
        out[a] = ctx.fresh_dim() if sizes is None else sizes[k]
    return [ctx.type(0).with_shape(out)]


def center_crop_pad(x, shape, axes=None):
    axes = range(x.ndim) if axes is None else [a % x.ndim for a in axes]
    out_shape = list(x.shape)
    src = [slice(None)] * x.ndim
    dst = [slice(None)] * x.ndim
    for a, size in zip(axes, _ints(shape)):
        dim = x.shape[a]
        out_shape[a] = size
        if size < dim:  # crop, the extra element (odd difference) taken from the end
            start = (dim - size) // 2
            src[a] = slice(start, start + size)
        else:           # pad with zeros, the extra element going to the end
            start = (size - dim) // 2
            dst[a] = slice(start, start + dim)
    out = np.zeros(out_shape, dtype=x.dtype)
    out[tuple(dst)] = x[tuple(src)]
    return out


def _center_crop_pad_rule(inputs, outputs, axes):
    x, shape = inputs
    if shape.value is None:
        raise NoCompute("CenterCropPad: the target shape must be known at compile time")
    axes = range(x.ndim) if axes is None else [a % x.ndim for a in axes]
    sizes = dict(zip(axes, _ints(shape.value)))
    out = outputs[0]

    def element(*i):
        src, conds = list(i), []
        for a, size in sizes.items():
            dim = x.shape[a]
            # crop: begin at (dim - size) // 2; pad: shift by (size - dim) // 2 (odd extra at
            # the end either way)
            if _int(dim) is not None:
                shift = (_int(dim) - size) // 2 if size < _int(dim) else -((size - _int(dim)) // 2)
                src[a] = add(i[a], shift)
                if size <= _int(dim):
                    continue
            else:
                src[a] = add(i[a], Select(dim > size, (dim - size) // 2, -((size - dim) // 2)))
            conds.append(logical_and(src[a] >= 0, src[a] < dim))
            src[a] = clamp_index(src[a], dim)
        value = x[tuple(src)]
        return Select(logical_and(*conds), value, const(0, out.dtype)) if conds else value

    return [compute(out.shape, element, dtype=out.dtype)]


register_op("CenterCropPad", pattern=Pattern.INJECTIVE, infer=_center_crop_pad_infer,
            evaluate=center_crop_pad, attrs={"axes": None}, inputs=2,
            compute=_center_crop_pad_rule, params=(1, 2))

# -- ConstantOfShape, Range, EyeLike, Trilu ------------------------------------------------------


def _fill_value(value) -> np.ndarray:
    return np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)


def _constant_of_shape_infer(ctx):
    check_dtype(ctx, 0, (T.int64,), "shape")
    n = _shape_length(ctx, 0, "shape")
    value = _fill_value(ctx.attrs["value"])
    if value.size != 1:
        raise ctx.fail(f"value must hold one element, given {value.size}")
    dtype = T.DType.from_numpy(value.dtype)
    dims = ctx.dims(0)
    if dims is None:
        dims = [ctx.fresh_dim() for _ in range(n)]
    elif any(isinstance(d, int) and d < 0 for d in dims):
        raise ctx.fail(f"shape {dims} holds a negative size")
    return [TensorType(dtype, tuple(dims))]


def constant_of_shape(shape, value=None):
    value = _fill_value(value)
    return np.full(_ints(shape), value[0], dtype=value.dtype)


def _constant_of_shape_rule(inputs, outputs, value):
    if inputs[0].value is None:
        check_sizes_bound(inputs, outputs, "ConstantOfShape")
    out = outputs[0]
    fill = const(_fill_value(value)[0].item(), out.dtype)
    return [compute(out.shape, lambda *i: fill, dtype=out.dtype)]


register_op("ConstantOfShape", pattern=Pattern.OPAQUE, infer=_constant_of_shape_infer,
            evaluate=constant_of_shape, attrs={"value": None}, shape_arith=True,
            compute=_constant_of_shape_rule, params=(0,))


def range_length(start, limit, delta) -> int:
    """ONNX Range's element count: max(ceil((limit - start) / delta), 0)."""
    if all(isinstance(v, (int, np.integer)) for v in (start, limit, delta)):
        return max(-((int(start) - int(limit)) // int(delta)), 0)
    return max(math.ceil((float(limit) - float(start)) / float(delta)), 0)


def _range_infer(ctx):
    check_same_dtype(ctx)
    check_dtype(ctx, 0, (T.int16, T.int32, T.int64) + T.FLOAT_DTYPES)
    if ctx.attrs["stash_type"] not in (T.float32, T.float64):
        raise ctx.fail(f"stash_type must be float32 or float64, given {ctx.attrs['stash_type']}")
    for i in range(3):
        if ctx.type(i).numel != 1:  # exporters also pass 1-element vectors
            raise ctx.fail(f"input {i} must be a scalar, given {ctx.type(i)}")
    values = [ctx.value(i) for i in range(3)]
    if all(v is not None for v in values):
        start, limit, delta = (v.item() for v in values)
        if delta == 0:
            raise ctx.fail("delta must not be 0")
        return [TensorType(ctx.dtype(0), (range_length(start, limit, delta),))]
    parts = [ctx.partial(i) for i in range(3)]
    if all(p is not None for p in parts):
        start, limit, delta = (p.reshape(()).item() for p in parts)
        if isinstance(limit, SymDim) and isinstance(start, int) and delta == 1:
            return [TensorType(ctx.dtype(0), (dim_sub(limit.dim, start),))]
    return [TensorType(ctx.dtype(0), (ctx.fresh_dim(),))]


def range_(start, limit, delta, stash_type=T.float32):
    n = range_length(start.item(), limit.item(), delta.item())
    if start.dtype == object:
        return np.array([start.item() + i * delta.item() for i in range(n)], dtype=object)
    if start.dtype.kind in "iu":
        return (start + np.arange(n, dtype=np.int64) * delta).astype(start.dtype)
    # float16 and bfloat16 accumulate in stash_type (ONNX 27); float32 as float64, as NumPy
    work = stash_type.np if start.dtype.itemsize < 4 else np.float64
    return (start.astype(work) + np.arange(n, dtype=work) * delta.astype(work)).astype(start.dtype)


def _range_rule(inputs, outputs, stash_type):
    start, limit, delta = inputs
    if start.value is None or delta.value is None:
        raise NoCompute("Range: start and delta must be known at compile time")
    if limit.value is None:
        check_sizes_bound(inputs, outputs, "Range")
    out = outputs[0]
    first, step = start.value.reshape(-1)[0].item(), delta.value.reshape(-1)[0].item()
    if out.dtype.is_int:
        return [compute(out.shape, lambda i: mul(i, step) + first, dtype=out.dtype)]
    # as the reference: float16/bfloat16 in stash_type, float32 and float64 in float64
    work = stash_type if out.dtype.itemsize < 4 else T.float64
    return [compute(out.shape, lambda i: Const(first, work) + Cast(work, i) * Const(step, work),
                    dtype=out.dtype)]


register_op("Range", pattern=Pattern.OPAQUE, infer=_range_infer, evaluate=range_, inputs=3,
            attrs={"stash_type": T.float32}, shape_arith=True, compute=_range_rule, params=(0, 1, 2))


def _eye_like_infer(ctx):
    if ctx.type(0).rank != 2:
        raise ctx.fail(f"input must be 2-D, given {ctx.type(0)}")
    return [TensorType(ctx.attrs["dtype"] or ctx.dtype(0), ctx.shape(0))]


def eye_like(x, dtype=None, k=0):
    return np.eye(x.shape[0], x.shape[1], k, dtype=(dtype.np if dtype else x.dtype))


def _eye_like_rule(inputs, outputs, dtype, k):
    out = outputs[0]
    one, zero = const(1, out.dtype), const(0, out.dtype)
    return [compute(out.shape, lambda i, j: Select(eq(j - i, k), one, zero), dtype=out.dtype)]


register_op("EyeLike", pattern=Pattern.OPAQUE, infer=_eye_like_infer, evaluate=eye_like,
            attrs={"dtype": None, "k": 0}, compute=_eye_like_rule)


def _trilu_infer(ctx):
    if ctx.type(0).rank < 2:
        raise ctx.fail(f"input must have rank 2 or more, given {ctx.type(0)}")
    check_dtype(ctx, 1, (T.int64,), "k")
    return [ctx.type(0)]


def trilu(x, k=None, upper=1):
    k = 0 if k is None else int(k)
    return np.triu(x, k) if upper else np.tril(x, k)


def _trilu_rule(inputs, outputs, upper):
    x, k = (list(inputs) + [None])[:2]
    if k is None:
        k = const(0)
    elif k.value is not None:
        k = const(int(k.value.reshape(-1)[0]))
    else:  # a run-time diagonal is just another operand
        k = as_index(scalar_load(k))
    zero = const(0, x.dtype)

    def element(*i):
        diagonal = i[-1] - i[-2]
        keep = diagonal >= k if upper else diagonal <= k
        return Select(keep, x[i], zero)

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Trilu", pattern=Pattern.INJECTIVE, infer=_trilu_infer, evaluate=trilu,
            attrs={"upper": 1}, inputs=(1, 2), compute=_trilu_rule, params=(1,))

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
            compute=_depth_to_space_rule)


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
            compute=_space_to_depth_rule)
