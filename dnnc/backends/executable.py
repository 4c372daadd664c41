"""Runs a compiled graph: `Executable`, the runtime every compiled target's runtime extends.

It runs the steps in order (host steps through the NumPy reference), keeps the compiled
specialisations of each segment in a bounded LRU cache (`specialisations.Specialisations`: a
dynamic batch compiles once per batch size seen, `cache_size` per segment), compiles every
segment ahead of the first call when the inputs' shapes are static (`start`), runs a batch
size it has no code for on another size's code where the target allows it
(`batch_split.BatchSplits`, which also compiles such a size in the background), re-plans once
when a node specialised on run-time parameters turns out to have no loop form, profiles each
kernel, and gives a small model's repeated calls a fast path (`fast_call`). Thread-safe (a
frame per calling thread and segment) and fork-safe (`_after_fork_in_child`).

Building each specialisation's `Program` is `plan.ProgramBuilder`'s; rendering and binding it
is the target's (`contract.TargetHooks`). Constructing a runtime only stores things: nothing
compiles before `start()`. It must never render code or know a target.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from functools import partial

import numpy as np

from ..errors import CompileError, IndexRangeError, InputError
from ..ir import loop as L
from ..ir.graph import Graph, Node, Value
from ..ir.segments import HostStep, Segment, describe, plan_steps, steps_from
from ..levels import DEFAULT_OPT_LEVEL, levels
from ..progress import Progress
from .batch_split import SPECIALIZE_AFTER, BatchSplit, BatchSplits
from .contract import CompiledSegment, TargetHooks
from .lower import Kernel
from .plan import HostAfterAll, ProgramBuilder, in_place_outputs, segment_groups
from .specialisations import DEFAULT_CACHE_SIZE, Specialisations

log = logging.getLogger(__name__)


def index_error(step: Segment, record) -> InputError | None:
    """The `InputError` a call's error record (`loop.index_checks`: int64[3], written by the
    segment's kernels) holds, naming the node as the reference's check does, with the record
    zeroed for the next call; None when the call met no out-of-range index."""
    found = L.index_checks.recorded(record)
    if found is None:
        return None
    record[:] = 0
    site, index, size = found
    node = step.nodes[site] if 0 <= site < len(step.nodes) else None
    where = f"{node.op} node {node.name!r}" if node is not None else f"segment {step.index}"
    return InputError(f"{where}: {IndexRangeError(index, size)}")


def write_aliases(graph: Graph, inputs: list, outs: list, same_array=None,
                  write_into=None) -> list:
    """`outs` with each output the graph writes into an input (`Graph.aliases`) written
    there and returned as that input's array: copied where it was computed apart (a host
    step, an input copied to be contiguous), nothing where its kernel wrote it in place
    (`plan.in_place_outputs`). `same_array(a, b)`: whether two arrays are the same memory;
    `write_into(target, value)`: the copy (defaults: host arrays)."""
    same_array = same_array or same_host_array
    write_into = write_into or write_host_array
    for k, i in graph.aliases.items():
        if not same_array(outs[k], inputs[i]):
            write_into(inputs[i], outs[k])
        outs[k] = inputs[i]
    return outs


def same_host_array(a, b) -> bool:
    """Whether host arrays `a` and `b` are the same memory, laid out alike."""
    return a is b or (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and
                      a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and
                      a.shape == b.shape and a.strides == b.strides)


def write_host_array(target, value) -> None:
    """Write `value` into the caller's host array `target`."""
    try:
        np.copyto(target, value)
    except ValueError as exc:   # read-only
        raise InputError(f"the model writes an input it was given read-only: {exc}") from None


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


