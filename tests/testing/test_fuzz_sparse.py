"""The differential fuzzer's layers with sparse weights (issue 34): what the sparse cases hold,
that the other cases stay as they were, that the comparison catches bugs sparse kernels make,
and a seeded batch on the llvm target."""

import numpy as np
import pytest
from onnx import numpy_helper

from dnnc.compiler.sparsify import constant_tensors, find_layers, zero_fraction
from dnnc.testing.generate import SPARSE_RATE, generate, sparse_case
from fuzz_checks import cases_a_planted_bug_changes, seeded_batch_finds_nothing

SPARSE_SEED = 34


def _sparse_cases(n=60):
    return [generate(SPARSE_SEED, i, ("sparse",)) for i in range(n)]


def _weights(case):
    """(layer, its weight's zero fraction) of each layer with a constant weight."""
    tensors = constant_tensors(case.model)
    for layer in find_layers(case.model):
        yield layer, zero_fraction(layer, tensors)


def test_sparse_cases_draw_every_density_pattern_and_weight_form():
    layers = [(c, l, z) for c in _sparse_cases() for l, z in _weights(c)]
    zeros = [z for _, _, z in layers]
    assert sum(z == 1.0 for z in zeros) >= 3          # whole tensors of zeros
    assert sum(z == 0.0 for z in zeros) >= 10         # dense ones (and the other generators')
    assert sum(0.85 < z < 0.99 for z in zeros) >= 5   # 90% and 97%
    assert {"DequantizeLinear", "Cast", ""} <= {l.via for _, l, _ in layers}
    assert {"Conv", "MatMul", "Gemm"} <= {l.op for _, l, _ in layers}
    assert max(l.matrix_shape[1] for _, l, _ in layers) >= 64   # reductions past the small

    def matrix(case, layer):
        w = numpy_helper.to_array(constant_tensors(case.model)[layer.weight])
        return layer.to_matrix(w.astype(np.float32)) != 0

    two_of_four = blocks = empty_rows = 0
    for case, layer, z in layers:
        if not 0 < z < 1:
            continue
        m = matrix(case, layer)
        rows, cols = m.shape
        if cols % 4 == 0 and cols >= 8 and (m.reshape(rows, -1, 4).sum(-1) <= 2).all():
            two_of_four += z >= 0.5
        if rows % 4 == 0 and rows >= 8:
            b = m.reshape(rows // 4, 4, cols)
            blocks += bool((b.all(1) | ~b.any(1)).all() and b.any())
        empty_rows += bool((~m.any(1)).any() and m.any())
    assert two_of_four >= 3 and blocks >= 3 and empty_rows >= 3, (two_of_four, blocks,
                                                                  empty_rows)


def test_other_cases_stay_as_they_were():
    """A case draws sparse layers only when its own stream says so (or with --boost sparse):
    the rest are the cases of before, the regression cases tests pin among them."""
    drawn = [sparse_case(10, i) for i in range(1000)]
    assert abs(np.mean(drawn) - SPARSE_RATE) < 0.03
    pinned = [(3132, 29), (3132, 60), (3132, 171), (3132, 251), (3, 14), (3, 25)]
    assert not any(sparse_case(s, i) for s, i in pinned)
    assert all(sparse_case(s, i, ("sparse",)) for s, i in pinned)


def _buggy_matmul(kind: str, reference):
    """MatMul as a sparse kernel might get it wrong: `empty_rows` writes the outputs of a
    compressed weight (its all-zero outputs dropped, CSR without empty rows) to the first
    columns; `tail` drops the reduction's last k % 4 terms (a 2:4 or 1x4 kernel without a
    tail loop); `zeros_skipped` multiplies only the nonzero weights, so a NaN input reaches
    only the outputs whose weights for it are nonzero (NaN x 0 is NaN)."""
    def evaluate(a, b, **attrs):
        if b.ndim != 2 or a.dtype != np.float32 or not np.any(b):
            return reference(a, b, **attrs)
        if kind == "empty_rows":
            live = np.flatnonzero(np.any(b != 0, axis=0))
            out = np.zeros(a.shape[:-1] + (b.shape[1],), np.float32)
            out[..., :live.size] = np.matmul(a, b[:, live])
            return out
        if kind == "zeros_skipped":
            out = np.matmul(np.where(np.isnan(a), 0, a), b).astype(np.float32)
            out[np.matmul(np.isnan(a).astype(np.float32), (b != 0).astype(np.float32)) > 0] = \
                np.nan
            return out
        k = b.shape[0] - b.shape[0] % 4
        return np.matmul(a[..., :k], b[:k]).astype(np.float32)
    return evaluate


@pytest.mark.parametrize("kind", ["empty_rows", "tail", "zeros_skipped"])
def test_seeded_sparse_cases_find_an_injected_sparse_kernel_bug(kind, monkeypatch):
    """The bug planted in the numpy target's MatMul, run as the target under test, against
    the true reference: reported in some seeded sparse cases, and no case differs without
    it. 200 cases: a NaN input meeting a sparse MatMul (what `zeros_skipped` needs) is
    rare, 6 of their 148 MatMul cases (2 of the first 60 before the 4-bit QDQ draws changed
    the cases holding a QDQ pair, 1 after)."""
    cases = [c for c in _sparse_cases(200) if "MatMul" in c.ops]
    found = cases_a_planted_bug_changes(
        cases, "MatMul", lambda reference: _buggy_matmul(kind, reference), monkeypatch)
    assert found >= 2, found


def test_a_seeded_sparse_batch_finds_nothing(tmp_path):
    """30 cases of layers with sparse weights (--boost sparse) on the llvm target against
    numpy and onnxruntime."""
    seeded_batch_finds_nothing(tmp_path, SPARSE_SEED, 30, "sparse")
