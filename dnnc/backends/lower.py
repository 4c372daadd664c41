"""Lowering: a group of graph nodes becomes one PrimFunc.

Each node's compute rule (from the op registry) builds tensor expressions over the group's
inputs; stages without reductions are inlined into their consumers, stages with reductions
are materialised (into the output buffer, or a scratch buffer); every `Reduce` becomes an
accumulator and a loop nest. Without fusion a group is one node; `fuse_ops` forms larger
groups and they go through this same path.

The PrimFunc takes the group's inputs then its outputs as buffer parameters (in that order,
named after the graph values, sanitised and kept unique: `a.b` and `a_b` are two buffers)
and any symbolic sizes as `size_vars`. Loops come out serial and
in the natural order; a target's schedule then decides what runs in parallel or vectorised.
This module must never import a backend's renderer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CompileError
from ..ir import loop as L
from ..ir import types as T
from ..ir.compute import NoCompute, Tensor, apply_rule, dim_expr, placeholder, stages
from ..ir.graph import Node, Value
from ..ir.ops.registry import get_op, known_constant

__all__ = ["Kernel", "NoCompute", "lower_group"]


@dataclass
class Kernel:
    """A lowered group: `func`'s params are `inputs` then `outputs` (graph values)."""

    name: str
    func: L.PrimFunc
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    names: dict[int, str]   # id(value) -> its buffer's name, for inputs and outputs
    # the template that scheduled it and its config, once scheduled (profiles show them)
    schedule: tuple[str, object] | None = None
    sites: list[int] | None = None   # the nodes' positions in their segment (lower_group's)

    @property
    def anchor(self) -> Node:
        """The group's most complex node (what its schedule template is chosen by)."""
        return max(self.nodes, key=lambda n: get_op(n.op).pattern)

    def __getstate__(self) -> dict:
        """Pickled (a tuning worker's kernel, a cluster task): `names` by position, since the
        unpickled values have other ids."""
        state = dict(self.__dict__)
        state["names"] = [self.names[id(v)] for v in self.inputs + self.outputs]
        return state

    def __setstate__(self, state: dict) -> None:
        values = state["inputs"] + state["outputs"]
        state = dict(state, names={id(v): n for v, n in zip(values, state["names"])})
        self.__dict__.update(state)


