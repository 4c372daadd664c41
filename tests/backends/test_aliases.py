"""Outputs a graph writes into its inputs (`Graph.aliases`, a KV cache updated by IndexCopy):
after each call the caller's array holds the output's value on every target, computed in place
by its kernel where nothing else reads the old value (`plan.in_place_outputs`), else copied
there after the call; a strided or read-only input, an artifact round trip."""

import numpy as np
import pytest

import dnnc
from dnnc.errors import InputError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value


def cache_graph(old_read: bool, width: int = 4, positions: int | str = 2) -> Graph:
    """cache[:, pos] = relu(x); returns the new cache (written into input 0) and
    new cache * 2 (+ the old cache's sum with `old_read`). `positions`: pos's length, or a
    symbolic dim's name (a prompt's length under dynamic shapes)."""
    g = Graph("cache")
    cache = g.add_input("cache", T.TensorType(T.float32, (2, 6, width)))
    pos = g.add_input("pos", T.TensorType(T.int64, (positions,)))
    x = g.add_input("x", T.TensorType(T.float32, (2, positions, width)))
    new = g.add("IndexCopy", cache, pos, g.add("Relu", x), axis=1)
    two = Value("two", T.TensorType(T.float32, ()), const=np.array(2, np.float32))
    out = g.add("Mul", new, two)
    if old_read:
        out = g.add("Add", out, cache)
    g.outputs = [new, out]
    g.aliases = {0: 0}
    g.verify()
    return g


def reference(cache, pos, x, old_read):
    new = cache.copy()
    new[:, pos % 6] = np.maximum(x, 0)
    out = new * 2 + (cache if old_read else 0)
    return new, out


@pytest.mark.parametrize("old_read", [False, True])
@pytest.mark.parametrize("target", ["numpy", "llvm"])
def test_the_callers_cache_holds_each_steps_value(rng, target, old_read):
    model = dnnc.compile(cache_graph(old_read), target, cache=False)
    cache = np.zeros((2, 6, 4), np.float32)
    want = cache.copy()
    for step in range(3):
        pos = np.array([2 * step, -1 - step], np.int64)
        x = rng.standard_normal((2, 2, 4)).astype(np.float32)
        want, out = reference(want, pos, x, old_read)
        got = model(cache, pos, x)
        assert got[0] is cache   # the caller's array, written
        np.testing.assert_array_equal(cache, want)
        np.testing.assert_allclose(got[1], out, rtol=1e-6)
    if target == "llvm":   # in place unless the old cache is read beside the write
        (seg,) = model.runtime.compiled_segments()
        assert list(seg.in_place) == ([] if old_read else [0])   # escaping output 0


@pytest.mark.parametrize("target", ["numpy", "llvm"])
def test_a_position_written_twice_keeps_its_last_value(rng, target):
    model = dnnc.compile(cache_graph(False), target, cache=False)
    cache = rng.standard_normal((2, 6, 4)).astype(np.float32)
    for pos in ([3, 3], [-2, 4], [0, 0]):
        pos = np.array(pos, np.int64)
        x = rng.standard_normal((2, 2, 4)).astype(np.float32)
        want, _ = reference(cache.copy(), pos, x, False)
        model(cache, pos, x)
        np.testing.assert_array_equal(cache, want)


@pytest.mark.parametrize("target", ["numpy", "llvm"])
def test_positions_of_a_run_time_length_are_written_by_a_kernel(rng, target):
    """A prompt's positions, their count symbolic (dynamo's dynamic sequence length): the
    IndexCopy runs in a kernel (the staged form: each cache row's last writer), in the
    caller's array, for any count, repeated positions keeping their last value."""
    model = dnnc.compile(cache_graph(False, positions="S"), target, cache=False)
    cache = rng.standard_normal((2, 6, 4)).astype(np.float32)
    for pos in ([3], [0, 5, 1, -1], [2, -4, 3, 2, 0, 2, 5], list(range(6)) * 12):
        pos = np.array(pos, np.int64)
        x = rng.standard_normal((2, len(pos), 4)).astype(np.float32)
        want, out = reference(cache.copy(), pos, x, False)
        got = model(cache, pos, x)
        assert got[0] is cache
        np.testing.assert_array_equal(cache, want)
        np.testing.assert_array_equal(got[1], out)
    if target == "llvm":
        assert model.stats["host_fallback_ops"] == 0
        assert all(list(seg.in_place) == [0] for seg in model.runtime.compiled_segments())


def test_an_in_place_write_stores_only_its_positions():
    """Computed in the cache's array, the IndexCopy kernel loops over the written rows alone
    (`OpDef.updates`), not over the whole cache with a Select per position."""
    from dnnc.ir import loop as L

    model = dnnc.compile(cache_graph(False, width=8), "llvm", cache=False)
    (seg,) = model.runtime.compiled_segments()
    (kernel,) = [k for k in seg.kernels if k.anchor.op == "IndexCopy"]
    stores = [n for n in L.walk(kernel.func.body) if isinstance(n, L.Store)]
    loops = [n.extent.value for n in L.walk(kernel.func.body) if isinstance(n, L.For)]
    assert [s.buffer.name for s in stores] == [kernel.func.params[3].name]
    assert np.prod(loops) == 2 * 2 * 8   # the updates' elements, not the cache's 2 * 6 * 8


