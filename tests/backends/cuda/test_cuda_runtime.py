"""The cuda target's runtime: the module cache, the launch list, the registry and CLI without a
GPU (one clear error; `--emit cuda` renders anyway), on a GPU (`gpu` tests) whole models
against onnxruntime and the reference, and the runtime's bookkeeping on the simulated device
(copies, graphs, threads, profiling, artifacts). How a call takes and returns arrays is
test_cuda_calls.py's.

Named test_cuda_runtime.py: the test folders have no __init__.py, so a second
test_runtime.py (tests/backends/llvm/ has one) would not import."""

import functools
import os
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import dnnc
from dnnc import zoo
from dnnc.backends.cuda import device
from dnnc.backends.cuda.codegen import TensorMapArg
from dnnc.backends.cuda.executable import (DEVICE_ALIGN, BoundLaunch, TensorMapPlace, _Layout,
                                           launch_list, resolve)
from dnnc.backends.plan import Call
from dnnc.compiler import cli
from dnnc.compiler.cli.exits import EXIT_OK, EXIT_USAGE
from dnnc.backends.registry import REGISTRY, default_target
from dnnc.errors import CompileError, DeviceError
from simulated_device import FAKE, FakeArray, FakeKernel, FakeLaunch, Interface, relu_model

_IMPORT_CUPY = device.import_cupy   # the real one, which the simulated device replaces


# -- the module cache ---------------------------------------------------------------------------

class FakeCompiler:
    """Stands in for NVRTC: the "cubin" names what it was compiled from; counts calls."""

    def __init__(self, delay: float = 0.0):
        self.calls = 0
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, source, arch, options):
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        return f"cubin[{arch}|{' '.join(options)}|{source}]".encode() * 1000


def test_cache_compiles_once_then_reads_the_file(tmp_path):
    compiler = FakeCompiler()
    cache = device.ModuleCache(tmp_path, compile=compiler, toolkit=lambda: "12.9")
    options = device.nvrtc_options("sm_90")
    first = cache.get("__global__ void k() {}", "sm_90", options)
    again = device.ModuleCache(tmp_path, compile=compiler, toolkit=lambda: "12.9")
    assert again.get("__global__ void k() {}", "sm_90", options) == first
    assert compiler.calls == 1 and (cache.misses, again.hits, again.misses) == (1, 1, 0)
    assert [p.name for p in tmp_path.iterdir()] == \
        [cache.key("__global__ void k() {}", "sm_90", options) + ".cubin"]


def test_cache_key_covers_source_arch_toolkit_and_options(tmp_path):
    def key(source="k", arch="sm_90", toolkit="12.9", options=("-a",)):
        return device.ModuleCache(tmp_path, compile=FakeCompiler(),
                                  toolkit=lambda: toolkit).key(source, arch, options)

    keys = {key(), key(source="k2"), key(arch="sm_80"), key(toolkit="13.0"),
            key(options=("-b",)), key(options=("-a", "-b"))}
    assert len(keys) == 6
    assert key() == key()
    # parts are delimited: moving text between two parts changes the key
    assert key(source="ab", options=("x",)) != key(source="b", options=("xa",))


