"""The `cuda` target's registry entry (`backends/registry.py`): its `TargetSpec` and the
functions it names, the runtime factory among them. Cheap to import: CuPy is imported when a
function here runs (`device.import_cupy`), so listing the targets loads none of it. The
functions look `device`'s up when they run, so a test's stand-in device is the one they ask."""

from __future__ import annotations

from ...errors import ArgumentError, DeviceError, InputError
from ...ir.target import Target
from ..target_spec import ArtifactCodec, TargetSpec, lazy
from . import FUSION, artifact, device


def check_compile(target: Target, render_only: bool) -> None:
    """Before any pass runs: without CuPy or a GPU a `DeviceError` saying which is missing,
    unless only the sources are wanted (`render_only`); a reduced precision on a GPU without
    tensor cores."""
    if not render_only:
        device.import_cupy()
    if target.precision != "fp32" and not device.has_tensor_cores(target.arch):
        raise ArgumentError(f"precision={target.precision!r} runs on the tensor cores' "
                            f"mma.sync of sm_80 and newer; this GPU is {target.arch} (compile "
                            f"with precision='fp32')")


def runtime(graph, opt_level: int, target: Target, progress=None, reuse_memory=True,
            cache_size=None, tuned=None, render_only=False, outputs=None):
    """A `CUDARuntime` for `graph` (the passes ran), its static shapes compiled (`start`) returning `outputs` ("cupy" when None)."""
    from .executable import DEFAULT_CACHE_SIZE, CUDARuntime

    return CUDARuntime(graph, target=target, opt_level=opt_level, progress=progress,
                       reuse_memory=reuse_memory,
                       cache_size=DEFAULT_CACHE_SIZE if cache_size is None else cache_size,
                       render_only=render_only, tuned=tuned, outputs=outputs or "cupy").start()


def available() -> bool:
    return device.available()


def require() -> None:
    device.import_cupy()


def machine() -> Target:
    return device.machine()


def about() -> str:
    if not device.available():
        return device.unavailable_reason()
    v = device.versions()
    return (f"CuPy {v['cupy']}, CUDA runtime {v['runtime']}, NVRTC {v['nvrtc']}, driver "
            f"{v['driver']}, {device.describe()}")


def versions() -> tuple[str, ...]:
    """CuPy's and NVRTC's versions (the compile cache's key); none without a GPU."""
    if not device.available():
        return ()
    v = device.versions()
    return v["cupy"], v["nvrtc"]


def from_dlpack(x):
    """A DLPack-only array on a CUDA device as a CuPy array over the same memory (zero
    copy; the producer makes its data ready on CuPy's current stream, as the protocol has
    it)."""
    try:
        cupy = device.import_cupy()
    except DeviceError as exc:
        raise InputError(f"a GPU array ({type(x).__name__}) given through DLPack is "
                         f"read with CuPy: {exc}") from None
    return cupy.from_dlpack(x)


SPEC = TargetSpec(
    "cuda", "NVIDIA GPUs through NVRTC (CuPy)", runtime,
    # device arrays by default: a caller on the GPU pays no copy to the host
    returns=("cupy", "numpy", "torch"),
    options=("passes", "dump_ir", "cache_size", "tuning_log", "precision"),
    emits={"cuda": ".cu", "loop": ".loop"},
    codec=ArtifactCodec(artifact.export, artifact.check, artifact.restore), cached=True,
    runs_passes=True, machine=machine,
    layouts=("sparse_weights", "nhwc_conv", "tf32_dense", "int8_dense_rows"),
    fusion=lambda: FUSION,
    templates=lazy(f"{__package__}.schedules", "TEMPLATES"),
    tuning=lazy(f"{__package__}.tuning"), speed=20, available=available, require=require,
    check_compile=check_compile, about=about, versions=versions, from_dlpack=from_dlpack,
    # fp16 / bf16 compiles store weights and activations in 16 bits (its templates read them)
    half_storage=True)
