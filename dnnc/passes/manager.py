"""The pass pipeline per opt level (a first slice of the PassManager; memory planning and the
rest of simplify join it in the graph-passes issue).

    0  the graph as imported
    1  fold_constants (on a copy bound to the inputs' declared shapes), simplify,
       eliminate (common subexpressions, then dead code)
    2  + convert_layout (the target's weight layouts, converted once at compile time),
       + fuse_ops (applied by the backend when it forms kernels)
    3  the same as 2 today (the default: the fastest correct level)

`PIPELINE` names every pass with the level it starts at; `optimize(..., passes=k)` stops after
the first k of them, which is how `dnnc compare --bisect-passes` finds the pass that changes
a result. The input graph is never modified: a pipeline works on `specialize`'s copy.
"""

from __future__ import annotations

import os
import time

from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.target import Target
from .convert_layout import convert_layout
from .eliminate import eliminate_common_subexpressions, eliminate_dead_code
from .simplify import simplify
from .specialize import specialize

DEFAULT_OPT_LEVEL = 3


def _fold(graph: Graph, target: Target) -> Graph:
    return specialize(graph, [v.type.shape for v in graph.inputs], fold=True)


def _simplify(graph: Graph, target: Target) -> Graph:
    simplify(graph)
    return graph


def _eliminate(graph: Graph, target: Target) -> Graph:
    eliminate_common_subexpressions(graph)
    eliminate_dead_code(graph)
    return graph


def _layout(graph: Graph, target: Target) -> Graph:
    convert_layout(graph, target)
    return graph


def _fuse(graph: Graph, target: Target) -> Graph:
    return graph   # the backend groups kernels (`fuse_ops.fusion_groups`) when it is on


PIPELINE = [("fold_constants", 1, _fold), ("simplify", 1, _simplify),
            ("eliminate", 1, _eliminate), ("convert_layout", 2, _layout),
            ("fuse_ops", 2, _fuse)]
"""(name, first opt level, pass) in order; a pass takes and returns the graph."""


def passes_at(opt_level: int) -> list[str]:
    return [name for name, level, _ in PIPELINE if opt_level >= level]


def optimize(graph: Graph, target: Target, opt_level: int = DEFAULT_OPT_LEVEL,
             timings: dict | None = None, passes: int | None = None,
             verify: bool | None = None) -> Graph:
    """The graph to compile for `target` at `opt_level` (only its first `passes` passes when
    given). With `verify` (default: the DNNC_VERIFY environment variable, which the test
    suite sets) the graph is verified after every pass, naming the pass that broke it."""
    if verify is None:
        verify = os.environ.get("DNNC_VERIFY", "") not in ("", "0")
    names = passes_at(opt_level)[:passes]
    out = graph
    for name, _, run in PIPELINE:
        if name not in names:
            continue
        start = time.perf_counter()
        out = run(out, target)
        if timings is not None:
            timings[name] = time.perf_counter() - start
        if verify:
            try:
                out.verify()
            except Exception as exc:
                raise CompileError(f"the graph is invalid after pass {name}: {exc}") from exc
    return out
