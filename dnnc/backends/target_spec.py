"""What a target is, as data: `TargetSpec`, the entry a target package gives the registry
(`backends/registry.py`), and `ArtifactCodec`, how its runtime goes into an artifact and comes
back. Each target package builds its own entry (`backends/<target>/entry.py`).

This module only describes: it imports no target package and no layer above `ir/`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from typing import Callable

from ..ir.target import PRECISIONS, Fusion, Target


@dataclass(frozen=True)
class ArtifactCodec:
    """How a target's runtime goes into an artifact and comes back (`compiler/artifact.py`
    owns the container; the codec, in the target's package, its part of the manifest and its
    member files)."""
    export: Callable      # (runtime, manifest, files) -> None
    check: Callable       # (manifest, path) -> None: raise if this machine cannot run it
    restore: Callable     # (spec, graph, manifest, read, progress) -> runtime; `spec` is the
    #                       target's own entry, whose `target()` builds the machine it runs on


def _no_check(target: Target, render_only: bool) -> None:
    pass


def lazy(module: str, name: str | None = None) -> Callable:
    """() -> module `module` (absolute), or its attribute `name`, imported on the first call:
    an entry names its templates and tuning this way, so listing the targets loads neither."""
    def load():
        found = importlib.import_module(module)
        return found if name is None else getattr(found, name)
    return load


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    # (graph, opt_level, target, *, progress, reuse_memory, cache_size, tuned, render_only,
    # outputs) -> the runtime of `graph`, which the passes (when `runs_passes`) have made
    runtime: Callable
    returns: tuple[str, ...]           # the array kinds a call can return, the default first
    options: tuple[str, ...] = ()      # the compile options beyond the common ones it uses
    # source kind -> the suffix of the file `dnnc compile --emit KIND DIR` writes: what
    # `CompiledModel.source(kind)` gives; empty: it generates no code
    emits: dict[str, str] = field(default_factory=dict)
    source_aliases: tuple[str, ...] = ()  # older spellings of its kinds `source()` still takes
    codec: ArtifactCodec | None = None  # None: its models cannot be saved
    cached: bool = False               # compiles kept in the on-disk compile cache
    runs_passes: bool = False          # the graph pipeline: --dump-ir, --bisect-passes, ...
    machine: Callable | None = None    # () -> this host's Target (None: no machine to describe)
    layouts: tuple[str, ...] = ()      # the layout rewrites it wants (passes/convert_layout.py)
    # (machine Target, precision) -> the layouts of a compile there, where they depend on them
    layouts_for: Callable | None = None
    fusion: Callable | None = None     # () -> Fusion: what its kernels can take as one (fuse_ops)
    panels: Callable | None = None     # (vector bits) -> ((layout, panel width), ...)
    templates: Callable | None = None  # () -> {(target, anchor pattern): templates, in order}
    tuning: Callable | None = None     # () -> what the tuner needs (backends/llvm/tuning.py)
    speed: int = 0                     # rank among the targets available on the host
    available: Callable = lambda: True  # () -> whether this host can run it
    require: Callable = lambda: None   # () -> None, else raises the error saying why it cannot
    # (target, render_only) -> None, else raises, before any pass runs, what stops this
    # compile (cuda: no CuPy or GPU unless only rendering; a precision without tensor cores)
    check_compile: Callable = _no_check
    about: Callable = lambda: ""       # () -> its libraries' versions, or why it cannot run
    # () -> the versions of the libraries its code comes from (llvm: llvmlite and LLVM), part
    # of the compile cache's key: a new compiler never answers from an old one's entry
    versions: Callable = lambda: ()
    # (mcpu, mattr) -> the Target `--mcpu`/`--mattr` describe (for a target with the `cpu`
    # option), raising ValueError for a name it does not know
    cpu_from: Callable | None = None
    # (a DLPack object on a device its calls take) -> the same array, unmoved, with
    # `__cuda_array_interface__` (cuda: CuPy's from_dlpack); None: it takes no device arrays
    from_dlpack: Callable | None = None
    # at precision fp16 / bf16 its compiles store float32 models in that type
    # (`Target.half_storage`): its templates read 16-bit operands
    half_storage: bool = False
    # the values its `precision` option takes (for a target with that option), fp32 first
    precisions: tuple[str, ...] = PRECISIONS
    # (the machine's Target) -> the half types its kernels compute in on that machine
    # (`Target.half_arithmetic`); None: both float16 and bfloat16
    half_arithmetic: Callable | None = None
    # (the machine's Target, the graph) -> the precision a compile that names none computes
    # the graph in (llvm: a bfloat16 file's products in bf16 where the CPU has vdpbf16ps);
    # None: fp32 for every graph
    file_precision: Callable | None = None

    @property
    def generates_code(self) -> bool:
        return bool(self.emits)

    def target(self, cpu: Target | None = None, precision: str | None = None) -> Target:
        """The Target a compile for this target reads, passes and runtime alike: the machine
        `cpu` describes (the `cpu` option), else this host's, with this target's layouts (for
        that machine and precision) and
        fusion limits, its templates' panel widths on that machine, `precision` (the
        `precision` option; None: fp32), whether it stores models in that precision and the
        half types its kernels compute in there."""
        machine = cpu or (self.machine() if self.machine else Target(self.name))
        half = self.half_arithmetic(machine) if self.half_arithmetic else \
            Target.half_arithmetic
        layouts = self.layouts_for(machine, precision or "fp32") if self.layouts_for else \
            self.layouts
        return replace(machine, name=self.name, layouts=layouts,
                       fusion=self.fusion() if self.fusion else Fusion(),
                       panels=self.panels(machine.vector_bits) if self.panels else (),
                       precision=precision or "fp32", half_storage=self.half_storage,
                       half_arithmetic=half)
