"""Image ops (Resize, GridSample, AffineGrid, RoiAlign): references against naive loops and
onnxruntime (every importer opset), inference with symbolic dims, and errors."""

import itertools
import math
from unittest import mock

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import dnnc
from dnnc.errors import DNNCError, ShapeError
from dnnc.frontend.onnx import ONNX_FROM_DTYPE
from dnnc.ir import compute as compute_ir
from dnnc.ir import types as T
from dnnc.ir.compute import NoCompute, apply_rule, placeholder, run_rule
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.loop import Load
from dnnc.ir.ops.registry import get_op, infer_node

RNG = np.random.default_rng(20240612)


def _elem(a):
    return ONNX_FROM_DTYPE[T.DType.from_numpy(a.dtype).name]


def _model(node, inputs, consts, opset, out_elem=None):
    """A one-node model: `inputs` become graph inputs, `consts` initializers (by name)."""
    vi = [helper.make_tensor_value_info(n, _elem(a), a.shape) for n, a in inputs.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    first = next(iter(inputs.values()))
    outs = [helper.make_tensor_value_info(o, out_elem or _elem(first), None) for o in node.output]
    graph = helper.make_graph([node], "g", vi, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    return model


def _check_against_ort(node, inputs, opset, consts=None, rtol=1e-5, atol=1e-5):
    model = _model(node, inputs, consts or {}, opset)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    want = sess.run(None, inputs)
    got = dnnc.compile(model, target="numpy").run(*inputs.values())
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=atol)
    return got


def _run(op, inputs, attrs=None, consts=()):
    """One op through the interpreter (which checks dtype and shape against infer)."""
    g = Graph("t")
    values, feed = [], []
    for i, x in enumerate(inputs):
        if x is None:
            values.append(None)
        elif i in consts:
            values.append(Value(f"c{i}", T.TensorType(T.DType.from_numpy(x.dtype), x.shape),
                                const=x))
        else:
            values.append(g.add_input(f"x{i}", T.TensorType(T.DType.from_numpy(x.dtype),
                                                            x.shape)))
            feed.append(x)
    g.outputs = g.add_node(op, values, attrs or {})
    return run_graph(g, feed)[0]


def _infer(op, types, attrs=None, consts=None):
    g = Graph("t")
    consts = consts or {}
    values = []
    for i, t in enumerate(types):
        if t is None:
            values.append(None)
        elif i in consts:
            values.append(Value(f"c{i}", t, const=consts[i]))
        else:
            values.append(g.add_input(f"x{i}", t))
    return g.add_node(op, values, attrs or {})[0].type


def _f32(*shape):
    return RNG.uniform(-2, 2, size=shape).astype(np.float32)


# -- Resize against a naive loop -----------------------------------------------------------------


def test_resize_bilinear_half_pixel_matches_naive_loop():
    x = _f32(2, 3, 5, 7)
    out_h, out_w = 8, 4
    got = _run("Resize", [x, None, None, np.array([2, 3, out_h, out_w], np.int64)],
               {"mode": "linear"}, consts=(3,))
    want = np.zeros((2, 3, out_h, out_w))
    for i, j in itertools.product(range(out_h), range(out_w)):
        sy = min(max((i + 0.5) * 5 / out_h - 0.5, 0), 4)
        sx = min(max((j + 0.5) * 7 / out_w - 0.5, 0), 6)
        y0, x0 = int(sy), int(sx)
        y1, x1 = min(y0 + 1, 4), min(x0 + 1, 6)
        fy, fx = sy - y0, sx - x0
        want[:, :, i, j] = ((1 - fy) * (1 - fx) * x[:, :, y0, x0] + (1 - fy) * fx * x[:, :, y0, x1]
                            + fy * (1 - fx) * x[:, :, y1, x0] + fy * fx * x[:, :, y1, x1])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_resize_nearest_asymmetric_floor_is_repeat():
    x = _f32(1, 2, 3, 4)
    got = _run("Resize", [x, None, np.array([1, 1, 2, 3], np.float32)],
               {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
               consts=(2,))
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(3, axis=3))


# -- Resize against onnxruntime ------------------------------------------------------------------

RESIZE_CASES = [
    # (attrs, scales, sizes)
    ({"mode": "nearest"}, [1, 1, 0.6, 1.7], None),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 2.5, 0.5], None),
    ({"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"},
     None, [2, 3, 9, 3]),
    ({"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode":
      "align_corners"}, None, [2, 3, 7, 4]),
    ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, None,
     [2, 3, 1, 4]),
    ({"mode": "linear"}, [1, 1, 0.6, 2.0], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 3, 9]),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None,
     [2, 3, 1, 8]),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
     [1, 1, 1.3, 0.7], None),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 0.5, 1.5], None),
    ({"mode": "cubic"}, [1, 1, 1.6, 0.8], None),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, None, [2, 3, 7, 3]),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 2], None),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.6, 0.4], None),
    ({"mode": "cubic", "antialias": 1}, None, [2, 3, 3, 2]),
    ({"mode": "linear", "axes": [3, 2]}, [1.5, 0.5], None),
    ({"mode": "nearest", "axes": [-1]}, None, [4]),
    ({"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, None, [4, 4]),
    ({"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}, None,
     [4, 4]),
]


@pytest.mark.parametrize("attrs,scales,sizes", RESIZE_CASES)
def test_resize_matches_onnxruntime(attrs, scales, sizes):
    x = _f32(2, 3, 5, 6)
    consts = {}
    if scales is not None:
        consts["scales"] = np.array(scales, np.float32)
    else:
        consts["sizes"] = np.array(sizes, np.int64)
    node = helper.make_node("Resize", ["x", "", "scales" if scales else "", "sizes" if sizes
                                       else ""], ["y"], **attrs)
    _check_against_ort(node, {"x": x}, 19, consts)


def test_resize_tf_crop_and_resize_extrapolates():
    x = _f32(1, 1, 6, 5)
    roi = np.array([0, 0, 0.3, -0.2, 1, 1, 1.2, 0.9], np.float32)
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear",
                            coordinate_transformation_mode="tf_crop_and_resize",
                            extrapolation_value=7.5)
    got = _check_against_ort(node, {"x": x}, 19, {"roi": roi,
                                                   "sizes": np.array([1, 1, 4, 6], np.int64)})
    assert (got[0] == 7.5).any()


def test_resize_align_corners_divides_by_unfloored_length():
    # as the ONNX node suite's test_resize_downsample_scales_linear_align_corners: a length of
    # 4 scaled by 0.6 is 2.4, so output 1 samples 1 * 3 / 1.4 (onnxruntime divides by 1 instead)
    x = np.array([[[[1, 2, 3, 4], [5, 6, 7, 8]]]], np.float32)
    got = _run("Resize", [x, None, np.array([1, 1, 0.6, 0.6], np.float32)],
               {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
               consts=(2,))
    np.testing.assert_allclose(got, [[[[1, 1 + 3 / 1.4]]]], rtol=1e-6)


def test_resize_uint8_rounds_and_saturates():
    x = RNG.integers(0, 256, size=(1, 1, 4, 5)).astype(np.uint8)
    got = _run("Resize", [x, None, np.array([1, 1, 1.5, 1.7], np.float32)], {"mode": "cubic"},
               consts=(2,))
    want = _run("Resize", [x.astype(np.float32), None, np.array([1, 1, 1.5, 1.7], np.float32)],
                {"mode": "cubic"}, consts=(2,))
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, np.clip(np.round(want), 0, 255).astype(np.uint8))


def test_resize_float16_keeps_dtype():
    x = _f32(1, 2, 3, 3).astype(np.float16)
    got = _run("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": "linear"},
               consts=(2,))
    assert got.dtype == np.float16 and got.shape == (1, 2, 6, 6)


