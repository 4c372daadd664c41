"""fuse_quantized: rewrite the quantized chains of a model into integer ops
(`ir/ops/quantized.py`: QuantizedDense, QuantizedConvPacked for one group and for groups of
at least 4 output and a multiple of 4 input channels (`packed`), QuantizedConv for the other
grouped convolutions, depthwise ones) with the requantization as their
epilogue, weights quantized and packed once here.

The chains, in the two formats onnxruntime's quantizer writes:

- QDQ (quantize_static): Q(y) with y = [Relu | Clip] (Conv | MatMul | Gemm)(DQ(xq), DQ(wq),
  [DQ(bias int32)]) -> QuantizedX(xq, ..., scale = x_scale * w_scale / y_scale, y's zero
  point), Relu / Clip as the clamp bounds they are in the output's integer domain (Q is
  monotone: Q(max(v, 0)) = max(Q(v), zero point)). The same product without a Q after it
  gives a float32 output (scale = x_scale * w_scale).
- operator format: QLinearMatMul and QLinearConv (of two activations, QLinearMatMul as an
  exact float32 MatMul of the shifted integers: `activation_product`); MatMulInteger /
  ConvInteger (what quantize_dynamic writes after DynamicQuantizeLinear), with the Cast to
  float32 and the Mul by the scales' product that follow them taken as the float32
  epilogue.
- an elementwise chain between quantizations of one 8-bit value v (DQ(v) -> Sigmoid -> Q ->
  DQ -> Mul by DQ(v) -> Q: efficientnet's SiLU; HardSwish, GELU, ...; scalar constants
  besides) becomes QuantizedTable(v, table): its result for each of v's 256 values,
  evaluated here by the ops' references (`tabled`), so that a lookup replaces the float
  arithmetic and its quantizations (a SiLU's exp and three divisions).
- Q(Add(DQ(a), DQ(b))) of 8-bit values (a residual add, a bias) becomes QuantizedAdd: the
  file's float32 chain as one op, so that a product's epilogue reads the 8-bit operands
  (as the chain, the other operand's DQ was a float32 tensor and a kernel of its own:
  resnet50 57 -> 69 kernels). Elementwise float32 arithmetic is defined to the bit;
  onnxruntime's QLinearAdd (MLAS's fused multiply-adds on s_a / s_c, ...), which the
  previous rewrite made, rounds otherwise near ties: 0.14% of one of efficientnet_b0's
  adds, 3.4-18% of a GELU's Erf + 1 (scales 2 / 255 and 1 / 255: every value within
  float32 rounding of a tie). An Add of a scalar constant is left to `tabled`.
- between integer ops, DQ -> op -> Q of the same scale and zero point for an op that only
  moves or selects values (MaxPool, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat;
  Relu as Max with the zero point) runs the op on the integers: exact, since Q(DQ(v)) = v.

4-bit values (int4 / uint4, held as int8 / uint8 within their range: `frontend/onnx.py`) are
the 8-bit values they hold: int4 weights are int8 weights; a Q to 4 bits (its `bits`) gives
the integer op its range as clamp bounds (within a Relu's or Clip's), and QuantizedAdd its
`bits`; a move ends in one where its inputs are known within that range (`within`). A QDQ
file's weights of a zero point (uint4's 8) are taken less it where the differences fit int8
(`shifted_weights`): DQ's values unchanged.

Taken only where it is exact or the model says so: constant per-tensor activation scales and
zero points, int8 weights with zero zero points (symmetric, as the quantizer writes them,
or shifted so: `shifted_weights`;
a dense product's weights also uint8 or with zero points, per tensor or per column:
`signed_weights`),
per-tensor or per-output-channel weight scales, an int32 bias of scale x_scale * w_scale. A
chain that is not taken stays as float ops (the DQ / Q references). Every value inside a
chain must be read by the chain only. Runs first (before fold_constants, which would fold a
weight's DequantizeLinear into float32) on its own copy of the graph; it never reads a
target (the packed layout is the fixed one of `ir/ops/quantized.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import types as T
from ..ir.graph import Graph, Node, Value
from ..ir.ops.conv import CONV_ATTRS
from ..ir.ops.quant import add_reciprocal, quant_range
from ..ir.ops.quantized import (GROUP_DEPTH, INTEGER_PRODUCTS, QUANT_ATTRS, clamp_bounds,
                                 pack_conv_groups, pack_groups, panel_span)
from ..ir.ops.registry import Pattern, get_op, infer_node
from .eliminate import eliminate_dead_code

PRODUCTS = ("Conv", "MatMul", "Gemm")
QUANTIZED = frozenset({"DequantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul",
                       "QLinearConv"})
"""The ops a graph with a chain to rewrite has."""
EXACT_DEPTH = (1 << 24) // (255 * 255)
"""The longest sum of products of two shifted 8-bit values (each |v| <= 255) whose every
partial sum a float32 holds exactly."""
MOVES = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat")
"""Ops that only move or select values: DQ -> op -> Q of the same parameters is op on the
integers. (Concat: every data input; the others: input 0.)"""


TABLE_FREE = frozenset({"QuantizeLinear", "DequantizeLinear", "Relu", "Clip", "Max", "Min"})
"""Ops a chain of one quantized value is not made a table for when it has no other: they cost
less than a table's lookups (one load a lane)."""
TABLE_CHAIN = 32
"""The most values a chain made a table may pass (convnext's GELU, a Q -> DQ pair after each
of its 5 ops as onnxruntime's quantizer writes it, passes 18)."""


