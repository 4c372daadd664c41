"""Indexing ops: gathers, scatters, selections with data-dependent sizes, TopK, OneHot, Unique,
NonMaxSuppression.

References follow the newest ONNX semantics (negative indices wrap; ScatterElements/ScatterND
reductions none/add/mul/max/min; TopK ties go to the lower index). Ops whose output size
depends on the data (NonZero, Compress, Unique, NonMaxSuppression, TopK with a run-time k)
get a fresh symbolic dim. Gather and friends also run on object arrays of SymDims, so that
Shape -> Gather -> Concat -> Reshape keeps a dynamic batch symbolic.

Compute rules read indices as data: an index is a Load of the indices tensor, wrapped when
negative and clamped into range (as TVM's `take` mode "clip"), so no load ever leaves its
buffer, even at a bad index or in the arm of a Select not taken; the gathers' indices are also
checked at run time (`loop.index_checks`: an out-of-range one is reported as the reference
raises it, naming the node). Scatters, sorting and
selections of data-dependent size have no loop form here (NoCompute: a host fallback), but
for IndexCopy (a few positions along one axis: a KV cache's write, a Select per position).
"""

from __future__ import annotations

import numpy as np

from .. import batching
from .. import types as T
from ...errors import IndexRangeError
from ..compute import NoCompute, compute, dim_expr, reduce_axis, reduce_max, reduce_sum
from ..loop import (Select, const, eq, index_checks, logical_and, logical_or, maximum,
                     minimum, ne)
from .index_exprs import as_index, check_sizes_bound, clamp_index, const_int, unravel
from .infer import check_dtype, check_same_dtype, normalize_axis
from .registry import Pattern, register_op

INDEX_DTYPES = (T.int32, T.int64)
NUMERIC = T.FLOAT_DTYPES + T.INT_DTYPES
_LOW_PRECISION = ("float16", "bfloat16")


def _wrap(indices: np.ndarray, size) -> np.ndarray:
    """Negative indices counted from the end, as ONNX allows for every indexing op."""
    indices = np.asarray(indices)
    return np.where(indices < 0, indices + size, indices)


def _checked_wrap(indices: np.ndarray, size) -> np.ndarray:
    """`_wrap` for the ops that read or write at each index (gathers, scatters): an index
    outside [-size, size - 1] raises `IndexRangeError`, which the interpreter reports as an
    `InputError` naming the node, as onnxruntime refuses it. (OneHot maps such an index to an
    all-off row: it uses `_wrap`.)"""
    indices = np.asarray(indices)
    bound = np.broadcast_to(np.asarray(size), indices.shape)
    bad = (indices < -bound) | (indices >= bound)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])   # flat: a 0-d index too
        raise IndexRangeError(int(indices.reshape(-1)[first]), int(bound.reshape(-1)[first]))
    return np.where(indices < 0, indices + bound, indices)


def _index(value, size):
    """A read index into an axis of `size`: negative values count from the end; checked at
    run time (an out-of-range one is the caller's error, as the reference raises) and clamped
    (the kernel goes on without a load past the buffer until the runtime reports it)."""
    value = as_index(value)
    checked = index_checks.checked(value, size)
    wrapped = Select(checked < 0, value + size, value)
    if checked is not value and const_int(size) == 1:
        return minimum(maximum(wrapped, 0), 0)   # clamp_index folds to 0, dropping the check
    return clamp_index(wrapped, size)


def _host_only(reason: str):
    """The rule of an op with no loop form: its node runs as a host fallback."""

    def rule(inputs, outputs, **attrs):
        raise NoCompute(reason)

    return rule


def _scalar_count(ctx, i: int, what: str):
    """A one-element integer input (k, depth) as an int, a symbolic dim, or None if unknown."""
    t = ctx.type(i)
    if t.numel is not None and t.numel != 1:
        raise ctx.fail(f"{what} must hold exactly one element, given {t}")
    known = ctx.value(i)
    if known is not None:
        return int(np.asarray(known).reshape(-1)[0])
    dims = ctx.dims(i)
    return dims[0] if dims is not None and len(dims) == 1 else None


