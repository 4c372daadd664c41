"""Tuning records: JSON Lines, one measurement a line, appended and never rewritten.

A line says which kernel (`task`: `backends.plan.task_key` of the lowered kernel, and the
template that schedules it), on which machine (`target`: `Target.key`, the CPU name and
features or the GPU architecture), with which `config` (knob -> value), what it measured
(`ms`: the median milliseconds of one call) or why it has no time (`error`: a compile failure,
a crash, a hang, a wrong result), when, and with which dnnc. A reader skips a line it cannot
use with a warning naming the file and line, and goes on: a log cut short by a crash loses
only its last line.

`best_configs(records, target_key)` is what `dnnc.compile(..., tuning_log=...)` applies: per
task, the config with the lowest median time over its confirmation records (`confirm`: the
task's best candidates and its default measured again, one after another, at the end of its
search, so that a candidate timed once while the machine was quieter cannot win by luck), or
in a log without them, the config of the fastest error-free record measured on that target.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


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


class TuningLogWarning(UserWarning):
    """A line of a tuning log that could not be read (skipped)."""


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
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            record, why = _parse(line)
            if record is None:
                warnings.warn(f"{path}:{number}: skipped ({why})", TuningLogWarning,
                              stacklevel=2)
                continue
            out.append(record)
    return out


def _parse(line: str) -> tuple[Record | None, str]:
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
    if error is None and (isinstance(ms, bool) or not isinstance(ms, (int, float)) or
                          not ms > 0 or ms == float("inf")):
        return None, "neither a positive time 'ms' nor an 'error'"
    when = doc.get("time", 0.0)
    return Record(doc["task"], doc["template"], doc["target"], doc["config"],
                  None if error is not None else float(ms), error,
                  float(when) if isinstance(when, (int, float)) else 0.0,
                  str(doc.get("version", "")), doc.get("confirm") is True), ""


def best_configs(records: list[Record], target_key: str) -> dict[str, dict]:
    """task -> the config to apply on `target_key`: the lowest median over the task's
    confirmation records where it has any, else the fastest error-free record."""
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
        if task in confirmed:
            key = min(confirmed[task], key=lambda k: float(np.median(confirmed[task][k])))
        else:
            key = min(by_config, key=lambda k: min(by_config[k]))
        out[task] = configs[key]
    return out


def measured(records: list[Record], task: str, target_key: str) -> set[str]:
    """The configs (as canonical JSON) already measured for `task` on `target_key`, errors
    included: a resumed tune measures none of them again."""
    return {canonical(r.config) for r in records if r.task == task and r.target == target_key}


def canonical(config: dict) -> str:
    return json.dumps(config, sort_keys=True)
