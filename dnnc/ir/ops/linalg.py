"""Linear algebra ops: MatMul, Gemm, MatMulInteger, Einsum, Det.

References compute low-precision floats (float16, bfloat16) in float32 and round once at the
end, as the kernels will; integer matmuls accumulate in int32 as ONNX specifies.
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..types import broadcast_shapes
from .infer import check_dtype, check_same_dtype
from .registry import Pattern, register_op

MATMUL_DTYPES = T.FLOAT_DTYPES + (T.int32, T.int64, T.uint32, T.uint64)
QUANT_INT8 = (T.int8, T.uint8)


def _widened(x: np.ndarray) -> np.ndarray:
    """float16 / bfloat16 operands computed in float32."""
    return x.astype(np.float32) if x.dtype in (np.float16, T.bfloat16.np) else x


def matmul_shape(ctx, a: tuple, b: tuple) -> tuple:
    """Output shape of NumPy-style matmul, batch dims broadcast, 1-D operands promoted."""
    if not a or not b:
        raise ctx.fail("MatMul operands must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    k_a, k_b = a2[-1], b2[-2]
    if isinstance(k_a, int) and isinstance(k_b, int) and k_a != k_b:
        raise ctx.fail(f"inner dimensions differ: {a} @ {b}")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


# -- MatMul -------------------------------------------------------------------------------------


def _matmul_infer(ctx):
    check_same_dtype(ctx)
    check_dtype(ctx, 0, MATMUL_DTYPES)
    return [T.TensorType(ctx.dtype(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def matmul(a, b):
    return np.matmul(_widened(a), _widened(b)).astype(a.dtype)


register_op("MatMul", pattern=Pattern.OUT_FUSABLE, infer=_matmul_infer, evaluate=matmul,
            inputs=2)


# -- Gemm ---------------------------------------------------------------------------------------


def _gemm_infer(ctx):
    check_same_dtype(ctx)
    check_dtype(ctx, 0, MATMUL_DTYPES)
    a, b = ctx.shape(0), ctx.shape(1)
    if len(a) != 2 or len(b) != 2:
        raise ctx.fail(f"A and B must be 2-D, given {a} and {b}")
    m, k_a = (a[1], a[0]) if ctx.attrs["transA"] else a
    k_b, n = (b[1], b[0]) if ctx.attrs["transB"] else b
    if isinstance(k_a, int) and isinstance(k_b, int) and k_a != k_b:
        raise ctx.fail(f"inner dimensions differ: {k_a} vs {k_b}")
    if ctx.has(2):
        try:
            out = broadcast_shapes((m, n), ctx.shape(2))
        except ValueError as exc:
            raise ctx.fail(f"C of shape {ctx.shape(2)} does not broadcast to ({m}, {n}): {exc}")
        if len(out) != 2:
            raise ctx.fail(f"C of shape {ctx.shape(2)} does not broadcast to ({m}, {n})")
    return [T.TensorType(ctx.dtype(0), (m, n))]


def gemm(a, b, c=None, *, alpha, beta, transA, transB):
    dtype = a.dtype
    a = _widened(a.T if transA else a)
    b = _widened(b.T if transB else b)
    y = a @ b
    if alpha != 1:
        y = alpha * y
    if c is not None:
        y = y + (beta * _widened(c) if beta != 1 else _widened(c))
    return np.asarray(y).astype(dtype)


register_op("Gemm", pattern=Pattern.OUT_FUSABLE, infer=_gemm_infer, evaluate=gemm,
            attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}, inputs=(2, 3))


# -- MatMulInteger ------------------------------------------------------------------------------


def _matmul_integer_infer(ctx):
    check_dtype(ctx, 0, QUANT_INT8, "A")
    check_dtype(ctx, 1, QUANT_INT8, "B")
    for i, operand in ((2, 0), (3, 1)):
        if ctx.has(i) and ctx.dtype(i) != ctx.dtype(operand):
            raise ctx.fail(f"zero point {i} must have its operand's type "
                           f"{ctx.dtype(operand).name}, given {ctx.dtype(i).name}")
    return [T.TensorType(T.int32, matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    a = a.astype(np.int32)
    b = b.astype(np.int32)
    if a_zero_point is not None:
        zp = a_zero_point.astype(np.int32)
        # a per-row zero point of a 2-D A is a column vector
        a = a - (zp.reshape(-1, 1) if zp.ndim == 1 and a.ndim >= 2 and zp.size > 1 else zp)
    if b_zero_point is not None:
        b = b - b_zero_point.astype(np.int32)
    return np.matmul(a, b).astype(np.int32)


register_op("MatMulInteger", pattern=Pattern.OUT_FUSABLE, infer=_matmul_integer_infer,
            evaluate=matmul_integer, inputs=(2, 4))


# -- Einsum -------------------------------------------------------------------------------------


def parse_einsum(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Split an equation into per-input terms and the output term, ellipses spelled out.

    Ellipsis dims become the upper-case-free private letters '0'..'9' (einsum letters are
    ASCII letters only), so the result can be handed to shape logic uniformly.
    """
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} names {len(terms)} inputs, given {len(ranks)}")
    ellipsis_rank = 0
    for term, rank in zip(terms, ranks):
        if "..." in term:
            ellipsis_rank = max(ellipsis_rank, rank - (len(term) - 3))
    ell = "".join(str(i) for i in range(ellipsis_rank))
    spelled = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            n = rank - (len(term) - 3)
            term = term.replace("...", ell[ellipsis_rank - n:])
        if len(term) != rank:
            raise ValueError(f"term {term!r} does not match an input of rank {rank}")
        spelled.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(spelled)
        out = ell + "".join(sorted(c for c in set(letters) if c.isalpha() and
                                   letters.count(c) == 1))
    return spelled, out


def _einsum_infer(ctx):
    check_same_dtype(ctx)
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs))]
    try:
        terms, out = parse_einsum(ctx.attrs["equation"], [len(s) for s in shapes])
    except ValueError as exc:
        raise ctx.fail(str(exc))
    sizes: dict[str, object] = {}
    for term, shape in zip(terms, shapes):
        for letter, dim in zip(term, shape):
            known = sizes.get(letter)
            if known is None or known == 1 and letter.isdigit():
                sizes[letter] = dim
            elif dim != known and not (letter.isdigit() and dim == 1):
                if isinstance(dim, int) and isinstance(known, int):
                    raise ctx.fail(f"index {letter!r} has sizes {known} and {dim}")
    try:
        shape = tuple(sizes[c] for c in out)
    except KeyError as exc:
        raise ctx.fail(f"output index {exc} appears in no input")
    return [T.TensorType(ctx.dtype(0), shape)]


def einsum(*xs, equation):
    return np.einsum(equation, *(_widened(x) for x in xs)).astype(xs[0].dtype)


register_op("Einsum", pattern=Pattern.OUT_FUSABLE, infer=_einsum_infer, evaluate=einsum,
            attrs={"equation": ""}, inputs=(1, None))


# -- Det ----------------------------------------------------------------------------------------


def _det_infer(ctx):
    check_dtype(ctx, 0, T.FLOAT_DTYPES)
    shape = ctx.shape(0)
    if len(shape) < 2:
        raise ctx.fail(f"input must have rank >= 2, given {shape}")
    return [T.TensorType(ctx.dtype(0), shape[:-2])]


def det(x):
    return np.asarray(np.linalg.det(_widened(x))).astype(x.dtype)


register_op("Det", pattern=Pattern.OPAQUE, infer=_det_infer, evaluate=det)
