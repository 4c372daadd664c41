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
from dnnc.ir import loop as L
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


def test_tma_producer_candidates_are_measured_with_their_tensor_maps():
    """On sm_90 at fp16: a dense product's candidates without a producer, with the cp.async
    one and with the TMA one (`compile_kernel` builds its tensor maps from the device copies'
    addresses) run and agree with the first's outputs."""
    from dataclasses import replace

    from dnnc.backends.cuda import device, mma

    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"TMA and wgmma need sm_90, not {device.gpu_arch()}")
    machine = REGISTRY["cuda"].target(precision="fp16")
    model = zoo.build("mlp", hidden=(1024,), in_features=512, classes=256, batch=1024)
    tasks = extract(optimize(load_graph(model), machine, 3), cuda_tuning, machine)
    task = next(t for t in tasks if t.template.name == "cuda_mma_dense")
    space = task.template.space(task.problem, machine)
    configs = [space.check(mma.TensorCoreConfig(128, 128, 64, 8, 1, 4, wgmma=True,
                                                producer=p)) for p in (False, True, "tma")]
    func = cuda_tuning.build(task.kernel, machine, configs[2])
    assert any(isinstance(n, L.TmaLoad) for n in L.walk(func.body))
    ref = measure(cuda_tuning, task.kernel, machine, configs[:1], timed=False)[0]
    assert ref.error is None, ref.error
    for r in measure(cuda_tuning, task.kernel, machine, configs, reference=ref.outputs):
        assert r.error is None and r.ms > 0, (r.config, r.error)
