"""The registry of targets: what each target is and can do, as data. The compiler layer and the
CLI read it and never compare a target's name (tests/compiler/test_targets.py enforces that).

A new target is one package under `dnnc/backends/` plus one `TargetSpec` line in `REGISTRY`.
The runtime factories and artifact codecs named here live with the code they drive
(`driver.py`, `artifact.py`); those modules import this one lazily, inside functions, because
this one imports them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Callable

from ..ir.target import Fusion, Target
from . import artifact, driver


@dataclass(frozen=True)
class ArtifactCodec:
    """How a target's runtime goes into an artifact and comes back (see artifact.py)."""
    export: Callable      # (runtime, manifest, files) -> None
    check: Callable       # (manifest, path) -> None: raise if this machine cannot run it
    restore: Callable     # (graph, manifest, read, progress) -> runtime


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    runtime: Callable                  # (graph, opt_level, target, **options) -> (graph, runtime)
    options: tuple[str, ...] = ()      # the compile options beyond the common ones it uses
    emits: tuple[str, ...] = ()        # source kinds `CompiledModel.source` gives (--emit)
    codec: ArtifactCodec | None = None  # None: its models cannot be saved
    runs_passes: bool = False          # the graph pipeline: --dump-ir, --bisect-passes, ...
    machine: Callable | None = None    # () -> this host's Target (None: no machine to describe)
    layouts: tuple[str, ...] = ()      # the layout rewrites it wants (passes/convert_layout.py)
    fusion: Callable | None = None     # () -> Fusion: what its kernels can take as one (fuse_ops)
    panels: Callable | None = None     # (vector bits) -> ((layout, panel width), ...)
    templates: Callable | None = None  # () -> {(target, anchor pattern): templates, in order}
    tuning: Callable | None = None     # () -> what the tuner needs (backends/llvm/tuning.py)
    speed: int = 0                     # rank among the targets available on the host
    available: Callable = lambda: True  # () -> whether this host can run it
    require: Callable = lambda: None   # () -> None, else raises the error saying why it cannot
    returns: tuple[str, ...] = ("numpy",)  # the array kinds a call can return, the default first
    about: Callable = lambda: ""       # () -> its libraries' versions, or why it cannot run

    @property
    def generates_code(self) -> bool:
        return bool(self.emits)

    def target(self, cpu: Target | None = None, precision: str | None = None) -> Target:
        """The Target a compile for this target reads, passes and runtime alike: the machine
        `cpu` describes (the `cpu` option), else this host's, with this target's layouts and
        fusion limits, its templates' panel widths on that machine, and `precision` (the
        `precision` option; None: fp32)."""
        machine = cpu or (self.machine() if self.machine else Target(self.name))
        return replace(machine, name=self.name, layouts=self.layouts,
                       fusion=self.fusion() if self.fusion else Fusion(),
                       panels=self.panels(machine.vector_bits) if self.panels else (),
                       precision=precision or "fp32")


def _numpy_about() -> str:
    import numpy

    return f"NumPy {numpy.__version__}"


def _has_llvmlite() -> bool:
    return importlib.util.find_spec("llvmlite") is not None


def _llvm_host() -> Target:
    from ..backends.llvm.cpu import host_target

    return host_target()


def _llvm_fusion() -> Fusion:
    from ..backends.llvm import FUSION

    return FUSION


def _llvm_templates() -> dict:
    from ..backends.llvm.schedules import TEMPLATES

    return TEMPLATES


def _llvm_tuning():
    from ..backends.llvm import tuning

    return tuning


def _llvm_panels(vector_bits: int) -> tuple[tuple[str, int], ...]:
    from ..backends.llvm import panels

    return panels(vector_bits)


def _llvm_about() -> str:
    if not _has_llvmlite():
        return "needs llvmlite (pip install llvmlite)"
    import llvmlite
    import llvmlite.binding

    llvm = ".".join(map(str, llvmlite.binding.llvm_version_info))
    return f"llvmlite {llvmlite.__version__}, LLVM {llvm}"


def _has_gpu() -> bool:
    from ..backends.cuda import device

    return device.available()


def _require_gpu() -> None:
    from ..backends.cuda import device

    device.import_cupy()


def _cuda_device() -> Target:
    from ..backends.cuda import device

    return device.machine()


def _cuda_about() -> str:
    from ..backends.cuda import device

    if not device.available():
        return device.unavailable_reason()
    v = device.versions()
    return (f"CuPy {v['cupy']}, CUDA runtime {v['runtime']}, NVRTC {v['nvrtc']}, driver "
            f"{v['driver']}, {device.describe()}")


def _cuda_fusion() -> Fusion:
    from ..backends.cuda import FUSION

    return FUSION


def _cuda_tuning():
    from ..backends.cuda import tuning

    return tuning


def _cuda_templates() -> dict:
    from ..backends.cuda.schedules import TEMPLATES

    return TEMPLATES


# Listed in the order messages name them (the reference first).
REGISTRY: dict[str, TargetSpec] = {spec.name: spec for spec in (
    # the reference interprets the graph as imported: no passes, no CPU, no code
    TargetSpec("numpy", "the NumPy reference interpreter", driver.numpy_runtime,
               codec=ArtifactCodec(artifact.numpy_export, artifact.no_check,
                                   artifact.numpy_restore), about=_numpy_about),
    TargetSpec("llvm", "native code for this CPU through LLVM", driver.llvm_runtime,
               options=("cpu", "passes", "dump_ir", "cache_size", "tuning_log"),
               emits=("llvm-ir", "asm", "loop"),
               codec=ArtifactCodec(artifact.llvm_export, artifact.llvm_check,
                                   artifact.llvm_restore),
               runs_passes=True, machine=_llvm_host,
               # dense and conv weights packed into the micro-kernels' panels (convert_layout)
               layouts=("pack_dense", "pack_conv"), fusion=_llvm_fusion, panels=_llvm_panels,
               templates=_llvm_templates, tuning=_llvm_tuning,
               speed=10, available=_has_llvmlite, about=_llvm_about),
    TargetSpec("cuda", "NVIDIA GPUs through NVRTC (CuPy)", driver.cuda_runtime,
               options=("passes", "dump_ir", "cache_size", "tuning_log", "precision"),
               emits=("cuda", "loop"),
               # device arrays by default: a caller on the GPU pays no copy to the host
               returns=("cupy", "numpy"),
               codec=ArtifactCodec(artifact.cuda_export, artifact.cuda_check,
                                   artifact.cuda_restore),
               runs_passes=True, machine=_cuda_device, layouts=(), fusion=_cuda_fusion,
               templates=_cuda_templates, tuning=_cuda_tuning, speed=20,
               available=_has_gpu, require=_require_gpu, about=_cuda_about),
)}


def default_target() -> str:
    """The fastest target available on this host (cuda with CuPy and a GPU, else llvm)."""
    return max((s for s in REGISTRY.values() if s.available()), key=lambda s: s.speed).name


def fastest_first() -> list[str]:
    """Every target's name, the fastest first (the order the CLI offers them in)."""
    return [s.name for s in sorted(REGISTRY.values(), key=lambda s: -s.speed)]


def output_kinds() -> list[str]:
    """Every kind of array some target's calls return (`TargetSpec.returns`), in order."""
    return list(dict.fromkeys(k for s in REGISTRY.values() for k in s.returns))


def using(option: str) -> list[str]:
    """The targets that use compile option `option`."""
    return [s.name for s in REGISTRY.values() if option in s.options]
