"""The cuda target's calling conventions on a GPU (`gpu` tests, skipped without CuPy and a
GPU): what a call takes (NumPy, CuPy, PyTorch tensors, DLPack-only arrays), what it returns
(CuPy by default, `to=`, the `outputs` compile option), on which stream it runs, that an
input buffer read in place is read afresh on every call, artifacts, and the newcomer's CLI
path. The simulated-device tests of the same bookkeeping are in test_cuda_runtime.py."""

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.compiler import cli

pytestmark = pytest.mark.gpu

SHAPE = (2, 3, 16, 16)


@pytest.fixture(scope="module")
def cnn():
    """(the ONNX model, compiled for cuda, compiled for the numpy reference)."""
    model = zoo.build("cnn", batch=2, size=16, width=4)
    return model, dnnc.compile(model, "cuda"), dnnc.compile(model, "numpy")


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def _inputs(rng, n):
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]


def _read_in_place(compiled, address: int) -> bool:
    """Whether this thread's frames hold a graph reading an input at `address`."""
    return any(address in places for seg in compiled.runtime.compiled_segments()
               for places in getattr(seg.frames, "frame").graphs)


def test_numpy_and_cupy_in_cupy_by_default_or_numpy_out(cnn, rng):
    import cupy

    model, compiled, reference = cnn
    (x,) = _inputs(rng, 1)
    want = reference(x)
    out = compiled(x)
    assert isinstance(out, cupy.ndarray) and out.dtype == np.float32
    _close(cupy.asnumpy(out), want)
    assert isinstance(compiled(x, to="cupy"), cupy.ndarray)
    host = compiled(cupy.asarray(x), to="numpy")
    assert type(host) is np.ndarray
    _close(host, want)
    host_default = dnnc.compile(model, "cuda", outputs="numpy")
    assert type(host_default(x)) is np.ndarray
    assert isinstance(host_default(x, to="cupy"), cupy.ndarray)
    assert compiled.benchmark(x, repeat=3, warmup=1)["median_ms"] > 0


def test_a_returned_array_is_never_overwritten(cnn, rng):
    import cupy

    _, compiled, reference = cnn
    a, b = _inputs(rng, 2)
    first = compiled(cupy.asarray(a))
    second = compiled(cupy.asarray(b))
    _close(cupy.asnumpy(first), reference(a))
    _close(cupy.asnumpy(second), reference(b))


def test_a_reused_cupy_buffer_is_read_in_place_and_never_stale(cnn, rng):
    """The serving loop: one input buffer refilled before each call; from the second call on
    a graph reads it in place, and every result is of the buffer's current contents."""
    import cupy

    _, compiled, reference = cnn
    buffer = cupy.empty(SHAPE, cupy.float32)
    for x in _inputs(rng, 6):
        buffer.set(x)
        _close(compiled(buffer, to="numpy"), reference(x))
    assert _read_in_place(compiled, buffer.data.ptr)


def test_a_strided_cupy_input_is_copied_in_c_order(cnn, rng):
    import cupy

    _, compiled, reference = cnn
    (x,) = _inputs(rng, 1)
    wide = cupy.asarray(np.repeat(x, 2, axis=3))   # every other column is x
    for _ in range(3):
        _close(compiled(wide[:, :, :, ::2], to="numpy"), reference(x))


def test_a_call_runs_on_the_callers_cupy_stream(cnn, rng):
    """Inputs written, the model called and its outputs read on one non-blocking stream,
    without a synchronisation between: any work on another stream would race."""
    import cupy

    _, compiled, reference = cnn
    xs = _inputs(rng, 6)
    stream = cupy.cuda.Stream(non_blocking=True)
    outs = []
    with stream:
        buffer = cupy.empty(SHAPE, cupy.float32)
        for x in xs:
            buffer.set(x, stream=stream)
            outs.append(compiled(buffer))
            buffer.fill(np.nan)   # after the call, on the stream: the call must not see it
    stream.synchronize()
    for x, out in zip(xs, outs):
        _close(cupy.asnumpy(out), reference(x))


