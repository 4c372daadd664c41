"""The dense, conv2d and pool2d schedule templates: correct on shapes with tails in every blocked
dimension, and actually chosen for the ops they serve (their micro-kernel uses fma)."""

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.backends.llvm import dense
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.target import Target
from dnnc.passes.convert_layout import convert_layout


def _dense(rng, m, k, n, batch=(), const_b=True, packed=False):
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, batch + (m, k)))
    bv = rng.standard_normal((k, n)).astype(np.float32)
    b = Value("b", T.TensorType(T.float32, (k, n)), const=bv) if const_b else \
        g.add_input("b", T.TensorType(T.float32, (k, n)))
    g.outputs = [g.add("MatMul", a, b)]
    if packed:
        convert_layout(g, Target("llvm", features="+avx2", layouts=("pack_dense",),
                              panels=(("pack_dense", 16),)))
    return g, bv


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 13, 37), (6, 300, 16), (13, 520, 33),
                                   (64, 64, 64)])
@pytest.mark.parametrize("packed", [False, True])
def test_dense_template_matches_numpy(rng, m, k, n, packed):
    g, bv = _dense(rng, m, k, n, packed=packed)
    compiled = dnnc.compile(g, target="llvm", opt_level=0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    np.testing.assert_allclose(compiled.run(a)[0], a @ bv, rtol=1e-4, atol=1e-4)
    assert "fma(" in compiled.runtime.source("loop")


@pytest.mark.parametrize("m,k,n,trans_b,packed", [
    (128, 300, 70, False, True), (66, 520, 64, True, True), (24, 9, 33, False, True),
    (5, 40, 64, False, False), (12, 40, 64, False, False)])
def test_a_run_time_b_is_packed_panel_by_panel(rng, m, k, n, trans_b, packed):
    """B as an input (traced weights): copied into a contiguous panel per k-slice where a row
    block has enough tiles to reuse it; k past one slice, a narrow last panel, B transposed."""
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (m, k)))
    b = g.add_input("b", T.TensorType(T.float32, (n, k) if trans_b else (k, n)))
    g.outputs = [g.add("Gemm", a, b, transB=int(trans_b))]
    compiled = dnnc.compile(g, target="llvm", cpu=Target("llvm", cpu="x86-64-v3",
                                                          features="+avx2,+fma", threads=2))
    av = rng.standard_normal((m, k)).astype(np.float32)
    bv = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    want = av @ (bv.T if trans_b else bv)
    np.testing.assert_allclose(compiled.run(av, bv)[0], want, rtol=1e-4, atol=1e-4)
    # packed where a row block has at least 4 tiles of 6 rows: up to 72 rows are one block
    # (its panels shared by the two threads), 128 two blocks of 11 tiles; 5 and 12 rows
    # are one and two tiles
    assert ("bpanel" in compiled.runtime.source("loop")) == packed


@pytest.mark.parametrize("m,k,n", [(1, 4099, 100), (1, 7, 40), (2, 1, 33), (3, 300, 64),
                                   (16, 770, 96), (1, 64, 8)])
def test_few_rows_share_panels_and_split_k(rng, m, k, n):
    """Fewer row blocks than threads: (row block, panel) pairs are the parallel loop; a tile of one or two
    accumulator vectors splits k over four sets (k % 4 left over, k = 1, one panel only)."""
    g, bv = _dense(rng, m, k, n)
    compiled = dnnc.compile(g, target="llvm", cpu=Target("llvm", cpu="x86-64-v3",
                                                          features="+avx2,+fma", threads=2))
    a = rng.standard_normal((m, k)).astype(np.float32)
    np.testing.assert_allclose(compiled.run(a)[0], a @ bv, rtol=1e-4, atol=1e-4)
    source = compiled.runtime.source("loop")
    assert ("for t in range(" in source and "# parallel" in source) == (n >= 32)
    if m == 1 and k >= 8:   # four accumulator sets, each taking every fourth k
        assert "k * 4 + 3" in source


@pytest.mark.parametrize("m,k,n,batch,const_b", [
    (196, 576, 103, (), True), (49, 70, 64, (), False), (13, 40, 70, (2,), False),
    (100, 33, 96, (3,), True)])
def test_row_blocks_and_panels_share_one_parallel_loop_on_many_threads(rng, m, k, n, batch,
                                                                      const_b):
    """Generated for 16 threads, fewer row blocks than threads: one parallel loop over
    (batch, row block, panel), the narrow last panel one of its iterations; blocks smaller
    than the default's most so that the pairs fill the threads (`shared_block_tiles`)."""
    from dnnc.backends.llvm.dense import shared_block_tiles

    g, bv = _dense(rng, m, k, n, batch=batch, const_b=const_b)
    compiled = dnnc.compile(g, target="llvm", cpu=Target("llvm", cpu="x86-64-v3",
                                                          features="+avx2,+fma", threads=16))
    a = rng.standard_normal(batch + (m, k)).astype(np.float32)
    args = (a,) if const_b else (a, bv)
    np.testing.assert_allclose(compiled.run(*args)[0], a @ bv, rtol=1e-4, atol=1e-4)
    source = compiled.runtime.source("loop")
    assert "for t in range(" in source and "# parallel" in source
    # 33 tiles of 6 rows in 8 panels on 16 threads: 4 blocks of 9 tiles (32 pairs, two
    # rounds of 9.25), not 3 blocks of 11 (24 pairs, two rounds of 11.25)
    assert shared_block_tiles(33, 11, 8, 16) == 9
    assert shared_block_tiles(33, 11, 8, 2) == 11


