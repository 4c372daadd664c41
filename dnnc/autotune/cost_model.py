"""The cost model: XGBoost ranking configs of a task by their features (`features.py`).

Trained on measured records: a record's label is its throughput normalised within its task
(the task's default time over its time: 1 for the default, 2 for twice as fast), its group the
task, and the objective pairwise ranking (`rank:pairwise`): only the order within a task
matters, so tasks of unlike sizes train one model together, and records of other tasks (and of
earlier runs in the log) warm-start a new task. Retrained from scratch when new records
arrive (a few hundred rows train in milliseconds). Errors train nothing.
"""

from __future__ import annotations

import numpy as np

PARAMS = {"objective": "rank:pairwise", "eta": 0.3, "max_depth": 6, "min_child_weight": 1,
          "subsample": 1.0, "lambda": 1.0, "verbosity": 0, "nthread": 1}
ROUNDS = 50


class CostModel:
    def __init__(self, seed: int = 0):
        self.seed = seed
        self.booster = None
        self.rows: dict[str, list[tuple[np.ndarray, float]]] = {}   # task -> (features, label)

    def add(self, task: str, feats: np.ndarray, label: float) -> None:
        self.rows.setdefault(task, []).append((np.asarray(feats, float), float(label)))

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def fit(self) -> None:
        """Train on every row so far (tasks with at least two rows: a pair to order)."""
        import xgboost as xgb

        groups = [rows for rows in self.rows.values() if len(rows) >= 2]
        if not groups:
            return
        x = np.stack([f for rows in groups for f, _ in rows])
        y = np.array([label for rows in groups for _, label in rows])
        data = xgb.DMatrix(x, label=y)
        data.set_group([len(rows) for rows in groups])
        self.booster = xgb.train(dict(PARAMS, seed=self.seed), data, ROUNDS)

    def predict(self, feats: np.ndarray) -> np.ndarray:
        """Scores of rows of features (higher: predicted faster); zeros before training."""
        import xgboost as xgb

        feats = np.atleast_2d(np.asarray(feats, float))
        if self.booster is None:
            return np.zeros(len(feats))
        return self.booster.predict(xgb.DMatrix(feats))
