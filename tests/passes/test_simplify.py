"""simplify: each rule on a small graph — what it changes, what it must leave alone — and the
meaning kept (numpy target before and after)."""

import numpy as np
import pytest

import dnnc
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.simplify import simplify


def _const(name, array):
    """A float32 constant (or float16 / bfloat16 when `array` is one already)."""
    array = np.asarray(array)
    if array.dtype not in (np.float16, T.bfloat16.np):
        array = array.astype(np.float32)
    return Value(name, T.TensorType(T.DType.from_numpy(array.dtype), array.shape), const=array)


def _conv_bn(rng, const_stats=True, extra_use=False, bias=True, dtype=T.float32):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, (1, 3, 6, 6)))
    w = _const("w", rng.standard_normal((4, 3, 3, 3)).astype(dtype.np))
    args = [x, w] + ([_const("b", rng.standard_normal(4).astype(dtype.np))] if bias else [])
    y = g.add("Conv", *args, pads=[1, 1, 1, 1], name="conv")
    stats = [_const(n, rng.standard_normal(4).astype(dtype.np)) for n in ("scale", "bias",
                                                                            "mean")]
    var = _const("var", (rng.random(4) + 0.5).astype(dtype.np))
    if not const_stats:
        stats[0] = g.add_input("scale", T.TensorType(T.float32, (4,)))
    z = g.add("BatchNormalization", y, *stats, var, epsilon=1e-3, name="bn")
    g.outputs = [z] + ([y] if extra_use else [])
    return g


def _run(g, feeds):
    return dnnc.compile(g, target="numpy").run(*feeds)


def test_batch_norm_folds_into_the_conv_before_it(rng):
    for bias in (True, False):
        g = _conv_bn(rng, bias=bias)
        x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
        before = _run(g, [x])
        assert simplify(g) == 1
        g.verify()
        assert [n.op for n in g.nodes] == ["Conv"]
        np.testing.assert_allclose(_run(g, [x])[0], before[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [T.float16, T.bfloat16])
def test_batch_norm_folds_into_a_half_conv(rng, dtype):
    """A half model's BN (onnxconverter_common.float16's resnet) folds too: the weights
    scaled in float64 and rounded once to their type; the result within two units of the
    type's last place of the unfolded graph's (each rounds differently once or twice)."""
    g = _conv_bn(rng, dtype=dtype)
    x = rng.standard_normal((1, 3, 6, 6)).astype(dtype.np)
    (before,) = _run(g, [x])
    assert simplify(g) == 1
    g.verify()
    assert [n.op for n in g.nodes] == ["Conv"] and g.nodes[0].inputs[1].dtype is dtype
    (after,) = _run(g, [x])
    unit = 2.0 ** -11 if dtype is T.float16 else 2.0 ** -8
    scale = np.abs(before.astype(np.float64)).max()
    np.testing.assert_allclose(after.astype(np.float64), before.astype(np.float64), rtol=0,
                               atol=16 * unit * scale)


def test_batch_norm_stays_when_its_statistics_are_inputs(rng):
    assert simplify(_conv_bn(rng, const_stats=False)) == 0


def test_batch_norm_that_cannot_fold_becomes_per_channel_elementwise_ops(rng):
    """The conv's output read too (no fold into it): the BN becomes (x - mean) * inv_std *
    scale + bias, constants of shape (C, 1, 1), elementwise ops that fuse with their
    neighbours; both outputs the same bits as the op's own (numpy and llvm). A half BN
    stays."""
    g = _conv_bn(rng, extra_use=True)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    before = {t: dnnc.compile(g, target=t, opt_level=0).run(x) for t in ("numpy", "llvm")}
    assert simplify(g) == 1
    g.verify()
    assert [n.op for n in g.nodes] == ["Conv", "Sub", "Mul", "Mul", "Add"]
    assert {n.inputs[1].type.shape for n in g.nodes[1:]} == {(4, 1, 1)}
    for target, want in before.items():
        for got, expected in zip(dnnc.compile(g, target=target, opt_level=0).run(x), want):
            np.testing.assert_array_equal(got, expected)
    assert simplify(_conv_bn(rng, extra_use=True, dtype=T.float16)) == 0


def test_a_batch_norm_after_a_concat_fuses_with_the_relu_after_it(rng):
    """DenseNet's pre-activation (Concat -> BatchNormalization -> Relu -> 1x1 Conv): one
    elementwise kernel on llvm for the BN and the Relu (the opaque BN was a kernel of its
    own), outputs as the reference's."""
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (1, 4, 5, 5)))
    b = g.add_input("b", T.TensorType(T.float32, (1, 3, 5, 5)))
    cat = g.add("Concat", a, b, axis=1)
    stats = [_const(n, rng.standard_normal(7)) for n in ("scale", "bias", "mean")]
    bn = g.add("BatchNormalization", cat, *stats, _const("var", rng.random(7) + 0.5))
    g.outputs = [g.add("Conv", g.add("Relu", bn), _const("w", rng.standard_normal((2, 7, 1, 1))))]
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]
    want = _run(g, feeds)[0]
    compiled = dnnc.compile(g, target="llvm")
    np.testing.assert_allclose(compiled.run(*feeds)[0], want, rtol=1e-4, atol=1e-4)
    assert compiled.stats["kernels"] == 2    # Concat, BN and Relu one kernel; the conv


