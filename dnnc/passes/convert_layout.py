"""convert_layout: rewrite ops into the layouts a target's kernels read fastest, converting
constant weights once at compile time.

A table of rewrites keyed by layout name; a target lists the layouts it wants
(`Target.layouts`, declared in the target registry), so this pass never reads a target's name.
"pack_dense": a MatMul or Gemm whose B is a constant becomes MatMulPacked, its B repacked into
NR-column panels that the dense micro-kernel streams contiguously (GotoBLAS's packed B, done
once instead of per call); at precision bf16, rounded to bf16 in pairs along K (`pack_pairs`,
MatMulPacked's precision "bf16"). A MatMul whose product only an Add of a constant bias over the last
axis reads takes that bias as MatMulPacked's C (simplify already made the 2-D case a Gemm; an
N-D A has no ONNX op with a bias), so the dense kernel adds it in its epilogue. "pack_conv": a
2-D Conv with constant weights (any group but depthwise) becomes ConvPacked, its weights in
the [channel block, C / group, kh, kw, NR] order the conv template's micro-kernel reads as
one vector per step, a grouped conv's blocks per group; at precision bf16 those of an
ungrouped conv, or of a grouped one of an even number of channels a group, rounded to bf16 in
pairs along input channels (`pack_conv_pairs`, ConvPacked's precision "bf16"). "nhwc_conv" (cuda at a reduced
precision: the tensor cores' implicit GEMM copies a patch's channels 16 bytes at a time): an
ungrouped or depthwise 2-D Conv with constant weights whose channels fill whole 16-byte
chunks becomes Transpose(NCHW -> NHWC) -> ConvNHWC (weights OHWI, once) -> Transpose(back);
an ungrouped one of fewer or other channels (a stem's 3) reads its input padded with zero
channels to whole chunks (Pad after the Transpose; zero weights for them: 8 channels of 3
at fp16 is 2.7x the products, on tensor cores, where the NCHW kernel gathered patches
element by element: resnet18's stem at b32 took 0.73 ms, 40% of the model's kernels;
a strided stem whose patches copy fewer chunks so, as resnet's 7x7/2 at fp16 / bf16, reads
its input's space to depth instead: `_space_to_depth`, FLOAT_S2D_MOST), and then
`sink_transposes` moves the Transposes through the elementwise ops between convolutions
and cancels the inverse pairs, so that a chain of convolutions (resnet's, mobilenet's) runs
channels-last with Transposes only at its edges (pools, reshapes, the model's inputs and
outputs). On an image of one pixel (squeeze-and-excitation's 1x1 convs of
4 or 6 channels, through the registers) no channel is padded: there a Transpose moves
nothing (`sink_transposes` makes it a Reshape or cancels it). A grouped conv (not
depthwise) whose channels a group fill whole 16-byte chunks (RegNet's 8 at fp16) converts as
well (the tensor-core conv runs one product a group); one whose do not (ResNeXt's 4 at fp16)
has no channels-last kernel and stays NCHW, and so do the convs next to it through
elementwise ops only. The same layout makes a 2-D QuantizedConvPacked (at any precision: its products are
integers) Transpose -> [Pad of its channels to whole 16-byte chunks of int8] ->
QuantizedConvNHWC (weights OHWI and their sums at each tap, once) -> Transpose
(`_nhwc_int8_conv`), so a QDQ CNN's int8 values run channels-last between its convolutions
(sink_transposes carries them through the per-tensor QuantizeLinear / DequantizeLinear and the
float residual Adds between); a strided one whose patches copy fewer chunks so (a stem: 7x7 of
3 channels, stride 2) reads its input's space to depth instead, a stride-1 conv of s x s times
the channels (`_space_to_depth`). "winograd_conv" (llvm, before "pack_conv"): a 3x3 stride-1 Conv
(`winograd_applies`) where Winograd's F(m x m, 3x3) is estimated faster than the direct conv
(`winograd_tile`, the tile m of the least estimate, `conv_costs`) becomes ConvWinograd, its
filters transformed once here (at bf16 rounded to bf16 in pairs of input channels, F(2x2)
only). "sparse_weights" (llvm and cuda, first): a product whose
constant weights are sparse enough that its sparse op is estimated faster becomes
SparseDense / SparseConv, its weights in CSR (`find_sparsity.py`). "tf32_dense" (cuda at tf32: its
tensor-core tiles hold 32-bit operands K-major, and cp.async copies a B stored [k, n] only
through registers, transposed): a MatMul whose B is a 2-D float32 constant becomes
MatMulPacked with panels of one column, B^T [n, K, 1] (K-major), rounded to tf32 once
(`round_tf32`, as the tiles would round it: the same products). "int8_dense_rows" (cuda: its
integer tensor-core tiles hold both operands K-major, and the 4-byte groups of columns
`pack_groups` makes went through registers a word at a time): a QuantizedDense of at least
DENSE_ROWS_MIN rows (static) and no weight zero point takes its weights in rows
(`pack_rows`: [N, K] padded to 16 bytes, copied by cp.async). A rewrite keeps the
output Value of the last node it replaces, so its users are untouched.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import CompileError
from ..ir.graph import Graph, Node, Value
from ..ir.ops.linalg import PACKED_PRECISIONS, pack_pairs, pack_panels
from ..ir.ops.packed import (CHUNK_BYTES, NHWC_OF_NCHW, NCHW_OF_NHWC, channels_fill_chunks,
                              pack_conv_pairs, pack_conv_weights, round_tf32)
from ..ir.ops.quantized import dense_weights, pack_rows, tap_sums, unpack_conv_groups
from ..ir.ops.winograd import winograd_weights
from ..ir.ops.registry import infer_node
from ..ir.target import Target
from ..ir.types import FLOAT_DTYPES, TensorType, bfloat16, float32, int8, int32, int64
from .conv_costs import conv3x3_costs
from .find_sparsity import sparse_weights
from .sink_transposes import positionwise, sink_transposes

PAIRED = tuple(p for p in PACKED_PRECISIONS if p != "fp32")
"""Target precisions at which "pack_dense" and "pack_conv" pack weights in bf16 pairs
(MatMulPacked's and ConvPacked's precision): a target whose layouts include them computes
those products in bf16 (llvm)."""

def _pack_dense(graph: Graph, node: Node, users, target: Target):
    """MatMul(A, B const) / Gemm(A, B const, C) -> MatMulPacked(A, panels(B), C);
    MatMul(A, B const) + bias -> MatMulPacked(A, panels(B), bias) when the Add is the
    product's only reader and the bias is a constant over the last axis (N,), (1, .., N)."""
    if node.op not in ("MatMul", "Gemm"):
        return None
    a, b = node.inputs[0], node.inputs[1]
    if b is None or b.const is None or b.type.rank != 2 or a.type.rank < 2 or \
            a.type.dtype is not float32:
        return None
    attrs = {"n": 0, "alpha": 1.0, "beta": 1.0}
    weights = b.const
    bias = None
    add = _bias_add(graph, node, users) if node.op == "MatMul" else None
    outputs = node.outputs
    if add is not None:
        add, bias = add
        outputs = add.outputs
    if node.op == "Gemm":
        if node.attrs["transA"]:
            return None
        if node.attrs["transB"]:
            weights = weights.T
        attrs["alpha"], attrs["beta"] = node.attrs["alpha"], node.attrs["beta"]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
    attrs["n"] = int(weights.shape[1])
    if target.precision in PAIRED:
        # bf16 products: B rounded once here, in the pairs along K the kernel multiplies
        packed = pack_pairs(np.asarray(weights), target.panel("pack_dense"))
        attrs["precision"] = target.precision
    else:
        packed = pack_panels(np.asarray(weights), target.panel("pack_dense"))
    dtype = bfloat16 if "precision" in attrs else float32
    pv = Value(f"{b.name}.packed", TensorType(dtype, packed.shape), const=packed)
    inputs = [a, pv] + ([bias] if bias is not None else [])
    types, _, full = infer_node("MatMulPacked", inputs, attrs, 1, node.name)
    if types[0] != outputs[0].type:
        return None
    return Node("MatMulPacked", inputs, outputs, full, node.name), [add] if add else []


