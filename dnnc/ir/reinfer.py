"""Copies of nodes with every type inferred again: a graph or a segment bound to new input
types (concrete shapes, known parameter values). The `specialize` pass binds a whole graph
this way (folding constants on the way); compiled targets bind each segment to the shapes a
call brings (`backends/plan.py`). Subgraphs of control-flow ops are copied with their reads of
outer values redirected (their own types are kept: they are inferred again when they run).
"""

from __future__ import annotations

from typing import Callable

from .graph import Graph, Node, Value
from .ops.registry import infer_node


def reinfer(nodes: list[Node], mapping: dict[int, Value],
            fold: Callable[[Node, Node], list[Value] | None] | None = None) -> list[Node]:
    """Copies of `nodes` reading `mapping`'s replacements of their inputs, every output type
    (and known value) inferred again; `mapping` gains the new outputs. With `fold`, nodes
    computable at compile time become constants on the way, so the types after them are
    inferred from the folded values (`fold(copy, node)` gives the copy's constant outputs, or
    None to keep it)."""
    out = []
    for node in nodes:
        ins = [None if v is None else mapping.get(id(v), v) for v in node.inputs]
        attrs = {k: _clone(a, mapping) if isinstance(a, Graph) else a
                 for k, a in node.attrs.items()}
        types, known, attrs = infer_node(node.op, ins, attrs, len(node.outputs), node.name)
        outs = []
        for v, t, kv in zip(node.outputs, types, known):
            nv = Value(v.name, t)
            nv.known = kv
            mapping[id(v)] = nv
            outs.append(nv)
        new = Node(node.op, ins, outs, attrs, node.name)
        consts = fold(new, node) if fold is not None else None
        if consts is not None:
            for v, c in zip(node.outputs, consts):
                mapping[id(v)] = c
            continue
        out.append(new)
    return out


def _clone(sub: Graph, outer: dict[int, Value]) -> Graph:
    """A copy of subgraph `sub` reading `outer`'s replacements of enclosing values."""
    mapping = dict(outer)
    inputs = []
    for v in sub.inputs:
        nv = Value(v.name, v.type)
        mapping[id(v)] = nv
        inputs.append(nv)
    out = Graph(sub.name, inputs=inputs)
    for node in sub.nodes:
        ins = [None if v is None else mapping.get(id(v), v) for v in node.inputs]
        attrs = {k: _clone(a, mapping) if isinstance(a, Graph) else a
                 for k, a in node.attrs.items()}
        outs = []
        for v in node.outputs:
            nv = Value(v.name, v.type)
            nv.known = v.known
            mapping[id(v)] = nv
            outs.append(nv)
        out.nodes.append(Node(node.op, ins, outs, attrs, node.name))
    out.outputs = [mapping.get(id(v), v) for v in sub.outputs]
    return out
