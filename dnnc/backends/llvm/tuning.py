"""What the autotuner (`dnnc/autotune/`) needs from the llvm target, and nothing else: the
template and problem of a kernel, the kernel built with a config, and a compiled kernel to
call on arrays. The same three functions are all a target gives the tuner."""

from __future__ import annotations

import ctypes

import numpy as np

from ...ir import loop as L
from ...ir.target import Target
from ...levels import DEFAULT_LEVELS
from ..lower import Kernel
from .codegen import ModuleBuilder, workspace_params
from .jit import JITModule
from .schedules import schedule_kernel, template_for as _template_for


def template_for(kernel: Kernel, machine: Target | None = None):
    """(template, problem) of `kernel` on llvm (`machine`: the Target compiled for)."""
    return _template_for(kernel, "llvm", machine)


def build(kernel: Kernel, target: Target, config) -> L.PrimFunc:
    """`kernel` scheduled with `config` (a config of its template's space: ConfigError
    otherwise)."""
    return schedule_kernel(kernel, target, config=config)


def compile_kernel(func: L.PrimFunc, arrays: list[np.ndarray], target: Target):
    """A function of no arguments calling `func` (compiled alone) on `arrays` (its params in
    order: contiguous, kept alive by the caller)."""
    func = L.index_checks.with_errors(func)   # a record to write, never read: tuning data
    errors = [np.zeros(3, np.int64)] if L.index_checks.INDEX_ERRORS in func.params else []
    func, workspace = workspace_params(func)
    arrays = list(arrays) + errors + \
        [np.empty(L.static_shape(b.shape), b.dtype.np) for b in workspace]
    mb = ModuleBuilder("tune", target.feature_set)
    mb.add(func)
    jit = JITModule(str(mb), target, DEFAULT_LEVELS.codegen, name="tune")   # as compiled
    entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
        jit.address(f"{func.name}_packed"))
    slots = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    sizes = (ctypes.c_int64 * 1)()

    def call() -> None:
        entry(slots, sizes)

    call.jit = jit   # the module lives as long as the function
    call.arrays = arrays   # and the workspace with it
    return call
