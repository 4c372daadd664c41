"""Run the ONNX node suite against a target; print pass counts and failures grouped by reason.

    python tests/conformance/run.py --target numpy [--filter REGEX] [--opt-level N]
                                    [--write-expected] [-v]

`--write-expected` rewrites tests/conformance/expected/TARGET.txt with the cases that pass (at
the default opt level only: the expected lists hold for every level).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite import EXPECTED_DIR, all_cases, expected_passes, run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="numpy")
    parser.add_argument("--filter", default="", help="only cases whose name matches REGEX")
    parser.add_argument("--opt-level", type=int, default=None,
                        help="compile at this opt level (default: dnnc's)")
    parser.add_argument("--write-expected", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every failure")
    args = parser.parse_args()

    cases = all_cases()
    names = sorted(n for n in cases if re.search(args.filter, n))
    start = time.time()
    results = []
    for i, name in enumerate(names):
        results.append(run_case(cases[name], args.target, opt_level=args.opt_level))
        if sys.stderr.isatty() and i % 50 == 0:
            print(f"\r{i}/{len(names)} cases", end="", file=sys.stderr)
    passed = [r.name for r in results if r.passed]
    failed = [r for r in results if not r.passed]
    groups = collections.defaultdict(list)
    for r in failed:
        groups[r.reason].append(r.name)
    level = "" if args.opt_level is None else f" at opt level {args.opt_level}"
    print(f"\ntarget {args.target}{level}: {len(passed)} passed, {len(failed)} failed of "
          f"{len(names)} cases ({time.time() - start:.0f} s)")
    through = [r for r in results if r.passed and r.fallbacks]
    if args.target != "numpy":
        ops = collections.Counter(op for r in through for op in r.fallbacks)
        print(f"  passed with no host fallback: {len(passed) - len(through)} "
              f"({100 * (len(passed) - len(through)) / max(len(passed), 1):.1f}%); through a "
              f"fallback: {len(through)}")
        if ops:
            print("  fallback ops (cases): " + ", ".join(f"{op} {n}" for op, n in
                                                         ops.most_common()))
    for reason, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shown = members if args.verbose else members[:4]
        more = "" if len(shown) == len(members) else f" … (+{len(members) - len(shown)})"
        print(f"  {len(members):4d}  {reason}: {' '.join(shown)}{more}")
    expected = set(expected_passes(args.target))
    regressed = sorted(expected & {r.name for r in failed})
    if regressed:
        print(f"REGRESSIONS ({len(regressed)}): {' '.join(regressed)}")
    if args.write_expected:
        if args.filter or args.opt_level is not None:
            print("refusing to write the expected list from a filtered run or one with "
                  "--opt-level", file=sys.stderr)
            return 2
        EXPECTED_DIR.mkdir(exist_ok=True)
        path = EXPECTED_DIR / f"{args.target}.txt"
        path.write_text(f"# node-suite cases expected to pass on target {args.target}; "
                        f"regenerate with tests/conformance/run.py --write-expected\n"
                        + "\n".join(passed) + "\n")
        print(f"wrote {path} ({len(passed)} cases)")
        if args.target != "numpy":
            native = sorted(r.name for r in results if r.passed and not r.fallbacks)
            path = EXPECTED_DIR / f"{args.target}.native.txt"
            path.write_text(f"# cases passing on {args.target} with no host fallback\n"
                            + "\n".join(native) + "\n")
            print(f"wrote {path} ({len(native)} cases)")
            reasons = {r.name: r.reason for r in failed}
            missing = sorted(set(expected_passes("numpy")) - set(passed))
            path = EXPECTED_DIR / f"{args.target}.exceptions.txt"
            path.write_text(f"# numpy-target passes that fail on {args.target}, with reasons\n"
                            + "".join(f"{n}: {reasons.get(n, 'not run')}\n" for n in missing))
            print(f"wrote {path} ({len(missing)} cases)")
    return 1 if regressed else 0


if __name__ == "__main__":
    sys.exit(main())
