"""A cuda stage's iterations on threads: the default template's binding of a stage's
independent loops to blocks and threads (`thread_per_iteration`, with `vector` contiguous
iterations a thread through register copies, `vector_loads` / `vector_stores`), a stage on
one thread (`single_thread`), and what the schedules share: fresh names (`Names`), the
function's scratch (`Scratch`).

`schedules.py` chooses which of these a stage gets (and `rows.py` the row template's); this
module never chooses a template or a config, and never renders code.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...ir import loop as L
from ..loop_analysis import carried, fuse_levels, levels, runs_in_order

WARP = 32


@dataclass(frozen=True)
class Config:
    """Knobs of the default template."""

    threads: int = 256           # threads per block of a thread-per-iteration stage
    grid_stride: bool = False    # at most `stride_blocks` blocks, each looping over the rest
    reduce_threads: int = 256    # one block's threads for a whole-tensor reduction (1: one)
    vector: int = 1              # contiguous iterations a thread of a thread-per-iteration stage


@dataclass(frozen=True)
class Scratch:
    """A function's global scratch and the stages other than the one being scheduled."""

    workspace: list
    others: list

    def private_to_stage(self, name: str) -> bool:
        """Whether scratch `name` is touched by no other stage."""
        if name not in {b.name for b in self.workspace}:
            return False
        return not any(isinstance(n, (L.Load, L.Store)) and n.buffer.name == name
                       for s in self.others for n in L.walk(s))


class Names:
    """Fresh variable and buffer names, distinct from every name of the function (or of the
    statement or expression given: fresh where their scopes nest inside it)."""

    def __init__(self, func: L.PrimFunc | L.Stmt | L.Expr):
        body = func.body if isinstance(func, L.PrimFunc) else func
        self.taken = {n.name for n in L.walk(body) if isinstance(n, L.Var)} | \
            {n.buffer.name for n in L.walk(body) if isinstance(n, (L.Allocate, L.Load))}
        self.count = itertools.count()

    def __call__(self, hint: str) -> str:
        while True:
            name = f"{hint}_{next(self.count)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def var(self, hint: str) -> L.Var:
        return L.Var(self(hint))


def independent_prefix(loop: L.For, allowed: frozenset = frozenset()) -> L.For | None:
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


def thread_per_iteration(loop: L.For, config, names: Names, strided: int) -> L.Stmt:
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


def _vector(loop: L.For, group: L.Expr, groups: int, names: Names, vector: int) -> L.Stmt:
    """`loop`'s iterations group * vector + v for v < vector, guarded. When every group is
    whole (the extent a multiple of `vector`), operands read in the loop's own order are
    first copied into registers by a VECTORIZED loop each (`vector_loads`), the iterations
    run unrolled with their results kept in registers (`vector_stores`), and each output
    is stored from them by a VECTORIZED loop: one vector load or store where the renderer
    proves it aligned (group * vector is a multiple of `vector`). Otherwise every
    iteration runs on its own, guarded, with scalar accesses."""
    if vector == 1:
        return guarded(loop, group, groups)
    n = loop.extent.value
    if n % vector:
        v = names.var(f"{loop.var.name}_v")
        return L.For(v, vector, guarded(loop, group * vector + v, groups * vector),
                     L.ForKind.VECTORIZED)
    v = names.var(f"{loop.var.name}_v")
    copies, registers, body = vector_loads(loop.body, loop.var, n, {loop.var}, v,
                                            group * vector, vector, names)
    body, stores = vector_stores(body, loop.var, n, {loop.var}, v, vector, names)
    out = L.seq(*copies, L.For(v, vector, L.Let(loop.var, group * vector + v, body),
                               L.ForKind.UNROLLED),
                *store_back(stores, loop.var, group * vector, vector, names))
    for reg in [*registers, *stores.values()]:
        out = L.Allocate(reg, out)
    return out if groups * vector == n else L.If(group < n // vector, out)


def vector_loads(body: L.Stmt, var: L.Var, extent: int, free: set, lane: L.Var,
                  start: L.Expr, vector: int, names: Names) -> tuple[list, list, L.Stmt]:
    """(copies, registers, `body` reading them) for `body` (an iteration of `var`'s loop, run
    for `var` = start + `lane`, `lane` < vector): each load of a global buffer `body` never
    stores, at an index of `free`'s variables only that runs in order with `var`
    (`runs_in_order`), copied into a register buffer of `vector` slots first by a
    VECTORIZED loop (one vector load where the renderer proves `start` aligned) and read
    from there (slot `lane`)."""
    stored = {x.buffer.name for x in L.walk(body) if isinstance(x, L.Store)}
    operands = sorted({
        x for x in L.walk(body) if isinstance(x, L.Load) and x.buffer.name not in stored
        and x.buffer.scope is L.Scope.GLOBAL and index_vars(x) <= free
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


def vector_stores(body: L.Stmt, var: L.Var, extent: int, free: set, lane: L.Var,
                   vector: int, names: Names) -> tuple[L.Stmt, dict]:
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


def store_back(stores: dict, var: L.Var, start: L.Expr, vector: int, names: Names
                ) -> list[L.Stmt]:
    """Each store of `stores` ({store: register}, `vector_stores`) made for `var` = start
    + w, w < vector, from its register by a VECTORIZED loop (one vector store where the
    renderer proves `start` aligned)."""
    out = []
    for store, reg in stores.items():
        w = names.var(f"{var.name}_w")
        out.append(L.For(w, vector, L.Store(store.buffer, tuple(
            L.substitute(i, {var: start + w}) for i in store.indices), L.Load(reg, (w,))),
            L.ForKind.VECTORIZED))
    return out


def guarded(loop: L.For, index: L.Expr, covered: int) -> L.Stmt:
    """`loop`'s body at `loop.var = index`, skipped past its extent (when `covered`, the
    indices launched, exceeds it)."""
    body = loop.body if covered == loop.extent.value else \
        L.If(loop.var < loop.extent.value, loop.body)
    return L.Let(loop.var, index, body)


def single_thread(s: L.Stmt, names: Names) -> L.Stmt:
    return L.For(names.var("b"), 1, L.For(names.var("t"), 1, s, L.ForKind.THREAD_X),
                 L.ForKind.BLOCK_X)




def index_vars(load: L.Load) -> set:
    return set().union(*(L.free_vars(i) for i in load.indices))
