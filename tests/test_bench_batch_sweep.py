"""bench/batch_sweep.py: a model whose time per item grows with the batch is flagged (issue
31, item 1); the sweep runs a zoo model end to end on the host's target."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "batch_sweep.py"


def _script():
    spec = importlib.util.spec_from_file_location("batch_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_larger_batch_costing_more_per_item_is_a_cliff():
    sweep = _script()
    assert sweep.cliffs({1: 10.0, 8: 4.0, 32: 3.0}, 0.1) == []
    assert sweep.cliffs({1: 10.0, 8: 4.0, 32: 4.3}, 0.1) == []          # within the slack
    assert sweep.cliffs({1: 10.0, 8: 4.0, 32: 4.5}, 0.1) == [(8, 32)]
    assert sweep.cliffs({1: 3.0, 8: 4.0, 32: 5.0}, 0.1) == [(1, 8), (1, 32), (8, 32)]


def test_the_sweep_times_every_size_of_a_zoo_model(capsys):
    sweep = _script()
    status = sweep.main(["--models", "mlp", "--batches", "1,4", "--repeat", "2",
                         "--slack", "1000"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0 and out[-1] == "# 0 of 1 model(s) with a cliff, 0 failed"
    assert out[1].startswith("mlp") and "b1:" in out[1] and "b4:" in out[1]
    assert "another size's code" not in out[1]   # each size warmed up to its own code
