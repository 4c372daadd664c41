"""2:4 weights on the sparse tensor cores (issue 34's GPU bar: 2:4 in fp16 >= 1.3x dnnc dense
fp16 on BERT's and resnet50's GEMM-heavy layers), one run; `bench/gpu_sparse.py --sparse24`.

    PYTHONPATH=$PWD python bench/gpu_sparse24.py [--repeat 20] [--trials 5]
        [--no-layers] [--no-variants] [--no-models] [--no-torch] [--only bert,3x3]
        [--all] [--scanned] [--jobs 15]

Layers: BERT-base's products at batch 8 (1024 rows: 768->768, 768->3072, 3072->768) and
resnet50's stride-1 1x1 convs at batch 32 (channels-last, as dnnc runs them at fp16: the
product of [32 H W, C] by [C, M]), each with a Relu fused, weights magnitude-pruned to 2:4,
stored in fp16 (and its stride-1 3x3 convs, 2:4 along the input channels: implicit GEMMs):
dnnc's dense fp16 kernel (its default template and config: MatMul, or the ConvNHWC for the
convs), the 2:4 kernel (cuda_sparse24) at its default config and,
unless `--no-variants`, a few other points of its space (the best named), and cuBLAS's fp16
product through torch.matmul (cuDNN's channels-last conv2d for the 3x3 convs; unless
`--no-torch`), timed by CUDA events (bench/gpu_timing.py:
median over `--trials` of the mean of `--repeat` calls, interleaved). `2:4/dense` is the 2:4
default's time over dnnc dense's (the bar: <= 1/1.3 = 0.77), `best` the best variant's,
`mma.sp/dense` the mma.sp warps' default's (the 2:4 default without wgmma: sm_90's before
session 44), `rule` whether passes/sparse24.py's cost rule takes the layer (its estimated
dense / 2:4 beside: what GPU_SPARSE24_EFFICIENCY is to be fitted to); each 2:4 output is
checked against the dense kernel's (max |d| / max |dense|). `--all` prints a line for each
2:4 config timed; `--scanned` adds the default of weights whose rows keep no column in
common (`covering_rows` 0: session 45's kernel, every k tile scanned for non-finite
activations, and its tiles), the "before" of session 46's flags from the sums. `--jobs N`
compiles the layers' modules in N processes first (into the on-disk module cache the
timing then reads: NVRTC took about a minute a layer of 18 configs on the device). Each
layer's weights are drawn from a seed of its name.

Models (unless `--no-models`): bert_base at batch 8 (128 tokens) and resnet50 at batch 32,
the dense file and its 2:4 magnitude-pruned copy (`testing/pruned_files.py`, as `dnnc
sparsify --pattern 2:4` writes it) compiled for cuda at fp16: median ms of a call, the
layers running 2:4, the speed-up, and the pruned file's largest output difference from
onnxruntime's (CPU; relative to its largest output). Never imported by dnnc.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dnnc.backends.cuda import device, sparse24  # noqa: E402
from dnnc.backends.cuda.codegen import render_module  # noqa: E402
from dnnc.backends.cuda.mma import TensorCoreConfig  # noqa: E402
from dnnc.backends.cuda.schedules import template_for  # noqa: E402
from dnnc.backends.lower import lower_group  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.ops.sparse import encode_2of4  # noqa: E402
from dnnc.passes import sparse24 as rule  # noqa: E402
from gpu_sparse import BERT, RESNET50_1X1, RESNET50_3X3, SEQ, cases  # noqa: E402
from gpu_timing import (cache_module, compile_in_processes, cupy_timer, header,  # noqa: E402
                        interleaved_ms, kernel_launcher, load_module, torch_timer)

BERT_BATCH, RESNET_BATCH = 8, 32
S = functools.partial(TensorCoreConfig, wgmma=True, staged=True)
VARIANTS = list(dict.fromkeys([c for c, _ in sparse24.WARPGROUP_TILES + sparse24.SCANNED_TILES] + [
    S(256, 64, 64, 8, 1, 4), S(64, 128, 64, 4, 1, 4), S(128, 128, 64, 8, 1, 4),
    S(128, 192, 64, 8, 1, 4), S(128, 256, 64, 8, 1, 3), S(256, 128, 64, 8, 1, 4),
    S(128, 128, 128, 8, 1, 3)]))
"""2:4 configs timed beside the default (those outside a layer's space skipped): the
warpgroup defaults' tiles (k tiles of 64, staged), and wider blocks, of warpgroups of 64 to
256 places, k tiles of 64 and 128. Each costs a device about 3 s of NVRTC on a conv (H200
host, session 45: 18 configs took a minute a layer; `--jobs`)."""


def scanned(graph: Graph, machine) -> list:
    """`cases`' entry of the 2:4 default for the layer's weights taken as keeping no column
    in every run of rows (`covering_rows` 0): every k tile scanned for non-finite
    activations, at the scanned tiles (session 45's kernel)."""
    kernel = lower_group(list(graph.nodes), "ks", outputs=graph.outputs)
    template, problem = template_for(kernel, machine=machine)
    problem = dataclasses.replace(problem, cover=0)
    config = template.default(problem, machine)
    return [(template.name, f"{short(config)} scanned",
             template.build(problem, config, machine), kernel)]


def warp_default(graph: Graph, machine) -> TensorCoreConfig:
    """The 2:4 default on mma.sp warps: what a GPU without wgmma gets (and every GPU got
    before the warpgroup product)."""
    kernel = lower_group(list(graph.nodes), "k", outputs=graph.outputs)
    template, problem = template_for(kernel, machine=machine)
    return template.default(problem, dataclasses.replace(machine, arch="sm_80"))


def pruned_2of4(rng, rows: int, depth: int) -> np.ndarray:
    """Weights [rows, depth] keeping the 2 largest magnitudes of every 4 along depth."""
    w = (rng.standard_normal((rows, depth)) / np.sqrt(depth / 2)).astype(np.float32)
    groups = w.reshape(rows, depth // 4, 4)
    np.put_along_axis(groups, np.argsort(np.abs(groups), axis=-1)[..., :2], 0.0, axis=-1)
    return groups.reshape(rows, depth).astype(np.float16)


def _const(name, array) -> Value:
    dtype = {np.dtype(np.float16): T.float16, np.dtype(np.uint32): T.uint32}[array.dtype]
    return Value(name, T.TensorType(dtype, array.shape), const=array)




def layer_graph(kind: str, places: int, depth: int, rows: int, hw: int, w: np.ndarray,
                sparse: bool) -> Graph:
    """The fp16 layer (dense, or 2:4; a Relu fused) over `w` [rows, depth]: a product of
    `places` rows (Sparse24Dense), a 1x1 ConvNHWC of places / hw^2 images (2:4: the product
    of its pixels, Sparse24Dense, as the rewrite makes it) or a padded 3x3 one (`conv3`, 2:4:
    Sparse24ConvNHWC; w [rows, 9 C], channels fastest)."""
    g = Graph("layer")
    if kind == "conv3":
        c = depth // 9
        x = g.add_input("x", T.TensorType(T.float16, (places // (hw * hw), hw, hw, c)))
        window = {"kernel_shape": [3, 3], "pads": [1] * 4, "strides": [1, 1],
                  "dilations": [1, 1]}
        if sparse:
            values, meta = encode_2of4(w.astype(np.float32), T.float16)
            y = g.add("Sparse24ConvNHWC", x, _const("kept", values), _const("meta", meta),
                      oc=rows, k=depth, **window)
        else:
            y = g.add("ConvNHWC", x, _const("w", np.ascontiguousarray(w.reshape(rows, 3, 3, c))),
                      group=1, **window)
    elif kind == "conv" and not sparse:
        x = g.add_input("x", T.TensorType(T.float16, (places // (hw * hw), hw, hw, depth)))
        y = g.add("ConvNHWC", x, _const("w", np.ascontiguousarray(w.reshape(rows, 1, 1, depth))),
                  kernel_shape=[1, 1], pads=[0] * 4, strides=[1, 1], dilations=[1, 1], group=1)
    else:
        x = g.add_input("x", T.TensorType(T.float16, (places, depth)))
        if sparse:
            values, meta = encode_2of4(w.astype(np.float32), T.float16)
            y = g.add("Sparse24Dense", x, _const("kept", values), _const("meta", meta),
                      n=rows, k=depth)
        else:
            y = g.add("MatMul", x, _const("w", np.ascontiguousarray(w.T)))
    g.outputs = [g.add("Relu", y)]
    return g


def layer_kernels(machine, args, kind, name, places, depth, rows, hw) -> tuple:
    """(the weights, the dense entries, the 2:4 ones, the mma.sp default, every entry, their
    functions, the rendered module) of a layer, its weights drawn from its name's seed."""
    w = pruned_2of4(np.random.default_rng(zlib.crc32(name.encode())), rows, depth)
    dense = cases(layer_graph(kind, places, depth, rows, hw, w, False), machine, [])
    graph24 = layer_graph(kind, places, depth, rows, hw, w, True)
    warps = warp_default(graph24, machine)
    sparse = cases(graph24, machine, [warps] + ([] if args.no_variants else VARIANTS))
    if args.scanned:
        sparse += scanned(graph24, machine)
    entries = dense + sparse
    funcs = [(dataclasses.replace(e[2], name=f"c{n}_{e[2].name}"), True)
             for n, e in enumerate(entries)]
    return w, dense, sparse, warps, entries, funcs, render_module(funcs)


def _compiled(job) -> str:
    """A pool worker: the layer's module compiled into the on-disk module cache."""
    machine, args, arch, shape = job
    cache_module(layer_kernels(machine, args, *shape)[-1].source, arch)
    return shape[1]


def layer_row(cp, machine, args, kind, name, places, depth, rows, hw) -> str:
    width = depth // 9 if kind == "conv3" else depth
    x = cp.random.standard_normal((places, width), dtype=cp.float32).astype(cp.float16)
    w, dense, sparse, warps, entries, funcs, module = layer_kernels(
        machine, args, kind, name, places, depth, rows, hw)
    raw = load_module(cp, module.source)
    timers, outs = [], []
    for entry, (func, _) in zip(entries, funcs):
        x_in = x.reshape(entry[3].inputs[0].type.shape)
        launch, out = kernel_launcher(cp, raw, module, func, entry[3], x_in)
        timers.append(cupy_timer(cp, launch))
        outs.append(out)
    cublas = ""
    if not args.no_torch:
        import torch

        if kind == "conv3":   # cuDNN, channels-last
            c = depth // 9
            xt = torch.from_dlpack(x).reshape(-1, hw, hw, c).permute(0, 3, 1, 2)
            wt = torch.from_dlpack(cp.asarray(np.ascontiguousarray(
                w.reshape(rows, 3, 3, c)))).permute(0, 3, 1, 2)
            timers.append(torch_timer(lambda: torch.relu(torch.nn.functional.conv2d(
                xt, wt, padding=1))))
        else:
            xt = torch.from_dlpack(x)
            wt = torch.from_dlpack(cp.asarray(np.ascontiguousarray(w.T)))
            timers.append(torch_timer(lambda: torch.relu(torch.matmul(xt, wt))))
    times = interleaved_ms(timers, args.repeat, args.trials)
    want = cp.asnumpy(outs[0]).astype(np.float64).reshape(places, rows)
    errors = [float(np.abs(cp.asnumpy(o).astype(np.float64).reshape(places, rows) - want).max()
                    / max(np.abs(want).max(), 1e-30)) for o in outs[1:]]
    dense_ms, sparse_ms = times[0], times[1:len(entries)]
    best = int(np.argmin([ms if not isinstance(entry[1], str) else np.inf
                          for ms, entry in zip(sparse_ms, sparse)]))   # not a diagnostic
    at = [i for i, entry in enumerate(sparse) if entry[1] == warps]
    mma_sp = f"  mma.sp/dense {sparse_ms[at[0]] / dense_ms:4.2f}" if at else ""
    if not args.no_torch:
        cublas = f"  cuBLAS {times[-1] * 1e3:7.1f} us ({times[-1] / dense_ms:4.2f} of dense)"
    gpu = machine.gpu
    flops, bandwidth = (gpu.tensor_flops, gpu.copy_bytes_per_s) if gpu else \
        rule.GPU_TENSOR_FIGURES
    reads = places * width   # a conv's image once (stride 1)
    estimate = rule.product_seconds(places, rows, depth, flops, bandwidth, False, reads) / \
        rule.product_seconds(places, rows, depth, flops, bandwidth, True, reads)
    chosen = "2:4" if rule.sparse24_faster(places, rows, depth, machine, reads) else "dense"
    ok = "ok" if max(errors) <= 2e-2 else "WRONG"
    tflops = 2 * places * rows * depth / 1e9
    if args.all:
        for (_, config, *_), ms, err in zip(sparse, sparse_ms, errors[len(dense) - 1:]):
            print(f"  {name:24} {_timed(ms, dense_ms)}  {short(config)}  err {err:.1e}")
    return (f"{name:24} M={places:<6} dense {dense_ms * 1e3:7.1f} us ({tflops / dense_ms:5.0f} "
            f"TF/s, {dense[0][0]})  2:4 {sparse_ms[0] * 1e3:7.1f} us  2:4/dense "
            f"{sparse_ms[0] / dense_ms:4.2f}  best {sparse_ms[best] / dense_ms:4.2f} "
            f"({sparse[best][1]})" + mma_sp + cublas +
            f"  rule {chosen} ({estimate:4.2f}x est.)  err {max(errors):.1e} {ok}")


def _timed(ms: float, dense_ms: float) -> str:
    return f"{ms * 1e3:7.1f} us  2:4/dense {ms / dense_ms:4.2f}"


def short(config) -> str:
    """A config as `bm x bn kbk sS wmW [staged] [first] [wgmma]` (or as given, a string)."""
    if isinstance(config, str):
        return config
    flags = [x for x, on in (("staged", config.staged), ("first", config.refill_first),
                              ("wgmma", config.wgmma), ("mma.sp", not config.wgmma)) if on]
    split = f" split {config.split_k}" if config.split_k > 1 else ""
    return (f"{config.block_m}x{config.block_n} k{config.block_k} s{config.stages} "
            f"wm{config.warps_m}{split} " + " ".join(flags))


def layers_table(cp, machine, args) -> int:
    failed = 0
    shapes = [("dense", f"bert {name[6:]}", BERT_BATCH * SEQ, k, n, 0) for name, k, n in BERT]
    shapes += [("conv", f"conv1x1 {c}->{m} @{hw}", RESNET_BATCH * hw * hw, c, m, hw)
               for c, hw, m in RESNET50_1X1]
    shapes += [("conv3", f"conv3x3 {c}->{m} @{hw}", RESNET_BATCH * hw * hw, 9 * c, m, hw)
               for c, hw, m in RESNET50_3X3]
    if args.only:
        shapes = [x for x in shapes if any(word in x[1] for word in args.only.split(","))]
    if args.jobs > 1:
        compile_in_processes(_compiled, [(machine, args, device.gpu_arch(), shape)
                                         for shape in shapes], args.jobs)
    if args.compile_only:
        return failed
    ratios = []
    for kind, name, places, depth, rows, hw in shapes:
        try:
            line = layer_row(cp, machine, args, kind, name, places, depth, rows, hw)
            ratios.append(float(line.split("2:4/dense")[1].split()[0]))
            failed |= "WRONG" in line
            print(line, flush=True)
        except Exception:
            traceback.print_exc()
            failed = 1
    if ratios:
        print(f"geomean 2:4/dense {np.exp(np.mean(np.log(ratios))):.3f} over {len(ratios)} "
              f"layers (the bar: <= {1 / 1.3:.3f})", flush=True)
    return failed


def model_row(cp, name: str, batch: int, args) -> str:
    import dnnc
    from dnnc import zoo
    from dnnc.testing.pruned_files import pruned_file

    config = {"seq": SEQ} if name.startswith("bert") else {}
    dense_model = zoo.build(name, batch=batch, **config)
    pruned_path = pruned_file(Path(args.folder), name, None, "2:4", batch=batch, **config)
    feeds = zoo.inputs_for(dense_model, np.random.default_rng(0))
    dev = {k: cp.asarray(v) for k, v in feeds.items()}
    models, times = {}, {}
    for label, source in (("dense", dense_model), ("pruned", str(pruned_path))):
        start = time.perf_counter()
        models[label] = dnnc.compile(source, "cuda", precision="fp16")
        compile_s = time.perf_counter() - start
        times[label] = (models[label].benchmark(*dev.values(), repeat=args.repeat,
                                                warmup=3)["median_ms"], compile_s)
    sparse = sum(n.op == "Sparse24Dense" for n in models["pruned"].graph.nodes)
    error = float("nan")
    try:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(pruned_path),
                                               providers=["CPUExecutionProvider"])
        want = session.run(None, feeds)
        got = models["pruned"](*dev.values())
        got = got if isinstance(got, (list, tuple)) else [got]
        error = max(float(np.abs(cp.asnumpy(g).astype(np.float64) - np.asarray(w)).max() /
                          max(np.abs(np.asarray(w)).max(), 1e-30)) for g, w in zip(got, want))
    except ImportError:
        pass
    (d_ms, d_s), (p_ms, p_s) = times["dense"], times["pruned"]
    return (f"{name:10} b{batch:<3} fp16 dense {d_ms:8.3f} ms  2:4 pruned {p_ms:8.3f} ms  "
            f"speed-up {d_ms / p_ms:5.2f}  2:4 layers {sparse}  err vs onnxruntime "
            f"{error:.1e}  (compiles {d_s:.1f} s, {p_s:.1f} s)")


def run(args) -> int:
    cp = device.import_cupy()
    machine = dataclasses.replace(device.machine(), precision="fp16", half_storage=True)
    print(f"# {header()}; fp16 stored; dnnc dense fp16 kernels vs 2:4 (cuda_sparse24)")
    failed = 0
    if not args.no_layers:
        failed |= layers_table(cp, machine, args)
    if not args.no_models and not args.compile_only:
        for name, batch in (("bert_base", BERT_BATCH), ("resnet50", RESNET_BATCH)):
            try:
                print(model_row(cp, name, batch, args), flush=True)
            except Exception:
                traceback.print_exc()
                failed = 1
    return failed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--no-layers", action="store_true")
    p.add_argument("--no-variants", action="store_true")
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--all", action="store_true", help="a line for each 2:4 config timed")
    p.add_argument("--scanned", action="store_true", help="the default also built with every "
                   "k tile scanned for non-finite activations (session 45's kernel)")
    p.add_argument("--jobs", type=int, default=1, help="processes compiling the layers' "
                   "modules first")
    p.add_argument("--compile-only", action="store_true", help="with --jobs: only fill the "
                   "module cache (no timing, no models)")
    p.add_argument("--only", default="", help="comma-separated words: only the layers whose "
                   "names hold one (e.g. bert,3x3)")
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "dnnc_pruned"))
    return p


if __name__ == "__main__":
    sys.exit(run(parser().parse_args()))
