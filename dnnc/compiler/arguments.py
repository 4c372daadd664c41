"""Checks of the user API's arguments where they enter (`dnnc.compile`, `dnnc.jit`,
`CompiledModel` methods): each raises `ArgumentError` naming the argument, what it must be and
what was given, so nothing is accepted and then ignored or misused further down.

The CLI parses its options into these same arguments, so `dnnc compile --opt-level` and
`dnnc.compile(opt_level=)` obey one rule. This module only checks; it never converts a value
into another meaning.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

from ..backends.registry import REGISTRY
from ..errors import ArgumentError


def check_int(name: str, value, low: int, high: int | None = None, *,
              optional: bool = False) -> None:
    """`value` is an int (not a bool) in [low, high], or None when `optional`."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ArgumentError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    if value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ArgumentError(f"{name} must be {bounds}, not {value}")


def check_tolerance(name: str, value) -> None:
    """`value` is a finite real number >= 0."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
            or value < 0:
        raise ArgumentError(f"{name} must be a finite number >= 0, not {value!r}")


def check_choice(name: str, value, choices) -> None:
    """`value` is one of `choices` (strings)."""
    if not isinstance(value, str) or value not in choices:
        raise ArgumentError(f"{name} must be one of {', '.join(choices)}, not {value!r}")


def check_optional_bool(name: str, value) -> None:
    if value is not None and not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True, False or None, not {value!r}")


def check_path(name: str, value) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentError(f"{name} must be a path (str or os.PathLike), not "
                            f"{type(value).__name__}")


def check_optional_path(name: str, value) -> None:
    if value is not None:
        check_path(name, value)


def check_returns(target: str, name: str, kind) -> None:
    """`kind` (the `outputs` compile option, a call's `to=`) is an array kind `target`'s calls
    can return (its registry entry's `returns`), else an `ArgumentError` naming `name`."""
    kinds = REGISTRY[target].returns
    if not isinstance(kind, str):
        raise ArgumentError(f"{name} must be one of {', '.join(kinds)} (the arrays the "
                            f"{target} target returns), not a {type(kind).__name__}")
    if kind in kinds:
        return
    if kind in {k for s in REGISTRY.values() for k in s.returns}:
        able = [n for n, s in REGISTRY.items() if kind in s.returns]
        raise ArgumentError(f"{name}={kind!r}: the {target} target returns "
                            f"{' or '.join(kinds)} arrays; {kind} arrays come from the "
                            f"{', '.join(able)} target")
    raise ArgumentError(f"{name} must be one of {', '.join(kinds)} (the arrays the {target} "
                        f"target returns), not {kind!r}")
