"""The int8 product template's tiles on one model's products, each kernel timed alone (CUDA
events around back-to-back launches, `tuning.compile_kernel`'s `time_ms`), beside the fp16
default of the same product: what `int8.choose` is fitted on.

    python bench/gpu_int8_tiles.py QUANTIZED.onnx [FLOAT.onnx]

Takes the model's cuda_int8_dense and cuda_int8_conv2d_nhwc kernels (those of the m x n x k
listed in $ONLY, "MxNxK,...", where it is set) (`autotune.tasks.extract`, as `dnnc tune`
does), one of each kind (m x n x k, the nodes' ops, a layout tail or none), builds each with
every tile of TILES that its space holds (staged where `mma.staged_by_default` says, as the
default would be), compiles them all at once in worker processes (NVRTC into the on-disk
module cache), then times them one after another in this process, each checked against the
default tile's outputs. With FLOAT.onnx, the fp16 compile's dense kernels of the same m x n
x k are timed at their default. Prints a table per product (us, and over the fastest) and
writes $OUT/int8_tiles.json. Never imported by dnnc.
"""
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dnnc.autotune.measure import agree, random_arrays  # noqa: E402
from dnnc.autotune.tasks import extract  # noqa: E402
from dnnc.backends.cuda import device, int8, int8_nhwc, mma, tuning  # noqa: E402
from dnnc.backends.cuda.codegen import render_module  # noqa: E402
from dnnc.backends.cuda.mma import TensorCoreConfig  # noqa: E402
from dnnc.backends.registry import REGISTRY  # noqa: E402
from dnnc.compiler.driver import load_graph  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.levels import DEFAULT_OPT_LEVEL  # noqa: E402
from dnnc.passes.manager import optimize  # noqa: E402

TILES = [TensorCoreConfig(bm, bn, 128, wm, 1, s, wgmma=True, refill_first=rf)
         for bm, bn, wm, s, rf in ((128, 256, 8, 4, False), (128, 256, 8, 3, False),
                                   (128, 128, 8, 5, True), (128, 128, 8, 4, False),
                                   (128, 128, 8, 3, False), (64, 256, 4, 4, False),
                                   (64, 256, 4, 3, False), (64, 128, 4, 5, True),
                                   (64, 128, 4, 4, False), (64, 128, 4, 3, False),
                                   (64, 64, 4, 4, False), (64, 64, 4, 5, False),
                                   (128, 64, 8, 4, False), (256, 128, 8, 3, False))] + \
    [TensorCoreConfig(bm, bn, 64, wm, wn, 3) for bm, bn, wm, wn in mma.DEFAULTS[:6]]
"""wgmma tiles (k tiles of 128 bytes) and mma.sync's DEFAULTS tiles (64 bytes, 3 stages)."""


SHAPES = {"cuda_int8_dense": lambda p: (p.m, p.n, p.k),
          "cuda_int8_conv2d_nhwc": lambda p: int8_nhwc.gemm(p)}
"""The templates timed, and the m x n x k of a problem of each."""


def tasks(path: str, precision: str | None):
    spec = REGISTRY["cuda"]
    machine = spec.target(None, precision)
    graph = optimize(load_graph(path), machine, DEFAULT_OPT_LEVEL)
    return machine, extract(graph, spec.tuning(), machine)


def compiled(job) -> str:
    """Worker: kernel `job` built with its config and compiled into the module cache."""
    kernel, machine, config = job
    try:
        func = tuning.build(kernel, machine, config)
        module = render_module([(func, True)])
        arch = device.compile_arch(machine.arch, module.source)
        device.ModuleCache().get(module.source, arch, device.nvrtc_options(arch))
        return ""
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:200]


def time_us(kernel, machine, config, reference=None):
    arrays = random_arrays(kernel, 0)
    call = tuning.compile_kernel(tuning.build(kernel, machine, config), arrays, machine)
    call()
    call.fetch()
    outputs = [a.copy() for a in arrays[len(kernel.inputs):]]
    ok = reference is None or all(agree(g, w) for g, w in zip(outputs, reference))
    return 1000 * min(call.time_ms(5, 0.02) for _ in range(3)), ok, outputs


def main() -> None:
    t0 = time.perf_counter()
    machine, found = tasks(sys.argv[1], None)
    products = {}
    only = os.environ.get("ONLY")
    for t in found:   # (every layer's products are tasks of their own: one a kind)
        if t.template.name in SHAPES:
            p = t.problem
            kind = (SHAPES[t.template.name](p), getattr(p, "store_index", None) is not None,
                    tuple(n.op for n in t.kernel.nodes))
            if not only or "x".join(map(str, kind[0])) in only.split(","):
                products.setdefault(kind, []).append(t)
    jobs, rows = [], []
    for same in products.values():
        t = same[0]
        t.count = len(same)
        p = t.problem
        space = t.template.space(p, machine)
        default = t.template.default(p, machine)
        stored = T.int8 if p.y.dtype is T.float32 and t.template.name == "cuda_int8_dense" \
            else p.y.dtype
        configs = [default]
        for c in TILES:
            c = mma.staged_by_default(c, stored, int8.precision(p))
            try:
                space.check(c)
            except Exception:
                continue
            if c not in configs:
                configs.append(c)
        rows.append((t, configs))
        jobs += [(t.kernel, machine, c) for c in configs]
    with ProcessPoolExecutor(int(os.environ.get("WORKERS", 8)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        errors = list(pool.map(compiled, jobs))
    print(f"{len(jobs)} kernels compiled in {time.perf_counter() - t0:.0f} s, "
          f"{sum(map(bool, errors))} failed: {[e for e in errors if e][:3]}", flush=True)
    gate = os.environ.get("GATE")   # (a file: time nothing before it exists)
    while gate and not Path(gate).exists():
        time.sleep(0.5)
    fp16 = {}
    if len(sys.argv) > 2:
        half, half_tasks = tasks(sys.argv[2], "fp16")
        for t in half_tasks:
            p = t.problem
            if t.template.name.endswith("_dense"):
                key = (p.m, p.n, p.k)
                if key not in fp16:
                    c = t.template.default(p, half)
                    us, _, _ = time_us(t.kernel, half, c)
                    fp16[key] = (us, t.template.name, str(c))
    result = []
    for t, configs in rows:
        p = t.problem
        timed, reference = [], None
        for c in configs:
            try:
                us, ok, outputs = time_us(t.kernel, machine, c, reference)
            except Exception as exc:
                print(f"  {c}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                continue
            reference = outputs if reference is None else reference
            timed.append((us, ok, c))
        best = min(us for us, ok, c in timed if ok)
        m, n, k = SHAPES[t.template.name](p)
        half = fp16.get((m, n, k))
        print(f"\n{m} x {n} x {k} ({t.count} kernels, {t.name})"
              + (f"; fp16 default {half[0]:.1f} us ({half[1]}: {half[2]})" if half else ""))
        for us, ok, c in timed:
            tile = f"{c.block_m}x{c.block_n} w{c.warps_m}x{c.warps_n} k{c.block_k} " \
                   f"s{c.stages}{' wgmma' if c.wgmma else ' mma'}" \
                   f"{' rf' if c.refill_first else ''}{' staged' if c.staged else ''}"
            print(f"  {tile:42} {us:7.2f} us {us / best:5.2f}"
                  f"{'' if ok else ' WRONG'}{'  <- default' if c is configs[0] else ''}")
        result.append({"m": m, "n": n, "k": k, "count": t.count, "fp16": half,
                       "tiles": [[us, ok, asdict(c)] for us, ok, c in timed]})
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "int8_tiles.json").write_text(json.dumps(result))
    print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
