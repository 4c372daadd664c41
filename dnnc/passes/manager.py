"""The pass pipeline per opt level (a first slice of the PassManager; fusion, simplification
and memory planning join it in the graph-passes issue).

    0  the graph as imported
    1  fold_constants (on a copy bound to the inputs' declared shapes), simplify
    2  + convert_layout (the target's weight layouts, converted once at compile time)
    3  the same as 2 today (the default: the fastest correct level)

The input graph is never modified: a pipeline works on `specialize`'s copy.
"""

from __future__ import annotations

import time

from ..ir.graph import Graph
from ..ir.target import Target
from .convert_layout import convert_layout
from .simplify import simplify
from .specialize import specialize

DEFAULT_OPT_LEVEL = 3


def optimize(graph: Graph, target: Target, opt_level: int = DEFAULT_OPT_LEVEL,
             timings: dict | None = None) -> Graph:
    """The graph to compile for `target` at `opt_level`."""
    if opt_level <= 0:
        return graph
    start = time.perf_counter()
    out = specialize(graph, [v.type.shape for v in graph.inputs], fold=True)
    if timings is not None:
        timings["fold_constants"] = time.perf_counter() - start
    start = time.perf_counter()
    simplify(out)
    if timings is not None:
        timings["simplify"] = time.perf_counter() - start
    if opt_level >= 2:
        start = time.perf_counter()
        convert_layout(out, target)
        if timings is not None:
            timings["convert_layout"] = time.perf_counter() - start
    return out
