"""The runner (`backends/executable.py`) and its contract with a target (`backends/contract.py`):
constructing a runtime compiles nothing until `start()`, a target runtime that leaves out a
hook cannot be made, both targets' compiled segments fulfil `CompiledSegment`, and plan.py
only builds (it imports nothing of the runner)."""

from pathlib import Path

import numpy as np
import pytest

import dnnc
from dnnc.backends.contract import CompiledSegment, TargetHooks
from dnnc.backends.cuda import executable as cuda_executable
from dnnc.backends.executable import Executable
from dnnc.backends.llvm import executable as llvm_executable
from dnnc.backends.llvm.cpu import host_target
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.manager import optimize


def _relu_matmul(rng) -> Graph:
    g = Graph("relu_matmul")
    x = g.add_input("x", T.TensorType(T.float32, (3, 8)))
    w = Value("w", T.TensorType(T.float32, (8, 4)),
              const=rng.standard_normal((8, 4)).astype(np.float32))
    g.outputs = [g.add("Relu", g.add("MatMul", x, w))]
    return g


def test_constructing_a_runtime_compiles_nothing_until_start(rng):
    target = host_target()
    model = _relu_matmul(rng)
    w = model.nodes[0].inputs[1].const
    graph = optimize(model, target)
    rt = llvm_executable.LLVMRuntime(graph, target=target, progress=False)
    assert rt.compiled_segments() == [] and rt.compile_seconds == 0.0
    assert rt.start() is rt
    (seg,) = rt.compiled_segments()
    assert isinstance(seg, CompiledSegment) and rt.compile_seconds > 0
    x = rng.standard_normal((3, 8)).astype(np.float32)
    (out,) = rt.run([x], {})
    np.testing.assert_allclose(out, np.maximum(x @ w, 0),
                               rtol=1e-5, atol=1e-6)


def test_a_target_runtime_without_every_hook_cannot_be_made(rng):
    class Partial(Executable):
        def compile_segment(self, program):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="describe_machine|schedule_kernel"):
        Partial(_relu_matmul(rng))


def test_both_targets_declare_the_contract():
    for module, runtime in ((llvm_executable, "LLVMRuntime"), (cuda_executable, "CUDARuntime")):
        assert issubclass(getattr(module, runtime), TargetHooks)
        assert issubclass(module._CompiledSegment, CompiledSegment)
        assert not getattr(module._CompiledSegment, "__abstractmethods__", None)
    assert llvm_executable.LLVMRuntime.batch_split and \
        not cuda_executable.CUDARuntime.batch_split


def test_plan_builds_and_never_runs():
    source = (Path(dnnc.backends.__file__).parent / "plan.py").read_text()
    for runner in ("executable", "batch_split", "specialisations", "contract", "threading"):
        assert f"import {runner}" not in source and f".{runner} import" not in source, runner
