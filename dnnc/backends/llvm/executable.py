"""The `llvm` target's runtime: the shared plan (`backends/plan.py`) rendered as LLVM modules.

Each segment specialisation (`plan.Program`) becomes one LLVM module whose entry function calls
every kernel of the segment in order (one foreign call per segment; a graph without host
fallbacks is one call), its kernels rendered by `codegen.ModuleBuilder`, compiled by MCJIT and
bound to a calling thread's arena and slot array. Everything before rendering (segments,
specialisation, lowering, kernel de-duplication, memory planning, the LRU cache, host steps)
is shared: `backends/plan.py` builds, `backends/executable.py` runs.

Artifacts: `plan()` and `images()` describe the steps and every compiled specialisation
(object code and its calling layout) as plain data; `LLVMRuntime.restore` rebuilds a runtime
from them without lowering or LLVM passes, loading each object file into its own MCJIT engine
(`ObjectModule`) after `objfile.check_object`, and refusing one whose compiled-in layout digest
(`layout_digest`) differs from the plan's and graph's. `dnnc/compiler/artifact.py` owns the
file format.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np

from ...errors import ArtifactError, CompileError
from ...ir import loop as L
from ...ir import types as T
from ...ir.graph import Graph
from ...ir.segments import Segment
from ..lower import Kernel
from ..memory import ALIGN, aligned
from ..contract import CompiledSegment
from ..executable import Executable, index_error
from ..plan import Call, Program, image_consts, in_place_outputs
from ..specialisations import DEFAULT_CACHE_SIZE
from ...ir.target import Target
from ...levels import DEFAULT_OPT_LEVEL, levels
from .codegen import ModuleBuilder, workspace_params
from .cpu import host_target
from .in_place import alias_free
from .jit import JITModule, target_machine
from .objfile import check_object
from .process import at_fork_in_child, initialize, llvm_lock
from .workers import ensure_pool
from .schedules import schedule_kernel


@dataclass
class SegmentImage:
    """A compiled specialisation as plain data: what an artifact stores to call it again."""

    step: int                              # index of its Segment in the plan
    shapes: tuple                          # the input shapes it was specialised to (cache key)
    escaping_types: list[T.TensorType]     # of the segment's outputs, in slot order
    consts: list[tuple[int, int]]          # constant slots: (node in segment, input position)
    n_inputs: int
    slots: int
    arena_bytes: int
    entry: str
    object_code: bytes
    llvm_ir: str = ""                      # for `source()` after a load; optional
    loop_ir: str = ""
    values: tuple = ()                     # ((input position, (ints...)), ...): value key
    kernel_count: int = 0                  # kernels a call (0: not recorded)


class LLVMRuntime(Executable):
    """Runs a graph as native segments and host steps; thread-safe and fork-safe. Its
    `TargetHooks`: LLVM modules per `Program`, the llvm templates, batch splitting.
    Constructing one compiles nothing: `start()` does (`LLVMRuntime(...).start()`)."""

    def __init__(self, graph: Graph, target: Target | None = None,
                 opt_level: int = DEFAULT_OPT_LEVEL, progress: bool | None = None,
                 plan: list[dict] | None = None,
                 reuse_memory: bool | None = None, warm_up: bool = True,
                 cache_size: int = DEFAULT_CACHE_SIZE, tuned: dict | None = None):
        super().__init__(graph, opt_level=opt_level, progress=progress, plan=plan,
                         reuse_memory=reuse_memory, warm_up=warm_up, cache_size=cache_size,
                         tuned=tuned)
        self.target = target or host_target()
        self.threads = self.target.threads
        at_fork_in_child(self)

    @classmethod
    def restore(cls, graph: Graph, plan: list[dict], images: list[SegmentImage],
                target: Target, opt_level: int = DEFAULT_OPT_LEVEL,
                progress: bool | None = None,
                cache_size: int = DEFAULT_CACHE_SIZE,
                tuned: dict | None = None) -> "LLVMRuntime":
        """A runtime from a saved plan and compiled specialisations: no lowering, no LLVM
        passes; shapes not among `images` still compile on first use (with the `tuned`
        configs the compile had). Every image is kept, even past `cache_size`; the cache
        shrinks to its size when it next compiles."""
        rt = cls(graph, target=target, opt_level=opt_level, progress=progress, plan=plan,
                 cache_size=cache_size, tuned=tuned)
        for image in images:
            step = rt.steps[image.step]
            if not isinstance(step, Segment):
                raise ValueError(f"image for step {image.step}, which is not a segment")
            rt._cache[(step.index, image.shapes, image.values)] = \
                _CompiledSegment.from_image(step, image, rt)
        return rt

    batch_split = True

    def schedule_kernel(self, kernel: Kernel, config=None) -> L.PrimFunc:
        return schedule_kernel(kernel, self.target, config=config)

    def compile_segment(self, program: Program) -> "_CompiledSegment":
        return _CompiledSegment(program, self)

    def describe_machine(self) -> str:
        return self.target.cpu

    def source(self, kind: str = "llvm") -> str:
        parts = []
        for seg in list(self._cache.values()):
            if kind in ("llvm", "llvm-ir"):
                parts.append(seg.jit.optimized_ir())
            elif kind == "asm":
                parts.append(seg.jit.assembly())
            elif kind == "loop":
                parts.append(seg.loop_source())
            else:
                raise ValueError(f"unknown source kind {kind!r}: llvm, asm or loop")
        return "\n".join(parts)


def _with_workspace(program: Program) -> tuple[list, list[Call], int]:
    """The program's functions and calls with each kernel's workspace (its whole-body GLOBAL
    scratch, `codegen.workspace_params`) as trailing arguments in the arena, past the memory
    plan's values, and the arena's bytes with it. Calls run one after another, so every call
    carves its buffers from the start of one region as big as the largest call needs."""
    base = aligned(program.arena_bytes)
    unique, sizes = [], {}
    for func, noalias in program.unique:
        func, buffers = workspace_params(func)
        unique.append((func, noalias))
        sizes[func.name] = [math.prod(L.static_shape(b.shape)) * b.dtype.itemsize
                            for b in buffers]
    calls, used_most = [], 0
    for call in program.calls:
        extra, used = [], 0
        for size in sizes.get(call.func, ()):
            extra.append(("arena", base + used))
            used += aligned(size)
        used_most = max(used_most, used)
        calls.append(Call(call.func, list(call.args) + extra) if extra else call)
    return unique, calls, (base + used_most if used_most else program.arena_bytes)


@dataclass
class _Frame:
    arena: np.ndarray
    arena_ptr: int
    slots: ctypes.Array
    errors: np.ndarray     # the kernels' error record (`loop.index_checks`), slot `slots`


def _address(a: np.ndarray) -> int:
    """The data pointer of a contiguous array (5x cheaper than `a.ctypes.data` where the
    buffer is writable, which every array but a read-only view is)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


