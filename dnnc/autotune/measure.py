"""Measuring candidate configs safely: each in a worker process of its own with a time limit.

A candidate is built (the target's `build`), compiled and called on seeded random inputs in a
child process; its outputs are checked against the default config's (computed the same way),
then it is timed: calls are batched until a batch lasts at least `min_batch_seconds`, and the
median over `repeat` batches gives the milliseconds of one call. A candidate that fails to
build or compile, crashes the process (a signal), runs past `timeout` seconds or computes
another result is a `Result` with an error: the tuner records it and goes on, and nothing
already measured is lost.

The worker is forked from the tuner, or started as the target's hooks say (`START_METHOD`:
the cuda target's workers come from a fork server, since a CUDA context does not survive a
fork). A compiled candidate may bring its own timer (`call.time_ms(repeat, min_seconds)`:
CUDA events on a GPU) and a way to bring its outputs back to the arrays (`call.fetch()`).
"""

from __future__ import annotations

import faulthandler
import importlib
import multiprocessing
import time
from dataclasses import dataclass

import numpy as np

from ..backends.lower import Kernel
from ..backends.registry import REGISTRY
from ..ir import types as T
from ..ir.target import Target

# relative and absolute tolerance of a candidate's outputs against the default config's: the
# configs of one template reorder float sums (lanes, blocks, k slices), never more
RTOL, ATOL = 1e-3, 1e-4
# float16 and bfloat16 outputs round those sums once more, to their own last place: two
# configs may differ by one unit there (2**-10 and 2**-7 of the value), so by two units
HALF_RTOL = {np.dtype(np.float16): 2.0 ** -9, np.dtype(T.bfloat16.np): 2.0 ** -6}


@dataclass
class Result:
    config: object
    ms: float | None = None
    error: str | None = None
    outputs: list | None = None   # the default config's, kept as the reference


