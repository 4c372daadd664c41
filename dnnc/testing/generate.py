"""Random valid ONNX models for the differential fuzzer: a `Case` from (seed, index).

A case grows a graph from one to three inputs by applying random ops from `OPS` (the ops real
models use: convs of every kind, matmul/gemm, broadcasting elementwise, activations, norms,
pools, data movement, reductions, pad, resize, casts, where, expand, integer arithmetic, QDQ
chains; in `SPARSE_RATE` of the cases layers with pruned weights) to values already in the
graph, preferring the newest value (chains) but sometimes an older one (values with several
consumers). Sizes are small and odd (primes, 1s) in most cases; a few cases are big enough to
cross the llvm target's parallel thresholds. A third of the cases have a symbolic batch dim
(`dim_param "N"`). Every node's output type comes from ONNX's own shape inference
(`infer_node_outputs`), so the declared types are the spec's.

This module is the driver (draw a case's settings, grow the graph, choose its outputs); the
graph under construction is `graph_builder.Builder`, the op generators and their weights are
in `op_generators/`. A case must stay a function of (seed, index) only: nothing here may draw
from a generator other than the case's own.

What is never generated, because the spec leaves the result undefined or ill-conditioned and
a comparison would mean nothing: NaN-producing arithmetic (Sqrt/Log of negatives, 0/0),
division by values near zero, integer division by zero, float-to-int casts out of range,
integer products that overflow, LayerNormalization of rows that may be constant, and
comparisons, casts or rounding of floats computed with rounding (two correct implementations
may round a sum differently and flip a comparison); those consume only *exact* values
(inputs, data movement, max/min). The one exception, QuantizeLinear in QDQ chains
(`op_generators/quantized.py`), is compared within per-element rounding bounds
(`rounding.py`), and its rounded values feed QDQ chains only. `docs/fuzzing.md`.

Special mode (`special=True`, the fuzzer's `--special`): the first input holds special values
(+-inf, NaN, +-0, subnormals, in half the cases +-1e30 and +-FLT_MAX too) and later inputs
sometimes; such inputs are exact (casts to every integer type and comparisons take them:
docs/semantics.md defines float -> int of every value), a softmax (the op, or written by
hand) often runs over them first, and huge values stay out of sums (`Val.huge`). Without
it, every case is what it was before special mode existed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from .graph_builder import BATCH, F32, I4, ONNX_DTYPE, U4, Builder, InputSpec, Rejected
from .op_generators import DYNAMIC_OPS, MASK_OPS, OPS, SPARSE_OPS, SPECIAL_OPS
from .op_generators.layers import gen_softmax, gen_softmax_chain

OPSETS = (13, 17, 18, 21)
"""Opsets a case is written in: importers differ by opset (axes as attribute or input, ...)."""


@dataclass
class Case:
    """One generated model with the recipe of its inputs."""

    seed: int
    index: int
    model: onnx.ModelProto
    inputs: list[InputSpec]
    symbolic: bool
    big: bool
    batch: int               # the batch size of the first run
    ops: list[str] = field(default_factory=list)
    special: bool = False    # drawn in special mode

    def batches(self) -> list[int]:
        """The batch size of each run: a new one for the second run when it is symbolic."""
        if not self.symbolic:
            return [self.batch, self.batch]
        return [self.batch, self.batch % 4 + 2]   # 1->3, 2->4, 3->5, 4->2, ...

    def draw_inputs(self, run: int) -> dict[str, np.ndarray]:
        """Fresh random inputs for run `run`, a function of (seed, index, run) only."""
        rng = np.random.default_rng([self.seed, self.index, run, 1])
        batch = self.batches()[run]
        return {spec.name: spec.draw(rng, batch) for spec in self.inputs}


def _start(g: Builder) -> None:
    """The first input: an image, a sequence or a matrix; sometimes a second one."""
    n = g.batch_dim
    kind = g.choice(["image"] * 6 + ["sequence"] * 3 + ["matrix"] * 2)
    if kind == "image":
        if g.big:   # >= MIN_PARALLEL_WORK elements per image; 3x3 convs >= 1M MACs
            shape = (n, g.choice([16, 24]), g.choice([48, 49]), g.choice([48, 64]))
        else:
            shape = (n, g.size((1, 2, 3, 4, 5, 8)), g.size((1, 2, 3, 5, 7, 8, 9)),
                     g.size((1, 3, 4, 6, 7, 10, 13)))
    elif kind == "sequence":
        shape = (n, g.size((1, 3, 5, 7, 16), (128, 130)), g.size((1, 2, 4, 8, 13), (256, 300)))
    else:
        shape = (n, g.size((1, 2, 3, 5, 8, 17, 31), (32768, 40000)))
    if g.special:
        g.add_input(shape, F32, g.choice(["special", "special_huge"]))
        if g.chance(0.5):   # rows of special values into a softmax first
            g.choice([gen_softmax, gen_softmax_chain])(g)
    else:
        # 5% of cases hold NaNs (never compared, cast or rounded: the input is not exact)
        g.add_input(shape, F32, "normal_nan" if g.chance(0.05) else "normal")
    if g.chance(0.2):
        g.add_input(shape, F32)


BOOST = 12
"""How much `generate(..., boost=)` multiplies the named generators' weights."""

