"""The sm_90 wgmma product's producer warpgroup (`TensorCoreConfig.producer`, wgmma.py: by
cp.async or by TMA) and the hand-written TMA product (`tma.py`) against the dense default and
cuBLAS, one run (issue 31): issue 31's transformer shapes
(M = 128 ... 8192 with 768 x 3072 and 3072 x 768, m x k x n) and 4096^3, fp16 and bf16
stored in and out (a half-storage model's products; B stored [k, n]); at tf32 (`--precisions
tf32`) float32 operands holding tf32 values, B stored [n, k] (a tf32 model's products:
passes/store_tf32.py, convert_layout's tf32_dense), Y float32.

    python bench/gpu_gemm_ab.py [--precisions fp16,bf16] [--shapes MxKxN,...]
                                [--trials 7] [--repeat 20] [--jobs 16]
                                [--tile-s 80e-9,30e-9] [--out rows.json] [--tma 0]
                                [--sweep]

Per cell (shape, precision) the rows are cuBLAS (torch.matmul in the precision), the
default without the producer (`old`: the dense default's pick, `producer` off), the default
(as `mma.dense_default` takes it: DNNC_PRODUCER / PRODUCER_DEFAULT), the old default's tile
with the cp.async producer (`+producer`) and with the TMA producer (`+tma`), and, for each
`--tile-s`, what `mma.choose` picks with a k tile's fixed cost (`mma.WGMMA_TILE_S`, 190 ns
fitted without the producer) that small, with the producer the default gives it
(`mma.producer_by_default`): what the default would be were the TMA producer to take that
cost away; then 128 x 256 (4 slots), 128 x 192 (5 slots), 128
x 128 (6 slots) and 128 x 64 (8 slots) unsplit, staged, with the TMA producer (the template's
tensor maps built per cell from `CudaKernel.tensor_maps`, `tensor_map.kernel_map`); then
`tma.py`'s hand-written TMA product (one elected thread's TMA copies, setmaxnreg, unsplit,
16-bit results staged: session 48 found staging faster on every cell) at the same four
blocks, its tensor maps built once per cell (`tensor_map.operand_map`; not at tf32, where
the rows add `fp16's pick`: the tile the fp16 default takes, 32 deep, with TMA, and the
wider tiles are not staged, as a float32 Y is not). `--sweep` times
instead the default and every `SWEEP_TILES` block with the TMA producer at each split
(`sweep`). Every launch is a
CUDA graph replayed (`cupy_graph_timer` / `torch_graph_timer`), a cell's rows timed in turn,
trial by trial (`interleaved_ms`); every result checked against the float64 product within
the precision's bound (as bench/gpu_kernels.py's dense rows, the 16-bit output's own
rounding allowed). Every kernel is compiled first, `--jobs` NVRTC processes at once (into
the module cache the timing then reads). The exit status is 1 when a result was wrong.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
from dataclasses import asdict, dataclass, replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_kernels import UNIT, blas_peer   # noqa: E402
from gpu_timing import cupy_graph_timer, header, interleaved_ms, launch_args   # noqa: E402

from dnnc.backends.cuda import device, mma, tensor_map, tma, wgmma   # noqa: E402
from dnnc.backends.cuda.codegen import Launch, render_module   # noqa: E402
from dnnc.backends.cuda.dense import Operand   # noqa: E402
from dnnc.ir import loop as L   # noqa: E402
from dnnc.ir import types as T   # noqa: E402
from dnnc.ir.ops.packed import round_tf32   # noqa: E402

SHAPES = tuple((m, 768, 3072) for m in (128, 256, 512, 1024, 2048, 4096, 8192)) + \
    tuple((m, 3072, 768) for m in (128, 256, 512, 1024, 2048, 4096, 8192)) + \
    ((4096, 4096, 4096),)
"""(m, k, n): issue 31's transformer shapes and 4096^3."""


def old_default(m: int, k: int, n: int, precision: str, gpu) -> mma.TensorCoreConfig:
    """The dense default of a 16-bit product stored in 16 bits, the producer off; at tf32
    (operands tf32 values, Y float32) as the default took it before session 51: the
    efficiencies' tile (without `tf32_copied`), no producer."""
    if precision == "tf32":
        return mma.choose(m, n, k, 1, gpu, precision, wgmma=True)
    chosen = mma.choose(m, n, k, 1, gpu, precision, wgmma=True, staged=True)
    return replace(mma.staged_by_default(chosen, mma.STORAGE[precision], precision),
                   producer=False)


