"""Artifacts: a CompiledModel saved as one self-contained file, and loaded back.

The file is a zip archive (see docs/artifacts.md):

    manifest.json        format and dnnc versions, target (triple, CPU name and features,
                         threads, opt level), input/output signature with symbolic dims, the
                         plan of steps, one entry per compiled specialisation, tuning provenance
    graph.json           the optimised graph: values, nodes, attributes (DType values and
                         nested Graphs of control flow included), subgraphs
    tensors/K.npy        constants and tensor attributes, referenced from graph.json by K
    segments/K.o         object code of specialisation K (the object MCJIT ran when it was
                         compiled); .ll and .loop hold its LLVM IR and loop IR, for `source()`
                         after a load

Loading checks before it trusts, and refuses with an `ArtifactError` naming what is wrong: a
file of another format or dnnc version, a manifest field of the wrong type or range, a member
whose size is impossible or whose SHA-256 differs from the manifest's, another architecture,
code needing CPU features this machine lacks, an object file that is malformed or for another
machine (`backends/llvm/objfile.py`), and code whose compiled-in layout digest disagrees with
the manifest and graph (`executable.layout_digest`). Then it rebuilds the graph and the
target's runtime from the stored plan and object code, without running passes or lowering.
None of this makes a deliberately crafted file safe: an artifact is native code, to be loaded
from trusted sources only (docs/artifacts.md). A shape not seen before the save is
compiled from the stored graph on first use, as after `dnnc.compile`.

This module owns the file format; the target runtimes only describe themselves as plain data
(`LLVMRuntime.plan()`, `images()`, `restore()`). It must never import a frontend.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import platform
import re
import tempfile
import time
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np

from ..errors import ArgumentError, ArtifactError, DNNCError
from .arguments import check_path
from ..ir.graph import Graph, Node, Value
from ..ir.target import Target
from ..ir.types import DType, TensorType

FORMAT = "dnnc-artifact"
FORMAT_VERSION = 2
MAGIC = b"PK\x03\x04"  # a zip archive

# Declared sizes a load accepts before reading anything: a deflated member may inflate
# ~1000x, so the JSON and IR texts are capped instead of trusted (a zip bomb stops here)
_MAX_MANIFEST = 64 << 20
_MAX_TEXT = 1 << 30
# bounds of the manifest's numbers: past them a file is lying, not describing a model
_MAX_DIM = 1 << 40
_MAX_SLOTS = 1 << 20
_MAX_ARENA = 1 << 44


def _dnnc_version() -> str:
    from .. import __version__

    return __version__


def is_artifact(path) -> bool:
    """Whether `path` looks like a dnnc artifact (a zip archive) rather than an ONNX file."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Graph serialisation: one flat value table shared by the graph and its subgraphs (bodies read
# enclosing values directly), nodes referring to values by index, tensors as .npy blobs.


