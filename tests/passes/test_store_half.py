"""store_half: at precision fp16 / bf16, on a target asking for it (`half_storage`), a float32
model is stored in that type: weights converted once, activations half between kernels, Casts
at the graph's inputs and outputs (its signature unchanged), float32 kept where a value needs
it (FLOAT32_OPS, reductions of such values, ops refusing the half type); integer values and
values the model types half already untouched. Also: the reductions' lowering keeps its
accumulators in float32 for a half input, and every zoo model's half graph is within the
documented bound (`model_error_bound`) of its fp32 reference, computed by the NumPy
interpreter."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dnnc import zoo
from dnnc.backends.lower import lower_group
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.target import Target, model_error_bound
from dnnc.passes.manager import optimize, passes_at
from dnnc.passes.store_half import FLOAT32_OPS, store_half

F32, F16, BF16 = T.float32, T.float16, T.bfloat16
HALF = {"fp16": F16, "bf16": BF16}


def cuda_like(precision: str, half_storage: bool = True) -> Target:
    return Target("cuda", arch="sm_90", precision=precision, half_storage=half_storage)


def _const(name, array) -> Value:
    array = np.asarray(array)
    return Value(name, T.TensorType(T.DType.from_numpy(array.dtype), array.shape), const=array)


def dense_softmax() -> Graph:
    """x -> Gemm(w, b) -> Relu -> Softmax -> y, and an integer side output (Shape)."""
    g = Graph("dense")
    x = g.add_input("x", T.TensorType(F32, (4, 8)))
    w = _const("w", np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8))
    b = _const("b", np.full(6, 0.1, np.float32))
    h = g.add("Relu", g.add("Gemm", x, w, b, name="fc", transB=1), name="relu")
    g.outputs = [g.add("Softmax", h, name="softmax", axis=-1), g.add("Shape", h, name="shape")]
    return g


def test_a_dense_model_is_stored_half_with_casts_at_its_edges():
    g = store_half(dense_softmax(), cuda_like("fp16"))
    g.verify()
    assert str(g) == """\
graph dense(%x: float32[4,8]) {
  const %w: float16[6,8]
  const %b: float16[6]
  %x.float16.0: float16[4,8] = Cast(%x) {to=float16}
  %fc: float16[4,6] = Gemm(%x.float16.0, %w, %b) {alpha=1.0, beta=1.0, transA=0, transB=1}
  %relu: float16[4,6] = Relu(%fc)
  %softmax.1: float16[4,6] = Softmax(%relu) {axis=-1, coerce_2d=0}
  %shape: int64[2] = Shape(%relu) {end=None, start=0}
  %softmax: float32[4,6] = Cast(%softmax.1) {to=float32}
  return %softmax, %shape
}"""
    # the signature: the same input and output values, float32 and int64 as before
    before = dense_softmax()
    assert [(v.name, v.type) for v in g.inputs] == [(v.name, v.type) for v in before.inputs]
    assert [(v.name, v.type) for v in g.outputs] == [(v.name, v.type) for v in before.outputs]
    ops = [(n.op, n.outputs[0].dtype) for n in g.nodes]
    assert ops == [("Cast", F16), ("Gemm", F16), ("Relu", F16), ("Softmax", F16),
                   ("Shape", T.int64), ("Cast", F32)]
    w = next(v for v in g.constants() if v.name == "w")
    np.testing.assert_array_equal(w.const, np.linspace(-1, 1, 48).reshape(6, 8).astype(
        np.float16))   # converted once, rounded to nearest


@pytest.mark.parametrize("target", [cuda_like("fp32"), cuda_like("tf32"),
                                    cuda_like("fp16", half_storage=False),
                                    Target("llvm")])
def test_nothing_changes_without_half_storage(target):
    g = dense_softmax()
    text = str(g)
    assert store_half(g, target) is g and str(g) == text


def test_bf16_is_the_type_of_precision_bf16():
    g = store_half(dense_softmax(), cuda_like("bf16"))
    assert {v.dtype for v in g.constants()} == {BF16}
    assert [n.outputs[0].dtype for n in g.nodes if n.op == "Gemm"] == [BF16]


def test_squares_and_their_reductions_stay_float32():
    """A LayerNorm written out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div): the
    squares (Pow, in FLOAT32_OPS) and the ReduceMean of them run on float32 values, so the
    variance never passes through float16 (a square of 300 would be inf there); the rest is
    half, Casts between. The first mean reduces the graph's float32 input, read as given."""
    g = Graph("ln")
    x = g.add_input("x", T.TensorType(F32, (2, 16)))
    axes = _const("axes", np.array([-1], np.int64))
    mean = g.add("ReduceMean", x, axes, name="mean")
    d = g.add("Sub", x, mean, name="d")
    sq = g.add("Pow", d, _const("two", np.array(2.0, np.float32)), name="sq")
    var = g.add("ReduceMean", sq, axes, name="var")
    std = g.add("Sqrt", g.add("Add", var, _const("eps", np.array(1e-5, np.float32)),
                              name="veps"), name="std")
    g.outputs = [g.add("Div", d, std, name="y")]
    out = store_half(g, cuda_like("fp16"))
    out.verify()
    types = {n.name: (n.op, [v.dtype for v in n.inputs if v is not None and v.dtype.is_float],
                      n.outputs[0].dtype) for n in out.nodes}
    assert types["sq"] == ("Pow", [F32, F32], F32) and types["var"][2] is F32
    assert types["d"][2] is F16 and types["y"][2] is F16
    assert types["mean"][2] is F32   # (a reduction of the float32 input reads it as it is)
    assert "Pow" in FLOAT32_OPS
    x = np.random.default_rng(0).normal(0, 300, (2, 16)).astype(np.float32)
    (got,), (want,) = run_graph(out, [x]), run_graph(g, [x])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=16 * 2.0 ** -11 * np.abs(want).max())


