"""sink_transposes: move Transposes past positionwise ops and cancel inverse pairs, so that a
layout a rewrite chose for one op (`convert_layout`'s "nhwc_conv") carries through the
elementwise ops between two such ops instead of converting back and forth around each
(TVM's ConvertLayout with transpose sinking).

One walk in topological order. A positionwise node (pattern ELEMWISE or BROADCAST, no
parameter inputs, no `axis` (but a QuantizeLinear / DequantizeLinear of one scale and zero
point: the int8 values between cuda's channels-last int8 convolutions), one output) whose
every input is a Transpose by one perm P,
a constant (re-laid out once: broadcast to the output's rank, transposed by P's inverse), a
scalar, a value already read through a Transpose by P's inverse earlier in the graph (a
residual Add of a block's input, which its first convolution reads transposed: that
Transpose's output is taken), or a value whose transpose by P's inverse moves no element
(every dim of more than one element keeps its order after broadcasting: a
squeeze-and-excitation scale [N, C, 1, 1], read through a Reshape to [N, 1, 1, C], made
once) is computed before the Transpose: f(T_P(a), c) == T_P(f(a, T_P^-1(c))); its
output value stays the Transpose's, so the nodes after it see a transposed value and the
Transpose keeps moving down. A GlobalAveragePool (or a ReduceMean over the plane) of a
channels-last image (T: NHWC -> NCHW) becomes a ReduceMean over axes 1 and 2 before the
Transpose (the plane's mean taken channels-last: cuda's plane_mean.py), the Transpose moving
onto [N, 1, 1, C]; a MaxPool of a channels-last image becomes a MaxPoolNHWC before the
Transpose (resnet's stem pool, between two channels-last convs). A Transpose of a
Transpose by the inverse perm reads the inner one's input instead, and a second Transpose
of one value by one perm (two convs reading one input) the first's output. Last, a Transpose left that moves no element (only dims of size
1 move) becomes a Reshape. Dead Transposes are left to `eliminate_dead_code`.

Never moves a Transpose across anything that is not positionwise but that plane mean and
max pool (other pools, reductions, reshapes, products), and never changes a graph output's value.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.packed import NCHW_OF_NHWC, NHWC_OF_NCHW
from ..ir.ops.registry import Pattern, get_op
from ..ir.types import TensorType, int64
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
        ("axis" not in node.attrs or _per_tensor(node)) and len(node.outputs) == 1 and \
        not node.subgraphs()


def _per_tensor(node: Node) -> bool:
    """Whether `node` is a QuantizeLinear / DequantizeLinear of one scale and one zero
    point (its axis unused: the quantized values between int8 convolutions)."""
    return node.op in ("QuantizeLinear", "DequantizeLinear") and \
        not node.attrs.get("block_size") and \
        all(v is None or v.type.rank == 0 or (v.const is not None and v.type.shape == (1,))
            for v in node.inputs[1:])


def _relaid(c: Value, rank: int, inverse: tuple[int, ...]) -> Value:
    """Constant `c` broadcast to `rank` dims and transposed by `inverse`."""
    array = np.asarray(c.const)
    array = np.ascontiguousarray(array.reshape((1,) * (rank - array.ndim) + array.shape)
                                 .transpose(inverse))
    return Value(f"{c.name}.relaid", TensorType(c.type.dtype, array.shape), const=array)


def _reshaped(v: Value, rank: int, inverse: tuple[int, ...]) -> Node | None:
    """A Reshape of non-constant `v` to its shape broadcast to `rank` dims and transposed by
    `inverse`, when that transpose keeps the order of the dims of more than one element (so
    it moves no element); else None."""
    shape = (1,) * (rank - v.type.rank) + tuple(v.type.shape)
    if not all(isinstance(d, int) for d in shape) or \
            [i for i in inverse if shape[i] != 1] != sorted(i for i in inverse if shape[i] != 1):
        return None
    moved = tuple(shape[i] for i in inverse)
    target = Value(f"{v.name}.relaid.shape", TensorType(int64, (rank,)),
                   const=np.array(moved, np.int64))
    return Node("Reshape", [v, target], [Value(f"{v.name}.relaid", TensorType(
        v.type.dtype, moved))], {"allowzero": 0}, f"{v.name}.relaid")


def _sunk(node: Node, made: dict) -> list[Node] | None:
    """[any Reshapes (or `_requantized` nodes) of its inputs, node computed before the
    Transpose, the Transpose] when
    `node` can take its inputs' Transpose, else None; `made[(id(value), perm)]` is an earlier
    Transpose's (or Reshape's) output holding `value` transposed by `perm` (the Reshapes made
    here are added)."""
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
    inputs, reshapes = [], []
    for k, v in enumerate(node.inputs):
        if v is None or (v.const is None and v.type.rank == 0) or \
                (k > 0 and _per_tensor(node)):   # a scale or zero point of one element
            inputs.append(v)
        elif v.const is not None:
            inputs.append(_relaid(v, out.type.rank, inverse) if v.type.rank else v)
        elif _perm(v) == perm:
            inputs.append(v.producer.inputs[0])
        elif (id(v), inverse) in made:
            inputs.append(made[(id(v), inverse)])
        else:
            reshape = _requantized(v, inverse, made) or _reshaped(v, out.type.rank, inverse)
            if reshape is None:
                return None
            reshapes.append((v, reshape))
            inputs.append(reshape.outputs[0])
    inner = Value(f"{out.name}.sunk", TensorType(out.type.dtype,
                                                 tuple(out.type.shape[i] for i in inverse)))
    for v, reshape in reshapes:   # (read by later nodes too)
        made[(id(v), inverse)] = reshape.outputs[0]
    reshapes = [reshape for _, reshape in reshapes]
    return reshapes + [Node(node.op, inputs, [inner], node.attrs, node.name),
            Node("Transpose", [inner], [out], {"perm": list(perm)}, f"{node.name}.sunk")]


def _requantized(v: Value, inverse: tuple[int, ...], made: dict) -> Node | None:
    """A per-tensor DequantizeLinear / QuantizeLinear producing `v` (`_per_tensor`) again, on
    its input's transposed copy by `inverse` made earlier: a residual Add's DQ of a block's
    int8 input, which the block's first channels-last int8 conv reads transposed. None where
    there is no such copy."""
    node = v.producer
    if node is None or not _per_tensor(node) or (id(node.inputs[0]), inverse) not in made:
        return None
    out = Value(f"{v.name}.relaid", TensorType(v.type.dtype, tuple(
        v.type.shape[i] for i in inverse)))
    return Node(node.op, [made[(id(node.inputs[0]), inverse)]] + list(node.inputs[1:]), [out],
                node.attrs, f"{node.name}.relaid")


def _plane_mean(node: Node) -> bool:
    """Whether `node` is a mean over the plane of an NCHW image keeping its dims: a
    GlobalAveragePool, or a ReduceMean over axes (2, 3) (-2, -1) with keepdims."""
    if node.op == "GlobalAveragePool":
        return node.inputs[0].type.rank == 4
    if node.op != "ReduceMean" or node.attrs.get("keepdims", 1) != 1 or \
            len(node.inputs) < 2 or node.inputs[1] is None or node.inputs[1].const is None:
        return False
    axes = np.asarray(node.inputs[1].const).reshape(-1)
    return node.inputs[0].type.rank == 4 and sorted(int(a) % 4 for a in axes) == [2, 3]


def _pooled(node: Node) -> list[Node] | None:
    """GlobalAveragePool(T(a)) (or ReduceMean(T(a)) over the plane, keepdims) of a
    channels-last image a (T: NHWC -> NCHW) -> [ReduceMean(a, axes (1, 2), keepdims), T]:
    the mean over the plane taken channels-last (on cuda: plane_mean.py), the
    Transpose moved onto [N, 1, 1, C], where it is a Reshape (`_as_reshape`) or cancels
    against the next conv's."""
    if not _plane_mean(node) or _perm(node.inputs[0]) != NCHW_OF_NHWC:
        return None
    a, out = node.inputs[0].producer.inputs[0], node.outputs[0]
    n, _, _, c = a.type.shape
    axes = Value(f"{node.name}.axes", TensorType(int64, (2,)), const=np.array([1, 2], np.int64))
    inner = Value(f"{out.name}.sunk", TensorType(out.type.dtype, (n, 1, 1, c)))
    return [Node("ReduceMean", [a, axes], [inner], {"keepdims": 1}, node.name),
            Node("Transpose", [inner], [out], {"perm": list(NCHW_OF_NHWC)},
                 f"{node.name}.sunk")]


