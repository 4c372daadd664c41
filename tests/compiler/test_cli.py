"""The `dnnc` command: `zoo` writes models, `inspect` summarises them (exact counts and FLOPs
for an MLP), `--ir` prints the graph, and user mistakes end in one line and exit status 2."""

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc import zoo
from dnnc.compiler.cli import main
from dnnc.compiler.inspect import summarize
from dnnc.ir.flops import Count, node_flops
from dnnc.frontend.onnx import import_onnx

REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def mlp_file(tmp_path, capsys, batch="2", hidden="(64, 32)", in_features=20, classes=5):
    path = tmp_path / "mlp.onnx"
    code, out, err = run_cli(capsys, "zoo", "mlp", "-o", path, "--batch", batch,
                             "--set", f"hidden={hidden}", "--set", f"in_features={in_features}",
                             "--set", f"classes={classes}")
    assert code == 0 and not err and "wrote" in out
    return path


def test_zoo_writes_the_model(tmp_path, capsys):
    model = onnx.load(mlp_file(tmp_path, capsys))
    onnx.checker.check_model(model)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [2, 20]
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    expected = zoo.build("mlp", batch=2, hidden=(64, 32), in_features=20, classes=5)
    assert model.graph.initializer[0].raw_data == expected.graph.initializer[0].raw_data


