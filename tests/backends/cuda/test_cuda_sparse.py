"""The cuda SpMM template (issue 34, item 4; dnnc/backends/cuda/sparse.py) without a GPU:
SparseDense and 1x1 SparseConv kernels scheduled for cuda (the default config and others of
its knob space), rendered, run on host threads by test_host_semantics.py's shim against the
float64 product of the dense weights: random inputs, places that fill no tile, rows of no
entries (and a matrix of none), rows swizzled and not, a bias and a fused epilogue reading a
residual, and NaN / infinite activations meeting pruned weights (NaN, as the dense product).
The renderings compile with NVRTC for sm_80 and sm_90 (skipped without CuPy). A pruned
product through the cuda rewrite runs on the host (emulated_full). The `gpu` tests run the
same on a GPU (skipped without one)."""

import dataclasses
import shutil

import numpy as np
import pytest

from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.sparse import SPMM, SpmmConfig
from dnnc.errors import ConfigError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.sparse import encode_csr, row_max
from dnnc.passes.find_sparsity import row_order
from cuda_kernels import MACHINE, nvrtc_compiled, programs
from test_cuda_codegen import poisoned

pytestmark = pytest.mark.codegen

SPARSE_MACHINE = dataclasses.replace(MACHINE, layouts=("sparse_weights", "nhwc_conv"))
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


def pruned(rng, shape, density, empty_rows=()) -> np.ndarray:
    w = rng.standard_normal(shape).astype(np.float32)
    w[rng.random(shape) >= density] = 0.0
    w[list(empty_rows)] = 0.0
    return w


def _const(name, array) -> Value:
    dtype = T.float32 if array.dtype == np.float32 else T.int32
    return Value(name, T.TensorType(dtype, array.shape), const=array)


def _csr(w, slice_depth, ordered) -> tuple[list, dict]:
    values, columns, starts = encode_csr(w, slice_depth)
    order = [_const("order", row_order(starts))] if ordered else []
    return [_const("values", values), _const("columns", columns),
            _const("starts", starts)], order, {"row_max": row_max(starts),
                                               "slice_depth": slice_depth}


def dense_graph(rng, a_shape, n, density, bias, ordered, empty_rows=(), slice_depth=256):
    """SparseDense (+ bias) -> Tanh; the graph, its dense weights [n, K] and bias."""
    w = pruned(rng, (n, a_shape[-1]), density, empty_rows) / np.float32(np.sqrt(a_shape[-1]))
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    g = Graph("sparse_dense")
    a = g.add_input("a", T.TensorType(T.float32, a_shape))
    csr, order, attrs = _csr(w, slice_depth, ordered)
    extra = [_const("b", b)] if bias else [None] if order else []
    y = g.add("SparseDense", a, *csr, *extra, *order, n=n, **attrs)
    g.outputs = [g.add("Tanh", y)]
    return g, w, b


def conv_graph(rng, n, c, m, h, wid, density, bias, ordered, empty_rows=(), slice_depth=64):
    """1x1 SparseConv (+ bias) + residual -> Relu; the graph, its weights [m, c], bias."""
    w = pruned(rng, (m, c), density, empty_rows)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    g = Graph("sparse_conv")
    x = g.add_input("x", T.TensorType(T.float32, (n, c, h, wid)))
    csr, order, attrs = _csr(w, slice_depth, ordered)
    extra = [_const("b", b)] if bias else [None] if order else []
    y = g.add("SparseConv", x, *csr, *extra, *order, oc=m, kernel_shape=[1, 1],
              pads=[0, 0, 0, 0], strides=[1, 1], **attrs)
    y = g.add("Add", y, g.add_input("r", y.type))
    g.outputs = [g.add("Relu", y)]
    return g, w, b


def _dense_want(a, w, b):
    with np.errstate(invalid="ignore", over="ignore"):
        y = a.astype(np.float64) @ w.T.astype(np.float64)
    return np.tanh(y if b is None else y + b)


def _conv_want(x, r, w, b):
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.einsum("mc,nchw->nmhw", w.astype(np.float64), x.astype(np.float64))
    if b is not None:
        y = y + b[:, None, None]
    return np.maximum(y + r, 0)


