"""`dnnc inspect --draw`: a picture of a graph with its nodes grouped by kernel.

A kernel is one of fuse_ops' groups (`Graph.groups`; a node alone where the graph has none).
With graphviz's Python package and its `dot` program installed, each kernel is a cluster of
its nodes and `dot` lays them out (`render_graphviz`); else `render_svg` writes a plain SVG
itself: one box per kernel listing its nodes, placed in layers by the longest path from the
inputs, with an arrow per value one kernel passes to another. Given each kernel's share of
the call's time (`dnnc inspect --draw --profile`), boxes are filled from white to red by it;
otherwise by the kind of their first op (products blue, reductions green, the rest grey).

This module only draws; it never compiles, runs or changes a graph.
"""

from __future__ import annotations

import html
import shutil

from ..ir.graph import Graph, Node
from ..ir.ops.registry import Pattern, get_op

PATTERN_FILL = {Pattern.OUT_FUSABLE: "#cfe2f3", Pattern.REDUCE: "#d9ead3"}
OTHER_FILL = "#eeeeee"

LINE_HEIGHT, GAP_X, GAP_Y, MARGIN, BEND = 14, 30, 36, 20, 60
CHAR_WIDTH = 7          # px of an 11 px monospace character, rounded up
MAX_CHARS = 60          # longer lines are cut, ending in "…"


def kernels_of(graph: Graph) -> list[list[Node]]:
    """The graph's kernels, in the order that runs them: its fusion groups, else its nodes
    one each."""
    return [list(g) for g in graph.groups] if graph.groups else [[n] for n in graph.nodes]


def _edges(graph: Graph, kernels: list[list[Node]]) -> set[tuple[int, int]]:
    """(producer kernel, consumer kernel) for each value one kernel passes to another; the
    graph's inputs are kernel -1."""
    owner = {id(v): k for k, nodes in enumerate(kernels) for n in nodes for v in n.outputs}
    inputs = {id(v) for v in graph.inputs}
    edges = set()
    for k, nodes in enumerate(kernels):
        for n in nodes:
            for v in n.inputs:
                if v is None:
                    continue
                source = owner.get(id(v), -1 if id(v) in inputs else None)
                if source is not None and source != k:
                    edges.add((source, k))
    return edges


def _fill(k: int, kernels: list[list[Node]], shares: dict[int, float] | None) -> str:
    if shares is not None:
        top = max(shares.values(), default=0.0) or 1.0
        fade = int(255 * (1 - shares.get(k, 0.0) / top))   # the slowest kernel fully red
        return f"#ff{fade:02x}{fade:02x}"
    return PATTERN_FILL.get(get_op(kernels[k][0].op).pattern, OTHER_FILL)


