"""Finding a miscompile: a target's results next to the numpy reference's, node by node, and
the first pass of the pipeline whose output changes the result.

`compare` runs the model on the target with every node's output made a graph output (so no
value is fused away) and on the numpy reference, with the same inputs, and reports the first
node, in the source model's order and names, whose output differs beyond tolerance.
`bisect_passes` compiles with the first k passes of the pipeline for k = 0, 1, ... and
reports the first pass after which the model's outputs differ from the reference.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..backends.registry import default_target
from ..ir.graph import Graph
from ..ir.interpreter import run_graph
from ..levels import DEFAULT_OPT_LEVEL
from ..passes.manager import passes_at
from ..progress import Progress
from .arguments import check_int, check_optional_bool, check_tolerance
from .driver import compile, load_graph


@dataclass
class Divergence:
    node: str          # the source model's node name
    op: str
    value: str         # the output that differs
    max_abs_error: float
    checked: int       # values compared before (and including) this one


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


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[bool, float]:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, float("inf")
    if want.dtype.kind not in "fc" and want.dtype.name != "bfloat16":
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) \
            if got.size else 0.0
        return bool(np.array_equal(got, want)), diff
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
    checked = 0
    for node in graph.nodes:
        for v in node.outputs:
            if v.name not in results or v.name not in reference:
                continue
            checked += 1
            ok, err = _close(results[v.name], reference[v.name], rtol, atol)
            if not ok:
                return Divergence(node.name, node.op, v.name, err, checked)
    return None


def bisect_passes(model, target: str | None = None, opt_level: int | None = None, *,
                  rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0,
                  progress: bool | None = None) -> tuple[str, Divergence] | None:
    """(the first pass after which results diverge, where they first diverge), or None.
    `progress` (default: when stderr is a terminal) shows each compile as it starts: a bar
    with an ETA on a terminal (resnet50 takes minutes), else a line each."""
    _check(rtol, atol, seed, progress)
    target = default_target() if target is None else target
    graph = load_graph(model)
    arrays = _inputs(graph, np.random.default_rng(seed))
    names = passes_at(DEFAULT_OPT_LEVEL if opt_level is None else opt_level)
    shown = sys.stderr.isatty() if progress is None else progress
    steps = list(range(len(names) + 1)) + [None]
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
                bar.close()
                found = compare(graph, target, opt_level, rtol=rtol, atol=atol, passes=k,
                                inputs=arrays, progress=shown)
                culprit = "the target's code generation (no pass)" if k == 0 else \
                    "memory planning (arena reuse)" if k is None else names[k - 1]
                return culprit, found
    return None
