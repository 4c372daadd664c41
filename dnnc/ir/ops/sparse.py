"""Products with sparse constant weights: what `passes/find_sparsity.py` makes of a MatMul,
Gemm or 1x1 Conv whose weights are mostly zeros, where running them sparse is estimated
faster. Frontends never produce these ops.

The weights are one CSR matrix W [rows, K] (`encode_csr`): `values` (float32 [nnz]), the
column of each (`columns`, int32 [nnz]) and each row's first entry (`starts`, int32
[rows + 1]); a row is an output (a dense product's column j, a conv's output channel m), a
column an element of the reduction (a dense product's k, a conv's input channel c). A row's
entries are also found per slice of `slice_depth` columns (`starts` [rows, slices + 1]), so
that a template can walk the reduction a slice at a time, its activations' slice in cache.

    SparseDense(a [..., K], values, columns, starts, bias [N]?)   y[..., j] =
        sum over the entries e of row j of values[e] * a[..., columns[e]]  (+ bias[j])
    SparseConv(x [N, C, H, W], values, columns, starts, bias [M]?)   a conv of one group,
        kernel_shape [kh, kw], `pads` [top, left, bottom, right], `strides` [sh, sw]:
        y[n, m, h, w] = sum over the entries e of row m, column (c, ky, kx) = columns[e]
        (c * kh * kw + ky * kw + kx: the weights [M, C, kh, kw] as a matrix [M, C * kh * kw]),
        of values[e] * x[n, c, h sh + ky - top, w sw + kx - left] (zero outside the image)
        (+ bias[m])

Both take an optional `order` (int32 [rows], after the bias, which may then be absent):
the rows by nonzero count, most first, built at compile time for a GPU template's row
swizzle (Sputnik's load balance); it never changes what the op computes.

Attributes: `n` (SparseDense) or `oc` (SparseConv), the rows (and a SparseConv's
`kernel_shape`, `pads` and `strides`); `slice_depth`; `row_max`, the most entries a
row holds (the compute rule's reduction reads each row to that length, masked: the one loop
any target can run; the sparse templates walk each row to its own end); and what the pass
measured of the dense weights (`density`, the fraction of nonzeros; `structure`,
`find_sparsity.measure`'s name for their pattern), which `dnnc inspect` prints.
The references rebuild the dense weights and multiply: the accuracy contract the templates
are tested against. This module must never choose whether a layer runs sparse.

2:4 structured weights (what sparse tensor cores take) have their own op, their encoding
(`encode_2of4`) the hardware's:

    Sparse24Dense(a [..., K] half or float32, values [N, K / 2] half (or float32: a
        target widening half values, llvm), meta uint32
        [N / 16, K / 32, 8, 2], bias [N]?)   y[..., j] = sum_k a[..., k] W[j, k] (+ bias[j])
        with W the [N, K] weights `decode_2of4(values, meta)` holds (at most 2 nonzeros in
        every 4 consecutive k), summed in float32, y of a's type

    Sparse24ConvNHWC(x [N, H, W, C], values [M, K / 2], meta, bias [M]?)   ConvNHWC's
        conv of one group (`kernel_shape`, `pads`, `strides`, `dilations`) with the OHWI
        weights W [M, kh kw C] (input channels fastest) 2:4 along K = kh kw C

Attributes `n` (Sparse24Dense) or `oc` (Sparse24ConvNHWC), `k` (K), and `density` /
`structure` as above. a is multiplied as its
type holds it and W as `values` holds it (float16 or bfloat16: rounded once at compile time),
the pruned positions' zeros included (a non-finite activation there makes the output NaN, as
the dense product does).
"""

from __future__ import annotations

import numpy as np

from .. import types as T
from ..compute import compute, reduce_axis, reduce_sum
from ..flops import Count, numel
from ..loop import BinOp, Cast, Select, const, eq, logical_and, maximum, minimum
from ..graph import Value
from .conv import CONV_ATTRS, conv, conv_sum
from .packed import NCHW_OF_NHWC, conv_nhwc
from .infer import check_dtype
from .registry import REQUIRED, Pattern, infer_node, register_op

SPARSE_ATTRS = {"row_max": REQUIRED, "slice_depth": REQUIRED, "density": 1.0,
                "structure": "unstructured"}


