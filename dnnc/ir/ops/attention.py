"""Attention ops: Attention (scaled dot-product attention with masks, KV cache, GQA, softcap,
sliding windows), RotaryEmbedding, and the SwiGLU gate of transformer MLPs.

RotaryEmbedding and SwiGLU compute float16 and bfloat16 inputs in float32 and cast back;
Attention computes in its input type, step by step as its ONNX function body (see there).
Attention follows ONNX opset 25: the causal and window masks are bottom-right aligned (a query's absolute position is its index plus the count of keys
before its block), and a query row with no attendable key gives zeros, never NaN.
This module holds op meanings only; it never reads ONNX (importers translate older opsets).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..types import TensorType, dim_add, dim_div, dim_mul
from .infer import check_dtype, check_same_dtype
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


register_op("Attention", pattern=Pattern.OPAQUE, infer=_attention_infer, evaluate=attention,
            inputs=(3, 7), outputs=(1, 4),
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


register_op("RotaryEmbedding", pattern=Pattern.OPAQUE, infer=_rotary_infer,
            evaluate=rotary_embedding, inputs=(3, 4),
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


register_op("SwiGLU", pattern=Pattern.ELEMWISE, infer=_swiglu_infer, evaluate=swiglu,
            inputs=2, attrs={"alpha": 1.0})
