"""Channels-last convolutions on tensor cores (issue 31, item 3): `conv_nhwc.py`'s implicit GEMM
with cp.async patch copies, and `convert_layout`'s "nhwc_conv" at the cuda target's reduced
precisions.

- the kernel: ConvNHWC graphs (padding, stride 2, dilation, 1x1, 3x3, a 7x7 stem of 3
  channels through registers, odd pixel counts, batches; depthwise ones on
  depthwise_nhwc.py's template) scheduled by the template, on the
  host-C++ shim (test_host_semantics.py: cp.async's zero fill and alignment checked), against
  the NumPy reference within test_cuda_precision.py's `bound`; compiled by NVRTC for sm_80
  and sm_90 where CuPy is;
- whole models: every kernel of a zoo model compiled for cuda at a reduced precision run in
  turn on the shim from the model's input, the output within `model_error_bound` of the fp32
  reference;
- on a GPU (`gpu`): the same convolutions, and resnet18 and mobilenet_v2 against
  onnxruntime.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.backends.cuda import device
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.registry import REGISTRY
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.conv import conv
from dnnc.ir.target import model_error_bound
from cuda_kernels import MACHINE, nvrtc_compiled, programs, reference, renamed
from test_cuda_precision import bound

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")

STORED = {"tf32": T.float32, "fp16": T.float16, "bf16": T.bfloat16}
NUMPY = {T.float32: np.float32, T.float16: np.float16, T.bfloat16: ml_dtypes.bfloat16}

# (precision, image NHWC, out channels, kernel, stride, pad, dilation)
CASES = [
    ("fp16", (2, 9, 9, 16), 24, 3, 1, 1, 1),     # padding, 162 pixels
    ("fp16", (1, 8, 8, 32), 40, 1, 1, 0, 1),     # 1x1
    ("fp16", (3, 7, 7, 16), 32, 3, 2, 1, 1),     # stride 2, 48 pixels
    ("bf16", (1, 11, 10, 8), 16, 3, 1, 2, 2),    # dilation, pads beyond the window
    ("fp16", (2, 15, 15, 3), 16, 7, 2, 3, 1),    # a stem: 3 channels, through registers
    ("tf32", (1, 9, 9, 12), 20, 3, 1, 1, 1),     # 4-element chunks
    ("tf32", (1, 6, 6, 6), 8, 3, 1, 1, 1),       # 6 channels: registers at tf32
    ("fp16", (1, 14, 14, 64), 64, 3, 1, 1, 1),
]
COPIED = (0, 1, 2, 3, 5, 7)
"""Cases whose patches C fills whole 16-byte chunks: copied by cp.async."""


def target(precision: str, arch: str = MACHINE.arch):
    """The cuda Target of a compile at `precision` (its layouts and half storage) for `arch`
    (default an H100's)."""
    return REGISTRY["cuda"].target(replace(MACHINE, arch=arch), precision)


def nhwc_graph(rng, precision, image, oc, kernel, stride, pad, dilation, group=1):
    """(graph of Relu(ConvNHWC(x, w, b)) in the precision's storage type, x)."""
    dtype = STORED[precision]
    draw = lambda shape: rng.uniform(-1, 1, shape)   # noqa: E731
    w = draw((oc, kernel, kernel, image[-1] // group)).astype(NUMPY[dtype])
    b = draw(oc).astype(NUMPY[dtype])
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, image))
    y = g.add("ConvNHWC", x, Value("w", T.TensorType(dtype, w.shape), const=w),
              Value("b", T.TensorType(dtype, b.shape), const=b), strides=[stride] * 2,
              pads=[pad] * 4, dilations=[dilation] * 2, group=group, name="conv")
    g.outputs = [g.add("Relu", y)]
    return g, draw(image).astype(NUMPY[dtype])


# -- the kernel -----------------------------------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("case", range(len(CASES)))
def test_convolutions_on_host_within_the_precision_bound(case, rng, tmp_path):
    precision = CASES[case][0]
    graph, x = nhwc_graph(rng, precision, *CASES[case][1:])
    graph, (program,) = programs(graph, machine=target(precision))
    (conv_kernel,) = [k for k in program.kernels if k.anchor.op == "ConvNHWC"]
    assert conv_kernel.schedule[0] == "cuda_mma_conv2d_nhwc"
    assert [n.op for n in conv_kernel.nodes] == ["ConvNHWC", "Relu"]   # the epilogue fused
    module = render_module(program.unique)
    source = module.source[module.source.index('extern "C"'):]
    if conv_kernel.schedule[1].wgmma:   # the default's warpgroups (sm_90, 16-bit: case 7)
        assert f"dnnc_wgmma_{precision}_n" in source
    else:
        assert f"dnnc_mma_{precision}(" in source and "dnnc_ldmatrix_x4(&" in source
    assert "dnnc_ldmatrix_x4_trans(" not in source   # both tiles k-major
    # the patches by cp.async where C fills chunks (the weights: where kh kw C does), or
    # by TMA's im2col mode where C fills 128-byte rows on the TMA producer (case 7)
    patches = re.search(r"dnnc_cp_async\(&a_tile", source) is not None or \
        "dnnc_tma_load_im2col_4d(&" in source
    assert patches == (case in COPIED)
    _on_host_within_the_bound(CASES[case], graph, x, program, module, tmp_path)


def _on_host_within_the_bound(case, graph, x, program, module, tmp_path):
    """Run `program` of `case`'s graph (a CASES entry) on host threads and hold its output
    to the precision's bound (sum_k |x| |w| of each output; 16-bit results rounded once
    more)."""
    from test_host_semantics import host_library, program_on_host

    precision, image, oc, kernel, stride, pad, dilation, *grouped = case
    group = grouped[0] if grouped else 1
    lib = host_library(program.unique, tmp_path, module)
    got = program_on_host(lib, module, program, {"x": x})[graph.outputs[0].name]
    want = reference(graph, {"x": x})[graph.outputs[0].name].astype(np.float64)
    scale = np.abs(conv(np.abs(x.astype(np.float64)).transpose(0, 3, 1, 2),
                        np.abs(graph.nodes[0].inputs[1].const.astype(np.float64))
                        .transpose(0, 3, 1, 2), strides=[stride] * 2, pads=[pad] * 4,
                        dilations=[dilation] * 2, group=group)).transpose(0, 2, 3, 1)
    limit = bound(precision, kernel * kernel * image[-1] // group, scale, want)
    if precision != "tf32":   # the result stored in 16 bits: rounded once more
        limit = limit + 2 * {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}[precision] * np.abs(want)
    error = np.abs(got.astype(np.float64) - want)
    assert np.isfinite(got.astype(np.float64)).all() and (error <= limit).all(), \
        f"worst error {error.max():.3g}, bound there {limit.flat[error.argmax()]:.3g}"


@needs_gxx
@pytest.mark.parametrize("case", [0, 1, 2, 3, 4, 5])
def test_convolutions_with_the_wgmma_knob_on_host(case, rng, tmp_path):
    """The same convolutions with wgmma's warpgroup product (the knob on sm_90: patches and
    weights k-major in the 128-byte swizzle, by cp.async or through registers), within the
    precision's bound on host threads."""
    from dnnc.backends.cuda.mma import TensorCoreConfig
    from dnnc.backends.cuda.wgmma import block_k

    precision = CASES[case][0]
    config = TensorCoreConfig(64, 64, block_k(precision), 4, 1, 3, wgmma=True)
    graph, x = nhwc_graph(rng, precision, *CASES[case][1:])
    graph, (program,) = programs(graph, machine=target(precision), config=config)
    (conv_kernel,) = [k for k in program.kernels if k.anchor.op == "ConvNHWC"]
    assert conv_kernel.schedule == ("cuda_mma_conv2d_nhwc", config)
    module = render_module(program.unique)
    assert f"dnnc_wgmma_{precision}_n64<" in module.source
    _on_host_within_the_bound(CASES[case], graph, x, program, module, tmp_path)


# (precision, image NHWC, out channels, kernel, stride, pad, dilation, group): a group's
# channels whole 16-byte chunks (RegNet's 8 at fp16)
GROUPED = [
    ("fp16", (2, 9, 9, 32), 32, 3, 1, 1, 1, 4),    # 4 groups of 8, padding
    ("fp16", (2, 8, 8, 48), 48, 3, 2, 1, 1, 6),    # stride 2 (a RegNet stage's first block)
    ("bf16", (1, 7, 7, 16), 32, 3, 1, 1, 1, 2),    # 16 out channels a group
    ("tf32", (1, 7, 7, 16), 16, 3, 1, 1, 1, 2),    # 8 channels: 2 chunks of 4 a tap
    ("fp16", (1, 6, 6, 32), 16, 1, 1, 0, 1, 2),    # pointwise, grouped: a gather, not X
    ("fp16", (2, 7, 7, 64), 64, 3, 1, 1, 1, 8),    # 128-byte rows of X: no im2col map (a
]                                                  # group's channels, not all of X's)


@needs_gxx
@pytest.mark.parametrize("case", range(len(GROUPED)))
@pytest.mark.parametrize("wgmma", [False, True])
def test_grouped_convolutions_on_host_within_the_precision_bound(case, wgmma, rng, tmp_path):
    """A grouped conv (not depthwise) is one implicit product a group on the grid's z:
    group bi's patches read its channels, its outputs go to its channels; the default's
    config and the wgmma knob's, within the precision's bound on host threads."""
    from dnnc.backends.cuda.mma import TensorCoreConfig
    from dnnc.backends.cuda.wgmma import block_k

    precision = GROUPED[case][0]
    config = TensorCoreConfig(64, 64, block_k(precision), 4, 1, 3, wgmma=True) \
        if wgmma else None
    graph, x = nhwc_graph(rng, precision, *GROUPED[case][1:])
    graph, (program,) = programs(graph, machine=target(precision), config=config)
    (conv_kernel,) = [k for k in program.kernels if k.anchor.op == "ConvNHWC"]
    assert conv_kernel.schedule[0] == "cuda_mma_conv2d_nhwc"
    module = render_module(program.unique)
    source = module.source[module.source.index('extern "C"'):]
    assert "blockIdx.z" in source   # the groups
    assert re.search(r"dnnc_cp_async\(&a_tile", source) is not None   # patches copied
    _on_host_within_the_bound(GROUPED[case], graph, x, program, module, tmp_path)


def test_grouped_convs_of_whole_chunks_run_channels_last():
    """At fp16 a RegNet-like block (1x1, grouped 3x3 of 8 channels a group, 1x1) runs
    channels-last end to end: no Transpose between its convs; a ResNeXt-like one (4 channels
    a group: half a chunk) keeps its convs NCHW, the grouped one on the default template."""
    for per_group, nhwc in ((8, True), (4, False)):
        rng = np.random.default_rng(per_group)
        c, groups = 32, 32 // per_group
        g = Graph("g")
        x = g.add_input("x", T.TensorType(T.float32, (2, c, 8, 8)))
        h = x
        for n, (kernel, group) in enumerate(((1, 1), (3, groups), (1, 1))):
            w = rng.uniform(-1, 1, (c, c // group, kernel, kernel)).astype(np.float32)
            h = g.add("Relu", g.add("Conv", h, Value(f"w{n}", T.TensorType(T.float32, w.shape),
                                                      const=w),
                                    pads=[kernel // 2] * 4, group=group, name=f"conv{n}"))
        g.outputs = [h]
        optimized, (program,) = programs(g, machine=target("fp16"))
        ops = [n.op for n in optimized.nodes]
        assert ops.count("ConvNHWC") == (3 if nhwc else 0), ops
        assert ops.count("Transpose") == (2 if nhwc else 0), ops
        schedules = {k.anchor.op: k.schedule[0] for k in program.kernels}
        if nhwc:
            assert schedules["ConvNHWC"] == "cuda_mma_conv2d_nhwc"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_case_compiles_for_sm80_and_sm90(arch):
    """Each case scheduled for `arch` (sm_90: wgmma at fp16 / bf16 by default, compiled for
    sm_90a as the runtime does) compiles with NVRTC."""
    pytest.importorskip("cupy.cuda")   # NVRTC, before the programs are built
    funcs = []
    for n, case in enumerate(CASES + GROUPED):
        graph, _ = nhwc_graph(np.random.default_rng(n), case[0], *case[1:])
        _, (program,) = programs(graph, machine=target(case[0], arch))
        funcs += renamed(program, f"c{n}_")
    module = render_module(funcs)
    nvrtc_compiled(module.source, arch + ("a" if "dnnc_wgmma_" in module.source else ""))


def _conv_problem(precision, image, oc, kernel, stride, pad):
    from dnnc.backends.lower import lower_group
    from dnnc.backends.problems import conv2d_nhwc

    graph, _ = nhwc_graph(np.random.default_rng(0), precision, image, oc, kernel, stride, pad, 1)
    node = graph.nodes[0]
    return conv2d_nhwc(lower_group([node], "k", outputs=node.outputs))


def test_deep_pointwise_convs_take_the_dense_defaults_rules():
    """A 1x1 conv of stride 1 deeper than SHALLOW_K at fp16 / bf16 (both operands plain
    arrays) takes the dense default's rules on sm_90: wgmma tiles rated by WGMMA_TILE_S's
    model, the TMA producer; a shallow one keeps the conv's rule (no producer); a 3x3 and a
    strided 1x1 take the TMA producer in im2col mode (`Im2col`)."""
    from dnnc.backends.cuda import conv_nhwc

    for precision in ("fp16", "bf16"):
        machine = target(precision)
        deep = _conv_problem(precision, (32, 7, 7, 2048), 512, 1, 1, 0)   # resnet50's
        assert conv_nhwc.pointwise(deep)
        chosen = conv_nhwc.default(deep, machine)
        assert chosen.wgmma and chosen.producer == "tma"
        shallow = _conv_problem(precision, (32, 14, 14, 256), 1024, 1, 1, 0)
        assert not conv_nhwc.default(shallow, machine).producer
        for gathered in ((32, 7, 7, 512), 512, 3, 1, 1), ((32, 14, 14, 1024), 2048, 1, 2, 0):
            problem = _conv_problem(precision, *gathered)
            assert not conv_nhwc.pointwise(problem) and conv_nhwc.im2col_copied(problem, machine)
            assert conv_nhwc.default(problem, machine).producer == "tma"
    assert not conv_nhwc.default(_conv_problem("tf32", (32, 7, 7, 2048), 512, 1, 1, 0),
                                 target("tf32")).producer


def test_3x3_convs_of_128_channels_take_the_64_x_128_wgmma_tile():
    """resnet50's 3x3 convs of 128 channels at batch 32 (H 28, and H 56 stride 2) take the
    64 x 128 wgmma tile, staged (CONV_WGMMA_EFFICIENCY; on an H200 1.08 of cuDNN where 64 x 64
    took 0.87), at fp16 and bf16."""
    from dnnc.backends.cuda import conv_nhwc

    for precision in ("fp16", "bf16"):
        for image, stride in (((32, 28, 28, 128), 1), ((32, 56, 56, 128), 2)):
            chosen = conv_nhwc.default(_conv_problem(precision, image, 128, 3, stride, 1),
                                       target(precision))
            assert chosen.wgmma and chosen.staged and chosen.split_k == 1
            assert (chosen.block_m, chosen.block_n) == (64, 128)


@needs_gxx
@pytest.mark.parametrize("split", [1, 2])
def test_a_pointwise_conv_on_the_tma_producer_on_host(split, rng, tmp_path):
    """A 1x1 conv whose image and weights TMA copies (3-D maps of the plain arrays), 130
    pixels (a ragged row tile) by 72 channels (a ragged column tile), within the precision's
    bound on host threads, unsplit and split."""
    from dnnc.backends.cuda.mma import TensorCoreConfig

    case = ("fp16", (2, 5, 13, 320), 72, 1, 1, 0, 1)
    config = TensorCoreConfig(64, 64, 64, 4, 1, 4, split_k=split, wgmma=True, producer="tma")
    graph, x = nhwc_graph(rng, *case)
    graph, (program,) = programs(graph, machine=target("fp16"), config=config)
    (conv_kernel,) = [k for k in program.kernels if k.anchor.op == "ConvNHWC"]
    assert conv_kernel.schedule == ("cuda_mma_conv2d_nhwc", config)
    module = render_module(program.unique)
    assert module.source.count("dnnc_tma_load_3d(&") >= 2   # the image and the weights
    _on_host_within_the_bound(case, graph, x, program, module, tmp_path)


IM2COL_CASES = [
    ("fp16", (2, 9, 9, 64), 72, 3, 1, 1, 1),      # padding, 162 pixels: tiles across images
    ("fp16", (3, 7, 7, 128), 64, 3, 2, 1, 1),     # stride 2, 48 pixels, 2 k tiles a tap
    ("bf16", (1, 11, 10, 64), 16, 3, 1, 2, 2),    # dilation, pads beyond the window
]
"""3x3 convs whose patches TMA's im2col mode copies (C a multiple of 64 16-bit channels)."""


@needs_gxx
@pytest.mark.parametrize("case,rows,split", [(0, 64, 1), (0, 128, 1), (1, 64, 2), (2, 64, 1),
                                             (1, 128, 1)])
def test_3x3_convs_on_tma_im2col_on_host(case, rows, split, rng, tmp_path):
    """A 3x3 conv whose patches TMA copies in im2col mode (`conv_nhwc.Im2col`: one box a
    tap's 64 channels of a tile's pixels, the tap as the copy's offsets) and its weights by a
    tiled map, on host threads (the shim walks the pixels as the map's corners say), one
    and two warpgroups, unsplit and split, within the precision's bound."""
    from dnnc.backends.cuda.mma import TensorCoreConfig

    config = TensorCoreConfig(rows, 64, 64, rows // 16, 1, 4, split_k=split, wgmma=True,
                              producer="tma")
    graph, x = nhwc_graph(rng, *IM2COL_CASES[case])
    graph, (program,) = programs(graph, machine=target(IM2COL_CASES[case][0]), config=config)
    (conv_kernel,) = [k for k in program.kernels if k.anchor.op == "ConvNHWC"]
    assert conv_kernel.schedule == ("cuda_mma_conv2d_nhwc", config)
    module = render_module(program.unique)
    assert module.source.count("dnnc_tma_load_im2col_4d(&") == 1   # the patches
    assert module.source.count("dnnc_tma_load_3d(&") == 1           # the weights
    _on_host_within_the_bound(IM2COL_CASES[case], graph, x, program, module, tmp_path)


def test_deep_3x3_convs_take_the_tma_im2col_producer():
    """A conv whose patches TMA's im2col mode copies, deeper than SHALLOW_K, at fp16 / bf16
    on sm_90 takes the dense default's rules as a pointwise one does (WGMMA_TILE_S's model,
    the TMA producer): resnet50's 3x3 convs of 512 channels the 128 x 64 tall tile,
    unsplit; C not a multiple of 64, a shallow conv, tf32 and sm_80 keep the conv's rule."""
    from dnnc.backends.cuda import conv_nhwc

    for precision in ("fp16", "bf16"):
        machine = target(precision)
        for image, stride in (((32, 7, 7, 512), 1), ((32, 14, 14, 512), 2)):
            problem = _conv_problem(precision, image, 512, 3, stride, 1)
            assert conv_nhwc.im2col_copied(problem, machine)
            chosen = conv_nhwc.default(problem, machine)
            assert chosen.producer == "tma" and chosen.split_k == 1
            assert (chosen.block_m, chosen.block_n) == (128, 64)
        for others in (((32, 7, 7, 24), 64, 3, 1, 1), ((32, 7, 7, 16), 64, 3, 1, 1)):
            problem = _conv_problem(precision, *others)
            assert not conv_nhwc.default(problem, machine).producer
    problem = _conv_problem("fp16", (32, 7, 7, 512), 512, 3, 1, 1)
    assert not conv_nhwc.default(problem, target("fp16", "sm_80")).producer
    tf32 = _conv_problem("tf32", (32, 7, 7, 512), 512, 3, 1, 1)
    assert not conv_nhwc.default(tf32, target("tf32")).producer


# -- whole models ---------------------------------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_convolutions_on_host(stride, rng, tmp_path):
    """A channels-last depthwise conv (`cuda_depthwise_nhwc`: a block per tile of pixels x
    run of channels) on the host shim, against the reference of the same fp16 graph: both
    sum in float32 and round once to fp16."""
    from test_host_semantics import host_library, program_on_host

    c = 24
    w = rng.uniform(-1, 1, (c, 3, 3, 1)).astype(np.float16)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float16, (2, 9, 7, c)))
    g.outputs = [g.add("Clip", g.add("ConvNHWC", x, Value("w", T.TensorType(T.float16, w.shape),
                                                          const=w),
                                     group=c, strides=[stride] * 2, pads=[1] * 4),
                       Value("lo", T.TensorType(T.float16, ()), const=np.float16(0)),
                       Value("hi", T.TensorType(T.float16, ()), const=np.float16(6)))]
    xv = rng.uniform(-1, 1, (2, 9, 7, c)).astype(np.float16)
    graph, (program,) = programs(g, machine=target("fp16"))
    (kernel,) = [k for k in program.kernels if k.anchor.op == "ConvNHWC"]
    assert kernel.schedule[0] == "cuda_depthwise_nhwc"
    module = render_module(program.unique)
    got = program_on_host(host_library(program.unique, tmp_path, module), module, program,
                          {"x": xv})[graph.outputs[0].name].astype(np.float64)
    want = reference(graph, {"x": xv})[graph.outputs[0].name].astype(np.float64)
    assert np.abs(got - want).max() <= 2 * 2.0 ** -11 * np.abs(want).max()


@needs_gxx
@pytest.mark.parametrize("name,precision", [
    ("cnn", "fp16"),
    pytest.param("mobilenet_v2", "fp16", marks=pytest.mark.emulated_full),   # 34 s in CI
    pytest.param("resnet18", "fp16", marks=pytest.mark.emulated_full),
    pytest.param("resnet18", "bf16", marks=pytest.mark.emulated_full),
    pytest.param("resnet18", "tf32", marks=pytest.mark.emulated_full)])
def test_zoo_model_on_host_within_the_model_bound(name, precision, tmp_path):
    """Every kernel of a zoo model compiled for cuda at `precision` (channels-last
    convolutions) run in turn on the host shim from the model's input: the output within
    `model_error_bound` of the fp32 reference."""
    from test_host_semantics import host_library, program_on_host
    from cuda_kernels import zoo_model

    model = zoo_model(name)
    graph, progs = programs(import_onnx(model), machine=target(precision))
    inputs = zoo.inputs_for(model, np.random.default_rng(0))
    values = dict(inputs)
    nhwc = 0
    for p, program in enumerate(progs):
        module = render_module(program.unique)
        nhwc += sum(k.schedule[0] == "cuda_mma_conv2d_nhwc" for k in program.kernels)
        values = program_on_host(host_library(program.unique, tmp_path / str(p), module),
                                 module, program, values)
    assert nhwc > 0
    fp32 = import_onnx(model)
    want = reference(fp32, inputs)[fp32.outputs[0].name].astype(np.float64)
    got = values[graph.outputs[0].name].astype(np.float64)
    worst = np.abs(got - want).max() / np.abs(want).max()
    assert worst <= model_error_bound(precision), f"{name} {precision}: {worst:.3g}"


def test_an_artifact_keeps_the_channels_last_graph(simulated, tmp_path, monkeypatch):
    """A channels-last compile saves and loads (simulated device): the graph's ConvNHWC
    nodes, their OHWI weights bit for bit and the Transposes come back."""
    from dnnc.backends.cuda import executable
    from dnnc.compiler.module import CompiledModel
    from dnnc.passes.manager import optimize
    from simulated_device import FAKE, relu_model

    simulated(relu_model([3, 5]))   # (the simulated device in place)
    monkeypatch.setattr(device, "gpu_arch", lambda: FAKE.arch)
    target = REGISTRY["cuda"].target(precision="fp16")
    rt = executable.CUDARuntime(optimize(import_onnx(zoo.build("cnn")), target, 3),
                                target=target).start()
    CompiledModel(rt.graph, rt, "cuda").save(tmp_path / "m.dnnc")
    graph = dnnc.load(tmp_path / "m.dnnc").runtime.graph
    assert [n.op for n in graph.nodes] == [n.op for n in rt.graph.nodes]
    assert "ConvNHWC" in {n.op for n in graph.nodes}
    saved = {v.name: v.const for v in rt.graph.constants()}
    for v in graph.constants():
        np.testing.assert_array_equal(v.const.view(np.uint8), saved[v.name].view(np.uint8))


# -- on a GPU -------------------------------------------------------------------------------------

def _matches_the_reference_on_the_gpu(graph, x, precision, marker):
    """`graph` compiled by dnnc for the GPU at `precision` (its source holding `marker`, the
    path the test is about), its output on `x` against the NumPy reference within the model
    bound of the precision."""
    compiled = dnnc.compile(graph, "cuda", precision=precision)
    assert marker in compiled.source("cuda")
    got = compiled.run(x, to="numpy")[0].astype(np.float64)
    want = reference(graph, {"x": x})[graph.outputs[0].name].astype(np.float64)
    assert np.abs(got - want).max() / np.abs(want).max() <= model_error_bound(precision)


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(CASES)))
def test_convolutions_on_the_gpu(case, rng):
    """Each case compiled by dnnc for the GPU at its precision, against the NumPy reference
    within the model bound of the precision (one layer)."""
    precision = CASES[case][0]
    graph, x = nhwc_graph(rng, precision, *CASES[case][1:])
    _matches_the_reference_on_the_gpu(graph, x, precision, f"dnnc_mma_{precision}(")


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(GROUPED)))
def test_grouped_convolutions_on_the_gpu(case, rng):
    """Each grouped case (one product a group) compiled by dnnc for the GPU at its
    precision, against the NumPy reference within the model bound of the precision."""
    precision = GROUPED[case][0]
    graph, x = nhwc_graph(rng, precision, *GROUPED[case][1:])
    _matches_the_reference_on_the_gpu(graph, x, precision, "blockIdx.z")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [("fp16", (4, 7, 7, 512), 512, 3, 1, 1, 1),
                                  ("bf16", (3, 14, 14, 512), 512, 3, 2, 1, 1),
                                  ("bf16", (2, 14, 14, 256), 256, 3, 1, 2, 2)])
