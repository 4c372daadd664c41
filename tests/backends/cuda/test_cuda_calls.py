"""The cuda target's calling conventions: what a call takes (NumPy, CuPy, PyTorch tensors,
DLPack-only arrays), what it returns (CuPy by default, `to=`, the `outputs` compile option,
and NumPy only on the CPU targets), on which stream it runs, and that an input buffer read in
place is read afresh on every call. First on the simulated device (simulated_device.py),
then on a GPU (`gpu` tests, skipped without CuPy and a GPU), with artifacts and the
newcomer's CLI path."""

import sys
import types

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.compiler import cli
from simulated_device import FAKE, FakeArray, Interface, relu_model


# -- on the simulated device ----------------------------------------------------------------------

def test_runtime_cupy_outputs_are_the_callers(simulated, rng):
    rt = simulated(relu_model([4]))   # CuPy arrays by default
    a, b = (rng.uniform(0.5, 2.0, 4).astype(np.float32) for _ in range(2))
    (first,) = rt.run([a], {})
    (second,) = rt.run([b], {})
    assert type(first) is FakeArray and hasattr(first, "__cuda_array_interface__")
    np.testing.assert_array_equal(np.asarray(first), a)   # not overwritten by the 2nd call
    np.testing.assert_array_equal(np.asarray(second), b)
    (host,) = rt.run([a], {}, outputs="numpy")
    assert type(host) is np.ndarray
    np.testing.assert_array_equal(host, a)
    with pytest.raises(dnnc.errors.ArgumentError, match="outputs must be one of cupy, numpy"):
        rt.outputs = "jax"


def test_model_to_chooses_the_kind_per_call_and_outputs_per_compile(simulated, rng,
                                                                    tmp_path):
    from dnnc.compiler.module import CompiledModel

    x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    model = CompiledModel(*_graph_and(simulated(relu_model([3, 5]))), "cuda")
    assert type(model(x)) is FakeArray and type(model(x, to="cupy")) is FakeArray
    assert type(model(x, to="numpy")) is np.ndarray
    assert type(model.run(x, to="numpy")[0]) is np.ndarray
    with pytest.raises(dnnc.errors.ArgumentError, match="to must be one of cupy, numpy"):
        model(x, to="jax")
    # the compile option, kept by an artifact; `to=` still wins
    host = CompiledModel(*_graph_and(simulated(relu_model([3, 5]), outputs="numpy")), "cuda")
    host.save(tmp_path / "m.dnnc")
    loaded = dnnc.load(tmp_path / "m.dnnc")
    assert type(loaded(x)) is np.ndarray and type(loaded(x, to="cupy")) is FakeArray
    model.save(tmp_path / "d.dnnc")
    assert type(dnnc.load(tmp_path / "d.dnnc")(x)) is FakeArray


def _graph_and(rt):
    return rt.graph, rt


def _copies(kind=3):
    return sum(1 for k in FAKE.copies if k == kind)


def test_a_reused_device_buffer_is_read_in_place_and_never_stale(simulated, rng):
    """The serving loop: one input buffer, refilled before each call. The first call copies
    (the address is new), the second captures a graph on the caller's address, later ones
    replay it with no copy at all, and every result is the buffer's current contents."""
    from dnnc.backends.cuda.executable import SEEN_PER_FRAME

    rt = simulated(relu_model([32, 40]))   # (above COPIED_INPUT_BYTES: read in place)
    buffer = rng.uniform(0.5, 2.0, (32, 40)).astype(np.float32).view(FakeArray)
    for call in range(5):
        buffer[...] = rng.uniform(0.5, 2.0, (32, 40))   # new contents, same address
        before = _copies()
        (y,) = rt.run([buffer], {})
        np.testing.assert_array_equal(np.asarray(y), buffer)
        assert _copies() - before == (1 if call == 0 else 0), call
    own, mine = FAKE.graphs   # one on the frame's buffers, one on the caller's
    assert (own.launches, mine.launches) == (1, 4)
    # a caller with a new address per call pays a device copy each time, never a capture
    # (kept alive here: a freed array's address comes back, as from CuPy's memory pool)
    fresh = [rng.uniform(0.5, 2.0, (32, 40)).astype(np.float32).view(FakeArray)
             for _ in range(SEEN_PER_FRAME + 3)]
    before = _copies()
    for x in fresh:
        np.testing.assert_array_equal(np.asarray(rt.run([x], {})[0]), x)
    assert len(FAKE.graphs) == 2 and _copies() - before == len(fresh)


