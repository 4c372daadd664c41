"""bf16 products for the llvm target (`precision="bf16"`): what the dense template needs to
multiply bf16-rounded operands with fp32 accumulation.

A constant B arrives packed in pairs along K (`ir/ops/linalg.pack_pairs`: each 32-bit word
holds B[2t, j] in its low half and B[2t + 1, j] in its high half, as AVX512_BF16's
`vdpbf16ps` reads its second operand); A is rounded to bf16 (to nearest even) and packed the
same way by the kernel, a tile at a time (`pack_rows`); the product is the loop-IR intrinsic
`dot_bf16x2(acc, a, b)` (`ir/loop/nodes.INTRINSICS`), which the llvm renderer emits as
`vdpbf16ps` where the CPU has AVX512_BF16 (`native`) and legalize expands into two fp32 FMAs
of the same operands elsewhere, so both give the same sums up to bf16's denormals, which
`vdpbf16ps` flushes.

This module builds loop IR and names features; it must never import llvmlite (the registry
entry reads `PRECISIONS` when the targets are listed) nor decide what a kernel's tiles are.
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16")
"""The values of the llvm target's `precision` option, the default first."""

BF16_FEATURES = frozenset({"avx512bf16", "avx512vl"})
"""The CPU features `vdpbf16ps` needs at every vector width (512-bit: avx512bf16; 128- and
256-bit: avx512vl too). A target lacking one computes `dot_bf16x2` in fp32 FMAs."""


def native(features: frozenset[str]) -> frozenset[str]:
    """The legalize rules the renderer skips on a CPU with `features`: `dot_bf16x2` where
    `vdpbf16ps` runs at every width."""
    return frozenset({"dot_bf16x2"}) if BF16_FEATURES <= features else frozenset()
