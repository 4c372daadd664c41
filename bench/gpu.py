"""dnnc's cuda target on the zoo: latency per model, checked against onnxruntime (CPU).

    python bench/gpu.py [--models mlp,cnn,resnet18,bert_tiny] [--big] [--repeat 50]
                        [--warmup 10] [--cold] [--no-check] [--no-torch] [--no-compile]

Prints the GPU, driver, CUDA runtime, NVRTC, CuPy, torch and onnxruntime versions first, then
one row per model at batch 1 (`--big` adds resnet50 at batch 32 and bert_base at batch 8):
- compile: seconds of `dnnc.compile` (passes, rendering, NVRTC or the module cache, uploads);
  with `--cold` the first compile uses an empty module cache and a second compile is timed
  warm (the issue's bars: resnet50 <= 30 s cold, <= 3 s warm);
- host ms: median of `model(x)` with NumPy in and out (copies included), each call ended by
  the device-to-host copy, which synchronises;
- device ms: median of a call with CuPy arrays in and out (the cuda target's default), each
  call followed by a stream synchronize, timed with perf_counter: what a caller keeping its
  data on the GPU sees (the CUDA graph replay, reading the reused input buffers in place,
  and the output's device copy);
- check: largest |dnnc - onnxruntime| over (atol + rtol |onnxruntime|) with rtol 1e-3,
  atol 1e-4 (<= 1 passes), on the same random inputs.
Where torch is importable and sees the GPU (and without `--no-torch`), each row goes on with
PyTorch on the same weights, through bench/zoo_torch.py's mirror of the zoo model, timed as the
device column (CUDA tensors in and out, each call ended by a synchronize): eager, torch.compile
default and mode="reduce-overhead" (`--no-compile` skips those two: they take a while to
compile), dnnc's device ms over each, and the largest error of dnnc's GPU output against the
mirror's (eager) in the same units as check. A closing block states issue 12's bars: every
batch-1 row faster than eager; the geometric mean of dnnc / reduce-overhead over the batch-1
rows <= 1.2; the `--big` rows within 1.3x of the best torch mode.
TF32 is not used: the cuda target's kernels compute in fp32, and torch runs with TF32 off
(matmul and cuDNN) and float32 matmul precision "highest".
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.cuda import device  # noqa: E402
from gpu_timing import (ATOL, RTOL, TORCH_MODES, error_ratio, fp32_only, header,  # noqa: E402
                        median_ms, torch_cells, torch_medians)

DEFAULT_MODELS = ["mlp", "cnn", "resnet18", "resnet50", "mobilenet_v2", "bert_tiny", "bert_base"]
BIG = [("resnet50", 32), ("bert_base", 8)]
# issue 12's bars against PyTorch
EAGER_BAR = 1.0           # every batch-1 row: dnnc / eager below this
REDUCE_OVERHEAD_BAR = 1.2  # geometric mean over the batch-1 rows of dnnc / reduce-overhead
BIG_BAR = 1.3             # the --big rows: dnnc / the best torch mode


def check(model, feeds, outputs) -> float | None:
    """max |out - ref| / (atol + rtol |ref|) against onnxruntime's CPU provider, or None."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return error_ratio(outputs, session.run(None, feeds))


def verdict(worst: float | None) -> str:
    return "n/a" if worst is None else f"{worst:.3f} {'ok' if worst <= 1 else 'FAIL'}"


def torch_columns(model, feeds, dnnc_outputs, dnnc_ms: float, args) -> tuple[str, dict]:
    """PyTorch's cells of a row (its medians, dnnc's ratios to them, dnnc's error against the
    mirror) and the medians by mode, on the zoo model's own weights."""
    import torch
    from zoo_torch import module_for

    module = module_for(model).cuda()
    inputs = [torch.from_numpy(a).cuda() for a in feeds.values()]
    with torch.no_grad():
        want = [module(*inputs).cpu().numpy()]
    medians = torch_medians(module, inputs, args.repeat, args.warmup,
                            compile_modes=not args.no_compile)
    times, ratios = torch_cells(medians, dnnc_ms)
    return f"{times} {ratios}  {verdict(error_ratio(dnnc_outputs, want))}", medians


def bench(name: str, batch: int, args) -> tuple[str, dict]:
    """A row of the table and its figures: dnnc's device ms, and torch's medians by mode."""
    import cupy

    model = zoo.build(name, batch=batch)
    feeds = zoo.inputs_for(model, np.random.default_rng(0))
    start = time.perf_counter()
    compiled = dnnc.compile(model, "cuda")
    cold = time.perf_counter() - start
    warm = ""
    if args.cold:
        start = time.perf_counter()
        compiled = dnnc.compile(model, "cuda")
        warm = f"{time.perf_counter() - start:7.2f}"
    stats = compiled.stats
    inputs = list(feeds.values())
    outputs = compiled.run(*inputs, to="numpy")
    host = median_ms(lambda: compiled.run(*inputs, to="numpy"), args.repeat, args.warmup)
    on_device = [cupy.asarray(a) for a in inputs]
    stream = cupy.cuda.get_current_stream()

    def device_call():
        compiled.run(*on_device)
        stream.synchronize()

    dev = median_ms(device_call, args.repeat, args.warmup)
    device_outputs = compiled.run(*on_device, to="numpy")
    worst = None if args.no_check else check(model, feeds, outputs)
    row = (f"{name:<14} {batch:>5} {stats['kernels']:>7} {stats['host_fallback_ops']:>6} "
           f"{cold:>9.2f} {warm:>7} {host:>9.3f} {dev:>9.3f}  ")
    figures = {"device": dev}
    if not args.torch:
        return row + verdict(worst), figures
    cells, medians = torch_columns(model, feeds, device_outputs, dev, args)
    figures.update(medians)
    return f"{row}{verdict(worst):<10} {cells}", figures


