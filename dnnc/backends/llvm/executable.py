"""The `llvm` target's runtime: a graph compiled into native segments.

The graph's nodes run in order as *steps*: maximal runs of nodes with compute rules form a
*segment*, compiled into one LLVM module whose entry function calls every kernel of the
segment (one foreign call per segment; a graph without host fallbacks is one call); a node
without a loop form (`NoCompute`) runs between segments as a host fallback through its NumPy
reference.

Shapes: a segment is specialised to the concrete shapes of its inputs when it first meets
them, and cached: a dynamic batch compiles once per batch size seen, never again for a size
seen before; sizes that depend on data (after NonZero, say) are handled the same way, since a
segment after a fallback is specialised on the shapes the fallback actually produced.

Memory: values a segment produces for later steps are fresh arrays per call (outputs escape);
values used only inside a segment live in one arena per segment and thread, placed by
`passes.plan_memory` over the kernels' order (an elementwise kernel may write over an input it
is the last reader of: that kernel is rendered without `noalias`), so concurrent calls from
several threads are safe.

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
import re
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import llvmlite.binding as llvm
import numpy as np

from ...errors import ArtifactError, CompileError
from ...ir import types as T
from ...ir.graph import Graph, Node, Value
from ...ir import loop as L
from ...ir.ops.registry import Pattern, get_op, known_constant
from ...ir.target import Target
from ...passes.specialize import reinfer
from ..lower import Kernel, NoCompute, lower_group
from .codegen import ModuleBuilder
from .objfile import check_object
from .runtime import (JITModule, at_fork_in_child, ensure_pool, host_target, initialize,
                      llvm_lock, target_machine)
from .schedules import schedule_kernel
from ...passes.fuse_ops import fusion_groups
from .dense import LAYOUT_TAILS
from ...passes.plan_memory import ALIGN, Step, plan_memory


@dataclass
class Segment:
    """Consecutive nodes compiled together."""

    index: int
    nodes: list[Node]
    inputs: list[Value] = field(default_factory=list)     # read from earlier steps
    escaping: list[Value] = field(default_factory=list)   # needed by later steps / outputs
    # positions in `inputs` of parameter inputs (axes, shapes...) only known at run time:
    # the segment is specialised on their values as well as on shapes
    value_inputs: list[int] = field(default_factory=list)


@dataclass
class HostStep:
    node: Node


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


# specialisations kept per segment: each costs its machine code and, per calling thread, its
# arena (200 batch sizes of an MLP held 274 MB before the cache was bounded)
DEFAULT_CACHE_SIZE = 32


class LLVMRuntime:
    """Runs a graph as native segments and host steps; thread-safe and fork-safe.

    `cache_size` bounds the specialisations kept per segment (one per input shapes seen):
    beyond it the least recently used one is dropped (`evictions` counts them) and compiles
    again if its shapes come back."""

    name = "llvm"

    def __init__(self, graph: Graph, target: Target | None = None, opt_level: int = 3,
                 progress: bool | None = None, plan: list[dict] | None = None,
                 fuse: bool | None = None, reuse_memory: bool | None = None,
                 warm_up: bool = True, cache_size: int = DEFAULT_CACHE_SIZE):
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise CompileError(f"cache_size must be a positive integer (specialisations kept "
                               f"per segment), not {cache_size!r}")
        self.graph = graph
        self.target = target or host_target()
        self.opt_level = opt_level
        self.fuse = opt_level >= 2 if fuse is None else fuse   # fuse_ops from opt level 2
        # plan_memory from opt level 1; without it every intermediate has a block of its own
        self.plan_memory = opt_level >= 1 if reuse_memory is None else reuse_memory
        self.plan_seconds = 0.0
        self.threads = self.target.threads
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._forced_host: frozenset = frozenset()
        self.steps = self._plan() if plan is None else self._steps_from(plan)
        self.cache_size = cache_size
        self.evictions = 0
        # least recently used first; a hit moves its key to the end
        self._cache: OrderedDict[tuple, _CompiledSegment] = OrderedDict()
        self._lock = threading.Lock()
        at_fork_in_child(self)
        self.compile_seconds = 0.0
        if warm_up and plan is None and all(v.type.is_static for v in graph.inputs):
            self._warm_up()

    @classmethod
    def restore(cls, graph: Graph, plan: list[dict], images: list[SegmentImage],
                target: Target, opt_level: int = 3,
                progress: bool | None = None,
                cache_size: int = DEFAULT_CACHE_SIZE) -> "LLVMRuntime":
        """A runtime from a saved plan and compiled specialisations: no lowering, no LLVM
        passes; shapes not among `images` still compile on first use. Every image is kept,
        even past `cache_size`; the cache shrinks to its size when it next compiles."""
        rt = cls(graph, target=target, opt_level=opt_level, progress=progress, plan=plan,
                 cache_size=cache_size)
        for image in images:
            step = rt.steps[image.step]
            if not isinstance(step, Segment):
                raise ValueError(f"image for step {image.step}, which is not a segment")
            rt._cache[(step.index, image.shapes, image.values)] = \
                _CompiledSegment.from_image(step, image, rt)
        return rt

    # -- planning ------------------------------------------------------------------------------

    def _plan(self, forced_host: frozenset = frozenset()) -> list:
        steps: list = []
        run: list[Node] = []
        for node in self.graph.nodes:
            if id(node) not in forced_host:
                if _has_loop_form(node):
                    run.append(node)
                    continue
                if _unknown_params(node):
                    # its parameters come from earlier steps: a new segment starts here and
                    # is specialised on their values
                    if run:
                        steps.append(Segment(len(steps), run))
                    run = [node]
                    continue
            if run:
                steps.append(Segment(len(steps), run))
                run = []
            steps.append(HostStep(node))
        if run:
            steps.append(Segment(len(steps), run))
        self._connect(steps)
        return steps

    def _connect(self, steps: list) -> None:
        """Each segment's inputs (read from earlier steps) and escaping values."""
        later_uses = _later_uses(self.graph, steps)
        for k, step in enumerate(steps):
            if isinstance(step, Segment):
                inside = {id(v) for n in step.nodes for v in n.outputs}
                seen = set()
                for n in step.nodes:
                    for v in n.inputs:
                        if v is not None and id(v) not in inside and id(v) not in seen:
                            seen.add(id(v))
                            step.inputs.append(v)
                step.escaping = [v for n in step.nodes for v in n.outputs
                                 if later_uses.get(id(v), -1) > k]
                params = {id(n.inputs[i]) for n in step.nodes for i in get_op(n.op).params
                          if i < len(n.inputs) and n.inputs[i] is not None}
                step.value_inputs = [i for i, v in enumerate(step.inputs)
                                     if id(v) in params and known_constant(v) is None]

    def _steps_from(self, plan: list[dict]) -> list:
        """Steps from `plan()`'s description; the same later-use analysis as `_plan`."""
        nodes = self.graph.nodes
        steps: list = []
        for entry in plan:
            if "host" in entry:
                steps.append(HostStep(nodes[entry["host"]]))
            else:
                steps.append(Segment(len(steps), [nodes[k] for k in entry["segment"]]))
        covered = sorted(k for e in plan for k in (e["segment"] if "segment" in e
                                                   else [e["host"]]))
        if covered != list(range(len(nodes))):
            raise ValueError("the plan does not cover every node of the graph once")
        self._connect(steps)
        return steps

    def plan(self) -> list[dict]:
        """The steps as plain data: `{"segment": [node indices]}` or `{"host": node index}`."""
        index = {id(n): k for k, n in enumerate(self.graph.nodes)}
        return [{"host": index[id(s.node)]} if isinstance(s, HostStep)
                else {"segment": [index[id(n)] for n in s.nodes]} for s in self.steps]

    def images(self) -> list[SegmentImage]:
        """Every specialisation compiled so far, as data an artifact can store."""
        with self._lock:
            return [seg.image() for seg in list(self._cache.values())]

    @property
    def host_fallback_ops(self) -> list[str]:
        return [f"{s.node.op} ({s.node.name})" for s in self.steps if isinstance(s, HostStep)]

    @property
    def kernels(self) -> int:
        """Kernels per call: of each segment's first compiled specialisation (fused groups
        count once), or before it is compiled the groups its nodes fuse into (`warm_up=False`
        counts a graph's kernels without lowering or compiling them)."""
        compiled = {}
        for (index, *_), seg in list(self._cache.items()):
            compiled.setdefault(index, len(seg.kernels) or len(seg.step.nodes))
        return sum(compiled[s.index] if s.index in compiled else self._planned_kernels(s)
                   for s in self.steps if isinstance(s, Segment))

    def _planned_kernels(self, step: Segment) -> int:
        return len(kernel_groups(step.nodes, {id(v) for v in step.escaping}, self.fuse))

    def _warm_up(self) -> None:
        """Compile every segment now when the inputs' shapes are static (shapes after host
        steps are found by inference; segments after data-dependent ones compile on first
        call)."""
        types = {id(v): v.type for v in self.graph.inputs}
        for v in self.graph.constants():
            types[id(v)] = v.type
        for step in self.steps:
            if isinstance(step, HostStep):
                for v in step.node.outputs:
                    types[id(v)] = v.type
                continue
            in_types = [types.get(id(v), v.type) for v in step.inputs]
            if not all(t.is_static for t in in_types) or step.value_inputs:
                return
            seg = self._compiled(step, tuple(t.shape for t in in_types))
            for v, t in zip(step.escaping, seg.escaping_types):
                types[id(v)] = t

    # -- running -------------------------------------------------------------------------------

    def run(self, inputs: list[np.ndarray], bindings: dict[str, int]) -> list[np.ndarray]:
        while True:
            try:
                return self._run(inputs)
            except _HostAfterAll as exc:
                # a node specialised on run-time parameters still has no loop form for them:
                # it runs on the host from now on (one re-plan, then cached as usual)
                with self._lock:
                    self._forced_host = self._forced_host | {id(exc.node)}
                    self.steps = self._plan(self._forced_host)
                    self._cache.clear()

    def _run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        env: dict[int, np.ndarray] = {}
        for v, a in zip(self.graph.inputs, inputs):
            env[id(v)] = a
        for step in self.steps:
            if isinstance(step, HostStep):
                self._run_host(step.node, env)
            else:
                seg, arrays = self._segment_call(step, env)
                outs = seg.run(arrays, self._frame(seg))
                for v, a in zip(step.escaping, outs):
                    env[id(v)] = a
        return [self._value(v, env) for v in self.graph.outputs]

    def _segment_call(self, step: Segment, env) -> tuple["_CompiledSegment", list]:
        """The specialisation of `step` for the inputs in `env` (compiled on first use), and
        those inputs."""
        arrays = [self._value(v, env) for v in step.inputs]
        values = tuple((i, tuple(np.asarray(arrays[i]).reshape(-1).tolist()))
                       for i in step.value_inputs)
        return self._compiled(step, tuple(a.shape for a in arrays), values), arrays

    def profile(self, inputs: list[np.ndarray], repeat: int = 20
                ) -> tuple[list[np.ndarray], list[dict]]:
        """The outputs, and the median milliseconds of each kernel called alone, in call
        order, and of each host step: where a model's time goes (bench/kernel_profile.py).
        Specialisations restored from an artifact keep no kernel list: compile from the model
        to profile them."""
        env: dict[int, np.ndarray] = {}
        for v, a in zip(self.graph.inputs, inputs):
            env[id(v)] = a
        rows = []
        for step in self.steps:
            if isinstance(step, HostStep):
                start = time.perf_counter()
                self._run_host(step.node, env)
                rows.append({"kernel": f"host {step.node.op}", "nodes": [step.node.name],
                             "ms": (time.perf_counter() - start) * 1e3})
                continue
            seg, arrays = self._segment_call(step, env)
            if not getattr(seg, "calls", None):
                raise CompileError("this segment was restored from an artifact without its "
                                   "kernel list; compile the model to profile it")
            outs, times = seg.profile(arrays, self._frame(seg), repeat)
            for kernel, ms in times:
                rows.append({"kernel": kernel.func.name, "nodes": [n.name for n in kernel.nodes],
                             "ms": ms})
            for v, a in zip(step.escaping, outs):
                env[id(v)] = a
        return [self._value(v, env) for v in self.graph.outputs], rows

    def _value(self, v: Value, env) -> np.ndarray:
        if v.const is not None:
            return v.const
        return env[id(v)]

    def _run_host(self, node: Node, env) -> None:
        from ...ir.interpreter import run_node

        args = [None if v is None else self._value(v, env) for v in node.inputs]
        outs = run_node(node, args, env)
        for v, a in zip(node.outputs, outs):
            env[id(v)] = a

    def _frame(self, seg: "_CompiledSegment") -> "_Frame":
        """This thread's arena and slots for `seg` (concurrent calls never share them; they
        live on `seg`, so an evicted specialisation's arenas go with it)."""
        frame = getattr(seg.frames, "frame", None)
        if frame is None:
            frame = seg.frames.frame = seg.frame()
        return frame

    def _compiled(self, step: Segment, shapes: tuple, values: tuple = ()
                  ) -> "_CompiledSegment":
        key = (step.index, shapes, values)
        seg = self._cache.get(key)
        if seg is not None:
            try:
                self._cache.move_to_end(key)
            except KeyError:   # evicted by another thread meanwhile: `seg` still works
                pass
            return seg
        with self._lock:
            seg = self._cache.get(key)
            if seg is None:
                start = time.perf_counter()
                seg = _CompiledSegment(step, shapes, self, values)
                self._cache[key] = seg
                self._evict(step.index)
                self.compile_seconds += time.perf_counter() - start
        return seg

    def _evict(self, index: int) -> None:
        """Drop segment `index`'s least recently used specialisations beyond `cache_size`
        (a call running one keeps it alive until it returns)."""
        keys = [k for k in list(self._cache) if k[0] == index]   # list(): one atomic copy
        for key in keys[:max(0, len(keys) - self.cache_size)]:
            del self._cache[key]
            self.evictions += 1

    def _after_fork_in_child(self) -> None:
        """The forking thread is the child's only one: a lock another thread held at fork
        time would never be released (a child needing a new shape would hang)."""
        self._lock = threading.Lock()

    # -- introspection -------------------------------------------------------------------------

    def compiled_segments(self) -> list["_CompiledSegment"]:
        return list(self._cache.values())

    @property
    def arena_bytes(self) -> int:
        """Arena bytes a calling thread holds: the sum over every compiled specialisation
        (each segment and shape has an arena of its own, all kept)."""
        return sum(s.arena_bytes for s in list(self._cache.values()))

    @property
    def memory_stats(self) -> dict[str, int]:
        """`plan_memory`'s figures summed like `arena_bytes`: `naive_bytes` (every
        intermediate in a block of its own) and `live_lower_bound_bytes` (per arena, the most
        bytes live at once); empty when no specialisation was planned in this process (all
        restored from an artifact)."""
        plans = [s.memory for s in list(self._cache.values()) if s.memory is not None]
        if not plans:
            return {}
        return {"naive_bytes": sum(p.naive_bytes for p in plans),
                "live_lower_bound_bytes": sum(p.live_lower_bound_bytes for p in plans),
                "inplace_kernels": sum(len(p.inplace) for p in plans)}

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


