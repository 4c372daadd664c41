"""The cuda attention template: FusedAttention in one kernel, FlashAttention's online softmax
(Dao et al. 2022) in fp32 SIMT.

A block takes `rows` query rows of one (batch, head): blockIdx.x is the batch (its dims
folded), blockIdx.y the row tile. Its `threads` threads form groups of G = threads *
thread_rows / rows consecutive lanes, one group `thread_rows` rows (G a power of two up to
a warp, so a group's lanes are one warp's and combine by `shfl_xor` butterflies; several
rows a thread reuse each K and V element read from shared memory: register blocking). The
rows of Q go to shared memory once; then the keys and values stream through shared memory
`tile_k` at a time:

1. the block copies K's and V's tile (consecutive threads along the operand's contiguous
   dimension; 0 past the last key) into shared memory;
2. a thread scores tile_k / G of the tile's keys (key g + G u for lane g of its group)
   against each of its rows: the dot product over d from shared memory (Q's and K's rows
   padded by one word, so that the 32 lanes of a warp read 32 banks), times `scale`, `fill`
   where `drop` says (torch's masked_fill), plus the mask; keys past the last are -inf;
3. the group's running max m moves to max(m, the tile's max) through the butterfly; with
   m_ref = m, or 0 while m is -inf (FlashAttention's safe max: a row whose first keys are
   all masked by -inf loses nothing, and one whose keys all are gives 0/0 = NaN, as Softmax
   does), the thread rescales its sum l and its accumulators by exp(m_old - m_ref) and adds
   p = exp(s - m_ref) of its keys to l; the probabilities go to shared memory;
4. a thread accumulates its ceil(dv / G) output columns (column g + G w) over the tile:
   acc += p_j V[j, column], p_j read by the whole group at once (a broadcast), V's row by
   consecutive lanes.

At the end the group sums its lanes' l, and each thread stores acc / l through the fused
epilogue and layout tail (`problems.Attention.store`): bert's heads merge back into
[batch, seq, hidden] straight from the registers. Everything is fp32 (float16 or bfloat16
Q, K, V and mask widened as they are read), m and l per row; the
scores never leave the block. Three barriers a tile (after the copy, after the
probabilities, before the next copy).

With `split` > 1 (the default's where its blocks are fewer than the SMs: `split_for`),
blockIdx.x runs over (batch, key slice): a block streams only its slice's key tiles and,
instead of acc / l, keeps its rows' max m and sum l and its unnormalised accumulators in a
global workspace; a second launch, a thread per output, rescales each slice's accumulator
and sum by exp(m_slice - max over the slices) (FlashDecoding's combination; 0 in place of a
max of -inf, so a row of -inf scores still gives 0/0) and stores their quotient through the
epilogue and tail.

Not yet: vector loads of the tiles, double-buffered tiles, tensor cores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Constraint, Space, Template
from .device import gpu_of

WARP = 32
MAX_SHARED_BYTES = 48 << 10   # a block's static shared memory
# scores and accumulators a thread keeps at most: ptxas -v (sm_90) of bert_base's attention
# spilled 120 to 256 bytes at 96 (2 or 4 rows a thread of 2 or 4 lanes), none at 24 to 48
MAX_REGISTERS = 64
MAX_HEAD = 128                # head sizes the template takes (d and dv)
MAX_GRID_Y = 65535
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)   # (fewer than 8: a decode step's query rows)
THREADS = (32, 64, 128, 256, 512)
TILE_K = (16, 32, 64, 128)
THREAD_ROWS = (1, 2, 4)
SPLITS = (1, 2, 4, 8)
NEG_INF = float("-inf")


@dataclass(frozen=True)
class AttentionConfig:
    rows: int = 32        # query rows a block
    threads: int = 128    # threads a block: threads * thread_rows / rows lanes a row group
    tile_k: int = 32      # keys (and values) a tile through shared memory
    thread_rows: int = 1  # query rows a thread (each K and V element read from shared
    #                       memory serves that many rows: register blocking)
    unroll: bool = True   # the loops over d and over a tile's keys fully unrolled (else as
    #                       nvcc unrolls them: fewer registers, at a head of 128 no spills)
    split: int = 1        # slices of the keys, a block each, combined by a second launch

    @property
    def group(self) -> int:
        """Lanes of a row group (the threads sharing `thread_rows` rows)."""
        return self.threads * self.thread_rows // self.rows


def shared_floats(c: AttentionConfig, d: int, dv: int) -> int:
    """Shared memory words of a config: Q's rows and K's tile padded by one word a row, V's
    tile, the probabilities (padded)."""
    return c.rows * (d + 1) + c.tile_k * (d + 1) + c.tile_k * dv + c.rows * (c.tile_k + 1)


def _lanes_ok(c: AttentionConfig) -> bool:
    g = c.group
    return c.rows % c.thread_rows == 0 and (c.threads * c.thread_rows) % c.rows == 0 and \
        1 <= g <= WARP and g & (g - 1) == 0


def space(p: problems.Attention, machine) -> Space:
    return Space("cuda_attention", AttentionConfig, {
        "rows": ROWS, "threads": THREADS, "tile_k": TILE_K, "thread_rows": THREAD_ROWS,
        "unroll": (True, False), "split": SPLITS,
    }, [Constraint("threads * thread_rows / rows (a row group's lanes) is a power of two "
                   "from 1 to 32, thread_rows divides rows", _lanes_ok),
        Constraint("tile_k a multiple of a row group's lanes",
                   lambda c: _lanes_ok(c) and c.tile_k % c.group == 0),
        Constraint("Q's rows, K's and V's tiles and the probabilities within 48 KiB",
                   lambda c: 4 * shared_floats(c, p.d, p.dv) <= MAX_SHARED_BYTES),
        Constraint(f"at most {MAX_REGISTERS} scores and accumulators a thread",
                   lambda c: _lanes_ok(c) and c.thread_rows * (
                       c.tile_k // c.group + -(-p.dv // c.group)) <= MAX_REGISTERS),
        Constraint("the row tiles fit grid y",
                   lambda c: -(-p.sq // c.rows) <= MAX_GRID_Y),
        Constraint("split at most the key tiles",
                   lambda c: c.split <= -(-p.sk // c.tile_k))])


# (rows, threads, tile_k, thread_rows) a default tries, in order, the first the space takes
# that gives a block per SM of the device (`GPU.sms`), else the one giving the most. First:
# 32 query rows a block, four a thread. On an H100 (bench/gpu_kernels.py --only attention, 19 configs timed beside
# dnnc's unfused three kernels) it was the one config faster than the unfused path at every
# shape: bert_base b1 15.6 us vs 20.3 (1.30x), b8 22.8 vs 34.7 (1.52x), vit b1 [3 heads of
# 197] 21.8 vs 26.8 (1.23x); the one-row-a-thread configs first tried were 0.55-0.81x.
DEFAULTS = ((32, 128, 32, 4), (16, 128, 32, 1), (32, 128, 32, 1), (16, 64, 32, 1),
            (8, 32, 32, 1), (8, 32, 16, 1))


# the largest head the default unrolls the loops over d and the keys for: ptxas -v (sm_90)
# of a head of 128 spilled 52 bytes unrolled (255 registers), none rolled (236)
UNROLL_HEAD = 64


# (rows, threads, tile_k, thread_rows) of the default where the queries are fewer than its
# rows (a decode step's one row against the cache), its keys unsplit: the fastest or within
# 10% of it of 19 configs at gpt2's and llama's decode shapes (12 and 8 heads of 64, 96
# keys, batch 1 and 8; H200, bench/gpu_kernels.py --attention-shapes decode: 9.3, 8.0, 7.7,
# 8.7 us against 11.1, 11.4, 10.3 for DEFAULTS[0] split in 2, which computed the one row 8
# times over, and 9.5 to 22.8 for 8 rows of 16 lanes, 16-key tiles split in 4)
DECODE = (8, 256, 32, 1)


def default(p: problems.Attention, machine) -> AttentionConfig:
    """DECODE where the queries are fewer than its rows and the space takes it; else the
    first DEFAULTS config in the space whose blocks fill the GPU (a block per SM), else the
    one giving the most blocks; unrolled up to heads of UNROLL_HEAD; its keys split
    (`split_for`) where its blocks are few."""
    s = space(p, machine)
    unroll = max(p.d, p.dv) <= UNROLL_HEAD
    sms = gpu_of(machine).sms
    decode = AttentionConfig(*DECODE, unroll=unroll)
    if p.sq < decode.rows and _valid(s, decode):
        return decode
    valid = [c for c in (AttentionConfig(*x, unroll=unroll) for x in DEFAULTS)
             if _valid(s, c)]
    if valid and valid[0] == AttentionConfig(*DEFAULTS[0], unroll=unroll):
        return split_for(p, valid[0], sms)   # measured fastest unsplit, few blocks or many
    for c in valid:
        if p.batch * -(-p.sq // c.rows) >= sms:
            return c
    best = max(valid, key=lambda c: (p.batch * -(-p.sq // c.rows), c.tile_k))
    return split_for(p, best, sms)


SPLIT_BLOCKS = 1.0
"""The fraction of the SMs below which a default's blocks have their keys split."""


