"""Targets are data: what a compile is for, readable by every layer.

A `Target` names the backend and describes the machine (vector width, cores, CPU name and
features) so passes can make target-dependent choices (layouts, fusion limits) by reading it,
without importing a backend. Backends build the Target for the machine they run on.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fusion:
    """What a target's kernels can take as one (read by the fuse_ops pass)."""

    max_group: int = 8   # nodes per kernel at most (compile time grows with the expression)
    # anchor op -> the layout ops (Reshape, Transpose, ...) after its epilogue its template
    # can store through, as pairs (hashable)
    store_remaps: tuple[tuple[str, frozenset[str]], ...] = ()


@dataclass(frozen=True)
class Target:
    name: str                      # "numpy", "llvm", "cuda"
    cpu: str = ""
    features: tuple[str, ...] = field(default_factory=tuple)
    vector_bits: int = 128
    threads: int = 1
    fusion: Fusion = Fusion()

    @property
    def dense_panel(self) -> int:
        """Columns of B per packed panel: two vector registers of float32."""
        return 2 * self.vector_bits // 32

    @property
    def conv_panel(self) -> int:
        """Output channels per packed conv weight block: two vector registers of float32."""
        return 2 * self.vector_bits // 32
