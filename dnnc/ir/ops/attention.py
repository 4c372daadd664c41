"""Attention ops: Attention (scaled dot-product attention with masks, KV cache, GQA, softcap,
sliding windows), RotaryEmbedding, and the SwiGLU gate of transformer MLPs.

RotaryEmbedding and SwiGLU compute float16 and bfloat16 inputs in float32 and cast back;
Attention computes in its input type, step by step as its ONNX function body (see there).
Compute rules follow the references step for step and in the same types: Attention as stages
(QK^T scores, the softmax's row max and row sum, the probabilities, the weighted sum over
keys), the mask and the KV-cache concatenation as index expressions read inside them.
Attention follows ONNX opset 25: the causal and window masks are bottom-right aligned (a query's absolute position is its index plus the count of keys
before its block), and a query row with no attendable key gives zeros, never NaN.
This module holds op meanings only; it never reads ONNX (importers translate older opsets).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..compute import Tensor, broadcast_load, compute, reduce_axis, reduce_max, reduce_sum
from ..loop import Cast, Const, Expr, Select, call, const, eq, logical_and, maximum, minimum
from ..types import TensorType, dim_add, dim_div, dim_mul
from .elementwise import elementwise_rule
from .index_exprs import add, clamp_index, sub
from .infer import check_dtype, check_same_dtype
from .linalg import acc_dtype, widen
from .reduce import stage_name
from ..flops import Count
from .registry import Pattern, register_op

FLOATS = T.FLOAT_DTYPES
MASK_DTYPES = (T.bool_,) + T.FLOAT_DTYPES + T.INT_DTYPES


def _wide(dtype: np.dtype):
    """The type a reference computes in: float64 stays, other floats go float32."""
    return np.float64 if dtype == np.float64 else np.float32


def _known_mismatch(a, b) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


# -- Attention -------------------------------------------------------------------------------


def _split_heads_dim(ctx, hidden, heads: int, what: str):
    """Per-head size of a 3-D input's hidden dim `hidden` split into `heads` heads."""
    if heads <= 0:
        raise ctx.fail(f"{what} head count must be positive, given {heads}")
    if isinstance(hidden, int) and hidden % heads:
        raise ctx.fail(f"{what} hidden size {hidden} is not divisible by {heads} heads")
    return dim_div(hidden, heads)


