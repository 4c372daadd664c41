"""Tuning (issue 13, first slice): records that survive bad lines, candidates that crash, hang
or compute wrong results recorded as errors and never applied, resumed tunes that measure no
config twice, logs of another machine not applied, and tuned compiles that match the
reference."""

import dataclasses
import json
import os
import signal
import time

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.autotune import records as R
from dnnc.autotune.measure import measure
from dnnc.autotune.tasks import extract
from dnnc.autotune.tuner import CONFIRM_ROUNDS, CONFIRM_TOP, tune
from dnnc.backends.llvm import tuning as llvm_tuning
from dnnc.backends.registry import REGISTRY
from dnnc.passes.manager import optimize


def _mlp():
    return zoo.build("mlp", batch=4, hidden=(24,), in_features=20, classes=5)


def _tasks():
    machine = REGISTRY["llvm"].target()
    graph = optimize(dnnc.compiler.driver.load_graph(_mlp()), machine, 3)
    return machine, extract(graph, llvm_tuning)


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


class Misbehaving:
    """The llvm hooks, except that chosen configs crash, hang or compute a wrong result."""

    def __init__(self, crash, hang, wrong):
        self.crash, self.hang, self.wrong = crash, hang, wrong
        self.template_for = llvm_tuning.template_for
        self.build = llvm_tuning.build

    def compile_kernel(self, func, arrays, target):
        call = llvm_tuning.compile_kernel(func, arrays, target)
        config = self.current

        def bad():
            if config == self.crash:
                os.kill(os.getpid(), signal.SIGSEGV)
            if config == self.hang:
                time.sleep(3600)
            call()
            if config == self.wrong:
                arrays[-1].reshape(-1)[0] += 1.0

        return bad


def test_crashing_hanging_and_wrong_candidates_are_errors(rng):
    machine, tasks = _tasks()
    task = next(t for t in tasks if t.template.name == "dense")
    space = task.template.space(task.problem, machine)
    default = task.template.default(task.problem, machine)
    crash, hang, wrong, fine = [c for c in space.sample(rng, 10) if c != default][:4]
    hooks = Misbehaving(crash, hang, wrong)
    build = hooks.build

    def remembering_build(kernel, target, config):
        hooks.current = config
        return build(kernel, target, config)

    hooks.build = remembering_build
    (ref,) = measure(hooks, task.kernel, machine, [default])
    assert ref.error is None and ref.outputs is not None
    results = measure(hooks, task.kernel, machine, [crash, hang, wrong, fine],
                      reference=ref.outputs, timeout=5)
    errors = [r.error for r in results]
    assert "signal 11" in errors[0]
    assert "timed out" in errors[1]
    assert "wrong result" in errors[2]
    assert errors[3] is None and results[3].ms > 0


def test_a_tune_resumes_without_measuring_a_config_twice_and_its_log_applies(tmp_path, rng):
    log = tmp_path / "log.jsonl"
    machine, tasks = _tasks()
    tune(tasks, machine, llvm_tuning, log, trials=12, progress=False)
    tune(tasks, machine, llvm_tuning, log, trials=12, progress=False)
    records = R.read(log)
    seen = [(r.task, R.canonical(r.config)) for r in records if not r.confirm]
    assert len(seen) == len(set(seen)) and len(seen) > 12
    # a confirmation round re-measures a task's best and default, once per run that
    # measured something new for it: the second run adds at most one more
    for task in tasks:
        confirms = [r for r in records if r.task == task.key and r.confirm]
        assert len(confirms) <= 2 * (1 + CONFIRM_TOP) * CONFIRM_ROUNDS
    model = dnnc.compile(_mlp(), "llvm", tuning_log=log)
    assert model.stats["tuned_kernels"] == len(tasks) == 2   # hidden layer, head
    assert model.tuning["records_applied"] == 2
    x = rng.standard_normal((4, 20)).astype(np.float32)
    np.testing.assert_allclose(model(x), dnnc.compile(_mlp(), "numpy")(x), rtol=1e-5,
                               atol=1e-5)
    # the same log on another machine (another CPU name or features) applies nothing
    other = tmp_path / "other.jsonl"
    R.append(other, [dataclasses.replace(r, target=r.target.replace(machine.cpu, "other-cpu"))
                     for r in records])
    assert dnnc.compile(_mlp(), "llvm", tuning_log=other).stats["tuned_kernels"] == 0


