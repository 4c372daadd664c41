"""What `dnnc inspect` reports about a graph: signature, op counts, parameters and FLOPs.

FLOPs are an estimate per op family, counting a multiply-add as 2: Conv and ConvTranspose
(2 x output x reduction size), MatMul / Gemm / Einsum, recurrent layers, pools (one per window
element), normalisations and softmax (a few per element), reductions (one per input element),
elementwise ops (one per output element). Data movement (reshape, transpose, gather, ...) costs
0. Symbolic dims stay symbolic: the total is a polynomial in them (`7.3 G*N`).

`pass_report` runs the pass pipeline of a target and level on a copy and counts, after each
pass, the graph's nodes and the kernels the llvm backend would form from it (fusion groups over
its segments, without lowering or compiling them): what `dnnc inspect --passes` prints.
This module only reads a graph; it never changes one.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Callable

from ..ir.graph import Graph, Node
from ..ir.ops.registry import Pattern, get_op
from ..ir.types import Dim


class Count:
    """A polynomial with integer coefficients in symbolic dims: {sorted names: coefficient}."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict[tuple[str, ...], int] | None = None):
        self.terms = {k: v for k, v in (terms or {}).items() if v}

    @staticmethod
    def of(dims) -> "Count":
        """The product of some dims (ints, names, or canonical monomials like "2*N*S")."""
        coef, names = 1, []
        for d in dims:
            if isinstance(d, str) and not d.startswith("("):
                for part in d.split("*"):
                    if part.lstrip("-").isdigit():
                        coef *= int(part)
                    else:
                        names.append(part)
            elif isinstance(d, str):  # an opaque expression such as "(N+1)": one factor
                names.append(d)
            else:
                coef *= int(d)
        return Count({tuple(sorted(names)): coef})

    def __add__(self, other: "Count") -> "Count":
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + v
        return Count(terms)

    def __mul__(self, other: "Count | int") -> "Count":
        if isinstance(other, int):
            return Count({k: v * other for k, v in self.terms.items()})
        terms: dict[tuple[str, ...], int] = {}
        for ka, va in self.terms.items():
            for kb, vb in other.terms.items():
                key = tuple(sorted(ka + kb))
                terms[key] = terms.get(key, 0) + va * vb
        return Count(terms)

    __rmul__ = __mul__

    def __eq__(self, other) -> bool:
        if isinstance(other, int):
            other = Count({(): other})
        return isinstance(other, Count) and self.terms == other.terms

    @property
    def value(self) -> int | None:
        """The count as an int when no symbolic dim is left, else None."""
        if all(not k for k in self.terms):
            return self.terms.get((), 0)
        return None

    def format(self, unit=lambda n: str(n)) -> str:
        if not self.terms:
            return unit(0)
        parts = []
        for names, coef in sorted(self.terms.items(), key=lambda kv: (-len(kv[0]), kv[0])):
            parts.append(unit(coef) if not names else f"{unit(coef)}*{'*'.join(names)}")
        return " + ".join(parts)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"Count({self})"


def human(n: int) -> str:
    """1234567 -> "1.23 M"."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {suffix}"
    return str(n)


# ---------------------------------------------------------------------------------------------
# FLOPs per op family


def _numel(value) -> Count:
    return Count.of(value.shape)


def _conv(node: Node) -> Count:
    x, w = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    bias = len(node.inputs) > 2 and node.inputs[2] is not None
    # each output element reduces over C_in/group x kernel; ConvTranspose scatters each input
    source = out if node.op != "ConvTranspose" else x
    flops = 2 * _numel(source) * Count.of(w.shape[1:])
    return flops + _numel(out) if bias and node.op in ("Conv", "ConvTranspose") else flops


def _matmul(node: Node) -> Count:
    a = node.inputs[0]
    k = a.shape[-1] if a.type.rank else 1
    return 2 * _numel(node.outputs[0]) * Count.of([k])


def _gemm(node: Node) -> Count:
    a, out = node.inputs[0], node.outputs[0]
    k = a.shape[0] if node.attrs.get("transA") else a.shape[1]
    flops = 2 * _numel(out) * Count.of([k])
    has_c = len(node.inputs) > 2 and node.inputs[2] is not None
    return flops + _numel(out) if has_c else flops


def _gemm_like_packed(node: Node) -> Count:
    """MatMulPacked (a MatMul/Gemm whose B convert_layout packed): A's last dim is K."""
    flops = _matmul(node)
    has_c = len(node.inputs) > 2 and node.inputs[2] is not None
    return flops + _numel(node.outputs[0]) if has_c else flops


