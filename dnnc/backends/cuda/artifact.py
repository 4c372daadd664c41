"""The `cuda` target's artifact codec: what its runtime adds to an artifact's manifest (the
GPU architecture, opt level, output kind, precision, tuned configs, the plan, one entry per
compiled specialisation with its launches and the descriptions of the tensor maps they read,
never a map's bytes: they hold device addresses) and members (`segments/K.cu`, the CUDA C;
`.cubin`, what NVRTC made of it; `.loop`, the loop IR), the checks a load makes before it
trusts them, and the runtime rebuilt from them (a cubin for another architecture is rebuilt
from its source). `compiler/artifact.py` owns the container; the registry names these three
functions as the target's `ArtifactCodec`.

CuPy is imported when a function runs (`device.import_cupy`), never on import.
"""

from __future__ import annotations

import re

from ...errors import ArtifactError
from ...ir import loop as L
from ...ir.graph import Graph
from ...ir.target import PRECISIONS
from ..manifest import (MAX_ARENA, MAX_SLOTS, check_segments, check_tuned, export_tuned,
                        ints, is_int, need, type_doc, type_from)
from . import device
from .tensor_map import DATA_TYPES as TENSOR_MAP_TYPES


def export(runtime, manifest: dict, files: dict) -> None:
    manifest["target"] = {"name": runtime.target.name, "arch": runtime.target.arch,
                          "opt_level": runtime.opt_level, "outputs": runtime.outputs,
                          "precision": runtime.target.precision}
    export_tuned(runtime, manifest["target"])
    manifest["plan"] = runtime.plan()
    segments = []
    for k, image in enumerate(runtime.images()):
        base = f"segments/{k}"
        files[f"{base}.cu"] = image.source.encode()
        files[f"{base}.cubin"] = image.cubin
        entry = {"step": image.step, "shapes": [list(s) for s in image.shapes],
                 "values": [[i, list(v)] for i, v in image.values],
                 "kernels": image.kernel_count,
                 "escaping": [type_doc(t) for t in image.escaping_types],
                 "consts": [list(c) for c in image.consts], "n_inputs": image.n_inputs,
                 "arena_bytes": image.arena_bytes, "workspace_bytes": image.workspace_bytes,
                 "launches": [{"call": b.call, "name": b.name, "grid": list(b.grid),
                               "block": list(b.block), "shared_bytes": b.shared_bytes,
                               "args": [[kind, at] for kind, at in b.args]}
                              for b in image.launches],
                 "tensor_maps": [{"place": list(m.place), "dtype": m.dtype,
                                  "extents": list(m.extents), "strides": list(m.strides),
                                  "box": list(m.box),
                                  **({"im2col": list(m.im2col)} if m.im2col else {})}
                                 for m in image.tensor_maps],
                 "arch": image.arch, "source": f"{base}.cu", "cubin": f"{base}.cubin"}
        if image.loop_ir:
            files[f"{base}.loop"] = image.loop_ir.encode()
            entry["loop_ir"] = f"{base}.loop"
        segments.append(entry)
    manifest["segments"] = segments


def check(manifest: dict, path) -> None:
    """Refuse a manifest with fields of the wrong type or range, a machine without CuPy or a
    GPU (the `DeviceError` says which is missing), and a reduced precision on a GPU without
    its tensor cores."""
    try:
        _check_manifest(manifest)
    except ArtifactError as exc:
        raise ArtifactError(f"{path}: {exc}") from None
    device.import_cupy()
    precision = manifest["target"].get("precision", "fp32")
    if precision != "fp32" and not device.has_tensor_cores(device.gpu_arch()):
        raise ArtifactError(f"{path}: compiled at precision {precision}, for tensor cores of "
                            f"sm_{device.TENSOR_CORE_ARCH} and newer; this GPU is "
                            f"{device.gpu_arch()}")


_ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_manifest(manifest: dict) -> None:
    """Every field the cuda target reads, checked for type and range before it is used."""
    from .executable import OUTPUT_KINDS

    target = manifest.get("target")
    need(type(target) is dict and type(target.get("arch")) is str and
         _ARCH.fullmatch(target["arch"]) is not None and is_int(target.get("opt_level"), 0, 3)
         and target.get("outputs", "cupy") in OUTPUT_KINDS and
         target.get("precision", "fp32") in PRECISIONS, "target")
    check_tuned(target)
    check_segments(manifest, _segment)


