"""Elementwise ops: each compute rule (loop IR, interpreted by NumPy) against the op's NumPy
reference, on fresh random inputs, with broadcasting, for every dtype family it accepts."""

import numpy as np
import pytest

from dnnc.ir.compute import run_rule
from dnnc.ir.ops.registry import get_op

UNARY_FLOAT = ["Abs", "Neg", "Sign", "Reciprocal", "Sqrt", "Exp", "Log", "Ceil", "Floor",
               "Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
               "Acosh", "Atanh", "Tanh", "Erf", "Identity", "Relu", "Sigmoid", "LeakyRelu",
               "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign",
               "Mish", "ThresholdedRelu", "Shrink", "Swish", "Gelu", "IsNaN", "IsInf"]
ATTRS = {"LeakyRelu": {"alpha": 0.3}, "Elu": {"alpha": 0.7}, "Celu": {"alpha": 1.3},
         "ThresholdedRelu": {"alpha": 0.4}, "Shrink": {"bias": 0.2, "lambd": 0.6},
         "Swish": {"alpha": 1.5}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
         "IsInf": {"detect_negative": 0}}
DOMAIN = {"Sqrt": (0.01, 4), "Log": (0.01, 4), "Asin": (-0.99, 0.99), "Acos": (-0.99, 0.99),
          "Acosh": (1.01, 4), "Atanh": (-0.99, 0.99), "Reciprocal": (0.1, 3)}


def _check(op, arrays, attrs=None, rtol=1e-5, atol=1e-6, const_inputs=()):
    expected = get_op(op).run([None if a is None else np.asarray(a) for a in arrays],
                              {**_defaults(op), **(attrs or {})})
    got = run_rule(op, arrays, attrs, const_inputs=const_inputs)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, e.dtype, g.shape, e.shape)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                       atol=atol)
        else:
            np.testing.assert_array_equal(g, e)


def _defaults(op):
    return dict(get_op(op).attrs)


@pytest.mark.parametrize("op", UNARY_FLOAT)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_float_rule(rng, op, dtype):
    lo, hi = DOMAIN.get(op, (-3, 3))
    x = rng.uniform(lo, hi, (3, 7)).astype(dtype)
    if op in ("IsNaN", "IsInf"):
        x[0, :3] = [np.nan, np.inf, -np.inf]
    _check(op, [x], ATTRS.get(op))


@pytest.mark.parametrize("op", ["Relu", "Exp", "Tanh", "Gelu", "Add", "Div"])
def test_half_precision_rules_round_like_the_reference(rng, op):
    arrays = [rng.standard_normal((4, 5)).astype(np.float16)]
    if op in ("Add", "Div"):
        arrays.append((rng.uniform(0.5, 2, (5,))).astype(np.float16))
    _check(op, arrays, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("op", ["Gelu", "HardSwish", "Mish", "Softplus", "Elu"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_composites_compute_in_float32_and_round_once(rng, op, dtype):
    """A composite activation of a float16 / bfloat16 input: reference and rule both compute
    in float32 and round at the output (not after each of the composite's steps), so they
    agree bit for bit with the float32 result rounded once."""
    import ml_dtypes
    half = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    x = (rng.standard_normal((6, 9)) * 3).astype(half)
    once = get_op(op).run([x.astype(np.float32)], _defaults(op))[0].astype(half)
    (reference,) = get_op(op).run([x], _defaults(op))
    (rule,) = run_rule(op, [x])
    assert reference.dtype == rule.dtype == x.dtype
    np.testing.assert_array_equal(reference.view(np.uint16), once.view(np.uint16))
    np.testing.assert_array_equal(rule.view(np.uint16), once.view(np.uint16))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
                                "PRelu", "Equal", "Less", "LessOrEqual", "Greater",
                                "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_binary_rules_broadcast(rng, op, dtype):
    if dtype == np.float32:
        a = rng.standard_normal((2, 3, 4)).astype(dtype)
        b = rng.uniform(0.5, 2, (3, 1)).astype(dtype)
    else:
        a = rng.integers(-20, 20, (2, 3, 4)).astype(dtype)
        b = rng.integers(1, 5, (3, 1)).astype(dtype)
    if op == "Pow":
        a = np.abs(a) + (1 if dtype != np.float32 else 0.1)
        b = np.abs(b) % 4
    _check(op, [a, b])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_mod_both_conventions(rng, fmod, dtype):
    a = (rng.standard_normal((5, 6)) * 10).astype(dtype)
    b = (rng.choice([-3, -2, 2, 3], (6,)) * (1.5 if dtype == np.float32 else 1)).astype(dtype)
    _check("Mod", [a, b], {"fmod": fmod})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(rng, op):
    _check(op, [rng.random((3, 4)) > 0.5, rng.random((4,)) > 0.5])
    _check("Not", [rng.random((3, 4)) > 0.5])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint64])
def test_bitwise(rng, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 5), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (5,), dtype=dtype, endpoint=True)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        _check(op, [a, b])
    _check("BitwiseNot", [a])