class _Writer:
    """Collects the tensor blobs a graph document refers to."""

    def __init__(self):
        self.blobs: list[np.ndarray] = []
        self.values: list[dict] = []
        self.index: dict[int, int] = {}

    def tensor(self, array: np.ndarray) -> int:
        self.blobs.append(array)
        return len(self.blobs) - 1

    def value(self, v: Value) -> int:
        k = self.index.get(id(v))
        if k is not None:
            return k
        entry = {"name": v.name, "dtype": v.type.dtype.name, "shape": list(v.type.shape)}
        if v.const is not None:
            entry["const"] = self.tensor(np.asarray(v.const))
        known = _encode_known(v.known)
        if known is not None:
            entry["known"] = known
        self.index[id(v)] = k = len(self.values)
        self.values.append(entry)
        return k

    def graph(self, g: Graph) -> dict:
        doc = {"name": g.name, "inputs": [self.value(v) for v in g.inputs], "nodes": []}
        for n in g.nodes:
            doc["nodes"].append({
                "op": n.op, "name": n.name,
                "inputs": [None if v is None else self.value(v) for v in n.inputs],
                "outputs": [self.value(v) for v in n.outputs],
                "attrs": {k: self.attr(a, f"{n.op} node {n.name!r} attribute {k!r}")
                          for k, a in n.attrs.items()}})
        doc["outputs"] = [self.value(v) for v in g.outputs]
        if g.groups is not None:   # fuse_ops' kernels, as node indices
            index = {id(n): k for k, n in enumerate(g.nodes)}
            doc["groups"] = [[index[id(n)] for n in group] for group in g.groups]
        return doc

    def attr(self, a, where: str):
        """Attribute values as JSON; what JSON cannot say exactly is tagged `{"$": kind}`."""
        if a is None or isinstance(a, (bool, str)):
            return a
        if isinstance(a, (int, np.integer)):
            return int(a)
        if isinstance(a, (float, np.floating)):
            a = float(a)
            return a if math.isfinite(a) else {"$": "float", "v": repr(a)}
        if isinstance(a, DType):
            return {"$": "dtype", "v": a.name}
        if isinstance(a, TensorType):
            return {"$": "type", "dtype": a.dtype.name, "shape": list(a.shape)}
        if isinstance(a, Graph):
            return {"$": "graph", "v": self.graph(a)}
        if isinstance(a, np.ndarray):
            return {"$": "tensor", "v": self.tensor(a)}
        if isinstance(a, bytes):
            return {"$": "bytes", "v": base64.b64encode(a).decode("ascii")}
        if isinstance(a, list):
            return [self.attr(x, where) for x in a]
        if isinstance(a, tuple):
            return {"$": "tuple", "v": [self.attr(x, where) for x in a]}
        if isinstance(a, dict) and all(isinstance(k, str) for k in a):
            return {"$": "dict", "v": {k: self.attr(x, where) for k, x in a.items()}}
        raise ArtifactError(f"cannot save {where}: values of type {type(a).__name__} have no "
                            f"serialised form")


def _encode_known(known) -> dict | None:
    """A known shape value (ints and SymDims) as JSON; None when it holds anything else."""
    from ..ir.ops.registry import SymDim

    if known is None:
        return None
    items = []
    for x in np.asarray(known, dtype=object).reshape(-1):
        if isinstance(x, SymDim):
            items.append({"sym": x.dim})
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            items.append(int(x))
        else:
            return None  # only an inference hint: dropping it loses nothing at run time
    return {"shape": list(np.shape(known)), "items": items}


def _decode_known(doc: dict) -> np.ndarray:
    from ..ir.ops.registry import SymDim

    items = [SymDim(x["sym"]) if isinstance(x, dict) else int(x) for x in doc["items"]]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(doc["shape"])


class _Reader:
    def __init__(self, doc: dict, tensor):
        self.tensor = tensor  # index -> np.ndarray
        self.values: list[Value] = []
        for entry in doc["values"]:
            dtype = DType.from_name(entry["dtype"])
            const = None
            if "const" in entry:
                const = _as_dtype(tensor(entry["const"]), dtype)
                if const.shape != tuple(entry["shape"]):
                    raise ValueError(f"constant {entry['name']!r} has shape {const.shape}, "
                                     f"its type says {tuple(entry['shape'])}")
            v = Value(entry["name"], TensorType(dtype, tuple(entry["shape"])), const)
            if "known" in entry:
                v.known = _decode_known(entry["known"])
            self.values.append(v)

    def graph(self, doc: dict) -> Graph:
        vals = self.values
        nodes = []
        for nd in doc["nodes"]:
            attrs = {k: self.attr(a) for k, a in nd["attrs"].items()}
            nodes.append(Node(nd["op"], [None if k is None else vals[k] for k in nd["inputs"]],
                              [vals[k] for k in nd["outputs"]], attrs, nd["name"]))
        g = Graph(doc["name"], [vals[k] for k in doc["inputs"]],
                  [vals[k] for k in doc["outputs"]], nodes)
        if "groups" in doc:
            groups = doc["groups"]
            if type(groups) is not list or not all(
                    type(gr) is list and gr and all(type(k) is int for k in gr)
                    for gr in groups) or \
                    sorted(k for gr in groups for k in gr) != list(range(len(nodes))):
                raise ValueError("its fusion groups do not cover every node once")
            g.groups = [[nodes[k] for k in gr] for gr in groups]
        return g

    def attr(self, a):
        if isinstance(a, list):
            return [self.attr(x) for x in a]
        if not isinstance(a, dict):
            return a
        kind = a["$"]
        if kind == "float":
            return float(a["v"])
        if kind == "dtype":
            return DType.from_name(a["v"])
        if kind == "type":
            return TensorType(DType.from_name(a["dtype"]), tuple(a["shape"]))
        if kind == "graph":
            return self.graph(a["v"])
        if kind == "tensor":
            return self.tensor(a["v"])
        if kind == "bytes":
            return base64.b64decode(a["v"])
        if kind == "tuple":
            return tuple(self.attr(x) for x in a["v"])
        if kind == "dict":
            return {k: self.attr(x) for k, x in a["v"].items()}
        raise ValueError(f"unknown attribute tag {kind!r}")


