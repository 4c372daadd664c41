"""fuse_attention: scaled dot-product attention, as exporters write it op by op, becomes one
FusedAttention node (`ir/ops/fused.py`), which a target's template computes in one kernel
(queries, keys and values streamed once; the scores never stored).

Runs only for targets whose `Fusion.attention` says their templates compute the op (cuda);
every other target keeps the chain (llvm's row and dense templates serve it as it is). The
pattern, for each Softmax:

    MatMul(Q, B) -> [Mul by a scalar constant s | Div by one c] -> [Where(drop, fill, .)]
        -> [Add mask] -> Softmax(-1) -> MatMul(., V)

where Q and B may each be multiplied (or divided) by a scalar constant first, as torch
exports scaled_dot_product_attention (Q·√s times Kᵀ·√s): the factors join the scale (their
product, an ulp or two from the chain's rounding of each);

with B = Kᵀ ([*batch, D, Sk]: the exporters' Transpose of K, or a product stored
heads-first, as the zoo's BERT has it), or Transpose(K) swapping the last two axes, which the
node then reads through (`k_transposed`=0: K itself, and the Transpose goes). It matches
only where the fused node means exactly what the chain meant:

- float32 throughout (the cuda template's type); Q, B and V of one rank with equal batch dims
  (no broadcasting among them), the Softmax over the last axis (with the pre-13 `coerce_2d`
  that is the same thing);
- the scale a scalar constant (one element, its broadcast growing nothing); Div by c is
  Mul by 1/c (at most an ulp apart); no scale is scale 1;
- torch's masked_fill (GPT-2's causal mask) after the scale: Where(drop, fill, scores) with
  a boolean `drop` and a scalar constant `fill` (-inf, or any value: the node selects it as
  Where does), broadcasting to the scores without growing them;
- the mask added after the scale and the Where (FusedAttention is
  softmax(where(drop, fill, QKᵀ·s) + mask)V: a mask added before the scale, or multiplied,
  is another function and stays), a float32 tensor of any values that broadcasts to the
  scores without growing them. Finite
  masks (BERT's -10000), -inf and NaN mean what they meant: the template's online softmax
  subtracts 0 instead of a running max of -inf, so a row whose scores are all -inf gives
  NaN (0/0) as Softmax does, and a row whose first keys are -inf loses nothing;
- every value inside the chain read only by the chain and no graph output (the scores or
  the probabilities read elsewhere would have to be computed anyway).
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops.registry import known_constant
from ..ir.target import Target
from ..ir.types import float32
from .simplify import _producer, _rewrite


def fuse_attention(graph: Graph, target: Target) -> Graph:
    """`graph` with every attention chain it can fuse made one FusedAttention node, when
    `target`'s fusion asks for it."""
    if not target.fusion.attention:
        return graph
    for softmax in [n for n in graph.nodes if n.op == "Softmax"]:
        match_attention(graph, softmax)
    return graph


