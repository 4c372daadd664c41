"""Op generators for layers with sparse constant weights, as pruned models hold them (issue 34):
MatMul, Dense (MatMul -> Add of a bias, as exporters write Linear), Gemm and Conv (1x1, 3x3,
grouped, depthwise, strided) whose weight has a drawn sparsity and pattern.

Sparsity is one of `SPARSITIES`, from dense (0) to all zeros (1); the pattern one of
`PATTERNS`: unstructured, N:M along the reduction (2:4, 1:4, 2:8), blocks of outputs by
reduction columns (4x1, 1x4, 8x1, 4x4), laid on the weight as `compiler/sparsify.py` reads it
(rows the outputs, columns the reduction, a Conv's input channels fastest); where the axes are
not multiples of the group or block, the pattern covers the largest part they hold and the rest
is unstructured (a kernel must handle the tail). A fifth of the new inputs hold NaNs
(`normal_nan`): NaN times zero is NaN, so a NaN reaches every output its row feeds, pruned
weights or not. A quarter of the weights also lose whole rows (outputs) or columns (inputs),
some zeros are -0.0, and the weight comes as an initializer, a Transpose of one (constant
folding makes it), an int8 weight behind a DequantizeLinear (weight-only quantization: its
zeros at the zero point) or a float16 one behind a Cast. Sizes reach past the small ones the
other generators draw (reductions of 16 to 128), so a compiler that weighs dense against sparse
templates has layers worth choosing for.

`gen_sparse24` draws layers that fit the sparse tensor cores exactly (issue 34's 2:4 on the
GPU): MatMul, Dense, Gemm or a 1x1 Conv of 16 to 64 outputs by a reduction of 32 to 128, every
group of 4 along it holding at most 2 nonzeros (2:4 or 1:4, some groups emptied), so that a
cuda compile at fp16 / bf16 (with DNNC_SPARSE24=1: the cost rule keeps such small layers
dense) runs them as Sparse24Dense.

These generators only write models; whether a layer runs sparse is the compiler's choice, and
the fuzzer checks whatever it chose. They never read a value downstream of a QuantizeLinear
(`Val.rounded`) and never one that may be huge (a sum of huge values overflows by order).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from ...compiler.sparsify import keep_mask, parse_pattern
from ..graph_builder import F32, Builder, Rejected, Val
from .layers import check_windows

SPARSITIES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.97, 1.0)
"""Fractions of zeros: dense, the issue's 30/70/90% points, 97% (a row of a few nonzeros or
none) and all zeros."""

PATTERNS = ("unstructured", "unstructured", "2:4", "1:4", "2:8", "4x1", "1x4", "8x1", "4x4")

REDUCTIONS = (16, 24, 32, 64, 128)
"""Reduction sizes of a sparse layer's own input: multiples of the groups and blocks, and the
sizes a sparse template's register blocks cover."""


def sparse_mask(g: Builder, rows: int, cols: int) -> np.ndarray:
    """Which entries of a (rows = outputs, cols = reduction) weight stay: a drawn pattern at a
    drawn sparsity, on the part of the matrix the pattern divides, unstructured on the rest;
    sometimes whole rows or columns zeroed too."""
    sparsity = g.choice(SPARSITIES)
    pattern = parse_pattern(g.choice(PATTERNS))
    if sparsity == 1.0:
        return np.zeros((rows, cols), bool)
    unit_rows, unit_cols = (1, pattern.group) if pattern.kind == "n_m" else \
        (pattern.rows, pattern.cols)
    main_rows, main_cols = rows - rows % unit_rows, cols - cols % unit_cols
    mask = keep_mask(g.rng.random((rows, cols)), parse_pattern("unstructured"), sparsity)
    if main_rows and main_cols and pattern.kind != "unstructured":
        implied = pattern.fixed_sparsity
        mask[:main_rows, :main_cols] = keep_mask(g.rng.random((main_rows, main_cols)), pattern,
                                                 sparsity if implied is None else implied)
    if g.chance(0.25):   # whole outputs pruned (channel pruning)
        mask[g.rng.random(rows) < 0.3] = False
    if g.chance(0.25):   # inputs no output reads
        mask[:, g.rng.random(cols) < 0.3] = False
    return mask


