"""The GPU the cuda target runs on: CuPy, the device and its architecture, NVRTC, the module
cache.

`import_cupy()` imports CuPy whichever wheel provides it (cupy-cuda12x, cupy-cuda13x, a source
build: all install the module `cupy`) and checks that a CUDA GPU is visible, raising a
`DeviceError` that says which of the two is missing; `available()` is the registry's cheap,
cached, never-raising form of the same check. `machine()` is the `Target` a compile reads: the
visible GPU's architecture and figures (`describe_gpu`: SM count, throughput and bandwidth from
the device's properties and the `ARCH_RATES` table), else the reference GPU's (`REFERENCE`: what
`dnnc compile --emit cuda` renders for on a machine without a GPU). Templates read a device's
figures through `gpu_of(target)`, never as literals of their own.

Compiled modules are cached on disk (`ModuleCache`): one cubin per (source, architecture,
NVRTC version, options), written atomically (a temporary file in the cache folder, then
`os.replace`) so that processes compiling the same model at once never read a partial file;
the last writer wins with identical bytes. This module never renders code: it compiles and
loads what `codegen.py` renders.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...errors import CompileError, DeviceError
from ...ir.target import GPU, Target
from .prelude import ARCH_SPECIFIC

CACHE_SCHEMA = 1
"""Part of every cache key: bump it when what a cached file holds changes meaning."""

CUPY_PACKAGES = "cupy-cuda12x (CUDA 12) or cupy-cuda13x (CUDA 13)"


@functools.cache
def _probe() -> tuple[object | None, str | None]:
    """(the cupy module, None) when CuPy imports and sees a GPU, else (None, why not).
    Cached: asking the driver initialises CUDA in this process, once."""
    if importlib.util.find_spec("cupy") is None:
        return None, (f"the cuda target needs CuPy, which is not installed: pip install "
                      f"{CUPY_PACKAGES}, matching the CUDA driver")
    try:
        import cupy
    except Exception as exc:   # a wheel for another CUDA, a missing library
        return None, f"CuPy is installed but does not import: {type(exc).__name__}: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:   # CUDARuntimeError: no driver, a driver too old for the wheel
        return None, f"no CUDA GPU is visible to CuPy {cupy.__version__}: {exc}"
    if count < 1:
        return None, (f"no CUDA GPU is visible to CuPy {cupy.__version__} (CUDA_VISIBLE_DEVICES="
                      f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})")
    return cupy, None


STATIC_SHARED_BYTES = 48 << 10
"""Shared memory a block may use without the function's attribute raised (a stage's static
shared buffers at most: beyond, codegen makes them one dynamic pool)."""


def allow_shared(fn, nbytes: int) -> None:
    """Let `fn` (a loaded `__global__` function: CuPy's low-level `Function`, or a
    `RawKernel`) launch with `nbytes` of dynamic shared memory; beyond 48 KiB that needs
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES raised (a `RawKernel` has a property
    for it, the low-level `Function` does not)."""
    if nbytes <= STATIC_SHARED_BYTES:
        return
    if hasattr(type(fn), "max_dynamic_shared_size_bytes"):
        fn.max_dynamic_shared_size_bytes = nbytes
        return
    driver = import_cupy().cuda.driver
    driver.funcSetAttribute(fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            nbytes)


def import_cupy():
    """The cupy module, once a GPU is known to be visible; else a `DeviceError` saying whether
    CuPy or the GPU is missing."""
    cupy, why = _probe()
    if cupy is None:
        raise DeviceError(why)
    return cupy


def available() -> bool:
    """Whether the cuda target can run here: CuPy imports and a GPU is visible (cached; never
    raises; imports nothing when CuPy is not installed)."""
    return _probe()[0] is not None


def unavailable_reason() -> str | None:
    """Why the cuda target cannot run here, or None when it can."""
    return _probe()[1]


def gpu_arch() -> str:
    """The current device's architecture as NVRTC names it: "sm_90" on an H100."""
    return "sm_" + import_cupy().cuda.Device().compute_capability


def gpu_name() -> str:
    return _name(properties())


def _name(props: dict) -> str:
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


# -- the device's figures -----------------------------------------------------------------------

@dataclass(frozen=True)
class ArchRates:
    """What one SM of an architecture does in a clock, by the programming guide's throughput
    table and NVIDIA's architecture whitepapers (dense, data-center parts: a GeForce part's
    tensor cores run half as fast with fp32 accumulators)."""

    fp32: int   # FLOP of fp32 FMAs (2 a lane a clock)
    tf32: int   # FLOP of dense tf32 tensor-core mma (0: none)


