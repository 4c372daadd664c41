"""The differential fuzzer: its generator, its minimiser, its crash capture, and a seeded batch
of 100 cases on the llvm target (CI's fuzzing run)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dnnc.testing import fuzz
from dnnc.testing.generate import generate
from dnnc.testing.minimize import minimize
from fuzz_checks import seeded_batch_finds_nothing

ROOT = Path(__file__).resolve().parents[2]

def _make_model(graph, **kwargs):
    """`helper.make_model` with the lowest IR version its opsets need, as the generator writes
    them: an older onnxruntime (1.30 reads IR <= 13) reads it too."""
    model = helper.make_model(graph, **kwargs)
    model.ir_version = helper.find_min_ir_version_for(model.opset_import)
    return model


CI_SEED = 10


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# --- generator --------------------------------------------------------------------------------

def test_generated_models_are_valid_and_reproduce_from_seed_and_index():
    for index in range(40):
        case = generate(3, index)
        onnx.checker.check_model(case.model, full_check=True)
        onnx.shape_inference.infer_shapes(case.model, strict_mode=True)
        again = generate(3, index)
        assert again.model.SerializeToString() == case.model.SerializeToString()
        first, second = case.draw_inputs(0), again.draw_inputs(0)
        for k in first:
            np.testing.assert_array_equal(first[k], second[k])   # NaN equals NaN here
        # the second run draws fresh data (and a new batch size when the batch is symbolic)
        other = case.draw_inputs(1)
        assert any(first[k].shape != other[k].shape or
                   not np.array_equal(first[k], other[k], equal_nan=first[k].dtype.kind == "f")
                   for k in first)
    assert generate(3, 0).model.SerializeToString() != generate(4, 0).model.SerializeToString()


def test_ci_batch_covers_the_op_families_symbolic_batch_and_parallel_sizes():
    cases = [generate(CI_SEED, i) for i in range(100)]
    ops = set().union(*(c.ops for c in cases))
    for op in ("Conv", "MatMul", "Gemm", "Add", "Div", "Mod", "Softmax", "LayerNormalization",
               "BatchNormalization", "MaxPool", "AveragePool", "Reshape", "Transpose",
               "Concat", "Split", "Slice", "Gather", "ReduceSum", "ReduceMean", "Pad",
               "Resize", "Cast", "Where", "Expand", "Erf"):
        assert op in ops, op
    assert sum(c.symbolic for c in cases) >= 20
    big = [c for c in cases if c.big]
    assert len(big) >= 3
    # the big cases cross the llvm target's parallel threshold (elements per stage)
    from dnnc.backends.llvm.schedules import MIN_PARALLEL_WORK

    def largest(case):
        return max(int(np.prod(a.shape)) for a in case.draw_inputs(0).values())
    assert all(largest(c) >= MIN_PARALLEL_WORK for c in big)
    int_inputs = [s for c in cases for s in c.inputs if s.dtype.kind == "i"]
    assert int_inputs


# --- comparison -------------------------------------------------------------------------------

def test_close_is_exact_for_integers_and_scaled_for_floats():
    a = np.arange(6, dtype=np.int64)
    assert fuzz.close(a, a.copy())[0]
    assert not fuzz.close(a + (a == 3), a)[0]
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert fuzz.close(x * np.float32(1 + 3e-5), x)[0]
    bad = x.copy()
    bad[17] += 0.01
    assert not fuzz.close(bad, x)[0]
    assert not fuzz.close(x[:999], x)[0]
    nan = np.array([np.nan, 1.0], np.float32)
    assert fuzz.close(nan, nan.copy())[0]
    assert not fuzz.close(np.array([0.0, 1.0], np.float32), nan)[0]
    # an infinity matches only itself, on either side (the relative tolerance of an infinite
    # want was infinite: FLT_MAX passed for inf)
    inf = np.array([np.inf, -np.inf, 1.0], np.float32)
    assert fuzz.close(inf, inf.copy())[0]
    for finite in (np.float32(3.4028235e38), np.float32(0.0), np.float32(np.nan)):
        other = inf.copy()
        other[0] = finite
        assert not fuzz.close(other, inf)[0] and not fuzz.close(inf, other)[0]
    assert not fuzz.close(-inf, inf)[0]


def _resize_model(scale: float):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 4])
    h_out, w_out = int(5 * scale), int(4 * scale)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, h_out, w_out])
    scales = helper.make_tensor("s", TensorProto.FLOAT, [4], [1, 1, scale, scale])
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear",
                            coordinate_transformation_mode="align_corners", name="r")
    return _make_model(helper.make_graph([node], "g", [x], [y], [scales]),
                             opset_imports=[helper.make_opsetid("", 18)])


def test_known_difference_matches_only_its_condition():
    known = fuzz.known_difference(_resize_model(0.75), "y")
    assert known is not None and known.name == "resize-align-corners-fractional"
    assert fuzz.known_difference(_resize_model(2.0), "y") is None


def test_known_difference_is_real_and_dnnc_follows_the_spec():
    ort = pytest.importorskip("onnxruntime")
    from onnx.reference import ReferenceEvaluator

    model = _resize_model(0.75)
    x = np.random.default_rng(1).standard_normal((1, 1, 5, 4)).astype(np.float32)
    spec = ReferenceEvaluator(model).run(None, {"x": x})[0]
    ours = fuzz.numpy_outputs(model.SerializeToString(), [{"x": x}])[0][0]
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert fuzz.close(ours, spec)[0]
    assert not fuzz.close(theirs, spec)[0]


# --- minimiser --------------------------------------------------------------------------------

def _feeds_an_output(case, op: str) -> bool:
    """Whether an `op` node of the case reaches a graph output (a generated graph keeps its
    last four leaves as outputs; an earlier leaf's nodes stay, dead)."""
    producer = {o: n for n in case.model.graph.node for o in n.output}
    stack, seen = [o.name for o in case.model.graph.output], set()
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.name in seen:
            continue
        if node.op_type == op:
            return True
        seen.add(node.name)
        stack.extend(node.input)
    return False


def test_minimizer_shrinks_a_planted_failure_to_the_guilty_node():
    case = next(c for c in (generate(5, i) for i in range(200))
                if _feeds_an_output(c, "Softmax") and len(c.model.graph.node) >= 6)
    runs = [case.draw_inputs(r) for r in range(2)]

    def fails(model, model_runs):   # the planted bug: any Softmax
        assert [set(r) for r in model_runs] == [{v.name for v in model.graph.input}] * 2
        return any(n.op_type == "Softmax" for n in model.graph.node)

    small = minimize(case.model, runs, fails)
    assert [n.op_type for n in small.model.graph.node] == ["Softmax"]
    onnx.checker.check_model(small.model, full_check=True)
    # the minimised model runs on the inputs saved with it
    outs = fuzz.numpy_outputs(small.model.SerializeToString(), small.runs)
    assert len(outs) == 2


def test_minimizer_keeps_the_model_when_no_edit_keeps_the_failure():
    case = generate(5, 1)
    runs = [case.draw_inputs(r) for r in range(2)]
    original = case.model.SerializeToString()
    small = minimize(case.model, runs, lambda m, r: m.SerializeToString() == original)
    assert small.model.SerializeToString() == original


# --- crashes and hangs ------------------------------------------------------------------------

FAKE_WORKER = """
import os, signal, sys, time
from dnnc.testing.worker import read_message, write_message, handle
channel = os.fdopen(os.dup(1), "wb")
while True:
    request = read_message(sys.stdin.buffer)
    if request is None:
        break
    if b"Softmax" in request["model"]:
        os.kill(os.getpid(), signal.SIGSEGV)
    if b"Tanh" in request["model"]:
        time.sleep(60)
    write_message(channel, handle(request))
"""


def _single_op_model(op: str):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    return _make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"], name="n")],
                                               "g", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 18)])


