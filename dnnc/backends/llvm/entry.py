"""The `llvm` target's registry entry (`backends/registry.py`): its `TargetSpec` and the
functions it names, the runtime factory among them. Cheap to import: llvmlite is imported when
a function here runs, so listing the targets loads none of it."""

from __future__ import annotations

import importlib.util

from ...ir.target import Target
from ..target_spec import ArtifactCodec, TargetSpec, lazy
from . import FUSION, amx, artifact, bf16, panels


def runtime(graph, opt_level: int, target: Target, progress=None, reuse_memory=True,
            cache_size=None, tuned=None, render_only=False, outputs=None):
    """An `LLVMRuntime` for `graph` (the passes ran), its static shapes compiled (`start`).
    render_only changes nothing here: the CPU that compiles is the one that runs; outputs
    can only be "numpy" (`check_options`), what it returns anyway."""
    from .executable import DEFAULT_CACHE_SIZE, LLVMRuntime

    return LLVMRuntime(graph, target=target, opt_level=opt_level, progress=progress,
                       reuse_memory=reuse_memory, tuned=tuned,
                       cache_size=DEFAULT_CACHE_SIZE if cache_size is None else cache_size).start()


def available() -> bool:
    return importlib.util.find_spec("llvmlite") is not None


def host() -> Target:
    from .cpu import host_target

    return host_target()


def versions() -> tuple[str, ...]:
    import llvmlite
    from llvmlite import binding

    return llvmlite.__version__, ".".join(map(str, binding.llvm_version_info))


def cpu_from(mcpu: str | None, mattr: str | None) -> Target:
    from .cpu import cpu_from

    return cpu_from(mcpu, mattr)


def half_arithmetic(machine: Target) -> tuple[str, ...]:
    """The half types the llvm templates compute in on `machine`: none yet, whatever its
    features (a float16 value reaches the generic loops only, which convert each element:
    61x onnxruntime's time on a float16 resnet18), so a half ONNX file is computed in float32
    (passes/widen_half.py). A template computing in a half type adds it here where
    `machine.feature_set` has the instructions it needs."""
    return ()


def file_precision(machine: Target, graph) -> str | None:
    """"bf16" for a bfloat16 file (most of its weights' elements bfloat16, as torch's
    `.bfloat16()` exports write them) on a CPU with vdpbf16ps (`bf16.BF16_FEATURES`): its
    products then take bf16 operands, the file's own type, on the bf16 templates (its weights,
    bfloat16 already, pack exactly); elsewhere None: fp32, the file widened to float32 once
    (passes/widen_half.py). A float16 file stays fp32: x86 has no product of float16 operands
    accumulating in fp32 before AVX10.2's vdpphps (AVX512-FP16's accumulate in float16)."""
    if not bf16.BF16_FEATURES <= machine.feature_set:
        return None
    held = {}   # elements of float constants by type (a value read twice counted once)
    for v in {id(v): v for node in graph.nodes for v in node.inputs
              if v is not None and v.const is not None}.values():
        held[v.dtype.name] = held.get(v.dtype.name, 0) + int(v.const.size)
    if held.get("bfloat16", 0) > held.get("float32", 0) + held.get("float16", 0):
        return "bf16"
    return None


LAYOUTS = ("sparse_weights", "winograd_conv", "pack_dense", "pack_conv")
"""convert_layout's rewrites for llvm: products whose weights are sparse enough as sparse ops
(CSR), 3x3 convs Winograd's where its rule takes them, else dense and conv weights packed
into the micro-kernels' panels."""


def layouts(machine: Target, precision: str) -> tuple[str, ...]:
    """LAYOUTS, but no Winograd where `precision`'s products run on AMX tiles on `machine`
    (`amx_conv` takes the 3x3 convs there; a Winograd conv's products are vdpbf16ps'): where
    `machine` has the features amx_conv's template asks for (`amx.AMX_FEATURES`), the test
    the template table makes, whatever the renderer then emits for a tile product."""
    if precision == "bf16" and amx.AMX_FEATURES <= machine.feature_set:
        return tuple(name for name in LAYOUTS if name != "winograd_conv")
    return LAYOUTS


def about() -> str:
    if not available():
        return "needs llvmlite (pip install llvmlite)"
    import llvmlite
    import llvmlite.binding

    llvm = ".".join(map(str, llvmlite.binding.llvm_version_info))
    return f"llvmlite {llvmlite.__version__}, LLVM {llvm}"


SPEC = TargetSpec(
    "llvm", "native code for this CPU through LLVM", runtime, returns=("numpy",),
    options=("cpu", "passes", "dump_ir", "cache_size", "tuning_log", "precision"),
    # bf16: dense products on bf16-rounded operands, fp32 accumulation (docs/llvm_backend.md)
    precisions=bf16.PRECISIONS,
    emits={"llvm-ir": ".ll", "asm": ".s", "loop": ".loop"}, source_aliases=("llvm",),
    codec=ArtifactCodec(artifact.export, artifact.check, artifact.restore), cached=True,
    runs_passes=True, machine=host,
    layouts=LAYOUTS, layouts_for=layouts, fusion=lambda: FUSION, panels=panels,
    templates=lazy(f"{__package__}.schedules", "TEMPLATES"),
    tuning=lazy(f"{__package__}.tuning"), speed=10, available=available, about=about,
    versions=versions, cpu_from=cpu_from, half_arithmetic=half_arithmetic,
    file_precision=file_precision)
