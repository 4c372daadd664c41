"""take_range: a DynamicQuantizeLinear's range taken where its input is made.

DynamicQuantizeLinear needs x's max and min before it can quantize any element: alone it is
two launches on cuda (each block's partial range, then the range and the quantization,
`backends/cuda/dynamic_quantize.py`). On a target whose kernels can take the range as they store
x (`Target.fusion.range_producers`: on cuda, the kernels of layernorms, int8 products and
attention), this pass gives each quantization a DynamicRange of x (its partials: the max and
min of pieces of x) as its second input, placed just after x's producer; fuse_ops puts it in
the producer's kernel where that kernel's anchor is one of them (`fuse_ops.take_ranges`),
and the quantization becomes one launch that reduces the partials. Elsewhere the
DynamicRange is a kernel of its own, the quantization's first launch as it was.
Every value stays the same: max and min are exact in any order.

The pass only adds nodes; it never changes what a node computes.
"""

from __future__ import annotations

from ..ir.graph import Graph
from ..ir.target import Target


def take_range(graph: Graph, target: Target) -> Graph:
    if not target.fusion.range_producers:
        return graph
    for node in list(graph.nodes):
        if node.op != "DynamicQuantizeLinear" or len(node.inputs) != 1:
            continue
        x = node.inputs[0]
        name = graph.fresh_name(f"{x.name}_range")
        parts = graph.add_node("DynamicRange", [x], name=name, output_names=[name])[0]
        made = graph.nodes.pop()
        maker = x.producer
        after = graph.nodes.index(maker) + 1 if maker is not None and \
            any(n is maker for n in graph.nodes) else graph.nodes.index(node)
        graph.nodes.insert(after, made)
        node.inputs = [x, parts]
    return graph