def test_a_worker_killed_by_a_signal_is_a_crash_and_a_hang_a_timeout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    worker = fuzz.Worker(1, timeout=20, argv=[sys.executable, "-c", FAKE_WORKER])
    checker = fuzz.Checker(worker, "llvm", 0, use_ort=False)
    runs = [{"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}]
    try:
        assert checker.check(_single_op_model("Relu"), runs).status == "pass"
        crash = checker.check(_single_op_model("Softmax"), runs)
        assert (crash.status, crash.cls) == ("crash", "SIGSEGV")
        assert crash.finding
        worker.timeout = 2
        hang = checker.check(_single_op_model("Tanh"), runs)
        assert hang.status == "timeout"
        worker.timeout = 20
        assert checker.check(_single_op_model("Sigmoid"), runs).status == "pass"  # restarted
        assert worker.restarts == 2
    finally:
        worker.stop()


BIG_OUTPUT_WORKER = """
import os, sys, numpy as np
from dnnc.testing.worker import read_message, write_message
channel = os.fdopen(os.dup(1), "wb")
while (request := read_message(sys.stdin.buffer)) is not None:
    write_message(channel, {"outputs": [[np.full(request["size"], 7, np.uint8)]]})
"""


def test_a_big_output_comes_back_well_within_the_timeout(monkeypatch):
    # issue 30: replies were read by appending 64 KiB chunks, so a 150 MB output took 121 s
    # and was reported as a timeout; read into a buffer of the header's size it takes ~0.3 s
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    worker = fuzz.Worker(1, timeout=30, argv=[sys.executable, "-c", BIG_OUTPUT_WORKER])
    size = 150 * 2**20
    try:
        start = time.monotonic()
        worker.submit({"size": size})
        reply = worker.result()
        elapsed = time.monotonic() - start
    finally:
        worker.stop()
    assert "timeout" not in reply and "crash" not in reply, reply
    out = reply["outputs"][0][0]
    assert out.shape == (size,) and out[0] == 7 and out[-1] == 7
    assert elapsed < 15, f"{elapsed:.1f} s for a 150 MB reply"


def test_fuzz_saves_and_minimises_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    index = next(i for i in range(200) if _feeds_an_output(generate(5, i), "Softmax"))
    args = fuzz.parse_args(["--seed", "5", "--case", str(index), "--out", str(tmp_path),
                            "--threads", "1", "--quiet", "--no-onnxruntime"])
    summary = fuzz.fuzz(args, worker_argv=[sys.executable, "-c", FAKE_WORKER])
    assert summary["crashes"] == {"SIGSEGV": 1} and fuzz.has_finding(summary)
    folder = tmp_path / f"seed5_case{index}"
    info = json.loads((folder / "finding.json").read_text())
    assert info["status"] == "crash" and "--case" in info["reproduce"]
    small = onnx.load(folder / "minimized.onnx")
    assert [n.op_type for n in small.graph.node] == ["Softmax"]
    runs = fuzz.load_inputs(folder / "minimized_inputs.npz")
    assert set(runs[0]) == {v.name for v in small.graph.input}


# --- the command ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["--cases", "0"], ["--opt-level", "7"], ["--threads", "0"],
                                  ["--target", "nope"], ["--timeout", "-1"],
                                  ["--minimize-seconds", "0"]])
