"""find_sparsity (issue 34, items 1 and 2): the CSR encoding (rows, slices) and back; what
`measure` names (dense, N:M, blocks, unstructured); the sparse ops' references against the
dense product and their compute rules against their references; which layers the rewrite
("sparse_weights", convert_layout) takes by the cost rule (pruned to 90%: sparse; 0% and
30%: dense; a 3x3 conv against Winograd, a strided one; not a dilated conv, a Gemm with
alpha, a reduced precision); on a GPU target the GPU rule (90% zeros of a large product:
sparse, with its rows' order; 30% and none: dense; never at tf32; never a windowed conv);
and what `dnnc inspect` prints per layer."""

import dataclasses

import numpy as np
import pytest

from dnnc.backends.registry import REGISTRY
from dnnc.compiler.inspect import format_passes, format_summary, pass_report, summarize
from dnnc.ir import types as T
from dnnc.ir.compute import run_rule
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.conv import conv
from dnnc.ir.ops.registry import get_op
from dnnc.ir.ops.sparse import decode_csr, encode_csr, row_max
from dnnc.passes.convert_layout import convert_layout
from dnnc.ir.target import Target
from dnnc.passes.find_sparsity import (SLICE_DEPTH, WINDOW_SLICE_DEPTH, dense_cycles, measure,
                                       row_order, slice_depth, sparse_cycles, sparse_faster)


def pruned(rng, shape, zeros) -> np.ndarray:
    """Normal weights with the `zeros` fraction of smallest magnitudes set to zero."""
    w = rng.standard_normal(shape).astype(np.float32)
    if zeros:
        w[np.abs(w) <= np.quantile(np.abs(w), zeros)] = 0.0
    return w


