"""The LLVM backend's runtime: JIT compilation with the host's CPU features, and the persistent
worker pool that parallel loops run on.

The pool is written in LLVM IR (it needs only libc's pthread functions, which every Python
process has loaded), compiled once per process, and exported to generated code as the symbol
`dnnc_parallel_for(fn, closure, n)`: `fn(closure, start, end)` is called on chunks of [0, n)
by the calling thread and the workers together. Workers spin briefly after a region, then
sleep on a condition variable. One region runs at a time; a second caller (another Python
thread, or a nested parallel loop) runs its loop serially instead of waiting.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass

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


@dataclass(frozen=True)
class HostCPU:
    """What the generated code may use: the CPU name and its feature string.

    The feature string names every ISA feature LLVM detects on this architecture with a sign
    (`host_cpu` and `cpu_from` make it so, and `target_machine` completes a partial one with
    `-`): the CPU name then only tunes, and the `+` features are all the code may use beyond
    the architecture's baseline, which is what an artifact records and checks at load."""

    name: str
    features: str

    @property
    def feature_set(self) -> set[str]:
        return {f[1:] for f in self.features.split(",") if f.startswith("+")}

    @property
    def vector_bits(self) -> int:
        fs = self.feature_set
        if "avx512f" in fs:
            return 512
        if "avx" in fs or "avx2" in fs:
            return 256
        return 128


# CPU names `cpu_from` knows the features of without asking LLVM, per architecture: the
# x86-64 micro-architecture levels of the psABI (each adds to the one before), in LLVM's
# feature names. The first entry is the baseline every CPU of the architecture has.
_X86_64 = ("64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_X86_64_V2 = _X86_64 + ("cx16", "sahf", "popcnt", "crc32", "sse3", "ssse3", "sse4.1",
                        "sse4.2")
_X86_64_V3 = _X86_64_V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe",
                           "xsave")
_X86_64_V4 = _X86_64_V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
CPU_LEVELS = {
    "x86_64": {"x86-64": _X86_64, "x86-64-v2": _X86_64_V2, "x86-64-v3": _X86_64_V3,
               "x86-64-v4": _X86_64_V4},
    # every AArch64 CPU an OS runs on has FP and Advanced SIMD
    "aarch64": {"generic": ("fp-armv8", "neon")},
}
_GENERIC = {"generic": ()}

# CPU names LLVM accepted when asked in a child process (`_check_cpu_name`)
_known_cpu_names: set[str] = set()


@functools.cache
def host_cpu() -> HostCPU:
    """This machine's CPU (asked once: LLVM's detection takes ~0.3 ms a call)."""
    initialize()
    return HostCPU(llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())


def _levels() -> dict[str, tuple[str, ...]]:
    return CPU_LEVELS.get(llvm.get_process_triple().split("-")[0], _GENERIC)


def feature_names() -> frozenset[str]:
    """Every ISA feature LLVM detects on this architecture (the host's list names them all,
    present or not)."""
    return frozenset(f[1:] for f in host_cpu().features.split(",") if f)


def cpu_from(name: str | None = None, mattr: str | None = None) -> HostCPU:
    """A CPU to compile for, with a complete feature list. `name` is this machine's CPU
    (the default) or a level of `CPU_LEVELS` (x86-64-v3, ...), whose features dnnc knows;
    `mattr` ("+avx2,-avx512f") edits those. Any other CPU name LLVM knows only tunes the code
    and needs `mattr`, the whole list of features it may use. Raises ValueError for an
    unknown CPU or feature name instead of letting LLVM abort the process."""
    host = host_cpu()
    known = feature_names()
    levels = _levels()
    baseline = levels[next(iter(levels))]
    features: dict[str, str] = {}
    if name is None or name == host.name:
        name = host.name
        for f in host.features.split(","):
            if f:
                features[f[1:]] = f[0]
    elif name in levels:
        features = {f: "+" if f in levels[name] else "-" for f in sorted(known)}
    else:
        _check_cpu_name(name)
        if not (mattr or "").strip():
            raise ValueError(
                f"dnnc cannot tell which features CPU {name!r} has: list them with --mattr "
                f"(e.g. --mattr=+avx2,+fma), or name a level whose features it knows: "
                f"{', '.join(levels)} (this machine: {host.name})")
        features = {f: "+" if f in baseline else "-" for f in sorted(known)}
    for f in (mattr or "").split(","):
        f = f.strip()
        if not f:
            continue
        sign, feature = (f[0], f[1:]) if f[0] in "+-" else ("+", f)
        if feature not in known:
            raise ValueError(f"{f!r} is not a CPU feature LLVM knows on this architecture "
                             f"(e.g. +avx2,-avx512f)")
        if sign == "-" and feature in baseline:
            raise ValueError(f"{f!r}: every {llvm.get_process_triple().split('-')[0]} CPU "
                             f"has {feature}, code without it cannot be made")
        features.pop(feature, None)  # last in the string: LLVM applies features in order
        features[feature] = sign
    return HostCPU(name, ",".join(sign + f for f, sign in features.items()))


