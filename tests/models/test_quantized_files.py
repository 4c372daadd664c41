"""Quantized files as users make them (issue 33): onnxruntime's quantize_static (QDQ,
per-channel int8 weights, int8 / uint8 activations) on zoo CNNs and quantize_dynamic on a
transformer. fuse_quantized turns every convolution and dense layer into an integer op, and
the result equals onnxruntime's int8 run of the same file: bit for bit on the CNNs (the
integer ops requantize as MLAS does: float32 product, rounding half to even), within float32
rounding on the dynamically quantized transformer (whose float ops, LayerNorm, Softmax,
GELU, differ in summation order). Calibration and inputs are seeded: a failure reproduces."""

import collections

import numpy as np
import onnx
import pytest

import dnnc
from dnnc import zoo
from dnnc.frontend.onnx import import_onnx
from dnnc.ir.interpreter import run_graph
from dnnc.ir.target import Target
from dnnc.passes.manager import optimize
from dnnc.testing.quantized_files import (onnxruntime_outputs, onnxruntime_values,
                                          quantize_dynamic, quantize_static)
from dnnc.testing.optional import library

pytest.importorskip("onnxruntime")

CNNS = [("resnet18", {"size": 32}, "int8", 20), ("mobilenet_v2", {"size": 32}, "uint8", 52)]
"""(zoo model, config, activation type, its convolutions)."""


def _reference_outputs(path, feeds):
    """The numpy target's outputs (the registry's references) after the level-1 passes, and
    the op counts of that graph."""
    g = optimize(import_onnx(str(path)), Target("numpy"), opt_level=1)
    ops = collections.Counter(n.op for n in g.nodes)
    return run_graph(g, [feeds[v.name] for v in g.inputs]), ops


@pytest.mark.parametrize("name,config,activations,convs", CNNS)
def test_a_qdq_cnn_runs_integer_ops_equal_to_onnxruntime(tmp_path, name, config, activations,
                                                         convs):
    model = zoo.build(name, **config)
    path = quantize_static(model, tmp_path, name, seed=3, activations=activations)
    feeds = zoo.inputs_for(model, np.random.default_rng(11))
    want = onnxruntime_outputs(path, feeds)
    got, ops = _reference_outputs(path, feeds)
    assert ops["QuantizedConvPacked"] + ops["QuantizedConv"] == convs and ops["QuantizedDense"] == 1
    assert "Conv" not in ops and "Gemm" not in ops
    assert np.array_equal(got[0], want[0])
    compiled = dnnc.compile(str(path), "llvm")
    assert np.array_equal(compiled(**feeds), want[0])
    compiled.save(tmp_path / "model.dnnc")   # the integer ops and packed weights restore
    assert np.array_equal(dnnc.load(tmp_path / "model.dnnc")(**feeds), want[0])


FOUR_BIT = [("mlp", "uint8", "int4", 0, 3), ("mlp", "int8", "uint4", 0, 3),
            ("cnn", "int8", "int4", 3, 1), ("cnn", "uint8", "uint4", 3, 1)]
"""(zoo model, activation type, weight type, its convolutions, its dense layers)."""


@pytest.mark.parametrize("name,activations,weights,convs,dense", FOUR_BIT)
def test_a_qdq_file_of_four_bit_weights_runs_integer_ops_equal_to_onnxruntime(
        tmp_path, name, activations, weights, convs, dense):
    # quantize_static's QInt4 / QUInt4 weights (per channel; com.microsoft's Q / DQ below
    # opset 21): int4 weights are int8 ones, uint4 ones less their zero point 8 too
    model = zoo.build(name)
    path = quantize_static(model, tmp_path, name, seed=5, activations=activations,
                           weights=weights)
    feeds = zoo.inputs_for(model, np.random.default_rng(12))
    want = onnxruntime_outputs(path, feeds)
    got, ops = _reference_outputs(path, feeds)
    assert ops["QuantizedConvPacked"] == convs and ops["QuantizedDense"] == dense
    assert not {"Conv", "Gemm", "MatMul"} & set(ops)
    assert np.array_equal(got[0], want[0])
    compiled = dnnc.compile(str(path), "llvm")
    assert np.array_equal(compiled(**feeds), want[0])
    compiled.save(tmp_path / "model.dnnc")
    assert np.array_equal(dnnc.load(tmp_path / "model.dnnc")(**feeds), want[0])


