"""The compile cache: compiled models kept on disk, so compiling the same model again (in
another process, another day) loads what the first compile made instead of compiling it anew.

    key(graph, target, machine, options, tuned) -> Key
    lookup(key) -> artifact.Restored | None   (the driver makes the CompiledModel)
    store(key, model) -> None
    Storer().request(key, model) -> None   (the same in a background thread; `wait()`)

An entry is an artifact (`CompiledModel.save`, docs/artifacts.md) named by the SHA-256 of
everything the compiled code depends on: the imported graph (its canonical form, constants
included: an ONNX path, its bytes, its ModelProto and the Graph `dnnc compile` imports are one
model and one key), the target and the machine it compiles for (CPU name, features, threads),
the options that change code (opt level, the tuning configs applied, the kind of array calls
return, the target's default spelled out), and the versions of dnnc (the hash of its own source
files, so an edited checkout never loads code an older one made), LLVM, NumPy and ONNX.
Anything else a compile takes (progress) does not change its code; a compile that stops its
passes early, dumps IR (`passes`, `dump_ir`: debugging), bounds its specialisations
(`cache_size`) or only renders is never cached. The entry's manifest records those parts
(`"compile_cache"`); a hit whose record differs (an entry copied under another key's name) is
dropped with a `CompileCacheWarning` and the model compiled.

Where: $DNNC_CACHE_DIR/models, else $XDG_CACHE_HOME/dnnc/models, else ~/.cache/dnnc/models.
An entry is native code that a hit runs, so the folder is trusted as ssh and pip trust theirs:
it is created 0700 and entries 0600; a folder or entry that is not a plain folder or file
owned by this user, or that group or others may write, is refused (one `CompileCacheWarning`
a process; the compile goes on without the cache). Entries are written atomically (a
temporary file `<key>.dnnc.*.tmp` renamed over the name), so a process reading an entry sees
none or all of it, and two processes compiling one model at once both end with a whole entry.
A hit refreshes the entry's time; after a store, the least recently used entries go until the
folder holds at most $DNNC_CACHE_MAX_BYTES (bytes: `2000000`, `1e6`, `500M`, `2G`; default
2 GiB), counting the temporary files of writers at work; those of a writer that died are
removed after `TMP_MAX_AGE`. Trimming and `clear()` touch only files named like a key: a
user's own artifacts in the folder stay. An entry that cannot be loaded (corrupt, another
machine) is removed and the model compiled; a folder that cannot be written costs only the
caching. `dnnc.compile(..., cache=False)` and `dnnc compile --no-cache` skip it;
`DNNC_CACHE=0` turns it off for a process.

A store a call asks for (a symbolic batch's new code, `CompiledModel`) runs in a background
thread, so no call waits on the cache: one at a time per model (`Storer`), those asked for
while one runs done as one more after it; the runtime's lock is held while the code is taken
(`images()`), never while the file is written. At exit a store still running is waited for
at most `EXIT_WAIT_SECONDS`; one cut short leaves its temporary file, never a part entry.

Only targets whose compile is worth keeping are cached (their registry entry's `cached`: the
targets that generate code); compiles shorter than `MIN_STORE_SECONDS` are not stored (loading
one would cost as much). This module never imports `module.py` or the driver, which use it,
and never loads an entry it has not checked (owner, mode, not a symbolic link).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import stat
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..backends.registry import REGISTRY
from ..errors import DNNCError, DNNCWarning
from ..ir.graph import Graph
from .artifact import Restored, graph_to_doc, restore, save

SCHEMA = 2
MIN_STORE_SECONDS = 0.5
DEFAULT_MAX_BYTES = 2 << 30
EXIT_WAIT_SECONDS = 5.0   # at exit, how long a background store is waited for
TMP_MAX_AGE = 3600.0   # seconds: a temporary file this old is a dead writer's, not a slow one's
SUFFIX = ".dnnc"
# the only names trim and clear touch: key()'s SHA-256 digest, and save()'s temporary files
_ENTRY = re.compile(r"[0-9a-f]{64}" + re.escape(SUFFIX))
_TMP = re.compile(r"[0-9a-f]{64}" + re.escape(SUFFIX) + r"\.[^/]+\.tmp")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

logger = logging.getLogger("dnnc")


class CompileCacheWarning(DNNCWarning):
    """The compile cache was not used, or an entry was dropped: the compile went on."""


class Key(NamedTuple):
    """An entry's name (`name` + SUFFIX in the folder) and the parts it digests, which the
    entry records and a hit compares."""
    name: str
    parts: dict


_warned: set[str] = set()
_PACKAGE = str(Path(__file__).resolve().parents[1])


def _warn(message: str, once: str | None = None) -> None:
    """A `CompileCacheWarning`, attributed to the first line outside dnnc (the user's call);
    one of kind `once` is given once a process."""
    if once is not None:
        if once in _warned:
            return
        _warned.add(once)
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"compile cache: {message}", CompileCacheWarning, stacklevel=level)


def enabled(cache: bool) -> bool:
    return cache and os.environ.get("DNNC_CACHE", "1") not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    root = os.environ.get("DNNC_CACHE_DIR")
    if root:
        return Path(root) / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "dnnc" / "models"


def max_bytes() -> int:
    """$DNNC_CACHE_MAX_BYTES: an integer, a float in any notation with an integral value
    (`1e6`), or a number with a unit K, M, G, T (powers of 1024; `500M`, `2GiB`, `1.5g`).
    Anything else is refused with one warning, and the default bound kept."""
    text = os.environ.get("DNNC_CACHE_MAX_BYTES")
    if text is None:
        return DEFAULT_MAX_BYTES
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*(?:([kmgtKMGT])(?:i?[bB])?|[bB])?\s*", text)
    try:
        value = float(match[1]) * _UNITS[(match[2] or "").lower()] if match else -1.0
    except ValueError:
        value = -1.0
    if not (0 <= value < 2**63) or value != int(value):
        _warn(f"DNNC_CACHE_MAX_BYTES={text!r} is not a size in bytes (an integer, 1e6, 500M, "
              f"2G); the default bound, 2 GiB, is used", once="max_bytes")
        return DEFAULT_MAX_BYTES
    return int(value)


def _uid() -> int:
    """The user whose folder and entries are trusted (the tests stand in another)."""
    return os.geteuid()


def _untrusted(st: os.stat_result, kind: str) -> str | None:
    """Why a folder or entry (its lstat) is not to be trusted, or None: as ssh and pip, one
    owned by another user or writable by group or others could hold another user's code."""
    plain = stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)
    if not plain:
        return f"is not a plain {'folder' if kind == 'folder' else 'file'} (a symbolic link?)"
    if st.st_uid != _uid():
        return f"is owned by user {st.st_uid}, not by this user ({_uid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _trusted_folder(folder: Path) -> bool:
    """Whether `folder` (which exists) may hold entries; warns (once) where not."""
    try:
        why = _untrusted(os.lstat(folder), "folder")
    except OSError:
        return False
    if why is not None:
        _warn(f"{folder} {why}: not used, the model is compiled (make the folder yours and "
              f"private: chmod 700)", once="trust")
    return why is None


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