def encode_csr(w: np.ndarray, slice_depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, columns, starts) of `w` [rows, K]'s nonzeros, row by row, columns ascending;
    starts [rows, slices + 1]: starts[j, s] the first entry of row j at a column of slice s
    or later (slices of `slice_depth` columns), starts[j, slices] = starts[j + 1, 0]. A
    matrix of no nonzeros keeps one zero entry (no buffer is empty)."""
    w = np.asarray(w, np.float32)
    rows_n, depth = w.shape
    slices = max(-(-depth // slice_depth), 1)
    rows, cols = np.nonzero(w)
    # entries before each (row, slice): a row's entries of earlier rows and earlier slices
    bins = np.bincount(rows * slices + cols // slice_depth, minlength=rows_n * slices)
    before = np.concatenate([[0], np.cumsum(bins)]).astype(np.int32)
    starts = np.empty((rows_n, slices + 1), np.int32)
    starts[:, :slices] = before[:-1].reshape(rows_n, slices)
    starts[:, slices] = before[slices::slices]
    values, columns = w[rows, cols].astype(np.float32), cols.astype(np.int32)
    if not len(values):
        values, columns = np.zeros(1, np.float32), np.zeros(1, np.int32)
    return values, columns, starts


def decode_csr(values, columns, starts, k: int) -> np.ndarray:
    """The dense [rows, K] matrix `encode_csr` encoded."""
    first, end = starts[:, 0], starts[:, -1]
    w = np.zeros((len(first), k), np.float32)
    counts = end - first
    row_of = np.repeat(np.arange(len(first)), counts)
    entries = np.concatenate([np.arange(a, b) for a, b in zip(first, end)] + [[]]).astype(int)
    w[row_of, columns[entries]] = values[entries]
    return w


def row_max(starts: np.ndarray) -> int:
    """The most entries a row of the CSR matrix holds (at least 1: a reduction's extent)."""
    return max(int((starts[:, -1] - starts[:, 0]).max(initial=0)), 1)


def _check_csr(ctx, rows) -> None:
    check_dtype(ctx, 0, (T.float32,))
    check_dtype(ctx, 1, (T.float32,), "values")
    check_dtype(ctx, 2, (T.int32,), "columns")
    check_dtype(ctx, 3, (T.int32,), "starts")
    starts = ctx.type(3)
    if ctx.type(1).rank != 1 or ctx.type(2).shape != ctx.type(1).shape or \
            starts.rank != 2 or starts.shape[0] != rows or starts.shape[1] < 2:
        raise ctx.fail(f"CSR weights of {rows} rows are values [nnz], columns [nnz] and "
                       f"starts [{rows}, slices + 1], given {ctx.type(1)}, {ctx.type(2)}, "
                       f"{starts}")
    if ctx.has(4):
        check_dtype(ctx, 4, (T.float32,), "bias")
        if ctx.shape(4) != (rows,):
            raise ctx.fail(f"bias is one per output ({rows}), given {ctx.type(4)}")
    if ctx.has(5):
        check_dtype(ctx, 5, (T.int32,), "order")
        if ctx.shape(5) != (rows,):
            raise ctx.fail(f"order is one per output ({rows}), given {ctx.type(5)}")


def _row_sum(values, columns, starts, nnz, row, read, limit: int):
    """sum over the entries e of CSR row `row` of values[e] * read(columns[e]), as a
    reduction over `limit` places masked past the row's end (the index clamped to nnz - 1 so
    that a masked read stays inside the buffers)."""
    r = reduce_axis(limit, "e")
    last = starts.shape[1] - 1
    first, end = Cast(T.int64, starts[row, 0]), Cast(T.int64, starts[row, last])
    e = minimum(first + r.var, nnz - 1)
    return reduce_sum(values[e] * read(Cast(T.int64, columns[e])), r, where=first + r.var < end)


def _dense_infer(ctx):
    a = ctx.shape(0)
    n = ctx.attrs["n"]
    if len(a) < 1:
        raise ctx.fail(f"A needs rank >= 1, given {ctx.type(0)}")
    _check_csr(ctx, n)
    return [T.TensorType(T.float32, tuple(a[:-1]) + (n,))]


def sparse_dense(a, values, columns, starts, bias=None, order=None, *, n, row_max,
                 **measured):
    w = decode_csr(values, columns, starts, a.shape[-1])
    y = np.matmul(a, w.T)
    return (y if bias is None else y + bias).astype(np.float32)


def _dense_rule(inputs, outputs, *, n, row_max, **measured):
    a, values, columns, starts = inputs[:4]
    bias = inputs[4] if len(inputs) > 4 else None
    nnz = values.shape[0]

    def element(*idx):
        j = idx[-1]
        value = _row_sum(values, columns, starts, nnz, j,
                         lambda k: a[tuple(idx[:-1]) + (k,)], row_max)
        return value if bias is None else value + bias[j]

    return [compute(outputs[0].shape, element, "sparse_dense", T.float32)]


def _flops(node) -> Count:
    """2 x nonzeros x the places each row is applied at (a dense product's rows, a conv's
    images' pixels), + one per output element for a bias."""
    out = node.outputs[0]
    nnz = node.inputs[1].shape[0]
    places = out.shape[:-1] if node.op == "SparseDense" else (out.shape[0],) + out.shape[2:]
    flops = Count.of(places) * (2 * nnz)
    return flops + numel(out) if len(node.inputs) > 4 and node.inputs[4] is not None \
        else flops


register_op("SparseDense", pattern=Pattern.OUT_FUSABLE, infer=_dense_infer,
            evaluate=sparse_dense, inputs=(4, 6), compute=_dense_rule, flops=_flops,
            attrs={"n": REQUIRED, **SPARSE_ATTRS})


def _conv_infer(ctx):
    x = ctx.shape(0)
    oc = ctx.attrs["oc"]
    (kh, kw), (top, left, bottom, right) = ctx.attrs["kernel_shape"], ctx.attrs["pads"]
    sh, sw = ctx.attrs["strides"]
    if len(x) != 4 or not all(isinstance(d, int) for d in x[2:]):
        raise ctx.fail(f"x is an NCHW image of a static size, given {ctx.type(0)}")
    _check_csr(ctx, oc)
    h, w = (x[2] + top + bottom - kh) // sh + 1, (x[3] + left + right - kw) // sw + 1
    return [T.TensorType(T.float32, (x[0], oc, h, w))]


def sparse_conv(x, values, columns, starts, bias=None, order=None, *, oc, row_max,
                kernel_shape=(1, 1),
                pads=(0, 0, 0, 0), strides=(1, 1), **measured):
    w = decode_csr(values, columns, starts, x.shape[1] * kernel_shape[0] * kernel_shape[1])
    return conv(x, w.reshape((oc, x.shape[1]) + tuple(kernel_shape)), bias,
                pads=list(pads), strides=list(strides)).astype(np.float32)


def _conv_rule(inputs, outputs, *, oc, row_max, kernel_shape=(1, 1), pads=(0, 0, 0, 0),
               strides=(1, 1), **measured):
    x, values, columns, starts = inputs[:4]
    bias = inputs[4] if len(inputs) > 4 else None
    nnz = values.shape[0]
    (kh, kw), (top, left) = kernel_shape, pads[:2]
    height, width = x.shape[2], x.shape[3]

    def element(n, m, h, w):
        def read(col):
            if (kh, kw, top, left, *strides) == (1, 1, 0, 0, 1, 1):
                return x[n, col, h, w]
            iy = h * strides[0] + (col // kw) % kh - top
            ix = w * strides[1] + col % kw - left
            inside = logical_and(logical_and(iy >= 0, iy < height),
                                 logical_and(ix >= 0, ix < width))
            at = (n, col // (kh * kw), minimum(maximum(iy, 0), height - 1),
                  minimum(maximum(ix, 0), width - 1))
            return Select(inside, x[at], const(0.0))

        value = _row_sum(values, columns, starts, nnz, m, read, row_max)
        return value if bias is None else value + bias[m]

    return [compute(outputs[0].shape, element, "sparse_conv", T.float32)]


register_op("SparseConv", pattern=Pattern.OUT_FUSABLE, infer=_conv_infer,
            evaluate=sparse_conv, inputs=(4, 6), compute=_conv_rule, flops=_flops,
            attrs={"oc": REQUIRED, "kernel_shape": [1, 1], "pads": [0, 0, 0, 0],
                   "strides": [1, 1],
                   **SPARSE_ATTRS})

# -- 2:4 structured weights ----------------------------------------------------------------------

def fits_2of4(w: np.ndarray) -> bool:
    """Whether weights `w` [N, K] hold at most 2 nonzeros in every 4 consecutive k, with N a
    multiple of 16 and K of 32 (the sparse tensor cores' 16 x 32 tiles)."""
    n, k = w.shape
    if n % 16 or k % 32 or not n:
        return False
    return int((np.asarray(w).reshape(n, k // 4, 4) != 0).sum(axis=-1).max()) <= 2


def encode_2of4(w: np.ndarray, dtype: T.DType) -> tuple[np.ndarray, np.ndarray]:
    """(values [N, K / 2] in `dtype`, metadata uint32 [N / 16, K / 32, 8, 2]) of weights `w`
    [N, K] (N a multiple of 16, K of 32) holding at most 2 nonzeros in every 4 consecutive k:
    each group's two kept positions ascending (its nonzeros, then its first zeros), their
    values in order; metadata [row tile, k step, g, p] as `L.Mma`'s sparse precisions take
    it from lane 4 g + p (2 bits a kept column: row g's columns 8 p .. 8 p + 7 of the k
    step's 16 low, row g + 8's high). Built at compile time."""
    n, k = w.shape
    if n % 16 or k % 32:
        raise ValueError(f"2:4 weights are [16 n, 32 k], not {w.shape}")
    groups = np.asarray(w, np.float32).reshape(n, k // 4, 4)
    nonzero = groups != 0
    if nonzero.sum(axis=-1).max(initial=0) > 2:
        raise ValueError("the weights hold more than 2 nonzeros in a group of 4")
    key = np.where(nonzero, 0, 4) + np.arange(4)   # nonzeros first, then by position
    kept = np.sort(np.argsort(key, axis=-1, kind="stable")[..., :2], axis=-1)
    values = np.take_along_axis(groups, kept, axis=-1).reshape(n, k // 2).astype(dtype.np)
    index = kept.reshape(n // 16, 2, 8, k // 32, 2, 8).astype(np.uint32)  # [jt, half, g, ks, p, i]
    bits = (index << (2 * np.arange(8, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
    meta = bits[:, 0] | (bits[:, 1] << np.uint32(16))   # [jt, g, ks, p]
    return values, np.ascontiguousarray(meta.transpose(0, 2, 1, 3))


def kept_columns(meta: np.ndarray, n: int, k: int) -> np.ndarray:
    """The column (k) of each of `encode_2of4`'s values [n, k / 2], from its metadata."""
    c = np.arange(k // 2)
    ks, p, i = c // 16, c % 16 // 8, c % 8
    j = np.arange(n)[:, None]
    word = meta[j // 16, ks[None], j % 8, p[None]] >> (16 * (j % 16 // 8) + 2 * i[None])
    return (32 * ks + 4 * (c % 16 // 2))[None] + (word & 3).astype(np.int64)


COVER_ROWS = (16, 32, 64, 128, 256)
"""The row tiles `covering_rows` tries: the 2:4 templates' block rows (`block_m`)."""


def covering_rows(meta: np.ndarray, n: int, k: int) -> int:
    """The fewest rows R of COVER_ROWS such that every aligned run of R rows of
    `encode_2of4`'s weights (the last run the rows left) keeps each of the k columns in one
    of its rows (a kept zero counts); 0 where no R does (a column pruned in every row of a
    run: an input nothing reads). A non-finite activation times a kept value is not finite,
    so a 2:4 block whose rows are whole runs sees every place holding one in its own sums
    (the cuda templates' flags, docs/cuda_backend.md). Built at compile time."""
    kept = np.zeros((n, k), bool)
    np.put_along_axis(kept, kept_columns(meta, n, k), True, axis=1)
    for rows in COVER_ROWS:
        runs = -(-n // rows)
        padded = np.zeros((runs * rows, k), bool)
        padded[:n] = kept
        if padded.reshape(runs, rows, k).any(axis=1).all():
            return rows
    return 0


def decode_2of4(values: np.ndarray, meta: np.ndarray, k: int) -> np.ndarray:
    """The dense float32 [N, K] weights `encode_2of4` encoded."""
    n = values.shape[0]
    w = np.zeros((n, k), np.float32)
    np.add.at(w, (np.arange(n)[:, None], kept_columns(meta, n, k)),
              np.asarray(values, np.float32))
    return w


def _sparse24_infer(ctx):
    a, n, k = ctx.shape(0), ctx.attrs["n"], ctx.attrs["k"]
    half = (T.float16, T.bfloat16)
    check_dtype(ctx, 0, (T.float32,) + half)
    check_dtype(ctx, 1, (T.float32,) + half, "values")
    check_dtype(ctx, 2, (T.uint32,), "meta")
    if len(a) < 1 or a[-1] != k or n % 16 or k % 32:
        raise ctx.fail(f"A is [..., {k}] (K a multiple of 32, N = {n} of 16), given "
                       f"{ctx.type(0)}")
    if ctx.shape(1) != (n, k // 2) or ctx.shape(2) != (n // 16, k // 32, 8, 2):
        raise ctx.fail(f"2:4 weights of {n} x {k} are values [{n}, {k // 2}] and meta "
                       f"[{n // 16}, {k // 32}, 8, 2], given {ctx.type(1)}, {ctx.type(2)}")
    if ctx.has(3):
        check_dtype(ctx, 3, (T.float32,) + half, "bias")
        if ctx.shape(3) != (n,):
            raise ctx.fail(f"bias is one per output ({n}), given {ctx.type(3)}")
    return [T.TensorType(ctx.dtype(0), tuple(a[:-1]) + (n,))]


def sparse24_dense(a, values, meta, bias=None, *, n, k, **measured):
    w = decode_2of4(values, meta, k)
    y = np.matmul(np.asarray(a, np.float32), w.T)
    return (y if bias is None else y + np.asarray(bias, np.float32)).astype(a.dtype)


def _sparse24_rule(inputs, outputs, *, n, k, **measured):
    """Each output a sum over all K columns of its row, W[j, k] rebuilt from the metadata's 2
    bits of its group's two kept values (0 at a pruned k: a non-finite activation there
    makes NaN, as the dense product)."""
    a, values, meta = inputs[:3]
    bias = inputs[3] if len(inputs) > 3 else None
    r = reduce_axis(k, "k")

    def element(*idx):
        j, col = idx[-1], r.var
        weight = _decoded(values, meta, j, col)
        value = reduce_sum(weight * _wide(a[tuple(idx[:-1]) + (col,)]), r)
        return value if bias is None else value + _wide(bias[j])

    return [compute(outputs[0].shape, element, "sparse24_dense", outputs[0].dtype)]


def _wide(x):
    return x if x.dtype is T.float32 else Cast(T.float32, x)


def _sparse24_flops(node) -> Count:
    """2 x the kept values (K / 2 a row) x the places, + one per output for a bias."""
    out = node.outputs[0]
    flops = Count.of(out.shape[:-1]) * (2 * node.inputs[1].shape[0] * node.inputs[1].shape[1])
    return flops + numel(out) if len(node.inputs) > 3 and node.inputs[3] is not None \
        else flops


register_op("Sparse24Dense", pattern=Pattern.OUT_FUSABLE, infer=_sparse24_infer,
            evaluate=sparse24_dense, inputs=(3, 4), compute=_sparse24_rule,
            flops=_sparse24_flops,
            attrs={"n": REQUIRED, "k": REQUIRED, "density": 1.0, "structure": "2:4"})

def _kept(meta, j, c):
    """The position in its group of 4 of kept value c of row j (the metadata's 2 bits)."""
    word = meta[j // 16, c // 16, j % 8, c % 16 // 8]
    shift = Cast(T.uint32, (j % 16 // 8) * 16 + 2 * (c % 8))
    return Cast(T.int64, BinOp("&", BinOp(">>", word, shift), const(3, T.uint32)))


def _decoded(values, meta, j, col):
    """W[j, col] of 2:4 weights, float32 (0 at a pruned position)."""
    first, q = col // 4 * 2, col % 4
    return Select(eq(q, _kept(meta, j, first)), _wide(values[j, first]), Select(
        eq(q, _kept(meta, j, first + 1)), _wide(values[j, first + 1]), const(0.0)))


def _sparse24_conv_infer(ctx):
    x, oc, k = ctx.type(0), ctx.attrs["oc"], ctx.attrs["k"]
    kh, kw = ctx.attrs["kernel_shape"]
    half = (T.float16, T.bfloat16)
    check_dtype(ctx, 0, (T.float32,) + half)
    check_dtype(ctx, 1, (T.float32,) + half, "values")
    check_dtype(ctx, 2, (T.uint32,), "meta")
    if x.rank != 4 or not isinstance(x.shape[3], int) or kh * kw * x.shape[3] != k or \
            oc % 16 or k % 32:
        raise ctx.fail(f"x is NHWC of {k} / {kh * kw} channels (kh kw C = K a multiple of 32, "
                       f"{oc} outputs of 16), given {x}")
    if ctx.shape(1) != (oc, k // 2) or ctx.shape(2) != (oc // 16, k // 32, 8, 2):
        raise ctx.fail(f"2:4 weights of {oc} x {k} are values [{oc}, {k // 2}] and meta "
                       f"[{oc // 16}, {k // 32}, 8, 2], given {ctx.type(1)}, {ctx.type(2)}")
    w = Value("w.ohwi", T.TensorType(x.dtype, (oc, kh, kw, x.shape[3])))
    inputs = [ctx.values[0], w] + ([ctx.values[3]] if ctx.has(3) else [])
    (out,), _, _ = infer_node("ConvNHWC", inputs, {a: ctx.attrs[a] for a in CONV_ATTRS}, 1,
                              ctx.node_name)
    return [out]


def sparse24_conv_nhwc(x, values, meta, bias=None, *, oc, k, **attrs):
    (kh, kw), c = attrs["kernel_shape"], x.shape[3]
    w = decode_2of4(values, meta, k).reshape(oc, kh, kw, c)
    y = conv_nhwc(np.asarray(x, np.float32), w, None if bias is None else
                  np.asarray(bias, np.float32), **{a: attrs[a] for a in CONV_ATTRS})
    return y.astype(x.dtype)


def _sparse24_conv_rule(inputs, outputs, *, oc, k, **attrs):
    """ConvNHWC's rule (a conv sum over channels-first views) with the weights' view
    rebuilt from the metadata, element by element (zeros included)."""
    x, values, meta = inputs[:3]
    b = inputs[3] if len(inputs) > 3 else None
    (kh, kw), c = attrs["kernel_shape"], x.shape[3]
    xv = compute(tuple(x.shape[i] for i in NCHW_OF_NHWC), lambda n, ch, h, wid: x[n, h, wid, ch],
                 "x_nchw", x.dtype)
    wv = compute((oc, c, kh, kw), lambda m, ch, ky, kx: _decoded(
        values, meta, m, (ky * kw + kx) * c + ch), "w_oihw", T.float32)
    (out,) = outputs
    nchw = tuple(out.shape[i] for i in NCHW_OF_NHWC)
    total = conv_sum(xv, wv, nchw, {**CONV_ATTRS, **{a: attrs[a] for a in CONV_ATTRS}},
                     lambda xe, we, m: _wide(xe) * we)

    def element(n, oy, ox, m):
        y = total(n, m, oy, ox)
        return y if b is None else y + _wide(b[m])

    return [compute(out.shape, element, "sparse24_conv_nhwc", out.dtype)]


def _sparse24_conv_flops(node) -> Count:
    """2 x the kept values a row x the outputs, + one per output for a bias."""
    out = node.outputs[0]
    flops = numel(out) * node.inputs[1].shape[1] * 2
    return flops + numel(out) if len(node.inputs) > 3 and node.inputs[3] is not None \
        else flops


register_op("Sparse24ConvNHWC", pattern=Pattern.OUT_FUSABLE, infer=_sparse24_conv_infer,
            evaluate=sparse24_conv_nhwc, inputs=(3, 4), compute=_sparse24_conv_rule,
            flops=_sparse24_conv_flops,
            attrs={**CONV_ATTRS, "kernel_shape": REQUIRED, "oc": REQUIRED, "k": REQUIRED,
                   "density": 1.0, "structure": "2:4"})

SPARSE_PRODUCTS = ("SparseDense", "SparseConv", "Sparse24Dense", "Sparse24ConvNHWC")
"""The ops of this module (`dnnc inspect` counts them)."""
