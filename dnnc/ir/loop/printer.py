"""The operator IR's text form: `print_expr`, `print_stmt`, `print_func` (what `str(func)` shows).

The text is stable and diffable: tests and `dnnc inspect` compare it, so change it on purpose
only. It must never be parsed back or used as a key (compare with `structural_equal`).
"""

from __future__ import annotations

from .nodes import (
    INDEX, MMA_SHAPES, Allocate, AsyncCommit, AsyncWait, Barrier, BinOp, Call, Cast,
    ClusterBarrier, Const,
    CopyAsync, Expr, For, ForKind, If, LdMatrix, Let, Load, Mbarrier, Mma, Prefetch, PrimFunc,
    ProxyFence, Reduce, Select, Seq, Stmt, Store, TileProduct, TmaLoad, Var, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait)


_PRECEDENCE = {"or": 1, "and": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
               "|": 4, "^": 5, "&": 6, "<<": 7, ">>": 7, "+": 8, "-": 8, "*": 9, "/": 9,
               "//": 9, "%": 9}


def print_expr(e: Expr, parent: int = 0) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        if e.dtype is INDEX or e.dtype.kind == "b":
            return repr(e.value)
        return f"{e.dtype.name}({e.value!r})"
    if isinstance(e, BinOp):
        if e.op in ("min", "max"):
            return f"{e.op}({print_expr(e.a)}, {print_expr(e.b)})"
        p = _PRECEDENCE[e.op]
        text = f"{print_expr(e.a, p)} {e.op} {print_expr(e.b, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, Call):
        return f"{e.name}({', '.join(print_expr(a) for a in e.args)})"
    if isinstance(e, Cast):
        return f"{e.dtype.name}({print_expr(e.value)})"
    if isinstance(e, Select):
        return (f"select({print_expr(e.cond)}, {print_expr(e.true)}, "
                f"{print_expr(e.false)})")
    if isinstance(e, Load):
        return f"{e.buffer.name}[{', '.join(print_expr(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(f"{a.var.name} < {print_expr(a.extent)}" for a in e.axes)
        where = "" if e.condition is None else f" if {print_expr(e.condition)}"
        return f"{e.combiner}({print_expr(e.source)} for {axes}{where})"
    raise TypeError(f"not an expression: {e!r}")


def print_stmt(s: Stmt, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(s, For):
        kind = "" if s.kind is ForKind.SERIAL else f"  # {s.kind.value}"
        return (f"{pad}for {s.var.name} in range({print_expr(s.extent)}):{kind}\n"
                + print_stmt(s.body, indent + 1))
    if isinstance(s, Store):
        idx = ", ".join(print_expr(i) for i in s.indices)
        return f"{pad}{s.buffer.name}[{idx}] = {print_expr(s.value)}\n"
    if isinstance(s, Let):
        return f"{pad}{s.var.name} = {print_expr(s.value)}\n" + print_stmt(s.body, indent)
    if isinstance(s, If):
        text = f"{pad}if {print_expr(s.cond)}:\n" + print_stmt(s.then, indent + 1)
        if s.orelse is not None:
            text += f"{pad}else:\n" + print_stmt(s.orelse, indent + 1)
        return text
    if isinstance(s, Allocate):
        b = s.buffer
        dims = ", ".join(print_expr(d) for d in b.shape)
        return (f"{pad}{b.name} = alloc({b.dtype.name}[{dims}], scope={b.scope.value})\n"
                + print_stmt(s.body, indent))
    if isinstance(s, Seq):
        return "".join(print_stmt(x, indent) for x in s.stmts)
    if isinstance(s, Barrier):
        return f"{pad}barrier()\n"
    if isinstance(s, Mma):
        m, n, k = MMA_SHAPES[s.precision]
        a = ", ".join(print_expr(x) for x in s.a)
        b = ", ".join(print_expr(x) for x in s.b)
        return (f"{pad}mma_m{m}n{n}k{k}_{s.precision}({s.acc.name}[{print_expr(s.offset)}:+4], "
                f"a=({a}), b=({b}))\n")
    if isinstance(s, LdMatrix):
        return (f"{pad}ldmatrix_x{s.count}{'_trans' if s.trans else ''}({print_expr(s.dst)}, "
                f"{print_expr(s.src)})\n")
    if isinstance(s, CopyAsync):
        return (f"{pad}cp_async({print_expr(s.dst)}, {print_expr(s.src)}, "
                f"{print_expr(s.src_bytes)})\n")
    if isinstance(s, AsyncCommit):
        return f"{pad}cp_async_commit()\n"
    if isinstance(s, Prefetch):
        return f"{pad}prefetch({print_expr(s.at)})\n"
    if isinstance(s, AsyncWait):
        return f"{pad}cp_async_wait({s.pending})\n"
    if isinstance(s, Wgmma):
        a, b = (f"{print_expr(x)} {'mn' if mn else 'k'}-major {offsets}" for x, mn, offsets in
                ((s.a, s.a_mn_major, s.a_offsets), (s.b, s.b_mn_major, s.b_offsets)))
        meta = "" if s.meta is None else f", meta={print_expr(s.meta)}"
        return (f"{pad}wgmma_m64n{s.n}_{s.precision}({print_expr(s.acc)}, a={a}, b={b}"
                f"{meta})\n")
    if isinstance(s, WgmmaFence):
        return f"{pad}wgmma_fence()\n"
    if isinstance(s, WgmmaCommit):
        return f"{pad}wgmma_commit()\n"
    if isinstance(s, WgmmaWait):
        return f"{pad}wgmma_wait({s.pending}, {print_expr(s.acc)}:+{s.count})\n"
    if isinstance(s, ProxyFence):
        return f"{pad}fence_proxy_async()\n"
    if isinstance(s, ClusterBarrier):
        return f"{pad}cluster_barrier({s.size})\n"
    if isinstance(s, Mbarrier):
        value = "" if s.value is None else f", {print_expr(s.value)}"
        return f"{pad}mbarrier_{s.op}({print_expr(s.bar)}{value})\n"
    if isinstance(s, TmaLoad):
        m = s.map
        im2col = f" im2col {list(m.im2col)}" if m.im2col else ""
        offsets = f" + [{', '.join(print_expr(c) for c in s.offsets)}]" if s.offsets else ""
        return (f"{pad}tma_load({print_expr(s.dst)}, {m.tensor.name}{list(m.extents)} strides "
                f"{list(m.strides)} box {list(m.box)}{im2col} at "
                f"[{', '.join(print_expr(c) for c in s.coords)}]{offsets}, "
                f"{print_expr(s.bar)})\n")
    if isinstance(s, TileProduct):
        op = "+=" if s.accumulate else "="
        return (f"{pad}tile_product_{s.precision}_{s.m_tiles}x{s.n_tiles}("
                f"{print_expr(s.c)} rows {s.c_row} {op} a={print_expr(s.a)} {s.a_layout}, "
                f"b={print_expr(s.b)} {s.b_layout}, steps={s.steps}"
                f"{f', tail={s.tail}' if s.tail else ''}"
                f"{'' if s.runs == ((0, 0),) else f', runs={list(s.runs)}'})\n")
    raise TypeError(f"not a statement: {s!r}")


def print_func(f: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {b.dtype.name}[{', '.join(print_expr(d) for d in b.shape)}]"
                       for b in f.params)
    sizes = f" sizes({', '.join(v.name for v in f.size_vars)})" if f.size_vars else ""
    return f"def {f.name}({params}){sizes}:\n" + print_stmt(f.body, 1)