def test_identity_and_inference_dropout_disappear():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3)))
    a = g.add("Identity", x)
    b = g.add("Relu", a)
    c = g.add("Dropout", b)
    g.outputs = [g.add("Exp", c)]
    assert simplify(g) == 2
    assert [n.op for n in g.nodes] == ["Relu", "Exp"]
    assert g.nodes[0].inputs[0] is x


def _dropout_with_mask(shape, mask_read: bool, mode=None):
    """x -> Relu -> Dropout (output and mask) -> Exp, the mask a graph output (through Not)
    when `mask_read`."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    b = g.add("Relu", x)
    extra = [None, Value("mode", T.TensorType(T.bool_, ()), const=np.array(mode))] \
        if mode is not None else []
    y, mask = g.add_node("Dropout", [b] + extra, num_outputs=2)
    g.outputs = [g.add("Exp", y)] + ([g.add("Not", mask)] if mask_read else [])
    return g


def test_inference_dropout_with_an_unread_mask_disappears(rng):
    for mode in (None, False):
        g = _dropout_with_mask((2, 3), mask_read=False, mode=mode)
        x = rng.standard_normal((2, 3)).astype(np.float32)
        before = _run(g, [x])
        assert simplify(g) == 1
        g.verify()
        assert [n.op for n in g.nodes] == ["Relu", "Exp"]
        np.testing.assert_array_equal(_run(g, [x])[0], before[0])


def test_inference_dropout_with_a_read_mask_becomes_an_all_true_constant(rng):
    for shape, ops in (((2, 3), ["Relu", "ConstantOfShape", "Exp", "Not"]),
                       (("n", 3), ["Relu", "Shape", "ConstantOfShape", "Exp", "Not"])):
        g = _dropout_with_mask(shape, mask_read=True)
        assert simplify(g) == 1
        g.verify()
        assert [n.op for n in g.nodes] == ops
        x = rng.standard_normal((4, 3)).astype(np.float32)
        if shape == (2, 3):
            x = x[:2]
        y, not_mask = _run(g, [x])
        np.testing.assert_allclose(y, np.exp(np.maximum(x, 0)), rtol=1e-6)
        assert not_mask.dtype == np.bool_ and not_mask.shape == x.shape and not not_mask.any()


def test_inference_dropout_of_an_input_to_an_output_stays_a_copy():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3)))
    y, mask = g.add_node("Dropout", [x], num_outputs=2)
    g.outputs = [y]
    assert simplify(g) == 1
    assert [n.op for n in g.nodes] == ["Identity"] and g.outputs == [y]


def test_inference_dropout_on_llvm_leaves_no_dropout(rng):
    g = _dropout_with_mask((8, 16), mask_read=False)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    compiled = dnnc.compile(g, target="llvm")
    assert "Dropout" not in str(compiled.graph)
    np.testing.assert_allclose(compiled.run(x)[0], np.exp(np.maximum(x, 0)), rtol=1e-6)


def test_training_dropout_and_an_identity_output_stay():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3)))
    ratio = Value("r", T.TensorType(T.float32, ()), const=np.array(0.5, np.float32))
    mode = g.add_input("training", T.TensorType(T.bool_, ()))
    d = g.add("Dropout", x, ratio, mode, seed=0)
    g.outputs = [d, g.add("Identity", x)]
    assert simplify(g) == 0


# -- helpers for the rules below ------------------------------------------------------------


def _c(name, array, dtype=np.float32):
    array = np.asarray(array, dtype)
    return Value(name, T.TensorType(T.DType.from_numpy(array.dtype), array.shape), const=array)


def _input(g, name, shape):
    return g.add_input(name, T.TensorType(T.float32, shape))


def _feeds(g, rng):
    return [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]


def _ops(g):
    return [n.op for n in g.nodes]


def _rewrites_and_keeps_meaning(rng, g, expected_ops, rtol=1e-5, atol=1e-6, opt_levels=(3,)):
    """simplify `g`; its ops become `expected_ops`, it verifies, and numpy and llvm compile
    it (at `opt_levels`) to the values the graph as built (opt level 0) computes."""
    feeds = _feeds(g, rng)
    before = dnnc.compile(g, target="numpy", opt_level=0).run(*feeds)
    for got, want in zip(dnnc.compile(g, target="llvm", opt_level=0).run(*feeds), before):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert simplify(g) >= 1
    g.verify()
    assert _ops(g) == expected_ops
    for target in ("numpy", "llvm"):
        for level in opt_levels:
            after = dnnc.compile(g, target=target, opt_level=level).run(*feeds)
            for got, want in zip(after, before):
                np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return g


def _kept(g):
    """simplify leaves `g` as it is (the same ops, reading the same values)."""
    text = str(g)
    assert simplify(g) == 0
    assert str(g) == text


# -- BatchNormalization into the dense op before it ----------------------------------------------


def _dense_bn(rng, op="MatMul", a_shape=(5, 6), const_b=True, const_stats=True,
              extra_use=False, **attrs):
    g = Graph("g")
    a = _input(g, "a", a_shape)
    b_shape = (4, 6) if attrs.get("transB") else (6, 4)
    b = _c("w", rng.standard_normal(b_shape)) if const_b else _input(g, "w", b_shape)
    args = [a, b] + ([_c("cb", rng.standard_normal(attrs.pop("c_shape")))]
                     if "c_shape" in attrs else [])
    y = g.add(op, *args, name="dense", **attrs)
    stats = [_c(n, rng.standard_normal(4)) for n in ("scale", "bias", "mean")]
    if not const_stats:
        stats[2] = _input(g, "mean", (4,))
    channels = y.type.shape[1]
    if channels != 4:   # a 3-D product normalised over its axis 1
        stats = [_c(n, rng.standard_normal(channels)) for n in ("scale", "bias", "mean")]
    var = _c("var", rng.random(channels) + 0.5)
    z = g.add("BatchNormalization", y, *stats, var, epsilon=1e-3, name="bn")
    g.outputs = [z] + ([y] if extra_use else [])
    return g


@pytest.mark.parametrize("op, attrs", [
    ("MatMul", {}), ("Gemm", {}), ("Gemm", {"c_shape": (4,), "alpha": 0.5, "beta": 2.0}),
    ("Gemm", {"c_shape": (5, 4), "transB": 1, "beta": -1.5}),
    ("Gemm", {"c_shape": (1,), "transB": 1})])
def test_batch_norm_folds_into_the_dense_op_before_it(rng, op, attrs):
    g = _dense_bn(rng, op, **attrs)
    g = _rewrites_and_keeps_meaning(rng, g, ["Gemm"])
    assert g.nodes[0].attrs["beta"] == 1.0 and g.nodes[0].inputs[1].const is not None


def test_batch_norm_after_a_dense_op_it_cannot_fold_into_is_a_mul_and_add(rng):
    """No fold into the product: weights an input, the product read too, a 3-D product
    (channel axis 1 is not N); the BN is then (x - mean) * inv_std * scale + bias; with
    statistics an input it stays."""
    _kept(_dense_bn(rng, const_stats=False))
    for g in (_dense_bn(rng, const_b=False), _dense_bn(rng, extra_use=True),
              _dense_bn(rng, a_shape=(2, 5, 6))):
        _rewrites_and_keeps_meaning(rng, g, ["MatMul", "Sub", "Mul", "Mul", "Add"])


# -- values passed through unchanged ---------------------------------------------------------


@pytest.mark.parametrize("op, const_first, value", [
    ("Mul", False, 1.0), ("Mul", True, 1.0), ("Add", False, 0.0), ("Add", True, 0.0),
    ("Sub", False, 0.0), ("Div", False, 1.0)])
def test_neutral_constants_disappear(rng, op, const_first, value):
    for shape in ((), (1,), (3,), (2, 3)):      # every shape broadcasting keeps x's
        g = Graph("g")
        x = _input(g, "x", (2, 3))
        c = _c("c", np.full(shape, value))
        y = g.add(op, *((c, x) if const_first else (x, c)))
        g.outputs = [g.add("Exp", y)]
        _rewrites_and_keeps_meaning(rng, g, ["Exp"])
        assert g.nodes[0].inputs[0] is x


@pytest.mark.parametrize("op, const_first, value, shape", [
    ("Sub", True, 0.0, ()),          # 0 - x is -x
    ("Div", True, 1.0, ()),          # 1 / x is a reciprocal
    ("Mul", False, 1.0, (4, 2, 3)),  # broadcasting makes x bigger
    ("Add", False, 0.0, (4, 1, 1)),
    ("Mul", False, 0.0, ()),         # not the neutral element
    ("Add", False, 1.0, ()),
    ("Mul", False, 1.0000001, ())])
def test_constants_that_change_x_stay(op, const_first, value, shape):
    g = Graph("g")
    x = _input(g, "x", (2, 3))
    c = _c("c", np.full(shape, value))
    g.outputs = [g.add("Exp", g.add(op, *((c, x) if const_first else (x, c))))]
    _kept(g)


def test_a_neutral_constant_that_is_not_all_ones_stays():
    g = Graph("g")
    x = _input(g, "x", (2, 3))
    g.outputs = [g.add("Exp", g.add("Mul", x, _c("c", [1.0, 1.0, 2.0])))]
    _kept(g)


def test_neutral_op_between_an_input_and_an_output_stays():
    g = Graph("g")
    x = _input(g, "x", (2, 3))
    g.outputs = [g.add("Add", x, _c("zero", 0.0))]     # the output would be the input
    _kept(g)


def test_cast_to_its_own_type_disappears_and_a_real_cast_stays(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 3))
    g.outputs = [g.add("Exp", g.add("Cast", x, to=T.float32))]
    _rewrites_and_keeps_meaning(rng, g, ["Exp"])
    g = Graph("g")
    x = _input(g, "x", (2, 3))
    g.outputs = [g.add("Cast", g.add("Cast", x, to=T.float64), to=T.float32)]
    _kept(g)


# -- chains merged ---------------------------------------------------------------------------


def test_transposes_compose_into_one(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 3, 4, 5))
    y = g.add("Transpose", x, perm=[0, 2, 1, 3])
    z = g.add("Transpose", y, perm=[3, 0, 2, 1])
    g.outputs = [g.add("Relu", z)]
    g = _rewrites_and_keeps_meaning(rng, g, ["Transpose", "Relu"])
    assert g.nodes[0].attrs["perm"] == [3, 0, 1, 2] and g.nodes[0].inputs[0] is x


def test_transposes_that_cancel_and_an_identity_transpose_disappear(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 3, 4))
    y = g.add("Transpose", x, perm=[1, 2, 0])
    z = g.add("Transpose", y, perm=[2, 0, 1])
    w = g.add("Transpose", g.add("Relu", z), perm=[0, 1, 2])
    g.outputs = [g.add("Exp", w)]
    g = _rewrites_and_keeps_meaning(rng, g, ["Relu", "Exp"])
    assert g.nodes[0].inputs[0] is x
    g = Graph("g")
    x = _input(g, "x", (2, 3))
    g.outputs = [g.add("Relu", g.add("Transpose", g.add("Transpose", x)))]   # default perms
    _rewrites_and_keeps_meaning(rng, g, ["Relu"])


def test_a_transpose_read_elsewhere_is_not_merged():
    g = Graph("g")
    x = _input(g, "x", (2, 3, 4))
    y = g.add("Transpose", x, perm=[1, 2, 0])
    g.outputs = [g.add("Transpose", y, perm=[1, 0, 2]), g.add("Relu", y)]
    _kept(g)


def test_reshape_likes_merge_into_one_reshape(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 3, 4))
    y = g.add("Reshape", x, _c("s1", [6, 4], np.int64))
    y = g.add("Unsqueeze", y, _c("axes", [0], np.int64))
    y = g.add("Flatten", y, axis=1)
    y = g.add("Squeeze", y, _c("axes2", [0], np.int64))
    g.outputs = [g.add("Relu", g.add("Reshape", y, _c("s2", [4, -1], np.int64)))]
    g = _rewrites_and_keeps_meaning(rng, g, ["Reshape", "Relu"])
    assert g.nodes[0].inputs[0] is x and g.nodes[0].inputs[1].const.tolist() == [4, 6]


def test_a_reshape_to_the_same_shape_disappears(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 3))
    y = g.add("Reshape", g.add("Relu", x), _c("s", [2, -1], np.int64))
    g.outputs = [g.add("Exp", g.add("Squeeze", y))]      # no unit axes: the same shape too
    _rewrites_and_keeps_meaning(rng, g, ["Relu", "Exp"])


def test_reshapes_of_dynamic_shapes_or_read_elsewhere_stay():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, ("n", 6)))
    y = g.add("Reshape", x, _c("s1", [-1, 2, 3], np.int64))
    g.outputs = [g.add("Reshape", y, _c("s2", [-1, 3, 2], np.int64))]
    _kept(g)
    g = Graph("g")
    x = _input(g, "x", (2, 6))
    y = g.add("Reshape", x, _c("s1", [4, 3], np.int64))
    g.outputs = [g.add("Reshape", y, _c("s2", [3, 4], np.int64)), g.add("Relu", y)]
    _kept(g)


def _run_time_shape_reshape(x_shape, gathered, tail):
    """Reshape(x, Concat(Unsqueeze(Gather(Shape(x), k)) for k in `gathered`, tail)) then
    Relu: an exporter's reshape keeping the batch size."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, x_shape))
    shape = g.add("Shape", x)
    dims = [g.add("Unsqueeze", g.add("Gather", shape, _c(f"i{k}", k, np.int64)),
                  _c(f"a{k}", [0], np.int64)) for k in gathered]
    s = g.add("Concat", *dims, _c("tail", tail, np.int64), axis=0)
    g.outputs = [g.add("Relu", g.add("Reshape", x, s))]
    return g


