"""Another dnnc tree against this one, in one process: compile time and call time of zoo
models, each compiled by both trees and timed in interleaved blocks, printed as new/old ratios.

    git worktree add /tmp/dnnc-old <commit>
    python bench/ab_tree.py --old /tmp/dnnc-old [--models mlp,cnn,resnet18] [--target llvm]
                            [--rounds 5] [--compiles 2] [--precision fp16] [--batch 32]

The old tree's package is copied to a temporary folder as `dnnc_old` and imported beside this
tree's `dnnc` (dnnc imports itself relatively, so both live in one interpreter, each with its
own JIT, worker pool and caches). Both compile the same ONNX model (built by this tree's zoo,
with the same seeded weights and inputs); the on-disk compile cache is off, so each compile is
cold. Compiles alternate old/new/new/old...; calls run in blocks of each tree's calls,
alternating which goes first, 0.2 s apart; each ratio is new/old of the medians. Made for
refactorings that must change neither speed nor compile time (issue 29); a ratio near 1.00
within this machine's noise is the expected result.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["DNNC_CACHE"] = "0"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def import_old(tree: Path, folder: Path):
    """The package of `tree` imported under the name `dnnc_old`."""
    shutil.copytree(tree / "dnnc", folder / "dnnc_old",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(folder))
    return importlib.import_module("dnnc_old")


def compile_seconds(package, model, target: str, precision: str | None = None
                    ) -> tuple[float, object]:
    start = time.perf_counter()
    options = {"precision": precision} if precision else {}
    compiled = package.compile(model, target=target, cache=False, **options)
    return time.perf_counter() - start, compiled


def host(y):
    """An output as a NumPy array (a device array is copied back, which waits for it)."""
    return y.get() if hasattr(y, "get") else y


def block_ms(compiled, inputs: list, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        out = compiled.run(*inputs)
    host(out[0])   # a GPU target's calls are asynchronous: the block ends when its work does
    return (time.perf_counter() - start) * 1e3 / calls


def measure(name: str, new, old, target: str, rounds: int, compiles: int,
            precision: str | None = None, batch: int | None = None) -> dict:
    from dnnc import zoo

    import numpy as np

    model = zoo.build(name) if batch is None else zoo.build(name, batch=batch)
    inputs = list(zoo.inputs_for(model, np.random.default_rng(0)).values())
    times = {"new": [], "old": []}
    compiled = {}
    for i in range(compiles):
        for which in (("old", "new") if i % 2 == 0 else ("new", "old")):
            seconds, compiled[which] = compile_seconds(new if which == "new" else old, model,
                                                       target, precision)
            times[which].append(seconds)
    ya, yb = compiled["new"].run(*inputs), compiled["old"].run(*inputs)
    same = all(np.array_equal(host(a), host(b)) for a, b in zip(ya, yb))
    one = block_ms(compiled["new"], inputs, 3)
    calls = max(3, min(200, int(200 / max(one, 1e-3))))   # blocks of about 0.2 s
    ms = {"new": [], "old": []}
    for r in range(rounds):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            time.sleep(0.2)
            ms[which].append(block_ms(compiled[which], inputs, calls))
    return {"model": name, "compile_new": statistics.median(times["new"]),
            "compile_old": statistics.median(times["old"]),
            "ms_new": statistics.median(ms["new"]), "ms_old": statistics.median(ms["old"]),
            "same_outputs": same}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, type=Path, help="the other tree's root")
    parser.add_argument("--models", default="mlp,cnn,resnet18,mobilenet_v2,bert_tiny,resnet50")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compiles", type=int, default=2)
    parser.add_argument("--precision", default=None, help="compile option (cuda: fp16, tf32...)")
    parser.add_argument("--batch", type=int, default=None, help="the zoo models' batch")
    args = parser.parse_args()
    import dnnc

    with tempfile.TemporaryDirectory() as folder:
        old = import_old(args.old.resolve(), Path(folder))
        print(f"# {platform.machine()} {os.cpu_count()} cores, threads "
              f"{os.environ.get('DNNC_NUM_THREADS', 'all')}, target {args.target}; new "
              f"{ROOT} vs old {args.old}; medians of {args.compiles} compiles and "
              f"{args.rounds} call blocks each")
        print(f"{'model':14} {'compile new s':>13} {'old s':>7} {'new/old':>7} "
              f"{'call new ms':>11} {'old ms':>8} {'new/old':>7}  outputs")
        measure("mlp", dnnc, old, args.target, 1, 1)   # each tree's JIT and pool started
        for name in args.models.split(","):
            r = measure(name, dnnc, old, args.target, args.rounds, args.compiles,
                        args.precision, args.batch)
            print(f"{name:14} {r['compile_new']:13.2f} {r['compile_old']:7.2f} "
                  f"{r['compile_new'] / r['compile_old']:7.2f} {r['ms_new']:11.3f} "
                  f"{r['ms_old']:8.3f} {r['ms_new'] / r['ms_old']:7.2f}  "
                  f"{'identical' if r['same_outputs'] else 'DIFFER'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