@dataclass
class _Frame:
    arena: np.ndarray
    arena_ptr: int
    slots: ctypes.Array


def _address(a: np.ndarray) -> int:
    """The data pointer of a contiguous array (5x cheaper than `a.ctypes.data` where the
    buffer is writable, which every array but a read-only view is)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


class _HostAfterAll(Exception):
    def __init__(self, node: Node):
        self.node = node


def kernel_groups(nodes: list[Node], needed_outside: set[int], fuse: bool
                  ) -> list[list[Node]]:
    """The kernels a segment's nodes form: fuse_ops' groups (anchors storing through the
    layout tails the dense template supports) when fusion is on, else one per node. The one
    place compiling and `kernels` before compiling (`dnnc inspect --passes`) both ask."""
    if not fuse:
        return [[n] for n in nodes]
    return fusion_groups(nodes, needed_outside, store_remaps=LAYOUT_TAILS)


def _unknown_params(node: Node) -> bool:
    """Whether some parameter input of `node` is not known at compile time."""
    for i in get_op(node.op).params:
        if i < len(node.inputs) and node.inputs[i] is not None and \
                known_constant(node.inputs[i]) is None:
            return True
    return False


def _signature(func: L.PrimFunc) -> str:
    """The kernel's text with its own and its parameters' names abstracted."""
    text = str(func).split("\n", 1)[1]
    for k, b in enumerate(func.params):
        text = re.sub(rf"\b{re.escape(b.name)}\b", f"p{k}", text)
    params = ", ".join(f"{b.dtype.name}{[str(d) for d in b.shape]}" for b in func.params)
    return params + "\n" + text


def _has_loop_form(node: Node) -> bool:
    try:
        lower_group([node], "probe")
    except NoCompute:
        return False
    return True


def _later_uses(graph: Graph, steps: list) -> dict[int, int]:
    """Value id -> index of the last step reading it (graph outputs: past the end)."""
    last: dict[int, int] = {}
    for k, step in enumerate(steps):
        nodes = step.nodes if isinstance(step, Segment) else [step.node]
        for n in nodes:
            for v in n.inputs:
                if v is not None:
                    last[id(v)] = k
            for sub in n.subgraphs():
                for v in _outer_reads(sub):
                    last[id(v)] = k
    for v in graph.outputs:
        last[id(v)] = len(steps)
    return last


def _outer_reads(g: Graph):
    inner = {id(v) for v in g.inputs} | {id(v) for n in g.nodes for v in n.outputs}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None and id(v) not in inner and v.const is None:
                yield v


class _CompiledSegment:
    """One segment specialised to concrete input shapes: kernels, module, arena layout."""

    def __init__(self, step: Segment, shapes: tuple, rt: LLVMRuntime, key_values: tuple = ()):
        self.step = step
        self.shapes = shapes
        self.key_values = key_values
        nodes, values = _specialize(step, shapes, dict(key_values))
        self.escaping_types = [values[id(v)].type for v in step.escaping]
        if rt.progress:
            print(f"dnnc: compiling segment {step.index} ({len(nodes)} kernels) for "
                  f"{rt.target.cpu}", file=sys.stderr)
        self.kernels: list[Kernel] = []
        mb = ModuleBuilder(f"segment{step.index}")
        original = {id(n): o for n, o in zip(nodes, step.nodes)}
        escaping_ids = {id(values[id(v)]) for v in step.escaping}
        groups = kernel_groups(nodes, escaping_ids, rt.fuse)
        for k, group in enumerate(groups):
            node = group[0]
            needed = [v for v in group[-1].outputs] + \
                [v for n in group[:-1] for v in n.outputs if id(v) in escaping_ids]
            try:
                kernel = lower_group(group, f"k{k}_{node.op}", outputs=needed)
            except NoCompute:
                for n in group:   # the node without a loop form runs on the host from now on
                    try:
                        lower_group([n], "probe")
                    except NoCompute:
                        raise _HostAfterAll(original[id(n)]) from None
                raise
            if kernel.func.size_vars:
                raise CompileError(f"{node.op} node {node.name!r}: shapes still symbolic "
                                   f"after specialisation: {kernel.func.size_vars}")
            kernel.func = schedule_kernel(kernel, rt.target, rt.threads)
            self.kernels.append(kernel)
        # slots: inputs, escaping outputs, constants, then arena-resident intermediates
        escaping = [values[id(v)] for v in step.escaping]
        ext: list[Value] = [values[id(v)] for v in step.inputs if v.const is None] + escaping
        consts: list[Value] = []
        self.const_refs: list[tuple[int, int]] = []   # where each constant is read, for images
        for k, n in enumerate(nodes):
            for j, v in enumerate(n.inputs):
                if v is not None and v.const is not None and all(v is not c for c in consts):
                    consts.append(v)
                    self.const_refs.append((k, j))
        ext_index = {id(v): k for k, v in enumerate(ext + consts)}
        self.n_inputs = sum(1 for v in step.inputs if v.const is None)
        start = time.perf_counter()
        self.memory = plan_memory(*_memory_steps(self.kernels, ext_index), reuse=rt.plan_memory)
        rt.plan_seconds += time.perf_counter() - start
        self.offsets, self.arena_bytes = self.memory.offsets, self.memory.arena_bytes
        # a kernel writing over its input in place may not declare its buffers noalias;
        # identical kernels (repeated layers) compile once per aliasing choice
        rendered: dict[tuple[str, bool], str] = {}
        for kernel in self.kernels:
            noalias = not any(id(v) in self.memory.inplace for v in kernel.outputs)
            signature = (_signature(kernel.func), noalias)
            if signature in rendered:
                kernel.func = L.PrimFunc(rendered[signature], kernel.func.params,
                                         kernel.func.body, kernel.func.size_vars)
                continue
            rendered[signature] = kernel.func.name
            mb.add(kernel.func, noalias=noalias)
        calls = []
        for kernel in self.kernels:
            args = []
            for v in kernel.inputs + kernel.outputs:
                if id(v) in ext_index:
                    args.append(("ext", ext_index[id(v)]))
                else:
                    args.append(("arena", self.offsets[id(v)]))
            calls.append((kernel.func.name, args))
        mb.add_entry("entry", calls)
        self.calls = calls   # for `profile`: each kernel called on its own
        slots = len(ext) + len(consts)
        digest = layout_digest(step, shapes, key_values, self.escaping_types, self.const_refs,
                               [v.const for v in consts], self.n_inputs, slots,
                               self.arena_bytes, "entry", rt.target)
        try:
            jit = JITModule(str(mb) + _layout_global(digest), rt.target, rt.opt_level,
                            name=f"segment{step.index}")
        except RuntimeError as exc:
            names = ", ".join(f"{n.op} {n.name!r}" for n in nodes[:5])
            raise CompileError(f"LLVM rejected the code for segment {step.index} ({names}"
                               f"{', ...' if len(nodes) > 5 else ''}): {exc}") from exc
        self._bind(jit, "entry", [v.const for v in consts], slots)

    @classmethod
    def from_image(cls, step: Segment, image: SegmentImage, rt: LLVMRuntime):
        """A specialisation restored from an artifact: its object code is loaded, nothing is
        lowered or optimised again."""
        self = cls.__new__(cls)
        self.step = step
        self.shapes = image.shapes
        self.key_values = image.values
        self.escaping_types = list(image.escaping_types)
        self.kernels = []
        self.const_refs = list(image.consts)
        self.n_inputs = image.n_inputs
        self.offsets = {}
        self.memory = None
        self.arena_bytes = image.arena_bytes
        self._loop_ir = image.loop_ir
        consts = _image_consts(step, image)
        jit = ObjectModule(image.object_code, rt.target, name=f"segment{step.index}",
                           llvm_ir=image.llvm_ir)
        want = layout_digest(step, image.shapes, image.values, image.escaping_types,
                             image.consts, consts, image.n_inputs, image.slots,
                             image.arena_bytes, image.entry, rt.target)
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

    def frame(self) -> "_Frame":
        """What one thread needs to call this segment: its arena and a slot array with the
        constants' pointers already in place (building a ctypes array of a hundred pointers
        costs more than a small model's kernels)."""
        raw = np.empty(self.arena_bytes + ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % ALIGN
        arena = raw[skip:skip + self.arena_bytes]
        slots = (ctypes.c_void_p * max(self.slots, 1))()
        first = self.n_inputs + len(self.escaping_types)
        for k, ptr in enumerate(self._const_ptrs):
            slots[first + k] = ptr
        return _Frame(arena, arena.ctypes.data, slots)

    def _fill(self, inputs: list[np.ndarray], frame: "_Frame") -> tuple[list, list]:
        """The call's data inputs (contiguous; kept alive by the caller until the call
        returns) and fresh outputs, their pointers written into the frame's slots."""
        arrays = [np.ascontiguousarray(inputs[i]) for i in self._data_inputs]
        outs = [np.empty(t.shape, t.dtype.np) for t in self.escaping_types]
        for k, a in enumerate(arrays + outs):
            frame.slots[k] = _address(a)
        return arrays, outs

    def run(self, inputs: list[np.ndarray], frame: "_Frame") -> list[np.ndarray]:
        arrays, outs = self._fill(inputs, frame)
        self.entry(frame.slots, frame.arena_ptr)
        return outs

    def profile(self, inputs: list[np.ndarray], frame: "_Frame", repeat: int
                ) -> tuple[list[np.ndarray], list[tuple[Kernel, float]]]:
        """The segment's outputs, and each kernel's median milliseconds over `repeat` calls
        of that kernel alone (in order, on the data the kernels before it left; the outputs
        equal `run`'s)."""
        arrays, outs = self._fill(inputs, frame)
        arena = frame.arena
        rows = []
        for kernel, (name, args) in zip(self.kernels, self.calls):
            ptrs = [frame.slots[k] if kind == "ext" else frame.arena_ptr + k
                    for kind, k in args]
            fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(ptrs))(self.jit.address(name))
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
            values=self.key_values)


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
        with llvm_lock():   # LLVM's locks are never held across a fork (runtime.py)
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
                  target: Target) -> bytes:
    """The SHA-256 of everything a call of the segment's code relies on."""
    doc = {"nodes": [[n.op, n.name] for n in step.nodes],
           "inputs": [[v.type.dtype.name, v.const is not None] for v in step.inputs],
           "shapes": [list(s) for s in shapes], "values": [[i, list(v)] for i, v in values],
           "escaping": [v.type.dtype.name for v in step.escaping],
           "escaping_types": [[t.dtype.name, list(t.shape)] for t in escaping_types],
           "consts": [[k, j, c.dtype.name, list(c.shape)]
                      for (k, j), c in zip(const_refs, const_arrays)],
           "n_inputs": n_inputs, "slots": slots, "arena_bytes": arena_bytes, "entry": entry,
           "cpu": [target.cpu, target.features]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).digest()