@pytest.mark.parametrize("x_shape,gathered,tail,want", [
    (("n", 6, 4), [0], [24], [0, 24]),              # the batch copied
    (("n", 6, 4), [0], [2, 3, 4], [0, 2, 3, 4]),
    ((2, "n", 3), [1], [-1], [-1, 6]),              # a symbolic dim elsewhere: inferred
    (("n", "m", 4), [0, 1], [2, 2], [0, 0, 2, 2]),  # two copied in place
])
def test_a_reshape_to_a_run_time_shape_reads_a_constant(x_shape, gathered, tail, want):
    from dnnc.passes.eliminate import eliminate_dead_code

    g = _run_time_shape_reshape(x_shape, gathered, tail)
    rng = np.random.default_rng(3)
    feeds = [rng.standard_normal([3 if isinstance(d, str) else d for d in x_shape]
                                 ).astype(np.float32)]
    before = dnnc.compile(g, target="numpy", opt_level=0).run(*feeds)
    assert simplify(g) >= 1
    eliminate_dead_code(g)
    g.verify()
    assert _ops(g) == ["Reshape", "Relu"]
    assert g.nodes[0].inputs[1].const.tolist() == want
    for target in ("numpy", "llvm"):
        got = dnnc.compile(g, target=target, opt_level=3).run(*feeds)
        np.testing.assert_allclose(got[0], before[0], rtol=1e-6)