@dataclass
class _Quantized:
    """A DequantizeLinear's integer input and its constant parameters (zero point 0 of the
    input's type where absent)."""

    q: Value
    scale: np.ndarray
    zero_point: np.ndarray | Value   # a Value: DynamicQuantizeLinear's, known at run time
    axis: int


def _const(v: Value | None) -> np.ndarray | None:
    return None if v is None else v.const


def _weights(v: Value) -> np.ndarray | None:
    """v's constant value, also through a Transpose of a constant (a tied embedding as a
    language-model head: fold_constants, which would fold it, runs after this pass)."""
    node = v.producer
    if v.const is None and node is not None and node.op == "Transpose" and \
            node.inputs[0].const is not None:
        return np.transpose(node.inputs[0].const, node.attrs["perm"])
    return v.const


def _dequantized(v: Value | None) -> _Quantized | None:
    node = None if v is None else v.producer
    if node is None or node.op != "DequantizeLinear" or node.attrs["block_size"]:
        return None
    scale = _const(node.inputs[1])
    zp = _const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else \
        np.zeros((), node.inputs[0].type.dtype.np)
    if scale is None or zp is None or scale.dtype != np.float32:
        return None
    return _Quantized(node.inputs[0], scale, zp, node.attrs["axis"])


def _value(graph: Graph, name: str, array: np.ndarray) -> Value:
    array = np.require(array, requirements="C")   # (a scalar stays rank 0: no re-layout)
    return Value(graph.fresh_name(name), T.TensorType(T.DType.from_numpy(array.dtype),
                                                       array.shape), const=array)


