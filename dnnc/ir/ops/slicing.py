"""Slicing and joining ops: Concat, Split, Slice, Expand, Tile, Pad, CenterCropPad.

Their `infer` reads shape-like inputs (starts, repeats, pads, ...) with `ctx.dims(i)` or as known
ints, so sizes stay exact (symbolic where the input is); only sizes that depend on run-time data
get `ctx.fresh_dim()`. Nothing here reads ONNX.

Compute rules are index arithmetic (Concat: a Select chain over the inputs; Slice: start plus a
strided index; Pad: a source index per mode). They take output sizes from the inferred types,
so a shape input's value is only needed where it says more than the output shape does (Slice
starts and steps, Pad pads). Every load stays in bounds even in the arm of a Select not taken,
since backends may evaluate both arms (LLVM `select`).
"""

from __future__ import annotations

import numpy as np

from .. import batching
from .. import types as T
from ..compute import NoCompute, broadcast_load, compute, dim_expr
from ..loop import Expr, Select, const, logical_and, maximum, minimum
from ..types import Dim, broadcast_shapes, dim_add, dim_div, dim_mul, dim_sub
from .index_exprs import add, check_sizes_bound, clamp_index, const_int, mul, product, \
    scalar_load, sub
from .infer import check_dtype, check_same_dtype, int_list, known_ints, normalize_axes, \
    normalize_axis, shape_length
from .registry import REQUIRED, Pattern, register_op

INDEX = (T.int32, T.int64)

# Slice bounds at or beyond this mean "to the end" (exporters write INT32_MAX or INT64_MAX).
_TO_END = 2 ** 31 - 1


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
    parts = [t for t in inputs if const_int(t.shape[axis]) != 0] or inputs[:1]
    begins = [const(0)]
    for t in parts[:-1]:
        begins.append(add(begins[-1], t.shape[axis]))

    def element(*i):
        # a Select chain from the last input back; each input's index is clamped on the sides
        # where a position of another input can reach it
        value = None
        for k in reversed(range(len(parts))):
            t, j = parts[k], sub(i[axis], begins[k])
            if const_int(t.shape[axis]) == 1:
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


register_op("Concat", batched=batching.joining, pattern=Pattern.INJECTIVE, infer=_concat_infer,
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
        n = shape_length(ctx, 1, "split")
        sizes = known_ints(ctx, 1, "split")
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
    sizes = int_list(split) if split is not None else split_sizes(x.shape[axis], num_outputs)
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
            shape_arith=True, compute=_split_rule, params=(1,),
            batched=batching.splitting)

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
    n = shape_length(ctx, 1, "starts")
    axes = known_ints(ctx, 3, "axes") if ctx.has(3) else list(range(n))
    if axes is None:
        return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in s)]
    axes = normalize_axes(ctx, axes, len(s))
    starts, ends = ctx.dims(1), ctx.dims(2)
    steps = known_ints(ctx, 4, "steps") if ctx.has(4) else [1] * n
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
    starts, ends = int_list(starts), int_list(ends)
    axes = range(len(starts)) if axes is None else int_list(axes)
    steps = [1] * len(starts) if steps is None else int_list(steps)
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
    if const_int(dim) is not None:
        begin = start + const_int(dim) if start < 0 else start
        return const(min(max(begin, lo), const_int(hi)))
    return maximum(add(dim, start), lo) if start < 0 else minimum(hi, start)


def _slice_rule(inputs, outputs):
    x, starts, ends, axes, steps = (list(inputs) + [None] * 5)[:5]
    if any(t is not None and t.value is None for t in (starts, axes, steps)):
        raise NoCompute("Slice: starts, axes and steps must be known at compile time")
    if ends.value is None:  # the ends only decide the output size: take it from the type
        check_sizes_bound(inputs, outputs, "Slice")
    starts = int_list(starts.value)
    axes = range(len(starts)) if axes is None else [a % x.ndim for a in int_list(axes.value)]
    steps = [1] * len(starts) if steps is None else int_list(steps.value)
    begins = {a: (_slice_begin(x.shape[a], b, st), st) for a, b, st in zip(axes, starts, steps)}

    def element(*i):
        src = list(i)
        for a, (begin, step) in begins.items():
            src[a] = add(begin, mul(i[a], step)) if step > 0 else sub(begin, mul(i[a], -step))
        return x[tuple(src)]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Slice", pattern=Pattern.INJECTIVE, infer=_slice_infer, evaluate=slice_,
            inputs=(3, 5), shape_arith=True, compute=_slice_rule, params=(1, 2, 3, 4),
            batched=batching.slicing)

