"""The cuda channels-last plane mean: y[n, 0, 0, c] = mean over (h, w) of x[n, h, w, c] (a
ReduceMean over axes 1 and 2, which `sink_transposes` makes of a GlobalAveragePool of a
channels-last image: EfficientNet's squeeze-and-excitation), a block per image x run of
channels.

A block (blockIdx.y: the image, blockIdx.x: the run of `channels` channels) has
`channels / vector` lanes along the run and `split` pixel groups: a thread sums its `vector`
adjacent channels over the pixels p = g, g + split, ... of the plane in fp32 (one vector
load a pixel: consecutive lanes on consecutive channels), the partial sums meet in shared
memory, and one thread a channel adds the `split` partials, divides by H W and stores
through the fused epilogue (`PlaneMeanNHWC.finish`) and any layout tail. Before it the mean
ran one thread per (image, channel), each walking the whole plane: a few blocks for the
whole tensor.

Knobs (`PlaneMeanConfig`): the run of channels, the vector width, the pixel groups. Never
used for reductions over other axes (rows.py and the default template take them).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from .. import problems
from ..space import Constraint, Space, Template
from .dense import MAX_GRID_YZ
from .device import gpu_of

MAX_THREADS = 1024
SECTOR_BYTES = 32
"""A memory transaction's sector: the default keeps a pixel's run of channels at least this
wide (consecutive lanes read it whole)."""
BLOCKS_PER_SM = 2
"""The default shortens the run of channels until the grid has this many blocks a SM (or
the run is one vector)."""


@dataclass(frozen=True)
class PlaneMeanConfig:
    """Knobs of the channels-last plane mean."""

    channels: int = 32   # channels a block
    vector: int = 4      # adjacent channels a thread, one vector load a pixel
    split: int = 32      # pixel groups a block

    @property
    def threads(self) -> int:
        return self.channels // self.vector * self.split


def vector_widths(p: problems.PlaneMeanNHWC) -> tuple[int, ...]:
    """Vector widths dividing C (every vector whole and aligned), at most 4."""
    return tuple(v for v in (1, 2, 4) if p.x_dims[3] % v == 0)


def applies(p: problems.PlaneMeanNHWC) -> bool:
    return p.x_dims[0] <= MAX_GRID_YZ


def space(p: problems.PlaneMeanNHWC, machine) -> Space:
    widths = vector_widths(p)
    return Space("cuda_plane_mean_nhwc", PlaneMeanConfig, {
        "channels": (4, 8, 16, 32, 64, 128), "vector": (1, 2, 4),
        "split": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)},
        [Constraint(f"vector divides C ({', '.join(map(str, widths))})",
                    lambda c: c.vector in widths),
         Constraint("vector divides channels", lambda c: c.channels % c.vector == 0),
         Constraint(f"32 to {MAX_THREADS} threads a block",
                    lambda c: 32 <= c.threads <= MAX_THREADS)])


def default(p: problems.PlaneMeanNHWC, machine) -> PlaneMeanConfig:
    """The widest vector; a run of 32 channels (16 or 8 where C is a multiple of those and
    not of 32), halved while the grid has fewer than BLOCKS_PER_SM blocks a SM and a pixel's
    run still fills a 32-byte sector; 256 threads a block (1024 where the grid has fewer
    blocks than SMs: more loads in flight), fewer pixel groups where the plane has fewer
    pixels."""
    n, h, w, c = p.x_dims
    vector = max(vector_widths(p))
    sms = gpu_of(machine).sms
    run = max(vector, next((r for r in (32, 16, 8) if c % r == 0), 32))
    sector = max(vector, SECTOR_BYTES // p.x.dtype.itemsize)
    while run > sector and n * -(-c // run) < BLOCKS_PER_SM * sms:
        run //= 2
    threads = 1024 if n * -(-c // run) < sms else 256
    split = max(1, threads // (run // vector))
    while split > 1 and split // 2 >= h * w and run // vector * split > 32:
        split //= 2
    while run // vector * split < 32:
        split *= 2
    return PlaneMeanConfig(run, vector, split)


def build(p: problems.PlaneMeanNHWC, c: PlaneMeanConfig, machine) -> L.PrimFunc:
    """The scheduled kernel of `p` (see the module's docstring)."""
    images, h, wid, channels = p.x_dims
    pixels = h * wid
    x = L.Buffer(p.x.name, p.x.dtype, (images, pixels, channels))
    lanes = c.channels // c.vector
    img, run, t = L.Var("img"), L.Var("run"), L.Var("t")
    lane, g, q, v = L.Var("lane"), L.Var("g"), L.Var("q"), L.Var("v")
    acc = L.Buffer("acc", T.float32, (c.vector,), L.Scope.LOCAL)
    xin = L.Buffer("xin", p.x.dtype, (c.vector,), L.Scope.LOCAL)
    partial = L.Buffer("partial", T.float32, (c.split * c.channels,), L.Scope.SHARED)
    unrolled = L.ForKind.UNROLLED
    first = run * c.channels + lane * c.vector

    # each thread: its channels over its share of the pixels, into shared memory
    zero = L.For(v, c.vector, L.Store(acc, (v,), L.const(0.0, T.float32)), unrolled)
    pixel = q * c.split + g
    read = L.For(v, c.vector, L.Store(xin, (v,), x[img, pixel, first + v]),
                 L.ForKind.VECTORIZED)
    add = L.For(v, c.vector, L.Store(acc, (v,), acc[v] + problems.widened(xin[v])), unrolled)
    walk = L.For(q, -(-pixels // c.split), L.If(L.logical_and(pixel < pixels,
                                                             first < channels),
                                               L.seq(read, add)))
    keep = L.For(v, c.vector, L.Store(partial, (g * c.channels + lane * c.vector + v,),
                                      acc[v]), unrolled)
    sums = L.For(t, c.threads, L.Let(lane, t % lanes, L.Let(g, t // lanes, L.Allocate(
        acc, L.Allocate(xin, L.seq(zero, walk, keep))))), L.ForKind.THREAD_X)

    # one thread a channel: the partials, the mean, the epilogue
    ch, total = L.Var("ch"), L.Buffer("total", T.float32, (1,), L.Scope.LOCAL)
    gather = L.For(g, c.split, L.Store(total, (0,), total[0] + partial[g * c.channels + t]))
    index = (img, L.const(0), L.const(0), ch)
    out = p.store_index(index)
    store = L.Store(p.y, tuple(out), p.finish(total[0] / L.const(float(pixels), T.float32),
                                              index))
    finish = L.For(t, c.threads, L.If(t < c.channels, L.Let(ch, run * c.channels + t, L.If(
        ch < channels, L.Allocate(total, L.seq(L.Store(total, (0,), L.const(0.0, T.float32)),
                                              gather, store))))), L.ForKind.THREAD_X)

    block = L.Allocate(partial, L.seq(sums, L.Barrier(), finish))
    body = L.For(img, images, L.For(run, -(-channels // c.channels), block,
                                    L.ForKind.BLOCK_X), L.ForKind.BLOCK_Y)
    views = {x.name: x}
    return L.PrimFunc(p.name, tuple(views.get(b.name, b) for b in p.params), body)


PLANE_MEAN_NHWC = Template("cuda_plane_mean_nhwc", problems.plane_mean_nhwc, applies, space,
                           default, build)
