"""`ir.batching`: which graphs compute each item of a symbolic batch on its own. Every case
is also run (tests/backends/test_batch_split.py): a wrong "separable" is a miscompile."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dnnc.frontend.onnx import import_onnx
from dnnc.ir.batching import batch_symbol


def model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    """A one-graph model; inputs and outputs as (name, elem type, shape)."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        [onnx.numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


F = TensorProto.FLOAT
I64 = TensorProto.INT64
W = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)

# name -> (model, separable along N)
CASES = {
    "softmax_axis_1": (model([helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                             [("x", F, ["N", 5])], [("y", F, ["N", 5])]), True),
    "softmax_axis_0": (model([helper.make_node("Softmax", ["x"], ["y"], axis=0)],
                             [("x", F, ["N", 5])], [("y", F, ["N", 5])]), False),
    "dense_bias_relu": (model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                               helper.make_node("Relu", ["m"], ["y"])],
                              [("x", F, ["N", 5])], [("y", F, ["N", 4])], [("w", W)]), True),
    "batched_matmul": (model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                             [("a", F, ["N", 3, 5]), ("b", F, ["N", 5, 2])],
                             [("y", F, ["N", 3, 2])]), True),
    "embedding": (model([helper.make_node("Gather", ["t", "ids"], ["y"], axis=0)],
                        [("ids", I64, ["N", 3])], [("y", F, ["N", 3, 4])], [("t", W)]), True),
    "gather_items": (model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
                           [("x", F, ["N", 4]), ("i", I64, ["N"])], [("y", F, ["N", 4])]),
                     False),
    "transpose_inner": (model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])],
                              [("x", F, ["N", 3, 4])], [("y", F, ["N", 4, 3])]), True),
    "gram": (model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                    helper.make_node("MatMul", ["t", "x"], ["g"]),
                    helper.make_node("MatMul", ["x", "g"], ["y"])],
                   [("x", F, ["N", 4])], [("y", F, ["N", 4])]), False),
    "centre_over_batch": (model([helper.make_node("ReduceMean", ["x"], ["m"], axes=[0]),
                                 helper.make_node("Sub", ["x", "m"], ["y"])],
                                [("x", F, ["N", 5])], [("y", F, ["N", 5])]), False),
    "reduce_inner": (model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)],
                           [("x", F, ["N", 5, 2])], [("y", F, ["N", 2])]), True),
    "cumsum_over_batch": (model([helper.make_node("CumSum", ["x", "a"], ["y"])],
                                [("x", F, ["N", 5])], [("y", F, ["N", 5])],
                                [("a", np.array(0, np.int64))]), False),
    "flatten_all": (model([helper.make_node("Flatten", ["x"], ["f"], axis=0),
                           helper.make_node("Reshape", ["f", "s"], ["y"])],
                          [("x", F, ["N", 5])], [("y", F, ["N", 5])],
                          [("s", np.array([-1, 5], np.int64))]), False),
    "concat_inner": (model([helper.make_node("Concat", ["x", "x"], ["y"], axis=1)],
                           [("x", F, ["N", 5])], [("y", F, ["N", 10])]), True),
    "slice_inner": (model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
                          [("x", F, ["N", 5])], [("y", F, ["N", 3])],
                          [("s", np.array([1], np.int64)), ("e", np.array([4], np.int64)),
                           ("a", np.array([1], np.int64))]), True),
    "maxpool_indices": (model([helper.make_node("MaxPool", ["x"], ["y", "i"],
                                                kernel_shape=[2, 2])],
                              [("x", F, ["N", 2, 4, 4])],
                              [("y", F, ["N", 2, 3, 3]), ("i", I64, ["N", 2, 3, 3])]), False),
    "conv_pool": (model([helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
                         helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2],
                                          strides=[2, 2])],
                        [("x", F, ["N", 2, 6, 6])], [("y", F, ["N", 3, 3, 3])],
                        [("k", np.linspace(-1, 1, 54, dtype=np.float32).reshape(3, 2, 3, 3))]),
                  True),
    # torch's exporters: the batch's size read back for a Reshape's target shape
    "reshape_to_read_shape": (model([helper.make_node("Shape", ["x"], ["s"]),
                                     helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
                                     helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
                                     helper.make_node("Concat", ["n1", "rest"], ["t"], axis=0),
                                     helper.make_node("Reshape", ["x", "t"], ["y"])],
                                    [("x", F, ["N", 4, 5])], [("y", F, ["N", 2, 10])],
                                    [("zero", np.array(0, np.int64)),
                                     ("zero1", np.array([0], np.int64)),
                                     ("rest", np.array([2, 10], np.int64))]), True),
    "divide_by_batch_size": (model([helper.make_node("Shape", ["x"], ["s"]),
                                    helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
                                    helper.make_node("Cast", ["n"], ["f"], to=F),
                                    helper.make_node("Div", ["x", "f"], ["y"])],
                                   [("x", F, ["N", 5])], [("y", F, ["N", 5])],
                                   [("zero", np.array(0, np.int64))]), False),
    # M may be N at run time: rows of r then belong to items
    "broadcast_other_symbol": (model([helper.make_node("Add", ["x", "r"], ["y"])],
                                     [("x", F, ["N", 5]), ("r", F, ["M", 5])],
                                     [("y", F, ["N", 5])]), False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_batch_symbol(name):
    proto, separable = CASES[name]
    graph = import_onnx(proto)
    found = batch_symbol(graph.nodes, graph.inputs, graph.outputs)
    assert found == ("N" if separable else None)


def test_a_symbol_inside_an_expression_is_not_a_batch():
    proto = model([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)],
                  [("x", F, ["N", 5])], [("y", F, ["2*N", 5])])
    graph = import_onnx(proto)
    assert batch_symbol(graph.nodes, graph.inputs, graph.outputs) is None
