"""The cuda channels-last int8 convolution (backends/cuda/int8_nhwc.py: QuantizedConvNHWC on
the integer tensor cores, patches by cp.async) without a GPU: kernels scheduled for cuda, run
on host threads with the mma and cp.async emulated (test_host_semantics' shim), bit for bit
the op's NumPy reference (whose padding is the activation's zero point: the kernel's
zero-filled padding compensated by w_tap_sums) and the llvm build; "nhwc_conv" making int8
segments channels-last; NVRTC compiles for sm_80 and sm_90 where CuPy is installed. The same
graphs on a GPU (`gpu` marker) are test_cuda_int8_gpu.py's."""

import numpy as np
import pytest

import dnnc
from dnnc.backends.cuda import FUSION, int8_nhwc
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.mma import TensorCoreConfig
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph
from dnnc.ir.ops.quantized import quantized_conv_nhwc, tap_sums
from dnnc.ir.target import Target
from cuda_kernels import MACHINE, nvrtc_compiled, programs
from test_cuda_int8 import _const, _epilogue, conv_graph
from test_host_semantics import host_library, program_on_host

pytestmark = pytest.mark.codegen

LAYOUTS = Target("cuda", arch="sm_90", fusion=FUSION, layouts=("sparse_weights", "nhwc_conv"))
"""The cuda Target with the layouts a compile for cuda applies ("nhwc_conv")."""


def nhwc_graph(rng, n, c, h, w, m, k, stride, pad, act, out, lo=None):
    """Relu(QuantizedConvNHWC(x, ...)) of a channels-last x of type `act`, per-channel scales
    and a random zero point (never 0: the padding's share matters); the graph, an input and
    the reference output."""
    info = np.iinfo(act)
    wq = rng.integers(-128, 128, (m, k, k, c)).astype(np.int8)
    g = Graph("q")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(act)), (n, h, w, c)))
    za = act(rng.choice([info.min, info.max, 3, -77 % (info.max + 1)]))
    ins = [x, _const("za", za), _const("w", wq),
           _const("s", wq.astype(np.int32).reshape(m, -1).sum(1).astype(np.int32))]
    ins += _epilogue(rng, m, out)
    ins += [None] * (7 - len(ins)) + [_const("t", tap_sums(wq))]
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, lo=lo,
                 hi=None)
    g.outputs = [g.add("Relu", g.add("QuantizedConvNHWC", *ins, **attrs))]
    xv = rng.integers(info.min, info.max + 1, (n, h, w, c)).astype(act)
    want = np.maximum(quantized_conv_nhwc(xv, *[None if v is None else v.const for v in ins[1:]],
                                          auto_pad="NOTSET", dilations=None, group=1, **attrs),
                      0)
    return g, xv, want


CASES = [   # (n, c, h, w, m, k, stride, pad, activation, output)
    (1, 16, 7, 9, 19, 3, 1, 1, np.uint8, "int8"), (2, 32, 8, 8, 40, 1, 1, 0, np.int8, "uint8"),
    (1, 48, 11, 11, 24, 3, 2, 1, np.int8, "float32"), (1, 16, 10, 10, 16, 5, 2, 2, np.int8, "int8"),
    (3, 16, 5, 7, 13, 1, 2, 0, np.uint8, "int8"), (1, 64, 6, 6, 33, 3, 1, 1, np.int8, "int32"),
    (2, 16, 6, 5, 20, 1, 1, 1, np.uint8, "uint8")]
"""3x3 stride 1 and 2, 5x5, 1x1 (a plain array; stride 2; padded), C 16 to 64, tails of
M and N, every output type, both activation types, zero points at the type's ends."""
SMALL_TILE = TensorCoreConfig(32, 32, 32, 2, 1, 2)


def _on_host(graph, x, tmp_path, machine=MACHINE, config=None):
    optimised, (program,) = programs(graph, machine=machine, config=config)
    module = render_module(program.unique)
    lib = host_library(program.unique, tmp_path, module)
    values = program_on_host(lib, module, program, {optimised.inputs[0].name: x})
    return values[optimised.outputs[0].name], [k.schedule[0] for k in program.kernels], \
        module.source


def _check(graph, x, want, tmp_path, config=None):
    got, templates, source = _on_host(graph, x, tmp_path, config=config)
    assert templates[0] == "cuda_int8_conv2d_nhwc"
    assert "dnnc_cp_async(&" in source
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want), f"{np.sum(got != want)} of {got.size} differ"
    assert np.array_equal(got, dnnc.compile(graph, "llvm", cache=False)(x))


