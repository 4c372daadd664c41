"""Elementwise ops: math, activations, logic, comparison, bitwise, Clip, Where, Cast.

Most ops here go through `unary` / `binary` / `variadic`, one line each: the name, the NumPy
reference, and the attributes. References follow ONNX semantics and keep the input dtype
(NumPy 2 treats Python scalars as weak, so `0.5 * x` stays float16 for float16 x).
"""

from __future__ import annotations

import math

import numpy as np

from .. import loop as L
from .. import types as T
from ..compute import broadcast_load, compute
from ..loop import Cast, Select, call, const, maximum, minimum
from .infer import broadcast_to, check_dtype, check_same_dtype, same_as_input
from ..flops import per_output
from .registry import REQUIRED, Pattern, register_op

FLOATS = T.FLOAT_DTYPES
NUMERIC = T.FLOAT_DTYPES + T.INT_DTYPES
BOOL = (T.bool_,)


def elementwise_rule(expr):
    """A compute rule for elementwise and broadcasting ops: `out[i] = expr(x[i], ...,
    **attrs)`, each present input read under broadcasting (absent optional inputs are None)."""

    def rule(inputs, outputs, **attrs):
        out = outputs[0]

        def element(*idx):
            args = [None if t is None else broadcast_load(t, idx) for t in inputs]
            return expr(*args, **attrs)

        return [compute(out.shape, element, dtype=out.dtype)]

    return rule


NARROW = (T.float16, T.bfloat16)


def _in_float32(expr):
    """`expr` of a float16 / bfloat16 x computed in float32 and rounded once at the end."""
    def widened(x, **attrs):
        if x.dtype not in NARROW:
            return expr(x, **attrs)
        return Cast(x.dtype, expr(Cast(T.float32, x), **attrs))
    return widened


def _evaluated_in_float32(fn):
    """NumPy reference `fn` of a float16 / bfloat16 array computed in float32, rounded once."""
    def widened(x, **attrs):
        if not any(np.dtype(x.dtype) == np.dtype(t.np) for t in NARROW):
            return fn(x, **attrs)
        return np.asarray(fn(x.astype(np.float32), **attrs)).astype(x.dtype)
    return widened


def unary(name: str, fn, attrs: dict | None = None, dtypes=None, expr=None, **options):
    """Register an elementwise op of one input whose output has the input's type;
    `expr(x, **attrs)` is its loop-IR expression. Of a float16 or bfloat16 input, both the
    reference and the expression compute in float32 and round once, at the output (as
    onnxruntime's kernels and torch's fused ones do): a composite such as Gelu's
    0.5 x (1 + erf(x / sqrt 2)) is not rounded to 16 bits after each of its steps (more
    accurate, and in a fused epilogue six float16 conversions an element fewer)."""

    def infer(ctx):
        if dtypes is not None:
            check_dtype(ctx, 0, dtypes)
        return same_as_input(ctx)

    return register_op(name, pattern=Pattern.ELEMWISE, infer=infer,
                       evaluate=_evaluated_in_float32(fn), attrs=attrs,
                       compute=expr and elementwise_rule(_in_float32(expr)), **options)


def binary(name: str, fn, out_dtype: T.DType | None = None, dtypes=None, expr=None,
           **options):
    """Register a broadcasting op of two same-typed inputs; `expr(a, b, **attrs)`."""
    rule = broadcast_to(out_dtype)

    def infer(ctx):
        check_same_dtype(ctx)
        if dtypes is not None:
            check_dtype(ctx, 0, dtypes)
        return rule(ctx)

    return register_op(name, pattern=Pattern.BROADCAST, infer=infer, evaluate=fn,
                       inputs=2, compute=expr and elementwise_rule(expr), **options)


