"""specialize: bind a graph to concrete input shapes (and parameter values) and re-infer.

Compiled targets build one program per input signature: with every shape static, shape
arithmetic folds away and kernels get constant extents. Graph inputs that only ever feed
an op's *parameter* slots (Reduce axes, Reshape shapes, Slice starts, Resize scales: the
`params` of its registration) are bound by value too, as constants, so those ops compile to
loops instead of running as host fallbacks; `param_inputs` says which inputs qualify.
The copies are `ir.reinfer`'s (which the compiled targets also use to specialise a segment).
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.graph import Graph, Value
from ..ir.ops.registry import get_op
from ..ir.reinfer import reinfer
from .fold_constants import MAX_GROWTH_BYTES, folded_outputs, weight_producers

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
    with every node's type inferred again and, with `fold`, constants folded (weights
    whatever their size: see fold_constants)."""
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
    weights = weight_producers(graph) if fold else set()

    def fold_node(new, node):
        return folded_outputs(new, None if id(node) in weights else MAX_GROWTH_BYTES)

    out.nodes = reinfer(graph.nodes, mapping, fold=fold_node if fold else None)
    out.outputs = [mapping.get(id(v), v) for v in graph.outputs]
    out.aliases = dict(graph.aliases)
    return out
