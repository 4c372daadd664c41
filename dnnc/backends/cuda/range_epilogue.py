"""A producer's range epilogue: the kernel that stores x also writes the partials of x's
range (DynamicRange, fused after the producer by fuse_ops' `take_ranges`), so that the
DynamicQuantizeLinear reading x is one launch (`dynamic_quantize.py`: it reduces the
partials, then quantizes) instead of two (its first read x once more only for its range).

The producer's kernel is scheduled by its own template as if the DynamicRange were not there
(`unranged`), then `with_range` rewrites the launch that stores x: each thread keeps a
running max and min from 0 of the values it stores (registers: after a vector store, an
unrolled copy of its loop over the same registers), and at the end of the block the block's
range is met as the quantization's launches meet theirs (`BlockRange`: warp shuffles, one
shared exchange, one barrier) and thread 0 writes it into the partials, block b into columns
b, b + blocks, ... (every column written each call, so none is stale). The quantization's
max and min of the columns are x's max and min widened to 0, exactly (max and min are exact
in any order): its results are the reference's bit for bit, and x's values are untouched.

This module builds loop IR; it never renders C, never launches, never chooses a template.
"""

from __future__ import annotations

import dataclasses
import math

from ...errors import ConfigError
from ...ir import loop as L
from ...ir import types as T
from ..lower import Kernel, lower_group
from ..space import Template
from .codegen import launch_dims, stages
from .dynamic_quantize import BlockRange
from .threads import WARP


def ranged(kernel: Kernel) -> bool:
    """Whether `kernel`'s group ends in a DynamicRange (its producer's range epilogue)."""
    return kernel.nodes[-1].op == "DynamicRange" and len(kernel.nodes) > 1


def unranged(kernel: Kernel) -> Kernel:
    """The kernel of the group without its DynamicRange (what the producer's template
    schedules): the same inputs and sites, the outputs but the range."""
    parts = kernel.nodes[-1].outputs[0]
    return lower_group(kernel.nodes[:-1], kernel.name,
                       outputs=[v for v in kernel.outputs if v is not parts],
                       sites=kernel.sites[:-1] if kernel.sites else None)


def ranging(template: Template, kernel: Kernel) -> Template:
    """`template` (chosen for `unranged(kernel)`) building `kernel`: its build, then
    `with_range`."""
    node = kernel.nodes[-1]
    x, parts = kernel.names[id(node.inputs[0])], kernel.names[id(node.outputs[0])]
    params = kernel.func.params

    def build(problem, config, machine):
        return with_range(template.build(problem, config, machine), x, parts, params)

    return dataclasses.replace(template, build=build)


def with_range(func: L.PrimFunc, x: str, parts: str, params: tuple) -> L.PrimFunc:
    """`func` (storing buffer `x` in one launch of blocks and threads along x only) also
    writing x's range partials to `parts`; its parameters `params` (the ranged kernel's)."""
    workspace, launches = stages(func.body)
    storing = [k for k, s in enumerate(launches) if _stores(s, x)]
    if len(storing) != 1:
        raise ConfigError(f"{func.name}: a range epilogue needs x stored by one launch, "
                          f"not {len(storing)}")
    k = storing[0]
    (blocks, gy, gz), (threads, ty, tz) = launch_dims(launches[k], func.name)
    block = launches[k]
    if gy * gz * ty * tz != 1 or threads % WARP or not isinstance(block, L.For) or \
            block.kind is not L.ForKind.BLOCK_X:
        raise ConfigError(f"{func.name}: a range epilogue needs blocks and whole warps of "
                          f"threads along x only")
    out = next(p for p in params if p.name == parts)
    pieces = math.prod(L.static_shape(out.shape[1:]))
    if blocks > pieces:
        raise ConfigError(f"{func.name}: {blocks} blocks, more than the range's "
                          f"{pieces} partials")
    flat = L.Buffer(parts, T.float32, (2 * pieces,))
    r = BlockRange(threads, L.Var("t_range"))
    e, column = L.Var("e_range"), L.Var("column")

    def write(top, bottom):
        return L.If(L.eq(r.t, L.const(0)), L.For(e, -(-pieces // blocks), L.Let(
            column, e * blocks + block.var, L.If(column < pieces, L.seq(
                L.Store(flat, (column,), top), L.Store(flat, (pieces + column,), bottom))))))

    launches[k] = L.For(block.var, block.extent,
                        r.block_range(_widening(block.body, x, r), write), block.kind)
    body = L.seq(*launches)
    for buffer in reversed(workspace):
        body = L.Allocate(buffer, body)
    views = {parts: flat}
    return L.PrimFunc(func.name, tuple(views.get(p.name, p) for p in params), body,
                      func.size_vars)


def _stores(s: L.Stmt, name: str) -> bool:
    return any(isinstance(n, L.Store) and n.buffer.name == name for n in L.walk(s))


def _widening(body: L.Stmt, x: str, r: BlockRange) -> L.Stmt:
    """`body` with each store to `x` followed by widening the thread's range by its value;
    a vectorized store loop (its values in registers, `codegen.vector_for`) followed by an
    unrolled loop over the same values."""
    added: set[int] = set()

    def rule(n):
        if isinstance(n, L.Store) and n.buffer.name == x:
            widened = L.Seq((n, r.widen(n.value, n.value)))
            added.add(id(widened))
            return widened
        if isinstance(n, L.For) and n.kind is L.ForKind.VECTORIZED and id(n.body) in added:
            store, widen = n.body.stmts
            return L.seq(L.For(n.var, n.extent, store, n.kind),
                         L.For(n.var, n.extent, widen, L.ForKind.UNROLLED))
        return None

    return L.transform(body, rule)
