"""Normalization ops and Dropout: references against naive loops and onnxruntime (including
the importers of older opsets), symbolic-dim inference, errors, and the compute rules against
the references."""

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import dnnc
from dnnc.errors import DNNCError, ShapeError
from dnnc.frontend.onnx import ONNX_FROM_DTYPE
from dnnc.ir import types as T
from dnnc.ir.compute import NoCompute, apply_rule, evaluate, placeholder, run_rule
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.ops.registry import get_op, infer_node

RNG = np.random.default_rng(90210)


def _rand(*shape, dtype=np.float32, lo=None):
    x = RNG.standard_normal(shape) if lo is None else RNG.uniform(lo, lo + 1.5, shape)
    return x.astype(dtype)


def _elem(a):
    return ONNX_FROM_DTYPE[T.DType.from_numpy(a.dtype).name]


def _model(op, inputs, outputs, attrs, opset, out_elem=None):
    """A one-node model; `inputs` is a list of (name, array) with "" for absent inputs."""
    while inputs and not inputs[-1][0]:
        inputs = inputs[:-1]
    node = helper.make_node(op, [n for n, _ in inputs], outputs, **attrs)
    ins = [helper.make_tensor_value_info(n, _elem(a), a.shape) for n, a in inputs if n]
    elem = out_elem or _elem(inputs[0][1])
    outs = [helper.make_tensor_value_info(o, elem, None) for o in outputs if o]
    graph = helper.make_graph([node], "t", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model, [a for n, a in inputs if n]


def _dnnc(op, inputs, outputs=("y",), attrs=None, opset=22):
    model, args = _model(op, inputs, list(outputs), attrs or {}, opset)
    return dnnc.compile(model, target="numpy").run(*args)


def _ort(op, inputs, outputs=("y",), attrs=None, opset=22):
    model, args = _model(op, inputs, list(outputs), attrs or {}, opset)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run([o for o in outputs if o], {n: a for n, a in inputs if n})


def _same(got, want, rtol=1e-5, atol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                   rtol=rtol, atol=atol)


def _infer(op, types, attrs=None, num_outputs=1):
    g = Graph("t")
    values = [None if t is None else g.add_input(f"x{i}", t) for i, t in enumerate(types)]
    return [v.type for v in g.add_node(op, values, attrs or {}, num_outputs=num_outputs)]


def _run(op, inputs, attrs=None, num_outputs=1):
    g = Graph("t")
    values = [None if x is None else g.add_input(f"x{i}", T.TensorType(
        T.DType.from_numpy(x.dtype), x.shape)) for i, x in enumerate(inputs)]
    g.outputs = g.add_node(op, values, attrs or {}, num_outputs=num_outputs)
    return run_graph(g, [x for x in inputs if x is not None])


# -- BatchNormalization --------------------------------------------------------------------------


def _bn_inputs(n=2, c=3, spatial=(4, 5), per_activation=False):
    stats = (c,) + spatial if per_activation else (c,)
    return [("x", _rand(n, c, *spatial)), ("s", _rand(*stats)), ("b", _rand(*stats)),
            ("m", _rand(*stats)), ("v", _rand(*stats, lo=0.2))]


def test_batch_norm_inference_naive():
    inputs = _bn_inputs()
    x, s, b, m, v = (a for _, a in inputs)
    (y,) = _dnnc("BatchNormalization", inputs, attrs={"epsilon": 1e-3})
    want = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        c = idx[1]
        want[idx] = s[c] * (x[idx] - m[c]) / math.sqrt(v[c] + 1e-3) + b[c]
    _same([y], [want], rtol=1e-5)


def test_batch_norm_training_naive():
    inputs = _bn_inputs(n=3, c=2, spatial=(4,))
    x, s, b, m, v = (a for _, a in inputs)
    y, rm, rv = _dnnc("BatchNormalization", inputs, ("y", "rm", "rv"),
                      {"training_mode": 1, "momentum": 0.8}, opset=15)
    for c in range(2):
        vals = x[:, c].ravel().astype(np.float64)
        mean, var = vals.mean(), ((vals - vals.mean()) ** 2).mean()
        np.testing.assert_allclose(rm[c], m[c] * 0.8 + mean * 0.2, rtol=1e-5)
        np.testing.assert_allclose(rv[c], v[c] * 0.8 + var * 0.2, rtol=1e-5)
        np.testing.assert_allclose(y[:, c], s[c] * (x[:, c] - mean) / np.sqrt(var + 1e-5)
                                   + b[c], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset,attrs", [(6, {"is_test": 1}), (7, {}), (9, {}),
                                         (14, {}), (15, {"epsilon": 0.01})])