def _attention_infer(ctx):
    a = ctx.attrs
    for i, what in ((0, "Q"), (1, "K"), (2, "V"), (4, "past_key"), (5, "past_value")):
        check_dtype(ctx, i, FLOATS, what)
    check_same_dtype(ctx, 0, 1, 4)
    check_same_dtype(ctx, 2, 5)
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    rank = len(q)
    if rank not in (3, 4) or len(k) != rank or len(v) != rank:
        raise ctx.fail(f"Q, K and V must all be 3-D or all 4-D, given {ctx.type(0)}, "
                       f"{ctx.type(1)}, {ctx.type(2)}")
    q_heads, kv_heads = a["q_num_heads"], a["kv_num_heads"]
    if rank == 3:
        if q_heads is None or kv_heads is None:
            raise ctx.fail("3-D Q, K and V need the q_num_heads and kv_num_heads attributes")
        batch, q_len = q[0], q[1]
        head = _split_heads_dim(ctx, q[2], q_heads, "Q")
        kv_len = k[1]
        k_head = _split_heads_dim(ctx, k[2], kv_heads, "K")
        v_head = _split_heads_dim(ctx, v[2], kv_heads, "V")
    else:
        if q_heads is not None or kv_heads is not None:
            raise ctx.fail("q_num_heads and kv_num_heads are only valid for 3-D inputs")
        batch, q_heads, q_len, head = q
        kv_heads, kv_len, k_head = k[1], k[2], k[3]
        v_head = v[3]
        if _known_mismatch(v[1], kv_heads) or _known_mismatch(v[2], kv_len):
            raise ctx.fail(f"K {ctx.type(1)} and V {ctx.type(2)} disagree on heads or length")
    if _known_mismatch(head, k_head):
        raise ctx.fail(f"Q and K head sizes differ ({head} and {k_head})")
    if isinstance(q_heads, int) and isinstance(kv_heads, int) and q_heads % kv_heads:
        raise ctx.fail(f"q_num_heads {q_heads} is not a multiple of kv_num_heads {kv_heads}")

    past_len = 0
    if ctx.has(4) != ctx.has(5):
        raise ctx.fail("past_key and past_value must be given together")
    if ctx.has(4):
        pk, pv = ctx.shape(4), ctx.shape(5)
        if len(pk) != 4 or len(pv) != 4:
            raise ctx.fail(f"past_key and past_value must be 4-D, given {ctx.type(4)}, "
                           f"{ctx.type(5)}")
        if _known_mismatch(pk[3], head) or _known_mismatch(pv[3], v_head) or \
                _known_mismatch(pk[2], pv[2]):
            raise ctx.fail(f"past_key {ctx.type(4)} and past_value {ctx.type(5)} do not fit "
                           f"K and V")
        past_len = pk[2]
    if ctx.has(6):
        if ctx.has(4):
            raise ctx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        check_dtype(ctx, 6, (T.int64,), "nonpad_kv_seqlen")
        if ctx.type(6).rank != 1:
            raise ctx.fail(f"nonpad_kv_seqlen must be 1-D, given {ctx.type(6)}")
    total = dim_add(past_len, kv_len)

    if ctx.has(3):
        check_dtype(ctx, 3, MASK_DTYPES, "attn_mask")
        mask = ctx.shape(3)
        if not 1 <= len(mask) <= 4:
            raise ctx.fail(f"attn_mask must have rank 1 to 4, given {ctx.type(3)}")
        if isinstance(mask[-1], int) and isinstance(total, int) and mask[-1] > total:
            raise ctx.fail(f"attn_mask {ctx.type(3)} is longer than the {total} keys")
        try:
            T.broadcast_shapes(mask[:-1], (batch, q_heads, q_len)[4 - len(mask):])
        except ValueError:
            raise ctx.fail(f"attn_mask {ctx.type(3)} does not broadcast to "
                           f"[{batch},{q_heads},{q_len},{total}]") from None
    if a["qk_matmul_output_mode"] not in (0, 1, 2, 3):
        raise ctx.fail(f"qk_matmul_output_mode must be 0 to 3, given "
                       f"{a['qk_matmul_output_mode']}")
    for key in ("left_window_size", "right_window_size"):
        if a[key] < -1:
            raise ctx.fail(f"{key} must be -1 or nonnegative, given {a[key]}")
    precision = a["softmax_precision"]
    if precision is not None and precision not in FLOATS:
        raise ctx.fail(f"softmax_precision must be a float type, given {precision!r}")

    t1, t2 = ctx.dtype(0), ctx.dtype(2)
    y_shape = (batch, q_len, dim_mul(q_heads, v_head)) if rank == 3 else \
        (batch, q_heads, q_len, v_head)
    return [TensorType(t1, y_shape),
            TensorType(t1, (batch, kv_heads, total, head)),
            TensorType(t2, (batch, kv_heads, total, v_head)),
            TensorType(t1, (batch, q_heads, q_len, total))]


