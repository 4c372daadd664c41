"""fold_constants: evaluate nodes whose inputs are all known at compile time.

Shape arithmetic as exporters write it (Shape -> Gather -> Concat -> Reshape) disappears once
shapes are static: a value whose contents inference already knows exactly (`Value.known`
without symbols) counts as constant. Nodes run with the registry's NumPy reference; a node
is left alone when it is not deterministic (random ops), owns subgraphs, or would
materialise a large constant from small inputs (ConstantOfShape of a big shape, Expand):
those stay nodes that compute their output at run time, at no memory cost.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.ops.registry import get_op, known_constant

MAX_GROWTH_BYTES = 1 << 20
"""A folded output may exceed its inputs' size by at most this much."""


def fold_constants(graph: Graph, max_growth: int = MAX_GROWTH_BYTES) -> int:
    """Fold in place; returns how many nodes were folded."""
    kept = []
    folded = 0
    for node in graph.nodes:
        op = get_op(node.op)
        outs_known = [known_constant(v) for v in node.outputs]
        if op.deterministic and all(a is not None for a in outs_known):
            # inference already knows the result (Shape, Size of static inputs)
            for v, a in zip(node.outputs, outs_known):
                graph.replace_all_uses(v, Value(v.name, v.type, const=np.require(
                    a, requirements="C")))
            folded += 1
            continue
        args = [known_constant(v) for v in node.inputs]
        if not op.deterministic or node.subgraphs() or \
                any(a is None and v is not None for a, v in zip(args, node.inputs)):
            kept.append(node)
            continue
        in_bytes = sum(a.nbytes for a in args if a is not None)
        out_bytes = sum((v.type.numel or 0) * v.type.dtype.itemsize for v in node.outputs)
        if any(v.type.numel is None for v in node.outputs) or \
                out_bytes > in_bytes + max_growth:
            kept.append(node)
            continue
        try:
            with np.errstate(all="ignore"):
                outs = op.run(args, node.attrs)
        except Exception:  # the reference rejects these inputs; run time will report it
            kept.append(node)
            continue
        for v, a in zip(node.outputs, outs):
            a = np.asarray(a)
            if a.shape != tuple(v.type.shape) or a.dtype != v.type.dtype.np:
                break
        else:
            for v, a in zip(node.outputs, outs):
                const = Value(v.name, v.type, const=np.require(a, requirements="C"))
                graph.replace_all_uses(v, const)
            folded += 1
            continue
        kept.append(node)
    graph.nodes = kept
    return folded
