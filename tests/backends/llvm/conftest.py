"""Fixtures shared by the llvm backend's tests."""

import os
import subprocess
import sys

import numpy as np
import pytest


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """{threads: {key: array}}: the requesting test module run as a script (`python FILE OUT`,
    which saves its arrays to OUT.npz) in one child process per thread count, so a race or a
    signal fails the test instead of the run."""
    out = {}
    for threads in (1, 2):
        path = tmp_path_factory.mktemp(f"t{threads}") / "out.npz"
        env = dict(os.environ, DNNC_NUM_THREADS=str(threads))
        proc = subprocess.run([sys.executable, request.module.__file__, str(path)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"threads={threads}: rc {proc.returncode}\n{proc.stderr}"
        with np.load(path) as data:
            out[threads] = dict(data)
    return out