def _layout_global(digest: bytes) -> str:
    text = "".join(f"\\{b:02X}" for b in digest)
    return f'\n@{LAYOUT_SYMBOL} = constant [{len(digest)} x i8] c"{text}", align 1\n'


def _image_consts(step: Segment, image: SegmentImage) -> list[np.ndarray]:
    """The constants an image's slots point to, after checking the image fits the segment:
    counts, ranks and fixed dims of its shapes, and that each constant slot names one."""
    if len(image.shapes) != len(step.inputs):
        raise ArtifactError(f"segment {step.index} has {len(step.inputs)} inputs, its "
                            f"compiled code's key has {len(image.shapes)} shapes")
    for v, shape in zip(step.inputs, image.shapes):
        if len(shape) != v.type.rank or any(isinstance(d, int) and d != s
                                            for d, s in zip(v.type.shape, shape)):
            raise ArtifactError(f"segment {step.index}: input {v.name!r} of type {v.type} "
                                f"cannot have shape {list(shape)}")
    if len(image.escaping_types) != len(step.escaping) or any(
            t.dtype != v.type.dtype for t, v in zip(image.escaping_types, step.escaping)):
        raise ArtifactError(f"segment {step.index}: its outputs' types do not match the "
                            f"graph's")
    consts = []
    for k, j in image.consts:
        if not (0 <= k < len(step.nodes) and 0 <= j < len(step.nodes[k].inputs)) or \
                step.nodes[k].inputs[j] is None or step.nodes[k].inputs[j].const is None:
            raise ArtifactError(f"segment {step.index}: constant slot ({k}, {j}) names no "
                                f"constant input")
        consts.append(step.nodes[k].inputs[j].const)
    if image.n_inputs != sum(1 for v in step.inputs if v.const is None) or \
            image.slots != image.n_inputs + len(step.escaping) + len(consts):
        raise ArtifactError(f"segment {step.index}: {image.n_inputs} inputs and {image.slots}"
                            f" slots do not match its graph")
    return consts


