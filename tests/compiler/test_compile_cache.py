"""The on-disk compile cache (compiler/cache.py): a second compile of the same model loads the
first one's code, in this process or another; anything that changes the code misses; a bad
entry is replaced; the folder stays within its bound; concurrent processes are safe."""

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

import dnnc
from dnnc import zoo
from dnnc.compiler import cache
from dnnc.compiler.artifact import read_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The cache on, in a folder of its own; every compile stored, however short; the
    warnings given once a process given again."""
    monkeypatch.setenv("DNNC_CACHE", "1")
    monkeypatch.setenv("DNNC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DNNC_CACHE_MAX_BYTES", raising=False)
    monkeypatch.setattr(cache, "MIN_STORE_SECONDS", 0.0)
    monkeypatch.setattr(cache, "_warned", set())
    return tmp_path / "cache" / "models"


@pytest.fixture
def mlp_file(tmp_path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(zoo.build("mlp", batch=2), path)
    return path


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + cache.SUFFIX))


def key_named(k: int) -> str:
    """A file name of the form `key()` gives, the k-th."""
    return f"{k:064x}{cache.SUFFIX}"


def mlp_outputs(model, seed=0):
    x = np.random.default_rng(seed).standard_normal((2, 784)).astype(np.float32)
    return model.run(x)[0]


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
    assert cache.wait(60)   # the store that call asked for runs in the background
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


def symbolic_mlp(tmp_path):
    """An mlp of batch N compiled with the cache, each new batch size compiling its own code
    in its first call (no run on another size's code first) and so asking for a store."""
    path = tmp_path / "mlp_n.onnx"
    onnx.save(zoo.build("mlp", batch="N"), path)
    model = dnnc.compile(path, "llvm")
    model.runtime.batch_split = False
    return path, model


def batch(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 784)).astype(np.float32)


def test_no_call_waits_on_the_cache(folder, tmp_path, monkeypatch):
    """Issue 30, item 7: the store a call's new code asks for ran in the calling thread (35
    rewrites of the whole entry made 100 new batch sizes take 31.5 s against 22.4 s). With a
    writer that does not finish until told, calls at new sizes return; the stores they ask
    for while one runs become one more; the entry then holds every size."""
    import threading

    path, model = symbolic_mlp(tmp_path)
    began, release, writes, real = threading.Event(), threading.Event(), [], cache.store

    def held_store(entry_key, m):
        writes.append("started")
        began.set()
        release.wait(30)
        real(entry_key, m)
        writes.append("done")

    monkeypatch.setattr(cache, "store", held_store)
    for n in (3, 5, 7):
        model.run(batch(n))
    assert began.wait(30)
    assert writes == ["started"]   # the calls returned while the first store was held
    assert model.stats["specializations"] == 3
    release.set()
    assert cache.wait(60)
    assert writes == ["started", "done", "started", "done"]   # the two asked later: one
    hit = dnnc.compile(path, "llvm")
    assert hit.stats["compile_cache"] == "hit"
    assert hit.stats["specializations"] == 3
    for n in (3, 5, 7):
        np.testing.assert_array_equal(hit.run(batch(n))[0], model.run(batch(n))[0])
    assert hit.stats["jit_seconds"] == 0.0


def test_a_store_running_at_exit_is_finished(folder, tmp_path):
    """A process that exits right after a call asked for a store leaves a whole entry with
    that call's code (the exit waits for the writer), and no temporary file."""
    path = tmp_path / "mlp_n.onnx"
    onnx.save(zoo.build("mlp", batch="N"), path)
    script = textwrap.dedent(f"""
        import numpy as np, dnnc
        from dnnc.compiler import cache
        cache.MIN_STORE_SECONDS = 0.0
        m = dnnc.compile({str(path)!r}, "llvm")
        m.runtime.batch_split = False
        for n in (3, 5):
            m.run(np.zeros((n, 784), np.float32))
    """)
    subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                   check=True, timeout=300)
    assert not list(folder.glob("*.tmp"))
    hit = dnnc.compile(path, "llvm")
    assert (hit.stats["compile_cache"], hit.stats["specializations"]) == ("hit", 2)


def test_what_changes_the_code_misses(folder, mlp_file, tmp_path):
    dnnc.compile(mlp_file, "llvm")
    assert dnnc.compile(mlp_file, "llvm", opt_level=2).stats["compile_cache"] == "miss"
    other = zoo.build("mlp", batch=2, seed=1)   # other weights, same structure
    assert dnnc.compile(other, "llvm").stats["compile_cache"] == "miss"
    optimised = dnnc.compile(mlp_file, "llvm", cache=False).graph   # another graph
    assert dnnc.compile(optimised, "llvm").stats["compile_cache"] == "miss"
    assert dnnc.compile(optimised, "llvm").stats["compile_cache"] == "hit"
    assert len(entries(folder)) == 4


