"""int8 products on AMX tiles (`amx_int8.py`), in test_amx.py's tiers:

- anywhere: the choice (amx_dense_int8 / amx_conv_int8 where the target has amx-tile and
  amx-int8, at any precision; vpdpbusd's dense_int8 / conv_int8 without amx-int8; depthwise
  never on tiles), the tile dots of either signedness (tdpbusd, tdpbssd) and whole kernels
  compiled (never run) for a Sapphire Rapids;
- numerics with `mode="loops"`: the templates' code with each tile product rendered as loops
  of the same sums (`expand_tile_products`), so A's tiles, the weights' tail, partial blocks,
  the image's phases, the zero-point compensation and the fused epilogues run on any CPU;
- numerics with `mode="amx"`: the same on the tiles, skipped (with the reason) where
  `amx_usable` is false; `.devrun/amx_int8_check.sh` runs them on the AMX host.

Accuracy: bit-exact, against QuantizedDense's / QuantizedConvPacked's numpy reference and
against the vpdpbusd templates compiled for the same CPU without amx-int8 (int32 sums are
exact; the finish is the same expression).
"""

import ctypes

import numpy as np
import pytest

import dnnc
from dnnc.backends.llvm import amx
from dnnc.backends.llvm.codegen import ModuleBuilder
from dnnc.backends.llvm.cpu import cpu_from, host_target
from dnnc.backends.llvm.jit import JITModule
from dnnc.backends.llvm.schedules import schedule_kernel, template_for
from dnnc.backends.lower import lower_group
from dnnc.backends.registry import REGISTRY
from dnnc.ir import loop as L
from dnnc.ir import types as T

from test_amx import sapphire_rapids_assembly, tile_func
from test_int8 import conv_graph, dense_graph

HAS_AMX_INT8 = amx.amx_usable(host_target().feature_set, "u8s8")
NO_AMX = "this CPU (or its kernel) gives no AMX-INT8 tiles (amx_usable is false)"
DOTS = {"u8s8": "tdpbusd", "s8s8": "tdpbssd", "s8u8": "tdpbsud"}
"""The byte `TileProduct` precisions and their AMX instructions."""


def amx_int8_cpu():
    """This CPU with the int8 tiles (compile anywhere; run only where it has them)."""
    return cpu_from(None, "+amx-tile,+amx-int8")


def vnni_cpu():
    """This CPU without amx-int8: the vpdpbusd templates (or the widening path)."""
    return cpu_from(None, "-amx-int8")


@pytest.fixture(params=["amx", "loops"])
def mode(request, monkeypatch):
    """"amx": the tiles themselves (skipped without them); "loops": the same code with each
    tile product rendered as loops (the renderer told that the byte tiles need a feature no
    CPU has, while the templates still see the target's amx-tile and amx-int8)."""
    if request.param == "amx" and not HAS_AMX_INT8:
        pytest.skip(NO_AMX)
    if request.param == "loops":
        for precision in DOTS:
            name, needs = amx.TILE_DOTS[precision]
            monkeypatch.setitem(amx.TILE_DOTS, precision, (name, needs | {"no-such-feature"}))
    return request.param


def on_tiles(graph, mode: str, signed: bool, **options):
    """`graph` compiled for this CPU with the int8 tiles: its products are tile products of
    the activation's signedness (uint8: as A, or as B against the weights in blocks of Y^T),
    their instructions in the code only in mode "amx"."""
    compiled = dnnc.compile(graph, "llvm", cache=False, cpu=amx_int8_cpu(), **options)
    loop, asm = compiled.source("loop"), compiled.source("asm")
    used = [p for p in (("s8s8",) if signed else ("u8s8", "s8u8"))
            if f"tile_product_{p}" in loop]
    assert used and (signed or "tile_product_s8s8" not in loop)
    for precision in used:
        assert (DOTS[precision] in asm) == (mode == "amx"), precision
    return compiled


def on_vnni(graph):
    return dnnc.compile(graph, "llvm", cache=False, cpu=vnni_cpu())


# ---------------------------------------------------------------------------------------------
# which products take the tiles