@pytest.mark.parametrize("n,c,h,w,m,k,stride,pad,act,out", CASES)
def test_int8_nhwc_conv_on_host_equals_the_reference_and_llvm(n, c, h, w, m, k, stride, pad,
                                                             act, out, tmp_path):
    rng = np.random.default_rng(n * c * h * m * k + stride)
    g, x, want = nhwc_graph(rng, n, c, h, w, m, k, stride, pad, act, out,
                            lo=-100 if out == "int8" else None)
    _check(g, x, want, tmp_path)


def test_int8_nhwc_small_tiles_and_stages_on_host(tmp_path):
    """Several blocks each way, edges of m and n, rings of 2 and 4 k tiles of 32 and 128
    bytes (a k tile across taps), the staged epilogue (runs of 4 int8 results)."""
    rng = np.random.default_rng(12)
    g, x, want = nhwc_graph(rng, 2, 32, 9, 9, 40, 3, 1, 1, np.uint8, "uint8")
    for k, config in enumerate((SMALL_TILE, TensorCoreConfig(16, 32, 128, 1, 2, 4),
                                TensorCoreConfig(32, 64, 64, 1, 2, 3, staged=True))):
        _check(g, x, want, tmp_path / str(k), config)


def test_every_config_of_the_space_builds():
    rng = np.random.default_rng(3)
    g, _, _ = nhwc_graph(rng, 1, 32, 8, 8, 48, 3, 1, 1, np.int8, "uint8")
    _, (program,) = programs(g, machine=MACHINE)
    from dnnc.backends.quantized_problems import quantized_conv_nhwc as describe

    p = describe(program.kernels[0])
    configs = list(int8_nhwc.conv_space(p, MACHINE).configs())
    assert SMALL_TILE in configs and int8_nhwc.conv_default(p, MACHINE) in configs
    for k in rng.choice(len(configs), 16, replace=False):   # each builds verified loop IR
        L.verify(int8_nhwc.conv_build(p, configs[k], MACHINE))


def _ops(graph) -> list[str]:
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("c", [16, 5])
def test_nhwc_conv_makes_int8_convs_channels_last(c, tmp_path):
    """A QuantizedConvPacked becomes Transpose -> QuantizedConvNHWC -> Transpose for cuda (at
    fp32: the integer kernels have no precision), 5 channels padded with zeros to 16 (Pad,
    zero weights); both give the reference on host threads."""
    rng = np.random.default_rng(4 + c)
    g, x, want = conv_graph(rng, 2, c, 9, 7, 24, 3, 1, 1, np.uint8, "int8")
    optimised, _ = programs(g, machine=LAYOUTS)
    assert _ops(optimised).count("QuantizedConvNHWC") == 1
    assert ("Pad" in _ops(optimised)) == (c % 16 != 0)
    got, templates, _ = _on_host(g, x, tmp_path, machine=LAYOUTS)
    assert "cuda_int8_conv2d_nhwc" in templates
    assert np.array_equal(got, want)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_int8_nhwc_kernels_compile_with_nvrtc(arch):
    """u8 and s8 patches by cp.async, the padding's share, a pointwise conv, as the defaults
    schedule them for `arch` (sm_80: mma.sync; sm_90: wgmma, compiled for sm_90a as the
    runtime does)."""
    from dataclasses import replace

    rng = np.random.default_rng(5)
    funcs = []
    for case in (CASES[0], CASES[1], CASES[2]):
        _, (program,) = programs(nhwc_graph(rng, *case)[0], machine=replace(MACHINE, arch=arch))
        funcs += [(f.__class__(f"{f.name}_{len(funcs)}", f.params, f.body), noalias)
                  for f, noalias in program.unique]
    source = render_module(funcs).source
    if arch == "sm_80":
        assert "dnnc_mma_u8(&" in source and "dnnc_mma_s8(&" in source
    else:
        assert "dnnc_wgmma_u8_" in source and "dnnc_wgmma_s8_" in source
    assert "dnnc_cp_async(&" in source
    nvrtc_compiled(source, arch + ("a" if "dnnc_wgmma_" in source else ""))


@pytest.mark.parametrize("name,convs", [
    ("cnn", 3), pytest.param("resnet18", 20, marks=pytest.mark.emulated_full)])
