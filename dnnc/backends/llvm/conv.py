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
    mr: int | None = None      # pixels per tile; None: MR_BY_VECTOR_BITS
    nr_vectors: int = 2


MIN_PARALLEL_MACS = 1 << 20
"""Multiply-adds below which a conv runs on one thread: waking the pool costs microseconds,
and a smaller layer is done in about that time."""

MR_BY_VECTOR_BITS = {512: 8}
"""Pixels per tile by vector width, else 4. AVX2 (16 ymm): 4 x 2 vectors, measured fastest of
3..14 x 1..4 on the resnet50 3x3 conv. AVX-512 (32 zmm): 8 x 2 = 16 accumulators, 10-25% faster
than 4 x 2 on the resnet and mobilenet convs (znver4)."""


def parallel_kind(threads: int, work: int, minimum: int = MIN_PARALLEL_MACS) -> L.ForKind:
    """PARALLEL when there are threads to share and `work` reaches `minimum`."""
    return L.ForKind.PARALLEL if threads > 1 and work >= minimum else L.ForKind.SERIAL


@dataclass(frozen=True)
class _Conv2d:
    """A float32 NCHW 2-D Conv kernel's buffers and geometry, static shapes only."""

    node: object
    x: L.Buffer
    w: L.Buffer        # [M, C, kh, kw], or packed [M/NR, C, kh, kw, NR] (ConvPacked)
    bias: L.Buffer | None
    y: L.Buffer
    x_dims: tuple
    w_dims: tuple      # [M, C, kh, kw] (unpacked)
    y_dims: tuple
    strides: list
    dilations: list
    begins: list
    padded_hw: tuple   # an input plane big enough for every window the output reads
    packed_nr: int     # NR of packed weights, 0 when the weights are a plain [M, C, kh, kw]

    def pad_input(self, par: L.ForKind) -> tuple[L.Buffer, L.Stmt | None]:
        """The input copied into a zero-padded buffer (None when no padding is needed): zero
        the plane, then copy the image into its middle, two simple loops LLVM vectorises (a
        per-element bounds test would not be)."""
        n, c, h, wid = self.x_dims
        hp, wp = self.padded_hw
        ph, pw = self.begins
        if (ph, pw) == (0, 0) and (hp, wp) == (h, wid):
            return self.x, None
        xpad = L.Buffer("xpad", T.float32, (n, c, hp, wp))
        nc, i_h, i_w = L.Var("pnc"), L.Var("ph"), L.Var("pw")
        i_n, i_c = nc // c, nc % c
        zero = L.For(i_h, hp, L.For(i_w, wp, L.Store(xpad, (i_n, i_c, i_h, i_w),
                                                      L.const(0.0))))
        copy = L.For(i_h, h, L.For(i_w, wid, L.Store(xpad, (i_n, i_c, i_h + ph, i_w + pw),
                                                      self.x[i_n, i_c, i_h, i_w])))
        return xpad, L.For(nc, n * c, L.seq(zero, copy), par)

    def pad_plane(self, bn: L.Expr, ch: L.Expr) -> tuple[L.Buffer, L.Stmt]:
        """One input plane in a zero-padded buffer (see `pad_plane`)."""
        return pad_plane(self.x, bn, ch, self.x_dims[2:], self.begins, self.padded_hw)


def pad_plane(x: L.Buffer, bn: L.Expr, ch: L.Expr, image_hw, begins, padded_hw,
              fill: float = 0.0) -> tuple[L.Buffer, L.Stmt]:
    """Plane (bn, ch) of NCHW `x` copied into a [hp, wp] buffer filled with `fill` around it:
    done inside the loop over planes, it stays in cache for the taps that read it (a whole
    padded image would go out to memory and back: at 3x3 depthwise that copy cost more than
    the convolution)."""
    (h, wid), (ph, pw), (hp, wp) = image_hw, begins, padded_hw
    plane = L.Buffer("xplane", T.float32, (hp, wp))
    i_h, i_w = L.Var("ph"), L.Var("pw")
    around = L.For(i_h, hp, L.For(i_w, wp, L.Store(plane, (i_h, i_w), L.const(fill))))
    copy = L.For(i_h, h, L.For(i_w, wid, L.Store(plane, (i_h + ph, i_w + pw),
                                                  x[bn, ch, i_h, i_w])))
    return plane, L.seq(around, copy)