def test_int8_products_take_the_tiles_where_the_target_has_amx_int8():
    """Compile only: a QuantizedDense and QuantizedConvPacked (a folded 3x3, 1x1 at stride 1
    as blocks of Y^T, a strided 1x1 and a 3x3 of many pixels as Y^T over taps, a 3x3 of fewer
    pixels than weight words a channel) take the AMX templates on a target with amx-tile and
    amx-int8, at fp32 and bf16; the same CPU without amx-int8 (or with amx-bf16 alone) keeps
    vpdpbusd's templates. A 1x1 on a pooled image (fewer pixels than a tile row) keeps them
    everywhere."""
    rng = np.random.default_rng(1)
    cases = [(dense_graph(rng, 5, 40, 20, np.uint8, "int8")[0], "amx_dense_int8", "dense_int8"),
             (conv_graph(rng, 1, 8, 9, 9, 20, 3, 1, 1, np.int8, np.int8)[0], "amx_conv_int8",
              "conv_int8"),
             (conv_graph(rng, 1, 16, 6, 6, 24, 1, 1, 0, np.uint8, None)[0],
              "amx_pointwise_int8", "conv_int8"),
             (conv_graph(rng, 1, 16, 6, 6, 24, 1, 2, 0, np.uint8, None)[0],
              "amx_conv_t_int8", "conv_int8"),
             (conv_graph(rng, 1, 64, 7, 7, 24, 3, 1, 1, np.uint8, None)[0], "amx_conv_int8",
              "conv_int8"),
             (conv_graph(rng, 1, 64, 14, 14, 32, 3, 1, 1, np.int8, None)[0],
              "amx_conv_t_int8", "conv_int8"),
             (conv_graph(rng, 2, 96, 1, 1, 24, 1, 1, 0, np.uint8, None)[0], "conv_int8",
              "conv_int8")]
    for graph, tiles, plain in cases:
        kernel = lower_group(graph.nodes, "k", outputs=graph.outputs)
        for precision in ("fp32", "bf16"):
            target = REGISTRY["llvm"].target(amx_int8_cpu(), precision)
            assert template_for(kernel, machine=target)[0].name == tiles
        for cpu in (vnni_cpu(), cpu_from(None, "+amx-tile,+amx-bf16,-amx-int8")):
            assert template_for(kernel, machine=REGISTRY["llvm"].target(cpu))[0].name == plain


def test_depthwise_int8_stays_off_the_tiles():
    from test_int8 import _conv_inputs

    from dnnc.ir.graph import Graph

    rng = np.random.default_rng(2)
    wq = rng.integers(-128, 128, (8, 1, 3, 3)).astype(np.int8)
    g = Graph("dw")
    x = g.add_input("x", T.TensorType(T.uint8, (1, 8, 7, 7)))
    ins = _conv_inputs(rng, x, np.uint8, wq, wq, (1e-4, 1e-3), np.uint8)
    g.outputs = [g.add("QuantizedConv", *ins, kernel_shape=[3, 3], strides=[1, 1],
                       pads=[1] * 4, group=8, lo=None, hi=None)]
    kernel = lower_group(g.nodes, "k", outputs=g.outputs)
    target = REGISTRY["llvm"].target(amx_int8_cpu())
    assert template_for(kernel, machine=target)[0].name == "depthwise_int8"


# ---------------------------------------------------------------------------------------------
# the tile dots and whole kernels, compiled for a Sapphire Rapids


@pytest.mark.parametrize("precision", list(DOTS))
def test_byte_tile_products_compile_to_their_dot(precision):
    asm = sapphire_rapids_assembly(tile_func(precision, m_tiles=2, n_tiles=2, steps=3))
    assert asm.count(DOTS[precision]) >= 4 and "ldtilecfg" in asm
    assert not any(dot in asm for dot in ("tdpbf16ps", *DOTS.values())
                   if dot != DOTS[precision])


