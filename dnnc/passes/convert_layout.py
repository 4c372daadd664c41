"""convert_layout: rewrite ops into the layouts a target's kernels read fastest, converting
constant weights once at compile time.

Per target, a table of rewrites (no target `if` chains): on CPUs (llvm) a MatMul or Gemm whose
B is a constant becomes MatMulPacked, its B repacked into NR-column panels that the dense
micro-kernel streams contiguously (GotoBLAS's packed B, done once instead of per call). A
rewrite keeps the node's output Value, so its users are untouched.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.linalg import pack_panels
from ..ir.ops.registry import infer_node
from ..ir.target import Target
from ..ir.types import TensorType, float32


def _pack_dense(node: Node, target: Target) -> Node | None:
    """MatMul(A, B const) / Gemm(A, B const, C) -> MatMulPacked(A, panels(B), C)."""
    if node.op not in ("MatMul", "Gemm"):
        return None
    a, b = node.inputs[0], node.inputs[1]
    if b is None or b.const is None or b.type.rank != 2 or a.type.rank < 2 or \
            a.type.dtype is not float32:
        return None
    attrs = {"n": 0, "alpha": 1.0, "beta": 1.0}
    weights = b.const
    bias = None
    if node.op == "Gemm":
        if node.attrs["transA"]:
            return None
        if node.attrs["transB"]:
            weights = weights.T
        attrs["alpha"], attrs["beta"] = node.attrs["alpha"], node.attrs["beta"]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
    attrs["n"] = int(weights.shape[1])
    packed = pack_panels(np.asarray(weights), target.dense_panel)
    pv = Value(f"{b.name}.packed", TensorType(float32, packed.shape), const=packed)
    inputs = [a, pv] + ([bias] if bias is not None else [])
    types, _, full = infer_node("MatMulPacked", inputs, attrs, 1, node.name)
    if types[0] != node.outputs[0].type:
        return None
    return Node("MatMulPacked", inputs, node.outputs, full, node.name)


REWRITES = {"llvm": [_pack_dense]}
"""target name -> layout rewrites, each node -> replacement node or None."""


def convert_layout(graph: Graph, target: Target) -> int:
    """Apply the target's rewrites in place; returns how many nodes changed."""
    rules = REWRITES.get(target.name, [])
    changed = 0
    for k, node in enumerate(graph.nodes):
        for rule in rules:
            new = rule(node, target)
            if new is not None:
                graph.nodes[k] = new
                changed += 1
                break
    return changed
