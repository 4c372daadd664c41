"""convert_layout: constant dense and conv weights are packed once; meaning is preserved."""

import numpy as np
import pytest

import dnnc
from dnnc.errors import CompileError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.target import Target
from dnnc.passes.convert_layout import convert_layout

PANELS = (("pack_dense", 16), ("pack_conv", 16))   # the templates' defaults at 256 bits
CPU = Target("llvm", features="+avx,+avx2", layouts=("pack_dense", "pack_conv"), panels=PANELS)


def _graph(rng, op, b_const=True, **attrs):
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (5, 7)))
    shape = (11, 7) if attrs.get("transB") else (7, 11)
    bv = rng.standard_normal(shape).astype(np.float32)
    b = Value("b", T.TensorType(T.float32, shape), const=bv) if b_const else \
        g.add_input("b", T.TensorType(T.float32, shape))
    extra = [Value("c", T.TensorType(T.float32, (11,)),
                   const=rng.standard_normal(11).astype(np.float32))] if op == "Gemm" else []
    g.outputs = [g.add(op, a, b, *extra, **attrs)]
    return g


@pytest.mark.parametrize("op, attrs", [("MatMul", {}), ("Gemm", {}),
                                       ("Gemm", {"transB": 1, "alpha": 0.5, "beta": 2.0})])
def test_constant_weights_are_packed_and_results_kept(rng, op, attrs):
    g = _graph(rng, op, **attrs)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    before = dnnc.compile(g, target="numpy").run(x)[0]
    assert convert_layout(g, CPU) == 1
    g.verify()
    assert [n.op for n in g.nodes] == ["MatMulPacked"]
    assert g.nodes[0].inputs[1].type.shape == (1, 7, 16)        # one 16-column panel
    for target in ("numpy", "llvm"):
        np.testing.assert_allclose(dnnc.compile(g, target=target).run(x)[0], before,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op, attrs", [("MatMul", {}), ("Gemm", {"transB": 1, "beta": 2.0})])
def test_at_bf16_weights_are_rounded_once_in_pairs_along_k(rng, op, attrs):
    """precision bf16: B [K=7, N=11] as bf16 pairs [1 panel, 4 pairs, 16, 2] (K padded with a
    zero row), and the graph means the product of A and B rounded to bf16."""
    import dataclasses

    import ml_dtypes

    g = _graph(rng, op, **attrs)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    b = g.nodes[0].inputs[1].const
    b = b.T if attrs.get("transB") else b
    c = g.nodes[0].inputs[2].const * attrs.get("beta", 1.0) if op == "Gemm" else 0.0
    assert convert_layout(g, dataclasses.replace(CPU, precision="bf16")) == 1
    g.verify()
    node = g.nodes[0]
    assert node.op == "MatMulPacked" and node.attrs["precision"] == "bf16"
    packed = node.inputs[1]
    assert packed.type == T.TensorType(T.bfloat16, (1, 4, 16, 2))
    np.testing.assert_array_equal(packed.const[0, :, :11].transpose(0, 2, 1).reshape(8, 11)[:7],
                                  b.astype(ml_dtypes.bfloat16))
    assert not packed.const[0, 3, :, 1].astype(np.float32).any()   # k = 7: zero padding
    rounded = x.astype(ml_dtypes.bfloat16).astype(np.float64) @ \
        b.astype(ml_dtypes.bfloat16).astype(np.float64) + c
    for target in ("numpy", "llvm"):
        np.testing.assert_allclose(dnnc.compile(g, target=target).run(x)[0], rounded,
                                   rtol=1e-5, atol=1e-5)


def test_variable_weights_and_transposed_a_are_left_alone(rng):
    assert convert_layout(_graph(rng, "MatMul", b_const=False), CPU) == 0
    assert convert_layout(_graph(rng, "Gemm", transA=0, b_const=False), CPU) == 0
    assert convert_layout(_graph(rng, "MatMul"), Target("numpy")) == 0


def test_a_target_gets_the_layouts_it_lists_whatever_its_name(rng):
    """Layouts are keyed by their own names: the target's name chooses nothing."""
    assert convert_layout(_graph(rng, "MatMul"), Target("llvm", features="+avx2")) == 0
    convs_only = Target("llvm", features="+avx2", layouts=("pack_conv",), panels=PANELS)
    assert convert_layout(_graph(rng, "MatMul"), convs_only) == 0
    assert convert_layout(_conv_graph(rng), convs_only) == 1
    g = _graph(rng, "MatMul")
    assert convert_layout(g, Target("newcpu", features="+avx2", layouts=("pack_dense",),
                                    panels=PANELS)) == 1
    assert [n.op for n in g.nodes] == ["MatMulPacked"]


def test_a_layout_no_rewrite_implements_is_refused_by_name(rng):
    with pytest.raises(CompileError, match=r"target llvm wants layout\(s\) nchw16c, which "
                                           r"convert_layout does not know \(it knows "
                                           r"pack_dense, pack_conv, nhwc_conv, "
                                           r"winograd_conv, sparse_weights, tf32_dense, "
                                           r"int8_dense_rows\)"):
        convert_layout(_graph(rng, "MatMul"), Target("llvm", layouts=("pack_dense", "nchw16c")))


def _matmul_bias(rng, bias_shape, a_shape=(2, 5, 7), extra_use=False, const_bias=True):
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, a_shape))
    b = Value("b", T.TensorType(T.float32, (7, 11)),
              const=rng.standard_normal((7, 11)).astype(np.float32))
    c = Value("c", T.TensorType(T.float32, bias_shape),
              const=rng.standard_normal(bias_shape).astype(np.float32)) if const_bias else \
        g.add_input("c", T.TensorType(T.float32, bias_shape))
    y = g.add("MatMul", a, b)
    g.outputs = [g.add("Relu", g.add("Add", c, y))] + ([y] if extra_use else [])
    return g