def test_a_reshape_to_a_run_time_shape_that_needs_it_stays():
    g = Graph("g")   # two symbolic dims neither copied in place: [m * n] and [n]
    x = g.add_input("x", T.TensorType(T.float32, ("n", "m")))
    shape = g.add("Shape", x)
    s = g.add("Concat", g.add("Slice", shape, _c("b", [1], np.int64), _c("e", [2], np.int64)),
              g.add("Slice", shape, _c("b0", [0], np.int64), _c("e0", [1], np.int64)), axis=0)
    g.outputs = [g.add("Reshape", x, s)]
    _kept(g)


# -- subgraphs recognised as one op ------------------------------------------------------------


def _gelu_erf(g, x, order):
    """x * 0.5 * (1 + erf(x / sqrt 2)) in one of the orders exporters write."""
    if order == "mul_inverse":
        e = g.add("Erf", g.add("Mul", _c("r", 1 / np.sqrt(2)), x))
    else:
        e = g.add("Erf", g.add("Div", x, _c("sqrt2", np.sqrt(2))))
    t = g.add("Add", _c("one", 1.0), e) if order == "one_first" else \
        g.add("Add", e, _c("one", 1.0))
    half = _c("half", 0.5)
    if order in ("torch", "mul_inverse"):        # (x * t) * 0.5
        return g.add("Mul", g.add("Mul", x, t), half)
    if order == "hf":                            # (x * 0.5) * t
        return g.add("Mul", g.add("Mul", x, half), t)
    return g.add("Mul", x, g.add("Mul", half, t))   # x * (0.5 * t)


