"""What `dnnc inspect` reports about a graph: signature, op counts, parameters and FLOPs.

Products whose constant weights hold zeros are listed layer by layer with their density and
structure (`passes/find_sparsity.py`'s `measure`; a sparse op's recorded attributes), and
`--passes` counts the products running as sparse ops after each pass.

FLOPs are the op registry's estimates (`ir/flops.py`: a multiply-add counts 2, each family
states its rule beside its ops, data movement costs 0), so the packed ops the passes make
(ConvPacked, MatMulPacked) count as the ops they replace: an optimised graph (an artifact's)
totals its model's work, less what the passes folded away (BatchNormalization into a Conv).
Symbolic dims stay symbolic: the total is a polynomial in them (`7.3 G*N`).

`pass_report` runs the pass pipeline of a target and level on a copy and counts, after each
pass, the graph's nodes and the kernels the llvm backend would form from it (fusion groups over
its segments, without lowering or compiling them): what `dnnc inspect --passes` prints.
This module only reads a graph; it never changes one.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ..backends.registry import REGISTRY, default_target
from ..ir.flops import Count, node_flops
from ..ir.graph import Graph
from ..ir.ops.quantized import INTEGER_PRODUCTS
from ..ir.ops.registry import Pattern, get_op
from ..ir.ops.sparse import SPARSE_PRODUCTS
from ..levels import DEFAULT_OPT_LEVEL
from ..passes.find_sparsity import layer_sparsity


def human(n: int) -> str:
    """1234567 -> "1.23 M"."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {suffix}"
    return str(n)


# ---------------------------------------------------------------------------------------------
# The summary