def test_tile_product_accumulates_into_int32_places():
    func = tile_func("s8s8")
    L.verify(func)
    wrong = tile_func("bf16")
    with pytest.raises(L.LoopIRError, match="accumulates into int32"):
        L.verify(L.PrimFunc("f", wrong.params, L.TileProduct(
            "u8s8", wrong.body.c, wrong.body.a, wrong.body.b, wrong.body.c_row,
            wrong.body.a_layout, wrong.body.b_layout, 2, 2, 3)))


@pytest.mark.parametrize("case", ["dense-u8", "dense-s8-tail", "conv-3x3", "conv-stem",
                                  "pointwise", "pointwise-tail", "conv-t"])
def test_amx_int8_kernels_compile_for_sapphire_rapids(case):
    rng = np.random.default_rng(3)
    graph, dot = {
        "dense-u8": (lambda: dense_graph(rng, 20, 256, 48, np.uint8, "int8")[0], "tdpbusd"),
        "dense-s8-tail": (lambda: dense_graph(rng, 7, 100, 40, np.int8, "float32",
                                              zw="column")[0], "tdpbssd"),
        "conv-3x3": (lambda: conv_graph(rng, 1, 64, 9, 9, 40, 3, 1, 1, np.uint8, np.uint8)[0],
                     "tdpbusd"),
        "conv-stem": (lambda: conv_graph(rng, 1, 3, 15, 15, 16, 7, 2, 3, np.int8, np.int8)[0],
                      "tdpbssd"),
        "pointwise": (lambda: conv_graph(rng, 1, 64, 9, 9, 40, 1, 1, 0, np.int8, np.int8)[0],
                      "tdpbssd"),
        # k of 10 words, one step that deep: A's tiles configured 40 bytes wide, B's 10 rows
        "pointwise-tail": (lambda: conv_graph(rng, 1, 40, 9, 9, 40, 1, 1, 0, np.uint8,
                                              np.int8)[0], "tdpbsud"),
        "conv-t": (lambda: conv_graph(rng, 1, 64, 16, 16, 40, 3, 1, 1, np.uint8, np.int8)[0],
                   "tdpbsud")}[case]
    graph = graph()
    kernel = lower_group(graph.nodes, "k", outputs=graph.outputs)
    asm = sapphire_rapids_assembly(schedule_kernel(kernel, REGISTRY["llvm"].target(
        amx_int8_cpu())))
    assert dot in asm and "ldtilecfg" in asm and "tilestored" in asm


# ---------------------------------------------------------------------------------------------
# numerics (mode "loops" anywhere, "amx" on the tiles)


DENSE = [
    # (m, k, n, activation, output, weights' zero point, lo)
    (5, 37, 19, np.uint8, "int8", None, -100),      # k of one partial step, n one panel + 3
    (7, 64, 48, np.int8, "uint8", "scalar", None),  # one whole step, 3 panels (odd blocks)
    (3, 9, 33, np.int8, "float32", None, None),     # a float output, n 2 panels + 1
    (1, 3, 1, np.uint8, "int32", None, None),       # one row, k 3, one column
    (13, 130, 70, np.int8, "int8", "column", None),  # k 2 steps + a tail, per-column zw
    (40, 300, 100, np.uint8, "uint8", "column", None),  # rows over several blocks, k's tail
    (17, 1024, 64, np.int8, "int8", None, -20),     # k of whole steps only, a Clip's lo
]


@pytest.mark.parametrize("case", DENSE, ids=lambda c: "m{}k{}n{}_{}_{}_zw{}".format(
    c[0], c[1], c[2], np.dtype(c[3]).name, c[4], c[5]))
