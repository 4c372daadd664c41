"""The torch.compile backend's per-call cost on models small enough that it dominates: each
layer of a call timed alone, next to dnnc through ONNX, in one run.

    python bench/torch_call_overhead.py [--models mlp,mobilenet_v3_small,zoo:bert_tiny]
                                        [--threads 2] [--calls 2000] [--rounds 5]
                                        [--cpu-time] [--against FILE]

Models: `mlp`, bench/torch_models.py's (plain torch: no torchvision needed),
bench/library_models.py's, and `zoo:NAME` (dnnc.zoo's ONNX model NAME and its torch mirror
from bench/zoo_torch.py, on the same weights). Layers, microseconds per call (the minimum
over `--rounds` rounds, each runtime timed in turn within a round, `--calls` calls each, a
large model fewer): `onnx` (the model exported by TorchScript, or the zoo's own file,
`dnnc.compile`d, called with NumPy arrays), `model.run` (the backend's compiled partition
called with NumPy arrays), `partition` (its `DnncPartition`: tensors in and out),
`torch.compile` (dynamo's guards, the backend's callable, the partitions; each compile of a
function calling the module, dynamo's entry of its own: `entry`) and
`torch.compile full guards` (the same with `options={"tag_guards": False}`: dynamo's guards
walk every module attribute and parameter). `--cpu-time`: each round timed by the process's
CPU time, not the wall clock (a loaded machine; meant for `--threads 1`, where the kernels'
work is the same in every layer and only the layers' own cost differs). `--against FILE`
also times the backend module at FILE (a copy of an older `dnnc/compiler/torch_backend.py`,
its imports absolute) in the same rounds, as `old ...` rows. Batch 1, under
`torch.no_grad()`. Needs torch (and the models' libraries); never imported by dnnc.
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
    """The module (eval mode), its inputs (a tuple of tensors) and its ONNX model (bytes or a
    ModelProto) for `dnnc.compile`."""
    if name.startswith("zoo:"):
        import zoo_torch
        model = dnnc.zoo.build(name[4:])
        inputs = tuple(torch.from_numpy(a) for a in dnnc.zoo.inputs_for(model).values())
        return zoo_torch.module_for(model), inputs, model
    if name == "mlp":
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                     torch.nn.Linear(64, 16)).eval()
        inputs = (torch.randn(1, 64),)
    else:
        import library_models
        import torch_models
        source = torch_models if name in torch_models.MODELS else library_models
        module, x = source.build(name)
        inputs = (x,)
    buf = io.BytesIO()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), \
            contextlib.redirect_stderr(quiet):
        torch.onnx.export(module.eval(), inputs, buf, dynamo=False)
    return module.eval(), inputs, buf.getvalue()


def entry(module, name: str):
    """A function calling `module`, with code of its own: dynamo keeps its compiles (and
    checks their guards) per code object, so that each compile timed is its own entry,
    not one more of the module's `forward`."""
    scope = {"module": module}
    exec(f"def {name}(*inputs):\n    return module(*inputs)\n", scope)
    return scope[name]


def layers(backend, module, inputs, label: str) -> dict:
    """The callables of one backend module's layers for `module`."""
    torch._dynamo.reset()
    rows = {}
    for suffix, options in (("", None), (" full guards", {"tag_guards": False})):
        if options and "tag_guards" not in getattr(backend, "OPTIONS", {}):
            continue
        name = f"{label}{suffix}".replace(" ", "_") or "default"
        fn = torch.compile(entry(module, name), backend=backend.dnnc_backend, options=options)
        fn(*inputs)
        rows[f"{label}torch.compile{suffix}"] = lambda fn=fn: fn(*inputs)
    report = backend.reports()[-1]
    parts = [o for o in gc.get_objects() if type(o) is backend.DnncPartition]
    if len(report.models) == 1 and len(parts) >= 1:
        part, model = parts[-1], report.models[0]
        arrays = [x.numpy() for x in inputs]
        rows[f"{label}partition"] = lambda: part(*inputs)
        rows[f"{label}model.run"] = lambda: model.run(*arrays)
    return rows


def per_call_us(fn, calls: int, clock=time.perf_counter) -> float:
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,mobilenet_v3_small_tv")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by the process's CPU time (with --threads 1)")
    parser.add_argument("--against", default=None)
    args = parser.parse_args(argv)
    clock = time.process_time if args.cpu_time else time.perf_counter
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
          f"{args.rounds} rounds of {args.calls} calls or fewer, "
          f"{'CPU time' if args.cpu_time else 'wall clock'}), ratio to onnx")
    with torch.no_grad():
        for name in args.models.split(","):
            try:
                module, inputs, onnx_file = build(name)
            except ImportError as exc:
                print(f"# {name}: not built ({exc})")
                continue
            onnx = dnnc.compile(onnx_file, "llvm")
            arrays = [x.numpy() for x in inputs]
            rows = {"onnx": lambda: onnx(*arrays)}
            for backend, label in backends:
                rows.update(layers(backend, module, inputs, label))
            start = time.perf_counter()
            rows["onnx"]()   # a second or so of calls a round for each layer
            calls = int(min(args.calls, max(1.0 / (time.perf_counter() - start), 20)))
            best = {k: float("inf") for k in rows}
            for fn in rows.values():
                for _ in range(max(calls // 10, 5)):
                    fn()
            for _ in range(args.rounds):
                for k, fn in rows.items():
                    best[k] = min(best[k], per_call_us(fn, calls, clock))
            for k in sorted(rows, key=lambda k: (k.startswith("old"), k)):
                print(f"{name:24}{k:30}{best[k]:10.1f}{best[k] / best['onnx']:8.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