def test_torch_tensors_in_on_torchs_current_stream(cnn, rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    _, compiled, reference = cnn
    side = torch.cuda.Stream()
    buffer = torch.empty(SHAPE, device="cuda")
    with torch.cuda.stream(side):
        for x in _inputs(rng, 6):
            buffer.copy_(torch.from_numpy(x).to("cuda", non_blocking=True))
            out = torch.from_dlpack(compiled(buffer))   # zero copy into torch
            buffer.fill_(float("nan"))   # after the call, on torch's stream
            _close(out.cpu().numpy(), reference(x))
    assert _read_in_place(compiled, buffer.data_ptr())
    # numpy out, from a tensor on the default stream
    (x,) = _inputs(rng, 1)
    _close(compiled(torch.from_numpy(x).cuda(), to="numpy"), reference(x))


class _DLPackOnly:
    """A GPU array of a library that speaks DLPack only (no __cuda_array_interface__)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_a_dlpack_only_gpu_array_is_taken(cnn, rng):
    import cupy

    _, compiled, reference = cnn
    (x,) = _inputs(rng, 1)
    _close(compiled(_DLPackOnly(cupy.asarray(x)), to="numpy"), reference(x))


def test_wrong_dtype_or_shape_on_the_gpu_is_refused_by_name(cnn, rng):
    import cupy

    _, compiled, _ = cnn
    (x,) = _inputs(rng, 1)
    with pytest.raises(dnnc.errors.InputError, match=r"input 'input': expected .* given "
                                                     r"float64\[2, 3, 16, 16\]"):
        compiled(cupy.asarray(x, dtype=cupy.float64))
    with pytest.raises(dnnc.errors.InputError, match="input 'input'"):
        compiled(cupy.asarray(x[:1]))


def test_an_array_on_another_gpu_is_refused_by_name(cnn, rng):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU")
    _, compiled, _ = cnn
    (x,) = _inputs(rng, 1)
    with cupy.cuda.Device(1):
        elsewhere = cupy.asarray(x)
    with pytest.raises(dnnc.errors.InputError, match="input 'input' is on GPU 1; this model "
                                                     "runs on GPU 0"):
        compiled(elsewhere)


def test_save_and_load_keep_the_results_and_the_output_kind(cnn, rng, tmp_path):
    import cupy

    model, compiled, reference = cnn
    (x,) = _inputs(rng, 1)
    compiled.save(tmp_path / "m.dnnc")
    loaded = dnnc.load(tmp_path / "m.dnnc")
    out = loaded(cupy.asarray(x))
    assert isinstance(out, cupy.ndarray)
    _close(cupy.asnumpy(out), reference(x))
    host = dnnc.compile(model, "cuda", outputs="numpy")
    host.save(tmp_path / "h.dnnc")
    again = dnnc.load(tmp_path / "h.dnnc")
    assert type(again(x)) is np.ndarray
    np.testing.assert_array_equal(again(x), host(x))


def test_the_newcomers_path(tmp_path, capsys):
    """`dnnc compile m.onnx --target cuda -o m.dnnc`, `dnnc run m.dnnc --random` and `dnnc
    bench m.onnx --target cuda`, through the CLI's entry point."""
    import onnx

    model = tmp_path / "mlp.onnx"
    onnx.save(zoo.build("mlp"), model)
    artifact = tmp_path / "m.dnnc"
    assert cli.main(["compile", str(model), "--target", "cuda", "-o", str(artifact),
                     "-q"]) == 0, capsys.readouterr().err
    assert f"wrote {artifact}: cuda" in capsys.readouterr().out
    assert cli.main(["run", str(artifact), "--random", "-q"]) == 0
    out = capsys.readouterr().out
    assert "float32[1, 10]" in out and "on cuda" in out, out
    assert cli.main(["bench", str(model), "--target", "cuda", "--repeat", "5", "--warmup",
                     "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "target cuda" in out and len(out.strip().splitlines()) == 3, out
    host = tmp_path / "host.dnnc"
    assert cli.main(["compile", str(model), "--target", "cuda", "-o", str(host), "--outputs",
                     "numpy", "-q"]) == 0
    assert type(dnnc.load(host)(np.zeros((1, 784), np.float32))) is np.ndarray