@pytest.mark.parametrize("threads,whole", [(2, True), (16, False)])
def test_pointwise_gemm_keeps_a_small_image_whole_where_the_panels_fill_the_threads(
        rng, threads, whole):
    """A 1x1 conv on a 7x7 image as the dense template's GEMM: on 2 threads its 5 panels (of
    16 channels) are units enough, so a row block holds all 49 pixels where
    `dense.shared_block_tiles` alone would split them in 3 (a split writes cache lines of
    every channel plane from two threads: `conv.whole_image_tiles`); on 16 the rows still
    split so that (row block, panel) pairs fill the threads. Outputs match either way."""
    model = _conv(rng, c=96, oc=80, h=7, w=7, k=1, pad=0)
    x = rng.standard_normal((1, 96, 7, 7)).astype(np.float32)
    compiled = dnnc.compile(model, target="llvm", cpu=Target(
        "llvm", cpu="x86-64-v3", features="+avx2,+fma", threads=threads))
    (row,) = compiled.profile(x, repeat=1)
    assert row["template"] == "pointwise_gemm"
    assert (row["config"]["mc_tiles"] * row["config"]["mr"] >= 49) == whole
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)


def test_dense_template_folds_batch_dims_into_rows(rng):
    g, bv = _dense(rng, 5, 9, 20, batch=(2, 3))
    compiled = dnnc.compile(g, target="llvm", opt_level=0)
    a = rng.standard_normal((2, 3, 5, 9)).astype(np.float32)
    np.testing.assert_allclose(compiled.run(a)[0], a @ bv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("trans_b,alpha,beta", [(0, 1.0, 1.0), (1, 0.5, 2.0)])
def test_gemm_epilogue(rng, trans_b, alpha, beta):
    b = rng.standard_normal((11, 8) if trans_b else (8, 11)).astype(np.float32)
    c = rng.standard_normal((11,)).astype(np.float32)
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (9, 8)))
    g.outputs = [g.add("Gemm", a, Value("b", T.TensorType(T.float32, b.shape), const=b),
                       Value("c", T.TensorType(T.float32, c.shape), const=c),
                       transB=trans_b, alpha=alpha, beta=beta)]
    x = rng.standard_normal((9, 8)).astype(np.float32)
    want = alpha * (x @ (b.T if trans_b else b)) + beta * c
    for level in (0, 3):
        got = dnnc.compile(g, target="llvm", opt_level=level).run(x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _conv(rng, c, oc, h, w, k, stride=1, pad=1, dilation=1, bias=True, n=1):
    weights = (rng.standard_normal((oc, c, k, k)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(weights, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b"))
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"],
                            pads=[pad] * 4, strides=[stride] * 2, dilations=[dilation] * 2)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [n, c, h, w])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cfg", [dict(c=3, oc=5, h=9, w=7, k=3),
                                 dict(c=8, oc=20, h=11, w=13, k=3, stride=2),
                                 dict(c=4, oc=17, h=6, w=6, k=1, pad=0, bias=False),
                                 dict(c=5, oc=7, h=10, w=10, k=3, dilation=2, pad=2),
                                 dict(c=2, oc=33, h=5, w=19, k=5, pad=2)])
@pytest.mark.parametrize("opt_level", [1, 3])
@pytest.mark.parametrize("order", ["rows", "blocks"])
def test_conv2d_template_matches_reference(rng, cfg, opt_level, order, monkeypatch):
    """At level 1 the template packs the weights on every call (Conv); from level 2
    convert_layout packed them at compile time (ConvPacked) and the template reads them.
    Both loop orders (the default picks "blocks" only for big layers)."""
    from dnnc.backends.llvm import conv

    monkeypatch.setattr(conv, "conv2d_order", lambda p, nr: order)
    monkeypatch.setattr(conv, "pointwise_order", lambda p, channels, pixels:
                        "channels" if order == "blocks" else "pixels")
    model = _conv(rng, **cfg)
    x = rng.standard_normal((1, cfg["c"], cfg["h"], cfg["w"])).astype(
        np.float32)
    compiled = dnnc.compile(model, target="llvm", opt_level=opt_level)
    source = compiled.runtime.source("loop")
    assert "acc = alloc" in source                                 # the template's tile
    pointwise = cfg["k"] == 1 and cfg.get("pad", 1) == 0 and cfg.get("stride", 1) == 1
    assert ("wpack" in source) == (opt_level == 1 and not pointwise)
    assert [n.op for n in compiled.graph.nodes] == ["Conv" if opt_level == 1 else "ConvPacked"]
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [2, 16])
@pytest.mark.parametrize("cfg", [dict(c=16, oc=80, h=7, w=7, k=3),
                                 dict(c=8, oc=40, h=14, w=13, k=3, stride=2)])
