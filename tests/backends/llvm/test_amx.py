"""AMX-BF16 tiles for the bf16 products on llvm (`amx_dense.py`, `amx_codegen.py`).

Three tiers:
- what runs anywhere: the choice (AMX templates where the target's features have the tiles,
  vdpbf16ps otherwise, never at fp32), the `TileProduct` node's checks, compile-only for a
  Sapphire Rapids (`tdpbf16ps`, `tdpbusd`), artifacts recording and refusing the tiles, and
  the host's tiles dropped where Linux refuses their state;
- numerics with `mode="loops"`: the AMX templates' code with each tile product rendered as
  loops of the same sums (`expand_tile_products`, as on a CPU without the tiles), so their
  packing, edges, epilogues and threading are checked on any CPU;
- numerics with `mode="amx"`: the same cases on the tiles themselves, skipped (with the
  reason) where `amx_usable` is false; `.devrun/amx_check.sh` runs them on the AMX host.

Accuracy: the exact product of the bf16-rounded operands, within fp32 accumulation's error
(k roundings of 2^-24, as test_bf16.py's vdpbf16ps tests), and whole models within
`model_error_bound("bf16")` of their fp32 reference.
"""

import ctypes
import dataclasses

import numpy as np
import pytest

import dnnc
from dnnc.backends.llvm import amx, cpu
from dnnc.backends.llvm.amx_dense import AmxConfig
from dnnc.backends.llvm.codegen import ModuleBuilder
from dnnc.backends.llvm.cpu import cpu_from, host_target
from dnnc.backends.llvm.schedules import schedule_kernel, template_for
from dnnc.backends.llvm.jit import JITModule
from dnnc.backends.registry import REGISTRY
from dnnc.compiler.artifact import read_manifest
from dnnc.errors import ArtifactError, ConfigError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.target import model_error_bound

from test_bf16 import SMALL, conv_model, conv_reference, matmul_model, reference

HAS_AMX = amx.amx_usable(host_target().feature_set)
NO_AMX = "this CPU (or its kernel) gives no AMX-BF16 tiles (amx_usable is false)"
TILES = "+amx-tile,+amx-bf16"


def amx_cpu():
    """This CPU with the bf16 tiles (compile anywhere; run only where it has them)."""
    return cpu_from(None, TILES)


@pytest.fixture(params=["amx", "loops"])
def mode(request, monkeypatch):
    """"amx": the tiles themselves (skipped without them); "loops": the same code with each
    tile product rendered as loops (the renderer told that bf16 tiles need a feature no CPU
    has, while the templates still see the target's amx-tile and amx-bf16)."""
    if request.param == "amx" and not HAS_AMX:
        pytest.skip(NO_AMX)
    if request.param == "loops":
        name, needs = amx.TILE_DOTS["bf16"]
        monkeypatch.setitem(amx.TILE_DOTS, "bf16", (name, needs | {"no-such-feature"}))
    return request.param


def compiled_with_tiles(model, mode: str, **options):
    compiled = dnnc.compile(model, "llvm", precision="bf16", cache=False, cpu=amx_cpu(),
                            **options)
    assert "tile_product_bf16" in compiled.source("loop")
    assert ("tdpbf16ps" in compiled.source("asm")) == (mode == "amx")
    return compiled


# ---------------------------------------------------------------------------------------------
# which products take the tiles


def test_tiles_where_the_target_has_them_vdpbf16ps_elsewhere_never_at_fp32():
    """Compile only (no tile instruction runs here): a MatMul, a 1x1 and a 3x3 conv take the
    AMX templates on a target with amx-tile and amx-bf16 at bf16 (test_amx_conv.py: every
    window); the same CPU without amx-bf16, and fp32 anywhere, never see a tile."""
    mm, _ = matmul_model(20, 70, 40, seed=1, bias=True)
    pointwise = conv_model(24, 40, 9, 1, 1, 0, seed=2)[0]
    conv3 = conv_model(8, 16, 10, 3, 1, 1, seed=3)[0]
    without = cpu_from(None, "-amx-bf16")
    for model in (mm, pointwise, conv3):
        loop = dnnc.compile(model, "llvm", precision="bf16", cache=False,
                            cpu=amx_cpu()).source("loop")
        assert "tile_product_bf16" in loop and "dot_bf16x2" not in loop
        for other in (dnnc.compile(model, "llvm", precision="bf16", cache=False, cpu=without),
                      dnnc.compile(model, "llvm", cache=False, cpu=amx_cpu())):
            assert "tile_product" not in other.source("loop")


