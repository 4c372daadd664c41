"""Tensor maps for Hopper's TMA copies (`cp.async.bulk.tensor`, `prelude.TMA_PRELUDE`): the
128-byte `CUtensorMap` a kernel's copies read, built on the host by the driver's
`cuTensorMapEncodeTiled` (libcuda through ctypes: CuPy 14 does not wrap it), or for a
convolution's activations `cuTensorMapEncodeIm2col` (`encode_im2col`: `L.TensorMap.im2col`).

A map holds its tensor's global address, so it is built where the address is known (at run
time, once the arena is allocated: `kernel_map` of each `codegen.TensorMapArg` a kernel
takes; in a test or bench, once its buffers are), then copied to global memory, a pointer to
it the kernel's argument (a `__grid_constant__` parameter would do too: a generic address of
either is what the copy takes). `operand_map` is the map of a 16-bit
operand as wgmma.py's tiles lie in shared memory: boxes of 64 elements along the operand's
contiguous dimension (one 128-byte swizzle row; the template's float32 operands at tf32: 32
elements, `kernel_map`) by `rows` of the other, in the 128-byte
swizzle (chunk c of box row r at chunk c ^ r % 8: `wgmma._SwizzledTile`'s layout, K-major
and MN-major alike), elements outside the tensor read as zero (a k tile past k, a block
past m or n: what the cp.async ring's zero fill does). This module builds maps only; it
never launches or renders anything.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ...errors import DeviceError

MAP_BYTES = 128
"""sizeof(CUtensorMap): 16 64-bit words, 64-byte aligned where a kernel reads it."""
SWIZZLE_BYTES = 128
"""The swizzle span: a box's rows are this many bytes (64 16-bit elements)."""
MAX_BOX = 256
"""The driver's largest box extent in any dimension."""

DATA_TYPES = {"float16": 6, "bfloat16": 9, "uint16": 1, "float32": 7}
"""dtype name -> CUtensorMapDataType (CU_TENSOR_MAP_DATA_TYPE_FLOAT16, _BFLOAT16, _UINT16,
_FLOAT32: a tf32 product's operands, tf32 values already, copied as the words they are)."""
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "uint16": 2, "float32": 4}
"""dtype name -> bytes of an element (a box row holds SWIZZLE_BYTES of them)."""
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3   # (CUTLASS's choice for its Hopper GEMM's operand maps)
_OOB_FILL_ZERO = 0       # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: elements outside read as zero


@functools.cache
def _driver():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise DeviceError(f"TMA tensor maps need the CUDA driver (libcuda.so.1): {e}") from e


