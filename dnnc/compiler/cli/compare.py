"""`dnnc compare`: run a model on a target and on the numpy reference with the same random
inputs and report the first node, in the model's names, whose output differs; with
--bisect-passes also the first pass after which the results change.

The search is `compiler/compare.py`'s; this module reads the options and reports. A
divergence is a finding, not a failure: it exits 1 (`EXIT_FINDING`), never raises.
"""

from __future__ import annotations

import dataclasses

from .exits import EXIT_FINDING, EXIT_OK, UsageError
from .options import int_at_least, print_json, tolerance


def add_parser(sub, targets: list[str], default: str):
    """The `compare` subcommand's parser; `targets` and `default` are --target's choices."""
    cmp_ = sub.add_parser("compare", help="find the first node (and pass) a target gets wrong",
                          description="Run the model on a target and on the numpy reference "
                                      "with the same random inputs; report the first node, in "
                                      "the model's names, whose output differs.")
    cmp_.add_argument("model", help="an .onnx file")
    cmp_.add_argument("--target", default=default, choices=targets)
    cmp_.add_argument("--opt-level", type=int, default=None, choices=[0, 1, 2, 3])
    cmp_.add_argument("--bisect-passes", action="store_true",
                      help="also find the first pass after which the results change")
    cmp_.add_argument("--rtol", type=tolerance, default=1e-4,
                      help="relative tolerance, >= 0 (default 1e-4)")
    cmp_.add_argument("--atol", type=tolerance, default=1e-5,
                      help="absolute tolerance, >= 0 (default 1e-5)")
    cmp_.add_argument("--seed", type=int_at_least(0), default=0,
                      help="seed of the random inputs")
    cmp_.set_defaults(run=run)
    return cmp_


def run(args) -> int:
    from ..artifact import is_artifact
    from ..compare import bisect_passes, compare
    from ...backends.registry import REGISTRY

    if is_artifact(args.model):
        raise UsageError(f"{args.model} is an artifact; compare takes the ONNX model, to run "
                         f"on the reference too")
    if args.bisect_passes and not REGISTRY[args.target].runs_passes:
        raise UsageError("--bisect-passes: the numpy target runs no passes")
    options = dict(rtol=args.rtol, atol=args.atol, seed=args.seed)
    culprit = where = None
    if args.bisect_passes:
        found = bisect_passes(args.model, args.target, args.opt_level,
                              progress=not args.quiet, **options)
        if found is not None:
            culprit, where = found
    else:
        where = compare(args.model, args.target, args.opt_level, progress=not args.quiet,
                        **options)
    diverges = culprit is not None or where is not None
    if args.json:
        print_json({"target": args.target, "rtol": args.rtol, "atol": args.atol,
                    "divergence": diverges, "pass": culprit,
                    "node": None if where is None else dataclasses.asdict(where)})
    elif not diverges:
        print(f"no divergence: {args.target} matches the reference after every pass"
              if args.bisect_passes else
              f"no divergence: every kernel's and every node's output on {args.target} matches "
              f"the reference")
    else:
        if culprit is not None:
            print(f"first diverging pass: {culprit}")
        if where is not None:
            print(f"first diverging node: {where.where()}, output {where.value}, max "
                  f"abs error {where.max_abs_error:.3g} (rtol {args.rtol:g}, atol "
                  f"{args.atol:g})")
    return EXIT_FINDING if diverges else EXIT_OK