def match_attention(graph: Graph, softmax: Node) -> bool:
    """Replace the attention chain around `softmax` by one FusedAttention node; False (and
    nothing changed) when the chain is not there or would mean something else fused."""
    users = graph.users()
    probs = softmax.outputs[0]
    rank = probs.type.rank
    if rank < 2 or probs.type.dtype is not float32 or \
            softmax.attrs["axis"] % rank != rank - 1:
        return False
    readers = users.get(probs, [])
    if len(readers) != 1 or readers[0].op != "MatMul" or readers[0].inputs[0] is not probs:
        return False
    context = readers[0]
    v = context.inputs[1]
    logits = softmax.inputs[0]
    matched = [softmax, context]
    mask = drop = None
    fill = float("-inf")
    add = _producer(logits, "Add")
    if add is not None:
        for k in (0, 1):
            if _dropped(add.inputs[k]) is not None or \
                    _scaled_product(add.inputs[k]) is not None:
                logits, mask = add.inputs[k], add.inputs[1 - k]
                break
        else:
            return False
        if mask.type.dtype is not float32 or add.outputs[0].type != logits.type:
            return False
        matched.append(add)
    where = _dropped(logits)
    if where is not None:
        node, drop, fill = where
        logits = node.inputs[2]
        matched.append(node)
    found = _scaled_product(logits)
    if found is None:
        return False
    product, scale, scaling = found
    matched += [product] + ([scaling] if scaling is not None else [])
    q, b = product.inputs
    for k, x in enumerate((q, b)):   # torch's SDPA export scales Q and Kᵀ by √scale each
        source, factor, node = _scaled_operand(graph, users, x)
        if node is not None:
            scale *= factor
            matched.append(node)
            q, b = (source, b) if k == 0 else (q, source)
    batch = q.type.shape[:-2]
    if q.type.rank != rank or b.type.rank != rank or v.type.rank != rank or \
            b.type.shape[:-2] != batch or v.type.shape[:-2] != batch or \
            any(x.type.dtype is not float32 for x in (q, b, v)):
        return False
    k, k_transposed = b, 1
    transpose = _producer(b, "Transpose")
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    if transpose is not None and list(transpose.attrs.get("perm") or []) == swap and \
            len(users.get(b, [])) == 1 and not any(o is b for o in graph.outputs):
        k, k_transposed = transpose.inputs[0], 0
        matched.append(transpose)
    inputs = [q, k, v, mask, drop]
    while inputs[-1] is None:
        inputs.pop()
    return _rewrite(graph, users, matched, context, "FusedAttention", inputs,
                    {"scale": scale, "k_transposed": k_transposed, "fill": fill},
                    name=softmax.name)


def _dropped(x):
    """(the Where, its condition, its fill) when `x` is Where(drop, fill, y) with a boolean
    `drop`, a scalar constant `fill`, y a scaled product and the result y's type; else
    None."""
    node = _producer(x, "Where")
    if node is None:
        return None
    drop, c, y = node.inputs
    c = known_constant(c)
    if drop.type.dtype.kind != "b" or c is None or c.size != 1 or \
            node.outputs[0].type != y.type or _scaled_product(y) is None:
        return None
    return node, drop, float(np.asarray(c, np.float64).reshape(()))


def _scaled_operand(graph: Graph, users: dict, x):
    """(y, c, the Mul or Div node) when `x` is y multiplied by a scalar constant c (or
    divided by one: then 1/c) of y's own type, read only by the product and no graph output;
    else (x, 1.0, None)."""
    node = _producer(x, "Mul", "Div")
    if node is None or len(users.get(x, [])) != 1 or any(o is x for o in graph.outputs):
        return x, 1.0, None
    for y, factor in _scalar_factors(node):
        if y.type != x.type:
            continue
        if factor is None or factor == 0.0:
            break
        return y, factor, node
    return x, 1.0, None


def _scalar_factors(node: Node):
    """(the input `node`, a Mul or Div, scales, the factor) for each side where its other
    input is a scalar constant c: c for a Mul, 1/c for a Div; the factor None where c is not
    finite or a divisor is 0."""
    for k in (0, 1) if node.op == "Mul" else (0,):
        c = known_constant(node.inputs[1 - k])
        if c is None or c.size != 1:
            continue
        value = float(np.asarray(c, np.float64).reshape(()))
        if not math.isfinite(value) or (node.op == "Div" and value == 0.0):
            yield node.inputs[k], None
        else:
            yield node.inputs[k], value if node.op == "Mul" else 1.0 / value


def _scaled_product(x):
    """(the MatMul, the scale, the Mul or Div node or None) when `x` is MatMul(Q, B), or
    that product multiplied by a scalar constant s or divided by one c (then the scale is
    1/c); else None."""
    product = _producer(x, "MatMul")
    if product is not None:
        return product, 1.0, None
    scaling = _producer(x, "Mul", "Div")
    if scaling is None or scaling.outputs[0].type != scaling.inputs[0].type and \
            scaling.outputs[0].type != scaling.inputs[1].type:
        return None
    for y, factor in _scalar_factors(scaling):
        product = _producer(y, "MatMul")
        if product is None or scaling.outputs[0].type != product.outputs[0].type:
            continue
        return None if factor is None else (product, factor, scaling)
    return None
