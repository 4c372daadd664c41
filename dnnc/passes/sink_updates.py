"""sink_updates: each in-place update placed after the other nodes reading the input it
updates, so that its kernel may compute it in the caller's array.

A graph output that the caller's input receives (`Graph.aliases`: a static cache's counter
`count + 1`, a cache row written by IndexCopy) is computed straight into that array only
where every other reader of the old value runs in an earlier kernel
(`plan.in_place_outputs`); otherwise it is computed apart and copied into the array after
the call (on cuda: the input copied into the frame's buffer and the result copied back, two
device copies a call). Kernels run in the graph's node order, and exporters place an update
wherever the traced code had it: torch 2.11's ATen graph of transformers' gpt2 decode step
increments each counter in kernel 0 and reads the old count in kernel 2 (H200, session 56),
torch 2.13's the other way round.

So a node producing an aliased output that nothing in the graph reads (no node, no other
output) moves to just after the last node reading its updated input. Its own inputs come
from nodes before it, which stay before it, and nothing waits for its outputs: the order
stays topological and every value the same. A node whose result is read stays where it is.
"""

from __future__ import annotations

from ..ir.graph import Graph


def sink_updates(graph: Graph, target=None) -> Graph:
    if not graph.aliases:
        return graph
    users = graph.users()
    outputs = [id(v) for v in graph.outputs]
    for k, i in sorted(graph.aliases.items()):
        out, source = graph.outputs[k], graph.inputs[i]
        node = out.producer
        place = {id(n): p for p, n in enumerate(graph.nodes)}
        if node is None or id(node) not in place or \
                any(users.get(v) for v in node.outputs) or \
                sum(outputs.count(id(v)) for v in node.outputs) != 1:
            continue
        here = place[id(node)]
        last = max((place[id(n)] for n in users.get(source, ()) if n is not node),
                   default=-1)
        if last > here:   # (popped first: the last reader is then at last - 1)
            graph.nodes.insert(last, graph.nodes.pop(here))
    return graph
