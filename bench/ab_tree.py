"""Another dnnc tree against this one, in one process: compile time and call time of zoo
models, each compiled by both trees and timed in interleaved blocks, printed as new/old ratios.

    git worktree add /tmp/dnnc-old <commit>
    python bench/ab_tree.py --old /tmp/dnnc-old [--models mlp,cnn,resnet18,light_resnet50,f.onnx]
                            [--target llvm] [--rounds 5] [--compiles 2] [--precision fp16]
                            [--batch 32] [--kernels]

The old tree's package is copied to a temporary folder as `dnnc_old` and imported beside this
tree's `dnnc` (dnnc imports itself relatively, so both live in one interpreter, each with its
own JIT, worker pool and caches). Both compile the same ONNX model (built by this tree's zoo,
with the same seeded weights and inputs; `light_NAME`: the onnx package's light model, random
inputs by `zoo.inputs_for`); the on-disk compile cache is off, so each compile is
cold. Compiles alternate old/new/new/old...; calls run in blocks of each tree's calls,
alternating which goes first, 0.2 s apart; each ratio is new/old of the medians. On llvm the
CPU seconds of LLVM's optimisation pipeline (`jit.optimize`) and of its whole JIT compiles
(`JITModule`: with the machine code, as costly as the optimisation) are printed as well:
steadier than a compile's wall time on a shared machine. `--kernels`: each kernel's time
too (`profile`, both trees alternating, `--rounds` times), new/old of its medians, where the
trees' kernels are the same list. Made for refactorings that must change neither speed nor compile time (issue 29); a ratio near 1.00
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

import numpy as np

os.environ["DNNC_CACHE"] = "0"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def import_old(tree: Path, folder: Path):
    """The package of `tree` imported under the name `dnnc_old`."""
    shutil.copytree(tree / "dnnc", folder / "dnnc_old",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(folder))
    return importlib.import_module("dnnc_old")


LLVM_SECONDS: dict[tuple[str, str], list[float]] = {}
"""(package name, "optimise" or "jit") -> the CPU seconds of each of its runs of LLVM's
optimisation pipeline (`jit.optimize`), or of each whole JIT compile of a module (`JITModule`:
parsing, that pipeline and the machine code MCJIT generates), once `time_llvm` wrapped them
(llvm target)."""


def time_llvm(package) -> None:
    """From now on, each of `package`'s runs of LLVM's optimisation pipeline and each of its
    JIT compiles add their CPU seconds to LLVM_SECONDS."""
    jit = importlib.import_module(package.__name__ + ".backends.llvm.jit")

    def timed(function, stage):
        seconds = LLVM_SECONDS.setdefault((package.__name__, stage), [])

        def run(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                seconds.append(time.process_time() - start)
        return run
    jit.optimize = timed(jit.optimize, "optimise")
    jit.JITModule.__init__ = timed(jit.JITModule.__init__, "jit")


def compile_seconds(package, model, target: str, precision: str | None = None
                    ) -> tuple[float, float, float, object]:
    """(wall seconds, CPU seconds of LLVM's optimisation, of its whole JIT compiles, the
    compiled model)."""
    tables = [LLVM_SECONDS.get((package.__name__, stage), []) for stage in ("optimise", "jit")]
    before = [sum(t) for t in tables]
    start = time.perf_counter()
    options = {"precision": precision} if precision else {}
    compiled = package.compile(model, target=target, cache=False, **options)
    wall = time.perf_counter() - start
    optimising, jitting = (sum(t) - b for t, b in zip(tables, before))
    return wall, optimising, jitting, compiled


def load_model(name: str, batch: int | None):
    """The zoo model `name`, the onnx package's light model for `light_NAME`, or the file
    `name` where it ends in .onnx (its inputs' symbolic dims fixed at 1, or `batch`)."""
    from dnnc import zoo

    if name.endswith(".onnx"):
        import onnx

        model = onnx.load(name)
        for value in model.graph.input:
            for dim in value.type.tensor_type.shape.dim:
                if not dim.HasField("dim_value"):
                    dim.dim_value = batch or 1
        return model
    if name.startswith("light_"):
        import onnx

        return onnx.load(Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" /
                         f"{name}.onnx")
    return zoo.build(name) if batch is None else zoo.build(name, batch=batch)


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
            precision: str | None = None, batch: int | None = None,
            kernels: bool = False) -> dict:
    from dnnc import zoo

    model = load_model(name, batch)
    inputs = list(zoo.inputs_for(model, np.random.default_rng(0)).values())
    times = {"new": [], "old": []}
    optimising = {"new": [], "old": []}
    jitting = {"new": [], "old": []}
    compiled = {}
    for i in range(compiles):
        for which in (("old", "new") if i % 2 == 0 else ("new", "old")):
            seconds, cpu, jit_cpu, compiled[which] = compile_seconds(
                new if which == "new" else old, model, target, precision)
            times[which].append(seconds)
            optimising[which].append(cpu)
            jitting[which].append(jit_cpu)
    ya, yb = compiled["new"].run(*inputs), compiled["old"].run(*inputs)
    same = all(np.array_equal(host(a), host(b)) for a, b in zip(ya, yb))
    one = block_ms(compiled["new"], inputs, 3)
    calls = max(3, min(200, int(200 / max(one, 1e-3))))   # blocks of about 0.2 s
    ms = {"new": [], "old": []}
    for r in range(rounds):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            time.sleep(0.2)
            ms[which].append(block_ms(compiled[which], inputs, calls))
    out = {"model": name, "compile_new": statistics.median(times["new"]),
           "compile_old": statistics.median(times["old"]),
           "llvm_new": statistics.median(optimising["new"]),
           "llvm_old": statistics.median(optimising["old"]),
           "jit_new": statistics.median(jitting["new"]),
           "jit_old": statistics.median(jitting["old"]),
           "ms_new": statistics.median(ms["new"]), "ms_old": statistics.median(ms["old"]),
           "same_outputs": same}
    if kernels:
        out["kernels"] = kernel_ratios(compiled, inputs, rounds)
    return out


