"""`dnnc.compile`: model in, CompiledModel out. The pipeline is one straight line:
import -> (graph passes, per opt level) -> target runtime."""

from __future__ import annotations

import time

from ..backends.numpy import NumpyRuntime
from ..errors import CompileError
from ..ir.graph import Graph
from .module import CompiledModel

def llvm_target(cpu=None):
    """The `Target` the llvm backend compiles for: `cpu` (default: this machine's)."""
    from ..backends.llvm.runtime import host_cpu, num_threads
    from ..ir.target import Target

    cpu = cpu or host_cpu()
    return Target("llvm", cpu.name, tuple(sorted(cpu.feature_set)), cpu.vector_bits,
                  num_threads())


def _llvm_runtime(graph: Graph, opt_level: int, cpu=None, progress=None, passes=None,
                  cache_size=None, **pipeline):
    from ..backends.llvm.executable import DEFAULT_CACHE_SIZE, LLVMRuntime
    from ..backends.llvm.runtime import host_cpu
    from ..passes.manager import optimize, passes_at

    cpu = cpu or host_cpu()
    graph = optimize(graph, llvm_target(cpu), opt_level, passes=passes, **pipeline)
    enabled = passes_at(opt_level)[:passes]
    return graph, LLVMRuntime(graph, cpu=cpu, opt_level=opt_level, progress=progress,
                              fuse="fuse_ops" in enabled,
                              reuse_memory="plan_memory" in enabled,
                              cache_size=DEFAULT_CACHE_SIZE if cache_size is None else cache_size)


def _numpy_runtime(graph: Graph, opt_level: int, cpu=None, progress=None, passes=None,
                   cache_size=None, **pipeline):
    return graph, NumpyRuntime(graph)   # the reference interprets the graph as imported


TARGETS = {"numpy": _numpy_runtime, "llvm": _llvm_runtime}


def load_graph(model, input_shapes: dict | None = None) -> Graph:
    """A Graph from a Graph, an ONNX path, bytes or ModelProto."""
    if isinstance(model, Graph):
        return model
    from ..frontend.onnx import import_onnx

    return import_onnx(model, input_shapes=input_shapes)


def compile(model, target: str = "numpy", *, input_shapes: dict | None = None,
            opt_level: int | None = None, tuning_log=None, cpu=None,
            progress: bool | None = None, passes: int | None = None,
            dump_ir=None, cache_size: int | None = None) -> CompiledModel:
    """Compile an ONNX model (path, bytes, ModelProto) or a Graph for `target`.

    `cpu` (a `backends.llvm.runtime.HostCPU`) overrides the host's CPU name and features for
    the llvm target; `progress` prints compile stages on stderr (default: when it is a tty);
    `passes` stops the pass pipeline after its first N passes (for finding a miscompile);
    `dump_ir` is a folder that receives the graph's text after every pass (`NN_name.txt`);
    `cache_size` bounds the shape specialisations the llvm target keeps per segment (least
    recently used dropped first; default 32).
    """
    if target not in TARGETS:
        raise CompileError(f"unknown target {target!r}; available: {', '.join(TARGETS)}")
    start = time.perf_counter()
    graph = load_graph(model, input_shapes)
    imported_nodes = len(graph.nodes)
    timings: dict[str, float] = {}
    graph, runtime = TARGETS[target](graph, 3 if opt_level is None else opt_level, cpu=cpu,
                                     progress=progress, passes=passes, timings=timings,
                                     dump_ir=dump_ir, cache_size=cache_size)
    stats = {"compile_seconds": time.perf_counter() - start, "nodes": len(graph.nodes),
             "imported_nodes": imported_nodes, "pass_seconds": timings,
             "host_fallback_ops": len(getattr(runtime, "host_fallback_ops", ())),
             "kernels": getattr(runtime, "kernels", 0),
             "arena_bytes": getattr(runtime, "arena_bytes", 0)}
    return CompiledModel(graph, runtime, target, stats)