# -- Gather, GatherElements, GatherND -----------------------------------------------------------


def _gather_infer(ctx):
    check_dtype(ctx, 1, INDEX_DTYPES, "indices")
    data = ctx.shape(0)
    if not data:
        raise ctx.fail("data must have rank >= 1")
    axis = normalize_axis(ctx, ctx.attrs["axis"], len(data))
    shape = data[:axis] + ctx.shape(1) + data[axis + 1:]
    return [T.TensorType(ctx.dtype(0), shape)]


def gather(data, indices, axis):
    axis = axis % data.ndim
    return np.asarray(np.take(data, _checked_wrap(indices, data.shape[axis]), axis=axis))


def _gather_elements_infer(ctx):
    check_dtype(ctx, 1, INDEX_DTYPES, "indices")
    rank = ctx.type(0).rank
    if rank == 0 or ctx.type(1).rank != rank:
        raise ctx.fail(f"data and indices must have the same rank >= 1, given "
                       f"{ctx.type(0)} and {ctx.type(1)}")
    normalize_axis(ctx, ctx.attrs["axis"], rank)
    return [T.TensorType(ctx.dtype(0), ctx.shape(1))]


def gather_elements(data, indices, axis):
    axis = axis % data.ndim
    return np.take_along_axis(data, _checked_wrap(indices, data.shape[axis]), axis=axis)


def _gather_nd_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "indices")
    data, idx, b = ctx.shape(0), ctx.shape(1), ctx.attrs["batch_dims"]
    if not idx or not data:
        raise ctx.fail("data and indices must have rank >= 1")
    k = idx[-1]
    if not isinstance(k, int):
        raise ctx.fail(f"the last dim of indices must be static, given {ctx.type(1)}")
    if not 0 <= b < min(len(data), len(idx)) or b + k > len(data):
        raise ctx.fail(f"batch_dims {b} and index depth {k} do not fit data {ctx.type(0)} "
                       f"and indices {ctx.type(1)}")
    return [T.TensorType(ctx.dtype(0), idx[:-1] + data[b + k:])]


def gather_nd(data, indices, batch_dims):
    b, k = batch_dims, indices.shape[-1]
    batch = data.shape[:b]
    flat_data = data.reshape((-1,) + data.shape[b:])
    flat_idx = indices.reshape((flat_data.shape[0], -1, k))
    out = []
    for d, idx in zip(flat_data, flat_idx):
        idx = _checked_wrap(idx, np.array(d.shape[:k]))
        out.append(np.stack([d[tuple(i)] for i in idx]) if len(idx) else
                   np.empty((0,) + d.shape[k:], data.dtype))
    out = np.stack(out) if out else np.empty((0, 0) + data.shape[b + k:], data.dtype)
    return out.reshape(indices.shape[:-1] + data.shape[b + k:])


def _gather_rule(inputs, outputs, axis):
    data, indices = inputs
    axis %= data.ndim
    size, q = data.shape[axis], indices.ndim
    known = indices.value
    fixed = None
    if known is not None and known.size == 1:  # x[:, k]: a constant index, no load of it
        k = int(known.reshape(-1)[0])
        n = const_int(size)
        if n is not None and -n <= k < n:   # else clamped below as a run-time index is
            fixed = const(k) if k >= 0 else size + k

    def element(*i):
        at = fixed if fixed is not None else _index(indices[tuple(i[axis:axis + q])], size)
        return data[tuple(i[:axis]) + (at,) + tuple(i[axis + q:])]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


def _gather_elements_rule(inputs, outputs, axis):
    data, indices = inputs
    axis %= data.ndim

    def element(*i):
        at = _index(indices[i], data.shape[axis])
        return data[tuple(i[:axis]) + (at,) + tuple(i[axis + 1:])]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