def test_zoo_symbolic_batch_and_bool_setting(tmp_path, capsys):
    path = tmp_path / "bert.onnx"
    code, _, _ = run_cli(capsys, "zoo", "bert", "-o", path, "--batch", "N", "--set", "layers=1",
                         "--set", "embeddings=false", "--set", "seq=8")
    assert code == 0
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["hidden_states"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def test_zoo_list(capsys):
    code, out, _ = run_cli(capsys, "zoo", "--list")
    assert code == 0
    assert {line.split()[0] for line in out.splitlines()} == set(zoo.MODELS)
    # each option with its default (issue 30), a preset's own defaults included
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "in_features=784, hidden=(256, 128), classes=10, seed=0" in lines["mlp"]
    assert "layers=12, hidden=768, heads=12" in lines["bert_base"]
    assert "layers=2, hidden=128" in lines["bert_tiny"]


def mlp_flops(batch, sizes):
    """Gemm: 2*M*K*N multiply-adds plus M*N bias adds; Relu: one per element."""
    gemms = sum(2 * batch * k * n + batch * n for k, n in zip(sizes, sizes[1:]))
    relus = sum(batch * n for n in sizes[1:-1])
    return gemms, relus


def test_inspect_mlp_counts_and_flops(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys)
    code, out, err = run_cli(capsys, "inspect", path, "--json")
    assert code == 0 and not err
    summary = json.loads(out)
    sizes = [20, 64, 32, 5]
    gemms, relus = mlp_flops(2, sizes)
    assert summary["op_counts"] == {"Gemm": 3, "Relu": 2}
    assert summary["inputs"] == {"input": "float32[2,20]"}
    assert summary["outputs"] == {"logits": "float32[2,5]"}
    assert summary["parameters"] == sum(k * n + n for k, n in zip(sizes, sizes[1:]))
    assert summary["parameter_bytes"] == 4 * summary["parameters"]
    assert summary["flops_by_op"] == {"Gemm": gemms, "Relu": relus}
    assert summary["flops"] == gemms + relus

    code, text, _ = run_cli(capsys, "inspect", path)
    assert code == 0
    assert "float32[2,20]" in text and "float32[2,5]" in text
    assert f"FLOPs: {gemms + relus:,}" in text
    assert f"parameters: {summary['parameters']:,}" in text


def test_inspect_symbolic_batch_and_input_shape(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys, batch="B")
    gemms, relus = mlp_flops(1, [20, 64, 32, 5])
    code, out, _ = run_cli(capsys, "inspect", path, "--json")
    assert code == 0 and json.loads(out)["flops"] == f"{gemms + relus}*B"
    code, out, _ = run_cli(capsys, "inspect", path, "--json", "--input-shape", "input=7,20")
    assert code == 0 and json.loads(out)["flops"] == 7 * (gemms + relus)


def test_inspect_ir_prints_the_graph(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys)
    code, out, _ = run_cli(capsys, "inspect", path, "--ir")
    assert code == 0
    ir = str(import_onnx(path))
    assert ir in out and ir.startswith("graph mlp(") and "= Gemm(" in ir


def test_conv_flops(rng):
    n, cin, cout, k, size, group = 2, 8, 12, 3, 10, 4
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=group)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                      [n, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(rng.standard_normal((cout, cin // group, k, k))
                                      .astype(np.float32), "w"),
         onnx.numpy_helper.from_array(np.zeros(cout, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    [conv] = import_onnx(model).nodes
    outputs = n * cout * size * size
    assert node_flops(conv) == 2 * outputs * (cin // group) * k * k + outputs


def test_resnet50_flops_sanity():
    # ResNet-50 is 4.1 G multiply-adds at 224x224 (He et al. 2016, Table 1: 3.8 G for v1;
    # torchvision's v1.5 with the stride on the 3x3 conv: 4.09 G)
    summary = summarize(import_onnx(zoo.build("resnet50")))
    conv_and_fc = summary.flops_by_op["Conv"].value + summary.flops_by_op["Gemm"].value
    assert 2 * 4.0e9 < conv_and_fc < 2 * 4.2e9
    assert summary.flops.value > conv_and_fc
    assert summary.op_counts["Conv"] == 53 and not summary.unestimated


def test_count_polynomial():
    flops = Count.of(["N", 3]) * Count.of(["2*N*S"]) + Count.of([5])
    assert flops == Count({("N", "N", "S"): 6, (): 5}) and flops.value is None
    assert str(flops) == "6*N*N*S + 5" and (2 * Count.of([4])).value == 8


# -- mistakes ----------------------------------------------------------------------------------


def _cli_subprocess(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "dnnc", *map(str, argv)], capture_output=True,
                          text=True, cwd=cwd,
                          env={"PYTHONPATH": str(REPO), "PATH": "", "DNNC_CACHE": "0"})


def test_bad_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage, not a model")
    result = _cli_subprocess("inspect", bad, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("dnnc: error:") and "ONNX model" in result.stderr


def test_unsupported_ops_are_one_line(tmp_path, capsys):
    nodes = [helper.make_node("NoSuchOp", ["x"], ["y"], name="first"),
             helper.make_node("AlsoMissing", ["y"], ["z"], name="second")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("z", 1, [2])])
    path = tmp_path / "unsupported.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code, out, err = run_cli(capsys, "compile", path, "-q")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "NoSuchOp" in err and "AlsoMissing" in err and "'first'" in err
    code, out, err = run_cli(capsys, "inspect", path, "--ir")   # the IR needs an import
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "NoSuchOp" in err


def test_inspect_summarises_a_model_with_unsupported_ops_marking_them(tmp_path, capsys):
    """What dnnc cannot compile yet is still inspected: declared signature, op counts with
    the unsupported ops marked, parameters; no FLOPs (they need an import's types)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("NoSuchOp", ["r"], ["y"], name="first"),
             helper.make_node("MatMul", ["y", "w"], ["z"], name="mm"),
             helper.make_node("Sub", ["z", "w2"], ["s"], name="sub", domain="com.example")]
    weights = [onnx.numpy_helper.from_array(np.ones((4, 3), np.float32), "w"),
               onnx.numpy_helper.from_array(np.ones((3,), np.float32), "w2")]
    graph = helper.make_graph(nodes, "partly",
                              [helper.make_tensor_value_info("x", 1, ["N", 4])],
                              [helper.make_tensor_value_info("s", 1, None)], weights)
    path = tmp_path / "partly.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]),
              path)
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0 and len(err.splitlines()) == 1 and err.startswith("dnnc: 2 unsupported")
    lines = out.splitlines()
    assert lines[0] == "graph partly: 4 nodes" and ["x", "float32[N,4]"] == lines[2].split()
    assert ["s", "float32[?]"] == lines[4].split()
    assert [line.split() for line in lines if "unsupported" in line][:2] == [
        ["NoSuchOp", "1", "(unsupported)"], ["com.example::Sub", "1", "(unsupported)"]]
    assert ["Relu", "1"] in [line.split() for line in lines]
    assert "parameters: 15 " in out
    assert "FLOPs: not estimated: dnnc cannot import 2 of the model's ops yet " \
           "(NoSuchOp, com.example::Sub)" in out
    code, out, _ = run_cli(capsys, "inspect", path, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["flops"] is None and doc["parameters"] == 15
    assert doc["op_counts"] == {"Relu": 1, "NoSuchOp": 1, "MatMul": 1, "com.example::Sub": 1}
    assert doc["unsupported_ops"] == [
        {"op": "NoSuchOp", "domain": "", "opset": 17, "nodes": ["first"]},
        {"op": "Sub", "domain": "com.example", "opset": 1, "nodes": ["sub"]}]


@pytest.mark.parametrize("argv,message", [
    (["inspect", "missing.onnx"], "does not exist"),
    (["zoo", "nosuchnet", "-o", "x.onnx"], "unknown zoo model"),
    (["zoo", "mlp", "-o", "x.onnx", "--set", "depth=3"], "no option"),
    (["zoo", "mlp", "-o", "x.onnx", "--set", "hidden"], "key=value"),
    (["zoo", "mlp", "-o", "no/such/dir/x.onnx"], "cannot write"),
    (["zoo", "mlp"], "-o FILE"),
])
def test_mistakes_exit_2_with_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and len(err.splitlines()) == 1 and message in err


def test_input_shape_of_unknown_input(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys)
    code, _, err = run_cli(capsys, "inspect", path, "--input-shape", "pixels=1,20")
    assert code == 2 and "pixels" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# compile, run, bench (llvm target)


def test_compile_then_run_the_artifact(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys)
    out_file = tmp_path / "mlp.dnnc"
    code, out, err = run_cli(capsys, "compile", path, "--target", "llvm", "-o", out_file,
                             "--opt-level", "2", "--emit", "llvm-ir", tmp_path / "ir",
                             "--emit", "loop", tmp_path / "ir", "--outputs", "numpy")
    assert code == 0, err
    assert out.startswith(f"wrote {out_file}: llvm, 3 kernels, 0 host fallback")  # 5 nodes, fused
    assert "compiling" in err  # progress lines go to stderr
    assert "define" in (tmp_path / "ir" / "mlp.ll").read_text()
    assert "for " in (tmp_path / "ir" / "mlp.loop").read_text()
    x = np.random.default_rng(1).standard_normal((2, 20)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = run_cli(capsys, "run", out_file, "--input", f"input={tmp_path / 'x.npy'}",
                             "--output-dir", tmp_path / "outs")
    assert code == 0, err
    assert out.splitlines()[0].startswith("logits: float32[2,5]  min ")
    want = dnnc.compile(str(path), target="numpy")(x)
    np.testing.assert_allclose(np.load(tmp_path / "outs" / "logits.npy"), want, rtol=1e-5,
                               atol=1e-6)
    code, out, _ = run_cli(capsys, "inspect", out_file)
    assert code == 0 and "MatMulPacked" in out   # the artifact holds the optimised graph
    assert out.splitlines()[-1].startswith(f"artifact: dnnc {dnnc.__version__}, target llvm")


def test_compile_and_bench_at_bf16_on_llvm(tmp_path, capsys):
    """--precision bf16 on llvm: the artifact records it (and `run` refuses another
    --precision for it); bench compiles at it; tf32 is refused naming what llvm takes."""
    path = mlp_file(tmp_path, capsys)
    out_file = tmp_path / "mlp.dnnc"
    code, out, err = run_cli(capsys, "compile", path, "--target", "llvm", "-o", out_file,
                             "--precision", "bf16", "--no-cache", "--json")
    assert code == 0, err
    assert dnnc.load(out_file).stats["precision"] == "bf16"
    code, out, err = run_cli(capsys, "run", out_file, "--precision", "fp32")
    assert code != 0 and "was compiled at precision bf16, not fp32" in err
    code, out, err = run_cli(capsys, "bench", path, "--target", "llvm", "--precision", "bf16",
                             "--no-onnxruntime", "--repeat", "3", "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "compile", path, "--target", "llvm", "-o", out_file,
                             "--precision", "tf32")
    assert code != 0 and "precision='tf32' is not one the llvm target computes in" in err


def test_run_onnx_with_random_inputs_and_a_symbolic_batch(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys, batch="N")
    code, out, err = run_cli(capsys, "run", path, "--random", "--dim", "N=3", "--seed", "4",
                             "--output-dir", tmp_path / "o")
    assert code == 0, err
    assert out.splitlines()[0].startswith("logits: float32[3,5]")
    assert "compiling for these shapes" in out
    x = np.random.default_rng(4).standard_normal((3, 20)).astype(np.float32)
    want = dnnc.compile(str(path), target="numpy")(x)
    np.testing.assert_allclose(np.load(tmp_path / "o" / "logits.npy"), want, rtol=1e-5,
                               atol=1e-6)


def test_compile_for_a_cpu_subset(tmp_path, capsys):
    """--mattr edits the host's features; the artifact records (and needs) only those."""
    path = mlp_file(tmp_path, capsys)
    code, _, err = run_cli(capsys, "compile", path, "-o", tmp_path / "sse.dnnc", "-q",
                           "--mattr=-avx512f,-avx2,-avx,-fma", "--target", "llvm")
    assert code == 0 and err == ""
    from dnnc.compiler.artifact import read_manifest

    features = set(read_manifest(tmp_path / "sse.dnnc")["target"]["features"])
    assert not features & {"avx512f", "avx2", "avx", "fma"}
    code, out, _ = run_cli(capsys, "run", tmp_path / "sse.dnnc", "--random", "-q")
    assert code == 0 and out.startswith("logits: float32[2,5]")


def test_bench_prints_medians(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys, batch="N")
    code, out, err = run_cli(capsys, "bench", path, "--repeat", "3", "--warmup", "1",
                             "--batch", "1,4", "--target", "llvm")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"dnnc bench: {path}, target llvm") and "thread" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["1", "4"]
    assert all(float(r[1]) > 0 for r in rows)
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        assert all(r[2] == "n/a" for r in rows)
    else:
        assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


def test_bench_times_each_batch_size_on_its_own_code(tmp_path, capsys, monkeypatch):
    # issue 30: a new size runs on another size's code in slices while its own compiles in
    # the background; timed then, batch 64 after batch 1 read 5.5x onnxruntime (1.01x alone)
    from dnnc.compiler.cli import bench

    path = mlp_file(tmp_path, capsys, batch="N")
    models, timed_splits = [], []
    model_for = bench.model_for
    monkeypatch.setattr(bench, "model_for", lambda *a: models.append(model_for(*a)) or
                        models[-1])
    call_times_ms = bench.call_times_ms

    def timed(fn, repeat, warmup):   # the split calls among the timed calls alone
        for _ in range(warmup):
            fn()
        rt = models[0].runtime
        before = rt.split_calls
        times = call_times_ms(fn, repeat, 0)
        timed_splits.append(rt.split_calls - before)
        return times

    monkeypatch.setattr(bench, "call_times_ms", timed)
    code, out, err = run_cli(capsys, "bench", path, "--repeat", "4", "--warmup", "1",
                             "--batch", "1,8,3", "--target", "llvm", "--no-onnxruntime",
                             "--no-cache", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["batch"] for r in rows] == [1, 8, 3]
    assert timed_splits == [0, 0, 0]
    assert [r["batch_split_calls"] for r in rows] == [0, 0, 0]
    rt = models[0].runtime
    assert rt.split_calls > 0   # sizes 8 and 3 did start on another size's code
    assert {s.shapes[0][0] for s in rt.compiled_segments()} >= {1, 3, 8}


@pytest.mark.parametrize("argv,message", [
    (["run", "{mlp}"], "--random"),
    (["run", "{mlp}", "--input", "input=nothere.npy"], "cannot read"),
    (["run", "{bad}", "--random"], "corrupt or truncated"),
    (["compile", "{mlp}", "--emit", "ptx", "out"], "--emit 'ptx'"),
    (["compile", "{mlp}", "--target", "numpy", "--mcpu", "znver4"], "llvm target only"),
    (["bench", "{mlp}", "--batch", "8"], "batch is fixed"),
    (["compile", "{mlp}", "--target", "llvm", "--outputs", "cupy"],
     "outputs='cupy': the llvm target returns numpy arrays; cupy arrays come from the cuda"),
    (["compile", "{mlp}", "--outputs", "jax"], "invalid choice: 'jax'"),
])
def test_compile_run_bench_mistakes(tmp_path, capsys, monkeypatch, argv, message):
    mlp = mlp_file(tmp_path, capsys)
    bad = tmp_path / "bad.dnnc"
    bad.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *[a.format(mlp=mlp, bad=bad) for a in argv])
    assert code == 2 and len(err.strip().splitlines()[-1:]) == 1
    assert err.strip().splitlines()[-1].startswith("dnnc: error:") and message in err


# ---------------------------------------------------------------------------------------------
# the pass pipeline: inspect --passes, compile --dump-ir


def _pass_rows(out: str) -> dict[str, list[str]]:
    """The rows of `inspect --passes`' table by pass name."""
    lines = out.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("passes for "))
    return {line.split()[1]: line.split() for line in lines[start + 2:]
            if line.split() and line.split()[0].isdigit()}


def test_inspect_passes_prints_nodes_and_kernels_after_each_pass(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys)
    code, out, err = run_cli(capsys, "inspect", path, "--passes", "--target", "llvm")
    assert code == 0 and not err
    assert "passes for llvm at opt level 3:" in out
    rows = _pass_rows(out)
    assert list(rows) == ["(imported)", "fuse_quantized", "fold_constants", "simplify",
                          "eliminate", "widen_half", "fuse_attention", "store_half",
                          "expand_powers", "convert_layout", "store_tf32", "sink_updates",
                          "take_range", "fuse_ops"]
    # columns: index, pass, level, nodes, kernels, ms
    assert rows["(imported)"][2:5] == ["-", "5", "5"]
    assert rows["convert_layout"][3:5] == ["5", "5"]
    assert rows["fuse_ops"][3:5] == ["5", "3"]    # Gemm + Relu fused twice
    assert rows["fuse_ops"][2] == "2" and float(rows["fuse_ops"][5]) >= 0
    model = dnnc.compile(str(path), target="llvm", progress=False)
    assert int(rows["fuse_ops"][4]) == model.stats["kernels"]


def test_inspect_passes_level_and_json(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys)
    code, out, _ = run_cli(capsys, "inspect", path, "--passes", "--opt-level", "1",
                           "--target", "llvm")
    assert code == 0
    assert list(_pass_rows(out)) == ["(imported)", "fuse_quantized", "fold_constants",
                                     "simplify", "eliminate", "widen_half",
                                     "expand_powers", "sink_updates"]
    assert _pass_rows(out)["eliminate"][3:5] == ["5", "5"]   # no fusion at level 1
    code, out, _ = run_cli(capsys, "inspect", path, "--passes", "--json", "--target", "llvm")
    passes = json.loads(out)["passes"]
    assert passes["target"] == "llvm" and passes["opt_level"] == 3
    assert [r["pass"] for r in passes["after"]][-3:] == ["sink_updates", "take_range",
                                                         "fuse_ops"]
    assert passes["after"][-1]["kernels"] == 3 and passes["after"][0]["seconds"] is None
    code, out, _ = run_cli(capsys, "inspect", path, "--passes", "--target", "numpy")
    assert code == 0 and list(_pass_rows(out)) == ["(imported)"]
    assert "runs no passes" in out


def test_compile_dump_ir_writes_the_graph_after_every_pass(tmp_path, capsys):
    path = mlp_file(tmp_path, capsys)
    code, out, err = run_cli(capsys, "compile", path, "-o", tmp_path / "m.dnnc",
                             "--dump-ir", tmp_path / "ir", "--target", "llvm")
    assert code == 0, err
    files = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert files == ["00_input.txt", "01_fuse_quantized.txt", "02_fold_constants.txt",
                     "03_simplify.txt", "04_eliminate.txt", "05_widen_half.txt",
                     "06_fuse_attention.txt", "07_store_half.txt", "08_expand_powers.txt",
                     "09_convert_layout.txt", "10_store_tf32.txt", "11_sink_updates.txt",
                     "12_take_range.txt", "13_fuse_ops.txt"]
    assert "Gemm" in (tmp_path / "ir" / "00_input.txt").read_text()
    assert "MatMulPacked" in (tmp_path / "ir" / "09_convert_layout.txt").read_text()
    assert "MatMulPacked" not in (tmp_path / "ir" / "04_eliminate.txt").read_text()
    assert f"into {tmp_path / 'ir'}" in err


@pytest.mark.parametrize("argv,message", [
    (["inspect", "{mlp}", "--opt-level", "2"], "go with --passes"),
    (["inspect", "{mlp}", "--target", "llvm"], "go with --passes"),
    (["inspect", "{art}", "--passes"], "already optimised"),
    (["compile", "{mlp}", "--target", "numpy", "--dump-ir", "ir"], "runs no passes"),
    (["compile", "{mlp}", "--dump-ir", "{file}/ir"], "cannot write"),
])
def test_pass_option_mistakes(tmp_path, capsys, monkeypatch, argv, message):
    mlp = mlp_file(tmp_path, capsys)
    art = tmp_path / "m.dnnc"
    if "{art}" in argv:
        assert run_cli(capsys, "compile", mlp, "-o", art, "-q")[0] == 0
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *[a.format(mlp=mlp, art=art, file=mlp) for a in argv])
    assert code == 2 and err.strip().splitlines()[-1].startswith("dnnc: error:")
    assert message in err


# ---------------------------------------------------------------------------------------------
# every option checked before work starts; exit statuses (docs/cli.md, "Exit codes")


@pytest.mark.parametrize("argv,message", [
    ([], "required: COMMAND"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["zoo", "mlp", "-o", "x.onnx", "--batch", "0"], "--batch: a size must be at least 1"),
    (["zoo", "mlp", "-o", "x.onnx", "--batch", "-3"], "--batch: a size must be at least 1"),
    (["zoo", "mlp", "-o", "x.onnx", "--set", "hidden=(0,)"], "option hidden must be a tuple"),
    (["zoo", "bert", "-o", "x.onnx", "--set", "layers=-1"], "option layers must be an int"),
    (["zoo", "bert", "-o", "x.onnx", "--set", "embeddings=1"], "option embeddings must be"),
    (["zoo", "mlp", "-o", "x.onnx", "--set", "seed=-1"], "option seed must be an int >= 0"),
    (["inspect", "{mlp}", "--input-shape", "input=-1,20"], "a size must be at least 0"),
    (["inspect", "{mlp}", "--input-shape", "input=3,20"], "dim 0 is fixed to 2 by the model"),
    (["inspect", "{mlp}", "--input-shape", "input=2,20,1"], "has rank 3"),
    (["compile", "{mlp}", "--opt-level", "7"], "argument --opt-level: invalid choice"),
    (["compile", "{mlp}", "-o", "no/such/dir/m.dnnc"], "folder 'no/such/dir' does not exist"),
    (["compile", "{mlp}", "-o", "."], "is a folder"),
    (["compile", "{sym}", "--emit", "asm", "out", "--target", "llvm"],
     "input dim(s) N are symbolic"),
    (["compile", "{mlp}", "--target", "numpy", "--emit", "asm", "out"], "generates no code"),
    (["run", "{sym}", "--random", "--dim", "Q=3"], "--dim Q: not a symbolic dim of an input "
                                                    "--random fills (N)"),
    (["run", "{sym}", "--random", "--dim", "N=0"], "--dim N: a size must be at least 1"),
    (["run", "{sym}", "--random", "--dim", "N=2", "--dim", "N=3"], "--dim N given twice"),
    (["run", "{mlp}", "--random", "--dim", "N=3"], "(there is none)"),
    (["run", "{sym}", "--input", "nope=x.npy"], "--input nope: the model has no such input; "
                                                "its inputs are input"),
    (["run", "{mlp}", "--input", "input=x.npy", "--input", "input=x.npy"], "given twice"),
    (["run", "{mlp}", "--input", "input=x.npy", "--random"], "every input is given"),
    (["run", "{mlp}", "--random", "--seed", "-1"], "argument --seed: must be at least 0"),
    (["bench", "{sym}", "--batch", "0"], "--batch: a size must be at least 1, not 0"),
    (["bench", "{sym}", "--repeat", "0"], "argument --repeat: must be at least 1, not 0"),
    (["bench", "{sym}", "--warmup", "-1"], "argument --warmup: must be at least 0"),
    (["bench", "{sym}", "--threads", "0"], "argument --threads: must be at least 1"),
    (["bench", "{sym}", "--repeat", "x"], "argument --repeat: expects an integer"),
    (["compare", "{mlp}", "--rtol", "-1"], "argument --rtol: must be a finite number >= 0"),
    (["compare", "{mlp}", "--atol", "nan"], "argument --atol: must be a finite number >= 0"),
    (["compare", "{mlp}", "--target", "numpy", "--bisect-passes"], "runs no passes"),
    (["compare", "missing.onnx"], "does not exist"),
    (["compare", "{art}"], "is an artifact"),
])
def test_bad_options_exit_2_with_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv,
                                                          message):
    mlp = mlp_file(tmp_path, capsys)
    sym = tmp_path / "sym.onnx"
    sym.write_bytes(zoo.build("mlp", batch="N", hidden=(8,), in_features=20,
                              classes=5).SerializeToString())
    art = tmp_path / "m.dnnc"
    art.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((2, 20), np.float32))
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run_cli(capsys, *[a.format(mlp=mlp, sym=sym, art=art) for a in argv])
    assert code == 2 and out == "" and message in err, err
    assert err.splitlines()[-1].startswith("dnnc: error:") and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before   # nothing written


