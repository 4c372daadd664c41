"""Artifacts: a CompiledModel saved as one self-contained file, and restored from it.

The file is a zip archive (see docs/artifacts.md):

    manifest.json        format and dnnc versions, target and what its codec records (the
                         machine the code is for, opt level, the plan of steps, one entry per
                         compiled specialisation, tuned configs), input/output signature with
                         symbolic dims, tuning provenance, the compile's stats, every member's
                         SHA-256
    graph.json           the optimised graph: values, nodes, attributes (DType values and
                         nested Graphs of control flow included), subgraphs, fusion groups
    tensors/K.npy        constants and tensor attributes, referenced from graph.json by K
    segments/...         the target's code, as its codec writes it: llvm `K.o` (the object
                         MCJIT ran) with `.ll` and `.loop` (its LLVM IR and loop IR, for
                         `source()` after a load); cuda `K.cu` and `K.cubin` with `.loop`

Loading checks before it trusts, and refuses with an `ArtifactError` naming what is wrong: a
file of another format or dnnc version, a manifest field of the wrong type or range, a member
whose size is impossible or whose SHA-256 differs from the manifest's, and whatever the
target's codec refuses (llvm: another architecture, code needing CPU features this machine
lacks, an object file that is malformed or for another machine, `backends/llvm/objfile.py`,
code whose compiled-in layout digest disagrees with the manifest and graph; cuda: no GPU, a
precision without tensor cores). Then it rebuilds the graph and the target's runtime from the
stored plan and code, without running passes or lowering. None of this makes a deliberately
crafted file safe: an artifact is native code, to be loaded from trusted sources only
(docs/artifacts.md). A shape not seen before the save is compiled from the stored graph on
first use, as after `dnnc.compile`.

This module owns the container (members, checksums, the graph document); each target's part
is its registry entry's `ArtifactCodec`, in the target's package (`backends/<target>/
artifact.py`, with the checks they share in `backends/manifest.py`). `restore` gives the
parts of a model; `CompiledModel` (`module.py`) is made from them there. It must never import
a frontend, nor a module of the compiler above it (module, driver, cli).
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
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np

from ..backends.manifest import type_doc
from ..backends.registry import REGISTRY
from ..errors import ArtifactError, DNNCError
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import SymDim
from ..ir.types import DType, TensorType
from ..version import __version__
from .arguments import check_path

FORMAT = "dnnc-artifact"
FORMAT_VERSION = 2
MAGIC = b"PK\x03\x04"  # a zip archive

# Declared sizes a load accepts before reading anything: a deflated member may inflate
# ~1000x, so the JSON and IR texts are capped instead of trusted (a zip bomb stops here)
_MAX_MANIFEST = 64 << 20
_MAX_TEXT = 1 << 30


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
        if g.aliases:   # output position -> the input it is written into (as text keys)
            doc["aliases"] = {str(k): i for k, i in sorted(g.aliases.items())}
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
        g.aliases = {int(k): i for k, i in doc.get("aliases", {}).items()}
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
# Save and load


STATS = ("kernels", "host_fallback_ops", "compile_seconds", "nodes", "imported_nodes",
         "pass_seconds", "arena_bytes", "tuned_kernels", "precision", "naive_bytes",
         "live_lower_bound_bytes", "inplace_kernels", "workspace_bytes")
"""The compile's statistics an artifact keeps (a load reports them as the compile did; the
memory planner's figures too, which a restored specialisation, never planned, cannot give)."""


def save(model, path, *, mode: int | None = None, record: dict | None = None) -> None:
    """Write `model` (a CompiledModel) to `path` as one artifact file, atomically: a plain
    file (0666 less the umask), or of `mode`; `record`'s fields join the manifest (the
    compile cache's key, `cache.py`)."""
    check_path("path", path)
    savable = [name for name, spec in REGISTRY.items() if spec.codec is not None]
    if model.target not in savable:
        raise ArtifactError(f"target {model.target!r} cannot be saved; savable targets: "
                            f"{', '.join(savable)}")
    doc, blobs = graph_to_doc(model.graph)
    stats = model.stats
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "dnnc_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "inputs": [dict(name=v.name, **type_doc(v.type)) for v in model.graph.inputs],
        "outputs": [dict(name=v.name, **type_doc(v.type)) for v in model.graph.outputs],
        "tuning": dict(model.tuning) if getattr(model, "tuning", None) else
                  {"log": None, "records_applied": 0},
        "stats": {k: v for k, v in stats.items() if k in STATS},
        **(record or {}),
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
            # weights and machine code are stored, not deflated: loading stays a plain read;
            # texts are deflated (JSON, and the code texts the target emits: .ll, .cu, ...)
            texts = (".json", *REGISTRY[model.target].emits.values())
            for name, data in members.items():
                z.writestr(name, data, compress_type=deflate if name.endswith(texts)
                           else zipfile.ZIP_STORED)
        if mode is None:   # mkstemp makes it private; an artifact is a plain file
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp) if os.path.exists(tmp) else None
        raise ArtifactError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    except BaseException:
        os.unlink(tmp) if os.path.exists(tmp) else None
        raise


def read_manifest(path) -> dict:
    """The manifest of an artifact, checked for format and version, nothing loaded."""
    with _open(path, path) as archive:
        return _manifest(archive, path)


def _open(source, path) -> zipfile.ZipFile:
    """The archive of `source` (`path`, or a binary file open on it)."""
    try:
        return zipfile.ZipFile(source)
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
    version = __version__
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
    with _open(path, path) as archive:
        return _manifest(archive, path)["target"]["name"]


class Restored(NamedTuple):
    """A saved model's parts, as `restore` reads them back."""
    graph: Graph
    runtime: object          # the target's runtime, as its codec restored it
    target: str              # the target's name
    stats: dict              # the compile's stats, and `load_seconds`
    manifest: dict


def restore(path, *, progress: bool | None = None, file=None) -> Restored:
    """The parts of a model `CompiledModel.save` wrote (`dnnc.load` makes the CompiledModel);
    see the module docstring. `file`, a binary file open on `path`, is read instead of
    opening `path` again (the compile cache reads the file it checked)."""
    check_path("path", path)
    start = time.perf_counter()
    with _open(path if file is None else file, path) as archive:
        manifest = _manifest(archive, path)
        spec = REGISTRY[manifest["target"]["name"]]
        try:
            spec.codec.check(manifest, path)
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
            runtime = spec.codec.restore(spec, graph, manifest, read, progress)
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
    return Restored(graph, runtime, manifest["target"]["name"], stats, manifest)
