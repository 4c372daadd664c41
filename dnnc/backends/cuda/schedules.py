"""Schedules for the CUDA backend: which loops run on blocks and threads.

    schedule_kernel(kernel, machine, config=None) -> L.PrimFunc

Templates are chosen from `TEMPLATES`, keyed by ("cuda", anchor pattern), as on llvm
(`space.choose_template`); each takes the kernel as a `problems.Rows` (its PrimFunc as
lowered) and a config of its knob space. This module chooses and assembles; a stage's
binding to threads is `threads.py`'s (DEFAULT's, and the names and scratch they share), a row
stage's `rows.py`'s.

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
  a function of a single row (no row loop: its reductions whole-tensor stages) is taken as
  a loop of one row (`rows.one_row`), consecutive stages over the same rows become one
  (`loop_analysis.fuse_row_loops`), and a
  row stage with a reduction of at least `MIN_ROW_WORK` iterations over the row's own
  elements (`loop_analysis.steps_contiguously`: a reduction over NCHW's channels that
  writes a pixel at a time reads coalesced one thread a row instead) runs `row_threads`
  threads a row (32: a warp per row; more: several warps), max(1, `row_block` /
  `row_threads`) rows a block. A row stage that reads column-wise and writes row-wise
  (`rows.reads_columns`: a layernorm over NCHW's channels through a Transpose, writing
  NHWC, as ConvNeXt's) interleaves `row_interleave` consecutive rows in each warp, a row's
  threads that many apart: each step reads that many consecutive elements of a column
  (one thread a row read them coalesced too, but wrote a row's elements a row apart and
  ran a pixel's whole channel loop alone: 0.19 ms for convnext_tiny's last-stage
  layernorm at batch 32). Each
  elementwise loop of the row is strided over the row's threads (consecutive threads,
  consecutive elements: coalesced); each reduction accumulates a strided share a
  thread, then combines across the warp by `shfl_xor` butterflies (every lane ends with the
  total: no shared memory, no barrier) and, with several warps a row, through one shared
  exchange of the warp partials (one barrier; every thread then sums the partials itself).
  Row scalars the lowering kept in global scratch (softmax's max and sum, layernorm's mean
  and 1/std) become registers of every thread (`rows._private_scalars`), and with `cache_row`
  an input row the passes read several times is loaded once into registers (`rows._row_cache`:
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
6 each, float4; 5000: 1024 threads, float4; 770: float2; an odd row: 1). Column-wise
rows: `COLUMN_INTERLEAVE` rows a warp, a warp's worth of threads a row, scalar.
"""

from __future__ import annotations

import math

from ...ir import loop as L
from ...ir.ops.registry import Pattern
from ...ir.target import GPU
from .. import problems
from ..loop_analysis import fuse_row_loops, rows_first
from ..space import Space, Template, choose_template
from .attention import ATTENTION
from .codegen import stages
from .conv import CONV2D
from .conv_nhwc import MMA_CONV2D_NHWC
from .depthwise import DEPTHWISE
from .depthwise_nhwc import DEPTHWISE_NHWC
from .dense import DENSE
from .dynamic_quantize import DYNAMIC_QUANTIZE, DYNAMIC_RANGE
from .device import REFERENCE, gpu_of
from .gemv import GEMV
from .int8 import INT8_CONV2D, INT8_DENSE, INT8_GEMV
from .int8_nhwc import INT8_CONV2D_NHWC
from .mma import MMA_CONV2D, MMA_DENSE
from .mma_attention import MMA_ATTENTION
from .plane_mean import PLANE_MEAN_NHWC
from . import range_epilogue
from .rows import (Layout, RowBuilder, RowsConfig, is_row_reduction, on_rows, one_row,
                   pow2, reads_columns, reduction, row_length, writes_rows)
from .sparse import SPMM
from .sparse24 import SPARSE24, SPARSE24_CONV
from .threads import (WARP, Config, Names, Scratch, independent_prefix, single_thread,
                      thread_per_iteration)

