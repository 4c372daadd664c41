"""Linear algebra ops: MatMul, Gemm, MatMulInteger, Einsum, Det.

References compute low-precision floats (float16, bfloat16) in float32 and round once at the
end, as the kernels will; integer matmuls accumulate in int32 as ONNX specifies. Compute rules
are one `reduce_sum` over the contracted axes (TE's matmul), with the same accumulation types.
"""

from __future__ import annotations

import numpy as np

from .. import batching
from .. import types as T
from ..compute import NoCompute, Tensor, broadcast_load, compute, reduce_axis, reduce_sum
from ..loop import Cast, Const, Expr, const
from ..types import broadcast_shapes
from .infer import check_dtype, check_same_dtype
from ..flops import Count, has_input, numel
from .registry import REQUIRED, Pattern, register_op

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


def acc_dtype(dtype: T.DType) -> T.DType:
    """The type a rule sums `dtype` products in: float32 for 16-bit floats, else its own."""
    return T.float32 if dtype.is_float and dtype.itemsize < 4 else dtype


def widen(dtype: T.DType, e: Expr) -> Expr:
    """`e` cast to `dtype`, or `e` itself when it has that type already."""
    return e if e.dtype is dtype else Cast(dtype, e)


def _extent(*dims: Expr) -> Expr:
    """One of several dims known to be equal, a constant one when there is one."""
    return next((d for d in dims if isinstance(d, Const)), dims[0])


def _batch_index(shape: tuple, batch: tuple) -> tuple:
    """An operand's batch axes read at the output's batch index (broadcast axes of extent 1
    read at 0)."""
    lead = len(batch) - len(shape)
    return tuple(const(0) if d == const(1) else batch[lead + q] for q, d in enumerate(shape))


def matmul_operands(a: Tensor, b: Tensor):
    """The index maps of NumPy's matmul: `(k, fn)` where k is the contraction's reduce axis
    and `fn(idx, k)` gives a's and b's indices for output index `idx` (batch axes broadcast,
    a 1-D operand promoted to a matrix and the promoted axis absent from the output)."""
    ra, rb = a.ndim, b.ndim
    k = reduce_axis(_extent(a.shape[-1], b.shape[0] if rb == 1 else b.shape[-2]), "k")

    def indices(idx, k):
        idx = tuple(idx)
        j = idx[-1] if rb >= 2 else None
        i = (idx[-2] if rb >= 2 else idx[-1]) if ra >= 2 else None
        batch = idx[:len(idx) - (ra >= 2) - (rb >= 2)]
        a_idx = _batch_index(a.shape[:-2], batch) + (i, k) if ra >= 2 else (k,)
        b_idx = _batch_index(b.shape[:-2], batch) + (k, j) if rb >= 2 else (k,)
        return a_idx, b_idx

    return k, indices


# -- MatMul -------------------------------------------------------------------------------------


