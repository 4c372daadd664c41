"""The graph a fuzz case grows: `Builder` (nodes, initializers, inputs and the values they
make, every output type from ONNX's own shape inference), `Val` (what op generators need to
know of a value: shape, dtype, exactness, magnitude, special values) and `InputSpec` (how an
input's random data is drawn).

A builder in special mode (`special=True`, the fuzzer's `--special`) draws some inputs with
special values (`special.SPECIAL`: +-inf, NaN, huge, +-0, subnormals at random positions);
the values they reach are marked `special` (and `huge` where finite values near FLT_MAX may be
among them), so that op generators keep them from what would make a comparison meaningless
(an order-dependent overflow in a sum, an integer division of MIN by -1). Without it, no
draw differs from a builder without special mode.

Everything random here comes from the builder's own generator, in a fixed order: a case must
stay a function of (seed, index) only, so this module must never draw from any other source
nor depend on iteration order of sets. It knows no op beyond the few it writes itself
(constant subgraphs of weights); the op generators are in `op_generators/`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.shape_inference import infer_node_outputs

from .special import SPECIAL, SPECIAL_NONFINITE, with_special_values

BATCH = "N"
"""The symbolic batch dim's name."""

ONNX_DTYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
              np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL,
              # int8 / uint8: QDQ chains; the others only special mode's casts (leaves)
              **{np.dtype(t): getattr(TensorProto, np.dtype(t).name.upper())
                 for t in (np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64)},
              # int4 / uint4: QDQ chains' 4-bit activations (opset 21)
              np.dtype(ml_dtypes.int4): TensorProto.INT4,
              np.dtype(ml_dtypes.uint4): TensorProto.UINT4}
NP_DTYPE = {v: k for k, v in ONNX_DTYPE.items()}
F32, I32, I64, BOOL, I8, U8, I4, U4 = (np.dtype(t) for t in (
    np.float32, np.int32, np.int64, np.bool_, np.int8, np.uint8, ml_dtypes.int4, ml_dtypes.uint4))
CORE = (F32, I32, I64, BOOL)
"""The dtypes generators pick from without naming one (int8/uint8: QDQ chains name theirs)."""


@dataclass
class Val:
    """A value of the graph being built, with what op generators need to know about it."""

    name: str
    shape: tuple            # ints, or BATCH for the symbolic batch dim
    dtype: np.dtype
    exact: bool = True      # computed without rounding: safe to compare, cast or round
    scale: float = 1.0      # rough magnitude of its elements (keeps Exp, Pow, int Mul in range)
    special: bool = False   # may hold +-inf, NaN or huge values (special mode's inputs)
    huge: bool = False      # may hold finite values near FLT_MAX: kept out of sums, where
                            # the order of the terms would decide whether they overflow
    rounded: bool = False   # downstream of a QuantizeLinear of an inexact value: two correct
    #                         implementations may differ by a quantum (only QDQ chains read it)
    nan: bool = False       # may hold NaN (never quantized: rint(NaN) to int is undefined)
    quant: tuple | None = None   # (scale, zero point, dtype) when it is DequantizeLinear(q)

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
        # (an array also for shape (): onnxruntime refuses a NumPy scalar as an input)
        return np.asarray(DRAW[self.kind](rng, shape)).astype(self.dtype)


DRAW = {
    "normal": lambda rng, shape: rng.standard_normal(shape),
    # normal values on a grid of 1/8: Q/DQ of them with power-of-two scales hits exact ties
    "grid": lambda rng, shape: np.asarray(np.round(rng.standard_normal(shape) * 8) / 8),
    # a few NaNs among normal values: NaN propagation (rarely, see _start)
    "normal_nan": lambda rng, shape: np.where(rng.random(shape) < 0.03, np.nan,
                                              rng.standard_normal(shape)),
    "int": lambda rng, shape: rng.integers(-9, 10, shape),
    # special mode: normal values with +-inf, NaN, +-0, subnormals (and +-1e30, +-FLT_MAX)
    "special": lambda rng, shape: with_special_values(rng, rng.standard_normal(shape),
                                                      SPECIAL_NONFINITE),
    "special_huge": lambda rng, shape: with_special_values(rng, rng.standard_normal(shape),
                                                           SPECIAL),
    # an attention mask: 1.0 (keep) or 0.0, the first position of every row kept
    "mask": lambda rng, shape: np.concatenate(
        [np.ones(shape[:-1] + (1,)), rng.random(shape[:-1] + (shape[-1] - 1,)) < 0.7], -1),
    # divisors: nonzero integers, and floats away from zero (|x| in [0.5, 2])
    "nonzero_int": lambda rng, shape: rng.integers(1, 8, shape) * rng.choice([-1, 1], shape),
    "away_from_zero": lambda rng, shape: rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1],
                                                                                     shape),
}


