"""The graph IR: SSA values with tensor types, nodes naming registered ops, and graphs.

A `Graph` keeps its nodes in a valid topological order. Constants are `Value`s holding a NumPy
array and no producer. Subgraphs (the bodies of If, Loop and Scan) are `Graph`s stored in node
attributes; they may read values of enclosing graphs directly. The text form (`str(graph)`) is
stable and diffable: tests compare it and `dnnc inspect --ir` prints it.
This module knows nothing of ONNX and nothing of backends.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Iterator

import numpy as np

from .types import DType, TensorType


class Value:
    """An SSA value: a graph input, a node output, or a constant (`const` holds its array)."""

    __slots__ = ("name", "type", "const", "producer", "known", "__weakref__")

    def __init__(self, name: str, type: TensorType, const: np.ndarray | None = None,
                 producer: "Node | None" = None):
        self.name = name
        self.type = type
        self.const = const
        self.producer = producer
        # Partially known contents of a small integer tensor (shape arithmetic): an object array
        # of ints and symbolic dim strings. Set by shape inference; never used to run the graph.
        self.known: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self):
        return self.type.shape

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """One application of a registered op. Absent optional inputs are None."""

    __slots__ = ("op", "inputs", "outputs", "attrs", "name")

    def __init__(self, op: str, inputs: list[Value | None], outputs: list[Value],
                 attrs: dict | None = None, name: str = ""):
        self.op = op
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs or {})
        self.name = name
        for out in self.outputs:
            out.producer = self

    def subgraphs(self) -> list["Graph"]:
        return [a for a in self.attrs.values() if isinstance(a, Graph)]

    def __repr__(self) -> str:
        return f"Node({self.op} {self.name!r})"


class Graph:
    """A function from input values to output values, as a topologically ordered node list."""

    def __init__(self, name: str = "main", inputs: list[Value] | None = None,
                 outputs: list[Value] | None = None, nodes: list[Node] | None = None):
        self.name = name
        self.inputs: list[Value] = list(inputs or [])
        self.outputs: list[Value] = list(outputs or [])
        self.nodes: list[Node] = list(nodes or [])
        # the kernels the fuse_ops pass chose: each the nodes of one kernel, in order; None
        # before it runs (every node a kernel of its own). A rewrite of `nodes` drops it.
        self.groups: list[list[Node]] | None = None
        # output position -> input position: a call leaves that output's value in that
        # input's array (a KV cache the graph updates, as XLA's input_output_alias). The
        # graph stays a function: every output is computed from the inputs as given, then
        # written; a runtime may compute it in place (`plan.in_place_outputs`)
        self.aliases: dict[int, int] = {}
        self._names = itertools.count()

    # -- building ----------------------------------------------------------------------------

    def fresh_name(self, hint: str = "v") -> str:
        return f"{hint}.{next(self._names)}"

    def add_input(self, name: str, type: TensorType) -> Value:
        value = Value(name, type)
        self.inputs.append(value)
        return value

    def add_node(self, op: str, inputs: list[Value | None], attrs: dict | None = None,
                 name: str = "", num_outputs: int = 1,
                 output_names: list[str] | None = None) -> list[Value]:
        """Append a node of a registered op; attributes are checked and output types inferred."""
        from .ops.registry import infer_node

        node_name = name or self.fresh_name(op)
        types, known, full_attrs = infer_node(op, inputs, attrs or {}, num_outputs, node_name)
        names = output_names or [f"{node_name}:{i}" if num_outputs > 1 else node_name
                                 for i in range(num_outputs)]
        outputs = [Value(n, t) for n, t in zip(names, types)]
        for out, k in zip(outputs, known):
            out.known = k
        self.nodes.append(Node(op, inputs, outputs, full_attrs, node_name))
        return outputs

    def add(self, op: str, *inputs: Value | None, name: str = "", **attrs) -> Value:
        """Shorthand for a single-output node: `g.add("Relu", x)`."""
        return self.add_node(op, list(inputs), attrs, name=name)[0]

    # -- queries -----------------------------------------------------------------------------

    def users(self) -> dict[Value, list[Node]]:
        """Map each value to the nodes reading it (subgraph reads count as the owning node)."""
        users: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for v in _reads(node):
                users.setdefault(v, []).append(node)
        return users

    def constants(self) -> list[Value]:
        """Constant values read by this graph's nodes or outputs, in first-use order."""
        seen: dict[int, Value] = {}
        for node in self.nodes:
            for v in node.inputs:
                if v is not None and v.is_const:
                    seen.setdefault(id(v), v)
        for v in self.outputs:
            if v.is_const:
                seen.setdefault(id(v), v)
        return list(seen.values())

    def walk(self) -> Iterator[Node]:
        """All nodes, subgraph nodes included, outer before inner."""
        for node in self.nodes:
            yield node
            for sub in node.subgraphs():
                yield from sub.walk()

    # -- rewriting ---------------------------------------------------------------------------

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Make every reader of `old` (nodes, subgraphs, graph outputs) read `new` instead."""
        for node in self.nodes:
            node.inputs = [new if v is old else v for v in node.inputs]
            for sub in node.subgraphs():
                sub.replace_all_uses(old, new)
        self.outputs = [new if v is old else v for v in self.outputs]

    def topological_sort(self) -> None:
        """Reorder nodes so every producer precedes its users (stable for sorted graphs)."""
        produced = {id(o): n for n in self.nodes for o in n.outputs}
        order: list[Node] = []
        state: dict[int, int] = {}  # 1 visiting, 2 done
        for root in self.nodes:
            stack = [(root, False)]
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    state[id(node)] = 2
                    order.append(node)
                    continue
                if state.get(id(node)) == 2:
                    continue
                if state.get(id(node)) == 1:
                    raise ValueError(f"graph {self.name!r} has a cycle through node {node.name!r}")
                state[id(node)] = 1
                stack.append((node, True))
                for v in reversed(list(_reads(node))):
                    p = produced.get(id(v))
                    if p is not None and state.get(id(p)) != 2:
                        stack.append((p, False))
        self.nodes = order

    # -- checking ----------------------------------------------------------------------------

    def verify(self, outer: Iterable[Value] = ()) -> None:
        """Check order, arity, attributes and types; raises ValueError naming the first fault."""
        from .ops.registry import get_op, infer_node

        outer = list(outer)  # values of every enclosing graph, passed on to nested bodies
        defined = {id(v) for v in outer} | {id(v) for v in self.inputs}
        for node in self.nodes:
            op = get_op(node.op)
            lo, hi = op.num_inputs
            if not lo <= len(node.inputs) <= (hi if hi is not None else len(node.inputs)):
                raise ValueError(f"node {node.name!r} ({node.op}) has {len(node.inputs)} inputs")
            for v in node.inputs:
                if v is not None and not v.is_const and id(v) not in defined:
                    raise ValueError(f"node {node.name!r} reads {v.name!r} before it is defined")
            for sub in node.subgraphs():
                sub.verify(outer=outer + list(_all_defined(self, defined)))
            types, _, _ = infer_node(node.op, node.inputs, node.attrs, len(node.outputs),
                                     node.name)
            for out, t in zip(node.outputs, types):
                if out.type != t:
                    raise ValueError(f"node {node.name!r} output {out.name!r} has type "
                                     f"{out.type}, inference gives {t}")
                if out.producer is not node:
                    raise ValueError(f"value {out.name!r} does not point at its producer")
                defined.add(id(out))
        for v in self.outputs:
            if not v.is_const and id(v) not in defined:
                raise ValueError(f"graph output {v.name!r} is never defined")
        for k, i in self.aliases.items():
            if not (0 <= k < len(self.outputs) and 0 <= i < len(self.inputs)) or \
                    self.outputs[k].type != self.inputs[i].type:
                raise ValueError(f"output {k} cannot be written into input {i}: positions "
                                 f"out of range or types differ")
        if len(set(self.aliases.values())) != len(self.aliases):
            raise ValueError("an input is written by two outputs")
        if self.groups is not None:
            grouped = sorted(id(n) for g in self.groups for n in g)
            if grouped != sorted(id(n) for n in self.nodes):
                raise ValueError("the fusion groups do not cover every node of the graph once")

    # -- printing ----------------------------------------------------------------------------

    def __str__(self) -> str:
        return "\n".join(_print_graph(self, ""))


def _reads(node: Node) -> Iterator[Value]:
    """Values a node reads, those read by its subgraphs from enclosing scopes included."""
    for v in node.inputs:
        if v is not None:
            yield v
    for sub in node.subgraphs():
        inner = {id(v) for v in sub.inputs} | {id(o) for n in sub.walk() for o in n.outputs}
        for n in sub.walk():
            for v in n.inputs:
                if v is not None and id(v) not in inner and not v.is_const:
                    yield v
        for v in sub.outputs:
            if id(v) not in inner and not v.is_const:
                yield v


def _all_defined(graph: Graph, defined: set[int]) -> Iterator[Value]:
    for v in graph.inputs:
        yield v
    for node in graph.nodes:
        for o in node.outputs:
            if id(o) in defined:
                yield o


def _format_attr(value) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"tensor({value.dtype}, {value.tolist()})"
        return f"tensor({value.dtype}, shape={list(value.shape)})"
    if isinstance(value, Graph):
        return f"graph({value.name})"
    if isinstance(value, DType):
        return value.name
    if isinstance(value, float):
        return repr(value)
    return repr(value)


def _print_graph(graph: Graph, indent: str) -> list[str]:
    sig = ", ".join(f"%{v.name}: {v.type}" for v in graph.inputs)
    lines = [f"{indent}graph {graph.name}({sig}) {{"]
    for c in graph.constants():
        lines.append(f"{indent}  const %{c.name}: {c.type}")
    for node in graph.nodes:
        outs = ", ".join(f"%{o.name}: {o.type}" for o in node.outputs)
        ins = ", ".join("_" if v is None else f"%{v.name}" for v in node.inputs)
        attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in sorted(node.attrs.items()))
        attrs = f" {{{attrs}}}" if attrs else ""
        lines.append(f"{indent}  {outs} = {node.op}({ins}){attrs}")
        for sub in node.subgraphs():
            lines.extend(_print_graph(sub, indent + "    "))
    outs = ", ".join(f"%{v.name}" for v in graph.outputs)
    lines.append(f"{indent}  return {outs}")
    for k, i in sorted(graph.aliases.items()):
        lines.append(f"{indent}  write %{graph.outputs[k].name} into %{graph.inputs[i].name}")
    for k, group in enumerate(graph.groups or ()):
        lines.append(f"{indent}  kernel {k}: " + ", ".join(n.name for n in group))
    lines.append(f"{indent}}}")
    return lines
