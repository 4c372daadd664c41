"""The GPU's figures a compile reads (`Target.gpu`): described from the device's properties,
the reference GPU's where no GPU is visible, and the templates' defaults following them."""

import sys
import types
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.backends.cuda import dense, device, mma, schedules
from dnnc.compiler import cache as compile_cache
from dnnc.compiler.driver import load_graph
from dnnc.ir.target import GPU, Target

H100 = dict(device.REFERENCE_PROPERTIES)
A100 = {"name": b"NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0, "multiProcessorCount": 108,
        "clockRate": 1410000, "memoryClockRate": 1512000, "memoryBusWidth": 5120}
H200 = {"name": "NVIDIA H200", "major": 9, "minor": 0, "multiProcessorCount": 132,
        "clockRate": 1980000, "memoryClockRate": 3201000, "memoryBusWidth": 6144}


def _matmul(m, k, n):
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_reference_properties_describe_the_reference_figures_exactly():
    """The reference GPU's measured figures (GPU.md), unscaled: compiles rendered without a
    GPU choose as they did when these were literals of the templates."""
    assert device.describe_gpu(H100) == device.REFERENCE == GPU(
        "NVIDIA H100 80GB HBM3", sms=132, fp32_flops=51e12, tensor_flops=400e12,
        copy_bytes_per_s=2.9e12)
    assert device.DEFAULT_ARCH == "sm_90"
    assert dense.min_blocks(device.REFERENCE) == 264
    assert schedules.stride_blocks(device.REFERENCE) == 1024


def test_another_device_scales_by_its_sms_clocks_and_memory():
    a100 = device.describe_gpu(A100)
    assert a100.name == "NVIDIA A100-SXM4-80GB" and a100.sms == 108
    # fp32: 108 SMs x 128 FLOP a clock x 1.41 GHz against 132 x 256 x 1.98 GHz
    assert a100.fp32_flops == pytest.approx(51e12 * (108 * 128 * 1.41) / (132 * 256 * 1.98))
    assert a100.tensor_flops == pytest.approx(400e12 * (108 * 1024 * 1.41) /
                                              (132 * 2048 * 1.98))
    assert a100.copy_bytes_per_s == pytest.approx(2.9e12 * 1512 / 2619)
    h200 = device.describe_gpu(H200)   # the H100's SMs and clocks, HBM3e's bandwidth
    assert (h200.sms, h200.fp32_flops, h200.tensor_flops) == (132, 51e12, 400e12)
    assert h200.copy_bytes_per_s == pytest.approx(2.9e12 * (3201 * 6144) / (2619 * 5120))
    # an architecture the table does not list takes the newest one before it
    assert device.describe_gpu({**H100, "major": 12, "minor": 1}) == replace(
        device.REFERENCE, name=H100["name"])


def test_two_sm_counts_give_different_defaults():
    """The fewer SMs, the fewer blocks fill the GPU: fewer k slices (or bigger tiles)."""
    few = replace(device.REFERENCE, sms=16)
    assert dense.min_blocks(few) == 32 and schedules.stride_blocks(few) == 128
    assert dense.choose(128, 768, 768, gpu=device.REFERENCE) == dense.DenseConfig(
        32, 64, 8, 4, 8, split_k=4)
    assert dense.choose(128, 768, 768, gpu=few) == dense.DenseConfig(
        32, 64, 8, 4, 8, split_k=1)
    assert dense.choose(1024, 1024, 1024, gpu=few) == dense.DenseConfig(128, 64, 8, 8, 8)
    assert mma.choose(128, 768, 768, gpu=device.REFERENCE).split_k == 4
    assert mma.choose(128, 768, 768, gpu=few) == mma.TensorCoreConfig(64, 64, 32, 2, 2, 3)
    # a Target without figures (built by hand) reads the reference's
    assert device.gpu_of(Target("cuda", arch="sm_90")) is device.REFERENCE
    assert device.gpu_of(Target("cuda", arch="sm_90", gpu=few)) is few


def test_a_compile_reads_the_figures_of_the_machine(monkeypatch):
    """The registry's machine carries the device's figures into the templates (and into the
    compile cache's key: another device's compile is another entry)."""
    few = replace(device.REFERENCE, sms=16)
    model = _matmul(128, 768, 768)
    reference = dnnc.compile(model, "cuda", render_only=True, cache=False)
    monkeypatch.setattr(device, "machine", lambda: Target("cuda", arch="sm_90", gpu=few))
    small = dnnc.compile(model, "cuda", render_only=True, cache=False)
    assert small.source("cuda") != reference.source("cuda")
    keys = {compile_cache.key(load_graph(model), "cuda", Target("cuda", arch="sm_90", gpu=g),
                              {}, None).name for g in (few, device.REFERENCE)}
    assert len(keys) == 2


def test_without_a_gpu_the_machine_is_the_reference(no_gpu):
    assert device.machine() == Target("cuda", arch="sm_90", gpu=device.REFERENCE)


def test_the_machine_of_a_visible_gpu(monkeypatch):
    """`machine()` describes the device from its properties; clocks missing from the
    properties (CUDA 13's struct dropped them) come from the device's attributes."""
    props = {k: v for k, v in A100.items() if k not in ("clockRate", "memoryClockRate")}
    attributes = {13: A100["clockRate"], 36: A100["memoryClockRate"]}
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, getDeviceProperties=lambda dev: dict(props),
        deviceGetAttribute=lambda attribute, dev: attributes[attribute])
    fake = types.ModuleType("cupy")
    fake.__version__ = "14.2.0"
    fake.cuda = types.SimpleNamespace(
        runtime=runtime, Device=lambda: types.SimpleNamespace(id=0, compute_capability="80"))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(device, "_probe", lambda: (fake, None))
    assert device.properties() == A100
    assert device.machine() == Target("cuda", arch="sm_80", gpu=device.describe_gpu(A100))


def test_tuning_keys_do_not_depend_on_the_figures():
    """Tuning records are kept per architecture and precision: an H200's (the H100's
    architecture) apply to an H100 and back, as before the figures existed."""
    h100 = Target("cuda", arch="sm_90", gpu=device.REFERENCE)
    h200 = Target("cuda", arch="sm_90", gpu=device.describe_gpu(H200))
    assert h100.key == h200.key == Target("cuda", arch="sm_90").key == "cuda:sm_90:"


def test_dynamic_shared_memory_beyond_48_kib_is_allowed_through_the_driver(monkeypatch):
    """CuPy's low-level Function (what the runtime loads from a cubin) has no property for
    the dynamic shared memory limit: the driver's attribute is set instead; a RawKernel's
    property is used where it has one; 48 KiB and below need nothing."""
    from types import SimpleNamespace

    calls = []
    driver = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
                             funcSetAttribute=lambda *a: calls.append(a))
    monkeypatch.setattr(device, "import_cupy",
                        lambda: SimpleNamespace(cuda=SimpleNamespace(driver=driver)))

    class Function:   # as cupy.cuda.function.Function: a pointer, no such property
        ptr = 1234

    class RawKernel:
        max_dynamic_shared_size_bytes = 0

    device.allow_shared(Function(), 48 << 10)
    assert calls == []
    device.allow_shared(Function(), 72 << 10)
    assert calls == [(1234, 8, 72 << 10)]
    raw = RawKernel()
    device.allow_shared(raw, 99 << 10)
    assert raw.max_dynamic_shared_size_bytes == 99 << 10 and len(calls) == 1
