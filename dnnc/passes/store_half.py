"""store_half: a float32 model stored in half precision (float16 or bfloat16) between kernels,
for a target that asks for it (`Target.half_storage`) at precision fp16 or bf16.

Memory traffic is what a product-bound fp32 model waits on once its products run on tensor
cores (issue 31): stored in 16 bits, every weight and activation moves half the bytes. The
rewrite, one pass over the nodes in order:

- float32 constants (the weights) are converted once, here, at compile time (round to
  nearest even: NumPy's `astype`), a finite value past the half type's range saturated to
  its largest finite value (`half_constant`);
- every node whose op takes the half type runs on half values (its outputs typed so): the
  op's own meaning then computes in float32 registers and rounds its result once (products
  and convolutions accumulate in float32; reductions, Softmax, LayerNormalization and the
  other normalisations keep their statistics and accumulators in float32: `ir/ops/reduce.py`
  `wide_dtype`, `linalg.acc_dtype`, `norm.py`'s stash type), and a Cast to float32 becomes a
  Cast to the half type;
- a node's parameters (`FLOAT32_INPUTS`: a Resize's scales) stay float32;
- a node runs in float32 instead, between Casts, when its op is in `FLOAT32_OPS` (values
  that leave the half type's range or resolution: a square, an exponential) or is
  discontinuous in its float input (`DISCONTINUOUS_OPS`: a comparison, a rounding, a
  quantization, a cast to an integer type: a graph input or constant then reaches it
  unrounded), when its op's
  type rules refuse the half type or give another shape, and when it reduces a float32 value
  (a ReduceMean of a Pow: a variance summed from float32 squares; or of the graph's input);
- the graph's float32 inputs are cast to the half type where it starts, and its outputs cast
  back to float32, so the caller gives and gets float32: the model's signature is unchanged.

Integer, boolean and shape values are untouched, and so are values the model already types
float16, bfloat16 or float64 (a half ONNX file runs in its own types). A graph with control
flow (subgraphs read outer values by identity) is left as it is.

The accuracy contract this gives (docs/cuda_backend.md, "Half precision storage"): each
stored activation is rounded once to the half type. This pass must never import a backend:
it reads the `Target` only.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import DNNCError
from ..ir import types as T
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import Pattern, get_op, infer_node
from ..ir.target import Target

HALF_TYPES = {"fp16": T.float16, "bf16": T.bfloat16}
"""Target precision -> the type a model is stored in (other precisions store float32)."""

FLOAT32_OPS = frozenset({"Pow", "Exp"})
"""Ops computed on float32 values even in a half-stored model: their results leave the half
type's range (x**2 past 65504 for |x| > 256 in float16: a decomposed LayerNorm's variance;
exp(x) for x > 11) or carry statistics (a variance's squares, a softmax's exponentials)."""


def half_constant(array, half: T.DType) -> np.ndarray:
    """Float32 constant `array` in the half type `half`, rounded to nearest even, its finite
    values past the type's range saturated to the largest finite one (infinities and NaNs
    kept). Rounding them to infinity would change what the model computes, not only how
    precisely: the additive masks transformers write hold finfo(float32).min (-3.4e38, past
    float16's 65504 and, rounded, past bfloat16's 3.39e38), and 0 * -inf is NaN where the
    float32 model has 0 (an unmasked position of `(1 - mask) * min`), while -65504 masks as
    the float32 value does (what a `.half()` export of the same model would hold)."""
    array = np.asarray(array)
    big = float(ml_dtypes.finfo(half.np).max)
    return np.where(np.isfinite(array), np.clip(array, -big, big), array).astype(half.np)


DISCONTINUOUS_OPS = frozenset({"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal",
                               "ArgMax", "ArgMin", "Floor", "Ceil", "Round", "Sign",
                               "QuantizeLinear", "DynamicQuantizeLinear", "IsInf", "IsNaN"})
"""Ops whose result jumps as their float input crosses a point (a comparison, a rounding, a
quantization): a value rounded to the half type on its way there changes an integer, a
boolean or a quantized result by a whole step, where the model's float32 value would not.
They read their float inputs in float32 (as a Cast to a non-float type does): a graph input,
a constant or a float32 node's output is then read as the model gives it, not rounded first."""


WIDENING_READERS = frozenset({"DynamicQuantizeLinear"})
"""Ops among DISCONTINUOUS_OPS that read a value already stored in the half type as it is
(their kernels widen it to float32 on load: exact, so the results are those of reading its
float32 Cast) instead of through a Cast kernel of its own. A dynamically quantized
transformer's LayerNorm output, stored half for the residual Add, reaches the quantization
of the next product so without a launch in between."""