def _label(k: int, shares: dict[int, float] | None) -> str:
    share = f", {shares.get(k, 0.0):.1%}" if shares is not None else ""
    return f"kernel {k}{share}"


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def render_svg(graph: Graph, shares: dict[int, float] | None = None) -> str:
    """The plain SVG: kernel boxes in layers, arrows between them."""
    kernels = kernels_of(graph)
    edges = _edges(graph, kernels)
    layer = {-1: 0}
    for k in range(len(kernels)):   # kernels run in order: producers come first
        layer[k] = 1 + max((layer[s] for s, t in edges if t == k), default=0)
    rows: dict[int, list[int]] = {}
    for k, depth in sorted(layer.items()):
        rows.setdefault(depth, []).append(k)
    height = {k: LINE_HEIGHT * (len(kernels[k]) + 1) + 8 for k in range(len(kernels))}
    height[-1] = LINE_HEIGHT * (len(graph.inputs) + 1) + 8
    boxes = [(-1, "inputs", [f"{v.name}: {v.type}" for v in graph.inputs], "#ffffff")]
    boxes += [(k, _label(k, shares), [f"{n.op} {n.name}" for n in nodes],
               _fill(k, kernels, shares)) for k, nodes in enumerate(kernels)]
    chars = min(MAX_CHARS, max(len(t) for _, title, lines, _ in boxes
                               for t in [title] + lines))
    box_width = CHAR_WIDTH * chars + 12
    place: dict[int, tuple[int, int]] = {}
    y = MARGIN
    for depth in sorted(rows):
        for i, k in enumerate(rows[depth]):
            place[k] = (MARGIN + i * (box_width + GAP_X), y)
        y += max(height[k] for k in rows[depth]) + GAP_Y
    # room on the right for the arrows that skip layers
    width = MARGIN * 2 + max(len(r) for r in rows.values()) * (box_width + GAP_X) + BEND
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + MARGIN}" '
           f'font-family="monospace" font-size="11">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" '
           'markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z"/>'
           '</marker></defs>',
           f"<title>{html.escape(graph.name)}: {len(kernels)} kernels</title>"]
    for s, t in sorted(edges):
        (x1, y1), (x2, y2) = place[s], place[t]
        if layer[t] - layer[s] > 1 and x1 == x2:
            # a skip (a residual) would cross the boxes between: it bends round their right
            right = x1 + box_width
            out.append(f'<path d="M{right},{y1 + height[s] // 2} C{right + BEND},'
                       f'{y1 + height[s] // 2} {right + BEND},{y2 + height[t] // 2} '
                       f'{right},{y2 + height[t] // 2}" fill="none" stroke="#666" '
                       f'marker-end="url(#arrow)"/>')
            continue
        out.append(f'<line x1="{x1 + box_width // 2}" y1="{y1 + height[s]}" '
                   f'x2="{x2 + box_width // 2}" y2="{y2}" stroke="#666" '
                   f'marker-end="url(#arrow)"/>')
    for k, title, lines, fill in boxes:
        x, y0 = place[k]
        out.append(f'<g class="kernel" id="kernel{k}"><rect x="{x}" y="{y0}" '
                   f'width="{box_width}" height="{height[k]}" rx="6" fill="{fill}" '
                   f'stroke="#333"/>')
        for i, text in enumerate([title] + lines):
            weight = ' font-weight="bold"' if i == 0 else ""
            out.append(f'<text x="{x + 6}" y="{y0 + 4 + LINE_HEIGHT * (i + 1) - 3}"{weight}>'
                       f'{html.escape(_cut(text, chars))}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def has_graphviz() -> bool:
    """graphviz's Python package imports and its `dot` program is on the PATH."""
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return False
    return shutil.which("dot") is not None


def render_graphviz(graph: Graph, shares: dict[int, float] | None = None) -> str:
    """The SVG `dot` lays out: a cluster of nodes per kernel, an edge per value."""
    import graphviz

    kernels = kernels_of(graph)
    dot = graphviz.Digraph(graph.name, graph_attr={"rankdir": "TB"},
                           node_attr={"shape": "box", "fontname": "monospace",
                                      "fontsize": "10"})
    ids = {id(n): f"n{i}" for i, n in enumerate(graph.nodes)}
    for v in graph.inputs:
        dot.node(f"in_{v.name}", f"{v.name}: {v.type}", shape="ellipse")
    for k, nodes in enumerate(kernels):
        with dot.subgraph(name=f"cluster_{k}") as cluster:
            cluster.attr(label=_label(k, shares), style="filled,rounded",
                         fillcolor=_fill(k, kernels, shares))
            for n in nodes:
                cluster.node(ids[id(n)], f"{n.op}\n{n.name}")
    inputs = {id(v): f"in_{v.name}" for v in graph.inputs}
    for n in graph.nodes:
        for v in n.inputs:
            if v is None:
                continue
            source = ids.get(id(v.producer)) if v.producer is not None else inputs.get(id(v))
            if source is not None:
                dot.edge(source, ids[id(n)])
    return dot.pipe(format="svg").decode()


def draw(graph: Graph, shares: dict[int, float] | None = None) -> tuple[str, str]:
    """(the SVG, which renderer drew it: "graphviz" or "plain")."""
    if has_graphviz():
        return render_graphviz(graph, shares), "graphviz"
    return render_svg(graph, shares), "plain"