def test_batch_norm_importers_against_onnxruntime(opset, attrs):
    """Every opset's inference form against onnxruntime (which starts at opset 7)."""
    inputs = _bn_inputs()
    ort_attrs = {k: v for k, v in attrs.items() if k != "is_test"}
    _same(_dnnc("BatchNormalization", inputs, attrs=attrs, opset=opset),
          _ort("BatchNormalization", inputs, attrs=ort_attrs, opset=max(opset, 7)),
          rtol=1e-5, atol=1e-5)


def test_batch_norm_spatial_0_per_activation():
    inputs = _bn_inputs(c=2, spatial=(3,), per_activation=True)
    x, s, b, m, v = (a for _, a in inputs)
    (y,) = _dnnc("BatchNormalization", inputs, attrs={"spatial": 0}, opset=7)
    _same([y], [s * (x - m) / np.sqrt(v + 1e-5) + b], rtol=1e-5, atol=1e-6)


def test_batch_norm_old_training_outputs_running_stats():
    inputs = _bn_inputs(n=4, c=3, spatial=(2,))
    new = _dnnc("BatchNormalization", inputs, ("y", "rm", "rv"), {"training_mode": 1}, 15)
    old = _dnnc("BatchNormalization", inputs, ("y", "rm", "rv"), {}, opset=9)
    _same(old, new)
    with pytest.raises(DNNCError, match="saved_mean"):
        _dnnc("BatchNormalization", inputs, ("y", "rm", "rv", "sm", "sv"), {}, opset=9)


def test_batch_norm_float16_and_symbolic_batch():
    inputs = [(n, a.astype(np.float16)) for n, a in _bn_inputs()]
    (y,) = _dnnc("BatchNormalization", inputs)
    (want,) = _dnnc("BatchNormalization", [(n, a.astype(np.float32)) for n, a in inputs])
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, want, atol=1e-2, rtol=1e-2)
    f = T.float32
    types = [T.TensorType(f, ("N", 3, "H", "W"))] + [T.TensorType(f, (3,))] * 4
    assert _infer("BatchNormalization", types)[0].shape == ("N", 3, "H", "W")
    out = _infer("BatchNormalization", types, {"training_mode": 1}, 3)
    assert out[1] == T.TensorType(f, (3,))


def test_batch_norm_errors():
    f = T.float32
    x = T.TensorType(f, ("N", 3, 4))
    with pytest.raises(ShapeError, match="input 1"):
        _infer("BatchNormalization", [x, T.TensorType(f, (4,))] + [T.TensorType(f, (3,))] * 3)
    with pytest.raises(ShapeError, match="training_mode=1"):
        _infer("BatchNormalization", [x] + [T.TensorType(f, (3,))] * 4, {}, 3)


# -- Instance, Layer, Group, RMS normalization -------------------------------------------------


def test_instance_norm_naive_and_ort():
    x, s, b = _rand(2, 3, 4, 5), _rand(3), _rand(3)
    (y,) = _dnnc("InstanceNormalization", [("x", x), ("s", s), ("b", b)])
    want = np.empty_like(x)
    for n in range(2):
        for c in range(3):
            vals = x[n, c].astype(np.float64)
            want[n, c] = s[c] * (vals - vals.mean()) / np.sqrt(vals.var() + 1e-5) + b[c]
    _same([y], [want], rtol=1e-4, atol=1e-5)
    inputs = [("x", x), ("s", s), ("b", b)]
    _same(_dnnc("InstanceNormalization", inputs, attrs={"epsilon": 0.1}, opset=6),
          _ort("InstanceNormalization", inputs, attrs={"epsilon": 0.1}, opset=6),
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,axis,bias", [((2, 3, 4), -1, True), ((2, 3, 4), 1, False),
                                             ((5, 6), 0, True), ((2, 3, 2, 2), -3, True)])
