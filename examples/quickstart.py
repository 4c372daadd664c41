"""dnnc's main job on a model it builds itself: build a zoo model, compile it, run it, compare
with the reference, and time it next to onnxruntime.

    python examples/quickstart.py [--model resnet18] [--target llvm] [--batch 1]

The target defaults to the fastest one this machine can run (llvm on a CPU). The reference
is onnxruntime when it is installed (the `test` extra), else dnnc's own numpy target; the
latencies are medians of the same number of calls on the same inputs, onnxruntime with as
many threads as dnnc uses on a CPU (its default beside a GPU target).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dnnc
from dnnc import zoo
from dnnc.backends.registry import default_target, fastest_first

REPEAT, WARMUP = 10, 2


def median_ms(fn) -> float:
    """The median milliseconds of REPEAT calls of `fn`, after WARMUP untimed ones."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def on_host(a) -> np.ndarray:
    """An output as a NumPy array (the cuda target may return arrays on the GPU)."""
    return a.get() if hasattr(a, "__cuda_array_interface__") else np.asarray(a)


def onnxruntime_session(model, threads: int | None):
    """An onnxruntime CPU session with `threads` intra-op threads, or None without it."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", choices=sorted(zoo.MODELS))
    parser.add_argument("--target", default=default_target(), choices=fastest_first())
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    model = zoo.build(args.model, batch=args.batch)
    inputs = zoo.inputs_for(model, np.random.default_rng())
    start = time.perf_counter()
    compiled = dnnc.compile(model, target=args.target)
    print(f"compiled {args.model} for {args.target} in {time.perf_counter() - start:.2f} s: "
          f"{compiled}")
    outputs = [on_host(o) for o in compiled.run(*inputs.values())]

    machine = compiled.runtime.target
    threads = machine.threads if machine.cpu else None   # a GPU target: onnxruntime's default
    session = onnxruntime_session(model, threads)
    if session is not None:
        import onnxruntime

        reference = session.run(None, inputs)
        ref_name = f"onnxruntime {onnxruntime.__version__}"
    else:
        reference = dnnc.compile(model, target="numpy").run(*inputs.values())
        ref_name = "dnnc's numpy target"
    worst = max(float(np.max(np.abs(o.astype(np.float64) - r)))
                for o, r in zip(outputs, reference))
    for o, r in zip(outputs, reference):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5)
    print(f"outputs match {ref_name} (max abs difference {worst:.2e})")

    ours = compiled.benchmark(*inputs.values(), repeat=REPEAT, warmup=WARMUP)["median_ms"]
    print(f"latency, median of {REPEAT} calls (batch {args.batch}"
          f"{f', {threads} thread(s)' if threads else ''}):")
    print(f"  {f'dnnc {args.target}':<19} {ours:10.3f} ms")
    if session is None:
        print("  (install onnxruntime to time it beside dnnc: pip install onnxruntime)")
        return
    theirs = median_ms(lambda: session.run(None, inputs))
    print(f"  {ref_name:<19} {theirs:10.3f} ms")
    print(f"  dnnc / onnxruntime  {ours / theirs:10.2f}  (below 1: dnnc is faster)")


if __name__ == "__main__":
    main()
