"""The sparse-weights template (issue 34, item 3) on llvm: SparseConv (1x1, and k x k
windows through padded planes, strided through their phases) and SparseDense
kernels built from pruned weights at several densities (all zeros, 5%, 30%, 70%, every
weight), encoded with slices of the depth small enough that a row spans several, against the
float64 product of the dense weights on fresh random inputs; with and without bias, with a
fused epilogue reading a residual, tails of places that fill no block, rows of no entries, at
1 and 2 threads; and the rewrite end to end: a pruned MatMul / Conv compiled from the plain
ops runs sparse and matches, a dense one stays dense."""

import dataclasses

import numpy as np
import pytest

from dnnc.backends.llvm.entry import runtime
from dnnc.backends.llvm.schedules import template_for
from dnnc.backends.lower import lower_group
from dnnc.backends.registry import REGISTRY
from dnnc.compiler.module import CompiledModel
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.conv import conv
from dnnc.ir.ops.sparse import encode_csr, row_max
from dnnc.passes.manager import optimize

DENSITIES = (0.0, 0.05, 0.3, 0.7, 1.0)


def pruned(rng, shape, density) -> np.ndarray:
    """Normal weights with each kept with probability `density` (magnitude-free: the
    template does not care which survive)."""
    w = rng.standard_normal(shape).astype(np.float32)
    w[rng.random(shape) >= density] = 0.0
    return w


def _const(name, array) -> Value:
    return Value(name, T.TensorType(T.float32 if array.dtype == np.float32 else T.int32,
                                    array.shape), const=array)


def _csr(w, slice_depth) -> tuple[list[Value], dict]:
    values, columns, starts = encode_csr(w, slice_depth)
    return [_const("values", values), _const("columns", columns), _const("starts", starts)], \
        {"row_max": row_max(starts), "slice_depth": slice_depth}


def compiled(graph: Graph, threads: int, layouts=None) -> CompiledModel:
    target = dataclasses.replace(REGISTRY["llvm"].target(), threads=threads)
    if layouts is not None:
        target = dataclasses.replace(target, layouts=layouts)
    graph = optimize(graph, target)
    return CompiledModel(graph, runtime(graph, 3, target), "llvm")


def sparse_conv_graph(rng, n, c, m, h, wid, density, bias, residual, slice_depth, k=1,
                      pads=(0, 0, 0, 0), stride=1):
    """SparseConv k x k (+ bias) (+ residual) -> Relu; the graph and its dense weights [m, c,
    k, k]."""
    w = pruned(rng, (m, c, k, k), density)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    g = Graph("sparse_conv")
    x = g.add_input("x", T.TensorType(T.float32, (n, c, h, wid)))
    csr, attrs = _csr(w.reshape(m, -1), slice_depth)
    inputs = [x] + csr + ([_const("b", b)] if bias else [])
    y = g.add("SparseConv", *inputs, oc=m, kernel_shape=[k, k], pads=list(pads),
              strides=[stride, stride], **attrs)
    if residual:
        y = g.add("Add", y, g.add_input("r", y.type))
    g.outputs = [g.add("Relu", y)]
    return g, w, b


CONVS = [  # (n, c, m, h, w, slice_depth, k, pads, stride): tails of places, several slices, a
    # one-pixel image; 3x3 and 5x5 windows padded evenly, unevenly or not at all; strides 2
    # and 3 (phases), a 7x7 stem
    (1, 24, 20, 7, 9, 256, 1, (0, 0, 0, 0), 1), (2, 40, 33, 5, 5, 16, 1, (0, 0, 0, 0), 1),
    (1, 70, 17, 11, 13, 32, 1, (0, 0, 0, 0), 1), (3, 9, 8, 1, 1, 4, 1, (0, 0, 0, 0), 1),
    (1, 8, 5, 6, 7, 16, 3, (1, 1, 1, 1), 1), (2, 20, 33, 9, 5, 32, 3, (1, 0, 2, 1), 1),
    (1, 16, 24, 14, 14, 256, 3, (1, 1, 1, 1), 1), (1, 4, 3, 9, 8, 8, 5, (2, 2, 2, 2), 1),
    (1, 6, 7, 8, 9, 16, 3, (0, 0, 0, 0), 1), (2, 12, 20, 9, 8, 16, 1, (0, 0, 0, 0), 2),
    (1, 16, 24, 14, 15, 32, 3, (1, 1, 1, 1), 2), (1, 3, 8, 17, 16, 64, 7, (3, 3, 3, 3), 2),
    (1, 5, 4, 12, 13, 16, 3, (0, 1, 1, 0), 3)]


