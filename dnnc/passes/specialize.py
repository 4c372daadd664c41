"""specialize: bind a graph to concrete input shapes (and parameter values) and re-infer.

Compiled targets build one program per input signature: with every shape static, shape
arithmetic folds away and kernels get constant extents. Graph inputs that only ever feed
an op's *parameter* slots (Reduce axes, Reshape shapes, Slice starts, Resize scales: the
`params` of its registration) are bound by value too, as constants, so those ops compile to
loops instead of running as host fallbacks; `param_inputs` says which inputs qualify.
Subgraphs of control-flow ops are copied with their reads of outer values redirected (their
own types are kept: they are inferred again when they run).
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import get_op, infer_node
from .fold_constants import folded_outputs

MAX_PARAM_ELEMENTS = 64


def param_inputs(graph: Graph) -> list[int]:
    """Indices of graph inputs read only at parameter slots (small integer tensors)."""
    slots: dict[int, list[bool]] = {}
    for node in graph.nodes:
        params = get_op(node.op).params
        for k, v in enumerate(node.inputs):
            if v is not None:
                slots.setdefault(id(v), []).append(k in params)
    for node in graph.walk():
        if node.subgraphs():
            for sub in node.subgraphs():
                for inner in sub.walk():
                    for v in inner.inputs:
                        if v is not None:
                            slots.setdefault(id(v), []).append(False)
    for v in graph.outputs:
        slots.setdefault(id(v), []).append(False)
    out = []
    for i, v in enumerate(graph.inputs):
        uses = slots.get(id(v), [])
        numel = v.type.numel
        if uses and all(uses) and v.type.dtype.is_int and numel is not None and \
                numel <= MAX_PARAM_ELEMENTS:
            out.append(i)
    return out


def specialize(graph: Graph, shapes: list[tuple], values: dict[int, np.ndarray] | None = None,
               fold: bool = True) -> Graph:
    """A copy of `graph` whose inputs have `shapes` (inputs in `values` become constants),
    with every node's type inferred again and, with `fold`, constants folded."""
    values = values or {}
    mapping: dict[int, Value] = {}
    inputs = []
    for i, (v, shape) in enumerate(zip(graph.inputs, shapes)):
        nv = Value(v.name, T.TensorType(v.type.dtype, tuple(shape)))
        inputs.append(nv)
        if i in values:
            array = np.require(np.asarray(values[i], v.type.dtype.np), requirements="C")
            mapping[id(v)] = Value(v.name, nv.type, const=array)
        else:
            mapping[id(v)] = nv
    out = Graph(graph.name, inputs=inputs)
    out.nodes = reinfer(graph.nodes, mapping, fold=fold)
    out.outputs = [mapping.get(id(v), v) for v in graph.outputs]
    return out


def reinfer(nodes: list[Node], mapping: dict[int, Value], fold: bool = False) -> list[Node]:
    """Copies of `nodes` reading `mapping`'s replacements of their inputs, every output type
    (and known value) inferred again; `mapping` gains the new outputs. With `fold`, nodes
    computable at compile time become constants on the way, so the types after them are
    inferred from the folded values."""
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
        consts = folded_outputs(new) if fold else None
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
