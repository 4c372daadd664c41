"""widen_half: a half-precision model (float16 or bfloat16 values, as
`onnxconverter_common.float16` writes them) computed in float32 on a target whose kernels do
not compute in that type (`Target.half_arithmetic` leaves it out: llvm today).

Such a target's fast templates (packed convolutions and products) serve float32 only; a
float16 value would reach its generic loops, converting each element as it is read: a float16
resnet18 took 61x onnxruntime's time on llvm, every convolution in the `rows` template at
3.6 GFLOP/s. The rewrite, one pass over the nodes in order:

- constants of a widened type (the weights) are converted to float32 once, here, at compile
  time (exactly: every float16 and bfloat16 value is a float32 value);
- every value of a widened type becomes float32: each node is rebuilt on its inputs' float32
  stand-ins, its attributes naming the type (a Cast's `to`, an EyeLike's `dtype`, a
  ConstantOfShape's `value`) name float32 instead, and a Cast left with nothing to convert
  (a float32 value to float32) is dropped;
- the graph's inputs and outputs keep the types the model declares: a half input is cast to
  float32 where the graph starts, a half output cast back where it ends. Those are the only
  Casts: the interior computes in float32 throughout.

So the model is computed in float32 from its own half weights: its results differ from a
runtime computing in the half type (onnxruntime does in places) by that type's rounding of
each intermediate, not by more (docs/llvm_backend.md, "Half-precision files"). Integer,
boolean and float32 values are untouched, and so are the bf16 weight pairs of a product
packed at precision bf16 (`convert_layout`'s MatMulPacked / ConvPacked: not a half model), and so is a graph with control flow (subgraphs read
outer values by identity). This pass must never import a backend: it reads the `Target` only.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import infer_node
from ..ir.target import Target
from .store_half import append_cast

HALF_TYPES = (T.float16, T.bfloat16)
"""The 16-bit float types a target may or may not compute in (`Target.half_arithmetic`)."""


def widened_types(target: Target) -> frozenset[T.DType]:
    """The half types `target`'s kernels do not compute in: widen_half makes them float32."""
    return frozenset(t for t in HALF_TYPES if t.name not in target.half_arithmetic)


def widen_half(graph: Graph, target: Target) -> Graph:
    """`graph` computed in float32 where it holds values of a type `target` does not compute
    in (the module's docstring), or `graph` itself when it holds none."""
    narrow = widened_types(target)
    if not narrow or any(node.subgraphs() for node in graph.nodes):
        return graph
    values = [v for node in graph.nodes for v in node.inputs + node.outputs if v is not None]
    if not any(v.dtype in narrow for v in values + graph.inputs + graph.outputs):
        return graph
    _Widen(graph, narrow).run()
    return graph


class _Widen:
    """One rewrite: the nodes in order and each value's float32 stand-in (`now`)."""

    def __init__(self, graph: Graph, narrow: frozenset[T.DType]):
        self.graph, self.narrow = graph, narrow
        self.nodes: list[Node] = []
        self.now: dict[int, Value] = {}   # id of an original value -> its replacement
        self.outputs = {id(v) for v in graph.outputs}

    def run(self) -> None:
        g = self.graph
        for v in g.inputs:
            if v.dtype in self.narrow:
                self.now[id(v)] = append_cast(g, self.nodes, v, T.float32)
        for node in g.nodes:
            self.rebuild(node)
        final: dict[int, Value] = {}   # (a value returned twice is finished once)
        for k, v in enumerate(g.outputs):
            if id(v) not in final:
                final[id(v)] = self.finish(v)
            g.outputs[k] = final[id(v)]
        g.nodes = self.nodes
        g.groups = None

    def rebuild(self, node: Node) -> None:
        """`node` on its inputs' stand-ins, its attributes widened; a Cast to the type its
        input already has is dropped (its output stands for its input)."""
        # a product packed at a reduced precision (llvm's bf16 pairs) keeps its packed weights
        packed = node.attrs.get("precision", "fp32") != "fp32"
        inputs = [v if v is None or packed and v.is_const else self.current(v)
                  for v in node.inputs]
        attrs = {k: self.widen_attr(a) for k, a in node.attrs.items()}
        if node.op == "Cast" and attrs["to"] is inputs[0].dtype:
            self.now[id(node.outputs[0])] = inputs[0]
            return
        types, known, attrs = infer_node(node.op, inputs, attrs, len(node.outputs), node.name)
        outs = []
        for old, t, kv in zip(node.outputs, types, known):
            if t.dtype is old.dtype:
                outs.append(old)   # (unchanged: an integer, boolean or float32 value)
                continue
            name = self.graph.fresh_name(old.name) if id(old) in self.outputs else old.name
            new = Value(name, T.TensorType(t.dtype, old.type.shape))
            new.known = kv
            self.now[id(old)] = new
            outs.append(new)
        self.nodes.append(Node(node.op, inputs, outs, attrs, node.name))

    def finish(self, v: Value) -> Value:
        """Graph output `v` in the type the model declares: cast back into `v` where its
        stand-in has another type, else the stand-in under `v`'s name."""
        current = self.now.get(id(v), v)
        if current is v:
            return v
        if current.dtype is not v.dtype:
            append_cast(self.graph, self.nodes, current, v.dtype, out=v)
            return v
        if current.is_const or current in self.graph.inputs or id(current) in self.outputs:
            self.nodes.append(Node("Identity", [current], [v], {}, v.name))
            return v
        current.name = v.name
        return current

    def current(self, v: Value) -> Value:
        """`v` as a rebuilt node reads it: its stand-in, a widened constant made on first use
        (once), or `v` itself."""
        known = self.now.get(id(v))
        if known is not None:
            return known
        if v.is_const and v.dtype in self.narrow:
            wide = Value(v.name, T.TensorType(T.float32, v.type.shape),
                         np.asarray(v.const).astype(np.float32))
            self.now[id(v)] = wide
            return wide
        return v

    def widen_attr(self, attr):
        """An attribute naming a widened type names float32 instead (a Cast's `to`, an
        EyeLike's `dtype`; a ConstantOfShape's `value` array converted)."""
        if isinstance(attr, T.DType) and attr in self.narrow:
            return T.float32
        if isinstance(attr, np.ndarray) and any(attr.dtype == t.np for t in self.narrow):
            return attr.astype(np.float32)
        return attr
