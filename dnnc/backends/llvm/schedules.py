"""Schedules for the LLVM backend: which loops run in parallel, which are vectorised.

A schedule is chosen per kernel from its anchor op's pattern (a table, not an `if` chain) and
applied to the lowered PrimFunc. This first template set is the default for every pattern:
each stage's outermost loops are fused into one parallel loop when the stage does enough work
to pay for waking the worker pool, and the innermost loop is marked vectorised (LLVM's loop
vectorizer does the rest for the host's vector width). Tiled templates for dense, conv and
pooling (issue 4) plug into the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L

# a parallel region costs a few microseconds to start; below this many inner iterations
# a stage stays serial
MIN_PARALLEL_WORK = 1 << 15


@dataclass(frozen=True)
class Config:
    """Knobs of the default template."""

    parallel: bool = True
    min_parallel_work: int = MIN_PARALLEL_WORK


def default_schedule(func: L.PrimFunc, config: Config = Config(), threads: int = 1
                     ) -> L.PrimFunc:
    body = _schedule_stmt(func.body, config, threads)
    return L.PrimFunc(func.name, func.params, body, func.size_vars, func.attrs)


SCHEDULES = {}
"""anchor pattern -> schedule function; patterns without an entry use `default_schedule`."""


def schedule(func: L.PrimFunc, pattern, threads: int, config: Config | None = None
             ) -> L.PrimFunc:
    fn = SCHEDULES.get(pattern, default_schedule)
    return fn(func, config or Config(), threads)


def _schedule_stmt(s: L.Stmt, config: Config, threads: int) -> L.Stmt:
    if isinstance(s, L.Seq):
        return L.seq(*(_schedule_stmt(x, config, threads) for x in s.stmts))
    if isinstance(s, L.Allocate):
        return L.Allocate(s.buffer, _schedule_stmt(s.body, config, threads))
    if isinstance(s, L.For):
        return _schedule_nest(s, config, threads)
    return s


def _nest_work(s: L.Stmt) -> int | None:
    """Iterations of the innermost statements of a loop nest (None when symbolic)."""
    if isinstance(s, L.For):
        if not isinstance(s.extent, L.Const):
            return None
        inner = _nest_work(s.body)
        return None if inner is None else s.extent.value * inner
    if isinstance(s, L.Seq):
        parts = [_nest_work(x) for x in s.stmts]
        return None if any(p is None for p in parts) else max(sum(parts), 1)
    if isinstance(s, (L.Allocate, L.Let)):
        return _nest_work(s.body)
    if isinstance(s, L.If):
        return _nest_work(s.then)
    return 1


def _schedule_nest(loop: L.For, config: Config, threads: int) -> L.For:
    work = _nest_work(loop)
    if config.parallel and threads > 1 and (work is None or work >= config.min_parallel_work):
        loop = _fuse_outer(loop, threads)
        return L.For(loop.var, loop.extent, loop.body, L.ForKind.PARALLEL)
    return loop


def _fuse_outer(loop: L.For, threads: int) -> L.For:
    """Fuse perfectly nested outer loops until there are enough iterations to share out
    (an N=1 batch loop alone would leave every core but one idle)."""
    want = 4 * threads
    extent = loop.extent
    if not isinstance(extent, L.Const) or extent.value >= want:
        return loop
    inner = loop.body
    if not isinstance(inner, L.For) or not isinstance(inner.extent, L.Const):
        return loop
    n_in = inner.extent.value
    fused = L.Var(f"{loop.var.name}_{inner.var.name}")
    body = L.substitute(inner.body, {loop.var: fused // n_in, inner.var: fused % n_in})
    merged = L.For(fused, L.const(extent.value * n_in), body)
    return _fuse_outer(merged, threads)


def _dense(kernel, cpu, threads):
    from .dense import dense_schedule

    return dense_schedule(kernel, cpu.vector_bits, threads)


def _conv2d(kernel, cpu, threads):
    from .conv import conv2d_schedule, depthwise_schedule

    return conv2d_schedule(kernel, cpu.vector_bits, threads) or \
        depthwise_schedule(kernel, cpu.vector_bits, threads)


TEMPLATES = {"MatMul": _dense, "Gemm": _dense, "MatMulPacked": _dense, "Conv": _conv2d,
             "ConvPacked": _conv2d}
"""anchor op -> template building the kernel's PrimFunc (None: not applicable)."""


def schedule_kernel(kernel, cpu, threads: int) -> L.PrimFunc:
    """The scheduled PrimFunc of a lowered kernel: the anchor op's template where one applies,
    else the default schedule of its pattern."""
    from ...ir.ops.registry import get_op

    anchor = kernel.anchor
    template = TEMPLATES.get(anchor.op)
    if template is not None:
        func = template(kernel, cpu, threads)
        if func is not None:
            return func
    return schedule(kernel.func, get_op(anchor.op).pattern, threads)
