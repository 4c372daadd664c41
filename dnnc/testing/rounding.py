"""How far two correct runs of a QDQ model may differ: per-element bounds for every output
downstream of a QuantizeLinear, for the differential fuzzer (issue 30).

QuantizeLinear rounds. Where two correct implementations' float inputs to it differ by an ulp
across a rounding boundary (a Conv summed in another order, an average of values on a grid
whose scale the next one shares: near-ties are common in QDQ graphs), the quantized values
differ by one, and that difference flows on: through a Conv's weights, a Sigmoid's slope, the
next QuantizeLinear. `bounds(model, runs)` computes, next to the numpy target's values, an
upper bound E of |a correct result - the reference| for every element of every such output,
by running a *bound model*: the model plus, for each node downstream of a QuantizeLinear, nodes
computing its output's bound from its inputs' (linear ops on |weights|, Lipschitz constants
of activations, the window ops on the bounds themselves). A QuantizeLinear's bound counts the
rounding boundaries within its input's bound plus float noise (`FLOAT_NOISE` of the
magnitude); an exact input (`exact_values`: graph inputs, constants and values computed
from them without rounding) has no noise, so at an exact tie the rounding mode must match.

Every bound is per element, so a wrong scale, axis or zero point, a dropped Q/DQ pair, a
missing saturation or round-half-away at exact ties stays a finding. An op with no rule below
gets an infinite bound when a bounded value reaches it (the generator requantizes every op's
output; only a minimised model meets this). This module must never widen a bound beyond what
the rules state: a bound is a proof that a difference is a rounding's, not a tolerance.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

FLOAT_NOISE = 2e-5
"""Float noise assumed at a QuantizeLinear's inexact input, times |x| + max(1, mean |x|):
5x the largest difference the fuzzer measured between dnnc's targets and onnxruntime on float
outputs (4.3e-6 of the same measure, docs/fuzzing.md)."""

MOVEMENT = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather",
            "Expand", "Identity", "Split", "Pad", "MaxPool", "AveragePool",
            "GlobalAveragePool", "GlobalMaxPool"}
"""Ops whose bound is the op applied to the input's bound, the other inputs unchanged: data
movement copies differences; a max or mean of values differs by at most the max or mean of
their differences. (Pad's constant is 0 in the bound: padding is the same on both sides.)"""

LIPSCHITZ = {"Relu": 1.0, "Clip": 1.0, "Sigmoid": 0.25, "HardSwish": 1.5, "Tanh": 1.0,
             "HardSigmoid": 0.5, "LeakyRelu": 1.0, "Neg": 1.0, "Abs": 1.0}
"""Elementwise ops of one value: the bound times the largest slope."""

EXACT = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather",
         "Expand", "Identity", "Split", "Concat", "MaxPool", "Relu", "Clip", "Neg", "Abs",
         "Cast", "QuantizeLinear"}
"""Ops that compute exactly from exact inputs."""


def exact_values(model: onnx.ModelProto) -> set[str]:
    """Values every correct implementation computes bit for bit: inputs, constants, and what
    exact ops make of them; a DequantizeLinear with power-of-two scales, and Add, Sub or Mul of
    such (few significant bits: the sum or product is representable)."""
    exact = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    constants = _constants(model)
    grid: set[str] = set()   # exact DequantizeLinear outputs on a power-of-two grid
    for n in model.graph.node:
        data = [i for i in n.input[:1 if n.op_type not in ("Concat", "Add", "Sub", "Mul")
                                   else None] if i]
        if n.op_type == "Constant":
            exact.update(n.output)
        elif n.op_type == "DequantizeLinear":
            scale = constants.get(n.input[1])
            if n.input[0] in exact and scale is not None and \
                    np.all(np.log2(np.abs(scale.astype(np.float64))) % 1 == 0):
                exact.add(n.output[0])
                grid.add(n.output[0])
        elif n.op_type in ("Add", "Sub", "Mul"):
            if all(i in grid for i in data):
                exact.add(n.output[0])
        elif n.op_type in EXACT and all(i in exact for i in data):
            exact.update(n.output)
            if n.op_type != "QuantizeLinear" and all(i in grid for i in data):
                grid.update(n.output)
    return exact


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        for a in n.attribute:
            if n.op_type == "Constant" and a.name == "value":
                constants[n.output[0]] = numpy_helper.to_array(a.t)
    return constants