class Executable(TargetHooks):
    """Runs a graph as compiled segments and host steps; thread-safe and fork-safe.

    A target's runtime extends it and implements `TargetHooks` (`compile_segment` returns a
    `contract.CompiledSegment`). Constructing one stores its arguments; `start()` compiles
    what can be compiled ahead of the first call.

    `cache_size` bounds the specialisations kept per segment (one per input shapes seen):
    beyond it the least recently used one is dropped (`evictions` counts them) and compiles
    again if its shapes come back."""

    def __init__(self, graph: Graph, opt_level: int = DEFAULT_OPT_LEVEL,
                 progress: bool | None = None, plan: list[dict] | None = None,
                 reuse_memory: bool | None = None, warm_up: bool = True,
                 cache_size: int = DEFAULT_CACHE_SIZE,
                 tuned: dict | None = None, specialize_after: int | None = SPECIALIZE_AFTER):
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise CompileError(f"cache_size must be a positive integer (specialisations kept "
                               f"per segment), not {cache_size!r}")
        self.graph = graph
        self.opt_level = opt_level
        # `opt_level` stays as given (artifacts record it); what it decides here is reuse
        reuse_memory = levels(opt_level).reuse_memory if reuse_memory is None else reuse_memory
        self.builder = ProgramBuilder(self.schedule_kernel, reuse_memory, tuned)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._forced_host: frozenset = frozenset()
        self.steps = plan_steps(graph) if plan is None else steps_from(graph, plan)
        self._cache = Specialisations(cache_size)
        self._lock = threading.Lock()
        self.compile_seconds = 0.0
        self._warm = warm_up and plan is None and all(v.type.is_static for v in graph.inputs)
        # batch sizes run on another size's code, and their background compiles
        self.splits = BatchSplits(specialize_after)

    def start(self) -> "Executable":
        """Compile every segment now when the inputs' shapes are static (a runtime factory
        calls it once the runtime is constructed); returns the runtime."""
        if self._warm:
            self._warm_up()
        return self

    # -- what the builder and the batch splits count, read as the runtime's ----------------

    @property
    def tuned(self) -> dict:
        """Task key -> the config its kernels take (`ProgramBuilder.tuned`)."""
        return self.builder.tuned

    @property
    def tuned_kernels(self) -> int:
        return self.builder.tuned_kernels

    @property
    def reuse_memory(self) -> bool:
        return self.builder.reuse_memory

    @property
    def plan_seconds(self) -> float:
        return self.builder.plan_seconds

    @property
    def split_calls(self) -> int:
        return self.splits.calls

    @property
    def specialize_after(self) -> int | None:
        return self.splits.specialize_after

    @specialize_after.setter
    def specialize_after(self, calls: int | None) -> None:
        self.splits.specialize_after = calls

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
        compiled = self._cache.kernel_counts()
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
        # the bar's steps: each kernel as it is lowered and scheduled, then each segment's
        # machine code (`_compiled`), so a one-segment model moves kernel by kernel
        segments = [s for s in self.steps if isinstance(s, Segment)]
        total = sum(len(segment_groups(s, self.graph.groups)) + 1 for s in segments)
        with Progress(total, self.progress) as progress:
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
                return self.write_aliases(inputs, self._run(inputs))
            except HostAfterAll as exc:
                # a node specialised on run-time parameters still has no loop form for them:
                # it runs on the host from now on (one re-plan, then cached as usual)
                with self._lock:
                    self._forced_host = self._forced_host | {id(exc.node)}
                    self.steps = plan_steps(self.graph, self._forced_host)
                    self._cache.clear()
                    self.splits.clear()   # both keyed by the old steps' indices

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

    def write_aliases(self, inputs: list, outs: list) -> list:
        """`write_aliases` with this target's arrays (`same_array`, `write_into`)."""
        return write_aliases(self.graph, inputs, outs, self.same_array, self.write_into)

    def same_array(self, a, b) -> bool:
        """Whether the arrays are the same memory (a target of device arrays overrides)."""
        return same_host_array(a, b)

    def write_into(self, target, value) -> None:
        """Write `value` into the caller's input array `target`."""
        write_host_array(target, value)

    def fast_call(self, inputs: list[np.ndarray], checked: bool = True):
        """A function that runs calls whose arguments are C-contiguous NumPy arrays of exactly
        these inputs' shapes and dtypes with the least Python between the caller and the
        kernels, returning the outputs, or None for any other arguments; None where the model
        is not one segment compiled for exactly these shapes (a host step, value inputs, a
        batch split) or the target's segments have no `fast`. `CompiledModel.run` keeps one
        for the last shapes it ran: a small model's call costs ~10 us instead of ~30.
        Without `checked` the arguments are not looked at: the caller vouches for each
        call's (`CompiledModel.bound_call`), and the specialisation is kept alive by the
        function, used or evicted."""
        one = self.one_segment(inputs)
        if one is None:
            return None
        key, seg, positions, returned = one
        run = seg.fast(positions, returned, [(a.shape, a.dtype) for a in inputs], checked)
        if run is None:
            return None
        cache, aliases = self._cache, self.graph.aliases
        if not checked:
            if not aliases:
                return run

            def unchecked(args) -> list[np.ndarray]:
                return self.write_aliases(args, run(args))

            return unchecked

        def call(args) -> list[np.ndarray] | None:
            try:
                cache.move_to_end(key)   # a use, as `_compiled` counts one
            except KeyError:   # evicted: the plain path compiles it again, as it would have
                return None
            outs = run(args)
            return self.write_aliases(args, outs) if aliases and outs is not None else outs

        return call

    def one_segment(self, inputs: list) -> tuple | None:
        """For a model that is one segment taking the model's inputs as they are and
        returning its outputs (no host step, no value inputs), compiled for the shapes of
        `inputs`: (its cache key, the specialisation, the argument position of each of its
        inputs (None: a constant), the escaping position of each model output); else None."""
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
        seg = self._cache.get(key)
        if seg is None:
            return None
        return (key, seg, [position.get(id(v)) for v in step.inputs],
                [escaping[id(v)] for v in self.graph.outputs])

    def _segment_call(self, step: Segment, env, exact: bool = False
                      ) -> tuple[CompiledSegment | BatchSplit, list]:
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

    def _frame(self, seg: CompiledSegment | BatchSplit):
        """This thread's state for calling `seg` (concurrent calls never share it; it lives on
        `seg`, so an evicted specialisation's arenas go with it)."""
        frame = getattr(seg.frames, "frame", None)
        if frame is None:
            frame = seg.frames.frame = seg.frame()
        return frame

    def _compiled(self, step: Segment, shapes: tuple, values: tuple = (),
                  progress: Progress | None = None, exact: bool = False
                  ) -> CompiledSegment | BatchSplit:
        """The specialisation of `step` to `shapes` (and `values`), compiled on first use
        (unless not `exact` and another batch size's code can run it: a `BatchSplit`); its
        compile is a step of `progress` (warm-up), else a progress line."""
        key = (step.index, shapes, values)
        seg = self._cache.use(key)
        if seg is not None:
            return seg
        if not exact and self.batch_split:
            split = self.splits.split(step, shapes, values, self._cache, self._compile_exact)
            if split is not None:
                return split
        with self._lock:
            seg = self._cache.get(key)
            if seg is None:
                start = time.perf_counter()
                groups = segment_groups(step, self.graph.groups)
                message = (f"compiling segment {step.index}: {len(groups)} kernel(s) of "
                           f"{len(step.nodes)} node(s) for {self.describe_machine()}")
                scheduled = None
                if progress is not None:
                    progress.step(message)
                    scheduled = partial(_kernel_done, progress, step.index, len(groups))
                elif self.progress:
                    log.info(message)
                program = self.builder.build(step, shapes, values, groups, scheduled,
                                             in_place_outputs(self.graph, step))
                if progress is not None:
                    progress.step(f"segment {step.index}: machine code of {len(groups)} "
                                  f"kernel(s) for {self.describe_machine()}", detail=True)
                seg = self.compile_segment(program)
                self._cache.add(key, seg)
                seconds = time.perf_counter() - start
                self.compile_seconds += seconds
                log.debug("segment %d, shapes %s: %d kernel(s) compiled in %.2f s",
                          step.index, shapes, len(program.kernels), seconds)
                if progress is not None:
                    progress.done()
        return seg

    def _compile_exact(self, step: Segment, shapes: tuple, values: tuple) -> CompiledSegment:
        """The specialisation's own code (a background compile's work)."""
        return self._compiled(step, shapes, values, exact=True)

    def wait_for_specialisation(self, timeout: float | None = None) -> bool:
        """Wait until no background compile is running; whether none is."""
        return self.splits.wait(timeout)

    def _after_fork_in_child(self) -> None:
        """The forking thread is the child's only one: a lock another thread held at fork
        time would never be released (a child needing a new shape would hang), and a
        background compile the parent ran does not run here."""
        self._lock = threading.Lock()
        self.splits.after_fork_in_child()

    # -- introspection -------------------------------------------------------------------------

    def compiled_segments(self) -> list[CompiledSegment]:
        return list(self._cache.values())

    def images(self) -> list:
        """Every specialisation compiled so far as data an artifact can store (each compiled
        segment's `image()`), taking the lock one segment at a time: a compile waits for one
        image, and a segment evicted meanwhile is skipped (its code may be freed)."""
        with self._lock:
            segments = list(self._cache.values())
        images = []
        for seg in segments:
            with self._lock:
                if any(s is seg for s in self._cache.values()):
                    images.append(seg.image())
        return images

    @property
    def evictions(self) -> int:
        """Specialisations dropped beyond `cache_size` per segment."""
        return self._cache.evictions

    @property
    def arena_bytes(self) -> int:
        """Arena bytes a calling thread holds (`Specialisations.arena_bytes`)."""
        return self._cache.arena_bytes

    @property
    def memory_stats(self) -> dict[str, int]:
        """`plan_memory`'s figures over every specialisation
        (`Specialisations.memory_stats`)."""
        return self._cache.memory_stats


def _kernel_done(progress: Progress, segment: int, kernels: int, k: int, kernel: Kernel) -> None:
    """A kernel of a segment being compiled is lowered and scheduled: a step of `progress`."""
    progress.step(f"segment {segment}: kernel {k + 1}/{kernels} ({kernel.name})", detail=True)
    progress.done()
