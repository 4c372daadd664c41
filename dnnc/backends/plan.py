"""The one compile path every compiled target shares: graph -> segments -> kernels -> plan.

    graph (after the passes; `Graph.groups` from fuse_ops)
      -> steps (`ir.segments`): segments of nodes with a loop form, host fallbacks between
      -> per segment and input shapes seen, a `Program`: the segment's nodes specialised to
         the shapes (`ir.reinfer`), one kernel per fusion group (`lower_group`, then the
         target's `schedule`), identical kernels found by structural signature, constants
         and arena slots, the memory plan (`memory.plan_memory`) and the call order
      -> the target renders the program's kernels and binds the plan into something callable.

`Executable` is the runtime every target's runtime extends: it runs the steps in order (host
steps through the NumPy reference), keeps the compiled specialisations of each segment in a
bounded LRU cache (a dynamic batch compiles once per batch size seen), compiles every
segment ahead of the first call when the inputs' shapes are static, and re-plans once when a
node specialised on run-time parameters turns out to have no loop form. A target supplies
`compile_segment(program)`, returning an object that runs the program (see `Executable`).

Shapes: a segment is specialised to the concrete shapes of its inputs when it first meets
them; sizes that depend on data (after NonZero, say) are handled the same way, since a
segment after a fallback is specialised on the shapes the fallback actually produced.

New batch sizes run at once: a segment that `ir.batching` proves batch-separable along a
symbolic axis 0 runs a size it has no code for on the code of another size (`BatchSplit`: the
items in slices of that size, the last one padded), on targets that allow it (`batch_split`).
A size met `specialize_after` times is then compiled for in a background thread, and its own
code replaces the split once ready.

Memory: values a segment produces for later steps are fresh arrays per call (outputs escape);
values used only inside a segment live in one arena per segment and thread, placed by
`plan_memory` over the kernels' order (an elementwise kernel may write over an input it is
the last reader of: that kernel must be rendered without `noalias`), so concurrent calls from
several threads are safe.
"""

from __future__ import annotations

import dataclasses

import hashlib
import logging
import sys
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ArtifactError, CompileError, ConfigError
from ..ir import loop as L
from ..ir import types as T
from ..ir.batching import batch_symbol
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import Pattern, get_op
from ..ir.reinfer import reinfer
from ..ir.segments import HostStep, Segment, describe, has_loop_form, plan_steps, steps_from
from ..progress import Progress
from .lower import Kernel, NoCompute, lower_group
from .memory import MemoryPlan, Step, plan_memory

log = logging.getLogger(__name__)

# specialisations kept per segment: each costs its machine code and, per calling thread, its
# arena (200 batch sizes of an MLP held 274 MB before the cache was bounded)
DEFAULT_CACHE_SIZE = 32
# calls of a batch size run on another size's code before its own is compiled (in the
# background); a size met once or twice costs no compile at all
SPECIALIZE_AFTER = 3
MAX_SPLITS = 256   # batch splits remembered (each a few objects: the counts of uses)


@dataclass
class Call:
    """One kernel call of a program: the kernel's function name (shared by identical
    kernels) and, per parameter, where its buffer is: ("ext", slot) or ("arena", offset)."""

    func: str
    args: list[tuple[str, int]]


@dataclass
class Program:
    """A segment specialised to concrete input shapes: everything a target renders and binds.

    Slots, in order: the segment's data inputs, its escaping outputs, its constants; every
    other value lives in the arena at `memory.offsets`."""

    step: Segment
    shapes: tuple                        # the input shapes (the cache key, with key_values)
    key_values: tuple                    # ((input position, ints), ...) of value inputs
    escaping_types: list[T.TensorType]   # of the segment's outputs, in slot order
    kernels: list[Kernel]                # in call order, scheduled
    unique: list[tuple[L.PrimFunc, bool]]   # (func, noalias) to render: one per signature
    calls: list[Call]
    consts: list[np.ndarray]             # constant slots' arrays
    const_refs: list[tuple[int, int]]    # where each constant is read: (node, input position)
    n_inputs: int                        # data inputs
    memory: MemoryPlan
    plan_seconds: float = 0.0            # spent in plan_memory

    @property
    def slots(self) -> int:
        return self.n_inputs + len(self.escaping_types) + len(self.consts)

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes


