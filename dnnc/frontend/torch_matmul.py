"""ATen's flattened products -> dnnc's N-D MatMul: what an FX import does to the `mm`,
`addmm` and `bmm` that torch's decomposition of `matmul` and `linear` leaves between views.

torch decomposes `linear` and `matmul` on N-D tensors (CompositeImplicitAutograd, so before
any table a backend gives) into views around a 2-D or 3-D product:

    linear(x[..., K], W, b)  ->  view(addmm(b, view(x, [M, K]), permute(W)), [..., N])
    matmul(a[B, H, L, D], b[B, H, D, S])
        ->  view(bmm(view(expand(a, [B, H, L, D]), [B*H, L, D]),
                     view(expand(b, [B, H, D, S]), [B*H, D, S])), [B, H, L, S])

Imported node by node, each view is a Reshape (and each expand a copy) between a product and
what reads it, so the product's epilogue (bias, GELU, residual Add) no longer fuses into it,
attention's chain (MatMul(Q, Kᵀ) -> Softmax -> MatMul) is not the one `fuse_attention`
matches, and the graph has more kernels than the same model's ONNX export (bert, 2 layers:
31 kernels against 28). `fold(gm)` finds each such outer view and the nodes only it reads;
the importer then emits `MatMul(x, W)` (`Add` of the bias for addmm) on the N-D operands
instead, as an ONNX exporter writes them, and skips those nodes.

A fold is taken only where it is exact: the flattening merges all batch dims of an operand and
the outer view restores them (dims compared as ints or SymInt expressions), an expand touches
only batch dims, the operands' batch dims broadcast to the outer view's, and addmm's scales
are 1 with a bias of N elements. This module reads FX nodes and their fake tensors only; it
never builds dnnc values (the importer does) and never changes the FX graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

__all__ = ["Fold", "fold"]

_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
_PRODUCTS = {"aten.mm.default", "aten.bmm.default", "aten.addmm.default"}


@dataclass(frozen=True)
class Fold:
    """The product an outer view computes, on N-D operands: `MatMul(a, b)` (+ `bias`)."""

    a: fx.Node
    b: fx.Node
    bias: fx.Node | None
    skipped: frozenset   # the nodes only this fold read (the product, views, expands)


def _name(node) -> str:
    return str(node.target) if isinstance(node, fx.Node) and node.op == "call_function" \
        else ""


def _shape(node: fx.Node) -> list:
    return list(node.meta["val"].shape)


def _same(x, y) -> bool:
    """Two dims equal as ints or as the same SymInt expression."""
    return str(x) == str(y)


def _same_dims(xs, ys) -> bool:
    return len(xs) == len(ys) and all(_same(x, y) for x, y in zip(xs, ys))


def _broadcast(xs: list, ys: list) -> list | None:
    """NumPy's broadcast of two batch shapes; None where a pair of dims differs (or is not
    known to be 1 on one side)."""
    out = []
    for i in range(1, max(len(xs), len(ys)) + 1):
        x = xs[-i] if i <= len(xs) else 1
        y = ys[-i] if i <= len(ys) else 1
        if _same(x, 1):
            out.append(y)
        elif _same(y, 1) or _same(x, y):
            out.append(x)
        else:
            return None
    return out[::-1]


def _operand(node: fx.Node, kept: int):
    """The N-D tensor behind a flattened operand of a product (`view(x)` or
    `view(expand(x))` that keeps x's last `kept` dims and merges the others into one), the
    batch dims it merged (the expand's, where there is one) and the nodes passed through,
    each only where the one before it is its only reader; None where `node` is no such
    flattening."""
    if _name(node) not in _VIEWS:
        return None
    inner, chain = node.args[0], [node]
    merged = None
    if _name(inner) == "aten.expand.default":
        merged = _shape(inner)[:-kept]
        if not _same_dims(_shape(inner)[-kept:], _shape(inner.args[0])[-kept:]):
            return None   # the expand reaches a kept dim
        chain.append(inner)
        inner = inner.args[0]
    shape, flat = _shape(inner), _shape(node)
    if len(flat) != kept + 1 or len(shape) <= kept + 1 or \
            not _same_dims(shape[-kept:], flat[-kept:]):
        return None
    passed = []
    for n in chain:   # (a node something else reads is imported as it is)
        if len(n.users) != 1:
            break
        passed.append(n)
    return inner, (merged if merged is not None else shape[:-kept]), passed


def _match(view: fx.Node) -> Fold | None:
    """The fold of outer view `view`, or None."""
    product = view.args[0]
    name = _name(product)
    if name not in _PRODUCTS or len(product.users) != 1:
        return None
    if name == "aten.addmm.default":
        if product.kwargs.get("beta", 1) != 1 or product.kwargs.get("alpha", 1) != 1:
            return None
        bias, left, right = product.args[:3]
    else:
        bias, (left, right) = None, product.args[:2]
    out = _shape(view)
    if name == "aten.bmm.default":   # both operands flattened: [B*H, L, D] x [B*H, D, S]
        a, b = _operand(left, 2), _operand(right, 2)
        if a is None or b is None:
            return None
        batch = _broadcast(_shape(a[0])[:-2], _shape(b[0])[:-2])
        if batch is None or not (_same_dims(a[1], out[:-2]) and _same_dims(b[1], out[:-2])
                                 and _same_dims(batch, out[:-2]) and
                                 _same_dims(out[-2:], _shape(product)[-2:])):
            return None
        passed, a, b = a[2] + b[2], a[0], b[0]
    else:   # mm / addmm: x flattened to [M, K], a matrix W of [K, N]
        a = _operand(left, 1)
        if a is None or not isinstance(right, fx.Node) or len(_shape(right)) != 2 or \
                not (_same_dims(a[1], out[:-1]) and _same(out[-1], _shape(product)[-1])):
            return None
        if bias is not None and not (isinstance(bias, fx.Node) and
                                     _same(_shape(bias)[-1], out[-1]) and
                                     all(_same(d, 1) for d in _shape(bias)[:-1])):
            return None
        passed, a, b = a[2], a[0], right
    return Fold(a, b, bias, frozenset([product, *passed]))


def fold(gm: fx.GraphModule) -> dict[fx.Node, Fold]:
    """Each outer view of `gm` that restores a flattened product's batch dims -> its fold.
    A node in a fold's `skipped` is read by nothing else: the importer need not convert it."""
    found = {}
    for node in gm.graph.nodes:
        if _name(node) in _VIEWS and isinstance(node.args[0], fx.Node):
            match = _match(node)
            if match is not None:
                found[node] = match
    return found