@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("shape", CONVS, ids=[str(s) for s in CONVS])
@pytest.mark.parametrize("threads", [1, 2])
def test_sparse_conv_matches_the_dense_product(rng, density, shape, threads):
    n, c, m, h, wid, slice_depth, k, pads, stride = shape
    residual = density in (0.05, 0.7)
    bias = density != 0.3
    g, w, b = sparse_conv_graph(rng, n, c, m, h, wid, density, bias, residual, slice_depth,
                                k, pads, stride)
    model = compiled(g, threads)
    feeds = [rng.standard_normal((n, c, h, wid)).astype(np.float32)]
    want = conv(feeds[0].astype(np.float64), w.astype(np.float64),
                None if b is None else b.astype(np.float64), pads=list(pads),
                strides=[stride, stride])
    if residual:
        feeds.append(rng.standard_normal(want.shape).astype(np.float32))
        want = want + feeds[1]
    got = model(*feeds)
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-5, atol=1e-5)


def sparse_dense_graph(rng, a_shape, n, density, bias, slice_depth):
    w = pruned(rng, (n, a_shape[-1]), density) / np.float32(np.sqrt(a_shape[-1]))
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    g = Graph("sparse_dense")
    a = g.add_input("a", T.TensorType(T.float32, a_shape))
    csr, attrs = _csr(w, slice_depth)
    y = g.add("SparseDense", *([a] + csr + ([_const("b", b)] if bias else [])), n=n, **attrs)
    g.outputs = [g.add("Tanh", y)]
    return g, w, b


DENSES = [  # (A's shape, n, slice_depth): one row (a classifier at batch 1), rows that fill
    # no block, a batch of sequences, several slices; enough work for 2 threads to share
    # units whose blocks differ in width, over slices (their partial sums' slots)
    ((1, 50), 30, 256), ((37, 45), 29, 16), ((2, 9, 64), 48, 20), ((70, 21), 5, 8),
    ((70, 600), 300, 256)]


@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("shape", DENSES, ids=[str(s) for s in DENSES])
@pytest.mark.parametrize("threads", [1, 2])
def test_sparse_dense_matches_the_dense_product(rng, density, shape, threads):
    a_shape, n, slice_depth = shape
    bias = density != 0.7
    g, w, b = sparse_dense_graph(rng, a_shape, n, density, bias, slice_depth)
    model = compiled(g, threads)
    a = rng.standard_normal(a_shape).astype(np.float32)
    want = a.astype(np.float64) @ w.T.astype(np.float64)
    if bias:
        want = want + b
    np.testing.assert_allclose(model(a), np.tanh(want), rtol=1e-5, atol=1e-5)


def test_the_sparse_template_schedules_both_ops(rng):
    for g, windowed in ((sparse_conv_graph(rng, 1, 24, 20, 7, 9, 0.3, True, False, 16)[0], False),
                        (sparse_conv_graph(rng, 1, 3, 20, 7, 9, 0.3, True, False, 16, 3,
                                           (1, 1, 1, 1))[0], True),
                        (sparse_dense_graph(rng, (5, 30), 7, 0.3, True, 16)[0], False)):
        kernel = lower_group(g.nodes, "k", outputs=g.outputs)
        template, problem = template_for(kernel)
        assert template.name == "sparse"
        assert problem.slices == 2 and problem.windowed == windowed