def _as_dtype(array: np.ndarray, dtype: DType) -> np.ndarray:
    return array if array.dtype == dtype.np else array.view(dtype.np)


def graph_to_doc(graph: Graph) -> tuple[dict, list[np.ndarray]]:
    """A graph as a JSON-able document and the tensors it refers to by index."""
    w = _Writer()
    body = w.graph(graph)
    return {"values": w.values, "graph": body}, w.blobs


def graph_from_doc(doc: dict, tensors) -> Graph:
    """The inverse of `graph_to_doc`; `tensors(k)` returns blob k."""
    return _Reader(doc, tensors).graph(doc["graph"])


def _npy(data: bytes) -> np.ndarray:
    """An array from .npy bytes whose header's shape and dtype must account for exactly the
    bytes that follow it (so a header cannot make the read allocate more)."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise ValueError(f".npy format version {version}")
    shape, _, dtype = read_header(f)
    if dtype.hasobject or math.prod(shape) * dtype.itemsize != len(data) - f.tell():
        raise ValueError(f".npy header ({dtype}, {shape}) does not match its "
                         f"{len(data) - f.tell()} data bytes")
    f.seek(0)
    return np.lib.format.read_array(f, allow_pickle=False)


def _npy_bytes(array: np.ndarray) -> bytes:
    array = np.asarray(array, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    if array.dtype == ml_dtypes.bfloat16:  # .npy has no bfloat16: stored as its bits
        array = array.view(np.uint16)
    if array.dtype.hasobject:
        raise ArtifactError(f"cannot save an object array of shape {array.shape}")
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Per-target parts: what a target's runtime adds to the manifest and archive, and how it comes
# back. The registry (targets.py) names them as each target's codec.


def numpy_export(runtime, manifest: dict, files: dict) -> None:
    manifest["target"] = {"name": runtime.target.name}


def numpy_restore(graph: Graph, manifest: dict, read, progress):
    from ..backends.numpy import NumpyRuntime
    from .targets import REGISTRY

    return NumpyRuntime(graph, REGISTRY[manifest["target"]["name"]].target())


def llvm_export(runtime, manifest: dict, files: dict) -> None:
    import llvmlite.binding as llvm

    target = runtime.target
    manifest["target"] = {
        "name": target.name, "triple": llvm.get_process_triple(), "cpu": target.cpu,
        "features": sorted(target.feature_set), "feature_string": target.features,
        "threads": runtime.threads, "opt_level": runtime.opt_level}
    _export_tuned(runtime, manifest["target"])
    manifest["plan"] = runtime.plan()
    segments = []
    for k, image in enumerate(runtime.images()):
        base = f"segments/{k}"
        files[f"{base}.o"] = image.object_code
        entry = {"step": image.step, "shapes": [list(s) for s in image.shapes],
                 "escaping": [_type_doc(t) for t in image.escaping_types],
                 "consts": [list(c) for c in image.consts], "n_inputs": image.n_inputs,
                 "slots": image.slots, "arena_bytes": image.arena_bytes,
                 "entry": image.entry, "object": f"{base}.o",
                 "values": [[i, list(v)] for i, v in image.values]}
        if image.llvm_ir:
            files[f"{base}.ll"] = image.llvm_ir.encode()
            entry["llvm_ir"] = f"{base}.ll"
        if image.loop_ir:
            files[f"{base}.loop"] = image.loop_ir.encode()
            entry["loop_ir"] = f"{base}.loop"
        segments.append(entry)
    manifest["segments"] = segments


def llvm_check(manifest: dict, path) -> None:
    """Refuse a manifest with numbers of the wrong type or range, and code this machine
    cannot run: another architecture, or CPU features it lacks. The features are the `+`
    ones of the complete feature string the code was compiled with (`Target.features`), so
    they include those the CPU name implies."""
    import llvmlite.binding as llvm

    from ..backends.llvm.cpu import host_target

    try:
        _check_llvm_manifest(manifest)
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
    if missing:
        raise ArtifactError(
            f"{path}: compiled for CPU {target['cpu']} with feature(s) this machine "
            f"({host.cpu}) lacks: {', '.join(missing)}; recompile the model here "
            f"(dnnc compile ..., or --mcpu/--mattr for a common subset)")


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ArtifactError(f"the manifest's {what} is malformed or out of range")


def _int(x, lo: int = 0, hi: int = _MAX_DIM) -> bool:
    return type(x) is int and lo <= x <= hi


def _ints(x, lo: int = 0, hi: int = _MAX_DIM) -> bool:
    return type(x) is list and all(_int(v, lo, hi) for v in x)


def _strs(x) -> bool:
    return type(x) is list and all(type(v) is str for v in x)


def _check_llvm_manifest(manifest: dict) -> None:
    """Every field the llvm target reads, checked for type and range before it is used."""
    target = manifest.get("target")
    _need(type(target) is dict and all(type(target.get(k)) is str
                                       for k in ("triple", "cpu", "feature_string")) and
          _strs(target.get("features")) and _int(target.get("threads"), 1, 1 << 16) and
          _int(target.get("opt_level"), 0, 3), "target")
    _check_tuned(target)
    _check_segments(manifest, _llvm_segment)


def _export_tuned(runtime, target: dict) -> None:
    """A tuning log's configs (task -> knobs), kept so that shapes compiled after a load are
    tuned as the compile was."""
    if runtime.tuned:
        target["tuned"] = {task: dict(config) for task, config in sorted(runtime.tuned.items())}


def _check_tuned(target: dict) -> None:
    tuned = target.get("tuned", {})
    # task -> {knob: value}; a value the template's space does not hold is refused when a
    # kernel is scheduled (ConfigError: the default is used), so only the types matter here
    _need(type(tuned) is dict and all(
        type(task) is str and type(config) is dict and
        all(type(k) is str and type(v) in (int, bool, str, float) for k, v in config.items())
        for task, config in tuned.items()), "target's tuned configs")


def _llvm_segment(e: dict, what: str) -> list:
    """An llvm segment entry's own fields; its member files."""
    _need(_int(e.get("n_inputs"), 0, _MAX_SLOTS) and _int(e.get("slots"), 0, _MAX_SLOTS),
          what + " slots")
    _need(_int(e.get("arena_bytes"), 0, _MAX_ARENA), what + " arena_bytes")
    _need(type(e.get("entry")) is str and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*",
                                                       e["entry"]) is not None,
          what + " entry")
    return [e.get("object")] + [e[m] for m in ("llvm_ir", "loop_ir") if m in e]


