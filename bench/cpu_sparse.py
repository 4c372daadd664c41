"""dnnc on magnitude-pruned models (sparse weights, issue 34) next to dnnc on the dense file, in
one run.

    python bench/cpu_sparse.py [--models resnet50,mobilenet_v2,bert_base,resnet50_torch,
                                         resnet50_tv,bert_hf,FILE.onnx,...]
                               [--size 224]
                               [--sparsity 0,0.3,0.7,0.9] [--threads 1,2] [--repeat 10]
                               [--blocks 3] [--cpu-time]
    python bench/cpu_sparse.py --layers [--sparsity 0.5,0.7,0.9] [--threads 1] [--match 3x3]
    python bench/cpu_sparse.py --profile resnet50 [--sparsity 0.9] [--threads 1]

Each zoo model is built once (seeded random weights; a name ending in `_torch`: the zoo model's
torch mirror, bench/zoo_torch.py, on its weights, exported by torch's TorchScript exporter,
whose file folds the batch norms into the convs and writes BERT's linears as MatMul + Add:
`torch_export`; a name of bench/library_models.py: torchvision's or transformers' own
module, exported once by `cpu.library_exports`, needing `PYTHONPATH=$PWD:/work/tvenv` here; a
path ending in .onnx: that file, its symbolic dims 1) and magnitude-pruned per layer (`prune`:
the smallest |w| of every Conv, Gemm and MatMul constant weight set to zero, to the given
fraction; a minimal copy of `dnnc sparsify`'s unstructured rule); the dense file and each
pruned file are compiled by dnnc (llvm; find_sparsity's cost rule choosing per layer which
run sparse) and timed in interleaved blocks of `--repeat` calls, 0.3 s apart, the median
block each. Prints milliseconds, dense / pruned (the speed-up), the layers running sparse of
the products, and the largest difference of the pruned file's outputs between dnnc with and
without the sparse ops (relative to the largest output: a sanity check; what they compute is
tested by tests/backends/llvm/test_sparse.py), then the geometric mean of the speed-ups per
sparsity. `--cpu-time` (1 thread only) times each call by this process's CPU time instead of
the wall clock: on a machine shared with other work, a call longer than a scheduler time slice
is stretched by the others' slices (a 4 ms CPU call measured 8-30 ms on a loaded 2-core host),
diluting every ratio towards 1. One table per thread count (each in a process of its own:
DNNC_NUM_THREADS is read when the worker pool starts).

`--layers`: single layers of those models' shapes (1x1 and 3x3 convs, BERT's projections,
a classifier at batch 1) as SparseConv / SparseDense against the dense ops, forced (not the
cost rule's choice), with the cost rule's estimated speed-up beside the measured one: the
measurements the constants of passes/find_sparsity.py are fitted to.

`--profile MODEL`: the pruned model's kernels, each called alone (`CompiledModel.profile`,
wall clock, medians of `--repeat`), with the sparse ops and without (find_sparsity's choice
against the dense kernels on the same pruned weights), matched by their first node: where a
layer's choice costs or gains time.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.cpu import host_target  # noqa: E402
from dnnc.backends.llvm.entry import runtime  # noqa: E402
from dnnc.backends.registry import REGISTRY  # noqa: E402
from dnnc.compiler.module import CompiledModel  # noqa: E402
from dnnc.frontend.onnx import import_onnx  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.ops.sparse import encode_csr, row_max  # noqa: E402
from dnnc.passes import find_sparsity  # noqa: E402
from dnnc.passes.manager import optimize  # noqa: E402
from cpu import EXPORTS, load_model, median_block_ms  # noqa: E402  (bench/cpu.py, beside)

PRODUCTS = ("Conv", "Gemm", "MatMul")
TORCH = "_torch"
"""A model name ending in this: the zoo model's torch export (`torch_export`)."""
MODELS = "resnet50,mobilenet_v2,bert_base,resnet50_torch,mobilenet_v2_torch,bert_base_torch"
"""Issue 34's models, the zoo's files and torch's exports of them."""


