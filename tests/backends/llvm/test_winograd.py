"""Winograd F(2x2, 3x3) on llvm (issue 32, item 4): the filters transformed at compile time
(convert_layout's "winograd_conv", ConvWinograd) and back exactly; which convs its rule takes
(on by default: the llvm target lists it); the template against the NumPy reference (float64)
on odd and even images, padded and not, a partial channel block, with and without bias, with
a fused residual epilogue, at 1 and 2 threads, its error no worse than the direct conv's
(small shapes: the rule's thresholds lowered so the template takes them)."""

import dataclasses

import numpy as np
import pytest

from dnnc.backends.llvm.entry import runtime
from dnnc.backends.registry import REGISTRY
from dnnc.compiler.module import CompiledModel
from dnnc.ir import types as T
from dnnc.ir.flops import node_flops
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.conv import conv
from dnnc.ir.ops.packed import conv_winograd, winograd_filters, winograd_weights
from dnnc.passes import convert_layout
from dnnc.passes.convert_layout import winograd_applies
from dnnc.passes.manager import optimize


def _const(array) -> Value:
    return Value("w", T.TensorType(T.float32, array.shape), const=array)


def conv_graph(rng, c, m, h, wid, pads=1, bias=True, residual=False) -> tuple[Graph, dict]:
    """Conv 3x3 (+ bias) -> (+ residual) -> Relu on an N=2 image; the graph and its float64
    weights."""
    g = Graph("conv")
    x = g.add_input("x", T.TensorType(T.float32, (2, c, h, wid)))
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    inputs = [x, _const(w)] + ([Value("b", T.TensorType(T.float32, (m,)), const=b)]
                               if bias else [])
    y = g.add("Conv", *inputs, pads=[pads] * 4, kernel_shape=[3, 3])
    if residual:
        r = g.add_input("r", T.TensorType(T.float32, y.type.shape))
        y = g.add("Add", y, r)
    g.outputs = [g.add("Relu", y)]
    return g, {"w": w, "b": b, "pads": pads}


def compiled(graph: Graph, winograd: bool, threads: int | None = None) -> CompiledModel:
    """`graph` compiled for this host's llvm target, "winograd_conv" in its layouts or not."""
    target = REGISTRY["llvm"].target()
    if not winograd:
        layouts = tuple(name for name in target.layouts if name != "winograd_conv")
        target = dataclasses.replace(target, layouts=layouts)
    if threads:
        target = dataclasses.replace(target, threads=threads)
    graph = optimize(graph, target)
    return CompiledModel(graph, runtime(graph, 3, target), "llvm")


def reference(feeds: list, params: dict) -> np.ndarray:
    x = feeds[0].astype(np.float64)
    b = None if params["b"] is None else params["b"].astype(np.float64)
    y = conv(x, params["w"].astype(np.float64), b, pads=[params["pads"]] * 4)
    if len(feeds) > 1:
        y = y + feeds[1]
    return np.maximum(y, 0)


def test_the_filters_are_transformed_and_back_exactly_enough(rng):
    w = rng.standard_normal((40, 8, 3, 3)).astype(np.float32)
    u = winograd_weights(w, 32)
    assert u.shape == (16, 2, 8, 32) and not u[:, 1, :, 8:].any()   # zero past channel 40
    np.testing.assert_allclose(winograd_filters(u, 40), w, rtol=0, atol=1e-6)
    x = rng.standard_normal((1, 8, 9, 7)).astype(np.float32)
    attrs = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": [3, 3],
             "pads": [1, 0, 1, 2], "strides": None}
    np.testing.assert_allclose(conv_winograd(x, u, oc=40, **attrs), conv(x, w, **attrs),
                               rtol=1e-5, atol=1e-5)


def _node(rng, c=64, m=64, k=3, side=14, **attrs):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, c, side, side)))
    w = rng.standard_normal((m, c // attrs.get("group", 1), k, k)).astype(np.float32)
    g.add("Conv", x, _const(w), **attrs)
    return g.nodes[0]


def test_winograd_takes_3x3_stride_1_convs_of_enough_channels_and_pixels(rng):
    same = {"pads": [1, 1, 1, 1]}
    assert winograd_applies(_node(rng, **same))
    assert not winograd_applies(_node(rng, strides=[2, 2], **same))
    assert not winograd_applies(_node(rng, dilations=[2, 2], pads=[2, 2, 2, 2]))
    assert not winograd_applies(_node(rng, k=1))
    assert not winograd_applies(_node(rng, group=2, **same))
    assert not winograd_applies(_node(rng, c=32, **same))      # few channels: direct
    assert not winograd_applies(_node(rng, m=32, **same))
    assert not winograd_applies(_node(rng, side=7, **same))    # a 7x7 output: direct
    assert not winograd_applies(_node(rng))                    # unpadded: 12x12 out


@pytest.fixture
def small_shapes(monkeypatch):
    """The rule's thresholds lowered: the template takes the small test convs."""
    monkeypatch.setattr(convert_layout, "WINOGRAD_MIN_CHANNELS", 16)
    monkeypatch.setattr(convert_layout, "WINOGRAD_MIN_SIDE", 1)


CASES = [   # (input channels, output channels, height, width, pads, bias, residual)
    (16, 32, 8, 8, 1, True, False),
    (32, 48, 9, 13, 1, True, True),     # odd sizes: partial tiles; 48 = a block and a half
    (24, 16, 11, 10, 0, False, False),  # unpadded (9 x 8 out), no bias
    (64, 64, 15, 15, 1, True, True),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}@{c[2]}x{c[3]}" for c in CASES])
@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_matches_the_reference_as_well_as_direct_conv(rng, case, threads,
                                                               small_shapes):
    c, m, h, wid, pads, bias, residual = case
    graph, params = conv_graph(rng, c, m, h, wid, pads, bias, residual)
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    want = reference(feeds, params)
    ours = compiled(graph, True, threads)
    assert [n.op for n in ours.graph.nodes][0] == "ConvWinograd"
    direct = compiled(graph, False, threads)
    assert [n.op for n in direct.graph.nodes][0] == "ConvPacked"
    scale = np.abs(want).max()
    err = np.abs(ours.run(*feeds)[0] - want).max() / scale
    err_direct = np.abs(direct.run(*feeds)[0] - want).max() / scale
    assert err <= max(2 * err_direct, 2e-7), (err, err_direct)


def test_the_llvm_target_takes_winograd_where_its_rule_does(rng):
    layouts = REGISTRY["llvm"].target().layouts
    assert layouts.index("winograd_conv") < layouts.index("pack_conv")
    graph, params = conv_graph(rng, 64, 72, 14, 15)   # 72 channels: a partial block
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    model = compiled(graph, True)
    assert [n.op for n in model.graph.nodes][0] == "ConvWinograd"
    want = reference(feeds, params)
    assert np.abs(model.run(*feeds)[0] - want).max() <= 1e-6 * np.abs(want).max()
    graph, _ = conv_graph(rng, 64, 64, 7, 7)
    assert [n.op for n in compiled(graph, True).graph.nodes][0] == "ConvPacked"


def test_a_winograd_conv_counts_as_the_conv_it_replaces(rng):
    """FLOPs (`dnnc inspect`, profiles) are the direct conv's, whatever computes them."""
    graph, _ = conv_graph(rng, 64, 64, 14, 14)
    want = node_flops(graph.nodes[0])
    (node,) = [n for n in compiled(graph, True).graph.nodes if n.op == "ConvWinograd"]
    assert want.value and node_flops(node) == want