def test_emit_with_the_symbolic_dims_fixed(tmp_path, capsys):
    sym = tmp_path / "sym.onnx"
    sym.write_bytes(zoo.build("mlp", batch="N", hidden=(8,), in_features=20,
                              classes=5).SerializeToString())
    code, _, err = run_cli(capsys, "compile", sym, "-o", tmp_path / "m.dnnc", "--emit", "asm",
                           tmp_path / "asm", "--input-shape", "input=3,20", "--target", "llvm")
    assert code == 0, err
    assert "entry" in (tmp_path / "asm" / "sym.s").read_text()


@pytest.mark.parametrize("raised,status,start", [
    (RuntimeError("boom"), 3, "dnnc: internal error: RuntimeError: boom (a dnnc bug"),
    (dnnc.errors.CompileError("LLVM rejected it"), 3, "dnnc: error: LLVM rejected it"),
    (dnnc.errors.ShapeError("bad shape"), 2, "dnnc: error: bad shape"),
    (FileNotFoundError(2, "No such file or directory", "x.npy"), 2,
     "dnnc: error: x.npy: No such file or directory"),
    (KeyboardInterrupt(), 130, "dnnc: interrupted"),
])
def test_one_table_maps_failures_to_exit_statuses(capsys, monkeypatch, raised, status, start):
    from dnnc.compiler.cli import inspect as inspect_command

    def fail(args):
        raise raised

    monkeypatch.setattr(inspect_command, "run", fail)
    code, out, err = run_cli(capsys, "inspect", "m.onnx")
    assert code == status and err.startswith(start) and len(err.splitlines()) == 1
    monkeypatch.setenv("DNNC_DEBUG", "1")
    code, out, err = run_cli(capsys, "inspect", "m.onnx")
    assert code == status and "Traceback" in err and err.splitlines()[-1].startswith(start)


