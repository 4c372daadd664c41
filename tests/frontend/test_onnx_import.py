"""The ONNX frontend: loading, error reporting, symbolic dims and call-time checks."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc.errors import InputError, ModelFormatError, UnsupportedOpError
from dnnc.frontend.onnx import import_onnx


def _model(nodes, inputs, outputs, initializers=(), opset=20):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _add_relu(shape=("N", 3)):
    return _model([helper.make_node("Add", ["x", "y"], ["s"], name="add"),
                   helper.make_node("Relu", ["s"], ["r"], name="relu")],
                  [_vi("x", shape), _vi("y", [3])], [_vi("r", None)])


def test_every_unsupported_op_reported_at_once():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("FancyOpOne", ["a"], ["b"], name="one"),
             helper.make_node("FancyOpTwo", ["b"], ["c"], name="two"),
             helper.make_node("FancyOpOne", ["c"], ["d"], name="one_again"),
             helper.make_node("Custom", ["d"], ["e"], name="custom", domain="com.example")]
    model = _model(nodes, [_vi("x", [2])], [_vi("e", None)])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(model)
    found = {op: (dom, opset, names) for op, dom, opset, names in info.value.ops}
    assert set(found) == {"FancyOpOne", "FancyOpTwo", "Custom"}
    assert found["FancyOpOne"] == ("", 20, ["one", "one_again"])
    assert found["Custom"][0] == "com.example"
    message = str(info.value)
    for name in ("FancyOpOne", "FancyOpTwo", "com.example::Custom", "'one_again'", "opset 20"):
        assert name in message


def test_truncated_file_is_a_model_format_error(tmp_path):
    data = _add_relu().SerializeToString()
    path = tmp_path / "cut.onnx"
    for cut in (len(data) // 3, len(data) // 2, len(data) - 5):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelFormatError):
            import_onnx(str(path))


def test_garbage_and_missing_files():
    with pytest.raises(ModelFormatError):
        import_onnx(b"\x08\x07 this is not a model \xff\xff")
    with pytest.raises(ModelFormatError, match="does not exist"):
        import_onnx("/nonexistent/model.onnx")


def test_reading_an_undefined_value_names_the_node():
    model = _model([helper.make_node("Relu", ["nope"], ["r"], name="r1")],
                   [_vi("x", [2])], [_vi("r", None)])
    with pytest.raises(ModelFormatError, match="'r1' reads 'nope'"):
        import_onnx(model)


def test_symbolic_dims_kept_and_fixable(tmp_path):
    graph = import_onnx(_add_relu())
    assert graph.outputs[0].type.shape == ("N", 3)
    fixed = import_onnx(_add_relu(), input_shapes={"x": (7, 3)})
    assert fixed.outputs[0].type.shape == (7, 3)
    path = tmp_path / "m.onnx"
    onnx.save(_add_relu(), str(path))
    assert import_onnx(path).outputs[0].type.shape == ("N", 3)


def test_initializers_listed_as_inputs_are_constants():
    y = helper.make_tensor("y", TensorProto.FLOAT, [3], [1.0, -2.0, 3.0])
    model = _model([helper.make_node("Add", ["x", "y"], ["r"])],
                   [_vi("x", [2, 3]), _vi("y", [3])], [_vi("r", None)], [y])
    graph = import_onnx(model)
    assert [v.name for v in graph.inputs] == ["x"]
    out = dnnc.compile(model, target="numpy")(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(out, np.ones((2, 3)) + [1, -2, 3])


def test_dynamic_batch_runs_for_any_value_and_checks_inputs(rng):
    model = dnnc.compile(_add_relu(), target="numpy")
    y = rng.standard_normal(3).astype(np.float32)
    for n in (1, 5, 9):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_allclose(model(x, y), np.maximum(x + y, 0))
    np.testing.assert_allclose(model(x=x, y=y), np.maximum(x + y, 0))
    with pytest.raises(InputError, match=r"input 'x': expected float32\[N,3\], given float64"):
        model(x.astype(np.float64), y)
    with pytest.raises(InputError, match=r"input 'y': expected float32\[3\].*\[4\]"):
        model(x, np.ones(4, np.float32))
    with pytest.raises(InputError, match="missing input"):
        model(x)
    with pytest.raises(InputError, match="takes 2 input"):
        model(x, y, y)
    with pytest.raises(InputError, match="no input 'z'"):
        model(x, y=y, z=y)


def test_symbolic_dim_bound_consistently_across_inputs():
    model = _model([helper.make_node("Add", ["a", "b"], ["r"])],
                   [_vi("a", ["N", 2]), _vi("b", ["N", 2])], [_vi("r", None)])
    compiled = dnnc.compile(model, target="numpy")
    with pytest.raises(InputError, match="symbolic dim 'N' is 3 elsewhere"):
        compiled(np.ones((3, 2), np.float32), np.ones((4, 2), np.float32))


def test_old_opset_clip_attributes_become_inputs(rng):
    model = _model([helper.make_node("Clip", ["x"], ["r"], min=-0.5, max=0.25)],
                   [_vi("x", [4])], [_vi("r", None)], opset=6)
    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(dnnc.compile(model, target="numpy")(x),
                                  np.clip(x, -0.5, 0.25))


def test_external_data_and_bytes(rng, tmp_path):
    w = rng.standard_normal((64, 64)).astype(np.float32)
    init = onnx.numpy_helper.from_array(w, "w")
    model = _model([helper.make_node("Add", ["x", "w"], ["r"])],
                   [_vi("x", [64, 64])], [_vi("r", None)], [init])
    inline_bytes = model.SerializeToString()
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    x = rng.standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_array_equal(dnnc.compile(str(path), target="numpy")(x), x + w)
    np.testing.assert_array_equal(dnnc.compile(inline_bytes, target="numpy")(x),
                                  x + w)
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(ModelFormatError):
        import_onnx(str(path))


# -- 4-bit types (int4 / uint4): held as int8 / uint8 -----------------------------------------


@pytest.mark.parametrize("code,held,lo,hi", [(TensorProto.INT4, np.int8, -8, 7),
                                             (TensorProto.UINT4, np.uint8, 0, 15)])
def test_four_bit_tensors_unpack_and_keep_their_range_through_moves(rng, code, held, lo, hi):
    from onnx.reference import ReferenceEvaluator

    # an odd count: the last byte's high nibble is padding; the zero point reaches the
    # QuantizeLinear through a Constant, Reshape and Identity, and still saturates to 4 bits
    values = rng.integers(lo, hi + 1, 7)
    values[:2] = lo, hi
    init = helper.make_tensor("w", code, [7], values.tolist())
    zero = helper.make_tensor("z0", code, [1], [int(rng.integers(lo, hi + 1))])
    nodes = [helper.make_node("Constant", [], ["zc"], value=zero),
             helper.make_node("Constant", [], ["shape"], value=helper.make_tensor(
                 "shape", TensorProto.INT64, [0], [])),
             helper.make_node("Reshape", ["zc", "shape"], ["zr"]),
             helper.make_node("Identity", ["zr"], ["z"]),
             helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["w", "s", "z"], ["d"])]
    scale = helper.make_tensor("s", TensorProto.FLOAT, [], [0.25])
    model = _model(nodes, [_vi("x", [7])], [_vi("q", [7], code), _vi("d", [7])],
                   [init, scale], opset=21)
    x = (rng.standard_normal(7) * 4).astype(np.float32)
    graph = import_onnx(model)
    w = [v for v in graph.constants() if v.name == "w"][0]
    assert w.type.dtype.name == held.__name__ and np.array_equal(w.const, values.astype(held))
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for target in ("numpy", "llvm"):
        q, d = dnnc.compile(model, target=target).run(x)
        assert q.dtype == held and np.array_equal(q, want[0].astype(held))
        np.testing.assert_array_equal(d, want[1])
    assert {lo, hi} <= set(want[0].tolist())


@pytest.mark.parametrize("code", [TensorProto.INT4, TensorProto.UINT4], ids=["int4", "uint4"])
def test_cast_to_four_bits_truncates_and_wraps_as_the_reference(rng, code):
    from onnx.reference import ReferenceEvaluator

    x = (rng.standard_normal(64) * 40).astype(np.float32)
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=code)], [_vi("x", [64])],
                   [_vi("y", [64], code)], opset=21)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    held = np.int8 if code == TensorProto.INT4 else np.uint8
    for target in ("numpy", "llvm"):
        got = dnnc.compile(model, target=target).run(x)[0]
        np.testing.assert_array_equal(got, want.astype(held))
    like = _model([helper.make_node("CastLike", ["x", "t"], ["y"])], [_vi("x", [64])],
                  [_vi("y", [64], code)], [helper.make_tensor("t", code, [1], [1])], opset=21)
    np.testing.assert_array_equal(dnnc.compile(like, target="llvm").run(x)[0],
                                  want.astype(held))


def test_four_bit_mistakes_are_named():
    from dnnc.errors import UnsupportedTypeError

    bitcast = _model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT4)],
                     [_vi("x", [2], TensorProto.INT8)], [_vi("y", [2], TensorProto.INT4)],
                     opset=26)
    with pytest.raises(UnsupportedTypeError, match="INT4"):
        import_onnx(bitcast)
    mixed = _model([helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])],
                   [_vi("x", [2], TensorProto.INT4)], [_vi("y", [2])],
                   [helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
                    helper.make_tensor("z", TensorProto.INT8, [], [1])], opset=21)
    with pytest.raises(ModelFormatError, match="zero point"):
        import_onnx(mixed)
