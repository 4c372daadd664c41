"""The default schedule's `_flat_rows`: two loops over an NCHW plane's narrow rows become one
loop over the plane (a global pool's sum then splits into vector lanes, an elementwise op or
a broadcast runs whole vectors), results as the NumPy reference's; wide rows too where nothing
is summed over them (LLVM vectorised a 40-wide row's outer loop with gathers and scatters);
a sum over wide rows, and loops whose indices are not the plane's (a transpose), keep their
two loops; a flat plane of at most
FLAT_VECTOR_MAX pixels with no sum over it is one VECTORIZED loop."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import dnnc


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check(model, feeds):
    ours = dnnc.compile(model, target="llvm", cache=False)
    want = dnnc.compile(model, target="numpy").run(*feeds)
    for got, ref in zip(ours.run(*feeds), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    return ours.runtime.source("loop")


@pytest.mark.parametrize("side,flat", [(7, True), (14, True), (13, True), (40, False)])
def test_a_global_pool_of_narrow_rows_sums_the_plane_in_lanes(rng, side, flat):
    model = _model([helper.make_node("GlobalAveragePool", ["x"], ["y"])],
                   [("x", [2, 24, side, side + 1])], ["y"])
    x = rng.standard_normal((2, 24, side, side + 1)).astype(np.float32)
    source = _check(model, [x])
    assert (f"range({side * (side + 1)})" in source or "_lanes" in source and
            f"// {side + 1}" in source) == flat, source


def test_a_broadcast_product_and_a_silu_run_the_plane_as_one_loop(rng):
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("Mul", ["y", "c"], ["z"])]
    model = _model(nodes, [("x", [1, 16, 7, 7]), ("c", [1, 16, 1, 1])], ["z"])
    feeds = [rng.standard_normal((1, 16, 7, 7)).astype(np.float32),
             rng.standard_normal((1, 16, 1, 1)).astype(np.float32)]
    source = _check(model, feeds)
    assert "range(49)" in source and "range(7)" not in source, source


@pytest.mark.parametrize("side", [40, 56])
def test_a_broadcast_product_over_wide_rows_runs_the_plane_as_one_loop(rng, side):
    model = _model([helper.make_node("Mul", ["x", "c"], ["y"])],
                   [("x", [1, 8, side, side]), ("c", [1, 8, 1, 1])], ["y"])
    feeds = [rng.standard_normal((1, 8, side, side)).astype(np.float32),
             rng.standard_normal((1, 8, 1, 1)).astype(np.float32)]
    source = _check(model, feeds)
    assert f"range({side * side})" in source and f"range({side})" not in source, source


@pytest.mark.parametrize("side,vectorized", [(7, True), (8, True), (9, False)])
def test_a_small_plane_is_one_vector_loop_and_a_larger_one_is_llvms(rng, side, vectorized):
    """49 or 64 pixels: `range(n):  # vectorized` (LLVM's own vectoriser ran a 7x7 plane a
    lane at a time: its vector body needs 64 iterations); 81: a loop LLVM vectorises."""
    model = _model([helper.make_node("Mul", ["x", "c"], ["y"])],
                   [("x", [1, 40, side, side]), ("c", [1, 40, 1, 1])], ["y"])
    feeds = [rng.standard_normal((1, 40, side, side)).astype(np.float32),
             rng.standard_normal((1, 40, 1, 1)).astype(np.float32)]
    source = _check(model, feeds)
    assert (f"range({side * side}):  # vectorized" in source) == vectorized, source


def test_a_global_pool_over_a_small_plane_stays_a_sum(rng):
    """A sum over the flat plane is carried: never one VECTORIZED loop (its lanes would each
    add into the same accumulator)."""
    model = _model([helper.make_node("GlobalAveragePool", ["x"], ["y"])],
                   [("x", [1, 8, 5, 5])], ["y"])
    source = _check(model, [rng.standard_normal((1, 8, 5, 5)).astype(np.float32)])
    assert "range(25):  # vectorized" not in source, source


def test_a_transpose_of_the_plane_keeps_its_two_loops(rng):
    model = _model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1, 3, 2])],
                   [("x", [1, 4, 6, 5])], ["y"])
    source = _check(model, [rng.standard_normal((1, 4, 6, 5)).astype(np.float32)])
    assert "range(30)" not in source, source