def test_conv2d_strips_keep_a_channel_block_on_one_thread(rng, cfg, threads, monkeypatch):
    """Channel blocks outside strips: the default splits an image's tiles into as few strips
    as the threads allow (`conv2d_strips`), so one thread runs a block's tiles in a row."""
    from dnnc.backends.llvm import conv

    monkeypatch.setattr(conv, "conv2d_order", lambda p, nr: "blocks")
    model = _conv(rng, **cfg)
    x = rng.standard_normal((1, cfg["c"], cfg["h"], cfg["w"])).astype(np.float32)
    compiled = dnnc.compile(model, target="llvm", cpu=Target(
        "llvm", cpu="x86-64-v3", features="+avx2,+fma", threads=threads))
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)
    (config,) = [row["config"] for row in compiled.profile(x, repeat=1)
                 if row["template"] == "conv2d"]
    # 49 pixels in 13 tiles of 4, 80 channels in 5 blocks of 16: on 2 threads 2 strips of 7
    # tiles (10 pairs, 5 rounds of 8 tiles' time, a strip costing a tile besides its own);
    # on 16 threads 3 strips of 5 (15 pairs, one round); the strided conv's 7x7 outputs (13
    # tiles) in 3 blocks: 2 strips on 2 threads (3 rounds of 8), on 16 strips of 3 tiles
    # (15 pairs, one round), 6 strips in the space's counts (ceil(13 / 6) = 3 tiles each)
    assert config["strips"] == {(7, 2): 2, (7, 16): 3, (14, 2): 2, (14, 16): 6}[
        cfg["h"], threads]


@pytest.mark.parametrize("cfg,chunk", [
    # slices dividing the input channels or not; a span of 16 tiles with a short last span;
    # strips of a row (rows) or of the image (blocks); a strided conv; partial channel blocks
    (dict(c=40, oc=32, h=9, w=23, k=3), 8), (dict(c=37, oc=20, h=12, w=12, k=3), 16),
    (dict(c=24, oc=33, h=11, w=13, k=3, stride=2), 8), (dict(c=19, oc=16, h=5, w=5, k=5,
                                                             pad=2), 8)])
@pytest.mark.parametrize("order", ["rows", "blocks"])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv2d_reduction_in_slices_of_input_channels(rng, cfg, chunk, order, threads,
                                                      monkeypatch):
    """With `chunk`, a tile's reduction runs in slices of input channels, each slice over
    a span of tiles before the next, the partial sums waiting in `part`; the epilogue and
    the store after the last slice. The default slices when one channel block's weights
    pass CHUNK_WEIGHT_BYTES."""
    from dnnc.backends.llvm import conv

    monkeypatch.setattr(conv, "conv2d_order", lambda p, nr: order)
    monkeypatch.setattr(conv, "conv2d_chunk", lambda p, nr: chunk)
    model = _conv(rng, **cfg)
    x = rng.standard_normal((1, cfg["c"], cfg["h"], cfg["w"])).astype(np.float32)
    compiled = dnnc.compile(model, target="llvm", cache=False, cpu=Target(
        "llvm", cpu="x86-64-v3", features="+avx2,+fma", threads=threads))
    assert [row["config"]["chunk"] for row in compiled.profile(x, repeat=1)] == [chunk]
    assert "part = alloc" in compiled.runtime.source("loop")
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", [
    # strips of a row's worth of tiles crossing rows (7 and 13 columns, 4 a tile on AVX2), a
    # stride, a dilation, a 5x5 window, a conv without padding (bf16 pairs still copied), an
    # odd channel count (a pair's high half 0), two images
    dict(c=3, oc=20, h=9, w=7, k=3), dict(c=8, oc=20, h=11, w=13, k=3, stride=2),
    dict(c=5, oc=7, h=10, w=10, k=3, dilation=2, pad=2), dict(c=6, oc=33, h=5, w=19, k=5, pad=2),
    dict(c=5, oc=16, h=6, w=9, k=3, pad=0, n=2), dict(c=16, oc=32, h=8, w=8, k=3, n=2)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("chunk", [0, 8])
