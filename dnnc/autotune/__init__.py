"""Autotuning: the tasks of a model (`tasks.py`), the features of a scheduled kernel
(`features.py`), the XGBoost cost model (`cost_model.py`), the search (`search.py`),
measurement in worker processes (`measure.py`), the JSON Lines records (`records.py`) and the
loop that ties them (`tuner.py`). `dnnc.tune` and `dnnc tune` drive it (docs/tuning.md)."""
