"""fuse_ops: partition nodes into groups that lower to one kernel each.

By op pattern, as TVM fuses: an OUT_FUSABLE anchor (Conv, MatMul, Gemm, ...) takes the chain
of elementwise / broadcasting consumers that follows it (bias, activation, residual add) as
its epilogue; a chain of elementwise ops becomes one loop nest. A value inside a group must be
read by nothing outside it (nothing is computed twice), and a group's output keeps the
anchor's shape (an epilogue may not broadcast it bigger). Reductions and opaque ops stay
alone in this first slice.
"""

from __future__ import annotations

from ..ir.graph import Node, Value
from ..ir.ops.registry import Pattern, get_op

MAX_GROUP = 8
"""Nodes per group at most (compile time grows with the expression size)."""

_CHAINABLE = (Pattern.ELEMWISE, Pattern.BROADCAST)


def fusion_groups(nodes: list[Node], needed_outside: set[int],
                  max_group: int = MAX_GROUP) -> list[list[Node]]:
    """Groups of `nodes` (kept in order); `needed_outside` holds ids of values read after
    these nodes (segment outputs), which may only leave a group as its last output."""
    readers: dict[int, int] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None:
                readers[id(v)] = readers.get(id(v), 0) + 1
    groups: list[list[Node]] = []
    position = {id(n): k for k, n in enumerate(nodes)}
    taken: set[int] = set()
    for node in nodes:
        if id(node) in taken:
            continue
        pattern = get_op(node.op).pattern
        group = [node]
        taken.add(id(node))
        if pattern == Pattern.OUT_FUSABLE or pattern in _CHAINABLE:
            tail = node
            while len(group) < max_group and len(tail.outputs) == 1:
                out = tail.outputs[0]
                if id(out) in needed_outside or readers.get(id(out), 0) != 1:
                    break
                nxt = _only_reader(nodes, out, position[id(tail)])
                if nxt is None or id(nxt) in taken or get_op(nxt.op).pattern not in _CHAINABLE \
                        or len(nxt.outputs) != 1 or nxt.outputs[0].type.shape != out.type.shape:
                    break
                # every other input of the next node must exist before the group runs
                if any(v is not None and v is not out and v.producer is not None and
                       id(v.producer) in taken and v.producer not in group
                       for v in nxt.inputs):
                    break
                group.append(nxt)
                taken.add(id(nxt))
                tail = nxt
        groups.append(group)
    return _in_order(groups, position)


def _only_reader(nodes: list[Node], value: Value, after: int) -> Node | None:
    for n in nodes[after + 1:]:
        if any(v is value for v in n.inputs):
            return n
    return None


def _in_order(groups: list[list[Node]], position: dict[int, int]) -> list[list[Node]]:
    """Groups ordered by their last node, so every group's inputs are computed before it."""
    return sorted(groups, key=lambda g: position[id(g[-1])])
