"""The torch.compile backend's per-call cost on models small enough that it dominates: each
layer of a call timed alone, next to dnnc through ONNX, in one run.

    python bench/torch_call_overhead.py [--models mlp,mobilenet_v3_small_tv] [--threads 2]
                                        [--calls 2000] [--rounds 5] [--against FILE]

Layers, microseconds per call (the minimum over `--rounds` rounds, each runtime timed in
turn within a round, `--calls` calls each): `onnx` (the model exported by TorchScript,
`dnnc.compile`d, called with `x.numpy()`), `model.run` (the backend's compiled partition
called with a NumPy array), `partition` (its `DnncPartition`: tensors in and out),
`torch.compile` (dynamo's guards, the backend's callable, the partitions). `--against FILE`
also times the backend module at FILE (a copy of an older `dnnc/compiler/torch_backend.py`,
its imports absolute) in the same rounds, as `old ...` rows. Batch 1, under
`torch.no_grad()`. Needs torch (and torchvision for its models); never imported by dnnc.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc.compiler import torch_backend  # noqa: E402


def build(name: str):
    if name == "mlp":
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                  torch.nn.Linear(64, 16)).eval()
        return mlp, torch.randn(1, 64)
    import library_models
    return library_models.build(name)


def onnx_model(module, x):
    buf = io.BytesIO()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), \
            contextlib.redirect_stderr(quiet):
        torch.onnx.export(module, (x,), buf, dynamo=False)
    return dnnc.compile(buf.getvalue(), "llvm")


def layers(backend, module, x, label: str) -> dict:
    """The callables of one backend module's layers for `module`."""
    torch._dynamo.reset()
    fn = torch.compile(module, backend=backend.dnnc_backend)
    fn(x)
    report = backend.reports()[-1]
    parts = [o for o in gc.get_objects() if type(o) is backend.DnncPartition]
    rows = {f"{label}torch.compile": lambda: fn(x)}
    if len(report.models) == 1 and len(parts) >= 1:
        part, model, xn = parts[-1], report.models[0], x.numpy()
        rows[f"{label}partition"] = lambda: part(x)
        rows[f"{label}model.run"] = lambda: model.run(xn)
    return rows


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,mobilenet_v3_small_tv")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", default=None)
    args = parser.parse_args(argv)
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    backends = [(torch_backend, "")]
    if args.against:
        spec = importlib.util.spec_from_file_location("old_torch_backend", args.against)
        old = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = old   # (dataclasses look their module up)
        spec.loader.exec_module(old)
        backends.append((old, "old "))
    print(f"# torch {torch.__version__}, {args.threads} threads, us per call (min of "
          f"{args.rounds} rounds of {args.calls} calls), ratio to onnx")
    with torch.no_grad():
        for name in args.models.split(","):
            module, x = build(name)
            module = module.eval()
            calls = max(args.calls // (1 if name == "mlp" else 20), 50)
            onnx = onnx_model(module, x)
            rows = {"onnx": lambda: onnx(x.numpy())}
            for backend, label in backends:
                rows.update(layers(backend, module, x, label))
            best = {k: float("inf") for k in rows}
            for fn in rows.values():
                for _ in range(max(calls // 10, 5)):
                    fn()
            for _ in range(args.rounds):
                for k, fn in rows.items():
                    best[k] = min(best[k], per_call_us(fn, calls))
            for k in sorted(rows, key=lambda k: (k.startswith("old"), k)):
                print(f"{name:24}{k:22}{best[k]:10.1f}{best[k] / best['onnx']:8.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