def variadic(name: str, fn, expr):
    """Register a broadcasting op over one or more same-typed inputs, folded with `fn`
    (and `expr` in loop IR)."""
    rule = broadcast_to()

    def infer(ctx):
        check_same_dtype(ctx)
        return rule(ctx)

    def evaluate(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return np.broadcast_to(out, np.broadcast_shapes(*(x.shape for x in xs))).copy()

    def fold(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = expr(out, x)
        return out

    return register_op(name, pattern=Pattern.BROADCAST, infer=infer, evaluate=evaluate,
                       inputs=(1, None), shape_arith=True, compute=elementwise_rule(fold))


# -- math ------------------------------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    # np.asarray: on a rank-0 input the ufunc from frompyfunc returns a Python float
    return np.asarray(_erf(x.astype(np.float64)), np.float64).astype(x.dtype) if x.size \
        else x.copy()


def sigmoid(x):
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x))).astype(x.dtype)


def softplus(x):
    return np.logaddexp(np.zeros((), x.dtype), x)


unary("Abs", np.abs, dtypes=NUMERIC, shape_arith=True, expr=lambda x: call("abs", x))
unary("Neg", np.negative, dtypes=NUMERIC, shape_arith=True, expr=lambda x: call("neg", x))
unary("Sign", np.sign, dtypes=NUMERIC, expr=lambda x: call("sign", x))
unary("Reciprocal", np.reciprocal, dtypes=FLOATS, expr=lambda x: const(1.0, x.dtype) / x)
unary("Sqrt", np.sqrt, dtypes=FLOATS, expr=lambda x: call("sqrt", x))
unary("Exp", np.exp, dtypes=FLOATS, expr=lambda x: call("exp", x))
unary("Log", np.log, dtypes=FLOATS, expr=lambda x: call("log", x))
unary("Ceil", np.ceil, dtypes=FLOATS, expr=lambda x: call("ceil", x))
unary("Floor", np.floor, dtypes=FLOATS, expr=lambda x: call("floor", x))
unary("Round", np.round, dtypes=FLOATS, expr=lambda x: call("round", x))  # half to even, as ONNX
unary("Sin", np.sin, dtypes=FLOATS, expr=lambda x: call("sin", x))
unary("Cos", np.cos, dtypes=FLOATS, expr=lambda x: call("cos", x))
unary("Tan", np.tan, dtypes=FLOATS, expr=lambda x: call("tan", x))
unary("Asin", np.arcsin, dtypes=FLOATS, expr=lambda x: call("asin", x))
unary("Acos", np.arccos, dtypes=FLOATS, expr=lambda x: call("acos", x))
unary("Atan", np.arctan, dtypes=FLOATS, expr=lambda x: call("atan", x))
unary("Sinh", np.sinh, dtypes=FLOATS, expr=lambda x: call("sinh", x))
unary("Cosh", np.cosh, dtypes=FLOATS, expr=lambda x: call("cosh", x))
unary("Asinh", np.arcsinh, dtypes=FLOATS, expr=lambda x: call("asinh", x))
unary("Acosh", np.arccosh, dtypes=FLOATS, expr=lambda x: call("acosh", x))
unary("Atanh", np.arctanh, dtypes=FLOATS, expr=lambda x: call("atanh", x))
unary("Tanh", np.tanh, dtypes=FLOATS, expr=lambda x: call("tanh", x))
unary("Erf", erf, dtypes=FLOATS, expr=lambda x: call("erf", x))
unary("Identity", lambda x: x, shape_arith=True, expr=lambda x: x, flops=per_output(0))


def _round_tf32(x):
    """float32 `x` rounded to tf32 (10 mantissa bits) to nearest, ties away from zero, as
    PTX's `cvt.rna.tf32.f32`; NaN kept (an infinity rounds to itself)."""
    from .packed import round_tf32
    return round_tf32(x)


def _round_tf32_expr(x):
    bits = call("bitcast", x, dtype=T.uint32)
    up = L.BinOp("&", bits + const(0x1000, T.uint32), const(0xFFFFE000, T.uint32))
    return Select(call("isnan", x), x, call("bitcast", up, dtype=T.float32))


# dnnc's own (passes/store_tf32.py): a float32 activation stored as a tf32 value, so that the
# tensor-core products reading it need not round it in their tiles
unary("RoundTF32", _round_tf32, dtypes=(T.float32,), expr=_round_tf32_expr)

