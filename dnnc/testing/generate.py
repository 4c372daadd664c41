"""Random valid ONNX models for the differential fuzzer: a `Case` from (seed, index).

A case grows a graph from one to three inputs by applying random ops from `OPS` (the ops real
models use: convs of every kind, matmul/gemm, broadcasting elementwise, activations, norms,
pools, data movement, reductions, pad, resize, casts, where, expand, integer arithmetic) to
values already in the graph, preferring the newest value (chains) but sometimes an older one
(values with several consumers). Sizes are small and odd (primes, 1s) in most cases; a few
cases are big enough to cross the llvm target's parallel thresholds. A third of the cases
have a symbolic batch dim (`dim_param "N"`). Every node's output type comes from ONNX's own
shape inference (`infer_node_outputs`), so the declared types are the spec's.

What is never generated, because the spec leaves the result undefined or ill-conditioned and
a comparison would mean nothing: NaN-producing arithmetic (Sqrt/Log of negatives, 0/0),
division by values near zero, integer division by zero, float-to-int casts out of range,
integer products that overflow, LayerNormalization of rows that may be constant, and comparisons, casts or rounding of floats computed with
rounding (two correct implementations may round a sum differently and flip a comparison);
those consume only *exact* values (inputs, data movement, max/min). `docs/fuzzing.md`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.shape_inference import infer_node_outputs

BATCH = "N"
"""The symbolic batch dim's name."""

OPSETS = (13, 17, 18, 21)
"""Opsets a case is written in: importers differ by opset (axes as attribute or input, ...)."""

ONNX_DTYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
              np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL}
NP_DTYPE = {v: k for k, v in ONNX_DTYPE.items()}
F32, I32, I64, BOOL = (np.dtype(t) for t in (np.float32, np.int32, np.int64, np.bool_))


@dataclass
class Val:
    """A value of the graph being built, with what op generators need to know about it."""

    name: str
    shape: tuple            # ints, or BATCH for the symbolic batch dim
    dtype: np.dtype
    exact: bool = True      # computed without rounding: safe to compare, cast or round
    scale: float = 1.0      # rough magnitude of its elements (keeps Exp, Pow, int Mul in range)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def static(self, axis: int) -> bool:
        return isinstance(self.shape[axis], int)


@dataclass
class InputSpec:
    """A graph input and how its random data is drawn."""

    name: str
    shape: tuple
    dtype: np.dtype
    kind: str = "normal"    # a key of DRAW

    def draw(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        shape = tuple(batch if d == BATCH else d for d in self.shape)
        return DRAW[self.kind](rng, shape).astype(self.dtype)


DRAW = {
    "normal": lambda rng, shape: rng.standard_normal(shape),
    # a few NaNs among normal values: NaN propagation (rarely, see _start)
    "normal_nan": lambda rng, shape: np.where(rng.random(shape) < 0.03, np.nan,
                                              rng.standard_normal(shape)),
    "int": lambda rng, shape: rng.integers(-9, 10, shape),
    # divisors: nonzero integers, and floats away from zero (|x| in [0.5, 2])
    "nonzero_int": lambda rng, shape: rng.integers(1, 8, shape) * rng.choice([-1, 1], shape),
    "away_from_zero": lambda rng, shape: rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1],
                                                                                     shape),
}


@dataclass
class Case:
    """One generated model with the recipe of its inputs."""

    seed: int
    index: int
    model: onnx.ModelProto
    inputs: list[InputSpec]
    symbolic: bool
    big: bool
    batch: int               # the batch size of the first run
    ops: list[str] = field(default_factory=list)

    def batches(self) -> list[int]:
        """The batch size of each run: a new one for the second run when it is symbolic."""
        if not self.symbolic:
            return [self.batch, self.batch]
        return [self.batch, self.batch % 4 + 2]   # 1->3, 2->4, 3->5, 4->2, ...

    def draw_inputs(self, run: int) -> dict[str, np.ndarray]:
        """Fresh random inputs for run `run`, a function of (seed, index, run) only."""
        rng = np.random.default_rng([self.seed, self.index, run, 1])
        batch = self.batches()[run]
        return {spec.name: spec.draw(rng, batch) for spec in self.inputs}


class Rejected(Exception):
    """The op generator cannot apply to the chosen values; another op is tried."""