def _values(g: Builder, mask: np.ndarray, fan_in: int) -> np.ndarray:
    """Normal values where `mask` holds, zeros (some -0.0) elsewhere; outputs of about unit
    variance whatever the density."""
    kept = max(1.0, fan_in * float(mask.mean()) if mask.size else 1.0)
    w = g.rng.standard_normal(mask.shape) / math.sqrt(kept)
    zero = -0.0 if g.chance(0.1) else 0.0
    return np.where(mask, w, zero).astype(np.float32)


def sparse_weight(g: Builder, w: np.ndarray) -> Val:
    """`w` as a model holds a pruned weight: an initializer, a Transpose of one, an int8
    weight -> DequantizeLinear (per tensor, or per channel along axis 0) or float16 -> Cast."""
    how = g.choice(["initializer"] * 4 + ["transpose", "dequantize", "cast"])
    if how == "transpose" and w.ndim == 2:
        src = g.initializer(np.ascontiguousarray(w.T))
        return g.node("Transpose", [src], perm=[1, 0])[0]
    if how == "cast":
        return g.node("Cast", [g.initializer(w.astype(np.float16))], to=TensorProto.FLOAT)[0]
    if how == "dequantize":
        top = np.max(np.abs(w.reshape(w.shape[0], -1)), axis=1) if w.ndim == 4 else \
            np.max(np.abs(w), keepdims=True).reshape(())
        scale = (np.maximum(top, 1e-3) / 127).astype(np.float32)
        per = scale.reshape((-1,) + (1,) * (w.ndim - 1)) if w.ndim == 4 else scale
        q = np.clip(np.rint(w / per), -127, 127).astype(np.int8)
        params = [g.initializer(scale, "w_scale", exact=True)]
        if g.chance(0.5):
            params.append(g.initializer(np.zeros(scale.shape, np.int8), "w_zero_point",
                                        exact=True))
        dq = g.node("DequantizeLinear", [g.initializer(q, "w_quantized", exact=True)] + params,
                    **({"axis": 0} if w.ndim == 4 else {}))[0]
        g.values.remove(dq)   # a weight, not an activation other ops may read
        return dq
    return g.initializer(w)


def _input(g: Builder, rank_ok, fresh_shape) -> Val:
    """The layer's input: a value at hand (`rank_ok`), or in half the small cases a new input
    of `fresh_shape()` (reductions the other generators rarely reach; a big case keeps to its
    big values, or its first input might end up unused and dropped)."""
    if not g.big and g.chance(0.5):
        # a fifth with NaNs: NaN times a zero weight is NaN, which a kernel that skips the
        # zeros loses (the NaN must still reach every output of its row)
        return g.add_input(fresh_shape(), F32, "normal_nan" if g.chance(0.2) else "normal")
    return g.pick(lambda v: rank_ok(v) and not v.huge)


def gen_sparse(g: Builder):
    """One of MatMul, Dense, Gemm, Conv with a sparse weight."""
    kind = g.choice(["matmul", "dense", "gemm", "conv", "conv"])
    if kind == "conv":
        return _conv(g)
    if kind == "gemm":
        x = _input(g, lambda v: v.rank == 2 and v.static(1),
                   lambda: (g.batch_dim, g.choice(REDUCTIONS)))
        k, m = x.shape[1], g.choice([1, 5, 8, 16, 32, 64])
        trans_b = int(g.chance(0.5))
        w = _values(g, sparse_mask(g, m, k), k)
        inputs = [x, sparse_weight(g, w if trans_b else np.ascontiguousarray(w.T))]
        if g.chance(0.6):
            inputs.append(g.weight(g.choice([(m,), (1, m)]), 1))
        g.node("Gemm", inputs, transB=trans_b, alpha=g.choice([1.0, 0.5]),
               beta=g.choice([1.0, 2.0]))
        return
    x = _input(g, lambda v: v.rank >= 2 and v.static(-1),
               lambda: (g.batch_dim, g.size((1, 3, 7, 16)), g.choice(REDUCTIONS)))
    k, m = x.shape[-1], g.choice([1, 4, 8, 16, 24, 32, 64])
    w = _values(g, sparse_mask(g, m, k), k)
    y = g.node("MatMul", [x, sparse_weight(g, np.ascontiguousarray(w.T))])[0]
    if kind == "dense":
        g.node("Add", [y, g.weight((m,), 1)])


