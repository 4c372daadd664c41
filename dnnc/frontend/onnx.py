"""ONNX -> Graph: loading, the importer registry, and graph construction.

Importers are registered explicitly per ONNX op and the opset it changed in
(`@onnx_op("Clip", since=11)`; an op of another domain names it: `@onnx_op("QGemm",
domain=MICROSOFT)`), in `frontend/onnx_ops/<family>.py`; an importer translates one
ONNX node into registered dnnc ops (older opsets' attributes that became inputs turn into
constants). Before building anything, every node (subgraphs included) is checked for an importer
and against its importer's refusals (`onnx_op(..., refuses=)`: attribute values or
non-constant inputs it cannot translate), so one `UnsupportedOpError` lists all unsupported
ops and nodes at once.
This module never evaluates a graph and never imports a backend.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Callable, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .. import errors
from ..errors import ModelFormatError, UnsupportedOpError, UnsupportedTypeError
from ..ir import types as T
from ..ir.graph import Graph, Value

DEFAULT_DOMAINS = ("", "ai.onnx")
MICROSOFT = "com.microsoft"
"""onnxruntime's contrib ops' domain (its quantizer writes some: QGemm, QLinearAdd, ...)."""

DTYPE_FROM_ONNX: dict[int, T.DType] = {
    TensorProto.BOOL: T.bool_, TensorProto.INT8: T.int8, TensorProto.INT16: T.int16,
    TensorProto.INT32: T.int32, TensorProto.INT64: T.int64, TensorProto.UINT8: T.uint8,
    TensorProto.UINT16: T.uint16, TensorProto.UINT32: T.uint32, TensorProto.UINT64: T.uint64,
    TensorProto.FLOAT16: T.float16, TensorProto.BFLOAT16: T.bfloat16,
    TensorProto.FLOAT: T.float32, TensorProto.DOUBLE: T.float64,
}
ONNX_FROM_DTYPE = {d.name: code for code, d in DTYPE_FROM_ONNX.items()}
NARROW_FROM_ONNX: dict[int, T.DType] = {TensorProto.INT4: T.int8, TensorProto.UINT4: T.uint8}
"""ONNX's 4-bit integer types as dnnc holds them: one value a byte, in the 8-bit type of their
signedness, every value within [-8, 7] / [0, 15]. The ops that read them (the
integer products, DequantizeLinear, moves) need nothing else: a 4-bit value is an 8-bit one.
Where the range itself matters (QuantizeLinear's saturation, Cast's wrap-around), the importer
reads the ONNX type of its operands from `_GraphBuilder.narrow`."""
NARROW_THROUGH = frozenset({"Identity", "Reshape", "Transpose", "Flatten", "Squeeze",
                            "Unsqueeze", "Pad"})
"""The ONNX ops that take a 4-bit tensor and give its values back (of input 0's type)."""


def dtype_from_onnx(code: int, where: str = "", narrow: bool = False) -> T.DType:
    """dnnc's dtype of ONNX element type `code`; `narrow`: also of a 4-bit one (as held:
    `NARROW_FROM_ONNX`), where the caller keeps its range."""
    if narrow and code in NARROW_FROM_ONNX:
        return NARROW_FROM_ONNX[code]
    try:
        return DTYPE_FROM_ONNX[code]
    except KeyError:
        name = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() \
            else str(code)
        raise UnsupportedTypeError(f"element type {name} is not supported"
                                   f"{' (' + where + ')' if where else ''}") from None


def tensor_to_array(tensor: TensorProto, where: str = "") -> np.ndarray:
    """The tensor's values (a 4-bit one's unpacked and sign-extended: `NARROW_FROM_ONNX`)."""
    dtype = dtype_from_onnx(tensor.data_type, where or tensor.name, narrow=True)
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as exc:
        raise ModelFormatError(f"tensor {tensor.name!r}{' in ' + where if where else ''} "
                               f"cannot be read: {exc}") from exc
    return np.require(array.astype(dtype.np, copy=False), requirements="C")  # keeps 0-d


# ---------------------------------------------------------------------------------------------
# Importer registry

Importer = Callable[["ImportContext"], "list[Value] | Value"]
Refusal = Callable[[onnx.NodeProto, "dict[str, TensorProto | None]"], "str | None"]
"""Given an ONNX node and the constants it may read (initializer and Constant outputs by
name, the tensor where one is at hand), why dnnc cannot run it (attribute values, inputs that
must be constant), or None where it can."""


class _Entry(NamedTuple):
    since: int
    importer: Importer
    refuses: Refusal | None


_IMPORTERS: dict[tuple[str, str], list[_Entry]] = defaultdict(list)


def onnx_op(op_type: str, since: int = 1, domain: str = "", refuses: Refusal | None = None):
    """Register an importer for `op_type` of `domain` ("": the default one) at its opset
    versions >= `since` (until a newer one). `refuses`: the nodes of this op it cannot
    translate, reported with the unsupported ops before anything is built."""

    def register(fn: Importer) -> Importer:
        _IMPORTERS[domain, op_type].append(_Entry(since, fn, refuses))
        _IMPORTERS[domain, op_type].sort(key=lambda entry: entry.since)
        return fn

    return register


def direct(op_type: str, since: int = 1, op: str | None = None, domain: str = "") -> None:
    """Import `op_type` as the dnnc op of the same meaning, inputs and attributes unchanged."""
    target = op or op_type

    def importer(ctx: "ImportContext"):
        return ctx.emit(target, ctx.inputs, ctx.attrs)

    onnx_op(op_type, since, domain)(importer)


def find_importer(op_type: str, opset: int, domain: str = "") -> Importer | None:
    entry = _find_entry(op_type, opset, domain)
    return entry.importer if entry else None


def _find_entry(op_type: str, opset: int, domain: str) -> _Entry | None:
    _load_importers()
    best = None
    for entry in _IMPORTERS.get((domain, op_type), ()):
        if entry.since <= opset:
            best = entry
    return best


def _load_importers() -> None:
    from . import onnx_ops  # noqa: F401  (importing registers every family's importers)


# ---------------------------------------------------------------------------------------------
# Import context handed to importers


class ImportContext:
    """One ONNX node being translated: its inputs as Values, attributes, opset, and emitters."""

    def __init__(self, builder: "_GraphBuilder", graph: Graph, node: onnx.NodeProto,
                 name: str, inputs: list[Value | None], opset: int):
        self.builder = builder
        self.graph = graph
        self.node = node
        self.name = name
        self.op_type = node.op_type
        self.opset = opset
        self.inputs = inputs
        self.num_outputs = len(node.output)
        self.attrs = {a.name: _attribute_value(a, name) for a in node.attribute}
        self.output_narrow: int | None = None   # the 4-bit ONNX type of its outputs, if one
        self._emitted = 0

    def emit(self, op: str, inputs: list[Value | None], attrs: dict | None = None,
             num_outputs: int | None = None) -> list[Value]:
        """Add a dnnc node named after this ONNX node; returns its outputs."""
        name = self.name if self._emitted == 0 else f"{self.name}/{self._emitted}"
        self._emitted += 1
        return self.graph.add_node(op, list(inputs), attrs or {}, name=name,
                                   num_outputs=num_outputs or self.num_outputs)

    def add(self, op: str, *inputs: Value | None, **attrs) -> Value:
        """Add a single-output helper node (for multi-node translations)."""
        return self.emit(op, list(inputs), attrs, num_outputs=1)[0]

    def const(self, array, dtype: T.DType | None = None) -> Value:
        array = np.asarray(array, dtype=None if dtype is None else dtype.np)
        return constant_value(self.graph.fresh_name(f"{self.name}.const"), array)

    def value(self, i: int) -> np.ndarray | None:
        """Input i's array when it is a compile-time constant."""
        if i < len(self.inputs) and self.inputs[i] is not None:
            return self.inputs[i].const
        return None

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def narrow(self, i: int) -> int | None:
        """Input i's ONNX type where it is a 4-bit one (`NARROW_FROM_ONNX`), else None."""
        names = self.node.input
        return self.builder.narrow.get(names[i]) if i < len(names) and names[i] else None

    def subgraph(self, attr: str, input_types: list[T.TensorType] | None = None) -> Graph:
        """Import the GraphProto attribute `attr`; it may read this graph's values."""
        proto = self.attrs[attr]
        return self.builder.build(proto, outer=True, input_types=input_types,
                                  name=f"{self.name}.{attr}")

    def fail(self, message: str) -> errors.DNNCError:
        return ModelFormatError(f"{self.op_type} node {self.name!r}: {message}")


def constant_value(name: str, array: np.ndarray) -> Value:
    array = np.require(array, requirements="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    try:
        dtype = T.DType.from_numpy(array.dtype)
    except TypeError:
        raise UnsupportedTypeError(f"constant {name!r} has unsupported dtype "
                                   f"{array.dtype}") from None
    return Value(name, T.TensorType(dtype, array.shape), const=array)


def _attribute_value(attr: onnx.AttributeProto, node_name: str):
    A = onnx.AttributeProto
    if attr.ref_attr_name:
        raise ModelFormatError(f"node {node_name!r}: attribute references are only valid "
                               f"inside functions")
    if attr.type == A.FLOAT:
        return float(attr.f)
    if attr.type == A.INT:
        return int(attr.i)
    if attr.type == A.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if attr.type == A.TENSOR:
        return tensor_to_array(attr.t, f"attribute {attr.name} of node {node_name!r}")
    if attr.type == A.GRAPH:
        return attr.g
    if attr.type == A.FLOATS:
        return [float(x) for x in attr.floats]
    if attr.type == A.INTS:
        return [int(x) for x in attr.ints]
    if attr.type == A.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if attr.type == A.TENSORS:
        return [tensor_to_array(t, node_name) for t in attr.tensors]
    if attr.type == A.GRAPHS:
        return list(attr.graphs)
    if attr.type == A.SPARSE_TENSOR:
        return numpy_helper.to_array(attr.sparse_tensor)
    if attr.type == A.TYPE_PROTO:
        return attr.tp
    raise ModelFormatError(f"node {node_name!r}: attribute {attr.name!r} has unknown type "
                           f"{attr.type}")


# ---------------------------------------------------------------------------------------------
# Loading


def load_model_proto(src) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto (external data loaded beside the file)."""
    if isinstance(src, onnx.ModelProto):
        return src
    try:
        if isinstance(src, (bytes, bytearray, memoryview)):
            return onnx.load_from_string(bytes(src))
        path = os.fspath(src)
        if not os.path.exists(path):
            raise ModelFormatError(f"model file {path!r} does not exist")
        return onnx.load(path, load_external_data=True)
    except ModelFormatError:
        raise
    except Exception as exc:  # protobuf DecodeError, missing external data, ...
        raise ModelFormatError(f"cannot read the ONNX model ({type(exc).__name__}: {exc}); "
                               f"the file may be truncated or not an ONNX model") from exc


def opset_of(model: onnx.ModelProto) -> dict[str, int]:
    opsets = {}
    for entry in model.opset_import:
        opsets["" if entry.domain == "ai.onnx" else entry.domain] = entry.version
    if "" not in opsets:
        opsets[""] = 1 if model.ir_version < 3 else onnx.defs.onnx_opset_version()
    return opsets


def find_unsupported(model: onnx.ModelProto) -> list[tuple[str, str, int, list[str]]]:
    """Every (op, domain, opset, node names) without an importer, subgraphs included, and
    the nodes their importer refuses (the reason beside the node's name)."""
    opsets = opset_of(model)
    local_functions = {(f.domain, f.name) for f in model.functions}
    missing: dict[tuple[str, str], list[str]] = defaultdict(list)

    def scan(graph: onnx.GraphProto, outer: dict[str, TensorProto | None]):
        inner = {vi.name for vi in graph.input}   # (a subgraph's inputs hide outer names)
        constants = {name: t for name, t in outer.items() if name not in inner}
        constants.update({t.name: t for t in graph.initializer})
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
                value = [a.t for a in node.attribute if a.name == "value"]
                constants[node.output[0]] = value[0] if value else None
        for i, node in enumerate(graph.node):
            domain = "" if node.domain == "ai.onnx" else node.domain
            name = node.name or f"{node.op_type}_{i}"
            entry = _find_entry(node.op_type, opsets.get(domain, 1), domain)
            if (node.domain, node.op_type) in local_functions:
                missing[(node.op_type, domain)].append(name + " (model-local function)")
            elif entry is None:
                missing[(node.op_type, domain)].append(name)
            elif entry.refuses is not None and (reason := entry.refuses(node, constants)):
                missing[(node.op_type, domain)].append(f"{name} ({reason})")
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    scan(attr.g, constants)
                for g in attr.graphs:
                    scan(g, constants)

    scan(model.graph, {})
    return [(op, dom, opsets.get(dom, 1), names) for (op, dom), names in sorted(missing.items())]


NEWEST_OPSET = 28
"""The newest default-domain opset whose op changes the importers follow (onnx 1.23's); a
newer one may change what an op means, so it is refused, as onnxruntime refuses it. Older
opsets are checked per op: an op without an importer at the model's opset is unsupported."""


def check_opset(model: onnx.ModelProto) -> None:
    opset = opset_of(model)[""]
    if opset > NEWEST_OPSET:
        raise errors.UnsupportedOpsetError(
            f"the model imports ONNX opset {opset}; dnnc supports opsets up to {NEWEST_OPSET} "
            f"(7 to {NEWEST_OPSET} in full, older ones op by op)")


def shape_option(name: str, as_option: bool) -> str:
    """How the user gives input `name` a shape: from Python or on the command line."""
    return f"--input-shape {name}=D0,D1,..." if as_option else \
        f"input_shapes={{{name!r}: (...)}}"


def check_input_shapes(model: onnx.ModelProto, input_shapes, as_option: bool = False) -> None:
    """`input_shapes` maps inputs of the model to shapes of its rank, whose dims are sizes
    (ints >= 0) or symbolic names and agree with the dims the model fixes. `as_option`:
    mistakes are named as the command line's --input-shape."""
    option = "--input-shape" if as_option else "input_shapes"
    if not isinstance(input_shapes, dict):
        raise errors.ArgumentError(f"input_shapes must be a dict of input name -> shape, not "
                                   f"{type(input_shapes).__name__}")
    initializers = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in initializers}
    for name, shape in input_shapes.items():
        where = f"--input-shape {name}" if as_option else f"input_shapes[{name!r}]"
        if name not in inputs:
            raise errors.ArgumentError(f"{option} names {name!r}, but the model's inputs "
                                       f"are {', '.join(inputs) or '(none)'}")
        if not isinstance(shape, (tuple, list)) or not all(
                isinstance(d, str) and d.isidentifier()
                or isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
                for d in shape):
            raise errors.ArgumentError(f"{where} must be a tuple of sizes (ints >= 0) and "
                                       f"symbolic dim names, not {shape!r}")
        tt = inputs[name].type.tensor_type
        if not tt.HasField("shape"):
            continue
        declared = tt.shape.dim
        if len(declared) != len(shape):
            given = f"{where}={','.join(map(str, shape))}" if as_option else \
                f"{where} = {tuple(shape)}"
            raise errors.ArgumentError(f"{given} has rank {len(shape)}; the model's input "
                                       f"{name!r} has rank {len(declared)}")
        for k, (d, given) in enumerate(zip(declared, shape)):
            if d.HasField("dim_value") and d.dim_value != given:
                raise errors.ArgumentError(f"{where}: dim {k} is fixed to {d.dim_value} by "
                                           f"the model, not {given}")


def import_onnx(src, input_shapes: dict[str, tuple] | None = None,
                as_option: bool = False) -> Graph:
    """Translate an ONNX model (path, bytes or ModelProto) into a typed Graph. `as_option`:
    shape mistakes and missing shapes are named as the command line's --input-shape."""
    model = load_model_proto(src)
    if not model.HasField("graph"):
        raise ModelFormatError("the model has no graph; the file may be truncated")
    check_opset(model)
    if input_shapes is not None:
        check_input_shapes(model, input_shapes, as_option)
    unsupported = find_unsupported(model)
    if unsupported:
        raise UnsupportedOpError(unsupported)
    builder = _GraphBuilder(opset_of(model), input_shapes or {}, as_option)
    graph = builder.build(model.graph)
    graph.name = model.graph.name or "main"
    return graph


class _GraphBuilder:
    def __init__(self, opsets: dict[str, int], input_shapes: dict[str, tuple],
                 as_option: bool = False):
        self.opsets = opsets   # domain ("": the default one) -> its opset
        self.opset = opsets[""]
        self.input_shapes = input_shapes
        self.as_option = as_option
        self.scopes: list[dict[str, Value]] = []
        self.symbols: set[str] = set()   # symbolic dim names handed out
        self.dim_params: dict[str, str] = {}   # ONNX dim_param -> its symbol
        self.narrow: dict[str, int] = {}   # ONNX value name -> its 4-bit type, where it has one
        self.declared: dict[str, int] = {}   # names value_info or outputs declare 4-bit

    def lookup(self, name: str) -> Value | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def build(self, proto: onnx.GraphProto, outer: bool = False,
              input_types: list[T.TensorType] | None = None, name: str = "main") -> Graph:
        graph = Graph(name)
        scope: dict[str, Value] = {}
        self.scopes.append(scope)
        try:
            _check_single_assignment(proto)
            for vi in proto.input:   # dim_params first: they keep their names if they can
                for d in vi.type.tensor_type.shape.dim:
                    if d.dim_param and d.dim_param not in self.dim_params:
                        self.dim_params[d.dim_param] = self._fresh_symbol(_symbol(d.dim_param))
            initializers = {t.name for t in proto.initializer}
            for vi in list(proto.value_info) + list(proto.output):
                if vi.type.tensor_type.elem_type in NARROW_FROM_ONNX:
                    self.declared[vi.name] = vi.type.tensor_type.elem_type
            for t in proto.initializer:
                scope[t.name] = constant_value(t.name, tensor_to_array(t, "initializer"))
                if t.data_type in NARROW_FROM_ONNX:
                    self.narrow[t.name] = t.data_type
            for sp in proto.sparse_initializer:
                array = numpy_helper.to_array(sp)
                scope[sp.values.name] = constant_value(sp.values.name, array)
            real_inputs = [vi for vi in proto.input if vi.name not in initializers]
            for k, vi in enumerate(real_inputs):
                given = input_types[k] if input_types and k < len(input_types) else None
                scope[vi.name] = graph.add_input(vi.name, given or self._input_type(vi, outer))
                if vi.type.tensor_type.elem_type in NARROW_FROM_ONNX:
                    self.narrow[vi.name] = vi.type.tensor_type.elem_type
            for i, node in enumerate(_sorted_nodes(proto, scope, self)):
                self._import_node(graph, scope, node, i)
            for vi in proto.output:
                value = self.lookup(vi.name)
                if value is None:
                    raise ModelFormatError(f"graph output {vi.name!r} is never produced; "
                                           f"the model may be truncated")
                graph.outputs.append(value)
        finally:
            self.scopes.pop()
        return graph

    def _input_type(self, vi: onnx.ValueInfoProto, outer: bool) -> T.TensorType:
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise UnsupportedTypeError(f"input {vi.name!r} is a {kind}; only tensors are "
                                       f"supported")
        tt = vi.type.tensor_type
        dtype = dtype_from_onnx(tt.elem_type, f"input {vi.name!r}", narrow=True)
        if vi.name in self.input_shapes and not outer:
            return T.TensorType(dtype, tuple(d if isinstance(d, str) else int(d)
                                             for d in self.input_shapes[vi.name]))
        if not tt.HasField("shape"):
            if outer:  # subgraph inputs without shapes (Loop bodies): the importer gives types
                return T.TensorType(dtype, ())
            raise ModelFormatError(f"input {vi.name!r} has no shape; give one with "
                                   f"{shape_option(vi.name, self.as_option)}")
        dims = []
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(self.dim_params[d.dim_param])
            else:
                dims.append(self._fresh_symbol(f"{_symbol(vi.name)}_{k}"))
        return T.TensorType(dtype, tuple(dims))

    def _fresh_symbol(self, base: str) -> str:
        """`base`, or `base_2`, `base_3`, ... where taken: a symbolic dim is one size, so
        names that sanitise alike (dim_params `n.1` and `n_1`, the unnamed dims of inputs
        `a.b` and `a_b`) must not share one."""
        name, n = base, 1
        while name in self.symbols:
            n += 1
            name = f"{base}_{n}"
        self.symbols.add(name)
        return name

    def _import_node(self, graph: Graph, scope: dict, node: onnx.NodeProto, index: int):
        name = node.name or f"{node.op_type}_{index}"
        inputs = []
        for input_name in node.input:
            if input_name == "":
                inputs.append(None)
                continue
            value = self.lookup(input_name)
            if value is None:
                raise ModelFormatError(f"{node.op_type} node {name!r} reads {input_name!r}, "
                                       f"which no node, input or initializer defines")
            inputs.append(value)
        ctx = ImportContext(self, graph, node, name, inputs, self.opset)
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        importer = find_importer(node.op_type, self.opsets.get(domain, 1), domain)
        first_new = len(graph.nodes)
        try:
            result = importer(ctx)
        except errors.DNNCError:
            raise
        except Exception as exc:
            raise errors.CompileError(f"{node.op_type} node {name!r}: import failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
        outputs = [result] if isinstance(result, Value) else list(result)
        new_nodes = {id(n) for n in graph.nodes[first_new:]}
        narrow = _narrow_output(ctx)
        for out_name, value in zip(node.output, outputs):
            if out_name == "":
                continue
            if narrow or out_name in self.declared:
                self.narrow[out_name] = narrow or self.declared[out_name]
            if value.producer is not None and id(value.producer) in new_nodes or \
                    value.is_const and value.name.startswith(f"{name}.const"):
                value.name = out_name  # a value this node created takes its ONNX name
            scope[out_name] = value


def _narrow_output(ctx: ImportContext) -> int | None:
    """The 4-bit ONNX type of an imported node's outputs, where they have one: as its importer
    says (QuantizeLinear, Cast), a constant's, or a 4-bit input's through `NARROW_THROUGH`."""
    if ctx.output_narrow is not None:
        return ctx.output_narrow
    if ctx.op_type in ("Constant", "ConstantOfShape"):
        value = [a.t for a in ctx.node.attribute if a.name == "value"]
        return value[0].data_type if value and value[0].data_type in NARROW_FROM_ONNX else None
    return ctx.narrow(0) if ctx.op_type in NARROW_THROUGH else None


def _check_single_assignment(proto: onnx.GraphProto) -> None:
    """Refuse a graph that assigns a value name twice (ONNX graphs are SSA): a node writing
    one of its own inputs, two nodes (or one node twice) writing one name, or a node writing
    a graph input's or an initializer's name. The later write would otherwise silently
    shadow the earlier value for some readers and not others."""
    defined = {vi.name: f"graph input {vi.name!r}" for vi in proto.input}
    defined.update({t.name: f"initializer {t.name!r}" for t in proto.initializer})
    for i, node in enumerate(proto.node):
        label = f"{node.op_type} node {node.name or f'{node.op_type}_{i}'!r}"
        for out in node.output:
            if not out:
                continue
            if out in node.input:
                raise ModelFormatError(f"{label} writes {out!r}, which it also reads; a value "
                                       f"is assigned once (SSA)")
            if out in defined:
                raise ModelFormatError(f"{label} writes {out!r}, already defined by "
                                       f"{defined[out]}; a value is assigned once (SSA)")
            defined[out] = label


def _symbol(name: str) -> str:
    """A dim_param as a symbolic dim name (no characters that the dim arithmetic reads)."""
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"d_{cleaned}"


def _sorted_nodes(proto: onnx.GraphProto, scope: dict, builder: _GraphBuilder):
    """Nodes in a valid order: as written when it is valid (the usual case), else sorted."""
    nodes = list(proto.node)
    available = set(scope) | {n for s in builder.scopes for n in s} | {""}
    ok = True
    for node in nodes:
        if any(i not in available for i in node.input):
            ok = False
            break
        available.update(node.output)
    if ok:
        return nodes
    producers = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    order, state = [], {}   # state: 1 while a node's producers are being placed, 2 placed
    for root in range(len(nodes)):
        # depth-first with an explicit stack: a chain of thousands of nodes written in
        # reverse would exceed Python's recursion limit
        stack = [(root, False)]
        while stack:
            i, expanded = stack.pop()
            if expanded:
                state[i] = 2
                order.append(nodes[i])
                continue
            if state.get(i) == 2:
                continue
            if state.get(i) == 1:
                raise ModelFormatError(f"the graph has a cycle through node {nodes[i].name!r}")
            state[i] = 1
            stack.append((i, True))
            for name in reversed(nodes[i].input):
                p = producers.get(name)
                if p is not None and state.get(p) != 2:
                    stack.append((p, False))
    return order
