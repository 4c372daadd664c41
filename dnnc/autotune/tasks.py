"""Tuning tasks: the distinct kernels of a model, as the shared compile path forms them.

A task is one lowered kernel (identical kernels, repeated layers, are one task: their
`backends.plan.task_key` is equal) with the template that schedules it on the target, its
problem, and how many kernels of the model it stands for. Tasks come from the same segments,
fusion groups and lowering that compiling uses (`backends/plan.py`), so a tuned config applies
to exactly the kernels it was measured on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.lower import Kernel
from ..backends.plan import build_program, segment_groups, task_key
from ..ir.graph import Graph
from ..ir.segments import Segment, plan_steps


@dataclass
class Task:
    key: str            # backends.plan.task_key of the lowered kernel
    kernel: Kernel      # lowered, unscheduled, with static shapes
    template: object    # backends.space.Template
    problem: object
    count: int = 1      # kernels of the model it stands for

    @property
    def name(self) -> str:
        """What a person recognises: the template and the first kernel's nodes."""
        nodes = [n.name for n in self.kernel.nodes]
        shown = ", ".join(nodes[:3]) + (", ..." if len(nodes) > 3 else "")
        return f"{self.template.name} [{shown}]"


def extract(graph: Graph, hooks, machine=None) -> list[Task]:
    """The tasks of `graph` (after the passes; its input shapes static), in first-seen order.
    `hooks.template_for(kernel, machine)` gives the target's (template, problem) on
    `machine` (the `Target` compiled for: its precision picks cuda's tensor-core templates;
    None: the target's defaults)."""
    if not all(v.type.is_static for v in graph.inputs):
        raise ValueError("tuning needs static input shapes (give --input-shape)")
    tasks: dict[str, Task] = {}

    def record(kernel: Kernel):
        key = task_key(kernel.func)
        if key in tasks:
            tasks[key].count += 1
        else:
            template, problem = hooks.template_for(kernel, machine)
            tasks[key] = Task(key, kernel, template, problem)
        return kernel.func   # scheduling is not needed to find the tasks

    for step in plan_steps(graph):
        if not isinstance(step, Segment) or step.value_inputs:
            continue
        shapes = tuple(v.type.shape for v in step.inputs)
        if not all(isinstance(d, int) for s in shapes for d in s):
            continue   # after a data-dependent host step: sizes known only at run time
        build_program(step, shapes, (), segment_groups(step, graph.groups), record,
                      reuse_memory=False)
    return list(tasks.values())
