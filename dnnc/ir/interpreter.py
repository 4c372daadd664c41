"""Runs a graph node by node with the registry's NumPy references: the oracle of every target.

Each output is checked against its inferred type (dtype exactly, shape with symbolic dims bound
consistently), so a wrong `infer` or `evaluate` shows up at the node that has it. Control-flow
ops run their subgraphs through `run_subgraph`, which sees the enclosing graphs' values.
"""

from __future__ import annotations

import contextvars
from collections import ChainMap

import numpy as np

from ..errors import DNNCError, IndexRangeError, InputError
from .graph import Graph, Node, Value
from .ops.registry import get_op
from .types import TensorType, _parse, shape_text

_ENV: contextvars.ContextVar[ChainMap | None] = contextvars.ContextVar("dnnc_env", default=None)


class EvaluationError(DNNCError):
    """A node's reference failed or disagreed with its inferred type; names the node."""

    def __init__(self, node: Node, message: str):
        self.node = node
        super().__init__(f"{node.op} node {node.name!r}: {message}")


def run_graph(graph: Graph, inputs: list[np.ndarray],
              bindings: dict[str, int] | None = None,
              observe=None) -> list[np.ndarray]:
    """Evaluate `graph` on `inputs`; `observe(node, outputs)` sees every node's results."""
    outer = _ENV.get()
    env: ChainMap = ChainMap({}) if outer is None else outer.new_child()
    bindings = {} if bindings is None else bindings
    for value, array in zip(graph.inputs, inputs):
        env[id(value)] = array
    token = _ENV.set(env)
    try:
        for node in graph.nodes:
            args = [None if v is None else _read(env, v) for v in node.inputs]
            outs = _evaluate(node, args)
            for value, array in zip(node.outputs, outs):
                _check(node, value, array, bindings)
                env[id(value)] = array
            if observe is not None:
                observe(node, outs)
        return [_read(env, v) for v in graph.outputs]
    finally:
        _ENV.reset(token)


def run_node(node: Node, args: list, env: dict[int, np.ndarray]) -> list[np.ndarray]:
    """Evaluate one node outside `run_graph` (a compiled model's host fallback); `env` maps
    value ids to arrays, for the subgraphs of control-flow ops to read."""
    token = _ENV.set(ChainMap(env))
    try:
        outs = _evaluate(node, args)
        bindings: dict[str, int] = {}
        for value, array in zip(node.outputs, outs):
            if value.type.is_static:
                _check(node, value, array, bindings)
        return outs
    finally:
        _ENV.reset(token)


def run_subgraph(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the body of a control-flow op (called from its `evaluate`)."""
    return run_graph(graph, inputs)


def _read(env: ChainMap, value: Value) -> np.ndarray:
    if value.const is not None:
        return value.const
    try:
        return env[id(value)]
    except KeyError:
        raise RuntimeError(f"value {value.name!r} read before it was computed") from None


def _evaluate(node: Node, args: list) -> list[np.ndarray]:
    op = get_op(node.op)
    try:
        with np.errstate(all="ignore"):
            outs = op.run(args, node.attrs)
    except DNNCError:
        raise
    except IndexRangeError as exc:   # the caller's data indexes out of range (onnxruntime too)
        raise InputError(f"{node.op} node {node.name!r}: {exc}") from exc
    except Exception as exc:
        raise EvaluationError(node, f"reference failed: {type(exc).__name__}: {exc}") from exc
    if len(outs) < len(node.outputs):
        raise EvaluationError(node, f"reference gave {len(outs)} outputs, "
                                    f"{len(node.outputs)} expected")
    return [np.asarray(o) for o in outs[:len(node.outputs)]]


def _check(node: Node, value: Value, array: np.ndarray, bindings: dict[str, int]) -> None:
    problem = shape_mismatch(value.type, array, bindings)
    if problem:
        raise EvaluationError(node, f"output {value.name!r}: {problem}")


def shape_mismatch(expected: TensorType, array: np.ndarray,
                   bindings: dict[str, int]) -> str | None:
    """Why `array` does not fit `expected` (binding new symbols as it goes), or None."""
    if array.dtype != expected.dtype.np:
        return f"dtype {array.dtype} where {expected.dtype.name} was inferred"
    if array.ndim != expected.rank:
        return f"shape {shape_text(array.shape)} where {expected} was inferred"
    for want, got in zip(expected.shape, array.shape):
        if isinstance(want, int):
            if want != got:
                return f"shape {shape_text(array.shape)} where {expected} was inferred"
            continue
        parsed = _parse(want)
        if parsed is None:
            continue  # an opaque symbolic expression: nothing to check it against
        coef, names = parsed
        if len(names) == 1 and coef == 1:
            if bindings.setdefault(want, got) != got:
                return (f"shape {shape_text(array.shape)}: symbolic dim {want!r} is "
                        f"{bindings[want]} elsewhere")
        elif all(n in bindings for n in names):
            size = coef
            for n in names:
                size *= bindings[n]
            if size != got:
                return f"shape {shape_text(array.shape)} where {expected} was inferred"
    return None
