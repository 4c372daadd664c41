"""find_sparsity: measure how sparse each product's constant weights are and run the layers
whose sparse form is estimated faster as sparse ops (`ir/ops/sparse.py`), their weights
encoded in CSR once, here.

`measure` reads a weight matrix [outputs, reduction] (a MatMul's B transposed, a Conv's
[M, C * kh * kw]): its density (the fraction of nonzeros) and its structure, the most regular
pattern its zeros follow: "dense" (no zeros), "N:M" (at most N nonzeros in every M
consecutive weights along the reduction, M of 4 or 8, N <= M / 2, the groups nearly full:
2:4 is what sparse tensor cores take), "block RxC" (zeros in whole R x C blocks, R outputs by
C reduction elements: 1xk or kx1, k of 2 to 16, the largest), else "unstructured".
`layer_sparsity` measures a MatMul / Gemm / Conv node's constant weights (None for any other
node), which `dnnc inspect` prints for every layer, sparse or not.

The rewrite ("sparse_weights", a layout of `convert_layout`'s table, listed by a target whose
templates compute the sparse ops: llvm): a MatMul(A, B const) or Gemm(A, B const, C const)
(alpha = beta = 1, A not transposed) of float32 becomes SparseDense, a Conv of one group
without dilation (1x1, or a padded, strided k x k window: `_estimated_faster` weighs a 3x3
stride-1 one against Winograd) becomes SparseConv, where `sparse_cycles` (the sparse
template's estimated time) is below `dense_cycles` (the dense templates'), both from what
they do with constants fitted to measurements (bench/cpu_sparse.py): a layer runs sparse
only where that is estimated faster, so 0% and 30% zeros stay dense. It estimates; it never
compiles or times anything, and it never changes what a layer computes (a sparse op's
reference is its dense product).

On a GPU target (`Target.arch`; cuda at precision fp32) the rule is `gpu_sparse_faster`: the
cuda SpMM's estimated time (its multiply-adds at GPU_SPARSE_EFFICIENCY of the GPU's fp32
figure or its bytes, a floor, and a term for its rows' length; fitted to bench/gpu_sparse.py's
times) GPU_MARGIN times under the dense template's (likewise fitted), rows of at most
GPU_MAX_ROW_ENTRIES entries on average, for products and 1x1 convs only (DNNC_SPARSE_GPU=1 takes every product
and conv that fits, windowed ones too, =0 none: for measuring); the sparse op then also takes
the rows' `order` (`row_order`, the SpMM's row swizzle) and slices of GPU_SLICE_DEPTH
columns. At fp16 / bf16 on a GPU the rewrite is `sparse24.py`'s instead: 2:4 weights as
Sparse24Dense / Sparse24ConvNHWC on the sparse tensor cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import infer_node
from ..ir.ops.sparse import encode_csr, row_max
from ..ir.target import Target
from ..ir.types import TensorType, float32, int32
from .conv_costs import conv3x3_costs
from .sparse24 import HALF, sparse24_weights

# -- measuring ---------------------------------------------------------------------------------

N_M_GROUPS = (4, 8)
"""The M of N:M patterns `measure` looks for (2:4 and 4:8 are what hardware takes)."""
N_M_FILL = 0.9
"""An N:M pattern is named where the groups hold at least this share of their N on average."""
BLOCKS = (16, 8, 4, 2)
"""The block lengths of "block 1xk" / "block kx1" patterns, the largest tried first."""


@dataclass(frozen=True)
class Sparsity:
    """What `measure` found in a weight matrix."""

    density: float       # nonzeros / elements
    structure: str       # "dense", "N:M", "block RxC" or "unstructured"

    def __str__(self) -> str:
        return f"{1 - self.density:.0%} zeros, {self.structure}"


def measure(w: np.ndarray) -> Sparsity:
    """The density and structure of weights `w` [outputs, reduction]."""
    nonzero = np.asarray(w) != 0
    density = float(nonzero.mean()) if nonzero.size else 1.0
    if density == 1.0:
        return Sparsity(1.0, "dense")
    rows, cols = nonzero.shape
    for m in N_M_GROUPS:
        if cols % m == 0 and density > 0:
            most = int(nonzero.reshape(rows, cols // m, m).sum(axis=2).max())
            # filled groups only: a matrix of 90% zeros has at most 4 in every 8 by chance
            if most <= m // 2 and density >= N_M_FILL * most / m:
                return Sparsity(density, f"{most}:{m}")
    for k in BLOCKS:
        for shape in ((1, k), (k, 1)):
            if _blocked(nonzero, *shape):
                return Sparsity(density, f"block {shape[0]}x{shape[1]}")
    return Sparsity(density, "unstructured")


def _blocked(nonzero: np.ndarray, r: int, c: int) -> bool:
    """Whether every r x c block of `nonzero` is all zeros or all nonzeros."""
    rows, cols = nonzero.shape
    if rows % r or cols % c or rows * cols == 0 or (r, c) == (rows, cols):
        return False
    blocks = nonzero.reshape(rows // r, r, cols // c, c).sum(axis=(1, 3))
    return bool(np.all((blocks == 0) | (blocks == r * c)))


def layer_weights(node: Node) -> np.ndarray | None:
    """The constant weights of a MatMul, Gemm or Conv (MatMul / Gemm B, Conv W) as a matrix
    [outputs, reduction]; None for other nodes and run-time weights."""
    if node.op not in ("MatMul", "Gemm", "Conv") or len(node.inputs) < 2:
        return None
    w = node.inputs[1]
    if w is None or w.const is None or w.type.rank < 2:
        return None
    c = np.asarray(w.const)
    if node.op == "Conv":
        return c.reshape(c.shape[0], -1)
    if c.ndim != 2:
        return None
    return c if node.op == "Gemm" and node.attrs.get("transB") else c.T


def layer_sparsity(node: Node) -> Sparsity | None:
    """`measure` of the node's constant weights (`layer_weights`), None where it has none."""
    w = layer_weights(node)
    return None if w is None else measure(w)


