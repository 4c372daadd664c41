"""Normalization ops: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LRN, MeanVarianceNormalization, LpNormalization, Dropout.

References compute float16 and bfloat16 inputs in float32 (float64 stays float64) and cast the
results back, so outputs keep the input's element type. Ops with a `stash_type` compute their
statistics in that type, as ONNX's function bodies do, then scale and shift in the input's type.
This module holds op meanings only; it never reads ONNX (importers translate older opsets).

Compute rules follow the references stage by stage: a mean stage, a variance stage (two-pass,
as np.var: the mean of squared deviations, finished into 1/sqrt(var + eps) or sqrt(var + eps)
as the reference uses it), then the output, so each statistic is materialised once per group
of elements it normalises.
"""

from __future__ import annotations

import numpy as np

from ...errors import DNNCError
from .. import batching
from .. import types as T
from ..compute import NoCompute, broadcast_load, compute, reduce_axis, reduce_sum
from ..loop import Cast, Select, call, const, eq, logical_and, substitute
from ..types import TensorType
from .infer import check_dtype, check_same_dtype, normalize_axis, same_as_input
from .reduce import count_of, input_at, spread, stage_name
from ..flops import numel, per_output
from .registry import REQUIRED, Pattern, register_op

FLOATS = T.FLOAT_DTYPES
STASH_DTYPES = (T.float32, T.bfloat16, T.float16, T.float64)


