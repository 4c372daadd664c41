"""store_tf32: at precision tf32, on a target that stores reduced precision (`half_storage`),
what the tensor-core products read holds tf32 values: their constant operands rounded once,
their activations rounded by a RoundTF32 after the node computing them (through Reshapes
and Transposes), which fuse_ops puts in that node's kernel. Graph inputs and outputs and the
outputs of opaque ops stay as they are; no kernel is added; every zoo model stays within the
documented tf32 bound of its fp32 reference (NumPy interpreter). Also RoundTF32 itself: the
reference, the llvm kernel and PTX's cvt.rna agree bit for bit."""

import numpy as np
import pytest

from dnnc import zoo
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.packed import holds_tf32, is_tf32, round_tf32
from dnnc.ir.target import Target, model_error_bound
from dnnc.passes.manager import optimize, passes_at
from dnnc.passes.store_tf32 import store_tf32, tensor_core_operands

SMALL = {"mlp": {}, "cnn": {}, "resnet18": {"size": 32}, "mobilenet_v2": {"size": 32},
         "bert_tiny": {"seq": 16, "vocab": 512}}


def cuda_like(precision: str, half_storage: bool = True) -> Target:
    return Target("cuda", arch="sm_90", precision=precision, half_storage=half_storage)


def relu_matmul() -> Graph:
    """x -> Relu -> Reshape -> MatMul(w) -> y, the Relu's output also returned by an Add."""
    rng = np.random.default_rng(0)
    g = Graph("mm")
    x = g.add_input("x", T.TensorType(T.float32, (4, 2, 8)))
    w = Value("w", T.TensorType(T.float32, (16, 5)),
              const=rng.standard_normal((16, 5)).astype(np.float32))
    shape = Value("shape", T.TensorType(T.int64, (2,)), const=np.array([4, 16], np.int64))
    h = g.add("Relu", x, name="relu")
    y = g.add("MatMul", g.add("Reshape", h, shape, name="flat"), w, name="mm")
    g.outputs = [y, g.add("Add", h, h, name="twice")]
    return g


def test_products_read_tf32_values_rounded_where_they_are_made():
    g = store_tf32(relu_matmul(), cuda_like("tf32"))
    g.verify()
    ops = [n.op for n in g.nodes]
    assert ops.count("RoundTF32") == 1
    mm = next(n for n in g.nodes if n.op == "MatMul")
    assert holds_tf32(mm.inputs[0]) and holds_tf32(mm.inputs[1]) and is_tf32(mm.inputs[1].const)
    rounded = next(n for n in g.nodes if n.op == "RoundTF32")
    assert rounded.inputs[0].producer.op == "Relu"
    # every reader of the Relu reads it rounded: the value is stored once, as tf32
    twice = next(n for n in g.nodes if n.name == "twice")
    assert all(v is rounded.outputs[0] for v in twice.inputs)
    x = np.random.default_rng(1).standard_normal((4, 2, 8)).astype(np.float32)
    got, want = run_graph(g, [x]), run_graph(relu_matmul(), [x])
    np.testing.assert_array_equal(got[1], 2 * round_tf32(np.maximum(x, 0)))
    assert not np.array_equal(got[0], want[0])   # (it rounds)
    assert np.abs(got[0] - want[0]).max() <= model_error_bound("tf32") * np.abs(want[0]).max()


@pytest.mark.parametrize("target", [cuda_like("fp32"), cuda_like("fp16"), cuda_like("bf16"),
                                    cuda_like("tf32", half_storage=False), Target("llvm")])
def test_nothing_changes_elsewhere(target):
    g = relu_matmul()
    text = str(g)
    assert str(store_tf32(g, target)) == text


def test_graph_inputs_and_outputs_stay_as_they_are(monkeypatch):
    """A MatMul of the graph's input, and of a value the graph returns: neither is rounded
    (the caller's values never change; the product rounds them in its tiles)."""
    g = Graph("io")
    x = g.add_input("x", T.TensorType(T.float32, (3, 4)))
    w = Value("w", T.TensorType(T.float32, (4, 4)), const=np.eye(4, dtype=np.float32) / 3)
    h = g.add("MatMul", x, w, name="first")
    g.outputs = [h, g.add("MatMul", h, w, name="second")]
    out = store_tf32(g, cuda_like("tf32"))
    assert [n.op for n in out.nodes] == ["MatMul", "MatMul"]
    assert out.outputs[0] is h
    monkeypatch.setenv("DNNC_STORE_TF32", "0")   # the A/B switch
    assert all(not is_tf32(n.inputs[1].const)
               for n in store_tf32(relu_matmul(), cuda_like("tf32")).nodes if n.op == "MatMul")


def test_the_pass_runs_before_fuse_ops_after_the_layouts():
    names = passes_at(3)
    assert names.index("convert_layout") < names.index("store_tf32") < names.index("fuse_ops")


