"""The CUDA renderer's index arithmetic, before and after legalize: every buffer access made
one row-major offset simplified with the loop bounds in scope (`linearize`), then index
arithmetic narrowed to 32 bits where interval bounds prove it fits (`narrow_indices`).

`codegen.render_func` runs both; this module only rewrites loop IR (never renders text) and
holds the renderer's error, `CudaCodegenError`.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import loop as L
from ...ir import types as T


class CudaCodegenError(Exception):
    """A PrimFunc the CUDA renderer cannot render (a compiler bug in a schedule)."""


def linearize(func: L.PrimFunc) -> L.PrimFunc:
    """`func` with every buffer access a single row-major offset, simplified with the bounds
    of the loop and let variables in scope: a schedule's fused index (`i // 100 * 100 +
    i % 100`) folds back to `i` before legalize turns its divisions into calls."""
    flat: dict[str, L.Buffer] = {}

    def buffer(b: L.Buffer) -> L.Buffer:
        if b.name not in flat:
            shape = L.static_shape(b.shape)
            if shape is None:
                raise CudaCodegenError(f"{func.name}: buffer {b.name} has a symbolic shape")
            flat[b.name] = L.Buffer(b.name, b.dtype, (max(1, math.prod(shape)),), b.scope)
        return flat[b.name]

    def offset(b: L.Buffer, indices, env) -> tuple:
        out: L.Expr = L.const(0)
        stride: L.Expr = L.const(1)
        for idx, dim in reversed(list(zip(indices, b.shape))):
            out = out + idx * stride
            stride = stride * dim
        return (L.simplify_expr(out, env),)

    def expr(e: L.Expr, env) -> L.Expr:
        def rule(n):
            if isinstance(n, L.Load):   # (bottom-up: its indices are done, once)
                return L.Load(buffer(n.buffer), offset(n.buffer, n.indices, env))
            return None
        return L.transform(e, rule)

    def stmt(s: L.Stmt, env) -> L.Stmt:
        if isinstance(s, L.For):
            inner = {**env, s.var: L.Bounds(0, s.extent.value - 1)} \
                if isinstance(s.extent, L.Const) else env
            return L.For(s.var, s.extent, stmt(s.body, inner), s.kind)
        if isinstance(s, L.Let):
            value = expr(s.value, env)
            return L.Let(s.var, value, stmt(s.body, {**env, s.var: L.bounds(s.value, env)}))
        if isinstance(s, L.Store):
            return L.Store(buffer(s.buffer), offset(s.buffer, s.indices, env),
                           expr(s.value, env))
        if isinstance(s, L.Allocate):
            return L.Allocate(buffer(s.buffer), stmt(s.body, env))
        if isinstance(s, L.If):
            return L.If(expr(s.cond, env), stmt(s.then, env),
                        None if s.orelse is None else stmt(s.orelse, env))
        if isinstance(s, L.Seq):
            return L.Seq(tuple(stmt(x, env) for x in s.stmts))
        if isinstance(s, L.Mma):
            return L.Mma(s.precision, buffer(s.acc), offset(s.acc, (s.offset,), env)[0],
                         tuple(expr(x, env) for x in s.a), tuple(expr(x, env) for x in s.b))
        if isinstance(s, (L.LdMatrix, L.CopyAsync, L.Wgmma, L.WgmmaWait, L.Mbarrier,
                          L.TmaLoad)):
            return L.map_exprs(s, lambda e: expr(e, env))
        return s

    params = tuple(buffer(b) for b in func.params)
    return L.PrimFunc(func.name, params, stmt(func.body, {}), func.size_vars, func.attrs)


_U32_MAX = (1 << 32) - 1
_I32 = (-(1 << 31), (1 << 31) - 1)


def narrow_indices(func: L.PrimFunc) -> L.PrimFunc:
    """`func` (legalized) with index arithmetic in 32 bits where interval bounds from the
    loops prove every intermediate value fits: the IR's index type is int64, and a GPU does
    64-bit integer arithmetic in several 32-bit instructions (a division by a constant far
    more: there is no 64-bit multiply-high). An unsigned 64-bit `idiv` / `irem` whose
    operands lie in [0, 2**32) becomes a 32-bit one; a buffer offset whose every
    subexpression lies in the int32 range is computed in int32, and so is a comparison of
    two such index values (a copy's bounds check: a cp.async gather compared 64-bit rows
    and taps, two instructions a compare)."""
    def rewrite(e: L.Expr, env) -> L.Expr:
        def rule(n):
            if isinstance(n, L.Call) and n.name in ("idiv", "irem") and n.dtype is T.uint64:
                a, b = (_range(x, env) for x in n.args)
                if a and b and a[0] >= 0 and b[0] > 0 and a[1] <= _U32_MAX and \
                        b[1] <= _U32_MAX:
                    narrow = tuple(L.Cast(T.uint32, x) for x in n.args)
                    return L.Cast(T.uint64, L.Call(n.name, narrow, T.uint32))
            if isinstance(n, L.Load):
                return L.Load(n.buffer, tuple(offset(i, env) for i in n.indices))
            if isinstance(n, L.BinOp) and n.op in L.COMPARE and n.a.dtype is L.INDEX:
                a, b = _int32(n.a, env), _int32(n.b, env)   # (a bounds check: 1 ISETP)
                if a is not None and b is not None:
                    return L.BinOp(n.op, a, b)
            return None
        return L.transform(e, rule)

    def offset(e: L.Expr, env) -> L.Expr:
        narrow = _int32(e, env) if e.dtype is L.INDEX else None
        return e if narrow is None or isinstance(e, L.Const) else L.Cast(L.INDEX, narrow)

    def stmt(s: L.Stmt, env) -> L.Stmt:
        if isinstance(s, L.For):
            inner = {**env, s.var: (0, s.extent.value - 1)} \
                if isinstance(s.extent, L.Const) else env
            return L.For(s.var, s.extent, stmt(s.body, inner), s.kind)
        if isinstance(s, L.Let):
            value = rewrite(s.value, env)
            return L.Let(s.var, value, stmt(s.body, {**env, s.var: _range(s.value, env)}))
        if isinstance(s, L.Store):
            return L.Store(s.buffer, tuple(offset(rewrite(i, env), env) for i in s.indices),
                           rewrite(s.value, env))
        if isinstance(s, L.Allocate):
            return L.Allocate(s.buffer, stmt(s.body, env))
        if isinstance(s, L.If):
            return L.If(rewrite(s.cond, env), stmt(s.then, env),
                        None if s.orelse is None else stmt(s.orelse, env))
        if isinstance(s, L.Seq):
            return L.Seq(tuple(stmt(x, env) for x in s.stmts))
        if isinstance(s, L.Mma):
            return L.Mma(s.precision, s.acc, offset(rewrite(s.offset, env), env),
                         tuple(rewrite(x, env) for x in s.a),
                         tuple(rewrite(x, env) for x in s.b))
        if isinstance(s, (L.LdMatrix, L.CopyAsync, L.Wgmma, L.WgmmaWait, L.Mbarrier,
                          L.TmaLoad)):
            return L.map_exprs(s, lambda e: rewrite(e, env))
        return s

    return L.PrimFunc(func.name, func.params, stmt(func.body, {}), func.size_vars, func.attrs)


def _int32(e: L.Expr, env) -> L.Expr | None:
    """`e` (an integer) computed in int32, when it and every subexpression provably lie in
    int32's range; else None."""
    r = _range(e, env)
    if r is None or r[0] < _I32[0] or r[1] > _I32[1]:
        return None
    if isinstance(e, L.Const):
        return L.Const(int(e.value), T.int32)
    if isinstance(e, L.BinOp) and e.op in _INTERVAL:
        a, b = _int32(e.a, env), _int32(e.b, env)
        return None if a is None or b is None else L.BinOp(e.op, a, b)
    return e if e.dtype is T.int32 else L.Cast(T.int32, e)   # a value in range: exact


def _range(e: L.Expr, env) -> tuple[int, int] | None:
    """Integer bounds (lo, hi) of `e` from the loop and let variables' in `env`; None when
    unknown (a load, a float, an op not followed here)."""
    if not e.dtype.is_int:
        return None
    if isinstance(e, L.Const) and e.dtype.is_int:
        return int(e.value), int(e.value)
    if isinstance(e, L.Var):
        return env.get(e)
    if isinstance(e, L.Cast) and e.dtype.is_int and e.value.dtype.is_int:
        inner = _range(e.value, env)
        info = np.iinfo(e.dtype.np)
        return inner if inner and info.min <= inner[0] and inner[1] <= info.max else None
    if isinstance(e, L.BinOp) and e.dtype.is_int and e.op in _INTERVAL:
        a, b = _range(e.a, env), _range(e.b, env)
        if a is None or b is None:
            return None
        lo, hi = _INTERVAL[e.op](a, b)
        info = np.iinfo(e.dtype.np)
        return (lo, hi) if info.min <= lo and hi <= info.max else None   # (no wrapping)
    if isinstance(e, L.Call) and e.name in ("idiv", "irem") and e.dtype.kind == "u":
        a, b = (_range(x, env) for x in e.args)
        if a is None or b is None or b[0] <= 0 or a[0] < 0:
            return None
        return (a[0] // b[1], a[1] // b[0]) if e.name == "idiv" else (0, min(a[1], b[1] - 1))
    if isinstance(e, L.Select):
        a, b = _range(e.true, env), _range(e.false, env)
        return (min(a[0], b[0]), max(a[1], b[1])) if a and b else None
    return None


def _corners(f):
    def bounds(a, b):
        values = [f(x, y) for x in a for y in b]
        return min(values), max(values)
    return bounds


def _bits(a, b):
    """Bounds of a bitwise op of non-negative operands: below the next power of two above
    both (negative ones: no bounds)."""
    if a[0] < 0 or b[0] < 0:
        return -(1 << 64), 1 << 64
    return 0, (1 << max(a[1], b[1]).bit_length()) - 1


_INTERVAL = {
    "^": _bits, "|": _bits,   # (the tensor-core tiles' swizzle)
    "+": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "-": lambda a, b: (a[0] - b[1], a[1] - b[0]),
    "*": _corners(lambda x, y: x * y),
    "min": lambda a, b: (min(a[0], b[0]), min(a[1], b[1])),
    "max": lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
}
"""BinOp -> the bounds of its result from its operands' (interval arithmetic)."""