def test_conv2d_band_of_the_padded_input_a_unit(rng, cfg, precision, chunk, monkeypatch):
    """`ConvConfig.band`: each unit copies the band of the padded (bf16: paired) input its
    strip reads, and the results are those of one padded copy of the whole input, to the
    bit (the same products in the same order), at 1 and 2 threads."""
    from dnnc.backends.llvm import conv

    monkeypatch.setattr(conv, "conv2d_order", lambda p, nr: "rows")
    monkeypatch.setattr(conv, "conv2d_chunk", lambda p, nr: chunk)
    model = _conv(rng, **cfg)
    x = rng.standard_normal((cfg.get("n", 1), cfg["c"], cfg["h"], cfg["w"])).astype(
        np.float32)
    outputs = {}
    for band in (False, True):
        for threads in (1, 2):
            monkeypatch.setattr(conv, "conv2d_band", lambda order, threads, band=band: band)
            compiled = dnnc.compile(model, target="llvm", precision=precision, cache=False,
                                    cpu=Target("llvm", cpu="x86-64-v3", features="+avx2,+fma",
                                               threads=threads))
            copied = precision == "bf16" or cfg.get("pad", 1) > 0   # else x read as it is
            assert ("xband = alloc" in compiled.runtime.source("loop")) == (band and copied)
            outputs[band, threads] = compiled.run(x)[0]
    for key, y in outputs.items():
        np.testing.assert_array_equal(y, outputs[False, 1], err_msg=str(key))
    if precision == "fp32":
        want = dnnc.compile(model, target="numpy").run(x)[0]
        np.testing.assert_allclose(outputs[True, 2], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,k,chunk", [(64, 3, 24), (28, 3, 0), (29, 3, 24), (10, 5, 0), (11, 5, 8), (6, 7, 0),
                                       (40, 5, 8), (3, 7, 0)])
def test_conv2d_slices_the_reduction_by_default_past_l1(rng, c, k, chunk):
    """The default slices when a channel block's weights (c x k x k x 16 floats on AVX2)
    pass 16 KB: as many input channels as fit, a multiple of 8, at least 8."""
    model = _conv(rng, c=c, oc=32, h=10, w=10, k=k, pad=k // 2)
    x = rng.standard_normal((1, c, 10, 10)).astype(np.float32)
    compiled = dnnc.compile(model, target="llvm", cache=False, cpu=Target(
        "llvm", cpu="x86-64-v3", features="+avx2,+fma", threads=1))
    assert [row["config"]["chunk"] for row in compiled.profile(x, repeat=1)] == [chunk]
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("runs", [0, 1, 2, 4])
@pytest.mark.parametrize("order", ["pixels", "channels"])
def test_pointwise_runs_of_blocks_are_the_parallel_units(rng, runs, order, monkeypatch):
    """A unit of the pointwise template's parallel loop is a run of inner blocks (0: every
    block a unit), the last run short where the runs do not divide the blocks (9 pixel
    blocks of 16 and 9 channel blocks of 6 in 2 or 4 runs)."""
    from dnnc.backends.llvm import conv

    monkeypatch.setattr(conv, "pointwise_order", lambda p, channels, pixels: order)
    monkeypatch.setattr(conv, "pointwise_runs", lambda *args: runs)
    model = _conv(rng, c=40, oc=50, h=12, w=12, k=1, pad=0)
    x = rng.standard_normal((1, 40, 12, 12)).astype(np.float32)
    compiled = dnnc.compile(model, target="llvm", cpu=Target(
        "llvm", cpu="x86-64-v3", features="+avx2,+fma", threads=16))
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)
    (config,) = [row["config"] for row in compiled.profile(x, repeat=1)]
    assert (config["runs"], config["order"]) == (runs, order)


def test_pointwise_runs_default_to_as_few_as_the_threads_allow():
    """resnet50's 512->128 at 28x28 on AVX-512 (16 channel blocks of 8, 25 pixel blocks of
    32, pixels outside): one run of all 16 channel blocks per pixel block on 2 and on 16
    threads (25 units: 2 rounds of 17 on 16 threads, not 400 units in 25 rounds of 2); a
    7x7 image (2 pixel blocks) on 16 threads in 8 runs of 2 channel blocks (16 units)."""
    from dnnc.backends.llvm import conv

    class P:   # the problem's fields pointwise_runs reads
        w_dims, x_dims, group = (128, 512, 1, 1), (1, 512, 28, 28), 1

    class Small:
        w_dims, x_dims, group = (128, 512, 1, 1), (1, 512, 7, 7), 1

    assert conv.pointwise_runs(P, 8, 32, "pixels", 2) == 1
    assert conv.pointwise_runs(P, 8, 32, "pixels", 16) == 1
    assert conv.pointwise_runs(Small, 8, 32, "pixels", 16) == 8


@pytest.mark.parametrize("n,c,oc,h,w,res_shape", [
    (1, 16, 64, 7, 7, None), (2, 9, 20, 5, 3, None), (3, 32, 32, 1, 1, None),
    (1, 24, 37, 13, 11, (1, 37, 1, 1)), (2, 5, 9, 6, 7, (1, 1, 6, 7)),
    (1, 6, 10, 6, 7, (1, 10, 6, 1)), (1, 7, 12, 5, 40, (1, 1, 1, 40)),
    # images one pixel wide with a full-shape residual (found by the fuzzer: the flat pixel
    # went to the width axis of size 1, which reads only index 0)
    (2, 1, 1, 5, 1, None), (2, 3, 4, 6, 1, None)])
@pytest.mark.parametrize("template,order", [("pointwise", "pixels"),
                                            ("pointwise", "channels"),
                                            ("pointwise_gemm", None)])
