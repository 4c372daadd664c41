"""The on-disk compile cache (compiler/cache.py): a second compile of the same model loads the
first one's code, in this process or another; anything that changes the code misses; a bad
entry is replaced; the folder stays within its bound; concurrent processes are safe."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

import dnnc
from dnnc import zoo
from dnnc.compiler import cache

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The cache on, in a folder of its own; every compile stored, however short."""
    monkeypatch.setenv("DNNC_CACHE", "1")
    monkeypatch.setenv("DNNC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "MIN_STORE_SECONDS", 0.0)
    return tmp_path / "cache" / "models"


@pytest.fixture
def mlp_file(tmp_path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(zoo.build("mlp", batch=2), path)
    return path


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + cache.SUFFIX))


def test_a_second_compile_loads_the_first_ones_code(folder, mlp_file, rng):
    first = dnnc.compile(mlp_file, "llvm")
    assert first.stats["compile_cache"] == "miss"
    assert len(entries(folder)) == 1
    second = dnnc.compile(mlp_file, "llvm")
    assert second.stats["compile_cache"] == "hit"
    assert second.stats["kernels"] == first.stats["kernels"]
    assert second.stats["arena_bytes"] == first.stats["arena_bytes"]
    x = rng.standard_normal((2, 784)).astype(np.float32)
    want = dnnc.compile(mlp_file, "numpy").run(x)[0]
    np.testing.assert_allclose(second.run(x)[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(second.run(x)[0], first.run(x)[0])


def test_a_new_process_hits_the_cache(folder, mlp_file):
    dnnc.compile(mlp_file, "llvm")
    script = textwrap.dedent(f"""
        import dnnc
        m = dnnc.compile({str(mlp_file)!r}, "llvm")
        print(m.stats["compile_cache"])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert out.stdout.strip() == "hit"


def test_code_a_call_compiles_is_kept_for_the_next_process(folder, tmp_path):
    """A symbolic batch compiles its code at the first call, after the compile stored the
    model: the entry is stored again then, so a new process's hit runs that size at once."""
    path = tmp_path / "mlp_n.onnx"
    onnx.save(zoo.build("mlp", batch="N"), path)
    first = dnnc.compile(path, "llvm")
    x = np.random.default_rng(3).standard_normal((5, 784)).astype(np.float32)
    first.run(x)
    assert first.stats["specializations"] == 1
    script = textwrap.dedent(f"""
        import numpy as np, dnnc
        m = dnnc.compile({str(path)!r}, "llvm")
        x = np.random.default_rng(3).standard_normal((5, 784)).astype(np.float32)
        before = m.stats["specializations"]
        y = m.run(x)[0]
        print(m.stats["compile_cache"], before, m.stats["jit_seconds"])
        np.save({str(tmp_path / "y.npy")!r}, y)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    said, restored, jit = out.stdout.split()
    assert (said, restored, float(jit)) == ("hit", "1", 0.0)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), first.run(x)[0])


def test_what_changes_the_code_misses(folder, mlp_file, tmp_path):
    dnnc.compile(mlp_file, "llvm")
    assert dnnc.compile(mlp_file, "llvm", opt_level=2).stats["compile_cache"] == "miss"
    other = zoo.build("mlp", batch=2, seed=1)   # other weights, same structure
    assert dnnc.compile(other, "llvm").stats["compile_cache"] == "miss"
    graph = dnnc.compile(mlp_file, "numpy").graph
    assert dnnc.compile(graph, "llvm").stats["compile_cache"] == "miss"
    assert dnnc.compile(graph, "llvm").stats["compile_cache"] == "hit"
    assert len(entries(folder)) == 4


def test_weights_in_external_files_are_part_of_the_key(folder, tmp_path):
    model = zoo.build("mlp", batch=1)
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.bin",
              size_threshold=0)
    key = cache.key(path, None, "llvm", "m", {}, None)
    data = bytearray((tmp_path / "ext.bin").read_bytes())
    data[100] ^= 0xFF
    (tmp_path / "ext.bin").write_bytes(bytes(data))
    assert cache.key(path, None, "llvm", "m", {}, None) != key


def test_off_switches(folder, mlp_file, monkeypatch):
    assert dnnc.compile(mlp_file, "llvm", cache=False).stats["compile_cache"] == "off"
    monkeypatch.setenv("DNNC_CACHE", "0")
    assert dnnc.compile(mlp_file, "llvm").stats["compile_cache"] == "off"
    assert entries(folder) == []
    with pytest.raises(dnnc.errors.ArgumentError, match="cache"):
        dnnc.compile(mlp_file, "llvm", cache="yes")


def test_debugging_compiles_are_not_cached(folder, mlp_file, tmp_path):
    assert dnnc.compile(mlp_file, "llvm", passes=1).stats["compile_cache"] == "off"
    assert dnnc.compile(mlp_file, "llvm", dump_ir=tmp_path / "ir").stats["compile_cache"] == \
        "off"
    assert dnnc.compile(mlp_file, "numpy").stats.get("compile_cache", "off") == "off"
    assert entries(folder) == []


def test_a_corrupt_entry_is_replaced(folder, mlp_file, capfd):
    dnnc.compile(mlp_file, "llvm")
    [entry] = entries(folder)
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])
    capfd.readouterr()
    again = dnnc.compile(mlp_file, "llvm")
    assert again.stats["compile_cache"] == "miss"
    assert "dropped an entry that does not load" in capfd.readouterr().err
    assert dnnc.compile(mlp_file, "llvm").stats["compile_cache"] == "hit"


def test_the_folder_keeps_to_its_bound(folder, tmp_path):
    folder.mkdir(parents=True)
    for k, size in enumerate((300, 200, 100)):
        path = folder / f"{k}{cache.SUFFIX}"
        path.write_bytes(b"x" * size)
        os.utime(path, (1000 + k, 1000 + k))   # 0 the least recently used
    cache.trim(folder, 350)
    assert [p.name for p in entries(folder)] == [f"1{cache.SUFFIX}", f"2{cache.SUFFIX}"]


def test_concurrent_processes_share_the_folder_safely(folder, mlp_file):
    script = textwrap.dedent(f"""
        import numpy as np, dnnc
        from dnnc.compiler import cache
        cache.MIN_STORE_SECONDS = 0.0
        m = dnnc.compile({str(mlp_file)!r}, "llvm")
        x = np.random.default_rng(1).standard_normal((2, 784)).astype(np.float32)
        print(m.stats["compile_cache"], float(m.run(x)[0].sum()))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    sums = {out.split()[1] for out, _ in outs}
    assert len(sums) == 1
    assert len(entries(folder)) == 1
    assert not list(folder.glob("*.tmp"))
    assert dnnc.compile(mlp_file, "llvm").stats["compile_cache"] == "hit"


def test_cli_reads_the_cache_unless_told_not_to(folder, mlp_file, tmp_path):
    from dnnc.compiler.driver import load_graph

    dnnc.compile(load_graph(mlp_file), "llvm")   # the CLI compiles the graph it imports
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "dnnc", "compile", "-q", "--json", str(mlp_file),
           "--target", "llvm", "-o", str(tmp_path / "m.dnnc")]
    said = [json.loads(subprocess.run(run + flag, env=env, check=True, capture_output=True,
                                      text=True).stdout)["compile_cache"]
            for flag in ([], ["--no-cache"])]
    assert said == ["hit", "off"]
    assert dnnc.load(tmp_path / "m.dnnc").stats["kernels"] > 0
