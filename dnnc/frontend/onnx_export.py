"""Graph -> ONNX: `dnnc.export_onnx(graph, path)`, the reverse of the importer.

dnnc's registered ops follow the newest ONNX forms (axes, pads, sizes as inputs), so a node of
an op whose name is an ONNX op of the target opset is written as that op, inputs unchanged;
constants become initializers. An attribute the ONNX schema does not know (dnnc's own, such as
Softmax's `coerce_2d`) is dropped when it holds dnnc's default and refused otherwise. Internal
ops (MatMulPacked, ConvPacked, ... that passes create) have no ONNX form: export a graph before
passes (a traced or imported one), or get an `ExportError` listing every such op at once.
This module never evaluates a graph and never imports a backend.
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ExportError
from ..ir import types as T
from ..ir.graph import Graph, Value
from ..ir.ops.registry import REQUIRED, get_op
from .onnx import ONNX_FROM_DTYPE

DEFAULT_OPSET = 21
"""Opset written by default: Reduce* axes and Split num_outputs as dnnc has them need >= 18;
21 is the newest that onnxruntime releases since 1.18 (2024) all run."""


def export_onnx(graph: Graph, path=None, *, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """Write `graph` (traced or imported, before passes) as an ONNX model to `path` (if given)
    and return the ModelProto. Raises ExportError listing every op that cannot be exported."""
    model = to_onnx(graph, opset)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


def to_onnx(graph: Graph, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    _check_exportable(graph, opset)
    names = _Names()
    inputs = [_value_info(names.of(v), v) for v in graph.inputs]
    initializers = [numpy_helper.from_array(np.asarray(c.const), names.of(c))
                    for c in graph.constants()]
    nodes = []
    for node in graph.nodes:
        attrs = _attributes(node, opset)
        nodes.append(helper.make_node(
            node.op, ["" if v is None else names.of(v) for v in node.inputs],
            [names.of(v) for v in node.outputs], name=node.name, **attrs))
    outputs = [_value_info(names.of(v), v) for v in graph.outputs]
    proto = helper.make_graph(nodes, graph.name, inputs, outputs, initializers)
    model = helper.make_model(proto, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="dnnc")
    onnx.checker.check_model(model)
    return model


def _check_exportable(graph: Graph, opset: int) -> None:
    """Every op must be an ONNX op at `opset` and hold no subgraph; list all faults at once."""
    missing: dict[str, list[str]] = defaultdict(list)
    for node in graph.nodes:
        if node.subgraphs():
            missing[f"{node.op} (with a subgraph; not exported yet)"].append(node.name)
        elif not _has_schema(node.op, opset):
            missing[node.op].append(node.name)
    if missing:
        lines = [f"  {op}: nodes {', '.join(repr(n) for n in nodes[:5])}"
                 f"{f' and {len(nodes) - 5} more' if len(nodes) > 5 else ''}"
                 for op, nodes in sorted(missing.items())]
        raise ExportError(f"{len(missing)} op(s) have no ONNX form at opset {opset} (internal "
                          f"ops come from passes: export the graph before compiling):\n"
                          + "\n".join(lines))


def _has_schema(op: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op, opset, "")
        return True
    except onnx.defs.SchemaError:
        return False


def _attributes(node, opset: int) -> dict:
    schema = onnx.defs.get_schema(node.op, opset, "")
    defaults = get_op(node.op).attrs
    out = {}
    for key, value in node.attrs.items():
        if value is None:
            continue
        if key not in schema.attributes:
            if defaults.get(key, REQUIRED) is not REQUIRED and _same(value, defaults[key]):
                continue  # dnnc's own attribute at its default: ONNX's meaning
            raise ExportError(f"{node.op} node {node.name!r}: attribute {key}={value!r} has "
                              f"no ONNX form at opset {opset}")
        out[key] = _attribute_value(value, node, key)
    return out


def _same(a, b) -> bool:
    try:
        return bool(np.all(np.asarray(a) == np.asarray(b))) and type(a) is type(b)
    except Exception:
        return False


def _attribute_value(value, node, key):
    if isinstance(value, T.DType):
        return ONNX_FROM_DTYPE[value.name]
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(value, f"{node.name}.{key}")
    if isinstance(value, (list, tuple)):
        return [int(v) if isinstance(v, (bool, np.integer)) else v for v in value]
    if isinstance(value, (bool, np.integer)):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _value_info(name: str, v: Value) -> onnx.ValueInfoProto:
    shape = [d if isinstance(d, int) else str(d) for d in v.type.shape]
    return helper.make_tensor_value_info(name, ONNX_FROM_DTYPE[v.type.dtype.name], shape)


class _Names:
    """A unique ONNX name per Value (dnnc names are unique in practice; this makes sure)."""

    def __init__(self):
        self.by_id: dict[int, str] = {}
        self.used: set[str] = set()

    def of(self, v: Value) -> str:
        name = self.by_id.get(id(v))
        if name is None:
            name, k = v.name, 1
            while name in self.used or not name:
                name, k = f"{v.name}_{k}", k + 1
            self.used.add(name)
            self.by_id[id(v)] = name
        return name
