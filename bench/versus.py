"""This tree's dnnc against an older one, measured in one run: `bench/cpu.py` of each tree run
alternately (old, new, old, new, ...), each in its own process with its own tree first on the
import path, and the dnnc / onnxruntime ratios of every model compared.

    git worktree add --detach /tmp/old <commit>     # or: git archive <commit> | tar -x -C DIR
    python bench/versus.py /tmp/old [--rounds 2] [--models mlp,resnet18,FILE.onnx,...]
                                    [--repeat 20]

onnxruntime runs in both processes, so each tree's ratio is measured against the same peer
on the same machine in the same minutes; a model's new/old is the ratio of its median ratios
over the rounds, and the geometric mean of those says whether the change made dnnc faster
(< 1) or slower (> 1). The old tree's own bench/cpu.py is used, so it must accept `--models`
and `--repeat` and print its rows as this one's does.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]


def run_tree(tree: Path, models: str, repeat: int) -> dict[str, float]:
    """Model -> dnnc/onnxruntime ratio, from one run of the tree's bench/cpu.py."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(tree / "bench" / "cpu.py"), "--models", models,
                          "--repeat", str(repeat)], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"bench/cpu.py of {tree} failed:\n{out.stderr[-3000:]}")
    ratios = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        # model, compile s, fallbacks, kernels, dnnc ms, ort ms, ratio, [other peers,] check
        check = next((f for f in fields[7:] if f in ("ok", "MISMATCH")), None)
        if len(fields) >= 8 and check:
            if check == "MISMATCH":
                sys.exit(f"{tree}: {fields[0]} does not match onnxruntime")
            ratios[fields[0]] = float(fields[6])
    print(f"  {tree}: " + ", ".join(f"{m} {r:.2f}" for m, r in ratios.items()), flush=True)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the older tree (a worktree or an archive)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", default="mlp,cnn,resnet18,resnet50,mobilenet_v2,"
                                            "bert_tiny,bert_base")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    old, new = args.old.resolve(), HERE
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for k in range(args.rounds):
        print(f"round {k + 1}/{args.rounds}", flush=True)
        for which, tree in (("old", old), ("new", new)):
            runs[which].append(run_tree(tree, args.models, args.repeat))
    models = [m for m in runs["new"][0] if all(m in r for rs in runs.values() for r in rs)]
    print(f"\n{'model':22} {'old dnnc/ort':>12} {'new dnnc/ort':>12} {'new/old':>8}")
    changes = []
    for m in models:
        o = float(np.median([r[m] for r in runs["old"]]))
        n = float(np.median([r[m] for r in runs["new"]]))
        changes.append(n / o)
        print(f"{m:22} {o:12.2f} {n:12.2f} {n / o:8.2f}")
    geo = {w: math.exp(np.mean([math.log(np.median([r[m] for r in runs[w]])) for m in models]))
           for w in runs}
    print(f"{'geometric mean':22} {geo['old']:12.2f} {geo['new']:12.2f} "
          f"{geo['new'] / geo['old']:8.2f}")


if __name__ == "__main__":
    main()