def _gelu_tanh(g, x, cube="mul"):
    """0.5 * (x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))) as PyTorch exports it."""
    x3 = g.add("Pow", x, _c("three", 3.0)) if cube == "pow" else \
        g.add("Mul", x, g.add("Mul", x, x))
    inner = g.add("Add", x, g.add("Mul", _c("k", 0.044715), x3))
    th = g.add("Tanh", g.add("Mul", _c("s", np.sqrt(2 / np.pi)), inner))
    return g.add("Mul", _c("half", 0.5), g.add("Mul", x, g.add("Add", _c("one", 1.0), th)))


@pytest.mark.parametrize("order", ["torch", "hf", "one_first", "mul_inverse"])
def test_gelu_erf_form_becomes_one_gelu(rng, order):
    g = Graph("g")
    x = g.add("Relu", _input(g, "h", (4, 16)))
    g.outputs = [g.add("Exp", _gelu_erf(g, x, order))]
    g = _rewrites_and_keeps_meaning(rng, g, ["Relu", "Gelu", "Exp"])
    assert g.nodes[1].attrs["approximate"] == "none" and g.nodes[1].inputs[0] is x


@pytest.mark.parametrize("cube", ["mul", "pow"])
def test_gelu_tanh_form_becomes_one_gelu(rng, cube):
    g = Graph("g")
    x = _input(g, "x", (4, 16))
    g.outputs = [_gelu_tanh(g, x, cube)]
    g = _rewrites_and_keeps_meaning(rng, g, ["Gelu"])
    assert g.nodes[0].attrs["approximate"] == "tanh"