def test_dense_on_tiles_equals_the_reference_and_vnni(case, mode):
    m, k, n, act, out, zw, lo = case
    rng = np.random.default_rng(m * k * n)
    graph, x, want = dense_graph(rng, m, k, n, act, out, lo=lo, zw=zw)
    got = on_tiles(graph, mode, act is np.int8)(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(got, on_vnni(graph)(x))


CONVS = [
    # (n, c, h, w, m, k, stride, pad, activation, output)
    (1, 5, 9, 7, 19, 3, 1, 1, np.uint8, np.int8),      # odd channels (a quad part zero)
    (2, 16, 8, 8, 40, 1, 1, 0, np.int8, np.uint8),     # 1x1, 2 images, 3 panels
    (1, 3, 11, 11, 8, 3, 2, 1, np.int8, None),         # float output, stride 2, folded
    (1, 8, 7, 7, 33, 1, 2, 0, np.uint8, np.int8),      # a strided 1x1
    (1, 6, 10, 10, 16, 7, 2, 3, np.int8, np.int8),     # the stem's window, folded
    (1, 64, 9, 11, 36, 3, 1, 1, np.uint8, np.uint8),   # C4 16: weights in place, 1 step
    (1, 128, 7, 7, 20, 3, 2, 1, np.int8, np.int8),     # C4 32: in place, 2 steps, stride 2
    (1, 72, 6, 5, 24, 3, 1, 1, np.uint8, None),        # C4 18: copied, a tail step
    (3, 20, 5, 7, 13, 1, 1, 0, np.uint8, np.int8),     # 1x1, 3 images, a partial panel
    (1, 130, 10, 10, 40, 1, 1, 0, np.int8, np.int8),   # 1x1 of C4 33 (3 steps), 100 pixels
    (2, 64, 4, 4, 70, 1, 1, 0, np.uint8, None),        # 1x1 of one pixel tile, 5 channel tiles
    (2, 64, 12, 10, 40, 3, 1, 1, np.uint8, None),      # Y^T over taps: 2 images, M partial
    (2, 64, 20, 18, 24, 3, 2, 1, np.int8, np.int8),    # Y^T, stride 2: four phases
    (1, 40, 16, 16, 36, 5, 1, 2, np.uint8, np.int8),   # Y^T, 5x5, groups past C's in a step
]
"""The 1x1 stride-1 unpadded ones run as blocks of Y^T (amx_pointwise_int8), those of more
output pixels than weight words a channel as blocks of Y^T over taps (amx_conv_t_int8), the
rest on amx_conv_int8's implicit GEMM (pixel rows)."""


@pytest.mark.parametrize("case", CONVS, ids=lambda c: "n{}c{}_{}x{}_m{}k{}s{}p{}_{}".format(
    *c[:8], np.dtype(c[8]).name))
def test_conv_on_tiles_equals_the_reference_and_vnni(case, mode):
    n, c, h, w, m, k, stride, pad, act, out = case
    rng = np.random.default_rng(n * c * h * m * k)
    graph, x, want = conv_graph(rng, n, c, h, w, m, k, stride, pad, act, out)
    got = on_tiles(graph, mode, act is np.int8)(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(got, on_vnni(graph)(x))


def run_all(funcs, inputs, outputs_like):
    """Each PrimFunc compiled for this CPU (its tiles as `mode` says) and called on
    `inputs`, into outputs of `outputs_like`'s shapes and types."""
    target = host_target()
    mb = ModuleBuilder("configs", target.feature_set)
    for f in funcs:
        mb.add(f)
    jit = JITModule(str(mb), target, 2)
    results = []
    for f in funcs:
        outs = [np.zeros(like.shape, like.dtype) for like in outputs_like]
        arrays = inputs + outs
        entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
            jit.address(f"{f.name}_packed"))
        entry((ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays]),
              (ctypes.c_int64 * 1)())
        results.append(outs)
    return results


SPACE_CASES = {
    "dense": lambda rng: dense_graph(rng, 20, 100, 40, np.int8, "int8", zw="column"),
    "conv": lambda rng: conv_graph(rng, 2, 9, 7, 8, 20, 3, 2, 1, np.uint8, np.int8),
    "pointwise": lambda rng: conv_graph(rng, 2, 24, 6, 9, 40, 1, 1, 0, np.int8, np.int8),
    "conv_t": lambda rng: conv_graph(rng, 2, 36, 18, 16, 20, 3, 2, 1, np.uint8, np.int8),
}