# -- activations -------------------------------------------------------------------------------


def _relu_expr(x):
    zero = const(0, x.dtype)
    return maximum(x, zero) if x.dtype.is_float else Select(x > zero, x, zero)


def _celu_expr(x, alpha):
    return maximum(x, const(0.0, x.dtype)) + minimum(const(0.0, x.dtype),
                                                      call("expm1", x / alpha) * alpha)


def _hard_sigmoid_expr(x, alpha, beta):
    return minimum(maximum(x * alpha + beta, const(0.0, x.dtype)), const(1.0, x.dtype))


def _hard_swish_expr(x):
    return x * _hard_sigmoid_expr(x, 1 / 6, 0.5)


def _softplus_expr(x):
    # log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))
    return maximum(x, const(0.0, x.dtype)) + call("log1p", call("exp", -call("abs", x)))


def _shrink_expr(x, bias, lambd):
    zero = const(0, x.dtype)
    return Select(x < -lambd if x.dtype.is_float else x < const(-lambd, x.dtype), x + bias,
                  Select(x > lambd, x - bias, zero))


def _gelu_expr(x, approximate):
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)
        return x * 0.5 * (call("tanh", inner) + 1.0)
    return x * 0.5 * (call("erf", x / math.sqrt(2)) + 1.0)


unary("Relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), dtypes=NUMERIC, expr=_relu_expr)
unary("Sigmoid", sigmoid, dtypes=FLOATS, expr=lambda x: call("sigmoid", x))
unary("LeakyRelu", lambda x, alpha: np.where(x >= 0, x, x * alpha), {"alpha": 0.01}, FLOATS, expr=lambda x, alpha: Select(x >= 0.0, x, x * alpha))
unary("Elu", lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)).astype(x.dtype),
      {"alpha": 1.0}, FLOATS, expr=lambda x, alpha: Select(x > 0.0, x, call("expm1", x) * alpha))
unary("Selu", lambda x, alpha, gamma: (gamma * np.where(x > 0, x, alpha * np.expm1(x)))
      .astype(x.dtype),
      {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, FLOATS, expr=lambda x, alpha, gamma: Select(x > 0.0, x, call("expm1", x) * alpha) * gamma)
unary("Celu", lambda x, alpha: (np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha)))
      .astype(x.dtype), {"alpha": 1.0}, FLOATS, expr=_celu_expr)
unary("HardSigmoid", lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1).astype(x.dtype),
      {"alpha": 0.2, "beta": 0.5}, FLOATS, expr=_hard_sigmoid_expr)
unary("HardSwish", lambda x: (x * np.clip(x / 6 + 0.5, 0, 1)).astype(x.dtype), dtypes=FLOATS, expr=_hard_swish_expr)
unary("Softplus", softplus, dtypes=FLOATS, expr=_softplus_expr)
unary("Softsign", lambda x: x / (1 + np.abs(x)), dtypes=FLOATS, expr=lambda x: x / (call("abs", x) + 1.0))
unary("Mish", lambda x: (x * np.tanh(softplus(x))).astype(x.dtype), dtypes=FLOATS, expr=lambda x: x * call("tanh", _softplus_expr(x)))
unary("ThresholdedRelu", lambda x, alpha: np.where(x > alpha, x, 0).astype(x.dtype),
      {"alpha": 1.0}, FLOATS, expr=lambda x, alpha: Select(x > alpha, x, const(0, x.dtype)))
unary("Shrink", lambda x, bias, lambd: np.where(x < -lambd, x + bias,
                                                np.where(x > lambd, x - bias, 0)).astype(x.dtype),
      {"bias": 0.0, "lambd": 0.5}, NUMERIC, expr=_shrink_expr)
unary("Swish", lambda x, alpha: (x * sigmoid(x * np.asarray(alpha, x.dtype))).astype(x.dtype),
      {"alpha": 1.0}, FLOATS, expr=lambda x, alpha: x * call("sigmoid", x * alpha))


