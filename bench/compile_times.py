"""What a compile costs a user, measured in one run: cold, from the disk cache in a new process,
and a new batch size.

    python bench/compile_times.py [--models resnet50,resnet18,bert_base] [--batch 1]
                                  [--new-batch 4,3,16] [--target llvm|cuda] [--precision fp16]

Per model (a zoo model built with a symbolic batch "N"): in a fresh process with an empty
cache folder, the first call at `--batch` (a cold compile: passes, lowering, LLVM, then the
call); in a second new process on the cache the first one filled, the same (the compile
cache's hit); then in that process each size of `--new-batch` called for the first time
(no compile where the model is batch-separable: `batch_split_calls`) next to a steady call of
that size. Each phase runs in its own subprocess so that nothing one leaves in memory helps
the next. On cuda (issue 31's bar: resnet50 at fp16 cold <= 30 s, cached <= 3 s) the first call
includes NVRTC and the module loads, and ends with a device synchronize.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, {root!r})
start = time.perf_counter()
import dnnc
from dnnc import zoo
model = zoo.build({name!r}, batch="N")
def inputs(n):
    return list(zoo.inputs_for(model, np.random.default_rng(n), {{"N": n}}).values())
imported = time.perf_counter() - start
def sync():
    if {target!r} == "cuda":
        import cupy
        cupy.cuda.Device().synchronize()
start = time.perf_counter()
compiled = dnnc.compile(model, target={target!r}, **{options!r})
if hasattr(compiled.runtime, "specialize_after"):
    compiled.runtime.specialize_after = None
compiled.run(*inputs({batch}))
sync()
first = time.perf_counter() - start
rows = []
for n in {sizes!r}:
    x = inputs(n)
    splits = getattr(compiled.runtime, "split_calls", 0)
    start = time.perf_counter()
    compiled.run(*x)
    sync()
    first_call = time.perf_counter() - start
    times = []
    for _ in range(5):
        start = time.perf_counter()
        compiled.run(*x)
        sync()
        times.append(time.perf_counter() - start)
    rows.append([n, first_call, sorted(times)[2],
                 getattr(compiled.runtime, "split_calls", 0) > splits])
print(json.dumps({{"imported": imported, "first": first,
                  "jit": getattr(compiled.runtime, "compile_seconds", 0.0), "sizes": rows}}))
"""


def run_child(name: str, batch: int, sizes: list[int], cache: Path, target: str,
              options: dict) -> dict:
    env = dict(os.environ, DNNC_CACHE="1", DNNC_CACHE_DIR=str(cache))
    code = CHILD.format(root=str(ROOT), name=name, batch=batch, sizes=sizes, target=target,
                        options=options)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{name}: the child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import dnnc
    from dnnc.backends.llvm.cpu import host_target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,resnet18,bert_base")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-batch", default="4,3,16", help="'' for none")
    parser.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
    parser.add_argument("--precision", default=None, help="fp16, bf16, tf32 (default fp32)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.new_batch.split(",") if n]
    options = {"precision": args.precision} if args.precision else {}
    cpu = host_target()
    print(f"# {platform.machine()} {cpu.cpu}, {cpu.threads} threads; dnnc {dnnc.__version__}; "
          f"target {args.target} {args.precision or 'fp32'}; "
          f"symbolic batch, first call at {args.batch}, then at {sizes}")
    print(f"{'model':14} {'cold s':>7} {'cached s':>8} {'(jit s)':>7}   "
          f"new sizes: batch first-call ms / steady ms (split)")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            cold = run_child(name, args.batch, [], Path(cache), args.target, options)
            warm = run_child(name, args.batch, sizes, Path(cache), args.target, options)
        news = "  ".join(f"{n}: {f * 1e3:.0f}/{s * 1e3:.0f}{' (split)' if split else ''}"
                         for n, f, s, split in warm["sizes"])
        print(f"{name:14} {cold['first']:7.1f} {warm['first']:8.2f} {warm['jit']:7.2f}   "
              f"{news}", flush=True)


if __name__ == "__main__":
    main()
