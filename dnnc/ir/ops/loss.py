"""Loss ops at inference: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both read class scores [N, C, d1, ...] and integer targets [N, d1, ...]. Each element's loss is
-w[t] * score[n, t, d...], with w the optional class weights (1 without) and w = 0 where t equals
`ignore_index`; reduction "mean" divides the sum by the sum of those weights (so ignored
elements do not count), as the ONNX node suite checks it. Training-only gradients are out of
scope. float16 and bfloat16 compute in float32.

Compute rules read the score at each element's target class (a load at a data-dependent
index, in range for valid targets; an ignored element reads class 0 and is weighted 0).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..compute import compute, reduce_axis, reduce_sum
from ..loop import INDEX, Cast, Select, call, const, eq
from .infer import check_dtype
from .reduce import Rows, input_at, stage_name, wide_dtype
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


def _nll_output(score, target, weight, ignore_index, reduction, out):
    """The loss Tensor, where `score(n, c, d)` is the (wide) log-probability of class c at
    batch n and spatial index d; an element's weight is w[t] (1 without weights), 0 when
    t == ignore_index; "mean" divides the sum of losses by the sum of weights."""
    dtype = wide_dtype(out.dtype)

    def terms(i):  # (loss, weight) of the element at target index i
        t = Cast(INDEX, target[i])
        ignored = None if ignore_index is None else eq(t, const(int(ignore_index)))
        if ignored is not None:
            t = Select(ignored, const(0), t)  # an ignored target may lie outside [0, C)
        w = const(1.0, dtype) if weight is None else Cast(dtype, weight[t])
        if ignored is not None:
            w = Select(ignored, const(0.0, dtype), w)
        return call("neg", score(i[0], t, i[1:])) * w, w

    if reduction == "none":
        return compute(out.shape, lambda *i: terms(i)[0], name=stage_name("nll"),
                       dtype=out.dtype)

    def total(k):  # the sum over every element of term k (0: losses, 1: weights)
        r = [reduce_axis(n) for n in target.shape]
        return reduce_sum(terms(tuple(a.var for a in r))[k], r)

    value = total(0) if reduction == "sum" else total(0) / total(1)
    return compute((), lambda: value, name=stage_name("nll"), dtype=out.dtype)


def _nll_rule(inputs, outputs, ignore_index, reduction):
    x, target, weight = inputs[0], inputs[1], input_at(inputs, 2)
    dtype = wide_dtype(x.dtype)

    def score(n, c, d):
        return Cast(dtype, x[(n, c) + tuple(d)])

    return [_nll_output(score, target, weight, ignore_index, reduction, outputs[0])]


def _softmax_cross_entropy_rule(inputs, outputs, ignore_index, reduction):
    """log_softmax over the classes (row max and row sum stages, in float32 for 16-bit
    floats), then the NLL loss of it; the optional second output is the log-probabilities."""
    x, target, weight = inputs[0], inputs[1], input_at(inputs, 2)
    dtype = wide_dtype(x.dtype)
    rows = Rows(x, [1])
    top = rows.max(dtype, "sce_max")

    def total_of(*i):
        r = rows.reduce_axes()
        return reduce_sum(call("exp", Cast(dtype, rows.read(i, r)) - top[i]), r)

    total = compute(rows.shape, total_of, name=stage_name("sce_sum"))

    def log_prob_of(*i):
        s = rows.stat(i)
        return Cast(dtype, x[i]) - top[s] - call("log", total[s])

    log_prob = compute(x.shape, log_prob_of, name=stage_name("sce_log_prob"))

    def score(n, c, d):
        return log_prob[(n, c) + tuple(d)]

    outs = [_nll_output(score, target, weight, ignore_index, reduction, outputs[0])]
    if len(outputs) > 1:
        outs.append(compute(outputs[1].shape, lambda *i: log_prob[i],
                            name=stage_name("log_prob"), dtype=outputs[1].dtype))
    return outs


register_op("NegativeLogLikelihoodLoss", pattern=Pattern.OPAQUE,
            infer=lambda ctx: _loss_infer(ctx)[:1], evaluate=negative_log_likelihood_loss,
            attrs={"ignore_index": None, "reduction": "mean"}, inputs=(2, 3),
            compute=_nll_rule)
register_op("SoftmaxCrossEntropyLoss", pattern=Pattern.OPAQUE, infer=_loss_infer,
            evaluate=softmax_cross_entropy_loss,
            attrs={"ignore_index": None, "reduction": "mean"}, inputs=(2, 3), outputs=(1, 2),
            compute=_softmax_cross_entropy_rule)