SLICE_DEPTH = 256
"""Columns a slice of the CSR rows spans (`encode_csr`): the template's block of activations
for a slice, 256 x 32 places x 4 bytes, is 32 KB, inside L1 (bench/cpu_sparse.py: a block of
the whole depth, 768 x 48 floats, 147 KB, past L1 and the stack's scratch (malloc'd a block),
ran 6x slower than one of 16 places)."""
WINDOW_SLICE_DEPTH = 288
"""The most columns a slice of a windowed SparseConv spans where its image is several blocks
of two vectors of places (`slice_depth`): the depth dealt over that many slices evenly, a
block 288 x 32 x 4 bytes = 36 KB at most, inside Zen 5's 48 KB L1 (a 3x3 conv over 64
channels, 576 deep, was 256 + 256 + 64: its last slice's rows set up and their partial sums
kept for ~6 nonzeros each at 90% zeros). 1 thread, shared znver5, CPU time, sparse template
against itself: resnet50's 3x3 convs at 56x56 and 28x28 (2 and 4 slices of 288 where 3 and 5
of 256) 0.88-0.95x the time at 90% zeros, 0.91-0.97x at 70%; at 14x14 (8 of 288, 9 of 256)
even; a 1x1 conv's 4-vector block of 288 deep (73 KB) took 1.2-1.5x the time of 256's, and
the 7x7 image (one 64-place block) 1.08-1.3x: those keep SLICE_DEPTH."""


GPU_SLICE_DEPTH = 128
"""Columns a slice spans on a GPU: the cuda SpMM stages a slice of B (128 columns by 64
places, 34 KB) in shared memory for a block's rows (cuda/sparse.py, `staged`)."""


