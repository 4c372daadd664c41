"""Quantization ops against onnxruntime and hand-computed values."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.errors import ShapeError

ort = pytest.importorskip("onnxruntime")


def _model(op, inputs, initializers, out_type, attrs=None, opset=21):
    node = helper.make_node(op, [n for n, _ in inputs] + [t.name for t in initializers],
                            ["y"], **(attrs or {}))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs],
        [helper.make_tensor_value_info("y", out_type, None)], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run_both(model, feeds):
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    got = dnnc.compile(model, target="numpy").run(*feeds.values())
    return got, expected


@pytest.mark.parametrize("zp_dtype, scale_shape, axis", [
    (np.uint8, (), 1), (np.int8, (), 1), (np.uint8, (3,), 1), (np.int8, (4,), 2),
    (np.int16, (), 1)])
def test_quantize_dequantize_round_trip_matches_onnxruntime(rng, zp_dtype, scale_shape, axis):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32) * 4
    scale = (rng.random(scale_shape) * 0.05 + 0.01).astype(np.float32)
    info = np.iinfo(zp_dtype)
    zp = rng.integers(info.min // 4, info.max // 4, scale_shape).astype(zp_dtype)
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
    q_type = helper.np_dtype_to_tensor_dtype(np.dtype(zp_dtype))
    got, expected = _run_both(_model("QuantizeLinear", [("x", x)], inits, q_type,
                                     {"axis": axis}), {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[0].dtype == zp_dtype
    q = expected[0]
    got, expected = _run_both(_model("DequantizeLinear", [("x", q)], inits, TensorProto.FLOAT,
                                     {"axis": axis}), {"x": q})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)


def test_quantize_saturates_and_rounds_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, 1000.0, -1000.0], np.float32)
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    got = dnnc.compile(_model("QuantizeLinear", [("x", x)], inits, TensorProto.INT8),
                       target="numpy").run(x)[0]
    np.testing.assert_array_equal(got, np.array([0, 2, 2, 0, 127, -128], np.int8))


def test_dynamic_quantize_linear_matches_onnxruntime(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(n, t, None) for n, t in
         (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got, expected = _run_both(model, {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    np.testing.assert_array_equal(got[2], expected[2])


def test_qlinear_matmul_matches_onnxruntime(rng):
    a = rng.integers(0, 255, (2, 3, 4), dtype=np.uint8)
    b = rng.integers(0, 255, (4, 5), dtype=np.uint8)
    params = [("as", np.float32(0.02)), ("az", np.uint8(110)), ("bs", np.float32(0.03)),
              ("bz", np.uint8(120)), ("ys", np.float32(0.5)), ("yz", np.uint8(100))]
    inits = {n: numpy_helper.from_array(np.array(v), n) for n, v in params}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape),
                      helper.make_tensor_value_info("b", TensorProto.UINT8, b.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=list(inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got, expected = _run_both(model, {"a": a, "b": b})
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[0].dtype == np.uint8


def test_mismatched_per_axis_scale_is_a_shape_error():
    x = np.zeros((2, 3), np.float32)
    inits = [numpy_helper.from_array(np.ones(5, np.float32), "s"),
             numpy_helper.from_array(np.zeros(5, np.uint8), "z")]
    with pytest.raises(ShapeError, match="QuantizeLinear"):
        dnnc.compile(_model("QuantizeLinear", [("x", x)], inits, TensorProto.UINT8),
                     target="numpy")


def test_qlinear_conv_matches_onnxruntime(rng):
    x = rng.integers(0, 255, (1, 4, 7, 7), dtype=np.uint8)
    w = rng.integers(0, 255, (6, 4, 3, 3), dtype=np.uint8)
    bias = rng.integers(-500, 500, 6, dtype=np.int32)
    params = [("xs", np.float32(0.01)), ("xz", np.uint8(100)), ("w", w),
              ("ws", np.float32(0.005)), ("wz", np.uint8(128)), ("ys", np.float32(0.2)),
              ("yz", np.uint8(90)), ("b", bias)]
    inits = [numpy_helper.from_array(np.array(v), n) for n, v in params]
    node = helper.make_node("QLinearConv", ["x"] + [n for n, _ in params], ["y"],
                            pads=[1, 1, 1, 1], strides=[2, 2])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got, expected = _run_both(model, {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])


# -- compute rules ------------------------------------------------------------------------------
# Each rule, interpreted by NumPy over its loop IR, against the op's reference on fresh inputs;
# quantized outputs must match exactly (one rounding step off is a different integer).

from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.compute import apply_rule, evaluate, placeholder, run_rule  # noqa: E402
from dnnc.ir.graph import Value  # noqa: E402
from dnnc.ir.ops.registry import get_op, infer_node  # noqa: E402


def _check_rule(op, arrays, attrs=None, num_outputs=1, tol=0.0, dims=None):
    """Rule against reference; `dims` ({input: {axis: name}}) makes those input axes
    symbolic, their sizes bound only when the rule's tensors are evaluated."""
    attrs = dict(attrs or {})
    arrays = [None if a is None else np.asarray(a) for a in arrays]
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})
    if dims is None:
        got = run_rule(op, arrays, attrs, num_outputs=num_outputs)
    else:
        values = [None if a is None else Value(f"in{k}", T.TensorType(
            T.DType.from_numpy(a.dtype), tuple(dims.get(k, {}).get(ax, n)
                                               for ax, n in enumerate(a.shape))))
            for k, a in enumerate(arrays)]
        types, _, full = infer_node(op, values, attrs, num_outputs, op)
        tensors = [None if v is None else placeholder(v.name, v.type.dtype, v.type.shape)
                   for v in values]
        sizes = {name: arrays[k].shape[ax] for k, m in dims.items() for ax, name in m.items()}
        got = evaluate(apply_rule(op, tensors, full, types),
                       {f"in{k}": a for k, a in enumerate(arrays) if a is not None}, sizes)
    assert len(got) == num_outputs
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol)


