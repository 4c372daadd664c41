"""simplify: rewrite rules over the graph, each with the identity it relies on.

Rules are data: `RULES` is a list of functions `(graph, node, users) -> bool` (True when the
rule rewrote the graph around `node`); `simplify` applies them until none fires. Each rule
keeps the values other nodes read, so its users need no change.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import known_constant
from ..ir.types import TensorType


def fold_batch_norm_into_conv(graph: Graph, node: Node, users) -> bool:
    """Conv(x, W, B) -> BatchNormalization(scale, bias, mean, var) == Conv(x, W*s, (B-mean)*s
    + bias) with s = scale / sqrt(var + eps), for inference BN over constant statistics."""
    if node.op != "BatchNormalization" or node.attrs.get("training_mode") or \
            len(node.outputs) != 1:
        return False
    y = node.inputs[0]
    conv = y.producer
    if conv is None or conv.op != "Conv" or len(users.get(y, [])) != 1 or \
            y in graph.outputs:
        return False
    params = [known_constant(v) for v in node.inputs[1:5]]
    w = known_constant(conv.inputs[1])
    b = known_constant(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None \
        else np.zeros(w.shape[0] if w is not None else 0, np.float32)
    if w is None or b is None or any(p is None for p in params) or w.dtype != np.float32:
        return False
    scale, bias, mean, var = (np.asarray(p, np.float64) for p in params)
    s = scale / np.sqrt(var + node.attrs["epsilon"])
    new_w = (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    new_b = ((b.astype(np.float64) - mean) * s + bias).astype(w.dtype)
    wv = Value(f"{conv.inputs[1].name}.bn", TensorType(conv.inputs[1].type.dtype, new_w.shape),
               const=new_w)
    bv = Value(f"{node.name}.bias", TensorType(conv.inputs[1].type.dtype, new_b.shape),
               const=new_b)
    fused = Node("Conv", [conv.inputs[0], wv, bv], node.outputs, conv.attrs, conv.name)
    graph.nodes[graph.nodes.index(conv)] = fused
    graph.nodes.remove(node)
    return True


def remove_identity(graph: Graph, node: Node, users) -> bool:
    """Identity(x) == x; Dropout(x) in inference == x (its mask, if read, is not removed)."""
    if node.op == "Identity" or (node.op == "Dropout" and len(node.outputs) == 1 and
                                 not _dropout_trains(node)):
        out, src = node.outputs[0], node.inputs[0]
        if out in graph.outputs and (src in graph.inputs or src.const is not None):
            return False   # an output that is an input stays a node (one copy)
        graph.replace_all_uses(out, src)
        graph.nodes.remove(node)
        return True
    return False


def _dropout_trains(node: Node) -> bool:
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    mode = known_constant(node.inputs[2])
    return mode is None or bool(np.asarray(mode).reshape(-1)[0])


RULES = [fold_batch_norm_into_conv, remove_identity]
"""The rewrites `simplify` applies, in order."""


def simplify(graph: Graph, rules=RULES) -> int:
    """Apply `rules` until none fires; returns how many rewrites happened."""
    count = 0
    changed = True
    while changed:
        changed = False
        for node in list(graph.nodes):
            if node not in graph.nodes:
                continue
            users = graph.users()
            for rule in rules:
                if rule(graph, node, users):
                    count += 1
                    changed = True
                    break
    return count