def test_the_template_table_names_the_amx_templates():
    from test_knob_spaces import _kernel, matmul_bias_relu, pointwise_residual

    rng = np.random.default_rng(5)
    with_tiles = REGISTRY["llvm"].target(amx_cpu(), "bf16")
    without = REGISTRY["llvm"].target(cpu_from(None, "-amx-tile"), "bf16")
    for build, name, plain in ((matmul_bias_relu, "amx_dense", "dense"),
                               (lambda r: pointwise_residual(r, 11, 9, (2, 2)),
                                "amx_pointwise", "pointwise_gemm")):
        kernel = _kernel(rng, build, "bf16")[0]
        assert template_for(kernel, machine=with_tiles)[0].name == name
        assert template_for(kernel, machine=without)[0].name == plain
        assert template_for(kernel, machine=dataclasses.replace(
            with_tiles, precision="fp32"))[0].name == plain


def test_host_features_drop_tiles_linux_refuses(monkeypatch):
    features = "+avx512f,+amx-tile,+amx-bf16,+amx-int8,-amx-fp16"
    monkeypatch.setattr(cpu, "request_tile_state", lambda: False)
    assert cpu._without_refused_tiles(features) == \
        "+avx512f,-amx-tile,-amx-bf16,-amx-int8,-amx-fp16"
    assert cpu._without_refused_tiles("+avx512f,-amx-tile") == "+avx512f,-amx-tile"
    monkeypatch.setattr(cpu, "request_tile_state", lambda: True)
    assert cpu._without_refused_tiles(features) == features
    if not amx.amx_features(host_target().feature_set):
        assert not amx.request_tile_state()


def test_tile_features_follow_precision_and_features():
    tiles = frozenset({"amx-tile", "amx-bf16"})
    target = REGISTRY["llvm"].target(amx_cpu(), "bf16")
    assert amx.tile_features(target) == tiles
    assert amx.tile_features(dataclasses.replace(target, precision="fp32")) == frozenset()
    assert amx.tile_features(REGISTRY["llvm"].target(cpu_from(None, "-amx-bf16"),
                                                     "bf16")) == frozenset()
    assert not amx.amx_features(frozenset({"avx512bf16", "amx-tile"}))


# ---------------------------------------------------------------------------------------------
# the loop IR node and its code


def tile_func(precision: str = "bf16", m_tiles: int = 2, n_tiles: int = 2, steps: int = 3,
              accumulate: bool = True) -> L.PrimFunc:
    acc = L.TILE_PRECISIONS.get(precision, T.float32)
    c = L.Buffer("c", acc, (m_tiles * 16, n_tiles * 16))
    a = L.Buffer("a", T.uint32, (m_tiles * steps * 256,))
    b = L.Buffer("b", T.uint32, (steps * 16, n_tiles * 16))
    body = L.TileProduct(precision, c[0, 0], a[0], b[0, 0], n_tiles * 16,
                         (16, steps * 256, 256), (n_tiles * 16, 16, 16 * n_tiles * 16),
                         m_tiles, n_tiles, steps, accumulate)
    return L.PrimFunc(f"tiles_{precision}", (c, a, b), body)


def test_tile_product_is_checked():
    L.verify(tile_func())
    for bad, words in ((tile_func(m_tiles=3, n_tiles=2), "11 registers of 8"),
                       (tile_func(precision="fp8"), "unknown precision")):
        with pytest.raises(L.LoopIRError, match=words):
            L.verify(bad)
    func = tile_func()
    wrong = dataclasses.replace(func.body, c=L.Buffer("x", T.int32, (1024,))[0])
    with pytest.raises(L.LoopIRError, match="accumulates into float32"):
        L.verify(L.PrimFunc("f", func.params + (wrong.c.buffer,), wrong))
    assert "tile_product_bf16_2x2(c[0, 0] rows 32 +=" in str(func)


SAPPHIRE_RAPIDS = "+amx-tile,+amx-bf16,+amx-int8,+avx512f,+avx512bw,+avx512dq,+avx512vl," \
                  "+avx512bf16,+avx2,+fma"


