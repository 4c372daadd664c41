"""Attention, RotaryEmbedding and SwiGLU: references against naive per-row loops in float64
(and onnxruntime for plain attention), inference with symbolic dims, the importers' opset
translations, and errors."""

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc.errors import ShapeError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph
from dnnc.ir.interpreter import run_graph

RNG = np.random.default_rng(90210)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _run(op, inputs, attrs=None, num_outputs=1):
    """One node through the interpreter (which checks dtype and shape against infer)."""
    g = Graph("t")
    values, feed = [], []
    for i, x in enumerate(inputs):
        if x is None:
            values.append(None)
            continue
        values.append(g.add_input(f"x{i}", T.TensorType(T.DType.from_numpy(x.dtype), x.shape)))
        feed.append(x)
    g.outputs = g.add_node(op, values, attrs or {}, num_outputs=num_outputs)
    g.verify()
    return run_graph(g, feed)


# -- Attention -------------------------------------------------------------------------------


def _naive_attention(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None, scale=None,
                     is_causal=0, q_num_heads=None, kv_num_heads=None, softcap=0.0, left=-1,
                     right=-1):
    """Y and the post-softmax probabilities, one query row at a time, in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    rank3 = q.ndim == 3
    if rank3:
        def heads(x, n):
            return x.reshape(x.shape[0], x.shape[1], n, -1).transpose(0, 2, 1, 3)
        q, k, v = heads(q, q_num_heads), heads(k, kv_num_heads), heads(v, kv_num_heads)
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        k = np.concatenate([past_k.astype(np.float64), k], axis=2)
        v = np.concatenate([past_v.astype(np.float64), v], axis=2)
    batch, heads_q, seq, size = q.shape
    total, group = k.shape[2], heads_q // k.shape[1]
    scale = 1 / math.sqrt(size) if scale is None else scale
    if mask is not None:
        mask = np.broadcast_to(mask, (batch, heads_q, seq, mask.shape[-1]))
    y = np.zeros((batch, heads_q, seq, v.shape[3]))
    probs = np.zeros((batch, heads_q, seq, total))
    for b in range(batch):
        for h in range(heads_q):
            for i in range(seq):
                pos = i + (past if past_k is not None else
                           nonpad[b] - seq if nonpad is not None else 0)
                logits, keys = [], []
                for j in range(total):
                    s = float(q[b, h, i] @ k[b, h // group, j]) * scale
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    ok = not (is_causal and j > pos) and not (0 <= left and j < pos - left) \
                        and not (0 <= right and j > pos + right) \
                        and not (nonpad is not None and j >= nonpad[b])
                    if mask is not None:
                        if j >= mask.shape[-1]:
                            ok = False
                        elif mask.dtype == np.bool_:
                            ok = ok and bool(mask[b, h, i, j])
                        else:
                            s += float(mask[b, h, i, j])
                            ok = ok and mask[b, h, i, j] != -np.inf
                    if ok:
                        logits.append(s)
                        keys.append(j)
                if not keys:
                    continue  # no attendable key: a zero row
                e = np.exp(np.array(logits) - max(logits))
                probs[b, h, i, keys] = e / e.sum()
                y[b, h, i] = probs[b, h, i] @ v[b, h // group]
    if rank3:
        y = y.transpose(0, 2, 1, 3).reshape(batch, seq, -1)
    return y, probs


ATTENTION_CASES = {
    # name: (q, k, v shapes, extra inputs builder, attrs)
    "mha": ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {}, {}),
    "gqa_scaled": ((2, 6, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8), {}, {"scale": 0.3}),
    "mqa_softcap": ((1, 4, 3, 8), (1, 1, 7, 8), (1, 1, 7, 4), {}, {"softcap": 2.0}),
    "causal": ((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4), {}, {"is_causal": 1}),
    "causal_past": ((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 6),
                    {"past": (1, 2, 4)}, {"is_causal": 1}),
    "bool_mask_short": ((2, 2, 3, 4), (2, 2, 6, 4), (2, 2, 6, 4),
                        {"mask": ((3, 4), np.bool_)}, {}),
    "float_mask_3d_causal": ((2, 3, 4, 4), (2, 3, 4, 4), (2, 3, 4, 4),
                             {"mask": ((3, 4, 4), np.float32)}, {"is_causal": 1}),
    "float_mask_4d_past": ((2, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4),
                           {"mask": ((2, 1, 3, 5), np.float32), "past": (2, 2, 2)}, {}),
    "nonpad_causal": ((3, 2, 2, 4), (3, 2, 6, 4), (3, 2, 6, 4), {"nonpad": [6, 4, 1]},
                      {"is_causal": 1}),
    "window_left": ((1, 2, 6, 4), (1, 2, 6, 4), (1, 2, 6, 4), {},
                    {"is_causal": 1, "left_window_size": 2}),
    "window_both_past": ((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), {"past": (1, 2, 3)},
                         {"left_window_size": 1, "right_window_size": 2}),
    "3d_gqa": ((2, 4, 24), (2, 5, 8), (2, 5, 12), {},
               {"q_num_heads": 6, "kv_num_heads": 2}),
    "3d_causal_past": ((1, 3, 16), (1, 3, 16), (1, 3, 8), {"past": (1, 4, 2)},
                       {"q_num_heads": 4, "kv_num_heads": 4, "is_causal": 1}),
}


def _attention_inputs(qs, ks, vs, extra, attrs):
    q, k, v = _rand(*qs), _rand(*ks), _rand(*vs)
    mask = past_k = past_v = nonpad = None
    if "mask" in extra:
        shape, dtype = extra["mask"]
        mask = RNG.random(shape) < 0.7 if dtype == np.bool_ else _rand(*shape)
    if "past" in extra:
        b, h, p = extra["past"]
        k_size = ks[-1] if len(ks) == 4 else ks[-1] // attrs["kv_num_heads"]
        v_size = vs[-1] if len(vs) == 4 else vs[-1] // attrs["kv_num_heads"]
        past_k, past_v = _rand(b, h, p, k_size), _rand(b, h, p, v_size)
    if "nonpad" in extra:
        nonpad = np.array(extra["nonpad"], np.int64)
    return [q, k, v, mask, past_k, past_v, nonpad]


@pytest.mark.parametrize("name", sorted(ATTENTION_CASES))
def test_attention_matches_a_naive_loop(name):
    qs, ks, vs, extra, attrs = ATTENTION_CASES[name]
    inputs = _attention_inputs(qs, ks, vs, extra, attrs)
    y, present_k, present_v, probs = _run("Attention", inputs,
                                          dict(attrs, qk_matmul_output_mode=3), num_outputs=4)
    want_y, want_probs = _naive_attention(
        *inputs, scale=attrs.get("scale"), is_causal=attrs.get("is_causal", 0),
        q_num_heads=attrs.get("q_num_heads"), kv_num_heads=attrs.get("kv_num_heads"),
        softcap=attrs.get("softcap", 0.0), left=attrs.get("left_window_size", -1),
        right=attrs.get("right_window_size", -1))
    assert y.dtype == np.float32 and not np.isnan(y).any()
    np.testing.assert_allclose(y, want_y, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(probs, want_probs, rtol=2e-5, atol=2e-6)
    assert present_k.shape[2] == probs.shape[3] == present_v.shape[2]
    if inputs[4] is not None:
        np.testing.assert_array_equal(present_k[:, :, :inputs[4].shape[2]], inputs[4])


def test_attention_qk_output_modes():
    q, k, v = _rand(1, 2, 3, 4), _rand(1, 2, 5, 4), _rand(1, 2, 5, 4)
    mask = _rand(3, 5)
    outs = [_run("Attention", [q, k, v, mask], {"softcap": 1.5, "qk_matmul_output_mode": m},
                 num_outputs=4)[3] for m in range(4)]
    raw = (q * 0.5) @ np.swapaxes(k, -1, -2)
    np.testing.assert_allclose(outs[0], raw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1], 1.5 * np.tanh(raw / 1.5), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[2], 1.5 * np.tanh(raw / 1.5) + mask, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[3].sum(-1), 1, rtol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = _rand(1, 1, 3, 4), _rand(1, 1, 4, 4), _rand(1, 1, 4, 4)
    q[0, 0, 1] = np.inf  # a masked row's logits are NaN: it must still be zero
    mask = np.array([[True, False, True, True], [False] * 4, [True] * 4])
    y, _, _, probs = _run("Attention", [q, k, v, mask], {"qk_matmul_output_mode": 3},
                          num_outputs=4)
    assert not np.isnan(y[0, 0, [0, 2]]).any()
    np.testing.assert_array_equal(y[0, 0, 1], 0)
    np.testing.assert_array_equal(probs[0, 0, 1], 0)
    # a negative causal offset (more queries than valid keys) masks the leading rows fully
    y, = _run("Attention", [q, k, v, None, None, None, np.array([2], np.int64)],
              {"is_causal": 1})
    np.testing.assert_array_equal(y[0, 0, 0], 0)


@pytest.mark.parametrize("dtype, precision", [(np.float16, None), (np.float16, T.float32),
                                              (T.bfloat16.np, None)])
def test_attention_half_precision_keeps_its_dtype(dtype, precision):
    q, k, v = _rand(1, 2, 3, 8, dtype=dtype), _rand(1, 2, 4, 8, dtype=dtype), \
        _rand(1, 2, 4, 8, dtype=dtype)
    y, = _run("Attention", [q, k, v], {"softmax_precision": precision, "is_causal": 1})
    want, _ = _naive_attention(q, k, v, is_causal=1)
    assert y.dtype == dtype
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=3e-2, atol=3e-2)


def test_attention_matches_onnxruntime():
    q, k, v = _rand(2, 4, 3, 8), _rand(2, 2, 5, 8), _rand(2, 2, 5, 8)
    mask = _rand(3, 5)
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], scale=0.4, softcap=3.0)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
        for n, a in zip("qkvm", (q, k, v, mask))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, dict(
                                    q=q, k=k, v=v, m=mask))[0]
    got = dnnc.compile(model, target="numpy")(q, k, v, mask)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attention_importer_translates_older_opsets():
    q, k, v = _rand(1, 2, 3, 4), _rand(1, 2, 3, 4), _rand(1, 2, 3, 4)
    # opset 23 ignored head counts on 4-D inputs; softmax_precision is an ONNX type code
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2,
                            kv_num_heads=2, softmax_precision=TensorProto.DOUBLE)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in "qkv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    compiled = dnnc.compile(model, target="numpy")
    attrs = compiled.graph.nodes[0].attrs
    assert attrs["q_num_heads"] is None and attrs["softmax_precision"] is T.float64
    np.testing.assert_allclose(compiled(q, k, v), _naive_attention(q, k, v)[0], rtol=1e-5)


def test_attention_infers_symbolic_shapes():
    g = Graph()
    q = g.add_input("q", T.TensorType(T.float32, ("B", "S", 32)))
    k = g.add_input("k", T.TensorType(T.float32, ("B", "L", 16)))
    v = g.add_input("v", T.TensorType(T.float32, ("B", "L", 24)))
    pk = g.add_input("pk", T.TensorType(T.float32, ("B", 2, "P", 8)))
    pv = g.add_input("pv", T.TensorType(T.float32, ("B", 2, "P", 12)))
    outs = g.add_node("Attention", [q, k, v, None, pk, pv],
                      {"q_num_heads": 4, "kv_num_heads": 2}, num_outputs=4)
    assert [o.type.shape for o in outs] == [
        ("B", "S", 48), ("B", 2, "(P+L)", 8), ("B", 2, "(P+L)", 12), ("B", 4, "S", "(P+L)")]
    g2 = Graph()
    q4 = g2.add_input("q", T.TensorType(T.float16, ("B", 8, "S", 64)))
    k4 = g2.add_input("k", T.TensorType(T.float16, ("B", 2, "L", 64)))
    (y,) = g2.add_node("Attention", [q4, k4, k4], {})
    assert y.type == T.TensorType(T.float16, ("B", 8, "S", 64))


def _attention_node(shapes, attrs, dtypes=None):
    g = Graph()
    dtypes = dtypes or [T.float32] * len(shapes)
    values = [None if s is None else g.add_input(f"x{i}", T.TensorType(d, s))
              for i, (s, d) in enumerate(zip(shapes, dtypes))]
    return g.add_node("Attention", values, attrs)


@pytest.mark.parametrize("shapes, attrs, dtypes, message", [
    ([(1, 4, 8)] * 3, {}, None, "need the q_num_heads"),
    ([(1, 2, 4, 8)] * 3, {"q_num_heads": 2, "kv_num_heads": 2}, None, "only valid for 3-D"),
    ([(1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)], {}, None, "not a multiple"),
    ([(1, 2, 4, 8), (1, 2, 4, 6), (1, 2, 4, 8)], {}, None, "head sizes differ"),
    ([(1, 2, 4, 8)] * 3 + [(4, 9)], {}, None, "longer than"),
    ([(1, 2, 4, 8)] * 3 + [None, (1, 2, 3, 8)], {}, None, "together"),
    ([(1, 2, 4, 8)] * 3 + [None, (1, 2, 3, 8), (1, 2, 3, 8), (1,)], {},
     [T.float32] * 6 + [T.int64], "cannot be combined"),
    ([(1, 2, 4, 8)] * 3, {"qk_matmul_output_mode": 4}, None, "qk_matmul_output_mode"),
    ([(1, 2, 4, 8)] * 3, {"left_window_size": -2}, None, "left_window_size"),
    ([(1, 2, 4, 8)] * 3, {}, [T.int32] * 3, "must be one of"),
])
def test_attention_rejects_bad_inputs(shapes, attrs, dtypes, message):
    with pytest.raises(ShapeError, match=message):
        _attention_node(shapes, attrs, dtypes)


# -- RotaryEmbedding -------------------------------------------------------------------------


def _naive_rotary(x, cos, sin, pos=None, interleaved=0, rot=0, num_heads=0):
    x = x.astype(np.float64)
    four = x.ndim == 4
    h = x.transpose(0, 2, 1, 3) if four else x.reshape(x.shape[0], x.shape[1], num_heads, -1)
    out = h.copy()
    rot = rot or h.shape[-1]
    half = rot // 2
    for b in range(h.shape[0]):
        for s in range(h.shape[1]):
            p = (b, s) if pos is None else (pos[b, s],)
            c, sn = cos[p], sin[p]
            for k in range(half):
                i, j = (2 * k, 2 * k + 1) if interleaved else (k, k + half)
                a, bb = h[b, s, :, i], h[b, s, :, j]
                out[b, s, :, i] = c[k] * a - sn[k] * bb
                out[b, s, :, j] = sn[k] * a + c[k] * bb
    return out.transpose(0, 2, 1, 3) if four else out.reshape(x.shape)


@pytest.mark.parametrize("shape, positions, interleaved, rot, num_heads", [
    ((2, 3, 5, 8), True, 0, 0, 0), ((2, 3, 5, 8), True, 1, 4, 0),
    ((2, 5, 12), False, 0, 0, 3), ((1, 4, 16), False, 1, 2, 2), ((2, 2, 3, 6), False, 0, 4, 0)])
def test_rotary_embedding_matches_a_naive_loop(shape, positions, interleaved, rot, num_heads):
    x = _rand(*shape)
    batch, seq = shape[0], (shape[2] if len(shape) == 4 else shape[1])
    head = shape[-1] if len(shape) == 4 else shape[-1] // num_heads
    half = (rot or head) // 2
    if positions:
        pos = RNG.integers(0, 10, (batch, seq)).astype(np.int64)
        cos, sin = _rand(10, half), _rand(10, half)
    else:
        pos, cos, sin = None, _rand(batch, seq, half), _rand(batch, seq, half)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot, "num_heads": num_heads}
    (got,) = _run("RotaryEmbedding", [x, cos, sin, pos], attrs)
    want = _naive_rotary(x, cos, sin, pos, interleaved, rot, num_heads)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rotary_embedding_errors_and_symbolic_shapes():
    g = Graph()
    x = g.add_input("x", T.TensorType(T.float32, ("B", "S", 32)))
    cos = g.add_input("c", T.TensorType(T.float32, ("B", "S", 4)))
    assert g.add("RotaryEmbedding", x, cos, cos, num_heads=4).type == x.type
    with pytest.raises(ShapeError, match="num_heads"):
        g.add("RotaryEmbedding", x, cos, cos)
    with pytest.raises(ShapeError, match="last dim"):
        g.add("RotaryEmbedding", x, cos, cos, num_heads=2)


# -- SwiGLU ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, alpha", [(np.float32, 1.0), (np.float64, 1.702),
                                          (np.float16, 0.5)])
def test_swiglu(dtype, alpha):
    a, b = _rand(3, 4, dtype=dtype), _rand(3, 4, dtype=dtype)
    (got,) = _run("SwiGLU", [a, b], {"alpha": alpha})
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 / (1 + np.exp(-alpha * a64)) * b64
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == np.float16 else 1e-6)
    g = Graph()
    x = g.add_input("x", T.TensorType(T.float32, ("N", 4)))
    y = g.add_input("y", T.TensorType(T.float32, (3, 5)))
    with pytest.raises(ShapeError, match="does not broadcast"):
        g.add("SwiGLU", x, y)



# -- compute rules ---------------------------------------------------------------------------
# Each rule, interpreted by NumPy over its loop IR, against the op's reference on fresh inputs.

from dnnc.ir.compute import apply_rule, evaluate, placeholder, run_rule  # noqa: E402
from dnnc.ir.graph import Value  # noqa: E402
from dnnc.ir.ops.registry import get_op, infer_node  # noqa: E402


def _rule_outputs(op, arrays, attrs, num_outputs=1, dims=None):
    """The rule's outputs; `dims` ({input: {axis: name}}) makes those input axes symbolic,
    their sizes bound only when the rule's tensors are evaluated."""
    if dims is None:
        return run_rule(op, arrays, attrs, num_outputs=num_outputs)
    values = [None if a is None else Value(f"in{k}", T.TensorType(
        T.DType.from_numpy(a.dtype), tuple(dims.get(k, {}).get(ax, n)
                                           for ax, n in enumerate(a.shape))))
        for k, a in enumerate(arrays)]
    types, _, full = infer_node(op, values, dict(attrs), num_outputs, op)
    sizes = {name: arrays[k].shape[ax] for k, m in dims.items() for ax, name in m.items()}
    tensors = [None if v is None else placeholder(v.name, v.type.dtype, v.type.shape)
               for v in values]
    return evaluate(apply_rule(op, tensors, full, types),
                    {f"in{k}": a for k, a in enumerate(arrays) if a is not None}, sizes)


