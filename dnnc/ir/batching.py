"""Which segments compute each item of a batch on its own: the proof behind running a new batch
size on code compiled for another (`backends/batch_split.py`, `BatchSplit`).

A segment is *batch-separable* along a symbolic dim `s` when every escaping output has `s` as
its axis 0 and output item `i` along it is computed from item `i` of the inputs that have `s`
as axis 0 (the rest are shared whole: weights, masks). Then the segment's code compiled for
`b` items computes `n` items in ceil(n / b) calls over slices along axis 0, with no compile.

The proof is local, node by node, on the graph's symbolic types:
- every value the segment touches has `s` at axis 0 only, or nowhere in its shape (a value
  with `s` elsewhere, or inside an expression such as `2*N`, mixes items along another axis);
- a node with an input that has `s` gives every output `s` at axis 0 (so nothing reduces
  over the batch);
- the op's own rule (its registry entry's `batched`) says that, given which inputs carry `s`,
  output item `i` reads only item `i` of them: a convolution's data input but not its filter,
  a softmax over any axis but 0, a Gather of embedding rows by per-item indices. Elementwise
  and broadcasting ops share one rule (`broadcasting`); ops with no rule are not separable
  (which is always safe: the segment compiles for the new size as before);
- the batch's size itself (Shape of a batched value, and arithmetic on it) may only reach
  an op as a parameter (a Reshape's target shape): each slice's code computes it for its own
  size, which is what a Reshape to [batch, ...] needs; as data (x / batch size) it is not
  separable.

Never assume what a rule does not say: a wrong "yes" here is a miscompile.
"""

from __future__ import annotations

import re

from .graph import Node, Value
from .ops.registry import Pattern, get_op


