"""Op generators for QDQ-quantized models as onnxruntime.quantization.quantize_static writes
them (QDQ format, issue 30): activations as QuantizeLinear -> DequantizeLinear pairs (int8 or
uint8, from opset 21 also int4 / uint4: `FOUR_BIT_ACTIVATIONS`; per-tensor scale and zero
point as initializers), weights as int8 initializers (from opset 21 also int4 / uint4:
`WEIGHT_TYPES`) -> DequantizeLinear (per channel: axis 0 of a Conv weight, axis 1 of a
MatMul weight; or per tensor), biases as int32 initializers -> DequantizeLinear at the input
scale times the weight scale, and between them the float ops quantize_static leaves: Conv
(regular, depthwise, 1x1), MatMul, Gemm, Add, Mul, Sigmoid, SiLU (x * Sigmoid(x)), HardSwish,
Relu, Clip, AveragePool, GlobalAveragePool, MaxPool, Concat, Reshape, Flatten and
squeeze-excitation, one to four blocks in a row (efficientnet's DQ -> Conv -> Q -> DQ ->
Sigmoid -> Q -> DQ -> Mul -> Q ...).

Activation scales follow MinMax calibration over the value's rough range (`Val.scale`), some
narrower so that values saturate; values on a grid (`grid` inputs, sums and products of them)
get power-of-two scales that make exact ties, where half-to-even and half-away rounding differ.

Every value downstream of a QuantizeLinear is `rounded` (graph_builder): two correct
implementations whose float inputs to a QuantizeLinear differ by an ulp may differ by a quantum
there, so the fuzzer compares such outputs in quanta (fuzz.py). That holds only because a
rounded value flows into QDQ blocks alone, each ending in Q -> DQ: these generators must never
hand a rounded value to a smooth float op that is not requantized, nor quantize a value that
may hold NaN (rint(NaN) to an integer is undefined).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from onnx import TensorProto

from ..graph_builder import BATCH, F32, I4, I8, U4, U8, Builder, Rejected, Val, broadcastable
from .layers import check_windows

QRANGE = {I8: (-128, 127), U8: (0, 255), I4: (-8, 7), U4: (0, 15)}
FOUR_BIT_ACTIVATIONS = 0.15
"""The share of activations quantized to int4 or uint4 from opset 21 (quantize_static's
QInt4 / QUInt4 activation types)."""


# --- quantization parameters and the pairs that use them -------------------------------------

def _params(g: Builder, lo: float, hi: float, exact_step: float | None = None):
    """(scale, zero point) for values in about [lo, hi], as MinMax calibration computes them
    (the range widened to hold 0); sometimes narrower (values saturate) or symmetric. An exact
    value on a grid of `exact_step` gets a power-of-two scale of 2 or 4 steps instead: exact
    ties, where the rounding mode shows."""
    if g.opset >= 21 and g.chance(FOUR_BIT_ACTIVATIONS):
        dtype = g.choice([I4, U4])
    else:
        dtype = I8 if g.chance(0.55) else U8
    signed = dtype in (I8, I4)
    qmin, qmax = QRANGE[dtype]
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if g.chance(0.25):   # calibrated on fewer values than it sees: the tails saturate
        lo, hi = lo * 0.6, hi * 0.6
    if signed and g.chance(0.3):   # symmetric activations: zero point 0
        hi = max(-lo, hi, 1e-3)
        lo = -hi
    if exact_step is not None:
        scale = np.float32(exact_step * g.choice([2.0, 4.0]))
    else:
        scale = np.float32(max(hi - lo, 1e-3) / (qmax - qmin))
        if g.chance(0.2):   # a power of two, as some quantizers round it
            scale = np.float32(2.0 ** round(math.log2(scale)))
    if lo == -hi and signed:
        zero = 0
    else:
        zero = int(np.clip(round(qmin - lo / float(scale)), qmin, qmax))
        if exact_step is not None:
            zero = int(np.clip(zero + int(g.rng.integers(-3, 4)), qmin, qmax))
    return scale, np.array(zero, dtype)


def _grid_step(v: Val) -> float | None:
    """The spacing of an exact DQ value's grid, when it has one."""
    if v.exact and v.quant is not None and math.log2(v.quant[0]).is_integer():
        return float(v.quant[0])
    return None