def test_pointwise_conv_runs_as_one_gemm_over_pixels(rng, n, c, oc, h, w, res_shape, template,
                                                      order, monkeypatch):
    """1x1 stride-1 unpadded convs tile pixels across row ends with the pixels in vector lanes
    (tails of channels and pixels included), in both loop orders; or run as the dense
    template's GEMM, pixels as rows (packed weights: every case here at opt level 3 when
    every image size may take it). The fused epilogue (bias, an added tensor of the output's
    shape or broadcast into it, ReLU) reads its inputs at the right element whether it may
    index them by flat pixel or needs the row and column."""
    from dnnc.backends.llvm import conv

    monkeypatch.setattr(conv, "GEMM_MAX_PIXELS", 1 << 30 if template == "pointwise_gemm" else 0)
    monkeypatch.setattr(conv, "pointwise_order", lambda p, channels, pixels: order)
    model, x, res = _pointwise_residual(rng, n, c, oc, h, w, res_shape)
    compiled = dnnc.compile(model, target="llvm", cache=False)
    assert compiled.stats["kernels"] == 1
    assert [row["template"] for row in compiled.profile(x, res, repeat=1)] == [template]
    want = dnnc.compile(model, target="numpy").run(x, res)[0]
    np.testing.assert_allclose(compiled.run(x, res)[0], want, rtol=1e-4, atol=1e-4)


def _pointwise_residual(rng, n, c, oc, h, w, res_shape, strides=(1, 1)):
    """Conv 1x1 (bias; `strides`) -> Add a tensor of `res_shape` (the output's by default)
    -> Relu, and random inputs."""
    oh, ow = -(-h // strides[0]), -(-w // strides[1])
    weights = (rng.standard_normal((oc, c, 1, 1)) * 0.2).astype(np.float32)
    res = rng.standard_normal(res_shape or (n, oc, oh, ow)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=list(strides)),
             helper.make_node("Add", ["y", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["z"])]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w]),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, list(res.shape))],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializer=[
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal((n, c, h, w)).astype(np.float32), res


@pytest.mark.parametrize("n,c,oc,h,w,strides,res_shape", [
    (1, 24, 40, 14, 14, (2, 2), None), (2, 7, 37, 9, 11, (2, 2), (1, 37, 1, 1)),
    (1, 16, 20, 8, 13, (2, 3), (1, 1, 4, 5)), (3, 5, 33, 3, 1, (2, 1), None),
    # 14x14 with many input channels; k past one slice (1024 + 76: the partial sums of the
    # first wait in the output)
    (1, 1024, 24, 14, 14, (1, 1), None), (2, 1100, 20, 7, 7, (1, 1), (1, 20, 1, 1))])
def test_strided_and_deep_1x1_convs_run_as_a_gemm(rng, n, c, oc, h, w, strides, res_shape):
    """A 1x1 conv with strides (ResNet's downsampling), and a 14x14 one with many input
    channels, run as the dense template's GEMM by default, each output pixel reading its
    own input pixel; output channels past the last whole panel, batches of images and the
    epilogue's broadcast reads included."""
    model, x, res = _pointwise_residual(rng, n, c, oc, h, w, res_shape, strides)
    compiled = dnnc.compile(model, target="llvm", cache=False)
    assert [row["template"] for row in compiled.profile(x, res, repeat=1)] == ["pointwise_gemm"]
    want = dnnc.compile(model, target="numpy").run(x, res)[0]
    np.testing.assert_allclose(compiled.run(x, res)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n,c,oc,h,w,strides,threads", [
    (1, 40, 70, 7, 7, (1, 1), 1), (2, 33, 64, 9, 11, (2, 2), 1),
    # 16 threads: fewer row blocks than threads, every block packed before the pairs run
    (1, 40, 70, 7, 7, (1, 1), 16), (3, 17, 48, 5, 6, (2, 1), 16),
    # k in slices: each slice packed again; one panel and a narrow one: not packed
    (1, 1100, 40, 7, 7, (1, 1), 2), (1, 1100, 40, 7, 7, (1, 1), 16),
    (1, 24, 31, 7, 7, (1, 1), 1)])
def test_a_read_across_the_image_is_packed_into_a_workspace(rng, n, c, oc, h, w, strides,
                                                            threads):
    """A 1x1 conv's GEMM reads A (the NCHW image) a row of the image apart per k: each
    row block's tiles are packed once (`apack`, a slot per block) and read by every panel,
    when at least two panels read them. The packed buffer is the kernel's workspace: a
    trailing parameter the segment places in its arena, nothing allocated per call."""
    from dnnc.backends.llvm import conv

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(conv, "GEMM_SLICE", 512)
    try:
        model, x, res = _pointwise_residual(rng, n, c, oc, h, w, None, strides)
        compiled = dnnc.compile(model, target="llvm", cache=False, cpu=Target(
            "llvm", cpu="x86-64-v3", features="+avx2,+fma", threads=threads))
    finally:
        monkeypatch.undo()
    assert [row["template"] for row in compiled.profile(x, res, repeat=1)] == ["pointwise_gemm"]
    want = dnnc.compile(model, target="numpy").run(x, res)[0]
    np.testing.assert_allclose(compiled.run(x, res)[0], want, rtol=1e-4, atol=1e-4)
    packs = oc >= 32
    assert ("apack" in compiled.runtime.source("loop")) == packs
    segment, = compiled.runtime._cache.values()
    call, = segment.calls
    # the image, packed weights, bias, residual and output; the workspace after them
    assert len(call.args) == 5 + packs
    if packs:
        assert call.args[-1][0] == "arena" and call.args[-1][1] >= segment.memory.arena_bytes
        assert segment.arena_bytes > call.args[-1][1]
        assert "malloc" not in compiled.runtime.source("llvm")


