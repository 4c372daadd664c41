"""Op generators for elementwise ops: activations, Exp, GELU as exported, Clip, broadcasting
float and integer arithmetic, Where over a comparison, and Cast.

Each generator `gen_*(g)` appends nodes to the builder `g`, or raises `Rejected` when it cannot
apply to the values at hand. It must never produce what the spec leaves undefined or
ill-conditioned: divisions by values near zero, integer overflow or division by zero, Exp or
Pow out of range (`Val.scale` bounds magnitudes), or comparisons and casts of values computed
with rounding (only `Val.exact` ones).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from ..graph_builder import BOOL, F32, I32, I64, ONNX_DTYPE, Builder, Rejected, broadcastable


UNARY = {  # op -> attrs drawn per node
    "Relu": lambda g: {}, "Sigmoid": lambda g: {}, "Tanh": lambda g: {}, "Abs": lambda g: {},
    "Neg": lambda g: {}, "Erf": lambda g: {}, "Softplus": lambda g: {},
    "Elu": lambda g: {"alpha": g.choice([1.0, 0.5])},
    "LeakyRelu": lambda g: {"alpha": g.choice([0.01, 0.2])},
    "HardSigmoid": lambda g: {"alpha": g.choice([0.2, 1 / 6]), "beta": 0.5},
    "HardSwish": lambda g: {},
}
EXACT_UNARY = {"Relu", "Abs", "Neg"}


def gen_unary(g: Builder):
    x = g.pick()
    op = g.choice(sorted(UNARY))
    g.node(op, [x], exact=x.exact and op in EXACT_UNARY, **UNARY[op](g))


def gen_exp(g: Builder):
    x = g.pick(lambda v: v.scale <= 3)
    g.node("Exp", [x], scale=math.exp(3 * x.scale))


def gen_gelu(g: Builder):
    """GELU as exported (x * 0.5 * (1 + erf(x / sqrt 2))), which simplify recognises; the
    Gelu op itself from opset 20. Never of huge values: simplify's Gelu differs from the
    exported graph where x * (1 + erf) overflows (x > FLT_MAX / 2; docs/semantics.md)."""
    x = g.pick(lambda v: not v.huge)
    if g.opset >= 20 and g.chance(0.3):
        g.node("Gelu", [x], approximate=g.choice(["none", "tanh"]))
        return
    d = g.node("Div", [x, g.const_node(np.float32(math.sqrt(2)))])[0]
    e = g.node("Erf", [d])[0]
    a = g.node("Add", [e, g.const_node(np.float32(1))])[0]
    m = g.node("Mul", [x, a])[0]
    g.node("Mul", [m, g.const_node(np.float32(0.5))])


def gen_clip(g: Builder):
    x = g.pick()
    lo = g.const_node(np.float32(g.choice([-1.0, 0.0, -0.5]))) if g.chance(0.8) else None
    hi = g.const_node(np.float32(g.choice([1.0, 6.0, 0.5]))) if g.chance(0.8) else None
    g.node("Clip", [x, lo, hi] if hi is not None else [x, lo], exact=x.exact)


def gen_binary(g: Builder):
    x = g.pick()
    op = g.choice(["Add", "Sub", "Mul", "Max", "Min", "Div", "Pow"])
    if op == "Div":
        y = g.broadcast_partner(x, kind="away_from_zero")
        g.node("Div", [x, y], scale=x.scale * 2)
    elif op == "Pow":   # a positive base (|x| + 0.5) and a small constant exponent
        if x.scale > 4:
            raise Rejected
        base = g.node("Add", [g.node("Abs", [x])[0], g.const_node(np.float32(0.5))])[0]
        exp = g.choice([2.0, 3.0, 0.5, -1.0, 1.5])
        g.node("Pow", [base, g.const_node(np.float32(exp))], scale=(x.scale + 0.5) ** 2)
    else:
        y = x if g.chance(0.1) else g.broadcast_partner(x)
        pair = [x, y] if g.chance(0.7) else [y, x]
        scale = x.scale * y.scale if op == "Mul" else x.scale + y.scale
        if scale > 1e4:
            raise Rejected
        g.node(op, pair, exact=x.exact and y.exact and op in ("Max", "Min"), scale=scale)


def gen_int(g: Builder):
    """Integer arithmetic: from an int input, a Cast of an exact float, or an int value."""
    dtype = g.choice([I32, I64])
    # (never from special values: MIN // -1 traps in onnxruntime, MIN * 9 overflows)
    ints = [v for v in g.usable() if v.dtype == dtype and not v.special]
    if not ints or g.chance(0.3):
        src = [v for v in g.usable() if v.dtype == F32 and v.exact and v.scale < 100 and
               not v.special]
        if src and g.chance(0.5):
            x = g.node("Cast", [g.choice(src)], to=ONNX_DTYPE[dtype], exact=True)[0]
        else:
            shape = g.choice([v.shape for v in g.values if v.dtype == F32] or [(3, 4)])
            x = g.add_input(shape, dtype, "int")
    else:
        x = ints[-1]
    op = g.choice(["Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Abs", "Neg"])
    if op in ("Abs", "Neg"):
        out = g.node(op, [x], exact=True)[0]
    elif op in ("Div", "Mod"):
        y = g.broadcast_partner(x, kind="nonzero_int")
        attrs = {"fmod": int(g.chance(0.5))} if op == "Mod" else {}
        out = g.node(op, [x, y], exact=True, scale=x.scale, **attrs)[0]
    else:
        y = g.broadcast_partner(x, kind="int")
        scale = x.scale * y.scale if op == "Mul" else x.scale + y.scale
        if scale > 1 << 20:   # no overflow: products stay far below 2**31
            raise Rejected
        out = g.node(op, [x, y], exact=True, scale=scale)[0]
    if g.chance(0.4):   # back to float so float ops consume it
        g.node("Cast", [out], to=TensorProto.FLOAT, exact=True)


def gen_where(g: Builder):
    a = g.pick(lambda v: v.exact, dtype=None)
    if a.dtype == BOOL:
        raise Rejected
    b = g.broadcast_partner(a, kind="int" if a.dtype != F32 else "normal")
    cond = g.node(g.choice(["Greater", "Less", "Equal", "GreaterOrEqual"]), [a, b],
                  exact=True)[0]
    x = g.pick(lambda v: broadcastable(v.shape, cond.shape) or
               broadcastable(cond.shape, v.shape))
    y = g.broadcast_partner(x)
    g.node("Where", [cond, x, y], exact=x.exact and y.exact)


SPECIAL_CASTS = [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                       np.uint32, np.int64, np.uint64, np.bool_)]
"""What special mode casts floats to: every integer type (docs/semantics.md defines NaN,
+-inf and out of range); the narrow and unsigned ones are leaves no generator picks."""


def gen_cast(g: Builder):
    x = g.pick(dtype=None)
    if x.dtype == F32:
        if not x.exact or x.scale > 1e6:
            raise Rejected   # rounding of a computed float may differ
        to = g.choice(SPECIAL_CASTS) if g.special and x.special else g.choice([I32, I64])
    else:
        to = F32
    g.node("Cast", [x], to=ONNX_DTYPE[to], exact=True)