@pytest.mark.parametrize("op,opset,mode,scales", [
    ("Resize", 10, "nearest", [1, 1, 0.6, 1.7]),   # shrinking rounds up, enlarging down
    ("Resize", 10, "nearest", [1, 1, 0.5, 0.7]),
    ("Resize", 10, "linear", [1, 1, 0.6, 2.0]),
    ("Upsample", 9, "nearest", [1, 1, 2, 3]),
    ("Upsample", 9, "linear", [1, 1, 1.5, 2.5]),
])
def test_old_resize_and_upsample_match_onnxruntime(op, opset, mode, scales):
    x = _f32(2, 3, 5, 6)
    node = helper.make_node(op, ["x", "scales"], ["y"], mode=mode)
    _check_against_ort(node, {"x": x}, opset, {"scales": np.array(scales, np.float32)})


def test_upsample_7_scales_attribute():
    x = _f32(1, 2, 3, 4)
    node = helper.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 3.0])
    _check_against_ort(node, {"x": x}, 8)


@pytest.mark.parametrize("opset", [11, 13])
def test_resize_11_empty_roi_and_scales(opset):
    x = _f32(2, 3, 5, 6)
    consts = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
              "sizes": np.array([2, 3, 8, 4], np.int64)}
    node = helper.make_node("Resize", ["x", "roi", "scales", "sizes"], ["y"], mode="cubic",
                            coordinate_transformation_mode="pytorch_half_pixel")
    _check_against_ort(node, {"x": x}, opset, consts)


