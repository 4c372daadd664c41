"""The differential fuzzer over several configurations at once, in parallel shards.

    python bench/fuzz_sweep.py --cases 2000 --seed 2026 [--opt-levels 0,3] [--threads 1,2]
                               [--shards 3] [--out DIR] [--special] [--target T]
                               [--boost G ...]

Runs `python -m dnnc.testing.fuzz` for every (opt level, thread count) pair, each pair's case
range cut into `--shards` pieces run side by side (a machine with many cores finishes the
issue-10 sweep, 2000 cases x 4 configurations, in minutes), then prints one line per
configuration: cases, passed, mismatches, crashes, timeouts, errors, known differences.
Exit status 1 if any shard found something. Findings go to `--out/<config>/`. `--special`
sweeps the special-values cases (+-inf, NaN, huge values in the inputs), `--target` another
target than llvm (cuda on a GPU host), `--precision` a reduced one there (fp16, bf16: half
storage and tensor cores, judged within the fuzzer's PRECISION_UNITS), `--boost G` the
fuzzer's `--boost` (repeatable: `--boost sparse --boost sparse24` with DNNC_SPARSE24=1 sweeps
the 2:4 layers, docs/fuzzing.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

FIELDS = ("cases", "passed", "mismatches", "crashes", "timeouts", "errors", "known differences")


def parse_summary(text: str) -> dict[str, int]:
    """The counts of the fuzzer's summary line ("cases 60, passed 59, mismatches 0 ...")."""
    counts = {}
    for field in FIELDS:
        found = re.search(rf"\b{field} (\d+)", text)
        counts[field] = int(found.group(1)) if found else -1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--opt-levels", default="0,3")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("fuzz-findings"))
    parser.add_argument("--special", action="store_true",
                        help="special-values cases (the fuzzer's --special)")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--no-minimize", action="store_true",
                        help="save findings unminimised (the fuzzer's --no-minimize)")
    parser.add_argument("--boost", action="append", default=[],
                        help="the fuzzer's --boost G (repeatable)")
    parser.add_argument("--precision", default="fp32",
                        help="the fuzzer's --precision (cuda: tf32, fp16, bf16)")
    args = parser.parse_args()
    configs = [(int(o), int(t)) for o in args.opt_levels.split(",")
               for t in args.threads.split(",")]
    step = -(-args.cases // args.shards)
    start = time.perf_counter()
    jobs = []
    for opt, threads in configs:
        for shard in range(args.shards):
            first = shard * step
            count = min(step, args.cases - first)
            if count <= 0:
                continue
            out = args.out / f"o{opt}_t{threads}"
            cmd = [sys.executable, "-m", "dnnc.testing.fuzz", "--cases", str(count),
                   "--start", str(first), "--seed", str(args.seed), "--opt-level", str(opt),
                   "--threads", str(threads), "--out", str(out), "--quiet",
                   "--target", args.target, "--precision", args.precision] + \
                (["--special"] if args.special else []) + \
                (["--no-minimize"] if args.no_minimize else []) + \
                [x for g in args.boost for x in ("--boost", g)]
            jobs.append(((opt, threads), subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    totals: dict[tuple, dict[str, int]] = {}
    found = False
    for config, proc in jobs:
        text, _ = proc.communicate()
        found |= proc.returncode != 0
        counts = parse_summary(text)
        total = totals.setdefault(config, dict.fromkeys(FIELDS, 0))
        for field in FIELDS:
            total[field] += counts[field]
        if proc.returncode != 0:   # a finding (1) or a broken shard: its own report
            print(f"--- o{config[0]} t{config[1]} shard, exit {proc.returncode}:\n"
                  f"{text[-3000:]}")
    print(f"# fuzz sweep: {args.target}, seed {args.seed}"
          f"{' (special values)' if args.special else ''}"
          f"{''.join(f' --boost {g}' for g in args.boost)}, {args.cases} cases a configuration, "
          f"{args.shards} shards each, {time.perf_counter() - start:.0f} s")
    print(f"{'opt':>3} {'threads':>7} " + " ".join(f"{f:>10}" for f in FIELDS))
    for (opt, threads), total in totals.items():
        print(f"{opt:>3} {threads:>7} " + " ".join(f"{total[f]:>10}" for f in FIELDS))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
