"""The float com.microsoft ops of onnxruntime's transformer optimizer
(frontend/onnx_ops/microsoft.py) on small generated graphs against onnxruntime's contrib
kernels, fresh seeded inputs, within float32 rounding (its kernels sum in another order)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc

ort = pytest.importorskip("onnxruntime")
F32 = TensorProto.FLOAT
SHAPE = (2, 7, 48)


def _run(nodes, inits, outputs):
    graph = helper.make_graph(
        nodes, "ms", [helper.make_tensor_value_info("x", F32, SHAPE)],
        [helper.make_tensor_value_info(name, F32, None) for name in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    x = np.random.default_rng(len(nodes[0].op_type)).standard_normal(SHAPE).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})
    got = dnnc.compile(model, "llvm", cache=False)(x=x)
    return want, got if isinstance(got, (list, tuple)) else [got]


@pytest.mark.parametrize("bias", [False, True])
def test_skip_layer_normalization_equals_onnxruntime(bias):
    rng = np.random.default_rng(3)
    inits = {name: rng.standard_normal(SHAPE[-1:]).astype(np.float32)
             for name in ("gamma", "beta", "bias")}
    inits["skip"] = rng.standard_normal(SHAPE).astype(np.float32)
    inputs = ["x", "skip", "gamma", "beta"] + (["bias"] if bias else [])
    node = helper.make_node("SkipLayerNormalization", inputs, ["y", "", "", "sum"],
                            domain="com.microsoft", epsilon=1e-5)
    want, got = _run([node], inits, ["y", "sum"])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Gelu", "BiasGelu", "FastGelu"])
def test_gelus_equal_onnxruntime(op):
    inits = {"bias": np.random.default_rng(4).standard_normal(SHAPE[-1:]).astype(np.float32)}
    node = helper.make_node(op, ["x"] if op == "Gelu" else ["x", "bias"], ["y"],
                            domain="com.microsoft")
    want, got = _run([node], inits if op != "Gelu" else {}, ["y"])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
