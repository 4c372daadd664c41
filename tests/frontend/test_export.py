"""dnnc.export_onnx: traced and imported graphs written as ONNX run in onnxruntime with the
results of the original function / model; ops with no ONNX form are refused by name."""

import numpy as np
import onnx
import pytest

import dnnc
from dnnc.errors import ExportError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph
from dnnc.ir.ops.packed import pack_conv_weights
from traced_models import attention, f32 as _f32, mlp

ort = pytest.importorskip("onnxruntime")


def split_heads_attention(x, wq, wk, wv):
    """Projections, heads split by reshape/transpose, and their outputs concatenated."""
    b, s, d = x.shape
    heads = 2

    def split(t):
        return t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)

    out = attention(split(x @ wq), split(x @ wk), split(x @ wv))
    return np.concatenate([out[:, h] for h in range(heads)], axis=-1)


MODELS = {
    "mlp": (mlp, lambda r: [_f32(r, 4, 20), _f32(r, 20, 32), _f32(r, 32), _f32(r, 32, 10),
                            _f32(r, 10)]),
    "attention": (attention, lambda r: [_f32(r, 2, 7, 16), _f32(r, 2, 9, 16),
                                        _f32(r, 2, 9, 16)]),
    "split_heads_attention": (split_heads_attention,
                              lambda r: [_f32(r, 2, 5, 8), _f32(r, 8, 8), _f32(r, 8, 8),
                                         _f32(r, 8, 8)]),
}


def _run_ort(path, args):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, args)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_trace_runs_in_onnxruntime(rng, name, tmp_path):
    fn, make = MODELS[name]
    graph = dnnc.trace(fn, *make(rng))
    path = tmp_path / f"{name}.onnx"
    model = dnnc.export_onnx(graph, path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    assert [i.name for i in model.graph.input] == [v.name for v in graph.inputs]
    for _ in range(2):
        args = make(rng)  # fresh inputs
        (got,) = _run_ort(path, args)
        want = fn(*args)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_export_keeps_dtypes_casts_and_integer_indices(rng, tmp_path):
    def fn(x, ids):
        picked = x[ids]                       # Gather by a traced int64 array
        return (picked * 2).astype(np.float64).sum(axis=1), np.argmax(x, axis=-1)

    x, ids = _f32(rng, 6, 4), rng.integers(0, 6, 5)
    path = tmp_path / "dtypes.onnx"
    dnnc.export_onnx(dnnc.trace(fn, x, ids), path)
    x, ids = _f32(rng, 6, 4), rng.integers(0, 6, 5)
    got = _run_ort(path, [x, ids])
    for g, w in zip(got, fn(x, ids)):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_import_export_round_trip(rng, tmp_path):
    from dnnc import zoo
    from dnnc.frontend.onnx import import_onnx

    source = zoo.mlp(batch=2, in_features=12, hidden=(16,), classes=5)
    graph = import_onnx(source)
    path = tmp_path / "round_trip.onnx"
    dnnc.export_onnx(graph, path)
    x = rng.standard_normal((2, 12), dtype=np.float32)
    want = _run_ort_model(source, x)
    (got,) = _run_ort(path, [x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _run_ort_model(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_internal_ops_are_refused_by_name(rng):
    g = Graph("packed")
    x = g.add_input("x", T.TensorType(T.float32, (1, 3, 8, 8)))
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    from dnnc.frontend.onnx import constant_value

    wp = constant_value("wp", pack_conv_weights(w, 8))
    y = g.add("ConvPacked", x, wp, name="conv0", oc=4)
    g.outputs.append(g.add("Relu", y, name="relu0"))
    with pytest.raises(ExportError, match=r"ConvPacked: nodes 'conv0'"):
        dnnc.export_onnx(g)
    assert isinstance(ExportError("x"), dnnc.errors.DNNCError)


def test_compiled_graph_with_packed_weights_is_refused(rng):
    w = rng.standard_normal((8, 16)).astype(np.float32)
    graph = dnnc.trace(lambda x: x @ w, np.ones((4, 8), np.float32))
    dnnc.export_onnx(graph)  # before passes: a MatMul
    compiled = dnnc.compile(graph, "llvm")
    assert "MatMulPacked" in [n.op for n in compiled.graph.nodes]
    with pytest.raises(ExportError, match="(?s)before compiling.*MatMulPacked: nodes"):
        dnnc.export_onnx(compiled.graph)


def test_dnnc_attributes_without_onnx_form_are_refused():
    g = Graph("softmax2d")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3, 4)))
    g.outputs.append(g.add("Softmax", x, name="sm", axis=1, coerce_2d=1))
    with pytest.raises(ExportError, match="coerce_2d"):
        dnnc.export_onnx(g)
    g = Graph("softmax")
    x = g.add_input("x", T.TensorType(T.float32, (2, 3, 4)))
    g.outputs.append(g.add("Softmax", x, name="sm", axis=1))   # coerce_2d=0 is ONNX's meaning
    node = dnnc.export_onnx(g).graph.node[0]
    assert [a.name for a in node.attribute] == ["axis"]
