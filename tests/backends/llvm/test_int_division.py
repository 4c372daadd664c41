"""Integer Div and Mod never trap (issue 10, item 3): by 0 they give 0, MIN / -1 wraps to MIN
and MIN % -1 is 0, on the numpy target (the reference) and the llvm target alike, for every
integer dtype, with the divisor a runtime input, a constant tensor, a constant scalar (a
literal in the kernel) or folded away with a constant dividend. The llvm cases run in a child
process: a SIGFPE fails the test instead of killing pytest."""

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dnnc.ir.ops.elementwise import div, mod

DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
OPS = (("Div", None), ("Mod", 0), ("Mod", 1))
# runtime: both inputs; tensor: the divisor an initializer; scalar: a 0-d zero initializer;
# folded: both initializers (constant folding evaluates it at compile time)
DIVISORS = ("runtime", "tensor", "scalar", "folded")   # as in _model


@pytest.mark.parametrize("dtype", ("int8", "int32", "int64"))
def test_reference_rule_for_signed(dtype):
    lo = np.iinfo(dtype).min
    a = np.array([7, -7, lo, lo, lo, 0], dtype)
    b = np.array([0, 0, 0, -1, 1, 0], dtype)
    np.testing.assert_array_equal(div(a, b), np.array([0, 0, 0, lo, lo, 0], dtype))
    np.testing.assert_array_equal(mod(a, b, 0), np.zeros(6, dtype))
    np.testing.assert_array_equal(mod(a, b, 1), np.zeros(6, dtype))
    # away from the special cases, truncating division and both remainders
    a, b = np.array([7, -7, 7, -7], dtype), np.array([2, 2, -2, -2], dtype)
    np.testing.assert_array_equal(div(a, b), np.array([3, -3, -3, 3], dtype))
    np.testing.assert_array_equal(mod(a, b, 0), np.array([1, 1, -1, -1], dtype))
    np.testing.assert_array_equal(mod(a, b, 1), np.array([1, -1, 1, -1], dtype))


def test_reference_rule_for_unsigned_and_no_warning():
    a, b = np.array([9, 255, 0], np.uint8), np.array([0, 0, 0], np.uint8)
    with np.errstate(all="raise"):   # the reference itself never divides by zero
        np.testing.assert_array_equal(div(a, b), np.zeros(3, np.uint8))
        np.testing.assert_array_equal(mod(a, b, 0), np.zeros(3, np.uint8))
        np.testing.assert_array_equal(mod(a, b, 1), np.zeros(3, np.uint8))


def _model(dtype, n, a, b):
    """One node per (op, divisor) case, each its own output."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [helper.make_tensor_value_info(x, elem, [n]) for x in ("a", "b")]
    inits = [numpy_helper.from_array(b, "b_tensor"),
             numpy_helper.from_array(np.zeros((), dtype), "b_scalar"),
             numpy_helper.from_array(a, "a_folded"), numpy_helper.from_array(b, "b_folded")]
    divisors = {"runtime": ("a", "b"), "tensor": ("a", "b_tensor"),
                "scalar": ("a", "b_scalar"), "folded": ("a_folded", "b_folded")}
    nodes, outputs = [], []
    for op, fmod in OPS:
        for divisor, operands in divisors.items():
            name = f"{op}{'' if fmod is None else fmod}_{divisor}"
            attrs = {} if fmod is None else {"fmod": fmod}
            nodes.append(helper.make_node(op, list(operands), [name], **attrs))
            outputs.append(helper.make_tensor_value_info(name, elem, [n]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _operands(dtype, n, seed):
    """Random operands with the special cases first: x / 0, MIN / 0, MIN / -1, MAX / 0."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    a = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    b = rng.integers(-3 if info.min < 0 else 0, 4, size=n).astype(dtype)
    minus_one = -1 if info.min < 0 else 0
    a[:4] = [7, info.min, info.min, info.max]
    b[:4] = [0, 0, minus_one, 0]
    return a, b


def _child():
    """Every case on both targets; prints each mismatch; exits 1 if any."""
    import warnings

    import dnnc

    warnings.simplefilter("error")   # the reference and constant folding warn nothing
    bad = []
    for seed, dtype in enumerate(DTYPES):
        # 7 elements: scalar code; 1000: the loop LLVM vectorises
        for n in (7, 1000):
            a, b = _operands(dtype, n, seed)
            model = _model(dtype, n, a, b).SerializeToString()
            ref = dnnc.compile(model, "numpy")(a, b)
            got = dnnc.compile(model, "llvm")(a, b)
            names = [f"{op}{'' if fmod is None else fmod}_{d}" for op, fmod in OPS
                     for d in DIVISORS]
            for name, r, g in zip(names, ref, got):
                case = f"{dtype} n={n} {name}"
                if name.endswith("scalar") and r.any():
                    bad.append(f"{case}: numpy target {r[:6]}, not 0")
                if not np.array_equal(r, g):
                    bad.append(f"{case}: numpy {r[:6]} llvm {g[:6]}")
    print("\n".join(bad) or "all match")
    sys.exit(1 if bad else 0)


def test_llvm_matches_numpy_without_trapping():
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip() == "all match"


if __name__ == "__main__":
    _child()
