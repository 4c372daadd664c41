"""Knob spaces of schedule templates, and the template record the template tables hold.

A template turns a problem (`backends/problems.py`) and a config into a scheduled PrimFunc.
It declares its knob space per problem and machine: the finite list of values each knob may
take and the constraints between knobs, each a predicate with a sentence saying what must
hold. The template honours every config of its space; its default config is a function of
the problem and the machine beside the space, and lies in it. The autotuner sees only
spaces, configs and PrimFuncs, never a template's internals.

A config is a frozen dataclass, one type per template, whose fields are the knobs (JSON-able
through `dataclasses.asdict`). `Space.check` refuses a config outside the space with a
`ConfigError` naming the template, the knob and its allowed values, or the constraint.

`machine` is anything with `vector_bits` and `threads` (a `Target`). This module must never
import a backend.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..errors import CompileError, ConfigError
from ..ir.ops.registry import get_op


@dataclass(frozen=True)
class Knob:
    """A knob and the values it may take, in the order a tuner walks them."""

    name: str
    values: tuple


@dataclass(frozen=True)
class Constraint:
    """What must hold between knobs: `holds(config)`, described in words for the error."""

    description: str
    holds: Callable[[Any], bool]


class Space:
    """The valid configs of one template on one problem: the product of its knobs' values,
    less the configs that break a constraint."""

    def __init__(self, template: str, config_type: type, knobs: Mapping[str, Sequence],
                 constraints: Sequence[Constraint] = ()):
        fields = dataclasses.fields(config_type)
        names = [f.name for f in fields]
        # a field the space leaves out is a knob fixed at its default (a knob added to a
        # config type that several templates share, before the others search it)
        fixed = {f.name: (f.default,) for f in fields
                 if f.name not in knobs and f.default is not dataclasses.MISSING}
        if sorted(names) != sorted({**knobs, **fixed}):
            raise ValueError(f"{template}: knobs {sorted(knobs)} are not the fields of "
                             f"{config_type.__name__} {sorted(names)} (those with defaults "
                             f"may be left out)")
        knobs = {**knobs, **fixed}
        self.template = template
        self.config_type = config_type
        self.knobs = tuple(Knob(name, tuple(knobs[name])) for name in names)
        self.constraints = tuple(constraints)
        for knob in self.knobs:
            if not knob.values:
                raise ValueError(f"{template}: knob {knob.name} has no values")

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k.name} in {list(k.values)}" for k in self.knobs)
        rules = "".join(f"; {c.description}" for c in self.constraints)
        return f"<Space {self.template}: {knobs}{rules}>"

    @property
    def product_size(self) -> int:
        """Configs before the constraints (an upper bound of `len(list(configs()))`)."""
        return math.prod(len(k.values) for k in self.knobs)

    def _config(self, values: Sequence) -> Any:
        return self.config_type(**{k.name: v for k, v in zip(self.knobs, values)})

    def _valid(self, config) -> bool:
        return all(c.holds(config) for c in self.constraints)

    def configs(self) -> Iterator[Any]:
        """Every valid config, knob by knob in declaration order (the last varies fastest)."""
        for values in itertools.product(*(k.values for k in self.knobs)):
            config = self._config(values)
            if self._valid(config):
                yield config

    def sample(self, rng, n: int) -> list:
        """Up to `n` distinct valid configs drawn uniformly with `rng` (a NumPy Generator):
        all of them, in a random order, when the space holds at most `n`."""
        if self.product_size <= 1 << 16:
            valid = list(self.configs())
            picks = rng.permutation(len(valid))[:n]
            return [valid[int(i)] for i in picks]
        # too many to list: draw points of the product until n valid distinct ones (a space
        # whose constraints reject nearly everything may give fewer)
        found: dict = {}
        for _ in range(1000 * n):
            if len(found) == n:
                break
            values = [k.values[int(rng.integers(len(k.values)))] for k in self.knobs]
            config = self._config(values)
            if config not in found and self._valid(config):
                found[config] = None
        return list(found)

    def check(self, config) -> Any:
        """`config` (a config of this template, or a mapping knob -> value) as this template's
        config type, when it lies in the space; else ConfigError saying why. A mapping may
        leave out a knob whose field in the config type has a default (a tuning record
        written before the knob was added: the default is what it measured)."""
        if isinstance(config, Mapping):
            unknown = sorted(set(config) - {k.name for k in self.knobs})
            defaulted = {f.name for f in dataclasses.fields(self.config_type)
                         if f.default is not dataclasses.MISSING} \
                if dataclasses.is_dataclass(self.config_type) else set()
            missing = [k.name for k in self.knobs if k.name not in config and
                       k.name not in defaulted]
            if unknown or missing:
                raise ConfigError(
                    f"template {self.template!r}: config {dict(config)} "
                    + (f"has no knob(s) {', '.join(unknown)}" if unknown else "")
                    + ("; " if unknown and missing else "")
                    + (f"misses knob(s) {', '.join(missing)}" if missing else "")
                    + f"; its knobs are {', '.join(k.name for k in self.knobs)}")
            config = self.config_type(**config)
        elif not isinstance(config, self.config_type):
            raise ConfigError(f"template {self.template!r} takes a "
                              f"{self.config_type.__name__}, not {type(config).__name__} "
                              f"({config!r})")
        for knob in self.knobs:
            value = getattr(config, knob.name)
            # by type too: True is not the knob value 1, nor 1.0 the value 1
            if not any(type(v) is type(value) and v == value for v in knob.values):
                raise ConfigError(f"template {self.template!r}: knob {knob.name}={value!r} is "
                                  f"not one of its allowed values "
                                  f"{', '.join(repr(v) for v in knob.values)}")
        for constraint in self.constraints:
            if not constraint.holds(config):
                raise ConfigError(f"template {self.template!r}: config {config} breaks the "
                                  f"constraint: {constraint.description}")
        return config


@dataclass(frozen=True)
class Template:
    """A schedule template as a template table holds it.

    `problem(kernel)` describes a lowered kernel as the problem kind the template reads (None
    when the kernel is not of that kind); `applies(problem)` says whether this template serves
    that problem; `space`, `default` and `build` take the problem and a machine.
    `precisions` are the machine precisions (`Target.precision`) it serves: None, every one
    (fp32 arithmetic is always allowed); a tensor-core template names the reduced ones.
    `features`: the CPU features (`Target.feature_set`) its code needs; a machine lacking
    one skips it (AMX tiles)."""

    name: str
    problem: Callable[[Any], Any]
    applies: Callable[[Any], bool]
    space: Callable[[Any, Any], Space]
    default: Callable[[Any, Any], Any]
    build: Callable[[Any, Any, Any], Any]
    precisions: tuple[str, ...] | None = None
    features: frozenset[str] = frozenset()


def choose_template(kernel, templates: Mapping, target: str,
                    machine=None) -> tuple[Template, Any]:
    """The template of a template table (`{(target, anchor pattern): templates in order}`)
    that schedules `kernel` on `target`: the first that serves `machine`'s precision (fp32
    when None) on its CPU features, whose problem kind describes the kernel and that applies
    to it; and the kernel's problem as that template reads it (each problem kind is
    described once)."""
    precision = getattr(machine, "precision", "fp32")
    described: dict = {}
    for template in templates[(target, get_op(kernel.anchor.op).pattern)]:
        if template.precisions is not None and precision not in template.precisions:
            continue
        if template.features and not template.features <= getattr(machine, "feature_set",
                                                                  frozenset()):
            continue
        if template.problem not in described:
            described[template.problem] = template.problem(kernel)
        problem = described[template.problem]
        if problem is not None and template.applies(problem):
            return template, problem
    raise CompileError(f"kernel {kernel.name}: no {target} template applies")