class Rejected(Exception):
    """The op generator cannot apply to the chosen values; another op is tried."""


class Builder:
    """The graph under construction: nodes, initializers, inputs and the values they make."""

    def __init__(self, rng: np.random.Generator, opset: int, big: bool, batch_dim,
                 special: bool = False):
        self.rng = rng
        self.special = special
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
        """A new graph input; in special mode a normal float one may hold special values
        (never huge ones here: the first input's choice, `generate._start`)."""
        if self.special and kind == "normal" and np.dtype(dtype) == F32 and self.chance(0.3):
            kind = "special"
        name = f"{hint}{len(self.inputs)}"
        self.inputs.append(InputSpec(name, tuple(shape), np.dtype(dtype), kind))
        self.types[name] = helper.make_tensor_type_proto(ONNX_DTYPE[np.dtype(dtype)], shape)
        val = Val(name, tuple(shape), np.dtype(dtype), kind != "normal_nan",
                  2.0 if kind == "away_from_zero" else 9.0 if "int" in kind else 1.0,
                  special=kind.startswith("special"), huge=kind == "special_huge",
                  nan=kind == "normal_nan" or kind.startswith("special"))
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

    def pick(self, pred=lambda v: True, dtype=F32, rounded=False) -> Val:
        """A value satisfying `pred`: usually the newest (chains), else any (fan-out). Only a
        caller that says `rounded` gets a value downstream of an inexact QuantizeLinear: the
        fuzzer compares those in quanta, which holds only as far as QDQ chains go."""
        options = [v for v in self.usable(rounded)
                   if (v.dtype == dtype if dtype is not None else v.dtype in CORE) and pred(v)]
        if not options:
            raise Rejected
        if self.chance(0.6):
            return options[-1]
        return self.choice(options)

    def usable(self, rounded=False) -> list[Val]:
        """The values an op may consume: not the rounded ones unless `rounded`."""
        return [v for v in self.values if rounded or not v.rounded]

    def node(self, op: str, inputs: list, n_out: int = 1, exact=False, scale=None,
             **attrs) -> list[Val]:
        """Append an `op` node; its output types come from ONNX shape inference. Raises
        Rejected when inference fails or leaves a dim unknown. An output is rounded when an
        input is or when it quantizes an inexact value; it may hold NaN when an input may."""
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
            given = [v for v in inputs if v is not None]
            outs.append(Val(name, tuple(dims), NP_DTYPE[t.tensor_type.elem_type], exact,
                            scale if scale is not None else
                            max([v.scale for v in given] + [1.0]),
                            special=any(v.special for v in given),
                            huge=any(v.huge for v in given),
                            rounded=any(v.rounded for v in given) or
                            op == "QuantizeLinear",
                            nan=any(v.nan or v.special for v in given)))
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
        existing = [u for u in self.usable(v.rounded) if u.dtype == dtype and
                    u.name != v.name and kind == "normal" and broadcastable(u.shape, v.shape)]
        if existing and self.chance(0.4):
            return self.choice(existing)
        rank = v.rank if self.chance(0.6) else int(self.rng.integers(0, v.rank + 1))
        shape = tuple(d if (self.chance(0.5) or d == BATCH and rank == v.rank) else 1
                      for d in v.shape[v.rank - rank:])
        if self.chance(0.5) or BATCH in shape:
            return self.add_input(shape, dtype, kind)
        array = InputSpec("", shape, dtype, kind).draw(self.rng, 1)
        return self.initializer(array, "b", exact=True)


def broadcastable(a: tuple, b: tuple) -> bool:
    """a broadcasts into b without changing b's shape."""
    if len(a) > len(b):
        return False
    return all(x == y or x == 1 for x, y in zip(a[::-1], b[::-1]))
