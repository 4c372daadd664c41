"""Traced NumPy programs: `dnnc.jit` next to NumPy itself and, where installed, `jax.jit` (XLA
on the CPU), measured in one run.

    python bench/trace.py [--programs mlp,rms_norm,...] [--repeat 20] [--rounds 5]
                          [--target llvm]

Each program is a plain NumPy function at a realistic size (a GELU MLP whose weights are
arguments, norms, softmax, attention, reductions over every axis). Each runs under NumPy, under
`dnnc.jit` and under `jax.jit` (the same function with `jax.numpy` for `np`), their results
checked against NumPy's first. Timing: `--rounds` rounds, each runtime a block of `--repeat`
calls per round in turn (so all see the same machine state); a runtime's time is the median of
its blocks' medians. Prints milliseconds, dnnc/jax and dnnc/numpy per program, and the
geometric means. Threads: dnnc's pool follows DNNC_NUM_THREADS or the affinity mask; XLA's
follows the affinity mask (confine both with `taskset -c 2,3`); NumPy's BLAS its own settings
(OPENBLAS_NUM_THREADS). jax needs `pip install jax` (never a dependency of dnnc); without it
the jax column is empty.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402


def programs(xp):
    """name -> (function, argument shapes), written against the array module `xp`."""

    def gelu(h):
        return 0.5 * h * (1.0 + xp.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))

    def mlp(x, w1, b1, w2, b2):
        return gelu(x @ w1 + b1) @ w2 + b2

    def rms_norm(x, g):
        return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

    def layer_norm(x, g, b):
        mu = xp.mean(x, axis=-1, keepdims=True)
        var = xp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / xp.sqrt(var + 1e-5) * g + b

    def masked_softmax(s, mask):
        s = s + mask
        e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        return e / xp.sum(e, axis=-1, keepdims=True)

    def attention(q, k, v):
        s = q @ xp.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        return (e / xp.sum(e, axis=-1, keepdims=True)) @ v

    def var_axis0(x):
        return xp.var(x, axis=0)

    def sum_axis0(x):
        return xp.sum(x, axis=0)

    def sum_axis1(x):
        return xp.sum(x, axis=1)

    def max_axis0(x):
        return xp.max(x, axis=0)

    def sum_all(x):
        return xp.sum(x)

    def mean_axis1_3d(x):
        return xp.mean(x, axis=1)

    return {
        "mlp": (mlp, [(128, 768), (768, 3072), (3072,), (3072, 768), (768,)]),
        "rms_norm": (rms_norm, [(1024, 768), (768,)]),
        "layer_norm": (layer_norm, [(1024, 768), (768,), (768,)]),
        "masked_softmax": (masked_softmax, [(8, 12, 128, 128), (8, 1, 1, 128)]),
        "attention": (attention, [(8, 12, 128, 64)] * 3),
        "var_axis0": (var_axis0, [(4096, 1024)]),
        "sum_axis0": (sum_axis0, [(4096, 1024)]),
        "sum_axis1": (sum_axis1, [(4096, 1024)]),
        "max_axis0": (max_axis0, [(4096, 1024)]),
        "sum_all": (sum_all, [(4096, 1024)]),
        "mean_axis1_3d": (mean_axis1_3d, [(64, 512, 256)]),
    }


def block_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default=",".join(programs(np)))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--target", default="llvm")
    args = parser.parse_args()
    try:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax
        import jax.numpy as jnp
    except ImportError:
        jax = jnp = None
    ours, theirs = programs(np), programs(jnp) if jnp is not None else {}
    names = args.programs.split(",")
    unknown = [n for n in names if n not in ours]
    if unknown:
        parser.error(f"unknown program(s) {', '.join(unknown)}; known: {', '.join(ours)}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"affinity {len(os.sched_getaffinity(0))}; numpy {np.__version__}, "
          f"jax {jax.__version__ if jax else '(not installed)'}; dnnc target {args.target}",
          flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for name in names:
        fn, shapes = ours[name]
        # weights scaled as initialisers are (1/sqrt(fan_in)), so outputs stay near 1
        inputs = [(rng.standard_normal(s) / (math.sqrt(s[0]) if name == "mlp" and len(s) == 2
                                             and k else 1)).astype(np.float32)
                  for k, s in enumerate(shapes)]
        if name == "masked_softmax":   # an additive mask: 0 where kept, -1e9 where masked
            inputs[1] = np.where(rng.random(shapes[1]) < 0.8, 0.0, -1e9).astype(np.float32)
        want = fn(*inputs)
        runs = {"numpy": lambda fn=fn, inputs=inputs: fn(*inputs)}
        compiled = dnnc.jit(fn, target=args.target)
        start = time.perf_counter()
        got = compiled(*inputs)
        compile_s = time.perf_counter() - start
        # float32 sums in another order: errors scale with the output's magnitude
        atol = 1e-4 * max(1.0, float(np.max(np.abs(want))))
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=atol, err_msg=f"dnnc {name}")
        runs["dnnc"] = lambda c=compiled, inputs=inputs: c(*inputs)
        if jax is not None:
            jfn = jax.jit(theirs[name][0])
            device = [jnp.asarray(a) for a in inputs]
            np.testing.assert_allclose(np.asarray(jfn(*device)), want, rtol=1e-3, atol=atol,
                                       err_msg=f"jax {name}")
            runs["jax"] = lambda f=jfn, d=device: f(*d).block_until_ready()
        blocks = {k: [] for k in runs}
        for _ in range(args.rounds):
            for k, run in runs.items():
                run()
                blocks[k].append(block_ms(run, args.repeat))
        ms = {k: float(np.median(b)) for k, b in blocks.items()}
        rows.append((name, ms, compile_s))
        print(f"  {name}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)
    print(f"\n{'program':16} {'numpy ms':>9} {'dnnc ms':>9} {'jax ms':>9} {'dnnc/np':>8} "
          f"{'dnnc/jax':>9} {'compile s':>9}")
    for name, ms, compile_s in rows:
        jx = ms.get("jax")
        print(f"{name:16} {ms['numpy']:9.3f} {ms['dnnc']:9.3f} "
              f"{jx if jx is not None else float('nan'):9.3f} {ms['dnnc'] / ms['numpy']:8.2f} "
              f"{ms['dnnc'] / jx if jx else float('nan'):9.2f} {compile_s:9.2f}")

    def geomean(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")

    print(f"geomean dnnc/numpy {geomean([m['dnnc'] / m['numpy'] for _, m, _ in rows]):.2f}"
          + (f", dnnc/jax {geomean([m['dnnc'] / m['jax'] for _, m, _ in rows]):.2f} "
             f"(max {max(m['dnnc'] / m['jax'] for _, m, _ in rows):.2f})" if jax else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