def prune(model: onnx.ModelProto, sparsity: float) -> onnx.ModelProto:
    """A copy of `model` with the `sparsity` fraction of smallest |w| of each Conv, Gemm and
    MatMul constant weight (their input 1, rank >= 2) set to zero."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if not sparsity:
        return out
    weights = {n.input[1] for n in out.graph.node if n.op_type in PRODUCTS and len(n.input) > 1}
    for k, t in enumerate(out.graph.initializer):
        if t.name not in weights or len(t.dims) < 2:
            continue
        w = numpy_helper.to_array(t).copy()
        cut = np.quantile(np.abs(w), sparsity)
        w[np.abs(w) <= cut] = 0
        out.graph.initializer[k].CopyFrom(numpy_helper.from_array(w, t.name))
    return out


def torch_export(model: onnx.ModelProto) -> onnx.ModelProto:
    """Zoo model `model` as torch's TorchScript exporter writes its torch mirror (opset 17,
    the zoo file's input and output names), on the same weights."""
    import torch
    from zoo_torch import module_for   # (bench/, beside this script; needs torch)

    feeds = zoo.inputs_for(model, np.random.default_rng(0))
    names = [i.name for i in model.graph.input]
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module_for(model), tuple(torch.from_numpy(feeds[n]) for n in names),
                          buffer, dynamo=False, input_names=names,
                          output_names=[o.name for o in model.graph.output], opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def dense_model(name: str, size: int) -> tuple[onnx.ModelProto, dict]:
    """The dense file a `--models` name stands for (module docstring) and its inputs."""
    if not name.endswith(".onnx"):
        base_name = name.removesuffix(TORCH)
        if base_name not in zoo.MODELS:   # bench/library_models.py's, exported once
            import library_models
            from torch_models import export_all

            paths = export_all(library_models.MODELS, library_models.export,
                               EXPORTS / "library-torchscript", "torchscript", [name])
            if not paths:
                sys.exit(f"{name}: not exported (see above)")
            return load_model(paths[0], 1)[:2]
        config = {} if base_name.startswith("bert") else {"size": size}
        zoo_file = zoo.build(base_name, **config)
        feeds = zoo.inputs_for(zoo_file, np.random.default_rng(0))
        dense_file = torch_export(zoo_file) if name.endswith(TORCH) else zoo_file
        return dense_file, {i.name: feeds[i.name] for i in dense_file.graph.input
                            if i.name in feeds}
    return load_model(name, 1)[:2]


def _compiled(graph: Graph, sparse: bool) -> CompiledModel:
    """`graph` compiled for this host's llvm target, with or without "sparse_weights"."""
    target = REGISTRY["llvm"].target()
    if not sparse:
        target = dataclasses.replace(target, layouts=tuple(
            x for x in target.layouts if x != "sparse_weights"))
    graph = optimize(graph, target)
    return CompiledModel(graph, runtime(graph, 3, target), "llvm")


def _products(model: CompiledModel) -> tuple[int, int]:
    """(products running as sparse ops, all products) of a compiled model."""
    ops = [n.op for n in model.graph.nodes]
    sparse = sum(op in ("SparseConv", "SparseDense") for op in ops)
    return sparse, sparse + sum(op in ("ConvPacked", "MatMulPacked", "ConvWinograd", "Conv",
                                       "MatMul", "Gemm") for op in ops)


def model_rows(name: str, args) -> list[tuple]:
    dense_file, feeds = dense_model(name, args.size)
    fns, extra = {}, {}
    base = dnnc.compile(dense_file, "llvm")
    fns[0.0] = lambda: base(**feeds)
    for s in args.sparsity:
        if not s:
            continue
        graph = import_onnx(prune(dense_file, s))
        sparse, dense = _compiled(graph, True), _compiled(graph, False)
        got, want = sparse(**feeds), dense(**feeds)
        got, want = (got, want) if isinstance(got, (list, tuple)) else ([got], [want])
        error = max(float(np.abs(np.asarray(g) - np.asarray(w)).max() /
                          max(np.abs(np.asarray(w)).max(), 1e-30)) for g, w in zip(got, want))
        extra[s] = (_products(sparse), error)
        fns[s] = lambda m=sparse: m(**feeds)
    ms = median_block_ms(fns, args.repeat, args.blocks, args.cpu_time)
    rows = []
    for s in sorted(ms):
        (n_sparse, n_all), error = extra.get(s, (_products(base), 0.0))
        rows.append((Path(name).stem, s, ms[s], ms[0.0] / ms[s], n_sparse, n_all, error))
    return rows