def test_workspace_params_turn_whole_body_scratch_into_parameters():
    """Only GLOBAL scratch of static size wrapping the whole body becomes parameters; scratch
    inside the body stays where it is."""
    from dnnc.backends.llvm.codegen import workspace_params
    from dnnc.ir import loop as L

    x = L.Buffer("x", T.float32, (8,))
    ws = L.Buffer("ws", T.float32, (8,), L.Scope.GLOBAL)
    local = L.Buffer("tmp", T.float32, (8,), L.Scope.LOCAL)
    i = L.Var("i")
    inner = L.Allocate(local, L.For(i, 8, L.seq(L.Store(ws, (i,), x[i]),
                                               L.Store(local, (i,), ws[i]),
                                               L.Store(x, (i,), local[i]))))
    func = L.PrimFunc("f", (x,), L.Allocate(ws, inner))
    out, buffers = workspace_params(func)
    assert buffers == [ws] and out.params == (x, ws) and out.body == inner
    assert workspace_params(L.PrimFunc("g", (x,), inner)) == (L.PrimFunc("g", (x,), inner), [])
    dynamic = L.Buffer("d", T.float32, (L.Var("n"),), L.Scope.GLOBAL)
    func = L.PrimFunc("h", (x,), L.Allocate(dynamic, inner))
    assert workspace_params(func) == (func, [])


@pytest.mark.parametrize("c,h,w,k,stride,pad", [(8, 9, 13, 3, 1, 1), (5, 12, 12, 3, 2, 1),
                                               (3, 7, 20, 5, 1, 2), (4, 6, 6, 1, 1, 0),
                                               (3, 40, 41, 3, 2, 1), (2, 13, 50, 3, 3, 0),
                                               # stride 2 in phases: 5x5, no padding, odd
                                               # and even widths, a pad of 1 under a 5x5
                                               (4, 17, 23, 5, 2, 2), (3, 10, 11, 3, 2, 0),
                                               (3, 9, 16, 5, 2, 1), (2, 11, 35, 5, 3, 2)])
def test_depthwise_template_matches_reference(rng, c, h, w, k, stride, pad):
    weights = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, pads=[pad] * 4,
                            strides=[stride] * 2)
    relu = helper.make_node("Relu", ["y"], ["z"])
    graph = helper.make_graph([node, relu], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, c, h, w])], [helper.make_tensor_value_info(
            "z", TensorProto.FLOAT, None)], initializer=[
                numpy_helper.from_array(weights, "w"),
                numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    compiled = dnnc.compile(model, target="llvm")
    source = compiled.runtime.source("loop")   # the depthwise template's plane, or its lanes
    assert ("xplane" in source or "xlanes" in source) and compiled.stats["kernels"] == 1
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-5, atol=1e-5)


def _pool(rng, op, attrs, shape):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return model, rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 3], dilations=[2, 1], pads=[0, 1, 1, 2])),
    # strided max pools run separably (rows' maximum, then columns'): unpadded odd sizes,
    # dilated rows and columns at a row stride
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 2], strides=[2, 1], dilations=[2, 3])),
    ("MaxPool", dict(kernel_shape=[1, 1], strides=[3, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER",
                         count_include_pad=1))])
def test_pool_template_matches_reference(rng, op, attrs):
    model, x = _pool(rng, op, attrs, (2, 3, 23, 37))
    compiled = dnnc.compile(model, target="llvm")
    source = compiled.source("loop")
    assert "for plane in range(6)" in source        # the template's loop
    strided = attrs.get("strides", [1, 1]) != [1, 1]
    assert ("rowmax" in source) == (op == "MaxPool" and strided)
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op,attrs", [
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),      # border divisors vary
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1))])
def test_pools_the_template_declines_keep_the_default_schedule(rng, op, attrs):
    model, x = _pool(rng, op, attrs, (1, 2, 10, 11))
    compiled = dnnc.compile(model, target="llvm")
    assert "for plane in range" not in compiled.source("loop")
    want = dnnc.compile(model, target="numpy").run(x)[0]
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-6, atol=1e-6)


def _one_op(rng, op, shapes, consts=(), dtype=T.float32, **attrs):
    g = Graph("g")
    inputs = [g.add_input(f"x{k}", T.TensorType(dtype, s)) for k, s in enumerate(shapes)]
    inputs += [Value(f"c{k}", T.TensorType(dtype, s), const=rng.standard_normal(s).astype(
        dtype.np)) for k, s in enumerate(consts)]
    g.outputs = [g.add(op, *inputs, **attrs)]
    return g


