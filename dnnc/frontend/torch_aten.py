"""Core ATen ops -> dnnc ops: one converter per ATen overload, registered explicitly
(`@aten("convolution.default")`, `elementwise("relu.default", "Relu")`), as the ONNX importers
are with `@onnx_op`. A converter reads its FX node's arguments through the import context
(`torch_fx.FxImport`) and returns the dnnc value(s) of the node (a list for ATen ops that
return tuples); `accepts`, where given, says which arguments it takes (the partitioner leaves
the rest in torch). Types come from the node's fake tensor (`meta["val"]`): operands are cast
to the dtype ATen's promotion gave the result. This module never walks a graph and never
compiles; it imports torch only for dtypes.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.fx as fx

from ..errors import ShapeError
from ..ir import types as T
from ..ir.graph import Value

__all__ = ["ATEN", "Converter", "ImportContext", "np_dtype"]

_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64,
              torch.float16: np.float16, torch.bfloat16: T.bfloat16.np,
              torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
              torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}


def np_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The NumPy dtype of a torch dtype; None for those dnnc has no type for (complex)."""
    found = _NP_DTYPES.get(dtype)
    return None if found is None else np.dtype(found)


class ImportContext:
    """What a converter may call (`torch_fx.FxImport` implements it): `add(op, *inputs,
    num_outputs=1, **attrs)`, `const(array, dtype=None)`, `value(arg)` (an FX argument as a
    Value or Python value), `size_value(dim)` and `shape_value(dims)` (1-D int64 values of
    ints and symbolic sizes)."""


@dataclass
class Converter:
    convert: Callable[[ImportContext, fx.Node], object]
    accepts: Callable[[fx.Node], bool] | None = None


ATEN: dict[str, Converter] = {}
"""ATen overload name ("aten.convolution.default") -> its converter."""


def aten(*names: str, accepts: Callable[[fx.Node], bool] | None = None):
    def register(fn):
        for name in names:
            ATEN[f"aten.{name}"] = Converter(fn, accepts)
        return fn
    return register


# ---------------------------------------------------------------------------------------------
# Arguments


def arg(node: fx.Node, i: int, name: str, default=None):
    """Argument `i` (positional) or `name` (keyword) of an ATen call, else `default`."""
    if i < len(node.args):
        return node.args[i]
    return node.kwargs.get(name, default)


def out_dtype(node: fx.Node) -> np.dtype:
    val = node.meta["val"]
    return np_dtype((val[0] if isinstance(val, (tuple, list)) else val).dtype)


def tensor(ctx: ImportContext, x, dtype: np.dtype) -> Value:
    """A Value of dtype `dtype` from a Value (cast where its dtype differs) or a scalar."""
    if not isinstance(x, Value):
        return ctx.const(np.array(x, dtype))
    if x.type.dtype.np != dtype:
        return ctx.add("Cast", x, to=T.DType.from_numpy(dtype))
    return x


def scalar_arg(node: fx.Node, i: int) -> bool:
    a = node.args[i] if i < len(node.args) else None
    return not isinstance(a, fx.Node)


def _promoted(node: fx.Node) -> np.dtype:
    """The dtype ATen computes a comparison in: its operands' promotion."""
    dtypes = [a.meta["val"].dtype for a in node.args if isinstance(a, fx.Node)]
    dtype = dtypes[0]
    for d in dtypes[1:]:
        dtype = torch.promote_types(dtype, d)
    if any(isinstance(a, float) for a in node.args) and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return np_dtype(dtype)


def _tensor_args(node: fx.Node) -> bool:
    """No tensor operand stands where ATen wants a scalar (ints and floats only)."""
    return all(not isinstance(a, fx.Node) or isinstance(a.meta.get("val"), torch.Tensor)
               for a in node.args)


# ---------------------------------------------------------------------------------------------
# Elementwise: one line per op


def elementwise(name: str, op: str, **attrs) -> None:
    """A unary ATen op that is the dnnc op `op` on an operand of the result's dtype."""
    def convert(ctx, node):
        return ctx.add(op, tensor(ctx, ctx.value(node.args[0]), out_dtype(node)), **attrs)
    ATEN[f"aten.{name}"] = Converter(convert)


_ON_BOOLS = {"BitwiseAnd": "And", "BitwiseOr": "Or"}
"""torch's bitwise ops on bool tensors are dnnc's logical ones."""


