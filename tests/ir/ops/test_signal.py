"""Signal ops (DFT, STFT, windows, MelWeightMatrix): references against naive sums and
onnxruntime (opset 17 and 20 forms), exact dtypes, inference with symbolic dims, errors."""

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.frontend.onnx import ONNX_FROM_DTYPE
from dnnc.ir import types as T
from dnnc.ir.compute import NoCompute, apply_rule, evaluate, placeholder, run_rule
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.registry import get_op, infer_node
from dnnc.ir.ops.signal import dft

RNG = np.random.default_rng(20240613)


def _elem(a):
    return ONNX_FROM_DTYPE[T.DType.from_numpy(a.dtype).name]


def _ort_and_dnnc(node, inputs, opset, consts=None, out_elem=None):
    consts = consts or {}
    vi = [helper.make_tensor_value_info(n, _elem(a), a.shape) for n, a in inputs.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    elem = out_elem or (_elem(next(iter(inputs.values()))) if inputs else TensorProto.FLOAT)
    outs = [helper.make_tensor_value_info(o, elem, None) for o in node.output]
    graph = helper.make_graph([node], "g", vi, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, inputs)[0]
    got = dnnc.compile(model, target="numpy").run(*inputs.values())[0]
    return got, want


def _run(op, inputs, attrs=None, consts=()):
    g = Graph("t")
    values, feed = [], []
    for i, x in enumerate(inputs):
        if x is None:
            values.append(None)
        elif i in consts:
            values.append(Value(f"c{i}", T.TensorType(T.DType.from_numpy(x.dtype), x.shape),
                                const=x))
        else:
            values.append(g.add_input(f"x{i}", T.TensorType(T.DType.from_numpy(x.dtype),
                                                            x.shape)))
            feed.append(x)
    g.outputs = g.add_node(op, values, attrs or {})
    return run_graph(g, feed)[0]


def _infer(op, types, attrs=None, consts=None):
    g = Graph("t")
    consts = consts or {}
    values = []
    for i, t in enumerate(types):
        if t is None:
            values.append(None)
        elif i in consts:
            values.append(Value(f"c{i}", t, const=consts[i]))
        else:
            values.append(g.add_input(f"x{i}", t))
    return g.add_node(op, values, attrs or {})[0].type


def _naive_dft(z, n, axis, inverse):
    """A direct O(n^2) DFT of complex z along axis, zero-padded or cut to n."""
    z = np.moveaxis(z, axis, -1)
    z = z[..., :n]
    z = np.concatenate([z, np.zeros(z.shape[:-1] + (n - z.shape[-1],))], axis=-1)
    sign = 1 if inverse else -1
    k = np.arange(n)
    basis = np.exp(sign * 2j * np.pi * np.outer(k, k) / n)
    out = z @ basis.T
    return np.moveaxis(out / n if inverse else out, -1, axis)


def _pairs(z):
    return np.stack([z.real, z.imag], axis=-1)


# -- DFT -----------------------------------------------------------------------------------------

DFT_CASES = [  # (shape, axis, dft_length, inverse, onesided)
    ((2, 8, 1), 1, None, 0, 0),
    ((2, 8, 2), 1, None, 0, 0),
    ((3, 5, 6, 2), 2, None, 1, 0),
    ((3, 5, 6, 1), 1, 8, 0, 1),
    ((3, 7, 2), -2, 4, 0, 0),
    ((2, 4, 6, 2), 0, 3, 1, 0),
]


@pytest.mark.parametrize("shape,axis,n,inverse,onesided", DFT_CASES)
def test_dft_matches_naive_sum(shape, axis, n, inverse, onesided):
    x = RNG.uniform(-1, 1, size=shape)
    z = x[..., 0] + 1j * x[..., 1] if shape[-1] == 2 else x[..., 0]
    length = n or shape[axis]
    want = _naive_dft(z, length, axis % len(shape), inverse)
    if onesided:
        want = np.take(want, np.arange(length // 2 + 1), axis=axis % len(shape))
    got = _run("DFT", [x, None if n is None else np.array(n, np.int64),
                       np.array(axis, np.int64)], {"inverse": inverse, "onesided": onesided},
               consts=(1, 2))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _pairs(want), atol=1e-10)


def test_dft_irfft_inverts_rfft():
    x = RNG.uniform(-1, 1, size=(3, 10, 1))
    spectrum = _run("DFT", [x, None, np.array(1, np.int64)], {"onesided": 1}, consts=(2,))
    assert spectrum.shape == (3, 6, 2)
    back = _run("DFT", [spectrum, None, np.array(1, np.int64)], {"inverse": 1, "onesided": 1},
                consts=(2,))
    assert back.shape == (3, 10, 1)
    np.testing.assert_allclose(back, x, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_dft_keeps_narrow_dtypes(dtype):
    x = RNG.uniform(-1, 1, size=(2, 6, 2)).astype(dtype)
    got = _run("DFT", [x], {})
    assert got.dtype == dtype and got.shape == (2, 6, 2)
    want = _pairs(np.fft.fft(x[..., 0].astype(np.float64) + 1j * x[..., 1], axis=1))
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("opset,inverse,onesided,n", [
    (17, 0, 0, None), (17, 1, 0, None), (17, 0, 1, 12), (20, 0, 0, 6), (20, 1, 0, None),
    (20, 0, 1, None),
])
def test_dft_matches_onnxruntime(opset, inverse, onesided, n):
    x = RNG.uniform(-1, 1, size=(2, 10, 3, 1 if onesided and not inverse else 2)) \
        .astype(np.float32)
    inputs = ["x", "n" if n else ""]
    consts = {} if n is None else {"n": np.array(n, np.int64)}
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset == 17:
        attrs["axis"] = 1
    else:
        inputs.append("axis")
        consts["axis"] = np.array(-3, np.int64)
    node = helper.make_node("DFT", inputs, ["y"], **attrs)
    got, want = _ort_and_dnnc(node, {"x": x}, opset, consts)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_dft_inference():
    t = _infer("DFT", [T.TensorType(T.float32, ("N", 16, 1))], {"onesided": 1})
    assert t == T.TensorType(T.float32, ("N", 9, 2))
    t = _infer("DFT", [T.TensorType(T.float32, ("N", "L", 2)), None,
                       T.TensorType(T.int64, ())], {"inverse": 1, "onesided": 1},
               consts={2: np.array(1, np.int64)})
    assert t.shape[0] == "N" and t.shape[2] == 1
    assert isinstance(t.shape[1], str) and t.shape[1] != "L"  # 2 * (L - 1)
    t = _infer("DFT", [T.TensorType(T.float32, ("N", 16, 2)), T.TensorType(T.int64, ())])
    assert t.shape[0] == "N" and isinstance(t.shape[1], str) and t.shape[2] == 2
    # an axis known only at run time: the shape is unchanged unless a length changes
    t = _infer("DFT", [T.TensorType(T.float32, ("N", 16, 1)), None, T.TensorType(T.int64, ())])
    assert t == T.TensorType(T.float32, ("N", 16, 2))


@pytest.mark.parametrize("shape,axis,attrs,match", [
    ((2, 8, 2), -1, {}, "axis"),
    ((2, 8, 2), 2, {}, "axis"),
    ((2, 8, 3), 1, {}, "1 \\(real\\) or 2"),
    ((2, 8, 1), 1, {"inverse": 1, "onesided": 1}, "complex input"),
])
def test_dft_errors(shape, axis, attrs, match):
    with pytest.raises(ShapeError, match=match):
        _infer("DFT", [T.TensorType(T.float32, shape), None, T.TensorType(T.int64, ())], attrs,
               consts={2: np.array(axis, np.int64)})


# -- STFT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("onesided,with_window,complex_in", [
    (1, True, False), (0, False, False), (0, True, True)])
def test_stft_matches_naive_frames(onesided, with_window, complex_in):
    signal = RNG.uniform(-1, 1, size=(2, 37, 2 if complex_in else 1))
    step, size = 5, 8
    window = RNG.uniform(0.1, 1, size=size) if with_window else None
    got = _run("STFT", [signal, np.array(step, np.int64), window, np.array(size, np.int64)],
               {"onesided": onesided}, consts=(1, 3))
    z = signal[..., 0] + 1j * signal[..., 1] if complex_in else signal[..., 0]
    frames = 1 + (37 - size) // step
    want = []
    for f in range(frames):
        frame = z[:, f * step:f * step + size] * (1 if window is None else window)
        spectrum = _naive_dft(frame, size, 1, False)
        want.append(spectrum[:, :size // 2 + 1] if onesided else spectrum)
    assert got.shape == (2, frames, size // 2 + 1 if onesided else size, 2)
    np.testing.assert_allclose(got, _pairs(np.stack(want, axis=1)), atol=1e-10)


def test_stft_matches_onnxruntime():
    signal = RNG.uniform(-1, 1, size=(1, 64, 1)).astype(np.float32)
    window = np.hanning(16).astype(np.float32)
    node = helper.make_node("STFT", ["x", "step", "w", "len"], ["y"])
    got, want = _ort_and_dnnc(node, {"x": signal}, 17, {"step": np.array(8, np.int64),
                                                        "w": window,
                                                        "len": np.array(16, np.int64)})
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_stft_inference():
    t = _infer("STFT", [T.TensorType(T.float32, ("B", 100, 1)), T.TensorType(T.int64, ()),
                        T.TensorType(T.float32, (16,))], consts={1: np.array(10, np.int64)})
    assert t == T.TensorType(T.float32, ("B", 9, 9, 2))
    t = _infer("STFT", [T.TensorType(T.float32, ("B", "L", 1)), T.TensorType(T.int64, ()),
                        T.TensorType(T.float32, (16,))], {"onesided": 0},
               consts={1: np.array(10, np.int64)})
    assert t.shape[0] == "B" and isinstance(t.shape[1], str) and t.shape[2:] == (16, 2)
    with pytest.raises(ShapeError, match="differs from frame_length"):
        _infer("STFT", [T.TensorType(T.float32, (1, 100, 1)), T.TensorType(T.int64, ()),
                        T.TensorType(T.float32, (16,)), T.TensorType(T.int64, ())],
               consts={1: np.array(10, np.int64), 3: np.array(12, np.int64)})


# -- windows -------------------------------------------------------------------------------------

WINDOWS = {
    "HannWindow": lambda n, N: 0.5 - 0.5 * np.cos(2 * np.pi * n / N),
    "HammingWindow": lambda n, N: 25 / 46 - 21 / 46 * np.cos(2 * np.pi * n / N),
    "BlackmanWindow": lambda n, N: (0.42 - 0.5 * np.cos(2 * np.pi * n / N)
                                    + 0.08 * np.cos(4 * np.pi * n / N)),
}


@pytest.mark.parametrize("op,periodic,dtype", itertools.product(
    WINDOWS, (0, 1), (T.float32, T.float64, T.float16)))
def test_windows_match_formula(op, periodic, dtype):
    size = int(RNG.integers(5, 20))
    got = _run(op, [np.array(size, np.int32)], {"periodic": periodic, "output_datatype": dtype},
               consts=(0,))
    n = np.arange(size)
    want = WINDOWS[op](n, size if periodic else size - 1)
    assert got.dtype == dtype.np and got.shape == (size,)
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-3 if dtype is T.float16
                               else 1e-6)


@pytest.mark.parametrize("op,periodic", itertools.product(WINDOWS, (0, 1)))
def test_windows_match_onnxruntime(op, periodic):
    node = helper.make_node(op, ["size"], ["w"], periodic=periodic,
                            output_datatype=TensorProto.DOUBLE)
    size = np.array(11, np.int64)
    got, want = _ort_and_dnnc(node, {"size": size}, 17, out_elem=TensorProto.DOUBLE)
    assert got.dtype == want.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_window_inference():
    t = _infer("HannWindow", [T.TensorType(T.int64, ())])
    assert t.dtype is T.float32 and t.rank == 1 and isinstance(t.shape[0], str)
    t = _infer("BlackmanWindow", [T.TensorType(T.int32, ())], {"output_datatype": T.float64},
               consts={0: np.array(7, np.int32)})
    assert t == T.TensorType(T.float64, (7,))
    with pytest.raises(ShapeError, match="size"):
        _infer("HammingWindow", [T.TensorType(T.float32, ())])


# -- MelWeightMatrix ----------------------------------------------------------------------------


@pytest.mark.parametrize("mels,n_fft,rate,lo,hi", [(8, 64, 16000, 0.0, 8000.0),
                                                   (10, 128, 22050, 100.0, 6000.0)])
def test_mel_weight_matrix_matches_onnxruntime(mels, n_fft, rate, lo, hi):
    node = helper.make_node("MelWeightMatrix", ["m", "n", "r", "lo", "hi"], ["w"])
    inputs = {"m": np.array(mels, np.int64), "n": np.array(n_fft, np.int64),
              "r": np.array(rate, np.int64), "lo": np.array(lo, np.float32),
              "hi": np.array(hi, np.float32)}
    got, want = _ort_and_dnnc(node, inputs, 17, out_elem=TensorProto.FLOAT)
    assert got.dtype == np.float32 and got.shape == (n_fft // 2 + 1, mels) == want.shape
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_mel_weight_matrix_triangles_peak_at_one():
    got = _run("MelWeightMatrix", [np.array(6, np.int32), np.array(256, np.int32),
                                   np.array(8000, np.int32), np.array(50, np.float64),
                                   np.array(3500, np.float64)],
               {"output_datatype": T.float64}, consts=(0, 1))
    assert got.dtype == np.float64 and got.shape == (129, 6)
    np.testing.assert_allclose(got.max(axis=0), 1.0)
    assert (got >= 0).all()


def test_mel_weight_matrix_inference():
    t = _infer("MelWeightMatrix", [T.TensorType(T.int64, ())] * 3 +
               [T.TensorType(T.float32, ())] * 2)
    assert t.dtype is T.float32 and all(isinstance(d, str) for d in t.shape)


# -- compute rules (loop IR interpreted by NumPy) against the references ----------------------


def _rule(op, arrays, attrs, const_inputs, symbolic=()):
    """The op's compute rule on `arrays`; `symbolic` lists (input, axis) dims typed "N"."""
    values = []
    for k, a in enumerate(arrays):
        if a is None:
            values.append(None)
            continue
        shape = tuple("N" if (k, ax) in symbolic else d for ax, d in enumerate(a.shape))
        values.append(Value(f"in{k}", T.TensorType(T.DType.from_numpy(a.dtype), shape),
                            const=a if k in const_inputs else None))
    types, _, full = infer_node(op, values, dict(attrs), 1, op)
    if symbolic:
        assert "N" in types[0].shape, types[0]
    tensors = [None if v is None else placeholder(v.name, v.type.dtype, v.type.shape,
                                                   value=v.const) for v in values]
    outs = apply_rule(op, tensors, full, types)
    feeds = {f"in{k}": a for k, a in enumerate(arrays) if a is not None}
    return evaluate(outs, feeds, sizes={"N": arrays[k].shape[ax] for k, ax in symbolic})


def _check_rule(op, arrays, attrs, const_inputs, symbolic=(), tol=1e-5):
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})[0]
    got = _rule(op, arrays, attrs, const_inputs, symbolic)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape,
                                                                 want.dtype, want.shape)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


DFT_RULE_CASES = DFT_CASES + [  # (shape, axis, dft_length, inverse, onesided)
    ((2, 8, 2), None, None, 1, 1),   # irfft of an even length
    ((2, 5, 2), -2, None, 1, 1),
    ((2, 5, 2), 1, 9, 1, 1),         # odd output length, spectrum zero-padded
    ((2, 8, 2), 1, 3, 1, 1),         # spectrum cut
    ((2, 6, 1), 1, 12, 0, 1),
    ((2, 64, 2), 1, None, 0, 0),     # long enough for twiddle accuracy to matter
]


@pytest.mark.parametrize("shape,axis,n,inverse,onesided", DFT_RULE_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_dft_rule(rng, shape, axis, n, inverse, onesided, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    arrays = [x, None if n is None else np.array(n, np.int64),
              None if axis is None else np.array(axis, np.int64)]
    tol = {np.float16: 3e-2, np.float32: 1e-4, np.float64: 1e-10}[dtype]
    _check_rule("DFT", arrays, {"inverse": inverse, "onesided": onesided}, (1, 2), tol=tol)


def test_dft_rule_symbolic_batch_and_length(rng):
    x = rng.standard_normal((3, 8, 2)).astype(np.float32)
    _check_rule("DFT", [x], {}, (), symbolic=((0, 0),), tol=1e-4)
    _check_rule("DFT", [x, np.array(6, np.int64)], {"inverse": 1}, (1,), symbolic=((0, 0),),
                tol=1e-4)
    got = _rule("DFT", [x], {}, (), symbolic=((0, 1),))[0]  # a symbolic transformed length
    np.testing.assert_allclose(got, dft(x), rtol=1e-4, atol=1e-4)


def test_dft_rule_needs_constant_axis_and_length(rng):
    x = rng.standard_normal((2, 8, 2)).astype(np.float32)
    with pytest.raises(NoCompute, match="axis"):
        run_rule("DFT", [x, None, np.array(1, np.int64)], {})
    with pytest.raises(NoCompute, match="dft_length|run time"):
        run_rule("DFT", [x, np.array(4, np.int64)], {})


STFT_CASES = [  # (length, parts, frame_step, window length, frame_length, onesided)
    (32, 1, 4, 8, None, 1),
    (32, 2, 3, None, 8, 0),
    (20, 1, 5, None, None, 1),
    (30, 2, 4, 10, 10, 1),
    (17, 1, 2, 6, 6, 0),
]


@pytest.mark.parametrize("length,parts,step,window,frame,onesided", STFT_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stft_rule(rng, length, parts, step, window, frame, onesided, dtype):
    arrays = [rng.standard_normal((2, length, parts)).astype(dtype), np.array(step, np.int64),
              None if window is None else rng.random(window).astype(dtype),
              None if frame is None else np.array(frame, np.int64)]
    _check_rule("STFT", arrays, {"onesided": onesided}, (1, 3),
                tol=1e-4 if dtype == np.float32 else 1e-10)
    if window is not None:  # a symbolic batch
        _check_rule("STFT", arrays, {"onesided": onesided}, (1, 3), symbolic=((0, 0),),
                    tol=1e-4 if dtype == np.float32 else 1e-10)


def test_stft_rule_needs_a_constant_step(rng):
    signal = rng.standard_normal((1, 16, 1)).astype(np.float32)
    with pytest.raises(NoCompute, match="frame_step|run time"):
        run_rule("STFT", [signal, np.array(4, np.int64), None, np.array(8, np.int64)], {},
                 const_inputs=(3,))


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("dtype", [T.float32, T.float64, T.float16, T.int32, T.uint8])
def test_window_rules(op, dtype):
    for size, periodic in itertools.product((1, 2, 7, 16), (0, 1)):
        _check_rule(op, [np.array(size, np.int64)],
                    {"output_datatype": dtype, "periodic": periodic}, (0,), tol=1e-6)
    with pytest.raises(NoCompute, match="size"):
        run_rule(op, [np.array(8, np.int64)], {"output_datatype": dtype})


def test_mel_weight_matrix_has_no_loop_form():
    args = [np.array(8, np.int64), np.array(64, np.int64), np.array(16000, np.int64),
            np.array(0.0, np.float32), np.array(8000.0, np.float32)]
    with pytest.raises(NoCompute, match="MelWeightMatrix"):
        run_rule("MelWeightMatrix", args, {}, const_inputs=range(5))
