"""The 2:4 rewrite of "sparse_weights" (`find_sparsity.sparse_weights` calls it on a GPU
target at precision fp16 or bf16): a product whose constant weights hold at most 2
nonzeros in every 4 consecutive elements of the reduction (`ir/ops/sparse.py`'s
`fits_2of4`: what `dnnc sparsify --pattern 2:4` writes) becomes Sparse24Dense, its weights
compressed and their metadata built once, here (`encode_2of4`), where `sparse24_faster`
estimates the sparse tensor cores' kernel (cuda/sparse24.py) faster than the dense one:

- MatMul(A, B const) of A [..., K] and B [K, N];
- Gemm(A, B const, C const?) with alpha = beta = 1 and A not transposed (C, of N or 1 x N,
  the op's bias);
- a 1x1 Conv of one group, unpadded, stride 1, no dilation, as Transpose(NCHW -> NHWC) ->
  Sparse24Dense over the channels -> Transpose(back) (the bias the op's), whose
  Transposes `sink_transposes` (nhwc_conv's finish) cancels against the channels-last
  convolutions around it;
- any other 2-D Conv of one group (a k x k window, strides, pads, dilations) whose weights
  fit 2:4 along k = (ky, kx, c) (input channels fastest, as `dnnc sparsify` lays its groups:
  the OHWI weights as a matrix [M, kh kw C]) as Transpose -> Sparse24ConvNHWC (an implicit
  GEMM, the channels-last conv's) -> Transpose.

Grouped and depthwise convs stay dense. The rule is a roofline of both kernels: their multiply-adds at a fraction of the
tensor cores' figure (GPU_DENSE_TENSOR_EFFICIENCY of the dense one, GPU_SPARSE24_EFFICIENCY of
the sparse one, twice as fast) and their bytes (the 2:4 weights half the values and an
eighth for the metadata), the sparse one GPU_SPARSE24_MARGIN times faster. DNNC_SPARSE24=1
takes every product that fits instead (the fuzzer's small layers, which the rule keeps
dense), =0 none. It estimates; it
never compiles or times anything, and it never changes what a layer computes: the op's
reference is the product on the decoded weights. It must never import a backend.
"""

from __future__ import annotations

import os

import numpy as np

from ..ir.graph import Node, Value
from ..ir.ops.packed import NCHW_OF_NHWC, NHWC_OF_NCHW
from ..ir.ops.registry import infer_node
from ..ir.ops.sparse import encode_2of4, fits_2of4
from ..ir.target import Target
from ..ir.types import TensorType, bfloat16, float16, uint32

HALF = {"fp16": float16, "bf16": bfloat16}
"""The precisions the rewrite serves -> the type of the kept values (the activations' too:
store_half has stored the model so)."""

GPU_DENSE_TENSOR_EFFICIENCY = 0.6
"""The fraction of the tensor cores' fp16 / bf16 figure (twice `GPU.tensor_flops`) the dense
templates reach on a large product: on an H200 (mma.py's WGMMA_DEFAULT) the wgmma default
ran 0.55-0.73 of cuBLAS, which reaches about 0.95 of the figure."""
GPU_SPARSE24_EFFICIENCY = 0.25
"""The fraction of the sparse tensor cores' figure (twice the dense one) the 2:4 template
reaches. Measured (H200, fp16 stored, bench/gpu_sparse24.py --no-variants, stop 37): against
dnnc's dense fp16 kernels at BERT-base b8's three products and resnet50 b32's 1x1 and 3x3
convs, 2:4 / dense 0.82 to 1.80, geomean 1.21 over 15 layers (the template is mma.sync.sp,
the dense default wgmma): 0.6 / (2 x 1.21) = 0.25 (was an estimate of 0.4, which sent
layers to 2:4 that ran slower). At this value no compute-bound layer takes 2:4; a product
bound by its weights' bytes (batch 1) still may (its time not measured). Session 45's
warpgroup product at its tile rule (k tiles of 64, staged; H200, bench/gpu_sparse24.py
--all): 1.15 (BERT b8 768->768), 1.18 and 1.12 (resnet50 b32 1x1 1024->256, 256->64),
geomean 1.15: 0.6 / (2 x 1.15) = 0.26, so 0.25 holds."""
GPU_SPARSE24_MARGIN = 1.1
"""How much faster the 2:4 kernel must be estimated for a layer to take it."""
GPU_TENSOR_FIGURES = (400e12, 2.9e12)
"""(tf32 tensor FLOP/s, copy bytes/s) of the reference GPU (an H100, GPU.md) for a target
built without its figures."""
GPU_LAUNCH_S = 2e-6