def gelu(x, approximate):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        return (0.5 * x * (1 + np.tanh(inner))).astype(x.dtype)
    return (0.5 * x * (1 + erf(x / np.asarray(math.sqrt(2), x.dtype)))).astype(x.dtype)


unary("Gelu", gelu, {"approximate": "none"}, FLOATS, expr=_gelu_expr)

# -- predicates ----------------------------------------------------------------------------------


def _predicate_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    return [T.TensorType(T.bool_, ctx.shape(0))]


def _is_inf_expr(x, detect_negative, detect_positive):
    zero = const(0.0, x.dtype)
    return L.logical_and(call("isinf", x), L.logical_or(
        L.logical_and(const(bool(detect_negative)), x < zero),
        L.logical_and(const(bool(detect_positive)), x > zero)))


register_op("IsNaN", pattern=Pattern.ELEMWISE, infer=_predicate_infer, evaluate=np.isnan,
            compute=elementwise_rule(lambda x: call("isnan", x)))
register_op("IsInf", pattern=Pattern.ELEMWISE, infer=_predicate_infer,
            evaluate=lambda x, detect_negative, detect_positive:
            (np.isneginf(x) & bool(detect_negative)) | (np.isposinf(x) & bool(detect_positive)),
            attrs={"detect_negative": 1, "detect_positive": 1},
            compute=elementwise_rule(_is_inf_expr))

# -- binary arithmetic ---------------------------------------------------------------------------


def _safe_divisor(a, b):
    """(divisor, by_zero) for integer division without a trap: a divisor of 0 becomes 1 and
    the result there is 0 (x / 0 = x % 0 = 0, NumPy's value), and so does -1 under MIN, where
    the quotient wraps to MIN and the remainder is 0. The llvm target emits the same rule
    (`_int_div_mod` in backends/legalize.py)."""
    by_zero = b == 0
    unsafe = by_zero
    if a.dtype.kind == "i":
        unsafe = unsafe | ((a == np.iinfo(a.dtype).min) & (b == -1))
    return np.where(unsafe, np.ones_like(b), b), by_zero


def div(a, b):
    if a.dtype.kind in "iu":  # integer division truncates toward zero, as C and ONNX
        safe, by_zero = _safe_divisor(a, b)
        q = np.floor_divide(a, safe)
        q = q + ((q < 0) & (q * safe != a)).astype(a.dtype)
        return np.where(by_zero, np.zeros_like(q), q)
    return np.divide(a, b)


def mod(a, b, fmod):
    if a.dtype.kind in "iu":
        safe, by_zero = _safe_divisor(a, b)
        r = np.fmod(a, safe) if fmod else np.mod(a, safe)
        return np.where(by_zero, np.zeros_like(r), r)
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


def _mod_expr(a, b, fmod):
    if fmod:
        if a.dtype.is_float:
            return call("fmod", a, b)
        # C remainder (sign of the dividend); x % 0 is 0, as `/` and `%` give by 0
        return Select(L.eq(b, const(0, b.dtype)), const(0, a.dtype), a - (a / b) * b)
    if a.dtype.is_int:
        return a % b                                # floor modulo: sign of the divisor
    r = call("fmod", a, b)
    zero = const(0.0, a.dtype)
    return Select(L.logical_and(L.ne(r, zero), L.ne(r < zero, b < zero)), r + b, r)


def _bitwise_not_expr(x):
    ones = -1 if x.dtype.kind == "i" else (1 << (8 * x.dtype.itemsize)) - 1
    return L.BinOp("^", x, const(ones, x.dtype))