def test_unwritable_output_in_a_subprocess_is_one_line_and_exit_2(tmp_path, capsys):
    mlp = mlp_file(tmp_path, capsys)
    result = _cli_subprocess("compile", mlp, "-o", "/nonexistent/x.dnnc", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "dnnc: error: -o '/nonexistent/x.dnnc': folder '/nonexistent' " \
                            "does not exist\n"


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys):
    import signal

    mlp = mlp_file(tmp_path, capsys)
    process = subprocess.Popen(
        [sys.executable, "-m", "dnnc", "bench", str(mlp), "--target", "numpy",
         "--no-onnxruntime", "--repeat", "100000000"], cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PYTHONPATH": str(REPO), "PATH": "", "DNNC_CACHE": "0"})
    try:
        first = process.stderr.readline()   # inside main: the model is being compiled
        assert first.startswith("dnnc: compiling"), first
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130 and err == "dnnc: interrupted\n"


def test_ctrl_c_ends_dnnc_even_when_the_interrupt_is_swallowed():
    """Third-party code may catch the KeyboardInterrupt (Cython's module setup in numpy's lazy
    random import did): dnnc still exits 130 with one line, after FORCE_EXIT_SECONDS."""
    import signal

    script = (
        "import os, time\n"
        "from dnnc.compiler import cli\n"
        "def swallowing(argv):\n"
        "    end, ready = time.time() + 60, False\n"
        "    while True:\n"   # swallows the interrupt wherever after 'ready' it lands
        "        try:\n"
        "            if not ready:\n"
        "                ready = True\n"
        "                os.write(2, b'ready\\n')\n"
        "            while time.time() < end:\n"
        "                time.sleep(0.01)\n"
        "            return 0\n"
        "        except KeyboardInterrupt:\n"
        "            pass\n"
        "cli._main = swallowing\n"
        "raise SystemExit(cli.main([]))\n")
    process = subprocess.Popen([sys.executable, "-c", script], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={"PYTHONPATH": str(REPO), "PATH": "", "DNNC_CACHE": "0"})
    try:
        assert process.stderr.readline() == "ready\n"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and err == "dnnc: interrupted\n"


def test_tune_for_a_gpu_target_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    """Issue 30: `dnnc tune --target cuda` on a machine without a GPU exited 0, printed
    "tuned 3 task(s)" and wrote a log of error records, where compile, run and bench exit 2
    with one line; now tune does the same, and writes no log."""
    from dnnc.backends.registry import REGISTRY

    spec = REGISTRY["cuda"]
    if spec.available():
        pytest.skip("this machine has a GPU")
    model, log = mlp_file(tmp_path, capsys), tmp_path / "log.jsonl"
    code, out, err = run_cli(capsys, "tune", model, "--target", "cuda", "--log", log,
                             "--trials", "2")
    with pytest.raises(dnnc.errors.DeviceError) as caught:
        spec.require()
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"dnnc: error: {caught.value}"]
    assert not log.exists()
    with pytest.raises(dnnc.errors.DeviceError):   # the API too, before measuring anything
        dnnc.tune(str(model), "cuda", log=log, trials=2, progress=False)
    assert not log.exists()


