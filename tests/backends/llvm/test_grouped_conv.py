"""Grouped convolutions (1 < group, not depthwise) on the llvm target: each group's channel
slice a conv of its own, through the conv2d template (k x k) or the pointwise one (1x1), with
weights packed per group at opt level 2 and above (issue 14: AlexNet's group-2 convs and
ShuffleNet v1's group-3/4 1x1 convs around its channel shuffles took the default schedule).

Shapes as AlexNet's and ShuffleNet v1's layers (smaller images), strides 1 and 2, pads,
biases, a fused ReLU; each against the NumPy reference on fresh random inputs, at opt levels
0 (weights unpacked, repacked by the template) and 3 (ConvPacked)."""

from pathlib import Path

import numpy as np
import onnx
import pytest

import dnnc
from dnnc.autotune.tasks import extract
from dnnc.backends.llvm import tuning as llvm_tuning
from dnnc.backends.llvm.schedules import template_for
from dnnc.backends.lower import lower_group
from dnnc.backends.registry import REGISTRY
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.manager import optimize

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _const(rng, name, shape, scale=1.0):
    array = (rng.standard_normal(shape) * scale).astype(np.float32)
    return Value(name, T.TensorType(T.float32, shape), const=array)


def grouped_conv(rng, image, out_channels, kernel, group, stride=1, pad=0, bias=True,
                 relu=True):
    n, c, h, w = image
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, image))
    args = [x, _const(rng, "w", (out_channels, c // group, kernel, kernel), 0.3)]
    if bias:
        args.append(_const(rng, "b", (out_channels,)))
    y = g.add("Conv", *args, group=group, strides=[stride, stride], pads=[pad] * 4,
              kernel_shape=[kernel, kernel])
    g.outputs = [g.add("Relu", y) if relu else y]
    return g


def shuffle_unit(rng, channels=48, groups=3, size=10):
    """ShuffleNet v1's unit: grouped 1x1 conv, ReLU, channel shuffle (Reshape, Transpose,
    Reshape), 3x3 depthwise conv, grouped 1x1 conv, residual add, ReLU."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, channels, size, size)))
    mid = channels // 4   # a multiple of the groups
    a = g.add("Relu", g.add("Conv", x, _const(rng, "w1", (mid, channels // groups, 1, 1), 0.3),
                            _const(rng, "b1", (mid,)), group=groups))
    split = Value("split", T.TensorType(T.int64, (5,)),
                  const=np.array([1, groups, mid // groups, size, size], np.int64))
    back = Value("back", T.TensorType(T.int64, (4,)),
                 const=np.array([1, mid, size, size], np.int64))
    s = g.add("Reshape", g.add("Transpose", g.add("Reshape", a, split), perm=[0, 2, 1, 3, 4]),
              back)
    d = g.add("Conv", s, _const(rng, "wd", (mid, 1, 3, 3), 0.3), _const(rng, "bd", (mid,)),
              group=mid, pads=[1, 1, 1, 1])
    e = g.add("Conv", d, _const(rng, "w2", (channels, mid // groups, 1, 1), 0.3),
              _const(rng, "b2", (channels,)), group=groups)
    g.outputs = [g.add("Relu", g.add("Add", e, x))]
    return g


CASES = {
    # AlexNet's conv2 (5x5, pad 2), conv4 and conv5 (3x3, pad 1): group 2
    "alexnet-conv2": dict(image=(1, 96, 13, 13), out_channels=256, kernel=5, group=2, pad=2),
    "alexnet-conv4": dict(image=(1, 384, 6, 6), out_channels=384, kernel=3, group=2, pad=1),
    "alexnet-conv5-no-bias": dict(image=(1, 384, 6, 6), out_channels=256, kernel=3, group=2,
                                  pad=1, bias=False),
    # strided, a group's channels no whole vector, batch 2
    "group3-stride2": dict(image=(2, 24, 11, 9), out_channels=30, kernel=3, group=3,
                           stride=2, pad=1),
    "group4-5x5-stride2-no-relu": dict(image=(1, 16, 12, 12), out_channels=20, kernel=5,
                                       group=4, stride=2, pad=2, relu=False),
    # two filters a channel (C / group = 1, not depthwise)
    "channel-multiplier": dict(image=(1, 8, 9, 9), out_channels=16, kernel=3, group=8, pad=1),
    # ShuffleNet v1's grouped 1x1 convs (group 3; group 4 and 68 channels a group, its
    # light model's)
    "shufflenet-1x1-g3": dict(image=(1, 240, 14, 14), out_channels=60, kernel=1, group=3),
    "shufflenet-1x1-g4": dict(image=(1, 272, 7, 7), out_channels=272, kernel=1, group=4),
    "1x1-g3-stride2": dict(image=(1, 12, 9, 9), out_channels=24, kernel=1, group=3, stride=2),
}
TEMPLATE = {"shufflenet-1x1-g3": "pointwise", "shufflenet-1x1-g4": "pointwise"}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("level", [0, 3])
@pytest.mark.parametrize("blocks_outside", [False, True])
def test_grouped_conv_matches_numpy(rng, name, level, blocks_outside, monkeypatch):
    """Each loop order of the conv2d and pointwise templates (the defaults pick channel
    blocks outside only for big layers)."""
    from dnnc.backends.llvm import conv

    monkeypatch.setattr(conv, "conv2d_order",
                        lambda p, nr: "blocks" if blocks_outside else "rows")
    monkeypatch.setattr(conv, "pointwise_order", lambda p, channels, pixels:
                        "channels" if blocks_outside else "pixels")
    graph = grouped_conv(rng, **CASES[name])
    x = rng.standard_normal(CASES[name]["image"]).astype(np.float32)
    want = dnnc.compile(graph, target="numpy").run(x)[0]
    compiled = dnnc.compile(graph, target="llvm", opt_level=level)
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)
    ops = [n.op for n in compiled.graph.nodes]
    assert ops[0] == ("ConvPacked" if level >= 2 else "Conv"), ops
    assert "fma(" in compiled.runtime.source("loop")   # a template's micro-kernel


@pytest.mark.parametrize("name", CASES)
def test_grouped_conv_takes_its_template(rng, name):
    """Each case's kernel is a conv2d (k x k, or 1x1 strided) or pointwise (1x1) kernel, the
    group a problem parameter, not the default schedule."""
    graph = grouped_conv(rng, **CASES[name])
    for level in (0, 3):
        optimised = optimize(graph, REGISTRY["llvm"].target(), level)
        kernel = lower_group(optimised.nodes[:1], "k", outputs=optimised.nodes[0].outputs)
        template, problem = template_for(kernel)
        assert template.name == TEMPLATE.get(name, "conv2d")
        assert problem.group == CASES[name]["group"] and problem.grouped
        assert bool(problem.packed_nr) == (level >= 2)


def test_shuffle_unit_matches_numpy(rng):
    graph = shuffle_unit(rng)
    x = rng.standard_normal((1, 48, 10, 10)).astype(np.float32)
    want = dnnc.compile(graph, target="numpy").run(x)[0]
    for level in (0, 3):
        got = dnnc.compile(graph, target="llvm", opt_level=level).run(x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_grouped_conv_is_a_tuning_task_with_a_knob_space(rng):
    """The autotuner sees a grouped conv as a task of the conv2d template whose space it
    can enumerate (as the group-1 conv's: pixels by channel blocks of the packed width)."""
    machine = REGISTRY["llvm"].target()
    graph = optimize(grouped_conv(rng, **CASES["alexnet-conv4"]), machine, 3)
    (task,) = extract(graph, llvm_tuning)
    assert task.template.name == "conv2d" and task.problem.grouped
    space = task.template.space(task.problem, machine)
    configs = list(space.configs())
    assert len(configs) >= 16 and all(c.nr == task.problem.packed_nr for c in configs)
    assert task.template.default(task.problem, machine) in configs


@pytest.mark.parametrize("name", ["bvlc_alexnet", "shufflenet", "zfnet512"])
def test_light_models_convs_are_packed(name):
    """onnx's light models (weights made by ConstantOfShape): after the passes every conv
    but the depthwise ones reads packed constant weights, every dense op too, and nothing
    computes a weight (or an inference Dropout) at run time."""
    graph = dnnc.compiler.driver.load_graph(onnx.load(LIGHT_DIR / f"light_{name}.onnx"))
    optimised = optimize(graph, REGISTRY["llvm"].target(), 3)
    ops = [n.op for n in optimised.nodes]
    assert "ConstantOfShape" not in ops and "Dropout" not in ops and "Gemm" not in ops
    plain = [n for n in optimised.nodes if n.op == "Conv"]
    assert all(n.attrs["group"] == n.inputs[0].type.shape[1] for n in plain)   # depthwise
    # (a 3x3 conv the Winograd estimate takes reads its transformed filters, packed alike)
    assert ops.count("ConvPacked") + ops.count("ConvWinograd") >= \
        (3 if name == "shufflenet" else 5)
