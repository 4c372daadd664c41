"""FLOP rules registered with the ops (ir/flops.py): the packed ops the passes make count as
the ops they replace, so an optimised graph (what an artifact holds) is estimated in full."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dnnc import zoo
from dnnc.compiler.inspect import summarize
from dnnc.backends.registry import REGISTRY
from dnnc.frontend.onnx import import_onnx
from dnnc.ir.flops import node_flops
from dnnc.ir.ops.registry import Pattern, all_ops
from dnnc.passes.manager import optimize


def _conv_model(rng, bias: bool):
    n, cin, cout, k, size, group = 2, 8, 12, 3, 10, 1   # grouped convs are not packed
    inputs = ["x", "w"] + (["b"] if bias else [])
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((cout, cin // group, k, k))
                                            .astype(np.float32), "w")]
    if bias:
        weights.append(onnx.numpy_helper.from_array(rng.standard_normal(cout)
                                                    .astype(np.float32), "b"))
    node = helper.make_node("Conv", inputs, ["y"], pads=[1, 1, 1, 1], group=group)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                      [n, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    outputs = n * cout * size * size
    want = 2 * outputs * (cin // group) * k * k + (outputs if bias else 0)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), want


@pytest.mark.parametrize("bias", [True, False])
def test_conv_packed_counts_as_the_conv_it_replaces(rng, bias):
    model, want = _conv_model(rng, bias)
    graph = import_onnx(model)
    packed = optimize(graph, REGISTRY["llvm"].target(), 3)
    assert [n.op for n in graph.nodes] == ["Conv"] and node_flops(graph.nodes[0]) == want
    (conv,) = [n for n in packed.nodes if n.op == "ConvPacked"]
    assert node_flops(conv) == want


@pytest.mark.parametrize("name,config", [("cnn", {}), ("mobilenet_v2", {"size": 64}),
                                         ("bert", {"layers": 1, "seq": 16}), ("mlp", {})])
def test_optimised_graphs_are_estimated_in_full(name, config):
    """The optimised graph has an estimate for every op, packed and recognised ones included,
    and totals the model's FLOPs less what the passes folded away (BatchNormalization into
    convs, bias adds into products): within 2%."""
    graph = import_onnx(zoo.build(name, **config))
    source = summarize(graph)
    for target in ("llvm", "cuda"):
        optimised = summarize(optimize(graph, REGISTRY[target].target(), 3))
        assert optimised.unestimated == [], (target, optimised.unestimated)
        assert 0.98 <= optimised.flops.value / source.flops.value <= 1.0, target


def test_every_out_fusable_op_has_a_rule():
    """Complex ops (conv, matmul) are where the FLOPs are: none is left to a pattern that
    gives no estimate."""
    missing = [name for name, op in all_ops().items()
               if op.pattern == Pattern.OUT_FUSABLE and op.flops is None]
    assert missing == []


def test_qlinear_conv_reads_its_weights_at_input_3(rng):
    x_scale = onnx.numpy_helper.from_array(np.array(0.1, np.float32), "xs")
    zero = onnx.numpy_helper.from_array(np.array(0, np.uint8), "zp")
    w = onnx.numpy_helper.from_array(rng.integers(0, 255, (6, 4, 3, 3)).astype(np.uint8), "w")
    node = helper.make_node("QLinearConv", ["x", "xs", "zp", "w", "xs", "zp", "xs", "zp"],
                            ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], [x_scale, zero, w])
    (conv,) = import_onnx(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)])).nodes
    assert node_flops(conv) == 2 * (6 * 5 * 5) * (4 * 3 * 3)
