"""sink_transposes: move Transposes past positionwise ops and cancel inverse pairs, so that a
layout a rewrite chose for one op (`convert_layout`'s "nhwc_conv") carries through the
elementwise ops between two such ops instead of converting back and forth around each
(TVM's ConvertLayout with transpose sinking).

One walk in topological order. A positionwise node (pattern ELEMWISE or BROADCAST, no
parameter inputs, no `axis`, one output) whose every input is a Transpose by one perm P,
a constant (re-laid out once: broadcast to the output's rank, transposed by P's inverse), a
scalar, or a value already read through a Transpose by P's inverse earlier in the graph (a
residual Add of a block's input, which its first convolution reads transposed: that
Transpose's output is taken) is computed before the Transpose:
f(T_P(a), c) == T_P(f(a, T_P^-1(c))); its
output value stays the Transpose's, so the nodes after it see a transposed value and the
Transpose keeps moving down. A Transpose of a Transpose by the inverse perm reads the
inner one's input instead, and a second Transpose of one value by one perm (two convs
reading one input) the first's output. Dead Transposes are left to `eliminate_dead_code`.

Never moves a Transpose across anything that is not positionwise (pools, reductions,
reshapes, products), and never changes a graph output's value.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import Pattern, get_op
from ..ir.types import TensorType
from .eliminate import eliminate_dead_code


def _perm(value: Value | None) -> tuple[int, ...] | None:
    """The perm of the Transpose producing `value`, else None."""
    node = value.producer if value is not None else None
    if node is None or node.op != "Transpose":
        return None
    return tuple(node.attrs.get("perm") or range(value.type.rank)[::-1])


def positionwise(node: Node) -> bool:
    """Whether `node` computes each output element from the inputs' elements at the same
    (broadcast) position: it commutes with a Transpose."""
    op = get_op(node.op)
    return op.pattern in (Pattern.ELEMWISE, Pattern.BROADCAST) and not op.params and \
        "axis" not in node.attrs and len(node.outputs) == 1 and not node.subgraphs()


def _relaid(c: Value, rank: int, inverse: tuple[int, ...]) -> Value:
    """Constant `c` broadcast to `rank` dims and transposed by `inverse`."""
    array = np.asarray(c.const)
    array = np.ascontiguousarray(array.reshape((1,) * (rank - array.ndim) + array.shape)
                                 .transpose(inverse))
    return Value(f"{c.name}.relaid", TensorType(c.type.dtype, array.shape), const=array)


def _sunk(node: Node, inverted) -> list[Node] | None:
    """[node computed before the Transpose, the Transpose] when `node` can take its inputs'
    Transpose, else None; `inverted(value, perm)` is an earlier Transpose's output holding
    `value` transposed by `perm`, or None."""
    if not positionwise(node):
        return None
    out = node.outputs[0]
    perms = {_perm(v) for v in node.inputs if v is not None and v.const is None and
             v.type.rank > 0} - {None}
    if len(perms) != 1:
        return None
    (perm,) = perms
    if len(perm) != out.type.rank or any(v is not None and v.type.rank > out.type.rank
                                         for v in node.inputs):
        return None
    inverse = tuple(int(i) for i in np.argsort(perm))
    inputs = []
    for v in node.inputs:
        if v is None or (v.const is None and v.type.rank == 0):
            inputs.append(v)
        elif v.const is not None:
            inputs.append(_relaid(v, out.type.rank, inverse) if v.type.rank else v)
        elif _perm(v) == perm:
            inputs.append(v.producer.inputs[0])
        else:
            inputs.append(inverted(v, inverse))
            if inputs[-1] is None:
                return None
    inner = Value(f"{out.name}.sunk", TensorType(out.type.dtype,
                                                 tuple(out.type.shape[i] for i in inverse)))
    return [Node(node.op, inputs, [inner], node.attrs, node.name),
            Node("Transpose", [inner], [out], {"perm": list(perm)}, f"{node.name}.sunk")]


def sink_transposes(graph: Graph) -> int:
    """Sink Transposes through positionwise ops and cancel inverse pairs, in place; returns
    how many nodes moved or cancelled."""
    renamed: dict[int, Value] = {}
    # values a subgraph reads keep their identity (the renaming does not reach inside)
    kept = {id(v) for v in graph.outputs} | {
        id(v) for v, readers in graph.users().items() if any(n.subgraphs() for n in readers)}
    nodes, changed = [], 0
    made: dict[tuple, Value] = {}   # (input, perm) -> the output of its Transpose kept

    for node in graph.nodes:
        node.inputs = [renamed.get(id(v), v) if v is not None else None for v in node.inputs]
        if node.op == "Transpose" and id(node.outputs[0]) not in kept:
            perm, outer = _perm(node.inputs[0]), _perm(node.outputs[0])
            key = (id(node.inputs[0]), outer)
            if perm is not None and all(perm[outer[i]] == i for i in range(len(perm))):
                # T_outer(T_perm(x)) == x
                renamed[id(node.outputs[0])] = node.inputs[0].producer.inputs[0]
                changed += 1
                continue
            if key in made:   # the same Transpose of the same value: the first one's
                renamed[id(node.outputs[0])] = made[key]
                changed += 1
                continue
            made[key] = node.outputs[0]
        new = _sunk(node, lambda v, p: made.get((id(v), p))) or [node]
        nodes += new
        changed += new[0] is not node
    graph.nodes = nodes
    eliminate_dead_code(graph)
    return changed