def requantize(g: Builder, y: Val, lo: float, hi: float, same_as: Val | None = None,
               exact_step: float | None = None) -> Val:
    """DequantizeLinear(QuantizeLinear(y)): y's quantized activation, with the parameters of
    `same_as` (quantize_static shares them across Reshape, Flatten and pools) or calibrated
    ones. An exact y on a power-of-two grid stays exact."""
    if y.nan:
        raise Rejected
    if same_as is not None:
        scale, zero = same_as.quant[0], same_as.quant[1]
    else:
        scale, zero = _params(g, lo, hi, exact_step if y.exact else None)
    s = g.initializer(np.asarray(scale, np.float32), "scale", exact=True)
    params = [s]
    # (uint8's zero point defaults to 0; another type's is needed for its type)
    if zero.dtype != U8 or int(zero) != 0 or g.chance(0.7):
        params.append(g.initializer(zero, "zero_point", exact=True))
    q = g.node("QuantizeLinear", [y] + params, exact=y.exact)[0]
    qmin, qmax = QRANGE[zero.dtype]
    top = max(abs(float(scale) * (qmin - int(zero))), abs(float(scale) * (qmax - int(zero))))
    pow2 = math.log2(float(scale)).is_integer()
    out = g.node("DequantizeLinear", [q] + params, exact=y.exact and pow2, scale=top)[0]
    out.quant = (np.float32(scale), zero, zero.dtype)
    return out


def _range(v: Val) -> tuple[float, float]:
    """About where v's values lie: its DQ grid's range, else +-3 of its rough scale."""
    if v.quant is not None:
        scale, zero, dtype = v.quant
        qmin, qmax = QRANGE[dtype]
        return float(scale) * (qmin - int(zero)), float(scale) * (qmax - int(zero))
    return -3.0 * v.scale, 3.0 * v.scale


WEIGHT_TYPES = {   # weight type: (its dtype, largest |w - zero point|, zero point)
    "int8": (np.int8, 127, 0), "int4": (ml_dtypes.int4, 7, 0), "uint4": (ml_dtypes.uint4, 7, 8)}
"""As quantize_static writes weights: symmetric int8, QInt4 (opset 21's int4 type, held by
dnnc as int8) and QUInt4 (zero point 8)."""


def weight(g: Builder, shape: tuple, fan_in: int, axis: int) -> tuple[Val, np.ndarray]:
    """A quantized weight -> DequantizeLinear (int8; from opset 21 sometimes int4 or uint4:
    `WEIGHT_TYPES`), per channel along `axis` or per tensor, symmetric as quantize_static
    writes it; and its scale (scalar or per channel)."""
    kind = "int8" if g.opset < 21 or g.chance(0.6) else g.choice(["int4", "uint4"])
    dtype, top, zero = WEIGHT_TYPES[kind]
    w = g.rng.standard_normal(shape) / math.sqrt(max(fan_in, 1))
    per_channel = g.chance(0.75) and shape[axis] > 1
    if per_channel:
        others = tuple(a for a in range(len(shape)) if a != axis)
        scale = (np.max(np.abs(w), axis=others) / top).astype(np.float32)
        dims = [1] * len(shape)
        dims[axis] = shape[axis]
        q = np.clip(np.rint(w / scale.reshape(dims)), -top, top) + zero
    else:
        scale = np.asarray(np.max(np.abs(w)) / top, np.float32)
        q = np.clip(np.rint(w / scale), -top, top) + zero
    q = q.astype(np.int8).astype(dtype)
    params = [g.initializer(scale, "w_scale", exact=True)]
    if zero or g.chance(0.7):
        params.append(g.initializer(np.full(scale.shape, zero).astype(dtype), "w_zero_point",
                                    exact=True))
    attrs = {"axis": axis} if per_channel else {}
    dq = g.node("DequantizeLinear", [g.initializer(q, "w_quantized", exact=True)] + params,
                **attrs)[0]
    g.values.remove(dq)   # a weight, not an activation other ops may read
    return dq, scale