def _segment(e: dict, what: str) -> list:
    """A cuda segment entry's own fields; its member files."""
    need(is_int(e.get("n_inputs"), 0, MAX_SLOTS), what + " n_inputs")
    need(is_int(e.get("arena_bytes"), 0, MAX_ARENA) and
         is_int(e.get("workspace_bytes"), 0, MAX_ARENA), what + " arena and workspace")
    need(type(e.get("arch")) is str and _ARCH.fullmatch(e["arch"]) is not None,
         what + " arch")
    need(type(e.get("launches")) is list and all(
        type(b) is dict and is_int(b.get("call"), 0, 1 << 20) and
        type(b.get("name")) is str and _SYMBOL.fullmatch(b["name"]) is not None and
        ints(b.get("grid"), 1, (1 << 31) - 1) and len(b["grid"]) == 3 and
        ints(b.get("block"), 1, 1024) and len(b["block"]) == 3 and
        is_int(b.get("shared_bytes"), 0, 1 << 20) and type(b.get("args")) is list and
        all(type(a) is list and len(a) == 2 and type(a[0]) is str and is_int(a[1], 0, MAX_ARENA)
            for a in b["args"])
        for b in e["launches"]), what + " launches")
    need(type(e.get("tensor_maps", [])) is list and all(
        type(m) is dict and type(m.get("place")) is list and len(m["place"]) == 2 and
        m["place"][0] in ("ext", "arena") and is_int(m["place"][1], 0, MAX_ARENA) and
        m.get("dtype") in TENSOR_MAP_TYPES and _map_fields(m)
        for m in e.get("tensor_maps", [])), what + " tensor maps")
    return [e.get("source"), e.get("cubin")] + [e[m] for m in ("loop_ir",) if m in e]


def _map_fields(m: dict) -> bool:
    """Whether a tensor map entry's extents, strides and box (and an im2col map's corners
    and traversal strides, `L.TensorMap.im2col`) have their rank's lengths and ranges."""
    im2col = m.get("im2col", [])
    rank = L.IM2COL_RANK if im2col else L.TMA_RANK
    spatial = rank - 2
    return all(ints(m.get(key), 1, 1 << 40) and len(m[key]) == size
               for key, size in (("extents", rank), ("strides", rank - 1),
                                 ("box", 2 if im2col else rank))) and \
        (not im2col or ints(im2col, -(1 << 15), 1 << 15) and len(im2col) == 3 * spatial)


def restore(spec, graph: Graph, manifest: dict, read, progress):
    from .executable import BoundLaunch, CUDARuntime, SegmentImage, TensorMapPlace

    target = manifest["target"]
    images = []
    for entry in manifest["segments"]:
        launches = [BoundLaunch(b["call"], b["name"], tuple(b["grid"]), tuple(b["block"]),
                                b["shared_bytes"], tuple((kind, at) for kind, at in b["args"]))
                    for b in entry["launches"]]
        images.append(SegmentImage(
            step=entry["step"], shapes=tuple(tuple(s) for s in entry["shapes"]),
            values=tuple((i, tuple(v)) for i, v in entry.get("values", [])),
            escaping_types=[type_from(t) for t in entry["escaping"]],
            consts=[tuple(c) for c in entry["consts"]], n_inputs=entry["n_inputs"],
            arena_bytes=entry["arena_bytes"], workspace_bytes=entry["workspace_bytes"],
            launches=launches, source=read(entry["source"]).decode(), arch=entry["arch"],
            cubin=read(entry["cubin"]),
            loop_ir=read(entry["loop_ir"]).decode() if "loop_ir" in entry else "",
            kernel_count=entry.get("kernels", 0),
            tensor_maps=[TensorMapPlace(tuple(m["place"]), m["dtype"], tuple(m["extents"]),
                                        tuple(m["strides"]), tuple(m["box"]),
                                        tuple(m.get("im2col", ())))
                         for m in entry.get("tensor_maps", [])]))
    # this machine's GPU: a cubin built for another architecture is rebuilt from its source
    return CUDARuntime.restore(graph, manifest["plan"], images,
                               # (older artifacts: fp32, the only precision there was)
                               spec.target(precision=target.get("precision", "fp32")),
                               opt_level=target["opt_level"], progress=progress,
                               tuned=target.get("tuned"),
                               outputs=target.get("outputs", "cupy"))   # older: the default