def product_seconds(places: int, rows: int, depth: int, tensor_flops: float,
                    bandwidth: float, sparse: bool, reads: int | None = None) -> float:
    """Estimated seconds of the fp16 product of `places` places by `rows` outputs of
    `depth`, dense or 2:4 sparse, on a GPU of `tensor_flops` (tf32) and `bandwidth`;
    `reads`: the activations it reads (default places x depth; a conv's image about once,
    its patches overlapping in the caches)."""
    rate = 2 * tensor_flops * (2 * GPU_SPARSE24_EFFICIENCY if sparse else
                               GPU_DENSE_TENSOR_EFFICIENCY)
    weights = rows * depth * (1 + 1 / 8) if sparse else 2 * rows * depth
    reads = places * depth if reads is None else reads
    moved = 2 * (reads + places * rows) + weights
    return max(2 * places * rows * depth / rate, moved / bandwidth) + GPU_LAUNCH_S


def sparse24_faster(places: int, rows: int, depth: int, target: Target,
                    reads: int | None = None) -> bool:
    """Whether the 2:4 kernel is estimated GPU_SPARSE24_MARGIN times faster than the dense
    one on `target`'s GPU (`reads` as `product_seconds`')."""
    flops, bandwidth = (target.gpu.tensor_flops, target.gpu.copy_bytes_per_s) \
        if target.gpu is not None else GPU_TENSOR_FIGURES
    times = [product_seconds(places, rows, depth, flops, bandwidth, sparse, reads)
             for sparse in (True, False)]
    return GPU_SPARSE24_MARGIN * times[0] < times[1]


def _unit_conv(node: Node) -> bool:
    """A 1x1 Conv of one group, unpadded, stride 1, no dilation, on a static NCHW image."""
    a, w = node.attrs, node.inputs[1]
    x = node.inputs[0]
    return w.type.rank == 4 and tuple(w.type.shape[2:]) == (1, 1) and x.type.rank == 4 and \
        (a.get("group") or 1) == 1 and a.get("auto_pad", "NOTSET") == "NOTSET" and \
        all(v == 0 for v in a.get("pads") or [0]) and \
        all(v == 1 for v in (a.get("strides") or [1]) + (a.get("dilations") or [1])) and \
        all(isinstance(d, int) for d in x.type.shape[1:])


def _plain_conv(node: Node) -> bool:
    """A 2-D Conv of one group with explicit pads (or none) on a static NCHW image."""
    a, w, x = node.attrs, node.inputs[1], node.inputs[0]
    return w.type.rank == 4 and x.type.rank == 4 and (a.get("group") or 1) == 1 and \
        a.get("auto_pad", "NOTSET") == "NOTSET" and \
        all(isinstance(d, int) for d in x.type.shape[1:])


def conv_matrix(node: Node) -> np.ndarray:
    """A Conv's constant weights [M, C, kh, kw] as the channels-last conv reads them: OHWI
    as a matrix [M, kh kw C] (input channels fastest)."""
    w = np.asarray(node.inputs[1].const)
    return w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1)


def _bias(node: Node, n: int) -> Value | None | bool:
    """The bias [n] of a Gemm's C or a Conv's B (None when absent; False when it is not a
    constant of n or 1 x n)."""
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return None
    c = node.inputs[2]
    if c.const is None or c.const.size not in (1, n) or c.const.ndim > 2 or \
            (c.const.ndim == 2 and c.const.shape[0] != 1):
        return False
    row = np.ascontiguousarray(np.broadcast_to(np.asarray(c.const).reshape(-1), (n,)))
    return Value(f"{c.name}.row", TensorType(c.type.dtype, (n,)), const=row)


