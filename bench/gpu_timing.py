"""How the GPU benchmarks (bench/gpu.py, bench/gpu_torch.py) describe the machine, time a call
and compare outputs, so that dnnc's and PyTorch's columns are measured the same way.

- `header()`: the first line of every GPU benchmark (GPU, driver, CUDA runtime, NVRTC, CuPy,
  torch and onnxruntime versions);
- `median_ms(fn, ...)`: the median of `fn`'s wall time by perf_counter, where `fn` ends with
  its own synchronize (a CuPy stream's, or torch.cuda.synchronize), so a call is the latency a
  caller keeping its data on the GPU sees;
- `torch_medians(module, inputs, ...)`: PyTorch eager, torch.compile (default) and
  torch.compile(mode="reduce-overhead") timed that way, float32 with TF32 off (`fp32_only`);
- `torch_cells(medians, dnnc_ms)`: those medians and dnnc's ratio to each, as table cells;
- `error_ratio(got, want)`: the largest |got - want| in units of the project's tolerance,
  atol 1e-4 + rtol 1e-3 |want| (<= 1 passes);
- kernel timing by CUDA events (bench/gpu_kernels.py, bench/gpu_attention.py): `event_ms`,
  `cupy_timer`, `torch_timer`, and `interleaved_ms` (variants timed in turn, trial by
  trial); `launch_args`, a rendered kernel's arguments (scratch and tensor maps made).
Needs CuPy (header) and, for the torch functions, torch; never imported by dnnc.
"""

from __future__ import annotations

import multiprocessing
import platform
import sys
import time
import traceback
from typing import Callable

import numpy as np

from dnnc.backends.cuda import device, tensor_map
from dnnc.compiler.module import call_times_ms

RTOL, ATOL = 1e-3, 1e-4
TORCH_MODES = ("eager", "default", "reduce-overhead")
"""PyTorch's columns: the module itself, then torch.compile in its default mode and with
mode="reduce-overhead" (CUDA graphs: the anchor dnnc's graph replay is measured against)."""


def launch_args(cp, info, params: list) -> tuple:
    """The arguments of a kernel launched by hand (`info`: its `codegen.CudaKernel`): its
    parameters (`params`, device arrays in order), a scratch array a workspace buffer, then
    its tensor maps (TMA copies': the dense default's at fp16 / bf16 on sm_90) built from the
    parameters' addresses."""
    maps = [cp.asarray(tensor_map.kernel_map(m, params[m.param].data.ptr))
            for m in info.tensor_maps]
    return tuple(list(params) + [cp.empty(size, cp.uint8) for size in info.workspace] + maps)


def header() -> str:
    v = device.versions()
    parts = [f"gpu {device.describe()}", f"driver {v['driver']}", f"cuda runtime {v['runtime']}",
             f"nvrtc {v['nvrtc']}", f"cupy {v['cupy']}"]
    for name in ("torch", "onnxruntime"):
        try:
            module = __import__(name)
            parts.append(f"{name} {module.__version__}")
        except ImportError:
            parts.append(f"{name} not installed")
    parts.append(f"python {platform.python_version()}, dnnc module cache {device.cache_dir()}")
    return ", ".join(parts)


def median_ms(fn, repeat: int, warmup: int) -> float:
    """Median milliseconds of `fn()`, which must end with its own synchronize."""
    return float(np.median(call_times_ms(fn, repeat, warmup)))


