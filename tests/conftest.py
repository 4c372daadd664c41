"""Test-wide settings: every compile verifies the graph after each pass; random inputs come from
the `rng` fixture, seeded per test so that a failure reproduces.

The `emulated_full` tier: CUDA kernels emulated on the CPU (the rendered CUDA C compiled by g++
on host threads, or the schedules run serially through llvm) beyond a smoke set that reaches
every path once. They run where CuPy sees a GPU, or anywhere with DNNC_FULL_CUDA_EMULATION=1;
DNNC_FULL_CUDA_EMULATION=0 skips them everywhere. Not where nvcc alone is on PATH, as issue 29
first said: this project's CI machines ship the CUDA toolkit (nvcc 13.0), so nvcc does not
tell a CUDA developer's machine from CI (its compile-only tests still run there). Never a
test's checks changed: only where it runs."""

import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("DNNC_VERIFY", "1")
# the on-disk compile cache would let one test's compile answer another's; its own tests
# (tests/compiler/test_compile_cache.py) turn it on in a folder of their own
os.environ["DNNC_CACHE"] = "0"

SEED = int(os.environ.get("DNNC_TEST_SEED", "0"))
"""The session's seed; set DNNC_TEST_SEED to draw other inputs (the header shows it)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core this process may use, at most 4. A worker takes 1-3 GB
    (compiles, onnxruntime sessions) and runs dnnc's own worker pool, so a many-core machine
    would run out of memory long before it ran out of cores."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1, 4))


FULL_EMULATION = "DNNC_FULL_CUDA_EMULATION"
"""1: run the `emulated_full` tests anywhere; 0: nowhere; unset: where a GPU is."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "emulated_full: a CUDA kernel emulated on the CPU beyond the smoke set; runs "
                   f"where a GPU is present, or with {FULL_EMULATION}=1")


def full_emulation_skipped() -> str | None:
    """Why the `emulated_full` tests do not run here, or None when they do."""
    asked = os.environ.get(FULL_EMULATION, "").strip()
    if asked == "1":
        return None
    how = (f"run them with {FULL_EMULATION}=1 python -m pytest -m emulated_full "
           "tests/backends/cuda")
    if asked == "0":
        return f"full CUDA emulation off ({FULL_EMULATION}=0); {how}"
    try:
        from dnnc.backends.cuda import device

        if device.available():
            return None
    except ImportError:
        pass
    return f"full CUDA emulation on the CPU runs where a GPU is present; {how}"


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("emulated_full")]
    why = full_emulation_skipped() if marked else None
    if why:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=why))


def pytest_report_header(config):
    return f"dnnc test seed: {SEED} (DNNC_TEST_SEED)"


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded by the session seed and the test's id: the same inputs whether the
    test runs alone or in the suite, in any order."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])