def test_quantized_files_channels_last_on_host(name, convs, tmp_path):
    """A QDQ CNN (quantize_static, int8 activations) compiled for cuda with its layouts: its
    convs channels-last (the stem's channels padded to 16), their int8 values kept
    channels-last through the residual Adds' DQ / Q and the pools; the whole program on host
    threads gives onnxruntime's outputs bit for bit."""
    pytest.importorskip("onnxruntime")
    from dnnc import zoo
    from dnnc.frontend.onnx import import_onnx
    from dnnc.testing.quantized_files import onnxruntime_outputs, quantize_static

    model = zoo.build(name, **({"size": 32} if name == "resnet18" else {}))
    path = quantize_static(model, tmp_path, name, seed=3)
    feeds = zoo.inputs_for(model, np.random.default_rng(13))
    graph, (program,) = programs(import_onnx(str(path)), machine=LAYOUTS)
    templates = [k.schedule[0] for k in program.kernels]
    assert templates.count("cuda_int8_conv2d_nhwc") == convs
    assert _ops(graph).count("Transpose") <= 2
    module = render_module(program.unique)
    lib = host_library(program.unique, tmp_path / "lib", module)
    got = program_on_host(lib, module, program, feeds)[graph.outputs[0].name]
    assert np.array_equal(got, onnxruntime_outputs(path, feeds)[0])


WGMMA_TILES = [TensorCoreConfig(64, 64, 128, 4, 1, 4, wgmma=True),
               TensorCoreConfig(128, 128, 128, 8, 1, 3, wgmma=True, staged=True),
               TensorCoreConfig(64, 128, 128, 4, 1, 2, wgmma=True, early_refill=True),
               TensorCoreConfig(128, 128, 128, 8, 1, 3, wgmma=True, refill_first=True,
                                staged=True)]
"""wgmma's s8 / u8 form (sm_90): one warpgroup, two of 128 columns (staged), early refill,
the shallow products' default (`int8.SHALLOW_TILE`, staged)."""


@pytest.mark.parametrize("act", [np.int8, np.uint8])
def test_int8_wgmma_on_host(act, tmp_path):
    """The channels-last conv, the dense product and the NCHW conv (patches through
    registers) on wgmma.mma_async's integer form (emulated: K-major swizzled tiles, int32
    sums), padded 3x3 patches, edges of M and N and k: bit for bit the reference."""
    from test_cuda_int8 import dense_graph

    rng = np.random.default_rng(31)
    g, x, want = nhwc_graph(rng, 2, 48, 9, 7, 72, 3, 1, 1, act, "int8")
    for k, config in enumerate(WGMMA_TILES):
        _check(g, x, want, tmp_path / str(k), config)
    g, x, want = dense_graph(rng, 1, 70, 160, 136, act, "uint8")
    got, templates, source = _on_host(g, x, tmp_path / "dense", config=WGMMA_TILES[0])
    assert templates == ["cuda_int8_dense"] and np.array_equal(got, want)
    assert f"dnnc_wgmma_{'s8' if act is np.int8 else 'u8'}_n64<" in source
    g, x, want = conv_graph(rng, 1, 13, 9, 9, 24, 3, 1, 1, act, "uint8")
    got, templates, _ = _on_host(g, x, tmp_path / "nchw", config=WGMMA_TILES[0])
    assert templates == ["cuda_int8_conv2d"] and np.array_equal(got, want)


@pytest.mark.parametrize("n,h,w,m,act", [(2, 8, 8, 128, np.int8), (2, 9, 7, 136, np.uint8)])
def test_int8_residual_loaded_ahead_on_host(n, h, w, m, act, tmp_path):
    """A 1x1 conv whose staged epilogue adds an 8-bit residual (QuantizedAdd, as a QDQ
    ResNet's bottleneck ends) on the shallow products' tile (`int8.SHALLOW_TILE`, 16 steps a
    thread): the residual's runs are loaded ahead of the k loop, a word a step
    (`dnnc_load_word`, staged.py's `_ahead`), whole tiles and tiles past Y's edges, bit for
    bit the reference."""
    import dataclasses

    from dnnc.backends.cuda.int8 import SHALLOW_TILE
    from dnnc.ir.interpreter import run_graph

    rng = np.random.default_rng(m)
    g, x, _ = nhwc_graph(rng, n, 64, h, w, m, 1, 1, 0, act, act.__name__)
    conv = g.outputs[0].producer.inputs[0]   # (the Relu's input)
    residual = g.add_input("r", T.TensorType(T.DType.from_numpy(np.dtype(act)), (n, h, w, m)))
    scalars = [_const(name, value) for name, value in (
        ("sa", np.float32(0.03)), ("za", act(3)), ("sb", np.float32(0.05)),
        ("zb", act(-7 % 256 if act is np.uint8 else -7)), ("sc", np.float32(0.07)),
        ("zc", act(5)))]
    g.outputs = [g.add("QuantizedAdd", conv, *scalars[:2], residual, *scalars[2:])]
    info = np.iinfo(act)
    r = rng.integers(info.min, info.max + 1, (n, h, w, m)).astype(act)
    optimised, (program,) = programs(g, machine=MACHINE,
                                     config=dataclasses.replace(SHALLOW_TILE, staged=True))
    module = render_module(program.unique)
    assert [k.schedule[0] for k in program.kernels] == ["cuda_int8_conv2d_nhwc"]
    assert "dnnc_load_word(&" in module.source
    lib = host_library(program.unique, tmp_path, module)
    got = program_on_host(lib, module, program, {"x": x, "r": r})[optimised.outputs[0].name]
    assert np.array_equal(got, run_graph(g, [x, r])[0])