def key(graph: Graph, target: str, machine, options: dict, tuned) -> Key:
    """The entry for compiling `graph` (as imported, input shapes applied) for `target`:
    its name digests the parts (each a digest itself where long), which the entry records."""
    parts = {"schema": SCHEMA, "versions": _versions(target), "target": target,
             "machine": _digest(_stable(machine).encode()),
             "options": _digest(_stable([options, tuned]).encode()),
             "model": _graph_digest(graph)}
    return Key(_digest(json.dumps(parts, sort_keys=True).encode()), parts)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


def _graph_digest(graph: Graph) -> str:
    """The SHA-256 of `graph`'s canonical form (the artifact's graph document) and tensors."""
    h = hashlib.sha256()
    doc, tensors = graph_to_doc(graph)
    h.update(json.dumps(doc, sort_keys=True).encode())
    for array in tensors:
        h.update(f"{array.dtype.str}{array.shape}".encode())
        # as bytes through a uint8 view: a memoryview refuses ml_dtypes' bfloat16 ('E')
        h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return h.hexdigest()


def _entry(name: str) -> Path:
    return cache_dir() / (name + SUFFIX)


def lookup(entry_key: Key) -> Restored | None:
    """The model cached under `entry_key` (its parts, `artifact.restore`'s), or None. Only a
    trusted folder and entry are read (opened without following a link, checked on the open
    file); an entry that fails to load, or that records another key, is removed (with a
    warning) so the next compile replaces it."""
    entry = _entry(entry_key.name)
    if not entry.parent.is_dir() or not _trusted_folder(entry.parent):
        return None
    try:
        fd = os.open(entry, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:   # a symbolic link swapped in (ELOOP), unreadable
        _warn(f"{entry} cannot be opened as a plain file ({exc.strerror or exc}): not used, "
              f"the model is compiled and its own entry written", once="trust")
        return None
    with os.fdopen(fd, "rb") as file:
        why = _untrusted(os.fstat(fd), "entry")
        if why is not None:
            _warn(f"{entry} {why}: not used, the model is compiled and its own entry written",
                  once="trust")
            return None
        try:
            model = restore(entry, progress=False, file=file)
        except (DNNCError, OSError) as exc:
            logger.warning("compile cache: dropped an entry that does not load (%s)", exc)
            _remove(entry)
            return None
    if model.manifest.get("compile_cache") != {"key": entry_key.name, **entry_key.parts}:
        _warn(f"dropped {entry}: it records another compile (a copy of another model's "
              f"entry?); the model is compiled")
        _remove(entry)
        return None
    try:
        os.utime(entry)
    except OSError:
        pass
    return model


def store(entry_key: Key, model) -> None:
    """Keep `model` under `entry_key` (private to this user, recording the key), then trim
    the folder to its size bound."""
    folder = cache_dir()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        if not _trusted_folder(folder):
            return
        save(model, _entry(entry_key.name), mode=0o600,
             record={"compile_cache": {"key": entry_key.name, **entry_key.parts}})
    except (DNNCError, OSError) as exc:
        logger.debug("compile cache: not stored (%s)", exc)
        return
    trim(folder, max_bytes())


class Storer:
    """Stores one model in a background thread (`request`): one store at a time; the
    requests made while one runs become one more store after it, of the model as it is then.
    A store that fails costs only the caching (logged at debug level)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._again = False
        _storers.add(self)

    def request(self, entry_key: Key, model) -> None:
        """Store `model` under `entry_key` soon, in the background; returns at once."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                self._again = True
                return
            self._again = False
            self._thread = threading.Thread(target=self._run, args=(entry_key, model),
                                            name="dnnc-cache-store", daemon=True)
            self._thread.start()

    def _run(self, entry_key: Key, model) -> None:
        while True:
            try:
                store(entry_key, model)
            except Exception as exc:   # a store is never worth a call's failure
                logger.debug("compile cache: not stored (%s)", exc)
            with self._lock:
                if not self._again:
                    self._thread = None
                    return
                self._again = False

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no store of this model runs (at most `timeout` s); whether none does."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _after_fork_in_child(self) -> None:
        """The writer thread does not exist in a forked child, and its lock may be held."""
        self._lock = threading.Lock()
        self._thread, self._again = None, False


_storers: weakref.WeakSet[Storer] = weakref.WeakSet()


def wait(timeout: float | None = None) -> bool:
    """Wait until no background store runs in this process (at most `timeout` s in all);
    whether none does. At exit it is called with `EXIT_WAIT_SECONDS`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for storer in list(_storers):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not storer.wait(left):
            return False
    return True


atexit.register(lambda: wait(EXIT_WAIT_SECONDS))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [s._after_fork_in_child()
                                                for s in list(_storers)])


def trim(folder: Path, limit: int) -> None:
    """Remove the least recently used entries until `folder` holds at most `limit` bytes.
    Temporary files of writers at work count; those older than `TMP_MAX_AGE` are removed."""
    now = time.time()
    entries, total = [], 0
    for path in _named_like_keys(folder):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if _TMP.fullmatch(path.name):
            if now - st.st_mtime > TMP_MAX_AGE:
                _remove(path)
                continue
        else:
            entries.append((st.st_mtime, st.st_size, path))
        total += st.st_size
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        _remove(path)
        total -= size


def _named_like_keys(folder: Path) -> list[Path]:
    """The entries and temporary files in `folder`: nothing else there is the cache's."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [folder / name for name in names
            if _ENTRY.fullmatch(name) or _TMP.fullmatch(name)]


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def clear() -> int:
    """Remove every entry (and temporary file); the count of entries removed."""
    removed = 0
    for path in _named_like_keys(cache_dir()):
        _remove(path)
        removed += bool(_ENTRY.fullmatch(path.name))
    return removed
