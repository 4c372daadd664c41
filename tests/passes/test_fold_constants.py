"""fold_constants: what it folds (static shape arithmetic) and what it must leave alone."""

import numpy as np

import dnnc
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.fold_constants import fold_constants


def _shape_chain(batch):
    """x.reshape(x.shape[0], -1) written as exporters write it."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (batch, 3, 4)))
    shape = g.add("Shape", x)
    first = g.add("Gather", shape, Value("zero", T.TensorType(T.int64, ()),
                                         const=np.array(0, np.int64)), axis=0)
    dims = g.add("Unsqueeze", first, Value("ax", T.TensorType(T.int64, (1,)),
                                           const=np.array([0], np.int64)))
    target = g.add("Concat", dims, Value("m1", T.TensorType(T.int64, (1,)),
                                         const=np.array([-1], np.int64)), axis=0)
    g.outputs = [g.add("Reshape", x, target)]
    return g


def test_static_shape_arithmetic_disappears(rng):
    g = _shape_chain(2)
    assert fold_constants(g) == 4
    assert [n.op for n in g.nodes] == ["Reshape"]
    np.testing.assert_array_equal(g.nodes[0].inputs[1].const, [2, -1])
    g.verify()
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(dnnc.compile(g, target="numpy").run(x)[0], x.reshape(2, 12))


def test_symbolic_shape_arithmetic_stays():
    g = _shape_chain("N")
    assert fold_constants(g) == 0
    assert len(g.nodes) == 5


def test_random_ops_and_large_materialisations_are_left_alone():
    g = Graph("g")
    shape = Value("s", T.TensorType(T.int64, (2,)), const=np.array([1024, 1024], np.int64))
    big = g.add("ConstantOfShape", shape)                     # 4 MiB from 16 bytes
    small = g.add("ConstantOfShape", Value("s2", T.TensorType(T.int64, (1,)),
                                           const=np.array([4], np.int64)))
    g.outputs = [big, small]
    assert fold_constants(g) == 1
    assert [n.op for n in g.nodes] == ["ConstantOfShape"]
    assert g.outputs[1].const is not None and g.outputs[1].const.shape == (4,)


def test_scalar_results_stay_scalars():
    g = Graph("g")
    a = Value("a", T.TensorType(T.float32, ()), const=np.array(2.0, np.float32))
    g.outputs = [g.add("Mul", a, a)]
    fold_constants(g)
    assert g.outputs[0].const.shape == () and float(g.outputs[0].const) == 4.0


def test_specialize_binds_shapes_and_parameter_inputs():
    from dnnc.passes.specialize import param_inputs, specialize

    g = _shape_chain("N")
    assert param_inputs(g) == []
    s = specialize(g, [(5, 3, 4)])
    assert [n.op for n in s.nodes] == ["Reshape"] and s.outputs[0].type.shape == (5, 12)
    assert g.outputs[0].type.shape == ("N", 12)          # the original is untouched

    h = Graph("h")
    x = h.add_input("x", T.TensorType(T.float32, ("N", 6)))
    axes = h.add_input("axes", T.TensorType(T.int64, (1,)))
    h.outputs = [h.add("ReduceSum", x, axes, keepdims=0)]
    assert param_inputs(h) == [1]
    hs = specialize(h, [(2, 6), (1,)], {1: np.array([1])})
    assert hs.nodes[0].inputs[1].const is not None and hs.outputs[0].type.shape == (2,)


def _i64(name, values):
    return Value(name, T.TensorType(T.int64, (len(values),)), const=np.array(values, np.int64))


def _f32(name, array):
    array = np.asarray(array, np.float32)
    return Value(name, T.TensorType(T.float32, array.shape), const=array)


def _weights_of_constant_of_shape(rng):
    """A conv whose 1.6 MB filter is ConstantOfShape(...) * a random per-channel scale and
    whose bias is a ConstantOfShape, then a Gemm whose B is Transpose(ConstantOfShape) (as
    onnx's light models build their weights, the product giving each channel its own
    values)."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 64, 9, 9)))
    fill = float(rng.uniform(0.5, 1.5))
    ones = g.add("ConstantOfShape", _i64("ws", [256, 64, 5, 5]),
                 value=np.array([fill], np.float32))
    w = g.add("Mul", ones, _f32("scale", rng.standard_normal((256, 1, 1, 1))))
    b = g.add("ConstantOfShape", _i64("bs", [256]), value=np.array([0.25], np.float32))
    y = g.add("Relu", g.add("Conv", x, w, b, pads=[2, 2, 2, 2], group=1))
    flat = g.add("Reshape", y, _i64("flat", [1, 256 * 81]))
    bt = g.add("Transpose", g.add("ConstantOfShape", _i64("bts", [256 * 81, 16]),
                                  value=np.array([0.01], np.float32)), perm=[1, 0])
    g.outputs = [g.add("Gemm", flat, bt, _f32("c", rng.standard_normal(16)), transB=1)]
    return g


def test_weights_fold_whatever_their_size(rng):
    g = _weights_of_constant_of_shape(rng)
    assert fold_constants(g) == 5   # 3 ConstantOfShape, the Mul and the Transpose
    assert [n.op for n in g.nodes] == ["Conv", "Relu", "Reshape", "Gemm"]
    assert g.nodes[0].inputs[1].const.shape == (256, 64, 5, 5)
    g.verify()


def test_weights_of_constant_of_shape_reach_the_packed_templates(rng):
    """Compiled for llvm, the conv and the Gemm read packed constant weights (ConvPacked,
    MatMulPacked, no ConstantOfShape left) and the result is the reference's."""
    g = _weights_of_constant_of_shape(rng)
    x = rng.standard_normal((1, 64, 9, 9)).astype(np.float32)
    want = dnnc.compile(g, target="numpy").run(x)[0]
    compiled = dnnc.compile(g, target="llvm")
    ops = [n.op for n in compiled.graph.nodes]
    assert "ConvPacked" in ops and "MatMulPacked" in ops and "ConstantOfShape" not in ops
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)


def test_a_large_constant_read_as_data_stays_a_node():
    """The same ConstantOfShape read as a weight and as data is no weight: not folded."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (512, 1024)))
    big = g.add("ConstantOfShape", _i64("s", [1024, 1024]), value=np.array([1], np.float32))
    g.outputs = [g.add("MatMul", x, big), g.add("Add", big, big)]
    assert fold_constants(g) == 0