def test_bad_usage_exits_2(argv):
    with pytest.raises(SystemExit) as exc:
        fuzz.parse_args(argv)
    assert exc.value.code == 2


def test_ci_batch_of_100_cases_finds_nothing(tmp_path):
    """CI's fuzzing run: 100 seeded cases on the llvm target, 2 threads, opt level 3."""
    proc = subprocess.run(
        [sys.executable, "-m", "dnnc.testing.fuzz", "--cases", "100", "--seed", str(CI_SEED),
         "--threads", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "cases 100, passed" in proc.stdout


def test_nan_known_differences_apply_only_to_nan_mismatches():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], name="p")
    model = _make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 18)])
    assert fuzz.known_difference(model, "y", nan=True).name == "nan-in-max"
    assert fuzz.known_difference(model, "y", nan=False) is None


def test_resize_nearest_downscale_difference_matches_only_fractional_inverses():
    def model(scale):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])
        n = int(6 * scale)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, n, n])
        scales = helper.make_tensor("s", TensorProto.FLOAT, [4], [1, 1, scale, scale])
        node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest",
                                nearest_mode="floor", name="r")
        return _make_model(helper.make_graph([node], "g", [x], [y], [scales]),
                                 opset_imports=[helper.make_opsetid("", 18)])
    assert fuzz.known_difference(model(0.6), "y").name == "resize-nearest-fractional-downscale"
    assert fuzz.known_difference(model(0.5), "y") is None
    assert fuzz.known_difference(model(2.0), "y") is None


def test_generator_rejects_windows_onnx_inference_gets_wrong():
    """ONNX's shape inference keeps a ceil_mode window that starts in the end padding; every
    runtime drops it (seed 77 case 104), so the generator must not build such a pool."""
    from dnnc.testing.graph_builder import Rejected
    from dnnc.testing.op_generators.layers import check_windows

    ceil = {"kernel_shape": [1], "strides": [3], "ceil_mode": 1}
    with pytest.raises(Rejected):
        check_windows([3], ceil)                   # windows at 0 and 3: 3 is past the input
    check_windows([4], ceil)                       # windows at 0 and 3: both inside
    check_windows([3], {**ceil, "ceil_mode": 0})


# --- special values (--special) -----------------------------------------------------------------

CI_SPECIAL_SEED = 42