class _Rewriter:
    """Rewrites one graph; `users` is kept current as chains are replaced."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.users = graph.users()
        self.outputs = {id(v) for v in graph.outputs}
        self.removed: set[int] = set()   # ids of the nodes replaced so far

    def only_reader(self, v: Value, node: Node) -> bool:
        """Whether `node` is `v`'s one reader (and v no graph output)."""
        return id(v) not in self.outputs and self.users.get(v, []) == [node]

    def replace(self, chain: list[Node], op: str, inputs: list, attrs: dict) -> bool:
        """Replace `chain` (in order; its last node's output kept) by one `op` node, if the
        node's type is that output's; returns whether it did."""
        out = chain[-1].outputs[0]
        name = chain[0].name
        types, _, full = infer_node(op, inputs, attrs, 1, name)
        if types[0] != out.type:
            return False
        node = Node(op, inputs, [out], full, name)
        gone = {id(n) for n in chain}
        self.removed |= gone
        self.graph.nodes = [node if n is chain[-1] else n for n in self.graph.nodes
                            if id(n) not in gone or n is chain[-1]]
        for n in chain:   # the readers of each value, kept current
            for v in n.inputs:
                if v is not None and v in self.users:
                    self.users[v] = [u for u in self.users[v] if u is not n]
        for v in inputs:
            if v is not None:
                self.users.setdefault(v, []).append(node)
        return True

    # -- the products -------------------------------------------------------------------------

    def product_inputs(self, anchor: Node, x: _Quantized, w: np.ndarray, w_scale: np.ndarray,
                       bias: np.ndarray | None, scale: np.ndarray | float | Value | None,
                       y_zp: np.ndarray | None, w_zp: np.ndarray | None = None
                       ) -> tuple[str, list, dict] | None:
        """(op, inputs, attrs) of the integer op for `anchor` (Conv, or a product whose
        weights `w` are [K, N], `w_zp` their int8 zero point per column or None), or None
        where it cannot be one."""
        g = self.graph
        runtime = isinstance(x.zero_point, Value)   # DynamicQuantizeLinear's
        if x.q.type.dtype not in (T.uint8, T.int8) or x.scale.size != 1 or w.dtype != np.int8 \
                or (not runtime and x.zero_point.size != 1):
            return None
        zx = x.zero_point if runtime else \
            _value(g, f"{anchor.name}.x_zero_point", x.zero_point.reshape(()))
        scale_v = scale if scale is None or isinstance(scale, Value) else \
            _value(g, f"{anchor.name}.scale", np.asarray(scale, np.float32))
        tail = [None if bias is None else _value(g, f"{anchor.name}.bias", bias.astype(np.int32)),
                scale_v, None if y_zp is None else _value(g, f"{anchor.name}.y_zero_point",
                                                          y_zp.reshape(())),
                None if w_zp is None else _value(g, f"{anchor.name}.w_zero_point", w_zp)]
        while tail and tail[-1] is None:
            tail.pop()
        conv = anchor.op in ("Conv", "ConvInteger", "QLinearConv")
        if w_zp is not None and (conv or x.q.type.rank < 2):
            return None
        if conv:
            sums = w.astype(np.int32).reshape(w.shape[0], -1).sum(axis=1, dtype=np.int32)
            attrs = {k: anchor.attrs[k] for k in CONV_ATTRS}
            sums_v = _value(g, f"{anchor.name}.w_sums", sums)
            if packed(w, attrs["group"]):   # packed once: the int8 conv templates' layout
                attrs.update(kernel_shape=list(w.shape[2:]), oc=int(w.shape[0]))
                wv = _value(g, f"{anchor.name}.w_groups", pack_conv_groups(w, attrs["group"]))
                return "QuantizedConvPacked", [x.q, zx, wv, sums_v] + tail, attrs
            return "QuantizedConv", [x.q, zx, _value(g, f"{anchor.name}.w", w), sums_v] + \
                tail, attrs
        if x.q.type.rank < 2:
            return None
        sums = w.astype(np.int32).sum(axis=0, dtype=np.int32)
        wv = _value(g, f"{anchor.name}.w_groups", pack_groups(w))
        return "QuantizedDense", [x.q, zx, wv, _value(g, f"{anchor.name}.w_sums", sums)] + \
            tail, {"n": int(w.shape[1])}

    def float_weights(self, anchor: Node):
        """(weights as Conv's [M, ...] or as [K, N], their per-channel scales, int32 bias or
        None) of a float Conv / MatMul / Gemm of DQ'd operands; None where not exact."""
        wq = _dequantized(anchor.inputs[1])
        x = _dequantized(anchor.inputs[0])
        w = None if wq is None or x is None else shifted_weights(wq)
        if w is None:
            return None
        if anchor.op == "Conv":
            axis = 0
        elif anchor.op == "MatMul":
            axis = 1
        else:
            a = anchor.attrs
            if a["transA"] or a["alpha"] != 1.0 or (len(anchor.inputs) > 2 and a["beta"] != 1.0):
                return None
            axis = 0 if a["transB"] else 1
        if w.ndim < 2 or (anchor.op != "Conv" and w.ndim != 2):
            return None
        if wq.scale.size > 1 and (wq.axis % w.ndim != axis or wq.scale.size != w.shape[axis]):
            return None
        if anchor.op != "Conv" and axis == 0:
            w = w.T
        w_scale = (np.float32(x.scale.reshape(())) * wq.scale.astype(np.float32)).reshape(-1)
        bias = None
        if len(anchor.inputs) > 2 and anchor.inputs[2] is not None:
            b = _dequantized(anchor.inputs[2])
            if b is None or b.q.const is None or b.q.type.dtype is not T.int32 or \
                    np.any(b.zero_point != 0) or \
                    not np.allclose(b.scale.reshape(-1), w_scale, rtol=1e-5, atol=0):
                return None
            bias = b.q.const.reshape(-1)
        return x, w, w_scale, bias

    def requantized(self, q: Node) -> bool:
        """Q([Relu | Clip] (product of DQ'd operands)) -> one integer op."""
        if q.attrs["block_size"] or len(q.inputs) < 2:
            return False
        sy = _const(q.inputs[1])
        out = q.outputs[0].type.dtype
        zy = _const(q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] is not None else \
            np.zeros((), out.np)
        if sy is None or zy is None or sy.size != 1 or zy.size != 1 or \
                out not in (T.int8, T.uint8) or sy.dtype != np.float32:
            return False
        chain, y = [q], q.inputs[0]
        # a 4-bit output's range (its `bits`) as clamp bounds, or None: the type's own
        lo, hi = quant_range(out, q.attrs["bits"]) if q.attrs["bits"] else (None, None)
        node = y.producer
        if node is not None and node.op in ("Relu", "Clip") and self.only_reader(y, q):
            bounds = self.clamp(node, sy, zy, out)
            if bounds is None:
                return False
            # clamp(clamp(v, a, b), c, d) = clamp(v, max(a, c), min(b, d)) where they overlap
            lo, hi = (b if a is None else a if b is None else f(a, b)
                      for a, b, f in ((lo, bounds[0], max), (hi, bounds[1], min)))
            if lo is not None and hi is not None and lo > hi:
                return False
            chain.insert(0, node)
            y = node.inputs[0]
            node = y.producer
        if node is None or node.op not in PRODUCTS or not self.only_reader(y, chain[0]):
            return False
        operands = self.float_weights(node)
        if operands is None:
            return False
        x, w, w_scale, bias = operands
        multiplier = (w_scale / np.float32(sy.reshape(()))).astype(np.float32)
        made = self.product_inputs(node, x, w, w_scale, bias, multiplier, zy)
        if made is None:
            return False
        op, inputs, attrs = made
        return self.replace([node] + chain, op, inputs, {**attrs, "lo": lo, "hi": hi})

    @staticmethod
    def clamp(node: Node, sy: np.ndarray, zy: np.ndarray, out: T.DType):
        """(lo, hi) in the output's integer domain for a Relu / Clip before Q; None when
        Clip's bounds are not constants."""
        zero = int(zy.reshape(()))
        if node.op == "Relu":
            return zero, None
        bounds = []
        for k in (1, 2):
            v = node.inputs[k] if len(node.inputs) > k else None
            if v is not None and v.const is None:
                return None
            bounds.append(None if v is None else int(np.clip(
                np.rint(np.float32(v.const) / np.float32(sy.reshape(()))) + zero,
                *clamp_bounds(out, None, None))))
        return tuple(bounds)

    def dequantized_output(self, anchor: Node) -> bool:
        """A product of DQ'd operands whose result stays float32: the integer op with scale
        x_scale * w_scale and a float32 output."""
        if anchor.outputs[0].type.dtype is not T.float32:
            return False
        operands = self.float_weights(anchor)
        if operands is None:
            return False
        x, w, w_scale, bias = operands
        made = self.product_inputs(anchor, x, w, w_scale, bias, w_scale, None)
        return made is not None and self.replace([anchor], *made[:2], {**made[2],
                                                                       **QUANT_ATTRS})

    def added(self, q: Node) -> bool:
        """Q(Add(DQ(a), DQ(b))) of 8-bit values and scalar parameters (neither operand a
        scalar constant: a table's) -> QuantizedAdd, the same float32 arithmetic as one op
        that reads the 8-bit operands (`ir/ops/quant.py`)."""
        y = q.inputs[0]
        node = y.producer
        if node is None or node.op != "Add" or not self.only_reader(y, q) or \
                q.attrs["block_size"] or len(q.inputs) < 2:
            return False
        out = q.outputs[0].type.dtype
        sy = _const(q.inputs[1])
        zy = _const(q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] is not None else \
            np.zeros((), out.np)
        operands = [_dequantized(v) for v in node.inputs]
        if sy is None or zy is None or sy.size != 1 or sy.dtype != np.float32 or \
                out not in (T.int8, T.uint8) or \
                any(x is None or x.q.type.dtype not in (T.int8, T.uint8) or x.scale.size != 1
                    or x.zero_point.size != 1 or (x.q.const is not None and x.q.const.size == 1)
                    for x in operands):
            return False
        g, name = self.graph, node.name
        inputs = []
        for k, x in zip("ab", operands):
            inputs += [x.q, _value(g, f"{name}.{k}_scale", x.scale.reshape(())),
                       _value(g, f"{name}.{k}_zero_point", x.zero_point.reshape(()))]
        inputs += [_value(g, f"{name}.c_scale", sy.reshape(())),
                   _value(g, f"{name}.c_zero_point", zy.reshape(()))]
        a, b = operands
        reciprocal = add_reciprocal(a.q.type.dtype.np, a.scale.item(), a.zero_point.item(),
                                    b.q.type.dtype.np, b.scale.item(), b.zero_point.item(),
                                    sy.item())
        reciprocal, refined = reciprocal or (None, False)
        return self.replace([node, q], "QuantizedAdd", inputs,
                            {"c_reciprocal": reciprocal, "c_refined": refined,
                             "bits": q.attrs["bits"]})

    # -- operator format ----------------------------------------------------------------------

    def integer_product(self, node: Node) -> bool:
        """MatMulInteger / ConvInteger (+ Cast to float32 + Mul by a scale) -> one integer op."""
        a, b = node.inputs[0], node.inputs[1]
        za = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] is not None \
            else None
        za = np.zeros((), a.type.dtype.np) if za is None else \
            (za.const if za.const is not None else za)
        zb = _const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None \
            else np.zeros((), b.type.dtype.np)
        if b.const is None or zb is None or \
                (isinstance(za, Value) and za.type.shape not in ((), (1,))):
            return False
        if node.op == "MatMulInteger" and b.type.rank != 2:
            return False
        weights = signed_weights(b.const, zb, b.type.shape[0 if node.op == "ConvInteger" else 1])
        if weights is None or (node.op == "ConvInteger" and weights[1] is not None):
            return False
        chain, scale = [node], None
        cast = self.users.get(node.outputs[0], [])
        if len(cast) == 1 and cast[0].op == "Cast" and cast[0].attrs["to"] is T.float32 and \
                self.only_reader(node.outputs[0], cast[0]):
            mul = self.users.get(cast[0].outputs[0], [])
            if len(mul) == 1 and mul[0].op == "Mul" and \
                    self.only_reader(cast[0].outputs[0], mul[0]):
                s = mul[0].inputs[1] if mul[0].inputs[0] is cast[0].outputs[0] else \
                    mul[0].inputs[0]
                channels = b.type.shape[1] if node.op == "MatMulInteger" else None
                if s.type.dtype is T.float32 and s.type.shape in ((), (1,), (channels,)):
                    chain, scale = [node, cast[0], mul[0]], s
        x = _Quantized(a, np.ones((), np.float32), za, 1)
        w, w_zp = weights
        factors = self.scale_factors(scale, chain[-1]) if node.op == "MatMulInteger" else None
        if factors is not None:   # the scales' Mul taken in: x_scale * w_scale in the op
            chain, scale = [node, factors[0]] + chain[1:], factors[2]
        made = self.product_inputs(node, x, w, None, None, scale, None, w_zp)
        if made is not None and factors is not None:
            made[1].extend([None] * (8 - len(made[1])) + [factors[1]])
        return made is not None and self.replace(chain, *made[:2], {**made[2], **QUANT_ATTRS})

    def scale_factors(self, scale: Value | None, reader: Node):
        """(the Mul node, its run-time float32 scalar, its constant) where `scale`, read by
        `reader` only, is a Mul of a run-time scalar (a DynamicQuantizeLinear's scale) and a
        constant scalar or vector (the weights' scales), as quantize_dynamic writes it; None
        otherwise."""
        node = None if scale is None else scale.producer
        if node is None or node.op != "Mul" or not self.only_reader(scale, reader):
            return None
        u, c = node.inputs if node.inputs[0].const is None else node.inputs[::-1]
        if c.const is None or u.const is not None or u.type.shape not in ((), (1,)) or \
                c.type.shape != scale.type.shape or \
                not u.type.dtype is c.type.dtype is T.float32:
            return None
        return node, u, c

    def qlinear(self, node: Node) -> bool:
        """QLinearMatMul / QLinearConv of constant int8 weights -> one integer op."""
        params = [_const(v) if v is not None else None for v in node.inputs]
        params[3] = _weights(node.inputs[3])
        sx, zx, w, sw, zw, sy = params[1:7]
        zy = params[7] if len(params) > 7 else None
        bias = params[8] if len(params) > 8 else None
        if any(p is None for p in (sx, zx, w, sw, zw, sy)) or \
                (len(node.inputs) > 7 and node.inputs[7] is not None and zy is None) or \
                (len(node.inputs) > 8 and node.inputs[8] is not None and bias is None):
            return False
        if sx.dtype != np.float32 or sw.dtype != np.float32 or sy.size != 1:
            return False
        zy = np.zeros((), node.inputs[0].type.dtype.np) if zy is None else zy
        if node.op == "QLinearMatMul" and (w.ndim != 2 or (sw.size > 1 and sw.shape[-1] !=
                                                             w.shape[1])):
            return False
        weights = signed_weights(w, zw, w.shape[0 if node.op == "QLinearConv" else 1])
        if weights is None:
            return False
        w_scale = (np.float32(sx.reshape(())) * sw.astype(np.float32)).reshape(-1)
        multiplier = (w_scale / np.float32(sy.reshape(()))).astype(np.float32)
        x = _Quantized(node.inputs[0], sx, zx, 1)
        made = self.product_inputs(node, x, weights[0], w_scale, bias, multiplier, zy,
                                   weights[1])
        return made is not None and self.replace([node], *made[:2], {**made[2], **QUANT_ATTRS})

    def activation_product(self, node: Node) -> bool:
        """QLinearMatMul of two activations (per-tensor parameters, k <= EXACT_DEPTH): the
        zero-point-shifted integers' product as a float32 MatMul, exact (every partial sum an
        integer below 2**24, in any order), times the multiplier, quantized at scale 1: the
        requantization of `qlinear`'s integer ops, on the float dense templates."""
        a, b = node.inputs[0], node.inputs[3]
        params = [_const(node.inputs[k]) for k in (1, 2, 4, 5, 6)]
        given_zy = len(node.inputs) > 7 and node.inputs[7] is not None
        zy = _const(node.inputs[7]) if given_zy else np.zeros((), a.type.dtype.np)
        depth = a.type.shape[-1] if a.type.rank else None
        if _weights(b) is not None or zy is None or \
                any(p is None or p.size != 1 for p in params) \
                or not isinstance(depth, int) or depth > EXACT_DEPTH or \
                params[0].dtype != np.float32 or params[2].dtype != np.float32:
            return False
        sa, za, sb, zb, sy = (p.reshape(()) for p in params)
        multiplier = np.float32(np.float32(sa) * np.float32(sb)) / np.float32(sy)
        g, name = self.graph, node.name
        one = _value(g, f"{name}.one", np.float32(1.0))
        steps = [("DequantizeLinear", [a, one, _value(g, f"{name}.a_zero_point", za)], {}),
                 ("DequantizeLinear", [b, one, _value(g, f"{name}.b_zero_point", zb)], {}),
                 ("MatMul", [0, 1], {}),
                 ("Mul", [2, _value(g, f"{name}.multiplier", np.float32(multiplier))], {}),
                 ("QuantizeLinear", [3, one, _value(g, f"{name}.y_zero_point", zy)], {})]
        return self.expand(node, steps)

    def expand(self, node: Node, steps: list) -> bool:
        """Replace `node` by a chain of `steps` ((op, inputs, attrs); an int input is that
        earlier step's output), the last one writing the node's output, if its type is the
        output's; returns whether it did."""
        made: list[Node] = []
        for k, (op, inputs, attrs) in enumerate(steps):
            inputs = [made[v].outputs[0] if isinstance(v, int) else v for v in inputs]
            types, _, full = infer_node(op, inputs, attrs, 1, f"{node.name}/{k}")
            out = node.outputs[0] if k == len(steps) - 1 else \
                Value(self.graph.fresh_name(f"{node.name}/{k}"), types[0])
            if k == len(steps) - 1 and types[0] != out.type:
                return False
            made.append(Node(op, inputs, [out], full, f"{node.name}/{k}"))
        at = self.graph.nodes.index(node)
        self.graph.nodes[at:at + 1] = made
        self.removed.add(id(node))
        for v in node.inputs:
            if v is not None and v in self.users:
                self.users[v] = [u for u in self.users[v] if u is not node]
        for n in made:
            for v in n.inputs:
                self.users.setdefault(v, []).append(n)
        return True

    # -- elementwise chains of one quantized value as tables -------------------------------------

    def tabled(self, q: Node) -> bool:
        """Q(f(DQ(v), DQ(v), ...)) for f elementwise ops (scalar constants besides) of one
        8-bit value v, at v's shape, computing more than `TABLE_FREE` ops -> QuantizedTable(v,
        the chain's result for each of v's 256 values, evaluated here by the references).
        Of the values the chain could start from (a SiLU's inner Q is one), the earliest
        whose chain is read by nothing else: the longest chain one table replaces."""
        out = q.outputs[0].type
        if out.dtype not in (T.int8, T.uint8) or q.attrs["block_size"]:
            return False
        sources = self.table_sources(q.inputs[0], out.shape, {}, [0])
        order = {id(n.outputs[0]): k for k, n in enumerate(self.graph.nodes)}
        for v in sorted(sources or (), key=lambda v: order.get(id(v), -1)):
            chain, leaves = self.table_chain(q, v)
            inside = {id(n) for n in chain}
            if any(n.op not in TABLE_FREE for n in chain) and all(
                    self.only_readers(n.outputs[0], inside) for n in chain if n is not q):
                return self.replace([n for n in self.graph.nodes if id(n) in inside],
                                    "QuantizedTable", [v, self.table(q, v, chain + leaves)], {})
        return False

    def table_sources(self, u: Value, shape, memo: dict, visited: list) -> set | None:
        """The 8-bit values a chain of elementwise ops computing `u` could start from (each
        read through a DequantizeLinear of scalar parameters; None: any, u is a scalar
        constant); the empty set where none."""
        if u.const is not None or _scalar_constant(u):
            return None if u.const is None or u.const.size == 1 else set()
        if id(u) in memo:
            return memo[id(u)]
        p, found = u.producer, set()
        visited[0] += 1
        x = _dequantized(u) if p is not None and p.op == "DequantizeLinear" else None
        if x is not None and x.q.const is None and x.scale.size == 1 and \
                x.zero_point.size == 1 and x.q.type.dtype in (T.int8, T.uint8) and \
                x.q.type.shape == shape:
            found = {x.q} | (self.table_sources(x.q, shape, memo, visited) or set())
        elif p is not None and len(p.outputs) == 1 and u.type.shape == shape and \
                get_op(p.op).pattern in (Pattern.ELEMWISE, Pattern.BROADCAST) and \
                visited[0] <= TABLE_CHAIN:
            found = None
            for i in p.inputs:
                if i is not None:
                    each = self.table_sources(i, shape, memo, visited)
                    found = each if found is None else found if each is None else found & each
            found = set() if found is None else found
        memo[id(u)] = found
        return found

    def table_chain(self, q: Node, v: Value) -> tuple[list[Node], list[Node]]:
        """(the nodes from `q` back to v's DequantizeLinears, those DequantizeLinears)."""
        chain, leaves, todo, seen = [q], [], [q], {id(q)}
        while todo:
            for u in todo.pop().inputs:
                p = None if u is None or u.const is not None else u.producer
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                if p.op == "DequantizeLinear" and p.inputs[0] is v or _scalar_constant(u):
                    leaves.append(p)   # (evaluated, not replaced: others may read it)
                else:
                    chain.append(p)
                    todo.append(p)
        return chain, leaves

    def table(self, q: Node, v: Value, nodes: list[Node]) -> Value:
        """q's output for each value of v (from its type's minimum): `nodes` evaluated in
        graph order by their references on the 256 values."""
        info = np.iinfo(v.type.dtype.np)
        arrays = {id(v): np.arange(info.min, info.max + 1).astype(v.type.dtype.np)}
        picked = {id(n) for n in nodes}
        for n in self.graph.nodes:   # (in order: each input is computed before it is read)
            if id(n) in picked:
                args = [None if i is None else i.const if i.const is not None else
                        arrays[id(i)] for i in n.inputs]
                arrays[id(n.outputs[0])] = get_op(n.op).run(args, n.attrs)[0]
        return _value(self.graph, f"{q.name}.table", arrays[id(q.outputs[0])])

    def only_readers(self, v: Value, nodes: set[int]) -> bool:
        """Whether every reader of `v` is one of `nodes` (ids), v no graph output."""
        return id(v) not in self.outputs and all(id(u) in nodes for u in self.users.get(v, []))

    # -- integers through moves -----------------------------------------------------------------

    def moved(self, q: Node) -> bool:
        """DQ -> op -> Q of the same scale and zero point (op of `MOVES`, or Relu) -> the op on
        the integers."""
        y = q.inputs[0]
        node = y.producer
        if node is None or (node.op not in MOVES and node.op != "Relu") or \
                not self.only_reader(y, q) or q.attrs["block_size"]:
            return False
        sy = _const(q.inputs[1])
        zy = _const(q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] is not None else None
        if sy is None or zy is None or sy.size != 1:
            return False
        data = range(len(node.inputs)) if node.op == "Concat" else (0,)
        inputs = list(node.inputs)
        for k in data:
            x = _dequantized(node.inputs[k])
            if x is None or x.scale.size != 1 or x.q.type.dtype.np != zy.dtype or \
                    x.scale.reshape(()) != sy.reshape(()) or \
                    x.zero_point.reshape(()) != zy.reshape(()):
                return False
            # Q(DQ(v)) = v needs v within a 4-bit Q's range (an 8-bit v may lie beyond it)
            if q.attrs["bits"] and not within(x.q, *quant_range(q.outputs[0].type.dtype,
                                                                 q.attrs["bits"])):
                return False
            inputs[k] = x.q
        if node.op == "Relu":   # relu(s (x - z)) quantized is max(x, z)
            return self.replace([node, q], "Max", [inputs[0], _value(
                self.graph, f"{node.name}.zero_point", zy.reshape(()))], {})
        return self.replace([node, q], node.op, inputs, node.attrs)


