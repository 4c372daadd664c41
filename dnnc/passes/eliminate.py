"""eliminate_dead_code and eliminate_common_subexpressions.

Dead code: nodes none of whose outputs is read (by a node, a subgraph or the graph's outputs).
Common subexpressions: two deterministic nodes of the same op, attributes and inputs compute
the same values; the later one's readers read the earlier one's outputs. Nodes with subgraphs
or array-valued attributes are left alone (their equality is not cheap to decide).
"""

from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ops.registry import get_op
from ..ir.types import DType


def eliminate_dead_code(graph: Graph) -> int:
    """Remove unread nodes, last to first; returns how many were removed."""
    read = {id(v) for v in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if not any(id(v) in read for v in node.outputs) and get_op(node.op).deterministic:
            continue
        kept.append(node)
        for v in node.inputs:
            if v is not None:
                read.add(id(v))
        for sub in node.subgraphs():
            for inner in sub.walk():
                for v in inner.inputs:
                    if v is not None:
                        read.add(id(v))
            for v in sub.outputs:
                read.add(id(v))
    removed = len(graph.nodes) - len(kept)
    graph.nodes = list(reversed(kept))
    return removed


_SIMPLE = (int, float, str, bool, type(None), DType)


def _key(node):
    items = []
    for name, value in sorted(node.attrs.items()):
        if isinstance(value, (list, tuple)):
            if not all(isinstance(x, _SIMPLE) for x in value):
                return None
            value = tuple(value)
        elif not isinstance(value, _SIMPLE):
            return None
        items.append((name, repr(value)))
    return node.op, tuple(id(v) if v is not None else None for v in node.inputs), \
        len(node.outputs), tuple(items)


def eliminate_common_subexpressions(graph: Graph) -> int:
    """Merge nodes that compute the same thing; returns how many were merged."""
    seen = {}
    kept = []
    merged = 0
    for node in graph.nodes:
        key = None if node.subgraphs() or not get_op(node.op).deterministic else _key(node)
        if key is not None and key in seen:
            for old, new in zip(node.outputs, seen[key].outputs):
                graph.replace_all_uses(old, new)
            merged += 1
            continue
        if key is not None:
            seen[key] = node
        kept.append(node)
    graph.nodes = kept
    return merged