@pytest.mark.parametrize("threads,groups", [(1, 1), (2, 2), (4, 4)])
def test_one_block_of_places_is_split_into_a_row_group_a_thread(rng, threads, groups):
    """A 7x7 image is one block: its rows are dealt over one unit a thread (each unit packs
    the block again: at 1 thread, one)."""
    g = sparse_conv_graph(rng, 1, 64, 96, 7, 7, 0.1, False, False, 256)[0]
    kernel = lower_group(g.nodes, "k", outputs=g.outputs)
    machine = dataclasses.replace(REGISTRY["llvm"].target(), threads=threads)
    template, problem = template_for(kernel, machine=machine)
    assert template.default(problem, machine).row_groups == groups


def _pruned_model(rng, density):
    """1x1 Conv -> Relu -> Flatten -> MatMul + bias, weights pruned to `density`."""
    g = Graph("pruned")
    x = g.add_input("x", T.TensorType(T.float32, (1, 128, 14, 14)))
    w = pruned(rng, (256, 128, 1, 1), density) / np.float32(np.sqrt(128))
    y = g.add("Relu", g.add("Conv", x, _const("w", w), kernel_shape=[1, 1]))
    f = g.add("Flatten", g.add("GlobalAveragePool", y))
    w2 = pruned(rng, (256, 300), density) / np.float32(np.sqrt(256))
    b2 = rng.standard_normal(300).astype(np.float32)
    g.outputs = [g.add("Add", g.add("MatMul", f, _const("w2", w2)), _const("b2", b2))]
    return g, w[:, :, 0, 0], w2, b2


@pytest.mark.parametrize("density,sparse", [(0.08, True), (1.0, False), (0.7, False)])
def test_a_pruned_model_runs_sparse_and_matches(rng, density, sparse):
    g, w, w2, b2 = _pruned_model(rng, density)
    model = compiled(g, 2)
    ops = {n.op for n in model.graph.nodes}
    assert ("SparseConv" in ops and "SparseDense" in ops) == sparse, ops
    assert ("ConvPacked" in ops) != sparse, ops
    x = rng.standard_normal((1, 128, 14, 14)).astype(np.float32)
    y = np.maximum(np.einsum("mc,nchw->nmhw", w.astype(np.float64), x), 0).mean(axis=(2, 3))
    np.testing.assert_allclose(model(x), y @ w2 + b2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_pruned_3x3_conv_in_even_slices_matches(rng, threads):
    """A 3x3 conv over 64 channels of a 28x28 image (576 deep, several blocks of places)
    through the rewrite: two slices of 288 (find_sparsity.slice_depth), the dense product's
    result."""
    g = Graph("conv3x3")
    x = g.add_input("x", T.TensorType(T.float32, (1, 64, 28, 28)))
    w = pruned(rng, (64, 64, 3, 3), 0.05) / np.float32(24)
    g.outputs = [g.add("Relu", g.add("Conv", x, _const("w", w), kernel_shape=[3, 3],
                                     pads=[1, 1, 1, 1]))]
    model = compiled(g, threads)
    [node] = [n for n in model.graph.nodes if n.op == "SparseConv"]
    assert node.attrs["slice_depth"] == 288
    data = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    want = np.maximum(conv(data.astype(np.float64), w.astype(np.float64), None,
                           pads=[1, 1, 1, 1], strides=[1, 1]), 0)
    np.testing.assert_allclose(model(data), want, rtol=1e-4, atol=1e-4)


def test_without_the_layout_a_pruned_model_stays_dense(rng):
    """The dense fallback: a target not listing "sparse_weights" packs the pruned weights
    as dense ones, and computes the same."""
    g, w, w2, b2 = _pruned_model(rng, 0.08)
    layouts = tuple(x for x in REGISTRY["llvm"].target().layouts if x != "sparse_weights")
    dense, sparse = compiled(g, 1, layouts), compiled(g, 1)
    assert not {n.op for n in dense.graph.nodes} & {"SparseConv", "SparseDense"}
    x = rng.standard_normal((1, 128, 14, 14)).astype(np.float32)
    np.testing.assert_allclose(sparse(x), dense(x), rtol=1e-5, atol=1e-5)


def test_a_sparse_model_saves_and_loads(rng, tmp_path):
    """The CSR constants and the sparse ops' attributes travel in the artifact."""
    import dnnc

    g, _, _, _ = _pruned_model(rng, 0.08)
    model = compiled(g, 1)
    model.save(tmp_path / "pruned.dnnc")
    loaded = dnnc.load(tmp_path / "pruned.dnnc")
    assert [n.op for n in loaded.graph.nodes if n.op.startswith("Sparse")] == \
        ["SparseConv", "SparseDense"]
    x = rng.standard_normal((1, 128, 14, 14)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), model(x))