def sapphire_rapids_assembly(func: L.PrimFunc) -> str:
    """`func` rendered for a CPU with every AMX feature and compiled (never run) by an LLVM
    target machine for cpu "sapphirerapids"; its assembly."""
    import llvmlite.binding as llvm

    from dnnc.backends.llvm.process import initialize

    initialize()
    features = frozenset(f[1:] for f in SAPPHIRE_RAPIDS.split(","))
    mb = ModuleBuilder("spr", features)
    mb.add(func)
    module = llvm.parse_assembly(str(mb))
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu="sapphirerapids", features=SAPPHIRE_RAPIDS, opt=2)
    assert machine.emit_object(module)
    return machine.emit_assembly(module)


@pytest.mark.parametrize("accumulate", [True, False])
def test_tile_product_compiles_to_tile_instructions_for_sapphire_rapids(accumulate):
    asm = sapphire_rapids_assembly(tile_func(accumulate=accumulate))
    for op in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored"):
        assert op in asm, op
    assert asm.count("tdpbf16ps") >= 4   # the 2 x 2 block's dots of a step
    assert ("tilezero" in asm) == (not accumulate)


def test_amx_template_compiles_for_sapphire_rapids():
    """A whole kernel of the AMX dense template (odd sizes, a fused epilogue)."""
    from test_knob_spaces import _kernel, matmul_bias_relu

    kernel = _kernel(np.random.default_rng(2), matmul_bias_relu, "bf16")[0]
    func = schedule_kernel(kernel, REGISTRY["llvm"].target(amx_cpu(), "bf16"))
    asm = sapphire_rapids_assembly(func)
    assert "tdpbf16ps" in asm and "ldtilecfg" in asm


# ---------------------------------------------------------------------------------------------
# artifacts


def test_artifact_records_tiles_and_a_cpu_without_them_refuses_it(tmp_path, monkeypatch):
    mm, _ = matmul_model(8, 40, 24, seed=4, bias=True)
    path = tmp_path / "amx.dnnc"
    dnnc.compile(mm, "llvm", precision="bf16", cache=False, cpu=amx_cpu()).save(path)
    assert read_manifest(path)["target"]["tiles"] == ["amx-bf16", "amx-tile"]
    if HAS_AMX:   # this machine has them: it runs the artifact
        x = np.random.default_rng(1).standard_normal((8, 40)).astype(np.float32)
        np.testing.assert_array_equal(dnnc.load(path)(x), dnnc.compile(
            mm, "llvm", precision="bf16", cache=False, cpu=amx_cpu())(x))
    host = cpu.host_target()
    without = ",".join("-" + f[1:] if f[1:] in amx.AMX_FEATURES else f
                       for f in host.features.split(","))
    monkeypatch.setattr(cpu, "host_target", lambda: dataclasses.replace(host,
                                                                        features=without))
    with pytest.raises(ArtifactError, match=r"products run on AMX tiles \(tdpbf16ps\); this "
                                            r"machine .* lacks amx-bf16, amx-tile"):
        dnnc.load(path)


def test_bf16_artifact_without_tiles_records_none(tmp_path):
    mm, _ = matmul_model(8, 40, 24, seed=4, bias=False)
    path = tmp_path / "vdp.dnnc"
    model = dnnc.compile(mm, "llvm", precision="bf16", cache=False,
                         cpu=cpu_from(None, "-amx-bf16"))
    model.save(path)
    assert read_manifest(path)["target"]["tiles"] == []
    x = np.random.default_rng(2).standard_normal((8, 40)).astype(np.float32)
    np.testing.assert_array_equal(dnnc.load(path)(x), model(x))


# ---------------------------------------------------------------------------------------------
# numerics (mode "loops" anywhere, "amx" on the tiles)