def _gather_nd_rule(inputs, outputs, batch_dims):
    data, indices = inputs
    b, q, k = batch_dims, indices.ndim, indices.shape[-1].value

    def element(*i):
        # output axes: indices' leading q - 1 axes (batch axes first), then data's trailing axes
        lead = tuple(i[:q - 1])
        at = tuple(_index(indices[lead + (const(j),)], data.shape[b + j]) for j in range(k))
        return data[tuple(i[:b]) + at + tuple(i[q - 1:])]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("Gather", pattern=Pattern.INJECTIVE, infer=_gather_infer, evaluate=gather,
            attrs={"axis": 0}, inputs=2, shape_arith=True, compute=_gather_rule,
            batched=batching.gather)
register_op("GatherElements", pattern=Pattern.INJECTIVE, infer=_gather_elements_infer,
            evaluate=gather_elements, attrs={"axis": 0}, inputs=2, shape_arith=True,
            compute=_gather_elements_rule)
register_op("GatherND", pattern=Pattern.INJECTIVE, infer=_gather_nd_infer, evaluate=gather_nd,
            attrs={"batch_dims": 0}, inputs=2, shape_arith=True, compute=_gather_nd_rule)

# -- ScatterElements, ScatterND, TensorScatter, IndexCopy ---------------------------------------------------

_REDUCE_AT = {"add": np.add.at, "mul": np.multiply.at, "max": np.maximum.at,
              "min": np.minimum.at}


def _check_reduction(ctx):
    if ctx.attrs["reduction"] not in ("none", *_REDUCE_AT):
        raise ctx.fail(f"reduction {ctx.attrs['reduction']!r} is not one of none, add, mul, "
                       f"max, min")


def _scatter(out, index, updates, reduction):
    """out[index] = updates, or combined with `reduction`, in index order (duplicates apply)."""
    dtype = out.dtype
    low = dtype.name in _LOW_PRECISION and reduction != "none"
    if low:  # ufunc.at has no float16/bfloat16 loops everywhere; combine in float32
        out, updates = out.astype(np.float32), updates.astype(np.float32)
    if reduction == "none":
        out[index] = updates
    else:
        _REDUCE_AT[reduction](out, index, updates)
    return out.astype(dtype) if low else out


def _scatter_elements_infer(ctx):
    check_dtype(ctx, 1, INDEX_DTYPES, "indices")
    check_same_dtype(ctx, 0, 2)
    _check_reduction(ctx)
    rank = ctx.type(0).rank
    if rank == 0 or ctx.type(1).rank != rank or ctx.type(2).rank != rank:
        raise ctx.fail(f"data, indices and updates must have one rank >= 1, given "
                       f"{ctx.type(0)}, {ctx.type(1)} and {ctx.type(2)}")
    normalize_axis(ctx, ctx.attrs["axis"], rank)
    return [ctx.type(0)]


def scatter_elements(data, indices, updates, axis, reduction):
    axis = axis % data.ndim
    index = list(np.indices(indices.shape, sparse=True))
    index[axis] = _checked_wrap(indices, data.shape[axis])
    return _scatter(data.copy(), tuple(index), updates, reduction)


def _scatter_nd_infer(ctx):
    check_dtype(ctx, 1, (T.int64,), "indices")
    check_same_dtype(ctx, 0, 2)
    _check_reduction(ctx)
    data, idx, upd = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if not idx or not data:
        raise ctx.fail("data and indices must have rank >= 1")
    k = idx[-1]
    if isinstance(k, int):
        if k > len(data):
            raise ctx.fail(f"index depth {k} exceeds the rank of data {ctx.type(0)}")
        want = idx[:-1] + data[k:]
        if len(upd) != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                        for a, b in zip(upd, want)):
            raise ctx.fail(f"updates must have shape {list(want)}, given {ctx.type(2)}")
    return [ctx.type(0)]


def scatter_nd(data, indices, updates, reduction):
    k = indices.shape[-1]
    idx = _checked_wrap(indices.reshape(-1, k), np.array(data.shape[:k]))
    upd = updates.reshape((idx.shape[0],) + data.shape[k:])
    return _scatter(data.copy(), tuple(idx.T), upd, reduction)