def test_small_device_inputs_are_copied_so_their_addresses_key_no_graph(simulated, rng):
    """An input of at most COPIED_INPUT_BYTES (a decode step's token ids, positions) is
    copied into the frame's buffer at every call, whatever its address: new small tensors
    each call never make a graph capture."""
    rt = simulated(relu_model([3, 5]))
    buffers = [rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32).view(FakeArray)
               for _ in range(2)]   # (two addresses, taken in turn: each recurs)
    for call in range(6):
        x = buffers[call % 2]
        before = _copies()
        np.testing.assert_array_equal(np.asarray(rt.run([x], {})[0]), x)
        assert _copies() - before == 1
    assert len(FAKE.graphs) == 1   # the frame's own


def test_a_misaligned_device_view_is_copied_not_read_in_place(simulated, rng):
    """The kernels load parameters as float4 where the offsets allow: a view starting 4 bytes
    into an allocation (`x[1:]`) is copied to the frame's own buffer on every call."""
    rt = simulated(relu_model([1200]))
    whole = rng.uniform(0.5, 2.0, 1260).astype(np.float32).view(FakeArray)
    assert whole.ctypes.data % 16 == 0
    view = whole[1:1201]
    for _ in range(3):
        before = _copies()
        np.testing.assert_array_equal(np.asarray(rt.run([view], {})[0]), view)
        assert _copies() - before == 1
    assert len(FAKE.graphs) == 1   # the frame's own, never one on the caller's address


def test_graphs_per_frame_are_bounded(simulated, rng):
    from dnnc.backends.cuda.executable import GRAPHS_PER_FRAME

    rt = simulated(relu_model([1200]))   # (above COPIED_INPUT_BYTES: read in place)
    buffers = [rng.uniform(0.5, 2.0, 1200).astype(np.float32).view(FakeArray)
               for _ in range(GRAPHS_PER_FRAME + 2)]
    for _ in range(3):
        for b in buffers:
            np.testing.assert_array_equal(np.asarray(rt.run([b], {})[0]), b)
    (seg,) = rt.compiled_segments()
    assert len(seg.frames.frame.graphs) == GRAPHS_PER_FRAME


