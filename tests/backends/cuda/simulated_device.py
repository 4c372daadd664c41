"""A stand-in for CuPy and the CUDA renderer, for testing the cuda runtime without a GPU.

Its "device memory" is host memory and its kernels copy their first parameter's bytes into
their last: enough to check that the runtime copies inputs into the slots the launches read
(or reads callers' arrays in place), resolves every argument, captures graphs and replays
them, and hands back what the output slots hold. `install` puts it in place for one test
(the `simulated` fixture, conftest.py); `FAKE` records what it was asked to do.
"""

import sys
import types
from dataclasses import dataclass, field

import numpy as np

from dnnc.backends.cuda import device
from dnnc.backends.registry import REGISTRY


@dataclass
class FakeLaunch:
    name: str
    grid: tuple
    block: tuple
    shared_bytes: int = 0


@dataclass
class FakeKernel:
    launches: list
    workspace: list = field(default_factory=list)
    tensor_maps: list = field(default_factory=list)


class FakeArray(np.ndarray):
    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.ctypes.data, False),
                "strides": None if self.flags.c_contiguous else self.strides}


class FakeMemory:
    def __init__(self, buffer, offset=0):
        self.buffer, self.offset = buffer, offset
        self.ptr = buffer.ctypes.data + offset

    def __add__(self, offset):
        return FakeMemory(self.buffer, self.offset + offset)


class FakeStream:
    ptr = 0

    def __init__(self, non_blocking=False):
        self.recording = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_event(self, event):
        FAKE.waits.append(event.stream)

    def begin_capture(self):
        self.recording = FAKE.capturing = []

    def end_capture(self):
        graph, self.recording = FakeGraph(self.recording), None
        FAKE.capturing = None
        FAKE.graphs.append(graph)
        return graph

    def synchronize(self):
        pass


class FakeGraph:
    def __init__(self, work):
        self.work, self.launches = work, 0

    def launch(self, stream=None):
        self.launches += 1
        for run in self.work:
            run()


class FakeFunction:
    def __init__(self, sizes):
        self.sizes, self.ptr = sizes, 0

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        assert all(isinstance(a, np.uint64) for a in args) and len(args) >= len(self.sizes)

        def run():
            import ctypes
            ctypes.memmove(int(args[len(self.sizes) - 1]), int(args[0]), self.sizes[-1])

        if stream is not None and stream.recording is not None:
            stream.recording.append(run)
        else:
            run()


def fake_cupy():
    import ctypes

    def memcpy(dst, src, n, kind, stream=0):
        def run():
            FAKE.copies.append(kind)
            ctypes.memmove(dst, src, n)

        if FAKE.capturing is not None:   # (a capture is in progress: the graph's)
            FAKE.capturing.append(run)
        else:
            run()

    def pointer_attributes(ptr):   # device memory of GPU 0, unless a test says otherwise
        return types.SimpleNamespace(**{"type": 2, "device": 0, **FAKE.places.get(ptr, {})})

    def alloc(n):
        return FakeMemory(np.zeros(n, np.uint8))

    def ndarray(shape, dtype, memptr):
        n = int(np.prod(shape, dtype=np.int64))
        raw = memptr.buffer[memptr.offset:memptr.offset + n * np.dtype(dtype).itemsize]
        return raw.view(dtype).reshape(shape).view(FakeArray)

    class Module:
        def load(self, cubin):
            self.sizes = FAKE.sizes

        def get_function(self, name):
            return FakeFunction(self.sizes[name])

    class Event:
        def __init__(self, disable_timing=False):
            self.stream = None

        def record(self, stream=None):
            self.stream = getattr(stream, "ptr", None)

        def synchronize(self):
            pass

    class ExternalStream(FakeStream):
        def __init__(self, ptr, device_id=-1):
            super().__init__()
            self.ptr = ptr

        def __enter__(self):
            FAKE.entered.append(self.ptr)
            return self

    def memset(dst, value, n, stream=0):
        ctypes.memset(dst, value, n)

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, memcpy=memcpy, memcpyAsync=memcpy, memcpyHostToDevice=1,
        memcpyDeviceToHost=2, memcpyDeviceToDevice=3, pointerGetAttributes=pointer_attributes,
        memsetAsync=memset)
    stream = FakeStream()
    cuda = types.SimpleNamespace(
        runtime=runtime, alloc=alloc, Stream=FakeStream, get_current_stream=lambda: stream,
        alloc_pinned_memory=bytearray,
        function=types.SimpleNamespace(Module=Module), Event=Event,
        get_elapsed_time=lambda a, b: 0.25, driver=None, ExternalStream=ExternalStream,
        Device=lambda: types.SimpleNamespace(id=0, synchronize=lambda: None))

    def from_dlpack(x):   # the simulated producer hands over host memory as "device" memory
        return np.from_dlpack(x.array).view(FakeArray)

    fake = types.SimpleNamespace(
        cuda=cuda, ndarray=ndarray, __version__="fake", from_dlpack=from_dlpack,
        asnumpy=lambda a, stream=None: np.array(a),
        asarray=lambda a: a if isinstance(a, FakeArray) else np.array(a).view(FakeArray),
        array=lambda a: np.array(a).view(FakeArray),
        ascontiguousarray=lambda a: np.ascontiguousarray(a).view(FakeArray))
    return fake