def test_layer_norm_against_onnxruntime(shape, axis, bias):
    x = _rand(*shape)
    inputs = [("x", x), ("w", _rand(*shape[axis:])), ("b" if bias else "", _rand(*shape[axis:]))]
    outputs = ("y", "mean", "inv_std")
    attrs = {"axis": axis, "epsilon": 1e-3}
    _same(_dnnc("LayerNormalization", inputs, outputs, attrs, 17),
          _ort("LayerNormalization", inputs, outputs, attrs, 17), rtol=1e-4, atol=1e-5)


def test_layer_norm_naive_float64_and_stash():
    x = _rand(3, 4, dtype=np.float64)
    w, b = _rand(4, dtype=np.float64), _rand(4, dtype=np.float64)
    y, mean, inv = _dnnc("LayerNormalization", [("x", x), ("w", w), ("b", b)],
                         ("y", "m", "i"), {"stash_type": 11}, 17)
    assert y.dtype == np.float64 and mean.dtype == np.float64
    for r in range(3):
        mu = sum(x[r]) / 4
        sd = math.sqrt(sum((v - mu) ** 2 for v in x[r]) / 4 + 1e-5)
        np.testing.assert_allclose(y[r], (x[r] - mu) / sd * w + b, rtol=1e-12)
        np.testing.assert_allclose([mean[r, 0], inv[r, 0]], [mu, 1 / sd], rtol=1e-12)
    f = T.float16
    out = _infer("LayerNormalization", [T.TensorType(f, ("N", "S", 8)), T.TensorType(f, (8,))],
                 {"axis": -1}, 3)
    assert out[0].shape == ("N", "S", 8) and out[1] == T.TensorType(T.float32, ("N", "S", 1))


def test_rms_norm_naive():
    x, w = _rand(2, 3, 4), _rand(3, 4)
    (y,) = _dnnc("RMSNormalization", [("x", x), ("w", w)], attrs={"axis": -2}, opset=23)
    for n in range(2):
        rms = math.sqrt(sum(float(v) ** 2 for v in x[n].ravel()) / 12 + 1e-5)
        np.testing.assert_allclose(y[n], x[n] / rms * w, rtol=1e-5)
    out = _infer("RMSNormalization", [T.TensorType(T.float32, ("B", 7)),
                                      T.TensorType(T.float32, (7,))])
    assert out[0].shape == ("B", 7)


def _group_norm_naive(x, groups, scale, bias, eps):
    n, c = x.shape[:2]
    per = c // groups
    y = np.empty(x.shape, np.float64)
    for i in range(n):
        for g in range(groups):
            vals = x[i, g * per:(g + 1) * per].astype(np.float64)
            y[i, g * per:(g + 1) * per] = (vals - vals.mean()) / np.sqrt(vals.var() + eps)
    return y * scale.reshape(-1, *[1] * (x.ndim - 2)) + bias.reshape(-1, *[1] * (x.ndim - 2))