def _check_segments(manifest: dict, target_fields) -> None:
    """The plan, and each segment entry's fields every target stores (step, shapes, output
    types, constant slots, value key, member files); `target_fields(entry, what)` checks the
    target's own and returns the entry's member file names."""
    plan = manifest.get("plan")
    _need(type(plan) is list and all(
        type(e) is dict and len(e) == 1 and
        (_ints(e.get("segment"), 0, 1 << 40) or _int(e.get("host"), 0, 1 << 40))
        for e in plan), "plan")
    segments = manifest.get("segments")
    _need(type(segments) is list, "segments")
    files = manifest["files"]
    for k, e in enumerate(segments):
        what = f"segment entry {k}"
        _need(type(e) is dict and _int(e.get("step"), 0, len(plan) - 1) and
              "segment" in plan[e["step"]], what + " step")
        _need(type(e.get("shapes")) is list and all(_ints(s) for s in e["shapes"]),
              what + " shapes")
        _need(type(e.get("escaping")) is list and all(
            type(t) is dict and type(t.get("dtype")) is str and _ints(t.get("shape"))
            for t in e["escaping"]), what + " escaping types")
        _need(type(e.get("consts")) is list and all(_ints(c, 0, 1 << 20) and len(c) == 2
                                                    for c in e["consts"]), what + " consts")
        members = target_fields(e, what)
        _need(all(type(m) is str and m in files for m in members), what + " members")
        _need(type(e.get("values", [])) is list and all(
            type(v) is list and len(v) == 2 and _int(v[0], 0, 1 << 20) and
            _ints(v[1], -(1 << 63), (1 << 63) - 1) for v in e.get("values", [])),
            what + " values")


