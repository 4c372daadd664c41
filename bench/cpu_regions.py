"""Where a model's time goes at many threads: the worker pool's parallel regions measured one by
one (`dnnc_parallel_for` wrapped by a counting shim), and an empty region's cost.

    python bench/cpu_regions.py [--models mobilenet_v2] [--threads 16]
                                [--pool chunks=16,spin=20000] [--calls 50]

For each `--pool` variant (the pool's `_CHUNKS_PER_THREAD` and `_SPIN_NS`, set before it
starts; `;` between variants) and each thread count, in a process of its own:

- an empty region's cost: the caller opens `reps` regions of n iterations back to back (or
  with `gap` microseconds of serial work between them, as a serial kernel would), each
  iteration doing nothing, or 1 us of work;
- each model (the float32 zoo model and its QDQ int8 file, bench/cpu_int8.py's
  quantize_static) called `--calls` times; for the median call: its milliseconds, the
  regions it opened, their wall time, the time the threads spent inside chunks (summed over
  threads, over the thread count: the work if spread perfectly), and what is left: time
  outside any region (serial kernels, the entry's glue) and the regions' wall time past
  their chunks' time over the threads (the regions' open, wake, claims, imbalance and close).

Timing only (two clock reads and a count on the CPU's own line at each chunk's end cost
~0.1 us a chunk; session 55's first run counted on one shared line instead, whose contention
added ~1 us a chunk at 16 threads).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_SHIM_IR = r"""
declare i32 @clock_gettime(i32, ptr)
declare i32 @sched_getcpu()
@log = global [LOG x [2 x i64]] zeroinitializer
@count = global i64 0
; per CPU, a cache line each: chunk nanoseconds and chunks (one shared counter would make
; every chunk's end contend)
@busy = global [CPUS x [8 x i64]] zeroinitializer, align 64

NOW_NS

define internal void @timed_chunk(ptr %c, i64 %s, i64 %e) {
  %t0 = call i64 @now_ns()
  %fn = load ptr, ptr %c
  %pc = getelementptr { ptr, ptr }, ptr %c, i32 0, i32 1
  %ctx = load ptr, ptr %pc
  call void %fn(ptr %ctx, i64 %s, i64 %e)
  %t1 = call i64 @now_ns()
  %d = sub i64 %t1, %t0
  %cpu = call i32 @sched_getcpu()
  %c0 = and i32 %cpu, CPUMASK
  %slot = getelementptr [CPUS x [8 x i64]], ptr @busy, i64 0, i32 %c0
  %a = atomicrmw add ptr %slot, i64 %d monotonic
  %pk = getelementptr i64, ptr %slot, i64 1
  %b = atomicrmw add ptr %pk, i64 1 monotonic
  ret void
}

; each region: (n, wall ns)
define void @counting_parallel_for(ptr %fn, ptr %ctx, i64 %n) {
  %c = alloca { ptr, ptr }
  store ptr %fn, ptr %c
  %pc = getelementptr { ptr, ptr }, ptr %c, i32 0, i32 1
  store ptr %ctx, ptr %pc
  %t0 = call i64 @now_ns()
  %real = inttoptr i64 REAL to ptr
  call void %real(ptr @timed_chunk, ptr %c, i64 %n)
  %t1 = call i64 @now_ns()
  %i0 = load i64, ptr @count
  %i1 = add i64 %i0, 1
  store i64 %i1, ptr @count
  %full = icmp sge i64 %i0, LOG
  br i1 %full, label %done, label %record
record:
  %slot = getelementptr [LOG x [2 x i64]], ptr @log, i64 0, i64 %i0
  store i64 %n, ptr %slot
  %w = sub i64 %t1, %t0
  %s1 = getelementptr i64, ptr %slot, i64 1
  store i64 %w, ptr %s1
  br label %done
done:
  ret void
}

; `reps` regions of n iterations, each iteration spinning `work` ns, `gap` ns of serial spin
; between regions (what a serial kernel does between two parallel ones)
define internal void @spin(i64 %ns) {
entry:
  %t0 = call i64 @now_ns()
  br label %loop
loop:
  %t = call i64 @now_ns()
  %d = sub i64 %t, %t0
  %more = icmp slt i64 %d, %ns
  br i1 %more, label %loop, label %done
done:
  ret void
}

define internal void @iterations(ptr %work, i64 %s, i64 %e) {
entry:
  %w = load i64, ptr %work
  %n = sub i64 %e, %s
  %ns = mul i64 %n, %w
  %any = icmp sgt i64 %ns, 0
  br i1 %any, label %busy, label %done
busy:
  call void @spin(i64 %ns)
  br label %done
done:
  ret void
}

define void @regions(i64 %reps, i64 %n, i64 %work, i64 %gap) {
entry:
  %w = alloca i64
  store i64 %work, ptr %w
  %real = inttoptr i64 REAL to ptr
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
  call void %real(ptr @iterations, ptr %w, i64 %n)
  call void @spin(i64 %gap)
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %reps
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""

_LOG = 1 << 16
_CPUS = 1024


class Shim:
    """`dnnc_parallel_for` wrapped: every region's size and wall time logged, the chunks' time
summed per CPU.
    Installed before anything is compiled, so generated code links to the shim."""

    def __init__(self):
        import llvmlite.binding as llvm
        from dnnc.backends.llvm import workers
        from dnnc.backends.llvm.process import initialize
        initialize()
        workers.ensure_pool()
        real = workers._pool.parallel_for
        ir = (_SHIM_IR.replace("REAL", str(real)).replace("LOG", str(_LOG))
              .replace("CPUMASK", str(_CPUS - 1)).replace("CPUS", str(_CPUS))
              .replace("NOW_NS", workers.NOW_NS_IR))
        module = llvm.parse_assembly(ir)
        module.verify()
        tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
        self.engine = llvm.create_mcjit_compiler(module, tm)
        self.engine.finalize_object()
        llvm.add_symbol("dnnc_parallel_for",
                        self.engine.get_function_address("counting_parallel_for"))
        self.threads = workers._pool.threads
        self._count = ctypes.c_int64.from_address(self.engine.get_global_value_address("count"))
        self._log = (ctypes.c_int64 * (2 * _LOG)).from_address(
            self.engine.get_global_value_address("log"))
        self._busy = (ctypes.c_int64 * (8 * _CPUS)).from_address(
            self.engine.get_global_value_address("busy"))
        self.regions = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int64)(
            self.engine.get_function_address("regions"))

    def reset(self):
        self._count.value = 0
        ctypes.memset(self._busy, 0, ctypes.sizeof(self._busy))

    def log(self) -> np.ndarray:
        """(n, wall ns) of each region since `reset`."""
        k = min(self._count.value, _LOG)
        return np.ctypeslib.as_array(self._log)[:2 * k].reshape(k, 2).copy()

    def chunks(self) -> tuple[int, int]:
        """Nanoseconds inside chunks, over all threads, and chunks run, since `reset`."""
        busy = np.ctypeslib.as_array(self._busy).reshape(_CPUS, 8)
        return int(busy[:, 0].sum()), int(busy[:, 1].sum())


def empty_regions(shim: Shim) -> list[dict]:
    rows = []
    for n, work, gap in [(16, 0, 0), (256, 0, 0), (4096, 0, 0), (256, 0, 30_000),
                         (256, 0, 300_000), (256, 0, 3_000_000), (256, 1000, 0)]:
        reps = 200 if gap >= 300_000 else 2000
        shim.regions(20, n, work, gap)
        best = []
        for _ in range(3):
            t0 = time.perf_counter_ns()
            shim.regions(reps, n, work, gap)
            best.append((time.perf_counter_ns() - t0) / reps - gap)
        ideal = n * work / shim.threads
        rows.append({"n": n, "work_ns": work, "gap_us": gap / 1e3,
                     "region_us": min(best) / 1e3, "past_ideal_us": (min(best) - ideal) / 1e3})
    return rows


def model_regions(shim: Shim, name: str, calls: int, qdir: Path) -> dict:
    import dnnc
    from dnnc import zoo
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cpu_int8 import float_model, quantized
    model = float_model(name, 224)
    marker = qdir / f"{name}.done"
    if not marker.exists():
        (qdir / name).mkdir(parents=True, exist_ok=True)
        path = list(quantized(name, model, qdir / name, ["int8"]).values())[0]
        marker.write_text(str(path))
    feeds = zoo.inputs_for(model, np.random.default_rng(0))
    shapes = {k: v.shape for k, v in feeds.items()}
    out = {}
    for label, source in (("fp32", model), ("int8", marker.read_text())):
        compiled = dnnc.compile(source, "llvm", input_shapes=shapes)
        for _ in range(5):
            compiled(**feeds)
        rows = []
        for _ in range(calls):
            shim.reset()
            t0 = time.perf_counter_ns()
            compiled(**feeds)
            t1 = time.perf_counter_ns()
            rows.append((t1 - t0, shim.log(), shim.chunks()))
        rows.sort(key=lambda r: r[0])
        call_ns, log, (busy, chunks) = rows[len(rows) // 2]
        if not len(log):
            out[label] = {"call_ms": call_ns / 1e6, "regions": 0}
            continue
        T = shim.threads
        wall = log[:, 1].astype(float)
        small = wall < 20_000
        out[label] = {
            "call_ms": call_ns / 1e6, "regions": len(log), "regions_wall_ms": wall.sum() / 1e6,
            "outside_ms": (call_ns - wall.sum()) / 1e6, "chunks_over_T_ms": busy / T / 1e6,
            "past_chunks_ms": (wall.sum() - busy / T) / 1e6, "chunks": chunks,
            "median_region_us": float(np.median(wall)) / 1e3,
            "under_20us": int(small.sum()), "under_20us_wall_ms": wall[small].sum() / 1e6,
            "log": log.tolist()}
    return out


def one(args) -> None:
    from dnnc.backends.llvm import workers
    for item in filter(None, args.pool.split(",")):
        key, value = item.split("=")
        setattr(workers, {"chunks": "_CHUNKS_PER_THREAD", "spin": "_SPIN_NS"}[key], int(value))
    shim = Shim()
    result = {"threads": shim.threads, "pool": args.pool, "empty": empty_regions(shim),
              "models": {m: model_regions(shim, m, args.calls, Path(args.qdir))
                         for m in filter(None, args.models.split(","))}}
    Path(args.json).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mobilenet_v2", help="'' for the empty regions only")
    ap.add_argument("--threads", default="16")
    ap.add_argument("--pool", default="chunks=16,spin=20000",
                    help="variants of the pool's constants, ';' between variants")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--qdir", default="/tmp/dnnc_regions_q")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        return one(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for pool in args.pool.split(";"):
        for threads in args.threads.split(","):
            path = Path(args.out) / f"regions_{threads}_{pool.replace(',', '_').replace('=', '')}.json"
            env = dict(os.environ, DNNC_NUM_THREADS=threads)
            subprocess.run([sys.executable, __file__, "--json", str(path), "--pool", pool,
                            "--models", args.models, "--calls", str(args.calls),
                            "--qdir", args.qdir], env=env, check=True)
            r = json.loads(path.read_text())
            print(f"## {r['threads']} threads, pool {pool}", flush=True)
            for e in r["empty"]:
                print(f"  region n={e['n']:5d} work={e['work_ns']:5d} ns gap={e['gap_us']:7.0f} us:"
                      f" {e['region_us']:8.2f} us ({e['past_ideal_us']:7.2f} past the work)")
            for m, by in r["models"].items():
                for label, s in by.items():
                    if not s["regions"]:
                        print(f"  {m} {label}: call {s['call_ms']:.3f} ms, no regions")
                        continue
                    print(f"  {m} {label}: call {s['call_ms']:.3f} ms, {s['regions']} regions "
                          f"({s['chunks']} chunks) wall {s['regions_wall_ms']:.3f} ms, chunks/T "
                          f"{s['chunks_over_T_ms']:.3f}, past chunks {s['past_chunks_ms']:.3f} "
                          f"(median region {s['median_region_us']:.1f} us), outside regions "
                          f"{s['outside_ms']:.3f}; "
                          f"{s['under_20us']} regions under 20 us: {s['under_20us_wall_ms']:.3f} ms",
                          flush=True)


if __name__ == "__main__":
    main()