def _conv(g: Builder):
    x = _input(g, lambda v: v.rank == 4 and all(v.static(i) for i in (1, 2, 3)),
               lambda: (g.batch_dim, g.choice([4, 8, 16, 32]), g.choice([3, 5, 8]),
                        g.choice([4, 7, 9])))
    c, h, w_ = x.shape[1:]
    group = g.choice([1, 1, 1, 2, c]) if c % 2 == 0 else g.choice([1, 1, c])
    if c % group:
        raise Rejected
    m = group * g.choice([1, 2]) if group == c else g.choice([4, 8, 16, 32])
    if m % group:
        m = group * max(1, m // group)
    kh = kw = g.choice([1, 1, 3])
    attrs = {"kernel_shape": [kh, kw], "group": group}
    if kh == 3 and g.chance(0.7):
        attrs["pads"] = [1, 1, 1, 1]
    if g.chance(0.2):
        attrs["strides"] = [2, 2]
    check_windows((h, w_), attrs)
    fan_in = c // group * kh * kw
    # the mask on (outputs, (kh, kw, C/g)), laid back as (M, C/g, kh, kw)
    flat = _values(g, sparse_mask(g, m, fan_in), fan_in)
    weight = np.ascontiguousarray(np.moveaxis(flat.reshape(m, kh, kw, c // group), -1, 1))
    bias = [g.weight((m,), 1)] if g.chance(0.6) else []
    g.node("Conv", [x, sparse_weight(g, weight)] + bias, **attrs)


def _two_of_four(g: Builder, rows: int, cols: int) -> np.ndarray:
    """A mask of at most 2 kept in every 4 along the columns: 2:4 or 1:4, a tenth of the
    groups emptied (and, a quarter of the time, whole rows)."""
    mask = keep_mask(g.rng.random((rows, cols)), parse_pattern(g.choice(["2:4", "2:4", "1:4"])),
                     0.5)
    groups = mask.reshape(rows, cols // 4, 4)
    groups[g.rng.random(groups.shape[:2]) < 0.1] = False
    if g.chance(0.25):
        mask[g.rng.random(rows) < 0.3] = False
    return mask


def gen_sparse24(g: Builder):
    """MatMul, Dense, Gemm (alpha = beta = 1) or a 1x1 Conv whose weight fits 2:4 exactly
    (outputs a multiple of 16, the reduction of 32)."""
    kind = g.choice(["matmul", "dense", "gemm", "conv"])
    k, m = g.choice([32, 64, 96, 128]), g.choice([16, 32, 48, 64])
    if kind == "conv":
        x = _input(g, lambda v: v.rank == 4 and all(v.static(i) for i in (1, 2, 3)) and
                   v.shape[1] % 32 == 0, lambda: (g.batch_dim, k, g.choice([3, 5, 8]),
                                                  g.choice([4, 7, 9])))
        c = x.shape[1]
        w = _values(g, _two_of_four(g, m, c), c)
        bias = [g.weight((m,), 1)] if g.chance(0.6) else []
        g.node("Conv", [x, sparse_weight(g, w.reshape(m, c, 1, 1))] + bias,
               kernel_shape=[1, 1])
        return
    rank = (lambda v: v.rank == 2) if kind == "gemm" else (lambda v: v.rank >= 2)
    x = _input(g, lambda v: rank(v) and v.static(-1) and v.shape[-1] % 32 == 0,
               lambda: (g.batch_dim, k) if kind == "gemm" else
               (g.batch_dim, g.size((1, 3, 7, 16)), k))
    k = x.shape[-1]
    w = _values(g, _two_of_four(g, m, k), k)
    if kind == "gemm":
        trans_b = int(g.chance(0.5))
        inputs = [x, sparse_weight(g, w if trans_b else np.ascontiguousarray(w.T))]
        if g.chance(0.6):
            inputs.append(g.weight(g.choice([(m,), (1, m)]), 1))
        g.node("Gemm", inputs, transB=trans_b)
        return
    y = g.node("MatMul", [x, sparse_weight(g, np.ascontiguousarray(w.T))])[0]
    if kind == "dense":
        g.node("Add", [y, g.weight((m,), 1)])