def llvm_restore(graph: Graph, manifest: dict, read, progress):
    from ..backends.llvm.executable import LLVMRuntime, SegmentImage
    from ..backends.llvm.cpu import host_target
    from .targets import REGISTRY

    target = manifest["target"]
    # the CPU the code was compiled for, on this machine's threads (a shape compiled after
    # the load is scheduled for them)
    machine = REGISTRY[target["name"]].target(
        replace(host_target(), cpu=target["cpu"], features=target["feature_string"]))
    images = []
    for entry in manifest["segments"]:
        images.append(SegmentImage(
            step=entry["step"], shapes=tuple(tuple(s) for s in entry["shapes"]),
            escaping_types=[_type_from(t) for t in entry["escaping"]],
            consts=[tuple(c) for c in entry["consts"]], n_inputs=entry["n_inputs"],
            slots=entry["slots"], arena_bytes=entry["arena_bytes"], entry=entry["entry"],
            object_code=read(entry["object"]),
            llvm_ir=read(entry["llvm_ir"]).decode() if "llvm_ir" in entry else "",
            loop_ir=read(entry["loop_ir"]).decode() if "loop_ir" in entry else "",
            values=tuple((i, tuple(v)) for i, v in entry.get("values", []))))
    return LLVMRuntime.restore(graph, manifest["plan"], images, machine,
                               opt_level=target["opt_level"], progress=progress,
                               tuned=target.get("tuned"))


def cuda_export(runtime, manifest: dict, files: dict) -> None:
    manifest["target"] = {"name": runtime.target.name, "arch": runtime.target.arch,
                          "opt_level": runtime.opt_level, "outputs": runtime.outputs,
                          "precision": runtime.target.precision}
    _export_tuned(runtime, manifest["target"])
    manifest["plan"] = runtime.plan()
    segments = []
    for k, image in enumerate(runtime.images()):
        base = f"segments/{k}"
        files[f"{base}.cu"] = image.source.encode()
        files[f"{base}.cubin"] = image.cubin
        entry = {"step": image.step, "shapes": [list(s) for s in image.shapes],
                 "values": [[i, list(v)] for i, v in image.values],
                 "escaping": [_type_doc(t) for t in image.escaping_types],
                 "consts": [list(c) for c in image.consts], "n_inputs": image.n_inputs,
                 "arena_bytes": image.arena_bytes, "workspace_bytes": image.workspace_bytes,
                 "launches": [{"call": b.call, "name": b.name, "grid": list(b.grid),
                               "block": list(b.block), "shared_bytes": b.shared_bytes,
                               "args": [[kind, at] for kind, at in b.args]}
                              for b in image.launches],
                 "arch": image.arch, "source": f"{base}.cu", "cubin": f"{base}.cubin"}
        if image.loop_ir:
            files[f"{base}.loop"] = image.loop_ir.encode()
            entry["loop_ir"] = f"{base}.loop"
        segments.append(entry)
    manifest["segments"] = segments


