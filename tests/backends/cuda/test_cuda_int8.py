"""The cuda int8 templates (backends/cuda/int8.py: QuantizedDense and QuantizedConvPacked on
the integer tensor cores) without a GPU: the kernels scheduled for cuda, run on host threads
with the mma emulated (test_host_semantics' shim) and compared bit for bit with the
op's NumPy reference and with the llvm int8 templates; their modules compiled by NVRTC for
sm_80 and sm_90 where CuPy is installed. The same graphs on a GPU (`gpu` marker) are
test_cuda_int8_gpu.py's."""

import collections
from dataclasses import replace

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.backends.cuda import int8
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.mma import TensorCoreConfig
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.quantized import (pack_conv_groups, pack_groups, quantized_conv_packed,
                                   quantized_dense)
from cuda_kernels import MACHINE, nvrtc_compiled, programs
from test_host_semantics import host_library, program_on_host

pytestmark = pytest.mark.codegen


def _const(name, a):
    a = np.asarray(a)
    return Value(name, T.TensorType(T.DType.from_numpy(a.dtype), a.shape), const=a)


def _epilogue(rng, channels, out) -> list:
    """A random int32 bias and per-channel scales, and (`out` an 8-bit type) its zero point;
    none for int32 sums."""
    if out == "int32":
        return []
    ins = [_const("b", rng.integers(-5000, 5000, channels).astype(np.int32)),
           _const("sc", rng.uniform(2e-5, 2e-4, channels).astype(np.float32))]
    return ins + ([_const("yz", np.dtype(out).type(rng.integers(-3, 4) % 100))]
                  if out in ("int8", "uint8") else [])


def dense_graph(rng, batch, m, k, n, act, out, lo=None):
    """Relu(QuantizedDense(a, ...)) over a [batch, m, k] activation of type `act` with a
    random zero point; the graph, an input and the reference output."""
    info = np.iinfo(act)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    g = Graph("q")
    a = g.add_input("a", T.TensorType(T.DType.from_numpy(np.dtype(act)), (batch, m, k)))
    ins = [a, _const("za", act(rng.integers(info.min, info.max))), _const("w", pack_groups(w)),
           _const("s", w.astype(np.int32).sum(0).astype(np.int32))] + _epilogue(rng, n, out)
    g.outputs = [g.add("Relu", g.add("QuantizedDense", *ins, n=n, lo=lo, hi=None))]
    x = rng.integers(info.min, info.max + 1, (batch, m, k)).astype(act)
    want = np.maximum(quantized_dense(x, *[v.const for v in ins[1:]], n=n, lo=lo, hi=None), 0)
    return g, x, want


def conv_graph(rng, n, c, h, w, m, k, stride, pad, act, out):
    """Relu(QuantizedConvPacked(x, ...)), per-channel scales and a random zero point; the
    graph, an input and the reference output."""
    info = np.iinfo(act)
    wq = rng.integers(-128, 128, (m, c, k, k)).astype(np.int8)
    g = Graph("q")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(act)), (n, c, h, w)))
    ins = [x, _const("za", act(rng.integers(info.min, info.max))),
           _const("w", pack_conv_groups(wq)),
           _const("s", wq.astype(np.int32).reshape(m, -1).sum(1).astype(np.int32))]
    ins += _epilogue(rng, m, out)
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, oc=m,
                 lo=None, hi=None)
    g.outputs = [g.add("Relu", g.add("QuantizedConvPacked", *ins, **attrs))]
    xv = rng.integers(info.min, info.max + 1, (n, c, h, w)).astype(act)
    want = np.maximum(quantized_conv_packed(xv, *[v.const for v in ins[1:]], auto_pad="NOTSET",
                                            dilations=None, group=1, **attrs), 0)
    return g, xv, want