def test_group_norm_opset_21_and_18():
    x = _rand(2, 6, 3, 2)
    scale, bias = _rand(6), _rand(6)
    (y,) = _dnnc("GroupNormalization", [("x", x), ("s", scale), ("b", bias)],
                 attrs={"num_groups": 3, "epsilon": 1e-3}, opset=21)
    _same([y], [_group_norm_naive(x, 3, scale, bias, 1e-3).astype(np.float32)], rtol=1e-4,
          atol=1e-5)
    # opset 18: one scale and bias per group, given as inputs and as constants
    gs, gb = _rand(3), _rand(3)
    want = _group_norm_naive(x, 3, np.repeat(gs, 2), np.repeat(gb, 2), 1e-5).astype(np.float32)
    (y18,) = _dnnc("GroupNormalization", [("x", x), ("s", gs), ("b", gb)],
                   attrs={"num_groups": 3}, opset=18)
    _same([y18], [want], rtol=1e-4, atol=1e-5)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [helper.make_tensor("s", 1, [3], gs),
                               helper.make_tensor("b", 1, [3], gb)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    _same(dnnc.compile(model, target="numpy").run(x), [want], rtol=1e-4, atol=1e-5)


def test_group_norm_errors():
    f = T.float32
    with pytest.raises(ShapeError, match="groups"):
        _infer("GroupNormalization", [T.TensorType(f, ("N", 6, 4))] +
               [T.TensorType(f, (6,))] * 2, {"num_groups": 4})
    with pytest.raises(ShapeError, match="scale"):
        _infer("GroupNormalization", [T.TensorType(f, ("N", 6, 4))] +
               [T.TensorType(f, (3,))] * 2, {"num_groups": 3})
    out = _infer("GroupNormalization", [T.TensorType(f, ("N", 6, "L"))] +
                 [T.TensorType(f, (6,))] * 2, {"num_groups": 2})
    assert out[0].shape == ("N", 6, "L")


# -- LRN, MeanVarianceNormalization, LpNormalization -------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_lrn_naive_and_ort(size):
    x = _rand(2, 5, 3, 3)
    attrs = {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}
    (y,) = _dnnc("LRN", [("x", x)], attrs=attrs)
    want = np.empty(x.shape)
    for n, c, h, w in np.ndindex(x.shape):
        lo, hi = max(0, c - (size - 1) // 2), min(4, c + math.ceil((size - 1) / 2))
        sq = sum(float(x[n, i, h, w]) ** 2 for i in range(lo, hi + 1))
        want[n, c, h, w] = x[n, c, h, w] / (1.5 + 0.01 / size * sq) ** 0.6
    _same([y], [want.astype(np.float32)], rtol=1e-5)
    if size % 2:  # onnxruntime takes odd sizes only
        _same([y], _ort("LRN", [("x", x)], attrs=attrs), rtol=1e-5)


@pytest.mark.parametrize("axes", [None, [0, 2], [1]])
def test_mean_variance_norm_against_onnxruntime(axes):
    x = _rand(2, 3, 4, 2)
    attrs = {} if axes is None else {"axes": axes}
    _same(_dnnc("MeanVarianceNormalization", [("x", x)], attrs=attrs, opset=13),
          _ort("MeanVarianceNormalization", [("x", x)], attrs=attrs, opset=13),
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p,axis", [(1, 1), (2, -1), (2, 0)])
def test_lp_norm(p, axis):
    x = _rand(3, 4)
    x[1] = 0  # a zero row stays zero along axis 1
    attrs = {"p": p, "axis": axis}
    (y,) = _dnnc("LpNormalization", [("x", x)], attrs=attrs)
    _same([y], _ort("LpNormalization", [("x", x)], attrs=attrs), rtol=1e-5)
    norm = np.linalg.norm(x.astype(np.float64), ord=p, axis=axis, keepdims=True)
    want = x / np.where(norm == 0, 1, norm)
    _same([y], [want.astype(np.float32)], rtol=1e-5)
    with pytest.raises(ShapeError, match="p must be"):
        _infer("LpNormalization", [T.TensorType(T.float32, (3,))], {"p": 3})


# -- Dropout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset,mask_dtype", [(7, np.float32), (10, np.bool_), (12, np.bool_),
                                              (22, np.bool_)])
def test_dropout_inference_identity(opset, mask_dtype):
    x = _rand(3, 4)
    inputs = [("x", x)] + ([("r", np.array(0.3, np.float32))] if opset >= 12 else [])
    attrs = {"ratio": 0.3} if opset < 12 else {}
    y, mask = _dnnc("Dropout", inputs, ("y", "mask"), attrs, opset)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == mask_dtype and mask.shape == x.shape and np.all(mask == 1)


def test_dropout_training_seeded_is_deterministic():
    x = _rand(4, 5)
    inputs = [("x", x), ("r", np.array(0.25, np.float32)), ("t", np.array(True))]
    y, mask = _dnnc("Dropout", inputs, ("y", "mask"), {"seed": 3}, 13)
    want = np.random.RandomState(3).uniform(0, 1, x.shape) >= 0.25
    np.testing.assert_array_equal(mask, want)
    np.testing.assert_allclose(y, np.where(want, x / np.float32(0.75), 0), rtol=1e-6)
    y0, _ = _dnnc("Dropout", inputs[:2] + [("t", np.array(False))], ("y", "mask"), {}, 13)
    np.testing.assert_array_equal(y0, x)
    with pytest.raises(DNNCError, match="seed"):
        _run("Dropout", [x, np.array(0.5, np.float32), np.array(True)], num_outputs=2)


def test_dropout_constant_training_without_seed_fails_at_inference():
    g = Graph("t")
    x = g.add_input("x", T.TensorType(T.float32, ("N", 4)))
    train = Value("t", T.TensorType(T.bool_, ()), const=np.array(True))
    with pytest.raises(ShapeError, match="seed"):
        g.add_node("Dropout", [x, None, train], {})
    out = g.add_node("Dropout", [x], {}, num_outputs=2)
    assert out[1].type == T.TensorType(T.bool_, ("N", 4))


# -- compute rules (loop IR, interpreted by NumPy) against the references ------------------------


def _check_rule(op, arrays, attrs=None, consts=(), num_outputs=1, tol=1e-5):
    attrs = attrs or {}
    want = get_op(op).run(arrays, {**get_op(op).attrs, **attrs})
    got = run_rule(op, arrays, attrs, const_inputs=consts, num_outputs=num_outputs)
    assert len(got) == num_outputs
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol)


