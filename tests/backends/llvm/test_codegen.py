"""The LLVM renderer, kernel by kernel: hand-built PrimFuncs called through `<name>_packed`
against NumPy on fresh random inputs.

Most modules are compiled at opt level 0 (many kernels, fast to JIT); the ones whose meaning
could change under LLVM's vectorizer (min/max, casts, division) run again at opt level 3.
"""

import ctypes

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from dnnc.backends.llvm.codegen import CodegenError, ModuleBuilder
from dnnc.backends.llvm.cpu import host_target
from dnnc.backends.llvm.jit import JITModule
from dnnc.ir import loop as L
from dnnc.ir import types as T

N = 97  # odd, so vectorised loops have a remainder

ALL = T.ALL_DTYPES
INTS = T.INT_DTYPES
FLOATS = T.FLOAT_DTYPES


# ---------------------------------------------------------------------------------------------
# harness


def jit(*funcs: L.PrimFunc, opt: int = 0) -> JITModule:
    mb = ModuleBuilder("test")
    for f in funcs:
        L.verify(f)
        mb.add(f)
    return JITModule(str(mb), host_target(), opt)


def call(jm: JITModule, func: L.PrimFunc, arrays, sizes=()) -> None:
    """Call `func` through its packed entry: `(ptr args, ptr sizes)`."""
    for a in arrays:
        assert a.flags.c_contiguous
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
        jm.address(f"{func.name}_packed"))
    ptrs = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
    szs = (ctypes.c_int64 * max(len(sizes), 1))(*sizes)
    fn(ptrs, szs)


def elementwise(name: str, in_dtypes, out_dtype, fn, n: int = N) -> L.PrimFunc:
    """`y[i] = fn(x0[i], x1[i], ...)` over a 1-d buffer of `n` elements."""
    xs = tuple(L.Buffer(f"x{k}", d, (n,)) for k, d in enumerate(in_dtypes))
    y = L.Buffer("y", out_dtype, (n,))
    i = L.Var("i")
    return L.PrimFunc(name, xs + (y,), L.For(i, n, L.Store(y, (i,), fn(*[x[i] for x in xs]))))


def run1(jm, func, inputs, out_dtype) -> np.ndarray:
    y = np.empty(inputs[0].shape, out_dtype.np)
    call(jm, func, list(inputs) + [y])
    return y


def random(rng, dtype: T.DType, n: int = N, lo=None, hi=None) -> np.ndarray:
    """Random values over `dtype`'s whole range (ints), or normal with spread (floats)."""
    if dtype.kind == "b":
        return rng.random(n) < 0.5
    if dtype.is_int:
        info = np.iinfo(dtype.np)
        lo = info.min if lo is None else max(lo, info.min)
        hi = info.max if hi is None else min(hi, info.max)
        return rng.integers(lo, hi, n, dtype=dtype.np, endpoint=True)
    if lo is not None:
        return rng.uniform(lo, hi, n).astype(dtype.np)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3, n)).astype(dtype.np)


def assert_same(out: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    """Bitwise equal values (NaN equal to NaN) of the same dtype."""
    assert out.dtype == ref.dtype, what
    if out.dtype.kind == "f" or out.dtype == ml_dtypes.bfloat16:
        o, r = out.astype(np.float64), ref.astype(np.float64)
        bad = ~((o == r) | (np.isnan(o) & np.isnan(r)))
    else:
        bad = out != ref
    assert not bad.any(), f"{what}: {out[bad][:5]} != {ref[bad][:5]}"


def assert_close(out, ref, dtype: T.DType, what: str = "", ulps: float = 4) -> None:
    tol = {T.float16: 2e-3, T.bfloat16: 1.6e-2, T.float32: 1e-6, T.float64: 1e-13}[dtype] * ulps
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), rtol=tol,
                               atol=tol, equal_nan=True, err_msg=what)


# ---------------------------------------------------------------------------------------------
# dtypes: loads, stores, casts


def _castable(rng, src: T.DType, dst: T.DType) -> np.ndarray:
    """Inputs whose cast to `dst` NumPy defines (float -> int only within range)."""
    x = random(rng, src)
    if src.is_float and dst.kind in "iu":
        info = np.iinfo(dst.np)
        lo, hi = max(float(info.min), -3e4), min(float(info.max), 3e4)
        x = rng.uniform(lo, hi, N).astype(src.np)
        x = np.clip(x, lo, hi).astype(src.np)
        x[-1] = np.float64(x[-1]).round() + 0.5  # halves truncate toward zero
    return x


@pytest.mark.parametrize("opt", [0, 3])
def test_cast_between_every_pair_of_dtypes(rng, opt):
    dtypes = ALL if opt == 0 else (T.bool_, T.uint8, T.int64, T.uint64, T.float16,
                                    T.bfloat16, T.float64)
    pairs = [(s, d) for s in dtypes for d in dtypes]
    funcs = [elementwise(f"cast_{s.name}_{d.name}", [s], d, lambda x, d=d: L.Cast(d, x))
             for s, d in pairs]
    jm = jit(*funcs, opt=opt)
    for f, (s, d) in zip(funcs, pairs):
        x = _castable(rng, s, d)
        with np.errstate(all="ignore"):
            ref = x.astype(d.np)
        assert_same(run1(jm, f, [x], d), ref, f"{s.name} -> {d.name}")


def test_float_to_bool_and_bool_to_float_with_nan_and_negative_zero():
    f = elementwise("tobool", [T.float32], T.bool_, lambda x: L.Cast(T.bool_, x), n=5)
    jm = jit(f)
    x = np.array([0.0, -0.0, np.nan, -np.inf, 1e-40], np.float32)
    assert_same(run1(jm, f, [x], T.bool_), x.astype(bool))


