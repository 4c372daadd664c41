"""AMX tiles on Sapphire Rapids and later: whether a target may use them and the Linux
permission they need (the loop IR's `TileProduct` is rendered by `amx_codegen.py`).

- **Features** (`tile_features`, `amx_usable`): a tile product of a precision needs the
  target's own feature string to hold its features (`TILE_DOTS`: amx-tile and amx-bf16 for
  bf16, amx-tile and amx-int8 for the byte products; never a CPU's name), and the process
  must have asked Linux for the tiles' register state (`request_tile_state`:
  arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), Linux 5.16 and later), else the first
  tile instruction is a SIGILL.
  `cpu.host_target` drops the AMX features of a host whose kernel refuses the state, so code
  compiled for the host uses tiles only where they run.

It must never run a tile instruction without `amx_usable`, nor decide what a kernel's tiles
are (the templates do: `amx_dense.py`, `amx_conv.py`, `amx_int8.py`), nor import llvmlite
(the artifact codec reads it when the targets are listed).
"""

from __future__ import annotations

import ctypes
import functools

from ...ir import loop as L
from ..space import Constraint

AMX_FEATURES = frozenset({"amx-tile", "amx-bf16"})
"""The CPU features a bf16 tile product needs."""
AMX_INT8_FEATURES = frozenset({"amx-tile", "amx-int8"})
"""The CPU features an int8 tile product needs (either signedness of A)."""
TILE_DOTS = {"bf16": ("llvm.x86.tdpbf16ps.internal", AMX_FEATURES),
             "u8s8": ("llvm.x86.tdpbusd.internal", AMX_INT8_FEATURES),
             "s8s8": ("llvm.x86.tdpbssd.internal", AMX_INT8_FEATURES),
             "s8u8": ("llvm.x86.tdpbsud.internal", AMX_INT8_FEATURES)}
"""`TileProduct` precision -> (LLVM's dot of two tiles into a third, the CPU features (LLVM's
names) it needs): tdpbf16ps sums bf16 pairs in float32, tdpbusd u8 x s8, tdpbssd s8 x s8 and
tdpbsud s8 x u8 quads in int32."""

TILES_FIT = Constraint(
    "row_tiles * col_tiles + row_tiles + col_tiles <= 8: C's tiles and a step's A and B "
    "tiles fit AMX's 8 tile registers",
    lambda c: c.row_tiles * c.col_tiles + c.row_tiles + c.col_tiles <= L.TILE_REGISTERS)
"""The constraint every tile template's space holds (configs with `row_tiles` and
`col_tiles`): a block of C's tiles and one step's A and B tiles in the tile registers."""

SYS_ARCH_PRCTL = 158            # x86-64 Linux
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def amx_features(features: frozenset[str], precision: str = "bf16") -> bool:
    """Whether a CPU with `features` (a `Target.feature_set`) has the tiles of `precision`."""
    return TILE_DOTS[precision][1] <= features


def tile_features(target) -> frozenset[str]:
    """The features a target's code needs for its tile products: those of its precision's
    tile dot where it has them (the templates then take the tiles), else none."""
    dot = TILE_DOTS.get(target.precision)
    if dot is None or not dot[1] <= target.feature_set:
        return frozenset()
    return dot[1]


@functools.cache
def request_tile_state() -> bool:
    """Ask Linux once for this process's AMX tile data state; whether it is granted (False
    off Linux x86-64, on a CPU or kernel without AMX)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
            return False
        granted = ctypes.c_uint64(0)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(granted)) != 0:
            return False
        return bool(granted.value >> XFEATURE_XTILEDATA & 1)
    except (OSError, AttributeError):
        return False


def amx_usable(features: frozenset[str], precision: str = "bf16") -> bool:
    """Whether tile instructions of `precision` may run here for a target of `features`."""
    return amx_features(features, precision) and request_tile_state()