@pytest.mark.parametrize("name,activations,convs,dense,qs", [("mlp", "int4", 0, 3, 1),
                                                             ("cnn", "uint4", 3, 1, 2)])
def test_a_qdq_file_of_four_bit_activations_equals_onnxruntime_op_by_op(
        tmp_path, name, activations, convs, dense, qs):
    # every value 4-bit (QInt4 weights): the products are integer ops clamped to the 4-bit
    # range, the MaxPools between them integer moves (the input's and the pooled
    # classifier's Q left, as with 8 bits); onnxruntime 1.32's optimized session refuses the
    # CNN (an int4 MaxPool it makes), so the reference is its run one op at a time
    model = zoo.build(name)
    path = quantize_static(model, tmp_path, name, seed=6, activations=activations,
                           weights="int4")
    feeds = zoo.inputs_for(model, np.random.default_rng(13))
    output = onnx.load(str(path)).graph.output[0].name
    want = onnxruntime_values(path, feeds)[output]
    got, ops = _reference_outputs(path, feeds)
    assert ops["QuantizedConvPacked"] == convs and ops["QuantizedDense"] == dense
    assert not {"Conv", "Gemm", "MatMul"} & set(ops) and ops["QuantizeLinear"] == qs
    assert np.array_equal(got[0], want)
    assert np.array_equal(dnnc.compile(str(path), "llvm")(**feeds), want)


def _block_model(seed: int = 0):
    """efficientnet's and regnet's block shapes in one float model: a 3x3 conv and a
    depthwise one each with SiLU (Sigmoid, Mul), a grouped 3x3 (groups of 8) with Relu,
    squeeze-and-excitation (GlobalAveragePool, 1x1 convs, Sigmoid, Mul), a 1x1 conv, the
    classifier."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = {}, []

    def conv(x, cin, cout, k, group=1, name=None):
        w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k))
        inits[f"{name}.w"] = w.astype(np.float32)
        inits[f"{name}.b"] = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name],
                                      pads=[k // 2] * 4, group=group))
        return name

    def silu(x):
        nodes.append(helper.make_node("Sigmoid", [x], [f"{x}.s"]))
        nodes.append(helper.make_node("Mul", [x, f"{x}.s"], [f"{x}.silu"]))
        return f"{x}.silu"

    y = silu(conv("x", 16, 32, 3, name="c1"))
    y = silu(conv(y, 32, 32, 3, group=32, name="dw"))
    nodes.append(helper.make_node("Relu", [conv(y, 32, 32, 3, group=4, name="g")], ["gr"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["gr"], ["se0"]))
    e = silu(conv("se0", 32, 8, 1, name="se1"))
    nodes.append(helper.make_node("Sigmoid", [conv(e, 8, 32, 1, name="se2")], ["se3"]))
    nodes.append(helper.make_node("Mul", ["gr", "se3"], ["sc"]))
    nodes.append(helper.make_node("GlobalAveragePool", [conv("sc", 32, 16, 1, name="p")],
                                  ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"]))
    inits["fc.w"] = rng.standard_normal((10, 16)).astype(np.float32)
    inits["fc.b"] = rng.standard_normal(10).astype(np.float32)
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["y"], transB=1))
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_efficientnet_and_regnet_blocks_run_integer_ops_equal_to_onnxruntime(tmp_path):
    """Grouped convs packed, depthwise ones on their template, each SiLU between
    quantizations one QuantizedTable: onnxruntime's outputs bit for bit (int8 activations)."""
    model = _block_model()
    path = quantize_static(model, tmp_path, "block", seed=3)
    feeds = zoo.inputs_for(model, np.random.default_rng(11))
    want = onnxruntime_outputs(path, feeds)
    got, ops = _reference_outputs(path, feeds)
    assert ops["QuantizedConvPacked"] == 5 and ops["QuantizedConv"] == 1   # (the depthwise)
    assert ops["QuantizedTable"] == 4 and "Sigmoid" not in ops   # 3 SiLUs, the SE's Sigmoid
    assert np.array_equal(got[0], want[0])
    compiled = dnnc.compile(str(path), "llvm")
    assert np.array_equal(compiled(**feeds), want[0])