def within(v: Value, lo: int, hi: int, depth: int = 8) -> bool:
    """Whether every value of integer `v` is known to lie in [lo, hi]: a constant's, a
    QuantizeLinear's or an integer op's saturation, through moves and Max (as far as `depth`
    producers)."""
    if v.const is not None:
        return v.const.size > 0 and lo <= v.const.min() and v.const.max() <= hi
    node = v.producer
    if node is None or depth == 0:
        return False
    if node.op == "QuantizeLinear":
        a, b = quant_range(v.type.dtype, node.attrs["bits"])
    elif node.op in INTEGER_PRODUCTS and v.type.dtype in (T.int8, T.uint8):
        a, b = clamp_bounds(v.type.dtype, node.attrs["lo"], node.attrs["hi"])
    elif node.op in MOVES or node.op == "Max":
        data = node.inputs if node.op in ("Concat", "Max") else node.inputs[:1]
        return all(within(i, lo, hi, depth - 1) for i in data)
    else:
        return False
    return lo <= a and b <= hi


def _scalar_constant(v: Value) -> bool:
    """Whether `v` is one value computed from constants alone (a DequantizeLinear of a
    quantized scalar constant: GELU's 1 and 0.5 as onnxruntime's quantizer writes them)."""
    node = v.producer
    return node is not None and all(d == 1 for d in v.type.shape) and \
        all(i is None or i.const is not None for i in node.inputs)


