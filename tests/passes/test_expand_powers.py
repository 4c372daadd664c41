"""expand_powers: float32 / float64 Pow(x, 2) and Pow(x, 3) become multiplies after the passes
that match Pow, giving x*x and (x*x)*x bit for bit (onnxruntime's Pow by 2 and 3, NaN, inf and
-0 included); every other Pow stays; the Gelu and LayerNorm patterns still match, and a
half-stored model's squares stay float32."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.target import Target
from dnnc.passes.expand_powers import expand_powers
from dnnc.passes.manager import optimize

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e20, -1e20, 3e-13]
"""Values where pow and a product could part: signed zeros, infinities, NaN, underflow and
overflow of the square and the cube."""


def _const(name, array) -> Value:
    array = np.asarray(array)
    return Value(name, T.TensorType(T.DType.from_numpy(array.dtype), array.shape), const=array)


def _pow_graph(exponent, dtype=T.float32, shape=(4, 64)) -> Graph:
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, shape))
    g.outputs = [g.add("Pow", x, _const("e", exponent), name="pow")]
    return g


def _inputs(rng, dtype, shape=(4, 64)):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x.flat[:len(SPECIAL)] = SPECIAL
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 3])
def test_a_square_and_a_cube_become_multiplies(n, dtype):
    g = _pow_graph(np.asarray(n, dtype), T.DType.from_numpy(np.dtype(dtype)))
    assert expand_powers(g) == 1
    g.verify()
    assert [(node.op, [v.name for v in node.inputs]) for node in g.nodes] == (
        [("Mul", ["x", "x"])] if n == 2 else [("Mul", ["x", "x"]), ("Mul", ["pow.square", "x"])])
    assert g.nodes[-1].outputs[0] is g.outputs[0]


@pytest.mark.parametrize("exponent", [
    np.float32(0.5), np.float32(4), np.float32(-1), np.float32(1), np.float32(2.0000002),
    np.array([2, 3] * 32, np.float32),             # not one exponent
    np.full((2, 4, 64), 2, np.float32),            # broadcasts x to another shape
])
def test_other_exponents_stay_pow(exponent):
    g = _pow_graph(exponent)
    assert expand_powers(g) == 0 and [n.op for n in g.nodes] == ["Pow"]


def test_half_integer_and_computed_exponents_stay_pow():
    for dtype in (T.float16, T.bfloat16, T.int32):
        g = _pow_graph(np.asarray(2, dtype.np), dtype)
        assert expand_powers(g) == 0
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (4, 8)))
    e = g.add_input("e", T.TensorType(T.float32, ()))
    g.outputs = [g.add("Pow", x, e)]
    assert expand_powers(g) == 0


def test_an_integer_exponent_of_a_float_base_is_expanded():
    g = _pow_graph(np.asarray([3], np.int64))
    assert expand_powers(g) == 1 and [n.op for n in g.nodes] == ["Mul", "Mul"]


def _pow_model(n: int, dtype=TensorProto.FLOAT) -> bytes:
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])], "pow",
        [helper.make_tensor_value_info("x", dtype, [4, 64])],
        [helper.make_tensor_value_info("y", dtype, [4, 64])],
        [numpy_helper.from_array(np.asarray(n, np_type), "e")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("n", [2, 3])
def test_compiled_powers_equal_the_products_and_onnxruntime_bit_for_bit(rng, n, dtype):
    """The llvm target gives x*x and (x*x)*x exactly, as onnxruntime's Pow by 2 and 3 does
    (a correctly rounded pow differs from (x*x)*x in the last place on about a third of
    random inputs, so the cube fails where Pow compiles to a pow call)."""
    ort = pytest.importorskip("onnxruntime")
    model = _pow_model(n, dtype)
    x = _inputs(rng, helper.tensor_dtype_to_np_dtype(dtype))
    with np.errstate(over="ignore", under="ignore"):
        product = x * x if n == 2 else (x * x) * x
    (got,) = dnnc.compile(model, target="llvm", progress=False).run(x)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(theirs.view(np.uint8), product.view(np.uint8))
    np.testing.assert_array_equal(got.view(np.uint8), product.view(np.uint8))


def _tanh_gelu(g: Graph, x: Value) -> Value:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 Pow(x, 3)))), as HF's gpt2 writes it."""
    f = lambda name, v: _const(name, np.float32(v))   # noqa: E731
    cube = g.add("Pow", x, f("three", 3.0))
    inner = g.add("Add", x, g.add("Mul", cube, f("c", 0.044715)))
    t = g.add("Tanh", g.add("Mul", inner, f("s", np.sqrt(2 / np.pi))))
    return g.add("Mul", g.add("Mul", x, f("half", 0.5)), g.add("Add", t, f("one", 1.0)))


def test_the_pipeline_still_recognises_a_gelu_and_expands_a_lone_cube():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (4, 64)))
    g.outputs = [_tanh_gelu(g, x), g.add("Pow", x, _const("three", np.float32(3)), name="c")]
    ops = [n.op for n in optimize(g, Target("llvm"), 3).nodes]
    assert sorted(ops) == ["Gelu", "Mul", "Mul"]


def test_a_half_stored_square_is_multiplied_in_float32():
    """store_half keeps Pow in float32 (x**2 leaves float16's range for |x| > 256); the
    multiplies that replace it after it read and write the same float32 values."""
    g = _pow_graph(np.float32(2))
    g.outputs = [g.add("Relu", g.outputs[0])]
    out = optimize(g, Target("cuda", arch="sm_90", precision="fp16", half_storage=True), 3)
    mul = next(n for n in out.nodes if n.op == "Mul")
    assert not any(n.op == "Pow" for n in out.nodes)
    assert mul.inputs[0].type.dtype is T.float32 and mul.outputs[0].type.dtype is T.float32