# -- Resize inference ----------------------------------------------------------------------------


def test_resize_infers_floor_of_scaled_size_and_keeps_symbolic_batch():
    scales = np.array([1, 1, 0.6, 2.5], np.float32)
    t = _infer("Resize", [T.TensorType(T.float32, ("N", 3, 5, 7)), None,
                          T.TensorType(T.float32, (4,))], consts={2: scales})
    assert t == T.TensorType(T.float32, ("N", 3, 3, 17))


def test_resize_sizes_pass_symbolic_dims_and_unknown_scales_give_fresh_dims():
    sizes = np.array([2, 3, 8, 9], np.int64)
    t = _infer("Resize", [T.TensorType(T.float32, ("N", 3, "H", "W")), None, None,
                          T.TensorType(T.int64, (4,))], consts={3: sizes})
    assert t.shape == (2, 3, 8, 9)
    t = _infer("Resize", [T.TensorType(T.float32, ("N", 3, "H", "W")), None,
                          T.TensorType(T.float32, (4,))])
    assert t.rank == 4 and all(isinstance(d, str) for d in t.shape)
    assert len(set(t.shape[2:])) == 2 and not {"H", "W"} & set(t.shape)
    t = _infer("Resize", [T.TensorType(T.float32, ("N", 3, 4, 4)), None, None,
                          T.TensorType(T.int64, (2,))],
               {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
               consts={3: np.array([6, 9], np.int64)})
    assert t.shape == ("N", 3, 6, 6)


@pytest.mark.parametrize("inputs,attrs,match", [
    ((True, True), {}, "exactly one of scales and sizes"),
    ((False, False), {}, "exactly one of scales and sizes"),
    ((True, False), {"mode": "area"}, "mode"),
    ((True, False), {"antialias": 1}, "antialias"),
    ((True, False), {"coordinate_transformation_mode": "tf_crop_and_resize"}, "roi"),
    ((True, False), {"axes": [1, 1, 2, 3]}, "repeat"),
])
def test_resize_errors(inputs, attrs, match):
    scales = T.TensorType(T.float32, (4,)) if inputs[0] else None
    sizes = T.TensorType(T.int64, (4,)) if inputs[1] else None
    with pytest.raises(ShapeError, match=match):
        _infer("Resize", [T.TensorType(T.float32, (1, 1, 4, 4)), None, scales, sizes], attrs)


def test_resize_tf_half_pixel_for_nn_is_a_clear_import_error():
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"],
                            coordinate_transformation_mode="tf_half_pixel_for_nn")
    model = _model(node, {"x": _f32(1, 1, 2, 2)}, {"roi": np.zeros(0, np.float32),
                                                    "scales": np.ones(4, np.float32)}, 11)
    with pytest.raises(DNNCError, match="tf_half_pixel_for_nn"):
        dnnc.compile(model, target="numpy")