def _einsum(node: Node) -> Count:
    """A multiply-add over the whole index space of the equation."""
    lhs = node.attrs["equation"].replace(" ", "").split("->")[0]
    sizes: dict[str, Dim] = {}
    for term, value in zip(lhs.split(","), node.inputs):
        if "..." in term:
            return Count()  # broadcast dims: no estimate
        sizes.update(zip(term, value.shape))
    return (2 if len(node.inputs) > 1 else 1) * Count.of(sizes.values())


def _recurrent(node: Node) -> Count:
    """RNN / GRU / LSTM: per step and batch row, 2 x (W and R elements) over every direction."""
    x, w, r = node.inputs[:3]
    steps_by_batch = Count.of(x.shape[:2])
    return 2 * steps_by_batch * (Count.of(w.shape) + Count.of(r.shape))


def _window(node: Node) -> Count:
    return _numel(node.outputs[0]) * math.prod(node.attrs["kernel_shape"])


def _attention(node: Node) -> Count:
    """Two batched matmuls and a softmax over the scores (4-D Q, K, V only)."""
    q, k, v = node.inputs[:3]
    if q.type.rank != 4:
        return Count()
    scores = Count.of(q.shape[:-1]) * Count.of([k.shape[-2]])
    return scores * (2 * Count.of([q.shape[-1]]) + 2 * Count.of([v.shape[-1]])) + 5 * scores


def _per_output(n: int) -> Callable[[Node], Count]:
    return lambda node: n * _numel(node.outputs[0])


def _per_input(n: int) -> Callable[[Node], Count]:
    return lambda node: n * _numel(node.inputs[0])


FLOP_RULES: dict[str, Callable[[Node], Count]] = {
    "Conv": _conv, "ConvTranspose": _conv, "ConvInteger": _conv, "QLinearConv": _conv,
    "MatMul": _matmul, "MatMulInteger": _matmul, "QLinearMatMul": _matmul,
    "Gemm": _gemm, "Einsum": _einsum, "MatMulPacked": _gemm_like_packed,
    "RNN": _recurrent, "GRU": _recurrent, "LSTM": _recurrent,
    "Attention": _attention,
    "MaxPool": _window, "AveragePool": _window, "LpPool": _window,
    "GlobalAveragePool": _per_input(1), "GlobalMaxPool": _per_input(1),
    "GlobalLpPool": _per_input(2),
    # inference BatchNorm folds to one scale and one shift per element
    "BatchNormalization": _per_output(2),
    # mean, centre, variance, normalise, affine
    "LayerNormalization": _per_output(5), "InstanceNormalization": _per_output(5),
    "GroupNormalization": _per_output(5), "RMSNormalization": _per_output(4),
    "MeanVarianceNormalization": _per_output(5), "LpNormalization": _per_output(3),
    # max, subtract, exp, sum, divide
    "Softmax": _per_output(5), "LogSoftmax": _per_output(5), "Hardmax": _per_output(1),
    "LRN": lambda node: _numel(node.outputs[0]) * (node.attrs.get("size", 1) + 3),
    "Identity": _per_output(0), "Cast": _per_output(0), "CastLike": _per_output(0),
}
"""Op -> FLOP estimate of one node. Ops not listed fall back on their pattern."""