class Builder:
    """The graph under construction: nodes, initializers, inputs and the values they make."""

    def __init__(self, rng: np.random.Generator, opset: int, big: bool, batch_dim):
        self.rng = rng
        self.opset = opset
        self.big = big
        self.batch_dim = batch_dim          # BATCH, or an int when the batch is static
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[InputSpec] = []
        self.values: list[Val] = []          # values ops may consume
        self.consumed: set[str] = set()
        self.types: dict[str, onnx.TypeProto] = {}
        self.data: dict[str, onnx.TensorProto] = {}   # constant values, for shape inference
        self.style = rng.choice(["plain", "torch", "colliding"])
        self.count = 0

    # --- naming -------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        self.count += 1
        if self.style == "torch":   # names as PyTorch's exporter writes them
            return f"/layer{self.count}/{hint}_output_0"
        if self.style == "colliding":   # pairs that a C identifier sanitiser maps to one name
            return f"v{'.:/_'[self.count % 4]}{self.count // 2}"   # v/1 and v_1, v.2 and v:2
        return f"{hint.lower()}{self.count}"

    # --- sizes --------------------------------------------------------------------------------
    def size(self, small=(1, 2, 3, 4, 5, 7, 8, 11, 13), big=(16, 17, 32)) -> int:
        return int(self.rng.choice(big if self.big else small))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    # --- values -------------------------------------------------------------------------------
    def add_input(self, shape, dtype=F32, kind="normal", hint="input") -> Val:
        name = f"{hint}{len(self.inputs)}"
        self.inputs.append(InputSpec(name, tuple(shape), np.dtype(dtype), kind))
        self.types[name] = helper.make_tensor_type_proto(ONNX_DTYPE[np.dtype(dtype)], shape)
        val = Val(name, tuple(shape), np.dtype(dtype), kind != "normal_nan",
                  2.0 if kind == "away_from_zero" else 9.0 if "int" in kind else 1.0)
        self.values.append(val)
        return val

    def initializer(self, array: np.ndarray, hint="w", exact=False) -> Val:
        name = self.fresh(hint) if self.style == "plain" else f"onnx::{hint}_{self.count + 1}"
        self.count += 1
        tensor = numpy_helper.from_array(np.asarray(array), name)
        self.initializers.append(tensor)
        self.types[name] = helper.make_tensor_type_proto(tensor.data_type, array.shape)
        self.data[name] = tensor
        scale = float(np.max(np.abs(array))) if array.size and array.dtype != BOOL else 1.0
        return Val(name, tuple(array.shape), array.dtype, exact, scale)

    def ints(self, values) -> Val:
        """A constant int64 tensor (shape, axes, pads, ...), as an initializer."""
        return self.initializer(np.asarray(values, np.int64), "c", exact=True)

    def weight(self, shape, fan_in: int) -> Val:
        """A random float weight with unit-variance outputs; sometimes built by a constant
        subgraph (Constant -> Mul / Transpose) that constant folding must take."""
        array = np.asarray(self.rng.standard_normal(shape) / math.sqrt(max(fan_in, 1)),
                           np.float32)
        if not self.chance(0.2):
            return self.initializer(array)
        if len(shape) >= 2 and self.chance(0.5):
            perm = list(range(len(shape)))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            src = self.initializer(np.ascontiguousarray(np.transpose(array, perm)))
            return self.node("Transpose", [src], perm=perm)[0]
        half = self.const_node((array * 2).astype(np.float32))
        return self.node("Mul", [half, self.const_node(np.float32(0.5))])[0]

    def const_node(self, array) -> Val:
        array = np.asarray(array)
        out = self.fresh("Constant")
        tensor = numpy_helper.from_array(array, out)
        self.nodes.append(helper.make_node("Constant", [], [out], value=tensor,
                                           name=f"n{len(self.nodes)}"))
        self.types[out] = helper.make_tensor_type_proto(tensor.data_type, array.shape)
        self.data[out] = tensor
        return Val(out, tuple(array.shape), array.dtype, True, 1.0)

    def pick(self, pred=lambda v: True, dtype=F32) -> Val:
        """A value satisfying `pred`: usually the newest (chains), else any (fan-out)."""
        options = [v for v in self.values if (dtype is None or v.dtype == dtype) and pred(v)]
        if not options:
            raise Rejected
        if self.chance(0.6):
            return options[-1]
        return self.choice(options)

    def node(self, op: str, inputs: list, n_out: int = 1, exact=False, scale=None,
             **attrs) -> list[Val]:
        """Append an `op` node; its output types come from ONNX shape inference. Raises
        Rejected when inference fails or leaves a dim unknown."""
        names = [self.fresh(op) for _ in range(n_out)]
        proto = helper.make_node(op, [v.name if v is not None else "" for v in inputs], names,
                                 name=f"n{len(self.nodes)}", **attrs)
        try:
            types = infer_node_outputs(
                onnx.defs.get_schema(op, self.opset), proto,
                {v.name: self.types[v.name] for v in inputs if v is not None},
                {v.name: self.data[v.name] for v in inputs
                 if v is not None and v.name in self.data},
                opset_imports=[helper.make_opsetid("", self.opset)])
        except Exception as exc:   # onnx raises several types for invalid combinations
            raise Rejected from exc
        outs = []
        for name in names:
            t = types.get(name)
            if t is None or not t.tensor_type.HasField("shape"):
                raise Rejected
            dims = []
            for d in t.tensor_type.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(d.dim_value)
                elif d.dim_param == BATCH:
                    dims.append(BATCH)
                else:
                    raise Rejected
            if any(d != BATCH and d <= 0 for d in dims) or \
                    t.tensor_type.elem_type not in NP_DTYPE:
                raise Rejected
            outs.append(Val(name, tuple(dims), NP_DTYPE[t.tensor_type.elem_type], exact,
                            scale if scale is not None else
                            max([v.scale for v in inputs if v is not None] + [1.0])))
        for name, t in zip(names, (types[n] for n in names)):
            self.types[name] = t
        for v in inputs:
            if v is not None:
                self.consumed.add(v.name)
        self.nodes.append(proto)
        self.values.extend(outs)
        return outs

    def numel(self, v: Val) -> int:
        return int(np.prod([self.batch_value if d == BATCH else d for d in v.shape]))

    @property
    def batch_value(self) -> int:
        return 2 if self.batch_dim == BATCH else self.batch_dim

    def broadcast_partner(self, v: Val, kind="normal", dtype=None) -> Val:
        """Another value whose shape broadcasts with v's: an existing one, or a new input or
        initializer with some dims 1 and maybe fewer leading dims."""
        dtype = dtype or v.dtype
        existing = [u for u in self.values if u.dtype == dtype and u.name != v.name and
                    kind == "normal" and _broadcastable(u.shape, v.shape)]
        if existing and self.chance(0.4):
            return self.choice(existing)
        rank = v.rank if self.chance(0.6) else int(self.rng.integers(0, v.rank + 1))
        shape = tuple(d if (self.chance(0.5) or d == BATCH and rank == v.rank) else 1
                      for d in v.shape[v.rank - rank:])
        if self.chance(0.5) or BATCH in shape:
            return self.add_input(shape, dtype, kind)
        array = InputSpec("", shape, dtype, kind).draw(self.rng, 1)
        return self.initializer(array, "b", exact=True)