def bias(g: Builder, n: int, x: Val, w_scale: np.ndarray) -> Val:
    """An int32 bias -> DequantizeLinear at scale x_scale * w_scale (per channel when the
    weight is), as quantize_static writes it."""
    scale = (np.float32(x.quant[0]) * w_scale).astype(np.float32)
    b = g.rng.standard_normal(n) * 0.5
    q = np.rint(b / np.broadcast_to(scale, (n,))).astype(np.int32)
    params = [g.initializer(scale, "b_scale", exact=True)]
    if g.chance(0.3):
        params.append(g.initializer(np.zeros(scale.shape, np.int32), "b_zero_point",
                                    exact=True))
    attrs = {"axis": 0} if scale.ndim else {}
    dq = g.node("DequantizeLinear", [g.initializer(q, "b_quantized", exact=True)] + params,
                **attrs)[0]
    g.values.remove(dq)
    return dq


def _partner(g: Builder, x: Val) -> Val:
    """A second quantized activation broadcasting into x: an earlier DQ value, or a new input
    (or a constant) quantized."""
    existing = [v for v in g.usable(rounded=True) if v.quant is not None and
                v.name != x.name and broadcastable(v.shape, x.shape)]
    if existing and g.chance(0.4):
        return g.choice(existing)
    shape = tuple(d if g.chance(0.7) else 1 for d in x.shape)
    if g.chance(0.3):
        shape = shape[int(g.rng.integers(0, len(shape) + 1)):]
    if any(not isinstance(d, int) for d in shape) or g.chance(0.75):
        kind = "grid" if _grid_step(x) is not None and g.chance(0.7) else "normal"
        y = g.add_input(shape, F32, kind)
    else:   # a quantized constant, which folding may take
        y = g.initializer(g.rng.standard_normal(shape).astype(np.float32), "c")
    return quantize_input(g, y)


def quantize_input(g: Builder, y: Val) -> Val:
    """y's first QDQ pair: a grid input gets a tie-making power-of-two scale."""
    grid = [s.kind for s in g.inputs if s.name == y.name] == ["grid"]
    lo, hi = _range(y)
    return requantize(g, y, lo, hi, exact_step=0.125 if grid else None)


# --- blocks: a DQ value in, the next DQ value out ---------------------------------------------

def _image(x: Val) -> bool:
    return x.rank == 4 and all(x.static(i) for i in (1, 2, 3))