def test_special_mode_draws_special_values_casts_and_softmax_rows():
    """Special cases put +-inf, NaN, huge values, +-0 and subnormals in their inputs, cast them
    to every integer type and run softmax (the op and the exported chain) over them; the
    plain cases stay as they were (special mode draws nothing in them)."""
    cases = [generate(CI_SPECIAL_SEED, i, special=True) for i in range(60)]
    seen = set()
    casts = set()
    for c in cases:
        assert c.special
        data = c.draw_inputs(0)
        for spec in c.inputs:
            x = data[spec.name]
            if spec.kind.startswith("special"):
                finite = x[np.isfinite(x)]
                assert finite.size < x.size or (finite == 0).any() or \
                    (np.abs(finite) < 1e-37).any() or (np.abs(finite) >= 1e30).any()
                seen |= {"inf" for v in x.ravel() if np.isinf(v)}
                seen |= {"nan" for v in x.ravel() if np.isnan(v)}
                seen |= {"huge" for v in x.ravel() if np.isfinite(v) and abs(v) >= 1e30}
                seen |= {"subnormal" for v in x.ravel() if 0 < abs(v) < 1e-37}
        casts |= {onnx.helper.get_attribute_value(a) for n in c.model.graph.node
                  if n.op_type == "Cast" for a in n.attribute}
    assert seen == {"inf", "nan", "huge", "subnormal"}
    assert {TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT32, TensorProto.UINT64,
            TensorProto.BOOL} & casts
    ops = set().union(*(c.ops for c in cases))
    assert {"Softmax", "ReduceMax", "Sub", "Exp", "ReduceSum", "Div", "Cast"} <= ops
    plain = generate(CI_SEED, 3)
    assert not plain.special and all(not s.kind.startswith("special") for s in plain.inputs)
    assert plain.model.SerializeToString() == \
        generate(CI_SEED, 3, special=False).model.SerializeToString()


def test_huge_values_stay_out_of_sums():
    """A sum whose terms may be near FLT_MAX overflows or not by their order (FLT_MAX +
    FLT_MAX - FLT_MAX): no conv, matmul, gemm, sum reduction, average pool or interpolating
    resize reads a value that may hold one."""
    sums = {"Conv", "MatMul", "Gemm", "ReduceSum", "ReduceMean", "ReduceL2", "AveragePool",
            "GlobalAveragePool", "LayerNormalization"}
    from dnnc.testing.graph_builder import Builder, Rejected
    from dnnc.testing.op_generators import SPECIAL_OPS

    for index in range(40):
        g = Builder(np.random.default_rng([7, index]), 18, False, 2, special=True)
        x = g.add_input((2, 3, 5, 5), kind="special_huge")
        for _, fn in SPECIAL_OPS:
            try:
                fn(g)
            except Rejected:
                pass
        huge = {v.name for v in g.values if v.huge} | {x.name}
        for n in g.nodes:
            if n.op_type in sums or n.op_type == "Resize" and any(
                    a.name == "mode" and a.s != b"nearest" for a in n.attribute):
                assert n.input[0] not in huge, (index, n.op_type)


def test_known_differences_of_special_values_apply_only_to_inf_mismatches():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    lo = helper.make_tensor("lo", TensorProto.FLOAT, [], [-1.0])
    node = helper.make_node("Clip", ["x", "lo"], ["y"], name="c")
    model = _make_model(helper.make_graph([node], "g", [x], [y], [lo]),
                              opset_imports=[helper.make_opsetid("", 18)])
    assert fuzz.known_difference(model, "y", inf=True).name == "inf-in-clip-without-a-bound"
    assert fuzz.known_difference(model, "y", inf=False) is None
    both = helper.make_node("Clip", ["x", "lo", "lo"], ["y"], name="c")
    model = _make_model(helper.make_graph([both], "g", [x], [y], [lo]),
                              opset_imports=[helper.make_opsetid("", 18)])
    assert fuzz.known_difference(model, "y", inf=True) is None


def _doc_batchnorm(x):
    """The operator doc's order, in float32: (x - mean) / sqrt(var + epsilon) * scale + B."""
    root = np.sqrt(np.float32(0.753) + np.float32(1e-5))
    with np.errstate(over="ignore"):
        return (x - np.float32(0.0)) / root * np.float32(0.46) + np.float32(0.0)


