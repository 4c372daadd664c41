"""The cost model (dnnc/autotune/cost_model.py): it learns an order within tasks of unlike
scales, ranks a clearly faster config first after a few records, trains nothing from a task
without a pair to order, and predicts the same from the same seed."""

import numpy as np

from dnnc.autotune.cost_model import CostModel


def test_the_cost_model_learns_an_order_within_tasks(rng):
    """Rows whose label grows with feature 0 (in two tasks of unlike scales): the trained
    model ranks unseen rows of either task in that order."""
    from dnnc.autotune.cost_model import CostModel

    model = CostModel(seed=0)
    for task, scale in (("a", 1.0), ("b", 100.0)):
        for _ in range(40):
            f = rng.uniform(0, 10, 8)
            model.add(task, f, scale * (1 + f[0]) + rng.normal(0, 0.01))
    assert not model.trained
    model.fit()
    probe = np.zeros((5, 8))
    probe[:, 0] = [0.5, 2.5, 4.5, 6.5, 8.5]
    probe[:, 1:] = rng.uniform(0, 10, (5, 7))
    assert list(np.argsort(model.predict(probe))) == [0, 1, 2, 3, 4]


def _synthetic(rng, tasks: int = 3, rows: int = 8, width: int = 6):
    """(task, features, label) rows: random features but for feature 1, above 0.5 in every
    other row of a task; such a config runs four times as fast (label: throughput over the
    task's slow configs', noise 2%)."""
    out = []
    for t in range(tasks):
        for r in range(rows):
            f = rng.uniform(0, 1, width)
            f[1] = rng.uniform(0.6, 1.0) if r % 2 else rng.uniform(0.0, 0.4)
            out.append((f"t{t}", f, (4.0 if f[1] > 0.5 else 1.0) * rng.normal(1, 0.02)))
    return out


def test_a_few_records_rank_a_clearly_faster_config_first(rng):
    """24 records of 3 tasks; in each of 5 unseen sets of 8 configs, the one fast config is
    ranked first."""
    model = CostModel(seed=0)
    for task, f, label in _synthetic(rng):
        model.add(task, f, label)
    model.fit()
    assert model.trained
    for _ in range(5):
        probe = rng.uniform(0, 1, (8, 6))
        probe[:, 1] = rng.uniform(0, 0.4, 8)
        fast = int(rng.integers(8))
        probe[fast, 1] = 0.9
        assert int(np.argmax(model.predict(probe))) == fast


def test_untrained_it_scores_zero_and_a_lone_row_trains_nothing(rng):
    model = CostModel(seed=0)
    assert np.array_equal(model.predict(rng.uniform(0, 1, (3, 6))), np.zeros(3))
    for t in ("a", "b"):   # one row a task: no pair to order
        model.add(t, rng.uniform(0, 1, 6), 1.0)
    model.fit()
    assert not model.trained
    assert model.predict(np.ones(6)).shape == (1,)   # one row of features


def test_the_same_seed_and_rows_predict_the_same(rng):
    rows, probe = _synthetic(rng), rng.uniform(0, 1, (10, 6))
    predictions = []
    for _ in range(2):
        model = CostModel(seed=3)
        for task, f, label in rows:
            model.add(task, f, label)
        model.fit()
        predictions.append(model.predict(probe))
    np.testing.assert_array_equal(predictions[0], predictions[1])
