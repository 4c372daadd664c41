"""Where a model's time goes on the llvm target: each kernel called alone.

    python bench/kernel_profile.py resnet50 [--top 15] [--repeat 20] [--batch 1] [--int8]
                                        [--json rows.json]

The model is a zoo model or one of bench/cpu_int8.py's (its torchvision CNNs and exported
transformers, float32 at batch 1); `--int8` profiles its quantized file instead (cpu_int8's:
quantize_static QDQ for a CNN, quantize_dynamic int8 for a transformer), with onnxruntime
running that same file. Prints each kernel (by its fused nodes) with its median milliseconds,
sorted by time, the sum over kernels next to the whole model's median call (the difference is
the per-call overhead), and onnxruntime's median for the same model, all measured in this run;
`--json` keeps every row (to compare thread counts: DNNC_NUM_THREADS).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402


def load(name: str, batch: int, int8: bool) -> onnx.ModelProto:
    """The zoo's model `name` at `batch`, else bench/cpu_int8.py's (batch 1); its quantized
    file where `int8`."""
    if name in zoo.MODELS and not int8:
        return zoo.build(name, batch=batch)
    import cpu_int8   # (bench/, beside this script)

    model = cpu_int8.float_model(name, 224)
    if model is None:
        sys.exit(f"{name}: cannot be built here")
    if not int8:
        return model
    with tempfile.TemporaryDirectory(prefix="dnnc_kernel_profile_") as folder:
        files = cpu_int8.quantized(name, model, Path(folder), ["int8"])
        return onnx.load(next(iter(files.values())))


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo model name")
    parser.add_argument("--top", type=int, default=15, help="kernels to list (default 15)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--int8", action="store_true", help="the model's quantized file")
    parser.add_argument("--json", help="also write every kernel's row to this file")
    args = parser.parse_args()
    cpu = host_target()
    threads = cpu.threads
    print(f"# {platform.machine()} {cpu.cpu} ({cpu.vector_bits}-bit vectors), {threads} "
          f"threads; dnnc {dnnc.__version__}, onnxruntime {ort.__version__}")
    model = load(args.model, args.batch, args.int8)
    inputs = zoo.inputs_for(model, np.random.default_rng(0))
    compiled = dnnc.compile(model, target="llvm", cache=False,   # (symbolic batch: at 1)
                            input_shapes={k: v.shape for k, v in inputs.items()})
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
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": threads, "whole_ms": whole,
                                               "onnxruntime_ms": peer, "rows": rows},
                                              default=str))
    print(f"{'ms':>8} {'share':>6}  kernel (nodes)")
    for r in sorted(rows, key=lambda r: -r["ms"])[:args.top]:
        nodes = ", ".join(r["nodes"][:4]) + (", ..." if len(r["nodes"]) > 4 else "")
        print(f"{r['ms']:8.3f} {r['ms'] / total:6.1%}  {r['kernel']} ({nodes})")
    print(f"{len(rows)} kernels sum {total:.3f} ms; whole call {whole:.3f} ms; "
          f"onnxruntime {peer:.3f} ms; ratio {whole / peer:.2f}")


if __name__ == "__main__":
    main()
