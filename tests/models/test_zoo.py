"""Every zoo model runs on the numpy target and matches onnxruntime on fresh random inputs, and
gives the same results on llvm at the highest opt level as at level 0; the zoo's architectures
are the published ones (parameter counts) and its API behaves."""

import numpy as np
import onnx
import pytest

import dnnc
from dnnc import zoo

ort = pytest.importorskip("onnxruntime")

CASES = [(name, 1) for name in zoo.MODELS] + [("mlp", 2), ("cnn", 2)]
# BERT-Base's full depth and width, at sequence 32 instead of 128: the numpy reference spends
# ~4x less time in its matmuls (test_published_parameter_counts checks the full model)
CONFIG = {"bert_base": {"seq": 32}}
HIGHEST_OPT_LEVEL = 3   # dnnc.passes.manager names no highest level; 3 is also its default


def _fresh_rng():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return np.random.default_rng(seed), seed


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.fixture(scope="module")
def llvm_batch_1():
    """The zoo's models at batch 1 compiled for llvm at the highest opt level, each once for
    the two tests here that run it (resnet18's compile took ~15 s of CI twice)."""
    compiled = {}

    def get(name: str, model):
        if name not in compiled:
            compiled[name] = dnnc.compile(model, target="llvm", opt_level=HIGHEST_OPT_LEVEL)
        return compiled[name]
    yield get
    compiled.clear()


@pytest.mark.parametrize("target", ["numpy", "llvm"])
@pytest.mark.parametrize("name,batch", CASES, ids=[f"{n}-b{b}" for n, b in CASES])
def test_zoo_model_matches_onnxruntime(name, batch, target, llvm_batch_1):
    model = zoo.build(name, batch=batch, **CONFIG.get(name, {}))
    rng, seed = _fresh_rng()
    feeds = zoo.inputs_for(model, rng)
    compiled = llvm_batch_1(name, model) if (target, batch) == ("llvm", 1) else \
        dnnc.compile(model, target=target)
    if target == "llvm":
        assert compiled.stats["host_fallback_ops"] == 0, compiled.runtime.host_fallback_ops
    outputs = compiled.run(*feeds.values())
    expected = _onnxruntime(model, feeds)
    assert len(outputs) == len(expected)
    for out, ref in zip(outputs, expected):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        assert np.std(ref) > 0.1, "the model's output should not be trivially constant"
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name} batch {batch}, input seed {seed}")


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_model_same_at_every_opt_level(name, llvm_batch_1):
    # the passes (folding, simplification, elimination, layouts, fusion, memory planning) and
    # LLVM's own optimisation preserve meaning: level 0 compiles the graph as imported
    model = zoo.build(name, batch=1, **CONFIG.get(name, {}))
    rng, seed = _fresh_rng()
    feeds = zoo.inputs_for(model, rng)
    unoptimised = dnnc.compile(model, target="llvm", opt_level=0)
    optimised = llvm_batch_1(name, model)
    assert unoptimised.stats["nodes"] == unoptimised.stats["imported_nodes"]
    assert optimised.stats["kernels"] < unoptimised.stats["kernels"], \
        "the highest opt level should fuse something, or this test compares level 0 twice"
    outputs = optimised.run(*feeds.values())
    expected = unoptimised.run(*feeds.values())
    assert len(outputs) == len(expected)
    for out, ref in zip(outputs, expected):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        assert np.std(ref) > 0.1, "the model's output should not be trivially constant"
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name} at opt level {HIGHEST_OPT_LEVEL} against "
                                           f"level 0, input seed {seed}")


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_onnx_checker_accepts(name):
    config = {"layers": 2} if name == "bert_base" else {}  # the full checker on 440 MB is slow
    onnx.checker.check_model(zoo.build(name, batch="N", **config), full_check=True)


