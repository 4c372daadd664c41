"""Lowering node groups and compute DAGs to PrimFuncs: inlining of elementwise stages,
materialisation of reductions, accumulators; each lowered func is also compiled with the LLVM
renderer and run against NumPy."""

import ctypes

import numpy as np
import pytest

from dnnc.backends.llvm.codegen import ModuleBuilder
from dnnc.backends.llvm.cpu import host_target
from dnnc.backends.llvm.jit import JITModule
from dnnc.backends.lower import _Lowering, _size_vars, lower_group
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.compute import (
    compute, evaluate, placeholder, reduce_axis, reduce_max, reduce_sum)
from dnnc.ir.graph import Graph
from dnnc.ir.types import TensorType


def run(func: L.PrimFunc, arrays, sizes=()) -> None:
    L.verify(func)
    mb = ModuleBuilder("lower")
    mb.add(func)
    jm = JITModule(str(mb), host_target(), 1)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
        jm.address(f"{func.name}_packed"))
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    szs = (ctypes.c_int64 * max(len(sizes), 1))(*sizes)
    fn(ptrs, szs)


def lower_tensors(name: str, inputs, outputs) -> L.PrimFunc:
    """A compute DAG (no graph, no registered op) through lowering's own stages."""
    out_bufs = [L.Buffer(f"out{k}", t.dtype, tuple(t.shape)) for k, t in enumerate(outputs)]
    body = _Lowering([], {}, {}).lower(list(outputs), out_bufs)
    params = [t.as_buffer() for t in inputs] + out_bufs
    func = L.PrimFunc(name, tuple(params), body, tuple(_size_vars(params, body)))
    return L.simplify(func)


# ---------------------------------------------------------------------------------------------
# graph groups (elementwise rules)


def _chain():
    g = Graph()
    x = g.add_input("x", TensorType(T.float32, ("N", 6)))
    b = g.add_input("b", TensorType(T.float32, (6,)))
    h = g.add("Add", x, b, name="h")
    s = g.add("Sigmoid", h, name="s")
    y = g.add("Mul", h, s, name="y")
    return g, x, b, h, s, y


def test_single_node_lowers_to_one_loop_nest_with_size_vars(rng):
    g = Graph()
    x = g.add_input("x", TensorType(T.float16, ("N", 5)))
    g.add("Tanh", x, name="t")
    k = lower_group([g.nodes[0]], "tanh")
    assert [v.name for v in k.func.size_vars] == ["N"]
    text = str(k.func)
    assert text.startswith("def tanh(v_x: float16[N, 5], v_t: float16[N, 5]) sizes(N):")
    # (a float16 op computes in float32, rounding once: elementwise.unary)
    assert text.count("for ") == 2 and "tanh(float32(v_x[" in text
    a = rng.standard_normal((7, 5)).astype(np.float16)
    out = np.empty_like(a)
    run(k.func, [a, out], (7,))
    np.testing.assert_allclose(out.astype(np.float32), np.tanh(a.astype(np.float32)),
                               rtol=2e-3, atol=2e-3)


