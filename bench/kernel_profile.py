"""Where a zoo model's time goes on the llvm target: each kernel called alone.

    python bench/kernel_profile.py resnet50 [--top 15] [--repeat 20] [--batch 1]

Prints each kernel (by its fused nodes) with its median milliseconds, sorted by time, the sum
over kernels next to the whole model's median call (the difference is the per-call overhead),
and onnxruntime's median for the same model, all measured in this run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo model name")
    parser.add_argument("--top", type=int, default=15, help="kernels to list (default 15)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    cpu = host_target()
    threads = cpu.threads
    print(f"# {platform.machine()} {cpu.cpu} ({cpu.vector_bits}-bit vectors), {threads} "
          f"threads; dnnc {dnnc.__version__}, onnxruntime {ort.__version__}")
    model = zoo.build(args.model, batch=args.batch)
    inputs = zoo.inputs_for(model, np.random.default_rng(0))
    compiled = dnnc.compile(model, target="llvm")
    arrays, _ = compiled.check_inputs((), inputs)
    _, rows = compiled.runtime.profile(arrays, args.repeat)
    whole = float(np.median(call_times_ms(lambda: compiled.run(**inputs), args.repeat, 3)))
    time.sleep(1.0)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    peer = float(np.median(call_times_ms(lambda: session.run(None, inputs), args.repeat, 3)))
    total = sum(r["ms"] for r in rows)
    print(f"{'ms':>8} {'share':>6}  kernel (nodes)")
    for r in sorted(rows, key=lambda r: -r["ms"])[:args.top]:
        nodes = ", ".join(r["nodes"][:4]) + (", ..." if len(r["nodes"]) > 4 else "")
        print(f"{r['ms']:8.3f} {r['ms'] / total:6.1%}  {r['kernel']} ({nodes})")
    print(f"{len(rows)} kernels sum {total:.3f} ms; whole call {whole:.3f} ms; "
          f"onnxruntime {peer:.3f} ms; ratio {whole / peer:.2f}")


if __name__ == "__main__":
    main()