@pytest.mark.parametrize("case", list(SPACE_CASES))
def test_every_config_of_the_space_equals_the_reference(case, mode):
    """Every config of the dense and pointwise spaces (1-3 x 1-3 tiles, units of 1-8 row
    and 1-128 column blocks) and of the conv space (tiles, folded or not, either order) built by
    `schedule_kernel(..., config=)` and run with mode's tiles: the reference's bits."""
    rng = np.random.default_rng(12)
    graph, x, want = SPACE_CASES[case](rng)
    kernel = lower_group(graph.nodes, "k", outputs=graph.outputs)
    machine = REGISTRY["llvm"].target(amx_int8_cpu())
    template, problem = template_for(kernel, machine=machine)
    assert template.name == f"amx_{case}_int8"
    configs = list(template.space(problem, machine).configs())
    assert len(configs) >= 8 and template.default(problem, machine) in configs
    funcs = []
    for k, config in enumerate(configs):
        func = schedule_kernel(kernel, machine, config=config)
        funcs.append(L.PrimFunc(f"k{k}", func.params, func.body, func.size_vars, func.attrs))
    inputs = [np.ascontiguousarray(v.const if v.const is not None else x)
              for v in kernel.inputs]
    for config, (got,) in zip(configs, run_all(funcs, inputs, [want])):
        assert np.array_equal(got, want), config


@pytest.mark.parametrize("threads", [2, 16])
@pytest.mark.parametrize("shape", [(1, 52, 10, 10, 40), (1, 576, 14, 14, 96),
                                   (1, 960, 7, 7, 160), (2, 16, 20, 20, 96)],
                         ids=lambda s: "n{}c{}_{}x{}_m{}".format(*s))
def test_pointwise_packs_for_each_thread_count_equal_the_reference(shape, threads, mode):
    """amx_pointwise_int8 scheduled for 2 and 16 threads (run on this host's pool): the
    image's chunks in row slices where they are fewer than the threads (13 rows in slices
    of 4, 144 of 36), W^T's tile rows spread over the packs, units pixel-major or not (the
    larger operand's), k of one step under 64 channels: the reference's bits."""
    import dataclasses

    n, c, h, w, m = shape
    rng = np.random.default_rng(c * m + threads)
    graph, x, want = conv_graph(rng, n, c, h, w, m, 1, 1, 0, np.uint8, np.int8)
    kernel = lower_group(graph.nodes, "k", outputs=graph.outputs)
    machine = dataclasses.replace(REGISTRY["llvm"].target(amx_int8_cpu()), threads=threads)
    assert template_for(kernel, machine=machine)[0].name == "amx_pointwise_int8"
    func = schedule_kernel(kernel, machine)
    inputs = [np.ascontiguousarray(v.const if v.const is not None else x)
              for v in kernel.inputs]
    (got,), = run_all([func], inputs, [want])
    assert np.array_equal(got, want)


