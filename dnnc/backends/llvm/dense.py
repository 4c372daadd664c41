"""The dense (MatMul / Gemm) schedule template for CPUs.

A register-blocked micro-kernel in the style of BLIS/GotoBLAS: an MR x NR block of C lives in
accumulators while k runs over a KC-long slice of A's rows and B's columns; NR is two vector
registers wide, so the fully unrolled block becomes broadcast-A / vector-B fused multiply-adds
(6 x 16 on AVX2: 12 ymm accumulators + B's 2 + A's broadcast, as BLIS's Haswell sgemm;
6 x 32 on AVX-512). Rows are split into MC-row blocks that the worker pool shares; k is split
into KC-deep slices so a slice of B stays in L2. Partial sums of earlier slices are kept in
the output itself; the epilogue (Gemm's alpha, beta*C) applies after the last slice.

Knobs (`DenseConfig`): mr, nr (in vectors), kc, mc. Applies to float32 2-D products (batch
dims of A folded into rows) and to batched products with equal batch dims.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import loop as L
from ...ir import types as T
from ..lower import STORE_REMAPS, Kernel, epilogue, layout_tail, store_index


LAYOUT_TAILS = {op: frozenset(STORE_REMAPS) for op in ("MatMul", "Gemm", "MatMulPacked")}
"""anchor op -> the layout ops after its epilogue this template stores through (fuse_ops'
`store_remaps`): the QKV projections write heads-first straight from the accumulators."""


@dataclass(frozen=True)
class DenseConfig:
    mr: int = 6
    nr_vectors: int = 2
    kc: int = 256
    mc: int = 72


def dense_schedule(kernel: Kernel, vector_bits: int, threads: int,
                   config: DenseConfig | None = None) -> L.PrimFunc | None:
    """The tiled PrimFunc for a MatMul/Gemm kernel, or None when the template does not apply
    (the default schedule is used then)."""
    config = config or DenseConfig()
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op not in ("MatMul", "Gemm", "MatMulPacked"):
        return None
    then = epilogue(kernel)
    where = store_index(kernel)
    if where is None:
        return None
    params = kernel.func.params
    y = params[-1]
    if node.outputs[0].type.dtype is not T.float32:   # the anchor's own type, not the group's
        return None
    index = {id(v): k for k, v in enumerate(kernel.inputs)}
    a = params[index[id(node.inputs[0])]]
    b = params[index[id(node.inputs[1])]]
    c = params[index[id(node.inputs[2])]] if len(node.inputs) > 2 and \
        node.inputs[2] is not None else None
    if a.dtype is not T.float32 or b.dtype is not T.float32:
        return None
    a_dims, b_dims, y_dims = (L.static_shape(t.shape) for t in (a, b, y))
    # the anchor's own output: the group's output differs by a layout tail (`store_index`)
    anchor_dims = list(node.outputs[0].type.shape)
    remapped = bool(layout_tail(kernel))
    if a_dims is None or b_dims is None or y_dims is None or len(a_dims) < 2 or \
            len(b_dims) < 2 or L.static_shape(anchor_dims) is None:
        return None
    attrs = node.attrs if node.op != "MatMul" else {}
    trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    packed = node.op == "MatMulPacked"
    if packed:
        # B arrives as [panels, K, NR] (convert_layout packed it at compile time)
        batch, n, k = 1, attrs["n"], a_dims[-1]
        m = _prod(a_dims[:-1])
    elif len(b_dims) == 2:
        batch = 1
        m = anchor_dims[-2] * _prod(anchor_dims[:-2]) if len(anchor_dims) >= 2 else 1
        k = a_dims[0] if trans_a else a_dims[-1]
        n = anchor_dims[-1]
        if len(a_dims) > 2 and trans_a:
            return None
    else:
        if len(a_dims) != len(b_dims) or a_dims[:-2] != b_dims[:-2]:
            return None
        batch = _prod(a_dims[:-2])
        m, k, n = a_dims[-2], a_dims[-1], b_dims[-1]
    if min(m, n, k) == 0:
        return None
    vec = vector_bits // 32
    nr = b_dims[2] if packed else config.nr_vectors * vec
    mr = config.mr
    # partial sums of earlier k-slices wait in the output, so an output of another type (a
    # fused Cast) takes the whole reduction in one slice
    kc = min(config.kc, k) if y.dtype is T.float32 else k
    mc = max(mr, min(config.mc, -(-m // mr) * mr))
    if threads > 1 and batch == 1:
        # row blocks in a multiple of the threads, as even as MR allows: 128 rows on 2
        # threads as 66 + 62 rather than 72 + 56 (the slower thread sets the time)
        blocks = -(-(-(-m // mc)) // threads) * threads
        mc = max(mr, -(-(-(-m // blocks)) // mr) * mr)
    # buffers viewed as 3-D [batch, rows, cols] (the pointers are the params')
    a3 = L.Buffer(a.name, T.float32, (batch, k, m) if trans_a else (batch, m, k))
    if packed:
        b3 = L.Buffer(b.name, T.float32, tuple(b_dims))
    else:
        b3 = L.Buffer(b.name, T.float32, (1 if len(b_dims) == 2 else batch,) +
                      ((n, k) if trans_b else (k, n)))
    y3 = L.Buffer(y.name, y.dtype, (batch, m, n))
    y_full = L.Buffer(y.name, y.dtype, tuple(y_dims))

    def y_at(bi, i, j0, jj):
        """The output element the anchor's element (bi, i, j0 + jj) is stored at (j0: the
        panel's first column)."""
        if not remapped:
            return y3[bi, i, j0 + jj]
        if panels_contiguous:
            base = where(anchor_index(bi, i, j0))
            return y_full[base[:-1] + (base[-1] + jj,)]
        return y_full[where(anchor_index(bi, i, j0 + jj))]

    def anchor_index(bi, i, j) -> tuple:
        """Rows i of batch bi (batch dims folded into rows) as the anchor's own index."""
        if len(anchor_dims) < 2:
            return (j,)
        if batch > 1:
            i = bi * m + i
        index = []
        for d in reversed(anchor_dims[1:-1]):
            index.append(i % d)
            i = i // d
        index.append(i)
        return tuple(reversed(index)) + (j,)
    bias = None
    if c is not None:
        c_dims = L.static_shape(c.shape)
        bias = L.Buffer(c.name, c.dtype, tuple(c_dims))

    def a_at(bi, i, kk):
        return a3[bi, kk, i] if trans_a else a3[bi, i, kk]

    def b_at(bi, kk, j):
        if packed:
            return b3[j // nr, kk, j % nr]
        bb = 0 if len(b_dims) == 2 else bi
        return b3[bb, j, kk] if trans_b else b3[bb, kk, j]

    def finish(value, i, j):
        """Gemm's alpha and beta * C, then the fused consumers at the output's own index."""
        return then(_gemm_epilogue(value, i, j), anchor_index(bi, i, j))

    def _gemm_epilogue(value, i, j):
        if alpha != 1.0:
            value = value * alpha
        if bias is not None:
            idx = []
            rank = len(bias.shape)
            full = [i, j][2 - rank:] if rank else []
            for d, e in zip(bias.shape, full):
                idx.append(L.const(0) if d == L.const(1) else e)
            term = bias[tuple(idx)] if idx else bias[()]
            value = value + (term * beta if beta != 1.0 else term)
        return value

    n_main = (n // nr) * nr
    n_kb = -(-k // kc)
    panels_contiguous = remapped and _panels_contiguous(where, anchor_index, batch * m, n,
                                                        nr, n_main)
    bi, kb, mb, jp, ib = (L.Var(x) for x in ("b", "kb", "mb", "jp", "ib"))

    def tile(width: int, j0: L.Expr) -> L.Stmt:
        """One MR x width block of C at rows i0.., columns j0..: init, k loop, store."""
        i0 = L.Var("i0")
        kk = L.Var("k")
        acc = L.Buffer("acc", T.float32, (mr * width,), L.Scope.LOCAL)
        ii, jj = L.Var("ii"), L.Var("jj")
        row = L.minimum(i0 + ii, m - 1)   # rows past M repeat the last row; never stored
        vec = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        start = L.const(0.0) if n_kb == 1 else L.Select(L.eq(kb, 0), L.const(0.0),
                                                          y_at(bi, row, j0, jj))
        init = L.For(ii, mr, L.For(jj, width, L.Store(acc, (ii * width + jj,), start), vec),
                     L.ForKind.UNROLLED)
        kglob = kb * kc + kk
        update = L.For(ii, mr, L.Let(L.Var("a", T.float32), a_at(bi, row, kglob), L.For(
            jj, width, L.Store(acc, (ii * width + jj,), L.call(
                "fma", L.Var("a", T.float32), b_at(bi, kglob, j0 + jj), acc[ii * width + jj])),
            vec)), L.ForKind.UNROLLED)
        kloop = L.For(kk, L.minimum(L.const(kc), k - kb * kc), update)
        value = acc[ii * width + jj]
        done = finish(value, i0 + ii, j0 + jj)
        if n_kb > 1:
            done = L.Select(L.eq(kb, n_kb - 1), done, value)
        target = y_at(bi, i0 + ii, j0, jj)
        store = L.For(ii, mr, L.If(i0 + ii < m, L.For(jj, width, L.Store(
            target.buffer, target.indices, done), vec)), L.ForKind.UNROLLED)
        body = L.Allocate(acc, L.seq(init, kloop, store))
        return L.Let(i0, mb * mc + ib * mr, L.If(i0 < m, body))

    panels = []
    if n_main:
        panels.append(L.For(jp, n_main // nr, tile(nr, jp * nr)))
    if n > n_main:
        panels.append(tile(n - n_main, L.const(n_main)))
    row_blocks = L.For(ib, mc // mr, L.seq(*panels))
    n_mb = -(-m // mc)
    kind = L.ForKind.PARALLEL if threads > 1 and n_mb * batch > 1 else L.ForKind.SERIAL
    if batch > 1:
        bm = L.Var("bm")
        inner = L.substitute(row_blocks, {bi: bm // n_mb, mb: bm % n_mb})
        outer = L.For(bm, batch * n_mb, inner, kind)
    else:
        outer = L.For(mb, n_mb, L.substitute(row_blocks, {bi: L.const(0)}), kind)
    body = L.For(kb, n_kb, outer)
    new_params = []
    for p in params:
        if p.name == a.name:
            new_params.append(a3)
        elif p.name == b.name:
            new_params.append(b3)
        elif p.name == y.name:
            new_params.append(y_full if remapped else y3)
        elif bias is not None and p.name == bias.name:
            new_params.append(bias)
        else:
            new_params.append(p)
    return L.simplify(L.PrimFunc(kernel.func.name, tuple(new_params), body))


def _panels_contiguous(where, anchor_index, rows: int, n: int, nr: int, n_main: int) -> bool:
    """Whether a layout tail keeps each panel's columns consecutive in the output (heads of
    64 columns hold whole 32-column panels): then a panel row is stored as one vector at its
    first column's place. Checked on every element (skipped, as False, past 4M)."""
    from ...ir.compute import ComputeEvalError, _Evaluator

    if rows * n > 1 << 22:
        return False
    i, j = L.Var("i"), L.Var("j")
    grid = {i: np.arange(rows).reshape(-1, 1), j: np.arange(n).reshape(1, -1)}
    try:
        comps = [np.broadcast_to(_Evaluator({}, {}).eval(e, grid), (rows, n))
                 for e in where(anchor_index(L.const(0), i, j))]
    except ComputeEvalError:
        return False
    cols = np.arange(n)
    first = np.where(cols < n_main, cols // nr * nr, n_main)
    for c in comps[:-1]:
        if not np.array_equal(c, c[:, first]):
            return False
    return bool(np.array_equal(comps[-1], comps[-1][:, first] + (cols - first)))


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