def cuda_check(manifest: dict, path) -> None:
    """Refuse a manifest with fields of the wrong type or range, a machine without CuPy or a
    GPU (the `DeviceError` says which is missing), and a reduced precision on a GPU without
    its tensor cores."""
    from ..backends.cuda import device

    try:
        _check_cuda_manifest(manifest)
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


def _check_cuda_manifest(manifest: dict) -> None:
    """Every field the cuda target reads, checked for type and range before it is used."""
    from ..backends.cuda.executable import OUTPUT_KINDS
    from ..ir.target import PRECISIONS

    target = manifest.get("target")
    _need(type(target) is dict and type(target.get("arch")) is str and
          _ARCH.fullmatch(target["arch"]) is not None and _int(target.get("opt_level"), 0, 3)
          and target.get("outputs", "cupy") in OUTPUT_KINDS and
          target.get("precision", "fp32") in PRECISIONS, "target")
    _check_tuned(target)
    _check_segments(manifest, _cuda_segment)


def _cuda_segment(e: dict, what: str) -> list:
    """A cuda segment entry's own fields; its member files."""
    _need(_int(e.get("n_inputs"), 0, _MAX_SLOTS), what + " n_inputs")
    _need(_int(e.get("arena_bytes"), 0, _MAX_ARENA) and
          _int(e.get("workspace_bytes"), 0, _MAX_ARENA), what + " arena and workspace")
    _need(type(e.get("arch")) is str and _ARCH.fullmatch(e["arch"]) is not None,
          what + " arch")
    _need(type(e.get("launches")) is list and all(
        type(b) is dict and _int(b.get("call"), 0, 1 << 20) and
        type(b.get("name")) is str and _SYMBOL.fullmatch(b["name"]) is not None and
        _ints(b.get("grid"), 1, (1 << 31) - 1) and len(b["grid"]) == 3 and
        _ints(b.get("block"), 1, 1024) and len(b["block"]) == 3 and
        _int(b.get("shared_bytes"), 0, 1 << 20) and type(b.get("args")) is list and
        all(type(a) is list and len(a) == 2 and type(a[0]) is str and _int(a[1], 0, _MAX_ARENA)
            for a in b["args"])
        for b in e["launches"]), what + " launches")
    return [e.get("source"), e.get("cubin")] + [e[m] for m in ("loop_ir",) if m in e]


def cuda_restore(graph: Graph, manifest: dict, read, progress):
    from ..backends.cuda.executable import BoundLaunch, CUDARuntime, SegmentImage
    from .targets import REGISTRY

    target = manifest["target"]
    images = []
    for entry in manifest["segments"]:
        launches = [BoundLaunch(b["call"], b["name"], tuple(b["grid"]), tuple(b["block"]),
                                b["shared_bytes"], tuple((kind, at) for kind, at in b["args"]))
                    for b in entry["launches"]]
        images.append(SegmentImage(
            step=entry["step"], shapes=tuple(tuple(s) for s in entry["shapes"]),
            values=tuple((i, tuple(v)) for i, v in entry.get("values", [])),
            escaping_types=[_type_from(t) for t in entry["escaping"]],
            consts=[tuple(c) for c in entry["consts"]], n_inputs=entry["n_inputs"],
            arena_bytes=entry["arena_bytes"], workspace_bytes=entry["workspace_bytes"],
            launches=launches, source=read(entry["source"]).decode(), arch=entry["arch"],
            cubin=read(entry["cubin"]),
            loop_ir=read(entry["loop_ir"]).decode() if "loop_ir" in entry else ""))
    # this machine's GPU: a cubin built for another architecture is rebuilt from its source
    return CUDARuntime.restore(graph, manifest["plan"], images,
                               # (older artifacts: fp32, the only precision there was)
                               REGISTRY[target["name"]].target(
                                   precision=target.get("precision", "fp32")),
                               opt_level=target["opt_level"], progress=progress,
                               tuned=target.get("tuned"),
                               outputs=target.get("outputs", "cupy"))   # older: the default