def test_gelu_like_subgraphs_that_differ_stay():
    g = Graph("g")                     # erf read by another node too
    x = _input(g, "x", (4, 16))
    out = _gelu_erf(g, x, "torch")
    erf = next(n for n in g.nodes if n.op == "Erf").outputs[0]
    g.outputs = [out, g.add("Relu", erf)]
    _kept(g)
    g = Graph("g")                     # a middle value is a graph output
    x = _input(g, "x", (4, 16))
    out = _gelu_erf(g, x, "hf")
    g.outputs = [out, next(n for n in g.nodes if n.op == "Add").outputs[0]]
    _kept(g)
    g = Graph("g")                     # multiplied by another tensor than erf's argument
    x, y = _input(g, "x", (4, 16)), _input(g, "y", (4, 16))
    e = g.add("Erf", g.add("Div", x, _c("sqrt2", np.sqrt(2))))
    g.outputs = [g.add("Mul", g.add("Mul", y, g.add("Add", e, _c("one", 1.0))), _c("h", 0.5))]
    _kept(g)
    g = Graph("g")                     # a wrong constant (x / 2)
    x = _input(g, "x", (4, 16))
    e = g.add("Erf", g.add("Div", x, _c("two", 2.0)))
    g.outputs = [g.add("Mul", g.add("Mul", x, g.add("Add", e, _c("one", 1.0))), _c("h", 0.5))]
    _kept(g)
    g = Graph("g")                     # the half broadcasts x bigger
    x = _input(g, "x", (4, 16))
    e = g.add("Erf", g.add("Div", x, _c("sqrt2", np.sqrt(2))))
    g.outputs = [g.add("Mul", g.add("Mul", x, g.add("Add", e, _c("one", 1.0))),
                       _c("h", np.full((2, 1, 1), 0.5)))]
    _kept(g)


def _layer_norm(rng, g, x, axes=(-1,), square="pow", gamma=True, beta=True, eps=1e-5,
                second_axes=None):
    axes_v = _c("axes", list(axes), np.int64)
    mean = g.add("ReduceMean", x, axes_v)
    d = g.add("Sub", x, mean)
    sq = g.add("Pow", d, _c("two", 2.0)) if square == "pow" else g.add("Mul", d, d)
    var = g.add("ReduceMean", sq, _c("axes2", list(second_axes or axes), np.int64))
    y = g.add("Div", d, g.add("Sqrt", g.add("Add", var, _c("eps", eps))))
    c = x.type.shape[-1]
    if gamma:
        y = g.add("Mul", y, _c("gamma", 1 + 0.1 * rng.standard_normal(c)))
    if beta:
        y = g.add("Add", _c("beta", rng.standard_normal(c)), y)
    return y


@pytest.mark.parametrize("square, gamma, beta", [("pow", True, True), ("mul", True, True),
                                                 ("pow", True, False), ("pow", False, False)])
def test_layer_norm_written_out_becomes_one_op(rng, square, gamma, beta):
    g = Graph("g")
    x = _input(g, "x", (2, 5, 16))
    g.outputs = [g.add("Relu", _layer_norm(rng, g, x, square=square, gamma=gamma, beta=beta))]
    g = _rewrites_and_keeps_meaning(rng, g, ["LayerNormalization", "Relu"])
    ln = g.nodes[0]
    assert ln.attrs["axis"] == 2 and ln.attrs["epsilon"] == pytest.approx(1e-5)
    assert len(ln.inputs) == 2 + beta


def test_layer_norm_over_several_trailing_axes(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 5, 16))
    g.outputs = [_layer_norm(rng, g, x, axes=(1, 2), gamma=False, beta=False, eps=1e-3)]
    g = _rewrites_and_keeps_meaning(rng, g, ["LayerNormalization"])
    assert g.nodes[0].attrs["axis"] == 1