_PROBE = """
import sys, llvmlite.binding as llvm
llvm.initialize_native_target(); llvm.initialize_native_asmprinter()
tm = llvm.Target.from_default_triple().create_target_machine(cpu=sys.argv[1])
"""


def _check_cpu_name(name: str) -> None:
    """Refuse a CPU name LLVM does not know. LLVM only warns on stderr and goes on with a
    CPU that may lack 64-bit mode, aborting the process later ("LLVM ERROR"): so the name is
    tried in a child process (about 0.3 s, once per name and process)."""
    if name in _known_cpu_names:
        return
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ValueError(f"{name!r} is not a CPU name")
    probe = subprocess.run([sys.executable, "-c", _PROBE, name], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0 or "not a recognized processor" in probe.stderr:
        raise ValueError(f"{name!r} is not a CPU LLVM knows for "
                         f"{llvm.get_process_triple()}; levels dnnc knows the features of: "
                         f"{', '.join(_levels())} (this machine: {host_cpu().name})")
    _known_cpu_names.add(name)


def _llvm_cpu(cpu: HostCPU) -> tuple[str, str]:
    """The CPU name and feature string to hand LLVM. Features the string does not mention
    are turned off, so the name cannot add any (the baseline's stay: LLVM needs them); a
    name not checked in this process (from an artifact made elsewhere) is replaced by the
    baseline level, which changes tuning only."""
    levels = _levels()
    baseline = next(iter(levels))
    name = cpu.name
    if name not in levels and name not in _known_cpu_names and name != host_cpu().name:
        name = baseline
    mentioned = {f[1:] for f in cpu.features.split(",") if f}
    off = sorted(feature_names() - mentioned - set(levels[baseline]))
    return name, ",".join(["-" + f for f in off] + ([cpu.features] if cpu.features else []))


def target_machine(cpu: HostCPU, opt: int = 3):
    initialize()
    target = llvm.Target.from_default_triple()
    name, features = _llvm_cpu(cpu)
    # reloc/code model defaults suit MCJIT on x86-64 and aarch64 alike
    return target.create_target_machine(cpu=name, features=features, opt=opt)


def optimize(module, tm, speed_level: int = 3) -> None:
    """The new pass manager's standard pipeline: loop and SLP vectorizers for `tm`'s ISA."""
    pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pm = pb.getModulePassManager()
    pm.run(module, pb)


class JITModule:
    """One compiled LLVM module, alive as long as this object."""

    def __init__(self, ir_text: str, cpu: HostCPU, opt_level: int = 3, name: str = "dnnc"):
        initialize()
        ensure_pool()
        self.cpu = cpu
        self.module = llvm.parse_assembly(ir_text)
        self.module.name = name
        self.module.verify()
        self.tm = target_machine(cpu, opt=min(opt_level, 3))
        self.module.triple = self.tm.triple
        self.module.data_layout = str(self.tm.target_data)
        if opt_level > 0:
            optimize(self.module, self.tm, speed_level=min(opt_level, 3))
        self.engine = llvm.create_mcjit_compiler(self.module, self.tm)
        # keep the object MCJIT compiled and runs: emitting the module again
        # (tm.emit_object) gives other code (an MLP's: 10,416 bytes against the 10,384 that
        # ran), whose `entry` stack layout crashed when an artifact loaded it (issue 10,
        # item 1). A list, not self, receives it: no cycle keeps the engine alive.
        compiled: list[bytes] = []
        self.engine.set_object_cache(notify_func=lambda _, data: compiled.append(bytes(data)))
        self.engine.finalize_object()
        self.engine.run_static_constructors()
        self._object = compiled[0] if compiled else None

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KeyError(f"no function {name!r} in module {self.module.name}")
        return addr

    def optimized_ir(self) -> str:
        return str(self.module)

    def assembly(self) -> str:
        return self.tm.emit_assembly(self.module)

    def object_code(self) -> bytes:
        """The object file MCJIT loaded and runs (not a fresh emission of the module)."""
        if self._object is None:
            raise RuntimeError(f"MCJIT compiled module {self.module.name} without reporting "
                               f"its object code")
        return self._object


# ---------------------------------------------------------------------------------------------
# The worker pool

_POOL_IR = r"""
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_mutex_lock(ptr)
declare i32 @pthread_mutex_unlock(ptr)
declare i32 @pthread_cond_wait(ptr, ptr)
declare i32 @pthread_cond_broadcast(ptr)
declare i32 @pthread_cond_signal(ptr)

; zero-filled pthread_mutex_t / pthread_cond_t are the static initialisers on glibc and musl
@mutex = internal global [128 x i8] zeroinitializer, align 64
@work_cond = internal global [128 x i8] zeroinitializer, align 64
@done_cond = internal global [128 x i8] zeroinitializer, align 64
@task_fn = internal global ptr null, align 64
@task_ctx = internal global ptr null
@task_n = internal global i64 0
@task_chunk = internal global i64 1
@next = internal global i64 0, align 64
@generation = internal global i64 0, align 64
@active = internal global i64 0, align 64
@busy = internal global i32 0, align 64
@nthreads = internal global i64 1

define internal void @run_chunks() {
entry:
  %fn = load ptr, ptr @task_fn
  %ctx = load ptr, ptr @task_ctx
  %n = load i64, ptr @task_n
  %chunk = load i64, ptr @task_chunk
  br label %loop
loop:
  %s = atomicrmw add ptr @next, i64 %chunk monotonic
  %more = icmp slt i64 %s, %n
  br i1 %more, label %body, label %done
body:
  %e0 = add i64 %s, %chunk
  %lt = icmp slt i64 %e0, %n
  %e = select i1 %lt, i64 %e0, i64 %n
  call void %fn(ptr %ctx, i64 %s, i64 %e)
  br label %loop
done:
  ret void
}

define internal ptr @worker(ptr %arg) {
entry:
  %seen = alloca i64
  store i64 0, ptr %seen
  br label %spin_start
spin_start:
  br label %spin
spin:
  %k = phi i64 [ 0, %spin_start ], [ %k1, %spin_more ]
  %g0 = load atomic i64, ptr @generation acquire, align 8
  %s0 = load i64, ptr %seen
  %changed = icmp ne i64 %g0, %s0
  br i1 %changed, label %lock, label %spin_more
spin_more:
  ; ~1 ms of spinning before sleeping: waking a sleeping worker took 50-100 us on the VMs
  ; measured (2-3x the time of a small model with 15 us of spin), and a model's serial kernels
  ; and the Python between calls leave gaps that long
  %k1 = add i64 %k, 1
  %spinning = icmp slt i64 %k1, 3000000
  br i1 %spinning, label %spin, label %lock
lock:
  %r0 = call i32 @pthread_mutex_lock(ptr @mutex)
  br label %check
check:
  %g = load i64, ptr @generation
  %s = load i64, ptr %seen
  %same = icmp eq i64 %g, %s
  br i1 %same, label %sleep, label %go
sleep:
  %r1 = call i32 @pthread_cond_wait(ptr @work_cond, ptr @mutex)
  br label %check
go:
  store i64 %g, ptr %seen
  %r2 = call i32 @pthread_mutex_unlock(ptr @mutex)
  call void @run_chunks()
  %left = atomicrmw sub ptr @active, i64 1 acq_rel
  %last = icmp eq i64 %left, 1
  br i1 %last, label %signal, label %spin_start
signal:
  %r3 = call i32 @pthread_mutex_lock(ptr @mutex)
  %r4 = call i32 @pthread_cond_signal(ptr @done_cond)
  %r5 = call i32 @pthread_mutex_unlock(ptr @mutex)
  br label %spin_start
}

define i64 @dnnc_pool_start(i64 %n) {
entry:
  store i64 %n, ptr @nthreads
  %tid = alloca i64
  br label %loop
loop:
  %i = phi i64 [ 1, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %done
body:
  %r = call i32 @pthread_create(ptr %tid, ptr null, ptr @worker, ptr null)
  %i1 = add i64 %i, 1
  br label %loop
done:
  ret i64 %n
}

; a forked child has no workers: it runs every loop serially
define void @dnnc_pool_serial() {
entry:
  store i64 1, ptr @nthreads
  store atomic i32 0, ptr @busy release, align 4
  ret void
}

define void @dnnc_parallel_for(ptr %fn, ptr %ctx, i64 %n) {
entry:
  %nt = load i64, ptr @nthreads
  %single = icmp sle i64 %nt, 1
  %small = icmp sle i64 %n, 1
  %serial0 = or i1 %single, %small
  br i1 %serial0, label %serial, label %claim
claim:
  %pair = cmpxchg ptr @busy, i32 0, i32 1 acquire monotonic
  %ok = extractvalue { i32, i1 } %pair, 1
  br i1 %ok, label %start, label %serial
serial:
  call void %fn(ptr %ctx, i64 0, i64 %n)
  ret void
start:
  %r0 = call i32 @pthread_mutex_lock(ptr @mutex)
  store ptr %fn, ptr @task_fn
  store ptr %ctx, ptr @task_ctx
  store i64 %n, ptr @task_n
  ; about four chunks per thread balances uneven iterations without many atomics
  %parts = mul i64 %nt, 4
  %c0 = sdiv i64 %n, %parts
  %cz = icmp slt i64 %c0, 1
  %chunk = select i1 %cz, i64 1, i64 %c0
  store i64 %chunk, ptr @task_chunk
  store i64 0, ptr @next
  %workers = sub i64 %nt, 1
  store atomic i64 %workers, ptr @active release, align 8
  %g = load i64, ptr @generation
  %g1 = add i64 %g, 1
  store atomic i64 %g1, ptr @generation release, align 8
  %r1 = call i32 @pthread_cond_broadcast(ptr @work_cond)
  %r2 = call i32 @pthread_mutex_unlock(ptr @mutex)
  call void @run_chunks()
  br label %spin
spin:
  %k = phi i64 [ 0, %start ], [ %k1, %spin_more ]
  %a = load atomic i64, ptr @active acquire, align 8
  %finished = icmp eq i64 %a, 0
  br i1 %finished, label %release, label %spin_more
spin_more:
  %k1 = add i64 %k, 1
  %spinning = icmp slt i64 %k1, 3000000
  br i1 %spinning, label %spin, label %wait_lock
wait_lock:
  %r3 = call i32 @pthread_mutex_lock(ptr @mutex)
  br label %wait_check
wait_check:
  %a2 = load atomic i64, ptr @active acquire, align 8
  %finished2 = icmp eq i64 %a2, 0
  br i1 %finished2, label %wait_done, label %wait
wait:
  %r4 = call i32 @pthread_cond_wait(ptr @done_cond, ptr @mutex)
  br label %wait_check
wait_done:
  %r5 = call i32 @pthread_mutex_unlock(ptr @mutex)
  br label %release
release:
  store atomic i32 0, ptr @busy release, align 4
  ret void
}
"""

_pool = None


def num_threads() -> int:
    """Threads parallel loops use: DNNC_NUM_THREADS, else the cores this process may use."""
    env = os.environ.get("DNNC_NUM_THREADS")
    if env:
        return max(1, int(env))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Pool:
    def __init__(self, threads: int):
        cpu = host_cpu()
        module = llvm.parse_assembly(_POOL_IR)
        module.verify()
        tm = target_machine(cpu, opt=2)
        self.engine = llvm.create_mcjit_compiler(module, tm)
        self.engine.finalize_object()
        self.parallel_for = self.engine.get_function_address("dnnc_parallel_for")
        llvm.add_symbol("dnnc_parallel_for", self.parallel_for)
        start = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(
            self.engine.get_function_address("dnnc_pool_start"))
        self.threads = start(threads)
        self._serial = ctypes.CFUNCTYPE(None)(self.engine.get_function_address("dnnc_pool_serial"))
        os.register_at_fork(after_in_child=self._serial)


def ensure_pool() -> int:
    """Start the worker pool once per process; returns its thread count."""
    global _pool
    with _lock:
        if _pool is None:
            initialize()
            _pool = _Pool(num_threads())
    return _pool.threads
