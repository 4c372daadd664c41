"""FLOP estimates of ops: the `Count` polynomial they are written in, the helpers the op
families register their rules with (`register_op(..., flops=rule)`), and `node_flops`, which
reads a node's rule from the registry.

An estimate counts a multiply-add as 2 and data movement (reshape, transpose, gather, ...) as
0: each op family states its rule beside the op (conv.py: 2 x output x reduction size; pool.py:
one per window element; norm.py: a few per element; ...). An op without a rule of its own is
estimated from its fusion pattern: elementwise and broadcast ops one per output element,
injective ops 0, reductions one per input element; other patterns have no estimate. Symbolic
dims stay symbolic: a total is a polynomial in them (`7.3 G*N`). `dnnc inspect` prints these
estimates; a cost model may read them. This module never looks at a target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .graph import Node


class Count:
    """A polynomial with integer coefficients in symbolic dims: {sorted names: coefficient}."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict[tuple[str, ...], int] | None = None):
        self.terms = {k: v for k, v in (terms or {}).items() if v}

    @staticmethod
    def of(dims) -> "Count":
        """The product of some dims (ints, names, or canonical monomials like "2*N*S")."""
        coef, names = 1, []
        for d in dims:
            if isinstance(d, str) and not d.startswith("("):
                for part in d.split("*"):
                    if part.lstrip("-").isdigit():
                        coef *= int(part)
                    else:
                        names.append(part)
            elif isinstance(d, str):  # an opaque expression such as "(N+1)": one factor
                names.append(d)
            else:
                coef *= int(d)
        return Count({tuple(sorted(names)): coef})

    def __add__(self, other: "Count") -> "Count":
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + v
        return Count(terms)

    def __mul__(self, other: "Count | int") -> "Count":
        if isinstance(other, int):
            return Count({k: v * other for k, v in self.terms.items()})
        terms: dict[tuple[str, ...], int] = {}
        for ka, va in self.terms.items():
            for kb, vb in other.terms.items():
                key = tuple(sorted(ka + kb))
                terms[key] = terms.get(key, 0) + va * vb
        return Count(terms)

    __rmul__ = __mul__

    def __eq__(self, other) -> bool:
        if isinstance(other, int):
            other = Count({(): other})
        return isinstance(other, Count) and self.terms == other.terms

    @property
    def value(self) -> int | None:
        """The count as an int when no symbolic dim is left, else None."""
        if all(not k for k in self.terms):
            return self.terms.get((), 0)
        return None

    def format(self, unit=lambda n: str(n)) -> str:
        if not self.terms:
            return unit(0)
        parts = []
        for names, coef in sorted(self.terms.items(), key=lambda kv: (-len(kv[0]), kv[0])):
            parts.append(unit(coef) if not names else f"{unit(coef)}*{'*'.join(names)}")
        return " + ".join(parts)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"Count({self})"


FlopRule = Callable[["Node"], Count]
"""A node -> its estimated FLOPs; a rule may raise KeyError, IndexError, TypeError or
ValueError for a form it does not know (then the node has no estimate)."""


def numel(value) -> Count:
    """The elements of a Value, symbolic dims included."""
    return Count.of(value.shape)


def per_output(n: int) -> FlopRule:
    """`n` FLOPs per element of the first output."""
    return lambda node: n * numel(node.outputs[0])


def per_input(n: int) -> FlopRule:
    """`n` FLOPs per element of the first input."""
    return lambda node: n * numel(node.inputs[0])


def has_input(node: "Node", index: int) -> bool:
    return len(node.inputs) > index and node.inputs[index] is not None


def node_flops(node: "Node") -> Count | None:
    """Estimated FLOPs of one node: its op's rule, else its pattern's (module docstring);
    None when the op has no estimate."""
    from .ops.registry import Pattern, get_op

    op = get_op(node.op)
    if op.flops is not None:
        try:
            return op.flops(node)
        except (KeyError, IndexError, TypeError, ValueError):
            return None  # an attribute or input form the rule does not know: no estimate
    if op.pattern in (Pattern.ELEMWISE, Pattern.BROADCAST):
        return sum((numel(o) for o in node.outputs), Count())
    if op.pattern == Pattern.INJECTIVE:
        return Count()
    if op.pattern == Pattern.REDUCE:
        return numel(node.inputs[0])
    return None