@pytest.mark.parametrize("name", SMALL)
def test_zoo_models_at_tf32_read_tf32_values_within_the_bound(name, monkeypatch):
    """Every product's operands hold tf32 values but for graph inputs and opaque ops'
    outputs; the kernels are the ones the graph had without the pass; the outputs within
    `model_error_bound("tf32")` of the fp32 reference."""
    model = zoo.build(name, **SMALL[name])
    inputs = list(zoo.inputs_for(model, np.random.default_rng(7)).values())
    graph = import_onnx(model)
    reference = run_graph(optimize(graph, cuda_like("fp32"), 3), inputs)
    tf32 = optimize(graph, cuda_like("tf32"), 3, verify=True)
    monkeypatch.setenv("DNNC_STORE_TF32", "0")
    before = optimize(graph, cuda_like("tf32"), 3)
    assert len(tf32.groups) == len(before.groups)
    assert not any(n.op == "RoundTF32" for n in before.nodes)
    assert all(not any(n.op == "RoundTF32" for n in group[:1]) for group in tf32.groups)
    unrounded = []
    for node in tf32.nodes:
        for i in tensor_core_operands(node):
            v = node.inputs[i]
            source = v
            while source.producer is not None and source.producer.op in (
                    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"):
                source = source.producer.inputs[0]
            if not holds_tf32(v) and source.producer is not None and \
                    source.producer.op not in ("MaxPoolNHWC", "MaxPool"):
                unrounded.append((node.name, i, source.producer.op))
    assert not unrounded, unrounded
    for node in tf32.nodes:   # a depthwise conv runs on the SIMT cores: its weights exact
        if node.op == "ConvNHWC" and node.attrs.get("group", 1) != 1:
            assert not node.inputs[1].name.endswith(".tf32")
    for got, want in zip(run_graph(tf32, inputs), reference):
        error = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
        assert error <= model_error_bound("tf32"), error


def test_round_tf32_means_ptx_cvt_rna_on_every_target():
    """Ties away from zero (1 + 2^-11 -> 1 + 2^-10), below half down, NaN and infinities
    kept; the llvm kernel equal to the reference bit for bit."""
    import dnnc

    specials = np.array([1 + 2.0 ** -11, -(1 + 2.0 ** -11), 1 + 2.0 ** -12, np.inf, -np.inf,
                         np.nan, 0.0, -0.0, 3.4e38, 1e-40], np.float32)
    want = np.array([1 + 2.0 ** -10, -(1 + 2.0 ** -10), 1.0], np.float32)
    got = round_tf32(specials)
    np.testing.assert_array_equal(got[:3], want)
    assert np.isinf(got[3]) and np.isinf(got[4]) and np.isnan(got[5])
    x = np.concatenate([specials, np.random.default_rng(2).standard_normal(502).astype(
        np.float32) * 1e3])
    g = Graph("round")
    xv = g.add_input("x", T.TensorType(T.float32, x.shape))
    g.outputs = [g.add("RoundTF32", xv)]
    np.testing.assert_array_equal(run_graph(g, [x])[0].view(np.uint32),
                                  round_tf32(x).view(np.uint32))
    compiled = dnnc.compile(g, target="llvm")
    np.testing.assert_array_equal(np.asarray(compiled(x)).view(np.uint32),
                                  round_tf32(x).view(np.uint32))


def test_a_matmul_at_tf32_reads_its_weights_k_major():
    """convert_layout's "tf32_dense" (cuda at tf32): MatMul(A [2, 3, 8], W [8, 5]) becomes
    MatMulPacked of one-column panels, W^T [5, 8, 1] rounded to tf32, which the dense
    problem reads as a B stored [n, k] (trans_b: K-major, copied by cp.async); the products
    are the ones the tiles' rounding gives; other precisions keep the MatMul."""
    from dnnc.backends.lower import lower_group
    from dnnc.backends.problems import dense
    from dnnc.passes.convert_layout import convert_layout

    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 5)).astype(np.float32)

    def graph():
        g = Graph("mm")
        x = g.add_input("x", T.TensorType(T.float32, (2, 3, 8)))
        g.outputs = [g.add("MatMul", x, Value("w", T.TensorType(T.float32, (8, 5)), const=w),
                           name="mm")]
        return g

    target = Target("cuda", arch="sm_90", precision="tf32", half_storage=True,
                    layouts=("tf32_dense",))
    g = graph()
    assert convert_layout(g, target) == 1
    (node,) = g.nodes
    assert node.op == "MatMulPacked" and node.inputs[1].shape == (5, 8, 1)
    np.testing.assert_array_equal(node.inputs[1].const[:, :, 0], round_tf32(w.T))
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(run_graph(g, [x])[0], x @ round_tf32(w), rtol=1e-6, atol=1e-6)
    p = dense(lower_group(list(g.nodes), "k", outputs=g.outputs))
    assert (p.trans_b, p.packed_panel, p.m, p.n, p.k, p.b_tf32) == (True, 0, 6, 5, 8, True)
    for precision in ("fp32", "fp16"):
        other = graph()
        assert convert_layout(other, Target("cuda", arch="sm_90", precision=precision,
                                            layouts=("tf32_dense",))) == 0
