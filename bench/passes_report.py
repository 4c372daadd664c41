"""What the graph passes do to the zoo, and the graph-passes issue's bars, measured in one run.

    python bench/passes_report.py [--models mlp,resnet50,...] [--repeat 10] [--batch 1]

Per model (llvm target): nodes as imported and after the pipeline, kernels, host fallbacks,
the arena against plan_memory's naive layout and its live lower bound, compile time, and the
median latency at opt level 0 and at the highest level (`dnnc.compiler.module.call_times_ms`,
as bench/cpu.py). Then each bar, PASS or FAIL:

- resnet50: no BatchNormalization after simplify, and at most (convs + 5) kernels;
- bert_tiny, bert_base: at most 12 kernels per encoder layer (kernels / layers, which charges
  the embeddings' and the mask's kernels to the layers; the kernels one more layer adds are
  printed beside it);
- every model: arena_bytes <= 1.15 * live_lower_bound_bytes;
- every model: faster at the highest level than at level 0.

Opt level 0 compiles every node as a kernel of its own: on BERT-Base and ResNet-50 it takes a
while; keep --repeat small there.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.compiler.driver import load_graph  # noqa: E402
from dnnc.backends.registry import REGISTRY  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402
from dnnc.levels import DEFAULT_OPT_LEVEL  # noqa: E402
from dnnc.passes.manager import optimize  # noqa: E402

DEFAULT_MODELS = ["mlp", "cnn", "resnet18", "resnet50", "mobilenet_v2", "bert_tiny", "bert_base"]
HIGHEST = 3
ARENA_SLACK = 1.15          # arena_bytes <= 1.15 * live_lower_bound_bytes
BERT_KERNELS_PER_LAYER = 12
RESNET50_EXTRA_KERNELS = 5  # kernels <= convs + 5


def median_ms(fn, repeat: int, warmup: int = 2) -> float:
    time.sleep(0.5)   # let the previous compile's or timing's threads go idle
    return float(np.median(call_times_ms(fn, repeat, warmup)))


def zoo_config(model) -> dict:
    """The builder's settings the zoo records in the model's metadata (layers, ...)."""
    props = {p.key: p.value for p in model.metadata_props}
    return json.loads(props.get("dnnc.zoo.config", "{}"))


def ops_after_simplify(model) -> dict[str, int]:
    """Op counts of the graph right after the simplify pass (at the highest level)."""
    counts: dict[str, int] = {}

    def after(name, graph):
        if name == "simplify":
            for node in graph.nodes:
                counts[node.op] = counts.get(node.op, 0) + 1

    optimize(load_graph(model), REGISTRY["llvm"].target(), HIGHEST, after_pass=after)
    return counts


def planned_kernels(model) -> int:
    """The kernels the llvm backend forms for `model` at the highest level, counted without
    lowering or compiling (what `dnnc inspect --passes` prints)."""
    from dnnc.backends.plan import count_kernels

    return count_kernels(optimize(load_graph(model), REGISTRY["llvm"].target(), HIGHEST))


def measure(name: str, batch: int, repeat: int) -> dict:
    model = zoo.build(name, batch=batch)
    inputs = list(zoo.inputs_for(model, np.random.default_rng(0)).values())
    row = {"model": name, "imported_nodes": len(model.graph.node),
           "convs": sum(1 for n in model.graph.node if n.op_type == "Conv"),
           "layers": zoo_config(model).get("layers")}
    start = time.perf_counter()
    best = dnnc.compile(model, target="llvm", opt_level=HIGHEST, progress=False)
    row["compile_s"] = time.perf_counter() - start
    stats = best.stats
    for key in ("nodes", "kernels", "host_fallback_ops", "arena_bytes", "naive_bytes",
                "live_lower_bound_bytes"):
        row[key] = stats.get(key, 0)
    reference = dnnc.compile(model, target="numpy").run(*inputs)
    outs = best.run(*inputs)
    row["ok"] = all(np.allclose(o, r, rtol=1e-3, atol=1e-4) for o, r in zip(outs, reference))
    row["best_ms"] = median_ms(lambda: best.run(*inputs), repeat)
    if name == "resnet50":
        row["bn_after_simplify"] = ops_after_simplify(model).get("BatchNormalization", 0)
    if name.startswith("bert") and row["layers"] and row["layers"] > 1:
        # what one more encoder layer adds: the kernels of a layer, embeddings not charged
        fewer = zoo.build(name, batch=batch, layers=row["layers"] - 1)
        row["kernels_per_layer"] = row["kernels"] - planned_kernels(fewer)
        del fewer
    del best, outs, reference
    gc.collect()
    start = time.perf_counter()
    plain = dnnc.compile(model, target="llvm", opt_level=0, progress=False)
    row["compile0_s"] = time.perf_counter() - start
    row["level0_ms"] = median_ms(lambda: plain.run(*inputs), repeat)
    del plain
    gc.collect()
    return row


def bars(rows: dict[str, dict]) -> list[tuple[str, bool | None, str]]:
    """(bar, passed or None when its model was not measured, the figures)."""
    out = []
    r50 = rows.get("resnet50")
    if r50 is None:
        out.append(("resnet50: no BatchNormalization after simplify", None, "not measured"))
        out.append(("resnet50: kernels <= convs + 5", None, "not measured"))
    else:
        out.append(("resnet50: no BatchNormalization after simplify",
                    r50["bn_after_simplify"] == 0, f"{r50['bn_after_simplify']} left"))
        limit = r50["convs"] + RESNET50_EXTRA_KERNELS
        out.append(("resnet50: kernels <= convs + 5", r50["kernels"] <= limit,
                    f"{r50['kernels']} kernels, {r50['convs']} convs + 5 = {limit}"))
    for name in ("bert_tiny", "bert_base"):
        r = rows.get(name)
        label = f"{name}: kernels per layer <= {BERT_KERNELS_PER_LAYER}"
        if r is None:
            out.append((label, None, "not measured"))
        else:
            per = r["kernels"] / r["layers"]
            figures = f"{r['kernels']} kernels / {r['layers']} layers = {per:.1f}"
            if "kernels_per_layer" in r:
                rest = r["kernels"] - r["layers"] * r["kernels_per_layer"]
                figures += (f" (one layer adds {r['kernels_per_layer']}; {rest} outside the "
                            f"layers: embeddings, mask)")
            out.append((label, per <= BERT_KERNELS_PER_LAYER, figures))
    for name, r in rows.items():
        bound = r["live_lower_bound_bytes"]
        ratio = r["arena_bytes"] / bound if bound else 1.0
        out.append((f"{name}: arena <= {ARENA_SLACK} x live lower bound",
                    r["arena_bytes"] <= ARENA_SLACK * bound,
                    f"{r['arena_bytes']:,} / {bound:,} = {ratio:.3f}"))
    for name, r in rows.items():
        out.append((f"{name}: faster at level {HIGHEST} than at level 0",
                    r["best_ms"] < r["level0_ms"],
                    f"{r['best_ms']:.3f} ms vs {r['level0_ms']:.3f} ms"))
    return out


def main() -> None:
    import llvmlite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    assert HIGHEST == DEFAULT_OPT_LEVEL
    cpu = host_target()
    print(f"# {platform.machine()} {cpu.cpu} ({cpu.vector_bits}-bit vectors), "
          f"{cpu.threads} threads; dnnc {dnnc.__version__}, llvmlite {llvmlite.__version__}, "
          f"numpy {np.__version__}, python {platform.python_version()}; batch {args.batch}, "
          f"median of {args.repeat}")
    print(f"{'model':13} {'nodes':>9} {'kernels':>7} {'fallbk':>6} {'arena KiB':>10} "
          f"{'naive KiB':>10} {'bound KiB':>10} {'a/bound':>7} {'compile s':>9} "
          f"{'O0 ms':>9} {'O3 ms':>9} {'O0/O3':>6}  check")
    rows = {}
    for name in args.models.split(","):
        r = rows[name] = measure(name, args.batch, args.repeat)
        bound = r["live_lower_bound_bytes"]
        print(f"{name:13} {r['imported_nodes']:>4}>{r['nodes']:<4} {r['kernels']:>7} "
              f"{r['host_fallback_ops']:>6} {r['arena_bytes'] / 1024:>10.0f} "
              f"{r['naive_bytes'] / 1024:>10.0f} {bound / 1024:>10.0f} "
              f"{r['arena_bytes'] / bound if bound else 1.0:>7.3f} {r['compile_s']:>9.1f} "
              f"{r['level0_ms']:>9.2f} {r['best_ms']:>9.2f} "
              f"{r['level0_ms'] / r['best_ms']:>6.2f}  {'ok' if r['ok'] else 'MISMATCH'}",
              flush=True)
    print()
    results = bars(rows)
    for label, passed, figures in results:
        verdict = "n/a " if passed is None else ("PASS" if passed else "FAIL")
        print(f"{verdict}  {label:<52} {figures}")
    measured = [p for _, p, _ in results if p is not None]
    print(f"{sum(measured)}/{len(measured)} bars pass"
          f"{'' if len(measured) == len(results) else ' (some models not measured)'}")


if __name__ == "__main__":
    main()
