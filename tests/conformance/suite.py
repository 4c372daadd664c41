"""The ONNX node test suite, generated in-process, run against a dnnc target.

Each case is imported, compiled and run on its stored inputs; outputs are compared with the
case's own rtol/atol, and dtype and shape must match exactly. A failure gets a short reason
("unsupported op X", "unsupported type T", "mismatch", "error: ...") for grouping.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
EXPECTED_DIR = HERE / "expected"


@functools.lru_cache(maxsize=1)
def all_cases() -> dict:
    """name -> onnx TestCase, for every node case onnx generates (about 1900)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {c.name: c for c in collect_testcases(None)}


@dataclass
class Result:
    name: str
    passed: bool
    reason: str = ""
    fallbacks: tuple = ()   # ops that ran as host fallbacks (compiled targets)
    kernels: int = 0        # kernels compiled (compiled targets)


def _values(case):
    inputs, outputs = case.data_sets[0]
    return [_as_array(x) for x in inputs], [_as_array(x) for x in outputs]


def _as_array(x):
    """Stored values as arrays: 0-d ones come as NumPy scalars, some as TensorProtos."""
    from onnx import TensorProto

    from dnnc.frontend.onnx import tensor_to_array

    if isinstance(x, np.generic):
        return np.asarray(x)
    if isinstance(x, TensorProto):
        return tensor_to_array(x)
    return x


def run_case(case, target: str, opt_level: int | None = None) -> Result:
    """`case` compiled for `target` at `opt_level` (default: dnnc's), run on its stored inputs
    and checked against its stored outputs."""
    import dnnc
    from dnnc import errors

    try:
        inputs, expected = _values(case)
    except errors.UnsupportedTypeError as exc:
        m = re.search(r"element type (\w+)", str(exc))
        return Result(case.name, False, f"unsupported type: {m.group(1) if m else exc}")
    if any(not isinstance(x, np.ndarray) for x in list(inputs) + list(expected)):
        return Result(case.name, False, "unsupported type: sequence/optional values")
    try:
        model = dnnc.compile(case.model, target=target, opt_level=opt_level,
                             outputs="numpy")
        with np.errstate(all="ignore"):
            outputs = model.run(*inputs)
    except errors.UnsupportedOpError as exc:
        ops = ", ".join(op for op, *_ in exc.ops)
        return Result(case.name, False, f"unsupported op {ops}")
    except errors.UnsupportedTypeError as exc:
        m = re.search(r"(element type|dtype) (\w+)", str(exc))
        return Result(case.name, False, f"unsupported type: {m.group(2) if m else exc}")
    except errors.DNNCError as exc:
        return Result(case.name, False, f"{type(exc).__name__}: {_first_line(exc)}")
    except Exception as exc:  # a dnnc bug; grouped by exception type
        return Result(case.name, False, f"crash {type(exc).__name__}: {_first_line(exc)}")
    if len(outputs) != len(expected):
        return Result(case.name, False, f"wrong output count {len(outputs)}")
    for i, (got, want) in enumerate(zip(outputs, expected)):
        if got.dtype != want.dtype:
            return Result(case.name, False, f"output {i} dtype {got.dtype}, want {want.dtype}")
        if got.shape != want.shape:
            return Result(case.name, False, f"output {i} shape {got.shape}, want {want.shape}")
        try:
            if want.dtype.kind in "fc" or want.dtype.name == "bfloat16":
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                           rtol=case.rtol, atol=case.atol, equal_nan=True)
            else:
                np.testing.assert_array_equal(got, want)
        except AssertionError:
            with np.errstate(all="ignore"):
                err = np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64))) \
                    if got.size else 0.0
            return Result(case.name, False, f"mismatch (max abs error {err:.1e}; rtol "
                                            f"{case.rtol:g}, atol {case.atol:g})")
    runtime = getattr(model, "runtime", None)
    fallbacks = tuple(sorted({f.split(" ")[0] for f in getattr(runtime, "host_fallback_ops", ())}))
    return Result(case.name, True, fallbacks=fallbacks, kernels=model.stats.get("kernels", 0))


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else ""


def expected_passes(target: str, kind: str = "") -> list[str]:
    """Cases expected to pass on `target` (kind "native": without any host fallback)."""
    path = EXPECTED_DIR / f"{target}{'.' + kind if kind else ''}.txt"
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def known_exceptions(target: str) -> dict[str, str]:
    """Cases the numpy target passes that `target` does not, each with its reason
    (expected/<target>.exceptions.txt: `name: reason` lines)."""
    path = EXPECTED_DIR / f"{target}.exceptions.txt"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(":")
            out[name.strip()] = reason.strip()
    return out
