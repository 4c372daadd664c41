"""AMX-BF16 on Sapphire Rapids and later: the pieces a tile-based product needs, ahead of a
template that uses them (no template chooses AMX yet: `amx_usable` only says whether one may).

- **Features** (`amx_features`): the target's own feature string must hold amx-tile and
  amx-bf16 (never a CPU's name), and the process must have asked Linux for the tiles'
  register state (`request_tile_state`: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
  Linux 5.16 and later), else the first tile instruction is a SIGILL.
- **A tile product** (`tile_gemm_module`): C[M, N] += A B with A as bf16 pairs [M, K / 2]
  (row-major, as `bf16.PairedA` packs a row) and B as bf16 pairs [K / 2, N] (the layout
  `linalg.pack_pairs` gives a panel of 16 columns: AMX's "VNNI" B), through LLVM's
  `llvm.x86.tileloadd64.internal` / `tdpbf16ps.internal` / `tilestored64.internal`, whose
  tile configuration (`ldtilecfg`) LLVM emits itself. 16 x 16 fp32 tiles of C, K in steps of
  32 bf16 (one 1 KB A tile and one B tile a step).

It must never run a tile instruction without `amx_usable`, and never decide what a kernel's
tiles are beyond the probe kernel here.
"""

from __future__ import annotations

import ctypes
import functools

from llvmlite import ir

from .primitives import I16, I32, I64, PTR

AMX_FEATURES = frozenset({"amx-tile", "amx-bf16"})
"""The CPU features (LLVM's names) a bf16 tile product needs."""

SYS_ARCH_PRCTL = 158            # x86-64 Linux
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
TILE_ROWS, TILE_BYTES = 16, 64
"""A tile of the probe kernel: 16 rows of 64 bytes (16 fp32, or 16 bf16 pairs)."""


def amx_features(features: frozenset[str]) -> bool:
    """Whether a CPU with `features` (a `Target.feature_set`) has bf16 tiles."""
    return AMX_FEATURES <= features


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


def amx_usable(features: frozenset[str]) -> bool:
    """Whether tile instructions may run here for a target of `features`."""
    return amx_features(features) and request_tile_state()


class _Tile(ir.Type):
    """LLVM's `x86_amx` (llvmlite spells no such type): a tile register's value."""

    def _to_string(self) -> str:
        return "x86_amx"

    def __eq__(self, other) -> bool:
        return isinstance(other, _Tile)

    def __hash__(self) -> int:
        return hash("x86_amx")


def tile_gemm_module(name: str = "amx_gemm") -> ir.Module:
    """`void name(ptr C, ptr A, ptr B, i64 M, i64 N, i64 K2)`: C[M, N] (fp32, row-major) +=
    A B, A bf16 pairs [M, K2] and B bf16 pairs [K2, N] (uint32 words), M and N multiples of
    16, K2 of 16 (K of 32)."""
    module = ir.Module(name=name)
    tile = _Tile()
    i16 = [I16] * 2
    load = ir.Function(module, ir.FunctionType(tile, i16 + [PTR, I64]),
                       "llvm.x86.tileloadd64.internal")
    dot = ir.Function(module, ir.FunctionType(tile, [I16] * 3 + [tile] * 3),
                      "llvm.x86.tdpbf16ps.internal")
    store = ir.Function(module, ir.FunctionType(ir.VoidType(), i16 + [PTR, I64, tile]),
                        "llvm.x86.tilestored64.internal")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64, I64, I64]),
                     name)
    c, a, b, m, n, k2 = fn.args
    rows, width = ir.Constant(I16, TILE_ROWS), ir.Constant(I16, TILE_BYTES)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    step = ir.Constant(I64, TILE_ROWS)
    four = ir.Constant(I64, 4)

    def at(base, index):   # &base[index] of 4-byte elements
        return builder.gep(base, [index], inbounds=True, source_etype=I32)

    with _counted(builder, fn, m, step, "i") as i:
        with _counted(builder, fn, n, step, "j") as j:
            c_at = at(c, builder.add(builder.mul(i, n), j))
            c_stride = builder.mul(n, four)
            acc = builder.call(load, [rows, width, c_at, c_stride])
            head = builder.block
            body = fn.append_basic_block("k.body")
            done = fn.append_basic_block("k.done")
            builder.branch(body)
            builder.position_at_end(body)
            t = builder.phi(I64, "t")
            t.add_incoming(ir.Constant(I64, 0), head)
            tile_c = builder.phi(tile, "c")
            tile_c.add_incoming(acc, head)
            a_tile = builder.call(load, [rows, width, at(a, builder.add(builder.mul(i, k2), t)),
                                         builder.mul(k2, four)])
            b_tile = builder.call(load, [rows, width, at(b, builder.add(builder.mul(t, n), j)),
                                         c_stride])
            out = builder.call(dot, [rows, width, width, tile_c, a_tile, b_tile])
            t_next = builder.add(t, step)
            t.add_incoming(t_next, builder.block)
            tile_c.add_incoming(out, builder.block)
            builder.cbranch(builder.icmp_unsigned("<", t_next, k2), body, done)
            builder.position_at_end(done)
            builder.call(store, [rows, width, c_at, c_stride, out])
    builder.ret_void()
    return module


class _counted:
    """`for v in range(0, end, step)` around what the `with` body emits (end > 0)."""

    def __init__(self, builder: ir.IRBuilder, fn: ir.Function, end, step, name: str):
        self.b, self.fn, self.end, self.step, self.name = builder, fn, end, step, name

    def __enter__(self) -> ir.Value:
        b = self.b
        self.head = b.block
        self.body = self.fn.append_basic_block(f"{self.name}.body")
        self.done = self.fn.append_basic_block(f"{self.name}.done")
        b.branch(self.body)
        b.position_at_end(self.body)
        self.var = b.phi(I64, self.name)
        self.var.add_incoming(ir.Constant(I64, 0), self.head)
        return self.var

    def __exit__(self, *exc) -> None:
        b = self.b
        nxt = b.add(self.var, self.step)
        self.var.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_unsigned("<", nxt, self.end), self.body, self.done)
        b.position_at_end(self.done)