def test_tensor_maps_live_as_long_as_what_reads_them(simulated, rng, monkeypatch):
    """A kernel reading a tensor map of the segment's input (`TensorMapPlace`): the frame's
    maps are built once, a caller's array's when its graph is captured; a frame keeps at most
    GRAPHS_PER_FRAME graphs' maps however many arrays come, each of its own addresses, and a
    dropped graph's maps wait until the event recorded when it was dropped has passed
    (`_retire`: its kernels may still be running), then go at the next drop."""
    from dnnc.backends.cuda import tensor_map
    from dnnc.backends.cuda.executable import GRAPHS_PER_FRAME

    codegen = sys.modules["dnnc.backends.cuda.codegen"]   # (the simulated renderer)
    plain = codegen.render_module

    def with_a_map(funcs):
        module = plain(funcs)
        for kernel in module.kernels.values():
            kernel.tensor_maps = [types.SimpleNamespace(param=0, dtype="float16",
                                                        extents=(2400,), strides=(),
                                                        box=(64,), im2col=())]
        return module

    monkeypatch.setattr(codegen, "render_module", with_a_map)
    encoded = []
    monkeypatch.setattr(tensor_map, "kernel_map",   # a map's words: its tensor's address
                        lambda arg, at: encoded.append(at) or np.full(16, at, np.uint64))

    class Event:   # passed once the test says the GPU has caught up
        passed = False

        def __init__(self, disable_timing=False):
            pass

        def record(self, stream=None):
            pass

        @property
        def done(self):
            return Event.passed

    rt = simulated(relu_model([1200]), outputs="numpy")   # (read in place: 4800 bytes)
    monkeypatch.setattr(rt.cupy.cuda, "Event", Event)
    (seg,) = rt.compiled_segments()
    buffers = [rng.uniform(0.5, 2.0, 1200).astype(np.float32).view(FakeArray)
               for _ in range(GRAPHS_PER_FRAME + 4)]
    for b in buffers:
        for _ in range(2):   # the second call captures a graph on b's address
            np.testing.assert_array_equal(rt.run([b], {})[0], b)
    frame = seg.frames.frame
    assert frame.maps.buffer.view(np.uint64)[0] == frame.inputs[0]
    assert len(frame.graphs) == GRAPHS_PER_FRAME and len(frame.retired) == 4
    for places, (_, maps) in frame.graphs.items():
        assert maps.buffer.view(np.uint64)[0] == places[0]
    assert encoded == [frame.inputs[0]] + [b.ctypes.data for b in buffers]
    dropped = [maps for _, maps in frame.retired]
    assert [m.buffer.view(np.uint64)[0] for m in dropped] == \
        [b.ctypes.data for b in buffers[:4]]
    Event.passed = True
    last = rng.uniform(0.5, 2.0, 1200).astype(np.float32).view(FakeArray)
    for _ in range(2):
        np.testing.assert_array_equal(rt.run([last], {})[0], last)
    assert len(frame.graphs) == GRAPHS_PER_FRAME and len(frame.retired) == 1
    assert frame.retired[0][1].buffer.view(np.uint64)[0] == buffers[4].ctypes.data


def test_a_device_array_another_gpu_holds_is_refused_by_name(simulated, rng):
    from dnnc.compiler.module import CompiledModel

    model = CompiledModel(*_graph_and(simulated(relu_model([32, 40]))), "cuda")
    x = rng.uniform(0.5, 2.0, (32, 40)).astype(np.float32).view(FakeArray)
    FAKE.places[x.ctypes.data] = {"device": 1}
    with pytest.raises(dnnc.errors.InputError, match="input 'x' is on GPU 1; this model runs "
                                                     "on GPU 0"):
        model(x)
    FAKE.places[x.ctypes.data] = {"type": 1}
    with pytest.raises(dnnc.errors.InputError, match="input 'x': its __cuda_array_interface__ "
                                                     "points at host memory"):
        model(x)


def test_a_torch_input_runs_on_torchs_current_stream(simulated, rng, monkeypatch):
    """PyTorch's current stream, when it is not CuPy's, is made CuPy's for the call (an
    `ExternalStream`); a call without a tensor leaves CuPy's stream alone."""
    from dnnc.compiler.module import CompiledModel

    class Tensor(Interface):
        is_cuda = True
        device = types.SimpleNamespace(index=0)

    side = types.SimpleNamespace(cuda_stream=0)
    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch.cuda = types.SimpleNamespace(current_stream=lambda device: side)
    monkeypatch.setitem(sys.modules, "torch", torch)
    model = CompiledModel(*_graph_and(simulated(relu_model([3, 5]))), "cuda")
    x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    np.testing.assert_array_equal(model(Tensor(x), to="numpy"), x)
    assert FAKE.entered == []   # torch's default stream is CuPy's (0)
    side.cuda_stream = 0x7f00
    np.testing.assert_array_equal(model(Tensor(x), to="numpy"), x)
    np.testing.assert_array_equal(model(x, to="numpy"), x)
    assert FAKE.entered == [0x7f00]
    assert model.benchmark(Tensor(x), repeat=2, warmup=0)["median_ms"] >= 0