def _specialize(step: Segment, shapes: tuple, known: dict | None = None
                ) -> tuple[list[Node], dict[int, Value]]:
    """Copies of the segment's nodes whose types are inferred from concrete input shapes;
    inputs in `known` (position -> ints) have those contents at compile time."""
    known = known or {}
    values: dict[int, Value] = {}
    for i, (v, shape) in enumerate(zip(step.inputs, shapes)):
        if v.const is not None:
            values[id(v)] = v
        else:
            nv = Value(v.name, T.TensorType(v.type.dtype, shape))
            nv.known = v.known if v.known is not None and v.type.is_static else None
            if i in known:
                nv.known = np.array(known[i], dtype=object).reshape(shape)
            values[id(v)] = nv
    nodes = reinfer(step.nodes, values)
    return nodes, values


def _memory_steps(kernels: list[Kernel], external: dict[int, int]) -> tuple:
    """`plan_memory`'s input for a segment's kernels: values by id, byte sizes, external ids;
    a kernel of elementwise / broadcasting ops with one output may write over an input of the
    output's own shape and dtype (each element is read only to write the same element)."""
    steps, sizes = [], {}
    for kernel in kernels:
        for v in kernel.inputs + kernel.outputs:
            sizes[id(v)] = v.type.numel * v.type.dtype.itemsize
        inplace = ()
        if len(kernel.outputs) == 1 and all(get_op(n.op).pattern in _IN_PLACE_PATTERNS
                                            for n in kernel.nodes):
            out = kernel.outputs[0].type
            inplace = tuple(id(v) for v in kernel.inputs
                            if v.type.shape == out.shape and v.type.dtype == out.dtype)
        steps.append(Step([id(v) for v in kernel.inputs], [id(v) for v in kernel.outputs],
                          inplace))
    return steps, sizes, set(external)


_IN_PLACE_PATTERNS = (Pattern.ELEMWISE, Pattern.BROADCAST)
