"""The llvm target's persistent worker pool, which parallel loops run on, and how many
threads it starts (the affinity mask, the cgroup CPU quota, DNNC_NUM_THREADS). It must never
compile anything but the pool itself.

The pool is written in LLVM IR (it needs only libc's pthread, sched_yield and clock_gettime,
which every Python process has loaded), compiled once per process, and exported to generated
code as the symbol `dnnc_parallel_for(fn, closure, n)`: `fn(closure, start, end)` is called on
chunks of [0, n) by the calling thread and the workers together. It is built to degrade
gracefully when the machine is busy (another process, or more threads than cores):

- every thread has a *home* range of the loop, [t n / T, (t + 1) n / T), whose chunks it
  claims first from a counter of its own, so that the same thread runs the same iterations
  call after call (their data stays in its caches: the image an AMX conv makes and then
  reads, the output its next layer reads); chunks are *claimed*, never assigned, so a
  thread with its home done claims what is left of the others', and whoever runs takes the
  work;
- the caller runs chunks too and, when none are left, waits only for workers that entered the
  region and are running chunks they claimed; a worker that has not started yet is never
  waited for, and one that arrives after the region closed sees it closed and touches nothing
  of it (the closure lives on the caller's stack);
- a waiting thread backs off by time (PAUSE, then sched_yield, then sleep on a condition
  variable), and sleeps at once when sched_yield shows another thread wanted its core;
- where the pool uses every CPU of the affinity mask, worker i pins itself to the i-th CPU
  and a caller found on a worker's CPU when it opens a region hops to the remaining one
  (`leave_workers_cpu`), so the two never share a core while another idles
  (DNNC_PIN_WORKERS=0: neither);
- the thread count follows the process's affinity mask and its cgroup CPU quota;
  DNNC_NUM_THREADS overrides both.

One region runs at a time; a second caller (another Python thread, or a nested parallel
loop) runs its loop serially instead of waiting. Fork: the child gets a pool of its own
(`_Pool.after_fork_in_child`, through `process.on_fork_in_child`). docs/llvm_backend.md
("Threads") has the measurements behind this.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import re

import llvmlite.binding as llvm

from .process import initialize, llvm_lock, on_fork_in_child

# ---------------------------------------------------------------------------------------------
# The worker pool
#
# A region's life: the caller fills the task (fn, closure, chunk size, every thread's home
# range: the caller's is 0, worker i's i, the id `pthread_create` hands it), *opens* the region
# (`state` = 0) and bumps `generation`, waking sleeping workers only when there are any.
# Everyone, caller included, claims chunks from its home counter, then from the others' (in
# turn from the next thread's) until none are left. A worker enters a region by raising the
# *inside* flag on its own home line, then reading `state`: if the region is closed it lowers
# the flag and touches nothing, so a worker that arrives late never reads the task of a region
# whose closure is gone. When the caller runs out of chunks it *closes* the region (`state` =
# 1), then reads every worker's flag and waits for those raised, which are running chunks they
# claimed (or about to see the region closed); a worker that never started is never waited
# for. Both sides write first and read second (seq_cst), so one of them sees the other's
# write: the caller never misses a worker inside. Entering and leaving write only the
# worker's own line (16 threads incrementing and decrementing one shared count, one after
# another: an empty region 5.1 us at 16 threads on the AMX Xeon, 4.0 with the flags;
# docs/llvm_backend.md, "Threads").
#
# Waiting (a worker for the next region, the caller for workers inside) backs off by time:
# PAUSE for SPIN_NS, then sched_yield until BLOCK_NS, then sleep on a condition variable.
# A sched_yield that takes longer than BUSY_YIELD_NS gave the core to another runnable thread:
# the machine is oversubscribed, so the waiter sleeps at once instead of competing (libgomp
# throttles its spin count, and libomp yields, when threads outnumber CPUs, for this reason).

_SPIN_NS = 20_000
_BLOCK_NS = 1_000_000
_BUSY_YIELD_NS = 50_000
# chunks per thread (the claims a home range takes): a worker descheduled while running a
# chunk delays the region by at most that chunk, so finer chunks bound the damage under load;
# the cost is one atomic add and an indirect call each. Beside one busy process on 2 cores,
# 16 rather than 4 took mobilenet_v2 from 1.61x to 1.18-1.49x its time alone and resnet18
# from 1.78x to 1.64-1.69x, with no measurable loss alone (docs/llvm_backend.md, "Threads")
_CHUNKS_PER_THREAD = 16

# threads the pool starts at most, and the words between two threads' home counters (a cache
# line: the owner's claims never contend with another thread's)
_MAX_THREADS = 1024
_HOME_STRIDE = 8

# the least time between two hops of the caller off a worker's CPU (`leave_workers_cpu`)
_HOP_INTERVAL_NS = 10_000_000

# CPUs a pinning mask covers (glibc's cpu_set_t: 1024)
_CPU_MASK_BITS = 1024

# the spin-wait hint per architecture (llvmlite's triple's first component)
_PAUSE = {
    "x86_64": ("declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"),
    "aarch64": ("declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)"),
}
_NO_PAUSE = ("", "")

NOW_NS_IR = r"""
define internal i64 @now_ns() {
entry:
  %ts = alloca [2 x i64]
  %r = call i32 @clock_gettime(i32 1, ptr %ts)   ; CLOCK_MONOTONIC, through the vDSO
  %sec = load i64, ptr %ts
  %p = getelementptr [2 x i64], ptr %ts, i64 0, i64 1
  %nsec = load i64, ptr %p
  %s = mul i64 %sec, 1000000000
  %t = add i64 %s, %nsec
  ret i64 %t
}
"""
"""`now_ns()`: CLOCK_MONOTONIC in nanoseconds, for IR that declares `clock_gettime` (the pool's
timed waits; bench/cpu_regions.py's shim)."""

_POOL_IR = r"""
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_mutex_lock(ptr)
declare i32 @pthread_mutex_unlock(ptr)
declare i32 @pthread_cond_wait(ptr, ptr)
declare i32 @pthread_cond_broadcast(ptr)
declare i32 @pthread_cond_signal(ptr)
declare i32 @sched_yield()
declare i32 @clock_gettime(i32, ptr)
declare i32 @sched_setaffinity(i32, i64, ptr)
declare i32 @sched_getaffinity(i32, i64, ptr)
declare i32 @sched_getcpu()
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
PAUSE_DECL

; zero-filled pthread_mutex_t / pthread_cond_t are the static initialisers on glibc and musl
@mutex = internal global [128 x i8] zeroinitializer, align 64
@work_cond = internal global [128 x i8] zeroinitializer, align 64
@done_cond = internal global [128 x i8] zeroinitializer, align 64
@task_fn = internal global ptr null, align 64
@task_ctx = internal global ptr null
@task_chunk = internal global i64 1
; per thread (HOME_STRIDE words apart: a cache line each): its home range's next unclaimed
; iteration, its end, and (workers) whether it is inside the region: a line the owner writes
; anyway, so a worker enters and leaves without writing one another thread writes
@home = internal global [HOME_WORDS x i64] zeroinitializer, align 64
; 0 while a region is open, 1 closed (it takes no more workers)
@state = internal global i64 1, align 64
; the caller sleeps on done_cond waiting for a worker (set and cleared under the mutex)
@caller_asleep = internal global i64 0, align 64
@generation = internal global i64 0, align 64
@sleepers = internal global i64 0, align 64
@busy = internal global i32 0, align 64
@nthreads = internal global i64 1
; per worker: the CPU it pins itself to when it starts (-1: none); the caller's, thread 0's,
; is the CPU no worker is pinned to, where a caller found on a worker's CPU hops (-1: none)
@pin_cpu = global [MAX_THREADS x i32] zeroinitializer, align 64
@last_hop = internal global i64 0

NOW_NS

; one step of a wait that began at %t0: false when the waiter should sleep instead
define internal i1 @backoff(i64 %t0) {
entry:
  %t = call i64 @now_ns()
  %dt = sub i64 %t, %t0
  %spin = icmp slt i64 %dt, SPIN_NS
  br i1 %spin, label %pause, label %yield_or_stop
pause:
  PAUSE_CALL
  ret i1 true
yield_or_stop:
  %within = icmp slt i64 %dt, BLOCK_NS
  br i1 %within, label %yield, label %stop
yield:
  %r = call i32 @sched_yield()
  %t1 = call i64 @now_ns()
  %took = sub i64 %t1, %t
  %idle = icmp slt i64 %took, BUSY_YIELD_NS
  ret i1 %idle
stop:
  ret i1 false
}

; the calling thread's (`%me`) home chunks first, then the other threads' left over, each
; range from its own counter (own: a line no other thread writes while its owner is there)
define internal void @run_chunks(i64 %me) {
entry:
  %fn = load ptr, ptr @task_fn
  %ctx = load ptr, ptr @task_ctx
  %chunk = load i64, ptr @task_chunk
  %nt = load i64, ptr @nthreads
  br label %range
range:
  %k = phi i64 [ 0, %entry ], [ %k1, %next_range ]
  %v0 = add i64 %me, %k
  %wrap = icmp sge i64 %v0, %nt
  %v1 = sub i64 %v0, %nt
  %v = select i1 %wrap, i64 %v1, i64 %v0
  %at = mul i64 %v, HOME_STRIDE
  %pn = getelementptr i64, ptr @home, i64 %at
  %at1 = add i64 %at, 1
  %pe = getelementptr i64, ptr @home, i64 %at1
  %end = load i64, ptr %pe
  br label %look
look:
  %seen = load atomic i64, ptr %pn monotonic, align 8
  %left = icmp slt i64 %seen, %end
  br i1 %left, label %claim, label %next_range
claim:
  %s = atomicrmw add ptr %pn, i64 %chunk monotonic
  %more = icmp slt i64 %s, %end
  br i1 %more, label %body, label %next_range
body:
  %e0 = add i64 %s, %chunk
  %lt = icmp slt i64 %e0, %end
  %e = select i1 %lt, i64 %e0, i64 %end
  call void %fn(ptr %ctx, i64 %s, i64 %e)
  br label %claim
next_range:
  %k1 = add i64 %k, 1
  %others = icmp slt i64 %k1, %nt
  br i1 %others, label %range, label %done
done:
  ret void
}

; pins the calling thread to CPU %cpu (a mask of CPU_MASK_WORDS words); none when negative
define internal void @pin_to(i32 %cpu) {
entry:
  %none = icmp slt i32 %cpu, 0
  %far = icmp sge i32 %cpu, CPU_MASK_BITS
  %skip = or i1 %none, %far
  br i1 %skip, label %done, label %pin
pin:
  %mask = alloca [CPU_MASK_WORDS x i64], align 8
  call void @llvm.memset.p0.i64(ptr %mask, i8 0, i64 CPU_MASK_BYTES, i1 false)
  %c = zext i32 %cpu to i64
  %w = lshr i64 %c, 6
  %b = and i64 %c, 63
  %bit = shl i64 1, %b
  %pw = getelementptr i64, ptr %mask, i64 %w
  store i64 %bit, ptr %pw
  %r = call i32 @sched_setaffinity(i32 0, i64 CPU_MASK_BYTES, ptr %mask)
  br label %done
done:
  ret void
}

; where the workers are pinned and the caller runs on one of their CPUs (the scheduler put it
; back where it last ran, or woke it there), the worker of that CPU would wait for the caller
; to be preempted while another CPU idles: the caller moves to its own CPU (pin_cpu[0]) and
; takes its affinity back at once, so it stays free to move (it is the user's thread). Not
; where its affinity excludes that CPU (the user pinned it): it stays where it was put.
define internal void @leave_workers_cpu() {
entry:
  %home = load i32, ptr @pin_cpu
  %pinned = icmp sge i32 %home, 0
  br i1 %pinned, label %where, label %done
where:
  %cpu = call i32 @sched_getcpu()
  %away = icmp ne i32 %cpu, %home
  br i1 %away, label %check, label %done
check:
  %saved = alloca [CPU_MASK_WORDS x i64], align 8
  call void @llvm.memset.p0.i64(ptr %saved, i8 0, i64 CPU_MASK_BYTES, i1 false)
  %r0 = call i32 @sched_getaffinity(i32 0, i64 CPU_MASK_BYTES, ptr %saved)
  %failed = icmp slt i32 %r0, 0
  br i1 %failed, label %done, label %test
test:
  %c = zext i32 %home to i64
  %w = lshr i64 %c, 6
  %b = and i64 %c, 63
  %pw = getelementptr i64, ptr %saved, i64 %w
  %word = load i64, ptr %pw
  %bit = lshr i64 %word, %b
  %allowed = trunc i64 %bit to i1
  br i1 %allowed, label %recent, label %done
recent:
  ; at most one hop every HOP_INTERVAL_NS: on a loaded machine the scheduler moves the caller
  ; back and forth, and chasing it costs a migration a region
  %t = call i64 @now_ns()
  %last = load i64, ptr @last_hop
  %since = sub i64 %t, %last
  %due = icmp sge i64 %since, HOP_INTERVAL_NS
  br i1 %due, label %hop, label %done
hop:
  store i64 %t, ptr @last_hop
  call void @pin_to(i32 %home)
  %r1 = call i32 @sched_setaffinity(i32 0, i64 CPU_MASK_BYTES, ptr %saved)
  br label %done
done:
  ret void
}

define internal ptr @worker(ptr %arg) {
entry:
  %me = ptrtoint ptr %arg to i64
  %pc = getelementptr [MAX_THREADS x i32], ptr @pin_cpu, i64 0, i64 %me
  %cpu = load i32, ptr %pc
  call void @pin_to(i32 %cpu)
  %at = mul i64 %me, HOME_STRIDE
  %at2 = add i64 %at, 2
  %inside = getelementptr i64, ptr @home, i64 %at2
  %gen0 = load atomic i64, ptr @generation acquire, align 8
  br label %wait
wait:
  %seen = phi i64 [ %gen0, %entry ], [ %g, %next_region ]
  %t0 = call i64 @now_ns()
  br label %poll
poll:
  %g1 = load atomic i64, ptr @generation acquire, align 8
  %changed = icmp ne i64 %g1, %seen
  br i1 %changed, label %join, label %poll_more
poll_more:
  %again = call i1 @backoff(i64 %t0)
  br i1 %again, label %poll, label %sleep_lock
sleep_lock:
  %r0 = call i32 @pthread_mutex_lock(ptr @mutex)
  %sl0 = atomicrmw add ptr @sleepers, i64 1 seq_cst
  br label %sleep_check
sleep_check:
  %g2 = load atomic i64, ptr @generation seq_cst, align 8
  %same = icmp eq i64 %g2, %seen
  br i1 %same, label %sleep, label %woken
sleep:
  %r1 = call i32 @pthread_cond_wait(ptr @work_cond, ptr @mutex)
  br label %sleep_check
woken:
  %sl1 = atomicrmw sub ptr @sleepers, i64 1 seq_cst
  %r2 = call i32 @pthread_mutex_unlock(ptr @mutex)
  br label %join
join:
  %g = phi i64 [ %g1, %poll ], [ %g2, %woken ]
  ; inside first, then look: the caller closes first, then looks (both seq_cst), so either
  ; this worker sees the region closed or the caller sees it inside and waits for it
  store atomic i64 1, ptr %inside seq_cst, align 8
  %st = load atomic i64, ptr @state seq_cst, align 8
  %closed = icmp ne i64 %st, 0
  br i1 %closed, label %leave, label %work
work:
  call void @run_chunks(i64 %me)
  br label %leave
leave:
  store atomic i64 0, ptr %inside seq_cst, align 8
  %asleep = load atomic i64, ptr @caller_asleep seq_cst, align 8
  %wake = icmp ne i64 %asleep, 0
  br i1 %wake, label %signal, label %next_region
signal:
  ; the caller is asleep waiting for a worker inside a closed region, maybe this one
  %r3 = call i32 @pthread_mutex_lock(ptr @mutex)
  %r4 = call i32 @pthread_cond_signal(ptr @done_cond)
  %r5 = call i32 @pthread_mutex_unlock(ptr @mutex)
  br label %next_region
next_region:
  br label %wait
}

; starts up to %n - 1 workers; returns the threads running loops (the caller's included)
define i64 @dnnc_pool_start(i64 %n0) {
entry:
  %tid = alloca i64
  %over = icmp sgt i64 %n0, MAX_THREADS
  %n = select i1 %over, i64 MAX_THREADS, i64 %n0
  br label %loop
loop:
  %i = phi i64 [ 1, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %done
body:
  %id = inttoptr i64 %i to ptr
  %r = call i32 @pthread_create(ptr %tid, ptr null, ptr @worker, ptr %id)
  %ok = icmp eq i32 %r, 0
  %i1 = add i64 %i, 1
  br i1 %ok, label %loop, label %done
done:
  %started = phi i64 [ %i, %loop ], [ %i, %body ]
  store i64 %started, ptr @nthreads
  ret i64 %started
}

; in a forked child: the workers are gone and a lock may be held by a thread that no longer
; exists; everything is reset to its static initial state (serial until workers restart)
define void @dnnc_pool_reset() {
entry:
  call void @llvm.memset.p0.i64(ptr @mutex, i8 0, i64 128, i1 false)
  call void @llvm.memset.p0.i64(ptr @work_cond, i8 0, i64 128, i1 false)
  call void @llvm.memset.p0.i64(ptr @done_cond, i8 0, i64 128, i1 false)
  store i64 1, ptr @nthreads
  call void @llvm.memset.p0.i64(ptr @home, i8 0, i64 HOME_BYTES, i1 false)
  store i64 1, ptr @state
  store i64 0, ptr @caller_asleep
  store i64 0, ptr @sleepers
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
  ; one region at a time: a nested loop or another Python thread's runs serially
  %pair = cmpxchg ptr @busy, i32 0, i32 1 acquire monotonic
  %ok = extractvalue { i32, i1 } %pair, 1
  br i1 %ok, label %open, label %serial
serial:
  call void %fn(ptr %ctx, i64 0, i64 %n)
  ret void
open:
  call void @leave_workers_cpu()
  store ptr %fn, ptr @task_fn
  store ptr %ctx, ptr @task_ctx
  %parts = mul i64 %nt, CHUNKS_PER_THREAD
  %c0 = sdiv i64 %n, %parts
  %cz = icmp slt i64 %c0, 1
  %chunk = select i1 %cz, i64 1, i64 %c0
  store i64 %chunk, ptr @task_chunk
  br label %homes
homes:
  ; thread t's home: iterations [t n / nt, (t + 1) n / nt)
  %t = phi i64 [ 0, %open ], [ %t1, %homes ]
  %lo = mul i64 %t, %n
  %start = sdiv i64 %lo, %nt
  %t1 = add i64 %t, 1
  %hi = mul i64 %t1, %n
  %stop = sdiv i64 %hi, %nt
  %hat = mul i64 %t, HOME_STRIDE
  %hn = getelementptr i64, ptr @home, i64 %hat
  %hat1 = add i64 %hat, 1
  %he = getelementptr i64, ptr @home, i64 %hat1
  store i64 %start, ptr %hn
  store i64 %stop, ptr %he
  %more_homes = icmp slt i64 %t1, %nt
  br i1 %more_homes, label %homes, label %opened
opened:
  store atomic i64 0, ptr @state release, align 8
  %g = atomicrmw add ptr @generation, i64 1 seq_cst
  %sl = load atomic i64, ptr @sleepers seq_cst, align 8
  %asleep = icmp ne i64 %sl, 0
  br i1 %asleep, label %wake, label %run
wake:
  %r0 = call i32 @pthread_mutex_lock(ptr @mutex)
  %r1 = call i32 @pthread_cond_broadcast(ptr @work_cond)
  %r2 = call i32 @pthread_mutex_unlock(ptr @mutex)
  br label %run
run:
  call void @run_chunks(i64 0)
  store atomic i64 1, ptr @state seq_cst, align 8
  br label %look
look:
  ; the workers inside, one after another (a flag on each one's home line)
  %w = phi i64 [ 1, %run ], [ %w1, %out ]
  %any = icmp slt i64 %w, %nt
  br i1 %any, label %check, label %release
check:
  %wat = mul i64 %w, HOME_STRIDE
  %wat2 = add i64 %wat, 2
  %inside = getelementptr i64, ptr @home, i64 %wat2
  %in0 = load atomic i64, ptr %inside seq_cst, align 8
  %gone = icmp eq i64 %in0, 0
  br i1 %gone, label %out, label %wait
wait:
  %t0 = call i64 @now_ns()
  br label %poll
poll:
  %in1 = load atomic i64, ptr %inside acquire, align 8
  %left = icmp eq i64 %in1, 0
  br i1 %left, label %out, label %poll_more
poll_more:
  %again = call i1 @backoff(i64 %t0)
  br i1 %again, label %poll, label %sleep_lock
sleep_lock:
  %r3 = call i32 @pthread_mutex_lock(ptr @mutex)
  store atomic i64 1, ptr @caller_asleep seq_cst, align 8
  br label %sleep_check
sleep_check:
  %in2 = load atomic i64, ptr %inside seq_cst, align 8
  %left2 = icmp eq i64 %in2, 0
  br i1 %left2, label %woken, label %sleep
sleep:
  %r4 = call i32 @pthread_cond_wait(ptr @done_cond, ptr @mutex)
  br label %sleep_check
woken:
  store atomic i64 0, ptr @caller_asleep seq_cst, align 8
  %r5 = call i32 @pthread_mutex_unlock(ptr @mutex)
  br label %out
out:
  %w1 = add i64 %w, 1
  br label %look
release:
  store atomic i32 0, ptr @busy release, align 4
  ret void
}
"""


def _pool_ir(arch: str) -> str:
    decl, call = _PAUSE.get(arch, _NO_PAUSE)
    subs = {"PAUSE_DECL": decl, "PAUSE_CALL": call, "SPIN_NS": _SPIN_NS,
            "BLOCK_NS": _BLOCK_NS, "BUSY_YIELD_NS": _BUSY_YIELD_NS, "CHUNKS_PER_THREAD": _CHUNKS_PER_THREAD,
            "MAX_THREADS": _MAX_THREADS, "HOME_STRIDE": _HOME_STRIDE,
            "HOME_WORDS": _MAX_THREADS * _HOME_STRIDE,
            "HOME_BYTES": _MAX_THREADS * _HOME_STRIDE * 8, "CPU_MASK_WORDS": _CPU_MASK_BITS // 64,
            "CPU_MASK_BYTES": _CPU_MASK_BITS // 8, "CPU_MASK_BITS": _CPU_MASK_BITS,
            "HOP_INTERVAL_NS": _HOP_INTERVAL_NS, "NOW_NS": NOW_NS_IR}
    return re.sub("|".join(sorted(subs, key=len, reverse=True)),
                  lambda m: str(subs[m.group(0)]), _POOL_IR)


# ---------------------------------------------------------------------------------------------
# How many threads


def num_threads() -> int:
    """Threads parallel loops use: DNNC_NUM_THREADS, else the cores this process may use
    (its affinity mask), capped by its cgroup's CPU quota (a container limited to 2 CPUs on
    a 64-core host must not start 64 threads that the quota then throttles)."""
    env = os.environ.get("DNNC_NUM_THREADS")
    if env:
        return max(1, int(env))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def worker_cpus(threads: int) -> list[int]:
    """The CPU each of the pool's threads pins itself to, by thread index, -1 for none: where
    the pool uses every CPU of the affinity mask, worker i the i-th CPU, so that two of its
    threads never share a core while another is idle. The caller, index 0, is never pinned
    (it is the user's thread): its CPU is where it hops when a parallel loop finds it on a
    worker's. Not where the pool has fewer threads than CPUs (a quota, an
    explicit DNNC_NUM_THREADS: processes sharing the machine would pile onto the same first
    CPUs), nor where DNNC_PIN_WORKERS=0."""
    unpinned = [-1] * threads
    if os.environ.get("DNNC_PIN_WORKERS", "1") == "0":
        return unpinned
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return unpinned
    if threads != len(cpus):
        return unpinned
    return cpus[:]


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup"
                     ) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (quota / period), the tightest
    over its cgroup and the ones above it; None when unlimited or unknown. Reads cgroup v2's
    `cpu.max` ("max 100000" or "200000 100000") and v1's `cpu.cfs_quota_us` (-1: none) over
    `cpu.cfs_period_us`."""
    try:
        with open(membership) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":                          # v2: "0::/path"
            for folder in _cgroup_ancestors(root, path):
                limits.append(_v2_quota(folder))
        elif "cpu" in controllers.split(","):          # v1: "3:cpu,cpuacct:/path"
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                for folder in _cgroup_ancestors(os.path.join(root, mount), path):
                    limits.append(_v1_quota(folder))
    limits = [q for q in limits if q is not None]
    return min(limits) if limits else None


def _cgroup_ancestors(root: str, path: str) -> list[str]:
    """`root/path` and each folder above it up to `root` (inside a container the cgroup is
    often mounted as the root itself, its path reading "/")."""
    parts = [p for p in path.strip("/").split("/") if p]
    return [os.path.join(root, *parts[:k]) for k in range(len(parts), -1, -1)]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _v2_quota(folder: str) -> float | None:
    text = _read(os.path.join(folder, "cpu.max"))
    if not text:
        return None
    fields = text.split()
    if fields[0] == "max" or len(fields) < 2 or not int(fields[1]):
        return None
    return int(fields[0]) / int(fields[1])


def _v1_quota(folder: str) -> float | None:
    quota, period = (_read(os.path.join(folder, name))
                     for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None
    return int(quota) / int(period)


# ---------------------------------------------------------------------------------------------
# The pool's life in this process, and fork


class _Pool:
    def __init__(self, threads: int):
        module = llvm.parse_assembly(_pool_ir(platform.machine()))
        module.verify()
        # the host's own CPU and all its features (what `jit.target_machine` makes of
        # `cpu.host_target()`, asked here without it: the pool is below both)
        tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            opt=2)
        self.engine = llvm.create_mcjit_compiler(module, tm)
        self.engine.finalize_object()
        self.parallel_for = self.engine.get_function_address("dnnc_parallel_for")
        llvm.add_symbol("dnnc_parallel_for", self.parallel_for)
        self._start = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(
            self.engine.get_function_address("dnnc_pool_start"))
        self._reset = ctypes.CFUNCTYPE(None)(self.engine.get_function_address("dnnc_pool_reset"))
        self.wanted = threads
        self._pins = (ctypes.c_int32 * _MAX_THREADS).from_address(
            self.engine.get_global_value_address("pin_cpu"))
        self._set_pins()
        self.threads = self._start(threads)

    def _set_pins(self) -> None:
        cpus = worker_cpus(self.wanted)
        for i in range(_MAX_THREADS):
            self._pins[i] = cpus[i] if i < len(cpus) else -1

    def after_fork_in_child(self) -> None:
        """The child has only the forking thread: reset the pool's locks and counters and
        start workers of its own, so it runs parallel loops like its parent."""
        self._reset()
        self._set_pins()
        self.threads = self._start(self.wanted)


_pool: _Pool | None = None


def ensure_pool() -> int:
    """Start the worker pool once per process; returns its thread count."""
    global _pool
    with llvm_lock():
        if _pool is None:
            initialize()
            _pool = _Pool(num_threads())
    return _pool.threads


def _pool_after_fork_in_child() -> None:
    if _pool is not None:
        _pool.after_fork_in_child()


on_fork_in_child(_pool_after_fork_in_child)