def test_torch_outputs_are_tensors_filled_on_the_calls_stream(simulated, rng, monkeypatch):
    """to="torch": each output a tensor PyTorch allocates, filled by one device copy of the
    frame's buffer (the next call leaves it); PyTorch's current stream, where it is not the
    call's, waits for the call once. PyTorch's CUDA side is stubbed (its tensors are host
    tensors here, the simulated device's memory being the host's)."""
    real = pytest.importorskip("torch")
    from dnnc.compiler.module import CompiledModel

    waits = []
    current = types.SimpleNamespace(cuda_stream=0, wait_stream=waits.append)
    torch = types.ModuleType("torch")
    torch.Tensor, torch.bfloat16, torch.from_numpy = real.Tensor, real.bfloat16, real.from_numpy
    torch.device = lambda kind, index: (kind, index)
    torch.empty = lambda shape, dtype, device: real.empty(shape, dtype=dtype)
    torch.cuda = types.SimpleNamespace(current_stream=lambda device: current,
                                       ExternalStream=lambda ptr, device: ("stream", ptr))
    monkeypatch.setitem(sys.modules, "torch", torch)
    model = CompiledModel(*_graph_and(simulated(relu_model([3, 5]))), "cuda")
    x, x2 = (rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32) for _ in range(2))
    copies = len(FAKE.copies)
    y = model(x, to="torch")
    assert isinstance(y, real.Tensor) and y.dtype == real.float32
    assert FAKE.copies[copies:].count(3) >= 1 and waits == []   # device to device, one stream
    current.cuda_stream = 0x7f00
    y2 = model(x2, to="torch")
    np.testing.assert_array_equal(y.numpy(), x)   # not overwritten by the second call
    np.testing.assert_array_equal(y2.numpy(), x2)
    assert waits == [("stream", 0)]   # once for the call


def test_a_producer_stream_an_input_names_is_waited_for(simulated, rng):
    """`__cuda_array_interface__` version 3 names the stream its data is produced on: the
    call's stream waits for it (an event), unless it is the call's own or the legacy default
    stream (1) while the call runs on CuPy's null stream (0)."""
    from dnnc.compiler.module import DeviceArray

    rt = simulated(relu_model([3, 5]))
    x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    for producer in (None, 1, 0x5000):
        face = dict(Interface(x).__cuda_array_interface__, stream=producer)
        given = DeviceArray(types.SimpleNamespace(__cuda_array_interface__=face))
        np.testing.assert_array_equal(np.asarray(rt.run([given], {})[0]), x)
    assert FAKE.waits == [0x5000]


