"""The tuning log (dnnc/autotune/records.py): unusable lines skipped with a warning naming
them, errors never applied, the confirmed config applied over a lucky one, the best record
per task and target, and appends that never rewrite what the log holds."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import dnnc
from dnnc.autotune import records as R


def test_a_bad_line_is_skipped_with_a_warning_naming_it(tmp_path):
    log = tmp_path / "log.jsonl"
    good = R.Record("t1", "dense", "llvm:x:+a", {"mr": 4}, ms=0.5)
    log.write_text("\n".join([good.to_json(), "{not json", json.dumps({"task": "t2"}),
                              json.dumps(dict(json.loads(good.to_json()), ms=-1)),
                              good.to_json()[:20]]) + "\n")
    with pytest.warns(R.TuningLogWarning) as caught:
        records = R.read(log)
    assert [r.task for r in records] == ["t1"]
    assert [str(w.message).split(":")[1] for w in caught] == ["2", "3", "4", "5"]
    assert R.best_configs(records, "llvm:x:+a") == {"t1": {"mr": 4}}
    assert R.best_configs(records, "llvm:y:+a") == {}   # another machine's records


def test_errors_are_never_applied(tmp_path, mlp, llvm_tasks):
    """A record with an error (however fast it claims nothing) never wins."""
    machine, tasks = llvm_tasks
    task = tasks[0]
    config = dataclasses.asdict(task.template.default(task.problem, machine))
    log = tmp_path / "log.jsonl"
    R.append(log, [R.Record(task.key, task.template.name, machine.key, config,
                            error="wrong result")])
    assert R.best_configs(R.read(log), machine.key) == {}
    assert dnnc.compile(mlp(), "llvm", tuning_log=log).stats["tuned_kernels"] == 0


def test_the_config_applied_is_the_confirmed_one():
    """A candidate timed once in a quiet moment does not beat the confirmation round."""
    t, m = "t1", "llvm:x:+a"
    records = [R.Record(t, "dense", m, {"mr": 4}, ms=1.0),     # the default
               R.Record(t, "dense", m, {"mr": 6}, ms=0.5),     # lucky once
               R.Record(t, "dense", m, {"mr": 8}, ms=0.8)]
    assert R.best_configs(records, m) == {t: {"mr": 6}}       # no confirmation: fastest
    records += [R.Record(t, "dense", m, {"mr": c}, ms=ms, confirm=True)
                for c, ms in ((4, 1.0), (6, 1.1), (8, 0.9), (4, 1.0), (6, 1.2), (8, 0.9))]
    assert R.best_configs(records, m) == {t: {"mr": 8}}
    records += [R.Record(t, "dense", m, {"mr": c}, ms=ms, confirm=True)
                for c, ms in ((4, 0.7), (8, 1.0), (4, 0.7), (8, 1.0))]
    assert R.best_configs(records, m) == {t: {"mr": 4}}       # the default, confirmed
    line = R.Record(t, "dense", m, {"mr": 4}, ms=1.0, confirm=True).to_json()
    assert R._parse(line)[0].confirm and not R._parse(line.replace("true", "1"))[0].confirm


def test_the_best_record_is_chosen_per_task_and_per_target(rng):
    """Shuffled records of three tasks on two machines, errors faster than everything: each
    task gets its fastest error-free config on the machine asked for, and a task measured
    only elsewhere gets nothing."""
    here, there = "llvm:here:+a", "llvm:there:+a"
    records, want, elsewhere = [], {}, {}
    for task in ("t1", "t2"):
        times = rng.permutation(np.arange(1, 9)) * 0.25
        for mr, ms in enumerate(times):
            records.append(R.Record(task, "dense", here, {"mr": mr}, ms=float(ms)))
            records.append(R.Record(task, "dense", there, {"mr": mr}, ms=float(9 - ms)))
        records.append(R.Record(task, "dense", here, {"mr": 99}, error="crashed"))
        want[task] = {"mr": int(np.argmin(times))}
        elsewhere[task] = {"mr": int(np.argmax(times))}
    records.append(R.Record("t3", "dense", there, {"mr": 1}, ms=0.1))
    elsewhere["t3"] = {"mr": 1}
    records = [records[int(k)] for k in rng.permutation(len(records))]
    assert R.best_configs(records, here) == want
    assert R.best_configs(records, there) == elsewhere


def test_appending_never_rewrites_what_the_log_holds(tmp_path):
    """Each append adds its lines after the bytes already there, unchanged (a line this
    version cannot read included), and an empty append touches nothing."""
    log = tmp_path / "log.jsonl"
    first = [R.Record("t1", "dense", "m", {"mr": 4}, ms=1.0, time=1.0)]
    R.append(log, first)
    log.write_text(log.read_text() + "{a line of another tool\n")
    before = log.read_bytes()
    R.append(log, [])
    assert log.read_bytes() == before
    second = [R.Record("t1", "dense", "m", {"mr": 6}, ms=0.5, time=2.0),
              R.Record("t2", "dense", "m", {"mr": 4}, error="timed out", time=3.0)]
    R.append(log, second)
    after = log.read_bytes()
    assert after.startswith(before)
    assert after[len(before):].decode().splitlines() == [r.to_json() for r in second]
    with pytest.warns(R.TuningLogWarning, match=":2: skipped"):
        assert R.read(log) == first + second   # every field read back as written


def test_a_missing_log_is_empty_and_measured_counts_errors_too(tmp_path):
    assert R.read(tmp_path / "absent.jsonl") == []
    records = [R.Record("t1", "dense", "m", {"mr": 4, "nr": 8}, ms=1.0),
               R.Record("t1", "dense", "m", {"nr": 16, "mr": 4}, error="wrong result"),
               R.Record("t1", "dense", "other", {"mr": 2, "nr": 8}, ms=1.0),
               R.Record("t2", "dense", "m", {"mr": 6, "nr": 8}, ms=1.0)]
    assert R.measured(records, "t1", "m") == {R.canonical({"nr": 8, "mr": 4}),
                                              R.canonical({"mr": 4, "nr": 16})}
    assert R.canonical({"b": 1, "a": 2}) == R.canonical({"a": 2, "b": 1})


def _read_in_a_child(log) -> tuple[int, list[str]]:
    """`R.read(log)` in a child process (a line that crashed the reader cannot take pytest
    with it): the records read and the warnings' messages; fails on any exception."""
    code = ("import sys, warnings\n"
            "from dnnc.autotune import records as R\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    records = R.read(sys.argv[1])\n"
            "print(len(records))\n"
            "for w in caught:\n"
            "    assert w.category is R.TuningLogWarning, w\n"
            "    print(str(w.message).splitlines()[0][:300])\n")
    done = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    count, *messages = done.stdout.splitlines()
    return int(count), messages