@pytest.mark.parametrize("shape,slice_depth", [((6, 10), 3), ((7, 600), 256), ((4, 5), 8)])
def test_csr_encodes_rows_and_slices_and_decodes_back(rng, shape, slice_depth):
    w = pruned(rng, shape, 0.7)
    w[2] = 0.0   # a row without entries
    values, columns, starts = encode_csr(w, slice_depth)
    slices = -(-shape[1] // slice_depth)
    assert starts.shape == (shape[0], slices + 1) and starts.dtype == np.int32
    assert values.size == np.count_nonzero(w) and starts[-1, -1] == values.size
    np.testing.assert_array_equal(starts[1:, 0], starts[:-1, -1])
    for j in range(shape[0]):
        for s in range(slices):
            cols = columns[starts[j, s]:starts[j, s + 1]]
            assert np.all(cols // slice_depth == s) and np.all(np.diff(cols) > 0)
    np.testing.assert_array_equal(decode_csr(values, columns, starts, shape[1]), w)
    assert row_max(starts) == max(np.count_nonzero(w, axis=1))


def test_a_matrix_of_zeros_keeps_one_zero_entry():
    values, columns, starts = encode_csr(np.zeros((3, 5), np.float32), 4)
    assert values.tolist() == [0.0] and columns.tolist() == [0] and not starts.any()
    assert row_max(starts) == 1
    assert not decode_csr(values, columns, starts, 5).any()


def test_measure_names_the_structure(rng):
    w = rng.standard_normal((16, 32)).astype(np.float32) + 10   # no zeros
    assert measure(w).structure == "dense" and measure(w).density == 1.0
    two_four = w.copy()
    two_four.reshape(16, 8, 4)[:, :, 1::2] = 0   # 2 of every 4 along the reduction
    assert measure(two_four).structure == "2:4" and measure(two_four).density == 0.5
    one_four = w.copy()
    one_four.reshape(16, 8, 4)[:, :, 1:] = 0
    assert measure(one_four).structure == "1:4"
    rows = w.copy()
    mask = np.kron(rng.random((4, 32)) < 0.5, np.ones((4, 1), bool))   # blocks of 4 outputs
    mask[:4, 0] = True
    rows[mask] = 0
    assert measure(rows).structure == "block 4x1"
    cols = w.copy()
    mask = np.kron(rng.random((16, 4)) < 0.5, np.ones((1, 8), bool))
    mask[0, :8] = True
    cols[mask] = 0
    assert measure(cols).structure == "block 1x8"
    loose = pruned(rng, (16, 32), 0.7)
    found = measure(loose)
    assert found.structure == "unstructured" and abs(found.density - 0.3) < 0.01
    assert str(found) == "70% zeros, unstructured"


def test_the_sparse_references_are_the_dense_products(rng):
    w = pruned(rng, (9, 40), 0.8)
    values, columns, starts = encode_csr(w, 16)
    bias = rng.standard_normal(9).astype(np.float32)
    attrs = {"row_max": row_max(starts), "slice_depth": 16}
    a = rng.standard_normal((2, 3, 40)).astype(np.float32)
    dense = get_op("SparseDense").evaluate(a, values, columns, starts, bias, n=9, **attrs)
    np.testing.assert_allclose(dense, a @ w.T + bias, rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((2, 40, 3, 5)).astype(np.float32)
    pointwise = get_op("SparseConv").evaluate(x, values, columns, starts, bias, oc=9, **attrs)
    np.testing.assert_allclose(pointwise, np.einsum("mc,nchw->nmhw", w, x) +
                               bias.reshape(1, -1, 1, 1), rtol=1e-5, atol=1e-5)
    # a 3x3 window, padded unevenly: the columns (c, ky, kx)
    w3 = pruned(rng, (9, 40 * 9), 0.8)
    v3, c3, s3 = encode_csr(w3, 16)
    window = {"row_max": row_max(s3), "slice_depth": 16, "kernel_shape": [3, 3],
              "pads": [1, 0, 2, 1]}
    conv3 = get_op("SparseConv").evaluate(x, v3, c3, s3, bias, oc=9, **window)
    np.testing.assert_allclose(conv3, conv(x, w3.reshape(9, 40, 3, 3), bias, pads=[1, 0, 2, 1]),
                               rtol=1e-5, atol=1e-5)
    # the compute rules (a masked reduction over row_max entries) mean the same
    got = run_rule("SparseConv", [x, v3, c3, s3, bias], {"oc": 9, **window},
                   const_inputs=(1, 2, 3, 4))[0]
    np.testing.assert_allclose(got, conv3, rtol=1e-5, atol=1e-5)
    for op, data, extra in (("SparseDense", a, {"n": 9}), ("SparseConv", x, {"oc": 9})):
        want = get_op(op).evaluate(data, values, columns, starts, bias, **extra, **attrs)
        got = run_rule(op, [data, values, columns, starts, bias], {**extra, **attrs},
                       const_inputs=(1, 2, 3, 4))[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        # the rows' order (a GPU's swizzle) changes nothing, with or without a bias
        order = row_order(starts)
        for b in (bias, None):
            np.testing.assert_array_equal(
                get_op(op).evaluate(data, values, columns, starts, b, order, **extra,
                                    **attrs),
                get_op(op).evaluate(data, values, columns, starts, b, **extra, **attrs))


def _const(name, array) -> Value:
    return Value(name, T.TensorType(T.float32, array.shape), const=array)


def _layers(rng, zeros) -> Graph:
    """MatMul (BERT's FFN shapes at 64 tokens), Gemm with bias, a 1x1 and a 3x3 conv, each
    with weights pruned to `zeros`."""
    g = Graph("layers")
    a = g.add_input("a", T.TensorType(T.float32, (64, 768)))
    h = g.add("MatMul", a, _const("w1", pruned(rng, (768, 3072), zeros)))
    h = g.add("Gemm", h, _const("w2", pruned(rng, (768, 3072), zeros)),
              _const("b2", rng.standard_normal(768).astype(np.float32)), transB=1)
    x = g.add_input("x", T.TensorType(T.float32, (1, 256, 28, 28)))
    y = g.add("Conv", x, _const("w3", pruned(rng, (512, 256, 1, 1), zeros)),
              kernel_shape=[1, 1])
    y = g.add("Conv", y, _const("w4", pruned(rng, (64, 512, 3, 3), zeros)),
              kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = g.add("Conv", y, _const("w5", pruned(rng, (128, 64, 1, 1), zeros)),
              kernel_shape=[1, 1], strides=[2, 2])
    g.outputs = [h, y]
    return g


@pytest.mark.parametrize("zeros,sparse", [(0.0, 0), (0.3, 0), (0.9, 5)])
def test_the_rewrite_takes_the_layers_estimated_faster(rng, zeros, sparse):
    g = _layers(rng, zeros)
    convert_layout(g, REGISTRY["llvm"].target())
    ops = [n.op for n in g.nodes]
    assert sum(op in ("SparseDense", "SparseConv") for op in ops) == sparse, ops
    if sparse:
        assert ops == ["SparseDense", "SparseDense", "SparseConv", "SparseConv", "SparseConv"]
        node = g.nodes[0]
        assert node.attrs["structure"] == "unstructured"
        assert abs(node.attrs["density"] - 0.1) < 0.01
        assert node.attrs["slice_depth"] == SLICE_DEPTH
        assert len(g.nodes[1].inputs) == 5   # the Gemm's C as the bias
        assert g.nodes[3].attrs["kernel_shape"] == [3, 3]
        assert g.nodes[3].attrs["slice_depth"] == 288   # 4608 deep, 28 x 30 places
        assert g.nodes[4].attrs["slice_depth"] == 64   # strided, windowed: one even slice
        assert g.nodes[3].attrs["pads"] == [1, 1, 1, 1]
        assert g.nodes[4].attrs["strides"] == [2, 2]


def test_a_windowed_conv_of_several_blocks_is_sliced_evenly():
    """At most WINDOW_SLICE_DEPTH columns a slice, as few slices as that allows, their
    depth even; one block of places (a 7x7 image), a 1x1 conv and a product keep
    SLICE_DEPTH."""
    assert WINDOW_SLICE_DEPTH == 288
    for depth, want in ((576, 288), (1152, 288), (2304, 288), (600, 200), (147, 147),
                        (289, 145)):
        assert slice_depth(depth, 56 * 58, True, 16) == want, depth
    assert slice_depth(4608, 7 * 9, True, 16) == SLICE_DEPTH
    assert slice_depth(4608, 7 * 9, True, 4) == 288   # 63 places: past 4 vectors of 4
    assert slice_depth(576, 3136, False, 16) == SLICE_DEPTH


def test_the_rewrite_keeps_what_it_does_not_compute(rng):
    g = Graph("kept")
    a = g.add_input("a", T.TensorType(T.float32, (64, 768)))
    w = pruned(rng, (768, 768), 0.95)
    g.outputs = [g.add("Gemm", a, _const("w", w), alpha=0.5),
                 g.add("Conv", g.add_input("x", T.TensorType(T.float32, (1, 192, 8, 8))),
                       _const("k", w.reshape(768, 192, 2, 2)), kernel_shape=[2, 2],
                       dilations=[2, 2])]
    target = REGISTRY["llvm"].target()
    convert_layout(g, target)
    assert [n.op for n in g.nodes] == ["MatMulPacked", "ConvPacked"]
    g = Graph("bf16")
    a = g.add_input("a", T.TensorType(T.float32, (64, 768)))
    g.outputs = [g.add("MatMul", a, _const("w", w))]
    convert_layout(g, REGISTRY["llvm"].target(None, "bf16"))
    assert [n.op for n in g.nodes] == ["MatMulPacked"]


def test_weights_of_few_zeros_stay_dense_whatever_the_estimate(rng):
    """A 3-channel 3x3 conv of no zero weight: the cost model called it faster in CSR
    (test_templates' conv went sparse); above MAX_DENSITY nonzeros nothing is rewritten."""
    g = Graph("small")
    x = g.add_input("x", T.TensorType(T.float32, (1, 3, 9, 7)))
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    g.outputs = [g.add("Conv", x, _const("w", w), kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    convert_layout(g, REGISTRY["llvm"].target())
    assert [n.op for n in g.nodes] == ["ConvPacked"]


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_the_cost_rule_keeps_50_percent_dense_and_takes_90(lanes):
    """On resnet50's, mobilenet_v2's and BERT's layer shapes (a classifier at batch 1 and
    BERT's FFN at 128 tokens as SparseDense, their rows of A transposed; 1x1 convs at 56x56,
    28x28 and 7x7)."""
    for places, rows, depth, transposed in (
            (1, 1000, 2048, True), (128, 768, 3072, True), (128, 3072, 768, True),
            (3136, 64, 256, False), (784, 128, 512, False), (49, 512, 2048, False),
            (49, 960, 160, False)):
        dense = dense_cycles(places, rows, depth, lanes)
        for zeros in (0.0, 0.3, 0.5):
            nnz = int((1 - zeros) * rows * depth)
            assert sparse_cycles(places, rows, depth, nnz, lanes, transposed) > dense, \
                (places, zeros)
        nnz = int(0.1 * rows * depth)
        assert sparse_cycles(places, rows, depth, nnz, lanes, transposed) < dense, places
    assert not sparse_faster(64, np.ones((10, 10), np.float32), 16)


def test_inspect_prints_each_layer_and_counts_the_sparse_ones(rng):
    g = _layers(rng, 0.9)
    text = format_summary(summarize(g))
    assert "sparse weights: 5 product(s) with zeros" in text
    lines = [x for x in text.splitlines() if "zeros  " in x]
    assert len(lines) == 5 and all("90.0% zeros  unstructured" in x for x in lines), lines
    rows = pass_report(g, "llvm")
    assert rows[-1].sparse == 5 and rows[0].sparse == 0
    assert "sparse: 5 of 5 float products run as sparse ops" in \
        format_passes(rows, "llvm", 3)
    dense = _layers(rng, 0.0)
    assert "sparse weights" not in format_summary(summarize(dense))
    assert summarize(dense).to_dict()["sparsity"] == []


# -- the GPU's rule ---------------------------------------------------------------------------

GPU_TARGET = Target("cuda", arch="sm_90", layouts=("sparse_weights",))
"""A GPU target without its figures (the rule then reads the reference GPU's)."""


def _matmul(rng, m, k, n, zeros) -> tuple[Graph, np.ndarray]:
    g = Graph("mm")
    a = g.add_input("a", T.TensorType(T.float32, (m, k)))
    w = pruned(rng, (k, n), zeros)
    g.outputs = [g.add("Relu", g.add("MatMul", a, _const("w", w)))]
    return g, w


def test_a_gpu_takes_a_pruned_product_with_its_row_order(rng):
    """97% zeros: well past the fitted break-even (test_a_gpu_keeps_products_dense_below_its_
    break_even)."""
    g, w = _matmul(rng, 512, 768, 768, 0.97)
    convert_layout(g, GPU_TARGET)
    (node,) = [n for n in g.nodes if n.op == "SparseDense"]
    order = node.inputs[5].const
    assert node.inputs[4] is None   # (no bias)
    assert sorted(order) == list(range(768))
    assert np.all(np.diff(np.count_nonzero(w, axis=0)[order]) <= 0)   # most entries first


def test_the_row_order_is_by_count_most_first_ties_in_row_order():
    w = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 0, 1], [1, 1, 1]], np.float32)
    _, _, starts = encode_csr(w, 2)
    assert row_order(starts).tolist() == [4, 1, 3, 0, 2]


@pytest.mark.parametrize("zeros", [0.0, 0.3, 0.7])
def test_a_gpu_keeps_products_dense_below_its_break_even(rng, zeros):
    """Up to 70% zeros a product stays dense (measured on an H200: 0.44-0.91 of dense at 70%,
    bench/gpu_sparse.py)."""
    g, _ = _matmul(rng, 512, 768, 768, zeros)
    assert convert_layout(g, GPU_TARGET) == 0


@pytest.mark.parametrize("m, k, n, sparse", [(4096, 768, 3072, True), (4096, 3072, 768, False),
                                             (128, 768, 768, False), (128, 768, 3072, True)])
def test_a_gpu_takes_90_percent_products_where_the_spmm_won(rng, m, k, n, sparse):
    """At 90% zeros, as measured (session 54): BERT-base's 768->3072 at batch 32 and 1 goes
    sparse (1.09x, 1.32x); its 3072->768 stays dense (307 entries a row, past
    GPU_MAX_ROW_ENTRIES: 0.93x), and 768->768 at batch 1 (0.95x: under GPU_MARGIN)."""
    g, _ = _matmul(rng, m, k, n, 0.9)
    assert convert_layout(g, GPU_TARGET) == int(sparse)


def test_a_gpu_keeps_products_dense_at_a_reduced_precision(rng):
    g, _ = _matmul(rng, 512, 768, 768, 0.9)
    assert convert_layout(g, dataclasses.replace(GPU_TARGET, precision="tf32")) == 0


def test_a_gpu_takes_no_windowed_conv(rng):
    """A 3x3 conv pruned to 95% stays a Conv on a GPU (its SpMM takes 1x1 convs only); a
    1x1 one of the same image goes sparse."""
    for k, sparse in ((3, False), (1, True)):
        g = Graph("conv")
        x = g.add_input("x", T.TensorType(T.float32, (32, 256, 28, 28)))
        w = pruned(rng, (256, 256, k, k), 0.95)
        g.outputs = [g.add("Conv", x, _const("w", w), kernel_shape=[k, k],
                           pads=[k // 2] * 4)]
        convert_layout(g, GPU_TARGET)
        assert (g.nodes[0].op == "SparseConv") == sparse, k
