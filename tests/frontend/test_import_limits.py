"""The ONNX importer's limits: a long chain written in any order imports (no recursion), a
cycle is a `ModelFormatError`, and an opset newer than the importers know is refused by
name, as onnxruntime refuses it, instead of importing ops whose meaning may have changed."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from dnnc.errors import ModelFormatError, UnsupportedOpsetError
from dnnc.frontend.onnx import NEWEST_OPSET, import_onnx
from dnnc.ir.interpreter import run_graph


def _model(nodes, output, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT,
                                                                         [3])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_3000_node_chain_in_reverse_order_imports():
    n = 3000
    ops = ["Neg", "Abs"]
    nodes = [helper.make_node(ops[i % 2], [f"v{i}"], [f"v{i + 1}"], name=f"n{i}")
             for i in range(n)]
    graph = import_onnx(_model(nodes[::-1], f"v{n}"))
    assert [node.name for node in graph.nodes] == [f"n{i}" for i in range(n)]
    x = np.random.default_rng(0).standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(run_graph(graph, [x])[0], np.abs(x))


def test_a_cycle_is_a_model_format_error():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="n1"),
             helper.make_node("Relu", ["a"], ["b"], name="n2")]
    with pytest.raises(ModelFormatError, match="cycle through node"):
        import_onnx(_model(nodes, "a"))


@pytest.mark.parametrize("opset", [NEWEST_OPSET + 1, 99])
def test_an_opset_newer_than_dnnc_knows_is_refused(opset):
    model = _model([helper.make_node("Relu", ["v0"], ["v1"])], "v1", opset=opset)
    with pytest.raises(UnsupportedOpsetError, match=f"opset {opset}; dnnc supports opsets up "
                                                    f"to {NEWEST_OPSET}"):
        import_onnx(model)


def test_the_newest_opset_imports():
    model = _model([helper.make_node("Relu", ["v0"], ["v1"])], "v1", opset=NEWEST_OPSET)
    assert [n.op for n in import_onnx(model).nodes] == ["Relu"]