class CompiledSegment:
    """What the shared runtime reads of a compiled specialisation (`Executable`'s docstring),
    taken from the `Program` it was built from or from an artifact's image of it (which keeps
    no kernels, calls or memory plan). A target's compiled segment extends it."""

    def _take_program(self, program: Program) -> None:
        self.step = program.step
        self.shapes = program.shapes
        self.key_values = program.key_values
        self.escaping_types = program.escaping_types
        self.kernels = program.kernels
        self.const_refs = program.const_refs
        self.n_inputs = program.n_inputs
        self.memory = program.memory
        self.arena_bytes = program.arena_bytes
        # the part of `arena_bytes` past the planned values that kernels use as workspace
        # (a target that places workspace there sets it: the llvm target's packed A)
        self.arena_workspace_bytes = 0
        self.calls = program.calls   # for `profile`: each kernel called on its own

    def _take_image(self, step: Segment, image) -> None:
        self.step = step
        self.shapes = image.shapes
        self.key_values = image.values
        self.escaping_types = list(image.escaping_types)
        self.kernels = []
        self.const_refs = list(image.consts)
        self.n_inputs = image.n_inputs
        self.memory = None
        self.arena_bytes = image.arena_bytes
        self.arena_workspace_bytes = 0
        self.calls = []


class HostAfterAll(Exception):
    """A node specialised on run-time parameters still has no loop form for them."""

    def __init__(self, node: Node):
        self.node = node


def segment_groups(step: Segment, groups: list[list[Node]] | None) -> list[list[int]]:
    """The kernels of `step` as positions in its nodes: fuse_ops' groups that lie inside it
    (the rest of a group cut by a host step re-plan, one node each); one node each without
    groups."""
    position = {id(n): k for k, n in enumerate(step.nodes)}
    out: list[list[int]] = []
    taken: set[int] = set()
    for group in groups or ():
        inside = [position[id(n)] for n in group if id(n) in position]
        if not inside:
            continue
        if len(inside) == len(group):
            out.append(inside)
        else:
            out += [[k] for k in inside]
        taken.update(inside)
    out += [[k] for k in range(len(step.nodes)) if k not in taken]
    # groups run in the order of their last node (fuse_ops' order, a topological one)
    return sorted(out, key=lambda g: g[-1])


def count_kernels(graph: Graph) -> int:
    """The kernels a call of `graph` runs, counted without lowering or compiling: its
    segments' fusion groups (a node each before fuse_ops)."""
    return sum(len(segment_groups(s, graph.groups)) for s in plan_steps(graph)
               if isinstance(s, Segment))


def kernel_facts(kernel: Kernel) -> dict:
    """What a profile row says of a kernel besides its time: its template and config, its
    floating-point operations (the op registry's rules over its nodes; None where a node has
    none) and the bytes of its parameters (each read or written once at least)."""
    from ..ir.flops import node_flops

    counts = [node_flops(n) for n in kernel.nodes]
    counts = [None if c is None else c.value for c in counts]   # None: symbolic, or no rule
    flops = None if None in counts else sum(counts)
    nbytes = 0
    for v in kernel.inputs + kernel.outputs:
        numel = v.type.numel
        nbytes += (numel or 0) * v.type.dtype.itemsize
    template, config = kernel.schedule or (None, None)
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    return {"template": template, "config": config, "flops": flops, "bytes": nbytes}