class _BoundModel:
    """The model plus nodes computing a bound `<value>#bound` for each value downstream of a
    QuantizeLinear."""

    def __init__(self, model: onnx.ModelProto, noise: float | None = None):
        self.model = model
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.bound: dict[str, str] = {}
        # at a reduced precision (`noise` given) every value is rounded where it is stored,
        # the graph's inputs and constants too: none is exact
        self.exact = exact_values(model) if noise is None else set()
        self.noise = FLOAT_NOISE if noise is None else noise
        self.constants = _constants(model)
        inferred = onnx.shape_inference.infer_shapes(model)
        self.ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
                      list(inferred.graph.value_info) + list(inferred.graph.input) +
                      list(inferred.graph.output)}
        self.count = 0

    def op(self, op_type: str, inputs: list, **attrs) -> str:
        self.count += 1
        out = f"#bound{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(self, value) -> str:
        self.count += 1
        name = f"#const{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def const_ints(self, values) -> str:
        self.count += 1
        name = f"#const{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def zeros(self, value: str) -> str:
        """A bound of 0 in the shape of `value` (finite: every bounded value is quantized)."""
        return self.op("Mul", [self.op("Cast", [value], to=onnx.TensorProto.FLOAT),
                               self.const(0.0)])

    def of(self, value: str) -> str:
        return self.bound.get(value) or self.zeros(value)

    def build(self) -> onnx.ModelProto:
        for n in self.model.graph.node:
            if n.op_type == "QuantizeLinear" or any(i in self.bound for i in n.input):
                self.node(n)
        graph = onnx.GraphProto()
        graph.CopyFrom(self.model.graph)
        graph.node.extend(self.nodes)
        graph.initializer.extend(self.inits)
        del graph.output[:]
        for o in self.model.graph.output:
            if o.name in self.bound:
                graph.output.append(helper.make_tensor_value_info(o.name, o.type.tensor_type
                                                                  .elem_type, None))
                graph.output.append(helper.make_tensor_value_info(
                    self.bound[o.name], onnx.TensorProto.FLOAT, None))
        model = helper.make_model(graph, opset_imports=self.model.opset_import)
        model.ir_version = self.model.ir_version
        return model

    def node(self, n: onnx.NodeProto) -> None:
        rule = RULES.get(n.op_type)
        if rule is None and n.op_type in MOVEMENT:
            rule = _movement
        elif rule is None and n.op_type in LIPSCHITZ:
            rule = _lipschitz
        outs = rule(self, n) if rule is not None else None
        if outs is None:   # no rule: unbounded
            outs = [self.op("Add", [self.zeros(o), self.const(np.inf)]) for o in n.output]
        for o, b in zip(n.output, outs):
            self.bound[o] = b


def _movement(m: _BoundModel, n: onnx.NodeProto) -> list[str]:
    extra = list(n.input[1:])
    if n.op_type == "Pad" and len(extra) >= 2 and extra[1]:
        extra[1] = m.const(0.0)   # a constant pad value pads bounds with 0
    outs = [f"#bound_{o}" for o in n.output]
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    m.nodes.append(helper.make_node(n.op_type, [m.of(n.input[0])] + extra, outs,
                                    name=f"#bound_{n.name}", **attrs))
    return outs


def _lipschitz(m: _BoundModel, n: onnx.NodeProto) -> list[str]:
    return [m.op("Mul", [m.of(n.input[0]), m.const(LIPSCHITZ[n.op_type])])]


def _add(m: _BoundModel, n: onnx.NodeProto) -> list[str]:
    return [m.op("Add", [m.of(n.input[0]), m.of(n.input[1])])]


def _mul(m: _BoundModel, n: onnx.NodeProto) -> list[str]:
    """|ab - a'b'| <= |a| E_b + |b| E_a + E_a E_b."""
    (a, b), (ea, eb) = n.input[:2], (m.of(n.input[0]), m.of(n.input[1]))
    terms = [m.op("Mul", [m.op("Abs", [a]), eb]), m.op("Mul", [m.op("Abs", [b]), ea]),
             m.op("Mul", [ea, eb])]
    return [m.op("Add", [m.op("Add", terms[:2]), terms[2]])]


def _concat(m: _BoundModel, n: onnx.NodeProto) -> list[str]:
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    return [m.op("Concat", [m.of(i) for i in n.input], **attrs)]


def _linear(m: _BoundModel, n: onnx.NodeProto) -> list[str]:
    """Conv, MatMul, Gemm: the op on (E_x, |w|) + (|x|, E_w) + (E_x, E_w), no bias; plus the
    bias's bound."""
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    x, w = n.input[:2]
    if n.op_type == "Gemm":
        attrs["alpha"] = abs(attrs.get("alpha", 1.0))
        attrs.pop("beta", None)
    ex, ew = m.of(x), m.of(w)
    pairs = [(ex, m.op("Abs", [w])), (m.op("Abs", [x]), ew), (ex, ew)]
    total = None
    for a, b in pairs:
        term = m.op(n.op_type, [a, b], **attrs)
        total = term if total is None else m.op("Add", [total, term])
    if len(n.input) > 2 and n.input[2] in m.bound:
        bias = m.bound[n.input[2]]
        if n.op_type == "Conv":   # [M] against [N, M, ...]
            bias = m.op("Reshape", [bias, m.const_ints([-1] + [1] * (_rank(m, w) - 2))])
        elif n.op_type == "Gemm":
            bias = m.op("Mul", [bias, m.const(abs(attrs.get("beta", 1.0)))])
        total = m.op("Add", [total, bias])
    return [total]


