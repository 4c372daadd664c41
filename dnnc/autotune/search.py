"""Search over a template's knob space: which configs to measure next.

`RandomSearch` draws configs of the space uniformly, never one already measured (by this run
or, through the log, by an earlier one): the baseline every guided search is measured against.
`ModelSearch` proposes the configs the cost model (`cost_model.py`) ranks fastest among a pool
of unmeasured ones, keeping a share `epsilon` of each batch random (exploration: the model
only learns where it measures); until the model has trained it draws at random.
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


class ModelSearch(RandomSearch):
    def __init__(self, space: Space, rng: np.random.Generator, done: set[str], model,
                 featurize, pool: int = 256, epsilon: float = 0.15):
        super().__init__(space, rng, done)
        self.model = model
        self.featurize = featurize   # config -> feature vector (builds the PrimFunc)
        self.pool = pool
        self.epsilon = epsilon

    def next(self, n: int) -> list:
        if not self.model.trained:
            return super().next(n)
        candidates = super().next(self.pool)   # marked as taken: give back the unchosen
        if len(candidates) <= n:
            return candidates
        scores = self.model.predict(np.stack([self.featurize(c) for c in candidates]))
        explore = int(round(n * self.epsilon))
        order = list(np.argsort(-scores, kind="stable"))
        chosen = order[:n - explore]
        rest = order[n - explore:]
        chosen += [rest[int(i)] for i in self.rng.permutation(len(rest))[:explore]]
        for k in set(range(len(candidates))) - set(chosen):
            self.done.discard(canonical(dataclasses.asdict(candidates[k])))
        return [candidates[k] for k in chosen]