DENSE_CASES = [   # (batch, m, k, n, activation, output): tails of m, n and k, k % 16 != 0
    (2, 5, 37, 19, np.uint8, "int8"), (1, 40, 64, 48, np.int8, "uint8"),
    (2, 9, 30, 33, np.int8, "float32"), (1, 17, 3, 1, np.uint8, "int32"),
    (1, 70, 160, 70, np.int8, "int8"), (1, 1, 2048, 1000, np.uint8, "float32"),
    (1, 15, 37, 40, np.int8, "int8")]
"""Fewer than 16 rows (batch x m) take dp4a (cuda_int8_gemv), others the mma."""
CONV_CASES = [   # (n, c, h, w, m, k, stride, pad, activation, output)
    (1, 5, 9, 7, 19, 3, 1, 1, np.uint8, "int8"), (2, 16, 8, 8, 40, 1, 1, 0, np.int8, "uint8"),
    (1, 3, 11, 11, 8, 3, 2, 1, np.int8, "float32"), (1, 6, 10, 10, 16, 7, 2, 3, np.int8, "int8"),
    (3, 20, 5, 7, 13, 1, 1, 0, np.uint8, "int8")]
SMALL_TILE = TensorCoreConfig(32, 32, 32, 2, 1, 2)
"""A tile that leaves edges in every case (and several blocks and k tiles)."""


def _on_host(graph, x, tmp_path, config=None) -> tuple[np.ndarray, list[str]]:
    """The graph's cuda kernels run on host threads (the tensor cores emulated): its output
    and the templates that scheduled its kernels."""
    optimised, (program,) = programs(graph, machine=MACHINE, config=config)
    module = render_module(program.unique)
    lib = host_library(program.unique, tmp_path, module)
    values = program_on_host(lib, module, program, {optimised.inputs[0].name: x})
    templates = [k.schedule[0] for k in program.kernels]
    return values[optimised.outputs[0].name], templates


def _check(graph, x, want, tmp_path, template, config=None):
    got, templates = _on_host(graph, x, tmp_path, config)
    assert templates[0] == template
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want), f"{np.sum(got != want)} of {got.size} differ"
    llvm = dnnc.compile(graph, "llvm", cache=False)(x)
    assert np.array_equal(got, llvm)


@pytest.mark.parametrize("batch,m,k,n,act,out", DENSE_CASES)
def test_int8_dense_on_host_equals_the_reference_and_llvm(batch, m, k, n, act, out, tmp_path):
    rng = np.random.default_rng(m * k * n + 7)
    g, x, want = dense_graph(rng, batch, m, k, n, act, out, lo=-100 if out == "int8" else None)
    _check(g, x, want, tmp_path, dense_template(batch * m))


def dense_template(rows: int) -> str:
    return "cuda_int8_gemv" if rows < int8.GEMV_ROWS else "cuda_int8_dense"


def test_gemv_warps_on_host(tmp_path):
    """dp4a with 1 and 8 warps a block: panels past the last, a tail of k words."""
    rng = np.random.default_rng(17)
    g, x, want = dense_graph(rng, 1, 3, 70, 200, np.int8, "uint8")
    for warps in (1, 8):
        _check(g, x, want, tmp_path / str(warps), "cuda_int8_gemv", int8.GemvConfig(warps))


@pytest.mark.parametrize("n,c,h,w,m,k,stride,pad,act,out", CONV_CASES)
def test_int8_conv_on_host_equals_the_reference_and_llvm(n, c, h, w, m, k, stride, pad, act,
                                                         out, tmp_path):
    """Odd channels (a group of 4 part zero), padding (the zero point), strides, batches."""
    rng = np.random.default_rng(n * c * h * m * k + 7)
    g, x, want = conv_graph(rng, n, c, h, w, m, k, stride, pad, act, out)
    _check(g, x, want, tmp_path, "cuda_int8_conv2d")


