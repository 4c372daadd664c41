"""Search over a template's knob space: which configs to measure next.

`RandomSearch` draws configs of the space uniformly, never one already measured (by this run
or, through the log, by an earlier one): the baseline every guided search is measured against.
The XGBoost-guided search (issue 13's cost model) will propose from the same space through the
same `next(n)`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..backends.space import Space
from .records import canonical


class RandomSearch:
    def __init__(self, space: Space, rng: np.random.Generator, done: set[str] = frozenset()):
        self.space = space
        self.rng = rng
        self.done = set(done)   # canonical JSON of the configs measured already

    def next(self, n: int) -> list:
        """Up to `n` configs of the space not measured yet (fewer when the space runs out)."""
        out = []
        # sample draws distinct configs; ask for more than needed to skip the measured ones
        for config in self.space.sample(self.rng, min(len(self.done) + 4 * n, 1 << 16)):
            key = canonical(dataclasses.asdict(config))
            if key in self.done:
                continue
            self.done.add(key)
            out.append(config)
            if len(out) == n:
                break
        return out
