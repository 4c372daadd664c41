"""fuse_ops: partition nodes into groups that lower to one kernel each.

The pass (`fuse_ops`) records the partition on the graph (`Graph.groups`): for each segment
(`ir.segments`: the runs of nodes a target compiles, between host fallbacks) the groups below,
within the target's fusion limits (`Target.fusion`: nodes per group, the layout ops an
anchor's template can store through). Every compiled target's orchestration
(`backends/plan.py`) lowers one kernel per group; without this pass (opt level < 2, or a
bisection stopping before it) every node is a kernel of its own.

By op pattern, as TVM fuses (Chen et al., OSDI 2018, section 3), in two phases:

1. An OUT_FUSABLE anchor (Conv, MatMul, Gemm, ...) takes the elementwise / broadcasting
   consumers that follow it (bias, activation, residual add, a GELU written op by op) as its
   epilogue, all at the anchor's own shape; where the anchor's template can store through an
   index map (`store_remaps`), a tail of layout ops (Reshape, Transpose) after the epilogue
   joins too, so the product is written straight into the layout its reader wants.
2. Every other group of elementwise, broadcast and injective ops fuses into the group that
   reads it: chains become one loop nest, and a reduction takes its producers (an Add before
   a ReduceMax) so they are computed where they are read instead of stored and loaded. A
   reduction read by another (a mean, then the variance around it) joins it: lowering keeps
   it as a scratch stage of the one kernel, as nervanagpu compiles such expressions.

Then each DynamicRange (the take_range pass's: a quantization's range, taken where its input
is made) joins the group whose last output it reads, as that group's second output, where
the group's anchor is one of the target's `range_producers` (`take_ranges`).

What stays apart: an anchor never fuses into what it reads or what reads it beyond its
epilogue (a conv or matmul is computed once, by its template); a value read outside its group
(by another group or after the segment) is a group's last output and nothing inside it is
needed elsewhere (nothing is computed twice); an expensive elementwise stage (exp, erf, ...) is not inlined where it would be recomputed (into a
reduction, which reads its input several times, or under a broadcast); OPAQUE ops stay alone.
Merging two groups is refused when a path leaves one of them through an outside group and
comes back, which would make the groups' order cyclic.
"""

from __future__ import annotations

import graphlib

from ..ir import loop as L
from ..ir.compute import NoCompute, apply_rule, placeholder, stages
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import Pattern, get_op, known_constant
from ..ir.segments import Segment, plan_steps
from ..ir.target import Fusion, Target

_EPILOGUE = (Pattern.ELEMWISE, Pattern.BROADCAST)
_INLINED = (Pattern.ELEMWISE, Pattern.BROADCAST, Pattern.INJECTIVE)

# intrinsics that cost tens of instructions: a stage using one is not recomputed per read
_EXPENSIVE = frozenset({"exp", "log", "erf", "tanh", "sigmoid", "pow", "sin", "cos", "tan",
                        "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
                        "log1p", "expm1", "atan2", "fmod"})


def fuse_ops(graph: Graph, target: Target) -> Graph:
    """Record on `graph` the kernels its nodes form for `target` (`Graph.groups`)."""
    limits = target.fusion
    groups: list[list[Node]] = []
    for step in plan_steps(graph):
        if isinstance(step, Segment):
            groups += take_ranges(fusion_groups(step.nodes, {id(v) for v in step.escaping},
                                                limits.max_group, dict(limits.store_remaps)),
                                  limits.range_producers)
        else:
            groups.append([step.node])
    graph.groups = groups
    return graph


def fusion_groups(nodes: list[Node], needed_outside: set[int], max_group: int = Fusion.max_group,
                  store_remaps: dict[str, frozenset[str]] | None = None
                  ) -> list[list[Node]]:
    """Groups of `nodes` (each in topological order, groups in an order that runs them).

    `needed_outside` holds ids of values read after these nodes (segment outputs): such a
    value may only leave a group as its last output. `store_remaps` maps an anchor op to the
    layout ops its template can store through (default: none).
    """
    return _Fusion(nodes, needed_outside, max_group, store_remaps or {}).run()


def take_ranges(groups: list[list[Node]], producers: frozenset[str]) -> list[list[Node]]:
    """`groups` with each lone DynamicRange moved into the group whose last node makes the
    value it reads, where that group's anchor (its node of the highest pattern) is one of
    `producers`: that kernel stores x and takes its range as it does (its template's range
    epilogue), a second output."""
    last = {id(g[-1].outputs[0]): g for g in groups
            if max(g, key=lambda n: get_op(n.op).pattern).op in producers}
    out = []
    for group in groups:
        node = group[0]
        taker = last.get(id(node.inputs[0])) if len(group) == 1 and \
            node.op == "DynamicRange" else None
        if taker is None:
            out.append(group)
        else:
            taker.append(node)
    return out


