"""The cuda attention template on tensor cores: FusedAttention in one kernel at a reduced
precision (tf32, fp16, bf16), FlashAttention-2's structure (Dao 2023) on `mma.sync`.

Q, K, V and the mask may be stored in float16 or bfloat16 (`store_half`): they are widened to
fp32 as they are read. A block takes 16 `warps` query rows of one (batch, head) (blockIdx.x:
the batch, its dims folded; blockIdx.y: the row tile); warp w owns rows 16 w .. 16 w + 15,
as one mma tile's rows. At fp16 and bf16 (`_Flash16`) each warp reads its rows of Q once,
straight into its mma A registers (rounded to the precision, 0 past the last row and past
d, which is padded to the mma's k step); at tf32 Q's rows go to shared memory once. Then K
and V stream through shared memory `tile_k` keys at a time:

1. the block copies K's and V's tile into shared memory (0 past the last key, past d, past
   dv padded to 8 columns): at fp16 / bf16 already rounded, two elements a 32-bit word, K
   a key a row and V transposed (a column of V a row), so that each operand register of an
   mma is one shared load; at tf32 as fp32;
2. each warp computes its 16 x tile_k scores S = Q Kᵀ on the tensor cores (an mma per 8 keys
   and k step of d; fragments as the PTX ISA's fragment layouts, `FRAGMENTS`, and
   `L.PACKS`), fp32 accumulators;
3. a lane holds two rows of each score tile (`mma._c`: rows g and g + 8): it scales, masks
   (`drop`'s fill, the additive mask, -inf past the last key), takes the rows' tile max
   across the 4 lanes sharing them (`shfl_xor` 1, 2), moves the running max m, rescales
   its sum l and its output accumulators by exp(m_old - m_ref) (m_ref = m, or 0 while m is
   -inf: the SIMT template's safe max, attention.py), and turns its scores into p = exp(s -
   m_ref): at fp16 / bf16 kept in the score accumulators, whose pairs are the A registers
   of the next step's mma (FlashAttention-2's reuse, `_Flash16.weigh`); at tf32 written to
   the warp's rows of a shared probability tile (tf32's A fragment pairs other columns);
4. the warp accumulates O += P V on the tensor cores, fp32 accumulators.

At the end the 4 lanes of a row add their sums, and O / l goes through the fused epilogue
and layout tail (`problems.Attention.store`). Memory is linear in the sequence: the scores
never leave the block. fp32 compiles never see this template (`Template.precisions`); the
SIMT template (attention.py) serves them and heads over MAX_HEAD.

Not yet: cp.async copies of K and V a tile ahead (the block waits on each tile's copy);
ldmatrix; causal tiles skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Constraint, Space, Template
from .attention import MAX_GRID_Y, MAX_SHARED_BYTES, NEG_INF, _butterfly, block_copy, guarded
from .device import gpu_of
from .mma import PRECISIONS, WARP, _c

MAX_HEAD = 128
MAX_ACCUMULATORS = 96
"""Score and output accumulators a lane at most (tile_k / 2 + dv / 2): beyond, spills."""


# -- PTX's fragment layouts (the operands are read from shared tiles a register at a time: an
# fp32 element at tf32, a pair at fp16 / bf16; the dense product's ldmatrix path (mma.py)
# reads four registers at a time) --------------------------------------------------------------

def _a_tf32(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return g + 8 * (e % 2), t + 4 * (e // 2)


def _b_tf32(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return t + 4 * e, g


def _a_16bit(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return g + 8 * (e // 2 % 2), 2 * t + (e % 2 + 8 * (e // 4))


def _b_16bit(e: int, g: L.Expr, t: L.Expr) -> tuple[L.Expr, L.Expr]:
    return 2 * t + (e % 2 + 8 * (e // 2)), g


FRAGMENTS = {"tf32": (_a_tf32, _b_tf32), "fp16": (_a_16bit, _b_16bit),
             "bf16": (_a_16bit, _b_16bit)}
"""Precision -> (A's element e of a lane -> (row, k), B's element e -> (k, column)) within
one mma tile, for the lane's g = lane // 4 and t = lane % 4 (PTX ISA, "Matrix Fragments for
mma.m16n8k8" (.tf32) and "mma.m16n8k16" (.f16 / .bf16)); `mma._c` is the accumulators'."""


