"""Signal ops: DFT, STFT, the Hann/Hamming/Blackman windows, MelWeightMatrix.

Complex tensors are real tensors whose last dim holds (real, imaginary) pairs; real signals have a
last dim of 1. References transform with NumPy's FFT in the input's precision (complex64 for
float32 and narrower, complex128 for float64, as onnx's reference) and cast back to the input's
element type; window and mel generators produce their `output_datatype` exactly.

Compute rules: DFT and STFT are direct transforms, a `reduce_sum` over the signal with the
twiddle factor computed in the expression (its angle reduced modulo the length in integers first,
so float32 cos/sin stay accurate), summed in float32 (float64 for float64), cast back once.
Lengths, axes and steps must be constants; the windows need a constant size.
"""

from __future__ import annotations

import numpy as np

import itertools
import math

from .. import types as T
from ..compute import NoCompute, compute, dim_expr, reduce_axis, reduce_sum
from ..loop import Cast, Const, Select, call, const, eq, free_vars, logical_or, minimum
from .infer import check_dtype
from .registry import Pattern, register_op

FLOATS = T.FLOAT_DTYPES
INDEX = (T.int32, T.int64)
NUMERIC = T.FLOAT_DTYPES + T.INT_DTYPES


def _scalar(ctx, i: int, what: str):
    """Input i's value as a Python int when known at compile time, else None."""
    value = ctx.value(i)
    if value is None:
        return None
    if value.size != 1:
        raise ctx.fail(f"{what} must be a scalar, given {ctx.type(i)}")
    return int(value.reshape(-1)[0])


def _size(ctx, i: int, what: str, hint: str):
    """A size input as a dim: its value when known, else a fresh symbolic dim."""
    value = _scalar(ctx, i, what)
    if value is not None and value < 0:
        raise ctx.fail(f"{what} must not be negative, given {value}")
    return ctx.fresh_dim(hint) if value is None else value


# -- compute-rule helpers ------------------------------------------------------------------------

_stage_ids = itertools.count()


def _stage(hint: str) -> str:
    """A unique name for a rule's stage or reduce axis (two nodes may share one kernel)."""
    return f"{hint}{next(_stage_ids)}"


def _input(inputs, i):
    """Input i's Tensor, None when absent (lowering passes trailing absent inputs too)."""
    return inputs[i] if i < len(inputs) else None


def _const_scalar(t, op: str, what: str) -> int:
    if t.value is None:
        raise NoCompute(f"{op}'s {what} is known only at run time")
    return int(np.asarray(t.value).reshape(-1)[0])


def _check_bound(out: T.TensorType, inputs, op: str):
    """NoCompute when an output dim is a fresh symbol that no input's shape defines (a length
    known only at run time): no kernel argument could give its value."""
    known = set()
    for t in inputs:
        if t is not None:
            for d in t.shape:
                known |= free_vars(d)
    if any(free_vars(dim_expr(d)) - known for d in out.shape):
        raise NoCompute(f"{op}'s output shape {out.shape} is known only at run time")


def _as(dtype: T.DType, e):
    return e if e.dtype is dtype else Cast(dtype, e)


def _angle(k, m, n, dtype: T.DType):
    """2 pi (k m mod n) / n: the product is reduced in integers first, so cos and sin see
    angles in [0, 2 pi) and float32 keeps its accuracy for long transforms."""
    p = Cast(dtype, (k * m) % n)
    if isinstance(n, int):
        return p * (2 * math.pi / n)
    return p * (2 * math.pi) / Cast(dtype, n)


def _rotated(xr, xi, angle, sign: int):
    """(real, imaginary) of (xr + i xi) e^(sign i angle); xi None for a real signal."""
    cos, sin = call("cos", angle), call("sin", angle)
    if xi is None:
        im = xr * sin
        return xr * cos, im if sign > 0 else -im
    if sign > 0:
        return xr * cos - xi * sin, xi * cos + xr * sin
    return xr * cos + xi * sin, xi * cos - xr * sin


# -- DFT -----------------------------------------------------------------------------------------


def _as_complex(x):
    x = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]


def _as_pairs(z):
    return np.stack([z.real, z.imag], axis=-1)


def _check_axis(ctx, axis: int, rank: int) -> int:
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ctx.fail(f"axis {axis} is out of range for rank {rank} (the last dim holds "
                       f"complex parts)")
    return axis % rank