class _Fusion:
    def __init__(self, nodes, needed_outside, max_group, store_remaps):
        self.nodes = nodes
        self.max_group = max_group
        self.store_remaps = store_remaps
        self.position = {id(n): k for k, n in enumerate(nodes)}
        produced = {id(v): k for k, n in enumerate(nodes) for v in n.outputs}
        self.produced = produced
        self.readers: dict[int, list[int]] = {}      # value id -> the nodes that read it
        # the dataflow graph: node -> the nodes reading one of its outputs; node indices are
        # a topological order already (the graph IR keeps its nodes in one)
        self.successors: list[list[int]] = [[] for _ in nodes]
        for k, n in enumerate(nodes):
            for v in n.inputs:
                if v is not None and id(v) in produced:
                    if k not in self.successors[produced[id(v)]]:
                        self.successors[produced[id(v)]].append(k)
                    self.readers.setdefault(id(v), [])
                    if k not in self.readers[id(v)]:
                        self.readers[id(v)].append(k)
        self.needed_outside = needed_outside
        self.pattern = [get_op(n.op).pattern for n in nodes]
        self.group = list(range(len(nodes)))               # node -> group id
        self.members = {k: [k] for k in range(len(nodes))}  # group id -> nodes, in order
        self._expensive: dict[int, bool] = {}

    # -- the two phases ------------------------------------------------------------------------

    def run(self) -> list[list[Node]]:
        order = self.by_depth()
        for k in order:
            if self.pattern[k] == Pattern.OUT_FUSABLE and len(self.nodes[k].outputs) == 1:
                self.take_epilogue(k)
        for k in order:
            self.take_producers(k)
        groups = [[self.nodes[k] for k in sorted(ks)] for ks in self.members.values()]
        return sorted(groups, key=lambda g: self.position[id(g[-1])])

    def by_depth(self) -> list[int]:
        """The nodes in Kahn's order, a generation at a time: a node comes once everything it
        reads was taken (`graphlib`). In a residual block the shortcut's conv thus comes
        before the main branch's last one and takes the add as its epilogue."""
        sorter = graphlib.TopologicalSorter()
        for k, successors in enumerate(self.successors):
            sorter.add(k)
            for s in successors:
                sorter.add(s, k)
        return list(sorter.static_order())

    def take_epilogue(self, anchor: int) -> None:
        """Grow the anchor's group by its elementwise consumers (then a layout tail), and
        keep the longest prefix of them after which only the last node's value leaves."""
        shape = self.nodes[anchor].outputs[0].type.shape
        remaps = self.store_remaps.get(self.nodes[anchor].op, frozenset())
        chosen = [anchor]
        best = 1
        remapping = False
        while len(chosen) < self.max_group:
            nxt = self._next_consumer(chosen, shape, remaps, remapping)
            if nxt is None:
                break
            remapping = remapping or self.pattern[nxt] not in _EPILOGUE
            chosen.append(nxt)
            if self._single_output(chosen):
                best = len(chosen)
        for k in chosen[1:best]:
            self._merge(self.group[anchor], self.group[k])

    def _next_consumer(self, chosen: list[int], shape, remaps, remapping: bool) -> int | None:
        inside = set(chosen)
        candidates = sorted({c for k in chosen for c in self.successors[k]} - inside)
        for c in candidates:
            node = self.nodes[c]
            if len(self.members.get(c, ())) != 1 or len(node.outputs) != 1:
                continue   # already in a group (another anchor's)
            if remapping or self.pattern[c] not in _EPILOGUE:
                # layout tail: each op reads the previous one's value, all its other inputs
                # known at compile time
                if node.op not in remaps or node.inputs[0] is None or \
                        self.produced.get(id(node.inputs[0])) != chosen[-1] or \
                        not self._single_output(chosen) or \
                        any(v is not None and known_constant(v) is None
                            for v in node.inputs[1:]):
                    continue
            elif node.outputs[0].type.shape != shape:
                continue   # an epilogue is computed at the anchor's own index
            if not self._acyclic(inside | {c}):
                continue
            return c
        return None

    def take_producers(self, k: int) -> None:
        """Fuse into `k`'s group each producer group that only `k`'s group reads."""
        node = self.nodes[k]
        for v in node.inputs:
            if v is None or id(v) not in self.produced:
                continue
            p = self.produced[id(v)]
            gp, gc = self.group[p], self.group[k]
            if gp != gc and self._may_fuse_into(gp, gc, p, v):
                self._merge(gc, gp)

    def _may_fuse_into(self, gp: int, gc: int, p: int, v: Value) -> bool:
        producer, consumer = self.members[gp], self.members[gc]
        if len(producer) + len(consumer) > self.max_group or producer[-1] != p:
            return False
        if id(v) in self.needed_outside or \
                any(self.group[r] != gc for r in self.readers.get(id(v), [])):
            return False   # the value is needed elsewhere: it stays a group output
        kinds = [self.pattern[k] for k in producer + consumer]
        if any(kind not in _INLINED + (Pattern.REDUCE,) for kind in kinds):
            return False   # anchors take epilogues only; opaque ops stay alone
        if any(len(self.nodes[k].outputs) != 1 for k in producer + consumer):
            return False
        consumer_reduces = any(self.pattern[k] == Pattern.REDUCE for k in consumer)
        out = self.nodes[consumer[-1]].outputs[0]
        if any(self.nodes[k].op in CHECKED_GATHERS for k in producer) and (
                self._skips(consumer, v) or not consumer_reduces
                and (_size(out) is None or _size(v) is None or _size(out) < _size(v))):
            return False   # a fused gather checks only the indices its consumer reads
        grows = _size(out) != _size(v) or (_size(v) is None and out.type.shape != v.type.shape)
        if (consumer_reduces or grows) and any(self._is_expensive(k) for k in producer):
            return False   # it would be recomputed for every read
        return self._acyclic(set(producer) | set(consumer))

    def _skips(self, consumer: list[int], v: Value) -> bool:
        """Whether a `SKIPPING` node of `consumer` reads, as its data, `v` or a value computed
        from it (it may leave part of `v` uncomputed once fused)."""
        downstream = {id(v)}
        for k in consumer:
            node = self.nodes[k]
            if not any(x is not None and id(x) in downstream for x in node.inputs):
                continue
            if node.op in SKIPPING and node.inputs[0] is not None and \
                    id(node.inputs[0]) in downstream:
                return True
            downstream.update(id(o) for o in node.outputs)
        return False

    # -- invariants ----------------------------------------------------------------------------

    def _single_output(self, chosen: list[int]) -> bool:
        """Only the last node's value leaves the group, and that node comes last in the
        segment's order (the backend stores the last node's value); every other value stays
        inside."""
        if chosen[-1] != max(chosen):
            return False
        inside = set(chosen)
        for k in chosen[:-1]:
            v = self.nodes[k].outputs[0]
            if id(v) in self.needed_outside or \
                    any(r not in inside for r in self.readers.get(id(v), [])) or \
                    not self.readers.get(id(v)):
                return False
        return True

    def _acyclic(self, merged: set[int]) -> bool:
        """Whether the group order stays acyclic when `merged` (nodes; a union of groups) is
        one group: no path leaves it through an outside group and comes back."""
        merged_groups = {self.group[k] for k in merged}
        inside = set()
        for g in merged_groups:
            inside.update(self.members[g])
        inside |= merged
        last = max(inside)   # node indices are topological: a group after it cannot reach it
        frontier = [s for k in inside for s in self.successors[k] if s not in inside]
        seen: set[int] = set()
        while frontier:
            k = frontier.pop()
            group = self.members[self.group[k]]
            if k in seen or group[0] > last:
                continue
            seen.add(k)
            # the whole outside group of k runs as one: any of its nodes' successors follow
            for m in group:
                for s in self.successors[m]:
                    if s in inside:
                        return False
                    if s not in seen:
                        frontier.append(s)
                seen.add(m)
        return True

    def _merge(self, keep: int, other: int) -> None:
        for k in self.members[other]:
            self.group[k] = keep
        self.members[keep] = sorted(self.members[keep] + self.members.pop(other))

    def _is_expensive(self, k: int) -> bool:
        """Whether node k's compute rule calls a costly intrinsic (or cannot be told)."""
        if k not in self._expensive:
            self._expensive[k] = _calls_expensive(self.nodes[k])
        return self._expensive[k]


