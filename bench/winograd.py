"""Winograd F(m x m, 3x3) against the direct conv on llvm, measured in one run, per layer and
per model.

    python bench/winograd.py [--threads N] [--repeat 20] [--blocks 5] [--tiles 2,4,6]
                             [--models resnet18,...] [--no-layers] [--precision fp32|bf16]

Layers: the 3x3 stride-1 convolutions of ResNet-18/50 and VGG at batch 1 (Conv + bias + Relu,
random weights), each compiled for this host's llvm target direct ("winograd_conv" left out)
and once per tile of `--tiles` (the cost estimate's choice, `winograd_tile`, forced to it),
all timed in interleaved blocks (the median block of `--repeat` calls each). Prints each
one's milliseconds as direct / it (above 1: faster than direct), each one's largest error
relative to the largest output against a float64 NumPy reference, and the tile the cost
estimate picks ("-": direct) with its estimated direct / it. `--models` times whole zoo models
direct, with F(2x2) wherever the estimate picks Winograd, and with the estimate's tiles (and
onnxruntime, same threads), each over direct. `--precision bf16` compiles every variant at
bf16 (direct: the bf16 direct conv; Winograd: bf16 products, F(2x2) the only tile the estimate
weighs there; pass `--tiles 2,4` to time F(4x4) too). Timing only: what it measures is checked by
tests/backends/llvm/test_winograd.py, never here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.entry import runtime  # noqa: E402
from dnnc.backends.registry import REGISTRY  # noqa: E402
from dnnc.compiler.module import CompiledModel, call_times_ms  # noqa: E402
from dnnc.frontend.onnx import import_onnx  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.ops.conv import conv  # noqa: E402
from dnnc.passes import convert_layout  # noqa: E402
from dnnc.passes.conv_costs import conv3x3_costs  # noqa: E402
from dnnc.passes.manager import optimize  # noqa: E402

LAYERS = [(64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7), (64, 128, 56),
          (128, 256, 28), (256, 512, 14), (32, 32, 112), (16, 16, 56), (32, 64, 56),
          (64, 64, 28), (128, 128, 14), (256, 256, 7)]
"""(input channels, output channels, image side): ResNet-18/50's 3x3 stride-1 layers, VGG's
mixed ones, and the smaller and fewer-channel layers where the cost estimate weighs direct
against Winograd closely."""


def compiled(graph: Graph, winograd: bool | int | str, precision: str) -> CompiledModel:
    """`graph` compiled for this host's llvm target at `precision` without "winograd_conv"
    (False), with it and its cost estimate's choice (True), with tile m forced (m), or with
    F(2x2) where the estimate picks any tile ("F2")."""
    target = REGISTRY["llvm"].target(precision=precision)
    layouts = tuple(name for name in target.layouts if name != "winograd_conv")
    target = dataclasses.replace(target, layouts=("winograd_conv",) * bool(winograd) + layouts)
    choose = convert_layout.winograd_tile
    if winograd == "F2":     # F(2x2) wherever the estimate picks Winograd
        convert_layout.winograd_tile = lambda node, target: choose(node, target) and 2
    elif winograd is not True and winograd:
        convert_layout.winograd_tile = lambda node, target: winograd
    try:
        graph = optimize(graph, target)
    finally:
        convert_layout.winograd_tile = choose
    return CompiledModel(graph, runtime(graph, 3, target), "llvm")


def layer(c: int, m: int, side: int, rng) -> tuple[Graph, np.ndarray, np.ndarray, np.ndarray]:
    g = Graph("conv")
    x = g.add_input("x", T.TensorType(T.float32, (1, c, side, side)))
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    y = g.add("Conv", x, Value("w", T.TensorType(T.float32, w.shape), const=w),
              Value("b", T.TensorType(T.float32, b.shape), const=b), pads=[1] * 4)
    g.outputs = [g.add("Relu", y)]
    return g, w, b, rng.standard_normal((1, c, side, side)).astype(np.float32)


def interleaved(fns: dict, repeat: int, blocks: int) -> dict:
    times = {k: [] for k in fns}
    for _ in range(blocks):
        for k, fn in fns.items():
            time.sleep(0.05)
            times[k].append(float(np.median(call_times_ms(fn, repeat, 2))))
    return {k: float(np.median(v)) for k, v in times.items()}


def layers_table(args) -> None:
    tiles = [int(m) for m in args.tiles.split(",")]
    target = REGISTRY["llvm"].target()
    rng = np.random.default_rng(0)
    print(f"{'layer':>16} {'direct ms':>10} " + " ".join(f"{f'/F{m}':>7}" for m in tiles) +
          f" {'err direct':>11} " + " ".join(f"{f'err F{m}':>9}" for m in tiles) +
          f" {'picks':>6} {'est':>5}")
    for c, m, side in LAYERS:
        graph, w, b, x = layer(c, m, side, rng)
        ref = np.maximum(conv(x.astype(np.float64), w.astype(np.float64),
                              b.astype(np.float64), pads=[1] * 4), 0)
        models = {"direct": compiled(graph, False, args.precision),
                  **{t: compiled(graph, t, args.precision) for t in tiles}}
        errs = {k: np.abs(mod.run(x)[0] - ref).max() / np.abs(ref).max()
                for k, mod in models.items()}
        ms = interleaved({k: (lambda mod=mod: mod.run(x)) for k, mod in models.items()},
                         args.repeat, args.blocks)
        costs = conv3x3_costs(1, c, m, side, side, target.panel("pack_conv"),
                              target.vector_bits, target.threads, args.precision,
                              target.fma_ports)
        pick = min(costs, key=costs.get)
        print(f"{f'{c}->{m} @{side}':>16} {ms['direct']:10.3f} " +
              " ".join(f"{ms['direct'] / ms[t]:7.2f}" for t in tiles) +
              f" {errs['direct']:11.2e} " + " ".join(f"{errs[t]:9.2e}" for t in tiles) +
              f" {pick or '-':>6} {costs[None] / costs[pick]:5.2f}", flush=True)


def models_table(args) -> None:
    import onnxruntime as ort

    print(f"{'model':>16} {'direct ms':>10} {'F2 ms':>8} {'chosen ms':>10} {'ort ms':>8} "
          f"{'F2/direct':>9} {'chosen/direct':>13} {'chosen/ort':>10}")
    for name in args.models.split(","):
        model = zoo.build(name, batch=1)
        feeds = zoo.inputs_for(model, np.random.default_rng(0))
        graph = import_onnx(model)
        models = {"direct": compiled(graph, False, args.precision),
                  "F2": compiled(graph, "F2", args.precision),
                  "chosen": compiled(graph, True, args.precision)}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ["DNNC_NUM_THREADS"])
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        fns = {k: (lambda mod=mod: mod.run(*feeds.values())) for k, mod in models.items()}
        ms = interleaved({**fns, "ort": lambda: session.run(None, feeds)}, args.repeat,
                         args.blocks)
        print(f"{name:>16} {ms['direct']:10.2f} {ms['F2']:8.2f} {ms['chosen']:10.2f} "
              f"{ms['ort']:8.2f} {ms['F2'] / ms['direct']:9.2f} "
              f"{ms['chosen'] / ms['direct']:13.2f} {ms['chosen'] / ms['ort']:10.2f}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--tiles", default="2,4,6")
    parser.add_argument("--models", default="")
    parser.add_argument("--no-layers", action="store_true")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)   # read when the pool starts
    target = REGISTRY["llvm"].target()
    print(f"# {platform.machine()} {target.cpu} ({target.vector_bits}-bit vectors), "
          f"{target.threads} threads; dnnc {dnnc.__version__}; batch 1; precision "
          f"{args.precision}")
    if not args.no_layers:
        layers_table(args)
    if args.models:
        models_table(args)


if __name__ == "__main__":
    main()
