"""The `cuda` target's runtime: the shared plan (`backends/plan.py`) run on an NVIDIA GPU.

Each segment specialisation (`plan.Program`) becomes one CUDA C unit (`codegen.render_module`
over `program.unique`), compiled by NVRTC for the GPU's architecture through the on-disk
module cache (`device.ModuleCache`) and loaded once. Its calls become a launch list
(`launch_list`): every kernel's launches in order, each argument an external slot, an arena
offset, a workspace offset (scratch a kernel's launches share, carved per call from one
region sized for the hungriest kernel) or a tensor map's (`TensorMapPlace`: a TMA copy's map
of an argument, `codegen.TensorMapArg`, encoded once that argument's address is known: when a
launch list is resolved on a frame's or a caller's addresses, 128 bytes a map copied to the
device then, kept as long as what reads them: the frame, or the graph captured on a caller's
addresses (`_CompiledSegment._retire`); an artifact carries the description, not the bytes).

Memory (`_Layout`): constants are uploaded once per specialisation; each calling thread's
frame holds one device allocation with the arena (`plan_memory`'s offsets), the workspace and
fixed buffers for the segment's inputs and outputs. A run replays a CUDA graph of all its
launches (GPU.md: 64 small launches 0.43 ms one by one, 0.066 ms replayed); a graph reads
fixed addresses, so a frame keeps one per tuple of input addresses (`_Frame`):

- the graph on the frame's own input buffers, into which a run copies its inputs (NumPy host
  to device; device arrays device to device, strided ones in C order);
- up to `GRAPHS_PER_FRAME` graphs on callers' device arrays (C-order CuPy, PyTorch, any
  `__cuda_array_interface__` or CUDA DLPack array), read in place: zero copy. Such a graph is
  captured the second time its addresses come (`SEEN_PER_FRAME` remembers the first), so a
  serving loop that reuses its input buffers pays no copy from its third call on, and a
  caller that allocates a fresh input per call pays one device copy, never a capture per call.
  A graph reads its addresses' contents when it is replayed: new data in a reused buffer is
  read, never stale data. An input of at most `COPIED_INPUT_BYTES` is always copied, so its
  address keys no graph;
- an output the graph writes into an input (`plan.in_place_outputs`) at that input's place
  in every launch list and graph: the caller's array where it is read in place.

A run works on the caller's stream (`CUDARuntime._caller_stream`: CuPy's current stream, or
PyTorch's current one when an input is a PyTorch tensor), after the work that produced a
`__cuda_array_interface__` input on the stream it names. Segments pass device arrays to each
other (read in place: their addresses are fixed); a host fallback step gets NumPy arrays
(`_run_host`). The model's outputs come back as `outputs` says (per call, or the runtime's
default, "cupy"): CuPy arrays of their own (a device copy of the frame's output buffers, which
the next call reuses: a returned array is never overwritten), PyTorch tensors of their own
("torch": the same copy into tensors from PyTorch's allocator, made on the caller's stream) or
NumPy arrays.

`render_only` builds the sources without a GPU (`dnnc compile --emit cuda` on a machine
without one): `source()` works, running raises the `DeviceError` saying what is missing.
"""
from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ...errors import ArgumentError, ArtifactError, CompileError, DeviceError, InputError
from ...ir import loop as L
from ...ir import types as T
from ...ir.graph import Graph, Node
from ...ir.segments import Segment
from ...ir.target import Target
from ...levels import DEFAULT_OPT_LEVEL
from ..lower import Kernel
from ..contract import CompiledSegment
from ..executable import Executable, index_error
from ..plan import Call, Program, image_consts, in_place_outputs
from ..specialisations import DEFAULT_CACHE_SIZE
from . import device, programmatic, tensor_map
from .programmatic import launch_after_kernel
from .tensor_map import MAP_BYTES

DEVICE_ALIGN = 256
"""Byte alignment of every device buffer (cudaMalloc's): enough for any vector access."""

VECTOR_ALIGN = 16
"""Byte alignment the kernels assume of a parameter (a float4 load, the widest they make): a
caller's array read in place must have it."""

OUTPUT_KINDS = ("cupy", "numpy", "torch")
"""What a call can return: CuPy arrays (the default), NumPy arrays or PyTorch CUDA tensors
(for a caller that has PyTorch: the torch backend's partitions)."""

GRAPHS_PER_FRAME = 8
"""CUDA graphs a frame keeps for callers' input addresses, least recently used dropped first,
beside the one on its own input buffers: room for a serving loop's double or triple buffers
and a few models' worth of segments fed by one another."""

SEEN_PER_FRAME = 64
"""Tuples of callers' input addresses a frame remembers meeting once: a tuple that comes
back gets a graph of its own; one seen only once cost a device copy, not a capture."""

COPIED_INPUT_BYTES = 4096
"""Inputs of at most this many bytes are always copied into the frame's own buffers, never
read in place: a decode step's token ids, positions and mask are new tensors each step at
addresses torch's allocator cycles through, and reading them in place keyed a graph capture
on them (29 captures in a 64-token gpt2 generate on an H200, ~1 ms each under cProfile); a
copy of a few bytes costs one memcpyAsync. Not an input the segment writes in place (a
counter beside a KV cache: the caller's state, whose address recurs)."""

DEVICE_MEMORY = (2, 3)
"""cudaPointerAttributes types a kernel of this device can read: device and managed."""


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


