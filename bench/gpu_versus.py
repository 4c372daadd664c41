"""dnnc's cuda target against the fastest PyTorch mode, per precision and batch: issue 31's
"done when" table, on the libraries' own architectures.

    PYTHONPATH=$PWD python bench/gpu_versus.py [--models convnext_tiny,resnet18_tv,...]
        [--batches 1,32] [--precisions fp32,tf32,fp16] [--modes eager,reduce-overhead]
        [--repeat 30] [--warmup 5]

Models are bench/library_models.py's (torchvision, timm and transformers modules with seeded
random weights; needs those libraries: the GPU machine's host has them), each exported once
as a float32 ONNX file with a symbolic batch (by TorchScript, else by torch's dynamo exporter:
gpt2_hf, llama_hf), and dnnc's zoo models named `zoo:NAME` (`zoo:resnet50`, `zoo:bert_base`:
the zoo's file with a symbolic batch against its torch mirror, bench/zoo_torch.py, on the
same weights). A model of token inputs runs at batch 8 where the others run at 32
(`--batches`' largest, capped at 8). Per (model, precision, batch), in one process:
- torch: the module in each of `--modes` (eager, default = torch.compile(), reduce-overhead =
  torch.compile with CUDA graphs), median ms of a call ended by torch.cuda.synchronize. fp32:
  TF32 off in matmuls and cuDNN; tf32: TF32 allowed in both; fp16 / bf16: the module and its
  float inputs cast to that type (`module.half()`), as people deploy it;
- dnnc: the float32 file compiled with `precision=` (fp32 default, tf32, fp16, bf16), given
  the float32 torch tensor, timed the same way;
- the ratio dnnc / the fastest torch mode; dnnc's error against torch's fp32 eager output on
  the same input (max |d| / max |want|) and, for image classifiers, top-1 agreement.
A summary prints the geometric mean of the ratio per (precision, batch) and the worst model.
A failing model or mode prints one line and the others go on. Timing is wall time with a
device synchronize, as bench/gpu_timing.py's. Never imported by dnnc.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_timing import header, median_ms  # noqa: E402

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
TOKEN_BATCH = 8


def torch_precision(precision: str) -> None:
    import torch

    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def torch_times(module, xs: tuple, modes: list[str], repeat: int, warmup: int) -> dict:
    import torch

    def timed(fn):
        def call():
            fn(*xs)
            torch.cuda.synchronize()
        return median_ms(call, repeat, warmup)

    out = {}
    with torch.no_grad():
        for mode in modes:
            try:
                if mode == "eager":
                    out[mode] = timed(module)
                    continue
                torch._dynamo.reset()
                compiled = torch.compile(module, mode=None if mode == "default" else mode)
                for _ in range(3):
                    compiled(*xs)
                out[mode] = timed(compiled)
            except Exception as exc:   # one mode's failure must not hide the others
                print(f"#   torch {mode} failed: {type(exc).__name__}: {str(exc)[:150]}",
                      flush=True)
                out[mode] = None
    return out


def inputs(name: str, path: Path, batch: int):
    """(torch module, its inputs as CPU tensors, whether they are tokens) of model `name` at
    `batch` (at most TOKEN_BATCH for a model of token inputs): a zoo model's inputs are
    `zoo.inputs_for`'s, seeded; a library model's its example's shape, seeded by the batch."""
    import numpy as np
    import onnx
    import torch

    if name.startswith("zoo:"):
        from zoo_torch import module_for

        from dnnc import zoo

        model = onnx.load(str(path))
        module = module_for(model)
        tokens = any(i.type.tensor_type.elem_type == onnx.TensorProto.INT64
                     for i in model.graph.input)
        batch = min(batch, TOKEN_BATCH) if tokens else batch
        feeds = zoo.inputs_for(zoo.build(name[4:], batch=batch), np.random.default_rng(batch))
        return module, tuple(torch.from_numpy(np.ascontiguousarray(v))
                             for v in feeds.values()), tokens
    from library_models import build

    module, example = build(name)
    tokens = not example.dtype.is_floating_point
    batch = min(batch, TOKEN_BATCH) if tokens else batch
    gen = torch.Generator().manual_seed(batch)
    x = torch.randint(0, 5000, (batch, *example.shape[1:]), generator=gen) if tokens else \
        torch.randn((batch, *example.shape[1:]), generator=gen)
    return module, (x,), tokens


def one(name: str, path: Path, precision: str, batch: int, args) -> tuple[float, str] | None:
    """(dnnc / the fastest torch mode, the printed row) of model `name` at `precision` and
    `batch` (at most TOKEN_BATCH for a model of token inputs)."""
    import numpy as np
    import onnx
    import torch

    import dnnc

    module, xs, tokens = inputs(name, path, batch)
    batch = xs[0].shape[0]
    module, xs = module.cuda(), tuple(x.cuda() for x in xs)
    torch_precision("fp32")
    with torch.no_grad():
        want = module(*xs).float().cpu().numpy()
    torch_precision(precision)
    if precision in TORCH_DTYPES:
        dtype = getattr(torch, TORCH_DTYPES[precision])
        t_module = module.to(dtype)
        t_xs = tuple(x.to(dtype) if x.dtype.is_floating_point else x for x in xs)
    else:
        t_module, t_xs = module, xs
    times = torch_times(t_module, t_xs, args.modes, args.repeat, args.warmup)
    del t_module
    options = {} if precision == "fp32" else {"precision": precision}
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in constants]
    model = dnnc.compile(str(path), "cuda", progress=False,
                         input_shapes={n: tuple(x.shape) for n, x in zip(names, xs)},
                         **options)
    got = model.run(*xs, to="numpy")[0]

    def call():
        model.run(*xs)
        torch.cuda.current_stream().synchronize()

    ours = median_ms(call, args.repeat, args.warmup)
    best_mode = min((m for m in times if times[m]), key=lambda m: times[m], default=None)
    ratio = ours / times[best_mode] if best_mode else math.nan
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / max(
        float(np.max(np.abs(want))), 1e-30)
    top1 = ""
    if not tokens and want.ndim == 2:
        top1 = f" top1 {np.mean(got.argmax(1) == want.argmax(1)):.2f}"
    cells = " ".join(f"{m} {times[m]:.3f}" if times[m] else f"{m} -" for m in args.modes)
    line = (f"{name:<18} {precision:<5} b{batch:<4} dnnc {ours:8.3f} ms | {cells} | "
            f"dnnc/best {ratio:5.2f} | rel err {err:.1e}{top1}")
    return ratio, line