def dense_model(m: int, k: int, n: int, seed: int, epilogue: bool):
    """Y = X @ W (+ b, then Relu(Y) * 0.5 fused) with constant W and b, X [m, k] an input."""
    from onnx import TensorProto, helper, numpy_helper

    if not epilogue:
        return matmul_model(m, k, n, seed, bias=False)
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["P"]),
             helper.make_node("Add", ["P", "b"], ["Q"]),
             helper.make_node("Relu", ["Q"], ["R"]),
             helper.make_node("Mul", ["R", "half"], ["Y"])]
    graph = helper.make_graph(
        nodes, "mm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), inits[:2]


DENSE = [(1, 64, 10, True), (5, 47, 33, False), (17, 30, 16, True), (70, 96, 64, True),
         (33, 1024, 96, False), (130, 600, 100, True), (12, 513, 48, False),
         (200, 257, 130, True)]
"""(m, k, n, epilogue): one row; odd k and n; k of one partial step (15 pairs); rows over
several blocks, k whole steps plus a tail; k of whole steps only (no tail); several row and
column blocks, a partial last of each, with the bias + Relu + scale epilogue."""


@pytest.mark.parametrize("shape", DENSE, ids=lambda s: "x".join(map(str, s[:3])))
def test_dense_on_tiles_is_the_product_of_bf16_rounded_operands(shape, mode):
    m, k, n, epilogue = shape
    model, inits = dense_model(m, k, n, seed=m * 1000 + k, epilogue=epilogue)
    compiled = compiled_with_tiles(model, mode)
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    exact, rough = reference(x, inits), reference(x, inits, rounded=False)
    if epilogue:
        exact, rough = np.maximum(exact, 0) * 0.5, np.maximum(rough, 0) * 0.5
    got = compiled(x)
    tolerance = k * 2.0 ** -22 * np.abs(exact).max()
    np.testing.assert_allclose(got, exact, rtol=0, atol=tolerance)
    assert np.abs(got - rough).max() > tolerance   # the operands were rounded


POINTWISE = [(33, 64, 20, 1, 1, 0), (64, 48, 9, 1, 2, 0), (20, 40, 7, 1, 1, 0),
             (256, 64, 14, 1, 1, 0)]
"""(C, M, size, 1, stride, 0): odd channels, a strided 1x1 (ResNet's downsampling), odd
everything on a 7x7 image, a bottleneck's 256 -> 64."""


@pytest.mark.parametrize("shape", POINTWISE, ids=lambda s: "c{}m{}s{}st{}".format(
    *s[:3], s[4]))
def test_pointwise_conv_on_tiles_is_the_conv_of_bf16_rounded_operands(shape, mode):
    c, m, size = shape[:3]
    model, w, _ = conv_model(*shape, seed=c * 100 + m)
    compiled = compiled_with_tiles(model, mode)
    x = np.random.default_rng(size).standard_normal((1, c, size, size)).astype(np.float32)
    want = conv_reference(model, x, w)
    got = compiled(x)
    tolerance = c * 2.0 ** -22 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
    assert np.abs(got - conv_reference(model, x, w, rounded=False)).max() > tolerance


ZOO = ("bert_tiny", "resnet50")


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_on_tiles_within_the_contract(name, mode):
    """bert_tiny's projections and resnet50's 1x1 convs (and classifier) on the tiles, the
    rest as at bf16 elsewhere: every output within `model_error_bound("bf16")` of fp32."""
    from dnnc import zoo

    batch = 4 if name == "resnet50" else 1
    model = zoo.build(name, batch=batch, **SMALL[name])
    feeds = zoo.inputs_for(model, np.random.default_rng(sum(map(ord, name))))
    compiled = compiled_with_tiles(model, mode)
    got = compiled.run(*feeds.values())
    want = dnnc.compile(model, "numpy").run(*feeds.values())
    for g, w in zip(got, want):
        worst = np.abs(g.astype(np.float64) - w).max() / np.abs(w).max()
        assert 0 < worst <= model_error_bound("bf16"), f"{name}: {worst:.3g}"


# ---------------------------------------------------------------------------------------------
# the knob space


def amx_kernel(rng, build=None):
    from test_knob_spaces import _kernel, matmul_bias_relu

    return _kernel(rng, build or matmul_bias_relu, "bf16")


def pointwise(strides):
    """A 1x1 conv at bf16 with a residual Add and a Relu fused (their reads flat where the
    stride is 1), on a 9 x 11 image of 6 channels, 9 out (test_knob_spaces' case)."""
    from test_knob_spaces import pointwise_residual

    return lambda rng: pointwise_residual(rng, 9, 11, strides)


def test_space_holds_the_default_and_refuses_what_tiles_cannot_do():
    kernel = amx_kernel(np.random.default_rng(3))[0]
    machine = REGISTRY["llvm"].target(amx_cpu(), "bf16")
    template, problem = template_for(kernel, machine=machine)
    space = template.space(problem, machine)
    default = template.default(problem, machine)
    assert space.check(default) == default
    for config, words in ((AmxConfig("m", 3, 2, 1, 1), "8 tile registers"),
                          (AmxConfig("n", 3, 2, 1, 1), "8 tile registers"),
                          (AmxConfig("m", 1, 2, 4, 1), "unit_rows")):
        with pytest.raises(ConfigError, match=words):
            space.check(config)


def run_all(funcs, inputs, outputs_like):
    """Each PrimFunc compiled for this CPU (its tiles as `mode` says) and called on
    `inputs` (as test_knob_spaces.py's `_run_all`)."""
    target = host_target()
    mb = ModuleBuilder("configs", target.feature_set)
    for f in funcs:
        mb.add(f)
    jit = JITModule(str(mb), target, 2)
    results = []
    for f in funcs:
        outs = [np.full(like.shape, np.nan, np.float32) for like in outputs_like]
        arrays = inputs + outs
        entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
            jit.address(f"{f.name}_packed"))
        entry((ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays]),
              (ctypes.c_int64 * 1)())
        results.append(outs)
    return results


