"""Finding a miscompile: a wrong rewrite slipped into the pipeline is named by
`bisect_passes`, with the first node whose result it changes."""

import numpy as np
import pytest

import dnnc
from dnnc.compiler.compare import bisect_passes, compare
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Node, Value
from dnnc.passes import simplify as simplify_module


def _model():
    rng = np.random.default_rng(0)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (4, 8)))
    w = Value("w", T.TensorType(T.float32, (8, 8)),
              const=rng.standard_normal((8, 8)).astype(np.float32))
    h = g.add("MatMul", x, w, name="dense")
    r = g.add("Relu", h, name="act")
    g.outputs = [g.add("Exp", r, name="exp")]
    return g


def _wrong_relu(graph, node, users):
    """A deliberately wrong rewrite: Relu(x) -> Abs(x)."""
    if node.op != "Relu":
        return False
    graph.nodes[graph.nodes.index(node)] = Node("Abs", node.inputs, node.outputs, {},
                                                node.name)
    return True


def test_a_correct_pipeline_has_no_divergence():
    assert compare(_model(), "llvm") is None
    assert bisect_passes(_model(), "llvm") is None


def test_progress_is_checked_like_every_argument():
    from dnnc.errors import ArgumentError

    for find in (compare, bisect_passes):
        with pytest.raises(ArgumentError, match="progress must be True, False or None"):
            find(_model(), "llvm", progress="yes")


def test_bisect_names_the_wrong_pass_and_the_first_diverging_node(monkeypatch):
    monkeypatch.setattr(simplify_module, "RULES", simplify_module.RULES + [_wrong_relu])
    monkeypatch.setattr(simplify_module.simplify, "__defaults__", (simplify_module.RULES,))
    found = bisect_passes(_model(), "llvm")
    assert found is not None
    culprit, where = found
    assert culprit == "simplify"
    assert where is not None and where.node == "act" and where.op == "Relu"