def _broadcastable(a: tuple, b: tuple) -> bool:
    """a broadcasts into b without changing b's shape."""
    if len(a) > len(b):
        return False
    return all(x == y or x == 1 for x, y in zip(a[::-1], b[::-1]))


# ---------------------------------------------------------------------------------------------
# Op generators: fn(builder) appends nodes, or raises Rejected when it cannot apply.

UNARY = {  # op -> attrs drawn per node
    "Relu": lambda g: {}, "Sigmoid": lambda g: {}, "Tanh": lambda g: {}, "Abs": lambda g: {},
    "Neg": lambda g: {}, "Erf": lambda g: {}, "Softplus": lambda g: {},
    "Elu": lambda g: {"alpha": g.choice([1.0, 0.5])},
    "LeakyRelu": lambda g: {"alpha": g.choice([0.01, 0.2])},
    "HardSigmoid": lambda g: {"alpha": g.choice([0.2, 1 / 6]), "beta": 0.5},
    "HardSwish": lambda g: {},
}
EXACT_UNARY = {"Relu", "Abs", "Neg"}


def gen_unary(g: Builder):
    x = g.pick()
    op = g.choice(sorted(UNARY))
    g.node(op, [x], exact=x.exact and op in EXACT_UNARY, **UNARY[op](g))


def gen_exp(g: Builder):
    x = g.pick(lambda v: v.scale <= 3)
    g.node("Exp", [x], scale=math.exp(3 * x.scale))


def gen_gelu(g: Builder):
    """GELU as exported (x * 0.5 * (1 + erf(x / sqrt 2))), which simplify recognises; the
    Gelu op itself from opset 20."""
    x = g.pick()
    if g.opset >= 20 and g.chance(0.3):
        g.node("Gelu", [x], approximate=g.choice(["none", "tanh"]))
        return
    d = g.node("Div", [x, g.const_node(np.float32(math.sqrt(2)))])[0]
    e = g.node("Erf", [d])[0]
    a = g.node("Add", [e, g.const_node(np.float32(1))])[0]
    m = g.node("Mul", [x, a])[0]
    g.node("Mul", [m, g.const_node(np.float32(0.5))])


def gen_clip(g: Builder):
    x = g.pick()
    lo = g.const_node(np.float32(g.choice([-1.0, 0.0, -0.5]))) if g.chance(0.8) else None
    hi = g.const_node(np.float32(g.choice([1.0, 6.0, 0.5]))) if g.chance(0.8) else None
    g.node("Clip", [x, lo, hi] if hi is not None else [x, lo], exact=x.exact)


def gen_binary(g: Builder):
    x = g.pick()
    op = g.choice(["Add", "Sub", "Mul", "Max", "Min", "Div", "Pow"])
    if op == "Div":
        y = g.broadcast_partner(x, kind="away_from_zero")
        g.node("Div", [x, y], scale=x.scale * 2)
    elif op == "Pow":   # a positive base (|x| + 0.5) and a small constant exponent
        if x.scale > 4:
            raise Rejected
        base = g.node("Add", [g.node("Abs", [x])[0], g.const_node(np.float32(0.5))])[0]
        exp = g.choice([2.0, 3.0, 0.5, -1.0, 1.5])
        g.node("Pow", [base, g.const_node(np.float32(exp))], scale=(x.scale + 0.5) ** 2)
    else:
        y = x if g.chance(0.1) else g.broadcast_partner(x)
        pair = [x, y] if g.chance(0.7) else [y, x]
        scale = x.scale * y.scale if op == "Mul" else x.scale + y.scale
        if scale > 1e4:
            raise Rejected
        g.node(op, pair, exact=x.exact and y.exact and op in ("Max", "Min"), scale=scale)


