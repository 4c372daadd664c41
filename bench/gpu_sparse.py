"""Sparse weights on the GPU (issue 34, item 4): the cuda SpMM (`backends/cuda/sparse.py`)
against dnnc's dense fp32 kernels, one run.

    PYTHONPATH=$PWD python bench/gpu_sparse.py [--batches 1,32] [--sparsity 0.7,0.9]
        [--repeat 20] [--trials 5] [--no-layers] [--no-variants] [--only bert,1x1]
        [--jobs 12] [--compile-only] [--models bert_base,resnet50] [--model-batches 1,32]

Layers: BERT-base's products at 128 tokens a sequence (768->768, 768->3072, 3072->768) and
resnet50's 1x1 and stride-1 3x3 convs (224 x 224 images) at each of `--batches`, each with a
Relu fused, as dnnc's dense kernel (its default template and config at fp32) and as a SparseDense /
SparseConv of the weights magnitude-pruned to each `--sparsity` (forced, not the cost
rule's choice) at the SpMM's default config and, unless `--no-variants`, a few other points
of its space (the best named). Timed by CUDA events (bench/gpu_timing.py: median over
`--trials` of the mean of `--repeat` launch sequences, interleaved); `speed-up` = dense /
sparse default, `best` = dense / the best variant; `rule` says whether find_sparsity's GPU
cost rule would run the layer sparse (its estimated speed-up beside). Each sparse output is
checked against the dense kernel's (max |d| / max |dense|).

Models (unless `--no-models`): each zoo model of `--models` at each of `--model-batches`, the
dense file and its 90% magnitude-pruned copy (`testing/pruned_files.py`, as `dnnc sparsify`
writes it; DNNC_SPARSE_GPU=1 in the environment: every product and conv sparse, not the cost
rule's choice) compiled for cuda at fp32: median ms of a call ended by a synchronize, the layers
running sparse, the speed-up, and the largest output difference of the pruned file on cuda
from onnxruntime's (CPU; relative to its largest output: a sanity check).

`--jobs N` compiles the layers' modules in N processes into the on-disk module cache first
(NVRTC is most of the time on the device); `--compile-only` only fills the cache (layers with
`--jobs`, and each model's dense and pruned compile: run one process a model beside others).

`--sparse24` runs bench/gpu_sparse24.py instead (2:4 weights at fp16 against dnnc's dense fp16
kernels and cuBLAS; its options after `--sparse24`).
Never imported by dnnc.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dnnc.backends.cuda import device  # noqa: E402
from dnnc.backends.cuda.codegen import render_module  # noqa: E402
from dnnc.backends.cuda.schedules import template_for  # noqa: E402
from dnnc.backends.cuda.sparse import SpmmConfig  # noqa: E402
from dnnc.backends.lower import lower_group  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.ops.sparse import encode_csr, row_max  # noqa: E402
from dnnc.passes import find_sparsity  # noqa: E402
from gpu_timing import (cache_module, compile_in_processes, cupy_timer, header,  # noqa: E402
                        interleaved_ms, kernel_launcher, load_module)

BERT = [("dense 768->768", 768, 768), ("dense 768->3072", 768, 3072),
        ("dense 3072->768", 3072, 768)]
"""(name, K, N) of BERT-base's products; 128 tokens a sequence."""
RESNET50_1X1 = [(256, 56, 64), (64, 56, 256), (512, 28, 128), (128, 28, 512),
                (1024, 14, 256), (256, 14, 1024), (2048, 7, 512), (512, 7, 2048)]
"""(C, H = W, M) of resnet50's stride-1 1x1 convs."""
RESNET50_3X3 = [(64, 56, 64), (128, 28, 128), (256, 14, 256), (512, 7, 512)]
"""(C, H = W, M) of resnet50's stride-1 3x3 convs (padded 1)."""
VARIANTS = [SpmmConfig(32, 4, 8, 32), SpmmConfig(16, 4, 8, 32), SpmmConfig(16, 4, 8, 32, True, 4),
            SpmmConfig(16, 4, 16, 32, True, 4), SpmmConfig(16, 4, 16, 32, True, 8),
            SpmmConfig(8, 8, 32, 32, True, 4), SpmmConfig(8, 8, 16, 32, True, 4),
            SpmmConfig(8, 8, 32, 32, True, 2), SpmmConfig(4, 8, 32, 32, True, 4),
            SpmmConfig(8, 4, 32, 32, True, 4)]