# -- Expand, Tile, Pad, CenterCropPad ------------------------------------------------------------


def _expand_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "shape")
    n = shape_length(ctx, 1, "shape")
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
    out = np.broadcast_shapes(x.shape, tuple(int_list(shape)))
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
    if shape_length(ctx, 1, "repeats") != len(s):
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
        repeats = int_list(repeats.value)

    def element(*i):
        # an axis repeated once needs no `%`
        return x[tuple(i[k] if r == 1 else i[k] % d
                       for k, (d, r) in enumerate(zip(x.shape, repeats)))]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Tile", pattern=Pattern.INJECTIVE, infer=_tile_infer,
            evaluate=lambda x, repeats: np.tile(x, int_list(repeats)), inputs=2, shape_arith=True,
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
        axes = known_ints(ctx, 3, "axes")
        if axes is None:
            return [ctx.type(0).with_shape(ctx.fresh_dim() for _ in s)]
        axes = normalize_axes(ctx, axes, len(s))
    else:
        axes = list(range(len(s)))
    if shape_length(ctx, 1, "pads") != 2 * len(axes):
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
    pads = int_list(pads)
    axes = range(data.ndim) if axes is None else [a % data.ndim for a in int_list(axes)]
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
            period = const(max(2 * const_int(size) - 2, 1)) if const_int(size) is not None \
                else maximum(sub(mul(size, 2), 2), 1)
            r = j % period
            j = Select(r < size, r, sub(period, r))
    cond = logical_and(*inside) if mode == "constant" and inside else None
    return add(j, crop), cond


def _pad_rule(inputs, outputs, mode):
    x, pads, fill, axes = (list(inputs) + [None] * 4)[:4]
    if pads.value is None or axes is not None and axes.value is None:
        raise NoCompute("Pad: pads and axes must be known at compile time")
    pads = int_list(pads.value)
    axes = range(x.ndim) if axes is None else [a % x.ndim for a in int_list(axes.value)]
    n = len(pads) // 2
    widths = {a: (pads[k], pads[k + n]) for k, a in enumerate(axes) if pads[k] or pads[k + n]}
    out = outputs[0]
    if fill is None or const_int(product(fill.shape)) == 0:
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

    if mode == "constant" and any(const_int(x.shape[a]) is not None and x.shape[a].value
                                  + min(b, 0) + min(e, 0) <= 0 for a, (b, e) in widths.items()):
        return [compute(out.shape, lambda *i: fill, dtype=out.dtype)]  # cropped to nothing
    return [compute(out.shape, element, dtype=out.dtype)]


register_op("Pad", pattern=Pattern.INJECTIVE, infer=_pad_infer, evaluate=pad,
            attrs={"mode": "constant"}, inputs=(2, 4), compute=_pad_rule, params=(1, 2, 3),
            batched=batching.padding)


def _center_crop_pad_infer(ctx):
    check_dtype(ctx, 1, INDEX, "shape")
    s = ctx.shape(0)
    axes = ctx.attrs["axes"]
    axes = list(range(len(s))) if axes is None else normalize_axes(ctx, axes, len(s))
    if shape_length(ctx, 1, "shape") != len(axes):
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
    for a, size in zip(axes, int_list(shape)):
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
    sizes = dict(zip(axes, int_list(shape.value)))
    out = outputs[0]

    def element(*i):
        src, conds = list(i), []
        for a, size in sizes.items():
            dim = x.shape[a]
            # crop: begin at (dim - size) // 2; pad: shift by (size - dim) // 2 (odd extra at
            # the end either way)
            n = const_int(dim)
            if n is not None:
                shift = (n - size) // 2 if size < n else -((size - n) // 2)
                src[a] = add(i[a], shift)
                if size <= n:
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
