"""The staged epilogue of the tensor-core products (`mma.py`'s `staged` knob): a block's
results go through shared memory before the problem's store finishes them.

Each thread's accumulators go into a block_m x block_n tile of their type (float32, int32;
rows STAGING_PAD apart: a warp's pairs of a fragment land in distinct banks); after a
barrier each thread takes runs of STAGED_RUN consecutive results of a row (consecutive
threads the consecutive runs of a row: a warp's loads and stores of Y, its bias and
residual are whole lines), finishes them (`store`'s epilogue) into registers, the operands
it reads along the run (a residual, per-channel sums and scales) first copied into registers
a vector load each (`threads.vector_loads`: resnet50's int8 residual a char4, not 4 byte
loads), and stores them with one vector store where the renderer proves the run contiguous
and aligned in Y
(through a layout tail too: the simplifier splits a run's lane off an aligned base). Where
the k loop is one tile, an 8-bit operand that differs from step to step (an int8 residual)
is loaded ahead of the k loop instead, a 32-bit word a step (`_ahead`, `L.load_word`). The
tile takes the memory the operands' ring held (`codegen.shared_pool_bytes`).

A knob the tuner searches. The defaults stage the unsplit products of a 16-bit Y, wgmma or
mma.sync (`mma.staged_by_default`: their direct stores write 4 bytes a lane, 16 a row of a
warp's store; on an H200, fp16 in and out, wgmma's 8192 x 768 x 3072 went from 0.60 of cuBLAS
to 0.77 and 4096^3 from 0.76 to 0.82, vit b32's k = 192 products on the 128 x 128 tile from
0.35 to 0.87), and leave the rest direct: with every default product staged
where it fit (bench/gpu_env_ab.py, interleaved, before products stored 16 bits went through
wgmma's tiles) whole models took the same time, fp16 bert_hf b8, vit_tiny, convnext_tiny,
resnet18 b32 B/A 0.996 to 1.019 (geomean 1.003), tf32 0.994 to 1.003.

A block whose Y runs along its rows, not its columns (sparse24.py's 2:4 product: Y^T = W X^T,
`transposed_results`), stages its tile transposed, a column of the block a row of the tile
(rows TRANSPOSED_PAD floats past block_m: a warp's scalar stores, 8 rows by 4 column pairs,
hit distinct banks), and each thread stores runs of a column.

Never changes what is computed: the same accumulators reach the same `store`, in another
order of threads.

`cluster_results` is the same epilogue for a `cluster_split` product (mma.CLUSTER_SPLITS): the
split_k blocks of a tile (one cluster) each stage their slice's sums, pass a cluster barrier,
and block `sk` finishes rows sk * block_m / split_k onwards of the tile, each result the sum
of the staged tiles of blocks 0, 1, ... (`cluster_load`: the order the two-launch split adds
its partials in); a second cluster barrier keeps every tile in place until all are read.
"""

from __future__ import annotations

import numpy as np

from ...ir import loop as L
from ...ir import types as T
from ..loop_analysis import flat_offsets
from .mma import TensorCoreConfig, _over_threads
from .threads import Names, vector_loads

STAGED_RUN = 4
"""Consecutive results of a row a thread finishes and stores at once: 16 bytes of float32, 8
of a 16-bit Y."""
STAGING_PAD = 8
"""Floats past each row of the staged tile (rows 8 banks apart: a warp's float2 stores of its
fragments, 4 rows of 4 lanes a half-warp, hit distinct banks)."""
TRANSPOSED_PAD = 4
"""Floats past each row of a transposed staged tile (a block's rows a multiple of 16: the
column pairs' rows 8 banks apart, a warp's 8 rows at one column pair in 8 consecutive banks)."""


def staging_bytes(c: TensorCoreConfig, transposed: bool = False) -> int:
    """Bytes of config `c`'s staged tile of results (4-byte accumulators), `transposed` as a
    block whose Y runs along its rows stages them."""
    if transposed:
        return c.block_n * (c.block_m + TRANSPOSED_PAD) * 4
    return c.block_m * (c.block_n + STAGING_PAD) * 4


