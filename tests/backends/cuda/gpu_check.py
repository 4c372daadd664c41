"""The cuda renderer and schedules on a GPU, without the cuda runtime: every kernel of the zoo
models (single-op kernels at opt level 0, fused ones at opt level 3) and of a sample of the
node suite, rendered (`render_module`), compiled by NVRTC (`cupy.RawModule`), launched on
device buffers (inputs: the values the NumPy reference computes for the kernel's inputs on
random model inputs, or the case's stored inputs; outputs and workspace poisoned) and
compared with the reference's outputs (float32/float64: rtol 1e-4, atol 1e-5; float16 and
bfloat16: rtol 1e-2, atol 1e-3; integers and bools exactly).

    PYTHONPATH=$PWD python tests/backends/cuda/gpu_check.py [--models mlp,cnn] [--cases 100]
                                                            [--precision tf32|fp16|bf16]
    PYTHONPATH=$PWD python -m pytest -q tests/backends/cuda/gpu_check.py   (skips without a GPU)

Prints a table (one line per model or case: kernels, launches, worst relative error, result)
and every mismatch; the exit status is 1 when anything mismatched or failed. With
`--precision` the zoo models' kernels are scheduled at that precision (dense and conv on
tensor cores) and a float32 output passes within `REDUCED` of its largest magnitude
(test_cuda_precision.py's whole-kernel check); the node-suite cases stay fp32.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from dnnc.ir import loop as L

sys.path.insert(0, str(Path(__file__).parent))

from cuda_kernels import (MACHINE, SMALL, programs, reference, suite_cases,  # noqa: E402
                          suite_inputs, suite_sample, zoo_model)

TOLERANCE = {"float32": (1e-4, 1e-5), "float64": (1e-4, 1e-5), "float16": (1e-2, 1e-3),
             "bfloat16": (1e-2, 1e-3)}
"""dtype name -> (rtol, atol); other dtypes compare exactly."""

REDUCED = {"tf32": 5e-3, "fp16": 5e-3, "bf16": 2e-2}
"""Precision -> largest |error| of a float32 output over its largest |reference| (a
fragment, epilogue or layout mistake is off by O(1); the operands' rounding gives about
4e-4 at tf32 and fp16, 3e-3 at bf16 on the zoo's kernels, on host threads)."""


def _cupy():
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:   # no wheel, no driver, no device: nothing to run on
        return None


def describe_gpu(cp) -> str:
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return (f"{name}, sm_{props['major']}{props['minor']}, driver "
            f"{cp.cuda.runtime.driverGetVersion()}, CUDA runtime "
            f"{cp.cuda.runtime.runtimeGetVersion()}, cupy {cp.__version__}")


def _to_device(cp, a: np.ndarray):
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":   # (cupy has no bfloat16: its bits)
        a = a.view(np.uint16)
    return cp.asarray(a)


def _poisoned(cp, dtype: np.dtype, shape):
    """Wrong unless written: NaN for floats, 0x5A bytes for the rest."""
    if dtype.name == "bfloat16":
        return cp.full(shape, 0x7FC0, np.uint16)
    if dtype.kind == "f":
        return cp.full(shape, np.nan, dtype)
    out = cp.empty(shape, dtype)
    out.reshape(-1).view(cp.uint8)[...] = 0x5A   # (flat: a 0-d array cannot change itemsize)
    return out


def _from_device(a, dtype: np.dtype) -> np.ndarray:
    host = a.get()
    return host.view(dtype) if dtype.name == "bfloat16" else host


def _error(got: np.ndarray, want: np.ndarray, precision: str = "fp32") -> tuple[bool, float]:
    """(matches, worst |got - want| / (atol + rtol |want|)) for one output; at a reduced
    precision a float32 one's worst |got - want| / (REDUCED max |want|)."""
    if got.shape != want.shape:
        return False, float("inf")
    if precision != "fp32" and want.dtype == np.float32:
        top = float(np.abs(want).max()) if want.size else 0.0
        diff = np.abs(got.astype(np.float64) - want)
        worst = float(diff.max()) / (REDUCED[precision] * top) if top else float(diff.max())
        worst = worst if np.isfinite(got).all() else float("inf")
        return worst <= 1.0, worst
    rtol, atol = TOLERANCE.get(want.dtype.name, (0.0, 0.0))
    g, w = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(g) & np.isnan(w)
    with np.errstate(all="ignore"):
        diff = np.where(both_nan | (g == w), 0.0, np.abs(g - w))
        # an element equal to the reference (NaN included) is exact whatever its scale: a NaN
        # reference would make the scale NaN, and 0 / NaN read as an infinite error
        scaled = np.where(diff == 0, 0.0, diff / (atol + rtol * np.abs(w))) if rtol or atol \
            else (diff > 0) * 2.0
    worst = float(np.nanmax(np.where(np.isnan(scaled), np.inf, scaled))) if scaled.size else 0.0
    return worst <= 1.0, worst


def check_programs(cp, progs, values: dict, precision: str = "fp32"
                   ) -> tuple[int, int, float, list[str]]:
    """Run every kernel of `progs` on the GPU: (kernels, launches, worst error, problems)."""
    from dnnc.backends.cuda.codegen import render_module

    kernels = launches = 0
    worst = 0.0
    problems: list[str] = []
    for program in progs:
        module = render_module(program.unique)
        try:
            raw = cp.RawModule(code=module.source, options=("-std=c++17",))
        except Exception as exc:
            problems.append(f"NVRTC: {str(exc).strip()[:2000]}")
            continue
        for kernel in program.kernels:
            info = module.kernels[kernel.func.name]
            ins = [_to_device(cp, v.const if v.const is not None else values[v.name])
                   for v in kernel.inputs]
            outs = [_poisoned(cp, np.dtype(v.type.dtype.np), v.type.shape)
                    for v in kernel.outputs]
            scratch = [cp.full(size, 0xFF, cp.uint8) for size in info.workspace]
            errors = [cp.zeros(3, cp.int64)] if L.index_checks.INDEX_ERRORS in \
                kernel.func.params else []   # (in-range data: stays zero)
            args = tuple(ins + outs + errors + scratch)
            for launch in info.launches:
                raw.get_function(launch.name)(launch.grid, launch.block, args,
                                              shared_mem=launch.shared_bytes)
            cp.cuda.runtime.deviceSynchronize()
            if errors and errors[0].get().any():   # the reference's data is in range
                problems.append(f"{kernel.func.name}: index error recorded: "
                                f"{errors[0].get()}")
            kernels += 1
            launches += len(info.launches)
            for v, out in zip(kernel.outputs, outs):
                want = np.asarray(values[v.name])
                ok, err = _error(_from_device(out, want.dtype), want, precision)
                worst = max(worst, err)
                if not ok:
                    problems.append(f"{kernel.func.name} ({', '.join(n.op for n in kernel.nodes)}"
                                    f") output {v.name} {want.dtype}{list(want.shape)}: error "
                                    f"{err:.3g} x tolerance")
    return kernels, launches, worst, problems


def check_model(cp, name: str, opt_level: int, precision: str = "fp32"):
    from dataclasses import replace

    from dnnc import zoo
    from dnnc.frontend.onnx import import_onnx

    graph, progs = programs(import_onnx(zoo_model(name)), opt_level,
                            replace(MACHINE, precision=precision))
    values = reference(graph, zoo.inputs_for(zoo_model(name), np.random.default_rng(0)))
    return check_programs(cp, progs, values, precision)


def check_case(cp, case):
    from dnnc.frontend.onnx import import_onnx

    graph = import_onnx(case.model)
    graph, progs = programs(graph)
    inputs = dict(zip((v.name for v in graph.inputs), suite_inputs(case)))
    return check_programs(cp, progs, reference(graph, inputs))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(sorted(SMALL)))
    parser.add_argument("--cases", type=int, default=100, help="node-suite cases sampled")
    parser.add_argument("--precision", default="fp32", choices=("fp32", *REDUCED),
                        help="the zoo models' kernels at this precision (tensor cores)")
    args = parser.parse_args(argv)
    cp = _cupy()
    if cp is None:
        print("gpu_check: no GPU (CuPy missing, no driver or no device)")
        return 2
    print(describe_gpu(cp))
    rows, failures = [], []
    jobs = [(f"{m} O{level}", lambda m=m, level=level: check_model(cp, m, level,
                                                                   args.precision))
            for m in args.models.split(",") if m for level in (0, 3)]
    cases = suite_cases(suite_sample(args.cases)) if args.cases else {}
    jobs += [(name, lambda case=case: check_case(cp, case)) for name, case in cases.items()]
    for label, job in jobs:
        start = time.perf_counter()
        try:
            kernels, launches, worst, problems = job()
        except Exception as exc:   # a crash of one job must not hide the others
            kernels = launches = 0
            worst, problems = float("nan"), [f"crash {type(exc).__name__}: {exc}"]
        result = "ok" if not problems else f"FAIL ({len(problems)})"
        rows.append((label, kernels, launches, worst, result, time.perf_counter() - start))
        failures += [f"{label}: {p}" for p in problems]
    width = max(len(r[0]) for r in rows)
    print(f"{'kernel set':{width}}  kernels  launches  worst err/tol  result      s")
    for label, kernels, launches, worst, result, seconds in rows:
        print(f"{label:{width}}  {kernels:7d}  {launches:8d}  {worst:12.3g}  {result:10s} "
              f"{seconds:5.1f}")
    ok = sum(r[4] == "ok" for r in rows)
    print(f"{ok}/{len(rows)} kernel sets match")
    for line in failures:
        print(line)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

# -- as pytest tests: skip without a GPU (the script itself needs no pytest) -------------------

import pytest  # noqa: E402

gpu = pytest.mark.skipif(_cupy() is None, reason="needs CuPy and a CUDA GPU")


@gpu
@pytest.mark.parametrize("opt_level", [0, 3])
@pytest.mark.parametrize("model", sorted(SMALL))
def test_zoo_kernels_on_gpu(model, opt_level):
    _, _, _, problems = check_model(_cupy(), model, opt_level)
    assert not problems, "\n".join(problems)


@gpu
@pytest.mark.parametrize("precision", sorted(REDUCED))
@pytest.mark.parametrize("model", ["cnn", "bert_tiny", "resnet18"])
def test_zoo_kernels_on_gpu_at_reduced_precision(model, precision):
    _, _, _, problems = check_model(_cupy(), model, 3, precision)
    assert not problems, "\n".join(problems)


@gpu
def test_node_suite_kernels_on_gpu():
    cp = _cupy()
    problems = []
    for name, case in suite_cases(suite_sample(100)).items():
        problems += [f"{name}: {p}" for p in check_case(cp, case)[3]]
    assert not problems, "\n".join(problems)
