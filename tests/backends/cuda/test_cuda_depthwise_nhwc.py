"""The cuda channels-last depthwise template (`backends/cuda/depthwise_nhwc.py`), without a
GPU: depthwise ConvNHWC graphs at fp16, bf16 and tf32 storage (kernels 3, 5 and 7, strides 1
and 2, symmetric and asymmetric padding, odd planes, channels that are no multiple of the
run or of 4, a bias or none, the SiLU and ReLU6 epilogues fused) scheduled under the default
config and a spread of the knob space, rendered as CUDA C and run on host threads
(test_host_semantics' shim), against the NumPy reference of the same graph (both sum in
float32 and round once to the storage type); the default config in the space for the real
layers (EfficientNet's, MobileNetV2's, ConvNeXt's); every case compiled by NVRTC for sm_80 and
sm_90 where CuPy is."""

from __future__ import annotations

import shutil

import ml_dtypes
import numpy as np
import pytest

from cuda_kernels import MACHINE, nvrtc_compiled, reference
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.depthwise_nhwc import (DEPTHWISE_NHWC, DepthwiseNHWCConfig,
                                               shared_bytes)
from dnnc.backends.cuda.schedules import schedule_kernel
from dnnc.backends.lower import lower_group
from dnnc.backends.plan import build_program, segment_groups
from dnnc.backends.registry import REGISTRY
from dnnc.errors import ConfigError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.segments import Segment, plan_steps
from dnnc.levels import DEFAULT_OPT_LEVEL
from dnnc.passes.manager import optimize

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")

STORED = {"tf32": T.float32, "fp16": T.float16, "bf16": T.bfloat16}
NUMPY = {T.float32: np.float32, T.float16: np.float16, T.bfloat16: ml_dtypes.bfloat16}
UNIT = {"tf32": 2.0 ** -20, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
"""A rounding of the storage type, relative (tf32 stores float32: a few fp32 roundings)."""

# (precision, image NHWC, kernel, stride, pads [top, left, bottom, right], epilogue, bias
# [, dilation])
CASES = [
    ("fp16", (2, 9, 7, 24), 3, 1, [1, 1, 1, 1], "relu6", True),
    ("fp16", (1, 13, 11, 40), 5, 2, [2, 2, 2, 2], "silu", True),    # 40: runs of 8
    ("bf16", (2, 10, 9, 16), 3, 2, [1, 1, 1, 1], "silu", False),
    ("fp16", (1, 14, 14, 32), 7, 1, [3, 3, 3, 3], None, True),      # ConvNeXt's 7x7
    ("tf32", (1, 11, 9, 12), 5, 1, [2, 2, 2, 2], "relu6", True),    # float4 vectors
    ("fp16", (1, 8, 8, 6), 3, 1, [1, 1, 1, 1], "silu", True),       # 6 channels: vectors of 2
    ("bf16", (1, 7, 9, 48), 3, 1, [0, 1, 1, 2], None, True),        # asymmetric padding
    ("tf32", (2, 9, 9, 7), 3, 2, [1, 1, 1, 1], None, False),        # 7 channels: scalars
    ("fp16", (1, 17, 19, 144), 5, 2, [2, 2, 2, 2], "silu", True),   # EfficientNet's 144
    ("fp16", (1, 10, 9, 16), 3, 1, [2, 2, 2, 2], "relu6", True, 2),  # dilation 2
]

EXTRA = [DepthwiseNHWCConfig(4, 2, 2, 8, 2), DepthwiseNHWCConfig(16, 4, 4, 64, 4),
         DepthwiseNHWCConfig(1, 8, 1, 32, 1), DepthwiseNHWCConfig(8, 16, 1, 4, 4),
         DepthwiseNHWCConfig(32, 1, 2, 16, 4), DepthwiseNHWCConfig(2, 16, 2, 128, 4)]
"""Configs besides the default (those in a case's space run): tiles wider and taller than
the plane, runs of 4 to 128 channels, 1 to 4 pixels a thread."""


def in_space(space, config) -> bool:
    try:
        return space.check(config) == config
    except ConfigError:
        return False


def target(precision: str):
    return REGISTRY["cuda"].target(MACHINE, precision)


def depthwise_graph(rng, precision, image, kernel, stride, pads, act, bias, dilation=1):
    """(graph of act(ConvNHWC(x, w, b)) depthwise in the precision's storage type, x)."""
    dtype = STORED[precision]
    np_type = NUMPY[dtype]
    c = image[-1]
    w = rng.uniform(-1, 1, (c, kernel, kernel, 1)).astype(np_type)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, image))
    inputs = [x, Value("w", T.TensorType(dtype, w.shape), const=w)]
    if bias:
        b = rng.uniform(-1, 1, c).astype(np_type)
        inputs.append(Value("b", T.TensorType(dtype, b.shape), const=b))
    y = g.add("ConvNHWC", *inputs, group=c, strides=[stride] * 2, pads=pads,
              dilations=[dilation] * 2, name="conv")
    if act == "silu":
        y = g.add("Mul", y, g.add("Sigmoid", y))
    elif act == "relu6":
        lo, hi = (Value(n, T.TensorType(dtype, ()), const=np.array(v, np_type))
                  for n, v in (("lo", 0.0), ("hi", 6.0)))
        y = g.add("Clip", y, lo, hi)
    g.outputs = [y]
    return g, rng.uniform(-2, 2, image).astype(np_type)


