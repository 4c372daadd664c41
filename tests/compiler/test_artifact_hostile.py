"""Crafted artifacts: truncated files, flipped bytes in every member, manifests that lie about
the code (cache key, arena, constant slots, entry, versions, target, CPU features), objects
for another machine, garbage objects, missing members, sizes no file can hold. Every one must
be refused with an ArtifactError when loaded, never crash the process or compute a wrong
answer (issue 10, items 5 and 7).

All cases load (and, if one loads, run) in one child process that prints one line per case;
a crash there fails the test and the last line names the case."""

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import dnnc
from dnnc import zoo

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import sys
import numpy as np, dnnc
from dnnc.errors import ArtifactError
folder = sys.argv[1]
x, want = np.load(f"{folder}/x.npy"), np.load(f"{folder}/y.npy")
for name in sys.argv[2:]:
    print("case", name, end=" ", flush=True)
    try:
        model = dnnc.load(f"{folder}/{name}.dnnc")
        got = model(x)
    except ArtifactError as exc:
        print("refused", str(exc).replace("\n", " "), flush=True)
        continue
    except Exception as exc:
        print("error", type(exc).__name__, exc, flush=True)
        continue
    same = len(got) == len(want) if isinstance(got, list) else np.array_equal(got, want)
    print("ran", "same" if same else "WRONG", flush=True)
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """An MLP with a symbolic batch, compiled at batch 64 and saved; its input and output."""
    folder = tmp_path_factory.mktemp("hostile")
    model = dnnc.compile(zoo.build("mlp", batch="N", in_features=64, hidden=(64,), classes=8,
                                   seed=5), target="llvm")
    x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", model(x))
    model.save(folder / "good.dnnc")
    return folder


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name) for name in z.namelist()}


def _write(path: Path, members: dict[str, bytes], rehash: bool = True) -> None:
    """An archive of `members`; the manifest's SHA-256 list follows the members when
    `rehash` (a consistent file that lies), else stays as it was."""
    try:
        manifest = json.loads(members["manifest.json"])
    except (KeyError, ValueError, RecursionError):
        rehash = False    # the case is about the manifest itself
    if rehash and isinstance(manifest, dict):
        for name in manifest.get("files", {}):
            if name in members:
                manifest["files"][name] = hashlib.sha256(members[name]).hexdigest()
        members = {**members, "manifest.json": json.dumps(manifest).encode()}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _flip(data: bytes, at: float) -> bytes:
    k = min(int(len(data) * at), len(data) - 1)
    return data[:k] + bytes([data[k] ^ 0x5A]) + data[k + 1:]


def _lie(edit):
    """A case: the manifest edited by `edit(manifest)`, every checksum consistent."""
    def make(members):
        manifest = json.loads(members["manifest.json"])
        edit(manifest)
        return {**members, "manifest.json": json.dumps(manifest).encode()}
    return make


def _seg(edit):
    return _lie(lambda m: edit(m["segments"][0]))


def _object(edit):
    """A case: segment 0's object code replaced by `edit(object bytes)`."""
    def make(members):
        name = json.loads(members["manifest.json"])["segments"][0]["object"]
        return {**members, name: edit(members[name])}
    return make


def _without(name):
    return lambda members: {k: v for k, v in members.items() if k != name}


def _elf_machine(data: bytes) -> bytes:
    other = 183 if struct.unpack_from("<H", data, 18)[0] != 183 else 62
    return data[:18] + struct.pack("<H", other) + data[20:]


def _object_needing_a_missing_symbol(_) -> bytes:
    """A well-formed object whose `entry` calls a function no process has: loaded, it would
    jump to address 0."""
    import llvmlite.binding as llvm

    from dnnc.backends.llvm.cpu import host_target
    from dnnc.backends.llvm.jit import target_machine

    module = llvm.parse_assembly("declare void @dnnc_no_such_function()\n"
                                 "define void @entry(ptr %s, ptr %a) {\n"
                                 "  call void @dnnc_no_such_function()\n  ret void\n}\n")
    return target_machine(host_target()).emit_object(module)


def _feature_host_lacks(manifest):
    from dnnc.backends.llvm.cpu import feature_names, host_target

    absent = sorted(feature_names() - host_target().feature_set)[0]
    target = manifest["target"]
    target["feature_string"] += f",+{absent}"
    target["features"] = sorted(set(target["features"]) | {absent})


def _feature_dropped(manifest):
    """The manifest claims the code needs one feature less than it was compiled with."""
    target = manifest["target"]
    dropped = "avx2" if "avx2" in target["features"] else target["features"][-1]
    target["feature_string"] = target["feature_string"].replace(f"+{dropped}", f"-{dropped}")
    target["features"].remove(dropped)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array))
    return buf.getvalue()


