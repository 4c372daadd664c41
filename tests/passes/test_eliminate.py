"""Dead code and common subexpressions: what goes, what must stay."""

import numpy as np

import dnnc
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.eliminate import eliminate_common_subexpressions, eliminate_dead_code


def test_unread_nodes_go_and_read_ones_stay():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (3,)))
    used = g.add("Exp", x, name="used")
    dead = g.add("Log", x, name="dead")
    g.add("Neg", dead, name="dead2")
    g.outputs = [used]
    assert eliminate_dead_code(g) == 2
    assert [n.name for n in g.nodes] == ["used"]


def test_graph_outputs_are_never_dead_code():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (3,)))
    g.outputs = [g.add("Exp", x)]
    assert eliminate_dead_code(g) == 0 and len(g.nodes) == 1


def test_identical_nodes_merge_and_different_attributes_do_not(rng):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3)))
    a = g.add("Exp", x, name="a")
    b = g.add("Exp", x, name="b")
    c = g.add("LeakyRelu", x, alpha=0.1, name="c")
    d = g.add("LeakyRelu", x, alpha=0.2, name="d")
    g.outputs = [g.add("Add", a, b), g.add("Sub", c, d)]
    xv = rng.standard_normal((2, 3)).astype(np.float32)
    before = dnnc.compile(g, target="numpy").run(xv)
    assert eliminate_common_subexpressions(g) == 1
    assert [n.name for n in g.nodes if n.op == "Exp"] == ["a"]
    assert len([n for n in g.nodes if n.op == "LeakyRelu"]) == 2
    g.verify()
    for got, want in zip(dnnc.compile(g, target="numpy").run(xv), before):
        np.testing.assert_array_equal(got, want)