def test_layer_norm_like_subgraphs_that_differ_stay(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 5, 16))
    g.outputs = [_layer_norm(rng, g, x, axes=(1,))]                    # not the trailing axes
    _kept(g)
    g = Graph("g")
    x = _input(g, "x", (2, 5, 16))
    g.outputs = [_layer_norm(rng, g, x, axes=(-1,), second_axes=(1, 2))]   # means differ
    _kept(g)
    g = Graph("g")
    x = _input(g, "x", (2, 5, 16))
    out = _layer_norm(rng, g, x)
    centered = next(n for n in g.nodes if n.op == "Sub").outputs[0]
    g.outputs = [out, g.add("Relu", centered)]                    # x - mean read too
    _kept(g)


def test_layer_norm_keeps_a_gamma_product_read_elsewhere_outside(rng):
    g = Graph("g")
    x = _input(g, "x", (2, 16))
    y = _layer_norm(rng, g, x, beta=False)
    g.outputs = [g.add("Add", y, _c("beta", np.ones(16))), g.add("Relu", y)]
    g = _rewrites_and_keeps_meaning(rng, g, ["LayerNormalization", "Add", "Relu"])
    assert len(g.nodes[0].inputs) == 2      # the Mul by gamma is in, the shared product is out


def _softmax(g, x, axis=-1, sum_axis=None):
    e = g.add("Exp", g.add("Sub", x, g.add("ReduceMax", x, _c("a", [axis], np.int64))))
    total = g.add("ReduceSum", e, _c("b", [axis if sum_axis is None else sum_axis], np.int64))
    return g.add("Div", e, total)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_written_out_becomes_one_op(rng, axis):
    g = Graph("g")
    x = _input(g, "x", (3, 5, 7))
    g.outputs = [_softmax(g, g.add("Relu", x), axis)]
    g = _rewrites_and_keeps_meaning(rng, g, ["Relu", "Softmax"])
    assert g.nodes[1].attrs["axis"] == axis % 3


def test_softmax_like_subgraphs_that_differ_stay():
    g = Graph("g")
    x = _input(g, "x", (3, 5, 7))
    g.outputs = [_softmax(g, x, -1, sum_axis=1)]
    _kept(g)
    g = Graph("g")
    x = _input(g, "x", (3, 5, 7))
    out = _softmax(g, x)
    g.outputs = [out, next(n for n in g.nodes if n.op == "Exp").outputs[0]]
    _kept(g)


# -- one dense op with its bias -----------------------------------------------------------------


def _matmul_add(rng, a_shape=(9, 8), bias_shape=(11,), const_b=True, const_bias=True,
                bias_first=False, extra_use=False):
    g = Graph("g")
    a = _input(g, "a", a_shape)
    b = _c("w", rng.standard_normal((8, 11))) if const_b else _input(g, "w", (8, 11))
    bias = _c("bias", rng.standard_normal(bias_shape)) if const_bias else \
        _input(g, "bias", bias_shape)
    y = g.add("MatMul", a, b)
    z = g.add("Add", *((bias, y) if bias_first else (y, bias)))
    g.outputs = [g.add("Relu", z)] + ([y] if extra_use else [])
    return g


@pytest.mark.parametrize("bias_shape, bias_first, const_b", [
    ((11,), False, True), ((11,), True, True), ((1, 11), False, True), ((9, 11), False, True),
    ((), True, True), ((11,), False, False)])
def test_matmul_and_bias_become_one_gemm_the_dense_template_compiles(rng, bias_shape, bias_first,
                                                                      const_b):
    g = _matmul_add(rng, bias_shape=bias_shape, bias_first=bias_first, const_b=const_b)
    g = _rewrites_and_keeps_meaning(rng, g, ["Gemm", "Relu"],
                                    opt_levels=(1, 3))
    for level in (1, 3):                # the dense micro-kernel (fma) runs the Gemm
        assert "fma(" in dnnc.compile(g, target="llvm", opt_level=level).runtime.source("loop")


def test_matmul_and_add_that_are_not_a_bias_stay(rng):
    _kept(_matmul_add(rng, const_bias=False))              # added tensor is an input
    _kept(_matmul_add(rng, extra_use=True))                # product read elsewhere
    _kept(_matmul_add(rng, bias_shape=(2, 9, 11)))         # the Add broadcasts it bigger
    _kept(_matmul_add(rng, a_shape=(2, 9, 8)))             # 3-D: convert_layout's bias


def test_zoo_bert_gelu_becomes_one_op(rng):
    from dnnc import zoo
    from dnnc.compiler.driver import load_graph

    g = load_graph(zoo.build("bert_tiny", layers=1, hidden=32, heads=2, seq=8), None)
    feeds = [rng.integers(0, 2, v.type.shape).astype(v.type.dtype.np) if v.type.dtype.is_int
             else rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]
    before = dnnc.compile(g, target="numpy", opt_level=0).run(*feeds)
    assert _ops(g).count("Erf") == 1
    simplify(g)
    g.verify()
    assert _ops(g).count("Gelu") == 1 and "Erf" not in _ops(g)
    for target in ("numpy", "llvm"):
        after = dnnc.compile(g, target=target).run(*feeds)
        np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-6)


