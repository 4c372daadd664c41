"""The cuda depthwise convolution template (`backends/cuda/depthwise.py`), without a GPU:
kernel sizes 3, 5 and 7, strides 1 and 2, dilation, symmetric and asymmetric padding, a
bias or none, fused epilogues, one image or several, under the default config and a spread of
the knob space (tiles wider and taller than the plane, 1, 2 or 4 rows a thread): emulated on
the CPU (test_cuda_codegen's `run_on_cpu`) and, through the scheduler, rendered as CUDA C and
run on host threads (test_host_semantics' shim), against the NumPy reference; on a GPU
(`gpu` marker), compiled by NVRTC and run."""

import numpy as np
import pytest

from cuda_kernels import MACHINE, programs, reference
from test_cuda_codegen import check_configs_on_cpu, poisoned, run_on_cpu
from test_host_semantics import host_library, run_on_host
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.depthwise import DEPTHWISE, DepthwiseConfig, _shared_bytes
from dnnc.backends.lower import lower_group
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value

CASES = [
    dict(c=4, h=9, w=11, k=3, stride=1, pads=[1, 1, 1, 1], act="Relu"),
    dict(c=3, h=12, w=10, k=3, stride=2, pads=[1, 1, 1, 1], act="Clip", batch=2),
    dict(c=2, h=13, w=13, k=5, stride=2, pads=[2, 2, 2, 2], act=None, bias=False),
    dict(c=3, h=14, w=14, k=7, stride=1, pads=[3, 3, 3, 3], act=None),
    dict(c=2, h=10, w=9, k=3, stride=1, pads=[2, 2, 2, 2], dilation=2, act="Relu"),
    dict(c=2, h=8, w=7, k=3, stride=1, pads=[1, 0, 2, 1], act=None),   # asymmetric
    dict(c=2, h=40, w=37, k=3, stride=1, pads=[1, 1, 1, 1], act="Relu"),   # several tiles
]


def depthwise_graph(rng, cfg):
    batch, c = cfg.get("batch", 1), cfg["c"]
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (batch, c, cfg["h"], cfg["w"])))
    wv = (rng.standard_normal((c, 1, cfg["k"], cfg["k"])) * 0.3).astype(np.float32)
    inputs = [x, Value("w", T.TensorType(T.float32, wv.shape), const=wv)]
    if cfg.get("bias", True):
        bv = rng.standard_normal(c).astype(np.float32)
        inputs.append(Value("b", T.TensorType(T.float32, bv.shape), const=bv))
    out = g.add("Conv", *inputs, group=c, pads=cfg["pads"], strides=[cfg["stride"]] * 2,
                dilations=[cfg.get("dilation", 1)] * 2)
    if cfg["act"] == "Relu":
        out = g.add("Relu", out)
    elif cfg["act"] == "Clip":
        lo, hi = (Value(n, T.TensorType(T.float32, ()), const=np.array(v, np.float32))
                  for n, v in (("lo", 0.0), ("hi", 6.0)))
        out = g.add("Clip", out, lo, hi)
    g.outputs = [out]
    xs = rng.standard_normal((batch, c, cfg["h"], cfg["w"])).astype(np.float32)
    return g, out, xs


@pytest.mark.parametrize("cfg", CASES)
def test_depthwise_configs_are_correct(rng, cfg):
    g, out, xs = depthwise_graph(rng, cfg)
    kernel = lower_group(list(g.nodes), "k", outputs=[out])
    problem = DEPTHWISE.problem(kernel)
    assert problem is not None and DEPTHWISE.applies(problem)
    want = reference(g, {"x": xs})[out.name]
    space = DEPTHWISE.space(problem, MACHINE)
    configs = [DEPTHWISE.default(problem, MACHINE)] + space.sample(np.random.default_rng(3), 5)
    configs += [c for c in (DepthwiseConfig(64, 1, 1), DepthwiseConfig(8, 32, 4),
                            DepthwiseConfig(16, 4, 2)) if space.check(c) is c]
    check_configs_on_cpu(DEPTHWISE, problem, kernel, configs, xs, want)


