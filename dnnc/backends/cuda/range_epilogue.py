"""A producer's range epilogue: the kernel that stores x also writes the partials of x's
range (DynamicRange, fused after the producer by fuse_ops' `take_ranges`), so that the
DynamicQuantizeLinear reading x is one launch (`dynamic_quantize.py`: it reduces the
partials, then quantizes) instead of two (its first read x once more only for its range).

The producer's kernel is scheduled by its own template as if the DynamicRange were not there
(`unranged`), then `with_range` rewrites the launch that stores x: each thread keeps a
running max and min from 0 of the values it stores (registers: after a vector store, an
unrolled copy of its loop over the same registers), and at the end of the block the block's
range is met as the quantization's launches meet theirs (`BlockRange`: warp shuffles, one
shared exchange) and written into the partials, block b into columns b, b + blocks, ..., a
column a thread (every column written each call, so none is stale). The quantization's
max and min of the columns are x's max and min widened to 0, exactly (max and min are exact
in any order): its results are the reference's bit for bit, and x's values are untouched.

This module builds loop IR; it never renders C, never launches, never chooses a template.
"""

from __future__ import annotations

import dataclasses
import math

from ...ir import loop as L
from ...ir import types as T
from ...ir.ops.linalg import widen
from ..lower import Kernel, lower_group
from ..space import Template
from .codegen import launch_dims, stages
from .dynamic_quantize import BlockRange, QuantizeConfig, range_launch
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
        return with_range(template.build(problem, config, machine), x, parts, params, machine)

    return dataclasses.replace(template, build=build)


def with_range(func: L.PrimFunc, x: str, parts: str, params: tuple, machine) -> L.PrimFunc:
    """`func` also writing x's range partials to `parts`; its parameters `params` (the
    ranged kernel's). In the launch that stores buffer `x` where it is the only one and its
    blocks are no more than the partials' columns and its threads whole warps along x;
    else (a product split along k, ...) in a launch of its own after it, as the
    quantization's first launch (`dynamic_quantize.range_launch`)."""
    workspace, launches = stages(func.body)
    out = next(p for p in params if p.name == parts)
    pieces = math.prod(L.static_shape(out.shape[1:]))
    flat = L.Buffer(parts, T.float32, (2 * pieces,))
    storing = [k for k, s in enumerate(launches) if _stores(s, x)]
    epilogue = _in_launch(launches[storing[0]], func.name, x, flat, pieces) \
        if len(storing) == 1 else None
    if epilogue is None:
        stored = next(p for p in func.params if p.name == x)
        launches.append(range_launch(stored, math.prod(L.static_shape(stored.shape)), flat,
                                     pieces, QuantizeConfig(), machine))
    else:
        launches[storing[0]] = epilogue
    body = L.seq(*launches)
    for buffer in reversed(workspace):
        body = L.Allocate(buffer, body)
    views = {p.name: p for p in func.params} | {parts: flat}   # (the template's views)
    return L.PrimFunc(func.name, tuple(views[p.name] for p in params), body, func.size_vars)


def _in_launch(launch: L.Stmt, name: str, x: str, parts: L.Buffer,
               pieces: int) -> L.Stmt | None:
    """`launch` (storing x) with the range epilogue, or None where it cannot take one: its
    blocks (the nest of block loops it starts with) more than `pieces`, threads other than
    whole warps along x, or x read back (a value stored and then updated, as an
    accumulator: the range would see its partial values)."""
    if any(isinstance(n, L.Load) and n.buffer.name == x for n in L.walk(launch)):
        return None
    _, (threads, ty, tz) = launch_dims(launch, name)
    blocks, index, inner = 1, L.const(0), launch
    loops = []
    while isinstance(inner, L.For) and inner.kind in _BLOCKS:
        index = index + inner.var * blocks
        blocks *= inner.extent.value
        loops.append(inner)
        inner = inner.body
    if not loops or ty * tz != 1 or threads % WARP or blocks > pieces:
        return None
    r = BlockRange(threads, L.Var("t_range"))

    def write(top, bottom):
        return r.store_columns(top, bottom, parts, pieces, index, blocks)

    body = r.block_range(_widening(inner, x, r), write)
    for loop in reversed(loops):
        body = L.For(loop.var, loop.extent, body, loop.kind)
    return body


_BLOCKS = (L.ForKind.BLOCK_X, L.ForKind.BLOCK_Y, L.ForKind.BLOCK_Z)


def _stores(s: L.Stmt, name: str) -> bool:
    return any(isinstance(n, L.Store) and n.buffer.name == name for n in L.walk(s))


def _widening(body: L.Stmt, x: str, r: BlockRange) -> L.Stmt:
    """`body` with each store to `x` followed by widening the thread's range by its value
    (bound once); a vectorized store loop (its values in registers, `codegen.vector_for`)
    followed by an unrolled loop over the same values."""
    added: dict[int, L.Store] = {}

    def rule(n):
        if isinstance(n, L.Store) and n.buffer.name == x:
            value = L.Var("stored", n.buffer.dtype)
            wide = widen(T.float32, value)   # (a half x: exact)
            bound = L.Let(value, n.value, L.seq(L.Store(n.buffer, n.indices, value),
                                                r.widen(wide, wide)))
            added[id(bound)] = n
            return bound
        if isinstance(n, L.For) and n.kind is L.ForKind.VECTORIZED and id(n.body) in added:
            store = added[id(n.body)]
            wide = widen(T.float32, store.value)
            return L.seq(L.For(n.var, n.extent, store, n.kind),
                         L.For(n.var, n.extent, r.widen(wide, wide), L.ForKind.UNROLLED))
        return None

    return L.transform(body, rule)