def test_errors_are_never_applied(tmp_path):
    """A record with an error (however fast it claims nothing) never wins."""
    machine, tasks = _tasks()
    task = tasks[0]
    config = dataclasses.asdict(task.template.default(task.problem, machine))
    log = tmp_path / "log.jsonl"
    R.append(log, [R.Record(task.key, task.template.name, machine.key, config,
                            error="wrong result")])
    assert R.best_configs(R.read(log), machine.key) == {}
    assert dnnc.compile(_mlp(), "llvm", tuning_log=log).stats["tuned_kernels"] == 0


def test_dnnc_tune_refuses_what_it_cannot_tune(tmp_path):
    with pytest.raises(dnnc.errors.ArgumentError, match="no schedule templates"):
        dnnc.tune(_mlp(), "numpy", log=tmp_path / "l.jsonl")
    with pytest.raises(dnnc.errors.ArgumentError, match="trials"):
        dnnc.tune(_mlp(), "llvm", log=tmp_path / "l.jsonl", trials=0)


def test_the_tune_command_and_compile_with_its_log(tmp_path, capsys):
    from dnnc.compiler.cli import main

    model, log = tmp_path / "mlp.onnx", tmp_path / "log.jsonl"
    import onnx

    onnx.save(_mlp(), model)
    assert main(["tune", str(model), "--log", str(log), "--trials", "8", "-q"]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "tuned 2 task(s)" in out
    assert len([r for r in R.read(log) if not r.confirm]) == 8   # --trials: the search's
    assert main(["compile", str(model), "-o", str(tmp_path / "m.dnnc"), "--tuning-log",
                 str(log), "-q"]) == 0
    assert "2 kernel(s) tuned" in capsys.readouterr().out
    assert main(["compile", str(model), "--target", "numpy", "-o", str(tmp_path / "n.dnnc"),
                 "--tuning-log", str(log), "-q"]) == 2
    assert "not tuned" in capsys.readouterr().err


def test_the_cost_model_learns_an_order_within_tasks(rng):
    """Rows whose label grows with feature 0 (in two tasks of unlike scales): the trained
    model ranks unseen rows of either task in that order."""
    from dnnc.autotune.cost_model import CostModel

    model = CostModel(seed=0)
    for task, scale in (("a", 1.0), ("b", 100.0)):
        for _ in range(40):
            f = rng.uniform(0, 10, 8)
            model.add(task, f, scale * (1 + f[0]) + rng.normal(0, 0.01))
    assert not model.trained
    model.fit()
    probe = np.zeros((5, 8))
    probe[:, 0] = [0.5, 2.5, 4.5, 6.5, 8.5]
    probe[:, 1:] = rng.uniform(0, 10, (5, 7))
    assert list(np.argsort(model.predict(probe))) == [0, 1, 2, 3, 4]


def test_the_default_config_is_measured_once(tmp_path):
    """Its record is written first; the search never proposes it again in the same run."""
    log = tmp_path / "log.jsonl"
    machine, tasks = _tasks()
    task = tasks[-1]   # the head: a small space, so a search would soon reach the default
    size = len(list(task.template.space(task.problem, machine).configs()))
    tune([task], machine, llvm_tuning, log, trials=size + 5, progress=False, search="random")
    seen = [R.canonical(r.config) for r in R.read(log) if not r.confirm]
    assert len(seen) == len(set(seen)) == size   # the whole space, each config once


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


def test_a_task_that_found_something_faster_confirms_it(tmp_path):
    log = tmp_path / "log.jsonl"
    machine, tasks = _tasks()
    task = tasks[0]
    reports = tune([task], machine, llvm_tuning, log, trials=10, progress=False,
                   search="random")
    records = R.read(log)
    confirms = [r for r in records if r.confirm]
    searched = [r for r in records if not r.confirm and r.error is None]
    default = dataclasses.asdict(task.template.default(task.problem, machine))
    if min(r.ms for r in searched if r.config != default) < \
            next(r.ms for r in searched if r.config == default):
        assert confirms and {R.canonical(r.config) for r in confirms} >= {R.canonical(default)}
        assert len(confirms) % CONFIRM_ROUNDS == 0
        assert reports[0].best_ms <= reports[0].default_ms
    else:
        assert not confirms
    # resumed with nothing new to measure: no second confirmation
    tune([task], machine, llvm_tuning, log, trials=1, progress=False, search="random")
    assert [r for r in R.read(log) if r.confirm] == confirms


def test_a_small_task_tunes_on_a_dask_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    import dask

    machine, tasks = _tasks()
    log = tmp_path / "log.jsonl"
    with dask.config.set({"distributed.worker.daemon": False}), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                     dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        reports = tune(tasks[-1:], machine, llvm_tuning, log, trials=6, progress=False,
                       search="random", client=client)
    records = R.read(log)
    assert all(r.error is None and r.ms > 0 for r in records)
    assert len([r for r in records if not r.confirm]) == 6 and reports[0].trials == 5
    # the confirmation round, when there is one, measured on the cluster too
    assert len([r for r in records if r.confirm]) in \
        {0} | {(1 + k) * CONFIRM_ROUNDS for k in range(1, CONFIRM_TOP + 1)}


def test_an_artifact_keeps_its_tuned_configs_for_shapes_compiled_after_a_load(tmp_path, rng):
    """A dynamic batch: nothing is compiled before the first call, so the kernels built after
    `dnnc.load` take the log's configs from the artifact."""
    dynamic = zoo.build("mlp", batch="N", hidden=(24,), in_features=20, classes=5)
    name = dynamic.graph.input[0].name
    log = tmp_path / "log.jsonl"
    dnnc.tune(dynamic, "llvm", log=log, trials=6, input_shapes={name: (4, 20)},
              progress=False)
    model = dnnc.compile(dynamic, "llvm", tuning_log=log)
    assert model.stats["tuned_kernels"] == 0   # nothing compiled yet
    model.save(tmp_path / "m.dnnc")
    loaded = dnnc.load(tmp_path / "m.dnnc")
    x = rng.standard_normal((4, 20)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), dnnc.compile(dynamic, "numpy")(x), rtol=1e-5,
                               atol=1e-5)
    assert loaded.stats["tuned_kernels"] == 2