def test_one_model_is_one_entry_however_it_is_given(folder, mlp_file):
    """The key digests the imported graph: the path, its bytes, its ModelProto and the
    Graph imported from it (what `dnnc compile` passes) are one model."""
    dnnc.compile(mlp_file, "llvm")
    imported = dnnc.compile(mlp_file, "numpy").graph   # the numpy target runs it as imported
    for model in (mlp_file.read_bytes(), onnx.load(mlp_file), imported):
        assert dnnc.compile(model, "llvm").stats["compile_cache"] == "hit"
    assert dnnc.compile(mlp_file, "llvm", outputs="numpy").stats["compile_cache"] == "hit"
    assert len(entries(folder)) == 1


def test_weights_in_external_files_are_part_of_the_key(folder, tmp_path):
    from dnnc.compiler.driver import load_graph

    model = zoo.build("mlp", batch=1)
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.bin",
              size_threshold=0)
    key = cache.key(load_graph(path), "llvm", "m", {}, None)
    data = bytearray((tmp_path / "ext.bin").read_bytes())
    data[100] ^= 0xFF
    (tmp_path / "ext.bin").write_bytes(bytes(data))
    assert cache.key(load_graph(path), "llvm", "m", {}, None).name != key.name


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
        path = folder / key_named(k)
        path.write_bytes(b"x" * size)
        os.utime(path, (1000 + k, 1000 + k))   # 0 the least recently used
    cache.trim(folder, 350)
    assert [p.name for p in entries(folder)] == [key_named(1), key_named(2)]


def test_trim_and_clear_leave_a_users_own_files(folder, mlp_file):
    """`models/` is a common name: a user's artifacts saved there are not entries."""
    model = dnnc.compile(mlp_file, "llvm")
    mine = [folder / "mine.dnnc", folder / ("f" * 63 + cache.SUFFIX), folder / "notes.tmp"]
    for path in mine:
        model.save(path)
        os.utime(path, (1000, 1000))   # older than any entry
    cache.trim(folder, 0)
    assert entries(folder) == sorted(mine[:2])
    dnnc.compile(mlp_file, "llvm")
    assert len(entries(folder)) == 3
    assert cache.clear() == 1
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in mine)


def test_a_dead_writers_temporary_files_are_counted_then_removed(folder):
    folder.mkdir(parents=True)
    now = time.time()
    entry = folder / key_named(0)
    entry.write_bytes(b"x" * 100)
    os.utime(entry, (now - 10, now - 10))
    young = folder / (key_named(1) + ".k3j_x9.tmp")   # a writer at work
    old = folder / (key_named(2) + ".a8bq2z.tmp")     # a writer killed long ago
    for path, age in ((young, 60), (old, cache.TMP_MAX_AGE + 60)):
        path.write_bytes(b"x" * 300)
        os.utime(path, (now - age, now - age))
    cache.trim(folder, 500)   # 400 bytes once the old one is gone: within
    assert sorted(p.name for p in folder.iterdir()) == sorted([entry.name, young.name])
    cache.trim(folder, 350)   # the young one counts: the entry goes
    assert [p.name for p in folder.iterdir()] == [young.name]


@pytest.mark.parametrize("text, size", [("2000000", 2_000_000), ("1e6", 10**6),
                                        ("500M", 500 << 20), ("2G", 2 << 30),
                                        ("64KiB", 64 << 10), ("1.5g", 3 << 29), ("100B", 100),
                                        ("0", 0)])
def test_the_bound_is_parsed(folder, monkeypatch, text, size):
    monkeypatch.setenv("DNNC_CACHE_MAX_BYTES", text)
    assert cache.max_bytes() == size


@pytest.mark.parametrize("text", ["lots", "-5", "1.5", "2X", "5iB", "1e400", "nan", ""])
def test_a_bound_that_is_no_size_is_refused_once(folder, monkeypatch, text):
    monkeypatch.setenv("DNNC_CACHE_MAX_BYTES", text)
    with pytest.warns(cache.CompileCacheWarning, match="DNNC_CACHE_MAX_BYTES"):
        assert cache.max_bytes() == cache.DEFAULT_MAX_BYTES
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.max_bytes() == cache.DEFAULT_MAX_BYTES


def test_the_folder_and_its_entries_are_private(folder, mlp_file):
    dnnc.compile(mlp_file, "llvm")
    [entry] = entries(folder)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600