@pytest.mark.parametrize("mattr", ["-avx512f", "-avx512f,-avx2,-avx,-fma"])
def test_narrower_vectors_compute_the_same(rng, mattr):
    """On this CPU with AVX-512 (and AVX2) forced off: 8- and 4-lane blocks, the cost rule
    reading the narrower vectors."""
    import dnnc
    from dnnc.backends.llvm.cpu import cpu_from

    g, w, w2, b2 = _pruned_model(rng, 0.08)
    model = dnnc.compile(g, "llvm", cpu=cpu_from(None, mattr), cache=False)
    assert {"SparseConv", "SparseDense"} <= {n.op for n in model.graph.nodes}
    x = rng.standard_normal((1, 128, 14, 14)).astype(np.float32)
    y = np.maximum(np.einsum("mc,nchw->nmhw", w.astype(np.float64), x), 0).mean(axis=(2, 3))
    np.testing.assert_allclose(model(x), y @ w2 + b2, rtol=1e-5, atol=1e-5)


def _plant_nonfinite(rng, x) -> np.ndarray:
    """x with NaN, +inf and -inf planted at a few random elements each."""
    x = x.copy()
    flat = x.reshape(-1)
    spots = rng.choice(flat.size, size=min(3 * 4, flat.size), replace=False)
    flat[spots[0::3]], flat[spots[1::3]], flat[spots[2::3]] = np.nan, np.inf, -np.inf
    return x


NONFINITE_CONVS = [  # (n, c, m, h, w, slice_depth, k, pads, stride): 1x1 and 3x3, strides 1
    # and 2, one slice and several
    (1, 24, 20, 7, 9, 256, 1, (0, 0, 0, 0), 1), (2, 40, 33, 5, 5, 16, 1, (0, 0, 0, 0), 1),
    (2, 12, 20, 9, 8, 16, 1, (0, 0, 0, 0), 2), (1, 8, 5, 6, 7, 16, 3, (1, 1, 1, 1), 1),
    (1, 16, 24, 14, 15, 32, 3, (1, 1, 1, 1), 2)]


@pytest.mark.parametrize("shape", NONFINITE_CONVS, ids=[str(s) for s in NONFINITE_CONVS])
def test_a_sparse_conv_propagates_nonfinite_inputs_as_the_dense_one(rng, shape):
    """A NaN or infinite activation times a pruned (zero) weight is NaN, as in the dense
    product: skipping the zero weight must not drop it (the outputs NaN where the dense
    product's are, before the bias)."""
    n, c, m, h, wid, slice_depth, k, pads, stride = shape
    w = pruned(rng, (m, c, k, k), 0.1)
    b = rng.standard_normal(m).astype(np.float32)
    g = Graph("sparse_conv_nan")
    x = g.add_input("x", T.TensorType(T.float32, (n, c, h, wid)))
    csr, attrs = _csr(w.reshape(m, -1), slice_depth)
    g.outputs = [g.add("SparseConv", x, *csr, _const("b", b), oc=m, kernel_shape=[k, k],
                       pads=list(pads), strides=[stride, stride], **attrs)]
    feed = _plant_nonfinite(rng, rng.standard_normal((n, c, h, wid)).astype(np.float32))
    with np.errstate(invalid="ignore"):
        want = conv(feed.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                    pads=list(pads), strides=[stride, stride])
    assert np.isnan(want).any()
    np.testing.assert_allclose(compiled(g, 1)(feed), want, rtol=1e-5, atol=1e-5,
                               equal_nan=True)