def gen_int(g: Builder):
    """Integer arithmetic: from an int input, a Cast of an exact float, or an int value."""
    dtype = g.choice([I32, I64])
    ints = [v for v in g.values if v.dtype == dtype]
    if not ints or g.chance(0.3):
        src = [v for v in g.values if v.dtype == F32 and v.exact and v.scale < 100]
        if src and g.chance(0.5):
            x = g.node("Cast", [g.choice(src)], to=ONNX_DTYPE[dtype], exact=True)[0]
        else:
            shape = g.choice([v.shape for v in g.values if v.dtype == F32] or [(3, 4)])
            x = g.add_input(shape, dtype, "int")
    else:
        x = ints[-1]
    op = g.choice(["Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Abs", "Neg"])
    if op in ("Abs", "Neg"):
        out = g.node(op, [x], exact=True)[0]
    elif op in ("Div", "Mod"):
        y = g.broadcast_partner(x, kind="nonzero_int")
        attrs = {"fmod": int(g.chance(0.5))} if op == "Mod" else {}
        out = g.node(op, [x, y], exact=True, scale=x.scale, **attrs)[0]
    else:
        y = g.broadcast_partner(x, kind="int")
        scale = x.scale * y.scale if op == "Mul" else x.scale + y.scale
        if scale > 1 << 20:   # no overflow: products stay far below 2**31
            raise Rejected
        out = g.node(op, [x, y], exact=True, scale=scale)[0]
    if g.chance(0.4):   # back to float so float ops consume it
        g.node("Cast", [out], to=TensorProto.FLOAT, exact=True)