def test_3x3_convs_on_tma_im2col_on_the_gpu(case, rng):
    """3x3 convs (stride 2, dilation 2) on their default, the TMA producer with the patches
    in im2col mode (maps built by the runtime: `tensor_map.encode_im2col`; split 4 to 8 at
    these batches), against the NumPy reference within the model bound of the precision.
    (IM2COL_CASES' products are too small for a wgmma tile by default.)"""
    precision = case[0]
    graph, x = nhwc_graph(rng, *case)
    _matches_the_reference_on_the_gpu(graph, x, precision, "dnnc_tma_load_im2col_4d(&")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("image,oc", [((4, 7, 7, 2048), 512), ((2, 14, 14, 1024), 256)])
def test_deep_pointwise_convs_on_tma_on_the_gpu(precision, image, oc, rng):
    """resnet50's deep 1x1 convs (batches 4 and 2) on their default, the TMA producer (maps
    of the image and the weights built by the runtime), against the NumPy reference within
    the model bound of the precision."""
    graph, x = nhwc_graph(rng, precision, image, oc, 1, 1, 0, 1)
    _matches_the_reference_on_the_gpu(graph, x, precision, "dnnc_tma_load_3d(&")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
@pytest.mark.parametrize("name,convs,transposes", [("resnet18", 20, 1), ("mobilenet_v2", 52, 1)])
def test_zoo_model_channels_last_matches_onnxruntime(name, convs, transposes, precision, rng):
    ort = pytest.importorskip("onnxruntime")
    model = zoo.build(name, batch=4)
    compiled = dnnc.compile(model, "cuda", precision=precision)
    graph = compiled.runtime.graph
    assert sum(n.op == "ConvNHWC" for n in graph.nodes) == convs
    # the input's (the stem's MaxPool and the global pool NHWC)
    assert sum(n.op == "Transpose" for n in graph.nodes) == transposes
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = zoo.inputs_for(model, rng)
    (got,) = compiled.run(*feeds.values(), to="numpy")
    (want,) = session.run(None, feeds)
    worst = np.abs(got - want).max() / np.abs(want).max()
    assert worst <= model_error_bound(precision), f"{precision}: {worst:.3g}"


