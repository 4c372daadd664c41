"""simplify: rewrite rules over the graph, each with the identity it relies on.

Rules are data: `RULES` is a list of functions `(graph, node, users) -> bool` (True when the
rule rewrote the graph around `node`); `simplify` applies them until none fires. A rule never
changes what a value outside its match means:

- a rewritten subgraph's result keeps its `Value` (the new node writes it), so readers and
  graph outputs need no change;
- a value inside a match that anything else reads (or that is a graph output) means no
  rewrite: nothing is computed twice and nothing read disappears;
- the new node is checked by the op registry's inference (same output types) and takes the
  place of the match's last node, after every value it reads.

The families, in `RULES` order:

- folding constants into the op before: BatchNormalization into Conv, and into a 2-D Gemm /
  MatMul with constant weights (BN over the channel axis 1 of an (N, C) product); a
  per-output-channel constant Mul, Add or Sub after a Conv into its weights and bias; a
  BatchNormalization left over (after no Conv or Gemm) as per-channel Sub, Mul, Mul and Add
  in its own order, which fuse with the ops around them;
- values passed through unchanged: Identity, inference Dropout (its mask, when read, an
  all-true ConstantOfShape of x's shape; an unread mask goes with it), x*1, 1*x, x+0, 0+x, x-0,
  x/1 (a constant of all ones / zeros that broadcasting does not make change x's shape or
  dtype), Cast to x's own dtype, Transpose by the identity permutation, a reshape to x's own
  static shape;
- chains merged: Transpose(Transpose(x)) is one Transpose; reshape-likes (Reshape, Squeeze,
  Unsqueeze, Flatten) of reshape-likes are one Reshape to the final static shape;
- a Reshape to a shape computed at run time (Shape -> Gather -> Concat of a symbolic batch)
  that inference resolved reads a constant shape instead (0 copies a symbolic dim, -1 infers
  one), so its chain goes dead and it fuses like a static Reshape;
- subgraphs that exporters write op by op recognised as the registered op: Gelu (erf form and
  the tanh approximation, as PyTorch's TorchScript exporter and HF write them), a trailing-axes
  LayerNormalization (ReduceMean, Sub, Pow 2 / Mul self, ReduceMean, Add eps, Sqrt, Div, then
  an optional Mul gamma and Add beta), and Softmax (Exp(x - ReduceMax x) / ReduceSum);
- MatMul(A, B) + constant bias with a 2-D A becomes Gemm(A, B, bias): one op that every level
  compiles (the dense template reads Gemm's C as its epilogue) and that convert_layout packs
  into MatMulPacked(A, panels(B), C). An N-D A has no such ONNX op; there convert_layout takes
  the bias into MatMulPacked (its C input) when it packs B, so the bias still rides in the
  dense kernel at opt level 2 and above, and opt level 1 keeps MatMul then Add.

Only the top-level graph is rewritten; subgraph bodies (If, Loop, Scan) are left as they are.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import DNNCError
from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import infer_node, known_constant
from ..ir.types import TensorType, bfloat16, float16, float32, int64

FOLDABLE = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(bfloat16.np))
"""The weight types an affine map folds into (computed in float64, rounded once to the
weights' own type: a half model's BatchNormalization folds too)."""

# -- matching helpers -----------------------------------------------------------------------


def _producer(v: Value | None, *ops: str) -> Node | None:
    """The node computing `v` when its op is one of `ops`."""
    node = v.producer if v is not None else None
    return node if node is not None and node.op in ops else None


def _is_const(v: Value | None, value: float, rtol: float = 1e-6) -> bool:
    """Whether `v` is a known constant, every element `value` (to `rtol`)."""
    c = known_constant(v)
    if c is None or c.size == 0 or c.dtype.kind not in "fiub":
        return False
    return bool(np.allclose(np.asarray(c, np.float64), value, rtol=rtol, atol=0))


def _const_and_other(node: Node, value: float, rtol: float = 1e-6,
                     commutes: bool = True) -> Value | None:
    """For a binary `node` with one operand the constant `value`: the other operand."""
    a, b = node.inputs[0], node.inputs[1]
    if _is_const(b, value, rtol):
        return a
    if commutes and _is_const(a, value, rtol):
        return b
    return None


def _only_reader(graph: Graph, users, v: Value, op: str) -> Node | None:
    """The one node reading `v` when it is an `op` node and `v` is no graph output."""
    readers = users.get(v, [])
    if len(readers) != 1 or readers[0].op != op or any(o is v for o in graph.outputs):
        return None
    return readers[0]


def _private(graph: Graph, users, nodes: list[Node], root: Node) -> bool:
    """Whether every value the matched `nodes` compute, but `root`'s, is read only by them
    and is no graph output."""
    inside = {id(n) for n in nodes}
    outputs = {id(v) for v in graph.outputs}
    for n in nodes:
        if n is root:
            continue
        for out in n.outputs:
            if id(out) in outputs or any(id(u) not in inside for u in users.get(out, [])):
                return False
    return True


def _rewrite(graph: Graph, users, matched: list[Node], root: Node, op: str,
             inputs: list, attrs: dict, name: str | None = None) -> bool:
    """Replace the `matched` nodes by one `op` node writing `root`'s outputs, placed where
    the last of them was. Nothing changes (False) when a value inside the match is read
    elsewhere or inference gives the new node other output types."""
    matched = list({id(n): n for n in matched}.values())
    if not _private(graph, users, matched, root):
        return False
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    if any(id(n) not in position for n in matched):
        return False
    name = name or root.name
    try:
        types, _, full = infer_node(op, inputs, attrs, len(root.outputs), name)
    except DNNCError:
        return False
    if any(t != out.type for t, out in zip(types, root.outputs)):
        return False
    last = max(position[id(n)] for n in matched)
    new = Node(op, inputs, root.outputs, full, name)
    drop = {id(n) for n in matched}
    graph.nodes = [new if k == last else n for k, n in enumerate(graph.nodes)
                   if k == last or id(n) not in drop]
    return True


def _forward(graph: Graph, node: Node, src: Value) -> bool:
    """Remove `node`, its one output read as `src` instead."""
    out = node.outputs[0]
    if any(v is out for v in graph.outputs) and (
            any(v is src for v in graph.inputs) or src.const is not None or
            any(v is src for v in graph.outputs)):
        return False   # an output that is an input (or another output) stays a node: one copy
    graph.replace_all_uses(out, src)
    graph.nodes.remove(node)
    return True


def _const_value(name: str, array: np.ndarray, dtype) -> Value:
    return Value(name, TensorType(dtype, array.shape), const=array)


# -- folding into the op before --------------------------------------------------------------


def _bn_statistics(node: Node) -> list | None:
    """An inference BatchNormalization's constant (scale, bias, mean, var), or None when it
    is another op, trains, or its statistics are not constants."""
    if node.op != "BatchNormalization" or node.attrs.get("training_mode") or \
            len(node.outputs) != 1:
        return None
    params = [known_constant(v) for v in node.inputs[1:5]]
    return None if any(p is None for p in params) else params


def _bn_scale_shift(node: Node):
    """Inference BatchNormalization over constant statistics as y = x*s + t (float64), or
    None when it trains or its statistics are not constants."""
    params = _bn_statistics(node)
    if params is None:
        return None
    scale, bias, mean, var = (np.asarray(p, np.float64) for p in params)
    s = scale / np.sqrt(var + node.attrs["epsilon"])
    return s, bias - mean * s


def _fold_affine_into_conv(graph: Graph, users, conv: Node, node: Node, scale, shift,
                           weights_name: str) -> bool:
    """Conv(x, W, B) -> `node` computing y*scale + shift per output channel (float64 arrays;
    scale None: 1) == Conv(x, W*scale, B*scale + shift), written to `node`'s outputs: the
    rewrite of every rule that folds an affine map into the conv before it."""
    w = known_constant(conv.inputs[1])
    b = known_constant(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None \
        else np.zeros(w.shape[0] if w is not None else 0, np.float32)
    if w is None or b is None or w.dtype not in FOLDABLE:
        return False
    dtype = conv.inputs[1].type.dtype
    new_b = b.astype(np.float64) * (1.0 if scale is None else scale) + shift
    if scale is None:
        wv = conv.inputs[1]
    else:
        new_w = (w.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.ndim - 1))
                 ).astype(w.dtype)
        wv = _const_value(weights_name, new_w, dtype)
    bv = _const_value(f"{node.name}.bias", new_b.astype(w.dtype), dtype)
    return _rewrite(graph, users, [conv, node], node, "Conv", [conv.inputs[0], wv, bv],
                    conv.attrs, conv.name)


def fold_batch_norm_into_conv(graph: Graph, node: Node, users) -> bool:
    """Conv(x, W, B) -> BatchNormalization(scale, bias, mean, var) == Conv(x, W*s, (B-mean)*s
    + bias) with s = scale / sqrt(var + eps), for inference BN over constant statistics."""
    if node.op != "BatchNormalization":
        return False
    conv = _producer(node.inputs[0], "Conv")
    affine = _bn_scale_shift(node)
    if conv is None or affine is None:
        return False
    s, t = affine
    return _fold_affine_into_conv(graph, users, conv, node, s, t,
                                  f"{conv.inputs[1].name}.bn")


def fold_batch_norm_into_dense(graph: Graph, node: Node, users) -> bool:
    """Gemm(A, B, C; alpha, beta) -> BatchNormalization over the channel axis 1 of the 2-D
    (N, C) product == Gemm(A, B*s, (beta*C - mean)*s + bias; alpha, beta=1) with s = scale /
    sqrt(var + eps), B scaled per output column; a 2-D MatMul(A, B) is Gemm with alpha=beta=1
    and no C. B, C and the statistics must be constants."""
    if node.op != "BatchNormalization":
        return False
    y = node.inputs[0]
    dense = _producer(y, "Gemm", "MatMul")
    affine = _bn_scale_shift(node)
    if dense is None or affine is None or y.type.rank != 2 or \
            any(v.type.rank != 2 for v in dense.inputs[:2]):
        return False
    w = known_constant(dense.inputs[1])
    if w is None or w.dtype not in FOLDABLE:
        return False
    attrs = dict(dense.attrs) if dense.op == "Gemm" else {}
    c = dense.inputs[2] if len(dense.inputs) > 2 else None
    c_value = known_constant(c) if c is not None else np.zeros((), np.float32)
    if c_value is None:
        return False
    s, t = affine
    column = s.reshape(-1, 1) if attrs.get("transB") else s.reshape(1, -1)
    new_w = (w.astype(np.float64) * column).astype(w.dtype)
    new_c = (np.asarray(c_value, np.float64) * attrs.get("beta", 1.0) * s + t).astype(w.dtype)
    attrs["beta"] = 1.0
    dtype = dense.inputs[1].type.dtype
    wv = _const_value(f"{dense.inputs[1].name}.bn", new_w, dtype)
    cv = _const_value(f"{node.name}.bias", new_c, dtype)
    return _rewrite(graph, users, [dense, node], node, "Gemm", [dense.inputs[0], wv, cv],
                    attrs, dense.name)


def _per_channel(v: Value, out: Value) -> np.ndarray | None:
    """The constant `v`, read against `out` (N, C, spatial...), as C per-channel values
    (float64): None unless it is a known float32 constant whose broadcast to `out`'s shape
    varies only along axis 1."""
    c = known_constant(v)
    rank, channels = out.type.rank, out.type.shape[1] if out.type.rank > 1 else None
    if c is None or c.dtype != np.float32 or c.ndim > rank or not isinstance(channels, int):
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for k, d in enumerate(shape) if k != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(np.asarray(c, np.float64).reshape(-1), (channels,))


def fold_scale_into_conv(graph: Graph, node: Node, users) -> bool:
    """Conv(x, W, B) * s == Conv(x, W*s, B*s) and Conv(x, W, B) + t == Conv(x, W, B + t)
    (also s * Conv, t + Conv, Conv - t) for constants s and t that vary only along the output
    channels (shape (C, 1, 1), (1, C, 1, 1) or a scalar): a BatchNormalization that an
    exporter wrote as Mul and Add (caffe2's SpatialBN in the onnx light models), folded as
    onnxruntime does; a per-channel epilogue costs the conv kernel 15% (3x3 64->192 at
    56x56)."""
    if node.op not in ("Mul", "Add", "Sub") or len(node.inputs) != 2:
        return False
    for k in ((0, 1) if node.op != "Sub" else (0,)):
        conv = _producer(node.inputs[k], "Conv")
        if conv is None or node.outputs[0].type != node.inputs[k].type:
            continue
        factor = _per_channel(node.inputs[1 - k], node.inputs[k])
        if factor is None:
            continue
        scale, shift = (factor, 0.0) if node.op == "Mul" else \
            (None, factor if node.op == "Add" else -factor)
        if _fold_affine_into_conv(graph, users, conv, node, scale, shift,
                                  f"{conv.inputs[1].name}.{node.name}"):
            return True
    return False


def batch_norm_as_affine(graph: Graph, node: Node, users) -> bool:
    """Inference BatchNormalization over constant statistics, of a float32 x, that no rule
    above folded into the op before == Sub(x, mean), Mul(1 / sqrt(var + epsilon)), Mul(scale),
    Add(bias), per-channel constants: elementwise ops that fuse with their neighbours, where
    the opaque op was a kernel of its own. They compute what the op's own kernel computes,
    in its order and float32 roundings (its reciprocal as the kernel makes it), so results
    are the same bits, overflow near FLT_MAX included (the spec's order: fuzz's
    huge-in-batchnorm). The onnx light densenet121's pre-activation BatchNormalization before
    each layer's 1x1 conv (then a Mul, Add and Relu) was a pass over the concatenated
    activations each: 124 elementwise kernels, 3.4 ms of 9.0 at 16 threads on the AMX Xeon,
    against OpenVINO's 0.8 ms for the same 62 nodes."""
    params = _bn_statistics(node)
    x = node.inputs[0]
    if params is None or x.type.dtype is not float32 or x.type.rank < 2 or \
            not isinstance(x.type.shape[1], int):
        return False
    scale, bias, mean, var = (np.asarray(p, np.float32) for p in params)
    with np.errstate(all="ignore"):
        inv_std = np.float32(1.0) / np.sqrt(var + np.float32(node.attrs["epsilon"]))
    shape = (x.type.shape[1],) + (1,) * (x.type.rank - 2)
    steps = [("Sub", "mean", mean), ("Mul", "inv_std", inv_std), ("Mul", "scale", scale),
             ("Add", "bias", bias)]
    nodes, value = [], x
    for k, (op, what, array) in enumerate(steps):
        const = _const_value(f"{node.name}.{what}", np.broadcast_to(array, shape[:1])
                             .reshape(shape).copy(), float32)
        out = node.outputs[0] if k == len(steps) - 1 else \
            Value(f"{node.name}.{what}_applied", x.type)
        types, _, attrs = infer_node(op, [value, const], {}, 1, f"{node.name}.{what}")
        if types[0] != out.type:
            return False
        nodes.append(Node(op, [value, const], [out], attrs,
                          node.name if k == len(steps) - 1 else f"{node.name}.{what}"))
        value = out
    k = next(i for i, n in enumerate(graph.nodes) if n is node)
    graph.nodes[k:k + 1] = nodes
    return True


# -- values passed through unchanged -----------------------------------------------------------


def remove_identity(graph: Graph, node: Node, users) -> bool:
    """Identity(x) == x."""
    if node.op == "Identity":
        return _forward(graph, node, node.inputs[0])
    return False


def remove_inference_dropout(graph: Graph, node: Node, users) -> bool:
    """Dropout(x) in inference (no training_mode, or a constant False) == (x, mask) with the
    mask all true over x's shape (ONNX: "if training_mode is false ... the mask, if
    requested, is all ones"): the output is x, and a mask something reads becomes
    ConstantOfShape(shape of x, true); an unread mask simply goes."""
    if node.op != "Dropout" or _dropout_trains(node):
        return False
    x, y = node.inputs[0], node.outputs[0]
    outputs = {id(v) for v in graph.outputs}
    replacement = []
    if len(node.outputs) > 1:
        mask = node.outputs[1]
        if users.get(mask) or id(mask) in outputs:
            replacement = _all_true(x, mask, node.name)
    if id(y) in outputs and (any(v is x for v in graph.inputs) or x.const is not None or
                             id(x) in outputs):
        # an output that is an input (or another output) stays a node: one copy
        replacement.append(Node("Identity", [x], [y], {}, node.name))
    else:
        graph.replace_all_uses(y, x)
    k = next(i for i, n in enumerate(graph.nodes) if n is node)
    graph.nodes[k:k + 1] = replacement
    return True


def _all_true(x: Value, mask: Value, name: str) -> list[Node]:
    """Nodes writing `mask` as a bool tensor of x's shape, every element true: a
    ConstantOfShape of x's static shape, or of Shape(x) when it has symbols."""
    nodes = []
    if x.type.is_static:
        shape = _const_value(f"{name}.mask_shape", np.array(x.type.shape, np.int64), int64)
    else:
        shape = Value(f"{name}.mask_shape", TensorType(int64, (x.type.rank,)))
        _, known, attrs = infer_node("Shape", [x], {}, 1, f"{name}.shape")
        shape.known = known[0]   # x's dims, symbols included: the mask's type follows them
        nodes.append(Node("Shape", [x], [shape], attrs, f"{name}.shape"))
    _, _, attrs = infer_node("ConstantOfShape", [shape], {"value": np.ones(1, np.bool_)},
                                 1, f"{name}.mask")
    return nodes + [Node("ConstantOfShape", [shape], [mask], attrs, f"{name}.mask")]


def _dropout_trains(node: Node) -> bool:
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    mode = known_constant(node.inputs[2])
    return mode is None or bool(np.asarray(mode).reshape(-1)[0])


_NEUTRAL = {"Add": ((0, 0.0), (1, 0.0)), "Mul": ((0, 1.0), (1, 1.0)),
            "Sub": ((0, 0.0),), "Div": ((0, 1.0),)}
"""op -> (position of x, the constant the other operand must be), for x (op) c == x."""


def remove_neutral_elements(graph: Graph, node: Node, users) -> bool:
    """x*1 == 1*x == x+0 == 0+x == x-0 == x/1 == x, when the constant is all ones / zeros and
    broadcasting leaves x's type as it is (x+0 turns -0.0 into +0.0, as every compiler's
    algebraic simplifier does)."""
    cases = _NEUTRAL.get(node.op)
    if cases is None or len(node.inputs) != 2:
        return False
    for k, value in cases:
        x, c = node.inputs[k], node.inputs[1 - k]
        if x is not None and node.outputs[0].type == x.type and \
                _is_const(c, value, rtol=0):
            return _forward(graph, node, x)
    return False


def remove_same_type_cast(graph: Graph, node: Node, users) -> bool:
    """Cast(x, to=dtype of x) == x."""
    if node.op == "Cast" and node.attrs["to"] is node.inputs[0].type.dtype:
        return _forward(graph, node, node.inputs[0])
    return False


# -- chains merged ------------------------------------------------------------------------------


def _perm(node: Node) -> list[int]:
    perm = node.attrs.get("perm")
    rank = node.inputs[0].type.rank
    return list(range(rank))[::-1] if perm is None else list(perm)


def merge_transposes(graph: Graph, node: Node, users) -> bool:
    """Transpose(Transpose(x, p), q) == Transpose(x, [p[i] for i in q]) (output axis i of
    the outer one is input axis q[i] of it, which is axis p[q[i]] of x); a Transpose by the
    identity permutation == x."""
    if node.op != "Transpose":
        return False
    q = _perm(node)
    if q == list(range(len(q))):
        return _forward(graph, node, node.inputs[0])
    inner = _producer(node.inputs[0], "Transpose")
    if inner is None:
        return False
    p = _perm(inner)
    return _rewrite(graph, users, [inner, node], node, "Transpose", [inner.inputs[0]],
                    {"perm": [p[i] for i in q]})


_RESHAPES = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")
"""Ops that only change a tensor's shape, its elements kept in row-major order."""


def merge_reshapes(graph: Graph, node: Node, users) -> bool:
    """reshape(reshape(x, s1), s2) == Reshape(x, s2) for reshape-likes (Reshape, Squeeze,
    Unsqueeze, Flatten: the row-major element order is kept) with a static final shape, which
    is written out as a constant; a reshape-like to x's own static shape == x."""
    if node.op not in _RESHAPES:
        return False
    x, out = node.inputs[0], node.outputs[0]
    if not out.type.is_static:
        return False
    if x.type.is_static and x.type.shape == out.type.shape:
        return _forward(graph, node, x)
    inner = _producer(x, *_RESHAPES)
    if inner is None or not inner.inputs[0].type.is_static:
        return False
    shape = np.array(out.type.shape, np.int64)
    sv = _const_value(f"{node.name}.shape", shape, int64)
    return _rewrite(graph, users, [inner, node], node, "Reshape", [inner.inputs[0], sv],
                    {"allowzero": int(0 in out.type.shape)})


def constant_reshape_shape(graph: Graph, node: Node, users) -> bool:
    """Reshape(x, s) with s computed at run time (an exporter's Shape -> Gather -> Concat of
    the batch size) == Reshape(x, c) for the constant c that inference already resolved s
    to: each static output dim itself, a symbolic one equal to x's dim at its place 0 (copy
    it; allowzero=0), at most one other symbolic dim -1. The shape's chain goes dead, and the
    Reshape fuses as a static one would (into a product's epilogue)."""
    if node.op != "Reshape" or known_constant(node.inputs[1]) is not None or \
            node.attrs.get("allowzero", 0):
        return False
    x, out = node.inputs[0], node.outputs[0]
    shape, inferred = [], 0
    for k, d in enumerate(out.type.shape):
        if isinstance(d, (int, np.integer)):
            shape.append(int(d))
        elif k < x.type.rank and x.type.shape[k] == d:
            shape.append(0)
        else:
            shape.append(-1)
            inferred += 1
    if inferred > 1 or (0 in out.type.shape and 0 in shape):
        return False
    sv = _const_value(f"{node.name}.shape", np.array(shape, np.int64), int64)
    return _rewrite(graph, users, [node], node, "Reshape", [x, sv], {"allowzero": 0})


# -- subgraphs recognised as one op ------------------------------------------------------------


def _mul_factor_sets(root: Node):
    """The factor lists a Mul tree of depth at most two at `root` reads, each with the inner
    Mul nodes it looks through: an input made by a Mul is taken both whole and split."""
    options = []
    for v in root.inputs:
        inner = _producer(v, "Mul")
        choices = [([v], [])]
        if inner is not None:
            choices.append((list(inner.inputs), [inner]))
        options.append(choices)
    for left, lnodes in options[0]:
        for right, rnodes in options[1]:
            yield left + right, lnodes + rnodes


def _erf_argument(v: Value):
    """x when v = x / sqrt(2) or x * (1/sqrt(2)), with the nodes matched."""
    div = _producer(v, "Div")
    if div is not None and _is_const(div.inputs[1], math.sqrt(2.0)):
        return div.inputs[0], [div]
    mul = _producer(v, "Mul")
    if mul is not None:
        x = _const_and_other(mul, 1 / math.sqrt(2.0))
        if x is not None:
            return x, [mul]
    return None


def _cube_of(v: Value):
    """x when v = x**3, x*(x*x) or (x*x)*x, with the nodes matched."""
    power = _producer(v, "Pow")
    if power is not None and _is_const(power.inputs[1], 3.0, rtol=0):
        return power.inputs[0], [power]
    outer = _producer(v, "Mul")
    if outer is None:
        return None
    for k in (0, 1):
        x, sq = outer.inputs[k], _producer(outer.inputs[1 - k], "Mul")
        if sq is not None and sq.inputs[0] is x and sq.inputs[1] is x:
            return x, [outer, sq]
    return None


def _tanh_argument(v: Value):
    """x when v = sqrt(2/pi) * (x + 0.044715 * x**3) (factors in either order), with the
    nodes matched."""
    scale = _producer(v, "Mul")
    inner = _const_and_other(scale, math.sqrt(2 / math.pi)) if scale is not None else None
    add = _producer(inner, "Add")
    if add is None:
        return None
    for k in (0, 1):
        x, term = add.inputs[k], _producer(add.inputs[1 - k], "Mul")
        cubed = _const_and_other(term, 0.044715) if term is not None else None
        cube = _cube_of(cubed) if cubed is not None else None
        if cube is not None and cube[0] is x:
            return x, [scale, add, term] + cube[1]
    return None


_GELU_FORMS = (("Erf", "none", _erf_argument), ("Tanh", "tanh", _tanh_argument))
"""(the function inside, Gelu's approximate, how its argument is made from x)."""


def recognize_gelu(graph: Graph, node: Node, users) -> bool:
    """x * 0.5 * (1 + erf(x / sqrt(2))) == Gelu(x) and x * 0.5 * (1 + tanh(sqrt(2/pi) *
    (x + 0.044715 x^3))) == Gelu(x, approximate="tanh"), the three factors multiplied in any
    order and grouping (PyTorch exports (x * (1 + erf(x / 1.4142))) * 0.5)."""
    if node.op != "Mul":
        return False
    for factors, muls in _mul_factor_sets(node):
        if len(factors) != 3:
            continue
        for half in range(3):
            if not _is_const(factors[half], 0.5):
                continue
            rest = factors[:half] + factors[half + 1:]
            for x, one_plus in (rest, rest[::-1]):
                add = _producer(one_plus, "Add")
                f_of = _const_and_other(add, 1.0) if add is not None else None
                for fn, approximate, argument in _GELU_FORMS:
                    f = _producer(f_of, fn)
                    arg = argument(f.inputs[0]) if f is not None else None
                    if arg is None or arg[0] is not x:
                        continue
                    matched = [node, add, f] + muls + arg[1]
                    if any(out.type != x.type for n in matched for out in n.outputs):
                        continue
                    if _rewrite(graph, users, matched, node, "Gelu", [x],
                                {"approximate": approximate}):
                        return True
    return False


def _trailing_axes(reduce: Node, rank: int) -> int | None:
    """The first axis when `reduce` keeps its dims and reduces the trailing axes [k, rank)."""
    axes = known_constant(reduce.inputs[1]) if len(reduce.inputs) > 1 else None
    if axes is None or not reduce.attrs.get("keepdims", 1) or axes.size == 0:
        return None
    axes = sorted(int(a) % rank for a in np.asarray(axes).reshape(-1))
    return axes[0] if axes == list(range(axes[0], rank)) else None


def recognize_layer_norm(graph: Graph, node: Node, users) -> bool:
    """d / sqrt(ReduceMean(d^2) + eps) with d = x - ReduceMean(x), both means over the same
    trailing axes [k, rank) == LayerNormalization(x, axis=k, epsilon=eps) (d^2 as Pow(d, 2) or
    d*d); a following * gamma and + beta become its scale and bias (no gamma: scale 1)."""
    if node.op != "Div":
        return False
    d, std = node.inputs
    sub, sqrt = _producer(d, "Sub"), _producer(std, "Sqrt")
    add_eps = _producer(sqrt.inputs[0], "Add") if sqrt is not None else None
    if sub is None or add_eps is None:
        return False
    x, mean = sub.inputs
    mean_node = _producer(mean, "ReduceMean")
    if mean_node is None or mean_node.inputs[0] is not x or x.type.dtype is not float32:
        return False
    for k in (0, 1):
        var, eps = add_eps.inputs[k], known_constant(add_eps.inputs[1 - k])
        var_node = _producer(var, "ReduceMean")
        if var_node is not None and eps is not None and eps.size == 1:
            break
    else:
        return False
    square = _producer(var_node.inputs[0], "Pow", "Mul")
    if square is None or square.inputs[0] is not d or not (
            square.inputs[1] is d if square.op == "Mul" else _is_const(square.inputs[1], 2.0,
                                                                        rtol=0)):
        return False
    axis = _trailing_axes(mean_node, x.type.rank)
    if axis is None or _trailing_axes(var_node, x.type.rank) != axis:
        return False
    matched = [mean_node, sub, square, var_node, add_eps, sqrt, node]
    if any(out.type != x.type for out in (d, square.outputs[0], node.outputs[0])):
        return False
    root, scale, bias = node, None, None
    mul = _only_reader(graph, users, node.outputs[0], "Mul")
    if mul is not None and mul.outputs[0].type == x.type:
        root, scale = mul, mul.inputs[1] if mul.inputs[0] is node.outputs[0] else mul.inputs[0]
        matched.append(mul)
        add = _only_reader(graph, users, mul.outputs[0], "Add")
        if add is not None and add.outputs[0].type == x.type:
            root, bias = add, add.inputs[1] if add.inputs[0] is mul.outputs[0] else add.inputs[0]
            matched.append(add)
    if scale is None:
        scale = _const_value(f"{node.name}.scale", np.ones(1, np.float32), float32)
    inputs = [x, scale] + ([bias] if bias is not None else [])
    return _rewrite(graph, users, matched, root, "LayerNormalization", inputs,
                    {"axis": axis, "epsilon": float(np.asarray(eps).reshape(-1)[0])})


def recognize_softmax(graph: Graph, node: Node, users) -> bool:
    """e / ReduceSum(e, [a]) with e = Exp(x - ReduceMax(x, [a])), both keeping dims ==
    Softmax(x, axis=a) (the same max-shifted computation, one op)."""
    if node.op != "Div":
        return False
    e, total = node.inputs
    exp, sum_node = _producer(e, "Exp"), _producer(total, "ReduceSum")
    sub = _producer(exp.inputs[0], "Sub") if exp is not None else None
    if sub is None or sum_node is None or sum_node.inputs[0] is not e:
        return False
    x, top = sub.inputs
    max_node = _producer(top, "ReduceMax")
    if max_node is None or max_node.inputs[0] is not x or not x.type.dtype.is_float:
        return False
    rank = x.type.rank
    axes = [known_constant(n.inputs[1]) if len(n.inputs) > 1 else None
            for n in (max_node, sum_node)]
    if any(a is None or a.size != 1 for a in axes) or \
            not (max_node.attrs["keepdims"] and sum_node.attrs["keepdims"]):
        return False
    axis = int(np.asarray(axes[0]).reshape(-1)[0]) % max(rank, 1)
    if int(np.asarray(axes[1]).reshape(-1)[0]) % max(rank, 1) != axis or \
            any(v.type != x.type for v in (sub.outputs[0], e, node.outputs[0])):
        return False
    return _rewrite(graph, users, [max_node, sub, exp, sum_node, node], node, "Softmax", [x],
                    {"axis": axis})


# -- one dense op with its bias -----------------------------------------------------------------


def fuse_matmul_bias(graph: Graph, node: Node, users) -> bool:
    """MatMul(A, B) + C == Gemm(A, B, C) for 2-D A and B and a constant C that broadcasts to
    the (M, N) product without growing it (C + MatMul(A, B) too: Add commutes)."""
    if node.op != "Add":
        return False
    for k in (0, 1):
        product, bias = node.inputs[k], node.inputs[1 - k]
        matmul = _producer(product, "MatMul")
        if matmul is None or bias.const is None or bias.type.rank > 2 or \
                any(v.type.rank != 2 for v in matmul.inputs) or \
                node.outputs[0].type != product.type:
            continue
        if _rewrite(graph, users, [matmul, node], node, "Gemm",
                    [matmul.inputs[0], matmul.inputs[1], bias], {}, matmul.name):
            return True
    return False


RULES = [fold_batch_norm_into_conv, fold_batch_norm_into_dense, fold_scale_into_conv,
         batch_norm_as_affine, remove_identity, remove_inference_dropout, remove_neutral_elements,
         remove_same_type_cast, merge_transposes, merge_reshapes, constant_reshape_shape,
         recognize_gelu, recognize_layer_norm, recognize_softmax, fuse_matmul_bias]
"""The rewrites `simplify` applies, in order."""


def simplify(graph: Graph, rules=RULES) -> int:
    """Apply `rules` until none fires; returns how many rewrites happened."""
    count = 0
    changed = True
    while changed:
        changed = False
        users = graph.users()
        alive = {id(n) for n in graph.nodes}
        for node in list(graph.nodes):
            if id(node) not in alive:
                continue
            for rule in rules:
                if rule(graph, node, users):
                    count += 1
                    changed = True
                    users = graph.users()
                    alive = {id(n) for n in graph.nodes}
                    break
    return count
