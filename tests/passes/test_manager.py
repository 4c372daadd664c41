"""The PassManager: the pipeline per level, timings that reach `CompiledModel.stats`, IR dumps
after every pass, verification naming the pass that broke the graph, and the per-pass report
of `dnnc inspect --passes` (whose kernel count matches what the llvm backend compiles)."""

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.compiler.driver import load_graph
from dnnc.backends.registry import REGISTRY
from dnnc.compiler.inspect import pass_report
from dnnc.errors import CompileError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes import manager
from dnnc.passes.manager import PIPELINE, optimize, passes_at


def _conv_bn_graph():
    """Conv -> BatchNormalization -> Relu -> Add: simplify folds the BN, fuse_ops makes one
    kernel of the conv and its epilogue."""
    rng = np.random.default_rng(3)
    g = Graph("conv_bn")
    x = g.add_input("x", T.TensorType(T.float32, (1, 3, 8, 8)))

    def const(name, shape, scale=1.0, offset=0.0):
        data = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
        return Value(name, T.TensorType(T.float32, shape), const=data)

    c = g.add("Conv", x, const("w", (4, 3, 3, 3), 0.3), name="conv", pads=(1, 1, 1, 1))
    bn = g.add("BatchNormalization", c, const("gamma", (4,)), const("beta", (4,)),
               const("mean", (4,)), const("var", (4,), 0.1, 1.0), name="bn")
    r = g.add("Relu", bn, name="relu")
    g.outputs = [g.add("Add", r, const("bias", (1, 4, 8, 8)), name="add")]
    return g


def test_levels():
    assert passes_at(0) == []
    assert passes_at(1) == ["fuse_quantized", "fold_constants", "simplify", "eliminate",
                           "widen_half", "expand_powers", "sink_updates"]
    assert passes_at(2) == passes_at(3) == [name for name, _, _ in PIPELINE]
    assert PIPELINE[-1][0] == "fuse_ops"   # groups the final graph's nodes into kernels


def test_fuse_ops_records_the_kernels_on_the_graph():
    graph = optimize(_conv_bn_graph(), REGISTRY["llvm"].target(), 3)
    assert [[n.name for n in g] for g in graph.groups] == [["conv", "relu", "add"]]
    assert "  kernel 0: conv, relu, add\n" in str(graph)
    assert optimize(_conv_bn_graph(), REGISTRY["llvm"].target(), 1).groups is None


@pytest.mark.parametrize("opt_level", [0, 1, 3])
def test_pass_seconds_reach_the_stats(opt_level):
    model = dnnc.compile(_conv_bn_graph(), target="llvm", opt_level=opt_level, progress=False)
    seconds = model.stats["pass_seconds"]
    assert list(seconds) == passes_at(opt_level)
    assert all(s >= 0 for s in seconds.values())
    # the memory planner runs for every specialisation, outside the pass pipeline
    assert model.stats["memory_plan_seconds"] == model.runtime.plan_seconds > 0


def test_pass_seconds_of_a_truncated_pipeline():
    model = dnnc.compile(_conv_bn_graph(), target="llvm", passes=3, progress=False)
    assert list(model.stats["pass_seconds"]) == ["fuse_quantized", "fold_constants",
                                                 "simplify"]
    assert model.runtime.kernels == 3   # no fuse_ops: a kernel per node
    # a truncated pipeline (bisection) also leaves memory planning off: every intermediate
    # has a block of its own, so a planner bug shows only in the whole compile (the kernels'
    # workspace lies in the arena past the values, in both)
    def values(stats):
        return stats["arena_bytes"] - stats["workspace_bytes"]
    assert values(model.stats) == model.stats["naive_bytes"]
    whole = dnnc.compile(_conv_bn_graph(), target="llvm", opt_level=1, progress=False)
    assert values(whole.stats) < whole.stats["naive_bytes"]


def test_dump_ir_after_every_pass(tmp_path):
    g = _conv_bn_graph()
    before = str(g)
    model = dnnc.compile(g, target="llvm", dump_ir=tmp_path / "ir", progress=False)
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert names == ["00_input.txt"] + [f"{k:02d}_{n}.txt"
                                        for k, n in enumerate(passes_at(3), 1)]
    texts = {n: (tmp_path / "ir" / n).read_text() for n in names}
    assert texts["00_input.txt"] == before + "\n"
    assert "BatchNormalization" in texts["02_fold_constants.txt"]
    assert "BatchNormalization" not in texts["03_simplify.txt"]
    assert texts[names[-1]] == str(model.graph) + "\n"
    assert str(g) == before   # the input graph is never modified


def test_dump_ir_of_a_truncated_pipeline(tmp_path):
    optimize(_conv_bn_graph(), REGISTRY["llvm"].target(), 3, passes=2, dump_ir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00_input.txt",
                                                          "01_fuse_quantized.txt",
                                                          "02_fold_constants.txt"]


def test_after_pass_sees_every_pass_in_order():
    seen = []
    optimize(_conv_bn_graph(), REGISTRY["llvm"].target(), 3,
             after_pass=lambda name, g: seen.append((name, len(g.nodes))))
    assert [name for name, _ in seen] == passes_at(3)
    assert dict(seen)["fold_constants"] == 4 and dict(seen)["simplify"] == 3


def test_a_pass_that_breaks_the_graph_is_named(monkeypatch):
    def broken(graph, target):
        graph.nodes.reverse()   # readers before producers
        return graph

    table = [(n, lvl, broken if n == "eliminate" else run) for n, lvl, run in PIPELINE]
    monkeypatch.setattr(manager, "PIPELINE", table)
    with pytest.raises(CompileError, match="after pass eliminate"):
        optimize(_conv_bn_graph(), REGISTRY["llvm"].target(), 3, verify=True)


def test_pass_report_counts_nodes_and_kernels():
    rows = pass_report(_conv_bn_graph(), "llvm", 3)
    assert [r.name for r in rows] == ["(imported)"] + passes_at(3)
    by_name = {r.name: r for r in rows}
    assert by_name["(imported)"].nodes == 4 and by_name["(imported)"].kernels == 4
    assert by_name["simplify"].nodes == 3 and by_name["simplify"].kernels == 3
    assert by_name["fuse_ops"].kernels == 1   # conv + relu + add as one kernel
    assert all(r.seconds >= 0 for r in rows[1:])
    assert pass_report(_conv_bn_graph(), "numpy", 3)[0].kernels is None
    assert [r.name for r in pass_report(_conv_bn_graph(), "llvm", 0)] == ["(imported)"]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("opt_level", [0, 1, 3])
def test_pass_report_kernels_match_the_compiled_model(name, opt_level):
    graph = load_graph(zoo.build(name))
    rows = pass_report(graph, "llvm", opt_level)
    model = dnnc.compile(zoo.build(name), target="llvm", opt_level=opt_level, progress=False)
    # the groups fuse_ops formed: the kernels called and the copies done as views
    viewed = sum(len(seg.viewed) for seg in model.runtime.compiled_segments())
    assert rows[-1].kernels == model.stats["kernels"] + viewed
    assert viewed == 0 or opt_level > 0
    assert rows[-1].nodes == model.stats["nodes"]
    assert rows[0].nodes == model.stats["imported_nodes"]
