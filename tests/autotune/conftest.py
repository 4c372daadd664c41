"""Fixtures shared by the autotuner's tests (one test module per module of dnnc/autotune/):
`mlp`, a builder of the small MLP every tuning test compiles, and `llvm_tasks`, its tuning
tasks on this machine's llvm target. Nothing here tunes or measures."""

import pytest

import dnnc
from dnnc import zoo
from dnnc.autotune.tasks import extract
from dnnc.backends.llvm import tuning as llvm_tuning
from dnnc.compiler.targets import REGISTRY
from dnnc.passes.manager import optimize


def _mlp():
    return zoo.build("mlp", batch=4, hidden=(24,), in_features=20, classes=5)


@pytest.fixture
def mlp():
    """`mlp()`: a fresh ONNX model of a 20 -> 24 -> 5 MLP on a batch of 4 (two dense tasks:
    the hidden layer and the head)."""
    return _mlp


@pytest.fixture
def llvm_tasks():
    """(the llvm target's machine, the tuning tasks of `mlp()` on it)."""
    machine = REGISTRY["llvm"].target()
    graph = optimize(dnnc.compiler.driver.load_graph(_mlp()), machine, 3)
    return machine, extract(graph, llvm_tuning)
