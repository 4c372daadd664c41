"""How LLVM spells dnnc's primitive types and ops: the register and memory type of each dtype,
and the op tables the LLVM renderer (`codegen.py`) and its vectoriser (`vectorize.py`) emit
through: `BINARY`, `CALLS` and `CASTS`, keyed by (operand class, op) -> emitter.

Every entry is one LLVM instruction, intrinsic or libm call on values already legalized
(`backends/legalize.py`): what an op means is settled there, never here. An emitter takes the
function emitter (its builder `b`, its module builder `mb`) and LLVM values, scalars or vectors
alike, and must never walk loop IR itself.
"""

from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...ir import loop as L
from ...ir import types as T
from . import int8

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), \
    ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()

_INT_BITS = {1: I8, 2: I16, 4: I32, 8: I64}
_FLOAT_TYPES = {T.float16: F16, T.float32: F32, T.float64: F64}
_FLOAT_BITS = {F16: 16, F32: 32, F64: 64}


def compute_type(dtype: T.DType) -> ir.Type:
    """The register type values of `dtype` are computed in."""
    if dtype.kind == "b":
        return I1
    return _FLOAT_TYPES.get(dtype) or _INT_BITS[dtype.itemsize]   # bfloat16: its bits


def memory_type(dtype: T.DType) -> ir.Type:
    """The type `dtype` is stored as."""
    return I8 if dtype.kind == "b" else compute_type(dtype)


def op_class(dtype: T.DType) -> str:
    """`dtype`'s key in the op tables: f(loat), s(igned) or u(nsigned, bool included)."""
    return "f" if dtype.is_float else "s" if dtype.kind == "i" else "u"


def cast_class(dtype: T.DType) -> str:
    """`dtype`'s key in `CASTS`: as `op_class`, with b(ool) apart."""
    return "b" if dtype.kind == "b" else op_class(dtype)


def intrinsic_suffix(ty: ir.Type) -> str:
    """LLVM's overloaded-intrinsic suffix: f32, i64, v8f32, ..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{intrinsic_suffix(ty.element)}"
    return {F16: "f16", F32: "f32", F64: "f64"}.get(ty) or f"i{ty.width}"


def _scalar(ty: ir.Type) -> ir.Type:
    return ty.element if isinstance(ty, ir.VectorType) else ty


def _zero(ty: ir.Type) -> ir.Constant:
    """0 of `ty`, a scalar or a vector type."""
    zero = 0.0 if _scalar(ty) in _FLOAT_BITS else 0
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [zero] * ty.count)
    return ir.Constant(ty, zero)


# ---------------------------------------------------------------------------------------------
# Op tables: each emitter takes the function emitter (its builder `b`, its module `mb`)
# and LLVM values, scalars or vectors alike.


def _intrinsic(name: str) -> Callable:
    def emit(em, *args):
        return em.b.call(em.mb.intrinsic(name, args[0].type, len(args)), list(args))
    return emit


def _in_powers_of_two(name: str) -> Callable:
    """Intrinsic `name` on scalars, or on a vector in pieces of power-of-two widths, widest
    first, joined: LLVM 22's x86 code for llvm.minimum on <49 x float> (a 7x7 plane of two
    images' eight channels, fuzz seed 3402 case 50) put the other operand's lanes into 16 of
    the 49 lanes (24-39) of every plane but each image's first."""
    call = _intrinsic(name)

    def emit(em, a, b):
        count = a.type.count if isinstance(a.type, ir.VectorType) else 0
        if count & (count - 1) == 0:   # a scalar (0) or a power of two
            return call(em, a, b)
        parts, start = [], 0
        while start < count:
            picks = list(range(start, start + (1 << ((count - start).bit_length() - 1))))
            parts.append(call(em, _lanes(em, a, picks), _lanes(em, b, picks)))
            start += len(picks)
        out = parts[0]
        for part in parts[1:]:
            out = _concat(em, out, part)
        return out
    return emit


def _libm(name: str) -> Callable:
    """A C library call: `name` for double, `name`f for float (scalars only)."""
    def emit(em, *args):
        ty = args[0].type
        fname = name + ("f" if ty == F32 else "")
        return em.b.call(em.mb.declare(fname, ty, [ty] * len(args)), list(args))
    return emit


def _int_min_max(pred: str, signed: bool) -> Callable:
    def emit(em, a, b):
        cmp = em.b.icmp_signed if signed else em.b.icmp_unsigned
        return em.b.select(cmp(pred, a, b), a, b)
    return emit


