"""dnnc.trace and dnnc.jit: traced NumPy models compiled for numpy and llvm equal running the
function on NumPy arrays (fresh random inputs, not the ones traced); NumPy's dtype rules; the
errors tracing raises."""

import numpy as np
import pytest

import dnnc
from dnnc.compiler import driver
from dnnc.errors import TraceError
from traced_models import (attention, batchnorm, f32 as _f32, layernorm,
                           mlp, softmax, variance)

TARGETS = ("numpy", "llvm")


MODELS = {
    "softmax": (softmax, lambda r: [_f32(r, 6, 33)]),
    "layernorm": (layernorm, lambda r: [_f32(r, 5, 64), _f32(r, 64), _f32(r, 64)]),
    "mlp": (mlp, lambda r: [_f32(r, 4, 20), _f32(r, 20, 32), _f32(r, 32), _f32(r, 32, 10),
                            _f32(r, 10)]),
    "attention": (attention, lambda r: [_f32(r, 2, 7, 16), _f32(r, 2, 9, 16),
                                        _f32(r, 2, 9, 16)]),
    "variance": (variance, lambda r: [_f32(r, 12, 40) * 3 + 1]),
    "batchnorm": (batchnorm, lambda r: [_f32(r, 16, 24), _f32(r, 24), _f32(r, 24)]),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_traced_model_equals_numpy(rng, name, target):
    fn, make = MODELS[name]
    graph = dnnc.trace(fn, *make(rng))
    model = dnnc.compile(graph, target)
    for _ in range(2):
        args = make(rng)  # fresh inputs, not the traced ones
        want = fn(*args)
        got = model(*args)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_trace_records_registered_ops_and_constants(rng):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)  # closed over: becomes a constant

    def fn(x):
        return x @ w

    graph = dnnc.trace(fn, np.ones((2, 3), np.float32))
    assert [n.op for n in graph.nodes] == ["MatMul"]
    assert [v.name for v in graph.inputs] == ["x"]
    (const,) = graph.constants()
    np.testing.assert_array_equal(const.const, w)
    x = _f32(rng, 2, 3)
    np.testing.assert_allclose(dnnc.compile(graph, "numpy")(x), fn(x), rtol=1e-6)


def test_python_control_flow_records_the_path_taken():
    def fn(x, mode):
        for _ in range(3):
            x = x * 2.0 if x.shape[0] > 2 else x + 1.0
        return np.tanh(x) if mode == "tanh" else np.exp(x)

    big = dnnc.trace(fn, np.ones((4, 2), np.float32), "tanh")
    small = dnnc.trace(fn, np.ones((2, 2), np.float32), "exp")
    assert [n.op for n in big.nodes] == ["Mul"] * 3 + ["Tanh"]
    assert [n.op for n in small.nodes] == ["Add"] * 3 + ["Exp"]


def test_branch_on_a_traced_value_is_a_clear_error():
    def fn(x):
        return x if (x > 0).all() else -x

    with pytest.raises(TraceError, match="truth value"):
        dnnc.trace(fn, np.ones(3, np.float32))

    def fn2(x):
        return x if x[0] > 0 else -x

    with pytest.raises(TraceError, match="truth value"):
        dnnc.trace(fn2, np.ones(3, np.float32))


@pytest.mark.parametrize("call, name", [
    (lambda x: np.cumsum(x), "numpy.cumsum"),
    (lambda x: np.sort(x), "numpy.sort"),
    (lambda x: np.arctan2(x, x), "numpy.arctan2"),
    (lambda x: np.add.accumulate(x), "numpy.add.accumulate"),
])
def test_unsupported_numpy_function_names_it(call, name):
    with pytest.raises(TraceError, match=name.replace(".", r"\.")):
        dnnc.trace(call, np.ones(4, np.float32))


# -- NumPy's dtype rules -----------------------------------------------------------------------

