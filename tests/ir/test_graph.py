import numpy as np
import pytest

import dnnc
from dnnc.errors import ModelFormatError, ShapeError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value


def _small_graph():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, ("N", 4)))
    b = Value("b", T.TensorType(T.float32, (4,)), const=np.arange(4, dtype=np.float32))
    y = g.add("Add", x, b, name="add")
    z = g.add("Relu", y, name="relu")
    g.outputs = [z]
    return g, x, b, y, z


def test_add_node_infers_types_and_prints_stably():
    g, *_ = _small_graph()
    g.verify()
    assert str(g) == (
        "graph g(%x: float32[N,4]) {\n"
        "  const %b: float32[4]\n"
        "  %add: float32[N,4] = Add(%x, %b)\n"
        "  %relu: float32[N,4] = Relu(%add)\n"
        "  return %relu\n"
        "}")


def test_users_and_replace_all_uses():
    g, x, b, y, z = _small_graph()
    assert [n.name for n in g.users()[y]] == ["relu"]
    w = g.add("Abs", x, name="abs")
    g.replace_all_uses(y, w)
    assert g.nodes[1].inputs[0] is w


def test_topological_sort_restores_order():
    g, *_ = _small_graph()
    g.nodes.reverse()
    with pytest.raises(ValueError, match="before it is defined"):
        g.verify()
    g.topological_sort()
    g.verify()
    assert [n.name for n in g.nodes] == ["add", "relu"]


def test_verify_catches_a_wrong_type():
    g, x, b, y, z = _small_graph()
    y.type = T.TensorType(T.float64, ("N", 4))
    with pytest.raises(ValueError, match="inference gives"):
        g.verify()


def test_bad_arity_and_attributes_are_clear_errors():
    g = Graph()
    x = g.add_input("x", T.TensorType(T.float32, (3,)))
    with pytest.raises(ShapeError, match="takes 2 inputs"):
        g.add("Add", x)
    with pytest.raises(ModelFormatError, match="unknown attribute"):
        g.add("Relu", x, alpha=1.0)
    y = g.add_input("y", T.TensorType(T.int64, (3,)))
    with pytest.raises(ShapeError, match="one element type"):
        g.add("Add", x, y)


def test_graph_compiles_for_numpy_target(rng):
    g, *_ = _small_graph()
    model = dnnc.compile(g, target="numpy")
    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(model(x), np.maximum(x + np.arange(4, dtype=np.float32), 0))