def test_a_worker_from_a_fork_server_measures_as_a_forked_one():
    """The cuda target's workers come from a fork server (CUDA does not survive a fork): the
    kernel and config travel pickled, the hooks by module name; a wrong result is still an
    error."""
    machine, tasks = _tasks()
    task = tasks[0]
    default = task.template.default(task.problem, machine)
    ref = measure(llvm_tuning, task.kernel, machine, [default], timed=False)[0]
    got = measure(llvm_tuning, task.kernel, machine, [default], reference=ref.outputs,
                  start_method="forkserver")[0]
    assert got.error is None and got.ms > 0
    wrong = [np.zeros_like(o) + 1.0 for o in ref.outputs]
    bad = measure(llvm_tuning, task.kernel, machine, [default], reference=wrong,
                  start_method="forkserver")[0]
    assert bad.error and bad.error.startswith("wrong result")


def test_cuda_tasks_and_their_spaces_build_without_a_gpu():
    """The cuda target's tuning hooks on a small CNN and MLP: every task has a template, and a
    sample of every space's configs builds, verifies and renders (the configs a space offers
    are the ones its template accepts)."""
    from dnnc.backends.cuda import tuning as cuda_tuning
    from dnnc.backends.cuda.codegen import render_func
    from dnnc.ir import loop as L

    spec = REGISTRY["cuda"]
    machine = spec.target()
    assert spec.tuning() is cuda_tuning and machine.key.startswith("cuda")
    for model in (zoo.build("cnn"), _mlp()):
        graph = optimize(dnnc.compiler.driver.load_graph(model), machine, 3)
        tasks = extract(graph, cuda_tuning)
        assert tasks
        for task in tasks:
            space = task.template.space(task.problem, machine)
            for config in space.sample(np.random.default_rng(0), 4) + \
                    [task.template.default(task.problem, machine)]:
                func = cuda_tuning.build(task.kernel, machine, space.check(config))
                L.verify(func)
                render_func(func)