DTYPE_CASES = {
    "f32 * python float stays f32": (lambda x, i: x * 2.5, np.float32),
    "f32 + python int stays f32": (lambda x, i: 1 + x, np.float32),
    "f32 + f64 array is f64": (lambda x, i: x + np.ones(3), np.float64),
    "f32 * np.float64 scalar is f64": (lambda x, i: x * np.float64(2.0), np.float64),
    "i32 / i32 is f64": (lambda x, i: i / i, np.float64),
    "i32 + python int stays i32": (lambda x, i: i + 7, np.int32),
    "i32 * python float is f64": (lambda x, i: i * 0.5, np.float64),
    "i32 + f32 is f64": (lambda x, i: i + x, np.float64),
    "comparison is bool": (lambda x, i: x > 0.5, np.bool_),
    "i32 sum is int64": (lambda x, i: i.sum(axis=0), np.int64),
    "i32 mean is f64": (lambda x, i: i.mean(), np.float64),
    "bool sum is int64": (lambda x, i: (x > 0).sum(), np.int64),
    "where with python scalar stays f32": (lambda x, i: np.where(x > 0, x, 0.0), np.float32),
    "where of python ints is int64": (lambda x, i: np.where(x > 0.5, 1, 0), np.int64),
    "f32 * python bool stays f32": (lambda x, i: x * True, np.float32),
    "i32 & python bool stays i32": (lambda x, i: i & True, np.int32),
    "exp of int is f64": (lambda x, i: np.exp(i), np.float64),
    "astype": (lambda x, i: x.astype(np.int64) + i, np.int64),
    "x ** 2 stays f32": (lambda x, i: x ** 2, np.float32),
    "x ** 3 stays f32": (lambda x, i: x ** 3, np.float32),
    "int remainder": (lambda x, i: i % 3, np.int32),
    "float floor division": (lambda x, i: x // 0.3, np.float32),
}


@pytest.mark.parametrize("case", sorted(DTYPE_CASES))
def test_numpy_dtype_rules(rng, case):
    fn, dtype = DTYPE_CASES[case]
    x = rng.random(3, dtype=np.float32)
    i = rng.integers(1, 100, 3, dtype=np.int32)
    want = np.asarray(fn(x, i))
    assert want.dtype == dtype  # the case states NumPy's rule correctly
    got = dnnc.compile(dnnc.trace(fn, x, i), "numpy")(x, i)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_python_int_overflowing_the_dtype_is_refused_as_numpy_does():
    with pytest.raises(OverflowError):
        np.ones(3, np.int8) + 1000
    with pytest.raises(TraceError, match="int8"):
        dnnc.trace(lambda x: x + 1000, np.ones(3, np.int8))


def test_integer_floor_division_is_refused():
    with pytest.raises(TraceError, match="floor division"):
        dnnc.trace(lambda i: i // 2, np.ones(3, np.int32))


# -- indexing, shapes, reductions, functions -----------------------------------------------------

INDEXING = [
    lambda x: x[1],
    lambda x: x[-1, 2:],
    lambda x: x[:, ::2, 1],
    lambda x: x[::-1, 3:0:-2],
    lambda x: x[..., 1:3],
    lambda x: x[None, 1:, None, :, -1],
    lambda x: x[[2, 0, 1]],
    lambda x: x[:, np.array([[0, 4], [3, 3]])],
    lambda x: x[0, [1, 0]],
    lambda x: x[1:3, :, [0, -1]],
    lambda x: x[:, 1, [0, 2]],
    lambda x: x.T[2],
    lambda x: x[[0, 1], [1, 2]],
    lambda x: x[[0, -1], 1:, [[1], [2]]],
    lambda x: x[1:, [0, 3], [2, -1]],
    lambda x: x[0, :, [0, 1]],
    lambda x: x[::-1, np.array([4, 0]), 1],
]


@pytest.mark.parametrize("k", range(len(INDEXING)))
def test_indexing(rng, k):
    fn = INDEXING[k]
    x = _f32(rng, 4, 5, 3)
    graph = dnnc.trace(fn, x)
    x = _f32(rng, 4, 5, 3)
    for target in TARGETS:
        np.testing.assert_array_equal(dnnc.compile(graph, target)(x), fn(x))


def test_indexing_by_a_traced_integer_array(rng):
    def fn(table, ids):
        return table[ids] * 2.0, table[ids, 1:3], table[ids, ids % 4], table[-ids - 1]

    table, ids = _f32(rng, 10, 4), rng.integers(0, 10, (3, 2))
    graph = dnnc.trace(fn, table, ids)
    table, ids = _f32(rng, 10, 4), rng.integers(0, 10, (3, 2))
    for target in TARGETS:
        for got, want in zip(dnnc.compile(graph, target)(table, ids), fn(table, ids)):
            np.testing.assert_array_equal(got, want)


def test_unsupported_indexing_is_refused():
    x = np.ones((4, 5, 3), np.float32)
    with pytest.raises(TraceError, match="boolean mask"):
        dnnc.trace(lambda x: x[x > 0], x)
    with pytest.raises(TraceError, match="boolean mask"):
        dnnc.trace(lambda x: x[[True, False, True, True]], x)
    with pytest.raises(TraceError, match="out of bounds"):
        dnnc.trace(lambda x: x[[0, 1], [1, 5]], x)
    with pytest.raises(TraceError, match="None"):
        dnnc.trace(lambda x: x[[0, 1], None, [1, 2]], x)


FUNCTIONS = {
    "reshape": lambda x: x.reshape(6, -1) + np.reshape(x, (-1,))[:1],
    "transpose": lambda x: np.transpose(x, (1, 2, 0)) * x.transpose(1, 2, 0),
    "moveaxis": lambda x: np.moveaxis(x, 0, -1),
    "squeeze_expand": lambda x: np.squeeze(np.expand_dims(x, 1), axis=1),
    "sum_axes": lambda x: x.sum(axis=(0, 2)),
    "mean_keepdims": lambda x: np.mean(x, axis=-1, keepdims=True),
    "max_all": lambda x: np.max(x),
    "min_axis": lambda x: x.min(axis=1),
    "prod": lambda x: np.prod(x, axis=0),
    "std": lambda x: np.std(x, axis=1, ddof=1),
    "argmax": lambda x: np.argmax(x, axis=2),
    "ufunc_reduce": lambda x: np.add.reduce(x)[:, :1] + np.maximum.reduce(x, axis=(0, 2))[:, None],
    "concatenate": lambda x: np.concatenate([x, x * 2.0, np.ones((4, 5, 1), np.float32)],
                                            axis=-1),
    "stack": lambda x: np.stack([x[0], x[1]], axis=1),
    "split": lambda x: tuple(np.split(x, [1, 3], axis=0)),
    "split_sections": lambda x: np.split(x, 2)[1] - 1.0,
    "einsum": lambda x: np.einsum("abc,abd->acd", x, x),
    "pad": lambda x: np.pad(x, ((1, 0), (0, 2), (1, 1)), constant_values=0.5),
    "pad_edge": lambda x: np.pad(x, 1, mode="edge"),
    "clip": lambda x: np.clip(x, -0.5, 0.5),
    "where": lambda x: np.where(x > 0, x, np.abs(x) * 0.1),
    "abs_log_sqrt": lambda x: np.log(np.sqrt(np.abs(x) + 1.0)),
    "minimum": lambda x: np.minimum(x, 0.25) - np.maximum(0.0, x),
    "broadcast_to": lambda x: np.broadcast_to(x[:, :1], (4, 5, 3)) + x,
    "dot": lambda x: np.dot(x[0], x[1].T),
    "like": lambda x: x + np.ones_like(x) + np.full_like(x, 2.0),
    "logic": lambda x: np.logical_and(x > 0, ~(x > 0.5)) | (x == x[0]),
    "not_equal": lambda x: x != x[:, :1],
    "any_all": lambda x: np.any(x > 1.0, axis=0) | (x > -1.0).all(axis=0),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("target", TARGETS)
def test_numpy_functions(rng, name, target):
    fn = FUNCTIONS[name]
    graph = dnnc.trace(fn, _f32(rng, 4, 5, 3))
    x = _f32(rng, 4, 5, 3)
    want = fn(x)
    got = dnnc.compile(graph, target)(x)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)


# -- fusion: nervanagpu's variance as one kernel -----------------------------------------------


def test_variance_compiles_to_one_kernel(rng):
    """Both reductions and the elementwise work between them in one kernel (the mean is a
    scratch stage of the variance's kernel), as nervanagpu compiles it."""
    x = _f32(rng, 64, 256)
    model = dnnc.compile(dnnc.trace(variance, x), "llvm")
    assert [n.op for n in model.graph.nodes].count("ReduceMean") == 2
    assert model.stats["kernels"] == 1
    np.testing.assert_allclose(model(x), variance(x), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "layernorm", "batchnorm"])
def test_traced_normalisations_fuse_their_reductions(rng, name):
    """Reductions fuse with each other and with the elementwise work reading them (softmax is
    recognised as one op first): at most two kernels where level 0 runs one per op, and the
    results still equal NumPy's."""
    fn, shapes = {"softmax": (softmax, [(32, 100)]),
                  "layernorm": (layernorm, [(32, 100), (100,), (100,)]),
                  "batchnorm": (batchnorm, [(64, 20), (20,), (20,)])}[name]
    args = [_f32(rng, *s) for s in shapes]
    graph = dnnc.trace(fn, *args)
    model = dnnc.compile(graph, "llvm")
    unfused = dnnc.compile(graph, "llvm", opt_level=0).stats["kernels"]
    assert model.stats["kernels"] <= 2 and unfused >= 5
    np.testing.assert_allclose(model(*args), fn(*args), rtol=2e-5, atol=2e-6)


# -- jit ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_jit_compiles_once_per_signature(rng, monkeypatch, target):
    compiles = []
    real_compile = driver.compile

    def counting_compile(*args, **kwargs):
        compiles.append(args[0])
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(driver, "compile", counting_compile)
    traced = []

    @dnnc.jit(target=target)
    def f(x, y):
        traced.append(x.shape)
        return np.tanh(x) * y + 1.0, x.sum(axis=0)

    for shape in [(3, 4), (3, 4), (3, 4), (5, 4), (3, 4), (5, 4)]:
        x, y = _f32(rng, *shape), _f32(rng, shape[-1])
        got = f(x, y)
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_allclose(got[0], np.tanh(x) * y + 1.0, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(got[1], x.sum(axis=0), rtol=2e-6, atol=2e-6)
    assert len(compiles) == 2 and f.compiles == 2
    assert traced == [(3, 4), (5, 4)]
    f(np.ones((3, 4), np.float64), np.ones(4, np.float64))  # a new dtype: a new signature
    assert len(compiles) == 3


def test_jit_without_parentheses_and_static_arguments(rng):
    @dnnc.jit
    def scale(x, k):
        return x * k

    x = _f32(rng, 6)
    np.testing.assert_allclose(scale(x, 2), x * 2, rtol=1e-6)
    np.testing.assert_allclose(scale(x, 3), x * 3, rtol=1e-6)
    assert scale.compiles == 2  # a Python argument is part of the signature
    assert scale(x, 2).dtype == np.float32
    assert scale.compiles == 2
