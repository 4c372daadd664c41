"""Whole models tuned with `dnnc tune`, then the tuned compile against the default one.

    python bench/tune_models.py [--models resnet18,mobilenet_v2,bert_tiny] [--trials 300]
                                [--log-dir DIR] [--repeat 30] [--rounds 5]

Per model (a zoo model at batch 1): `dnnc.tune(..., trials=N)` into DIR/MODEL.jsonl (an
existing log is resumed), then two compiles, default and `tuning_log=`, both checked against
the reference, timed in interleaved blocks (default, tuned, default, ... `--rounds` times, each
block the median of `--repeat` calls) so that both see the same machine state. Prints trials,
tasks, tuning wall time, tuned kernels, both medians and the speedup.
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
from dnnc.compiler.module import call_times_ms  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_tiny")
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--log-dir", default="tune-logs")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    folder = Path(args.log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    from dnnc.compiler.targets import REGISTRY

    machine = REGISTRY["llvm"].target()
    print(f"# llvm on {machine.cpu} ({machine.vector_bits}-bit vectors), {machine.threads} "
          f"threads; {args.trials} trials a model", flush=True)
    rows = []
    for name in args.models.split(","):
        model = zoo.build(name, batch=1)
        log = folder / f"{name}.jsonl"
        start = time.perf_counter()
        reports = dnnc.tune(model, "llvm", log=log, trials=args.trials, progress=False)
        tune_s = time.perf_counter() - start
        inputs = list(zoo.inputs_for(model, np.random.default_rng(0)).values())
        ref = dnnc.compile(model, "numpy").run(*inputs)
        default = dnnc.compile(model, "llvm")
        tuned = dnnc.compile(model, "llvm", tuning_log=log)
        for compiled in (default, tuned):
            for out, want in zip(compiled.run(*inputs), ref):
                np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-4)
        blocks = {"default": [], "tuned": []}
        for _ in range(args.rounds):
            for which, compiled in (("default", default), ("tuned", tuned)):
                time.sleep(0.2)
                blocks[which].append(float(np.median(call_times_ms(
                    lambda: compiled.run(*inputs), args.repeat, 3))))
        d, t = (float(np.median(blocks[w])) for w in ("default", "tuned"))
        trials = sum(r.trials for r in reports) + len(reports)
        rows.append((name, len(reports), trials, tune_s, tuned.stats["tuned_kernels"],
                     default.stats["kernels"], d, t))
        print(f"  {name}: {len(reports)} tasks, {trials} trials, {tune_s:.0f} s, "
              f"default {d:.2f} ms, tuned {t:.2f} ms", flush=True)
    print(f"\n{'model':14} {'tasks':>5} {'trials':>6} {'tune s':>7} {'tuned':>11} "
          f"{'default ms':>10} {'tuned ms':>9} {'speedup':>7}")
    for name, tasks, trials, tune_s, tuned_k, kernels, d, t in rows:
        print(f"{name:14} {tasks:5d} {trials:6d} {tune_s:7.0f} {tuned_k:5d}/{kernels:<5d} "
              f"{d:10.2f} {t:9.2f} {d / t:7.2f}")


if __name__ == "__main__":
    main()