def _wide(x: np.ndarray) -> np.ndarray:
    """x in the type its statistics are computed in: float64 stays, other floats go float32."""
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32)


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel vector (axis 1) against x."""
    return (-1,) + (1,) * (x.ndim - 2)


def _check_rank(ctx, i: int, least: int, what: str = "") -> None:
    if ctx.type(i).rank < least:
        raise ctx.fail(f"input {i}{' (' + what + ')' if what else ''} must have rank >= "
                       f"{least}, given {ctx.type(i)}")


def _check_vector(ctx, i: int, size, what: str) -> None:
    """Input i (when present) is a 1-D tensor of `size` elements (a dim, maybe symbolic)."""
    if not ctx.has(i):
        return
    shape = ctx.shape(i)
    if len(shape) != 1 or (isinstance(size, int) and isinstance(shape[0], int)
                           and shape[0] != size):
        raise ctx.fail(f"input {i} ({what}) must have shape [{size}], given {ctx.type(i)}")


def _check_stash(ctx) -> T.DType:
    stash = ctx.attrs["stash_type"]
    if not isinstance(stash, T.DType) or stash not in STASH_DTYPES:
        raise ctx.fail(f"stash_type must be a float type, given {stash!r}")
    return stash


def _wide_dtype(*dtypes: T.DType) -> T.DType:
    """The type `_wide` gives (float64 if any input is float64, else float32)."""
    return T.float64 if T.float64 in dtypes else T.float32


def _acc_dtype(dtype: T.DType) -> T.DType:
    """Sums of a 16-bit statistic type run in float32, as np.mean does for float16."""
    return T.float32 if dtype.itemsize < 4 else dtype


def _moments(shape, read, extents, dtype, finish=None, hint="norm"):
    """Mean and variance stages of shape `shape`: `read(i, r)` is the element (in `dtype`)
    at statistics index i and reduce axes r over `extents`. The variance is the mean of
    squared deviations from the mean stage (np.var's two passes); `finish(var)` turns it
    into what the output reads (an inverse std), so that too is computed once per group.

    The mean is taken of the elements shifted by the group's first one, x0 + mean(x - x0):
    of a constant group it is exact, and of a nearly constant one (where the output divides
    x - mean by sqrt(var + eps) ~ sqrt(eps)) its rounding is relative to the spread, not
    to |x| (onnxruntime gets there by summing in float64)."""
    acc = _acc_dtype(dtype)

    def mean_of(*i):
        r = [reduce_axis(n) for n in extents]
        x = read(i, r)
        first = substitute(x, {a.var: const(0) for a in r})
        shifted = reduce_sum(Cast(acc, x - first), r) / count_of(r, acc)
        return first + Cast(dtype, shifted)

    mean = compute(shape, mean_of, name=stage_name(f"{hint}_mean"))

    def var_of(*i):
        r = [reduce_axis(n) for n in extents]
        centered = read(i, r) - mean[i]
        var = Cast(dtype, reduce_sum(Cast(acc, centered * centered), r) / count_of(r, acc))
        return var if finish is None else finish(var)

    return mean, compute(shape, var_of, name=stage_name(f"{hint}_var"))


def _inv_std(epsilon):
    return lambda var: const(1.0, var.dtype) / call("sqrt", var + epsilon)


def _std(epsilon):
    return lambda var: call("sqrt", var + epsilon)


def _channel(t, i):
    """A per-channel vector [C] read at the channel (axis 1) of index i."""
    return t[i[1]]


# -- BatchNormalization ----------------------------------------------------------------------


def _batch_norm_infer(ctx):
    check_dtype(ctx, 0, FLOATS, "X")
    _check_rank(ctx, 0, 2, "X")
    channels = ctx.shape(0)[1]
    for i, what in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        check_dtype(ctx, i, FLOATS, what)
        _check_vector(ctx, i, channels, what)
    check_same_dtype(ctx, 1, 2)
    check_same_dtype(ctx, 3, 4)
    if ctx.num_outputs > 1 and not ctx.attrs["training_mode"]:
        raise ctx.fail("running_mean and running_var outputs exist only with training_mode=1")
    stats = TensorType(ctx.dtype(3), (channels,))
    return [ctx.type(0), stats, stats]


def batch_norm(x, scale, bias, mean, var, epsilon, momentum, training_mode):
    xw = _wide(x)
    shape = _channel_shape(x)
    if training_mode:
        axes = (0,) + tuple(range(2, x.ndim))
        use_mean, use_var = xw.mean(axis=axes), xw.var(axis=axes)
    else:
        use_mean, use_var = _wide(mean), _wide(var)
    inv_std = 1 / np.sqrt(use_var.reshape(shape) + epsilon)
    y = (xw - use_mean.reshape(shape)) * inv_std * _wide(scale).reshape(shape) \
        + _wide(bias).reshape(shape)
    y = y.astype(x.dtype)
    if not training_mode:
        return y
    running_mean = _wide(mean) * momentum + use_mean * (1 - momentum)
    running_var = _wide(var) * momentum + use_var * (1 - momentum)
    return y, running_mean.astype(mean.dtype), running_var.astype(var.dtype)


def _batch_norm_rule(inputs, outputs, epsilon, momentum, training_mode):
    """Inference: per-channel (x - mean) * 1/sqrt(var + eps) * scale + bias. Training: the
    mean and variance over (N, spatial) are stages first, and the running statistics are
    blended with `momentum`."""
    x, scale, bias, mean, var = inputs
    dtype = _wide_dtype(*(t.dtype for t in inputs))
    if training_mode:
        stat_dtype = _wide_dtype(x.dtype)
        extents = [x.shape[0]] + list(x.shape[2:])

        def read(i, r):  # i: (channel,), r: batch and spatial axes
            return Cast(stat_dtype, x[spread(x.ndim, {1: i[0]}, [a.var for a in r])])

        use_mean, use_var = _moments((x.shape[1],), read, extents, stat_dtype,
                                     hint="batchnorm")
    else:
        use_mean, use_var = mean, var

    def element(*i):
        inv_std = const(1.0, dtype) / call("sqrt", Cast(dtype, _channel(use_var, i)) + epsilon)
        centered = Cast(dtype, x[i]) - Cast(dtype, _channel(use_mean, i))
        return centered * inv_std * Cast(dtype, _channel(scale, i)) + \
            Cast(dtype, _channel(bias, i))

    outs = [compute(outputs[0].shape, element, name=stage_name("batchnorm"),
                    dtype=outputs[0].dtype)]
    for given, used, out in zip((mean, var), (use_mean, use_var), outputs[1:]):
        outs.append(_running_stat(given, used, momentum, out))
    return outs


def _running_stat(given, used, momentum, out):
    """given * momentum + used * (1 - momentum): a running mean or variance."""
    dtype = _wide_dtype(given.dtype, used.dtype)
    return compute(out.shape, lambda c: Cast(dtype, given[c]) * momentum +
                   Cast(dtype, used[c]) * (1 - momentum), name=stage_name("running_stat"),
                   dtype=out.dtype)


register_op("BatchNormalization", pattern=Pattern.OPAQUE, infer=_batch_norm_infer,
            evaluate=batch_norm, inputs=5, outputs=(1, 3), weights=(1, 2, 3, 4),
            attrs={"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
            compute=_batch_norm_rule,
            flops=per_output(2),
            batched=batching.data_input)   # inference folds it to one scale and one shift

# -- InstanceNormalization -------------------------------------------------------------------


def _instance_norm_infer(ctx):
    check_dtype(ctx, 0, FLOATS, "input")
    check_same_dtype(ctx)
    _check_rank(ctx, 0, 3, "input")
    for i, what in ((1, "scale"), (2, "B")):
        _check_vector(ctx, i, ctx.shape(0)[1], what)
    return same_as_input(ctx)


def instance_norm(x, scale, bias, epsilon):
    xw = _wide(x)
    axes = tuple(range(2, x.ndim))
    mean = xw.mean(axis=axes, keepdims=True)
    var = xw.var(axis=axes, keepdims=True)
    shape = _channel_shape(x)
    y = (xw - mean) / np.sqrt(var + epsilon) * _wide(scale).reshape(shape) \
        + _wide(bias).reshape(shape)
    return y.astype(x.dtype)


def _instance_norm_rule(inputs, outputs, epsilon):
    """Mean and sqrt(var + eps) per (n, c) over the spatial axes, then the affine map."""
    x, scale, bias = inputs
    dtype = _wide_dtype(x.dtype)

    def read(i, r):  # i: (n, c), r: the spatial axes
        return Cast(dtype, x[tuple(i) + tuple(a.var for a in r)])

    mean, std = _moments(x.shape[:2], read, x.shape[2:], dtype, _std(epsilon),
                         hint="instancenorm")

    def element(*i):
        n_c = i[:2]
        return (Cast(dtype, x[i]) - mean[n_c]) / std[n_c] * Cast(dtype, _channel(scale, i)) \
            + Cast(dtype, _channel(bias, i))

    return [compute(outputs[0].shape, element, name=stage_name("instancenorm"),
                    dtype=outputs[0].dtype)]


register_op("InstanceNormalization", pattern=Pattern.OPAQUE, infer=_instance_norm_infer,
            evaluate=instance_norm, inputs=3, attrs={"epsilon": 1e-5},
            compute=_instance_norm_rule, flops=per_output(5),
            batched=batching.data_input)

# -- LayerNormalization, RMSNormalization ------------------------------------------------------


def _trailing_norm_infer(ctx, params):
    """X normalised over axes [axis, rank); inputs 1.. are unidirectionally broadcast to X."""
    check_dtype(ctx, 0, FLOATS, "X")
    check_same_dtype(ctx)
    _check_stash(ctx)
    rank = ctx.type(0).rank
    axis = normalize_axis(ctx, ctx.attrs["axis"], rank)
    for i in range(1, params + 1):
        if not ctx.has(i):
            continue
        try:
            if T.broadcast_shapes(ctx.shape(0), ctx.shape(i)) != ctx.shape(0) and \
                    ctx.type(0).is_static:
                raise ValueError("grows X")
        except ValueError:
            raise ctx.fail(f"input {i} {ctx.type(i)} does not broadcast to X "
                           f"{ctx.type(0)}") from None
    return axis


def _layer_norm_infer(ctx):
    axis = _trailing_norm_infer(ctx, 2)
    x = ctx.type(0)
    stats = TensorType(ctx.attrs["stash_type"], x.shape[:axis] + (1,) * (x.rank - axis))
    return [x, stats, stats]


def layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5, stash_type=T.float32):
    axes = tuple(range(axis % x.ndim, x.ndim))
    xs = x.astype(stash_type.np)
    mean = xs.mean(axis=axes, keepdims=True)
    centered = xs - mean
    inv_std = 1 / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + epsilon)
    y = (centered * inv_std).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    stash = stash_type.np
    return y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)


class _Trailing:
    """The axes [axis, rank) a LayerNorm / RMSNorm normalises over, and its statistics'
    shape: x's leading dims, then 1s."""

    def __init__(self, x, axis):
        self.x, self.axis = x, axis % x.ndim
        self.shape = tuple(x.shape[:self.axis]) + (const(1),) * (x.ndim - self.axis)
        self.extents = list(x.shape[self.axis:])

    def read(self, dtype):
        """`read(i, r)` of `_moments`: x at statistics index i along the reduce axes r."""
        return lambda i, r: Cast(dtype, self.x[tuple(i[:self.axis]) + tuple(a.var for a in r)])

    def stat(self, i):
        return tuple(i[:self.axis]) + (const(0),) * (self.x.ndim - self.axis)


def _layer_norm_rule(inputs, outputs, axis, epsilon, stash_type):
    """Mean and 1/sqrt(var + eps) stages in stash_type; the output normalises in stash_type,
    then scales and shifts in x's type (as ONNX's function body). The mean and inv_std
    outputs are those stages."""
    x, scale, bias = inputs[0], inputs[1], input_at(inputs, 2)
    rows = _Trailing(x, axis)
    mean, inv_std = _moments(rows.shape, rows.read(stash_type), rows.extents, stash_type,
                             _inv_std(epsilon), hint="layernorm")

    def element(*i):
        s = rows.stat(i)
        y = Cast(x.dtype, (Cast(stash_type, x[i]) - mean[s]) * inv_std[s]) * \
            broadcast_load(scale, i)
        return y if bias is None else y + broadcast_load(bias, i)

    outs = [compute(outputs[0].shape, element, name=stage_name("layernorm"),
                    dtype=outputs[0].dtype), mean, inv_std]
    return outs[:len(outputs)]


register_op("LayerNormalization", pattern=Pattern.REDUCE, infer=_layer_norm_infer,
            evaluate=layer_norm, inputs=(2, 3), outputs=(1, 3),
            attrs={"axis": -1, "epsilon": 1e-5, "stash_type": T.float32},
            compute=_layer_norm_rule,
            flops=per_output(5),
            batched=batching.along_axis())   # mean, centre, variance, normalise, affine


def _rms_norm_infer(ctx):
    _trailing_norm_infer(ctx, 1)
    return same_as_input(ctx)


def rms_norm(x, scale, axis, epsilon, stash_type):
    axes = tuple(range(axis % x.ndim, x.ndim))
    xs = x.astype(stash_type.np)
    inv_rms = 1 / np.sqrt((xs * xs).mean(axis=axes, keepdims=True) + epsilon)
    return ((xs * inv_rms).astype(x.dtype) * scale).astype(x.dtype)


def _rms_norm_rule(inputs, outputs, axis, epsilon, stash_type):
    """A 1/sqrt(mean(x*x) + eps) stage in stash_type, then x * it, scaled in x's type."""
    x, scale = inputs
    rows = _Trailing(x, axis)
    read = rows.read(stash_type)
    acc = _acc_dtype(stash_type)

    def inv_rms_of(*i):
        r = [reduce_axis(n) for n in rows.extents]
        v = read(i, r)
        mean_square = Cast(stash_type, reduce_sum(Cast(acc, v * v), r) / count_of(r, acc))
        return const(1.0, stash_type) / call("sqrt", mean_square + epsilon)

    inv_rms = compute(rows.shape, inv_rms_of, name=stage_name("rmsnorm_inv"))

    def element(*i):
        y = Cast(x.dtype, Cast(stash_type, x[i]) * inv_rms[rows.stat(i)])
        return y * broadcast_load(scale, i)

    return [compute(outputs[0].shape, element, name=stage_name("rmsnorm"),
                    dtype=outputs[0].dtype)]


register_op("RMSNormalization", pattern=Pattern.OPAQUE, infer=_rms_norm_infer,
            evaluate=rms_norm, inputs=2,
            attrs={"axis": -1, "epsilon": 1e-5, "stash_type": T.float32},
            compute=_rms_norm_rule, flops=per_output(4),
            batched=batching.along_axis())   # square, mean, scale, affine

# -- GroupNormalization (opset 21: scale and bias per channel) ---------------------------------


def _group_norm_infer(ctx):
    check_dtype(ctx, 0, FLOATS, "X")
    check_same_dtype(ctx)
    _check_stash(ctx)
    _check_rank(ctx, 0, 2, "X")
    groups = ctx.attrs["num_groups"]
    channels = ctx.shape(0)[1]
    if not isinstance(groups, int) or groups <= 0:
        raise ctx.fail(f"num_groups must be a positive integer, given {groups!r}")
    if isinstance(channels, int) and channels % groups:
        raise ctx.fail(f"{channels} channels do not split into {groups} groups")
    for i, what in ((1, "scale"), (2, "bias")):
        _check_vector(ctx, i, channels, what)
    return same_as_input(ctx)


def group_norm(x, scale, bias, num_groups, epsilon, stash_type):
    grouped = x.reshape(x.shape[0], num_groups, -1).astype(stash_type.np)
    mean = grouped.mean(axis=2, keepdims=True)
    var = grouped.var(axis=2, keepdims=True)
    normalized = ((grouped - mean) / np.sqrt(var + epsilon)).astype(x.dtype).reshape(x.shape)
    shape = _channel_shape(x)
    return (normalized * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


def _group_norm_rule(inputs, outputs, num_groups, epsilon, stash_type):
    """Mean and sqrt(var + eps) per (n, group) over the group's channels and the spatial
    axes, in stash_type; the normalised value is cast to x's type, then scaled and shifted
    per channel."""
    x, scale, bias = inputs
    per_group = x.shape[1] // num_groups

    def read(i, r):  # i: (n, g); r: the channel within the group, then the spatial axes
        channel = i[1] * per_group + r[0].var
        return Cast(stash_type, x[(i[0], channel) + tuple(a.var for a in r[1:])])

    mean, std = _moments((x.shape[0], const(num_groups)), read,
                         [per_group] + list(x.shape[2:]), stash_type, _std(epsilon),
                         hint="groupnorm")

    def element(*i):
        group = (i[0], i[1] // per_group)
        normalized = Cast(x.dtype, (Cast(stash_type, x[i]) - mean[group]) / std[group])
        return normalized * _channel(scale, i) + _channel(bias, i)

    return [compute(outputs[0].shape, element, name=stage_name("groupnorm"),
                    dtype=outputs[0].dtype)]


register_op("GroupNormalization", pattern=Pattern.OPAQUE, infer=_group_norm_infer,
            evaluate=group_norm, inputs=3,
            attrs={"num_groups": REQUIRED, "epsilon": 1e-5, "stash_type": T.float32},
            compute=_group_norm_rule, flops=per_output(5),
            batched=batching.data_input)

# -- LRN, MeanVarianceNormalization, LpNormalization -------------------------------------------


def _lrn_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    _check_rank(ctx, 0, 3, "X")
    if not isinstance(ctx.attrs["size"], int) or ctx.attrs["size"] < 1:
        raise ctx.fail(f"size must be a positive integer, given {ctx.attrs['size']!r}")
    return same_as_input(ctx)


def lrn(x, size, alpha, beta, bias):
    """Each channel divided by a power of the sum of squares over a window of channels."""
    squares = _wide(x) ** 2
    channels = x.shape[1]
    before, after = (size - 1) // 2, size // 2  # floor and ceil of (size - 1) / 2
    square_sum = np.zeros_like(squares)
    for c in range(channels):
        lo, hi = max(0, c - before), min(channels, c + after + 1)
        square_sum[:, c] = squares[:, lo:hi].sum(axis=1)
    return (_wide(x) / (bias + alpha / size * square_sum) ** beta).astype(x.dtype)


def _lrn_rule(inputs, outputs, size, alpha, beta, bias):
    """The square sum over the channel window [c - floor((size-1)/2), c + ceil((size-1)/2)]
    is a stage (a reduction over the window with the channels outside [0, C) filtered out by
    `where=`, as a pooling window's padding); the output divides by a power of it."""
    x = inputs[0]
    dtype = _wide_dtype(x.dtype)
    before = (size - 1) // 2

    def square_sum_of(*i):
        j = reduce_axis(size)
        channel = i[1] - before + j.var
        v = Cast(dtype, x[(i[0], channel) + tuple(i[2:])])  # read only inside [0, C)
        return reduce_sum(v * v, j, where=logical_and(channel >= 0, channel < x.shape[1]))

    square_sum = compute(x.shape, square_sum_of, name=stage_name("lrn_square_sum"))

    def element(*i):
        base = square_sum[i] * (alpha / size) + bias
        return Cast(dtype, x[i]) / call("pow", base, const(beta, dtype))

    return [compute(outputs[0].shape, element, name=stage_name("lrn"),
                    dtype=outputs[0].dtype)]


register_op("LRN", pattern=Pattern.OPAQUE, infer=_lrn_infer, evaluate=lrn,
            attrs={"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "bias": 1.0},
            compute=_lrn_rule,   # a window sum of squares, then scale, add, power
            flops=lambda node: numel(node.outputs[0]) * (node.attrs.get("size", 1) + 3),
            batched=batching.data_input)


def _axes_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    rank = ctx.type(0).rank
    axes = [normalize_axis(ctx, a, rank) for a in ctx.attrs["axes"]]
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {ctx.attrs['axes']} repeat an axis")
    return same_as_input(ctx)


def mean_variance_norm(x, axes):
    """(x - mean) / (std + 1e-9) over `axes`, as ONNX's function body."""
    axes = tuple(a % x.ndim for a in axes)
    xw = _wide(x)
    centered = xw - xw.mean(axis=axes, keepdims=True)
    std = np.sqrt((centered * centered).mean(axis=axes, keepdims=True))
    return (centered / (std + 1e-9)).astype(x.dtype)


def _mean_variance_norm_rule(inputs, outputs, axes):
    """Mean and std stages over `axes` (statistics keep those axes as 1s), then
    (x - mean) / (std + 1e-9)."""
    x = inputs[0]
    dtype = _wide_dtype(x.dtype)
    axes = sorted({a % x.ndim for a in axes})
    shape = tuple(const(1) if d in axes else n for d, n in enumerate(x.shape))

    def read(i, r):
        kept = [v for d, v in enumerate(i) if d not in axes]
        return Cast(dtype, x[spread(x.ndim, {d: a.var for d, a in zip(axes, r)}, kept)])

    def stat(i):
        return tuple(const(0) if d in axes else v for d, v in enumerate(i))

    mean, std = _moments(shape, read, [x.shape[d] for d in axes], dtype,
                         lambda var: call("sqrt", var), hint="mvn")

    def element(*i):
        return (Cast(dtype, x[i]) - mean[stat(i)]) / (std[stat(i)] + 1e-9)

    return [compute(outputs[0].shape, element, name=stage_name("mvn"),
                    dtype=outputs[0].dtype)]


register_op("MeanVarianceNormalization", pattern=Pattern.OPAQUE, infer=_axes_infer,
            evaluate=mean_variance_norm, attrs={"axes": [0, 2, 3]},
            compute=_mean_variance_norm_rule, flops=per_output(5))


def _lp_norm_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    normalize_axis(ctx, ctx.attrs["axis"], ctx.type(0).rank)
    if ctx.attrs["p"] not in (1, 2):
        raise ctx.fail(f"p must be 1 or 2, given {ctx.attrs['p']!r}")
    return same_as_input(ctx)


def lp_norm(x, axis, p):
    xw = _wide(x)
    norm = (np.abs(xw) ** p).sum(axis=axis, keepdims=True) ** (1 / p)
    safe = np.where(norm == 0, 1, norm)
    return np.where(norm == 0, 0, xw / safe).astype(x.dtype)


def _lp_norm_rule(inputs, outputs, axis, p):
    """A norm stage along `axis` (sqrt of the sum of squares, or the sum of magnitudes),
    then x / norm, 0 where the norm is 0."""
    x = inputs[0]
    dtype = _wide_dtype(x.dtype)
    axis = axis % x.ndim
    shape = tuple(const(1) if d == axis else n for d, n in enumerate(x.shape))

    def norm_of(*i):
        k = reduce_axis(x.shape[axis])
        v = Cast(dtype, x[i[:axis] + (k.var,) + i[axis + 1:]])
        return call("sqrt", reduce_sum(v * v, k)) if p == 2 else reduce_sum(call("abs", v), k)

    norm = compute(shape, norm_of, name=stage_name("lpnorm_norm"))

    def element(*i):
        n = norm[i[:axis] + (const(0),) + i[axis + 1:]]
        return Select(eq(n, const(0.0, dtype)), const(0.0, dtype), Cast(dtype, x[i]) / n)

    return [compute(outputs[0].shape, element, name=stage_name("lpnorm"),
                    dtype=outputs[0].dtype)]


register_op("LpNormalization", pattern=Pattern.OPAQUE, infer=_lp_norm_infer, evaluate=lp_norm,
            attrs={"axis": -1, "p": 2}, compute=_lp_norm_rule, flops=per_output(3),
            batched=batching.along_axis())

# -- Dropout ---------------------------------------------------------------------------------


def _dropout_infer(ctx):
    check_dtype(ctx, 0, FLOATS, "data")
    check_dtype(ctx, 1, FLOATS, "ratio")
    check_dtype(ctx, 2, (T.bool_,), "training_mode")
    for i in (1, 2):
        if ctx.has(i) and ctx.type(i).rank != 0:
            raise ctx.fail(f"input {i} must be a scalar, given {ctx.type(i)}")
    ratio, training = ctx.value(1), ctx.value(2)
    if training is not None and bool(training) and ctx.attrs["seed"] is None and \
            (ratio is None or float(ratio) > 0):
        raise ctx.fail("training_mode=True drops random elements; give the `seed` attribute "
                       "for a deterministic result, or run in inference mode")
    if ratio is not None and not 0 <= float(ratio) < 1:
        raise ctx.fail(f"ratio must be in [0, 1), given {float(ratio)}")
    return [ctx.type(0), TensorType(T.bool_, ctx.shape(0))]


def dropout(x, ratio=None, training_mode=None, seed=None):
    """Identity in inference mode; in training mode, NumPy's RandomState(seed) picks the mask
    (as the ONNX node suite's reference does), so a given seed is deterministic."""
    ratio = 0.5 if ratio is None else float(ratio)
    if training_mode is None or not bool(training_mode) or ratio == 0:
        return x.copy(), np.ones(x.shape, dtype=bool)
    if seed is None:
        raise DNNCError("Dropout with training_mode=True needs the `seed` attribute to be "
                        "deterministic")
    mask = np.random.RandomState(seed).uniform(0, 1.0, x.shape) >= ratio
    scale = np.asarray(1 / (1 - ratio), dtype=_wide(x).dtype)
    return (_wide(x) * mask * scale).astype(x.dtype), mask


def _dropout_rule(inputs, outputs, seed):
    """Inference (no training_mode, or a known False, or a known ratio of 0): the identity
    and an all-true mask. Training drops elements by NumPy's generator: a host fallback."""
    x, ratio, training = inputs[0], input_at(inputs, 1), input_at(inputs, 2)
    if training is not None:
        if training.value is None:
            raise NoCompute("Dropout's training_mode is computed at run time")
        dropping = bool(training.value) and (ratio is None or ratio.value is None or
                                             float(ratio.value) > 0)
        if dropping:
            raise NoCompute("Dropout in training mode draws its mask on the host")
    outs = [compute(outputs[0].shape, lambda *i: x[i], name=stage_name("dropout"),
                    dtype=outputs[0].dtype)]
    if len(outputs) > 1:
        outs.append(compute(outputs[1].shape, lambda *i: const(True),
                            name=stage_name("dropout_mask")))
    return outs


register_op("Dropout", pattern=Pattern.OPAQUE, infer=_dropout_infer, evaluate=dropout,
            inputs=(1, 3), outputs=(1, 2), attrs={"seed": None}, compute=_dropout_rule, params=(1, 2))
