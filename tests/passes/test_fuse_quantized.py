"""fuse_quantized: DQ -> product -> Q chains (QDQ) and the operator format (QLinearMatMul,
QLinearConv, MatMulInteger / ConvInteger with their Cast and Mul) become QuantizedDense /
QuantizedConv; moves between quantized values run on the integers; a chain that is not exact
stays float. The references of the integer ops are compared bit for bit with onnxruntime's
int8 kernels (the requantization is MLAS's: one float32 product, rounding half to even)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.frontend.onnx import import_onnx
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.quantized import pack_groups, quantized_dense, unpack_groups
from dnnc.passes.fuse_quantized import fuse_quantized
from dnnc.testing.quantized_files import onnxruntime_outputs, onnxruntime_values

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits, opset=13):
    graph = helper.make_graph(nodes, "q", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _fused(model, feeds, tmp_path):
    """(ops after the pass, dnnc's reference outputs, onnxruntime's) for `model`."""
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    g = import_onnx(model)
    fuse_quantized(g)
    g.verify()
    got = run_graph(g, [feeds[v.name] for v in g.inputs])
    return [n.op for n in g.nodes], got, onnxruntime_outputs(path, feeds)


def _scales(rng, n):
    return (rng.uniform(0.002, 0.02, n)).astype(np.float32)


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_qlinear_conv_and_matmul_equal_onnxruntime(tmp_path, act):
    rng = np.random.default_rng(33)
    info = np.iinfo(act)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(act))
    w = rng.integers(-127, 128, (12, 5, 3, 3)).astype(np.int8)
    wm = rng.integers(-127, 128, (12 * 9 * 7, 21)).astype(np.int8)
    inits = {"sx": np.float32(0.05), "zx": act(7), "w": w, "sw": _scales(rng, 12),
             "zw": np.zeros(12, np.int8), "sy": np.float32(0.9), "zy": act(3),
             "b": rng.integers(-3000, 3000, 12).astype(np.int32),
             "sy2": np.float32(0.04), "wm": wm, "swm": np.float32(0.003), "zwm": np.int8(0),
             "sz": np.float32(2.5), "zz": act(-5 if info.min < 0 else 120),
             "shape": np.array([1, -1])}
    nodes = [helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"],
                              ["y"], pads=[1, 0, 1, 2], strides=[1, 1]),
             helper.make_node("Reshape", ["y", "shape"], ["yf"]),
             helper.make_node("QLinearMatMul", ["yf", "sy", "zy", "wm", "swm", "zwm", "sz", "zz"],
                              ["z"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", elem, [1, 5, 9, 7])],
                   [helper.make_tensor_value_info("z", elem, [1, 21])], inits)
    x = rng.integers(info.min, info.max + 1, (1, 5, 9, 7)).astype(act)
    ops, got, want = _fused(model, {"x": x}, tmp_path)
    assert ops == ["QuantizedConvPacked", "Reshape", "QuantizedDense"]
    assert got[0].dtype == act and np.array_equal(got[0], want[0])
    assert len(np.unique(want[0])) > 10   # (not saturated flat)


def _qdq_conv_model(rng, relu: bool, bias_dq: bool = True, wzp: int = 0, w_range=(-127, 127)):
    """x -> Q -> DQ -> Conv(DQ(w), DQ(b)) [-> Relu] -> Q -> DQ -> MaxPool -> Q -> DQ -> y."""
    f32 = TensorProto.FLOAT
    sx, sw = np.float32(0.02), _scales(rng, 8)
    wq = rng.integers(w_range[0], w_range[1] + 1, (8, 4, 3, 3)).astype(np.int8)
    wq.flat[:2] = w_range
    inits = {"sx": sx, "zx": np.int8(-3), "wq": wq,
             "sw": sw, "zw": np.full(8, wzp, np.int8),
             "bq": rng.integers(-500, 500, 8).astype(np.int32), "sb": sx * sw,
             "zb": np.zeros(8, np.int32), "sy": np.float32(0.05), "zy": np.int8(-20),
             "bf": rng.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd" if bias_dq else "bf"], ["c"],
                              pads=[1, 1, 1, 1])]
    last = "c"
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        last = "r"
    nodes += [helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["cq"]),
              helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["cd"]),
              helper.make_node("MaxPool", ["cd"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["pq"]),
              helper.make_node("DequantizeLinear", ["pq", "sy", "zy"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", f32, [1, 4, 10, 10])],
                  [helper.make_tensor_value_info("y", f32, [1, 8, 5, 5])], inits)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("weights", [{}, dict(wzp=3, w_range=(-125, 127))],
                         ids=["zero-point-0", "weights-less-zero-point"])
def test_a_qdq_conv_chain_becomes_one_integer_conv_and_an_integer_maxpool(tmp_path, relu,
                                                                          weights):
    """Also where the weights less their zero point lie within int8 (w - 3 of w in
    [-125, 127]: DQ's values, as int8 weights of zero point 0; a uint4 file's weights less
    their 8 likewise)."""
    rng = np.random.default_rng(8 if weights else 7)
    model = _qdq_conv_model(rng, relu, **weights)
    x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
    ops, got, want = _fused(model, {"x": x}, tmp_path)
    assert ops == ["QuantizeLinear", "QuantizedConvPacked", "MaxPool", "DequantizeLinear"]
    assert np.array_equal(got[0], want[0])
    if relu:   # the clamp at the zero point: no value below 0
        assert got[0].min() == 0.0


@pytest.mark.parametrize("group,op", [(2, "QuantizedConvPacked"), (4, "QuantizedConvPacked"),
                                      (8, "QuantizedConv"), (16, "QuantizedConv")])
def test_a_grouped_qdq_conv_equals_onnxruntime(tmp_path, group, op):
    """Groups of 8 and 4 channels pack (`fuse_quantized.packed`: panels over their groups'
    channels), groups of 2 and depthwise stay QuantizedConv; both onnxruntime's bits."""
    rng = np.random.default_rng(group)
    f32 = TensorProto.FLOAT
    sx, sw = np.float32(0.02), _scales(rng, 16)
    inits = {"sx": sx, "zx": np.uint8(121),
             "wq": rng.integers(-127, 128, (16, 16 // group, 3, 3)).astype(np.int8),
             "sw": sw, "zw": np.zeros(16, np.int8),
             "bq": rng.integers(-500, 500, 16).astype(np.int32), "sb": sx * sw,
             "zb": np.zeros(16, np.int32), "sy": np.float32(0.01), "zy": np.uint8(100)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1],
                              strides=[2, 2], group=group),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", f32, [1, 16, 9, 9])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 16, 5, 5])],
                   inits)
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    ops, got, want = _fused(model, {"x": x}, tmp_path)
    assert ops == ["QuantizeLinear", op]
    assert np.array_equal(got[0], want[0]) and len(np.unique(want[0])) > 10


