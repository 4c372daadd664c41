"""ONNX importers for normalization ops and Dropout.

dnnc's ops follow the newest ONNX meaning; older forms are translated here:
BatchNormalization before 14 (mode chosen by `is_test` in 6, by the output count in 7-13;
per-activation statistics with `spatial=0` before 9), GroupNormalization 18 (scale and bias per
group, expanded to per channel as in 21), Dropout before 12 (always inference; in 6-9 the mask
has the data's type), and `stash_type` codes turned into element types.
"""

from __future__ import annotations

import numpy as np

from ...ir import types as T
from ...ir.ops.registry import is_registered
from ..onnx import ImportContext, direct, dtype_from_onnx, onnx_op

direct("InstanceNormalization", since=6)
direct("LRN", since=1)
direct("MeanVarianceNormalization", since=9)
direct("LpNormalization", since=1)
direct("BatchNormalization", since=14)


def _stash_attrs(ctx: ImportContext) -> dict:
    attrs = dict(ctx.attrs)
    attrs["stash_type"] = dtype_from_onnx(attrs.get("stash_type", 1),
                                          f"stash_type of {ctx.op_type} node {ctx.name!r}")
    return attrs


@onnx_op("LayerNormalization", since=17)
def import_layer_norm(ctx: ImportContext):
    return ctx.emit("LayerNormalization", ctx.inputs, _stash_attrs(ctx))


@onnx_op("RMSNormalization", since=23)
def import_rms_norm(ctx: ImportContext):
    return ctx.emit("RMSNormalization", ctx.inputs, _stash_attrs(ctx))


@onnx_op("GroupNormalization", since=21)
def import_group_norm(ctx: ImportContext):
    return ctx.emit("GroupNormalization", ctx.inputs, _stash_attrs(ctx))


@onnx_op("GroupNormalization", since=18)
def import_group_norm_per_group(ctx: ImportContext):
    """Opset 18 scales and shifts per group: repeat each group's value over its channels."""
    x = ctx.inputs[0]
    groups = ctx.attrs.get("num_groups")
    channels = x.type.shape[1] if x.type.rank >= 2 else None
    if not isinstance(groups, int) or groups <= 0:
        raise ctx.fail(f"num_groups must be a positive integer, given {groups!r}")
    if not isinstance(channels, int):
        raise ctx.fail("opset-18 GroupNormalization needs a static channel count to expand "
                       "per-group scale and bias to channels")
    if channels % groups:
        raise ctx.fail(f"{channels} channels do not split into {groups} groups")
    per_channel = [_repeat_groups(ctx, ctx.inputs[i], groups, channels // groups)
                   for i in (1, 2)]
    return ctx.emit("GroupNormalization", [x] + per_channel, {
        "num_groups": groups, "epsilon": ctx.attrs.get("epsilon", 1e-5)})


def _repeat_groups(ctx: ImportContext, param, groups: int, size: int):
    const = param.const
    if const is not None:
        return ctx.const(np.repeat(const.reshape(-1), size), param.dtype)
    for op in ("Reshape", "Expand"):
        if not is_registered(op):
            raise ctx.fail(f"expanding a computed per-group parameter needs the {op} op")
    column = ctx.add("Reshape", param, ctx.const([groups, 1], T.int64))
    tiled = ctx.add("Expand", column, ctx.const([groups, size], T.int64))
    return ctx.add("Reshape", tiled, ctx.const([groups * size], T.int64))


# -- BatchNormalization before opset 14 --------------------------------------------------------


@onnx_op("BatchNormalization", since=6)
def import_batch_norm_old(ctx: ImportContext):
    """Opsets 6-13: training mode when `is_test=0` (6) or when more outputs are asked (7-13).

    The running statistics of outputs 1 and 2 are the opset-14 ones; the saved batch
    statistics (outputs 3 and 4) have no counterpart.
    """
    outputs = list(ctx.node.output)
    if ctx.opset < 7:
        training = not ctx.attrs.get("is_test", 0)
    else:
        training = len([o for o in outputs if o]) > 1
    if any(outputs[3:]):
        raise ctx.fail("the saved_mean and saved_var outputs of training-mode "
                       "BatchNormalization are not supported")
    epsilon = ctx.attrs.get("epsilon", 1e-5)
    x, scale, bias, mean, var = ctx.inputs
    if ctx.attrs.get("spatial", 1) == 0 and x.type.rank > 2:
        if training:
            raise ctx.fail("training-mode BatchNormalization with spatial=0 is not supported")
        return [_per_activation_norm(ctx, x, scale, bias, mean, var, epsilon)]
    attrs = {"epsilon": epsilon, "momentum": ctx.attrs.get("momentum", 0.9),
             "training_mode": int(training)}
    return ctx.emit("BatchNormalization", [x, scale, bias, mean, var], attrs,
                    num_outputs=3 if training else 1)


def _per_activation_norm(ctx: ImportContext, x, scale, bias, mean, var, epsilon):
    """spatial=0: statistics of shape (C, D1, ...) broadcast against (N, C, D1, ...)."""
    eps = ctx.const(np.asarray(epsilon, dtype=var.dtype.np), var.dtype)
    std = ctx.add("Sqrt", ctx.add("Add", var, eps))
    normalized = ctx.add("Div", ctx.add("Sub", x, mean), std)
    return ctx.add("Add", ctx.add("Mul", normalized, scale), bias)


# -- Dropout -------------------------------------------------------------------------------------


@onnx_op("Dropout", since=6)
def import_dropout_old(ctx: ImportContext):
    """Opsets 6-11: imported for inference (identity; opset 6's `is_test` and the unseeded
    training of 6-11 are ignored, as every runtime does); before 10 the mask has x's type."""
    x = ctx.inputs[0]
    outs = ctx.emit("Dropout", [x], num_outputs=ctx.num_outputs)
    if ctx.num_outputs < 2 or ctx.opset >= 10:
        return outs
    return [outs[0], ctx.add("Cast", outs[1], to=x.dtype)]


@onnx_op("Dropout", since=12)
def import_dropout(ctx: ImportContext):
    seed = ctx.attrs.get("seed")
    return ctx.emit("Dropout", ctx.inputs, {} if seed is None else {"seed": seed})