def _max_pooled(node: Node) -> list[Node] | None:
    """MaxPool(T(a)) (its Y only, 2-D) of a channels-last image a (T: NHWC -> NCHW) ->
    [MaxPoolNHWC(a), T]: the window maximum taken channels-last, the Transpose moved onto
    its output (where it cancels against the next conv's)."""
    if node.op != "MaxPool" or len(node.outputs) != 1 or node.inputs[0].type.rank != 4 or \
            _perm(node.inputs[0]) != NCHW_OF_NHWC:
        return None
    a, out = node.inputs[0].producer.inputs[0], node.outputs[0]
    attrs = {k: v for k, v in node.attrs.items() if k != "storage_order"}
    inner = Value(f"{out.name}.sunk", TensorType(out.type.dtype, tuple(
        out.type.shape[i] for i in NHWC_OF_NCHW)))
    return [Node("MaxPoolNHWC", [a], [inner], attrs, node.name),
            Node("Transpose", [inner], [out], {"perm": list(NCHW_OF_NHWC)},
                 f"{node.name}.sunk")]


def _as_reshape(node: Node) -> Node:
    """A Transpose that moves only dims of size 1 (the order of the others kept: no element
    moves) as a Reshape to its static output shape; any other node as it is."""
    if node.op != "Transpose" or not node.outputs[0].type.is_static:
        return node
    shape, perm = node.inputs[0].type.shape, _perm(node.outputs[0])
    if [i for i in perm if shape[i] != 1] != sorted(i for i in perm if shape[i] != 1):
        return node
    out = node.outputs[0]
    target = Value(f"{out.name}.shape", TensorType(int64, (out.type.rank,)),
                   const=np.array(out.type.shape, np.int64))
    return Node("Reshape", [node.inputs[0], target], [out], {"allowzero": 0}, node.name)


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
        new = _sunk(node, made) or _pooled(node) or _max_pooled(node) or [node]
        nodes += new
        changed += new[-1] is not node
    graph.nodes = [_as_reshape(n) for n in nodes]
    changed += sum(a is not b for a, b in zip(nodes, graph.nodes))
    eliminate_dead_code(graph)
    return changed