def _check_rule(op, arrays, attrs=None, tol=1e-5, num_outputs=1, dims=None):
    attrs = dict(attrs or {})
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})[:num_outputs]
    got = _rule_outputs(op, arrays, attrs, num_outputs, dims)
    assert len(got) == num_outputs
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol, equal_nan=True)
    return got, want


def _fresh_inputs(rng, case, dtype=np.float32):
    """A case of ATTENTION_CASES on fresh random inputs, floats in `dtype`."""
    qs, ks, vs, extra, attrs = ATTENTION_CASES[case]
    inputs = _attention_inputs(qs, ks, vs, extra, attrs)
    return [x if x is None or x.dtype.kind in "bi" else
            rng.standard_normal(x.shape).astype(dtype) for x in inputs], attrs


@pytest.mark.parametrize("name", sorted(ATTENTION_CASES))
@pytest.mark.parametrize("mode", [0, 3])
def test_attention_rule(rng, name, mode):
    inputs, attrs = _fresh_inputs(rng, name)
    _check_rule("Attention", inputs, dict(attrs, qk_matmul_output_mode=mode), num_outputs=4)
    _check_rule("Attention", inputs, attrs)  # Y alone


@pytest.mark.parametrize("mode", range(4))
def test_attention_rule_qk_output_modes(rng, mode):
    inputs, _ = _fresh_inputs(rng, "float_mask_4d_past")
    attrs = {"softcap": 1.5, "qk_matmul_output_mode": mode, "is_causal": 1, "scale": 0.7}
    _check_rule("Attention", inputs, attrs, num_outputs=4)


