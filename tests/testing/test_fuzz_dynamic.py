"""The differential fuzzer's dynamically quantized products (issue 33: quantize_dynamic's
DynamicQuantizeLinear -> MatMulInteger, `--boost dynamic`): what the cases hold, that no
other case changed, that the comparison catches a quantization bug, and a seeded batch on
the llvm target."""

import numpy as np
import pytest
from onnx import numpy_helper

from dnnc.testing.generate import generate
from dnnc.testing.op_generators import OPS, gen_dynamic
from fuzz_checks import cases_a_planted_bug_changes, seeded_batch_finds_nothing

DYNAMIC_SEED = 33


def _dynamic_cases(n=40):
    return [generate(DYNAMIC_SEED, i, ("dynamic",)) for i in range(n)]


def test_dynamic_cases_are_written_as_quantize_dynamic_writes_them():
    """Each DynamicQuantizeLinear reads a graph input and feeds a MatMulInteger of constant
    int8 (zero point 0) or uint8 weights, whose product is cast to float and multiplied by
    the activation's scale times the weights' (per tensor or per column); across the cases
    both weight types, both scale forms, and shapes the int8 templates take (16 rows and
    more, a depth of whole 16-byte chunks)."""
    seen = set()
    for case in _dynamic_cases():
        graph = case.model.graph
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        inputs = {i.name for i in graph.input}
        producer = {o: n for n in graph.node for o in n.output}
        readers = {}
        for n in graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        for n in graph.node:
            if n.op_type != "DynamicQuantizeLinear":
                continue
            assert n.input[0] in inputs
            (product,) = [r for r in readers[n.output[0]] if r.op_type == "MatMulInteger"]
            assert list(product.input[2:3]) == [n.output[2]]
            w, zero = inits[product.input[1]], inits[product.input[3]]
            assert w.dtype in (np.int8, np.uint8) and zero.dtype == w.dtype
            if w.dtype == np.int8:
                assert np.all(zero == 0) and np.all(np.abs(w) <= 127)
            # (other generators may read the product and its cast too)
            (cast,) = [r for r in readers[product.output[0]] if r.op_type == "Cast"]
            (scaled,) = [r for r in readers[cast.output[0]] if r.op_type == "Mul"]
            both = producer[scaled.input[1]]
            assert both.op_type == "Mul" and both.input[0] == n.output[1]
            scale = inits[both.input[1]]
            assert np.all(scale > 0) and scale.shape in ((), (w.shape[1],))
            rows = int(np.prod([d.dim_value or 2 for d in
                                next(i for i in graph.input if i.name == n.input[0])
                                .type.tensor_type.shape.dim][:-1]))
            seen |= {w.dtype.name, "per column" if scale.ndim else "per tensor"}
            if rows >= 16 and w.shape[0] % 16 == 0:
                seen.add("template shape")
    assert seen >= {"int8", "uint8", "per column", "per tensor", "template shape"}, seen


def test_cases_without_the_boost_stay_as_they_were():
    """`dynamic` is drawn only when boosted: OPS, whose order and weights are every case's
    identity, does not hold it (so no other case changed), and no case without the boost
    holds a DynamicQuantizeLinear."""
    assert all(fn is not gen_dynamic for _, fn in OPS)
    assert not any("DynamicQuantizeLinear" in generate(DYNAMIC_SEED, i).ops for i in range(30))


def _buggy_dynamic_quantize(kind: str, evaluate):
    def buggy(x):
        y, scale, zero = evaluate(x)
        if kind == "zero_point":     # the zero point one off
            zero = np.minimum(zero.astype(np.int32) + 1, 255).astype(np.uint8)
            y = np.minimum(y.astype(np.int32) + 1, 255).astype(np.uint8)
        elif kind == "zero_point_truncated":   # -min / scale truncated, not rounded
            lo = np.float32(min(0.0, float(np.min(x))))
            zero = np.array(np.trunc(np.clip(-lo / scale, 0, 255)), np.float32).astype(np.uint8)
            y = np.clip(np.rint(x.astype(np.float32) / scale) + zero.astype(np.float32), 0,
                        255).astype(np.uint8)
        return y, scale, zero
    return buggy


@pytest.mark.parametrize("kind", ["zero_point", "zero_point_truncated"])
def test_seeded_dynamic_cases_find_an_injected_quantization_bug(kind, monkeypatch):
    """The bug planted in the numpy target's DynamicQuantizeLinear, run as the target under
    test, against the true reference: reported in some seeded cases, and no case differs
    without it."""
    cases = [c for c in _dynamic_cases() if "DynamicQuantizeLinear" in c.ops]
    found = cases_a_planted_bug_changes(
        cases, "DynamicQuantizeLinear",
        lambda reference: _buggy_dynamic_quantize(kind, reference), monkeypatch)
    assert found >= 3, found


def test_a_seeded_dynamic_batch_finds_nothing(tmp_path):
    """20 cases of dynamically quantized products (--boost dynamic) on the llvm target
    against numpy and onnxruntime."""
    seeded_batch_finds_nothing(tmp_path, DYNAMIC_SEED, 20, "dynamic")
