"""bf16 products on AMX tiles next to vdpbf16ps and fp32, measured in one run: for the
Sapphire/Emerald Rapids device host (docs/llvm_backend.md, "Precision").

    python bench/amx_bf16.py [--threads 1] [--repeat 20] [--shapes all|square|pointwise|convs]
                             [--order-of-y-t rows|columns]

Each product (a MatMul of constant weights, or a Conv of resnet50's) is compiled three
ways for this CPU: fp32; precision bf16 without the tiles (`-amx-bf16`: vdpbf16ps, the path
of CPUs without AMX); precision bf16 as this CPU takes it (AMX tiles where `amx_usable`,
the `amx_dense` / `amx_pointwise` / `amx_conv` templates). Each is the better of two
interleaved blocks' medians of `--repeat` calls. Prints GFLOP/s, the speedups over fp32 and
the largest difference between the two bf16 outputs (relative to the largest output: the
same rounded operands, summed in another order). Threads default to 1 (DNNC_NUM_THREADS is
set before the worker pool starts). Without AMX the third column is vdpbf16ps again (said
on the first line).
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
    "square": [("matmul 1024^3", (1024, 1024, 1024))],
    "all": [("matmul 1024^3", (1024, 1024, 1024)),
            ("bert 128x768x3072", (128, 768, 3072)),
            ("bert 128x3072x768", (128, 3072, 768)),
            ("rn50 1x1 64->256 56^2", ("conv", 64, 256, 56)),
            ("rn50 1x1 256->64 56^2", ("conv", 256, 64, 56)),
            ("rn50 1x1 512->128 28^2", ("conv", 512, 128, 28)),
            ("rn50 1x1 256->1024 14^2", ("conv", 256, 1024, 14)),
            ("rn50 1x1 2048->512 7^2", ("conv", 2048, 512, 7))],
    "pointwise": [("rn50 1x1 64->256 56^2", ("conv", 64, 256, 56)),
                  ("rn50 1x1 256->64 56^2", ("conv", 256, 64, 56)),
                  ("rn50 1x1 512->128 28^2", ("conv", 512, 128, 28))],
    "convs": [("rn50 1x1 64->256 56^2", ("conv", 64, 256, 56)),
              ("rn50 7x7 stem 3->64 224", ("conv", 3, 64, 224, 7, 2)),
              ("rn50 3x3 64->64 56^2", ("conv", 64, 64, 56, 3, 1)),
              ("rn50 3x3 128 s2 56->28", ("conv", 128, 128, 56, 3, 2)),
              ("rn50 3x3 128->128 28^2", ("conv", 128, 128, 28, 3, 1)),
              ("rn50 3x3 256->256 14^2", ("conv", 256, 256, 14, 3, 1)),
              ("rn50 3x3 512->512 7^2", ("conv", 512, 512, 7, 3, 1))],
}
"""Products timed: (m, k, n) MatMuls (bert-base's FFN at 128 tokens) and ("conv", C, M,
input size[, window, stride]) convs of resnet50 (1x1 unpadded; a k x k window padded by
k // 2), batch 1."""


def product_model(shape, rng):
    """(ONNX model, its input, its FLOPs) of a MatMul or a 1x1 Conv with constant weights."""
    from onnx import TensorProto, helper, numpy_helper

    if shape[0] == "conv":
        _, c, m, size, k, stride = shape + (1, 1)[len(shape) - 4:]
        out = (size + 2 * (k // 2) - k) // stride + 1
        w = (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        node = helper.make_node("Conv", ["X", "W"], ["Y"], kernel_shape=[k, k],
                                strides=[stride] * 2, pads=[k // 2] * 4)
        x_shape, y_shape = [1, c, size, size], [1, m, out, out]
        flops = 2.0 * c * m * k * k * out * out
    else:
        m, k, n = shape
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        node = helper.make_node("MatMul", ["X", "W"], ["Y"])
        x_shape, y_shape = [m, k], [m, n]
        flops = 2.0 * m * k * n
    graph = helper.make_graph(
        [node], "product", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal(x_shape).astype(np.float32), flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="all")
    parser.add_argument("--order-of-y-t", choices=("rows", "columns"), default=None,
                        help="amx_dense.ORDER_OF_Y_T for this run (a 1x1 conv's units)")
    args = parser.parse_args()
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)   # before the pool starts
    import dnnc
    from dnnc.backends.llvm import amx, amx_dense
    if args.order_of_y_t:
        amx_dense.ORDER_OF_Y_T = args.order_of_y_t   # (read by the default config)
    from dnnc.backends.llvm.cpu import cpu_from, host_target
    from dnnc.compiler.module import call_times_ms

    cpu = host_target()
    tiles = amx.amx_usable(cpu.feature_set)
    print(f"# {platform.machine()} {cpu.cpu}, {cpu.threads} thread(s), dnnc {dnnc.__version__}"
          f"; AMX-BF16 tiles {'used' if tiles else 'absent: the third column is vdpbf16ps'}"
          f"; 1x1 convs' units {amx_dense.ORDER_OF_Y_T} outside")
    variants = {"fp32": ("fp32", cpu), "vdpbf16ps": ("bf16", cpu_from(None, "-amx-bf16")),
                "amx": ("bf16", cpu)}
    print(f"{'product':26} {'fp32 GF/s':>10} {'vdp GF/s':>10} {'amx GF/s':>10} "
          f"{'vdp/fp32':>9} {'amx/fp32':>9} {'amx/vdp':>8} {'amx-vdp':>9}")
    rng = np.random.default_rng(0)
    for label, shape in SHAPES[args.shapes]:
        model, x, flops = product_model(shape, rng)
        compiled = {name: dnnc.compile(model, "llvm", precision=p, cpu=c, cache=False)
                    for name, (p, c) in variants.items()}
        if tiles:
            assert "tile_product" in compiled["amx"].source("loop"), label
        outs = {name: m.run(x)[0] for name, m in compiled.items()}
        diff = float(np.abs(outs["amx"] - outs["vdpbf16ps"]).max() / np.abs(outs["fp32"]).max())
        ms: dict[str, list[float]] = {name: [] for name in compiled}
        for _ in range(2):   # interleaved blocks, 0.2 s apart
            for name, m in compiled.items():
                time.sleep(0.2)
                ms[name].append(float(np.median(call_times_ms(lambda m=m: m.run(x),
                                                              args.repeat, 2))))
        best = {name: min(v) for name, v in ms.items()}
        gf = {name: flops / t / 1e6 for name, t in best.items()}
        print(f"{label:26} {gf['fp32']:10.1f} {gf['vdpbf16ps']:10.1f} {gf['amx']:10.1f} "
              f"{gf['vdpbf16ps'] / gf['fp32']:9.2f} {gf['amx'] / gf['fp32']:9.2f} "
              f"{gf['amx'] / gf['vdpbf16ps']:8.2f} {diff:9.1e}", flush=True)


if __name__ == "__main__":
    main()