@dataclass(frozen=True)
class TensorMapPlace:
    """A tensor map a segment's launches read (`codegen.TensorMapArg`), its tensor an
    argument place ("ext", slot) or ("arena", offset)."""

    place: tuple[str, int]
    dtype: str
    extents: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    im2col: tuple[int, ...] = ()


def launch_list(calls: list[Call], kernels: dict
                ) -> tuple[list[BoundLaunch], int, list[TensorMapPlace]]:
    """Every launch of `calls` in order, the workspace bytes they need and the tensor maps
    they read: a call's kernel (`kernels[call.func]`, a `codegen.CudaKernel`) takes the call's
    arguments, then one pointer per workspace buffer, then one per tensor map ("map", its
    offset among the segment's maps: one a distinct tensor and box); calls run one after
    another, so each carves its buffers from offset 0 of one shared region."""
    launches: list[BoundLaunch] = []
    maps: list[TensorMapPlace] = []
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
        for arg in kernel.tensor_maps:
            place = TensorMapPlace(tuple(call.args[arg.param]), arg.dtype, tuple(arg.extents),
                                   tuple(arg.strides), tuple(arg.box), tuple(arg.im2col))
            if place not in maps:
                maps.append(place)
            args += (("map", maps.index(place) * MAP_BYTES),)
        for launch in kernel.launches:
            launches.append(BoundLaunch(k, launch.name, tuple(launch.grid), tuple(launch.block),
                                        launch.shared_bytes, args))
    return launches, workspace, maps


def resolve(args: tuple[tuple[str, int], ...], ext: list[int], arena: int,
            workspace: int, maps: int = 0) -> tuple[int, ...]:
    """A launch's argument places as device addresses (`maps`: the tensor maps')."""
    base = {"arena": arena, "workspace": workspace, "map": maps}
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
    kernel_count: int = 0                  # kernels a call (0: not recorded)
    tensor_maps: list[TensorMapPlace] = field(default_factory=list)   # ("map", offset)'s

    @property
    def slots(self) -> int:
        return self.n_inputs + len(self.escaping_types) + len(self.consts)


def _check_launches(step: Segment, image: SegmentImage) -> None:
    """Refuse launches that would reach outside the segment's buffers: every argument a slot
    the segment has or an offset inside the arena or the workspace (an `ArtifactError`)."""
    bounds = {"ext": image.slots + 1, "arena": max(image.arena_bytes, 1),   # + error record
              "workspace": max(image.workspace_bytes, 1),
              "map": MAP_BYTES * len(image.tensor_maps)}
    for m in image.tensor_maps:
        kind, k = m.place
        if kind not in ("ext", "arena") or not 0 <= k < bounds[kind]:
            raise ArtifactError(f"segment {step.index}: a tensor map of ({kind}, {k}), "
                                f"outside the segment's buffers")
    for launch in image.launches:
        for kind, k in launch.args:
            if kind not in bounds or not 0 <= k < bounds[kind]:
                raise ArtifactError(f"segment {step.index}: launch {launch.name} has argument "
                                    f"({kind}, {k}) outside the segment's buffers")


@dataclass(frozen=True)
class _Layout:
    """Byte offsets in a frame's one allocation: arena, workspace, the kernels' error record
    (`loop.index_checks`), then each input and output buffer, every one
    `DEVICE_ALIGN`-aligned."""

    arena: int
    workspace: int
    errors: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    total: int

    @classmethod
    def of(cls, arena_bytes: int, workspace_bytes: int, input_bytes: list[int],
           output_bytes: list[int]) -> "_Layout":
        at = 0
        places = []
        for size in [arena_bytes, workspace_bytes, ERROR_BYTES, *input_bytes, *output_bytes]:
            places.append(at)
            at += _aligned(max(size, 1))
        n = len(input_bytes)
        return cls(places[0], places[1], places[2], tuple(places[3:3 + n]),
                   tuple(places[3 + n:]), at)


ERROR_BYTES = 24
"""The error record: int64 [site + 1, index, size] (`loop.index_checks`)."""


def _event_done(event) -> bool:
    """Whether the GPU has passed `event` (CuPy's `Event.done`), without waiting."""
    return bool(getattr(event, "done", True))


def _storage(dtype: np.dtype) -> np.dtype:
    """The dtype a CuPy array holds `dtype`'s bits in: itself, or an unsigned integer of its
    width for the ones CuPy lacks (bfloat16, an ml_dtypes void type)."""
    return np.dtype(f"u{dtype.itemsize}") if dtype.kind == "V" else dtype


def _torch_stream(torch, index: int) -> int:
    """The address of PyTorch's current CUDA stream on GPU `index`: its raw getter, which
    inductor's generated code calls at every launch (`torch.cuda.current_stream(...)
    .cuda_stream` builds a Stream object: ~7 us a call on an H200's host, where a decode
    step's call is a few hundred us), else that."""
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def _is_device(a) -> bool:
    return hasattr(a, "__cuda_array_interface__")


def _output_kind(kind) -> str:
    """`kind` when it is one of `OUTPUT_KINDS`, else an `ArgumentError`."""
    if not isinstance(kind, str) or kind not in OUTPUT_KINDS:
        raise ArgumentError(f"outputs must be one of {', '.join(OUTPUT_KINDS)}, not {kind!r}")
    return kind


