"""Internal fused ops: what a pass makes of a chain of registered ops, so that a target's
template computes the chain in one kernel. Frontends never produce them and they have no ONNX
form (`export_onnx` refuses them: export a graph before passes).

FusedAttention(Q, K, V, mask?, drop?) is the scaled dot-product attention chain as
exporters write it (`passes/fuse_attention.py` recognises it):

    MatMul(Q, Kᵀ) -> Mul by `scale` -> Where(drop, fill, .) (optional: torch's masked_fill,
        GPT-2's causal mask) -> Add mask (optional) -> Softmax(axis=-1) -> MatMul(., V)

Q is [*batch, Sq, D], K is [*batch, Sk, D] (`k_transposed`=1: the MatMul's own operand,
[*batch, D, Sk]), V [*batch, Sk, Dv]; the additive mask (Q's type) and the boolean `drop`
(a score where it is true becomes `fill`) broadcast to the scores [*batch, Sq, Sk] without
growing them; the output is [*batch, Sq, Dv]. The batch dims of Q, K and V are equal
(no broadcasting among them). The reference and the compute rule are the chain's own ops',
step by step (the registry's MatMul and Softmax), so the fused node means exactly what the
nodes it replaces meant, a row whose scores are all -inf included (NaN, as Softmax gives).
"""

from __future__ import annotations

import numpy as np

from .. import batching
from .. import types as T
from ..compute import apply_rule, broadcast_load, compute
from ..flops import Count, has_input, numel
from ..loop import Select, const
from .infer import check_dtype, check_same_dtype
from .registry import REQUIRED, Pattern, get_op, register_op

FLOATS = T.FLOAT_DTYPES


def _known_mismatch(a, b) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _attention_infer(ctx):
    for i, what in ((0, "Q"), (1, "K"), (2, "V"), (3, "mask")):
        check_dtype(ctx, i, FLOATS, what)
    check_dtype(ctx, 4, (T.bool_,), "drop")
    check_same_dtype(ctx, 0, 1, 2, 3)
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if len(q) < 2 or len(k) != len(q) or len(v) != len(q):
        raise ctx.fail(f"Q, K and V must have one rank of at least 2, given {ctx.type(0)}, "
                       f"{ctx.type(1)}, {ctx.type(2)}")
    batch = q[:-2]
    if any(_known_mismatch(a, b) for x in (k, v) for a, b in zip(batch, x[:-2])):
        raise ctx.fail(f"Q, K and V must have the same batch dims, given {ctx.type(0)}, "
                       f"{ctx.type(1)}, {ctx.type(2)}")
    sk, d = (k[-1], k[-2]) if ctx.attrs["k_transposed"] else (k[-2], k[-1])
    if _known_mismatch(q[-1], d):
        raise ctx.fail(f"Q's head size {q[-1]} differs from K's {d}")
    if _known_mismatch(sk, v[-2]):
        raise ctx.fail(f"K has {sk} keys, V has {v[-2]}")
    scores = tuple(batch) + (q[-2], sk)
    for i, what in ((3, "mask"), (4, "drop")):
        if not ctx.has(i):
            continue
        try:
            grown = T.broadcast_shapes(scores, ctx.shape(i))
        except ValueError:
            grown = None
        if grown is None or len(grown) != len(scores) or \
                any(_known_mismatch(a, b) for a, b in zip(grown, scores)):
            raise ctx.fail(f"the {what} {ctx.type(i)} must broadcast to the scores "
                           f"{T.TensorType(ctx.dtype(0), scores)} without growing them")
    return [T.TensorType(ctx.dtype(0), tuple(batch) + (q[-2], v[-1]))]


def fused_attention(q, k, v, mask=None, drop=None, *, scale, k_transposed, fill):
    """The chain's references, in order."""
    matmul, softmax = get_op("MatMul"), get_op("Softmax")
    kt = k if k_transposed else np.swapaxes(k, -1, -2)
    scores = matmul.run([q, kt], {})[0] * q.dtype.type(scale)
    if drop is not None:
        scores = np.where(drop, q.dtype.type(fill), scores)
    if mask is not None:
        scores = scores + mask
    probs = softmax.run([scores], {"axis": -1, "coerce_2d": 0})[0]
    return matmul.run([probs, v], {})[0]


def _attention_rule(inputs, outputs, *, scale, k_transposed, fill):
    """The chain's compute rules: MatMul's, a stage scaling and masking its product (inlined
    into Softmax's stages), Softmax's, MatMul's."""
    q, k, v, mask, drop = (list(inputs) + [None, None])[:5]
    out = outputs[0]
    if not k_transposed:
        k = compute(tuple(k.shape[:-2]) + (k.shape[-1], k.shape[-2]),
                    lambda *i: k[tuple(i[:-2]) + (i[-1], i[-2])], "attention_kt", k.dtype)
    # the scores' type, its dims as index expressions (compute rules take either)
    scores_type = T.TensorType(out.dtype, tuple(q.shape[:-1]) + (v.shape[-2],))
    (product,) = apply_rule("MatMul", [q, k], {}, [scores_type])

    def scaled(*i):
        x = product[i] * const(scale, out.dtype)
        if drop is not None:
            x = Select(broadcast_load(drop, i), const(fill, out.dtype), x)
        return x + broadcast_load(mask, i) if mask is not None else x

    logits = compute(tuple(product.shape), scaled, "attention_logits", out.dtype)
    (probs,) = apply_rule("Softmax", [logits], {"axis": -1, "coerce_2d": 0}, [scores_type])
    return apply_rule("MatMul", [probs, v], {}, [out])


def _attention_flops(node) -> Count:
    """As the chain it replaces: two products, a multiply per score, an add per score with a
    mask, one with a Where, Softmax's 5 a score."""
    q, v = node.inputs[0], node.inputs[2]
    scores = Count.of(list(q.shape[:-1]) + [v.shape[-2]])
    per_score = 6 + (1 if has_input(node, 3) else 0) + (1 if has_input(node, 4) else 0)
    return 2 * scores * Count.of([q.shape[-1]]) + 2 * numel(node.outputs[0]) * \
        Count.of([v.shape[-2]]) + per_score * scores


register_op("FusedAttention", pattern=Pattern.OUT_FUSABLE, infer=_attention_infer,
            evaluate=fused_attention,
            attrs={"scale": REQUIRED, "k_transposed": 0, "fill": float("-inf")},
            inputs=(3, 5), compute=_attention_rule, flops=_attention_flops,
            batched=batching.attention)
