"""bench/cpu.py: dnnc timed against every installed peer (onnxruntime, OpenVINO in its default
and its f32 precision) in one table, each peer's precision stated; a peer whose runtime is
missing is left out with a note; `--load alternate` runs against each peer (issue 32, item 5)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "cpu.py"


def _script(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_cpu", module)   # its dataclass looks itself up
    spec.loader.exec_module(module)
    return module


def test_every_peer_has_a_column_a_ratio_and_its_precision(capsys, monkeypatch):
    pytest.importorskip("openvino")
    bench = _script(monkeypatch)
    # (no --threads: the worker pool may be running already, its thread count fixed)
    bench.main(["--models", "mlp", "--repeat", "2", "--alone-blocks", "1"])
    out = capsys.readouterr().out.splitlines()
    assert "onnxruntime" in out[0] and "openvino" in out[0] and "threads each" in out[0]
    assert "openvino-f32 ms" in out[1]
    row = out[2].split()
    assert row[0] == "mlp" and row[-2] == "ok"
    ort, ov, ov_f32 = row[-1].split("/")
    assert ort == "f32" and ov_f32 == "f32" and ov in ("f32", "bf16", "f16")
    assert len(row) == 5 + 2 * 3 + 2   # dnnc ms, then each peer's ms and dnnc/peer
    assert all(float(x) > 0 for x in row[4:11])
    assert [line.split(":")[0] for line in out[3:]] == [
        "geometric mean dnnc/onnxruntime", "geometric mean dnnc/openvino",
        "geometric mean dnnc/openvino-f32"]


def test_a_peer_not_installed_is_left_out_with_a_note(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)   # import openvino raises ImportError
    bench = _script(monkeypatch)
    assert bench.installed_peers("onnxruntime,openvino,openvino-f32") == ["onnxruntime"]
    notes = capsys.readouterr().out
    assert "openvino: openvino is not installed here" in notes
    assert "openvino-f32: openvino is not installed here" in notes


def test_alternating_calls_run_against_each_peer(capsys, monkeypatch):
    pytest.importorskip("openvino")
    bench = _script(monkeypatch)
    bench.main(["--models", "mlp", "--repeat", "2", "--blocks", "1", "--load", "alternate",
                "--peers", "onnxruntime,openvino-f32"])
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("mlp")]
    assert [row.split("  ")[-1] for row in rows] == ["onnxruntime (f32)", "openvino-f32 (f32)"]
    assert out[-1].startswith("geometric mean alternating dnnc/openvino-f32")