def packed(w: np.ndarray, group: int) -> bool:
    """Whether a conv of weights `w` [M, C / group, *kernel] becomes QuantizedConvPacked: one
    group, or groups whose packed panels exist (`panel_span`) and are at least a quarter
    products of their own groups (M / group >= 4: a panel of 16 channels then spans at most
    4 groups, each of whose channels sees the others' as zeros). The rest (depthwise convs)
    stay QuantizedConv."""
    m, cin = w.shape[:2]
    return group == 1 or (m // group >= GROUP_DEPTH and
                          panel_span(m, cin * group, group) is not None)


def shifted_weights(wq: _Quantized) -> np.ndarray | None:
    """Constant weights less their zero point (DequantizeLinear's (w - z) s is w' s) as int8,
    where every difference fits: int8 weights of zero points 0, int4 ones of any, uint4
    ones (onnxruntime's QUInt4: zero point 8) and symmetric uint8 ones (128); None where
    not constant, not 8-bit, or a difference does not fit."""
    w, zp = wq.q.const, wq.zero_point
    if w is None or w.dtype not in (np.int8, np.uint8) or zp.dtype != w.dtype:
        return None
    if w.dtype == np.int8 and not np.any(zp):
        return w
    dims = [1] * w.ndim
    if zp.size > 1:
        if w.ndim == 0 or zp.size != w.shape[wq.axis % w.ndim]:
            return None
        dims[wq.axis % w.ndim] = zp.size
    d = w.astype(np.int16) - zp.reshape(dims).astype(np.int16)
    return d.astype(np.int8) if d.size and -128 <= d.min() and d.max() <= 127 else None


