"""Elementwise ops: math, activations, logic, comparison, bitwise, Clip, Where, Cast.

Most ops here go through `unary` / `binary` / `variadic`, one line each: the name, the NumPy
reference, and the attributes. References follow ONNX semantics and keep the input dtype
(NumPy 2 treats Python scalars as weak, so `0.5 * x` stays float16 for float16 x).
"""

from __future__ import annotations

import math

import numpy as np

from .. import types as T
from .infer import broadcast_to, check_dtype, check_same_dtype, same_as_input
from .registry import Pattern, register_op

FLOATS = T.FLOAT_DTYPES
NUMERIC = T.FLOAT_DTYPES + T.INT_DTYPES
BOOL = (T.bool_,)


def unary(name: str, fn, attrs: dict | None = None, dtypes=None, **options):
    """Register an elementwise op of one input whose output has the input's type."""

    def infer(ctx):
        if dtypes is not None:
            check_dtype(ctx, 0, dtypes)
        return same_as_input(ctx)

    return register_op(name, pattern=Pattern.ELEMWISE, infer=infer, evaluate=fn,
                       attrs=attrs, **options)


def binary(name: str, fn, out_dtype: T.DType | None = None, dtypes=None, **options):
    """Register a broadcasting op of two same-typed inputs."""
    rule = broadcast_to(out_dtype)

    def infer(ctx):
        check_same_dtype(ctx)
        if dtypes is not None:
            check_dtype(ctx, 0, dtypes)
        return rule(ctx)

    return register_op(name, pattern=Pattern.BROADCAST, infer=infer, evaluate=fn,
                       inputs=2, **options)


def variadic(name: str, fn):
    """Register a broadcasting op over one or more same-typed inputs, folded with `fn`."""
    rule = broadcast_to()

    def infer(ctx):
        check_same_dtype(ctx)
        return rule(ctx)

    def evaluate(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return np.broadcast_to(out, np.broadcast_shapes(*(x.shape for x in xs))).copy()

    return register_op(name, pattern=Pattern.BROADCAST, infer=infer, evaluate=evaluate,
                       inputs=(1, None), shape_arith=True)


# -- math ------------------------------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    return _erf(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()


def sigmoid(x):
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x))).astype(x.dtype)


def softplus(x):
    return np.logaddexp(np.zeros((), x.dtype), x)


unary("Abs", np.abs, dtypes=NUMERIC, shape_arith=True)
unary("Neg", np.negative, dtypes=NUMERIC, shape_arith=True)
unary("Sign", np.sign, dtypes=NUMERIC)
unary("Reciprocal", np.reciprocal, dtypes=FLOATS)
unary("Sqrt", np.sqrt, dtypes=FLOATS)
unary("Exp", np.exp, dtypes=FLOATS)
unary("Log", np.log, dtypes=FLOATS)
unary("Ceil", np.ceil, dtypes=FLOATS)
unary("Floor", np.floor, dtypes=FLOATS)
unary("Round", np.round, dtypes=FLOATS)  # half to even, as ONNX
unary("Sin", np.sin, dtypes=FLOATS)
unary("Cos", np.cos, dtypes=FLOATS)
unary("Tan", np.tan, dtypes=FLOATS)
unary("Asin", np.arcsin, dtypes=FLOATS)
unary("Acos", np.arccos, dtypes=FLOATS)
unary("Atan", np.arctan, dtypes=FLOATS)
unary("Sinh", np.sinh, dtypes=FLOATS)
unary("Cosh", np.cosh, dtypes=FLOATS)
unary("Asinh", np.arcsinh, dtypes=FLOATS)
unary("Acosh", np.arccosh, dtypes=FLOATS)
unary("Atanh", np.arctanh, dtypes=FLOATS)
unary("Tanh", np.tanh, dtypes=FLOATS)
unary("Erf", erf, dtypes=FLOATS)
unary("Identity", lambda x: x, shape_arith=True)

# -- activations -------------------------------------------------------------------------------

unary("Relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), dtypes=NUMERIC)
unary("Sigmoid", sigmoid, dtypes=FLOATS)
unary("LeakyRelu", lambda x, alpha: np.where(x >= 0, x, x * alpha), {"alpha": 0.01}, FLOATS)
unary("Elu", lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)).astype(x.dtype),
      {"alpha": 1.0}, FLOATS)
unary("Selu", lambda x, alpha, gamma: (gamma * np.where(x > 0, x, alpha * np.expm1(x)))
      .astype(x.dtype),
      {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, FLOATS)
unary("Celu", lambda x, alpha: (np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha)))
      .astype(x.dtype), {"alpha": 1.0}, FLOATS)
unary("HardSigmoid", lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1).astype(x.dtype),
      {"alpha": 0.2, "beta": 0.5}, FLOATS)
unary("HardSwish", lambda x: (x * np.clip(x / 6 + 0.5, 0, 1)).astype(x.dtype), dtypes=FLOATS)
unary("Softplus", softplus, dtypes=FLOATS)
unary("Softsign", lambda x: x / (1 + np.abs(x)), dtypes=FLOATS)
unary("Mish", lambda x: (x * np.tanh(softplus(x))).astype(x.dtype), dtypes=FLOATS)
unary("ThresholdedRelu", lambda x, alpha: np.where(x > alpha, x, 0).astype(x.dtype),
      {"alpha": 1.0}, FLOATS)
unary("Shrink", lambda x, bias, lambd: np.where(x < -lambd, x + bias,
                                                np.where(x > lambd, x - bias, 0)).astype(x.dtype),
      {"bias": 0.0, "lambd": 0.5}, NUMERIC)
unary("Swish", lambda x, alpha: (x * sigmoid(x * np.asarray(alpha, x.dtype))).astype(x.dtype),
      {"alpha": 1.0}, FLOATS)


