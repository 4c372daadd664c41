"""Float -> integer casts give docs/semantics.md's table on every target, for every float
source and integer destination: NaN, +-inf, huge values, the bounds of each type, fractions,
subnormals and +-0 (dnnc.testing.special.CAST_PROBES). The table is restated here as plain
Python on exact integers, independent of the NumPy and legalize code that implement it; the
cuda target is compared with it in tests/backends/cuda/test_cuda_special_values.py."""

import math

import ml_dtypes
import numpy as np
import pytest

import dnnc
from dnnc.testing.special import CAST_PROBES, INT_TYPES, cast_model

SOURCES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
           "float64": np.float64}


def _signed(v: float, bits: int) -> int:
    """trunc(v) where it fits in `bits` signed bits, else the minimum (NaN, +-inf too)."""
    low = -(1 << (bits - 1))
    if math.isnan(v) or math.isinf(v):
        return low
    t = math.trunc(v)
    return t if low <= t < -low else low


def documented(v: float, to: str):
    """docs/semantics.md's float -> `to` conversion of the (exact) value v."""
    if to == "bool":
        return v != 0   # NaN: true
    bits = int(to.lstrip("uint"))
    if bits < 32:   # int32's low bits
        r = _signed(v, 32) % (1 << bits)
    elif to.startswith("u"):
        half = 2.0 ** (bits - 1)
        r = (_signed(v - half, bits) ^ -(1 << (bits - 1))) if v >= half else _signed(v, bits)
        r %= 1 << bits
    else:
        return _signed(v, bits)
    if not to.startswith("u") and r >= 1 << (bits - 1):
        r -= 1 << bits
    return r


def probes(source: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.array(CAST_PROBES, np.float64).astype(SOURCES[source])


EXAMPLES = [   # (source, value, destination, result): the lines docs/semantics.md shows
    ("float32", 300.7, "uint8", 44), ("float32", -300.7, "uint8", 212),
    ("float32", 128.5, "int8", -128), ("float32", 70000.0, "int16", 4464),
    ("float32", -0.9, "int32", 0), ("float32", float("nan"), "int32", -2 ** 31),
    ("float32", float("inf"), "int64", -2 ** 63), ("float32", 1e20, "int32", -2 ** 31),
    ("float32", -1.5, "uint32", 2 ** 32 - 1), ("float32", 5e9, "uint32", 0),
    ("float32", -5e9, "uint32", 2 ** 31), ("float32", float("nan"), "uint64", 2 ** 63),
    ("float64", 2.0 ** 64, "uint64", 0), ("float64", 1.5e19, "uint64", 15 * 10 ** 18),
    ("float64", -2.0 ** 31 - 1000, "uint64", 2 ** 64 - 2 ** 31 - 1000),
    ("float64", -2.0 ** 31 - 0.5, "int32", -2 ** 31), ("float16", float("-inf"), "uint8", 0),
    ("float32", float("nan"), "bool", True), ("float32", -0.0, "bool", False),
    ("float32", 1e-40, "bool", True), ("float32", 1e-40, "int32", 0),
]


def test_the_restated_table_gives_the_documented_examples():
    for source, value, to, want in EXAMPLES:
        v = float(np.array(value, np.float64).astype(SOURCES[source]))
        assert documented(v, to) == want, (source, value, to)


@pytest.mark.parametrize("target,opt_level", [("numpy", 3), ("llvm", 0), ("llvm", 3)])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_float_to_every_int_cast_gives_the_documented_table(source, target, opt_level):
    x = probes(source)
    compiled = dnnc.compile(cast_model(source, len(x)), target=target, opt_level=opt_level)
    outputs = compiled.run(x=x)
    wrong = []
    for to, got in zip(INT_TYPES, outputs):
        assert got.dtype == np.dtype(to)
        for v, g in zip(x.astype(np.float64).tolist(), got.tolist()):
            if g != documented(v, to):
                wrong.append((v, to, g, documented(v, to)))
    assert not wrong, f"{len(wrong)} wrong (value, to, got, documented): {wrong[:12]}"


def test_constant_folding_gives_the_same_table():
    """A Cast of a constant is folded by the numpy reference at compile time: the same
    table as at run time (llvm, whose folding must not see poison either)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(cast_model("float32", len(CAST_PROBES)))
    x = probes("float32")
    model.graph.initializer.append(numpy_helper.from_array(x, "x"))
    del model.graph.input[:]
    folded = dnnc.compile(model.SerializeToString(), target="llvm", opt_level=3).run()
    for to, got in zip(INT_TYPES, folded):
        assert got.tolist() == [documented(v, to) for v in x.astype(np.float64).tolist()], to