def batch_symbol(nodes: list[Node], inputs: list[Value], outputs: list[Value]) -> str | None:
    """The symbol along whose axis 0 the nodes (a segment, in topological order, reading
    `inputs` and producing `outputs`) are batch-separable, or None."""
    first = [v.type.shape[0] for v in outputs if v.type.rank]
    if not first or len(first) != len(outputs) or len(set(first)) != 1:
        return None
    s = first[0]
    if not isinstance(s, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", s):
        return None
    token = re.compile(rf"(?<![\w.]){re.escape(s)}(?![\w.])")
    if not all(_placed(v, s, token) for v in inputs):
        return None
    sizes: set[int] = set()   # ids of values computed from the batch's size (Shape's)
    for node in nodes:
        if not all(v is None or _placed(v, s, token) for v in node.inputs + node.outputs):
            return None
        carried = [v is not None and v.type.rank > 0 and v.type.shape[0] == s
                   for v in node.inputs]
        op = get_op(node.op)
        read = [k for k, v in enumerate(node.inputs) if v is not None and id(v) in sizes]
        if (op.known is not None and any(carried)) or any(k not in op.params for k in read):
            # shape arithmetic (Shape -> Gather -> Concat, as exporters write a Reshape's
            # target): a slice's code computes it for its own size, and its results may
            # only parameterise ops (a Reshape's shape), never be data (x / batch size)
            if (any(carried) and op.known is None) or \
                    any(_carries(v, s) for v in node.outputs):
                return None
            sizes.update(id(v) for v in node.outputs)
            continue
        if not any(carried):
            if any(_carries(v, s) for v in node.outputs):
                return None   # a batch made from no batch (Expand to a shape value, say)
            continue
        if not all(_carries(v, s) for v in node.outputs) or not node_batched(node, carried):
            return None
    return s


def node_batched(node: Node, carried: list[bool]) -> bool:
    """Whether `node` computes output item i from item i of its `carried` inputs alone (its
    values already checked by `batch_symbol`)."""
    op = get_op(node.op)
    if op.batched is not None:
        return op.batched(node, carried)
    if op.pattern in (Pattern.ELEMWISE, Pattern.BROADCAST):
        return broadcasting(node, carried)
    return False


def _carries(v: Value, s: str) -> bool:
    return v.type.rank > 0 and v.type.shape[0] == s


def _placed(v: Value, s: str, token: re.Pattern) -> bool:
    """`s` is v's axis 0 exactly, or appears nowhere in v's shape."""
    for axis, d in enumerate(v.type.shape):
        if isinstance(d, str) and token.search(d) and not (axis == 0 and d == s):
            return False
    return True


# -- the rules ops register (`register_op(..., batched=...)`) ------------------------------------


def attr(node: Node, name: str):
    """An attribute of the node, or the op's default."""
    return node.attrs.get(name, get_op(node.op).attrs.get(name))


def const_input(node: Node, k: int):
    """Input k's constant contents as a list of ints; None when absent or not constant."""
    if k >= len(node.inputs) or node.inputs[k] is None or node.inputs[k].const is None:
        return None
    return [int(a) for a in node.inputs[k].const.reshape(-1)]


def _axis(node: Node, value: int, rank: int | None = None) -> int:
    rank = node.inputs[0].type.rank if rank is None else rank
    return value + rank if value < 0 else value


def broadcasting(node: Node, carried: list[bool]) -> bool:
    """Elementwise with NumPy broadcasting: an input with the batch has the output's rank; one
    without it has a lower rank or size 1 at axis 0 (read whole by every item). Inputs that
    parameterise the op (Expand's shape) are not data."""
    params = get_op(node.op).params
    rank = node.outputs[0].type.rank
    for k, (v, c) in enumerate(zip(node.inputs, carried)):
        if v is None or k in params:
            continue
        if c and v.type.rank != rank:
            return False
        if not c and v.type.rank == rank and v.type.shape[0] != 1:
            return False
    return True


def data_input(node: Node, carried: list[bool]) -> bool:
    """Item i of the output reads item i of input 0 and the other inputs whole (weights,
    scales, zero points): convolutions, pools, per-item normalisations."""
    return carried[0] and not any(carried[1:]) and len(node.outputs) == 1


def reshaping(node: Node, carried: list[bool]) -> bool:
    """Reshape, Flatten, Squeeze, Unsqueeze: row-major, an output whose axis 0 is the input's
    axis 0 keeps each item's elements together, in order (the shape input is shared)."""
    return carried[0] and not any(carried[1:])


def along_axis(name: str = "axis"):
    """Input 0's items are independent along any axis but 0 (Softmax, LayerNormalization,
    ArgMax, LpNormalization...): the rule for an op working along attribute `name`; the other
    inputs (scale, bias) are shared."""

    def rule(node: Node, carried: list[bool]) -> bool:
        return reshaping(node, carried) and _axis(node, int(attr(node, name))) != 0

    return rule


def joining(node: Node, carried: list[bool]) -> bool:
    """Concat along an axis other than 0: every input carries the batch."""
    return all(carried) and _axis(node, int(attr(node, "axis"))) != 0


def splitting(node: Node, carried: list[bool]) -> bool:
    """Split along an axis other than 0 (the split sizes are shared)."""
    return reshaping(node, carried) and _axis(node, int(attr(node, "axis"))) != 0


def reducing(node: Node, carried: list[bool]) -> bool:
    """Reduce*: the reduced axes (attribute, or a constant input 1) leave axis 0 alone; no
    axes reduce everything, unless `noop_with_empty_axes`."""
    if not data_input(node, carried):
        return False
    axes = attr(node, "axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const_input(node, 1)
        if axes is None:
            return False   # axes known only at run time
    if not axes:
        return bool(attr(node, "noop_with_empty_axes"))
    return all(_axis(node, int(a)) != 0 for a in axes)


def matmul(node: Node, carried: list[bool]) -> bool:
    """A's axis 0 is a row or batch axis when A has rank >= 2; B's is a batch axis only at
    rank >= 3 (at rank 2 it is the contraction); an operand without the batch is a matrix
    read whole, or broadcasts along axis 0."""
    rank = node.outputs[0].type.rank
    for v, c, least in zip(node.inputs[:2], carried, (2, 3)):
        if c and (v.type.rank < least or v.type.rank != rank):
            return False
        if not c and v.type.rank == rank > 2 and v.type.shape[0] != 1:
            return False
    return not any(carried[2:])


def packed_matmul(node: Node, carried: list[bool]) -> bool:
    """MatMulPacked: rows of A are items; the packed B and the bias are shared."""
    return data_input(node, carried) and node.inputs[0].type.rank >= 2


def gemm(node: Node, carried: list[bool]) -> bool:
    """Rows of A (not transposed) are items; B is shared; C may be per item."""
    return carried[0] and not attr(node, "transA") and not carried[1]


def gather(node: Node, carried: list[bool]) -> bool:
    """Along axis 0 of a shared table by per-item indices (embeddings), or along another
    axis of per-item data by shared indices."""
    axis = _axis(node, int(attr(node, "axis")))
    if axis == 0:
        return not carried[0] and carried[1]
    return carried[0] and not carried[1]


def transpose(node: Node, carried: list[bool]) -> bool:
    perm = attr(node, "perm")
    return carried[0] and perm is not None and int(perm[0]) == 0


def slicing(node: Node, carried: list[bool]) -> bool:
    """Slice along constant axes other than 0 (no axes input: the first len(starts) axes,
    axis 0 among them)."""
    axes = const_input(node, 3)
    return carried[0] and not any(carried[1:]) and axes is not None and \
        all(_axis(node, a) != 0 for a in axes)


def padding(node: Node, carried: list[bool]) -> bool:
    """Pad with constant pads that leave axis 0 alone (no axes input)."""
    pads = attr(node, "pads")
    if pads is None:
        pads = const_input(node, 1)
    rank = node.inputs[0].type.rank
    no_axes = len(node.inputs) < 4 or node.inputs[3] is None
    return data_input(node, carried) and no_axes and pads is not None and \
        len(pads) == 2 * rank and pads[0] == 0 and pads[rank] == 0


def attention(node: Node, carried: list[bool]) -> bool:
    """FusedAttention: Q, K and V have equal batch dims (rank >= 3: axis 0 is one of them);
    the mask and drop inputs broadcast."""
    return all(v.type.rank >= 3 for v in node.inputs[:3]) and carried[0] and \
        broadcasting(node, carried)