def gelu(x, approximate):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        return (0.5 * x * (1 + np.tanh(inner))).astype(x.dtype)
    return (0.5 * x * (1 + erf(x / np.asarray(math.sqrt(2), x.dtype)))).astype(x.dtype)


unary("Gelu", gelu, {"approximate": "none"}, FLOATS)

# -- predicates ----------------------------------------------------------------------------------


def _predicate_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    return [T.TensorType(T.bool_, ctx.shape(0))]


register_op("IsNaN", pattern=Pattern.ELEMWISE, infer=_predicate_infer, evaluate=np.isnan)
register_op("IsInf", pattern=Pattern.ELEMWISE, infer=_predicate_infer,
            evaluate=lambda x, detect_negative, detect_positive:
            (np.isneginf(x) & bool(detect_negative)) | (np.isposinf(x) & bool(detect_positive)),
            attrs={"detect_negative": 1, "detect_positive": 1})

# -- binary arithmetic ---------------------------------------------------------------------------


def div(a, b):
    if a.dtype.kind in "iu":  # integer division truncates toward zero, as C and ONNX
        q = np.floor_divide(a, b)
        return q + ((q < 0) & (q * b != a)).astype(a.dtype)
    return np.divide(a, b)


def mod(a, b, fmod):
    return np.fmod(a, b) if fmod else np.mod(a, b)


def power(a, b):
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype)
    return np.power(a, b.astype(a.dtype))


def _pow_infer(ctx):
    check_dtype(ctx, 0, NUMERIC)
    return broadcast_to()(ctx)


def bitshift(x, y, direction):
    return np.left_shift(x, y) if direction == "LEFT" else np.right_shift(x, y)


binary("Add", np.add, dtypes=NUMERIC, shape_arith=True)
binary("Sub", np.subtract, dtypes=NUMERIC, shape_arith=True)
binary("Mul", np.multiply, dtypes=NUMERIC, shape_arith=True)
binary("Div", div, dtypes=NUMERIC, shape_arith=True)
binary("Mod", mod, dtypes=NUMERIC, attrs={"fmod": 0}, shape_arith=True)
register_op("Pow", pattern=Pattern.BROADCAST, infer=_pow_infer, evaluate=power, inputs=2)
register_op("BitShift", pattern=Pattern.BROADCAST, infer=broadcast_to(), evaluate=bitshift,
            attrs={"direction": "LEFT"}, inputs=2)
binary("PRelu", lambda x, slope: np.where(x < 0, x * slope, x).astype(x.dtype), dtypes=NUMERIC)

variadic("Sum", np.add)
variadic("Max", np.maximum)
variadic("Min", np.minimum)
register_op("Mean", pattern=Pattern.BROADCAST, infer=broadcast_to(),
            evaluate=lambda *xs: (sum(xs[1:], xs[0]) / len(xs)).astype(xs[0].dtype),
            inputs=(1, None))

# -- logic, comparison, bitwise ------------------------------------------------------------------

binary("And", np.logical_and, dtypes=BOOL)
binary("Or", np.logical_or, dtypes=BOOL)
binary("Xor", np.logical_xor, dtypes=BOOL)
unary("Not", np.logical_not, dtypes=BOOL, shape_arith=True)
binary("Equal", np.equal, T.bool_, shape_arith=True)
binary("Less", np.less, T.bool_, NUMERIC, shape_arith=True)
binary("LessOrEqual", np.less_equal, T.bool_, NUMERIC, shape_arith=True)
binary("Greater", np.greater, T.bool_, NUMERIC, shape_arith=True)
binary("GreaterOrEqual", np.greater_equal, T.bool_, NUMERIC, shape_arith=True)
binary("BitwiseAnd", np.bitwise_and, dtypes=T.INT_DTYPES)
binary("BitwiseOr", np.bitwise_or, dtypes=T.INT_DTYPES)
binary("BitwiseXor", np.bitwise_xor, dtypes=T.INT_DTYPES)
unary("BitwiseNot", np.invert, dtypes=T.INT_DTYPES)

# -- Clip, Where, Cast ---------------------------------------------------------------------------


def clip(x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def _clip_infer(ctx):
    check_dtype(ctx, 0, NUMERIC)
    for i in (1, 2):
        if ctx.has(i) and ctx.type(i).rank != 0 and ctx.type(i).numel != 1:
            raise ctx.fail(f"input {i} must be a scalar, given {ctx.type(i)}")
    check_same_dtype(ctx)
    return same_as_input(ctx)


register_op("Clip", pattern=Pattern.ELEMWISE, infer=_clip_infer, evaluate=clip, inputs=(1, 3))


def _where_infer(ctx):
    check_dtype(ctx, 0, BOOL, "condition")
    check_same_dtype(ctx, 1, 2)
    return [T.TensorType(ctx.dtype(1), T.broadcast_shapes(*(t.shape for t in ctx.inputs)))]


register_op("Where", pattern=Pattern.BROADCAST, infer=_where_infer, inputs=3,
            evaluate=lambda c, x, y: np.where(c, x, y), shape_arith=True)


def cast(x, to):
    if x.dtype == object:  # symbolic shape values pass through integer casts unchanged
        return x
    if to.kind == "b":
        return x != 0
    if to.is_int and x.dtype.kind == "f":
        # out-of-range and NaN are undefined in ONNX; keep NumPy quiet about them
        with np.errstate(invalid="ignore", over="ignore"):
            return x.astype(to.np)
    return x.astype(to.np)


register_op("Cast", pattern=Pattern.ELEMWISE,
            infer=lambda ctx: [T.TensorType(ctx.attrs["to"], ctx.shape(0))],
            evaluate=cast, attrs={"to": T.float32}, shape_arith=True)