def refused(mlp_file, match, then="miss"):
    """Compile `mlp_file` where the cache is not to be trusted: one warning, no hit, the
    model's own outputs; then `then` without a warning (an untrusted folder is never used;
    an untrusted entry in a trusted folder is replaced by this compile's own)."""
    with pytest.warns(cache.CompileCacheWarning, match=match):
        model = dnnc.compile(mlp_file, "llvm")
    assert model.stats["compile_cache"] == "miss"
    np.testing.assert_allclose(mlp_outputs(model), mlp_outputs(dnnc.compile(mlp_file, "numpy")),
                               rtol=1e-4, atol=1e-5)
    with warnings.catch_warnings():   # once a process
        warnings.simplefilter("error")
        assert dnnc.compile(mlp_file, "llvm").stats["compile_cache"] == then


def plant(folder, mlp_file, tmp_path) -> Path:
    """The entry of `mlp_file`, replaced by another model's (what another user could write
    there): code that answers wrong."""
    dnnc.compile(mlp_file, "llvm")
    [entry] = entries(folder)
    other = tmp_path / "other.onnx"
    onnx.save(zoo.build("mlp", batch=2, seed=1), other)
    dnnc.compile(other, "llvm")
    [foreign] = set(entries(folder)) - {entry}
    os.replace(foreign, entry)
    return entry


def test_a_world_writable_folder_is_not_used(folder, mlp_file, tmp_path):
    plant(folder, mlp_file, tmp_path)
    os.chmod(folder, 0o777)
    refused(mlp_file, "writable by group or others")
    assert len(entries(folder)) == 1


def test_a_group_writable_entry_is_not_used(folder, mlp_file, tmp_path):
    entry = plant(folder, mlp_file, tmp_path)
    os.chmod(entry, 0o660)
    refused(mlp_file, "writable by group or others", then="hit")
    [entry] = entries(folder)
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600


def test_a_folder_of_another_user_is_not_used(folder, mlp_file, tmp_path, monkeypatch):
    plant(folder, mlp_file, tmp_path)
    monkeypatch.setattr(cache, "_uid", lambda: os.geteuid() + 1)   # this user: another one
    refused(mlp_file, "is owned by user")


def test_an_entry_of_another_user_is_not_used(folder, mlp_file, tmp_path, monkeypatch):
    """The folder is this user's, the entry someone else's (CI runs as root: the test user
    stands in as the folder's owner, the root-owned entry is the other user's)."""
    entry = plant(folder, mlp_file, tmp_path)
    me = os.geteuid() + 1
    os.chown(folder, me, -1) if os.geteuid() == 0 else pytest.skip("gives a folder away")
    monkeypatch.setattr(cache, "_uid", lambda: me)
    assert os.stat(entry).st_uid != me
    refused(mlp_file, "is owned by user")


def test_a_symbolic_link_is_not_an_entry(folder, mlp_file, tmp_path):
    dnnc.compile(mlp_file, "llvm")
    [entry] = entries(folder)
    os.replace(entry, tmp_path / "elsewhere.dnnc")
    entry.symlink_to(tmp_path / "elsewhere.dnnc")
    refused(mlp_file, "cannot be opened as a plain file", then="hit")
    assert not entry.is_symlink()
    assert (tmp_path / "elsewhere.dnnc").stat().st_size > 0   # written beside, not through


def test_an_entry_copied_under_another_key_is_dropped(folder, mlp_file, tmp_path):
    """Model B's valid entry (same signature, other weights) under model A's name: A is
    compiled anew, B's entry dropped, A's outputs."""
    entry = plant(folder, mlp_file, tmp_path)
    with pytest.warns(cache.CompileCacheWarning, match="records another compile"):
        model = dnnc.compile(mlp_file, "llvm")
    assert model.stats["compile_cache"] == "miss"
    np.testing.assert_allclose(mlp_outputs(model), mlp_outputs(dnnc.compile(mlp_file, "numpy")),
                               rtol=1e-4, atol=1e-5)
    assert read_manifest(entry)["compile_cache"]["key"] == entry.name[: -len(cache.SUFFIX)]
    assert dnnc.compile(mlp_file, "llvm").stats["compile_cache"] == "hit"


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
    dnnc.compile(mlp_file, "llvm")   # the path: the CLI compiles the graph it imports
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "dnnc", "compile", "-q", "--json", str(mlp_file),
           "--target", "llvm", "-o", str(tmp_path / "m.dnnc")]
    said = [json.loads(subprocess.run(run + flag, env=env, check=True, capture_output=True,
                                      text=True).stdout)["compile_cache"]
            for flag in ([], ["--no-cache"])]
    assert said == ["hit", "off"]
    assert dnnc.load(tmp_path / "m.dnnc").stats["kernels"] > 0