def row_in_vectors(block, width: int, lanes: int) -> L.Stmt:
    """A row of `width` pixels as `block(lanes, start)` for each whole vector, then one
    narrower `block(rest, start)`."""
    pb = L.Var("pb")
    full = width // lanes
    parts = []
    if full:
        parts.append(L.For(pb, full, block(lanes, pb * lanes)))
    if width % lanes:
        parts.append(block(width % lanes, L.const(full * lanes)))
    return L.seq(*parts)


def _conv2d(kernel: Kernel) -> _Conv2d | None:
    """The kernel's Conv anchor as a `_Conv2d`, or None when no 2-D template applies."""
    node = kernel.anchor
    if node is not kernel.nodes[0] or node.op not in ("Conv", "ConvPacked"):
        return None
    params = kernel.func.params
    index = {id(v): k for k, v in enumerate(kernel.inputs)}
    x = params[index[id(node.inputs[0])]]
    w = params[index[id(node.inputs[1])]]
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
    bias = params[index[id(node.inputs[2])]] if has_bias else None
    y = params[-1]
    xd, wd, yd = L.static_shape(x.shape), L.static_shape(w.shape), L.static_shape(y.shape)
    if node.outputs[0].type.dtype is not T.float32 or x.dtype is not T.float32 or \
            w.dtype is not T.float32 or xd is None or wd is None or yd is None or len(xd) != 4:
        return None
    packed_nr = 0
    if node.op == "ConvPacked":
        if len(wd) != 5:
            return None
        packed_nr = wd[-1]
        wd = (node.attrs["oc"],) + wd[1:4]
    geometry = plane_geometry(node.attrs, xd[2:], wd[2:], yd[2:])
    if geometry is None:
        return None
    return _Conv2d(node, x, w, bias, y, xd, wd, yd, *geometry, packed_nr)


