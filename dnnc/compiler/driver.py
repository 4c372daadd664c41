"""`dnnc.compile`: model in, CompiledModel out. The pipeline is one straight line:
check the arguments -> import -> refuse absurd tensor sizes -> (graph passes, per opt level)
-> target runtime."""

from __future__ import annotations

import os
import sys
import time

from ..autotune.records import ranked_configs, read, warn_unapplied
from ..backends.registry import REGISTRY, default_target, using
from ..errors import ArgumentError, OutOfMemoryError
from ..ir.graph import Graph
from ..ir.target import PRECISIONS, Target
from ..levels import DEFAULT_OPT_LEVEL, OPT_LEVELS, levels
from ..passes.manager import optimize, passes_at
from ..progress import summarise
from .arguments import (check_choice, check_int, check_optional_bool, check_optional_path,
                        check_returns)
from . import cache as compile_cache
from .module import CompiledModel



def check_options(target, opt_level=None, *, tuning_log=None, cpu=None, progress=None,
                  passes=None, dump_ir=None, cache_size=None, outputs=None,
                  precision=None) -> None:
    """Raise `ArgumentError` for a compile option of the wrong type or range, or one that
    `target` does not use (also what `dnnc.jit` checks when it decorates). The numpy reference
    runs the graph as imported, so it refuses the llvm options rather than ignore them;
    `outputs` names an array kind, so every target takes the kinds it returns; `precision`
    (one of `PRECISIONS`) applies to the targets whose products it changes (cuda's tensor
    cores, llvm's bf16 products), each taking the values its entry lists (`check_precision`),
    and the others refuse it, fp32 included, rather than ignore it."""
    check_choice("target", target, REGISTRY)
    if outputs is not None:
        check_returns(target, "outputs", outputs)
    check_int("opt_level", opt_level, OPT_LEVELS[0], OPT_LEVELS[-1], optional=True)
    level = DEFAULT_OPT_LEVEL if opt_level is None else opt_level
    check_int("passes", passes, 0, len(passes_at(level)), optional=True)
    check_optional_bool("progress", progress)
    check_optional_path("dump_ir", dump_ir)
    check_int("cache_size", cache_size, 1, optional=True)
    check_optional_path("tuning_log", tuning_log)
    if tuning_log is not None and not os.path.isfile(tuning_log):
        raise ArgumentError(f"tuning_log: no file {os.fspath(tuning_log)!r} (write one with "
                            f"`dnnc tune`)")
    for name, value in {"cpu": cpu, "passes": passes, "dump_ir": dump_ir,
                        "cache_size": cache_size, "tuning_log": tuning_log}.items():
        if value is not None and name not in REGISTRY[target].options:
            users = using(name)
            raise ArgumentError(f"{name} does not apply to the {target} target, only to "
                                f"{', '.join(users)}")
    check_precision(target, precision)
    if cpu is not None and not isinstance(cpu, Target):
        raise ArgumentError(f"cpu must be a dnnc.ir.target.Target (for llvm: "
                            f"backends.llvm.cpu.cpu_from or host_target), not "
                            f"{type(cpu).__name__}")
    if cpu is not None and cpu.name != target:
        raise ArgumentError(f"cpu describes a machine for the {cpu.name!r} target, not for "
                            f"{target}")


def check_precision(target: str, precision) -> None:
    """Raise `ArgumentError` for a `precision` that is not one of `PRECISIONS`, or one that
    `target` does not take (its registry entry's `precisions`; a target without the option
    takes none, fp32 included)."""
    if precision is None:
        return
    check_choice("precision", precision, PRECISIONS)
    spec = REGISTRY[target]
    if "precision" not in spec.options:
        raise ArgumentError(f"precision does not apply to the {target} target, only to "
                            f"{', '.join(using('precision'))}")
    if precision not in spec.precisions:
        raise ArgumentError(f"precision={precision!r} is not one the {target} target computes "
                            f"in; it takes {', '.join(spec.precisions)}")


def load_graph(model, input_shapes: dict | None = None) -> Graph:
    """A Graph from a Graph, an ONNX path, bytes or ModelProto, or a torch.export
    ExportedProgram (`frontend/torch_export.py`)."""
    if isinstance(model, Graph):
        if input_shapes is not None:
            raise ArgumentError("input_shapes applies to ONNX models; a Graph's input shapes "
                                "are already fixed")
        return model
    if _exported_program(model):
        if input_shapes is not None:
            raise ArgumentError("input_shapes applies to ONNX models; an exported program's "
                                "dynamic dims are declared with torch.export.Dim")
        from ..frontend.torch_export import import_exported   # imports torch: only here

        return import_exported(model)
    import onnx

    if not isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview,
                              onnx.ModelProto)):
        raise ArgumentError(f"model must be an ONNX file path, bytes, an onnx.ModelProto, a "
                            f"dnnc.Graph or a torch.export.ExportedProgram, not "
                            f"{type(model).__name__}")
    from ..frontend.onnx import import_onnx

    return import_onnx(model, input_shapes=input_shapes)


