"""torch.compile(backend="dnnc") next to inductor (torch.compile's default), eager PyTorch and
dnnc through ONNX, on torchvision's, timm's and transformers' own modules, in one run.

    python bench/torch_backend.py [--models resnet18_tv,efficientnet_b0,bert_hf,...]
                                  [--threads 2] [--repeat 10] [--blocks 3] [--no-onnx]
                                  [--target llvm|cuda] [--cpu-time]

Models are bench/library_models.py's (random seeded weights, nothing downloaded) at batch 1.
Every runtime gets `--threads` threads (torch.set_num_threads, DNNC_NUM_THREADS) and runs
under `torch.no_grad()`; each is timed in `--blocks` interleaved blocks of `--repeat` calls
(bench/cpu.py's `median_block_ms`), after its compile and warm-up calls. Prints the median
block's milliseconds per runtime, the ratios dnnc-backend / inductor, dnnc-backend / eager and
dnnc-backend / dnnc-onnx (the same model exported by torch's TorchScript exporter and compiled
by `dnnc.compile`), their geometric means, each runtime's compile seconds, and whether the
backend's outputs match eager's (and how many ATen ops stayed in torch). Needs torch (and the
libraries whose models are asked for); never imported by dnnc.

`--cpu-time` (llvm, `--threads 1`): each call timed by this process's CPU time instead of the
wall clock, so that other jobs on a shared machine, which take the core away mid-call, add
nothing (every runtime computes on the caller's thread at 1 thread: torch's intra-op pool
and dnnc's run there).

`--target cuda` runs every runtime on the GPU (model and input moved there): inductor with
`mode="reduce-overhead"` (CUDA graphs), the backend with the cuda target (CUDA tensors read in
place on torch's stream), dnnc through ONNX on cuda given the CUDA tensor; each call is timed
to its end (torch.cuda.synchronize()), eager and inductor in fp32 arithmetic (no TF32).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import library_models  # noqa: E402
from cpu import median_block_ms  # noqa: E402

import dnnc  # noqa: E402
from dnnc.compiler import torch_backend  # noqa: E402

DEFAULT_MODELS = "resnet18_tv,mobilenet_v3_small_tv,efficientnet_b0,vit_tiny_timm,bert_hf"


def compile_seconds(fn, x) -> float:
    """Seconds of `fn`'s first call (torch.compile compiles there)."""
    start = time.perf_counter()
    fn(x)
    return time.perf_counter() - start


def through_onnx(name: str, folder: Path, target: str):
    """Model `name` exported by TorchScript and compiled by dnnc: a callable of a tensor, or
    None (with a line saying why) where the export fails."""
    path = folder / f"{name}.onnx"
    try:   # (a failed TorchScript export prints its whole graph)
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), \
                contextlib.redirect_stderr(quiet):
            library_models.export(name, path, "torchscript")
    except Exception as exc:
        print(f"# {name}: no ONNX export ({type(exc).__name__}: {str(exc)[:80]})")
        return None
    model = dnnc.compile(str(path), target)
    if target == "cuda":   # the CUDA tensor read in place; CuPy out, a tensor over it
        return lambda x: torch.from_dlpack(model(x))
    return lambda x: model(x.numpy())


def measure(name: str, args, folder: Path) -> dict | None:
    try:
        module, x = library_models.build(name)
    except ImportError as exc:
        print(f"# {name}: not built ({exc})")
        return None
    gpu = args.target == "cuda"
    if gpu:
        module, x = module.cuda(), x.cuda()
    torch._dynamo.reset()
    before = len(torch_backend.reports())
    runtimes = {"eager": module,
                "inductor": torch.compile(module, mode="reduce-overhead" if gpu else None),
                "dnnc": torch.compile(module, backend=torch_backend.dnnc_backend,
                                      options={"target": args.target})}
    if not args.no_onnx:
        onnx_fn = through_onnx(name, folder, args.target)
        if onnx_fn is not None:
            runtimes["dnnc-onnx"] = onnx_fn
    if gpu:   # a call ends when its results are ready
        runtimes = {k: (lambda x, fn=fn: (fn(x), torch.cuda.synchronize())[0])
                    for k, fn in runtimes.items()}
    compiles = {k: compile_seconds(fn, x) for k, fn in runtimes.items()}
    want, got = runtimes["eager"](x), runtimes["dnnc"](x)
    error = float((got - want).abs().max()) / max(float(want.abs().max()), 1e-30)
    left = sum(sum(r.torch_ops.values()) for r in torch_backend.reports()[before:])
    times = median_block_ms({k: (lambda fn=fn: fn(x)) for k, fn in runtimes.items()},
                            args.repeat, args.blocks, args.cpu_time)
    return {"times": times, "compiles": compiles, "error": error, "left": left}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--no-onnx", action="store_true", help="leave dnnc-through-ONNX out")
    parser.add_argument("--target", default="llvm", choices=("llvm", "cuda"),
                        help="cuda: every runtime on the GPU, inductor in reduce-overhead mode")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time calls by the process's CPU time (llvm, 1 thread only)")
    args = parser.parse_args(argv)
    if args.cpu_time and (args.threads != 1 or args.target != "llvm"):
        parser.error("--cpu-time needs --threads 1 and the llvm target")
    if args.target == "cuda":   # fp32 products in eager and inductor too, as dnnc's default
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    machine = torch.cuda.get_device_name() if args.target == "cuda" else \
        (platform.processor() or platform.machine())
    print(f"# {machine}, {args.target}, {args.threads} threads, batch 1; "
          f"torch {torch.__version__}, dnnc {dnnc.__version__}; median of {args.blocks} "
          f"blocks of {args.repeat} calls, ms{' of CPU time' if args.cpu_time else ''}")
    columns = ["eager", "inductor", "dnnc", "dnnc-onnx"]
    print(f"{'model':22}" + "".join(f"{c:>10}" for c in columns) +
          f"{'/ind':>7}{'/eager':>7}{'/onnx':>7}  compile s (ind, dnnc, onnx)  rel.err  in torch")
    ratios = {"inductor": [], "eager": [], "dnnc-onnx": []}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name in args.models.split(","):
            try:
                row = measure(name, args, Path(tmp))
            except Exception as exc:   # one model's failure: said, and the others still run
                print(f"# {name}: failed ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
                continue
            if row is None:
                continue
            t, c = row["times"], row["compiles"]
            cells = "".join(f"{t[k]:10.2f}" if k in t else f"{'-':>10}" for k in columns)
            rel = {k: t["dnnc"] / t[k] for k in ratios if k in t}
            for k, v in rel.items():
                ratios[k].append(v)
            print(f"{name:22}{cells}" + "".join(f"{rel[k]:7.2f}" if k in rel else f"{'-':>7}"
                                                for k in ratios) +
                  f"  {c['inductor']:6.1f} {c['dnnc']:6.1f} {c.get('dnnc-onnx', math.nan):6.1f}"
                  f"          {row['error']:8.1e}  {row['left']}", flush=True)
    print("geomean" + " " * 55 + "".join(
        f"{math.exp(np.mean(np.log(v))):7.2f}" if v else f"{'-':>7}" for v in ratios.values()))


if __name__ == "__main__":
    main()