def _nonfinite(rng, x, count=6) -> np.ndarray:
    """x with NaN, +inf and -inf at a few random elements."""
    x = x.copy()
    flat = x.reshape(-1)
    spots = rng.choice(flat.size, size=min(count, flat.size), replace=False)
    flat[spots[0::3]], flat[spots[1::3]], flat[spots[2::3]] = np.nan, np.inf, -np.inf
    return x


def _scheduled(graph, config=None):
    """(the optimised graph, its one program) with the sparse kernel on the SpMM."""
    graph, (program,) = programs(graph, machine=MACHINE, config=config)
    (kernel,) = program.kernels
    assert kernel.schedule[0] == "cuda_spmm"
    return graph, program


def _on_host(graph, feeds: dict, tmp_path, config=None) -> np.ndarray:
    import test_host_semantics as host

    graph, program = _scheduled(graph, config)
    module = render_module(program.unique)
    lib = host.host_library(program.unique, tmp_path, module)
    values = host.program_on_host(lib, module, program, feeds)
    return values[graph.outputs[0].name]


DENSES = [  # (A's shape, n, density, bias, ordered, empty rows, nonfinite): a tile of places
    # partly filled, several stages a row, an odd place count (scalar loads), a batch of
    # sequences, rows of no entries, a matrix of none, non-finite activations
    ((12, 40), 24, 0.3, True, True, (), False), ((37, 70), 9, 0.6, False, True, (2, 5), False),
    ((2, 6, 33), 40, 0.1, True, False, (0,), False), ((8, 16), 10, 0.0, True, True, (), False),
    ((12, 40), 24, 0.2, True, True, (3,), True), ((9, 50), 7, 0.5, False, True, (), True)]


@needs_gxx
@pytest.mark.parametrize("case", DENSES, ids=[str(c[:3]) for c in DENSES])
def test_sparse_dense_on_host(rng, tmp_path, case):
    a_shape, n, density, bias, ordered, empty, nonfinite = case
    g, w, b = dense_graph(rng, a_shape, n, density, bias, ordered, empty)
    a = rng.standard_normal(a_shape).astype(np.float32)
    if nonfinite:
        a = _nonfinite(rng, a)
    want = _dense_want(a, w, b)
    if nonfinite:
        assert np.isnan(want).any()
    got = _on_host(g, {"a": a}, tmp_path)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


CONVS = [  # (n, c, m, h, w, density, bias, ordered, empty rows, nonfinite)
    (1, 24, 20, 7, 7, 0.2, True, True, (), False), (2, 40, 12, 4, 6, 0.4, False, True, (1,),
                                                    False),
    (1, 16, 8, 3, 3, 0.3, True, False, (), True), (2, 20, 9, 2, 4, 0.1, True, True, (0, 4),
                                                   True)]


@needs_gxx
@pytest.mark.parametrize("case", CONVS, ids=[str(c[:6]) for c in CONVS])
def test_sparse_conv_on_host(rng, tmp_path, case):
    n, c, m, h, wid, density, bias, ordered, empty, nonfinite = case
    g, w, b = conv_graph(rng, n, c, m, h, wid, density, bias, ordered, empty)
    x = rng.standard_normal((n, c, h, wid)).astype(np.float32)
    if nonfinite:
        x = _nonfinite(rng, x)
    r = rng.standard_normal((n, m, h, wid)).astype(np.float32)
    want = _conv_want(x, r, w, b)
    got = _on_host(g, {"x": x, "r": r}, tmp_path)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


CONFIGS = [SpmmConfig(4, 2, 8, 16), SpmmConfig(8, 1, 4, 16), SpmmConfig(16, 4, 2, 64),
           SpmmConfig(32, 2, 1, 32)]


@needs_gxx
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_knob_configs_compute_the_same(rng, tmp_path, config):
    """Other points of the knob space (subwarps of 4 to 32, vectors of 1 to 4, stages
    shorter and longer than the rows) on a SparseDense with NaNs."""
    g, w, b = dense_graph(rng, (16, 90), 33, 0.3, True, True, (4,))
    a = _nonfinite(rng, rng.standard_normal((16, 90)).astype(np.float32))
    graph, program = _scheduled(g, config)
    kernel = program.kernels[0]
    assert kernel.schedule == ("cuda_spmm", config)
    got = _on_host(g, {"a": a}, tmp_path, config)
    np.testing.assert_allclose(got, _dense_want(a, w, b), rtol=1e-5, atol=1e-5,
                               equal_nan=True)


