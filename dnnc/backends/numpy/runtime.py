"""The `numpy` target's runtime: runs the graph with the registry's references. The oracle that
every other target is tested against; it never rewrites the graph it is given."""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph
from ...ir.interpreter import run_graph
from ...ir.target import Target
from dnnc.backends.executable import write_aliases


class NumpyRuntime:
    """Executes a graph by interpretation; thread-safe (no state is kept between calls)."""

    def __init__(self, graph: Graph, target: Target):
        self.graph = graph
        self.target = target   # what the registry describes it as (one thread, no CPU)

    def run(self, inputs: list[np.ndarray], bindings: dict[str, int]) -> list[np.ndarray]:
        return write_aliases(self.graph, inputs, run_graph(self.graph, inputs, dict(bindings)))


def runtime(graph: Graph, opt_level: int, target: Target, progress=None, reuse_memory=True,
            cache_size=None, tuned=None, render_only=False, outputs=None) -> NumpyRuntime:
    """The registry's runtime factory: the reference interprets the graph as imported."""
    return NumpyRuntime(graph, target)