def programs_with(graph, precision, config=None):
    """(the optimised graph, its one Program) with the ConvNHWC kernel under `config` (the
    template's default when None)."""
    machine = target(precision)
    graph = optimize(graph, machine, DEFAULT_OPT_LEVEL)
    (step,) = [s for s in plan_steps(graph) if isinstance(s, Segment)]
    shapes = tuple(v.type.shape for v in step.inputs)
    schedule = lambda k: schedule_kernel(   # noqa: E731
        k, machine, config if k.anchor.op == "ConvNHWC" else None)
    return graph, build_program(step, shapes, (), segment_groups(step, graph.groups),
                                schedule, True)


def run_programs(programs, tmp_path, values: dict) -> list[dict]:
    """Each program's kernels (in one host library, program p's functions prefixed p{p}_)
    run in turn from `values`: the values each program computed."""
    from test_host_semantics import host_library, program_on_host

    funcs = [(L.PrimFunc(f"p{p}_{f.name}", f.params, f.body, f.size_vars, f.attrs), noalias)
             for p, program in enumerate(programs) for f, noalias in program.unique]
    module = render_module(funcs)
    lib = host_library(funcs, tmp_path, module)
    return [program_on_host(lib, module, program, values, prefix=f"p{p}_")
            for p, program in enumerate(programs)]


@needs_gxx
@pytest.mark.parametrize("case", range(len(CASES)))
def test_depthwise_nhwc_on_host_against_numpy(case, tmp_path):
    precision = CASES[case][0]
    graph, x = depthwise_graph(np.random.default_rng(case), *CASES[case])
    graph, program = programs_with(graph, precision)
    (conv,) = [k for k in program.kernels if k.anchor.op == "ConvNHWC"]
    assert conv.schedule[0] == "cuda_depthwise_nhwc"
    act = CASES[case][5]
    assert [n.op for n in conv.nodes] == ["ConvNHWC"] + {
        "silu": ["Sigmoid", "Mul"], "relu6": ["Clip"], None: []}[act]   # the epilogue fused
    problem = DEPTHWISE_NHWC.problem(
        lower_group(list(conv.nodes), "k", outputs=[n.outputs[0] for n in conv.nodes[-1:]]))
    space = DEPTHWISE_NHWC.space(problem, target(precision))
    configs = [c for c in EXTRA if in_space(space, c)]
    assert configs
    # the same graph (the same weights) under each config
    progs = [program] + [programs_with(depthwise_graph(np.random.default_rng(case),
                                                       *CASES[case])[0], precision, c)[1]
                         for c in configs]
    want = reference(graph, {"x": x})[graph.outputs[0].name].astype(np.float64)
    results = run_programs(progs, tmp_path, {"x": x})
    for config, got in zip([conv.schedule[1]] + configs, results):
        got = got[graph.outputs[0].name].astype(np.float64)
        error = np.abs(got - want).max()
        assert np.isfinite(got).all() and error <= 2 * UNIT[precision] * np.abs(want).max(), \
            f"{config}: worst error {error:.3g}"