def binary(name: str, op: str, compare: bool = False) -> None:
    """A binary ATen op (tensor or scalar operands): dnnc's `op` on both operands cast to the
    result's dtype (a comparison's: their promotion)."""
    def convert(ctx, node):
        dtype = _promoted(node) if compare else out_dtype(node)
        a, b = (tensor(ctx, ctx.value(x), dtype) for x in node.args[:2])
        alpha = node.kwargs.get("alpha", 1)
        if alpha != 1:
            b = ctx.add("Mul", b, tensor(ctx, alpha, dtype))
        return ctx.add(_ON_BOOLS.get(op, op) if dtype == np.bool_ else op, a, b)
    ATEN[f"aten.{name}"] = Converter(convert, _tensor_args)


for _name, _op in [("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("exp", "Exp"),
                   ("log", "Log"), ("sqrt", "Sqrt"), ("neg", "Neg"), ("abs", "Abs"),
                   ("erf", "Erf"), ("reciprocal", "Reciprocal"), ("sin", "Sin"),
                   ("cos", "Cos"), ("floor", "Floor"), ("ceil", "Ceil"), ("sign", "Sign"),
                   ("logical_not", "Not"), ("clone", "Identity"), ("alias", "Identity"),
                   ("lift_fresh_copy", "Identity"), ("detach", "Identity")]:
    elementwise(f"{_name}.default", _op)
# torch's decompositions of these are 3 to 6 elementwise ops each (hardswish: x * clamp(x + 3,
# 0, 6) / 6): kept whole (`torch_fx.DECOMPOSITIONS` leaves out what has a converter)
for _name, _op in [("hardswish", "HardSwish"), ("silu", "Swish"), ("mish", "Mish")]:
    elementwise(f"{_name}.default", _op)
elementwise("hardsigmoid.default", "HardSigmoid", alpha=1 / 6, beta=0.5)
for _name, _op in [("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div")]:
    binary(f"{_name}.Tensor", _op)
    binary(f"{_name}.Scalar", _op)
for _name, _op in [("eq", "Equal"), ("lt", "Less"), ("le", "LessOrEqual"), ("gt", "Greater"),
                   ("ge", "GreaterOrEqual")]:
    binary(f"{_name}.Tensor", _op, compare=True)
    binary(f"{_name}.Scalar", _op, compare=True)
binary("pow.Tensor_Scalar", "Pow")
binary("pow.Tensor_Tensor", "Pow")
binary("maximum.default", "Max")
binary("minimum.default", "Min")
binary("logical_and.default", "And", compare=True)
binary("bitwise_and.Tensor", "BitwiseAnd")
binary("bitwise_or.Tensor", "BitwiseOr")
binary("logical_or.default", "Or", compare=True)


@aten("rsqrt.default")
def _rsqrt(ctx, node):
    x = tensor(ctx, ctx.value(node.args[0]), out_dtype(node))
    return ctx.add("Reciprocal", ctx.add("Sqrt", x))


@aten("ne.Tensor", "ne.Scalar", accepts=_tensor_args)
def _ne(ctx, node):
    a, b = (tensor(ctx, ctx.value(x), _promoted(node)) for x in node.args[:2])
    return ctx.add("Not", ctx.add("Equal", a, b))


@aten("gelu.default")
def _gelu(ctx, node):
    return ctx.add("Gelu", ctx.value(node.args[0]),
                   approximate=arg(node, 1, "approximate", "none"))


@aten("leaky_relu.default")
def _leaky_relu(ctx, node):
    return ctx.add("LeakyRelu", ctx.value(node.args[0]),
                   alpha=float(arg(node, 1, "negative_slope", 0.01)))


@aten("softplus.default", accepts=lambda n: arg(n, 1, "beta", 1) == 1)
def _softplus(ctx, node):
    """log(1 + exp(x)); torch's `threshold` (x above it: x) changes nothing in float32 at
    the default 20 (log1p(exp(20)) rounds to 20)."""
    return ctx.add("Softplus", ctx.value(node.args[0]))


@aten("elu.default", accepts=lambda n: arg(n, 3, "input_scale", 1) == 1)
def _elu(ctx, node):
    """scale * elu(x, alpha): selu reaches the backend as elu with selu's constants."""
    x = ctx.value(node.args[0])
    out = ctx.add("Elu", x, alpha=float(arg(node, 1, "alpha", 1.0)))
    scale = arg(node, 2, "scale", 1)
    return out if scale == 1 else ctx.add("Mul", out, ctx.const(np.array(scale,
                                                                         x.type.dtype.np)))


@aten("hardtanh.default")
def _hardtanh(ctx, node):
    dtype = out_dtype(node)
    lo, hi = arg(node, 1, "min_val", -1.0), arg(node, 2, "max_val", 1.0)
    return ctx.add("Clip", ctx.value(node.args[0]), ctx.const(np.array(lo, dtype)),
                   ctx.const(np.array(hi, dtype)))


@aten("clamp.default", accepts=lambda n: all(scalar_arg(n, i) for i in (1, 2)))
def _clamp(ctx, node):
    dtype = out_dtype(node)
    lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    bounds = [None if v is None else ctx.const(np.array(v, dtype)) for v in (lo, hi)]
    return ctx.add("Clip", tensor(ctx, ctx.value(node.args[0]), dtype), *bounds)


@aten("where.self", accepts=_tensor_args)
def _where(ctx, node):
    dtype = out_dtype(node)
    cond = tensor(ctx, ctx.value(node.args[0]), np.dtype(np.bool_))
    a, b = (tensor(ctx, ctx.value(x), dtype) for x in node.args[1:3])
    return ctx.add("Where", cond, a, b)


@aten("_to_copy.default")
def _to_copy(ctx, node):
    return tensor(ctx, ctx.value(node.args[0]), out_dtype(node))


# ---------------------------------------------------------------------------------------------
# Products, convolutions, pooling


@aten("mm.default", "bmm.default")
def _matmul(ctx, node):
    return ctx.add("MatMul", *(ctx.value(x) for x in node.args[:2]))


@aten("addmm.default")
def _addmm(ctx, node):
    bias, a, b = (ctx.value(x) for x in node.args[:3])
    return ctx.add("Gemm", a, b, bias, beta=float(node.kwargs.get("beta", 1)),
                   alpha=float(node.kwargs.get("alpha", 1)))


def _conv_accepts(node: fx.Node) -> bool:
    weight = node.args[1].meta["val"]
    return weight.dim() in (3, 4, 5) and not any(o for o in arg(node, 7, "output_padding", [])
                                                 if not arg(node, 6, "transposed", False))


@aten("convolution.default", accepts=_conv_accepts)
def _convolution(ctx, node):
    x, w, b = (ctx.value(a) for a in node.args[:3])
    stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
    spatial = w.type.rank - 2
    attrs = dict(strides=_n(stride, spatial), pads=_n(padding, spatial) * 2,
                 dilations=_n(dilation, spatial), group=int(groups),
                 kernel_shape=list(w.type.shape[2:]))
    if transposed:
        return ctx.add("ConvTranspose", x, w, b, output_padding=_n(output_padding, spatial),
                       **attrs)
    return ctx.add("Conv", x, w, b, **attrs)


def _n(values, n: int) -> list[int]:
    """An ATen int list of one value or `n` values, as `n` ints."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    return [int(v) for v in (values * n if len(values) == 1 else values)]


def _indices_unused(node: fx.Node) -> bool:
    """max_pool2d_with_indices's indices, output 1, read by nothing."""
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


@aten("max_pool2d_with_indices.default", accepts=_indices_unused)
def _max_pool(ctx, node):
    x = ctx.value(node.args[0])
    kernel = _n(node.args[1], 2)
    stride = _n(arg(node, 2, "stride", []) or kernel, 2)
    pad = _n(arg(node, 3, "padding", 0), 2)
    out = ctx.add("MaxPool", x, kernel_shape=kernel, strides=stride, pads=pad * 2,
                  dilations=_n(arg(node, 4, "dilation", 1), 2),
                  ceil_mode=int(bool(arg(node, 5, "ceil_mode", False))))
    return [out, None]


@aten("avg_pool2d.default", accepts=lambda n: arg(n, 6, "divisor_override") is None)
def _avg_pool(ctx, node):
    x = ctx.value(node.args[0])
    kernel = _n(node.args[1], 2)
    stride = _n(arg(node, 2, "stride", []) or kernel, 2)
    return ctx.add("AveragePool", x, kernel_shape=kernel, strides=stride,
                   pads=_n(arg(node, 3, "padding", 0), 2) * 2,
                   ceil_mode=int(bool(arg(node, 4, "ceil_mode", False))),
                   count_include_pad=int(bool(arg(node, 5, "count_include_pad", True))))


def _adaptive_accepts(node: fx.Node) -> bool:
    size = list(node.args[1])
    if size == [1, 1]:
        return True
    hw = node.args[0].meta["val"].shape[-2:]
    return all(isinstance(d, int) and d % s == 0 for d, s in zip(hw, size))


@aten("_adaptive_avg_pool2d.default", accepts=_adaptive_accepts)
def _adaptive_avg_pool(ctx, node):
    x, size = ctx.value(node.args[0]), list(node.args[1])
    if size == [1, 1]:
        return ctx.add("GlobalAveragePool", x)
    kernel = [d // s for d, s in zip(x.type.shape[-2:], size)]
    return ctx.add("AveragePool", x, kernel_shape=kernel, strides=kernel)


# ---------------------------------------------------------------------------------------------
# Normalisation, softmax, reductions


def _first_output_only(node: fx.Node) -> bool:
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


@aten("native_layer_norm.default", accepts=_first_output_only)
def _layer_norm(ctx, node):
    x, shape, w, b, eps = (ctx.value(a) for a in node.args[:5])
    norm = x.type.shape[-len(shape):]
    dtype = x.type.dtype.np
    w = w if w is not None else ctx.const(np.ones(norm, dtype))
    out = ctx.add("LayerNormalization", x, w, b, axis=-len(shape), epsilon=float(eps))
    return [out, None, None]


@aten("_native_batch_norm_legit_no_training.default", accepts=_first_output_only)
def _batch_norm(ctx, node):
    x, w, b, mean, var = (ctx.value(a) for a in node.args[:5])
    eps = float(node.args[6])
    channels = mean.type.shape
    dtype = x.type.dtype.np
    w = w if w is not None else ctx.const(np.ones(channels, dtype))
    b = b if b is not None else ctx.const(np.zeros(channels, dtype))
    return [ctx.add("BatchNormalization", x, w, b, mean, var, epsilon=eps), None, None]


@aten("_softmax.default", accepts=lambda n: not n.args[2])
def _softmax(ctx, node):
    return ctx.add("Softmax", ctx.value(node.args[0]), axis=int(node.args[1]))


@aten("_log_softmax.default", accepts=lambda n: not n.args[2])
def _log_softmax(ctx, node):
    return ctx.add("LogSoftmax", ctx.value(node.args[0]), axis=int(node.args[1]))


def reduction(name: str, op: str) -> None:
    def convert(ctx, node):
        x = tensor(ctx, ctx.value(node.args[0]), out_dtype(node))
        dims = arg(node, 1, "dim")
        keep = int(bool(arg(node, 2, "keepdim", False)))
        if op == "ReduceMean" and _spatial(x, dims):   # the pooling template, not a reduction
            pooled = ctx.add("GlobalAveragePool", x)
            return pooled if keep else ctx.add("Squeeze", pooled,
                                               ctx.const(np.array([2, 3], np.int64)))
        if not dims:   # None or []: every axis
            return ctx.add(op, x, keepdims=keep)
        dims = [dims] if isinstance(dims, int) else list(dims)
        return ctx.add(op, x, ctx.const(np.array(dims, np.int64)), keepdims=keep)
    ATEN[f"aten.{name}"] = Converter(convert)


def _spatial(x: Value, dims) -> bool:
    """`dims` are the last two of a 4-D tensor: an NCHW global average pool."""
    return x.type.rank == 4 and isinstance(dims, (list, tuple)) and \
        sorted(d % 4 for d in dims) == [2, 3]


reduction("mean.dim", "ReduceMean")
reduction("sum.dim_IntList", "ReduceSum")
reduction("amax.default", "ReduceMax")
reduction("amin.default", "ReduceMin")


@aten("any.dim", "any.dims", "any.default")
def _any(ctx, node):
    """Any as the maximum of the operand as 0/1 int32 (dnnc has no boolean reduction)."""
    x = tensor(ctx, ctx.value(node.args[0]), np.dtype(np.bool_))
    ints = ctx.add("Cast", x, to=T.int32)
    dims = arg(node, 1, "dim")
    keep = int(bool(arg(node, 2, "keepdim", False)))
    if dims is None:
        most = ctx.add("ReduceMax", ints, keepdims=keep)
    else:
        dims = [dims] if isinstance(dims, int) else list(dims)
        most = ctx.add("ReduceMax", ints, ctx.const(np.array(dims, np.int64)), keepdims=keep)
    return ctx.add("Cast", most, to=T.bool_)


@aten("argmax.default", accepts=lambda n: arg(n, 1, "dim") is not None)
def _argmax(ctx, node):
    return ctx.add("ArgMax", ctx.value(node.args[0]), axis=int(arg(node, 1, "dim")),
                   keepdims=int(bool(arg(node, 2, "keepdim", False))))


@aten("cumsum.default", accepts=lambda n: "dtype" not in n.kwargs)
def _cumsum(ctx, node):
    x = tensor(ctx, ctx.value(node.args[0]), out_dtype(node))
    return ctx.add("CumSum", x, ctx.const(np.array(int(node.args[1]), np.int64)))


# ---------------------------------------------------------------------------------------------
# Shapes, views, indexing


@aten("view.default", "_unsafe_view.default", "reshape.default")
def _view(ctx, node):
    x, shape = ctx.value(node.args[0]), ctx.value(node.args[1])
    return ctx.add("Reshape", x, ctx.shape_value(shape))


@aten("permute.default")
def _permute(ctx, node):
    x = ctx.value(node.args[0])
    return ctx.add("Transpose", x, perm=[int(d) % max(x.type.rank, 1) for d in node.args[1]])


@aten("expand.default")
def _expand(ctx, node):
    x, sizes = ctx.value(node.args[0]), ctx.value(node.args[1])
    sizes = [1 if isinstance(s, int) and s == -1 else s for s in sizes]   # -1: keep the dim
    return ctx.add("Expand", x, ctx.shape_value(sizes))


@aten("unsqueeze.default")
def _unsqueeze(ctx, node):
    return ctx.add("Unsqueeze", ctx.value(node.args[0]),
                   ctx.const(np.array([int(node.args[1])], np.int64)))


@aten("squeeze.dim", "squeeze.dims", "squeeze.default")
def _squeeze(ctx, node):
    x = ctx.value(node.args[0])
    dims = arg(node, 1, "dim")
    dims = range(x.type.rank) if dims is None else [dims] if isinstance(dims, int) else dims
    dims = [d % x.type.rank for d in dims if x.type.shape[d] == 1]   # torch skips others
    if not dims:
        return ctx.add("Identity", x)
    return ctx.add("Squeeze", x, ctx.const(np.array(dims, np.int64)))


@aten("cat.default")
def _cat(ctx, node):
    dtype = out_dtype(node)
    parts = [tensor(ctx, ctx.value(t), dtype) for t in node.args[0]]
    parts = [p for p in parts if p.type.shape != (0,)]   # torch's legacy empty operand
    return ctx.add("Concat", *parts, axis=int(arg(node, 1, "dim", 0)))


@aten("slice.Tensor")
def _slice(ctx, node):
    x = ctx.value(node.args[0])
    dim = int(arg(node, 1, "dim", 0))
    start = ctx.value(arg(node, 2, "start", None))
    end = ctx.value(arg(node, 3, "end", None))
    step = int(arg(node, 4, "step", 1))
    start = 0 if start is None else start
    end = sys.maxsize if end is None else end
    return ctx.add("Slice", x, ctx.size_value(start), ctx.size_value(end),
                   ctx.const(np.array([dim], np.int64)), ctx.const(np.array([step], np.int64)))


@aten("select.int")
def _select(ctx, node):
    x, dim, index = ctx.value(node.args[0]), int(node.args[1]), ctx.value(node.args[2])
    index = ctx.const(np.array(index, np.int64)) if not isinstance(index, Value) else \
        ctx.add("Squeeze", index, ctx.const(np.array([0], np.int64)))
    return ctx.add("Gather", x, index, axis=dim)


@aten("gather.default", accepts=lambda n: not n.kwargs.get("sparse_grad"))
def _gather(ctx, node):
    x, dim, index = ctx.value(node.args[0]), int(node.args[1]), ctx.value(node.args[2])
    return ctx.add("GatherElements", x, index, axis=dim)


@aten("index_select.default")
def _index_select(ctx, node):
    x, dim, index = ctx.value(node.args[0]), int(node.args[1]), ctx.value(node.args[2])
    return ctx.add("Gather", x, index, axis=dim)


@aten("embedding.default")
def _embedding(ctx, node):
    weight, indices = ctx.value(node.args[0]), ctx.value(node.args[1])
    return ctx.add("Gather", weight, indices, axis=0)


def _adjacent_int_indices(node: fx.Node) -> bool:
    """aten.index with integer index tensors on adjacent dims (`x[:, i, j]`, `x[b, k]`):
    what one GatherND computes. Boolean masks (data-dependent shapes) stay in torch."""
    indices = list(node.args[1])
    given = [k for k, i in enumerate(indices) if i is not None]
    return bool(given) and given == list(range(given[0], given[-1] + 1)) and all(
        isinstance(indices[k], fx.Node) and
        not indices[k].meta["val"].dtype.is_floating_point and
        indices[k].meta["val"].dtype != torch.bool for k in given)


@aten("index.Tensor", accepts=_adjacent_int_indices)
def _index(ctx, node):
    """Advanced indexing on adjacent dims first..last: the index tensors broadcast to one
    shape B, stacked on a last axis, read by GatherND from `x` with those dims moved to the
    front; B takes their place in the result, as torch puts it for adjacent dims."""
    x, indices = ctx.value(node.args[0]), list(node.args[1])
    given = [k for k, i in enumerate(indices) if i is not None]
    first, count, rank = given[0], len(given), x.type.rank
    index = [tensor(ctx, ctx.value(indices[k]), np.dtype(np.int64)) for k in given]
    if count == 1:
        return ctx.add("Gather", x, index[0], axis=first)
    total = index[0]
    for i in index[1:]:
        total = ctx.add("Add", total, i)   # its shape is the broadcast shape B
    shape = ctx.add("Shape", total)
    last = ctx.const(np.array([-1], np.int64))
    stacked = ctx.add("Concat", *[ctx.add("Unsqueeze", ctx.add("Expand", i, shape), last)
                                  for i in index], axis=-1)
    order = list(range(first, first + count)) + [d for d in range(rank)
                                                  if not first <= d < first + count]
    moved = x if order == list(range(rank)) else ctx.add("Transpose", x, perm=order)
    out = ctx.add("GatherND", moved, stacked)
    if first == 0:
        return out
    b = out.type.rank - (rank - count)   # B's rank; then the dims before `first`, the rest
    perm = list(range(b, b + first)) + list(range(b)) + list(range(b + first, out.type.rank))
    return ctx.add("Transpose", out, perm=perm)


def _one_position_index(node: fx.Node) -> bool:
    """index_put without accumulation at one 1-D integer index tensor after full slices
    (`cache[:, :, pos] = v`, a static KV cache's write), values of the written shape."""
    indices = list(node.args[1])
    given = [k for k, i in enumerate(indices) if i is not None]
    if arg(node, 3, "accumulate", False) or len(given) != 1:
        return False
    axis, index = given[0], indices[given[0]]
    return _positions_fit(node.args[0], axis, index, node.args[2])


def _positions_fit(data: fx.Node, axis: int, index, values) -> bool:
    """`values` is `data` with dim `axis` replaced by 1-D integer `index`'s length."""
    if not isinstance(index, fx.Node) or not isinstance(values, fx.Node):
        return False
    x, i, v = data.meta["val"], index.meta["val"], values.meta["val"]
    want = list(x.shape)
    if i.dim() != 1 or i.dtype not in (torch.int64, torch.int32) or not 0 <= axis < x.dim():
        return False
    want[axis] = i.shape[0]
    return v.dtype == x.dtype and [str(d) for d in v.shape] == [str(d) for d in want]


@aten("index_put.default", accepts=_one_position_index)
def _index_put(ctx, node):
    axis = next(k for k, i in enumerate(node.args[1]) if i is not None)
    index = tensor(ctx, ctx.value(node.args[1][axis]), np.dtype(np.int64))
    return ctx.add("IndexCopy", ctx.value(node.args[0]), index, ctx.value(node.args[2]),
                   axis=axis)


@aten("index_copy.default",
      accepts=lambda n: _positions_fit(n.args[0], n.args[1] % n.args[0].meta["val"].dim(),
                                       n.args[2], n.args[3]))
def _index_copy(ctx, node):
    x = ctx.value(node.args[0])
    index = tensor(ctx, ctx.value(node.args[2]), np.dtype(np.int64))
    return ctx.add("IndexCopy", x, index, ctx.value(node.args[3]),
                   axis=node.args[1] % x.type.rank)


def _strided_static(node: fx.Node) -> bool:
    """as_strided of a contiguous tensor at offset 0 (its storage is its row-major values),
    static sizes, strides and offset."""
    x = node.args[0].meta["val"]
    args = [node.args[1], node.args[2], arg(node, 3, "storage_offset", 0) or 0]
    return x.is_contiguous() and x.storage_offset() == 0 and all(
        isinstance(v, int) for v in [*args[0], *args[1], args[2], *x.shape])


@aten("as_strided.default", accepts=_strided_static)
def _as_strided(ctx, node):
    """as_strided of a contiguous tensor: the elements at offset + sum(i * stride) of its
    row-major values, a Gather of constant positions (a Reshape where they are in order)."""
    x = ctx.value(node.args[0])
    size, stride = [int(v) for v in node.args[1]], [int(v) for v in node.args[2]]
    offset = int(arg(node, 3, "storage_offset", 0) or 0)
    positions = np.full(size, offset, np.int64)
    for axis, (n, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = n
        positions = positions + (np.arange(n, dtype=np.int64) * step).reshape(shape)
    flat = ctx.add("Reshape", x, ctx.const(np.array([-1], np.int64)))
    if np.array_equal(positions.ravel(), np.arange(positions.size)):
        return ctx.add("Reshape", flat, ctx.const(np.array(size, np.int64)))
    return ctx.add("Gather", flat, ctx.const(positions), axis=0)


@aten("split_with_sizes.default",
      accepts=lambda n: all(isinstance(size, int) for size in n.args[1]))
def _split(ctx, node):
    x, sizes = ctx.value(node.args[0]), [int(s) for s in node.args[1]]
    dim = int(arg(node, 2, "dim", 0))
    if len(sizes) == 1:
        return [ctx.add("Identity", x)]
    return ctx.add("Split", x, ctx.const(np.array(sizes, np.int64)), axis=dim,
                   num_outputs=len(sizes))


@aten("split.Tensor", accepts=lambda n: isinstance(n.args[1], int))
def _split_even(ctx, node):
    x, size = ctx.value(node.args[0]), int(node.args[1])
    dim = int(arg(node, 2, "dim", 0))
    total = x.type.shape[dim]
    if not isinstance(total, int):
        raise ShapeError("split.Tensor of a symbolic dim")
    sizes = [min(size, total - i) for i in range(0, total, size)]
    if len(sizes) == 1:
        return [ctx.add("Identity", x)]
    return ctx.add("Split", x, ctx.const(np.array(sizes, np.int64)), axis=dim,
                   num_outputs=len(sizes))


@aten("constant_pad_nd.default",
      accepts=lambda n: all(isinstance(p, int) and p >= 0 for p in n.args[1]))
def _pad(ctx, node):
    x, pad = ctx.value(node.args[0]), [int(p) for p in node.args[1]]
    rank = x.type.rank
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):   # torch pads the last dim first: (begin, end) pairs
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    value = ctx.const(np.array(arg(node, 2, "value", 0), x.type.dtype.np))
    return ctx.add("Pad", x, ctx.const(np.array(begins + ends, np.int64)), value)


# ---------------------------------------------------------------------------------------------
# Creation


def _static_sizes(node: fx.Node) -> bool:
    return all(isinstance(s, int) for s in node.args[0])


@aten("full.default", accepts=_static_sizes)
def _full(ctx, node):
    return ctx.const(np.full([int(s) for s in node.args[0]], node.args[1], out_dtype(node)))


@aten("full_like.default")
def _full_like(ctx, node):
    x = ctx.value(node.args[0])
    fill = ctx.const(np.array(node.args[1], out_dtype(node)))
    return ctx.add("Expand", fill, ctx.add("Shape", x))


@aten("scalar_tensor.default")
def _scalar_tensor(ctx, node):
    return ctx.const(np.array(node.args[0], out_dtype(node)))


@aten("arange.start_step", "arange.default", "arange.start",
      accepts=lambda n: all(not isinstance(a, fx.Node) for a in n.args))
def _arange(ctx, node):
    args = list(node.args)
    start, end, step = (0, args[0], 1) if len(args) == 1 else \
        (args + [1])[:3] if len(args) < 3 else args[:3]
    return ctx.const(np.arange(start, end, step).astype(out_dtype(node)))
