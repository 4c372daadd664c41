"""CompiledModel: the callable a compile returns; checks its inputs and runs a target runtime.

Call-time checks raise `InputError` naming the input, what was expected and what was given;
symbolic dims are bound from the inputs and must agree across them. Inputs are NumPy arrays or
anything array-like, or GPU arrays (`__cuda_array_interface__`, or DLPack on a CUDA device),
which stay where they are: a GPU target reads them in place, a CPU target refuses them. A
call returns the kind of array its `to=` names, else the compile's `outputs` option, else the
target's default (its registry entry's `returns`: NumPy, or CuPy on cuda). `save` writes an
artifact (`dnnc/compiler/artifact.py`), `load` (`dnnc.load`) makes a CompiledModel of one.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from ..backends.registry import REGISTRY, source_kinds
from ..errors import ArgumentError, CompileError, InputError, OutOfMemoryError
from ..ir.graph import Graph
from ..ir.interpreter import shape_mismatch
from ..ir.types import TensorType, shape_text
from . import artifact
from . import cache as compile_cache
from .arguments import check_int, check_returns


class DeviceArray:
    """An array in GPU memory (anything with `__cuda_array_interface__`: CuPy, PyTorch,
    Numba), seen through that interface without copying: shape and dtype for the call-time
    checks, the interface itself for a GPU target's runtime, which reads its data in place.
    `view` is what has the interface when `obj` has none (a CuPy array over a DLPack-only
    `obj`'s memory), kept alive with it."""

    def __init__(self, obj, view=None, face=None):
        self.obj = obj
        self.view = obj if view is None else view
        if face is None:
            face = self.view.__cuda_array_interface__
        self.__cuda_array_interface__ = face
        self.shape = tuple(face["shape"])
        self.ndim = len(self.shape)
        self.dtype = np.dtype(face["typestr"])

    def __array__(self, dtype=None, copy=None):
        raise InputError(f"a GPU array ({type(self.obj).__name__}) was given to a target that "
                         f"runs on the CPU: copy it to the host first (cupy.asnumpy, "
                         f"tensor.cpu())")


DLPACK_CUDA_DEVICES = (2, 13)
"""DLPack's device types of GPU memory a CUDA kernel reads: kDLCUDA and kDLCUDAManaged."""


def _on_cuda(x) -> bool:
    """Whether DLPack object `x` lives in CUDA memory (`__dlpack_device__`'s device type)."""
    try:
        return x.__dlpack_device__()[0] in DLPACK_CUDA_DEVICES
    except Exception:   # no __dlpack_device__, or one that cannot say
        return False


def as_array(x) -> np.ndarray:
    """Anything array-like (NumPy, `__array__`, DLPack) as a NumPy array without copying; a
    GPU array as a `DeviceArray`, left where it is: one with `__cuda_array_interface__` (CuPy,
    PyTorch, Numba, JAX) read through it, a DLPack-only one on a CUDA device through the
    `from_dlpack` of the target that takes device arrays (zero copy)."""
    if isinstance(x, np.ndarray):
        return x
    try:   # read once: PyTorch builds the interface at each read (~7 us a tensor on the device)
        face = x.__cuda_array_interface__
    except AttributeError:   # none, or a CPU tensor's (hasattr's test)
        face = None
    if face is not None:
        return DeviceArray(x, face=face)
    if hasattr(x, "__dlpack__"):
        if _on_cuda(x):
            readers = [s.from_dlpack for s in REGISTRY.values() if s.from_dlpack]
            if not readers:
                raise InputError(f"a GPU array ({type(x).__name__}) given through DLPack: "
                                 f"no target takes device arrays")
            return DeviceArray(x, readers[0](x))
        if not hasattr(x, "__array__"):
            return np.from_dlpack(x)
    return np.asarray(x)


def call_times_ms(fn, repeat: int, warmup: int) -> list[float]:
    """Milliseconds of each of `repeat` calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def warm_up(model, fn, calls: int, most: int = 32) -> bool:
    """Call `fn` (a call of `model`) `calls` times, then on until a call runs only its batch
    size's own code; whether it does. A new size first runs on another size's code in slices
    while its own compiles in the background (`backends/batch_split.py`): timing those calls
    put batch 64 at 5.5x onnxruntime after batch 1 (1.01x alone, issue 30). Waits for each
    background compile; False when calls still split after `most` more (the size's own
    compile failed, or the runtime's `specialize_after` is None)."""
    for _ in range(calls):
        fn()
    runtime = model.runtime
    if not hasattr(runtime, "split_calls"):   # a runtime that never splits
        return True
    for _ in range(most):
        before = runtime.split_calls
        fn()
        if runtime.split_calls == before:
            return True
        if runtime.specialize_after is None:
            return False
        runtime.wait_for_specialisation()
    return False


class CompiledModel:
    """A compiled graph: call it with arrays (positionally or by input name)."""

    def __init__(self, graph: Graph, runtime, target: str, stats: dict | None = None):
        self.graph = graph
        self.runtime = runtime
        self.target = target
        self.input_names = [v.name for v in graph.inputs]
        self.input_types: list[TensorType] = [v.type for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        self.output_types: list[TensorType] = [v.type for v in graph.outputs]
        self._stats = dict(stats or {})
        self.tuning = {"log": None, "records_applied": 0}  # provenance; the tuner fills it
        self.manifest: dict | None = None  # set when loaded from an artifact
        # the compile-cache entry this model was stored under or loaded from (`keep_in_cache`)
        self._cache_entry: str | None = None
        self._cached_jit_seconds = 0.0
        self._storer: compile_cache.Storer | None = None   # its background stores
        # the runtime's `fast_call` for the last input shapes run (None: there is none)
        self._fast = None

    @classmethod
    def restored(cls, parts: artifact.Restored) -> CompiledModel:
        """The model an artifact holds, from the parts `artifact.restore` read."""
        model = cls(parts.graph, parts.runtime, parts.target, parts.stats)
        model.manifest = parts.manifest
        return model

    @property
    def stats(self) -> dict:
        """Counts of the compiled model; the runtime's live values (kernels, fallbacks, arena,
        time spent specialising, also at call time) over what compile/load recorded.

        Memory (llvm): `arena_bytes` is what one calling thread holds, the sum over the
        arenas of every compiled specialisation (one per segment for static shapes);
        `naive_bytes` (every intermediate in a block of its own) and `live_lower_bound_bytes`
        (per arena, the most bytes live at once) are summed the same way, so
        `arena_bytes - workspace_bytes <= live_lower_bound_bytes` would mean every arena is
        optimal (in-place kernels can even go below it); `workspace_bytes` is the part of the
        arenas that holds kernels' workspace (the dense template's packed A); a model
        restored from an artifact (a cache hit, `dnnc.load`) reports the three as the compile
        that saved it did, until a specialisation is planned in this process (then those
        planned here). `pass_seconds` holds each pass's seconds; `memory_plan_seconds` the memory
        planner's, summed over the specialisations planned so far. `specializations` counts
        those kept (at most `cache_size` per segment) and `evictions` those dropped as least
        recently used; `batch_split_calls` the segment calls that ran a batch size on another
        size's code (`backends/plan.py`, `BatchSplit`)."""
        out = dict(self._stats)
        out["pass_seconds"] = dict(out.get("pass_seconds", {}))
        rt = self.runtime
        fallbacks = list(getattr(rt, "host_fallback_ops", ()))
        out["host_fallback_ops"] = len(fallbacks)
        out["host_fallbacks"] = fallbacks
        out["kernels"] = getattr(rt, "kernels", 0)
        out["tuned_kernels"] = getattr(rt, "tuned_kernels", 0)
        out["arena_bytes"] = getattr(rt, "arena_bytes", 0)
        # the products' arithmetic (compile's `precision`), also of a model loaded from disk
        out["precision"] = getattr(getattr(rt, "target", None), "precision",
                                   out.get("precision", "fp32"))
        out.update(getattr(rt, "memory_stats", {}))
        if hasattr(rt, "plan_seconds"):
            out["memory_plan_seconds"] = rt.plan_seconds
        if hasattr(rt, "compiled_segments"):
            out["specializations"] = len(rt.compiled_segments())
            out["evictions"] = getattr(rt, "evictions", 0)
            out["batch_split_calls"] = getattr(rt, "split_calls", 0)
            out["jit_seconds"] = rt.compile_seconds
        return out

    def save(self, path) -> None:
        """Write this model to one self-contained file; `dnnc.load(path)` restores it."""
        artifact.save(self, path)

    def source(self, kind: str = "llvm-ir") -> str:
        """The generated code of every specialisation compiled so far: `llvm-ir`, `asm`,
        `cuda` or `loop` (the scheduled loop IR), as the target emits (its registry entry)."""
        kinds = source_kinds()
        if kind not in kinds:
            raise ArgumentError(f"unknown source kind {kind!r}: kind must be one of "
                                f"{', '.join(kinds)}")
        if not hasattr(self.runtime, "source"):
            raise CompileError(f"target {self.target} generates no code to show")
        return self.runtime.source(kind)

    def __repr__(self) -> str:
        sig = ", ".join(f"{n}: {t}" for n, t in zip(self.input_names, self.input_types))
        outs = ", ".join(str(t) for t in self.output_types)
        return f"<CompiledModel target={self.target} ({sig}) -> ({outs})>"

    def __call__(self, *args, to: str | None = None, **kwargs):
        """Run the model; one output comes back as an array, several as a tuple. `to` is the
        kind of array returned ("numpy" or "cupy", as the target can; default: the compile's
        `outputs` option, else the target's own kind). Every returned array is the
        caller's: the next call never writes over it."""
        outs = self.run(*args, to=to, **kwargs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, *args, to: str | None = None, **kwargs) -> list[np.ndarray]:
        """Run the model; always returns the list of outputs (`to` as in `__call__`)."""
        if to is not None and not isinstance(to, str) and "to" in self.input_names:
            raise ArgumentError("to= names the kind of array to return; give this model's "
                                "input 'to' positionally")
        if kwargs and not args and len(kwargs) == len(self.input_names) and \
                all(n in kwargs for n in self.input_names):
            args, kwargs = tuple(kwargs[n] for n in self.input_names), {}
        if isinstance(to, str) and to == self._only_kind():
            to = None   # the kind this target returns anyway
        plain = to is None and not kwargs
        if plain and self._fast is not None:
            try:
                outs = self._fast(args)
            except MemoryError:   # the plain path below says what did not fit
                outs = None
            if outs is not None:
                return outs
        inputs, bindings = self.check_inputs(args, kwargs)
        outs = self._run(inputs, bindings, to)
        if plain and hasattr(self.runtime, "fast_call") and \
                all(type(a) is np.ndarray and a.flags.c_contiguous for a in inputs):
            self._fast = self.runtime.fast_call(inputs)
        return outs

    def bound_call(self, *args, to: str | None = None):
        """A function running this model, given a list of arguments laid out as `args` were
        at a call (the same shapes and dtypes), without checking them, and returning the
        outputs as a list (`to` as `run` takes it): for a caller that guarantees every
        call's arguments so (the torch backend's partitions, whose arguments dynamo's guards
        fix for static shapes). C-order NumPy `args`: the runtime's unchecked `fast_call`
        (None where it has none, or the specialisation is not compiled yet); else the
        arguments as `check_inputs` makes them (NumPy arrays, `DeviceArray`s), run without
        the checks (through the runtime's `bound_call` where it has one: cuda's goes
        straight to the model's one segment). None for a model of symbolic shapes."""
        if len(args) != len(self.input_types) or \
                not all(t.is_static for t in self.input_types):
            return None
        if to is None and all(type(a) is np.ndarray for a in args):
            fast = getattr(self.runtime, "fast_call", None)
            if fast is None or not all(a.flags.c_contiguous for a in args):
                return None
            return fast(list(args), checked=False)
        if to is not None:
            check_returns(self.target, "to", to)
        # a target's own unchecked path for its arrays (cuda: device arrays), else `_run`
        bound = getattr(self.runtime, "bound_call", None)
        run = bound(list(args), to) if bound is not None else None
        return run or functools.partial(self._run, bindings={}, to=to)

    def _only_kind(self) -> str | None:
        """The one kind of array this target returns, None where it returns several."""
        kinds = REGISTRY[self.target].returns if self.target in REGISTRY else ()
        return kinds[0] if len(kinds) == 1 else None

    def _run(self, inputs: list[np.ndarray], bindings: dict[str, int],
             to: str | None = None) -> list[np.ndarray]:
        options = {}
        if to is not None:
            check_returns(self.target, "to", to)
            if len(REGISTRY[self.target].returns) > 1:   # else it returns that kind anyway
                options["outputs"] = to
        try:
            outs = self.runtime.run(inputs, bindings, **options)
        except MemoryError as exc:
            if isinstance(exc, OutOfMemoryError):
                raise
            dims = ", ".join(f"{k}={v}" for k, v in bindings.items())
            raise OutOfMemoryError(f"running the model{' with ' + dims if dims else ''} "
                                   f"needs more memory than this machine could allocate: "
                                   f"{exc}") from exc
        if self._cache_entry is not None:
            self._keep_new_code()
        return outs

    def keep_in_cache(self, entry: str, background: bool = False) -> None:
        """Store this model in the compile cache under `entry` now (`background`: in the
        cache's writer thread, `compile_cache.Storer`), and again, in the background,
        whenever calls have compiled `MIN_STORE_SECONDS` more code (a symbolic batch's code
        is compiled at its first call, after the compile stored the model: without this, a
        new process's cache hit compiled resnet50 again at its first call, 4.2 s). No call
        waits on the write (in the calling thread, 35 rewrites made 100 new batch sizes
        take 31.5 s against 22.4 s without the cache)."""
        self._cache_entry = entry
        self._cached_jit_seconds = getattr(self.runtime, "compile_seconds", 0.0)
        if not background:
            compile_cache.store(entry, self)
            return
        if self._storer is None:
            self._storer = compile_cache.Storer()
        self._storer.request(entry, self)

    def _keep_new_code(self) -> None:
        jit = getattr(self.runtime, "compile_seconds", 0.0)
        if jit > self._cached_jit_seconds and \
                jit - self._cached_jit_seconds >= compile_cache.MIN_STORE_SECONDS:
            self.keep_in_cache(self._cache_entry, background=True)

    def check_inputs(self, args, kwargs) -> tuple[list[np.ndarray], dict[str, int]]:
        names = self.input_names
        if len(args) > len(names):
            raise InputError(f"the model takes {len(names)} input(s) ({', '.join(names)}), "
                             f"given {len(args)}")
        given = dict(zip(names, args))
        for key, val in kwargs.items():
            if key not in names:
                raise InputError(f"the model has no input {key!r}; its inputs are "
                                 f"{', '.join(names)}")
            if key in given:
                raise InputError(f"input {key!r} given twice")
            given[key] = val
        missing = [n for n in names if n not in given]
        if missing:
            raise InputError(f"missing input(s) {', '.join(missing)}; the model takes "
                             f"{', '.join(f'{n}: {t}' for n, t in zip(names, self.input_types))}")
        bindings: dict[str, int] = {}
        arrays = []
        for name, expected in zip(names, self.input_types):
            try:
                array = as_array(given[name])
            except Exception as exc:
                raise InputError(f"input {name!r} is not array-like: {exc}") from exc
            problem = shape_mismatch(expected, array, bindings)
            if problem:
                raise InputError(f"input {name!r}: expected {expected}, given "
                                 f"{array.dtype}{shape_text(array.shape)} ({problem})")
            arrays.append(array)
        return arrays, bindings

    def profile(self, *args, repeat: int = 20) -> list[dict]:
        """Where a call's time goes: each kernel (and host step) in call order, called alone
        `repeat` times on the data the ones before it left, as {"kernel": its function name,
        "nodes": the fused nodes' names, "ms": the median, "template" and "config": what
        scheduled it, "flops": its floating-point operations (None without a rule),
        "bytes": its parameters' size} (host steps: kernel, nodes and ms). A model loaded from an artifact
        or from the compile cache keeps no kernel list (a `CompileError`): compile the model
        with `cache=False` to profile it."""
        check_int("repeat", repeat, 1)
        if not hasattr(self.runtime, "profile"):
            raise CompileError(f"target {self.target} runs no kernels to profile")
        inputs, _ = self.check_inputs(args, {})
        return self.runtime.profile(inputs, repeat)[1]

    def benchmark(self, *args, repeat: int = 20, warmup: int = 3) -> dict:
        """Median and min latency in milliseconds over `repeat` calls (at least 1), after
        `warmup` untimed ones; each call ends when its results are ready (a runtime that
        returns before its device is done has a `synchronize()`, called in the timing)."""
        check_int("repeat", repeat, 1)
        check_int("warmup", warmup, 0)
        inputs, bindings = self.check_inputs(args, {})
        synchronize = getattr(self.runtime, "synchronize", lambda: None)

        def call():
            self._run(inputs, bindings)
            synchronize()

        times = call_times_ms(call, repeat, warmup)
        return {"median_ms": float(np.median(times)), "min_ms": float(np.min(times)),
                "repeat": repeat}


def load(path, *, progress: bool | None = None) -> CompiledModel:
    """Restore a CompiledModel saved by `CompiledModel.save` (`dnnc.load`): the artifact's
    graph and code checked and restored (`artifact.restore`), nothing compiled again."""
    return CompiledModel.restored(artifact.restore(path, progress=progress))
