"""dnnc's int8 (quantized files) next to dnnc's float32 and onnxruntime's int8, in one run.

    python bench/cpu_int8.py [--models resnet18,mobilenet_v2,bert_tiny] [--size 224]
                             [--threads 1,2] [--repeat 20] [--blocks 3]

Each zoo model is written as float32 and quantized as users do (CNNs: onnxruntime's
quantize_static, QDQ, per-channel int8 weights, int8 activations, calibrated on seeded random
inputs; transformers: quantize_dynamic), then the float file compiled by dnnc, the quantized
file compiled by dnnc (fuse_quantized's integer ops, `dense_int8` on vpdpbusd where the CPU
has VNNI) and run by onnxruntime, the three timed in interleaved blocks of `--repeat` calls,
0.3 s apart, the median block each. Prints the milliseconds, dnnc fp32 / dnnc int8 (the
speedup), dnnc int8 / onnxruntime int8, and their geometric means; one table per thread
count (each in a process of its own: DNNC_NUM_THREADS is read when the worker pool starts).
Timing only: what it computes is checked by tests/models/test_quantized_files.py and
tests/backends/llvm/test_int8.py, never here.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm import int8  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402
from dnnc.testing.quantized_files import quantize_dynamic, quantize_static  # noqa: E402

TRANSFORMERS = ("bert", "bert_tiny", "bert_base")


def median_block_ms(fns: dict, repeat: int, blocks: int) -> dict:
    """name -> the median of `blocks` blocks' median call, the blocks interleaved."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(blocks):
        for key, fn in fns.items():
            time.sleep(0.3)   # the previous block's workers go idle
            times[key].append(float(np.median(call_times_ms(fn, repeat, 2))))
    return {k: float(np.median(v)) for k, v in times.items()}


def one_model(name: str, size: int, folder: Path, threads: int, repeat: int, blocks: int):
    import onnxruntime as ort

    config = {} if name in TRANSFORMERS else {"size": size}
    model = zoo.build(name, **config)
    path = quantize_dynamic(model, folder, name) if name in TRANSFORMERS else \
        quantize_static(model, folder, name)
    feeds = zoo.inputs_for(model, np.random.default_rng(0))
    fp32 = dnnc.compile(model, "llvm")
    q8 = dnnc.compile(str(path), "llvm")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    fns = {"fp32": lambda: fp32(**feeds), "int8": lambda: q8(**feeds),
           "ort": lambda: session.run(None, feeds)}
    return median_block_ms(fns, repeat, blocks)


def table(args) -> None:
    threads = int(args.one)
    cpu = host_target()
    path = "vpdpbusd" if int8.native(cpu.feature_set) else "widening (no VNNI)"
    print(f"# {platform.node()} {cpu.cpu}, int8 products: {path}, {threads} thread(s); "
          f"dnnc {dnnc.__version__}, onnxruntime {__import__('onnxruntime').__version__}")
    print(f"{'model':14} {'fp32 ms':>9} {'int8 ms':>9} {'ort ms':>9} {'fp32/int8':>10} "
          f"{'int8/ort':>9}")
    speedups, versus = [], []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            ms = one_model(name, args.size, Path(folder), threads, args.repeat, args.blocks)
            speedups.append(ms["fp32"] / ms["int8"])
            versus.append(ms["int8"] / ms["ort"])
            print(f"{name:14} {ms['fp32']:9.2f} {ms['int8']:9.2f} {ms['ort']:9.2f} "
                  f"{speedups[-1]:10.2f} {versus[-1]:9.2f}", flush=True)
    gm = [math.exp(sum(map(math.log, xs)) / len(xs)) for xs in (speedups, versus)]
    print(f"{'geomean':14} {'':9} {'':9} {'':9} {gm[0]:10.2f} {gm[1]:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_tiny")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)   # one thread count, in this process
    args = parser.parse_args()
    if args.one:
        table(args)
        return
    for n in args.threads.split(","):
        env = {**os.environ, "DNNC_NUM_THREADS": n}
        subprocess.run([sys.executable, __file__, "--one", n, "--models", args.models,
                        "--size", str(args.size), "--repeat", str(args.repeat),
                        "--blocks", str(args.blocks)], env=env, check=True)


if __name__ == "__main__":
    main()
