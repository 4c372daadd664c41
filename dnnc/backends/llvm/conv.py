"""The 2-D convolution schedule template for CPUs: direct convolution as an implicit GEMM.

Output pixels along a row play GEMM's rows and output channels its columns: an MR-pixel by
NR-channel tile of the output stays in accumulators while the reduction runs over input
channels and the kernel window, each step one broadcast input pixel times a vector of NR
weights (the dense template's micro-kernel; see dense.py). Weights are repacked per call into
[channel block, in-channel, kh, kw, NR] so the NR weights of a step are one contiguous vector
(zero-padded past the last channel); the input is copied once into a zero-padded buffer so the
inner loops never test bounds. Rows of the output (batch x height) are shared by the worker
pool.

Knobs (`ConvConfig`): mr (pixels), nr (vectors of channels). Applies to float32 NCHW Conv with
group 1 and static shapes; depthwise and grouped convolutions use the default schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import loop as L
from ...ir import types as T
from ..lower import Kernel, epilogue


@dataclass(frozen=True)
class ConvConfig:
    # 4 pixels x 2 vectors: measured fastest of 3..14 x 1..4 on the resnet50 3x3 conv (AVX2)
    mr: int = 4
    nr_vectors: int = 2


def _dims(shape):
    if not all(isinstance(d, L.Const) for d in shape):
        return None
    return [d.value for d in shape]


@dataclass(frozen=True)
class _Conv2d:
    """A float32 NCHW 2-D Conv kernel's buffers and geometry, static shapes only."""

    node: object
    x: L.Buffer
    w: L.Buffer
    bias: L.Buffer | None
    y: L.Buffer
    x_dims: list
    w_dims: list
    y_dims: list
    strides: list
    dilations: list
    begins: list
    padded_hw: tuple   # an input plane big enough for every window the output reads

    def pad_input(self, par: L.ForKind, always: bool = False
                  ) -> tuple[L.Buffer, L.Stmt | None]:
        """The input copied into a zero-padded buffer (None when no padding is needed): zero
        the plane, then copy the image into its middle, two simple loops LLVM vectorises (a
        per-element bounds test would not be)."""
        n, c, h, wid = self.x_dims
        hp, wp = self.padded_hw
        ph, pw = self.begins
        if not always and (ph, pw) == (0, 0) and (hp, wp) == (h, wid):
            return self.x, None
        xpad = L.Buffer("xpad", T.float32, (n, c, hp, wp))
        nc, i_h, i_w = L.Var("pnc"), L.Var("ph"), L.Var("pw")
        i_n, i_c = nc // c, nc % c
        zero = L.For(i_h, hp, L.For(i_w, wp, L.Store(xpad, (i_n, i_c, i_h, i_w),
                                                      L.const(0.0))))
        copy = L.For(i_h, h, L.For(i_w, wid, L.Store(xpad, (i_n, i_c, i_h + ph, i_w + pw),
                                                      self.x[i_n, i_c, i_h, i_w])))
        return xpad, L.For(nc, n * c, L.seq(zero, copy), par)


def _conv2d(kernel: Kernel) -> _Conv2d | None:
    """The kernel's Conv anchor as a `_Conv2d`, or None when no 2-D template applies."""
    from ...ir.ops.nn import window_attrs, window_geometry

    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op != "Conv":
        return None
    params = kernel.func.params
    index = {id(v): k for k, v in enumerate(kernel.inputs)}
    x = params[index[id(node.inputs[0])]]
    w = params[index[id(node.inputs[1])]]
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
    bias = params[index[id(node.inputs[2])]] if has_bias else None
    y = params[-1]
    xd, wd, yd = _dims(x.shape), _dims(w.shape), _dims(y.shape)
    if node.outputs[0].type.dtype is not T.float32 or x.dtype is not T.float32 or \
            w.dtype is not T.float32 or xd is None or wd is None or yd is None or len(xd) != 4:
        return None
    h, wid = xd[2:]
    kh, kw = wd[2:]
    oh, ow = yd[2:]
    strides, dilations, pads = window_attrs(2, node.attrs.get("strides"),
                                            node.attrs.get("dilations"), node.attrs.get("pads"))
    outs, begins, _ = window_geometry([h, wid], [kh, kw], strides, dilations, pads,
                                      node.attrs.get("auto_pad", "NOTSET"))
    if list(outs) != [oh, ow]:
        return None
    (sh, sw), (dh, dw), (ph, pw) = strides, dilations, begins
    padded_hw = (max(h + ph, (oh - 1) * sh + (kh - 1) * dh + 1),
                 max(wid + pw, (ow - 1) * sw + (kw - 1) * dw + 1))
    return _Conv2d(node, x, w, bias, y, xd, wd, yd, strides, dilations, list(begins),
                   padded_hw)