@pytest.mark.parametrize("op,shapes,consts,attrs,dtype,template", [
    ("MatMul", [(5, 7)], [(7, 9)], {}, T.float32, "dense"),
    ("MatMul", [(5, 7), (7, 9)], [], {}, T.int32, "rows"),               # not float32
    ("Gemm", [(5, 7)], [(9, 7)], {"transB": 1}, T.float32, "dense"),
    ("Conv", [(1, 4, 6, 6)], [(8, 4, 1, 1)], {}, T.float32, "pointwise"),
    ("Conv", [(1, 4, 6, 6)], [(8, 4, 3, 3)], {}, T.float32, "conv2d"),
    ("Conv", [(1, 4, 6, 6)], [(4, 1, 3, 3)], {"group": 4}, T.float32, "depthwise"),
    ("Conv", [(1, 4, 6, 6)], [(6, 2, 3, 3)], {"group": 2}, T.float32, "conv2d"),  # grouped
    ("Conv", [(1, 4, 6, 6)], [(6, 2, 1, 1)], {"group": 2}, T.float32, "pointwise"),
    ("MaxPool", [(1, 2, 6, 6)], [], {"kernel_shape": [2, 2]}, T.float32, "pool2d"),
    ("AveragePool", [(1, 2, 6, 6)], [], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
     T.float32, "rows"),                                                 # border divisors
    ("Softmax", [(3, 5)], [], {}, T.float32, "rows")])
def test_the_template_table_chooses_by_anchor_pattern_then_problem(rng, op, shapes, consts,
                                                                   attrs, dtype, template):
    from dnnc.backends.llvm.schedules import template_for
    from dnnc.backends.lower import lower_group

    g = _one_op(rng, op, shapes, consts, dtype, **attrs)
    chosen, problem = template_for(lower_group(g.nodes, "k", outputs=g.outputs))
    assert chosen.name == template and chosen.applies(problem)


@pytest.mark.parametrize("w, oc, mr", [(8, 20, 4), (9, 16, 4), (12, 32, 6), (5, 7, 3)])
def test_conv2d_tiles_inside_a_row_store_a_vector_per_channel(rng, w, oc, mr):
    """A tile whose MR pixels lie in one output row stores each channel's pixels as one
    vector, the epilogue (bias, a residual read at the output's index, Relu) applied first;
    tiles that cross a row's end or the image's end store lane by lane. Widths where every
    tile fits a row (8 at MR 4), where some cross (9, 5) and partial channel blocks."""
    from dnnc.backends.llvm import conv

    default = conv.CONV2D.default   # a frozen Template: put back by hand below
    object.__setattr__(conv.CONV2D, "default", lambda p, machine: dataclasses.replace(
        default(p, machine), mr=mr))
    try:
        _conv_residual(rng, w, oc, mr)
    finally:
        object.__setattr__(conv.CONV2D, "default", default)


def _conv_residual(rng, w, oc, mr):
    c, h = 6, 7
    weights = rng.standard_normal((oc, c, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[1] * 4),
             helper.make_node("Add", ["t", "r"], ["u"]), helper.make_node("Relu", ["u"], ["y"])]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, h, w]),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, oc, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = dnnc.compile(model, target="llvm")
    rows = compiled.profile(*[rng.standard_normal(s).astype(np.float32)
                              for s in ((2, c, h, w), (2, oc, h, w))])
    assert [(r["template"], r["config"]["mr"], r["nodes"]) for r in rows] == \
        [("conv2d", mr, ["Conv_0", "Add_1", "Relu_2"])]
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    r = rng.standard_normal((2, oc, h, w)).astype(np.float32)
    want = dnnc.compile(model, target="numpy").run(x, r)[0]
    np.testing.assert_allclose(compiled.run(x, r)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k, n, computed", [(40, 35, 4), (40, 37, 8), (40, 44, 16), (40, 25, 16),
                                            (40, 36, 4), (40, 40, 8), (1100, 44, 8)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_narrow_last_panel_computes_whole_vectors(rng, k, n, computed, threads):
    """The last panel of packed B narrower than NR computes whole vectors (or a power of two
    below one vector), reading the panel's zero padding, and stores only its own columns;
    with k in several slices it computes what it stores (the partial sums are read back
    from the output), as tiles of whole registers (12 columns: 8 + 4). 8 lanes, NR 16:
    tails of 3, 5, 12, 9, 4 and 8 columns. On one thread the last panel is outside the
    panels' loop (a tail computed as a whole panel once prefetched the next panel of a
    panel variable not bound there: a codegen error)."""
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (13, k)))
    bv = rng.standard_normal((k, n)).astype(np.float32)
    g.outputs = [g.add("Add", g.add("MatMul", a, Value("b", T.TensorType(T.float32, (k, n)),
                                                          const=bv)),
                       g.add_input("r", T.TensorType(T.float32, (13, n))))]
    compiled = dnnc.compile(g, target="llvm", cpu=Target("llvm", cpu="x86-64-v3",
                                                          features="+avx2,+fma",
                                                          threads=threads))
    av = rng.standard_normal((13, k)).astype(np.float32)
    rv = rng.standard_normal((13, n)).astype(np.float32)
    np.testing.assert_allclose(compiled.run(av, rv)[0], av @ bv + rv, rtol=1e-4, atol=1e-4)
    source = compiled.runtime.source("loop")
    assert f"acc = alloc(float32[{6 * computed}], scope=local)" in source


