"""Tuning the cuda target on a GPU (`gpu` tests; the hooks' CPU side is tested in
tests/autotune): candidates measured in fork-server workers with CUDA events, a crashing
candidate recorded as an error, and a tuned compile that matches the untuned one."""

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.autotune import records as R
from dnnc.autotune.measure import measure
from dnnc.autotune.tasks import extract
from dnnc.backends.cuda import tuning as cuda_tuning
from dnnc.compiler.driver import load_graph
from dnnc.backends.registry import REGISTRY
from dnnc.passes.manager import optimize

pytestmark = pytest.mark.gpu


def _tasks(model):
    machine = REGISTRY["cuda"].target()
    return machine, extract(optimize(load_graph(model), machine, 3), cuda_tuning)


def test_candidates_are_measured_and_checked_on_the_gpu():
    machine, tasks = _tasks(zoo.build("cnn"))
    for task in tasks[:3]:
        space = task.template.space(task.problem, machine)
        default = task.template.default(task.problem, machine)
        ref = measure(cuda_tuning, task.kernel, machine, [default], timed=False)[0]
        assert ref.error is None, ref.error
        results = measure(cuda_tuning, task.kernel, machine,
                          space.sample(np.random.default_rng(0), 3), reference=ref.outputs)
        for r in results:
            assert r.error is None and r.ms > 0, (task.name, r.config, r.error)


def test_a_tuned_cuda_compile_matches_the_default_one(tmp_path, rng):
    model = zoo.build("cnn")
    log = tmp_path / "cuda.jsonl"
    reports = dnnc.tune(model, "cuda", log=log, trials=24, progress=False)
    assert reports and all(r.default_ms for r in reports)
    machine = REGISTRY["cuda"].target()
    assert all(r.target == machine.key for r in R.read(log))
    tuned = dnnc.compile(model, "cuda", tuning_log=log)
    plain = dnnc.compile(model, "cuda")
    assert tuned.stats["tuned_kernels"] >= 1
    x = rng.standard_normal(tuned.input_types[0].shape).astype(np.float32)
    np.testing.assert_allclose(tuned(x, to="numpy"), plain(x, to="numpy"), rtol=1e-3,
                               atol=1e-4)


def test_a_cuda_artifact_keeps_its_tuned_configs(tmp_path):
    model = zoo.build("mlp", batch=4)
    log = tmp_path / "cuda.jsonl"
    dnnc.tune(model, "cuda", log=log, trials=12, progress=False)
    compiled = dnnc.compile(model, "cuda", tuning_log=log)
    compiled.save(tmp_path / "m.dnnc")
    loaded = dnnc.load(tmp_path / "m.dnnc")
    assert loaded.runtime.tuned == compiled.runtime.tuned != {}