HOSTILE = {   # what replaces `"ms": 0.5` of a good line, or the whole line
    "ms_overflows_a_float": '"ms": 1' + "0" * 400,
    "ms_past_the_digit_limit": '"ms": ' + "7" * 5000,
    "time_overflows_a_float": '"ms": 0.5, "time": 1' + "0" * 400 + ", \"x\": 0",
    "ms_nan": '"ms": NaN',
    "ms_minus_infinity": '"ms": -Infinity',
    "nested_config": '"ms": 0.5, "config": {"mr": ' + "[" * 500 + "]" * 500 + "}, \"x\": 0",
    "deep_nesting": "[" * 50_000,                 # RecursionError in json, under MAX_LINE
    "very_long_line": "[" * 100_000,              # longer than MAX_LINE: never parsed
    "megabytes_of_one_line": " " * 3_000_000 + "{}",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_line_is_skipped_with_a_warning(tmp_path, name):
    """Issue 30: numbers a float cannot hold, integers past Python's int-string limit and
    nesting past the recursion limit raised out of `read` (OverflowError, ValueError,
    RecursionError): every such line is a TuningLogWarning naming it, the rest is read."""
    good = R.Record("t1", "dense", "llvm:x:+a", {"mr": 4}, ms=0.5, time=1.0).to_json()
    text = HOSTILE[name]
    bad = good.replace('"ms": 0.5', text) if text.startswith('"ms"') else text
    if name == "time_overflows_a_float":
        bad = bad.replace('"time": 1.0', '"y": 1.0')
    if name == "nested_config":
        bad = bad.replace('"config": {"mr": 4}', '"z": 0')
    assert bad != good
    log = tmp_path / "log.jsonl"
    log.write_text(good + "\n" + bad + "\n" + good + "\n")
    count, messages = _read_in_a_child(log)
    assert count == 2
    assert len(messages) == 1 and f"{log}:2: skipped (" in messages[0], messages


def test_a_log_of_many_bad_lines_warns_a_bounded_number_of_times(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("{not json\n" * 1000)
    count, messages = _read_in_a_child(log)
    assert count == 0 and len(messages) == R.MAX_WARNINGS + 1
    assert messages[-1] == f"{log}: {1000 - R.MAX_WARNINGS} more unreadable line(s) skipped"


def test_configs_are_ranked_confirmed_first_then_by_fastest_time():
    t, m = "t1", "llvm:x:+a"
    records = [R.Record(t, "dense", m, {"mr": c}, ms=ms)
               for c, ms in ((4, 1.0), (6, 0.5), (8, 0.8), (10, 0.6), (12, 0.1))]
    records += [R.Record(t, "dense", m, {"mr": c}, ms=ms, confirm=True)
                for c, ms in ((4, 1.0), (6, 1.1), (8, 0.9), (4, 1.0), (6, 1.2), (8, 0.9))]
    records.append(R.Record(t, "dense", m, {"mr": 14}, error="crashed"))
    assert R.ranked_configs(records, m) == {t: [{"mr": 8}, {"mr": 4}, {"mr": 6},
                                                {"mr": 12}, {"mr": 10}]}
    assert R.best_configs(records, m) == {t: {"mr": 8}}
    assert R.confirmed_medians(records, t, m) == {
        R.canonical({"mr": 4}): 1.0, R.canonical({"mr": 6}): 1.15,
        R.canonical({"mr": 8}): 0.9}


def _task_log(tmp_path, task, machine, timed):
    """A log of `task` on `machine` whose confirmation records time each config of `timed`
    ((config, ms), ...) twice."""
    log = tmp_path / "log.jsonl"
    R.append(log, [R.Record(task.key, task.template.name, machine.key, config, ms=ms,
                            confirm=True) for _ in range(2) for config, ms in timed])
    return log


def test_a_best_config_that_breaks_a_constraint_falls_to_the_next_best(tmp_path, mlp,
                                                                      llvm_tasks):
    """Issue 30: the winning record's config breaks a constraint of its template's space:
    the compile takes the next-best record the template accepts (and keeps it in the
    artifact), not the default, and says so in a TuningLogWarning."""
    machine, tasks = llvm_tasks
    task = tasks[0]
    default = dataclasses.asdict(task.template.default(task.problem, machine))
    space = task.template.space(task.problem, machine)
    broken = dict(default, nr=16)          # 'nr == 32: B is packed in panels of 32 columns'
    valid = dict(default, mr=2)
    with pytest.raises(dnnc.errors.ConfigError, match="constraint"):
        space.check(broken)
    space.check(valid)
    log = _task_log(tmp_path, task, machine, [(broken, 0.5), (valid, 0.7), (default, 1.0)])
    assert R.ranked_configs(R.read(log), machine.key)[task.key] == [broken, valid, default]
    with pytest.warns(R.TuningLogWarning, match="constraint.*next-best"):
        model = dnnc.compile(mlp(), "llvm", tuning_log=log, cache=False)
    assert model.stats["tuned_kernels"] == 1
    assert model.runtime.tuned == {task.key: valid}
    # no config accepted at all: the default, with one warning
    log.unlink()
    log = _task_log(tmp_path, task, machine, [(broken, 0.5), (dict(default, nr=48), 0.6)])
    with pytest.warns(R.TuningLogWarning) as caught:
        model = dnnc.compile(mlp(), "llvm", tuning_log=log, cache=False)
    assert "no record of the task's 2 is accepted: the default" in str(caught[0].message)
    assert model.stats["tuned_kernels"] == 0 and model.runtime.tuned == {}


@pytest.mark.parametrize("cache", [False, True])
def test_a_log_with_no_record_for_the_model_or_machine_says_so_once(tmp_path, mlp, cache,
                                                                    monkeypatch):
    """Issue 30: a log of another machine, or of other kernels, applied silently
    (tuned_kernels=0, no word): one TuningLogWarning says so, from a fresh compile and from
    one the compile cache serves."""
    import warnings

    monkeypatch.setenv("DNNC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DNNC_CACHE", "1")
    monkeypatch.setattr(dnnc.compiler.cache, "MIN_STORE_SECONDS", 0.0)   # store at once
    machine = dnnc.backends.registry.REGISTRY["llvm"].target()
    cases = {"machine": R.Record("t1", "dense", "llvm:other-cpu:+a", {"mr": 4}, ms=0.5),
             "model": R.Record("0123456789abcdef", "dense", machine.key, {"mr": 4}, ms=0.5)}
    for name, record in cases.items():
        log = tmp_path / f"{name}.jsonl"
        R.append(log, [record])
        for _ in range(2 if cache else 1):   # the second from the cache
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = dnnc.compile(mlp(), "llvm", tuning_log=log, cache=cache)
            assert model.stats["tuned_kernels"] == 0
            messages = [str(w.message) for w in caught if w.category is R.TuningLogWarning]
            assert len(messages) == 1, messages
            assert messages[0].startswith(f"tuning log {log}: no record ")
            assert ("this machine" if name == "machine" else
                    "applies to any of this model's 2 kernel(s)") in messages[0]
        if cache:
            assert model.stats["compile_cache"] == "hit"