def no_check(manifest: dict, path) -> None:
    pass


def _type_doc(t: TensorType) -> dict:
    return {"dtype": t.dtype.name, "shape": list(t.shape)}


def _type_from(doc: dict) -> TensorType:
    return TensorType(DType.from_name(doc["dtype"]), tuple(doc["shape"]))


# ---------------------------------------------------------------------------------------------
# Save and load


STATS = ("kernels", "host_fallback_ops", "compile_seconds", "nodes", "imported_nodes",
         "pass_seconds", "arena_bytes", "tuned_kernels", "precision")
"""The compile's statistics an artifact keeps (a load reports them as the compile did)."""


def save(model, path) -> None:
    """Write `model` (a CompiledModel) to `path` as one artifact file, atomically."""
    from .targets import REGISTRY

    check_path("path", path)
    savable = [name for name, spec in REGISTRY.items() if spec.codec is not None]
    if model.target not in savable:
        raise ArtifactError(f"target {model.target!r} cannot be saved; savable targets: "
                            f"{', '.join(savable)}")
    doc, blobs = graph_to_doc(model.graph)
    stats = model.stats
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "dnnc_version": _dnnc_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "inputs": [dict(name=v.name, **_type_doc(v.type)) for v in model.graph.inputs],
        "outputs": [dict(name=v.name, **_type_doc(v.type)) for v in model.graph.outputs],
        "tuning": dict(model.tuning) if getattr(model, "tuning", None) else
                  {"log": None, "records_applied": 0},
        "stats": {k: v for k, v in stats.items() if k in STATS},
    }
    files: dict[str, bytes] = {}
    REGISTRY[model.target].codec.export(model.runtime, manifest, files)
    members = {"graph.json": json.dumps(doc, allow_nan=False).encode()}
    members.update((f"tensors/{k}.npy", _npy_bytes(array)) for k, array in enumerate(blobs))
    members.update(files)
    # what a load compares each member with: accidents the CRC-32 misses, and a member
    # swapped for one of another artifact
    manifest["files"] = {name: hashlib.sha256(data).hexdigest()
                         for name, data in members.items()}
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp",
                               dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w") as z:
            deflate = zipfile.ZIP_DEFLATED
            z.writestr("manifest.json", json.dumps(manifest, indent=1), compress_type=deflate)
            # weights and machine code are stored, not deflated: loading stays a plain read
            for name, data in members.items():
                z.writestr(name, data, compress_type=deflate if name.endswith(
                    (".json", ".ll", ".loop", ".cu")) else zipfile.ZIP_STORED)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; an artifact is a plain file
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp) if os.path.exists(tmp) else None
        raise ArtifactError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    except BaseException:
        os.unlink(tmp) if os.path.exists(tmp) else None
        raise


def read_manifest(path) -> dict:
    """The manifest of an artifact, checked for format and version, nothing loaded."""
    with _open(path) as archive:
        return _manifest(archive, path)