def test_a_dynamically_quantized_transformer_runs_integer_dense_ops(tmp_path):
    model = zoo.build("bert_tiny", seq=16, vocab=512)
    path = quantize_dynamic(model, tmp_path, "bert_tiny")
    feeds = zoo.inputs_for(model, np.random.default_rng(12))
    want = onnxruntime_outputs(path, feeds)
    got, ops = _reference_outputs(path, feeds)
    assert ops["QuantizedDense"] == 12 and "MatMulInteger" not in ops
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


DYNAMIC = [("int8", False), ("uint8", False), ("int8", True), ("uint8", True)]
"""quantize_dynamic's weight types, per tensor and per channel."""


def _ort_levels(path, feeds):
    """onnxruntime's outputs with its graph optimisations (its fused int8 kernels) and
    without (the ONNX ops one by one)."""
    import onnxruntime as ort

    outs = []
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                  ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        outs.append(session.run(None, feeds)[0])
    return outs


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_dynamically_quantized_exports_run_integer_dense_ops_close_to_onnxruntime(tmp_path,
                                                                                  arch):
    """transformers' BERT and GPT-2 exported by torch, quantize_dynamic's four variants:
    every MatMulInteger an integer dense op; dnnc's outputs no further from onnxruntime's
    than onnxruntime's own two optimisation levels are from each other (twice that: a
    flipped rounding of DynamicQuantizeLinear moves a whole row by a quantum, and the float
    ops around it round differently in each runtime)."""
    library("transformers", "BertModel", "GPT2LMHeadModel")
    from dnnc.testing.quantized_files import export_transformer

    model = export_transformer(arch, hidden=64, heads=4, seq=16, vocab=200, seed=5)
    feeds = zoo.inputs_for(model, np.random.default_rng(13))
    for k, (weights, per_channel) in enumerate(DYNAMIC):
        path = quantize_dynamic(model, tmp_path, arch, weights, per_channel)
        want, unfused = _ort_levels(path, feeds)
        got, ops = _reference_outputs(path, feeds)
        # (GPT-2's head, tied to its embeddings, stays float)
        assert ops["QuantizedDense"] == (12 if arch == "bert" else 8)
        assert "MatMulInteger" not in ops
        bound = max(2 * np.abs(want - unfused).max(), 1e-4 * np.abs(want).max())
        assert np.abs(got[0] - want).max() <= bound, (weights, per_channel)
        if k == len(DYNAMIC) - 1:   # the llvm target computes what the references do
            compiled = dnnc.compile(str(path), "llvm", cache=False)(**feeds)
            assert np.abs(compiled - want).max() <= bound