# ---------------------------------------------------------------------------------------------
# what a new user met (issue 30, item 16)


def test_common_flags_go_before_the_command_too(tmp_path, capsys):
    mlp = mlp_file(tmp_path, capsys)
    code, out, err = run_cli(capsys, "-q", "compile", mlp, "-o", tmp_path / "m.dnnc",
                             "--no-cache")
    assert code == 0 and err == "" and out.startswith("wrote ")
    code, out, err = run_cli(capsys, "--json", "-q", "inspect", mlp)
    assert code == 0 and json.loads(out)["op_counts"]["Gemm"] == 3
    code, out, err = run_cli(capsys, "-v", "compile", mlp, "-o", tmp_path / "m.dnnc",
                             "--no-cache")
    assert code == 0 and "dnnc: pass fuse_ops:" in err
    code, _, err = run_cli(capsys, "-q", "compile", mlp, "-v")
    assert code == 2 and err == "dnnc: error: -q and -v exclude each other (see dnnc --help)\n"


def test_tune_names_its_option_and_checks_it_before_importing(tmp_path, capsys):
    sym = mlp_file(tmp_path, capsys, batch="N")
    log = tmp_path / "t.jsonl"
    code, _, err = run_cli(capsys, "tune", sym, "--log", log)
    assert code == 2 and "input_shapes" not in err
    assert err.strip().splitlines()[-1] == (
        "dnnc: error: tuning needs static input shapes; fix them with --input-shape, e.g. "
        "--input-shape input=1,20")
    code, _, err = run_cli(capsys, "tune", sym, "--log", log, "--timeout", "0")
    assert code == 2 and err == ("dnnc: error: argument --timeout: must be a positive number "
                                 "of seconds, not 0 (see dnnc tune --help)\n")
    assert not log.exists()


