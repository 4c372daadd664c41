"""Out-of-range gather and scatter indices at run time (issue 30, item 3): every target
raises `InputError` naming the node, the index and the bound, for graph inputs and for indices
computed inside the graph; in-range indices, negative ones included, keep the reference's
result. The numpy target and host fallbacks (the scatters on every target) check in the
references; llvm and cuda kernels check each index they read (`loop.index_checks`: the kernel
clamps and records the first error, the runtime raises after the call), from worker threads
and parallel kernels too, and the model answers the next good call.

Every gather-like op on llvm, opt levels 0 and 3, 1 and 2 threads, runs in child processes
(`test_every_gather_on_llvm_threads_and_opt_levels`); the cuda cases need a GPU:
`python -m pytest -n 0 -q tests/backends/test_index_range.py -k cuda` on one."""

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc import zoo
from dnnc.backends.cuda import device
from dnnc.errors import InputError

TABLE = np.arange(15, dtype=np.float32).reshape(5, 3)
GPU = pytest.mark.skipif(not device.available(), reason="no GPU: the cuda target's cases "
                                                        "run on a GPU machine")
TARGETS = ["numpy", "llvm", pytest.param("cuda", marks=GPU)]
"""Every target checks indices at run time."""


def _compile(model, target: str, **options):
    """`dnnc.compile`, returning NumPy arrays on every target."""
    if target == "cuda":
        options["outputs"] = "numpy"
    return dnnc.compile(model, target=target, **options)


def _gather_model(offset: int | None = None):
    """out = Gather(table, ids) or, with `offset`, Gather(table, ids + offset) (an index the
    graph computes)."""
    nodes, inits = [], [numpy_helper.from_array(TABLE, "table")]
    ids = "ids"
    if offset is not None:
        inits.append(numpy_helper.from_array(np.array(offset, np.int64), "offset"))
        nodes.append(helper.make_node("Add", ["ids", "offset"], ["shifted"], name="shift"))
        ids = "shifted"
    nodes.append(helper.make_node("Gather", ["table", ids], ["out"], name="lookup", axis=0))
    graph = helper.make_graph(
        nodes, "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [5, -6, 10**12, -10**6, 2**62])
def test_out_of_range_input_index_raises(target, bad):
    model = _compile(_gather_model(), target)
    with pytest.raises(InputError, match=rf"Gather node 'lookup': index {bad} .*size 5"):
        model(ids=np.array([0, 1, bad, 2], np.int64))


@pytest.mark.parametrize("target", TARGETS)
def test_out_of_range_computed_index_raises(target):
    model = _compile(_gather_model(offset=3), target)
    with pytest.raises(InputError, match=r"Gather node 'lookup': index 6 .*size 5"):
        model(ids=np.array([0, 1, 3, 1], np.int64))


@pytest.mark.parametrize("target", TARGETS)
def test_in_range_indices_negative_included_match_the_reference(target):
    ids = np.array([0, -1, 4, -5], np.int64)
    out = _compile(_gather_model(), target)(ids=ids)
    np.testing.assert_array_equal(out, TABLE[ids])
    out = _compile(_gather_model(offset=-2), target)(ids=ids + 2)
    np.testing.assert_array_equal(out, TABLE[ids])


@pytest.mark.parametrize("target", TARGETS)
def test_bert_tiny_token_id_past_the_vocabulary_raises(target):
    model = zoo.bert_tiny(seq=8)
    feeds = zoo.inputs_for(model)
    compiled = _compile(model, target)
    good = compiled(**feeds)
    for bad in (30522, 10**12, -10**6, 2**62):
        ids = feeds["input_ids"].copy()
        ids[0, 3] = bad
        with pytest.raises(InputError, match=rf"'embeddings.words': index {bad} .*size 30522"):
            compiled(**{**feeds, "input_ids": ids})
    np.testing.assert_array_equal(compiled(**feeds), good)   # the next good call answers


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_nd_on_the_host_raises_on_every_target(target):
    """Scatters run as host fallbacks through the references on llvm (and cuda): the same
    InputError as the numpy target, while an in-range negative index still wraps."""
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="put")], "scatter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
        [numpy_helper.from_array(np.ones((1, 2), np.float32), "u")])
    model = _compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                     target)
    x = np.zeros((4, 2), np.float32)
    np.testing.assert_array_equal(model(x=x, i=np.array([[-1]])), [[0, 0]] * 3 + [[1, 1]])
    with pytest.raises(InputError, match=r"ScatterND node 'put': index 4 .*size 4"):
        model(x=x, i=np.array([[4]]))