def models_table(args) -> None:
    threads = int(args.one)
    cpu = host_target()
    print(f"# {platform.node()} {cpu.cpu}, {cpu.vector_bits}-bit vectors, {threads} "
          f"thread(s); dnnc {dnnc.__version__}; zoo models magnitude-pruned per layer "
          f"(unstructured); speed-up = dense file / pruned file, both dnnc"
          f"{'; CPU time' if args.cpu_time else ''}")
    print(f"{'model':14} {'zeros':>6} {'ms':>9} {'speed-up':>9} {'sparse':>9} "
          f"{'max diff':>9}")
    speedups: dict[float, list[float]] = {}
    for name in args.models.split(","):
        for model, s, ms, up, n_sparse, n_all, error in model_rows(name, args):
            speedups.setdefault(s, []).append(up)
            print(f"{model:14} {s:6.0%} {ms:9.2f} {up:9.2f} {f'{n_sparse}/{n_all}':>9} "
                  f"{error:9.1e}", flush=True)
    for s, ups in sorted(speedups.items()):
        gm = math.exp(sum(map(math.log, ups)) / len(ups))
        print(f"{'geomean':14} {s:6.0%} {'':9} {gm:9.2f}")


LAYERS = [  # (name, places or batch-1 image, rows, channels, kernel): 1x1 convs (resnet50's
    # bottleneck reductions and expansions, mobilenet_v2's), resnet50's 3x3 convs (padded 1),
    # BERT-base's projections at 128 tokens, a classifier at batch 1
    ("conv 256->64 @56", (56, 56), 64, 256, 1), ("conv 64->256 @56", (56, 56), 256, 64, 1),
    ("conv 512->128 @28", (28, 28), 128, 512, 1), ("conv 1024->256 @14", (14, 14), 256, 1024, 1),
    ("conv 2048->512 @7", (7, 7), 512, 2048, 1), ("conv 160->960 @7", (7, 7), 960, 160, 1),
    ("conv3x3 64->64 @56", (56, 56), 64, 64, 3), ("conv3x3 128->128 @28", (28, 28), 128, 128, 3),
    ("conv3x3 256->256 @14", (14, 14), 256, 256, 3), ("conv3x3 512->512 @7", (7, 7), 512, 512, 3),
    ("dense 128x768->768", 128, 768, 768, 1), ("dense 128x768->3072", 128, 3072, 768, 1),
    ("dense 128x3072->768", 128, 768, 3072, 1), ("dense 1x2048->1000", 1, 1000, 2048, 1)]


