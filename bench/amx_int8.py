"""int8 products on AMX tiles next to vpdpbusd (VNNI), measured in one run: for the
Sapphire/Emerald Rapids device host (docs/llvm_backend.md, "int8").

    python bench/amx_int8.py [--threads 1] [--repeat 20] [--shapes all|dense|convs]

Each product is a fused integer op as fuse_quantized writes it (QuantizedDense of bert-base's
projections at 128 tokens, uint8 activations as quantize_dynamic makes them;
QuantizedConvPacked of resnet50's convs, int8 activations as quantize_static's QDQ makes
them; per-channel scales, int8 outputs), compiled twice for this CPU: without amx-int8
(`-amx-int8`: dense_int8 / conv_int8 on vpdpbusd, or the widening path where the CPU has no
VNNI) and as this CPU takes it (the `amx_*_int8` tile templates where `amx_usable`). Each
is the better of two interleaved blocks' medians of `--repeat` calls. Prints GOP/s (2 ops a
multiply-add), AMX / VNNI, whether the two outputs are the same bits (they must be) and the
template the AMX compile took. Threads default to 1 (DNNC_NUM_THREADS is set before the
worker pool starts). Without AMX both columns are the VNNI path (said on the first line).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "dense": [("bert 128x768x768", (128, 768, 768)),
              ("bert 128x768x3072", (128, 768, 3072)),
              ("bert 128x3072x768", (128, 3072, 768))],
    "convs": [("rn50 1x1 64->256 56^2", ("conv", 64, 256, 56)),
              ("rn50 1x1 256->64 56^2", ("conv", 256, 64, 56)),
              ("rn50 1x1 1024->256 14^2", ("conv", 1024, 256, 14)),
              ("rn50 7x7 stem 3->64 224", ("conv", 3, 64, 224, 7, 2)),
              ("rn50 3x3 64->64 56^2", ("conv", 64, 64, 56, 3, 1)),
              ("rn50 3x3 128 s2 56->28", ("conv", 128, 128, 56, 3, 2)),
              ("rn50 3x3 256->256 14^2", ("conv", 256, 256, 14, 3, 1)),
              ("rn50 3x3 512->512 7^2", ("conv", 512, 512, 7, 3, 1))],
}
SHAPES["all"] = SHAPES["dense"] + SHAPES["convs"]
"""Products timed: (m, k, n) QuantizedDense and ("conv", C, M, input size[, window,
stride]) QuantizedConvPacked (1x1 unpadded, k x k padded by k // 2), batch 1."""


def product_graph(shape, rng):
    """(dnnc Graph of one fused integer product, its input, its multiply-adds)."""
    from dnnc.ir import types as T
    from dnnc.ir.graph import Graph, Value
    from dnnc.ir.ops.quantized import pack_conv_groups, pack_groups

    def const(name, a):
        a = np.asarray(a)
        return Value(name, T.TensorType(T.DType.from_numpy(a.dtype), a.shape), const=a)

    g = Graph("product")
    if shape[0] == "conv":
        _, c, m, size, k, stride = shape + (1, 1)[len(shape) - 4:]
        out = (size + 2 * (k // 2) - k) // stride + 1
        w = rng.integers(-128, 128, (m, c, k, k)).astype(np.int8)
        x = g.add_input("x", T.TensorType(T.int8, (1, c, size, size)))
        sums = w.astype(np.int32).reshape(m, -1).sum(1).astype(np.int32)
        ins = [x, const("za", np.int8(-3)), const("w", pack_conv_groups(w)), const("s", sums),
               const("b", rng.integers(-1000, 1000, m).astype(np.int32)),
               const("sc", rng.uniform(1e-5, 1e-4, m).astype(np.float32)),
               const("yz", np.int8(2))]
        g.outputs = [g.add("QuantizedConvPacked", *ins, kernel_shape=[k, k],
                           strides=[stride] * 2, pads=[k // 2] * 4, oc=m, lo=None, hi=None)]
        feed = rng.integers(-128, 128, (1, c, size, size)).astype(np.int8)
        return g, feed, c * m * k * k * out * out
    m, k, n = shape
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    a = g.add_input("a", T.TensorType(T.uint8, (m, k)))
    ins = [a, const("za", np.uint8(120)), const("w", pack_groups(w)),
           const("s", w.astype(np.int32).sum(0).astype(np.int32)),
           const("b", rng.integers(-5000, 5000, n).astype(np.int32)),
           const("sc", rng.uniform(2e-6, 2e-5, n).astype(np.float32)), const("yz", np.int8(0))]
    g.outputs = [g.add("QuantizedDense", *ins, n=n, lo=None, hi=None)]
    return g, rng.integers(0, 256, (m, k)).astype(np.uint8), m * k * n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="all")
    args = parser.parse_args()
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)   # before the pool starts
    import dnnc
    from dnnc.backends.llvm import amx, amx_int8
    from dnnc.backends.llvm.cpu import cpu_from, host_target
    from dnnc.compiler.module import call_times_ms

    cpu = host_target()
    tiles = amx.amx_usable(cpu.feature_set, "u8s8")
    print(f"# {platform.machine()} {cpu.cpu}, {cpu.threads} thread(s), dnnc {dnnc.__version__}"
          f"; int8 products: {amx_int8.int8_products(cpu.feature_set)}"
          f"{'' if tiles else ' (no AMX-INT8: both columns are the same path)'}")
    variants = {"vnni": cpu_from(None, "-amx-int8"), "amx": cpu}
    print(f"{'product':26} {'vnni GOP/s':>11} {'amx GOP/s':>11} {'amx/vnni':>9} {'same bits':>10}"
          f"  template")
    rng = np.random.default_rng(0)
    for label, shape in SHAPES[args.shapes]:
        graph, x, macs = product_graph(shape, rng)
        compiled = {name: dnnc.compile(graph, "llvm", cpu=c, cache=False)
                    for name, c in variants.items()}
        if tiles:
            assert "tile_product" in compiled["amx"].source("loop"), label
        outs = {name: m.run(x)[0] for name, m in compiled.items()}
        same = bool(np.array_equal(outs["amx"], outs["vnni"]))
        template = compiled["amx"].profile(x, repeat=1)[0]["template"]
        ms: dict[str, list[float]] = {name: [] for name in compiled}
        for _ in range(2):   # interleaved blocks, 0.2 s apart
            for name, m in compiled.items():
                time.sleep(0.2)
                ms[name].append(float(np.median(call_times_ms(lambda m=m: m.run(x),
                                                              args.repeat, 2))))
        gops = {name: 2.0 * macs / min(t) / 1e6 for name, t in ms.items()}
        print(f"{label:26} {gops['vnni']:11.1f} {gops['amx']:11.1f} "
              f"{gops['amx'] / gops['vnni']:9.2f} {'yes' if same else 'NO':>10}  {template}",
              flush=True)


if __name__ == "__main__":
    main()