def _constant_index_model(k: int):
    """y = Gather(x, k, axis=1) with a constant 0-d k: x[:, k]."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "k"], ["y"], name="pick", axis=1)], "pick",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(k, np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k", [7, -9])
def test_constant_out_of_range_index(target, k):
    """Every target names the node, the index and the bound when the call runs (the numpy
    target failed with numpy's "nonzero on 0d arrays" on a 0-d index; llvm's kernel read
    x[:, k] past its buffer, x[1, 7] is past x's 10 floats, then clamped it silently)."""
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    with pytest.raises(InputError, match=rf"Gather node 'pick': index {k} .*size 5"):
        _compile(_constant_index_model(k), target)(x=x)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k", [0, 3, -1, -5])
def test_constant_in_range_index_matches_the_reference(target, k):
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    out = _compile(_constant_index_model(k), target)(x=x)
    np.testing.assert_array_equal(np.asarray(out), x[:, k])


@pytest.mark.parametrize("target", TARGETS[1:])
def test_a_loaded_artifact_names_the_node(target, tmp_path):
    """The check's site is the node's place in its segment: the artifact's graph names it."""
    path = tmp_path / "gather.dnnc"
    _compile(_gather_model(offset=3), target).save(path)
    loaded = dnnc.load(path)
    with pytest.raises(InputError, match=r"Gather node 'lookup': index 6 .*size 5"):
        loaded(ids=np.array([0, 1, 3, 1], np.int64))
        if target == "cuda":   # CuPy outputs: reported at the next synchronisation
            loaded.runtime.synchronize()
    out = loaded(ids=np.array([0, 1, 1, 0], np.int64))
    out = out.get() if hasattr(out, "get") else out   # (a CuPy array on cuda)
    np.testing.assert_array_equal(out, TABLE[[3, 4, 4, 3]])


@pytest.mark.parametrize("target", TARGETS)
def test_an_axis_of_one_row_is_checked_too(target):
    """(The clamp into an axis of size 1 folds to 0, which took the check with it.)"""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["out"], name="one", axis=0)], "one",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(TABLE[:1], "table")])
    model = _compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                     target)
    np.testing.assert_array_equal(model(ids=np.array([0, -1], np.int64)), TABLE[[0, 0]])
    with pytest.raises(InputError, match=r"Gather node 'one': index 1 .*size 1"):
        model(ids=np.array([0, 1], np.int64))