def kernel_ratios(compiled: dict, inputs: list, rounds: int) -> list[tuple]:
    """(kernel, template, new ms, old ms) of each kernel, the medians of `rounds` profiles of
    each tree, alternating which goes first; [] where the trees' kernels differ."""
    ms: dict = {"new": [], "old": []}
    rows: dict = {}
    for r in range(rounds):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            rows[which] = compiled[which].profile(*inputs)
            ms[which].append([row["ms"] for row in rows[which]])
    names = [row["kernel"] for row in rows["new"]]
    if names != [row["kernel"] for row in rows["old"]]:
        return []
    new, old = np.median(ms["new"], axis=0), np.median(ms["old"], axis=0)
    return [(row["kernel"], row.get("template") or "", a, b)
            for row, a, b in zip(rows["new"], new, old)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, type=Path, help="the other tree's root")
    parser.add_argument("--models", default="mlp,cnn,resnet18,mobilenet_v2,bert_tiny,resnet50")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compiles", type=int, default=2)
    parser.add_argument("--precision", default=None, help="compile option (cuda: fp16, tf32...)")
    parser.add_argument("--batch", type=int, default=None, help="the zoo models' batch")
    parser.add_argument("--kernels", action="store_true", help="each kernel's time too")
    args = parser.parse_args()
    import dnnc

    with tempfile.TemporaryDirectory() as folder:
        old = import_old(args.old.resolve(), Path(folder))
        if args.target == "llvm":
            for package in (dnnc, old):
                time_llvm(package)
        print(f"# {platform.machine()} {os.cpu_count()} cores, threads "
              f"{os.environ.get('DNNC_NUM_THREADS', 'all')}, target {args.target}; new "
              f"{ROOT} vs old {args.old}; medians of {args.compiles} compiles and "
              f"{args.rounds} call blocks each; LLVM: CPU seconds of its optimisation, "
              f"JIT: of LLVM's whole compiles (optimisation and machine code)")
        print(f"{'model':18} {'compile new s':>13} {'old s':>7} {'new/old':>7} "
              f"{'LLVM new s':>10} {'old s':>7} {'JIT new s':>9} {'old s':>7} "
              f"{'call new ms':>11} {'old ms':>8} "
              f"{'new/old':>7}  outputs")
        measure("mlp", dnnc, old, args.target, 1, 1)   # each tree's JIT and pool started
        for name in args.models.split(","):
            r = measure(name, dnnc, old, args.target, args.rounds, args.compiles,
                        args.precision, args.batch, args.kernels)
            print(f"{name:18} {r['compile_new']:13.2f} {r['compile_old']:7.2f} "
                  f"{r['compile_new'] / r['compile_old']:7.2f} {r['llvm_new']:10.2f} "
                  f"{r['llvm_old']:7.2f} {r['jit_new']:9.2f} {r['jit_old']:7.2f} "
                  f"{r['ms_new']:11.3f} "
                  f"{r['ms_old']:8.3f} {r['ms_new'] / r['ms_old']:7.2f}  "
                  f"{'identical' if r['same_outputs'] else 'DIFFER'}", flush=True)
            if args.kernels:
                for kernel, template, a, b in r.get("kernels") or []:
                    print(f"    {kernel:40} {template:16} {a:9.3f} {b:9.3f} {a / b:6.2f}")
                if not r.get("kernels"):
                    print("    (the trees' kernels differ: no per-kernel ratios)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
