"""dnnc's int8 (quantized files) next to dnnc's float32, onnxruntime's int8 and OpenVINO's int8,
in one run.

    python bench/cpu_int8.py [--models resnet50,mobilenet_v2,efficientnet_b0,...]
                             [--dynamic int8,uint8,int8_pc,uint8_pc,qdq,qop,nbits4,...]
                             [--activations int8|uint8]
                             [--size 224]
                             [--threads 1,2] [--repeat 20] [--blocks 3] [--layers N]
                             [--peers onnxruntime,openvino] [--cpu-time]

The default models are issue 33's: zoo resnet50 and mobilenet_v2, torchvision's
efficientnet_b0, regnet_y_400mf and convnext_tiny (bench/library_models.py: exported once by
torch into ~/.cache/dnnc/bench/library-torchscript/; needs torch and torchvision, left out with
a note where they are missing), transformers' bert_hf and gpt2_hf (dynamically quantized).
Each model is written as float32 and quantized as users do (CNNs: onnxruntime's
quantize_static, QDQ, per-channel int8 weights, int8 activations (`--activations uint8`:
uint8), calibrated on seeded random
inputs; transformers: one file per `--dynamic` variant: quantize_dynamic with int8 or uint8
weights, `_pc` per channel; `qdq` / `qop`: quantize_static, QDQ / operator format; `nbits4`,
`nbits8`, `nbits4_acc4`, ...: the weight-only MatMulNBitsQuantizer, 4 / 8-bit blocks of 32
along K (its command line's default) with zero points, accuracy_level 4 with `_acc4`), then the
float file compiled by dnnc, each quantized file compiled by dnnc (fuse_quantized's integer
ops: the `amx_*_int8` templates on AMX tiles where the CPU has AMX-INT8, `dense_int8` /
`conv_int8` on vpdpbusd where it has VNNI) and run by each peer of `--peers` that is installed
(onnxruntime's CPU provider; OpenVINO's CPU plugin, latency mode, which reads the QDQ file
itself: its precision column counts the products (Convolution, FullyConnected, MatMul) of its
runtime model by the precision they ran in, e.g. `u8:52 i8:1`), all timed in interleaved
blocks of `--repeat` calls, 0.3 s apart, the median block each. Transformers are the zoo's
(`bert`, `bert_tiny`, `bert_base`) or transformers' own exported by torch (`bert_hf`:
BertModel, `gpt2_hf`: GPT2LMHeadModel; 2 layers, hidden 768, 12 heads, vocabulary 5000,
sequence 128, batch 1, seeded random weights; needs torch and transformers); `--layers` cuts
the zoo's to that many layers (bert_base's products at 2).
Prints the milliseconds, dnnc fp32 / dnnc int8 (the speedup), dnnc int8 / each peer's int8,
and their geometric means; `--cpu-time` (1 thread only) times each call by the process's CPU
time, as bench/cpu_sparse.py's (on a shared host a call longer than a scheduler slice is
stretched by the others' slices); one table per thread count (each in a process
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
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.amx_int8 import int8_products  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.testing.quantized_files import (  # noqa: E402
    export_transformer, quantize_dynamic, quantize_static, quantize_weights)
from cpu import EXPORTS, median_block_ms  # noqa: E402  (bench/cpu.py, beside this script)

ISSUE_MODELS = "resnet50,mobilenet_v2,efficientnet_b0,regnet_y_400mf,convnext_tiny,bert_hf,gpt2_hf"
"""issue 33's list: the CPU bars are geometric means over these."""
ZOO_TRANSFORMERS = ("bert", "bert_tiny", "bert_base")
EXPORTED = {"bert_hf": "bert", "gpt2_hf": "gpt2"}
"""bench name -> quantized_files.export_transformer's architecture."""
LIBRARY = ("efficientnet_b0", "regnet_y_400mf", "convnext_tiny", "resnet18_tv",
           "mobilenet_v3_small_tv", "shufflenet_v2")
"""bench/library_models.py's torchvision CNNs, exported by torch once."""
PRODUCTS = ("Convolution", "FullyConnected", "MatMul")
"""OpenVINO's runtime layer types of the products, whose precision its column reports."""