@pytest.mark.parametrize("cfg", [CASES[1], CASES[3]])
def test_depthwise_is_scheduled_and_runs_on_host_threads(rng, cfg, tmp_path):
    g, out, xs = depthwise_graph(rng, cfg)
    graph, progs = programs(g)
    values = reference(graph, {"x": xs})
    (program,) = progs
    assert [k.schedule[0] for k in program.kernels] == ["cuda_depthwise"]
    module = render_module(program.unique)
    lib = host_library(program.unique, tmp_path, module)
    assert run_on_host(lib, module, program, values) == []


@pytest.mark.parametrize("shape", [(32, 96, 56, 56, 7, 1), (32, 768, 7, 7, 7, 1),
                                   (1, 32, 112, 112, 3, 1), (8, 144, 56, 56, 3, 2),
                                   (1, 960, 7, 7, 5, 1), (128, 240, 28, 28, 5, 2)])
def test_default_config_fits_the_real_layers(rng, shape):
    """ConvNeXt's, MobileNetV2's and EfficientNet's depthwise layers: the default is in the
    space (32 to 1024 threads, shared memory within 48 KiB) and covers the plane."""
    n, c, h, w, k, s = shape
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (n, c, h, w)))
    wv = np.ones((c, 1, k, k), np.float32)
    out = g.add("Conv", x, Value("w", T.TensorType(T.float32, wv.shape), const=wv), group=c,
                pads=[k // 2] * 4, strides=[s, s])
    g.outputs = [out]
    problem = DEPTHWISE.problem(lower_group(list(g.nodes), "k", outputs=[out]))
    config = DEPTHWISE.default(problem, MACHINE)
    assert DEPTHWISE.space(problem, MACHINE).check(config) == config
    assert _shared_bytes(problem, config) <= 48 * 1024


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CASES)
def test_depthwise_on_gpu(rng, cfg):
    import dnnc

    g, out, xs = depthwise_graph(rng, cfg)
    want = reference(g, {"x": xs})[out.name]
    got = dnnc.compile(g, target="cuda", outputs="numpy").run(xs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [T.float16, T.bfloat16])
def test_depthwise_reads_and_writes_16_bit_storage(rng, dtype):
    """An image, weights, bias and output stored in float16 / bfloat16 (`store_half`, half
    ONNX files): widened to fp32 on their way into shared memory, summed in fp32, rounded
    once on the store; against the fp32 sum of the same 16-bit values."""
    c, h, w, k = 3, 12, 11, 3
    np_type = np.dtype(dtype.np)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, (2, c, h, w)))
    wv = (rng.standard_normal((c, 1, k, k)) * 0.3).astype(np_type)
    bv = rng.standard_normal(c).astype(np_type)
    out = g.add("Conv", x, Value("w", T.TensorType(dtype, wv.shape), const=wv),
                Value("b", T.TensorType(dtype, bv.shape), const=bv), group=c,
                pads=[1, 1, 1, 1])
    g.outputs = [out]
    kernel = lower_group(list(g.nodes), "k", outputs=[out])
    problem = DEPTHWISE.problem(kernel)
    assert problem is not None and DEPTHWISE.applies(problem)
    xs = rng.standard_normal((2, c, h, w)).astype(np_type)
    # the fp32 reference on the same 16-bit values
    wide = Graph("wide")
    xw = wide.add_input("x", T.TensorType(T.float32, (2, c, h, w)))
    ow = wide.add("Conv", xw, Value("w", T.TensorType(T.float32, wv.shape),
                                    const=wv.astype(np.float32)),
                  Value("b", T.TensorType(T.float32, bv.shape), const=bv.astype(np.float32)),
                  group=c, pads=[1, 1, 1, 1])
    wide.outputs = [ow]
    want = reference(wide, {"x": xs.astype(np.float32)})[ow.name]
    func = DEPTHWISE.build(problem, DEPTHWISE.default(problem, MACHINE), MACHINE)
    L.verify(func)
    ins = [xs if v.const is None else np.ascontiguousarray(v.const) for v in kernel.inputs]
    arrays = {func.name: ins + [poisoned(np_type, want.shape)]}
    run_on_cpu([func], arrays)
    got = arrays[func.name][-1].astype(np.float32)
    unit = 2.0 ** -11 if dtype is T.float16 else 2.0 ** -8
    np.testing.assert_allclose(got, want, rtol=unit, atol=1e-6)