def dft(x, dft_length=None, axis=None, inverse=0, onesided=0):
    axis = -2 if axis is None else int(np.asarray(axis).reshape(-1)[0])
    if not (-x.ndim <= axis <= -2 or 0 <= axis <= x.ndim - 2):
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    irfft = bool(inverse and onesided)
    if dft_length is not None:
        n = int(np.asarray(dft_length).reshape(-1)[0])
    else:
        n = 2 * (x.shape[axis] - 1) if irfft else x.shape[axis]
    signal = _as_complex(x)
    if irfft:
        return np.fft.irfft(signal, n, axis=axis)[..., None].astype(x.dtype)
    if inverse:
        return _as_pairs(np.fft.ifft(signal, n, axis=axis)).astype(x.dtype)
    z = np.fft.fft(signal, n, axis=axis)
    if onesided:
        z = np.take(z, np.arange(n // 2 + 1), axis=axis)
    return _as_pairs(z).astype(x.dtype)


def _dft_infer(ctx):
    a = ctx.attrs
    check_dtype(ctx, 0, FLOATS)
    check_dtype(ctx, 1, INDEX, "dft_length")
    check_dtype(ctx, 2, (T.int64,), "axis")
    shape = list(ctx.shape(0))
    rank = len(shape)
    if rank < 2 or isinstance(shape[-1], int) and shape[-1] not in (1, 2):
        raise ctx.fail(f"input must end in a dim of 1 (real) or 2 (complex), given "
                       f"{ctx.type(0)}")
    irfft = bool(a["inverse"] and a["onesided"])
    if irfft and shape[-1] == 1:
        raise ctx.fail("an inverse one-sided DFT needs complex input")
    axis = _scalar(ctx, 2, "axis") if ctx.has(2) else -2
    if axis is None:  # known only at run time: the transformed dim may be any signal dim
        if ctx.has(1) or a["onesided"]:
            shape[:-1] = [ctx.fresh_dim("dft") for _ in shape[:-1]]
        shape[-1] = 1 if irfft else 2
        return [T.TensorType(ctx.dtype(0), tuple(shape))]
    axis = _check_axis(ctx, axis, rank)
    if ctx.has(1):
        n = _size(ctx, 1, "dft_length", "dft")
    elif irfft:
        n = T.dim_mul(2, T.dim_sub(shape[axis], 1))
    else:
        n = shape[axis]
    if a["onesided"] and not a["inverse"]:
        shape[axis] = n // 2 + 1 if isinstance(n, int) else ctx.fresh_dim("dft")
    else:
        shape[axis] = n
    shape[-1] = 1 if irfft else 2
    return [T.TensorType(ctx.dtype(0), tuple(shape))]


def _dft_rule(inputs, outputs, inverse, onesided, **_):
    """out[.., k, .., c] = sum_m x[.., m, ..] e^(-+2 pi i k m / n), component c of it; the
    inverse one-sided form sums the Hermitian half spectrum (bins other than DC and Nyquist
    twice, the imaginary parts of those two ignored, as numpy's irfft)."""
    x, out = inputs[0], outputs[0]
    length, axis_input = _input(inputs, 1), _input(inputs, 2)
    _check_bound(out, inputs, "DFT")
    axis = -2 if axis_input is None else _const_scalar(axis_input, "DFT", "axis")
    axis %= x.ndim
    if not isinstance(x.shape[-1], Const):
        raise NoCompute("DFT of a signal whose last dim (real or complex) is symbolic")
    complex_in = x.shape[-1].value == 2
    irfft = bool(inverse and onesided)
    given = x.shape[axis]
    if length is not None:
        n = _const_scalar(length, "DFT", "dft_length")
    elif isinstance(given, Const):
        n = 2 * (given.value - 1) if irfft else given.value
    elif irfft:
        raise NoCompute("inverse one-sided DFT of a symbolic length")
    else:
        n = given  # a symbolic length transformed whole
    if isinstance(n, int) and n <= 0:
        raise NoCompute(f"DFT of length {n}")
    used = n // 2 + 1 if irfft else n  # the input is truncated or zero-padded to this
    if isinstance(given, Const):
        extent = min(used, given.value)
    else:
        extent = given if used is given else minimum(given, const(used))
    # twiddles and sums in float64: a direct O(n^2) sum in float32 strays ~1e-5 from the
    # FFT's result on near-zero outputs
    cdt = T.float64
    m = reduce_axis(extent, _stage("dft_m"))

    def element(*idx):
        src = list(idx[:-1])
        src[axis] = m.var
        xr = _as(cdt, x[tuple(src) + (const(0),)])
        xi = _as(cdt, x[tuple(src) + (const(1),)]) if complex_in else None
        angle = _angle(idx[axis], m.var, n, cdt)
        if irfft:
            edge = logical_or(eq(m.var, 0), eq(m.var * 2, n))
            re = xr * call("cos", angle) * Select(edge, const(1.0 / n, cdt), const(2.0 / n, cdt))
            im = xi * call("sin", angle) * Select(edge, const(0.0, cdt), const(2.0 / n, cdt))
            return reduce_sum(re - im, m)
        re, im = _rotated(xr, xi, angle, 1 if inverse else -1)
        term = Select(eq(idx[-1], 0), re, im)
        if inverse:
            term = term * (1.0 / n) if isinstance(n, int) else term / Cast(cdt, n)
        return reduce_sum(term, m)

    return [compute(out.shape, element, name=_stage("dft"), dtype=out.dtype)]


register_op("DFT", pattern=Pattern.OPAQUE, infer=_dft_infer, evaluate=dft, inputs=(1, 3),
            attrs={"inverse": 0, "onesided": 0}, compute=_dft_rule, params=(1, 2))


# -- STFT ----------------------------------------------------------------------------------------


def stft(signal, frame_step, window=None, frame_length=None, onesided=1):
    length = signal.shape[1]
    if frame_length is not None:
        size = int(np.asarray(frame_length).reshape(-1)[0])
    else:
        size = length if window is None else window.shape[0]
    step = int(np.asarray(frame_step).reshape(-1)[0])
    frames = 1 + (length - size) // step
    starts = np.arange(frames)[:, None] * step + np.arange(size)[None, :]
    framed = _as_complex(signal)[:, starts]  # [batch, frames, size]
    if window is not None:
        framed = framed * window.astype(framed.real.dtype)
    z = np.fft.fft(framed, size, axis=-1)
    if onesided:
        z = z[..., :size // 2 + 1]
    return _as_pairs(z).astype(signal.dtype)


def _stft_infer(ctx):
    check_dtype(ctx, 0, FLOATS)
    check_dtype(ctx, 1, INDEX, "frame_step")
    check_dtype(ctx, 2, FLOATS, "window")
    check_dtype(ctx, 3, INDEX, "frame_length")
    shape = ctx.shape(0)
    if len(shape) != 3 or isinstance(shape[-1], int) and shape[-1] not in (1, 2):
        raise ctx.fail(f"signal must be [batch, length, 1 or 2], given {ctx.type(0)}")
    if ctx.has(2) and ctx.type(2).rank != 1:
        raise ctx.fail(f"window must be 1-D, given {ctx.type(2)}")
    if ctx.has(3):
        size = _size(ctx, 3, "frame_length", "frame")
    else:
        size = ctx.shape(2)[0] if ctx.has(2) else shape[1]
    if ctx.has(2) and isinstance(size, int) and isinstance(ctx.shape(2)[0], int) and \
            ctx.shape(2)[0] != size:
        raise ctx.fail(f"window length {ctx.shape(2)[0]} differs from frame_length {size}")
    step = _scalar(ctx, 1, "frame_step")
    if step is not None and step <= 0:
        raise ctx.fail(f"frame_step must be positive, given {step}")
    if isinstance(shape[1], int) and isinstance(size, int) and step is not None:
        frames = 1 + (shape[1] - size) // step
    elif shape[1] == size:
        frames = 1
    else:
        frames = ctx.fresh_dim("frames")
    if not ctx.attrs["onesided"]:
        bins = size
    else:
        bins = size // 2 + 1 if isinstance(size, int) else ctx.fresh_dim("bins")
    return [T.TensorType(ctx.dtype(0), (shape[0], frames, bins, 2))]


def _stft_rule(inputs, outputs, onesided, **_):
    """out[b, f, k, c] = sum_m window[m] signal[b, f step + m] e^(-2 pi i k m / size), as DFT
    over each frame (frames never read past the signal: their count is 1 + (L - size) // step)."""
    signal, step_input, window, length = (_input(inputs, i) for i in range(4))
    out = outputs[0]
    _check_bound(out, inputs, "STFT")
    step = _const_scalar(step_input, "STFT", "frame_step")
    if length is not None:
        size = _const_scalar(length, "STFT", "frame_length")
    else:
        size = window.shape[0] if window is not None else signal.shape[1]
        if not isinstance(size, Const):
            raise NoCompute("STFT with a symbolic frame length")
        size = size.value
    if size <= 0:
        raise NoCompute(f"STFT with frame length {size}")
    complex_in = signal.shape[-1] == const(2)
    cdt = T.float64  # as the DFT rule: a direct sum in float32 strays from the FFT
    m = reduce_axis(size, _stage("stft_m"))

    def element(b, f, k, c):
        at = f * step + m.var
        xr = _as(cdt, signal[b, at, 0])
        xi = _as(cdt, signal[b, at, 1]) if complex_in else None
        if window is not None:
            w = _as(cdt, window[m.var])
            xr, xi = xr * w, None if xi is None else xi * w
        re, im = _rotated(xr, xi, _angle(k, m.var, size, cdt), -1)
        return reduce_sum(Select(eq(c, 0), re, im), m)

    return [compute(out.shape, element, name=_stage("stft"), dtype=out.dtype)]


register_op("STFT", pattern=Pattern.OPAQUE, infer=_stft_infer, evaluate=stft, inputs=(2, 4),
            attrs={"onesided": 1}, compute=_stft_rule, params=(1, 2))


# -- windows -------------------------------------------------------------------------------------


def _window(name: str, cosines: tuple[float, ...]):
    """Register a generalized cosine window: sum_k a_k cos(2 pi k n / N) with signs folded in."""

    def evaluate(size, output_datatype, periodic):
        size = int(np.asarray(size).reshape(-1)[0])
        period = size if periodic else size - 1
        n = np.arange(size, dtype=np.float64)
        if period == 0:  # a one-point symmetric window is [1], as PyTorch's
            w = np.ones(size)
        else:
            w = sum(a * np.cos(2 * np.pi * k * n / period) for k, a in enumerate(cosines))
        return w.astype(output_datatype.np)

    def infer(ctx):
        check_dtype(ctx, 0, INDEX, "size")
        if ctx.type(0).numel not in (1, None):
            raise ctx.fail(f"size must be a scalar, given {ctx.type(0)}")
        if ctx.attrs["output_datatype"] not in NUMERIC:
            raise ctx.fail(f"output_datatype {ctx.attrs['output_datatype']} is not numeric")
        return [T.TensorType(ctx.attrs["output_datatype"], (_size(ctx, 0, "size", "window"),))]

    def rule(inputs, outputs, output_datatype, periodic, **_):
        size = _const_scalar(inputs[0], name, "size")
        period = size if periodic else size - 1

        def element(n):  # the reference's float64 arithmetic, in its order
            if period == 0:
                return const(1.0, T.float64)
            w = None
            for k, a in enumerate(cosines):
                term = call("cos", Cast(T.float64, n) * (2 * np.pi * k) / period) * a
                w = term if w is None else w + term
            return w

        return [compute(outputs[0].shape, element, name=_stage(name.lower()),
                        dtype=output_datatype)]

    register_op(name, pattern=Pattern.OPAQUE, infer=infer, evaluate=evaluate,
                attrs={"output_datatype": T.float32, "periodic": 1}, compute=rule, params=(0,))


_window("HannWindow", (0.5, -0.5))  # sin^2(pi n / N)
_window("HammingWindow", (25 / 46, -21 / 46))
_window("BlackmanWindow", (0.42, -0.5, 0.08))


# -- MelWeightMatrix ----------------------------------------------------------------------------


def _hz_to_mel(f):
    return 2595 * np.log1p(f / 700) / np.log(10)


def _mel_to_hz(m):
    return 700 * np.expm1(m / 2595 * np.log(10))


def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                      output_datatype):
    mels, n_fft, rate = int(num_mel_bins), int(dft_length), int(sample_rate)
    low, high = _hz_to_mel(lower_edge_hertz), _hz_to_mel(upper_edge_hertz)
    # mels + 2 points spaced evenly in mel, mapped to spectrogram bins (as onnxruntime)
    points = np.arange(mels + 2) * ((high - low) / (mels + 2)) + low
    bins = ((n_fft + 1) * _mel_to_hz(points) // rate).astype(np.int64)
    out = np.zeros((n_fft // 2 + 1, mels))
    for i in range(mels):
        left, center, right = bins[i], bins[i + 1], bins[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    return out.astype(output_datatype.np)


def _mel_infer(ctx):
    for i, what in enumerate(("num_mel_bins", "dft_length", "sample_rate")):
        check_dtype(ctx, i, INDEX, what)
    check_dtype(ctx, 3, FLOATS, "lower_edge_hertz")
    check_dtype(ctx, 4, FLOATS, "upper_edge_hertz")
    if ctx.attrs["output_datatype"] not in NUMERIC:
        raise ctx.fail(f"output_datatype {ctx.attrs['output_datatype']} is not numeric")
    n_fft = _scalar(ctx, 1, "dft_length")
    bins = ctx.fresh_dim("bins") if n_fft is None else n_fft // 2 + 1
    return [T.TensorType(ctx.attrs["output_datatype"],
                         (bins, _size(ctx, 0, "num_mel_bins", "mels")))]


def _mel_rule(inputs, outputs, **_):
    raise NoCompute("MelWeightMatrix: its bins come from its (scalar) inputs' values; with "
                    "constant inputs it folds to a constant, otherwise it runs on the host")


register_op("MelWeightMatrix", pattern=Pattern.OPAQUE, infer=_mel_infer,
            evaluate=mel_weight_matrix, inputs=5, attrs={"output_datatype": T.float32},
            compute=_mel_rule, params=(0, 1, 2, 3, 4))
