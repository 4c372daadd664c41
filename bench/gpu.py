"""dnnc's cuda target on the zoo: latency per model, checked against onnxruntime (CPU).

    python bench/gpu.py [--models mlp,cnn,resnet18,bert_tiny] [--big] [--repeat 50]
                        [--warmup 10] [--cold] [--no-check]

Prints the GPU, driver, CUDA runtime, NVRTC, CuPy, torch and onnxruntime versions first, then
one row per model at batch 1 (`--big` adds resnet50 at batch 32 and bert_base at batch 8):
- compile: seconds of `dnnc.compile` (passes, rendering, NVRTC or the module cache, uploads);
  with `--cold` the first compile uses an empty module cache and a second compile is timed
  warm (the issue's bars: resnet50 <= 30 s cold, <= 3 s warm);
- host ms: median of `model(x)` with NumPy in and out (copies included), each call ended by
  the device-to-host copy, which synchronises;
- device ms: median of a call with CuPy arrays in and out (`runtime.outputs = "cupy"`), each
  call followed by a stream synchronize, timed with perf_counter: what a caller keeping its
  data on the GPU sees (the CUDA graph replay and its input copy);
- check: largest |dnnc - onnxruntime| over (atol + rtol |onnxruntime|) with rtol 1e-3,
  atol 1e-4 (<= 1 passes), on the same random inputs.
PyTorch columns need a torch mirror of the zoo (not in this slice): torch's version is shown.
TF32 is not used: the cuda target's kernels compute in fp32.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402
from dnnc.backends.cuda import device  # noqa: E402

DEFAULT_MODELS = ["mlp", "cnn", "resnet18", "resnet50", "mobilenet_v2", "bert_tiny", "bert_base"]
BIG = [("resnet50", 32), ("bert_base", 8)]
RTOL, ATOL = 1e-3, 1e-4


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
    return float(np.median(call_times_ms(fn, repeat, warmup)))


def check(model, feeds, outputs) -> float | None:
    """max |out - ref| / (atol + rtol |ref|) against onnxruntime's CPU provider, or None."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    worst = 0.0
    for out, ref in zip(outputs, expected):
        if out.shape != ref.shape:
            return float("inf")
        ref = ref.astype(np.float64)
        err = np.abs(out.astype(np.float64) - ref) / (ATOL + RTOL * np.abs(ref))
        worst = max(worst, float(np.max(err)) if err.size else 0.0)
    return worst


def bench(name: str, batch: int, args) -> str:
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
    outputs = compiled.run(*inputs)
    host = median_ms(lambda: compiled.run(*inputs), args.repeat, args.warmup)
    on_device = [cupy.asarray(a) for a in inputs]
    compiled.runtime.outputs = "cupy"
    stream = cupy.cuda.get_current_stream()

    def device_call():
        compiled.run(*on_device)
        stream.synchronize()

    dev = median_ms(device_call, args.repeat, args.warmup)
    compiled.runtime.outputs = "numpy"
    worst = None if args.no_check else check(model, feeds, outputs)
    verdict = "n/a" if worst is None else f"{worst:.3f} {'ok' if worst <= 1 else 'FAIL'}"
    return (f"{name:<14} {batch:>5} {stats['kernels']:>7} {stats['host_fallback_ops']:>6} "
            f"{cold:>9.2f} {warm:>7} {host:>9.3f} {dev:>9.3f}  {verdict}")


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
    args = parser.parse_args()
    try:
        device.import_cupy()
    except dnnc.errors.DeviceError as exc:
        print(f"bench/gpu.py: {exc}", file=sys.stderr)
        return 2
    if args.cold:
        os.environ["DNNC_CACHE_DIR"] = tempfile.mkdtemp(prefix="dnnc-cold-")
    print(header())
    print(f"median of {args.repeat} calls after {args.warmup} warm-up; check: max error / "
          f"(atol {ATOL:g} + rtol {RTOL:g} |ref|) against onnxruntime CPU")
    print(f"{'model':<14} {'batch':>5} {'kernels':>7} {'fallbk':>6} {'compile s':>9} "
          f"{'warm s':>7} {'host ms':>9} {'device ms':>9}  check")
    cases = [(m, 1) for m in args.models.split(",") if m] + (BIG if args.big else [])
    failed = 0
    for name, batch in cases:
        try:
            print(bench(name, batch, args), flush=True)
        except Exception as exc:   # one model's failure must not hide the others' rows
            failed += 1
            print(f"{name:<14} {batch:>5} error: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
            traceback.print_exc(file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