def plane_geometry(attrs: dict, image_hw, kernel_hw, out_hw):
    """(strides, dilations, begin pads, padded plane (hp, wp)) of a 2-D window op's attrs,
    the plane big enough for every window the output reads; None when the output size does
    not match the attrs."""
    from ...ir.ops.window import window_attrs, window_geometry

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
    lanes = vector_bits // 32
    nr = conv.packed_nr or config.nr_vectors * lanes
    # as many accumulators whatever NR is: a one-vector-wide block takes twice the pixels
    mr = config.mr or MR_BY_VECTOR_BITS.get(vector_bits, 4) * max(2 // max(nr // lanes, 1), 1)
    ocb_n = -(-oc // nr)
    par = parallel_kind(threads, n * oc * oh * ow * c * kh * kw)

    xpad, pad_stmt = conv.pad_input(par)
    stmts = [pad_stmt] if pad_stmt is not None else []
    q, ic, r, s, jj = (L.Var(v) for v in ("q", "ic", "r", "s", "j"))
    if conv.packed_nr:
        wpk = w   # convert_layout packed the weights at compile time
    else:
        wpk = L.Buffer("wpack", T.float32, (ocb_n, c, kh, kw, nr))
        o = q * nr + jj
        wval = L.Select(o < oc, w[L.minimum(o, oc - 1), ic, r, s], L.const(0.0))
        stmts.append(L.For(q, ocb_n, L.For(ic, c, L.For(r, kh, L.For(s, kw, L.For(
            jj, nr, L.Store(wpk, (q, ic, r, s, jj), wval)))))))

    ii = L.Var("ii")
    acc = L.Buffer("acc", T.float32, (mr * nr,), L.Scope.LOCAL)
    a = L.Var("a", T.float32)
    # (1x1 stride-1 convs without padding never get here: `pointwise_schedule` takes them)
    row, ob, pb = L.Var("row"), L.Var("ob"), L.Var("pb")
    bn, boh = row // oh, row % oh
    ow0 = pb * mr
    pix = L.minimum(ow0 + ii, ow - 1)   # pixels past the row's end repeat; never stored
    load = xpad[bn, ic, boh * sh + r * dh, pix * sw + s * dw]
    p = ow0 + ii
    out_index = (bn, ob * nr + jj, boh, p)
    init = L.For(ii, mr, L.For(jj, nr, L.Store(acc, (ii * nr + jj,), L.const(0.0)),
                               L.ForKind.VECTORIZED), L.ForKind.UNROLLED)
    # the reduction over (in-channel, kh, kw) as three loops; the weights of one step are one
    # contiguous NR-vector, the input one broadcast pixel per accumulator row
    step = L.For(ii, mr, L.Let(a, load, L.For(
        jj, nr, L.Store(acc, (ii * nr + jj,), L.call("fma", a, wpk[ob, ic, r, s, jj],
                                                        acc[ii * nr + jj])),
        L.ForKind.VECTORIZED)), L.ForKind.UNROLLED)
    reduction = L.For(ic, c, L.For(r, kh, L.For(s, kw, step)))
    out_c = ob * nr + jj
    value = acc[ii * nr + jj]
    if bias is not None:
        value = value + bias[L.minimum(out_c, oc - 1)]
    value = then(value, out_index)   # the fused epilogue (bias, ReLU, add)
    target = L.Store(y, out_index, value)
    if oc % nr == 0:   # whole channel blocks: one vector store per pixel
        row_store = L.For(jj, nr, target, L.ForKind.VECTORIZED)
    else:
        row_store = L.For(jj, nr, L.If(out_c < oc, target), L.ForKind.UNROLLED)
    store = L.For(ii, mr, L.If(p < ow, row_store), L.ForKind.UNROLLED)
    tile = L.Allocate(acc, L.seq(init, reduction, store))
    main = L.For(row, n * oh, L.For(ob, ocb_n, L.For(pb, -(-ow // mr), tile)), par)
    stmts.append(main)
    body = L.seq(*stmts)
    if not conv.packed_nr:
        body = L.Allocate(wpk, body)
    if pad_stmt is not None:
        body = L.Allocate(xpad, body)
    return L.simplify(L.PrimFunc(kernel.func.name, kernel.func.params, body))


POINTWISE_CHANNELS = {512: 8}
"""Output channels per pointwise tile by vector width, else 4: with two vectors of pixels,
8 x 2 = 16 accumulators of the 32 zmm registers, 4 x 2 = 8 of the 16 ymm."""


def pointwise_schedule(kernel: Kernel, vector_bits: int, threads: int) -> L.PrimFunc | None:
    """A 1x1 stride-1 unpadded conv as a GEMM with the pixels in the vector lanes: an
    output tile is CM channels by two vectors of consecutive pixels, each step one broadcast
    weight per channel times the input channel's pixel vectors. NCHW keeps an image's pixels
    contiguous, so every load and every store is a whole vector (the channel-vector tile of
    `conv2d_schedule` would store its outputs one lane at a time: at 24 input channels that
    cost more than the multiply-adds)."""
    conv = _conv2d(kernel)
    if conv is None or conv.node.attrs.get("group", 1) != 1:
        return None
    n, c, h, wid = conv.x_dims
    oc, _, kh, kw = conv.w_dims
    _, _, oh, ow = conv.y_dims
    if (kh, kw) != (1, 1) or tuple(conv.strides) != (1, 1) or tuple(conv.begins) != (0, 0) \
            or (oh, ow) != (h, wid):
        return None
    then = epilogue(kernel)
    w, bias, y, x = conv.w, conv.bias, conv.y, conv.x
    hw = h * wid
    lanes = vector_bits // 32
    cm_full = POINTWISE_CHANNELS.get(vector_bits, 4)
    pw_full = 2 * lanes
    xf = L.Buffer(x.name, T.float32, (n, c, hw))
    yf = L.Buffer(y.name, y.dtype, (n, oc, hw))
    flat_reads = _flat_epilogue_reads(kernel, (n, oc, oh, ow))
    ic, cm, q, t = L.Var("ic"), L.Var("cm"), L.Var("q"), L.Var("t")
    a = L.Var("a", T.float32)
    nr = conv.packed_nr

    def weight(o):
        return w[o // nr, ic, 0, 0, o % nr] if nr else w[o, ic, 0, 0]

    def block(bn, o0, p0, channels: int, width: int) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (channels * width,), L.Scope.LOCAL)
        vec = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        init = L.For(cm, channels, L.For(q, width, L.Store(acc, (cm * width + q,),
                                                             L.const(0.0)), vec),
                     L.ForKind.UNROLLED)
        step = L.For(cm, channels, L.Let(a, weight(o0 + cm), L.For(q, width, L.Store(
            acc, (cm * width + q,), L.call("fma", a, xf[bn, ic, p0 + q], acc[cm * width + q])),
            vec)), L.ForKind.UNROLLED)
        o, p = o0 + cm, p0 + q
        value = acc[cm * width + q]
        if bias is not None:
            value = value + bias[o]
        # the epilogue reads its other inputs at the 4-d index; where they all have the
        # output's shape (or broadcast over whole images) the flat pixel is the same element
        value = then(value, (bn, o, L.const(0), p) if flat_reads else (bn, o, p // ow, p % ow))
        store = L.For(cm, channels, L.For(q, width, L.Store(yf, (bn, o, p), value), vec),
                      L.ForKind.UNROLLED)
        return L.Allocate(acc, L.seq(init, L.For(ic, c, step), store))

    # a last block of channels or pixels that would be partial starts earlier instead,
    # overlapping the one before (its values are computed twice, identically): every block
    # has the full width, no narrow tail code
    cms, pws = min(cm_full, oc), min(pw_full, hw)
    cbs, pbs = -(-oc // cms), -(-hw // pws)
    # channel blocks inner: an input block (C x two vectors of pixels) stays in L1 while every
    # channel block uses it
    bn, pb, cb = t // (pbs * cbs), (t // cbs) % pbs, t % cbs
    o0 = L.minimum(cb * cms, oc - cms) if oc % cms else cb * cms
    p0 = L.minimum(pb * pws, hw - pws) if hw % pws else pb * pws
    tile = block(bn, o0, p0, cms, pws)
    par = parallel_kind(threads, n * oc * hw * c)
    main = L.For(t, n * pbs * cbs, tile, par)
    return L.simplify(L.PrimFunc(kernel.func.name, kernel.func.params, main))


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


def depthwise_schedule(kernel: Kernel, vector_bits: int, threads: int) -> L.PrimFunc | None:
    """Depthwise 2-D convolution (group == channels, one filter per channel): per plane, the
    input padded in a cached buffer, then each output row in vectors of pixels, the window's
    taps broadcast from the filter; full vectors read the padded plane contiguously (at stride
    1; strided loads become one load and a shuffle), the row's tail runs narrower."""
    conv = _conv2d(kernel)
    if conv is None:
        return None
    w, bias, y = conv.w, conv.bias, conv.y
    n, c, h, wid = conv.x_dims
    oc, cg, kh, kw = conv.w_dims
    if conv.node.attrs.get("group", 1) != c or oc != c or cg != 1 or conv.packed_nr:
        return None
    _, _, oh, ow = conv.y_dims
    (sh, sw), (dh, dw) = conv.strides, conv.dilations
    lanes = vector_bits // 32
    then = epilogue(kernel)
    par = parallel_kind(threads, n * c * oh * ow * kh * kw)

    plane, row = L.Var("plane"), L.Var("row")
    bn, ch = plane // c, plane % c
    xpad, pad_stmt = conv.pad_plane(bn, ch)
    r, s, jj = L.Var("r"), L.Var("s"), L.Var("j")
    wv = L.Var("wv", T.float32)

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (width,), L.Scope.LOCAL)
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        init = L.For(jj, width, L.Store(acc, (jj,), L.const(0.0)), kind)
        tap = L.Let(wv, w[ch, 0, r, s], L.For(jj, width, L.Store(acc, (jj,), L.call(
            "fma", xpad[row * sh + r * dh, (ow0 + jj) * sw + s * dw], wv, acc[jj])),
            kind))
        value = acc[jj]
        if bias is not None:
            value = value + bias[ch]
        value = then(value, (bn, ch, row, ow0 + jj))
        store = L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), value), kind)
        return L.Allocate(acc, L.seq(init, L.For(r, kh, L.For(s, kw, tap)), store))

    body = L.For(plane, n * c, L.Allocate(xpad, L.seq(pad_stmt, L.For(
        row, oh, row_in_vectors(block, ow, lanes)))), par)
    return L.simplify(L.PrimFunc(kernel.func.name, kernel.func.params, body))
