"""Half precision stored end to end (issue 31, item 4): per zoo model, dnnc's cuda time at fp32
and at fp16 / bf16 (weights and activations stored in that type, products on tensor cores),
and the error of the half outputs against dnnc's fp32 ones.

    python bench/half_storage.py [--models resnet50:32,bert_base:8,...] [--precisions fp16,bf16]
                                 [--repeat 50] [--warmup 10]

A model is `name` or `name:batch` (default: the zoo's classifiers at batch 32, the berts at
8). Prints the machine and versions first, then one row per model and precision:
- fp32 ms, half ms: median of a call with CuPy arrays in and out, each followed by a stream
  synchronize (the CUDA graph replay: what a caller keeping its data on the GPU sees);
- speedup: fp32 ms / half ms;
- error: max |half - fp32| / max |fp32| over the outputs, on the same random inputs, and the
  documented bound (`ir.target.model_error_bound`, docs/cuda_backend.md "Precision");
- bytes: the arena's bytes (`stats["arena_bytes"]`) at half over fp32's.
A closing line says whether every row is within its bound.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.cuda import device  # noqa: E402
from dnnc.ir.target import model_error_bound  # noqa: E402
from gpu_timing import header, median_ms  # noqa: E402

DEFAULT_MODELS = ["mlp:32", "cnn:32", "resnet18:32", "resnet50:32", "mobilenet_v2:32",
                  "bert_tiny:8", "bert_base:8"]


def device_ms(compiled, inputs: list[np.ndarray], repeat: int, warmup: int) -> float:
    import cupy

    on_device = [cupy.asarray(a) for a in inputs]
    stream = cupy.cuda.get_current_stream()

    def call():
        compiled(*on_device)
        stream.synchronize()

    return median_ms(call, repeat, warmup)


def relative_error(got: list, want: list) -> float:
    """max |got - want| / max |want| over paired outputs."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w, np.float64)
        scale = np.abs(w).max() if w.size else 1.0
        worst = max(worst, float(np.abs(np.asarray(g, np.float64) - w).max() / scale))
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--precisions", default="fp16")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args(argv)
    device.import_cupy()
    print(header(), flush=True)
    print(f"{'model':<20} {'prec':<5} {'fp32 ms':>9} {'half ms':>9} {'speedup':>8} "
          f"{'error':>9} {'bound':>9} {'bytes':>6} {'compile s':>10}")
    within = True
    for spec in args.models.split(","):
        name, _, batch = spec.partition(":")
        model = zoo.build(name, batch=int(batch or 1))
        inputs = list(zoo.inputs_for(model, np.random.default_rng(0)).values())
        fp32 = dnnc.compile(model, "cuda", progress=False)
        want = [np.asarray(x) for x in _outputs(fp32.run(*inputs, to="numpy"))]
        base = device_ms(fp32, inputs, args.repeat, args.warmup)
        for precision in args.precisions.split(","):
            start = time.perf_counter()
            half = dnnc.compile(model, "cuda", precision=precision, progress=False)
            seconds = time.perf_counter() - start
            got = _outputs(half.run(*inputs, to="numpy"))
            error, bound = relative_error(got, want), model_error_bound(precision)
            within &= error <= bound
            ms = device_ms(half, inputs, args.repeat, args.warmup)
            nbytes = half.stats.get("arena_bytes", 0) / max(1, fp32.stats.get("arena_bytes", 1))
            print(f"{spec:<20} {precision:<5} {base:9.3f} {ms:9.3f} {base / ms:8.2f} "
                  f"{error:9.2e} {bound:9.2e} {nbytes:6.2f} {seconds:10.1f}", flush=True)
    print(f"every output within the documented bound: {'PASS' if within else 'FAIL'}")
    return 0 if within else 1


def _outputs(result) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


if __name__ == "__main__":
    sys.exit(main())
