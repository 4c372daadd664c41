import numpy as np
import pytest

from dnnc.ir import types as T


@pytest.mark.parametrize("dtype", T.ALL_DTYPES, ids=lambda d: d.name)
def test_dtype_round_trips_through_numpy(dtype):
    assert T.DType.from_numpy(dtype.np) is dtype
    assert T.DType.from_name(dtype.name) is dtype


def test_dtype_kinds():
    assert T.bfloat16.is_float and T.float16.is_float and not T.int8.is_float
    assert T.uint32.is_int and not T.bool_.is_int
    assert T.bfloat16.itemsize == 2


def test_tensor_type_text_and_static():
    t = T.TensorType(T.float32, ("N", 3, 224, 224))
    assert str(t) == "float32[N,3,224,224]"
    assert not t.is_static and t.numel is None
    s = T.TensorType(T.int64, (2, 3))
    assert s.is_static and s.numel == 6


def test_static_shape_is_ints_or_none():
    assert T.static_shape([2, 3]) == (2, 3) and T.static_shape(()) == ()
    assert T.static_shape((2, "N")) is None


@pytest.mark.parametrize("a,b,product", [
    (2, 3, 6), ("N", 1, "N"), ("N", 3, "3*N"), ("3*N", "S", "3*N*S"), ("S", "N", "N*S"),
])
def test_dim_mul_is_canonical(a, b, product):
    assert T.dim_mul(a, b) == product


@pytest.mark.parametrize("a,b,quotient", [
    (12, 4, 3), ("3*N*S", "S", "3*N"), ("6*N", 3, "2*N"), ("N", "N", 1), ("N", "S", "(N//S)"),
])
def test_dim_div_cancels(a, b, quotient):
    assert T.dim_div(a, b) == quotient


def test_broadcast_shapes_symbolic():
    assert T.broadcast_shapes(("N", 1, 4), (3, 1)) == ("N", 3, 4)
    assert T.broadcast_shapes(("N", 4), (1,)) == ("N", 4)
    assert T.broadcast_shapes((5,), ("K",)) == (5,)
    with pytest.raises(ValueError):
        T.broadcast_shapes((2, 3), (4, 3))


def test_broadcast_matches_numpy_on_static_shapes(rng):
    for _ in range(50):
        rank = int(rng.integers(0, 4))
        a = tuple(int(x) for x in rng.choice([1, 2, 3], rank))
        b = tuple(int(x) if rng.random() < 0.5 else 1 for x in a[int(rng.integers(0, rank + 1)):])
        assert T.broadcast_shapes(a, b) == np.broadcast_shapes(a, b)
