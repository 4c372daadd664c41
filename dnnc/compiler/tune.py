"""`dnnc.tune`: a model's kernels tuned for a target, every measurement appended to a log that
`dnnc.compile(..., tuning_log=...)` applies (the search itself is `dnnc/autotune/`)."""

from __future__ import annotations

import logging

from ..backends.registry import REGISTRY, default_target
from ..errors import ArgumentError
from ..levels import DEFAULT_OPT_LEVEL, OPT_LEVELS
from ..passes.manager import optimize
from .arguments import check_int, check_optional_bool, check_path
from .driver import check_precision, load_graph

logger = logging.getLogger(__name__)


def tune(model, target: str | None = None, *, log, trials: int = 200,
         input_shapes: dict | None = None, opt_level: int | None = None, cpu=None,
         timeout: float = 60.0, seed: int = 0, progress: bool | None = None,
         search: str = "xgb", scheduler: str | None = None, precision: str | None = None):
    """Tune `model`'s kernels for `target` (default: the host's fastest) with `trials`
    measurements in all, appending each to the JSON Lines file `log` (created if absent; an
    existing log is resumed: no config is measured twice). Returns the per-task reports
    (`autotune.tuner.table(reports)` prints them). Compile with the same `opt_level` and
    `input_shapes` and `tuning_log=log` to use the results. `search` is "xgb" (candidates
    the XGBoost cost model ranks fastest) or "random". `scheduler` is the address of a Dask
    scheduler (`tcp://HOST:8786`) whose workers measure the candidates (`pip install
    dnnc[cluster]`; each worker must be a machine like this one: others refuse).
    `precision` is the compile's (cuda, llvm: `dnnc.compile`): its records carry it in their
    target key, so they apply to compiles at that precision only. A target whose device
    this machine lacks (cuda without a GPU or CuPy) raises `DeviceError` before anything is
    measured or logged."""
    import sys

    from ..autotune import tuner
    from ..autotune.tasks import extract

    target = default_target() if target is None else target
    if target not in REGISTRY:
        raise ArgumentError(f"target must be one of {', '.join(REGISTRY)}, not {target!r}")
    spec = REGISTRY[target]
    if spec.tuning is None:
        raise ArgumentError(f"the {target} target has no schedule templates to tune")
    check_path("log", log)
    check_int("trials", trials, 1)
    check_int("opt_level", opt_level, OPT_LEVELS[0], OPT_LEVELS[-1], optional=True)
    check_optional_bool("progress", progress)
    check_precision(target, precision)
    if search not in tuner.SEARCHES:
        raise ArgumentError(f"search must be one of {', '.join(tuner.SEARCHES)}, not "
                            f"{search!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ArgumentError(f"timeout must be a positive number of seconds, not {timeout!r}")
    spec.require()   # the target's device (a GPU): measuring without it records only errors
    graph = load_graph(model, input_shapes)
    if not all(v.type.is_static for v in graph.inputs):
        dynamic = [f"{v.name} {v.type}" for v in graph.inputs
                   if not v.type.is_static]
        raise ArgumentError(f"tuning needs static input shapes; give input_shapes for "
                            f"{', '.join(dynamic)}")
    machine = spec.target(cpu, precision)
    level = DEFAULT_OPT_LEVEL if opt_level is None else opt_level
    graph = optimize(graph, machine, level)
    hooks = spec.tuning()
    tasks = extract(graph, hooks, machine)
    show = sys.stderr.isatty() if progress is None else progress
    if show:
        logger.info("tuning %d task(s) for %s (%s), %d trials", len(tasks),
                 machine.key.split(':')[0], machine.cpu or machine.arch, trials)
    if scheduler is None:
        return tuner.tune(tasks, machine, hooks, log, trials, timeout=timeout, seed=seed,
                          progress=show, search=search)
    try:
        import distributed
    except ImportError:
        raise ArgumentError("scheduler: measuring on a Dask cluster needs dask[distributed] "
                            "(pip install 'dnnc[cluster]')") from None
    try:
        client = distributed.Client(scheduler, timeout=30)
    except (OSError, TimeoutError) as exc:
        raise ArgumentError(f"scheduler: cannot reach {scheduler}: {exc}") from None
    with client:
        return tuner.tune(tasks, machine, hooks, log, trials, timeout=timeout, seed=seed,
                          progress=show, search=search, client=client)