class _CompiledSegment(CompiledSegment):
    """One segment specialised to concrete input shapes: kernels, module, arena layout."""

    def __init__(self, program: Program, rt: LLVMRuntime):
        self._take_program(program)
        step = program.step
        unique, self.calls, self.arena_bytes = _with_workspace(program)
        unique = alias_free(unique, self.calls)   # in-place kernels vectorize too
        self.arena_workspace_bytes = self.arena_bytes - program.arena_bytes
        mb = ModuleBuilder(f"segment{step.index}", rt.target.feature_set)
        for func, noalias in unique:
            mb.add(func, noalias=noalias)
        mb.add_entry("entry", [(c.func, c.args) for c in self.calls])
        digest = layout_digest(step, program.shapes, program.key_values,
                               program.escaping_types, program.const_refs, program.consts,
                               program.n_inputs, program.slots, self.arena_bytes, "entry",
                               rt.target, program.in_place)
        try:
            jit = JITModule(str(mb) + _layout_global(digest), rt.target,
                            levels(rt.opt_level).codegen,
                            name=f"segment{step.index}")
        except RuntimeError as exc:
            names = ", ".join(f"{n.op} {n.name!r}" for n in step.nodes[:5])
            raise CompileError(f"LLVM rejected the code for segment {step.index} ({names}"
                               f"{', ...' if len(step.nodes) > 5 else ''}): {exc}") from exc
        self._bind(jit, "entry", program.consts, program.slots)

    @classmethod
    def from_image(cls, step: Segment, image: SegmentImage, rt: LLVMRuntime):
        """A specialisation restored from an artifact: its object code is loaded, nothing is
        lowered or optimised again."""
        self = cls.__new__(cls)
        self._take_image(step, image, in_place_outputs(rt.graph, step))
        self._loop_ir = image.loop_ir
        consts = image_consts(step, image)
        jit = ObjectModule(image.object_code, rt.target, name=f"segment{step.index}",
                           llvm_ir=image.llvm_ir)
        want = layout_digest(step, image.shapes, image.values, image.escaping_types,
                             image.consts, consts, image.n_inputs, image.slots,
                             image.arena_bytes, image.entry, rt.target, self.in_place)
        if jit.layout() != want:
            raise ArtifactError(
                f"the object code of segment {step.index} (shapes {list(image.shapes)}) was "
                f"compiled for another calling layout, graph or CPU than the manifest and "
                f"graph describe")
        self._bind(jit, image.entry, consts, image.slots)
        return self

    def _bind(self, jit, entry: str, consts: list[np.ndarray], slots: int) -> None:
        self.jit = jit
        self.entry_name = entry
        self.entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(jit.address(entry))
        self.consts = [np.ascontiguousarray(c) for c in consts]
        self.slots = slots
        self._const_ptrs = [c.ctypes.data for c in self.consts]
        self.frames = threading.local()   # each calling thread's `_Frame`
        self._data_inputs = [i for i, v in enumerate(self.step.inputs) if v.const is None]
        self._outputs = [(t.shape, t.dtype.np) for t in self.escaping_types]

    def frame(self) -> "_Frame":
        """What one thread needs to call this segment: its arena and a slot array with the
        constants' pointers already in place (building a ctypes array of a hundred pointers
        costs more than a small model's kernels)."""
        raw = np.empty(self.arena_bytes + ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % ALIGN
        arena = raw[skip:skip + self.arena_bytes]
        slots = (ctypes.c_void_p * (self.slots + 1))()
        first = self.n_inputs + len(self.escaping_types)
        for k, ptr in enumerate(self._const_ptrs):
            slots[first + k] = ptr
        errors = np.zeros(3, np.int64)
        slots[self.slots] = errors.ctypes.data
        return _Frame(arena, arena.ctypes.data, slots, errors)

    def _fill(self, arrays: list[np.ndarray], frame: "_Frame", outs: list | None = None
              ) -> list:
        """The call's outputs (`outs`, contiguous arrays of the outputs' shapes and dtypes,
        or fresh ones; an output computed in place, its input's array), their pointers and
        those of the data inputs `arrays` (contiguous; kept alive by the caller until the
        call returns) written into the frame's slots."""
        if outs is None:
            outs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
            for e, d in self.in_place.items():
                outs[e] = arrays[d]
        else:   # (a batch split's slices: the kernel updates a copy of the input there)
            for e, d in self.in_place.items():
                np.copyto(outs[e], arrays[d])
        slots = frame.slots
        for k, a in enumerate(arrays + outs):
            slots[k] = _address(a)
        return outs

    def run(self, inputs: list[np.ndarray], frame: "_Frame", outs: list | None = None
            ) -> list[np.ndarray]:
        return self._call([np.ascontiguousarray(inputs[i]) for i in self._data_inputs], frame,
                          outs)

    def _call(self, arrays: list[np.ndarray], frame: "_Frame", outs: list | None = None
              ) -> list[np.ndarray]:
        """`run` on the data inputs, C-order (`_fill`)."""
        outs = self._fill(arrays, frame, outs)
        self.entry(frame.slots, frame.arena_ptr)
        if frame.errors[0]:   # an index out of range (the test: ~80 ns a call)
            raise index_error(self.step, frame.errors)
        return outs

    def fast(self, positions: list, returned: list[int], signature: list[tuple],
             checked: bool = True):
        """`run` as one closure over the model's call arguments (`Executable.fast_call`):
        `positions[i]` is the argument that is this segment's i-th input (None: a constant),
        `returned` the escaping values the model returns, in order, and `signature` the
        (shape, dtype) of each argument; other arguments get None. Without `checked`, every
        call's arguments are taken to fit `signature` (C-order NumPy arrays), unchecked: with
        the model's own checks gone too, a torch partition of a 2-layer MLP took 5.4-5.6 us
        a call instead of 6.9-7.0 (1 thread, CPU time, bench/torch_call_overhead.py)."""
        count, run, frames, frame_of = len(signature), self.run, self.frames, self.frame
        if not checked:
            data, bound = [positions[i] for i in self._data_inputs], self._call

            def unchecked(args) -> list[np.ndarray]:
                frame = getattr(frames, "frame", None)
                if frame is None:
                    frame = frames.frame = frame_of()
                outs = bound([args[p] for p in data], frame)
                return [outs[j] for j in returned]

            return unchecked

        def call(args) -> list[np.ndarray] | None:
            if len(args) != count:
                return None
            for a, (shape, dtype) in zip(args, signature):
                if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype \
                        or not a.flags.c_contiguous:
                    return None
            frame = getattr(frames, "frame", None)
            if frame is None:
                frame = frames.frame = frame_of()
            outs = run([None if i is None else args[i] for i in positions], frame)
            return [outs[j] for j in returned]

        return call

    def profile(self, inputs: list[np.ndarray], frame: "_Frame", repeat: int
                ) -> tuple[list[np.ndarray], list[tuple[Kernel, float]]]:
        """The segment's outputs, and each kernel's median milliseconds over `repeat` calls
        of that kernel alone (in order, on the data the kernels before it left; the outputs
        equal `run`'s)."""
        arrays = [np.ascontiguousarray(inputs[i]) for i in self._data_inputs]
        outs = self._fill(arrays, frame)
        arena = frame.arena
        rows = []
        for kernel, call in zip(self.kernels, self.calls):
            ptrs = [frame.slots[k] if kind == "ext" else frame.arena_ptr + k
                    for kind, k in call.args]
            fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(ptrs))(
                self.jit.address(call.func))
            # an in-place kernel applies itself again on every timed call: restore the arena
            # after timing, then run the kernel once more for the kernels after it
            saved = arena.copy()
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                fn(*ptrs)
                times.append((time.perf_counter() - start) * 1e3)
            arena[...] = saved
            fn(*ptrs)
            rows.append((kernel, float(np.median(times))))
        if frame.errors[0]:
            raise index_error(self.step, frame.errors)
        return outs, rows

    def loop_source(self) -> str:
        if self.kernels:
            return "\n".join(str(k.func) for k in self.kernels)
        return getattr(self, "_loop_ir", "")

    def image(self, with_source: bool = True) -> SegmentImage:
        return SegmentImage(
            step=self.step.index, shapes=self.shapes, escaping_types=list(self.escaping_types),
            consts=list(self.const_refs), n_inputs=self.n_inputs, slots=self.slots,
            arena_bytes=self.arena_bytes, entry=self.entry_name,
            object_code=self.jit.object_code(),
            llvm_ir=self.jit.optimized_ir() if with_source else "",
            loop_ir=self.loop_source() if with_source else "",
            values=self.key_values, kernel_count=self.kernel_count)


