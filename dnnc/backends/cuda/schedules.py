"""Schedules for the CUDA backend: which loops run on blocks and threads.

    schedule_kernel(kernel, machine, config=None) -> L.PrimFunc

Templates are chosen from `TEMPLATES`, keyed by ("cuda", anchor pattern), as on llvm
(`space.choose_template`); each takes the kernel as a `problems.Rows` (its PrimFunc as
lowered) and a config of its knob space.

A scheduled PrimFunc keeps the renderer's contract (`codegen.stages`): inside its top-level
GLOBAL scratch, each statement of its body is one stage, run as one launch (stream order is
the grid-wide synchronisation between stages). Every stage comes out as a blockIdx loop
around threadIdx loops:

- `DEFAULT` (every kernel): a stage whose outer loops carry nothing between iterations
  (`loop_analysis.carried`, level by level) has them flattened into one index, `vector`
  contiguous iterations a thread (when the extent is a multiple of `vector`: operands
  read in the stage's order copied into registers by a VECTORIZED loop, the results kept
  in registers and stored by a VECTORIZED loop: one float4 / float2 load and store where
  the renderer proves them aligned; else scalar accesses), `threads` a block (with
  `grid_stride`, at most `stride_blocks` blocks each looping), its inner loops serial in
  the thread. A stage that is a whole-tensor reduction (`acc = identity; for ...: acc =
  acc op f(...); out = g(acc)`) runs as one row (below) on one block of `reduce_threads`
  threads; `reduce_threads=1` runs it on one thread. Anything else runs on one thread
  (correct, slow: the last resort, e.g. an argmax's paired accumulators).
- `ROWS` (kernels with row reductions, as softmax, layernorm, a reduce over the last axis):
  consecutive stages over the same rows become one (`loop_analysis.fuse_row_loops`), and a
  row stage with a reduction of at least `MIN_ROW_WORK` iterations over the row's own
  elements (`loop_analysis.steps_contiguously`: a reduction over NCHW's channels reads
  coalesced one thread a row instead) runs `row_threads` threads a row (32: a warp per
  row; more: several warps), max(1, `row_block` / `row_threads`) rows a block. Each
  elementwise loop of the row is strided over the row's threads (consecutive threads,
  consecutive elements: coalesced); each reduction accumulates a strided share a
  thread, then combines across the warp by `shfl_xor` butterflies (every lane ends with the
  total: no shared memory, no barrier) and, with several warps a row, through one shared
  exchange of the warp partials (one barrier; every thread then sums the partials itself).
  Row scalars the lowering kept in global scratch (softmax's max and sum, layernorm's mean
  and 1/std) become registers of every thread (`_private_scalars`), and with `cache_row`
  an input row the passes read several times is loaded once into registers (`_row_cache`:
  one read of the row from global memory, one write) when it takes at most `MAX_CACHED`
  elements a thread; else each pass re-reads it (from L1/L2). With `row_vector` a thread
  takes that many contiguous elements of the row at a time; when the row's length is a
  multiple, it fills its cache with vector loads, reads the row's other operands
  (layernorm's scale and bias, an uncached row) with vector loads, and writes its results
  with vector stores (from registers); else element by element. Barriers only where a
  part reads or overwrites memory an earlier part of the row wrote. Other stages as
  DEFAULT.

Default row geometry (`rows_default`): `ELEMS_PER_THREAD` elements a thread, at least a
warp and at most 1024 threads a row, the widest `row_vector` the row allows (a softmax
row of 128: a warp, 4 a lane, one float4 each way; a layernorm row of 768: 128 threads,
6 each, float4; 5000: 1024 threads, float4; 770: float2; an odd row: 1).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.registry import Pattern
from ...ir.target import GPU
from .. import problems
from ..loop_analysis import (accesses, carried, fuse_levels, fuse_row_loops, fuse_until,
                             levels, nest_work, rename_buffer, rows_first, runs_in_order,
                             steps_contiguously, update_op)
from ..space import Space, Template, choose_template
from .attention import ATTENTION
from .codegen import stages
from .conv import CONV2D
from .dense import DENSE
from .device import REFERENCE, gpu_of
from .gemv import GEMV
from .mma import MMA_CONV2D, MMA_DENSE

# blocks of a grid-stride stage at most: 8 per SM of the device, rounded down to a power of
# two (`stride_blocks`: 1024 on an H100's 132 SMs)
STRIDE_BLOCKS_PER_SM = 8
# a row stage runs on a row's threads when one of its reductions has at least this many
# iterations (a warp's worth); shorter rows run one thread per row
MIN_ROW_WORK = 32
# row elements a thread keeps in registers across a row's passes at most (beyond, spills)
MAX_CACHED = 32
# the default's elements of a row per thread: enough loads in flight, rows of <= 256 a warp
ELEMS_PER_THREAD = 8
WARP = 32
THREADS = (64, 128, 256, 512, 1024)
ROW_THREADS = (32, *THREADS)
VECTOR = (1, 2, 4)
_IDEMPOTENT = ("max", "min", "and", "or")
_IDENTITY = {"+": 0, "*": 1}


@dataclass(frozen=True)
class Config:
    """Knobs of the default template."""

    threads: int = 256           # threads per block of a thread-per-iteration stage
    grid_stride: bool = False    # at most `stride_blocks` blocks, each looping over the rest
    reduce_threads: int = 256    # one block's threads for a whole-tensor reduction (1: one)
    vector: int = 1              # contiguous iterations a thread of a thread-per-iteration stage


@dataclass(frozen=True)
class RowsConfig:
    """Knobs of the row-reduction template."""

    threads: int = 256
    grid_stride: bool = False
    reduce_threads: int = 256
    vector: int = 1
    row_threads: int = 32        # threads of a row (a power of two, whole warps)
    row_block: int = 128         # threads a block aims at: max(1, row_block // row_threads) rows
    row_vector: int = 1          # contiguous elements of a row a thread takes at a time
    cache_row: bool = True       # an input row read by several passes held in registers
    fuse_rows: bool = True       # consecutive stages over the same rows in one launch


def schedule_kernel(kernel, machine, config=None) -> L.PrimFunc:
    """The scheduled PrimFunc of a lowered kernel: its template (`template_for`) built with
    `config` (checked against the template's space: ConfigError outside it) or the
    template's default config."""
    template, problem = template_for(kernel, machine=machine)
    if config is None:
        config = template.default(problem, machine)
    else:
        config = template.space(problem, machine).check(config)
    kernel.schedule = (template.name, config)
    return template.build(problem, config, machine)


def template_for(kernel, target: str = "cuda", machine=None) -> tuple[Template, object]:
    """The template that schedules `kernel` on `target` (`machine`: the Target compiled for;
    its precision lets the tensor-core templates in), and the kernel's problem."""
    return choose_template(kernel, TEMPLATES, target, machine)


# -- the schedule --------------------------------------------------------------------------------


def stride_blocks(gpu: GPU) -> int:
    """The blocks of a grid-stride stage on `gpu` (STRIDE_BLOCKS_PER_SM a SM, rounded down
    to a power of two)."""
    return 1 << (STRIDE_BLOCKS_PER_SM * gpu.sms).bit_length() - 1


def schedule(func: L.PrimFunc, config, block_rows: bool = False, fuse: bool = False,
             gpu: GPU = REFERENCE) -> L.PrimFunc:
    """`func` with every stage bound to blocks and threads (see the module's docstring) on
    `gpu`."""
    names = _Names(func)
    workspace, body = stages(func.body)
    if fuse:
        body = fuse_row_loops(rows_first(body))
    scheduled = []
    for k, s in enumerate(body):
        others = body[:k] + body[k + 1:]
        scheduled.append(_stage(s, config, block_rows, names, _Scratch(workspace, others),
                                stride_blocks(gpu)))
    out = L.seq(*scheduled)
    used = {n.buffer.name for n in L.walk(out) if isinstance(n, (L.Load, L.Store))}
    for buffer in reversed(workspace):
        if buffer.name in used:   # (row scalars made registers leave theirs unused)
            out = L.Allocate(buffer, out)
    return L.PrimFunc(func.name, func.params, out, func.size_vars, func.attrs)


@dataclass(frozen=True)
class _Scratch:
    """A function's global scratch and the stages other than the one being scheduled."""

    workspace: list
    others: list

    def private_to_stage(self, name: str) -> bool:
        """Whether scratch `name` is touched by no other stage."""
        if name not in {b.name for b in self.workspace}:
            return False
        return not any(isinstance(n, (L.Load, L.Store)) and n.buffer.name == name
                       for s in self.others for n in L.walk(s))


class _Names:
    """Fresh variable and buffer names, distinct from every name of the function."""

    def __init__(self, func: L.PrimFunc):
        self.taken = {n.name for n in L.walk(func.body) if isinstance(n, L.Var)} | \
            {n.buffer.name for n in L.walk(func.body) if isinstance(n, (L.Allocate, L.Load))}
        self.count = itertools.count()

    def __call__(self, hint: str) -> str:
        while True:
            name = f"{hint}_{next(self.count)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def var(self, hint: str) -> L.Var:
        return L.Var(self(hint))


def _stage(s: L.Stmt, config, block_rows: bool, names: _Names, scratch: _Scratch,
           strided: int) -> L.Stmt:
    if isinstance(s, L.For):
        loop = _independent_prefix(s)
        if loop is not None and loop.extent.value > 0:   # (an empty tensor: one thread)
            if block_rows and _is_row_reduction(loop):
                return _on_rows(loop, config, names, scratch)
            return _thread_per_iteration(loop, config, names, strided)
    if config.reduce_threads > 1 and _reduction(s) is not None:
        layout = _Layout(None, 1, _pow2(config.reduce_threads), 1, 1)
        return _RowBuilder(layout, names, [s], {}, {}).build()
    return _single_thread(s, names)


def _independent_prefix(loop: L.For, allowed: frozenset = frozenset()) -> L.For | None:
    """`loop`'s outer loops that carry nothing (but buffers in `allowed`), level by level,
    fused into one (an iteration of the fused loop differs from another in some level, whose
    own index components then differ: no two touch one element); None when the outermost
    carries something."""
    depth = 0
    for level in levels(loop):
        if not carried(level) <= allowed:
            break
        depth += 1
    return fuse_levels(loop, depth) if depth else None


def _thread_per_iteration(loop: L.For, config, names: _Names, strided: int) -> L.Stmt:
    """`config.vector` consecutive iterations of `loop` a thread (one when 1), guarded; with
    `config.grid_stride`, on at most `strided` blocks."""
    n, vector = loop.extent.value, config.vector
    groups = -(-n // vector)
    threads = min(config.threads, -(-groups // WARP) * WARP)
    blocks = -(-groups // threads)
    b, t = names.var(f"{loop.var.name}_b"), names.var(f"{loop.var.name}_t")
    if config.grid_stride and blocks > strided:
        k = names.var(f"{loop.var.name}_k")
        steps = -(-groups // (strided * threads))
        group = (k * strided + b) * threads + t
        inner = L.For(k, steps, _vector(loop, group, steps * strided * threads, names,
                                        vector))
        return L.For(b, strided, L.For(t, threads, inner, L.ForKind.THREAD_X),
                     L.ForKind.BLOCK_X)
    return L.For(b, blocks, L.For(t, threads, _vector(loop, b * threads + t, blocks * threads,
                                                      names, vector),
                                  L.ForKind.THREAD_X), L.ForKind.BLOCK_X)


def _vector(loop: L.For, group: L.Expr, groups: int, names: _Names, vector: int) -> L.Stmt:
    """`loop`'s iterations group * vector + v for v < vector, guarded. When every group is
    whole (the extent a multiple of `vector`), operands read in the loop's own order are
    first copied into registers by a VECTORIZED loop each (`_vector_loads`), the iterations
    run unrolled with their results kept in registers (`_vector_stores`), and each output
    is stored from them by a VECTORIZED loop: one vector load or store where the renderer
    proves it aligned (group * vector is a multiple of `vector`). Otherwise every
    iteration runs on its own, guarded, with scalar accesses."""
    if vector == 1:
        return _guarded(loop, group, groups)
    n = loop.extent.value
    if n % vector:
        v = names.var(f"{loop.var.name}_v")
        return L.For(v, vector, _guarded(loop, group * vector + v, groups * vector),
                     L.ForKind.VECTORIZED)
    v = names.var(f"{loop.var.name}_v")
    copies, registers, body = _vector_loads(loop.body, loop.var, n, {loop.var}, v,
                                            group * vector, vector, names)
    body, stores = _vector_stores(body, loop.var, n, {loop.var}, v, vector, names)
    out = L.seq(*copies, L.For(v, vector, L.Let(loop.var, group * vector + v, body),
                               L.ForKind.UNROLLED),
                *_store_back(stores, loop.var, group * vector, vector, names))
    for reg in [*registers, *stores.values()]:
        out = L.Allocate(reg, out)
    return out if groups * vector == n else L.If(group < n // vector, out)


def _vector_loads(body: L.Stmt, var: L.Var, extent: int, free: set, lane: L.Var,
                  start: L.Expr, vector: int, names: _Names) -> tuple[list, list, L.Stmt]:
    """(copies, registers, `body` reading them) for `body` (an iteration of `var`'s loop, run
    for `var` = start + `lane`, `lane` < vector): each load of a global buffer `body` never
    stores, at an index of `free`'s variables only that runs in order with `var`
    (`runs_in_order`), copied into a register buffer of `vector` slots first by a
    VECTORIZED loop (one vector load where the renderer proves `start` aligned) and read
    from there (slot `lane`)."""
    stored = {x.buffer.name for x in L.walk(body) if isinstance(x, L.Store)}
    operands = sorted({
        x for x in L.walk(body) if isinstance(x, L.Load) and x.buffer.name not in stored
        and x.buffer.scope is L.Scope.GLOBAL and _index_vars(x) <= free
        and runs_in_order(x, var, extent)}, key=str)
    registers, copies = {}, []
    for load in operands:
        w = names.var(f"{var.name}_v")
        reg = L.Buffer(names(f"{load.buffer.name}_vec"), load.buffer.dtype, (vector,),
                       L.Scope.LOCAL)
        copies.append(L.For(w, vector, L.Store(reg, (w,), L.substitute(
            load, {var: start + w})), L.ForKind.VECTORIZED))
        registers[load] = reg
    body = L.transform(body, lambda x: L.Load(registers[x], (lane,))
                       if isinstance(x, L.Load) and x in registers else None)
    return copies, list(registers.values()), body


def _vector_stores(body: L.Stmt, var: L.Var, extent: int, free: set, lane: L.Var,
                   vector: int, names: _Names) -> tuple[L.Stmt, dict]:
    """`body` (an iteration of `var`'s loop, run for `vector` contiguous values of `var`,
    lane `lane`) with its stores of its own output element made to a register slot each
    (`lane`), and {store as it was: its register buffer}. A store is taken when it runs once
    every iteration (under no If and no inner loop), to a global buffer the body stores
    nowhere else and never reads, at an index of `free`'s variables only that runs in order
    with `var` (`runs_in_order`: contiguous lanes, contiguous elements)."""
    count: dict[str, int] = {}
    loaded = set()
    for n in L.walk(body):
        if isinstance(n, L.Store):
            count[n.buffer.name] = count.get(n.buffer.name, 0) + 1
        elif isinstance(n, L.Load):
            loaded.add(n.buffer.name)
    taken: dict[str, tuple[L.Store, L.Buffer]] = {}

    def visit(s: L.Stmt) -> None:
        if isinstance(s, L.Seq):
            for x in s.stmts:
                visit(x)
        elif isinstance(s, (L.Let, L.Allocate)):
            visit(s.body)
        elif isinstance(s, L.Store) and s.buffer.scope is L.Scope.GLOBAL and \
                count[s.buffer.name] == 1 and s.buffer.name not in loaded and \
                set().union(*(L.free_vars(i) for i in s.indices)) <= free and \
                runs_in_order(s, var, extent):
            reg = L.Buffer(names(f"{s.buffer.name}_out"), s.buffer.dtype, (vector,),
                           L.Scope.LOCAL)
            taken[s.buffer.name] = (s, reg)

    visit(body)
    if not taken:
        return body, {}

    def rule(n):
        if isinstance(n, L.Store) and n.buffer.name in taken:
            return L.Store(taken[n.buffer.name][1], (lane,), n.value)
        return None

    return L.transform(body, rule), dict(taken.values())


def _store_back(stores: dict, var: L.Var, start: L.Expr, vector: int, names: _Names
                ) -> list[L.Stmt]:
    """Each store of `stores` ({store: register}, `_vector_stores`) made for `var` = start
    + w, w < vector, from its register by a VECTORIZED loop (one vector store where the
    renderer proves `start` aligned)."""
    out = []
    for store, reg in stores.items():
        w = names.var(f"{var.name}_w")
        out.append(L.For(w, vector, L.Store(store.buffer, tuple(
            L.substitute(i, {var: start + w}) for i in store.indices), L.Load(reg, (w,))),
            L.ForKind.VECTORIZED))
    return out


def _guarded(loop: L.For, index: L.Expr, covered: int) -> L.Stmt:
    """`loop`'s body at `loop.var = index`, skipped past its extent (when `covered`, the
    indices launched, exceeds it)."""
    body = loop.body if covered == loop.extent.value else \
        L.If(loop.var < loop.extent.value, loop.body)
    return L.Let(loop.var, index, body)


def _single_thread(s: L.Stmt, names: _Names) -> L.Stmt:
    return L.For(names.var("b"), 1, L.For(names.var("t"), 1, s, L.ForKind.THREAD_X),
                 L.ForKind.BLOCK_X)


# -- rows on a row's threads ---------------------------------------------------------------------


def _reduction(s: L.Stmt):
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
    fused = _independent_prefix(loop, frozenset({acc.name}))
    return None if fused is None else (acc, init, fused, op, finish)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _row_parts(loop: L.For) -> list[L.Stmt]:
    return list(loop.body.stmts) if isinstance(loop.body, L.Seq) else [loop.body]


def _is_row_reduction(loop: L.For) -> bool:
    """Rows with a reduction long enough for a warp, along the row's own elements (a
    reduction across rows' columns, as a mean over NCHW's channels, reads coalesced one
    thread a row)."""
    for p in _row_parts(loop):
        found = _reduction(p)
        if found is None or (nest_work(found[2]) or 0) < MIN_ROW_WORK:
            continue
        strided = found[2]
        if any(steps_contiguously(n, strided.var, strided.extent.value)
               for n in L.walk(strided.body) if isinstance(n, L.Load)):
            return True
    return False


def _strided_loop(part: L.Stmt) -> L.For | None:
    """The loop of a row part its threads share: a reduction's, or an elementwise loop."""
    found = _reduction(part)
    if found is not None:
        return found[2]
    return _independent_prefix(part) if isinstance(part, L.For) else None


@dataclass(frozen=True)
class _Layout:
    """Rows on threads: `threads` a row (a power of two, at least a warp), `per_block` rows
    a block, `rows` rows, `row` the row's variable (None: a single row); a thread takes
    `vector` contiguous elements of the row at a time (element (k * threads + lane) *
    vector + v at step k)."""

    row: L.Var | None
    rows: int
    threads: int
    per_block: int
    vector: int

    def steps(self, length: int) -> int:
        """Steps of a thread over a row of `length` elements."""
        return -(-length // (self.threads * self.vector))

    @property
    def block_threads(self) -> int:
        return self.threads * self.per_block

    @property
    def blocks(self) -> int:
        return -(-self.rows // self.per_block)


def _on_rows(loop: L.For, config: RowsConfig, names: _Names, scratch: _Scratch) -> L.Stmt:
    """`loop`'s rows on `config.row_threads` threads each (see the module's docstring)."""
    threads = config.row_threads
    per_block = max(1, config.row_block // threads)
    layout = _Layout(loop.var, loop.extent.value, threads, min(per_block, loop.extent.value),
                     config.row_vector)
    parts = _row_parts(loop)
    private = _private_scalars(loop, parts, scratch, names)
    parts = [_rename(p, private) for p in parts]
    cache = _row_cache(loop, parts, layout, names) if config.cache_row else {}
    return _RowBuilder(layout, names, parts, private, cache).build()


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


def _private_scalars(loop: L.For, parts: list, scratch: _Scratch, names: _Names) -> dict:
    """Global scratch of one element a row (always accessed at one index of the row alone)
    that only this stage touches and only reductions' finishing statements store (every
    thread of the row runs those, and every lane holds the total): name -> the per-thread
    register buffer that replaces it."""
    finishing, other = set(), set()
    for p in parts:
        stores = {n.buffer.name for n in L.walk(p) if isinstance(n, L.Store)}
        found = _reduction(p)
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
        if set().union(*(L.free_vars(i) for i in index)) != {loop.var}:
            continue
        dtype = next(n.buffer.dtype for n in L.walk(loop.body)
                     if isinstance(n, L.Store) and n.buffer.name == name)
        out[name] = L.Buffer(names(f"{name}_reg"), dtype, (1,), L.Scope.LOCAL)
    return out


def _row_cache(loop: L.For, parts: list, layout: _Layout, names: _Names) -> dict:
    """Input elements of the row that two or more parts' strided loops read, at one index
    of the loop's variable (and the row's): (buffer name, index with the variable as `_J`)
    -> a per-thread register buffer of a slot per element the thread takes; none
    when the loops differ in length or the row would take more than MAX_CACHED registers a
    thread."""
    stored = {n.buffer.name for n in L.walk(loop.body) if isinstance(n, L.Store)}
    lengths, users, buffers = set(), {}, {}
    for p in parts:
        strided = _strided_loop(p)
        if strided is None:
            continue
        lengths.add(strided.extent.value)
        keys = set()
        for n in L.walk(strided.body):
            # (an index of the row's element alone: not of an inner loop's or a let's)
            if isinstance(n, L.Load) and n.buffer.name not in stored and \
                    strided.var in _index_vars(n) and \
                    _index_vars(n) <= {strided.var, loop.var}:
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


def _index_vars(load: L.Load) -> set:
    return set().union(*(L.free_vars(i) for i in load.indices))


_J = L.Var("J")
_V = L.Var("V")   # (a placeholder for a vector lane, substituted before use)


def _cache_key(load: L.Load, var: L.Var) -> tuple:
    return load.buffer.name, tuple(L.substitute(i, {var: _J}) for i in load.indices)


class _RowBuilder:
    """The statements of a row stage on `layout`: a block loop around thread loops, one per
    phase of the row (see the module's docstring)."""

    def __init__(self, layout: _Layout, names: _Names, parts: list, private: dict,
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
            stmt = L.Let(lay.row, self.block * lay.per_block + t // lay.threads
                         if lay.per_block > 1 else self.block, stmt)
        if lane is not t and lane in used:
            stmt = L.Let(lane, t % lay.threads, stmt)
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
        into registers first (`_vector_loads`) and its stores of them kept in registers and
        stored after (`_vector_stores`): one vector load or store each where the renderer
        proves it aligned."""
        lay = self.layout
        n = loop.extent.value
        steps = lay.steps(n)
        k = self.names.var(f"{loop.var.name}_k")
        kind = L.ForKind.UNROLLED if steps * lay.vector <= MAX_CACHED else L.ForKind.SERIAL
        covered = steps * lay.threads * lay.vector
        if lay.vector == 1:
            return L.For(k, steps, _guarded(L.For(loop.var, loop.extent, self._cached(
                loop, k)), k * lay.threads + lane, covered), kind)
        v = self.names.var(f"{loop.var.name}_v")
        body = self._cached(loop, k * lay.vector + v)
        if n % lay.vector:
            return L.For(k, steps, L.For(v, lay.vector, _guarded(
                L.For(loop.var, loop.extent, body), (k * lay.threads + lane) * lay.vector + v,
                covered), L.ForKind.UNROLLED), kind)
        group = k * lay.threads + lane
        free = {loop.var} | ({lay.row} if lay.row is not None else set())
        copies, registers, body = _vector_loads(body, loop.var, n, free, v, group * lay.vector,
                                                lay.vector, self.names)
        body, stores = _vector_stores(body, loop.var, n, free, v, lay.vector, self.names)
        registers += stores.values()
        self.own |= {reg.name for reg in registers}
        out = L.seq(*copies,
                    L.For(v, lay.vector, L.Let(loop.var, group * lay.vector + v, body),
                          L.ForKind.UNROLLED),
                    *_store_back(stores, loop.var, group * lay.vector, lay.vector,
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
        length = next(_strided_loop(p) for p in self.parts
                      if _strided_loop(p) is not None).extent.value
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
                body = _guarded(L.For(j, length, L.seq(*copies(j, k))), group, covered)
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
                body = L.For(v, lay.vector, _guarded(L.For(j, length, L.seq(*copies(
                    j, k * lay.vector + v))), group * lay.vector + v, covered),
                    L.ForKind.UNROLLED)
            return self._row_guard(L.For(k, steps, body, L.ForKind.UNROLLED))

        return self._threads(fill, guard=False)

    # -- parts of a row ----------------------------------------------------------------------

    def _part(self, part: L.Stmt) -> list[L.Stmt]:
        found = _reduction(part)
        if found is not None:
            return self._reduce(*found)
        inner = _independent_prefix(part) if isinstance(part, L.For) else None
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
        for mask in (16, 8, 4, 2, 1):   # every lane ends with the warp's total
            shuffled = L.call("shfl_xor", acc[0], L.const(mask, T.int32))
            out.append(self._threads(lambda t, lane, s=shuffled: L.Store(
                acc, zero, L.BinOp(op, acc[0], s)), guard=False))
        warps = lay.threads // WARP
        if warps > 1:
            part = L.Buffer(self.names(f"{acc.name}_warps"), acc.dtype,
                            (lay.per_block * warps,), L.Scope.SHARED)
            self.shared.append(part)
            w = self.names.var("w")
            out += [self._threads(lambda t, lane: L.If(L.eq(t % WARP, 0), L.Store(
                        part, (t // WARP,), acc[0])), guard=False),
                    L.Barrier(),
                    self._threads(lambda t, lane: L.seq(init, L.For(w, warps, L.Store(
                        acc, zero, L.BinOp(op, acc[0], part[t // lay.threads * warps + w])),
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


# -- templates and the table ---------------------------------------------------------------------


def default_space(p: problems.Rows, machine) -> Space:
    return Space("cuda_default", Config, {
        "threads": THREADS, "grid_stride": (False, True),
        "reduce_threads": (1, *THREADS), "vector": VECTOR})


VECTOR_FROM = 1 << 20
"""Elements of output from which the default config takes `LARGE_VECTOR` contiguous
iterations a thread: on an H100 a fused chain over 256 MiB ran at 0.77 of copy bandwidth
one a thread, 0.83 two, 0.48 four, stores then scalar (four a thread: stores strided by
4, badly coalesced; bench/gpu_kernels.py); below this size a kernel is launch-bound and
more threads are as good."""

LARGE_VECTOR = 4
"""`vector` of the default config on outputs of VECTOR_FROM elements or more, when their
size is a multiple: with vector stores, 4 is one float4 load and store a thread (H100, the
256 MiB chain, 1, 2 and 4 timed in turn: 2 0.94 of copy, 4 1.00)."""


def default_config(p: problems.Rows, machine) -> Config:
    """Config(), with `vector` LARGE_VECTOR on a large output of a size it divides
    (VECTOR_FROM)."""
    sizes = [math.prod(d.value for d in b.shape) for b in p.func.params
             if all(isinstance(d, L.Const) for d in b.shape)]
    largest = max(sizes, default=0)
    return Config(vector=LARGE_VECTOR) \
        if largest >= VECTOR_FROM and largest % LARGE_VECTOR == 0 else Config()


def default_build(p: problems.Rows, config: Config, machine) -> L.PrimFunc:
    return schedule(p.func, config, gpu=gpu_of(machine))


def rows_space(p: problems.Rows, machine) -> Space:
    return Space("cuda_rows", RowsConfig, {
        "threads": THREADS, "grid_stride": (False, True), "reduce_threads": (1, *THREADS),
        "vector": VECTOR, "row_threads": ROW_THREADS, "row_block": ROW_THREADS,
        "row_vector": VECTOR, "cache_row": (False, True), "fuse_rows": (False, True)})


def rows_default(p: problems.Rows, machine) -> RowsConfig:
    """ELEMS_PER_THREAD of the longest row's elements a thread, at least a warp a row, at
    most 1024 threads; blocks of at least 128 threads (several rows of a warp each); the
    widest `row_vector` the row allows (`_widest_vector`)."""
    length = max((_strided_loop(part).extent.value for loop in _row_loops(p)
                  for part in _row_parts(loop) if _reduction(part) is not None), default=0)
    threads = min(1024, max(WARP, _pow2(-(-length // ELEMS_PER_THREAD))))
    return RowsConfig(row_threads=threads, row_block=max(128, threads),
                      row_vector=_widest_vector(length, threads))


def _widest_vector(length: int, threads: int) -> int:
    """The widest of VECTOR dividing a row of `length` (every group whole: vector loads and
    stores) and at most a thread's share of it (no lane idle for want of a whole group): a
    softmax row of 128 on a warp 4, a layernorm row of 768 on 128 threads 4, 770 2, odd 1.
    On an H100 a softmax of [8, 12, 128, 128] ran at 0.62 of copy bandwidth with
    `row_vector` 1 and 0.86 with 2, stores then still scalar (bench/gpu_kernels.py)."""
    share = -(-length // threads)
    return max(v for v in VECTOR if length % v == 0 and v <= max(1, share))


def rows_build(p: problems.Rows, config: RowsConfig, machine) -> L.PrimFunc:
    return schedule(p.func, config, block_rows=True, fuse=config.fuse_rows,
                    gpu=gpu_of(machine))


def _row_loops(p: problems.Rows) -> list[L.For]:
    """The stages (their outer loops flattened) that are row reductions."""
    out = []
    for s in rows_first(stages(p.func.body)[1]):
        loop = _independent_prefix(s) if isinstance(s, L.For) else None
        if loop is not None and _is_row_reduction(loop):
            out.append(loop)
    return out


DEFAULT = Template("cuda_default", problems.rows, lambda p: True, default_space,
                   default_config, default_build)
ROWS = Template("cuda_rows", problems.rows, lambda p: bool(_row_loops(p)), rows_space,
                rows_default, rows_build)

TEMPLATES = {
    **{("cuda", pattern): (ROWS, DEFAULT) for pattern in Pattern},
    # dense and ungrouped conv tiled (on tensor cores at a reduced precision: mma.py, skipped
    # at fp32), products of few rows split along k (gemv), attention in one kernel
    # (attention.py); the rest (depthwise) one thread per output element (a block per output
    # would idle most of its threads on a short reduction)
    ("cuda", Pattern.OUT_FUSABLE): (MMA_DENSE, DENSE, GEMV, MMA_CONV2D, CONV2D, ATTENTION,
                                    DEFAULT),
}
"""(target name, anchor pattern) -> the templates tried in order: ROWS where a kernel has
row reductions worth a warp or more a row, DEFAULT (every kernel) otherwise."""
