"""The registry of targets: every target's name mapped to the entry its package declares
(`TargetSpec`, `backends/target_spec.py`). The compiler layer, the CLI and the autotuner read
targets from here as data and never spell a target's name (tests/compiler/test_targets.py
scans for it); it sits in backends/, below them, so nothing imports upwards to reach it.

A new target is one package under `dnnc/backends/` whose `entry` module holds its `SPEC`, and
one line in `ENTRIES` (docs/adding_a_target.md). Entry modules are cheap to import: what needs
llvmlite or CuPy is imported when a target is used, so listing the targets loads neither.
This module must never import the compiler or the autotuner.
"""

from __future__ import annotations

from importlib import import_module

from .target_spec import ArtifactCodec, TargetSpec

__all__ = ["ArtifactCodec", "TargetSpec", "ENTRIES", "REGISTRY", "register", "default_target",
           "fastest_first", "output_kinds", "using", "source_kinds", "emit_kinds"]

ENTRIES = (
    ".numpy.entry",   # the reference interprets the graph as imported: no passes, no code
    ".llvm.entry",
    ".cuda.entry",
)
"""The target packages' entry modules, one line per target, in the order messages name the
targets (the reference first)."""

REGISTRY: dict[str, TargetSpec] = {}


def register(spec: TargetSpec) -> None:
    """Add `spec` to the registry (after those there, so messages name it last)."""
    if spec.name in REGISTRY:
        raise ValueError(f"a target named {spec.name!r} is registered already")
    REGISTRY[spec.name] = spec


for _entry in ENTRIES:
    register(import_module(_entry, __package__).SPEC)


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


def emit_kinds() -> list[str]:
    """Every kind of generated code some target writes with `dnnc compile --emit`."""
    return list(dict.fromkeys(k for s in REGISTRY.values() for k in s.emits))


def source_kinds() -> list[str]:
    """Every kind `CompiledModel.source` knows: the kinds targets emit, and their older
    spellings (`TargetSpec.source_aliases`)."""
    return list(dict.fromkeys(k for s in REGISTRY.values()
                              for k in (*s.emits, *s.source_aliases)))