def test_vectors_are_as_wide_as_the_channels_allow():
    """16-bit channels go 4 at a time (ushort4 loads and stores), float32 ones as float4; 6
    channels 2 at a time; 7 one."""
    sources = {}
    for case in (0, 4, 5, 7):
        graph, _ = depthwise_graph(np.random.default_rng(0), *CASES[case])
        _, program = programs_with(graph, CASES[case][0])
        sources[case] = render_module(program.unique).source
    assert "ushort4" in sources[0] and "float4" in sources[4]
    assert "ushort2" in sources[5] and "ushort4" not in sources[5]
    kernel = sources[7][sources[7].index('extern "C"'):]
    assert "float4" not in kernel and "float2" not in kernel


@pytest.mark.parametrize("shape", [
    (32, 112, 112, 32, 3, 1), (32, 112, 112, 96, 3, 2), (32, 56, 56, 144, 3, 1),
    (32, 56, 56, 144, 5, 2), (32, 28, 28, 240, 5, 1), (32, 28, 28, 240, 3, 2),
    (32, 14, 14, 480, 5, 1), (32, 14, 14, 672, 5, 2), (32, 7, 7, 1152, 5, 1),
    (32, 7, 7, 1152, 3, 1), (32, 56, 56, 96, 7, 1), (32, 7, 7, 768, 7, 1),
    (1, 7, 7, 960, 5, 1), (1, 3, 3, 8, 3, 1)])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_default_config_fits_the_real_layers(shape, precision):
    """EfficientNet-b0's, MobileNetV2's and ConvNeXt's depthwise layers: the default is in the
    space (32 to 1024 threads, shared memory within 48 KiB, vectors dividing C)."""
    n, h, w, c, k, s = shape
    graph, _ = depthwise_graph(np.random.default_rng(0), precision, (n, h, w, c), k, s,
                               [k // 2] * 4, None, True)
    (node,) = graph.nodes
    problem = DEPTHWISE_NHWC.problem(lower_group([node], "k", outputs=node.outputs))
    assert problem is not None and DEPTHWISE_NHWC.applies(problem)
    config = DEPTHWISE_NHWC.default(problem, target(precision))
    assert DEPTHWISE_NHWC.space(problem, target(precision)).check(config) == config
    assert shared_bytes(problem, config) <= 48 * 1024
    assert config.vector == (4 if c % 4 == 0 else 1)


def test_every_case_compiles_for_sm80_and_sm90():
    pytest.importorskip("cupy.cuda")   # NVRTC, before the programs are built
    funcs = []
    for n, case in enumerate(CASES):
        graph, _ = depthwise_graph(np.random.default_rng(n), *case)
        _, program = programs_with(graph, case[0])
        funcs += [(L.PrimFunc(f"c{n}_{f.name}", f.params, f.body, f.size_vars, f.attrs), a)
                  for f, a in program.unique]
    source = render_module(funcs).source
    for arch in ("sm_80", "sm_90"):
        nvrtc_compiled(source, arch)


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(CASES)))
def test_depthwise_nhwc_on_the_gpu(case):
    """Each case compiled by dnnc for the GPU at its precision (the template scheduled),
    against the NumPy reference of the same graph, as on the host."""
    import dnnc

    precision = CASES[case][0]
    graph, x = depthwise_graph(np.random.default_rng(case), *CASES[case])
    compiled = dnnc.compile(graph, "cuda", precision=precision)
    source = compiled.source("cuda")
    assert "ConvNHWC" in source and "__shared__" in source   # (the host test: the template)
    got = compiled.run(x, to="numpy")[0].astype(np.float64)
    want = reference(graph, {"x": x})[graph.outputs[0].name].astype(np.float64)
    assert np.abs(got - want).max() <= 2 * UNIT[precision] * np.abs(want).max()