CHECKED_GATHERS = frozenset({"Gather", "GatherElements", "GatherND"})
"""Ops whose kernels check each index they read at run time (`loop.index_checks`)."""

SKIPPING = frozenset({"Slice", "Gather", "GatherElements", "GatherND", "Resize", "Pad",
                      "Split", "Compress"})
"""Inlined ops that may read only part of their input. Fused after a checked gather, the
elements they skip would never be computed, so an out-of-range index there would go
unreported on llvm and cuda while the numpy target raises (issue 30, item 3): such a
consumer reads the gather's stored output instead."""


def _size(v: Value) -> int | None:
    n = 1
    for d in v.type.shape:
        if not isinstance(d, int):
            return None
        n *= d
    return n


def _calls_expensive(node: Node) -> bool:
    args = [None if v is None else placeholder(f"in{k}", v.type.dtype, v.type.shape,
                                                value=known_constant(v))
            for k, v in enumerate(node.inputs)]
    try:
        outs = apply_rule(node.op, args, node.attrs, [v.type for v in node.outputs])
    except (NoCompute, Exception):   # no loop form (or none for these types): keep it alone
        return True
    return any(isinstance(e, L.Call) and e.name in _EXPENSIVE
               for t in stages(outs) if t.body is not None for e in L.walk(t.body))