STAGED = [SpmmConfig(8, 2, 4, 32, True, 2), SpmmConfig(4, 1, 8, 32, True, 4),
          SpmmConfig(16, 4, 2, 32, True, 1), SpmmConfig(32, 2, 1, 32, True, 8)]


@needs_gxx
@pytest.mark.parametrize("config", STAGED, ids=str)
def test_staged_configs_compute_the_same(rng, tmp_path, config):
    """B staged in shared memory a slice at a time (32 columns: 90 deep is 3 slices and a
    partial one; 40 is one and a partial one), a subwarp taking 1 to 8 rows: a SparseDense
    (A transposed by the staging) and a 1x1 SparseConv with NaNs, places filling no tile and
    rows past the last block's."""
    _staged_dense_and_conv_match(rng, tmp_path, config, (20, 90), 33, 5)


def _staged_dense_and_conv_match(rng, tmp_path, config, a_shape, rows, width,
                                 scheduled=False):
    """A SparseDense of A `a_shape` into `rows` rows and a 1x1 SparseConv (40 -> 19
    channels, 4 x `width` pixels, a residual), both 30% dense with NaNs and staged in slices
    of 32, computed with `config` on the host shim as the dense products do (with
    `scheduled`: the SparseDense's kernel scheduled with `config` itself)."""
    g, w, b = dense_graph(rng, a_shape, rows, 0.3, True, True, (4,), slice_depth=32)
    a = _nonfinite(rng, rng.standard_normal(a_shape).astype(np.float32))
    if scheduled:
        _, program = _scheduled(g, config)
        assert program.kernels[0].schedule == ("cuda_spmm", config)
    got = _on_host(g, {"a": a}, tmp_path, config)
    np.testing.assert_allclose(got, _dense_want(a, w, b), rtol=1e-5, atol=1e-5,
                               equal_nan=True)
    g, w, b = conv_graph(rng, 2, 40, 19, 4, width, 0.3, True, True, (2,), slice_depth=32)
    x = _nonfinite(rng, rng.standard_normal((2, 40, 4, width)).astype(np.float32))
    r = rng.standard_normal((2, 19, 4, width)).astype(np.float32)
    got = _on_host(g, {"x": x, "r": r}, tmp_path / "conv", config)
    np.testing.assert_allclose(got, _conv_want(x, r, w, b), rtol=1e-5, atol=1e-5,
                               equal_nan=True)


WIDE = [SpmmConfig(4, 8, 8, 32, True, 2), SpmmConfig(8, 8, 4, 32, True, 1),
        SpmmConfig(8, 4, 8, 32, True, 4), SpmmConfig(4, 2, 16, 32, True, 2),
        SpmmConfig(8, 4, 32, 32, True, 4), SpmmConfig(8, 8, 32, 32, True, 2)]
"""Staged configs of 4 or 8 places a thread, the last two the default staged shapes of a
product or 1x1 conv (256 threads, 128 or 64 rows a block)."""


@needs_gxx
@pytest.mark.parametrize("config", WIDE, ids=str)
def test_wide_staged_configs_compute_the_same(rng, tmp_path, config):
    """Staged configs of 8 places a thread (two runs of 4, a subwarp's width apart) and a
    SparseDense whose depth is whole quads (A staged 4 columns a thread, `stage_quads`;
    one slice partial), with NaNs, on a SparseDense and a 1x1 SparseConv whose places the
    tile divides (vector 8 needs it), rows past the last block's."""
    _staged_dense_and_conv_match(rng, tmp_path, config, (64, 76), 37, 16, scheduled=True)