@pytest.mark.parametrize("name,x,make,spec", [
    ("inf-in-clip-without-a-bound", np.array([np.inf, -np.inf, 2.0], np.float32),
     lambda: helper.make_node("Clip", ["x", "lo"], ["y"]), None),
    ("huge-in-batchnorm", np.full((1, 1, 1, 2), 3.4e38, np.float32),
     lambda: helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"]),
     _doc_batchnorm),
    ("neg-inf-in-padded-maxpool", np.full((1, 1, 1, 2), -np.inf, np.float32),
     lambda: helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 2], pads=[0, 1, 0, 0]),
     lambda x: np.full(x.shape, -np.inf, np.float32)),   # (onnx.reference fails on this x)
])
def test_special_value_known_differences_are_real(name, x, make, spec):
    """Each measured: onnxruntime differs; dnnc (numpy and llvm) gives the spec's reading
    (onnx.reference's, or the operator doc's formula where onnx.reference orders it
    otherwise too)."""
    pytest.importorskip("onnxruntime")
    from onnx.reference import ReferenceEvaluator
    import dnnc

    init = [helper.make_tensor("lo", TensorProto.FLOAT, [], [-1.0]),
            helper.make_tensor("s", TensorProto.FLOAT, [1], [0.46]),
            helper.make_tensor("b", TensorProto.FLOAT, [1], [0.0]),
            helper.make_tensor("m", TensorProto.FLOAT, [1], [0.0]),
            helper.make_tensor("v", TensorProto.FLOAT, [1], [0.753])]
    graph = helper.make_graph([make()], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                              init)
    model = _make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    data = model.SerializeToString()
    want = spec(x) if spec else ReferenceEvaluator(model).run(None, {"x": x})[0]
    with np.errstate(all="ignore"):
        got = fuzz.ort_outputs(data, [{"x": x}])[0][0]
    assert not fuzz.close(got, want)[0]
    for target in ("numpy", "llvm"):
        ours = dnnc.compile(data, target=target).run(x=x)[0]
        np.testing.assert_array_equal(ours, want)
    assert fuzz.known_difference(model, "y", inf=True).name == name


def test_subnormal_in_tanh_difference_is_real():
    """onnxruntime's Tanh flushes the smallest subnormals to 0; multiplied by inf that is NaN
    where the spec's tanh(x) ~ x gives inf (numpy and llvm do)."""
    pytest.importorskip("onnxruntime")
    import dnnc

    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["t", "big"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor("big", TensorProto.FLOAT, [], [-np.inf])])
    model = _make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.array([1.4e-45, 0.5], np.float32)
    got = fuzz.ort_outputs(model.SerializeToString(), [{"x": x}])[0][0]
    assert np.isnan(got[0]) and got[1] == -np.inf
    for target in ("numpy", "llvm"):
        np.testing.assert_array_equal(dnnc.compile(model, target=target).run(x=x)[0],
                                      [-np.inf, -np.inf])
    assert fuzz.known_difference(model, "y", nan=True).name == "subnormal-in-tanh"
    assert fuzz.known_difference(model, "y", nan=False) is None