# An output element of a scatter is whichever update lands on it last (or all of them,
# combined): with colliding run-time indices that is a search over every update per element,
# quadratic, so scatters run on the host.
_SCATTER_ON_HOST = _host_only("scatters write where their run-time indices say; an output "
                              "element is not an expression of its own index")
register_op("ScatterElements", pattern=Pattern.OPAQUE, infer=_scatter_elements_infer,
            evaluate=scatter_elements, attrs={"axis": 0, "reduction": "none"}, inputs=3,
            shape_arith=True, compute=_SCATTER_ON_HOST)
register_op("ScatterND", pattern=Pattern.OPAQUE, infer=_scatter_nd_infer, evaluate=scatter_nd,
            attrs={"reduction": "none"}, inputs=3, shape_arith=True, compute=_SCATTER_ON_HOST)


def _tensor_scatter_infer(ctx):
    check_same_dtype(ctx, 0, 1)
    check_dtype(ctx, 2, (T.int64,), "write_indices")
    if ctx.attrs["mode"] not in ("linear", "circular"):
        raise ctx.fail(f"mode {ctx.attrs['mode']!r} is not linear or circular")
    cache, update = ctx.shape(0), ctx.shape(1)
    axis = normalize_axis(ctx, ctx.attrs["axis"], len(cache))
    if axis == 0 or len(update) != len(cache):
        raise ctx.fail(f"axis {ctx.attrs['axis']} must not be the batch axis, and update "
                       f"{ctx.type(1)} must have the rank of past_cache {ctx.type(0)}")
    return [ctx.type(0)]


def tensor_scatter(cache, update, write_indices=None, axis=-2, mode="linear"):
    axis = axis % cache.ndim
    out = cache.copy()
    size, length = cache.shape[axis], update.shape[axis]
    starts = np.zeros(cache.shape[0], np.int64) if write_indices is None else write_indices
    for b, start in enumerate(starts):
        pos = start + np.arange(length)
        if mode == "circular":
            pos = pos % size
        dst = np.moveaxis(out[b], axis - 1, 0)  # a view: writing it writes `out`
        dst[pos] = np.moveaxis(update[b], axis - 1, 0)
    return out


def _tensor_scatter_rule(inputs, outputs, axis, mode):
    # unlike the general scatters, each batch writes one contiguous (or circular) run, so an
    # output element knows which update element lands on it: a per-element expression
    cache, update, starts = (list(inputs) + [None])[:3]
    axis %= cache.ndim
    size, length = cache.shape[axis], update.shape[axis]

    def element(*i):
        start = const(0) if starts is None else as_index(starts[i[0]])
        offset = i[axis] - start
        if mode == "circular":
            offset = offset % size
            # when the run is longer than the cache, its last lap wins
            offset = offset + (length - 1 - offset) // size * size
        src = list(i)
        src[axis] = clamp_index(offset, length)
        written = logical_and(offset >= 0, offset < length)
        return Select(written, update[tuple(src)], cache[i])

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("TensorScatter", pattern=Pattern.OPAQUE, infer=_tensor_scatter_infer,
            evaluate=tensor_scatter, attrs={"axis": -2, "mode": "linear"}, inputs=(2, 3),
            compute=_tensor_scatter_rule)


def _index_copy_infer(ctx):
    check_same_dtype(ctx, 0, 2)
    check_dtype(ctx, 1, (T.int64,), "index")
    data, index, updates = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    axis = normalize_axis(ctx, ctx.attrs["axis"], len(data))
    want = data[:axis] + index + data[axis + 1:]
    if len(index) != 1 or len(updates) != len(data) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(updates, want)):
        raise ctx.fail(f"index must be 1-D and updates of shape {list(want)}, given "
                       f"{ctx.type(1)} and {ctx.type(2)}")
    return [ctx.type(0)]


def index_copy(data, index, updates, axis):
    out = data.copy()
    axis %= data.ndim
    np.moveaxis(out, axis, 0)[_checked_wrap(index, data.shape[axis])] = \
        np.moveaxis(updates, axis, 0)
    return out