binary("Add", np.add, dtypes=NUMERIC, shape_arith=True, expr=lambda a, b: a + b)
binary("Sub", np.subtract, dtypes=NUMERIC, shape_arith=True, expr=lambda a, b: a - b)
binary("Mul", np.multiply, dtypes=NUMERIC, shape_arith=True, expr=lambda a, b: a * b)
binary("Div", div, dtypes=NUMERIC, shape_arith=True, expr=lambda a, b: a / b)
binary("Mod", mod, dtypes=NUMERIC, attrs={"fmod": 0}, shape_arith=True, expr=_mod_expr)
def _pow_expr(a, b):
    if a.dtype.is_int:  # exact below 2**53, as integer powers that fit the type are
        return Cast(a.dtype, call("pow", Cast(T.float64, a), Cast(T.float64, b)))
    return call("pow", a, b if b.dtype is a.dtype else Cast(a.dtype, b))


register_op("Pow", pattern=Pattern.BROADCAST, infer=_pow_infer, evaluate=power, inputs=2,
            compute=elementwise_rule(_pow_expr))
def _bitshift_expr(x, y, direction):
    """Shifts outside [0, bits) give NumPy's results (0, or -1 for a negative value shifted
    right), not the undefined behaviour of a machine shift."""
    bits = 8 * x.dtype.itemsize
    ok = L.logical_and(y >= const(0, y.dtype), y < const(bits, y.dtype))
    safe = Select(ok, y, const(0, y.dtype))
    if direction == "LEFT":
        return Select(ok, L.BinOp("<<", x, safe), const(0, x.dtype))
    out_of_range = const(0, x.dtype)
    if x.dtype.kind == "i":
        out_of_range = Select(x < const(0, x.dtype), const(-1, x.dtype), const(0, x.dtype))
    return Select(ok, L.BinOp(">>", x, safe), out_of_range)


register_op("BitShift", pattern=Pattern.BROADCAST, infer=broadcast_to(), evaluate=bitshift,
            attrs={"direction": "LEFT"}, inputs=2, compute=elementwise_rule(_bitshift_expr))
binary("PRelu", lambda x, slope: np.where(x < 0, x * slope, x).astype(x.dtype), dtypes=NUMERIC, expr=lambda x, slope: Select(x < const(0, x.dtype), x * slope, x))

variadic("Sum", np.add, lambda a, b: a + b)
variadic("Max", np.maximum, maximum)
variadic("Min", np.minimum, minimum)
register_op("Mean", pattern=Pattern.BROADCAST, infer=broadcast_to(),
            evaluate=lambda *xs: (sum(xs[1:], xs[0]) / len(xs)).astype(xs[0].dtype),
            inputs=(1, None), compute=elementwise_rule(
                lambda *xs: _sum_exprs(xs) / const(len(xs), xs[0].dtype)))


