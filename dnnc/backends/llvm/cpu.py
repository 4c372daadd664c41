"""The CPU the llvm target compiles for, as an `ir.Target`: `host_target` probes this machine,
`cpu_from` describes another CPU (what --mcpu/--mattr say), and `llvm_cpu` turns a Target into
the CPU name and feature string LLVM is handed. It compiles no code itself (`fma_rate` times
the host's multiply-adds)."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from dataclasses import replace

import llvmlite.binding as llvm

from ...ir.target import Target
from .amx import TILE_DOTS, request_tile_state
from .fma_rate import widest_fma_ports
from .process import initialize
from .workers import ensure_pool

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
def _host_cpu() -> tuple[str, str]:
    """This machine's CPU name and complete feature string (asked once: LLVM's detection
    takes ~0.3 ms a call), without tiles Linux refuses it."""
    initialize()
    features = llvm.get_host_cpu_features().flatten()
    return llvm.get_host_cpu_name(), _without_refused_tiles(features)


def _without_refused_tiles(features: str) -> str:
    """`features` with the AMX ones turned off where the CPU has tiles but Linux refuses this
    process their state (`amx.request_tile_state`): a tile instruction would be a SIGILL."""
    tiles = {f for _, needs in TILE_DOTS.values() for f in needs}
    listed = features.split(",")
    if not any(f[1:] in tiles and f[0] == "+" for f in listed if f) or request_tile_state():
        return features
    return ",".join("-" + f[1:] if f[1:] in tiles else f for f in listed)


def host_target() -> Target:
    """This machine as the llvm target compiles for it: its CPU, every feature LLVM detects
    on the architecture (signed), the threads of the worker pool (started here) and its
    widest vectors' multiply-adds a cycle (measured once)."""
    name, features = _host_cpu()
    target = Target("llvm", name, features, threads=ensure_pool())
    return replace(target, fma_ports=widest_fma_ports(name, features, target.vector_bits))


def _levels() -> dict[str, tuple[str, ...]]:
    return CPU_LEVELS.get(llvm.get_process_triple().split("-")[0], _GENERIC)


def feature_names() -> frozenset[str]:
    """Every ISA feature LLVM detects on this architecture (the host's list names them all,
    present or not)."""
    return frozenset(f[1:] for f in _host_cpu()[1].split(",") if f)


def cpu_from(name: str | None = None, mattr: str | None = None) -> Target:
    """The Target to compile for CPU `name` (what --mcpu/--mattr say), with a complete feature
    list and this machine's threads. `name` is this machine's CPU (the default) or a level of
    `CPU_LEVELS` (x86-64-v3, ...), whose features dnnc knows; `mattr` ("+avx2,-avx512f")
    edits those. Any other CPU name LLVM knows only tunes the code
    and needs `mattr`, the whole list of features it may use. Raises ValueError for an
    unknown CPU or feature name instead of letting LLVM abort the process."""
    host = host_target()
    known = feature_names()
    levels = _levels()
    baseline = levels[next(iter(levels))]
    features: dict[str, str] = {}
    if name is None or name == host.cpu:
        name = host.cpu
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
                f"{', '.join(levels)} (this machine: {host.cpu})")
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
    target = replace(host, cpu=name, features=",".join(sign + f for f, sign in features.items()))
    if (name, target.vector_bits) != (host.cpu, host.vector_bits):   # not what was measured
        target = replace(target, fma_ports=Target.fma_ports)
    return target


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
                         f"{', '.join(_levels())} (this machine: {_host_cpu()[0]})")
    _known_cpu_names.add(name)


def llvm_cpu(target: Target) -> tuple[str, str]:
    """The CPU name and feature string to hand LLVM. Features the string does not mention
    are turned off, so the name cannot add any (the baseline's stay: LLVM needs them); a
    name not checked in this process (from an artifact made elsewhere) is replaced by the
    baseline level, which changes tuning only."""
    levels = _levels()
    baseline = next(iter(levels))
    name = target.cpu
    if name not in levels and name not in _known_cpu_names and name != _host_cpu()[0]:
        name = baseline
    mentioned = {f[1:] for f in target.features.split(",") if f}
    off = sorted(feature_names() - mentioned - set(levels[baseline]))
    return name, ",".join(["-" + f for f in off] + ([target.features] if target.features
                                                     else []))