def _ints(rng, dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1,
                        shape).astype(dtype)


def _scales(rng, shape):
    return rng.uniform(0.01, 0.1, shape).astype(np.float32)


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.uint16, np.int16, None])
def test_quantize_linear_rule_per_tensor(rng, zp_dtype):
    x = (rng.standard_normal((2, 3, 4)) * 4).astype(np.float32)
    x[0, 0, :2] = [0.025, -0.075]            # exact halves of the scale: ties to even
    arrays = [x, np.float32(0.05)]
    if zp_dtype is not None:
        arrays.append(_ints(rng, zp_dtype, (), -3 if zp_dtype in (np.int8, np.int16) else 0, 3))
    _check_rule("QuantizeLinear", arrays)


@pytest.mark.parametrize("axis, block_size", [(1, 0), (-1, 0), (2, 2), (0, 1)])
def test_quantize_dequantize_rules_per_axis_and_blocked(rng, axis, block_size):
    x = (rng.standard_normal((2, 3, 4)) * 3).astype(np.float32)
    n = x.shape[axis]
    shape = (n,) if not block_size else tuple(
        -(-d // block_size) if k == axis % 3 else d for k, d in enumerate(x.shape))
    scale, zp = _scales(rng, shape), _ints(rng, np.int8, shape, -5, 5)
    attrs = dict(axis=axis, block_size=block_size)
    _check_rule("QuantizeLinear", [x, scale, zp], attrs)
    _check_rule("DequantizeLinear", [_ints(rng, np.int8, x.shape), scale, zp], attrs, tol=1e-6)


def test_quantize_linear_rule_other_inputs(rng):
    x = rng.standard_normal((3, 5)).astype(np.float16)
    _check_rule("QuantizeLinear", [x, np.float16(0.02), np.int8(1)])
    _check_rule("QuantizeLinear", [x.astype(np.float32), np.float32(0.02)],
                dict(precision=T.float16))
    xi = rng.integers(-1000, 1000, (3, 4)).astype(np.int32)
    _check_rule("QuantizeLinear", [xi, np.float32(3.0), np.int16(1)])
    _check_rule("QuantizeLinear", [x.astype(np.float32), np.float32(0.02)], dims={0: {0: "N"}})


def test_dequantize_linear_rule_types(rng):
    _check_rule("DequantizeLinear", [_ints(rng, np.uint8, (2, 3)), np.float32(0.02),
                                     np.uint8(128)], tol=1e-6)
    _check_rule("DequantizeLinear", [_ints(rng, np.int32, (3, 4), -999, 999),
                                     np.float16(0.5)], tol=1e-3)
    _check_rule("DequantizeLinear", [_ints(rng, np.int8, (2, 3)), np.float32(0.02)],
                dict(output_dtype=T.float16), tol=1e-3)
    _check_rule("DequantizeLinear", [_ints(rng, np.int8, (2, 3)), np.float32(0.02)],
                tol=1e-6, dims={0: {0: "N"}})


@pytest.mark.parametrize("sign", [1, 0, -1])
def test_dynamic_quantize_linear_rule(rng, sign):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    x = np.abs(x) * sign if sign else x
    _check_rule("DynamicQuantizeLinear", [x], num_outputs=3)
    _check_rule("DynamicQuantizeLinear", [x], num_outputs=3, dims={0: {0: "N"}})
    _check_rule("DynamicQuantizeLinear", [np.zeros(4, np.float32)], num_outputs=3)


@pytest.mark.parametrize("sign", [1, 0, -1])
def test_dynamic_range_and_a_quantization_of_its_partials(rng, sign):
    """DynamicRange's rule (the whole range in every column, as its reference) and
    DynamicQuantizeLinear's of partials that split x into pieces (as a producer's blocks
    write them, some columns repeated) give the reference's quantization of x."""
    from dnnc.ir.ops.quant import RANGE_PIECES

    x = (rng.standard_normal((6, 7)) * 3).astype(np.float32)
    x = np.abs(x) * sign + sign if sign else x
    _check_rule("DynamicRange", [x])
    rows = np.arange(RANGE_PIECES) % 3   # column c: the range of x's rows 2 (c % 3), + 1
    pieces = x.reshape(3, -1)
    parts = np.stack([np.maximum(pieces.max(1), 0)[rows], np.minimum(pieces.min(1), 0)[rows]])
    _check_rule("DynamicQuantizeLinear", [x, parts.astype(np.float32)], num_outputs=3)
    _check_rule("DynamicQuantizeLinear", [x, parts.astype(np.float32)], num_outputs=3,
                dims={0: {0: "N"}})


@pytest.mark.parametrize("a_shape, b_shape, dtype, per_column, y_zp", [
    ((3, 4), (4, 5), np.uint8, False, True), ((2, 3, 4), (4, 5), np.int8, True, True),
    ((3, 4), (4, 5), np.uint8, False, False), ((4,), (4, 5), np.uint8, True, True)])
def test_qlinear_matmul_rule(rng, a_shape, b_shape, dtype, per_column, y_zp):
    n = b_shape[-1]
    arrays = [_ints(rng, dtype, a_shape), np.float32(0.05), _ints(rng, dtype, (), 0, 9),
              _ints(rng, dtype, b_shape), _scales(rng, (n,) if per_column else ()),
              _ints(rng, dtype, (n,) if per_column else (), 0, 9), np.float32(0.5)]
    if y_zp:
        arrays.append(_ints(rng, dtype, (), 0, 9))
    _check_rule("QLinearMatMul", arrays)


@pytest.mark.parametrize("attrs, per_channel, bias", [
    (dict(pads=[1, 1, 1, 1]), True, True), (dict(strides=[2, 2]), False, False),
    (dict(group=4, strides=[2, 2], pads=[0, 1, 1, 0]), True, True),
    (dict(auto_pad="SAME_UPPER", dilations=[2, 1]), False, True)])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_conv_rule(rng, attrs, per_channel, bias, dtype):
    cg = 1 if attrs.get("group") else 4
    m = 4
    arrays = [_ints(rng, dtype, (2, 4, 6, 6)), np.float32(0.05), _ints(rng, dtype, (), 0, 9),
              _ints(rng, dtype, (m, cg, 3, 3)), _scales(rng, (m,) if per_channel else ()),
              _ints(rng, dtype, (m,) if per_channel else (), 0, 9), np.float32(0.2),
              _ints(rng, dtype, (), 0, 9)]
    if bias:
        arrays.append(_ints(rng, np.int32, (m,), -500, 500))
    _check_rule("QLinearConv", arrays, attrs)
    _check_rule("QLinearConv", arrays, attrs, dims={0: {0: "N"}})


# -- 4-bit types: int4 / uint4 held as int8 / uint8 ----------------------------------------------

FOUR_BIT = {TensorProto.INT4: (-8, 7, np.int8), TensorProto.UINT4: (0, 15, np.uint8)}
LAYOUTS = {   # x [3, 8]: the parameters' shape and the node's attributes
    "tensor": ((), {}), "axis1": ((8,), {"axis": 1}), "axis0": ((3,), {"axis": 0}),
    "blocked": ((3, 3), {"axis": 1, "block_size": 3}),   # the last block of 2
    "blocked0": ((2, 8), {"axis": 0, "block_size": 2})}


def _four_bit_model(op, code, layout, scale, zp, through_int8=False):
    """Q (x float32 -> `code`) or DQ (`code` -> float32) of `scale` and `zp` in `layout`;
    `through_int8`: the 4-bit values cross the graph's boundary as int8 (a Cast), as
    onnxruntime's Python binding needs (it has no 4-bit arrays)."""
    shape, attrs = LAYOUTS[layout]
    inits = [numpy_helper.from_array(scale, "s"), helper.make_tensor("z", code, shape,
                                                                      zp.ravel().tolist())]
    four_bit = TensorProto.INT8 if through_int8 else code
    if op == "QuantizeLinear":
        nodes = [helper.make_node(op, ["x", "s", "z"], ["q" if through_int8 else "y"], **attrs)]
        nodes += [helper.make_node("Cast", ["q"], ["y"], to=TensorProto.INT8)][:through_int8]
        io = (TensorProto.FLOAT, four_bit)
    else:
        nodes = [helper.make_node("Cast", ["x"], ["q"], to=code)][:through_int8]
        nodes += [helper.make_node(op, ["q" if through_int8 else "x", "s", "z"], ["y"], **attrs)]
        io = (four_bit, TensorProto.FLOAT)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", io[0], (3, 8))],
                              [helper.make_tensor_value_info("y", io[1], (3, 8))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("code", list(FOUR_BIT), ids=["int4", "uint4"])
@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_four_bit_quantization_matches_the_reference_and_onnxruntime(rng, op, code, layout):
    from onnx.reference import ReferenceEvaluator

    lo, hi, held = FOUR_BIT[code]
    shape = LAYOUTS[layout][0]
    scale, zp = _scales(rng, shape), rng.integers(lo, hi + 1, shape)
    if op == "DequantizeLinear":
        x = rng.integers(lo, hi + 1, (3, 8)).astype(held)
        x.flat[:2] = lo, hi
    else:   # beyond the range both ways, and halves of the scale (ties to even) per tensor
        x = (rng.standard_normal((3, 8)) * 0.1 * (hi - lo)).astype(np.float32)
        if layout == "tensor":
            x[0, :4] = np.array([0.5, 1.5, -0.5, 2.5], np.float32) * scale
    direct = _four_bit_model(op, code, layout, scale, zp)
    wrapped = _four_bit_model(op, code, layout, scale, zp, through_int8=True)
    # the reference takes and gives 4-bit arrays (ml_dtypes), dnnc int8 / uint8 ones
    four_bit = helper.tensor_dtype_to_np_dtype(code)
    want = ReferenceEvaluator(direct).run(None, {"x": x.astype(four_bit) if op ==
                                                 "DequantizeLinear" else x})[0]
    want = want.astype(held) if op == "QuantizeLinear" else want
    ort_x = x.astype(np.int8) if op == "DequantizeLinear" else x
    by_ort = ort.InferenceSession(wrapped.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"x": ort_x})[0]
    np.testing.assert_array_equal(by_ort.astype(want.dtype), want)
    if op == "QuantizeLinear":   # (saturated both ways: the inputs reach the range's ends)
        assert {lo, hi} <= set(want.ravel().tolist())
    for target in ("numpy", "llvm"):
        for model, arg, expect in ((direct, x, want), (wrapped, ort_x, by_ort)):
            got = dnnc.compile(model, target=target).run(arg)[0]
            assert got.dtype == expect.dtype, (target, got.dtype)
            np.testing.assert_array_equal(got, expect)


def _probes(rng) -> np.ndarray:
    """float32 values where rounding then saturating goes wrong first: every tie k + 0.5 and
    integer k of [-700, 700] and both their float32 neighbours, where x + 1.5 * 2**23 stops
    rounding to integers (2**22, 2**23, 2**24), the largest and smallest floats, +-0,
    infinities, and random bit patterns (NaN left out: `rounded_saturated`'s own rule)."""
    f32 = np.float32
    k = np.arange(-700, 701, dtype=f32)
    near = np.concatenate([k, k + f32(0.5)])
    big = np.array([2**22, 2**22 + 1, 2**22 + 1.5, 2**23 - 0.5, 2**23, 2**23 + 1, 2**24, 2**24 + 2,
                    3e38, np.finfo(f32).max, np.finfo(f32).tiny, 1e-45, 0.0, np.inf], f32)
    x = np.concatenate([near, big, -big])
    with np.errstate(over="ignore"):   # (the largest float's neighbour is infinite)
        x = np.concatenate([x, np.nextafter(x, f32(np.inf)), np.nextafter(x, f32(-np.inf)),
                            rng.integers(0, 2**32, 200000, dtype=np.uint64).astype(
                                np.uint32).view(f32)])
    return x[~np.isnan(x)]


@pytest.mark.parametrize("dtype,zp,lo,hi", [
    (np.int8, 5, -128, 127), (np.int8, -77, -128, 127), (np.int8, -128, 0, 127),
    (np.int8, 100, -5, 9), (np.uint8, 200, 0, 255), (np.uint8, 0, 0, 255),
    (np.uint8, 255, 3, 250), (np.uint8, 3, 200, 40)])
def test_rounded_saturated_is_rint_plus_zero_point_saturated(rng, dtype, zp, lo, hi):
    """`quant.rounded_saturated` (the requantization of finish_expr and QuantizedAdd without
    a rounding or conversion instruction) is Cast(clip(rint(x) + zp, lo, hi)) bit for bit on
    every probe: ties to even with odd and negative zero points (a zero point folded into
    the rounding add would round ties by the sum's parity), values past the clamp and past
    2**22 (where the add no longer rounds to integers: the clamp saturates them), bounds narrowed as
    a Relu or Clip narrows them, crossed bounds (Clip's min above its max: the max wins)."""
    from dnnc.ir.loop import Cast
    from dnnc.ir.compute import compute
    from dnnc.ir.ops.quant import rounded_saturated

    x = _probes(rng)
    xs, zs = placeholder("x", T.float32, x.shape), placeholder("z", T.DType.from_numpy(
        np.dtype(dtype)), ())
    out = compute(x.shape, lambda i: rounded_saturated(xs[i], Cast(T.float32, zs[()]),
                                                       T.DType.from_numpy(np.dtype(dtype)), lo,
                                                       hi), "q", T.DType.from_numpy(
                                                           np.dtype(dtype)))
    (got,) = evaluate([out], {"x": x, "z": np.array(zp, dtype)})
    want = np.minimum(np.maximum(np.rint(x) + np.float32(zp), lo), hi).astype(dtype)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, first x = {x[bad[:5]]}: {got[bad[:5]]} " \
                          f"against {want[bad[:5]]}"