# -- GridSample ----------------------------------------------------------------------------------


def test_grid_sample_bilinear_matches_naive_loop():
    x = _f32(1, 2, 4, 5)
    grid = RNG.uniform(-1.2, 1.2, size=(1, 3, 2, 2)).astype(np.float32)
    got = _run("GridSample", [x, grid], {"mode": "linear", "padding_mode": "zeros"})
    want = np.zeros((1, 2, 3, 2))
    for i, j in itertools.product(range(3), range(2)):
        gx, gy = grid[0, i, j]
        px, py = ((gx + 1) * 5 - 1) / 2, ((gy + 1) * 4 - 1) / 2
        x0, y0 = math.floor(px), math.floor(py)
        for yy, xx in itertools.product((y0, y0 + 1), (x0, x0 + 1)):
            if 0 <= yy < 4 and 0 <= xx < 5:
                want[0, :, i, j] += (1 - abs(px - xx)) * (1 - abs(py - yy)) * x[0, :, yy, xx]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,padding,align", itertools.product(
    ("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection"), (0, 1)))
def test_grid_sample_16_matches_onnxruntime(mode, padding, align):
    x = _f32(2, 3, 5, 6)
    grid = RNG.uniform(-1.7, 1.7, size=(2, 4, 3, 2)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding,
                            align_corners=align)
    _check_against_ort(node, {"x": x, "grid": grid}, 16, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,padding", itertools.product(
    ("linear", "nearest"), ("zeros", "border", "reflection")))
def test_grid_sample_3d_matches_onnxruntime(mode, padding):
    x = _f32(1, 2, 3, 4, 5)
    grid = RNG.uniform(-1.5, 1.5, size=(1, 2, 3, 2, 3)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding)
    _check_against_ort(node, {"x": x, "grid": grid}, 20, rtol=1e-4, atol=1e-4)


def test_grid_sample_inference_and_errors():
    t = _infer("GridSample", [T.TensorType(T.float32, ("N", 3, "H", "W")),
                              T.TensorType(T.float32, ("N", 7, 9, 2))])
    assert t == T.TensorType(T.float32, ("N", 3, 7, 9))
    with pytest.raises(ShapeError, match="grid"):
        _infer("GridSample", [T.TensorType(T.float32, (1, 3, 4, 4)),
                              T.TensorType(T.float32, (1, 7, 9, 3))])
    with pytest.raises(ShapeError, match="padding_mode"):
        _infer("GridSample", [T.TensorType(T.float32, (1, 3, 4, 4)),
                              T.TensorType(T.float32, (1, 7, 9, 2))], {"padding_mode": "wrap"})


# -- AffineGrid ----------------------------------------------------------------------------------


@pytest.mark.parametrize("size,align", itertools.product(([2, 3, 4, 5], [2, 1, 3, 4, 2]),
                                                         (0, 1)))
def test_affine_grid_matches_onnxruntime(size, align):
    r = len(size) - 2
    theta = _f32(2, r, r + 1)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    _check_against_ort(node, {"theta": theta}, 20, {"size": np.array(size, np.int64)})


def test_affine_grid_inference():
    size = np.array([3, 1, 6, 7], np.int64)
    t = _infer("AffineGrid", [T.TensorType(T.float64, ("N", 2, 3)), T.TensorType(T.int64, (4,))],
               consts={1: size})
    assert t == T.TensorType(T.float64, ("N", 6, 7, 2))
    t = _infer("AffineGrid", [T.TensorType(T.float32, (2, 3, 4)), T.TensorType(T.int64, (5,))])
    assert t.rank == 5 and t.shape[0] == 2 and t.shape[-1] == 3
    with pytest.raises(ShapeError, match="theta"):
        _infer("AffineGrid", [T.TensorType(T.float32, (2, 2, 4)), T.TensorType(T.int64, (4,))])


# -- RoiAlign ------------------------------------------------------------------------------------


