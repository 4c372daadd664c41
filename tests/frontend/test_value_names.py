"""Value names from ONNX files (issue 10, item 4): names that differ only in characters a
symbol cannot hold (`a.b` and `a_b`, `x:0` and `x/0`) stay distinct buffers on the llvm target,
and a graph that assigns a name twice (not SSA) is refused with ModelFormatError naming the
node and the value."""

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.errors import ModelFormatError

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), shape=(4, 5)):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, shape)
                                           for n in inputs],
                              [helper.make_tensor_value_info(n, F, shape) for n in outputs],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("src, dst", [("a.b", "a_b"), ("x:0", "x/0")])
def test_names_that_sanitise_alike_stay_distinct(src, dst):
    model = _model([helper.make_node("Relu", [src], [dst])], [src], [dst])
    onnx.checker.check_model(model, full_check=True)   # a valid model
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    got = dnnc.compile(model.SerializeToString(), "llvm")(x)
    np.testing.assert_array_equal(got, np.maximum(x, 0))


# characters that every one sanitise to `_`: `x.y:z`, `x/y-z`, `x_y_z`, ... are distinct
# ONNX names of one symbol; `x_y_z_2` is what a counter appended to it would give
SEPARATORS = "._:/- "
POOL = ["x" + a + "y" + b + "z" for a, b in itertools.product(SEPARATORS, repeat=2)] + \
    ["x_y_z_2", "x_y_z_3", "v_x_y_z"]
UNARY = ("Relu", "Neg", "Sigmoid", "Abs")
BINARY = ("Add", "Mul", "Sub", "Max")


def _random_graph(rng):
    """A random DAG of elementwise nodes whose every value has a name from POOL."""
    names = list(rng.permutation(POOL))
    inputs = [names.pop() for _ in range(3)]
    values, nodes = list(inputs), []
    for _ in range(int(rng.integers(5, 10))):
        out = names.pop()
        if rng.random() < 0.5:
            op, args = UNARY[rng.integers(len(UNARY))], [values[rng.integers(len(values))]]
        else:
            op = BINARY[rng.integers(len(BINARY))]
            args = [values[rng.integers(len(values))] for _ in range(2)]
        nodes.append(helper.make_node(op, args, [out]))
        values.append(out)
    # the last value, and a few others (values read again later, outputs as well)
    outputs = sorted({values[-1], *rng.choice(values[3:], size=2)}, key=values.index)
    return _model(nodes, inputs, outputs), inputs


@pytest.mark.parametrize("seed", range(6))
def test_random_graphs_of_colliding_names_match_numpy(seed):
    rng = np.random.default_rng(seed)
    model, inputs = _random_graph(rng)
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()
    feeds = [rng.standard_normal((4, 5)).astype(np.float32) for _ in inputs]
    want = dnnc.compile(data, "numpy")(*feeds)
    for opt_level in (0, 3):   # 0: a kernel per node, 3: fused groups
        got = dnnc.compile(data, "llvm", opt_level=opt_level)(*feeds)
        got, want_ = (got, want) if isinstance(got, (list, tuple)) else ([got], [want])
        for g, w in zip(got, want_):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


# -- single assignment -------------------------------------------------------------------------


def _relu(i, o, name):
    return helper.make_node("Relu", [i], [o], name=name)


W = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
SSA_VIOLATIONS = {
    "writes its own input": (
        [_relu("x", "y", "first"), helper.make_node("Add", ["y", "x"], ["y"], name="self")],
        ["x"], ["y"], [], ["'self'", "'y'"]),
    "two nodes write one name": (
        [_relu("x", "y", "one"), helper.make_node("Neg", ["x"], ["y"], name="two")],
        ["x"], ["y"], [], ["'one'", "'two'", "'y'"]),
    "a node writes a graph input": (
        [_relu("y", "x", "back")], ["x", "y"], ["x"], [], ["'back'", "graph input 'x'"]),
    "a node writes an initializer": (
        [_relu("x", "w", "over")], ["x"], ["w"], [W],
        ["'over'", "initializer 'w'"]),
}


@pytest.mark.parametrize("case", SSA_VIOLATIONS)
def test_ssa_violations_are_refused(case):
    nodes, inputs, outputs, inits, named = SSA_VIOLATIONS[case]
    model = _model(nodes, inputs, outputs, inits)
    with pytest.raises(ModelFormatError) as info:
        dnnc.compile(model.SerializeToString(), "numpy")
    for text in named:
        assert text in str(info.value)


def test_unnamed_dims_of_inputs_named_alike_are_independent():
    """`a.b` and `a_b` with unnamed dims: each dim its own symbol (they once shared `a_b_0`,
    and a call with lengths 3 and 5 was refused), and none takes a dim_param's name; nor do
    dim_params `n.1` and `n_1` share one."""
    dims = {"a.b": [None], "a_b": [None], "c": ["a_b_0"], "d": ["n.1"], "e": ["n_1"]}
    graph = helper.make_graph(
        [helper.make_node("Relu", [name], [f"o{k}"]) for k, name in enumerate(dims)], "g",
        [helper.make_tensor_value_info(name, F, d) for name, d in dims.items()],
        [helper.make_tensor_value_info(f"o{k}", F, [None]) for k in range(len(dims))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(2)
    feeds = [rng.standard_normal(n).astype(np.float32) for n in (3, 5, 4, 6, 7)]
    for target in ("numpy", "llvm"):
        got = dnnc.compile(model.SerializeToString(), target)(*feeds)
        for g, x in zip(got, feeds):
            np.testing.assert_array_equal(g, np.maximum(x, 0))