def error_ratio(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """max |got - want| / (ATOL + RTOL |want|) over paired outputs; inf on a shape mismatch."""
    worst = 0.0
    for out, ref in zip(got, want, strict=True):
        if out.shape != ref.shape:
            return float("inf")
        ref = ref.astype(np.float64)
        err = np.abs(out.astype(np.float64) - ref) / (ATOL + RTOL * np.abs(ref))
        worst = max(worst, float(np.max(err)) if err.size else 0.0)
    return worst


def fp32_only() -> None:
    """Float32 arithmetic in torch, as dnnc's kernels compute: no TF32 in matmuls or cuDNN."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def cuda_torch():
    """The torch module, float32 arithmetic set (`fp32_only`), where it is installed and
    sees a GPU; None otherwise (the benchmarks then leave torch's columns out)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    fp32_only()
    return torch


def torch_medians(module, inputs: list, repeat: int, warmup: int,
                  compile_modes: bool = True) -> dict[str, float | None]:
    """Median ms of `module(*inputs)` per mode of TORCH_MODES (CUDA tensors in and out, each
    call ended by torch.cuda.synchronize); the compile modes only with `compile_modes`. A mode
    that fails is None, its traceback on stderr, so the other columns still print."""
    import torch

    def timed(fn):
        def call():
            fn(*inputs)
            torch.cuda.synchronize()
        return median_ms(call, repeat, warmup)

    medians: dict[str, float | None] = {}
    with torch.no_grad():
        medians["eager"] = timed(module)
        for mode in TORCH_MODES[1:] if compile_modes else ():
            try:
                # a fresh dynamo cache per model: the zoo's mirrors share forward()s, and
                # recompiles of one code object count towards dynamo's recompile limit
                torch._dynamo.reset()
                compiled = torch.compile(module, mode=None if mode == "default" else mode)
                for _ in range(3):   # compile (and record the CUDA graph) outside the timing
                    compiled(*inputs)
                medians[mode] = timed(compiled)
            except Exception:   # one mode's failure must not hide the others
                traceback.print_exc(file=sys.stderr)
                medians[mode] = None
    return medians


def torch_cells(medians: dict[str, float | None], dnnc_ms: float) -> tuple[str, str]:
    """The medians of TORCH_MODES (8 wide) and dnnc's ratio to each (6 wide); "-" where a mode
    was not timed."""
    times = " ".join(f"{medians[m]:8.3f}" if medians.get(m) else f"{'-':>8}"
                     for m in TORCH_MODES)
    ratios = " ".join(f"{dnnc_ms / medians[m]:6.2f}" if medians.get(m) else f"{'-':>6}"
                      for m in TORCH_MODES)
    return times, ratios


def cache_module(source: str, arch: str) -> None:
    """Rendered `source` compiled by NVRTC for a GPU of `arch` (as `load_module` would) into
    the on-disk module cache, not loaded: a pool worker's part of `compile_in_processes`."""
    target = device.compile_arch(arch, source)
    device.ModuleCache().get(source, target, device.nvrtc_options(target))


def compile_in_processes(worker, jobs: list, processes: int) -> None:
    """`worker(job)` for every job, in `processes` spawned processes at once (each filling
    the on-disk module cache: NVRTC is most of a layer bench's time on the device), the
    time printed."""
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(worker, jobs, chunksize=1)
    print(f"# {len(jobs)} layers' modules compiled in {processes} processes in "
          f"{time.perf_counter() - start:.0f} s", flush=True)


def load_module(cp, source: str):
    """The compiled module of rendered `source`, as the runtime compiles it (NVRTC, for this
    GPU: sm_90a where it uses wgmma, `device.compile_arch`), loaded."""
    arch = device.compile_arch(device.gpu_arch(), source)
    module = cp.cuda.function.Module()
    module.load(device.ModuleCache().get(source, arch, device.nvrtc_options(arch)))
    return module


def kernel_launcher(cp, raw, module, func, kernel, x_dev, out_dtype=None,
                    stored=lambda a: a):
    """(a function launching `func`'s stages once, its output array) for the lowered
    `kernel`, compiled in `module` and loaded as `raw`: `x_dev` its one non-constant input,
    the constants as `stored` makes them, the output zeroed in `out_dtype` (default: its own
    type)."""
    info = module.kernels[func.name]
    ins = [x_dev if v.const is None else cp.asarray(stored(np.ascontiguousarray(v.const)))
           for v in kernel.inputs]
    (out_value,) = kernel.outputs
    out = cp.zeros(out_value.type.shape, out_dtype or out_value.type.dtype.np)
    args = launch_args(cp, info, ins + [out])
    launches = []
    for lc in info.launches:
        fn = raw.get_function(lc.name)
        device.allow_shared(fn, lc.shared_bytes)
        launches.append((fn, lc))

    def launch():
        for fn, lc in launches:
            fn(lc.grid, lc.block, args, shared_mem=lc.shared_bytes)

    return launch, out


def event_ms(cp, fn, repeat: int, trials: int) -> float:
    """Median over `trials` of the mean ms of `repeat` back-to-back calls of `fn`."""
    return interleaved_ms([cupy_timer(cp, fn)], repeat, trials)[0]


def cupy_timer(cp, fn) -> Callable[[int], float]:
    """A function timing `repeat` back-to-back calls of `fn` (on CuPy's current stream) by
    CUDA events: their mean ms."""
    def once(repeat: int) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / repeat
    return once


def torch_timer(call) -> Callable[[int], float]:
    """As `cupy_timer`, for a torch call (torch's events, on torch's current stream)."""
    import torch

    def once(repeat: int) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeat
    return once


def torch_graph_timer(call) -> Callable[[int], float]:
    """As `torch_timer`, with the `repeat` calls captured once into a CUDA graph and
    replayed: the GPU time of the kernels alone, without the host's cost of issuing them (a
    cuDNN convolution's host side takes longer than its kernel at small shapes, so calls
    issued back to back time the host)."""
    import torch

    graphs: dict[int, object] = {}

    def once(repeat: int) -> float:
        if repeat not in graphs:
            call()   # (workspaces allocated, algorithms chosen: outside the capture)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(repeat):
                    call()
            graphs[repeat] = graph
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graphs[repeat].replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeat
    return once


def cupy_graph_timer(cp, fn) -> Callable[[int], float]:
    """As `cupy_timer`, with the `repeat` calls captured once into a CUDA graph (on a
    stream of its own: nothing in `fn` may allocate or synchronise) and replayed: the GPU
    time of the kernels alone, as `torch_graph_timer`'s (and as a model's captured graph
    runs them)."""
    stream = cp.cuda.Stream(non_blocking=True)
    graphs: dict[int, object] = {}

    def once(repeat: int) -> float:
        with stream:
            if repeat not in graphs:
                fn()
                stream.synchronize()
                stream.begin_capture()
                for _ in range(repeat):
                    fn()
                graphs[repeat] = stream.end_capture()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graphs[repeat].launch(stream)
            end.record(stream)
            end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / repeat
    return once


def interleaved_ms(timers: list, repeat: int, trials: int) -> list[float]:
    """Each timer's median ms over `trials`, the trials taken in turn (A, B, C, A, B, C,
    ...): clock, thermal and L2 drift over the run fall on every variant alike, so the
    variants of one case compare fairly (timed one after another, the softmax's default and
    its cache_row=False variant, whose PTX differs only in instruction order, read 0.62
    and 0.87 of copy on an H100: not the code's doing)."""
    for once in timers:   # warm-up: compiled, clocks up
        once(max(1, repeat // 10))
    times: list[list[float]] = [[] for _ in timers]
    for _ in range(trials):
        for k, once in enumerate(timers):
            times[k].append(once(repeat))
    return [float(np.median(t)) for t in times]
