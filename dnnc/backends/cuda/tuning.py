"""What the autotuner (`dnnc/autotune/`) needs from the cuda target: the template and problem
of a kernel, the kernel built with a config, and a compiled kernel to call on arrays (the
same three functions as `backends/llvm/tuning.py`), plus how to measure it safely. A kernel
with TMA copies gets its tensor maps built here from the device copies' addresses.

A CUDA context does not survive `fork`: the tuner's process asks the GPU its architecture
(its `Target`), so each candidate runs in a child of a fork server started fresh
(`START_METHOD`), which has imported this module and CuPy but never touched the GPU. The
child compiles the candidate with NVRTC (through the on-disk module cache), copies the
arrays to the device once, and times its launches with CUDA events (`time_ms`): a batch of
launches per sample, so a launch's host cost is not the kernel's time. A candidate that
faults (an illegal address poisons the context) takes its child down, not the tuner.
"""

from __future__ import annotations

import numpy as np

from ...ir import loop as L
from ...ir.target import Target
from ..lower import Kernel
from . import device, tensor_map
from .codegen import render_module
from .schedules import schedule_kernel, template_for as _template_for

START_METHOD = "forkserver"
"""How `autotune.measure` starts a candidate's worker process for this target."""


def template_for(kernel: Kernel, machine: Target | None = None):
    """(template, problem) of `kernel` on cuda (`machine`: the Target compiled for)."""
    return _template_for(kernel, "cuda", machine)


def build(kernel: Kernel, target: Target, config) -> L.PrimFunc:
    """`kernel` scheduled with `config` (a config of its template's space: ConfigError
    otherwise)."""
    return schedule_kernel(kernel, target, config=config)


def compile_kernel(func: L.PrimFunc, arrays: list[np.ndarray], target: Target):
    """A function of no arguments running `func` (compiled alone, for `target.arch`) on
    device copies of `arrays` (its params in order) and waiting for it; `call.fetch()` copies
    the device arrays back into `arrays`, `call.time_ms(repeat, min_seconds)` times it."""
    cupy = device.import_cupy()
    func = L.index_checks.with_errors(func)   # a record to write, never read: tuning data
    if L.index_checks.INDEX_ERRORS in func.params:
        arrays = list(arrays) + [np.zeros(3, np.int64)]
    module = render_module([(func, True)])   # the arrays are distinct: no aliasing
    kernel = module.kernels[func.name]
    arch = device.compile_arch(target.arch, module.source)
    cubin = device.ModuleCache().get(module.source, arch, device.nvrtc_options(arch))
    loaded = cupy.cuda.function.Module()
    loaded.load(cubin)
    on_device = [cupy.asarray(a) for a in arrays]
    workspace = [cupy.cuda.alloc(max(n, 1)) for n in kernel.workspace]
    maps = [cupy.asarray(tensor_map.kernel_map(m, on_device[m.param].data.ptr))
            for m in kernel.tensor_maps]   # (TMA copies': after the workspace)
    args = tuple(np.uint64(a.data.ptr) for a in on_device) + \
        tuple(np.uint64(w.ptr) for w in workspace) + tuple(np.uint64(m.data.ptr) for m in maps)
    launches = []
    for launch in kernel.launches:
        fn = loaded.get_function(launch.name)
        device.allow_shared(fn, launch.shared_bytes)
        launches.append((fn, launch))
    stream = cupy.cuda.Stream(non_blocking=True)

    def run() -> None:
        for fn, launch in launches:
            fn(launch.grid, launch.block, args, shared_mem=launch.shared_bytes, stream=stream)

    def call() -> None:
        run()
        stream.synchronize()

    def fetch() -> None:
        for host, dev in zip(arrays, on_device):
            dev.get(out=host, stream=stream)
        stream.synchronize()

    def time_ms(repeat: int, min_seconds: float) -> float:
        """Median milliseconds of one run over `repeat` samples, each a batch of runs
        between two CUDA events lasting at least `min_seconds`."""
        start, end = cupy.cuda.Event(), cupy.cuda.Event()

        def batch(n: int) -> float:
            start.record(stream)
            for _ in range(n):
                run()
            end.record(stream)
            end.synchronize()
            return cupy.cuda.get_elapsed_time(start, end) / 1e3

        n = 1
        while batch(n) < min_seconds and n < 1 << 16:
            n *= 2
        return float(np.median([batch(n) / n for _ in range(repeat)])) * 1e3

    call.fetch, call.time_ms = fetch, time_ms
    call.keep = (loaded, on_device, workspace, maps, stream)   # alive as long as the function
    return call