ARCH_RATES = {
    (6, 0): ArchRates(fp32=128, tf32=0),      # P100
    (6, 1): ArchRates(fp32=256, tf32=0),      # P40
    (7, 0): ArchRates(fp32=128, tf32=0),      # V100: 64 FP32 lanes, fp16-only tensor cores
    (7, 5): ArchRates(fp32=128, tf32=0),      # T4
    (8, 0): ArchRates(fp32=128, tf32=1024),   # A100: 19.5 / 156 TFLOP/s, 108 SMs, 1.41 GHz
    (8, 6): ArchRates(fp32=256, tf32=512),    # A40, A10
    (8, 9): ArchRates(fp32=256, tf32=512),    # L40S, L4
    (9, 0): ArchRates(fp32=256, tf32=2048),   # H100, H200 SXM: 67 / 495 TFLOP/s, 132 SMs
}
"""Per-SM, per-clock rates by compute capability (an architecture not listed takes the newest
one before it, an older one the oldest)."""

REFERENCE_PROPERTIES = {
    "name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multiProcessorCount": 132,
    "clockRate": 1980000, "memoryClockRate": 2619000, "memoryBusWidth": 5120}
"""dnnc's reference GPU (an H100 SXM) as `cudaGetDeviceProperties` describes it (clocks in
kHz, the bus in bits): what is rendered for where no GPU is visible, and the device the
measured figures of `REFERENCE` come from."""

REFERENCE = GPU(_name(REFERENCE_PROPERTIES), sms=REFERENCE_PROPERTIES["multiProcessorCount"],
                fp32_flops=51e12, tensor_flops=400e12, copy_bytes_per_s=2.9e12)
"""The reference GPU's figures as measured (GPU.md: cuBLAS fp32 and tf32 GEMMs, a
device-to-device copy); another device's are these scaled by its peaks over the reference's
(`describe_gpu`)."""

DEFAULT_ARCH = f"sm_{REFERENCE_PROPERTIES['major']}{REFERENCE_PROPERTIES['minor']}"
"""The architecture rendered for without a GPU to ask: the reference GPU's."""

# (cudaDeviceAttr numbers: CUDA 13's cudaDeviceProp lost the clock fields, the attributes stay)
_ATTRIBUTES = {"clockRate": 13, "memoryClockRate": 36, "memoryBusWidth": 37}


def properties() -> dict:
    """The current device's properties (`cudaGetDeviceProperties`), with the clocks from its
    attributes where the runtime's struct no longer has them."""
    cupy = import_cupy()
    runtime, dev = cupy.cuda.runtime, cupy.cuda.Device().id
    props = dict(runtime.getDeviceProperties(dev))
    for key, attribute in _ATTRIBUTES.items():
        if not props.get(key):
            props[key] = runtime.deviceGetAttribute(attribute, dev)
    return props


def _rates(major: int, minor: int) -> ArchRates:
    known = [cc for cc in ARCH_RATES if cc <= (major, minor)]
    return ARCH_RATES[max(known) if known else min(ARCH_RATES)]


def _peaks(props: dict) -> tuple[float, float, float]:
    """(fp32 FLOP/s, tf32 tensor-core FLOP/s, memory bytes/s) at the device's clocks (kHz)."""
    rates = _rates(props["major"], props["minor"])
    clock = props["multiProcessorCount"] * props["clockRate"] * 1e3
    memory = 2 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8   # double rate
    return clock * rates.fp32, clock * rates.tf32, memory


def describe_gpu(props: dict) -> GPU:
    """The figures of the device `props` describes: the reference's measured ones scaled by
    the device's peaks over the reference's (exactly the reference's for the reference)."""
    fp32, tf32, memory = _peaks(props)
    ref_fp32, ref_tf32, ref_memory = _peaks(REFERENCE_PROPERTIES)
    return GPU(_name(props), sms=props["multiProcessorCount"],
               fp32_flops=REFERENCE.fp32_flops * (fp32 / ref_fp32),
               tensor_flops=REFERENCE.tensor_flops * (tf32 / ref_tf32),
               copy_bytes_per_s=REFERENCE.copy_bytes_per_s * (memory / ref_memory))


def gpu_of(target: Target | None) -> GPU:
    """The figures templates read for `target`: its GPU's, else (a Target built without them,
    as tests do) the reference GPU's."""
    return target.gpu if target is not None and target.gpu is not None else REFERENCE


def machine() -> Target:
    """The Target of this host's GPU (threads 1: parallelism is the grid's), or of the
    reference GPU where there is none (rendering only)."""
    if not available():
        return Target("cuda", arch=DEFAULT_ARCH, gpu=REFERENCE)
    return Target("cuda", arch=gpu_arch(), gpu=describe_gpu(properties()))


TENSOR_CORE_ARCH = 80
"""The first architecture whose tensor cores run `mma.sync` on tf32, fp16 and bf16 with fp32
accumulators (m16n8k8 / m16n8k16: Ampere)."""


def has_tensor_cores(arch: str) -> bool:
    """Whether `arch` ("sm_90", "sm_90a") runs the tensor-core kernels of a reduced
    precision (`Target.precision`)."""
    return int(arch[3:].rstrip("abcdefghijklmnopqrstuvwxyz")) >= TENSOR_CORE_ARCH