def dense_default(m: int, k: int, n: int, precision: str, gpu) -> mma.TensorCoreConfig:
    """The dense default as `mma.dense_default` takes it (a 16-bit Y staged; at tf32 a
    float32 Y, operands tf32 values)."""
    if precision == "tf32":   # (B [n, k], tf32 values: `mma.tf32_copied`)
        return mma.producer_by_default(mma.choose(m, n, k, 1, gpu, precision, wgmma=True,
                                                  tf32_copied=True), precision, k)
    return mma.producer_by_default(old_default(m, k, n, precision, gpu), precision, k)


def produced(c: mma.TensorCoreConfig, slots: int = 0, producer: bool | str = True,
             precision: str = "fp16") -> mma.TensorCoreConfig | None:
    """Config `c` with the producer (`producer`: True, cp.async's, or "tma"; and `slots`
    more), or None outside the space."""
    if not c.wgmma:
        return None
    p = replace(c, producer=producer, refill_first=False, early_refill=False,
                stages=c.stages + slots)
    # (fp16 and bf16 tiles take the same bytes, tf32's too at its k tile of 32)
    fits = wgmma.fits(p, precision) and \
        mma.shared_bytes(p, precision) <= mma.MAX_WGMMA_SHARED_BYTES
    return p if fits else None


SWEEP_TILES = tuple((bm, bn, wm, wn, stages) for bm, bn, wm, wn, stages, _ in
                    mma.WGMMA_DEFAULTS) + ((128, 64, 8, 1, 8),)
"""`--sweep`'s blocks: the default's wgmma tiles and 128 x 64 in 8 slots (the fastest block at
1024 x 3072 x 768 in session 49's and 50's calls: `mma.WGMMA_TALL_TILE`)."""


