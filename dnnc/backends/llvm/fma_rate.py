"""How many multiply-adds of its widest vectors this CPU starts a cycle, measured, for the cost
models (passes/conv_costs.py reads it as `Target.fma_ports`). No feature flag says it: Zen 4
runs AVX-512 in two 256-bit halves, one 512-bit FMA a cycle where two 256-bit ones start, and
Zen 5 and Intel's AVX-512 cores two (the estimates, fitted on Zen 5, took the direct conv for
cnn's 16->32 and 32->64 3x3 layers, which Winograd runs 1.3-1.8x faster on Zen 4). It times
loops of independent multiply-adds of the widest and of half-width vectors and compares them
per instruction; it never compiles anything else.
"""

from __future__ import annotations

import ctypes
import functools
import time

import llvmlite.binding as llvm

from .process import initialize, llvm_lock

HALF_WIDTH_PORTS = 2
"""Multiply-adds of half the widest vectors a cycle: two FMA pipes, on every x86 core with
FMA since Haswell and Zen 1 (the estimate's constant; a core with one would be measured as
running its widest vectors at half that too)."""

CHAINS = 12
"""Independent accumulators a loop step updates: more than two pipes x four cycles of FMA
latency, so the loop measures issue rate, not latency."""

STEPS = 20000


def _loop(name: str, lanes: int) -> str:
    """LLVM IR of `void name(ptr acc, i64 steps)`: CHAINS accumulators of `lanes` floats
    (each starting from its own vector of `acc`, so none is another's copy), each step one
    llvm.fma per accumulator."""
    vt = f"<{lanes} x float>"
    body = []
    for k in range(CHAINS):
        body.append(f"  %a{k} = phi {vt} [ %s{k}, %entry ], [ %b{k}, %loop ]")
    for k in range(CHAINS):
        body.append(f"  %b{k} = call {vt} @llvm.fma.v{lanes}f32({vt} %a{k}, {vt} %x, {vt} %y)")
    starts = [f"  %r{k} = getelementptr {vt}, ptr %p, i64 {k}\n"
              f"  %s{k} = load {vt}, ptr %r{k}, align 4" for k in range(CHAINS)]
    stores = [f"  %q{k} = getelementptr {vt}, ptr %p, i64 {k}\n"
              f"  store {vt} %b{k}, ptr %q{k}, align 4" for k in range(CHAINS)]
    return (f"declare {vt} @llvm.fma.v{lanes}f32({vt}, {vt}, {vt})\n"
            f"define void @{name}(ptr %p, i64 %n) {{\nentry:\n"
            f"  %x = load {vt}, ptr %p, align 4\n"
            f"  %yp = getelementptr {vt}, ptr %p, i64 1\n"
            f"  %y = load {vt}, ptr %yp, align 4\n" + "\n".join(starts) +
            "\n  br label %loop\nloop:\n"
            "  %i = phi i64 [ 0, %entry ], [ %j, %loop ]\n" + "\n".join(body) +
            "\n  %j = add i64 %i, 1\n  %c = icmp ult i64 %j, %n\n"
            "  br i1 %c, label %loop, label %done\ndone:\n" + "\n".join(stores) +
            "\n  ret void\n}\n")


@functools.cache
def widest_fma_ports(cpu: str, features: str, vector_bits: int) -> int:
    """Multiply-adds of `vector_bits`-wide vectors this machine (CPU `cpu` with `features`)
    starts a cycle: HALF_WIDTH_PORTS where the widest vectors' loop runs as fast per
    instruction as the half-width one's, 1 where it takes about twice as long (the fastest of
    five runs each, CPU time)."""
    lanes = vector_bits // 32
    if lanes < 8:   # no half width worth comparing (SSE): the estimate's constant
        return HALF_WIDTH_PORTS
    initialize()
    with llvm_lock():
        tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=cpu, features=features, opt=2)
        module = llvm.parse_assembly(_loop("full", lanes) + _loop("half", lanes // 2))
        module.triple, module.data_layout = tm.triple, str(tm.target_data)
        engine = llvm.create_mcjit_compiler(module, tm)
        engine.finalize_object()
        kind = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
        loops = {n: kind(engine.get_function_address(n)) for n in ("full", "half")}
    buffer = (ctypes.c_float * (lanes * CHAINS))(*([1.0] * lanes * CHAINS))
    best = dict.fromkeys(loops, float("inf"))
    for _ in range(5):
        for name, fn in loops.items():
            start = time.process_time()
            fn(ctypes.addressof(buffer), STEPS)
            best[name] = min(best[name], time.process_time() - start)
    with llvm_lock():
        engine.close()
    return 1 if best["full"] > 1.5 * best["half"] else HALF_WIDTH_PORTS
