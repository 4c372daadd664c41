"""EfficientNet-style MBConv blocks with squeeze-and-excitation at the cuda target's reduced
precisions (issue 31, item 3): channels-last end to end.

- the passes: every conv but the 3-channel stem channels-last (the SE block's 1x1 convs of
  4 and 6 channels too: their image is one pixel), the SE scale [N, C, 1, 1] read by a
  Reshape (no copy), the pools means over the channels-last plane, so at most 2 Transposes
  in the whole graph; the optimised graph within `model_error_bound` of the fp32 reference
  (NumPy interpreter);
- the kernels: every kernel of the compiled model run on the host shim (test_host_semantics)
  from the model's input, within the bound; the plane mean (`plane_mean.py`) alone against
  NumPy at fp16, bf16 and tf32 storage, odd channels and planes, under a spread of its knobs;
- fp32: no channels-last node at all.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter

import ml_dtypes
import numpy as np
import pytest

from cuda_kernels import MACHINE, nvrtc_compiled, programs, reference
from test_cuda_depthwise_nhwc import in_space, run_programs
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.device import compile_arch
from dnnc.backends.cuda.plane_mean import PLANE_MEAN_NHWC, PlaneMeanConfig
from dnnc.backends.cuda.schedules import schedule_kernel
from dnnc.backends.lower import lower_group
from dnnc.backends.plan import build_program, segment_groups
from dnnc.backends.registry import REGISTRY
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.segments import Segment, plan_steps
from dnnc.ir.target import model_error_bound
from dnnc.levels import DEFAULT_OPT_LEVEL
from dnnc.passes.manager import optimize

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")

NUMPY = {T.float32: np.float32, T.float16: np.float16, T.bfloat16: ml_dtypes.bfloat16}
STORED = {"tf32": T.float32, "fp16": T.float16, "bf16": T.bfloat16}

# (out channels, expansion, kernel, stride, squeeze channels): EfficientNet-b0's first
# three blocks, narrower
BLOCKS = [(16, 1, 3, 1, 4), (24, 6, 5, 2, 4), (24, 6, 3, 1, 6)]


def target(precision: str):
    return REGISTRY["cuda"].target(MACHINE, precision)


class _Builder:
    def __init__(self, rng):
        self.rng, self.g, self.count = rng, Graph("se"), 0

    def const(self, shape, fan_in):
        self.count += 1
        a = (self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        return Value(f"p{self.count}", T.TensorType(T.float32, a.shape), const=a)

    def conv(self, x, cin, cout, k=1, stride=1, group=1):
        fan = cin // group * k * k
        return self.g.add("Conv", x, self.const((cout, cin // group, k, k), fan),
                          self.const((cout,), fan), group=group, strides=[stride] * 2,
                          pads=[k // 2] * 4)

    def silu(self, x):
        return self.g.add("Mul", x, self.g.add("Sigmoid", x))


def se_model(rng, batch=2, size=16, classes=10):
    """(graph, input name): a stem conv 3x3 / 2 of 3 channels, `BLOCKS` MBConv blocks (1x1
    expansion, depthwise kxk, squeeze-and-excitation, 1x1 projection, residual where the
    shape allows), a 1x1 head, the global pool and a classifier; SiLU throughout."""
    b = _Builder(rng)
    x = b.g.add_input("x", T.TensorType(T.float32, (batch, 3, size, size)))
    h, c = b.silu(b.conv(x, 3, 16, 3, 2)), 16
    for cout, expand, k, stride, squeeze in BLOCKS:
        y, ce = h, c * expand
        if expand != 1:
            y = b.silu(b.conv(y, c, ce))
        y = b.silu(b.conv(y, ce, ce, k, stride, group=ce))
        s = b.silu(b.conv(b.g.add("GlobalAveragePool", y), ce, squeeze))
        y = b.g.add("Mul", y, b.g.add("Sigmoid", b.conv(s, squeeze, ce)))
        y = b.conv(y, ce, cout)
        h = b.g.add("Add", y, h) if stride == 1 and c == cout else y
        c = cout
    h = b.silu(b.conv(h, c, 64))
    flat = b.g.add("Flatten", b.g.add("GlobalAveragePool", h))
    b.g.outputs = [b.g.add("Gemm", flat, b.const((classes, 64), 64), b.const((classes,), 64),
                           transB=1)]
    return b.g


def _inputs(rng):
    return {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_squeeze_excitation_blocks_run_channels_last(precision, rng):
    graph = optimize(se_model(np.random.default_rng(0)), target(precision), DEFAULT_OPT_LEVEL)
    ops = Counter(n.op for n in graph.nodes)
    convs = 1 + sum(4 + (e != 1) for _, e, _, _, _ in BLOCKS) + 1   # stem, blocks, head
    # the 3-channel stem too, its input padded to a chunk
    assert ops["ConvNHWC"] == convs and ops["Conv"] == 0 and ops["Pad"] == 1
    assert ops["Transpose"] <= 2, [n.op for n in graph.nodes]
    assert ops["GlobalAveragePool"] == 0 and ops["ReduceMean"] == len(BLOCKS) + 1
    inputs = _inputs(rng)
    want = run_graph(se_model(np.random.default_rng(0)), [inputs["x"]])[0].astype(np.float64)
    got = run_graph(graph, [inputs["x"]])[0].astype(np.float64)
    worst = np.abs(got - want).max() / np.abs(want).max()
    assert worst <= model_error_bound(precision), f"{precision}: {worst:.3g}"


def test_fp32_keeps_the_squeeze_excitation_blocks_nchw():
    graph = optimize(se_model(np.random.default_rng(0)), target("fp32"), DEFAULT_OPT_LEVEL)
    ops = Counter(n.op for n in graph.nodes)
    assert ops["ConvNHWC"] == 0 and ops["Transpose"] == 0 and ops["ReduceMean"] == 0


@needs_gxx
def test_squeeze_excitation_model_on_host_within_the_model_bound(rng, tmp_path):
    """Every kernel of the fp16 compile run in turn on the host shim: the depthwise and
    plane-mean templates scheduled, the output within the bound of the fp32 reference."""
    from test_host_semantics import host_library, program_on_host

    graph, progs = programs(se_model(np.random.default_rng(0)), machine=target("fp16"))
    inputs = _inputs(rng)
    values = dict(inputs)
    schedules = Counter()
    for p, program in enumerate(progs):
        module = render_module(program.unique)
        schedules.update(k.schedule[0] for k in program.kernels)
        values = program_on_host(host_library(program.unique, tmp_path / str(p), module),
                                 module, program, values)
    assert schedules["cuda_depthwise_nhwc"] == len(BLOCKS)
    assert schedules["cuda_plane_mean_nhwc"] == len(BLOCKS) + 1
    want = reference(se_model(np.random.default_rng(0)), inputs)
    want = want[graph.outputs[0].name].astype(np.float64)
    got = values[graph.outputs[0].name].astype(np.float64)
    worst = np.abs(got - want).max() / np.abs(want).max()
    assert worst <= model_error_bound("fp16"), f"{worst:.3g}"


# -- the plane mean alone ------------------------------------------------------------------------

# (precision, image NHWC, then a Sigmoid)
MEANS = [("fp16", (2, 9, 7, 24), True), ("bf16", (3, 5, 5, 6), False),
         ("tf32", (2, 13, 11, 12), True), ("fp16", (1, 17, 19, 7), False),
         ("fp16", (2, 1, 1, 40), True), ("tf32", (1, 33, 31, 144), False)]

MEAN_CONFIGS = [PlaneMeanConfig(4, 1, 8), PlaneMeanConfig(8, 2, 16), PlaneMeanConfig(128, 4, 8),
                PlaneMeanConfig(16, 4, 256), PlaneMeanConfig(32, 1, 1)]


def mean_graph(precision, image, sigmoid):
    dtype = STORED[precision]
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, image))
    axes = Value("axes", T.TensorType(T.int64, (2,)), const=np.array([1, 2], np.int64))
    y = g.add("ReduceMean", x, axes, keepdims=1)
    g.outputs = [g.add("Sigmoid", y) if sigmoid else y]
    return g


def mean_program(precision, image, sigmoid, config=None, arch=None):
    machine = target(precision) if arch is None else \
        dataclasses.replace(target(precision), arch=arch)
    graph = optimize(mean_graph(precision, image, sigmoid), machine, DEFAULT_OPT_LEVEL)
    (step,) = [s for s in plan_steps(graph) if isinstance(s, Segment)]
    schedule = lambda k: schedule_kernel(k, machine, config)   # noqa: E731
    return graph, build_program(step, tuple(v.type.shape for v in step.inputs), (),
                                segment_groups(step, graph.groups), schedule, True)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
@pytest.mark.parametrize("shape", [(32, 112, 112, 32), (32, 56, 56, 144), (32, 7, 7, 1152),
                                   (1, 7, 7, 1280), (8, 3, 3, 6), (2, 17, 19, 7),
                                   (1, 1, 1, 40)])
def test_default_plane_mean_config_is_in_its_space(shape, precision):
    graph = mean_graph(precision, shape, False)
    (node,) = graph.nodes
    problem = PLANE_MEAN_NHWC.problem(lower_group([node], "k", outputs=node.outputs))
    config = PLANE_MEAN_NHWC.default(problem, target(precision))
    assert PLANE_MEAN_NHWC.space(problem, target(precision)).check(config) == config


@needs_gxx
@pytest.mark.parametrize("case", range(len(MEANS)))
def test_plane_mean_on_host_against_numpy(case, tmp_path):
    precision, image, sigmoid = MEANS[case]
    graph, program = mean_program(*MEANS[case])
    (kernel,) = program.kernels
    assert kernel.schedule[0] == "cuda_plane_mean_nhwc"
    assert [n.op for n in kernel.nodes] == ["ReduceMean"] + ["Sigmoid"] * sigmoid
    problem = PLANE_MEAN_NHWC.problem(lower_group(list(kernel.nodes), "k",
                                                  outputs=kernel.nodes[-1].outputs))
    space = PLANE_MEAN_NHWC.space(problem, target(precision))
    configs = [c for c in MEAN_CONFIGS if in_space(space, c)]
    assert configs
    progs = [program] + [mean_program(*MEANS[case], config=c)[1] for c in configs]
    x = np.random.default_rng(case).uniform(-2, 2, image).astype(NUMPY[STORED[precision]])
    want = reference(graph, {"x": x})[graph.outputs[0].name].astype(np.float64)
    unit = {"tf32": 2.0 ** -20, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}[precision]
    for config, got in zip([kernel.schedule[1]] + configs,
                           run_programs(progs, tmp_path, {"x": x})):
        got = got[graph.outputs[0].name].astype(np.float64)
        error = np.abs(got - want).max()
        assert np.isfinite(got).all() and error <= 2 * unit * np.abs(want).max() + 1e-6, \
            f"{config}: worst error {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_squeeze_excitation_model_on_the_gpu(precision, rng):
    """The model compiled by dnnc for the GPU at each reduced precision, within the bound of
    the fp32 reference."""
    import dnnc

    inputs = _inputs(rng)
    compiled = dnnc.compile(se_model(np.random.default_rng(0)), "cuda", precision=precision)
    got = compiled.run(inputs["x"], to="numpy")[0].astype(np.float64)
    want = run_graph(se_model(np.random.default_rng(0)), [inputs["x"]])[0].astype(np.float64)
    worst = np.abs(got - want).max() / np.abs(want).max()
    assert worst <= model_error_bound(precision), f"{precision}: {worst:.3g}"


def test_the_model_and_the_means_compile_for_sm80_and_sm90():
    pytest.importorskip("cupy.cuda")   # NVRTC, before the programs are built
    from cuda_kernels import renamed

    for arch in ("sm_80", "sm_90"):   # each GPU's own kernels (sm_90's wgmma: sm_90a)
        machine = dataclasses.replace(target("fp16"), arch=arch)
        _, progs = programs(se_model(np.random.default_rng(0)), machine=machine)
        funcs = [f for p, program in enumerate(progs) for f in renamed(program, f"m{p}_")]
        for n, case in enumerate(MEANS):
            funcs += renamed(mean_program(*case, arch=arch)[1], f"c{n}_")
        source = render_module(funcs).source
        nvrtc_compiled(source, compile_arch(arch, source))