INDEX_COPY_MOST = 64
"""Positions an IndexCopy kernel compares each element against (one Select each; in place,
each written element against the later positions): a decode step writes 1, a prompt its
length. A longer index, or one of a length known only at run time (a prompt under dynamic
shapes), takes the staged form (`_last_writers`), which writes the whole array."""


def _short_count(index) -> int | None:
    """The index's length where a Select per position takes it (known, at most
    INDEX_COPY_MOST), else None."""
    count = const_int(index.shape[0])
    return count if count is not None and count <= INDEX_COPY_MOST else None


def _index_copy_count(index) -> int:
    count = _short_count(index)
    if count is None:
        raise NoCompute(f"IndexCopy of {index.shape[0]} positions (at most {INDEX_COPY_MOST} "
                        f"written in place; the staged form writes the whole array)")
    return count


def _last_writers(index, size):
    """A stage of `size` elements along the copy's axis: 1 + the last position j of `index`
    that writes there (the reference's last write wins), 0 where none does. Its work is the
    axis's size times the index's length, whatever the other dimensions."""
    q = reduce_axis(index.shape[0])
    return compute((size,), lambda at: reduce_max(
        Select(eq(_index(index[(q.var,)], size), at), q.var + 1, const(0)), q),
        name="last_writer")


def _index_copy_rule(inputs, outputs, axis):
    # each output element is data's, or the last update whose position is its index: a
    # Select per position, reading data only at the element's own index (`in_place=0`); an
    # index longer than INDEX_COPY_MOST, or of a run-time length, through `_last_writers`
    data, index, updates = inputs
    axis %= data.ndim
    count = _short_count(index)
    if count is None:
        last = _last_writers(index, data.shape[axis])

        def staged(*i):
            writer = last[(i[axis],)]
            src = list(i)
            src[axis] = clamp_index(writer - 1, index.shape[0])
            return Select(writer > 0, updates[tuple(src)], data[i])

        return [compute(outputs[0].shape, staged, dtype=outputs[0].dtype)]

    def element(*i):
        out = data[i]
        for j in range(count):
            src = list(i)
            src[axis] = const(j)
            out = Select(eq(i[axis], _index(index[(const(j),)], data.shape[axis])),
                         updates[tuple(src)], out)
        return out

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


def _index_copy_updates(inputs, outputs, axis):
    # in place (`OpDef.updates`): each element of `updates` stored at its position, unless a
    # later position of the index is the same one (the last write wins, as the reference's)
    data, index, updates = inputs
    axis %= data.ndim
    count = _index_copy_count(index)
    values = compute(updates.shape, lambda *i: updates[i], dtype=outputs[0].dtype)

    def where(*i):
        def position(j):
            return _index(index[(j,)], data.shape[axis])
        at = position(i[axis])
        last = logical_and(*(logical_or(i[axis] >= j, ne(position(const(j)), at))
                             for j in range(1, count)))
        return (*i[:axis], at, *i[axis + 1:]), (last if count > 1 else None)

    return values, where


register_op("IndexCopy", pattern=Pattern.OPAQUE, infer=_index_copy_infer, evaluate=index_copy,
            attrs={"axis": 0}, inputs=3, compute=_index_copy_rule, in_place=0,
            updates=_index_copy_updates)

# -- selections of data-dependent size: Compress, NonZero ----------------------------------------


def _compress_infer(ctx):
    check_dtype(ctx, 1, (T.bool_,), "condition")
    if ctx.type(1).rank != 1:
        raise ctx.fail(f"condition must be 1-D, given {ctx.type(1)}")
    cond = ctx.value(1)
    size = int(np.count_nonzero(cond)) if cond is not None else ctx.fresh_dim()
    axis = ctx.attrs["axis"]
    if axis is None:
        return [T.TensorType(ctx.dtype(0), (size,))]
    shape = list(ctx.shape(0))
    axis = normalize_axis(ctx, axis, len(shape))
    shape[axis] = size
    return [T.TensorType(ctx.dtype(0), shape)]