def _sum_exprs(xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out

# -- logic, comparison, bitwise ------------------------------------------------------------------

binary("And", np.logical_and, dtypes=BOOL, expr=lambda a, b: L.BinOp("and", a, b))
binary("Or", np.logical_or, dtypes=BOOL, expr=lambda a, b: L.BinOp("or", a, b))
binary("Xor", np.logical_xor, dtypes=BOOL, expr=lambda a, b: L.ne(a, b))
unary("Not", np.logical_not, dtypes=BOOL, shape_arith=True, expr=lambda x: call("not", x))
binary("Equal", np.equal, T.bool_, shape_arith=True, expr=L.eq)
binary("Less", np.less, T.bool_, NUMERIC, shape_arith=True, expr=lambda a, b: a < b)
binary("LessOrEqual", np.less_equal, T.bool_, NUMERIC, shape_arith=True, expr=lambda a, b: a <= b)
binary("Greater", np.greater, T.bool_, NUMERIC, shape_arith=True, expr=lambda a, b: a > b)
binary("GreaterOrEqual", np.greater_equal, T.bool_, NUMERIC, shape_arith=True, expr=lambda a, b: a >= b)
binary("BitwiseAnd", np.bitwise_and, dtypes=T.INT_DTYPES, expr=lambda a, b: L.BinOp("&", a, b))
binary("BitwiseOr", np.bitwise_or, dtypes=T.INT_DTYPES, expr=lambda a, b: L.BinOp("|", a, b))
binary("BitwiseXor", np.bitwise_xor, dtypes=T.INT_DTYPES, expr=lambda a, b: L.BinOp("^", a, b))
unary("BitwiseNot", np.invert, dtypes=T.INT_DTYPES, expr=_bitwise_not_expr)

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


def _clip_expr(x, lo=None, hi=None):
    if lo is not None:
        x = maximum(x, lo) if x.dtype.is_float else Select(x < lo, lo, x)
    if hi is not None:
        x = minimum(x, hi) if x.dtype.is_float else Select(x > hi, hi, x)
    return x


register_op("Clip", pattern=Pattern.ELEMWISE, infer=_clip_infer, evaluate=clip, inputs=(1, 3),
            compute=elementwise_rule(_clip_expr))


def _where_infer(ctx):
    check_dtype(ctx, 0, BOOL, "condition")
    check_same_dtype(ctx, 1, 2)
    return [T.TensorType(ctx.dtype(1), T.broadcast_shapes(*(t.shape for t in ctx.inputs)))]


register_op("Where", pattern=Pattern.BROADCAST, infer=_where_infer, inputs=3,
            evaluate=lambda c, x, y: np.where(c, x, y), shape_arith=True,
            compute=elementwise_rule(Select))


def cast(x, to):
    if x.dtype == object:  # symbolic shape values pass through integer casts unchanged
        return x
    if to.kind == "b":
        return x != 0
    if to.is_int and (x.dtype.kind == "f" or x.dtype == T.bfloat16.np):
        return float_to_int(x, to)
    return x.astype(to.np)


_SIGNED = {1: T.int8, 2: T.int16, 4: T.int32, 8: T.int64}


def float_to_int(x: np.ndarray, to: T.DType) -> np.ndarray:
    """Floats as integers, defined for every value (ONNX leaves NaN, +-inf and out of range
    open): x86's conversions, as legalize's `float_to_int` rule writes them for every target
    (docs/semantics.md). int32/int64: trunc(x) where it fits, else MIN; narrower: int32's low
    bits; uint32/uint64: x >= 2**(N-1) ? sN(x - 2**(N-1)) ^ MIN : sN(x), as unsigned bits.
    Never NumPy's astype out of range: that is the platform's (ARM saturates)."""
    x = np.asarray(x).astype(np.float64)   # exact from every float dtype
    bits = 8 * to.itemsize
    if bits < 32:
        return float_to_int(x, T.int32).astype(to.np)   # (integer astype wraps everywhere)
    signed = _SIGNED[to.itemsize]
    minimum = np.iinfo(signed.np).min
    half = 2.0 ** (bits - 1)
    if to.kind == "u":
        high = float_to_int(x - half, signed) ^ minimum
        with np.errstate(invalid="ignore"):
            return np.where(x >= half, high, float_to_int(x, signed)).view(to.np)
    with np.errstate(invalid="ignore"):
        inside = (x >= -half) & (x < half)
    fits = np.trunc(np.where(inside, x, 0.0)).astype(signed.np)
    return np.where(inside, fits, minimum).astype(signed.np)


register_op("Cast", pattern=Pattern.ELEMWISE,
            infer=lambda ctx: [T.TensorType(ctx.attrs["to"], ctx.shape(0))],
            evaluate=cast, attrs={"to": T.float32}, shape_arith=True,
            compute=elementwise_rule(lambda x, to: Cast(to, x)), flops=per_output(0))


def _bitcast_infer(ctx):
    to = ctx.attrs["to"]
    if to.itemsize != ctx.dtype(0).itemsize:
        raise ctx.fail(f"cannot reinterpret {ctx.dtype(0).name} as {to.name}: bit widths "
                       f"differ")
    return [T.TensorType(to, ctx.shape(0))]


def bitcast(x, to):
    return np.ascontiguousarray(x).view(to.np).reshape(x.shape)


register_op("BitCast", pattern=Pattern.ELEMWISE, infer=_bitcast_infer, evaluate=bitcast,
            attrs={"to": REQUIRED},
            compute=elementwise_rule(lambda x, to: call("bitcast", x, dtype=to)))