@pytest.mark.parametrize("bias_shape", [(11,), (1, 1, 11), (1,), ()])
def test_an_nd_matmul_takes_its_bias_add_into_the_packed_op(rng, bias_shape):
    g = _matmul_bias(rng, bias_shape)
    x = rng.standard_normal((2, 5, 7)).astype(np.float32)
    before = dnnc.compile(g, target="numpy", opt_level=0).run(x)[0]
    assert convert_layout(g, CPU) == 1
    g.verify()
    assert [n.op for n in g.nodes] == ["MatMulPacked", "Relu"]
    assert g.nodes[0].inputs[2].type.shape == (11,)
    for target in ("numpy", "llvm"):
        compiled = dnnc.compile(g, target=target, opt_level=1)
        np.testing.assert_allclose(compiled.run(x)[0], before, rtol=1e-5, atol=1e-6)
    assert "fma(" in compiled.runtime.source("loop")      # the dense template, bias included


def test_a_bias_that_is_not_over_the_last_axis_stays_an_add(rng):
    for g in (_matmul_bias(rng, (5, 11)), _matmul_bias(rng, (2, 1, 11)),
              _matmul_bias(rng, (11,), extra_use=True), _matmul_bias(rng, (11,), const_bias=False)):
        assert convert_layout(g, CPU) == 1
        g.verify()
        assert [n.op for n in g.nodes] == ["MatMulPacked", "Add", "Relu"]
        assert len(g.nodes[0].inputs) == 2


