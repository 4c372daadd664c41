"""LLVM in this process: initialized once, one lock held around all LLVM work, and fork
safety. LLVM's internal mutexes (symbol tables, MCJIT) must not be held by another thread at
fork time, or the child deadlocks inside LLVM: so a fork waits for an LLVM compilation in
progress to end, and the child starts with the lock free, then runs the resets registered here
(the worker pool's first, then every live object's `_after_fork_in_child`). It must never
compile anything itself or know what the objects it resets are."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Callable

import llvmlite.binding as llvm

_lock = threading.RLock()
_initialized = False


def initialize() -> None:
    global _initialized
    with _lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _initialized = True


def llvm_lock() -> threading.RLock:
    """The lock to hold around LLVM work that may take LLVM's own locks (see fork safety)."""
    return _lock


# Fork safety. `_lock` is held around every LLVM compilation in this process (JITModule,
# object loading, the pool's own). Process-wide state (the worker pool) registers a reset
# through `on_fork_in_child`, other dnnc objects with locks through `at_fork_in_child`.
_process_resets: list[Callable[[], None]] = []
_child_resets: "weakref.WeakSet" = weakref.WeakSet()


def on_fork_in_child(reset: Callable[[], None]) -> None:
    """Call `reset()` in every forked child, before the objects' resets."""
    _process_resets.append(reset)


def at_fork_in_child(obj) -> None:
    """Call `obj._after_fork_in_child()` in every forked child while `obj` lives."""
    _child_resets.add(obj)


def _before_fork() -> None:
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()
    for reset in _process_resets:
        reset()
    for obj in list(_child_resets):
        obj._after_fork_in_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
