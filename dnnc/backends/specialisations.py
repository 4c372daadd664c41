"""The compiled specialisations one runtime keeps: key (segment index, input shapes, values of
value inputs) -> its `contract.CompiledSegment`, least recently used first, at most `size` per
segment (200 batch sizes of an MLP held 274 MB before the cache was bounded: each costs its
machine code and, per calling thread, its arena), and the figures summed over them.

Reads and moves are safe from any thread without a lock (a specialisation evicted while a
call runs it stays alive until that call returns); adding is the runtime's, under its lock.
It must never compile, nor know what a key's shapes mean."""

from __future__ import annotations

from collections import OrderedDict

from .contract import CompiledSegment

# specialisations kept per segment
DEFAULT_CACHE_SIZE = 32


class Specialisations(OrderedDict):
    """An LRU mapping of compiled specialisations, bounded per segment; `evictions` counts
    the dropped (they compile again if their shapes come back)."""

    def __init__(self, size: int = DEFAULT_CACHE_SIZE):
        super().__init__()
        self.size = size
        self.evictions = 0

    def use(self, key: tuple) -> CompiledSegment | None:
        """The specialisation at `key`, now the most recently used; None if none."""
        seg = self.get(key)
        if seg is not None:
            try:
                self.move_to_end(key)
            except KeyError:   # evicted by another thread meanwhile: `seg` still works
                pass
        return seg

    def add(self, key: tuple, seg: CompiledSegment) -> None:
        """Keep `seg` at `key`, dropping its segment's least recently used specialisations
        beyond `size`."""
        self[key] = seg
        keys = [k for k in list(self) if k[0] == key[0]]   # list(): one atomic copy
        for old in keys[:max(0, len(keys) - self.size)]:
            del self[old]
            self.evictions += 1

    def kernel_counts(self) -> dict[int, int]:
        """Segment index -> the kernels of its first specialisation that counts them (one
        restored from an artifact older than the count does not)."""
        compiled: dict[int, int] = {}
        for (index, *_), seg in list(self.items()):
            if seg.kernel_count:
                compiled.setdefault(index, seg.kernel_count)
        return compiled

    @property
    def arena_bytes(self) -> int:
        """Arena bytes a calling thread holds: the sum over every specialisation (each
        segment and shape has an arena of its own, all kept)."""
        return sum(s.arena_bytes for s in list(self.values()))

    @property
    def memory_stats(self) -> dict[str, int]:
        """`plan_memory`'s figures summed like `arena_bytes`: `naive_bytes` (every
        intermediate in a block of its own) and `live_lower_bound_bytes` (per arena, the most
        bytes live at once), and `workspace_bytes`: the part of `arena_bytes` that holds
        kernels' workspace past the planned values (llvm); empty when no specialisation was
        planned in this process (all restored from an artifact)."""
        planned = [s for s in list(self.values()) if s.memory is not None]
        if not planned:
            return {}
        plans = [s.memory for s in planned]
        return {"naive_bytes": sum(p.naive_bytes for p in plans),
                "live_lower_bound_bytes": sum(p.live_lower_bound_bytes for p in plans),
                "inplace_kernels": sum(len(p.inplace) for p in plans),
                "workspace_bytes": sum(s.arena_workspace_bytes for s in planned)}
