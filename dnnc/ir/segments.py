"""Where compiled code runs and where the host does: a graph's nodes as *steps*.

Maximal runs of nodes with a loop form (a compute rule that applies to them) form a
`Segment`, compiled as one unit by a target; a node without one (`NoCompute`) is a `HostStep`
that runs between segments through its NumPy reference. A node whose parameter inputs (Reduce
axes, Reshape shapes, ...) are only known at run time starts a segment of its own, specialised
on their values.

Both the fuse_ops pass (which groups each segment's nodes into kernels) and the shared
orchestration (`backends/plan.py`, which compiles segments) read this one partition, so the
groups a pass chose always lie inside the segments a target compiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .compute import NoCompute, apply_rule, placeholder
from .graph import Graph, Node, Value
from .ops.registry import get_op, known_constant


@dataclass
class Segment:
    """Consecutive nodes compiled together."""

    index: int
    nodes: list[Node]
    inputs: list[Value] = field(default_factory=list)     # read from earlier steps
    escaping: list[Value] = field(default_factory=list)   # needed by later steps / outputs
    # positions in `inputs` of parameter inputs (axes, shapes...) only known at run time:
    # the segment is specialised on their values as well as on shapes
    value_inputs: list[int] = field(default_factory=list)


@dataclass
class HostStep:
    node: Node


def has_loop_form(node: Node) -> bool:
    """Whether `node`'s compute rule applies to it (as `lower_group` will apply it)."""
    args = [None if v is None else placeholder(f"in{k}", v.type.dtype, v.type.shape,
                                                value=known_constant(v))
            for k, v in enumerate(node.inputs)]
    try:
        apply_rule(node.op, args, node.attrs, [v.type for v in node.outputs])
    except NoCompute:
        return False
    except Exception:   # a failing rule is reported, naming the node, when the kernel lowers
        return True
    return True


def unknown_params(node: Node) -> bool:
    """Whether some parameter input of `node` is not known at compile time."""
    for i in get_op(node.op).params:
        if i < len(node.inputs) and node.inputs[i] is not None and \
                known_constant(node.inputs[i]) is None:
            return True
    return False


def plan_steps(graph: Graph, forced_host: frozenset = frozenset()) -> list:
    """The graph's steps, in order; nodes whose ids are in `forced_host` run on the host."""
    steps: list = []
    run: list[Node] = []
    for node in graph.nodes:
        if id(node) not in forced_host:
            if has_loop_form(node):
                run.append(node)
                continue
            if unknown_params(node):
                # its parameters come from earlier steps: a new segment starts here and
                # is specialised on their values
                if run:
                    steps.append(Segment(len(steps), run))
                run = [node]
                continue
        if run:
            steps.append(Segment(len(steps), run))
            run = []
        steps.append(HostStep(node))
    if run:
        steps.append(Segment(len(steps), run))
    connect(graph, steps)
    return steps


def steps_from(graph: Graph, plan: list[dict]) -> list:
    """Steps from their description as data (`describe`); the same analysis as `plan_steps`."""
    nodes = graph.nodes
    steps: list = []
    for entry in plan:
        if "host" in entry:
            steps.append(HostStep(nodes[entry["host"]]))
        else:
            steps.append(Segment(len(steps), [nodes[k] for k in entry["segment"]]))
    covered = sorted(k for e in plan for k in (e["segment"] if "segment" in e
                                               else [e["host"]]))
    if covered != list(range(len(nodes))):
        raise ValueError("the plan does not cover every node of the graph once")
    connect(graph, steps)
    return steps


def describe(graph: Graph, steps: list) -> list[dict]:
    """The steps as plain data: `{"segment": [node indices]}` or `{"host": node index}`."""
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    return [{"host": index[id(s.node)]} if isinstance(s, HostStep)
            else {"segment": [index[id(n)] for n in s.nodes]} for s in steps]


def connect(graph: Graph, steps: list) -> None:
    """Each segment's inputs (read from earlier steps) and escaping values."""
    later_uses = _later_uses(graph, steps)
    for k, step in enumerate(steps):
        if isinstance(step, Segment):
            inside = {id(v) for n in step.nodes for v in n.outputs}
            seen = set()
            for n in step.nodes:
                for v in n.inputs:
                    if v is not None and id(v) not in inside and id(v) not in seen:
                        seen.add(id(v))
                        step.inputs.append(v)
            step.escaping = [v for n in step.nodes for v in n.outputs
                             if later_uses.get(id(v), -1) > k]
            params = {id(n.inputs[i]) for n in step.nodes for i in get_op(n.op).params
                      if i < len(n.inputs) and n.inputs[i] is not None}
            step.value_inputs = [i for i, v in enumerate(step.inputs)
                                 if id(v) in params and known_constant(v) is None]


def _later_uses(graph: Graph, steps: list) -> dict[int, int]:
    """Value id -> index of the last step reading it (graph outputs: past the end)."""
    last: dict[int, int] = {}
    for k, step in enumerate(steps):
        nodes = step.nodes if isinstance(step, Segment) else [step.node]
        for n in nodes:
            for v in n.inputs:
                if v is not None:
                    last[id(v)] = k
            for sub in n.subgraphs():
                for v in _outer_reads(sub):
                    last[id(v)] = k
    for v in graph.outputs:
        last[id(v)] = len(steps)
    return last


def _outer_reads(g: Graph):
    inner = {id(v) for v in g.inputs} | {id(v) for n in g.nodes for v in n.outputs}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None and id(v) not in inner and v.const is None:
                yield v
