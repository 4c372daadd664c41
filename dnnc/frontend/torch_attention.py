"""torch's fused attention ops -> dnnc's attention chain: `aten.scaled_dot_product_attention`
and the kernels torch lowers it to (`_scaled_dot_product_efficient_attention`,
`_scaled_dot_product_flash_attention`, `_scaled_dot_product_cudnn_attention` on cuda,
`_scaled_dot_product_flash_attention_for_cpu`), registered in `torch_aten.ATEN`.

Each becomes the chain `passes/fuse_attention.py` matches, so a target that fuses attention
(cuda) gets one FusedAttention node, and every other target computes the chain as it is:

    MatMul(Q, Transpose(K)) -> Mul(scale) -> [Where(drop, -inf, .)] -> [Add(mask)]
        -> Softmax(-1) -> MatMul(., V)

with `drop` the causal mask (`is_causal`: a query sees the keys up to its own position,
counted from the top left, as torch's `is_causal` is; a constant, or computed from the
lengths where they are symbolic) or the negation of a boolean mask, and `mask` a float mask
(cast to the queries' dtype). K and V with fewer heads than Q (grouped query attention) are
repeated head by head as `repeat_interleave` does. Taken only in inference (`dropout_p` 0)
and where nothing reads an output but the attention (the log-sum-exp and RNG state that
backward needs: then the op stays in torch). A row whose every key is masked gives NaN, as
Softmax does (torch's math path gives 0 there).

This module never walks a graph and never compiles; it imports torch (an optional
dependency: only `torch_fx.py` imports this module).
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch
import torch.fx as fx

from ..errors import ShapeError
from ..ir import types as T
from ..ir.graph import Value
from .torch_aten import ATEN, Converter, arg, tensor

__all__ = ["ATTENTION"]


class _Args:
    """Where an attention overload keeps its arguments: positions (None: it has none) and
    the mask's keyword name."""

    def __init__(self, mask: int | None, dropout: int, causal: int, mask_name="attn_bias"):
        self.mask, self.dropout, self.causal, self.mask_name = mask, dropout, causal, mask_name

    def read(self, node: fx.Node):
        mask = arg(node, self.mask, self.mask_name) if self.mask is not None else \
            node.kwargs.get(self.mask_name)
        return (mask, arg(node, self.dropout, "dropout_p", 0.0),
                bool(arg(node, self.causal, "is_causal", False)), node.kwargs.get("scale"))


ATTENTION = {
    "scaled_dot_product_attention.default": _Args(3, 4, 5, "attn_mask"),
    "_scaled_dot_product_efficient_attention.default": _Args(3, 5, 6),
    "_scaled_dot_product_flash_attention.default": _Args(None, 3, 4),
    "_scaled_dot_product_cudnn_attention.default": _Args(3, 5, 6),
    "_scaled_dot_product_flash_attention_for_cpu.default": _Args(None, 3, 4, "attn_mask"),
}
"""The ATen attention overloads dnnc imports, and where each keeps its arguments."""


def _dims(t: torch.Tensor) -> tuple:
    """A fake tensor's shape with symbols as their names (compared without guards)."""
    return tuple(d if isinstance(d, int) else str(d.node.expr) for d in t.shape)


def _accepts(args: _Args):
    def accepts(node: fx.Node) -> bool:
        mask, dropout, causal, _ = args.read(node)
        if dropout != 0 or isinstance(node.meta["val"], tuple) and any(
                u.target is not operator.getitem or u.args[1] != 0 and u.users
                for u in node.users):
            return False
        q, k, v = (a.meta["val"] for a in node.args[:3])
        if not (q.dim() == k.dim() == v.dim() >= 2) or \
                _dims(k)[:-2] != _dims(v)[:-2] or not _heads_match(_dims(q), _dims(k)):
            return False
        return mask is None or isinstance(mask, fx.Node)
    return accepts


def _heads_match(q: tuple, k: tuple) -> bool:
    """K's batch dims are Q's, or Q's but for fewer heads dividing Q's (grouped queries)."""
    if k[:-2] == q[:-2]:
        return True
    return len(q) >= 3 and k[:-3] == q[:-3] and all(
        isinstance(d, int) for d in (q[-3], k[-3])) and q[-3] % k[-3] == 0


