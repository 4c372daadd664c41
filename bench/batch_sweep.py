"""Time per item over batch sizes: a model whose time per item gets worse as the batch grows
has a cliff (issue 31, item 1: convnext_tiny at batch 32 ran 18x slower than torch).

    PYTHONPATH=$PWD python bench/batch_sweep.py [--target cuda] [--models mlp,cnn,resnet18]
                                                [--batches 1,8,32,128] [--files a.onnx,...]
                                                [--repeat 20] [--slack 0.10]

Each model (zoo models built with a symbolic batch, and ONNX files whose first input dim is
symbolic) is compiled once; every batch size is warmed up until it runs its own code
(`compiler.module.warm_up`), then timed (`CompiledModel.benchmark`, median of --repeat calls,
each ended on the device), its inputs already where the target returns results (CuPy
arrays on a GPU: host copies are not the model's time). A row prints ms per call and µs per item at each size, and FLAGS
the model when a larger batch costs more per item than a smaller one by more than --slack
(default 10%: timing noise on a shared machine). Exit status 1 when any model is flagged.
Inputs are `dnnc bench`'s (`random_inputs`: seeded standard normal floats, integers 0 or 1).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.registry import REGISTRY, default_target  # noqa: E402
from dnnc.compiler.cli.models import random_inputs  # noqa: E402
from dnnc.compiler.module import warm_up  # noqa: E402


def cliffs(per_item: dict[int, float], slack: float) -> list[tuple[int, int]]:
    """The (smaller, larger) batch pairs where the larger costs more per item than the
    smaller by more than `slack`."""
    sizes = sorted(per_item)
    return [(a, b) for i, a in enumerate(sizes) for b in sizes[i + 1:]
            if per_item[b] > per_item[a] * (1 + slack)]


def sweep(name: str, source, target: str, batches: list[int], repeat: int,
          slack: float, precision: str = "fp32") -> tuple[str, bool]:
    """One model's row and whether it has a cliff."""
    options = {} if precision == "fp32" else {"precision": precision}
    model = dnnc.compile(source, target=target, progress=False, **options)
    # inputs where the target's own results live (CuPy arrays on a GPU target): the model's
    # time, not the host copies' (a pageable copy of 77 MB takes longer per byte)
    to_native = (lambda a: a)
    if REGISTRY[target].returns[0] == "cupy":
        import cupy
        to_native = cupy.asarray
    rng = np.random.default_rng(0)
    per_call, per_item, owns = {}, {}, []
    for batch in batches:
        feeds = random_inputs(model, {}, {d: batch for t in model.input_types
                                          for d in t.shape if not isinstance(d, int)}, rng)
        arrays = [to_native(feeds[name]) for name in model.input_names]
        own = warm_up(model, lambda: model.run(*arrays), 3)
        owns.append(own)
        per_call[batch] = model.benchmark(*arrays, repeat=repeat)["median_ms"]
        per_item[batch] = per_call[batch] * 1e3 / batch
    found = cliffs(per_item, slack)
    cells = "  ".join(f"b{b}: {per_call[b]:8.3f} ms {per_item[b]:9.2f} us/item" for b in batches)
    flag = "" if all(owns) else "  (some size ran on another size's code)"
    flag += ("  CLIFF " + ", ".join(f"b{a}->b{b} x{per_item[b] / per_item[a]:.2f}"
                                   for a, b in found)) if found else ""
    return f"{name:<14} {cells}{flag}", bool(found)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="dnnc target (default: the fastest here)")
    p.add_argument("--models", default="mlp,cnn,resnet18,mobilenet_v2,bert_tiny",
                   help="zoo models, comma-separated ('' for none)")
    p.add_argument("--files", default="", help="ONNX files with a symbolic first input dim")
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--slack", type=float, default=0.10)
    p.add_argument("--precision", default="fp32",
                   help="the compile's precision (cuda: fp32, tf32, fp16, bf16)")
    args = p.parse_args(argv)
    batches = sorted(int(b) for b in args.batches.split(","))
    sources = [(name, zoo.build(name, batch="N")) for name in args.models.split(",") if name]
    sources += [(Path(f).stem, f) for f in args.files.split(",") if f]
    target = args.target or default_target()
    machine = REGISTRY[target].target(None, None)
    where = machine.gpu.name if machine.gpu is not None else \
        f"{machine.cpu or platform.machine()}, {os.cpu_count()} cores"
    print(f"# batch sweep: dnnc {dnnc.__version__}, numpy {np.__version__}, target {target} "
          f"on {where}; batches {batches}, median of {args.repeat}, a cliff is > "
          f"{args.slack:.0%} more per item at a larger batch; precision {args.precision}",
          flush=True)
    flagged = failed = 0
    for name, source in sources:
        try:
            row, cliff = sweep(name, source, target, batches, args.repeat, args.slack,
                               args.precision)
        except dnnc.errors.DNNCError as exc:   # one model's failure does not end the sweep
            row, cliff = f"{name:<14} FAILED: {str(exc).splitlines()[0][:200]}", False
            failed += 1
        flagged += cliff
        print(row, flush=True)
    print(f"# {flagged} of {len(sources)} model(s) with a cliff, {failed} failed")
    return 1 if flagged or failed else 0


if __name__ == "__main__":
    sys.exit(main())