def sweep(m: int, k: int, n: int, precision: str, gpu) -> list:
    """(label, config) of `--sweep`'s rows: the default, then every SWEEP_TILES block with
    the TMA producer, unsplit (results staged) and split in 2, 4 and 8 as far as each slice
    keeps `mma.WGMMA_MIN_SLICE_TILES` k tiles (the default's floor): the timings a refit of
    `mma.WGMMA_TILE_S`'s model with the TMA producer needs."""
    default = dense_default(m, k, n, precision, gpu)
    rows = [("default", default)]
    for bm, bn, wm, wn, stages in SWEEP_TILES:
        for split in (1, 2, 4, 8):
            if split > 1 and -(-k // wgmma.block_k(precision)) < \
                    split * mma.WGMMA_MIN_SLICE_TILES:
                break
            tile = mma.TensorCoreConfig(bm, bn, wgmma.block_k(precision), wm, wn, stages,
                                        wgmma=True, split_k=split,
                                        staged=split == 1 and precision != "tf32")
            rows.append((f"sweep {bm}x{bn} sk{split}",
                         produced(tile, producer="tma", precision=precision)))
    out, seen = [], set()
    for label, c in rows:
        if c is not None and c not in seen:
            seen.add(c)
            out.append((label, c))
    return out


def configs(m: int, k: int, n: int, precision: str, gpu, tile_s: list[float],
            with_tma: bool = True) -> list:
    """(label, config) of a cell's dnnc rows, each config once (`tma.py`'s with `with_tma`)."""
    old = old_default(m, k, n, precision, gpu)
    default = dense_default(m, k, n, precision, gpu)
    tf32 = precision == "tf32"
    rows = [("old", old), ("default", default)] + ([] if tf32 else [
        ("+producer", produced(old))]) + [
        ("+tma", produced(old, producer="tma", precision=precision))]
    if tf32:   # the 16-bit default's tile, k tiles of 128 bytes, with TMA
        half = mma.choose(m, n, k, 1, gpu, "fp16", wgmma=True)
        rows.append(("fp16's pick +tma", produced(replace(half, block_k=wgmma.block_k(
            precision)), producer="tma", precision=precision)))
    wide = mma.TensorCoreConfig(wgmma=True, block_k=wgmma.block_k(precision), warps_n=1)
    for bm, bn, wm, stages in ((128, 256, 8, 4), (128, 192, 8, 5),
                               (128, 128, 8, 6), (128, 64, 8, 8)):   # wider, unsplit
        tile = replace(wide, block_m=bm, block_n=bn, warps_m=wm, stages=stages,
                       staged=not tf32)
        rows.append((f"{bm}x{bn} +tma", produced(tile, producer="tma", precision=precision)))
    saved = mma.WGMMA_TILE_S
    try:
        for seconds in tile_s:
            mma.WGMMA_TILE_S = seconds
            pick = dense_default(m, k, n, precision, gpu)
            rows.append((f"pick at {seconds * 1e9:.0f} ns", pick))
    finally:
        mma.WGMMA_TILE_S = saved
    out, seen = [], set()
    for label, c in rows:
        if c is not None and c not in seen:
            seen.add(c)
            out.append((label, c))
    return out + [(f"tma.py 128x{bn} staged", TmaBlock(bn, stages, True))
                  for bn, stages in ((64, 8), (128, 6), (192, 5), (256, 4))
                  if with_tma and not tf32 and tma.fits(bn, stages) and n % 8 == 0 and
                  k % 8 == 0]


@dataclass(frozen=True)
class TmaBlock:
    """A block of `tma.py`'s product: 128 x `block_n`, `stages` slots, its results
    `staged` or not."""

    block_n: int
    stages: int
    staged: bool


def source(precision: str, m: int, k: int, n: int, c) -> tuple[str, object, str]:
    """(the CUDA source, its module entry, the kernel's name) of Y = A B, A [m, k], B
    [k, n] and Y [m, n] in the precision's 16-bit type, under config `c` (a `TmaBlock`:
    `tma.py`'s kernel, its entry None); at tf32 A [m, k] and B [n, k] float32 holding tf32
    values (`Operand.rounded`), Y float32."""
    if isinstance(c, TmaBlock):
        return (tma.source(precision, m, n, k, c.block_n, c.stages, c.staged), None,
                "tma_product")
    if precision == "tf32":
        a, b = L.Buffer("a", T.float32, (1, m, k)), L.Buffer("b", T.float32, (1, n, k))
        y = L.Buffer("y", T.float32, (1, m, n))
        body = mma.mma_product(c, 1, m, n, k,
                               Operand(lambda bi, i, kk: a[bi, i, kk], False, True,
                                       rounded=True),
                               Operand(lambda bi, j, kk: b[bi, j, kk], False, True,
                                       rounded=True),
                               lambda bi, i, j, value: L.Store(y, (bi, i, j), value),
                               precision=precision)
        func = L.PrimFunc("ab", (a, b, y), body)
        module = render_module([(func, True)])
        return module.source, module.kernels[func.name], func.name
    dtype = mma.STORAGE[precision]
    a, b = L.Buffer("a", dtype, (1, m, k)), L.Buffer("b", dtype, (1, k, n))
    y = L.Buffer("y", dtype, (1, m, n))
    body = mma.mma_product(c, 1, m, n, k,
                           Operand(lambda bi, i, kk: a[bi, i, kk], False, True),
                           Operand(lambda bi, j, kk: b[bi, kk, j], True, True),
                           lambda bi, i, j, value: L.Store(y, (bi, i, j),
                                                           L.Cast(dtype, value)),
                           precision=precision)
    func = L.PrimFunc("ab", (a, b, y), body)
    module = render_module([(func, True)])
    return module.source, module.kernels[func.name], func.name


def _tiles(c) -> str:
    if isinstance(c, TmaBlock):
        return f"128x{c.block_n} st{c.stages} tma" + " staged" * c.staged
    return f"{c.block_m}x{c.block_n} st{c.stages} sk{c.split_k}" + "".join(
        f" {f}" for f in ("refill_first", "staged", "producer", "cluster_split")
        if getattr(c, f)) + " tma" * (c.producer == "tma")


def _compile(item: tuple[str, str]) -> int:
    text, arch = item
    device.ModuleCache().get(text, arch, device.nvrtc_options(arch))
    return len(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp16,bf16")
    parser.add_argument("--shapes", default="")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--tile-s", default="80e-9,30e-9")
    parser.add_argument("--out", default="")
    parser.add_argument("--tma", type=int, default=1, help="0: without tma.py's rows")
    parser.add_argument("--sweep", action="store_true",
                        help="the default and SWEEP_TILES' blocks with TMA at each split only")
    parser.add_argument("--list", action="store_true",
                        help="print each cell's configs (device.REFERENCE's figures), time none")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] \
        or SHAPES
    tile_s = [float(x) for x in args.tile_s.split(",") if x]

    def rows_of(m: int, k: int, n: int, precision: str, gpu) -> list:
        return sweep(m, k, n, precision, gpu) if args.sweep else \
            configs(m, k, n, precision, gpu, tile_s, bool(args.tma))
    if args.list:
        for precision in args.precisions.split(","):
            for m, k, n in shapes:
                for label, c in rows_of(m, k, n, precision, device.REFERENCE):
                    print(precision, f"{m}x{k}x{n}", label, _tiles(c))
        return 0
    gpu = device.describe_gpu(device.properties())
    arch = device.gpu_arch()
    cells = []
    for precision in args.precisions.split(","):
        for m, k, n in shapes:
            rows = [(label, c, *source(precision, m, k, n, c))
                    for label, c in rows_of(m, k, n, precision, gpu)]
            cells.append((precision, (m, k, n), rows))
    items = sorted({(row[2], device.compile_arch(arch, row[2]))
                    for _, _, rows in cells for row in rows})
    with concurrent.futures.ProcessPoolExecutor(
            args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, items))

    import cupy as cp

    print(header())
    print(f"{len(items)} kernels compiled; graphs, {args.repeat} launches x {args.trials} "
          f"trials, interleaved with cuBLAS")
    wrong, records = 0, []
    rng = np.random.default_rng(0)
    for precision, (m, k, n), rows in cells:
        tf32 = precision == "tf32"
        if tf32:   # tf32 values in float32 (as a tf32 model's products read them)
            x = round_tf32(rng.uniform(-1, 1, (m, k)).astype(np.float32))
            w = round_tf32(rng.uniform(-1, 1, (k, n)).astype(np.float32))
        else:
            dtype = mma.STORAGE[precision].np
            x = rng.uniform(-1, 1, (m, k)).astype(np.float32).astype(dtype)
            w = rng.uniform(-1, 1, (k, n)).astype(np.float32).astype(dtype)
        x_dev, w_dev = cp.asarray(x.astype(np.float32)), cp.asarray(w.astype(np.float32))
        x64, w64 = x_dev.astype(cp.float64), w_dev.astype(cp.float64)   # (exact copies)
        want = cp.asnumpy(x64 @ w64)
        scale = cp.asnumpy(cp.abs(x64) @ cp.abs(w64))
        del x64, w64
        u = UNIT[precision]   # (at tf32 Y is float32: no rounding of its own)
        limit = (2 * u + u * u + k * (2.0 ** -23 + 2.0 ** -24)) * scale + \
            (0.0 if tf32 else u) * np.abs(want)
        if precision == "fp16":
            limit += 2 * k * 2.0 ** -25
        peer = blas_peer(cp, precision, x_dev, w_dev, True)
        if tf32:
            a_dev = x_dev.reshape(1, m, k)
            b_dev = cp.ascontiguousarray(w_dev.T).reshape(1, n, k)
        else:
            a_dev = cp.asarray(x.view(np.uint16)).reshape(1, m, k)
            b_dev = cp.asarray(w.view(np.uint16)).reshape(1, k, n)
        timers, outs, kept = [peer[2]], [], []
        for label, c, text, info, name in rows:
            raw = cp.cuda.function.Module()
            raw.load(device.ModuleCache().get(text, device.compile_arch(arch, text),
                                              device.nvrtc_options(
                                                  device.compile_arch(arch, text))))
            out = cp.zeros((1, m, n), cp.float32 if tf32 else cp.uint16)
            fns = []
            if isinstance(c, TmaBlock):
                name_ = {"fp16": "float16", "bf16": "bfloat16"}[precision]
                maps = cp.asarray(np.concatenate([
                    tensor_map.operand_map(a_dev.data.ptr, name_, (1, m, k), tma.BLOCK_M),
                    tensor_map.operand_map(b_dev.data.ptr, name_, (1, k, n), tma.BLOCK_K)]))
                args_ = (maps, out)
                grid, block, shared = tma.launch(m, n, c.block_n, c.stages)
                fn = raw.get_function(name)
                device.allow_shared(fn, shared)
                fns.append((fn, Launch(name, grid, block, shared)))
            else:   # (the template's tensor maps, `producer="tma"`, after the workspace)
                args_ = launch_args(cp, info, [a_dev, b_dev, out])
                for lc in info.launches:
                    fn = raw.get_function(lc.name)
                    device.allow_shared(fn, lc.shared_bytes)
                    fns.append((fn, lc))

            def launch(fns=fns, args_=args_):
                for fn, lc in fns:
                    fn(lc.grid, lc.block, args_, shared_mem=lc.shared_bytes)
            launch()
            cp.cuda.runtime.deviceSynchronize()
            got = (cp.asnumpy(out) if tf32 else cp.asnumpy(out).view(dtype)).astype(
                np.float64)[0]
            ok = bool(np.isfinite(got).all() and (np.abs(got - want) <= limit).all())
            wrong += not ok
            kept.append(raw)
            timers.append(cupy_graph_timer(cp, launch))
            outs.append(ok)
        times = interleaved_ms(timers, args.repeat, args.trials)
        blas = times[0]
        print(f"\n{precision} {m}x{k}x{n}: {peer[0]} {blas * 1e3:.1f} us")
        for (label, c, *_), ms, ok in zip(rows, times[1:], outs):
            print(f"  {label:28s} {_tiles(c):52s} {ms * 1e3:8.1f} us {blas / ms:6.2f} "
                  f"{'ok' if ok else 'WRONG'}")
            records.append(dict(precision=precision, shape=[m, k, n], label=label,
                                config=asdict(c) | {"tma": isinstance(c, TmaBlock)},
                                us=ms * 1e3, cublas_us=blas * 1e3, ok=ok))
        del kept
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f)
    print(f"\nwrong: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