def sparse24_weights(node: Node, w: np.ndarray, places: int | None, density: float,
                     target: Target):
    """The 2:4 rewrite of MatMul / Gemm / Conv `node` of weights `w` [N, K] (a Conv's in
    `layer_weights`' order) applied at `places` (None: not static) at the target's
    precision; None where it does not apply or is not estimated faster (convert_layout's
    rule result otherwise)."""
    half = HALF.get(target.precision)
    x = node.inputs[0]
    if half is None or x.type.dtype is not half or node.outputs[0].type.dtype is not half or \
            places is None:
        return None
    if node.op == "Gemm" and (node.attrs.get("transA") or node.attrs.get("alpha", 1.0) != 1.0
                              or node.attrs.get("beta", 1.0) != 1.0):
        return None
    if node.op == "MatMul" and x.type.rank < 2 or node.op == "Conv" and not _plain_conv(node):
        return None
    windowed = node.op == "Conv" and not _unit_conv(node)
    if windowed:
        w = conv_matrix(node)
    n, k = w.shape
    if not fits_2of4(w):
        return None
    # a conv reads its image about once (its windows' patches overlap in the caches), a
    # strided 1x1 one only the pixels it takes
    reads = min(places * k, int(np.prod([d if isinstance(d, int) else 1
                                          for d in x.type.shape]))) \
        if node.op == "Conv" else None
    switch = os.environ.get("DNNC_SPARSE24")
    if switch == "0" or switch != "1" and not sparse24_faster(places, n, k, target, reads):
        return None
    bias = _bias(node, n) if node.op != "MatMul" else None
    if bias is False:
        return None
    values, meta = encode_2of4(np.asarray(w, np.float32), half)
    base = node.inputs[1].name
    inputs = [x, Value(f"{base}.kept", TensorType(half, values.shape), const=values),
              Value(f"{base}.meta", TensorType(uint32, meta.shape), const=meta)] + \
        ([bias] if bias is not None else [])
    attrs = {"k": k, "density": round(density, 4), "structure": "2:4"}
    if node.op != "Conv":
        types, _, full = infer_node("Sparse24Dense", inputs, dict(attrs, n=n), 1, node.name)
        if types[0] != node.outputs[0].type:
            return None
        return Node("Sparse24Dense", inputs, node.outputs, full, node.name), []
    op, attrs = ("Sparse24ConvNHWC", dict(attrs, oc=n, **_window(node))) if windowed else \
        ("Sparse24Dense", dict(attrs, n=n))
    return _channels_last(node, op, inputs, attrs, half)


def _window(node: Node) -> dict:
    """A Conv's window attributes, its kernel shape read from its weights."""
    a = node.attrs
    return {"kernel_shape": [int(d) for d in node.inputs[1].type.shape[2:]],
            "pads": list(a.get("pads") or [0] * 4), "strides": list(a.get("strides") or [1, 1]),
            "dilations": list(a.get("dilations") or [1, 1])}


def _channels_last(node: Node, op: str, inputs: list, attrs: dict, half):
    """Transpose(x to NHWC) -> `op` -> Transpose(back to the Conv's NCHW output)."""
    x, out = node.inputs[0], node.outputs[0]
    xt = Value(f"{x.name}.nhwc", TensorType(half, tuple(x.type.shape[i] for i in NHWC_OF_NCHW)))
    inputs = [xt] + inputs[1:]
    types, _, full = infer_node(op, inputs, attrs, 1, node.name)
    yt = Value(f"{out.name}.nhwc", types[0])
    if tuple(yt.type.shape[i] for i in NCHW_OF_NHWC) != tuple(out.type.shape):
        return None
    return [Node("Transpose", [x], [xt], {"perm": list(NHWC_OF_NCHW)}, f"{node.name}.in"),
            Node(op, inputs, [yt], full, node.name),
            Node("Transpose", [yt], [out], {"perm": list(NCHW_OF_NHWC)}, f"{node.name}.out")], []