def test_cache_writes_atomically_through_a_temporary_file(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        # at the moment of the rename the whole file is in the temporary, in the same folder,
        # and the final name does not exist yet
        seen.append((os.path.dirname(src), os.path.getsize(src), os.path.exists(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(device.os, "replace", spy)
    compiler = FakeCompiler()
    cache = device.ModuleCache(tmp_path / "sub", compile=compiler, toolkit=lambda: "12.9")
    data = cache.get("src", "sm_90", ())
    assert seen == [(str(tmp_path / "sub"), len(data), False)]
    assert [p.suffix for p in (tmp_path / "sub").iterdir()] == [".cubin"]   # no temporaries


def test_cache_concurrent_compiles_of_one_module_agree(tmp_path):
    compiler = FakeCompiler(delay=0.05)
    results = []

    def work():
        cache = device.ModuleCache(tmp_path, compile=compiler, toolkit=lambda: "12.9")
        results.append(cache.get("same source", "sm_90", ()))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and len(set(results)) == 1 and len(results[0]) > 1000
    assert [p.suffix for p in tmp_path.iterdir()] == [".cubin"]


def test_cache_folder_that_cannot_be_written_only_costs_the_caching(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    compiler = FakeCompiler()
    cache = device.ModuleCache(blocker / "cuda", compile=compiler, toolkit=lambda: "12.9")
    assert cache.get("s", "sm_90", ()) == cache.get("s", "sm_90", ())
    assert compiler.calls == 2


def test_cache_an_empty_file_is_compiled_again(tmp_path):
    compiler = FakeCompiler()
    cache = device.ModuleCache(tmp_path, compile=compiler, toolkit=lambda: "12.9")
    cache.path(cache.key("s", "sm_90", ())).write_bytes(b"")
    assert cache.get("s", "sm_90", ()).startswith(b"cubin[")
    assert compiler.calls == 1


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DNNC_CACHE_DIR", str(tmp_path / "d"))
    assert device.cache_dir() == tmp_path / "d" / "cuda"
    monkeypatch.delenv("DNNC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert device.cache_dir() == tmp_path / "x" / "dnnc" / "cuda"


# -- the launch list ----------------------------------------------------------------------------

def test_launch_list_keeps_call_order_and_appends_workspace_pointers():
    kernels = {
        "k0_dense": FakeKernel([FakeLaunch("k0_dense_split", (4, 1, 1), (128, 1, 1), 8192),
                                FakeLaunch("k0_dense_reduce", (1, 1, 1), (32, 1, 1))],
                               workspace=[100, 300]),
        "k1_relu": FakeKernel([FakeLaunch("k1_relu", (2, 1, 1), (256, 1, 1))]),
        "k2_softmax": FakeKernel([FakeLaunch("k2_softmax", (1, 1, 1), (64, 1, 1))],
                                 workspace=[1000]),
    }
    calls = [Call("k0_dense", [("ext", 0), ("ext", 3), ("arena", 0)]),
             Call("k1_relu", [("arena", 0), ("arena", 512)]),
             Call("k1_relu", [("arena", 512), ("arena", 0)]),   # a de-duplicated kernel
             Call("k2_softmax", [("arena", 0), ("ext", 1)])]
    launches, workspace, maps = launch_list(calls, kernels)
    assert maps == []
    assert [(b.call, b.name) for b in launches] == [
        (0, "k0_dense_split"), (0, "k0_dense_reduce"), (1, "k1_relu"), (2, "k1_relu"),
        (3, "k2_softmax")]
    dense = (("ext", 0), ("ext", 3), ("arena", 0), ("workspace", 0),
             ("workspace", DEVICE_ALIGN))   # 100 bytes rounded up to the alignment
    assert launches[0].args == launches[1].args == dense
    assert launches[0].shared_bytes == 8192 and launches[0].grid == (4, 1, 1)
    assert launches[3].args == (("arena", 512), ("arena", 0))
    assert launches[4].args == (("arena", 0), ("ext", 1), ("workspace", 0))
    # calls run one after another: the region fits the hungriest kernel, not the sum
    assert workspace == max(DEVICE_ALIGN + 512, 1024)


def test_launch_list_appends_each_distinct_tensor_map_after_the_workspace():
    """A kernel's tensor maps (`CudaKernel.tensor_maps`: its parameter and box) become the
    segment's `TensorMapPlace`s of the call's argument places, one a distinct place and box,
    each launch's ("map", offset) arguments after its workspace's; `resolve` places them
    from the maps' address."""
    arg = TensorMapArg(1, "float16", (64, 128, 1), (128, 16384), (64, 64, 1))
    kernels = {"k0_mm": FakeKernel([FakeLaunch("k0_mm", (4, 1, 1), (384, 1, 1), 99328)],
                                   workspace=[100], tensor_maps=[arg, TensorMapArg(
                                       0, "float16", (64, 128, 1), (128, 16384),
                                       (128, 64, 1))])}
    calls = [Call("k0_mm", [("ext", 0), ("arena", 512), ("arena", 0)]),
             Call("k0_mm", [("arena", 0), ("arena", 512), ("ext", 1)]),   # B's map again
             Call("k0_mm", [("ext", 0), ("arena", 1024), ("arena", 0)])]
    launches, workspace, maps = launch_list(calls, kernels)
    assert maps == [TensorMapPlace(("arena", 512), "float16", (64, 128, 1), (128, 16384),
                                   (64, 64, 1)),
                    TensorMapPlace(("ext", 0), "float16", (64, 128, 1), (128, 16384),
                                   (128, 64, 1)),
                    TensorMapPlace(("arena", 0), "float16", (64, 128, 1), (128, 16384),
                                   (128, 64, 1)),
                    TensorMapPlace(("arena", 1024), "float16", (64, 128, 1), (128, 16384),
                                   (64, 64, 1))]
    assert [b.args[-2:] for b in launches] == [
        (("map", 0), ("map", 128)), (("map", 0), ("map", 256)), (("map", 384), ("map", 128))]
    assert launches[0].args[3] == ("workspace", 0)
    assert resolve(launches[1].args, [0x1000, 0x2000], 0x10000, 0x20000, 0x30000) == \
        (0x10000, 0x10200, 0x2000, 0x20000, 0x30000, 0x30100)


def test_launch_list_names_a_function_the_module_lacks():
    with pytest.raises(CompileError, match="no kernel for function 'k9_gelu'"):
        launch_list([Call("k9_gelu", [("ext", 0)])], {})


def test_resolve_places_every_argument():
    launch = BoundLaunch(0, "k", (1, 1, 1), (1, 1, 1), 0,
                         (("ext", 2), ("arena", 64), ("workspace", 256), ("ext", 0)))
    ext = [0x1000, 0x2000, 0x3000]
    assert resolve(launch.args, ext, arena=0x10000, workspace=0x20000) == \
        (0x3000, 0x10040, 0x20100, 0x1000)


def test_frame_layout_aligns_every_buffer_and_gives_empty_ones_room():
    layout = _Layout.of(1000, 0, [12, 0], [4096])
    places = [layout.arena, layout.workspace, layout.errors, *layout.inputs, *layout.outputs]
    assert places == sorted(set(places)) and all(p % DEVICE_ALIGN == 0 for p in places)
    assert layout.workspace >= 1000 and layout.outputs[0] + 4096 <= layout.total


def _gather_model():
    """y = Gather(x, ids): x int64[3], so the simulated kernel (first parameter copied into
    the last, here the error record) writes x as the record."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "ids"], ["y"], name="pick")], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [3]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("outputs", ["cupy", "numpy"])
def test_a_recorded_index_error_is_raised_after_the_call_and_cleared(simulated, outputs):
    """The kernels' error record (`loop.index_checks`) is a slot past the segment's in the
    frame's allocation, copied to the host after the launches (by the captured graph's
    replay) and read once the stream's work is done: the call raises InputError naming the
    node, the index and the bound, the record is zeroed, and the next call answers."""
    from dnnc.errors import InputError

    rt = simulated(_gather_model(), outputs=outputs)
    ids = np.zeros(2, np.int64)
    message = (r"Gather node 'pick': index 7 is out of range for an axis of size 5 "
               r"\(valid: -5 to 4\)")
    if outputs == "cupy":   # CuPy outputs never wait: the thread's next call reports it
        rt.run([np.array([1, 7, 5], np.int64), ids], {})
        message += r" \(in an earlier call"
    with pytest.raises(InputError, match=message):
        rt.run([np.array([1, 7, 5] if outputs == "numpy" else [0, 0, 0], np.int64), ids], {})
    seg = rt.compiled_segments()[0]
    rt.run([np.zeros(3, np.int64), ids], {})   # no error recorded: the call answers
    assert seg.checks and FAKE.copies.count(2) >= 2   # the record came back after each call


# -- without a GPU ------------------------------------------------------------------------------

def test_without_cupy_the_error_names_the_wheels(no_cupy):
    assert not device.available() and not REGISTRY["cuda"].available()
    with pytest.raises(DeviceError, match="needs CuPy, which is not installed: pip install "
                                          "cupy-cuda12x .* or cupy-cuda13x"):
        device.import_cupy()
    assert default_target() == "llvm"


@pytest.mark.codegen
def test_without_a_gpu_the_error_says_so(no_gpu):
    assert not device.available()
    with pytest.raises(DeviceError, match="no CUDA GPU is visible to CuPy 14.2.0: "
                                          "cudaErrorNoDevice"):
        dnnc.compile(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), "cuda")
    # the machine is still described, for rendering
    assert device.machine().arch == device.DEFAULT_ARCH


MACHINES_WITHOUT_A_GPU = [
    ("no_cupy", "the cuda target needs CuPy, which is not installed: pip install "
                "cupy-cuda12x (CUDA 12) or cupy-cuda13x (CUDA 13), matching the CUDA driver"),
    ("no_gpu", "no CUDA GPU is visible to CuPy 14.2.0: cudaErrorNoDevice: no CUDA-capable "
               "device is detected")]


@pytest.mark.parametrize("machine,says", MACHINES_WITHOUT_A_GPU)
def test_the_newcomers_path_without_a_gpu_fails_with_one_line(machine, says, simulated,
                                                              request, tmp_path, capsys,
                                                              monkeypatch):
    """`dnnc compile m.onnx --target cuda -o m.dnnc`, `dnnc run m.dnnc --random` (an
    artifact compiled on a GPU machine: here on the simulated device) and `dnnc bench m.onnx
    --target cuda` each print one line saying what is missing, and exit with status 2."""
    import onnx

    from dnnc.compiler.module import CompiledModel

    model = tmp_path / "mlp.onnx"
    onnx.save(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), model)
    artifact = tmp_path / "relu.dnnc"
    rt = simulated(relu_model([3, 5]))
    CompiledModel(rt.graph, rt, "cuda").save(artifact)
    monkeypatch.setattr(device, "import_cupy", _IMPORT_CUPY)   # the machine's own again
    request.getfixturevalue(machine)
    for argv in (["compile", str(model), "--target", "cuda", "-o", str(tmp_path / "m.dnnc")],
                 ["run", str(artifact), "--random"],
                 ["run", str(model), "--target", "cuda", "--random"],
                 ["bench", str(model), "--target", "cuda"],
                 ["bench", str(artifact)]):
        assert cli.main(argv) == EXIT_USAGE, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"dnnc: error: {says}"], (argv, err)   # before any progress line
    assert not (tmp_path / "m.dnnc").exists()


def test_cli_emit_without_a_gpu_refuses_an_artifact_path(no_gpu, tmp_path, capsys):
    import onnx

    path = tmp_path / "mlp.onnx"
    onnx.save(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), path)
    argv = ["compile", str(path), "--target", "cuda", "--emit", "cuda", str(tmp_path / "cu"),
            "-o", str(tmp_path / "m.dnnc"), "-q"]
    assert cli.main(argv) == EXIT_USAGE
    assert "-o: this machine cannot run the cuda target" in capsys.readouterr().err


@pytest.mark.codegen
@pytest.mark.parametrize("machine", [m for m, _ in MACHINES_WITHOUT_A_GPU])
def test_cli_emit_cuda_without_a_gpu_writes_the_source(machine, request, tmp_path, capsys):
    import onnx

    request.getfixturevalue(machine)
    path = tmp_path / "cnn.onnx"
    onnx.save(zoo.build("cnn", size=16, width=4), path)
    argv = ["compile", str(path), "--target", "cuda", "--emit", "cuda", str(tmp_path / "cu"),
            "--emit", "loop", str(tmp_path / "cu"), "-q"]
    assert cli.main(argv) == EXIT_OK, capsys.readouterr().err
    source = (tmp_path / "cu" / "cnn.cu").read_text()
    assert source.count('extern "C" __global__') >= 3
    assert (tmp_path / "cu" / "cnn.loop").read_text()
    assert "no artifact" in capsys.readouterr().out
    assert not (tmp_path / "cnn.dnnc").exists()


@pytest.mark.codegen
def test_render_only_model_gives_source_and_refuses_to_run(no_gpu, rng, tmp_path):
    model = dnnc.compile(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), "cuda",
                         render_only=True)
    assert model.source("cuda").count('extern "C" __global__') >= 1
    assert "for" in model.source("loop")
    with pytest.raises(DeviceError, match="no CUDA GPU is visible"):
        model(rng.standard_normal((1, 4)).astype(np.float32))
    with pytest.raises(DeviceError, match="built for its source only cannot be saved"):
        model.save(tmp_path / "m.dnnc")


@pytest.mark.codegen
@pytest.mark.parametrize("name,config", [("cnn", {"size": 16, "width": 4}),
                                         ("bert", {"layers": 1, "hidden": 32, "seq": 8})])
def test_every_launch_matches_a_kernel_of_the_source(no_gpu, name, config):
    """The renderer's launches and the source agree with the runtime's launch list: each
    launch names an `extern "C" __global__` function of the unit, passes as many pointers as
    it declares (the call's buffers, then its workspace) and fits its launch bounds."""
    import re

    model = dnnc.compile(zoo.build(name, **config), "cuda", render_only=True)
    segments = model.runtime.compiled_segments()
    assert segments
    for seg in segments:
        declared = {m.group(2): (m.group(1), m.group(3)) for m in re.finditer(
            r'extern "C" __global__ void\s*(?:__launch_bounds__\((\d+)\))?\s*(\w+)\(([^)]*)\)',
            seg.source)}
        assert seg.launches
        for launch in seg.launches:
            bound, params = declared[launch.name]
            assert len(launch.args) == len([p for p in params.split(",") if p.strip()]), \
                launch.name
            threads = launch.block[0] * launch.block[1] * launch.block[2]
            assert bound is None or threads <= int(bound), launch.name


def test_render_only_applies_to_targets_that_generate_code():
    with pytest.raises(dnnc.errors.ArgumentError, match="numpy target generates no code"):
        dnnc.compile(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), "numpy",
                     render_only=True)


# -- on a GPU -----------------------------------------------------------------------------------

GPU_MODELS = [("mlp", 1), ("mlp", 4), ("cnn", 1), ("resnet18", 1), ("resnet50", 1),
              ("mobilenet_v2", 1), ("bert_tiny", 1), ("bert_tiny", 2), ("bert_base", 1)]


def _onnxruntime(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", GPU_MODELS, ids=[f"{n}-b{b}" for n, b in GPU_MODELS])
def test_zoo_model_on_the_gpu_matches_onnxruntime(name, batch, rng):
    model = zoo.build(name, batch=batch)
    compiled = dnnc.compile(model, "cuda")
    assert compiled.stats["host_fallback_ops"] == 0, compiled.runtime.host_fallback_ops
    for _ in range(2):   # the first call captures the CUDA graph, the second replays it
        feeds = zoo.inputs_for(model, rng)
        outputs = compiled.run(*feeds.values(), to="numpy")
        expected = _onnxruntime(model, feeds)
        for out, ref in zip(outputs, expected):
            assert isinstance(out, np.ndarray) and out.dtype == ref.dtype
            assert out.shape == ref.shape and np.std(ref) > 0.1
            np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4, err_msg=name)


LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(p.stem[len("light_"):] for p in LIGHT_DIR.glob("light_*.onnx"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_on_the_gpu_matches_onnxruntime(name, rng):
    """onnx's real models (resnet50, squeezenet, inception, densenet, ...) with no host
    fallback, on a fresh random input: every output and the logits (a final Softmax's input)
    within the issue's fp32 tolerance of onnxruntime's."""
    from onnx import helper

    model = onnx.load(LIGHT_DIR / f"light_{name}.onnx")
    last = model.graph.node[-1]
    if last.op_type == "Softmax":
        model.graph.output.append(helper.make_tensor_value_info(
            last.input[0], onnx.TensorProto.FLOAT, None))
    initializers = {t.name for t in model.graph.initializer}
    feeds = {vi.name: rng.standard_normal([d.dim_value or 1 for d in
                                           vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in model.graph.input if vi.name not in initializers}
    compiled = dnnc.compile(model, "cuda")
    assert compiled.stats["host_fallback_ops"] == 0, compiled.runtime.host_fallback_ops
    for got, want in zip(compiled.run(*feeds.values(), to="numpy"), _onnxruntime(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.mark.gpu
def test_cupy_inputs_and_outputs(rng):
    import cupy

    model = zoo.build("cnn", batch=2, size=16, width=4)
    compiled = dnnc.compile(model, "cuda")
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    expected = compiled(x, to="numpy")
    np.testing.assert_array_equal(compiled(cupy.asarray(x), to="numpy"), expected)
    # a strided device array is copied to C order first
    wide = cupy.asarray(np.repeat(x, 2, axis=3))   # every other column is x
    np.testing.assert_array_equal(compiled(wide[:, :, :, ::2], to="numpy"), expected)
    first = compiled(cupy.asarray(x))     # CuPy by default
    second = compiled(cupy.asarray(-x))   # the first result is the caller's, not overwritten
    assert isinstance(first, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(first), expected)
    assert not np.array_equal(cupy.asnumpy(second), expected)


@pytest.mark.gpu
def test_threads_each_get_a_frame(rng):
    model = zoo.build("mlp", batch=3)
    compiled = dnnc.compile(model, "cuda")
    inputs = [rng.standard_normal((3, 784)).astype(np.float32) for _ in range(4)]
    reference = dnnc.compile(model, "numpy")
    results = {}

    def work(k):
        for _ in range(20):
            results[k] = compiled(inputs[k], to="numpy")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        np.testing.assert_allclose(results[k], reference(inputs[k]), rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
def test_profile_times_every_kernel(rng):
    model = zoo.build("cnn", size=16, width=4)
    compiled = dnnc.compile(model, "cuda")
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    compiled.runtime.outputs = "numpy"
    outs, rows = compiled.runtime.profile([x], repeat=3)
    assert len(rows) == compiled.stats["kernels"] and all(r["ms"] > 0 for r in rows)
    np.testing.assert_allclose(outs[0], compiled(x), rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
def test_second_compile_reads_the_module_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNC_CACHE_DIR", str(tmp_path))
    model = zoo.build("mlp", hidden=(32,), in_features=16, classes=5)
    first = dnnc.compile(model, "cuda")
    second = dnnc.compile(model, "cuda")
    assert first.runtime.module_cache.misses >= 1 and second.runtime.module_cache.misses == 0
    cached = first.runtime.module_cache
    assert second.runtime.module_cache.hits == cached.misses + cached.hits
    assert list((tmp_path / "cuda").glob("*.cubin"))


@pytest.mark.gpu
def test_host_fallback_between_gpu_segments(rng):
    """A node without a loop form runs on the host between two GPU segments: the boundary
    moves its input to NumPy and its output back to the GPU."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("NonZero", ["a"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Neg", ["f"], ["y"])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [2, "nonzeros"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    compiled = dnnc.compile(model, "cuda")
    assert compiled.stats["host_fallback_ops"] >= 1
    x = rng.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_array_equal(compiled(x, to="numpy"), dnnc.compile(model, "numpy")(x))


# -- the runtime's bookkeeping on the simulated device (simulated_device.py) --------------------

def test_runtime_copies_in_captures_once_replays_and_copies_out(simulated, rng):
    rt = simulated(relu_model([3, 5]), outputs="numpy")
    assert rt.describe_machine() == "simulated GPU (sm_90)" and rt.source("cuda") == "// fake"
    for _ in range(3):   # positive inputs: the simulated kernel's copy is the Relu
        x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
        (y,) = rt.run([x], {})
        assert type(y) is np.ndarray
        np.testing.assert_array_equal(y, x)
    assert len(FAKE.graphs) == 1 and FAKE.graphs[0].launches == 3
    # a device array is read in place (device to device), strided ones in C order
    x = rng.uniform(0.5, 2.0, (3, 10)).astype(np.float32)
    np.testing.assert_array_equal(rt.run([x[:, ::2].view(FakeArray)], {})[0], x[:, ::2])
    # through the model: its call-time checks read a device array's shape and dtype in place
    from dnnc.compiler.module import CompiledModel

    model = CompiledModel(rt.graph, rt, "cuda")
    x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    np.testing.assert_array_equal(model(Interface(x)), x)
    with pytest.raises(dnnc.errors.InputError, match=r"given float64\[3,5\]"):
        model(Interface(x.astype(np.float64)))


def test_a_device_array_given_to_a_cpu_target_is_refused_clearly(rng):
    model = dnnc.compile(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), "llvm")
    x = rng.standard_normal((1, 4)).astype(np.float32)
    with pytest.raises(dnnc.errors.InputError, match="a GPU array \\(Interface\\) was given "
                                                     "to a target that runs on the CPU"):
        model(Interface(x))


def test_runtime_threads_get_frames_of_their_own(simulated, rng):
    rt = simulated(relu_model([64]))
    inputs = [rng.uniform(0.5, 2.0, 64).astype(np.float32) for _ in range(4)]
    results = {}

    def work(k):
        results[k] = [rt.run([inputs[k]], {})[0] for _ in range(10)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        assert all(np.array_equal(r, inputs[k]) for r in results[k])
    assert len(FAKE.graphs) == 4   # one capture per thread's frame


def test_runtime_profile_rows(simulated, rng):
    rt = simulated(relu_model([2, 3]))
    x = rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    outs, rows = rt.profile([x], repeat=3)
    np.testing.assert_array_equal(outs[0], x)
    assert [r["ms"] for r in rows] == [0.25] * rt.kernels


def test_artifact_round_trip_loads_the_cubin_or_rebuilds_for_another_arch(simulated, rng,
                                                                          tmp_path):
    from dnnc.compiler.module import CompiledModel

    rt = simulated(relu_model([3, 5]))
    assert FAKE.compiles == ["sm_90"]
    CompiledModel(rt.graph, rt, "cuda").save(tmp_path / "m.dnnc")
    x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    loaded = dnnc.load(tmp_path / "m.dnnc")
    np.testing.assert_array_equal(loaded(x), x)
    assert loaded.source("cuda") == "// fake" and "Relu" in loaded.source("loop")
    assert FAKE.compiles == ["sm_90"]     # the stored cubin, not NVRTC
    FAKE.arch = "sm_80"                   # another GPU: the source is compiled for it
    np.testing.assert_array_equal(dnnc.load(tmp_path / "m.dnnc")(x), x)
    assert FAKE.compiles == ["sm_90", "sm_80"]


def _rewrite_manifest(path, edit):
    import json
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["segments"][0]["launches"][0]["args"].append(["arena", 1 << 20]),
     r"argument \(arena, 1048576\) outside the segment's buffers"),
    (lambda m: m["segments"][0]["launches"][0]["args"].__setitem__(0, ["ext", 9]),
     r"argument \(ext, 9\) outside"),
    (lambda m: m["segments"][0]["launches"][0]["args"].__setitem__(0, ["host", 0]),
     r"argument \(host, 0\) outside"),
    (lambda m: m["segments"][0]["launches"][0].update(block=[2048, 1, 1]),
     "segment entry 0 launches is malformed"),
    (lambda m: m["segments"][0]["launches"][0].update(name="k0; rm"),
     "segment entry 0 launches is malformed"),
    (lambda m: m["segments"][0].update(arch="compute_90"), "segment entry 0 arch"),
    (lambda m: m["segments"][0]["launches"][0]["args"].append(["map", 0]),
     r"argument \(map, 0\) outside"),
    (lambda m: m["segments"][0].update(tensor_maps=[dict(
        place=["ext", 99], dtype="float16", extents=[64, 8, 1], strides=[128, 1024],
        box=[64, 8, 1])]), r"a tensor map of \(ext, 99\), outside"),
    (lambda m: m["segments"][0].update(tensor_maps=[dict(
        place=["workspace", 0], dtype="float16", extents=[64, 8, 1], strides=[128, 1024],
        box=[64, 8, 1])]), "segment entry 0 tensor maps is malformed"),
    (lambda m: m["segments"][0].update(tensor_maps=[dict(
        place=["arena", 0], dtype="float64", extents=[64, 8, 1], strides=[128, 1024],
        box=[64, 8, 1])]), "segment entry 0 tensor maps is malformed"),
    (lambda m: m["segments"][0].update(tensor_maps=[dict(   # an im2col map of rank 3
        place=["arena", 0], dtype="float16", extents=[64, 8, 1], strides=[128, 1024],
        box=[64, 8], im2col=[-1, -1, -1, -1, 1, 1])]), "segment entry 0 tensor maps is malformed"),
    (lambda m: m["target"].update(arch=90), "target is malformed"),
])
def test_artifact_with_impossible_launches_is_refused(simulated, tmp_path, edit, message):
    from dnnc.compiler.module import CompiledModel

    rt = simulated(relu_model([3, 5]))
    path = tmp_path / "m.dnnc"
    CompiledModel(rt.graph, rt, "cuda").save(path)
    _rewrite_manifest(path, edit)
    with pytest.raises(dnnc.errors.ArtifactError, match=message):
        dnnc.load(path)


def test_artifact_without_a_gpu_says_what_is_missing(simulated, tmp_path, monkeypatch):
    from dnnc.compiler.module import CompiledModel

    rt = simulated(relu_model([3, 5]))
    path = tmp_path / "m.dnnc"
    CompiledModel(rt.graph, rt, "cuda").save(path)
    monkeypatch.setattr(device, "import_cupy", lambda: (_ for _ in ()).throw(
        DeviceError("no CUDA GPU is visible to CuPy")))
    with pytest.raises(DeviceError, match="no CUDA GPU is visible"):
        dnnc.load(path)


@pytest.mark.gpu
def test_the_compile_cache_serves_the_cuda_target(tmp_path, monkeypatch, rng):
    """A second compile loads the first one's cubins and constants: the same outputs, no
    compile (compiler/cache.py; on an H100 resnet50 took 1.2 s this way in a new process,
    against about 4 s)."""
    from dnnc.compiler import cache

    monkeypatch.setenv("DNNC_CACHE", "1")
    monkeypatch.setenv("DNNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "MIN_STORE_SECONDS", 0.0)
    model = zoo.build("cnn", batch=2)
    first = dnnc.compile(model, "cuda")
    second = dnnc.compile(model, "cuda")
    assert (first.stats["compile_cache"], second.stats["compile_cache"]) == ("miss", "hit")
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(second(x, to="numpy")[0], first(x, to="numpy")[0])


def test_an_output_written_into_an_input_is_computed_at_the_callers_array(simulated, rng):
    """An IndexCopy output the graph writes into its cache input (`Graph.aliases`): its slot
    is the cache's place, the frame's own input buffer at first (then copied back into the
    caller's array) and the caller's array once a graph on its address is captured; the
    call returns the caller's array itself, never a copy of the cache."""
    import sys

    from dnnc.passes.manager import optimize

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_aliases import cache_graph
    from dnnc.backends.cuda.executable import CUDARuntime

    target = REGISTRY["cuda"].target()
    rt = CUDARuntime(optimize(cache_graph(False, width=96), target, 3), target=target,
                     outputs="cupy").start()   # (a cache above COPIED_INPUT_BYTES)
    (seg,) = rt.compiled_segments()
    (e, d), = seg.in_place.items()
    cache = np.zeros((2, 6, 96), np.float32).view(FakeArray)
    pos, x = np.array([0, 1]), rng.standard_normal((2, 2, 96)).astype(np.float32)
    for call in range(3):
        outs = rt.run([cache, pos, x], {})
        assert outs[0] is cache
        frame = seg.frames.frame
        if call == 0:   # copied in, written in the frame's buffer, then into the caller's
            assert frame.ext[seg.n_inputs + e] == frame.inputs[d]
            np.testing.assert_array_equal(cache, frame.own_inputs[d])
    (places,) = frame.graphs   # (the cache at the caller's address: the captured graph's)
    assert places[d] == cache.ctypes.data and \
        seg._ext(places, frame.ext[len(places):])[seg.n_inputs + e] == cache.ctypes.data


def test_a_small_input_written_in_place_is_read_at_the_callers_array(simulated):
    """A counter beside a cache (`count + 1` written into `count`, 24 bytes): below
    COPIED_INPUT_BYTES, but the caller's state at a recurring address, so it is read and
    written in place by the captured graph from the second call on, not copied in and back."""
    import sys

    from dnnc.passes.manager import optimize

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_aliases import counter_graph
    from dnnc.backends.cuda.executable import CUDARuntime

    target = REGISTRY["cuda"].target()
    rt = CUDARuntime(optimize(counter_graph(False), target, 3), target=target,
                     outputs="cupy").start()
    (seg,) = rt.compiled_segments()
    assert seg.in_place == {0: 0} and seg.copied == [False]
    count = np.zeros(3, np.int64).view(FakeArray)
    for _ in range(3):
        assert rt.run([count], {})[0] is count
    (places,) = seg.frames.frame.graphs
    assert places == (count.ctypes.data,)


def test_a_bound_call_runs_the_one_segment_unchecked(simulated, rng):
    """`CompiledModel.bound_call` on device arrays: the runtime's `bound_call`, straight to
    the model's one compiled segment (not `run`'s plan walk), reading the arrays it is given
    each call, and writing an aliased output into its input as `run` does."""
    import sys

    from dnnc.backends.cuda.executable import CUDARuntime
    from dnnc.compiler.module import CompiledModel, DeviceArray
    from dnnc.passes.manager import optimize

    rt = simulated(relu_model([3, 5]), outputs="numpy")
    model = CompiledModel(rt.graph, rt, "cuda")
    first = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
    model(DeviceArray(Interface(first)))
    call = model.bound_call(DeviceArray(Interface(first)), to="numpy")
    assert not isinstance(call, functools.partial)
    rt.run = None   # (not through run)
    for _ in range(3):
        x = rng.uniform(0.5, 2.0, (3, 5)).astype(np.float32)
        (y,) = call([DeviceArray(Interface(x))])
        np.testing.assert_array_equal(y, x)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_aliases import counter_graph

    target = REGISTRY["cuda"].target()
    rt = CUDARuntime(optimize(counter_graph(False), target, 3), target=target,
                     outputs="cupy").start()
    model = CompiledModel(rt.graph, rt, "cuda")
    count = np.zeros(3, np.int64).view(FakeArray)
    call = model.bound_call(DeviceArray(count))
    for _ in range(3):
        assert call([DeviceArray(count)])[0] is count