def _tf32_dense(graph: Graph, node: Node, users, target: Target):
    """MatMul(A, B const [k, n]) at tf32 -> MatMulPacked(A, round_tf32(B^T) as [n, K, 1])."""
    if node.op != "MatMul" or target.precision != "tf32" or \
            os.environ.get("DNNC_STORE_TF32") == "0":   # (store_tf32's A/B switch)
        return None
    a, b = node.inputs
    if b.const is None or b.type.rank != 2 or a.type.rank < 2 or a.type.dtype is not float32 \
            or b.type.dtype is not float32:
        return None
    k, n = b.const.shape
    column_panels = round_tf32(np.ascontiguousarray(np.asarray(b.const).T)).reshape(n, k, 1)
    pv = Value(f"{b.name}.tf32_kn", TensorType(float32, column_panels.shape),
               const=column_panels)
    types, _, full = infer_node("MatMulPacked", [a, pv], {"n": int(n)}, 1, node.name)
    if types[0] != node.outputs[0].type:
        return None
    return Node("MatMulPacked", [a, pv], node.outputs, full, node.name), []


DENSE_ROWS_MIN = 16
"""Products of fewer rows keep the groups: cuda runs them as a dp4a GEMV (`cuda_int8_gemv`),
a warp reading whole 64-byte rows of a panel."""


