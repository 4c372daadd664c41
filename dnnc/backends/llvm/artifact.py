"""The `llvm` target's artifact codec: what its runtime adds to an artifact's manifest (the
triple, CPU name and features the code was compiled for, threads, opt level, precision, the
features its tile products need (`tiles`), tuned configs, the plan, one entry per compiled
specialisation) and members (`segments/K.o`, the object code MCJIT ran; `.ll` and `.loop`,
its LLVM IR and loop IR for `source()` after a load), the checks a load makes before it
trusts them (another architecture, CPU features this machine lacks, bf16 products on AMX
tiles or AVX512_BF16 where this machine has neither), and the runtime rebuilt from them
without passes or lowering. `compiler/artifact.py` owns the container; the registry names
these three functions as the target's `ArtifactCodec`.

llvmlite is imported when a function runs, never on import: listing the targets needs none.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ...errors import ArgumentError, ArtifactError
from ...ir.graph import Graph
from ...ir.target import Target
from .amx import tile_features
from .bf16 import BF16_FEATURES, PRECISIONS
from ..manifest import (MAX_ARENA, MAX_SLOTS, check_segments, check_tuned, export_tuned,
                        is_int, need, strs, type_doc, type_from)


def export(runtime, manifest: dict, files: dict) -> None:
    import llvmlite.binding as llvm

    target = runtime.target
    manifest["target"] = {
        "name": target.name, "triple": llvm.get_process_triple(), "cpu": target.cpu,
        "features": sorted(target.feature_set), "feature_string": target.features,
        "threads": runtime.threads, "opt_level": runtime.opt_level,
        "precision": target.precision, "tiles": sorted(tile_features(target))}
    export_tuned(runtime, manifest["target"])
    manifest["plan"] = runtime.plan()
    segments = []
    for k, image in enumerate(runtime.images()):
        base = f"segments/{k}"
        files[f"{base}.o"] = image.object_code
        entry = {"step": image.step, "shapes": [list(s) for s in image.shapes],
                 "escaping": [type_doc(t) for t in image.escaping_types],
                 "consts": [list(c) for c in image.consts], "n_inputs": image.n_inputs,
                 "slots": image.slots, "arena_bytes": image.arena_bytes,
                 "entry": image.entry, "object": f"{base}.o",
                 "values": [[i, list(v)] for i, v in image.values],
                 "kernels": image.kernel_count}
        if image.llvm_ir:
            files[f"{base}.ll"] = image.llvm_ir.encode()
            entry["llvm_ir"] = f"{base}.ll"
        if image.loop_ir:
            files[f"{base}.loop"] = image.loop_ir.encode()
            entry["loop_ir"] = f"{base}.loop"
        segments.append(entry)
    manifest["segments"] = segments


def check(manifest: dict, path) -> None:
    """Refuse a manifest with numbers of the wrong type or range, and code this machine
    cannot run: another architecture, or CPU features it lacks. The features are the `+`
    ones of the complete feature string the code was compiled with (`Target.features`), so
    they include those the CPU name implies."""
    import llvmlite.binding as llvm

    from .cpu import host_target

    try:
        _check_manifest(manifest)
    except ArtifactError as exc:
        raise ArtifactError(f"{path}: {exc}") from None
    target = manifest["target"]
    try:
        compiled_for = Target(target["name"], target["cpu"], target["feature_string"])
    except ArgumentError:   # a feature without its sign
        compiled_for = None
    if compiled_for is None or target["features"] != sorted(compiled_for.feature_set):
        raise ArtifactError(f"{path}: the manifest's feature list disagrees with its feature "
                            f"string")
    triple = llvm.get_process_triple()
    if target["triple"].split("-")[0] != triple.split("-")[0]:
        raise ArtifactError(f"{path}: compiled for {target['triple']}, this machine is "
                            f"{triple}")
    host = host_target()
    missing = sorted(set(target["features"]) - host.feature_set)
    tiles = sorted(set(target.get("tiles", ())) - host.feature_set)
    if tiles:
        raise ArtifactError(
            f"{path}: compiled at precision {target.get('precision')} for CPU "
            f"{target['cpu']}, whose products run on AMX tiles (tdpbf16ps); this machine "
            f"({host.cpu}) lacks {', '.join(tiles)} (or Linux refuses this process the tile "
            f"state): recompile the model here with precision='bf16' (vdpbf16ps where the "
            f"CPU has AVX512_BF16, else fp32 FMAs of the same bf16-rounded operands)")
    bf16 = target.get("precision") == "bf16" and BF16_FEATURES & set(missing)
    if bf16:
        raise ArtifactError(
            f"{path}: compiled at precision bf16 for CPU {target['cpu']}, whose products run "
            f"on AVX512_BF16 (vdpbf16ps); this machine ({host.cpu}) lacks "
            f"{', '.join(sorted(bf16))}: recompile the model here with precision='bf16' "
            f"(the same bf16-rounded operands through fp32 FMAs)")
    if missing:
        raise ArtifactError(
            f"{path}: compiled for CPU {target['cpu']} with feature(s) this machine "
            f"({host.cpu}) lacks: {', '.join(missing)}; recompile the model here "
            f"(dnnc compile ..., or --mcpu/--mattr for a common subset)")


def _check_manifest(manifest: dict) -> None:
    """Every field the llvm target reads, checked for type and range before it is used."""
    target = manifest.get("target")
    need(type(target) is dict and all(type(target.get(k)) is str
                                      for k in ("triple", "cpu", "feature_string")) and
         strs(target.get("features")) and is_int(target.get("threads"), 1, 1 << 16) and
         is_int(target.get("opt_level"), 0, 3) and
         target.get("precision", "fp32") in PRECISIONS and
         strs(target.get("tiles", [])), "target")
    check_tuned(target)
    check_segments(manifest, _segment)


def _segment(e: dict, what: str) -> list:
    """An llvm segment entry's own fields; its member files."""
    need(is_int(e.get("n_inputs"), 0, MAX_SLOTS) and is_int(e.get("slots"), 0, MAX_SLOTS),
         what + " slots")
    need(is_int(e.get("arena_bytes"), 0, MAX_ARENA), what + " arena_bytes")
    need(type(e.get("entry")) is str and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*",
                                                      e["entry"]) is not None,
         what + " entry")
    return [e.get("object")] + [e[m] for m in ("llvm_ir", "loop_ir") if m in e]