FLOAT32_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}
"""Op -> the float inputs that are parameters, not data, read as float32 in a half node: a
Resize's roi and scales (a scale of 4/3 in float16 is 1.333984: another output size)."""


def store_half(graph: Graph, target: Target) -> Graph:
    """`graph` stored in the half type of `target`'s precision (the module's docstring), or
    `graph` itself when the target does not ask for it."""
    half = HALF_TYPES.get(target.precision) if target.half_storage else None
    if half is None or any(node.subgraphs() for node in graph.nodes):
        return graph
    _HalfStorage(graph, half).run()
    return graph


_POSITIONWISE = (Pattern.ELEMWISE, Pattern.BROADCAST, Pattern.INJECTIVE)


def _feeds_discontinuous(graph: Graph) -> set[int]:
    """Ids of the elementwise, broadcasting and layout nodes whose float output reaches a
    discontinuous op (or a cast to an integer type) through such nodes only: they run in
    float32 too, so that the comparison sees the model's own value (Greater(Clip(x), x)
    compared x's float16 rounding with x itself; a Cast to int32 of a Squeeze truncated the
    rounded value). The walk stops at any other producer (a product, a reduction: its output
    is rounded as every stored activation)."""
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    stack = [v for n in graph.nodes if n.op in DISCONTINUOUS_OPS or (
        n.op == "Cast" and not n.attrs.get("to").is_float) for v in n.inputs if v is not None]
    exact: set[int] = set()
    while stack:
        n = producer.get(id(stack.pop()))
        if n is None or id(n) in exact or n.subgraphs() or \
                get_op(n.op).pattern not in _POSITIONWISE:
            continue
        exact.add(id(n))
        stack += [v for v in n.inputs if v is not None and v.type.dtype.is_float]
    return exact