class _BFloat(ir.Type):
    """LLVM's `bfloat` (llvmlite spells no such type): only the operand type of `vdpbf16ps`'s
    intrinsic, reached by bitcasting 32-bit words of pairs."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, _BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


DPBF16_WIDTHS = (16, 8, 4)
"""Lanes of `vdpbf16ps` (512, 256 and 128 bits), widest first: a vector is done in chunks."""


def _dot_bf16x2(em, acc, a, b):
    """`dot_bf16x2` (`ir/loop/nodes.INTRINSICS`) as AVX512_BF16's vdpbf16ps, emitted only
    where the CPU has it (legalize expands it elsewhere): a scalar as lane 0 of the 128-bit
    form, a vector in chunks of 16, 8 and 4 lanes (the last padded with lane 0's values)."""
    return _in_chunks(em, acc, a, b, DPBF16_WIDTHS, _dpbf16)


def _in_chunks(em, acc, a, b, widths, one):
    """`one(em, acc, a, b)` (a dot-product instruction of `widths` lanes, widest first) over
    scalars or vectors of any width: a scalar as lane 0 of the 4-lane form, a vector in
    chunks of the widest width that fits, the last padded with lane 0's values, the chunks'
    results joined."""
    count = acc.type.count if isinstance(acc.type, ir.VectorType) else 0
    if not count:
        lanes = [em.b.insert_element(ir.Constant(ir.VectorType(x.type, 4), ir.Undefined), x,
                                     ir.Constant(I32, 0)) for x in (acc, a, b)]
        return em.b.extract_element(one(em, *lanes), ir.Constant(I32, 0))
    parts, start = [], 0
    while start < count:
        width = next((w for w in widths if w <= count - start), widths[-1])
        picks = [start + k if start + k < count else 0 for k in range(width)]
        parts.append(one(em, *(_lanes(em, x, picks) for x in (acc, a, b))))
        start += width
    out = parts[0]
    for part in parts[1:]:
        out = _concat(em, out, part)
    return out if out.type.count == count else _lanes(em, out, list(range(count)))


def _lanes(em, x, picks):
    mask = ir.Constant(ir.VectorType(I32, len(picks)), picks)
    return em.b.shuffle_vector(x, ir.Constant(x.type, ir.Undefined), mask)


def _concat(em, x, y):
    """x's lanes then y's, y no wider than x (shufflevector takes operands of one type)."""
    n, m = x.type.count, y.type.count
    if m < n:
        y = _lanes(em, y, [k if k < m else 0 for k in range(n)])
    picks = list(range(n)) + [n + k for k in range(m)]
    return em.b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, n + m), picks))


def _dpbf16(em, acc, a, b):
    """One vdpbf16ps on `acc` (<w x float>) and the pairs in `a`, `b` (<w x i32>)."""
    width = acc.type.count
    pairs = ir.VectorType(_BFloat(), 2 * width)
    bits = {16: 512, 8: 256, 4: 128}[width]
    fn = em.mb.declare(f"llvm.x86.avx512bf16.dpbf16ps.{bits}", acc.type,
                       [acc.type, pairs, pairs])
    return em.b.call(fn, [acc, em.b.bitcast(a, pairs), em.b.bitcast(b, pairs)])


def _dot_u8s8x4(em, acc, a, b):
    """`dot_u8s8x4` (`ir/loop/nodes.INTRINSICS`) as vpdpbusd, emitted only where the CPU has
    it (`int8.native`; legalize expands it elsewhere): a scalar as lane 0 of the 128-bit form,
    a vector in chunks of the widths the features give (`int8.dot_widths`), the last padded
    with lane 0's values. AVX-VNNI's VEX form is the same LLVM intrinsic at 256 / 128 bits."""
    return _in_chunks(em, acc, a, b, int8.dot_widths(em.mb.features), _dpbusd)


def _dpbusd(em, acc, a, b):
    """One vpdpbusd on `acc`, unsigned bytes `a`, signed bytes `b` (<w x i32> each)."""
    bits = {16: 512, 8: 256, 4: 128}[acc.type.count]
    fn = em.mb.declare(f"llvm.x86.avx512.vpdpbusd.{bits}", acc.type, [acc.type] * 3)
    return em.b.call(fn, [acc, a, b])


def _pack_u8x4(em, *parts):
    """`pack_u8x4` on scalars: byte t zero-extended, shifted left by 8t, or'ed."""
    word = None
    for t, part in enumerate(parts):
        part = em.b.zext(part, I32)
        part = part if t == 0 else em.b.shl(part, ir.Constant(I32, 8 * t))
        word = part if word is None else em.b.or_(word, part)
    return word