def compress(data, condition, axis):
    return np.compress(condition, data, axis=axis)


def nonzero(x):
    if x.ndim == 0:  # NumPy 2 refuses 0-d nonzero; a scalar has no coordinates to list
        return np.zeros((0, int(x != 0)), np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


def _picked_positions(condition, count):
    """Position of the i-th true of `condition`, a tensor of `count` elements: the number of
    places whose running count of trues is still <= i (two small reduction stages)."""
    n = condition.shape[0]
    q, p = reduce_axis(n), reduce_axis(n)
    seen = compute((n,), lambda at: reduce_sum(Select(condition[q], const(1), const(0)), q,
                                               where=q.var <= at))
    return compute((count,), lambda i: reduce_sum(Select(seen[p] <= i, const(1), const(0)), p))


def _compress_rule(inputs, outputs, axis):
    data, condition = inputs
    if condition.value is None:
        raise NoCompute("Compress: the condition decides the output size; it must be known at "
                        "compile time")
    out = outputs[0]
    axis = None if axis is None else axis % data.ndim
    picked = np.flatnonzero(condition.value)
    if len(picked) < 2 or len(set(np.diff(picked))) == 1:  # evenly spaced, as a slice
        step = int(picked[1] - picked[0]) if len(picked) > 1 else 1
        first = int(picked[0]) if len(picked) else 0

        def position(i):
            return i * step + first
    else:
        table = _picked_positions(condition, dim_expr(out.shape[axis or 0]))

        def position(i):
            return table[i]

    def element(*i):
        if axis is None:
            return data[tuple(unravel(position(i[0]), data.shape))]
        return data[tuple(i[:axis]) + (position(i[axis]),) + tuple(i[axis + 1:])]

    return [compute(out.shape, element, dtype=out.dtype)]


register_op("Compress", pattern=Pattern.OPAQUE, infer=_compress_infer, evaluate=compress,
            attrs={"axis": None}, inputs=2, compute=_compress_rule, params=(1,))
register_op("NonZero", pattern=Pattern.OPAQUE, evaluate=nonzero,
            infer=lambda ctx: [T.TensorType(T.int64, (ctx.type(0).rank, ctx.fresh_dim()))],
            compute=_host_only("NonZero: the output size depends on the data"))

# -- TopK ----------------------------------------------------------------------------------------


def _topk_infer(ctx):
    check_dtype(ctx, 0, NUMERIC)
    check_dtype(ctx, 1, (T.int64,), "K")
    shape = list(ctx.shape(0))
    if not shape:
        raise ctx.fail("X must have rank >= 1")
    axis = normalize_axis(ctx, ctx.attrs["axis"], len(shape))
    k = _scalar_count(ctx, 1, "K")
    if isinstance(k, int) and (k < 0 or isinstance(shape[axis], int) and k > shape[axis]):
        raise ctx.fail(f"k = {k} is out of range for axis size {shape[axis]}")
    shape[axis] = ctx.fresh_dim("k") if k is None else k
    return [T.TensorType(ctx.dtype(0), shape), T.TensorType(T.int64, shape)]


def topk(x, k, axis, largest, sorted):
    k = int(np.asarray(k).reshape(-1)[0])
    axis = axis % x.ndim
    keys = x.astype(np.float32) if x.dtype.name in _LOW_PRECISION else x
    if largest:
        # stable ascending sort of the reversed axis, reversed back: descending, and equal
        # values keep the lower index first (as ONNX requires)
        n = x.shape[axis]
        order = np.flip(np.argsort(np.flip(keys, axis), axis=axis, kind="stable"), axis)
        order = n - 1 - order
    else:
        order = np.argsort(keys, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return np.take_along_axis(x, indices, axis=axis), indices


register_op("TopK", pattern=Pattern.OPAQUE, infer=_topk_infer, evaluate=topk,
            attrs={"axis": -1, "largest": 1, "sorted": 1}, inputs=2, outputs=2,
            compute=_host_only("TopK: a sort has no loop form here"), params=(1,))

# -- ReverseSequence, OneHot ---------------------------------------------------------------------


def _reverse_sequence_infer(ctx):
    check_dtype(ctx, 1, INDEX_DTYPES, "sequence_lens")
    rank = ctx.type(0).rank
    axes = {ctx.attrs["batch_axis"], ctx.attrs["time_axis"]}
    if rank < 2 or not axes <= {0, 1} or len(axes) != 2:
        raise ctx.fail(f"batch_axis and time_axis must be 0 and 1 in some order, on input of "
                       f"rank >= 2, given {ctx.attrs} on {ctx.type(0)}")
    return [ctx.type(0)]


def reverse_sequence(x, lens, batch_axis, time_axis):
    out = x.copy()
    seq = np.moveaxis(out, (batch_axis, time_axis), (0, 1))  # a view of `out`
    src = np.moveaxis(x, (batch_axis, time_axis), (0, 1))
    for b, n in enumerate(lens):
        seq[b, :n] = src[b, :n][::-1]
    return out


def _reverse_sequence_rule(inputs, outputs, batch_axis, time_axis):
    x, lens = inputs
    steps = x.shape[time_axis]

    def element(*i):
        # the first n steps of each sequence reversed, the rest kept; n past the end means all
        n = minimum(as_index(lens[i[batch_axis]]), steps)
        t = i[time_axis]
        src = list(i)
        src[time_axis] = Select(t < n, n - 1 - t, t)
        return x[tuple(src)]

    return [compute(outputs[0].shape, element, dtype=outputs[0].dtype)]


register_op("ReverseSequence", pattern=Pattern.INJECTIVE, infer=_reverse_sequence_infer,
            evaluate=reverse_sequence, attrs={"batch_axis": 1, "time_axis": 0}, inputs=2,
            compute=_reverse_sequence_rule)


def _one_hot_infer(ctx):
    check_dtype(ctx, 0, NUMERIC, "indices")
    check_dtype(ctx, 1, NUMERIC, "depth")
    values = ctx.shape(2)
    if len(values) != 1 or isinstance(values[0], int) and values[0] != 2:
        raise ctx.fail(f"values must be [off_value, on_value], given {ctx.type(2)}")
    shape = list(ctx.shape(0))
    axis = normalize_axis(ctx, ctx.attrs["axis"], len(shape) + 1)
    depth = _scalar_count(ctx, 1, "depth")
    shape.insert(axis, ctx.fresh_dim("depth") if depth is None else depth)
    return [T.TensorType(ctx.dtype(2), shape)]


def one_hot(indices, depth, values, axis):
    depth = int(np.asarray(depth).reshape(-1)[0])
    indices = _wrap(indices.astype(np.int64), depth)
    axis = axis % (indices.ndim + 1)
    classes = np.arange(depth).reshape((-1,) + (1,) * (indices.ndim - axis))
    hot = np.expand_dims(indices, axis) == classes
    return np.where(hot, values[1], values[0]).astype(values.dtype)


def _one_hot_rule(inputs, outputs, axis):
    indices, depth, values = inputs
    out = outputs[0]
    if depth.value is None:
        check_sizes_bound(inputs, outputs, "OneHot")
    axis %= len(out.shape)
    classes = dim_expr(out.shape[axis])  # the depth, as inferred

    def element(*i):
        k = as_index(indices[tuple(i[:axis]) + tuple(i[axis + 1:])])  # floats truncate
        k = Select(k < 0, k + classes, k)
        return Select(eq(k, i[axis]), values[const(1)], values[const(0)])

    return [compute(out.shape, element, dtype=out.dtype)]


register_op("OneHot", pattern=Pattern.INJECTIVE, infer=_one_hot_infer, evaluate=one_hot,
            attrs={"axis": -1}, inputs=3, compute=_one_hot_rule, params=(1,))

# -- Unique --------------------------------------------------------------------------------------


def _unique_infer(ctx):
    x = ctx.type(0)
    n = ctx.fresh_dim("unique")
    axis = ctx.attrs["axis"]
    if axis is None:
        total = 1
        for d in x.shape:
            total = T.dim_mul(total, d)
        y, inverse = (n,), (total,)
    else:
        axis = normalize_axis(ctx, axis, x.rank)
        y = x.shape[:axis] + (n,) + x.shape[axis + 1:]
        inverse = (x.shape[axis],)
    return [x.with_shape(y), T.TensorType(T.int64, (n,)), T.TensorType(T.int64, inverse),
            T.TensorType(T.int64, (n,))]


def unique(x, axis, sorted):
    keys = x.astype(np.float32) if x.dtype.name in _LOW_PRECISION else x
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not sorted:  # order of first occurrence instead of ascending
        order = np.argsort(first, kind="stable")
        first, counts = first[order], counts[order]
        inverse = np.argsort(order)[inverse]
    y = x.reshape(-1)[first] if axis is None else np.take(x, first, axis=axis)
    return y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)


register_op("Unique", pattern=Pattern.OPAQUE, infer=_unique_infer, evaluate=unique,
            attrs={"axis": None, "sorted": 1}, outputs=(1, 4),
            compute=_host_only("Unique: the output size depends on the data"))

# -- NonMaxSuppression ---------------------------------------------------------------------------


def _nms_infer(ctx):
    check_dtype(ctx, 0, T.FLOAT_DTYPES, "boxes")
    check_same_dtype(ctx, 0, 1)
    check_dtype(ctx, 2, (T.int64,), "max_output_boxes_per_class")
    boxes, scores = ctx.type(0), ctx.type(1)
    if boxes.rank != 3 or scores.rank != 3 or isinstance(boxes.shape[2], int) and \
            boxes.shape[2] != 4:
        raise ctx.fail(f"boxes must be [batches, boxes, 4] and scores [batches, classes, "
                       f"boxes], given {boxes} and {scores}")
    if ctx.attrs["center_point_box"] not in (0, 1):
        raise ctx.fail(f"center_point_box must be 0 or 1, given {ctx.attrs['center_point_box']}")
    return [T.TensorType(T.int64, (ctx.fresh_dim("selected"), 3))]


def _corners(boxes, center_point_box):
    """Boxes as (y_min, x_min, y_max, x_max), whatever corner order or format they came in."""
    if center_point_box:
        xc, yc, w, h = boxes.T
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=1)
    y1, x1, y2, x2 = boxes.T
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2),
                     np.maximum(y1, y2), np.maximum(x1, x2)], axis=1)