class ObjectModule:
    """Machine code loaded from an object file (a segment an artifact stored), in its own
    MCJIT engine; `dnnc_parallel_for` and libc/libm symbols resolve as for `JITModule`."""

    def __init__(self, data: bytes, target: Target, name: str = "dnnc", llvm_ir: str = ""):
        initialize()
        ensure_pool()  # registers dnnc_parallel_for before the object's relocations resolve
        self.target = target
        self.name = name
        self.tm = target_machine(target)
        self._data = bytes(data)
        needed = check_object(self._data)   # LLVM trusts the file: a malformed one crashes it
        with llvm_lock():   # LLVM's locks are never held across a fork (process.py)
            empty = llvm.parse_assembly("")
            empty.triple = self.tm.triple
            empty.data_layout = str(self.tm.target_data)
            self.engine = llvm.create_mcjit_compiler(empty, self.tm)
            # looked up after the engine exists (it makes the process's symbols searchable)
            missing = [sym for sym in needed if not llvm.address_of_symbol(sym)]
            if missing:
                raise ArtifactError(f"object code of {name} needs symbol(s) this process does "
                                    f"not have: {', '.join(sorted(missing)[:10])}")
            self._object = llvm.ObjectFileRef.from_data(self._data)
            self.engine.add_object_file(self._object)
            self.engine.finalize_object()
        self._ir = llvm_ir

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KeyError(f"no function {name!r} in object {self.name}")
        return addr

    def layout(self) -> bytes | None:
        """The layout digest compiled into the object (`layout_digest`), None without one."""
        addr = self.engine.get_global_value_address(LAYOUT_SYMBOL)
        return ctypes.string_at(addr, LAYOUT_BYTES) if addr else None

    def optimized_ir(self) -> str:
        return self._ir

    def assembly(self) -> str:
        """Assembly of the stored IR (not a disassembly of the loaded object)."""
        if not self._ir:
            return ""
        return self.tm.emit_assembly(llvm.parse_assembly(self._ir))

    def object_code(self) -> bytes:
        return self._data


