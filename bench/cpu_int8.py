"""dnnc's int8 (quantized files) next to dnnc's float32 and onnxruntime's int8, in one run.

    python bench/cpu_int8.py [--models resnet18,mobilenet_v2,bert_tiny,bert_hf,gpt2_hf]
                             [--dynamic int8,uint8,int8_pc,uint8_pc,qdq,qop] [--size 224]
                             [--threads 1,2] [--repeat 20] [--blocks 3] [--layers N]

Each model is written as float32 and quantized as users do (CNNs: onnxruntime's
quantize_static, QDQ, per-channel int8 weights, int8 activations, calibrated on seeded random
inputs; transformers: one file per `--dynamic` variant: quantize_dynamic with int8 or uint8
weights, `_pc` per channel; `qdq` / `qop`: quantize_static, QDQ / operator format), then the
float file compiled by dnnc, each quantized file compiled by dnnc (fuse_quantized's integer
ops: the `amx_*_int8` templates on AMX tiles where the CPU has AMX-INT8, `dense_int8` /
`conv_int8` on vpdpbusd where it has VNNI) and run by onnxruntime, all timed in
interleaved blocks of `--repeat` calls, 0.3 s apart, the median
block each. Transformers are the zoo's (`bert`, `bert_tiny`, `bert_base`) or transformers'
own exported by torch (`bert_hf`: BertModel, `gpt2_hf`: GPT2LMHeadModel; 2 layers, hidden
768, 12 heads, vocabulary 5000, sequence 128, batch 1, seeded random weights; needs torch and
transformers); `--layers` cuts the zoo's to that many layers (bert_base's products at 2).
Prints the milliseconds, dnnc fp32 / dnnc int8 (the speedup), dnnc int8 / onnxruntime int8,
and their geometric means; one table per thread count (each in a process
of its own: DNNC_NUM_THREADS is read when the worker pool starts). Timing only: what it
computes is checked by tests/models/test_quantized_files.py and tests/backends/llvm/
test_int8.py, never here.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.amx_int8 import int8_products  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.testing.quantized_files import (  # noqa: E402
    export_transformer, quantize_dynamic, quantize_static)
from cpu import median_block_ms  # noqa: E402  (bench/cpu.py, beside this script)

ZOO_TRANSFORMERS = ("bert", "bert_tiny", "bert_base")
EXPORTED = {"bert_hf": "bert", "gpt2_hf": "gpt2"}
"""bench name -> quantized_files.export_transformer's architecture."""


def float_model(name: str, size: int, layers: int | None = None):
    if name in EXPORTED:
        return export_transformer(EXPORTED[name])
    if name in ZOO_TRANSFORMERS:
        return zoo.build(name, **({} if layers is None else {"layers": layers}))
    return zoo.build(name, size=size)


def quantized(name: str, model, folder: Path, variants: list[str]) -> dict[str, Path]:
    """label -> quantized file: a CNN's QDQ file, a transformer's per variant (`--dynamic`;
    `qdq` and `qop`: quantize_static's QDQ and operator formats, uint8 activations)."""
    if name not in ZOO_TRANSFORMERS and name not in EXPORTED:
        return {name: quantize_static(model, folder, name)}
    files = {}
    for v in variants:
        if v in ("qdq", "qop"):
            files[f"{name}/{v}"] = quantize_static(model, folder, name, activations="uint8",
                                                   operators=v == "qop",
                                                   preprocess=v == "qdq")
        else:
            files[f"{name}/{v}"] = quantize_dynamic(model, folder, name, v.removesuffix("_pc"),
                                                    v.endswith("_pc"))
    return files


def one_model(name: str, args, folder: Path, threads: int) -> dict:
    """label -> {"fp32", "int8", "ort"} milliseconds, the model's runs interleaved."""
    import onnxruntime as ort

    model = float_model(name, args.size, args.layers)
    files = quantized(name, model, folder, args.dynamic.split(","))
    feeds = zoo.inputs_for(model, np.random.default_rng(0))
    fp32 = dnnc.compile(model, "llvm")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    fns = {"fp32": lambda: fp32(**feeds)}
    for label, path in files.items():
        q8 = dnnc.compile(str(path), "llvm")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        fns[label, "int8"] = lambda q8=q8: q8(**feeds)
        fns[label, "ort"] = lambda session=session: session.run(None, feeds)
    ms = median_block_ms(fns, args.repeat, args.blocks)
    return {label: {"fp32": ms["fp32"], "int8": ms[label, "int8"], "ort": ms[label, "ort"]}
            for label in files}


def table(args) -> None:
    threads = int(args.one)
    cpu = host_target()
    path = int8_products(cpu.feature_set)
    print(f"# {platform.node()} {cpu.cpu}, int8 products: {path}, {threads} thread(s); "
          f"dnnc {dnnc.__version__}, onnxruntime {__import__('onnxruntime').__version__}")
    print(f"{'model':22} {'fp32 ms':>9} {'int8 ms':>9} {'ort ms':>9} {'fp32/int8':>10} "
          f"{'int8/ort':>9}")
    speedups, versus = [], []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            for label, ms in one_model(name, args, Path(folder), threads).items():
                speedups.append(ms["fp32"] / ms["int8"])
                versus.append(ms["int8"] / ms["ort"])
                print(f"{label:22} {ms['fp32']:9.2f} {ms['int8']:9.2f} {ms['ort']:9.2f} "
                      f"{speedups[-1]:10.2f} {versus[-1]:9.2f}", flush=True)
    gm = [math.exp(sum(map(math.log, xs)) / len(xs)) for xs in (speedups, versus)]
    print(f"{'geomean':22} {'':9} {'':9} {'':9} {gm[0]:10.2f} {gm[1]:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_tiny")
    parser.add_argument("--dynamic", default="int8,uint8,int8_pc,uint8_pc")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of the zoo's transformers (default: the zoo's)")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # one thread count, in this process
    args = parser.parse_args()
    if args.one:
        table(args)
        return
    for n in args.threads.split(","):
        env = {**os.environ, "DNNC_NUM_THREADS": n}
        subprocess.run([sys.executable, __file__, "--one", n, "--models", args.models,
                        "--dynamic", args.dynamic,
                        "--size", str(args.size), "--repeat", str(args.repeat),
                        "--blocks", str(args.blocks)] +
                       ([] if args.layers is None else ["--layers", str(args.layers)]),
                       env=env, check=True)


if __name__ == "__main__":
    main()
