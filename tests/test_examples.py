"""The examples run as the README says and print what they promise."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_prints_both_latencies_and_their_ratio():
    pytest.importorskip("onnxruntime")
    done = subprocess.run([sys.executable, str(REPO / "examples" / "quickstart.py"),
                           "--model", "mlp"], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "outputs match onnxruntime" in out
    ours = float(re.search(r"^  dnnc \w+ +([\d.]+) ms$", out, re.M).group(1))
    theirs = float(re.search(r"^  onnxruntime [\d.]+ +([\d.]+) ms$", out, re.M).group(1))
    ratio = float(re.search(r"^  dnnc / onnxruntime +([\d.]+) ", out, re.M).group(1))
    assert ratio == pytest.approx(ours / theirs, rel=0.1)   # of the 3-decimal figures