def window_graph(rng, n, c, m, h, wid, k, pads, stride, density, ordered, slice_depth=32):
    """A k x k SparseConv (+ bias), padded and strided -> Relu; the graph, its weights [m, c,
    k, k] and bias."""
    w = pruned(rng, (m, c, k, k), density)
    b = rng.standard_normal(m).astype(np.float32)
    g = Graph("sparse_window")
    x = g.add_input("x", T.TensorType(T.float32, (n, c, h, wid)))
    csr, order, attrs = _csr(w.reshape(m, -1), slice_depth, ordered)
    y = g.add("SparseConv", x, *csr, _const("b", b), *order, oc=m, kernel_shape=[k, k],
              pads=list(pads), strides=[stride, stride], **attrs)
    g.outputs = [g.add("Relu", y)]
    return g, w, b


def _window_want(x, w, b, pads, stride):
    """The dense conv (+ bias) -> Relu in float64."""
    return np.maximum(_conv_nchw(x, w, pads, stride) + b[:, None, None], 0)


def _conv_nchw(x, w, pads, stride):
    """The dense conv in float64 (NaN * 0 = NaN, as the dense product)."""
    top, left, bottom, right = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    m, _, k, _ = w.shape
    oh, ow = (xp.shape[2] - k) // stride + 1, (xp.shape[3] - k) // stride + 1
    y = np.zeros((x.shape[0], m, oh, ow))
    with np.errstate(invalid="ignore", over="ignore"):
        for ky in range(k):
            for kx in range(k):
                patch = xp[:, :, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride]
                y += np.einsum("mc,nchw->nmhw", w[:, :, ky, kx].astype(np.float64), patch)
    return y


WINDOWS = [  # (n, c, m, h, w, k, pads, stride, ordered, config): 3x3 padded (the default
    # config; a subwarp's rows in turn), stride 2 unevenly padded, an unpadded 5x5, NaNs in all
    (2, 6, 9, 5, 6, 3, (1, 1, 1, 1), 1, True, None),
    (1, 5, 7, 7, 6, 3, (1, 0, 1, 1), 2, False, SpmmConfig(8, 1, 4, 32, True, 2)),
    (2, 3, 10, 6, 7, 5, (0, 0, 0, 0), 1, True, SpmmConfig(4, 2, 8, 32, True, 1))]


@needs_gxx
@pytest.mark.parametrize("case", WINDOWS, ids=[str(c[:8]) for c in WINDOWS])
def test_windowed_sparse_conv_on_host(rng, tmp_path, case):
    """k x k SparseConvs on the staged SpMM, the staging gathering the windows (padding
    zero): against the dense conv, NaN / infinite pixels meeting pruned weights included."""
    n, c, m, h, wid, k, pads, stride, ordered, config = case
    g, w, b = window_graph(rng, n, c, m, h, wid, k, pads, stride, 0.3, ordered)
    x = _nonfinite(rng, rng.standard_normal((n, c, h, wid)).astype(np.float32), 3)
    graph, program = _scheduled(g, config)
    assert program.kernels[0].schedule[1].staged
    got = _on_host(g, {"x": x}, tmp_path, config)
    np.testing.assert_allclose(got, _window_want(x, w, b, pads, stride), rtol=1e-5,
                               atol=1e-5, equal_nan=True)