def _exported_program(model) -> bool:
    """Whether `model` is a torch.export ExportedProgram (torch already imported: the caller
    made one; dnnc never imports torch to ask)."""
    torch = sys.modules.get("torch")
    export = getattr(torch, "export", None) if torch is not None else None
    return export is not None and isinstance(model, export.ExportedProgram)


def physical_memory_bytes() -> int | None:
    """This machine's RAM, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_tensor_sizes(graph: Graph, limit: int | None) -> None:
    """Refuse a graph with a tensor of static size above `limit` bytes: it would compile and
    then fail when the call allocates it (a 4 TiB ConstantOfShape)."""
    if limit is None:
        return
    for node in graph.walk():
        for value in node.outputs:
            numel = value.type.numel
            if numel is not None and numel * value.type.dtype.itemsize > limit:
                size = numel * value.type.dtype.itemsize
                raise OutOfMemoryError(f"{node.op} node {node.name!r}: output {value.name!r} "
                                       f"({value.type}) needs {_bytes(size)}; this machine has "
                                       f"{_bytes(limit)} of memory")


def _bytes(size: int) -> str:
    """4398046511104 -> "4.00 TiB"."""
    for shift, unit in ((60, "EiB"), (50, "PiB"), (40, "TiB"), (30, "GiB"), (20, "MiB")):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.2f} {unit}"
    return f"{size:,} bytes"


def compile(model, target: str | None = None, *, input_shapes: dict | None = None,
            opt_level: int | None = None, tuning_log=None, cpu=None,
            progress: bool | None = None, passes: int | None = None,
            dump_ir=None, cache_size: int | None = None,
            render_only: bool = False, outputs: str | None = None,
            precision: str | None = None, cache: bool = True) -> CompiledModel:
    """Compile an ONNX model (path, bytes, ModelProto), a Graph, or a torch.export
    ExportedProgram (docs/torch_backend.md, "torch.export") for `target` (default: the
    fastest target this host can run, as for `dnnc.jit` and the CLI: llvm on a CPU, cuda where
    CuPy sees a GPU; `backends.registry.default_target`).

    `cpu` (a `dnnc.ir.target.Target`, e.g. from `backends.llvm.cpu.cpu_from`) is the
    machine to compile for instead of this host (CPU name, features, threads; the layouts are
    the target's own); `progress` prints compile stages on stderr (default: when it is a tty),
    kernel by kernel, and a compile of `progress.SUMMARY_SECONDS` or more ends with one line
    "dnnc: compiled NAME for TARGET: N kernels in S s" on a tty or not, unless `progress` is
    False or the `dnnc` logger is above INFO;
    `passes` stops the pass pipeline after its first N passes and leaves arena memory
    unshared (for finding a miscompile: `dnnc compare --bisect-passes`);
    `dump_ir` is a folder that receives the graph's text after every pass (`NN_name.txt`).
    `cache_size` bounds the shape specialisations a compiled target keeps per segment (least
    recently used dropped first; default 32). `tuning_log` is a log `dnnc tune` wrote: each
    kernel takes the best config measured for it on this machine that its template accepts
    (`stats["tuned_kernels"]` counts them; others keep their defaults; a log that changes
    none of them says so in one `TuningLogWarning`). `passes`, `dump_ir`, `cache_size` and
    `tuning_log` apply to the targets that compile code (llvm, cuda), `cpu` to llvm only
    (each target's registry entry lists its `options`; `using(option)` names the targets).
    `render_only` generates the code without the device that would run it (`dnnc compile
    --emit cuda` on a machine without a GPU): `source()` works, calling the model raises
    `DeviceError`. `outputs` is the kind of array a call returns unless its `to=` says
    otherwise: the target's default when None (cuda: "cupy", device arrays; llvm and numpy:
    "numpy", the only kind they return; cuda also takes "numpy"). `precision` (cuda and
    llvm) is the arithmetic of dense products and convolutions: "fp32" (the default), or
    cuda's "tf32", "fp16", "bf16": operands rounded to that type on tensor cores, fp32
    accumulation, "fp16" and "bf16" also storing the model's weights and activations in that
    type (its inputs and outputs stay float32); llvm's "bf16": operands rounded to bf16,
    products through AVX512_BF16's vdpbf16ps where the CPU has it, else fp32 FMAs, fp32
    accumulation (docs/llvm_backend.md, "Precision"); each output within `ir.target.model_error_bound(precision)` (16
    units of the precision's roundoff: 7.8e-3 for tf32 and fp16, 6.3e-2 for bf16) of the
    largest fp32 output (docs/cuda_backend.md, "Precision"); `stats["precision"]` reports it. Every argument is checked
    here: a wrong one raises `ArgumentError` naming it; a tensor of static size beyond this
    machine's memory raises `OutOfMemoryError` naming its node. `cache` (default True) looks
    the compile up in the on-disk compile cache first and keeps what it compiles there
    (`compiler/cache.py`: the targets whose registry entry is `cached`, llvm and cuda;
    `stats["compile_cache"]` says "hit", "miss" or "off").
    """
    target = default_target() if target is None else target
    check_options(target, opt_level, tuning_log=tuning_log, cpu=cpu, progress=progress,
                  passes=passes, dump_ir=dump_ir, cache_size=cache_size, outputs=outputs,
                  precision=precision)

    if not isinstance(render_only, bool):
        raise ArgumentError(f"render_only must be True or False, not {render_only!r}")
    if render_only and not REGISTRY[target].generates_code:
        raise ArgumentError(f"render_only: the {target} target generates no code")
    check_optional_bool("cache", cache)
    start = time.perf_counter()
    level = DEFAULT_OPT_LEVEL if opt_level is None else opt_level
    spec = REGISTRY[target]
    graph = load_graph(model, input_shapes)
    machine = spec.target(cpu, precision)
    if precision is None and spec.file_precision is not None:
        machine = spec.target(cpu, spec.file_precision(machine, graph))
    tuned = None
    if tuning_log is not None:
        tuned = ranked_configs(read(tuning_log), machine.key)
    entry = None
    if (compile_cache.enabled(cache is not False) and spec.cached
            and passes is None and dump_ir is None and cache_size is None and not render_only):
        # the imported graph, not the path or bytes: `dnnc compile` passes the graph it imports
        entry = compile_cache.key(graph, target, machine,
                                  {"opt_level": level, "outputs": outputs or spec.returns[0]},
                                  tuned)
        hit = _cached(entry, start, tuning_log, tuned, machine)
        if hit is not None:
            return hit
    check_tensor_sizes(graph, physical_memory_bytes())
    imported_nodes = len(graph.nodes)
    timings: dict[str, float] = {}
    spec.check_compile(machine, render_only)   # before any pass: no device, say so at once
    if spec.runs_passes:
        graph = optimize(graph, machine, level, passes=passes, timings=timings, dump_ir=dump_ir)
    runtime = spec.runtime(graph, level, machine, progress=progress,
                           reuse_memory=levels(level).reuse_memory and passes is None,
                           cache_size=cache_size, tuned=tuned, render_only=render_only,
                           outputs=outputs)
    stats = _stats(graph, runtime, machine, start, imported_nodes, timings,
                   "off" if entry is None else "miss")
    model = CompiledModel(graph, runtime, target, stats)
    summarise(f"compiled {graph.name} for {target}: {stats['kernels']} kernels",
              stats["compile_seconds"], progress)
    if tuning_log is not None:
        model.tuning = {"log": os.fspath(tuning_log), "records_applied": stats["tuned_kernels"]}
        warn_unapplied(tuning_log, tuned, machine.key, stats["kernels"], stats["tuned_kernels"])
    if entry is not None:
        if stats["compile_seconds"] >= compile_cache.MIN_STORE_SECONDS:
            model.keep_in_cache(entry)
        else:   # stored once its calls have compiled enough to be worth keeping
            model._cache_entry = entry
    return model


def _cached(entry, start: float, tuning_log, tuned, machine: Target) -> CompiledModel | None:
    """The compile cache's model for `entry` with this compile's time and tuning log in its
    stats (a log that applied to none of its kernels says so), or None on a miss."""
    parts = compile_cache.lookup(entry)
    if parts is None:
        return None
    hit = CompiledModel.restored(parts)
    hit._stats.update(compile_seconds=time.perf_counter() - start, compile_cache="hit")
    hit._cache_entry = entry   # sizes compiled here are kept too (`keep_in_cache`)
    if tuning_log is not None:
        hit.tuning = {"log": os.fspath(tuning_log),
                      "records_applied": hit.stats.get("tuned_kernels", 0)}
        warn_unapplied(tuning_log, tuned, machine.key, hit.stats.get("kernels", 0),
                       hit.stats.get("tuned_kernels", 0))
    return hit


def _stats(graph: Graph, runtime, machine: Target, start: float, imported_nodes: int,
           timings: dict[str, float], cache_state: str) -> dict:
    """A fresh compile's `CompiledModel.stats`: its time (from `start`), graph and runtime
    figures, and `cache_state` ("off" or "miss")."""
    return {"compile_seconds": time.perf_counter() - start, "nodes": len(graph.nodes),
            "imported_nodes": imported_nodes, "pass_seconds": timings,
            "host_fallback_ops": len(getattr(runtime, "host_fallback_ops", ())),
            "kernels": getattr(runtime, "kernels", 0),
            "arena_bytes": getattr(runtime, "arena_bytes", 0),
            "tuned_kernels": getattr(runtime, "tuned_kernels", 0),
            "precision": machine.precision,
            "compile_cache": cache_state}