def test_python_reads_what_the_cli_compiled(folder, mlp_file, tmp_path):
    """`dnnc compile m.onnx`, then `dnnc.compile("m.onnx")` in another process: one entry."""
    from dnnc.compiler.cli import main

    assert main(["compile", "-q", str(mlp_file), "--target", "llvm",
                 "-o", str(tmp_path / "m.dnnc")]) == 0
    script = textwrap.dedent(f"""
        import dnnc
        print(dnnc.compile({str(mlp_file)!r}, "llvm").stats["compile_cache"])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert out.stdout.strip() == "hit"
    assert len(entries(folder)) == 1


def test_a_hit_reports_the_memory_stats_of_the_fresh_compile(folder, mlp_file):
    """Issue 30 item 16: a compile served from the cache reported no `naive_bytes`,
    `live_lower_bound_bytes` or `workspace_bytes` (its code is restored, not planned), though
    the fresh compile did: a hit, in this process or a new one, reports the same keys, and
    the memory figures of the compile that stored it."""
    fresh = dnnc.compile(mlp_file, "llvm")
    memory = ("naive_bytes", "live_lower_bound_bytes", "workspace_bytes", "inplace_kernels")
    assert all(k in fresh.stats for k in memory)
    hit = dnnc.compile(mlp_file, "llvm")
    assert hit.stats["compile_cache"] == "hit"
    assert set(hit.stats) - {"load_seconds"} == set(fresh.stats)   # a load adds its time
    assert {k: hit.stats[k] for k in memory} == {k: fresh.stats[k] for k in memory}
    script = textwrap.dedent(f"""
        import json, dnnc
        m = dnnc.compile({str(mlp_file)!r}, "llvm")
        print(json.dumps(m.stats))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    other = json.loads(out.stdout)
    assert other["compile_cache"] == "hit"
    assert set(other) - {"load_seconds"} == set(fresh.stats)
    assert {k: other[k] for k in memory} == {k: fresh.stats[k] for k in memory}


def test_a_graph_with_bfloat16_constants_is_cached(folder):
    """The key hashes constants' bytes: a memoryview of a bfloat16 array ('E') raised
    ValueError, so such a graph (a bf16 torch module through the torch backend) failed to
    compile with the cache on."""
    from dnnc.frontend.onnx import constant_value
    from dnnc.ir import types as T

    graph = dnnc.Graph("bf16")
    x = graph.add_input("x", T.TensorType(T.bfloat16, (2, 8)))
    weights = np.arange(64, dtype=np.float32).reshape(8, 8).astype(T.bfloat16.np)
    graph.outputs.append(graph.add("MatMul", x, constant_value("w", weights)))
    model = dnnc.compile(graph, "llvm")
    assert model.stats["compile_cache"] == "miss"
    assert dnnc.compile(graph, "llvm").stats["compile_cache"] == "hit"


def test_kernels_counted_alike_after_a_load_and_a_compile_cache_hit(folder, tmp_path):
    """A Concat whose parts their producers write in place is no kernel (`plan.views_in_place`:
    a DenseNet block's growing concat): a compile, a compile cache hit and the artifact loaded
    count the same kernels (the hit and the load counted the segment's node groups, each such
    Concat among them: densenet121's 187 kernels read 241)."""
    from dnnc.ir import types as T
    from dnnc.ir.graph import Graph, Value

    rng = np.random.default_rng(0)

    def conv(g, x, k, c, m):
        w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
        return g.add("Conv", x, Value(f"w{k}", T.TensorType(T.float32, w.shape), const=w))

    g = Graph("g")
    cur, channels = conv(g, g.add_input("x", T.TensorType(T.float32, (1, 4, 8, 8))), 0, 4, 4), 4
    for k in range(1, 4):   # a DenseNet block: each layer's 2 channels joined to the rest
        cur = g.add("Concat", cur, conv(g, g.add("Relu", cur), k, channels, 2), axis=1)
        channels += 2
    g.outputs = [g.add("Relu", cur)]
    fresh = dnnc.compile(g, "llvm", cache=False)
    assert dnnc.compile(g, "llvm").stats["compile_cache"] == "miss"
    hit = dnnc.compile(g, "llvm")
    assert hit.stats["compile_cache"] == "hit"
    fresh.save(tmp_path / "m.dnnc")
    loaded = dnnc.load(tmp_path / "m.dnnc")
    assert hit.stats["kernels"] == loaded.stats["kernels"] == fresh.stats["kernels"] == 8