def counter_graph(read_after: bool) -> Graph:
    """count + 1 written into count (a counter beside a cache); with `read_after`, also
    (count + 1) * 2, which fusion puts in the Add's kernel."""
    g = Graph("counter")
    count = g.add_input("count", T.TensorType(T.int64, (3,)))
    one = Value("one", T.TensorType(T.int64, ()), const=np.array(1, np.int64))
    new = g.add("Add", count, one)
    g.outputs = [new]
    if read_after:
        two = Value("two", T.TensorType(T.int64, ()), const=np.array(2, np.int64))
        g.outputs.append(g.add("Mul", new, two))
    g.aliases = {0: 0}
    g.verify()
    return g


@pytest.mark.parametrize("read_after", [False, True])
def test_an_elementwise_update_is_computed_in_its_input(read_after):
    """An elementwise op's output written into its own input is computed there, unless its
    kernel reads it again (an inlined read would see the new value)."""
    model = dnnc.compile(counter_graph(read_after), "llvm", cache=False)
    count = np.array([0, 5, -2], np.int64)
    for step in range(1, 4):
        got = model(count)
        np.testing.assert_array_equal(count, [step, 5 + step, step - 2])
        if read_after:
            np.testing.assert_array_equal(got[1], 2 * count)
    (seg,) = model.runtime.compiled_segments()
    fused = len(seg.kernels) == 1
    assert list(seg.in_place) == ([] if read_after and fused else [0])


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("opt_level", [0, 3])
def test_an_input_read_elsewhere_is_updated_in_place_after_its_readers(first, opt_level):
    """gpt2's counter: the positions its cache writes at read the old count, then `+ 1`
    writes it. In place where the other reader's kernel runs first (the input's old value
    is read there, before the update's kernel). Where the graph has the update first (as
    torch 2.11 exports gpt2's decode step), `sink_updates` (opt level 1 on) moves it after
    the reader, so it is in place there too; at level 0, the graph as imported, it is
    computed apart and copied in after the call."""
    g = Graph("counter")
    count = g.add_input("count", T.TensorType(T.int64, (3,)))

    def const(name, value):
        return Value(name, T.TensorType(T.int64, ()), const=np.array(value, np.int64))

    def positions():
        return g.add("Mul", count, const("three", 3))

    before = positions() if first else None
    new = g.add("Add", count, const("one", 1))
    after = positions() if not first else None
    g.outputs = [new, before if first else after]
    g.aliases = {0: 0}
    g.verify()
    model = dnnc.compile(g, "llvm", cache=False, opt_level=opt_level)
    count = np.array([0, 5, -2], np.int64)
    for step in range(1, 4):
        got = model(count)
        np.testing.assert_array_equal(count, [step, 5 + step, step - 2])
        np.testing.assert_array_equal(got[1], 3 * (count - 1))   # the old count's
    (seg,) = model.runtime.compiled_segments()
    in_place = first or opt_level > 0
    assert list(seg.in_place.values()) == ([0] if in_place else [])   # data input 0


def test_a_strided_cache_is_written_back(rng):
    model = dnnc.compile(cache_graph(False), "llvm", cache=False)
    whole = np.zeros((2, 6, 8), np.float32)
    cache = whole[:, :, ::2]   # not contiguous: computed on a copy, then written back
    pos, x = np.array([1, 3]), rng.standard_normal((2, 2, 4)).astype(np.float32)
    want, _ = reference(cache.copy(), pos, x, False)
    model(cache, pos, x)
    np.testing.assert_array_equal(whole[:, :, ::2], want)
    assert not whole[:, :, 1::2].any()


def test_a_read_only_cache_is_refused(rng):
    model = dnnc.compile(cache_graph(True), "llvm", cache=False)
    cache = np.zeros((2, 6, 4), np.float32)
    cache.setflags(write=False)
    with pytest.raises(InputError, match="read-only"):
        model(cache, np.array([0, 1]), np.ones((2, 2, 4), np.float32))


def test_an_artifact_keeps_the_writes(rng, tmp_path):
    model = dnnc.compile(cache_graph(False), "llvm", cache=False)
    model.save(tmp_path / "cache.dnnc")
    loaded = dnnc.load(tmp_path / "cache.dnnc")
    assert loaded.graph.aliases == {0: 0}
    cache = np.zeros((2, 6, 4), np.float32)
    pos, x = np.array([0, 5]), rng.standard_normal((2, 2, 4)).astype(np.float32)
    want, _ = reference(cache.copy(), pos, x, False)
    loaded(cache, pos, x)
    np.testing.assert_array_equal(cache, want)
    (seg,) = loaded.runtime.compiled_segments()
    assert list(seg.in_place) == [0]


def test_verify_refuses_a_write_of_another_type():
    g = cache_graph(False)
    g.aliases = {1: 2}   # out (2, 6, 4) into x (2, 2, 4)
    with pytest.raises(ValueError, match="cannot be written"):
        g.verify()