def _int8_dense_rows(graph: Graph, node: Node, users, target: Target):
    """QuantizedDense(a, za, W in groups, ...) of at least DENSE_ROWS_MIN static rows, no
    w_zero_point -> the same with W in rows (`pack_rows`)."""
    if node.op != "QuantizedDense" or len(node.inputs) > 7 and node.inputs[7] is not None:
        return None
    a, w = node.inputs[0], node.inputs[2]
    static = all(isinstance(d, int) for d in a.type.shape)
    if w.const is None or w.type.rank != 4 or not static or \
            int(np.prod(a.type.shape[:-1])) < DENSE_ROWS_MIN:
        return None
    packed = pack_rows(dense_weights(np.asarray(w.const), a.type.shape[-1], node.attrs["n"]))
    wv = Value(f"{w.name}.rows", TensorType(int8, packed.shape), const=packed)
    inputs = list(node.inputs)
    inputs[2] = wv
    return Node("QuantizedDense", inputs, node.outputs, dict(node.attrs), node.name), []


def _bias_add(graph: Graph, node: Node, users):
    """(the Add, its bias as a 1-D constant of N) when the product of MatMul `node` is read
    only by an Add of a constant that broadcasts over its last axis without growing it."""
    product = node.outputs[0]
    readers = users.get(product, [])
    if len(readers) != 1 or readers[0].op != "Add" or any(v is product for v in graph.outputs):
        return None
    add = readers[0]
    bias = add.inputs[1] if add.inputs[0] is product else add.inputs[0]
    if bias is product or bias.const is None or add.outputs[0].type != product.type or \
            bias.type.dtype is not product.type.dtype:
        return None
    c, n = np.asarray(bias.const), product.type.shape[-1]
    if c.ndim > product.type.rank or any(d != 1 for d in c.shape[:-1]) or \
            (c.ndim and c.shape[-1] not in (1, n)):
        return None
    c = np.ascontiguousarray(np.broadcast_to(c.reshape(-1), (n,)))
    return add, Value(f"{bias.name}.row", TensorType(bias.type.dtype, c.shape), const=c)