@pytest.mark.parametrize("target", TARGETS[1:])
def test_an_index_only_an_unread_part_of_a_fused_gather_reads_raises(target):
    """A kernel checks the indices of the elements it computes: fuse_ops never inlines a
    gather into a consumer that may skip part of it (Slice, ...), so every index is read."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["g"], name="lookup", axis=0),
             helper.make_node("Slice", ["g", "start", "end"], ["out"], name="cut")]
    inits = [numpy_helper.from_array(TABLE, "table"),
             numpy_helper.from_array(np.array([0], np.int64), "start"),
             numpy_helper.from_array(np.array([2], np.int64), "end")]
    graph = helper.make_graph(
        nodes, "cut", [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match=r"Gather node 'lookup': index 9 .*size 5"):
        _compile(model, target)(ids=np.array([0, 1, 2, 9], np.int64))


# -- every gather-like op on llvm: graph-input and computed indices, opt 0 and 3, 1 and 2 threads


def _op_model(op: str, computed: bool):
    """(model, feeds, bad position, axis size): `op` reading indices `ids` (a graph input), or
    max(ids, -10**7) computed inside the graph, from data `x`."""
    data, ids, attrs, size = {
        "Gather": ((6, 4), (3, 2), {"axis": 0}, 6),
        "GatherElements": ((4, 5), (4, 3), {"axis": 1}, 5),
        "GatherND": ((4, 5, 3), (2, 2), {}, 4),    # index pairs into x's first two axes
        "Wide": ((300, 64), (2048,), {"axis": 0}, 300),   # a parallel kernel's many rows
    }[op]
    rng = np.random.default_rng(len(op))
    x = rng.standard_normal(data).astype(np.float32)
    good = rng.integers(-size, size, ids).astype(np.int64)
    if op == "GatherND":
        good[:, 1] = rng.integers(-5, 5, ids[0])
    nodes, inits, source = [], [], "ids"
    if computed:   # (ids + 2 - 2 would simplify to ids)
        inits += [numpy_helper.from_array(np.array(-10**7, np.int64), "floor")]
        nodes += [helper.make_node("Max", ["ids", "floor"], ["kept"], name="kept")]
        source = "kept"
    name = "Gather" if op == "Wide" else op
    nodes.append(helper.make_node(name, ["x", source], ["y"], name="pick", **attrs))
    graph = helper.make_graph(
        nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, data),
                    helper.make_tensor_value_info("ids", TensorProto.INT64, ids)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    last = (-1, 0) if op == "GatherND" else (-1,) * len(ids)   # (GatherND: into axis 0)
    return model.SerializeToString(), {"x": x, "ids": good}, last, size


def _matrix() -> list[str]:
    """Every op, index source and opt level on llvm against the numpy target: the in-range
    result equal, each bad index (the last element: a worker thread's part) an InputError
    naming the node, the index and the bound, and the next good call equal again."""
    failures = []
    for op in ("Gather", "GatherElements", "GatherND", "Wide"):
        for computed in (False, True):
            model, feeds, last, size = _op_model(op, computed)
            want = dnnc.compile(model, target="numpy")(**feeds)
            for opt in (0, 3):
                case = f"{op} computed={computed} opt={opt}"
                compiled = dnnc.compile(model, target="llvm", opt_level=opt)
                for bad in (size, -size - 1, 2**62, -10**6):
                    ids = feeds["ids"].copy()
                    ids[last] = bad
                    try:
                        compiled(x=feeds["x"], ids=ids)
                        failures.append(f"{case} index {bad}: no error")
                    except InputError as exc:
                        name = "Gather" if op == "Wide" else op
                        if f"{name} node 'pick': index {bad} is out of range for an axis " \
                                f"of size {size}" not in str(exc):
                            failures.append(f"{case} index {bad}: {exc}")
                    got = compiled(**feeds)
                    if not np.array_equal(got, want):
                        failures.append(f"{case}: after index {bad}, a good call differs")
    return failures


def test_every_gather_on_llvm_threads_and_opt_levels():
    for threads in (1, 2):
        proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                              timeout=600, env=dict(os.environ, DNNC_NUM_THREADS=str(threads)))
        assert proc.returncode == 0, f"threads={threads}: rc {proc.returncode}\n" \
                                     f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert proc.stdout.strip() == "all match", proc.stdout


@pytest.mark.parametrize("target", TARGETS[1:])
def test_scatter_elements_on_the_host_raises(target):
    graph = helper.make_graph(
        [helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="put", axis=1)],
        "scatter", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                    helper.make_tensor_value_info("i", TensorProto.INT64, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.ones((2, 1), np.float32), "u")])
    model = _compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                     target)
    x = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(model(x=x, i=np.array([[-1], [0]])), [[0, 0, 1], [1, 0, 0]])
    with pytest.raises(InputError, match=r"ScatterElements node 'put': index -4 .*size 3"):
        model(x=x, i=np.array([[0], [-4]]))


if __name__ == "__main__":
    found = _matrix()
    print("\n".join(found) or "all match")
    sys.exit(1 if found else 0)


@GPU
def test_cupy_outputs_report_a_bad_index_at_a_later_call_or_synchronize():
    """A call that returns CuPy arrays never waits for its kernels: its out-of-range index is
    raised by a later call of the thread once the GPU is past it (before that call does
    anything), or at the latest by synchronize()."""
    model = dnnc.compile(_gather_model(), target="cuda", outputs="cupy")
    good = np.array([0, 1, 2, 3], np.int64)
    model(ids=np.array([0, 9, 1, 2], np.int64))
    with pytest.raises(InputError, match=r"Gather node 'lookup': index 9 .*size 5.*earlier "
                                         r"call"):
        model(ids=good)
        model.runtime.synchronize()
    np.testing.assert_array_equal(model(ids=good).get(), TABLE[good])
    model.runtime.synchronize()   # nothing left over
    model(ids=np.array([0, -7, 1, 2], np.int64))
    with pytest.raises(InputError, match=r"index -7 .*earlier call"):
        model.runtime.synchronize()
    np.testing.assert_array_equal(model(ids=good).get(), TABLE[good])
