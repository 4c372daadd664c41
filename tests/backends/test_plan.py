"""The shared compile path (`backends/plan.py`, issue 11): no backend reaches back into the
passes, fuse_ops' groups are the kernels a target compiles (also across a host fallback),
identical kernels are rendered once by structural signature, and a program is target-neutral
data (kernels, calls, slots, memory plan) that needs no renderer to build."""

import ast
from pathlib import Path

import numpy as np

import dnnc
import dnnc.backends
from dnnc.backends.plan import build_program, count_kernels, segment_groups, signature_of
from dnnc.backends.registry import REGISTRY
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.segments import HostStep, Segment, plan_steps
from dnnc.passes.manager import optimize

BACKENDS = Path(dnnc.backends.__file__).parent


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of the modules `source` (a module of `package`) imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def test_no_backend_module_imports_the_passes():
    modules = sorted(BACKENDS.rglob("*.py"))
    assert len(modules) > 8
    found = []
    for path in modules:
        package = ".".join(("dnnc", "backends") + path.relative_to(BACKENDS).parent.parts)
        for name in imported_modules(path.read_text(), package):
            if name == "dnnc.passes" or name.startswith("dnnc.passes."):
                found.append(f"{path.relative_to(BACKENDS)}: {name}")
    assert not found, "\n".join(found)


def test_the_import_scan_resolves_relative_imports():
    assert "dnnc.passes.fuse_ops" in imported_modules(
        "from ...passes.fuse_ops import x", "dnnc.backends.llvm")
    assert "dnnc.passes" in imported_modules("from .. import passes", "dnnc.backends")


def _layers(n_layers=3, width=16, host_between=False, rng=None):
    """Dense + Relu layers of one shape (identical kernels), optionally with a node that has
    no loop form (NonZero) reading the first layer's output."""
    g = Graph("layers")
    x = g.add_input("x", T.TensorType(T.float32, (4, width)))
    h = x
    for k in range(n_layers):
        w = Value(f"w{k}", T.TensorType(T.float32, (width, width)),
                  const=rng.standard_normal((width, width)).astype(np.float32) * 0.3)
        h = g.add("Relu", g.add("MatMul", h, w, name=f"mm{k}"), name=f"relu{k}")
        if host_between and k == 0:
            nz = g.add("NonZero", h, name="nonzero")
    g.outputs = [h] + ([nz] if host_between else [])
    return g


def test_fusion_groups_are_the_kernels_compiled(rng):
    graph = optimize(_layers(rng=rng), REGISTRY["llvm"].target(), 3)
    assert [[n.name for n in g] for g in graph.groups] == \
        [[f"mm{k}", f"relu{k}"] for k in range(3)]
    model = dnnc.compile(_layers(rng=rng), target="llvm", progress=False)
    (seg,) = model.runtime.compiled_segments()
    assert [[n.name for n in k.nodes] for k in seg.kernels] == \
        [[f"mm{k}", f"relu{k}"] for k in range(3)]
    assert count_kernels(model.graph) == model.stats["kernels"] == 3


def test_identical_kernels_are_rendered_once(rng):
    model = dnnc.compile(_layers(rng=rng), target="llvm", progress=False)
    (seg,) = model.runtime.compiled_segments()
    names = [k.func.name for k in seg.kernels]
    # the first layer reads a graph input, the other two an arena value: one signature for
    # all three (buffers are parameters), so one function
    assert len(set(names)) == 1, names
    assert len(seg.calls) == 3
    x = rng.standard_normal((4, 16)).astype(np.float32)
    want = dnnc.compile(_layers(rng=np.random.default_rng(0)), target="numpy").run(x)
    got = dnnc.compile(_layers(rng=np.random.default_rng(0)), target="llvm",
                       progress=False).run(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_signature_ignores_names_not_structure():
    def func(name, a, b, scale):
        i = L.Var(f"i_{name}")
        pa = L.Buffer(a, T.float32, (L.const(8),))
        pb = L.Buffer(b, T.float32, (L.const(8),))
        body = L.For(i, 8, L.Store(pb, (i,), pa[i] * scale))
        return L.PrimFunc(name, (pa, pb), body)

    assert signature_of(func("f", "x", "y", 2.0)) == signature_of(func("g", "u", "v", 2.0))
    assert signature_of(func("f", "x", "y", 2.0)) != signature_of(func("f", "x", "y", 3.0))


def test_groups_cut_by_a_host_step_stay_inside_their_segments(rng):
    graph = optimize(_layers(host_between=True, rng=rng), REGISTRY["llvm"].target(), 3)
    steps = plan_steps(graph)
    assert [s.node.op if isinstance(s, HostStep) else [n.name for n in s.nodes]
            for s in steps] == [["mm0", "relu0"], "NonZero",
                                ["mm1", "relu1", "mm2", "relu2"]]
    assert [segment_groups(s, graph.groups) for s in steps if isinstance(s, Segment)] == \
        [[[0, 1]], [[0, 1], [2, 3]]]
    # a group cut by a host step a re-plan forced: its nodes become kernels of their own
    forced = plan_steps(graph, frozenset({id(graph.nodes[-2])}))
    assert [[n.name for n in s.nodes] for s in forced if isinstance(s, Segment)][1:] == \
        [["mm1", "relu1"], ["relu2"]]
    assert [segment_groups(s, graph.groups) for s in forced if isinstance(s, Segment)][1:] \
        == [[[0, 1]], [[0]]]
    x = rng.standard_normal((4, 16)).astype(np.float32)
    g = _layers(host_between=True, rng=np.random.default_rng(1))
    want = dnnc.compile(g, target="numpy").run(x)
    got = dnnc.compile(_layers(host_between=True, rng=np.random.default_rng(1)),
                       target="llvm", progress=False).run(x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_program_is_target_neutral_data(rng):
    """build_program needs only a schedule function: here the lowered loops unscheduled."""
    graph = optimize(_layers(rng=rng), REGISTRY["llvm"].target(), 3)
    (step,) = [s for s in plan_steps(graph) if isinstance(s, Segment)]
    program = build_program(step, ((4, 16),), (), segment_groups(step, graph.groups),
                            schedule=lambda kernel: kernel.func, reuse_memory=True)
    assert len(program.kernels) == len(program.calls) == 3
    assert len(program.unique) == 1
    assert program.slots == program.n_inputs + len(program.escaping_types) + 3
    arena = [a for call in program.calls for kind, a in call.args if kind == "arena"]
    assert arena and all(0 <= a < program.arena_bytes for a in arena)
