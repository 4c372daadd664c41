"""Shrinking a failing fuzz case to the few nodes that still fail (delta debugging).

`minimize(model, runs, fails)` keeps one failing output, then, node by node from the outputs
back, tries three edits and keeps each one after which `fails(model, runs)` still holds:
*truncate* (a node writing an output goes and its inputs become the outputs), *bypass* (the
node goes and its readers read its input instead, when the types agree) and *cut* (the node
goes and its outputs become graph inputs, fed the values the numpy reference computed for
them, so everything upstream of them goes too). It repeats until a pass changes
nothing or the budget is spent. The result is always a model that fails: the input, if no
edit kept the failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from .graph_builder import BATCH, ONNX_DTYPE


@dataclass
class Minimized:
    model: onnx.ModelProto
    runs: list[dict]
    trials: int


def minimize(model: onnx.ModelProto, runs: list[dict], fails, max_trials: int = 150,
             max_seconds: float = 300.0) -> Minimized:
    deadline = time.monotonic() + max_seconds
    trials = 0
    values = _intermediates(model, runs)

    def attempt(candidate: onnx.ModelProto, cand_runs: list[dict]) -> bool:
        nonlocal trials
        if trials >= max_trials or time.monotonic() > deadline:
            return False
        trials += 1
        return fails(candidate, cand_runs)

    best, best_runs = model, runs
    outputs = list(model.graph.output)
    if len(outputs) > 1:
        for out in outputs:
            candidate = _prune(_with_outputs(best, [out]))
            cand_runs = _feed(candidate, best_runs)
            if attempt(candidate, cand_runs):
                best, best_runs = candidate, cand_runs
                break
    changed = True
    while changed and values is not None:
        changed = False
        for name in [n.name for n in reversed(best.graph.node)]:
            if all(n.name != name for n in best.graph.node):
                continue   # pruned by an earlier edit of this pass
            for edit in (_truncate, _bypass, _cut):
                made = edit(best, name, values)
                if made is None:
                    continue
                candidate = _prune(made)
                cand_runs = _feed(candidate, best_runs, values)
                if len(candidate.graph.node) < len(best.graph.node) and \
                        attempt(candidate, cand_runs):
                    best, best_runs = candidate, cand_runs
                    changed = True
                    break
    return Minimized(best, best_runs, trials)


def _intermediates(model: onnx.ModelProto, runs: list[dict]) -> list[dict] | None:
    """Every value the numpy reference computes, per run (onnxruntime's when the reference
    is what fails), or None when neither runs."""
    from .fuzz import numpy_outputs, ort_outputs

    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in inferred.graph.value_info}
    known.update({v.name: v for v in inferred.graph.output})
    names = [o for n in model.graph.node for o in n.output if o in known]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(known[n] for n in names)
    outs = None
    for reference in (numpy_outputs, ort_outputs):
        try:
            outs = reference(probe.SerializeToString(), runs)
            break
        except Exception:   # a reference that fails on the model: try the next one
            continue
    if outs is None:
        return None
    return [dict(zip(names, run)) for run in outs]


def _with_outputs(model: onnx.ModelProto, outputs) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    return out


def _prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """Without the nodes, inputs and initializers no output depends on."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for node in reversed(g.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(reversed(keep))
    inputs = [v for v in g.input if v.name in needed]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    inits = [t for t in g.initializer if t.name in needed]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    return out


def _cut(model: onnx.ModelProto, name: str, values: list[dict]) -> onnx.ModelProto | None:
    """`name`'s node removed; its outputs that others read become graph inputs."""
    node = next(n for n in model.graph.node if n.name == name)
    outputs = {o.name for o in model.graph.output}
    if any(o in outputs for o in node.output) or any(o not in values[0] for o in node.output):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(n for n in model.graph.node if n.name != name)
    read = {i for n in out.graph.node for i in n.input}
    out.graph.input.extend(_value_info(o, values) for o in node.output if o in read)
    return out


def _truncate(model: onnx.ModelProto, name: str, values: list[dict]
              ) -> onnx.ModelProto | None:
    """`name`'s node, which writes graph outputs, removed; its computed inputs become the
    graph's outputs in their place."""
    node = next(n for n in model.graph.node if n.name == name)
    outputs = [o.name for o in model.graph.output]
    if not any(o in outputs for o in node.output):
        return None
    computed = [i for i in node.input if i in values[0] and i not in outputs]
    if not computed:
        return None
    kept = [o for o in model.graph.output if o.name not in node.output]
    out = _with_outputs(model, kept + [_value_info(i, values) for i in dict.fromkeys(computed)])
    del out.graph.node[:]
    out.graph.node.extend(n for n in model.graph.node if n.name != name)
    return out


def _value_info(name: str, values: list[dict]) -> onnx.ValueInfoProto:
    """A value's type from its arrays in every run: a dim that differs is the batch."""
    arrays = [run[name] for run in values]
    dims = [d if all(a.shape[k] == d for a in arrays) else BATCH
            for k, d in enumerate(arrays[0].shape)]
    return helper.make_tensor_value_info(name, ONNX_DTYPE[arrays[0].dtype], dims)


def _bypass(model: onnx.ModelProto, name: str, values: list[dict]) -> onnx.ModelProto | None:
    """`name`'s node removed, its readers reading its first input of the same type."""
    node = next(n for n in model.graph.node if n.name == name)
    outputs = {o.name for o in model.graph.output}
    if len(node.output) != 1 or node.output[0] in outputs or node.output[0] not in values[0]:
        return None
    same = [i for i in node.input if i and i in values[0] and all(
        run[i].shape == run[node.output[0]].shape and run[i].dtype == run[node.output[0]].dtype
        for run in values)]
    if not same:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for n in model.graph.node:
        if n.name == name:
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        for k, i in enumerate(copy.input):
            if i == node.output[0]:
                copy.input[k] = same[0]
        out.graph.node.append(copy)
    return out


def _feed(model: onnx.ModelProto, runs: list[dict], values: list[dict] | None = None
          ) -> list[dict]:
    """The inputs `model` takes, from the original inputs or the recorded values."""
    names = [v.name for v in model.graph.input]
    fed = []
    for r, run in enumerate(runs):
        source = dict(values[r]) if values else {}
        source.update(run)
        fed.append({n: np.asarray(source[n]) for n in names})
    return fed
