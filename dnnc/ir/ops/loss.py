"""Loss ops at inference: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both read class scores [N, C, d1, ...] and integer targets [N, d1, ...]. Each element's loss is
-w[t] * score[n, t, d...], with w the optional class weights (1 without) and w = 0 where t equals
`ignore_index`; reduction "mean" divides the sum by the sum of those weights (so ignored
elements do not count), as the ONNX node suite checks it. Training-only gradients are out of
scope. float16 and bfloat16 compute in float32.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from .infer import check_dtype
from .registry import Pattern, register_op

_REDUCTIONS = ("none", "sum", "mean")
_HALF = ("float16", "bfloat16")


def _loss_infer(ctx):
    check_dtype(ctx, 0, T.FLOAT_DTYPES, "scores")
    check_dtype(ctx, 1, (T.int32, T.int64), "target")
    x, target = ctx.type(0), ctx.type(1)
    if x.rank < 2:
        raise ctx.fail(f"scores must be [N, C, d1, ...] (rank >= 2), given {x}")
    if target.rank != x.rank - 1:
        raise ctx.fail(f"target must have rank {x.rank - 1} for scores {x}, given {target}")
    for a, b in zip((x.shape[0],) + x.shape[2:], target.shape):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise ctx.fail(f"target {target} does not match scores {x} (want [N, d1, ...])")
    if ctx.has(2):
        check_dtype(ctx, 2, (x.dtype,), "weight")
        if ctx.type(2).rank != 1:
            raise ctx.fail(f"weight must be 1-D [C], given {ctx.type(2)}")
    reduction = ctx.attrs["reduction"]
    if reduction not in _REDUCTIONS:
        raise ctx.fail(f"reduction must be one of {', '.join(_REDUCTIONS)}, given "
                       f"{reduction!r}")
    loss_shape = target.shape if reduction == "none" else ()
    return [T.TensorType(x.dtype, loss_shape), x]


def _nll(log_prob, target, weight, ignore_index, reduction):
    """The loss from log-probabilities [N, C, ...] (already widened); returns float array."""
    target = target.astype(np.int64)
    ignored = target == ignore_index if ignore_index is not None else np.zeros(target.shape, bool)
    safe = np.where(ignored, 0, target)  # ignored targets may lie outside [0, C)
    picked = np.take_along_axis(log_prob, np.expand_dims(safe, 1), axis=1).squeeze(1)
    w = np.ones(target.shape, log_prob.dtype) if weight is None \
        else weight.astype(log_prob.dtype)[safe]
    w = np.where(ignored, 0, w).astype(log_prob.dtype)
    loss = -picked * w
    if reduction == "sum":
        return np.sum(loss)
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(loss) / np.sum(w)
    return loss


def _wide(x):
    return x.astype(np.float32) if x.dtype.name in _HALF else x


def negative_log_likelihood_loss(x, target, weight=None, ignore_index=None, reduction="mean"):
    return np.asarray(_nll(_wide(x), target, weight, ignore_index, reduction)).astype(x.dtype)


def _log_softmax(x):
    shifted = x - np.max(x, axis=1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def softmax_cross_entropy_loss(x, target, weight=None, ignore_index=None, reduction="mean"):
    log_prob = _log_softmax(_wide(x))
    loss = _nll(log_prob, target, weight, ignore_index, reduction)
    return np.asarray(loss).astype(x.dtype), log_prob.astype(x.dtype)


register_op("NegativeLogLikelihoodLoss", pattern=Pattern.OPAQUE,
            infer=lambda ctx: _loss_infer(ctx)[:1], evaluate=negative_log_likelihood_loss,
            attrs={"ignore_index": None, "reduction": "mean"}, inputs=(2, 3))
register_op("SoftmaxCrossEntropyLoss", pattern=Pattern.OPAQUE, infer=_loss_infer,
            evaluate=softmax_cross_entropy_loss,
            attrs={"ignore_index": None, "reduction": "mean"}, inputs=(2, 3), outputs=(1, 2))