@pytest.mark.parametrize("shape", DENSES[:4], ids=[str(s) for s in DENSES[:4]])
def test_a_sparse_dense_propagates_nonfinite_inputs_as_the_dense_one(rng, shape):
    a_shape, n, slice_depth = shape
    w = pruned(rng, (n, a_shape[-1]), 0.1)
    g = Graph("sparse_dense_nan")
    a = g.add_input("a", T.TensorType(T.float32, a_shape))
    csr, attrs = _csr(w, slice_depth)
    g.outputs = [g.add("SparseDense", a, *csr, n=n, **attrs)]
    feed = _plant_nonfinite(rng, rng.standard_normal(a_shape).astype(np.float32))
    with np.errstate(invalid="ignore"):
        want = feed.astype(np.float64) @ w.T.astype(np.float64)
    assert np.isnan(want).any()
    np.testing.assert_allclose(compiled(g, 1)(feed), want, rtol=1e-5, atol=1e-5,
                               equal_nan=True)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_1x1_sparse_conv_read_in_place_propagates_nonfinite_inputs(rng, pack, prefetch):
    """The config reading a 1x1 conv's activations in place (pack=False: its flags found by a
    pass of their own) and the packed one, with and without the rows' prefetches (3 slices:
    a row fetches the entries of a later one, the last rows none past the end), built through
    schedule_kernel and run."""
    import ctypes

    from dnnc.backends.llvm.codegen import ModuleBuilder
    from dnnc.backends.llvm.cpu import host_target
    from dnnc.backends.llvm.jit import JITModule
    from dnnc.backends.llvm.schedules import schedule_kernel
    from dnnc.backends.llvm.sparse import SparseConfig

    n, c, m, h, wid = 2, 40, 33, 5, 7
    w = pruned(rng, (m, c, 1, 1), 0.1)
    b = rng.standard_normal(m).astype(np.float32)
    g = Graph("sparse_conv_nan")
    x = g.add_input("x", T.TensorType(T.float32, (n, c, h, wid)))
    csr, attrs = _csr(w.reshape(m, -1), 16)
    g.outputs = [g.add("SparseConv", x, *csr, _const("b", b), oc=m, **attrs)]
    feed = _plant_nonfinite(rng, rng.standard_normal((n, c, h, wid)).astype(np.float32))
    with np.errstate(invalid="ignore"):
        want = conv(feed.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    kernel = lower_group(g.nodes, "k", outputs=g.outputs)
    func = schedule_kernel(kernel, host_target(), config=SparseConfig(16, 2, 2, pack, prefetch))
    mb = ModuleBuilder("nan")
    mb.add(func)
    jit = JITModule(str(mb), host_target(), 2)
    inputs = [feed if v is x else np.ascontiguousarray(v.const) for v in kernel.inputs]
    got = np.zeros(want.shape, np.float32)
    arrays = inputs + [got]
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(jit.address(f"{func.name}_packed"))(
        (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays]), (ctypes.c_int64 * 1)())
    assert np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def _default_places(graph) -> int:
    from dnnc.backends.llvm.cpu import host_target
    from dnnc.backends.llvm.sparse import default

    _, problem = template_for(lower_group(graph.nodes, "k", outputs=graph.outputs))
    machine = host_target()
    return default(problem, machine).places // (machine.vector_bits // 32)


@pytest.mark.parametrize("depth,vectors", [(768, 4), (3072, 2)])
def test_a_shallow_sparse_product_computes_four_vectors_of_places(rng, depth, vectors):
    """BERT's products at 128 tokens: 768 deep (3 slices of 256) in blocks of 4 vectors of
    places, 3072 deep (12 slices: the partial sums between them) in blocks of 2; a 1x1 conv
    of as many slices likewise, a 3x3 one (its padded planes) in 2."""
    assert _default_places(sparse_dense_graph(rng, (128, depth), 64, 0.05, False, 256)[0]) \
        == vectors
    conv = sparse_conv_graph(rng, 1, depth, 32, 28, 28, 0.05, True, False, 256)[0]
    assert _default_places(conv) == vectors
    window = sparse_conv_graph(rng, 1, 16, 32, 28, 28, 0.05, True, False, 256, 3,
                               (1, 1, 1, 1))[0]
    assert _default_places(window) == 2
