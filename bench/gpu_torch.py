"""dnnc's cuda target against PyTorch on the same architectures, on one GPU, in one run.

    python bench/gpu_torch.py [--models gpt2_small,resnet18_torch,mobilenet_v3_small,vit_tiny]
                              [--repeat 50] [--warmup 10] [--no-compile]

The models are bench/torch_models.py's (written in plain PyTorch with the layer shapes of
the originals, seeded weights), so both sides run the same weights: PyTorch runs the module,
dnnc the ONNX file torch's TorchScript exporter writes from it. Batch 1, float32, TF32 off on
both sides (dnnc's kernels compute in fp32). Per model, median milliseconds of one call with
the input and output on the GPU, each call ended by a device synchronize:
- eager: the module;
- compile: `torch.compile(module)` (default mode);
- reduce-overhead: `torch.compile(module, mode="reduce-overhead")` (CUDA graphs);
- dnnc: the compiled model replaying its CUDA graph (CuPy in and out, zero conversion cost
  on the torch side: DLPack);
and dnnc's ratio to each, and its largest error against eager in units of
(atol 1e-4 + rtol 1e-3 |eager|). Prints the GPU and the library versions first.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

RTOL, ATOL = 1e-3, 1e-4


def median_ms(fn, sync, repeat: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def bench(name: str, args, folder: Path) -> str:
    import cupy
    import torch

    import dnnc
    from torch_models import build, export

    path = export(name, folder / f"{name}.onnx")
    module, x = build(name)   # the exported weights and example input
    module, x = module.cuda(), x.cuda()
    sync = torch.cuda.synchronize
    with torch.no_grad():
        want = module(x).float().cpu().numpy()
        eager = median_ms(lambda: module(x), sync, args.repeat, args.warmup)
        modes = {}
        if not args.no_compile:
            for mode in ("default", "reduce-overhead"):
                compiled_t = torch.compile(module, mode=None if mode == "default" else mode)
                for _ in range(3):   # compile and record outside the timing
                    compiled_t(x)
                modes[mode] = median_ms(lambda: compiled_t(x), sync, args.repeat, args.warmup)
    compiled = dnnc.compile(str(path), "cuda",
                            input_shapes={"x": tuple(x.shape)})
    compiled.runtime.outputs = "cupy"
    xd = cupy.from_dlpack(x)
    got = cupy.asnumpy(compiled.run(xd)[0])
    stream = cupy.cuda.get_current_stream()
    ours = median_ms(lambda: compiled.run(xd), stream.synchronize, args.repeat, args.warmup)
    ref = want.astype(np.float64)
    err = float(np.max(np.abs(got.astype(np.float64) - ref) / (ATOL + RTOL * np.abs(ref))))
    cells = [f"{eager:8.3f}"] + [f"{modes[m]:8.3f}" if m in modes else f"{'-':>8}"
                                 for m in ("default", "reduce-overhead")]
    ratios = [f"{ours / eager:6.2f}"] + [f"{ours / modes[m]:6.2f}" if m in modes else
                                         f"{'-':>6}" for m in ("default", "reduce-overhead")]
    return (f"{name:<20} {compiled.stats['kernels']:>7} {' '.join(cells)} {ours:8.3f} "
            f"{' '.join(ratios)}  {err:.3f} {'ok' if err <= 1 else 'FAIL'}")


def main() -> int:
    import torch

    from dnnc.backends.cuda import device

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2_small,resnet18_torch,mobilenet_v3_small,"
                                            "vit_tiny")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"gpu {device.describe()}, torch {torch.__version__}, cupy "
          f"{device.versions()['cupy']}; batch 1, fp32, TF32 off; median of {args.repeat}")
    print(f"{'model':<20} {'kernels':>7} {'eager':>8} {'compile':>8} {'reduce-o':>8} "
          f"{'dnnc':>8} {'/eager':>6} {'/comp':>6} {'/r-o':>6}  err/tol")
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            try:
                print(bench(name, args, Path(folder)), flush=True)
            except Exception as exc:   # one model's failure must not hide the others
                failed += 1
                print(f"{name:<20} error: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                traceback.print_exc(file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