def zoo_file(name: str, folder: Path) -> Path:
    """Zoo model `name` with a symbolic batch, written into `folder` as zoo_NAME.onnx."""
    import onnx

    from dnnc import zoo

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"zoo_{name}.onnx"
    onnx.save(zoo.build(name, batch="N"), str(path))
    return path


def row_name(path: Path) -> str:
    """The model name a file `path` of main's folder stands for."""
    name = path.stem.removesuffix("_dynamo")
    return f"zoo:{name[4:]}" if name.startswith("zoo_") else name


def compile_rows(args) -> int:
    """A prewarm job: each of `args.rows` (path|precision|batch, comma-separated) compiled and
    called once by dnnc and by every torch mode, nothing timed or printed but failures."""
    args.repeat, args.warmup = 1, 0
    for row in args.rows.split(","):
        path, precision, batch = row.split("|")
        try:
            one(row_name(Path(path)), Path(path), precision, int(batch), args)
        except Exception as exc:
            print(f"# prewarm {row}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
    return 0


def prewarm(names: list[str], args) -> None:
    """Every (file, precision, batch) row compiled in `args.prewarm` processes at once."""
    import os
    import subprocess
    import time

    rows = [f"{path}|{precision}|{batch}" for path in names
            for batch in sorted({int(b) for b in args.batches.split(",")})
            for precision in args.precisions.split(",")]
    jobs = [rows[i::args.prewarm] for i in range(args.prewarm)]
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(
        max(1, (os.cpu_count() or 1) // args.prewarm)))
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--rows", ",".join(job),
                               "--modes", ",".join(args.modes)], env=env)
             for job in jobs if job]
    for proc in procs:
        proc.wait()
    print(f"# prewarm: {len(rows)} rows compiled in {len(procs)} processes, "
          f"{time.perf_counter() - start:.0f} s", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="convnext_tiny,resnet18_tv,efficientnet_b0,"
                                       "vit_tiny_timm,bert_hf")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--precisions", default="fp32,tf32,fp16")
    p.add_argument("--modes", default="eager,reduce-overhead",
                   help="torch modes: eager, default, reduce-overhead")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--folder", default=None, help="where the exported files go (kept)")
    p.add_argument("--prewarm", type=int, default=0, metavar="JOBS",
                   help="first compile every row (dnnc and torch, untimed) in JOBS processes "
                        "at once, so the timed rows find dnnc's and inductor's caches warm")
    p.add_argument("--rows", default=None, help=argparse.SUPPRESS)   # a prewarm job's rows
    args = p.parse_args(argv)
    args.modes = args.modes.split(",")
    if args.rows:
        return compile_rows(args)
    import library_models

    print(header())
    print(f"# dnnc / fastest of torch {args.modes}; median of {args.repeat}; rel err against "
          f"torch fp32 eager on the same input", flush=True)
    ratios: dict[tuple[str, int], list[tuple[float, str]]] = {}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.folder or tmp)
        wanted = [n for n in args.models.split(",") if not n.startswith("zoo:")]
        names = [str(zoo_file(n[4:], folder)) for n in args.models.split(",")
                 if n.startswith("zoo:")]
        if wanted:   # (export_all of no names would export every library model)
            names += library_models.export_all(folder, "torchscript", wanted)
        exported = {Path(n).stem for n in names}
        # what TorchScript cannot export (transformers' gpt2 and llama: aten::diff) goes
        # through torch's dynamo exporter, as NAME_dynamo.onnx
        left = [n for n in wanted if n not in exported]
        if left:
            names += library_models.export_all(folder, "dynamo", left, suffix="_dynamo")
        if args.prewarm:
            prewarm(names, args)
        for path in names:
            path = Path(path)
            name = row_name(path)
            for batch in sorted({int(b) for b in args.batches.split(",")}):
                for precision in args.precisions.split(","):
                    try:
                        ratio, line = one(name, path, precision, batch, args)
                        ratios.setdefault((precision, batch), []).append((ratio, name))
                        print(line, flush=True)
                    except Exception as exc:
                        failed += 1
                        print(f"{name:<18} {precision:<5} b{batch:<4} FAILED: "
                              f"{type(exc).__name__}: {str(exc)[:200]}", flush=True)
                        traceback.print_exc(file=sys.stderr)
    for (precision, batch), rs in sorted(ratios.items()):
        good = [r for r, _ in rs if r == r]
        if not good:
            continue
        geo = math.exp(sum(math.log(r) for r in good) / len(good))
        worst = max(rs, key=lambda rn: rn[0])
        print(f"# {precision:<5} batch {batch:<4} geomean dnnc/best {geo:5.2f} over "
              f"{len(good)}, worst {worst[1]} {worst[0]:.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
