"""Legalize (backends/legalize.py): each rule as a before / expected PrimFunc, the native set a
renderer declares, and `check_legal`, which a renderer asserts on. The values legalized code
computes are checked bit for bit by tests/backends/llvm (test_codegen, test_int_division),
which render through legalize."""

import pytest

from dnnc.backends import legalize as LG
from dnnc.backends.legalize import IllegalOpError, check_legal, illegal_ops, legalize
from dnnc.ir import loop as L
from dnnc.ir import types as T

N = 16
i = L.Var("i")


def kernel(fn, in_dtypes, out_dtype, name="k"):
    """`y[i] = fn(x0[i], x1[i], ...)` for i < N."""
    xs = tuple(L.Buffer(f"x{k}", d, (N,)) for k, d in enumerate(in_dtypes))
    y = L.Buffer("y", out_dtype, (N,))
    return L.PrimFunc(name, xs + (y,), L.For(i, N, L.Store(y, (i,), fn(*[x[i] for x in xs]))))


def lets(*pairs_and_body):
    """Let(v1, e1, Let(v2, e2, ... body))."""
    *pairs, body = pairs_and_body
    for var, value in reversed(pairs):
        body = L.Let(var, value, body)
    return body


def legal_body(func, native=frozenset()):
    out = legalize(func, native)
    L.verify(out)
    check_legal(out, native)
    assert legalize(out, native) == out, "legalize is idempotent"
    return out.body.body   # inside `for i`


def store(dtype, value):
    return L.Store(L.Buffer("y", dtype, (N,)), (i,), value)


def x(k, dtype):
    return L.Buffer(f"x{k}", dtype, (N,))[i]


def t(k, dtype):
    return L.Var(f"_t{k}", dtype)


F32, F64, F16, BF16 = T.float32, T.float64, T.float16, T.bfloat16


# ---------------------------------------------------------------------------------------------
# one rule at a time


def test_sigmoid_is_one_over_one_plus_exp_of_minus_x():
    body = legal_body(kernel(lambda v: L.call("sigmoid", v), [F32], F32))
    one = L.Const(1.0, F32)
    assert body == store(F32, one / (one + L.call("exp", L.call("neg", x(0, F32)))))


def test_rsqrt_is_one_over_sqrt():
    body = legal_body(kernel(lambda v: L.call("rsqrt", v), [F64], F64))
    assert body == store(F64, L.Const(1.0, F64) / L.call("sqrt", x(0, F64)))


def test_sign_of_floats_keeps_nan_and_binds_its_operand_once():
    body = legal_body(kernel(lambda v: L.call("sign", v), [F32], F32))
    v = t(1, F32)
    zero, one, minus = L.Const(0.0, F32), L.Const(1.0, F32), L.Const(-1.0, F32)
    expected = L.Select(L.ne(v, v), v, L.Select(v < zero, minus, L.Select(v > zero, one, zero)))
    assert body == lets((v, x(0, F32)), store(F32, expected))


def test_sign_of_unsigned_is_zero_or_one():
    body = legal_body(kernel(lambda v: L.call("sign", v), [T.uint8], T.uint8))
    v = t(1, T.uint8)
    zero, one = L.Const(0, T.uint8), L.Const(1, T.uint8)
    assert body == lets((v, x(0, T.uint8)), store(T.uint8, L.Select(v > zero, one, zero)))


@pytest.mark.parametrize("dtype", [F32, T.int32])
def test_isnan_and_isinf(dtype):
    nan = legal_body(kernel(lambda v: L.call("isnan", v), [dtype], T.bool_))
    inf = legal_body(kernel(lambda v: L.call("isinf", v), [dtype], T.bool_))
    if dtype.is_float:
        v = t(1, dtype)
        assert nan == lets((v, x(0, dtype)), store(T.bool_, L.ne(v, v)))
        assert inf == store(T.bool_, L.eq(L.call("abs", x(0, dtype)), L.Const(float("inf"), dtype)))
    else:   # integers are never NaN nor infinite
        assert nan == inf == store(T.bool_, L.Const(False, T.bool_))


def test_logical_not_of_bools_and_numbers():
    body = legal_body(kernel(lambda v: L.call("not", v), [T.bool_], T.bool_))
    assert body == store(T.bool_, L.BinOp("^", x(0, T.bool_), L.Const(True, T.bool_)))
    body = legal_body(kernel(lambda v: L.call("not", v), [F32], T.bool_))
    assert body == store(T.bool_, L.eq(x(0, F32), L.Const(0.0, F32)))


