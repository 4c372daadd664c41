"""Programmatic dependent launch (sm_90 and later): a kernel captured into a segment's CUDA
graph right after another kernel is launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
SERIALIZATION, so the GPU may launch it before the kernel ahead of it has fully finished
(its memory flush and the launch's own latency overlap) instead of after a full drain and a
fresh launch: the gap between two kernels of a graph, about 1.2-1.5 us on an H200, which a
model of a hundred small kernels pays a hundred times.

What keeps it correct is the first statement of every kernel codegen renders,
`DNNC_GRID_DEPENDENCY()` (prelude.py): `griddepcontrol.wait`, which returns once every grid
the kernel depends on has completed and its writes are visible, before the kernel touches
global memory. No kernel calls `griddepcontrol.launch_dependents`: the next kernel launches
when this one's blocks have exited. Called at each kernel's start, it made the next kernel's
blocks resident (and waiting) while this one still ran, which an H200 measured slower on 4
of 5 models (docs/cuda_backend.md). Launched without the attribute (outside a graph, a
first kernel, any GPU before sm_90) the wait does nothing, and on an architecture without
it the macro is empty.

CuPy launches through cuLaunchKernel, which takes no attributes, so these launches call the
driver's cuLaunchKernelEx through ctypes. They happen only while a graph is captured (once
per frame and input addresses), never per call: a replay of the graph is one launch.
`DNNC_PDL=0` where a segment is compiled or loaded turns them off for it (every kernel then
launched as CuPy launches it). This module never renders code.
"""

from __future__ import annotations

import ctypes
import functools
import os

from ...errors import DeviceError

PROGRAMMATIC_STREAM_SERIALIZATION = 6
"""CUlaunchAttributeID of the attribute (cuda.h's CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
SERIALIZATION)."""



class _Attribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value (a union)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("count", ctypes.c_uint)]


@functools.cache
def _driver():
    """The driver's cuLaunchKernelEx, or None where the library or the symbol is missing."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
        launch = library.cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    return launch


def supported(arch: str) -> bool:
    """Whether kernels of `arch` (sm_XY) launch programmatically here: not turned off
    (`DNNC_PDL=0`), sm_90 or later, and the driver has cuLaunchKernelEx."""
    digits = "".join(c for c in arch if c.isdigit())
    return os.environ.get("DNNC_PDL", "1") != "0" and bool(digits) and int(digits) >= 90 \
        and _driver() is not None


def launch_after_kernel(fn, grid, block, shared: int, args: tuple, stream) -> None:
    """Launch loaded function `fn` (CuPy's `Function`: its `ptr` is the CUfunction) on
    `stream` with device-address arguments `args`, allowed to launch before the kernel
    ahead of it on the stream has fully completed (the module's docstring)."""
    launch = _driver()
    grid, block = _dims(grid), _dims(block)
    attribute = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    config = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared,
                     ctypes.c_void_p(stream.ptr), ctypes.pointer(attribute), 1)
    values = [ctypes.c_uint64(int(a)) for a in args]
    params = (ctypes.c_void_p * max(1, len(values)))(
        *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    status = launch(ctypes.byref(config), ctypes.c_void_p(fn.ptr), params, None)
    if status != 0:
        raise DeviceError(f"cuLaunchKernelEx (programmatic launch) failed with CUresult "
                          f"{status}; DNNC_PDL=0 launches every kernel as CuPy does")


def _dims(d) -> tuple[int, int, int]:
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))
