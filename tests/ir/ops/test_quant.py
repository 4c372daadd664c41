"""Quantization ops against onnxruntime and hand-computed values."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.errors import ShapeError

ort = pytest.importorskip("onnxruntime")


def _model(op, inputs, initializers, out_type, attrs=None, opset=21):
    node = helper.make_node(op, [n for n, _ in inputs] + [t.name for t in initializers],
                            ["y"], **(attrs or {}))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs],
        [helper.make_tensor_value_info("y", out_type, None)], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run_both(model, feeds):
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    got = dnnc.compile(model, target="numpy").run(*feeds.values())
    return got, expected


@pytest.mark.parametrize("zp_dtype, scale_shape, axis", [
    (np.uint8, (), 1), (np.int8, (), 1), (np.uint8, (3,), 1), (np.int8, (4,), 2),
    (np.int16, (), 1)])
def test_quantize_dequantize_round_trip_matches_onnxruntime(zp_dtype, scale_shape, axis):
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 4)).astype(np.float32) * 4
    scale = (rng.random(scale_shape) * 0.05 + 0.01).astype(np.float32)
    info = np.iinfo(zp_dtype)
    zp = rng.integers(info.min // 4, info.max // 4, scale_shape).astype(zp_dtype)
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
    q_type = helper.np_dtype_to_tensor_dtype(np.dtype(zp_dtype))
    got, expected = _run_both(_model("QuantizeLinear", [("x", x)], inits, q_type,
                                     {"axis": axis}), {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[0].dtype == zp_dtype
    q = expected[0]
    got, expected = _run_both(_model("DequantizeLinear", [("x", q)], inits, TensorProto.FLOAT,
                                     {"axis": axis}), {"x": q})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)


def test_quantize_saturates_and_rounds_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, 1000.0, -1000.0], np.float32)
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    got = dnnc.compile(_model("QuantizeLinear", [("x", x)], inits, TensorProto.INT8),
                       target="numpy").run(x)[0]
    np.testing.assert_array_equal(got, np.array([0, 2, 2, 0, 127, -128], np.int8))


def test_dynamic_quantize_linear_matches_onnxruntime():
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 5)).astype(np.float32)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(n, t, None) for n, t in
         (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got, expected = _run_both(model, {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    np.testing.assert_array_equal(got[2], expected[2])


def test_qlinear_matmul_matches_onnxruntime():
    rng = np.random.default_rng()
    a = rng.integers(0, 255, (2, 3, 4), dtype=np.uint8)
    b = rng.integers(0, 255, (4, 5), dtype=np.uint8)
    params = [("as", np.float32(0.02)), ("az", np.uint8(110)), ("bs", np.float32(0.03)),
              ("bz", np.uint8(120)), ("ys", np.float32(0.5)), ("yz", np.uint8(100))]
    inits = {n: numpy_helper.from_array(np.array(v), n) for n, v in params}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape),
                      helper.make_tensor_value_info("b", TensorProto.UINT8, b.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=list(inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got, expected = _run_both(model, {"a": a, "b": b})
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[0].dtype == np.uint8


def test_mismatched_per_axis_scale_is_a_shape_error():
    x = np.zeros((2, 3), np.float32)
    inits = [numpy_helper.from_array(np.ones(5, np.float32), "s"),
             numpy_helper.from_array(np.zeros(5, np.uint8), "z")]
    with pytest.raises(ShapeError, match="QuantizeLinear"):
        dnnc.compile(_model("QuantizeLinear", [("x", x)], inits, TensorProto.UINT8),
                     target="numpy")


def test_qlinear_conv_matches_onnxruntime():
    rng = np.random.default_rng()
    x = rng.integers(0, 255, (1, 4, 7, 7), dtype=np.uint8)
    w = rng.integers(0, 255, (6, 4, 3, 3), dtype=np.uint8)
    bias = rng.integers(-500, 500, 6, dtype=np.int32)
    params = [("xs", np.float32(0.01)), ("xz", np.uint8(100)), ("w", w),
              ("ws", np.float32(0.005)), ("wz", np.uint8(128)), ("ys", np.float32(0.2)),
              ("yz", np.uint8(90)), ("b", bias)]
    inits = [numpy_helper.from_array(np.array(v), n) for n, v in params]
    node = helper.make_node("QLinearConv", ["x"] + [n for n, _ in params], ["y"],
                            pads=[1, 1, 1, 1], strides=[2, 2])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got, expected = _run_both(model, {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])
