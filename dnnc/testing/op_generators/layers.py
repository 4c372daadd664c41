"""Op generators for the layers of real models: convolutions of every kind, MatMul and Gemm,
Softmax, LayerNormalization, BatchNormalization, pools, reductions and Resize.

Each generator `gen_*(g)` appends nodes to the builder `g`, or raises `Rejected` when it cannot
apply. It must never write a layer whose output type ONNX's shape inference and the runtimes
disagree on (`check_windows`: a window larger than its input, a ceil_mode window starting in
the padding), nor one whose rows may be ill-conditioned (LayerNormalization of a constant row),
nor a sum over values that may be huge (`Val.huge`: whether it overflows depends on the order
of its terms).
"""

from __future__ import annotations

import numpy as np

from ..graph_builder import BATCH, F32, Builder, Rejected


def gen_conv(g: Builder):
    x = g.pick(lambda v: v.rank == 4 and all(v.static(i) for i in (1, 2, 3)) and not v.huge)
    c, h, w = x.shape[1:]
    groups = [1] + ([c] if c > 1 else []) + [d for d in range(2, c) if c % d == 0]
    group = g.choice(groups)
    # 40 in big cases: two packed panels and a tail (a 1x1 conv's GEMM packs A for them)
    m = group * g.choice([1, 2]) if group == c and c > 1 else group * g.size((1, 2, 3, 4),
                                                                            (4, 8, 16, 40))
    kh, kw = g.choice([1, 2, 3, 5]), g.choice([1, 3])
    attrs = {"kernel_shape": [kh, kw], "group": group}
    if g.chance(0.3):
        attrs["strides"] = [g.choice([1, 2, 3]), g.choice([1, 2])]
    if g.chance(0.2):
        attrs["dilations"] = [g.choice([1, 2]), g.choice([1, 2])]
    if g.chance(0.2):
        attrs["auto_pad"] = g.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
    elif g.chance(0.6):
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in (kh, kw, kh, kw)]
    check_windows((h, w), attrs)
    wt = g.weight((m, c // group, kh, kw), c // group * kh * kw)
    bias = [g.weight((m,), 1)] if g.chance(0.6) else []
    y = g.node("Conv", [x, wt] + bias, **attrs)[0]
    if g.chance(0.25):   # a BatchNormalization as exporters write it: per-channel Mul, Add
        scale = g.rng.uniform(0.5, 1.5, (m, 1, 1)).astype(np.float32)
        shift = g.rng.standard_normal(g.choice([(m, 1, 1), (1, m, 1, 1), (1,)]))
        y = g.node("Mul", [y, g.initializer(scale)])[0]
        g.node("Add", [g.initializer(shift.astype(np.float32)), y])


def check_windows(sizes, attrs) -> None:
    """Rejects a conv or pool whose (dilated) window is larger than its padded input: ONNX's
    shape inference rounds the negative length up to one output. Also a ceil_mode pool whose
    last window would start in the end padding: onnxruntime, onnx.reference and dnnc drop that
    window, ONNX's shape inference keeps it (seed 77 case 104: AveragePool over width 3,
    stride 3, ceil_mode: inference says 2, every runtime 1), so later types would be wrong."""
    kernel = attrs["kernel_shape"]
    dilations = attrs.get("dilations", [1] * len(kernel))
    pads = attrs.get("pads", [0] * 2 * len(kernel))
    strides = attrs.get("strides", [1] * len(kernel))
    if attrs.get("auto_pad", "NOTSET").startswith("SAME"):
        return
    for i, (n, k, d, s) in enumerate(zip(sizes, kernel, dilations, strides)):
        window, padded = d * (k - 1) + 1, n + pads[i] + pads[i + len(kernel)]
        if padded < window:
            raise Rejected
        last_start = -(-(padded - window) // s) * s   # ceil_mode's last window
        if attrs.get("ceil_mode") and last_start >= n + pads[i]:
            raise Rejected


PRODUCT_WIDTHS_SMALL = (1, 2, 3, 5, 8, 13)
PRODUCT_WIDTHS_BIG = (16, 32, 45, 64, 88)
"""A product's output widths drawn: 45 and 88 make two or more full packed panels and a narrow
last one wider than half a panel, for 16- and 32-column panels (AVX2's and AVX-512's), which
is computed as a whole one."""


def gen_matmul(g: Builder):
    x = g.pick(lambda v: v.rank >= 2 and v.static(-1) and not v.huge)
    k = x.shape[-1]
    if x.rank >= 3 and g.chance(0.3):   # batched, both operands computed
        m = g.size()
        y = g.add_input(tuple(d if g.chance(0.7) else 1 for d in x.shape[:-2]) + (k, m))
        g.node("MatMul", [x, y])
        return
    m = g.size(PRODUCT_WIDTHS_SMALL + (16,), PRODUCT_WIDTHS_BIG)
    g.node("MatMul", [x, g.weight((k, m), k)])


def gen_gemm(g: Builder):
    x = g.pick(lambda v: v.rank == 2 and v.static(1) and not v.huge)
    trans_a = int(x.static(0) and g.chance(0.3))
    n, k = (x.shape[1], x.shape[0]) if trans_a else x.shape
    m = g.size(PRODUCT_WIDTHS_SMALL, PRODUCT_WIDTHS_BIG)
    trans_b = int(g.chance(0.5))
    b = g.weight((m, k) if trans_b else (k, m), k)
    inputs = [x, b]
    if g.chance(0.7):
        cshape = g.choice([(m,), (1, m), ()] + ([(n, m)] if isinstance(n, int) else []))
        inputs.append(g.weight(cshape, 1))
    g.node("Gemm", inputs, transA=trans_a, transB=trans_b, alpha=g.choice([1.0, 0.5]),
           beta=g.choice([1.0, 2.0]))


def gen_softmax(g: Builder):
    x = g.pick(lambda v: v.rank >= 1)
    op = g.choice(["Softmax", "LogSoftmax"])
    y = g.node(op, [x], axis=int(g.rng.integers(-x.rank, x.rank)), scale=2.0)[0]
    y.huge = y.huge and op == "LogSoftmax"   # (Softmax's values are in [0, 1])


def gen_softmax_chain(g: Builder):
    """Softmax over one axis as exporters write it by hand: ReduceMax -> Sub -> Exp ->
    ReduceSum -> Div (special mode: rows holding +-inf, NaN or huge values)."""
    x = g.pick(lambda v: v.rank >= 1)
    axis = int(g.rng.integers(-x.rank, x.rank))

    def reduce(op, v):
        if g.opset >= (13 if op == "ReduceSum" else 18):
            return g.node(op, [v, g.ints([axis])], keepdims=1)[0]
        return g.node(op, [v], axes=[axis], keepdims=1)[0]

    top = reduce("ReduceMax", x)
    e = g.node("Exp", [g.node("Sub", [x, top])[0]])[0]
    e.huge = False   # exp(x - max) is in [0, 1] (or NaN): its sum cannot overflow
    g.node("Div", [e, reduce("ReduceSum", e)], scale=1.0)[0].huge = False


def gen_additive_mask(g: Builder):
    """An attention mask as transformers adds it to the scores before their Softmax:
    Softmax(x + (1 - m) * finfo(float32).min) over the last axis, m a new 0 / 1 input of x's
    last dim (every row keeps its first position). At fp16 and bf16 the constant is past the
    half type's range: stored as -inf, 0 * -inf made every kept score NaN (`store_half`'s
    `half_constant` saturates it). The masked sums, far past any other value's scale, are
    no value's for another generator: only the Softmax's output stays usable."""
    x = g.pick(lambda v: v.rank >= 1 and v.shape[-1] != BATCH and v.shape[-1] > 1 and
               not v.huge)
    shape = tuple(1 if d == BATCH or g.chance(0.5) else d for d in x.shape[:-1])
    m = g.add_input(shape + (x.shape[-1],), kind="mask", hint="mask")
    one = g.initializer(np.float32(1), "one", exact=True)
    lowest = g.initializer(np.finfo(np.float32).min, "lowest", exact=True)
    masked = g.node("Mul", [g.node("Sub", [one, m], exact=True)[0], lowest], exact=True)[0]
    scores = g.node("Add", [x, masked])[0]
    g.node("Softmax", [scores], axis=-1, scale=1.0)
    g.values = [v for v in g.values if v.name not in (masked.name, scores.name)]


def gen_layernorm(g: Builder):
    if g.opset < 17:
        raise Rejected
    x = g.pick(lambda v: v.rank >= 1 and v.static(-1) and not v.huge)
    if x.name not in {s.name for s in g.inputs}:
        # a computed row may be constant (a broadcast, a Where): its rounding in x - mean,
        # divided by sqrt(epsilon), would decide the result. A residual input of x's shape
        # (LayerNorm(x + residual), as in transformers) keeps every row well-conditioned.
        x = g.node("Add", [x, g.add_input(x.shape, F32)])[0]
    axes = [a for a in range(-x.rank, 0) if all(x.static(i) for i in range(a, 0))]
    axis = g.choice(axes)
    inner = x.shape[axis:]
    scale = g.weight(inner, 1)
    bias = [g.weight(inner, 1)] if g.chance(0.7) else []
    g.node("LayerNormalization", [x, scale] + bias, axis=axis,
           epsilon=g.choice([1e-5, 1e-3]), scale=3.0)


def gen_batchnorm(g: Builder):
    x = g.pick(lambda v: v.rank >= 2 and v.static(1))
    c = x.shape[1]
    params = [g.weight((c,), 1), g.weight((c,), 1), g.weight((c,), 1),
              g.initializer(g.rng.uniform(0.5, 2.0, c).astype(np.float32), "var")]
    g.node("BatchNormalization", [x] + params, epsilon=g.choice([1e-5, 1e-3]))


def gen_pool(g: Builder):
    x = g.pick(lambda v: v.rank == 4 and v.static(2) and v.static(3))
    op = g.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    if x.huge and "Average" in op:
        raise Rejected
    if op.startswith("Global"):
        g.node(op, [x], exact=x.exact and op == "GlobalMaxPool")
        return
    k = [g.choice([1, 2, 3]), g.choice([1, 2, 3])]
    attrs = {"kernel_shape": k}
    if g.chance(0.6):
        attrs["strides"] = [g.choice([1, 2]), g.choice([1, 2, 3])]
    if g.chance(0.5):
        attrs["pads"] = [int(g.rng.integers(0, kk)) for kk in k + k]
    if g.chance(0.2):
        attrs["ceil_mode"] = 1
    if op == "MaxPool" and g.chance(0.2):
        attrs["dilations"] = [g.choice([1, 2]), 1]
    if op == "AveragePool" and g.chance(0.4):
        attrs["count_include_pad"] = 1
    check_windows(x.shape[2:], attrs)
    g.node(op, [x], exact=x.exact and op == "MaxPool", **attrs)


REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2")
AXES_AS_INPUT_SINCE = {"ReduceSum": 13}   # the others take axes as an input from opset 18


def gen_reduce(g: Builder):
    x = g.pick(lambda v: v.rank >= 1)
    op = g.choice(REDUCE)
    axes = sorted(set(int(a) for a in g.rng.integers(0, x.rank, g.choice([1, 1, 2, 3]))))
    all_axes = g.chance(0.25)
    if g.chance(0.3):
        axes = [a - x.rank for a in axes]
    keep = int(g.chance(0.5))
    exact = x.exact and op in ("ReduceMax", "ReduceMin")
    if op in ("ReduceSum", "ReduceL2", "ReduceMean") and (x.scale > 100 or x.huge):
        raise Rejected
    scale = x.scale * (g.numel(x) if op == "ReduceSum" else 1)
    if all_axes:
        g.node(op, [x], keepdims=keep, exact=exact, scale=scale)
    elif g.opset >= AXES_AS_INPUT_SINCE.get(op, 18):
        g.node(op, [x, g.ints(axes)], keepdims=keep, exact=exact, scale=scale)
    else:
        g.node(op, [x], axes=axes, keepdims=keep, exact=exact, scale=scale)


RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_COORDS = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def gen_resize(g: Builder):
    x = g.pick(lambda v: v.rank == 4 and v.static(2) and v.static(3))
    mode = g.choice(RESIZE_MODES)
    if x.huge and mode != "nearest":
        raise Rejected
    attrs = {"mode": mode,
             "coordinate_transformation_mode": g.choice(RESIZE_COORDS)}
    if mode == "nearest":
        attrs["nearest_mode"] = g.choice(NEAREST_MODES)
    if mode == "cubic":
        attrs["cubic_coeff_a"] = g.choice([-0.75, -0.5])
    if g.chance(0.5):
        scales = [1.0, 1.0] + [g.choice([0.5, 2.0, 1.5, 0.75, 3.0, 0.6]) for _ in range(2)]
        inputs = [x, None, g.initializer(np.asarray(scales, np.float32), "scales")]
    else:
        if not (x.static(0) and x.static(1)):
            raise Rejected   # sizes would fix the batch
        sizes = [x.shape[0], x.shape[1], g.choice([1, 2, 3, 5, 7, 9]),
                 g.choice([1, 2, 4, 6, 11])]
        inputs = [x, None, None, g.ints(sizes)]
    g.node("Resize", inputs, exact=x.exact and mode == "nearest", **attrs)
