"""FX graphs of core ATen ops -> dnnc Graph: what `torch.compile` hands a backend after
aot_autograd's decompositions (`compiler/torch_backend.py`), imported straight into dnnc's
graph IR, no ONNX round trip.

A placeholder becomes a graph input with its fake tensor's type (a dim that dynamo made
symbolic, a SymInt such as `s77`, becomes the symbolic dim "s77"), or a constant where the
caller gives its value (frozen parameters and buffers); a placeholder that is a SymInt is no
input at all: its value is read from the shape of an input that has it. Each `call_function`
node goes through the converter `torch_aten.py` registers for its ATen overload (a node on
sizes, `aten.sym_size.int` or `s77 * 7` in a torch.export graph, becomes its expression over
the inputs' dims), except the views and flattened products that torch's decomposition of
`linear` and `matmul` leaves: each is one N-D MatMul, as in an ONNX export (`torch_matmul.py`).
`supported(node, device)` is what the partitioner asks. This module
imports torch (an optional dependency: only the torch backend and `torch_export.py` import
it) and never compiles or runs a graph.
"""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.fx as fx
from torch._decomp import core_aten_decompositions

from ..errors import DNNCError, ShapeError, UnsupportedOpError, UnsupportedTypeError
from ..ir import types as T
from ..ir.graph import Graph, Value
from . import torch_attention  # noqa: F401  (registers the attention ops in ATEN)
from .torch_matmul import Fold, fold
from .onnx import constant_value
from .torch_aten import ATEN, ImportContext, np_dtype

__all__ = ["import_fx", "supported", "size_node", "op_name", "tensor_array",
           "UnsupportedATenError", "DECOMPOSITIONS", "CHECKS"]

DECOMPOSITIONS = {op: fn for op, fn in core_aten_decompositions().items()
                  if str(op) not in ATEN}
"""What torch decomposes before an import (aot_autograd for the backend, `run_decompositions`
for an ExportedProgram): to its core ATen opset (`torch_aten.py` maps it), except the ops
dnnc imports whole (hardswish as one HardSwish, not five ops)."""


class UnsupportedATenError(UnsupportedOpError):
    """ATen ops of an FX graph that dnnc does not import, every one at once: `ops` holds
    (overload, [node names]) pairs."""

    def __init__(self, ops: list[tuple[str, list[str]]]):
        self.ops = ops
        lines = [f"  {op}: nodes {', '.join(repr(n) for n in nodes[:5])}"
                 f"{f' and {len(nodes) - 5} more' if len(nodes) > 5 else ''}"
                 for op, nodes in ops]
        DNNCError.__init__(self, f"{len(ops)} ATen op(s) dnnc does not import:\n" +
                           "\n".join(lines))


_SYMPY_OPS = {"Mul": "Mul", "Add": "Add", "FloorDiv": "Div"}
"""Sympy's arithmetic in a SymInt's expression as dnnc's int64 ops (sizes are positive:
floor division is truncation)."""


CHECKS = {"aten._assert_scalar.default", "aten._assert_tensor_metadata.default",
          "aten.sym_constrain_range.default", "aten.sym_constrain_range_for_size.default"}
"""Ops torch.export leaves in a graph to check a size's range or a tensor's metadata at run
time: dnnc imports none (a call's inputs are checked against the graph's types)."""


def op_name(node: fx.Node) -> str:
    """The name a node's target is known by: "aten.convolution.default", "getitem", "mul"."""
    target = node.target
    return str(target) if isinstance(target, torch._ops.OpOverload) else \
        getattr(target, "__name__", str(target))


