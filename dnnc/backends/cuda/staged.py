"""The staged epilogue of the tensor-core products (`mma.py`'s `staged` knob): a block's
results go through shared memory before the problem's store finishes them.

Each thread's accumulators go into a block_m x block_n tile of their type (float32, int32;
rows STAGING_PAD apart: a warp's pairs of a fragment land in distinct banks); after a
barrier each thread takes runs of STAGED_RUN consecutive results of a row (consecutive
threads the consecutive runs of a row: a warp's loads and stores of Y, its bias and
residual are whole lines), finishes them (`store`'s epilogue) into registers and stores
them with one vector store where the renderer proves the run contiguous and aligned in Y
(through a layout tail too: the simplifier splits a run's lane off an aligned base). The
tile takes the memory the operands' ring held (`codegen.shared_pool_bytes`).

A knob the tuner searches. The defaults stage the unsplit products of a 16-bit Y, wgmma or
mma.sync (`mma.staged_by_default`: their direct stores write 4 bytes a lane, 16 a row of a
warp's store; on an H200, fp16 in and out, wgmma's 8192 x 768 x 3072 went from 0.60 of cuBLAS
to 0.77 and 4096^3 from 0.76 to 0.82, vit b32's k = 192 products on the 128 x 128 tile from
0.35 to 0.87), and leave the rest direct: with every default product staged
where it fit (bench/gpu_env_ab.py, interleaved, before products stored 16 bits went through
wgmma's tiles) whole models took the same time, fp16 bert_hf b8, vit_tiny, convnext_tiny,
resnet18 b32 B/A 0.996 to 1.019 (geomean 1.003), tf32 0.994 to 1.003.

Never changes what is computed: the same accumulators reach the same `store`, in another
order of threads.

`cluster_results` is the same epilogue for a `cluster_split` product (mma.CLUSTER_SPLITS): the
split_k blocks of a tile (one cluster) each stage their slice's sums, pass a cluster barrier,
and block `sk` finishes rows sk * block_m / split_k onwards of the tile, each result the sum
of the staged tiles of blocks 0, 1, ... (`cluster_load`: the order the two-launch split adds
its partials in); a second cluster barrier keeps every tile in place until all are read.
"""

from __future__ import annotations

from ...ir import loop as L
from ...ir import types as T
from .mma import TensorCoreConfig, _over_threads

STAGED_RUN = 4
"""Consecutive results of a row a thread finishes and stores at once: 16 bytes of float32, 8
of a 16-bit Y."""
STAGING_PAD = 8
"""Floats past each row of the staged tile (rows 8 banks apart: a warp's float2 stores of its
fragments, 4 rows of 4 lanes a half-warp, hit distinct banks)."""


def staging_bytes(c: TensorCoreConfig) -> int:
    """Bytes of config `c`'s staged tile of results (4-byte accumulators)."""
    return c.block_m * (c.block_n + STAGING_PAD) * 4


def staged_results(w, store) -> L.Stmt:
    """The statements of `w`'s staged epilogue (the module's docstring), `w` a
    `mma._WarpTiles` or `wgmma.Warpgroups` whose k loop has ended."""
    tile = _staging_tile(w)
    return L.Allocate(tile, L.seq(_kept(w, tile), L.Barrier(), _finished(
        w, store, w.bm, L.const(0), lambda at: tile[at], L.ForKind.VECTORIZED)))


def cluster_results(w, store, sk: L.Expr) -> L.Stmt:
    """The statements of `w`'s epilogue as block `sk` of a cluster of `split_k` blocks, one
    a k slice of the tile (the module's docstring), `w` a `wgmma.Warpgroups` whose k loop
    has ended."""
    split = w.c.split_k
    tile = _staging_tile(w, "slice_sums")
    rows = w.bm // split

    def summed(at):
        value = L.call("cluster_load", tile[at], L.const(0), dtype=T.float32)
        for s in range(1, split):
            value = value + L.call("cluster_load", tile[at], L.const(s), dtype=T.float32)
        return value
    return L.Allocate(tile, L.seq(
        _kept(w, tile), L.ClusterBarrier(split),
        _finished(w, store, rows, sk * rows, summed, L.ForKind.UNROLLED),
        L.ClusterBarrier(split)))


def _staging_tile(w, name: str = "y_tile") -> L.Buffer:
    return L.Buffer(name, w.acc.dtype, (w.bm * (w.bn + STAGING_PAD),), L.Scope.SHARED)


def _kept(w, tile: L.Buffer) -> L.Stmt:
    """Each thread's accumulators into the staged `tile`."""
    stride = w.bn + STAGING_PAD
    return w.each_result(lambda i, j, value: L.Store(tile, (i * stride + j,), value),
                         within_tile=True)


def _finished(w, store, rows: int, first: L.Expr, value, kind: L.ForKind) -> L.Stmt:
    """Rows first .. first + rows - 1 of the staged tile finished through `store` in runs of
    STAGED_RUN, a run's results `value(offset into tile)` (read as one vector: `kind`)."""
    run, stride = STAGED_RUN, w.bn + STAGING_PAD
    results = L.Buffer("y_run", w.acc.dtype, (run,), L.Scope.LOCAL)
    v = L.Var("v")

    def finish(step, e):
        r, col = first + e // (w.bn // run), e % (w.bn // run) * run
        i, j = w.row0 + r, w.col0 + col
        done = store(w.bi, i, j + v, results[v])
        out = L.Buffer("y_out", done.buffer.dtype, (run,), L.Scope.LOCAL)
        if w.n % run == 0:   # a run is inside Y or past its edge whole
            body = L.seq(L.For(v, run, L.Store(out, (v,), done.value), L.ForKind.UNROLLED),
                         L.For(v, run, L.Store(done.buffer, done.indices, out[v]),
                               L.ForKind.VECTORIZED))
            inside = L.logical_and(i < w.m, j < w.n)
        else:
            body = L.For(v, run, L.If(j + v < w.n, done), L.ForKind.UNROLLED)
            inside = i < w.m
        if w.m % w.bm == 0 and w.n % w.bn == 0:
            inside = None
        body = L.seq(L.For(v, run, L.Store(results, (v,), value(r * stride + col + v)), kind),
                     body if inside is None else L.If(inside, body))
        return L.Allocate(results, L.Allocate(out, body))

    return _over_threads(w.c.threads, rows * w.bn // run, finish)