def _rank(m: _BoundModel, value: str) -> int:
    if value in m.constants:
        return m.constants[value].ndim
    return m.ranks[value]


def _param(m: _BoundModel, n: onnx.NodeProto, i: int, rank: int) -> str | None:
    """A Q/DQ scale as a float constant broadcasting against the data (per axis reshaped)."""
    value = m.constants.get(n.input[i]) if len(n.input) > i and n.input[i] else None
    if value is None:
        return None
    value = value.astype(np.float64)
    if value.size > 1:
        axis = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), 1)
        shape = [1] * rank
        shape[axis % rank] = value.size
        value = value.reshape(shape)
    return m.const(np.abs(value).astype(np.float32))


def _quantize(m: _BoundModel, n: onnx.NodeProto) -> list[str] | None:
    """The rounding boundaries within x's bound plus float noise: the result lies between
    round-down(lo / s) and round-up(hi / s), rounding and saturation being monotone."""
    x = n.input[0]
    scale = _param(m, n, 1, _rank(m, x))
    if scale is None:
        return None
    if x in m.exact and x not in m.bound:
        return [m.zeros(n.output[0])]
    ax = m.op("Abs", [x])
    noise = m.op("Mul", [m.op("Add", [ax, m.op("Max", [m.op("ReduceMean", [ax], keepdims=1),
                                                        m.const(1.0)])]),
                         m.const(m.noise if x not in m.exact else 0.0)])
    width = m.op("Add", [m.of(x), noise])
    v = m.op("Div", [x, scale])
    hi = m.op("Div", [m.op("Add", [x, width]), scale])
    lo = m.op("Div", [m.op("Sub", [x, width]), scale])
    half = m.const(0.5)
    centre = m.op("Round", [v])
    up = m.op("Sub", [m.op("Floor", [m.op("Add", [hi, half])]), centre])
    down = m.op("Sub", [centre, m.op("Ceil", [m.op("Sub", [lo, half])])])
    # never more than the integer type's span: saturation keeps deep chains' bounds finite
    zero = m.constants.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
    info = ml_dtypes.iinfo(zero.dtype if zero is not None else np.uint8)   # (int4's too)
    return [m.op("Min", [m.op("Max", [up, down]), m.const(float(info.max) - info.min)])]


def _dequantize(m: _BoundModel, n: onnx.NodeProto) -> list[str] | None:
    scale = _param(m, n, 1, _rank(m, n.input[0]))
    if scale is None:
        return None
    return [m.op("Mul", [m.of(n.input[0]), scale])]


def _cast(m: _BoundModel, n: onnx.NodeProto) -> list[str]:
    return [m.of(n.input[0])]


RULES = {"QuantizeLinear": _quantize, "DequantizeLinear": _dequantize, "Add": _add,
         "Sub": _add, "Mul": _mul, "Concat": _concat, "Conv": _linear, "MatMul": _linear,
         "Gemm": _linear, "Cast": _cast}
"""Op -> rule writing the bound of its outputs (None: unbounded)."""


def bounds(model: onnx.ModelProto, runs: list[dict], noise: float | None = None
           ) -> list[dict[str, np.ndarray]]:
    """For each run, {output name: per-element bound} of the outputs downstream of a
    QuantizeLinear (empty when there are none); computed on dnnc's numpy target. `noise`:
    the relative float noise at every QuantizeLinear's input of a compile at a reduced
    precision (half storage rounds the graph's inputs and constants too), where fp32 has
    FLOAT_NOISE at inexact inputs only."""
    import dnnc

    builder = _BoundModel(model, noise)
    bound_model = builder.build()
    pairs = [(o.name, builder.bound[o.name]) for o in model.graph.output
             if o.name in builder.bound]
    if not pairs:
        return [{} for _ in runs]
    compiled = dnnc.compile(bound_model.SerializeToString(), target="numpy")
    found = []
    for run in runs:
        outs = compiled.run(**run)
        found.append({name: np.asarray(outs[2 * k + 1], np.float64)
                      for k, (name, _) in enumerate(pairs)})
    return found
