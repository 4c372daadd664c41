"""sink_updates: a node writing an input in place (`Graph.aliases`) moves after the input's
other readers when nothing reads its result, and stays where it is otherwise; the order stays
topological (the graph verifies) and every output the same (the NumPy interpreter)."""

import numpy as np

from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.passes.sink_updates import sink_updates


def _const(name, value):
    return Value(name, T.TensorType(T.int64, ()), const=np.array(value, np.int64))


def counter_first(read_new: bool) -> Graph:
    """count + 1 (written into count) placed before count * 3 reads the old count; with
    `read_new`, (count + 1) * 2 is an output too."""
    g = Graph("counter")
    count = g.add_input("count", T.TensorType(T.int64, (3,)))
    new = g.add("Add", count, _const("one", 1))
    old = g.add("Mul", count, _const("three", 3))
    g.outputs = [new, g.add("Neg", old)]
    if read_new:
        g.outputs.append(g.add("Mul", new, _const("two", 2)))
    g.aliases = {0: 0}
    g.verify()
    return g


def test_an_update_nothing_reads_moves_after_the_inputs_readers():
    g = counter_first(read_new=False)
    count = np.array([4, -1, 7], np.int64)
    want = run_graph(g, [count])
    sink_updates(g)
    g.verify()
    assert [n.op for n in g.nodes] == ["Mul", "Add", "Neg"]   # just after the last reader
    for got, ref in zip(run_graph(g, [count]), want):
        np.testing.assert_array_equal(got, ref)


def test_an_update_whose_result_is_read_stays():
    g = counter_first(read_new=True)
    order = [n.name for n in g.nodes]
    sink_updates(g)
    assert [n.name for n in g.nodes] == order


def test_a_graph_without_aliases_is_left_alone():
    g = counter_first(read_new=False)
    g.aliases = {}
    order = [n.name for n in g.nodes]
    sink_updates(g)
    assert [n.name for n in g.nodes] == order
