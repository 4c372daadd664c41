"""Recurrent ops: RNN, LSTM, GRU (ONNX opset 22 semantics).

All three share one recurrence driver: directions forward, reverse or bidirectional,
`sequence_lens` (steps past a batch entry's length leave its state unchanged and write zeros to
Y; a reverse pass starts at the entry's last valid step), initial states, `layout` 0
([seq, batch, ...]) or 1 ([batch, seq, ...]), and the optional Y / Y_h / Y_c outputs. Each op
supplies only its cell: one time step from (x_t, state) to the new state.
Activations are named as in ONNX and take `activation_alpha` / `activation_beta` in order,
only the functions that use them consuming values (as onnxruntime reads them).
float16 and bfloat16 run in float32 and are cast back.

No compute rule gives them loops: each time step reads the state the previous one wrote, which
one loop nest of independent output elements cannot say, so they raise NoCompute and run as
host fallbacks (until lowering grows a sequential time loop or a Scan of cells).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..compute import NoCompute
from ..types import TensorType
from .infer import check_dtype
from ..flops import Count
from .registry import Pattern, register_op

FLOATS = T.FLOAT_DTYPES


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# name -> (function of (x, alpha, beta), default alpha or None if unused, default beta or None)
ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: _sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x > 0, x, a * np.expm1(np.minimum(x, 0))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}

# gates per cell and the activation functions each cell applies by default
CELLS = {"RNN": (1, ["Tanh"]), "LSTM": (4, ["Sigmoid", "Tanh", "Tanh"]),
         "GRU": (3, ["Sigmoid", "Tanh"])}


def _directions(direction: str) -> int:
    return 2 if direction == "bidirectional" else 1


def activation_functions(names, alphas, betas, num_directions: int, per_direction: int):
    """Per direction, the list of activation callables (alpha and beta bound)."""
    if len(names) == per_direction and num_directions == 2:
        names = list(names) * 2
    alphas, betas = list(alphas or []), list(betas or [])
    funcs = []
    for name in names:
        fn, alpha, beta = ACTIVATIONS[name.lower()]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        funcs.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    return [funcs[d * per_direction:(d + 1) * per_direction] for d in range(num_directions)]


# -- shape inference -------------------------------------------------------------------------


def _rnn_infer(op: str, initial_inputs: tuple[int, ...]):
    gates, default_acts = CELLS[op]

    def infer(ctx):
        attrs = ctx.attrs
        if attrs["direction"] not in ("forward", "reverse", "bidirectional"):
            raise ctx.fail(f"direction must be forward, reverse or bidirectional, given "
                           f"{attrs['direction']!r}")
        if attrs["layout"] not in (0, 1):
            raise ctx.fail(f"layout must be 0 or 1, given {attrs['layout']!r}")
        dirs = _directions(attrs["direction"])
        names = attrs["activations"] if attrs["activations"] is not None else default_acts
        unknown = [n for n in names if n.lower() not in ACTIVATIONS]
        if unknown:
            raise ctx.fail(f"unsupported activation(s) {unknown}; supported: "
                           f"{sorted(ACTIVATIONS)}")
        if len(names) not in (len(default_acts), len(default_acts) * dirs):
            raise ctx.fail(f"activations must list {len(default_acts) * dirs} functions, "
                           f"given {names}")
        check_dtype(ctx, 0, FLOATS, "X")
        for i in range(1, len(ctx.inputs)):
            if ctx.has(i) and i != 4:
                check_dtype(ctx, i, (ctx.dtype(0),), "must match X")
        check_dtype(ctx, 4, (T.int32, T.int64), "sequence_lens")
        x, w, r = ctx.type(0), ctx.type(1), ctx.type(2)
        if x.rank != 3 or w.rank != 3 or r.rank != 3:
            raise ctx.fail(f"X, W and R must have rank 3, given {x}, {w}, {r}")
        seq, batch = x.shape[:2] if attrs["layout"] == 0 else x.shape[1::-1]
        hidden = attrs["hidden_size"] if attrs["hidden_size"] is not None else r.shape[2]
        expect = {1: (dirs, T.dim_mul(gates, hidden), x.shape[2]),
                  2: (dirs, T.dim_mul(gates, hidden), hidden),
                  3: (dirs, T.dim_mul(2 * gates, hidden)),
                  4: (batch,)}
        for i in initial_inputs:
            expect[i] = (dirs, batch, hidden) if attrs["layout"] == 0 else (batch, dirs, hidden)
        if op == "LSTM":
            expect[7] = (dirs, T.dim_mul(3, hidden))
        for i, shape in expect.items():
            if ctx.has(i) and not _compatible(ctx.shape(i), shape):
                raise ctx.fail(f"input {i} has shape {list(ctx.shape(i))}, expected "
                               f"{list(shape)} (hidden_size {hidden}, {dirs} direction(s))")
        if attrs["layout"] == 0:
            y, state = (seq, dirs, batch, hidden), (dirs, batch, hidden)
        else:
            y, state = (batch, seq, dirs, hidden), (batch, dirs, hidden)
        return [TensorType(x.dtype, y)] + [TensorType(x.dtype, state)] * (len(initial_inputs))

    return infer


def _compatible(given, expected) -> bool:
    if len(given) != len(expected):
        return False
    return all(not (isinstance(g, int) and isinstance(e, int)) or g == e
               for g, e in zip(given, expected))


# -- the recurrence --------------------------------------------------------------------------


def run_recurrence(x, states, cells, direction, layout, sequence_lens):
    """Drive `cells[d](x_t, state) -> state` over time; returns Y and the final states.

    x is [seq, batch, input] (after layout), states a tuple of [dirs, batch, hidden] arrays;
    state[0] is the hidden state written to Y.
    """
    seq, batch = x.shape[:2]
    dirs = len(cells)
    lens = np.full(batch, seq) if sequence_lens is None else sequence_lens.astype(np.int64)
    hidden = states[0].shape[-1]
    y = np.zeros((seq, dirs, batch, hidden), dtype=x.dtype)
    finals = []
    for d, cell in enumerate(cells):
        reverse = direction == "reverse" or d == 1
        state = tuple(s[d] for s in states)
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            active = (t < lens)[:, None]
            new = cell(x[t], state)
            state = tuple(np.where(active, n, s) for n, s in zip(new, state))
            y[t, d] = np.where(active, new[0], 0)
        finals.append(state)
    final = [np.stack([f[k] for f in finals]) for k in range(len(states))]
    return y, final


def _recurrent_op(op: str, make_cell, x, w, r, b, sequence_lens, initial, extra, attrs):
    """Shared evaluate: layout, defaults, the cells per direction, the recurrence, casts."""
    gates, default_acts = CELLS[op]
    layout, direction = attrs["layout"], attrs["direction"]
    dirs = _directions(direction)
    dtype = x.dtype
    wide = np.float64 if dtype == np.float64 else np.float32
    x, w, r = (a.astype(wide) for a in (x, w, r))
    if layout == 1:
        x = x.swapaxes(0, 1)
    seq, batch = x.shape[:2]
    hidden = r.shape[2]
    b = np.zeros((dirs, 2 * gates * hidden), wide) if b is None else b.astype(wide)
    states = []
    for s in initial:
        if s is None:
            s = np.zeros((dirs, batch, hidden), wide)
        else:
            s = s.astype(wide)
            if layout == 1:
                s = s.swapaxes(0, 1)
        states.append(s)
    names = attrs["activations"] if attrs["activations"] is not None else default_acts
    acts = activation_functions(names, attrs["activation_alpha"], attrs["activation_beta"],
                                dirs, len(default_acts))
    clip = attrs["clip"]

    def clipped(v):
        return v if clip is None else np.clip(v, -clip, clip)

    cells = [make_cell(w[d], r[d], b[d], acts[d], clipped, d, extra) for d in range(dirs)]
    y, final = run_recurrence(x, tuple(states), cells, direction, layout, sequence_lens)
    if layout == 1:
        y = y.transpose(2, 0, 1, 3)
        final = [f.swapaxes(0, 1) for f in final]
    return tuple(a.astype(dtype) for a in [y] + final)


def _recurrence_rule(op: str):
    def rule(inputs, outputs, **attrs):
        raise NoCompute(f"{op}: a recurrence over time steps (each step reads the state the "
                        f"previous one wrote) is not one loop nest; it runs as a host fallback")

    return rule


_COMMON_ATTRS = {"activation_alpha": None, "activation_beta": None, "activations": None,
                 "clip": None, "direction": "forward", "hidden_size": None, "layout": 0}

# -- RNN ------------------------------------------------------------------------------------------


def _rnn_cell(w, r, b, acts, clipped, d, extra):
    bias = b[:len(b) // 2] + b[len(b) // 2:]
    (f,) = acts

    def step(x_t, state):
        return (f(clipped(x_t @ w.T + state[0] @ r.T + bias)),)

    return step


def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, **attrs):
    return _recurrent_op("RNN", _rnn_cell, x, w, r, b, sequence_lens, [initial_h], None, attrs)


def _recurrent_flops(node) -> Count:
    """Per step and batch row, 2 x (W and R elements) over every direction."""
    x, w, r = node.inputs[:3]
    return 2 * Count.of(x.shape[:2]) * (Count.of(w.shape) + Count.of(r.shape))


register_op("RNN", pattern=Pattern.OPAQUE, infer=_rnn_infer("RNN", (5,)), evaluate=rnn,
            inputs=(3, 6), outputs=(1, 2), attrs=dict(_COMMON_ATTRS),
            compute=_recurrence_rule("RNN"), flops=_recurrent_flops)

# -- LSTM -----------------------------------------------------------------------------------------


def _lstm_cell(w, r, b, acts, clipped, d, extra):
    peepholes, input_forget = extra
    hidden = r.shape[1]
    bias = b[:len(b) // 2] + b[len(b) // 2:]
    p = np.zeros(3 * hidden, w.dtype) if peepholes is None else peepholes[d].astype(w.dtype)
    p_i, p_o, p_f = np.split(p, 3)
    f, g, h = acts

    def step(x_t, state):
        h_prev, c_prev = state
        i, o, fg, c = np.split(x_t @ w.T + h_prev @ r.T + bias, 4, axis=-1)  # gate order iofc
        i = f(clipped(i + p_i * c_prev))
        fg = 1 - i if input_forget else f(clipped(fg + p_f * c_prev))
        c = fg * c_prev + i * g(clipped(c))
        o = f(clipped(o + p_o * c))
        return o * h(c), c

    return step


def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
         input_forget=0, **attrs):
    return _recurrent_op("LSTM", _lstm_cell, x, w, r, b, sequence_lens, [initial_h, initial_c],
                         (p, input_forget), attrs)


register_op("LSTM", pattern=Pattern.OPAQUE, infer=_rnn_infer("LSTM", (5, 6)), evaluate=lstm,
            inputs=(3, 8), outputs=(1, 3), attrs={**_COMMON_ATTRS, "input_forget": 0},
            compute=_recurrence_rule("LSTM"), flops=_recurrent_flops)

# -- GRU ------------------------------------------------------------------------------------------


def _gru_cell(w, r, b, acts, clipped, d, linear_before_reset):
    w_zr, w_h = w[:2 * len(w) // 3], w[2 * len(w) // 3:]
    r_zr, r_h = r[:2 * len(r) // 3], r[2 * len(r) // 3:]
    wb, rb = np.split(b, 2)
    wb_zr, wb_h = np.split(wb, [2 * len(wb) // 3])
    rb_zr, rb_h = np.split(rb, [2 * len(rb) // 3])
    f, g = acts

    def step(x_t, state):
        (h_prev,) = state
        z, rg = np.split(f(clipped(x_t @ w_zr.T + h_prev @ r_zr.T + wb_zr + rb_zr)), 2, axis=-1)
        if linear_before_reset:
            candidate = x_t @ w_h.T + wb_h + rg * (h_prev @ r_h.T + rb_h)
        else:
            candidate = x_t @ w_h.T + wb_h + (rg * h_prev) @ r_h.T + rb_h
        return ((1 - z) * g(clipped(candidate)) + z * h_prev,)

    return step


def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, linear_before_reset=0, **attrs):
    return _recurrent_op("GRU", _gru_cell, x, w, r, b, sequence_lens, [initial_h],
                         linear_before_reset, attrs)


register_op("GRU", pattern=Pattern.OPAQUE, infer=_rnn_infer("GRU", (5,)), evaluate=gru,
            inputs=(3, 6), outputs=(1, 2), attrs={**_COMMON_ATTRS, "linear_before_reset": 0},
            compute=_recurrence_rule("GRU"), flops=_recurrent_flops)
