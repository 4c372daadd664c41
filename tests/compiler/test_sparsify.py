"""Magnitude pruning (`dnnc.compiler.sparsify`, `dnnc sparsify`): each pattern zeroes what it
says along the axis it says, weights behind DequantizeLinear and Cast too, depthwise and kept
layers stay dense, mistakes are one clear error, and the output error is measured."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dnnc import zoo
from dnnc.compiler.cli import main
from dnnc.compiler.sparsify import find_layers, keep_mask, output_error, parse_pattern, prune, \
    prune_model
from dnnc.errors import ArgumentError


def _model(rng, c=8, hw=5, k=16, n=12) -> onnx.ModelProto:
    """x (1, c, hw, hw) -> Conv 3x3 -> depthwise Conv 3x3 -> Conv 1x1 with an int8 weight
    behind a per-channel DequantizeLinear -> Flatten -> MatMul (weight behind a Cast from
    float16) -> Gemm (transB) -> y."""
    f = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
    q = rng.integers(-127, 128, (c, c, 1, 1)).astype(np.int8)
    scale = np.array([0.01 * (i + 1) for i in range(c)], np.float32)   # per output channel
    flat = c * hw * hw
    inits = [numpy_helper.from_array(a, name) for name, a in [
        ("conv.w", f(c, c, 3, 3)), ("dw.w", f(c, 1, 3, 3)), ("pw.q", q), ("pw.scale", scale),
        ("pw.zero", np.zeros(c, np.int8)), ("mm.w16", f(flat, k).astype(np.float16)),
        ("gemm.w", f(n, k)), ("gemm.b", f(n))]]
    nodes = [
        helper.make_node("Conv", ["x", "conv.w"], ["a"], "conv", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "dw.w"], ["b"], "dw", group=c, pads=[1, 1, 1, 1]),
        helper.make_node("DequantizeLinear", ["pw.q", "pw.scale", "pw.zero"], ["pw.w"], "dq",
                         axis=0),
        helper.make_node("Conv", ["b", "pw.w"], ["d"], "pw"),
        helper.make_node("Flatten", ["d"], ["e"], "flatten"),
        helper.make_node("Cast", ["mm.w16"], ["mm.w"], "cast", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["e", "mm.w"], ["g"], "mm"),
        helper.make_node("Gemm", ["g", "gemm.w", "gemm.b"], ["y"], "gemm", transB=1),
    ]
    graph = helper.make_graph(nodes, "prunable",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _weights(model) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.fixture
def model():
    return _model(np.random.default_rng(34))


def test_layers_are_found_behind_dequantize_and_cast(model):
    layers = {l.node: l for l in find_layers(model)}
    assert list(layers) == ["conv", "dw", "pw", "mm", "gemm"]
    assert (layers["pw"].weight, layers["pw"].via) == ("pw.q", "DequantizeLinear")
    assert (layers["mm"].weight, layers["mm"].via) == ("mm.w16", "Cast")
    assert layers["dw"].depthwise and not layers["conv"].depthwise
    # rows are outputs, columns the reduction: MatMul's B (K, N) is transposed, Gemm's
    # transB weight (N, K) is not
    assert layers["mm"].matrix_shape == (16, 200) and layers["gemm"].matrix_shape == (12, 16)
    assert layers["conv"].matrix_shape == (8, 72)


def test_unstructured_zeroes_the_smallest_of_each_layer(model):
    pruning = prune(model, 0.75)
    dense, sparse = _weights(model), _weights(pruning.model)
    for name in ("conv.w", "gemm.w", "mm.w16"):
        w, p = dense[name], sparse[name]
        zeros = p == 0
        assert zeros.sum() == round(0.75 * w.size), name
        assert np.abs(w[zeros]).max() <= np.abs(w[~zeros]).min(), name   # the smallest
        assert np.array_equal(p[~zeros], w[~zeros]), name
    assert sparse["mm.w16"].dtype == np.float16   # pruned in its own type
    assert np.array_equal(sparse["dw.w"], dense["dw.w"])   # depthwise stays dense
    report = {r.node: r for r in pruning.layers}
    assert report["dw"].dense == "depthwise" and report["dw"].after == 0
    assert report["conv"].dense == "" and report["conv"].after == 0.75
    # the input model is untouched, the graph's structure unchanged
    assert np.array_equal(_weights(model)["conv.w"], dense["conv.w"])
    assert [n.op_type for n in pruning.model.graph.node] == \
        [n.op_type for n in model.graph.node]


def test_two_of_four_keeps_the_largest_two_along_the_reduction(model):
    pruned = _weights(prune_model(model, None, "2:4"))
    w = _weights(model)
    # MatMul B (K, N): groups of 4 consecutive K for each output column
    groups = w["mm.w16"].astype(np.float32).T.reshape(16, 50, 4)
    kept = pruned["mm.w16"].astype(np.float32).T.reshape(16, 50, 4) != 0
    assert (kept.sum(-1) == 2).all()
    top2 = np.sort(np.abs(groups), -1)[..., 2:]
    assert np.array_equal(np.sort(np.abs(np.where(kept, groups, 0)), -1)[..., 2:], top2)
    # Conv (M, C, kh, kw): groups along input channels at each (output, kh, kw)
    conv = np.moveaxis(pruned["conv.w"], 1, -1).reshape(8, 3, 3, 2, 4)
    assert ((conv != 0).sum(-1) == 2).all()


def test_blocks_are_pruned_whole_by_their_norm(model):
    pruning = prune(model, 0.5, "4x1")
    w, p = _weights(model)["gemm.w"], _weights(pruning.model)["gemm.w"]   # (12 out, 16 in)
    blocks = p.reshape(3, 4, 16) != 0
    assert (blocks.all(1) | ~blocks.any(1)).all()   # each 4x1 block whole or gone
    norms = np.linalg.norm(w.reshape(3, 4, 16), axis=1)
    kept = blocks.all(1)
    assert kept.sum() == 24 and norms[kept].min() >= norms[~kept].max()
    conv = _weights(prune_model(model, 0.5, "1x4"))["conv.w"]
    rows = np.moveaxis(conv, 1, -1).reshape(8, 18, 4) != 0   # 1x4 along input channels
    assert (rows.all(-1) | ~rows.any(-1)).all()


def test_an_int8_weight_is_ranked_dequantized_and_pruned_to_its_zero_point():
    rng = np.random.default_rng(3)
    model = _model(rng)
    for t in model.graph.initializer:   # zero points of 5: pruned weights become 5, not 0
        if t.name == "pw.zero":
            t.CopyFrom(numpy_helper.from_array(np.full(8, 5, np.int8), "pw.zero"))
    pruned = _weights(prune_model(model, 0.5, keep=["conv", "mm.w16"]))
    q = _weights(model)["pw.q"].astype(np.float64)
    values = (q - 5) * (0.01 * np.arange(1, 9)).reshape(8, 1, 1, 1)
    at_zero = pruned["pw.q"] == 5
    assert at_zero.sum() >= 32
    assert np.abs(values[at_zero]).max() <= np.abs(values[~at_zero]).min()
    # per-channel scales rank them: the first channel's weights (scale 0.01) go first
    assert at_zero[0].mean() > at_zero[7].mean()
    # keep, by node and by weight name
    assert np.array_equal(pruned["conv.w"], _weights(model)["conv.w"])
    assert np.array_equal(pruned["mm.w16"], _weights(model)["mm.w16"])


def test_depthwise_is_pruned_when_asked(model):
    pruned = _weights(prune_model(model, np.float32(0.5), include_depthwise=True))
    assert (pruned["dw.w"] == 0).mean() == 0.5


def test_keep_mask_breaks_ties_by_position():
    scores = np.ones((2, 4))
    assert keep_mask(scores, parse_pattern("unstructured"), 0.5).tolist() == \
        [[False, False, False, False], [True, True, True, True]]
    assert keep_mask(scores, parse_pattern("2:4"), 0.5).tolist() == \
        [[True, True, False, False], [True, True, False, False]]


@pytest.mark.parametrize("sparsity, pattern, message", [
    (1.0, "unstructured", "sparsity must be a number in [0, 1)"),
    (-0.1, "unstructured", "sparsity must be a number in [0, 1)"),
    ("0.9", "unstructured", "sparsity must be a number in [0, 1)"),
    (None, "unstructured", "sparsity is needed with pattern unstructured"),
    (0.9, "2:4", "pattern 2:4 keeps 2 of every 4 weights: sparsity 0.5, not 0.9"),
    (0.5, "4:2", "N:M keeps N of every M weights, with 0 < N < M"),
    (0.5, "diagonal", "pattern must be unstructured, N:M (e.g. 2:4) or RxC blocks"),
    (0.5, "0x4", "a block is at least 1x1"),
    (None, "2:3", "pattern 2:3 needs a reduction axis that is a multiple of 3, which 3 "
                  "layer(s) lack: pw (Conv, 8 outputs x 8 reduction), mm (MatMul, 16 outputs "
                  "x 200 reduction), gemm"),
    (0.5, "5x1", "outputs a multiple of 5"),
])
def test_mistakes_are_one_clear_error(model, sparsity, pattern, message):
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        prune(model, sparsity, pattern)


def test_keep_names_a_layer_and_the_model_is_a_model_proto(model):
    with pytest.raises(ArgumentError, match="'fc' is neither a layer's node nor its weight"):
        prune(model, 0.5, keep=["fc"])
    with pytest.raises(ArgumentError, match="model must be an onnx.ModelProto"):
        prune(model.SerializeToString(), 0.5)
    # a layer the pattern does not fit, kept dense, is no error
    assert prune(model, None, "2:3", keep=["pw", "mm", "gemm"]).layers[0].after == 1 / 3


def test_output_error_is_zero_for_nothing_pruned_and_agrees_across_references(model):
    same = output_error(model, prune_model(model, 0.0), samples=2)
    assert same[0].max_abs == 0 and same[0].relative == 0 and same[0].top1 == 1
    pruned = prune_model(model, 0.9)
    ours = output_error(model, pruned, samples=2, seed=5)[0]
    theirs = output_error(model, pruned, samples=2, seed=5, reference="onnxruntime")[0]
    assert 0.1 < ours.relative < 2 and ours.relative == pytest.approx(theirs.relative, rel=1e-3)
    with pytest.raises(ArgumentError, match="reference must be one of numpy, onnxruntime"):
        output_error(model, pruned, reference="torch")
    odd = onnx.ModelProto()
    odd.CopyFrom(model)
    odd.opset_import[0].version = 99   # an opset onnxruntime does not know
    with pytest.raises(ArgumentError, match="reference onnxruntime cannot run the model"):
        output_error(odd, odd, reference="onnxruntime")


def test_a_weight_in_a_constant_node_is_pruned():
    w = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
         helper.make_node("MatMul", ["x", "w"], ["y"])], "constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    pruning = prune(helper.make_model(graph), 0.5)
    (layer,) = pruning.layers
    assert (layer.node, layer.weight, layer.after) == ("MatMul_1", "w", 0.5)
    value = numpy_helper.to_array(pruning.model.graph.node[0].attribute[0].t)
    assert (value == 0).sum() == 12 and np.abs(value).min() == 0


def test_zoo_bert_prunes_its_linear_layers_and_runs_on_ids():
    bert = zoo.build("bert", layers=1, hidden=32, heads=2, seq=8, vocab=50)
    pruning = prune(bert, 0.8)
    assert [r.op for r in pruning.layers] == ["MatMul"] * 6   # q, k, v, out, up, down
    assert all(abs(r.after - 0.8) < 1e-3 for r in pruning.layers)
    err = output_error(bert, pruning.model, samples=1)[0]
    assert err.top1 is None and 0 < err.relative < 2


# --- the command --------------------------------------------------------------------------

def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_writes_the_pruned_model_and_reports(model, tmp_path, capsys):
    onnx.save(model, tmp_path / "m.onnx")
    code, out, err = _cli(capsys, "sparsify", tmp_path / "m.onnx", "--sparsity", "0.75",
                          "-o", tmp_path / "p.onnx", "--samples", "2")
    assert code == 0, err
    assert "dw     Conv    8x1x3x3" in out and "dense: depthwise" in out
    assert "4 of 5 layers pruned (unstructured, sparsity 0.75)" in out
    assert "output y: relative error" in out and "(2 random input(s), seed 0, numpy)" in out
    pruned = onnx.load(tmp_path / "p.onnx")
    assert (_weights(pruned)["gemm.w"] == 0).mean() == 0.75
    code, out, _ = _cli(capsys, "sparsify", tmp_path / "m.onnx", "--pattern", "2:4", "--json",
                        "--keep", "gemm", "-o", tmp_path / "q.onnx", "--samples", "0")
    doc = json.loads(out)
    assert code == 0 and doc["sparsity"] == 0.5 and doc["outputs"] == []
    assert [r["dense"] for r in doc["layers"]] == ["", "depthwise", "", "", "kept"]


@pytest.mark.parametrize("argv, message", [
    (["--sparsity", "1"], "--sparsity: must be in [0, 1)"),
    (["--sparsity", "x"], "--sparsity: expects a number"),
    (["--sparsity", "0.5", "--pattern", "3x"], "pattern must be unstructured, N:M"),
    (["--pattern", "2:4", "--keep", "nope"], "'nope' is neither a layer's node"),
    (["--sparsity", "0.5", "--reference", "tvm"], "--reference: invalid choice"),
])
def test_cli_mistakes_exit_2_with_one_line(model, tmp_path, capsys, argv, message):
    onnx.save(model, tmp_path / "m.onnx")
    code, out, err = _cli(capsys, "sparsify", tmp_path / "m.onnx", "-o", tmp_path / "p.onnx",
                          *argv)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "p.onnx").exists()


def test_cli_refuses_a_file_that_is_not_onnx_and_writing_over_the_model(tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(b"not a model")
    code, _, err = _cli(capsys, "sparsify", tmp_path / "m.onnx", "--sparsity", "0.5", "-o",
                        tmp_path / "p.onnx")
    assert code == 2 and "not an ONNX model" in err
    code, _, err = _cli(capsys, "sparsify", tmp_path / "m.onnx", "--sparsity", "0.5", "-o",
                        tmp_path / "m.onnx")
    assert code == 2 and "write the pruned model to another file" in err


def test_a_float16_model_is_pruned_in_float16():
    pytest.importorskip("onnxconverter_common")   # (zoo.float16's converter, optional)
    model = zoo.float16(zoo.build("cnn", size=8))
    pruning = prune(model, 0.8)
    assert [round(r.after, 2) for r in pruning.layers] == [0.8] * 4
    weights = _weights(pruning.model)
    assert weights["fc.weight"].dtype == np.float16 and (weights["fc.weight"] == 0).mean() == 0.8
    assert output_error(model, pruning.model, samples=1)[0].relative > 0


def test_a_weight_cast_to_integers_is_no_layer():
    w = numpy_helper.from_array(np.ones((6, 4), np.float16), "w16")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.INT32),
         helper.make_node("MatMul", ["x", "w"], ["y"])], "ints",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 4])], [w])
    assert find_layers(helper.make_model(graph)) == []
