"""The llvm depthwise template's three schedules, by rows, flat (stride 1: blocks of the
flattened padded plane crossing rows) and by channels (a vector of channels a step, their
planes interleaved), against the NumPy reference: odd and even planes, 3x3 and 5x5, padded
and not, rows narrower and wider than a vector, channel counts below, at and past a vector's
lanes, strided and dilated, with bias and a fused residual Add + Relu, at 1 and 2 threads, by
rows one to four output rows a block (a plane's last block fewer); the
default takes channels for rows of CHANNELS_MAX_WIDTH (7) or fewer at stride 1, flat for other
narrow rows, and neither at a stride or dilation (the space's constraints)."""

import dataclasses

import numpy as np
import pytest

from dnnc.backends.llvm import depthwise
from dnnc.backends.llvm.entry import runtime
from dnnc.backends.registry import REGISTRY
from dnnc.compiler.module import CompiledModel
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.manager import optimize


def depthwise_graph(rng, c, h, w, k, pads, strides=1, dilations=1, bias=True, residual=False):
    """Depthwise Conv (+ bias) (+ residual Add) -> Relu on an N=2 image."""
    g = Graph("dw")
    x = g.add_input("x", T.TensorType(T.float32, (2, c, h, w)))
    weights = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    inputs = [x, Value("w", T.TensorType(T.float32, weights.shape), const=weights)]
    if bias:
        b = rng.standard_normal(c).astype(np.float32)
        inputs.append(Value("b", T.TensorType(T.float32, b.shape), const=b))
    y = g.add("Conv", *inputs, group=c, pads=[pads] * 4, kernel_shape=[k, k],
              strides=[strides] * 2, dilations=[dilations] * 2)
    if residual:
        y = g.add("Add", y, g.add_input("r", T.TensorType(T.float32, y.type.shape)))
    g.outputs = [g.add("Relu", y)]
    return g


def compiled(graph: Graph, threads: int) -> CompiledModel:
    target = dataclasses.replace(REGISTRY["llvm"].target(), threads=threads)
    graph = optimize(graph, target)
    return CompiledModel(graph, runtime(graph, 3, target), "llvm")


def reference(graph: Graph, feeds) -> np.ndarray:
    model = CompiledModel(graph, REGISTRY["numpy"].runtime(graph, 0, REGISTRY["numpy"].target()),
                          "numpy")
    return model.run(*feeds)[0]


CASES = [   # (channels, height, width, kernel, pads, bias, residual)
    (5, 7, 7, 5, 2, True, False),      # efficientnet's 5x5 on a 7x7 plane
    (6, 14, 14, 3, 1, True, True),     # a fused residual
    (3, 9, 13, 3, 0, False, False),    # unpadded, odd sizes, no bias
    (4, 11, 40, 5, 2, True, False),    # rows of 40: by rows
    (2, 1, 1, 5, 2, True, False),      # one pixel
]


ROW_CASES = [   # (channels, height, width, kernel, pads, strides, dilations, bias, residual)
    (6, 14, 14, 3, 1, 1, 1, True, True),     # 14 rows: 3 blocks of 4 and one of 2, a residual
    (3, 9, 40, 5, 2, 1, 1, True, False),     # rows of 40 (2 vectors + 8), 9 rows
    (4, 15, 15, 3, 1, 2, 1, True, False),    # stride 2: 8 output rows
    (5, 17, 23, 5, 2, 2, 1, False, False),   # 5x5 stride 2, odd sizes, no bias
    (4, 13, 13, 3, 2, 1, 2, True, True),     # dilation 2
    (2, 3, 5, 3, 0, 1, 1, True, False),      # one output row, fewer than a block's
]


