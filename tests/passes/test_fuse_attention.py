"""fuse_attention: the attention chain as exporters write it becomes one FusedAttention node,
on targets whose fusion asks for it, and only where the fused node means what the chain
meant (the NumPy reference of the fused graph equals the unfused one on fresh random inputs).
Also the FusedAttention op itself: inference, its reference against its compute rule, FLOPs,
and that it is never exported."""

import math

import numpy as np
import pytest

from dnnc import zoo
from dnnc.backends.cuda import FUSION
from dnnc.errors import ExportError, ShapeError
from dnnc.frontend.onnx import import_onnx
from dnnc.frontend.onnx_export import to_onnx
from dnnc.ir import types as T
from dnnc.ir.compute import run_rule
from dnnc.ir.flops import node_flops
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.registry import get_op
from dnnc.ir.target import Target
from dnnc.passes.fuse_attention import fuse_attention
from dnnc.passes.manager import optimize, passes_at

CUDA_LIKE = Target("cuda", arch="sm_90", fusion=FUSION)   # (attention=True, store remaps)
LLVM_LIKE = Target("llvm")
F32 = T.float32


def _t(*shape, dtype=F32) -> T.TensorType:
    return T.TensorType(dtype, shape)


def _scalar(value: float, dtype=F32) -> Value:
    return Value(f"c{value}", T.TensorType(dtype, ()), const=np.array(value, dtype.np))


def chain(b=2, h=3, sq=5, sk=7, d=8, dv=6, scale="div", mask=(2, 1, 1, 7), k_form="kt",
          mask_first=False, dtype=F32, fill=None) -> Graph:
    """An attention chain: MatMul(Q, Kᵀ) -> scale -> [Where(causal, fill, .)] -> + mask ->
    Softmax -> MatMul(., V). `k_form`: "kt" (K given transposed), "transpose" (Transpose of
    K [.., sk, d] in the graph); `scale`: "div", "mul", "mul_left", "operands" (Q and Kᵀ each
    times √scale, as torch exports it), None; `mask_first`: the
    mask added before the scale (another function); `fill`: torch's masked_fill of the
    keys after each query (a constant [sq, sk] condition) by this value."""
    g = Graph("attention")
    q = g.add_input("q", _t(b, h, sq, d, dtype=dtype))
    if k_form == "kt":
        kt = g.add_input("kt", _t(b, h, d, sk, dtype=dtype))
    else:
        k = g.add_input("k", _t(b, h, sk, d, dtype=dtype))
        kt = g.add("Transpose", k, perm=[0, 1, 3, 2])
    v = g.add_input("v", _t(b, h, sk, dv, dtype=dtype))
    m = g.add_input("mask", _t(*mask, dtype=dtype)) if mask is not None else None
    if scale == "operands":   # torch's export of scaled_dot_product_attention: Q·√s, Kᵀ·√s
        root = _scalar(1 / math.sqrt(math.sqrt(d)), dtype)
        q, kt = g.add("Mul", q, root), g.add("Mul", root, kt)
    x = g.add("MatMul", q, kt)
    if mask_first and m is not None:
        x = g.add("Add", x, m)
    c = _scalar(math.sqrt(d), dtype) if scale == "div" else _scalar(1 / math.sqrt(d), dtype)
    if scale == "div":
        x = g.add("Div", x, c)
    elif scale == "mul":
        x = g.add("Mul", x, c)
    elif scale == "mul_left":
        x = g.add("Mul", c, x)
    if fill is not None:
        causal = np.triu(np.ones((sq, sk), bool), 1)
        x = g.add("Where", Value("causal", T.TensorType(T.bool_, (sq, sk)), const=causal),
                  _scalar(fill, dtype), x)
    if m is not None and not mask_first:
        x = g.add("Add", m, x) if scale == "mul_left" else g.add("Add", x, m)
    p = g.add("Softmax", x, axis=-1)
    g.outputs = [g.add("MatMul", p, v)]
    return g


def inputs_of(g: Graph, rng, masked: float | None = None) -> list[np.ndarray]:
    out = []
    for v in g.inputs:
        a = rng.standard_normal(v.type.shape).astype(v.type.dtype.np)
        if v.name == "mask" and masked is not None:
            a = np.where(rng.random(a.shape) < 0.3, masked, a).astype(a.dtype)
        out.append(a)
    return out