def lower_group(nodes: list[Node], name: str, outputs: list[Value] | None = None,
                sizes: dict[str, int] | None = None, sites: list[int] | None = None,
                in_place: frozenset[int] = frozenset()) -> Kernel:
    """Lower `nodes` (in topological order) into one PrimFunc named `name`.

    `outputs` are the group's values needed outside it (default: every node output).
    `sites` are the nodes' positions in their segment: gathers check their indices at run
    time naming them (`loop.index_checks`); without sites nothing is checked.
    `in_place`: ids of outputs the runtime binds to the input array they update
    (`plan.in_place_outputs`); a lone node whose op has an `updates` rule then stores only
    the elements it changes (the rest are already in that array).
    Raises NoCompute when a node has no loop form (it then runs as a host fallback).
    """
    produced = {id(v) for n in nodes for v in n.outputs}
    found: dict[int, Value] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None and id(v) not in produced:
                found.setdefault(id(v), v)
    inputs = list(found.values())
    outputs = list(outputs if outputs is not None else [v for n in nodes for v in n.outputs])
    names = _buffer_names(inputs + outputs)
    tensors: dict[int, Tensor] = {
        id(v): placeholder(names[id(v)], v.type.dtype, v.type.shape, value=known_constant(v))
        for v in inputs}
    wheres: dict[int, object] = {}   # id(output tensor) -> where its elements are stored
    for n, site in zip(nodes, sites or [None] * len(nodes)):
        op = get_op(n.op)
        if op.compute is None:
            raise NoCompute(f"{n.op} has no compute rule")
        args = [None if v is None else tensors[id(v)] for v in n.inputs]
        try:
            with L.index_checks.checking(site):
                outs = None
                if len(nodes) == 1 and op.updates is not None and id(n.outputs[0]) in in_place:
                    outs = _updates(op, n, args, wheres, site)
                if outs is None:
                    outs = apply_rule(n.op, args, n.attrs, [v.type for v in n.outputs])
        except NoCompute:
            raise
        except Exception as exc:  # a rule that fails is a compiler bug; name the node
            raise CompileError(f"{n.op} node {n.name!r}: its compute rule failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        for v, t in zip(n.outputs, outs):
            tensors[id(v)] = t
    out_tensors = []
    for v in outputs:
        t = tensors[id(v)]
        if t.body is None or any(t is o for o in out_tensors):
            t = _copy(t)  # an output that is an input, or repeated: stored by a copy stage
        out_tensors.append(t)
    params = [_param(tensors[id(v)], v) for v in inputs] + \
        [L.Buffer(names[id(v)], v.type.dtype, tuple(t.shape) if id(t) not in wheres else
                  tuple(dim_expr(d) for d in v.type.shape))   # (an update: the whole array)
         for v, t in zip(outputs, out_tensors)]
    body = _Lowering(inputs, tensors, sizes or {}, taken=set(names.values())).lower(
        out_tensors, params[len(inputs):], wheres)
    size_vars = _size_vars(params, body)
    func = L.PrimFunc(name, tuple(params), body, tuple(size_vars))
    func = L.simplify(func)
    return Kernel(name, func, inputs, outputs, nodes, names, sites=sites)


def _updates(op, n: Node, args: list, wheres: dict, site) -> list | None:
    """The node's changed elements only (its op's `updates` rule), their positions recorded
    in `wheres`; None where that rule has no loop form for this node (an IndexCopy of a
    run-time length): the compute rule then writes the whole array, which is as safe in
    place, since an in-place op reads its updated input only at each element's own index."""
    try:
        values, where = op.updates(args, [v.type for v in n.outputs], **n.attrs)
    except NoCompute:
        return None
    wheres[id(values)] = _checking(where, site)
    return [values]


def _checking(where, site):
    """`where` checking the indices it reads at run time as its node's site."""
    def checked(*index):
        with L.index_checks.checking(site):
            return where(*index)
    return checked


def _copy(t: Tensor) -> Tensor:
    from ..ir.compute import compute
    return compute(t.shape, lambda *i: t[i], name=f"{t.name}_copy")


def _buffer_names(values: list[Value]) -> dict[int, str]:
    """id(value) -> a buffer name: `v_` and the value's name with every character but
    letters and digits made `_`, then `_2`, `_3`, ... where an earlier value took that name
    (ONNX names may differ only in such characters: `x:0` and `x/0`). A value listed twice
    (an output that is also an input) keeps one name."""
    names: dict[int, str] = {}
    taken: set[str] = set()
    for v in values:
        if id(v) in names:
            continue
        base = "v_" + "".join(c if c.isascii() and c.isalnum() else "_" for c in v.name)
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        names[id(v)] = name
        taken.add(name)
    return names


def _param(t: Tensor, v: Value) -> L.Buffer:
    return L.Buffer(t.name, t.dtype, tuple(t.shape))


def _size_vars(params, body) -> list[L.Var]:
    found: dict[str, L.Var] = {}
    for b in params:
        for d in b.shape:
            for var in L.free_vars(d):
                found.setdefault(var.name, var)
    for var in L.free_vars(body):
        found.setdefault(var.name, var)
    return sorted(found.values(), key=lambda v: v.name)


_ACC_DTYPE = {"float16": T.float32, "bfloat16": T.float32}


def _init_value(combiner: str, dtype: T.DType) -> L.Expr:
    if combiner in ("sum", "or"):
        return L.const(0 if dtype.kind != "b" else False, dtype)
    if combiner in ("prod", "and"):
        return L.const(1 if dtype.kind != "b" else True, dtype)
    if dtype.is_float:
        return L.const(-np.inf if combiner == "max" else np.inf, dtype)
    if dtype.kind == "b":
        return L.const(combiner == "min", dtype)
    info = np.iinfo(dtype.np)
    return L.const(int(info.min if combiner == "max" else info.max), dtype)


def _combine(combiner: str, acc: L.Expr, x: L.Expr) -> L.Expr:
    if combiner == "sum":
        return acc + x
    if combiner == "prod":
        return acc * x
    if combiner == "and":
        return L.BinOp("and", acc, x)
    if combiner == "or":
        return L.BinOp("or", acc, x)
    # NaN-propagating max/min for floats (as NumPy); plain for integers
    return L.BinOp(combiner, acc, x)


class _Lowering:
    def __init__(self, inputs: list[Value], tensors: dict[int, Tensor], sizes: dict,
                 taken: set[str] = frozenset()):
        self.sizes = sizes
        self.taken = taken   # the parameters' names, which scratch buffers must not take
        self.materialized: dict[int, L.Buffer] = {}
        self.scratch: list[L.Buffer] = []
        self.counter = 0
        self.constants = {id(t): t for t in tensors.values() if t.body is None and
                          t.value is not None and np.asarray(t.value).size == 1}

    def fresh(self, hint: str) -> str:
        self.counter += 1
        while f"{hint}{self.counter}" in self.taken:
            self.counter += 1
        return f"{hint}{self.counter}"

    def lower(self, outputs: list[Tensor], out_buffers: list[L.Buffer],
              wheres: dict | None = None) -> L.Stmt:
        """`wheres`: id(output) -> `where(*i)` -> (the buffer index its element i is stored
        at, the store's condition or None), for an output that updates its buffer."""
        wheres = wheres or {}
        order = stages(outputs)
        out_index = {id(t): b for t, b in zip(outputs, out_buffers)}
        stored: list[tuple[Tensor, L.Buffer]] = []
        for t in order:
            if t.body is None:
                continue
            if id(t) in out_index:
                buf = out_index[id(t)]
            elif _has_reduce(t.body):
                buf = L.Buffer(self.fresh(f"{t.name}_"), t.dtype, tuple(t.shape))
                self.scratch.append(buf)
            else:
                continue  # inlined into its consumers
            self.materialized[id(t)] = buf
            stored.append((t, buf))
        # an output that is also read by a later stage is read back from its buffer
        body = L.seq(*(self.stage(t, buf, wheres.get(id(t))) for t, buf in stored))
        for buf in reversed(self.scratch):
            body = L.Allocate(buf, body)
        return body

    def stage(self, t: Tensor, buf: L.Buffer, where=None) -> L.Stmt:
        axes = [L.Var(self.fresh("i")) for _ in t.axes]
        expr = L.substitute(self.inline(t.body), dict(zip(t.axes, axes)))
        allocs, value = self.lower_reduces(expr)
        index, cond = (tuple(axes), None) if where is None else where(*axes)
        store: L.Stmt = L.Store(buf, tuple(self.inline(L.const(i)) for i in index),
                                value if value.dtype is buf.dtype else L.Cast(buf.dtype, value))
        if cond is not None:
            store = L.If(self.inline(cond), store)
        return L.loop_nest(zip(axes, t.shape), _wrap(allocs, store))

    def inline(self, e: L.Expr) -> L.Expr:
        """Replace reads of tensors: materialised ones read their buffer, others are
        substituted by their expression; scalar constants become literals."""

        def rewrite(n):
            if not isinstance(n, L.Load) or not isinstance(n.buffer, Tensor):
                return None
            t = n.buffer
            if id(t) in self.constants:
                return L.const(np.asarray(t.value).reshape(()).item(), t.dtype)
            if t.body is None:
                return L.Load(t.as_buffer(), n.indices)
            if id(t) in self.materialized:
                return L.Load(self.materialized[id(t)], n.indices)
            body = self.inline(t.body)
            return L.substitute(body, dict(zip(t.axes, n.indices)))

        return L.transform(e, rewrite)

    def lower_reduces(self, e: L.Expr) -> tuple[list, L.Expr]:
        """Hoist every Reduce into an accumulator and its loop nest.

        Returns ([(accumulator, statement computing it)], the expression reading the
        accumulators). A Reduce nested in another's source is hoisted inside the outer one's
        loops, where it is evaluated.
        """
        allocs: list[tuple[L.Buffer, L.Stmt]] = []

        def visit(n):
            if isinstance(n, L.Reduce):
                return self.reduce(n, allocs)
            if isinstance(n, L.Expr):
                return _map_children(n, visit)
            return n

        return allocs, visit(e)

    def reduce(self, n: L.Reduce, allocs: list) -> L.Expr:
        acc_dtype = _ACC_DTYPE.get(n.dtype.name, n.dtype)
        acc = L.Buffer(self.fresh("acc"), acc_dtype, (L.const(1),), L.Scope.LOCAL)
        inner, src = self.lower_reduces(n.source)
        if src.dtype is not acc_dtype:
            src = L.Cast(acc_dtype, src)
        update: L.Stmt = L.Store(acc, (L.const(0),), _combine(n.combiner, acc[0], src))
        update = _wrap(inner, update)
        if n.condition is not None:
            cond_allocs, cond = self.lower_reduces(n.condition)
            update = _wrap(cond_allocs, L.If(cond, update))
        loops = L.loop_nest([(a.var, a.extent) for a in n.axes], update)
        init = L.Store(acc, (L.const(0),), _init_value(n.combiner, acc_dtype))
        allocs.append((acc, L.seq(init, loops)))
        value = acc[0]
        return value if acc_dtype is n.dtype else L.Cast(n.dtype, value)


def _wrap(allocs: list, stmt: L.Stmt) -> L.Stmt:
    """Each accumulator is allocated around its computation and every later use."""
    for acc, compute in reversed(allocs):
        stmt = L.Allocate(acc, L.seq(compute, stmt))
    return stmt


def _map_children(node, fn):
    """`node` rebuilt with `fn` applied to its direct Expr children (top-down traversal)."""
    changes = {}
    for name in L.field_names(node):
        value = getattr(node, name)
        if isinstance(value, L.Expr):
            new = fn(value)
            if new is not value:
                changes[name] = new
        elif isinstance(value, tuple) and any(isinstance(v, L.Expr) for v in value):
            new = tuple(fn(v) if isinstance(v, L.Expr) else v for v in value)
            if any(a is not b for a, b in zip(new, value)):
                changes[name] = new
    if not changes:
        return node
    values = {name: getattr(node, name) for name in L.field_names(node)}
    values.update(changes)
    return type(node)(**values)


def _has_reduce(e: L.Expr) -> bool:
    return any(isinstance(n, L.Reduce) for n in L.walk(e))



def epilogue(kernel: Kernel):
    """For a group of an anchor and the elementwise chain after it: `fn(value, index)` giving
    the value stored for the anchor's output element `value` at the anchor's `index`.
    Templates compute the anchor their own way and apply this where they store; a layout tail
    after the chain (see `store_index`) only moves where the value goes."""
    nodes = kernel.nodes[:1 + len(_elementwise_chain(kernel))]
    if len(nodes) == 1:
        return lambda value, index: value
    anchor_out = nodes[0].outputs[0]
    tensors: dict[int, Tensor] = {
        id(v): placeholder(kernel.names[id(v)], v.type.dtype, v.type.shape,
                           value=known_constant(v))
        for v in kernel.inputs}
    anchor = placeholder("anchor_value", anchor_out.type.dtype, anchor_out.type.shape)
    tensors[id(anchor_out)] = anchor
    for n in nodes[1:]:
        args = [None if v is None else tensors[id(v)] for v in n.inputs]
        outs = apply_rule(n.op, args, n.attrs, [v.type for v in n.outputs])
        tensors[id(n.outputs[0])] = outs[0]
    final = tensors[id(nodes[-1].outputs[0])]
    body = _Lowering(kernel.inputs, tensors, {}).inline(final.body)

    def apply(value: L.Expr, index) -> L.Expr:
        e = L.substitute(body, dict(zip(final.axes, index)))
        return L.transform(e, lambda n: value if isinstance(n, L.Load) and
                           n.buffer.name == "anchor_value" else None)

    return apply


def _elementwise_chain(kernel: Kernel) -> list[Node]:
    """The group's nodes after its anchor up to its layout tail (all of them without one)."""
    from ..ir.ops.registry import Pattern

    chain = []
    for n in kernel.nodes[1:]:
        if get_op(n.op).pattern not in (Pattern.ELEMWISE, Pattern.BROADCAST):
            break
        chain.append(n)
    return chain


def layout_tail(kernel: Kernel) -> list[Node]:
    """The layout ops (Reshape, Transpose) that end an anchor's group after its epilogue."""
    return kernel.nodes[1 + len(_elementwise_chain(kernel)):]


def store_index(kernel: Kernel):
    """`fn(index)`: where the group's output stores the element computed at the anchor's
    `index`, through the layout tail after its elementwise chain (the identity without one);
    None when some tail op has no known index map (the template does not apply then)."""
    maps = []
    for n in layout_tail(kernel):
        rule = STORE_REMAPS.get(n.op)
        shapes = [L.static_shape(n.inputs[0].type.shape), L.static_shape(n.outputs[0].type.shape)]
        if rule is None or None in shapes:
            return None
        maps.append((rule, n, *shapes))

    def apply(index):
        index = tuple(index)
        for rule, n, in_shape, out_shape in maps:
            index = rule(n, in_shape, out_shape, index)
        return index

    return apply


def _transpose_index(node: Node, in_shape, out_shape, index) -> tuple:
    perm = node.attrs.get("perm")
    perm = list(perm) if perm is not None else list(reversed(range(len(in_shape))))
    return tuple(index[p] for p in perm)


def _same_order_index(node: Node, in_shape, out_shape, index) -> tuple:
    """Reshape (and its special cases) keeps the row-major order: blocks of dims whose sizes
    multiply to the same extent map to each other; a block is raveled and unraveled alone,
    so (s, c) -> (s, c // 64, c % 64) rather than through one flat offset."""
    ins = [(k, d) for k, d in enumerate(in_shape) if d != 1]
    outs = [(k, d) for k, d in enumerate(out_shape) if d != 1]
    out: list[L.Expr] = [L.const(0)] * len(out_shape)
    i = j = 0
    while i < len(ins) or j < len(outs):
        block_in, block_out = [ins[i]], [outs[j]]
        size_in, size_out = ins[i][1], outs[j][1]
        i, j = i + 1, j + 1
        while size_in != size_out:
            if size_in < size_out:
                block_in.append(ins[i])
                size_in *= ins[i][1]
                i += 1
            else:
                block_out.append(outs[j])
                size_out *= outs[j][1]
                j += 1
        flat: L.Expr = L.const(0)
        for k, d in block_in:
            flat = flat * d + index[k]
        stride = size_out
        for n, (k, d) in enumerate(block_out):
            stride //= d
            e = flat if stride == 1 else flat // stride
            out[k] = e if n == 0 else e % d
    return tuple(L.simplify_expr(e) for e in out)


STORE_REMAPS = {"Transpose": _transpose_index, "Reshape": _same_order_index,
                "Squeeze": _same_order_index, "Unsqueeze": _same_order_index,
                "Flatten": _same_order_index, "Identity": _same_order_index}
"""Layout ops a template can store through: op -> fn(node, in shape, out shape, index in its
input) -> the index in its output that element moves to. (Each is a bijection of elements.)"""
