"""Reductions on the worker pool (issue 10, item 2): a big reduction with few outputs is split
into chunks reduced in parallel and combined in a fixed order, and no parallel loop carries
a reduction into shared state. Each case is compiled and run several times in a child process
at 1 and at 2 threads (a crash fails the test), then compared with NumPy.

Run as a script (`python test_parallel_reductions.py OUT.npz`) it is the child: it writes every
case's outputs, run after run."""

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

RUNS = 4

# fp32 tolerance: the llvm target sums in blocks (64 chunks of 8 lanes each), so the longest
# chain of roundings is about n / 512 + 72 additions: at most n = 65536 here, 200 * 2**-24
# ~ 1.2e-5 of the sum of magnitudes (Higham, Accuracy and Stability, 4.2). Inputs are positive
# where the sum is the result, so that sum is the result's own magnitude. A race loses whole
# chunks: errors of 10% and more.
RTOL = 2e-5


def _positive(rng, shape, dtype=np.float32):
    return rng.uniform(0.5, 1.5, size=shape).astype(dtype)


def _near_one(rng, shape):
    return rng.uniform(0.999, 1.001, size=shape).astype(np.float32)


def _normal(rng, shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _ones(rng, shape):
    return np.ones(shape, np.float32)


def _ints(rng, shape):
    return rng.integers(-50, 50, size=shape, dtype=np.int32)


def _ties(rng, shape):
    return rng.integers(0, 1000, size=shape).astype(np.float32)


# name -> (op, attrs, input generator, shape)
CASES = {
    # the reproduction: 2 threads gave 29018, 21204, ... (any order of adding ones
    # is exact)
    "sum_ones": ("ReduceSum", {"keepdims": 0}, _ones, (2, 16, 32, 32)),
    "sum_all": ("ReduceSum", {"keepdims": 0}, _positive, (2, 16, 32, 32)),
    "mean_all": ("ReduceMean", {"keepdims": 1}, _positive, (2, 16, 32, 32)),
    "max_all": ("ReduceMax", {"keepdims": 0}, _normal, (2, 16, 32, 32)),
    "min_all_1d": ("ReduceMin", {"keepdims": 0}, _normal, (65536,)),
    "prod_all": ("ReduceProd", {"keepdims": 0}, _near_one, (32768,)),
    "l2_all": ("ReduceL2", {"keepdims": 0}, _normal, (4, 64, 129)),
    "sum_all_int": ("ReduceSum", {"keepdims": 0}, _ints, (2, 16, 32, 32)),
    "sum_axis0": ("ReduceSum", {"keepdims": 0, "axes": [0]}, _positive, (8192, 8)),
    "max_axis0": ("ReduceMax", {"keepdims": 1, "axes": [0]}, _normal, (4099, 3, 4)),
    "mean_axis0_wide": ("ReduceMean", {"keepdims": 0, "axes": [0]}, _positive, (16, 4096)),
    "argmax_1d": ("ArgMax", {"keepdims": 0, "axis": 0}, _ties, (40000,)),
    "argmin_axis0": ("ArgMin", {"keepdims": 1, "axis": 0}, _ties, (8192, 5)),
    "layernorm_axis0": ("LayerNormalization", {"axis": 0}, _normal, (64, 32, 33)),
    "softmax_big_axis": ("Softmax", {"axis": -1}, _normal, (1, 65536)),
    "softmax_axis0": ("Softmax", {"axis": 0}, _normal, (16384, 3)),
}


def _model(op, attrs, shape, dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs, inits = ["x"], []
    if op == "LayerNormalization":
        rng = np.random.default_rng(7)
        for name in ("scale", "bias"):
            inits.append(helper.make_tensor(name, TensorProto.FLOAT, shape,
                                            _normal(rng, shape).ravel()))
            inputs.append(name)
    opset = 18
    if op == "ReduceSum":
        attrs = dict(attrs)
        axes = attrs.pop("axes", None)
        if axes is not None:
            inits.append(helper.make_tensor("axes", TensorProto.INT64, (len(axes),), axes))
            inputs.append("axes")
    node = helper.make_node(op, inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              inits)
    if op.startswith("Reduce") and op != "ReduceSum":
        opset = 17   # axes still an attribute
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _variance(x):
    return x.var(axis=0)


def _child(path):
    """Compile every case for the llvm target and the numpy target; run each RUNS times."""
    import dnnc

    out = {}
    for seed, (name, (op, attrs, make, shape)) in enumerate(CASES.items()):
        x = make(np.random.default_rng(seed), shape)
        model = _model(op, attrs, shape, x.dtype).SerializeToString()
        llvm = dnnc.compile(model, "llvm")
        out[f"{name}/ref"] = np.asarray(dnnc.compile(model, "numpy")(x))
        out[f"{name}/x"] = x
        for run in range(RUNS):
            out[f"{name}/{run}"] = np.asarray(llvm(x))
    x = _normal(np.random.default_rng(3), (16384, 3))
    traced = dnnc.jit(_variance)
    out["var_axis0/ref"] = x.astype(np.float64).var(axis=0)
    out["var_axis0/x"] = x
    for run in range(RUNS):
        out[f"var_axis0/{run}"] = np.asarray(traced(x))
    np.savez(path, **out)


NAMES = list(CASES) + ["var_axis0"]


@pytest.mark.parametrize("name", NAMES)
def test_reduction_is_deterministic_and_matches_numpy(results, name):
    first = results[1][f"{name}/0"]
    for threads in (1, 2):
        got = results[threads]
        for run in range(RUNS):
            # the same bits run after run, and whatever the thread count: the chunks are
            # combined in one order fixed by the shape
            np.testing.assert_array_equal(got[f"{name}/{run}"], first,
                                          err_msg=f"threads={threads} run={run}")
    ref = results[1][f"{name}/ref"]
    if name == "sum_ones":
        assert first == 32768.0
    if first.dtype.kind in "iu" or name.startswith(("max", "min", "arg")):
        np.testing.assert_array_equal(first, ref)
    elif name.startswith(("sum", "mean", "prod")):
        np.testing.assert_allclose(first, ref, rtol=RTOL)
    else:
        # normalised outputs (softmax, layernorm, variance) and the L2 norm: a result of
        # magnitude m carries the error of sums scaled by m
        scale = np.abs(ref).max()
        np.testing.assert_allclose(first, ref, rtol=RTOL, atol=RTOL * scale)


if __name__ == "__main__":
    _child(sys.argv[1])