def _fresh(rng, *shape, dtype=np.float32, lo=None):
    x = rng.standard_normal(shape) if lo is None else rng.uniform(lo, lo + 1.5, shape)
    return x.astype(dtype)


RULE_DTYPES = [(np.float32, 1e-5), (np.float16, 5e-3), (np.float64, 1e-10)]


@pytest.mark.parametrize("dtype,tol", RULE_DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (2, 3, 4, 5)])
def test_batch_norm_rules(rng, dtype, tol, shape):
    c = shape[1]
    stats = [_fresh(rng, c, dtype=dtype), _fresh(rng, c, dtype=dtype), _fresh(rng, c, dtype=dtype),
             _fresh(rng, c, dtype=dtype, lo=0.5)]
    _check_rule("BatchNormalization", [_fresh(rng, *shape, dtype=dtype)] + stats,
                {"epsilon": 1e-3}, tol=tol)
    _check_rule("BatchNormalization", [_fresh(rng, *shape, dtype=dtype)] + stats,
                {"training_mode": 1, "momentum": 0.8}, num_outputs=3, tol=tol)


@pytest.mark.parametrize("dtype,tol", RULE_DTYPES)
def test_instance_group_norm_and_lrn_rules(rng, dtype, tol):
    x = _fresh(rng, 2, 6, 4, 5, dtype=dtype)
    c = [_fresh(rng, 6, dtype=dtype) for _ in range(2)]
    _check_rule("InstanceNormalization", [x] + c, {"epsilon": 1e-3}, tol=tol)
    _check_rule("InstanceNormalization", [x[..., 0]] + c, tol=tol)
    # GroupNorm's statistics are in stash_type (float32 unless given), whose rounding differs
    # from NumPy's (the rule's mean is shifted by the group's first element): float64 inputs
    # are checked with float64 statistics at float64's tolerance, and with float32 ones at
    # float32's
    stash = {"stash_type": T.float64} if dtype == np.float64 else {}
    for groups in (1, 3, 6):
        _check_rule("GroupNormalization", [x] + c, {"num_groups": groups, **stash}, tol=tol)
    _check_rule("GroupNormalization", [x[:, :, 0, 0]] + c, {"num_groups": 2, **stash},
                tol=tol)
    if stash:
        _check_rule("GroupNormalization", [x] + c, {"num_groups": 3}, tol=RULE_DTYPES[0][1])
    _check_rule("LRN", [x], {"size": 3}, tol=tol)
    _check_rule("LRN", [x[..., 0]], {"size": 4, "alpha": 0.01, "beta": 0.5, "bias": 2.0},
                tol=tol)