def conv(g: Builder, x: Val, kind: str | None = None, m: int | None = None) -> Val:
    """Conv of a quantized image: regular, depthwise (group = channels) or pointwise."""
    c, h, w = x.shape[1:]
    kind = kind or g.choice(["regular", "regular", "depthwise", "pointwise"])
    k = 1 if kind == "pointwise" else g.choice([3, 3, 5, 1])
    group = c if kind == "depthwise" else 1
    m = c if kind == "depthwise" else m or g.size((1, 2, 3, 4, 8, 16), (16, 24, 40))
    attrs = {"kernel_shape": [k, k], "group": group}
    if k > 1 and g.chance(0.8):
        attrs["pads"] = [k // 2] * 4
    if g.chance(0.3) and kind != "pointwise":
        attrs["strides"] = [2, 2]
    check_windows((h, w), attrs)
    wq, w_scale = weight(g, (m, c // group, k, k), c // group * k * k, axis=0)
    inputs = [x, wq] + ([bias(g, m, x, w_scale)] if g.chance(0.8) else [])
    lo, hi = _range(x)
    amax = max(-lo, hi) * g.choice([0.5, 1.0])
    y = g.node("Conv", inputs, **attrs)[0]
    return requantize(g, y, -amax, amax)


def matmul(g: Builder, x: Val) -> Val:
    """MatMul by an int8 weight [K, N], per channel along axis 1 (N)."""
    k = x.shape[-1]
    n = g.size((1, 2, 3, 5, 8, 13, 16), (16, 32, 64))
    wq, _ = weight(g, (k, n), k, axis=1)
    lo, hi = _range(x)
    y = g.node("MatMul", [x, wq])[0]
    return requantize(g, y, lo, hi)


def gemm(g: Builder, x: Val) -> Val:
    """Gemm by an int8 weight (transposed or not) with an int32 bias."""
    k = x.shape[1]
    n = g.size((1, 2, 3, 5, 8, 13), (16, 32, 64))
    trans_b = int(g.chance(0.5))
    wq, w_scale = weight(g, (n, k) if trans_b else (k, n), k, axis=0 if trans_b else 1)
    inputs = [x, wq] + ([bias(g, n, x, w_scale)] if g.chance(0.8) else [])
    lo, hi = _range(x)
    y = g.node("Gemm", inputs, transB=trans_b)[0]
    return requantize(g, y, lo, hi)


def add_mul(g: Builder, x: Val) -> Val:
    """Add or Mul of two quantized activations (a residual, a scale)."""
    y = _partner(g, x)
    op = g.choice(["Add", "Mul"])
    (a, b), (c, d) = _range(x), _range(y)
    pair = [x, y] if g.chance(0.7) else [y, x]
    exact = x.exact and y.exact and _grid_step(x) is not None and _grid_step(y) is not None
    if op == "Add":
        out = g.node("Add", pair, exact=exact)[0]
        lo, hi, step = a + c, b + d, min(x.quant[0], y.quant[0])
    else:
        out = g.node("Mul", pair, exact=exact)[0]
        corners = [a * c, a * d, b * c, b * d]
        lo, hi, step = min(corners), max(corners), x.quant[0] * y.quant[0]
    return requantize(g, out, lo, hi, exact_step=float(step) if exact else None)


def silu(g: Builder, x: Val) -> Val:
    """x * Sigmoid(x), each output requantized, as torch's exporter and quantize_static
    write SiLU."""
    gate = requantize(g, g.node("Sigmoid", [x])[0], 0.0, 1.0)
    return requantize(g, g.node("Mul", [x, gate])[0], -0.28, _range(x)[1])


def activation(g: Builder, x: Val) -> Val:
    """Sigmoid, SiLU, HardSwish, Relu or Clip(0, 6)."""
    ops = ["Sigmoid", "SiLU", "SiLU", "Relu", "Clip"] + (["HardSwish"] if g.opset >= 14 else [])
    op = g.choice(ops)
    lo, hi = _range(x)
    if op == "Sigmoid":
        return requantize(g, g.node("Sigmoid", [x])[0], 0.0, 1.0)
    if op == "SiLU":
        return silu(g, x)
    if op == "HardSwish":
        return requantize(g, g.node("HardSwish", [x])[0], -0.375, hi)
    if op == "Relu":
        return requantize(g, g.node("Relu", [x], exact=x.exact)[0], 0.0, hi,
                          exact_step=_grid_step(x))
    bounds = [g.initializer(np.asarray(v, np.float32), "clip", exact=True) for v in (0.0, 6.0)]
    return requantize(g, g.node("Clip", [x] + bounds, exact=x.exact)[0], 0.0, min(hi, 6.0),
                      exact_step=_grid_step(x))


def mbconv(g: Builder, x: Val) -> Val:
    """efficientnet's block: [expansion -> SiLU] -> depthwise -> SiLU -> [squeeze-
    excitation] -> 1x1 projection [+ x], every output requantized: int8 crosses kernels
    between the convs (a conv2d tile's fused QuantizeLinear once wrote past its output)."""
    c = x.shape[1]
    h = x
    if g.chance(0.7):   # the expansion: 1x1, or 3x3 as efficientnetv2's fused blocks
        h = silu(g, conv(g, h, g.choice(["pointwise", "regular"]), c * g.choice([2, 4, 6])))
    h = silu(g, conv(g, h, "depthwise"))
    if g.chance(0.6) and h.shape[1] > 1:
        h = squeeze_excitation(g, h)
    h = conv(g, h, "pointwise", c)
    if h.shape == x.shape and g.chance(0.6):
        (a, b), (lo, hi) = _range(h), _range(x)
        h = requantize(g, g.node("Add", [h, x])[0], a + lo, b + hi)
    return h


def pool(g: Builder, x: Val) -> Val:
    """AveragePool, GlobalAveragePool (new parameters) or MaxPool (x's, as quantize_static
    shares them)."""
    op = g.choice(["AveragePool", "GlobalAveragePool", "MaxPool"])
    lo, hi = _range(x)
    if op == "GlobalAveragePool":
        return requantize(g, g.node(op, [x])[0], lo * 0.5, hi * 0.5)
    k = g.choice([2, 3])
    attrs = {"kernel_shape": [k, k], "strides": [g.choice([1, 2])] * 2}
    if k == 3 and g.chance(0.5):
        attrs["pads"] = [1, 1, 1, 1]
    check_windows(x.shape[2:], attrs)
    if op == "MaxPool":
        y = g.node(op, [x], exact=x.exact, **attrs)[0]
        return requantize(g, y, lo, hi, same_as=x if g.chance(0.7) else None,
                          exact_step=_grid_step(x))
    return requantize(g, g.node(op, [x], **attrs)[0], lo, hi)


def concat(g: Builder, x: Val) -> Val:
    """Concat along the channels with another quantized activation."""
    others = [v for v in g.usable(rounded=True) if v.quant is not None and v.rank == x.rank and
              all(a == 1 or v.shape[a] == x.shape[a] for a in range(x.rank))]
    if others and g.chance(0.5):
        y = g.choice(others)
    else:
        shape = list(x.shape)
        shape[1] = g.size((1, 2, 3, 5))
        y = quantize_input(g, g.add_input(tuple(shape), F32, g.choice(["normal", "grid"])))
    (a, b), (c, d) = _range(x), _range(y)
    out = g.node("Concat", [x, y] if g.chance(0.5) else [y, x], axis=1,
                 exact=x.exact and y.exact)[0]
    step = _grid_step(x) if _grid_step(x) is not None and _grid_step(y) is not None else None
    return requantize(g, out, min(a, c), max(b, d), exact_step=step and
                      max(step, _grid_step(y)))


def reshape(g: Builder, x: Val) -> Val:
    """Flatten or Reshape to [N, -1], requantized with x's parameters or new ones."""
    if g.chance(0.5):
        y = g.node("Flatten", [x], exact=x.exact)[0]
    else:
        y = g.node("Reshape", [x, g.ints([0, -1])], exact=x.exact)[0]
    lo, hi = _range(x)
    return requantize(g, y, lo, hi, same_as=x if g.chance(0.7) else None,
                      exact_step=_grid_step(x))


def squeeze_excitation(g: Builder, x: Val) -> Val:
    """efficientnet's block: GlobalAveragePool -> Conv 1x1 -> SiLU -> Conv 1x1 -> Sigmoid ->
    Mul with the input, every output requantized."""
    c = x.shape[1]
    r = max(1, c // g.choice([2, 4]))
    lo, hi = _range(x)
    pooled = requantize(g, g.node("GlobalAveragePool", [x])[0], lo * 0.5, hi * 0.5)
    excited = _pointwise(g, silu(g, _pointwise(g, pooled, r)), c)
    scale = requantize(g, g.node("Sigmoid", [excited])[0], 0.0, 1.0)
    return requantize(g, g.node("Mul", [x, scale])[0], lo, hi)


def _pointwise(g: Builder, x: Val, m: int) -> Val:
    wq, w_scale = weight(g, (m, x.shape[1], 1, 1), x.shape[1], axis=0)
    y = g.node("Conv", [x, wq, bias(g, m, x, w_scale)], kernel_shape=[1, 1])[0]
    lo, hi = _range(x)
    amax = max(-lo, hi, 1.0)
    return requantize(g, y, -amax, amax)


BLOCKS = [  # (weight, applies to x, block)
    (6, _image, conv), (3, lambda x: x.rank >= 2 and x.static(-1), matmul),
    (2, lambda x: x.rank == 2 and x.static(1), gemm), (4, lambda x: True, add_mul),
    (6, lambda x: True, activation), (2, lambda x: x.rank == 4 and x.static(2) and x.static(3),
                                      pool),
    (2, lambda x: x.rank == 4 and x.static(1), concat),
    (1, lambda x: x.rank >= 2 and all(x.static(i) for i in range(1, x.rank)), reshape),
    (3, lambda x: _image(x) and x.shape[1] > 1, squeeze_excitation), (3, _image, mbconv),
]


def gen_qdq(g: Builder):
    """One to four QDQ blocks in a row from a float value (quantized first) or from a DQ
    value; a new grid input sometimes, for exact ties."""
    x = g.pick(lambda v: not v.nan and v.scale < 1e4 and v.rank >= 1, rounded=True)
    if not g.big and g.chance(0.2):   # wide enough rows for the conv templates' row tiles
        x = g.add_input((g.batch_dim, g.choice([3, 8, 16]), g.choice([16, 20]),
                         g.choice([16, 17, 24])), F32, g.choice(["normal", "grid"]))
    elif x.quant is None and g.chance(0.25):
        x = g.add_input(x.shape, F32, "grid")
    if x.quant is None:
        x = quantize_input(g, x)
    for _ in range(int(g.rng.integers(1, 5))):
        fits = [(w, fn) for w, ok, fn in BLOCKS if ok(x)]
        weights = np.array([w for w, _ in fits], float)
        x = fits[int(g.rng.choice(len(fits), p=weights / weights.sum()))][1](g, x)


# --- dynamic quantization, as quantize_dynamic writes it -------------------------------------

def gen_dynamic(g: Builder):
    """A MatMul as onnxruntime.quantization.quantize_dynamic writes it (issue 33's operator
    format for transformers): DynamicQuantizeLinear of the activation (uint8, its scale and
    zero point from the values' range at run time), MatMulInteger with int8 weights
    (QInt8: symmetric, zero point 0) or uint8 ones (QUInt8: a zero point near 128), per
    tensor or per output column, Cast to float, times the activation's scale times the
    weights'; then a bias Add sometimes.

    The activation is a graph input (sometimes a new one with rows and depth the int8
    product templates take): every correct implementation quantizes it bit for bit (its max
    and min are exact, the scale and zero point follow from them, the rounding is
    half-to-even), the integer product is exact and the two float Muls round once each, so
    the output is compared as any float one. A computed activation would need a rounding
    bound for the run-time scale (rounding.py has none), and at a reduced precision a
    half-stored producer rounds it first; the quantizations of computed values are the
    tests' (bert_tiny's files, on every target and precision)."""
    inputs = {s.name for s in g.inputs}
    x = g.pick(lambda v: v.name in inputs and v.exact and not v.special and v.rank >= 2 and
               v.shape[-1] != BATCH and v.shape[-1] <= 512)
    if g.chance(0.3):   # rows and depth the int8 product templates take
        x = g.add_input((g.batch_dim, g.choice([16, 32, 40]), g.choice([32, 64, 96])), F32)
    k = x.shape[-1]
    n = g.choice([1, 3, 8, 16, 33, 64])
    per_column = g.chance(0.5)
    if g.chance(0.7):   # QInt8 weights
        w = g.rng.integers(-127, 128, (k, n)).astype(np.int8)
        zero = np.zeros(n if per_column else (), np.int8)
    else:               # QUInt8 weights
        w = g.rng.integers(0, 256, (k, n)).astype(np.uint8)
        zero = g.rng.integers(120, 137, n if per_column else ()).astype(np.uint8)
    scale = g.rng.uniform(2e-3, 2e-2, n if per_column else ()).astype(np.float32)
    xq, xs, xz = g.node("DynamicQuantizeLinear", [x], n_out=3)
    both = g.node("Mul", [xs, g.initializer(scale, "w_scale", exact=True)])[0]
    product = g.node("MatMulInteger", [xq, g.initializer(w, "w_quantized", exact=True), xz,
                                       g.initializer(zero, "w_zero_point", exact=True)])[0]
    y = g.node("Mul", [g.node("Cast", [product], to=TensorProto.FLOAT)[0], both],
               scale=float(x.scale))[0]
    if g.chance(0.5):
        bias = g.initializer(g.rng.standard_normal(n).astype(np.float32), "b")
        y = g.node("Add", [y, bias], scale=float(x.scale))[0]
    return y
