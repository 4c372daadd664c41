"""Test-wide settings: every compile verifies the graph after each pass; random inputs come from
the `rng` fixture, seeded per test so that a failure reproduces."""

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


def pytest_report_header(config):
    return f"dnnc test seed: {SEED} (DNNC_TEST_SEED)"


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded by the session seed and the test's id: the same inputs whether the
    test runs alone or in the suite, in any order."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])
