"""Tuning tasks (dnnc/autotune/tasks.py): identical kernels are one task counting them, a
task's key and template are the compile path's, dynamic shapes are refused, and the cuda
target's tasks and spaces build without a GPU."""

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.autotune.tasks import extract
from dnnc.backends.llvm import tuning as llvm_tuning
from dnnc.backends.plan import task_key
from dnnc.compiler.targets import REGISTRY
from dnnc.passes.manager import optimize


def test_identical_kernels_are_one_task_that_counts_them():
    """A 20 -> 24 -> 24 -> 24 -> 5 MLP: the two 24 -> 24 layers (with their ReLU) are one
    task standing for two kernels; every task is a dense, keyed by its kernel."""
    machine = REGISTRY["llvm"].target()
    model = zoo.build("mlp", batch=4, hidden=(24, 24, 24), in_features=20, classes=5)
    tasks = extract(optimize(dnnc.compiler.driver.load_graph(model), machine, 3),
                    llvm_tuning)
    assert [t.count for t in tasks] == [1, 2, 1]
    assert len({t.key for t in tasks}) == 3
    for task in tasks:
        assert task.key == task_key(task.kernel.func)
        assert task.template.name == "dense" and task.name.startswith("dense [")
        assert task.template is llvm_tuning.template_for(task.kernel, machine)[0]
    assert tasks[1].name == "dense [fc_1, relu_1]"


def test_dynamic_input_shapes_are_refused():
    machine = REGISTRY["llvm"].target()
    model = zoo.build("mlp", batch="N", hidden=(24,), in_features=20, classes=5)
    graph = optimize(dnnc.compiler.driver.load_graph(model), machine, 3)
    with pytest.raises(ValueError, match="static input shapes"):
        extract(graph, llvm_tuning)


def test_cuda_tasks_and_their_spaces_build_without_a_gpu(mlp):
    """The cuda target's tuning hooks on a small CNN and MLP: every task has a template, and a
    sample of every space's configs builds, verifies and renders (the configs a space offers
    are the ones its template accepts)."""
    from dnnc.backends.cuda import tuning as cuda_tuning
    from dnnc.backends.cuda.codegen import render_func
    from dnnc.ir import loop as L

    spec = REGISTRY["cuda"]
    machine = spec.target()
    assert spec.tuning() is cuda_tuning and machine.key.startswith("cuda")
    for model in (zoo.build("cnn"), mlp()):
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
