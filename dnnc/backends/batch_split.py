"""New batch sizes run at once: a segment that `ir.batching` proves batch-separable along a
symbolic axis 0 runs a size it has no code for on the code of another size (`BatchSplit`: the
items in slices of that size, the last one padded), on targets that allow it
(`TargetHooks.batch_split`). A size met `specialize_after` times is then compiled for in a
background thread (`BatchSplits`), and its own code replaces the split once ready.

It must never compile by itself (the runtime hands it the function that does) nor evict: the
specialisation cache is the runtime's (`executable.Executable`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable, Mapping

import numpy as np

from ..ir.batching import batch_symbol
from ..ir.segments import Segment
from .contract import CompiledSegment

log = logging.getLogger(__name__)

# calls of a batch size run on another size's code before its own is compiled (in the
# background); a size met once or twice costs no compile at all
SPECIALIZE_AFTER = 3
MAX_SPLITS = 256   # batch splits remembered (each a few objects: the counts of uses)


class BatchSplit:
    """A segment run at n items on its code for b items (`ir.batching` proved it
    batch-separable): the inputs that carry the batch (`carried`, positions in the segment's
    inputs) go in slices of b along axis 0, the others whole; the last slice, when short,
    is padded with copies of its last item and only its own items' outputs are kept.
    Reads like a compiled segment (`contract.CompiledSegment`) and shares `base`'s frames."""

    def __init__(self, base: CompiledSegment, items: int, carried: list[int]):
        self.base = base
        self.items = items
        self.carried = frozenset(carried)
        self.uses = 0
        self.step = base.step
        self.kernels = base.kernels
        self.viewed = base.viewed
        self.frames = base.frames
        self.frame = base.frame

    def run(self, arrays: list, frame) -> list[np.ndarray]:
        n = arrays[min(self.carried)].shape[0]
        b = self.items
        outs = [np.empty((n,) + tuple(t.shape[1:]), t.dtype.np)
                for t in self.base.escaping_types]
        for lo in range(0, n, b):
            hi = min(lo + b, n)
            if hi - lo == b:
                chunk = [a[lo:hi] if k in self.carried else a for k, a in enumerate(arrays)]
                self.base.run(chunk, frame, [o[lo:hi] for o in outs])
                continue
            chunk = [np.concatenate([a[lo:hi]] + [a[hi - 1:hi]] * (b - (hi - lo)))
                     if k in self.carried else a for k, a in enumerate(arrays)]
            for o, r in zip(outs, self.base.run(chunk, frame)):
                o[lo:hi] = r[:hi - lo]
        return outs


# compile(step, shapes, values): the runtime's exact compile of one specialisation
Compile = Callable[[Segment, tuple, tuple], CompiledSegment]


class BatchSplits:
    """The batch sizes one runtime runs on another size's code: key (segment index, shapes,
    values) -> its `BatchSplit`, newest last, counting their uses (`calls` counts the split
    calls), and the one background compile at a time that gives a size met
    `specialize_after` times (None: never) its own code."""

    def __init__(self, specialize_after: int | None = SPECIALIZE_AFTER):
        self.specialize_after = specialize_after
        self.calls = 0
        self._splits: OrderedDict[tuple, BatchSplit] = OrderedDict()
        self._symbols: dict[int, str | None] = {}   # segment index -> its batch symbol
        self.specialising: tuple | None = None     # the key a background compile works on
        self.unspecialisable: set[tuple] = set()   # keys whose compile failed

    def split(self, step: Segment, shapes: tuple, values: tuple,
              cache: Mapping[tuple, CompiledSegment], compile: Compile) -> BatchSplit | None:
        """A `BatchSplit` running `step` at `shapes` on the code of another batch size in
        `cache`: the one doing the least work (padding included), the larger on a tie; None
        where the segment is not batch-separable or no code of the same item shape exists.
        Counts the key's uses and starts its background `compile` at `specialize_after`."""
        key = (step.index, shapes, values)
        split = self._splits.get(key)
        if split is None:
            split = self._new_split(step, shapes, values, cache)
            if split is None:
                return None
            self._splits[key] = split
            while len(self._splits) > MAX_SPLITS:
                try:
                    self._splits.popitem(last=False)
                except KeyError:   # emptied by another thread meanwhile
                    break
        split.uses += 1
        self.calls += 1
        if self.specialize_after is not None and split.uses >= self.specialize_after and \
                self.specialising is None and key not in self.unspecialisable:
            self._specialise_in_background(step, shapes, values, compile)
        return split

    def _new_split(self, step: Segment, shapes: tuple, values: tuple,
                   cache: Mapping[tuple, CompiledSegment]) -> BatchSplit | None:
        if step.index not in self._symbols:
            self._symbols[step.index] = batch_symbol(step.nodes, step.inputs, step.escaping)
        symbol = self._symbols[step.index]
        if symbol is None:
            return None
        carried = [i for i, v in enumerate(step.inputs)
                   if v.const is None and v.type.rank and v.type.shape[0] == symbol]
        sizes = {shapes[i][0] for i in carried if len(shapes[i]) == step.inputs[i].type.rank}
        if not carried or len(sizes) != 1:
            return None
        n = sizes.pop()
        best = None
        for (index, base_shapes, base_values), seg in list(cache.items()):
            if index != step.index or base_values != values:
                continue
            b = base_shapes[carried[0]][0]
            if b < 1 or any(base_shapes[i] != ((b,) + tuple(shapes[i][1:]) if i in carried
                                               else shapes[i]) for i in range(len(shapes))):
                continue
            cost = (-(-n // b) * b, -b)   # items computed, then calls
            if best is None or cost < best[0]:
                best = (cost, seg, b)
        if best is None:
            return None
        return BatchSplit(best[1], best[2], carried)

    def _specialise_in_background(self, step: Segment, shapes: tuple, values: tuple,
                                  compile: Compile) -> None:
        """Compile `step` for `shapes` in a daemon thread; calls go on being split until the
        code is in the cache (a failed compile leaves the split in place for good)."""
        key = (step.index, shapes, values)
        self.specialising = key

        def work():
            try:
                compile(step, shapes, values)
            except Exception as exc:   # noqa: BLE001 - the split keeps working; say why
                self.unspecialisable.add(key)
                log.warning("segment %d: no code of its own for shapes %s (%s); calls keep "
                            "running on another batch size's code", step.index, shapes, exc)
            finally:
                self._splits.pop(key, None)
                self.specialising = None

        threading.Thread(target=work, name="dnnc-specialise", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no background compile is running; whether none is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.specialising is not None:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def clear(self) -> None:
        """Forget every split and batch symbol (the steps were planned again: both are keyed
        by the old steps' indices)."""
        self._splits.clear()
        self._symbols.clear()

    def after_fork_in_child(self) -> None:
        """A background compile the parent ran does not run in a forked child."""
        self.specialising = None