def split_for(p: problems.Attention, c: AttentionConfig, sms: int) -> AttentionConfig:
    """`c` with its keys split in the fewest slices (of a key tile at least) that give
    SPLIT_BLOCKS x `sms` blocks, where its blocks are fewer: vit's 3 heads of 197 queries at
    batch 1 are 21 blocks of 32 rows, each streaming every key (H200, fp32: 22.0 us fused
    unsplit against 17.0 for the unfused three kernels; in 4 slices 11.6, in 8 of 16 keys
    9.9); bert_base's 12 heads of 128 at batch 1, 48 blocks, took 11.1 us in 2 slices and 9.2
    in 4 (at fp16 as at fp32)."""
    blocks, tiles = p.batch * -(-p.sq // c.rows), -(-p.sk // c.tile_k)
    split = 1
    while blocks * split < SPLIT_BLOCKS * sms and 2 * split <= tiles and \
            split < SPLITS[-1]:
        split *= 2
    return replace(c, split=split)


def _valid(s: Space, c: AttentionConfig) -> bool:
    return all(k.holds(c) for k in s.constraints)


def applies(p: problems.Attention) -> bool:
    return p.d <= MAX_HEAD and p.dv <= MAX_HEAD


def build(p: problems.Attention, c: AttentionConfig, machine) -> L.PrimFunc:
    """The kernel of `p`: a block a (batch, row tile), its steps as the module's docstring
    numbers them."""
    f = _FlashBlock(p, c)
    stream = L.For(f.kt, f.per, L.seq(
        f.load_k(), f.load_v(), L.Barrier(), f.scores(), f.update(), L.Barrier(), f.weigh(),
        L.Barrier()))
    body = L.seq(f.init(), f.load_q(), stream, f.done() if c.split == 1 else f.keep())
    for buffer in (f.qs, f.ks, f.vs, f.ps, f.s, f.acc, f.stat):
        body = L.Allocate(buffer, body)
    rows = -(-p.sq // c.rows)
    if c.split == 1:
        grid = L.For(f.bi, p.batch, L.For(f.qt, rows, body, L.ForKind.BLOCK_Y),
                     L.ForKind.BLOCK_X)
    else:   # blockIdx.x over (batch, key slice); then the slices combined
        bz = L.Var("bz")
        slices = L.For(bz, p.batch * c.split, L.For(f.qt, rows, L.Let(
            f.bi, bz // c.split, L.Let(f.slice, bz % c.split, body)), L.ForKind.BLOCK_Y),
            L.ForKind.BLOCK_X)
        grid = L.Allocate(f.parts, L.seq(slices, f.combine()))
    views: dict[str, L.Buffer] = {}
    for b in (f.q, f.k, f.v, p.mask, p.drop, p.y_view):
        if b is not None:
            views.setdefault(b.name, b)   # Q first, should Q also be K
    params = tuple(views.get(b.name, b) for b in p.params)
    return L.PrimFunc(p.name, params, grid)


def block_copy(t: L.Var, step: L.Var, e: L.Var, threads: int, n: int, body) -> L.Stmt:
    """body(e) for e < n over a block's `threads` threads (thread var `t`, step var `step`),
    consecutive threads at consecutive e: how the attention templates fill shared tiles."""
    steps = -(-n // threads)
    inner = body(e)
    if steps * threads > n:
        inner = L.If(e < n, inner)
    return L.For(t, threads, L.For(step, steps, L.Let(e, step * threads + t, inner),
                                   L.ForKind.UNROLLED), L.ForKind.THREAD_X)


def guarded(cond: L.Expr, value: L.Expr) -> L.Expr:
    """`value` widened to fp32 where `cond`, else 0 (a tile's element past an edge)."""
    return L.Select(cond, problems.widened(value), L.const(0.0, T.float32))


class _FlashBlock:
    """One block of the attention kernel: its operands, shared tiles and registers, its
    thread's place, and a method per step of the module's docstring, each a statement."""

    def __init__(self, p: problems.Attention, c: AttentionConfig):
        self.p, self.c = p, c
        self.g_size, rows, tk, self.nr = c.group, c.rows, c.tile_k, c.thread_rows
        d, dv, sq, sk = p.d, p.dv, p.sq, p.sk
        self.per_keys = tk // self.g_size         # scores a row of a thread
        self.per_cols = -(-dv // self.g_size)     # output columns a row of a thread
        self.dp, self.pp = d + 1, tk + 1          # padded rows of Q and K, of the probabilities
        f32 = T.float32
        # Q, K and V in their storage types, widened to fp32 on their way to shared memory
        self.q = L.Buffer(p.q.name, p.q.dtype, (p.batch, sq, d))
        self.k = L.Buffer(p.k.name, p.k.dtype, (p.batch, d, sk) if p.k_transposed else
                          (p.batch, sk, d))
        self.v = L.Buffer(p.v.name, p.v.dtype, (p.batch, sk, dv))
        self.qs = L.Buffer("q_rows", f32, (rows * self.dp,), L.Scope.SHARED)
        self.ks = L.Buffer("k_tile", f32, (tk * self.dp,), L.Scope.SHARED)
        self.vs = L.Buffer("v_tile", f32, (tk * dv,), L.Scope.SHARED)
        self.ps = L.Buffer("p_tile", f32, (rows * self.pp,), L.Scope.SHARED)
        self.s = L.Buffer("scores", f32, (self.nr * self.per_keys,), L.Scope.LOCAL)
        self.acc = L.Buffer("acc", f32, (self.nr * self.per_cols,), L.Scope.LOCAL)
        # per row of the thread: the running max, the thread's share of the row's sum, the
        # tile's max
        self.stat = L.Buffer("row_stat", f32, (3 * self.nr,), L.Scope.LOCAL)

        self.bi, self.qt, self.kt = L.Var("bi"), L.Var("qt"), L.Var("kt")
        self.slice = L.Var("ks")
        # key tiles a block streams: all, or its slice's (`split`); then a slice's partial
        # results: per row its max and sum, per output its unnormalised accumulator
        tiles = -(-sk // tk)
        self.per = -(-tiles // c.split)
        self.parts = L.Buffer("attention_parts", f32, (c.split * p.batch * sq * (dv + 2),),
                              L.Scope.GLOBAL)
        self.t, self.r, self.g = L.Var("t"), L.Var("r"), L.Var("g")
        self.u, self.w, self.h, self.dd, self.jj, self.step, self.e = (
            L.Var(n) for n in ("u", "w", "h", "dd", "jj", "ls", "e"))
        self.q0 = self.qt * rows
        self.j0 = (self.slice * self.per + self.kt) * tk if c.split > 1 else self.kt * tk
        self.row = self.r * self.nr + self.h      # the block's row of the thread's h-th
        self.i = self.q0 + self.row
        self.row_c = L.minimum(self.i, sq - 1)    # (a row past the last computes row sq - 1's)
        h = self.h
        self.m, self.l, self.top = (3 * h,), (3 * h + 1,), (3 * h + 2,)
        self.su = (h * self.per_keys + self.u,)
        self.aw = (h * self.per_cols + self.w,)
        self.key = self.g + self.u * self.g_size   # the tile's key of score u
        # over d, over the keys
        self.inner = L.ForKind.UNROLLED if c.unroll else L.ForKind.SERIAL
        self.zero, self.neg_inf = L.const(0.0, f32), L.const(NEG_INF, f32)

    # -- the pieces of a step

    def per_thread(self, body: L.Stmt) -> L.Stmt:
        """`body` on every thread, with its row group r and lane g in the group (where
        used)."""
        used = L.free_vars(body)
        if self.g in used:
            body = L.Let(self.g, self.t % self.g_size, body)
        if self.r in used:
            body = L.Let(self.r, self.t // self.g_size, body)
        return L.For(self.t, self.c.threads, body, L.ForKind.THREAD_X)

    def copy(self, n: int, body) -> L.Stmt:
        """body(e) for e < n, consecutive threads at consecutive e."""
        return block_copy(self.t, self.step, self.e, self.c.threads, n, body)


    @staticmethod
    def each(var: L.Var, n: int, body: L.Stmt) -> L.Stmt:
        return L.For(var, n, body, L.ForKind.UNROLLED)

    def rows_of(self, body: L.Stmt) -> L.Stmt:
        """`body` for each of the thread's rows h."""
        return self.each(self.h, self.nr, body)

    # -- the steps

    def init(self) -> L.Stmt:
        """The running maxima -inf, the sums and accumulators 0."""
        stat, each = self.stat, self.each
        return self.per_thread(L.seq(
            self.rows_of(L.seq(L.Store(stat, self.m, self.neg_inf),
                               L.Store(stat, self.l, self.zero))),
            each(self.w, self.nr * self.per_cols, L.Store(self.acc, (self.w,), self.zero))))

    def load_q(self) -> L.Stmt:
        """The block's rows of Q into shared memory (0 past the last)."""
        d, sq, q0 = self.p.d, self.p.sq, self.q0
        return self.copy(self.c.rows * d, lambda x: L.Store(
            self.qs, (x // d * self.dp + x % d,), guarded(
                q0 + x // d < sq, self.q[self.bi, L.minimum(q0 + x // d, sq - 1), x % d])))

    def _key_at(self, jt: L.Expr, dt: L.Expr) -> L.Expr:
        p, j0 = self.p, self.j0
        j = L.minimum(j0 + jt, p.sk - 1)
        return guarded(j0 + jt < p.sk, self.k[self.bi, dt, j] if p.k_transposed else
                            self.k[self.bi, j, dt])

    def load_k(self) -> L.Stmt:
        """Step 1: K's tile into shared memory along K's contiguous dimension."""
        d, tk, dp = self.p.d, self.c.tile_k, self.dp
        if self.p.k_transposed:   # K's contiguous dim is the keys'
            return self.copy(tk * d, lambda x: L.Store(self.ks, (x % tk * dp + x // tk,),
                                                       self._key_at(x % tk, x // tk)))
        return self.copy(tk * d, lambda x: L.Store(self.ks, (x // d * dp + x % d,),
                                                   self._key_at(x // d, x % d)))

    def load_v(self) -> L.Stmt:
        """Step 1: V's tile into shared memory."""
        dv, sk, j0 = self.p.dv, self.p.sk, self.j0
        return self.copy(self.c.tile_k * dv, lambda x: L.Store(self.vs, (x,), guarded(
            j0 + x // dv < sk, self.v[self.bi, L.minimum(j0 + x // dv, sk - 1), x % dv])))

    def scores(self) -> L.Stmt:
        """Step 2: the thread's scores of the tile, masked, and the group's tile max."""
        p, s, su, stat, top = self.p, self.s, self.su, self.stat, self.top
        each, rows_of, u, per_keys = self.each, self.rows_of, self.u, self.per_keys
        f32, neg_inf, j0, key = T.float32, self.neg_inf, self.j0, self.key
        dot = each(u, self.nr * per_keys, L.Store(s, (u,), self.zero))
        dot = L.seq(dot, L.For(self.dd, p.d, rows_of(each(u, per_keys, L.Store(s, su, L.call(
            "fma", self.qs[self.row * self.dp + self.dd], self.ks[key * self.dp + self.dd],
            s[su])))), self.inner))
        logit = s[su] * L.const(p.scale, f32)
        if p.drop is not None:
            logit = L.Select(p.mask_at(self.bi, self.row_c, L.minimum(j0 + key, p.sk - 1),
                                       p.drop), L.const(p.fill, f32), logit)
        if p.mask is not None:
            logit = logit + problems.widened(p.mask_at(self.bi, self.row_c,
                                                       L.minimum(j0 + key, p.sk - 1)))
        finish = rows_of(each(u, per_keys, L.Store(s, su, L.Select(j0 + key < p.sk, logit,
                                                                    neg_inf))))
        tile_max = rows_of(L.seq(L.Store(stat, top, neg_inf), each(u, per_keys, L.Store(
            stat, top, L.maximum(stat[top], s[su])))))
        return L.seq(self.per_thread(L.seq(dot, finish, tile_max)),
                     *[self.per_thread(rows_of(x))
                       for x in _butterfly(stat, top, "max", self.g_size)])

    def update(self) -> L.Stmt:
        """Step 3: the running max, the rescaled sum and accumulators, the probabilities
        into shared memory."""
        s, su, stat, m, l, each = self.s, self.su, self.stat, self.m, self.l, self.each
        acc, aw, neg_inf, zero = self.acc, self.aw, self.neg_inf, self.zero
        m_new, m_ref, corr = (L.Var(n, T.float32) for n in ("m_new", "m_ref", "corr"))
        prob = L.call("exp", s[su] - m_ref)
        return self.per_thread(self.rows_of(L.Let(m_new, L.maximum(stat[m], stat[self.top]),
                                                  L.Let(
            m_ref, L.Select(L.eq(m_new, neg_inf), zero, m_new), L.Let(
                corr, L.call("exp", stat[m] - m_ref), L.seq(
                    L.Store(stat, l, stat[l] * corr),
                    each(self.u, self.per_keys, L.seq(
                        L.Store(s, su, prob), L.Store(stat, l, stat[l] + s[su]),
                        L.Store(self.ps, (self.row * self.pp + self.key,), s[su]))),
                    each(self.w, self.per_cols, L.Store(acc, aw, acc[aw] * corr)),
                    L.Store(stat, m, m_new)))))))

    def weigh(self) -> L.Stmt:
        """Step 4: the thread's output columns accumulate the tile's probabilities times
        V's rows."""
        acc, aw, dv = self.acc, self.aw, self.p.dv
        # (columns past dv compute column dv - 1's)
        col = L.minimum(self.g + self.w * self.g_size, dv - 1)
        return self.per_thread(L.For(self.jj, self.c.tile_k, self.rows_of(self.each(
            self.w, self.per_cols, L.Store(acc, aw, L.call(
                "fma", self.ps[self.row * self.pp + self.jj], self.vs[self.jj * dv + col],
                acc[aw])))), self.inner))

    def done(self) -> L.Stmt:
        """The group's sums combined, then acc / l stored through the epilogue and tail."""
        return self._finished(lambda column: self.p.store(
            self.bi, self.i, column, self.acc[self.aw] / self.stat[self.l]))

    def keep(self) -> L.Stmt:
        """With `split`: the group's sums combined, then this slice's max and sum of each row
        (by its group's first lane) and its unnormalised accumulators into `parts`."""
        stat, i = self.stat, self.i
        first = L.logical_and(i < self.p.sq, L.eq(self.g, 0))
        stats = L.If(first, L.seq(
            L.Store(self.parts, self._part(self.slice, self.bi, i, 0), stat[self.m]),
            L.Store(self.parts, self._part(self.slice, self.bi, i, 1), stat[self.l])))
        return self._finished(lambda column: L.Store(
            self.parts, self._part(self.slice, self.bi, i, column + 2), self.acc[self.aw]),
            stats)

    def _finished(self, store, per_row: L.Stmt | None = None) -> L.Stmt:
        """The group's sums l combined, then for each of the thread's rows `per_row` and
        `store(column)` of each of its output columns inside Y."""
        i, dv = self.i, self.p.dv
        column = self.g + self.w * self.g_size
        inside = L.logical_and(i < self.p.sq, column < dv) \
            if self.per_cols * self.g_size > dv else i < self.p.sq
        columns = self.each(self.w, self.per_cols, L.If(inside, store(column)))
        return L.seq(*[self.per_thread(self.rows_of(x))
                       for x in _butterfly(self.stat, self.l, "+", self.g_size)],
                     self.per_thread(self.rows_of(
                         columns if per_row is None else L.seq(per_row, columns))))

    def _part(self, slice_, bi: L.Expr, i: L.Expr, slot) -> tuple:
        """Where key slice `slice_` keeps row i's `slot` in `parts`: its max at 0, its sum at
        1, output column c at 2 + c."""
        p = self.p
        return ((((slice_ * p.batch + bi) * p.sq + i) * (p.dv + 2)) + slot,)

    def combine(self) -> L.Stmt:
        """The second launch: a thread per output, the slices' accumulators and sums
        rescaled to the rows' overall max (0 where it is -inf: a row of -inf scores gives
        0/0, as unsplit) and divided, stored through the epilogue and tail."""
        p, split, f32 = self.p, self.c.split, T.float32
        total, threads = p.batch * p.sq * p.dv, 256
        ob, ot, e = L.Var("ob"), L.Var("ot"), L.Var("e")
        bi, i, col = e // (p.sq * p.dv), e // p.dv % p.sq, e % p.dv
        top, ref = L.Var("top", f32), L.Var("ref", f32)

        def part(s: int, slot: L.Expr) -> L.Expr:
            return self.parts[self._part(s, bi, i, slot)]

        top_value = part(0, 0)
        for s in range(1, split):
            top_value = L.maximum(top_value, part(s, 0))
        weights = [L.call("exp", part(s, 0) - ref) for s in range(split)]
        num = den = None
        for s in range(split):
            num = part(s, col + 2) * weights[s] if num is None else \
                L.call("fma", part(s, col + 2), weights[s], num)
            den = part(s, 1) * weights[s] if den is None else \
                L.call("fma", part(s, 1), weights[s], den)
        value = L.Let(top, top_value, L.Let(ref, L.Select(
            L.eq(top, self.neg_inf), self.zero, top), p.store(bi, i, col, num / den)))
        return L.For(ob, -(-total // threads), L.For(ot, threads, L.Let(
            e, ob * threads + ot, L.If(e < total, value)), L.ForKind.THREAD_X),
            L.ForKind.BLOCK_X)


def _butterfly(buffer: L.Buffer, slot: tuple, op: str, lanes: int) -> list[L.Stmt]:
    """`buffer[slot]` combined by `op` across a group of `lanes` consecutive lanes (every lane
    ends with the group's total): a statement a step, each its own thread loop (a warp's
    lanes in lockstep: a step reads its partner's value as the step began)."""
    out = []
    mask = lanes // 2
    while mask:
        shuffled = L.call("shfl_xor", buffer[slot], L.const(mask, T.int32))
        out.append(L.Store(buffer, slot, L.BinOp(op, buffer[slot], shuffled)))
        mask //= 2
    return out


ATTENTION = Template("cuda_attention", problems.attention, applies, space, default, build)
