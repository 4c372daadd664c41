"""The pass pipeline per opt level: a table of named passes, run in order, each verified, timed
and optionally dumped.

    0  the graph as imported; every node a kernel, every intermediate in an arena block of
       its own
    1  fuse_quantized (a quantized model's DQ -> product -> Q chains as integer ops with
       the requantization fused, before fold_constants would fold the weights' dequantization;
       on its own copy of the graph), fold_constants (on a copy bound to the inputs' declared shapes), simplify,
       eliminate (common subexpressions, then dead code), widen_half (a half-precision
       model's float16 / bfloat16 values computed in float32 on a target whose kernels do
       not compute in that type: llvm; Casts at its inputs and outputs only),
       expand_powers (float Pow(x, 2) / Pow(x, 3) as multiplies; at level 2 after
       store_half, which keeps Pow's squares in float32)
    2  + fuse_attention (attention chains as one FusedAttention node, for targets whose
       fusion asks for it: cuda), + store_half (at precision fp16 / bf16 on a target with
       `half_storage`, cuda: the model's weights and activations stored in that type, Casts
       at its inputs and outputs; after fuse_attention, which would not match across its
       Casts), + convert_layout (the target's weight layouts, converted once at compile
       time; cuda at a reduced precision: convolutions channels-last, Transposes sunk
       between them), + store_tf32 (at tf32 on a target with `half_storage`: what the
       tensor-core products read stored as tf32 values, rounded in their producers'
       epilogues), + fuse_ops (the kernels each segment's nodes form, recorded as `Graph.groups`)
       (sink_updates, from level 1, runs before fuse_ops: a node writing an input in place,
       such as a static cache's counter `+ 1`, moved after the input's other readers, so
       that its kernel can write the caller's array)
    3  the same as 2 today (the default: the fastest correct level)

Memory planning is not a graph pass: arena offsets need the final kernels and concrete sizes,
which exist once a segment is specialised to the shapes of a call; the shared orchestration
(`backends/plan.py`) plans every specialisation with reuse from level 1
(`levels.MEMORY_REUSE_LEVEL`; `dnnc/levels.py` names what each level decides).

`PIPELINE` names every pass with the level it starts at; `optimize(..., passes=k)` stops after
the first k of them, which is how `dnnc compare --bisect-passes` finds the pass that changes
a result. The input graph is never modified: a pipeline works on `specialize`'s copy.
After every pass the manager (never the pass) verifies the graph (`verify`), records the pass's
seconds (`timings`), writes the graph's text to `dump_ir`/NN_pass.txt and calls `after_pass`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.target import Target
from ..levels import DEFAULT_OPT_LEVEL, levels
from .convert_layout import convert_layout
from .eliminate import eliminate_common_subexpressions, eliminate_dead_code
from .expand_powers import expand_powers
from .fuse_attention import fuse_attention
from .fuse_ops import fuse_ops
from .fuse_quantized import QUANTIZED, fuse_quantized
from .simplify import simplify
from .sink_updates import sink_updates
from .specialize import specialize
from .store_half import store_half
from .store_tf32 import store_tf32
from .take_range import take_range
from .widen_half import widen_half

log = logging.getLogger(__name__)



def _quantized(graph: Graph, target: Target) -> Graph:
    if not any(n.op in QUANTIZED for n in graph.nodes):
        return graph   # (nothing to rewrite: fold_constants copies it)
    copy = specialize(graph, [v.type.shape for v in graph.inputs], fold=False)
    fuse_quantized(copy)
    return copy


def _fold(graph: Graph, target: Target) -> Graph:
    return specialize(graph, [v.type.shape for v in graph.inputs], fold=True)


def _simplify(graph: Graph, target: Target) -> Graph:
    simplify(graph)
    return graph


def _eliminate(graph: Graph, target: Target) -> Graph:
    eliminate_common_subexpressions(graph)
    eliminate_dead_code(graph)
    return graph


def _expand_powers(graph: Graph, target: Target) -> Graph:
    expand_powers(graph)
    return graph


def _layout(graph: Graph, target: Target) -> Graph:
    convert_layout(graph, target)
    return graph


PIPELINE = [("fuse_quantized", 1, _quantized), ("fold_constants", 1, _fold), ("simplify", 1, _simplify),
            ("eliminate", 1, _eliminate), ("widen_half", 1, widen_half),
            ("fuse_attention", 2, fuse_attention),
            ("store_half", 2, store_half), ("expand_powers", 1, _expand_powers),
            ("convert_layout", 2, _layout), ("store_tf32", 2, store_tf32),
            ("sink_updates", 1, sink_updates), ("take_range", 2, take_range),
            ("fuse_ops", 2, fuse_ops)]
"""(name, first opt level, pass) in order; a pass takes and returns the graph."""


def passes_at(opt_level: int) -> list[str]:
    """The passes that run at the public `opt_level` (its graph level), in order."""
    graph_level = levels(opt_level).graph
    return [name for name, level, _ in PIPELINE if graph_level >= level]


def optimize(graph: Graph, target: Target, opt_level: int = DEFAULT_OPT_LEVEL,
             timings: dict | None = None, passes: int | None = None,
             verify: bool | None = None, dump_ir: str | Path | None = None,
             after_pass: Callable[[str, Graph], None] | None = None) -> Graph:
    """The graph to compile for `target` at `opt_level` (only its first `passes` passes when
    given). With `verify` (default: the DNNC_VERIFY environment variable, which the test
    suite sets) the graph is verified after every pass, naming the pass that broke it.
    `timings` receives each pass's seconds by name; `dump_ir` is a folder that receives
    `00_input.txt` and, after the k-th pass run, `NN_name.txt` (NN = k, two digits) holding
    the graph's text form; `after_pass(name, graph)` is called after each pass."""
    if verify is None:
        verify = os.environ.get("DNNC_VERIFY", "") not in ("", "0")
    folder = None
    if dump_ir is not None:
        folder = Path(dump_ir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "00_input.txt").write_text(str(graph) + "\n")
    names = passes_at(opt_level)[:passes]
    out = graph
    for name, _, run in PIPELINE:
        if name not in names:
            continue
        start = time.perf_counter()
        out = run(out, target)
        seconds = time.perf_counter() - start
        if timings is not None:
            timings[name] = seconds
        log.debug("pass %s: %.2f ms, %d node(s)", name, seconds * 1e3, len(out.nodes))
        if verify:
            try:
                out.verify()
            except Exception as exc:
                raise CompileError(f"the graph is invalid after pass {name}: {exc}") from exc
        if folder is not None:
            number = names.index(name) + 1
            (folder / f"{number:02d}_{name}.txt").write_text(str(out) + "\n")
        if after_pass is not None:
            after_pass(name, out)
    return out
