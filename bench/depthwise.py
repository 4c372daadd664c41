"""The llvm depthwise conv template by rows and flat (stride 1), against onnxruntime, per layer,
measured in one run.

    python bench/depthwise.py [--threads N] [--repeat 50] [--blocks 5]

Layers: the stride-1 depthwise convs of MobileNetV2/V3 and EfficientNet-B0 at batch 1
(Conv + bias + Relu, random weights), each compiled for this host's llvm target twice, its
default config taking the rows (`FLAT_MAX_WIDTH` 0) and the flat plane (`FLAT_MAX_WIDTH`
past the image), and run by onnxruntime (same threads), timed in interleaved blocks (the
median block of `--repeat` calls each). Prints each one's microseconds and rows / flat and
flat / onnxruntime. Timing only: tests/backends/llvm/test_depthwise.py checks the template.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc.backends.llvm import depthwise  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402

LAYERS = [(32, 112, 3), (144, 56, 3), (192, 28, 3), (384, 14, 3), (960, 7, 3), (96, 56, 3),
          (240, 28, 5), (480, 14, 5), (672, 14, 5), (1152, 7, 5), (576, 7, 5), (120, 28, 5)]
"""(channels, image side, kernel): MobileNetV2's 3x3 and EfficientNet-B0's / MobileNetV3's
5x5 depthwise layers at stride 1 ("same" padding)."""


def layer(c: int, side: int, k: int, rng):
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    conv_node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, pads=[k // 2] * 4)
    relu = helper.make_node("Relu", ["y"], ["z"])
    graph = helper.make_graph(
        [conv_node, relu], "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                               [1, c, side, side])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal((1, c, side, side)).astype(np.float32)


def compiled(model, flat: bool):
    limit = depthwise.FLAT_MAX_WIDTH
    depthwise.FLAT_MAX_WIDTH = 1 << 20 if flat else 0
    try:
        return dnnc.compile(model, target="llvm", cache=False)
    finally:
        depthwise.FLAT_MAX_WIDTH = limit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)   # read when the pool starts
    print(f"# {platform.machine()}, {args.threads} threads; dnnc {dnnc.__version__}, "
          f"onnxruntime {ort.__version__}; batch 1")
    print(f"{'layer':>16} {'rows us':>8} {'flat us':>8} {'ort us':>8} {'rows/flat':>9} "
          f"{'flat/ort':>8} {'rows/ort':>8}")
    rng = np.random.default_rng(0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    for c, side, k in LAYERS:
        model, x = layer(c, side, k, rng)
        rows, flat = compiled(model, False), compiled(model, True)
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        fns = {"rows": lambda: rows.run(x), "flat": lambda: flat.run(x),
               "ort": lambda: session.run(None, {"x": x})}
        times = {name: [] for name in fns}
        for _ in range(args.blocks):
            for name, fn in fns.items():
                time.sleep(0.05)
                times[name].append(float(np.median(call_times_ms(fn, args.repeat, 3))))
        us = {name: 1e3 * float(np.median(v)) for name, v in times.items()}
        print(f"{f'{c}x{side}x{side} {k}x{k}':>16} {us['rows']:8.1f} {us['flat']:8.1f} "
              f"{us['ort']:8.1f} {us['rows'] / us['flat']:9.2f} {us['flat'] / us['ort']:8.2f} "
              f"{us['rows'] / us['ort']:8.2f}", flush=True)


if __name__ == "__main__":
    main()
