"""Linear algebra ops: references against onnxruntime single-node models, shape inference with
symbolic dims, and the errors bad shapes raise."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph

ort = pytest.importorskip("onnxruntime")

_ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
              np.int32: TensorProto.INT32, np.int64: TensorProto.INT64,
              np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def _single_node(op, arrays, attrs, out_type, opset=21):
    names = [f"in{i}" for i in range(len(arrays))]
    node = helper.make_node(op, names, ["out"], **attrs)
    inputs = [helper.make_tensor_value_info(n, _ONNX_TYPE[a.dtype.type], a.shape)
              for n, a in zip(names, arrays)]
    output = helper.make_tensor_value_info("out", out_type, None)
    graph = helper.make_graph([node], "g", inputs, [output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check_against_ort(op, arrays, attrs=None, out_type=TensorProto.FLOAT, rtol=1e-5):
    model = _single_node(op, arrays, attrs or {}, out_type)
    feeds = {f"in{i}": a for i, a in enumerate(arrays)}
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = dnnc.compile(model, target="numpy").run(*arrays)[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-5)


def _rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
    ((2, 1, 3, 4), (5, 4, 6)), ((1, 3, 4), (2, 4, 2))])
def test_matmul_matches_onnxruntime(a_shape, b_shape):
    rng = np.random.default_rng()
    _check_against_ort("MatMul", [_rand(rng, *a_shape), _rand(rng, *b_shape)])


@pytest.mark.parametrize("trans_a, trans_b, alpha, beta, c_shape", [
    (0, 0, 1.0, 1.0, None), (1, 0, 0.5, 2.0, (5,)), (0, 1, 1.0, 0.3, (3, 1)),
    (1, 1, 2.0, 1.0, (3, 5)), (0, 0, 1.0, 1.0, ())])
def test_gemm_matches_onnxruntime(trans_a, trans_b, alpha, beta, c_shape):
    rng = np.random.default_rng()
    a = _rand(rng, *((4, 3) if trans_a else (3, 4)))
    b = _rand(rng, *((5, 4) if trans_b else (4, 5)))
    arrays = [a, b] + ([] if c_shape is None else [_rand(rng, *c_shape)])
    _check_against_ort("Gemm", arrays, dict(transA=trans_a, transB=trans_b, alpha=alpha,
                                            beta=beta))


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]), ("...ii->...i", [(2, 3, 3)]), ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]), ("ji", [(3, 4)]), ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)])])
def test_einsum_matches_onnxruntime(equation, shapes):
    rng = np.random.default_rng()
    _check_against_ort("Einsum", [_rand(rng, *s) for s in shapes], dict(equation=equation))


def test_matmul_integer_with_zero_points():
    rng = np.random.default_rng()
    a = rng.integers(0, 255, (3, 4), dtype=np.uint8)
    b = rng.integers(0, 255, (4, 5), dtype=np.uint8)
    zp_a, zp_b = np.array(12, np.uint8), np.array(200, np.uint8)
    _check_against_ort("MatMulInteger", [a, b, zp_a, zp_b], out_type=TensorProto.INT32)
    expected = (a.astype(np.int64) - 12) @ (b.astype(np.int64) - 200)
    got = dnnc.compile(_single_node("MatMulInteger", [a, b, zp_a, zp_b], {},
                                    TensorProto.INT32), target="numpy").run(a, b, zp_a, zp_b)[0]
    np.testing.assert_array_equal(got, expected)


def test_det_matches_numpy_in_float64():
    rng = np.random.default_rng()
    x = _rand(rng, 2, 3, 3)
    g = Graph("g")
    v = g.add_input("x", T.TensorType(T.float32, (2, 3, 3)))
    g.outputs = [g.add("Det", v)]
    got = dnnc.compile(g, target="numpy").run(x)[0]
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=1e-5)


def _infer(op, shapes, dtype=T.float32, **attrs):
    g = Graph("g")
    values = [g.add_input(f"x{i}", T.TensorType(dtype, s)) for i, s in enumerate(shapes)]
    return g.add(op, *values, **attrs).type.shape


def test_symbolic_dims_are_kept():
    assert _infer("MatMul", [("N", "S", 8), (8, 16)]) == ("N", "S", 16)
    assert _infer("MatMul", [("N", 1, "S", 8), ("H", 8, "S")]) == ("N", "H", "S", "S")
    assert _infer("Gemm", [("N", 8), (16, 8)], transB=1) == ("N", 16)
    assert _infer("Einsum", [("B", 3, 4), ("B", 4, "K")], equation="bij,bjk->bik") == \
        ("B", 3, "K")


@pytest.mark.parametrize("op, shapes, attrs", [
    ("MatMul", [(3, 4), (5, 6)], {}),
    ("Gemm", [(3, 4), (4, 5, 1)], {}),
    ("Gemm", [(3, 4), (4, 5), (4, 5)], {}),
    ("Einsum", [(3, 4)], {"equation": "ijk->i"}),
    ("Det", [(3,)], {}),
])
def test_bad_shapes_raise_shape_error_naming_the_op(op, shapes, attrs):
    with pytest.raises(ShapeError, match=op):
        _infer(op, shapes, **attrs)
