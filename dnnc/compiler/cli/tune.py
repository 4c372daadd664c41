"""`dnnc tune`: search each kernel's schedule knobs, measuring candidates in worker processes,
and append every result to a tuning log that `dnnc compile --tuning-log` applies.

Tuning is `compiler/tune.py`'s and the autotuner's; this module reads the options and prints
the table of tasks. It never writes anything but the log (through the tuner).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .exits import UsageError
from .models import check_model_file, import_graph
from .options import (check_writable, example_shape, int_at_least, parse_input_shape,
                      precision_option, print_json, seconds, shape_option)

log = logging.getLogger(__name__)


def add_parser(sub, targets: list[str], default: str):
    """The `tune` subcommand's parser; `targets` and `default` are --target's choices."""
    tune = sub.add_parser("tune", help="tune a model's kernels; records go to a log",
                          description="Search each kernel's schedule knobs, measuring "
                                      "candidates in worker processes; every result is "
                                      "appended to the log (a run resumes it), and `dnnc "
                                      "compile --tuning-log` applies the best.")
    tune.add_argument("model", help="an .onnx file")
    tune.add_argument("--target", default=default, choices=targets,
                      help=f"target (default {default})")
    tune.add_argument("--log", required=True, help="the JSON Lines tuning log (appended)")
    tune.add_argument("--trials", type=int_at_least(1), default=200,
                      help="measurements for the whole model (default 200)")
    tune.add_argument("--timeout", type=seconds, default=60.0,
                      help="seconds one candidate may take (default 60)")
    tune.add_argument("--opt-level", type=int, default=None, choices=[0, 1, 2, 3],
                      help="optimisation level, as the compile that uses the log (default 3)")
    tune.add_argument("--seed", type=int_at_least(0), default=0, help="search seed")
    tune.add_argument("--scheduler", metavar="ADDR",
                      help="measure on a Dask cluster (tcp://HOST:8786; pip install "
                           "'dnnc[cluster]')")
    tune.add_argument("--search", default="xgb", choices=["xgb", "random"],
                      help="candidates the XGBoost cost model ranks fastest (default), or "
                           "random ones")
    precision_option(tune)
    shape_option(tune)
    tune.set_defaults(run=run)
    return tune


def run(args) -> int:
    from ...autotune.tuner import table
    from ...backends.registry import REGISTRY
    from ..tune import tune

    shapes = dict(parse_input_shape(s) for s in args.input_shape)
    REGISTRY[args.target].require()   # no GPU: one line, before any progress or log
    check_writable(Path(args.log), "--log")
    check_model_file(args.model)
    log.info(f"importing {args.model}")
    graph = import_graph(args.model, shapes)
    dynamic = [v for v in graph.inputs if not v.type.is_static]
    if dynamic:
        raise UsageError("tuning needs static input shapes; fix them with --input-shape, "
                         "e.g. " + " ".join(f"--input-shape {v.name}="
                                            f"{example_shape(v.type.shape)}" for v in dynamic))
    start = time.perf_counter()
    reports = tune(graph, args.target, log=args.log, trials=args.trials,
                   opt_level=args.opt_level, timeout=args.timeout, seed=args.seed,
                   progress=not args.quiet, search=args.search, scheduler=args.scheduler,
                   precision=args.precision)
    seconds = time.perf_counter() - start
    if args.json:
        print_json({"log": args.log, "seconds": seconds, "tasks": [
            {"task": r.task.name, "key": r.task.key, "count": r.task.count,
             "default_ms": r.default_ms, "best_ms": r.best_ms, "speedup": r.speedup,
             "trials": r.trials, "errors": r.errors} for r in reports]})
        return 0
    print(table(reports))
    print(f"tuned {len(reports)} task(s) in {seconds:.1f} s; records in {args.log} (compile "
          f"with --tuning-log {args.log})")
    return 0
