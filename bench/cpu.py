"""dnnc (llvm target) next to onnxruntime on the zoo, measured in one run.

    python bench/cpu.py [--models mlp,resnet18,...] [--batch 1] [--repeat 20] [--opt-level N]
                         [--mattr -avx512f]

Both run with the same thread count (dnnc's worker pool size, DNNC_NUM_THREADS or the cores
this process may use; onnxruntime's intra-op threads set to match). Prints median latencies,
the ratio dnnc / onnxruntime per model, and their geometric mean.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.runtime import cpu_from, host_cpu, num_threads  # noqa: E402

DEFAULT_MODELS = ["mlp", "cnn", "resnet18", "resnet50", "mobilenet_v2", "bert_tiny", "bert_base"]


def median_ms(fn, repeat: int, warmup: int = 2) -> float:
    time.sleep(1.0)  # let the previous timing's spinning threads (OpenBLAS, onnxruntime) idle
    return float(np.median(call_times_ms(fn, repeat, warmup)))


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--opt-level", type=int, default=None)
    parser.add_argument("--mattr", default=None,
                        help="edit the host's CPU features for dnnc, e.g. -avx512f to see how "
                             "an AVX2-only machine's code fares (onnxruntime is unchanged)")
    args = parser.parse_args()
    threads = num_threads()
    cpu = cpu_from(mattr=args.mattr) if args.mattr else host_cpu()
    print(f"# {platform.machine()} {cpu.name} ({cpu.vector_bits}-bit vectors"
          f"{', ' + args.mattr if args.mattr else ''}), {threads} "
          f"threads each; dnnc {dnnc.__version__}, onnxruntime {ort.__version__}, "
          f"batch {args.batch}")
    print(f"{'model':14} {'compile s':>9} {'fallbacks':>9} {'kernels':>8} {'dnnc ms':>9} "
          f"{'ort ms':>9} {'ratio':>7}  check")
    ratios = []
    for name in args.models.split(","):
        model = zoo.build(name, batch=args.batch)
        inputs = zoo.inputs_for(model, np.random.default_rng(0))
        start = time.perf_counter()
        compiled = dnnc.compile(model, target="llvm", opt_level=args.opt_level, cpu=cpu)
        compile_s = time.perf_counter() - start
        # each side is timed before the other runs: onnxruntime's idle threads spin after a
        # call and would steal the cores from a timing that follows it
        ours = median_ms(lambda: compiled.run(*inputs.values()), args.repeat)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        peer = median_ms(lambda: session.run(None, inputs), args.repeat)
        ours_out = compiled.run(*inputs.values())
        ref = session.run(None, inputs)
        ok = all(np.allclose(o, r, rtol=1e-4, atol=1e-5) for o, r in zip(ours_out, ref))
        ratios.append(ours / peer)
        print(f"{name:14} {compile_s:9.1f} {compiled.stats['host_fallback_ops']:9d} "
              f"{compiled.stats['kernels']:8d} {ours:9.2f} {peer:9.2f} {ours / peer:7.2f}  "
              f"{'ok' if ok else 'MISMATCH'}")
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean dnnc/onnxruntime: {geo:.2f}  (worst {max(ratios):.2f})")


if __name__ == "__main__":
    main()