def fused(g: Graph, target=CUDA_LIKE) -> Graph:
    return optimize(g, target, 3, verify=True)


def ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


def same_meaning(g: Graph, h: Graph, rng, masked=None) -> None:
    xs = inputs_of(g, rng, masked)
    with np.errstate(all="ignore"):
        want, got = run_graph(g, xs)[0], run_graph(h, xs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


# -- matched --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,layers", [("bert_tiny", 2), ("bert_base", 1)])
def test_zoo_bert_attention_is_fused(name, layers, rng):
    model = zoo.build(name, seq=16, vocab=512, layers=layers)
    g = import_onnx(model)
    h = fused(g)
    assert ops(h).count("FusedAttention") == layers
    assert "Softmax" not in ops(h)
    node = next(n for n in h.nodes if n.op == "FusedAttention")
    assert node.attrs["k_transposed"] == 1   # the key projection stores heads-first, Kᵀ
    assert node.attrs["scale"] == pytest.approx(1 / math.sqrt(node.inputs[0].type.shape[-1]))
    assert len(node.inputs) == 4 and node.inputs[3].name == "extended_attention_mask"
    # the fused kernel stores through the heads' merge: Transpose and Reshape in its group
    group = next(grp for grp in h.groups if grp[0].op == "FusedAttention")
    assert [n.op for n in group] == ["FusedAttention", "Transpose", "Reshape"]
    feeds = zoo.inputs_for(model, rng)
    want = run_graph(g, list(feeds.values()))[0]
    got = run_graph(h, list(feeds.values()))[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bert_without_embeddings_has_no_mask(rng):
    g = import_onnx(zoo.build("bert_tiny", seq=16, embeddings=False))
    h = fused(g)
    nodes = [n for n in h.nodes if n.op == "FusedAttention"]
    assert len(nodes) == 2 and all(len(n.inputs) == 3 for n in nodes)


@pytest.mark.parametrize("variant", [
    {},                                              # Div by sqrt(d), mask [b, 1, 1, sk]
    {"scale": "mul"}, {"scale": "mul_left"},         # Mul by 1/sqrt(d), either side
    {"scale": None},                                 # no scale: 1
    {"scale": "operands"},                           # Q·√s and Kᵀ·√s, as torch writes it
    {"scale": "operands", "k_form": "transpose"},    # ... with Kᵀ a Transpose of K
    {"mask": None},                                  # no mask
    {"mask": (5, 7)},                                # a [sq, sk] mask (causal-like)
    {"mask": (2, 3, 5, 7)},                          # a full mask
    {"k_form": "transpose"},                         # Transpose(K) read through
    {"b": 1, "h": 1, "sq": 1, "sk": 1, "mask": (1, 1, 1, 1)},   # one query, one key
    {"fill": -np.inf, "mask": None},                 # GPT-2's causal masked_fill
    {"fill": -np.inf, "scale": "mul"},               # ... then a padding mask
    {"fill": float(np.finfo(np.float32).min)},       # HF's fill of the dtype's least
])
def test_variants_are_fused_and_mean_the_same(variant, rng):
    g = chain(**variant)
    h = fused(g)
    assert ops(h).count("FusedAttention") == 1
    assert not {"Softmax", "MatMul", "Transpose", "Mul", "Div"} & set(ops(h))
    node = next(n for n in h.nodes if n.op == "FusedAttention")
    assert node.attrs["k_transposed"] == (0 if variant.get("k_form") == "transpose" else 1)
    assert (len(node.inputs) == 5) == ("fill" in variant)
    assert "Where" not in ops(h)
    want_scale = 1.0 if "scale" in variant and variant["scale"] is None else 1 / math.sqrt(8)
    assert node.attrs["scale"] == pytest.approx(want_scale, rel=1e-6)
    same_meaning(g, h, rng)


@pytest.mark.parametrize("masked", [-np.inf, -1e4, np.finfo(np.float32).min])
def test_masks_of_minus_infinity_and_large_negatives_mean_the_same(masked, rng):
    """Masked keys of -inf (a row wholly masked: NaN in both), -10000 and float32's least."""
    g = chain(mask=(5, 7))
    h = fused(g)
    assert "FusedAttention" in ops(h)
    xs = inputs_of(g, rng, masked)
    xs[-1][2, :] = masked            # one query row with every key masked
    with np.errstate(all="ignore"):
        want, got = run_graph(g, xs)[0], run_graph(h, xs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(want).any() == (masked == -np.inf)


def test_the_pass_is_in_the_pipeline_before_fusion():
    names = passes_at(2)
    assert names.index("fuse_attention") < names.index("fuse_ops")
    assert "fuse_attention" not in passes_at(1)


# -- not matched ----------------------------------------------------------------------------------


def test_targets_that_do_not_ask_keep_the_chain():
    for target in (LLVM_LIKE, Target("cuda", arch="sm_90")):
        h = fused(chain(), target)
        assert "FusedAttention" not in ops(h) and "Softmax" in ops(h)


def _with_extra_output(g: Graph, op: str) -> Graph:
    node = next(n for n in g.nodes if n.op == op)
    g.outputs = g.outputs + [node.outputs[0]]
    return g


@pytest.mark.parametrize("make,why", [
    (lambda: chain(mask_first=True), "the mask added before the scale"),
    (lambda: _with_extra_output(chain(), "Softmax"), "the probabilities read elsewhere"),
    (lambda: _with_extra_output(chain(), "Div"), "the scores read elsewhere"),
    (lambda: chain(dtype=T.float64), "float64"),
    (lambda: chain(mask=(3, 2, 3, 5, 7)), "a mask that grows the scores"),
])
def test_chains_meaning_something_else_are_kept(make, why, rng):
    g = make()
    h = fused(g)
    assert "FusedAttention" not in ops(h), why
    assert "Softmax" in ops(h), why


def test_softmax_over_another_axis_is_kept():
    g = Graph("g")
    q = g.add_input("q", _t(2, 5, 8))
    kt = g.add_input("kt", _t(2, 8, 5))
    v = g.add_input("v", _t(2, 5, 4))
    p = g.add("Softmax", g.add("MatMul", q, kt), axis=1)
    g.outputs = [g.add("MatMul", p, v)]
    assert "FusedAttention" not in ops(fused(g))


def test_a_tensor_scale_or_a_broadcast_key_batch_is_kept():
    g = Graph("g")
    q = g.add_input("q", _t(2, 5, 8))
    kt = g.add_input("kt", _t(2, 8, 5))
    v = g.add_input("v", _t(2, 5, 4))
    s = Value("s", _t(5), const=np.arange(1, 6, dtype=np.float32))
    p = g.add("Softmax", g.add("Mul", g.add("MatMul", q, kt), s), axis=-1)
    g.outputs = [g.add("MatMul", p, v)]
    assert "FusedAttention" not in ops(fused(g))

    g = Graph("g")
    q = g.add_input("q", _t(2, 5, 8))
    kt = g.add_input("kt", _t(1, 8, 5))   # one K for both batches: broadcast
    v = g.add_input("v", _t(2, 5, 4))
    g.outputs = [g.add("MatMul", g.add("Softmax", g.add("MatMul", q, kt), axis=-1), v)]
    assert "FusedAttention" not in ops(fused(g))


def test_a_where_keeping_the_scores_where_true_is_kept():
    """Where(keep, scores, fill): the condition's other sense, not torch's masked_fill."""
    g = Graph("g")
    q = g.add_input("q", _t(2, 5, 8))
    kt = g.add_input("kt", _t(2, 8, 5))
    v = g.add_input("v", _t(2, 5, 4))
    keep = Value("keep", T.TensorType(T.bool_, (5, 5)), const=np.tril(np.ones((5, 5), bool)))
    x = g.add("Where", keep, g.add("MatMul", q, kt), _scalar(-np.inf))
    g.outputs = [g.add("MatMul", g.add("Softmax", x, axis=-1), v)]
    assert "FusedAttention" not in ops(fused(g))


def test_a_divisor_of_zero_is_kept():
    g = Graph("g")
    q = g.add_input("q", _t(2, 5, 8))
    kt = g.add_input("kt", _t(2, 8, 5))
    v = g.add_input("v", _t(2, 5, 4))
    x = g.add("Div", g.add("MatMul", q, kt), _scalar(0.0))
    g.outputs = [g.add("MatMul", g.add("Softmax", x, axis=-1), v)]
    assert "FusedAttention" not in ops(fused(g))


def test_a_scaled_operand_read_elsewhere_keeps_its_product(rng):
    g = Graph("g")
    q = g.add_input("q", _t(2, 5, 8))
    kt = g.add_input("kt", _t(2, 8, 5))
    v = g.add_input("v", _t(2, 5, 4))
    qs = g.add("Mul", q, _scalar(0.5))
    ks = g.add("Div", kt, _scalar(4.0))
    x = g.add("MatMul", qs, ks)
    g.outputs = [g.add("MatMul", g.add("Softmax", x, axis=-1), v), qs]
    h = fused(g)
    node = next(n for n in h.nodes if n.op == "FusedAttention")
    # Q·0.5 stays (an output reads it), Kᵀ/4 joins the scale
    assert node.inputs[0].producer.op == "Mul" and node.inputs[1].name == "kt"
    assert node.attrs["scale"] == pytest.approx(0.25)
    same_meaning(g, h, rng)


def test_the_pass_alone_changes_nothing_without_the_flag():
    g = chain()
    before = str(g)
    fuse_attention(g, LLVM_LIKE)
    assert str(g) == before


# -- the op --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k_transposed", [0, 1])
@pytest.mark.parametrize("mask_shape", [None, (3, 1, 7), (5, 7)])
@pytest.mark.parametrize("drop_shape", [None, (5, 7)])
def test_reference_and_compute_rule_agree(k_transposed, mask_shape, drop_shape, rng):
    q = rng.standard_normal((3, 5, 4)).astype(np.float32)
    k = rng.standard_normal((3, 7, 4)).astype(np.float32)
    v = rng.standard_normal((3, 7, 6)).astype(np.float32)
    arrays = [q, np.swapaxes(k, -1, -2).copy() if k_transposed else k, v, None, None]
    if mask_shape is not None:
        arrays[3] = rng.standard_normal(mask_shape).astype(np.float32)
    if drop_shape is not None:
        arrays[4] = rng.random(drop_shape) < 0.3
    attrs = {"scale": 0.3, "k_transposed": k_transposed, "fill": -2.5}
    want = get_op("FusedAttention").run(arrays, attrs)[0]
    scores = q @ np.swapaxes(k, -1, -2) * np.float32(0.3)
    if drop_shape is not None:
        scores = np.where(arrays[4], np.float32(-2.5), scores)
    if mask_shape is not None:
        scores = scores + arrays[3]
    e = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(want, e / e.sum(-1, keepdims=True) @ v, rtol=1e-5, atol=1e-6)
    got = run_rule("FusedAttention", arrays, attrs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shapes,message", [
    (((2, 5, 4), (2, 7, 3), (2, 7, 6)), "head size"),
    (((2, 5, 4), (2, 7, 4), (2, 8, 6)), "keys"),
    (((2, 5, 4), (3, 7, 4), (3, 7, 6)), "batch dims"),
    (((2, 5, 4), (2, 7, 4), (2, 7, 6), (4, 2, 5, 7)), "mask .* without growing"),
])
def test_inference_refuses_mismatched_operands(shapes, message):
    g = Graph("g")
    xs = [g.add_input(f"x{k}", _t(*s)) for k, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=message):
        g.add("FusedAttention", *xs, scale=1.0)


def test_drop_is_boolean_and_does_not_grow_the_scores():
    g = Graph("g")
    q, k, v = (g.add_input(n, _t(2, 5, 4)) for n in "qkv")
    with pytest.raises(ShapeError, match="drop"):
        g.add("FusedAttention", q, k, v, None, g.add_input("d", _t(5, 5)), scale=1.0)
    with pytest.raises(ShapeError, match="drop .* without growing"):
        g.add("FusedAttention", q, k, v, None, g.add_input("b", _t(3, 2, 5, 5, dtype=T.bool_)),
              scale=1.0)


def test_symbolic_dims_are_kept():
    g = Graph("g")
    q = g.add_input("q", _t("N", 12, "S", 64))
    k = g.add_input("k", _t("N", 12, "S", 64))
    v = g.add_input("v", _t("N", 12, "S", 64))
    assert g.add("FusedAttention", q, k, v, scale=0.125).type == _t("N", 12, "S", 64)


def test_flops_count_the_chain_it_replaces():
    g = chain()
    h = fused(g)
    fused_node = next(n for n in h.nodes if n.op == "FusedAttention")
    chain_flops = sum((node_flops(n).value for n in g.nodes), 0)
    assert node_flops(fused_node).value == chain_flops


def test_fused_graphs_are_not_exported():
    h = fused(chain())
    with pytest.raises(ExportError, match="FusedAttention"):
        to_onnx(h)