@dataclass(frozen=True)
class MmaAttentionConfig:
    warps: int = 4       # warps a block, 16 query rows each
    tile_k: int = 64     # keys (and values) a tile through shared memory

    @property
    def rows(self) -> int:
        return 16 * self.warps

    @property
    def threads(self) -> int:
        return WARP * self.warps


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _shape(p: problems.Attention, precision: str) -> tuple[int, int]:
    """(d padded to the mma's k step, dv padded to 8 columns)."""
    return _round_up(p.d, L.MMA_SHAPES[precision][2]), _round_up(p.dv, 8)


def shared_floats(p: problems.Attention, c: MmaAttentionConfig, precision: str) -> int:
    """Q's rows, K's and V's tiles and the probabilities, each row padded by 4 words."""
    d, dv = _shape(p, precision)
    return c.rows * (d + 4) + c.tile_k * (d + 4) + c.tile_k * (dv + 4) + \
        c.rows * (c.tile_k + 4)


def shared_words(p: problems.Attention, c: MmaAttentionConfig, precision: str) -> int:
    """The 32-bit words of a block's shared tiles: at tf32 (`shared_floats`) Q's rows, K's
    and V's tiles and the probabilities; at fp16 and bf16 (`_Flash16`) K's tile and V's
    transposed, two elements a word, each row padded by 4 words."""
    if precision == "tf32":
        return shared_floats(p, c, precision)
    d, dv = _shape(p, precision)
    return c.tile_k * (d // 2 + 4) + dv * (c.tile_k // 2 + 4)


def space(p: problems.Attention, machine) -> Space:
    precision = machine.precision
    return Space("cuda_mma_attention", MmaAttentionConfig, {
        "warps": (1, 2, 4, 8), "tile_k": (16, 32, 64, 128)},
        [Constraint("the shared tiles within 48 KiB",
                    lambda c: 4 * shared_words(p, c, precision) <= MAX_SHARED_BYTES),
         Constraint(f"at most {MAX_ACCUMULATORS} accumulators a lane",
                    lambda c: c.tile_k // 2 + _shape(p, precision)[1] // 2 <=
                    MAX_ACCUMULATORS),
         Constraint("the row tiles fit grid y",
                    lambda c: -(-p.sq // c.rows) <= MAX_GRID_Y)])


DEFAULTS = ((4, 64), (4, 32), (2, 64), (2, 32), (1, 32), (1, 16))
"""(warps, tile_k) a default tries, in order: the first in the space whose blocks fill the
GPU (a block per SM), else the one giving the most blocks."""


def default(p: problems.Attention, machine) -> MmaAttentionConfig:
    s = space(p, machine)
    valid = [c for c in (MmaAttentionConfig(*x) for x in DEFAULTS)
             if all(k.holds(c) for k in s.constraints)]
    sms = gpu_of(machine).sms
    for c in valid:
        if p.batch * -(-p.sq // c.rows) >= sms:
            return c
    return max(valid, key=lambda c: (p.batch * -(-p.sq // c.rows), c.tile_k))


MIN_BLOCKS = 64
"""Blocks of 4 warps (64 query rows) an attention must have for this template: with fewer,
the SIMT template (attention.py) was faster (H200, bench/gpu_kernels.py --only attention
--precision fp16: bert_base b1 [1, 12, 128, 64] 28.3 us here against 14.4 unfused, vit b1
[1, 3, 197, 64] 46.7 against 15.4), with more this one (bert_base b8: 18.1 us against 29.4
unfused; 12 heads of 1024 tokens 102 against 145, of 4096 1218 against 1708)."""


def applies(p: problems.Attention) -> bool:
    return p.d <= MAX_HEAD and p.dv <= MAX_HEAD and p.batch * -(-p.sq // 64) >= MIN_BLOCKS


def build(p: problems.Attention, c: MmaAttentionConfig, machine) -> L.PrimFunc:
    """The kernel of `p` at the machine's precision, its steps as the module's docstring
    numbers them."""
    if machine.precision == "tf32":
        f = _MmaFlash(p, c, machine.precision)
        stream = L.For(f.kt, -(-p.sk // c.tile_k), L.seq(
            f.load_k(), f.load_v(), L.Barrier(), f.scores(), f.update(), L.Barrier(),
            f.weigh(), L.Barrier()))
        body = L.seq(f.init(), f.load_q(), L.Barrier(), stream, f.done())
    else:   # (no probability tile: each warp's P stays in its registers)
        f = _Flash16(p, c, machine.precision)
        stream = L.For(f.kt, -(-p.sk // c.tile_k), L.seq(
            f.load_k(), f.load_v(), L.Barrier(), f.scores(), f.update(), f.weigh(),
            L.Barrier()))
        body = L.seq(f.init(), f.load_q(), stream, f.done())
    for buffer in f.buffers():
        body = L.Allocate(buffer, body)
    grid = L.For(f.bi, p.batch, L.For(f.qt, -(-p.sq // c.rows), body, L.ForKind.BLOCK_Y),
                 L.ForKind.BLOCK_X)
    views: dict[str, L.Buffer] = {}
    for b in (f.q, f.k, f.v, p.mask, p.drop, p.y_view):
        if b is not None:
            views.setdefault(b.name, b)   # Q first, should Q also be K
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), grid)


class _MmaFlash:
    """One block of the kernel: operands, shared tiles, a lane's registers and place, and a
    statement per step of the module's docstring."""

    def __init__(self, p: problems.Attention, c: MmaAttentionConfig, precision: str):
        self.p, self.c, self.precision = p, c, precision
        self.mm, self.mn, self.mk = L.MMA_SHAPES[precision]
        self.d, self.dv = _shape(p, precision)
        tk, rows = c.tile_k, c.rows
        self.dp, self.vp, self.pp = self.d + 4, self.dv + 4, tk + 4   # padded row strides
        f32 = T.float32
        # Q, K and V in their storage types, widened to fp32 on their way to shared memory
        self.q = L.Buffer(p.q.name, p.q.dtype, (p.batch, p.sq, p.d))
        self.k = L.Buffer(p.k.name, p.k.dtype, (p.batch, p.d, p.sk) if p.k_transposed else
                          (p.batch, p.sk, p.d))
        self.v = L.Buffer(p.v.name, p.v.dtype, (p.batch, p.sk, p.dv))
        self.qs = L.Buffer("q_rows", f32, (rows * self.dp,), L.Scope.SHARED)
        self.ks = L.Buffer("k_tile", f32, (tk * self.dp,), L.Scope.SHARED)
        self.vs = L.Buffer("v_tile", f32, (tk * self.vp,), L.Scope.SHARED)
        self.ps = L.Buffer("p_tile", f32, (rows * self.pp,), L.Scope.SHARED)
        self.n_s, self.n_o = tk // 8, self.dv // 8      # score and output mma tiles a warp
        self.s = L.Buffer("scores", f32, (self.n_s * 4,), L.Scope.LOCAL)
        self.o = L.Buffer("acc", f32, (self.n_o * 4,), L.Scope.LOCAL)
        # per row half h (rows g and g + 8): the running max, the lane's share of the sum,
        # the tile's max
        self.stat = L.Buffer("row_stat", f32, (6,), L.Scope.LOCAL)
        ra, rb = L.MMA_REGISTERS
        self.a_frag = L.Buffer("a_frag", T.uint32, (ra,), L.Scope.LOCAL)
        self.b_frag = L.Buffer("b_frag", T.uint32, (rb,), L.Scope.LOCAL)
        self.bi, self.qt, self.kt = L.Var("bi"), L.Var("qt"), L.Var("kt")
        self.t, self.w, self.g, self.lq = L.Var("t"), L.Var("wp"), L.Var("g"), L.Var("lq")
        self.nj, self.ks_, self.r, self.h = L.Var("nj"), L.Var("kk"), L.Var("rr"), L.Var("h")
        self.step, self.e = L.Var("ls"), L.Var("e")
        self.q0, self.j0 = self.qt * rows, self.kt * tk
        self.zero, self.neg_inf = L.const(0.0, f32), L.const(NEG_INF, f32)
        self.p_in_registers = False

    def buffers(self) -> tuple[L.Buffer, ...]:
        return (self.qs, self.ks, self.vs, self.ps, self.s, self.o, self.stat, self.a_frag,
                self.b_frag)

    # -- helpers

    def per_thread(self, body: L.Stmt) -> L.Stmt:
        """`body` on every thread: its warp w, its lane's g and q (PTX's groupID and
        threadID_in_group), where used."""
        used = L.free_vars(body)
        for var, value in ((self.lq, self.t % 4), (self.g, self.t % WARP // 4),
                           (self.w, self.t // WARP)):
            if var in used:
                body = L.Let(var, value, body)
        return L.For(self.t, self.c.threads, body, L.ForKind.THREAD_X)

    def copy(self, n: int, body) -> L.Stmt:
        """body(e) for e < n, consecutive threads at consecutive e."""
        return block_copy(self.t, self.step, self.e, self.c.threads, n, body)

    @staticmethod
    def each(var: L.Var, n: int, body: L.Stmt) -> L.Stmt:
        return L.For(var, n, body, L.ForKind.UNROLLED)


    def register(self, element, r: int) -> L.Expr:
        """Operand register r of an mma: its elements (fp32 from shared memory) rounded and
        packed (`L.PACKS`), as mma.py's fragments."""
        if self.precision == "tf32":
            return L.call(L.PACKS["tf32"], element(r), dtype=T.uint32)
        return L.call(L.PACKS[self.precision], element(2 * r), element(2 * r + 1),
                      dtype=T.uint32)

    def product(self, acc: L.Buffer, tile: L.Expr, a_at, b_at, steps: int) -> L.Stmt:
        """acc's mma tile `tile` += A B over `steps` k steps: a_at(row, k) and b_at(k, col)
        read the operands (the warp's 16 rows, the tile's 8 columns) from shared memory."""
        ra, rb = L.MMA_REGISTERS
        a_place, b_place = FRAGMENTS[self.precision]
        kk, mk = self.ks_, self.mk

        def a_element(e):
            row, k = a_place(e, self.g, self.lq)
            return a_at(row, kk * mk + k)

        def b_element(e):
            k, col = b_place(e, self.g, self.lq)
            return b_at(kk * mk + k, col)

        loads = [L.Store(self.a_frag, (r,), self.register(a_element, r)) for r in range(ra)]
        loads += [L.Store(self.b_frag, (r,), self.register(b_element, r)) for r in range(rb)]
        mma = L.Mma(self.precision, acc, tile * 4,
                    tuple(self.a_frag[r] for r in range(ra)),
                    tuple(self.b_frag[r] for r in range(rb)))
        return self.each(kk, steps, L.seq(*loads, mma))

    # -- the steps

    def init(self) -> L.Stmt:
        """The running maxima -inf, the sums and output accumulators 0."""
        stat, h, r = self.stat, self.h, self.r
        return self.per_thread(L.seq(
            self.each(h, 2, L.seq(L.Store(stat, (3 * h,), self.neg_inf),
                                  L.Store(stat, (3 * h + 1,), self.zero))),
            self.each(r, self.n_o * 4, L.Store(self.o, (r,), self.zero))))

    def load_q(self) -> L.Stmt:
        """The block's rows of Q into shared memory (0 past the last row and past d)."""
        p, d, q0 = self.p, self.d, self.q0
        return self.copy(self.c.rows * d, lambda x: L.Store(
            self.qs, (x // d * self.dp + x % d,), guarded(
                L.logical_and(q0 + x // d < p.sq, x % d < p.d),
                self.q[self.bi, L.minimum(q0 + x // d, p.sq - 1),
                       L.minimum(x % d, p.d - 1)])))

    def load_k(self) -> L.Stmt:
        """Step 1: K's tile, key-major, into shared memory, along K's contiguous
        dimension."""
        p, d, tk, j0 = self.p, self.d, self.c.tile_k, self.j0

        def key(jt, dt):
            j = L.minimum(j0 + jt, p.sk - 1)
            dd = L.minimum(dt, p.d - 1)
            return guarded(L.logical_and(j0 + jt < p.sk, dt < p.d),
                                self.k[self.bi, dd, j] if p.k_transposed else
                                self.k[self.bi, j, dd])

        if p.k_transposed:   # K's contiguous dim is the keys'
            return self.copy(tk * d, lambda x: L.Store(self.ks, (x % tk * self.dp + x // tk,),
                                                       key(x % tk, x // tk)))
        return self.copy(tk * d, lambda x: L.Store(self.ks, (x // d * self.dp + x % d,),
                                                   key(x // d, x % d)))

    def load_v(self) -> L.Stmt:
        """Step 1: V's tile into shared memory (0 past the last key and past dv)."""
        p, dv, j0 = self.p, self.dv, self.j0
        return self.copy(self.c.tile_k * dv, lambda x: L.Store(
            self.vs, (x // dv * self.vp + x % dv,), guarded(
                L.logical_and(j0 + x // dv < p.sk, x % dv < p.dv),
                self.v[self.bi, L.minimum(j0 + x // dv, p.sk - 1),
                       L.minimum(x % dv, p.dv - 1)])))

    def scores(self) -> L.Stmt:
        """Step 2: the warp's scores of the tile on the tensor cores."""
        row0 = self.w * 16
        zero = self.each(self.r, self.n_s * 4, L.Store(self.s, (self.r,), self.zero))
        qk = self.each(self.nj, self.n_s, self.product(
            self.s, self.nj,
            lambda row, k: self.qs[(row0 + row) * self.dp + k],
            lambda k, col: self.ks[(self.nj * 8 + col) * self.dp + k], self.d // self.mk))
        return self.per_thread(L.seq(zero, qk))

    def _place(self, r: int) -> tuple[L.Expr, L.Expr, L.Expr]:
        """(the block's row, the tile's key, the row half) of accumulator r of tile nj."""
        row, col = _c(r, self.g, self.lq)
        return self.w * 16 + row, self.nj * 8 + col, r // 2

    def update(self) -> L.Stmt:
        """Step 3: mask, the rows' tile max across their 4 lanes, the running max, the
        rescaled sums and accumulators, the probabilities into shared memory."""
        p, s, stat, f32 = self.p, self.s, self.stat, T.float32
        finish, top = [], []
        for r in range(4):
            row, key, h = self._place(r)
            i = L.minimum(self.q0 + row, p.sq - 1)   # (rows past the last compute sq - 1's)
            j = L.minimum(self.j0 + key, p.sk - 1)
            slot = (self.nj * 4 + r,)
            logit = s[slot] * L.const(p.scale, f32)
            if p.drop is not None:
                logit = L.Select(p.mask_at(self.bi, i, j, p.drop), L.const(p.fill, f32), logit)
            if p.mask is not None:
                logit = logit + problems.widened(p.mask_at(self.bi, i, j))
            finish.append(L.Store(s, slot, L.Select(self.j0 + key < p.sk, logit,
                                                    self.neg_inf)))
            top.append(L.Store(stat, (3 * h + 2,), L.maximum(stat[(3 * h + 2,)], s[slot])))
        start = self.each(self.h, 2, L.Store(stat, (3 * self.h + 2,), self.neg_inf))
        masked = self.per_thread(L.seq(start, self.each(self.nj, self.n_s, L.seq(*finish,
                                                                                 *top))))
        # the 4 lanes of a quad share rows g and g + 8
        exchange = [self.per_thread(self.each(self.h, 2, x))
                    for x in _butterfly(stat, (3 * self.h + 2,), "max", 4)]
        return L.seq(masked, *exchange, self.per_thread(self._rescale()))

    def _rescale(self) -> L.Stmt:
        """Step 3's second half, per row half: m_ref and the correction exp(m_old - m_ref)
        (Lets around the body), the sum and accumulators rescaled, p = exp(s - m_ref) added
        to the sum and stored, then the running max moved."""
        stat, s = self.stat, self.s
        m_refs, corrs = [L.Var(f"m_ref{k}", T.float32) for k in range(2)], \
            [L.Var(f"corr{k}", T.float32) for k in range(2)]
        probs = []
        for r in range(4):
            row, key, half = self._place(r)
            slot = (self.nj * 4 + r,)
            probs += [L.Store(s, slot, L.call("exp", s[slot] - m_refs[half])),
                      L.Store(stat, (3 * half + 1,), stat[(3 * half + 1,)] + s[slot])]
            if not self.p_in_registers:
                probs.append(L.Store(self.ps, (row * self.pp + key,), s[slot]))
        rescale = [L.Store(self.o, (self.nj * 4 + r,), self.o[(self.nj * 4 + r,)] *
                           corrs[r // 2]) for r in range(4)]
        body = L.seq(L.Store(stat, (1,), stat[(1,)] * corrs[0]),
                     L.Store(stat, (4,), stat[(4,)] * corrs[1]),
                     self.each(self.nj, self.n_s, L.seq(*probs)),
                     self.each(self.nj, self.n_o, L.seq(*rescale)),
                     L.Store(stat, (0,), L.maximum(stat[(0,)], stat[(2,)])),
                     L.Store(stat, (3,), L.maximum(stat[(3,)], stat[(5,)])))
        for half in (1, 0):
            m_new = L.maximum(stat[(3 * half,)], stat[(3 * half + 2,)])
            body = L.Let(m_refs[half], L.Select(L.eq(m_new, self.neg_inf), self.zero, m_new),
                         L.Let(corrs[half], L.call("exp", stat[(3 * half,)] -
                                                   m_refs[half]), body))
        return body

    def weigh(self) -> L.Stmt:
        """Step 4: the warp's output accumulators += P V on the tensor cores."""
        row0 = self.w * 16
        return self.per_thread(self.each(self.nj, self.n_o, self.product(
            self.o, self.nj,
            lambda row, k: self.ps[(row0 + row) * self.pp + k],
            lambda k, col: self.vs[k * self.vp + self.nj * 8 + col],
            self.c.tile_k // self.mk)))

    def done(self) -> L.Stmt:
        """The 4 lanes' sums of each row added, then O / l stored through the epilogue and
        layout tail, guarded past the last row and dv."""
        p, stat = self.p, self.stat
        sums = [self.per_thread(self.each(self.h, 2, x))
                for x in _butterfly(stat, (3 * self.h + 1,), "+", 4)]
        stores = []
        for r in range(4):
            row, col = _c(r, self.g, self.lq)
            i, e = self.q0 + self.w * 16 + row, self.nj * 8 + col
            value = self.o[(self.nj * 4 + r,)] / stat[(3 * (r // 2) + 1,)]
            inside = L.logical_and(i < p.sq, e < p.dv) if self.dv > p.dv else i < p.sq
            stores.append(L.If(inside, p.store(self.bi, i, e, value)))
        return L.seq(*sums, self.per_thread(self.each(self.nj, self.n_o, L.seq(*stores))))


class _Flash16(_MmaFlash):
    """The block at fp16 and bf16: Q's fragments in registers (read once from memory), K's
    tile and V's tile transposed in shared memory as 16-bit pairs, so that each operand
    register of an mma is one 32-bit shared load, and P kept in the score accumulators: the
    accumulators of score tiles 2 kk and 2 kk + 1 (rows g and g + 8, keys 2 t and 2 t + 1 of
    each) are, packed in pairs, the A registers of the k step kk of P V (PTX ISA's m16n8k16
    fragments, `FRAGMENTS`: FlashAttention-2's reuse)."""

    def __init__(self, p: problems.Attention, c: MmaAttentionConfig, precision: str):
        super().__init__(p, c, precision)
        tk = c.tile_k
        self.p_in_registers = True
        self.kw, self.vw = self.d // 2 + 4, tk // 2 + 4   # padded row strides, in words
        self.ks = L.Buffer("k_pairs", T.uint32, (tk * self.kw,), L.Scope.SHARED)
        self.vs = L.Buffer("v_pairs", T.uint32, (self.dv * self.vw,), L.Scope.SHARED)
        self.q_frag = L.Buffer("q_frag", T.uint32, (self.d // 16 * 4,), L.Scope.LOCAL)
        self.kq = L.Var("kq")

    def buffers(self) -> tuple[L.Buffer, ...]:
        return (self.ks, self.vs, self.s, self.o, self.stat, self.q_frag, self.a_frag,
                self.b_frag)

    def pack(self, lo: L.Expr, hi: L.Expr) -> L.Expr:
        return L.call(L.PACKS[self.precision], lo, hi, dtype=T.uint32)

    def load_q(self) -> L.Stmt:
        """The warp's rows of Q as A fragments, once, straight from memory (0 past the last
        row and past d)."""
        p, a_place = self.p, FRAGMENTS[self.precision][0]
        rows = self.w * 16

        def element(e: int) -> L.Expr:
            row, k = a_place(e, self.g, self.lq)
            i, dd = self.q0 + rows + row, self.kq * 16 + k
            return guarded(L.logical_and(i < p.sq, dd < p.d),
                           self.q[self.bi, L.minimum(i, p.sq - 1), L.minimum(dd, p.d - 1)])

        regs = [L.Store(self.q_frag, (self.kq * 4 + r,), self.pack(element(2 * r),
                                                                   element(2 * r + 1)))
                for r in range(4)]
        return self.per_thread(self.each(self.kq, self.d // 16, L.seq(*regs)))

    def _k_value(self, jt: L.Expr, dt: L.Expr) -> L.Expr:
        p, j0 = self.p, self.j0
        j, dd = L.minimum(j0 + jt, p.sk - 1), L.minimum(dt, p.d - 1)
        return guarded(L.logical_and(j0 + jt < p.sk, dt < p.d),
                       self.k[self.bi, dd, j] if p.k_transposed else self.k[self.bi, j, dd])

    def load_k(self) -> L.Stmt:
        """Step 1: K's tile, key-major, a pair of d a word, consecutive threads along K's
        contiguous dimension."""
        half, tk = self.d // 2, self.c.tile_k

        def word(jt, dw):
            return L.Store(self.ks, (jt * self.kw + dw,), self.pack(
                self._k_value(jt, 2 * dw), self._k_value(jt, 2 * dw + 1)))

        if self.p.k_transposed:
            return self.copy(tk * half, lambda x: word(x % tk, x // tk))
        return self.copy(tk * half, lambda x: word(x // half, x % half))

    def load_v(self) -> L.Stmt:
        """Step 1: V's tile transposed, a pair of keys a word (0 past the last key and past
        dv), consecutive threads along dv."""
        p, dv, j0 = self.p, self.dv, self.j0

        def value(jt, col):
            return guarded(L.logical_and(j0 + jt < p.sk, col < p.dv),
                           self.v[self.bi, L.minimum(j0 + jt, p.sk - 1),
                                  L.minimum(col, p.dv - 1)])

        return self.copy(dv * (self.c.tile_k // 2), lambda x: L.Store(
            self.vs, (x % dv * self.vw + x // dv,),
            self.pack(value(2 * (x // dv), x % dv), value(2 * (x // dv) + 1, x % dv))))

    def _b_words(self, tile: L.Buffer, stride: int, kk: L.Expr) -> list[L.Stmt]:
        """The B registers of column tile nj at k step kk: words (nj 8 + g, kk 8 + t + 4 r)
        of a tile stored a column a row, k in pairs (B's elements 2 r and 2 r + 1 are k =
        2 t + 8 r and the next, column g: FRAGMENTS)."""
        return [L.Store(self.b_frag, (r,), tile[(self.nj * 8 + self.g) * stride + kk * 8 +
                                                 self.lq + 4 * r]) for r in range(2)]

    def scores(self) -> L.Stmt:
        """Step 2: the warp's scores of the tile, Q's fragments from registers."""
        ra, rb = L.MMA_REGISTERS
        zero = self.each(self.r, self.n_s * 4, L.Store(self.s, (self.r,), self.zero))
        step = L.seq(*self._b_words(self.ks, self.kw, self.ks_), L.Mma(
            self.precision, self.s, self.nj * 4,
            tuple(self.q_frag[self.ks_ * 4 + r] for r in range(ra)),
            tuple(self.b_frag[r] for r in range(rb))))
        qk = self.each(self.nj, self.n_s, self.each(self.ks_, self.d // 16, step))
        return self.per_thread(L.seq(zero, qk))

    def weigh(self) -> L.Stmt:
        """Step 4: the warp's output accumulators += P V, P's A registers packed from the
        score accumulators of tiles 2 kk and 2 kk + 1."""
        ra, rb = L.MMA_REGISTERS
        kk, s = self.ks_, self.s
        a = [L.Store(self.a_frag, (r,), self.pack(s[(2 * kk + r // 2) * 4 + 2 * (r % 2)],
                                                  s[(2 * kk + r // 2) * 4 + 2 * (r % 2) + 1]))
             for r in range(ra)]
        pv = L.seq(*self._b_words(self.vs, self.vw, kk), L.Mma(
            self.precision, self.o, self.nj * 4, tuple(self.a_frag[r] for r in range(ra)),
            tuple(self.b_frag[r] for r in range(rb))))
        return self.per_thread(self.each(kk, self.c.tile_k // 16, L.seq(
            *a, self.each(self.nj, self.n_o, pv))))


MMA_ATTENTION = Template("cuda_mma_attention", problems.attention, applies, space, default,
                         build, precisions=PRECISIONS)