def float_model(name: str, size: int, layers: int | None = None):
    """The float32 model `name`, or None (with a note) where its library is missing here."""
    if name in EXPORTED:
        return export_transformer(EXPORTED[name])
    if name in ZOO_TRANSFORMERS:
        return zoo.build(name, **({} if layers is None else {"layers": layers}))
    if name in LIBRARY:
        try:
            import library_models   # (bench/, beside this script: needs torch)
        except ImportError as exc:
            print(f"# {name}: left out, bench/library_models.py needs torch ({exc})", flush=True)
            return None
        paths = library_models.export_all(EXPORTS / "library-torchscript", "torchscript",
                                          [name])
        return onnx.load(paths[0]) if paths else None
    return zoo.build(name, size=size)


def quantized(name: str, model, folder: Path, variants: list[str],
              activations: str = "int8") -> dict[str, Path]:
    """label -> quantized file: a CNN's QDQ file (`activations` int8 or uint8), a
    transformer's per variant (`--dynamic`;
    `qdq` and `qop`: quantize_static's QDQ and operator formats, uint8 activations;
    `nbits<bits>[_acc4]`: MatMulNBitsQuantizer's weight-only file)."""
    if name not in ZOO_TRANSFORMERS and name not in EXPORTED:
        return {name: quantize_static(model, folder, name, activations=activations)}
    files = {}
    for v in variants:
        if v.startswith("nbits"):
            bits, _, level = v.removeprefix("nbits").partition("_acc")
            files[f"{name}/{v}"] = folder / f"{name}_{v}.onnx"
            onnx.save(quantize_weights(model, int(bits), 32,
                                       accuracy_level=int(level) if level else None),
                      files[f"{name}/{v}"])
        elif v in ("qdq", "qop"):
            files[f"{name}/{v}"] = quantize_static(model, folder, name, activations="uint8",
                                                   operators=v == "qop",
                                                   preprocess=v == "qdq")
        else:
            files[f"{name}/{v}"] = quantize_dynamic(model, folder, name, v.removesuffix("_pc"),
                                                    v.endswith("_pc"))
    return files


def onnxruntime_peer(path: Path, threads: int):
    """(a call on the feeds, its precision) for onnxruntime's CPU provider on the file."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return (lambda feeds: session.run(None, feeds)), "int8"


def openvino_peer(path: Path, threads: int):
    """(a call on the feeds, its precision) for OpenVINO's CPU plugin on the file (it reads the
    QDQ file and runs the products in int8 where its transformations take them): the
    precision is its runtime model's products counted by the precision they ran in."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                     "PERFORMANCE_HINT": "LATENCY"})
    ran = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in PRODUCTS:
            ran[info["runtimePrecision"].astype(str)] += 1
    request = compiled.create_infer_request()
    precision = " ".join(f"{p}:{n}" for p, n in ran.most_common())
    return (lambda feeds: list(request.infer(feeds).to_tuple())), precision


PEERS = {"onnxruntime": ("ort", onnxruntime_peer), "openvino": ("ov", openvino_peer)}
"""--peers name -> (column label, its factory: (file, threads) -> (call, precision))."""


def installed_peers(names: str) -> list[str]:
    """The peers `--peers` names whose runtime is installed; a note for each one left out."""
    chosen = []
    for name in filter(None, names.split(",")):
        if name not in PEERS:
            sys.exit(f"--peers: unknown peer {name!r} (known: {', '.join(PEERS)})")
        try:
            __import__(name)
        except ImportError:
            print(f"# {name}: not installed here, left out", flush=True)
            continue
        chosen.append(name)
    return chosen


def one_model(name: str, args, folder: Path, threads: int, peers: list[str]) -> dict:
    """label -> {"fp32", "int8", peer: milliseconds, (peer, "precision"): str}, the model's
    runs interleaved; {} where the model cannot be built here."""
    model = float_model(name, args.size, args.layers)
    if model is None:
        return {}
    files = quantized(name, model, folder, args.dynamic.split(","), args.activations)
    feeds = zoo.inputs_for(model, np.random.default_rng(0))
    shapes = {k: v.shape for k, v in feeds.items()}   # (a symbolic batch: compiled at 1)
    fp32 = dnnc.compile(model, "llvm", input_shapes=shapes)
    fns, precisions = {"fp32": lambda: fp32(**feeds)}, {}
    for label, path in files.items():
        q8 = dnnc.compile(str(path), "llvm", input_shapes=shapes)
        fns[label, "int8"] = lambda q8=q8: q8(**feeds)
        for peer in peers:
            try:
                call, precisions[label, peer] = PEERS[peer][1](path, threads)
            except Exception as exc:   # a peer refusing the file (OpenVINO on AMX: "No
                # suitable implementations" for a QDQ resnet50) is said; the others go on
                print(f"# {label}: {peer} failed ({type(exc).__name__}: "
                      f"{' '.join(str(exc).split())[-200:]})", flush=True)
                precisions[label, peer] = "failed"
                continue
            fns[label, peer] = lambda call=call: call(feeds)
    ms = median_block_ms(fns, args.repeat, args.blocks, args.cpu_time)
    return {label: {"fp32": ms["fp32"], "int8": ms[label, "int8"],
                    **{peer: ms.get((label, peer), math.nan) for peer in peers},
                    **{(peer, "precision"): precisions[label, peer] for peer in peers}}
            for label in files}


