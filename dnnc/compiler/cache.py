"""The compile cache: compiled models kept on disk, so compiling the same model again (in
another process, another day) loads what the first compile made instead of compiling it anew.

    key(model, input_shapes, target, machine, options, tuned) -> str | None
    lookup(key) -> artifact.Restored | None   (the driver makes the CompiledModel)
    store(key, model) -> None

An entry is an artifact (`CompiledModel.save`, docs/artifacts.md) named by the SHA-256 of
everything the compiled code depends on: the model's bytes (an ONNX file with its external
data files, a ModelProto, or a Graph's canonical form), the target and the machine it compiles
for (CPU name, features, threads), the options that change code (opt level, input shapes, the
tuning configs applied, outputs), and the versions of dnnc (the hash of its own source files,
so an edited checkout never loads code an older one made), LLVM, NumPy and ONNX. Anything
else a compile takes (progress) does not change its code; a compile that stops its passes
early or dumps IR (`passes`, `dump_ir`: debugging) or only renders is never cached.

Where: $DNNC_CACHE_DIR/models, else $XDG_CACHE_HOME/dnnc/models, else ~/.cache/dnnc/models.
Entries are written atomically (a temporary file renamed over the name), so a process reading
an entry sees none or all of it, and two processes compiling one model at once both end with
a whole entry. A hit refreshes the entry's time; after a store, the least recently used
entries go until the folder holds at most $DNNC_CACHE_MAX_BYTES (default 2 GiB). An entry that
cannot be loaded (corrupt, another machine) is removed and the model compiled; a folder that
cannot be written costs only the caching. `dnnc.compile(..., cache=False)` and
`dnnc compile --no-cache` skip it; `DNNC_CACHE=0` turns it off for a process.

Only targets whose compile is worth keeping are cached (their registry entry's `cached`: the
targets that generate code); compiles shorter than `MIN_STORE_SECONDS` are not stored (loading
one would cost as much). This module never imports `module.py` or the driver, which use it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from pathlib import Path

from ..backends.registry import REGISTRY
from ..errors import DNNCError
from ..ir.graph import Graph
from .artifact import Restored, graph_to_doc, restore, save

SCHEMA = 1
MIN_STORE_SECONDS = 0.5
DEFAULT_MAX_BYTES = 2 << 30
SUFFIX = ".dnnc"

logger = logging.getLogger("dnnc")


def enabled(cache: bool) -> bool:
    return cache and os.environ.get("DNNC_CACHE", "1") not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    root = os.environ.get("DNNC_CACHE_DIR")
    if root:
        return Path(root) / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "dnnc" / "models"


def max_bytes() -> int:
    try:
        return int(os.environ.get("DNNC_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


@functools.cache
def _versions(target: str) -> str:
    """dnnc's source (every .py file of the package, by content), the versions of the
    libraries `target`'s code comes from (its registry entry's `versions`), NumPy and ONNX."""
    import numpy
    import onnx

    h = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for file in sorted(package.rglob("*.py")):
        h.update(str(file.relative_to(package)).encode())
        h.update(file.read_bytes())
    return json.dumps([h.hexdigest(), *REGISTRY[target].versions(), numpy.__version__,
                       onnx.__version__])


def key(model, input_shapes, target: str, machine, options: dict, tuned) -> str | None:
    """The entry's name for this compile, or None where the model's bytes cannot be read
    (the compile then reports the error itself)."""
    h = hashlib.sha256()
    for part in (f"dnnc-compile-cache {SCHEMA}", _versions(target), target,
                 *(_stable(x) for x in (machine, options, tuned, input_shapes))):
        h.update(part.encode())
        h.update(b"\0\1")   # separator: no two tuples of parts hash alike
    try:
        _model_digest(model, h)
    except (OSError, ValueError, TypeError):
        return None
    return h.hexdigest()


def _stable(x) -> str:
    """`x` as text that is the same in every process: dataclasses as their fields, sets
    sorted (a frozenset's repr follows the process's string hashing)."""
    def plain(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, dict):
            return {str(k): plain(w) for k, w in v.items()}
        if isinstance(v, (set, frozenset)):
            return sorted((plain(w) for w in v), key=repr)
        if isinstance(v, (list, tuple)):
            return [plain(w) for w in v]
        return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)

    return json.dumps(plain(x), sort_keys=True)


def _model_digest(model, h) -> None:
    import onnx

    if isinstance(model, Graph):
        doc, tensors = graph_to_doc(model)
        h.update(json.dumps(doc, sort_keys=True).encode())
        for array in tensors:
            h.update(f"{array.dtype.str}{array.shape}".encode())
            h.update(memoryview(array.tobytes() if not array.flags.c_contiguous else array)
                     .cast("B"))
        return
    if isinstance(model, onnx.ModelProto):
        h.update(model.SerializeToString())
        return
    if isinstance(model, (bytes, bytearray, memoryview)):
        h.update(model)
        return
    path = Path(os.fspath(model))
    data = path.read_bytes()
    h.update(data)
    # weights in external data files are part of the model: hash each file it names
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    if b"location" not in data:   # every external tensor names its file under this key
        return
    proto = onnx.load_model_from_string(data)
    for location in sorted({entry.value for t in _get_all_tensors(proto)
                            if uses_external_data(t)
                            for entry in t.external_data if entry.key == "location"}):
        h.update(location.encode())
        h.update((path.parent / location).read_bytes())


def _entry(name: str) -> Path:
    return cache_dir() / (name + SUFFIX)


def lookup(name: str) -> Restored | None:
    """The model cached under `name` (its parts, `artifact.restore`'s), or None. An entry
    that fails to load is removed (with a warning) so the next compile replaces it."""
    entry = _entry(name)
    if not entry.is_file():
        return None
    try:
        model = restore(entry, progress=False)
    except (DNNCError, OSError) as exc:
        logger.warning("compile cache: dropped an entry that does not load (%s)", exc)
        _remove(entry)
        return None
    try:
        os.utime(entry)
    except OSError:
        pass
    return model


def store(name: str, model) -> None:
    """Keep `model` under `name`, then trim the folder to its size bound."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        save(model, _entry(name))
    except (DNNCError, OSError) as exc:
        logger.debug("compile cache: not stored (%s)", exc)
        return
    trim(folder, max_bytes())


def trim(folder: Path, limit: int) -> None:
    """Remove the least recently used entries until `folder` holds at most `limit` bytes."""
    entries = []
    for path in folder.glob("*" + SUFFIX):
        try:
            st = path.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        _remove(path)
        total -= size


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def clear() -> int:
    """Remove every entry; the count removed."""
    removed = 0
    for path in cache_dir().glob("*" + SUFFIX):
        _remove(path)
        removed += 1
    return removed