def test_elementwise_chain_is_inlined_into_one_store(rng):
    g, x, b, h, s, y = _chain()
    k = lower_group(list(g.nodes), "chain", outputs=[y])
    text = str(k.func)
    assert [p.name for p in k.func.params] == ["v_x", "v_b", "v_y"]
    assert text.count("=") - text.count("==") == 1  # one store, nothing materialised
    assert "alloc" not in text and "sigmoid(" in text
    a = rng.standard_normal((4, 6)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    out = np.empty_like(a)
    run(k.func, [a, bias, out], (4,))
    hh = a + bias
    np.testing.assert_allclose(out, hh / (1 + np.exp(-hh)) * np.float32(1), rtol=1e-6)


def test_group_output_read_inside_is_stored_then_read_back(rng):
    """h is both a group output and read by y: it gets its own stage, and y reads h's
    buffer instead of recomputing it."""
    g, x, b, h, s, y = _chain()
    k = lower_group(list(g.nodes), "chain2", outputs=[h, y])
    text = str(k.func)
    stores = [line.strip() for line in text.splitlines() if "] = " in line]
    assert len(stores) == 2
    assert stores[0].startswith("v_h[") and "v_x[" in stores[0]
    assert stores[1].startswith("v_y[") and "v_h[" in stores[1] and "v_x[" not in stores[1]
    a = rng.standard_normal((3, 6)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    out_h, out_y = np.empty_like(a), np.empty_like(a)
    run(k.func, [a, bias, out_h, out_y], (3,))
    np.testing.assert_array_equal(out_h, a + bias)
    np.testing.assert_allclose(out_y, out_h / (1 + np.exp(-out_h)), rtol=1e-6)


def test_output_that_is_an_input_is_copied(rng):
    g = Graph()
    x = g.add_input("x", TensorType(T.int32, (4,)))
    g.add("Identity", x, name="same")
    k = lower_group([g.nodes[0]], "ident")
    assert "v_same[" in str(k.func) and "v_x[" in str(k.func)
    a = rng.integers(-50, 50, 4).astype(np.int32)
    out = np.empty_like(a)
    run(k.func, [a, out])
    np.testing.assert_array_equal(out, a)


# ---------------------------------------------------------------------------------------------
# hand-written compute rules: reductions


def _softmax(x):
    n, c = x.shape
    k1, k2 = reduce_axis(c, "k1"), reduce_axis(c, "k2")
    m = compute((n,), lambda i: reduce_max(x[i, k1], k1), "rowmax")
    e = compute((n, c), lambda i, j: L.call("exp", x[i, j] - m[i]), "e")
    s = compute((n,), lambda i: reduce_sum(e[i, k2], k2), "rowsum")
    return compute((n, c), lambda i, j: e[i, j] / s[i], "softmax")


def test_reduction_stages_are_materialised_and_elementwise_ones_inlined(rng):
    x = placeholder("x", T.float32, ("N", 10))
    y = _softmax(x)
    f = lower_tensors("softmax", [x], [y])
    text = str(f)
    # two scratch buffers (row max, row sum), each filled through a local accumulator
    assert text.count("alloc(") == 4
    assert text.count("scope=global") == 2 and text.count("scope=local") == 2
    assert "float32(-inf)" in text and "float32(0.0)" in text
    assert "= max(acc" in text and "] + exp(" in text
    # e = exp(x - max) is inlined twice (into the sum and into the output), never stored
    assert text.count("exp(") == 2 and "e[" not in text.replace("v_", "")
    a = rng.standard_normal((6, 10)).astype(np.float32)
    out = np.empty_like(a)
    run(f, [a, out], (6,))
    ref, = evaluate([y], {"x": a}, {"N": 6})
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_reduction_accumulates_half_precision_in_float32(rng):
    """A float16 sum accumulates in float32 and is cast once: 2048 + 1 + 1 ... stays exact."""
    x = placeholder("x", T.float16, (3, 4096))
    r = reduce_axis(4096, "r")
    y = compute((3,), lambda i: reduce_sum(x[i, r], r), "s")
    f = lower_tensors("hsum", [x], [y])
    text = str(f)
    assert "float32[1], scope=local" in text and "float16(acc" in text
    a = np.ones((3, 4096), np.float16)
    a[:, 0] = 2048
    a[1] = rng.integers(-3, 4, 4096)
    out = np.empty(3, np.float16)
    run(f, [a, out])
    np.testing.assert_array_equal(out, a.astype(np.float32).sum(1).astype(np.float16))


def test_conditional_integer_max_reduction_and_empty_reduction(rng):
    """Masked max over a padded window (int init is iinfo.min); a reduce of extent 0 stores
    its init value."""
    x = placeholder("x", T.int16, (9,))
    r = reduce_axis(3, "r")
    pos = lambda i: i + r.var - 1  # noqa: E731
    y = compute((9,), lambda i: reduce_max(x[pos(i)], r, where=L.logical_and(
        pos(i) >= 0, pos(i) < 9)), "pool")
    z = placeholder("z", T.int32, (4, 0))
    k = reduce_axis(0, "k")
    s = compute((4,), lambda i: reduce_sum(z[i, k], k), "empty")
    f = lower_tensors("pool", [x, z], [y, s])
    text = str(f)
    assert "int16(-32768)" in text or "-32768" in text
    assert "if " in text
    a = rng.integers(-1000, 1000, 9).astype(np.int16)
    out_y, out_s = np.empty(9, np.int16), np.full(4, 99, np.int32)
    run(f, [a, np.empty((4, 0), np.int32), out_y, out_s])
    padded = np.pad(a, 1, constant_values=np.iinfo(np.int16).min)
    np.testing.assert_array_equal(
        out_y, np.lib.stride_tricks.sliding_window_view(padded, 3).max(1))
    np.testing.assert_array_equal(out_s, 0)


def test_nested_reduction_is_hoisted_inside_the_outer_loops(rng):
    """sum_j max_k x[i, j, k]: the inner max's accumulator is re-initialised per j."""
    x = placeholder("x", T.float64, ("N", 5, 7))
    j, k = reduce_axis(5, "j"), reduce_axis(7, "k")
    y = compute(("N",), lambda i: reduce_sum(reduce_max(x[i, j, k], k), j), "summax")
    f = lower_tensors("summax", [x], [y])
    text = str(f)
    lines = text.splitlines()
    init_inner = next(n for n, line in enumerate(lines) if "float64(-inf)" in line)
    loop_j = next(n for n, line in enumerate(lines) if "for j in range(5)" in line)
    assert init_inner > loop_j  # the max accumulator is initialised inside the j loop
    a = rng.standard_normal((4, 5, 7))
    out = np.empty(4)
    run(f, [a, out], (4,))
    np.testing.assert_allclose(out, a.max(2).sum(1), rtol=1e-12)
