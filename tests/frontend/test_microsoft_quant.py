"""The com.microsoft quantized ops (frontend/onnx_ops/quant_microsoft.py) on small generated
graphs against onnxruntime's contrib kernels, fresh seeded inputs: quantized outputs equal
except for one unit on at most 0.1% of the elements (issue 33's accuracy contract: rounding
ties), float outputs within float32 rounding; the products among them become fuse_quantized's
integer ops, and the llvm target computes what the references do."""

import collections

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.errors import UnsupportedOpError
from dnnc.frontend.onnx import import_onnx
from dnnc.ir.interpreter import run_graph
from dnnc.ir.target import Target
from dnnc.passes.manager import optimize

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "ms", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])


def _run(model, feeds):
    """(onnxruntime's outputs, dnnc's numpy references after the level-1 passes, their ops,
    dnnc's llvm outputs)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    g = optimize(import_onnx(model), Target("numpy"), opt_level=1)
    got = run_graph(g, [feeds[v.name] for v in g.inputs])
    compiled = dnnc.compile(model, "llvm", cache=False)(**feeds)
    compiled = compiled if isinstance(compiled, (list, tuple)) else [compiled]
    return want, got, collections.Counter(n.op for n in g.nodes), compiled


def assert_quantized_close(got, want):
    """Equal but for one unit on at most 0.1% of the elements."""
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and np.count_nonzero(diff) <= 0.001 * diff.size, \
        (diff.max(), np.count_nonzero(diff))


def _info(name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         shape)


SHAPE = (2, 16, 8, 8)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_ops_equal_onnxruntime(op, dtype):
    rng = np.random.default_rng(len(op) * 2 + (dtype is np.int8))
    info = np.iinfo(dtype)
    inits = {"sa": np.float32(0.03), "za": dtype(info.min + 100), "sb": np.float32(0.05),
             "zb": dtype(info.min + 140), "sc": np.float32(0.07 if op == "QLinearAdd" else 0.2),
             "zc": dtype(info.min + 120),
             "b": rng.integers(info.min, info.max + 1, SHAPE[1:]).astype(dtype)}
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                            domain=MS)
    model = _model([node], [_info("a", dtype, SHAPE)], [_info("y", dtype, SHAPE)], inits)
    feeds = {"a": rng.integers(info.min, info.max + 1, SHAPE).astype(dtype)}
    want, got, _, compiled = _run(model, feeds)
    assert_quantized_close(got[0], want[0])
    assert np.array_equal(compiled[0], got[0])
    assert len(np.unique(want[0])) > 50


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}),
                                      ("QLinearLeakyRelu", {"alpha": 0.1}),
                                      ("QLinearGlobalAveragePool", {"channels_last": 0}),
                                      ("QLinearSoftmax", {"axis": -1, "opset": 13})])
def test_qlinear_unary_ops_equal_onnxruntime(op, attrs):
    rng = np.random.default_rng(len(op))
    dtype = np.uint8
    inits = {"sx": np.float32(0.05), "zx": dtype(128),
             "sy": np.float32(1 / 256 if op in ("QLinearSigmoid", "QLinearSoftmax") else 0.04),
             "zy": dtype(0 if op in ("QLinearSigmoid", "QLinearSoftmax") else 100)}
    out = (SHAPE[0], SHAPE[1], 1, 1) if op == "QLinearGlobalAveragePool" else SHAPE
    node = helper.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **attrs)
    model = _model([node], [_info("x", dtype, SHAPE)], [_info("y", dtype, out)], inits)
    feeds = {"x": rng.integers(0, 256, SHAPE).astype(dtype)}
    want, got, _, compiled = _run(model, feeds)
    assert_quantized_close(got[0], want[0])
    assert_quantized_close(compiled[0], got[0])


def test_qlinear_concat_equals_onnxruntime():
    rng = np.random.default_rng(5)
    inits = {"sy": np.float32(0.05), "zy": np.int8(3), "s1": np.float32(0.04), "z1": np.int8(-7),
             "s2": np.float32(0.08), "z2": np.int8(10)}
    node = helper.make_node("QLinearConcat", ["sy", "zy", "x1", "s1", "z1", "x2", "s2", "z2"],
                            ["y"], domain=MS, axis=1)
    shape2 = (2, 5, 8, 8)
    model = _model([node], [_info("x1", np.int8, SHAPE), _info("x2", np.int8, shape2)],
                   [_info("y", np.int8, (2, 21, 8, 8))], inits)
    feeds = {"x1": rng.integers(-128, 128, SHAPE).astype(np.int8),
             "x2": rng.integers(-128, 128, shape2).astype(np.int8)}
    want, got, _, compiled = _run(model, feeds)
    assert_quantized_close(got[0], want[0])
    assert np.array_equal(compiled[0], got[0])


@pytest.mark.parametrize("trans_b,per_column,quantized", [(0, False, True), (1, True, True),
                                                          (0, True, False)])
def test_qgemm_becomes_an_integer_dense_equal_to_onnxruntime(trans_b, per_column, quantized):
    rng = np.random.default_rng(trans_b * 4 + per_column * 2 + quantized)
    m, k, n = 24, 70, 40
    w = rng.integers(-127, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    sb = rng.uniform(0.001, 0.01, n).astype(np.float32) if per_column else np.float32(0.004)
    inits = {"sa": np.float32(0.05), "za": np.uint8(120), "b": w, "sb": sb,
             "zb": np.zeros(n, np.int8) if per_column else np.int8(0),
             "c": rng.integers(-3000, 3000, n).astype(np.int32), "sy": np.float32(0.3),
             "zy": np.uint8(110)}
    inputs = ["a", "sa", "za", "b", "sb", "zb", "c"] + (["sy", "zy"] if quantized else [])
    node = helper.make_node("QGemm", inputs, ["y"], domain=MS, transB=trans_b)
    out = np.uint8 if quantized else np.float32
    model = _model([node], [_info("a", np.uint8, (m, k))], [_info("y", out, (m, n))], inits)
    feeds = {"a": rng.integers(0, 256, (m, k)).astype(np.uint8)}
    want, got, ops, compiled = _run(model, feeds)
    assert ops["QuantizedDense"] == 1 and "Gemm" not in ops
    if quantized:
        assert np.array_equal(got[0], want[0]) and np.array_equal(compiled[0], want[0])
    else:
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6 * np.abs(want[0]).max())
        np.testing.assert_array_equal(compiled[0], got[0])


@pytest.mark.parametrize("op", ["DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
@pytest.mark.parametrize("weights", [np.int8, np.uint8])
def test_float_output_integer_products_become_integer_dense_ops(op, weights):
    rng = np.random.default_rng(3 if op == "DynamicQuantizeMatMul" else 4)
    k, n = 48, 36
    info = np.iinfo(weights)
    inits = {"b": rng.integers(info.min, info.max + 1, (k, n)).astype(weights),
             "sb": rng.uniform(0.001, 0.01, n).astype(np.float32),
             "zb": rng.integers(info.min, info.max + 1, n).astype(weights),
             "bias": rng.standard_normal(n).astype(np.float32)}
    if op == "DynamicQuantizeMatMul":
        nodes = [helper.make_node(op, ["x", "b", "sb", "zb", "bias"], ["y"], domain=MS)]
        feeds = {"x": rng.standard_normal((2, 9, k)).astype(np.float32)}
        x_info = _info("x", np.float32, (2, 9, k))
    else:
        inits.update(sa=np.float32(0.02), za=np.uint8(131))
        nodes = [helper.make_node(op, ["x", "b", "sa", "sb", "za", "zb", "bias"], ["y"],
                                  domain=MS)]
        feeds = {"x": rng.integers(0, 256, (2, 9, k)).astype(np.uint8)}
        x_info = _info("x", np.uint8, (2, 9, k))
    model = _model(nodes, [x_info], [_info("y", np.float32, (2, 9, n))], inits)
    want, got, ops, compiled = _run(model, feeds)
    assert ops["QuantizedDense"] == 1 and "MatMulInteger" not in ops
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5 * np.abs(want[0]).max())
    np.testing.assert_allclose(compiled[0], got[0], rtol=1e-6, atol=1e-6 * np.abs(want[0]).max())


def test_an_unsupported_microsoft_op_is_reported_up_front():
    nodes = [helper.make_node("QLinearReduceMean", ["x"], ["y"], domain=MS),
             helper.make_node("QLinearAdd", ["y", "s", "z", "y", "s", "z", "s", "z"], ["w"],
                              domain=MS)]
    model = _model(nodes, [_info("x", np.uint8, (1, 4))], [_info("w", np.uint8, (1, 4))],
                   {"s": np.float32(0.1), "z": np.uint8(0)})
    with pytest.raises(UnsupportedOpError, match="QLinearReduceMean") as err:
        import_onnx(model)
    assert "QLinearAdd" not in str(err.value)


def test_qlinear_global_average_pool_equals_onnxruntime_bit_for_bit():
    """Q(GlobalAveragePool(DQ(x))) against MLAS's integer sum times x_scale / size / y_scale:
    the same values on a thousand channels (a tie would need a mean exactly between two
    steps)."""
    rng = np.random.default_rng(17)
    shape = (4, 256, 7, 7)
    inits = {"sx": np.float32(0.037), "zx": np.uint8(121), "sy": np.float32(0.011),
             "zy": np.uint8(90)}
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"],
                            domain=MS, channels_last=0)
    model = _model([node], [_info("x", np.uint8, shape)], [_info("y", np.uint8, shape[:2] +
                                                                 (1, 1))], inits)
    feeds = {"x": rng.integers(0, 256, shape).astype(np.uint8)}
    want, got, _, compiled = _run(model, feeds)
    assert np.array_equal(got[0], want[0]) and np.array_equal(compiled[0], want[0])


@pytest.mark.parametrize("b_shape", [(64, 48), (48,), (1,)])
def test_qlinear_add_is_mlas_arithmetic_bit_for_bit(b_shape):
    """QLinearAdd as MLAS computes it (fused multiply-adds of the scale ratios; an operand of
    one value folded first): equal to onnxruntime on a hundred thousand values, where
    Q(DQ(a) + DQ(b)) was one unit off on a few."""
    rng = np.random.default_rng(len(b_shape))
    shape = (32, 64, 48)
    inits = {"sa": np.float32(0.0437), "za": np.uint8(131), "sb": np.float32(0.0291),
             "zb": np.uint8(97), "sc": np.float32(0.0533), "zc": np.uint8(118),
             "b": rng.integers(0, 256, b_shape).astype(np.uint8)}
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                            domain=MS)
    model = _model([node], [_info("a", np.uint8, shape)], [_info("y", np.uint8, shape)], inits)
    feeds = {"a": rng.integers(0, 256, shape).astype(np.uint8)}
    want, got, ops, compiled = _run(model, feeds)
    assert ops["QLinearAdd"] == 1
    assert np.array_equal(got[0], want[0]) and np.array_equal(compiled[0], want[0])


def _qattention_model(rng, mask: str, unidirectional: int, per_column: bool, weights):
    """QAttention of a uint8 input [2, 7, 32] over 4 heads of 8, weights int8 or uint8 (per
    column scales and zero points or one each), and its feeds."""
    batch, seq, k, hidden = 2, 7, 32, 32
    columns = (3 * hidden,) if per_column else ()
    low = -128 if weights == np.int8 else 0
    inits = {"w": rng.integers(low, low + 256, (k, 3 * hidden)).astype(weights),
             "bias": rng.standard_normal(3 * hidden).astype(np.float32),
             "sx": np.float32(0.021), "zx": np.uint8(119),
             "sw": (rng.random(columns) * 0.004 + 0.002).astype(np.float32),
             "zw": rng.integers(low + 100, low + 156, columns).astype(weights)}
    feeds = {"x": rng.integers(0, 256, (batch, seq, k)).astype(np.uint8)}
    infos = [_info("x", np.uint8, (batch, seq, k))]
    if mask == "lengths":
        feeds["mask"] = np.array([seq, 4], np.int32)
    elif mask == "keys":
        feeds["mask"] = (rng.random((batch, seq)) < 0.7).astype(np.int32)
        feeds["mask"][:, 0] = 1
    elif mask == "queries":
        feeds["mask"] = (rng.random((batch, seq, seq)) < 0.7).astype(np.int32)
        feeds["mask"][..., 0] = 1
    if mask != "none":
        infos.append(_info("mask", np.int32, feeds["mask"].shape))
    names = ["x", "w", "bias", "sx", "sw", "mask" if mask != "none" else "", "zx", "zw"]
    node = helper.make_node("QAttention", names, ["y"], domain=MS, num_heads=4,
                            unidirectional=unidirectional)
    return _model([node], infos, [_info("y", np.float32, (batch, seq, hidden))], inits), feeds


@pytest.mark.parametrize("mask,unidirectional", [("none", 0), ("none", 1), ("lengths", 0),
                                                 ("keys", 0), ("queries", 1)])
@pytest.mark.parametrize("per_column,weights", [(False, np.int8), (True, np.int8),
                                                (False, np.uint8)])
def test_qattention_equals_onnxruntime(mask, unidirectional, per_column, weights):
    """The integer QKV product (fuse_quantized's QuantizedDense), then Attention with the
    mask_index as onnxruntime's additive mask_filter_value: float32 rounding apart."""
    rng = np.random.default_rng(33)
    model, feeds = _qattention_model(rng, mask, unidirectional, per_column, weights)
    want, got, ops, compiled = _run(model, feeds)
    assert ops["QuantizedDense"] == 1 and ops["Attention"] == 1
    scale = np.abs(want[0]).max()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(compiled[0], want[0], rtol=1e-5, atol=1e-5 * scale)


def test_qattention_with_a_cache_is_reported():
    rng = np.random.default_rng(34)
    model, _ = _qattention_model(rng, "none", 0, False, np.int8)
    model.graph.node[0].input.append("past")
    model.graph.input.append(_info("past", np.float32, (2, 2, 4, 0, 8)))
    with pytest.raises(Exception, match="cache"):
        import_onnx(model)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 1, 0], "ceil_mode": 1},
])
def test_qlinear_average_pool_equals_onnxruntime_bit_for_bit(dtype, attrs):
    """round(mean / y_scale + y_zero_point), the zero point added before rounding as
    onnxruntime's kernel does (Q(AveragePool(DQ)) was one unit off on up to 0.3% of these)."""
    rng = np.random.default_rng(len(attrs) + (dtype is np.int8))
    info = np.iinfo(dtype)
    shape = (2, 32, 14, 13)
    inits = {"sx": np.float32(0.037), "zx": dtype(info.min + 121), "sy": np.float32(0.029),
             "zy": dtype(info.min + 100)}
    node = helper.make_node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"],
                            domain=MS, **attrs)
    model = _model([node], [_info("x", dtype, shape)], [_info("y", dtype, None)], inits)
    feeds = {"x": rng.integers(info.min, info.max + 1, shape).astype(dtype)}
    want, got, _, compiled = _run(model, feeds)
    assert len(np.unique(want[0])) > 50
    assert np.array_equal(got[0], want[0]) and np.array_equal(compiled[0], want[0])
