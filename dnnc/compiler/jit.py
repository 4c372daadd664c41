"""`dnnc.jit`: a traced NumPy function compiled on its first call per input signature.

Tracing is the frontend's (`frontend/trace.py`); this module only keys compiled models by the
arguments' shapes and dtypes (and other arguments' values) and calls them.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import numpy as np

from ..backends.registry import default_target
from ..errors import ArgumentError, TraceError
from ..frontend.trace import is_array_arg, trace_graph
from . import driver


class JitFunction:
    """`fn` compiled per input signature (argument shapes and dtypes, other arguments' values).

    `compiled` maps each signature to its CompiledModel; `compiles` counts compilations."""

    def __init__(self, fn: Callable, target: str, compile_options: dict):
        self.fn = fn
        self.target = target
        self.compile_options = compile_options
        self.compiled: dict[tuple, Any] = {}
        self.compiles = 0
        functools.update_wrapper(self, fn)

    def signature(self, args) -> tuple:
        key = []
        for a in args:
            if is_array_arg(a):
                key.append(("array", tuple(np.shape(a)), np.dtype(a.dtype).str))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TraceError(f"jit: argument of type {type(a).__name__} is neither an "
                                     f"array nor hashable") from None
                key.append(("static", type(a), a))
        return tuple(key)

    def __call__(self, *args):
        key = self.signature(args)
        entry = self.compiled.get(key)
        if entry is None:
            graph, returns_tuple = trace_graph(self.fn, args)
            entry = (driver.compile(graph, self.target, **self.compile_options), returns_tuple)
            self.compiled[key] = entry
            self.compiles += 1
        model, returns_tuple = entry
        outs = model.run(*[a for a in args if is_array_arg(a)])
        return tuple(outs) if returns_tuple else outs[0]


def jit(fn: Callable | None = None, *, target: str | None = None, **compile_options):
    """Decorator: trace and compile `fn` on the first call per input signature, then reuse.

    `@dnnc.jit` or `@dnnc.jit(target="numpy", opt_level=2)`; options go to `dnnc.compile`
    and are checked here, when decorating, not at the first call. `target` defaults to the
    host's (see backends/registry.py)."""
    options = set(inspect.signature(driver.check_options).parameters) - {"target"}
    unknown = sorted(set(compile_options) - options)
    if unknown:
        raise ArgumentError(f"dnnc.jit takes the compile options {', '.join(sorted(options))}, "
                            f"not {', '.join(unknown)}")
    target = default_target() if target is None else target
    driver.check_options(target, **compile_options)
    if fn is None:
        return lambda f: JitFunction(_callable(f), target, compile_options)
    return JitFunction(_callable(fn), target, compile_options)


def _callable(fn):
    if not callable(fn):
        raise ArgumentError(f"dnnc.jit decorates a function, not {type(fn).__name__}")
    return fn