def staged_block(w, k_loop: L.Stmt, store) -> L.Stmt:
    """`w.block` of `k_loop` (the accumulators zeroed and summed) then `w`'s staged epilogue
    (the module's docstring), `w` a `mma._WarpTiles` or `wgmma.Warpgroups` (its
    `transposed_results`, where it has one, says Y runs along its rows); where the k loop
    is one tile, the epilogue's 8-bit operands that differ from step to step (an int8
    residual) loaded ahead of it (`_ahead`). On an H200 (bench/gpu_int8_ab.sh, session 55)
    that took resnet50 b32's int8 residual convs of one k tile (56 x 56 and 28 x 28) 2-9%
    less time in the model; those of two (14 x 14, k = 256: their registers 118-122 ->
    128) took 3-7% more, so they load theirs after the k loop as before."""
    tile = _staging_tile(w)
    rows = _geometry(w)[0]
    ahead, finished, registers = _finished(w, store, rows, L.const(0), lambda at: tile[at],
                                           L.ForKind.VECTORIZED, prefetch=w.per == 1)
    body = w.block(L.seq(*ahead, k_loop), L.Allocate(tile, L.seq(
        _kept(w, tile), L.Barrier(), finished)))
    for reg in registers:
        body = L.Allocate(reg, body)
    return body


def cluster_results(w, store, sk: L.Expr) -> L.Stmt:
    """The statements of `w`'s epilogue as block `sk` of a cluster of `split_k` blocks, one
    a k slice of the tile (the module's docstring), `w` a `wgmma.Warpgroups` whose k loop
    has ended (Y along its columns)."""
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
        _finished(w, store, rows, sk * rows, summed, L.ForKind.UNROLLED)[1],
        L.ClusterBarrier(split)))


def _transposed(w) -> bool:
    return getattr(w, "transposed_results", False)


def _geometry(w) -> tuple[int, int, int]:
    """(rows, width, stride) of `w`'s staged tile: the block's rows (Y's runs along its
    columns), or its columns where transposed."""
    if _transposed(w):
        return w.bn, w.bm, w.bm + TRANSPOSED_PAD
    return w.bm, w.bn, w.bn + STAGING_PAD


def _staging_tile(w, name: str = "y_tile") -> L.Buffer:
    rows, _, stride = _geometry(w)
    return L.Buffer(name, w.acc.dtype, (rows * stride,), L.Scope.SHARED)


def _kept(w, tile: L.Buffer) -> L.Stmt:
    """Each thread's accumulators into the staged `tile`."""
    transposed, stride = _transposed(w), _geometry(w)[2]
    return w.each_result(lambda i, j, value: L.Store(
        tile, ((j * stride + i) if transposed else (i * stride + j),), value), within_tile=True)