def _open(path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except OSError as exc:
        raise ArtifactError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise ArtifactError(f"{path}: not a dnnc artifact, or the file is corrupt or "
                            f"truncated ({exc})") from None


def _member(archive: zipfile.ZipFile, name: str, path, limit: int = _MAX_TEXT) -> bytes:
    """Member `name`, its declared sizes checked before it is read: a stored member must fit
    in the file, a deflated one inflate to at most `limit` bytes."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise ArtifactError(f"{path}: member {name} is missing") from None
    stored = info.compress_type == zipfile.ZIP_STORED
    archive.fp.seek(0, os.SEEK_END)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or \
            (stored and info.file_size != info.compress_size) or \
            (not stored and info.file_size > limit) or \
            info.header_offset + info.compress_size > archive.fp.tell():
        raise ArtifactError(f"{path}: member {name} declares {info.file_size:,} bytes "
                            f"({info.compress_size:,} compressed, method "
                            f"{info.compress_type}), which this file cannot hold")
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise ArtifactError(f"{path}: member {name} is corrupt ({exc})") from None


def _manifest(archive: zipfile.ZipFile, path) -> dict:
    from .targets import REGISTRY

    try:
        manifest = json.loads(_member(archive, "manifest.json", path, _MAX_MANIFEST))
    except KeyError:
        raise ArtifactError(f"{path}: not a dnnc artifact (no manifest.json)") from None
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, RecursionError) as exc:
        raise ArtifactError(f"{path}: the manifest is corrupt ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a dnnc artifact (format "
                            f"{manifest.get('format') if isinstance(manifest, dict) else '?'})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {manifest.get('format_version')}"
                            f", this dnnc reads version {FORMAT_VERSION}; recompile the model")
    # 0.x has no stable ABI between generated code and runtime: the versions must match
    version = _dnnc_version()
    if manifest.get("dnnc_version") != version:
        raise ArtifactError(f"{path}: written by dnnc {manifest.get('dnnc_version')}, this is "
                            f"dnnc {version}; recompile the model with this version")
    target = manifest.get("target")
    target = target.get("name") if type(target) is dict else None
    if target not in REGISTRY or REGISTRY[target].codec is None:
        raise ArtifactError(f"{path}: unknown target {target!r}")
    files = manifest.get("files")
    if type(files) is not dict or not all(
            type(h) is str and re.fullmatch("[0-9a-f]{64}", h) for h in files.values()):
        raise ArtifactError(f"{path}: the manifest's file list is malformed")
    return manifest


def _reader(archive: zipfile.ZipFile, manifest: dict, path):
    """`read(name)`: a member listed in the manifest, checked against its SHA-256 there."""
    files = manifest["files"]

    def read(name: str) -> bytes:
        if name not in files:
            raise ArtifactError(f"{path}: member {name} is not in the manifest's file list")
        data = _member(archive, name, path)
        if hashlib.sha256(data).hexdigest() != files[name]:
            raise ArtifactError(f"{path}: member {name} does not match its SHA-256 in the "
                                f"manifest (corrupt, or taken from another artifact)")
        return data

    return read


def target_of(path) -> str:
    """The name of the target artifact `path` was compiled for (its manifest checked as a
    load checks it, nothing else read): what the CLI asks before loading, to say at once
    that this machine cannot run it."""
    check_path("path", path)
    with _open(path) as archive:
        return _manifest(archive, path)["target"]["name"]


def load(path, *, progress: bool | None = None):
    """Restore a CompiledModel saved by `CompiledModel.save`; see the module docstring."""
    from .module import CompiledModel
    from .targets import REGISTRY

    check_path("path", path)
    start = time.perf_counter()
    with _open(path) as archive:
        manifest = _manifest(archive, path)
        codec = REGISTRY[manifest["target"]["name"]].codec
        try:
            codec.check(manifest, path)
        except KeyError as exc:
            raise ArtifactError(f"{path}: the manifest is corrupt (no {exc})") from None
        read = _reader(archive, manifest, path)
        try:
            doc = json.loads(read("graph.json"))

            def tensor(k: int) -> np.ndarray:
                if type(k) is not int:
                    raise ValueError(f"tensor reference {k!r}")
                return _npy(read(f"tensors/{k}.npy"))

            graph = graph_from_doc(doc, tensor)
            graph.verify()
            runtime = codec.restore(graph, manifest, read, progress)
        except ArtifactError as exc:
            if str(exc).startswith(f"{path}:"):
                raise
            raise ArtifactError(f"{path}: {exc}") from None
        except DNNCError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, EOFError, OSError,
                zipfile.BadZipFile, RuntimeError, AttributeError, OverflowError,
                MemoryError) as exc:
            raise ArtifactError(f"{path}: corrupt artifact ({type(exc).__name__}: {exc})") \
                from None
    stats = dict(manifest["stats"]) if type(manifest.get("stats")) is dict else {}
    stats["load_seconds"] = time.perf_counter() - start
    model = CompiledModel(graph, runtime, manifest["target"]["name"], stats)
    model.manifest = manifest
    return model