@pytest.mark.parametrize("level", [0, 1])
def test_a_transformer_optimized_by_onnxruntime_then_quantized_runs_its_contrib_ops(tmp_path,
                                                                                   level):
    """onnxruntime's transformer optimizer first (SkipLayerNormalization, BiasGelu or Gelu,
    com.microsoft), then quantize_dynamic: dnnc imports the file, every MatMulInteger an
    integer dense op, and computes what onnxruntime does."""
    from dnnc.testing.quantized_files import optimize_transformer

    model = zoo.build("bert", hidden=64, heads=4, seq=16, vocab=100)
    optimized = optimize_transformer(model, tmp_path, "bert", heads=4, hidden=64, level=level)
    contrib = {n.op_type for n in optimized.graph.node if n.domain == "com.microsoft"}
    assert "SkipLayerNormalization" in contrib and contrib & {"BiasGelu", "Gelu"}
    path = quantize_dynamic(optimized, tmp_path, "bert_optimized")
    feeds = zoo.inputs_for(model, np.random.default_rng(14))
    want, unfused = _ort_levels(path, feeds)
    got, ops = _reference_outputs(path, feeds)
    assert ops["QuantizedDense"] == 12 and "MatMulInteger" not in ops
    bound = max(2 * np.abs(want - unfused).max(), 1e-4 * np.abs(want).max())
    assert np.abs(got[0] - want).max() <= bound
    compiled = dnnc.compile(str(path), "llvm", cache=False)(**feeds)
    assert np.abs(compiled - want).max() <= bound


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
@pytest.mark.parametrize("operators", [False, True])
def test_statically_quantized_exports_run_integer_dense_ops_close_to_onnxruntime(tmp_path,
                                                                                 arch,
                                                                                 operators):
    """transformers' BERT and GPT-2 through quantize_static, QDQ and the operator format
    (QLinearMatMul, com.microsoft's QGemm, QLinearAdd, QLinearMul, QLinearSoftmax): every
    weight product an integer dense op, outputs within the dynamic files' bound."""
    library("transformers", "BertModel", "GPT2LMHeadModel")
    from dnnc.testing.quantized_files import export_transformer

    model = export_transformer(arch, hidden=64, heads=4, seq=16, vocab=200, seed=6)
    path = quantize_static(model, tmp_path, arch, seed=2, activations="uint8",
                           operators=operators, preprocess=not operators)
    feeds = zoo.inputs_for(model, np.random.default_rng(15))
    want, unfused = _ort_levels(path, feeds)
    got, ops = _reference_outputs(path, feeds)
    # (GPT-2's head, its embeddings' table transposed, is quantized here)
    assert ops["QuantizedDense"] == (12 if arch == "bert" else 9)
    assert not {"QLinearMatMul", "MatMulInteger", "Gemm"} & set(ops)
    bound = max(2 * np.abs(want - unfused).max(), 1e-4 * np.abs(want).max())
    assert np.abs(got[0] - want).max() <= bound
    compiled = dnnc.compile(str(path), "llvm", cache=False)(**feeds)
    assert np.abs(compiled - want).max() <= bound


