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
def test_matmul_matches_onnxruntime(rng, a_shape, b_shape):
    _check_against_ort("MatMul", [_rand(rng, *a_shape), _rand(rng, *b_shape)])


@pytest.mark.parametrize("trans_a, trans_b, alpha, beta, c_shape", [
    (0, 0, 1.0, 1.0, None), (1, 0, 0.5, 2.0, (5,)), (0, 1, 1.0, 0.3, (3, 1)),
    (1, 1, 2.0, 1.0, (3, 5)), (0, 0, 1.0, 1.0, ())])
def test_gemm_matches_onnxruntime(rng, trans_a, trans_b, alpha, beta, c_shape):
    a = _rand(rng, *((4, 3) if trans_a else (3, 4)))
    b = _rand(rng, *((5, 4) if trans_b else (4, 5)))
    arrays = [a, b] + ([] if c_shape is None else [_rand(rng, *c_shape)])
    _check_against_ort("Gemm", arrays, dict(transA=trans_a, transB=trans_b, alpha=alpha,
                                            beta=beta))


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]), ("...ii->...i", [(2, 3, 3)]), ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]), ("ji", [(3, 4)]), ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)])])
def test_einsum_matches_onnxruntime(rng, equation, shapes):
    _check_against_ort("Einsum", [_rand(rng, *s) for s in shapes], dict(equation=equation))


def test_matmul_integer_with_zero_points(rng):
    a = rng.integers(0, 255, (3, 4), dtype=np.uint8)
    b = rng.integers(0, 255, (4, 5), dtype=np.uint8)
    zp_a, zp_b = np.array(12, np.uint8), np.array(200, np.uint8)
    _check_against_ort("MatMulInteger", [a, b, zp_a, zp_b], out_type=TensorProto.INT32)
    expected = (a.astype(np.int64) - 12) @ (b.astype(np.int64) - 200)
    got = dnnc.compile(_single_node("MatMulInteger", [a, b, zp_a, zp_b], {},
                                    TensorProto.INT32), target="numpy").run(a, b, zp_a, zp_b)[0]
    np.testing.assert_array_equal(got, expected)


def test_det_matches_numpy_in_float64(rng):
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


# -- compute rules ------------------------------------------------------------------------------
# Each rule, interpreted by NumPy over its loop IR, against the op's reference on fresh inputs.

from dnnc.ir.compute import NoCompute, apply_rule, evaluate, placeholder, run_rule  # noqa: E402
from dnnc.ir.graph import Value  # noqa: E402
from dnnc.ir.ops.registry import get_op, infer_node  # noqa: E402


def _check_rule(op, arrays, attrs=None, tol=1e-5, dims=None):
    """Rule against reference; `dims` ({input: {axis: name}}) makes those input axes
    symbolic, their sizes bound only when the rule's tensors are evaluated."""
    attrs = dict(attrs or {})
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})
    if dims is None:
        got = run_rule(op, arrays, attrs)
    else:
        values = [Value(f"in{k}", T.TensorType(T.DType.from_numpy(a.dtype), tuple(
            dims.get(k, {}).get(ax, n) for ax, n in enumerate(a.shape))))
            for k, a in enumerate(arrays)]
        types, _, full = infer_node(op, values, attrs, 1, op)
        tensors = [placeholder(v.name, v.type.dtype, v.type.shape) for v in values]
        sizes = {name: arrays[k].shape[ax] for k, m in dims.items() for ax, name in m.items()}
        got = evaluate(apply_rule(op, tensors, full, types),
                       {f"in{k}": a for k, a in enumerate(arrays)}, sizes)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 6)),
    ((2, 3, 4), (4, 6)), ((3, 4), (2, 4, 6))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_matmul_rule(rng, a_shape, b_shape, dtype):
    arrays = [rng.integers(-9, 9, s).astype(dtype) if dtype == np.int32 else
              _rand(rng, *s, dtype=dtype) for s in (a_shape, b_shape)]
    _check_rule("MatMul", arrays, tol=2e-3 if dtype == np.float16 else 1e-5)


def test_matmul_rule_with_symbolic_batch(rng):
    _check_rule("MatMul", [_rand(rng, 2, 3, 4), _rand(rng, 4, 5)], dims={0: {0: "N", 1: "S"}})


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (3, 1), (3, 5)])
def test_gemm_rule(rng, trans_a, trans_b, c_shape):
    arrays = [_rand(rng, *((4, 3) if trans_a else (3, 4))),
              _rand(rng, *((5, 4) if trans_b else (4, 5)))]
    if c_shape is not None:
        arrays.append(_rand(rng, *c_shape))
    _check_rule("Gemm", arrays, dict(transA=trans_a, transB=trans_b, alpha=0.7, beta=1.3))


@pytest.mark.parametrize("dtype, alpha, beta", [(np.float16, 1.0, 1.0), (np.float16, 0.5, 2.0),
                                                (np.int32, 1.0, 1.0), (np.int32, 0.5, 2.5),
                                                (np.int64, 1.0, 3.0)])
def test_gemm_rule_dtypes_and_scaling(rng, dtype, alpha, beta):
    if dtype == np.float16:
        arrays = [_rand(rng, 3, 8, dtype=dtype), _rand(rng, 8, 5, dtype=dtype),
                  _rand(rng, 5, dtype=dtype)]
    else:
        arrays = [rng.integers(-9, 9, s).astype(dtype) for s in ((3, 8), (8, 5), (5,))]
    _check_rule("Gemm", arrays, dict(alpha=alpha, beta=beta), tol=2e-3)


def test_gemm_rule_with_symbolic_rows(rng):
    _check_rule("Gemm", [_rand(rng, 3, 4), _rand(rng, 5, 4), _rand(rng, 5)], dict(transB=1),
                dims={0: {0: "N"}})


@pytest.mark.parametrize("a_shape, b_shape, a_zp, b_zp", [
    ((3, 4), (4, 5), (), (5,)), ((2, 3, 4), (4, 5), (3,), (1,)), ((4,), (4, 5), None, None),
    ((3, 4), (4, 5), (1,), None)])
def test_matmul_integer_rule(rng, a_shape, b_shape, a_zp, b_zp):
    u8 = lambda s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    i8 = lambda s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    arrays = [u8(a_shape), i8(b_shape)]
    if a_zp is not None or b_zp is not None:
        arrays += [u8(a_zp or ()), i8(b_zp or ())]
    _check_rule("MatMulInteger", arrays, tol=0)


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("iij,jk->ik", [(3, 3, 4), (4, 2)]),
    ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk", [(2, 3, 4), (1, 4, 5)]), ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)])])
def test_einsum_rule(rng, equation, shapes):
    _check_rule("Einsum", [_rand(rng, *s) for s in shapes], dict(equation=equation))


def test_einsum_rule_half_and_symbolic_batch(rng):
    arrays = [_rand(rng, 2, 3, 4, dtype=np.float16), _rand(rng, 2, 4, 5, dtype=np.float16)]
    _check_rule("Einsum", arrays, dict(equation="bij,bjk->bik"), tol=2e-3)
    _check_rule("Einsum", [a.astype(np.float32) for a in arrays],
                dict(equation="bij,bjk->bik"), dims={0: {0: "B"}, 1: {0: "B"}})


def test_det_has_no_compute_rule():
    with pytest.raises(NoCompute):
        run_rule("Det", [np.eye(3, dtype=np.float32)])