def _to_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _masked_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row whose logits are all -inf gives zeros, not NaN."""
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isneginf(top), 0, top)
    e = np.exp(x - top)
    total = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(total == 0, 1, total)


def _attention_bias(attn_mask, nonpad_kv_seqlen, q_len: int, total: int, past_len: int | None,
                    is_causal, left: int, right: int, dtype) -> np.ndarray:
    """Additive bias (0 or -inf, plus a float mask) of shape (..., q_len, total)."""
    bias = np.zeros((q_len, total), dtype)
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            mask = np.where(attn_mask, 0, -np.inf).astype(dtype)
        else:
            mask = attn_mask.astype(dtype)
        pad = total - mask.shape[-1]  # a short mask is padded with "not attended"
        mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=-np.inf)
        bias = bias + mask
    # a query's absolute position: its index plus the keys before its block (bottom-right)
    query = np.arange(q_len).reshape(q_len, 1)
    if past_len is not None:
        query = query + past_len
    elif nonpad_kv_seqlen is not None:
        query = query + (nonpad_kv_seqlen.reshape(-1, 1, 1, 1) - q_len)
    key = np.arange(total)
    allowed = np.ones(np.broadcast_shapes(query.shape, key.shape), dtype=bool)
    if is_causal:
        allowed &= key <= query
    if left >= 0:
        allowed &= key >= query - left
    if right >= 0:
        allowed &= key <= query + right
    if nonpad_kv_seqlen is not None:
        allowed = allowed & (key < nonpad_kv_seqlen.reshape(-1, 1, 1, 1))
    return bias + np.where(allowed, 0, -np.inf).astype(dtype)


def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
              *, scale=None, is_causal=0, q_num_heads=None, kv_num_heads=None,
              softmax_precision=None, softcap=0.0, qk_matmul_output_mode=0,
              left_window_size=-1, right_window_size=-1):
    # Unlike other families, every step runs in T1 itself (float16 and bfloat16 included), as
    # the ONNX function body does: the node suite's half-precision outputs come from NumPy half
    # arithmetic (the softmax's sum accumulates in bfloat16), which float32 misses by an ulp.
    t1, t2 = q.dtype, v.dtype
    rank3 = q.ndim == 3
    if rank3:
        q, k, v = _to_heads(q, q_num_heads), _to_heads(k, kv_num_heads), _to_heads(v, kv_num_heads)
    if past_key is not None:
        k = np.concatenate([past_key, k], axis=2)
        v = np.concatenate([past_value, v], axis=2)
    present_key, present_value = k.astype(t1), v.astype(t2)
    batch, heads, q_len, head_size = q.shape
    total = k.shape[2]
    bias = _attention_bias(attn_mask, nonpad_kv_seqlen, q_len, total,
                           None if past_key is None else past_key.shape[2],
                           is_causal, left_window_size, right_window_size, t1)

    # Q and K are each scaled by sqrt(scale), which keeps QK^T in range
    root = np.asarray(np.sqrt(1 / np.sqrt(head_size) if scale is None else scale), t1)
    group = heads // k.shape[1]  # grouped-query attention: each KV head serves `group` heads
    keys = np.repeat(present_key, group, axis=1) * root
    values = np.repeat(v.astype(t1), group, axis=1)
    raw = ((q * root) @ np.swapaxes(keys, -1, -2)).astype(t1)  # bfloat16 @ gives float32
    capped = (softcap * np.tanh(raw / softcap)).astype(t1) if softcap > 0 else raw
    logits = capped + bias
    sp = t1 if softmax_precision is None else softmax_precision.np
    probs = _masked_softmax(logits.astype(sp))
    # a row with no attendable key is zero (decided on the bias: its logits may be NaN)
    probs = np.where(np.isneginf(np.max(bias, axis=-1, keepdims=True)), 0, probs).astype(t1)
    y = probs @ values
    if rank3:
        y = y.transpose(0, 2, 1, 3).reshape(batch, q_len, -1)
    qk = (raw, capped, logits, probs)[qk_matmul_output_mode]
    return y.astype(t1), present_key, present_value, qk.astype(t1)


# The rule's stages, each as the reference computes it and in its types (T1 throughout, a
# 16-bit T1's dot products summed in float32 and rounded once, as NumPy's matmul does):
#   scores[b, h, i, j] = sum_d (Q * root)[.., i, d] * (K * root)[.., j, d]   (reduce, kept)
#   logits = softcap(scores) + bias          bias: mask, causal, windows, padding (0 or -inf)
#   top, total: the softmax's row max and row sum of exp(logits - top)       (reduce, kept)
#   probs = exp(logits - top) / total, 0 in a row with no attendable key    (kept, see below)
#   Y[b, h, i, e] = sum_j probs[.., i, j] * V[.., j, e]                      (reduce)
# present_key/value are [past, new] along the sequence: a Select on the key index, both loads
# clamped in bounds (a Select evaluates both arms on CPUs).


_BF16_CHAIN = 64
"""The longest softmax row summed in bfloat16 like the reference (see `_attention_rule`)."""


def _div(e: Expr, n) -> Expr:
    """e // n for a size expression, folded when both are constants."""
    n = const(n)
    if isinstance(e, Const) and isinstance(n, Const):
        return const(e.value // n.value)
    return e if n == const(1) else e // n


def _head_reader(x: Tensor, heads):
    """x read as (batch, heads, seq, size): a 3-D x's hidden axis split into `heads` heads."""
    if x.ndim == 4:
        return lambda b, h, s, d: x[b, h, s, d]
    size = _div(x.shape[2], heads)
    return lambda b, h, s, d: x[b, s, h * size + d]


def _kv_cache(cur: Tensor, past: Tensor | None, heads, name: str, dtype: T.DType):
    """present = [past, cur] along the sequence, as a (batch, heads, total, size) tensor."""
    read = _head_reader(cur, heads)
    length = cur.shape[1] if cur.ndim == 3 else cur.shape[2]
    size = _div(cur.shape[2], heads) if cur.ndim == 3 else cur.shape[3]
    batch, heads = cur.shape[0], const(heads) if cur.ndim == 3 else cur.shape[1]
    if past is None or past.shape[2] == const(0):
        return compute((batch, heads, length, size), read, name=stage_name(name), dtype=dtype)
    p = past.shape[2]

    def element(b, h, j, d):
        old = past[b, h, minimum(j, sub(p, 1)), d]
        new = read(b, h, maximum(sub(j, p), 0), d)
        return Select(j < p, old, new)

    return compute((batch, heads, add(p, length), size), element, name=stage_name(name),
                   dtype=dtype)


def _bias_expr(mask, nonpad, past_len, q_len, total, is_causal, left, right, dtype):
    """`bias(b, h, i, j)`, the additive mask of `_attention_bias` as an expression (None when
    every key is attended)."""
    neg_inf = const(-np.inf, dtype)
    if mask is None and nonpad is None and not is_causal and left < 0 and right < 0:
        return None

    def bias(b, h, i, j):
        # a query's absolute position: its index plus the keys before its block
        pos = add(i, past_len)
        seen = None
        if nonpad is not None:
            seen = broadcast_load(nonpad, (b,))
            pos = i + (seen - q_len)
        allowed = []
        if is_causal:
            allowed.append(j <= pos)
        if left >= 0:
            allowed.append(j >= pos - left)
        if right >= 0:
            allowed.append(j <= pos + right)
        if seen is not None:
            allowed.append(j < seen)
        term = Select(logical_and(*allowed), const(0.0, dtype), neg_inf) if allowed else None
        if mask is None:
            return term
        length = mask.shape[-1]
        short = length != total  # a short mask is padded with "not attended"
        jm = minimum(j, sub(length, 1)) if short else j
        m = broadcast_load(mask, (b, h, i, jm))
        m = Select(m, const(0.0, dtype), neg_inf) if m.dtype is T.bool_ else \
            (m if m.dtype is dtype else Cast(dtype, m))
        if short:
            m = Select(j < length, m, neg_inf)
        return m if term is None else m + term

    return bias


def _kept(shape, fn, name: str, dtype: T.DType) -> Tensor:
    """A stage without a reduction that lowering should still keep in a buffer: it inlines
    such stages into their readers, which would recompute the probabilities' exp once per
    element of V's head. A sum over one element (exact) marks it as a reduction."""
    one = reduce_axis(1, "one")
    return compute(shape, lambda *i: reduce_sum(fn(*i), one), name=stage_name(name),
                   dtype=dtype)


def _softmax_stages(logits, bias, rows, sp: T.DType, t1: T.DType) -> Tensor:
    """`_masked_softmax` of `logits(b, h, i, j)` over j in type `sp`, as T1 probabilities: the
    row max, the row sum of exp(logits - max), then exp(logits - max) / sum, zero in the rows
    whose `bias` (when given) is all -inf."""
    batch, heads, q_len, total = rows
    stat = (batch, heads, q_len, const(1))

    def top_of(b, h, i, _):
        j = reduce_axis(total, "j")
        return reduce_max(widen(sp, logits(b, h, i, j.var)), j)

    top = compute(stat, top_of, name=stage_name("attn_max"))

    def exp_of(b, h, i, j):
        t = top[b, h, i, 0]  # a row of -inf logits is shifted by 0: its exps are 0, not NaN
        shift = Select(logical_and(call("isinf", t), t < 0), const(0.0, sp), t)
        return call("exp", widen(sp, logits(b, h, i, j)) - shift)

    def total_of(b, h, i, _):
        j = reduce_axis(total, "j")
        return reduce_sum(exp_of(b, h, i, j.var), j)

    def chained_total_of(b, h, i, _):
        row = exp_of(b, h, i, const(0))
        for j in range(1, total.value):
            row = row + exp_of(b, h, i, const(j))
        return row

    # NumPy sums a bfloat16 row one element at a time in bfloat16 (ml_dtypes has no wider
    # accumulator), while a Reduce accumulates 16-bit floats in float32; the node suite checks
    # bfloat16 to rtol 1e-3, under one ulp, so a short static row is summed as a chain of
    # bfloat16 adds. Longer rows sum in float32, more accurately than the reference.
    if sp is T.bfloat16 and isinstance(total, Const) and 0 < total.value <= _BF16_CHAIN:
        row_sum = _kept(stat, chained_total_of, "attn_sum", sp)
    else:
        row_sum = compute(stat, total_of, name=stage_name("attn_sum"))
    dead = None
    if bias is not None:
        # a row with no attendable key is zero, decided on the bias (its logits may be NaN)
        def bias_max(b, h, i, _):
            j = reduce_axis(total, "j")
            return reduce_max(bias(b, h, i, j.var), j)

        dead = compute(stat, bias_max, name=stage_name("attn_bias_max"))

    def prob(b, h, i, j):
        t = row_sum[b, h, i, 0]
        p = exp_of(b, h, i, j) / Select(eq(t, 0), const(1.0, sp), t)
        if dead is not None:
            m = dead[b, h, i, 0]
            p = Select(logical_and(call("isinf", m), m < 0), const(0.0, sp), p)
        return p

    return _kept(rows, prob, "attn_probs", t1)


def _attention_rule(inputs, outputs, *, scale, is_causal, q_num_heads, kv_num_heads,
                    softmax_precision, softcap, qk_matmul_output_mode, left_window_size,
                    right_window_size):
    q, k, v, mask, past_key, past_value, nonpad = (list(inputs) + [None] * 7)[:7]
    t1, t2 = q.dtype, v.dtype
    acc = acc_dtype(t1)
    rank3 = q.ndim == 3
    batch = q.shape[0]
    heads = const(q_num_heads) if rank3 else q.shape[1]
    q_len = q.shape[1] if rank3 else q.shape[2]
    head_size = _div(q.shape[2], q_num_heads) if rank3 else q.shape[3]
    read_q = _head_reader(q, q_num_heads)
    keys = _kv_cache(k, past_key, kv_num_heads, "attn_present_key", t1)
    values = _kv_cache(v, past_value, kv_num_heads, "attn_present_value", t2)
    kv_heads, total = keys.shape[1], keys.shape[2]
    group = _div(heads, kv_heads)
    past_len = const(0) if past_key is None else past_key.shape[2]

    # Q and K are each scaled by sqrt(scale), rounded to T1 as the reference does
    if scale is not None or isinstance(head_size, Const):
        s = 1 / np.sqrt(head_size.value) if scale is None else scale
        root = const(float(np.asarray(np.sqrt(s), t1.np)), t1)
    else:  # a symbolic head size: the same float64 arithmetic, at run time
        inverse = const(1.0, T.float64) / call("sqrt", Cast(T.float64, head_size))
        root = Cast(t1, call("sqrt", inverse))

    def score(b, h, i, j):
        d = reduce_axis(head_size, "d")
        qd = read_q(b, h, i, d.var) * root
        kd = keys[b, _div(h, group), j, d.var] * root
        return reduce_sum(widen(acc, qd) * widen(acc, kd), d)

    rows = (batch, heads, q_len, total)
    scores = compute(rows, score, name=stage_name("attn_scores"), dtype=t1)
    bias = _bias_expr(mask, nonpad, past_len, q_len, total, is_causal, left_window_size,
                      right_window_size, t1)

    def capped(*i):
        if softcap <= 0:
            return scores[i]
        return softcap * call("tanh", scores[i] / softcap)

    def logits(*i):
        return capped(*i) if bias is None else capped(*i) + bias(*i)

    sp = t1 if softmax_precision is None else softmax_precision
    # causal masking alone always leaves key 0 to a query; the other masks can leave none
    may_be_empty = mask is not None or nonpad is not None or left_window_size >= 0 or \
        right_window_size >= 0
    probs = _softmax_stages(logits, bias if may_be_empty else None, rows, sp, t1)

    def weighted(b, h, i, e):
        j = reduce_axis(total, "j")
        ve = widen(t1, values[b, _div(h, group), j.var, e])
        return reduce_sum(widen(acc, probs[b, h, i, j.var]) * widen(acc, ve), j)

    y_type = outputs[0]
    if rank3:
        v_size = values.shape[3]
        y = compute(y_type.shape, lambda b, i, c: weighted(b, _div(c, v_size), i, c % v_size),
                    name=stage_name("attention"), dtype=t1)
    else:
        y = compute(y_type.shape, weighted, name=stage_name("attention"), dtype=t1)
    out = [y, keys, values]
    if len(outputs) > 3:
        mode = qk_matmul_output_mode
        out.append(scores if mode == 0 else probs if mode == 3 else
                   compute(rows, capped if mode == 1 else logits, name=stage_name("attn_qk"),
                           dtype=t1))
    return out[:len(outputs)]


def _attention_flops(node) -> Count:
    """Two batched matmuls and a softmax (5 per score) over the scores; 4-D Q, K, V only."""
    q, k, v = node.inputs[:3]
    if q.type.rank != 4:
        raise ValueError("3-D attention inputs")
    scores = Count.of(q.shape[:-1]) * Count.of([k.shape[-2]])
    return scores * (2 * Count.of([q.shape[-1]]) + 2 * Count.of([v.shape[-1]])) + 5 * scores


register_op("Attention", pattern=Pattern.OPAQUE, infer=_attention_infer, evaluate=attention,
            inputs=(3, 7), outputs=(1, 4), compute=_attention_rule, flops=_attention_flops,
            attrs={"scale": None, "is_causal": 0, "q_num_heads": None, "kv_num_heads": None,
                   "softmax_precision": None, "softcap": 0.0, "qk_matmul_output_mode": 0,
                   "left_window_size": -1, "right_window_size": -1})


# -- RotaryEmbedding -------------------------------------------------------------------------


def _rotary_infer(ctx):
    check_dtype(ctx, 0, FLOATS, "X")
    check_same_dtype(ctx, 0, 1, 2)
    x = ctx.shape(0)
    num_heads, rot = ctx.attrs["num_heads"], ctx.attrs["rotary_embedding_dim"]
    if len(x) == 4:
        batch, _, seq, head = x
    elif len(x) == 3:
        if num_heads <= 0:
            raise ctx.fail("3-D input needs the num_heads attribute")
        batch, seq = x[0], x[1]
        head = _split_heads_dim(ctx, x[2], num_heads, "X")
    else:
        raise ctx.fail(f"input must be 3-D or 4-D, given {ctx.type(0)}")
    if rot:
        if rot % 2 or (isinstance(head, int) and rot > head):
            raise ctx.fail(f"rotary_embedding_dim {rot} must be even and at most the head "
                           f"size {head}")
    elif isinstance(head, int) and head % 2:
        raise ctx.fail(f"head size {head} must be even")
    half = rot // 2 if rot else dim_div(head, 2)
    cache_rank = 2 if ctx.has(3) else 3
    for i in (1, 2):
        cache = ctx.shape(i)
        if len(cache) != cache_rank or _known_mismatch(cache[-1], half):
            raise ctx.fail(f"cache input {i} must be {cache_rank}-D with last dim {half}, "
                           f"given {ctx.type(i)}")
    if ctx.has(3):
        check_dtype(ctx, 3, (T.int64,), "position_ids")
        if ctx.type(3).rank != 2:
            raise ctx.fail(f"position_ids must be 2-D (batch, sequence), given {ctx.type(3)}")
    return [ctx.type(0)]


def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                     rotary_embedding_dim=0, num_heads=0):
    wide = _wide(x.dtype)
    if x.ndim == 4:  # (batch, heads, seq, head) -> (batch, seq, heads, head)
        h = x.transpose(0, 2, 1, 3)
    else:
        h = x.reshape(x.shape[0], x.shape[1], num_heads, -1)
    h = h.astype(wide)
    rot = rotary_embedding_dim or h.shape[-1]
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    cos = cos_cache.astype(wide)[:, :, None, :]
    sin = sin_cache.astype(wide)[:, :, None, :]
    part = h[..., :rot]
    if interleaved:  # pairs (x0, x1), (x2, x3), ...
        x1, x2 = part[..., 0::2], part[..., 1::2]
    else:  # pairs (x_i, x_{i + rot/2})
        x1, x2 = part[..., :rot // 2], part[..., rot // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = np.stack([real, imag], axis=-1).reshape(part.shape)
    else:
        rotated = np.concatenate([real, imag], axis=-1)
    out = np.concatenate([rotated, h[..., rot:]], axis=-1)
    out = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
    return out.astype(x.dtype)


def _rotary_rule(inputs, outputs, *, interleaved, rotary_embedding_dim, num_heads):
    """Each output element from its rotation pair, (x_k, x_{k + rot/2}) or, interleaved,
    (x_2k, x_2k+1), turned by angle k of its position's cache row; the first rot elements of
    a head rotate, the rest pass through. 16-bit floats in float32, as the reference."""
    x, cos_cache, sin_cache, position_ids = (list(inputs) + [None])[:4]
    out = outputs[0]
    wide = T.float64 if x.dtype is T.float64 else T.float32
    head = x.shape[3] if x.ndim == 4 else _div(x.shape[2], num_heads)
    rot = const(rotary_embedding_dim) if rotary_embedding_dim else head
    half = _div(rot, 2)
    partial = rot != head

    def cache(c: Tensor, b, s, k):
        if position_ids is None:
            return widen(wide, broadcast_load(c, (b, s, k)))
        pos = clamp_index(broadcast_load(position_ids, (b, s)), c.shape[0])
        return widen(wide, c[pos, k])

    def rotated(b, s, read, d):
        """Element d of the head that `read(e)` loads, at batch b and position s."""
        if interleaved:
            # past rot, k is clamped to stay in the caches; the value is not used there
            k = minimum(d // 2, sub(half, 1)) if partial else d // 2
            i1, i2, first = 2 * k, 2 * k + 1, eq(d % 2, 0)
        else:
            k = d % half
            i1, i2, first = k, add(k, half), d < half
        cos, sin = cache(cos_cache, b, s, k), cache(sin_cache, b, s, k)
        x1, x2 = widen(wide, read(i1)), widen(wide, read(i2))
        value = Select(first, cos * x1 - sin * x2, sin * x1 + cos * x2)
        return Select(d < rot, value, widen(wide, read(d))) if partial else value

    if x.ndim == 4:  # (batch, heads, seq, head)
        def element(b, h, s, d):
            return rotated(b, s, lambda e: x[b, h, s, e], d)
    else:  # (batch, seq, heads * head): element c is element c % head of head c // head
        def element(b, s, c):
            d = c % head
            return rotated(b, s, lambda e: x[b, s, c - d + e], d)

    return [compute(out.shape, element, name=stage_name("rotary"), dtype=out.dtype)]


register_op("RotaryEmbedding", pattern=Pattern.OPAQUE, infer=_rotary_infer,
            evaluate=rotary_embedding, inputs=(3, 4), compute=_rotary_rule,
            attrs={"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": 0})


# -- SwiGLU ----------------------------------------------------------------------------------


def _swiglu_infer(ctx):
    check_dtype(ctx, 0, FLOATS, "A")
    check_same_dtype(ctx, 0, 1)
    a, b = ctx.shape(0), ctx.shape(1)
    if len(a) != len(b) or any(_known_mismatch(x, y) for x, y in zip(a, b)):
        raise ctx.fail(f"A {ctx.type(0)} and B {ctx.type(1)} must have one shape "
                       f"(SwiGLU does not broadcast)")
    return [ctx.type(0)]


def swiglu(a, b, alpha=1.0):
    wide = _wide(a.dtype)
    gate = a.astype(wide)
    swish = gate / (1 + np.exp(-alpha * gate))
    return (swish * b.astype(wide)).astype(a.dtype)


def _swiglu_expr(a, b, alpha):
    wide = T.float64 if a.dtype is T.float64 else T.float32
    gate = widen(wide, a)
    swish = gate / (1 + call("exp", -alpha * gate))
    return swish * widen(wide, b)


register_op("SwiGLU", pattern=Pattern.ELEMWISE, infer=_swiglu_infer, evaluate=swiglu,
            inputs=2, attrs={"alpha": 1.0}, compute=elementwise_rule(_swiglu_expr))