def test_the_knob_space_holds_the_defaults(rng):
    """Every default is a point of the space (the tuner's), and the space refuses a vector
    that does not divide the places."""
    from dnnc.backends.cuda.schedules import template_for
    from dnnc.backends.plan import build_program, segment_groups
    from dnnc.ir.segments import plan_steps
    from dnnc.passes.manager import optimize

    for g in (dense_graph(rng, (12, 40), 24, 0.3, True, True)[0],
              dense_graph(rng, (37, 70), 9, 0.3, True, True)[0],
              conv_graph(rng, 2, 40, 12, 7, 7, 0.3, True, True)[0],
              window_graph(rng, 2, 8, 64, 7, 7, 3, (1, 1, 1, 1), 1, 0.3, True, 128)[0],
              window_graph(rng, 2, 8, 64, 8, 8, 3, (1, 1, 1, 1), 1, 0.3, True, 128)[0]):
        graph = optimize(g, MACHINE)
        (step,) = plan_steps(graph)
        found = []

        def schedule(kernel):
            found.append(template_for(kernel, machine=MACHINE))
            return kernel.func

        build_program(step, tuple(v.type.shape for v in step.inputs), (),
                      segment_groups(step, graph.groups), schedule, True)
        ((template, problem),) = found
        assert template is SPMM
        space = SPMM.space(problem, MACHINE)
        space.check(SPMM.default(problem, MACHINE))
        if problem.places % 2:
            with pytest.raises(ConfigError, match="vector divides the places"):
                space.check(SpmmConfig(8, 2, 4, 16))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_spmm_compiles_with_nvrtc(rng, arch):
    funcs = []
    staged = SpmmConfig(16, 4, 8, 32, True, 4)
    for k, (g, config) in enumerate((
            (dense_graph(rng, (64, 96), 80, 0.1, True, True)[0], None),
            (conv_graph(rng, 2, 64, 32, 8, 8, 0.1, True, True)[0], None),
            (dense_graph(rng, (256, 384), 96, 0.1, True, True, slice_depth=128)[0], staged),
            (conv_graph(rng, 2, 256, 64, 8, 8, 0.1, True, True, slice_depth=128)[0],
             staged),
            (window_graph(rng, 2, 64, 64, 14, 14, 3, (1, 1, 1, 1), 1, 0.1, True, 128)[0],
             None))):
        _, program = _scheduled(g, config)
        funcs += [(dataclasses.replace(f, name=f"g{k}_{f.name}"), noalias)
                  for f, noalias in program.unique]
    nvrtc_compiled(render_module(funcs).source, arch)


# -- the rewrite on cuda (its rule: tests/passes/test_find_sparsity.py) ---------------------

def _matmul_graph(rng, m, k, n, density):
    g = Graph("mm")
    a = g.add_input("a", T.TensorType(T.float32, (m, k)))
    w = pruned(rng, (k, n), density)
    g.outputs = [g.add("Relu", g.add("MatMul", a, _const("w", w)))]
    return g, w