BINARY: dict[tuple[str, str], Callable] = {
    ("f", "+"): lambda em, a, b: em.b.fadd(a, b),
    ("f", "-"): lambda em, a, b: em.b.fsub(a, b),
    ("f", "*"): lambda em, a, b: em.b.fmul(a, b),
    ("f", "/"): lambda em, a, b: em.b.fdiv(a, b),
    # NaN-propagating, as NumPy's minimum / maximum (minnum would drop the NaN)
    ("f", "min"): _in_powers_of_two("llvm.minimum"),
    ("f", "max"): _in_powers_of_two("llvm.maximum"),
    # ordered compares are false on NaN; != is unordered, so true on NaN (IEEE, NumPy)
    **{("f", op): (lambda em, a, b, op=op: em.b.fcmp_ordered(op, a, b))
       for op in ("==", "<", "<=", ">", ">=")},
    ("f", "!="): lambda em, a, b: em.b.fcmp_unordered("!=", a, b),
    **{(c, op): fn for c in "su" for op, fn in (
        ("+", lambda em, a, b: em.b.add(a, b)), ("-", lambda em, a, b: em.b.sub(a, b)),
        ("*", lambda em, a, b: em.b.mul(a, b)), ("&", lambda em, a, b: em.b.and_(a, b)),
        ("|", lambda em, a, b: em.b.or_(a, b)), ("^", lambda em, a, b: em.b.xor(a, b)),
        ("<<", lambda em, a, b: em.b.shl(a, b)), ("and", lambda em, a, b: em.b.and_(a, b)),
        ("or", lambda em, a, b: em.b.or_(a, b)))},
    ("s", ">>"): lambda em, a, b: em.b.ashr(a, b),
    ("u", ">>"): lambda em, a, b: em.b.lshr(a, b),
    **{("s", op): (lambda em, a, b, op=op: em.b.icmp_signed(op, a, b)) for op in L.COMPARE},
    **{("u", op): (lambda em, a, b, op=op: em.b.icmp_unsigned(op, a, b)) for op in L.COMPARE},
    ("s", "min"): _int_min_max("<", True), ("s", "max"): _int_min_max(">", True),
    ("u", "min"): _int_min_max("<", False), ("u", "max"): _int_min_max(">", False),
}
"""(class of the operands, BinOp op) -> emitter(em, a, b)."""

CALLS: dict[tuple[str, str], Callable] = {
    # intrinsics with an LLVM counterpart (vectorisable by LLVM); the rest call libm
    **{("f", name): _intrinsic(llvm) for name, llvm in (
        ("exp", "llvm.exp"), ("log", "llvm.log"), ("sqrt", "llvm.sqrt"), ("sin", "llvm.sin"),
        ("cos", "llvm.cos"), ("tan", "llvm.tan"), ("asin", "llvm.asin"),
        ("acos", "llvm.acos"), ("atan", "llvm.atan"), ("sinh", "llvm.sinh"),
        ("cosh", "llvm.cosh"), ("tanh", "llvm.tanh"), ("floor", "llvm.floor"),
        ("ceil", "llvm.ceil"), ("round", "llvm.roundeven"), ("trunc", "llvm.trunc"),
        ("pow", "llvm.pow"), ("fma", "llvm.fmuladd"), ("abs", "llvm.fabs"))},
    **{("f", name): _libm(name) for name in ("erf", "asinh", "acosh", "atanh", "log1p",
                                             "expm1", "fmod", "atan2")},
    ("f", "neg"): lambda em, x: em.b.fneg(x),
    ("f", "dot_bf16x2"): _dot_bf16x2,
    ("s", "dot_u8s8x4"): _dot_u8s8x4,
    ("u", "pack_u8x4"): _pack_u8x4,
    # legalize's primitives: C's truncating quotient and remainder, the divisor made safe
    ("s", "idiv"): lambda em, a, b: em.b.sdiv(a, b),
    ("u", "idiv"): lambda em, a, b: em.b.udiv(a, b),
    ("s", "irem"): lambda em, a, b: em.b.srem(a, b),
    ("u", "irem"): lambda em, a, b: em.b.urem(a, b),
}
"""(class of the first argument, Call name) -> emitter(em, *args); `bitcast` is apart."""


def _resize(signed: bool) -> Callable:
    def emit(em, v, ty):
        src, dst = _scalar(v.type).width, _scalar(ty).width
        if dst < src:
            return em.b.trunc(v, ty)
        if dst > src:
            return em.b.sext(v, ty) if signed else em.b.zext(v, ty)
        return v
    return emit


def _float_resize(em, v, ty):
    src, dst = _FLOAT_BITS[_scalar(v.type)], _FLOAT_BITS[_scalar(ty)]
    if dst == src:
        return v
    return em.b.fpext(v, ty) if dst > src else em.b.fptrunc(v, ty)


CASTS: dict[tuple[str, str], Callable] = {
    ("f", "f"): _float_resize,
    ("s", "f"): lambda em, v, ty: em.b.sitofp(v, ty),
    ("u", "f"): lambda em, v, ty: em.b.uitofp(v, ty),
    ("b", "f"): lambda em, v, ty: em.b.uitofp(v, ty),
    ("f", "b"): lambda em, v, ty: em.b.fcmp_unordered("!=", v, _zero(v.type)),  # NaN: true
    ("s", "b"): lambda em, v, ty: em.b.icmp_unsigned("!=", v, _zero(v.type)),
    ("u", "b"): lambda em, v, ty: em.b.icmp_unsigned("!=", v, _zero(v.type)),
    ("b", "s"): lambda em, v, ty: em.b.zext(v, ty),
    ("b", "u"): lambda em, v, ty: em.b.zext(v, ty),
    ("s", "s"): _resize(True), ("s", "u"): _resize(True),
    ("u", "s"): _resize(False), ("u", "u"): _resize(False),
}
"""(source class, destination class) -> emitter(em, value, destination type). No float ->
integer entry: legalize writes those as `ftoi` of a value in range (fptosi / fptoui out of
range are poison)."""
