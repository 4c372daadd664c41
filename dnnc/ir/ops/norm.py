"""Normalization ops: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LRN, MeanVarianceNormalization, LpNormalization, Dropout.

References compute float16 and bfloat16 inputs in float32 (float64 stays float64) and cast the
results back, so outputs keep the input's element type. Ops with a `stash_type` compute their
statistics in that type, as ONNX's function bodies do, then scale and shift in the input's type.
This module holds op meanings only; it never reads ONNX (importers translate older opsets).
"""

from __future__ import annotations

import numpy as np

from ...errors import DNNCError
from .. import types as T
from ..types import TensorType
from .infer import check_dtype, check_same_dtype, normalize_axis, same_as_input
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


register_op("BatchNormalization", pattern=Pattern.OPAQUE, infer=_batch_norm_infer,
            evaluate=batch_norm, inputs=5, outputs=(1, 3),
            attrs={"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0})

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


register_op("InstanceNormalization", pattern=Pattern.OPAQUE, infer=_instance_norm_infer,
            evaluate=instance_norm, inputs=3, attrs={"epsilon": 1e-5})

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


register_op("LayerNormalization", pattern=Pattern.OPAQUE, infer=_layer_norm_infer,
            evaluate=layer_norm, inputs=(2, 3), outputs=(1, 3),
            attrs={"axis": -1, "epsilon": 1e-5, "stash_type": T.float32})


def _rms_norm_infer(ctx):
    _trailing_norm_infer(ctx, 1)
    return same_as_input(ctx)


def rms_norm(x, scale, axis, epsilon, stash_type):
    axes = tuple(range(axis % x.ndim, x.ndim))
    xs = x.astype(stash_type.np)
    inv_rms = 1 / np.sqrt((xs * xs).mean(axis=axes, keepdims=True) + epsilon)
    return ((xs * inv_rms).astype(x.dtype) * scale).astype(x.dtype)


register_op("RMSNormalization", pattern=Pattern.OPAQUE, infer=_rms_norm_infer,
            evaluate=rms_norm, inputs=2,
            attrs={"axis": -1, "epsilon": 1e-5, "stash_type": T.float32})

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


register_op("GroupNormalization", pattern=Pattern.OPAQUE, infer=_group_norm_infer,
            evaluate=group_norm, inputs=3,
            attrs={"num_groups": REQUIRED, "epsilon": 1e-5, "stash_type": T.float32})

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


register_op("LRN", pattern=Pattern.OPAQUE, infer=_lrn_infer, evaluate=lrn,
            attrs={"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "bias": 1.0})


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


register_op("MeanVarianceNormalization", pattern=Pattern.OPAQUE, infer=_axes_infer,
            evaluate=mean_variance_norm, attrs={"axes": [0, 2, 3]})


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


register_op("LpNormalization", pattern=Pattern.OPAQUE, infer=_lp_norm_infer, evaluate=lp_norm,
            attrs={"axis": -1, "p": 2})

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


register_op("Dropout", pattern=Pattern.OPAQUE, infer=_dropout_infer, evaluate=dropout,
            inputs=(1, 3), outputs=(1, 2), attrs={"seed": None})
