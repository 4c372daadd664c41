"""Control-flow ops: If, Loop and Scan, whose bodies are `Graph`s held in node attributes.

A body may read values of the graphs around it; the interpreter's `run_subgraph` runs it with
those values in scope. Sizes known only at run time (a Loop's trip count, a dim on which If's
branches disagree) get symbolic dims named after the node, so that inferring a node twice (as
`Graph.verify` does) gives the same types. Loop-carried and Scan state types are the body's input
types, which the importer has already widened to cover every iteration.
This module holds op meanings only; it never reads ONNX.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..graph import Graph
from ..compute import NoCompute
from ..types import TensorType
from .infer import check_dtype, normalize_axis
from .registry import REQUIRED, Pattern, register_op


def run_body(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    from ..interpreter import run_subgraph  # the interpreter imports the registry

    return run_subgraph(graph, inputs)


def node_dim(node_name: str, tag: str) -> str:
    """A symbolic dim named after a node, stable across re-inference."""
    clean = "".join(c if c.isalnum() or c == "_" else "_" for c in node_name)
    if not clean or clean[0].isdigit():
        clean = "n_" + clean
    return f"{clean}_{tag}"


def merge_types(a: TensorType, b: TensorType, fresh) -> TensorType | None:
    """One type covering a and b: their dtype, and `fresh(axis)` where their dims differ.

    None when they cannot be merged (different dtypes or ranks).
    """
    if a.dtype is not b.dtype or a.rank != b.rank:
        return None
    return a.with_shape(x if x == y else fresh(i) for i, (x, y) in enumerate(zip(a.shape, b.shape)))


def _check_body(ctx, what: str) -> Graph:
    body = ctx.attrs[what]
    if not isinstance(body, Graph):
        raise ctx.fail(f"attribute {what!r} must be a graph, given {type(body).__name__}")
    return body


def _empty_stack(t: TensorType, name: str) -> np.ndarray:
    """The zero-length stack of a scan output (its element shape must be static)."""
    if not t.is_static:
        raise ValueError(f"the body ran no iteration, so scan output {name!r} of type {t} has "
                         f"no known element shape")
    return np.zeros((0, *t.shape), t.dtype.np)


# -- If --------------------------------------------------------------------------------------


def _if_infer(ctx):
    check_dtype(ctx, 0, (T.bool_,), "cond")
    if ctx.type(0).numel not in (1, None):
        raise ctx.fail(f"cond must hold one element, given {ctx.type(0)}")
    then, other = _check_body(ctx, "then_branch"), _check_body(ctx, "else_branch")
    if len(then.outputs) != len(other.outputs):
        raise ctx.fail(f"the branches have {len(then.outputs)} and {len(other.outputs)} "
                       f"outputs")
    types = []
    for k, (a, b) in enumerate(zip(then.outputs, other.outputs)):
        merged = merge_types(a.type, b.type, lambda i: node_dim(ctx.node_name, f"out{k}_{i}"))
        if merged is None:
            raise ctx.fail(f"output {k} is {a.type} in then_branch and {b.type} in "
                           f"else_branch; dtype and rank must agree")
        types.append(merged)
    return types


def if_(cond, *, then_branch: Graph, else_branch: Graph):
    return run_body(then_branch if bool(cond.reshape(-1)[0]) else else_branch, [])


def _host_only(inputs, outputs, **attrs):
    """Control flow is not a loop nest: the op runs its subgraphs on the host, each body
    through the reference interpreter (a counted host fallback)."""
    raise NoCompute("control flow runs its subgraphs on the host")


register_op("If", pattern=Pattern.OPAQUE, infer=_if_infer, evaluate=if_, outputs=(1, None),
            attrs={"then_branch": REQUIRED, "else_branch": REQUIRED}, compute=_host_only)


# -- Loop ------------------------------------------------------------------------------------


def _loop_infer(ctx):
    body = _check_body(ctx, "body")
    n = len(ctx.inputs) - 2
    if ctx.has(0):
        check_dtype(ctx, 0, (T.int64,), "M")
    if ctx.has(1):
        check_dtype(ctx, 1, (T.bool_,), "cond")
    for i in (0, 1):
        if ctx.has(i) and ctx.type(i).numel not in (1, None):
            raise ctx.fail(f"input {i} must hold one element, given {ctx.type(i)}")
    if len(body.inputs) != 2 + n or len(body.outputs) < 1 + n:
        raise ctx.fail(f"with {n} loop-carried values the body must take {2 + n} inputs and "
                       f"give at least {1 + n} outputs; it takes {len(body.inputs)} and gives "
                       f"{len(body.outputs)}")
    types = []
    for i in range(n):
        carried = body.inputs[2 + i].type
        for given, what in ((ctx.type(2 + i), "initial value"),
                            (body.outputs[1 + i].type, "body output")):
            if merge_types(carried, given, str) is None:
                raise ctx.fail(f"loop-carried value {i}: {what} {given} does not fit the body "
                               f"input {carried}")
        types.append(carried)
    trips = _static_trips(ctx, body)
    for out in body.outputs[1 + n:]:
        types.append(out.type.with_shape((trips, *out.type.shape)))
    return types


def _static_trips(ctx, body: Graph):
    """M when the loop surely runs M times (the body passes its condition through unchanged,
    which starts true); else a symbolic trip count."""
    m, cond = ctx.value(0), ctx.value(1)
    out = body.outputs[0]
    passes_through = out is body.inputs[1] or out.producer is not None and \
        out.producer.op == "Identity" and out.producer.inputs[0] is body.inputs[1]
    if m is not None and passes_through and (not ctx.has(1) or cond is not None and cond.all()):
        return max(int(m.reshape(-1)[0]), 0)
    return node_dim(ctx.node_name, "trips")


def loop(m, cond, *carried, body: Graph):
    n = len(carried)
    limit = None if m is None else int(m.reshape(-1)[0])
    going = True if cond is None else bool(cond.reshape(-1)[0])
    scans: list[list[np.ndarray]] = [[] for _ in body.outputs[1 + n:]]
    step = 0
    while going and (limit is None or step < limit):
        outs = run_body(body, [np.array(step, np.int64), np.array(going), *carried])
        going = bool(outs[0].reshape(-1)[0])
        carried = outs[1:1 + n]
        for acc, x in zip(scans, outs[1 + n:]):
            acc.append(x)
        step += 1
    stacked = [np.stack(acc) if acc else _empty_stack(v.type, v.name)
               for acc, v in zip(scans, body.outputs[1 + n:])]
    return tuple(carried) + tuple(stacked)


register_op("Loop", pattern=Pattern.OPAQUE, infer=_loop_infer, evaluate=loop,
            inputs=(2, None), outputs=(1, None), attrs={"body": REQUIRED}, compute=_host_only)


# -- Scan ------------------------------------------------------------------------------------


def _per_input(values, count: int, what: str, ctx) -> list[int]:
    values = list(values) if values is not None else []
    if len(values) > count:
        raise ctx.fail(f"{what} has {len(values)} entries for {count} tensors")
    return values + [0] * (count - len(values))


def _scan_infer(ctx):
    a = ctx.attrs
    body = _check_body(ctx, "body")
    m = a["num_scan_inputs"]
    n = len(ctx.inputs) - m
    if m < 1 or n < 0:
        raise ctx.fail(f"num_scan_inputs {m} does not fit {len(ctx.inputs)} inputs")
    if len(body.inputs) != n + m or len(body.outputs) < n:
        raise ctx.fail(f"with {n} states and {m} scan inputs the body must take {n + m} "
                       f"inputs; it takes {len(body.inputs)}")
    k = len(body.outputs) - n
    in_axes = _per_input(a["scan_input_axes"], m, "scan_input_axes", ctx)
    for what in ("scan_input_directions", "scan_output_directions"):
        if any(d not in (0, 1) for d in _per_input(a[what], m if "input" in what else k,
                                                   what, ctx)):
            raise ctx.fail(f"{what} entries must be 0 or 1, given {a[what]}")
    out_axes = _per_input(a["scan_output_axes"], k, "scan_output_axes", ctx)
    trips = None
    for j in range(m):
        shape = ctx.shape(n + j)
        axis = normalize_axis(ctx, in_axes[j], len(shape))
        size = shape[axis]
        if trips is None or isinstance(trips, str) and isinstance(size, int):
            trips = size
        elif isinstance(size, int) and isinstance(trips, int) and size != trips:
            raise ctx.fail(f"scan inputs have lengths {trips} and {size}")
        elem = body.inputs[n + j].type
        want = TensorType(ctx.dtype(n + j), shape[:axis] + shape[axis + 1:])
        if merge_types(elem, want, str) is None:
            raise ctx.fail(f"scan input {j} slices are {want}; the body takes {elem}")
    types = []
    for i in range(n):
        state = body.inputs[i].type
        for given in (ctx.type(i), body.outputs[i].type):
            if merge_types(state, given, str) is None:
                raise ctx.fail(f"state {i}: {given} does not fit the body input {state}")
        types.append(state)
    for j, out in enumerate(body.outputs[n:]):
        shape = list(out.type.shape)
        axis = normalize_axis(ctx, out_axes[j], len(shape) + 1)
        shape.insert(axis, trips)
        types.append(out.type.with_shape(shape))
    return types


def scan(*inputs, body: Graph, num_scan_inputs: int, scan_input_axes=None,
         scan_input_directions=None, scan_output_axes=None, scan_output_directions=None):
    n = len(inputs) - num_scan_inputs
    k = len(body.outputs) - n
    states = list(inputs[:n])
    xs = []
    for x, axis, reverse in zip(inputs[n:], _defaults(scan_input_axes, num_scan_inputs),
                                _defaults(scan_input_directions, num_scan_inputs)):
        x = np.moveaxis(x, axis, 0)
        xs.append(x[::-1] if reverse else x)
    scans: list[list[np.ndarray]] = [[] for _ in range(k)]
    for t in range(xs[0].shape[0]):
        outs = run_body(body, states + [x[t] for x in xs])
        states = outs[:n]
        for acc, y in zip(scans, outs[n:]):
            acc.append(y)
    results = []
    for acc, v, axis, reverse in zip(scans, body.outputs[n:], _defaults(scan_output_axes, k),
                                     _defaults(scan_output_directions, k)):
        y = np.stack(acc) if acc else _empty_stack(v.type, v.name)
        y = y[::-1] if reverse else y
        results.append(np.moveaxis(y, 0, axis))
    return tuple(states) + tuple(results)


def _defaults(values, count: int) -> list[int]:
    values = list(values or [])
    return values + [0] * (count - len(values))


register_op("Scan", pattern=Pattern.OPAQUE, infer=_scan_infer, evaluate=scan,
            inputs=(1, None), outputs=(1, None),
            attrs={"body": REQUIRED, "num_scan_inputs": REQUIRED, "scan_input_axes": None,
                   "scan_input_directions": None, "scan_output_axes": None,
                   "scan_output_directions": None}, compute=_host_only)