def _pack_conv(graph: Graph, node: Node, users, target: Target):
    """Conv(x, W const, B) (2-D, float32, not depthwise) -> ConvPacked(x, blocks(W), B), a
    grouped conv's weights in blocks per group."""
    if node.op != "Conv":
        return None
    x, w = node.inputs[0], node.inputs[1]
    if w is None or w.const is None or w.type.rank != 4 or x.type.dtype is not float32:
        return None
    oc, cg = int(w.const.shape[0]), int(w.const.shape[1])
    group = node.attrs.get("group") or 1
    if group > 1 and cg == 1 and oc == group:
        return None   # depthwise: one filter per channel, read unpacked by its template
    panel = target.panel("pack_conv")
    if group == 1:
        # a layer of at most one vector of channels is packed one vector wide: two would
        # compute zeros in half the accumulators
        nr = panel if 2 * oc > panel else panel // 2
    else:
        # blocks never straddle groups, so a group's last block is padded: the width that
        # pads least, the wider on a tie (ShuffleNet's 68 channels a group: 5 blocks of 16,
        # 80 channels computed, against 3 of 32, 96); a quarter panel where that is a
        # 256-bit vector (AVX-512): RegNet's 8 channels a group in blocks of 8, not 16 with
        # 8 lanes of zeros, took its grouped 3x3 convs from 0.44 to 0.38 ms (48 channels at
        # 56x56) and 0.25 to 0.20 (104 at 28x28), 1 thread, znver4, CPU time
        mg = oc // group
        widths = (panel, panel // 2) + ((panel // 4,) if panel // 4 >= 8 else ())
        nr = min(widths, key=lambda b: -(-mg // b) * b)
    attrs = dict(node.attrs, oc=oc,
                 kernel_shape=list(node.attrs.get("kernel_shape") or w.const.shape[2:]))
    if target.precision in PAIRED and (group == 1 or cg % 2 == 0):
        # bf16 products: the weights rounded once here, in pairs along input channels (a
        # group's channels even, so that the image's pairs never straddle two groups)
        packed = pack_conv_pairs(np.asarray(w.const), nr, group)
        attrs["precision"] = target.precision
    else:
        packed = pack_conv_weights(np.asarray(w.const), nr, group)
    dtype = bfloat16 if "precision" in attrs else float32
    pv = Value(f"{w.name}.packed", TensorType(dtype, packed.shape), const=packed)
    inputs = [x, pv] + list(node.inputs[2:])
    types, _, full = infer_node("ConvPacked", inputs, attrs, 1, node.name)
    if types[0] != node.outputs[0].type:
        return None
    return Node("ConvPacked", inputs, node.outputs, full, node.name), []


def winograd_applies(node: Node) -> bool:
    """Whether Conv `node` is one Winograd's F(m x m, 3x3) computes: 2-D, 3x3, stride 1, no
    dilation, one group, float32, constant weights, a static output image (the batch may be
    symbolic: the estimate then weighs one image)."""
    if node.op != "Conv":
        return False
    x, w = node.inputs[0], node.inputs[1]
    if w is None or w.const is None or w.type.rank != 4 or \
            x.type.dtype is not float32 or node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return False
    kh, kw = w.const.shape[2:]
    out = node.outputs[0].type.shape[2:]
    return (kh, kw) == (3, 3) and (node.attrs.get("group") or 1) == 1 and \
        all(v == 1 for v in (node.attrs.get("strides") or [1, 1]) +
            (node.attrs.get("dilations") or [1, 1])) and \
        all(isinstance(d, int) for d in out)


def winograd_tile(node: Node, target: Target) -> int | None:
    """The output tile m Conv `node` (one `winograd_applies` takes) is computed by, or None to
    keep it direct: the least of the templates' estimated times (`conv_costs.conv3x3_costs`)."""
    oc, c = node.inputs[1].const.shape[:2]
    n, _, oh, ow = node.outputs[0].type.shape
    costs = conv3x3_costs(n if isinstance(n, int) else 1, c, oc, oh, ow,
                          target.panel("pack_conv"), target.vector_bits, target.threads,
                          target.precision, target.fma_ports)
    return min(costs, key=costs.get)


def _winograd_conv(graph: Graph, node: Node, users, target: Target):
    """Conv(x, W const 3x3, B) -> ConvWinograd(x, G W G^T, B) where `winograd_applies` and
    `winograd_tile` chooses a tile: the filters transformed once, here, in the channel blocks
    of the conv panel's width; at bf16 (`PAIRED`) rounded to bf16 in pairs of input channels,
    the products in the transformed domain of bf16 operands. At another reduced precision
    (cuda's) the conv stays for "pack_conv"."""
    if target.precision not in ("fp32",) + PAIRED or not winograd_applies(node):
        return None
    tile = winograd_tile(node, target)
    if tile is None:
        return None
    w = node.inputs[1]
    pairs = target.precision in PAIRED
    u = winograd_weights(np.asarray(w.const), target.panel("pack_conv"), tile, pairs)
    uv = Value(f"{w.name}.winograd", TensorType(bfloat16 if pairs else float32, u.shape),
               const=u)
    attrs = dict(node.attrs, oc=int(w.const.shape[0]), kernel_shape=[3, 3])
    if pairs:
        attrs["precision"] = target.precision
    inputs = [node.inputs[0], uv] + list(node.inputs[2:])
    types, _, full = infer_node("ConvWinograd", inputs, attrs, 1, node.name)
    if types[0] != node.outputs[0].type:
        return None
    return Node("ConvWinograd", inputs, node.outputs, full, node.name), []


def _channels_last_operands(x: Value, node: Node, ohwi: np.ndarray, attrs: dict,
                            channels: int, padded: int, chunk: int, folded
                            ) -> tuple[list[Node], Value, np.ndarray, dict]:
    """(the edge nodes, the channels-last input, the OHWI weights with as many more zero
    channels as the input got, the attrs) of conv `node`: its input `x` of `channels`
    channels transposed and padded to `padded`, or where `_space_to_depth` `folded` it (its
    edge, input, weights and attrs) that input padded to whole chunks of `chunk` elements."""
    if folded is None:
        edge, xt = _channels_last_input(x, node.name, channels, padded)
    else:
        edge, xt, ohwi, attrs = folded
        channels = ohwi.shape[3]
        padded = -(-channels // chunk) * chunk
        more, xt = _padded_channels(xt, node.name, channels, padded)
        edge = edge + more
    ohwi = np.ascontiguousarray(np.pad(ohwi, [(0, 0)] * 3 + [(0, padded - channels)]))
    return edge, xt, ohwi, attrs


def _channels_last_input(x: Value, name: str, channels: int, padded: int
                         ) -> tuple[list[Node], Value]:
    """(the nodes, the value) of NCHW `x` made channels-last: a Transpose, then a Pad of its
    channels with zeros up to `padded` where that is more than `channels`."""
    xt = Value(f"{x.name}.nhwc", TensorType(x.type.dtype, tuple(
        x.type.shape[i] for i in NHWC_OF_NCHW)))
    edge = [Node("Transpose", [x], [xt], {"perm": list(NHWC_OF_NCHW)}, f"{name}.in")]
    more, xt = _padded_channels(xt, name, channels, padded)
    return edge + more, xt


def _padded_channels(xt: Value, name: str, channels: int, padded: int
                     ) -> tuple[list[Node], Value]:
    """(the nodes, the value) of channels-last `xt`'s channels padded with zeros up to
    `padded`: a Pad where that is more than `channels`, else nothing."""
    if padded == channels:
        return [], xt
    pads = Value(f"{name}.channel_pads", TensorType(int64, (8,)),
                 const=np.array([0] * 7 + [padded - channels], np.int64))
    xp = Value(f"{xt.name}{padded}", TensorType(xt.type.dtype, xt.type.shape[:3] + (padded,)))
    return [Node("Pad", [xt, pads], [xp], {"mode": "constant"}, f"{name}.pad")], xp


def _nhwc_conv(graph: Graph, node: Node, users, target: Target):
    """Conv(x, W const, B) (2-D; grouped ones as `_nchw_grouped` says) at a reduced precision ->
    Transpose(x) -> [Pad of its channels to whole chunks, one group only and not on a
    one-pixel image] -> ConvNHWC(., OHWI(W), B) -> Transpose(back), a strided stem on its
    input's space to depth where that copies at most FLOAT_S2D_MOST of the chunks
    (`_space_to_depth`: Pad, Reshape, Transpose, Reshape -> [Pad of its channels] ->
    ConvNHWC of stride 1); a QuantizedConvPacked at any precision: `_nhwc_int8_conv`. At
    tf32 a one-group conv's weights are rounded to tf32 here (`round_tf32`, as its
    tensor-core tiles would round them: they then need not)."""
    if node.op == "QuantizedConvPacked":
        return _nhwc_int8_conv(node)
    if node.op != "Conv" or target.precision == "fp32":
        return None
    x, w = node.inputs[0], node.inputs[1]
    if w is None or w.const is None or w.type.rank != 4 or x.type.rank != 4 or \
            x.type.dtype not in FLOAT_DTYPES or _nchw_grouped(node):
        return None
    channels, element = x.type.shape[1], np.dtype(x.type.dtype.np).itemsize
    one_pixel = tuple(x.type.shape[2:]) == (1, 1)
    if not isinstance(channels, int) or _beside_grouped(x, node.outputs[0], users):
        return None
    chunk = CHUNK_BYTES // element
    # a stem's 3 channels: zero channels up to a whole chunk (their weights 0), so patches
    # still copy a chunk a tap (8 of 3 channels at fp16: 2.7x the products, on tensor cores)
    padded = channels if one_pixel else -(-channels // chunk) * chunk
    if padded != channels and node.attrs.get("group", 1) != 1:
        return None
    ohwi = np.asarray(w.const).transpose(NHWC_OF_NCHW)
    attrs = dict(node.attrs, kernel_shape=list(node.attrs.get("kernel_shape") or
                                                w.const.shape[2:]))
    # a strided stem whose patches copy fewer chunks so: on its input's space to depth
    folded = _space_to_depth(node, ohwi, attrs, chunk, None, FLOAT_S2D_MOST) \
        if padded != channels else None
    edge, xt, ohwi, attrs = _channels_last_operands(x, node, ohwi, attrs, channels, padded,
                                                    chunk, folded)
    if target.precision == "tf32" and ohwi.dtype == np.float32 and \
            not _depthwise(node):   # (a depthwise one: no tensor cores)
        ohwi = round_tf32(ohwi)   # once here: the product's tiles then leave them as they are
    wv = Value(f"{w.name}.ohwi", TensorType(w.type.dtype, ohwi.shape), const=ohwi)
    inputs = [xt, wv] + list(node.inputs[2:])
    return _channels_last_conv("ConvNHWC", inputs, attrs, node, edge)


def _channels_last_conv(op: str, inputs, attrs: dict, node: Node, edge: list[Node]):
    """The rewrite of conv `node` into channels-last `op` on `inputs` (its input made
    channels-last by `edge`), its output transposed back to `node`'s NCHW output; None where
    `op`'s output is not that output's NHWC shape."""
    types, _, full = infer_node(op, inputs, attrs, 1, node.name)
    out = node.outputs[0]
    yt = Value(f"{out.name}.nhwc", types[0])
    if tuple(yt.type.shape[i] for i in NCHW_OF_NHWC) != tuple(out.type.shape):
        return None
    return edge + [Node(op, inputs, [yt], full, node.name),
                   Node("Transpose", [yt], [out], {"perm": list(NCHW_OF_NHWC)},
                        f"{node.name}.out")], []


def _nhwc_int8_conv(node: Node):
    """QuantizedConvPacked(x, za, W packed, ...) (2-D, one group) -> Transpose(x) -> [Pad of
    its channels with zeros to whole 16-byte chunks of int8: a stem's 3 to 16, their weights
    0] -> QuantizedConvNHWC(., za, OHWI(W), w_sums, ..., tap sums(W)) -> Transpose(back):
    the cuda int8 template's patches copied a chunk of 16 channels at a time
    (cuda/int8_nhwc.py), the int8 values between such convs left channels-last by
    `sink_transposes`. (Padded channels add nothing whatever they hold: their weights, sums
    and tap sums are 0.) A strided conv whose patches copy fewer chunks after a space to
    depth (`_space_to_depth`: a stem) takes that instead."""
    x, w = node.inputs[0], node.inputs[2]
    kernel = tuple(node.attrs.get("kernel_shape") or ())
    channels = x.type.shape[1] if x.type.rank == 4 else None
    if len(kernel) != 2 or w.const is None or not isinstance(channels, int) or \
            (node.attrs.get("group") or 1) != 1:   # (grouped: cuda's NCHW int8 conv)
        return None
    full = unpack_conv_groups(np.asarray(w.const), node.attrs["oc"], channels, kernel)
    attrs = {k: v for k, v in node.attrs.items() if k != "oc"}
    ohwi = full.transpose(NHWC_OF_NCHW)
    za = node.inputs[1]
    folded = _space_to_depth(node, ohwi, attrs, CHUNK_BYTES, za) \
        if za is not None and za.const is not None and za.type.numel == 1 else None
    padded = -(-channels // CHUNK_BYTES) * CHUNK_BYTES
    edge, xt, ohwi, attrs = _channels_last_operands(x, node, ohwi, attrs, channels, padded,
                                                    CHUNK_BYTES, folded)
    wv = Value(f"{w.name}.ohwi", TensorType(int8, ohwi.shape), const=ohwi)
    taps = tap_sums(ohwi)
    tv = Value(f"{w.name}.tap_sums", TensorType(int32, taps.shape), const=taps)
    extra = list(node.inputs[4:7]) + [None] * (7 - len(node.inputs[:7]))
    inputs = [xt, node.inputs[1], wv, node.inputs[3]] + extra[:3] + [tv]
    return _channels_last_conv("QuantizedConvNHWC", inputs, attrs, node, edge)


FLOAT_S2D_MOST = 0.75
"""A float stem takes its input's space to depth (`_nhwc_conv`) where the rewrite copies at
most this fraction of the chunks a patch copied: resnet's 7x7/2 stem of 3 channels at fp16 /
bf16 (32 of 49 chunks, k 256 of 392), not a 3x3/2 one (8 of 9: mobilenet's) nor the 7x7/2 at
tf32 (48 of 49), whose gain would not pay its input kernel's reshuffle."""


def _space_to_depth(node: Node, ohwi: np.ndarray, attrs: dict, chunk: int,
                    fill: Value | None, most: float = 1.0):
    """(edge nodes, channels-last x', OHWI weights', attrs') of a conv (QuantizedConvPacked,
    or a float Conv: `_nhwc_conv`) of stride s (both axes) computed as a stride-1 conv of x's
    s x s space to depth, where its patches copy fewer chunks of `chunk` channels (16 bytes):
    resnet's stem (7x7, stride 2, 3 channels padded to a chunk: 49 chunks a patch) becomes a
    4x4 conv of 12 channels (int8: 16 chunks, a third of the products; fp16: 32, two thirds).
    x is padded with `fill` (int8: its zero point; None: zeros) by the conv's pads (and at
    the end up to whole s x s blocks, or cropped to the rows and columns the outputs read),
    then x'[n, i, j, c'] = x[n, c, s i + a, s j + b] with c' = (a s + b) C + c (a Reshape, a
    Transpose, a Reshape: channels-last at once), the kernel padded with zeros to whole
    blocks and rearranged alike: the same products (and zeros) summed, so the same results up
    to the sum's order (int8: exactly); none of x' is padding (no w_tap_sums share). None
    where it does not apply or copies more than `most` of the chunks (int8: any fewer;
    DNNC_SPACE_TO_DEPTH=0: never)."""
    x = node.inputs[0]
    (n, c, h, w), (m, kh, kw, _) = x.type.shape, ohwi.shape
    strides = tuple(attrs.get("strides") or (1, 1))
    pads = tuple(attrs.get("pads") or (0, 0, 0, 0))
    s = strides[0]
    if s < 2 or strides != (s, s) or tuple(attrs.get("dilations") or (1, 1)) != (1, 1) or \
            attrs.get("auto_pad", "NOTSET") != "NOTSET" or not isinstance(h, int) or \
            not isinstance(w, int) or not isinstance(c, int) or \
            os.environ.get("DNNC_SPACE_TO_DEPTH") == "0":   # (the benches' A/B switch)
        return None
    bh, bw = -(-kh // s), -(-kw // s)   # the kernel in blocks of s x s taps
    chunks, before = bh * bw * -(-s * s * c // chunk), kh * kw * -(-c // chunk)
    if chunks >= before or chunks > most * before:
        return None
    oh = (h + pads[0] + pads[2] - kh) // s + 1
    ow = (w + pads[1] + pads[3] - kw) // s + 1
    # x padded to exactly the rows and columns the outputs read (a negative end crops)
    hp, wp = s * (oh + bh - 1), s * (ow + bw - 1)
    bottom, right = hp - h - pads[0], wp - w - pads[1]
    name, dtype = node.name, x.type.dtype

    def value(label, shape):
        return Value(f"{x.name}.{label}", TensorType(dtype, shape))

    def ints(label, a):
        return Value(f"{name}.{label}", TensorType(int64, (len(a),)),
                     const=np.array(a, np.int64))

    xp = value("s2d_padded", (n, c, hp, wp))
    blocks = value("s2d_blocks", (n, c, hp // s, s, wp // s, s))
    moved = value("s2d_moved", (n, hp // s, wp // s, s, s, c))
    xs = value("s2d_nhwc", (n, hp // s, wp // s, s * s * c))
    edge = [Node("Pad", [x, ints("s2d_pads", [0, 0, pads[0], pads[1], 0, 0, bottom, right])] +
                 ([fill] if fill is not None else []), [xp], {"mode": "constant"},
                 f"{name}.s2d_pad"),
            Node("Reshape", [xp, ints("s2d_blocks", [0, c, hp // s, s, wp // s, s])],
                 [blocks], {"allowzero": 0}, f"{name}.s2d_blocks"),
            Node("Transpose", [blocks], [moved], {"perm": [0, 2, 4, 3, 5, 1]},
                 f"{name}.s2d_move"),
            Node("Reshape", [moved, ints("s2d_shape", [0, hp // s, wp // s, s * s * c])],
                 [xs], {"allowzero": 0}, f"{name}.s2d")]
    full = np.pad(ohwi, [(0, 0), (0, bh * s - kh), (0, bw * s - kw), (0, 0)])
    folded = full.reshape(m, bh, s, bw, s, c).transpose(0, 1, 3, 2, 4, 5)
    folded = folded.reshape(m, bh, bw, s * s * c)
    return edge, xs, folded, dict(attrs, kernel_shape=[bh, bw], strides=[1, 1],
                                  pads=[0, 0, 0, 0])


def _depthwise(node: Node) -> bool:
    """A Conv of one filter per channel."""
    group = node.attrs.get("group") or 1
    w = node.inputs[1]
    return group > 1 and w.type.shape[1] == 1 and w.type.shape[0] == group


def _nchw_grouped(node: Node) -> bool:
    """A Conv of several groups, not depthwise, whose channels a group do not fill whole
    16-byte chunks (ResNeXt's 4 a group at fp16): no channels-last kernel takes it. Those that
    do (RegNet's 8) are cuda's tensor-core conv's, one product a group (conv_nhwc.py)."""
    group = node.attrs.get("group") or 1
    if group == 1 or _depthwise(node):
        return False
    x, w = node.inputs[0], node.inputs[1]
    return not isinstance(w.type.shape[1], int) or \
        not channels_fill_chunks(w.type.shape[1], np.dtype(x.type.dtype.np).itemsize)


def _beside_grouped(x: Value, y: Value, users) -> bool:
    """Whether a grouped Conv that stays NCHW (`_nchw_grouped`) produces `x` or reads `y`
    through positionwise ops only: converting there would put a Transpose pair around every
    such conv (2 round trips of the activation a block), so the conv stays NCHW with it."""
    seen, todo = set(), [(x, False), (y, True)]
    while todo:
        v, forward = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        nodes = users.get(v, []) if forward else [v.producer] if v.producer else []
        for n in nodes:
            if n.op == "Conv" and _nchw_grouped(n):
                return True
            if positionwise(n):
                todo += [(n.outputs[0], True)] if forward else \
                    [(u, False) for u in n.inputs if u is not None and u.const is None]
    return False


REWRITES = {"pack_dense": _pack_dense, "pack_conv": _pack_conv, "nhwc_conv": _nhwc_conv,
            "winograd_conv": _winograd_conv, "sparse_weights": sparse_weights,
            "tf32_dense": _tf32_dense, "int8_dense_rows": _int8_dense_rows}
"""layout name -> its rewrite: (graph, node, users, target) -> None, or the replacement node
(or nodes, in order, the last producing the replaced node's outputs) and the later nodes it
takes over (their outputs are its own)."""

PACKINGS = ("pack_dense", "pack_conv")
"""The layouts that pack weights into panels of the target's width (`Target.panel`); the
others (nhwc_conv) move data without a width."""

FINISH = {"nhwc_conv": sink_transposes}
"""layout name -> what runs on the whole graph after its rewrites changed something."""


def convert_layout(graph: Graph, target: Target) -> int:
    """Apply the rewrites of the layouts `target` lists, in place; returns how many nodes
    changed."""
    unknown = [name for name in target.layouts if name not in REWRITES]
    if unknown:
        raise CompileError(f"target {target.name} wants layout(s) {', '.join(unknown)}, which "
                           f"convert_layout does not know (it knows {', '.join(REWRITES)})")
    rules = [REWRITES[name] for name in target.layouts]
    if not rules:
        return 0
    users = graph.users()
    absorbed: set[int] = set()
    changed = 0
    nodes = []
    for node in graph.nodes:
        if id(node) in absorbed:
            continue
        for rule in rules:
            new = rule(graph, node, users, target)
            if new is not None:
                nodes += new[0] if isinstance(new[0], list) else [new[0]]
                absorbed.update(id(n) for n in new[1])
                changed += 1
                break
        else:
            nodes.append(node)
    graph.nodes = [n for n in nodes if id(n) not in absorbed]
    if changed:
        for name in target.layouts:
            if name in FINISH:
                FINISH[name](graph)
    return changed
