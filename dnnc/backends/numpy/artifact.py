"""The `numpy` target's artifact codec: the manifest names the target, nothing else (the graph,
which `compiler/artifact.py` stores, is the whole model)."""

from __future__ import annotations

from ...ir.graph import Graph
from .runtime import NumpyRuntime


def export(runtime, manifest: dict, files: dict) -> None:
    manifest["target"] = {"name": runtime.target.name}


def check(manifest: dict, path) -> None:
    """Any machine with NumPy runs it."""


def restore(spec, graph: Graph, manifest: dict, read, progress) -> NumpyRuntime:
    return NumpyRuntime(graph, spec.target())
