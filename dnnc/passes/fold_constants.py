"""fold_constants: evaluate nodes whose inputs are all known at compile time.

Shape arithmetic as exporters write it (Shape -> Gather -> Concat -> Reshape) disappears once
shapes are static: a value whose contents inference already knows exactly (`Value.known`
without symbols) counts as constant. Nodes run with the registry's NumPy reference; a node
is left alone when it is not deterministic (random ops), owns subgraphs, or would
materialise a large constant from small inputs (ConstantOfShape of a big shape, Expand):
those stay nodes that compute their output at run time, at no memory cost.

Except weights: a node whose every output is read only at an op's weight inputs (the
registry's `weights`: Conv's filter and bias, MatMul's and Gemm's B, ...), directly or
through other such nodes, is folded whatever its size (`weight_producers`). Models whose
weights are made by ConstantOfShape (onnx's light models) then reach convert_layout with
constant weights, which it packs once; left as nodes, such a weight is written out on every
call and its conv repacks it on every call too (light zfnet512: 264 ms against 67 ms with
the same weights as initializers, issue 14).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import get_op, known_constant

MAX_GROWTH_BYTES = 1 << 20
"""A folded output may exceed its inputs' size by at most this much."""


def weight_producers(graph: Graph) -> set[int]:
    """ids of the nodes of `graph` whose every output is read, and read only as weights: at
    an input its reader's op lists in `weights`, or by another such node (a Transpose or a
    Reshape of a weight). A read from a subgraph or as a graph output is no weight read."""
    reads: dict[int, list[tuple[Node | None, int]]] = {}
    for node in graph.nodes:
        for k, v in enumerate(node.inputs):
            if v is not None:
                reads.setdefault(id(v), []).append((node, k))
        for sub in node.subgraphs():
            for inner in sub.walk():
                for v in inner.inputs:
                    if v is not None:
                        reads.setdefault(id(v), []).append((None, -1))
            for v in sub.outputs:
                reads.setdefault(id(v), []).append((None, -1))
    for v in graph.outputs:
        reads.setdefault(id(v), []).append((None, -1))
    producers: set[int] = set()

    def read_as_weights(v: Value) -> bool:
        uses = reads.get(id(v), [])
        return bool(uses) and all(
            reader is not None and (k in get_op(reader.op).weights or id(reader) in producers)
            for reader, k in uses)

    for node in reversed(graph.nodes):   # readers before the nodes they read
        if node.outputs and all(read_as_weights(v) for v in node.outputs):
            producers.add(id(node))
    return producers


def folded_outputs(node, max_growth: int | None = MAX_GROWTH_BYTES) -> list[Value] | None:
    """Constant Values for `node`'s outputs when it can be evaluated at compile time (every
    input known, deterministic, no subgraphs, no large materialisation: at most `max_growth`
    bytes more than its inputs, any size when it is None), else None."""
    op = get_op(node.op)
    if not op.deterministic:
        return None
    outs_known = [known_constant(v) for v in node.outputs]
    if all(a is not None for a in outs_known):
        # inference already knows the result (Shape, Size of static inputs)
        return [Value(v.name, v.type, const=np.require(a, requirements="C"))
                for v, a in zip(node.outputs, outs_known)]
    args = [known_constant(v) for v in node.inputs]
    if node.subgraphs() or any(a is None and v is not None for a, v in zip(args, node.inputs)):
        return None
    in_bytes = sum(a.nbytes for a in args if a is not None)
    out_bytes = sum((v.type.numel or 0) * v.type.dtype.itemsize for v in node.outputs)
    if any(v.type.numel is None for v in node.outputs) or \
            (max_growth is not None and out_bytes > in_bytes + max_growth):
        return None
    try:
        with np.errstate(all="ignore"):
            outs = op.run(args, node.attrs)
    except Exception:  # the reference rejects these inputs; run time will report it
        return None
    consts = []
    for v, a in zip(node.outputs, outs):
        a = np.asarray(a)
        if a.shape != tuple(v.type.shape) or a.dtype != v.type.dtype.np:
            return None
        consts.append(Value(v.name, v.type, const=np.require(a, requirements="C")))
    return consts


def fold_constants(graph: Graph, max_growth: int = MAX_GROWTH_BYTES) -> int:
    """Fold in place; returns how many nodes were folded; weights (`weight_producers`) fold
    whatever their size. (Types downstream are not inferred again: `specialize(fold=True)`
    folds during its inference walk, which refines them.)"""
    weights = weight_producers(graph)
    kept = []
    folded = 0
    for node in graph.nodes:
        consts = folded_outputs(node, None if id(node) in weights else max_growth)
        if consts is None:
            kept.append(node)
            continue
        for v, c in zip(node.outputs, consts):
            graph.replace_all_uses(v, c)
        folded += 1
    graph.nodes = kept
    return folded