def restore(spec, graph: Graph, manifest: dict, read, progress):
    from .executable import LLVMRuntime, SegmentImage
    from .cpu import host_target

    target = manifest["target"]
    # the CPU the code was compiled for, on this machine's threads (a shape compiled after
    # the load is scheduled for them)
    machine = spec.target(
        replace(host_target(), cpu=target["cpu"], features=target["feature_string"]),
        target.get("precision", "fp32"))   # (older artifacts: fp32, the only one there was)
    images = []
    for entry in manifest["segments"]:
        images.append(SegmentImage(
            step=entry["step"], shapes=tuple(tuple(s) for s in entry["shapes"]),
            escaping_types=[type_from(t) for t in entry["escaping"]],
            consts=[tuple(c) for c in entry["consts"]], n_inputs=entry["n_inputs"],
            slots=entry["slots"], arena_bytes=entry["arena_bytes"], entry=entry["entry"],
            object_code=read(entry["object"]),
            llvm_ir=read(entry["llvm_ir"]).decode() if "llvm_ir" in entry else "",
            loop_ir=read(entry["loop_ir"]).decode() if "loop_ir" in entry else "",
            values=tuple((i, tuple(v)) for i, v in entry.get("values", [])),
            kernel_count=entry.get("kernels", 0)))
    return LLVMRuntime.restore(graph, manifest["plan"], images, machine,
                               opt_level=target["opt_level"], progress=progress,
                               tuned=target.get("tuned"))


