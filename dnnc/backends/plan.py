"""The one compile path every compiled target shares: graph -> segments -> kernels -> plan.

    graph (after the passes; `Graph.groups` from fuse_ops)
      -> steps (`ir.segments`): segments of nodes with a loop form, host fallbacks between
      -> per segment and input shapes seen, a `Program`: the segment's nodes specialised to
         the shapes (`ir.reinfer`), one kernel per fusion group (`lower_group`, then the
         target's template with the best-ranked config a tuning log has for its task that
         the template accepts: `ProgramBuilder.schedule`), identical kernels found by
         structural signature, constants and arena slots, the memory plan
         (`memory.plan_memory`) and the call order
      -> the target renders the program's kernels and binds the plan into something callable
         (`contract.TargetHooks.compile_segment`).

Running the programs (the cache of specialisations, background compiles, batch splitting,
fork safety, profiling) is `executable.Executable`'s job; this module builds and never runs.

Shapes: a segment is specialised to the concrete shapes of its inputs when it first meets
them; sizes that depend on data (after NonZero, say) are handled the same way, since a
segment after a fallback is specialised on the shapes the fallback actually produced.

Memory: values a segment produces for later steps are fresh arrays per call (outputs escape);
values used only inside a segment live in one arena per segment and thread, placed by
`plan_memory` over the kernels' order (an elementwise kernel may write over an input it is
the last reader of: that kernel must be rendered without `noalias`), so concurrent calls from
several threads are safe.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ArtifactError, CompileError, ConfigError, TuningLogWarning
from ..ir import loop as L
from ..ir import types as T
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import Pattern, get_op
from ..ir.reinfer import reinfer
from ..ir.segments import Segment, has_loop_form, plan_steps
from .lower import Kernel, NoCompute, lower_group
from .memory import MemoryPlan, Step, plan_memory


@dataclass
class Call:
    """One kernel call of a program: the kernel's function name (shared by identical
    kernels) and, per parameter, where its buffer is: ("ext", slot) or ("arena", offset)."""

    func: str
    args: list[tuple[str, int]]


@dataclass
class Program:
    """A segment specialised to concrete input shapes: everything a target renders and binds.

    Slots, in order: the segment's data inputs, its escaping outputs, its constants, and one
    past them (`slots`) the error record of the kernels that check indices
    (`loop.index_checks`), which each calling thread's frame holds; every other value lives
    in the arena at `memory.offsets`."""

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
    viewed: list[Kernel] = field(default_factory=list)   # copies done as views: never called
    # escaping position -> data input position: that output is computed over that input's
    # array, which the runtime binds as the output's slot (`in_place_outputs`)
    in_place: dict[int, int] = field(default_factory=dict)

    @property
    def slots(self) -> int:
        return self.n_inputs + len(self.escaping_types) + len(self.consts)

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes


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


def in_place_outputs(graph: Graph, step: Segment) -> dict[int, int]:
    """The outputs of `step` that its kernels compute straight into the input array the
    graph writes them into (`Graph.aliases`): escaping position -> data input position.
    Taken where the output is made in `step` by an op that may take that input's buffer
    (`OpDef.in_place`: it reads each element only for the output element at its index; an
    elementwise or broadcasting op, from an input of the output's type, as a counter's `+ 1`,
    where no other node of its kernel reads the output), from that very input, and every
    other node reading the input is in a kernel of `step` that runs before (its old value is
    then read by those kernels, and by that kernel element by element before it writes
    it: the positions gpt2's cache writes read from the counter that is then incremented).
    The runtime binds
    the output's slot to the input's array, and the kernel reads the input through its output
    (`build_program`); any other aliased output is computed apart and copied into its input
    after the call (`Executable.run`). A function of the graph alone: an artifact's restored
    code is bound as it was compiled."""
    if not graph.aliases:
        return {}
    users = graph.users()
    data = [v for v in step.inputs if v.const is None]
    escaping = {id(v): e for e, v in enumerate(step.escaping)}
    found = {}
    for k, i in graph.aliases.items():
        out, source = graph.outputs[k], graph.inputs[i]
        node = out.producer
        position = None if node is None else get_op(node.op).in_place
        if position is None and node is not None and _elementwise_update(
                graph, step, node, source, users):
            position = node.inputs.index(source)
        if position is None or node.inputs[position] is not source or \
                not _read_before(graph, step, node, source, users) or \
                id(out) not in escaping or all(v is not source for v in data) or \
                sum(1 for v in graph.outputs if v is out) != 1:
            continue
        found[escaping[id(out)]] = next(d for d, v in enumerate(data) if v is source)
    return found


def _read_before(graph: Graph, step: Segment, node: Node, source: Value, users: dict) -> bool:
    """Whether every node reading `source` but `node` is in a kernel of `step` that runs
    before `node`'s (kernels run in their order, each to its end)."""
    others = [n for n in users.get(source, ()) if n is not node]
    if not others:
        return True
    where = {id(n): k for k, n in enumerate(step.nodes)}
    if id(node) not in where or any(id(n) not in where for n in others):
        return False
    kernel = {k: g for g, group in enumerate(segment_groups(step, graph.groups))
              for k in group}
    mine = kernel[where[id(node)]]
    return all(kernel[where[id(n)]] < mine for n in others)


def _elementwise_update(graph: Graph, step: Segment, node: Node, source: Value,
                        users: dict) -> bool:
    """Whether `node` is an elementwise or broadcasting op that reads input `source`, of its
    output's type, once, and whose kernel reads its output nowhere else (an inlined read
    would load `source` at another element, maybe after it was written)."""
    if get_op(node.op).pattern not in (Pattern.ELEMWISE, Pattern.BROADCAST) or \
            len(node.outputs) != 1 or node.outputs[0].type != source.type or \
            sum(1 for v in node.inputs if v is source) != 1:
        return False
    where = {id(n): k for k, n in enumerate(step.nodes)}
    if id(node) not in where:
        return False
    group = next(g for g in segment_groups(step, graph.groups) if where[id(node)] in g)
    members = {id(step.nodes[k]) for k in group}
    return not any(id(n) in members for n in users.get(node.outputs[0], ()))


def _read_through_output(kernel: Kernel, source: Value, out: Value) -> None:
    """`kernel` reading parameter `source` through parameter `out`, which the runtime binds
    to the same array (`in_place_outputs`): the loads see the same bytes, and no two buffers
    the kernel touches overlap, so its parameters stay `noalias` / `__restrict__`."""
    params = kernel.func.params
    old = params[next(k for k, v in enumerate(kernel.inputs) if v is source)]
    new = params[len(kernel.inputs) + next(k for k, v in enumerate(kernel.outputs) if v is out)]
    body = L.transform(kernel.func.body, lambda n: L.Load(new, n.indices)
                       if isinstance(n, L.Load) and n.buffer == old else None)
    kernel.func = L.PrimFunc(kernel.func.name, params, body, kernel.func.size_vars,
                             kernel.func.attrs)


def build_program(step: Segment, shapes: tuple, key_values: tuple, groups: list[list[int]],
                  schedule: Callable[[Kernel], L.PrimFunc], reuse_memory: bool,
                  in_place: dict[int, int] | None = None) -> Program:
    """Specialise `step` to `shapes` (and the values of its value inputs), lower one kernel
    per group, schedule each with the target's `schedule`, and plan the memory. `in_place`
    (`in_place_outputs`): the outputs computed over their inputs' arrays."""
    in_place = in_place or {}
    nodes, values = _specialize(step, shapes, dict(key_values))
    escaping = [values[id(v)] for v in step.escaping]
    data = [values[id(v)] for v in step.inputs if v.const is None]
    over = {id(escaping[e]): data[d] for e, d in in_place.items()}
    escaping_ids = {id(v) for v in escaping}
    # value id -> the groups reading it (a group's earlier node's value read by another group:
    # a layernorm's before the DynamicRange fused after it, fuse_ops.take_ranges)
    readers: dict[int, set[int]] = {}
    for k, members in enumerate(groups):
        for i in members:
            for v in nodes[i].inputs:
                if v is not None:
                    readers.setdefault(id(v), set()).add(k)
    kernels = []
    for k, members in enumerate(groups):
        group = [nodes[i] for i in members]
        node = group[0]
        needed = list(group[-1].outputs) + \
            [v for n in group[:-1] for v in n.outputs
             if id(v) in escaping_ids or readers.get(id(v), set()) - {k}]
        try:
            kernel = lower_group(group, f"k{k}_{node.op}", outputs=needed, sites=members,
                                 in_place=frozenset(over))
        except NoCompute:
            for i in members:   # the node without a loop form runs on the host from now on
                if not has_loop_form(nodes[i]):
                    raise HostAfterAll(step.nodes[i]) from None
            raise
        if kernel.func.size_vars:
            raise CompileError(f"{node.op} node {node.name!r}: shapes still symbolic after "
                               f"specialisation: {kernel.func.size_vars}")
        kernel.func = L.index_checks.with_errors(schedule(kernel))
        for out in kernel.outputs:
            if id(out) in over:
                _read_through_output(kernel, over[id(out)], out)
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
    views, kept = {}, kernels
    if reuse_memory:
        kept, views = views_in_place(kernels, slot)
    called = {id(k) for k in kept}
    viewed = [k for k in kernels if id(k) not in called]
    kernels = kept
    memory = plan_memory(*_memory_steps(kernels, slot), reuse=reuse_memory, views=views)
    seconds = time.perf_counter() - start
    unique, calls = _calls(kernels, slot, memory)
    return Program(step, shapes, key_values, [v.type for v in escaping], kernels, unique,
                   calls, [v.const for v in consts], const_refs,
                   sum(1 for v in step.inputs if v.const is None), memory, seconds, viewed,
                   dict(in_place))


def views_in_place(kernels: list[Kernel], external: dict[int, int]
                   ) -> tuple[list[Kernel], dict[int, tuple[int, int]]]:
    """The kernels left once every copy that a place in the arena can do is done so, and the
    views that do it (`plan_memory`'s `views`: value -> (the value it lies in, byte offset)):

    - a Concat whose output is a contiguous run of its parts (every axis before the concat
      axis of size 1: batch 1 in NCHW) has its parts written straight into its output where
      their producers store them (squeezenet's fire modules, inception's branches, densenet's
      growing blocks). Each part must be an arena value that a kernel here writes (or a
      concat done in place, nesting), a part of no other concat, its place in the whole
      aligned as the arena aligns;
    - a kernel that only reinterprets its one input's bytes (Reshape, Squeeze, Unsqueeze,
      Flatten, Identity) makes its output a view of its input;
    - a Split whose outputs are contiguous runs of its input (every axis before the split
      axis of size 1: timm's unbind of q, k and v) makes each output a view of its input
      at its aligned offset.

    The value viewed must live in the arena (not a segment input or constant), and no output
    that becomes a view may escape the segment (outputs are arrays of their own)."""
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
    kernels, kept = kept, []
    for kernel in kernels:
        viewed = _viewed_outputs(kernel, external, views, ALIGN)
        if viewed is None:
            kept.append(kernel)
            continue
        source, parts = viewed
        for out, offset in parts:
            views[id(out)] = (id(source), offset)
    return kept, views


_REINTERPRETING = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def _viewed_outputs(kernel: Kernel, external: dict, views: dict, align: int):
    """(its one data input, [(output, byte offset in that input)]) when `kernel`'s outputs
    can all be views of that input (`views_in_place`), else None."""
    data = [v for v in kernel.inputs if v.const is None]   # shapes, axes: constants
    if len(data) != 1 or data[0] is not kernel.nodes[0].inputs[0]:
        return None
    source = data[0]
    dtype = source.type.dtype
    if id(source) in external or any(id(v) in external or id(v) in views or
                                     v.type.dtype != dtype for v in kernel.outputs):
        return None
    ops = [n.op for n in kernel.nodes]
    if all(op in _REINTERPRETING for op in ops) and len(kernel.outputs) == 1 and \
            kernel.outputs[0].type.numel == source.type.numel:
        return source, [(kernel.outputs[0], 0)]
    if ops != ["Split"] or list(kernel.outputs) != list(kernel.nodes[0].outputs):
        return None
    shape = source.type.shape
    axis = kernel.nodes[0].attrs.get("axis", 0) % len(shape)
    if any(d != 1 for d in shape[:axis]):
        return None
    viewed, offset = [], 0
    for out in kernel.outputs:
        if offset % align:
            return None
        viewed.append((out, offset))
        offset += out.type.numel * dtype.itemsize
    return source, viewed


def _in_place_parts(kernel: Kernel, written: set, external: dict, views: dict, align: int):
    """[(part, byte offset in the whole)] when `kernel` is a Concat that `views_in_place`
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
    errors = [("ext", len(slot))]   # the error record: one slot past the program's
    calls = [Call(kernel.func.name,
                  [("ext", slot[id(v)]) if id(v) in slot else ("arena", memory.offsets[id(v)])
                   for v in kernel.inputs + kernel.outputs] +
                  (errors if L.index_checks.INDEX_ERRORS in kernel.func.params else []))
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
    # the run-time index checks name their node; a task is the same wherever its node sits
    text = repr(params) + "\n" + str(L.PrimFunc("task", (), L.index_checks.strip(body)))
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


class ProgramBuilder:
    """Builds a segment's `Program` for given shapes the way one runtime compiles: each kernel
    scheduled by the target's `schedule_kernel`, with the best config a tuning log ranks for
    its task that its template accepts where `tuned` has any, and the memory planned with or
    without reuse. Counts what it did: `tuned_kernels` (the kernels, by name, that took a
    tuned config: a kernel scheduled again for another shape of its segment counts once, as
    `kernels` counts a segment's first specialisation), `plan_seconds`.

    `tuned` maps a task key to its configs best first (`autotune.records.ranked_configs`), or
    to one config (an artifact's `tuned`, the configs its compile applied)."""

    def __init__(self, schedule_kernel: Callable[..., L.PrimFunc], reuse_memory: bool,
                 tuned: dict | None = None):
        self.schedule_kernel = schedule_kernel
        self.reuse_memory = reuse_memory
        # task key -> the configs a tuning log ranks best first for it on this machine; those
        # its template refused are dropped once met
        self.ranked = {task: list(c) if isinstance(c, list) else [c]
                       for task, c in (tuned or {}).items()}
        self._tuned_names: set[str] = set()
        self.plan_seconds = 0.0

    @property
    def tuned_kernels(self) -> int:
        return len(self._tuned_names)

    @property
    def tuned(self) -> dict:
        """Task key -> the config its kernels take: the best-ranked its template accepted
        (what an artifact keeps)."""
        return {task: configs[0] for task, configs in self.ranked.items() if configs}

    def schedule(self, kernel: Kernel) -> L.PrimFunc:
        """The kernel's template with the best-ranked config of its task that the template
        accepts (a config the template refuses, one that breaks a constraint of its space:
        a `TuningLogWarning`, and the next-best is tried), else the template's default."""
        task = task_key(kernel.func) if self.ranked else None
        configs = self.ranked.get(task, [])
        refused = []
        for k, config in enumerate(configs):
            try:
                func = self.schedule_kernel(kernel, config)
            except ConfigError as exc:
                refused.append(exc)
                continue
            if refused:
                self.ranked[task] = configs[k:]
                warnings.warn(f"tuning log: {refused[0]}; the next-best record that its "
                              f"template accepts is used ({len(refused)} refused)",
                              TuningLogWarning, stacklevel=2)
            self._tuned_names.add(kernel.func.name)
            return func
        if refused:
            self.ranked[task] = []
            warnings.warn(f"tuning log: {refused[0]}; no record of the task's "
                          f"{len(refused)} is accepted: the default config is used",
                          TuningLogWarning, stacklevel=2)
        return self.schedule_kernel(kernel)

    def build(self, step: Segment, shapes: tuple, values: tuple, groups: list[list[int]],
              scheduled: Callable[[int, Kernel], None] | None = None,
              in_place: dict[int, int] | None = None) -> Program:
        """`step` specialised to `shapes` (and `values`), its kernels the `groups`;
        `scheduled(k, kernel)` is told as each kernel is lowered and scheduled (progress);
        `in_place` as `build_program` takes it."""
        schedule = self.schedule
        if scheduled is not None:
            count = iter(range(len(groups)))

            def schedule(kernel: Kernel) -> L.PrimFunc:
                func = self.schedule(kernel)
                scheduled(next(count), kernel)
                return func
        program = build_program(step, shapes, values, groups, schedule, self.reuse_memory,
                                in_place)
        self.plan_seconds += program.plan_seconds
        return program


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
