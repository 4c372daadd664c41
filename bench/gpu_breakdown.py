"""Where dnnc's cuda time goes against torch.compile's, kernel class by kernel class, both
traced in the model by the same profiler (issue 31: which kind of kernel loses).

    PYTHONPATH=$PWD python bench/gpu_breakdown.py [--models vit_tiny_timm,convnext_tiny,...]
        [--precision fp16] [--batch 32] [--iters 10] [--top 12] [--folder DIR]

Per model (bench/library_models.py's architectures, exported once to ONNX with a symbolic
batch; a transformer runs at batch 8 at most, as in bench/gpu_versus.py), in one process:
- torch: the module at the precision (fp16 / bf16: `module.half()` and half inputs; tf32:
  TF32 allowed) under `torch.compile` (default mode: no CUDA graphs, so every kernel is
  traced as launched; reduce-overhead replays the same kernels);
- dnnc: the float32 file compiled with `precision=`, called on the same torch tensor;
- each side runs `--iters` calls under `torch.profiler` (CUPTI traces every kernel of the
  process, dnnc's CuPy launches and graph replays too), so a kernel's time is its time in
  the model, in sequence, with the caches as the model leaves them (`Module.profile` times
  a kernel alone instead).
Kernels fall into classes by name (torch's: cuBLAS / CUTLASS / cuDNN names and inductor's
triton kernel kinds; dnnc's: the template that scheduled each kernel, from
`Module.profile`'s rows): product (dense and conv on tensor cores or SIMT), attention, norm /
softmax rows, depthwise, pointwise and the rest. Prints per class the milliseconds a call of
each side spends there and dnnc / torch, then each side's `--top` kernels. The kernel sums
leave out launch gaps: the whole-call medians are printed beside them. Never imported by dnnc.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_timing import header, median_ms  # noqa: E402
from gpu_versus import TOKEN_BATCH, TORCH_DTYPES, torch_precision  # noqa: E402

TORCH_CLASSES = [   # (class, pattern of a kernel name), first match wins
    ("attention", r"flash|fmha|attention|sdpa|efficient_attention"),
    ("product", r"gemm|xmma|cutlass|cublas|sm\d\d_|wgmma|implicit|conv|winograd|"
                r"triton_tem|mm_|_mm|bmm"),
    ("depthwise", r"depthwise|dwconv"),
    ("rows", r"triton_per|triton_red|softmax|layer_norm|norm"),
    ("pointwise", r"triton_poi|elementwise|vectorized|unrolled"),
]

DNNC_CLASSES = [   # (class, pattern of a template name)
    ("attention", r"attention"),
    ("depthwise", r"depthwise"),
    ("product", r"mma|wgmma|dense|conv|gemv|int8|sparse"),
    ("rows", r"rows|norm|softmax|reduce|mean"),
    ("pointwise", r"elementwise|pointwise|generic|loops"),
]


def classify(name: str, table) -> str:
    for cls, pattern in table:
        if re.search(pattern, name, re.I):
            return cls
    return "other"


def traced(call, iters: int) -> tuple[dict[str, float], dict[str, int]]:
    """{kernel name: device milliseconds per call} and {kernel name: launches per call} of
    `iters` calls under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type) \
                and e.device_time_total:
            if "memcpy" in e.name.lower() or "memset" in e.name.lower():
                cls_name = "[" + e.name.split()[0] + "]"
                out[cls_name] += e.device_time_total / 1000.0 / iters
                continue
            out[e.name] += e.device_time_total / 1000.0 / iters
            count[e.name] += 1
    return out, {k: round(v / iters) for k, v in count.items()}


def by_class(kernels: dict[str, float], class_of) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, ms in kernels.items():
        out[class_of(name)] += ms
    return out


