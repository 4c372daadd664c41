"""Where dnnc (llvm) loses time to onnxruntime on a model, by node kind, measured in one run.

    python bench/cpu_ops.py MODEL.onnx|ZOO_NAME [...] [--threads N] [--repeat 20]

Each model is compiled by dnnc and profiled (`CompiledModel.profile`: each kernel timed alone,
its median) and run by onnxruntime with its profiler on (each node's median duration over
`--repeat` calls, same thread count). Both are grouped by the kind of the ONNX node they
compute ("Conv 3x3 s1", "Conv 3x3 s1 depthwise", "Conv 1x1 s1", "MatMul", "GlobalAveragePool",
...): a dnnc kernel counts for the first conv / matmul / pool among its fused nodes (else its
first node), an onnxruntime node for the ONNX node whose name it carries (its fused nodes
keep the first one's name). Prints per kind: dnnc ms, onnxruntime ms, their difference and
the ratio, the largest loss first, with the machine and versions on the first line. Timing
only: the profiles are both runtimes' own, each with its overhead (sums differ a little from
a whole call's time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402

ANCHORS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "MaxPool", "AveragePool",
           "GlobalAveragePool", "ReduceMean")
"""Node kinds that name a fused kernel (the first of these among its nodes)."""


def node_kinds(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> "Conv KxK sS [depthwise|grouped]" for a conv (ONNX's, or onnxruntime's
    FusedConv and NCHWc Conv), its op otherwise."""
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    kinds = {}
    for node in model.graph.node:
        kinds[node.name] = node.op_type
        if node.op_type not in ("Conv", "FusedConv") or len(node.input) < 2:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w = weights.get(node.input[1])
        k = attrs.get("kernel_shape") or (w[2:3] if w else ["?"])
        s = (attrs.get("strides") or [1])[0]
        group = attrs.get("group", 1)
        kind = f"Conv {k[0]}x{k[0]} s{s}"
        if group > 1:
            kind += " depthwise" if w and w[1] == 1 else " grouped"
        kinds[node.name] = kind
    return kinds


def dnnc_kinds(compiled, inputs, kinds: dict, repeat: int) -> dict:
    per = defaultdict(float)
    compiled.profile(*inputs.values(), repeat=3)
    for row in compiled.profile(*inputs.values(), repeat=repeat):
        names = [n for n in row.get("nodes", []) if n in kinds]
        anchor = next((n for n in names if kinds[n].split()[0] in ANCHORS), None)
        anchor = anchor or (names[0] if names else None)
        per[kinds[anchor] if anchor else "(other)"] += row["ms"]
    return per


def ort_kinds(model: onnx.ModelProto, inputs, threads: int, repeat: int) -> dict:
    """onnxruntime's nodes by kind: each read from its own optimised graph (saved beside the
    profile), where its NCHWc and fused convs carry their attributes and weights."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    folder = tempfile.mkdtemp()
    options.profile_file_prefix = os.path.join(folder, "ort")
    options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    for _ in range(3 + repeat):
        session.run(None, inputs)
    events = json.load(open(session.end_profiling()))
    kinds = node_kinds(onnx.load(options.optimized_model_filepath))
    durations = defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            durations[event["name"][:-len("_kernel_time")]].append(event["dur"] / 1e3)
    per = defaultdict(float)
    for name, times in durations.items():
        times = times[3:] or times
        per[kinds.get(name, "(other)")] += float(np.median(times))
    return per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)   # read when the pool starts
    print(f"# {platform.machine()}, {args.threads} threads; dnnc {dnnc.__version__}, "
          f"onnxruntime {ort.__version__}; batch 1")
    for entry in args.models:
        if entry.endswith(".onnx"):
            model = onnx.load(entry)
            name = Path(entry).stem
        else:
            model, name = zoo.build(entry, batch=1), entry
        model = onnx.shape_inference.infer_shapes(model)
        for node_index, node in enumerate(model.graph.node):
            node.name = node.name or f"{node.op_type}_{node_index}"
        kinds = node_kinds(model)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        inputs = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in
                                               i.shape]).astype(np.float32)
                  for i in session.get_inputs()}
        compiled = dnnc.compile(model, target="llvm", cache=False)
        ours = dnnc_kinds(compiled, inputs, kinds, args.repeat)
        theirs = ort_kinds(model, inputs, args.threads, args.repeat)
        print(f"\n{name}: dnnc {sum(ours.values()):.2f} ms, onnxruntime "
              f"{sum(theirs.values()):.2f} ms (sums of the profiles)")
        print(f"{'kind':32} {'dnnc ms':>8} {'ort ms':>8} {'loss ms':>8} {'ratio':>6}")
        for kind in sorted(set(ours) | set(theirs), key=lambda k: ours[k] - theirs[k],
                           reverse=True):
            ratio = ours[kind] / theirs[kind] if theirs[kind] else float("inf")
            print(f"{kind:32} {ours[kind]:8.3f} {theirs[kind]:8.3f} "
                  f"{ours[kind] - theirs[kind]:8.3f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