@pytest.mark.parametrize("dtype,tol", RULE_DTYPES)
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layer_rms_lp_norm_rules(rng, dtype, tol, axis):
    x = _fresh(rng, 2, 3, 4, dtype=dtype)
    scale = _fresh(rng, *x.shape[axis % 3:], dtype=dtype)
    bias = _fresh(rng, x.shape[-1], dtype=dtype)  # broadcast along the normalised axes
    # statistics in stash_type (float32 unless given) round differently from NumPy's (the
    # rule's mean is shifted by the row's first element): float32 statistics are checked at
    # float32's tolerance
    stash_tol = max(tol, RULE_DTYPES[0][1])
    for num_outputs in (1, 3):
        _check_rule("LayerNormalization", [x, scale, bias], {"axis": axis},
                    num_outputs=num_outputs, tol=stash_tol)
    _check_rule("LayerNormalization", [x, scale], {"axis": axis, "stash_type": T.float64},
                num_outputs=3, tol=tol)
    _check_rule("RMSNormalization", [x, scale], {"axis": axis}, tol=tol)
    for p in (1, 2):
        _check_rule("LpNormalization", [x], {"axis": axis, "p": p}, tol=tol)


def test_mean_variance_and_lp_norm_rules_edge_cases(rng):
    x = _fresh(rng, 2, 3, 4, 5)
    _check_rule("MeanVarianceNormalization", [x])
    _check_rule("MeanVarianceNormalization", [x], {"axes": [1, -1]})
    _check_rule("MeanVarianceNormalization", [x.astype(np.float16)], tol=5e-3)
    zeros = _fresh(rng, 3, 4)
    zeros[1] = 0  # a zero norm gives 0, not NaN
    _check_rule("LpNormalization", [zeros])
    _check_rule("LpNormalization", [zeros], {"p": 1})


def test_norm_rules_with_symbolic_batch(rng):
    """N stays symbolic in the rules' shapes; it is bound only when evaluating."""
    x = _fresh(rng, 3, 4, 5)
    vec = [_fresh(rng, 4), _fresh(rng, 4), _fresh(rng, 4), _fresh(rng, 4, lo=0.5)]
    cases = [("BatchNormalization", vec, {}), ("InstanceNormalization", vec[:2], {}),
             ("GroupNormalization", vec[:2], {"num_groups": 2}),
             ("LayerNormalization", [_fresh(rng, 5), _fresh(rng, 5)], {}),
             ("RMSNormalization", [_fresh(rng, 5)], {}), ("LRN", [], {"size": 3}),
             ("MeanVarianceNormalization", [], {"axes": [0, 2]}), ("LpNormalization", [], {})]
    for op, params, attrs in cases:
        arrays = [x] + params
        values = [Value("x", T.TensorType(T.float32, ("N", 4, 5)))] + [
            Value(f"p{k}", T.TensorType(T.float32, a.shape)) for k, a in enumerate(params)]
        types, _, full = infer_node(op, values, attrs, 1, op)
        assert types[0].shape == ("N", 4, 5)
        tensors = [placeholder(v.name, v.type.dtype, v.type.shape) for v in values]
        got, = evaluate(apply_rule(op, tensors, full, types),
                        dict(zip([v.name for v in values], arrays)), sizes={"N": 3})
        want = get_op(op).run(arrays, full)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=op)


def test_dropout_rules(rng):
    x = _fresh(rng, 3, 4)
    ratio, off, on = np.array(0.3, np.float32), np.array(False), np.array(True)
    _check_rule("Dropout", [x], num_outputs=2)
    _check_rule("Dropout", [x, ratio, off], consts={1, 2}, num_outputs=2)
    _check_rule("Dropout", [x, np.array(0.0, np.float32), on], consts={1, 2}, num_outputs=2)
    _check_rule("Dropout", [x.astype(np.float16), ratio.astype(np.float16)], consts={1})
    with pytest.raises(NoCompute, match="training"):
        run_rule("Dropout", [x, ratio, on], {"seed": 1}, const_inputs={1, 2})
    with pytest.raises(NoCompute, match="run time"):
        run_rule("Dropout", [x, ratio, off], const_inputs={1})