def _rois():
    corners = RNG.uniform(0, 9, size=(5, 2, 2))
    lo, hi = corners.min(axis=1), corners.max(axis=1) + 0.5
    return np.concatenate([lo, hi], axis=1).astype(np.float32)


@pytest.mark.parametrize("opset,attrs", [
    (10, {}),
    (10, {"mode": "max", "sampling_ratio": 2}),
    (16, {"output_height": 3, "output_width": 2, "spatial_scale": 0.5}),
    (16, {"coordinate_transformation_mode": "output_half_pixel", "sampling_ratio": 3}),
    (16, {"mode": "max", "output_height": 2, "output_width": 4}),
])
def test_roi_align_matches_onnxruntime(opset, attrs):
    x = _f32(2, 3, 10, 9)
    batch = np.array([0, 1, 1, 0, 1], np.int64)
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], **attrs)
    _check_against_ort(node, {"x": x, "rois": _rois(), "batch": batch}, opset, rtol=1e-4,
                       atol=1e-5)


def test_roi_align_inference_and_errors():
    t = _infer("RoiAlign", [T.TensorType(T.float32, ("N", 8, "H", "W")),
                            T.TensorType(T.float32, ("R", 4)), T.TensorType(T.int64, ("R",))],
               {"output_height": 7, "output_width": 5})
    assert t == T.TensorType(T.float32, ("R", 8, 7, 5))
    with pytest.raises(ShapeError, match="mode"):
        _infer("RoiAlign", [T.TensorType(T.float32, (1, 8, 4, 4)),
                            T.TensorType(T.float32, (2, 4)), T.TensorType(T.int64, (2,))],
               {"mode": "sum"})


# -- compute rules (loop IR interpreted by NumPy) against the references ----------------------


def _rule_arrays(op, arrays, attrs, const_inputs=(), symbolic=(), check_loads=False):
    """The op's compute rule on `arrays`; `symbolic` lists (input, axis) dims typed "N".
    `check_loads`: assert every load stays inside its buffer (the interpreter would clamp it
    silently; a backend would read out of bounds), taken branch or not."""
    values = []
    for k, a in enumerate(arrays):
        if a is None:
            values.append(None)
            continue
        shape = tuple("N" if (k, ax) in symbolic else d for ax, d in enumerate(a.shape))
        values.append(Value(f"in{k}", T.TensorType(T.DType.from_numpy(a.dtype), shape),
                            const=a if k in const_inputs else None))
    types, _, full = infer_node(op, values, dict(attrs), 1, op)
    if (0, 0) in symbolic:  # a symbolic batch stays symbolic in the output
        assert "N" in types[0].shape, types[0]
    tensors = [None if v is None else placeholder(v.name, v.type.dtype, v.type.shape,
                                                   value=v.const) for v in values]
    outs = apply_rule(op, tensors, full, types)
    feeds = {f"in{k}": a for k, a in enumerate(arrays) if a is not None}
    original = compute_ir._Evaluator.eval

    def checked(self, e, env):
        if isinstance(e, Load) and e.buffer.name in self.arrays:
            for axis, (i, n) in enumerate(zip(e.indices, self.arrays[e.buffer.name].shape)):
                v = original(self, i, env)
                assert np.all((v >= 0) & (v < n)), f"{e.buffer.name} read out of axis {axis}"
        return original(self, e, env)

    with mock.patch.object(compute_ir._Evaluator, "eval", checked if check_loads else original):
        sizes = {"N": arrays[k].shape[ax] for k, ax in symbolic}
        return compute_ir.evaluate(outs, feeds, sizes=sizes)


def _check_rule(op, arrays, attrs, const_inputs=(), symbolic=(), tol=1e-5, check_loads=False):
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})
    got = _rule_arrays(op, arrays, attrs, const_inputs, symbolic, check_loads)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                       atol=tol)
        else:
            np.testing.assert_array_equal(g, w)


def _resize_inputs(x, scales=None, sizes=None, roi=None):
    return [x, None if roi is None else np.array(roi, np.float32),
            None if scales is None else np.array(scales, np.float32),
            None if sizes is None else np.array(sizes, np.int64)]