@pytest.mark.parametrize("case", ROW_CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}k{c[3]}s{c[5]}d{c[6]}" for c in ROW_CASES])
@pytest.mark.parametrize("rows", depthwise.ROW_BLOCKS)
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_rows_at_a_time_match_the_reference(rng, monkeypatch, case, rows, threads):
    c, h, w, k, pads, strides, dilations, bias, residual = case
    monkeypatch.setattr(depthwise, "FLAT_MAX_WIDTH", 0)
    monkeypatch.setattr(depthwise, "CHANNELS_MAX_WIDTH", 0)
    monkeypatch.setattr(depthwise, "DEFAULT_ROWS", rows)
    graph = depthwise_graph(rng, c, h, w, k, pads, strides, dilations, bias=bias,
                            residual=residual)
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    model = compiled(graph, threads)
    source = model.runtime.source("loop")
    oh = graph.outputs[0].type.shape[2]
    blocks = oh // min(rows, oh)
    assert blocks == 1 or f"for rb in range({blocks})" in source   # (a loop of 1 is folded)
    np.testing.assert_allclose(model.run(*feeds)[0], reference(graph, feeds), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}k{c[3]}" for c in CASES])
@pytest.mark.parametrize("flat_width", [0, 1 << 20])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_by_rows_and_flat_match_the_reference(rng, monkeypatch, case, flat_width,
                                                        threads):
    c, h, w, k, pads, bias, residual = case
    monkeypatch.setattr(depthwise, "FLAT_MAX_WIDTH", flat_width)
    monkeypatch.setattr(depthwise, "CHANNELS_MAX_WIDTH", 0)
    graph = depthwise_graph(rng, c, h, w, k, pads, bias=bias, residual=residual)
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    model = compiled(graph, threads)
    assert ("yplane" in model.runtime.source("loop")) == bool(flat_width)
    np.testing.assert_allclose(model.run(*feeds)[0], reference(graph, feeds), rtol=1e-5,
                               atol=1e-5)


CHANNEL_CASES = [   # (channels, height, width, kernel, pads, strides, dilations, bias, residual)
    (5, 7, 7, 5, 2, 1, 1, True, False),      # fewer channels than lanes: the narrow block only
    (20, 7, 7, 3, 1, 1, 1, True, True),      # a whole block and a narrow one, a residual
    (32, 9, 13, 3, 0, 1, 1, False, False),   # whole blocks only, unpadded, odd sizes, no bias
    (18, 14, 14, 5, 2, 2, 1, True, False),   # stride 2
    (17, 11, 11, 3, 2, 1, 2, True, True),    # dilation 2
    (3, 1, 1, 5, 2, 1, 1, True, False),      # one pixel
    (16, 10, 30, 3, 1, 1, 1, True, False),   # rows of 30: two blocks of 15 pixels
]


@pytest.mark.parametrize("case", CHANNEL_CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}k{c[3]}s{c[5]}d{c[6]}"
                              for c in CHANNEL_CASES])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_by_channels_matches_the_reference(rng, monkeypatch, case, threads):
    c, h, w, k, pads, strides, dilations, bias, residual = case
    monkeypatch.setattr(depthwise, "_channels_default",
                        lambda p, lanes: depthwise._channels_fit(p, lanes))
    graph = depthwise_graph(rng, c, h, w, k, pads, strides, dilations, bias=bias,
                            residual=residual)
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    model = compiled(graph, threads)
    assert "xlanes" in model.runtime.source("loop")
    np.testing.assert_allclose(model.run(*feeds)[0], reference(graph, feeds), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("channels_width", [0, 7])
def test_the_default_runs_narrow_rows_flat_and_strided_ones_by_rows(rng, monkeypatch,
                                                                   channels_width):
    monkeypatch.setattr(depthwise, "CHANNELS_MAX_WIDTH", channels_width)
    narrow = "channels" if channels_width else None
    for (h, w, k, strides, dilations), kind in [
            ((7, 7, 5, 1, 1), narrow or "flat"), ((7, 7, 3, 1, 1), narrow or "rows"),
            ((14, 14, 3, 1, 1), "flat"), ((14, 14, 5, 1, 1), "flat"), ((56, 56, 3, 1, 1), "rows"),
            ((14, 14, 3, 2, 1), "rows"), ((14, 14, 3, 1, 2), "rows"), ((7, 7, 3, 1, 2), "rows")]:
        graph = depthwise_graph(rng, 4, h, w, k, dilations * (k // 2), strides, dilations)
        source = compiled(graph, 1).runtime.source("loop")
        got = "channels" if "xlanes" in source else "flat" if "yplane" in source else "rows"
        assert got == kind, (h, k, strides, dilations)

