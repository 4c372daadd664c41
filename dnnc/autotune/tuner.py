"""`tune`: search each task's knob space, measure candidates, append every result to the log.

1. The tasks of the model (`tasks.extract`), each measured once with its template's default
   config: its default time, and the reference outputs every candidate must reproduce.
2. The trial budget (the whole model's) is shared by expected gain: in proportion to each
   task's weight, its kernel count times its default time (Ansor's task scheduler shares by
   gradient; the weight is its first step), at least one trial each while the budget lasts.
3. Each task's trials: candidates from its knob space, proposed by the XGBoost cost model
   (`search.ModelSearch`, `cost_model.py`: one model for all tasks, trained on every measured
   record of this target in the log and this run, retrained after each batch) or at random
   (`search="random"`, the baseline); configs the log already holds for this task and target
   are skipped (a resumed tune measures nothing twice); measured in batches in worker
   processes (`measure.py`), every result appended to the log as it comes; a task stops early
   when `patience` trials in a row found nothing faster.
4. Confirmation: a task whose search found configs faster than its default measures its
   `CONFIRM_TOP` best and the default again, one after another, `CONFIRM_ROUNDS` times
   (records marked `confirm`); what `compile` applies is the lowest median of those
   (`records.best_configs`), so that a candidate timed once in a quiet moment of a busy
   machine does not beat a default timed in a loud one. One source of truth: a task with
   confirmation records in the log (this run's or an earlier one's) reports their medians as
   its default and best, in its closing progress line, in the table and in `--json`
   (`records.confirmed_medians`, what `ranked_configs` ranks by), so the speedup shown is
   the one the applied config was confirmed at; a task without reports its search's times.

The log is the only state: stopping a tune loses at most the batch in flight, and running it
again resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..version import __version__
from ..ir.target import Target
from . import records as R
from .cost_model import CostModel
from .features import features
from .measure import measure, measure_on
from .search import ModelSearch, RandomSearch
from .tasks import Task

SEARCHES = ("xgb", "random")

logger = logging.getLogger(__name__)   # not `log`: the tuning log's parameter name

BATCH = 8   # candidates measured between two log appends
CONFIRM_TOP = 2      # the best candidates a task measures again beside its default
CONFIRM_ROUNDS = 2   # times each is measured again, interleaved with the others


@dataclass
class TaskReport:
    task: Task
    default_ms: float | None
    best_ms: float | None
    trials: int = 0
    errors: int = 0
    confirmed: bool = False   # default_ms and best_ms are confirmation medians (`_settle`)

    @property
    def weight(self) -> float:
        return self.task.count * (self.default_ms or 0.0)

    @property
    def speedup(self) -> float | None:
        if self.default_ms is None or self.best_ms is None:
            return None
        return self.default_ms / self.best_ms


def _config_dict(config) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def tune(tasks: list[Task], target: Target, hooks, log, trials: int, *, timeout: float = 60.0,
         seed: int = 0, patience: int = 64, progress: bool = True,
         search: str = "xgb", client=None) -> list[TaskReport]:
    """Tune `tasks` on `target` with `trials` measurements in all (defaults included),
    appending every result to the JSON Lines file `log`; `search` is "xgb" (the cost model)
    or "random"; `client` (a `distributed.Client`) measures the candidates on a Dask cluster
    instead of local worker processes."""
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, not {search!r}")
    known = R.read(log)
    model = CostModel(seed) if search == "xgb" else None
    reports, references = [], {}
    for task in tasks:
        default = task.template.default(task.problem, target)
        old = [r for r in known if r.task == task.key and r.target == target.key and
               r.config == _config_dict(default) and r.error is None]
        # the default's outputs are every candidate's reference; its time is measured once
        # (a resumed tune only runs it again, untimed, for the outputs)
        result = measure(hooks, task.kernel, target, [default], seed=seed, timeout=timeout,
                         timed=not old)[0]
        references[task.key] = result.outputs
        if not old:   # known to the search from now on: never proposed again
            known += _append(log, task, target, [result])
        ms = old[0].ms if old else result.ms
        best = min([r.ms for r in known if r.task == task.key and r.target == target.key and
                    r.error is None] + ([ms] if ms is not None else []), default=None)
        reports.append(TaskReport(task, ms, best, errors=int(result.error is not None)))
        if model is not None and ms is not None:   # warm start: this task's earlier records
            for r in known:
                if r.task == task.key and r.target == target.key and r.error is None:
                    _learn(model, task, target, hooks, r.config, ms / r.ms)
    budget = max(0, trials - sum(1 for r in reports))
    shares = _shares([r.weight for r in reports], budget)
    for report, share in sorted(zip(reports, shares), key=lambda p: -p[0].weight):
        if share == 0 or references[report.task.key] is None:
            continue   # no budget, or its default config does not run (nothing to compare)
        bar = _bar(report.task, share, progress)
        try:
            _tune_task(report, share, target, hooks, log, references[report.task.key],
                       known, model, bar, timeout=timeout, seed=seed, patience=patience,
                       client=client)
            known += _confirm(report, target, hooks, log, references[report.task.key], known,
                              timeout=timeout, seed=seed, client=client)
        finally:
            _settle(report, target, known)
            _done(report, bar, progress)
    for report in reports:
        _settle(report, target, known)
    return reports


def _settle(report: TaskReport, target: Target, known: list[R.Record]) -> None:
    """The report's default and best times from the log's confirmation records of its task
    where it has any (this run's and earlier ones'): the medians `records.ranked_configs`
    ranks by, so the table, the progress line and the config a compile applies agree. Left
    as the search measured them otherwise (the default's record, the fastest record: what
    a compile applies then)."""
    task = report.task
    medians = R.confirmed_medians(known, task.key, target.key)
    if not medians:
        return
    default = R.canonical(_config_dict(task.template.default(task.problem, target)))
    report.default_ms = medians.get(default)   # None: the default failed its confirmation
    report.best_ms = min(medians.values())
    report.confirmed = True


def _confirm(report: TaskReport, target: Target, hooks, log, reference, known, *, timeout,
             seed, client=None) -> list[R.Record]:
    """The confirmation round of a task (see the module's docstring); its records. Nothing
    when no candidate beat the default, or when a resumed tune measured nothing new since
    the last confirmation."""
    task = report.task
    mine = [r for r in known if r.task == task.key and r.target == target.key]
    default = task.template.default(task.problem, target)
    dkey = R.canonical(_config_dict(default))
    last = max((r.time for r in mine if r.confirm), default=None)
    fastest: dict[str, R.Record] = {}
    for r in mine:
        key = R.canonical(r.config)
        if r.error is None and not r.confirm and key != dkey and \
                (key not in fastest or r.ms < fastest[key].ms):
            fastest[key] = r
    if report.default_ms is None or (last is not None and all(r.time <= last for r in mine)):
        return []
    top = sorted(fastest.values(), key=lambda r: r.ms)[:CONFIRM_TOP]
    top = [r for r in top if r.ms < report.default_ms]
    if not top:
        return []
    space = task.template.space(task.problem, target)
    configs = [default] + [space.check(r.config) for r in top]
    added = []
    for _ in range(CONFIRM_ROUNDS):
        results = _measure(client, hooks, task, target, configs, reference, seed, timeout)
        added += _append(log, task, target, results, confirm=True)
    return added


def _measure(client, hooks, task: Task, target: Target, configs, reference, seed, timeout):
    """`configs` of `task` measured here (`measure`) or on the measuring server `client`
    (`measure_on`), against `reference`."""
    if client is None:
        return measure(hooks, task.kernel, target, configs, reference=reference, seed=seed,
                       timeout=timeout)
    return measure_on(client, target.name, task.kernel, target, configs, reference=reference,
                      seed=seed, timeout=timeout)


def _featurize(task: Task, target: Target, hooks, config) -> np.ndarray:
    config = task.template.space(task.problem, target).check(config)
    return features(hooks.build(task.kernel, target, config))


def _learn(model: CostModel, task: Task, target: Target, hooks, config, speedup: float):
    """One measured config as a training row: its features, its speedup over the default."""
    try:
        model.add(task.key, _featurize(task, target, hooks, config), speedup)
    except Exception:   # a logged config this template no longer builds: nothing to learn
        pass


def _shares(weights: list[float], budget: int) -> list[int]:
    """`budget` trials shared in proportion to `weights` (largest remainders), every task with
    a weight getting one before any gets two while the budget lasts."""
    n = len(weights)
    if not n or not budget:
        return [0] * n
    order = sorted(range(n), key=lambda k: -weights[k])
    shares = [0] * n
    for k in order[:budget]:
        shares[k] = 1
    rest = budget - sum(shares)
    total = sum(weights)
    if rest <= 0 or total <= 0:
        return shares
    exact = [rest * w / total for w in weights]
    floors = [math.floor(x) for x in exact]
    for k in range(n):
        shares[k] += floors[k]
    left = rest - sum(floors)
    for k in sorted(range(n), key=lambda k: floors[k] - exact[k])[:left]:
        shares[k] += 1
    return shares


def _tune_task(report: TaskReport, share: int, target: Target, hooks, log, reference, known,
               model, bar, *, timeout, seed, patience, client=None) -> None:
    """The task's search: `share` trials at most, `bar` (or None) counting them."""
    task = report.task
    space = task.template.space(task.problem, target)
    done = R.measured(known, task.key, target.key)
    rng = np.random.default_rng([seed, int(task.key[:8], 16)])
    if model is None:
        search = RandomSearch(space, rng, done)
    else:
        model.fit()
        search = ModelSearch(space, rng, done, model,
                             lambda c: _featurize(task, target, hooks, c))
    since_better = 0
    while report.trials < share and since_better < patience:
        batch = search.next(min(BATCH, share - report.trials))
        if not batch:
            break   # the space is exhausted
        results = _measure(client, hooks, task, target, batch, reference, seed, timeout)
        known += _append(log, task, target, results)
        if model is not None and report.default_ms is not None:
            for result in results:
                if result.error is None:
                    _learn(model, task, target, hooks, result.config,
                           report.default_ms / result.ms)
            model.fit()
        for result in results:
            report.trials += 1
            if result.error is not None:
                report.errors += 1
                since_better += 1
            elif report.best_ms is None or result.ms < report.best_ms:
                report.best_ms = result.ms
                since_better = 0
            else:
                since_better += 1
        if bar is not None:
            bar.set_postfix_str(_postfix(report))
            bar.update(len(results))


def _done(report: TaskReport, bar, progress: bool) -> None:
    """The task's closing line, once confirmed: its bar's last state on a terminal, a log
    line otherwise."""
    if isinstance(bar, TrialLines):   # stderr is no terminal: a line, not a bar's redraws
        logger.info("%s: %d trial(s), %s", report.task.name, report.trials, _postfix(report))
    elif bar is not None:
        bar.set_postfix_str(_postfix(report))
        bar.close()


def _append(log, task: Task, target: Target, results, confirm: bool = False
            ) -> list[R.Record]:
    records = [R.Record(task.key, task.template.name, target.key, _config_dict(r.config),
                        r.ms if r.error is None else None, r.error, time.time(), __version__,
                        confirm)
               for r in results]
    R.append(log, records)
    return records


class TrialLines:
    """A task's progress where stderr is no terminal (a CI or device log): a line every
    `LINE_SECONDS` while trials run, with the count and an ETA from the rate so far, so a
    task of minutes (60 trials of a GPU template: 3-4 min of NVRTC and measurements) is not
    silent until it ends. The closing line is `_done`'s. The calls a tqdm bar takes."""

    LINE_SECONDS = 30.0

    def __init__(self, name: str, total: int):
        self.name, self.total, self.n = name, total, 0
        self.start = self.last = time.monotonic()
        self.postfix = ""

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def update(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last < self.LINE_SECONDS or self.n >= self.total:
            return
        self.last = now
        eta = (now - self.start) / self.n * (self.total - self.n)
        logger.info("%s: %d/%d trials, %s, ETA %.0f s", self.name, self.n, self.total,
                    self.postfix, eta)

    def close(self) -> None:
        pass


def _bar(task: Task, total: int, progress: bool):
    """A bar of the task's trials on a terminal (kept when done: one line per task), lines
    (`TrialLines`) elsewhere."""
    if not progress:
        return None
    if not sys.stderr.isatty():
        return TrialLines(task.name, total)
    from tqdm import tqdm

    return tqdm(total=total, desc=task.name[:40], unit="trial", file=sys.stderr,
                leave=True, dynamic_ncols=True)


def ms_text(ms: float | None) -> str:
    """Milliseconds as the progress line and the table print them: 3 decimals from 1 ms up,
    3 significant digits below (a 4 us kernel read "0.000 ms" at 3 decimals); "-" for none."""
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms >= 1 else f"{ms:.3g}"


def _postfix(report: TaskReport) -> str:
    confirmed = " (confirmed medians)" if report.confirmed else ""
    return (f"best {ms_text(report.best_ms)} ms, default {ms_text(report.default_ms)} ms"
            f"{confirmed}, errors {report.errors}")


def table(reports: list[TaskReport]) -> str:
    """The closing table: task, weight, default and best time, speedup, trials, errors."""
    lines = [f"{'task':44} {'count':>5} {'default ms':>10} {'best ms':>9} {'speedup':>7} "
             f"{'trials':>6} {'errors':>6}"]
    for r in sorted(reports, key=lambda r: -r.weight):
        default, best = ms_text(r.default_ms), ms_text(r.best_ms)
        speed = "-" if r.speedup is None else f"{r.speedup:.2f}x"
        lines.append(f"{r.task.name[:44]:44} {r.task.count:5d} {default:>10} {best:>9} "
                     f"{speed:>7} {r.trials:6d} {r.errors:6d}")
    return "\n".join(lines)