def test_a_nan_difference_laundered_by_a_comparison_is_still_the_known_one():
    """ReduceMax of a row holding NaN differs from onnxruntime's by NaN only, but a comparison
    with it (GreaterOrEqual, then Where) turns that into an ordinary difference: still
    nan-in-max (found on cuda and llvm alike, seed 4040 special cases 241 and 248). Without an
    op that can turn NaN into a number in between, the entry stays NaN-only."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])

    def model(tail):
        nodes = [helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=1)] + tail
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
        return _make_model(helper.make_graph(nodes, "g", [x], [y], [axes]),
                           opset_imports=[helper.make_opsetid("", 18)])

    laundered = model([helper.make_node("GreaterOrEqual", ["x", "m"], ["c"]),
                       helper.make_node("Where", ["c", "x", "m"], ["y"])])
    assert fuzz.known_difference(laundered, "y", nan=False).name == "nan-in-max"
    direct = model([helper.make_node("Add", ["x", "m"], ["y"])])
    assert fuzz.known_difference(direct, "y", nan=False) is None
    assert fuzz.known_difference(direct, "y", nan=True).name == "nan-in-max"


def test_uint32_cast_difference_is_real_and_only_for_uint32():
    """onnxruntime's float -> uint32 depends on the element's index (its vector loop and its
    scalar tail disagree); dnnc gives the table at every index."""
    pytest.importorskip("onnxruntime")
    import dnnc

    def model(to):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])
        y = helper.make_tensor_value_info("y", to, [5])
        return _make_model(helper.make_graph(
            [helper.make_node("Cast", ["x"], ["y"], to=to)], "g", [x], [y]),
            opset_imports=[helper.make_opsetid("", 18)])
    x = np.full(5, -3.4028235e38, np.float32)
    data = model(TensorProto.UINT32).SerializeToString()
    ort = fuzz.ort_outputs(data, [{"x": x}])[0][0]
    assert len(set(ort.tolist())) == 2   # one value, two results
    for target in ("numpy", "llvm"):
        assert dnnc.compile(data, target=target).run(x=x)[0].tolist() == [2 ** 31] * 5
    assert fuzz.known_difference(model(TensorProto.UINT32), "y").name == \
        "uint32-cast-out-of-range"
    assert fuzz.known_difference(model(TensorProto.UINT64), "y") is None


def test_ci_special_values_batch_finds_nothing(tmp_path):
    """CI's special-values run: 40 seeded --special cases on the llvm target, opt level 3."""
    proc = subprocess.run(
        [sys.executable, "-m", "dnnc.testing.fuzz", "--special", "--cases", "40", "--seed",
         str(CI_SPECIAL_SEED), "--threads", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "cases 40, passed" in proc.stdout


# --- QDQ chains (issue 30, item 5) ------------------------------------------------------------

QDQ_SEED = 3


def _qdq_cases(n=60):
    return [c for c in (generate(QDQ_SEED, i, ("qdq",)) for i in range(n))
            if "QuantizeLinear" in c.ops]


def _inits(model):
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def test_qdq_chains_are_written_as_quantize_static_writes_them():
    cases = _qdq_cases()
    assert len(cases) >= 40
    seen = set()
    for case in cases:
        model, inits = case.model, _inits(case.model)
        readers = {}
        for n in model.graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        producer = {o: n for n in model.graph.node for o in n.output}
        for n in model.graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if n.op_type == "QuantizeLinear":
                # activations: per-tensor parameters, read back by a DQ with the same ones
                assert inits[n.input[1]].ndim == 0 and inits[n.input[1]] > 0
                dtype = inits[n.input[2]].dtype if len(n.input) > 2 else np.dtype(np.uint8)
                seen.add(("activation", dtype.name))
                for r in readers[n.output[0]]:
                    assert r.op_type == "DequantizeLinear" and list(r.input[1:]) == \
                        list(n.input[1:])
            elif n.op_type == "DequantizeLinear" and n.input[0] in inits:
                q, scale = inits[n.input[0]], inits[n.input[1]]
                user = readers[n.output[0]][0]
                if q.dtype == np.int8:   # a weight: symmetric, per channel along its axis
                    assert np.all(np.abs(q) <= 127)
                    axis = attrs.get("axis", 1)
                    if scale.ndim:
                        want = 0 if user.op_type == "Conv" else \
                            (0 if user.op_type == "Gemm" and user.attribute and
                             helper.get_attribute_value(user.attribute[0]) == 1 else 1)
                        assert axis == want and scale.shape == (q.shape[axis],)
                    seen.add(("weight", user.op_type, scale.ndim))
                elif q.dtype == np.int32:   # a bias at x_scale * w_scale
                    x_scale = inits[producer[user.input[0]].input[1]]
                    w_scale = inits[producer[user.input[1]].input[1]]
                    np.testing.assert_array_equal(scale, x_scale * w_scale)
                    seen.add(("bias", user.op_type))
            elif n.op_type == "Conv" and n.input[0] in producer and \
                    producer[n.input[0]].op_type == "DequantizeLinear":
                w = inits[producer[n.input[1]].input[0]]
                if attrs.get("group", 1) > 1:
                    seen.add("depthwise")
                if w.shape[2:] == (1, 1):
                    seen.add("pointwise")
            elif n.op_type in ("Sigmoid", "HardSwish", "GlobalAveragePool", "Mul", "Add",
                               "AveragePool", "Concat", "Flatten", "Reshape", "MaxPool"):
                if n.input[0] in producer and \
                        producer[n.input[0]].op_type == "DequantizeLinear":
                    seen.add(n.op_type)
    for want in [("activation", "int8"), ("activation", "uint8"), ("weight", "Conv", 1),
                 ("weight", "Conv", 0), ("weight", "MatMul", 1), ("bias", "Conv"),
                 ("bias", "Gemm"), "depthwise", "pointwise", "Sigmoid", "Mul", "Add",
                 "GlobalAveragePool", "AveragePool", "Concat", "MaxPool"]:
        assert want in seen, want
    assert any(s.kind == "grid" for c in cases for s in c.inputs)   # exact ties


def _qdq_model(body, x_shape, scale, zero=0):
    """x -> body -> QuantizeLinear(scale, zero: int8) -> DequantizeLinear -> y."""
    nodes, inits = body
    nodes = nodes + [helper.make_node("QuantizeLinear", ["t", "s", "z"], ["q"], name="q"),
                     helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
    inits = inits + [onnx.numpy_helper.from_array(np.array(scale, np.float32), "s"),
                     onnx.numpy_helper.from_array(np.array(zero, np.int8), "z")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)], inits)
    return _make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_rounding_bounds_allow_a_flip_at_a_near_tie_only():
    from dnnc.testing import rounding

    # an exact input at exact ties: no bound, the rounding mode must be half to even
    exact = _qdq_model(([helper.make_node("Identity", ["x"], ["t"])], []), [8], 0.25)
    x = np.array([0.125, 0.375, -0.125, -0.375, 0.625, 1.0, -2.0, 0.3], np.float32)
    want = fuzz.numpy_outputs(exact.SerializeToString(), [{"x": x}])[0][0]
    bound = rounding.bounds(exact, [{"x": x}])[0]["y"]
    assert not bound.any()
    half_away = np.sign(x) * np.floor(np.abs(x) / 0.25 + 0.5) * 0.25
    assert fuzz.close(want, want, bound)[0]
    assert not fuzz.close(half_away.astype(np.float32), want, bound)[0]
    # a computed input: one quantum of slack where x * c / s is within float noise of a tie
    c = np.float32(1.1)
    scaled = _qdq_model(([helper.make_node("Mul", ["x", "c"], ["t"])],
                         [onnx.numpy_helper.from_array(c, "c")]), [5], 0.1)
    x = (np.array([0.5, 1.5, 2.0, -0.5, 3.0]) * 0.1 / 1.1).astype(np.float32)
    x[2] = 0.123
    [[want]] = fuzz.numpy_outputs(scaled.SerializeToString(), [{"x": x}])
    bound = rounding.bounds(scaled, [{"x": x}])[0]["y"]
    near = np.abs((x * c / np.float32(0.1)) % 1 - 0.5) < 1e-3
    np.testing.assert_allclose(bound, np.where(near, 0.1, 0.0), rtol=1e-6)
    flip = want.copy()
    flip[0] += np.float32(0.1)
    assert fuzz.close(flip, want, bound)[0]         # a near-tie: either neighbour is right
    flip[0] += np.float32(0.1)
    assert not fuzz.close(flip, want, bound)[0]     # two quanta: not a rounding's
    off = want.copy()
    off[2] += np.float32(0.1)
    assert not fuzz.close(off, want, bound)[0]      # not a near-tie: wrong


def _buggy_quantize(kind):
    from dnnc.ir.ops.quant import expand_param, quantize_linear

    def evaluate(x, y_scale, y_zero_point=None, **attrs):
        if kind == "half_away":
            q = x.astype(np.float32) / expand_param(y_scale, x.shape, 0, 0)
            q = np.sign(q) * np.floor(np.abs(q) + np.float32(0.5))
            if y_zero_point is not None:
                q = q + y_zero_point.astype(np.float32)
            info = np.iinfo(y_zero_point.dtype if y_zero_point is not None else np.uint8)
            return np.clip(q, info.min, info.max).astype(info.dtype)
        if kind == "zero_point_ignored":
            return quantize_linear(x, y_scale, None if y_zero_point is None else
                                   np.zeros_like(y_zero_point), **attrs)
        # no saturation: the integers wrap
        out = y_zero_point.dtype if y_zero_point is not None else np.dtype(np.uint8)
        q = np.rint(x.astype(np.float32) / y_scale.astype(np.float32))
        if y_zero_point is not None:
            q = q + y_zero_point.astype(np.float32)
        return q.astype(np.int64).astype(out)
    return evaluate


@pytest.mark.parametrize("kind", ["half_away", "zero_point_ignored", "no_saturation"])
def test_seeded_qdq_cases_find_an_injected_quantization_bug(kind, monkeypatch):
    """A QuantizeLinear that rounds half away from zero, ignores its zero point or wraps
    instead of saturating, run as the target under test (the numpy target with the bug
    planted in its reference), against the true reference: the comparison, rounding bounds
    and all, reports it in some of the seeded QDQ cases and passes every case without it."""
    import dataclasses

    from dnnc.ir.ops import registry
    from dnnc.testing import rounding

    cases = _qdq_cases(40)
    truth = []
    for case in cases:
        runs = [case.draw_inputs(r) for r in range(2)]
        data = case.model.SerializeToString()
        truth.append((runs, fuzz.numpy_outputs(data, runs), rounding.bounds(case.model, runs)))
    op = registry.get_op("QuantizeLinear")
    monkeypatch.setitem(registry._REGISTRY, "QuantizeLinear",
                        dataclasses.replace(op, evaluate=_buggy_quantize(kind)))
    found = 0
    for case, (runs, want, bounds) in zip(cases, truth):
        names = [o.name for o in case.model.graph.output]
        assert not fuzz.differences(want, want, names, bounds)
        got = fuzz.numpy_outputs(case.model.SerializeToString(), runs)
        found += bool(fuzz.differences(got, want, names, bounds))
    assert found >= 3, found


def test_a_seeded_qdq_batch_finds_nothing(tmp_path):
    """30 cases where QDQ chains are frequent, on the llvm target against numpy and
    onnxruntime, within the rounding bounds. Cases 14 and 25 hold efficientnet's block with
    a 3x3 expansion whose conv kernel ends in a QuantizeLinear: before the conv2d template
    staged int8 in its own type (issue 30), both were mismatches."""
    seeded_batch_finds_nothing(tmp_path, QDQ_SEED, 30, "qdq")


def test_reduced_precision_tolerance_catches_wrong_code_not_rounding():
    """--precision: an fp16 rounding of every element passes; an element off by its own size
    (a misread buffer) does not; fp32's tolerance is unchanged."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    rounded = x.astype(np.float16).astype(np.float32)
    assert fuzz.tolerance("fp32") == (fuzz.FLOAT_RTOL, fuzz.FLOAT_ATOL)
    assert not fuzz.close(rounded, x)[0]
    assert fuzz.close(rounded, x, tol=fuzz.tolerance("fp16"))[0]
    bad = rounded.copy()
    bad[7] = -bad[7] + 1.0
    assert not fuzz.close(bad, x, tol=fuzz.tolerance("fp16"))[0]
    assert fuzz.close(x.astype(ml_dtypes.bfloat16).astype(np.float32), x,
                      tol=fuzz.tolerance("bf16"))[0]


def test_precision_reaches_the_worker_and_is_checked(tmp_path):
    """The compile request carries the precision; a target that refuses it is an error
    finding, not a crash of the fuzzer."""
    args = fuzz.parse_args(["--cases", "1", "--precision", "fp16", "--no-minimize",
                            "--quiet", "--out", str(tmp_path)])
    summary = fuzz.fuzz(args)
    assert summary["cases"] == 1 and sum(summary["errors"].values()) == 1
    assert list(summary["errors"]) == ["llvm:ArgumentError"]   # (dnnc.errors:
    # "precision='fp16' is not one the llvm target computes in")


def test_llvm_at_bf16_passes_a_run_of_dense_cases(tmp_path):
    """--target llvm --precision bf16: MatMul and Gemm cases with constant weights (packed in
    bf16 pairs, multiplied by vdpbf16ps where the CPU has it) agree with the fp32 reference
    within bf16's tolerance."""
    args = fuzz.parse_args(["--cases", "12", "--seed", "32", "--precision", "bf16",
                            "--boost", "matmul", "--boost", "gemm", "--no-onnxruntime",
                            "--no-minimize", "--quiet", "--out", str(tmp_path)])
    summary = fuzz.fuzz(args)
    assert summary["passed"] == 12, summary


@pytest.mark.parametrize("index", [29, 60, 171, 251])
def test_fp16_findings_of_the_h200_sweep_are_rounding(index):
    """Cases of the H200's fp16 sweep (seed 3132) that were mismatches: half storage's own
    numerics (the optimised graph at fp16 run by the NumPy interpreter, as the GPU computed
    them) now pass the reduced-precision check: the QDQ chains within bounds that count
    fp16 noise at every QuantizeLinear (`rounding.bounds(noise=...)`), the integer and
    boolean outputs exact since store_half reads discontinuous ops' inputs in float32."""
    from dataclasses import replace

    from dnnc.backends.registry import REGISTRY
    from dnnc.frontend.onnx import import_onnx
    from dnnc.ir.interpreter import run_graph
    from dnnc.passes.manager import optimize
    from dnnc.testing import rounding
    from dnnc.testing.generate import generate

    target = replace(REGISTRY["cuda"].target(None, None), precision="fp16", arch="sm_90")
    case = generate(3132, index, ())
    runs = [case.draw_inputs(r) for r in range(2)]
    want = fuzz.numpy_outputs(case.model.SerializeToString(), runs)
    g = optimize(import_onnx(case.model), target, 3)
    got = []
    for run in runs:
        with np.errstate(all="ignore"):
            got.append([np.asarray(o) for o in run_graph(g, [run[v.name] for v in g.inputs])])
    names = [o.name for o in case.model.graph.output]
    tol = fuzz.tolerance("fp16")
    assert fuzz.differences(got, want, names, rounding.bounds(case.model, runs, tol[0]),
                            tol) == []