def _finished(w, store, rows: int, first: L.Expr, value, kind: L.ForKind,
              prefetch: bool = False) -> tuple[list, L.Stmt, list]:
    """Rows first .. first + rows - 1 of the staged tile finished through `store` in runs of
    STAGED_RUN, a run's results `value(offset into tile)` (read as one vector: `kind`): ([the
    statement loading operands ahead of the k loop, with `prefetch` where `_ahead` takes
    some], the finishing, [the registers it loads them into])."""
    transposed = _transposed(w)
    _, width, stride = _geometry(w)
    run = STAGED_RUN
    results = L.Buffer("y_run", w.acc.dtype, (run,), L.Scope.LOCAL)
    v = L.Var("v")
    steps = -(-rows * width // run // w.c.threads)
    early, words = [], []

    def finish(step, e):
        r, col = first + e // (width // run), e % (width // run) * run
        if transposed:   # a run of rows of column r
            i, j = w.row0 + col, w.col0 + r
            done = store(w.bi, i + v, j, results[v])
            whole, inside_run = w.m % run == 0, i + v < w.m
        else:
            i, j = w.row0 + r, w.col0 + col
            done = store(w.bi, i, j + v, results[v])
            whole, inside_run = w.n % run == 0, j + v < w.n
        out = L.Buffer("y_out", done.buffer.dtype, (run,), L.Scope.LOCAL)
        if whole:   # a run is inside Y or past its edge whole
            if transposed:
                copies, registers, finished = [], [], L.Store(out, (v,), done.value)
            else:   # its operands in Y's order (a residual, per-channel sums) a vector each
                copies, registers, finished = vector_loads(
                    L.Store(out, (v,), done.value), v, run, L.free_vars(done.value), v,
                    L.const(0, v.dtype), run, Names(done))
                if prefetch:
                    loads, copies, registers, finished, words[:] = _ahead(
                        copies, registers, finished, step, steps)
                    early.extend(loads)
            body = L.seq(*copies, L.For(v, run, finished, L.ForKind.UNROLLED),
                         L.For(v, run, L.Store(done.buffer, done.indices, out[v]),
                               L.ForKind.VECTORIZED))
            for reg in registers:
                body = L.Allocate(reg, body)
            inside = L.logical_and(i < w.m, j < w.n)
        else:
            body = L.For(v, run, L.If(inside_run, done), L.ForKind.UNROLLED)
            inside = (j < w.n) if transposed else (i < w.m)
        if w.m % w.bm == 0 and w.n % w.bn == 0:
            inside = None
        body = L.seq(L.For(v, run, L.Store(results, (v,), value(r * stride + col + v)), kind),
                     body if inside is None else L.If(inside, body))
        loads = L.seq(*early)
        return loads if inside is None else L.If(inside, loads), \
            L.Allocate(results, L.Allocate(out, body))

    loads, finishing = _over_threads(w.c.threads, rows * width // run, finish)
    return [loads] if early else [], finishing, words


AHEAD_WORDS = 16
"""The most 32-bit words of operands a thread loads ahead of the k loop (`_ahead`): a 128 x
128 tile's int8 residual on 256 threads, 16 steps of a word."""


def _ahead(copies: list, registers: list, finished: L.Stmt, step: L.Var, steps: int
           ) -> tuple:
    """(the loads to issue ahead of the k loop, the copies left, their registers, `finished`
    reading both, the registers loaded ahead): of `vector_loads`' copies into `registers`
    (a step's run of an operand each), those of an 8-bit operand (a run of STAGED_RUN bytes:
    one word) whose place differs from step to step (an int8 residual; not a per-channel
    parameter, the same at every step, which NVCC loads once), where they fit AHEAD_WORDS
    together, each made one `load_word` a step into a word register of its own, `finished`
    taking its bytes from there: a block's epilogue then does not wait for them after its
    k loop. (Loaded into registers as they were, NVCC issued them before the k loop but
    ptxas moved each read-only load back down to its first use, after the k loop's
    barriers; `load_word`'s stays.)"""
    points = np.arange(steps)
    varying = [(copy, reg) for copy, reg in zip(copies, registers)
               if reg.dtype.itemsize * STAGED_RUN == 4 and not np.all(
                   flat_offsets(copy.body.value, step, points) ==
                   flat_offsets(copy.body.value, step, points[:1]))]
    if not varying or steps * len(varying) > AHEAD_WORDS:
        return [], copies, registers, finished, []
    words = {reg.name: L.Buffer(reg.name, T.uint32, (steps,), L.Scope.LOCAL)
             for _, reg in varying}

    def byte(x):
        if isinstance(x, L.Load) and x.buffer.name in words:
            shift = L.Cast(T.uint32, x.indices[0]) * L.const(8, T.uint32)
            return L.Cast(x.dtype, L.BinOp(">>", words[x.buffer.name][step], shift))
        return None

    loads = [L.Store(words[reg.name], (step,), L.call("load_word", L.substitute(
        copy.body.value, {copy.var: L.const(0, copy.var.dtype)}), dtype=T.uint32))
        for copy, reg in varying]
    kept = [(copy, reg) for copy, reg in zip(copies, registers) if reg.name not in words]
    return loads, [c for c, _ in kept], [r for _, r in kept], \
        L.transform(finished, byte), list(words.values())