"""SpMM configs timed beside the default (those outside a layer's space skipped): unstaged,
and B staged (`staged`) at 32 to 128 rows a block, 32 to 64 places, 4 or 8 a thread."""
SEQ = 128


def _pruned(rng, rows: int, depth: int, zeros: float) -> np.ndarray:
    w = (rng.standard_normal((rows, depth)) / math.sqrt(depth)).astype(np.float32)
    if zeros:
        w[np.abs(w) <= np.quantile(np.abs(w), zeros)] = 0
    return w


def _const(name, array) -> Value:
    dtype = T.float32 if array.dtype == np.float32 else T.int32
    return Value(name, T.TensorType(dtype, array.shape), const=array)


def layer_graph(kind: str, batch: int, depth: int, rows: int, hw: int, w: np.ndarray,
                sparse: bool) -> Graph:
    """The layer (dense or sparse, with a Relu) over `w` [rows, depth] (a 3x3 conv's [rows,
    9 depth], padded 1: `conv3`)."""
    g = Graph("layer")
    k = 3 if kind == "conv3" else 1
    window = {"kernel_shape": [k, k], "pads": [k // 2] * 4}
    if kind != "dense":
        x = g.add_input("x", T.TensorType(T.float32, (batch, depth, hw, hw)))
    else:
        x = g.add_input("x", T.TensorType(T.float32, (batch * SEQ, depth)))
    if sparse:
        values, columns, starts = encode_csr(w, find_sparsity.GPU_SLICE_DEPTH)
        csr = [_const("values", values), _const("columns", columns), _const("starts", starts),
               None, _const("order", find_sparsity.row_order(starts))]
        attrs = {"row_max": row_max(starts), "slice_depth": find_sparsity.GPU_SLICE_DEPTH}
        y = g.add("SparseConv", x, *csr, oc=rows, strides=[1, 1], **window, **attrs) \
            if kind != "dense" else g.add("SparseDense", x, *csr, n=rows, **attrs)
    elif kind != "dense":
        y = g.add("Conv", x, _const("w", w.reshape(rows, depth, k, k)), **window)
    else:
        y = g.add("MatMul", x, _const("w", np.ascontiguousarray(w.T)))
    g.outputs = [g.add("Relu", y)]
    return g


def cases(graph: Graph, machine, configs: list) -> list:
    """[(template name, config, scheduled PrimFunc, kernel)]: the default, then `configs`
    inside the space."""
    out = []
    for n, config in enumerate([None] + configs):
        kernel = lower_group(list(graph.nodes), f"k{n}", outputs=graph.outputs)
        template, problem = template_for(kernel, machine=machine)
        if config is None:
            config = template.default(problem, machine)
        else:
            try:
                config = template.space(problem, machine).check(config)
            except Exception:
                continue
            if config == out[0][1]:
                continue
        out.append((template.name, config, template.build(problem, config, machine), kernel))
    return out


def layer_kernels(machine, args, kind, name, batch, depth, rows, hw) -> tuple:
    """(entries, funcs, module) of a layer: the dense kernel, then for each sparsity the
    SpMM's default and variants and the dense kernel on the pruned weights, rendered into
    one module (weights seeded by the layer's name and batch: a `--jobs` worker renders the
    same source)."""
    rng = np.random.default_rng(zlib.crc32(f"{name} b{batch}".encode()))
    width = depth * (9 if kind == "conv3" else 1)   # the weights' columns
    dense = cases(layer_graph(kind, batch, depth, rows, hw, _pruned(rng, rows, width, 0.0),
                              False), machine, [])
    entries = [("dense", *dense[0])]
    for zeros in args.sparsity:
        w = _pruned(rng, rows, width, zeros)
        entries += [(zeros, *c) for c in cases(layer_graph(kind, batch, depth, rows, hw, w,
                                                           True), machine,
                                               [] if args.no_variants else VARIANTS)]
        dense_w = cases(layer_graph(kind, batch, depth, rows, hw, w, False), machine, [])[0]
        entries.append((f"dense@{zeros}", *dense_w))
    funcs = [(dataclasses.replace(e[3], name=f"c{n}_{e[3].name}"), True)
             for n, e in enumerate(entries)]
    return dense, entries, funcs, render_module(funcs)


def _compiled(job) -> str:
    """A pool worker: the layer's module compiled into the on-disk module cache."""
    machine, args, arch, layer = job
    cache_module(layer_kernels(machine, args, *layer)[-1].source, arch)
    return layer[1]


def layer_rows(cp, machine, args, kind, name, batch, depth, rows, hw) -> list[str]:
    places = batch * hw * hw if kind != "dense" else batch * SEQ
    shape = (batch, depth, hw, hw) if kind != "dense" else (batch * SEQ, depth)
    x = cp.random.standard_normal(shape, dtype=cp.float32)
    width = depth * (9 if kind == "conv3" else 1)   # the weights' columns
    dense, entries, funcs, module = layer_kernels(machine, args, kind, name, batch, depth,
                                                  rows, hw)
    raw = load_module(cp, module.source)
    timers, outs = [], []
    for entry, (func, _) in zip(entries, funcs):
        launch, out = kernel_launcher(cp, raw, module, func, entry[4], x, cp.float32)
        timers.append(cupy_timer(cp, launch))
        outs.append(out)
    times = interleaved_ms(timers, args.repeat, args.trials)
    dense_ms = times[0]
    lines = [f"{name:20} b{batch:<3} dense {dense_ms * 1e3:9.1f} us "
             f"({2 * places * rows * width / dense_ms / 1e9:5.1f} TF/s)  {dense[0][1]}"]
    for zeros in args.sparsity:
        picks = [(e, t, o) for e, t, o in zip(entries, times, outs) if e[0] == zeros]
        (_, _, want_out) = next((e, t, o) for e, t, o in zip(entries, times, outs)
                                if e[0] == f"dense@{zeros}")
        want = cp.asnumpy(want_out)
        (default, d_ms, _) = picks[0]
        best = min(picks, key=lambda p: p[1])
        errors = [float(np.abs(cp.asnumpy(o) - want).max() / max(np.abs(want).max(), 1e-30))
                  for _, _, o in picks]
        w_nnz = int(default[4].inputs[1].type.shape[0])
        flops, bandwidth = machine.gpu.fp32_flops, machine.gpu.copy_bytes_per_s
        estimate = find_sparsity.gpu_speedup(places, rows, width, w_nnz, flops, bandwidth)
        rule = "sparse" if estimate >= find_sparsity.GPU_MARGIN and kind != "conv3" and \
            zeros >= 1 - find_sparsity.MAX_DENSITY else "dense"
        ok = "ok" if max(errors) <= 1e-4 else "WRONG"
        lines.append(f"  {zeros:4.0%} zeros: sparse {d_ms * 1e3:9.1f} us  speed-up "
                     f"{dense_ms / d_ms:5.2f}  best {dense_ms / best[1]:5.2f} "
                     f"({best[0][2]})  rule {rule} ({estimate:4.2f}x est.)  err "
                     f"{max(errors):.1e} {ok}")
    return lines


def layer_list(args) -> list[tuple]:
    """(kind, name, batch, depth, rows, hw) of every layer timed (`--only`: those whose
    name holds one of its words)."""
    out = []
    for batch in args.batches:
        out += [("dense", name, batch, depth, rows, 0) for name, depth, rows in BERT]
        out += [("conv", f"conv1x1 {c}->{m} @{hw}", batch, c, m, hw)
                for c, hw, m in RESNET50_1X1]
        out += [("conv3", f"conv3x3 {c}->{m} @{hw}", batch, c, m, hw)
                for c, hw, m in RESNET50_3X3]
    if args.only:
        out = [x for x in out if any(word in x[1] for word in args.only.split(","))]
    return out


def layers_table(cp, machine, args) -> None:
    layers = layer_list(args)
    if args.jobs > 1:
        compile_in_processes(_compiled, [(machine, args, device.gpu_arch(), layer)
                                         for layer in layers], args.jobs)
    if args.compile_only:
        return
    for layer in layers:
        print("\n".join(layer_rows(cp, machine, args, *layer)), flush=True)


def model_rows(cp, name: str, batch: int, args) -> str:
    import dnnc
    from dnnc import zoo
    from dnnc.testing.pruned_files import pruned_file

    config = {"seq": SEQ} if name.startswith("bert") else {}
    folder = Path(args.folder)
    dense_model = zoo.build(name, batch=batch, **config)
    pruned_path = pruned_file(folder, name, 0.9, batch=batch, **config)
    feeds = zoo.inputs_for(dense_model, np.random.default_rng(0))
    dev = {k: cp.asarray(v) for k, v in feeds.items()}
    models, times = {}, {}
    for label, source in (("dense", dense_model), ("pruned", str(pruned_path))):
        start = time.perf_counter()
        models[label] = dnnc.compile(source, "cuda")
        compile_s = time.perf_counter() - start
        model = models[label]
        if args.compile_only:
            continue
        times[label] = (model.benchmark(*dev.values(), repeat=args.repeat,
                                        warmup=3)["median_ms"],
                        compile_s)
    if args.compile_only:
        return f"{name} b{batch}: compiled"
    ops = [n.op for n in models["pruned"].graph.nodes]
    sparse = sum(op in ("SparseConv", "SparseDense") for op in ops)
    error = float("nan")
    try:   # onnxruntime (CPU) on the pruned file: the reference
        import onnxruntime

        session = onnxruntime.InferenceSession(str(pruned_path),
                                               providers=["CPUExecutionProvider"])
        want = session.run(None, feeds)
        got = models["pruned"](*dev.values())
        got = got if isinstance(got, (list, tuple)) else [got]
        error = max(float(np.abs(cp.asnumpy(g) - np.asarray(w)).max() /
                          max(np.abs(np.asarray(w)).max(), 1e-30)) for g, w in zip(got, want))
    except ImportError:
        pass
    (d_ms, d_s), (p_ms, p_s) = times["dense"], times["pruned"]
    return (f"{name:10} b{batch:<3} dense {d_ms:8.3f} ms  pruned 90% {p_ms:8.3f} ms  "
            f"speed-up {d_ms / p_ms:5.2f}  sparse layers {sparse}  err vs onnxruntime "
            f"{error:.1e}  (compiles {d_s:.1f} s, {p_s:.1f} s)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--sparse24" in argv:
        import gpu_sparse24

        return gpu_sparse24.run(gpu_sparse24.parser().parse_args(
            [a for a in argv if a != "--sparse24"]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--sparsity", default="0.7,0.9")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--no-layers", action="store_true")
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--no-models", action="store_true")
    parser.add_argument("--models", default="bert_base,resnet50")
    parser.add_argument("--model-batches", default="1,32")
    parser.add_argument("--only", default="", help="layers whose name holds one of these "
                        "comma-separated words (bert, 1x1, 3x3, 768->3072, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="processes compiling the layers' "
                        "modules into the on-disk cache first (NVRTC is most of the time)")
    parser.add_argument("--compile-only", action="store_true", help="only fill the module "
                        "cache (layers with --jobs, and models), time nothing")
    parser.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "dnnc_pruned"))
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.sparsity = [float(s) for s in args.sparsity.split(",")]
    cp = device.import_cupy()
    machine = device.machine()
    print(f"# {header()}; fp32, TF32 off; dnnc dense kernels vs the SpMM")
    failed = 0
    if not args.no_layers:
        try:
            layers_table(cp, machine, args)
        except Exception:
            traceback.print_exc()
            failed = 1
    if not args.no_models:
        for batch in (int(b) for b in args.model_batches.split(",")):
            for name in args.models.split(","):
                try:
                    print(model_rows(cp, name, batch, args), flush=True)
                except Exception:
                    traceback.print_exc()
                    failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
