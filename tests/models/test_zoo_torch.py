"""bench/zoo_torch.py's PyTorch mirrors compute what the zoo's ONNX models compute, on the zoo's
own weights (checked on CPU against onnxruntime), refuse a model they do not mirror faithfully,
and bench/gpu.py states issue 12's bars from its figures. Needs the optional `torch` package;
skipped without it."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from dnnc import zoo

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gpu  # noqa: E402
import gpu_timing  # noqa: E402
from zoo_torch import MIRRORS, module_for  # noqa: E402

SMALL = {
    "mlp": {"in_features": 48, "hidden": (32, 16, 24)},
    "cnn": {"size": 16, "width": 8, "channels": 2},
    "resnet18": {"size": 48, "width": 8, "classes": 10},
    "resnet50": {"size": 48, "width": 8, "classes": 10},
    "mobilenet_v2": {"size": 48, "width_mult": 0.5, "classes": 10},
    "bert": {"layers": 2, "hidden": 32, "heads": 4, "seq": 16, "vocab": 50, "eps": 1e-5},
    "bert_tiny": {"seq": 32, "vocab": 100},
    "bert_base": {"layers": 2, "seq": 16, "vocab": 100},
}
CASES = [(name, 2, config) for name, config in SMALL.items()] + [
    ("bert", 2, {"embeddings": False, "hidden": 32, "heads": 4, "seq": 16}),
    # the presets themselves, at batch 1 (BERT-Base at sequence 32, as tests/models/test_zoo.py)
    *[(name, 1, {}) for name in ("resnet18", "resnet50", "mobilenet_v2", "bert_tiny")],
    ("bert_base", 1, {"seq": 32}),
]


def _mirror_and_reference(model, feeds):
    with torch.no_grad():
        got = module_for(model)(*[torch.from_numpy(a) for a in feeds.values()]).numpy()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return got, session.run(None, feeds)[0]


def test_every_zoo_model_has_a_mirror():
    assert set(MIRRORS) == set(zoo.MODELS)


@pytest.mark.parametrize("name,batch,config", CASES,
                         ids=[f"{n}-b{b}-{'-'.join(map(str, c.values())) or 'preset'}"
                              for n, b, c in CASES])
def test_mirror_matches_onnxruntime(name, batch, config, rng):
    model = zoo.build(name, batch=batch, **config)
    feeds = zoo.inputs_for(model, rng)
    got, want = _mirror_and_reference(model, feeds)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.std(want) > 0.1, "the model's output should not be trivially constant"
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=f"{name} {config}")


def test_mirror_reads_the_attention_mask(rng):
    # a padded position changes the other tokens' outputs only through the mask
    model = zoo.build("bert", layers=1, hidden=32, heads=4, seq=8, vocab=50)
    feeds = zoo.inputs_for(model, rng)
    feeds["attention_mask"][:] = 1
    feeds["attention_mask"][0, 5:] = 0
    got, want = _mirror_and_reference(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    feeds["input_ids"][0, 6] = (feeds["input_ids"][0, 6] + 1) % 50
    changed, _ = _mirror_and_reference(model, feeds)
    np.testing.assert_allclose(changed[0, :5], got[0, :5], rtol=1e-5, atol=1e-6)


def _edited(model, edit):
    edited = type(model)()
    edited.CopyFrom(model)
    edit(edited.graph)
    return edited


def _set_attribute(graph, node_name, attr_name, values):
    node = next(n for n in graph.node if n.name == node_name)
    attr = next(a for a in node.attribute if a.name == attr_name)
    del attr.ints[:]
    attr.ints.extend(values)


def _add_weight(graph):
    extra = graph.initializer.add()
    extra.CopyFrom(graph.initializer[0])
    extra.name = "fc_9.weight"


def _resize_weight(graph):
    weight = next(t for t in graph.initializer if t.name == "fc_0.weight")
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight)[1:], weight.name))


@pytest.mark.parametrize("name,edit,message", [
    ("cnn", lambda g: _set_attribute(g, "conv_1", "strides", [2, 2]),
     "node 'conv_1': strides is [2, 2], the mirror assumes [1, 1]"),
    ("mlp", _add_weight, "the mirror leaves initializers unused: fc_9.weight"),
    ("mlp", _resize_weight, "initializer 'fc_0.weight' has shape (255, 784), the mirror's layer "
                            "(256, 784)"),
])
def test_mirror_refuses_a_model_it_does_not_mirror(name, edit, message):
    model = _edited(zoo.build(name), edit)
    with pytest.raises(ValueError, match=re.escape(message)):
        module_for(model)


def test_mirror_needs_a_zoo_model():
    model = zoo.build("mlp")
    del model.metadata_props[:]
    with pytest.raises(ValueError, match="not a dnnc zoo model"):
        module_for(model)
    renamed = zoo.bert(layers=1, hidden=16, heads=2, seq=4, vocab=10, name="my_bert")
    with pytest.raises(ValueError, match="no torch mirror of zoo model 'my_bert'"):
        module_for(renamed)


# -- bench/gpu.py's closing lines, from made-up figures --------------------------------------


def _row(name, batch, dnnc, eager, compiled=None, reduce_overhead=None):
    return name, batch, {"device": dnnc, "eager": eager, "default": compiled,
                         "reduce-overhead": reduce_overhead}


def test_issue_bars_pass():
    rows = [_row("mlp", 1, 0.05, 0.10, 0.08, 0.06), _row("resnet18", 1, 0.5, 1.5, 0.6, 0.4),
            _row("resnet50", 32, 10.0, 9.0, 8.5, 8.0)]
    assert gpu.issue_bars(rows) == [
        "batch 1, dnnc faster than eager: 2 of 2 rows ok",
        # sqrt(0.05 / 0.06 * 0.5 / 0.4) = 1.02
        "batch 1, geometric mean of dnnc / reduce-overhead over 2 of 2 rows: 1.02 (bar <= 1.2) "
        "ok",
        "resnet50 batch 32: dnnc / best torch (reduce-overhead) 1.25 (bar <= 1.3) ok",
    ]


def test_issue_bars_fail_and_missing_timings():
    rows = [_row("mlp", 1, 0.12, 0.10, 0.08, 0.06), _row("cnn", 1, 0.05, 0.10),
            _row("bert_base", 8, 10.0, 7.0, 7.5)]
    assert gpu.issue_bars(rows) == [
        "batch 1, dnnc faster than eager: 1 of 2 rows FAIL (mlp 1.20x)",
        "batch 1, geometric mean of dnnc / reduce-overhead over 1 of 2 rows: 2.00 (bar <= 1.2) "
        "FAIL",
        "bert_base batch 8: dnnc / best torch (eager) 1.43 (bar <= 1.3) FAIL",
    ]
    assert gpu.issue_bars([_row("mlp", 1, 0.05, 0.10)])[1] == (
        "batch 1, geometric mean of dnnc / reduce-overhead: n/a (no reduce-overhead timings)")
    # --models "" --big: the batch-size rows alone
    assert gpu.issue_bars([_row("resnet50", 32, 1.0, 2.0)]) == [
        "resnet50 batch 32: dnnc / best torch (eager) 0.50 (bar <= 1.3) ok"]


@pytest.fixture
def gpu_main(monkeypatch, capsys):
    """bench/gpu.py's main without a GPU: each row's bench() is a stand-in that echoes what
    it was asked and gives made-up figures (or fails for "broken")."""
    def bench(name, batch, args):
        if name == "broken":
            raise RuntimeError("no such model")
        figures = {"device": 1.0, "eager": 2.0, "default": 1.0, "reduce-overhead": 0.9}
        return f"row {name} {batch} torch={args.torch} no_compile={args.no_compile}", figures

    monkeypatch.setattr(gpu.device, "import_cupy", lambda: None)
    monkeypatch.setattr(gpu, "header", lambda: "simulated GPU")
    monkeypatch.setattr(gpu, "fp32_only", lambda: None)
    monkeypatch.setattr(gpu, "bench", bench)

    def run(*argv, torch_ok=True):
        monkeypatch.setattr(gpu, "torch_available",
                            lambda args: "--no-torch" if args.no_torch else
                            None if torch_ok else "torch not installed")
        monkeypatch.setattr(sys, "argv", ["gpu.py", *argv])
        code = gpu.main()
        return code, capsys.readouterr().out.splitlines()
    return run


def test_gpu_bench_torch_columns_and_bars(gpu_main):
    code, lines = gpu_main("--models", "mlp,cnn", "--big", "--no-compile")
    assert code == 0 and lines[0] == "simulated GPU"
    assert lines[3].split()[-8:] == ["eager", "compile", "reduce-o", "/eager", "/comp", "/r-o",
                                     "vs", "torch"]
    assert lines[4:8] == ["row mlp 1 torch=True no_compile=True",
                          "row cnn 1 torch=True no_compile=True",
                          "row resnet50 32 torch=True no_compile=True",
                          "row bert_base 8 torch=True no_compile=True"]
    assert lines[8] == "issue 12's bars:" and len(lines) == 13


@pytest.mark.parametrize("argv,torch_ok,why", [
    (["--no-torch"], True, "--no-torch"),
    ([], False, "torch not installed"),
])
def test_gpu_bench_without_torch_columns(gpu_main, argv, torch_ok, why):
    code, lines = gpu_main("--models", "mlp", *argv, torch_ok=torch_ok)
    assert code == 0 and lines[2] == f"torch columns off: {why}"
    assert "eager" not in lines[3] and lines[4:] == ["row mlp 1 torch=False no_compile=False"]


def test_gpu_bench_failed_row(gpu_main):
    code, lines = gpu_main("--models", "broken,mlp")
    assert code == 1
    assert lines[4] == "broken             1 error: RuntimeError: no such model"
    assert lines[6] == "issue 12's bars (rows that failed: broken batch 1):"


def test_torch_available_says_why_not():
    args = type("Args", (), {"no_torch": True})
    assert gpu.torch_available(args) == "--no-torch"
    args.no_torch = False
    assert gpu.torch_available(args) == (
        None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device")


def test_torch_medians_synchronize_every_timed_call(monkeypatch):
    # (on CPU: torch.cuda.synchronize stands in as a counter)
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("sync"))

    class Probe(torch.nn.Module):
        def forward(self, x):
            calls.append("call")
            return x + 1

    medians = gpu_timing.torch_medians(Probe(), [torch.ones(3)], repeat=4, warmup=2,
                                       compile_modes=False)
    assert list(medians) == ["eager"] and medians["eager"] >= 0
    assert calls == ["call", "sync"] * 6
    assert gpu_timing.torch_cells({**medians, "eager": 2.0}, 1.0) == (
        "   2.000        -        -", "  0.50      -      -")