# blocks of a grid-stride stage at most: 8 per SM of the device, rounded down to a power of
# two (`stride_blocks`: 1024 on an H100's 132 SMs)
STRIDE_BLOCKS_PER_SM = 8
# the default's elements of a row per thread: enough loads in flight, rows of <= 256 a warp
ELEMS_PER_THREAD = 8
THREADS = (64, 128, 256, 512, 1024)
ROW_THREADS = (2, 4, 8, 16, 32, *THREADS)
VECTOR = (1, 2, 4)
INTERLEAVE = (1, 2, 4, 8, 16, 32)
COLUMN_INTERLEAVE = 4
"""Rows a warp interleaves in a column-wise row stage (`rows.reads_columns`) by default, a
warp a row-group (a block of 128 threads, 4 rows): on an H200, ConvNeXt-tiny's block
layernorm at batch 32 in float32 ([32, C, H, W] through a Transpose, C = 96, 384, 768)
took 31.8, 8.5, 6.8 us so, against 66.2, 43.7, 21.6 with 16 rows a warp and up to 64
threads a row, 75.0, 19.2, 9.8 with a warp a row (strided reads), 158, 47, 38 with 32 rows
a warp, and about 71, 107, 189 as one thread a row (convnext's profile before; torch's
permute + layer_norm 208, 33, 21; bench/gpu_kernels.py --only channel_layernorm)."""


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
    its precision lets the tensor-core templates in), and the kernel's problem. A kernel
    ending in a DynamicRange takes the template of the kernel without it, with the range
    epilogue after its build (`range_epilogue.py`)."""
    if range_epilogue.ranged(kernel):
        template, problem = choose_template(range_epilogue.unranged(kernel), TEMPLATES,
                                            target, machine)
        return range_epilogue.ranging(template, kernel), problem
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
    names = Names(func)
    workspace, body = stages(func.body)
    if block_rows:
        body = one_row(body, names.var("row"))
    if fuse:
        body = fuse_row_loops(rows_first(body))
    scheduled = []
    for k, s in enumerate(body):
        others = body[:k] + body[k + 1:]
        scheduled.append(_stage(s, config, block_rows, names, Scratch(workspace, others),
                                stride_blocks(gpu)))
    out = L.seq(*scheduled)
    used = {n.buffer.name for n in L.walk(out) if isinstance(n, (L.Load, L.Store))}
    for buffer in reversed(workspace):
        if buffer.name in used:   # (row scalars made registers leave theirs unused)
            out = L.Allocate(buffer, out)
    return L.PrimFunc(func.name, func.params, out, func.size_vars, func.attrs)


def _stage(s: L.Stmt, config, block_rows: bool, names: Names, scratch: Scratch,
           strided: int) -> L.Stmt:
    if isinstance(s, L.For):
        loop = independent_prefix(s)
        if loop is not None and loop.extent.value > 0:   # (an empty tensor: one thread)
            if block_rows and is_row_reduction(loop):
                return on_rows(loop, config, names, scratch)
            return thread_per_iteration(loop, config, names, strided)
    if config.reduce_threads > 1 and reduction(s) is not None:
        layout = Layout(None, 1, pow2(config.reduce_threads), 1, 1)
        return RowBuilder(layout, names, [s], {}, {}).build()
    return single_thread(s, names)


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
        "row_vector": VECTOR, "cache_row": (False, True), "fuse_rows": (False, True),
        "row_interleave": INTERLEAVE})


def rows_default(p: problems.Rows, machine) -> RowsConfig:
    """ELEMS_PER_THREAD of the longest row's elements a thread, at least a warp a row, at
    most 1024 threads; blocks of at least 128 threads (several rows of a warp each); the
    widest `row_vector` the row allows (`_widest_vector`). Rows read column-wise
    (`reads_columns`): COLUMN_INTERLEAVE rows interleaved, a warp's worth of threads each."""
    loops = _row_loops(p)
    length = max((row_length(loop) for loop in loops), default=0)
    if loops and all(reads_columns(loop) for loop in loops):
        # (rows written back row-wise: a warp's worth a row, as measured; a long row reduced
        # to a scalar, a pool's: up to 1024 threads a block, about 64 elements a thread)
        threads = WARP if any(writes_rows(loop) for loop in loops) else min(
            1024 // COLUMN_INTERLEAVE, max(WARP, pow2(-(-length // COLUMN_ELEMS))))
        return RowsConfig(row_threads=threads, row_block=threads * COLUMN_INTERLEAVE,
                          row_vector=1, row_interleave=COLUMN_INTERLEAVE)
    threads = min(1024, max(WARP, pow2(-(-length // ELEMS_PER_THREAD))))
    return RowsConfig(row_threads=threads, row_block=max(128, threads),
                      row_vector=_widest_vector(length, threads))


COLUMN_ELEMS = 64
"""Elements of a column-wise row reduced to a scalar (a global pool over NHWC's pixels) a
thread takes by default."""


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
    """The stages (their outer loops flattened, consecutive ones over the same rows fused
    as `schedule` fuses them) that are row reductions."""
    out = []
    for s in fuse_row_loops(rows_first(one_row(stages(p.func.body)[1], L.Var("row")))):
        loop = independent_prefix(s) if isinstance(s, L.For) else None
        if loop is not None and is_row_reduction(loop):
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
    # (attention.py), depthwise conv a block per tile of a channel's plane (depthwise.py),
    # channels-last conv (ConvNHWC, reduced precisions only) on tensor cores (conv_nhwc.py),
    # a channels-last depthwise one a block per tile of pixels x run of channels
    # (depthwise_nhwc.py), sparse weights' products (SparseDense, 1x1 SparseConv) as an
    # SpMM (sparse.py) and 2:4 weights' (Sparse24Dense, Sparse24ConvNHWC) on the sparse
    # tensor cores (sparse24.py), int8 dense and conv on the integer tensor cores or dp4a
    # (int8.py; a channels-last int8 conv's patches by cp.async: int8_nhwc.py); the rest
    # (grouped conv) one thread per output element
    ("cuda", Pattern.OUT_FUSABLE): (SPMM, SPARSE24, SPARSE24_CONV, INT8_DENSE, INT8_GEMV,
                                    INT8_CONV2D, INT8_CONV2D_NHWC,
                                    MMA_DENSE, DENSE, GEMV, MMA_CONV2D_NHWC, MMA_CONV2D,
                                    CONV2D, MMA_ATTENTION, ATTENTION, DEPTHWISE,
                                    DEPTHWISE_NHWC, DEFAULT),
    # the mean over a channels-last plane (squeeze-and-excitation's pool) a block per image
    # x run of channels (plane_mean.py)
    ("cuda", Pattern.REDUCE): (PLANE_MEAN_NHWC, ROWS, DEFAULT),
    # DynamicQuantizeLinear in two launches, or one after its producer's range
    # (dynamic_quantize.py, range_epilogue.py); a DynamicRange no producer took as the
    # quantization's first launch
    ("cuda", Pattern.OPAQUE): (DYNAMIC_QUANTIZE, DYNAMIC_RANGE, ROWS, DEFAULT),
}
"""(target name, anchor pattern) -> the templates tried in order: ROWS where a kernel has
row reductions worth a warp or more a row, DEFAULT (every kernel) otherwise."""
