"""take_range: a DynamicQuantizeLinear's range taken where its input is made.

DynamicQuantizeLinear needs x's max and min before it can quantize any element: alone it is
two launches on cuda (each block's partial range, then the range and the quantization,
`backends/cuda/dynamic_quantize.py`). Where x comes from an op whose kernel can take the range
as it stores x (`Target.fusion.range_producers`: cuda's layernorm rows), this pass gives the
quantization a DynamicRange of x (its partials: the max and min of pieces of x) as its second
input, placed just after x's producer; fuse_ops puts it in the producer's kernel
(`fuse_ops.take_ranges`) and the quantization becomes one launch that reduces the partials.
Every value stays the same: max and min are exact in any order.

The pass only adds nodes; it never changes what a node computes.
"""

from __future__ import annotations

from ..ir.graph import Graph
from ..ir.target import Target


def take_range(graph: Graph, target: Target) -> Graph:
    producers = target.fusion.range_producers
    for node in list(graph.nodes):
        if node.op != "DynamicQuantizeLinear" or len(node.inputs) != 1:
            continue
        x = node.inputs[0]
        maker = x.producer
        if maker is None or maker.op not in producers or len(x.type.shape) < 2 or \
                maker.outputs[0] is not x or maker not in graph.nodes:
            continue
        name = graph.fresh_name(f"{x.name}_range")
        parts = graph.add_node("DynamicRange", [x], name=name, output_names=[name])[0]
        made = graph.nodes.pop()
        graph.nodes.insert(graph.nodes.index(maker) + 1, made)
        node.inputs = [x, parts]
    return graph
