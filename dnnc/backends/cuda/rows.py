"""The cuda row template's stages: a row reduction (softmax, layernorm, a reduce over the
last axis) on a row's threads, its reductions combined across the warp by `shfl_xor`
butterflies and across warps through shared memory, row scalars made registers, input rows
cached in registers, vector accesses along the row (see `schedules.py`'s docstring, `ROWS`).
`RowBuilder` also runs a whole-tensor reduction of the default template on one block.

This module never chooses a template or a config (`schedules.py` does) and never renders
code.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ..loop_analysis import (accesses, nest_work, rename_buffer, steps_contiguously,
                             update_op)
from .threads import (WARP, Names, Scratch, guarded, independent_prefix, index_vars,
                      store_back, vector_loads, vector_stores)

# a row stage runs on a row's threads when one of its reductions has at least this many
# iterations (a warp's worth); shorter rows run one thread per row
MIN_ROW_WORK = 32
# row elements a thread keeps in registers across a row's passes at most (beyond, spills)
MAX_CACHED = 32
# rows read column-wise are few when there are fewer than this many times their length: a
# thread a row would leave most of the GPU idle while each runs its row alone
FEW_ROWS = 8
_IDEMPOTENT = ("max", "min", "and", "or")
_IDENTITY = {"+": 0, "*": 1}


@dataclass(frozen=True)
class RowsConfig:
    """Knobs of the row-reduction template."""

    threads: int = 256
    grid_stride: bool = False
    reduce_threads: int = 256
    vector: int = 1
    row_threads: int = 32        # threads of a row (a power of two)
    row_block: int = 128         # threads a block aims at: max(1, row_block // row_threads) rows
    row_vector: int = 1          # contiguous elements of a row a thread takes at a time
    cache_row: bool = True       # an input row read by several passes held in registers
    fuse_rows: bool = True       # consecutive stages over the same rows in one launch
    row_interleave: int = 1      # consecutive threads take this many consecutive rows (below)


# -- rows on a row's threads ---------------------------------------------------------------------


def reduction(s: L.Stmt):
    """(acc, init, loop, op, finish) when `s` is `alloc acc[1] (local); acc[0] = init;
    for ...: <updates acc[0] = acc[0] op x, nothing else carried>; finish...` with `init`
    the identity of `op` (partial results each start from it); else None."""
    if not (isinstance(s, L.Allocate) and s.buffer.scope is L.Scope.LOCAL and
            L.static_shape(s.buffer.shape) in ((1,), ()) and isinstance(s.body, L.Seq)):
        return None
    acc = s.buffer
    init, loop, *finish = s.body.stmts
    if not (isinstance(init, L.Store) and init.buffer.name == acc.name and
            isinstance(init.value, L.Const) and isinstance(loop, L.For)):
        return None
    op = update_op(loop, acc)
    if op is None or not (op in _IDEMPOTENT or _IDENTITY.get(op) == init.value.value):
        return None
    fused = independent_prefix(loop, frozenset({acc.name}))
    return None if fused is None else (acc, init, fused, op, finish)


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def one_row(body: list[L.Stmt], row: L.Var) -> list[L.Stmt]:
    """Stages of a function over a single row (a layernorm or softmax of one token, whose
    lowering has no row loop: its reductions are whole-tensor stages) as loops of one row
    `row`: each reduction a warp's worth long or more, and each elementwise loop after one
    that is no longer than its row (the normalisation; not a broadcast over a larger
    tensor), so that `fuse_row_loops` makes them one stage on a row's threads (a
    layernorm of [1, 1, 768] took 3 launches, a whole-tensor reduction on one block each and
    the normalisation a thread an element)."""
    out: list[L.Stmt] = []
    for s in body:
        unit = L.For(row, 1, s)
        if reduction(s) is not None and is_row_reduction(unit) or \
                isinstance(s, L.For) and out and _one_row(out[-1], row) and \
                (nest_work(s) or 0) <= row_length(out[-1]):
            s = unit
        out.append(s)
    return out


def _one_row(s: L.Stmt, row: L.Var) -> bool:
    return isinstance(s, L.For) and s.var == row


def row_parts(loop: L.For) -> list[L.Stmt]:
    return list(loop.body.stmts) if isinstance(loop.body, L.Seq) else [loop.body]


def is_row_reduction(loop: L.For) -> bool:
    """Rows with a reduction long enough for a warp, along the row's own elements or, read
    column-wise, across rows (`reads_columns`)."""
    return _long_reductions(loop, along_rows=True) or reads_columns(loop)


def reads_columns(loop: L.For) -> bool:
    """Rows with a reduction long enough for a warp whose reads step contiguously from row
    to row, not along the row (a layernorm over NCHW's channels read through a Transpose:
    rows are pixels, a row's elements a channel's plane apart; a global pool over NHWC's
    pixels: rows are channels), and either some stage stores along the row (that
    layernorm's NHWC output) or the rows are few for their length (`FEW_ROWS`: the pool's
    rows are its channels): interleaved rows then read a few consecutive elements of each
    column at a step, several threads a row. A reduction of many short rows written a row
    at a time (a mean over NCHW's channels at every pixel) reads coalesced one thread a row
    instead."""
    if not _long_reductions(loop, along_rows=False):
        return False
    return writes_rows(loop) or loop.extent.value < FEW_ROWS * row_length(loop)


def writes_rows(loop: L.For) -> bool:
    """Whether a part of the row stores along the row (consecutive elements)."""
    return any(steps_contiguously(n, s.var, s.extent.value)
               for s in map(strided_loop, row_parts(loop)) if s is not None
               for n in L.walk(s.body) if isinstance(n, L.Store))


def row_length(loop: L.For) -> int:
    """The longest reduction of a row of `loop`."""
    return max((found[2].extent.value for found in map(reduction, row_parts(loop))
                if found is not None), default=0)


def _long_reductions(loop: L.For, along_rows: bool) -> bool:
    """Whether a reduction of the row of at least MIN_ROW_WORK iterations reads a load
    contiguous along the row (`along_rows`) or, with none that is, across rows."""
    for p in row_parts(loop):
        found = reduction(p)
        if found is None or (nest_work(found[2]) or 0) < MIN_ROW_WORK:
            continue
        strided = found[2]
        loads = [n for n in L.walk(strided.body) if isinstance(n, L.Load)]
        along = any(steps_contiguously(n, strided.var, strided.extent.value) for n in loads)
        if along_rows and along:
            return True
        if not along_rows and not along and any(
                steps_contiguously(n, loop.var, loop.extent.value) for n in loads):
            return True
    return False


def strided_loop(part: L.Stmt) -> L.For | None:
    """The loop of a row part its threads share: a reduction's, or an elementwise loop."""
    found = reduction(part)
    if found is not None:
        return found[2]
    return independent_prefix(part) if isinstance(part, L.For) else None


@dataclass(frozen=True)
class Layout:
    """Rows on threads: `threads` a row (a power of two), `per_block` rows a block, `rows`
    rows, `row` the row's variable (None: a single row); a thread takes `vector` contiguous
    elements of the row at a time (element (k * threads + lane) * vector + v at step k).
    `interleave` (a power of two dividing `per_block`): block thread t takes row
    t // (interleave threads) interleave + t % interleave of the block, as its thread
    t // interleave % threads: a warp holds `interleave` consecutive rows, each on 32 /
    interleave consecutive lanes (1: a row's threads are consecutive)."""

    row: L.Var | None
    rows: int
    threads: int
    per_block: int
    vector: int
    interleave: int = 1

    def steps(self, length: int) -> int:
        """Steps of a thread over a row of `length` elements."""
        return -(-length // (self.threads * self.vector))

    @property
    def block_threads(self) -> int:
        return self.threads * self.per_block

    @property
    def blocks(self) -> int:
        return -(-self.rows // self.per_block)

    @property
    def span(self) -> int:
        """Consecutive block threads that hold whole rows: `interleave` rows' threads."""
        return self.interleave * self.threads

    def row_of(self, t: L.Expr) -> L.Expr:
        """The block's row that thread `t` works on."""
        if self.interleave == 1:
            return t // self.threads
        return t // self.span * self.interleave + t % self.interleave

    def lane_of(self, t: L.Expr) -> L.Expr:
        """Thread `t`'s index among its row's threads."""
        return t % self.threads if self.interleave == 1 else t // self.interleave % self.threads

    @property
    def shuffle_masks(self) -> tuple[int, ...]:
        """The lane masks of the butterfly that combines a row's threads within a warp."""
        return tuple(m for m in (16, 8, 4, 2, 1) if self.interleave <= m < self.span)

    @property
    def warps(self) -> int:
        """Warps a row's threads span (1 when a warp holds them all)."""
        return max(1, self.span // WARP)


def on_rows(loop: L.For, config: RowsConfig, names: Names, scratch: Scratch) -> L.Stmt:
    """`loop`'s rows on `config.row_threads` threads each (see the module's docstring)."""
    threads = config.row_threads
    rows = loop.extent.value
    interleave = min(config.row_interleave, pow2(rows), max(1, 1024 // threads)) \
        if reads_columns(loop) else 1
    per_block = max(1, config.row_block // threads)
    if interleave > 1:   # (whole groups of interleaved rows a block; scalar accesses)
        layout = Layout(loop.var, rows, threads, max(interleave, per_block - per_block %
                                                     interleave), 1, interleave)
    else:
        layout = Layout(loop.var, rows, threads, min(per_block, rows), config.row_vector)
    parts = row_parts(loop)
    private = _private_scalars(loop, parts, scratch, names)
    parts = [_rename(p, private) for p in parts]
    cache = _row_cache(loop, parts, layout, names) if config.cache_row else {}
    return RowBuilder(layout, names, parts, private, cache).build()


def _rename(s: L.Stmt, private: dict) -> L.Stmt:
    """`s` with each access to a buffer of `private` made to its register (index 0)."""
    zero = (L.const(0),)

    def rule(n):
        if isinstance(n, L.Load) and n.buffer.name in private:
            return L.Load(private[n.buffer.name], zero)
        if isinstance(n, L.Store) and n.buffer.name in private:
            return L.Store(private[n.buffer.name], zero, n.value)
        return None

    return L.transform(s, rule) if private else s


def _private_scalars(loop: L.For, parts: list, scratch: Scratch, names: Names) -> dict:
    """Global scratch of one element a row (always accessed at one index of the row alone)
    that only this stage touches and only reductions' finishing statements store (every
    thread of the row runs those, and every lane holds the total): name -> the per-thread
    register buffer that replaces it."""
    finishing, other = set(), set()
    for p in parts:
        stores = {n.buffer.name for n in L.walk(p) if isinstance(n, L.Store)}
        found = reduction(p)
        if found is None:
            other |= stores
            continue
        in_loop = {n.buffer.name for n in L.walk(found[2]) if isinstance(n, L.Store)}
        finishing |= stores - in_loop
        other |= in_loop
    stores, loads = accesses(loop.body)
    out = {}
    for name in sorted(finishing - other):
        indices = stores[name] | loads.get(name, set())
        if len(indices) != 1 or not scratch.private_to_stage(name):
            continue
        (index,) = indices
        used = set().union(*(L.free_vars(i) for i in index))
        if used != {loop.var} and not (used == set() and loop.extent.value == 1):
            continue
        dtype = next(n.buffer.dtype for n in L.walk(loop.body)
                     if isinstance(n, L.Store) and n.buffer.name == name)
        out[name] = L.Buffer(names(f"{name}_reg"), dtype, (1,), L.Scope.LOCAL)
    return out


def _row_cache(loop: L.For, parts: list, layout: Layout, names: Names) -> dict:
    """Input elements of the row that two or more parts' strided loops read, at one index
    of the loop's variable (and the row's): (buffer name, index with the variable as `_J`)
    -> a per-thread register buffer of a slot per element the thread takes; none
    when the loops differ in length or the row would take more than MAX_CACHED registers a
    thread."""
    stored = {n.buffer.name for n in L.walk(loop.body) if isinstance(n, L.Store)}
    lengths, users, buffers = set(), {}, {}
    for p in parts:
        strided = strided_loop(p)
        if strided is None:
            continue
        lengths.add(strided.extent.value)
        keys = set()
        for n in L.walk(strided.body):
            # (an index of the row's element alone: not of an inner loop's or a let's)
            if isinstance(n, L.Load) and n.buffer.name not in stored and \
                    strided.var in index_vars(n) and \
                    index_vars(n) <= {strided.var, loop.var}:
                keys.add(_cache_key(n, strided.var))
                buffers[n.buffer.name] = n.buffer
        for key in keys:
            users[key] = users.get(key, 0) + 1
    shared = sorted((key for key, count in users.items() if count > 1), key=str)
    if len(lengths) != 1 or not shared:
        return {}
    slots = layout.steps(lengths.pop()) * layout.vector
    if slots * len(shared) > MAX_CACHED:
        return {}
    return {key: L.Buffer(names(f"{key[0]}_row"), buffers[key[0]].dtype, (slots,),
                          L.Scope.LOCAL) for key in shared}


_J = L.Var("J")
_V = L.Var("V")   # (a placeholder for a vector lane, substituted before use)


def _cache_key(load: L.Load, var: L.Var) -> tuple:
    return load.buffer.name, tuple(L.substitute(i, {var: _J}) for i in load.indices)


class RowBuilder:
    """The statements of a row stage on `layout`: a block loop around thread loops, one per
    phase of the row (see the module's docstring)."""

    def __init__(self, layout: Layout, names: Names, parts: list, private: dict,
                 cache: dict):
        self.layout = layout
        self.names = names
        self.parts = parts
        self.private = private
        self.cache = cache
        self.block = names.var("b")
        self.locals: list[L.Buffer] = list(private.values()) + list(cache.values())
        self.shared: list[L.Buffer] = []
        # buffers of no other thread: no barrier guards them
        self.own = {b.name for b in self.locals}
        self.inputs = {n.buffer.name: n.buffer for p in parts for n in L.walk(p)
                       if isinstance(n, L.Load)}

    def build(self) -> L.Stmt:
        body: list[L.Stmt] = []
        written: set[str] = set()
        read: set[str] = set()
        if self.cache:
            body.append(self._fill_cache())
        for part in self.parts:
            phases = self._part(part)
            stores, loads = (set(d) - self.own for d in accesses(L.seq(*phases)))
            if written & (stores | loads) or read & stores:
                body.append(L.Barrier())
                written, read = set(), set()
            written |= stores
            read |= loads
            body += phases
        out = L.seq(*body)
        for buffer in reversed(self.shared + self.locals):
            out = L.Allocate(buffer, out)
        return L.For(self.block, self.layout.blocks, out, L.ForKind.BLOCK_X)

    # -- thread loops ------------------------------------------------------------------------

    def _threads(self, body, guard: bool = True) -> L.Stmt:
        """A loop over the block's threads running `body(t, lane)` (a row's thread index
        `lane`) with the row's variable bound, for the rows that exist when `guard`."""
        lay = self.layout
        t = self.names.var("t")
        lane = t if lay.per_block == 1 else self.names.var("lane")
        stmt = body(t, lane)
        if guard:
            stmt = self._row_guard(stmt)
        used = L.free_vars(stmt)
        if lay.row in used:
            stmt = L.Let(lay.row, self.block * lay.per_block + lay.row_of(t)
                         if lay.per_block > 1 else self.block, stmt)
        if lane is not t and lane in used:
            stmt = L.Let(lane, lay.lane_of(t), stmt)
        return L.For(t, lay.block_threads, stmt, L.ForKind.THREAD_X)

    def _row_guard(self, stmt: L.Stmt) -> L.Stmt:
        """`stmt` skipped on the threads of a block's rows past the last."""
        lay = self.layout
        if lay.row is None or lay.rows % lay.per_block == 0:
            return stmt
        return L.If(lay.row < lay.rows, stmt)

    def _strided(self, loop: L.For, lane: L.Expr) -> L.Stmt:
        """`loop`'s iterations (k * threads + lane) * vector + v, its cached loads read from
        registers (slot k * vector + v); with `vector` > 1 and whole groups (the row's
        length a multiple of `vector`), its other loads of the row's own elements copied
        into registers first (`vector_loads`) and its stores of them kept in registers and
        stored after (`vector_stores`): one vector load or store each where the renderer
        proves it aligned."""
        lay = self.layout
        n = loop.extent.value
        steps = lay.steps(n)
        k = self.names.var(f"{loop.var.name}_k")
        kind = L.ForKind.UNROLLED if steps * lay.vector <= MAX_CACHED else L.ForKind.SERIAL
        covered = steps * lay.threads * lay.vector
        if lay.vector == 1:
            return L.For(k, steps, guarded(L.For(loop.var, loop.extent, self._cached(
                loop, k)), k * lay.threads + lane, covered), kind)
        v = self.names.var(f"{loop.var.name}_v")
        body = self._cached(loop, k * lay.vector + v)
        if n % lay.vector:
            return L.For(k, steps, L.For(v, lay.vector, guarded(
                L.For(loop.var, loop.extent, body), (k * lay.threads + lane) * lay.vector + v,
                covered), L.ForKind.UNROLLED), kind)
        group = k * lay.threads + lane
        free = {loop.var} | ({lay.row} if lay.row is not None else set())
        copies, registers, body = vector_loads(body, loop.var, n, free, v, group * lay.vector,
                                                lay.vector, self.names)
        body, stores = vector_stores(body, loop.var, n, free, v, lay.vector, self.names)
        registers += stores.values()
        self.own |= {reg.name for reg in registers}
        out = L.seq(*copies,
                    L.For(v, lay.vector, L.Let(loop.var, group * lay.vector + v, body),
                          L.ForKind.UNROLLED),
                    *store_back(stores, loop.var, group * lay.vector, lay.vector,
                                 self.names))
        for reg in registers:
            out = L.Allocate(reg, out)
        if covered != n:
            out = L.If(group < n // lay.vector, out)
        return L.For(k, steps, out, kind)

    def _cached(self, loop: L.For, slot: L.Expr) -> L.Stmt:
        if not self.cache:
            return loop.body

        def rule(n):
            if isinstance(n, L.Load):
                reg = self.cache.get(_cache_key(n, loop.var))
                if reg is not None:
                    return L.Load(reg, (slot,))
            return None

        return L.transform(loop.body, rule)

    def _fill_cache(self) -> L.Stmt:
        """Every cached input element of the row loaded into its register, once: with
        `vector` > 1 and whole groups, each operand's group by a VECTORIZED copy (one vector
        load where the renderer proves it aligned)."""
        lay = self.layout
        length = next(strided_loop(p) for p in self.parts
                      if strided_loop(p) is not None).extent.value
        steps = lay.steps(length)
        k = self.names.var("fill_k")

        def copies(j: L.Expr, slot: L.Expr) -> list[L.Stmt]:
            return [L.Store(reg, (slot,), L.Load(self.inputs[name], tuple(
                L.substitute(i, {_J: j}) for i in index)))
                for (name, index), reg in self.cache.items()]

        def fill(t, lane):
            group = k * lay.threads + lane
            covered = steps * lay.threads * lay.vector
            if lay.vector == 1:
                j = self.names.var("j")
                body = guarded(L.For(j, length, L.seq(*copies(j, k))), group, covered)
            elif length % lay.vector == 0:
                body = []
                for copy in copies(group * lay.vector + _V, k * lay.vector + _V):
                    v = self.names.var("fill_v")
                    body.append(L.For(v, lay.vector, L.substitute(copy, {_V: v}),
                                      L.ForKind.VECTORIZED))
                body = L.seq(*body)
                if covered != length:
                    body = L.If(group < length // lay.vector, body)
            else:
                v, j = self.names.var("fill_v"), self.names.var("j")
                body = L.For(v, lay.vector, guarded(L.For(j, length, L.seq(*copies(
                    j, k * lay.vector + v))), group * lay.vector + v, covered),
                    L.ForKind.UNROLLED)
            return self._row_guard(L.For(k, steps, body, L.ForKind.UNROLLED))

        return self._threads(fill, guard=False)

    # -- parts of a row ----------------------------------------------------------------------

    def _part(self, part: L.Stmt) -> list[L.Stmt]:
        found = reduction(part)
        if found is not None:
            return self._reduce(*found)
        inner = independent_prefix(part) if isinstance(part, L.For) else None
        if inner is not None:
            return [self._threads(lambda t, lane: self._strided(inner, lane))]
        return [self._threads(lambda t, lane: L.If(L.eq(lane, 0), part))]

    def _reduce(self, acc, init, loop, op, finish) -> list[L.Stmt]:
        """A reduction of the row: a strided share a thread, a butterfly of shuffles across
        the warp, one shared exchange across the row's warps, then the finish on every
        thread of the row (its stores to memory by the row's first thread only)."""
        lay = self.layout
        if acc.name in self.own:   # (two parts' accumulators of one name: both live here)
            new = L.Buffer(self.names(acc.name), acc.dtype, acc.shape, acc.scope)
            init, loop = rename_buffer(init, acc, new), rename_buffer(loop, acc, new)
            finish, acc = [rename_buffer(s, acc, new) for s in finish], new
        self.locals.append(acc)
        self.own.add(acc.name)
        zero = (L.const(0),)
        out = [self._threads(lambda t, lane: L.seq(init, self._row_guard(
            self._strided(loop, lane))), guard=False)]
        for mask in lay.shuffle_masks:   # every lane ends with its row's total in the warp
            shuffled = L.call("shfl_xor", acc[0], L.const(mask, T.int32))
            out.append(self._threads(lambda t, lane, s=shuffled: L.Store(
                acc, zero, L.BinOp(op, acc[0], s)), guard=False))
        warps = lay.warps
        if warps > 1:
            # warp w of a row's span writes its rows' partials at [row of the block, w]
            part = L.Buffer(self.names(f"{acc.name}_warps"), acc.dtype,
                            (lay.per_block * warps,), L.Scope.SHARED)
            self.shared.append(part)
            w = self.names.var("w")
            first = (lambda t: L.eq(t % WARP, 0)) if lay.interleave == 1 else \
                (lambda t: t % WARP < lay.interleave)
            slot = (lambda t: t // WARP) if lay.interleave == 1 else \
                (lambda t: lay.row_of(t) * warps + t % lay.span // WARP)
            out += [self._threads(lambda t, lane: L.If(first(t), L.Store(
                        part, (slot(t),), acc[0])), guard=False),
                    L.Barrier(),
                    self._threads(lambda t, lane: L.seq(init, L.For(w, warps, L.Store(
                        acc, zero, L.BinOp(op, acc[0], part[lay.row_of(t) * warps + w])),
                        L.ForKind.UNROLLED)), guard=False)]
        out.append(self._threads(lambda t, lane: _stores_on_first(L.seq(*finish), lane)))
        return out


def _stores_on_first(s: L.Stmt, lane: L.Expr) -> L.Stmt:
    """`s` with its stores to memory (not registers) made by the row's first thread only:
    every thread of the row holds the same values, one write is enough."""
    def rule(n):
        if isinstance(n, L.Store) and n.buffer.scope is not L.Scope.LOCAL:
            return L.If(L.eq(lane, 0), n)
        return None

    return L.transform(s, rule)
