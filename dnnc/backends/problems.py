"""Problem descriptors: what a lowered kernel computes, in the terms schedule templates read.

Each descriptor is built once from a `Kernel` (`lower.py`) and holds plain data: the kernel's
buffers, its sizes, the op's parameters (transposes, scaling, bias, strides, pads, packed
layouts) and the fused epilogue as a function of the anchor's value and index. Templates read
only the problem, never graph nodes, so a target's templates and the autotuner see the same
description. A builder returns None when the kernel is not of its kind (another op, another
dtype, symbolic shapes): the next template in the table is tried then.

Descriptors are target-neutral: nothing here chooses tiles, vector widths or threads. This
module must never import a backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from ..ir import loop as L
from ..ir import types as T
from ..ir.ops.packed import holds_tf32
from ..ir.ops.registry import Pattern, get_op
from .lower import Kernel, epilogue, layout_tail, store_index

Epilogue = Callable[[L.Expr, tuple], L.Expr]
"""fn(value, index): the value stored for the anchor's output element `value` at the anchor's
`index` (the group's fused elementwise consumers)."""

STORAGE = (T.float32, T.float16, T.bfloat16)
"""The types a product's operands, bias and output may be stored in."""


def widened(value: L.Expr) -> L.Expr:
    """`value` (a float32, float16 or bfloat16 element) as float32, exactly."""
    return value if value.dtype is T.float32 else L.Cast(T.float32, value)


def rounded(value: L.Expr, dtype: T.DType) -> L.Expr:
    """`value` as `dtype` (one rounding where they differ)."""
    return value if value.dtype is dtype else L.Cast(dtype, value)


def all_float32(*buffers: L.Buffer | None) -> bool:
    """Whether every buffer given (None: absent) holds float32."""
    return all(b is None or b.dtype is T.float32 for b in buffers)


# -- dense ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dense:
    """Batched matrix product: for bi < batch, i < m, j < n,
    Y[bi, i, j] = epilogue(alpha * sum_k A[bi, i, k] B[bi, k, j] + beta * C[i, j]), with A
    stored [k, m] when `trans_a`, B [n, k] when `trans_b`, B shared by every batch when not
    `b_batched`, and B packed [n / panel, k, panel] when `packed_panel` (MatMulPacked).
    Batch dims of an A multiplied by a 2-D B are folded into m. The output is stored through
    `store_index` (a layout tail) when there is one."""

    name: str                    # the kernel's PrimFunc name
    params: tuple                # its buffer parameters, in order
    a: L.Buffer
    b: L.Buffer
    c: L.Buffer | None           # Gemm's C / MatMulPacked's bias (static shape), if any
    y: L.Buffer
    b_dims: tuple
    y_dims: tuple
    anchor_dims: tuple           # the anchor's own output shape (the epilogue's index space)
    batch: int
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    alpha: float
    beta: float
    b_batched: bool
    packed_panel: int            # columns per panel of a packed B; 0 when B is plain
    epilogue: Epilogue
    store_index: Callable | None   # anchor index -> output index; None without a layout tail
    anchor_dtype: T.DType = T.float32   # the anchor's own output type (the value's rounding)
    # B packed in bf16 pairs along K, [n / panel, ceil(k / 2), panel, 2] (MatMulPacked at
    # precision bf16): products of A and B rounded to bf16, accumulated in float32
    pairs: bool = False
    # A, B hold tf32 values only (`packed.holds_tf32`: passes/store_tf32.py rounded them)
    a_tf32: bool = False
    b_tf32: bool = False

    @property
    def float32(self) -> bool:
        """Whether the operands (but B in bf16 pairs), the bias and the anchor's own output
        are float32 (Y holds whatever the epilogue makes)."""
        return all_float32(self.a, None if self.pairs else self.b, self.c) and \
            self.anchor_dtype is T.float32

    def anchor_index(self, bi, i, j) -> tuple:
        """Row i of batch bi and column j (batch dims folded into rows) as the anchor's own
        output index."""
        if len(self.anchor_dims) < 2:
            return (j,)
        if self.batch > 1:
            i = bi * self.m + i
        index = []
        for d in reversed(self.anchor_dims[1:-1]):
            index.append(i % d)
            i = i // d
        index.append(i)
        return tuple(reversed(index)) + (j,)

    def store_grid(self, rows: int) -> list[np.ndarray] | None:
        """The output index (in `y_dims`, one [rows, n] int64 array a component) that the
        layout tail gives each of rows [0, rows) (past m: the next batches') and every
        column; None without a tail, past 4M elements, or where the tail's index is not
        computable here."""
        from .loop_analysis import evaluated

        if self.store_index is None or rows * self.n > 1 << 22:
            return None
        i, j = L.Var("i"), L.Var("j")
        grid = {i: np.arange(rows).reshape(-1, 1), j: np.arange(self.n).reshape(1, -1)}
        return evaluated(self.store_index(self.anchor_index(L.const(0), i, j)), grid,
                         (rows, self.n))

    @cached_property
    def rows_contiguous(self) -> bool:
        """Whether the layout tail stores row i + 1 of every column right after row i (NCHW
        pixels of a 1x1 conv, a product stored through a Transpose to channels first), batch
        0's rows checked (each batch is the same tail); False past 4M elements. Computed
        once a problem: the default schedule and the template both ask."""
        comps = self.store_grid(self.m) if self.m >= 2 else None
        if comps is None or len(comps) != len(self.y_dims):
            return False
        flat = np.zeros((self.m, self.n), np.int64)
        for c, d in zip(comps, self.y_dims):
            flat = flat * int(d) + c
        return bool(np.all(flat[1:] - flat[:-1] == 1))

    @property
    def a_dims(self) -> tuple:
        """A's dims as the templates view it: [batch, k, m] when `trans_a`, else [batch, m,
        k] (the same memory as the parameter)."""
        return (self.batch, self.k, self.m) if self.trans_a else (self.batch, self.m, self.k)

    def a_index(self, bi, i, kk) -> tuple:
        """A's element (row i, column kk) of batch bi, in `a_dims`."""
        return (bi, kk, i) if self.trans_a else (bi, i, kk)

    def scaled(self, value: L.Expr, i, j) -> L.Expr:
        """Gemm's alpha * value + beta * C[i, j] (C broadcast over the rows or columns it
        lacks), in float32."""
        if self.alpha != 1.0:
            value = value * self.alpha
        bias = self.c
        if bias is not None:
            idx = []
            rank = len(bias.shape)
            full = [i, j][2 - rank:] if rank else []
            for d, e in zip(bias.shape, full):
                idx.append(L.const(0) if d == L.const(1) else e)
            term = widened(bias[tuple(idx)] if idx else bias[()])
            value = value + (term * self.beta if self.beta != 1.0 else term)
        return value

    def epilogue_index(self, bi, i, j) -> tuple:
        """Where the epilogue reads its other inputs for the product's element (bi, i, j):
        the anchor's own index."""
        return self.anchor_index(bi, i, j)

    def finish(self, value: L.Expr, bi, i, j) -> L.Expr:
        """The value of the product's element (bi, i, j) (its float32 sum `value`) as stored
        in Y: scaled, rounded once to the anchor's type, through the epilogue, in Y's type."""
        value = rounded(self.scaled(value, i, j), self.anchor_dtype)
        return rounded(self.epilogue(value, self.epilogue_index(bi, i, j)), self.y.dtype)


DENSE_OPS = ("MatMul", "Gemm", "MatMulPacked")


@dataclass(frozen=True)
class PointwiseDense(Dense):
    """A 1x1 unpadded conv of one group with packed weights (`Conv2d.as_dense`) as the
    matrix product Y^T = X^T W^T, a batch per image: the output pixels are the rows, each
    reading its input pixel (every `strides` pixel) across the input channels (A, read in
    place from the NCHW image), the output channels are the columns (B: the packed weights,
    whose blocks are a packed B's panels); row i, column j of image bi is stored at the
    conv's output (bi, j, i // W, i % W), where the epilogue reads too."""

    image_dims: tuple = ()   # the input's [N, C, H, W]
    width: int = 1           # the output's W
    strides: tuple = (1, 1)
    # the conv's `flat_epilogue_reads`: the epilogue may be indexed (n, c, 0, pixel)
    flat_epilogue_reads: bool = False

    @property
    def a_dims(self) -> tuple:
        return self.image_dims

    def a_index(self, bi, i, kk) -> tuple:
        sh, sw = self.strides
        return (bi, kk, (i // self.width) * sh, (i % self.width) * sw)

    def anchor_index(self, bi, i, j) -> tuple:
        return (bi, j, i // self.width, i % self.width)

    def epilogue_index(self, bi, i, j) -> tuple:
        """(bi, j, 0, i) where the epilogue's reads allow it (`flat_epilogue_reads`): an
        output channel's consecutive pixels are then consecutive in the index's last axis,
        one vector load of a residual where the template stores them as one vector."""
        if self.flat_epilogue_reads:
            return (bi, j, L.const(0), i)
        return self.anchor_index(bi, i, j)


def dense(kernel: Kernel) -> Dense | None:
    """A MatMul / Gemm / MatMulPacked of `STORAGE` types anchoring `kernel` (first in its
    group, static shapes) as a `Dense`; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op not in DENSE_OPS:
        return None
    where = store_index(kernel)
    anchor_dtype = node.outputs[0].type.dtype
    if where is None or anchor_dtype not in STORAGE:
        return None   # the anchor's own type, not the group's (a fused Cast)
    params = kernel.func.params
    a, b, c = _operands(kernel, node, 3)
    y = params[-1]
    if any(x is not None and x.dtype not in STORAGE for x in (a, b, c)):
        return None   # (Y: whatever the epilogue makes, int8 after a fused QuantizeLinear)
    a_dims, b_dims, y_dims = (L.static_shape(t.shape) for t in (a, b, y))
    # the anchor's own output: the group's output differs by a layout tail
    anchor_dims = L.static_shape(node.outputs[0].type.shape)
    c_dims = L.static_shape(c.shape) if c is not None else ()
    if a_dims is None or b_dims is None or y_dims is None or anchor_dims is None or \
            c_dims is None or len(a_dims) < 2 or len(b_dims) < 2:
        return None
    attrs = node.attrs if node.op != "MatMul" else {}
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    packed = node.op == "MatMulPacked"
    if packed:
        # B arrives as [panels, K, NR] (convert_layout packed it at compile time)
        batch, n, k = 1, attrs["n"], a_dims[-1]
        m = math.prod(a_dims[:-1])
        if b_dims[2] == 1 and attrs.get("precision", "fp32") == "fp32":
            # panels of one column: B^T [n, k] as it is (convert_layout's "tf32_dense")
            packed, trans_b, b_dims = False, True, (n, k)
    elif len(b_dims) == 2:
        if len(a_dims) > 2 and trans_a:
            return None
        batch = 1
        m = anchor_dims[-2] * math.prod(anchor_dims[:-2]) if len(anchor_dims) >= 2 else 1
        k = a_dims[0] if trans_a else a_dims[-1]
        n = anchor_dims[-1]
    else:
        if len(a_dims) != len(b_dims) or a_dims[:-2] != b_dims[:-2]:
            return None
        batch = math.prod(a_dims[:-2])
        m, k, n = a_dims[-2], a_dims[-1], b_dims[-1]
    if min(m, n, k) == 0:
        return None
    return Dense(
        name=kernel.func.name, params=params, a=a, b=b,
        c=L.Buffer(c.name, c.dtype, tuple(c_dims)) if c is not None else None, y=y,
        b_dims=tuple(b_dims), y_dims=tuple(y_dims), anchor_dims=tuple(anchor_dims),
        batch=batch, m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b,
        alpha=attrs.get("alpha", 1.0), beta=attrs.get("beta", 1.0),
        b_batched=not packed and len(b_dims) > 2, packed_panel=b_dims[2] if packed else 0,
        epilogue=epilogue(kernel), store_index=where if layout_tail(kernel) else None,
        anchor_dtype=anchor_dtype, pairs=packed and attrs.get("precision") == "bf16",
        a_tf32=a.dtype is T.float32 and holds_tf32(node.inputs[0]),
        b_tf32=not packed and b.dtype is T.float32 and holds_tf32(node.inputs[1]))


def _operands(kernel: Kernel, node, count: int) -> list:
    """The kernel's buffer parameters of `node`'s first `count` inputs (None for an absent
    optional input)."""
    index = {id(v): k for k, v in enumerate(kernel.inputs)}
    params = kernel.func.params
    inputs = list(node.inputs[:count]) + [None] * (count - len(node.inputs))
    return [None if v is None else params[index[id(v)]] for v in inputs]


# -- attention -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    """Scaled dot-product attention (FusedAttention): for bi < batch (the batch dims folded),
    i < sq, e < dv, Y[bi, i, e] = epilogue(sum_j softmax_j(s[bi, i, j]) V[bi, j, e]) with
    s = where(drop[bi, i, j], fill, scale * Q[bi, i, :] . K[bi, j, :]) + mask[bi, i, j], K
    stored [d, sk] a batch when `k_transposed`, the mask and drop broadcast (their dims of 1
    read at 0; None without them). The output is stored through `store_index` (a layout
    tail) when there is one."""

    name: str
    params: tuple
    q: L.Buffer
    k: L.Buffer
    v: L.Buffer
    mask: L.Buffer | None        # viewed with the scores' rank (1s prepended)
    drop: L.Buffer | None        # (bool) viewed so too
    fill: float
    y: L.Buffer
    batch_dims: tuple            # the scores' leading dims
    sq: int
    sk: int
    d: int
    dv: int
    k_transposed: bool
    scale: float
    y_dims: tuple
    epilogue: Epilogue
    store_index: Callable | None
    anchor_dtype: T.DType = T.float32   # the anchor's own output type (the value's rounding)

    @property
    def float32(self) -> bool:
        """Whether Q, K, V, the mask and the anchor's own output are float32."""
        return all_float32(self.q, self.k, self.v, self.mask) and \
            self.anchor_dtype is T.float32

    @property
    def batch(self) -> int:
        return math.prod(self.batch_dims)

    def batch_index(self, bi: L.Expr) -> tuple:
        """The flat batch index `bi` over the batch dims, row-major."""
        index = []
        for d in reversed(self.batch_dims):
            index.append(bi % d)
            bi = bi // d
        return tuple(reversed(index))

    def mask_at(self, bi: L.Expr, i: L.Expr, j: L.Expr, buffer: L.Buffer | None = None
                ) -> L.Expr:
        """The mask's (or `buffer`'s: drop's) element of score (bi, i, j) (indices in
        range), broadcast."""
        buffer = self.mask if buffer is None else buffer
        full = self.batch_index(bi) + (i, j)
        return buffer[tuple(L.const(0) if d == L.const(1) else e
                            for d, e in zip(buffer.shape, full))]

    def anchor_index(self, bi: L.Expr, i: L.Expr, e: L.Expr) -> tuple:
        return self.batch_index(bi) + (i, e)

    @property
    def y_view(self) -> L.Buffer:
        """Y as `store` writes it: [batch, sq, dv], or its own shape under a layout tail."""
        dims = (self.batch, self.sq, self.dv) if self.store_index is None else self.y_dims
        return L.Buffer(self.y.name, self.y.dtype, dims)

    def store(self, bi: L.Expr, i: L.Expr, e: L.Expr, value: L.Expr) -> L.Stmt:
        """The statement storing output element (bi, i, e) (its float32 `value`): rounded
        once to the anchor's type, the epilogue, then the layout tail's index."""
        index = self.anchor_index(bi, i, e)
        value = rounded(self.epilogue(rounded(value, self.anchor_dtype), index), self.y.dtype)
        where = (bi, i, e) if self.store_index is None else tuple(self.store_index(index))
        return L.Store(self.y_view, where, value)


def attention(kernel: Kernel) -> Attention | None:
    """A FusedAttention of `STORAGE` types anchoring `kernel` (first in its group, static
    shapes) as an `Attention`; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != "FusedAttention":
        return None
    where = store_index(kernel)
    q, k, v, mask, drop = _operands(kernel, node, 5)
    y = kernel.func.params[-1]
    buffers = [b for b in (q, k, v, mask, y) if b is not None]
    dims = [L.static_shape(b.shape) for b in buffers + ([drop] if drop is not None else [])]
    if where is None or None in dims or any(b.dtype not in STORAGE for b in buffers) or \
            node.outputs[0].type.dtype not in STORAGE:
        return None
    qd, kd, vd = dims[:3]
    transposed = bool(node.attrs["k_transposed"])
    sq, d = qd[-2:]
    sk, dv = vd[-2:]
    batch_dims = tuple(qd[:-2])
    if min(sq, sk, d, dv, math.prod(batch_dims)) == 0:
        return None
    rank = len(qd)

    def view(b: L.Buffer | None) -> L.Buffer | None:
        if b is None:
            return None
        bd = L.static_shape(b.shape)
        return L.Buffer(b.name, b.dtype, (1,) * (rank - len(bd)) + tuple(bd))

    return Attention(
        name=kernel.func.name, params=kernel.func.params, q=q, k=k, v=v, mask=view(mask),
        drop=view(drop), fill=float(node.attrs["fill"]), y=y,
        batch_dims=batch_dims, sq=sq, sk=sk, d=d, dv=dv, k_transposed=transposed,
        scale=float(node.attrs["scale"]), y_dims=tuple(L.static_shape(y.shape)),
        epilogue=epilogue(kernel), store_index=where if layout_tail(kernel) else None,
        anchor_dtype=node.outputs[0].type.dtype)


# -- 2-D windows: conv and pool ----------------------------------------------------------------


def plane_geometry(attrs: dict, image_hw, kernel_hw, out_hw):
    """(strides, dilations, begin pads, padded plane (hp, wp)) of a 2-D window op's attrs,
    the plane big enough for every window the output reads; None when the output size does
    not match the attrs."""
    from ..ir.ops.window import window_attrs, window_geometry

    strides, dilations, pads = window_attrs(2, attrs.get("strides"), attrs.get("dilations"),
                                            attrs.get("pads"))
    outs, begins, _ = window_geometry(list(image_hw), list(kernel_hw), strides, dilations,
                                      pads, attrs.get("auto_pad", "NOTSET"),
                                      attrs.get("ceil_mode", 0))
    if list(outs) != list(out_hw):
        return None
    (h, wid), (kh, kw), (oh, ow) = image_hw, kernel_hw, out_hw
    (sh, sw), (dh, dw), (ph, pw) = strides, dilations, begins
    padded_hw = (max(h + ph, (oh - 1) * sh + (kh - 1) * dh + 1),
                 max(wid + pw, (ow - 1) * sw + (kw - 1) * dw + 1))
    return strides, dilations, list(begins), padded_hw


@dataclass(frozen=True)
class Conv2d:
    """An NCHW 2-D convolution of `STORAGE` types, static shapes: y = epilogue(conv(x, w) + bias), the
    weights [M, C / group, kh, kw], or packed [group * ceil(M / group / NR), C / group, kh,
    kw, NR] (ConvPacked, `packed_nr` = NR), each group's channels in blocks of their own,
    zero past the group's last."""

    name: str
    params: tuple
    x: L.Buffer
    w: L.Buffer
    bias: L.Buffer | None
    y: L.Buffer
    x_dims: tuple
    w_dims: tuple        # [M, C / group, kh, kw] (unpacked)
    y_dims: tuple
    group: int
    strides: tuple
    dilations: tuple
    begins: tuple
    padded_hw: tuple     # an input plane big enough for every window the output reads
    packed_nr: int       # NR of packed weights, 0 when the weights are a plain [M, C, kh, kw]
    epilogue: Epilogue
    # every tensor the epilogue reads is indexed the same at (n, c, 0, h * W + w) as at
    # (n, c, h, w) (see `_flat_epilogue_reads`)
    flat_epilogue_reads: bool
    anchor_dtype: T.DType = T.float32   # the anchor's own output type (the value's rounding)
    # weights packed in bf16 pairs along input channels, [ceil(M / NR), ceil(C / 2), kh, kw,
    # NR, 2] (ConvPacked at precision bf16, one group): products of the image and the
    # weights rounded to bf16, accumulated in float32
    pairs: bool = False

    @property
    def float32(self) -> bool:
        """Whether the image, the weights (but in bf16 pairs), the bias and the anchor's own
        output are float32 (Y holds whatever the epilogue makes)."""
        return all_float32(self.x, None if self.pairs else self.w, self.bias) and \
            self.anchor_dtype is T.float32

    def finish(self, value: L.Expr, index: tuple) -> L.Expr:
        """The value of output element `index` (the conv's float32 sum `value`) as stored in
        Y: plus the bias, rounded once to the anchor's type, through the epilogue, in Y's
        type."""
        if self.bias is not None:
            value = value + widened(self.bias[index[1]])
        value = rounded(value, self.anchor_dtype)
        return rounded(self.epilogue(value, index), self.y.dtype)

    @property
    def pointwise(self) -> bool:
        """A 1x1, stride-1, unpadded conv, not depthwise: a GEMM over pixels (one a group)."""
        n, c, h, wid = self.x_dims
        _, _, kh, kw = self.w_dims
        return (kh, kw) == (1, 1) and tuple(self.strides) == (1, 1) and \
            tuple(self.begins) == (0, 0) and tuple(self.y_dims[2:]) == (h, wid) and \
            (self.group == 1 or self.grouped)

    def as_dense(self) -> PointwiseDense | None:
        """This conv as a matrix product (`PointwiseDense`) when it is 1x1, unpadded (any
        strides, no dilation), of one group, with packed weights; None otherwise."""
        n, c = self.x_dims[:2]
        oc, _, kh, kw = self.w_dims
        h, wid = self.y_dims[2:]
        if (kh, kw) != (1, 1) or tuple(self.begins) != (0, 0) or self.group != 1 or \
                not self.packed_nr:
            return None
        nr = self.packed_nr
        return PointwiseDense(
            name=self.name, params=self.params, a=self.x, b=self.w,
            c=L.Buffer(self.bias.name, self.bias.dtype, (oc,)) if self.bias is not None
            else None, y=self.y, b_dims=(-(-oc // nr), -(-c // 2), nr, 2) if self.pairs
            else (-(-oc // nr), c, nr), y_dims=self.y_dims,
            anchor_dims=self.y_dims, batch=n, m=h * wid, n=oc, k=c, trans_a=True,
            trans_b=False, alpha=1.0, beta=1.0, b_batched=False, packed_panel=nr,
            epilogue=self.epilogue, store_index=lambda index: index,
            anchor_dtype=self.anchor_dtype, pairs=self.pairs, image_dims=self.x_dims,
            width=wid, strides=tuple(self.strides),
            flat_epilogue_reads=self.flat_epilogue_reads)

    @property
    def grouped(self) -> bool:
        """group > 1 and not depthwise: `group` convolutions side by side, group g reading
        input channels [g C/group, (g+1) C/group) and writing outputs [g M/group, ...)."""
        return self.group > 1 and not self.depthwise

    @property
    def depthwise(self) -> bool:
        """One filter per channel (group == channels == output channels), unpacked."""
        c, (oc, cg) = self.x_dims[1], self.w_dims[:2]
        return self.group == c and oc == c and cg == 1 and not self.packed_nr


def conv2d(kernel: Kernel, ops: tuple[str, ...] = ("Conv", "ConvPacked")) -> Conv2d | None:
    """An NCHW 2-D Conv / ConvPacked (or of `ops`) of `STORAGE` types anchoring `kernel`
    (first in its group, static shapes) as a `Conv2d`; None otherwise. A ConvWinograd's
    weights are its transformed filters [alpha^2, blocks, C, NR] (`packed_nr` NR; at bf16
    [alpha^2, blocks, ceil(C / 2), NR, 2], `pairs`)."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op not in ops:
        return None
    x, w, bias = _operands(kernel, node, 3)
    y = kernel.func.params[-1]
    xd, wd, yd = L.static_shape(x.shape), L.static_shape(w.shape), L.static_shape(y.shape)
    if node.outputs[0].type.dtype not in STORAGE or xd is None or wd is None or yd is None or \
            len(xd) != 4 or any(b is not None and b.dtype not in STORAGE for b in (x, w, bias)):
        return None
    packed_nr = 0
    pairs = node.attrs.get("precision") == "bf16"
    if pairs and node.op == "ConvWinograd":
        packed_nr = wd[-2]
        wd = (node.attrs["oc"], xd[1], 3, 3)
    elif pairs:
        if len(wd) != 6:
            return None
        packed_nr = wd[-2]
        wd = (node.attrs["oc"], xd[1] // node.attrs.get("group", 1)) + tuple(wd[2:4])
    elif node.op == "ConvPacked":
        if len(wd) != 5:
            return None
        packed_nr = wd[-1]
        wd = (node.attrs["oc"],) + tuple(wd[1:4])
    elif node.op == "ConvWinograd":
        packed_nr = wd[-1]
        wd = (node.attrs["oc"], wd[2], 3, 3)
    geometry = plane_geometry(node.attrs, xd[2:], wd[2:], yd[2:])
    if geometry is None:
        return None
    strides, dilations, begins, padded_hw = geometry
    return Conv2d(kernel.func.name, kernel.func.params, x, w, bias, y, tuple(xd), tuple(wd),
                  tuple(yd), node.attrs.get("group", 1), tuple(strides), tuple(dilations),
                  tuple(begins), tuple(padded_hw), packed_nr, epilogue(kernel),
                  _flat_epilogue_reads(kernel, yd), node.outputs[0].type.dtype, pairs)


def winograd_conv2d(kernel: Kernel) -> Conv2d | None:
    """A ConvWinograd anchoring `kernel` as a `Conv2d` (its `w` the transformed filters)."""
    return conv2d(kernel, ("ConvWinograd",))


@dataclass(frozen=True)
class Conv2dNHWC:
    """A channels-last 2-D convolution (ConvNHWC), `STORAGE` types, static shapes:
    y [N, OH, OW, M] = epilogue(conv(x [N, H, W, C], w [M, kh, kw, C / group]) + bias), the
    sum over k = (ky, kx, c) in that order (a patch's run along k is contiguous in x for each
    (ky, kx)); output channel o of group o // (M / group) reads that group's C / group input
    channels; depthwise (`group` = C = M, w [C, kh, kw, 1]): channel c's filter on channel c
    alone."""

    name: str
    params: tuple
    x: L.Buffer
    w: L.Buffer
    bias: L.Buffer | None
    y: L.Buffer
    x_dims: tuple        # [N, H, W, C]
    w_dims: tuple        # [M, kh, kw, C]
    y_dims: tuple        # [N, OH, OW, M]
    strides: tuple
    dilations: tuple
    begins: tuple
    epilogue: Epilogue
    anchor_dtype: T.DType = T.float32
    group: int = 1
    w_tf32: bool = False   # the weights are constants of tf32 values (`packed.round_tf32`)
    x_tf32: bool = False   # the image holds tf32 values only (`packed.holds_tf32`)

    @property
    def depthwise(self) -> bool:
        """One filter per channel: group == C == M, w [C, kh, kw, 1]."""
        c, (m, cg) = self.x_dims[3], (self.w_dims[0], self.w_dims[3])
        return self.group > 1 and self.group == c == m and cg == 1

    def finish(self, value: L.Expr, index: tuple) -> L.Expr:
        """Output element `index` (n, oy, ox, m) of the float32 sum `value` as stored in Y
        (as `Conv2d.finish`, the bias by the last index)."""
        if self.bias is not None:
            value = value + widened(self.bias[index[3]])
        value = rounded(value, self.anchor_dtype)
        return rounded(self.epilogue(value, index), self.y.dtype)


def conv2d_nhwc(kernel: Kernel) -> Conv2dNHWC | None:
    """A ConvNHWC of `STORAGE` types anchoring `kernel` (first in its group, static shapes)
    as a `Conv2dNHWC`; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != "ConvNHWC":
        return None
    x, w, bias = _operands(kernel, node, 3)
    y = kernel.func.params[-1]
    xd, wd, yd = L.static_shape(x.shape), L.static_shape(w.shape), L.static_shape(y.shape)
    if node.outputs[0].type.dtype not in STORAGE or xd is None or wd is None or yd is None or \
            any(b is not None and b.dtype not in STORAGE for b in (x, w, bias)):
        return None
    geometry = plane_geometry(node.attrs, xd[1:3], wd[1:3], yd[1:3])
    if geometry is None or tuple(node.outputs[0].type.shape) != tuple(yd):
        return None
    strides, dilations, begins, _ = geometry
    problem = Conv2dNHWC(kernel.func.name, kernel.func.params, x, w, bias, y, tuple(xd),
                         tuple(wd), tuple(yd), tuple(strides), tuple(dilations),
                         tuple(begins), epilogue(kernel), node.outputs[0].type.dtype,
                         node.attrs.get("group") or 1,
                         w.dtype is T.float32 and holds_tf32(node.inputs[1]),
                         x.dtype is T.float32 and holds_tf32(node.inputs[0]))
    return problem


@dataclass(frozen=True)
class PlaneMeanNHWC:
    """The mean over the plane of a channels-last image, `STORAGE` types, static shapes:
    y[n, 0, 0, c] = epilogue(mean over (h, w) of x[n, h, w, c]) (a ReduceMean over axes 1
    and 2 keeping them: `sink_transposes`' GlobalAveragePool of an NHWC image), summed in
    float32, stored through `store_index` (a layout tail: the identity without one)."""

    name: str
    params: tuple
    x: L.Buffer
    y: L.Buffer
    x_dims: tuple        # [N, H, W, C]
    epilogue: Epilogue
    store_index: Callable
    anchor_dtype: T.DType = T.float32

    def finish(self, value: L.Expr, index: tuple) -> L.Expr:
        """Output element `index` (n, 0, 0, c) of the float32 mean `value` as stored in Y."""
        value = rounded(value, self.anchor_dtype)
        return rounded(self.epilogue(value, index), self.y.dtype)


def plane_mean_nhwc(kernel: Kernel) -> PlaneMeanNHWC | None:
    """A ReduceMean over axes (1, 2) of a static 4-D `STORAGE` tensor keeping them, anchoring
    `kernel` (first in its group) as a `PlaneMeanNHWC`; None otherwise."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != "ReduceMean" or len(node.inputs) < 2 or \
            node.inputs[1] is None or node.inputs[1].const is None or \
            node.attrs.get("keepdims", 1) != 1:
        return None
    (x,) = _operands(kernel, node, 1)
    xd = L.static_shape(x.shape)
    if xd is None or len(xd) != 4 or x.dtype not in STORAGE or \
            node.outputs[0].type.dtype not in STORAGE or \
            sorted(int(a) % 4 for a in np.asarray(node.inputs[1].const).reshape(-1)) != [1, 2]:
        return None
    where = store_index(kernel)
    if where is None:
        return None
    return PlaneMeanNHWC(kernel.func.name, kernel.func.params, x, kernel.func.params[-1],
                         tuple(xd), epilogue(kernel), where, node.outputs[0].type.dtype)


def _flat_epilogue_reads(kernel: Kernel, out_shape) -> bool:
    """Whether every tensor the epilogue reads besides the anchor's value is indexed the same
    at (n, c, 0, h * W + w) as at (n, c, h, w): it has the output's image shape, or reads a
    whole image at one place (trailing dims of 1, as a bias). Never for images one pixel
    wide: the flat pixel would index a width axis of size 1, which broadcasting reads at 0."""
    if out_shape[3] == 1:
        return False
    produced = {id(v) for node in kernel.nodes for v in node.outputs}
    anchor = kernel.anchor
    for node in kernel.nodes:
        if node is anchor:
            continue
        for v in node.inputs:
            if v is None or id(v) in produced:
                continue
            shape = tuple(v.type.shape)
            image = shape[-2:] if len(shape) >= 2 else (1,) * (2 - len(shape)) + shape
            if tuple(image) not in ((1, 1), tuple(out_shape[2:])):
                return False
    return True


@dataclass(frozen=True)
class Pool2d:
    """A float32 NCHW 2-D MaxPool or AveragePool alone in its kernel, one output, static
    shapes."""

    name: str
    params: tuple
    x: L.Buffer
    y: L.Buffer
    x_dims: tuple
    y_dims: tuple
    kind: str            # "max" or "average"
    kernel_hw: tuple
    strides: tuple
    dilations: tuple
    begins: tuple
    padded_hw: tuple
    count_include_pad: bool
    ceil_mode: bool

    @property
    def padded(self) -> bool:
        """Whether some window reaches past the image."""
        return tuple(self.begins) + tuple(self.padded_hw) != (0, 0) + tuple(self.x_dims[2:])


POOLS = {"MaxPool": "max", "AveragePool": "average"}


def pool2d(kernel: Kernel) -> Pool2d | None:
    """A float32 NCHW 2-D MaxPool / AveragePool alone in `kernel` (one output, static
    shapes) as a `Pool2d`; None otherwise."""
    node = kernel.anchor
    if len(kernel.nodes) != 1 or node.op not in POOLS or len(node.outputs) != 1 or \
            len(kernel.func.params) != 2:
        return None
    x, y = kernel.func.params
    xd, yd = L.static_shape(x.shape), L.static_shape(y.shape)
    if x.dtype is not T.float32 or y.dtype is not T.float32 or xd is None or yd is None or \
            len(xd) != 4:
        return None
    attrs = node.attrs
    kernel_hw = tuple(attrs["kernel_shape"])
    geometry = plane_geometry(attrs, xd[2:], kernel_hw, yd[2:])
    if geometry is None:
        return None
    strides, dilations, begins, padded_hw = geometry
    return Pool2d(kernel.func.name, kernel.func.params, x, y, tuple(xd), tuple(yd),
                  POOLS[node.op], kernel_hw, tuple(strides), tuple(dilations), tuple(begins),
                  tuple(padded_hw), bool(attrs.get("count_include_pad", 0)),
                  bool(attrs.get("ceil_mode", 0)))


# -- rows: everything else ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """Any kernel, as lowered: its PrimFunc (loop nests over output rows, reductions as
    accumulators) and its anchor's pattern."""

    func: L.PrimFunc
    pattern: Pattern


def rows(kernel: Kernel) -> Rows:
    """Every kernel as a `Rows`."""
    return Rows(kernel.func, get_op(kernel.anchor.op).pattern)


def pointwise_dense(kernel: Kernel) -> PointwiseDense | None:
    """A pointwise conv anchoring `kernel` as a matrix product (`Conv2d.as_dense`); None
    otherwise."""
    conv = conv2d(kernel)
    return None if conv is None else conv.as_dense()