def slice_depth(depth: int, places: int, windowed: bool, lanes: int) -> int:
    """Columns a slice of a layer's CSR rows spans (`encode_csr`): a windowed SparseConv's
    image of more than one block (places past 4 vectors) in even slices of at most
    WINDOW_SLICE_DEPTH, every other layer SLICE_DEPTH."""
    if not windowed or places <= 4 * lanes:
        return SLICE_DEPTH
    return -(-depth // -(-depth // WINDOW_SLICE_DEPTH))


# -- the cost rule -----------------------------------------------------------------------------

DENSE_MACS_PER_LANE = 1.75
"""Multiply-adds a cycle a float32 lane of the dense templates reaches on a layer, fitted: 28
a cycle at 16 lanes (1 thread, znver5: 1x1 256->64 at 56x56, 51 M in 0.45 ms at ~4 GHz)."""
SPARSE_VECTORS = 2
"""Vectors of places in a block of the sparse template where there are more than 4 (its
default, llvm/sparse.py: fewer places are one block, computed in whole vectors)."""
VECTOR_FMA_CYCLES, ENTRY_CYCLES = 1.0, 0.3
"""Cycles a nonzero costs a block: one per vector of places (its multiply-add, an L1 load)
and its weight's broadcast, column load and address."""
PACK_CYCLES = 2.9
"""Cycles a block's copy of its activations costs per vector of a 1x1 conv's pixels (a
contiguous copy), or per element of a SparseDense's rows (transposed, lane by lane)."""
ROW_CYCLES = 7.0
"""Cycles a row costs a block on each slice besides its nonzeros (its accumulators' set-up,
partial sums, loop, the epilogue's stores). The four fitted together by least relative
squares to bench/cpu_sparse.py --layers (1 thread, znver5, ~4 GHz assumed; 10 layers of
resnet50's, mobilenet_v2's and BERT-base's shapes at 50/70/90% zeros): the median estimate
within 4% of the measured time, 80% of them within 0.82-1.13x, on a shared machine."""
MEMORY_BYTES_PER_CYCLE = 8
"""Weight bytes a cycle from memory (conv_costs': a model's weights leave the caches between
two calls): a dense layer reads 4 bytes a weight, a sparse one 8 a nonzero."""


def dense_cycles(places: int, rows: int, depth: int, lanes: int) -> float:
    """Estimated cycles of the dense product of `places` places (pixels, rows of A) by
    `rows` outputs of `depth` each on a machine of `lanes` float32 lanes."""
    return places * rows * depth / (DENSE_MACS_PER_LANE * lanes) + \
        rows * depth * 4 / MEMORY_BYTES_PER_CYCLE


def sparse_cycles(places: int, rows: int, depth: int, nnz: int, lanes: int,
                  transposed: bool = False, slice_columns: int = SLICE_DEPTH) -> float:
    """Estimated cycles of the sparse template on `nnz` nonzeros in `rows` rows of `depth`
    over `places` places (a SparseDense's rows of A: `transposed`): blocks of places, each
    packing its activations and walking every row's nonzeros, slice by slice (of
    `slice_columns`)."""
    width = places if places <= 4 * lanes else SPARSE_VECTORS * lanes
    blocks = -(-places // width)
    vectors = -(-width // lanes)
    slices = -(-depth // slice_columns)
    per_block = nnz * (VECTOR_FMA_CYCLES * vectors + ENTRY_CYCLES) + \
        rows * slices * ROW_CYCLES + PACK_CYCLES * depth * (width if transposed else vectors)
    return blocks * per_block + (nnz * 8 + rows * slices * 4) / MEMORY_BYTES_PER_CYCLE


MAX_DENSITY = 0.5
"""Weights with more nonzeros than this fraction stay dense whatever the estimate: at 50%
zeros the layers of bench/cpu_sparse.py --layers broke even, and the cost model, fitted to
pruned layers, is not to be trusted far outside them (it called a 3-channel conv with no
zero weight at all faster in CSR)."""


def sparse_faster(places: int, w: np.ndarray, lanes: int, transposed: bool = False) -> bool:
    """Whether the sparse template is estimated faster than the dense one on weights `w`
    [rows, depth] applied at `places` places, on a machine of `lanes` float32 lanes."""
    rows, depth = w.shape
    nnz = int(np.count_nonzero(w))
    return sparse_cycles(places, rows, depth, nnz, lanes, transposed) < \
        dense_cycles(places, rows, depth, lanes)


# -- the GPU's cost rule -----------------------------------------------------------------------

GPU_DENSE_EFFICIENCY = 0.72
"""The fraction of the GPU's fp32 figure (`GPU.fp32_flops`) the dense templates reach on a
layer past GPU_DENSE_FLOOR_S (cuda/dense.py's tiles; fitted with the floor to the dense
times of bench/gpu_sparse.py's 22 layers, H200, session 54: 9.8 to 434 us, rms 21%)."""
GPU_DENSE_FLOOR_S = 12e-6
"""What a dense product costs before its multiply-adds count (a GPU_LAUNCH_S launch, its
split-k reduction, a wave of small tiles): the 1x1 convs of resnet50 at batch 1 took 10 to
17 us for 0.1 GFLOP (fitted, as GPU_DENSE_EFFICIENCY)."""
GPU_SPARSE_EFFICIENCY = 0.105
"""The fraction of the fp32 figure the SpMM (cuda/sparse.py's default configs) reaches per
nonzero's multiply-add past its floor and row term (fitted with them to the best config's
times of the same 44 layer runs, 70% and 90% zeros, batches 1 and 32; rms 28%): 2.7-4.9
TFLOP/s of nonzero multiply-adds at batch 32 at 90% (session 40's staged default: 2.1-2.2 on
BERT-base's products), where the dense templates reach 26-45."""
GPU_SPARSE_FLOOR_S = 8e-6
"""The SpMM's cost before its multiply-adds (its launches, a SparseDense's flag pass and
transpose where unstaged; fitted: 9-12 us at batch 1 for 5 M nonzero multiply-adds)."""
GPU_ROW_ENTRY_S = 30e-9
"""Each entry of an average row: a subwarp runs its row's entries one after another (the
latency of the chain; fitted)."""
GPU_MAX_ROW_ENTRIES = 128
"""Rows of more entries than this on average stay dense whatever the estimate: 205 and 307
(resnet50's 1x1 2048->512, BERT-base's 3072->768 at 90% zeros) ran 0.88-0.93 of dense at
batch 1 and 32 where the fitted estimate said 1.0-1.4 (their long rows, one subwarp's chain
each); 102 (1024->256) ran 1.30."""
GPU_MARGIN = 1.25
"""How much faster the SpMM must be estimated for a layer to go sparse on a GPU: the fit's
error is ~25%, and a pruned model must never run slower than the dense one. With the
constants above no layer of the fit's 44 runs that measured slower than dense is taken (the
closest: BERT-base's 768->768 at batch 1, 0.95 measured, 1.23 estimated), at the cost of a
few that win (resnet50's 1x1 1024->256 at batch 1: 1.31 measured, 1.14 estimated)."""
GPU_LAUNCH_S = 2e-6
"""A launch in a CUDA graph (GPU.md)."""
GPU_FIGURES = (51e12, 2.9e12)
"""(fp32 FLOP/s, copy bytes/s) of the reference GPU (an H100, GPU.md) for a GPU target built
without its figures (`Target.gpu` None)."""


def gpu_dense_seconds(places: int, rows: int, depth: int, flops: float,
                      bandwidth: float) -> float:
    """Estimated seconds of the dense fp32 product on a GPU of `flops` and `bandwidth`."""
    work = 2 * places * rows * depth / (flops * GPU_DENSE_EFFICIENCY)
    moved = 4 * (places * depth + rows * depth + places * rows) / bandwidth
    return max(work, moved) + GPU_DENSE_FLOOR_S


def gpu_sparse_seconds(places: int, rows: int, depth: int, nnz: int, flops: float,
                       bandwidth: float) -> float:
    """Estimated seconds of the SpMM (its default config, as fitted)."""
    work = 2 * places * nnz / (flops * GPU_SPARSE_EFFICIENCY)
    moved = (4 * (places * depth + places * rows) + 8 * nnz) / bandwidth
    return max(work, moved) + GPU_SPARSE_FLOOR_S + nnz / max(rows, 1) * GPU_ROW_ENTRY_S


def gpu_speedup(places: int, rows: int, depth: int, nnz: int, flops: float,
                bandwidth: float) -> float:
    """The SpMM's estimated speed-up over the dense product; 0 where the rows average more
    than GPU_MAX_ROW_ENTRIES entries."""
    if nnz > GPU_MAX_ROW_ENTRIES * rows:
        return 0.0
    return gpu_dense_seconds(places, rows, depth, flops, bandwidth) / \
        gpu_sparse_seconds(places, rows, depth, nnz, flops, bandwidth)


def gpu_sparse_faster(places: int, w: np.ndarray, target: Target) -> bool:
    """Whether the SpMM is estimated GPU_MARGIN times faster than the dense product on
    `target`'s GPU."""
    rows, depth = w.shape
    flops, bandwidth = (target.gpu.fp32_flops, target.gpu.copy_bytes_per_s) \
        if target.gpu is not None else GPU_FIGURES
    nnz = int(np.count_nonzero(w))
    return gpu_speedup(places, rows, depth, nnz, flops, bandwidth) >= GPU_MARGIN


def row_order(starts: np.ndarray) -> np.ndarray:
    """The rows by nonzero count, most first (ties in row order): the GPU template's row
    swizzle (int32 [rows])."""
    counts = starts[:, -1] - starts[:, 0]
    return np.argsort(-counts, kind="stable").astype(np.int32)


# -- the rewrite -------------------------------------------------------------------------------



def _csr_inputs(node: Node, w: np.ndarray, sparsity: Sparsity,
                columns_a_slice: int) -> tuple[list[Value], dict]:
    """The CSR constants of `w` [rows, K] in slices of `columns_a_slice` and the sparse op's
    attributes."""
    values, columns, starts = encode_csr(w, columns_a_slice)
    base = node.inputs[1].name
    consts = [Value(f"{base}.values", TensorType(float32, values.shape), const=values),
              Value(f"{base}.columns", TensorType(int32, columns.shape), const=columns),
              Value(f"{base}.starts", TensorType(int32, starts.shape), const=starts)]
    return consts, {"row_max": row_max(starts), "slice_depth": columns_a_slice,
                    "density": round(sparsity.density, 4),
                    "structure": sparsity.structure}


def _bias(node: Node, n: int) -> Value | None | bool:
    """A Gemm's C as a float32 constant [n] (None when absent; False when it is not one)."""
    if node.op != "Gemm" or len(node.inputs) < 3 or node.inputs[2] is None:
        return None
    c = node.inputs[2]
    if c.const is None or c.type.dtype is not float32 or c.const.size not in (1, n) or \
            (c.const.ndim == 2 and c.const.shape[0] != 1):
        return False
    row = np.ascontiguousarray(np.broadcast_to(np.asarray(c.const).reshape(-1), (n,)))
    return Value(f"{c.name}.row", TensorType(float32, (n,)), const=row)


def _places(node: Node) -> int | None:
    """The places the product's weights are applied at (a symbolic batch counted as 1)."""
    shape = node.outputs[0].type.shape
    dims = shape[:-1] if node.op != "Conv" else (shape[0],) + tuple(shape[2:])
    if any(not isinstance(d, int) for d in dims[1:]):
        return None
    return int(np.prod([d if isinstance(d, int) else 1 for d in dims]))


def _conv_window(node: Node) -> tuple[list, list, list] | None:
    """(kernel_shape, pads, strides) of a Conv that SparseConv computes: 2-D, no dilation,
    one group, explicit pads (or none), a static image; None otherwise."""
    attrs = node.attrs
    w, x = node.inputs[1], node.inputs[0]
    if w.type.rank != 4 or x.type.rank != 4 or (attrs.get("group") or 1) != 1 or \
            attrs.get("auto_pad", "NOTSET") != "NOTSET" or \
            any(v != 1 for v in attrs.get("dilations") or [1, 1]) or \
            not all(isinstance(d, int) for d in x.type.shape[2:]):
        return None
    return [int(d) for d in w.type.shape[2:]], [int(v) for v in attrs.get("pads") or [0] * 4], \
        [int(v) for v in attrs.get("strides") or [1, 1]]


def _window_places(node: Node, window) -> int:
    """The places an image of a windowed SparseConv computes: its output rows by the padded
    width's phase (the template's `phase_width`)."""
    (_, _), (_, left, _, right), (_, sw) = window
    return node.outputs[0].type.shape[2] * -(-(node.inputs[0].type.shape[3] + left + right)
                                             // sw)


def _slice_columns(node: Node, w: np.ndarray, window, target: Target) -> int:
    """`slice_depth` of the layer (a windowed SparseConv's places: `_window_places`);
    GPU_SLICE_DEPTH on a GPU."""
    if target.arch:
        return GPU_SLICE_DEPTH
    windowed = window is not None and window != ([1, 1], [0, 0, 0, 0], [1, 1])
    places = _window_places(node, window) if windowed else 0
    return slice_depth(w.shape[1], places, windowed, max(target.vector_bits // 32, 1))


def _estimated_faster(node: Node, places: int, w: np.ndarray, window, target: Target) -> bool:
    """On a GPU, `gpu_sparse_faster` for a MatMul / Gemm or a 1x1 Conv (never a windowed
    one). Else `sparse_faster` for a MatMul / Gemm (A's rows transposed) or a 1x1 Conv; for a
    windowed Conv, the sparse template over its padded-width places, its planes' padding and
    its output's read-back counted, against the least of `conv_costs`' direct and Winograd
    estimates for a 3x3 one (convert_layout would choose that), else the direct conv's."""
    unit = window is None or window == ([1, 1], [0, 0, 0, 0], [1, 1])
    if target.arch:   # a GPU: by its rule products and 1x1 convs only; forced, any conv
        switch = os.environ.get("DNNC_SPARSE_GPU")
        return switch != "0" and (switch == "1" or unit and gpu_sparse_faster(
            places, w, target))
    lanes = max(target.vector_bits // 32, 1)
    if unit:
        return sparse_faster(places, w, lanes, node.op != "Conv")
    (kh, kw), (top, left, bottom, right), (sh, sw) = window
    n, m, oh, ow = node.outputs[0].type.shape
    n = n if isinstance(n, int) else 1
    c = w.shape[1] // (kh * kw)
    h, wid = node.inputs[0].type.shape[2:]
    hp, wp = h + top + bottom, wid + left + right
    nnz = int(np.count_nonzero(w))
    sparse = n * sparse_cycles(_window_places(node, window), m, w.shape[1], nnz, lanes,
                               slice_columns=_slice_columns(node, w, window, target)) + \
        n * (c * hp * wp + m * oh * ow) / lanes * PACK_CYCLES
    if (kh, kw, sh, sw) == (3, 3, 1, 1):
        dense = min(conv3x3_costs(n, c, m, oh, ow, target.panel("pack_conv"),
                                  target.vector_bits, 1).values())
    else:
        dense = n * dense_cycles(oh * ow, m, w.shape[1], lanes)
    return sparse < dense


def sparse_weights(graph: Graph, node: Node, users, target: Target):
    """MatMul / Gemm / Conv with constant float32 weights -> SparseDense / SparseConv
    where `_estimated_faster` holds and at most MAX_DENSITY of the weights are nonzero, on
    a GPU with the rows' `order` (convert_layout's rule signature: the new node and no
    nodes taken over)."""
    w = layer_weights(node)
    if w is not None and target.arch and target.precision in HALF:   # sparse tensor cores
        return sparse24_weights(node, w, _places(node), float(np.count_nonzero(w)) / w.size,
                                target)
    if w is None or target.precision != "fp32" or node.inputs[0].type.dtype is not float32 or \
            node.outputs[0].type.dtype is not float32:
        return None
    if node.op == "Gemm" and (node.attrs.get("transA") or node.attrs.get("alpha", 1.0) != 1.0
                              or node.attrs.get("beta", 1.0) != 1.0):
        return None
    window = _conv_window(node) if node.op == "Conv" else None
    if node.op == "Conv" and window is None:
        return None
    places = _places(node)
    if places is None or np.count_nonzero(w) > MAX_DENSITY * w.size or \
            not _estimated_faster(node, places, w, window, target):
        return None
    consts, attrs = _csr_inputs(node, w, measure(w), _slice_columns(node, w, window, target))
    if node.op == "Conv":
        op, attrs["oc"] = "SparseConv", int(w.shape[0])
        attrs["kernel_shape"], attrs["pads"], attrs["strides"] = window
        bias = node.inputs[2] if len(node.inputs) > 2 else None
    else:
        op, attrs["n"] = "SparseDense", int(w.shape[0])
        bias = _bias(node, int(w.shape[0]))
        if bias is False:
            return None
    inputs = [node.inputs[0]] + consts + ([bias] if bias is not None else [])
    if target.arch:   # the GPU template's row swizzle
        starts = consts[2].const
        inputs = inputs[:5] + [None] * (5 - len(inputs)) + [Value(
            f"{node.inputs[1].name}.order", TensorType(int32, (len(starts),)),
            const=row_order(starts))]
    types, _, full = infer_node(op, inputs, attrs, 1, node.name)
    if types[0] != node.outputs[0].type:
        return None
    return Node(op, inputs, node.outputs, full, node.name), []
