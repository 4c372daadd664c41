"""Whole models tuned with `dnnc tune`, then the tuned compile against the default one.

    python bench/tune_models.py [--models resnet18,mobilenet_v2,bert_tiny] [--trials 300]
                                [--log-dir DIR] [--repeat 20] [--rounds 41] [--skip-tune]

Per model (a zoo model at batch 1): `dnnc.tune(..., trials=N)` into DIR/MODEL.jsonl (an
existing log is resumed; `--skip-tune` uses it as it is), then two compiles, default and
`tuning_log=`, both checked against the reference, timed in interleaved blocks (each block the
median of `--repeat` calls; `--rounds` rounds, the order alternating: default, tuned, tuned,
default, ...) so that both see the same machine state. Models of a millisecond vary by up to
2x from block to block on a shared host: many short blocks, not a few long ones. Prints trials,
tasks, tuning wall time, tuned kernels, both medians (of the blocks), the speedup, and the
share of rounds in which the tuned block was the faster.
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
from dnnc.autotune.records import read as read_log  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_tiny")
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

    machine = REGISTRY["llvm"].target()
    print(f"# llvm on {machine.cpu} ({machine.vector_bits}-bit vectors), {machine.threads} "
          f"threads; {args.trials} trials a model", flush=True)
    rows = []
    for name in args.models.split(","):
        model = zoo.build(name, batch=1)
        log = folder / f"{name}.jsonl"
        start = time.perf_counter()
        if args.skip_tune:   # the log's own measurements; its tuning time is not known here
            records = [r for r in read_log(log) if not r.confirm]
            tasks, trials, tune_s = len({r.task for r in records}), len(records), float("nan")
        else:
            reports = dnnc.tune(model, "llvm", log=log, trials=args.trials, progress=False)
            tune_s = time.perf_counter() - start
            tasks, trials = len(reports), sum(r.trials for r in reports) + len(reports)
        inputs = list(zoo.inputs_for(model, np.random.default_rng(0)).values())
        ref = dnnc.compile(model, "numpy").run(*inputs)
        default = dnnc.compile(model, "llvm")
        tuned = dnnc.compile(model, "llvm", tuning_log=log)
        for compiled in (default, tuned):
            for out, want in zip(compiled.run(*inputs), ref):
                np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-4)
        blocks = {"default": [], "tuned": []}
        pair = (("default", default), ("tuned", tuned))
        for round_ in range(args.rounds):
            for which, compiled in pair if round_ % 2 == 0 else pair[::-1]:
                blocks[which].append(float(np.median(call_times_ms(
                    lambda: compiled.run(*inputs), args.repeat, 3))))
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