def gen_conv(g: Builder):
    x = g.pick(lambda v: v.rank == 4 and all(v.static(i) for i in (1, 2, 3)))
    c, h, w = x.shape[1:]
    groups = [1] + ([c] if c > 1 else []) + [d for d in range(2, c) if c % d == 0]
    group = g.choice(groups)
    # 40 in big cases: two packed panels and a tail (a 1x1 conv's GEMM packs A for them)
    m = group * g.choice([1, 2]) if group == c and c > 1 else group * g.size((1, 2, 3, 4),
                                                                            (4, 8, 16, 40))
    kh, kw = g.choice([1, 2, 3, 5]), g.choice([1, 3])
    attrs = {"kernel_shape": [kh, kw], "group": group}
    if g.chance(0.3):
        attrs["strides"] = [g.choice([1, 2, 3]), g.choice([1, 2])]
    if g.chance(0.2):
        attrs["dilations"] = [g.choice([1, 2]), g.choice([1, 2])]
    if g.chance(0.2):
        attrs["auto_pad"] = g.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
    elif g.chance(0.6):
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in (kh, kw, kh, kw)]
    _check_windows((h, w), attrs)
    wt = g.weight((m, c // group, kh, kw), c // group * kh * kw)
    bias = [g.weight((m,), 1)] if g.chance(0.6) else []
    y = g.node("Conv", [x, wt] + bias, **attrs)[0]
    if g.chance(0.25):   # a BatchNormalization as exporters write it: per-channel Mul, Add
        scale = g.rng.uniform(0.5, 1.5, (m, 1, 1)).astype(np.float32)
        shift = g.rng.standard_normal(g.choice([(m, 1, 1), (1, m, 1, 1), (1,)]))
        y = g.node("Mul", [y, g.initializer(scale)])[0]
        g.node("Add", [g.initializer(shift.astype(np.float32)), y])


def _check_windows(sizes, attrs) -> None:
    """Rejects a conv or pool whose (dilated) window is larger than its padded input: ONNX's
    shape inference rounds the negative length up to one output. Also a ceil_mode pool whose
    last window would start in the end padding: onnxruntime, onnx.reference and dnnc drop that
    window, ONNX's shape inference keeps it (seed 77 case 104: AveragePool over width 3,
    stride 3, ceil_mode: inference says 2, every runtime 1), so later types would be wrong."""
    kernel = attrs["kernel_shape"]
    dilations = attrs.get("dilations", [1] * len(kernel))
    pads = attrs.get("pads", [0] * 2 * len(kernel))
    strides = attrs.get("strides", [1] * len(kernel))
    if attrs.get("auto_pad", "NOTSET").startswith("SAME"):
        return
    for i, (n, k, d, s) in enumerate(zip(sizes, kernel, dilations, strides)):
        window, padded = d * (k - 1) + 1, n + pads[i] + pads[i + len(kernel)]
        if padded < window:
            raise Rejected
        last_start = -(-(padded - window) // s) * s   # ceil_mode's last window
        if attrs.get("ceil_mode") and last_start >= n + pads[i]:
            raise Rejected


def gen_matmul(g: Builder):
    x = g.pick(lambda v: v.rank >= 2 and v.static(-1))
    k = x.shape[-1]
    if x.rank >= 3 and g.chance(0.3):   # batched, both operands computed
        m = g.size()
        y = g.add_input(tuple(d if g.chance(0.7) else 1 for d in x.shape[:-2]) + (k, m))
        g.node("MatMul", [x, y])
        return
    m = g.size((1, 2, 3, 5, 8, 13, 16), (16, 32, 64))
    g.node("MatMul", [x, g.weight((k, m), k)])


def gen_gemm(g: Builder):
    x = g.pick(lambda v: v.rank == 2 and v.static(1))
    trans_a = int(x.static(0) and g.chance(0.3))
    n, k = (x.shape[1], x.shape[0]) if trans_a else x.shape
    m = g.size((1, 2, 3, 5, 8, 13), (16, 32, 64))
    trans_b = int(g.chance(0.5))
    b = g.weight((m, k) if trans_b else (k, m), k)
    inputs = [x, b]
    if g.chance(0.7):
        cshape = g.choice([(m,), (1, m), ()] + ([(n, m)] if isinstance(n, int) else []))
        inputs.append(g.weight(cshape, 1))
    g.node("Gemm", inputs, transA=trans_a, transB=trans_b, alpha=g.choice([1.0, 0.5]),
           beta=g.choice([1.0, 2.0]))


def gen_softmax(g: Builder):
    x = g.pick(lambda v: v.rank >= 1)
    g.node(g.choice(["Softmax", "LogSoftmax"]), [x],
           axis=int(g.rng.integers(-x.rank, x.rank)), scale=2.0)


def gen_layernorm(g: Builder):
    if g.opset < 17:
        raise Rejected
    x = g.pick(lambda v: v.rank >= 1 and v.static(-1))
    if x.name not in {s.name for s in g.inputs}:
        # a computed row may be constant (a broadcast, a Where): its rounding in x - mean,
        # divided by sqrt(epsilon), would decide the result. A residual input of x's shape
        # (LayerNorm(x + residual), as in transformers) keeps every row well-conditioned.
        x = g.node("Add", [x, g.add_input(x.shape, F32)])[0]
    axes = [a for a in range(-x.rank, 0) if all(x.static(i) for i in range(a, 0))]
    axis = g.choice(axes)
    inner = x.shape[axis:]
    scale = g.weight(inner, 1)
    bias = [g.weight(inner, 1)] if g.chance(0.7) else []
    g.node("LayerNormalization", [x, scale] + bias, axis=axis,
           epsilon=g.choice([1e-5, 1e-3]), scale=3.0)


def gen_batchnorm(g: Builder):
    x = g.pick(lambda v: v.rank >= 2 and v.static(1))
    c = x.shape[1]
    params = [g.weight((c,), 1), g.weight((c,), 1), g.weight((c,), 1),
              g.initializer(g.rng.uniform(0.5, 2.0, c).astype(np.float32), "var")]
    g.node("BatchNormalization", [x] + params, epsilon=g.choice([1e-5, 1e-3]))


def gen_pool(g: Builder):
    x = g.pick(lambda v: v.rank == 4 and v.static(2) and v.static(3))
    op = g.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    if op.startswith("Global"):
        g.node(op, [x], exact=x.exact and op == "GlobalMaxPool")
        return
    k = [g.choice([1, 2, 3]), g.choice([1, 2, 3])]
    attrs = {"kernel_shape": k}
    if g.chance(0.6):
        attrs["strides"] = [g.choice([1, 2]), g.choice([1, 2, 3])]
    if g.chance(0.5):
        attrs["pads"] = [int(g.rng.integers(0, kk)) for kk in k + k]
    if g.chance(0.2):
        attrs["ceil_mode"] = 1
    if op == "MaxPool" and g.chance(0.2):
        attrs["dilations"] = [g.choice([1, 2]), 1]
    if op == "AveragePool" and g.chance(0.4):
        attrs["count_include_pad"] = 1
    _check_windows(x.shape[2:], attrs)
    g.node(op, [x], exact=x.exact and op == "MaxPool", **attrs)


def gen_reshape(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    static = [d for d in x.shape[1:] if isinstance(d, int)]
    if x.rank >= 1 and not x.static(0) and len(static) < x.rank - 1:
        raise Rejected
    if g.chance(0.2):   # flatten as exported: Concat(Shape(x)[:1], [-1])
        if x.rank < 2:
            raise Rejected
        shape = g.node("Shape", [x], exact=True)[0]
        head = g.node("Slice", [shape, g.ints([0]), g.ints([1])], exact=True)[0]
        target = g.node("Concat", [head, g.ints([-1])], axis=0, exact=True)[0]
        # what inference needs to know of the target's value: [0, -1] reads the same
        g.data[target.name] = numpy_helper.from_array(np.array([0, -1], np.int64))
        g.node("Reshape", [x, target], exact=x.exact)
        return
    if g.chance(0.2):
        g.node("Flatten", [x], axis=int(g.rng.integers(0, x.rank + 1)), exact=x.exact)
        return
    rest = int(np.prod(x.shape[1:])) if all(x.static(i) for i in range(1, x.rank)) else None
    if rest is None:
        raise Rejected
    head = [0 if not x.static(0) or g.chance(0.5) else x.shape[0]] if x.rank else []
    factors = _split_factors(rest, g)
    if g.chance(0.3):
        factors[int(g.rng.integers(len(factors)))] = -1
    g.node("Reshape", [x, g.ints(head + factors)], exact=x.exact)


def _split_factors(n: int, g: Builder) -> list[int]:
    """n as a product of one to three factors, in random order, 1s allowed."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    a = g.choice(divisors)
    if g.chance(0.5):
        return [a, n // a]
    b = g.choice([d for d in divisors if (n // a) % d == 0])
    return [a, b, n // a // b]


def gen_transpose(g: Builder):
    x = g.pick(lambda v: v.rank >= 2, dtype=None)
    perm = [int(p) for p in g.rng.permutation(x.rank)]
    g.node("Transpose", [x], perm=perm, exact=x.exact)


def gen_concat(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axis = g.choice([a for a in range(x.rank) if x.static(a)] or [None])
    if axis is None:
        raise Rejected
    others = [v for v in g.values if v.dtype == x.dtype and v.rank == x.rank and
              all(a == axis or v.shape[a] == x.shape[a] for a in range(x.rank))]
    if g.chance(0.3):
        others.append(x)   # the same value twice: two uses by one node
    if not others or g.chance(0.3):
        shape = list(x.shape)
        shape[axis] = g.size()
        others.append(g.add_input(tuple(shape), x.dtype,
                                  "int" if x.dtype != F32 else "normal"))
    y = g.choice(others)
    parts = [x, y] if g.chance(0.5) else [y, x, y]
    g.node("Concat", parts, axis=axis - x.rank if g.chance(0.3) else axis,
           exact=all(p.exact for p in parts))


def gen_split(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axes = [a for a in range(x.rank) if x.static(a) and x.shape[a] >= 2]
    if not axes:
        raise Rejected
    axis = g.choice(axes)
    n = x.shape[axis]
    if g.chance(0.5) and n % 2 == 0:
        extra = {"num_outputs": 2} if g.opset >= 18 else {}
        g.node("Split", [x], n_out=2, axis=axis, exact=x.exact, **extra)
        return
    cut = int(g.rng.integers(1, n))
    sizes = g.ints([cut, n - cut])
    g.node("Split", [x, sizes], n_out=2, axis=axis, exact=x.exact)


def gen_slice(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axes = [a for a in range(x.rank) if x.static(a)]
    if not axes:
        raise Rejected
    chosen = sorted(set(g.choice(axes) for _ in range(2)))
    starts, ends, steps = [], [], []
    for a in chosen:
        n = x.shape[a]
        step = g.choice([1, 1, 2, -1, -2]) if n > 1 else 1
        lo, hi = sorted(int(v) for v in g.rng.integers(0, n + 1, 2))
        if hi == lo:
            hi = lo + 1
            if hi > n:
                lo, hi = n - 1, n
        if step > 0:
            start, end = lo, hi
        else:
            start, end = hi - 1, lo - 1
            if end < 0:
                end = -(2**63) if g.chance(0.5) else -n - 1   # clamped: through index 0
        if g.chance(0.3) and step > 0:
            start = start - n   # a negative index
        if g.chance(0.2) and step > 0 and end == n:
            end = 2**63 - 1     # INT64_MAX: to the end
        starts.append(start)
        ends.append(end)
        steps.append(step)
    inputs = [x, g.ints(starts), g.ints(ends), g.ints([a - x.rank if g.chance(0.3) else a
                                                        for a in chosen])]
    if any(s != 1 for s in steps) or g.chance(0.5):
        inputs.append(g.ints(steps))
    g.node("Slice", inputs, exact=x.exact)


def gen_gather(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    axes = [a for a in range(x.rank) if x.static(a)]
    if not axes:
        raise Rejected
    axis = g.choice(axes)
    n = x.shape[axis]
    shape = g.choice([(), (g.size((1, 2, 3, 5)),), (2, g.size((1, 2, 3)))])
    idx = g.rng.integers(-n, n, shape)
    g.node("Gather", [x, g.ints(idx)], axis=axis - x.rank if g.chance(0.3) else axis,
           exact=x.exact)


def gen_squeeze(g: Builder):
    x = g.pick(dtype=None)
    ones = [a for a in range(x.rank) if x.shape[a] == 1]
    if ones and g.chance(0.6):
        g.node("Squeeze", [x, g.ints([g.choice(ones)])], exact=x.exact)
    elif x.rank < 5:
        g.node("Unsqueeze", [x, g.ints([int(g.rng.integers(-x.rank - 1, x.rank + 1))])],
               exact=x.exact)
    else:
        raise Rejected


REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2")
AXES_AS_INPUT_SINCE = {"ReduceSum": 13}   # the others take axes as an input from opset 18


def gen_reduce(g: Builder):
    x = g.pick(lambda v: v.rank >= 1)
    op = g.choice(REDUCE)
    axes = sorted(set(int(a) for a in g.rng.integers(0, x.rank, g.choice([1, 1, 2, 3]))))
    all_axes = g.chance(0.25)
    if g.chance(0.3):
        axes = [a - x.rank for a in axes]
    keep = int(g.chance(0.5))
    exact = x.exact and op in ("ReduceMax", "ReduceMin")
    if op in ("ReduceSum", "ReduceL2", "ReduceMean") and x.scale > 100:
        raise Rejected
    scale = x.scale * (g.numel(x) if op == "ReduceSum" else 1)
    if all_axes:
        g.node(op, [x], keepdims=keep, exact=exact, scale=scale)
    elif g.opset >= AXES_AS_INPUT_SINCE.get(op, 18):
        g.node(op, [x, g.ints(axes)], keepdims=keep, exact=exact, scale=scale)
    else:
        g.node(op, [x], axes=axes, keepdims=keep, exact=exact, scale=scale)


def gen_pad(g: Builder):
    x = g.pick(lambda v: v.rank >= 1, dtype=None)
    mode = g.choice(["constant", "constant", "reflect", "edge"])
    begin, end = [], []
    for a in range(x.rank):
        n = x.shape[a]
        if not isinstance(n, int) or g.chance(0.4):
            begin.append(0)
            end.append(0)
            continue
        limit = n - 1 if mode == "reflect" else 3   # reflect pads at most n - 1
        begin.append(int(g.rng.integers(0, limit + 1)))
        end.append(int(g.rng.integers(0, limit + 1)))
    inputs = [x, g.ints(begin + end)]
    if mode == "constant" and g.chance(0.5):
        inputs.append(g.const_node(np.asarray(1.5 if x.dtype == F32 else 2, x.dtype)))
    g.node("Pad", inputs, mode=mode, exact=x.exact)


RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_COORDS = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def gen_resize(g: Builder):
    x = g.pick(lambda v: v.rank == 4 and v.static(2) and v.static(3))
    mode = g.choice(RESIZE_MODES)
    attrs = {"mode": mode,
             "coordinate_transformation_mode": g.choice(RESIZE_COORDS)}
    if mode == "nearest":
        attrs["nearest_mode"] = g.choice(NEAREST_MODES)
    if mode == "cubic":
        attrs["cubic_coeff_a"] = g.choice([-0.75, -0.5])
    if g.chance(0.5):
        scales = [1.0, 1.0] + [g.choice([0.5, 2.0, 1.5, 0.75, 3.0, 0.6]) for _ in range(2)]
        inputs = [x, None, g.initializer(np.asarray(scales, np.float32), "scales")]
    else:
        if not (x.static(0) and x.static(1)):
            raise Rejected   # sizes would fix the batch
        sizes = [x.shape[0], x.shape[1], g.choice([1, 2, 3, 5, 7, 9]),
                 g.choice([1, 2, 4, 6, 11])]
        inputs = [x, None, None, g.ints(sizes)]
    g.node("Resize", inputs, exact=x.exact and mode == "nearest", **attrs)


def gen_where(g: Builder):
    a = g.pick(lambda v: v.exact, dtype=None)
    if a.dtype == BOOL:
        raise Rejected
    b = g.broadcast_partner(a, kind="int" if a.dtype != F32 else "normal")
    cond = g.node(g.choice(["Greater", "Less", "Equal", "GreaterOrEqual"]), [a, b],
                  exact=True)[0]
    x = g.pick(lambda v: _broadcastable(v.shape, cond.shape) or
               _broadcastable(cond.shape, v.shape))
    y = g.broadcast_partner(x)
    g.node("Where", [cond, x, y], exact=x.exact and y.exact)


def gen_expand(g: Builder):
    x = g.pick(lambda v: any(d == 1 for d in v.shape) or v.rank < 3, dtype=None)
    shape = [g.size((2, 3, 5)) if d == 1 and g.chance(0.6) else 1 if g.chance(0.2) else d
             for d in x.shape]
    if g.chance(0.3) and len(shape) < 4:
        shape = [g.size((2, 3))] + shape
    if BATCH in shape:
        shape = [1 if d == BATCH else d for d in shape]   # 1 broadcasts to the batch
    g.node("Expand", [x, g.ints(shape)], exact=x.exact)


def gen_cast(g: Builder):
    x = g.pick(dtype=None)
    if x.dtype == F32:
        if not x.exact or x.scale > 1e6:
            raise Rejected   # rounding of a computed float may differ; out of range is UB
        to = g.choice([I32, I64])
    else:
        to = F32
    g.node("Cast", [x], to=ONNX_DTYPE[to], exact=True)


OPS = [  # (weight, generator)
    (8, gen_unary), (1, gen_exp), (2, gen_gelu), (2, gen_clip), (10, gen_binary),
    (4, gen_int), (7, gen_conv), (5, gen_matmul), (3, gen_gemm), (3, gen_softmax),
    (2, gen_layernorm), (2, gen_batchnorm), (4, gen_pool), (4, gen_reshape),
    (3, gen_transpose), (3, gen_concat), (2, gen_split), (3, gen_slice), (2, gen_gather),
    (2, gen_squeeze), (5, gen_reduce), (2, gen_pad), (2, gen_resize), (2, gen_where),
    (2, gen_expand), (2, gen_cast),
]


def _start(g: Builder) -> None:
    """The first input: an image, a sequence or a matrix; sometimes a second one."""
    n = g.batch_dim
    kind = g.choice(["image"] * 6 + ["sequence"] * 3 + ["matrix"] * 2)
    if kind == "image":
        if g.big:   # >= MIN_PARALLEL_WORK elements per image; 3x3 convs >= 1M MACs
            shape = (n, g.choice([16, 24]), g.choice([48, 49]), g.choice([48, 64]))
        else:
            shape = (n, g.size((1, 2, 3, 4, 5, 8)), g.size((1, 2, 3, 5, 7, 8, 9)),
                     g.size((1, 3, 4, 6, 7, 10, 13)))
    elif kind == "sequence":
        shape = (n, g.size((1, 3, 5, 7, 16), (128, 130)), g.size((1, 2, 4, 8, 13), (256, 300)))
    else:
        shape = (n, g.size((1, 2, 3, 5, 8, 17, 31), (32768, 40000)))
    # 5% of cases hold NaNs (never compared, cast or rounded: the input is not exact)
    g.add_input(shape, F32, "normal_nan" if g.chance(0.05) else "normal")
    if g.chance(0.2):
        g.add_input(shape, F32)


def generate(seed: int, index: int) -> Case:
    """The case (seed, index): the same model and input recipe every time."""
    rng = np.random.default_rng([seed, index, 0])
    big = bool(rng.random() < 0.08)
    symbolic = bool(rng.random() < 0.33)
    batch = int(rng.choice([1, 2, 3])) if not big else int(rng.choice([1, 2]))
    opset = int(rng.choice(OPSETS))
    g = Builder(rng, opset, big, BATCH if symbolic else batch)
    _start(g)
    weights = np.array([w for w, _ in OPS], float)
    target = int(rng.integers(2, 5 if big else 11))
    added, tries = 0, 0
    while added < target and tries < 200:
        tries += 1
        fn = OPS[int(rng.choice(len(OPS), p=weights / weights.sum()))][1]
        count = (len(g.nodes), len(g.values), len(g.initializers), len(g.inputs), g.count)
        consumed = set(g.consumed)
        try:
            fn(g)
            added += 1
        except Rejected:   # roll back what the generator added before it gave up
            g.nodes = g.nodes[:count[0]]
            g.values = g.values[:count[1]]
            g.initializers = g.initializers[:count[2]]
            g.inputs = g.inputs[:count[3]]
            g.consumed = consumed
    return _finish(g, seed, index, symbolic, big, batch)


def _finish(g: Builder, seed, index, symbolic, big, batch) -> Case:
    produced = {o for n in g.nodes for o in n.output}
    leaves = [v for v in g.values if v.name in produced and v.name not in g.consumed]
    outputs = leaves[-4:] or [v for v in g.values if v.name in produced][-1:]
    inner = [v for v in g.values if v.name in produced and v.name in g.consumed and
             v not in outputs]
    if inner and g.chance(0.2):   # an output that other nodes also read
        outputs.append(g.choice(inner))
    if not outputs:   # no op applied: one Identity so the graph has an output
        outputs = g.node("Identity", [g.values[0]])
    used = {i for n in g.nodes for i in n.input} | {v.name for v in outputs}
    inputs = [s for s in g.inputs if s.name in used]
    graph = helper.make_graph(
        g.nodes, f"fuzz_{seed}_{index}",
        [helper.make_tensor_value_info(s.name, ONNX_DTYPE[s.dtype], s.shape) for s in inputs],
        [helper.make_tensor_value_info(v.name, ONNX_DTYPE[v.dtype], v.shape)
         for v in outputs],
        [t for t in g.initializers if t.name in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", g.opset)],
                              producer_name="dnnc.testing.fuzz")
    model.ir_version = helper.find_min_ir_version_for(model.opset_import)
    onnx.checker.check_model(model, full_check=True)
    return Case(seed, index, model, inputs, symbolic, big, batch,
                sorted({n.op_type for n in g.nodes}))
