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
  (`loop_analysis.carried`, level by level) has them flattened into one index, one thread
  per iteration (`threads` a block; with `grid_stride`, at most `STRIDE_BLOCKS` blocks each
  looping), its inner loops serial in the thread. A stage that is a whole-tensor reduction
  (`acc = identity; for ...: acc = acc op f(...); out = g(acc)`) runs on one block of
  `reduce_threads` threads: each thread reduces a strided share into its own accumulator,
  then a tree in shared memory combines them (log2(threads) barrier-separated steps) and
  thread 0 finishes; `reduce_threads=1` runs it on one thread. Anything else runs on one
  thread (correct, slow: the last resort, e.g. an argmax's paired accumulators).
- `ROWS` (kernels with row reductions, as softmax, layernorm, a reduce over the last axis):
  consecutive stages over the same rows become one (`loop_analysis.fuse_row_loops`), and a
  row stage whose rows are few (at most `MAX_BLOCK_ROWS`) and long (at least `MIN_ROW_WORK`
  iterations) runs one block per row: each reduction of the row as above on `row_threads`
  threads, each elementwise loop of the row strided over the threads (consecutive threads,
  consecutive elements: coalesced), a barrier between the parts. Other stages as DEFAULT.

Warp shuffles, vector loads, and tiled dense / conv templates are not written yet (the IR
has no shuffle primitive; dense and conv run as one thread per output element).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...ir import loop as L
from ...ir.ops.registry import Pattern
from .. import problems
from ..loop_analysis import carried, fuse_row_loops, fuse_until, nest_work, update_op
from ..space import Space, Template, choose_template
from .codegen import stages
from .conv import CONV2D
from .dense import DENSE
from .gemv import GEMV

# blocks of a grid-stride stage at most: 8 per SM of an H100 (132 SMs), rounded
STRIDE_BLOCKS = 1024
# a row stage runs one block per row when it has at most this many rows, each of at least
# MIN_ROW_WORK iterations; more or shorter rows keep every SM busy one thread per row
MAX_BLOCK_ROWS = 1 << 15
MIN_ROW_WORK = 64
THREADS = (64, 128, 256, 512, 1024)
_IDEMPOTENT = ("max", "min", "and", "or")
_IDENTITY = {"+": 0, "*": 1}


@dataclass(frozen=True)
class Config:
    """Knobs of the default template."""

    threads: int = 256           # threads per block of a thread-per-iteration stage
    grid_stride: bool = False    # at most STRIDE_BLOCKS blocks, each looping over the rest
    reduce_threads: int = 256    # one block's threads for a whole-tensor reduction (1: one)


@dataclass(frozen=True)
class RowsConfig:
    """Knobs of the row-reduction template."""

    threads: int = 256
    grid_stride: bool = False
    reduce_threads: int = 256
    row_threads: int = 256       # threads of a row's block (a power of two: the tree)
    fuse_rows: bool = True       # consecutive stages over the same rows in one launch


def schedule_kernel(kernel, machine, config=None) -> L.PrimFunc:
    """The scheduled PrimFunc of a lowered kernel: its template (`template_for`) built with
    `config` (checked against the template's space: ConfigError outside it) or the
    template's default config."""
    template, problem = template_for(kernel)
    if config is None:
        config = template.default(problem, machine)
    else:
        config = template.space(problem, machine).check(config)
    return template.build(problem, config, machine)


def template_for(kernel, target: str = "cuda") -> tuple[Template, object]:
    """The template that schedules `kernel` on `target`, and the kernel's problem."""
    return choose_template(kernel, TEMPLATES, target)


# -- the schedule --------------------------------------------------------------------------------


def schedule(func: L.PrimFunc, config, block_rows: bool = False, fuse: bool = False
             ) -> L.PrimFunc:
    """`func` with every stage bound to blocks and threads (see the module's docstring)."""
    names = _Names(func)
    workspace, body = stages(func.body)
    if fuse:
        body = fuse_row_loops([_rows_first(s) for s in body])
    out = L.seq(*(_stage(s, config, block_rows, names) for s in body))
    for buffer in reversed(workspace):
        out = L.Allocate(buffer, out)
    return L.PrimFunc(func.name, func.params, out, func.size_vars, func.attrs)


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


def _stage(s: L.Stmt, config, block_rows: bool, names: _Names) -> L.Stmt:
    if isinstance(s, L.For):
        loop = _independent_prefix(s)
        if loop is not None and loop.extent.value > 0:   # (an empty tensor: one thread)
            if block_rows and _is_row_reduction(loop):
                return _block_per_row(loop, config.row_threads, names)
            return _thread_per_iteration(loop, config, names)
    if config.reduce_threads > 1:
        red = _block_reduction(s, config.reduce_threads, names)
        if red is not None:
            allocs, parts = red
            return L.For(names.var("b"), 1, _wrap(allocs, L.seq(*parts)), L.ForKind.BLOCK_X)
    return _single_thread(s, names)


def _levels(loop: L.For) -> list[L.For]:
    """The perfectly nested loops of constant extent from `loop` inwards."""
    out = [loop]
    while isinstance(out[-1].body, L.For) and isinstance(out[-1].body.extent, L.Const):
        out.append(out[-1].body)
    return out if isinstance(loop.extent, L.Const) else []


def _fuse_levels(loop: L.For, depth: int) -> L.For:
    """The first `depth` perfectly nested loops of `loop` as one loop."""
    for _ in range(depth - 1):
        loop = fuse_until(loop, loop.extent.value * loop.body.extent.value)
    return loop


def _independent_prefix(loop: L.For, allowed: frozenset = frozenset()) -> L.For | None:
    """`loop`'s outer loops that carry nothing (but buffers in `allowed`), level by level,
    fused into one (an iteration of the fused loop differs from another in some level, whose
    own index components then differ: no two touch one element); None when the outermost
    carries something."""
    depth = 0
    for level in _levels(loop):
        if not carried(level) <= allowed:
            break
        depth += 1
    return _fuse_levels(loop, depth) if depth else None


def _rows_first(s: L.Stmt) -> L.Stmt:
    """A stage's outer loops flattened down to its reductions (an elementwise stage: as far
    as the row count of a reduction stage, `fuse_row_loops` finds them equal then)."""
    if not isinstance(s, L.For):
        return s
    levels = _levels(s)
    if not levels or isinstance(levels[-1].body, L.Store):
        return s   # an elementwise stage: fused against its neighbours below
    return _fuse_levels(s, len(levels))


def _thread_per_iteration(loop: L.For, config, names: _Names) -> L.Stmt:
    """One thread per iteration of `loop`: `loop.var` = its global thread index, guarded."""
    n = loop.extent.value
    threads = min(config.threads, -(-n // 32) * 32)
    blocks = -(-n // threads)
    b, t = names.var(f"{loop.var.name}_b"), names.var(f"{loop.var.name}_t")
    if config.grid_stride and blocks > STRIDE_BLOCKS:
        k = names.var(f"{loop.var.name}_k")
        steps = -(-n // (STRIDE_BLOCKS * threads))
        index = (k * STRIDE_BLOCKS + b) * threads + t
        inner = L.For(k, steps, _guarded(loop, index, steps * STRIDE_BLOCKS * threads))
        return L.For(b, STRIDE_BLOCKS, L.For(t, threads, inner, L.ForKind.THREAD_X),
                     L.ForKind.BLOCK_X)
    return L.For(b, blocks, L.For(t, threads, _guarded(loop, b * threads + t, blocks * threads),
                                  L.ForKind.THREAD_X), L.ForKind.BLOCK_X)


def _guarded(loop: L.For, index: L.Expr, covered: int) -> L.Stmt:
    """`loop`'s body at `loop.var = index`, skipped past its extent (when `covered`, the
    indices launched, exceeds it)."""
    body = loop.body if covered == loop.extent.value else \
        L.If(loop.var < loop.extent.value, loop.body)
    return L.Let(loop.var, index, body)


def _single_thread(s: L.Stmt, names: _Names) -> L.Stmt:
    return L.For(names.var("b"), 1, L.For(names.var("t"), 1, s, L.ForKind.THREAD_X),
                 L.ForKind.BLOCK_X)


# -- reductions on a block -----------------------------------------------------------------------


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


def _block_reduce(s: L.Stmt, threads: int, names: _Names):
    """The statements reducing `s` (a `_reduction`) on `threads` threads of one block, and
    the shared buffer they use; None when `s` is not one."""
    found = _reduction(s)
    if found is None:
        return None
    acc, init, loop, op, finish = found
    red = L.Buffer(names(f"{acc.name}_red"), acc.dtype, (L.const(threads),), L.Scope.SHARED)
    t = names.var("t")
    steps = -(-loop.extent.value // threads)
    k = names.var(f"{loop.var.name}_k")
    strided = L.For(k, steps, _guarded(loop, k * threads + t, steps * threads))
    zero = (L.const(0),)
    parts = [L.For(t, threads, L.Allocate(acc, L.seq(init, strided, L.Store(red, (t,), acc[0]))),
                   L.ForKind.THREAD_X), L.Barrier()]
    half = threads // 2
    while half >= 1:   # the tree: threads combine pairs, half as many each step
        u = names.var("t")
        parts += [L.For(u, half, L.Store(red, (u,), L.BinOp(op, red[u], red[u + half])),
                        L.ForKind.THREAD_X), L.Barrier()]
        half //= 2
    last = names.var("t")
    parts.append(L.For(last, 1, L.Allocate(acc, L.seq(L.Store(acc, zero, red[0]), *finish)),
                       L.ForKind.THREAD_X))
    return red, parts


def _block_reduction(s: L.Stmt, threads: int, names: _Names):
    """A whole stage reduced on one block: (shared buffers, statements) or None."""
    out = _block_reduce(s, _pow2(threads), names)
    if out is None:
        return None
    red, parts = out
    return [red], parts


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _row_parts(loop: L.For) -> list[L.Stmt]:
    return list(loop.body.stmts) if isinstance(loop.body, L.Seq) else [loop.body]


def _is_row_reduction(loop: L.For) -> bool:
    """Few rows, each with a long reduction: a block per row pays."""
    if loop.extent.value > MAX_BLOCK_ROWS:
        return False
    return any(_reduction(p) is not None and (nest_work(p) or 0) >= MIN_ROW_WORK
               for p in _row_parts(loop))


def _block_per_row(loop: L.For, row_threads: int, names: _Names) -> L.Stmt:
    """One block per iteration of `loop` (a row): its reductions on the block's threads, its
    elementwise loops strided over them, thread 0 doing what is neither; barriers between."""
    work = max((nest_work(p) or 1) for p in _row_parts(loop))
    threads = max(32, min(row_threads, _pow2(work)))
    allocs: list[L.Buffer] = []
    body: list[L.Stmt] = []
    for part in _row_parts(loop):
        if body:
            body.append(L.Barrier())
        reduced = _block_reduce(part, threads, names)
        if reduced is not None:
            allocs.append(reduced[0])
            body += reduced[1]
            continue
        inner = _independent_prefix(part) if isinstance(part, L.For) else None
        if inner is not None:
            t = names.var("t")
            k = names.var(f"{inner.var.name}_k")
            steps = -(-inner.extent.value // threads)
            body.append(L.For(t, threads, L.For(k, steps, _guarded(
                inner, k * threads + t, steps * threads)), L.ForKind.THREAD_X))
        else:
            body.append(L.For(names.var("t"), 1, part, L.ForKind.THREAD_X))
    return L.For(loop.var, loop.extent, _wrap(allocs, L.seq(*body)), L.ForKind.BLOCK_X)


def _wrap(allocs: list[L.Buffer], body: L.Stmt) -> L.Stmt:
    for buffer in reversed(allocs):
        body = L.Allocate(buffer, body)
    return body


# -- templates and the table ---------------------------------------------------------------------


def default_space(p: problems.Rows, machine) -> Space:
    return Space("cuda_default", Config, {
        "threads": THREADS, "grid_stride": (False, True),
        "reduce_threads": (1, *THREADS)})


def default_build(p: problems.Rows, config: Config, machine) -> L.PrimFunc:
    return schedule(p.func, config)


def rows_space(p: problems.Rows, machine) -> Space:
    return Space("cuda_rows", RowsConfig, {
        "threads": THREADS, "grid_stride": (False, True), "reduce_threads": (1, *THREADS),
        "row_threads": (32, *THREADS), "fuse_rows": (False, True)})


def rows_build(p: problems.Rows, config: RowsConfig, machine) -> L.PrimFunc:
    return schedule(p.func, config, block_rows=True, fuse=config.fuse_rows)


def _has_row_reduction(p: problems.Rows) -> bool:
    """Whether some stage (its outer loops flattened) is a row reduction a block pays for."""
    _, body = stages(p.func.body)
    for s in body:
        s = _rows_first(s)
        loop = _independent_prefix(s) if isinstance(s, L.For) else None
        if loop is not None and _is_row_reduction(loop):
            return True
    return False


DEFAULT = Template("cuda_default", problems.rows, lambda p: True, default_space,
                   lambda p, machine: Config(), default_build)
ROWS = Template("cuda_rows", problems.rows, _has_row_reduction, rows_space,
                lambda p, machine: RowsConfig(), rows_build)

TEMPLATES = {
    **{("cuda", pattern): (ROWS, DEFAULT) for pattern in Pattern},
    # dense and ungrouped conv tiled, products of few rows split along k (gemv); the rest
    # (depthwise) one thread per output element (a
    # block per output would idle most of its threads on a short reduction)
    ("cuda", Pattern.OUT_FUSABLE): (DENSE, GEMV, CONV2D, DEFAULT),
}
"""(target name, anchor pattern) -> the templates tried in order: ROWS where a kernel has
row reductions worth a block per row, DEFAULT (every kernel) otherwise."""