def _silu_model(act, extra_reader: bool = False):
    """x -> Q -> DQ -> SiLU as onnxruntime's quantizer writes it (Sigmoid quantized, then the
    Mul) -> Q -> DQ; `extra_reader`: the Sigmoid's value is also a graph output."""
    f32, elem = TensorProto.FLOAT, helper.np_dtype_to_tensor_dtype(np.dtype(act))
    zero = act(3 if act is np.int8 else 131)
    inits = {"sx": np.float32(0.03), "zx": zero, "ss": np.float32(1 / 255),
             "zs": act(-128 if act is np.int8 else 0), "sy": np.float32(0.02), "zy": zero}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("Sigmoid", ["xd"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "ss", "zs"], ["sq"]),
             helper.make_node("DequantizeLinear", ["sq", "ss", "zs"], ["sd"]),
             helper.make_node("Mul", ["xd", "sd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", elem, [2, 3, 50, 50])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("s", f32, [2, 3, 50, 50]))
    return _model(nodes, [helper.make_tensor_value_info("x", f32, [2, 3, 50, 50])], outputs,
                  inits)


@pytest.mark.parametrize("act", [np.int8, np.uint8])
def test_a_silu_between_quantizations_becomes_one_table_equal_to_onnxruntime(tmp_path, act):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 3, 50, 50)) * 2).astype(np.float32)
    model = _silu_model(act)
    ops, got, want = _fused(model, {"x": x}, tmp_path)
    assert ops == ["QuantizeLinear", "QuantizedTable"]
    unfused = run_graph(import_onnx(model), [x])[0]   # the chain's references, op by op
    assert got[0].dtype == act and np.array_equal(got[0], unfused)
    assert len(np.unique(want[0])) > 100   # (every value of the table in use)
    # onnxruntime's QLinearSigmoid / QLinearMul round differently from the QDQ ops' own
    # arithmetic: 1 unit on 0.9% of uint8 outputs here, in the unfused reference too
    assert np.abs(got[0].astype(int) - want[0].astype(int)).max() <= (act is np.uint8)