def heads_first(rng):
    from test_knob_spaces import matmul_heads_first

    return matmul_heads_first(rng)


CONFIG_CASES = {"matmul": None, "matmul-heads-first": heads_first,
                "pointwise": pointwise((1, 1)), "pointwise-strided": pointwise((2, 2))}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_every_config_of_the_space_matches_the_reference(case, mode):
    """Every config (blocks of Y or of Y^T, tiles of 1-3 x 1-2, units of 1-8 row blocks and
    1-128 column blocks) of a MatMul (3 x 7 rows, 45 deep, 37 wide, bias and Relu fused), a
    projection stored heads-first through its layout tail, and 1x1 convs (residual and Relu
    fused), built by `schedule_kernel(..., config=)` and run
    (with mode's tiles) against the graph's reference of the bf16 products."""
    rng = np.random.default_rng(11)
    kernel, inputs, want = amx_kernel(rng, CONFIG_CASES[case])
    machine = REGISTRY["llvm"].target(amx_cpu(), "bf16")
    template, problem = template_for(kernel, machine=machine)
    assert template.name == ("amx_pointwise" if "pointwise" in case else "amx_dense")
    configs = list(template.space(problem, machine).configs())
    assert {c.rows_along for c in configs} == {"m", "n"} and len(configs) >= 8
    funcs = []
    for k, config in enumerate(configs):
        func = schedule_kernel(kernel, machine, config=config)
        funcs.append(L.PrimFunc(f"k{k}", func.params, func.body, func.size_vars, func.attrs))
    for config, got in zip(configs, run_all(funcs, inputs, want)):
        for out, ref in zip(got, want):
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=str(config))


def test_default_blocks_y_transposed_for_convs_of_many_pixels_and_balances_units():
    from test_knob_spaces import conv_bias_relu

    from dnnc.backends.llvm import amx_dense

    machine = REGISTRY["llvm"].target(amx_cpu(), "bf16")
    rng = np.random.default_rng(6)
    cases = [(lambda r: conv_bias_relu(r, c=8, oc=20, k=1, h=12, w=12), "n"),   # 144 px, 4 pairs
             (lambda r: conv_bias_relu(r, c=64, oc=20, k=1, h=3, w=3), "m"),    # 9 px, 32 pairs
             (None, "m")]                                                       # a MatMul
    for build, along in cases:
        kernel = amx_kernel(rng, build)[0]
        template, problem = template_for(kernel, machine=machine)
        default = template.default(problem, machine)
        assert default.rows_along == along
        # Y^T: a unit's row blocks (output channels) outside, each plane written in order
        assert default.order == ("rows" if along == "n" else "columns")
    # bert-base's 768 x 768 at 128 tokens, 16 threads: 48 units in 3 full rounds
    assert amx_dense.unit_cols(4, 24, 16) == 2
    assert amx_dense.unit_cols(1, 300, 1) == 128   # one thread: the widest units