def test_torchscript_exports_of_gelu_layer_norm_and_softmax_become_single_ops(rng):
    """PyTorch's TorchScript exporter writes nn.GELU (both forms), nn.LayerNorm (before opset
    17) and a hand-written softmax op by op; each becomes the one registered op and the
    model still matches onnxruntime."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    import io
    import warnings

    from dnnc.compiler.driver import load_graph
    from dnnc.ir.target import Target
    from dnnc.passes.manager import optimize

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 32)
            self.gelu, self.gelu_tanh = torch.nn.GELU(), torch.nn.GELU(approximate="tanh")
            self.norm = torch.nn.LayerNorm(32)

        def forward(self, x):
            h = self.norm(self.gelu(self.fc(x)) + self.gelu_tanh(x).sum(-1, keepdim=True))
            e = torch.exp(h - h.max(dim=-1, keepdim=True).values)
            return e / e.sum(dim=-1, keepdim=True)

    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        model.norm.weight.add_(0.1 * torch.randn(32))
        model.norm.bias.add_(0.1 * torch.randn(32))
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 5, 16),), f, opset_version=14, dynamo=False,
                          input_names=["x"])
    onnx_bytes = f.getvalue()
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    want = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    level1 = optimize(load_graph(onnx_bytes), Target("numpy"), opt_level=1)
    compiled = [dnnc.compile(level1, target="numpy"), dnnc.compile(level1, target="llvm"),
                dnnc.compile(onnx_bytes, target="llvm")]
    for model in compiled:
        ops = _ops(model.graph)
        assert ops.count("Gelu") == 2 and ops.count("LayerNormalization") == 1 and \
            ops.count("Softmax") == 1, ops
        assert not {"Erf", "Tanh", "ReduceMean", "ReduceMax", "Sqrt", "Exp"} & set(ops), ops
        np.testing.assert_allclose(model.run(x)[0], want, rtol=1e-5, atol=1e-6)


# -- per-channel Mul / Add / Sub into the conv before it -------------------------------------------


def _conv_then(rng, ops, group=1, bias=True, extra_use=False):
    """Conv (4 output channels) then `ops`, each (op, constant shape, conv first?), then Relu."""
    g = Graph("g")
    x = _input(g, "x", (2, 4, 6, 6))
    w = _c("w", rng.standard_normal((4, 4 // group, 3, 3)))
    args = [x, w] + ([_c("b", rng.standard_normal(4))] if bias else [])
    y = g.add("Conv", *args, pads=[1, 1, 1, 1], group=group, name="conv")
    first = y
    for k, (op, shape, conv_first) in enumerate(ops):
        c = _c(f"c{k}", rng.standard_normal(shape) + 1.5)
        y = g.add(op, *((y, c) if conv_first else (c, y)), name=f"{op.lower()}{k}")
    g.outputs = [g.add("Relu", y)] + ([first] if extra_use else [])
    return g


@pytest.mark.parametrize("ops, group, bias", [
    ([("Mul", (4, 1, 1), True), ("Add", (4, 1, 1), True)], 1, True),       # caffe2's SpatialBN
    ([("Mul", (1, 4, 1, 1), False), ("Add", (1, 4, 1, 1), False)], 2, False),
    ([("Mul", (), True), ("Sub", (4, 1, 1), True)], 4, True),
    ([("Add", (1, 1, 1), True), ("Mul", (4, 1, 1), True), ("Add", (1,), False)], 1, False),
])
def test_per_channel_constants_fold_into_the_conv_before_them(rng, ops, group, bias):
    _rewrites_and_keeps_meaning(rng, _conv_then(rng, ops, group, bias), ["Conv", "Relu"],
                                opt_levels=(1, 3))


@pytest.mark.parametrize("ops, extra_use", [
    ([("Mul", (6, 1), True)], False),          # varies along the image's columns
    ([("Add", (2, 4, 1, 1), True)], False),    # varies along the batch
    ([("Mul", (1, 4, 6, 6), True)], False),    # per pixel
    ([("Sub", (4, 1, 1), False)], False),      # t - Conv is not Conv - t
    ([("Mul", (4, 1, 1), True)], True),        # the conv's output is read too
])
def test_constants_that_do_not_fold_into_the_conv_stay(rng, ops, extra_use):
    _kept(_conv_then(rng, ops, extra_use=extra_use))