def one(name: str, path: Path, args) -> None:
    import torch

    import dnnc
    from library_models import build

    module, example = build(name)
    tokens = not example.dtype.is_floating_point
    batch = min(args.batch, TOKEN_BATCH) if tokens else args.batch
    gen = torch.Generator().manual_seed(batch)
    x = torch.randint(0, 5000, (batch, *example.shape[1:]), generator=gen) if tokens else \
        torch.randn((batch, *example.shape[1:]), generator=gen)
    module, x = module.cuda(), x.cuda()
    torch_precision(args.precision)
    if args.precision in TORCH_DTYPES:
        dtype = getattr(torch, TORCH_DTYPES[args.precision])
        t_module, t_x = module.to(dtype), (x if tokens else x.to(dtype))
    else:
        t_module, t_x = module, x
    torch._dynamo.reset()
    compiled = torch.compile(t_module)
    with torch.no_grad():
        def t_call():
            compiled(t_x)
        t_call()
        t_ms = median_ms(lambda: (t_call(), torch.cuda.synchronize()), 20, 3)
        t_kernels, t_counts = traced(t_call, args.iters)
    options = {} if args.precision == "fp32" else {"precision": args.precision}
    model = dnnc.compile(str(path), "cuda", input_shapes={"x": tuple(x.shape)},
                         progress=False, cache=False, **options)
    rows = [row for row in model.profile(x) if row.get("kernel")]
    templates = {row["kernel"]: str(row.get("template") or "") for row in rows}
    alone: dict[str, list] = defaultdict(lambda: [0.0, 0.0, ""])   # ms, flops, config
    for row in rows:
        a = alone[row["kernel"]]
        a[0] += row["ms"]
        a[1] += row.get("flops") or 0
        a[2] = str(row.get("config") or "")
    stream = torch.cuda.current_stream()

    def d_call():
        model.run(x)
    d_ms = median_ms(lambda: (d_call(), stream.synchronize()), 20, 3)
    d_kernels, d_counts = traced(d_call, args.iters)

    def template_of(kernel: str) -> str:
        # a stage of a kernel (split-k's products "_s0" and sums "_s1") is its kernel's
        staged = re.sub(r"_s\d+$", "", kernel)
        return templates.get(kernel) or templates.get(staged) or next(
            (t for k, t in templates.items() if re.search(rf"\b{re.escape(k)}\b", kernel)), "")

    def d_class(kernel: str) -> str:
        return classify(template_of(kernel) or kernel, DNNC_CLASSES)

    def t_class(kernel: str) -> str:
        return classify(kernel, TORCH_CLASSES)

    dc, tc = by_class(d_kernels, d_class), by_class(t_kernels, t_class)
    print(f"\n## {name} {args.precision} b{batch}: call dnnc {d_ms:.3f} ms, torch.compile "
          f"{t_ms:.3f} ms ({d_ms / t_ms:.2f}); kernel sums dnnc {sum(dc.values()):.3f}, "
          f"torch {sum(tc.values()):.3f}; kernels a call dnnc {len(d_kernels)} kinds, "
          f"torch {len(t_kernels)} kinds", flush=True)
    for cls in sorted(set(dc) | set(tc), key=lambda c: -(dc.get(c, 0) + tc.get(c, 0))):
        d, t = dc.get(cls, 0.0), tc.get(cls, 0.0)
        ratio = f"{d / t:5.2f}" if t > 0 else "    -"
        print(f"  {cls:<12} dnnc {d:7.3f}  torch {t:7.3f}  dnnc/torch {ratio}")
    print(f"  -- dnnc top {args.top}: ms a call in the model, launches, ms alone "
          f"(Module.profile), TFLOP/s in the model, template, kernel, config")
    for kernel, ms in sorted(d_kernels.items(), key=lambda kv: -kv[1])[:args.top]:
        a = alone.get(kernel, [0.0, 0.0, ""])
        tflops = a[1] / (ms * 1e9) if a[1] and ms else 0.0
        print(f"    {ms:7.4f} x{d_counts.get(kernel, 0):<3} {a[0]:7.4f} {tflops:6.1f} "
              f"{template_of(kernel)[:22]:<22} {kernel[:28]:<28} {a[2][:110]}")
    print(f"  -- torch top {args.top}: ms a call, launches, class, kernel")
    for kernel, ms in sorted(t_kernels.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"    {ms:7.4f} x{t_counts.get(kernel, 0):<3} {t_class(kernel):<10} {kernel[:110]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_tiny_timm,convnext_tiny,resnet18_tv,bert_hf")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--folder", default=None, help="where the exported files go (kept)")
    args = p.parse_args(argv)
    import library_models

    print(header(), flush=True)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.folder or tmp)
        for path in library_models.export_all(folder, "torchscript", args.models.split(",")):
            try:
                one(Path(path).stem, Path(path), args)
            except Exception as exc:   # one model's failure must not hide the others
                failed += 1
                print(f"{Path(path).stem}: FAILED {type(exc).__name__}: {str(exc)[:300]}",
                      flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
