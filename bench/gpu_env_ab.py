"""A/B of one compile-time switch on the cuda target, end to end, in one process: each model
compiled once with the switch's environment variable as given (`--env NAME=VALUE`) and once
without it, then called in interleaved trials (A, B, A, B, ...: clock and thermal drift fall
on both alike), inputs and outputs on the GPU as a torch caller keeps them.

    PYTHONPATH=$PWD python bench/gpu_env_ab.py --env DNNC_WGMMA=0 [--base NAME=VALUE] \
        [--models bert_hf,vit_tiny_timm] [--batch 32] [--precision fp16] [--repeat 20]
        [--trials 5]

Models are bench/library_models.py's (token models at batch 8 at most, as
bench/gpu_versus.py). Prints per model the median ms of each side, B / A (B: with the
variable set) and the largest difference of their outputs, then the geometric mean of B / A.
Needs torch and CuPy; never imported by dnnc.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_timing import header, interleaved_ms  # noqa: E402
from dnnc.compiler.module import call_times_ms  # noqa: E402

TOKEN_BATCH = 8


def compiled(path: Path, x, precision: str, env: dict[str, str] | None):
    """The model at `path` compiled for cuda at `precision` with `env` set meanwhile."""
    import dnnc

    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        options = {} if precision == "fp32" else {"precision": precision}
        # cache=False: the compile cache's key does not hold environment switches, so a
        # cached compile would hand B the kernels A compiled (A against A)
        return dnnc.compile(str(path), "cuda", input_shapes={"x": tuple(x.shape)},
                            progress=False, cache=False, **options)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def one(name: str, folder: Path, env: dict[str, str], args) -> float:
    import numpy as np
    import torch

    from library_models import build, export

    module, example = build(name)
    tokens = not example.dtype.is_floating_point
    batch = min(args.batch, TOKEN_BATCH) if tokens else args.batch
    path = folder / f"{name}.onnx"
    if not path.exists():
        export(name, path)
    gen = torch.Generator().manual_seed(batch)
    x = (torch.randint(0, 5000, (batch, *example.shape[1:]), generator=gen) if tokens else
         torch.randn((batch, *example.shape[1:]), generator=gen)).cuda()
    sides = [compiled(path, x, args.precision, None), compiled(path, x, args.precision, env)]
    outs = [m.run(x, to="numpy")[0].astype(np.float64) for m in sides]

    def timer(model):
        def once(repeat):
            def call():
                model.run(x)
                torch.cuda.current_stream().synchronize()
            return float(np.median(call_times_ms(call, repeat, 0)))
        return once

    a, b = interleaved_ms([timer(m) for m in sides], args.repeat, args.trials)
    diff = float(np.max(np.abs(outs[0] - outs[1]))) / max(float(np.max(np.abs(outs[0]))), 1e-30)
    print(f"{name:<18} {args.precision:<5} b{batch:<4} A {a:8.3f} ms  B {b:8.3f} ms  "
          f"B/A {b / a:5.3f}  outputs differ by {diff:.1e} of the largest", flush=True)
    return b / a


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, action="append",
                        help="NAME=VALUE set while side B compiles (repeatable)")
    parser.add_argument("--base", action="append", default=[],
                        help="NAME=VALUE set while both sides compile (repeatable)")
    parser.add_argument("--models", default="bert_hf,vit_tiny_timm,convnext_tiny,resnet18_tv")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--folder", default=None, help="where the exported files go")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    os.environ.update(dict(item.split("=", 1) for item in args.base))
    print(header(), flush=True)
    print(f"# A: default{' with ' + ', '.join(args.base) if args.base else ''}; B: {env} too",
          flush=True)
    folder = Path(args.folder or "/tmp/dnnc_env_ab")
    folder.mkdir(parents=True, exist_ok=True)
    ratios = []
    for name in args.models.split(","):
        try:
            ratios.append(one(name, folder, env, args))
        except Exception as exc:   # one model's failure must not hide the others
            print(f"{name}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    if ratios:
        print(f"geomean B/A {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over "
              f"{len(ratios)} models", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