class _HalfStorage:
    """One rewrite: the nodes in order, each value's current stand-in (`now`), and the Casts
    and converted constants made so far (each made once)."""

    def __init__(self, graph: Graph, half: T.DType):
        self.graph, self.half = graph, half
        self.nodes: list[Node] = []
        self.now: dict[int, Value] = {}        # id of an original value -> its replacement
        self.converted: set[int] = set()       # ids of half values that were float32
        self.stored: set[int] = set()          # ids of those a half node computes
        self.to_half: dict[int, Value] = {}    # id of a float32 value -> its half twin
        self.to_f32: dict[int, Value] = {}     # id of a converted value -> its float32 twin
        self.outputs = {id(v) for v in graph.outputs}
        self.exact = _feeds_discontinuous(graph)

    def run(self) -> None:
        g = self.graph
        for node in g.nodes:
            if not self.fp32_needed(node) and self.in_half(node):
                continue
            self.in_float32(node)
        final: dict[int, Value] = {}   # (a value returned twice is cast once)
        for k, v in enumerate(g.outputs):
            if id(v) not in final:
                current = self.now.get(id(v), v)
                if current is not v and current.dtype is not v.dtype:
                    self.cast(current, v.dtype, out=v)   # (half: cast back into the output)
                elif current is not v:   # (computed in float32: the output itself, renamed)
                    current.name = v.name
                    v = current
                final[id(g.outputs[k])] = v
            g.outputs[k] = final[id(g.outputs[k])]
        g.nodes = self.nodes
        g.groups = None

    # -- the two ways a node runs -----------------------------------------------------------

    def fp32_needed(self, node: Node) -> bool:
        """Whether `node` runs in float32 whatever its op's types allow (FLOAT32_OPS, or a
        reduction of a float32 value: a graph input, an output of a node run in float32)."""
        if node.op in FLOAT32_OPS or node.op in DISCONTINUOUS_OPS or id(node) in self.exact:
            return True
        if node.op == "Cast" and not node.attrs.get("to").is_float:
            return True   # (a float to integer or boolean cast: discontinuous too)
        if get_op(node.op).pattern is not Pattern.REDUCE:
            return False
        return any(v is not None and self.current(v).dtype is T.float32 and
                   not self.current(v).is_const for v in node.inputs)

    def in_half(self, node: Node) -> bool:
        """`node` rebuilt on the half values of its float32 inputs, when its op's type rules
        take them; False (nothing added) when they refuse."""
        keep = FLOAT32_INPUTS.get(node.op, ())

        def read(k: int, v: Value | None, commit: bool = True) -> Value | None:
            if v is None:
                return None
            return self.as_f32(v) if k in keep else self.as_half(v, commit)

        inputs = [read(k, v, commit=False) for k, v in enumerate(node.inputs)]
        attrs = dict(node.attrs)
        if node.op == "Cast" and attrs.get("to") is T.float32:
            attrs["to"] = self.half
        try:
            types, known, attrs = infer_node(node.op, inputs, attrs, len(node.outputs),
                                             node.name)
        except DNNCError:
            return False
        for old, t in zip(node.outputs, types):
            if t.shape != old.type.shape or t.dtype is not old.dtype and not (
                    old.dtype is T.float32 and t.dtype is self.half):
                return False   # (a type or shape the model did not have: keep its own)
        inputs = [read(k, v) for k, v in enumerate(node.inputs)]
        self.rebuild(node, inputs, attrs, types, known)
        for old in node.outputs:
            if old.dtype is T.float32 and self.now[id(old)].dtype is T.float32:
                # an op that makes float32 whatever it reads (ConstantOfShape): stored half,
                # its float32 form kept for float32 readers
                self.now[id(old)] = self.as_half(self.now[id(old)])
        return True

    def in_float32(self, node: Node) -> None:
        """`node` rebuilt on float32 inputs (the converted ones cast back, but a half node's
        output that a WIDENING_READERS op reads as it is), its float32 outputs kept: a half
        node reading them casts them then."""
        widening = node.op in WIDENING_READERS
        inputs = [None if v is None else
                  self.current(v) if widening and id(self.current(v)) in self.stored else
                  self.as_f32(v) for v in node.inputs]
        types, known, attrs = infer_node(node.op, inputs, node.attrs, len(node.outputs),
                                         node.name)
        self.rebuild(node, inputs, attrs, types, known)

    def rebuild(self, node: Node, inputs, attrs, types, known) -> None:
        outs = []
        for old, t, kv in zip(node.outputs, types, known):
            name = self.graph.fresh_name(old.name) if id(old) in self.outputs else old.name
            new = Value(name, t)
            new.known = kv
            self.now[id(old)] = new
            if old.dtype is T.float32 and t.dtype is self.half:
                self.converted.add(id(new))
                self.stored.add(id(new))
            outs.append(new)
        self.nodes.append(Node(node.op, inputs, outs, attrs, node.name))

    # -- values -----------------------------------------------------------------------------

    def current(self, v: Value) -> Value:
        return self.now.get(id(v), v)

    def as_half(self, v: Value, commit: bool = True) -> Value:
        """`v` as the node reading it sees it in a half node: its half twin when it is float32
        (a converted constant, a Cast made where it is first needed; with `commit` False a
        stand-in of that type for an activation, for inference only: no Cast yet)."""
        v = self.current(v)
        if v.dtype is not T.float32:
            return v
        known = self.to_half.get(id(v))
        if known is not None:
            return known
        if not commit and not v.is_const:
            return Value(v.name, T.TensorType(self.half, v.type.shape))
        if v.is_const:
            twin = Value(v.name, T.TensorType(self.half, v.type.shape),
                         half_constant(v.const, self.half))
        else:
            twin = self.cast(v, self.half)
        self.to_half[id(v)] = twin
        self.to_f32[id(twin)] = v
        self.converted.add(id(twin))
        return twin

    def as_f32(self, v: Value) -> Value:
        """`v` as a float32 node reads it: the float32 original of a converted value (a Cast
        back where none is kept), anything else itself."""
        v = self.current(v)
        if id(v) not in self.converted:
            return v
        known = self.to_f32.get(id(v))
        if known is None:
            known = self.cast(v, T.float32)
            self.to_f32[id(v)] = known
        return known

    def cast(self, v: Value, dtype: T.DType, out: Value | None = None) -> Value:
        return append_cast(self.graph, self.nodes, v, dtype, out)


def append_cast(graph: Graph, nodes: list[Node], v: Value, dtype: T.DType,
                out: Value | None = None) -> Value:
    """A Cast of `v` to `dtype` appended to `nodes` (into `out` when given: a graph output
    keeps its value), named after `v` in `graph`; its output."""
    name = graph.fresh_name(f"{v.name}.{dtype.name}")
    out = out if out is not None else Value(name, T.TensorType(dtype, v.type.shape))
    nodes.append(Node("Cast", [v], [out], {"to": dtype}, name))
    return out
