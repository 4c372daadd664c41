"""Pruned zoo files for tests and benchmarks (`dnnc.testing.pruned_files`)."""

import onnx

from dnnc.compiler.sparsify import constant_tensors, find_layers, zero_fraction
from dnnc.testing.pruned_files import pruned_file, pruned_model, undivided_layers


def _zeros(model) -> dict:
    tensors = constant_tensors(model)
    return {l.node: (zero_fraction(l, tensors), l.depthwise) for l in find_layers(model)}


def test_mobilenet_v2_is_pruned_with_its_depthwise_layers_dense():
    zeros = _zeros(pruned_model("mobilenet_v2", 0.9, size=32, width_mult=0.5))
    assert all(z == 0 if dw else abs(z - 0.9) < 0.01 for z, dw in zeros.values())
    assert sum(dw for _, dw in zeros.values()) == 17


def test_two_of_four_leaves_the_layers_it_does_not_fit_dense(tmp_path):
    model = pruned_model("resnet50", None, "2:4", size=32)
    assert undivided_layers(model, "2:4") == ["conv_0"] and undivided_layers(model, "1x1") == []
    zeros = _zeros(model)
    assert zeros.pop("conv_0") == (0.0, False)
    assert {z for z, _ in zeros.values()} == {0.5}


def test_a_file_is_written_once_and_named_for_what_it_holds(tmp_path):
    path = pruned_file(tmp_path / "pruned", "bert", 0.7, layers=1, seq=8)
    assert path.name == "bert_b1_layers1_seq8_unstructured_0.7.onnx"
    stamp = path.stat().st_mtime_ns
    assert pruned_file(tmp_path / "pruned", "bert", 0.7, layers=1, seq=8) == path
    assert path.stat().st_mtime_ns == stamp and not list(tmp_path.rglob("*.partial"))
    zeros = _zeros(onnx.load(path))
    assert len(zeros) == 6 and all(abs(z - 0.7) < 1e-3 for z, _ in zeros.values())
    assert pruned_file(tmp_path, "bert", None, "2:4", layers=1, seq=8).name == \
        "bert_b1_layers1_seq8_2of4_0.5.onnx"


def test_any_onnx_file_is_pruned_the_same_way(tmp_path):
    from dnnc import zoo
    from dnnc.testing.pruned_files import pruned_copy

    onnx.save(zoo.build("cnn", size=8), tmp_path / "cnn.onnx")
    path = pruned_copy(tmp_path / "cnn.onnx", tmp_path / "out", None, "2:4")
    assert path.name == "cnn_2of4_0.5.onnx"
    zeros = _zeros(onnx.load(path))
    assert zeros.pop("conv_0") == (0.0, False)   # its reduction of 3x3x3 is no multiple of 4
    assert {z for z, _ in zeros.values()} == {0.5}