@pytest.mark.filterwarnings("ignore:invalid value")
def test_attention_rule_int_mask_float64_and_empty_rows(rng):
    inputs, _ = _fresh_inputs(rng, "mha", np.float64)
    inputs[3] = RNG.integers(-3, 3, (4, 6))
    _check_rule("Attention", inputs, {"qk_matmul_output_mode": 2}, tol=1e-12, num_outputs=4)
    q, k, v = _rand(1, 1, 3, 4), _rand(1, 1, 4, 4), _rand(1, 1, 4, 4)
    q[0, 0, 1] = np.inf  # NaN logits in a fully masked row: still zeros
    mask = np.array([[True, False, True, True], [False] * 4, [True] * 4])
    got, _ = _check_rule("Attention", [q, k, v, mask], {"qk_matmul_output_mode": 3},
                         num_outputs=4)
    np.testing.assert_array_equal(got[0][0, 0, 1], 0)
    _check_rule("Attention", [q, k, v, None, None, None, np.array([2], np.int64)],
                {"is_causal": 1})  # leading rows see no valid key


@pytest.mark.parametrize("dtype, precision, total", [
    (np.float16, None, 6), (np.float16, T.float32, 6), (T.bfloat16.np, None, 40),
    (T.bfloat16.np, T.float32, 6)])