class CUDARuntime(Executable):
    """Runs a graph as GPU segments and host steps; thread-safe (one frame per thread). Its
    `TargetHooks`: CUDA C units per `Program`, the cuda templates, no batch splitting.
    Constructing one compiles nothing: `start()` does (`CUDARuntime(...).start()`)."""

    def __init__(self, graph: Graph, target: Target | None = None,
                 opt_level: int = DEFAULT_OPT_LEVEL, progress: bool | None = None,
                 plan: list[dict] | None = None,
                 reuse_memory: bool | None = None, warm_up: bool = True,
                 cache_size: int = DEFAULT_CACHE_SIZE, render_only: bool = False,
                 outputs: str = "cupy", module_cache: device.ModuleCache | None = None,
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
        self._checking = threading.local()   # this thread's call: its segments that check

    @property
    def outputs(self) -> str:
        """What a call returns unless it says: "cupy" (the default: device arrays of its own)
        or "numpy"."""
        return self._outputs

    @outputs.setter
    def outputs(self, kind: str) -> None:
        self._outputs = _output_kind(kind)

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

    def run(self, inputs: list, bindings: dict[str, int], outputs: str | None = None) -> list:
        """The model's outputs as `outputs` says (None: as the runtime's `outputs` says),
        computed on the caller's stream (`_caller_stream`)."""
        self._check_device()
        kind = self._outputs if outputs is None else _output_kind(outputs)
        self._raise_pending()
        self._checking.runs = []
        try:
            with self._caller_stream(inputs):
                outs = self._deliver(super().run(inputs, bindings), kind)
                if kind == "numpy":   # the stream has been waited for: read the record now
                    self._raise_recorded()
                else:   # CuPy arrays return before the kernels end: never wait for them here
                    self._defer_recorded()
                return outs
        finally:
            self._checking.runs = None

    def bound_call(self, inputs: list, outputs: str | None = None):
        """`run` for calls whose inputs have the shapes and dtypes of `inputs`, unchecked: the
        caller vouches for every call's (`CompiledModel.bound_call`: a torch partition, whose
        arguments dynamo's guards fix). The call goes straight to the model's one segment
        (`one_segment`), without the plan's walk, the specialisation's lookup or the checks
        of `run`; None where the model is not one such segment compiled for these shapes."""
        one = self.one_segment(inputs) if not self.render_only else None
        if one is None:
            return None
        _, seg, positions, returned = one
        kind = self._outputs if outputs is None else _output_kind(outputs)
        data = [p for p, v in zip(positions, seg.step.inputs) if v.const is None]
        checking = self._checking

        def call(args) -> list:
            self._raise_pending()
            checking.runs = []
            try:
                with self._caller_stream(args):
                    outs = seg.run_data([args[p] for p in data], self._frame(seg))
                    outs = self._deliver(self.write_aliases(args, [outs[j] for j in returned]),
                                         kind)
                    self._defer_recorded()
                    return outs
            finally:
                checking.runs = None

        return call

    def checked(self, segment: "_CompiledSegment", frame: _Frame) -> None:
        """A segment whose kernels check indices ran on `frame` in this thread's call: its
        record is read when the call's outputs are delivered (`_raise_recorded`)."""
        runs = getattr(self._checking, "runs", None)
        if runs is not None:
            runs.append((segment, frame))

    def _defer_recorded(self) -> None:
        """A call that returned CuPy arrays never waits for its kernels: an event marks their
        end, and a later call of this thread reads the record once the event has passed,
        without waiting for it (`_raise_pending`), as CUDA reports a device-side assert at a
        later synchronisation. The record is sticky (`_clear_errors`), so reading it late
        loses no error. Waiting for the call's end instead cost bert_tiny 1.81x per call on an
        H200 (0.219 against 0.121 ms), waiting at the next call's start 1.48x: the caller's
        launches no longer overlapped the GPU's work."""
        runs, self._checking.runs = self._checking.runs, None
        if runs:   # (one event a thread, recorded again by each call: a later record passes
            #        after an earlier one, so an older pending record is read no sooner)
            event = getattr(self._checking, "event", None)
            if event is None:
                event = self._checking.event = self.cupy.cuda.Event(disable_timing=True)
            event.record()
            _, older = getattr(self._checking, "pending", None) or (None, [])
            self._checking.pending = (event, older + [r for r in runs if r not in older])

    def _raise_pending(self, wait: bool = False) -> None:
        """The error an earlier call of this thread recorded (`_defer_recorded`), raised
        before this call starts any work, once the event after it has passed (with `wait`:
        waiting for it), saying it was an earlier call."""
        pending = getattr(self._checking, "pending", None)
        if pending is None:
            return
        event, runs = pending
        if not wait and not _event_done(event):
            return   # still running: the record is read by a later call
        self._checking.pending = None
        if wait:   # (else it has passed)
            event.synchronize()
        if any(frame.errors_host[0] for _, frame in runs):   # let a later call's copy land
            self.cupy.cuda.Device().synchronize()
        for segment, frame in runs:
            error = segment.recorded_error(frame)
            if error is not None:
                raise InputError(f"{error} (in an earlier call, whose CuPy outputs were "
                                 f"returned before its kernels ended; those outputs are "
                                 f"wrong)")

    def _raise_recorded(self) -> None:
        """The first out-of-range index this thread's call recorded, as `InputError`, after
        waiting for the stream (after "numpy" outputs and a profile it has been waited for)."""
        runs, self._checking.runs = self._checking.runs, None
        if not runs:
            return
        self.cupy.cuda.get_current_stream().synchronize()
        for segment, frame in runs:
            error = segment.recorded_error(frame)
            if error is not None:
                raise error

    def profile(self, inputs: list, repeat: int = 20) -> tuple[list, list[dict]]:
        self._check_device()
        self._raise_pending()
        self._checking.runs = []
        try:
            with self._caller_stream(inputs):
                outs, rows = super().profile(inputs, repeat)
                outs = self._deliver(outs, self._outputs)
                self._raise_recorded()
                return outs, rows
        finally:
            self._checking.runs = None

    def synchronize(self) -> None:
        """Wait until the GPU has done the work of every call so far (on whichever stream),
        then raise the out-of-range index this thread's last call met, if any (a call that
        returns CuPy arrays reports it here or at its thread's next call)."""
        self._check_device()
        self.cupy.cuda.Device().synchronize()
        self._raise_pending(wait=True)

    def _caller_stream(self, inputs: list):
        """A context in which CuPy's current stream is the caller's: where an input is a
        PyTorch CUDA tensor, PyTorch's current stream on its device (wrapped as a CuPy
        `ExternalStream`), so the call runs after the work
        that made the tensor and before the caller's next PyTorch op without a
        synchronisation; else CuPy's current stream, left as it is."""
        torch = sys.modules.get("torch")   # never imported here: a tensor implies it is
        if torch is not None:
            for a in inputs:
                tensor = getattr(a, "obj", None)
                if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                    index = tensor.device.index
                    ptr = _torch_stream(torch, index)
                    if ptr != self.cupy.cuda.get_current_stream().ptr:
                        return self.cupy.cuda.ExternalStream(ptr, index)
                    break
        return contextlib.nullcontext()

    def _check_device(self) -> None:
        if self.render_only:
            raise DeviceError(f"this cuda model was built for its source only: "
                              f"{device.unavailable_reason() or 'compile it again to run it'}")

    def same_array(self, a, b) -> bool:
        return a is b   # an output computed in place is the caller's input array itself

    def write_into(self, target, value) -> None:
        """An output computed apart written into the caller's input array, on the current
        stream (device arrays of any strides through CuPy; host arrays copied back)."""
        if _is_device(target):
            face, cupy = _face(target), self.cupy
            to = _direct_address(face)
            if to is not None and value.flags.c_contiguous:   # (a frame's buffer: C order)
                runtime = cupy.cuda.runtime
                runtime.memcpyAsync(to, _face(value)["data"][0], value.nbytes,
                                    runtime.memcpyDeviceToDevice,
                                    cupy.cuda.get_current_stream().ptr)
            else:
                cupy.asarray(target)[...] = cupy.asarray(value)
        else:
            super().write_into(target, self._to_host(value, target.dtype))

    def _deliver(self, outs: list, kind: str) -> list:
        """The model's outputs as `kind` says, each the caller's own: device arrays (a
        frame's reused buffers) copied on the device or to the host; an output written into
        an input (`Graph.aliases`) is the caller's array it was given (a `DeviceArray`'s
        object). (A view of the frame's buffer would save a device copy per output and be
        overwritten by the next call: a silent overwrite is the worse bug, so copies it is;
        bench/cuda_calls.py times it.)"""
        given = {k: getattr(outs[k], "obj", outs[k]) for k in self.graph.aliases}
        if kind == "cupy":   # a copy, on the current stream
            made = [self.cupy.array(a) if k not in given else None for k, a in enumerate(outs)]
        elif kind == "torch":
            made = self._to_torch(outs, given)
        else:
            made = [self._to_host(a, v.type.dtype.np) if k not in given else None
                    for k, (v, a) in enumerate(zip(self.graph.outputs, outs))]
        return [given.get(k, a) for k, a in enumerate(made)]

    def _to_torch(self, outs: list, skip=()) -> list:
        """The outputs `outs` copied into new PyTorch tensors on the current device: each
        allocated by PyTorch (its caching allocator, on its current stream) and filled by one
        memcpyAsync on CuPy's current stream, which `_caller_stream` made PyTorch's where an
        input was a tensor (else PyTorch's stream is made to wait for it, once a call). A CuPy
        copy wrapped by `torch.from_dlpack` cost ~50 us an output under cProfile on an H200,
        most of a small partition's call (bench/torch_decode.py). Outputs at `skip` are
        left None (the caller's own arrays, `_deliver`)."""
        import torch   # (the caller asked for tensors: it has PyTorch)

        cupy = self.cupy
        runtime = cupy.cuda.runtime
        index = cupy.cuda.Device().id
        device = torch.device("cuda", index)
        stream = cupy.cuda.get_current_stream()
        cupy_array = getattr(cupy, "ndarray", None)
        keep, tensors = [], []   # keep: contiguous copies of strided outputs, until enqueued
        for k, (v, a) in enumerate(zip(self.graph.outputs, outs)):
            if k in skip:   # (the caller's own tensor, written in place)
                tensors.append(None)
                continue
            dtype = v.type.dtype.np
            kind = _torch_dtype(torch, dtype)
            if type(a) is cupy_array and a.flags.c_contiguous:   # (a frame's buffer: its
                shape, nbytes, src = a.shape, a.nbytes, a.data.ptr   # interface is built
            else:                                                # anew at each access)
                face = _face(a)
                if face is None:   # a host step's output
                    host = np.ascontiguousarray(a)
                    if kind is torch.bfloat16:
                        host = torch.from_numpy(host.view(np.int16)).view(kind)
                    else:
                        host = torch.from_numpy(host)
                    tensors.append(host.to(device))
                    continue
                shape, nbytes = tuple(face["shape"]), _nbytes(face["shape"], dtype)
                src = _contiguous_address(a, face, cupy, keep) if nbytes else 0
            out = torch.empty(shape, dtype=kind, device=device)
            if nbytes:
                runtime.memcpyAsync(out.data_ptr(), src, nbytes, runtime.memcpyDeviceToDevice,
                                    stream.ptr)
            tensors.append(out)
        if _torch_stream(torch, index) != stream.ptr:
            torch.cuda.current_stream(device).wait_stream(
                torch.cuda.ExternalStream(stream.ptr, device=device))
        return tensors

    def _to_host(self, a, dtype: np.dtype) -> np.ndarray:
        if not _is_device(a):
            return a
        cupy = self.cupy
        host = cupy.asnumpy(cupy.asarray(a), stream=cupy.cuda.get_current_stream())
        return host.view(dtype)

    def _segment_call(self, step, env, exact: bool = False):
        """A segment's value inputs (read at compile time) come to the host first."""
        for i in step.value_inputs:
            v = step.inputs[i]
            if _is_device(env.get(id(v))):
                env[id(v)] = self._to_host(env[id(v)], v.type.dtype.np)
        return super()._segment_call(step, env, exact)

    def _run_host(self, node: Node, env) -> None:
        """A host step reads NumPy: device arrays it takes come to the host first."""
        for v in node.inputs:
            if v is not None and _is_device(env.get(id(v))):
                env[id(v)] = self._to_host(env[id(v)], v.type.dtype.np)
        super()._run_host(node, env)

    # -- artifacts ----------------------------------------------------------------------------

    @classmethod
    def restore(cls, graph: Graph, plan: list[dict], images: list["SegmentImage"],
                target: Target, opt_level: int = DEFAULT_OPT_LEVEL,
                progress: bool | None = None, cache_size: int = DEFAULT_CACHE_SIZE,
                tuned: dict | None = None,
                outputs: str = "cupy") -> "CUDARuntime":
        """A runtime from a saved plan and compiled specialisations: no passes, no lowering;
        a cubin built for another architecture is rebuilt from its source; shapes not among
        `images` compile on first use (with the `tuned` configs the compile had)."""
        rt = cls(graph, target=target, opt_level=opt_level, progress=progress, plan=plan,
                 cache_size=cache_size, tuned=tuned, outputs=outputs)
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
        return super().images()

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
    inputs: tuple[int, ...]         # its own input buffers' addresses
    outputs: list                   # output buffers as CuPy arrays (views of `memory`)
    own_inputs: list                # its input buffers as CuPy arrays (an in-place output)
    ext: list[int]                  # every external slot's address: inputs, outputs, constants
    arena: int                      # the arena's address
    workspace: int                  # the workspace's address
    launches: list[tuple]           # (function, grid, block, shared bytes, argument tuple)
    maps: object                    # the device memory of `launches`' tensor maps (or None)
    capture: object                 # the non-blocking stream graphs are captured on
    errors: int = 0                 # the error record's address (`loop.index_checks`)
    errors_host: np.ndarray | None = None   # its pinned host copy, read after a checking run
    errors_dirty: bool = True       # the device's record may hold an error: zero it first
    own_graph: object = None        # the graph on its own input buffers, once captured
    # callers' input addresses -> (their graph, its tensor maps' memory or None), least
    # recently used first; tuples met once; dropped maps' memory with the event it waits for
    graphs: OrderedDict = field(default_factory=OrderedDict)
    seen: OrderedDict = field(default_factory=OrderedDict)
    retired: list = field(default_factory=list)


class _CompiledSegment(CompiledSegment):
    """One segment specialised to concrete input shapes: module, launch list, constants."""

    def __init__(self, program: Program, module, rt: CUDARuntime):
        self._take_program(program)
        self.source = module.source
        self._loop_ir = ""
        self.launches, self.workspace_bytes, self.tensor_maps = launch_list(program.calls,
                                                                            module.kernels)
        self._bind(rt, program.consts, None, "")

    @classmethod
    def from_image(cls, step: Segment, image: "SegmentImage", rt: CUDARuntime):
        """A specialisation restored from an artifact: its cubin is loaded when it was built
        for this GPU's architecture, else its source is compiled again for this one."""
        self = cls.__new__(cls)
        self._take_image(step, image, in_place_outputs(rt.graph, step))
        self.source = image.source
        self._loop_ir = image.loop_ir
        self.launches, self.workspace_bytes = list(image.launches), image.workspace_bytes
        self.tensor_maps = list(image.tensor_maps)
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
        self.input_names = [step.inputs[i].name for i in data]
        self.input_nbytes = [_nbytes(s, d) for s, d in self.input_types]
        # (an input the segment writes in place is the caller's state, at an address that
        # recurs: read in place however small, it is neither copied in nor back)
        written = set(self.in_place.values())
        self.copied = [n <= COPIED_INPUT_BYTES and d not in written
                       for d, n in enumerate(self.input_nbytes)]
        self.output_types = [(tuple(t.shape), t.dtype.np) for t in self.escaping_types]
        self.layout = _Layout.of(self.arena_bytes, self.workspace_bytes,
                                 self.input_nbytes,
                                 [_nbytes(s, d) for s, d in self.output_types])
        self.cupy = rt.cupy
        self.rt = rt
        slot = ("ext", self.n_inputs + len(self.escaping_types) + len(consts))
        self.checks = any(slot in b.args for b in self.launches)   # kernels check indices
        self.arch = rt.target.arch
        self.cubin = b""
        if self.cupy is None:   # rendering only
            return
        self.device_id = self.cupy.cuda.Device().id
        if cubin is None or built_for != self.arch:
            arch = device.compile_arch(self.arch, self.source)
            cubin = rt.module_cache.get(self.source, arch, device.nvrtc_options(arch))
        self.cubin = cubin
        self._module = self.cupy.cuda.function.Module()
        self._module.load(cubin)
        self._functions = {}
        for launch in self.launches:
            if launch.name not in self._functions:
                self._functions[launch.name] = self._function(launch)
        # its graphs' launches: programmatic where every kernel waits for the one ahead
        # (an artifact rendered before the kernels' `DNNC_GRID_DEPENDENCY()` does not)
        self.programmatic = programmatic.supported(self.arch) and \
            "DNNC_GRID_DEPENDENCY();" in self.source
        self._upload_constants(consts)

    def loop_source(self) -> str:
        return "\n".join(str(k.func) for k in self.kernels) if self.kernels else self._loop_ir

    def image(self) -> "SegmentImage":
        return SegmentImage(
            step=self.step.index, shapes=self.shapes, values=self.key_values,
            escaping_types=list(self.escaping_types), consts=list(self.const_refs),
            n_inputs=self.n_inputs, arena_bytes=self.arena_bytes,
            workspace_bytes=self.workspace_bytes, launches=list(self.launches),
            source=self.source, arch=self.arch, cubin=self.cubin, loop_ir=self.loop_source(),
            kernel_count=self.kernel_count, tensor_maps=list(self.tensor_maps))

    def _function(self, launch: BoundLaunch):
        """The loaded __global__ function, allowed the dynamic shared memory its largest
        launch asks for (beyond 48 KiB needs the attribute set)."""
        fn = self._module.get_function(launch.name)
        device.allow_shared(fn, max(b.shared_bytes for b in self.launches
                                    if b.name == launch.name))
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
        inputs = tuple(base + o for o in self.layout.inputs)
        outputs = [cupy.ndarray(shape, _storage(dtype), memory + o)
                   for (shape, dtype), o in zip(self.output_types, self.layout.outputs)]
        own_inputs = [cupy.ndarray(shape, _storage(dtype), memory + o)
                      for (shape, dtype), o in zip(self.input_types, self.layout.inputs)]
        errors = base + self.layout.errors   # zeroed before each run (`_clear_errors`)
        ext = self._ext(inputs, [base + o for o in self.layout.outputs] + self._const_ptrs +
                        [errors])   # the record: slot `slots` (plan.Program)
        arena, workspace = base + self.layout.arena, base + self.layout.workspace
        pinned = cupy.cuda.alloc_pinned_memory(ERROR_BYTES)
        return _Frame(memory, inputs, outputs, own_inputs, ext, arena, workspace,
                      *self._resolved(ext, arena, workspace),
                      cupy.cuda.Stream(non_blocking=True), errors,
                      np.frombuffer(pinned, np.int64, 3))

    def _ext(self, places: tuple[int, ...], rest: list[int]) -> list[int]:
        """Every external slot's address, the data inputs at `places`: an output computed
        in place (`in_place`) at its input's place, so the captured graph writes it there."""
        ext = list(places) + list(rest)
        for e, d in self.in_place.items():
            ext[len(places) + e] = places[d]
        return ext

    def _resolved(self, ext: list[int], arena: int,
                  workspace: int) -> tuple[list[tuple], object]:
        """Every launch with its arguments as device addresses: (function, grid, block,
        shared bytes, argument tuple); and the device memory of the tensor maps they read
        (`_maps`), which must outlive every run of them."""
        maps = self._maps(ext, arena, workspace)
        at = 0 if maps is None else maps.ptr
        return [(self._functions[b.name], b.grid, b.block, b.shared_bytes,
                 tuple(np.uint64(p) for p in resolve(b.args, ext, arena, workspace, at)))
                for b in self.launches], maps

    def _maps(self, ext: list[int], arena: int, workspace: int):
        """The segment's tensor maps (`TensorMapPlace`) of the tensors at these addresses,
        encoded and copied to new device memory (128 bytes a map), or None without maps.
        Built only when launches are resolved (a frame's, a graph's capture), never per call:
        a graph's replay reads the maps in place (a kernel's argument is their address, not
        their bytes), so the memory lives as long as the frame or the graph (`_retire`).
        The copy is queued on the current stream, which CuPy's pool allots the block to:
        after any earlier user's work on it, before the runs that read it (pageable host
        memory is staged before memcpyAsync returns)."""
        if not self.tensor_maps:
            return None
        addresses = resolve(tuple(m.place for m in self.tensor_maps), ext, arena, workspace)
        words = np.concatenate([tensor_map.kernel_map(m, at) for m, at in
                                zip(self.tensor_maps, addresses)])
        memory = self.cupy.cuda.alloc(words.nbytes)
        runtime = self.cupy.cuda.runtime
        runtime.memcpyAsync(memory.ptr, words.ctypes.data, words.nbytes,
                            runtime.memcpyHostToDevice, self.cupy.cuda.get_current_stream().ptr)
        return memory

    def _data(self, arrays: list) -> list:
        """The segment's data inputs among `arrays` (its constants are uploaded once)."""
        return [a for v, a in zip(self.step.inputs, arrays) if v.const is None]

    def _copy_in(self, data: list, faces: list, frame: _Frame, stream,
                 places: tuple[int, ...]) -> list:
        """Copy the data inputs whose place is the frame's own buffer into it, on `stream`
        (`faces`: each input's `__cuda_array_interface__`, None for a host array); returns
        what must stay alive until the copies are done (contiguous temporaries)."""
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        keep = []
        for a, face, dst, at, nbytes in zip(data, faces, frame.inputs, places,
                                            self.input_nbytes):
            if at != dst or not nbytes:
                continue
            if face is not None:
                src = _contiguous_address(a, face, cupy, keep)
                runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDeviceToDevice,
                                    stream.ptr)
            else:
                host = np.ascontiguousarray(a)
                keep.append(host)
                runtime.memcpyAsync(dst, host.ctypes.data, nbytes,
                                    runtime.memcpyHostToDevice, stream.ptr)
        return keep

    @staticmethod
    def _launch(launches: list[tuple], stream, programmatic: bool = False) -> None:
        """The launches in order on `stream`; with `programmatic`, each after the first
        allowed to start before the one ahead of it finishes (programmatic.py)."""
        for k, (fn, grid, block, shared, args) in enumerate(launches):
            if programmatic and k:
                launch_after_kernel(fn, grid, block, shared, args, stream)
            else:
                fn(grid, block, args, shared_mem=shared, stream=stream)

    def run(self, arrays: list, frame: _Frame) -> list:
        """The segment's outputs as device arrays: the frame's output buffers, valid until
        this thread's next run of the segment (`CUDARuntime` copies what it hands out).
        C-order device inputs are read in place when a graph on their addresses exists or
        these addresses come for the second time (then captured); else every input is
        copied into the frame's own buffers and their graph replayed."""
        return self.run_data(self._data(arrays), frame)

    def run_data(self, data: list, frame: _Frame) -> list:
        """`run` given the data inputs alone (its constants are the segment's own)."""
        stream = self.cupy.cuda.get_current_stream()
        faces = [_face(a) for a in data]
        places = tuple(own if small else _direct_address(f) or own
                       for f, own, small in zip(faces, frame.inputs, self.copied))
        graph = self._graph_for(places, frame)
        if graph is None:
            places = frame.inputs
            graph = frame.own_graph or self._own_graph(frame)
        for face in faces:
            if face is not None:
                _wait_for_producer(face, stream, self.cupy)
        keep = self._copy_in(data, faces, frame, stream, places)
        self._clear_errors(frame, stream)
        graph.launch(stream=stream)   # (copying the error record back: `_capture`)
        del keep   # host sources were staged by memcpyAsync; device ones are the caller's
        if self.checks:
            self.rt.checked(self, frame)
        outs = list(frame.outputs)
        for e, d in self.in_place.items():   # written where the kernels read the input
            outs[e] = frame.own_inputs[d] if places[d] == frame.inputs[d] else data[d]
        return outs

    def _clear_errors(self, frame: _Frame, stream) -> None:
        """Zero the error record before a run of kernels that check indices where it may hold
        one: at the frame's first run, and after an error was read from it. Otherwise the
        record is sticky (its first error stays until read), so a call whose record is read
        late (CuPy outputs: `CUDARuntime._defer_recorded`) loses none."""
        if self.checks and frame.errors_dirty:
            self.cupy.cuda.runtime.memsetAsync(frame.errors, 0, ERROR_BYTES, stream.ptr)
            frame.errors_dirty = False

    def _fetch_errors(self, frame: _Frame, stream) -> None:
        """Copy the error record to the frame's pinned host copy after the run's kernels, on
        their stream, and tell the runtime to read it when the call's outputs are delivered
        (`CUDARuntime._raise_recorded`): no synchronisation here. (A profile's launches, run
        outside any graph; a graph's replay copies the record itself: `_capture`.)"""
        if self.checks:
            self._copy_record(frame, stream)
            self.rt.checked(self, frame)

    def _copy_record(self, frame: _Frame, stream) -> None:
        """The error record's copy to the frame's pinned host copy, queued on `stream`."""
        runtime = self.cupy.cuda.runtime
        runtime.memcpyAsync(frame.errors_host.ctypes.data, frame.errors, ERROR_BYTES,
                            runtime.memcpyDeviceToHost, stream.ptr)

    def recorded_error(self, frame: _Frame) -> InputError | None:
        """The error the last run on `frame` recorded (its host copy must be done), or
        None when there is none."""
        if not frame.errors_host[0]:
            return None
        frame.errors_dirty = True   # the device's record is zeroed before the next run
        return index_error(self.step, frame.errors_host)

    def _graph_for(self, places: tuple[int, ...], frame: _Frame):
        """The graph reading the inputs at `places`: kept, or captured now when `places` was
        met before (after checking that every caller's array is on this GPU); None the
        first time."""
        if places == frame.inputs:
            return frame.own_graph or self._own_graph(frame)
        kept = frame.graphs.get(places)
        if kept is not None:
            frame.graphs.move_to_end(places)
            return kept[0]
        self._check_devices(places, frame)
        if frame.seen.pop(places, None) is None:
            frame.seen[places] = True
            if len(frame.seen) > SEEN_PER_FRAME:
                frame.seen.popitem(last=False)
            return None
        kept = frame.graphs[places] = self._capture(frame, places)
        if len(frame.graphs) > GRAPHS_PER_FRAME:
            _, (_, maps) = frame.graphs.popitem(last=False)
            self._retire(frame, maps)
        return kept[0]

    def _retire(self, frame: _Frame, maps) -> None:
        """Free the tensor maps of a graph the frame dropped (`maps`: their memory, or None)
        once no launch can read them. The dropped graph may still be queued or running: CUDA
        frees an executing graph when it completes (cuGraphExecDestroy), but its kernels read
        the maps from global memory as they run, and CuPy's pool hands a freed block to the
        next allocation on its stream at once. So the memory is kept with an event recorded
        now on the caller's stream, and freed at a later drop once the event has passed
        (`frame.retired`: the memory of the drops whose events had not passed at the last
        one). The event passes after every earlier run of the graph: those ran on this
        frame, whose arena every run uses, so a thread's calls must be ordered already (one
        stream, a stream wait or a host synchronisation), and any such order puts them
        before work queued now."""
        frame.retired = [r for r in frame.retired if not _event_done(r[0])]
        if maps is not None:
            event = self.cupy.cuda.Event(disable_timing=True)
            event.record()
            frame.retired.append((event, maps))

    def _check_devices(self, places: tuple[int, ...], frame: _Frame) -> None:
        """Refuse a caller's array that a kernel of this GPU cannot read (an `InputError`
        naming the input): in another GPU's memory, or not in device memory at all."""
        runtime = self.cupy.cuda.runtime
        for name, at, own in zip(self.input_names, places, frame.inputs):
            if at == own:
                continue
            where = runtime.pointerGetAttributes(at)
            if where.type not in DEVICE_MEMORY:
                raise InputError(f"input {name!r}: its __cuda_array_interface__ points at "
                                 f"host memory, not at a GPU's")
            if where.type == DEVICE_MEMORY[0] and where.device != self.device_id:
                raise InputError(f"input {name!r} is on GPU {where.device}; this model runs "
                                 f"on GPU {self.device_id}: copy it there first")

    def _own_graph(self, frame: _Frame):
        frame.own_graph, _ = self._capture(frame, frame.inputs)   # (its maps: the frame's)
        return frame.own_graph

    def _capture(self, frame: _Frame, places: tuple[int, ...]):
        """Every launch of the segment reading its inputs at `places`, captured once as a
        CUDA graph on the frame's non-blocking stream, and where the kernels check indices
        the copy of the error record to the frame's pinned host copy after them (one
        memcpyAsync less a call: `run_data`). Nothing in it allocates or synchronises."""
        ext = self._ext(places, frame.ext[len(places):])
        launches, maps = (frame.launches, frame.maps) if places == frame.inputs else \
            self._resolved(ext, frame.arena, frame.workspace)
        stream = frame.capture
        stream.begin_capture()
        try:
            self._launch(launches, stream, self.programmatic)
            if self.checks:
                self._copy_record(frame, stream)
        finally:
            graph = stream.end_capture()
        return graph, maps

    def profile(self, arrays: list, frame: _Frame, repeat: int) -> tuple[list, list]:
        """The outputs, and each kernel's median milliseconds over `repeat` runs of its
        launches alone, timed with CUDA events (in order, each on the data the kernels
        before it left: the arena is restored after an in-place kernel's repeats)."""
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        stream = cupy.cuda.get_current_stream()
        data = self._data(arrays)
        keep = self._copy_in(data, [_face(a) for a in data], frame, stream, frame.inputs)
        self._clear_errors(frame, stream)
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
                self._launch(launches, stream)
                end.record(stream)
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end))
            if self.arena_bytes:
                runtime.memcpyAsync(frame.arena, saved.ptr, self.arena_bytes,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            self._launch(launches, stream)
            rows.append((kernel, float(np.median(times))))
        self._fetch_errors(frame, stream)
        stream.synchronize()
        del keep
        return list(frame.outputs), rows


_TORCH_DTYPES: dict = {}


def _torch_dtype(torch, dtype: np.dtype):
    """The PyTorch dtype of NumPy's `dtype` (bfloat16's too), looked up once."""
    kind = _TORCH_DTYPES.get(dtype)
    if kind is None:
        kind = _TORCH_DTYPES[dtype] = torch.bfloat16 if dtype.name == "bfloat16" else \
            torch.from_numpy(np.empty(0, dtype)).dtype
    return kind


def _nbytes(shape, dtype: np.dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize   # (np.prod: ~3 us a call)


def _face(a) -> dict | None:
    """`a`'s `__cuda_array_interface__` (read once: CuPy builds it on every access), or None
    for a host array."""
    return getattr(a, "__cuda_array_interface__", None)


def _direct_address(face: dict | None) -> int | None:
    """The address a kernel can read a device array (its `__cuda_array_interface__`) at in
    place: its data's, when it is in C order, not empty and aligned for the kernels' vector
    loads (`VECTOR_ALIGN`); else None (host arrays too, and a view starting off the alignment,
    such as `x[1:]`: those are copied)."""
    if face is None or face["data"][0] % VECTOR_ALIGN:
        return None
    shape, strides = tuple(face["shape"]), face.get("strides")
    if not math.prod(shape):
        return None
    if strides is not None and tuple(strides) != \
            _c_strides(shape, np.dtype(face["typestr"]).itemsize):
        return None
    return face["data"][0]


def _wait_for_producer(face: dict, stream, cupy) -> None:
    """Make `stream` wait for the stream a `__cuda_array_interface__` (version 3) names as
    the one its data is being produced on, as the protocol asks of a consumer reading it
    (none named, or `stream` itself: nothing to wait for; 1 is the legacy default stream,
    CuPy's 0)."""
    producer = face.get("stream")
    if producer is None or producer == stream.ptr or (producer == 1 and stream.ptr == 0):
        return
    event = cupy.cuda.Event(disable_timing=True)
    event.record(cupy.cuda.ExternalStream(producer))
    stream.wait_event(event)


def _contiguous_address(a, face: dict, cupy, keep: list) -> int:
    """The device address of `a`'s data (`face`: its `__cuda_array_interface__`) in C order
    (a contiguous device copy kept in `keep` when `a` is strided)."""
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