def supported(node: fx.Node, device: str | None = None) -> bool:
    """Whether dnnc imports this call_function node: a converter for its overload that takes
    these arguments, and dtypes dnnc has for every tensor it reads and writes, all on torch
    device type `device` (None: any; the graph dnnc builds has no device, its target has)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    converter = ATEN.get(op_name(node))
    if converter is None or not _dtypes_known(node, device):
        return False
    return converter.accepts is None or bool(converter.accepts(node))


def size_node(node: fx.Node) -> bool:
    """A call on sizes, not tensors (`aten.sym_size.int`, `s77 * 7` in a torch.export graph):
    imported as its value's expression over the inputs' dims (`FxImport.symbol`)."""
    return node.op == "call_function" and isinstance(node.meta.get("val"), torch.SymInt)


def _dtypes_known(node: fx.Node, device: str | None) -> bool:
    """Every tensor the node reads, and each of its outputs that something reads (a tuple's
    items through a getitem something reads: attention's RNG state may be uint64), has a dnnc
    dtype and lies on `device`."""
    out = node.meta.get("val")
    if isinstance(out, (tuple, list)):
        read = {u.args[1] for u in node.users if u.target is operator.getitem and u.users}
        whole = any(u.target is not operator.getitem for u in node.users)
        out = [t for i, t in enumerate(out) if whole or i in read]
    vals = [out] + [a.meta.get("val") for a in node.all_input_nodes]
    for val in vals:
        for t in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(t, torch.Tensor) and (np_dtype(t.dtype) is None or
                                                device not in (None, t.device.type)):
                return False
    return True


def _dim(d) -> T.Dim:
    """A fake tensor's dim as a dnnc dim: an int, or a symbol's name ("s77")."""
    if isinstance(d, int):
        return d
    expr = d.node.expr
    if expr.is_number:
        return int(expr)
    if not expr.is_Symbol:
        raise ShapeError(f"an input dim {expr} computed from others; dnnc takes a symbol "
                         f"or an int")
    return str(expr)


class FxImport(ImportContext):
    """One FX graph being imported: FX nodes to dnnc values, and the graph they build."""

    def __init__(self, name: str, folds: dict[fx.Node, Fold] | None = None):
        self.graph = Graph(name)
        self.env: dict[fx.Node, object] = {}
        # outer views of flattened products, imported as N-D MatMuls (`torch_matmul`)
        self.folds = folds or {}
        # each symbolic dim's first place in an input: (input value, axis)
        self.dims: dict[str, tuple[Value, int]] = {}
        self.consts = 0

    # -- what converters call -----------------------------------------------------------------

    def add(self, op: str, *inputs: Value | None, num_outputs: int = 1, **attrs):
        outs = self.graph.add_node(op, list(inputs), attrs, num_outputs=num_outputs)
        return outs if num_outputs > 1 else outs[0]

    def const(self, array, dtype=None) -> Value:
        array = np.asarray(array, dtype=dtype)
        self.consts += 1
        return constant_value(f"{self.graph.name}.const.{self.consts}", array)

    def value(self, arg):
        """An argument of an FX node as what converters read: a Value for a tensor or a
        SymInt node, else the Python value (ints, floats, lists, None) itself."""
        if isinstance(arg, fx.Node):
            return self.env[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.value(a) for a in arg)
        return arg

    def size_value(self, dim) -> Value:
        """A one-element int64 value holding `dim` (an int, a symbolic Value, a SymInt)."""
        if isinstance(dim, Value):
            return dim if dim.type.rank == 1 else self.add("Reshape", dim, self.const([1],
                                                                                 np.int64))
        return self.const([int(dim)], np.int64)

    def shape_value(self, dims) -> Value:
        """A 1-D int64 value of `dims` (ints and symbolic Values): a constant when all are
        ints, else a Concat the known-value propagation reads as a symbolic shape."""
        dims = list(dims)
        if all(not isinstance(d, Value) for d in dims):
            return self.const(np.array([int(d) for d in dims], np.int64).reshape(len(dims)))
        return self.add("Concat", *[self.size_value(d) for d in dims], axis=0)

    # -- the graph's edges --------------------------------------------------------------------

    def placeholder(self, node: fx.Node, frozen: np.ndarray | None) -> None:
        val = node.meta.get("val")
        if frozen is not None:
            self.env[node] = constant_value(node.name, frozen)
        elif isinstance(val, torch.Tensor):
            dtype = np_dtype(val.dtype)
            if dtype is None:
                raise UnsupportedTypeError(f"input {node.name}: dtype {val.dtype}")
            value = self.graph.add_input(node.name, T.TensorType(T.DType.from_numpy(dtype),
                                                                 tuple(_dim(d) for d in
                                                                       val.shape)))
            for axis, d in enumerate(value.type.shape):
                if isinstance(d, str):
                    self.dims.setdefault(d, (value, axis))
            self.env[node] = value
        elif isinstance(val, torch.SymInt):
            self.env[node] = val   # a shape read later, once every input is known
        else:
            raise UnsupportedTypeError(f"input {node.name}: a {type(val).__name__}, not a "
                                       f"tensor")

    def symbol(self, expr) -> Value:
        """A SymInt placeholder's sympy expression (`s77`, `4*s77`) as a one-element int64
        value, each symbol a Shape slice of an input that has it as a dim."""
        if expr.is_Integer:
            return self.const([int(expr)], np.int64)
        if expr.is_Symbol:
            if str(expr) not in self.dims:
                raise ShapeError(f"the size {expr} is no input's dim")
            value, axis = self.dims[str(expr)]
            return self.add("Shape", value, start=axis, end=axis + 1)
        op = _SYMPY_OPS.get(type(expr).__name__)
        if op is None:
            raise ShapeError(f"a size computed as {expr}")
        parts = [self.symbol(a) for a in expr.args]
        out = parts[0]
        for part in parts[1:]:
            out = self.add(op, out, part)
        return out

    def call(self, node: fx.Node) -> None:
        name = op_name(node)
        if node.target is operator.getitem:
            self.env[node] = self.env[node.args[0]][node.args[1]]
        elif size_node(node):
            self.env[node] = self.symbol(node.meta["val"].node.expr)
        elif node in self.folds:
            found = self.folds[node]
            out = self.add("MatMul", self.env[found.a], self.env[found.b])
            self.env[node] = out if found.bias is None else \
                self.add("Add", out, self.env[found.bias])
        else:
            self.env[node] = ATEN[name].convert(self, node)

    def output(self, node: fx.Node) -> None:
        seen = set()
        results = node.args[0]
        for arg in [results] if isinstance(results, fx.Node) else results:
            value = self.env[arg]
            if not isinstance(value, Value):
                raise UnsupportedTypeError(f"output {arg}: a {type(value).__name__}, not a "
                                           f"tensor")
            if value.is_const or value in self.graph.inputs or id(value) in seen:
                value = self.add("Identity", value)   # every output a node's own value
            seen.add(id(value))
            self.graph.outputs.append(value)


def import_fx(gm: fx.GraphModule, frozen: dict[int, np.ndarray] | None = None,
              name: str = "torch") -> Graph:
    """The dnnc Graph of `gm`, a GraphModule of core ATen ops whose placeholders carry fake
    tensors (`meta["val"]`); `frozen` maps placeholder positions to the arrays they are
    frozen to (constants of the graph, not inputs). Raises `UnsupportedOpError` naming every
    node no converter takes, a `DNNCError` where dnnc's op refuses the operands."""
    frozen = frozen or {}
    missing: dict[str, list[str]] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and not (supported(n) or size_node(n) or
                                            op_name(n) in CHECKS):
            missing.setdefault(op_name(n), []).append(n.name)
    if missing:
        raise UnsupportedATenError(list(missing.items()))
    folds = fold(gm)
    skipped = set().union(*(f.skipped for f in folds.values()))
    ctx = FxImport(name, folds)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        ctx.placeholder(node, frozen.get(i))
    for node in placeholders:
        if isinstance(ctx.env[node], torch.SymInt):
            ctx.env[node] = ctx.symbol(ctx.env[node].node.expr)
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            ctx.env[node] = constant_value(node.name, tensor_array(getattr(gm, node.target)))
        elif node.op == "call_function":
            if op_name(node) in CHECKS or node in skipped:
                continue
            try:
                ctx.call(node)
            except DNNCError as exc:
                raise type(exc)(f"{node.name} ({op_name(node)}): {exc}") from None
        elif node.op == "output":
            ctx.output(node)
        elif node.op != "placeholder":
            raise UnsupportedATenError([(node.op, [node.name])])
    return ctx.graph


def tensor_array(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's data as a NumPy array without copying (bfloat16 through ml_dtypes); a
    tensor on a device is copied to the host (weights frozen at compile time)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(T.bfloat16.np)
    return t.numpy()
