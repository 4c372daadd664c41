"""Kernel throughput of dnnc's default schedules next to their peers, measured in one run.

    python bench/kernels.py [--repeat 20]

dense 1024x1024x1024 and bert_base's FFN (128x768 @ 768x3072) against NumPy's matmul
(OpenBLAS), and resnet50's 3x3 conv (64->64, 56x56, batch 1) against onnxruntime running that
single Conv; both sides use the same thread count. If OPENBLAS_CORETYPE is set, run this with
it (and OPENBLAS_L2_SIZE) unset so OpenBLAS picks its best kernel for this CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402


def median_ms(fn, repeat: int, warmup: int = 3) -> float:
    time.sleep(1.0)  # let the previous timing's spinning threads (OpenBLAS, onnxruntime) idle
    return float(np.median(call_times_ms(fn, repeat, warmup)))


def dense_case(m, k, n, repeat):
    rng = np.random.default_rng(0)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    g = Graph("dense")
    x = g.add_input("a", T.TensorType(T.float32, (m, k)))
    g.outputs = [g.add("MatMul", x, Value("b", T.TensorType(T.float32, (k, n)), const=b))]
    compiled = dnnc.compile(g, target="llvm")
    # each side is timed before the other runs at all: OpenBLAS's and onnxruntime's idle
    # threads spin for a while after a call and would steal the cores from the next timing
    ours = median_ms(lambda: compiled.run(a), repeat)
    peer = median_ms(lambda: a @ b, repeat)
    np.testing.assert_allclose(compiled.run(a)[0], a @ b, rtol=1e-4, atol=1e-3)
    return 2 * m * n * k, ours, peer


def conv_case(repeat, threads):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    compiled = dnnc.compile(model, target="llvm")
    ours = median_ms(lambda: compiled.run(x), repeat)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    peer = median_ms(lambda: session.run(None, {"x": x}), repeat)
    np.testing.assert_allclose(compiled.run(x)[0], session.run(None, {"x": x})[0], rtol=1e-4,
                               atol=1e-4)
    return 2 * 64 * 64 * 9 * 56 * 56, ours, peer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    cpu = host_target()
    threads = cpu.threads
    print(f"# {platform.machine()} {cpu.cpu} ({cpu.vector_bits}-bit vectors), {threads} "
          f"threads, dnnc {dnnc.__version__}, numpy {np.__version__}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
    print(f"{'kernel':34} {'dnnc GFLOP/s':>13} {'peer GFLOP/s':>13} {'ratio':>7}  peer")
    rows = [("dense 1024x1024x1024", dense_case(1024, 1024, 1024, args.repeat), "numpy matmul"),
            ("dense bert FFN 128x768x3072", dense_case(128, 768, 3072, args.repeat),
             "numpy matmul")]
    try:
        rows.append(("conv 3x3 64->64 56x56 (resnet50)", conv_case(args.repeat, threads),
                     "onnxruntime Conv"))
    except ImportError:
        print("(onnxruntime not installed: conv row skipped)")
    for name, (flops, ours, peer), who in rows:
        g_ours, g_peer = flops / ours / 1e6, flops / peer / 1e6
        print(f"{name:34} {g_ours:13.1f} {g_peer:13.1f} {g_ours / g_peer:7.2f}  {who}")


if __name__ == "__main__":
    main()