@dataclass
class ModelSummary:
    name: str
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    op_counts: dict[str, int]
    nodes: int
    parameters: int
    parameter_bytes: int
    flops: Count | None            # None: not estimated (a model with unsupported ops)
    flops_by_op: dict[str, Count] = field(default_factory=dict)
    unestimated: list[str] = field(default_factory=list)
    # ops dnnc cannot import, as UnsupportedOpError.ops: (op, domain, opset, [node names])
    unsupported: list[tuple[str, str, int, list[str]]] = field(default_factory=list)
    # products with zeros in their constant weights: (node, op, density, structure), the
    # sparse ops' as recorded, the others' measured
    sparsity: list[tuple[str, str, float, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        flops = None if self.flops is None else \
            self.flops.value if self.flops.value is not None else str(self.flops)
        return {"name": self.name, "inputs": dict(self.inputs), "outputs": dict(self.outputs),
                "nodes": self.nodes, "op_counts": self.op_counts,
                "parameters": self.parameters, "parameter_bytes": self.parameter_bytes,
                "flops": flops,
                "flops_by_op": {k: v.value if v.value is not None else str(v)
                                for k, v in self.flops_by_op.items()},
                "unestimated_ops": self.unestimated,
                "sparsity": [{"node": name, "op": op, "density": density,
                              "structure": structure}
                             for name, op, density, structure in self.sparsity],
                "unsupported_ops": [{"op": op, "domain": domain, "opset": opset,
                                     "nodes": nodes}
                                    for op, domain, opset, nodes in self.unsupported]}


def summarize(graph: Graph) -> ModelSummary:
    """Inputs, outputs, op counts, constants and estimated FLOPs of a graph (and subgraphs)."""
    counts: collections.Counter = collections.Counter()
    by_op: dict[str, Count] = {}
    unestimated: set[str] = set()
    constants: dict[int, object] = {}
    for node in graph.walk():
        counts[node.op] += 1
        for v in node.inputs:
            if v is not None and v.is_const:
                constants.setdefault(id(v), v.const)
        flops = node_flops(node)
        if flops is None:
            unestimated.add(node.op)
        else:
            by_op[node.op] = by_op.get(node.op, Count()) + flops
    for v in graph.outputs:
        if v.is_const:
            constants.setdefault(id(v), v.const)
    total = sum(by_op.values(), Count())
    return ModelSummary(
        name=graph.name,
        inputs=[(v.name, str(v.type)) for v in graph.inputs],
        outputs=[(v.name, str(v.type)) for v in graph.outputs],
        op_counts=dict(counts.most_common()),
        nodes=sum(counts.values()),
        parameters=sum(int(c.size) for c in constants.values()),
        parameter_bytes=sum(int(c.nbytes) for c in constants.values()),
        flops=total,
        flops_by_op={k: v for k, v in sorted(by_op.items(), key=lambda kv: _sort_key(kv[1]))
                     if v.terms},
        unestimated=sorted(unestimated), sparsity=_sparsity(graph))


def _sparsity(graph: Graph) -> list[tuple[str, str, float, str]]:
    """(node, op, density, structure) of every product whose constant weights hold zeros."""
    rows = []
    for node in graph.walk():
        if node.op in SPARSE_PRODUCTS:
            rows.append((node.name, node.op, node.attrs["density"], node.attrs["structure"]))
            continue
        found = layer_sparsity(node)
        if found is not None and found.density < 1.0:
            rows.append((node.name, node.op, found.density, found.structure))
    return rows


def summarize_onnx(model, unsupported: list) -> ModelSummary:
    """What can be told of an ONNX model that dnnc cannot import (`unsupported`: its ops
    without an importer, as `UnsupportedOpError.ops`): the declared inputs and outputs, op
    counts (subgraphs included), the initializers' parameters. No FLOPs: they need the types
    only an import infers."""
    import onnx

    counts: collections.Counter = collections.Counter()

    def scan(graph) -> None:
        for node in graph.node:
            counts[f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx")
                   else node.op_type] += 1
            for attr in node.attribute:
                for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    scan(g)

    scan(model.graph)
    weights = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer]
    constants = {t.name for t in model.graph.initializer}
    return ModelSummary(
        name=model.graph.name or "main",
        inputs=[(vi.name, _declared_type(vi)) for vi in model.graph.input
                if vi.name not in constants],
        outputs=[(vi.name, _declared_type(vi)) for vi in model.graph.output],
        op_counts=dict(counts.most_common()), nodes=sum(counts.values()),
        parameters=sum(int(w.size) for w in weights),
        parameter_bytes=sum(int(w.nbytes) for w in weights), flops=None,
        unsupported=list(unsupported))


def _declared_type(vi) -> str:
    """An ONNX value's declared type in dnnc's notation (`float32[N,3]`; `?` for what the model
    leaves out)."""
    import onnx

    tt = vi.type.tensor_type
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
    except (KeyError, ValueError, TypeError):
        dtype = "?"
    if not tt.HasField("shape"):
        return f"{dtype}[?]"
    dims = [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?"
            for d in tt.shape.dim]
    return f"{dtype}[{','.join(dims)}]"


def _sort_key(count: Count):
    """Largest first: by degree, then by the leading coefficient."""
    lead = max(count.terms.items(), key=lambda kv: (len(kv[0]), kv[1]), default=((), 0))
    return (-len(lead[0]), -lead[1])


def format_summary(s: ModelSummary) -> str:
    def exact_and_human(c: Count) -> str:
        if c.value is not None:
            return f"{c.value:,} ({human(c.value)}FLOPs)" if c.value >= 1000 else f"{c.value}"
        return f"{c} ({c.format(lambda n: human(n).replace(' ', ''))})"

    width = max([len(n) for n, _ in s.inputs + s.outputs] + [4])
    lines = [f"graph {s.name}: {s.nodes} nodes"]
    lines.append("inputs:")
    lines += [f"  {n:<{width}}  {t}" for n, t in s.inputs]
    lines.append("outputs:")
    lines += [f"  {n:<{width}}  {t}" for n, t in s.outputs]
    lines.append("ops:")
    op_width = max([len(op) for op in s.op_counts] + [2])
    unsupported = {f"{domain}::{op}" if domain else op for op, domain, _, _ in s.unsupported}
    lines += [f"  {op:<{op_width}}  {n}{'  (unsupported)' if op in unsupported else ''}"
              for op, n in s.op_counts.items()]
    lines.append(f"parameters: {s.parameters:,} ({human(s.parameter_bytes)}B in constants)")
    if s.flops is None:
        lines.append(f"FLOPs: not estimated: dnnc cannot import {len(unsupported)} of the "
                     f"model's ops yet ({', '.join(sorted(unsupported))})")
        return "\n".join(lines)
    lines.append(f"FLOPs: {exact_and_human(s.flops)}, estimated")
    for op, c in s.flops_by_op.items():
        lines.append(f"  {op:<{op_width}}  {exact_and_human(c)}")
    if s.unestimated:
        lines.append(f"  (no estimate for: {', '.join(s.unestimated)})")
    if s.sparsity:
        lines.append(f"sparse weights: {len(s.sparsity)} product(s) with zeros")
        name_width = max(len(r[0]) for r in s.sparsity)
        for name, op, density, structure in s.sparsity:
            lines.append(f"  {name:<{name_width}}  {op:<11}  {1 - density:>6.1%} zeros  "
                         f"{structure}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The pipeline, pass by pass


@dataclass
class PassRow:
    """The graph after one pass (or as imported, `index` 0)."""

    index: int
    name: str
    level: int | None          # the opt level the pass starts at; None for the imported graph
    nodes: int
    kernels: int | None        # kernels the llvm backend would form; None for other targets
    seconds: float | None
    int8: int = 0              # products computed as integer ops (fuse_quantized's)
    float_products: tuple[str, ...] = ()   # the other products' node names
    sparse: int = 0            # products computed as sparse ops (find_sparsity's)

    def to_dict(self) -> dict:
        return {"index": self.index, "pass": self.name, "level": self.level,
                "nodes": self.nodes, "kernels": self.kernels, "seconds": self.seconds,
                "int8_products": self.int8, "float_products": list(self.float_products),
                "sparse_products": self.sparse}


def _products(g: Graph) -> tuple[int, tuple[str, ...], int]:
    """(integer products, the names of the other products: anchors of OUT_FUSABLE ops,
    sparse products)."""
    products = [n for n in g.nodes if get_op(n.op).pattern is Pattern.OUT_FUSABLE]
    integer = [n for n in products if n.op in INTEGER_PRODUCTS]
    return len(integer), tuple(n.name for n in products if n.op not in INTEGER_PRODUCTS), \
        sum(n.op in SPARSE_PRODUCTS for n in products)


def pass_report(graph: Graph, target: str | None = None, opt_level: int = DEFAULT_OPT_LEVEL,
                cpu=None) -> list[PassRow]:
    """One row for the imported graph, then one per pass the pipeline of `target` (default:
    the host's, see backends/registry.py) at `opt_level` runs (a target without passes, like
    numpy, runs none). Kernels (of a target that generates code) count a node each until fuse_ops has
    grouped them; fuse_ops changes no node."""
    from ..backends.plan import count_kernels
    from ..passes.manager import PIPELINE, optimize

    spec = REGISTRY[target or default_target()]
    machine = spec.target(cpu)

    def kernels(g: Graph) -> int | None:
        return count_kernels(g) if spec.generates_code else None

    rows = [PassRow(0, "(imported)", None, len(graph.nodes), kernels(graph), None,
                    *_products(graph))]
    if not spec.runs_passes:
        return rows
    levels = {name: level for name, level, _ in PIPELINE}
    timings: dict[str, float] = {}

    def after(name: str, g: Graph) -> None:
        rows.append(PassRow(len(rows), name, levels[name], len(g.nodes), kernels(g),
                            timings[name], *_products(g)))

    optimize(graph, machine, opt_level, timings=timings, after_pass=after)
    return rows


def format_passes(rows: list[PassRow], target: str, opt_level: int) -> str:
    width = max(len(r.name) for r in rows)
    lines = [f"passes for {target} at opt level {opt_level}:",
             f"  {'#':>2}  {'pass':<{width}}  {'level':>5}  {'nodes':>6}  {'kernels':>7}  "
             f"{'ms':>8}  {'int8':>5}"]
    for r in rows:
        level = "-" if r.level is None else str(r.level)
        kernels = "-" if r.kernels is None else str(r.kernels)
        ms = "-" if r.seconds is None else f"{r.seconds * 1e3:.2f}"
        lines.append(f"  {r.index:>2}  {r.name:<{width}}  {level:>5}  {r.nodes:>6}  "
                     f"{kernels:>7}  {ms:>8}  {r.int8:>5}")
    last = rows[-1]
    if last.int8:   # a quantized model: which products run in int8, which stay float
        names = ", ".join(last.float_products[:8]) + \
            (", ..." if len(last.float_products) > 8 else "")
        lines.append(f"  int8: {last.int8} of {last.int8 + len(last.float_products)} products "
                     f"run as integer ops" + (f"; float: {names}" if names else ""))
    if last.sparse:   # products whose weights were sparse enough to run as sparse ops
        lines.append(f"  sparse: {last.sparse} of {len(last.float_products)} float products "
                     f"run as sparse ops")
    if len(rows) == 1:
        lines.append(f"  (no pass runs at opt level {opt_level})"
                     if REGISTRY[target].runs_passes
                     else f"  (the {target} target runs no passes)")
    return "\n".join(lines)