def test_a_chain_with_dequantized_scalar_constants_becomes_one_table(tmp_path):
    """GELU's constants quantized (DQ of an int8 scalar, as onnxruntime's quantizer writes
    convnext's): evaluated into the table, their DequantizeLinear left to whoever reads it."""
    f32 = TensorProto.FLOAT
    inits = {"s": np.float32(0.05), "z": np.int8(2), "c": np.int8(40), "sc": np.float32(0.1),
             "zc": np.int8(0), "s2": np.float32(0.04), "z2": np.int8(-3)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["c", "sc", "zc"], ["cd"]),
             helper.make_node("Erf", ["xd"], ["e"]),
             helper.make_node("Mul", ["e", "cd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "s2", "z2"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", f32, [3, 40])],
                   [helper.make_tensor_value_info("y", TensorProto.INT8, [3, 40])], inits)
    x = np.random.default_rng(9).standard_normal((3, 40)).astype(np.float32) * 3
    ops, got, want = _fused(model, {"x": x}, tmp_path)
    assert ops == ["QuantizeLinear", "QuantizedTable"]
    assert np.array_equal(got[0], run_graph(import_onnx(model), [x])[0])
    assert np.array_equal(got[0], want[0])


def test_a_chain_read_elsewhere_or_of_clamps_only_is_no_table(tmp_path):
    """The Sigmoid's value is also an output: no chain through it is taken (it must still
    be computed); a Clip alone between quantizations costs less than a lookup."""
    g = import_onnx(_silu_model(np.uint8, extra_reader=True))
    fuse_quantized(g)
    ops = [n.op for n in g.nodes]
    assert "QuantizedTable" not in ops and {"Sigmoid", "Mul"} <= set(ops)
    f32 = TensorProto.FLOAT
    inits = {"s": np.float32(0.03), "z": np.uint8(100), "lo": np.float32(-1),
             "hi": np.float32(2), "s2": np.float32(0.01), "z2": np.uint8(7)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Clip", ["xd", "lo", "hi"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "s2", "z2"], ["y"])]
    g = import_onnx(_model(nodes, [helper.make_tensor_value_info("x", f32, [4])],
                           [helper.make_tensor_value_info("y", TensorProto.UINT8, [4])],
                           inits))
    fuse_quantized(g)
    assert "QuantizedTable" not in [n.op for n in g.nodes]


def test_a_relu_before_q_is_the_zero_point_as_lower_bound():
    g = import_onnx(_qdq_conv_model(np.random.default_rng(1), relu=True))
    fuse_quantized(g)
    (conv,) = [n for n in g.nodes if n.op == "QuantizedConvPacked"]
    assert (conv.attrs["lo"], conv.attrs["hi"]) == (-20, None)


@pytest.mark.parametrize("kind", ["float_bias", "weight_zero_point"])
def test_a_chain_that_is_not_exact_stays_float(kind):
    # (w - 3 of w = -127 is below int8's range)
    model = _qdq_conv_model(np.random.default_rng(2), relu=False, bias_dq=kind != "float_bias",
                            wzp=3 if kind == "weight_zero_point" else 0)
    g = import_onnx(model)
    fuse_quantized(g)
    ops = [n.op for n in g.nodes]
    assert "Conv" in ops and not {"QuantizedConv", "QuantizedConvPacked"} & set(ops)
    assert "MaxPool" in ops   # the move on integers is taken on its own


WEIGHTS = {   # weights' type and zero point, as quantize_dynamic writes them
    "int8": lambda rng: (rng.integers(-127, 128, (37, 19)).astype(np.int8), np.int8(0)),
    "uint8": lambda rng: (rng.integers(0, 256, (37, 19)).astype(np.uint8), np.uint8(131)),
    "uint8_per_column": lambda rng: (rng.integers(0, 256, (37, 19)).astype(np.uint8),
                                     rng.integers(0, 256, 19).astype(np.uint8)),
    "int8_per_column": lambda rng: (rng.integers(-128, 128, (37, 19)).astype(np.int8),
                                    rng.integers(-20, 20, 19).astype(np.int8)),
}


@pytest.mark.parametrize("weights", WEIGHTS)
def test_matmul_integer_with_its_cast_and_scale_becomes_a_float_output_dense(tmp_path, weights):
    rng = np.random.default_rng(4)
    f32 = TensorProto.FLOAT
    w, zw = WEIGHTS[weights](rng)
    inits = {"w": w, "zw": zw, "sw": np.float32(0.01) if zw.size == 1 else _scales(rng, 19),
             "bias": rng.standard_normal(19).astype(np.float32)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "sx", "zx"]),
             helper.make_node("MatMulInteger", ["xq", "w", "zx", "zw"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=f32),
             helper.make_node("Mul", ["sx", "sw"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y0"]),
             helper.make_node("Add", ["y0", "bias"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", f32, [2, 3, 37])],
                   [helper.make_tensor_value_info("y", f32, [2, 3, 19])], inits)
    x = rng.standard_normal((2, 3, 37)).astype(np.float32)
    ops, got, want = _fused(model, {"x": x}, tmp_path)
    # the scales' Mul taken in as the op's x_scale: no kernel of its own for one product,
    # the same float32 scale (the file's chain by the references, bit for bit)
    assert ops == ["DynamicQuantizeLinear", "QuantizedDense", "Add"]
    assert np.array_equal(got[0], run_graph(import_onnx(model), [x])[0])
    # onnxruntime fuses the chain into MatMulIntegerToFloat: the same float32 product of the
    # exact sum and the scales' product
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k,n", [(1, 1), (5, 17), (64, 16), (130, 33)])
def test_groups_pack_and_unpack(k, n):
    w = np.random.default_rng(k * n).integers(-128, 128, (k, n)).astype(np.int8)
    wp = pack_groups(w)
    assert wp.shape == (-(-n // 16), -(-k // 4), 16, 4)
    assert wp[(n - 1) // 16, (k - 1) // 4, (n - 1) % 16, (k - 1) % 4] == w[-1, -1]
    assert np.array_equal(unpack_groups(wp, k, n), w)


def test_the_reference_rejects_sums_that_are_not_the_weights():
    w = np.ones((8, 3), np.int8)
    a = np.zeros((2, 8), np.uint8)
    with pytest.raises(ValueError, match="w_sums"):
        quantized_dense(a, np.uint8(0), pack_groups(w), np.array([8, 8, 7], np.int32), n=3,
                        lo=None, hi=None)


def test_inspect_counts_the_int8_products_and_names_the_float_ones():
    from dnnc.compiler.inspect import format_passes, pass_report

    g = import_onnx(_qdq_conv_model(np.random.default_rng(5), relu=True))
    rows = pass_report(g, "llvm", 3)
    assert (rows[0].int8, rows[0].float_products) == (0, ("Conv_4",))
    assert (rows[1].name, rows[1].int8, rows[1].float_products) == ("fuse_quantized", 1, ())
    text = format_passes(rows, "llvm", 3)
    assert "int8: 1 of 1 products run as integer ops" in text
    float_conv = import_onnx(_qdq_conv_model(np.random.default_rng(5), relu=False,
                                             bias_dq=False))
    assert pass_report(float_conv, "llvm", 3)[-1].int8 == 0


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_qlinear_matmul_of_two_activations_is_an_exact_float_matmul(tmp_path, act):
    """Attention's QLinearMatMuls (both operands activations): the shifted integers'
    product as a float32 MatMul (exact below 2**24), requantized as the integer ops are:
    equal to onnxruntime's (MLAS) bit for bit."""
    rng = np.random.default_rng(8)
    info = np.iinfo(act)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(act))
    inits = {"sa": np.float32(0.031), "za": act(info.min + 117), "sb": np.float32(0.027),
             "zb": act(info.min + 140), "sy": np.float32(0.9), "zy": act(info.min + 125)}
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                            ["y"])
    model = _model([node], [helper.make_tensor_value_info("a", elem, [2, 3, 24, 64]),
                            helper.make_tensor_value_info("b", elem, [2, 3, 64, 20])],
                   [helper.make_tensor_value_info("y", elem, [2, 3, 24, 20])], inits)
    feeds = {k: rng.integers(info.min, info.max + 1, shape).astype(act)
             for k, shape in (("a", (2, 3, 24, 64)), ("b", (2, 3, 64, 20)))}
    ops, got, want = _fused(model, feeds, tmp_path)
    assert ops == ["DequantizeLinear", "DequantizeLinear", "MatMul", "Mul", "QuantizeLinear"]
    assert np.array_equal(got[0], want[0]) and len(np.unique(want[0])) > 50


def test_qlinear_matmul_weights_through_a_transpose_become_an_integer_dense(tmp_path):
    """A tied embedding as GPT-2's head: QLinearMatMul(x, Transpose(table)), the table a
    constant (fold_constants runs after this pass): one integer dense op, bit for bit."""
    rng = np.random.default_rng(9)
    elem = TensorProto.UINT8
    inits = {"sa": np.float32(0.03), "za": np.uint8(120), "sb": np.float32(0.004),
             "zb": np.uint8(128), "sy": np.float32(0.5), "zy": np.uint8(100),
             "table": rng.integers(0, 256, (50, 300)).astype(np.uint8)}
    nodes = [helper.make_node("Transpose", ["table"], ["w"], perm=[1, 0]),
             helper.make_node("QLinearMatMul", ["a", "sa", "za", "w", "sb", "zb", "sy", "zy"],
                              ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("a", elem, [7, 300])],
                   [helper.make_tensor_value_info("y", elem, [7, 50])], inits)
    feeds = {"a": rng.integers(0, 256, (7, 300)).astype(np.uint8)}
    ops, got, want = _fused(model, feeds, tmp_path)
    assert ops == ["QuantizedDense"]
    assert np.array_equal(got[0], want[0]) and len(np.unique(want[0])) > 20


def _residual_add_model(act, ties=False):
    """DQ(a) + DQ(b) -> Q of scalar parameters, broadcasting b over a's rows; with `ties` of
    scales 2 / 255, 1 / 255 and 2 / 255 (half the sums exact ties in real arithmetic)."""
    t = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    rng = np.random.default_rng(4)
    low = np.iinfo(act).min
    sa, sb, sc = (np.float32(2 / 255), np.float32(1 / 255), np.float32(2 / 255)) if ties else \
        (np.float32(0.031), np.float32(0.017), np.float32(0.043))
    inits = {"sa": sa, "za": act(low + 121), "sb": sb, "zb": act(low + 90), "sc": sc,
             "zc": act(low + 133)}
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["ad"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bd"]),
             helper.make_node("Add", ["ad", "bd"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "sc", "zc"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("a", t[act], [64, 48]),
                           helper.make_tensor_value_info("b", t[act], [48])],
                   [helper.make_tensor_value_info("y", t[act], [64, 48])], inits)
    info = np.iinfo(act)
    feeds = {"a": rng.integers(info.min, info.max + 1, (64, 48)).astype(act),
             "b": rng.integers(info.min, info.max + 1, 48).astype(act)}
    return model, feeds


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_a_dequantized_add_requantized_is_the_files_float_chain_as_one_op(tmp_path, act, ties):
    """QuantizedAdd: the file's float32 DQ, Add, Q (defined to the bit), equal to
    onnxruntime's run of the ops one by one. (onnxruntime's own QLinearAdd, the chain's fusion
    in its optimised sessions, rounds MLAS's fused multiply-adds: off by a step on part of
    the ties.) It multiplies by 1 / c_scale (`add_reciprocal` proves it rounds as the
    quotient), with the tie-making scales refined by an fma step."""
    model, feeds = _residual_add_model(act, ties)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    g = import_onnx(model)
    fuse_quantized(g)
    assert [n.op for n in g.nodes] == ["QuantizedAdd"]
    assert g.nodes[0].attrs["c_reciprocal"] is not None and g.nodes[0].attrs["c_refined"] == ties
    want = onnxruntime_values(path, feeds)["y"]
    assert np.array_equal(run_graph(g, [feeds[v.name] for v in g.inputs])[0], want)
    assert np.array_equal(dnnc.compile(model, "llvm", cache=False)(**feeds), want)


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_known_difference_onnxruntime_fuses_the_add_into_qlinear_add_rounding_ties_otherwise(
        tmp_path, act):
    """Recorded, not dnnc's: onnxruntime's optimised session (int8 chains allowed, as it fuses
    uint8 ones by default) computes the chain as QLinearAdd, MLAS's fused multiply-adds on
    s_a / s_c, s_b / s_c and a folded zero point, which round part of the ties otherwise
    than the file's float32 chain (its own one-op-at-a-time run, and dnnc's QuantizedAdd)."""
    model, feeds = _residual_add_model(act, ties=True)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    fused = ort.InferenceSession(str(path), options,
                                 providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    d = np.abs(fused.astype(np.int32) - onnxruntime_values(path, feeds)["y"].astype(np.int32))
    assert np.count_nonzero(d) > 0 and d.max() == 1


def _four_bit_mlp(rng, act, clamp):
    """x -> Q(act) -> DQ -> MatMul by DQ(int4 weights, per column) -> [clamp] -> Q(int4
    activation) -> DQ -> MatMul by DQ(int4 weights, per tensor) -> Q(act); the int4 activation
    also a graph output (as int8: onnxruntime's binding has no 4-bit arrays)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(act))
    w1, w2 = rng.integers(-8, 8, (24, 16)), rng.integers(-8, 8, (16, 8))
    four = TensorProto.INT4
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "sx": np.float32(0.02), "zx": act(3), "s1": _scales(rng, 16) * 4,
        "sh": np.float32(0.35), "s2": np.float32(0.03), "sy": np.float32(0.2),
        "zy": act(-2 if act is np.int8 else 120), "lo": np.float32(-1.1),
        "hi": np.float32(4.0)}.items()]   # (Clip's hi past the int4 range: 7 holds)
    inits += [helper.make_tensor("w1", four, w1.shape, w1.ravel().tolist()),
              helper.make_tensor("z1", four, [16], [0] * 16),
              helper.make_tensor("w2", four, w2.shape, w2.ravel().tolist()),
              helper.make_tensor("z2", four, [], [0]),
              helper.make_tensor("zh", four, [], [int(rng.integers(-2, 3))])]
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             n("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             n("DequantizeLinear", ["w1", "s1", "z1"], ["w1d"], axis=1),
             n("MatMul", ["xd", "w1d"], ["h"])]
    if clamp:
        nodes.append({"Relu": n("Relu", ["h"], ["hc"]),
                      "Clip": n("Clip", ["h", "lo", "hi"], ["hc"])}[clamp])
    nodes += [n("QuantizeLinear", ["hc" if clamp else "h", "sh", "zh"], ["hq"]),
              n("Cast", ["hq"], ["h8"], to=TensorProto.INT8),
              n("DequantizeLinear", ["hq", "sh", "zh"], ["hd"]),
              n("DequantizeLinear", ["w2", "s2", "z2"], ["w2d"]),
              n("MatMul", ["hd", "w2d"], ["y"]),
              n("QuantizeLinear", ["y", "sy", "zy"], ["yq"])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", 1, [5, 24])],
                              [helper.make_tensor_value_info("h8", TensorProto.INT8, None),
                               helper.make_tensor_value_info("yq", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("clamp", [None, "Relu", "Clip"])
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_int4_weights_and_activations_run_integer_dense_equal_to_onnxruntime(tmp_path, act,
                                                                            clamp):
    # int4 values are int8 ones: the dense products take the weights as int8 and saturate the
    # int4 activation to [-8, 7] as its clamp bounds (with the Relu's / Clip's)
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(404)
    model = _four_bit_mlp(rng, act, clamp)
    feeds = {"x": (rng.standard_normal((5, 24)) * 1.5).astype(np.float32)}
    g = import_onnx(model)
    fuse_quantized(g)
    dense = [nd for nd in g.nodes if nd.op == "QuantizedDense"]
    assert len(dense) == 2 and "MatMul" not in [nd.op for nd in g.nodes]
    assert -8 <= dense[0].attrs["lo"] < dense[0].attrs["hi"] == 7
    got = run_graph(g, [feeds["x"]])
    # onnxruntime one op at a time: its optimizer drops a Relu before an int4 Q (its output
    # then below the zero point) and fails on a Clip before one (1.32)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    by_ort = onnxruntime_values(path, feeds)
    want = [by_ort["h8"], by_ort["yq"]]
    reference = ReferenceEvaluator(model).run(None, feeds)
    assert all(np.array_equal(w, r) for w, r in zip(want, reference))
    assert 7 in want[0] and got[0].dtype == np.int8   # (saturated to int4's range)
    for g_out, w_out in zip(got, want):
        np.testing.assert_array_equal(g_out, w_out)
    for g_out, w_out in zip(dnnc.compile(model, "llvm")(**feeds), want):
        np.testing.assert_array_equal(g_out, w_out)


@pytest.mark.parametrize("code,lo,hi", [(TensorProto.INT4, -8, 7), (TensorProto.UINT4, 0, 15)],
                         ids=["int4", "uint4"])
def test_blocked_four_bit_weights_of_a_float_matmul_fold_to_float32(code, lo, hi):
    # weight-only quantization (opset 21's blocks along k): no integer op takes a block's
    # scale out of a k sum, so the weights are dequantized once, at compile time
    from dnnc.ir.target import Target
    from dnnc.passes.manager import optimize

    rng = np.random.default_rng(21)
    k, n, block = 64, 24, 16
    w, z = rng.integers(lo, hi + 1, (k, n)), rng.integers(lo, hi + 1, (k // block, n))
    s = _scales(rng, (k // block, n)) * 4
    inits = [helper.make_tensor("w", code, [k, n], w.ravel().tolist()),
             numpy_helper.from_array(s, "s"),
             helper.make_tensor("z", code, list(z.shape), z.ravel().tolist())]
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"], axis=0,
                              block_size=block),
             helper.make_node("MatMul", ["x", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", 1, [5, k])],
                              [helper.make_tensor_value_info("y", 1, [5, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = rng.standard_normal((5, k)).astype(np.float32)
    assert [nd.op for nd in optimize(import_onnx(model), Target("llvm"), 3).nodes] == ["MatMul"]
    dequantized = ((w - z.repeat(block, 0)) * s.repeat(block, 0)).astype(np.float32)
    want = x.astype(np.float64) @ dequantized
    got = dnnc.compile(model, "llvm")(x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    # onnxruntime one op at a time agrees as closely; its optimizer's fused MatMulNBits
    # (activations quantized to int8) is ~0.4% of the largest output off (1.32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    by_ort = ort.InferenceSession(model.SerializeToString(), options,
                                  providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, by_ort, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("bits_in", [8, 4])
def test_a_move_into_an_int4_q_is_on_integers_only_from_values_within_its_range(tmp_path,
                                                                                bits_in):
    # DQ -> MaxPool -> Q(int4) of the same scale and zero point is MaxPool on the integers
    # where they are int4's (Q(DQ(v)) = v); from int8 values Q saturates: it stays float
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(49)
    four, z = TensorProto.INT4, int(rng.integers(-3, 4))
    zx = helper.make_tensor("zx", four if bits_in == 4 else TensorProto.INT8, [], [z])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "zx"], ["xd"]),
             helper.make_node("MaxPool", ["xd"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("QuantizeLinear", ["p", "s", "z4"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z4"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(0.1), "s"), zx,
             helper.make_tensor("z4", four, [], [z])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", 1, [1, 2, 6, 6])],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": (rng.standard_normal((1, 2, 6, 6)) * 2).astype(np.float32)}
    g = import_onnx(model)
    fuse_quantized(g)
    ops = [n.op for n in g.nodes]
    assert ops == (["QuantizeLinear", "MaxPool", "DequantizeLinear"] if bits_in == 4 else
                   ["QuantizeLinear", "DequantizeLinear", "MaxPool", "QuantizeLinear",
                    "DequantizeLinear"])
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    np.testing.assert_array_equal(onnxruntime_values(path, feeds)["y"], want)
    np.testing.assert_array_equal(run_graph(g, [feeds["x"]])[0], want)
    np.testing.assert_array_equal(dnnc.compile(model, "llvm")(**feeds), want)
    assert bits_in == 4 or np.abs(feeds["x"] / 0.1).max() > 9   # (int8 values past int4's)


@pytest.mark.parametrize("code", [TensorProto.INT4, TensorProto.UINT4], ids=["int4", "uint4"])
def test_a_dequantized_add_requantized_to_four_bits_is_a_quantized_add_of_its_range(tmp_path,
                                                                                  code):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(50)
    z = int(rng.integers(-3, 4)) + (8 if code == TensorProto.UINT4 else 0)
    nodes = [helper.make_node("QuantizeLinear", [x, "sx", "zx"], [f"{x}q"]) for x in "ab"]
    nodes += [helper.make_node("DequantizeLinear", [f"{x}q", "sx", "zx"], [f"{x}d"])
              for x in "ab"]
    nodes += [helper.make_node("Add", ["ad", "bd"], ["s"]),
              helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["sq"]),
              helper.make_node("DequantizeLinear", ["sq", "sy", "zy"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(0.05), "sx"),
             numpy_helper.from_array(np.int8(-4), "zx"),
             numpy_helper.from_array(np.float32(0.3), "sy"),
             helper.make_tensor("zy", code, [], [z])]
    vi = [helper.make_tensor_value_info(x, 1, [2, 3, 8]) for x in "ab"]
    graph = helper.make_graph(nodes, "q", vi, [helper.make_tensor_value_info("y", 1, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {x: (rng.standard_normal((2, 3, 8)) * 2).astype(np.float32) for x in "ab"}
    g = import_onnx(model)
    fuse_quantized(g)
    (add,) = [n for n in g.nodes if n.op == "QuantizedAdd"]
    assert add.attrs["bits"] == 4
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    np.testing.assert_array_equal(onnxruntime_values(path, feeds)["y"], want)
    np.testing.assert_array_equal(run_graph(g, [feeds["a"], feeds["b"]])[0], want)
    np.testing.assert_array_equal(dnnc.compile(model, "llvm")(**feeds), want)
    lo, hi = (-8, 7) if code == TensorProto.INT4 else (0, 15)
    assert {np.float32(0.3) * (lo - z), np.float32(0.3) * (hi - z)} <= set(want.ravel())