def build_program(step: Segment, shapes: tuple, key_values: tuple, groups: list[list[int]],
                  schedule: Callable[[Kernel], L.PrimFunc], reuse_memory: bool) -> Program:
    """Specialise `step` to `shapes` (and the values of its value inputs), lower one kernel
    per group, schedule each with the target's `schedule`, and plan the memory."""
    nodes, values = _specialize(step, shapes, dict(key_values))
    escaping = [values[id(v)] for v in step.escaping]
    escaping_ids = {id(v) for v in escaping}
    kernels = []
    for k, members in enumerate(groups):
        group = [nodes[i] for i in members]
        node = group[0]
        needed = list(group[-1].outputs) + \
            [v for n in group[:-1] for v in n.outputs if id(v) in escaping_ids]
        try:
            kernel = lower_group(group, f"k{k}_{node.op}", outputs=needed)
        except NoCompute:
            for i in members:   # the node without a loop form runs on the host from now on
                if not has_loop_form(nodes[i]):
                    raise HostAfterAll(step.nodes[i]) from None
            raise
        if kernel.func.size_vars:
            raise CompileError(f"{node.op} node {node.name!r}: shapes still symbolic after "
                               f"specialisation: {kernel.func.size_vars}")
        kernel.func = schedule(kernel)
        kernels.append(kernel)
    # slots: inputs, escaping outputs, constants, then arena-resident intermediates
    ext: list[Value] = [values[id(v)] for v in step.inputs if v.const is None] + escaping
    consts: list[Value] = []
    const_refs: list[tuple[int, int]] = []
    for k, n in enumerate(nodes):
        for j, v in enumerate(n.inputs):
            if v is not None and v.const is not None and all(v is not c for c in consts):
                consts.append(v)
                const_refs.append((k, j))
    slot = {id(v): k for k, v in enumerate(ext + consts)}
    start = time.perf_counter()
    views = {}
    if reuse_memory:
        kernels, views = concat_in_place(kernels, slot)
    memory = plan_memory(*_memory_steps(kernels, slot), reuse=reuse_memory, views=views)
    seconds = time.perf_counter() - start
    unique, calls = _calls(kernels, slot, memory)
    return Program(step, shapes, key_values, [v.type for v in escaping], kernels, unique,
                   calls, [v.const for v in consts], const_refs,
                   sum(1 for v in step.inputs if v.const is None), memory, seconds)


def concat_in_place(kernels: list[Kernel], external: dict[int, int]
                    ) -> tuple[list[Kernel], dict[int, tuple[int, int]]]:
    """The kernels left once each Concat that can be is done in place, and the views that
    do it (`plan_memory`'s `views`: part -> (whole, byte offset)). A Concat whose output is a
    contiguous run of its parts (every axis before the concat axis of size 1: batch 1 in
    NCHW) has its parts written straight into its output where their producers store them
    (squeezenet's fire modules, inception's branches, densenet's growing blocks), and its
    copy is gone. Each part must be an arena value that a kernel here writes (or a concat
    done in place, nesting), a part of no other concat, its place in the whole aligned as
    the arena aligns; the whole must not escape the segment (outputs are arrays of their
    own)."""
    from .memory import ALIGN

    written = {id(v) for k in kernels for v in k.outputs}
    views: dict[int, tuple[int, int]] = {}
    kept = []
    for kernel in kernels:
        parts = _in_place_parts(kernel, written, external, views, ALIGN)
        if parts is None:
            kept.append(kernel)
            continue
        whole = id(kernel.outputs[0])
        for part, offset in parts:
            views[id(part)] = (whole, offset)
    return kept, views


def _in_place_parts(kernel: Kernel, written: set, external: dict, views: dict, align: int):
    """[(part, byte offset in the whole)] when `kernel` is a Concat that `concat_in_place`
    can do in place, else None."""
    if len(kernel.nodes) != 1 or kernel.nodes[0].op != "Concat":
        return None
    node = kernel.nodes[0]
    out = node.outputs[0]
    if id(out) in external or any(v is None for v in node.inputs):
        return None
    shape = out.type.shape
    axis = node.attrs["axis"] % len(shape)
    if any(d != 1 for d in shape[:axis]):
        return None
    parts, offset, seen = [], 0, set()
    for v in node.inputs:
        if id(v) in seen or id(v) in views or id(v) in external or id(v) not in written or \
                v.type.dtype != out.type.dtype or offset % align:
            return None
        seen.add(id(v))
        parts.append((v, offset))
        offset += v.type.numel * v.type.dtype.itemsize
    return parts


def _calls(kernels: list[Kernel], slot: dict[int, int], memory: MemoryPlan
           ) -> tuple[list[tuple[L.PrimFunc, bool]], list[Call]]:
    """The functions to render, one per structural signature and aliasing choice (a kernel
    writing over its input in place may not declare its buffers noalias; repeated layers
    compile once per choice), and the calls in order."""
    rendered: dict[tuple, str] = {}
    unique = []
    for kernel in kernels:
        noalias = not any(id(v) in memory.inplace for v in kernel.outputs)
        signature = (signature_of(kernel.func), noalias)
        if signature in rendered:
            kernel.func = L.PrimFunc(rendered[signature], kernel.func.params,
                                     kernel.func.body, kernel.func.size_vars, kernel.func.attrs)
            continue
        rendered[signature] = kernel.func.name
        unique.append((kernel.func, noalias))
    calls = [Call(kernel.func.name,
                  [("ext", slot[id(v)]) if id(v) in slot else ("arena", memory.offsets[id(v)])
                   for v in kernel.inputs + kernel.outputs])
             for kernel in kernels]
    return unique, calls


