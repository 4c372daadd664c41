"""com.microsoft's MatMulNBits (onnxruntime's weight-only quantizer, MatMulNBitsQuantizer;
and GatherBlockQuantized, its quantized embeddings, bit for bit)
against onnxruntime's CPU kernel on the same file, fresh random inputs: dnnc's llvm target and
its numpy references give onnxruntime's outputs within float32 rounding, element by element
(`nbits_rounding_bound`), at accuracy_level 4 too (onnxruntime then quantizes A's blocks to int8,
and so does dnnc's import); the packed weight becomes one float32 constant at compile time;
what dnnc cannot translate is reported up front with the node's name."""

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc import zoo
from dnnc.errors import ModelFormatError, UnsupportedOpError
from dnnc.frontend.onnx import import_onnx
from dnnc.ir.interpreter import run_graph
from dnnc.ir.target import Target
from dnnc.passes.manager import optimize
from dnnc.testing.quantized_files import nbits_rounding_bound, quantize_weights

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
MS = "com.microsoft"
U = 2.0 ** -24
"""float32's unit roundoff."""


def _matmul_model(k: int, n: int, lead: tuple, seed: int) -> onnx.ModelProto:
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _onnxruntime(model, feeds, outputs=None):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def _initializer(model, name):
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


@pytest.mark.parametrize("bits,block,symmetric,level,k,lead", [
    (4, 32, False, None, 64, (3, 5)),
    (4, 128, True, None, 200, (3, 5)),     # K not a multiple of the block: B padded
    (4, 32, False, 4, 96, (1,)),           # one row: onnxruntime's M = 1 kernels
    (4, 16, True, 4, 48, (2, 3, 4)),
    (4, 128, False, 4, 200, (2, 6)),
    (8, 32, False, None, 96, (7,)),
    (8, 32, True, 4, 96, (3, 5)),
    (2, 32, False, 4, 64, (3, 5)),
])
def test_quantizer_files_equal_onnxruntime(rng, bits, block, symmetric, level, k, lead):
    model = quantize_weights(_matmul_model(k, 24, lead, seed=bits * k), bits, block, symmetric,
                             level)
    node = model.graph.node[0]
    assert node.op_type == "MatMulNBits" and (len(node.input) == 3) == symmetric
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    want = _onnxruntime(model, {"x": x})[0]
    g = optimize(import_onnx(model), Target("llvm"), opt_level=3)
    ops = collections.Counter(n.op for n in g.nodes)
    assert ops["MatMul"] == 1 and "DequantizeLinear" not in ops   # W folded to float32
    assert ("Round" in ops) == (level == 4)
    bound = nbits_rounding_bound(x, _initializer(model, node.input[2]), block, bits)
    reference = optimize(import_onnx(model), Target("numpy"), opt_level=1)
    for got in (dnnc.compile(model, "llvm")(x), run_graph(reference, [x])[0]):
        assert got.shape == want.shape and got.dtype == np.float32
        excess = np.abs(got - want).reshape(bound.shape) - bound
        assert excess.max() <= 0, excess.max()


