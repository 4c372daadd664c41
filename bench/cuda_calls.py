"""What one cuda call costs by the way it is called, and what reading inputs in place costs.

    PYTHONPATH=$PWD python bench/cuda_calls.py [--models mlp,cnn,resnet18,bert_tiny]
                                               [--repeat 200] [--warmup 20]

Per model at batch 1, the median microseconds of one call (perf_counter, each call ended by a
synchronize of the stream it ran on):
- np>np: NumPy input, NumPy output (a copy each way, the output's synchronising);
- np>cp: NumPy input, CuPy output (the cuda target's default);
- cp new: a CuPy input at an address the frame has not met lately (cycled through more
  arrays than `SEEN_PER_FRAME`): copied device to device into the frame's buffer;
- cp reused: one CuPy input buffer for every call: read in place by its own CUDA graph;
- torch reused: the same with a PyTorch tensor (run on torch's current stream; "-" without
  torch);
- capture: a call whose input address comes for the second time: the capture and
  instantiation of a graph for it, then the call (what a caller pays once per buffer);
- out copy: the device copy of the outputs each call hands over (what returning a view of the
  frame's buffer, overwritten by the next call, would save).
"check" compares every path's outputs, and a reused buffer's after its contents change, with
the NumPy path's on the same data (rtol 1e-5, atol 1e-6: the same kernels); any mismatch
prints FAIL and the exit status is 1. The first line names the GPU and the versions.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.cuda import device  # noqa: E402
from dnnc.backends.cuda.executable import GRAPHS_PER_FRAME, SEEN_PER_FRAME  # noqa: E402

CAPTURES = 20
"""Buffers whose second call (the capture) is timed."""


def median_us(fn, sync, repeat: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e6)
    return float(np.median(times))


def _same(got, want) -> bool:
    import cupy

    got = [cupy.asnumpy(g) if isinstance(g, cupy.ndarray) else g for g in got]
    return all(g.shape == w.shape and np.allclose(g, w, rtol=1e-5, atol=1e-6)
               for g, w in zip(got, want))


def bench(name: str, args) -> tuple[str, list[str]]:
    import cupy

    rng = np.random.default_rng(0)
    model = zoo.build(name, batch=1)
    inputs = list(zoo.inputs_for(model, rng).values())
    other = list(zoo.inputs_for(model, rng).values())
    compiled = dnnc.compile(model, "cuda")
    sync = cupy.cuda.get_current_stream().synchronize
    want = compiled.run(*inputs, to="numpy")
    want_other = compiled.run(*other, to="numpy")
    failures = []

    def check(label, got, expected=want):
        if not _same(got, expected):
            failures.append(label)

    cells = {}
    cells["np>np"] = median_us(lambda: compiled.run(*inputs, to="numpy"), sync, args.repeat,
                               args.warmup)
    check("np>cp", compiled.run(*inputs))
    cells["np>cp"] = median_us(lambda: compiled.run(*inputs), sync, args.repeat, args.warmup)

    fresh = [[cupy.asarray(a) for a in inputs] for _ in range(SEEN_PER_FRAME + 8)]
    cycle = itertools.cycle(fresh)
    check("cp new", compiled.run(*next(cycle)))
    cells["cp new"] = median_us(lambda: compiled.run(*next(cycle)), sync, args.repeat,
                                args.warmup)

    reused = [cupy.asarray(a) for a in inputs]
    cells["cp reused"] = median_us(lambda: compiled.run(*reused), sync, args.repeat,
                                   args.warmup)
    check("cp reused", compiled.run(*reused))
    for buffer, a in zip(reused, other):   # new contents, same addresses: read afresh
        buffer.set(a)
    check("cp reused, refilled", compiled.run(*reused), want_other)

    cells["torch reused"] = None
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        tensors = [torch.from_numpy(a).cuda() for a in inputs]
        torch_sync = torch.cuda.current_stream().synchronize
        cells["torch reused"] = median_us(lambda: compiled.run(*tensors), torch_sync,
                                          args.repeat, args.warmup)
        check("torch reused", compiled.run(*tensors))

    times, kept = [], []
    for _ in range(CAPTURES):   # more than GRAPHS_PER_FRAME: captures evict one another
        buffers = [cupy.asarray(a) for a in inputs]
        kept.append(buffers)   # alive: a freed buffer's address would come back from the pool
        compiled.run(*buffers)   # met once: copied
        sync()
        start = time.perf_counter()
        got = compiled.run(*buffers)   # met twice: captured
        sync()
        times.append((time.perf_counter() - start) * 1e6)
        check("capture", got)
    cells["capture"] = float(np.median(times))

    outs = compiled.run(*reused)
    cells["out copy"] = median_us(lambda: [cupy.array(o) for o in outs], sync, args.repeat,
                                  args.warmup)
    row = f"{name:<12} {compiled.stats['kernels']:>7}" + "".join(
        f" {'-' if v is None else f'{v:.1f}':>12}" for v in cells.values())
    return row, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,resnet18,bert_tiny")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    if not device.available():
        print(f"bench/cuda_calls.py: {device.unavailable_reason()}", file=sys.stderr)
        return 1
    v = device.versions()
    print(f"gpu {device.describe()}, driver {v['driver']}, cuda runtime {v['runtime']}, "
          f"cupy {v['cupy']}; batch 1, median us of {args.repeat} after {args.warmup}; "
          f"{GRAPHS_PER_FRAME} graphs per frame, {SEEN_PER_FRAME} addresses remembered")
    columns = ["np>np", "np>cp", "cp new", "cp reused", "torch reused", "capture", "out copy"]
    print(f"{'model':<12} {'kernels':>7}" + "".join(f" {c:>12}" for c in columns) + "  check")
    failed = False
    for name in args.models.split(","):
        row, failures = bench(name, args)
        failed |= bool(failures)
        print(row + ("  ok" if not failures else f"  FAIL ({', '.join(failures)})"),
              flush=True)
    print("all paths agree" if not failed else "FAILED: some path gave other outputs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