def _matmul_infer(ctx):
    check_same_dtype(ctx)
    check_dtype(ctx, 0, MATMUL_DTYPES)
    return [T.TensorType(ctx.dtype(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def matmul(a, b):
    return np.matmul(_widened(a), _widened(b)).astype(a.dtype)


def _matmul_rule(inputs, outputs):
    a, b = inputs
    out = outputs[0]
    acc = acc_dtype(out.dtype)
    k, indices = matmul_operands(a, b)

    def element(*idx):
        ai, bi = indices(idx, k.var)
        return reduce_sum(widen(acc, a[ai]) * widen(acc, b[bi]), k)

    return [compute(out.shape, element, "matmul", out.dtype)]


def matmul_flops(node) -> Count:
    """2 x output elements x K (A's last dim), + one per output element for a C input."""
    a, out = node.inputs[0], node.outputs[0]
    flops = 2 * numel(out) * Count.of([a.shape[-1] if a.type.rank else 1])
    return flops + numel(out) if has_input(node, 2) else flops


register_op("MatMul", pattern=Pattern.OUT_FUSABLE, infer=_matmul_infer, evaluate=matmul,
            inputs=2, compute=_matmul_rule, flops=matmul_flops, weights=(1,),
            batched=batching.matmul)


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


def _gemm_rule(inputs, outputs, *, alpha, beta, transA, transB):
    a, b, c = (list(inputs) + [None])[:3]
    out = outputs[0]
    acc = acc_dtype(out.dtype)
    # integers scaled by a float alpha or beta go through float64, as NumPy promotes them
    scaled = alpha != 1 or (c is not None and beta != 1)
    epilogue = T.float64 if out.dtype.is_int and scaled else acc
    k = reduce_axis(_extent(a.shape[0] if transA else a.shape[1],
                            b.shape[1] if transB else b.shape[0]), "k")

    def element(i, j):
        av = a[k.var, i] if transA else a[i, k.var]
        bv = b[j, k.var] if transB else b[k.var, j]
        y = widen(epilogue, reduce_sum(widen(acc, av) * widen(acc, bv), k))
        if alpha != 1:
            y = const(alpha, epilogue) * y
        if c is not None:
            cv = widen(epilogue, c[_batch_index(c.shape, (i, j))])
            y = y + (const(beta, epilogue) * cv if beta != 1 else cv)
        return y

    return [compute(out.shape, element, "gemm", out.dtype)]


def _gemm_flops(node) -> Count:
    """2MNK, + MN with C."""
    a, out = node.inputs[0], node.outputs[0]
    k = a.shape[0] if node.attrs.get("transA") else a.shape[1]
    flops = 2 * numel(out) * Count.of([k])
    return flops + numel(out) if has_input(node, 2) else flops


register_op("Gemm", pattern=Pattern.OUT_FUSABLE, infer=_gemm_infer, evaluate=gemm,
            attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}, inputs=(2, 3),
            weights=(1, 2), compute=_gemm_rule, flops=_gemm_flops,
            batched=batching.gemm)


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


def _matmul_integer_rule(inputs, outputs):
    a, b, a_zp, b_zp = (list(inputs) + [None] * 2)[:4]
    k, indices = matmul_operands(a, b)
    # as the reference: a 1-D zero point of more than one entry is per row of a 2-D+ A
    a_per_row = a_zp is not None and a_zp.ndim == 1 and a.ndim >= 2 and a_zp.shape[0] != const(1)
    for zp, operand in ((a_zp, a), (b_zp, b)):
        if zp is not None and (zp.ndim > operand.ndim or (zp.ndim == 1 and not isinstance(
                zp.shape[0], Const))):
            raise NoCompute(f"zero point of shape {zp.shape} for an operand of rank "
                            f"{operand.ndim}")

    def element(*idx):
        ai, bi = indices(idx, k.var)
        av, bv = widen(T.int32, a[ai]), widen(T.int32, b[bi])
        if a_zp is not None:
            av = av - widen(T.int32, a_zp[(ai[-2],) if a_per_row
                                          else _batch_index(a_zp.shape, ai)])
        if b_zp is not None:
            bv = bv - widen(T.int32, b_zp[_batch_index(b_zp.shape, bi)])
        return reduce_sum(av * bv, k)

    return [compute(outputs[0].shape, element, "matmul_integer", T.int32)]


register_op("MatMulInteger", pattern=Pattern.OUT_FUSABLE, infer=_matmul_integer_infer,
            evaluate=matmul_integer, inputs=(2, 4), compute=_matmul_integer_rule,
            # inputs 2 and 3 are zero points, not a C to add
            flops=lambda node: 2 * numel(node.outputs[0]) * Count.of([node.inputs[0].shape[-1]]))


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


def _einsum_rule(inputs, outputs, *, equation):
    """Output letters index the output, every other letter is a reduce axis; a letter repeated
    in one term reads that term's diagonal (the same variable on both axes)."""
    terms, out_term = parse_einsum(equation, [t.ndim for t in inputs])
    if len(set(out_term)) != len(out_term):
        raise NoCompute(f"einsum {equation!r} repeats an output index")
    extents: dict[str, Expr] = {}
    for term, t in zip(terms, inputs):
        for letter, d in zip(term, t.shape):
            # an ellipsis axis of extent 1 broadcasts: take a wider one when there is one
            if letter not in extents or extents[letter] == const(1):
                extents[letter] = d
            elif not isinstance(extents[letter], Const) and isinstance(d, Const) \
                    and d != const(1):
                extents[letter] = d
    summed = [letter for letter in dict.fromkeys("".join(terms)) if letter not in out_term]
    axes = [reduce_axis(extents[letter], f"sum_{letter}") for letter in summed]
    out = outputs[0]
    acc = acc_dtype(out.dtype)

    def element(*idx):
        var = dict(zip(out_term, idx))
        var.update((letter, ax.var) for letter, ax in zip(summed, axes))
        product = None
        for term, t in zip(terms, inputs):
            index = tuple(const(0) if d == const(1) else var[letter]
                          for letter, d in zip(term, t.shape))
            v = widen(acc, t[index])
            product = v if product is None else product * v
        return reduce_sum(product, axes) if axes else product

    return [compute(out.shape, element, "einsum", out.dtype)]


def _einsum_flops(node) -> Count:
    """A multiply-add over the whole index space of the equation (no estimate with
    broadcast dims, `...`)."""
    lhs = node.attrs["equation"].replace(" ", "").split("->")[0]
    if "..." in lhs:
        raise ValueError("broadcast dims")
    sizes = {}
    for term, value in zip(lhs.split(","), node.inputs):
        sizes.update(zip(term, value.shape))
    return (2 if len(node.inputs) > 1 else 1) * Count.of(sizes.values())


register_op("Einsum", pattern=Pattern.OUT_FUSABLE, infer=_einsum_infer, evaluate=einsum,
            attrs={"equation": ""}, inputs=(1, None), compute=_einsum_rule, flops=_einsum_flops)


# -- Det ----------------------------------------------------------------------------------------


def _det_infer(ctx):
    check_dtype(ctx, 0, T.FLOAT_DTYPES)
    shape = ctx.shape(0)
    if len(shape) < 2:
        raise ctx.fail(f"input must have rank >= 2, given {shape}")
    return [T.TensorType(ctx.dtype(0), shape[:-2])]


def det(x):
    return np.asarray(np.linalg.det(_widened(x))).astype(x.dtype)


def _det_rule(inputs, outputs):
    raise NoCompute("Det is an LU factorisation with pivoting, not a loop nest")


register_op("Det", pattern=Pattern.OPAQUE, infer=_det_infer, evaluate=det, compute=_det_rule)


# -- MatMulPacked (a layout the CPU dense template reads contiguously) --------------------------

PACKED_PRECISIONS = ("fp32", "bf16")
"""MatMulPacked's `precision`: fp32 (B float32 in panels), or bf16 (B rounded to bfloat16 in
panels of pairs along K, `pack_pairs`, and A rounded to bfloat16 too: products of bf16
operands, accumulated in float32)."""


def pack_panels(b: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> [ceil(N/nr), K, nr]: each NR-column panel contiguous, zero-padded."""
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def pack_pairs(b: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] float32 -> [ceil(N/nr), ceil(K/2), nr, 2] bfloat16 (rounded to nearest even):
    each NR-column panel's rows in pairs, B[2t, j] and B[2t + 1, j] side by side (one 32-bit
    word, as AVX512_BF16's vdpbf16ps reads an operand), zero-padded."""
    k, n = b.shape
    rows = np.zeros((-(-k // 2) * 2, n), np.float32)
    rows[:k] = b
    panels = pack_panels(rows, nr)
    count, depth, _ = panels.shape
    pairs = panels.reshape(count, depth // 2, 2, nr).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(pairs).astype(T.bfloat16.np)


def unpack_pairs(bp: np.ndarray, k: int, n: int) -> np.ndarray:
    """`pack_pairs`'s [K, N] (as float32) back from its packing."""
    count, depth, nr, _ = bp.shape
    rows = bp.astype(np.float32).transpose(1, 3, 0, 2).reshape(depth * 2, count * nr)
    return rows[:k, :n]


def _packed_infer(ctx):
    check_dtype(ctx, 0, T.FLOAT_DTYPES)
    a, bp = ctx.shape(0), ctx.shape(1)
    n = ctx.attrs["n"]
    precision = ctx.attrs.get("precision", "fp32")   # (graphs saved before precisions)
    if precision not in PACKED_PRECISIONS:
        raise ctx.fail(f"precision must be one of {', '.join(PACKED_PRECISIONS)}, not "
                       f"{precision!r}")
    if precision == "bf16":
        check_dtype(ctx, 0, (T.float32,))
        check_dtype(ctx, 1, (T.bfloat16,), "B in bf16 pairs")
        check_same_dtype(ctx, 0, 2)
        if len(a) < 2 or len(bp) != 4 or bp[3] != 2:
            raise ctx.fail(f"expects A of rank >= 2 and B in pairs [panels, K / 2, NR, 2], "
                           f"given {a}, {bp}")
        if isinstance(a[-1], int) and isinstance(bp[1], int) and -(-a[-1] // 2) != bp[1]:
            raise ctx.fail(f"inner dimensions differ: {a} and B in pairs {bp}")
    else:
        check_same_dtype(ctx)
        if len(a) < 2 or len(bp) != 3:
            raise ctx.fail(f"expects A of rank >= 2 and packed B [panels, K, NR], given {a}, "
                           f"{bp}")
        if isinstance(a[-1], int) and isinstance(bp[1], int) and a[-1] != bp[1]:
            raise ctx.fail(f"inner dimensions differ: {a} and packed {bp}")
    out = tuple(a[:-1]) + (n,)
    if ctx.has(2):
        broadcast_shapes(out, ctx.shape(2))
    return [T.TensorType(ctx.dtype(0), out)]


def matmul_packed(a, bp, c=None, *, n, alpha, beta, precision="fp32"):
    if precision == "bf16":
        b = unpack_pairs(bp, a.shape[-1], n)
        a = a.astype(T.bfloat16.np).astype(np.float32)
    else:
        panels, k, nr = bp.shape
        b = bp.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n]
    y = np.matmul(_widened(a), _widened(b))
    if alpha != 1:
        y = alpha * y
    if c is not None:
        y = y + (beta * _widened(c) if beta != 1 else _widened(c))
    return np.asarray(y).astype(a.dtype)


def _packed_rule(inputs, outputs, n, alpha, beta, precision="fp32"):
    a, bp = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    out = outputs[0]
    acc = acc_dtype(out.dtype)
    nr = bp.shape[2]
    k = reduce_axis(a.shape[-1], "k")

    def operands(idx, j):
        x = a[tuple(idx[:-1]) + (k.var,)]
        if precision == "bf16":   # A rounded to bf16 as the kernel packs it
            return Cast(T.float32, Cast(T.bfloat16, x)), \
                widen(acc, bp[j // nr, k.var // 2, j % nr, k.var % 2])
        return widen(acc, x), widen(acc, bp[j // nr, k.var, j % nr])

    def element(*idx):
        x, w = operands(idx, idx[-1])
        value = reduce_sum(x * w, k)
        if alpha != 1:
            value = value * alpha
        if c is not None:
            term = widen(acc, broadcast_load(c, idx))
            value = value + (term * beta if beta != 1 else term)
        return value

    return [compute(out.shape, element, "matmul_packed", out.dtype)]


register_op("MatMulPacked", pattern=Pattern.OUT_FUSABLE, infer=_packed_infer,
            evaluate=matmul_packed, inputs=(2, 3), attrs={"n": REQUIRED, "alpha": 1.0,
                                                          "beta": 1.0, "precision": "fp32"},
            compute=_packed_rule, flops=matmul_flops,
            batched=batching.packed_matmul)