def versions() -> dict[str, str]:
    """The driver, CUDA runtime, NVRTC and CuPy versions (bench headers, cache keys)."""
    cupy = import_cupy()
    runtime = cupy.cuda.runtime

    def dotted(v: int) -> str:   # 12090 -> "12.9"
        return f"{v // 1000}.{v % 1000 // 10}"

    return {"driver": dotted(runtime.driverGetVersion()),
            "runtime": dotted(runtime.runtimeGetVersion()),
            "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion())),
            "cupy": cupy.__version__}


def describe() -> str:
    """The device, as progress lines and benchmark headers name it."""
    if not available():
        return f"{DEFAULT_ARCH} (rendering only: {unavailable_reason()})"
    return f"{gpu_name()} ({gpu_arch()})"


# -- compiling ----------------------------------------------------------------------------------

WGMMA_ARCH = "sm_90"
"""The one architecture whose tensor cores run `wgmma.mma_async` (Hopper; its sm_90a target:
Blackwell's architecture-specific targets have other instructions)."""


def has_wgmma(arch: str) -> bool:
    """Whether `arch` ("sm_90", "sm_90a") runs the warpgroup products (`L.Wgmma`)."""
    return arch.rstrip("a") == WGMMA_ARCH


def compile_arch(arch: str, source: str) -> str:
    """The architecture NVRTC compiles `source` for on a device of `arch`: `arch` + "a" where
    the module uses architecture-specific instructions (it holds `prelude.ARCH_SPECIFIC`:
    wgmma needs sm_90a, which the device reports as compute capability 9.0), else `arch`."""
    if ARCH_SPECIFIC not in source or arch.endswith("a"):
        return arch
    if not has_wgmma(arch):
        raise CompileError(f"the module uses wgmma (sm_90a only); this GPU is {arch}")
    return arch + "a"


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """NVRTC's options for `arch`: an `sm_` architecture gives a cubin (machine code, no JIT at
    load; CuPy does the same, cupy#5097), C++17 for the renderer's `constexpr` and `auto`."""
    return (f"--gpu-architecture={arch}", "--std=c++17")


def nvrtc_compile(source: str, arch: str, options: tuple[str, ...]) -> bytes:
    """The cubin of CUDA C `source` for `arch` through NVRTC; a `CompileError` with NVRTC's
    log when it rejects the source."""
    nvrtc = import_cupy().cuda.nvrtc
    prog = nvrtc.createProgram(source, "dnnc.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog).strip().splitlines()
            shown = "; ".join(log[:8]) + (f"; ... ({len(log) - 8} more lines)"
                                          if len(log) > 8 else "")
            raise CompileError(f"NVRTC rejected the generated CUDA source for {arch}: "
                               f"{shown or exc}") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def toolkit_version() -> str:
    """The NVRTC version, part of the cache key (another NVRTC may generate other code)."""
    return ".".join(map(str, import_cupy().cuda.nvrtc.getVersion()))


def cache_dir() -> Path:
    """$DNNC_CACHE_DIR/cuda, else $XDG_CACHE_HOME/dnnc/cuda, else ~/.cache/dnnc/cuda."""
    root = os.environ.get("DNNC_CACHE_DIR")
    if root:
        return Path(root) / "cuda"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "dnnc" / "cuda"


class ModuleCache:
    """Compiled modules on disk, one file per key (see the module docstring).

    `compile(source, arch, options) -> bytes` and `toolkit` (a version string) are injectable
    for tests; `hits` and `misses` count this object's lookups."""

    def __init__(self, folder: Path | None = None, compile: Callable | None = None,
                 toolkit: Callable[[], str] | None = None):
        self.folder = Path(folder) if folder is not None else cache_dir()
        self._compile = compile or nvrtc_compile
        self._toolkit = toolkit or toolkit_version
        self.hits = 0
        self.misses = 0

    def key(self, source: str, arch: str, options: tuple[str, ...]) -> str:
        """The SHA-256 of everything the compiled bytes depend on."""
        h = hashlib.sha256()
        for part in (f"dnnc-cuda-cache {CACHE_SCHEMA}", arch, self._toolkit(),
                     "\0".join(options), source):
            h.update(part.encode())
            h.update(b"\0\1")   # separator: no two tuples of parts hash alike
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.cubin"

    def get(self, source: str, arch: str, options: tuple[str, ...]) -> bytes:
        """The compiled module of `source`: read from the cache, else compiled and stored.
        A cache folder that cannot be written only costs the caching."""
        file = self.path(self.key(source, arch, options))
        try:
            data = file.read_bytes()
            if data:
                self.hits += 1
                return data
        except OSError:
            pass
        self.misses += 1
        data = self._compile(source, arch, options)
        try:
            self._store(file, data)
        except OSError:
            pass
        return data

    @staticmethod
    def _store(file: Path, data: bytes) -> None:
        """Write `data` to `file` atomically: readers see the old file or the whole new one."""
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=file.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, file)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
