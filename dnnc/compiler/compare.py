"""Finding a miscompile: a target's results next to the numpy reference's, node by node, and
the first pass of the pipeline whose output changes the result.

`compare` first checks kernel by kernel (`compare_kernels`): the model is optimised as the
target compiles it, each fused kernel is compiled alone, fed the reference's values of its
inputs, and its outputs are compared with the reference's. That keeps the real fusion (a bug
in a fused epilogue shows: issue 30, item 5, a conv's fused QuantizeLinear that only broke
fused) and no error travels from one kernel to the next (a quantized model's one-quantum
rounding flips grow through later layers). Where no kernel diverges, it runs the model on
the target with every node's output made a graph output (so no value is fused away) and
reports the first node, in the source model's order and names, whose output differs beyond
tolerance. An integer output of a kernel that quantizes (QuantizeLinear, DynamicQuantizeLinear)
may differ by one: a float sum rounded to the nearest step, summed in another order.
`bisect_passes` compiles with the first k passes of the pipeline for k = 0, 1, ... and
reports the first pass after which the model's outputs differ from the reference.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import numpy as np

from ..backends.registry import REGISTRY, default_target
from ..ir.graph import Graph
from ..ir.interpreter import run_graph
from ..levels import DEFAULT_OPT_LEVEL
from ..passes.manager import optimize, passes_at
from ..progress import Progress
from .arguments import check_int, check_optional_bool, check_tolerance
from .driver import compile, load_graph

log = logging.getLogger(__name__)


@dataclass
class Divergence:
    node: str          # the source model's node name
    op: str
    value: str         # the output that differs
    max_abs_error: float
    checked: int       # values compared before (and including) this one
    kernel: list[str] | None = None   # the nodes fused with it, found kernel by kernel

    def where(self) -> str:
        """The node, and the kernel it was fused into when there are several."""
        fused = f" (fused kernel of {', '.join(self.kernel)})" \
            if self.kernel and len(self.kernel) > 1 else ""
        return f"{self.node} ({self.op}){fused}"


QUANTIZING = ("QuantizeLinear", "DynamicQuantizeLinear")
"""Ops whose integer outputs may differ by one step between two correct implementations."""


def _inputs(graph: Graph, rng, dims: dict | None = None) -> list[np.ndarray]:
    arrays = []
    for v in graph.inputs:
        shape = tuple(d if isinstance(d, int) else (dims or {}).get(d, 1) for d in v.type.shape)
        if v.type.dtype.is_float:
            arrays.append(rng.standard_normal(shape).astype(v.type.dtype.np))
        elif v.type.dtype.kind == "b":
            arrays.append(rng.random(shape) < 0.5)
        else:
            arrays.append(rng.integers(0, 4, shape).astype(v.type.dtype.np))
    return arrays


def _check(rtol, atol, seed, progress) -> None:
    check_tolerance("rtol", rtol)
    check_tolerance("atol", atol)
    check_int("seed", seed, 0)
    check_optional_bool("progress", progress)


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float,
           steps: int = 0) -> tuple[bool, float]:
    """Within tolerance; integers exactly, or within `steps`."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, float("inf")
    if want.dtype.kind not in "fc" and want.dtype.name != "bfloat16":
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) \
            if got.size else 0.0
        return diff <= steps, diff
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(all="ignore"):
        err = float(np.nanmax(np.abs(g - w))) if g.size else 0.0
        ok = bool(np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
    return ok, err


def compare(model, target: str | None = None, opt_level: int | None = None, *, rtol: float = 1e-4,
            atol: float = 1e-5, seed: int = 0, passes: int | None = None,
            inputs: list[np.ndarray] | None = None,
            progress: bool | None = None) -> Divergence | None:
    """The first node whose output differs between `target` (default: the host's, see
    backends/registry.py) and the reference, or None. `progress` (default: when stderr is a
    terminal) shows the reference run and the probed compile as they happen."""
    _check(rtol, atol, seed, progress)
    target = default_target() if target is None else target
    graph = load_graph(model)
    arrays = inputs if inputs is not None else _inputs(graph, np.random.default_rng(seed))
    if REGISTRY[target].runs_passes:
        found = compare_kernels(graph, target, opt_level, rtol=rtol, atol=atol, passes=passes,
                                inputs=arrays, progress=progress)
        if found is not None:
            return found
    reference: dict[str, np.ndarray] = {}

    def observe(node, outs):
        for v, a in zip(node.outputs, outs):
            reference[v.name] = a

    shown = sys.stderr.isatty() if progress is None else progress
    with Progress(2, shown) as bar:
        bar.step(f"running {len(graph.nodes)} nodes on the reference")
        run_graph(graph, arrays, observe=observe)
        bar.done()
        probed = Graph(graph.name, inputs=graph.inputs, nodes=graph.nodes,
                       outputs=list(graph.outputs) + [v for n in graph.nodes for v in n.outputs
                                                      if v not in graph.outputs])
        bar.step(f"compiling and running every node's output on {target}")
        compiled = compile(probed, target=target, opt_level=opt_level, passes=passes,
                           progress=False, outputs="numpy")
        results = dict(zip(compiled.output_names, compiled.run(*arrays)))
        bar.done()
    checked, rounded = 0, set()   # rounded: values downstream of a one-step difference
    producer = _producers(graph.nodes)
    for node in graph.nodes:
        after_rounding = any(v is not None and id(v) in rounded for v in node.inputs)
        for v in node.outputs:
            if v.name not in results or v.name not in reference:
                continue
            if after_rounding:   # the two runs legitimately part here: nothing to compare
                rounded.add(id(v))
                continue
            checked += 1
            steps, step_size = _one_step(producer, v)
            ok, err = _close(results[v.name], reference[v.name], rtol, atol + step_size, steps)
            if not ok:
                return Divergence(node.name, node.op, v.name, err, checked)
            if (steps or step_size) and not np.array_equal(results[v.name], reference[v.name]):
                rounded.add(id(v))
    if rounded:
        log.info(f"{len(rounded)} value(s) not compared node by node: they follow a "
                 f"quantized value one step off the reference's (kernel by kernel they were)")
    return None


def compare_kernels(model, target: str | None = None, opt_level: int | None = None, *,
                    rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0,
                    passes: int | None = None, inputs: list[np.ndarray] | None = None,
                    progress: bool | None = None) -> Divergence | None:
    """The first fused kernel, in the optimised graph's order, whose outputs differ from the
    reference's when it runs alone on `target` on the reference's values of its inputs, or
    None. Kernels whose boundary values the passes renamed (no reference value to feed or to
    compare) are skipped."""
    _check(rtol, atol, seed, progress)
    target = default_target() if target is None else target
    spec = REGISTRY[target]
    graph = load_graph(model)
    arrays = inputs if inputs is not None else _inputs(graph, np.random.default_rng(seed))
    level = DEFAULT_OPT_LEVEL if opt_level is None else opt_level
    reference: dict[str, np.ndarray] = {v.name: a for v, a in zip(graph.inputs, arrays)}

    def observe(node, outs):
        for v, a in zip(node.outputs, outs):
            reference[v.name] = a

    source_op = {n.name: n.op for n in graph.nodes}   # the model's op, before any rewrite
    shown = sys.stderr.isatty() if progress is None else progress
    optimized = optimize(graph, spec.target(None, None), level, passes=passes)
    kernels = optimized.groups or [[n] for n in optimized.nodes]
    with Progress(len(kernels) + 1, shown, unit="kernel") as bar:
        bar.step(f"running {len(graph.nodes)} nodes on the reference")
        run_graph(graph, arrays, observe=observe)
        bar.done()
        for checked, nodes in enumerate(kernels, 1):
            bar.step(f"kernel {checked}: {nodes[0].name} ({nodes[0].op})")
            sub = _kernel_graph(optimized, nodes, reference)
            if sub is not None:
                producer = _producers(nodes)
                outs = compile(sub, target=target, opt_level=opt_level, progress=False,
                               outputs="numpy", cache=False).run(
                                   *[reference[v.name] for v in sub.inputs])
                for v, got in zip(sub.outputs, outs):
                    steps, step_size = _one_step(producer, v)
                    ok, err = _close(np.asarray(got), reference[v.name], rtol,
                                     atol + step_size, steps)
                    if not ok:
                        bar.close()
                        first = next(n for n in nodes if v in n.outputs)
                        return Divergence(first.name, source_op.get(first.name, first.op),
                                          v.name, err, checked, [n.name for n in nodes])
            bar.done()
    return None


def _producers(nodes: list) -> dict:
    """id(value) -> the node of `nodes` that makes it."""
    return {id(o): n for n in nodes for o in n.outputs}


def _one_step(producer: dict, v) -> tuple[int, float]:
    """(integer steps, float size of one step) `v` may be off by: one for the integer output of
    a quantizing op, one scale for a DequantizeLinear of a value quantized among the nodes of
    `producer` (`_producers`)."""
    node = producer.get(id(v))
    if node is None:
        return 0, 0.0
    if node.op in QUANTIZING:
        return 1, 0.0
    source = producer.get(id(node.inputs[0])) if node.inputs else None
    if node.op == "DequantizeLinear" and source is not None and source.op in QUANTIZING and \
            node.inputs[1] is not None and node.inputs[1].is_const:
        return 0, float(np.max(np.abs(node.inputs[1].const)))
    return 0, 0.0


def _known(v, reference: dict) -> bool:
    """The reference has a value of v's name, shape and dtype (a pass may rename or relayout)."""
    a = reference.get(v.name)
    return a is not None and tuple(a.shape) == tuple(v.type.shape) and \
        a.dtype == v.type.dtype.np


def _kernel_graph(optimized: Graph, nodes: list, reference: dict) -> Graph | None:
    """The kernel's nodes as a graph of their own: its inputs the values it reads that it does
    not make (constants stay constants), its outputs the values it makes that others read or
    the model returns; None where one of them has no reference value."""
    made = {id(v) for n in nodes for v in n.outputs}
    inputs, seen = [], set()
    for n in nodes:
        for v in n.inputs:
            if v is None or v.is_const or id(v) in made or id(v) in seen:
                continue
            seen.add(id(v))
            inputs.append(v)
    inside = {id(n) for n in nodes}
    read_outside = {id(v) for n in optimized.nodes if id(n) not in inside
                    for v in n.inputs if v is not None}
    returned = {id(v) for v in optimized.outputs}
    outputs = [v for n in nodes for v in n.outputs
               if id(v) in read_outside or id(v) in returned]
    if not outputs or not all(_known(v, reference) for v in inputs + outputs):
        return None
    if any(n.subgraphs() for n in nodes):
        return None
    return Graph(f"kernel_{nodes[0].name}", inputs=inputs, nodes=list(nodes), outputs=outputs)


def bisect_passes(model, target: str | None = None, opt_level: int | None = None, *,
                  rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0,
                  progress: bool | None = None) -> tuple[str, Divergence] | None:
    """(the first pass after which results diverge, where they first diverge), or None. A
    quantized model's step whose outputs differ counts only where `compare` finds the kernel or
    node: one-step rounding differences grow through its layers without any miscompile.
    `progress` (default: when stderr is a terminal) shows each compile as it starts: a bar
    with an ETA on a terminal (resnet50 takes minutes), else a line each."""
    _check(rtol, atol, seed, progress)
    target = default_target() if target is None else target
    graph = load_graph(model)
    arrays = _inputs(graph, np.random.default_rng(seed))
    names = passes_at(DEFAULT_OPT_LEVEL if opt_level is None else opt_level)
    shown = sys.stderr.isatty() if progress is None else progress
    steps = list(range(len(names) + 1)) + [None]
    unconfirmed: list[str] = []
    quantized = any(n.op in QUANTIZING for n in graph.nodes)
    with Progress(len(steps) + 1, shown, unit="compile") as bar:
        bar.step(f"running {len(graph.nodes)} nodes on the reference")
        want = run_graph(graph, arrays)
        bar.done()
        # passes=k runs the first k passes and leaves memory reuse off; passes=None is the
        # whole compile, memory planning included (it runs outside the pass pipeline)
        for k in steps:
            bar.step("the whole compile, memory planning included" if k is None else
                     f"compiling after {k} pass(es){': ' + names[k - 1] if k else ''}")
            outs = compile(graph, target=target, opt_level=opt_level, passes=k,
                           progress=False, outputs="numpy").run(*arrays)
            bar.done()
            if not all(_close(g, w, rtol, atol)[0] for g, w in zip(outs, want)):
                found = compare(graph, target, opt_level, rtol=rtol, atol=atol, passes=k,
                                inputs=arrays, progress=False)
                if found is None and quantized:   # rounding that grew: not a culprit
                    unconfirmed.append("no pass" if k == 0 else "all" if k is None else
                                       names[k - 1])
                    continue
                bar.close()
                culprit = "the target's code generation (no pass)" if k == 0 else \
                    "memory planning (arena reuse)" if k is None else names[k - 1]
                return culprit, found
    if unconfirmed:
        log.info(f"the outputs differ beyond tolerance after {', '.join(unconfirmed)}, but no "
                 f"kernel and no node does beyond one quantization step: rounding that grows "
                 f"through the layers, not a miscompile")
    return None
