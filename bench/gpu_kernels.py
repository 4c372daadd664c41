"""cuda kernels against their bars (issue 12), one run: dense against cuBLAS, memory-bound
kernels against the GPU's copy bandwidth.

    python bench/gpu_kernels.py [--only dense,elementwise,softmax,layernorm,channel_layernorm,
                                        attention]
                                [--repeat 200] [--trials 7] [--no-variants]
                                [--precision tf32|fp16|bf16] [--dense-shapes MxKxN,...]
                                [--storages fp32,16,16/out] [--wgmma-variants]
                                [--variant-set mma|pipeline|shallow] [--graphs]
                                [--configs 'knob=value,...;...']

Each case builds a small graph, lowers it as one kernel (`lower_group`), schedules it with
the cuda templates' default config and, unless `--no-variants`, with the previous default
(`old default`, where the default changed) and a few other configs of the same space (to
see what the default leaves on the table), renders, compiles it with NVRTC
(`device.ModuleCache`; sm_90a where it uses wgmma) and times its launches with CUDA
events: the median over `--trials` of the mean time of `--repeat` back-to-back launches.
For the memory-bound cases every row of a case (the copy, torch, each dnnc config) is
timed in turn, trial by trial (A, B, C, A, B, C, ...: `interleaved_ms`), so that drift over
the run falls on all of them alike, and the fastest dnnc config is named under them: pick
defaults from one run. Beside dnnc, in the same run:

- copy: a device-to-device copy (`cudaMemcpyAsync`) of the tensor's bytes, timed the same
  way: the bar (issue 12: elementwise >= 80% of it, softmax / layernorm rows >= 70%);
- torch: `torch.softmax` / `F.layer_norm` on the same input where torch is importable.

GB/s counts one read and one write of the tensor (what the kernel cannot avoid); `vs copy`
is the copy's time over the kernel's (1.0: as fast as a copy); `torch/dnnc` is torch's time
over dnnc's (above 1: dnnc faster). Every dnnc result is checked against NumPy (float64
reference; rtol 1e-4, atol 1e-5) and the row says `ok` or `WRONG`; the exit status is 1 when
anything was wrong.

`dense` is timed against `cupy.matmul` (cuBLAS, fp32: TF32 stays off unless CUPY_TF32=1 is
set, and the header says which) on the same operands: TF/s = 2 m n k / time, `vs cuBLAS` is
cuBLAS's time over dnnc's (bar: 4096^3 >= 0.70), every variant checked against cuBLAS's
result (rtol 1e-3, atol 1e-3 scaled by sqrt(k)); with `--graphs` each side's launches are
timed as a CUDA graph replayed (the kernels' time: below ~20 us a cupy.matmul's host side,
not its kernel, decides back-to-back calls; cuBLAS then through torch); the variants are the default-model tiles
(`dense.DEFAULTS`) with k unsplit and split, the measurements `dense.EFFICIENCY` is fitted
from. Dense launches repeat `--repeat` / 10 times.

`--precision tf32|fp16|bf16` compiles for that precision (`Target.precision`): the dense
rows are then the tensor-core template's (`backends/cuda/mma.py`: its default and, unless
`--no-variants`, `MMA_VARIANTS` unsplit and split, the measurements `mma.EFFICIENCY`
should be fitted from), first with the operands stored in fp32 ("fp32 in": staged through
registers, converted on the way), then for fp16 and bf16 stored in that type ("fp16 in",
"bf16 in": converted once before timing; the cp.async path), then with the product stored in
that type as well ("fp16 in/out": as cuBLAS's half product and a half-storage model's products
store it; its check allows the product's own rounding, u |x w|), against cuBLAS at the same
precision (`--storages` picks among these rows):
tf32 `torch.matmul` with `torch.backends.cuda.matmul.allow_tf32 = True` on the fp32
operands (else `cupy.matmul` if CUPY_TF32=1 is set), fp16 `cupy.matmul` on float16 copies,
bf16 `torch.matmul` on bfloat16 copies (each peer's time excludes its conversion). Each
dnnc result is checked against the float64 product within the precision's bound
(tests/backends/cuda/test_cuda_precision.py: (2u + u^2 + k (2^-23 + 2^-24)) sum |x| |w|, u
the operands' unit roundoff). The other cases do not depend on the precision.
`attention` is the fused attention kernel (FusedAttention through the attention template)
against, in the same run, dnnc's unfused path (the same chain compiled without the
fuse_attention pass: Q Kᵀ with its scale and mask as the dense kernel's epilogue, the
softmax rows, the product with V: three kernels) and torch's
`scaled_dot_product_attention` on the math backend (fp32, TF32 off), on the chain as
bert_base writes it (K arriving transposed, [b, h, d, s]; an additive mask [b, 1, 1, s] of
-10000 on the padding) at bert_base's shapes (12 heads of 64, 128 tokens, batch 1 and 8)
and vit's (197 tokens: ragged tiles, 3 heads of 64, batch 1). GFLOP/s counts the two
products (4 b h s^2 d); `vs unfused` is the unfused path's time over the kernel's (above 1:
fusion helps), `torch/dnnc` torch's over dnnc's. The variants are attention configs
(rows, threads, tile_k, thread_rows: "x2" is two query rows a thread; "rolled": the loops
over d and the keys left to nvcc), the measurements `attention.DEFAULTS`, its block-per-SM aim
and `UNROLL_HEAD` come from.
Every row is checked against NumPy (float64; rtol 1e-4, atol 1e-5).

Cases: `dense` (4096^3; bert_base's FFN at batch 1 and 8: 128 / 1024 rows, 768 -> 3072 and
back), `elementwise` (a fused chain of 5 ops, sigmoid(1.5 x + 0.25) * x then relu, over
256 MiB of float32), `softmax` (bert_base's attention rows: [b, 12, 128, 128] over the last
axis at b = 8 and 32), `layernorm` (bert_base's hidden rows: [b, 128, 768]
LayerNormalization at b = 8 and 32), `channel_layernorm` (ConvNeXt-tiny's block layernorm
over NCHW's channels through a Transpose, at batch 32). Add a case: a function yielding `Case`s, listed in
`CASES`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dnnc.backends.cuda import FUSION  # noqa: E402
from dnnc.backends.cuda import device, gemv, mma  # noqa: E402
from dnnc.backends.cuda.codegen import render_module  # noqa: E402
from dnnc.backends.cuda.dense import Operand  # noqa: E402
from dnnc.backends.cuda.schedules import template_for  # noqa: E402
from dnnc.backends.lower import lower_group  # noqa: E402
from dnnc.ir import loop as L  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.ops.packed import round_tf32  # noqa: E402
from dnnc.ir.target import PRECISIONS, Target  # noqa: E402
from gpu_attention import attention_table  # noqa: E402
from gpu_timing import (cuda_torch, cupy_graph_timer, cupy_timer, header, launch_args,  # noqa: E402
                        interleaved_ms, load_module, torch_graph_timer, torch_timer)

RTOL, ATOL = 1e-4, 1e-5


@dataclass
class Case:
    """One kernel to time: its graph (one output), its input, its reference, its peers."""

    name: str
    label: str                                   # shape, as printed
    graph: Graph
    x: np.ndarray
    reference: Callable[[np.ndarray], np.ndarray]
    torch: Callable | None = None                # fn(torch tensor x) -> a call computing it
    variants: list[dict] = field(default_factory=list)   # knob overrides of the default
    old_default: dict | None = None              # overrides giving the previous default


def _scalar(name: str, value: float) -> Value:
    return Value(name, T.TensorType(T.float32, ()), const=np.array(value, np.float32))


def elementwise_cases():
    shape = (64, 1 << 20)   # 256 MiB of float32
    g = Graph("elementwise")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    y = g.add("Mul", x, _scalar("a", 1.5))
    y = g.add("Add", y, _scalar("b", 0.25))
    y = g.add("Sigmoid", y)
    y = g.add("Mul", y, x)
    g.outputs = [g.add("Relu", y)]

    def reference(a):
        a = a.astype(np.float64)
        return np.maximum(a / (1 + np.exp(-(1.5 * a + 0.25))), 0)

    def torch_chain(t):
        import torch
        return lambda: torch.relu(torch.sigmoid(t * 1.5 + 0.25) * t)

    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    yield Case("elementwise", "256 MiB, 5 ops", g, x, reference, torch_chain,
               [{"vector": 1}, {"vector": 2}, {"vector": 4}, {"vector": 4, "threads": 128},
                {"vector": 2, "threads": 512}, {"grid_stride": True, "vector": 2},
                {"grid_stride": True, "vector": 4}],
               old_default={"vector": 2})


def softmax_cases():
    for batch in (8, 32):
        shape = (batch, 12, 128, 128)
        g = Graph("softmax")
        x = g.add_input("x", T.TensorType(T.float32, shape))
        g.outputs = [g.add("Softmax", x, axis=-1)]

        def reference(a):
            a = a.astype(np.float64)
            e = np.exp(a - a.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        def torch_softmax(t):
            import torch
            return lambda: torch.softmax(t, dim=-1)

        x = np.random.default_rng(1).standard_normal(shape, dtype=np.float32) * 4
        yield Case("softmax", f"[{batch},12,128,128]", g, x, reference, torch_softmax,
                   _row_variants() + [{"row_block": 256}, {"row_block": 64},
                                      {"row_vector": 1, "cache_row": False}],
                   old_default=OLD_ROWS_DEFAULT)


def layernorm_cases():
    rng = np.random.default_rng(2)
    scale = rng.standard_normal(768).astype(np.float32)
    bias = rng.standard_normal(768).astype(np.float32)
    for batch in (8, 32):
        shape = (batch, 128, 768)
        g = Graph("layernorm")
        x = g.add_input("x", T.TensorType(T.float32, shape))
        s = Value("scale", T.TensorType(T.float32, (768,)), const=scale)
        b = Value("bias", T.TensorType(T.float32, (768,)), const=bias)
        g.outputs = [g.add("LayerNormalization", x, s, b, axis=-1, epsilon=1e-5)]

        def reference(a):
            a = a.astype(np.float64)
            mean = a.mean(axis=-1, keepdims=True)
            var = ((a - mean) ** 2).mean(axis=-1, keepdims=True)
            return (a - mean) / np.sqrt(var + 1e-5) * scale + bias

        def torch_layernorm(t):
            import torch
            import torch.nn.functional as F
            w = torch.from_numpy(scale).to(t.device)
            c = torch.from_numpy(bias).to(t.device)
            return lambda: F.layer_norm(t, (768,), w, c, 1e-5)

        x = rng.standard_normal(shape, dtype=np.float32) + 3
        yield Case("layernorm", f"[{batch},128,768]", g, x, reference, torch_layernorm,
                   _row_variants() + [{"row_threads": 64, "row_vector": 4},   # 3 whole steps
                                      {"row_threads": 256, "row_block": 256, "row_vector": 2},
                                      {"row_threads": 64, "row_vector": 2}],
                   old_default=OLD_ROWS_DEFAULT)


def channel_layernorm_cases():
    """ConvNeXt-tiny's block layernorm at batch 32: Transpose [32, C, H, W] -> NHWC, then a
    layernorm over C, one kernel (rows read column-wise: `rows.reads_columns`)."""
    rng = np.random.default_rng(3)
    for c, hw in ((96, 56), (384, 14), (768, 7)):
        shape = (32, c, hw, hw)
        scale = rng.standard_normal(c).astype(np.float32)
        bias = rng.standard_normal(c).astype(np.float32)
        g = Graph("channel_layernorm")
        x = g.add_input("x", T.TensorType(T.float32, shape))
        s = Value("scale", T.TensorType(T.float32, (c,)), const=scale)
        b = Value("bias", T.TensorType(T.float32, (c,)), const=bias)
        t = g.add("Transpose", x, perm=[0, 2, 3, 1])
        g.outputs = [g.add("LayerNormalization", t, s, b, axis=-1, epsilon=1e-6)]

        def reference(a, scale=scale, bias=bias):
            a = a.astype(np.float64).transpose(0, 2, 3, 1)
            mean = a.mean(axis=-1, keepdims=True)
            var = ((a - mean) ** 2).mean(axis=-1, keepdims=True)
            return (a - mean) / np.sqrt(var + 1e-6) * scale + bias

        def torch_layernorm(t, c=c, scale=scale, bias=bias):
            import torch
            import torch.nn.functional as F
            w = torch.from_numpy(scale).to(t.device)
            d = torch.from_numpy(bias).to(t.device)
            return lambda: F.layer_norm(t.permute(0, 2, 3, 1), (c,), w, d, 1e-6)

        x = rng.standard_normal(shape, dtype=np.float32) + 3
        yield Case("chan_lnorm", f"[32,{c},{hw},{hw}]", g, x, reference, torch_layernorm,
                   [{"row_interleave": r, "row_threads": t, "row_block": r * t}
                    for r, t in ((1, 32), (4, 32), (8, 32), (8, 16), (16, 16), (16, 32),
                                 (32, 8), (32, 16))])


OLD_ROWS_DEFAULT = {"row_vector": 1}
"""The row template's default before vector stores (its geometry then, one element a
thread at a time): softmax [8, 12, 128, 128] 0.62 of copy on an H100."""


def _row_variants() -> list[dict]:
    return [{"row_threads": t, "row_block": max(128, t)} for t in (32, 64, 128, 256)] + \
        [{"row_vector": 4}, {"row_vector": 2}, {"row_vector": 1},
         {"row_threads": 32, "row_vector": 4}, {"cache_row": False},
         {"row_vector": 2, "cache_row": False}]


DENSE_SHAPES = ((4096, 4096, 4096), (128, 768, 3072), (128, 3072, 768), (1024, 768, 3072),
                (1024, 3072, 768), (8192, 768, 3072), (8192, 3072, 768))
"""(m, k, n): the issue's 4096^3 and bert_base's FFN products at batch 1, 8 and 64
(`--dense-shapes` picks some)."""

TRANSFORMER_SHAPES = (
    # vit_tiny at batch 32 (6304 tokens of 192): qkv, proj, fc1, fc2
    (6304, 192, 576), (6304, 192, 192), (6304, 192, 768), (6304, 768, 192),
    # bert_base at batch 8 (1024 tokens of 768): q / k / v / out, fc1, fc2
    (1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768),
    # convnext_tiny at batch 32: each stage's pointwise fc1, fc2 (NHWC rows)
    (100352, 96, 384), (100352, 384, 96), (25088, 192, 768), (25088, 768, 192),
    (6272, 384, 1536), (6272, 1536, 384), (1568, 768, 3072), (1568, 3072, 768))
"""(m, k, n): the products of vit_tiny (batch 32), bert_base (batch 8) and convnext_tiny
(batch 32), issue 31's transformer shapes (`--dense-shapes transformers`; `all`: these,
then DENSE_SHAPES)."""

MMA_VARIANTS = (
    dict(block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=2, stages=3),
    dict(block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=4, stages=4),
    dict(block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4, stages=4),
    dict(block_m=256, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=3),
    dict(block_m=128, block_n=128, block_k=64, warps_m=2, warps_n=2, stages=3),
    dict(block_m=64, block_n=128, block_k=32, warps_m=2, warps_n=2, stages=4),
    # small tiles (products of a few hundred rows: batch 1)
    dict(block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=3),
    dict(block_m=32, block_n=64, block_k=32, warps_m=1, warps_n=2, stages=3),
    dict(block_m=32, block_n=32, block_k=32, warps_m=1, warps_n=2, stages=3),
    dict(block_m=16, block_n=32, block_k=32, warps_m=1, warps_n=2, stages=3),
    # warpgroups issuing wgmma (sm_90 only: skipped elsewhere, outside the space)
    dict(block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=4, wgmma=True),
    dict(block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=3, wgmma=True),
    dict(block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=5, wgmma=True),
    dict(block_m=64, block_n=128, block_k=64, warps_m=4, warps_n=1, stages=5, wgmma=True),
    dict(block_m=64, block_n=64, block_k=64, warps_m=4, warps_n=1, stages=4, wgmma=True),
    dict(block_m=128, block_n=256, block_k=64, warps_m=4, warps_n=2, stages=4, wgmma=True),
    dict(block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=4, wgmma=True,
         early_refill=True),
    # fewer slots: two blocks an SM (one's k loop beside the other's prologue and stores)
    dict(block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=2, wgmma=True,
         early_refill=True),
    dict(block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=3, wgmma=True),
    dict(block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=2, wgmma=True,
         early_refill=True),
    dict(block_m=128, block_n=128, block_k=64, warps_m=4, warps_n=2, stages=3, wgmma=True),
    dict(block_m=64, block_n=256, block_k=64, warps_m=4, warps_n=1, stages=3, wgmma=True),
    dict(block_m=256, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=3, wgmma=True),
    # results staged through shared memory (whole lines of Y stored)
    dict(block_m=128, block_n=256, block_k=64, warps_m=8, warps_n=1, stages=4, wgmma=True,
         staged=True),
    dict(block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1, stages=5, wgmma=True,
         staged=True))
"""Tensor-core configs timed beside the default (each also split where k allows)."""

PIPELINE_VARIANTS = tuple(
    dict(block_m=bm, block_n=bn, warps_m=wm, warps_n=1, stages=st, wgmma=True,
         refill_first=first)
    for bm, bn, wm, st, first in (
        (128, 256, 8, 4, False), (128, 256, 8, 4, True), (128, 128, 8, 5, False),
        (128, 128, 8, 5, True), (128, 128, 8, 3, True), (128, 192, 8, 5, False),
        (128, 192, 8, 5, True), (128, 192, 8, 4, True), (256, 128, 8, 3, True),
        (64, 256, 4, 4, True), (64, 192, 4, 5, True), (64, 128, 4, 5, True),
        (64, 64, 4, 4, False), (64, 64, 4, 4, True)))
"""`--variant-set pipeline`: the wgmma tiles with and without `refill_first` and the
192-column warpgroups, in place of MMA_VARIANTS (k tiles of 128 bytes at each precision; a
16-bit product staged as the default stages it)."""

SHALLOW_VARIANTS = tuple(
    dict(block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn, stages=st, staged=staged)
    for bm, bn, bk, wm, wn, st in ((32, 64, 32, 1, 2, 3), (64, 64, 32, 2, 2, 3),
                                   (64, 128, 32, 2, 2, 4), (128, 128, 64, 2, 2, 3),
                                   (128, 128, 32, 2, 4, 3))
    for staged in (False, True)) + tuple(
    dict(block_m=bm, block_n=bn, warps_m=wm, warps_n=1, stages=st, wgmma=True,
         refill_first=first, staged=staged)
    for bm, bn, wm, st, first in ((128, 128, 8, 5, True), (128, 192, 8, 5, True),
                                  (64, 192, 4, 5, True), (64, 64, 4, 4, False))
    for staged in (False, True))
"""`--variant-set shallow`: products of k at most mma.SHALLOW_K (vit's and convnext's): the
mma.sync tiles of mma.DEFAULTS and SHALLOW_LARGE_TILE and the wgmma tiles, each with its
results stored directly and staged (staged.py), at every precision (wgmma k tiles of 128
bytes)."""


def dense_cases(shapes=DENSE_SHAPES, b_layout: str = "kn", epilogue: str = ""):
    """x [m, k] times a constant w: MatMul of w [k, n] (`b_layout` "kn", as ONNX MatMul
    stores a weight), or Gemm with transB of w stored [n, k] ("nk", as a Linear's weight);
    with `epilogue` "gelu", the product then GELU as torch exports it (erf: y / sqrt 2,
    Erf, + 1, times y, times 0.5: a transformer's MLP, fused into the product)."""
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        g = Graph("dense")
        x = g.add_input("x", T.TensorType(T.float32, (m, k)))
        w = rng.standard_normal((k, n), dtype=np.float32)
        if b_layout == "nk":
            wt = np.ascontiguousarray(w.T)
            g.outputs = [g.add("Gemm", x, Value("w", T.TensorType(T.float32, (n, k)), const=wt),
                               transB=1)]
        else:
            g.outputs = [g.add("MatMul", x, Value("w", T.TensorType(T.float32, (k, n)),
                                                  const=w))]
        if epilogue == "gelu":
            y = g.outputs[0]
            erf = g.add("Erf", g.add("Div", y, _scalar("sqrt2", np.sqrt(2.0))))
            g.outputs = [g.add("Mul", g.add("Mul", y, g.add("Add", erf, _scalar("one", 1.0))),
                               _scalar("half", 0.5))]
        x = rng.standard_normal((m, k), dtype=np.float32)
        yield Case("dense", f"{m}x{k}x{n}", g, x, None, None,
                   _gemv_variants() if m < gemv.MAX_ROWS else _dense_variants(k))


def _gemv_variants() -> list[dict]:
    """Configs of the gemv template (fewer than 16 rows: a decode step's products) timed
    beside its default: columns a block, threads along k, k steps in flight, elements of B's
    contiguous dimension a step (a variant whose vector does not divide it is skipped)."""
    return [dict(cols=cols, k_split=ks, unroll=unroll, vector=vector)
            for cols, ks, unroll, vector in (
                (8, 32, 8, 1),   # the previous default (ff7e5e0), B [k, n]
                (8, 32, 4, 1), (4, 64, 8, 1), (16, 32, 8, 1),
                (8, 128, 8, 4), (8, 64, 8, 4), (8, 256, 4, 4), (4, 256, 8, 4),
                (16, 64, 8, 4), (16, 128, 4, 4), (32, 32, 8, 4), (8, 128, 8, 2),
                (8, 32, 8, 4), (4, 32, 8, 4), (8, 16, 8, 4))]


def _dense_variants(k: int, precision: str = "fp32", m: int = 0,
                    variant_set: str = "mma") -> list[dict]:
    from dnnc.backends.cuda import wgmma
    from dnnc.backends.cuda.dense import DEFAULTS, MIN_SPLIT_K

    if precision != "fp32":   # the tensor-core template's (every knob set: the default's
        # wgmma must not carry over into an mma.sync variant)
        listed = {"mma": MMA_VARIANTS, "pipeline": PIPELINE_VARIANTS,
                  "shallow": SHALLOW_VARIANTS}[variant_set]
        listed = [{**v, "block_k": wgmma.block_k(precision)} if v.get("wgmma") else v
                  for v in listed]
        return [{"wgmma": False, "early_refill": False, "refill_first": False,
                 "staged": False, "cluster_split": False, **v, "split_k": split}
                for v in listed for split in (1, 2, 4, 8)
                if split == 1 or k >= 2 * split * MIN_SPLIT_K and m <= 1024 and
                v["block_m"] <= 128]
    tiles = ("tile_m", "tile_n", "tile_k", "thread_m", "thread_n")
    wider = ((128, 128, 16, 8, 8), (64, 128, 16, 4, 8), (128, 64, 16, 8, 4), (64, 256, 8, 8, 8),
             (64, 128, 8, 8, 8), (128, 256, 8, 8, 8))
    return [dict(zip(tiles, dims), split_k=split) for dims in DEFAULTS + wider
            for split in (1, 2, 4, 8) if split == 1 or k >= split * MIN_SPLIT_K]


def parse_configs(text: str) -> list[dict]:
    """`--configs`: dense configs as `knob=value,...` separated by `;` (values ints,
    True / False or tma: the producer's), each a complete tensor-core config where it sets
    block_m (the knobs a variant leaves out as `_dense_variants` sets them: no wgmma, no
    refill, direct, unsplit), else overrides of the default."""
    configs = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        knobs = {}
        for pair in item.split(","):
            name, value = (x.strip() for x in pair.split("="))
            knobs[name] = {"True": True, "False": False}.get(value) if value in (
                "True", "False") else value if value == "tma" else int(value)
        if "block_m" in knobs:
            knobs = {"wgmma": False, "early_refill": False, "refill_first": False,
                     "staged": False, "cluster_split": False, "split_k": 1, **knobs}
        configs.append(knobs)
    return configs


UNIT = {"tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
"""Unit roundoff of an operand rounded to a reduced precision (test_cuda_precision.py)."""


def blas_peer(cp, precision: str, x_dev, w_dev, graphs: bool = False):
    """(label, a function running cuBLAS's product of the operands at `precision`, a timer
    of that function (`--graphs`: a CUDA graph's)), or None when no library here offers
    it; with `graphs` every precision through torch where torch has CUDA (a cupy.matmul
    allocates its result, which a graph's capture may not)."""
    peer = _blas_call(cp, precision, x_dev, w_dev, graphs)
    if peer is None:
        return None
    label, fn = peer
    if not graphs:
        return label, fn, cupy_timer(cp, fn)
    if label.startswith("cuBLAS") and "torch" in label:
        return label + ", graph", fn, torch_graph_timer(fn)
    return label + ", not a graph", fn, cupy_timer(cp, fn)


def _blas_call(cp, precision: str, x_dev, w_dev, graphs: bool):
    import os

    if precision == "fp32":
        return "cuBLAS (cupy.matmul)", lambda: cp.matmul(x_dev, w_dev)
    if precision == "fp16" and not (graphs and cuda_torch() is not None):
        x16, w16 = x_dev.astype(cp.float16), w_dev.astype(cp.float16)
        return "cuBLAS fp16 (cupy.matmul, float16)", lambda: cp.matmul(x16, w16)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        if precision == "tf32" and os.environ.get("CUPY_TF32") == "1":
            return "cuBLAS tf32 (cupy.matmul, CUPY_TF32=1)", lambda: cp.matmul(x_dev, w_dev)
        return None
    x_t, w_t = torch.from_dlpack(x_dev), torch.from_dlpack(w_dev)
    if precision == "fp16":
        xh, wh = x_t.to(torch.float16), w_t.to(torch.float16)
        return "cuBLAS fp16 (torch.matmul, float16)", lambda: torch.matmul(xh, wh)
    if precision == "tf32":
        def tf32():
            torch.backends.cuda.matmul.allow_tf32 = True
            return torch.matmul(x_t, w_t)
        return "cuBLAS tf32 (torch.matmul, allow_tf32)", tf32
    xb, wb = x_t.to(torch.bfloat16), w_t.to(torch.bfloat16)
    return "cuBLAS bf16 (torch.matmul, bfloat16)", lambda: torch.matmul(xb, wb)

CASES = {"dense": dense_cases, "elementwise": elementwise_cases, "softmax": softmax_cases,
         "layernorm": layernorm_cases, "channel_layernorm": channel_layernorm_cases,
         "attention": None}


# -- measuring (gpu_timing: cupy_timer, cupy_graph_timer, torch_timer, interleaved_ms) ------


def torch_call(case: Case):
    """The case's torch call on its input on the GPU, or None (no torch, no CUDA)."""
    torch = cuda_torch() if case.torch is not None else None
    return None if torch is None else case.torch(torch.from_numpy(case.x).cuda())


def build(case: Case, machine: Target, overrides: dict, tf32_operands: bool = False,
          y_dtype: T.DType | None = None):
    """(the scheduled PrimFunc, its config) of the case's graph as one kernel;
    `tf32_operands`: a product's operands taken as tf32 values already (as in a model at
    tf32, where passes/store_tf32.py has their producers store them so: `run_kernel` then
    feeds them rounded); `y_dtype`: the config as for a product storing Y in that type (the
    16-bit rows', which `stored_16bit` builds; the PrimFunc stays the graph's)."""
    kernel = lower_group(list(case.graph.nodes), case.name, outputs=case.graph.outputs)
    template, problem = template_for(kernel, machine=machine)
    if tf32_operands:
        problem = dataclasses.replace(problem, a_tf32=True, b_tf32=True)
    if y_dtype is not None:
        y = problem.y
        config = _config(template, dataclasses.replace(
            problem, y=L.Buffer(y.name, y_dtype, y.shape, y.scope)), machine, overrides)
        return kernel, template.build(problem, config, machine), config
    config = _config(template, problem, machine, overrides)
    return kernel, template.build(problem, config, machine), config


def _config(template, problem, machine: Target, overrides: dict):
    """`template`'s default config of `problem` with `overrides`, checked in its space."""
    config = template.default(problem, machine)
    if overrides:
        config = dataclasses.replace(config, **overrides)
    return template.space(problem, machine).check(config)


def run_kernel(cp, kernel, func, x_dev, tf32: bool = False):
    """A function launching `func`'s launches once, and its output device array; `tf32`:
    the inputs rounded to tf32 first (`packed.round_tf32`, as `build`'s tf32_operands)."""
    module = render_module([(func, True)])
    raw = load_module(cp, module.source)
    info = module.kernels[func.name]
    ins = [x_dev if v.const is None else cp.asarray(np.ascontiguousarray(v.const))
           for v in kernel.inputs]
    if tf32:
        ins = [cp.asarray(round_tf32(cp.asnumpy(a))) for a in ins]
    (out_value,) = kernel.outputs
    out = cp.full(out_value.type.shape, np.nan, np.float32)
    args = launch_args(cp, info, ins + [out])
    launches = [(_function(raw, lc), lc) for lc in info.launches]

    def launch():
        for fn, lc in launches:
            fn(lc.grid, lc.block, args, shared_mem=lc.shared_bytes)

    launch.module = raw   # (loaded as long as its launches run)

    return launch, out, len(launches)


def _function(raw, launch):
    """`launch`'s function of `raw`, allowed its dynamic shared memory (beyond 48 KiB)."""
    fn = raw.get_function(launch.name)
    device.allow_shared(fn, launch.shared_bytes)
    return fn


def stored_16bit(cp, precision: str, x, w, config, y_16bit: bool = False):
    """(launch, output) of x w (fp32 arrays) with both operands stored in the precision's
    16-bit type (converted here, once): the tensor-core template's cp.async path; with
    `y_16bit` the product is stored in that type too (as cuBLAS's half product and a
    half-storage model's products are), the output returned as float32."""
    m, k = x.shape
    n = w.shape[1]
    dtype = mma.STORAGE[precision]
    a, b = L.Buffer("a", dtype, (1, m, k)), L.Buffer("b", dtype, (1, k, n))
    y = L.Buffer("y", dtype if y_16bit else T.float32, (1, m, n))
    body = mma.mma_product(config, 1, m, n, k, Operand(lambda bi, i, kk: a[bi, i, kk], False,
                                                       True),
                           Operand(lambda bi, j, kk: b[bi, kk, j], True, True),
                           lambda bi, i, j, value: L.Store(
                               y, (bi, i, j), L.Cast(dtype, value) if y_16bit else value),
                           precision=precision)
    func = L.PrimFunc("stored_16bit", (a, b, y), body)
    module = render_module([(func, True)])
    raw = load_module(cp, module.source)
    info = module.kernels[func.name]
    out = cp.full((m, n), np.nan, np.float32) if not y_16bit else \
        cp.asarray(np.full((m, n), np.nan, np.float32).astype(dtype.np).view(np.uint16))
    args = launch_args(cp, info, [cp.asarray(v.astype(dtype.np).view(np.uint16))
                                  for v in (x, w)] + [out])
    launches = [(_function(raw, lc), lc) for lc in info.launches]

    def launch():
        for fn, lc in launches:
            fn(lc.grid, lc.block, args, shared_mem=lc.shared_bytes)

    launch.module = raw   # (loaded as long as its launches run)

    if y_16bit:
        launch.result = lambda: cp.asnumpy(out).view(dtype.np).astype(np.float32)
    else:
        launch.result = lambda: cp.asnumpy(out)
    return launch, out


def _config_text(config, default) -> str:
    """The knobs where `config` differs from `default`, or `default`."""
    changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if getattr(config, f.name) != getattr(default, f.name)}
    return " ".join(f"{k}={v}" for k, v in changed.items()) or "default"


CONFIG_WIDTH = 80
"""Characters of a dense row's config column (the longest label whole)."""


def dense_table(cp, machine: Target, args) -> int:
    """Print the dense rows (each config against cuBLAS at the machine's precision); the
    number of wrong results."""
    import os

    precision, W = machine.precision, CONFIG_WIDTH
    repeat = max(3, args.repeat // 10)
    print(f"dense at precision {precision}: cuBLAS at the same precision, CUPY_TF32="
          f"{os.environ.get('CUPY_TF32', '0')}; {repeat} launches x {args.trials} trials")
    print(f"{'case':12s} {'shape':18s} {'config':{W}s} {'us':>9s} {'TF/s':>7s} "
          f"{'vs cuBLAS':>9s}  check")
    wrong = 0
    named = {"transformers": TRANSFORMER_SHAPES,
             "all": tuple(dict.fromkeys(TRANSFORMER_SHAPES + DENSE_SHAPES))}
    shapes = named[args.dense_shapes] if args.dense_shapes in named else \
        [tuple(int(x) for x in text.split("x")) for text in args.dense_shapes.split(",")
         if text] if args.dense_shapes else DENSE_SHAPES
    print(f"B stored {'[n, k] (Gemm transB)' if args.b_layout == 'nk' else '[k, n] (MatMul)'}")
    if args.dense_epilogue:
        print(f"epilogue {args.dense_epilogue} fused (cuBLAS: the product alone)")
    for case in dense_cases(shapes, args.b_layout, args.dense_epilogue):
        if args.configs:
            case.variants = parse_configs(args.configs)
        elif precision != "fp32":
            case.variants = [v for v in _dense_variants(case.x.shape[1], precision,
                                                        case.x.shape[0],
                                                        args.variant_set)
                             if v["wgmma"] or not args.wgmma_variants]
        x_dev = cp.asarray(case.x)
        w = next(v.const for v in case.graph.nodes[0].inputs if v.const is not None)
        w_dev = cp.asarray(np.ascontiguousarray(w.T) if args.b_layout == "nk" else w)
        k = w_dev.shape[0]
        flops = 2 * case.x.shape[0] * k * w_dev.shape[1]
        if precision == "fp32":
            want_dev = cp.matmul(x_dev, w_dev)
            if args.dense_epilogue == "gelu":
                from cupyx.scipy.special import erf
                want_dev = want_dev * 0.5 * (1 + erf(want_dev / np.float32(np.sqrt(2.0))))
            want = cp.asnumpy(want_dev)

            def close(got, _=0.0):
                return np.allclose(got, want, rtol=1e-3, atol=1e-3 * np.sqrt(k))
        else:   # within the precision's bound of the float64 product
            x64, w64 = x_dev.astype(cp.float64), w_dev.astype(cp.float64)
            want = cp.asnumpy(cp.matmul(x64, w64))
            scale = cp.asnumpy(cp.matmul(cp.abs(x64), cp.abs(w64)))
            u = UNIT[precision]
            limit = (2 * u + u * u + k * (2.0 ** -23 + 2.0 ** -24)) * scale
            if precision == "fp16":   # its subnormals: 2^-25 absolute an operand
                limit += 2 * k * 2.0 ** -25 * float(cp.abs(x_dev).max() * cp.abs(w_dev).max())
            del x64, w64

            def close(got, u_out=0.0):   # (u_out: the product's own rounding, stored)
                return bool((np.abs(got - want) <= limit + u_out * np.abs(want)).all())
        peer = blas_peer(cp, precision, x_dev, w_dev, args.graphs)
        blas_ms = None
        if peer is None:
            print(f"{'dense':12s} {case.label:18s} {'cuBLAS at ' + precision:{W}s} "
                  f"not available (needs torch with CUDA)")
        else:
            label, fn, timer = peer
            blas_ms = interleaved_ms([timer], repeat, args.trials)[0]
            print(f"{'dense':12s} {case.label:18s} {label:{W}s} "
                  f"{blas_ms * 1e3:9.1f} {flops / blas_ms / 1e9:7.1f} {1:9.2f}")
        default, measured = None, set()
        # the operands as a model's products read them: in 16 bits (half storage), or at
        # tf32 as tf32 values (passes/store_tf32.py)
        storages = ("fp32", precision, precision + "/out") if precision in mma.STORAGE \
            else ("fp32", precision) if precision == "tf32" else ("fp32",)
        storages = [s for s in storages
                    if s.replace(precision, "16") in args.storages.split(",")]
        for storage, overrides in [(s, o) for s in storages for o in [{}] + (
                [] if args.no_variants else case.variants)]:
            try:
                kernel, func, config = build(
                    case, machine, overrides, storage == "tf32",
                    mma.STORAGE[precision] if storage.endswith("/out") else None)
            except Exception as exc:   # a variant outside this problem's space
                print(f"{'dense':12s} {case.label:18s} {str(overrides)[:W]:{W}s} skipped: "
                      f"{str(exc).splitlines()[0][:60]}")
                continue
            if storage.endswith("/out") and overrides and args.variant_set == "pipeline" \
                    and not args.configs:   # the pipeline variants staged as the default
                config = mma.staged_by_default(config, mma.STORAGE[precision], precision)
            if (storage, config) in measured:
                continue
            measured.add((storage, config))
            if not overrides:
                default = config
            if storage in ("fp32", "tf32"):
                launch, out, n = run_kernel(cp, kernel, func, x_dev, storage == "tf32")
            else:   # the operands stored in 16 bits (and with "/out" the product too)
                launch, out = stored_16bit(cp, precision, case.x, cp.asnumpy(w_dev), config,
                                           storage.endswith("/out"))
            ms = _kernel_ms(cp, launch, repeat, args)
            got = launch.result() if hasattr(launch, "result") else cp.asnumpy(out)
            ok = close(got, UNIT[precision] if storage.endswith("/out") else 0.0)
            wrong += not ok
            label = (f"{storage.replace('/out', ' in/out')}: " if storage.endswith("/out")
                     else f"{storage} in: " if precision != "fp32" else "") + \
                ("default: " if config == default else "") + _tiles(config)
            ratio = f"{blas_ms / ms:9.2f}" if blas_ms else f"{'-':>9s}"
            print(f"{'dense':12s} {case.label:18s} {label[:W]:{W}s} {ms * 1e3:9.1f} "
                  f"{flops / ms / 1e9:7.1f} {ratio}  "
                  f"{'ok' if ok else 'WRONG: max err %.3g' % np.max(np.abs(got - want))}")
        del x_dev, w_dev
        cp.get_default_memory_pool().free_all_blocks()
    return wrong


def _kernel_ms(cp, launch, repeat: int, args) -> float:
    """The ms of dnnc's `launch`, as a CUDA graph's with `--graphs` (back to back where its
    capture fails: said on the row before)."""
    if args.graphs:
        try:
            return interleaved_ms([cupy_graph_timer(cp, launch)], repeat, args.trials)[0]
        except Exception as exc:   # (the capture: not expected)
            print(f"{'':31s} not timed as a graph: {str(exc).splitlines()[0][:80]}")
    return interleaved_ms([cupy_timer(cp, launch)], repeat, args.trials)[0]


def _tiles(c) -> str:
    """A dense config's tiles, as the dense rows print them."""
    if isinstance(c, gemv.GemvConfig):
        return f"gemv cols {c.cols} k_split {c.k_split} unroll {c.unroll} vector {c.vector}"
    if isinstance(c, mma.TensorCoreConfig):
        return f"{c.block_m}x{c.block_n}x{c.block_k} warps {c.warps_m}x{c.warps_n} " \
            f"stages {c.stages} split {c.split_k}{' wgmma' if c.wgmma else ''}" \
            f"{' early' if c.early_refill else ''}{' first' if c.refill_first else ''}" \
            f"{' staged' if c.staged else ''}{' cluster' if c.cluster_split else ''}"
    return f"tile {c.tile_m}x{c.tile_n}x{c.tile_k} thread {c.thread_m}x{c.thread_n} " \
        f"split_k {c.split_k}"


def memory_table(cp, machine: Target, args, name: str) -> int:
    """Print the rows of memory-bound case `name`: the copy, torch, and dnnc's default and
    variants, all timed in turn (`interleaved_ms`); the number of wrong results."""
    print(f"{'case':12s} {'shape':18s} {'config':58s} {'us':>9s} {'GB/s':>7s} "
          f"{'vs copy':>7s} {'torch/dnnc':>10s}  check")
    wrong = 0
    for case in CASES[name]():
        nbytes = 2 * case.x.nbytes
        x_dev = cp.asarray(case.x)
        copy_dst = cp.empty_like(x_dev)
        want = case.reference(case.x)
        copy = cupy_timer(cp, lambda: copy_dst.data.copy_from_device_async(
            x_dev.data, case.x.nbytes))
        rows = [("copy (cudaMemcpyAsync d2d)", copy, "")]
        call = torch_call(case)
        if call is not None:
            rows.append(("torch", torch_timer(call), ""))
        default, measured, dnnc = None, {}, []
        variants = [{}] + ([] if args.no_variants else
                           ([case.old_default] if case.old_default else []) + case.variants)
        for overrides in variants:
            try:
                kernel, func, config = build(case, machine, overrides)
            except Exception as exc:   # a variant outside this problem's space
                print(f"{name:12s} {case.label:18s} {str(overrides):58s} skipped: "
                      f"{str(exc).splitlines()[0][:80]}")
                continue
            if config in measured:   # (a variant equal to the default or another)
                continue
            if default is None:
                default = config
                print(f"{'':31s} default: {type(config).__name__}"
                      f"{dataclasses.asdict(config)}")
            launch, out, n = run_kernel(cp, kernel, func, x_dev)
            launch()
            got = cp.asnumpy(out)
            ok = np.allclose(got, want, rtol=RTOL, atol=ATOL)
            wrong += not ok
            label = ("default: " if config == default else
                     "old default: " if case.old_default is not None and
                     overrides == case.old_default else "") + \
                _config_text(config, default) + (f" ({n} launches)" if n > 1 else "")
            check = "ok" if ok else "WRONG: max err %.3g" % np.max(np.abs(got - want))
            measured[config] = len(rows)
            rows.append((label, cupy_timer(cp, launch), check))
            dnnc.append(len(rows) - 1)
        ms = interleaved_ms([once for _, once, _ in rows], args.repeat, args.trials)
        copy_ms, peer = ms[0], (ms[1] if call is not None else None)
        for k, (label, _, check) in enumerate(rows):
            ratio = f"{peer / ms[k]:10.2f}" if peer is not None and k in dnnc else ""
            print(f"{name:12s} {case.label:18s} {label[:58]:58s} {ms[k] * 1e3:9.1f} "
                  f"{nbytes / ms[k] / 1e6:7.0f} {copy_ms / ms[k]:7.2f} {ratio:>10s}  {check}")
        best = min(dnnc, key=lambda k: ms[k], default=None)
        if best is not None:
            print(f"{name:12s} {case.label:18s} fastest: {rows[best][0][:49]:49s} "
                  f"{copy_ms / ms[best]:.2f} of copy")
        del x_dev, copy_dst, rows
        cp.get_default_memory_pool().free_all_blocks()
    return wrong


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(CASES),
                        help=f"comma-separated cases of {', '.join(CASES)}")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--wgmma-variants", action="store_true",
                        help="of the tensor-core variants only those issuing wgmma")
    parser.add_argument("--variant-set", default="mma", choices=("mma", "pipeline", "shallow"),
                        help="the dense variants at a reduced precision: MMA_VARIANTS, "
                             "PIPELINE_VARIANTS (wgmma tiles, refill_first, 192 columns) or "
                             "SHALLOW_VARIANTS (tiles for k <= 256, direct and staged)")
    parser.add_argument("--configs", default="",
                        help="dense configs timed beside the default in place of the variant "
                             "set: knob=value,... separated by ';' (a config naming block_m "
                             "is whole: unnamed knobs off, split 1; else overrides of the "
                             "default), e.g. an earlier default beside the new one")
    parser.add_argument("--graphs", action="store_true",
                        help="the dense rows timed as CUDA graphs of their launches (dnnc's "
                             "by CuPy, cuBLAS's through torch): the kernels' time without the "
                             "host's cost of issuing them, which decides below ~20 us")
    parser.add_argument("--storages", default="fp32,16,16/out",
                        help="which dense rows at a reduced precision: operands stored in "
                             "fp32, in the precision's type (16; tf32 values at tf32), and "
                             "the product stored in it too (16/out: fp16 and bf16)")
    parser.add_argument("--dense-shapes", default="",
                        help="the dense cases' shapes, m x k x n, comma separated, or "
                             "'transformers' (TRANSFORMER_SHAPES), 'all' (both sets) "
                             "(default: DENSE_SHAPES)")
    parser.add_argument("--attention-shapes", default="default", choices=("default", "decode"),
                        help="the attention rows' shapes: bert's, vit's and long sequences "
                             "(default), or a decode step's one query row against a static "
                             "cache (gpu_attention.DECODE_SHAPES, with DECODE_VARIANTS)")
    parser.add_argument("--dense-epilogue", default="", choices=("", "gelu"),
                        help="the dense rows' product followed by GELU (fp32 only)")
    parser.add_argument("--b-layout", default="", choices=("", "kn", "nk"),
                        help="the dense rows' constant B: [k, n] (MatMul) or [n, k] (Gemm "
                             "transB: K-major, a Linear's weight); default: as a compiled "
                             "model stores a MatMul's constant B, [n, k] at tf32 (convert_"
                             "layout's tf32_dense: 32-bit tiles are K-major, a B stored [k, n] "
                             "reaches them only through registers), [k, n] otherwise")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="the compile's precision: tensor cores for the dense rows at "
                             "tf32, fp16 or bf16, against cuBLAS at the same precision")
    args = parser.parse_args(argv)
    args.b_layout = args.b_layout or ("nk" if args.precision == "tf32" else "kn")
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    import cupy as cp

    # this GPU's architecture and figures (SMs, throughput: the templates' defaults read them)
    machine = dataclasses.replace(device.machine(), fusion=FUSION, precision=args.precision)
    print(header())
    print(f"repeat {args.repeat} launches x {args.trials} trials (median), CUDA events; "
          f"GB/s = (read + write of the tensor) / time; bars: elementwise >= 0.80 of copy, "
          f"rows >= 0.70; dense 4096^3 >= 0.70 of cuBLAS")
    wrong = 0
    if "dense" in names:
        wrong += dense_table(cp, machine, args)
    if "attention" in names:
        wrong += attention_table(cp, machine, args)
    for name in names:
        if name not in ("dense", "attention"):
            wrong += memory_table(cp, machine, args, name)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
