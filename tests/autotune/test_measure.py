"""Measuring candidates (dnnc/autotune/measure.py): candidates that crash, hang or compute a
wrong result are recorded as errors, and a worker from a fork server (the cuda target's)
measures as a forked one does."""

import os
import signal
import time

import numpy as np

from dnnc.autotune.measure import measure
from dnnc.backends.llvm import tuning as llvm_tuning


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


def test_crashing_hanging_and_wrong_candidates_are_errors(rng, llvm_tasks):
    machine, tasks = llvm_tasks
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


def test_a_worker_from_a_fork_server_measures_as_a_forked_one(llvm_tasks):
    """The cuda target's workers come from a fork server (CUDA does not survive a fork): the
    kernel and config travel pickled, the hooks by module name; a wrong result is still an
    error."""
    machine, tasks = llvm_tasks
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


def test_half_kernels_get_random_floats_and_a_tolerance_of_their_own():
    """A bfloat16 kernel's inputs are random floats (NumPy does not call bfloat16
    floating: they were small integers) and its outputs NaN until written; two configs'
    16-bit outputs agree within two units of the type's last place (their float32 sums,
    reordered, may round to neighbours), not within fp32's 1e-3."""
    import ml_dtypes

    from dnnc.autotune.measure import agree, random_arrays
    from dnnc.backends.lower import lower_group
    from dnnc.ir import types as T
    from dnnc.ir.graph import Graph

    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.bfloat16, (64,)))
    g.outputs = [g.add("Relu", x)]
    x_in, y_out = random_arrays(lower_group(list(g.nodes), "k"), seed=3)
    assert x_in.dtype == ml_dtypes.bfloat16 and (x_in.astype(np.float32) % 1 != 0).any()
    assert np.isnan(y_out.astype(np.float32)).all()
    want = np.linspace(1, 2, 64).astype(ml_dtypes.bfloat16)
    one_unit = (want.astype(np.float32) * (1 + 2.0 ** -7)).astype(ml_dtypes.bfloat16)
    assert agree(one_unit, want) and not agree((want.astype(np.float32) * 1.05).astype(
        ml_dtypes.bfloat16), want)
    half = np.linspace(1, 2, 64).astype(np.float16)
    assert agree(np.nextafter(half, np.float16(3)), half)
    assert agree(np.float32([1.0005]), np.float32([1.0])) and \
        not agree(np.float32([1.002]), np.float32([1.0]))   # (float32: as before)