def test_tf32_weights_are_rounded_once_at_compile_time():
    """At tf32 a one-group channels-last conv's weights are tf32 values from the layout pass
    (`round_tf32`, PTX's cvt.rna: to nearest, ties away) and its tiles leave them unrounded
    (`w_tf32`); a depthwise conv (no tensor cores) keeps its float32 weights."""
    from dnnc.backends.lower import lower_group
    from dnnc.backends.problems import conv2d_nhwc
    from dnnc.ir.ops.packed import is_tf32, round_tf32

    ties = np.array([1 + 2 ** -11, -(1 + 2 ** -11), 1 + 2 ** -12, np.inf, -np.inf],
                    np.float32)
    np.testing.assert_array_equal(round_tf32(ties), np.array(
        [1 + 2 ** -10, -(1 + 2 ** -10), 1, np.inf, -np.inf], np.float32))
    assert np.isnan(round_tf32(np.array([np.nan], np.float32)))[0]
    rng = np.random.default_rng(0)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 16, 9, 9)))
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    dw = rng.standard_normal((24, 1, 3, 3)).astype(np.float32)
    y = g.add("Conv", x, Value("w", T.TensorType(T.float32, w.shape), const=w), pads=[1] * 4)
    g.outputs = [g.add("Conv", y, Value("dw", T.TensorType(T.float32, dw.shape), const=dw),
                       pads=[1] * 4, group=24)]
    graph, _ = programs(g, machine=target("tf32"))
    convs = [n for n in graph.nodes if n.op == "ConvNHWC"]
    assert len(convs) == 2
    for node in convs:
        one_group = (node.attrs.get("group") or 1) == 1
        assert is_tf32(node.inputs[1].const) == one_group
        assert conv2d_nhwc(lower_group([node], "k", outputs=node.outputs)).w_tf32 == one_group