def table(args) -> None:
    threads = int(args.one)
    cpu = host_target()
    path = int8_products(cpu.feature_set)
    peers = installed_peers(args.peers)
    versions = ", ".join(f"{p} {__import__(p).__version__.split('-')[0]}" for p in peers)
    print(f"# {platform.node()} {cpu.cpu}, int8 products: {path}, {threads} thread(s); "
          f"dnnc {dnnc.__version__}, {versions}{'; CPU time' if args.cpu_time else ''}")
    labels = [PEERS[p][0] for p in peers]
    print(f"{'model':22} {'fp32 ms':>9} {'int8 ms':>9} " +
          " ".join(f"{lb + ' ms':>9}" for lb in labels) + f" {'fp32/int8':>10} " +
          " ".join(f"{'int8/' + lb:>9}" for lb in labels) + "  peers' precision", flush=True)
    ratios: dict[str, list[float]] = {"speedup": [], **{p: [] for p in peers}}
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            for label, ms in one_model(name, args, Path(folder), threads, peers).items():
                ratios["speedup"].append(ms["fp32"] / ms["int8"])
                for p in peers:
                    ratios[p].append(ms["int8"] / ms[p])   # nan where the peer failed
                precision = " ".join(f"{PEERS[p][0]} {ms[p, 'precision']}" for p in peers)
                print(f"{label:22} {ms['fp32']:9.2f} {ms['int8']:9.2f} " +
                      " ".join(f"{ms[p]:9.2f}" for p in peers) +
                      f" {ratios['speedup'][-1]:10.2f} " +
                      " ".join(f"{ratios[p][-1]:9.2f}" for p in peers) + f"  {precision}",
                      flush=True)
    ratios = {k: [x for x in xs if not math.isnan(x)] for k, xs in ratios.items()}
    gm = {k: math.exp(sum(map(math.log, xs)) / len(xs)) for k, xs in ratios.items() if xs}
    print(f"{'geomean':22} {'':9} {'':9} " + " ".join(f"{'':9}" for _ in peers) +
          f" {gm.get('speedup', math.nan):10.2f} " +
          " ".join(f"{gm.get(p, math.nan):9.2f}" for p in peers), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=ISSUE_MODELS)
    parser.add_argument("--dynamic", default="int8",
                        help="transformers' quantized variants (module docstring)")
    parser.add_argument("--activations", default="int8", choices=("int8", "uint8"),
                        help="the CNNs' quantized activations (OpenVINO 2026.4 on an AMX "
                             "Xeon refuses int8 ones: 'No suitable implementations')")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of the zoo's transformers (default: the zoo's)")
    parser.add_argument("--peers", default="onnxruntime,openvino",
                        help="runtimes timed on the same int8 files (those installed)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time calls by the process's CPU time (1 thread only)")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # one thread count, in this process
    args = parser.parse_args()
    if args.cpu_time and args.threads != "1" and not args.one:
        parser.error("--cpu-time times models at --threads 1 (other threads' CPU time would "
                     "count too)")
    if args.one:
        table(args)
        return
    for n in args.threads.split(","):
        env = {**os.environ, "DNNC_NUM_THREADS": n}
        subprocess.run([sys.executable, __file__, "--one", n, "--models", args.models,
                        "--dynamic", args.dynamic, "--peers", args.peers,
                        "--activations", args.activations,
                        "--size", str(args.size), "--repeat", str(args.repeat),
                        "--blocks", str(args.blocks)] +
                       (["--cpu-time"] if args.cpu_time else []) +
                       ([] if args.layers is None else ["--layers", str(args.layers)]),
                       env=env, check=True)


if __name__ == "__main__":
    main()
