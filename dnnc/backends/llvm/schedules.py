"""Schedules for the LLVM backend: which loops run in parallel, which are vectorised.

A kernel's template is chosen from a table keyed by (target, anchor pattern) (`TEMPLATES`:
the templates tried in order, the first whose problem describes the kernel and that applies
wins) and builds the scheduled PrimFunc from the kernel's problem (`backends/problems.py`) and
a config of its knob space (`backends/space.py`); `schedule_kernel` is the entry point.

The default template (`ROWS`, knobs `Config`) serves every kernel without a tiled one (dense,
conv, pool: `dense.py`, `conv.py`, `pool.py`): consecutive stages that walk the same rows
(softmax's max, sum and normalisation; layernorm's mean, variance and scaling) become one
loop, so a row is finished
while it is in L1 and the worker pool starts once; each stage's outermost loops are fused
into one parallel loop when the stage does enough work to pay for waking the pool; a float
reduction along a row keeps one partial result per vector lane (LLVM does not reassociate
float adds on its own, so a scalar accumulator would stay scalar), and a long float sum is
blocked (`_blocked`: each lane sums `REDUCE_BLOCK` elements into a fresh partial result, added
to the running total when the block ends, blocks of blocks above that), so its rounding error
grows with the logarithm of the row, not with the row; a reduction over an outer axis (a sum
over axis 0) takes `COLUMNS` columns at a time with a partial result each and reads the rows
along (`_columns`); the inner loops are left to LLVM's loop vectoriser. Calls to exp and erf on float32 become polynomials (`FAST_MATH`)
that vectorise, where libm's would run lane by lane.

A parallel loop never carries state between its iterations (`carried`): every element it
writes belongs to one iteration. A big reduction with too few outputs to share out (a sum of
a whole tensor) is split into a fixed number of chunks (`_chunk_reduction`), each reducing
into its own partial result in parallel, combined afterwards in chunk order: the result does
not depend on how the chunks were scheduled, nor on the thread count.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.registry import Pattern
from .. import problems
from ..loop_analysis import (carried, fuse_row_loops, fuse_until, nest_work, rename_buffer,
                             rows_first, update_op)
from ..space import Constraint, Space, Template, choose_template
from .amx_conv import AMX_CONV
from .amx_dense import AMX_DENSE, AMX_POINTWISE
from .amx_int8 import AMX_CONV_INT8, AMX_DENSE_INT8, AMX_POINTWISE_INT8
from .amx_int8_conv import AMX_CONV_T_INT8
from .conv import CONV2D, POINTWISE, POINTWISE_GEMM
from .dense import DENSE
from .depthwise import DEPTHWISE
from .depthwise_int8 import DEPTHWISE_INT8
from .int8 import CONV_INT8, DENSE_INT8, DYNAMIC_QUANTIZE, MAXPOOL_INT8
from .pool import POOL2D
from .row_terms import reuse_terms
from .sparse import SPARSE
from .vectorize import vectorizable
from .winograd import WINOGRAD

# a parallel region costs a few microseconds to start; below this many inner iterations
# a stage stays serial
MIN_PARALLEL_WORK = 1 << 15
# chunks of a split reduction: fixed (not the thread count) so that its rounding is the same
# on every machine; 64 keeps up to 64 cores busy and costs 64 combining steps
REDUCE_CHUNKS = 64
# elements per lane in a block of a float sum (`_blocked`): 128 costs nothing measurable
# (ReduceSum [4096, 4096], LayerNorm [8, 32768]: within noise, docs/llvm_backend.md); 16-64
# fully unroll a 1024-wide row into straight-line code, 1.5x slower on [64, 1024, 1024]
REDUCE_BLOCK = 128
# columns a reduction over an outer axis takes at a time (`_columns`): 1 KiB of each row read
# in sequence. Sum/max/var over axis 0 of [4096, 1024] and mean over axis 1 of [64, 512, 256]
# (2 threads, AVX-512): 4 vectors (64 columns) 1.45/4.8/2.5/7.0 ms, 16 vectors 0.67/1.9/1.6/1.1
# ms: a block of 64 columns walks every 4 KiB page of the input for 256 bytes of it
COLUMNS = 256


@dataclass(frozen=True)
class Config:
    """Knobs of the default template."""

    parallel: bool = True
    min_parallel_work: int = MIN_PARALLEL_WORK
    # partial results per float reduction (one vector of float32; 1: a scalar accumulator)
    reduce_lanes: int = 8
    # up to this many accumulators of reduce_lanes each (a row shorter than twice their
    # partial results takes fewer): independent chains hide the latency of each update
    reduce_vectors: int = 1
    # elements a lane sums into a fresh partial result before adding it to the running total
    # (`_blocked`): rounding error grows with the block, not the row
    reduce_block: int = REDUCE_BLOCK
    fuse_rows: bool = True
    # a row's costly terms stored by its sum and read back, divisions by a row's statistic
    # made products (`row_terms`)
    reuse_terms: bool = True


def default_schedule(func: L.PrimFunc, config: Config = Config(), threads: int = 1
                     ) -> L.PrimFunc:
    body = func.body
    body = L.transform(body, _flat_rows)
    if config.parallel:
        body = _chunk_reductions(body, config)
    if config.reduce_lanes > 1:
        body = L.transform(body, lambda n: _columns(n, config.reduce_lanes, config.reduce_block))
        body = L.transform(body, lambda n: _split_reduction(
            n, config.reduce_lanes, config.reduce_block, config.reduce_vectors))
        body = L.transform(body, lambda n: _block_outer_sum(n, config.reduce_block))
    body = _schedule_stmt(body, config, threads)
    if config.reuse_terms:
        body = reuse_terms(body)
    return L.PrimFunc(func.name, func.params, body, func.size_vars, func.attrs)


def _schedule_stmt(s: L.Stmt, config: Config, threads: int) -> L.Stmt:
    if isinstance(s, L.Seq):
        stmts = [_fuse_outer(x, threads) if isinstance(x, L.For) else x for x in s.stmts]
        if config.fuse_rows:
            stmts = _fuse_rows(stmts)
        return L.seq(*(_schedule_stmt(x, config, threads) for x in stmts))
    if isinstance(s, L.Allocate):
        return L.Allocate(s.buffer, _schedule_stmt(s.body, config, threads))
    if isinstance(s, L.For):
        return _schedule_nest(s, config, threads)
    return s










_IDENTITY = {"+": 0.0, "max": float("-inf"), "min": float("inf")}


FLAT_ROW_WIDTH = 32
"""Rows this wide or wider are flattened by `_flat_rows` only where nothing is summed over the
plane: a GlobalAveragePool of 144x56x56 flat took 0.175 ms against 0.050 as rows (1 thread,
znver4)."""


def _flat_rows(n):
    """Two loops over the trailing axes of every tensor they index

        for i in A: for j in B: body(x[..., i, j], acc[0], s[..., c])

    (a plane of an NCHW tensor: an elementwise op, a broadcast, a global pool or a mean over
    H and W) become one loop over A x B, `x[..., k // B, k % B]`: a 7- or 14-wide row is a
    partial vector where 196 pixels are 12 whole ones (the default schedule vectorises the
    inner loop; `_split_reduction` splits a sum over it). 1 thread, znver5, 672x14x14:
    GlobalAveragePool 30 -> 4.2 us, a broadcast Mul 33 -> 12 us, a SiLU 470 -> 36 us. Wide
    rows too where nothing is carried (FLAT_ROW_WIDTH): LLVM unrolled a row of 32-63 (fewer
    than its 64-iteration vector body) and vectorised the loop over rows with gathers and
    scatters (1 thread, znver4, a broadcast Mul of 256x40x40 0.386 -> 0.043 ms, 64x48x48
    0.128 -> 0.021; in place in efficientnet_b0, 144x56x56 0.38 -> 0.019; a SiLU of
    144x56x56 0.263 -> 0.189). Only where every
    index using i or j is the pair (i, j), last, of a buffer B wide: (i, j) = (k // B,
    k % B) walks the same pairs in the same order, so a sum is the same sum."""
    if not isinstance(n, L.For) or not isinstance(n.body, L.For) or \
            not isinstance(n.extent, L.Const) or not isinstance(n.body.extent, L.Const) or \
            n.kind is not L.ForKind.SERIAL or n.body.kind is not L.ForKind.SERIAL or \
            n.extent.value < 2 or \
            any(isinstance(x, L.For) for x in L.walk(n.body.body)):
        return None
    inner = n.body
    i, j, b = n.var, inner.var, inner.extent.value
    pair = (i, j)
    for x in L.walk(inner.body):
        if isinstance(x, (L.Load, L.Store)) and any(v in L.free_vars(e) for e in x.indices
                                                    for v in pair):
            shape = L.static_shape(x.buffer.shape)
            if tuple(x.indices[-2:]) != pair or shape is None or shape[-1] != b or \
                    any(v in L.free_vars(e) for e in x.indices[:-2] for v in pair):
                return None
    k = L.Var(f"{i.name}_{j.name}")
    body = L.substitute(inner.body, {i: k // b, j: k % b})
    if any(v in L.free_vars(body) for v in pair):
        return None
    flat = L.For(k, n.extent.value * b, body)
    if b >= FLAT_ROW_WIDTH and carried(flat):
        return None
    if flat.extent.value <= FLAT_VECTOR_MAX and vectorizable(body) and not carried(flat):
        return L.For(k, flat.extent, body, L.ForKind.VECTORIZED)
    return flat


FLAT_VECTOR_MAX = 64
"""A flattened plane of at most this many pixels (and no sum over it) becomes one VECTORIZED
loop, straight-line vector code, rather than a loop left to LLVM's vectoriser, whose vector
body (16 lanes x 4 interleaved on AVX-512) runs only 64 or more iterations: a 7x7 plane's 49
ran a lane at a time. 1 thread, znver5, efficientnet_b0's squeeze-excitation Mul at
[1, 1152, 7, 7]: 27.2 us, NumPy 10.0."""


def _split_reduction(n, lanes: int, block_size: int, vectors: int = 1):
    """`for r in R: acc[0] = acc[0] (op) f(r)` over float32 becomes `lanes` partial results,
    `for ro in R // lanes: for l in lanes: part[l] = part[l] (op) f(ro * lanes + l)`, folded
    into acc after the loop (and a scalar tail): the inner loop vectorises. Sums round
    differently (as a pairwise sum does); max and min are exact. `vectors` times as many
    partial results where R is at least twice that many (else half as many, ...)."""
    if isinstance(n, L.For) and isinstance(n.extent, L.Const):
        while vectors > 1 and n.extent.value < 2 * lanes * vectors:
            vectors //= 2
        lanes *= vectors
    if not isinstance(n, L.For) or not isinstance(n.extent, L.Const) or \
            n.extent.value < 2 * lanes or not isinstance(n.body, L.Store):
        return None
    store = n.body
    acc = store.buffer
    value = store.value
    if acc.scope is not L.Scope.LOCAL or acc.dtype is not T.float32 or \
            store.indices != (L.const(0),) or not isinstance(value, L.BinOp) or \
            value.op not in _IDENTITY or value.a != L.Load(acc, (L.const(0),)):
        return None
    source = value.b
    if any(isinstance(x, (L.Load, L.Store)) and x.buffer.name == acc.name
           for x in L.walk(source)):
        return None
    extent = n.extent.value
    main = extent // lanes * lanes
    part = L.Buffer(f"{acc.name}_lanes", T.float32, (L.const(lanes),), L.Scope.LOCAL)
    ro, lane, k = L.Var(f"{n.var.name}_o"), L.Var(f"{n.var.name}_l"), L.Var(f"{n.var.name}_k")
    identity = L.const(_IDENTITY[value.op], T.float32)
    init = L.For(lane, lanes, L.Store(part, (lane,), identity))
    # a source of plain arithmetic over the innermost axis is vectorised by our codegen
    # (LLVM's vectoriser turns the max of a row into gathers); one calling exp is left to
    # LLVM, which vectorises the expansion's integer steps where ours would run them a lane at
    # a time, and so is a reduction over an outer axis (strided: LLVM chooses)
    plain = not any(isinstance(x, (L.Call, L.Cast)) or (isinstance(x, L.Load) and any(
        n.var in L.free_vars(i) for i in x.indices[:-1])) for x in L.walk(source))
    kind = L.ForKind.VECTORIZED if plain else L.ForKind.SERIAL

    def update(into: L.Buffer, start: L.Expr | None, count: int) -> L.Stmt:
        step = ro if start is None else start + ro
        return L.For(ro, count, L.For(lane, lanes, L.Store(into, (lane,), L.BinOp(
            value.op, into[lane], L.substitute(source, {n.var: step * lanes + lane}))), kind))

    # max and min are exact in any order: only sums are blocked
    block = block_size if value.op == "+" else main // lanes
    stmts = [init, _blocked(update, part, main // lanes, block, None, itertools.count()),
             *_fold_halves(part, lanes, value.op, k),
             L.Store(acc, (L.const(0),), L.BinOp(value.op, L.Load(acc, (L.const(0),)),
                                                 part[L.const(0)]))]
    if main < extent:
        stmts.append(L.For(n.var, extent - main, L.Store(acc, (L.const(0),), L.BinOp(
            value.op, L.Load(acc, (L.const(0),)),
            L.substitute(source, {n.var: n.var + main})))))
    return L.Allocate(part, L.seq(*stmts))


def _fold_halves(part: L.Buffer, lanes: int, op: str, k: L.Var) -> list[L.Stmt]:
    """`part[0] = part[0] (op) part[1] (op) ...` as a tree, each step combining the upper
    half into the lower, a vector at a time: a lane-by-lane fold of 16 maxima (each an
    llvm.maximum: a compare, blends and a NaN test) was a serial chain of ~150 instructions
    a row, 30% of softmax over [4, 4, 256, 256] (mobilevit_xxs). Exact for max and min; a
    sum pairs its partial results (no worse a bound than the lane-by-lane fold's)."""
    steps = []
    while lanes > 1:   # the upper `half` into the lower; an odd middle lane waits a step
        half = lanes // 2
        steps.append(L.For(k, half, L.Store(part, (k,), L.BinOp(
            op, part[k], part[k + (lanes - half)])),
            L.ForKind.VECTORIZED if half > 1 else L.ForKind.SERIAL))
        lanes -= half
    return steps


def _columns(n, lanes: int, block_size: int):
    """A reduction over an outer axis, one output per element of a contiguous inner axis

        for i in N: acc[0] = identity; for r in R: acc[0] = acc[0] (op) f(r, i); out[i] = g(acc)

    (a sum or variance over axis 0, a mean over the middle axis), where f reads the input
    down a column (r in an outer index, i in the last), becomes `width` columns at a time,
    each with a partial result of its own, the rows read along:

        for io in N // width: part[:] = identity
                              for r in R: for l in width: part[l] = part[l] (op) f(r, io*width + l)
                              for l in width: out[io*width + l] = g(part[l])

    and the remaining columns as before. Every element's reduction keeps its order (r
    ascending; sums blocked by `_blocked` as along a row); only the loop order changes.
    `width` is up to `COLUMNS` (whole vectors); the io loop is what runs in parallel."""
    if not isinstance(n, L.For) or not isinstance(n.extent, L.Const) or \
            not isinstance(n.body, L.Allocate):
        return None
    acc, inner = n.body.buffer, n.body.body
    if acc.scope is not L.Scope.LOCAL or acc.dtype is not T.float32 or \
            tuple(acc.shape) != (L.const(1),) or not isinstance(inner, L.Seq) or \
            len(inner.stmts) < 3:
        return None
    init, loop, *rest = inner.stmts
    if not (isinstance(init, L.Store) and init.buffer.name == acc.name and
            isinstance(init.value, L.Const) and isinstance(loop, L.For) and
            isinstance(loop.extent, L.Const) and isinstance(loop.body, L.Store)):
        return None
    store, value = loop.body, loop.body.value
    if store.buffer.name != acc.name or not isinstance(value, L.BinOp) or \
            value.op not in _IDENTITY or value.a != L.Load(acc, (L.const(0),)):
        return None
    source, i, r = value.b, n.var, loop.var
    if any(isinstance(x, (L.Load, L.Store)) and x.buffer.name == acc.name
           for x in L.walk(source)) or \
            any(isinstance(x, L.For) for s in rest for x in L.walk(s)) or \
            not all(isinstance(s, (L.Store, L.Let)) for s in rest):
        return None
    # worth it only where some read walks a column: r outside the last index, i inside it
    if not any(isinstance(x, L.Load) and x.indices and i in L.free_vars(x.indices[-1]) and
               any(r in L.free_vars(e) for e in x.indices[:-1]) for x in L.walk(source)):
        return None
    if carried(n):
        return None
    extent = n.extent.value
    width = lanes * min(max(1, COLUMNS // lanes), extent // lanes)
    if width < lanes:
        return None
    io, lane, rv = L.Var(f"{i.name}_c"), L.Var(f"{i.name}_l"), L.Var(f"{r.name}_v")
    part = L.Buffer(f"{acc.name}_cols", T.float32, (L.const(width),), L.Scope.LOCAL)
    column = io * width + lane
    f = L.substitute(source, {i: column})

    def plain(x) -> bool:
        return not any(isinstance(e, (L.Call, L.Cast)) for e in L.walk(x))

    kind = L.ForKind.VECTORIZED if plain(f) else L.ForKind.SERIAL

    def update(into: L.Buffer, start: L.Expr | None, count: int) -> L.Stmt:
        step = rv if start is None else start + rv
        return L.For(rv, count, L.For(lane, width, L.Store(into, (lane,), L.BinOp(
            value.op, into[lane], L.substitute(f, {r: step}))), kind))

    block = block_size if value.op == "+" else loop.extent.value
    finish = [rename_acc(L.substitute(s, {i: column}), acc, part, lane) for s in rest]
    body = L.Allocate(part, L.seq(
        L.For(lane, width, L.Store(part, (lane,), init.value), L.ForKind.VECTORIZED),
        _blocked(update, part, loop.extent.value, block, None, itertools.count()),
        L.For(lane, width, L.seq(*finish),
              L.ForKind.VECTORIZED if all(plain(s) for s in finish) else L.ForKind.SERIAL)))
    main = extent // width * width
    stmts = [L.For(io, extent // width, body)]
    if main < extent:
        stmts.append(L.For(i, extent - main, L.substitute(n.body, {i: i + main})))
    return L.seq(*stmts)


def rename_acc(s: L.Stmt, acc: L.Buffer, part: L.Buffer, lane: L.Var) -> L.Stmt:
    """`s` reading `part[lane]` where it read `acc[0]`."""
    def rule(x):
        if isinstance(x, L.Load) and x.buffer.name == acc.name:
            return L.Load(part, (lane,))
        return None

    return L.transform(s, rule)


def _blocked(update, into: L.Buffer, count: int, block: int, start: L.Expr | None,
             names) -> L.Stmt:
    """`update(into, start, count)` (add elements start .. start + count - 1, lane by lane,
    into `into`) in blocks: above `block` elements a lane, each block of `size` (the largest
    power of `block` below `count`) sums into a fresh partial result, added to `into` when
    the block ends; blocks are blocked again. An element's sum then passes through at most
    `block` roundings per level and log_block(count) levels, instead of `count` roundings:
    the bound of a blocked sum (Higham, Accuracy and Stability of Numerical Algorithms, 4.2;
    NumPy's pairwise sum and Eigen's reductions do the same)."""
    if count <= block:
        return update(into, start, count)
    size = block
    while size * block < count:
        size *= block
    blocks, rest = divmod(count, size)
    k = next(names)
    b, lane = L.Var(f"{into.name}_bi{k}"), L.Var(f"{into.name}_bl{k}")
    partial = L.Buffer(f"{into.name}_b{k}", into.dtype, into.shape, L.Scope.LOCAL)
    lanes = into.shape[0].value
    here = b * size if start is None else start + b * size

    def each_lane(store, kind=L.ForKind.SERIAL):
        return store(L.const(0)) if lanes == 1 else L.For(lane, lanes, store(lane), kind)

    inner = L.Allocate(partial, L.seq(
        each_lane(lambda i: L.Store(partial, (i,), L.const(0.0, into.dtype))),
        _blocked(update, partial, size, block, here, names),
        each_lane(lambda i: L.Store(into, (i,), into[i] + partial[i]), L.ForKind.VECTORIZED)))
    stmts = [L.For(b, blocks, inner)]
    if rest:
        after = blocks * size
        tail = L.const(after) if start is None else start + after
        stmts.append(_blocked(update, into, rest, block, tail, names))
    return L.seq(*stmts)


def _block_outer_sum(n, block: int):
    """An outer loop of a float32 sum over several axes, `for r in R: <body adding into
    acc[0] only>` (as `for r2: <the split row sum over r3>`), blocked by `_blocked` on its
    iterations so that each block's partial result takes about `block` additions: otherwise
    acc[0] takes every row's partial results in sequence."""
    if not isinstance(n, L.For) or not isinstance(n.extent, L.Const) or \
            isinstance(n.body, L.Store):
        return None
    private = {x.buffer.name for x in L.walk(n.body) if isinstance(x, L.Allocate)}
    written = {x.buffer.name: x.buffer for x in L.walk(n.body)
               if isinstance(x, L.Store) and x.buffer.name not in private}
    if len(written) != 1:
        return None
    (acc,) = written.values()
    adds = _updates(n.body, acc)
    if acc.scope is not L.Scope.LOCAL or acc.dtype is not T.float32 or \
            tuple(acc.shape) != (L.const(1),) or \
            update_op(n.body, acc) != "+" or not adds or n.extent.value * adds <= block:
        return None
    r = L.Var(f"{n.var.name}_i")
    into = L.Buffer(f"{acc.name}_{n.var.name}", acc.dtype, (L.const(1),), L.Scope.LOCAL)

    def update(part: L.Buffer, start: L.Expr | None, count: int) -> L.Stmt:
        step = r if start is None else start + r
        return L.For(r, count, rename_buffer(L.substitute(n.body, {n.var: step}), acc, part))

    # iterations a block: the fewest blocks of at most `block` additions, all of one size
    # where the extent allows (a tail is one more copy of the body)
    blocks = -(-n.extent.value * adds // block)
    per_block = max(2, -(-n.extent.value // blocks))
    return L.Allocate(into, L.seq(
        L.Store(into, (L.const(0),), L.const(0.0, T.float32)),
        _blocked(update, into, n.extent.value, per_block, None, itertools.count()),
        L.Store(acc, (L.const(0),), acc[L.const(0)] + into[L.const(0)])))


def _updates(s: L.Stmt, acc: L.Buffer) -> int | None:
    """Stores into `acc` one run of `s` makes (None when a loop's extent is symbolic)."""
    if isinstance(s, L.Store):
        return int(s.buffer.name == acc.name)
    if isinstance(s, L.For):
        inner = _updates(s.body, acc)
        if inner is None or not isinstance(s.extent, L.Const):
            return None
        return s.extent.value * inner
    if isinstance(s, L.Seq):
        parts = [_updates(x, acc) for x in s.stmts]
        return None if None in parts else sum(parts)
    if isinstance(s, (L.Allocate, L.Let)):
        return _updates(s.body, acc)
    return None




def _fuse_rows(stmts: list[L.Stmt]) -> list[L.Stmt]:
    """Stages over the same rows as one loop (`fuse_row_loops`), their outer loops flattened
    to the rows first where that lets more of them fuse (softmax over [8, 12, 128, 128]: its
    batch loop alone is enough to share out, so the three stages stayed three passes over
    6 MB, 2.3 ms against 1.2 ms for jax.jit; rows_first + fusion does each row in cache).
    Where flattening fuses nothing more, the stages keep their nests."""
    fused = fuse_row_loops(stmts)
    if len(fused) == 1:   # nothing left to fuse (most kernels: one stage)
        return fused
    flat = fuse_row_loops(rows_first(stmts))
    return flat if len(flat) < len(fused) else fused


def _schedule_nest(loop: L.For, config: Config, threads: int) -> L.For:
    work = nest_work(loop)
    if config.parallel and threads > 1 and (work is None or work >= config.min_parallel_work):
        loop = _fuse_outer(loop, threads)
        if not carried(loop):
            return L.For(loop.var, loop.extent, loop.body, L.ForKind.PARALLEL)
    return loop








def _chunk_reductions(s: L.Stmt, config: Config) -> L.Stmt:
    """Every big reduction outside any loop (a stage with one output element) computed in
    `REDUCE_CHUNKS` chunks by `_chunk_reduction`; loops of one iteration are looked through."""
    if isinstance(s, L.Allocate):
        return L.Allocate(s.buffer, _chunk_reductions(s.body, config))
    if isinstance(s, L.For) and isinstance(s.extent, L.Const) and s.extent.value == 1:
        return _chunk_reductions(L.substitute(s.body, {s.var: L.const(0)}), config)
    if not isinstance(s, L.Seq):
        return s
    out: list[L.Stmt] = []
    for x in s.stmts:
        prev = out[-1] if out else None
        split = _chunk_reduction(prev, x, config) if isinstance(prev, L.Store) and \
            isinstance(x, L.For) else None
        if split is not None:
            out[-1] = split
        else:
            out.append(_chunk_reductions(x, config))
    return L.seq(*out)




def _chunk_reduction(init: L.Store, loop: L.For, config: Config) -> L.Stmt | None:
    """`acc[0] = identity; for r in R: acc[0] = acc[0] (op) f(r)` (the loop nest's outer
    loops fused to at least `REDUCE_CHUNKS` iterations) becomes

        for c in C: part = identity; for t in R // C: part = part (op) f(c * (R // C) + t);
                    partial[c] = part          (no state shared: may run in parallel)
        for k in C: acc[0] = acc[0] (op) partial[k]
        for t in R % C: acc[0] = acc[0] (op) f(C * (R // C) + t)

    The order of combination is fixed by the shape alone. None unless `loop` is big enough
    and updates nothing outside but `acc`, and `acc` only so."""
    acc = init.buffer
    work = nest_work(loop)
    if acc.scope is not L.Scope.LOCAL or init.indices != (L.const(0),) or \
            not isinstance(init.value, L.Const) or work is None or \
            work < config.min_parallel_work:
        return None
    loop = fuse_until(loop, REDUCE_CHUNKS)
    op = update_op(loop.body, acc)
    if op is None or carried(loop) != {acc.name}:
        return None
    extent = loop.extent.value
    chunks = min(REDUCE_CHUNKS, extent)
    size = extent // chunks
    name = loop.var.name
    c, t, k = L.Var(f"{name}_c"), L.Var(f"{name}_t"), L.Var(f"{name}_k")
    partial = L.Buffer(f"{acc.name}_chunks", acc.dtype, (L.const(chunks),), L.Scope.LOCAL)
    part = L.Buffer(f"{acc.name}_chunk", acc.dtype, (L.const(1),), L.Scope.LOCAL)
    body = rename_buffer(loop.body, acc, part)
    chunk = L.For(c, chunks, L.Allocate(part, L.seq(
        L.Store(part, (L.const(0),), init.value),
        L.For(t, size, L.substitute(body, {loop.var: c * size + t})),
        L.Store(partial, (c,), part[L.const(0)]))))
    combine = L.For(k, chunks, L.Store(acc, (L.const(0),),
                                       L.BinOp(op, acc[L.const(0)], partial[k])))
    stmts = [init, L.Allocate(partial, L.seq(chunk, combine))]
    if extent > chunks * size:
        stmts.append(L.For(t, extent - chunks * size,
                           L.substitute(loop.body, {loop.var: t + chunks * size})))
    return L.seq(*stmts)






def _fuse_outer(loop: L.For, threads: int) -> L.For:
    """Fuse perfectly nested outer loops until there are enough iterations to share out
    (an N=1 batch loop alone would leave every core but one idle)."""
    return fuse_until(loop, 4 * threads)




# -- vectorisable float32 math ------------------------------------------------------------------


def _f32(value: float) -> L.Expr:
    return L.const(value, T.float32)


def _horner(x: L.Expr, coefficients) -> L.Expr:
    """c0 + x * (c1 + x * (c2 + ...)), coefficients lowest first, each step a fused
    multiply-add (llvm.fmuladd: one FMA instruction where the CPU has them, the plain product
    and sum elsewhere): half the instructions of a product then a sum, and the constants
    stay operands instead of filling AVX2's 16 registers (softmax's exp loop spilled 9)."""
    out = _f32(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = L.call("fma", out, x, _f32(c))
    return out


def _erf_f32(x: L.Expr, let) -> L.Expr:
    """erf as Eigen's and XLA's float32 rational approximation: odd degree-13 over even
    degree-8 polynomial on x clamped to [-4, 4] (where erf is +-1 in float32); max abs error
    4.2e-7 against math.erf over [-6, 6]. Only +, *, /, min, max: it vectorises."""
    x = let(L.minimum(L.maximum(x, _f32(-4.0)), _f32(4.0)))
    x2 = let(x * x)
    p = x * _horner(x2, (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
                         -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
                         -2.72614225801306e-10))
    q = _horner(x2, (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
                     -2.13374055278905e-04, -1.45660718464996e-05))
    return p / q


_EXP_HI, _EXP_LO = 88.72283935546875, -87.33654022216797   # exp overflows / leaves normals


def _exp_f32(x: L.Expr, let) -> L.Expr:
    """exp as Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-5 polynomial for e^r,
    2^n built in the exponent bits; within 3 ulp (the worst just below overflow, where n
    stops at 127 and r grows to 0.7). Overflow gives inf, below the normal range 0, NaN
    stays NaN (n is taken as 0 then so the bit trick never sees it)."""
    x = let(x)
    # n clamped by selects (cheaper than NaN-propagating min/max; outside [LO, HI] the
    # result is replaced below, so r may be anything there)
    n = let(L.call("floor", x * 1.44269504088896341 + 0.5))
    n = let(L.Select(n < -126.0, _f32(-126.0), L.Select(n > 127.0, _f32(127.0), n)))
    n = let(L.Select(L.eq(n, n), n, _f32(0.0)))
    r = let(x - n * 0.693359375 + n * 2.12194440e-4)
    poly = _horner(r, (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
                       1.3981999507e-3, 1.9875691500e-4))
    y = L.call("fma", poly, r * r, r) + 1.0
    # n + 127 is in [1, 254]: legalize's in-range conversion, no range guard
    bits = L.BinOp("<<", L.Call("ftoi", (n + 127.0,), T.int32), L.const(23, T.int32))
    out = y * L.call("bitcast", bits, dtype=T.float32)
    out = L.Select(x > _EXP_HI, _f32(float("inf")), out)
    return L.Select(x < _EXP_LO, _f32(0.0), out)


def _tanh_f32(x: L.Expr, let) -> L.Expr:
    """tanh as Cephes' tanhf: x + x^3 P(x^2) (degree-4 P) for |x| < 0.625, where the
    exp form below would cancel, else 1 - 2 / (e^(2|x|) + 1) with its sign (exp as above:
    +-1 once e^(2|x|) overflows); within a few ulp over [-10, 10], -0.0 and NaN kept.
    GPT-2's tanh GELU ran its epilogue's tanh through libm a lane at a time (7.8 ms of a
    64x768x3072 product that runs in 1.2 ms without it)."""
    x = let(x)
    z = let(x * x)
    # x (1 + z P(z)), not x + x z P(z): the product keeps tanh(-0.0) = -0.0
    small = x * (z * _horner(z, (-3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2,
                                 2.06390887954e-2, -5.70498872745e-3)) + 1.0)
    ax = let(L.call("abs", x))
    big = let(_f32(1.0) - _f32(2.0) / (_exp_f32(ax + ax, let) + 1.0))
    signed = L.Select(x < 0.0, L.call("neg", big), big)
    return L.Select(ax < 0.625, small, signed)


def _sigmoid_f32(x: L.Expr, let) -> L.Expr:
    """sigmoid as legalize writes it, 1 / (1 + e^-x), with exp as above (0 and 1 where e^-x
    overflows or underflows, NaN kept). Legalize runs after this, so a sigmoid left to it
    called libm's expf a lane at a time: SiLU at [1, 96, 112, 112] took 2.35 ms against
    onnxruntime's 0.45 ms, and efficientnet_b0 ran at 3x onnxruntime's time."""
    return _f32(1.0) / (_exp_f32(L.call("neg", x), let) + 1.0)


FAST_MATH = {"erf": _erf_f32, "exp": _exp_f32, "tanh": _tanh_f32, "sigmoid": _sigmoid_f32}
"""float32 intrinsic -> fn(x, let) giving its vectorisable expansion (`let(e)` names a value
used more than once). libm's erff and expf run a lane at a time: bert's GELU epilogue spent
most of its time in erff."""

QUARTER_POWERS = 16
"""pow(x, c) for a constant c = q / 4, q not a multiple of 4 and |q| <= this, is expanded
(`_pow_quarters_f32`)."""


def _quarters(exponent: L.Expr) -> int | None:
    """q where `exponent` is the constant q / 4 that `_pow_quarters_f32` expands, else None."""
    if not isinstance(exponent, L.Const) or isinstance(exponent.value, bool):
        return None
    q = float(exponent.value) * 4
    if q != int(q) or int(q) % 4 == 0 or abs(q) > QUARTER_POWERS:
        return None
    return int(q)


def _pow_quarters_f32(x: L.Expr, q: int, let) -> L.Expr:
    """x ** (q / 4) as square roots and products: |x| ** (1/4, 1/2 or 3/4) from sqrt and
    sqrt of sqrt (correctly rounded, so within a few ulp), times x ** floor(|q| / 4), then
    1 / that for q < 0. LRN divides by base ** 0.75 (AlexNet's, GoogLeNet's beta): as
    llvm.pow it called libm's powf a lane at a time, 3.2 ms of inception_v1's 24.8 at 1
    thread. C99's special values hold: a negative x gives NaN (sqrt), +-0 gives +0 for q > 0
    and +inf for q < 0 (the zero's sign dropped before the root), -inf gives +inf or +0
    (sqrt(-inf) is NaN, so it is selected), +inf and NaN pass through."""
    x = let(x)
    zeroed = let(L.Select(L.eq(x, _f32(0.0)), _f32(0.0), x))   # -0.0 -> +0.0
    root = let(L.call("sqrt", zeroed))
    whole, quarters = divmod(abs(q), 4)
    out = {1: lambda: L.call("sqrt", root), 2: lambda: root,
           3: lambda: root * L.call("sqrt", root)}[quarters]()
    for _ in range(whole):
        out = out * zeroed
    if q < 0:
        out = _f32(1.0) / out
    return L.Select(L.eq(x, _f32(float("-inf"))), _f32(float("inf") if q > 0 else 0.0), out)


def fast_math(func: L.PrimFunc) -> L.PrimFunc:
    """`func` with every float32 call in FAST_MATH expanded, and pow to a constant number of
    quarters (`_pow_quarters_f32`), in stores and lets (the parts bound by `let` become Let
    statements around the statement using them)."""
    names = itertools.count()

    def expand(e: L.Expr, binds: list) -> L.Expr:
        def let(value: L.Expr) -> L.Expr:
            if isinstance(value, (L.Var, L.Const)):
                return value
            var = L.Var(f"fm{next(names)}", value.dtype)
            binds.append((var, value))
            return var

        def rule(n):
            if isinstance(n, L.Call) and n.dtype is T.float32 and n.name in FAST_MATH:
                return FAST_MATH[n.name](n.args[0], let)
            if isinstance(n, L.Call) and n.dtype is T.float32 and n.name == "pow" and \
                    (q := _quarters(n.args[1])) is not None:
                return _pow_quarters_f32(n.args[0], q, let)
            return None

        return L.transform(e, rule)

    def wrap(binds, stmt):
        for var, value in reversed(binds):
            stmt = L.Let(var, value, stmt)
        return stmt

    def rule(n):
        if isinstance(n, L.Store):
            binds: list = []
            value = expand(n.value, binds)
            return wrap(binds, L.Store(n.buffer, n.indices, value)) if binds else None
        if isinstance(n, L.Let):
            binds = []
            value = expand(n.value, binds)
            return wrap(binds, L.Let(n.var, value, n.body)) if binds else None
        return None

    return L.PrimFunc(func.name, func.params, L.transform(func.body, rule), func.size_vars,
                      func.attrs)


# -- the default template and the template table -----------------------------------------------


def rows_space(p: problems.Rows, machine) -> Space:
    lanes = max(1, machine.vector_bits // 32)
    return Space("rows", Config, {
        "parallel": (False, True),
        "min_parallel_work": (1 << 12, MIN_PARALLEL_WORK, 1 << 18),
        "reduce_lanes": sorted({1, 2, 4, 8, 16, lanes}),
        "reduce_vectors": (1, 2, 4),
        "reduce_block": (32, REDUCE_BLOCK, 512),
        "fuse_rows": (False, True),
        "reuse_terms": (False, True),
    }, [Constraint(f"min_parallel_work == {MIN_PARALLEL_WORK} when not parallel (it has no "
                   f"effect then)",
                   lambda c: c.parallel or c.min_parallel_work == MIN_PARALLEL_WORK),
        Constraint(f"reduce_block == {REDUCE_BLOCK} when reduce_lanes is 1 (no sum is split "
                   f"or blocked then)",
                   lambda c: c.reduce_lanes > 1 or c.reduce_block == REDUCE_BLOCK),
        Constraint("reduce_vectors == 1 when reduce_lanes is 1 (no reduction is split then)",
                   lambda c: c.reduce_lanes > 1 or c.reduce_vectors == 1)])


def rows_default(p: problems.Rows, machine) -> Config:
    # vectors of float32 partial results per reduction: 4 chains of maxima or sums in flight
    # (softmax [4, 4, 256, 256], 1 thread, znver5: 1 vector 0.82 ms, 4 vectors 0.68 ms)
    return Config(reduce_lanes=max(1, machine.vector_bits // 32), reduce_vectors=4)


def rows_build(p: problems.Rows, config: Config, machine) -> L.PrimFunc:
    return default_schedule(p.func, config, machine.threads)


ROWS = Template("rows", problems.rows, lambda p: True, rows_space, rows_default, rows_build)


TEMPLATES = {
    **{("llvm", pattern): (ROWS,) for pattern in Pattern},
    ("llvm", Pattern.OUT_FUSABLE): (AMX_DENSE, AMX_POINTWISE, AMX_CONV, DENSE,
                                    AMX_DENSE_INT8, DENSE_INT8, AMX_POINTWISE_INT8,
                                    AMX_CONV_T_INT8, AMX_CONV_INT8, CONV_INT8, DEPTHWISE_INT8,
                                    POINTWISE_GEMM, POINTWISE, CONV2D, DEPTHWISE, WINOGRAD,
                                    SPARSE, ROWS),
    ("llvm", Pattern.OPAQUE): (POOL2D, MAXPOOL_INT8, DYNAMIC_QUANTIZE, ROWS),
}
"""(target name, anchor pattern) -> the templates tried in order: the first that serves the
target's precision on its CPU features, whose problem kind describes the kernel and that
applies to that problem builds it (the AMX ones first: bf16 products, and int8 products at
any precision, where the CPU has the tiles, vpdpbusd's `int8` templates otherwise; ROWS,
last, serves every kernel)."""


def template_for(kernel, target: str = "llvm", machine=None) -> tuple[Template, object]:
    """The template that schedules `kernel` on `target` (`machine`: the Target compiled
    for), and the kernel's problem as that template reads it."""
    return choose_template(kernel, TEMPLATES, target, machine)


def schedule_kernel(kernel, machine, config=None) -> L.PrimFunc:
    """The scheduled PrimFunc of a lowered kernel: its template (`template_for`) built with
    `config` (checked against the template's space: ConfigError outside it) or, by default,
    the template's default config for the problem and the machine (the `Target`: its
    `vector_bits` and `threads`)."""
    template, problem = template_for(kernel, machine=machine)
    if config is None:
        config = template.default(problem, machine)
    else:
        config = template.space(problem, machine).check(config)
    kernel.schedule = (template.name, config)
    return fast_math(template.build(problem, config, machine))
