"""Winograd F(m x m, 3x3) on llvm (issue 32, item 4): the generated transforms compute a
correlation exactly (in fractions); the filters transformed at compile time (convert_layout's
"winograd_conv", ConvWinograd) and back exactly; which convs it takes and which tile the cost
estimate picks (on by default: the llvm target lists it); the template at tiles 2, 4 and 6
against the NumPy reference (float64) on odd and even images, padded and not, a partial channel
block, with and without bias, with a fused residual epilogue, at 1 and 2 threads, its error
within its documented factor of the direct conv's (the tile forced on the small test convs).
At precision bf16 (transformed patches and filters in bf16 pairs): the NumPy reference is the
algorithm (exact where no rounding happens), the kernel equals it, its error within its factor
of the bf16 direct conv's, and the estimate never picks F(4x4)."""

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

from dnnc.backends.llvm import winograd as winograd_template
from dnnc.backends.llvm.entry import runtime
from dnnc.backends.registry import REGISTRY
from dnnc.compiler.module import CompiledModel
from dnnc.ir import types as T
from dnnc.ir.flops import node_flops
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.conv import conv
from dnnc.ir.ops.winograd import (POINTS, conv_winograd, winograd, winograd_bf16,
                                  winograd_filters, winograd_weights)
from dnnc.passes import convert_layout
from dnnc.passes.conv_costs import conv3x3_costs
from dnnc.passes.convert_layout import winograd_applies, winograd_tile
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


ESTIMATE_THREADS = 2
"""The threads the tile choices asserted here are for: the estimate weighs how a layer's
tiles spread over the target's threads (on the 16-thread AMX host a 28x28 layer's 49 F(4x4)
tiles take F(2x2)'s 196 instead), so these tests fix them rather than take the host's."""


def host_target(precision: str = "fp32", threads: int = ESTIMATE_THREADS,
                fma_ports: int | None = None):
    """This host's llvm target at `precision` with `threads` threads (and `fma_ports` where
    given: else the host's measured rate)."""
    target = dataclasses.replace(REGISTRY["llvm"].target(), precision=precision, threads=threads)
    return target if fma_ports is None else dataclasses.replace(target, fma_ports=fma_ports)


def compiled(graph: Graph, winograd: bool, threads: int | None = None,
             precision: str = "fp32") -> CompiledModel:
    """`graph` compiled for this host's llvm target at `precision` (`threads`, default
    ESTIMATE_THREADS), "winograd_conv" in its layouts or not."""
    target = host_target(precision, threads or ESTIMATE_THREADS)
    if not winograd:
        layouts = tuple(name for name in target.layouts if name != "winograd_conv")
        target = dataclasses.replace(target, layouts=layouts)
    graph = optimize(graph, target)
    return CompiledModel(graph, runtime(graph, 3, target), "llvm")


def reference(feeds: list, params: dict) -> np.ndarray:
    x = feeds[0].astype(np.float64)
    b = None if params["b"] is None else params["b"].astype(np.float64)
    y = conv(x, params["w"].astype(np.float64), b, pads=[params["pads"]] * 4)
    if len(feeds) > 1:
        y = y + feeds[1]
    return np.maximum(y, 0)


@pytest.mark.parametrize("m", sorted(POINTS))
def test_the_generated_transforms_compute_a_correlation_exactly(m):
    """A^T [(G g) . (B^T d)] = the correlation of d with g, in exact fractions, for every
    integer d and g of a few seeded draws; G' G = I; B^T and A^T hold no denominators but
    powers of two (so the template's float arithmetic scales exactly)."""
    w = winograd(m)
    rng = np.random.default_rng(m)
    for _ in range(5):
        d = [Fraction(int(v)) for v in rng.integers(-9, 10, m + 2)]
        g = [Fraction(int(v)) for v in rng.integers(-9, 10, 3)]
        gg = [sum(r * v for r, v in zip(row, g)) for row in w.g]
        bd = [sum(r * v for r, v in zip(row, d)) for row in w.bt]
        y = [sum(a * u * v for a, u, v in zip(row, gg, bd)) for row in w.at]
        assert y == [sum(g[k] * d[j + k] for k in range(3)) for j in range(m)]
    eye = [[sum(a * b for a, b in zip(row, col)) for col in zip(*w.g)] for row in w.g_inverse]
    assert eye == [[int(i == j) for j in range(3)] for i in range(3)]
    for row in w.bt + w.at:
        for v in row:
            assert v.denominator & (v.denominator - 1) == 0


