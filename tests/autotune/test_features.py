"""The cost model's features (dnnc/autotune/features.py): one vector of a fixed length per
scheduled PrimFunc, finite, the same for the same function, different between configs, and
reading the loops' extents and kinds where it says it does."""

import numpy as np

from dnnc.autotune.features import KINDS, LENGTH, LEVELS, features
from dnnc.backends.llvm import tuning as llvm_tuning
from dnnc.ir import loop as L
from dnnc.ir import types as T


def _scale(n: int, kind: L.ForKind = L.ForKind.SERIAL, extent=None) -> L.PrimFunc:
    """y[i] = x[i] * 2 over a loop of `kind` (extent `extent`, default n)."""
    x, y = L.Buffer("x", T.float32, (n,)), L.Buffer("y", T.float32, (n,))
    i = L.Var("i")
    body = L.For(i, n if extent is None else extent, L.Store(y, (i,), x[i] * L.const(2.0)),
                 kind)
    return L.PrimFunc("scale", (x, y), body)


def test_every_config_of_a_task_has_a_finite_vector_of_the_same_length(llvm_tasks):
    machine, tasks = llvm_tasks
    for task in tasks:
        space = task.template.space(task.problem, machine)
        for config in space.configs():
            vec = features(llvm_tuning.build(task.kernel, machine, config))
            assert vec.shape == (LENGTH,) and np.isfinite(vec).all(), config


def test_distinct_configs_give_distinct_vectors_and_a_config_always_the_same(llvm_tasks):
    """Every config of the hidden layer's dense space is told apart from every other (the
    model could not rank what it cannot tell apart); a config built twice is the same
    vector."""
    machine, tasks = llvm_tasks
    task = tasks[0]
    configs = list(task.template.space(task.problem, machine).configs())
    vectors = [features(llvm_tuning.build(task.kernel, machine, c)) for c in configs]
    assert len(configs) > 8
    assert len({v.tobytes() for v in vectors}) == len(configs)
    again = features(llvm_tuning.build(task.kernel, machine, configs[3]))
    np.testing.assert_array_equal(again, vectors[3])


def test_a_loop_level_is_its_extent_and_kind():
    """The first level of a single-loop function: log2 of its extent, then the one-hot of
    its kind; only the loop's kind differs between a serial and a vectorized loop, and the
    vectorized one's extent shows in the kernel-wide vector width."""
    per_level = 1 + len(KINDS)
    serial, vector = features(_scale(8)), features(_scale(8, L.ForKind.VECTORIZED))
    assert serial[0] == 3.0 and vector[0] == 3.0
    assert serial[1 + KINDS.index("serial")] == 1.0 and \
        serial[1:per_level].sum() == 1.0
    assert vector[1 + KINDS.index("vectorized")] == 1.0 and \
        vector[1:per_level].sum() == 1.0
    assert not serial[per_level:LEVELS * per_level].any()   # no second level
    assert vector[-4] == 3.0 and serial[-4] == 0.0          # log2 of the vector width
    assert features(_scale(64))[0] == 6.0


def test_a_symbolic_extent_counts_as_one():
    n = L.Var("n")
    vec = features(_scale(8, extent=n))
    assert vec.shape == (LENGTH,) and np.isfinite(vec).all()
    assert vec[0] == 0.0   # log2(1)
