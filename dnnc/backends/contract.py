"""The contract between the shared runtime (`executable.Executable`) and a target: the hooks a
target's runtime supplies (`TargetHooks`) and what its compiled specialisation of a segment
offers the runtime (`CompiledSegment`). A target's classes declare both by subclassing them.
It must never hold runtime state, run anything, or name a target."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar

import numpy as np

from ..ir import loop as L
from ..ir import types as T
from ..ir.segments import Segment
from .lower import Kernel
from .memory import MemoryPlan
from .plan import Call, Program

# one call of a compiled segment on a model's call arguments (None: not these arguments)
FastCall = Callable[[list], "list[np.ndarray] | None"]


class CompiledSegment(ABC):
    """One segment specialised to concrete input shapes (and the values of its value inputs),
    compiled: what the shared runtime reads and calls. Its fields are taken from the
    `Program` it was built from (`_take_program`) or from an artifact's image of it
    (`_take_image`, which keeps no kernels, calls or memory plan)."""

    step: Segment
    shapes: tuple                          # the input shapes (the cache key, with key_values)
    key_values: tuple                      # ((input position, ints), ...) of value inputs
    escaping_types: list[T.TensorType]     # of the segment's outputs, in slot order
    kernels: list[Kernel]                  # in call order; empty when restored
    kernel_count: int                      # kernels a call (restored: as its image says)
    viewed: list[Kernel]                   # copies done as views (plan.views_in_place)
    const_refs: list[tuple[int, int]]      # where each constant is read: (node, input position)
    n_inputs: int                          # data inputs
    memory: MemoryPlan | None              # None when restored
    arena_bytes: int                       # one calling thread's arena
    # the part of `arena_bytes` past the planned values that kernels use as workspace (a
    # target that places workspace there sets it: the llvm target's packed A)
    arena_workspace_bytes: int
    calls: list[Call]                      # for `profile`: each kernel called on its own
    # escaping position -> data input position: the runtime binds that output's slot to the
    # input's array (`plan.in_place_outputs`)
    in_place: dict[int, int]
    frames: threading.local                # each calling thread's `frame()`, as `frames.frame`

    @abstractmethod
    def frame(self) -> Any:
        """What one calling thread needs to call this segment (its arena, slots, ...)."""

    @abstractmethod
    def run(self, arrays: list, frame: Any, outs: list | None = None) -> list:
        """The escaping outputs of the segment on `arrays` (its inputs, in order). A target
        whose runtime sets `batch_split` writes them into `outs` (contiguous host arrays of
        the outputs' shapes and dtypes) when given."""

    @abstractmethod
    def profile(self, arrays: list, frame: Any, repeat: int
                ) -> tuple[list, list[tuple[Kernel, float]]]:
        """The outputs, and each kernel's median milliseconds over `repeat` calls of that
        kernel alone, in call order."""

    def fast(self, positions: list, returned: list[int], signature: list[tuple],
             checked: bool = True) -> FastCall | None:
        """`run` as one closure over the model's call arguments (`Executable.fast_call`), or
        None where the target has no such path: `positions[i]` is the argument that is this
        segment's i-th input (None: a constant), `returned` the escaping values the model
        returns, in order, and `signature` the (shape, dtype) of each argument, which
        without `checked` each call's arguments have (C-order NumPy arrays): not checked."""
        return None

    def _take_program(self, program: Program) -> None:
        self.step = program.step
        self.shapes = program.shapes
        self.key_values = program.key_values
        self.escaping_types = program.escaping_types
        self.kernels = program.kernels
        self.kernel_count = len(program.kernels)
        self.viewed = program.viewed
        self.const_refs = program.const_refs
        self.n_inputs = program.n_inputs
        self.memory = program.memory
        self.arena_bytes = program.arena_bytes
        self.arena_workspace_bytes = 0
        self.calls = program.calls
        self.in_place = program.in_place

    def _take_image(self, step: Segment, image, in_place: dict[int, int]) -> None:
        """`in_place`: `plan.in_place_outputs` of the runtime's graph, as the code was built."""
        self.step = step
        self.shapes = image.shapes
        self.key_values = image.values
        self.escaping_types = list(image.escaping_types)
        self.kernels = []
        self.kernel_count = image.kernel_count   # (0 in an artifact older than the count)
        self.viewed = []
        self.const_refs = list(image.consts)
        self.n_inputs = image.n_inputs
        self.memory = None
        self.arena_bytes = image.arena_bytes
        self.arena_workspace_bytes = 0
        self.calls = []
        self.in_place = in_place


class TargetHooks(ABC):
    """What a target's runtime supplies to the shared runtime: how to schedule a kernel, how
    to compile a `Program` into a `CompiledSegment`, the machine's name, and whether its
    compiled segments run on slices along axis 0 (`batch_split.BatchSplit`)."""

    # whether compiled segments' `run(arrays, frame, outs)` writes into `outs`, so a batch
    # size with no code of its own runs on another's; False compiles every batch size met
    batch_split: ClassVar[bool] = False

    @abstractmethod
    def compile_segment(self, program: Program) -> CompiledSegment:
        """`program` rendered, compiled and bound: ready to `run`."""

    @abstractmethod
    def schedule_kernel(self, kernel: Kernel, config=None) -> L.PrimFunc:
        """The target's scheduled PrimFunc of a lowered kernel: its template built with
        `config` (a `ConfigError` when the template's space refuses it) or the template's
        default config."""

    @abstractmethod
    def describe_machine(self) -> str:
        """The machine, as the progress line names it."""