REQUANTIZATIONS = [   # (type, zero points (x, conv = add's a, residual, add), add's scales)
    (np.int8, (-77, -3, 5, -3), (1.0, 0.5, 1.0)),
    (np.uint8, (200, 128, 255, 100), (1.0, 0.5, 0.75)),
    (np.int8, (127, 0, -128, 0), (0.06, 0.05, 0.07)),
    (np.uint8, (3, 128, 250, 0), (0.02, 0.03, 0.0449230782687664))]
"""Zero points negative, odd, at the types' ends; the add's 1 / c_scale exact, rounded and
(the last) refined (`add_reciprocal`)."""


def requantization_graph(rng, act, zeros, scales, n, h, w, m, c=64):
    """QuantizedAdd(a 1x1 QuantizedConvNHWC, an 8-bit residual) as a QDQ ResNet's bottleneck
    ends, the add multiplying by add_reciprocal's 1 / c_scale: power-of-two scales (even
    channels) put the conv's products on ties at .5 (and the add's quotients, with scales 1,
    0.5, 1), other scales (odd channels) make products that round to a tie without being one
    (`contracted_ties`: where a multiply fused into the rounding add would round the other
    way), its sums saturate. The graph, its inputs, and the conv's int32 sums and scales."""
    from dnnc.ir.ops.quant import add_reciprocal

    info = np.iinfo(act)
    wq = rng.integers(-128, 128, (m, 1, 1, c)).astype(np.int8)
    g = Graph("q")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(act)), (n, h, w, c)))
    per_channel = np.float32(2.0) ** -rng.integers(5, 9, m).astype(np.float32)
    per_channel[1::2] = rng.uniform(2.0 ** -9, 2.0 ** -5, m // 2).astype(np.float32)
    bias = rng.integers(-5000, 5000, m).astype(np.int32)
    ins = [x, _const("za", act(zeros[0])), _const("w", wq),
           _const("s", wq.astype(np.int32).reshape(m, -1).sum(1).astype(np.int32)),
           _const("b", bias), _const("sc", per_channel), _const("yz", act(zeros[1])),
           _const("t", tap_sums(wq))]
    conv = g.add("QuantizedConvNHWC", *ins, kernel_shape=[1, 1], strides=[1, 1],
                 pads=[0] * 4, lo=None, hi=None)
    residual = g.add_input("r", T.TensorType(T.DType.from_numpy(np.dtype(act)), (n, h, w, m)))
    (sa, sb, sc), (za, zb, zc) = scales, (act(zeros[1]), act(zeros[2]), act(zeros[3]))
    reciprocal = add_reciprocal(act, sa, za, act, sb, zb, sc)
    assert reciprocal is not None
    g.outputs = [g.add("QuantizedAdd", conv, _const("sa", np.float32(sa)), _const("za2", za),
                       residual, _const("sb", np.float32(sb)), _const("zb", zb),
                       _const("sc2", np.float32(sc)), _const("zc", zc),
                       c_reciprocal=reciprocal[0], c_refined=reciprocal[1])]
    feeds = {"x": rng.integers(info.min, info.max + 1, (n, h, w, c)).astype(act),
             "r": rng.integers(info.min, info.max + 1, (n, h, w, m)).astype(act)}
    acc = (feeds["x"].reshape(-1, c).astype(np.int64) - zeros[0]) @ \
        wq.reshape(m, c).T.astype(np.int64) + bias
    return g, feeds, (acc, per_channel)


def contracted_ties(acc, scales) -> tuple[int, int]:
    """(float32 products acc * scale that are ties at .5, those of them that are not the exact
    product: rint of the exact product, as an fma rounds it, goes the other way)."""
    y = acc.astype(np.float32) * scales
    ties = np.abs(y - np.rint(y)) == 0.5
    return int(ties.sum()), int((ties & (y.astype(np.float64) != acc * scales.astype(
        np.float64))).sum())


@pytest.mark.parametrize("act,zeros,scales", REQUANTIZATIONS)
def test_int8_requantization_ties_and_saturation_on_host(act, zeros, scales, tmp_path):
    """The residual 1x1 conv's epilogue with `quant.rounded_saturated`'s requantizations (no
    rintf, no float -> int conversion) and bytes made floats by their bits (PRELUDE's
    `dnnc_s8_bits` / `dnnc_u8_bits`) on the shallow products' tile (the residual loaded
    ahead), bit for bit the reference on host threads (`requantization_graph`: ties at .5,
    saturation, odd and negative zero points), int8 and uint8."""
    import dataclasses

    from dnnc.backends.cuda.int8 import SHALLOW_TILE
    from dnnc.ir.interpreter import run_graph

    rng = np.random.default_rng(abs(zeros[0]))
    g, feeds, products = requantization_graph(rng, act, zeros, scales, 2, 9, 7, 136)
    optimised, (program,) = programs(g, machine=MACHINE,
                                     config=dataclasses.replace(SHALLOW_TILE, staged=True))
    module = render_module(program.unique)
    assert [k.schedule[0] for k in program.kernels] == ["cuda_int8_conv2d_nhwc"]
    assert "rintf" not in module.source and "? _t" not in module.source
    assert f"dnnc_{'s' if act is np.int8 else 'u'}8_bits(" in module.source
    lib = host_library(program.unique, tmp_path, module)
    got = program_on_host(lib, module, program, feeds)[optimised.outputs[0].name]
    want = run_graph(g, [feeds["x"], feeds["r"]])[0]
    assert np.array_equal(got, want), f"{np.sum(got != want)} of {got.size} differ"
    info = np.iinfo(act)
    assert {info.min, info.max} & set(want.ravel().tolist())   # (saturated)
    assert contracted_ties(*products)[0] > 100   # (the conv's ties)


def test_int8_wgmma_compiles_for_sm90a_without_spills():
    """NVRTC (where CuPy is) compiles the channels-last conv at each WGMMA_TILES tile, s8 and
    u8, for sm_90a to wgmma's integer form, without register spills."""
    import re

    from dnnc.backends.cuda import device

    nvrtc = pytest.importorskip("cupy.cuda").nvrtc
    rng = np.random.default_rng(8)
    funcs = []
    for act in (np.int8, np.uint8):
        g = nhwc_graph(rng, 2, 64, 14, 14, 128, 3, 1, 1, act, "int8")[0]
        for config in WGMMA_TILES:
            _, (program,) = programs(g, machine=MACHINE, config=config)
            funcs += [(f.__class__(f"{f.name}_{len(funcs)}", f.params, f.body), noalias)
                      for f, noalias in program.unique if "QuantizedConvNHWC" in f.name]
    source = render_module(funcs).source
    assert device.compile_arch("sm_90", source) == "sm_90a"
    prog, log = nvrtc_compiled(source, "sm_90a", "--ptxas-options=-v")
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) >= len(funcs) and all(int(x) == 0 for x in spills), log[-4000:]
    ptx = nvrtc.getPTX(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    for instruction in ("wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8",
                        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8"):
        assert instruction in ptx, instruction
    nvrtc.destroyProgram(prog)


def _residual_block(rng, act):
    """x (int8 / uint8 NCHW, 32 channels) -> MaxPool -> conv 3x3 -> conv 3x3 -> Q(DQ(.) +
    DQ(pooled x)) -> conv 1x1: a QDQ ResNet block after its products' chains (the residual
    Add between per-tensor DQs and a Q, which fuse_quantized makes a QLinearAdd)."""
    info = np.iinfo(act)
    g = Graph("block")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(act)), (2, 32, 10, 10)))

    def conv(v, m, k, name):
        c = v.type.shape[1]
        wq = rng.integers(-128, 128, (m, c, k, k)).astype(np.int8)
        from dnnc.ir.ops.quantized import pack_conv_groups

        ins = [v, _const(f"{name}.za", act(5)), _const(f"{name}.w", pack_conv_groups(wq)),
               _const(f"{name}.s", wq.astype(np.int32).reshape(m, -1).sum(1, dtype=np.int32)),
               None, _const(f"{name}.sc", np.float32(1e-3)), _const(f"{name}.yz", act(5))]
        return g.add("QuantizedConvPacked", *ins, kernel_shape=[k, k], strides=[1, 1],
                     pads=[k // 2] * 4, oc=m, lo=None, hi=None)

    pooled = g.add("MaxPool", x, kernel_shape=[2, 2], strides=[1, 1])
    y = conv(conv(pooled, 32, 3, "c1"), 32, 3, "c2")
    scale, zp = _const("s", np.float32(0.05)), _const("z", act(5))
    total = g.add("Add", g.add("DequantizeLinear", y, scale, zp),
                  g.add("DequantizeLinear", pooled, scale, zp))
    g.outputs = [conv(g.add("QuantizeLinear", total, scale, zp), 16, 1, "c3")]
    return g, rng.integers(info.min, info.max + 1, (2, 32, 10, 10)).astype(act)


@pytest.mark.parametrize("act", [np.int8, np.uint8])
def test_int8_values_stay_channels_last_through_a_residual_block(act):
    """"nhwc_conv" then sink_transposes on a QDQ residual block: one Transpose in (after the
    pool: MaxPool of int8 stays NCHW before the first conv's Transpose) and one out, the
    residual's QLinearAdd (its scalar parameters of rank 0) channels-last; the graph's value
    unchanged."""
    from dnnc.ir.interpreter import run_graph
    from dnnc.passes.manager import optimize

    rng = np.random.default_rng(9)
    g, x = _residual_block(rng, act)
    want = run_graph(g, [x])[0]
    optimised = optimize(g, LAYOUTS)
    ops = _ops(optimised)
    assert ops.count("QuantizedConvNHWC") == 3 and "QuantizedConvPacked" not in ops
    assert ops.count("Transpose") == 2, ops
    assert np.array_equal(run_graph(optimised, [x])[0], want)


@pytest.mark.parametrize("n,c,h,w,k,stride,pad,act", [
    (2, 3, 17, 15, 7, 2, 3, np.uint8), (1, 3, 12, 13, 3, 2, 1, np.int8),
    (1, 2, 11, 10, 5, 3, 1, np.int8), (1, 4, 9, 9, 4, 2, 0, np.uint8)])
def test_strided_stems_run_as_a_space_to_depth(n, c, h, w, k, stride, pad, act, tmp_path):
    """A strided conv of few channels (resnet's 7x7 stride 2 stem, a 3x3 stride 2 stem, stride
    3, an even kernel without pads) becomes a stride-1 conv of its input's space to depth
    (`convert_layout._space_to_depth`: padded with the zero point, zero weights past the
    kernel): fewer 16-byte chunks a patch, bit for bit the reference on host threads, odd
    sizes padded at the end."""
    rng = np.random.default_rng(k * 10 + c)
    g, x, want = conv_graph(rng, n, c, h, w, 24, k, stride, pad, act, "int8")
    optimised, _ = programs(g, machine=LAYOUTS)
    (conv,) = [node for node in optimised.nodes if node.op == "QuantizedConvNHWC"]
    blocks = -(-k // stride)
    assert conv.attrs["strides"] == [1, 1] and conv.attrs["kernel_shape"] == [blocks] * 2
    chunks = -(-stride * stride * c // 16)
    assert conv.inputs[2].type.shape[1:] == (blocks, blocks, 16 * chunks)
    assert chunks * blocks * blocks < -(-c // 16) * k * k
    got, templates, _ = _on_host(g, x, tmp_path, machine=LAYOUTS)
    assert "cuda_int8_conv2d_nhwc" in templates
    assert np.array_equal(got, want), f"{np.sum(got != want)} of {got.size} differ"


def test_space_to_depth_only_where_patches_copy_fewer_chunks():
    """A stride-2 conv of 16 channels (3x3: 9 chunks a patch, 4 blocks of 64 channels: 16)
    and a 1x1 stride-2 one stay as they are."""
    for c, k in ((16, 3), (8, 1)):
        g, _, _ = conv_graph(np.random.default_rng(c), 1, c, 8, 8, 16, k, 2, k // 2, np.int8,
                             "int8")
        optimised, _ = programs(g, machine=LAYOUTS)
        (conv,) = [node for node in optimised.nodes if node.op == "QuantizedConvNHWC"]
        assert conv.attrs["strides"] == [2, 2]