@pytest.mark.parametrize("dtype", [T.float16, T.bfloat16])
def test_half_precision_rounds_to_nearest_even_and_keeps_nan(rng, dtype):
    """float32 -> half at exact ties, just past them, overflow, subnormals and NaN (whose
    payload may change, but which must stay NaN, never become inf)."""
    fin = ml_dtypes.finfo(dtype.np)
    base = rng.standard_normal(64).astype(dtype.np).astype(np.float32)
    bits = {T.float16: 13, T.bfloat16: 16}[dtype]  # float32 mantissa bits a half drops
    half_ulp = np.uint32(1 << (bits - 1))
    ties = (base.view(np.uint32) + half_ulp).view(np.float32)
    past = (base.view(np.uint32) + half_ulp + np.uint32(1)).view(np.float32)
    below = (base.view(np.uint32) + half_ulp - np.uint32(1)).view(np.float32)
    nans = np.array([0x7F800001, 0xFFC00000, 0x7FBFFFFF, 0x7F800100], np.uint32).view(
        np.float32)
    edges = np.array([float(fin.max) * 1.001, -float(fin.max) * 1.002, float(fin.tiny) / 3,
                      np.inf, -np.inf, -0.0], np.float32)
    x = np.concatenate([base, ties, past, below, nans, edges]).astype(np.float32)
    f32 = elementwise("to_half", [T.float32], dtype, lambda v: L.Cast(dtype, v), n=len(x))
    f64 = elementwise("to_half64", [T.float64], dtype, lambda v: L.Cast(dtype, v), n=len(x))
    # arithmetic results are rounded at their precision too: (x * 1) in half == cast
    mul = elementwise("mul_half", [dtype, dtype], dtype, lambda a, b: a * b, n=len(x))
    jm = jit(f32, f64, mul, opt=3)
    with np.errstate(all="ignore"):
        ref = x.astype(dtype.np)
    out = run1(jm, f32, [x], dtype)
    assert_same(out, ref, "float32 -> half")
    assert np.isnan(out[256:260].astype(np.float32)).all()
    with np.errstate(all="ignore"):
        assert_same(run1(jm, f64, [x.astype(np.float64)], dtype), ref, "float64 -> half")
    a, b = random(rng, dtype, len(x)), random(rng, dtype, len(x))
    with np.errstate(all="ignore"):
        prod = (a.astype(np.float32) * b.astype(np.float32)).astype(dtype.np)
    assert_same(run1(jm, mul, [a, b], dtype), prod, "half product")


def test_float64_to_float16_rounds_once(rng):
    """Via float32 the value 1 + 2**-11 + 2**-40 ties and rounds down; NumPy rounds it up."""
    x = np.concatenate([[1 + 2.0 ** -11 + 2.0 ** -40, -(1 + 2.0 ** -11 + 2.0 ** -40),
                         1 + 2.0 ** -11, 65519.99, 65520.0, 1e300, np.nan, 2.0 ** -25,
                         2.0 ** -25 + 2.0 ** -60],
                        rng.integers(-4096, 4096, 200) / 4096 + 2.0 ** -11 +
                        rng.choice([-1, 1], 200) * 2.0 ** -45])
    f = elementwise("f64_to_f16", [T.float64], T.float16, lambda v: L.Cast(T.float16, v),
                    n=len(x))
    jm = jit(f, opt=3)
    with np.errstate(all="ignore"):
        assert_same(run1(jm, f, [x], T.float16), x.astype(np.float16))


def test_constants_of_every_dtype(rng):
    """Constants beyond the signed range (uint64 max), negative ones, half constants."""
    funcs, refs, ins = [], [], []
    for k, dt in enumerate(ALL):
        x = random(rng, dt)
        if dt.kind == "b":
            c, ref = True, x ^ True
            fn = lambda v, dt=dt: L.BinOp("!=", v, L.Const(True, dt))  # noqa: E731
        elif dt.is_int:
            c = int(np.iinfo(dt.np).max)
            with np.errstate(all="ignore"):
                ref = x ^ dt.np.type(c)
            fn = lambda v, dt=dt, c=c: L.BinOp("^", v, L.Const(c, dt))  # noqa: E731
        else:
            c = 0.1
            ref = (x.astype(np.float32 if dt.itemsize < 8 else np.float64) *
                   np.asarray(c, dt.np).astype(np.float32 if dt.itemsize < 8 else np.float64)
                   ).astype(dt.np)
            fn = lambda v, dt=dt, c=c: v * L.Const(c, dt)  # noqa: E731
        funcs.append(elementwise(f"const{k}", [dt], dt, fn))
        refs.append(ref)
        ins.append(x)
    jm = jit(*funcs)
    for f, x, ref, dt in zip(funcs, ins, refs, ALL):
        assert_same(run1(jm, f, [x], dt), ref, dt.name)


# ---------------------------------------------------------------------------------------------
# binary operators