@pytest.mark.parametrize("m", sorted(POINTS))
def test_the_filters_are_transformed_and_back_exactly_enough(rng, m):
    w = rng.standard_normal((40, 8, 3, 3)).astype(np.float32)
    u = winograd_weights(w, 32, m)
    assert u.shape == ((m + 2) ** 2, 2, 8, 32) and not u[:, 1, :, 8:].any()   # zero past 40
    np.testing.assert_allclose(winograd_filters(u, 40), w, rtol=0, atol=1e-5)
    x = rng.standard_normal((1, 8, 9, 7)).astype(np.float32)
    attrs = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": [3, 3],
             "pads": [1, 0, 1, 2], "strides": None}
    np.testing.assert_allclose(conv_winograd(x, u, oc=40, **attrs), conv(x, w, **attrs),
                               rtol=1e-4, atol=1e-4)


def _node(rng, c=64, m=64, k=3, side=14, batch=1, **attrs):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (batch, c, side, side)))
    w = rng.standard_normal((m, c // attrs.get("group", 1), k, k)).astype(np.float32)
    g.add("Conv", x, _const(w), **attrs)
    return g.nodes[0]


def test_winograd_takes_3x3_stride_1_one_group_convs(rng):
    same = {"pads": [1, 1, 1, 1]}
    assert winograd_applies(_node(rng, **same))
    assert winograd_applies(_node(rng))                        # unpadded: 12x12 out
    assert winograd_applies(_node(rng, batch="N", **same))     # a symbolic batch
    assert not winograd_applies(_node(rng, strides=[2, 2], **same))
    assert not winograd_applies(_node(rng, dilations=[2, 2], pads=[2, 2, 2, 2]))
    assert not winograd_applies(_node(rng, k=1))
    assert not winograd_applies(_node(rng, group=2, **same))


def test_the_cost_estimate_picks_the_tile_per_layer(rng):
    """Few channels stay direct (the transforms cost what the products save); the largest
    tile the wide layers; a 14x14 output F(2x2) (F(4x4)'s filters past L2); a 7x7 output
    direct (Winograd's larger weights from memory cost what its products save); never
    F(6x6) (its error). On cores with two full-width FMA pipes, where the constants were
    fitted (Zen 5); with one (Zen 4's AVX-512) the direct conv costs twice: test_fma_rate.py."""
    target = host_target(fma_ports=2)
    same = {"pads": [1, 1, 1, 1]}
    assert winograd_tile(_node(rng, c=16, m=16, side=56, **same), target) is None
    assert winograd_tile(_node(rng, c=128, m=128, side=28, **same), target) == 4
    assert winograd_tile(_node(rng, c=128, m=128, side=28, batch="N", **same), target) == 4
    assert winograd_tile(_node(rng, c=256, m=256, side=14, **same), target) == 2
    assert winograd_tile(_node(rng, c=512, m=512, side=7, **same), target) is None
    costs = conv3x3_costs(1, 256, 256, 14, 14, 32, 512, 1)
    assert set(costs) == {None, 2, 4} and min(costs, key=costs.get) is not None


@pytest.fixture
def force_tile(monkeypatch):
    """Winograd F(m x m) on every conv it applies to, whatever the cost estimate says."""
    def force(m):
        monkeypatch.setattr(convert_layout, "winograd_tile", lambda node, target: m)
    return force


@pytest.fixture
def force_fused(monkeypatch):
    """`WinogradConfig.fused` (one loop of tile blocks) on, or off, whatever the default's
    rule says."""
    def force(fused):
        monkeypatch.setattr(winograd_template, "fused_by_default", lambda *args: fused)
    return force


CASES = [   # (input channels, output channels, height, width, pads, bias, residual)
    (16, 32, 8, 8, 1, True, False),
    (32, 48, 9, 13, 1, True, True),     # odd sizes: partial tiles; 48 = a block and a half
    (24, 16, 11, 10, 0, False, False),  # unpadded (9 x 8 out), no bias
    (64, 64, 15, 15, 1, True, True),
]

CASE_THREADS = [(CASES[0], 1)] + [(case, 2) for case in CASES]
"""Every case on 2 threads (blocks split between the threads), the first also on one: each
tile and loop form meets both schedules, and the parallel one every shape (the big cases on
one thread too took a third of this module's time, the largest share of CI's)."""
CASE_IDS = [f"{c[0]}x{c[1]}@{c[2]}x{c[3]}-{t}" for (c, t) in CASE_THREADS]

ERROR_FACTOR = {2: 2, 4: 8, 6: 400}
"""Each tile's error at most this many times the direct conv's (docs/llvm_backend.md,
"Winograd convolutions": F(2x2) measured below it, F(4x4) ~2-4x, F(6x6) ~100x)."""


@pytest.mark.parametrize("case, threads", CASE_THREADS, ids=CASE_IDS)
@pytest.mark.parametrize("m, fused", [(m, fused) for m in sorted(POINTS)
                                      for fused in ((False, True) if m < 6 else (False,))],
                         ids=lambda v: {False: "two_loops", True: "fused"}.get(v, str(v))
                         if isinstance(v, bool) else str(v))
def test_winograd_matches_the_reference_as_well_as_direct_conv(rng, case, threads, m, fused,
                                                               force_tile, force_fused):
    c, oc, h, wid, pads, bias, residual = case
    graph, params = conv_graph(rng, c, oc, h, wid, pads, bias, residual)
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    want = reference(feeds, params)
    force_tile(m)
    force_fused(fused)
    ours = compiled(graph, True, threads)
    (node,) = [n for n in ours.graph.nodes if n.op == "ConvWinograd"]
    assert node.inputs[1].shape[0] == (m + 2) ** 2
    direct = compiled(graph, False, threads)
    assert [n.op for n in direct.graph.nodes][0] == "ConvPacked"
    scale = np.abs(want).max()
    err = np.abs(ours.run(*feeds)[0] - want).max() / scale
    err_direct = np.abs(direct.run(*feeds)[0] - want).max() / scale
    assert err <= ERROR_FACTOR[m] * max(err_direct, 1e-7), (err, err_direct)


def test_the_llvm_target_takes_winograd_where_the_estimate_picks_it(rng):
    layouts = REGISTRY["llvm"].target().layouts
    assert layouts.index("winograd_conv") < layouts.index("pack_conv")
    graph, params = conv_graph(rng, 64, 72, 28, 29)   # 72 channels: a partial block
    tile = winograd_tile(graph.nodes[0], host_target())
    assert tile == 4
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    model = compiled(graph, True)
    (node,) = [n for n in model.graph.nodes if n.op == "ConvWinograd"]
    assert node.inputs[1].shape[0] == 36
    want = reference(feeds, params)
    assert np.abs(model.run(*feeds)[0] - want).max() <= 1e-5 * np.abs(want).max()
    graph, _ = conv_graph(rng, 3, 16, 28, 28)           # few channels: direct
    assert [n.op for n in compiled(graph, True).graph.nodes][0] == "ConvPacked"


def test_a_winograd_conv_counts_as_the_conv_it_replaces(rng):
    """FLOPs (`dnnc inspect`, profiles) are the direct conv's, whatever computes them."""
    graph, _ = conv_graph(rng, 64, 64, 14, 14)
    want = node_flops(graph.nodes[0])
    (node,) = [n for n in compiled(graph, True).graph.nodes if n.op == "ConvWinograd"]
    assert want.value and node_flops(node) == want


ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": [3, 3],
         "strides": None}


def test_the_bf16_reference_is_the_algorithm(rng):
    """Small integers stay exact through F(2x2)'s transforms (coefficients 0, +-1; U in
    quarters) and bf16: the reference then equals the direct conv exactly, on odd sizes,
    odd channels and uneven pads; the pairs unpack to the fp32 filters."""
    w = rng.integers(-3, 4, (40, 7, 3, 3)).astype(np.float32)
    u = winograd_weights(w, 32, 2, pairs=True)
    assert u.dtype == T.bfloat16.np and u.shape == (16, 2, 4, 32, 2)
    assert not u[:, :, 3, :, 1].astype(np.float32).any()          # the 8th channel: zero
    np.testing.assert_array_equal(winograd_filters(u, 40, 7), w)
    x = rng.integers(-4, 5, (2, 7, 9, 8)).astype(np.float32)
    b = rng.integers(-4, 5, 40).astype(np.float32)
    pads = [1, 0, 1, 2]
    np.testing.assert_array_equal(winograd_bf16(x, u, b, 40, pads),
                                  conv(x, w, b, pads=pads, **ATTRS))
    got = conv_winograd(x, u, b, oc=40, precision="bf16", pads=pads, **ATTRS)
    np.testing.assert_array_equal(got, conv(x, w, b, pads=pads, **ATTRS))


BF16_ERROR_FACTOR = 3
"""F(2x2) at bf16: its error at most this many times the bf16 direct conv's (measured 1.3-1.9x
on these cases)."""


@pytest.mark.parametrize("case, threads", CASE_THREADS, ids=CASE_IDS)
@pytest.mark.parametrize("fused", [False, True], ids=["two_loops", "fused"])
def test_bf16_winograd_matches_its_reference_and_the_conv(rng, case, threads, fused, force_tile,
                                                          force_fused):
    c, oc, h, wid, pads, bias, residual = case
    c += 1   # an odd count of channels: the last pair's high half zero
    graph, params = conv_graph(rng, c, oc, h, wid, pads, bias, residual)
    feeds = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    force_tile(2)
    force_fused(fused)
    ours = compiled(graph, True, threads, "bf16")
    (node,) = [n for n in ours.graph.nodes if n.op == "ConvWinograd"]
    assert node.attrs["precision"] == "bf16" and node.inputs[1].type.dtype is T.bfloat16
    got = ours.run(*feeds)[0]
    # the kernel computes its op's meaning: sums in another order, a rare patch rounded the
    # other way (fp32 transforms against float64's)
    conv_out = conv_winograd(feeds[0], node.inputs[1].const, params["b"], **node.attrs)
    mine = np.maximum(conv_out + (feeds[1] if residual else 0), 0)
    want = reference(feeds, params)
    scale = np.abs(want).max()
    assert np.abs(got - mine).max() <= 2 ** -8 * scale
    direct = compiled(graph, False, threads, "bf16")
    assert [n.op for n in direct.graph.nodes][0] == "ConvPacked"
    err = np.abs(got - want).max() / scale
    err_direct = np.abs(direct.run(*feeds)[0] - want).max() / scale
    assert err <= BF16_ERROR_FACTOR * err_direct, (err, err_direct)


def test_at_bf16_the_estimate_weighs_f2x2_against_the_bf16_direct_conv(rng):
    target = host_target("bf16", fma_ports=2)
    same = {"pads": [1, 1, 1, 1]}
    assert winograd_tile(_node(rng, c=128, m=128, side=28, **same), target) == 2
    assert winograd_tile(_node(rng, c=512, m=512, side=7, **same), target) is None
    # one full-width vdpbf16ps a cycle (Zen 4): F(2x2) at 7x7 too (resnet18 at bf16 with it
    # there measured 15.07 ms against 15.92 direct, docs/llvm_backend.md)
    half_rate = dataclasses.replace(target, fma_ports=1)
    assert winograd_tile(_node(rng, c=512, m=512, side=7, **same), half_rate) == 2
    for c, side in ((64, 56), (128, 28), (256, 14), (512, 7)):
        assert set(conv3x3_costs(1, c, c, side, side, 32, 512, 1, "bf16")) == {None, 2}
    graph, _ = conv_graph(rng, 64, 64, 28, 28)
    (node,) = [n for n in compiled(graph, True, precision="bf16").graph.nodes
               if n.op.startswith("Conv")]
    assert node.op == "ConvWinograd" and node.inputs[1].shape == (16, 2, 32, 32, 2)


def test_no_winograd_where_the_bf16_products_run_on_amx_tiles():
    """amx_conv takes the 3x3 convs on a CPU with AMX-BF16 (its tiles, not vdpbf16ps); fp32
    keeps Winograd there."""
    spec = REGISTRY["llvm"]
    host = spec.target()   # its own AMX features left out (the AMX host has them)
    host = dataclasses.replace(host, features=",".join(
        f for f in host.features.split(",") if not f[1:].startswith("amx-")))
    amx_host = dataclasses.replace(host, features=host.features + ",+amx-tile,+amx-bf16")
    assert "winograd_conv" not in spec.target(amx_host, "bf16").layouts
    assert "winograd_conv" in spec.target(amx_host, "fp32").layouts
    tiles_only = dataclasses.replace(host, features=host.features + ",+amx-tile")
    assert "winograd_conv" in spec.target(tiles_only, "bf16").layouts
