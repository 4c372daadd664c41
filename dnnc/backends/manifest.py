"""What the targets' artifact codecs share: checks of the manifest fields they read (type and
range, before anything is used), the tuned configs they keep, the segment entries every
compiled target stores, and tensor types as JSON. The container around them (zip members,
checksums, the graph document) is `compiler/artifact.py`'s; docs/artifacts.md describes both.

A check raises `ArtifactError` naming the field; it never reads a member file or touches a
device.
"""

from __future__ import annotations

from ..errors import ArtifactError
from ..ir.types import DType, TensorType

# bounds of the manifest's numbers: past them a file is lying, not describing a model
MAX_DIM = 1 << 40
MAX_SLOTS = 1 << 20
MAX_ARENA = 1 << 44


def need(ok: bool, what: str) -> None:
    if not ok:
        raise ArtifactError(f"the manifest's {what} is malformed or out of range")


def is_int(x, lo: int = 0, hi: int = MAX_DIM) -> bool:
    return type(x) is int and lo <= x <= hi


def ints(x, lo: int = 0, hi: int = MAX_DIM) -> bool:
    return type(x) is list and all(is_int(v, lo, hi) for v in x)


def strs(x) -> bool:
    return type(x) is list and all(type(v) is str for v in x)


def export_tuned(runtime, target: dict) -> None:
    """A tuning log's configs (task -> knobs), kept so that shapes compiled after a load are
    tuned as the compile was."""
    if runtime.tuned:
        target["tuned"] = {task: dict(config) for task, config in sorted(runtime.tuned.items())}


def check_tuned(target: dict) -> None:
    tuned = target.get("tuned", {})
    # task -> {knob: value}; a value the template's space does not hold is refused when a
    # kernel is scheduled (ConfigError: the default is used), so only the types matter here
    need(type(tuned) is dict and all(
        type(task) is str and type(config) is dict and
        all(type(k) is str and type(v) in (int, bool, str, float) for k, v in config.items())
        for task, config in tuned.items()), "target's tuned configs")


def check_segments(manifest: dict, target_fields) -> None:
    """The plan, and each segment entry's fields every target stores (step, shapes, output
    types, constant slots, value key, kernels a call, member files); `target_fields(entry,
    what)` checks the target's own and returns the entry's member file names."""
    plan = manifest.get("plan")
    need(type(plan) is list and all(
        type(e) is dict and len(e) == 1 and
        (ints(e.get("segment"), 0, 1 << 40) or is_int(e.get("host"), 0, 1 << 40))
        for e in plan), "plan")
    segments = manifest.get("segments")
    need(type(segments) is list, "segments")
    files = manifest["files"]
    for k, e in enumerate(segments):
        what = f"segment entry {k}"
        need(type(e) is dict and is_int(e.get("step"), 0, len(plan) - 1) and
             "segment" in plan[e["step"]], what + " step")
        need(type(e.get("shapes")) is list and all(ints(s) for s in e["shapes"]),
             what + " shapes")
        need(type(e.get("escaping")) is list and all(
            type(t) is dict and type(t.get("dtype")) is str and ints(t.get("shape"))
            for t in e["escaping"]), what + " escaping types")
        need(type(e.get("consts")) is list and all(ints(c, 0, 1 << 20) and len(c) == 2
                                                   for c in e["consts"]), what + " consts")
        need(is_int(e.get("kernels", 0), 0, 1 << 20), what + " kernels")
        members = target_fields(e, what)
        need(all(type(m) is str and m in files for m in members), what + " members")
        need(type(e.get("values", [])) is list and all(
            type(v) is list and len(v) == 2 and is_int(v[0], 0, 1 << 20) and
            ints(v[1], -(1 << 63), (1 << 63) - 1) for v in e.get("values", [])),
            what + " values")


def type_doc(t: TensorType) -> dict:
    return {"dtype": t.dtype.name, "shape": list(t.shape)}


def type_from(doc: dict) -> TensorType:
    return TensorType(DType.from_name(doc["dtype"]), tuple(doc["shape"]))