def signature_of(func: L.PrimFunc) -> tuple:
    """A kernel's structural signature: its parameters' dtypes and shapes and its body with
    the parameters named by position and bound variables by order (`L.structural_equal`'s
    normal form): two kernels with equal signatures compute the same thing."""
    positional = {b.name: L.Buffer(f"p{k}", b.dtype, b.shape, b.scope)
                  for k, b in enumerate(func.params)}

    def rename(n):
        if isinstance(n, (L.Load, L.Store)) and n.buffer.name in positional:
            buffer = positional[n.buffer.name]
            return L.Load(buffer, n.indices) if isinstance(n, L.Load) else \
                L.Store(buffer, n.indices, n.value)
        return None

    params = tuple((b.dtype.name, b.shape, b.scope) for b in func.params)
    return params, L.alpha_normal(L.transform(func.body, rename))


def task_key(func: L.PrimFunc) -> str:
    """A lowered (unscheduled) kernel's identity across processes and runs: the SHA-256 of its
    structural signature's text. Identical layers share it, so a tuning record serves all."""
    params, body = signature_of(func)
    text = repr(params) + "\n" + str(L.PrimFunc("task", (), body))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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


class BatchSplit:
    """A segment run at n items on its code for b items (`ir.batching` proved it
    batch-separable): the inputs that carry the batch (`carried`, positions in the segment's
    inputs) go in slices of b along axis 0, the others whole; the last slice, when short,
    is padded with copies of its last item and only its own items' outputs are kept.
    Reads like a compiled segment (`Executable`'s docstring) and shares `base`'s frames."""

    def __init__(self, base, items: int, carried: list[int]):
        self.base = base
        self.items = items
        self.carried = frozenset(carried)
        self.uses = 0
        self.step = base.step
        self.kernels = base.kernels
        self.frames = base.frames
        self.frame = base.frame

    def run(self, arrays: list, frame) -> list[np.ndarray]:
        n = arrays[min(self.carried)].shape[0]
        b = self.items
        outs = [np.empty((n,) + tuple(t.shape[1:]), t.dtype.np)
                for t in self.base.escaping_types]
        for lo in range(0, n, b):
            hi = min(lo + b, n)
            if hi - lo == b:
                chunk = [a[lo:hi] if k in self.carried else a for k, a in enumerate(arrays)]
                self.base.run(chunk, frame, [o[lo:hi] for o in outs])
                continue
            chunk = [np.concatenate([a[lo:hi]] + [a[hi - 1:hi]] * (b - (hi - lo)))
                     if k in self.carried else a for k, a in enumerate(arrays)]
            for o, r in zip(outs, self.base.run(chunk, frame)):
                o[lo:hi] = r[:hi - lo]
        return outs