def node_flops(node: Node) -> Count | None:
    """Estimated FLOPs of one node; None when the op has no estimate."""
    rule = FLOP_RULES.get(node.op)
    if rule is not None:
        try:
            return rule(node)
        except (KeyError, IndexError, TypeError, ValueError):
            return None  # an attribute or input form the rule does not know: no estimate
    pattern = get_op(node.op).pattern
    if pattern in (Pattern.ELEMWISE, Pattern.BROADCAST):
        return sum((_numel(o) for o in node.outputs), Count())
    if pattern == Pattern.INJECTIVE:
        return Count()
    if pattern == Pattern.REDUCE:
        return _numel(node.inputs[0])
    return None


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
    flops: Count
    flops_by_op: dict[str, Count] = field(default_factory=dict)
    unestimated: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "inputs": dict(self.inputs), "outputs": dict(self.outputs),
                "nodes": self.nodes, "op_counts": self.op_counts,
                "parameters": self.parameters, "parameter_bytes": self.parameter_bytes,
                "flops": self.flops.value if self.flops.value is not None else str(self.flops),
                "flops_by_op": {k: v.value if v.value is not None else str(v)
                                for k, v in self.flops_by_op.items()},
                "unestimated_ops": self.unestimated}


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
        unestimated=sorted(unestimated))


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
    lines += [f"  {op:<{op_width}}  {n}" for op, n in s.op_counts.items()]
    lines.append(f"parameters: {s.parameters:,} ({human(s.parameter_bytes)}B in constants)")
    lines.append(f"FLOPs: {exact_and_human(s.flops)}, estimated")
    for op, c in s.flops_by_op.items():
        lines.append(f"  {op:<{op_width}}  {exact_and_human(c)}")
    if s.unestimated:
        lines.append(f"  (no estimate for: {', '.join(s.unestimated)})")
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

    def to_dict(self) -> dict:
        return {"index": self.index, "pass": self.name, "level": self.level,
                "nodes": self.nodes, "kernels": self.kernels, "seconds": self.seconds}


def pass_report(graph: Graph, target: str | None = None, opt_level: int = 3,
                cpu=None) -> list[PassRow]:
    """One row for the imported graph, then one per pass the pipeline of `target` (default:
    the host's, see targets.py) at `opt_level` runs (a target without passes, like numpy, runs
    none). Kernels (of a target that generates code) count a node each until fuse_ops has
    grouped them; fuse_ops changes no node."""
    from ..backends.plan import count_kernels
    from ..passes.manager import PIPELINE, optimize
    from .targets import REGISTRY, default_target

    spec = REGISTRY[target or default_target()]
    machine = spec.target(cpu)

    def kernels(g: Graph) -> int | None:
        return count_kernels(g) if spec.generates_code else None

    rows = [PassRow(0, "(imported)", None, len(graph.nodes), kernels(graph), None)]
    if not spec.runs_passes:
        return rows
    levels = {name: level for name, level, _ in PIPELINE}
    timings: dict[str, float] = {}

    def after(name: str, g: Graph) -> None:
        rows.append(PassRow(len(rows), name, levels[name], len(g.nodes), kernels(g),
                            timings[name]))

    optimize(graph, machine, opt_level, timings=timings, after_pass=after)
    return rows


def format_passes(rows: list[PassRow], target: str, opt_level: int) -> str:
    from .targets import REGISTRY

    width = max(len(r.name) for r in rows)
    lines = [f"passes for {target} at opt level {opt_level}:",
             f"  {'#':>2}  {'pass':<{width}}  {'level':>5}  {'nodes':>6}  {'kernels':>7}  "
             f"{'ms':>8}"]
    for r in rows:
        level = "-" if r.level is None else str(r.level)
        kernels = "-" if r.kernels is None else str(r.kernels)
        ms = "-" if r.seconds is None else f"{r.seconds * 1e3:.2f}"
        lines.append(f"  {r.index:>2}  {r.name:<{width}}  {level:>5}  {r.nodes:>6}  "
                     f"{kernels:>7}  {ms:>8}")
    if len(rows) == 1:
        lines.append(f"  (no pass runs at opt level {opt_level})"
                     if REGISTRY[target].runs_passes
                     else f"  (the {target} target runs no passes)")
    return "\n".join(lines)