@pytest.mark.parametrize("attrs,scales,sizes", RESIZE_CASES)
def test_resize_rule(rng, attrs, scales, sizes):
    x = rng.uniform(-2, 2, (2, 3, 5, 6)).astype(np.float32)
    _check_rule("Resize", _resize_inputs(x, scales, sizes), attrs, (1, 2, 3), check_loads=True)


@pytest.mark.parametrize("ctm,nearest", itertools.product(
    ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"),
    ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")))
def test_resize_rule_nearest_picks_the_references_pixels(rng, ctm, nearest):
    # scales such as 0.6 and 1/3 put coordinates within float32 rounding of integers
    x = rng.uniform(-2, 2, (1, 2, 5, 9)).astype(np.float32)
    attrs = {"coordinate_transformation_mode": ctm, "nearest_mode": nearest}
    _check_rule("Resize", _resize_inputs(x, [1, 1, 0.6, 1 / 3]), attrs, (1, 2, 3))
    _check_rule("Resize", _resize_inputs(x, [1, 1, 3, 2.5]), attrs, (1, 2, 3))
    _check_rule("Resize", _resize_inputs(x, sizes=[1, 2, 7, 1]), attrs, (1, 2, 3))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_rule_tf_crop_and_resize(rng, mode):
    x = rng.uniform(-2, 2, (1, 2, 6, 5)).astype(np.float32)
    roi = [0, 0, 0.3, -0.2, 1, 1, 1.2, 0.9]
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": 7.5}
    _check_rule("Resize", _resize_inputs(x, sizes=[1, 2, 4, 7], roi=roi), attrs, (1, 2, 3),
                check_loads=True)
    roi = [0.2, 0.6, 0.9, 0.8]
    _check_rule("Resize", _resize_inputs(x, [0.5, 1.5], roi=roi), {**attrs, "axes": [2, 3]},
                (1, 2, 3))


@pytest.mark.parametrize("dtype,mode", [(np.float16, "linear"), (np.float16, "cubic"),
                                        (np.float64, "cubic"), (np.uint8, "cubic"),
                                        (np.uint8, "linear"), (np.int32, "linear"),
                                        (np.int8, "nearest")])
def test_resize_rule_dtypes(rng, dtype, mode):
    if np.dtype(dtype).kind == "f":
        x = rng.uniform(-2, 2, (2, 3, 4, 5)).astype(dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -1000), min(info.max, 1000), (2, 3, 4, 5),
                         endpoint=True).astype(dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    _check_rule("Resize", _resize_inputs(x, [1, 1, 1.5, 0.7]), {"mode": mode}, (1, 2, 3),
                tol=tol)
    _check_rule("Resize", _resize_inputs(x, sizes=[2, 3, 9, 2]),
                {"mode": mode, "exclude_outside": int(mode == "cubic")}, (1, 2, 3), tol=tol)


def test_resize_rule_symbolic_batch(rng):
    x = rng.uniform(-2, 2, (3, 2, 4, 5)).astype(np.float32)
    _check_rule("Resize", _resize_inputs(x, [1, 1, 2, 0.6]), {"mode": "linear"}, (1, 2, 3),
                symbolic=((0, 0),))
    _check_rule("Resize", _resize_inputs(x, [2, 0.6]), {"axes": [2, 3]}, (1, 2, 3),
                symbolic=((0, 0),))


def test_resize_rule_needs_constant_scales_sizes_and_static_resized_axes(rng):
    x = rng.uniform(-2, 2, (1, 2, 4, 5)).astype(np.float32)
    with pytest.raises(NoCompute, match="scales"):
        run_rule("Resize", _resize_inputs(x, [1, 1, 2, 2]), {})
    with pytest.raises(NoCompute, match="sizes"):
        run_rule("Resize", _resize_inputs(x, sizes=[1, 2, 8, 8]), {})
    with pytest.raises(NoCompute, match="roi"):
        run_rule("Resize", _resize_inputs(x, sizes=[1, 2, 8, 8], roi=[0] * 4 + [1] * 4),
                 {"coordinate_transformation_mode": "tf_crop_and_resize"}, const_inputs=(3,))
    with pytest.raises(NoCompute, match="symbolic"):
        _rule_arrays("Resize", _resize_inputs(x, sizes=[1, 2, 8, 8]), {}, (1, 2, 3),
                     symbolic=((0, 2),))


GRID_CASES = list(itertools.product(("linear", "nearest", "cubic"),
                                    ("zeros", "border", "reflection"), (0, 1)))


@pytest.mark.parametrize("mode,padding,align", GRID_CASES)
def test_grid_sample_rule(rng, mode, padding, align):
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    x = rng.uniform(-2, 2, (2, 3, 5, 6)).astype(np.float32)
    grid = rng.uniform(-1.7, 1.7, (2, 4, 3, 2)).astype(np.float32)
    _check_rule("GridSample", [x, grid], attrs, tol=1e-4)
    if mode != "cubic":  # 3-D, and one spatial dim of length 1 (reflection's span is 0)
        x = rng.uniform(-2, 2, (1, 2, 3, 1, 5)).astype(np.float32)
        grid = rng.uniform(-1.5, 1.5, (1, 2, 3, 2, 3)).astype(np.float32)
        _check_rule("GridSample", [x, grid], attrs, tol=1e-4)


@pytest.mark.parametrize("dtype,grid_dtype", [(np.float16, np.float16), (np.float64, np.float64),
                                              (np.uint8, np.float32), (np.int32, np.float32)])
def test_grid_sample_rule_dtypes(rng, dtype, grid_dtype):
    x = rng.uniform(-2, 2, (2, 3, 4, 5)) if np.dtype(dtype).kind == "f" else \
        rng.integers(0, 200, (2, 3, 4, 5))
    grid = rng.uniform(-1.2, 1.2, (2, 3, 3, 2)).astype(grid_dtype)
    for mode in ("linear", "cubic", "nearest"):
        _check_rule("GridSample", [x.astype(dtype), grid], {"mode": mode, "padding_mode": "border"},
                    tol=3e-3 if dtype == np.float16 else 1e-4)


def test_grid_sample_rule_symbolic_batch_and_wild_grids_stay_in_bounds(rng):
    x = rng.uniform(-2, 2, (3, 2, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (3, 3, 2, 2)).astype(np.float32)
    _check_rule("GridSample", [x, grid], {}, symbolic=((0, 0), (1, 0)), tol=1e-4)
    grid.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 1e30, -1e30, 3e9]
    for mode, padding in itertools.product(("linear", "nearest", "cubic"),
                                           ("zeros", "border", "reflection")):
        with np.errstate(invalid="ignore"):
            out = _rule_arrays("GridSample", [x, grid], {"mode": mode, "padding_mode": padding},
                               check_loads=True)
        assert out[0].shape == (3, 2, 3, 2)


@pytest.mark.parametrize("size,align,dtype", itertools.product(
    ([2, 3, 4, 5], [2, 1, 3, 4, 2], [2, 3, 1, 1]), (0, 1), (np.float32, np.float64)))
def test_affine_grid_rule(rng, size, align, dtype):
    r = len(size) - 2
    theta = rng.uniform(-2, 2, (2, r, r + 1)).astype(dtype)
    _check_rule("AffineGrid", [theta, np.array(size, np.int64)], {"align_corners": align},
                (1,), symbolic=((0, 0),))


def test_affine_grid_and_roi_align_without_loops(rng):
    theta = rng.uniform(-2, 2, (2, 2, 3)).astype(np.float32)
    with pytest.raises(NoCompute, match="size"):
        run_rule("AffineGrid", [theta, np.array([2, 3, 4, 5], np.int64)], {})
    with pytest.raises(NoCompute, match="RoiAlign"):
        run_rule("RoiAlign", [_f32(2, 3, 10, 9), _rois(), np.array([0, 1, 1, 0, 1], np.int64)],
                 {})