def _conv_graph(rng, group=1, w_const=True, c=6, oc=20):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, c, 9, 8)))
    shape = (oc, c // group, 3, 3)
    wv = (rng.standard_normal(shape) * 0.3).astype(np.float32)
    w = Value("w", T.TensorType(T.float32, shape), const=wv) if w_const else \
        g.add_input("w", T.TensorType(T.float32, shape))
    b = Value("b", T.TensorType(T.float32, (oc,)), const=rng.standard_normal(oc).astype(
        np.float32))
    g.outputs = [g.add("Conv", x, w, b, pads=[1, 0, 1, 2], strides=[1, 2], group=group)]
    return g


@pytest.mark.parametrize("use_template", [True, False])
def test_constant_conv_weights_are_packed_in_channel_blocks(rng, monkeypatch, use_template):
    """ConvPacked keeps Conv's meaning through its reference, its template and, without the
    template, its compute rule (which unpacks the weights inside the loads)."""
    from dnnc.backends.llvm import schedules
    from dnnc.ir.ops.registry import Pattern

    if not use_template:
        monkeypatch.setitem(schedules.TEMPLATES, ("llvm", Pattern.OUT_FUSABLE),
                            (schedules.ROWS,))
    g = _conv_graph(rng)
    x = rng.standard_normal((2, 6, 9, 8)).astype(np.float32)
    before = dnnc.compile(g, target="numpy").run(x)[0]
    assert convert_layout(g, CPU) == 1
    g.verify()
    assert [n.op for n in g.nodes] == ["ConvPacked"]
    assert g.nodes[0].inputs[1].type.shape == (2, 6, 3, 3, 16)   # 20 channels: 2 blocks of 16
    for target in ("numpy", "llvm"):
        compiled = dnnc.compile(g, target=target, opt_level=1)
        np.testing.assert_allclose(compiled.run(x)[0], before, rtol=1e-5, atol=1e-5)
        if target == "llvm":
            assert ("acc = alloc" in compiled.source("loop")) == use_template


def test_depthwise_convs_and_variable_conv_weights_are_left_alone(rng):
    assert convert_layout(_conv_graph(rng, group=6, oc=6), CPU) == 0
    assert convert_layout(_conv_graph(rng, w_const=False), CPU) == 0


@pytest.mark.parametrize("use_template", [True, False])
@pytest.mark.parametrize("group,oc,shape", [
    (2, 20, (2, 3, 3, 3, 16)),    # 10 channels a group: 16 computed either way: the wider
    (2, 36, (6, 3, 3, 3, 8)),     # 18 a group: 3 blocks of 8 (24 computed), not 2 of 16 (32)
    (6, 12, (6, 1, 3, 3, 8)),     # two filters a channel (C / group = 1, not depthwise)
])
def test_grouped_conv_weights_are_packed_per_group(rng, monkeypatch, use_template, group, oc,
                                                   shape):
    """A grouped conv's blocks never straddle two groups; its reference, its template and
    its compute rule (the default schedule) keep Conv's meaning."""
    from dnnc.backends.llvm import schedules
    from dnnc.ir.ops.registry import Pattern

    if not use_template:
        monkeypatch.setitem(schedules.TEMPLATES, ("llvm", Pattern.OUT_FUSABLE),
                            (schedules.ROWS,))
    g = _conv_graph(rng, group=group, oc=oc)
    x = rng.standard_normal((2, 6, 9, 8)).astype(np.float32)
    before = dnnc.compile(g, target="numpy").run(x)[0]
    assert convert_layout(g, CPU) == 1
    g.verify()
    assert [n.op for n in g.nodes] == ["ConvPacked"]
    assert g.nodes[0].inputs[1].type.shape == shape
    for target in ("numpy", "llvm"):
        compiled = dnnc.compile(g, target=target, opt_level=1)
        np.testing.assert_allclose(compiled.run(x)[0], before, rtol=1e-5, atol=1e-5)
        if target == "llvm":
            assert ("acc = alloc" in compiled.source("loop")) == use_template


@pytest.mark.parametrize("group,oc,nr", [(2, 16, 8), (2, 32, 16), (2, 20, 16), (3, 24, 8)])
def test_on_avx512_a_grouped_conv_may_take_blocks_of_a_256_bit_vector(rng, group, oc, nr):
    """With 512-bit vectors (a panel of 32) a group's blocks may be 8 wide, one 256-bit
    vector: 8 channels a group computed as 8, not as 16 with 8 of zeros; a wider block on a
    tie (10 a group: 16 either way)."""
    target = Target("llvm", features="+avx2,+avx512f", layouts=("pack_conv",),
                    panels=(("pack_conv", 32),))
    g = _conv_graph(rng, group=group, oc=oc)
    x = rng.standard_normal((2, 6, 9, 8)).astype(np.float32)
    before = dnnc.compile(g, target="numpy").run(x)[0]
    assert convert_layout(g, target) == 1
    assert g.nodes[0].inputs[1].type.shape[-1] == nr
    compiled = dnnc.compile(g, target="llvm", opt_level=1)
    np.testing.assert_allclose(compiled.run(x)[0], before, rtol=1e-5, atol=1e-5)


def test_a_conv_of_at_most_one_vector_of_channels_is_packed_one_vector_wide(rng):
    g = _conv_graph(rng, oc=8)
    x = rng.standard_normal((2, 6, 9, 8)).astype(np.float32)
    before = dnnc.compile(g, target="numpy").run(x)[0]
    assert convert_layout(g, CPU) == 1
    assert g.nodes[0].inputs[1].type.shape == (1, 6, 3, 3, 8)     # 8 lanes, not 16
    np.testing.assert_allclose(dnnc.compile(g, target="llvm", opt_level=1).run(x)[0], before,
                               rtol=1e-5, atol=1e-5)


def _quantized_dense(rng, rows: int, k: int, n: int, w_zero_point: bool = False) -> Graph:
    """QuantizedDense(a [rows, k] uint8, weights in groups, per-column scales) -> uint8."""
    from dnnc.ir.ops.quantized import pack_groups

    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    g = Graph("q")
    a = g.add_input("a", T.TensorType(T.uint8, (rows, k)))

    def const(name, v):
        v = np.asarray(v)
        return Value(name, T.TensorType(T.DType.from_numpy(v.dtype), v.shape), const=v)

    ins = [a, const("za", np.uint8(rng.integers(0, 256))), const("w", pack_groups(w)),
           const("s", w.astype(np.int32).sum(0).astype(np.int32)),
           const("b", rng.integers(-500, 500, n).astype(np.int32)),
           const("sc", rng.uniform(1e-4, 1e-3, n).astype(np.float32)),
           const("yz", np.uint8(rng.integers(0, 256)))]
    if w_zero_point:
        ins.append(const("wz", np.int8(3)))
    g.outputs = [g.add("QuantizedDense", *ins, n=n, lo=None, hi=None)]
    return g


@pytest.mark.parametrize("k", [64, 37])
def test_int8_dense_rows_puts_the_weights_of_a_product_of_16_rows_in_rows(rng, k):
    """"int8_dense_rows" (cuda): a QuantizedDense of 16 rows or more without a weight zero
    point reads its weights in rows [n, k padded to 16], the same results bit for bit
    (reference and llvm's generic loops); fewer rows, or a weight zero point, keep the
    groups."""
    rows_target = Target("cuda", layouts=("int8_dense_rows",))
    g = _quantized_dense(rng, 16, k, 24)
    x = rng.integers(0, 256, (16, k)).astype(np.uint8)
    before = dnnc.compile(g, target="numpy").run(x)[0]
    assert convert_layout(g, rows_target) == 1
    g.verify()
    assert g.nodes[0].inputs[2].type.shape == (24, -(-k // 16) * 16)
    for target in ("numpy", "llvm"):
        assert np.array_equal(dnnc.compile(g, target=target, cache=False).run(x)[0], before)
    assert convert_layout(_quantized_dense(rng, 15, k, 24), rows_target) == 0
    assert convert_layout(_quantized_dense(rng, 16, k, 24, w_zero_point=True), rows_target) == 0