SPARSE_RATE = 0.15
"""The fraction of (non-special) cases that also draw `SPARSE_OPS` (layers with pruned
weights); all of them with `boost=("sparse",)`. Whether a case is one is drawn from its own
stream, (seed, index, 2), so that every other case is what it was before sparse layers
existed (the regression cases tests pin among them)."""


def sparse_case(seed: int, index: int, boost: tuple = ()) -> bool:
    """Whether case (seed, index) draws layers with sparse weights (`SPARSE_RATE`)."""
    return "sparse" in boost or \
        bool(np.random.default_rng([seed, index, 2]).random() < SPARSE_RATE)


def generate(seed: int, index: int, boost: tuple = (), special: bool = False) -> Case:
    """The case (seed, index) (in special mode: `special`): the same model and input recipe
    every time. `boost` names generators (`qdq` for `gen_qdq`) drawn BOOST times as often:
    the same seed and index then give another case (`sparse` also makes every case a sparse
    one)."""
    rng = np.random.default_rng([seed, index, 0])
    big = bool(rng.random() < 0.08)
    symbolic = bool(rng.random() < 0.33)
    batch = int(rng.choice([1, 2, 3])) if not big else int(rng.choice([1, 2]))
    opset = int(rng.choice(OPSETS))
    g = Builder(rng, opset, big, BATCH if symbolic else batch, special)
    _start(g)
    ops = SPECIAL_OPS if special else OPS + SPARSE_OPS if sparse_case(seed, index, boost) \
        else OPS
    if "additive_mask" in boost:   # (never drawn otherwise: every other case stays as it was)
        ops = ops + MASK_OPS
    if "dynamic" in boost:   # (the same)
        ops = ops + DYNAMIC_OPS
    weights = np.array([w * (BOOST if fn.__name__[4:] in boost else 1) for w, fn in ops],
                       float)
    target = int(rng.integers(2, 5 if big else 11))
    added, tries = 0, 0
    while added < target and tries < 200:
        tries += 1
        fn = ops[int(rng.choice(len(ops), p=weights / weights.sum()))][1]
        count = (len(g.nodes), len(g.values), len(g.initializers), len(g.inputs), g.count)
        consumed = set(g.consumed)
        try:
            fn(g)
            added += 1
        except Rejected:   # roll back what the generator added before it gave up
            g.nodes = g.nodes[:count[0]]
            g.values = g.values[:count[1]]
            g.initializers = g.initializers[:count[2]]
            g.inputs = g.inputs[:count[3]]
            g.consumed = consumed
    return _finish(g, seed, index, symbolic, big, batch)


def _finish(g: Builder, seed, index, symbolic, big, batch) -> Case:
    produced = {o for n in g.nodes for o in n.output}
    leaves = [v for v in g.values if v.name in produced and v.name not in g.consumed]
    outputs = leaves[-4:] or [v for v in g.values if v.name in produced][-1:]
    # a rounded float other than a DQ's is compared in quanta only as far as QDQ chains go;
    # no 4-bit value (onnxruntime's Python binding has no 4-bit arrays)
    inner = [v for v in g.values if v.name in produced and v.name in g.consumed and
             v not in outputs and (not v.rounded or v.quant is not None or v.dtype != F32)
             and v.dtype not in (I4, U4)]
    if inner and g.chance(0.2):   # an output that other nodes also read
        outputs.append(g.choice(inner))
    if not outputs:   # no op applied: one Identity so the graph has an output
        outputs = g.node("Identity", [g.values[0]])
    used = {i for n in g.nodes for i in n.input} | {v.name for v in outputs}
    inputs = [s for s in g.inputs if s.name in used]
    graph = helper.make_graph(
        g.nodes, f"fuzz_{seed}_{index}",
        [helper.make_tensor_value_info(s.name, ONNX_DTYPE[s.dtype], s.shape) for s in inputs],
        [helper.make_tensor_value_info(v.name, ONNX_DTYPE[v.dtype], v.shape)
         for v in outputs],
        [t for t in g.initializers if t.name in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", g.opset)],
                              producer_name="dnnc.testing.fuzz")
    model.ir_version = helper.find_min_ir_version_for(model.opset_import)
    onnx.checker.check_model(model, full_check=True)
    return Case(seed, index, model, inputs, symbolic, big, batch,
                sorted({n.op_type for n in g.nodes}), g.special)