def test_bitshift(rng):
    a = rng.integers(0, 200, (4, 3), dtype=np.uint32)
    s = rng.integers(0, 5, (3,), dtype=np.uint32)
    _check("BitShift", [a, s], {"direction": "LEFT"})
    _check("BitShift", [a, s], {"direction": "RIGHT"})


def test_clip_where_cast(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[0, 0] = np.nan
    _check("Clip", [x, np.float32(-0.5), np.float32(0.7)])
    _check("Clip", [x, None, np.float32(0.2)])
    xi = rng.integers(-9, 9, (3, 4)).astype(np.int64)
    _check("Clip", [xi, np.int64(-3), np.int64(4)])
    c = rng.random((3, 1)) > 0.5
    _check("Where", [c, x, rng.standard_normal((4,)).astype(np.float32)])
    for to in ("int32", "float16", "bool", "uint8", "float64"):
        from dnnc.ir.types import DType
        _check("Cast", [np.abs(x[1:]) * 10], {"to": DType.from_name(to)})


def test_bitcast_reinterprets_bits_and_rejects_width_changes(rng):
    import dnnc
    from dnnc.errors import ShapeError
    from dnnc.ir import types as T
    from dnnc.ir.graph import Graph

    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(get_op("BitCast").run([x], {"to": T.int32})[0],
                                  x.view(np.int32))
    g = Graph("g")
    v = g.add_input("x", T.TensorType(T.float32, ("N", 4)))
    with pytest.raises(ShapeError, match="bit widths"):
        g.add("BitCast", v, to=T.int16)
    g.outputs = [g.add("BitCast", v, to=T.uint32)]
    out = dnnc.compile(g, target="numpy").run(x)[0]
    np.testing.assert_array_equal(out, x.view(np.uint32))


@pytest.mark.parametrize("src, dst", [(np.float32, np.int32), (np.int32, np.float32),
                                      (np.float16, np.int16), (np.uint8, np.int8),
                                      (np.float64, np.uint64)])
def test_bitcast_rule(rng, src, dst):
    from dnnc.ir.types import DType
    x = (rng.standard_normal((3, 5)) * 100).astype(src)
    _check("BitCast", [x], {"to": DType.from_numpy(dst)})


@pytest.mark.parametrize("op", UNARY_FLOAT)
def test_unary_references_take_rank_0_inputs(op):
    """A rank-0 input (ReduceSum with keepdims=0 over all axes feeding it) gives a rank-0
    array (found by the fuzzer: Erf's reference returned a Python float and failed)."""
    x = np.asarray(np.random.default_rng(11).uniform(*DOMAIN.get(op, (-2, 2))), np.float32)
    out, = get_op(op).run([x], {**_defaults(op), **ATTRS.get(op, {})})
    assert np.shape(out) == ()
    _check(op, [x], ATTRS.get(op))