def _convert(args: _Args):
    def convert(ctx, node: fx.Node):
        mask, _, causal, scale = args.read(node)
        q, k, v = (ctx.value(a) for a in node.args[:3])
        dtype = q.type.dtype.np
        k, v = _repeat_heads(ctx, k, q), _repeat_heads(ctx, v, q)
        rank = q.type.rank
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        scores = ctx.add("MatMul", q, ctx.add("Transpose", k, perm=perm))
        depth = q.type.shape[-1]
        if scale is None and not isinstance(depth, int):   # 1 / sqrt(E), computed
            size = ctx.add("Shape", q, start=rank - 1, end=rank)
            factor = ctx.add("Reciprocal", ctx.add("Sqrt", ctx.add(
                "Cast", size, to=T.DType.from_numpy(dtype))))
        else:
            factor = ctx.const(np.array(1 / math.sqrt(depth) if scale is None else scale,
                                        dtype))
        scores = ctx.add("Mul", scores, factor)
        ninf = ctx.const(np.array(-np.inf, dtype))
        if causal:
            scores = ctx.add("Where", _later_keys(ctx, q, k), ninf, scores)
        if mask is not None:
            mask = ctx.value(mask)
            if mask.type.dtype is T.bool_:   # True: attend
                scores = ctx.add("Where", ctx.add("Not", mask), ninf, scores)
            else:
                scores = ctx.add("Add", scores, tensor(ctx, mask, dtype))
        out = ctx.add("MatMul", ctx.add("Softmax", scores, axis=-1), v)
        val = node.meta["val"]
        return [out] + [None] * (len(val) - 1) if isinstance(val, tuple) else out
    return convert


def _later_keys(ctx, q: Value, k: Value) -> Value:
    """The [L, S] boolean mask of the keys after each query (torch's top-left causal mask):
    a constant for static lengths, else Range(S) > Range(L)ᵀ over the inputs' dims."""
    sq, sk = q.type.shape[-2], k.type.shape[-2]
    if isinstance(sq, int) and isinstance(sk, int):
        return ctx.const(np.triu(np.ones((sq, sk), np.bool_), k=1))
    zero, one = ctx.const(np.array(0, np.int64)), ctx.const(np.array(1, np.int64))
    rows, cols = (ctx.add("Range", zero, _length(ctx, x), one) for x in (q, k))
    return ctx.add("Greater", ctx.add("Unsqueeze", cols, ctx.const(np.array([0], np.int64))),
                   ctx.add("Unsqueeze", rows, ctx.const(np.array([1], np.int64))))


def _length(ctx, x: Value) -> Value:
    """The length of `x`'s second-last axis as a 0-d int64 value."""
    rank = x.type.rank
    return ctx.add("Squeeze", ctx.add("Shape", x, start=rank - 2, end=rank - 1),
                   ctx.const(np.array([0], np.int64)))


def _repeat_heads(ctx, x: Value, q: Value) -> Value:
    """K or V with Q's heads: each of its heads `group` times in a row (repeat_interleave
    on the heads' axis), where it has fewer."""
    hq, hk = q.type.shape[-3:-2] or (None,), x.type.shape[-3:-2] or (None,)
    if x.type.shape[:-2] == q.type.shape[:-2] or hq == hk:
        return x
    group, rank = hq[0] // hk[0], x.type.rank
    ones = np.ones(rank + 1, np.int64)
    ones[rank - 2] = group
    spread = ctx.add("Expand", ctx.add("Unsqueeze", x, ctx.const(np.array([rank - 2],
                                                                           np.int64))),
                     ctx.const(ones))   # [.., H, group, S, E]
    shape = [0] * (rank - 3) + [hq[0], -1, x.type.shape[-1]]
    if not isinstance(shape[-1], int):
        raise ShapeError("grouped-query attention with a symbolic head size")
    return ctx.add("Reshape", spread, ctx.const(np.array(shape, np.int64)))


for _name, _args in ATTENTION.items():
    ATEN[f"aten.{_name}"] = Converter(_convert(_args), _accepts(_args))
