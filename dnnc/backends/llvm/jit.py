"""JIT compilation for the llvm target: a `Target`'s LLVM target machine, LLVM's optimisation
pipeline, and `JITModule`, one module compiled by MCJIT for a Target. Every LLVM call that may
take LLVM's own locks holds `process.llvm_lock()` (fork safety). It must never know what the
IR it compiles computes."""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite.binding import ffi
from llvmlite.binding.ffi import _is_shutting_down

from ...ir.target import Target
from ...levels import DEFAULT_LEVELS
from .amx import TILE_DOTS, request_tile_state
from .cpu import llvm_cpu
from .process import initialize, llvm_lock
from .workers import ensure_pool


def target_machine(target: Target, opt: int = DEFAULT_LEVELS.codegen):
    initialize()
    if any(needs <= target.feature_set for _, needs in TILE_DOTS.values()):
        # code for a CPU with tiles may run them: this process (and a worker forked from
        # it) asks Linux for their state first, once (a spawned measuring worker too)
        request_tile_state()
    name, features = llvm_cpu(target)
    # reloc/code model defaults suit MCJIT on x86-64 and aarch64 alike
    return llvm.Target.from_default_triple().create_target_machine(cpu=name, features=features,
                                                                   opt=opt)


# (cpu, features, speed level) -> the pass builder and its target machine, one each for the
# process: LLVM never frees what a pass builder registers (~1 KB each under llvmlite 0.50),
# and an engine takes ownership of the target machine it compiles with, so this one is kept
# apart. Used only under `llvm_lock()`.
_pass_builders: dict[tuple, tuple] = {}


def optimize(module, target: Target, speed_level: int = DEFAULT_LEVELS.codegen) -> None:
    """The new pass manager's standard pipeline: loop and SLP vectorizers for `target`'s ISA.
    Call under `llvm_lock()`."""
    key = (*llvm_cpu(target), speed_level)
    if key not in _pass_builders:
        tm = target_machine(target, opt=speed_level)
        pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_unrolling = True
        _pass_builders[key] = (llvm.create_pass_builder(tm, pto), tm, pto)
    pb = _pass_builders[key][0]
    pm = pb.getModulePassManager()
    try:
        pm.run(module, pb)
    finally:
        _free(pm)


def _free(pm) -> None:
    """Free pass manager `pm` now. llvmlite 0.50 never frees one (ObjectRef's empty `_dispose`
    precedes NewPassManager's in ModulePassManager's bases): ~30 KB a compile (issue 30, item
    6). The first `_dispose` below ObjectRef's is the real one in every llvmlite (0.44 defines
    it on ModulePassManager itself); `detach` keeps llvmlite from freeing it twice."""
    for cls in type(pm).__mro__:
        if cls is not ffi.ObjectRef and "_dispose" in vars(cls):
            cls._dispose(pm)
            break
    pm.detach()


def _owned_context():
    """A new LLVM context that only its JITModule frees (`pointer`: its address), after the
    engine. Its own finalizer would free it whenever Python runs it: a cyclic collection
    runs the finalizers of everything it frees in no set order, and the context freed
    before the engine frees the engine's module twice (the torch backend's tests aborted so
    on the device host)."""
    context = llvm.create_context()
    context.pointer = context._ptr
    context._owned = True   # (llvmlite's flag: ObjectRef.close then frees nothing)
    return context


class JITModule:
    """One compiled LLVM module, alive as long as this object, compiled at `codegen_level`
    (LLVM's -O level: `levels.levels(opt_level).codegen` for a model's segments). Its engine,
    machine code and LLVM context are freed with it (issue 30, item 6: ~90 KB a compile was
    kept before)."""

    def __init__(self, ir_text: str, target: Target,
                 codegen_level: int = DEFAULT_LEVELS.codegen, name: str = "dnnc"):
        initialize()
        ensure_pool()
        self.target = target
        with llvm_lock():   # fork safety: process.py
            # a context of its own: LLVM's global one keeps every constant and type a module
            # used (each batch size's bounds, the layout digest) for the process's life
            self.context = _owned_context()
            self.module = llvm.parse_assembly(ir_text, context=self.context)
            self.module.name = name
            self.module.verify()
            self.tm = target_machine(target, opt=min(codegen_level, 3))
            self.module.triple = self.tm.triple
            self.module.data_layout = str(self.tm.target_data)
            if codegen_level > 0:
                optimize(self.module, target, speed_level=min(codegen_level, 3))
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

    def __del__(self):
        # the engine (which frees its module), then the context. Runs once no caller holds
        # this module's code (references keep a specialisation that a call runs alive).
        if _is_shutting_down():
            return
        with llvm_lock():
            engine = getattr(self, "engine", None)
            if engine is not None:
                engine.close()
            module = getattr(self, "module", None)
            if module is not None:   # (no engine took it: a compile that failed)
                module.close()
            context = getattr(self, "context", None)
            if context is not None:
                ffi.lib.LLVMPY_ContextDispose(context.pointer)
                context.detach()

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