def _npy_header_lie(members):
    """tensors/0.npy's header claims twice the rows its data holds."""
    data = members["tensors/0.npy"]
    array = np.load(io.BytesIO(data))
    header = _npy(array)[:len(data) - array.nbytes]
    shape = str(array.shape).encode()
    bigger = str((2 * array.shape[0],) + array.shape[1:]).encode()
    lie = header.replace(shape, bigger)[:-1].ljust(len(header) - 1) + b"\n"
    return {**members, "tensors/0.npy": lie + data[len(header):]}


def _smaller_constant(members):
    """A weight and its type in graph.json both halved: a consistent graph, other code."""
    doc = json.loads(members["graph.json"])
    entry = next(v for v in doc["values"] if "const" in v and v["shape"] and v["shape"][-1] > 1)
    name = f"tensors/{entry['const']}.npy"
    array = np.load(io.BytesIO(members[name]))
    smaller = array[..., :array.shape[-1] // 2]
    entry["shape"] = list(smaller.shape)
    return {**members, "graph.json": json.dumps(doc).encode(), name: _npy(smaller)}


def _swap_consts(s):
    s["consts"] = s["consts"][::-1]


LIES = {
    "shapes-batch": _seg(lambda s: s["shapes"][0].__setitem__(0, 128)),
    "shapes-rank": _seg(lambda s: s["shapes"][0].append(1)),
    "shapes-type": _seg(lambda s: s["shapes"][0].__setitem__(0, "64")),
    "shapes-negative": _seg(lambda s: s["shapes"][0].__setitem__(0, -64)),
    "arena-small": _seg(lambda s: s.update(arena_bytes=s["arena_bytes"] // 4)),
    "arena-zero": _seg(lambda s: s.update(arena_bytes=0)),
    "arena-float": _seg(lambda s: s.update(arena_bytes=float(s["arena_bytes"]))),
    "arena-huge": _seg(lambda s: s.update(arena_bytes=1 << 60)),
    "consts-swapped": _seg(_swap_consts),
    "consts-dropped": _seg(lambda s: s["consts"].pop()),
    "consts-out-of-range": _seg(lambda s: s["consts"].__setitem__(0, [99, 0])),
    "consts-negative": _seg(lambda s: s["consts"].__setitem__(0, [-1, 1])),
    "consts-data-input": _seg(lambda s: s["consts"].__setitem__(0, [0, 0])),
    "n-inputs": _seg(lambda s: s.update(n_inputs=s["n_inputs"] + 1)),
    "slots-fewer": _seg(lambda s: s.update(slots=s["slots"] - 1)),
    "slots-bool": _seg(lambda s: s.update(n_inputs=True)),
    "entry-other-function": _seg(lambda s: s.update(entry="k0_Gemm")),
    "entry-missing": _seg(lambda s: s.update(entry="nope")),
    "entry-not-a-name": _seg(lambda s: s.update(entry="../entry")),
    "escaping-shape": _seg(lambda s: s["escaping"][0].update(shape=[64, 80])),
    "escaping-dtype": _seg(lambda s: s["escaping"][0].update(dtype="float64")),
    "escaping-extra": _seg(lambda s: s["escaping"].append(dict(s["escaping"][0]))),
    "step-out-of-range": _seg(lambda s: s.update(step=7)),
    "values-key": _seg(lambda s: s.update(values=[[0, [1, 2]]])),
    "no-arena-field": _seg(lambda s: s.pop("arena_bytes")),
    "plan-other-nodes": _lie(lambda m: m["plan"][0]["segment"].reverse()),
    "plan-missing-node": _lie(lambda m: m["plan"][0]["segment"].pop()),
    "plan-type": _lie(lambda m: m.update(plan={"segment": 0})),
    "dnnc-version": _lie(lambda m: m.update(dnnc_version="0.0.0")),
    "format-version": _lie(lambda m: m.update(format_version=1)),
    "target-name": _lie(lambda m: m["target"].update(name="cuda")),
    "target-triple": _lie(lambda m: m["target"].update(triple="aarch64-unknown-linux-gnu")),
    "target-not-a-dict": _lie(lambda m: m.update(target="llvm")),
    "opt-level": _lie(lambda m: m["target"].update(opt_level=9)),
    "feature-host-lacks": _lie(_feature_host_lacks),
    "feature-dropped": _lie(_feature_dropped),
    "features-disagree": _lie(lambda m: m["target"]["features"].pop()),
    "cpu-name": _lie(lambda m: m["target"].update(cpu="bogus")),
    "files-not-a-dict": _lie(lambda m: m.update(files=[])),
    "files-hash-wrong": _lie(lambda m: m["files"].update({"graph.json": "0" * 64})),
    "files-missing-entry": _lie(lambda m: m["files"].pop("graph.json")),
    "manifest-not-json": lambda ms: {**ms, "manifest.json": b"{\"format\": "},
    "manifest-list": lambda ms: {**ms, "manifest.json": b"[1, 2]"},
    "manifest-deep": lambda ms: {**ms, "manifest.json": b"[" * 100000 + b"]" * 100000},
    "object-other-arch": _object(_elf_machine),
    "object-garbage": _object(lambda d: np.random.default_rng(1).bytes(len(d))),
    "object-elf-garbage": _object(lambda d: d[:64] + np.random.default_rng(2).bytes(
        len(d) - 64)),
    "object-truncated": _object(lambda d: d[:len(d) // 2]),
    "object-empty": _object(lambda d: b""),
    "object-missing-symbol": _object(_object_needing_a_missing_symbol),
    "object-section-table-past-end": _object(
        lambda d: d[:40] + struct.pack("<Q", len(d) - 8) + d[48:]),
    "object-of-other-segment-shape": None,   # made in the test: another batch's object
    "tensor-header-lie": _npy_header_lie,
    "constant-smaller": _smaller_constant,
    "missing-graph": _without("graph.json"),
    "missing-tensor": _without("tensors/0.npy"),
    "missing-object": _without("segments/0.o"),
    "missing-manifest": _without("manifest.json"),
}


def _declared_size(data: bytes, member: str, size: int) -> bytes:
    """The archive with `member`'s uncompressed size in the central directory set to
    `size`: a zip bomb's declaration, or a stored member whose sizes disagree."""
    out = bytearray(data)
    at = 0
    while (at := out.find(b"PK\x01\x02", at)) >= 0:
        n = struct.unpack_from("<H", out, at + 28)[0]
        if out[at + 46:at + 46 + n].decode() == member:
            struct.pack_into("<I", out, at + 24, size)
            return bytes(out)
        at += 4
    raise AssertionError(f"no member {member}")


def test_crafted_artifacts_are_refused(base):
    good = base / "good.dnnc"
    data = good.read_bytes()
    members = _members(good)
    cases = []

    def case(name, payload: bytes):
        (base / f"{name}.dnnc").write_bytes(payload)
        cases.append(name)

    for at in (0, 4, 30, 0.25, 0.5, 0.75, -22, -1):
        cut = at if isinstance(at, int) else int(len(data) * at)
        case(f"truncated-{at}", data[:cut])
    for name in members:
        slug = name.replace("/", "-")
        # bytes flipped in place (the zip's CRC no longer matches) and in a rewritten
        # archive (every CRC right: the manifest's SHA-256 must catch it)
        with zipfile.ZipFile(good) as z:
            info = z.getinfo(name)
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        flipped = bytearray(data)
        flipped[start + info.compress_size // 2] ^= 0x5A
        case(f"flipped-raw-{slug}", bytes(flipped))
        if name != "manifest.json":
            _write(base / f"flipped-{slug}.dnnc", {**members, name: _flip(members[name], .5)},
                   rehash=False)
            cases.append(f"flipped-{slug}")
    other = dnnc.load(good)
    other.runtime.batch_split = False   # batch 3 compiles (not run on batch 64's code)
    other(np.zeros((3, 64), np.float32))   # compiles batch 3: a second object
    other.save(base / "two.dnnc")
    two = _members(base / "two.dnnc")
    for name, make in LIES.items():
        if make is None:   # batch 64's object swapped for batch 3's, checksums made right
            make = _object(lambda d: two["segments/1.o"])
        _write(base / f"{name}.dnnc", make(members), rehash=not name.startswith("files"))
        cases.append(name)
    case("bomb-graph", _declared_size(data, "graph.json", 0xFFFFFFF0))
    case("stored-size-lie", _declared_size(data, "tensors/0.npy", 1 << 20))

    # the good files must still load: the original, and a loaded model saved again with a
    # specialisation compiled after the load
    done = subprocess.run([sys.executable, "-c", _CHILD, str(base), "good", "two", *cases],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DNNC_NUM_THREADS": "2"})
    lines = done.stdout.splitlines()
    print(done.stdout)   # every case's outcome, shown when the test fails
    assert done.returncode == 0, f"crashed ({done.returncode}) on {lines[-1:]}:\n" \
                                 f"{done.stderr[-2000:]}"
    results = dict(line.split(" ", 2)[1:] for line in lines)
    assert results.pop("good") == "ran same" and results.pop("two") == "ran same"
    wrong = {name: r for name, r in results.items() if not r.startswith("refused")}
    assert not wrong, "\n".join(f"{n}: {r}" for n, r in wrong.items())
    assert len(results) == len(cases)