def _qdq_products(rng, activations: str):
    """A QDQ file as onnxruntime's quantizer writes its chains, 8-bit input and outputs:
    c = Q(Relu(Conv(DQ(x), DQ(w) per channel, DQ(bias int32)))), a = Q(DQ(c) + DQ(x)) (a
    residual add), m = Q(MatMul(DQ(Reshape(a)), DQ(w2) per column)); random zero points."""
    from onnx import TensorProto, helper, numpy_helper

    dtype, proto = {"uint8": (np.uint8, TensorProto.UINT8), "int8": (np.int8, TensorProto.INT8)}[
        activations]
    low = int(np.iinfo(dtype).min)
    c, h, n = 16, 20, 24
    inits, nodes = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def dq(q, name, scale, zero_point, axis=1):
        nodes.append(helper.make_node("DequantizeLinear", [q, init(f"{name}.s", scale),
                                                          init(f"{name}.z", zero_point)],
                                      [f"{q}.f"], axis=axis))
        return f"{q}.f"

    def q(v, name, scale, zero_point):
        nodes.append(helper.make_node("QuantizeLinear", [v, init(f"{name}.s", scale),
                                                        init(f"{name}.z", zero_point)], [name]))
        return name

    zp = {k: dtype(rng.integers(low + 100, low + 156)) for k in "xam"}   # (c's: the Relu's)
    ws = (rng.uniform(0.5, 1.5, c) * 3e-3).astype(np.float32)
    w = init("w", rng.integers(-127, 128, (c, c, 3, 3)).astype(np.int8))
    b = init("b", rng.integers(-2000, 2000, c).astype(np.int32))
    x = dq("x", "x", np.float32(0.02), zp["x"])
    nodes.append(helper.make_node("Conv", [x, dq(w, "w", ws, np.zeros(c, np.int8), 0),
                                           dq(b, "b", np.float32(0.02) * ws,
                                              np.zeros(c, np.int32), 0)], ["conv"], pads=[1] * 4))
    nodes.append(helper.make_node("Relu", ["conv"], ["relu"]))
    cq = q("relu", "c", np.float32(0.05), dtype(low))
    nodes.append(helper.make_node("Add", [dq(cq, "cd", np.float32(0.05), dtype(low)), x],
                                  ["add"]))
    aq = q("add", "a", np.float32(0.047), zp["a"])
    nodes.append(helper.make_node("Reshape", [aq, init("rows", np.array([c * h, h]))], ["ar"]))
    w2 = init("w2", rng.integers(-127, 128, (h, n)).astype(np.int8))
    nodes.append(helper.make_node("MatMul", [dq("ar", "ar", np.float32(0.047), zp["a"]),
                                             dq(w2, "w2", (rng.uniform(0.5, 1.5, n) * 1e-2)
                                                .astype(np.float32), np.zeros(n, np.int8))],
                                  ["mm"]))
    q("mm", "m", np.float32(0.11), zp["m"])
    shapes = {"x": [1, c, h, h], "c": [1, c, h, h], "a": [1, c, h, h], "m": [c * h, n]}
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", proto,
                                                                            shapes["x"])],
                              [helper.make_tensor_value_info(k, proto, shapes[k]) for k in "cam"],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("activations", ["uint8", "int8"])
@pytest.mark.parametrize("seed", [7, 8])
def test_qdq_conv_add_and_matmul_equal_onnxruntime_integer_ops(tmp_path, activations, seed):
    """The QDQ products as onnxruntime fuses them (QLinearConv, QLinearMatMul; int8
    activations with its `session.qdqisint8allowed`: by default on x86 it converts int8
    chains to uint8 and, where a shared value is converted for one reader only, leaves the
    other's product in float32, whose summation order no spec fixes): bit for bit, one
    float32 product by x_scale * w_scale / y_scale rounded half to even. The add is the
    file's float32 chain as one op (QuantizedAdd), equal to onnxruntime's run of the ops one
    by one; its QLinearAdd (MLAS's fused multiply-adds) rounds otherwise near ties."""
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    model = _qdq_products(rng, activations)
    info = np.iinfo(activations)
    x = rng.integers(info.min, info.max + 1, (1, 16, 20, 20)).astype(activations)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    fused = ort.InferenceSession(model.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})
    path = tmp_path / "qdq.onnx"
    path.write_bytes(model.SerializeToString())
    one_by_one = onnxruntime_values(path, {"x": x})
    g = optimize(import_onnx(model), Target("numpy"), opt_level=1)
    ops = collections.Counter(n.op for n in g.nodes)
    assert (ops["QuantizedConvPacked"], ops["QuantizedAdd"], ops["QuantizedDense"]) == (1, 1, 1)
    assert not {"DequantizeLinear", "QuantizeLinear", "Add", "QLinearAdd"} & set(ops), ops
    for got in (run_graph(g, [x]), dnnc.compile(model, "llvm", cache=False)(x=x)):
        for mine, theirs in zip(got, fused):   # (no tie in these adds: QLinearAdd agrees)
            assert np.array_equal(mine, theirs)
        assert np.array_equal(got[1], one_by_one["a"])