class Executable:
    """Runs a graph as compiled segments and host steps; thread-safe and fork-safe.

    A target's runtime extends it with `compile_segment(program)`, returning an object with
    `step`, `shapes`, `key_values`, `escaping_types`, `kernels` (empty when restored without
    them), `memory` (None when restored), `arena_bytes`, `frames` (a `threading.local`),
    `frame()` (one calling thread's state), `run(arrays, frame)` -> escaping outputs and
    `profile(arrays, frame, repeat)` -> (outputs, [(kernel, ms)]).

    `cache_size` bounds the specialisations kept per segment (one per input shapes seen):
    beyond it the least recently used one is dropped (`evictions` counts them) and compiles
    again if its shapes come back."""

    def __init__(self, graph: Graph, opt_level: int = 3, progress: bool | None = None,
                 plan: list[dict] | None = None, reuse_memory: bool | None = None,
                 warm_up: bool = True, cache_size: int = DEFAULT_CACHE_SIZE,
                 tuned: dict | None = None, specialize_after: int | None = SPECIALIZE_AFTER):
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise CompileError(f"cache_size must be a positive integer (specialisations kept "
                               f"per segment), not {cache_size!r}")
        self.graph = graph
        self.opt_level = opt_level
        # memory reuse from opt level 1; without it every intermediate has a block of its own
        self.reuse_memory = opt_level >= 1 if reuse_memory is None else reuse_memory
        self.plan_seconds = 0.0
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._forced_host: frozenset = frozenset()
        self.steps = plan_steps(graph) if plan is None else steps_from(graph, plan)
        self.cache_size = cache_size
        self.evictions = 0
        # least recently used first; a hit moves its key to the end
        self._cache: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self.compile_seconds = 0.0
        self._warm = warm_up and plan is None and all(v.type.is_static for v in graph.inputs)
        # task key -> the config a tuning log measured best for it on this machine
        self.tuned = dict(tuned or {})
        self.tuned_kernels = 0
        # batch sizes run on another size's code (`BatchSplit`): key -> split, newest last
        self.specialize_after = specialize_after
        self._splits: OrderedDict[tuple, BatchSplit] = OrderedDict()
        self._batch_symbols: dict[int, str | None] = {}   # segment index -> its batch symbol
        self._specialising: tuple | None = None    # the key a background compile works on
        self._unspecialisable: set[tuple] = set()  # keys whose compile failed
        self.split_calls = 0

    def start(self) -> None:
        """Compile every segment now when the inputs' shapes are static (a target's
        constructor calls it once it is ready to compile)."""
        if self._warm:
            self._warm_up()

    # -- what a target supplies ----------------------------------------------------------------

    # whether its compiled segments run on slices along axis 0 (`BatchSplit`): `run(arrays,
    # frame, outs)` writes into `outs` (contiguous host arrays) when given; a runtime set to
    # False compiles every batch size it meets
    batch_split = False

    def compile_segment(self, program: Program):
        raise NotImplementedError

    def schedule_kernel(self, kernel: Kernel, config=None) -> L.PrimFunc:
        """The target's scheduled PrimFunc of a lowered kernel: its template built with
        `config` (a `ConfigError` when the template's space refuses it) or the template's
        default config."""
        raise NotImplementedError

    def describe_machine(self) -> str:
        """The machine, as the progress line names it."""
        raise NotImplementedError

    def schedule(self, kernel: Kernel) -> L.PrimFunc:
        """The kernel's template with the tuned config where the tuning log has one for it
        (`tuned`: task key -> config; `tuned_kernels` counts them), else the template's
        default (also when the template no longer accepts a logged config)."""
        config = self.tuned.get(task_key(kernel.func)) if self.tuned else None
        if config is not None:
            try:
                func = self.schedule_kernel(kernel, config)
            except ConfigError as exc:
                warnings.warn(f"tuning log: {exc}; the default config is used", stacklevel=2)
            else:
                self.tuned_kernels += 1
                return func
        return self.schedule_kernel(kernel)

    # -- planning ------------------------------------------------------------------------------

    def plan(self) -> list[dict]:
        """The steps as plain data: `{"segment": [node indices]}` or `{"host": node index}`."""
        return describe(self.graph, self.steps)

    @property
    def host_fallback_ops(self) -> list[str]:
        return [f"{s.node.op} ({s.node.name})" for s in self.steps if isinstance(s, HostStep)]

    @property
    def kernels(self) -> int:
        """Kernels per call: of each segment's first compiled specialisation, else the groups
        its nodes form (a segment not compiled yet, or restored from an artifact, which keeps
        no kernels: the same count `compile` gives; `warm_up=False` counts a graph's kernels
        without lowering or compiling them)."""
        compiled = {}
        for (index, *_), seg in list(self._cache.items()):
            if seg.kernels:
                compiled.setdefault(index, len(seg.kernels))
        return sum(compiled[s.index] if s.index in compiled
                   else len(segment_groups(s, self.graph.groups))
                   for s in self.steps if isinstance(s, Segment))

    def _warm_up(self) -> None:
        """Compile every segment whose input shapes are known ahead of the first call (shapes
        after host steps are found by inference; segments after data-dependent ones compile
        on first call)."""
        types = {id(v): v.type for v in self.graph.inputs}
        for v in self.graph.constants():
            types[id(v)] = v.type
        # a segment's compile time grows with its nodes: they are the bar's units, so its ETA
        # weighs a big segment as one
        nodes = sum(len(s.nodes) for s in self.steps if isinstance(s, Segment))
        with Progress(nodes, self.progress, unit="node") as progress:
            for step in self.steps:
                if isinstance(step, HostStep):
                    for v in step.node.outputs:
                        types[id(v)] = v.type
                    continue
                in_types = [types.get(id(v), v.type) for v in step.inputs]
                if not all(t.is_static for t in in_types) or step.value_inputs:
                    return
                seg = self._compiled(step, tuple(t.shape for t in in_types), progress=progress,
                                     exact=True)
                for v, t in zip(step.escaping, seg.escaping_types):
                    types[id(v)] = t

    # -- running -------------------------------------------------------------------------------

    def run(self, inputs: list[np.ndarray], bindings: dict[str, int]) -> list[np.ndarray]:
        while True:
            try:
                return self._run(inputs)
            except HostAfterAll as exc:
                # a node specialised on run-time parameters still has no loop form for them:
                # it runs on the host from now on (one re-plan, then cached as usual)
                with self._lock:
                    self._forced_host = self._forced_host | {id(exc.node)}
                    self.steps = plan_steps(self.graph, self._forced_host)
                    self._cache.clear()
                    self._splits.clear()   # both keyed by the old steps' indices
                    self._batch_symbols.clear()

    def _run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        env = {id(v): a for v, a in zip(self.graph.inputs, inputs)}
        for step in self.steps:
            if isinstance(step, HostStep):
                self._run_host(step.node, env)
            else:
                seg, arrays = self._segment_call(step, env)
                outs = seg.run(arrays, self._frame(seg))
                for v, a in zip(step.escaping, outs):
                    env[id(v)] = a
        return [self._value(v, env) for v in self.graph.outputs]

    def fast_call(self, inputs: list[np.ndarray]):
        """A function that runs calls whose arguments are C-contiguous NumPy arrays of exactly
        these inputs' shapes and dtypes with the least Python between the caller and the
        kernels, returning the outputs, or None for any other arguments; None where the model
        is not one segment compiled for exactly these shapes (a host step, value inputs, a
        batch split) or the target's segments have no `fast`. `CompiledModel.run` keeps one
        for the last shapes it ran: a small model's call costs ~10 us instead of ~30."""
        if len(self.steps) != 1 or not isinstance(self.steps[0], Segment):
            return None
        step = self.steps[0]
        position = {id(v): i for i, v in enumerate(self.graph.inputs)}
        escaping = {id(v): i for i, v in enumerate(step.escaping)}
        if step.value_inputs or any(v.const is None and id(v) not in position
                                    for v in step.inputs) \
                or any(id(v) not in escaping for v in self.graph.outputs):
            return None
        shapes = tuple(inputs[position[id(v)]].shape if v.const is None else v.const.shape
                       for v in step.inputs)
        key = (step.index, shapes, ())
        fast = getattr(self._cache.get(key), "fast", None)
        if fast is None:
            return None
        run = fast([position.get(id(v)) for v in step.inputs],
                   [escaping[id(v)] for v in self.graph.outputs],
                   [(a.shape, a.dtype) for a in inputs])
        cache = self._cache

        def call(args) -> list[np.ndarray] | None:
            try:
                cache.move_to_end(key)   # a use, as `_compiled` counts one
            except KeyError:   # evicted: the plain path compiles it again, as it would have
                return None
            return run(args)

        return call

    def _segment_call(self, step: Segment, env, exact: bool = False) -> tuple[object, list]:
        """The specialisation of `step` for the inputs in `env` (compiled on first use, or a
        `BatchSplit` unless `exact`), and those inputs."""
        arrays = [self._value(v, env) for v in step.inputs]
        values = tuple((i, tuple(np.asarray(arrays[i]).reshape(-1).tolist()))
                       for i in step.value_inputs)
        return self._compiled(step, tuple(a.shape for a in arrays), values, exact=exact), arrays

    def profile(self, inputs: list[np.ndarray], repeat: int = 20
                ) -> tuple[list[np.ndarray], list[dict]]:
        """The outputs, and the median milliseconds of each kernel called alone, in call
        order, and of each host step: where a model's time goes (bench/kernel_profile.py).
        Specialisations restored from an artifact keep no kernel list: compile from the model
        to profile them."""
        env = {id(v): a for v, a in zip(self.graph.inputs, inputs)}
        rows = []
        for step in self.steps:
            if isinstance(step, HostStep):
                start = time.perf_counter()
                self._run_host(step.node, env)
                rows.append({"kernel": f"host {step.node.op}", "nodes": [step.node.name],
                             "ms": (time.perf_counter() - start) * 1e3})
                continue
            seg, arrays = self._segment_call(step, env, exact=True)
            if not seg.kernels:
                raise CompileError("this segment was restored from an artifact (or the "
                                   "compile cache) without its kernel list; compile the "
                                   "model with cache=False to profile it")
            outs, times = seg.profile(arrays, self._frame(seg), repeat)
            for kernel, ms in times:
                rows.append({"kernel": kernel.func.name, "nodes": [n.name for n in kernel.nodes],
                             "ms": ms, **kernel_facts(kernel)})
            for v, a in zip(step.escaping, outs):
                env[id(v)] = a
        return [self._value(v, env) for v in self.graph.outputs], rows

    def _value(self, v: Value, env) -> np.ndarray:
        if v.const is not None:
            return v.const
        return env[id(v)]

    def _run_host(self, node: Node, env) -> None:
        from ..ir.interpreter import run_node

        args = [None if v is None else self._value(v, env) for v in node.inputs]
        outs = run_node(node, args, env)
        for v, a in zip(node.outputs, outs):
            env[id(v)] = a

    def _frame(self, seg):
        """This thread's state for calling `seg` (concurrent calls never share it; it lives on
        `seg`, so an evicted specialisation's arenas go with it)."""
        frame = getattr(seg.frames, "frame", None)
        if frame is None:
            frame = seg.frames.frame = seg.frame()
        return frame

    def _compiled(self, step: Segment, shapes: tuple, values: tuple = (),
                  progress: Progress | None = None, exact: bool = False):
        """The specialisation of `step` to `shapes` (and `values`), compiled on first use
        (unless not `exact` and another batch size's code can run it: a `BatchSplit`); its
        compile is a step of `progress` (warm-up), else a progress line."""
        key = (step.index, shapes, values)
        seg = self._cache.get(key)
        if seg is not None:
            try:
                self._cache.move_to_end(key)
            except KeyError:   # evicted by another thread meanwhile: `seg` still works
                pass
            return seg
        if not exact and self.batch_split:
            split = self._split(step, shapes, values)
            if split is not None:
                return split
        with self._lock:
            seg = self._cache.get(key)
            if seg is None:
                start = time.perf_counter()
                groups = segment_groups(step, self.graph.groups)
                message = (f"compiling segment {step.index}: {len(groups)} kernel(s) of "
                           f"{len(step.nodes)} node(s) for {self.describe_machine()}")
                if progress is not None:
                    progress.step(message)
                elif self.progress:
                    log.info(message)
                program = build_program(step, shapes, values, groups, self.schedule,
                                        self.reuse_memory)
                self.plan_seconds += program.plan_seconds
                seg = self.compile_segment(program)
                self._cache[key] = seg
                self._evict(step.index)
                seconds = time.perf_counter() - start
                self.compile_seconds += seconds
                log.debug("segment %d, shapes %s: %d kernel(s) compiled in %.2f s",
                          step.index, shapes, len(program.kernels), seconds)
                if progress is not None:
                    progress.done(len(step.nodes))
        return seg

    def _split(self, step: Segment, shapes: tuple, values: tuple) -> "BatchSplit | None":
        """A `BatchSplit` running `step` at `shapes` on the code of another batch size: the
        one doing the least work (padding included), the larger on a tie; None where the
        segment is not batch-separable or no code of the same item shape exists. Counts the
        key's uses and starts its background compile at `specialize_after`."""
        key = (step.index, shapes, values)
        split = self._splits.get(key)
        if split is None:
            split = self._new_split(step, shapes, values)
            if split is None:
                return None
            self._splits[key] = split
            while len(self._splits) > MAX_SPLITS:
                try:
                    self._splits.popitem(last=False)
                except KeyError:   # emptied by another thread meanwhile
                    break
        split.uses += 1
        self.split_calls += 1
        if self.specialize_after is not None and split.uses >= self.specialize_after and \
                self._specialising is None and key not in self._unspecialisable:
            self._specialise_in_background(step, shapes, values)
        return split

    def _new_split(self, step: Segment, shapes: tuple, values: tuple) -> "BatchSplit | None":
        if step.index not in self._batch_symbols:
            self._batch_symbols[step.index] = batch_symbol(step.nodes, step.inputs,
                                                           step.escaping)
        symbol = self._batch_symbols[step.index]
        if symbol is None:
            return None
        carried = [i for i, v in enumerate(step.inputs)
                   if v.const is None and v.type.rank and v.type.shape[0] == symbol]
        sizes = {shapes[i][0] for i in carried if len(shapes[i]) == step.inputs[i].type.rank}
        if not carried or len(sizes) != 1:
            return None
        n = sizes.pop()
        best = None
        for (index, base_shapes, base_values), seg in list(self._cache.items()):
            if index != step.index or base_values != values:
                continue
            b = base_shapes[carried[0]][0]
            if b < 1 or any(base_shapes[i] != ((b,) + tuple(shapes[i][1:]) if i in carried
                                               else shapes[i]) for i in range(len(shapes))):
                continue
            cost = (-(-n // b) * b, -b)   # items computed, then calls
            if best is None or cost < best[0]:
                best = (cost, seg, b)
        if best is None:
            return None
        return BatchSplit(best[1], best[2], carried)

    def _specialise_in_background(self, step: Segment, shapes: tuple, values: tuple) -> None:
        """Compile `step` for `shapes` in a daemon thread; calls go on being split until the
        code is in the cache (a failed compile leaves the split in place for good)."""
        key = (step.index, shapes, values)
        self._specialising = key

        def work():
            try:
                self._compiled(step, shapes, values, exact=True)
            except Exception as exc:   # noqa: BLE001 - the split keeps working; say why
                self._unspecialisable.add(key)
                log.warning("segment %d: no code of its own for shapes %s (%s); calls keep "
                            "running on another batch size's code", step.index, shapes, exc)
            finally:
                self._splits.pop(key, None)
                self._specialising = None

        threading.Thread(target=work, name="dnnc-specialise", daemon=True).start()

    def wait_for_specialisation(self, timeout: float | None = None) -> bool:
        """Wait until no background compile is running; whether none is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._specialising is not None:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _evict(self, index: int) -> None:
        """Drop segment `index`'s least recently used specialisations beyond `cache_size`
        (a call running one keeps it alive until it returns)."""
        keys = [k for k in list(self._cache) if k[0] == index]   # list(): one atomic copy
        for key in keys[:max(0, len(keys) - self.cache_size)]:
            del self._cache[key]
            self.evictions += 1

    def _after_fork_in_child(self) -> None:
        """The forking thread is the child's only one: a lock another thread held at fork
        time would never be released (a child needing a new shape would hang), and a
        background compile the parent ran does not run here."""
        self._lock = threading.Lock()
        self._specialising = None

    # -- introspection -------------------------------------------------------------------------

    def compiled_segments(self) -> list:
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
        bytes live at once), and `workspace_bytes`: the part of `arena_bytes` that holds
        kernels' workspace past the planned values (llvm); empty when no specialisation was
        planned in this process (all restored from an artifact)."""
        planned = [s for s in list(self._cache.values()) if s.memory is not None]
        if not planned:
            return {}
        plans = [s.memory for s in planned]
        return {"naive_bytes": sum(p.naive_bytes for p in plans),
                "live_lower_bound_bytes": sum(p.live_lower_bound_bytes for p in plans),
                "inplace_kernels": sum(len(p.inplace) for p in plans),
                "workspace_bytes": sum(s.arena_workspace_bytes for s in planned)}


def image_consts(step: Segment, image) -> list[np.ndarray]:
    """The constants a stored specialisation (a target's segment image: `shapes`,
    `escaping_types`, `consts` as (node, input position), `n_inputs`, `slots`) reads, after
    checking that it fits the segment: counts, ranks and fixed dims of its shapes, its
    outputs' dtypes, and that each constant slot names a constant (an `ArtifactError`
    otherwise)."""
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