def _close(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where a candidate's output agrees with the default config's (RTOL, ATOL; HALF_RTOL
    for 16-bit floats, compared as float64)."""
    rtol = HALF_RTOL.get(np.dtype(want.dtype), RTOL)
    if np.dtype(want.dtype) in HALF_RTOL:
        got, want = got.astype(np.float64), want.astype(np.float64)
    return np.isclose(got, want, rtol=rtol, atol=ATOL, equal_nan=False)


def agree(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether a candidate's output agrees with the default config's everywhere."""
    return bool(_close(got, want).all())


def random_arrays(kernel: Kernel, seed: int) -> list[np.ndarray]:
    """The kernel's inputs (constants as they are, the rest random, never zeros) and outputs
    (filled with NaN, so an element a config forgets to write fails the check)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for v in kernel.inputs:
        if v.const is not None:
            arrays.append(np.ascontiguousarray(v.const))
            continue
        shape, dtype = v.type.shape, v.type.dtype.np
        if v.type.dtype.is_float:   # (bfloat16 too, which NumPy does not call floating)
            a = rng.standard_normal(shape)
        elif dtype == np.bool_:
            a = rng.integers(0, 2, shape)
        else:
            a = rng.integers(1, 8, shape)
        arrays.append(np.ascontiguousarray(a.astype(dtype)))
    for v in kernel.outputs:
        out = np.empty(v.type.shape, v.type.dtype.np)
        if v.type.dtype.is_float:
            out.fill(np.nan)
        arrays.append(out)
    return arrays


def measure(hooks, kernel: Kernel, target: Target, configs: list, *, reference=None,
            seed: int = 0, repeat: int = 5, min_batch_seconds: float = 0.01,
            timeout: float = 60.0, timed: bool = True, start_method: str | None = None
            ) -> list[Result]:
    """Each config of `configs` measured in its own worker process (`hooks`: the target's
    `build` and `compile_kernel`); `reference` is the default config's outputs (a list of
    arrays), or None to skip the check and return the outputs instead (the default config
    itself). Without `timed`, a config is only run (its outputs, no time). `start_method`
    (multiprocessing's) overrides the hooks' `START_METHOD` (default "fork")."""
    method = start_method or getattr(hooks, "START_METHOD", "fork")
    context = multiprocessing.get_context(method)
    if method == "forkserver":   # the server imports the hooks' module once
        context.set_forkserver_preload([hooks.__name__])
    if method != "fork":   # the worker imports the hooks' module (a module does not pickle)
        hooks = hooks.__name__
    out = []
    for config in configs:
        parent, child = context.Pipe(duplex=False)
        proc = context.Process(target=_worker, daemon=True,
                               args=(child, hooks, kernel, target, config, reference, seed,
                                     repeat, min_batch_seconds, reference is None, timed))
        proc.start()
        child.close()
        message, closed = None, False
        if parent.poll(timeout):
            try:
                message = parent.recv()
            except EOFError:   # the worker died before it answered
                closed = True
        if message is None:
            if closed:
                proc.join(timeout=10)   # a dying process: let it finish and say how
            if proc.is_alive():
                proc.kill()
                proc.join()
                message = {"error": f"timed out after {timeout:g} s"}
            else:
                code = proc.exitcode
                message = {"error": f"the worker died (signal {-code})" if code and code < 0
                           else f"the worker exited with status {code}"}
        else:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        parent.close()
        out.append(Result(config, message.get("ms"), message.get("error"),
                          message.get("outputs")))
    return out


def _worker(conn, hooks, kernel, target, config, reference, seed, repeat, min_batch,
            keep_outputs, timed):
    faulthandler.disable()   # a crashing candidate is a result, not a traceback on stderr
    try:
        if isinstance(hooks, str):
            hooks = importlib.import_module(hooks)
        arrays = random_arrays(kernel, seed)
        func = hooks.build(kernel, target, config)
        call = hooks.compile_kernel(func, arrays, target)
        call()
        if hasattr(call, "fetch"):
            call.fetch()
        outputs = arrays[len(kernel.inputs):]
        if reference is not None:
            for k, (got, want) in enumerate(zip(outputs, reference)):
                if not agree(got, want):
                    bad = ~_close(got, want)
                    conn.send({"error": f"wrong result: output {k} differs from the default "
                                        f"config's at {int(bad.sum())} of {bad.size} elements"})
                    return
        timer = getattr(call, "time_ms", None) or (lambda r, m: _time(call, r, m))
        conn.send({"ms": timer(repeat, min_batch) if timed else None,
                   "outputs": [o.copy() for o in outputs] if keep_outputs else None})
    except Exception as exc:   # a config that fails to build or compile: its error, recorded
        conn.send({"error": f"{type(exc).__name__}: {exc}"[:500]})
    finally:
        conn.close()


def _time(call, repeat: int, min_batch: float) -> float:
    """Median milliseconds of one call over `repeat` batches of at least `min_batch` s."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            call()
        elapsed = time.perf_counter() - start
        if elapsed >= min_batch or n >= 1 << 20:
            break
        n *= 2
    samples = [elapsed / n]
    for _ in range(repeat - 1):
        start = time.perf_counter()
        for _ in range(n):
            call()
        samples.append((time.perf_counter() - start) / n)
    return float(np.median(samples)) * 1e3


def measure_on(client, target_name: str, kernel: Kernel, target: Target, configs: list, *,
               reference=None, seed: int = 0, timeout: float = 60.0) -> list[Result]:
    """`measure` on a Dask cluster (`client`: a `distributed.Client`): one cluster task per
    config, each measured in a worker process of its own on a worker whose machine is
    `target`'s (a worker of another CPU refuses: results from unlike machines never mix).
    The workers must not be daemonic (`distributed.worker.daemon: False`), since each forks
    its measurement."""
    futures = [client.submit(_measure_remote, target_name, kernel, target, config, reference,
                             seed, timeout, pure=False) for config in configs]
    out = []
    for config, future in zip(configs, futures):
        try:
            out.append(future.result(timeout=timeout + 60))
        except Exception as exc:   # a worker lost, a timeout: this candidate's error
            future.cancel()
            out.append(Result(config, error=f"cluster: {type(exc).__name__}: {exc}"[:500]))
    return out


def _measure_remote(target_name, kernel, target, config, reference, seed, timeout):
    spec = REGISTRY[target_name]
    here = spec.target()
    if here.key != target.key:
        return Result(config, error=f"the worker's machine is {here.key}, not {target.key}")
    return measure(spec.tuning(), kernel, target, [config], reference=reference, seed=seed,
                   timeout=timeout)[0]
