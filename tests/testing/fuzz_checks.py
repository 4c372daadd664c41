"""What the fuzzer's generator tests share: a bug planted in the numpy target's reference of
one op, counted over seeded cases, and a seeded batch run through the fuzzer's command line."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from dnnc.testing import fuzz

ROOT = Path(__file__).resolve().parents[2]


def cases_a_planted_bug_changes(cases, op: str, buggy, monkeypatch) -> int:
    """How many of `cases` differ when op `op`'s reference is replaced by `buggy(its
    evaluate)`, run as the target under test against the true reference; no case differs
    from itself first."""
    from dnnc.ir.ops import registry

    truth = []
    for case in cases:
        runs = [case.draw_inputs(r) for r in range(2)]
        truth.append((runs, fuzz.numpy_outputs(case.model.SerializeToString(), runs)))
    reference = registry.get_op(op)
    monkeypatch.setitem(registry._REGISTRY, op, dataclasses.replace(
        reference, evaluate=buggy(reference.evaluate)))
    found = 0
    for case, (runs, want) in zip(cases, truth):
        names = [o.name for o in case.model.graph.output]
        assert not fuzz.differences(want, want, names)
        got = fuzz.numpy_outputs(case.model.SerializeToString(), runs)
        found += bool(fuzz.differences(got, want, names))
    return found


def seeded_batch_finds_nothing(tmp_path, seed: int, cases: int, boost: str) -> None:
    """`cases` cases of `seed` with `--boost boost` on the llvm target (2 threads) against
    numpy and onnxruntime: every one passes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "dnnc.testing.fuzz", "--cases", str(cases), "--seed", str(seed),
         "--boost", boost, "--threads", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert f"cases {cases}, passed" in proc.stdout
