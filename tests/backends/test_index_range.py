"""Out-of-range gather indices at run time (issue 30, item 3): every target that checks them
raises `InputError` naming the node, the index and the bound, for graph inputs and for indices
computed inside the graph; in-range indices, negative ones included, keep the reference's
result."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc import zoo
from dnnc.errors import InputError

TABLE = np.arange(15, dtype=np.float32).reshape(5, 3)
TARGETS = ["numpy"]
"""Targets that check indices at run time. llvm and cuda clamp (a load never leaves its buffer)
but do not report yet: the in-kernel check is issue 30's open part of item 3."""


def _gather_model(offset: int | None = None):
    """out = Gather(table, ids) or, with `offset`, Gather(table, ids + offset) (an index the
    graph computes)."""
    nodes, inits = [], [numpy_helper.from_array(TABLE, "table")]
    ids = "ids"
    if offset is not None:
        inits.append(numpy_helper.from_array(np.array(offset, np.int64), "offset"))
        nodes.append(helper.make_node("Add", ["ids", "offset"], ["shifted"], name="shift"))
        ids = "shifted"
    nodes.append(helper.make_node("Gather", ["table", ids], ["out"], name="lookup", axis=0))
    graph = helper.make_graph(
        nodes, "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [5, -6, 10**12, -10**6, 2**62])
def test_out_of_range_input_index_raises(target, bad):
    model = dnnc.compile(_gather_model(), target=target)
    with pytest.raises(InputError, match=rf"Gather node 'lookup': index {bad} .*size 5"):
        model(ids=np.array([0, 1, bad, 2], np.int64))


@pytest.mark.parametrize("target", TARGETS)
def test_out_of_range_computed_index_raises(target):
    model = dnnc.compile(_gather_model(offset=3), target=target)
    with pytest.raises(InputError, match=r"Gather node 'lookup': index 6 .*size 5"):
        model(ids=np.array([0, 1, 3, 1], np.int64))


@pytest.mark.parametrize("target", TARGETS)
def test_in_range_indices_negative_included_match_the_reference(target):
    ids = np.array([0, -1, 4, -5], np.int64)
    out = dnnc.compile(_gather_model(), target=target)(ids=ids)
    np.testing.assert_array_equal(out, TABLE[ids])
    out = dnnc.compile(_gather_model(offset=-2), target=target)(ids=ids + 2)
    np.testing.assert_array_equal(out, TABLE[ids])


@pytest.mark.parametrize("target", TARGETS)
def test_bert_tiny_token_id_past_the_vocabulary_raises(target):
    model = zoo.bert_tiny(seq=8)
    feeds = zoo.inputs_for(model)
    compiled = dnnc.compile(model, target=target)
    for bad in (30522, 10**12, -10**6, 2**62):
        ids = feeds["input_ids"].copy()
        ids[0, 3] = bad
        with pytest.raises(InputError, match=rf"'embeddings.words': index {bad} .*size 30522"):
            compiled(**{**feeds, "input_ids": ids})


@pytest.mark.parametrize("target", ["numpy", "llvm"])
def test_scatter_nd_on_the_host_raises_on_every_target(target):
    """Scatters run as host fallbacks through the references on llvm (and cuda): the same
    InputError as the numpy target, while an in-range negative index still wraps."""
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="put")], "scatter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
        [numpy_helper.from_array(np.ones((1, 2), np.float32), "u")])
    model = dnnc.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                         target=target)
    x = np.zeros((4, 2), np.float32)
    np.testing.assert_array_equal(model(x=x, i=np.array([[-1]])), [[0, 0]] * 3 + [[1, 1]])
    with pytest.raises(InputError, match=r"ScatterND node 'put': index 4 .*size 4"):
        model(x=x, i=np.array([[4]]))


def _constant_index_model(k: int):
    """y = Gather(x, k, axis=1) with a constant 0-d k: x[:, k]."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "k"], ["y"], name="pick", axis=1)], "pick",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(k, np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("k", [7, -9])
def test_constant_out_of_range_index(k):
    """The numpy target names the node, the index and the bound (a 0-d index: it failed with
    numpy's "nonzero on 0d arrays"); llvm's kernel read x[:, k] past its buffer (x[1, 7] is
    past x's 10 floats) and now clamps it as a run-time index, within x."""
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    with pytest.raises(InputError, match=rf"Gather node 'pick': index {k} .*size 5"):
        dnnc.compile(_constant_index_model(k), target="numpy")(x=x)
    out = dnnc.compile(_constant_index_model(k), target="llvm")(x=x)
    np.testing.assert_array_equal(out, x[:, 4] if k > 0 else x[:, 0])


@pytest.mark.parametrize("k", [0, 3, -1, -5])
def test_constant_in_range_index_matches_the_reference(k):
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    for target in ("numpy", "llvm"):
        out = dnnc.compile(_constant_index_model(k), target=target)(x=x)
        np.testing.assert_array_equal(out, x[:, k])
