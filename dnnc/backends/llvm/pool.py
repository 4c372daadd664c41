"""The 2-D pooling schedule template for CPUs (MaxPool, AveragePool).

Per plane (image x channel): the input plane, when the windows reach into padding, is copied
into a cache-resident buffer filled with the pooling's identity (-inf for max, 0 for an
average that counts the padding), so the taps never test bounds; then each output row runs in
vectors of pixels, every tap one vector load (a shuffle of one load at stride 2 to 4) combined
into the accumulators. Planes are shared by the worker pool when the work pays for it.

Applies to float32 NCHW pools with static shapes and one output; MaxPool's Indices output,
and averages that exclude padding from their divisor where a window reaches into it, keep
the default schedule.
"""

from __future__ import annotations

from ...ir import loop as L
from ...ir import types as T
from ..lower import Kernel
from .conv import pad_plane, parallel_kind, plane_geometry, row_in_vectors
from .schedules import MIN_PARALLEL_WORK


def pool2d_schedule(kernel: Kernel, vector_bits: int, threads: int) -> L.PrimFunc | None:
    node = kernel.anchor
    if len(kernel.nodes) != 1 or node.op not in ("MaxPool", "AveragePool") or \
            len(node.outputs) != 1 or len(kernel.func.params) != 2:
        return None
    x, y = kernel.func.params
    xd, yd = L.static_shape(x.shape), L.static_shape(y.shape)
    if x.dtype is not T.float32 or y.dtype is not T.float32 or xd is None or yd is None or \
            len(xd) != 4:
        return None
    n, c, h, wid = xd
    _, _, oh, ow = yd
    attrs = node.attrs
    kh, kw = attrs["kernel_shape"]
    geometry = plane_geometry(attrs, (h, wid), (kh, kw), (oh, ow))
    if geometry is None:
        return None
    (sh, sw), (dh, dw), (ph, pw), (hp, wp) = geometry
    padded = (ph, pw, hp, wp) != (0, 0, h, wid)
    is_max = node.op == "MaxPool"
    if not is_max and ((padded and not attrs.get("count_include_pad", 0)) or
                       attrs.get("ceil_mode", 0)):
        return None   # the divisor would vary at the borders
    fill = L.const(float("-inf") if is_max else 0.0)

    plane, row = L.Var("plane"), L.Var("row")
    bn, ch = plane // c, plane % c
    stmts = []
    if padded:
        src, copy = pad_plane(x, bn, ch, (h, wid), (ph, pw), (hp, wp), fill.value)
        stmts.append(copy)

        def tap(i, j):
            return src[i, j]
    else:
        def tap(i, j):
            return x[bn, ch, i, j]

    lanes = vector_bits // 32
    r, s, jj = L.Var("r"), L.Var("s"), L.Var("j")

    def block(width: int, ow0: L.Expr) -> L.Stmt:
        acc = L.Buffer("acc", T.float32, (width,), L.Scope.LOCAL)
        kind = L.ForKind.VECTORIZED if width >= 2 else L.ForKind.UNROLLED
        value = tap(row * sh + r * dh, (ow0 + jj) * sw + s * dw)
        combined = L.maximum(acc[jj], value) if is_max else acc[jj] + value
        init = L.For(jj, width, L.Store(acc, (jj,), fill), kind)
        taps = L.For(r, kh, L.For(s, kw, L.For(jj, width, L.Store(acc, (jj,), combined),
                                                kind)))
        out = acc[jj] if is_max else acc[jj] * L.const(1.0 / (kh * kw))
        store = L.For(jj, width, L.Store(y, (bn, ch, row, ow0 + jj), out), kind)
        return L.Allocate(acc, L.seq(init, taps, store))

    stmts.append(L.For(row, oh, row_in_vectors(block, ow, lanes)))
    body = L.seq(*stmts)
    if padded:
        body = L.Allocate(src, body)
    par = parallel_kind(threads, n * c * oh * ow * kh * kw, MIN_PARALLEL_WORK)
    main = L.For(plane, n * c, body, par)
    return L.simplify(L.PrimFunc(kernel.func.name, kernel.func.params, main))