def test_attention_rule_half_precision_rounds_like_the_reference(dtype, precision, total):
    # bfloat16 rows are summed in bfloat16 as NumPy does: a float32 sum differs in ~20% of the
    # outputs by an ulp or more; an odd dot product may still round the other way
    q, k, v = _rand(2, 4, 5, 8, dtype=dtype), _rand(2, 2, total, 8, dtype=dtype), \
        _rand(2, 2, total, 8, dtype=dtype)
    mask = _rand(5, total).astype(dtype)
    got, want = _check_rule("Attention", [q, k, v, mask],
                            {"softmax_precision": precision, "is_causal": 1}, tol=3e-2)
    assert np.mean(got[0] != want[0]) < 0.03


def test_attention_rule_long_bfloat16_rows_sum_in_float32():
    bf16 = T.bfloat16.np
    q, k, v = _rand(1, 1, 2, 8, dtype=bf16), _rand(1, 1, 100, 8, dtype=bf16), \
        _rand(1, 1, 100, 8, dtype=bf16)
    (got,) = run_rule("Attention", [q, k, v], {})
    want, _ = _naive_attention(q, k, v)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name, dims", [
    ("causal_past", {0: {0: "B", 2: "S"}, 1: {0: "B", 2: "S"}, 2: {0: "B", 2: "S"},
                     4: {0: "B", 2: "P"}, 5: {0: "B", 2: "P"}}),
    ("bool_mask_short", {0: {0: "B"}, 1: {0: "B", 2: "L"}, 2: {0: "B", 2: "L"}}),
    ("nonpad_causal", {0: {0: "B"}, 1: {0: "B"}, 2: {0: "B"}, 6: {0: "B"}}),
    ("3d_gqa", {0: {0: "B", 1: "S", 2: "E"}, 1: {0: "B", 1: "L", 2: "F"},
                2: {0: "B", 1: "L"}}),  # symbolic head size: the scale is computed at run time
])
def test_attention_rule_with_symbolic_dims(rng, name, dims):
    inputs, attrs = _fresh_inputs(rng, name)
    _check_rule("Attention", inputs, dict(attrs, qk_matmul_output_mode=3), num_outputs=4,
                dims=dims)