def test_integer_abs_and_neg():
    body = legal_body(kernel(lambda v: L.call("abs", v), [T.int16], T.int16))
    v, zero = t(1, T.int16), L.Const(0, T.int16)
    assert body == lets((v, x(0, T.int16)),
                        store(T.int16, L.Select(v < zero, L.BinOp("-", zero, v), v)))
    assert legal_body(kernel(lambda v: L.call("abs", v), [T.uint16], T.uint16)) == \
        store(T.uint16, x(0, T.uint16))
    assert legal_body(kernel(lambda v: L.call("neg", v), [T.int8], T.int8)) == \
        store(T.int8, L.BinOp("-", L.Const(0, T.int8), x(0, T.int8)))
    # float abs and neg are primitives (fabs, fneg: -0.0 is not 0 - 0.0)
    assert legal_body(kernel(lambda v: L.call("neg", v), [F32], F32)) == \
        store(F32, L.call("neg", x(0, F32)))


def test_float_floor_division_and_modulo():
    body = legal_body(kernel(lambda a, b: a // b, [F32, F32], F32))
    assert body == store(F32, L.call("floor", L.BinOp("/", x(0, F32), x(1, F32))))
    body = legal_body(kernel(lambda a, b: a % b, [F64, F64], F64))
    assert body == store(F64, L.call("fmod", x(0, F64), x(1, F64)))


# -- integer division -------------------------------------------------------------------------


def test_signed_floor_division_by_a_runtime_divisor_guards_before_dividing():
    """x // 0 = 0 and MIN // -1 = MIN: the divisor becomes 1 first (sdiv by 0 is undefined
    even where a later select drops its result), then floor from truncation."""
    I32 = T.int32
    body = legal_body(kernel(lambda a, b: a // b, [I32, I32], I32))
    a, b, by_zero, safe, r = t(1, I32), t(2, I32), t(3, T.bool_), t(4, I32), t(5, I32)
    zero = L.Const(0, I32)
    unsafe = L.logical_or(by_zero, L.logical_and(L.eq(a, L.Const(-2 ** 31, I32)),
                                                 L.eq(b, L.Const(-1, I32))))
    adjust = L.logical_and(L.ne(r, zero), L.ne(r < zero, safe < zero))
    floor = L.Call("idiv", (a, safe), I32) - L.Cast(I32, adjust)
    assert body == lets((a, x(0, I32)), (b, x(1, I32)), (by_zero, L.eq(b, zero)),
                        (safe, L.Select(unsafe, L.Const(1, I32), b)),
                        (r, L.Call("irem", (a, safe), I32)),
                        store(I32, L.Select(by_zero, zero, floor)))


def test_signed_modulo_by_a_positive_constant_needs_no_guard():
    I64 = T.int64
    body = legal_body(kernel(lambda a: a % L.Const(3, I64), [I64], I64))
    a, r, adjust = t(1, I64), t(2, I64), t(3, T.bool_)
    zero, three = L.Const(0, I64), L.Const(3, I64)
    assert body == lets((a, x(0, I64)), (r, L.Call("irem", (a, three), I64)),
                        (adjust, L.logical_and(L.ne(r, zero), L.ne(r < zero, three < zero))),
                        store(I64, L.Select(adjust, r + three, r)))


def test_truncating_and_unsigned_division():
    """C division needs no floor fix-up; unsigned floor is truncation; neither guards MIN."""
    body = legal_body(kernel(lambda a: L.BinOp("/", a, L.Const(7, T.int32)), [T.int32], T.int32))
    assert body == store(T.int32, L.Call("idiv", (x(0, T.int32), L.Const(7, T.int32)), T.int32))
    U8 = T.uint8
    body = legal_body(kernel(lambda a, b: a % b, [U8, U8], U8))
    b, by_zero = t(1, U8), t(2, T.bool_)
    zero = L.Const(0, U8)
    assert body == lets((b, x(1, U8)), (by_zero, L.eq(b, zero)), store(U8, L.Select(
        by_zero, zero, L.Call("irem", (x(0, U8), L.Select(by_zero, L.Const(1, U8), b)), U8))))


def test_index_division_by_bounds_is_unsigned_and_sees_through_its_own_rewrites():
    """i // 4 and (i // 4) % 8 with i >= 0: unsigned (a shift), no guard, no fix-up; the
    outer one knows i // 4 >= 0 from the expression before legalize."""
    src = L.Buffer("x0", F32, (N,))
    y = L.Buffer("y", F32, (4, 8))
    func = L.PrimFunc("idx", (src, y), L.For(i, N, L.Store(y, ((i // 4) % 8, i % 4), src[i])))
    out = legalize(func)
    check_legal(out)
    U = T.uint64

    def unsigned(name, a, b):
        return L.Cast(T.int64, L.Call(name, (L.Cast(U, a), L.Cast(U, b)), U))

    quarter = unsigned("idiv", i, L.const(4))
    assert out.body.body == L.Store(y, (unsigned("irem", quarter, L.const(8)),
                                        unsigned("irem", i, L.const(4))), src[i])


def test_divisor_whose_bounds_exclude_zero_and_minus_one_is_not_guarded():
    j = L.Var("j")
    xs, y = L.Buffer("x0", T.int32, (N,)), L.Buffer("y", T.int32, (N, 4))
    d = L.Cast(T.int32, j + 1)   # (the cast hides j + 1 >= 1 from bounds: guarded)
    guarded = L.PrimFunc("g", (xs, y), L.For(i, N, L.For(j, 4, L.Store(y, (i, j), xs[i] / d))))
    assert any(isinstance(n, L.Select) for n in L.walk(legalize(guarded).body))
    n = L.Var("n")
    xs64, y64 = L.Buffer("x0", T.int64, (N,)), L.Buffer("y", T.int64, (N,))
    func = L.PrimFunc("s", (xs64, y64), L.For(i, N, L.Store(y64, (i,), L.BinOp(
        "/", xs64[i], n))), size_vars=(n,))   # size vars are >= 1
    assert legal_body(func) == L.Store(y64, (i,), L.Call("idiv", (xs64[i], n), T.int64))


# -- float16 and bfloat16 ---------------------------------------------------------------------


def test_half_arithmetic_runs_in_float32_rounded_after_every_op():
    body = legal_body(kernel(lambda a, b: a * b + a, [F16, F16], F16))
    a, b = L.Cast(F32, x(0, F16)), L.Cast(F32, x(1, F16))
    assert body == store(F16, L.Cast(F16, L.Cast(F32, L.Cast(F16, a * b)) + a))


def test_half_expansions_run_in_float32_and_round_once():
    """sigmoid(float16) is one op: expanded in float32, rounded once at the end."""
    body = legal_body(kernel(lambda v: L.call("sigmoid", v), [F16], F16))
    one = L.Const(1.0, F32)
    v = L.Cast(F32, x(0, F16))
    assert body == store(F16, L.Cast(F16, one / (one + L.call("exp", L.call("neg", v)))))


def test_half_compares_constants_and_casts_go_through_float32():
    body = legal_body(kernel(lambda v: v < L.Const(0.1, F16), [F16], T.bool_))
    rounded = float(F16.np.type(0.1))   # the float16 constant, exactly
    assert body == store(T.bool_, L.Cast(F32, x(0, F16)) < L.Const(rounded, F32))
    body = legal_body(kernel(lambda v: L.Cast(F16, v), [T.int64], F16))
    assert body == store(F16, L.Cast(F16, L.Cast(F32, x(0, T.int64))))
    native = frozenset({"float_to_int"})   # (its range guard: test_float_to_int_*)
    body = legal_body(kernel(lambda v: L.Cast(T.int8, v), [F16], T.int8), native)
    assert body == store(T.int8, L.Cast(T.int8, L.Cast(F32, x(0, F16))))


def test_half_only_moves_where_nothing_is_computed():
    y = L.Buffer("y", F16, (N,))
    xs = L.Buffer("x0", F16, (N,))
    body = L.Store(y, (i,), L.Select(i < 4, xs[i], L.Const(0.5, F16)))
    func = L.PrimFunc("move", (xs, y), L.For(i, N, body))
    assert legalize(func) == func


def test_float_to_int32_and_int64_convert_only_values_in_range():
    """Never an fptosi of a value out of range (poison in LLVM, saturated by CUDA's cvt): the
    conversion sees 0 there and the select gives MIN (NaN compares false: MIN too)."""
    for src, dst, bound in ((F32, T.int32, 2.0 ** 31), (F64, T.int64, 2.0 ** 63)):
        body = legal_body(kernel(lambda v: L.Cast(dst, v), [src], dst))
        v, inside = t(1, src), t(2, T.bool_)
        safe = L.Select(inside, v, L.Const(0.0, src))
        assert body == lets(
            (v, x(0, src)),
            (inside, L.logical_and(v >= L.Const(-bound, src), v < L.Const(bound, src))),
            store(dst, L.Select(inside, L.Call("ftoi", (safe,), dst),
                                L.const(-int(bound), dst))))


def test_float_to_narrow_ints_goes_through_int32_and_unsigned_32_64_through_signed():
    for dst in (T.int8, T.int16, T.uint8, T.uint16):
        body = legal_body(kernel(lambda v: L.Cast(dst, v), [F64], dst))
        assert isinstance(body.body.body, L.Store) and body.body.body.value.dtype is dst
        assert body.body.body.value.value.dtype is T.int32   # the low bits of int32(x)
    for dst, signed in ((T.uint32, T.int32), (T.uint64, T.int64)):
        body = legal_body(kernel(lambda v: L.Cast(dst, v), [F32], dst))
        ftoi = [n for n in L.walk(body) if isinstance(n, L.Call) and n.name == "ftoi"]
        assert len(ftoi) == 2 and all(n.dtype is signed for n in ftoi)   # x and x - 2**(N-1)
    for src in (F16, BF16):   # narrow floats convert from float32
        body = legal_body(kernel(lambda v: L.Cast(T.uint64, v), [src], T.uint64))
        assert {n.args[0].dtype for n in L.walk(body)
                if isinstance(n, L.Call) and n.name == "ftoi"} == {F32}
    # no float -> integer Cast is left for a renderer
    for src in (F16, BF16, F32, F64):
        for dst in (T.int8, T.uint8, T.int16, T.uint16, T.int32, T.uint32, T.int64, T.uint64):
            body = legal_body(kernel(lambda v: L.Cast(dst, v), [src], dst))
            assert not any(isinstance(n, L.Cast) and n.value.dtype.is_float and n.dtype.is_int
                           for n in L.walk(body))
        assert illegal_ops(kernel(lambda v: L.Cast(T.int32, v), [src], T.int32))


def test_float_to_8_and_16_bits_keep_only_the_inner_select():
    """To 8 and 16 bits: low bits of ftoi(select(in, x, 0)) (MIN's low bits are 0, as
    ftoi(0)'s); of a value clamped between constants inside int32 (a quantizer's
    saturation: in range or NaN) `in` is x == x."""
    for dst in (T.int8, T.uint8, T.int16):
        body = legal_body(kernel(lambda v: L.Cast(dst, v), [F32], dst))
        v, inside = t(1, F32), t(2, T.bool_)
        assert body == lets(
            (v, x(0, F32)),
            (inside, L.logical_and(v >= L.Const(-(2.0 ** 31), F32),
                                   v < L.Const(2.0 ** 31, F32))),
            store(dst, L.Cast(dst, L.Call("ftoi", (L.Select(inside, v, L.Const(0.0, F32)),),
                                          T.int32))))
    def clamped(lo, hi):
        return lambda v: L.Cast(T.int8, L.minimum(L.maximum(v, lo), hi))

    body = legal_body(kernel(clamped(-128.0, 127.0), [F32], T.int8))
    v = t(1, F32)
    assert body == lets((v, L.minimum(L.maximum(x(0, F32), -128.0), 127.0)), store(
        T.int8, L.Cast(T.int8, L.Call("ftoi", (L.Select(L.eq(v, v), v, L.Const(0.0, F32)),),
                                      T.int32))))
    for lo, hi in ((-128.0, 2.0 ** 31), (float("-inf"), 127.0)):   # a bound out of int32
        assert not any(isinstance(n, L.BinOp) and n.op == "==" for n in
                       L.walk(legal_body(kernel(clamped(lo, hi), [F32], T.int8))))


def test_float64_to_float16_rounds_to_odd_through_float32():
    body = legal_body(kernel(lambda v: L.Cast(F16, v), [F64], F16))
    casts = [(n.value.dtype, n.dtype) for n in L.walk(body) if isinstance(n, L.Cast)]
    assert (F64, F16) not in casts and (F32, F16) in casts and (F64, F32) in casts
    assert any(isinstance(n, L.Call) and n.name == "bitcast" for n in L.walk(body))


def test_bfloat16_casts_become_bit_operations():
    body = legal_body(kernel(lambda a, b: a + b, [BF16, BF16], BF16))
    assert not any(isinstance(n, L.Cast) and BF16 in (n.dtype, n.value.dtype)
                   for n in L.walk(body))
    ops = {n.op for n in L.walk(body) if isinstance(n, L.BinOp)}
    assert {"<<", ">>", "&", "|", "+"} <= ops


# ---------------------------------------------------------------------------------------------
# the native set, the checker, names


def test_native_rules_are_left_to_the_renderer():
    func = kernel(lambda v: L.call("sigmoid", L.call("rsqrt", v)), [F32], F32)
    out = legalize(func, native=frozenset({"sigmoid"}))
    names = {n.name for n in L.walk(out.body) if isinstance(n, L.Call)}
    assert "sigmoid" in names and "rsqrt" not in names and "sqrt" in names
    check_legal(out, frozenset({"sigmoid"}))
    with pytest.raises(IllegalOpError, match="sigmoid"):
        check_legal(out)


def test_checker_names_every_illegal_op():
    func = kernel(lambda a, b: L.call("sign", a) + a // b + L.call("rsqrt", b), [F32, F32], F32)
    found = illegal_ops(func)
    assert any(s.startswith("sign(") for s in found)
    assert any(s.startswith("rsqrt(") for s in found)
    assert any("//" in s for s in found)
    assert illegal_ops(legalize(func)) == []


def test_every_rule_is_named_and_unknown_native_names_are_refused():
    assert all(fn.__doc__ for fn in LG.RULES.values())
    with pytest.raises(ValueError, match="no_such_rule"):
        legalize(kernel(lambda v: v, [F32], F32), native=frozenset({"no_such_rule"}))


def test_bound_names_do_not_collide_and_stay_in_their_statement():
    """A `_t1` of the kernel's own is not reused; each statement binds its own operands."""
    I32 = T.int32
    xs = L.Buffer("x0", I32, (N,))
    y = L.Buffer("y", I32, (N,))
    taken = L.Var("_t1", I32)
    body = L.Let(taken, xs[i], L.seq(L.Store(y, (i,), taken // xs[i]),
                                     L.Store(y, (i,), xs[i] % taken)))
    out = legalize(L.PrimFunc("names", (xs, y), L.For(i, N, body)))
    L.verify(out)
    check_legal(out)
    names = [n.var.name for n in L.walk(out.body) if isinstance(n, L.Let)]
    assert names.count("_t1") == 1 and len(names) == len(set(names))


def test_renderer_input_is_legal_for_its_native_set():
    """The LLVM renderer legalizes what it is given with its own native set."""
    from dnnc.backends.llvm import codegen
    assert codegen.NATIVE <= set(LG.RULES)
    func = kernel(lambda v: L.call("sigmoid", v) // L.Const(2.0, F16), [F16], F16)
    check_legal(legalize(func, codegen.NATIVE), codegen.NATIVE)


def test_a_view_of_a_parameter_keeps_its_own_shape():
    """Templates read a parameter through a view of another shape under the same name (the
    pointwise conv reads x[1, c, h, w] as x[1, c, h*w]); both survive, each with its own."""
    x4 = L.Buffer("x", F32, (1, 4, 2, 2))
    x3 = L.Buffer("x", F32, (1, 4, 4))
    y = L.Buffer("y", F32, (4, 4))
    j = L.Var("j")
    body = L.For(i, 4, L.For(j, 4, L.Store(y, (i, j), x3[0, i, j] + x4[0, i, 0, 0])))
    func = L.PrimFunc("view", (x4, y), body)
    assert legalize(func) == func


def test_pack_u8x4_is_its_bytes_shifted_and_ored():
    func = kernel(lambda *b: L.call("pack_u8x4", *b, dtype=T.uint32), [T.uint8] * 4, T.uint32)
    u32 = T.uint32
    expected = L.Cast(u32, x(0, T.uint8))
    for k in (1, 2, 3):
        expected = L.BinOp("|", expected, L.BinOp("<<", L.Cast(u32, x(k, T.uint8)),
                                                  L.Const(8 * k, u32)))
    assert legal_body(func) == store(u32, expected)
    assert legal_body(func, frozenset({"pack_u8x4"})) == func.body.body