@pytest.mark.parametrize("n, pieces", [(20, (16, 4)), (7, (4, 2, 1)), (12, (8, 4)),
                                       (36, (32, 4)), (16, (16,))])
def test_a_run_time_b_of_odd_width_runs_in_tiles_of_whole_registers(rng, n, pieces):
    """Attention's probabilities times V ([16, 49, 49] @ [16, 49, n], both run-time inputs):
    a tail of columns that is not whole vectors runs as tiles of whole vectors, then halves,
    quarters... of one (`dense.vector_pieces`), each its own accumulators; all match NumPy."""
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (16, 49, 49)))
    b = g.add_input("b", T.TensorType(T.float32, (16, 49, n)))
    g.outputs = [g.add("MatMul", a, b)]
    compiled = dnnc.compile(g, target="llvm", cpu=Target("llvm", cpu="znver4",
                                                          features="+avx512f,+fma", threads=1))
    av = rng.standard_normal((16, 49, 49)).astype(np.float32)
    bv = rng.standard_normal((16, 49, n)).astype(np.float32)
    np.testing.assert_allclose(compiled.run(av, bv)[0], av @ bv, rtol=1e-4, atol=1e-4)
    source = compiled.runtime.source("loop")
    for w in pieces:
        assert f"acc = alloc(float32[{6 * w}], scope=local)" in source
    assert f"acc = alloc(float32[{6 * n}], scope=local)" in source or len(pieces) > 1
    assert dense.vector_pieces(n, 16) == list(pieces)


QUANTIZED_CONV = r"""
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import dnnc

c, size, oc, silu = 3, int(sys.argv[1]), 16, sys.argv[2] == "silu"
rng = np.random.default_rng(0)
weights = (rng.standard_normal((oc, c, 3, 3)) / np.sqrt(c * 9)).astype(np.float32)
nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[1] * 4),
         helper.make_node("QuantizeLinear", ["t", "s", "z"], ["q"])]
out = helper.make_tensor_value_info("q", TensorProto.INT8, None)
if silu:   # efficientnet as quantize_static writes it: SiLU between Q/DQ pairs, int8 into
    # the next (depthwise) conv
    nodes += [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
              helper.make_node("Sigmoid", ["d"], ["g"]),
              helper.make_node("QuantizeLinear", ["g", "s", "z"], ["gq"]),
              helper.make_node("DequantizeLinear", ["gq", "s", "z"], ["gd"]),
              helper.make_node("Mul", ["d", "gd"], ["m"]),
              helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"]),
              helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["md"]),
              helper.make_node("Conv", ["md", "dw"], ["y"], pads=[1] * 4, group=oc)]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
graph = helper.make_graph(nodes, "g", [
    helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])], [out], [
    numpy_helper.from_array(weights, "w"),
    numpy_helper.from_array(rng.standard_normal((oc, 1, 3, 3)).astype(np.float32), "dw"),
    numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b"),
    numpy_helper.from_array(np.array(0.05, np.float32), "s"),
    numpy_helper.from_array(np.array(3, np.int8), "z")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
compiled = dnnc.compile(model, target="llvm", opt_level=3)
x = rng.standard_normal((1, c, size, size)).astype(np.float32)
rows = compiled.profile(x)
# the conv's epilogue quantizes (it writes int8; with the SiLU chain a lookup table of those
# int8 values follows in the same epilogue, fuse_quantized's QuantizedTable)
assert [any(n.startswith("QuantizeLinear") for n in r["nodes"]) for r in rows
        if r["template"] == "conv2d"] == [True], rows
want = dnnc.compile(model, target="numpy").run(x)[0]
got = compiled.run(x)[0]
assert got.dtype == want.dtype and np.allclose(got, want, rtol=1e-5, atol=1e-5), \
    np.abs(got.astype(float) - want).max()
print("ok")
"""


@pytest.mark.parametrize("size, tail", [(16, "q"), (32, "q"), (32, "silu")])
def test_conv2d_with_a_fused_quantize_stores_its_integers(size, tail):
    """A conv whose epilogue ends in QuantizeLinear writes int8: its tiles inside a row staged
    those through the float32 accumulators, which stored garbage and wrote past the output
    (heap corruption, 'malloc(): invalid size'; issue 30's quantized efficientnet differed
    from the numpy target by a relative 2-4). In a child process: it could kill this one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", QUANTIZED_CONV, str(size), tail],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-2000:]