def _batch_one_bars(single: list[tuple[str, dict]]) -> list[str]:
    """Every batch-1 row faster than eager; the geometric mean of dnnc / reduce-overhead over
    them within its bar (a row without a timing fails the bar it lacks)."""
    timed = [(name, f) for name, f in single if f.get("eager")]
    slower = [f"{name} {f['device'] / f['eager']:.2f}x" for name, f in timed
              if f["device"] / f["eager"] >= EAGER_BAR]
    lines = [f"batch 1, dnnc faster than eager: {len(timed) - len(slower)} of {len(single)} "
             "rows " + (f"FAIL ({', '.join(slower)})" if slower or len(timed) < len(single)
                        else "ok")]
    ratios = [f["device"] / f["reduce-overhead"] for _, f in single if f.get("reduce-overhead")]
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        ok = geo <= REDUCE_OVERHEAD_BAR and len(ratios) == len(single)
        lines.append(f"batch 1, geometric mean of dnnc / reduce-overhead over {len(ratios)} of "
                     f"{len(single)} rows: {geo:.2f} (bar <= {REDUCE_OVERHEAD_BAR}) "
                     f"{'ok' if ok else 'FAIL'}")
    else:
        lines.append("batch 1, geometric mean of dnnc / reduce-overhead: n/a (no reduce-overhead "
                     "timings)")
    return lines


def issue_bars(rows: list[tuple[str, int, dict]]) -> list[str]:
    """Issue 12's bars over the rows that ran: (name, batch, {"device": ms, mode: ms or None})."""
    single = [(name, figures) for name, batch, figures in rows if batch == 1]
    lines = _batch_one_bars(single) if single else []
    for name, batch, figures in rows:
        if batch == 1:
            continue
        modes = {m: figures[m] for m in TORCH_MODES if figures.get(m)}
        if not modes:
            lines.append(f"{name} batch {batch}: n/a (no torch timings)")
            continue
        best = min(modes, key=modes.get)
        ratio = figures["device"] / modes[best]
        lines.append(f"{name} batch {batch}: dnnc / best torch ({best}) {ratio:.2f} (bar <= "
                     f"{BIG_BAR}) {'ok' if ratio <= BIG_BAR else 'FAIL'}")
    return lines


def torch_available(args) -> str | None:
    """Why the torch columns are off, or None when they are on."""
    if args.no_torch:
        return "--no-torch"
    try:
        import torch
    except ImportError:
        return "torch not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated zoo models (default: every preset)")
    parser.add_argument("--big", action="store_true",
                        help="also resnet50 at batch 32 and bert_base at batch 8")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--cold", action="store_true",
                        help="compile with an empty module cache, then again warm")
    parser.add_argument("--no-check", action="store_true", help="skip onnxruntime")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip the PyTorch columns (eager, torch.compile)")
    parser.add_argument("--no-compile", action="store_true",
                        help="PyTorch eager only: skip torch.compile's two modes")
    args = parser.parse_args()
    try:
        device.import_cupy()
    except dnnc.errors.DeviceError as exc:
        print(f"bench/gpu.py: {exc}", file=sys.stderr)
        return 2
    if args.cold:
        os.environ["DNNC_CACHE_DIR"] = tempfile.mkdtemp(prefix="dnnc-cold-")
    torch_off = torch_available(args)
    args.torch = torch_off is None
    print(header())
    print(f"median of {args.repeat} calls after {args.warmup} warm-up; check: max error / "
          f"(atol {ATOL:g} + rtol {RTOL:g} |ref|) against onnxruntime CPU")
    columns = (f"{'model':<14} {'batch':>5} {'kernels':>7} {'fallbk':>6} {'compile s':>9} "
               f"{'warm s':>7} {'host ms':>9} {'device ms':>9}  check")
    if args.torch:
        fp32_only()
        print("torch: the zoo's weights through bench/zoo_torch.py, fp32 (TF32 off, matmul "
              "precision highest), ms with CUDA tensors in and out; /x = dnnc device ms over x; "
              "vs torch: dnnc's error against eager in check's units")
        columns += (f"{'':<5} {'eager':>8} {'compile':>8} {'reduce-o':>8} {'/eager':>6} "
                    f"{'/comp':>6} {'/r-o':>6}  vs torch")
    else:
        print(f"torch columns off: {torch_off}")
    print(columns)
    cases = [(m, 1) for m in args.models.split(",") if m] + (BIG if args.big else [])
    rows, failed = [], []
    for name, batch in cases:
        try:
            row, figures = bench(name, batch, args)
            print(row, flush=True)
            rows.append((name, batch, figures))
        except Exception as exc:   # one model's failure must not hide the others' rows
            failed.append(f"{name} batch {batch}")
            print(f"{name:<14} {batch:>5} error: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
            traceback.print_exc(file=sys.stderr)
    if args.torch and rows:
        print("issue 12's bars" + (f" (rows that failed: {', '.join(failed)})" if failed else "")
              + ":")
        for line in issue_bars(rows):
            print(f"  {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
