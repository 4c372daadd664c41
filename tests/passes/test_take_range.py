"""take_range: each DynamicQuantizeLinear reads a DynamicRange of its input on a target whose
kernels take ranges, and fuse_ops puts that DynamicRange in the group of its input's
producer where the group's anchor is one of the target's range producers."""

import numpy as np
import pytest

from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.target import Fusion, Target
from dnnc.passes.fuse_ops import fuse_ops
from dnnc.passes.take_range import take_range

RANGES = Target("gpu", fusion=Fusion(range_producers=frozenset({"LayerNormalization"})))


def _graph(producer: str | None, batch="N") -> Graph:
    """x -> producer (a LayerNormalization, a Relu, or none) -> DynamicQuantizeLinear, the
    producer's output an output too."""
    rng = np.random.default_rng(5)
    g = Graph("q")
    x = g.add_input("x", T.TensorType(T.float32, (batch, 16)))
    y = x
    if producer == "LayerNormalization":
        s, b = (Value(n, T.TensorType(T.float32, (16,)),
                      const=rng.standard_normal(16).astype(np.float32)) for n in "sb")
        y = g.add("LayerNormalization", x, s, b, name="ln", axis=-1)
    elif producer is not None:
        y = g.add(producer, x, name="act")
    g.outputs = [y] + list(g.add_node("DynamicQuantizeLinear", [y], {}, name="dq",
                                      num_outputs=3))
    return g


def _groups(g: Graph) -> list[list[str]]:
    return [[n.op for n in group] for group in g.groups]


@pytest.mark.parametrize("batch", ["N", 4])
def test_a_layernorm_takes_its_quantization_range(batch):
    g = take_range(_graph("LayerNormalization", batch), RANGES)
    g.verify()
    assert [n.op for n in g.nodes] == ["LayerNormalization", "DynamicRange",
                                       "DynamicQuantizeLinear"]
    ln, parts, dq = g.nodes
    assert parts.inputs == [ln.outputs[0]] and dq.inputs == [ln.outputs[0], parts.outputs[0]]
    assert parts.outputs[0].type == T.TensorType(T.float32, (2, 1024))
    assert _groups(fuse_ops(g, RANGES)) == [["LayerNormalization", "DynamicRange"],
                                            ["DynamicQuantizeLinear"]]


@pytest.mark.parametrize("producer", ["Relu", None])
def test_a_range_no_producer_takes_is_a_kernel_of_its_own(producer):
    g = take_range(_graph(producer), RANGES)
    g.verify()
    assert [n.op for n in g.nodes][-2:] == ["DynamicRange", "DynamicQuantizeLinear"]
    assert _groups(fuse_ops(g, RANGES))[-2:] == [["DynamicRange"], ["DynamicQuantizeLinear"]]


def test_a_target_without_range_producers_keeps_the_quantization_alone():
    g = _graph("LayerNormalization")
    before = str(g)
    assert str(take_range(g, Target("llvm"))) == before