def _iou(a, b):
    h = min(a[2], b[2]) - max(a[0], b[0])
    w = min(a[3], b[3]) - max(a[1], b[1])
    if h <= 0 or w <= 0:
        return 0.0
    inter = h * w
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area_a + area_b - inter)


def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, center_point_box=0):
    limit = 0 if max_output_boxes_per_class is None else \
        int(np.asarray(max_output_boxes_per_class).reshape(-1)[0])
    iou_limit = 0.0 if iou_threshold is None else float(np.asarray(iou_threshold).reshape(-1)[0])
    selected = []
    for b in range(boxes.shape[0]):
        corners = _corners(boxes[b].astype(np.float64), center_point_box)
        for c in range(scores.shape[1]):
            s = scores[b, c].astype(np.float64)
            candidates = np.argsort(-s, kind="stable")  # by score, ties to the lower index
            if score_threshold is not None:
                candidates = candidates[s[candidates] > float(np.asarray(score_threshold)
                                                              .reshape(-1)[0])]
            kept = []
            for i in candidates:
                if len(kept) >= limit:
                    break
                if all(_iou(corners[i], corners[j]) <= iou_limit for j in kept):
                    kept.append(i)
            selected += [(b, c, i) for i in kept]
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


register_op("NonMaxSuppression", pattern=Pattern.OPAQUE, infer=_nms_infer,
            evaluate=non_max_suppression, attrs={"center_point_box": 0}, inputs=(2, 5),
            compute=_host_only("NonMaxSuppression: a greedy, data-dependent selection"))
