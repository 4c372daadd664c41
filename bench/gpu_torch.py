"""dnnc's cuda target against PyTorch on the same architectures, on one GPU, in one run.

    python bench/gpu_torch.py [--models gpt2_small,resnet18_torch,mobilenet_v3_small,vit_tiny]
                              [--repeat 50] [--warmup 10] [--no-compile]

The models are bench/torch_models.py's (written in plain PyTorch with the layer shapes of
the originals, seeded weights), so both sides run the same weights: PyTorch runs the module,
dnnc the ONNX file torch's TorchScript exporter writes from it. Batch 1, float32, TF32 off on
both sides (dnnc's kernels compute in fp32; torch's float32 matmul precision is "highest").
Per model, median milliseconds of one call with the input and output on the GPU, each call
ended by a device synchronize:
- eager: the module;
- compile: `torch.compile(module)` (default mode);
- reduce-overhead: `torch.compile(module, mode="reduce-overhead")` (CUDA graphs);
- dnnc: the compiled model replaying its CUDA graph, given the torch tensor itself (read in
  place, on torch's current stream) and returning a CuPy array (`torch.from_dlpack` takes it
  without a copy);
and dnnc's ratio to each, and its largest error against eager in units of
(atol 1e-4 + rtol 1e-3 |eager|). Prints the GPU, driver, CUDA and library versions first.
Timing, the version line and the error measure are bench/gpu_timing.py's, shared with
bench/gpu.py (whose torch columns do the same on the zoo's models).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_timing import (error_ratio, fp32_only, header, median_ms, torch_cells,  # noqa: E402
                        torch_medians)


def bench(name: str, args, folder: Path) -> str:
    import torch

    import dnnc
    from torch_models import build, export

    path = export(name, folder / f"{name}.onnx")
    module, x = build(name)   # the exported weights and example input
    module, x = module.cuda(), x.cuda()
    with torch.no_grad():
        want = module(x).float().cpu().numpy()
    medians = torch_medians(module, [x], args.repeat, args.warmup,
                            compile_modes=not args.no_compile)
    compiled = dnnc.compile(str(path), "cuda",
                            input_shapes={"x": tuple(x.shape)})
    # the torch tensor in (read in place, on torch's current stream), CuPy out
    got = compiled.run(x, to="numpy")[0]

    def device_call():
        compiled.run(x)
        torch.cuda.current_stream().synchronize()

    ours = median_ms(device_call, args.repeat, args.warmup)
    err = error_ratio([got], [want])
    times, ratios = torch_cells(medians, ours)
    return (f"{name:<20} {compiled.stats['kernels']:>7} {times} {ours:8.3f} {ratios}  "
            f"{err:.3f} {'ok' if err <= 1 else 'FAIL'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2_small,resnet18_torch,mobilenet_v3_small,"
                                            "vit_tiny")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    fp32_only()
    print(header())
    print(f"batch 1, fp32, TF32 off (matmul precision highest); median of {args.repeat}")
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
