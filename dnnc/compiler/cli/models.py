"""The model a `dnnc` command works on: an ONNX file's graph, a CompiledModel compiled for
`--target` or loaded from an artifact, and random inputs for it.

The option mistakes found here are `UsageError`s named as the option the user gave. This
module never prints a result; it logs only what it is doing (importing, compiling, loading).
"""

from __future__ import annotations

import logging
import os

from ...errors import ArgumentError, ModelFormatError
from .exits import UsageError

log = logging.getLogger(__name__)


def check_model_file(path) -> None:
    """Refuse a model file that does not exist before saying "importing" it."""
    if not os.path.exists(path):
        raise ModelFormatError(f"model file {str(path)!r} does not exist")


def import_graph(path, shapes: dict):
    """The graph of an ONNX file, with `--input-shape`'s mistakes named as the option."""
    from ...frontend.onnx import import_onnx

    try:
        return import_onnx(path, input_shapes=shapes, as_option=True)
    except ArgumentError as exc:   # only --input-shape can be wrong here
        raise UsageError(str(exc)) from None


def model_for(args, shapes: dict | None = None, check=None):
    """A CompiledModel from an artifact (loaded) or an ONNX file (compiled for --target);
    `check(input_names, input_types)` vets options against the model before compiling."""
    from ..artifact import is_artifact, target_of
    from ..module import load
    from ..driver import compile
    from ...backends.registry import REGISTRY, default_target

    if is_artifact(args.model):
        if shapes:
            raise UsageError("--input-shape applies to ONNX models; an artifact's shapes are "
                             "fixed when it is compiled")
        REGISTRY[target_of(args.model)].require()   # no GPU: one line, before any progress
        log.info(f"loading {args.model}")
        model = load(args.model, progress=not args.quiet)
        if args.target and args.target != model.target:
            raise UsageError(f"{args.model} was compiled for target {model.target}, not "
                             f"{args.target}")
        if args.precision and args.precision != model.stats["precision"]:
            raise UsageError(f"--precision: {args.model} was compiled at precision "
                             f"{model.stats['precision']}, not {args.precision}")
        if check is not None:
            check(model.input_names, model.input_types)
        return model
    target = args.target or default_target()
    REGISTRY[target].require()
    graph = import_graph(args.model, shapes or {})
    if check is not None:
        check([v.name for v in graph.inputs], [v.type for v in graph.inputs])
    log.info(f"compiling {args.model} ({len(graph.nodes)} nodes) for {target}")
    # a profile times each kernel of a fresh compile: a cached one keeps no kernel list
    profile = getattr(args, "profile", False) or getattr(args, "trace", None) is not None
    return compile(graph, target=target, progress=not args.quiet,
                   cache=not (getattr(args, "no_cache", False) or profile),
                   precision=args.precision)


def random_inputs(model, given: dict, dims: dict[str, int], rng) -> dict:
    """Random arrays for the inputs not `given`: floats standard normal, integers 0 or 1
    (valid as ids and masks), booleans fair coins; symbolic dims from `dims`, else 1."""
    feeds = {}
    for name, t in zip(model.input_names, model.input_types):
        if name in given:
            continue
        shape = tuple(d if isinstance(d, int) else dims.get(d, 1) for d in t.shape)
        if t.dtype.is_float:
            feeds[name] = rng.standard_normal(shape).astype(t.dtype.np)
        elif t.dtype.is_int:
            feeds[name] = rng.integers(0, 2, size=shape).astype(t.dtype.np)
        else:
            feeds[name] = rng.random(shape) < 0.5
    return feeds