@functools.cache
def _encode():
    """libcuda's cuTensorMapEncodeTiled with its argument types, or a DeviceError."""
    fn = _driver().cuTensorMapEncodeTiled
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p,
                   ctypes.POINTER(u64), ctypes.POINTER(u64), ctypes.POINTER(u32),
                   ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def _encode_im2col():
    """libcuda's cuTensorMapEncodeIm2col with its argument types, or a DeviceError."""
    fn = _driver().cuTensorMapEncodeIm2col
    i32, u32, u64 = ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p,
                   ctypes.POINTER(u64), ctypes.POINTER(u64), ctypes.POINTER(i32),
                   ctypes.POINTER(i32), u32, u32, ctypes.POINTER(u32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def encode_tiled(address: int, dtype: str, extents: tuple[int, ...],
                 strides: tuple[int, ...], box: tuple[int, ...]) -> np.ndarray:
    """The tensor map (16 uint64 words) of the tensor at global `address` of `dtype` (a name
    of `DATA_TYPES`), `extents` in elements and the byte `strides` of every dimension but
    the first, innermost first; TMA copies a `box` of it (innermost first) into shared
    memory in the 128-byte swizzle, zeros where the box passes the tensor's edges."""
    rank = len(extents)
    if dtype not in DATA_TYPES:
        raise DeviceError(f"no TMA data type for {dtype} (have {sorted(DATA_TYPES)})")
    if len(strides) != rank - 1 or len(box) != rank or not 1 <= rank <= 5:
        raise DeviceError(f"a tensor map of rank {rank} takes {rank - 1} strides and "
                          f"{rank} box extents: {strides}, {box}")
    if box[0] * ELEMENT_BYTES[dtype] > SWIZZLE_BYTES or \
            any(not 1 <= b <= MAX_BOX for b in box) or address % 16 or \
            any(s % 16 for s in strides):
        raise DeviceError(f"tensor map out of TMA's limits: box {box} (at most "
                          f"{SWIZZLE_BYTES} bytes inner, {MAX_BOX} a dimension), "
                          f"address {address:#x} and strides {strides} multiples of 16")
    out = np.zeros(MAP_BYTES // 8, np.uint64)
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    status = _encode()(out.ctypes.data, DATA_TYPES[dtype], rank, address,
                       (u64 * rank)(*extents), (u64 * max(1, rank - 1))(*strides),
                       (u32 * rank)(*box), (u32 * rank)(*([1] * rank)),
                       _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZERO)
    if status != 0:
        raise DeviceError(f"cuTensorMapEncodeTiled failed (CUresult {status}): {dtype} "
                          f"extents {extents}, strides {strides}, box {box}")
    return out


def encode_im2col(address: int, dtype: str, extents: tuple[int, ...],
                  strides: tuple[int, ...], box: tuple[int, int],
                  im2col: tuple[int, ...]) -> np.ndarray:
    """The im2col tensor map (16 uint64 words) of the channels-last tensor at global
    `address` of `dtype`, `extents` (c, w, h, n) in elements and the byte `strides` of all
    but c: TMA copies `box` (box[0] channels, one 128-byte swizzle row, of box[1] pixels)
    into shared memory in the 128-byte swizzle, the pixels walked within the spatial lower
    and upper corners by the traversal strides `im2col` holds (w then h each:
    `L.TensorMap.im2col`), zeros outside the tensor."""
    rank = len(extents)
    spatial = rank - 2
    if dtype not in DATA_TYPES:
        raise DeviceError(f"no TMA data type for {dtype} (have {sorted(DATA_TYPES)})")
    if len(strides) != rank - 1 or len(box) != 2 or len(im2col) != 3 * spatial or \
            not 3 <= rank <= 5:
        raise DeviceError(f"an im2col map of rank {rank} takes {rank - 1} strides, a box of "
                          f"(channels, pixels) and {3 * spatial} corners and strides: "
                          f"{strides}, {box}, {im2col}")
    if box[0] * ELEMENT_BYTES[dtype] > SWIZZLE_BYTES or \
            any(not 1 <= b <= MAX_BOX for b in box) or address % 16 or \
            any(s % 16 for s in strides):
        raise DeviceError(f"im2col map out of TMA's limits: box {box}, address {address:#x} "
                          f"and strides {strides} multiples of 16")
    lower, upper, traversal = (im2col[k * spatial:(k + 1) * spatial] for k in range(3))
    out = np.zeros(MAP_BYTES // 8, np.uint64)
    i32, u32, u64 = ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    status = _encode_im2col()(out.ctypes.data, DATA_TYPES[dtype], rank, address,
                              (u64 * rank)(*extents), (u64 * (rank - 1))(*strides),
                              (i32 * spatial)(*lower), (i32 * spatial)(*upper), box[0], box[1],
                              (u32 * rank)(1, *traversal, 1), _INTERLEAVE_NONE,
                              _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZERO)
    if status != 0:
        raise DeviceError(f"cuTensorMapEncodeIm2col failed (CUresult {status}): {dtype} "
                          f"extents {extents}, strides {strides}, box {box}, im2col {im2col}")
    return out


def kernel_map(arg, address: int) -> np.ndarray:
    """The map a kernel's argument `arg` (a `codegen.TensorMapArg`: its parameter's dtype,
    extents, byte strides and box, and an im2col map's corners and strides) names, of that
    parameter at device `address`."""
    if arg.im2col:
        return encode_im2col(address, arg.dtype, tuple(arg.extents), tuple(arg.strides),
                             tuple(arg.box), tuple(arg.im2col))
    return encode_tiled(address, arg.dtype, tuple(arg.extents), tuple(arg.strides),
                        tuple(arg.box))


def operand_map(address: int, dtype: str, shape: tuple[int, int, int], rows: int) -> np.ndarray:
    """The map of a contiguous 16-bit operand of `shape` (batch, outer, inner) at `address`,
    in boxes of 64 inner elements (one swizzle row) by `rows` outer ones (a K-major tile's
    block rows, or an MN-major atom's k tile) of one batch: coordinates (inner, outer,
    batch) in elements."""
    batch, outer, inner = shape
    row = SWIZZLE_BYTES // 2
    return encode_tiled(address, dtype, (inner, outer, batch),
                        (inner * 2, outer * inner * 2), (row, rows, 1))
