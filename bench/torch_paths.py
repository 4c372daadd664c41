"""One model through torch.compile(backend="dnnc") and through its ONNX export, side by side:
whether dnnc compiled the same graph both ways, and where a call's time goes.

    python bench/torch_paths.py [--models resnet18_tv,convnext_tiny,bert_hf] [--target llvm|cuda]
                                [--threads 2] [--repeat 20] [--blocks 3]

For each of bench/library_models.py's models (batch 1, random seeded weights): the ONNX file
TorchScript exports (`dnnc.compile`d) and the backend's compile (one partition expected).
Prints, per path, the nodes imported and left after dnnc's passes, the kernels, the op counts
that differ, and the kernels (each the op sequence it fused) one path has and the other has not;
then the median ms of each layer of a call, in interleaved blocks: `onnx` (the ONNX compile's
`model(x)`), `onnx.run` and `fx.run` (each compile's `run` on the same array: the code alone),
`partition` (the backend's `DnncPartition`: tensors in and out) and `torch.compile` (dynamo's
guards and wrappers too). The same graph and kernels with `fx.run` = `onnx.run` leave only
the layers above to explain a gap. `--target cuda`: the CUDA tensor in place, each call timed
to its end. Needs torch (and the models' libraries); never imported by dnnc.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import io
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import library_models  # noqa: E402
from cpu import median_block_ms  # noqa: E402

import dnnc  # noqa: E402
from dnnc.compiler import torch_backend  # noqa: E402


def both(name: str, target: str):
    """The module, its input, the ONNX path's CompiledModel and the backend's callable and
    single partition (its CompiledModel and its DnncPartition)."""
    module, x = library_models.build(name)
    if target == "cuda":
        module, x = module.cuda(), x.cuda()
    buf = io.BytesIO()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), \
            contextlib.redirect_stderr(quiet), torch.no_grad():
        torch.onnx.export(module, (x,), buf, dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    onnx = dnnc.compile(buf.getvalue(), target, cache=False)   # (cache=False: profile())
    torch._dynamo.reset()
    fn = torch.compile(module, backend=torch_backend.dnnc_backend,
                       options={"target": target, "cache": False})
    with torch.no_grad():
        fn(x)
    models = torch_backend.reports()[-1].models
    parts = [o for o in gc.get_objects() if type(o) is torch_backend.DnncPartition]
    return x, onnx, fn, models, parts


def kernels(model, array) -> list[str]:
    """Each kernel of a call as the ops it fused ("MatMulPacked Gelu")."""
    ops = {n.name: n.op for n in model.graph.nodes}
    return [" ".join(ops.get(n, "?") for n in k.get("nodes", ())) for k in model.profile(array,
                                                                              repeat=1)]


def graphs(onnx, fx, array) -> None:
    sides = {"onnx": onnx, "fx": fx}
    counts = {k: collections.Counter(n.op for n in m.graph.nodes) for k, m in sides.items()}
    fused = {k: collections.Counter(kernels(m, array)) for k, m in sides.items()}
    for k, m in sides.items():
        s = m.stats
        print(f"  {k:5} imported {s.get('imported_nodes')} nodes, {s['nodes']} after passes, "
              f"{sum(fused[k].values())} kernels")
    ops = sorted(set(counts["onnx"]) | set(counts["fx"]))
    diff = [f"{op} {counts['onnx'][op]}/{counts['fx'][op]}" for op in ops
            if counts["onnx"][op] != counts["fx"][op]]
    print("  ops onnx/fx that differ: " + (", ".join(diff) or "none"))
    for a, b in (("onnx", "fx"), ("fx", "onnx")):
        only = fused[a] - fused[b]
        for group, n in only.most_common(8):
            print(f"  kernel only in {a}: {n} x [{group}]")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet18_tv,convnext_tiny,bert_hf")
    parser.add_argument("--target", default="llvm", choices=("llvm", "cuda"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    gpu = args.target == "cuda"
    print(f"# {torch.cuda.get_device_name() if gpu else 'cpu'}, {args.target}, batch 1, "
          f"torch {torch.__version__}; ms: median of {args.blocks} interleaved blocks of "
          f"{args.repeat} calls")
    for name in args.models.split(","):
        try:
            x, onnx, fn, models, parts = both(name, args.target)
        except ImportError as exc:
            print(f"# {name}: not built ({exc})")
            continue
        print(f"{name}: {len(models)} partition(s)", flush=True)
        array = x if gpu else x.numpy()
        layers = {"onnx": lambda: onnx(array), "onnx.run": lambda: onnx.run(array)}
        if len(models) == 1 and parts:
            graphs(onnx, models[0], array)
            layers["fx.run"] = lambda: models[0].run(array)
            layers["partition"] = lambda: parts[-1](x)
        layers["torch.compile"] = lambda: fn(x)
        if gpu:   # a call ends when its results are ready
            layers = {k: (lambda f=f: (f(), torch.cuda.synchronize())) for k, f in
                      layers.items()}
        with torch.no_grad():
            times = median_block_ms(layers, args.repeat, args.blocks)
        print("  " + "  ".join(f"{k} {v:.3f}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