def signed_weights(w: np.ndarray, zero_point: np.ndarray, columns: int
                   ) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Integer weights and their zero point (a scalar, or one per column of `columns` where w
    is [K, N]) as int8 weights and an int8 zero point (None: zero) with the same differences
    w - zero_point: uint8 both less 128. None where they are not 8-bit or the zero point
    is neither a scalar nor one per column."""
    if w.dtype not in (np.int8, np.uint8) or zero_point.dtype != w.dtype or \
            zero_point.size not in (1, columns):
        return None
    if w.dtype == np.uint8:
        w = (w.astype(np.int16) - 128).astype(np.int8)
        zero_point = (zero_point.astype(np.int16) - 128).astype(np.int8)
    if not np.any(zero_point):
        return w, None
    return w, zero_point.reshape(()) if zero_point.size == 1 else zero_point.reshape(-1)


def fuse_quantized(graph: Graph) -> int:
    """Rewrite `graph` in place; returns how many chains became integer ops (or integer
    moves). Unread nodes left behind (a weight's DequantizeLinear) are removed."""
    r = _Rewriter(graph)
    count = 0
    for kinds, rule in ((("QuantizeLinear",), r.moved), (("QuantizeLinear",), r.requantized),
                        (("QuantizeLinear",), r.added),
                        (PRODUCTS, r.dequantized_output),
                        (("MatMulInteger", "ConvInteger"), r.integer_product),
                        (("QLinearMatMul", "QLinearConv"), r.qlinear),
                        (("QLinearMatMul",), r.activation_product),
                        (("QuantizeLinear",), r.tabled)):
        # (tables from the last Q back: a chain's inner Q -> DQ pairs are part of the
        # outer one's, as a SiLU's Sigmoid is quantized before its Mul)
        nodes = list(graph.nodes)
        for node in reversed(nodes) if rule == r.tabled else nodes:
            if node.op in kinds and id(node) not in r.removed:
                count += rule(node)
    if count:
        eliminate_dead_code(graph)
        graph.groups = None
    return count