class _DLPackOnly:
    """A GPU array of a library that speaks DLPack only (no __cuda_array_interface__): over a
    CuPy array on GPU 0, or a NumPy one on the simulated device (whose memory is the host's)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (2, 0)   # kDLCUDA, GPU 0


def test_a_dlpack_gpu_array_is_taken_through_cupy(simulated, rng):
    from dnnc.compiler.module import CompiledModel

    model = CompiledModel(*_graph_and(simulated(relu_model([3, 5]))), "cuda")
    x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    before = _copies(kind=1)
    np.testing.assert_array_equal(model(_DLPackOnly(x), to="numpy"), x)
    assert _copies(kind=1) == before   # read on the device: no host to device copy


@pytest.mark.parametrize("machine", ["no_cupy", "no_gpu"])
def test_a_dlpack_gpu_array_without_cupy_is_refused_clearly(machine, request, rng):
    request.getfixturevalue(machine)
    model = dnnc.compile(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), "llvm")
    x = rng.standard_normal((1, 4)).astype(np.float32)
    with pytest.raises(dnnc.errors.InputError, match=r"input 'input' is not array-like: a GPU "
                                                     r"array \(_DLPackOnly\) given through "
                                                     r"DLPack is read with CuPy: "):
        model(_DLPackOnly(x))


def test_cpu_targets_return_numpy_and_refuse_cupy(rng):
    graph = zoo.build("mlp", hidden=(8,), in_features=4, classes=3)
    x = rng.standard_normal((1, 4)).astype(np.float32)
    for target in ("llvm", "numpy"):
        model = dnnc.compile(graph, target, outputs="numpy")
        assert type(model(x, to="numpy")) is np.ndarray
        np.testing.assert_array_equal(model(x, to="numpy"), model(x))
        with pytest.raises(dnnc.errors.ArgumentError,
                           match=f"to='cupy': the {target} target returns numpy arrays; "
                                 f"cupy arrays come from the cuda target"):
            model(x, to="cupy")
        with pytest.raises(dnnc.errors.ArgumentError,
                           match=f"outputs='cupy': the {target} target returns numpy"):
            dnnc.compile(graph, target, outputs="cupy")
    with pytest.raises(dnnc.errors.ArgumentError, match="outputs must be one of cupy, numpy, "
                                                        r"torch \(the arrays the cuda target"):
        dnnc.compile(graph, "cuda", outputs="jax")


def test_an_input_named_to_is_given_positionally(rng):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["to"], ["y"])], "g",
                          [helper.make_tensor_value_info("to", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = dnnc.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                         "numpy")
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(model(x, to="numpy"), [0.0, 2.0])
    with pytest.raises(dnnc.errors.ArgumentError, match="give this model's input 'to' "
                                                        "positionally"):
        model(to=x)


# -- on a GPU -------------------------------------------------------------------------------------

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


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_a_returned_array_is_never_overwritten(cnn, rng):
    import cupy

    _, compiled, reference = cnn
    a, b = _inputs(rng, 2)
    first = compiled(cupy.asarray(a))
    second = compiled(cupy.asarray(b))
    _close(cupy.asnumpy(first), reference(a))
    _close(cupy.asnumpy(second), reference(b))


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_a_strided_cupy_input_is_copied_in_c_order(cnn, rng):
    import cupy

    _, compiled, reference = cnn
    (x,) = _inputs(rng, 1)
    wide = cupy.asarray(np.repeat(x, 2, axis=3))   # every other column is x
    for _ in range(3):
        _close(compiled(wide[:, :, :, ::2], to="numpy"), reference(x))


@pytest.mark.gpu
def test_a_misaligned_cupy_view_is_copied(cnn, rng):
    import cupy

    _, compiled, reference = cnn
    (x,) = _inputs(rng, 1)
    flat = cupy.empty(x.size + 1, cupy.float32)
    view = flat[1:].reshape(SHAPE)   # 4 bytes past a 256-byte boundary
    view.set(x)
    for _ in range(3):
        _close(compiled(view, to="numpy"), reference(x))
    assert not _read_in_place(compiled, view.data.ptr)


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_a_dlpack_only_gpu_array_is_taken(cnn, rng):
    import cupy

    _, compiled, reference = cnn
    (x,) = _inputs(rng, 1)
    _close(compiled(_DLPackOnly(cupy.asarray(x)), to="numpy"), reference(x))


@pytest.mark.gpu
def test_wrong_dtype_or_shape_on_the_gpu_is_refused_by_name(cnn, rng):
    import cupy

    _, compiled, _ = cnn
    (x,) = _inputs(rng, 1)
    with pytest.raises(dnnc.errors.InputError, match=r"input 'input': expected .* given "
                                                     r"float64\[2,3,16,16\]"):
        compiled(cupy.asarray(x, dtype=cupy.float64))
    with pytest.raises(dnnc.errors.InputError, match="input 'input'"):
        compiled(cupy.asarray(x[:1]))


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
    assert "float32[1,10]" in out and "on cuda" in out, out
    assert cli.main(["bench", str(model), "--target", "cuda", "--repeat", "5", "--warmup",
                     "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "target cuda" in out and len(out.strip().splitlines()) == 3, out
    host = tmp_path / "host.dnnc"
    assert cli.main(["compile", str(model), "--target", "cuda", "-o", str(host), "--outputs",
                     "numpy", "-q"]) == 0
    assert type(dnnc.load(host)(np.zeros((1, 784), np.float32))) is np.ndarray
