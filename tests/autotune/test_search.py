"""The searches (dnnc/autotune/search.py) on a small synthetic space: they propose only
configs of the space, never one twice nor one measured already, run out exactly when the
space does, and the model-guided search takes the configs its model ranks first, giving the
others back for later batches."""

import dataclasses
from dataclasses import dataclass

import numpy as np

from dnnc.autotune.records import canonical
from dnnc.autotune.search import ModelSearch, RandomSearch
from dnnc.backends.space import Constraint, Space


@dataclass(frozen=True)
class Tile:
    rows: int
    cols: int
    unroll: int


def _space() -> Space:
    """4 x 4 x 2 tiles less those over 16 elements: 26 configs."""
    return Space("tile", Tile, {"rows": (1, 2, 4, 8), "cols": (1, 2, 4, 8), "unroll": (1, 2)},
                 [Constraint("rows * cols <= 16", lambda c: c.rows * c.cols <= 16)])


def _key(config) -> str:
    return canonical(dataclasses.asdict(config))


def test_random_search_proposes_each_config_of_the_space_once(rng):
    space = _space()
    every = {_key(c) for c in space.configs()}
    assert len(every) == 26
    search, seen = RandomSearch(space, rng), []
    while batch := search.next(5):
        assert len(batch) <= 5
        for config in batch:
            assert space.check(config) == config   # in the space (ConfigError if not)
        seen += [_key(c) for c in batch]
    assert len(seen) == len(set(seen)) and set(seen) == every
    assert search.next(5) == []


def test_random_search_skips_what_was_measured_before(rng):
    """`done`: configs a log already holds for the task; they are never proposed."""
    space = _space()
    configs = list(space.configs())
    done = {_key(c) for c in configs[::2]}
    search = RandomSearch(space, rng, done)
    got = search.next(100)
    assert {_key(c) for c in got} == {_key(c) for c in configs[1::2]}
    assert search.next(1) == []


def test_random_search_is_repeatable_from_its_seed():
    one = RandomSearch(_space(), np.random.default_rng(7)).next(6)
    two = RandomSearch(_space(), np.random.default_rng(7)).next(6)
    assert one == two and len(one) == 6


class ByRows:
    """A stand-in cost model, already trained: the bigger the tile's rows, the faster."""

    trained = True

    def predict(self, feats):
        return np.asarray(feats)[:, 0]


def _featurize(config: Tile) -> np.ndarray:
    return np.array([config.rows, config.cols, config.unroll], float)


def test_model_search_takes_the_ranked_first_and_gives_the_rest_back(rng):
    space = _space()
    search = ModelSearch(space, rng, set(), ByRows(), _featurize, pool=64, epsilon=0.0)
    first = search.next(4)
    assert [c.rows for c in first] == [8, 8, 8, 8]   # the 4 configs with rows 8, first
    assert len({_key(c) for c in first}) == 4
    seen = [_key(c) for c in first]
    while batch := search.next(4):
        for config in batch:
            assert space.check(config) == config
        seen += [_key(c) for c in batch]
    # the unchosen candidates of each batch came back later: the whole space, once each
    assert len(seen) == len(set(seen)) == 26


def test_model_search_explores_a_share_at_random_and_draws_at_random_untrained():
    """epsilon 0.5: half of each batch the model's first two, half drawn from the rest (in
    ten seeded batches, at least one draw lands outside the rows-8 configs)."""
    space = _space()
    rows = []
    for seed in range(10):
        search = ModelSearch(space, np.random.default_rng(seed), set(), ByRows(), _featurize,
                             pool=64, epsilon=0.5)
        rows.append(sorted(c.rows for c in search.next(4)))
    assert all(r[-2:] == [8, 8] for r in rows)
    assert any(r[0] < 8 for r in rows)
    untrained = ByRows()
    untrained.trained = False
    plain = ModelSearch(space, np.random.default_rng(3), set(), untrained, _featurize)
    assert plain.next(5) == RandomSearch(space, np.random.default_rng(3)).next(5)
