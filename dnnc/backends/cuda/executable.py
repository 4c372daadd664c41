"""The `cuda` target's runtime: the shared plan (`backends/plan.py`) run on an NVIDIA GPU.

Each segment specialisation (`plan.Program`) becomes one CUDA C unit (`codegen.render_module`
over `program.unique`), compiled by NVRTC for the GPU's architecture through the on-disk
module cache (`device.ModuleCache`) and loaded once. Its calls become a launch list
(`launch_list`): every kernel's launches in order, each argument an external slot, an arena
offset or a workspace offset (scratch a kernel's launches share, carved per call from one
region sized for the hungriest kernel).

Memory (`_Layout`): constants are uploaded once per specialisation; each calling thread's
frame holds one device allocation with the arena (`plan_memory`'s offsets), the workspace and
fixed buffers for the segment's inputs and outputs, so every launch's arguments are known
when the frame is built. The first run of a frame captures all launches as one CUDA graph
(GPU.md: 64 small launches 0.43 ms one by one, 0.066 ms replayed) and later runs replay it:
a run copies the inputs into their fixed buffers (NumPy host to device; CuPy and any
`__cuda_array_interface__` array device to device), replays the graph, and hands the output
buffers on, all on the caller's current CuPy stream.

At the segment boundary: segments pass device arrays to each other; a host fallback step gets
NumPy arrays (`_run_host`); the model's outputs come back as NumPy, or as CuPy arrays with
`CUDARuntime.outputs = "cupy"` (a copy: the frame's buffers are reused by the next call).

`render_only` builds the sources without a GPU (`dnnc compile --emit cuda` on a machine
without one): `source()` works, running raises the `DeviceError` saying what is missing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentError, ArtifactError, CompileError, DeviceError
from ...ir import loop as L
from ...ir import types as T
from ...ir.graph import Graph, Node
from ...ir.segments import Segment
from ...ir.target import Target
from ..lower import Kernel
from ..plan import DEFAULT_CACHE_SIZE, Call, CompiledSegment, Executable, Program, image_consts
from . import device

DEVICE_ALIGN = 256
"""Byte alignment of every device buffer (cudaMalloc's): enough for any vector access."""

OUTPUT_KINDS = ("numpy", "cupy")


def _aligned(n: int) -> int:
    return (n + DEVICE_ALIGN - 1) // DEVICE_ALIGN * DEVICE_ALIGN


@dataclass(frozen=True)
class BoundLaunch:
    """One launch of a segment, with its arguments as places: ("ext", slot), ("arena", byte
    offset) or ("workspace", byte offset)."""

    call: int                        # the call (and kernel) of the program it belongs to
    name: str                        # the __global__ symbol
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[tuple[str, int], ...]


def launch_list(calls: list[Call], kernels: dict) -> tuple[list[BoundLaunch], int]:
    """Every launch of `calls` in order, and the workspace bytes they need: a call's kernel
    (`kernels[call.func]`, a `codegen.CudaKernel`) takes the call's arguments and then one
    pointer per workspace buffer; calls run one after another, so each carves its buffers
    from offset 0 of one shared region."""
    launches: list[BoundLaunch] = []
    workspace = 0
    for k, call in enumerate(calls):
        kernel = kernels.get(call.func)
        if kernel is None:
            raise CompileError(f"the CUDA module has no kernel for function {call.func!r}")
        offsets, used = [], 0
        for size in kernel.workspace:
            offsets.append(used)
            used += _aligned(size)
        workspace = max(workspace, used)
        args = tuple(call.args) + tuple(("workspace", o) for o in offsets)
        for launch in kernel.launches:
            launches.append(BoundLaunch(k, launch.name, tuple(launch.grid), tuple(launch.block),
                                        launch.shared_bytes, args))
    return launches, workspace


def resolve(args: tuple[tuple[str, int], ...], ext: list[int], arena: int,
            workspace: int) -> tuple[int, ...]:
    """A launch's argument places as device addresses."""
    base = {"arena": arena, "workspace": workspace}
    return tuple(ext[k] if kind == "ext" else base[kind] + k for kind, k in args)


@dataclass
class SegmentImage:
    """A compiled specialisation as plain data: what an artifact stores to run it again."""

    step: int                              # index of its Segment in the plan
    shapes: tuple                          # the input shapes it was specialised to
    values: tuple                          # ((input position, (ints...)), ...): value key
    escaping_types: list[T.TensorType]     # of the segment's outputs, in slot order
    consts: list[tuple[int, int]]          # constant slots: (node in segment, input position)
    n_inputs: int
    arena_bytes: int
    workspace_bytes: int
    launches: list[BoundLaunch]
    source: str                            # the CUDA C unit
    arch: str                              # what `cubin` was built for
    cubin: bytes
    loop_ir: str = ""

    @property
    def slots(self) -> int:
        return self.n_inputs + len(self.escaping_types) + len(self.consts)


def _check_launches(step: Segment, image: SegmentImage) -> None:
    """Refuse launches that would reach outside the segment's buffers: every argument a slot
    the segment has or an offset inside the arena or the workspace (an `ArtifactError`)."""
    bounds = {"ext": image.slots, "arena": max(image.arena_bytes, 1),
              "workspace": max(image.workspace_bytes, 1)}
    for launch in image.launches:
        for kind, k in launch.args:
            if kind not in bounds or not 0 <= k < bounds[kind]:
                raise ArtifactError(f"segment {step.index}: launch {launch.name} has argument "
                                    f"({kind}, {k}) outside the segment's buffers")


@dataclass(frozen=True)
class _Layout:
    """Byte offsets in a frame's one allocation: arena, workspace, then each input and output
    buffer, every one `DEVICE_ALIGN`-aligned."""

    arena: int
    workspace: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    total: int

    @classmethod
    def of(cls, arena_bytes: int, workspace_bytes: int, input_bytes: list[int],
           output_bytes: list[int]) -> "_Layout":
        at = 0
        places = []
        for size in [arena_bytes, workspace_bytes, *input_bytes, *output_bytes]:
            places.append(at)
            at += _aligned(max(size, 1))
        n = len(input_bytes)
        return cls(places[0], places[1], tuple(places[2:2 + n]), tuple(places[2 + n:]), at)


def _storage(dtype: np.dtype) -> np.dtype:
    """The dtype a CuPy array holds `dtype`'s bits in: itself, or an unsigned integer of its
    width for the ones CuPy lacks (bfloat16, an ml_dtypes void type)."""
    return np.dtype(f"u{dtype.itemsize}") if dtype.kind == "V" else dtype


def _is_device(a) -> bool:
    return hasattr(a, "__cuda_array_interface__")


class CUDARuntime(Executable):
    """Runs a graph as GPU segments and host steps; thread-safe (one frame per thread)."""

    def __init__(self, graph: Graph, target: Target | None = None, opt_level: int = 3,
                 progress: bool | None = None, plan: list[dict] | None = None,
                 reuse_memory: bool | None = None, warm_up: bool = True,
                 cache_size: int = DEFAULT_CACHE_SIZE, render_only: bool = False,
                 outputs: str = "numpy", module_cache: device.ModuleCache | None = None,
                 tuned: dict | None = None):
        super().__init__(graph, opt_level=opt_level, progress=progress, plan=plan,
                         reuse_memory=reuse_memory, warm_up=warm_up, cache_size=cache_size,
                         tuned=tuned)
        self.render_only = render_only
        self.cupy = None if render_only else device.import_cupy()
        self.target = target or device.machine()
        self.threads = self.target.threads
        self.outputs = outputs
        self.module_cache = module_cache or device.ModuleCache()
        self.start()

    @property
    def outputs(self) -> str:
        """What a call returns: "numpy" (the default) or "cupy" (device arrays of its own)."""
        return self._outputs

    @outputs.setter
    def outputs(self, kind: str) -> None:
        if kind not in OUTPUT_KINDS:
            raise ArgumentError(f"outputs must be one of {', '.join(OUTPUT_KINDS)}, not "
                                f"{kind!r}")
        self._outputs = kind

    # -- what a target supplies ---------------------------------------------------------------

    def schedule_kernel(self, kernel: Kernel, config=None) -> L.PrimFunc:
        from .schedules import schedule_kernel

        return schedule_kernel(kernel, self.target, config=config)

    def compile_segment(self, program: Program) -> "_CompiledSegment":
        from .codegen import render_module

        return _CompiledSegment(program, render_module(program.unique), self)

    def describe_machine(self) -> str:
        if self.render_only:
            return f"{self.target.arch} (rendering only)"
        return device.describe()

    # -- running ------------------------------------------------------------------------------

    def run(self, inputs: list, bindings: dict[str, int]) -> list:
        self._check_device()
        return self._deliver(super().run(inputs, bindings))

    def profile(self, inputs: list, repeat: int = 20) -> tuple[list, list[dict]]:
        self._check_device()
        outs, rows = super().profile(inputs, repeat)
        return self._deliver(outs), rows

    def _check_device(self) -> None:
        if self.render_only:
            raise DeviceError(f"this cuda model was built for its source only: "
                              f"{device.unavailable_reason() or 'compile it again to run it'}")

    def _deliver(self, outs: list) -> list:
        """The model's outputs as `outputs` says: device arrays (which may be a frame's
        reused buffers) copied or moved to the host."""
        if self._outputs == "cupy":
            return [self.cupy.array(a) for a in outs]   # a copy, on the current stream
        return [self._to_host(a, v.type.dtype.np) for v, a in zip(self.graph.outputs, outs)]

    def _to_host(self, a, dtype: np.dtype) -> np.ndarray:
        if not _is_device(a):
            return a
        cupy = self.cupy
        host = cupy.asnumpy(cupy.asarray(a), stream=cupy.cuda.get_current_stream())
        return host.view(dtype)

    def _segment_call(self, step, env):
        """A segment's value inputs (read at compile time) come to the host first."""
        for i in step.value_inputs:
            v = step.inputs[i]
            if _is_device(env.get(id(v))):
                env[id(v)] = self._to_host(env[id(v)], v.type.dtype.np)
        return super()._segment_call(step, env)

    def _run_host(self, node: Node, env) -> None:
        """A host step reads NumPy: device arrays it takes come to the host first."""
        for v in node.inputs:
            if v is not None and _is_device(env.get(id(v))):
                env[id(v)] = self._to_host(env[id(v)], v.type.dtype.np)
        super()._run_host(node, env)

    # -- artifacts ----------------------------------------------------------------------------

    @classmethod
    def restore(cls, graph: Graph, plan: list[dict], images: list["SegmentImage"],
                target: Target, opt_level: int = 3, progress: bool | None = None,
                cache_size: int = DEFAULT_CACHE_SIZE,
                tuned: dict | None = None) -> "CUDARuntime":
        """A runtime from a saved plan and compiled specialisations: no passes, no lowering;
        a cubin built for another architecture is rebuilt from its source; shapes not among
        `images` compile on first use (with the `tuned` configs the compile had)."""
        rt = cls(graph, target=target, opt_level=opt_level, progress=progress, plan=plan,
                 cache_size=cache_size, tuned=tuned)
        for image in images:
            step = rt.steps[image.step]
            if not isinstance(step, Segment):
                raise ArtifactError(f"image for step {image.step}, which is not a segment")
            rt._cache[(step.index, image.shapes, image.values)] = \
                _CompiledSegment.from_image(step, image, rt)
        return rt

    def images(self) -> list["SegmentImage"]:
        """Every specialisation compiled so far, as data an artifact can store."""
        if self.render_only:
            raise DeviceError(f"a cuda model built for its source only cannot be saved: "
                              f"{device.unavailable_reason() or 'compile it on a GPU'}")
        with self._lock:
            return [seg.image() for seg in list(self._cache.values())]

    # -- introspection ------------------------------------------------------------------------

    def source(self, kind: str = "cuda") -> str:
        """"cuda": the CUDA C of every specialisation compiled so far; "loop": their
        scheduled loop IR."""
        segments = list(self._cache.values())
        if kind == "cuda":
            return "\n".join(seg.source for seg in segments)
        if kind == "loop":
            return "\n".join(seg.loop_source() for seg in segments)
        raise ValueError(f"unknown source kind {kind!r}: cuda or loop")


@dataclass
class _Frame:
    """One calling thread's device state for a segment."""

    memory: object                  # the cupy MemoryPointer of its one allocation
    inputs: list[int]               # input buffers' addresses
    outputs: list                   # output buffers as CuPy arrays (views of `memory`)
    arena: int                      # the arena's address
    launches: list[tuple]           # (function, grid, block, shared bytes, argument tuple)
    capture: object                 # the non-blocking stream graphs are captured on
    graph: object = None            # the captured CUDA graph, after the first run


class _CompiledSegment(CompiledSegment):
    """One segment specialised to concrete input shapes: module, launch list, constants."""

    def __init__(self, program: Program, module, rt: CUDARuntime):
        self._take_program(program)
        self.source = module.source
        self._loop_ir = ""
        self.launches, self.workspace_bytes = launch_list(program.calls, module.kernels)
        self._bind(rt, program.consts, None, "")

    @classmethod
    def from_image(cls, step: Segment, image: "SegmentImage", rt: CUDARuntime):
        """A specialisation restored from an artifact: its cubin is loaded when it was built
        for this GPU's architecture, else its source is compiled again for this one."""
        self = cls.__new__(cls)
        self._take_image(step, image)
        self.source = image.source
        self._loop_ir = image.loop_ir
        self.launches, self.workspace_bytes = list(image.launches), image.workspace_bytes
        consts = image_consts(step, image)
        _check_launches(step, image)
        self._bind(rt, consts, image.cubin, image.arch)
        return self

    def _bind(self, rt: CUDARuntime, consts: list[np.ndarray], cubin: bytes | None,
              built_for: str) -> None:
        """Frame layout, and on a GPU the module (`cubin` when it was built for this GPU's
        architecture, else compiled from the source) and the constants on the device."""
        step = self.step
        self.frames = threading.local()
        data = [i for i, v in enumerate(step.inputs) if v.const is None]
        self.input_types = [(self.shapes[i], step.inputs[i].type.dtype.np) for i in data]
        self.output_types = [(tuple(t.shape), t.dtype.np) for t in self.escaping_types]
        self.layout = _Layout.of(self.arena_bytes, self.workspace_bytes,
                                 [_nbytes(s, d) for s, d in self.input_types],
                                 [_nbytes(s, d) for s, d in self.output_types])
        self.cupy = rt.cupy
        self.arch = rt.target.arch
        self.cubin = b""
        if self.cupy is None:   # rendering only
            return
        if cubin is None or built_for != self.arch:
            cubin = rt.module_cache.get(self.source, self.arch, device.nvrtc_options(self.arch))
        self.cubin = cubin
        self._module = self.cupy.cuda.function.Module()
        self._module.load(cubin)
        self._functions = {}
        for launch in self.launches:
            if launch.name not in self._functions:
                self._functions[launch.name] = self._function(launch)
        self._upload_constants(consts)

    def loop_source(self) -> str:
        return "\n".join(str(k.func) for k in self.kernels) if self.kernels else self._loop_ir

    def image(self) -> "SegmentImage":
        return SegmentImage(
            step=self.step.index, shapes=self.shapes, values=self.key_values,
            escaping_types=list(self.escaping_types), consts=list(self.const_refs),
            n_inputs=self.n_inputs, arena_bytes=self.arena_bytes,
            workspace_bytes=self.workspace_bytes, launches=list(self.launches),
            source=self.source, arch=self.arch, cubin=self.cubin, loop_ir=self.loop_source())

    def _function(self, launch: BoundLaunch):
        """The loaded __global__ function, allowed the dynamic shared memory its largest
        launch asks for (beyond 48 KiB needs the attribute set)."""
        fn = self._module.get_function(launch.name)
        shared = max(b.shared_bytes for b in self.launches if b.name == launch.name)
        if shared > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = shared
        return fn

    def _upload_constants(self, consts: list[np.ndarray]) -> None:
        """Every constant in one device allocation, copied once."""
        cupy = self.cupy
        at, places = 0, []
        arrays = [np.ascontiguousarray(c) for c in consts]
        for a in arrays:
            places.append(at)
            at += _aligned(max(a.nbytes, 1))
        self._consts = cupy.cuda.alloc(max(at, 1))
        base = self._consts.ptr
        for a, place in zip(arrays, places):
            if a.nbytes:
                cupy.cuda.runtime.memcpy(base + place, a.ctypes.data, a.nbytes,
                                         cupy.cuda.runtime.memcpyHostToDevice)
        self._const_ptrs = [base + p for p in places]

    def frame(self) -> _Frame:
        """A calling thread's allocation, with every launch's arguments resolved in it."""
        if self.cupy is None:
            raise DeviceError(f"no GPU to run on: {device.unavailable_reason()}")
        cupy = self.cupy
        memory = cupy.cuda.alloc(self.layout.total)
        base = memory.ptr
        inputs = [base + o for o in self.layout.inputs]
        outputs = [cupy.ndarray(shape, _storage(dtype), memory + o)
                   for (shape, dtype), o in zip(self.output_types, self.layout.outputs)]
        ext = inputs + [base + o for o in self.layout.outputs] + self._const_ptrs
        arena, workspace = base + self.layout.arena, base + self.layout.workspace
        launches = [(self._functions[b.name], b.grid, b.block, b.shared_bytes,
                     tuple(np.uint64(p) for p in resolve(b.args, ext, arena, workspace)))
                    for b in self.launches]
        return _Frame(memory, inputs, outputs, arena, launches,
                      cupy.cuda.Stream(non_blocking=True))

    def _copy_in(self, arrays: list, frame: _Frame, stream) -> list:
        """Copy the data inputs into the frame's buffers on `stream`; returns what must stay
        alive until the copies are done (contiguous temporaries)."""
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        data = [a for v, a in zip(self.step.inputs, arrays) if v.const is None]
        keep = []
        for a, dst, (shape, dtype) in zip(data, frame.inputs, self.input_types):
            nbytes = _nbytes(shape, dtype)
            if not nbytes:
                continue
            if _is_device(a):
                src = _contiguous_address(a, cupy, keep)
                runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDeviceToDevice,
                                    stream.ptr)
            else:
                host = np.ascontiguousarray(a)
                keep.append(host)
                runtime.memcpyAsync(dst, host.ctypes.data, nbytes,
                                    runtime.memcpyHostToDevice, stream.ptr)
        return keep

    @staticmethod
    def _launch(frame: _Frame, stream, launches=None) -> None:
        for fn, grid, block, shared, args in (frame.launches if launches is None else launches):
            fn(grid, block, args, shared_mem=shared, stream=stream)

    def run(self, arrays: list, frame: _Frame) -> list:
        """The segment's outputs as device arrays: the frame's output buffers, valid until
        this thread's next run of the segment (`CUDARuntime` copies what it hands out)."""
        stream = self.cupy.cuda.get_current_stream()
        keep = self._copy_in(arrays, frame, stream)
        if frame.graph is None:
            frame.graph = self._capture(frame)
        frame.graph.launch(stream=stream)
        del keep   # host sources were staged by memcpyAsync; device ones are the caller's
        return list(frame.outputs)

    def _capture(self, frame: _Frame):
        """Every launch of the segment, captured once as a CUDA graph on the frame's
        non-blocking stream (nothing in it allocates, copies to the host or synchronises)."""
        stream = frame.capture
        stream.begin_capture()
        try:
            self._launch(frame, stream)
        finally:
            graph = stream.end_capture()
        return graph

    def profile(self, arrays: list, frame: _Frame, repeat: int) -> tuple[list, list]:
        """The outputs, and each kernel's median milliseconds over `repeat` runs of its
        launches alone, timed with CUDA events (in order, each on the data the kernels
        before it left: the arena is restored after an in-place kernel's repeats)."""
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        stream = cupy.cuda.get_current_stream()
        keep = self._copy_in(arrays, frame, stream)
        saved = cupy.cuda.alloc(max(self.arena_bytes, 1))
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        rows = []
        for k, kernel in enumerate(self.kernels):
            launches = [la for la, b in zip(frame.launches, self.launches) if b.call == k]
            if self.arena_bytes:
                runtime.memcpyAsync(saved.ptr, frame.arena, self.arena_bytes,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            times = []
            for _ in range(repeat):
                start.record(stream)
                self._launch(frame, stream, launches)
                end.record(stream)
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end))
            if self.arena_bytes:
                runtime.memcpyAsync(frame.arena, saved.ptr, self.arena_bytes,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            self._launch(frame, stream, launches)
            rows.append((kernel, float(np.median(times))))
        stream.synchronize()
        del keep
        return list(frame.outputs), rows


def _nbytes(shape, dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _contiguous_address(a, cupy, keep: list) -> int:
    """The device address of `a`'s data in C order (a contiguous device copy kept in `keep`
    when `a` is strided)."""
    face = a.__cuda_array_interface__
    shape, strides = tuple(face["shape"]), face.get("strides")
    itemsize = np.dtype(face["typestr"]).itemsize
    if strides is None or tuple(strides) == _c_strides(shape, itemsize):
        return face["data"][0]
    copy = cupy.ascontiguousarray(cupy.asarray(a))
    keep.append(copy)
    return copy.__cuda_array_interface__["data"][0]


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))
