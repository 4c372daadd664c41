"""Whole models tuned with `dnnc tune`, then the tuned compile against the default one.

    python bench/tune_models.py [--models resnet18,mobilenet_v2,bert_tiny] [--files A.onnx,...]
                                [--target llvm|cuda] [--precision fp32|tf32|fp16|bf16]
                                [--batch 1] [--trials 300] [--log-dir DIR] [--repeat 20]
                                [--rounds 41] [--skip-tune]

Per model (a zoo model, or an ONNX file of `--files` with its batch dim set to `--batch`):
`dnnc.tune(..., trials=N)` for the target at the precision into DIR/MODEL.jsonl (an existing
log is resumed; `--skip-tune` uses it as it is), then two compiles, default and `tuning_log=`,
both checked against the numpy reference (fp32: rtol 1e-3; a reduced precision: within its
`model_error_bound` of the largest output), timed in interleaved blocks (each block the
median of `--repeat` calls; `--rounds` rounds, the order alternating: default, tuned, tuned,
default, ...) so that both see the same machine state. Models of a millisecond vary by up to
2x from block to block on a shared host: many short blocks, not a few long ones. Prints trials,
tasks, tuning wall time, tuned kernels, both medians (of the blocks), the speedup, and the
share of rounds in which the tuned block was the faster. The tuning's progress goes to
stderr: a bar on a terminal, a line per task where stderr is a file or a pipe (a device log).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.autotune.records import read as read_log  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402
from dnnc.ir.target import model_error_bound  # noqa: E402


def _with_batch(model, batch: int):
    """`model` with its inputs' symbolic first dims set to `batch`."""
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].dim_value:
            dims[0].dim_value = batch
    return model


def _timed_call(target: str, inputs: list):
    """A function calling a compiled model once on `inputs` and waiting for its outputs (cuda:
    the inputs on the GPU, outputs left there, the stream synchronised)."""
    if target != "cuda":
        return lambda compiled: compiled.run(*inputs)
    import cupy as cp

    on_gpu = [cp.asarray(x) for x in inputs]

    def call(compiled):
        compiled.run(*on_gpu)
        cp.cuda.get_current_stream().synchronize()

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_tiny",
                        help="zoo models, comma-separated ('' for none)")
    parser.add_argument("--files", default="", help="ONNX files, comma-separated")
    parser.add_argument("--target", default="llvm", choices=("llvm", "cuda"))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16", "bf16"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--log-dir", default="tune-logs")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--skip-tune", action="store_true",
                        help="compare with the existing logs; tune nothing")
    args = parser.parse_args()
    folder = Path(args.log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    from dnnc.backends.registry import REGISTRY

    if args.target == "llvm":
        machine = REGISTRY["llvm"].target()
        print(f"# llvm on {machine.cpu} ({machine.vector_bits}-bit vectors), {machine.threads} "
              f"threads; {args.trials} trials a model", flush=True)
    else:
        from gpu_timing import header
        print(header(), flush=True)
    print(f"# {args.target} at precision {args.precision}, batch {args.batch}, {args.trials} "
          f"trials a model", flush=True)
    options = {"precision": args.precision} if args.precision != "fp32" else {}
    rows = []
    models = [(n, zoo.build(n, batch=args.batch)) for n in args.models.split(",") if n] + \
        [(Path(f).stem, _with_batch(onnx.load(f), args.batch))
         for f in args.files.split(",") if f]
    for name, model in models:
        log = folder / f"{name}_{args.target}_{args.precision}_b{args.batch}.jsonl"
        start = time.perf_counter()
        if args.skip_tune:   # the log's own measurements; its tuning time is not known here
            records = [r for r in read_log(log) if not r.confirm]
            tasks, trials, tune_s = len({r.task for r in records}), len(records), float("nan")
        else:
            reports = dnnc.tune(model, args.target, log=log, trials=args.trials,
                                progress=True, **options)
            tune_s = time.perf_counter() - start
            tasks, trials = len(reports), sum(r.trials for r in reports) + len(reports)
        inputs = list(zoo.inputs_for(model, np.random.default_rng(0)).values())
        ref = dnnc.compile(model, "numpy").run(*inputs)
        default = dnnc.compile(model, args.target, **options)
        tuned = dnnc.compile(model, args.target, tuning_log=log, **options)
        for compiled in (default, tuned):
            for out, want in zip(compiled.run(*inputs, to="numpy"), ref):
                if args.precision == "fp32":
                    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-4)
                else:
                    bound = model_error_bound(args.precision) * np.abs(want).max()
                    assert np.abs(out.astype(np.float64) - want).max() <= bound, name
        call = _timed_call(args.target, inputs)
        blocks = {"default": [], "tuned": []}
        pair = (("default", default), ("tuned", tuned))
        for round_ in range(args.rounds):
            for which, compiled in pair if round_ % 2 == 0 else pair[::-1]:
                blocks[which].append(float(np.median(call_times_ms(
                    lambda: call(compiled), args.repeat, 3))))
        d, t = (float(np.median(blocks[w])) for w in ("default", "tuned"))
        wins = float(np.mean(np.array(blocks["tuned"]) < np.array(blocks["default"])))
        rows.append((name, tasks, trials, tune_s, tuned.stats["tuned_kernels"],
                     default.stats["kernels"], d, t, wins))
        print(f"  {name}: {tasks} tasks, {trials} trials, {tune_s:.0f} s, "
              f"default {d:.3f} ms, tuned {t:.3f} ms", flush=True)
    print(f"\n{'model':14} {'tasks':>5} {'trials':>6} {'tune s':>7} {'tuned':>11} "
          f"{'default ms':>10} {'tuned ms':>9} {'speedup':>7} {'wins':>5}")
    for name, tasks, trials, tune_s, tuned_k, kernels, d, t, wins in rows:
        print(f"{name:14} {tasks:5d} {trials:6d} {tune_s:7.0f} {tuned_k:5d}/{kernels:<5d} "
              f"{d:10.3f} {t:9.3f} {d / t:7.3f} {wins:5.0%}")


if __name__ == "__main__":
    main()
