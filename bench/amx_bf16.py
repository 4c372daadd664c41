"""AMX-BF16 tiles next to AVX512_BF16 and fp32, one matrix product, one thread: for the
Sapphire/Emerald Rapids device host (no AMX here; docs/llvm_backend.md, "Precision").

    python bench/amx_bf16.py [--size 1024] [--repeat 20]

Times C += A B (M = N = K = --size, a multiple of 32) three ways in one run: the probe tile
kernel (`backends/llvm/amx.tile_gemm_module`: 16 x 16 tiles of C, tdpbf16ps, no blocking for
caches), dnnc's MatMul at precision bf16 (vdpbf16ps) and at fp32, each the median of
`--repeat` calls, and checks the tile kernel against the float64 product of the bf16
operands. Prints GFLOP/s and the ratios to fp32; exits with a message where the CPU has no
amx-tile/amx-bf16 or Linux refuses the tile state (arch_prctl ARCH_REQ_XCOMP_PERM).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DNNC_NUM_THREADS", "1")   # before the worker pool starts

import dnnc  # noqa: E402
from dnnc.backends.llvm import amx  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.backends.llvm.jit import JITModule  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402
from dnnc.ir.ops.linalg import pack_pairs  # noqa: E402


def matmul_model(a_shape, b: np.ndarray):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])], "mm",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a_shape))],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [a_shape[0], b.shape[1]])],
        [numpy_helper.from_array(b, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    size = args.size
    if size % 32:
        sys.exit("--size must be a multiple of 32")
    cpu = host_target()
    print(f"# {platform.machine()} {cpu.cpu}, {cpu.threads} thread(s), dnnc {dnnc.__version__},"
          f" M = N = K = {size}")
    if not amx.amx_features(cpu.feature_set):
        sys.exit(f"this CPU ({cpu.cpu}) has no amx-tile/amx-bf16")
    if not amx.request_tile_state():
        sys.exit("Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(np.float32)
    b = rng.standard_normal((size, size)).astype(np.float32)
    a_pairs = np.ascontiguousarray(a.astype(ml_dtypes.bfloat16)).view(np.uint32)
    b_pairs = np.ascontiguousarray(pack_pairs(b, size)[0]).view(np.uint32).reshape(
        size // 2, size)
    jm = JITModule(str(amx.tile_gemm_module()), cpu, 2)
    kernel = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 3)(
        jm.address("amx_gemm"))
    c = np.zeros((size, size), np.float32)

    def tiles():
        c[:] = 0
        kernel(c.ctypes.data, a_pairs.ctypes.data, b_pairs.ctypes.data, size, size, size // 2)

    tiles()
    rounded = [x.astype(ml_dtypes.bfloat16).astype(np.float64) for x in (a, b)]
    error = np.abs(c - rounded[0] @ rounded[1]).max() / np.abs(c).max()
    model = matmul_model(a.shape, b)
    runs = {"amx tiles": tiles}
    for precision in ("bf16", "fp32"):
        compiled = dnnc.compile(model, "llvm", precision=precision)
        runs[f"dnnc {precision}"] = lambda m=compiled: m.run(a)
    flops = 2.0 * size ** 3
    ms = {}
    for name, fn in runs.items():
        time.sleep(0.3)
        ms[name] = float(np.median(call_times_ms(fn, args.repeat, 2)))
    print(f"{'':12} {'ms':>9} {'GFLOP/s':>9} {'fp32/this':>9}")
    for name, t in ms.items():
        print(f"{name:12} {t:9.3f} {flops / t / 1e6:9.1f} {ms['dnnc fp32'] / t:9.2f}")
    print(f"amx tiles: largest error against the product of the bf16 operands {error:.2e} "
          f"(of the largest output)")


if __name__ == "__main__":
    main()