@pytest.mark.parametrize("symmetric", [False, True])
def test_the_quantizers_qdq_format_equals_onnxruntime_op_by_op(rng, symmetric):
    # quant_format=QDQ: a blocked int4 / uint4 DequantizeLinear (opset 21) feeding the MatMul,
    # docs/passes.md's 4-bit types; onnxruntime's optimized session fuses the two into a
    # MatMulNBits of accuracy_level 4 (~0.35% of the largest output off), so one op at a time
    model = _matmul_model(128, 24, (3, 5), seed=21)
    model.opset_import[0].version = 21
    model = quantize_weights(model, 4, 32, symmetric, qdq=True)
    assert [n.op_type for n in model.graph.node] == ["DequantizeLinear", "MatMul"]
    x = rng.standard_normal((3, 5, 128)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    scales = _initializer(model, model.graph.node[0].input[1]).T   # ([blocks, N] here)
    bound = nbits_rounding_bound(x, scales, 32, 4)
    got = dnnc.compile(model, "llvm")(x)
    assert (np.abs(got - want).reshape(bound.shape) - bound).max() <= 0


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_an_hqq_file_equals_onnxruntime(rng):
    # the quantizer's HQQ algorithm: float zero points, scales and zero points written 1-D
    pytest.importorskip("torch")
    model = quantize_weights(_matmul_model(128, 24, (3, 5), seed=22), 4, 32, hqq=True)
    node = model.graph.node[0]
    zero = _initializer(model, node.input[3])
    assert node.op_type == "MatMulNBits" and zero.dtype == np.float32 and zero.ndim == 1
    x = rng.standard_normal((3, 5, 128)).astype(np.float32)
    want = _onnxruntime(model, {"x": x})[0]
    bound = nbits_rounding_bound(x, _initializer(model, node.input[2]).reshape(24, 4), 32, 4,
                                 zero=np.abs(zero).max())
    got = dnnc.compile(model, "llvm")(x)
    assert (np.abs(got - want).reshape(bound.shape) - bound).max() <= 0


def _packed(codes: np.ndarray, bits: int) -> np.ndarray:
    """[..., m] codes as bytes, low bits first (MatMulNBits' packing)."""
    per = 8 // bits
    codes = codes.reshape(*codes.shape[:-1], -1, per).astype(np.uint8)
    return np.bitwise_or.reduce(codes << (np.arange(per, dtype=np.uint8) * bits), axis=-1)


def _nbits_node_model(rng, k, n, block, a_type, zero_points, bias, g_idx, level=0):
    """One MatMulNBits of 4-bit random codes; zero_points "float", "packed" or None."""
    blocks = -(-k // block)
    codes = rng.integers(0, 16, (n, blocks * block))
    scale_type = np.float16 if a_type == TensorProto.FLOAT16 else np.float32
    inits = {"b": _packed(codes, 4).reshape(n, blocks, block // 2),
             "s": rng.uniform(0.01, 0.1, (n, blocks)).astype(scale_type)}
    names = ["a", "b", "s", "", "", ""]
    if zero_points == "float":
        inits["z"] = rng.uniform(0, 15, (n, blocks)).astype(scale_type)
    elif zero_points == "packed":
        inits["z"] = _packed(np.pad(rng.integers(0, 16, (n, blocks)), ((0, 0), (0, blocks % 2))),
                             4)
    if zero_points:
        names[3] = "z"
    if g_idx:
        inits["g"], names[4] = (np.arange(k) // block).astype(np.int32), "g"
    if bias:
        inits["bias"], names[5] = rng.standard_normal(n).astype(scale_type), "bias"
    while not names[-1]:
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["y"], domain=MS, K=k, N=n, bits=4,
                            block_size=block, accuracy_level=level)
    graph = helper.make_graph([node], "nbits",
                              [helper.make_tensor_value_info("a", a_type, [3, 4, k])],
                              [helper.make_tensor_value_info("y", a_type, [3, 4, n])],
                              [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    return model, inits


def test_float_zero_points_a_bias_and_an_identity_g_idx(rng):
    # HQQ's files: zero points of A's type, W = q * scale - scale * zero point (onnxruntime's
    # order); a g_idx of each row's own block reorders nothing
    model, inits = _nbits_node_model(rng, 80, 24, 32, TensorProto.FLOAT, "float", True, True)
    a = rng.standard_normal((3, 4, 80)).astype(np.float32)
    want = _onnxruntime(model, {"a": a})[0]
    got = dnnc.compile(model, "llvm")(a)
    bound = nbits_rounding_bound(a, inits["s"], 32, 4, zero=inits["z"].max())
    bias = 2 * U * np.abs(want).reshape(bound.shape)   # (its addition's rounding, both sides)
    assert (np.abs(got - want).reshape(bound.shape) - bound - bias).max() <= 0


@pytest.mark.parametrize("level", [0, 4])
def test_float16_a_is_computed_in_float32_and_rounded_once(rng, level):
    # as onnxruntime's x86 kernel: A, scales and bias widened, float32 product, one rounding;
    # the two float32 results round to float16 alike but where they straddle a rounding
    # boundary (then one float16 step apart)
    model, inits = _nbits_node_model(rng, 64, 24, 32, TensorProto.FLOAT16, "packed", True,
                                     False, level)
    a = rng.standard_normal((3, 4, 64)).astype(np.float16)
    want = _onnxruntime(model, {"a": a})[0]
    got = dnnc.compile(model, "llvm")(a)
    assert got.dtype == np.float16
    bound = nbits_rounding_bound(a.astype(np.float32), inits["s"], 32, 4).reshape(want.shape)
    step = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
    assert (np.abs(got.astype(np.float32) - want) - bound - step).max() <= 0


def test_what_dnnc_cannot_translate_is_reported_up_front_with_the_node_names():
    blocks, block = 2, 32

    def node(name, b="b", **attrs):
        inputs = [f"a_{name}", b, "s"] + (["", "g"] if name == "act_order" else [])
        attrs = {"K": 64, "N": 8, "bits": 4, "block_size": block, **attrs}
        return helper.make_node("MatMulNBits", inputs, [f"y_{name}"], name=name, domain=MS,
                                **attrs)

    inits = [numpy_helper.from_array(np.zeros((8, blocks, 16), np.uint8), "b"),
             numpy_helper.from_array(np.zeros((8, blocks, 12), np.uint8), "b3"),
             numpy_helper.from_array(np.ones((8, blocks), np.float32), "s"),
             numpy_helper.from_array(np.arange(64, dtype=np.int32)[::-1] // block, "g")]
    nodes = [node("three_bits", "b3", bits=3), node("runtime_b", "b_input"),
             node("act_order"), node("prepacked", weight_prepacked=1), node("fine")]
    inputs = [helper.make_tensor_value_info(f"a_{n.name}", TensorProto.FLOAT, [2, 64])
              for n in nodes] + [helper.make_tensor_value_info("b_input", TensorProto.UINT8,
                                                              [8, blocks, 16])]
    outputs = [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, [2, 8])
               for n in nodes]
    model = helper.make_model(helper.make_graph(nodes, "refused", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid(MS, 1)])
    with pytest.raises(UnsupportedOpError) as err:
        import_onnx(model)
    message = str(err.value)
    assert err.value.ops[0][:2] == ("MatMulNBits", MS) and len(err.value.ops[0][3]) == 4
    for said in ("'three_bits (bits=3: only 2, 4, 8 are supported)'",
                 "'runtime_b (B is not a constant)'", "'act_order (g_idx that reorders K",
                 "'prepacked (weight_prepacked=1"):
        assert said in message
    assert "fine" not in message


def test_refusals_read_constants_through_subgraphs_and_a_malformed_b_is_named():
    # an If branch's MatMulNBits reads the outer graph's B (a constant: accepted) or its own
    # of 3 bits (refused, named); a B of the wrong shape is the file's error, named too
    def nbits(name, b, bits=4):
        return helper.make_node("MatMulNBits", ["a", b, "s"], [f"y_{name}"], name=name,
                                domain=MS, K=64, N=8, bits=bits, block_size=32)

    def branch(name, node, inits=()):
        out = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, [2, 8])
        return helper.make_graph([node], name, [], [out], list(inits))

    b3 = numpy_helper.from_array(np.zeros((8, 2, 12), np.uint8), "b3")
    inits = [numpy_helper.from_array(np.zeros((8, 2, 16), np.uint8), "b"),
             numpy_helper.from_array(np.ones((8, 2), np.float32), "s")]
    node = helper.make_node("If", ["c"], ["y"], name="if",
                            then_branch=branch("then", nbits("outer_b", "b")),
                            else_branch=branch("else", nbits("inner", "b3", 3), [b3]))
    inputs = [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 64])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    model = helper.make_model(helper.make_graph([node], "m", inputs, out, inits),
                              opset_imports=opsets)
    with pytest.raises(UnsupportedOpError) as err:
        import_onnx(model)
    assert err.value.ops == [("MatMulNBits", MS, 1,
                              ["inner (bits=3: only 2, 4, 8 are supported)"])]
    inits[0] = numpy_helper.from_array(np.zeros((8, 2, 15), np.uint8), "b")
    model = helper.make_model(helper.make_graph([nbits("short_b", "b")], "m", inputs[1:],
                                                [out[0]], inits), opset_imports=opsets)
    model.graph.output[0].name = "y_short_b"
    with pytest.raises(ModelFormatError, match=r"MatMulNBits node 'short_b'.*\[8, 2, 16\]"):
        import_onnx(model)


def _gather_model(data, indices_shape, scales, zero_points, **attrs):
    inits = [data, numpy_helper.from_array(scales, "s")] + (
        [zero_points] if zero_points is not None else [])
    node = helper.make_node("GatherBlockQuantized",
                            ["data", "i", "s"] + (["z"] if zero_points is not None else []),
                            ["y"], domain=MS, **attrs)
    graph = helper.make_graph(
        [node], "gbq", [helper.make_tensor_value_info("i", TensorProto.INT64, indices_shape)],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(scales.dtype),
                                       None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize("bits,zero_points", [(4, True), (4, False), (8, False), (2, True)])
def test_gather_block_quantized_of_packed_uint8_equals_onnxruntime_bit_for_bit(rng, bits,
                                                                                zero_points):
    # uint8 data of `bits`-bit codes packed along the last axis (zero points packed alike;
    # absent: 2^(bits - 1)); float32((q - zero point) * scale) on both sides, so equal
    rows, cols, block = 40, 96, 32
    codes = rng.integers(0, 1 << bits, (rows, cols))
    data = numpy_helper.from_array(_packed(codes, bits), "data")
    scales = rng.uniform(0.01, 0.1, (rows, cols // block)).astype(np.float32)
    z = numpy_helper.from_array(_packed(np.pad(rng.integers(0, 1 << bits, scales.shape),
                                               ((0, 0), (0, 1))), bits)[:, :-(-3 * bits // 8)],
                                "z") if zero_points else None
    model = _gather_model(data, [2, 3], scales, z, bits=bits, block_size=block,
                          gather_axis=0, quantize_axis=1)
    i = rng.integers(-rows, rows, (2, 3))
    want = _onnxruntime(model, {"i": i})[0]
    got = dnnc.compile(model, "llvm")(i)
    assert got.shape == (2, 3, cols) and np.array_equal(got, want)


def test_gather_block_quantized_of_int4_along_another_axis_equals_onnxruntime(rng):
    # int4 data (zero point 0 when absent), gathered along axis 1 and quantized along 0
    codes = rng.integers(-8, 8, (64, 10))
    data = helper.make_tensor("data", TensorProto.INT4, codes.shape, codes.ravel().tolist())
    scales = rng.uniform(0.01, 0.1, (4, 10)).astype(np.float32)
    model = _gather_model(data, [5], scales, None, bits=4, block_size=16, gather_axis=1,
                          quantize_axis=0)
    i = rng.integers(0, 10, 5)
    want = _onnxruntime(model, {"i": i})[0]
    got = dnnc.compile(model, "llvm")(i)
    assert got.shape == (64, 5) and np.array_equal(got, want)


def test_gather_block_quantized_refusals_are_reported_up_front():
    scales = np.ones((8, 2), np.float32)
    same_axis = _gather_model(numpy_helper.from_array(np.zeros((8, 32), np.uint8), "data"),
                              [3], scales, None, bits=8, block_size=16, gather_axis=1,
                              quantize_axis=1)
    three_bits = _gather_model(numpy_helper.from_array(np.zeros((8, 12), np.uint8), "data"),
                               [3], scales, None, bits=3, block_size=16)
    float8 = _gather_model(helper.make_tensor("data", TensorProto.FLOAT8E4M3FN, [8, 32],
                                              [0.0] * 256), [3], scales, None, block_size=16)
    for model, reason in ((same_axis, "gather_axis equal to quantize_axis"),
                          (three_bits, "bits=3 of UINT8 data"),
                          (float8, r"FLOAT8E4M3FN data \(int4, uint4, uint8 are\)")):
        with pytest.raises(UnsupportedOpError, match=reason):
            import_onnx(model)


def test_a_bert_of_quantized_embeddings_and_dense_layers_equals_onnxruntime(bert, rng):
    # MatMulNBitsQuantizer asked for Gathers too: the three embedding tables are
    # GatherBlockQuantized of uint4 codes (blocks of 32 along the hidden axis)
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load_from_string(bert.SerializeToString()),
                                     block_size=32, op_types_to_quantize=("MatMul", "Gather"),
                                     quant_axes=(("MatMul", 0), ("Gather", 1)))
    quantizer.process()
    model = quantizer.model.model
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["GatherBlockQuantized"] == 3 and ops["MatMulNBits"] == 12
    feeds = zoo.inputs_for(model, rng)
    want = _onnxruntime(model, feeds)[0]
    np.testing.assert_allclose(dnnc.compile(model, "llvm")(**feeds), want, rtol=1e-4,
                               atol=1e-5)


@pytest.fixture(scope="module")
def bert():
    return zoo.build("bert", layers=2, hidden=128, heads=2, seq=16, vocab=512)


def test_a_weight_quantized_bert_equals_onnxruntime(bert, rng):
    # float32 products (accuracy_level unset): the zoo's float tolerance against onnxruntime
    model = quantize_weights(bert, 4, 32)
    assert collections.Counter(n.op_type for n in model.graph.node)["MatMulNBits"] == 12
    feeds = zoo.inputs_for(model, rng)
    want = _onnxruntime(model, feeds)[0]
    np.testing.assert_allclose(dnnc.compile(model, "llvm")(**feeds), want, rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("block,symmetric", [(32, False), (128, True)])
def test_each_int8_level_layer_of_a_bert_equals_onnxruntime_on_its_activations(bert, rng, block,
                                                                                symmetric):
    # accuracy_level 4 through a whole model: an activation within float32 rounding of the
    # midpoint of two int8 codes may take the other code (seen: 49.49998 against 49.5, one
    # code of 8192, in layer 0's output dense), and the difference grows through the layers
    # after it; so each MatMulNBits runs alone on the activations onnxruntime gave it
    model = quantize_weights(bert, 4, block, symmetric, accuracy_level=4)
    layers = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    seen = model.graph.output
    for name in dict.fromkeys(n.input[0] for n in layers):
        seen.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    seen.extend(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None)
                for n in layers)
    values = dict(zip([o.name for o in seen], _onnxruntime(model, zoo.inputs_for(model, rng))))
    inits = {t.name: t for t in model.graph.initializer}
    for layer in layers:
        a, want = values[layer.input[0]], values[layer.output[0]]
        graph = helper.make_graph(
            [layer], layer.name,
            [helper.make_tensor_value_info(layer.input[0], TensorProto.FLOAT, a.shape)],
            [helper.make_tensor_value_info(layer.output[0], TensorProto.FLOAT, want.shape)],
            [inits[name] for name in layer.input[1:] if name])
        alone = helper.make_model(graph, opset_imports=list(model.opset_import))
        got = dnnc.compile(alone, "llvm")(a)
        bound = nbits_rounding_bound(a, numpy_helper.to_array(inits[layer.input[2]]), block, 4)
        assert (np.abs(got - want).reshape(bound.shape) - bound).max() <= 0, layer.name
