"""The problem descriptor of SparseDense and SparseConv kernels (`ir/ops/sparse.py`), as the
sparse templates read them: the CSR buffers, the sizes, the bias and the group's fused
elementwise consumers; and of Sparse24Dense / Sparse24ConvNHWC (2:4 weights) as a
`problems.Dense` / `problems.Conv2dNHWC` whose weights are the kept values, with their
metadata. Target-neutral, like `problems.py`; it must never
import a backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import loop as L
from ..ir.ops.sparse import covering_rows
from .lower import Kernel, epilogue, layout_tail, store_index
from .problems import (STORAGE, Conv2dNHWC, Dense, Epilogue, _flat_epilogue_reads, _operands,
                       plane_geometry, rounded)


@dataclass(frozen=True)
class SparseProblem:
    """Y[b, j, p] = epilogue(sum over the entries e of CSR row j of values[e] X[b, columns[e],
    p] + bias[j]) for b < batch, j < rows, p < places: a 1x1 SparseConv's images (X [N, C, H *
    W], the pixels the places, stored along them), or a SparseDense's one batch of rows (A [m,
    K] stored along K, the places its m rows; Y [m, n]: `transposed`). A `windowed`
    SparseConv (kh x kw, padded, strided) reads X [N, C, H, W] through its padded plane [hp,
    wp] split in sh x sw phases (phase (py, px) holds the padded pixels (i sh + py, j sw +
    px)), each [.., wq] flattened: place q = oy * wq + ox (ox < wq; the columns from ow on
    are computed and dropped), column (c, ky, kx) at phase (ky % sh, kx % sw)'s q + (ky //
    sh) * wq + kx // sw; Y is [N, M, OH, OW]."""

    name: str
    params: tuple
    x: L.Buffer            # as the template indexes it: [batch, depth, places] / [places, depth]
    values: L.Buffer
    columns: L.Buffer
    starts: L.Buffer
    bias: L.Buffer | None
    y: L.Buffer            # [batch, rows, places] / [places, rows]
    batch: int
    rows: int
    depth: int
    places: int
    transposed: bool       # SparseDense: X and Y hold a place's values together
    epilogue: Epilogue
    anchor_dims: tuple     # the anchor's output shape (the epilogue's index space)
    flat_reads: bool       # SparseConv: the epilogue reads (n, c, 0, p) as (n, c, h, w)
    slice_depth: int       # columns a slice of the rows spans (starts [rows, slices + 1])
    nnz: int               # the nonzeros (known at compile time: defaults read it)
    kernel: tuple = (1, 1)          # a SparseConv's (kh, kw)
    begins: tuple = (0, 0)          # its (top, left) pads
    padded_hw: tuple = ()           # its padded plane (hp, wp), where `windowed`
    image_hw: tuple = ()            # its input's (H, W)
    strides: tuple = (1, 1)         # its (sh, sw)
    order: L.Buffer | None = None   # the rows by nonzero count, most first (a GPU's swizzle)

    @property
    def windowed(self) -> bool:
        """A SparseConv of a window bigger than 1x1 or with padding."""
        return tuple(self.kernel) != (1, 1) or tuple(self.begins) != (0, 0) or \
            tuple(self.strides) != (1, 1) or \
            (bool(self.padded_hw) and tuple(self.padded_hw) != tuple(self.image_hw))

    @property
    def phase_width(self) -> int:
        """wq: a phase's columns (the padded width over the column stride, rounded up)."""
        return -(-self.padded_hw[1] // self.strides[1])

    @property
    def slices(self) -> int:
        return -(-self.depth // self.slice_depth)

    def x_at(self, b, k, p) -> L.Expr:
        return self.x[p, k] if self.transposed else self.x[b, k, p]

    def y_at(self, b, j, p) -> tuple:
        return (p, j) if self.transposed else (b, j, p)

    def finish(self, value: L.Expr, b, j, p) -> L.Expr:
        """The stored value of output (b, j, p) from its sum `value`."""
        return self.finish_at(value, j, self.anchor_index(b, j, p))

    def finish_at(self, value: L.Expr, j, index: tuple) -> L.Expr:
        """The stored value of row j's output at the anchor's `index` from its sum."""
        if self.bias is not None:
            value = value + self.bias[j]
        return rounded(self.epilogue(value, index), self.y.dtype)

    def anchor_index(self, b, j, p) -> tuple:
        if self.transposed:
            index = []
            for d in reversed(self.anchor_dims[:-1]):
                index.append(p % d)
                p = p // d
            return tuple(reversed(index)) + (j,)
        wid = self.anchor_dims[3]
        if self.flat_reads:
            return (b, j, L.const(0), p)
        return (b, j, p // wid, p % wid)


def sparse_product(kernel: Kernel) -> SparseProblem | None:
    """The kernel's SparseDense / SparseConv anchor (first in its group, static shapes, no
    layout tail, its CSR starts a constant) as a problem; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op not in ("SparseDense", "SparseConv") or \
            layout_tail(kernel) or node.inputs[3].const is None:
        return None
    x, values, columns, starts, bias, order = _operands(kernel, node, 6)
    y = kernel.func.params[-1]
    x_dims, anchor_dims = L.static_shape(x.shape), L.static_shape(node.outputs[0].type.shape)
    if x_dims is None or anchor_dims is None or 0 in anchor_dims:
        return None
    conv = node.op == "SparseConv"
    rows = node.attrs["oc"] if conv else node.attrs["n"]
    window = {}
    if conv:
        (kh, kw), (top, left, bottom, right) = node.attrs["kernel_shape"], node.attrs["pads"]
        batch, depth, places = x_dims[0], x_dims[1] * kh * kw, x_dims[2] * x_dims[3]
        xv = L.Buffer(x.name, x.dtype, (batch, x_dims[1], places))
        yv = L.Buffer(y.name, y.dtype, (batch, rows, places))
        flat = _flat_epilogue_reads(kernel, anchor_dims)
        padded = (x_dims[2] + top + bottom, x_dims[3] + left + right)
        sh, sw = node.attrs["strides"]
        window = {"kernel": (kh, kw), "begins": (top, left), "padded_hw": padded,
                  "image_hw": tuple(x_dims[2:]), "strides": (sh, sw)}
        if (kh, kw, top, left, bottom, right, sh, sw) != (1, 1, 0, 0, 0, 0, 1, 1):
            xv, yv, places = x, y, anchor_dims[2] * -(-padded[1] // sw)
    else:
        batch, depth, places = 1, x_dims[-1], math.prod(x_dims[:-1])
        xv = L.Buffer(x.name, x.dtype, (places, depth))
        yv = L.Buffer(y.name, y.dtype, (places, rows))
        flat = False
    known = np.asarray(node.inputs[3].const)
    if known.shape[1] - 1 != -(-depth // node.attrs["slice_depth"]):
        return None
    return SparseProblem(
        name=kernel.func.name, params=kernel.func.params, x=xv, values=values,
        columns=columns, starts=starts, bias=bias, y=yv, batch=batch, rows=rows, depth=depth,
        places=places, transposed=not conv, epilogue=epilogue(kernel),
        anchor_dims=tuple(anchor_dims), flat_reads=flat,
        slice_depth=node.attrs["slice_depth"], nnz=int(known[-1, -1]), order=order, **window)


@dataclass(frozen=True)
class Sparse24Problem(Dense):
    """Y[i, j] = epilogue(sum_k A[i, k] W[j, k] + bias[j]) (A's batch dims folded into its m
    rows) with W 2:4 sparse [n, k]: B is its kept values [n, k / 2] (`ir/ops/sparse.py`'s
    `encode_2of4`), `meta` their metadata [n / 16, k / 32, 8, 2], `cover` `covering_rows`
    of the weights; the rest as `Dense`'s (C the bias, the store through a layout tail)."""

    meta: L.Buffer | None = None
    cover: int = 0


def _cover(node, rows: int, k: int) -> int:
    """`covering_rows` of a 2:4 node's constant metadata (0 where it is not a constant)."""
    meta = node.inputs[2].const
    return 0 if meta is None else covering_rows(np.asarray(meta), rows, k)


def sparse24_product(kernel: Kernel) -> Sparse24Problem | None:
    """The kernel's Sparse24Dense anchor (first in its group, static shapes) as a problem;
    None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != "Sparse24Dense":
        return None
    where = store_index(kernel)
    anchor_dtype = node.outputs[0].type.dtype
    a, values, meta, bias = _operands(kernel, node, 4)
    a_dims, anchor_dims = L.static_shape(a.shape), L.static_shape(node.outputs[0].type.shape)
    if where is None or anchor_dtype not in STORAGE or a_dims is None or \
            anchor_dims is None or 0 in anchor_dims:
        return None
    n, k = node.attrs["n"], node.attrs["k"]
    m = math.prod(a_dims[:-1])
    return Sparse24Problem(
        name=kernel.func.name, params=kernel.func.params, a=a, b=values,
        c=L.Buffer(bias.name, bias.dtype, (n,)) if bias is not None else None,
        y=kernel.func.params[-1], b_dims=(n, k // 2),
        y_dims=tuple(L.static_shape(kernel.func.params[-1].shape)),
        anchor_dims=tuple(anchor_dims), batch=1, m=m, n=n, k=k, trans_a=False, trans_b=True,
        alpha=1.0, beta=1.0, b_batched=False, packed_panel=0, epilogue=epilogue(kernel),
        store_index=where if layout_tail(kernel) else None, anchor_dtype=anchor_dtype,
        meta=meta, cover=_cover(node, n, k))


@dataclass(frozen=True)
class Sparse24ConvProblem(Conv2dNHWC):
    """A channels-last conv of one group (`Conv2dNHWC`: `w_dims` the logical [M, kh, kw, C])
    whose weights are 2:4 along k = (ky, kx, c): `w` the kept values [M, K / 2], `meta` their
    metadata [M / 16, K / 32, 8, 2], `cover` `covering_rows` of the weights."""

    meta: L.Buffer | None = None
    cover: int = 0


def sparse24_conv_product(kernel: Kernel) -> Sparse24ConvProblem | None:
    """The kernel's Sparse24ConvNHWC anchor (first in its group, static shapes) as a
    problem; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != "Sparse24ConvNHWC":
        return None
    x, values, meta, bias = _operands(kernel, node, 4)
    y = kernel.func.params[-1]
    xd, yd = L.static_shape(x.shape), L.static_shape(y.shape)
    if node.outputs[0].type.dtype not in STORAGE or xd is None or yd is None or \
            tuple(node.outputs[0].type.shape) != tuple(yd):
        return None
    (kh, kw), oc = node.attrs["kernel_shape"], node.attrs["oc"]
    wd = (oc, kh, kw, xd[3])
    geometry = plane_geometry(node.attrs, xd[1:3], wd[1:3], yd[1:3])
    if geometry is None:
        return None
    strides, dilations, begins, _ = geometry
    return Sparse24ConvProblem(kernel.func.name, kernel.func.params, x, values, bias, y,
                               tuple(xd), wd, tuple(yd), tuple(strides), tuple(dilations),
                               tuple(begins), epilogue(kernel), node.outputs[0].type.dtype,
                               1, meta=meta, cover=_cover(node, oc, node.attrs["k"]))