ROTARY_RULE_CASES = [  # x shape, position_ids, interleaved, rotary_embedding_dim, num_heads
    ((2, 3, 5, 8), True, 0, 0, 0), ((2, 3, 5, 8), True, 1, 4, 0), ((2, 3, 5, 8), True, 0, 6, 0),
    ((2, 5, 12), False, 0, 0, 3), ((1, 4, 16), False, 1, 2, 2), ((2, 2, 3, 6), False, 0, 4, 0),
    ((1, 4, 24), True, 1, 0, 3)]


@pytest.mark.parametrize("shape, positions, interleaved, rot, num_heads", ROTARY_RULE_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, T.bfloat16.np])
def test_rotary_embedding_rule(rng, shape, positions, interleaved, rot, num_heads, dtype):
    batch, seq = shape[0], (shape[2] if len(shape) == 4 else shape[1])
    head = shape[-1] if len(shape) == 4 else shape[-1] // num_heads
    half = (rot or head) // 2
    x = rng.standard_normal(shape).astype(dtype)
    cache = (10, half) if positions else (batch, seq, half)
    cos, sin = (rng.standard_normal(cache).astype(dtype) for _ in range(2))
    pos = rng.integers(0, 10, (batch, seq)) if positions else None
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot, "num_heads": num_heads}
    # the same float32 arithmetic as the reference: equal to the last bit
    _check_rule("RotaryEmbedding", [x, cos, sin, pos], attrs, tol=0)


def test_rotary_embedding_rule_with_symbolic_batch_and_sequence(rng):
    x, cos, sin = (rng.standard_normal(s).astype(np.float32)
                   for s in ((2, 5, 12), (2, 5, 2), (2, 5, 2)))
    _check_rule("RotaryEmbedding", [x, cos, sin], {"num_heads": 3}, tol=0,
                dims={0: {0: "B", 1: "S"}, 1: {0: "B", 1: "S"}, 2: {0: "B", 1: "S"}})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, T.bfloat16.np])
def test_swiglu_rule(rng, dtype):
    a, b = (rng.standard_normal((3, 7)).astype(dtype) for _ in range(2))
    _check_rule("SwiGLU", [a, b], {"alpha": 1.702}, tol=0)
    _check_rule("SwiGLU", [a, b], {}, tol=0, dims={0: {0: "N"}, 1: {0: "N"}})
