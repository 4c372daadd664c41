"""New batch sizes without a compile (`batch_split.BatchSplit`): a batch-separable segment runs a
size it has no code for on another size's code, in slices along axis 0 (the last padded),
and a size that recurs gets code of its own, compiled in the background. Every case of
tests/ir/test_batching.py runs here against onnxruntime: a separable graph must give the
reference's results at sizes it was never compiled for, a graph that is not must compile."""

import importlib.util
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import dnnc
import dnnc.zoo as zoo


def _cases() -> dict:
    path = Path(__file__).parents[1] / "ir" / "test_batching.py"
    spec = importlib.util.spec_from_file_location("batching_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


CASES = _cases()


def feeds_for(proto, n, rng):
    """Random inputs at batch size n (other symbols 1); integer inputs are indices below
    min(n, 5): into the items (n) or into tables of 5 rows."""
    feeds = zoo.inputs_for(proto, rng, {"N": n})
    for name, a in feeds.items():
        if a.dtype.kind in "iu" and not proto.metadata_props:
            feeds[name] = rng.integers(0, min(n, 5), a.shape).astype(a.dtype)
    return feeds


def reference(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def outputs(cm, feeds):
    out = cm(**feeds)
    return list(out) if isinstance(out, tuple) else [out]


def check(proto, cm, n, rng, rtol=1e-5, atol=1e-5):
    feeds = feeds_for(proto, n, rng)
    got = outputs(cm, feeds)
    for g, want in zip(got, reference(proto, feeds)):
        assert g.shape == want.shape
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_new_sizes_run_on_other_sizes_code(name, rng):
    proto, separable = CASES[name]
    cm = dnnc.compile(proto, cache=False)
    cm.runtime.specialize_after = None   # no background compile: every call below splits
    check(proto, cm, 2, rng)
    compiled = len(cm.runtime.compiled_segments())
    for n in (3, 5, 1):   # padded (3, 5) and narrower (1) than the code's 2 items
        check(proto, cm, n, rng)
    if separable:
        assert cm.runtime.split_calls == 3
        assert len(cm.runtime.compiled_segments()) == compiled
    else:
        assert cm.runtime.split_calls == 0


@pytest.mark.parametrize("name, config, rtol", [
    ("cnn", {}, 1e-4),
    ("bert_tiny", {"seq": 16, "layers": 1}, 1e-4),
])
def test_zoo_models_take_any_batch_without_compiling(name, config, rtol, rng):
    proto = zoo.build(name, batch="N", **config)
    cm = dnnc.compile(proto, cache=False)
    cm.runtime.specialize_after = None
    check(proto, cm, 4, rng, rtol=rtol, atol=rtol)
    seconds = cm.runtime.compile_seconds
    for n in (1, 3, 9):
        check(proto, cm, n, rng, rtol=rtol, atol=rtol)
    assert cm.runtime.split_calls == 3
    assert cm.runtime.compile_seconds == seconds   # nothing compiled for 1, 3 or 9
    assert cm.stats["batch_split_calls"] == 3


def test_a_recurring_size_gets_code_of_its_own(rng):
    proto = CASES["conv_pool"][0]
    cm = dnnc.compile(proto, cache=False)
    rt = cm.runtime
    rt.specialize_after = 2
    check(proto, cm, 4, rng)
    check(proto, cm, 3, rng)
    assert rt.split_calls == 1 and len(rt.compiled_segments()) == 1
    check(proto, cm, 3, rng)   # the second use starts its compile in the background
    assert rt.wait_for_specialisation(timeout=120)
    shapes = sorted(s.shapes[0][0] for s in rt.compiled_segments())
    assert shapes == [3, 4]
    calls = rt.split_calls
    check(proto, cm, 3, rng)
    assert rt.split_calls == calls   # its own code now


def test_a_failed_background_compile_leaves_the_split_working(rng, monkeypatch):
    proto = CASES["softmax_axis_1"][0]
    cm = dnnc.compile(proto, cache=False)
    rt = cm.runtime
    rt.specialize_after = 1
    check(proto, cm, 2, rng)

    def refuse(program):
        raise dnnc.errors.CompileError("refused for the test")

    monkeypatch.setattr(rt, "compile_segment", refuse)
    check(proto, cm, 3, rng)
    assert rt.wait_for_specialisation(timeout=60)
    check(proto, cm, 3, rng)   # split again, and no second attempt
    assert rt.split_calls == 2 and len(rt.splits.unspecialisable) == 1
