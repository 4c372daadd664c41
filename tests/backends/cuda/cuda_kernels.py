"""Kernels of zoo models and node-suite cases as the cuda target schedules them, without the
cuda runtime: the graph through the passes for a cuda `Target`, every segment planned with
the cuda schedules (`backends/plan.build_program`), and each value's reference array (the
NumPy interpreter on the optimised graph) by name. Shared by test_cuda_codegen.py (rendering and
nvcc compile-only checks) and gpu_check.py (runs on a GPU)."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from dnnc import zoo
from dnnc.backends.cuda import FUSION
from dnnc.backends.cuda.schedules import schedule_kernel
from dnnc.backends.plan import Program, build_program, segment_groups
from dnnc.frontend.onnx import import_onnx
from dnnc.ir.interpreter import run_graph
from dnnc.ir.segments import Segment, plan_steps
from dnnc.ir.target import Target
from dnnc.levels import DEFAULT_OPT_LEVEL
from dnnc.passes.manager import optimize

MACHINE = Target("cuda", arch="sm_90", fusion=FUSION)
"""The cuda Target these kernels are scheduled for (an H100's architecture)."""

SMALL = {
    "mlp": {}, "cnn": {}, "resnet18": {"size": 32}, "resnet50": {"size": 32},
    "mobilenet_v2": {"size": 32}, "bert": {"seq": 16, "vocab": 512},
    "bert_tiny": {"seq": 16, "vocab": 512},
    "bert_base": {"layers": 1, "seq": 16, "vocab": 512},
}
"""Zoo model -> options keeping it small (every op and fusion of the full model; smaller
images, sequences and vocabularies)."""


def programs(graph, opt_level: int = DEFAULT_OPT_LEVEL, machine: Target = MACHINE,
             config=None):
    """(the optimised graph, its segments' Programs scheduled for cuda, each kernel with
    `config` where given): every segment whose inputs have static shapes and no value inputs
    (a zoo model's are all of them)."""
    graph = optimize(graph, machine, opt_level)
    out = []
    for step in plan_steps(graph):
        if not isinstance(step, Segment) or step.value_inputs or \
                not all(v.type.is_static for v in step.inputs):
            continue
        shapes = tuple(v.type.shape for v in step.inputs)
        out.append(build_program(step, shapes, (), segment_groups(step, graph.groups),
                                 lambda k: schedule_kernel(k, machine, config), True))
    return graph, out


@functools.lru_cache(maxsize=None)
def zoo_model(name: str):
    return zoo.build(name, **SMALL[name])


def zoo_programs(name: str) -> tuple:
    return programs(import_onnx(zoo_model(name)))


def reference(graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of `graph` (inputs, node outputs) computed by the NumPy reference, by
    name (a Program's kernels keep the value names of the graph they were planned from)."""
    values = dict(inputs)

    def observe(node, outs):
        for v, a in zip(node.outputs, outs):
            values[v.name] = a

    with np.errstate(all="ignore"):
        run_graph(graph, [inputs[v.name] for v in graph.inputs], observe=observe)
    return values


def renamed(program: Program, prefix: str) -> list:
    """`program.unique` with every function renamed `prefix` + name (several programs in one
    translation unit)."""
    return [(replace(f, name=prefix + f.name), noalias) for f, noalias in program.unique]


def suite_sample(count: int, every: int = 1) -> list[str]:
    """Node-suite cases the llvm target passes without host fallbacks, `count` of them spread
    evenly over the sorted list (deterministic)."""
    from pathlib import Path

    path = Path(__file__).parents[2] / "conformance" / "expected" / "llvm.native.txt"
    names = sorted(line.strip() for line in path.read_text().splitlines()
                   if line.strip() and not line.startswith("#"))
    step = max(1, len(names) // count)
    return names[::step][:count]


def suite_cases(names: list[str]) -> dict:
    """name -> onnx TestCase of the node suite (tests/conformance/suite.py generates them)."""
    import importlib.util
    import sys
    from pathlib import Path

    suite = sys.modules.get("conformance_suite")
    if suite is None:
        path = Path(__file__).parents[2] / "conformance" / "suite.py"
        spec = importlib.util.spec_from_file_location("conformance_suite", path)
        suite = importlib.util.module_from_spec(spec)
        sys.modules["conformance_suite"] = suite   # (its dataclasses look themselves up)
        spec.loader.exec_module(suite)
    everything = suite.all_cases()
    return {n: everything[n] for n in names if n in everything}


def suite_inputs(case) -> list[np.ndarray]:
    """A node-suite case's stored inputs as arrays."""
    from onnx import TensorProto

    from dnnc.frontend.onnx import tensor_to_array

    inputs, _ = case.data_sets[0]
    return [tensor_to_array(x) if isinstance(x, TensorProto) else np.asarray(x) for x in inputs]


def nvrtc_compiled(source: str, arch: str, *options: str) -> tuple:
    """(the NVRTC program, its log) of `source` compiled for `arch` with `options` (the test
    skipped where CuPy is not installed); a compile error fails the test with the log's
    tail."""
    nvrtc = pytest.importorskip("cupy.cuda").nvrtc
    prog = nvrtc.createProgram(source, "module.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "-std=c++17", *options])
    except Exception:
        pytest.fail(nvrtc.getProgramLog(prog)[-4000:])
    return prog, nvrtc.getProgramLog(prog)
