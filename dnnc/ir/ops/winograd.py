"""ConvWinograd: a 3x3 conv whose filters `convert_layout` transformed for Winograd's F(m x m,
3x3), and the transforms themselves, generated for any output tile m (never typed in as
tables). Frontends never produce this op; it never holds anything but 3x3, stride-1, one-group
convolutions.

Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks" (2016): F(m, 3) computes m
outputs of a 1-D correlation with a 3-tap filter g from alpha = m + 2 inputs d as
A^T [(G g) . (B^T d)]; nested, an m x m tile is A^T [(G g G^T) . (B^T d B)] A. The matrices
come from the modified Toom-Cook algorithm (a polynomial product evaluated at alpha - 1
points and infinity, then interpolated; the correlation is the product's transpose), as the
`wincnn` tool derives them, in exact fractions: the interpolation's denominators are put in
G (applied once, at compile time, in float64), and each row of B^T and column of A^T is
scaled to few multiplies with coefficients exact in binary floating point.

ConvWinograd(x, U, b) is Conv(x, G' U G'^T, b), G' an exact left inverse of G
(`Winograd.g_inverse`): U is [alpha^2, ceil(M / NR), C, NR] (`winograd_weights`), so
m = sqrt(U's first axis) - 2; `oc` (M) and Conv's attributes are attributes. With
`precision` "bf16" U is bfloat16 in pairs of input channels, [alpha^2, ceil(M / NR),
ceil(C / 2), NR, 2] (as vdpbf16ps reads an operand), and the op is the algorithm itself with
each transformed input patch B^T d B rounded to bf16 (`winograd_bf16`): the products are of
bf16 operands, as ConvPacked's at bf16, but in the transformed domain, so no rounding of x and
W reproduces them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import batching
from .. import types as T
from ..compute import compute
from ..flops import has_input
from ..graph import Value
from ..loop import Cast, Select, eq, static_shape
from .conv import CONV_ATTRS, conv, conv_flops, conv_rule
from .packed import PACKED_PRECISIONS, _conv_attrs
from .registry import REQUIRED, Pattern, infer_node, register_op

POINTS = {2: (0, 1, -1), 4: (0, Fraction(1, 2), Fraction(-1, 2), 2, -2),
          6: (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2))}
"""Output tile m -> the m + 1 finite interpolation points (infinity is the last). F(4, 3)'s
+-1/2, +-2 instead of Lavin and Gray's +-1, +-2: 2.4x less error in float32 for as many
multiplies (Barabasz et al., "Error Analysis and Improving the Accuracy of Winograd
Convolution", 2020; measured: largest error over the largest output 2.7e-6 against 6.3e-6,
128 channels; F(2, 3)'s 3.2e-7). F(6, 3)'s are Lavin and Gray's (1.1e-5: the best of the
sets tried)."""


@dataclass(frozen=True)
class Winograd:
    """F(m, 3)'s matrices as tuples of rows of Fractions: A^T [m, alpha], G [alpha, 3],
    B^T [alpha, alpha], and G' [3, alpha] (G' G = I)."""
    m: int
    at: tuple
    g: tuple
    bt: tuple
    g_inverse: tuple

    @property
    def alpha(self) -> int:
        return self.m + 2


def _poly(roots) -> list[Fraction]:
    """Coefficients (lowest first) of prod (x - root)."""
    coeffs = [Fraction(1)]
    for root in roots:
        shifted = [Fraction(0)] + coeffs                 # x * poly
        coeffs = [s - root * c for s, c in zip(shifted, coeffs + [Fraction(0)])]
    return coeffs


def _inverse3(rows) -> list[list[Fraction]]:
    """The inverse of a 3x3 matrix of Fractions (Gauss-Jordan)."""
    a = [list(row) + [Fraction(int(i == j)) for j in range(3)] for i, row in enumerate(rows)]
    for col in range(3):
        pivot = next(r for r in range(col, 3) if a[r][col])
        a[col], a[pivot] = a[pivot], a[col]
        a[col] = [v / a[col][col] for v in a[col]]
        for r in range(3):
            if r != col and a[r][col]:
                a[r] = [v - a[r][col] * p for v, p in zip(a[r], a[col])]
    return [row[3:] for row in a]


def _dyadic(v: Fraction) -> bool:
    """Whether v is exact in binary floating point (a power-of-two denominator)."""
    return v.denominator & (v.denominator - 1) == 0


def _scale(values) -> Fraction:
    """The factor for a row of B^T (or a column of A^T) that leaves its coefficients exact in
    binary floating point with the fewest multiplies (coefficients other than +-1), the
    first non-zero positive: 1 / one of its coefficients where that is exact throughout,
    else the one making them integers."""
    options = [1 / v for v in values if v] + [Fraction(math.lcm(*(v.denominator
                                                                    for v in values)))]
    exact = [s for s in options if all(_dyadic(v * s) for v in values)]

    def multiplies(s):
        return sum(1 for v in values if v and abs(v * s) != 1), max(abs(v * s) for v in values)

    best = min(exact, key=multiplies)
    return best if next(v for v in values if v) * best > 0 else -best


@functools.cache
def winograd(m: int) -> Winograd:
    """F(m, 3)'s transforms by modified Toom-Cook over POINTS[m] (`wincnn`'s construction).

    The product s = g * h (degree m + 1) of a filter g and an m-tap h is the interpolation of
    its values at the points p_i, (G g)_i (G h)_i, plus its top coefficient at infinity times
    prod (x - p_i): s = C [(E_g g) . (E_h h)], E rows the points' powers (infinity's picks
    the top coefficient). Transposed in h, y = E_h^T [(E_g g) . (C^T d)]: A^T = E_h^T,
    G = E_g, B^T = C^T, each Lagrange basis polynomial's denominator moved from B^T's row
    to G's row. Each row of B^T and column of A^T is then scaled (`_scale`, the factor moved
    into G's row) to the fewest multiplies with every coefficient exact in binary floating
    point, and signed so its and G's row's first non-zero coefficient is positive."""
    points = [Fraction(p) for p in POINTS[m]]
    alpha = m + 2
    at = [[p ** k for p in points] + [Fraction(int(k == m - 1))] for k in range(m)]
    g = [[p ** k for k in range(3)] for p in points] + [[Fraction(0)] * 2 + [Fraction(1)]]
    bt = []
    for i, p in enumerate(points):
        others = points[:i] + points[i + 1:]
        basis = _poly(others) + [Fraction(0)]            # prod_{j != i} (x - p_j)
        g[i] = [v / math.prod(p - q for q in others) for v in g[i]]
        bt.append(basis)
    bt.append(_poly(points))
    for i in range(alpha):
        scale = _scale(bt[i])                      # B^T's row i, its scale into G's row
        bt[i] = [v * scale for v in bt[i]]
        g[i] = [v / scale for v in g[i]]
        scale = _scale([row[i] for row in at])     # A^T's column i, likewise
        scale = scale if next(v for v in g[i] if v) > 0 else -scale
        for row in at:
            row[i] *= scale
        g[i] = [v / scale for v in g[i]]
    # G' from the rows of the points 0 and 1 and of infinity (a 3x3 invertible minor)
    picks = (0, 1, alpha - 1)
    minor = _inverse3([g[i] for i in picks])
    g_inverse = [[Fraction(0)] * alpha for _ in range(3)]
    for r in range(3):
        for k, i in enumerate(picks):
            g_inverse[r][i] = minor[r][k]
    return Winograd(m, *(tuple(tuple(row) for row in x) for x in (at, g, bt, g_inverse)))


def _floats(rows) -> np.ndarray:
    return np.array([[float(v) for v in row] for row in rows], np.float64)


def tile_of(positions: int) -> int:
    """The output tile m of transformed weights with `positions` = alpha^2 rows."""
    alpha = math.isqrt(positions)
    if alpha * alpha != positions or alpha - 2 not in POINTS:
        raise ValueError(f"no Winograd F(m, 3) has {positions} positions "
                         f"(it has: {', '.join(str((m + 2) ** 2) for m in POINTS)})")
    return alpha - 2


def winograd_weights(w: np.ndarray, nr: int, m: int = 2, pairs: bool = False) -> np.ndarray:
    """3x3 weights [M, C, 3, 3] -> U = G g G^T of each filter for F(m x m, 3x3), in float64
    then rounded once, as [alpha^2, ceil(M / nr), C, nr] float32 (position a * alpha + b,
    then channel blocks of nr, zero past the last): for each position a product's B panel,
    read one NR-vector a step. With `pairs`, bfloat16 [alpha^2, ceil(M / nr), ceil(C / 2),
    nr, 2], input channels 2t and 2t + 1 side by side (C padded with a zero channel when
    odd)."""
    oc, c = w.shape[:2]
    g = _floats(winograd(m).g)
    alpha = m + 2
    u = np.einsum("ar,mcrs,bs->abmc", g, w.astype(np.float64), g)
    blocks = -(-oc // nr)
    depth = -(-c // 2) * 2 if pairs else c
    padded = np.zeros((alpha * alpha, blocks * nr, depth))
    padded[:, :oc, :c] = u.reshape(alpha * alpha, oc, c)
    u = padded.reshape(alpha * alpha, blocks, nr, depth).transpose(0, 1, 3, 2)
    if not pairs:
        return np.ascontiguousarray(u).astype(np.float32)
    u = u.reshape(alpha * alpha, blocks, depth // 2, 2, nr).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(u).astype(np.float32).astype(T.bfloat16.np)


def _unpaired(u: np.ndarray, c: int) -> np.ndarray:
    """`winograd_weights`' pairs [alpha^2, blocks, ceil(C / 2), nr, 2] as its float32
    [alpha^2, blocks, C, nr]."""
    u = u.astype(np.float32).transpose(0, 1, 2, 4, 3)
    return u.reshape(u.shape[:2] + (-1, u.shape[-1]))[:, :, :c]


def winograd_filters(u: np.ndarray, oc: int, c: int | None = None) -> np.ndarray:
    """The 3x3 weights [oc, C, 3, 3] `winograd_weights` transformed (G' U G'^T); `c`, the
    input channels, where U is in pairs (float32 weights)."""
    if c is not None:
        u = _unpaired(u, c)
    m = tile_of(u.shape[0])
    alpha = m + 2
    inverse = _floats(winograd(m).g_inverse)
    full = u.astype(np.float64).transpose(0, 1, 3, 2).reshape(alpha, alpha, -1,
                                                              u.shape[2])[:, :, :oc]
    return np.einsum("ra,abmc,sb->mcrs", inverse, full, inverse).astype(u.dtype)


def winograd_bf16(x: np.ndarray, u: np.ndarray, b, oc: int, pads) -> np.ndarray:
    """ConvWinograd at bf16 on NumPy arrays, the algorithm written out: the padded image cut
    into m x m tiles' alpha x alpha patches, each transformed (B^T d B) and rounded to bf16,
    multiplied by U position by position and summed over channels, transformed back
    (A^T M A), cropped to the output, plus the bias."""
    n, c, h, wid = x.shape
    uf = _unpaired(u, c).astype(np.float64)
    m = tile_of(u.shape[0])
    alpha = m + 2
    top, left, bottom, right = pads or [0, 0, 0, 0]
    oh, ow = h + top + bottom - 2, wid + left + right - 2
    th, tw = -(-oh // m), -(-ow // m)
    xp = np.zeros((n, c, th * m + 2, tw * m + 2))
    xp[:, :, top:top + h, left:left + wid] = x
    patches = np.lib.stride_tricks.sliding_window_view(xp, (alpha, alpha), axis=(2, 3))
    patches = patches[:, :, ::m, ::m]                            # [n, c, th, tw, a, a]
    bt, at = _floats(winograd(m).bt), _floats(winograd(m).at)
    v = np.einsum("ia,nctuab,jb->ijnctu", bt, patches, bt).astype(np.float32)
    v = v.astype(T.bfloat16.np).astype(np.float64).reshape(alpha * alpha, n, c, th, tw)
    uo = uf.transpose(0, 1, 3, 2).reshape(alpha * alpha, -1, c)[:, :oc]
    prod = np.einsum("poc,pnctu->pnotu", uo, v).reshape(alpha, alpha, n, oc, th, tw)
    y = np.einsum("ri,ijnotu,sj->notrus", at, prod, at).reshape(n, oc, th * m, tw * m)
    y = y[:, :, :oh, :ow]
    if b is not None:
        y = y + b.astype(np.float64).reshape(oc, 1, 1)
    return y.astype(np.float32)


def _conv_winograd_infer(ctx):
    u = ctx.type(1)
    precision = ctx.attrs.get("precision", "fp32")
    if precision not in PACKED_PRECISIONS:
        raise ctx.fail(f"precision must be one of {', '.join(PACKED_PRECISIONS)}, not "
                       f"{precision!r}")
    pairs = precision == "bf16"
    try:
        tile_of(u.shape[0] if u.rank == (5 if pairs else 4) else 0)
    except ValueError as e:
        raise ctx.fail(f"Winograd weights are [alpha^2, blocks, C, NR] (at bf16 [alpha^2, "
                       f"blocks, ceil(C / 2), NR, 2]), given {u}: {e}")
    c = ctx.type(0).shape[1]
    if pairs and (u.dtype is not T.bfloat16 or u.shape[-1] != 2 or
                  ctx.type(0).dtype is not T.float32 or -(-c // 2) != u.shape[2]):
        raise ctx.fail(f"bf16 Winograd weights are [alpha^2, blocks, ceil(C / 2), NR, 2] "
                       f"bfloat16 for a float32 image, given {u} for {ctx.type(0)}")
    oc = ctx.attrs["oc"]
    w = Value("w.filters", T.TensorType(T.float32 if pairs else u.dtype,
                                        (oc, c if pairs else u.shape[2], 3, 3)))
    inputs = [ctx.values[0], w] + ([ctx.values[2]] if ctx.has(2) else [])
    types, _, _ = infer_node("Conv", inputs, _conv_attrs(ctx.attrs), 1, ctx.node_name)
    return types


def conv_winograd(x, u, b=None, *, oc, precision="fp32", **attrs):
    if precision == "bf16":
        return winograd_bf16(x, u, b, oc, attrs.get("pads"))
    return conv(x, winograd_filters(u, oc), b, **_conv_attrs(attrs))


def _conv_winograd_rule(inputs, outputs, *, oc, precision="fp32", **attrs):
    """Conv of the filters G' U G'^T (a sum of the few non-zero terms each, no reduction:
    lowering inlines it into the conv's loads). The llvm Winograd template reads U itself and
    serves every ConvWinograd; at bf16 this rule is the fp32 conv of U's filters (the
    transformed patches unrounded), within the precision's contract of `winograd_bf16`."""
    x, u = inputs[0], inputs[1]
    pairs = precision == "bf16"
    nr = u.shape[-2 if pairs else -1]
    m = tile_of(static_shape(u.shape)[0])
    alpha = m + 2
    inv = [[float(v) for v in row] for row in winograd(m).g_inverse]

    def weight(a: int, b: int, o, c):
        if pairs:
            return Cast(T.float32, u[a * alpha + b, o // nr, c // 2, o % nr, c % 2])
        return u[a * alpha + b, o // nr, c, o % nr]

    def tap(o, c, r: int, s: int):
        terms = [inv[r][a] * inv[s][b] * weight(a, b, o, c)
                 for a in range(alpha) for b in range(alpha) if inv[r][a] and inv[s][b]]
        return sum(terms[1:], terms[0])

    def pick(i, values: list):   # values[i] for a loop variable i
        return Select(eq(i, 0), values[0], Select(eq(i, 1), values[1], values[2]))

    def filters(o, c, r, s):
        return pick(r, [pick(s, [tap(o, c, i, j) for j in range(3)]) for i in range(3)])

    w = compute((oc, x.shape[1], 3, 3), filters, "filters", T.float32 if pairs else u.dtype)
    return conv_rule([x, w] + list(inputs[2:]), outputs, **_conv_attrs(attrs))


register_op("ConvWinograd", pattern=Pattern.OUT_FUSABLE, infer=_conv_winograd_infer,
            evaluate=conv_winograd, attrs={**CONV_ATTRS, "oc": REQUIRED, "precision": "fp32"},
            inputs=(2, 3),
            compute=_conv_winograd_rule,
            flops=lambda node: conv_flops(node.outputs[0], (node.inputs[0].shape[1], 3, 3),
                                          node.outputs[0], has_input(node, 2)),
            batched=batching.data_input)