@pytest.mark.parametrize("target", ["numpy", "llvm"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "bert_tiny"])
def test_symbolic_batch(name, target):
    model = zoo.build(name, batch="N")
    compiled = dnnc.compile(model, target=target)
    assert compiled.input_types[0].shape[0] == "N"
    assert compiled.output_types[0].shape[0] == "N"
    rng, seed = _fresh_rng()
    feeds = zoo.inputs_for(model, rng, dims={"N": 3})
    assert next(iter(feeds.values())).shape[0] == 3
    for out, ref in zip(compiled.run(**feeds), _onnxruntime(model, feeds)):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5, err_msg=f"seed {seed}")


def _trainable_parameters(model) -> int:
    """Float weights of rank >= 1, BatchNorm's running statistics (buffers) left out."""
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) > 0
               and "running_" not in t.name)


@pytest.mark.parametrize("name,expected", [
    ("resnet18", 11_689_512),       # torchvision.models.resnet18
    ("resnet50", 25_557_032),       # torchvision.models.resnet50
    ("mobilenet_v2", 3_504_872),    # torchvision.models.mobilenet_v2
    ("bert_base", 108_891_648),     # transformers BertModel (bert-base-uncased) less its pooler
])
def test_published_parameter_counts(name, expected):
    assert _trainable_parameters(zoo.build(name)) == expected


def test_resnet50_is_bottleneck_3_4_6_3():
    ops = [n.op_type for n in zoo.build("resnet50").graph.node]
    # stem + 16 bottlenecks x 3 + 4 downsample projections
    assert ops.count("Conv") == 1 + 16 * 3 + 4
    assert ops.count("BatchNormalization") == ops.count("Conv")
    assert ops.count("Add") == 16


def test_bert_writes_attention_like_exporters():
    model = zoo.build("bert", layers=3, hidden=64, heads=4, seq=16)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("LayerNormalization") == 1 + 2 * 3
    assert ops.count("Softmax") == 3 and ops.count("Erf") == 3
    assert "Gelu" not in ops and "Attention" not in ops
    assert [i.name for i in model.graph.input] == ["input_ids", "token_type_ids",
                                                   "attention_mask"]
    hidden_only = zoo.build("bert", layers=1, embeddings=False, seq=8)
    assert [i.name for i in hidden_only.graph.input] == ["hidden_states"]


def test_weights_are_seeded():
    a, b, c = zoo.build("cnn"), zoo.build("cnn"), zoo.build("cnn", seed=1)
    assert a.SerializeToString() == b.SerializeToString()
    assert a.graph.initializer[0].raw_data != c.graph.initializer[0].raw_data


def test_inputs_for():
    model = zoo.build("bert_tiny", batch=4, seq=32)
    feeds = zoo.inputs_for(model, np.random.default_rng(0))
    ids, types, mask = feeds["input_ids"], feeds["token_type_ids"], feeds["attention_mask"]
    assert ids.dtype == np.int64 and ids.shape == (4, 32)
    assert 0 <= ids.min() and ids.max() < 30522 and ids.max() > 2
    assert set(np.unique(types)) <= {0, 1}
    assert mask.shape == (4, 32) and np.all(mask[:, 0] == 1)
    # padding only on the right: every row is ones then zeros
    assert np.all(np.diff(mask, axis=1) <= 0)
    image = zoo.inputs_for(zoo.build("cnn", batch=2))["input"]
    assert image.dtype == np.float32 and image.shape == (2, 3, 32, 32) and np.std(image) > 0.5


@pytest.mark.parametrize("call,message", [
    (lambda: zoo.build("alexnet"), "unknown zoo model"),
    (lambda: zoo.build("mlp", depth=3), "no option"),
    (lambda: zoo.build("resnet18", layers=(1, 1, 1, 1)), "no option"),
    (lambda: zoo.build("mlp", batch=0), "batch"),
    (lambda: zoo.build("bert", hidden=100, heads=3), "multiple of heads"),
])
def test_build_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
