"""JIT compilation for the llvm target: a `Target`'s LLVM target machine, LLVM's optimisation
pipeline, and `JITModule`, one module compiled by MCJIT for a Target. Every LLVM call that may
take LLVM's own locks holds `process.llvm_lock()` (fork safety). It must never know what the
IR it compiles computes."""

from __future__ import annotations

import llvmlite.binding as llvm

from ...ir.target import Target
from ...levels import DEFAULT_LEVELS
from .cpu import llvm_cpu
from .process import initialize, llvm_lock
from .workers import ensure_pool


def target_machine(target: Target, opt: int = DEFAULT_LEVELS.codegen):
    initialize()
    name, features = llvm_cpu(target)
    # reloc/code model defaults suit MCJIT on x86-64 and aarch64 alike
    return llvm.Target.from_default_triple().create_target_machine(cpu=name, features=features,
                                                                   opt=opt)


def optimize(module, tm, speed_level: int = DEFAULT_LEVELS.codegen) -> None:
    """The new pass manager's standard pipeline: loop and SLP vectorizers for `tm`'s ISA."""
    pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pm = pb.getModulePassManager()
    pm.run(module, pb)


class JITModule:
    """One compiled LLVM module, alive as long as this object, compiled at `codegen_level`
    (LLVM's -O level: `levels.levels(opt_level).codegen` for a model's segments)."""

    def __init__(self, ir_text: str, target: Target,
                 codegen_level: int = DEFAULT_LEVELS.codegen, name: str = "dnnc"):
        initialize()
        ensure_pool()
        self.target = target
        with llvm_lock():   # fork safety: process.py
            self.module = llvm.parse_assembly(ir_text)
            self.module.name = name
            self.module.verify()
            self.tm = target_machine(target, opt=min(codegen_level, 3))
            self.module.triple = self.tm.triple
            self.module.data_layout = str(self.tm.target_data)
            if codegen_level > 0:
                optimize(self.module, self.tm, speed_level=min(codegen_level, 3))
            self.engine = llvm.create_mcjit_compiler(self.module, self.tm)
            # keep the object MCJIT compiled and runs: emitting the module again
            # (tm.emit_object) gives other code (an MLP's: 10,416 bytes against the 10,384 that
            # ran), whose `entry` stack layout crashed when an artifact loaded it (issue 10,
            # item 1). A list, not self, receives it: no cycle keeps the engine alive.
            compiled: list[bytes] = []
            self.engine.set_object_cache(
                notify_func=lambda _, data: compiled.append(bytes(data)))
            self.engine.finalize_object()
            self.engine.run_static_constructors()
            self._object = compiled[0] if compiled else None

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KeyError(f"no function {name!r} in module {self.module.name}")
        return addr

    def optimized_ir(self) -> str:
        return str(self.module)

    def assembly(self) -> str:
        return self.tm.emit_assembly(self.module)

    def object_code(self) -> bytes:
        """The object file MCJIT loaded and runs (not a fresh emission of the module)."""
        if self._object is None:
            raise RuntimeError(f"MCJIT compiled module {self.module.name} without reporting "
                               f"its object code")
        return self._object