def test_a_half_model_keeps_its_own_types():
    """A float16 ONNX model at precision bf16: its values stay float16 (they are the model's,
    not float32 ones to store); only its float32 values would change."""
    w = np.ones((8, 4), np.float16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 4])],
        [numpy_helper.from_array(w, "w")])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    text = str(g)
    assert str(store_half(g, cuda_like("bf16"))) == text


def test_the_pass_runs_in_the_pipeline_after_fuse_attention():
    names = passes_at(3)
    assert names.index("fuse_attention") < names.index("store_half") < names.index("fuse_ops")
    assert "store_half" not in passes_at(1)   # (a level of its own: storage, like layouts)


@pytest.mark.parametrize("op,attrs,extra", [
    ("ReduceSum", {"keepdims": 0}, ("axes",)), ("ReduceMean", {"keepdims": 0}, ("axes",)),
    ("ReduceSumSquare", {"keepdims": 0}, ("axes",)), ("Softmax", {"axis": -1}, ()),
    ("LogSoftmax", {"axis": -1}, ()), ("LayerNormalization", {"axis": -1}, ("s", "b"))])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_reductions_of_half_values_accumulate_in_float32(op, attrs, extra, dtype):
    """Every accumulator and row statistic the lowering allocates for a half input is
    float32: nothing is summed in 16 bits a step."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(dtype, (4, 64)))
    inputs = [x] + [Value(e, T.TensorType(T.int64, (1,)), const=np.array([1], np.int64))
                    if e == "axes" else Value(e, T.TensorType(dtype, (64,)),
                                              const=np.ones(64, dtype.np)) for e in extra]
    g.outputs = [g.add_node(op, inputs, attrs)[0]]
    func = lower_group(list(g.nodes), "k").func
    scratch = [n.buffer for n in L.walk(func.body) if isinstance(n, L.Allocate)]
    assert scratch and all(b.dtype is F32 for b in scratch), [(b.name, b.dtype)
                                                               for b in scratch]


# -- whole models: the documented bound, on the NumPy interpreter ------------------------------

SMALL = {"mlp": {}, "cnn": {}, "resnet18": {"size": 32}, "resnet50": {"size": 32},
         "mobilenet_v2": {"size": 32}, "bert_tiny": {"seq": 16, "vocab": 512},
         "bert_base": {"layers": 1, "seq": 16, "vocab": 512}}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", SMALL)
def test_zoo_models_stored_half_are_within_the_bound(name, precision):
    model = zoo.build(name, **SMALL[name])
    inputs = list(zoo.inputs_for(model, np.random.default_rng(7)).values())
    graph = import_onnx(model)
    fp32 = optimize(graph, cuda_like("fp32"), 3)
    reference = run_graph(fp32, inputs)
    half = optimize(graph, cuda_like(precision), 3, verify=True)
    floats = [v for n in half.nodes for v in n.outputs if v.dtype.is_float]
    stored = [v for v in floats if v.dtype is HALF[precision]]
    kept = [v for v in floats if v.dtype is F32 and v.producer.op not in ("Cast",) and
            v.producer.op not in FLOAT32_OPS and v.producer.op not in ("ReduceMean",
                                                                        "ReduceSum")]
    assert stored and not kept, [v.name for v in kept][:5]
    assert all(v.dtype is not F32 for v in half.constants() if v.dtype.is_float)
    for values in ("inputs", "outputs"):   # the signature, as the fp32 pipeline leaves it
        assert [(v.name, v.type) for v in getattr(half, values)] == \
            [(v.name, v.type) for v in getattr(fp32, values)]
    for got, want in zip(run_graph(half, inputs), reference):
        assert got.dtype == want.dtype == np.float32
        error = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
        assert error <= model_error_bound(precision), error


def test_a_resize_reads_its_scales_in_float32():
    """A Resize's scales are parameters (FLOAT32_INPUTS): in float16 a scale of 4/3 is
    1.333984, and the output would be 9 x 7, not 9 x 8. Its data is stored half."""
    scales = np.array([1, 1, 1.5, 4 / 3], np.float32)
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "s"], ["r"], mode="linear"),
         helper.make_node("Relu", ["r"], ["y"])], "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 9, 8])],
        [numpy_helper.from_array(scales, "s")])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.random.default_rng(5).standard_normal((1, 2, 6, 6)).astype(np.float32)
    (want,) = run_graph(g, [x])
    out = store_half(g, cuda_like("fp16"))
    out.verify()
    resize = next(n for n in out.nodes if n.op == "Resize")
    assert resize.inputs[0].dtype is F16 and resize.inputs[2].dtype is F32
    assert resize.outputs[0].type == T.TensorType(F16, (1, 2, 9, 8))
    (got,) = run_graph(out, [x])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * 2.0 ** -11 * np.abs(want).max())


def test_an_output_returned_twice_is_cast_once():
    g = Graph("twice")
    x = g.add_input("x", T.TensorType(F32, (3,)))
    y = g.add("Relu", x, name="y")
    g.outputs = [y, y]
    out = store_half(g, cuda_like("bf16"))
    out.verify()
    assert out.outputs[0] is out.outputs[1] is y and y.dtype is F32
    assert [n.op for n in out.nodes] == ["Cast", "Relu", "Cast"]


def test_a_value_made_float32_is_stored_half_and_read_back_in_float32():
    """ConstantOfShape makes float32 whatever it reads: its value is stored half for half
    readers (Add) and read in float32 by a float32 one (Exp, in FLOAT32_OPS), never a half
    value handed to a float32 node."""
    g = Graph("fill")
    x = g.add_input("x", T.TensorType(F32, (2, 3)))
    shape = g.add("Shape", x, name="shape")
    ones = g.add("ConstantOfShape", shape, name="ones",
                 value=np.array([1.5], np.float32))
    g.outputs = [g.add("Add", x, ones, name="sum"), g.add("Exp", ones, name="exp")]
    out = store_half(g, cuda_like("fp16"))
    out.verify()
    by_name = {n.name: n for n in out.nodes}
    assert by_name["sum"].inputs[1].dtype is F16 and by_name["exp"].inputs[0].dtype is F32
    assert by_name["exp"].inputs[0] is by_name["ones"].outputs[0]
    x_value = np.arange(6, dtype=np.float32).reshape(2, 3)
    for got, want in zip(run_graph(out, [x_value]), run_graph(g, [x_value])):
        np.testing.assert_allclose(got, want, rtol=2 * 2.0 ** -11)


def test_discontinuous_ops_read_their_float32_inputs_unrounded():
    """A comparison, a cast to an integer type and a QuantizeLinear read a graph input as
    given: rounded to fp16 first, 2.0004 would compare, truncate and quantize as 2.0 (the
    fuzzer's fp16 sweep on the H200 found such integer and quantized outputs a step off)."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (4,)))
    two = _const("two", np.full(4, 2.0, np.float32))
    gt = g.add("Greater", x, two)
    as_int = g.add("Cast", x, to=T.int32)
    q = g.add("QuantizeLinear", x, _const("s", np.array(1.0, np.float32)),
              Value("z", T.TensorType(T.int8, ()), const=np.array(0, np.int8)))
    y = g.add("Relu", x)
    g.outputs = [gt, as_int, q, y]
    out = store_half(g, cuda_like("fp16"))
    by_op = {n.op: n for n in out.nodes}
    for op in ("Greater", "QuantizeLinear"):
        assert by_op[op].inputs[0].type.dtype is T.float32, op
    casts = [n for n in out.nodes if n.op == "Cast" and n.attrs["to"] is T.int32]
    assert casts and casts[0].inputs[0].type.dtype is T.float32
    assert by_op["Relu"].inputs[0].type.dtype is T.float16     # (continuous: half as before)
    xs = np.array([2.0004, 1.9996, 3.9998, -0.5002], np.float32)
    want = run_graph(g, [xs])
    got = run_graph(out, [xs])
    for w, o in zip(want[:3], got[:3]):
        np.testing.assert_array_equal(o, w)


def test_elementwise_chains_into_a_discontinuous_op_run_in_float32():
    """Greater(Clip(x, max=0.5), x) and Cast(Squeeze(x), int32) (the fuzzer's fp16 sweep,
    seed 3141, cases 89 and 24, on the H200): the comparison saw x's float16 rounding beside x
    itself, the cast truncated the rounded value. The position-wise ops between a graph input
    and a discontinuous op run in float32, so both results equal the model's; a product's
    output feeding one stays rounded, and a continuous consumer stays half."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 6)))
    w = _const("w", np.eye(6, dtype=np.float32))
    clip = g.add("Clip", x, None, _const("hi", np.array(0.5, np.float32)))
    gt = g.add("Greater", clip, x)
    as_int = g.add("Cast", g.add("Squeeze", x, _const("ax", np.array([0]))), to=T.int32)
    m = g.add("MatMul", x, w)
    lt = g.add("Less", g.add("Relu", m), _const("one", np.array(1.0, np.float32)))
    g.outputs = [gt, as_int, lt, g.add("Tanh", x)]
    out = store_half(g, cuda_like("fp16"))
    by_op = {n.op: n for n in out.nodes}
    for op in ("Clip", "Squeeze", "Relu"):
        assert by_op[op].inputs[0].type.dtype is T.float32, op
    assert by_op["MatMul"].outputs[0].type.dtype is T.float16   # (rounded as it is stored)
    assert by_op["Tanh"].inputs[0].type.dtype is T.float16
    xs = np.array([[0.30001, 0.1, 2.0004, -3.0002, 0.49999, 7.0003]], np.float32)
    want, got = run_graph(g, [xs]), run_graph(out, [xs])
    for w_, o in zip(want[:2], got[:2]):
        np.testing.assert_array_equal(o, w_)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_mask_of_float32s_lowest_saturates_and_masks_as_in_float32(precision):
    """transformers' additive mask, `(1 - mask) * finfo(float32).min` added to the scores
    before a Softmax: the constant, past float16's range (and, rounded, bfloat16's), is
    stored as the type's lowest finite value, not -inf, so an unmasked position gets 0 (0 *
    -inf would be NaN) and a masked one a weight of 0, as in float32."""
    lowest = np.finfo(np.float32).min
    g = Graph("masked")
    scores = g.add_input("scores", T.TensorType(F32, (2, 8)))
    mask = g.add_input("mask", T.TensorType(F32, (2, 8)))
    one, low = _const("one", np.float32(1)), _const("lowest", np.float32(lowest))
    add = g.add("Mul", g.add("Sub", one, mask, name="sub"), low, name="mul")
    g.outputs = [g.add("Softmax", g.add("Add", scores, add, name="add"), name="softmax",
                       axis=-1)]
    half = store_half(g, cuda_like(precision))
    stored = next(v for v in half.constants() if v.name == "lowest")
    assert stored.dtype is HALF[precision]
    assert float(stored.const) == -float(np.finfo(HALF[precision].np).max) if precision == \
        "fp16" else np.isfinite(float(stored.const)) and float(stored.const) < -1e38
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    m = (rng.random((2, 8)) < 0.6).astype(np.float32)
    m[:, 0] = 1   # every row keeps a position
    want = run_graph(g, [x, m])[0]
    got = run_graph(half, [x, m])[0]
    assert np.isfinite(got).all()
    assert (got[m == 0] == 0).all()
    np.testing.assert_allclose(got, want, atol=model_error_bound(precision))


def test_half_constants_keep_infinities_and_nans_and_round_in_range_values():
    from dnnc.passes.store_half import half_constant

    values = np.array([np.inf, -np.inf, np.nan, 1e6, -1e6, 65519.0, 0.1, -3.0], np.float32)
    got = half_constant(values, F16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got[:2], [np.inf, -np.inf])
    assert np.isnan(got[2])
    np.testing.assert_array_equal(got[3:], np.array([65504, -65504, 65504, 0.1, -3.0],
                                                    np.float16))