# Each segment's object carries the SHA-256 of its calling layout as a global constant, read
# back after an artifact's object is loaded: code whose slots, arena, shapes, constants or CPU
# differ from what the manifest and graph say is refused instead of called.
LAYOUT_SYMBOL = "dnnc_layout"
LAYOUT_BYTES = 32


def layout_digest(step: Segment, shapes, values, escaping_types, const_refs, const_arrays,
                  n_inputs: int, slots: int, arena_bytes: int, entry: str,
                  target: Target, in_place: dict[int, int]) -> bytes:
    """The SHA-256 of everything a call of the segment's code relies on (`in_place`: the
    outputs its kernels compute over their inputs' arrays)."""
    doc = {"nodes": [[n.op, n.name] for n in step.nodes],
           "inputs": [[v.type.dtype.name, v.const is not None] for v in step.inputs],
           "shapes": [list(s) for s in shapes], "values": [[i, list(v)] for i, v in values],
           "escaping": [v.type.dtype.name for v in step.escaping],
           "escaping_types": [[t.dtype.name, list(t.shape)] for t in escaping_types],
           "consts": [[k, j, c.dtype.name, list(c.shape)]
                      for (k, j), c in zip(const_refs, const_arrays)],
           "n_inputs": n_inputs, "slots": slots, "arena_bytes": arena_bytes, "entry": entry,
           "cpu": [target.cpu, target.features]}
    if in_place:   # (absent where empty: earlier artifacts' digests stay valid)
        doc["in_place"] = sorted(in_place.items())
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).digest()


def _layout_global(digest: bytes) -> str:
    text = "".join(f"\\{b:02X}" for b in digest)
    return f'\n@{LAYOUT_SYMBOL} = constant [{len(digest)} x i8] c"{text}", align 1\n'
