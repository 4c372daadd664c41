"""Tuning records: JSON Lines, one measurement a line, appended and never rewritten.

A line says which kernel (`task`: `backends.plan.task_key` of the lowered kernel, and the
template that schedules it), on which machine (`target`: `Target.key`, the CPU name and
features or the GPU architecture), with which `config` (knob -> value), what it measured
(`ms`: the median milliseconds of one call) or why it has no time (`error`: a compile failure,
a crash, a hang, a wrong result), when, and with which dnnc. A reader skips a line it cannot
use with a `TuningLogWarning` naming the file and line, and goes on: a log cut short by a
crash loses only its last line. The log is input like any file a user is given: no line, however
crafted (huge numbers, thousands of digits, deep nesting, megabytes long), may raise out of
`read`; a line longer than `MAX_LINE` characters is skipped unread.

`ranked_configs(records, target_key)` is what `dnnc.compile(..., tuning_log=...)` applies: per
task, its configs best first: those of its confirmation records (`confirm`: the task's best
candidates and its default measured again, one after another, at the end of its search, so
that a candidate timed once while the machine was quieter cannot win by luck) by their median
time, then the other error-free records measured on that target by their fastest time. The
compile takes the first that its template accepts (`backends.plan.ProgramBuilder`);
`best_configs` is the first of each. `confirmed_medians` gives the medians the tuner reports,
so that its table, its progress lines and the log say the same.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TuningLogWarning


@dataclass
class Record:
    task: str                      # backends.plan.task_key of the lowered kernel
    template: str                  # the template the config is for
    target: str                    # Target.key of the machine it was measured on
    config: dict                   # knob -> value
    ms: float | None = None        # median milliseconds of one call; None with an error
    error: str | None = None
    time: float = field(default_factory=time.time)
    version: str = ""
    confirm: bool = False          # a measurement of the confirmation round

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


MAX_LINE = 1 << 16   # characters; a record is a few hundred
MAX_WARNINGS = 10    # bad lines of one log warned one by one; the rest in one warning

_FIELDS = {"task": str, "template": str, "target": str, "config": dict}


def append(path: str | os.PathLike, records: list[Record]) -> None:
    """Append `records` to the log at `path`, one line each, flushed to disk (a later crash
    keeps them)."""
    if not records:
        return
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(r.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read(path: str | os.PathLike) -> list[Record]:
    """Every usable record of the log at `path` (none when it does not exist); an unusable
    line is skipped with a `TuningLogWarning` naming it."""
    path = Path(path)
    if not path.exists():
        return []
    out, skipped = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(_lines(f), 1):
            if not line.strip():
                continue
            record, why = _parse(line)
            if record is None:
                skipped += 1
                if skipped <= MAX_WARNINGS:
                    warnings.warn(f"{path}:{number}: skipped ({why})", TuningLogWarning,
                                  stacklevel=2)
                continue
            out.append(record)
    if skipped > MAX_WARNINGS:
        warnings.warn(f"{path}: {skipped - MAX_WARNINGS} more unreadable line(s) skipped",
                      TuningLogWarning, stacklevel=2)
    return out


def _lines(f):
    """The lines of `f`, each read at most `MAX_LINE` characters at a time: a longer one is
    given as a placeholder that `_parse` refuses, never held whole in memory."""
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith("\n"):
            while (rest := f.readline(MAX_LINE)) and not rest.endswith("\n"):
                pass
            yield _TOO_LONG
        else:
            yield line


_TOO_LONG = "\0too long"


def _parse(line: str) -> tuple[Record | None, str]:
    """The record of one line, or None and why not. Never raises: whatever a line holds
    (numbers too big for a float, an integer past Python's digit limit, nesting past the
    recursion limit) is a reason to skip it."""
    if line is _TOO_LONG:
        return None, f"longer than {MAX_LINE} characters"
    try:
        return _parse_doc(line)
    except (ValueError, OverflowError, RecursionError, TypeError, MemoryError) as exc:
        return None, f"unreadable: {type(exc).__name__}: {str(exc)[:100]}"


def _parse_doc(line: str) -> tuple[Record | None, str]:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, f"not JSON: {exc.msg}"
    if not isinstance(doc, dict):
        return None, "not a JSON object"
    for name, kind in _FIELDS.items():
        if not isinstance(doc.get(name), kind):
            return None, f"field {name!r} missing or not a {kind.__name__}"
    ms, error = doc.get("ms"), doc.get("error")
    if error is not None and not isinstance(error, str):
        return None, "field 'error' is not a string"
    if not all(type(v) in (int, float, str, bool) for v in doc["config"].values()):
        return None, "field 'config' holds a value that is not a number, string or boolean"
    if error is None:
        ms = _finite(ms)
        if ms is None or not ms > 0:
            return None, "neither a positive time 'ms' nor an 'error'"
    when = _finite(doc.get("time", 0.0))
    return Record(doc["task"], doc["template"], doc["target"], doc["config"],
                  None if error is not None else ms, error,
                  0.0 if when is None else when,
                  str(doc.get("version", "")), doc.get("confirm") is True), ""


def _finite(x) -> float | None:
    """`x` as a finite float; None when it is no number (a boolean is none) or none that a
    float holds (raises OverflowError for an integer past a float's range)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if np.isfinite(x) else None


def best_configs(records: list[Record], target_key: str) -> dict[str, dict]:
    """task -> the config to apply on `target_key`: the first of `ranked_configs`."""
    return {task: ranked[0] for task, ranked in ranked_configs(records, target_key).items()}


def ranked_configs(records: list[Record], target_key: str) -> dict[str, list[dict]]:
    """task -> its configs measured on `target_key` without error, best first: those of its
    confirmation records by their median time, then the others by their fastest time (ties
    in the order the log first has them)."""
    times: dict[str, dict[str, list[float]]] = {}
    confirmed: dict[str, dict[str, list[float]]] = {}
    configs: dict[str, dict] = {}
    for r in records:
        if r.target != target_key or r.error is not None:
            continue
        key = canonical(r.config)
        configs[key] = r.config
        times.setdefault(r.task, {}).setdefault(key, []).append(r.ms)
        if r.confirm:
            confirmed.setdefault(r.task, {}).setdefault(key, []).append(r.ms)
    out = {}
    for task, by_config in times.items():
        medians = {k: float(np.median(v)) for k, v in confirmed.get(task, {}).items()}
        first = sorted(medians, key=medians.__getitem__)
        rest = sorted((k for k in by_config if k not in medians),
                      key=lambda k: min(by_config[k]))
        out[task] = [configs[k] for k in first + rest]
    return out


def confirmed_medians(records: list[Record], task: str, target_key: str) -> dict[str, float]:
    """canonical config -> the median time of its error-free confirmation records for `task`
    on `target_key` (what `ranked_configs` ranks a confirmed task by)."""
    times: dict[str, list[float]] = {}
    for r in records:
        if r.confirm and r.error is None and r.task == task and r.target == target_key:
            times.setdefault(canonical(r.config), []).append(r.ms)
    return {k: float(np.median(v)) for k, v in times.items()}


def measured(records: list[Record], task: str, target_key: str) -> set[str]:
    """The configs (as canonical JSON) already measured for `task` on `target_key`, errors
    included: a resumed tune measures none of them again."""
    return {canonical(r.config) for r in records if r.task == task and r.target == target_key}


def canonical(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def warn_unapplied(log, tuned: dict, target_key: str, kernels: int, tuned_kernels: int
                   ) -> None:
    """One `TuningLogWarning` when the log `log` (whose `ranked_configs` for `target_key` are
    `tuned`) changes nothing in a compile of `kernels` kernels of which `tuned_kernels` took a
    logged config: it holds no usable record for this machine, or none for this model's
    kernels (a log of another model, opt level, input shape or precision; or configs their
    templates all refused, each already warned of)."""
    if not tuned:
        machine = ":".join(target_key.split(":")[:2])   # the target and CPU or GPU name
        warnings.warn(f"tuning log {os.fspath(log)}: no record for this machine "
                      f"({machine}, its features and precision): every kernel keeps its "
                      f"default config",
                      TuningLogWarning, stacklevel=3)
    elif kernels and not tuned_kernels:
        warnings.warn(f"tuning log {os.fspath(log)}: no record applies to any of this "
                      f"model's {kernels} kernel(s) (a log of another model, opt level or "
                      f"input shape?): every kernel keeps its default config",
                      TuningLogWarning, stacklevel=3)
