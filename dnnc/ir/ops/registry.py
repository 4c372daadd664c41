"""The op registry: the one source of truth for what each op means.

Each op is registered once, in its family's module, with its attribute schema and defaults,
`infer` (output types from input types; symbolic dims kept), `evaluate` (the NumPy reference),
its fusion `pattern`, its loop-IR `compute` and, where its pattern's estimate is wrong, its
FLOP rule `flops` (`ir/flops.py`). Nothing else keeps a table of op names.

`infer_node` also propagates *known values* of small integer tensors through shape arithmetic
(Shape -> Gather -> Concat -> Reshape, as exporters write it), with symbolic dims as `SymDim`
objects, so that Reshape of a dynamic batch still infers a symbolic output shape.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...errors import DNNCError, ModelFormatError, ShapeError
from ..types import Dim, DType, TensorType, dim_add, dim_div, dim_mul, dim_sub


class Pattern(enum.IntEnum):
    """How an op may fuse with its neighbours (as TVM's op patterns)."""

    ELEMWISE = 0      # out[i] = f(in[i])
    BROADCAST = 1     # elementwise with broadcasting
    INJECTIVE = 2     # each output element reads a computable input element (reshape, gather)
    REDUCE = 3        # reductions along axes
    OUT_FUSABLE = 4   # complex ops (conv, matmul) whose elementwise consumers can fuse
    OPAQUE = 8        # not fusable


REQUIRED = object()
"""Marks an attribute with no default."""


@dataclass
class OpDef:
    """Everything about one op."""

    name: str
    pattern: Pattern
    infer: Callable[["InferContext"], list[TensorType]]
    evaluate: Callable[..., Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    num_inputs: tuple[int, int | None] = (1, 1)
    num_outputs: tuple[int, int | None] = (1, 1)
    compute: Callable | None = None
    deterministic: bool = True
    # evaluate() may run on partially known shape values (object arrays holding SymDims)
    shape_arith: bool = False
    # computes the known value of the output from types alone (Shape, Size)
    known: Callable[["InferContext"], np.ndarray | None] | None = None
    # inputs that parameterise the op rather than carry data (axes, shapes, pads, scales):
    # compiled targets specialise on their values when they are only known at run time
    params: tuple[int, ...] = ()
    # inputs that hold learned parameters (filters, a dense op's B, biases): constant folding
    # materialises a constant computed for them whatever its size (a target packs it once
    # and reads it every call; computing it on every call instead costs more than storing it)
    weights: tuple[int, ...] = ()
    # node -> estimated FLOPs (ir/flops.py); None: estimated from the pattern
    flops: Callable | None = None
    # (node, which inputs carry a batch axis 0) -> whether output item i reads only item i
    # of those (ir/batching.py); None: elementwise and broadcasting ops by their pattern,
    # every other op is not batch-separable
    batched: Callable | None = None
    # the input whose buffer the output may take (an in-place update, `Graph.aliases`): the
    # compute rule reads each element of it only for the output element at the same index
    in_place: int | None = None
    # the op's loop form where its output is computed in that input's array: (inputs,
    # outputs, **attrs) -> (a tensor of the values it writes, `where(*i)` -> (the output
    # index its element i goes to, the condition of that store or None)); the elements it
    # leaves as they were are not touched (a KV cache's one new row, not a pass over all)
    updates: Callable | None = None

    def run(self, inputs: list, attrs: dict) -> list[np.ndarray]:
        """Evaluate the NumPy reference; always returns a list of outputs."""
        out = self.evaluate(*inputs, **attrs)
        return list(out) if isinstance(out, (tuple, list)) else [out]


_REGISTRY: dict[str, OpDef] = {}


def register_op(name: str, *, pattern: Pattern, infer, evaluate, attrs: dict | None = None,
                inputs: tuple[int, int | None] | int = 1,
                outputs: tuple[int, int | None] | int = 1, **options) -> OpDef:
    """Register an op once; a second registration of the same name is a bug."""
    if name in _REGISTRY:
        raise RuntimeError(f"op {name!r} registered twice")
    op = OpDef(name, pattern, infer, evaluate, dict(attrs or {}),
               inputs if isinstance(inputs, tuple) else (inputs, inputs),
               outputs if isinstance(outputs, tuple) else (outputs, outputs), **options)
    _REGISTRY[name] = op
    return op


def get_op(name: str) -> OpDef:
    _load_families()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op {name!r} is registered") from None


def is_registered(name: str) -> bool:
    _load_families()
    return name in _REGISTRY


def all_ops() -> dict[str, OpDef]:
    _load_families()
    return dict(_REGISTRY)


def _load_families() -> None:
    from . import _families  # noqa: F401  (importing registers every family)


# ---------------------------------------------------------------------------------------------
# Symbolic dims inside partially known values


class SymDim:
    """A symbolic size inside a known shape value; arithmetic follows `types.dim_*`."""

    __slots__ = ("dim",)

    def __init__(self, dim: Dim):
        self.dim = dim

    @staticmethod
    def wrap(d: Dim):
        return int(d) if isinstance(d, (int, np.integer)) else SymDim(d)

    def _bin(self, other, fn, reverse=False):
        if isinstance(other, SymDim):
            other = other.dim
        elif isinstance(other, (int, np.integer)):
            other = int(other)
        else:
            return NotImplemented
        a, b = (other, self.dim) if reverse else (self.dim, other)
        return SymDim.wrap(fn(a, b))

    def __add__(self, o):
        return self._bin(o, dim_add)

    def __radd__(self, o):
        return self._bin(o, dim_add, True)

    def __sub__(self, o):
        return self._bin(o, dim_sub)

    def __rsub__(self, o):
        return self._bin(o, dim_sub, True)

    def __mul__(self, o):
        return self._bin(o, dim_mul)

    def __rmul__(self, o):
        return self._bin(o, dim_mul, True)

    def __floordiv__(self, o):
        return self._bin(o, dim_div)

    def __rfloordiv__(self, o):
        return self._bin(o, dim_div, True)

    __truediv__ = __floordiv__
    __rtruediv__ = __rfloordiv__

    def __eq__(self, o):
        # sizes are never negative, so a symbol never equals -1 or 0 sentinels
        return isinstance(o, SymDim) and o.dim == self.dim

    def __ne__(self, o):
        return not self.__eq__(o)

    def __hash__(self):
        return hash(self.dim)

    def __repr__(self):
        return f"SymDim({self.dim!r})"


def known_constant(v) -> np.ndarray | None:
    """A Value's contents when fully known at compile time (a constant, or a value inference
    knows without symbols, as Shape of a static tensor), else None."""
    if v is None:
        return None
    if v.const is not None:
        return v.const
    if v.known is not None and not any(isinstance(x, SymDim) for x in v.known.flat):
        return np.asarray(v.known.astype(v.type.dtype.np)).reshape(v.type.shape)
    return None


def to_dims(known: np.ndarray) -> list[Dim]:
    """A known 1-D shape value as a list of dims (ints and symbolic names)."""
    return [x.dim if isinstance(x, SymDim) else int(x) for x in np.asarray(known).reshape(-1)]


def from_dims(dims, shape=None) -> np.ndarray:
    arr = np.empty(len(dims), dtype=object)
    for i, d in enumerate(dims):
        arr[i] = SymDim.wrap(d)
    return arr if shape is None else arr.reshape(shape)


_MAX_KNOWN_ELEMENTS = 64  # shape arithmetic only; larger tensors are data, not shapes


class InferContext:
    """What `infer` sees: input types, attributes, and known input values."""

    def __init__(self, op: OpDef, node_name: str, inputs, attrs: dict, num_outputs: int):
        self.op = op
        self.node_name = node_name
        self.values = inputs
        self.inputs: list[TensorType | None] = [None if v is None else v.type for v in inputs]
        self.attrs = attrs
        self.num_outputs = num_outputs
        self._fresh = 0

    def __len__(self) -> int:
        return len(self.inputs)

    def has(self, i: int) -> bool:
        """Whether optional input i is present."""
        return i < len(self.inputs) and self.inputs[i] is not None

    def type(self, i: int) -> TensorType:
        return self.inputs[i]

    def shape(self, i: int) -> tuple[Dim, ...]:
        return self.inputs[i].shape

    def dtype(self, i: int) -> DType:
        return self.inputs[i].dtype

    def value(self, i: int) -> np.ndarray | None:
        """Input i's contents when fully known at compile time (a constant), else None."""
        if not self.has(i):
            return None
        v = self.values[i]
        if v.const is not None:
            return v.const
        if v.known is not None and not any(isinstance(x, SymDim) for x in v.known.flat):
            return v.known.astype(v.type.dtype.np)
        return None

    def partial(self, i: int) -> np.ndarray | None:
        """Input i's contents as an object array of ints and SymDims, when known."""
        if not self.has(i):
            return None
        v = self.values[i]
        if v.const is not None:
            if v.const.size > _MAX_KNOWN_ELEMENTS:
                return None
            return v.const.astype(object) if v.const.dtype.kind in "iub" else None
        return v.known

    def dims(self, i: int) -> list[Dim] | None:
        """Input i read as a shape (a 1-D integer tensor), with symbolic entries, or None."""
        known = self.partial(i)
        return None if known is None else to_dims(known)

    def fresh_dim(self, hint: str = "") -> str:
        """A new symbolic dim for a size known only at run time.

        Named after the node, so inferring the same node again (`Graph.verify`) gives the
        same name, and two nodes never share one."""
        self._fresh += 1
        node = re.sub(r"[^A-Za-z0-9_]", "_", self.node_name) or "node"
        return f"{hint or self.op.name.lower()}_{node}_{self._fresh}"

    def fail(self, message: str) -> ShapeError:
        return ShapeError(f"{self.op.name} node {self.node_name!r}: {message}")


def normalize_attrs(op: OpDef, attrs: dict, node_name: str) -> dict:
    """Check attribute names against the schema and fill in defaults."""
    unknown = set(attrs) - set(op.attrs)
    if unknown:
        raise ModelFormatError(f"{op.name} node {node_name!r}: unknown attribute(s) "
                               f"{sorted(unknown)}; expected some of {sorted(op.attrs)}")
    full = {}
    for key, default in op.attrs.items():
        if key in attrs:
            full[key] = attrs[key]
        elif default is REQUIRED:
            raise ModelFormatError(f"{op.name} node {node_name!r}: missing required "
                                   f"attribute {key!r}")
        else:
            full[key] = default
    return full


def infer_node(op_name: str, inputs: list, attrs: dict, num_outputs: int, node_name: str):
    """Check a node and infer its output types and known values.

    Returns (types, known values, attributes with defaults filled in).
    """
    op = get_op(op_name)
    lo, hi = op.num_inputs
    while inputs and inputs[-1] is None and len(inputs) > lo:
        inputs = inputs[:-1]
    if len(inputs) < lo or (hi is not None and len(inputs) > hi):
        bound = f"{lo}" if lo == hi else f"{lo} to {hi if hi is not None else 'any'}"
        raise ShapeError(f"{op_name} node {node_name!r}: takes {bound} inputs, "
                         f"given {len(inputs)}")
    olo, ohi = op.num_outputs
    if num_outputs < olo or (ohi is not None and num_outputs > ohi):
        raise ShapeError(f"{op_name} node {node_name!r}: cannot have {num_outputs} outputs")
    full = normalize_attrs(op, attrs, node_name)
    ctx = InferContext(op, node_name, inputs, full, num_outputs)
    try:
        types = list(op.infer(ctx))
    except DNNCError:
        raise
    except Exception as exc:  # an op's infer found inputs it cannot accept
        raise ShapeError(f"{op_name} node {node_name!r}: cannot infer output types from "
                         f"{', '.join(str(t) for t in ctx.inputs)}: {exc}") from exc
    if len(types) < num_outputs:
        raise ShapeError(f"{op_name} node {node_name!r}: inferred {len(types)} outputs, "
                         f"{num_outputs} needed")
    types = types[:num_outputs]
    return types, _known_outputs(op, ctx, types), full


def _known_outputs(op: OpDef, ctx: InferContext, types: list[TensorType]) -> list:
    none = [None] * len(types)
    if op.known is not None:
        return [op.known(ctx)] + none[1:]
    if not op.shape_arith or not ctx.inputs:
        return none
    for t in types:
        if not t.dtype.is_int and t.dtype.kind != "b" or t.numel is None or \
                t.numel > _MAX_KNOWN_ELEMENTS:
            return none
    args = []
    symbolic = False
    for i in range(len(ctx.inputs)):
        if not ctx.has(i):
            args.append(None)
            continue
        exact = ctx.value(i)
        if exact is not None:
            args.append(exact)
            continue
        part = ctx.partial(i)
        if part is None:
            return none
        symbolic = True
        args.append(part)
    try:
        with np.errstate(all="ignore"):
            outs = op.run(args, ctx.attrs)
    except Exception:  # the reference cannot follow symbols here; the value stays unknown
        return none
    known = []
    for out, t in zip(outs, types):
        out = np.asarray(out)
        if not symbolic or not any(isinstance(x, SymDim) for x in out.flat):
            try:
                out = out.astype(t.dtype.np).astype(object)
            except (TypeError, ValueError):
                return none
        if out.shape != t.shape:
            return none
        known.append(out)
    return known
