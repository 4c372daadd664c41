"""ONNX importers for control flow: If, Loop, Scan. Bodies become dnnc Graphs (which may read
the enclosing graph's values). A loop-carried value whose shape changes between iterations gets
symbolic dims where it changes: the body is imported again with the widened types until they
are stable. Scan-8 (a leading batch axis, optional sequence_lens) becomes a Scan over the batch
whose body runs the Scan-9 form on one sample. Sequence and optional values are not supported.
"""

from __future__ import annotations

from ...ir import types as T
from ...ir.graph import Graph
from ...ir.ops.control import merge_types, node_dim
from ..onnx import ImportContext, onnx_op

_MAX_WIDENINGS = 4


def _stable_body(ctx: ImportContext, attr: str, head: list[T.TensorType],
                 states: list[T.TensorType], tail: list[T.TensorType], out_offset: int) -> Graph:
    """Import body `attr` with inputs head + states + tail, widening the state types until the
    body's state outputs (from `out_offset`) fit them."""
    states = list(states)
    for _ in range(_MAX_WIDENINGS):
        body = ctx.subgraph(attr, head + states + tail)
        outs = body.outputs[out_offset:out_offset + len(states)]
        if len(outs) < len(states):
            raise ctx.fail(f"the body gives {len(body.outputs)} outputs, too few for "
                           f"{len(states)} loop-carried values")
        widened = []
        for i, (t, out) in enumerate(zip(states, outs)):
            merged = merge_types(t, out.type, lambda d, i=i: node_dim(ctx.name, f"state{i}_{d}"))
            if merged is None:
                raise ctx.fail(f"loop-carried value {i} is {t} before the body and {out.type} "
                               f"after it; dtype and rank must stay the same")
            widened.append(merged)
        if widened == states:
            return body
        states = widened
    raise ctx.fail("the loop-carried types do not settle")


def _tensor(ctx: ImportContext, i: int):
    value = ctx.input(i)
    if value is None:
        raise ctx.fail(f"input {i} is missing")
    return value


@onnx_op("If", since=1)
def import_if(ctx: ImportContext):
    then = ctx.subgraph("then_branch")
    other = ctx.subgraph("else_branch")
    return ctx.emit("If", ctx.inputs[:1], {"then_branch": then, "else_branch": other})


@onnx_op("Loop", since=1)
def import_loop(ctx: ImportContext):
    carried = [_tensor(ctx, i) for i in range(2, len(ctx.inputs))]
    scalars = [T.TensorType(T.int64, ()), T.TensorType(T.bool_, ())]
    body = _stable_body(ctx, "body", scalars, [v.type for v in carried], [], 1)
    inputs = [ctx.input(0), ctx.input(1)] + carried
    return ctx.emit("Loop", inputs, {"body": body})


def _scan_attrs(ctx: ImportContext, n_states: int, n_scans: int) -> dict:
    attrs = {k: ctx.attrs[k] for k in ("scan_input_axes", "scan_input_directions",
                                       "scan_output_axes", "scan_output_directions")
             if k in ctx.attrs}
    attrs["num_scan_inputs"] = n_scans
    return attrs


def _slice_type(t: T.TensorType, axis: int) -> T.TensorType:
    axis = axis + t.rank if axis < 0 else axis
    return t.with_shape(t.shape[:axis] + t.shape[axis + 1:])


@onnx_op("Scan", since=9)
def import_scan(ctx: ImportContext):
    m = ctx.attrs["num_scan_inputs"]
    values = [_tensor(ctx, i) for i in range(len(ctx.inputs))]
    n = len(values) - m
    if n < 0 or m < 1:
        raise ctx.fail(f"num_scan_inputs {m} does not fit {len(values)} inputs")
    axes = list(ctx.attrs.get("scan_input_axes", [])) + [0] * m
    slices = [_slice_type(v.type, axes[j]) for j, v in enumerate(values[n:])]
    body = _stable_body(ctx, "body", [], [v.type for v in values[:n]], slices, 0)
    attrs = _scan_attrs(ctx, n, m)
    attrs["body"] = body
    return ctx.emit("Scan", values, attrs)


@onnx_op("Scan", since=8)
def import_scan8(ctx: ImportContext):
    """Scan-8 scans axis 1 of every sample of a batch (axis 0): an outer Scan over the batch
    runs the per-sample Scan (the Scan-9 form) as its body."""
    m = ctx.attrs["num_scan_inputs"]
    lens = ctx.value(0)
    values = [_tensor(ctx, i) for i in range(1, len(ctx.inputs))]
    n = len(values) - m
    if n < 0 or m < 1:
        raise ctx.fail(f"num_scan_inputs {m} does not fit {len(values)} inputs")
    if ctx.input(0) is not None:
        seq = values[n].shape[1] if values[n].type.rank > 1 else None
        if lens is None or not isinstance(seq, int) or (lens != seq).any():
            raise ctx.fail("sequence_lens shorter than the scan inputs is not supported")
    samples = [_slice_type(v.type, 0) for v in values]
    slices = [_slice_type(t, 0) for t in samples[n:]]
    inner_body = _stable_body(ctx, "body", [], samples[:n], slices, 0)
    outer = Graph(f"{ctx.name}.batch")
    sample_inputs = [outer.add_input(f"{ctx.name}.sample{i}", t) for i, t in enumerate(samples)]
    inner_attrs = {"body": inner_body, "num_scan_inputs": m}
    if "directions" in ctx.attrs:
        inner_attrs["scan_input_directions"] = ctx.attrs["directions"]
    outer.outputs = outer.add_node("Scan", sample_inputs, inner_attrs, name=f"{ctx.name}.sample",
                                   num_outputs=len(inner_body.outputs))
    return ctx.emit("Scan", values, {"body": outer, "num_scan_inputs": len(values)})