def test_a_dynamically_quantized_transformer_on_tiles_equals_vnni(tmp_path, mode):
    """bert_tiny through onnxruntime's quantize_dynamic: every MatMulInteger on the tiles
    (uint8 activations), the outputs the vpdpbusd compile's bits and onnxruntime's within its
    float tolerance."""
    pytest.importorskip("onnxruntime")
    from dnnc import zoo
    from dnnc.testing.quantized_files import onnxruntime_outputs, quantize_dynamic

    model = zoo.build("bert_tiny", seq=16, vocab=512)
    path = quantize_dynamic(model, tmp_path, "bert_tiny")
    feeds = zoo.inputs_for(model, np.random.default_rng(21))
    compiled = on_tiles(str(path), mode, signed=False)
    got = compiled(**feeds)
    np.testing.assert_array_equal(got, on_vnni(str(path))(**feeds))
    want = onnxruntime_outputs(path, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("name,activations", [("resnet18", "int8"), ("mobilenet_v2", "uint8")])
def test_a_qdq_cnn_on_tiles_equals_onnxruntime_and_vnni(tmp_path, name, activations, mode):
    """A zoo CNN through onnxruntime's quantize_static (QDQ, per-channel weights): every
    product but the depthwise convs and the 1x1s on fewer than 16 pixels (conv_int8's rows)
    on the tiles (the stem and the 3x3s of few pixels on amx_conv_int8, strided 1x1s on
    amx_conv_t_int8, 1x1s on amx_pointwise_int8, the classifier on amx_dense_int8), the
    outputs onnxruntime's int8 outputs and the vpdpbusd compile's, bit for bit."""
    pytest.importorskip("onnxruntime")
    from dnnc import zoo
    from dnnc.testing.quantized_files import onnxruntime_outputs, quantize_static

    model = zoo.build(name, size=32)
    path = quantize_static(model, tmp_path, name, seed=3, activations=activations)
    feeds = zoo.inputs_for(model, np.random.default_rng(11))
    compiled = on_tiles(str(path), mode, signed=activations == "int8")
    rows = compiled.profile(*feeds.values(), repeat=1)
    templates = {r["template"] for r in rows}
    assert "amx_dense_int8" in templates and "dense_int8" not in templates
    few = _pointwise_convs_of_few_pixels(path)
    assert all(set(r["nodes"]) & few for r in rows if r["template"] == "conv_int8")
    assert all(any(name in r["nodes"] for r in rows if r["template"] == "conv_int8")
               for name in few)
    got = compiled(**feeds)
    assert np.array_equal(got, onnxruntime_outputs(path, feeds)[0])
    assert np.array_equal(got, on_vnni(str(path))(**feeds))


def _pointwise_convs_of_few_pixels(path) -> set[str]:
    """The names of the 1x1 stride-1 unpadded one-group Convs of a model file whose output
    has fewer than 16 pixels an image (at size 32, the last stages' 1 x 1 and 2 x 2)."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in model.graph.value_info}
    names = set()
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Conv" or list(attrs.get("kernel_shape", [])) != [1, 1] or \
                attrs.get("group", 1) != 1 or set(attrs.get("strides", [1])) != {1} or \
                set(attrs.get("pads", [0])) != {0}:
            continue
        _, _, h, w = dims[node.output[0]]
        if h * w < 16:
            names.add(node.name)
    return names


def squeeze_excitation_chain():
    """A float chain of 1x1 convs, 8 -> 40 -> 4 -> 24 -> 12 -> 96 channels (a
    squeeze-excitation's shapes), each followed by a Relu, on a 4 x 4 image (a tile row of
    pixels: on its pooled 1 x 1 they take vpdpbusd's rows, `int8.few_pixels`); the zoo's IR
    version (onnx's own default, 14 with onnx 1.23, is past what the AMX host's onnxruntime
    loads: 13)."""
    from onnx import TensorProto, helper, numpy_helper
    from dnnc.zoo import IR_VERSION

    rng = np.random.default_rng(5)
    chans, nodes, weights, prev = [8, 40, 4, 24, 12, 96], [], [], "x"
    for i, (c, m) in enumerate(zip(chans, chans[1:])):
        weights += [numpy_helper.from_array(rng.standard_normal((m, c, 1, 1)).astype(
            np.float32), f"w{i}"), numpy_helper.from_array(rng.standard_normal(m).astype(
                np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 96, 4, 4])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_kernels_of_several_tile_depths_compile_into_one_module(tmp_path):
    """Serial 1x1 convs of 8 to 40 input channels, each one step of its own depth
    (`TileProduct.tail`): compiled for a CPU with the tiles, every kernel keeps its own tile
    configuration (LLVM configures a tile register with one shape a function: inlined into
    the entry they ran out of tile registers, efficientnet_b0's squeeze-excitations on the
    AMX host); where the tiles run, the vpdpbusd compile's bits."""
    pytest.importorskip("onnxruntime")
    from dnnc.testing.quantized_files import quantize_static

    model = squeeze_excitation_chain()
    path = quantize_static(model, tmp_path, "se", seed=2)
    compiled = dnnc.compile(str(path), "llvm", cache=False, cpu=amx_int8_cpu())
    loop, asm = compiled.source("loop"), compiled.source("asm")
    assert loop.count("tail=") >= 4 and "tdpbssd" in asm
    if HAS_AMX_INT8:
        x = np.random.default_rng(8).standard_normal((1, 8, 4, 4)).astype(np.float32)
        assert np.array_equal(compiled(x), on_vnni(str(path))(x))