def _c_div(a, b):
    """C's integer division: truncation toward zero."""
    q = [abs(int(x)) // abs(int(y)) * (-1 if (x < 0) != (y < 0) else 1) for x, y in zip(a, b)]
    return np.array(q, a.dtype)


_INT_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide,
            "%": np.remainder, "min": np.minimum, "max": np.maximum, "&": np.bitwise_and,
            "|": np.bitwise_or, "^": np.bitwise_xor, "==": np.equal, "!=": np.not_equal,
            "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


@pytest.mark.parametrize("opt", [0, 3])
def test_integer_operators_floor_division_and_unsigned(rng, opt):
    dtypes = INTS if opt == 0 else (T.int8, T.uint16, T.int32, T.int64, T.uint64)
    cases = [(dt, op) for dt in dtypes for op in list(_INT_OPS) + ["/"]]
    funcs = [elementwise(f"i{k}", [dt, dt], T.bool_ if op in L.COMPARE else dt,
                         lambda a, b, op=op: L.BinOp(op, a, b)) for k, (dt, op) in
             enumerate(cases)]
    jm = jit(*funcs, opt=opt)
    for f, (dt, op) in zip(funcs, cases):
        small = op in ("//", "%", "/")
        a = random(rng, dt, lo=-1000 if small else None, hi=1000 if small else None)
        b = random(rng, dt, lo=-9 if small else None, hi=9 if small else None)
        b[b == 0] = 3
        if op in ("==", "!=", "<=", ">="):
            b[:20] = a[:20]
        with np.errstate(all="ignore"):
            ref = _c_div(a, b) if op == "/" and dt.kind == "i" else \
                a // b if op == "/" else _INT_OPS[op](a, b)
        out = run1(jm, f, [a, b], T.bool_ if op in L.COMPARE else dt)
        assert_same(out, ref, f"{dt.name} {op}")


def test_floor_division_by_negative_divisors_and_extremes():
    """Every sign combination, exact multiples, and int64's extremes (a // b with b != -1)."""
    a = np.array([7, -7, 7, -7, 6, -6, 6, -6, 0, 0, 2 ** 63 - 1, -2 ** 63, -2 ** 63, 1, -1],
                 np.int64)
    b = np.array([2, 2, -2, -2, 3, 3, -3, -3, 5, -5, -2, 7, 2 ** 63 - 1, -2 ** 63, -2 ** 63],
                 np.int64)
    fns = [elementwise(name, [T.int64, T.int64], T.int64, lambda x, y, op=op: L.BinOp(op, x, y),
                       n=len(a)) for name, op in (("fdiv", "//"), ("fmod_", "%"), ("tdiv", "/"))]
    jm = jit(*fns)
    assert_same(run1(jm, fns[0], [a, b], T.int64), a // b)
    assert_same(run1(jm, fns[1], [a, b], T.int64), a % b)
    assert_same(run1(jm, fns[2], [a, b], T.int64), _c_div(a, b))


def test_floor_division_of_loop_indices_uses_bounds_correctly(rng):
    """(i - 50) // 7 and % with i a loop var: bounds say i >= 0, not i - 50 >= 0."""
    y = L.Buffer("y", T.int64, (2, N))
    i = L.Var("i")
    f = L.PrimFunc("idx", (y,), L.For(i, N, L.seq(
        L.Store(y, (0, i), (i - 50) // 7), L.Store(y, (1, i), (i - 50) % L.const(-7)))))
    out = np.empty((2, N), np.int64)
    call(jit(f), f, [out])
    k = np.arange(N) - 50
    assert_same(out, np.stack([k // 7, k % -7]))


def test_shifts_within_the_bit_width(rng):
    cases = [(dt, op) for dt in INTS for op in ("<<", ">>")]
    funcs = [elementwise(f"s{k}", [dt, dt], dt, lambda a, b, op=op: L.BinOp(op, a, b))
             for k, (dt, op) in enumerate(cases)]
    jm = jit(*funcs, opt=3)
    for f, (dt, op) in zip(funcs, cases):
        a = random(rng, dt)
        b = rng.integers(0, dt.itemsize * 8, N).astype(dt.np)
        ref = (np.left_shift if op == "<<" else np.right_shift)(a, b)  # >> is arithmetic on ints
        assert_same(run1(jm, f, [a, b], dt), ref, f"{dt.name} {op}")


_FLOAT_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
              "//": np.floor_divide, "%": np.fmod, "min": np.minimum, "max": np.maximum,
              "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
              ">": np.greater, ">=": np.greater_equal}


@pytest.mark.parametrize("opt", [0, 3])
def test_float_operators_with_nan(rng, opt):
    """min/max propagate NaN as np.minimum/np.maximum; comparisons with NaN are false except
    !=; % is fmod (sign of the dividend); // is floor(a / b)."""
    cases = [(dt, op) for dt in FLOATS for op in _FLOAT_OPS]
    funcs = [elementwise(f"f{k}", [dt, dt], T.bool_ if op in L.COMPARE else dt,
                         lambda a, b, op=op: L.BinOp(op, a, b)) for k, (dt, op) in
             enumerate(cases)]
    jm = jit(*funcs, opt=opt)
    for f, (dt, op) in zip(funcs, cases):
        a, b = random(rng, dt), random(rng, dt)
        a[:5] = np.nan
        b[3:9] = np.nan
        b[20:30] = a[20:30]
        a[40], b[40], a[41], b[41] = np.inf, -np.inf, -0.0, 0.0
        out = run1(jm, f, [a, b], T.bool_ if op in L.COMPARE else dt)
        wide = np.float32 if dt.itemsize < 8 else np.float64
        with np.errstate(all="ignore"):
            ref = _FLOAT_OPS[op](a.astype(wide), b.astype(wide))
            ref = ref if op in L.COMPARE else ref.astype(dt.np)
        if op in L.COMPARE:
            assert_same(out, ref, f"{dt.name} {op}")
        elif op in ("//", "%"):
            assert_close(out, ref, dt, f"{dt.name} {op}")
        else:
            assert_same(out, ref, f"{dt.name} {op}")


def test_logic_and_select_over_every_dtype(rng):
    funcs = []
    for k, dt in enumerate(ALL):
        c = L.Buffer("c", T.bool_, (N,))
        d = L.Buffer("d", T.bool_, (N,))
        a, b = L.Buffer("a", dt, (N,)), L.Buffer("b", dt, (N,))
        y = L.Buffer("y", dt, (N,))
        i = L.Var("i")
        cond = L.logical_or(L.logical_and(c[i], d[i]), L.call("not", c[i]))
        funcs.append(L.PrimFunc(f"sel{k}", (c, d, a, b, y),
                                L.For(i, N, L.Store(y, (i,), L.Select(cond, a[i], b[i])))))
    jm = jit(*funcs)
    for f, dt in zip(funcs, ALL):
        c, d, a, b = random(rng, T.bool_), random(rng, T.bool_), random(rng, dt), \
            random(rng, dt)
        y = np.empty(N, dt.np)
        call(jm, f, [c, d, a, b, y])
        assert_same(y, np.where((c & d) | ~c, a, b), dt.name)


@pytest.mark.parametrize("dtype", [T.int8, T.int32, T.uint16, T.float32, T.float16])
def test_logical_not_of_numbers_is_a_bool(rng, dtype):
    f = elementwise("lnot", [dtype], T.bool_, lambda x: L.call("not", x))
    x = random(rng, dtype, lo=-2, hi=2)
    x[:10] = 0
    assert_same(run1(jit(f), f, [x], T.bool_), np.logical_not(x))


# ---------------------------------------------------------------------------------------------
# intrinsics


_UNARY = {"exp": (np.exp, -8, 8), "log": (np.log, 1e-3, 50), "sqrt": (np.sqrt, 0, 50),
          "rsqrt": (lambda x: 1 / np.sqrt(x), 1e-2, 50), "tanh": (np.tanh, -6, 6),
          "erf": (scipy.special.erf, -3, 3), "sigmoid": (scipy.special.expit, -10, 10),
          "abs": (np.abs, -5, 5), "floor": (np.floor, -5, 5), "ceil": (np.ceil, -5, 5),
          "trunc": (np.trunc, -5, 5), "sin": (np.sin, -4, 4), "cos": (np.cos, -4, 4),
          "tan": (np.tan, -1.4, 1.4), "asin": (np.arcsin, -1, 1),
          "acos": (np.arccos, -1, 1), "atan": (np.arctan, -9, 9), "sinh": (np.sinh, -4, 4),
          "cosh": (np.cosh, -4, 4), "asinh": (np.arcsinh, -9, 9),
          "acosh": (np.arccosh, 1, 9), "atanh": (np.arctanh, -0.95, 0.95),
          "neg": (np.negative, -5, 5), "log1p": (np.log1p, -0.9, 9),
          "expm1": (np.expm1, -3, 3), "sign": (np.sign, -2, 2)}
_BINARY = {"pow": (np.power, 0.1, 4), "fmod": (np.fmod, -9, 9), "atan2": (np.arctan2, -9, 9)}


def test_every_intrinsic_is_rendered_or_rejected():
    """Each name in loop.INTRINSICS has a test below (a new one must get one)."""
    tested = set(_UNARY) | set(_BINARY) | {"round", "isnan", "isinf", "not", "fma", "bitcast",
                                           "check_index", *L.SHUFFLES, *L.PACKS.values(),
                                           "dot_bf16x2",   # (test_bf16.py)
                                           "dot_u8s8x4", "pack_u8x4",   # (test_int8.py)
                                           "cluster_load", "load_word"}
    assert tested == set(L.INTRINSICS)


@pytest.mark.parametrize("opt", [0, 3])
@pytest.mark.parametrize("kind", [L.ForKind.SERIAL, L.ForKind.VECTORIZED])
def test_check_index_passes_values_and_records_the_first_bad_one(opt, kind):
    """y[i] = x[clamp(check_index(k[i], 5, site 6))]: every value goes on (clamped by the
    code around it), and the first index outside [-5, 4] is recorded as (7, index, 5), in
    scalar code and lane by lane in a vector loop; a record already holding an error keeps it."""
    n = 8
    x, k = L.Buffer("x", T.float32, (5,)), L.Buffer("k", T.int64, (n,))
    y = L.Buffer("y", T.float32, (n,))
    i = L.Var("i")
    at = L.Call("check_index", (k[i], L.const(5), L.const(6)), L.INDEX)
    body = L.Store(y, (i,), x[(L.minimum(L.maximum(at, 0), 4),)])
    func = L.index_checks.with_errors(L.PrimFunc("checked", (x, k, y), L.For(i, n, body, kind)))
    jm = jit(func, opt=opt)
    xs = np.arange(5, dtype=np.float32)
    for ks, want in (([0, 4, -5, 3, 2, 1, 0, 4], [0, 0, 0]),
                     ([0, 5, -6, 2**62, 1, 1, 1, 1], [7, 5, 5]),
                     ([-10**6, 0, 0, 0, 0, 0, 0, 9], [7, -10**6, 5])):
        ks = np.array(ks, np.int64)
        out, errors = np.empty(n, np.float32), np.zeros(3, np.int64)
        call(jm, func, [xs, ks, out, errors])
        np.testing.assert_array_equal(out, xs[np.clip(ks, 0, 4)])
        np.testing.assert_array_equal(errors, want)
    errors = np.array([2, 9, 9], np.int64)
    call(jm, func, [xs, np.full(n, 7, np.int64), np.empty(n, np.float32), errors])
    np.testing.assert_array_equal(errors, [2, 9, 9])


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_intrinsics_against_numpy(rng, dtype):
    names = list(_UNARY) + list(_BINARY) + ["round", "fma"]
    funcs = []
    for name in names:
        arity = 2 if name in _BINARY else 3 if name == "fma" else 1
        funcs.append(elementwise(f"{name}_{dtype.name}", [dtype] * arity, dtype,
                                 lambda *xs, name=name: L.call(name, *xs)))
    jm = jit(*funcs, opt=3)
    wide = np.float32 if dtype.itemsize < 8 else np.float64
    for f, name in zip(funcs, names):
        if name == "round":  # half-way cases go to even, as np.round
            xs = [(rng.integers(-20, 20, N) / 2 + (rng.random(N) < .3) * 0.25).astype(dtype.np)]
            ref_fn = np.round
        elif name == "fma":
            xs = [random(rng, dtype, lo=-3, hi=3) for _ in range(3)]
            ref_fn = lambda a, b, c: a * b + c  # noqa: E731
        else:
            ref_fn, lo, hi = (_BINARY.get(name) or _UNARY[name])
            xs = [random(rng, dtype, lo=lo, hi=hi) for _ in range(2 if name in _BINARY else 1)]
            if name in ("abs", "sign", "floor", "exp", "tanh", "sigmoid", "neg", "sqrt"):
                xs[0][:4] = [np.nan, np.inf, -np.inf, -0.0]
        with np.errstate(all="ignore"):
            ref = ref_fn(*[x.astype(wide) for x in xs]).astype(dtype.np)
            out = run1(jm, f, xs, dtype)
        if name in ("abs", "floor", "ceil", "trunc", "round", "neg", "sign"):
            assert_same(out, ref, f"{name} {dtype.name}")
        else:
            assert_close(out, ref, dtype, f"{name} {dtype.name}",
                         ulps=8 if name in ("tan", "pow", "fma", "expm1") else 4)


def test_isnan_isinf_on_floats_and_ints(rng):
    funcs = [elementwise(f"{name}_{dt.name}", [dt], T.bool_, lambda x, name=name: L.call(name, x))
             for dt in ALL if dt.kind != "b" for name in ("isnan", "isinf")]
    jm = jit(*funcs)
    k = 0
    for dt in ALL:
        if dt.kind == "b":
            continue
        for name, ref_fn in (("isnan", np.isnan), ("isinf", np.isinf)):
            x = random(rng, dt)
            if dt.is_float:
                x[:6] = [np.nan, np.inf, -np.inf, -np.nan, 0.0, float(ml_dtypes.finfo(dt.np).max)]
            assert_same(run1(jm, funcs[k], [x], T.bool_), ref_fn(x), f"{name} {dt.name}")
            k += 1


@pytest.mark.parametrize("dtype", INTS)
def test_integer_abs_sign_neg(rng, dtype):
    funcs = [elementwise(f"{name}", [dtype], dtype, lambda x, name=name: L.call(name, x))
             for name in ("abs", "sign", "neg")]
    jm = jit(*funcs)
    x = random(rng, dtype)
    x[:3] = [0, 1, np.iinfo(dtype.np).max]
    with np.errstate(all="ignore"):
        for f, ref in zip(funcs, (np.abs(x), np.sign(x), np.negative(x))):
            assert_same(run1(jm, f, [x], dtype), ref, f.name)


def test_transcendental_on_integers_is_a_codegen_error():
    f = elementwise("bad", [T.int32], T.int32, lambda x: L.call("exp", x))
    with pytest.raises(CodegenError, match="exp"):
        ModuleBuilder().add(f)


# ---------------------------------------------------------------------------------------------
# statements


def test_symbolic_sizes_let_and_if_else(rng):
    """y[i, j] = x[i, j] * s if (i + j) % 3 == 0 else x[i, M - 1 - j] - s, s = i * M + j."""
    n, m = L.Var("N"), L.Var("M")
    x, y = L.Buffer("x", T.float64, (n, m)), L.Buffer("y", T.float64, (n, m))
    i, j, s = L.Var("i"), L.Var("j"), L.Var("s", T.float64)
    body = L.For(i, n, L.For(j, m, L.Let(s, L.Cast(T.float64, i * m + j), L.If(
        L.eq((i + j) % 3, 0), L.Store(y, (i, j), x[i, j] * s),
        L.Store(y, (i, j), x[i, m - 1 - j] - s)))))
    f = L.PrimFunc("symbolic", (x, y), body, (n, m))
    jm = jit(f, opt=3)
    for shape in ((5, 7), (1, 33), (13, 1)):
        a = rng.standard_normal(shape)
        out = np.empty_like(a)
        call(jm, f, [a, out], shape)
        ii, jj = np.indices(shape)
        s_ref = (ii * shape[1] + jj).astype(np.float64)
        ref = np.where((ii + jj) % 3 == 0, a * s_ref, a[:, ::-1] - s_ref)
        np.testing.assert_array_equal(out, ref)


def test_if_without_else_and_zero_extent_loops(rng):
    n = L.Var("N")
    x, y = L.Buffer("x", T.int32, (n,)), L.Buffer("y", T.int32, (n,))
    i, j = L.Var("i"), L.Var("j")
    body = L.seq(
        L.For(i, n, L.Store(y, (i,), x[i])),
        L.For(i, n, L.If(x[i] < L.Const(0, T.int32), L.Store(y, (i,), -x[i]))),
        # a loop of extent N - N and one of extent 0 never run their bodies
        L.For(j, n - n, L.Store(y, (j,), L.Const(7, T.int32))),
        L.For(j, 0, L.Store(y, (j,), L.Const(9, T.int32))))
    f = L.PrimFunc("ifnoelse", (x, y), body, (n,))
    jm = jit(f)
    a = random(rng, T.int32, 50, -100, 100)
    out = np.empty_like(a)
    call(jm, f, [a, out], (50,))
    assert_same(out, np.abs(a))
    empty = np.empty(0, np.int32)  # N = 0: nothing runs, nothing is touched
    call(jm, f, [empty, empty], (0,))


def test_prefetch_is_a_prefetch_instruction_and_changes_nothing(rng):
    """`L.Prefetch` renders as the x86 prefetch of the element's line (llvm.prefetch), the
    element never read: a copy with a prefetch of the element 8 on, past the end at the last
    elements, copies the same."""
    n = L.Var("N")
    x, y = L.Buffer("x", T.float32, (n,)), L.Buffer("y", T.float32, (n,))
    i = L.Var("i")
    body = L.For(i, n, L.seq(L.Prefetch(x[i + 8]), L.Store(y, (i,), x[i])))
    f = L.PrimFunc("prefetched_copy", (x, y), body, (n,))
    assert "prefetch(x[i + 8])" in str(f)
    jm = jit(f, opt=3)
    assert "prefetcht0" in jm.assembly()
    a = random(rng, T.float32, 50, -100, 100)
    out = np.empty_like(a)
    call(jm, f, [a, out], (50,))
    assert_same(out, a)


@pytest.mark.parametrize("extent", [4, 10000, None], ids=["stack", "heap", "dynamic"])
def test_allocate_scratch_on_stack_heap_and_dynamic(rng, extent):
    """Two passes through a scratch buffer: reversed copy, then prefix sum."""
    n = L.Var("N")
    size = n if extent is None else extent
    x, y = L.Buffer("x", T.float64, (size,)), L.Buffer("y", T.float64, (size,))
    tmp = L.Buffer("tmp", T.float64, (size,))
    acc = L.Buffer("acc", T.float64, (1,), L.Scope.LOCAL)
    i = L.Var("i")
    body = L.Allocate(tmp, L.Allocate(acc, L.seq(
        L.For(i, size, L.Store(tmp, (i,), x[size - 1 - i])),
        L.Store(acc, (0,), L.const(0.0, T.float64)),
        L.For(i, size, L.seq(L.Store(acc, (0,), acc[0] + tmp[i]),
                             L.Store(y, (i,), acc[0]))))))
    f = L.PrimFunc("scratch", (x, y), body, (n,) if extent is None else ())
    jm = jit(f)
    text = str(jm.module)
    assert ("@malloc" in text) == (extent != 4)
    for count in ((3000, 17) if extent is None else (extent,)):
        a = rng.standard_normal(count)
        out = np.empty_like(a)
        call(jm, f, [a, out], (count,) if extent is None else ())
        np.testing.assert_allclose(out, np.cumsum(a[::-1]), rtol=1e-12)


def test_allocate_inside_a_loop_is_reused_not_regrown(rng):
    """A stack scratch allocated inside a loop of 10**5 iterations must not grow the stack
    on every iteration (entry-block alloca)."""
    x = L.Buffer("x", T.float32, (100000, 64))
    y = L.Buffer("y", T.float32, (100000,))
    tmp = L.Buffer("row", T.float32, (64,))
    i, j = L.Var("i"), L.Var("j")
    body = L.For(i, 100000, L.Allocate(tmp, L.seq(
        L.For(j, 64, L.Store(tmp, (j,), x[i, j] * 2.0)),
        L.Store(y, (i,), tmp[0] + tmp[63]))))
    f = L.PrimFunc("loopalloc", (x, y), body)
    jm = jit(f)
    a = rng.standard_normal((100000, 64)).astype(np.float32)
    out = np.empty(100000, np.float32)
    call(jm, f, [a, out])
    np.testing.assert_array_equal(out, a[:, 0] * 2 + a[:, 63] * 2)


def test_unrolled_and_vectorized_loops(rng):
    x, y = L.Buffer("x", T.float32, (N, 4)), L.Buffer("y", T.float32, (N, 4))
    i, j = L.Var("i"), L.Var("j")
    body = L.For(i, N, L.For(j, 4, L.Store(y, (i, j), x[i, 3 - j] + L.Cast(T.float32, j)),
                             L.ForKind.UNROLLED), L.ForKind.VECTORIZED)
    f = L.PrimFunc("unroll", (x, y), body)
    jm = jit(f, opt=3)
    a = rng.standard_normal((N, 4)).astype(np.float32)
    out = np.empty_like(a)
    call(jm, f, [a, out])
    np.testing.assert_array_equal(out, a[:, ::-1] + np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("kind", [L.ForKind.VECTORIZED, L.ForKind.PARALLEL])
def test_guarded_integer_division_inside_vector_and_parallel_loops(kind):
    """Legalize binds the operands of a guarded floor modulo with lets inside the loop body:
    vector values in a vectorized loop, captured values in an outlined parallel one."""
    from dnnc.ir.ops.elementwise import mod
    rng = np.random.default_rng(7)
    a, b = L.Buffer("a", T.int32, (N, 8)), L.Buffer("b", T.int32, (N, 8))
    y = L.Buffer("y", T.int32, (N, 8))
    i, j = L.Var("i"), L.Var("j")
    inner = L.For(j, 8, L.Store(y, (i, j), a[i, j] % b[i, j] + a[i, j] // b[i, j]),
                  kind if kind is L.ForKind.VECTORIZED else L.ForKind.SERIAL)
    f = L.PrimFunc("divmod", (a, b, y), L.For(i, N, inner, kind if kind is L.ForKind.PARALLEL
                                                else L.ForKind.SERIAL))
    xa, xb = random(rng, T.int32, N * 8).reshape(N, 8), random(rng, T.int32, N * 8, -3, 3)
    xb = xb.reshape(N, 8)
    xa[0, :3], xb[0, :3] = [7, -2 ** 31, -2 ** 31], [0, -1, 0]
    with np.errstate(all="ignore"):
        ref = mod(xa, xb, 0) + np.where(xb == 0, 0, np.floor_divide(xa, np.where(xb == 0, 1, xb)))
    for opt in (0, 3):
        out = np.empty_like(xa)
        call(jit(f, opt=opt), f, [xa, xb, out])
        assert_same(out, ref, f"opt {opt}")


@pytest.mark.parametrize("dtype", [T.float16, T.bfloat16])
def test_half_arithmetic_in_vectorized_loops_is_vector_code_in_float32(dtype):
    """Legalized float16 / bfloat16 arithmetic (float32 between casts) stays vector code:
    no per-lane extractelement, one vector add of float32 lanes."""
    rng = np.random.default_rng(8)
    x, y = L.Buffer("x", dtype, (N, 8)), L.Buffer("y", dtype, (N, 8))
    i, j = L.Var("i"), L.Var("j")
    f = L.PrimFunc("half_vec", (x, y), L.For(i, N, L.For(
        j, 8, L.Store(y, (i, j), x[i, j] + x[i, j] * L.Const(0.5, dtype)),
        L.ForKind.VECTORIZED)))
    mb = ModuleBuilder("test")
    mb.add(f)
    text = str(mb)
    assert "fadd <8 x float>" in text and "extractelement" not in text
    a = random(rng, dtype, N * 8).reshape(N, 8)
    out = np.empty_like(a)
    call(JITModule(text, host_target(), 3), f, [a, out])
    with np.errstate(all="ignore"):
        half = (a.astype(np.float32) * np.float32(0.5)).astype(dtype.np)
        ref = (a.astype(np.float32) + half.astype(np.float32)).astype(dtype.np)
    assert_same(out, ref)


def test_module_with_several_kernels_and_entry(rng):
    """`add_entry` chains kernels through external slots and arena offsets."""
    x, t, y = (L.Buffer(n, T.float32, (N,)) for n in ("x", "t", "y"))
    i = L.Var("i")
    k1 = L.PrimFunc("k1", (x, t), L.For(i, N, L.Store(t, (i,), x[i] * 3.0)))
    k2 = L.PrimFunc("k2", (t, y), L.For(i, N, L.Store(y, (i,), t[i] + 1.0)))
    mb = ModuleBuilder("chain")
    mb.add(k1)
    mb.add(k2)
    mb.add_entry("entry", [("k1", [("ext", 0), ("arena", 64)]),
                           ("k2", [("arena", 64), ("ext", 1)])])
    jm = JITModule(str(mb), host_target(), 2)
    a = rng.standard_normal(N).astype(np.float32)
    out = np.empty_like(a)
    arena = np.empty(64 + 4 * N, np.uint8)
    slots = (ctypes.c_void_p * 2)(a.ctypes.data, out.ctypes.data)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(jm.address("entry"))(
        slots, arena.ctypes.data)
    np.testing.assert_array_equal(out, a * np.float32(3) + np.float32(1))
    with pytest.raises(KeyError):
        jm.address("nope")


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("kind", [L.ForKind.BLOCK_X, L.ForKind.THREAD_Y])
def test_gpu_bound_loops_are_codegen_errors(kind):
    y = L.Buffer("y", T.float32, (8,))
    i = L.Var("i")
    f = L.PrimFunc("gpu", (y,), L.For(i, 8, L.Store(y, (i,), L.const(1.0)), kind))
    L.verify(f)
    with pytest.raises(CodegenError, match=kind.value):
        ModuleBuilder().add(f)


@pytest.mark.parametrize("name", L.SHUFFLES)
def test_warp_shuffles_are_codegen_errors(name):
    """GPU-only intrinsics: a CPU has no warp."""
    f = elementwise(name, [T.float32], T.float32,
                    lambda x: L.call(name, x, L.const(1, T.int32)))
    with pytest.raises(CodegenError, match=name):
        ModuleBuilder().add(f)


@pytest.mark.parametrize("name", sorted(L.PACKS.values()))
def test_tensor_core_packs_are_codegen_errors(name):
    """GPU-only intrinsics: tensor-core operand registers (test_cuda_precision.py renders
    them for cuda)."""
    args = 1 if name == "pack_tf32" else 2
    f = elementwise(name, [T.float32] * args, T.uint32,
                    lambda *x: L.call(name, *x, dtype=T.uint32))
    with pytest.raises(CodegenError, match=name):
        ModuleBuilder().add(f)


def test_cluster_loads_are_codegen_errors():
    """A GPU-only intrinsic: a CPU has no block clusters (test_cuda_wgmma.py renders it)."""
    f = elementwise("cluster_load", [T.float32], T.float32,
                    lambda x: L.call("cluster_load", x, L.const(1, T.int32), dtype=T.float32))
    with pytest.raises(CodegenError, match="cluster_load"):
        ModuleBuilder().add(f)


def test_word_loads_are_codegen_errors():
    """A GPU-only intrinsic (staged.py's loads ahead; test_cuda_codegen.py renders it)."""
    f = elementwise("load_word", [T.int8], T.uint32,
                    lambda x: L.call("load_word", x, dtype=T.uint32))
    with pytest.raises(CodegenError, match="load_word"):
        ModuleBuilder().add(f)


def test_barrier_is_a_codegen_error():
    y = L.Buffer("y", T.float32, (8,))
    i = L.Var("i")
    f = L.PrimFunc("bar", (y,), L.For(i, 8, L.seq(L.Barrier(), L.Store(y, (i,), L.const(1.0)))))
    with pytest.raises(CodegenError, match="barrier"):
        ModuleBuilder().add(f)


def test_unbound_variable_and_unknown_buffer_are_codegen_errors():
    y = L.Buffer("y", T.int64, (8,))
    i, k = L.Var("i"), L.Var("k")
    with pytest.raises(CodegenError, match="k"):
        ModuleBuilder().add(L.PrimFunc("unbound", (y,), L.For(i, 8, L.Store(y, (i,), k))))
    ghost = L.Buffer("ghost", T.int64, (8,))
    with pytest.raises(CodegenError, match="ghost"):
        ModuleBuilder().add(L.PrimFunc("ghost", (y,), L.For(i, 8, L.Store(ghost, (i,), i))))


def _malformed():
    x, y = L.Buffer("x", T.float32, (8,)), L.Buffer("y", T.float32, (8,))
    i, j, n = L.Var("i"), L.Var("j"), L.Var("n")
    yi = L.Buffer("y", T.int32, (8,))
    return {
        "out of scope": L.PrimFunc("f", (x, y), L.For(i, 8, L.Store(y, (j,), x[i]))),
        "size var not declared": L.PrimFunc("f", (x, y), L.For(i, n, L.Store(y, (i,), x[i]))),
        "rank": L.PrimFunc("f", (x, y), L.For(i, 8, L.Store(y, (i, i), x[i]))),
        "dtype": L.PrimFunc("f", (x, y), L.For(i, 8, L.Store(y, (i,), i))),
        "mixed": L.PrimFunc("f", (x, y), L.For(i, 8, L.Store(
            y, (i,), L.BinOp("+", x[i], L.Const(1.0, T.float64))))),
        "float index": L.PrimFunc("f", (x, y), L.For(i, 8, L.Store(y, (x[i],), x[i]))),
        "unknown buffer": L.PrimFunc("f", (x,), L.For(i, 8, L.Store(y, (i,), x[i]))),
        "other type": L.PrimFunc("f", (x, y), L.For(i, 8, L.Store(yi, (i,), L.Const(1, T.int32)))),
        "duplicate params": L.PrimFunc("f", (x, x), L.For(i, 8, L.Store(x, (i,), x[i]))),
        "rebinding": L.PrimFunc("f", (x, y), L.For(i, 8, L.For(i, 8, L.Store(y, (i,), x[i])))),
        "non-bool if": L.PrimFunc("f", (x, y), L.For(i, 8, L.If(i, L.Store(y, (i,), x[i])))),
        "barrier on cpu": L.PrimFunc("f", (x, y), L.seq(L.Barrier())),
        "reduce left": L.PrimFunc("f", (x, y), L.For(i, 8, L.Store(y, (i,), L.Reduce(
            "sum", x[j], (L.IterVar(j, L.const(8)),))))),
        "shared outside gpu": L.PrimFunc("f", (x, y), L.Allocate(
            L.Buffer("s", T.float32, (8,), L.Scope.SHARED), L.Seq(()))),
        "let dtype": L.PrimFunc("f", (x, y), L.Let(L.Var("v", T.float32), i * 1, L.Seq(()))),
    }


@pytest.mark.parametrize("case", list(_malformed()))
def test_verify_rejects_malformed_funcs(case):
    with pytest.raises(L.LoopIRError):
        L.verify(_malformed()[case])


@pytest.mark.parametrize("src, dst", [("float32", "int32"), ("int32", "float32"),
                                      ("float16", "int16"), ("bfloat16", "uint16"),
                                      ("uint16", "bfloat16"), ("float64", "uint64"),
                                      ("int8", "uint8")])
def test_bitcast_keeps_the_bits(rng, src, dst):
    s, d = T.DType.from_name(src), T.DType.from_name(dst)
    func = elementwise(f"bitcast_{src}_{dst}", [s], d, lambda x: L.call("bitcast", x, dtype=d))
    x = random(rng, s)
    assert_same(run1(jit(func, opt=3), func, [x], d), x.view(d.np))


@pytest.mark.parametrize("stride", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [T.float32, T.float64])
def test_strided_loads_in_vectorized_loops(rng, stride, dtype):
    """Lanes reading every stride-th element (a strided depthwise conv's input) load one span
    and shuffle; the span never reads past the last lane's element (the buffer ends there)."""
    lanes, blocks = 8, 3
    n = stride * (lanes * blocks - 1) + 1
    x = L.Buffer("x", dtype, (n,))
    y = L.Buffer("y", dtype, (lanes * blocks,))
    b, j = L.Var("b"), L.Var("j")
    idx = (b * lanes + j) * stride
    func = L.PrimFunc("strided", (x, y), L.For(b, blocks, L.For(
        j, lanes, L.Store(y, (b * lanes + j,), x[idx] * 2.0 + x[b * lanes + j]),
        L.ForKind.VECTORIZED)))
    xs = rng.standard_normal(n).astype(dtype.np)
    for opt in (0, 3):
        out = np.empty(lanes * blocks, dtype.np)
        call(jit(func, opt=opt), func, [xs, out])
        np.testing.assert_array_equal(out, xs[::stride] * 2 + xs[:lanes * blocks])


@pytest.mark.parametrize("op, reference", [("Min", np.minimum), ("Max", np.maximum)])
def test_min_max_of_odd_vector_widths(op, reference):
    """A 7x7 plane's <49 x float> llvm.minimum / maximum, two images of eight channels: LLVM
    put the constant into lanes 24-39 of the planes but each image's first (fuzz seed 3402
    case 50); now emitted in power-of-two pieces."""
    import onnx.helper as oh
    from onnx import TensorProto, numpy_helper

    import dnnc

    c = numpy_helper.from_array(np.array([[[[-0.4769]]]], np.float32), "c")
    graph = oh.make_graph([oh.make_node(op, ["c", "x"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 7, 7])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], [c])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    x = np.random.default_rng(34).standard_normal((2, 8, 7, 7)).astype(np.float32)
    x[0, 1, 3, 4] = np.nan
    got = dnnc.compile(model, "llvm", cache=False)(x)
    np.testing.assert_array_equal(got, reference(np.float32(-0.4769), x))
