"""Element types and tensor types of the graph IR, with symbolic dimensions.

A dimension is an `int` or a `str`. A string is a symbolic size: a name ("N", "batch") or a
product of names with an integer coefficient written in canonical form ("2*N*S"), so that the
shape arithmetic exporters emit (Shape -> Gather -> Mul -> Reshape) stays exact. A sum of
symbols, which shapes rarely need, becomes an opaque parenthesised name ("(N+1)").
This module must not import onnx: the frontend maps ONNX's element types onto these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import ml_dtypes
import numpy as np

Dim = Union[int, str]


class DType:
    """An element type: its name, NumPy dtype and kind."""

    __slots__ = ("name", "np", "kind")

    def __init__(self, name: str, np_dtype):
        self.name = name
        self.np = np.dtype(np_dtype)
        # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float (bfloat16 included)
        self.kind = "f" if name == "bfloat16" else self.np.kind

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):
        return (DType.from_name, (self.name,))

    @staticmethod
    def from_name(name: str) -> "DType":
        return _BY_NAME[name]

    @staticmethod
    def from_numpy(dtype) -> "DType":
        dt = np.dtype(dtype)
        try:
            return _BY_NUMPY[dt]
        except KeyError:
            raise TypeError(f"no dnnc dtype for numpy dtype {dt}") from None


bool_ = DType("bool", np.bool_)
int8 = DType("int8", np.int8)
int16 = DType("int16", np.int16)
int32 = DType("int32", np.int32)
int64 = DType("int64", np.int64)
uint8 = DType("uint8", np.uint8)
uint16 = DType("uint16", np.uint16)
uint32 = DType("uint32", np.uint32)
uint64 = DType("uint64", np.uint64)
float16 = DType("float16", np.float16)
bfloat16 = DType("bfloat16", ml_dtypes.bfloat16)
float32 = DType("float32", np.float32)
float64 = DType("float64", np.float64)

ALL_DTYPES = (bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64,
              float16, bfloat16, float32, float64)
FLOAT_DTYPES = tuple(d for d in ALL_DTYPES if d.is_float)
INT_DTYPES = tuple(d for d in ALL_DTYPES if d.is_int)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NUMPY = {d.np: d for d in ALL_DTYPES}


def static_shape(shape) -> tuple[int, ...] | None:
    """`shape` as ints when every dim is known (an int), None when any is symbolic. The one
    static-shape test: the loop IR's `static_shape` maps its constant dims onto it."""
    shape = tuple(shape)
    return shape if all(isinstance(d, int) for d in shape) else None


@dataclass(frozen=True)
class TensorType:
    """A tensor's element type and shape; shape entries are ints or symbolic names."""

    dtype: DType
    shape: tuple[Dim, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return static_shape(self.shape) is not None

    @property
    def numel(self) -> int | None:
        """Element count when the shape is static, else None."""
        return math.prod(self.shape) if self.is_static else None

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def __str__(self) -> str:
        return f"{self.dtype.name}{shape_text(self.shape)}"

    def __eq__(self, other) -> bool:
        return (isinstance(other, TensorType) and self.dtype is other.dtype
                and self.shape == other.shape)

    def __hash__(self) -> int:
        return hash((self.dtype.name, self.shape))


# ---------------------------------------------------------------------------------------------
# Symbolic dimension arithmetic: monomials  coef * name1 * name2 ...


def _parse(d: Dim) -> tuple[int, tuple[str, ...]] | None:
    """A dim as (coefficient, sorted factor names); None for an opaque expression."""
    if isinstance(d, (int, np.integer)):
        return int(d), ()
    if d.startswith("("):
        return None
    coef, names = 1, []
    for part in d.split("*"):
        if part.lstrip("-").isdigit():
            coef *= int(part)
        else:
            names.append(part)
    return coef, tuple(sorted(names))


def _format(coef: int, names: tuple[str, ...]) -> Dim:
    if not names:
        return coef
    body = "*".join(names)
    return body if coef == 1 else f"{coef}*{body}"


def dim_mul(a: Dim, b: Dim) -> Dim:
    pa, pb = _parse(a), _parse(b)
    if pa is None or pb is None:
        if a == 1 or b == 1:
            return b if a == 1 else a
        return f"({a}*{b})"
    return _format(pa[0] * pb[0], tuple(sorted(pa[1] + pb[1])))


def dim_div(a: Dim, b: Dim) -> Dim:
    """Exact division a / b of sizes (as in reshape's -1); opaque when it does not cancel."""
    pa, pb = _parse(a), _parse(b)
    if pa is not None and pb is not None:
        names = list(pa[1])
        for n in pb[1]:
            if n not in names:
                break
            names.remove(n)
        else:
            if pb[0] != 0 and pa[0] % pb[0] == 0:
                return _format(pa[0] // pb[0], tuple(names))
    if b == 1:
        return a
    return f"({a}//{b})"


def dim_add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if b == 0:
        return a
    if a == 0:
        return b
    pa, pb = _parse(a), _parse(b)
    if pa is not None and pb is not None and pa[1] == pb[1]:
        return _format(pa[0] + pb[0], pa[1])
    return f"({a}+{b})"


def dim_sub(a: Dim, b: Dim) -> Dim:
    if isinstance(b, int):
        return dim_add(a, -b)
    if a == b:
        return 0
    return f"({a}-{b})"


def dims_product(dims) -> Dim:
    out: Dim = 1
    for d in dims:
        out = dim_mul(out, d)
    return out


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """NumPy broadcasting over shapes with symbolic dims; raises ValueError on a clash.

    A symbolic dim against a constant other than 1 takes the constant (the symbol must equal it);
    two different symbols give the first (they must be equal at run time, or one of them 1).
    """
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dim: Dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1 or d == dim:
                continue
            if dim == 1:
                dim = d
            elif isinstance(d, int) and isinstance(dim, int):
                raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
            elif isinstance(d, int):
                dim = d
        out.append(dim)
    return tuple(out)


def shape_text(shape) -> str:
    """`[2,3]`, `[N,784]`: a shape as every message prints it (`TensorType`'s own form), so an
    expected and a given shape read alike in one message."""
    return f"[{','.join(str(d) for d in shape)}]"