def _layer_graphs(shape, rows: int, channels: int, k: int, zeros: float, rng):
    """(the dense op's graph, the sparse op's graph, an input, its nonzeros) of one layer
    pruned to `zeros`."""
    depth = channels * k * k
    w = rng.standard_normal((rows, depth)).astype(np.float32)
    w[np.abs(w) <= np.quantile(np.abs(w), zeros)] = 0
    windowed = isinstance(shape, tuple) and k > 1   # (stride 1, padded k // 2)
    places = shape[0] * (shape[1] + k - 1) if windowed else 0
    columns_a_slice = find_sparsity.slice_depth(depth, places, windowed,
                                                host_target().vector_bits // 32)
    values, columns, starts = encode_csr(w, columns_a_slice)
    csr = [Value("values", T.TensorType(T.float32, values.shape), const=values),
           Value("columns", T.TensorType(T.int32, columns.shape), const=columns),
           Value("starts", T.TensorType(T.int32, starts.shape), const=starts)]
    attrs = {"row_max": row_max(starts), "slice_depth": columns_a_slice}
    graphs = []
    for sparse in (False, True):
        g = Graph("layer")
        if isinstance(shape, tuple):
            x = g.add_input("x", T.TensorType(T.float32, (1, channels) + shape))
            pads = [k // 2] * 4
            y = g.add("SparseConv", x, *csr, oc=rows, kernel_shape=[k, k], pads=pads,
                      **attrs) if sparse else g.add(
                "Conv", x, Value("w", T.TensorType(T.float32, (rows, channels, k, k)),
                                 const=w.reshape(rows, channels, k, k)), kernel_shape=[k, k],
                pads=pads)
            data = rng.standard_normal((1, channels) + shape).astype(np.float32)
        else:
            x = g.add_input("x", T.TensorType(T.float32, (shape, depth)))
            y = g.add("SparseDense", x, *csr, n=rows, **attrs) if sparse else g.add(
                "MatMul", x, Value("w", T.TensorType(T.float32, (depth, rows)),
                                   const=np.ascontiguousarray(w.T)))
            data = rng.standard_normal((shape, depth)).astype(np.float32)
        g.outputs = [g.add("Relu", y)]
        graphs.append(g)
    return graphs[0], graphs[1], data, int(np.count_nonzero(w))


def layers_table(args) -> None:
    threads = int(args.one)
    cpu = host_target()
    lanes = cpu.vector_bits // 32
    print(f"# {platform.node()} {cpu.cpu}, {cpu.vector_bits}-bit vectors, {threads} "
          f"thread(s); dnnc {dnnc.__version__}; single layers, sparse op forced")
    print(f"{'layer':22} {'zeros':>6} {'dense us':>9} {'sparse us':>10} {'speed-up':>9} "
          f"{'estimate':>9}")
    rng = np.random.default_rng(0)
    for name, shape, rows, channels, k in LAYERS:
        if args.match not in name:
            continue
        places = shape[0] * shape[1] if isinstance(shape, tuple) else shape
        depth = channels * k * k
        for zeros in args.sparsity:
            dense_g, sparse_g, data, nnz = _layer_graphs(shape, rows, channels, k, zeros, rng)
            dense, sparse = _compiled(dense_g, False), _compiled(sparse_g, False)
            ms = median_block_ms({"dense": lambda: dense(data), "sparse": lambda: sparse(data)},
                                 args.repeat, args.blocks, args.cpu_time)
            estimate = find_sparsity.dense_cycles(places, rows, depth, lanes) / \
                find_sparsity.sparse_cycles(places, rows, depth, nnz, lanes,
                                            not isinstance(shape, tuple)) if k == 1 else \
                float("nan")   # (3x3: against Winograd, estimated in the pass itself)
            print(f"{name:22} {zeros:6.0%} {ms['dense'] * 1e3:9.1f} {ms['sparse'] * 1e3:10.1f} "
                  f"{ms['dense'] / ms['sparse']:9.2f} {estimate:9.2f}", flush=True)


def profile_table(args) -> None:
    threads = int(args.one)
    cpu = host_target()
    name = args.profile
    dense_file, feeds = dense_model(name, args.size)
    feeds = list(feeds.values())
    for s in args.sparsity:
        graph = import_onnx(prune(dense_file, s))
        rows = {}
        for sparse in (False, True):
            for row in _compiled(graph, sparse).profile(*feeds, repeat=args.repeat):
                rows.setdefault(row["nodes"][0], {})[sparse] = row
        print(f"# {platform.node()} {cpu.cpu}, {threads} thread(s); {name} at {s:.0%} zeros: "
              f"each kernel alone (wall clock), dense kernels / find_sparsity's choice")
        print(f"{'first node':34} {'dense ms':>9} {'chosen ms':>9} {'ratio':>6}  template")
        total = {False: 0.0, True: 0.0}
        for first, pair in sorted(rows.items(), key=lambda kv: -max(
                r["ms"] for r in kv[1].values())):
            ms = {k: pair[k]["ms"] if k in pair else float("nan") for k in (False, True)}
            for k in total:
                total[k] += ms[k] if k in pair else 0.0
            chosen = pair.get(True, pair.get(False))
            print(f"{first[:34]:34} {ms[False]:9.3f} {ms[True]:9.3f} "
                  f"{ms[False] / ms[True]:6.2f}  {chosen.get('template', '')} "
                  f"{chosen.get('config', '')}"[:160], flush=True)
        print(f"{'sum':34} {total[False]:9.3f} {total[True]:9.3f} "
              f"{total[False] / total[True]:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--sparsity", default=None,
                        help="fractions of zeros (default 0,0.3,0.7,0.9; --layers 0.5,0.7,0.9)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--layers", action="store_true")
    parser.add_argument("--match", default="", help="--layers: only layers whose name has this")
    parser.add_argument("--profile", help="one model's kernels, dense and as chosen")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time calls by the process's CPU time (1 thread only)")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # one thread count, in this process
    args = parser.parse_args()
    if args.cpu_time and args.threads != "1" and args.one != "1":
        parser.error("--cpu-time times calls at --threads 1 (other threads' CPU time "
                     "counts too)")
    default = "0.5,0.7,0.9" if args.layers else "0.9" if args.profile else "0,0.3,0.7,0.9"
    sparsity = args.sparsity or default
    if args.one:
        args.sparsity = [float(s) for s in sparsity.split(",")]
        (layers_table if args.layers else profile_table if args.profile else
         models_table)(args)
        return
    for n in args.threads.split(","):
        env = {**os.environ, "DNNC_NUM_THREADS": n}
        subprocess.run([sys.executable, __file__, "--one", n, "--models", args.models,
                        "--size", str(args.size), "--sparsity", sparsity,
                        "--repeat", str(args.repeat), "--blocks", str(args.blocks)]
                       + (["--layers", "--match", args.match] if args.layers else [])
                       + (["--profile", args.profile] if args.profile else [])
                       + (["--cpu-time"] if args.cpu_time else []),
                       env=env, check=True)


if __name__ == "__main__":
    main()
