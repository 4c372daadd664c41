"""Special float values (+-inf, NaN, huge, +-0, subnormals) for tests and the fuzzer's
`--special` mode: the values themselves, how a fuzz input gets them at random positions, and a
model that casts one float input to every integer type (the table docs/semantics.md defines).

It only draws from the generator it is given (a fuzz case stays a function of its seed and
index) and never decides what a result should be: every target is compared with dnnc's numpy
target, and the numpy target with the documented table (tests/backends/test_float_to_int.py).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

FLT_MAX = float(np.finfo(np.float32).max)
FLT_TRUE_MIN = float(np.finfo(np.float32).smallest_subnormal)

CAST_PROBES = (
    float("inf"), float("-inf"), float("nan"), 1e20, -1e20, 2.0 ** 31, -2.0 ** 31 - 1000,
    2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 2.0 ** 32, 1.5e19, 5e9, -5e9, 300.7, -300.7, -0.9, 0.9,
    128.5, -129.0, -1.5, 65504.0, 70000.0, 0.0, -0.0, 1e-40, -1e-40, FLT_TRUE_MIN, FLT_MAX,
    -FLT_MAX, 1e300, 2.0 ** 31 - 0.5, -2.0 ** 31 - 0.5, 4294967295.5,
)
"""Inputs of the float -> integer cast table: NaN, +-inf, out of range on either side of
every integer type's bounds, bounds themselves, fractions, subnormals and +-0."""

SPECIAL_NONFINITE = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40, -1e-40, FLT_TRUE_MIN],
                             np.float64)
"""What the fuzzer's special mode puts into float inputs (as float32) that sums may take:
inf + -inf is NaN in any order."""

SPECIAL = np.concatenate([SPECIAL_NONFINITE, [1e30, -1e30, FLT_MAX, -FLT_MAX]])
"""... and huge values too, for inputs kept out of sums (FLT_MAX + FLT_MAX - FLT_MAX is inf
or FLT_MAX by the order of the terms)."""

INT_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")

_ONNX = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
         "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE,
         **{name: getattr(TensorProto, name.upper()) for name in INT_TYPES}}


def with_special_values(rng: np.random.Generator, array: np.ndarray, values: np.ndarray = SPECIAL,
                        fraction: float = 0.1) -> np.ndarray:
    """`array` (floats) with about `fraction` of its elements replaced by `values` at random
    positions (at least one when it has any element)."""
    out = np.array(array, copy=True)
    if not out.size:
        return out
    where = rng.random(out.shape) < fraction
    where.flat[int(rng.integers(out.size))] = True
    picks = values[rng.integers(len(values), size=out.shape)]
    with np.errstate(over="ignore"):
        out[where] = picks[where].astype(out.dtype)
    return out


def cast_model(source: str, n: int = len(CAST_PROBES), opset: int = 21) -> bytes:
    """An ONNX model with one input `x` of float type `source` ("float16", "bfloat16",
    "float32", "float64") and shape [n], cast to every type of INT_TYPES (outputs named
    after them)."""
    x = helper.make_tensor_value_info("x", _ONNX[source], [n])
    nodes = [helper.make_node("Cast", ["x"], [to], to=_ONNX[to]) for to in INT_TYPES]
    outputs = [helper.make_tensor_value_info(to, _ONNX[to], [n]) for to in INT_TYPES]
    model = helper.make_model(helper.make_graph(nodes, f"cast_{source}", [x], outputs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = helper.find_min_ir_version_for(model.opset_import)
    return model.SerializeToString()