@pytest.mark.parametrize("case", [DENSE_CASES[1], DENSE_CASES[4]])
def test_int8_dense_small_tiles_and_stages_on_host(case, tmp_path):
    """Several blocks each way, edges of m and n, a ring of 2 and of 4 k tiles of 32 and
    128 bytes (cp.async where k is whole chunks)."""
    batch, m, k, n, act, out = case
    rng = np.random.default_rng(m + k + n)
    g, x, want = dense_graph(rng, batch, m, k, n, act, out)
    for config in (SMALL_TILE, TensorCoreConfig(16, 32, 128, 1, 2, 4)):
        _check(g, x, want, tmp_path / str(config.block_k), "cuda_int8_dense", config)


@pytest.mark.parametrize("case", [DENSE_CASES[1], DENSE_CASES[4], (1, 20, 37, 19, np.uint8,
                                                                   "int8")])
def test_int8_dense_weights_in_rows_on_host(case, tmp_path):
    """With cuda's "int8_dense_rows" layout the weights are rows [n, k padded to 16] copied
    by cp.async (k a multiple of 16 or not: the padding's zeros), at the default, a small
    mma.sync tile and a wgmma tile: bit for bit the reference and llvm."""
    from test_cuda_int8_nhwc import WGMMA_TILES

    batch, m, k, n, act, out = case
    rng = np.random.default_rng(m + k + n + 1)
    g, x, want = dense_graph(rng, batch, m, k, n, act, out)
    machine = replace(MACHINE, layouts=("int8_dense_rows",))
    for config in (None, SMALL_TILE, WGMMA_TILES[0]):
        optimised, (program,) = programs(g, machine=machine, config=config)
        (dense,) = [n for n in optimised.nodes if n.op == "QuantizedDense"]
        assert dense.inputs[2].type.shape == (n, -(-k // 16) * 16)
        module = render_module(program.unique)
        assert "cp_async(&b_tile" in module.source
        lib = host_library(program.unique, tmp_path / str(config), module)
        got = program_on_host(lib, module, program, {optimised.inputs[0].name: x})
        assert [k.schedule[0] for k in program.kernels] == ["cuda_int8_dense"]
        assert np.array_equal(got[optimised.outputs[0].name], want)


def test_int8_conv_small_tiles_on_host(tmp_path):
    rng = np.random.default_rng(11)
    g, x, want = conv_graph(rng, 2, 13, 9, 9, 24, 3, 1, 1, np.uint8, "uint8")
    _check(g, x, want, tmp_path, "cuda_int8_conv2d", TensorCoreConfig(32, 32, 64, 1, 2, 3))


def test_every_config_of_the_space_honours_its_constraints():
    rng = np.random.default_rng(3)
    g, _, _ = dense_graph(rng, 1, 40, 64, 48, np.int8, "uint8")
    _, (program,) = programs(g, machine=MACHINE)
    from dnnc.backends.quantized_problems import quantized_dense as describe

    p = describe(program.kernels[0])
    space = int8.dense_space(p, MACHINE)
    configs = list(space.configs())
    assert SMALL_TILE in configs and int8.dense_default(p, MACHINE) in configs
    assert all(c.split_k == 1 for c in configs)
    from dnnc.backends.cuda import wgmma   # sm_90: the wgmma knob, its s8 form

    assert any(c.wgmma for c in configs) and all(
        wgmma.fits(c, "s8") for c in configs if c.wgmma)
    for k in rng.choice(len(configs), 24, replace=False):   # each builds verified loop IR
        L.verify(int8.dense_build(p, configs[k], MACHINE))


@pytest.mark.parametrize("m,n,k", [
    (100352, 64, 576), (25088, 256, 2304), (1568, 2048, 512), (100352, 256, 64),
    (1024, 3072, 768), (1024, 768, 3072)])
def test_default_tiles_of_resnet50_and_bert_fill_the_gpu(m, n, k):
    """resnet50's batch-32 convs, BERT's batch-8 dense products: tiles of at least 64 x 64
    and 4 warps, enough blocks for every SM."""
    from dnnc.backends.cuda.device import REFERENCE

    c = int8.choose(m, n, k, REFERENCE)
    assert c.block_m * c.block_n >= 64 * 64 and c.warps_m * c.warps_n >= 4
    assert -(-m // c.block_m) * -(-n // c.block_n) >= REFERENCE.sms
    assert c.block_k == int8.DEFAULT_BLOCK_K and c.stages == int8.DEFAULT_STAGES


@pytest.mark.parametrize("m,n,k", [(100352, 256, 64), (25088, 512, 128), (6272, 1024, 256)])
def test_shallow_products_on_wgmma_take_the_shallow_tile(m, n, k):
    """resnet50's 1x1 convs of at most 256 input channels (with wgmma): int8.SHALLOW_TILE, a
    tile of the space two blocks of which an SM holds; deeper products, or of fewer columns
    than its 128, keep the model's choice."""
    from dnnc.backends.cuda import wgmma
    from dnnc.backends.cuda.device import REFERENCE
    from dnnc.backends.cuda.mma import resident

    tile = int8.SHALLOW_TILE
    assert int8.choose(m, n, k, REFERENCE, True) == tile
    assert wgmma.fits(tile, "s8") and resident(replace(tile, staged=True), "s8") == 2
    assert int8.choose(m, n, 512, REFERENCE, True) != tile
    assert int8.choose(m, 64, k, REFERENCE, True) != tile
    assert int8.choose(m, n, k, REFERENCE) != tile   # (mma.sync only)


def test_shallow_wide_products_on_wgmma_take_the_resident_tile():
    """BERT-base b8's first feed-forward product (k of six 128-byte tiles, 3072 columns):
    int8.RESIDENT_TILE, three blocks an SM, in the space; the second (3072 -> 768) and the
    768 -> 768 projections, whose 64 x 128 blocks would not fill the SMs three deep, keep
    the 64 x 64 tile, as mma.sync's tiles alone do."""
    from dnnc.backends.cuda import wgmma
    from dnnc.backends.cuda.device import REFERENCE
    from dnnc.backends.cuda.mma import resident

    tile = int8.RESIDENT_TILE
    assert int8.choose(1024, 3072, 768, REFERENCE, True) == tile
    assert wgmma.fits(tile, "s8") and resident(replace(tile, staged=True), "s8") == 3
    for n, k in ((768, 3072), (768, 768)):
        c = int8.choose(1024, n, k, REFERENCE, True)
        assert (c.block_m, c.block_n, c.wgmma) == (64, 64, True)
    assert int8.choose(1024, 3072, 768, REFERENCE) != tile   # (mma.sync only)


def test_default_tile_of_a_small_product_is_small():
    from dnnc.backends.cuda.device import REFERENCE

    c = int8.choose(40, 48, 64, REFERENCE)
    assert c.block_m == 16 and c.block_n == 32


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_int8_kernels_compile_with_nvrtc(arch):
    """The integer mma's inline PTX, ldmatrix and cp.async of both templates, u8 and s8."""
    rng = np.random.default_rng(5)
    funcs = []
    for g in (dense_graph(rng, 2, 40, 64, 48, np.int8, "uint8")[0],
              dense_graph(rng, 1, 19, 37, 19, np.uint8, "float32")[0],
              dense_graph(rng, 1, 3, 37, 19, np.int8, "int8")[0],
              conv_graph(rng, 1, 5, 9, 7, 19, 3, 1, 1, np.uint8, "int8")[0]):
        _, (program,) = programs(g, machine=MACHINE)
        funcs += [(f.__class__(f"{f.name}_{len(funcs)}", f.params, f.body), noalias)
                  for f, noalias in program.unique]
    source = render_module(funcs).source
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in source
    assert "dnnc_mma_s8(" in source.split("dnnc_mma_u8(int*")[-1]
    assert "dnnc_mma_u8(&" in source and "dnnc_cp_async(&" in source
    assert "dnnc_dp4a(" in source.split("__global__", 1)[1]
    nvrtc_compiled(source, arch)


QUANTIZED_FILES = {   # zoo model -> (its config, its int8 dense (mma or dp4a) and conv kernels)
    "cnn": ({}, 1, 3), "resnet18": ({"size": 32}, 1, 20),
    "bert_tiny": ({"seq": 16, "vocab": 512}, 12, 0)}


@pytest.mark.parametrize("name", [
    "cnn", pytest.param("resnet18", marks=pytest.mark.emulated_full), "bert_tiny"])
def test_quantized_files_on_host(name, tmp_path):
    """QDQ CNNs (quantize_static) and a dynamically quantized BERT: every conv and dense
    product on the int8 templates, the whole program run on host threads giving
    onnxruntime's outputs (the CNNs bit for bit; BERT, whose float ops sum in another order,
    as tests/models/test_quantized_files.py bounds it)."""
    pytest.importorskip("onnxruntime")
    from dnnc.testing.quantized_files import (onnxruntime_outputs, quantize_dynamic,
                                              quantize_static)

    config, dense, convs = QUANTIZED_FILES[name]
    model = zoo.build(name, **config)
    path = quantize_dynamic(model, tmp_path, name) if name == "bert_tiny" else \
        quantize_static(model, tmp_path, name, seed=3)
    feeds = zoo.inputs_for(model, np.random.default_rng(13))
    got = _int8_file_on_host(path, feeds, dense, convs, tmp_path)
    want = onnxruntime_outputs(path, feeds)[0]
    if name == "bert_tiny":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    else:
        assert np.array_equal(got, want)


def _int8_file_on_host(path, feeds, dense: int, convs: int, tmp_path):
    """The file's output on host threads, having checked that `dense` products and `convs`
    convolutions took the int8 templates."""
    from dnnc.frontend.onnx import import_onnx

    graph, (program,) = programs(import_onnx(str(path)), machine=MACHINE)
    templates = collections.Counter(k.schedule[0] for k in program.kernels)
    assert templates["cuda_int8_dense"] + templates["cuda_int8_gemv"] == dense
    assert templates["cuda_int8_conv2d"] == convs
    module = render_module(program.unique)
    lib = host_library(program.unique, tmp_path / "lib", module)
    return program_on_host(lib, module, program, feeds)[graph.outputs[0].name]


@pytest.mark.parametrize("name,activations,weights,dense,convs", [
    ("cnn", "int8", "uint4", 1, 3), ("cnn", "uint4", "int4", 1, 3),
    ("mlp", "int4", "int4", 3, 0)])
def test_four_bit_quantized_files_on_host(name, activations, weights, dense, convs, tmp_path):
    """quantize_static files of int4 / uint4 weights (and activations), held as int8 / uint8:
    the int8 templates, run on host threads, give onnxruntime's outputs (one op at a time:
    its optimized session refuses the 4-bit CNN) bit for bit."""
    pytest.importorskip("onnxruntime")
    import onnx

    from dnnc.testing.quantized_files import onnxruntime_values, quantize_static

    model = zoo.build(name)
    path = quantize_static(model, tmp_path, name, seed=5, activations=activations,
                           weights=weights)
    feeds = zoo.inputs_for(model, np.random.default_rng(14))
    got = _int8_file_on_host(path, feeds, dense, convs, tmp_path)
    output = onnx.load(str(path)).graph.output[0].name
    assert np.array_equal(got, onnxruntime_values(path, feeds)[output])


def _weight_only_file(level: int):
    """A MatMulNBits file (MatMulNBitsQuantizer: 4-bit blocks of 32 with zero points, K 200
    not a multiple of them) and its program scheduled for cuda: (model, graph, program)."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import helper, numpy_helper

    from dnnc.frontend.onnx import import_onnx
    from dnnc.testing.quantized_files import quantize_weights

    k, n = 200, 24
    w = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "fc",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 5, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 5, n])],
        [numpy_helper.from_array(w, "w")])
    model = quantize_weights(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]), 4, 32, accuracy_level=level or None)
    g, (program,) = programs(import_onnx(model), machine=MACHINE)
    assert ("Round" in [nd.op for nd in g.nodes]) == (level == 4)
    return model, g, program


@pytest.mark.parametrize("level", [0, 4])
def test_weight_only_quantized_file_on_host(level, rng, tmp_path):
    """The file's float dense product (and at accuracy_level 4 A's quantization to int8
    blocks before it), run on host threads, gives onnxruntime's output within the float32
    rounding bound."""
    import onnx
    from onnx import numpy_helper

    from dnnc.testing.quantized_files import nbits_rounding_bound, onnxruntime_values

    model, g, program = _weight_only_file(level)
    path = tmp_path / "nbits.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((3, 5, 200)).astype(np.float32)
    want = onnxruntime_values(path, {"x": x})["y"]
    module = render_module(program.unique)
    lib = host_library(program.unique, tmp_path / "lib", module)
    got = program_on_host(lib, module, program, {"x": x})[g.outputs[0].name]
    scales = next(numpy_helper.to_array(t) for t in model.graph.initializer
                  if t.name == model.graph.node[0].input[2])
    bound = nbits_rounding_bound(x, scales, 32, 4)
    assert (np.abs(got - want).reshape(bound.shape) - bound).max() <= 0


def test_weight_only_quantized_file_compiles_with_nvrtc():
    nvrtc_compiled(render_module(_weight_only_file(4)[2].unique).source, "sm_90")


def _without_ranges():
    """The cuda target with no kernel taking a quantization's range (take_range off)."""
    import dataclasses

    return dataclasses.replace(MACHINE, fusion=dataclasses.replace(
        MACHINE.fusion, range_producers=frozenset()))


@pytest.mark.parametrize("ranged", [True, False])
@pytest.mark.parametrize("shape,values,dtype", [
    ((300, 500), "normal", "float32"), ((64, 33), "normal", "float32"),
    ((7, 5), "positive", "float32"), ((1000, 3), "negative", "float32"),
    ((2, 129), "zero", "float32"), ((300, 500), "normal", "float16"),
    ((64, 33), "positive", "float16"), ((7, 5), "negative", "bfloat16"),
    ((1000, 3), "normal", "bfloat16")])
def test_dynamic_quantize_on_host(shape, values, dtype, ranged, rng, tmp_path):
    """DynamicQuantizeLinear as cuda_dynamic_quantize's two launches (partial ranges of a
    grid-stride share a block; every block the whole range from them, then its share
    quantized), or, of a model input under take_range, the first as a DynamicRange kernel
    (cuda_dynamic_range: the partials a column a block) and the quantization one launch:
    the reference's outputs exactly on host threads, for 150,000 elements down to fewer
    than a block's threads, ranges on both sides of 0, one side only (the range widened to
    0) and none (scale 1); x in float16 or bfloat16 too (as store_half leaves a half node's
    output: widened on load), the reference's outputs for its float32 values."""
    import ml_dtypes
    import test_host_semantics as host
    from dnnc.ir.ops.quant import dynamic_quantize_linear

    np_type = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    g = Graph("dq")
    x = g.add_input("x", T.TensorType(T.DType.from_numpy(np.dtype(np_type)), shape))
    g.outputs = list(g.add_node("DynamicQuantizeLinear", [x], {}, num_outputs=3))
    graph, (program,) = programs(g, machine=MACHINE if ranged else _without_ranges())
    assert [k.schedule[0] for k in program.kernels] == \
        ["cuda_dynamic_range", "cuda_dynamic_quantize"] * ranged or ["cuda_dynamic_quantize"]
    module = render_module(program.unique)
    lib = host.host_library(program.unique, tmp_path, module)
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    a = {"normal": a, "positive": np.abs(a) + 1, "negative": -np.abs(a) - 0.5,
         "zero": np.zeros_like(a)}[values].astype(np_type)
    got = host.program_on_host(lib, module, program, {"x": a})
    for out, want in zip(graph.outputs, dynamic_quantize_linear(a)):
        assert np.array_equal(got[out.name], want)


@pytest.mark.parametrize("shape,bias", [
    ((3, 5, 77), 0.0), ((64, 768), 0.0), (("batch", 33), 0.0), ((2, 129), 10.0),
    ((4, 96), -10.0), ((2, 64), None), ((4100, 32), 0.0)])
def test_range_in_layernorm_on_host(shape, bias, rng, tmp_path):
    """A layernorm's row kernel taking the range of the DynamicQuantizeLinear that reads it
    (take_range, `range_epilogue.py`), the quantization then one launch: on host threads its
    outputs are the reference's of the layernorm's output bit for bit, and the layernorm's
    output is what it is without the range (odd rows, a symbolic batch, outputs all
    positive, all negative, all zero: scale 1; 1025 blocks of 4 rows, more than the
    partials' columns: the range a launch of its own in the layernorm's kernel)."""
    import test_host_semantics as host
    from dnnc.backends.cuda.codegen import stages
    from dnnc.backends.plan import build_program, segment_groups
    from dnnc.ir.ops.quant import dynamic_quantize_linear
    from dnnc.ir.segments import Segment, plan_steps
    from dnnc.passes.manager import optimize
    from cuda_kernels import schedule_kernel

    static = tuple(5 if d == "batch" else d for d in shape)
    g = Graph("ln_dq")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    scale = rng.standard_normal(static[-1]).astype(np.float32)
    shift = rng.standard_normal(static[-1]).astype(np.float32)
    if bias is None:
        scale, shift = np.zeros_like(scale), np.zeros_like(shift)
    else:
        scale, shift = scale * 0.1 if bias else scale, shift + np.float32(bias)
    y = g.add("LayerNormalization", x, Value("scale", T.TensorType(T.float32, scale.shape),
                                             const=scale),
              Value("bias", T.TensorType(T.float32, shift.shape), const=shift), axis=-1)
    g.outputs = [y] + list(g.add_node("DynamicQuantizeLinear", [y], {}, num_outputs=3))
    plain = _without_ranges()
    a = (rng.standard_normal(static) * 3).astype(np.float32)
    got = {}
    for name, machine in (("ranged", MACHINE), ("plain", plain)):
        graph = optimize(g, machine)
        (step,) = [s for s in plan_steps(graph) if isinstance(s, Segment)]
        program = build_program(step, (static,), (), segment_groups(step, graph.groups),
                                lambda k: schedule_kernel(k, machine), True)
        ops = [[n.op for n in k.nodes] for k in program.kernels]
        quantize = program.kernels[-1].func
        if name == "ranged":
            assert ops == [["LayerNormalization", "DynamicRange"], ["DynamicQuantizeLinear"]]
            assert len(stages(quantize.body)[1]) == 1
            assert len(stages(program.kernels[0].func.body)[1]) == 1 + (static[0] > 1024)
        else:
            assert ops == [["LayerNormalization"], ["DynamicQuantizeLinear"]]
            assert len(stages(quantize.body)[1]) == 2
        module = render_module(program.unique)
        lib = host.host_library(program.unique, tmp_path / name, module)
        got[name] = host.program_on_host(lib, module, program, {"x": a})
        outs = [got[name][v.name] for v in graph.outputs]
        assert np.array_equal(outs[0], got.get("ranged", got[name])[graph.outputs[0].name])
        for out, want in zip(outs[1:], dynamic_quantize_linear(outs[0])):
            assert np.array_equal(out, want)
    if bias is not None and bias:
        assert (np.sign(got["plain"][graph.outputs[0].name]) == np.sign(bias)).all()