def test_cli_compare(tmp_path, capsys):
    from onnx import TensorProto, helper, numpy_helper
    from dnnc.compiler.cli import main

    w = numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[w])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]).SerializeToString())
    assert main(["compare", str(path), "--target", "llvm", "--bisect-passes"]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_cli_compare_exits_1_for_a_divergence_and_2_for_a_bad_file(tmp_path, capsys,
                                                                    monkeypatch):
    """A finding and a mistake are told apart by the exit status (docs/cli.md)."""
    from onnx import TensorProto, helper, numpy_helper
    from dnnc.compiler.cli import main

    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((3, 3))
                                .astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                               helper.make_node("Relu", ["h"], ["y"], name="act")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[w])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]).SerializeToString())
    monkeypatch.setattr(simplify_module, "RULES", simplify_module.RULES + [_wrong_relu])
    monkeypatch.setattr(simplify_module.simplify, "__defaults__", (simplify_module.RULES,))
    assert main(["compare", str(path), "--bisect-passes"]) == 1
    out, err = capsys.readouterr()
    assert "first diverging pass: simplify" in out
    # stderr is no terminal here: a progress line per compile, up to the diverging one
    assert err.splitlines()[:5] == ["dnnc: running 2 nodes on the reference",
                                    "dnnc: compiling after 0 pass(es)",
                                    "dnnc: compiling after 1 pass(es): fuse_quantized",
                                    "dnnc: compiling after 2 pass(es): fold_constants",
                                    "dnnc: compiling after 3 pass(es): simplify"]
    assert main(["compare", str(path), "--bisect-passes", "-q"]) == 1
    assert capsys.readouterr().err == ""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 not a model")
    assert main(["compare", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("dnnc: error: cannot read the ONNX model")


def test_bisect_names_memory_planning_when_only_the_arena_is_wrong(monkeypatch, rng):
    """Memory planning runs outside the pass pipeline: a truncated pipeline leaves it off, so
    a planner that overlaps live values is named after every pass is cleared."""
    from dnnc.backends import plan as plan_module

    def overlapping(steps, sizes, external, reuse=True, views=None):
        out = plan_module.plan_memory.__wrapped__(steps, sizes, external, reuse=reuse,
                                                  views=views)
        if reuse:   # every value at offset 0: two live values overwrite each other
            out.offsets = {k: 0 for k in out.offsets}
        return out

    overlapping.__wrapped__ = plan_module.plan_memory
    g = Graph("two_live")
    x = g.add_input("x", T.TensorType(T.float32, (4, 8)))
    a = g.add("Exp", x, name="a")
    b = g.add("Sin", x, name="b")
    # a and b are each read twice, so each is a kernel of its own and both are live at once
    g.outputs = [g.add("Sub", g.add("Mul", a, b, name="ab"), g.add("Add", a, b, name="apb"),
                       name="out")]
    assert bisect_passes(g, "llvm", seed=int(rng.integers(1 << 16))) is None
    monkeypatch.setattr(plan_module, "plan_memory", overlapping)
    found = bisect_passes(g, "llvm", seed=int(rng.integers(1 << 16)))
    assert found is not None and found[0] == "memory planning (arena reuse)"


def _conv_relu():
    rng = np.random.default_rng(5)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 3, 9, 9)))
    w = Value("w", T.TensorType(T.float32, (8, 3, 3, 3)),
              const=rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    c = g.add("Conv", x, w, name="conv", pads=[1, 1, 1, 1])
    g.outputs = [g.add("Relu", c, name="act")]
    return g


def test_a_bug_only_in_a_fused_epilogue_is_found_kernel_by_kernel(monkeypatch):
    """Issue 30, item 5: a fused epilogue's bug hides when every node's output is observed
    (nothing fuses then); the kernel-by-kernel stage compiles each kernel as the target fuses
    it and names the kernel's nodes."""
    from dnnc.backends import problems
    from dnnc.compiler.compare import compare_kernels
    from dnnc.ir import loop as L

    real = problems.epilogue

    def off_by_one(kernel):
        apply = real(kernel)
        if len(kernel.nodes) == 1:
            return apply
        return lambda value, index: apply(value, index) + L.const(1.0)

    monkeypatch.setattr(problems, "epilogue", off_by_one)
    found = compare_kernels(_conv_relu(), "llvm")
    assert found is not None and found.node == "act" and found.op == "Relu"
    assert found.kernel == ["conv", "act"] and found.max_abs_error == pytest.approx(1.0, rel=1e-4)
    assert compare(_conv_relu(), "llvm") == found
    assert "fused kernel of conv, act" in found.where()


def test_a_quantized_output_may_differ_by_one_step_kernel_by_kernel():
    """A float sum rounded to the nearest step, summed in another order, may land one step
    away: one step of a QuantizeLinear's integer output (and one scale of the DequantizeLinear
    after it) is not a divergence; two steps are."""
    from dnnc.compiler.compare import _close, _one_step, _producers

    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (4,)))
    scale = Value("s", T.TensorType(T.float32, ()), const=np.array(0.5, np.float32))
    zero = Value("z", T.TensorType(T.int8, ()), const=np.array(0, np.int8))
    q = g.add("QuantizeLinear", x, scale, zero, name="q")
    d = g.add("DequantizeLinear", q, scale, zero, name="dq")
    g.outputs = [g.add("Relu", d, name="act")]
    producer = _producers(g.nodes)
    assert _one_step(producer, q) == (1, 0.0)
    assert _one_step(producer, d) == (0, 0.5)
    assert _one_step(producer, g.outputs[0]) == (0, 0.0)
    want = np.array([1, 2, 3, 4], np.int8)
    assert _close(np.array([1, 3, 3, 4], np.int8), want, 0, 0, steps=1)[0]
    assert not _close(np.array([1, 4, 3, 4], np.int8), want, 0, 0, steps=1)[0]
    assert not _close(np.array([1, 3, 3, 4], np.int8), want, 0, 0)[0]
