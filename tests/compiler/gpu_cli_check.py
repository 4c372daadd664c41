"""The CLI and API polish (issue 15) on a GPU host, where the default target is cuda: what the
CPU-only test suite cannot see.

    PYTHONPATH=$PWD python tests/compiler/gpu_cli_check.py

Checks, each printed PASS or FAIL with its figures: `dnnc --version` names cuda as runnable
with its CuPy/CUDA versions and as the default target; `dnnc.compile(path)` and `dnnc.jit`
default to cuda and match the numpy reference; one kernel count after compile, `dnnc.load`
and `inspect x.dnnc`; `bench --profile --trace` writes one trace event per cuda kernel;
`inspect --draw --profile` colours the cuda kernels; `compare --bisect-passes --json` finds
no divergence. Exit status 1 when a check fails, 2 without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.registry import REGISTRY, default_target  # noqa: E402

FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILED.append(name)


def to_host(a) -> np.ndarray:
    """A call's output as a NumPy array: the cuda target may return CuPy arrays."""
    return a.get() if type(a).__module__.split(".")[0] == "cupy" else np.asarray(a)


def dnnc_command(*argv, cwd) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "dnnc", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr


def main() -> int:
    if not REGISTRY["cuda"].available():
        print(f"no GPU to check on: {REGISTRY['cuda'].about()}")
        return 2
    folder = Path(tempfile.mkdtemp(prefix="dnnc_gpu_cli_"))
    cnn = folder / "cnn.onnx"
    import onnx

    onnx.save(zoo.build("cnn", batch=2), cnn)

    code, out, err = dnnc_command("--version", cwd=folder)
    cuda_line = next((line for line in out.splitlines() if line.split()[:1] == ["cuda"]), "")
    check("dnnc --version: cuda runnable, its versions, the default target",
          code == 0 and cuda_line.split()[1:2] == ["yes"] and "CuPy" in cuda_line
          and out.rstrip().endswith("default target: cuda"), cuda_line.strip())

    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    start = time.perf_counter()
    model = dnnc.compile(str(cnn), progress=False)
    seconds = time.perf_counter() - start
    want = dnnc.compile(str(cnn), "numpy")(x)
    error = float(np.max(np.abs(to_host(model(x)) - want)))
    check("dnnc.compile(path) defaults to cuda and matches the reference",
          model.target == "cuda" == default_target() and error < 1e-3,
          f"target {model.target}, compiled in {seconds:.2f} s, max abs error {error:.2e}")
    square = dnnc.jit(lambda a: a * a + 1.0)
    check("dnnc.jit defaults to cuda", square.target == "cuda"
          and np.allclose(to_host(square(x)), x * x + 1.0, rtol=1e-5),
          f"target {square.target}")

    artifact = folder / "cnn.dnnc"
    code, out, err = dnnc_command("compile", cnn, "-o", artifact, "--json", cwd=folder)
    compiled = json.loads(out)["kernels"] if code == 0 else None
    loaded = dnnc.load(artifact).stats["kernels"] if code == 0 else None
    code2, out2, _ = dnnc_command("inspect", artifact, "--json", cwd=folder)
    inspected = json.loads(out2)["artifact"]["kernels"] if code2 == 0 else None
    check("one kernel count: compile, model.stats, dnnc.load, inspect x.dnnc",
          code == 0 and compiled == model.stats["kernels"] == loaded == inspected,
          f"compile {compiled}, stats {model.stats['kernels']}, load {loaded}, "
          f"inspect {inspected}; {err.strip()[-200:] if code else ''}")

    trace = folder / "prof.json"
    code, out, err = dnnc_command("bench", cnn, "--repeat", "20", "--profile", "--trace", trace,
                                  "--json", cwd=folder)
    if code == 0:
        doc = json.loads(out)
        events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
        row = doc["rows"][0]
        profile, theirs = row["profile"], row["onnxruntime_ms"]
        check("bench --profile --trace on cuda: an event per kernel, timed",
              doc["target"] == "cuda" and len(events) == len(profile) == compiled
              and all(e["dur"] > 0 for e in events),
              f"{len(events)} events, dnnc {row['dnnc_ms']:.4f} ms, onnxruntime (CPU) "
              f"{'n/a' if theirs is None else f'{theirs:.4f} ms'}, kernels' sum "
              f"{sum(p['ms'] for p in profile):.4f} ms")
    else:
        check("bench --profile --trace on cuda", False, err.strip()[-300:])

    code, out, err = dnnc_command("inspect", cnn, "--draw", folder / "g.svg", "--profile",
                                  "--json", cwd=folder)
    drawn = json.loads(out).get("draw", {}) if code == 0 else {}
    check("inspect --draw --profile on cuda", code == 0 and drawn.get("profiled") is True
          and drawn.get("kernels") == compiled, f"{drawn} {err.strip()[-300:] if code else ''}")

    start = time.perf_counter()
    code, out, err = dnnc_command("compare", cnn, "--bisect-passes", "--json", cwd=folder)
    found = json.loads(out) if out.strip().startswith("{") else {}
    check("compare --bisect-passes --json on cuda: no divergence",
          code == 0 and found.get("target") == "cuda" and found.get("divergence") is False,
          f"{time.perf_counter() - start:.1f} s; {found or err.strip()[-300:]}")

    print(f"{'FAILED: ' + ', '.join(FAILED) if FAILED else 'all checks passed'} "
          f"(files in {folder})")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
