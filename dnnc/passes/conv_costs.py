"""Estimated time of a 3x3, stride-1 float32 conv by each algorithm a CPU target has for it:
the direct conv and Winograd's F(m x m, 3x3) for each tile m of `WINOGRAD_TILES`, from what
each does (multiply-adds, transform operations, accumulators in use), in vector-operation
cycles with constants fitted to measurements (bench/winograd.py). convert_layout's
"winograd_conv" picks the least. It estimates; it never compiles or times anything.
"""

from __future__ import annotations

import functools

from ..ir.ops.winograd import winograd

WINOGRAD_TILES = {"fp32": (2, 4), "bf16": (2,)}
"""The tiles the choice weighs at each precision. F(6x6, 3x3) computes (ConvWinograd takes
it) but its error is ~100x the direct conv's (docs/llvm_backend.md, "Winograd convolutions"):
never chosen. At bf16 (transformed patches rounded to bf16) F(4x4)'s error measured ~10x the
bf16 direct conv's (1.5-3.1e-2 of the largest output a layer, F(2x2) 1.5x: 2.3-4.6e-3)."""

STEP_CYCLES = 6
"""The fewest cycles a reduction step of the micro-kernel takes (a broadcast, the weight
vectors' loads, the multiply-adds' latency), fitted: a tile of fewer accumulators than
fma_ports x STEP_CYCLES leaves the pipes idle (F(4x4)'s 2 tiles a row of a 7x7 output)."""

L2_BYTES = 1 << 20
"""What stays in a core's L2 between reuses: a channel block's transformed filters
(alpha^2 x C x NR) up to this come from L2 for every tile block, past it from L3."""

L2_BYTES_PER_CYCLE, L3_BYTES_PER_CYCLE = 24, 12
"""Weight bytes a cycle a step reads from L2 and from past it, fitted (F(4x4) at 256
channels 14x14: its 1.2 MB a block from L3 made it 1.25x the direct conv's speed where
F(2x2)'s 0.5 MB made 1.93x)."""

MEMORY_BYTES_PER_CYCLE = 8
"""Weight bytes a cycle from memory: a model's weights pass the caches between two calls
(resnet18's 45 MB), so every call reads each layer's (direct 9 C M floats, Winograd
alpha^2 C M) from memory, about 32 GB/s at 4 GHz. Without it the layers, timed alone with
their weights cached, took F(2x2) at 512->512 @7 (1.04x direct); in resnet18 that lost
what F(4x4) gained at 56 and 28."""

INPUT_OP_CYCLES, OUTPUT_OP_CYCLES, POSITION_OP_CYCLES = 0.25, 3, 8
"""Cycles an input transform's vector operation, an output transform's, and a position's
accumulator set-up and store (a vector each) cost, fitted: the input transform's shared
columns and T tiles in a vector, the output transform's reads of `m`, epilogue and bounds
tests (bench/winograd.py, 13 layers, 1 thread, znver5: every layer's fastest algorithm
estimated fastest; estimates within 0.6-1.45x of the measured speed-ups)."""


@functools.cache
def _transform_ops(m: int) -> tuple[int, int]:
    """(vector operations a patch's input transform takes, a tile's output transform takes):
    a row of the matrix costs its non-zeros less one (adds) plus its coefficients other than
    +-1 (multiplies), applied to each column and then each row."""
    def ops(rows) -> int:
        return sum(max(sum(1 for v in row if v) - 1, 0) + sum(1 for v in row if v and abs(v) != 1)
                   for row in rows)

    w = winograd(m)
    alpha = m + 2
    return 2 * alpha * ops(w.bt), (alpha + m) * ops(w.at)


def _step(rows: int, vectors: int, lanes: int, weight_bytes_per_cycle: float,
          fma_ports: int) -> float:
    """Cycles of one reduction step of a rows x vectors tile of accumulators: its
    multiply-adds at `fma_ports` a cycle, at least STEP_CYCLES, at least its weight vectors'
    bytes at the cache's rate."""
    return max(rows * vectors / fma_ports, STEP_CYCLES,
               vectors * lanes * 4 / weight_bytes_per_cycle)


def conv3x3_costs(n: int, c: int, oc: int, oh: int, ow: int, nr: int, vector_bits: int,
                  threads: int, precision: str = "fp32", fma_ports: int = 2
                  ) -> dict[int | None, float]:
    """Estimated cycles of the conv [n, c, oh + 2, ow + 2] -> [n, oc, oh, ow] (3x3 stride 1)
    direct (key None) and by F(m x m, 3x3) (key m) for each m of the precision's
    `WINOGRAD_TILES`. The direct conv runs 8-pixel by NR tiles over 9 C steps; Winograd
    transforms each alpha x alpha patch (T patches in a vector), runs alpha^2 products of
    T x NR tiles over C steps, and transforms each tile back; the parallel loops split whole
    units over `threads`; each reads its weights from memory once. At bf16 a step takes a
    pair of channels (vdpbf16ps) and a weight 2 bytes; the transforms stay fp32. `fma_ports`:
    full-width multiply-adds a cycle (`Target.fma_ports`: 2 where the constants were fitted,
    Zen 5; 1 on Zen 4's AVX-512, where cnn's 16->32 @16, 32->64 @8 and 512->512 @7 measured
    F(2x2) 1.29-1.39x the direct conv, all estimated slower with 2, and F(2x2) with 1; but
    16->16 @56, now estimated F(4x4), measured 0.80x: docs/llvm_backend.md)."""
    lanes = max(vector_bits // 32, 1)
    vectors = max(nr // lanes, 1)
    rows = 8 if vector_bits >= 512 else 4
    blocks = -(-oc // nr)
    pixel_tiles = -(-oh * ow // rows)
    per_step, weight_bytes = (2, 2) if precision == "bf16" else (1, 4)
    steps = -(-c // per_step)
    direct = n * blocks * _share(pixel_tiles, threads) * 9 * steps * rows * vectors / fma_ports
    costs = {None: direct + 9 * c * oc * weight_bytes / MEMORY_BYTES_PER_CYCLE}
    for m in WINOGRAD_TILES[precision]:
        tw, th = -(-ow // m), -(-oh // m)
        t = -(-tw // -(-tw // rows))                   # the template's default block
        tblocks = th * -(-tw // t)
        alpha2 = (m + 2) ** 2
        in_ops, out_ops = _transform_ops(m)
        rate = L2_BYTES_PER_CYCLE if alpha2 * c * nr * 4 <= L2_BYTES else L3_BYTES_PER_CYCLE
        products = alpha2 * (steps * _step(t, vectors, lanes, rate, fma_ports) +
                             POSITION_OP_CYCLES * t * vectors)
        back = t * out_ops * vectors * OUTPUT_OP_CYCLES
        transform = c * in_ops * INPUT_OP_CYCLES
        costs[m] = n * (_share(tblocks, threads) * transform +
                        _share(tblocks * blocks, threads) * (products + back)) + \
            alpha2 * c * oc * weight_bytes / MEMORY_BYTES_PER_CYCLE
    return costs


def _share(units: int, threads: int) -> int:
    """Units the busiest of `threads` threads runs."""
    return -(-units // max(threads, 1))
