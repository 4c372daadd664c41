"""What the public `opt_level` decides, named where it is decided: the graph pipeline's level
(`passes.manager.PIPELINE`), whether the compiled targets reuse arena memory
(`backends.memory.plan_memory`), and the code generator's level (LLVM's -O). One function,
`levels`, derives the three from `opt_level`; `DEFAULT_OPT_LEVEL` is the one default.

Passes and backends both read it, so it sits below them: it must never import a pass, a
backend or the compiler."""

from __future__ import annotations

from dataclasses import dataclass

OPT_LEVELS = range(0, 4)
"""The public opt levels: LLVM's -O0 to -O3; the graph pipeline's passes start at levels 1
and 2."""

DEFAULT_OPT_LEVEL = 3

MEMORY_REUSE_LEVEL = 1
"""The opt level from which the compiled targets reuse arena memory (`backends/memory.py`)."""


@dataclass(frozen=True)
class Levels:
    """The three decisions one `opt_level` makes."""

    graph: int            # passes of `passes.manager.PIPELINE` starting at this level or below
    reuse_memory: bool    # arena space reused (else every intermediate has a block of its own)
    codegen: int          # LLVM's -O level: target machine and optimisation pipeline (0: none)


def levels(opt_level: int = DEFAULT_OPT_LEVEL) -> Levels:
    """The graph level, memory reuse and code-generation level `opt_level` stands for."""
    return Levels(graph=opt_level, reuse_memory=opt_level >= MEMORY_REUSE_LEVEL,
                  codegen=min(opt_level, 3))


DEFAULT_LEVELS = levels(DEFAULT_OPT_LEVEL)