class Fake:
    graphs: list = []
    sizes: dict = {}
    copies: list = []     # the kind of every memcpy: 1 host to device, 3 device to device
    capturing: list | None = None   # the work of the graph being captured, if one is
    places: dict = {}     # address -> pointerGetAttributes fields other than GPU 0's memory
    entered: list = []    # the pointer of every ExternalStream a run entered
    waits: list = []      # the stream of every event a stream was made to wait for


FAKE = Fake()


def relu_model(shape):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def install(monkeypatch, tmp_path):
    """Put the simulated device in CuPy's place (through `monkeypatch`, for one test) and
    return a CUDARuntime factory on it: `build(onnx_model, **runtime options)`, with a
    renderer whose kernels copy their first parameter into their last."""
    from dataclasses import replace

    from dnnc.backends.cuda import executable
    from dnnc.ir.target import Fusion, Target

    FAKE.graphs, FAKE.sizes, FAKE.copies, FAKE.places = [], {}, [], {}
    FAKE.entered, FAKE.waits, FAKE.capturing = [], [], None

    def render_module(funcs):
        kernels = {}
        for func, _ in funcs:
            FAKE.sizes[func.name] = [
                int(np.prod([int(getattr(d, "value", d)) for d in b.shape], dtype=np.int64))
                * b.dtype.itemsize for b in func.params]
            kernels[func.name] = FakeKernel([FakeLaunch(func.name, (1, 1, 1), (32, 1, 1))],
                                            workspace=[64])
        return types.SimpleNamespace(source="// fake", kernels=kernels)

    codegen = types.ModuleType("dnnc.backends.cuda.codegen")
    codegen.render_module = render_module
    schedules = types.ModuleType("dnnc.backends.cuda.schedules")
    schedules.schedule_kernel = lambda kernel, machine, config=None: kernel.func
    monkeypatch.setitem(sys.modules, "dnnc.backends.cuda.codegen", codegen)
    monkeypatch.setitem(sys.modules, "dnnc.backends.cuda.schedules", schedules)
    fake = fake_cupy()
    monkeypatch.setattr(device, "import_cupy", lambda: fake)
    monkeypatch.setattr(device, "describe", lambda: "simulated GPU (sm_90)")
    # NVRTC: a cubin naming its architecture; counted
    FAKE.compiles = []
    monkeypatch.setattr(device, "nvrtc_compile",
                        lambda s, arch, o: FAKE.compiles.append(arch) or arch.encode())
    monkeypatch.setattr(device, "toolkit_version", lambda: "0")
    monkeypatch.setenv("DNNC_CACHE_DIR", str(tmp_path / "cache"))
    # the registry's cuda machine, whose architecture a test may change
    FAKE.arch = "sm_90"
    monkeypatch.setitem(REGISTRY, "cuda", replace(
        REGISTRY["cuda"], machine=lambda: Target("cuda", arch=FAKE.arch),
        fusion=lambda: Fusion()))

    def build(model, **options):
        from dnnc.frontend.onnx import import_onnx
        from dnnc.passes.manager import optimize

        target = REGISTRY["cuda"].target()
        graph = optimize(import_onnx(model), target, 3)
        return executable.CUDARuntime(graph, target=target, **options).start()

    return build




class Interface:
    """A device array of another library: only `__cuda_array_interface__` (as PyTorch's)."""

    def __init__(self, a):
        self.a = a.view(FakeArray)
        self.__cuda_array_interface__ = self.a.__cuda_array_interface__