# -- on a GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("density", [0.03, 0.05])   # past the GPU rule's break-even
def test_a_pruned_model_runs_sparse_on_the_gpu(rng, density):
    """A pruned MatMul -> Relu and a 1x1 conv chain compiled for cuda: the layers run sparse
    and match the dense product, NaNs included."""
    import dnnc

    g, w = _matmul_graph(rng, 512, 768, 768, density)
    model = dnnc.compile(g, target="cuda", outputs="numpy")
    assert any(n.op == "SparseDense" for n in model.graph.nodes)
    a = _nonfinite(rng, rng.standard_normal((512, 768)).astype(np.float32))
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.maximum(a.astype(np.float64) @ w.astype(np.float64), 0)
    np.testing.assert_allclose(model(a), want, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.gpu
def test_spmm_kernels_on_the_gpu(rng):
    """The host tests' shapes on the device."""
    import dnnc

    for a_shape, n, density, bias, ordered, empty, nonfinite in DENSES:
        g, w, b = dense_graph(rng, a_shape, n, density, bias, ordered, empty)
        a = rng.standard_normal(a_shape).astype(np.float32)
        a = _nonfinite(rng, a) if nonfinite else a
        model = dnnc.compile(g, target="cuda", outputs="numpy")
        np.testing.assert_allclose(model(a), _dense_want(a, w, b), rtol=1e-5, atol=1e-5,
                                   equal_nan=True)
    for n, c, m, h, wid, density, bias, ordered, empty, nonfinite in CONVS:
        g, w, b = conv_graph(rng, n, c, m, h, wid, density, bias, ordered, empty)
        x = rng.standard_normal((n, c, h, wid)).astype(np.float32)
        x = _nonfinite(rng, x) if nonfinite else x
        r = rng.standard_normal((n, m, h, wid)).astype(np.float32)
        model = dnnc.compile(g, target="cuda", outputs="numpy")
        np.testing.assert_allclose(model(x, r), _conv_want(x, r, w, b), rtol=1e-5,
                                   atol=1e-5, equal_nan=True)


@pytest.mark.gpu
def test_staged_spmm_kernels_on_the_gpu(rng):
    """Shapes whose default stages B (a SparseDense of 4096 rows: 8 places a thread; a
    1x1 conv of 784 places an image, 8 images: 4), NaNs included, on the device."""
    import dnnc

    g, w, b = dense_graph(rng, (4096, 256), 768, 0.1, True, True, (3,), slice_depth=128)
    assert _scheduled(g)[1].kernels[0].schedule[1].staged
    a = _nonfinite(rng, rng.standard_normal((4096, 256)).astype(np.float32), 40)
    model = dnnc.compile(g, target="cuda", outputs="numpy")
    np.testing.assert_allclose(model(a), _dense_want(a, w, b), rtol=1e-5, atol=1e-5,
                               equal_nan=True)
    g, w, b = conv_graph(rng, 8, 256, 384, 28, 28, 0.1, True, True, (5,), slice_depth=128)
    assert _scheduled(g)[1].kernels[0].schedule[1].staged
    x = _nonfinite(rng, rng.standard_normal((8, 256, 28, 28)).astype(np.float32), 40)
    r = rng.standard_normal((8, 384, 28, 28)).astype(np.float32)
    model = dnnc.compile(g, target="cuda", outputs="numpy")
    np.testing.assert_allclose(model(x, r), _conv_want(x, r, w, b), rtol=1e-5, atol=1e-5,
                               equal_nan=True)


@needs_gxx
@pytest.mark.emulated_full
def test_a_pruned_product_through_the_rewrite_on_host(rng, tmp_path):
    """BERT-base's FFN expansion at 128 tokens pruned to 97% zeros (past the GPU rule's
    break-even), from the plain MatMul: the rewrite makes it a SparseDense (with its order),
    the SpMM's kernels run on the host and match the dense product, NaNs included."""
    import test_host_semantics as host

    g, w = _matmul_graph(rng, 128, 768, 3072, 0.03)
    graph, (program,) = programs(g, machine=SPARSE_MACHINE)
    assert [k.schedule[0] for k in program.kernels] == ["cuda_spmm"]
    a = _nonfinite(rng, rng.standard_normal((128, 768)).astype(np.float32))
    module = render_module(program.unique)
    lib = host.host_library(program.unique, tmp_path, module)
    got = host.program_on_host(lib, module, program, {"a": a})[graph.outputs[0].name]
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.maximum(a.astype(np.float64) @ w.astype(np.float64), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)



@needs_gxx
@pytest.mark.emulated_full
def test_pruned_convs_through_the_forced_rewrite_on_host(rng, tmp_path, monkeypatch):
    """A pruned 3x3 conv (padded) then a stride-2 1x1 one, with DNNC_SPARSE_GPU=1 (the rule
    takes no windowed conv): both become SparseConvs on the staged SpMM, gathering their
    windows, and match the dense convs on the host, NaNs included."""
    import test_host_semantics as host

    monkeypatch.setenv("DNNC_SPARSE_GPU", "1")
    w1, w2 = pruned(rng, (24, 16, 3, 3), 0.1), pruned(rng, (20, 24, 1, 1), 0.1)
    g = Graph("convs")
    x = g.add_input("x", T.TensorType(T.float32, (2, 16, 9, 9)))
    y = g.add("Relu", g.add("Conv", x, _const("w1", w1), kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1]))
    g.outputs = [g.add("Conv", y, _const("w2", w2), kernel_shape=[1, 1], strides=[2, 2])]
    graph, (program,) = programs(g, machine=SPARSE_MACHINE)
    assert [n.op for n in graph.nodes].count("SparseConv") == 2
    assert all(k.schedule[0] == "cuda_spmm" and k.schedule[1].staged for k in program.kernels)
    xv = _nonfinite(rng, rng.standard_normal((2, 16, 9, 9)).astype(np.float32), 3)
    module = render_module(program.unique)
    lib = host.host_library(program.unique, tmp_path, module)
    got = host.program_on_host(lib, module, program, {"x": xv})[graph.outputs[0].name]
    hidden = np.maximum(_conv_nchw(xv, w1, (1, 1, 1, 1), 1), 0).astype(np.float32)
    want = _conv_nchw(hidden, w2, (0, 0, 0, 0), 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
