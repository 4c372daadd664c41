"""Generic traversal of operator-IR nodes: children, walk, bottom-up transform, substitution,
free variables and structural equality up to bound-variable names.

Everything here is generic over node fields (dataclass introspection), so a new node kind needs
no change here. It must never know what a node means (no simplification, no checking).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Callable, Iterator

from .nodes import Expr, For, IterVar, Let, Stmt, Var


_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(node) -> tuple[str, ...]:
    """The names of `node`'s dataclass fields, in order: `dataclasses.fields` once per class
    (it builds its tuple anew at each call, and a traversal asks for every node: 5% of the
    node suite's time went there)."""
    cls = type(node)
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def children(node) -> Iterator:
    """The IR nodes directly inside `node` (Exprs, Stmts, Buffers, IterVars)."""
    for name in field_names(node):
        value = getattr(node, name)
        if isinstance(value, (Expr, Stmt, IterVar)):
            yield value
        elif isinstance(value, tuple):
            for item in value:
                if isinstance(item, (Expr, Stmt, IterVar)):
                    yield item


def walk(node) -> Iterator:
    """Every node under `node`, pre-order, `node` included."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(children(n))))


def transform(node, fn: Callable):
    """Rebuild `node` bottom-up: children first, then `fn(rebuilt)`; `fn` returns a
    replacement or None to keep the node."""
    changes = {}
    for name in field_names(node):
        value = getattr(node, name)
        if isinstance(value, (Expr, Stmt, IterVar)):
            new = transform(value, fn)
            if new is not value:
                changes[name] = new
        elif isinstance(value, tuple) and any(isinstance(v, (Expr, Stmt, IterVar))
                                              for v in value):
            new = tuple(transform(v, fn) if isinstance(v, (Expr, Stmt, IterVar)) else v
                        for v in value)
            if any(a is not b for a, b in zip(new, value)):
                changes[name] = new
    if changes:
        node = _replace(node, changes)
    out = fn(node)
    return node if out is None else out


def _replace(node, changes: dict):
    values = {name: getattr(node, name) for name in field_names(node)}
    values.update(changes)
    return type(node)(**values)


def map_exprs(node, fn: Callable):
    """`node` rebuilt with `fn(e)` for each expression directly in its fields (and in tuples
    of them); statements inside it are left as they are (a leaf statement's expressions)."""
    changes = {}
    for name in field_names(node):
        value = getattr(node, name)
        if isinstance(value, Expr):
            changes[name] = fn(value)
        elif isinstance(value, tuple) and value and all(isinstance(v, Expr) for v in value):
            changes[name] = tuple(fn(v) for v in value)
    return _replace(node, changes) if changes else node


def substitute(node, mapping: dict):
    """Replace Vars (by Var) with Exprs."""
    if not mapping:
        return node
    return transform(node, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def free_vars(node) -> set[Var]:
    """Vars read in `node` that it does not bind itself."""
    bound: set[Var] = set()
    used: set[Var] = set()
    for n in walk(node):
        if isinstance(n, (For, Let)):
            bound.add(n.var)
        elif isinstance(n, IterVar):
            bound.add(n.var)
        elif isinstance(n, Var):
            used.add(n)
    return used - bound


def structural_equal(a, b) -> bool:
    """Equality up to the names of bound loop and let variables."""
    return alpha_normal(a) == alpha_normal(b)


def alpha_normal(node):
    """`node` with its bound loop and let variables renamed in binding order (`_v0`, ...)."""
    counter = iter(range(1 << 30))
    renames: dict[Var, Var] = {}
    binders = [n for n in walk(node) if isinstance(n, (For, Let, IterVar))]
    for b in binders:
        if b.var not in renames:
            renames[b.var] = Var(f"_v{next(counter)}", b.var.dtype)
    return substitute(node, renames)
