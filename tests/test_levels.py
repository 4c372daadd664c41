"""What the public opt level decides (`dnnc/levels.py`): the graph pipeline's level, memory
reuse and LLVM's -O level, derived in one place from one default."""

import dnnc
from dnnc.levels import DEFAULT_OPT_LEVEL, MEMORY_REUSE_LEVEL, OPT_LEVELS, Levels, levels
from dnnc.passes.manager import PIPELINE, passes_at


def test_each_opt_level_names_its_three_decisions():
    assert [levels(k) for k in OPT_LEVELS] == [Levels(0, False, 0), Levels(1, True, 1),
                                               Levels(2, True, 2), Levels(3, True, 3)]
    assert levels() == levels(DEFAULT_OPT_LEVEL) == Levels(3, True, 3)
    assert levels(MEMORY_REUSE_LEVEL - 1).reuse_memory is False


def test_the_pipeline_runs_the_graph_level_passes():
    for k in OPT_LEVELS:
        assert passes_at(k) == [name for name, level, _ in PIPELINE
                                if level <= levels(k).graph]
    assert passes_at(0) == []


def test_the_runtime_reads_memory_reuse_from_the_level(rng):
    from dnnc import zoo

    for k in OPT_LEVELS:
        model = dnnc.compile(zoo.mlp(), "llvm", opt_level=k, cache=False, progress=False)
        assert model.runtime.reuse_memory is levels(k).reuse_memory
        assert model.runtime.opt_level == k   # the public level, as artifacts record it
