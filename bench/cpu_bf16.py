"""dnnc's llvm target at precision bf16 next to fp32, measured in one run.

    python bench/cpu_bf16.py [--models resnet18,mobilenet_v2,bert_tiny] [--batch 1]
                             [--threads 1] [--repeat 20] [--blocks 3] [--mattr -avx512bf16]

Each zoo model is compiled twice (precision fp32 and bf16, both for this CPU or the one
`--mattr` edits: `-avx512bf16` shows the fallback, bf16-rounded operands through fp32 FMAs),
on a CPU with AMX-BF16 tiles three times (bf16 also with `-amx-bf16`: its products on
vdpbf16ps, the "vdp" columns), and timed in interleaved blocks of `--repeat` calls, 0.3 s
apart, the median block each; OpenVINO in its default precision (bf16 on a CPU with native
bf16, on AMX where there is AMX: the peer issue 32 names) beside them where it is installed
("ov" columns: its latency and dnnc bf16 / OpenVINO).
Prints both latencies, fp32 / bf16 (the speedup) and the bf16 output's error against fp32's,
relative to its largest magnitude, next to the contract (`model_error_bound("bf16")`), and
the geometric mean of the speedups. Threads default to 1 (DNNC_NUM_THREADS is set before the
worker pool starts). Which products run on vdpbf16ps: docs/llvm_backend.md, "Precision".
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.ir.target import model_error_bound  # noqa: E402
from cpu import median_block_ms, openvino_peer  # noqa: E402  (bench/cpu.py, beside this script)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_tiny")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--mattr", default=None,
                        help="edit the host's CPU features, e.g. -avx512bf16")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false",
                        help="leave out OpenVINO (its default precision), timed where "
                             "installed")
    args = parser.parse_args()
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)   # before the pool starts
    from dnnc.backends.llvm import amx
    from dnnc.backends.llvm.cpu import cpu_from, host_target

    cpu = cpu_from(mattr=args.mattr) if args.mattr else host_target()
    bf16 = "+" if "avx512bf16" in cpu.feature_set else "-"
    variants = {"fp32": ("fp32", cpu), "bf16": ("bf16", cpu)}
    tiles = amx.amx_usable(cpu.feature_set)
    if tiles:   # the products on AMX tiles; vdpbf16ps beside them, as a CPU without AMX runs
        variants["bf16-vdp"] = ("bf16", cpu_from(mattr=",".join(
            x for x in (args.mattr, "-amx-bf16") if x)))
    print(f"# {platform.machine()} {cpu.cpu} ({cpu.vector_bits}-bit vectors, {bf16}avx512bf16"
          f"{', AMX-BF16 tiles' if tiles else ''}{', ' + args.mattr if args.mattr else ''}), "
          f"{cpu.threads} thread(s); dnnc {dnnc.__version__}, batch {args.batch}")
    openvino = args.openvino and importlib.util.find_spec("openvino") is not None
    extra = f" {'vdp ms':>9} {'fp32/vdp':>9}" if tiles else ""
    extra += f" {'ov ms':>9} {'bf16/ov':>8}" if openvino else ""
    print(f"{'model':14} {'fp32 ms':>9} {'bf16 ms':>9} {'fp32/bf16':>9}{extra} "
          f"{'bf16 error':>10} {'bound':>7}")
    speedups = []
    for name in args.models.split(","):
        model = zoo.build(name, batch=args.batch)
        inputs = zoo.inputs_for(model, np.random.default_rng(0))
        feeds = list(inputs.values())
        compiled = {v: dnnc.compile(model, "llvm", precision=p, cpu=c)
                    for v, (p, c) in variants.items()}
        runs = {v: (lambda c=c: c.run(*feeds)) for v, c in compiled.items()}
        if openvino:   # its default precision: bf16 (on AMX where there is AMX) on such CPUs
            peer = openvino_peer(model, cpu.threads, None)
            runs["openvino"] = lambda: peer.run(inputs)
        ms = median_block_ms(runs, args.repeat, args.blocks)
        want = compiled["fp32"].run(*feeds)
        got = compiled["bf16"].run(*feeds)
        error = max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want))
        speedups.append(ms["fp32"] / ms["bf16"])
        extra = f" {ms['bf16-vdp']:9.2f} {ms['fp32'] / ms['bf16-vdp']:9.2f}" if tiles else ""
        if openvino:
            extra += f" {ms['openvino']:9.2f} {ms['bf16'] / ms['openvino']:8.2f}"
        print(f"{name:14} {ms['fp32']:9.2f} {ms['bf16']:9.2f} {speedups[-1]:9.2f}{extra} "
              f"{error:10.2e} {model_error_bound('bf16'):7.2e}", flush=True)
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    print(f"geometric mean fp32/bf16: {geo:.2f}")


if __name__ == "__main__":
    main()