def conv2d_schedule(kernel: Kernel, vector_bits: int, threads: int,
                    config: ConvConfig | None = None) -> L.PrimFunc | None:
    config = config or ConvConfig()
    conv = _conv2d(kernel)
    if conv is None or conv.node.attrs.get("group", 1) != 1:
        return None
    then = epilogue(kernel)
    w, bias, y = conv.w, conv.bias, conv.y
    n, c, h, wid = conv.x_dims
    oc, _, kh, kw = conv.w_dims
    _, _, oh, ow = conv.y_dims
    (sh, sw), (dh, dw) = conv.strides, conv.dilations
    nr = config.nr_vectors * (vector_bits // 32)
    mr = config.mr
    ocb_n = -(-oc // nr)
    owb_n = -(-ow // mr)
    par = L.ForKind.PARALLEL if threads > 1 else L.ForKind.SERIAL

    xpad, pad_stmt = conv.pad_input(par)
    stmts = [pad_stmt] if pad_stmt is not None else []
    wpk = L.Buffer("wpack", T.float32, (ocb_n, c, kh, kw, nr))
    q, ic, r, s, jj = (L.Var(v) for v in ("q", "ic", "r", "s", "j"))
    o = q * nr + jj
    wval = L.Select(o < oc, w[L.minimum(o, oc - 1), ic, r, s], L.const(0.0))
    stmts.append(L.For(q, ocb_n, L.For(ic, c, L.For(r, kh, L.For(s, kw, L.For(
        jj, nr, L.Store(wpk, (q, ic, r, s, jj), wval)))))))

    row, ob, pb, ii = L.Var("row"), L.Var("ob"), L.Var("pb"), L.Var("ii")
    bn, boh = row // oh, row % oh
    acc = L.Buffer("acc", T.float32, (mr * nr,), L.Scope.LOCAL)
    ow0 = pb * mr
    pix = L.minimum(ow0 + ii, ow - 1)   # pixels past the row's end repeat; never stored
    a = L.Var("a", T.float32)
    init = L.For(ii, mr, L.For(jj, nr, L.Store(acc, (ii * nr + jj,), L.const(0.0)),
                               L.ForKind.VECTORIZED), L.ForKind.UNROLLED)
    # the reduction over (in-channel, kh, kw) as three loops; the weights of one step are one
    # contiguous NR-vector (wpack), the input one broadcast pixel per accumulator row
    step = L.For(ii, mr, L.Let(a, xpad[bn, ic, boh * sh + r * dh, pix * sw + s * dw], L.For(
        jj, nr, L.Store(acc, (ii * nr + jj,), L.call("fma", a, wpk[ob, ic, r, s, jj],
                                                        acc[ii * nr + jj])),
        L.ForKind.VECTORIZED)), L.ForKind.UNROLLED)
    reduction = L.For(ic, c, L.For(r, kh, L.For(s, kw, step)))
    out_c = ob * nr + jj
    value = acc[ii * nr + jj]
    if bias is not None:
        value = value + bias[L.minimum(out_c, oc - 1)]
    value = then(value, (bn, out_c, boh, ow0 + ii))   # the fused epilogue (bias, ReLU, add)
    store = L.For(ii, mr, L.If(ow0 + ii < ow, L.For(jj, nr, L.If(
        out_c < oc, L.Store(y, (bn, out_c, boh, ow0 + ii), value)), L.ForKind.UNROLLED)),
        L.ForKind.UNROLLED)
    tile = L.Allocate(acc, L.seq(init, reduction, store))
    main = L.For(row, n * oh, L.For(ob, ocb_n, L.For(pb, owb_n, tile)), par)
    stmts.append(main)
    body = L.Allocate(wpk, L.seq(*stmts))
    if pad_stmt is not None:
        body = L.Allocate(xpad, body)
    return L.simplify(L.PrimFunc(kernel.func.name, kernel.func.params, body))


def depthwise_schedule(kernel: Kernel, vector_bits: int, threads: int) -> L.PrimFunc | None:
    """Depthwise 2-D convolution (group == channels, one filter per channel): each output row
    in vectors of pixels, the window's taps broadcast from the filter; full vectors read the
    padded input contiguously (at stride 1), the row's tail runs narrower."""
    conv = _conv2d(kernel)
    if conv is None:
        return None
    w, bias, y = conv.w, conv.bias, conv.y
    n, c, h, wid = conv.x_dims
    oc, cg, kh, kw = conv.w_dims
    if conv.node.attrs.get("group", 1) != c or oc != c or cg != 1:
        return None
    _, _, oh, ow = conv.y_dims
    (sh, sw), (dh, dw) = conv.strides, conv.dilations
    lanes = vector_bits // 32
    then = epilogue(kernel)
    par = L.ForKind.PARALLEL if threads > 1 else L.ForKind.SERIAL

    xpad, pad_stmt = conv.pad_input(par, always=True)

    plane, row = L.Var("plane"), L.Var("row")
    bn, ch = plane // c, plane % c
    r, s, jj = L.Var("r"), L.Var("s"), L.Var("j")
    wv = L.Var("wv", T.float32)

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (width,), L.Scope.LOCAL)
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        init = L.For(jj, width, L.Store(acc, (jj,), L.const(0.0)), kind)
        tap = L.Let(wv, w[ch, 0, r, s], L.For(jj, width, L.Store(acc, (jj,), L.call(
            "fma", xpad[bn, ch, row * sh + r * dh, (ow0 + jj) * sw + s * dw], wv, acc[jj])),
            kind))
        value = acc[jj]
        if bias is not None:
            value = value + bias[ch]
        value = then(value, (bn, ch, row, ow0 + jj))
        store = L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), value), kind)
        return L.Allocate(acc, L.seq(init, L.For(r, kh, L.For(s, kw, tap)), store))

    pb = L.Var("pb")
    full = ow // lanes
    parts = []
    if full:
        parts.append(L.For(pb, full, block(lanes, pb * lanes)))
    if ow % lanes:
        parts.append(block(ow % lanes, L.const(full * lanes)))
    main = L.For(plane, n * c, L.For(row, oh, L.seq(*parts)), par)
    body = L.Allocate(xpad, L.seq(pad_stmt, main))
    return L.simplify(L.PrimFunc(kernel.func.name, kernel.func.params, body))