@pytest.mark.parametrize("command", [["compile"], ["tune", "--log", "t.jsonl"]])
def test_a_missing_model_is_refused_before_importing_it(tmp_path, capsys, monkeypatch,
                                                        command):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, command[0], "nope.onnx", *command[1:])
    assert code == 2 and err == "dnnc: error: model file 'nope.onnx' does not exist\n"


def test_draw_refuses_a_file_it_would_not_write_as_named(tmp_path, capsys):
    mlp = mlp_file(tmp_path, capsys)
    code, _, err = run_cli(capsys, "inspect", mlp, "--draw", tmp_path / "r18.png")
    assert code == 2 and "--draw writes SVG: name the file .svg" in err
    assert not (tmp_path / "r18.png").exists()


def test_run_says_what_is_wrong_with_an_input_file(tmp_path, capsys):
    mlp = mlp_file(tmp_path, capsys)
    (tmp_path / "text.onnx").write_text("not numbers\n")
    np.save(tmp_path / "obj.npy", np.array([None, 1], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "one.npz", x=np.ones((2, 20), np.float32))
    np.savez(tmp_path / "two.npz", a=np.ones(2), b=np.ones(3))
    np.save(tmp_path / "wide.npy", np.ones((2, 3), np.float32))
    for file, message in [("text.onnx", "not a NumPy file (.npy, or .npz of one array"),
                          ("obj.npy", "an .npy of Python objects (dtype object)"),
                          ("two.npz", "holds 2 arrays (a, b); give a file of one array"),
                          # one way of printing shapes in one message
                          ("wide.npy", "expected float32[2,20], given float32[2,3] (shape "
                                       "[2,3] where float32[2,20] was inferred)")]:
        code, _, err = run_cli(capsys, "run", mlp, "--input", f"input={tmp_path / file}",
                               "-q")
        assert code == 2 and message in err and "pickle" not in err, err
    code, out, err = run_cli(capsys, "run", mlp, "--input", f"input={tmp_path / 'one.npz'}",
                             "-q")
    assert code == 0 and out.startswith("logits: float32[2,5]"), err


def test_tune_prints_tiny_kernel_times_with_their_digits():
    from types import SimpleNamespace

    from dnnc.autotune.tuner import TaskReport, _postfix, table

    report = TaskReport(SimpleNamespace(name="dense [n]", count=1), default_ms=0.00412,
                        best_ms=0.00371)
    assert _postfix(report) == "best 0.00371 ms, default 0.00412 ms, errors 0"
    row = table([report]).splitlines()[1].split()
    assert row[3:6] == ["0.00412", "0.00371", "1.11x"]
    slow = TaskReport(SimpleNamespace(name="dense [n]", count=1), default_ms=12.3456,
                      best_ms=None)
    assert _postfix(slow) == "best - ms, default 12.346 ms, errors 0"


def _section(doc: str, heading: str) -> str:
    text = (REPO / "docs" / doc).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_docs_bench_example_runs_as_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    section = _section("cli.md", "## `dnnc bench`")
    example = section.split("```")[3]   # the first example (the usage block is first)
    lines = [line[2:].split("#")[0].split() for line in example.splitlines()
             if line.startswith("$ dnnc ")]
    assert [line[1] for line in lines] == ["zoo", "bench"]
    for argv in lines:
        argv = argv[1:] + (["--repeat", "3", "--warmup", "1", "--no-cache"]
                           if argv[1] == "bench" else [])
        code, _, err = run_cli(capsys, *argv)
        assert code == 0, (argv, err)


def test_docs_name_the_passes_bisection_runs_and_jit_s_default_target():
    from dnnc.passes.manager import PIPELINE

    section = _section("cli.md", "## dnnc compare")
    listed = section[section.index("passes of the pipeline ("):].split(")")[0]
    assert re.findall(r"`(\w+)`", listed)[:len(PIPELINE)] == [n for n, _, _ in PIPELINE]
    heading = next(line for line in (REPO / "docs" / "tracing.md").read_text().splitlines()
                   if line.startswith("## `dnnc.jit("))
    parameters = inspect.signature(dnnc.jit).parameters
    assert f"target={parameters['target'].default!r}" in heading


def test_input_shape_mistakes_are_named_as_the_option(tmp_path, capsys):
    """Issue 30, item 16: on the command line a shape mistake names --input-shape as the user
    typed it, never the Python API's `input_shapes`; `dnnc run` prints shapes as `[2,3]`."""
    from onnx import TensorProto, helper
    from dnnc.compiler.cli import main

    def model(shape):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.onnx"
        path.write_bytes(helper.make_model(graph, opset_imports=[
            helper.make_opsetid("", 17)]).SerializeToString())
        return str(path)

    unshaped, symbolic = model(None), model(["N", 3])
    cases = [([unshaped], "input 'x' has no shape; give one with --input-shape x=D0,D1,..."),
             ([symbolic, "--input-shape", "y=2,3"],
              "--input-shape names 'y', but the model's inputs are x"),
             ([symbolic, "--input-shape", "x=2,4"],
              "--input-shape x: dim 1 is fixed to 3 by the model, not 4"),
             ([symbolic, "--input-shape", "x=2"],
              "--input-shape x=2 has rank 1; the model's input 'x' has rank 2")]
    for args, message in cases:
        assert main(["compile", *args, "-o", str(tmp_path / "o.dnnc"), "-q"]) == 2
        err = capsys.readouterr().err
        assert err == f"dnnc: error: {message}\n", err
        assert "input_shapes" not in err
    assert main(["run", symbolic, "--input-shape", "x=2,3", "--random", "-q"]) == 0
    assert capsys.readouterr().out.startswith("y: float32[2,3]  min ")
