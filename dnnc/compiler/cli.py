"""The `dnnc` command (also `python -m dnnc`).

    dnnc --version                                                  dnnc, its targets, versions
    dnnc zoo NAME -o FILE.onnx [--batch N] [--set key=value ...]   write a zoo model
    dnnc zoo --list                                                 list zoo models and options
    dnnc inspect MODEL.onnx|MODEL.dnnc [--ir] [--input-shape name=1,3,224,224 ...]
                 [--passes [--target llvm] [--opt-level N]] [--draw FILE.svg [--profile]]
    dnnc compile MODEL.onnx [--target llvm] [-o MODEL.dnnc] [--opt-level N] [--input-shape ...]
                 [--emit llvm-ir|asm|cuda|loop DIR ...] [--dump-ir DIR] [--mcpu NAME]
                 [--mattr +avx2,...] [--outputs numpy|cupy] [--precision fp32|tf32|fp16|bf16]
    dnnc run MODEL.dnnc|MODEL.onnx [--target llvm] (--input name=file.npy ... | --random)
             [--dim N=4 ...] [--seed S] [--output-dir DIR] [--precision P]
    dnnc bench MODEL.onnx|MODEL.dnnc [--target llvm] [--repeat N] [--warmup N] [--batch B,...]
               [--threads N] [--no-onnxruntime] [--profile] [--trace FILE.json]
    dnnc tune MODEL.onnx --log FILE.jsonl [--trials N] [--precision P] ...
    dnnc compare MODEL.onnx [--target llvm] [--bisect-passes] [--rtol R --atol A]

Every command takes -q (warnings and errors only), -v (debug details too) and --json (its
result as one JSON object on stdout instead of text). Messages go through the `dnnc` logger
(`dnnc/log.py`) as `dnnc: ...` lines on stderr; results go to stdout.

Every option is checked before any work starts, every failure ends in one line on stderr, and
`main` maps outcomes to exit statuses in one table (`EXIT_STATUS`, docs/cli.md "Exit codes"):
0 ok, 1 a finding (`compare`: a divergence), 2 bad usage or input, 3 dnnc failed on valid input
(an internal error: a bug to report), 130 interrupted. `DNNC_DEBUG=1` adds the traceback.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
# numpy imports its random package on first use; Cython's module setup there swallows any
# exception, so a Ctrl-C that lands in it was lost and `dnnc bench` ran on (seen 1 in ~25
# tries under load). Imported here, before any work a user might interrupt.
import numpy.random  # noqa: F401

from ..version import __version__
from ..errors import ArgumentError, CompileError, DNNCError, UnsupportedOpError
from ..levels import DEFAULT_OPT_LEVEL
from ..log import LOGGER, set_verbosity
from .module import call_times_ms

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A bad option value the CLI itself found; printed as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are `UsageError`s: one line and exit 2 through `main`'s
    table, like every other mistake, instead of a usage text and `sys.exit` from inside."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _int_at_least(low: int):
    """An argparse type: an int >= `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects an integer, not {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


def _tolerance(text: str) -> float:
    """An argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a number, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text}")
    return value


def _symbolic_or_int(text: str, option: str, low: int):
    """A size (an int >= `low`) or a symbolic dim name, as `option` takes it."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        if int(text) < low:
            raise UsageError(f"{option}: a size must be at least {low}, not {text}")
        return int(text)
    if not text.isidentifier():
        raise UsageError(f"{option}: {text!r} is neither a size nor a symbolic dim name")
    return text


def _parse_setting(text: str) -> tuple[str, object]:
    """`key=value`; the value is a Python literal (4, 0.5, (2, 2), True) or else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set expects key=value, not {text!r}")
    raw = raw.strip()
    lowered = {"true": True, "false": False}
    if raw.lower() in lowered:
        return key.strip(), lowered[raw.lower()]
    try:
        return key.strip(), ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key.strip(), raw


def _parse_input_shape(text: str) -> tuple[str, tuple]:
    """`name=1,3,224,224` (dims may be symbolic names: `input=N,3,224,224`)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--input-shape expects name=d0,d1,..., not {text!r}")
    shape = tuple(_symbolic_or_int(d, "--input-shape", 0) for d in dims.split(",")) \
        if dims.strip() else ()
    return name, shape


def _import_onnx(path, shapes: dict):
    """The graph of an ONNX file, with `--input-shape`'s mistakes named as the option."""
    from ..frontend.onnx import import_onnx

    try:
        return import_onnx(path, input_shapes=shapes)
    except ArgumentError as exc:   # only input_shapes can be wrong here
        raise UsageError(f"--input-shape: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_zoo(args) -> int:
    from .. import zoo

    if args.list:
        options = {name: zoo.config_options(name) for name in zoo.MODELS}
        if args.json:
            _print_json(options)
        for name, keys in ([] if args.json else options.items()):
            print(f"{name:<14} {', '.join(keys)}")
        return 0
    if not args.name or not args.output:
        raise UsageError("dnnc zoo needs a model NAME and -o FILE (or --list)")
    config = dict(_parse_setting(s) for s in args.set)
    try:
        model = zoo.build(args.name, batch=_symbolic_or_int(args.batch, "--batch", 1),
                          **config)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    import onnx

    try:
        onnx.save(model, args.output)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output!r}: {exc.strerror or exc}") from exc
    params = sum(_numel(t.dims) for t in model.graph.initializer)
    if args.json:
        _print_json({"output": args.output, "model": args.name,
                     "nodes": len(model.graph.node), "parameters": params})
    else:
        print(f"wrote {args.output}: {args.name}, {len(model.graph.node)} nodes, "
              f"{params:,} parameters")
    return 0


def _print_json(doc) -> None:
    """A command's result as `--json` prints it: one object, NaN and infinities as null."""
    print(json.dumps(_finite(doc), indent=2))


def _finite(doc):
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def cmd_inspect(args) -> int:
    from .inspect import format_passes, format_summary, pass_report, summarize, summarize_onnx
    from ..backends.registry import default_target

    from .artifact import is_artifact
    from .module import load

    shapes = dict(_parse_input_shape(s) for s in args.input_shape)
    artifact = None
    if not (args.passes or args.draw) and (args.target is not None or
                                           args.opt_level is not None):
        raise UsageError("--target and --opt-level go with --passes or --draw")
    if args.profile and not args.draw:
        raise UsageError("--profile goes with --draw (bench --profile times a model)")
    if args.draw:
        _check_writable(Path(args.draw), "--draw")
    if is_artifact(args.model):
        if shapes:
            raise UsageError("--input-shape applies to ONNX models, not artifacts")
        if args.passes:
            raise UsageError("--passes applies to ONNX models: an artifact's graph is "
                             "already optimised")
        if args.profile:
            raise UsageError("--profile: an artifact keeps no kernel list to time; give "
                             "the ONNX model")
        artifact = load(args.model, progress=False)
        graph = artifact.graph
        summary = summarize(graph)
    else:
        try:
            graph = _import_onnx(args.model, shapes)
        except UnsupportedOpError as exc:
            if args.ir or args.passes or args.draw:   # they need the imported graph
                raise
            from ..frontend.onnx import load_model_proto

            log.warning(_one_line(exc))
            summary = summarize_onnx(load_model_proto(args.model), exc.ops)
        else:
            summary = summarize(graph)
    target = args.target or default_target()
    opt_level = DEFAULT_OPT_LEVEL if args.opt_level is None else args.opt_level
    rows = pass_report(graph, target, opt_level) if args.passes else None
    drawn = _draw(args, graph if artifact is None else None, artifact, target, opt_level) \
        if args.draw else None
    if args.json:
        doc = summary.to_dict()
        if artifact is not None:
            doc["artifact"] = _artifact_summary(artifact)
        if rows is not None:
            doc["passes"] = {"target": target, "opt_level": opt_level,
                             "after": [r.to_dict() for r in rows]}
        if args.ir:
            doc["ir"] = str(graph)
        if drawn is not None:
            doc["draw"] = drawn
        _print_json(doc)
    else:
        print(format_summary(summary))
        if rows is not None:
            print(format_passes(rows, target, opt_level))
        if artifact is not None:
            info = _artifact_summary(artifact)
            print(f"artifact: dnnc {info['dnnc_version']}, target {info['target']}"
                  f"{', cpu ' + info['cpu'] if info.get('cpu') else ''}, "
                  f"{info['kernels']} kernels, {info['specializations']} compiled "
                  f"specialisation(s)")
            for op in info["host_fallbacks"]:
                print(f"  host fallback: {op}")
    if args.ir and not args.json:
        print()
        print(graph)
    return 0


def _draw(args, graph, artifact, target: str, opt_level: int) -> dict:
    """Write `--draw`'s picture of the optimised graph (an artifact's own, else the ONNX
    model's after the target's passes), its kernels coloured by time share with --profile;
    what was drawn, for --json."""
    from ..passes.manager import optimize
    from .draw import draw, kernels_of
    from .driver import compile
    from ..backends.registry import REGISTRY

    shares = None
    if artifact is not None:
        graph = artifact.graph
    elif args.profile:
        if not REGISTRY[target].generates_code:
            raise UsageError(f"--profile: the {target} target runs no kernels")
        log.info(f"compiling for {target} to profile each kernel")
        model = compile(graph, target=target, opt_level=opt_level, progress=not args.quiet,
                        cache=False)   # a cached compile keeps no kernel list to time
        feeds = _random_inputs(model, {}, {}, np.random.default_rng(0))
        rows = model.profile(*[feeds[n] for n in model.input_names])
        graph = model.graph
        kernel_of = {n.name: k for k, nodes in enumerate(kernels_of(graph)) for n in nodes}
        total = sum(r["ms"] for r in rows) or 1.0
        shares = {}
        for r in rows:   # a kernel compiled for each shape is timed once per shape
            k = kernel_of[r["nodes"][0]]
            shares[k] = shares.get(k, 0.0) + r["ms"] / total
    elif REGISTRY[target].runs_passes:
        graph = optimize(graph, REGISTRY[target].target(), opt_level)
    svg, renderer = draw(graph, shares)
    Path(args.draw).write_text(svg)
    kernels = len(kernels_of(graph))
    log.info(f"wrote {args.draw}: {kernels} kernels of {len(graph.nodes)} nodes ({renderer})")
    return {"file": args.draw, "renderer": renderer, "kernels": kernels,
            "nodes": len(graph.nodes), "profiled": shares is not None}


def _cpu_option(args):
    """The Target --mcpu/--mattr describe, or None for the host: `cpu_from` says what they
    mean and refuses unknown CPU or feature names."""
    if args.mcpu is None and args.mattr is None:
        return None
    from ..backends.registry import using

    if args.target not in using("cpu"):
        raise UsageError(f"--mcpu/--mattr apply to the {', '.join(using('cpu'))} target only")
    from ..backends.llvm.cpu import cpu_from

    try:
        return cpu_from(args.mcpu, args.mattr)
    except ValueError as exc:
        raise UsageError(f"--mcpu/--mattr: {exc}") from None


def _model_for(args, shapes: dict | None = None, check=None):
    """A CompiledModel from an artifact (loaded) or an ONNX file (compiled for --target);
    `check(input_names, input_types)` vets options against the model before compiling."""
    from .artifact import is_artifact, target_of
    from .module import load
    from .driver import compile
    from ..backends.registry import REGISTRY, default_target

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
    graph = _import_onnx(args.model, shapes or {})
    if check is not None:
        check([v.name for v in graph.inputs], [v.type for v in graph.inputs])
    log.info(f"compiling {args.model} ({len(graph.nodes)} nodes) for {target}")
    # a profile times each kernel of a fresh compile: a cached one keeps no kernel list
    profile = getattr(args, "profile", False) or getattr(args, "trace", None) is not None
    return compile(graph, target=target, progress=not args.quiet,
                   cache=not (getattr(args, "no_cache", False) or profile),
                   precision=args.precision)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def cmd_compile(args) -> int:
    from .driver import compile
    from ..backends.registry import REGISTRY, emit_kinds

    spec = REGISTRY[args.target]
    shapes = dict(_parse_input_shape(s) for s in args.input_shape)
    cpu = _cpu_option(args)
    emits = []
    for kind, folder in args.emit:
        if kind not in emit_kinds():
            raise UsageError(f"--emit {kind!r}: one of {', '.join(emit_kinds())}")
        if not spec.generates_code:
            raise UsageError(f"--emit: the {args.target} target generates no code")
        if kind not in spec.emits:
            raise UsageError(f"--emit {kind!r}: the {args.target} target emits "
                             f"{', '.join(spec.emits)}")
        emits.append((kind, Path(folder)))
    # a machine without the target's device (a GPU) can still write the code --emit asks for
    render_only = bool(emits) and not spec.available()
    if render_only and args.output:
        raise UsageError(f"-o: this machine cannot run the {args.target} target, so no "
                         f"artifact can be compiled here; --emit alone writes the code")
    output = Path(args.output) if args.output else Path(args.model).with_suffix(".dnnc")
    if not render_only:
        spec.require()   # no GPU: one line, before any progress
        _check_writable(output, "-o")
    if args.dump_ir and not spec.runs_passes:
        raise UsageError(f"--dump-ir: the {args.target} target runs no passes")
    log.info(f"importing {args.model}")
    graph = _import_onnx(args.model, shapes)
    symbolic = sorted({d for v in graph.inputs for d in v.type.shape if isinstance(d, str)})
    if emits and symbolic:
        fixed = " ".join(f"--input-shape {v.name}={_example_shape(v.type.shape)}"
                         for v in graph.inputs if not v.type.is_static)
        raise UsageError(f"--emit {emits[0][0]}: input dim(s) {', '.join(symbolic)} are "
                         f"symbolic, so no code is compiled before a call gives them sizes; "
                         f"fix them to emit code, e.g. {fixed}")
    where = ""
    if spec.machine is not None:
        shown = spec.target(cpu)
        where = f" (cpu {shown.cpu}, {shown.vector_bits}-bit vectors)" if shown.cpu else \
            f" ({shown.arch}{', code only: no device here' if render_only else ''})"
    log.info(f"compiling {len(graph.nodes)} nodes for {args.target}{where}")
    try:
        if args.tuning_log and "tuning_log" not in spec.options:
            raise UsageError(f"--tuning-log: the {args.target} target is not tuned")
        model = compile(graph, target=args.target, opt_level=args.opt_level, cpu=cpu,
                        progress=not args.quiet, dump_ir=args.dump_ir,
                        tuning_log=args.tuning_log, render_only=render_only,
                        outputs=args.outputs, precision=args.precision,
                        # --emit writes the code a compile makes: a cached one keeps object code
                        cache=not (args.no_cache or emits))
    except OSError as exc:   # the --dump-ir folder
        raise UsageError(f"cannot write into {args.dump_ir!r}: {exc.strerror or exc}") from exc
    if args.dump_ir:
        log.info(f"wrote the graph after each pass into {args.dump_ir}")
    stats = model.stats
    if symbolic and spec.generates_code:
        log.info(f"input dim(s) {', '.join(symbolic)} are symbolic: kernels are compiled for "
                 f"each shape on first use (fix them with --input-shape to compile ahead)")
    for kind, folder in emits:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            target_file = folder / (Path(args.model).stem + spec.emits[kind])
            code = model.source(kind)
            target_file.write_text(code)
        except OSError as exc:
            raise UsageError(f"cannot write into {str(folder)!r}: {exc.strerror or exc}") \
                from exc
        log.info(f"wrote {target_file}" + ("" if code else " (empty: the model needs no "
                                                     "kernel)"))
    if not render_only:
        log.info(f"saving {output}")
        model.save(output)
    if args.json:
        _print_json({"output": None if render_only else str(output), "target": args.target,
                     "kernels": stats["kernels"], "host_fallbacks": stats["host_fallbacks"],
                     "arena_bytes": stats["arena_bytes"],
                     "compile_seconds": stats["compile_seconds"],
                     "compile_cache": stats.get("compile_cache", "off"),
                     "tuned_kernels": stats["tuned_kernels"],
                     "emitted": {kind: str(folder / (Path(args.model).stem + spec.emits[kind]))
                                 for kind, folder in emits}})
    elif render_only:
        print(f"wrote the {', '.join(kind for kind, _ in emits)} code of {stats['kernels']} "
              f"kernels; no artifact: this machine cannot run the {args.target} target")
    else:
        fallbacks = stats["host_fallback_ops"]
        print(f"wrote {output}: {args.target}, {stats['kernels']} kernels, {fallbacks} host "
              f"fallback op(s){': ' + ', '.join(stats['host_fallbacks']) if fallbacks else ''}"
              f", arena {stats['arena_bytes']:,} bytes, compiled in "
              f"{stats['compile_seconds']:.2f} s"
              + (f", {stats['tuned_kernels']} kernel(s) tuned" if args.tuning_log else ""))
    return 0


def cmd_tune(args) -> int:
    from ..autotune.tuner import table
    from .tune import tune

    shapes = dict(_parse_input_shape(s) for s in args.input_shape)
    _check_writable(Path(args.log), "--log")
    log.info(f"importing {args.model}")
    graph = _import_onnx(args.model, shapes)
    start = time.perf_counter()
    reports = tune(graph, args.target, log=args.log, trials=args.trials,
                   opt_level=args.opt_level, timeout=args.timeout, seed=args.seed,
                   progress=not args.quiet, search=args.search, scheduler=args.scheduler,
                   precision=args.precision)
    seconds = time.perf_counter() - start
    if args.json:
        _print_json({"log": args.log, "seconds": seconds, "tasks": [
            {"task": r.task.name, "key": r.task.key, "count": r.task.count,
             "default_ms": r.default_ms, "best_ms": r.best_ms, "speedup": r.speedup,
             "trials": r.trials, "errors": r.errors} for r in reports]})
        return 0
    print(table(reports))
    print(f"tuned {len(reports)} task(s) in {seconds:.1f} s; records in {args.log} (compile "
          f"with --tuning-log {args.log})")
    return 0


def _example_shape(shape) -> str:
    """`N,20` -> `1,20`: a shape for --input-shape with every symbolic dim 1."""
    return ",".join(str(d) if isinstance(d, int) else "1" for d in shape)


def _check_writable(path: Path, option: str) -> None:
    """Refuse a file that cannot be written before spending minutes compiling for it."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{option} {str(path)!r}: folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a folder, not a file")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {str(path)!r}: folder {str(folder)!r} is not writable")


def _random_inputs(model, given: dict, dims: dict[str, int], rng) -> dict:
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


def _parse_dims(specs: list[str], names: list[str], types, given) -> dict[str, int]:
    """`--dim NAME=SIZE`s: each names a symbolic dim of an input --random fills, once, with a
    size of at least 1."""
    randomised = sorted({d for name, t in zip(names, types)
                         if name not in given for d in t.shape if isinstance(d, str)})
    dims = {}
    for text in specs:
        name, sep, size = (part.strip() for part in text.partition("="))
        if not sep or not name or not size.isdigit():
            raise UsageError(f"--dim expects NAME=SIZE, not {text!r}")
        if name not in randomised:
            raise UsageError(f"--dim {name}: not a symbolic dim of an input --random fills "
                             f"({', '.join(randomised) or 'there is none'})")
        if name in dims:
            raise UsageError(f"--dim {name} given twice")
        if int(size) < 1:
            raise UsageError(f"--dim {name}: a size must be at least 1, not {size}")
        dims[name] = int(size)
    return dims


def _input_names(specs: list[str], names: list[str]) -> list[str]:
    """The inputs `--input NAME=FILE.npy`s name, each an input of the model, once."""
    named = []
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--input expects name=file.npy, not {spec!r}")
        if name not in names:
            raise UsageError(f"--input {name}: the model has no such input; its inputs are "
                             f"{', '.join(names)}")
        if name in named:
            raise UsageError(f"--input {name} given twice")
        named.append(name)
    return named


def _read_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    """The arrays of `--input NAME=FILE.npy`s (checked by `_input_names`)."""
    feeds = {}
    for spec in specs:
        name, _, file = spec.partition("=")
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--input {name}: cannot read {file!r}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from exc
    return feeds


def _safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name) or "output"


def cmd_run(args) -> int:
    shapes = dict(_parse_input_shape(s) for s in args.input_shape)
    dims: dict[str, int] = {}
    given: dict[str, np.ndarray] = {}

    def check(names, types):   # before compiling: a mistake costs no compile time
        named = _input_names(args.input, names)
        missing = [n for n in names if n not in named]
        if missing and not args.random:
            raise UsageError(f"no data for input(s) {', '.join(missing)}: give --input "
                             f"name=file.npy or --random")
        if args.random and not missing:
            raise UsageError("--random: every input is given with --input")
        dims.update(_parse_dims(args.dim, names, types, named))
        given.update(_read_inputs(args.input))

    model = _model_for(args, shapes, check)
    feeds = {**given, **_random_inputs(model, given, dims, np.random.default_rng(args.seed))}
    jit_before = model.stats.get("jit_seconds", 0.0)
    start = time.perf_counter()
    outputs = model.run(*[feeds[n] for n in model.input_names], to="numpy")
    elapsed = time.perf_counter() - start
    jit = model.stats.get("jit_seconds", 0.0) - jit_before
    if args.output_dir:
        folder = Path(args.output_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, out in zip(model.output_names, outputs):
                np.save(folder / (_safe_file_name(name) + ".npy"), out)
        except OSError as exc:
            raise UsageError(f"cannot write into {str(folder)!r}: {exc.strerror or exc}") \
                from exc
    summaries = [_output_summary(name, out) for name, out in zip(model.output_names, outputs)]
    if args.json:
        _print_json({"target": model.target, "seconds": elapsed, "compile_seconds": jit,
                     "outputs": summaries, "output_dir": args.output_dir})
        return 0
    for o in summaries:
        summary = ""
        if "min" in o:
            summary = f"  min {o['min']:.6g}  max {o['max']:.6g}  mean {o['mean']:.6g}"
            if o["non_finite"]:
                summary += f"  ({o['non_finite']} non-finite)"
        print(f"{o['name']}: {o['dtype']}{o['shape']}{summary}")
    saved = f", outputs saved in {args.output_dir}" if args.output_dir else ""
    compiling = f" (of which {jit:.2f} s compiling for these shapes)" if jit > 0 else ""
    print(f"ran in {_ms(elapsed)} on {model.target}{compiling}{saved}")
    return 0


def _output_summary(name: str, out: np.ndarray) -> dict:
    """An output as `dnnc run` reports it: dtype and shape, and for numbers the min, max and
    mean of its finite values (NaN when none is) and how many are not finite."""
    summary = {"name": name, "dtype": str(out.dtype), "shape": list(out.shape)}
    if out.size and out.dtype.kind in "fiub":
        values = out.astype(np.float64)
        finite = values[np.isfinite(values)]
        summary.update({f: float(getattr(finite, f)()) if finite.size else float("nan")
                        for f in ("min", "max", "mean")})
        summary["non_finite"] = int(values.size - finite.size)
    return summary


def _median_ms(fn, repeat: int, warmup: int) -> float:
    return float(np.median(call_times_ms(fn, repeat, warmup)))


def _ort_session(path: str, threads: int):
    """An onnxruntime session with `threads` intra-op threads, or None when not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def cmd_bench(args) -> int:
    from .artifact import is_artifact

    if args.threads is not None:
        os.environ["DNNC_NUM_THREADS"] = str(args.threads)  # read when the pool starts
    batches: list[int | None] = [None]
    if args.batch is not None:
        try:
            batches = [int(b) for b in args.batch.split(",")]
        except ValueError:
            raise UsageError(f"--batch expects sizes like 1,8, not {args.batch!r}") from None
        if min(batches) < 1:
            raise UsageError(f"--batch: a size must be at least 1, not {min(batches)}")
    shapes = dict(_parse_input_shape(s) for s in args.input_shape)
    batch_dims: list[str] = []

    def check(names, types):   # before compiling: a mistake costs no compile time
        batch_dims.extend(sorted({t.shape[0] for t in types
                                  if t.rank and isinstance(t.shape[0], str)}))
        if args.batch is not None and not batch_dims:
            fixed = {t.shape[0] for t in types if t.rank}
            raise UsageError(f"the model's batch is fixed ({', '.join(map(str, fixed))}); "
                             f"write it with a symbolic batch (dnnc zoo ... --batch N) to "
                             f"bench other sizes")

    profile = args.profile or args.trace is not None
    if profile:
        _check_profile(args)
    model = _model_for(args, shapes, check)
    machine = model.runtime.target
    threads = machine.threads
    session = None
    if not args.no_onnxruntime and not is_artifact(args.model):
        session = _ort_session(args.model, threads)
    ort_version = None
    if session is not None:
        import onnxruntime

        ort_version = onnxruntime.__version__
    header = [f"dnnc bench: {args.model}, target {model.target}"]
    if machine.cpu:
        header.append(f"cpu {machine.cpu} ({machine.vector_bits}-bit vectors)")
    header.append(f"{threads} thread(s), median of {args.repeat} after {args.warmup} warm-up")
    if ort_version is not None:
        header.append(f"onnxruntime {ort_version}")
    if not args.json:
        print(", ".join(header))
        print(f"{'batch':>6} {'dnnc ms':>12} {'p90':>9} {'p99':>9} {'items/s':>9} "
              f"{'onnxruntime ms':>15} {'dnnc/ort':>9}")
    rows = []
    lanes: dict[str, list[dict]] = {}   # batch -> its kernels' profile
    rng = np.random.default_rng(args.seed)
    for batch in batches:
        dims = {d: batch for d in batch_dims} if batch is not None else {}
        feeds = _random_inputs(model, {}, dims, rng)
        if batch is not None:
            log.info(f"batch {batch}: compiling and warming up")
        # NumPy in and out, as onnxruntime's: a GPU target's time includes its copies
        args_in = [feeds[n] for n in model.input_names]
        samples = call_times_ms(lambda: model.run(*args_in, to="numpy"), args.repeat,
                                args.warmup)
        ours = float(np.median(samples))
        p90, p99 = (float(np.percentile(samples, q)) for q in (90, 99))
        theirs = None
        if session is not None:
            names = [i.name for i in session.get_inputs()]
            ort_feeds = {n: feeds[n] for n in names if n in feeds}
            theirs = _median_ms(lambda: session.run(None, ort_feeds), args.repeat,
                                args.warmup)
        label = "-" if batch is None else str(batch)
        if batch is None and model.input_types and model.input_types[0].rank:
            label = str(next(iter(feeds.values())).shape[0]) if feeds else "-"
        items = int(label) if label.isdigit() else 1
        rows.append({"batch": int(label) if label.isdigit() else None, "dnnc_ms": ours,
                     "dnnc_p90_ms": p90, "dnnc_p99_ms": p99,
                     "throughput_per_s": items * 1e3 / ours,
                     "onnxruntime_ms": theirs, "ratio": ours / theirs if theirs else None})
        if profile:
            log.info(f"batch {label}: profiling each kernel")
            lanes[f"batch {label}"] = rows[-1]["profile"] = model.profile(
                *[feeds[n] for n in model.input_names], repeat=args.repeat)
        if not args.json:
            print(f"{label:>6} {ours:>12.4f} {p90:>9.4f} {p99:>9.4f} "
                  f"{rows[-1]['throughput_per_s']:>9.1f} "
                  f"{(f'{theirs:.4f}' if theirs is not None else 'n/a'):>15} "
                  f"{(f'{ours / theirs:.2f}' if theirs else 'n/a'):>9}")
    if args.json:
        _print_json({"model": args.model, "target": model.target, "cpu": machine.cpu,
                     "vector_bits": machine.vector_bits if machine.cpu else None,
                     "threads": threads, "repeat": args.repeat, "warmup": args.warmup,
                     "onnxruntime": ort_version, "rows": rows})
    else:
        for lane, kernels in lanes.items():
            print(_format_profile(lane, kernels, args.repeat))
    if args.trace is not None:
        from .chrome_trace import chrome_trace

        doc = chrome_trace(lanes, f"dnnc {model.target}: {args.model}",
                           {"model": args.model, "target": model.target, "cpu": machine.cpu,
                            "threads": threads, "repeat": args.repeat,
                            "dnnc_version": __version__})
        Path(args.trace).write_text(json.dumps(doc))
        log.info(f"wrote {args.trace}: {sum(len(k) for k in lanes.values())} kernel events "
                 f"(open it in ui.perfetto.dev or chrome://tracing)")
    return 0


PROFILE_TOP = 10
"""Kernels `bench --profile` lists per batch, the slowest first (the JSON and the trace have
every one)."""


def _format_profile(lane: str, kernels: list[dict], repeat: int) -> str:
    total = sum(k["ms"] for k in kernels)
    lines = [f"profile, {lane}: {len(kernels)} kernels, each called alone, median of {repeat};"
             f" sum {total:.4f} ms",
             f"{'ms':>10} {'share':>6} {'GFLOP/s':>8} {'GB/s':>7}  kernel (nodes) template "
             f"{{knobs}}"]
    for k in sorted(kernels, key=lambda k: -k["ms"])[:PROFILE_TOP]:
        nodes = ", ".join(k["nodes"][:4]) + (", ..." if len(k["nodes"]) > 4 else "")
        seconds = k["ms"] / 1e3 or float("inf")
        flops = k.get("flops")
        gflops = f"{flops / seconds / 1e9:8.1f}" if flops else f"{'-':>8}"
        gbps = f"{k['bytes'] / seconds / 1e9:7.1f}" if k.get("bytes") else f"{'-':>7}"
        knobs = ""
        if k.get("template"):
            config = k.get("config") or {}
            knobs = f" {k['template']} {{" + ", ".join(f"{a}={b}" for a, b in config.items()) \
                + "}"
        lines.append(f"{k['ms']:>10.4f} {k['ms'] / (total or 1):>6.1%} {gflops} {gbps}  "
                     f"{k['kernel']} ({nodes}){knobs}")
    if len(kernels) > PROFILE_TOP:
        lines.append(f"{'':>17}  ... {len(kernels) - PROFILE_TOP} more")
    return "\n".join(lines)


def _check_profile(args) -> None:
    """`--profile`/`--trace` need kernels to time, known before any compile."""
    from .artifact import is_artifact
    from ..backends.registry import REGISTRY, default_target

    option = "--profile" if args.profile else "--trace"
    if is_artifact(args.model):
        raise UsageError(f"{option}: an artifact keeps no kernel list to time; give the "
                         f"ONNX model")
    target = args.target or default_target()
    if not REGISTRY[target].generates_code:
        raise UsageError(f"{option}: the {target} target runs no kernels")
    if args.trace is not None:
        _check_writable(Path(args.trace), "--trace")


def _artifact_summary(model) -> dict:
    manifest, stats = model.manifest, model.stats
    return {"dnnc_version": manifest["dnnc_version"], "target": model.target,
            "cpu": manifest["target"].get("cpu"), "kernels": stats["kernels"],
            "specializations": stats.get("specializations", 0),
            "host_fallbacks": stats["host_fallbacks"]}


def build_parser() -> argparse.ArgumentParser:
    from ..backends.registry import default_target, fastest_first, output_kinds

    targets, default = fastest_first(), default_target()
    parser = _Parser(
        prog="dnnc", description="dnnc, a deep-learning compiler: build, inspect and compile "
                                 "models.")
    parser.add_argument("--version", action=_Version, help="print dnnc's version, its "
                        "targets with the libraries they use, and the default target")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    zoo = sub.add_parser("zoo", help="write a zoo model (seeded random weights) as ONNX",
                         description="Write a model of dnnc's zoo as an ONNX file.")
    zoo.add_argument("name", nargs="?", help="model name (see --list)")
    zoo.add_argument("-o", "--output", help="the .onnx file to write")
    zoo.add_argument("--batch", default="1",
                     help="batch size, or a name for a symbolic batch dim (default 1)")
    zoo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="a builder option, e.g. --set layers=4 (repeatable)")
    zoo.add_argument("--list", action="store_true", help="list the models and their options")
    zoo.set_defaults(run=cmd_zoo)

    ins = sub.add_parser("inspect", help="summarise an ONNX model or an artifact",
                         description="Inputs, outputs, op counts, parameters and estimated "
                                     "FLOPs of a model.")
    ins.add_argument("model", help="an .onnx file or a .dnnc artifact")
    ins.add_argument("--ir", action="store_true", help="also print the whole graph IR")
    ins.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                     help="fix an input's shape (dims may be symbolic names; repeatable)")
    ins.add_argument("--passes", action="store_true",
                     help="run the pass pipeline and print nodes and kernels after each pass")
    ins.add_argument("--draw", metavar="FILE.svg",
                     help="draw the optimised graph, its nodes grouped by kernel, as SVG")
    ins.add_argument("--profile", action="store_true",
                     help="with --draw: compile, time each kernel and colour it by its share")
    ins.add_argument("--target", default=None, choices=targets,
                     help=f"target of --passes and --draw (default {default})")
    ins.add_argument("--opt-level", type=int, default=None, choices=[0, 1, 2, 3],
                     help="optimisation level of --passes and --draw (default 3)")
    ins.set_defaults(run=cmd_inspect)

    comp = sub.add_parser("compile", help="compile an ONNX model into an artifact (.dnnc)",
                          description="Compile an ONNX model for a target and save the result "
                                      "as one self-contained artifact file.")
    comp.add_argument("model", help="an .onnx file")
    comp.add_argument("-o", "--output", help="the artifact to write (default: MODEL.dnnc)")
    comp.add_argument("--target", default=default, choices=targets,
                      help=f"target (default {default})")
    comp.add_argument("--opt-level", type=int, default=None, choices=[0, 1, 2, 3],
                      help="optimisation level (default 3)")
    _shape_option(comp)
    comp.add_argument("--emit", nargs=2, action="append", default=[], metavar=("KIND", "DIR"),
                      help="also write the generated code: llvm-ir, asm, cuda or loop "
                           "(repeatable; the target's kinds)")
    comp.add_argument("--dump-ir", metavar="DIR",
                      help="write the graph IR after every pass as DIR/NN_pass.txt")
    comp.add_argument("--tuning-log", metavar="FILE",
                      help="apply the best configs `dnnc tune` measured on this machine")
    comp.add_argument("--outputs", choices=output_kinds(), default=None,
                      help="the arrays the artifact's calls return from Python (default: "
                           "the target's: cupy on cuda, numpy on the CPU targets)")
    _cache_option(comp)
    _precision_option(comp)
    _cpu_options(comp)
    comp.set_defaults(run=cmd_compile)

    run = sub.add_parser("run", help="run an artifact or an ONNX model once",
                         description="Run a model on inputs from .npy files or random ones; "
                                     "print each output's shape and a summary.")
    run.add_argument("model", help="a .dnnc artifact or an .onnx file")
    run.add_argument("--target", default=None, choices=targets,
                     help=f"target for an ONNX model (default {default})")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input's data (repeatable)")
    run.add_argument("--random", action="store_true",
                     help="random data for the inputs not given with --input")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                     help="size of a symbolic dim for --random (default 1; repeatable)")
    run.add_argument("--seed", type=_int_at_least(0), default=0,
                     help="seed of --random (default 0)")
    run.add_argument("--output-dir", help="save each output as DIR/NAME.npy")
    _precision_option(run)
    _shape_option(run)
    _cache_option(run)
    run.set_defaults(run=cmd_run)

    bench = sub.add_parser("bench", help="median latency, next to onnxruntime's",
                           description="Median latency of a model on random inputs, and "
                                       "onnxruntime's in the same run with the same thread "
                                       "count when it is installed.")
    bench.add_argument("model", help="an .onnx file (or a .dnnc artifact: no onnxruntime)")
    bench.add_argument("--target", default=None, choices=targets,
                       help=f"target for an ONNX model (default {default})")
    bench.add_argument("--repeat", type=_int_at_least(1), default=50,
                       help="timed calls (default 50)")
    bench.add_argument("--warmup", type=_int_at_least(0), default=5,
                       help="untimed calls first (default 5)")
    bench.add_argument("--batch", help="batch sizes for a symbolic batch dim, e.g. 1,8")
    bench.add_argument("--threads", type=_int_at_least(1), default=None,
                       help="threads for dnnc and onnxruntime (default: DNNC_NUM_THREADS, "
                            "else every core this process may use)")
    bench.add_argument("--seed", type=_int_at_least(0), default=0,
                       help="seed of the random inputs")
    _cache_option(bench)
    bench.add_argument("--no-onnxruntime", action="store_true",
                       help="skip the onnxruntime comparison")
    bench.add_argument("--profile", action="store_true",
                       help="also time each kernel alone and list the slowest")
    bench.add_argument("--trace", metavar="FILE.json",
                       help="write the profile as a Chrome trace (Perfetto, chrome://tracing;"
                            " implies --profile)")
    _precision_option(bench)
    _shape_option(bench)
    bench.set_defaults(run=cmd_bench)

    tune = sub.add_parser("tune", help="tune a model's kernels; records go to a log",
                          description="Search each kernel's schedule knobs, measuring "
                                      "candidates in worker processes; every result is "
                                      "appended to the log (a run resumes it), and `dnnc "
                                      "compile --tuning-log` applies the best.")
    tune.add_argument("model", help="an .onnx file")
    tune.add_argument("--target", default=default, choices=targets,
                      help=f"target (default {default})")
    tune.add_argument("--log", required=True, help="the JSON Lines tuning log (appended)")
    tune.add_argument("--trials", type=_int_at_least(1), default=200,
                      help="measurements for the whole model (default 200)")
    tune.add_argument("--timeout", type=_tolerance, default=60.0,
                      help="seconds one candidate may take (default 60)")
    tune.add_argument("--opt-level", type=int, default=None, choices=[0, 1, 2, 3],
                      help="optimisation level, as the compile that uses the log (default 3)")
    tune.add_argument("--seed", type=_int_at_least(0), default=0, help="search seed")
    tune.add_argument("--scheduler", metavar="ADDR",
                      help="measure on a Dask cluster (tcp://HOST:8786; pip install "
                           "'dnnc[cluster]')")
    tune.add_argument("--search", default="xgb", choices=["xgb", "random"],
                      help="candidates the XGBoost cost model ranks fastest (default), or "
                           "random ones")
    _precision_option(tune)
    _shape_option(tune)
    tune.set_defaults(run=cmd_tune)

    cmp_ = sub.add_parser("compare", help="find the first node (and pass) a target gets wrong",
                          description="Run the model on a target and on the numpy reference "
                                      "with the same random inputs; report the first node, in "
                                      "the model's names, whose output differs.")
    cmp_.add_argument("model", help="an .onnx file")
    cmp_.add_argument("--target", default=default, choices=targets)
    cmp_.add_argument("--opt-level", type=int, default=None, choices=[0, 1, 2, 3])
    cmp_.add_argument("--bisect-passes", action="store_true",
                      help="also find the first pass after which the results change")
    cmp_.add_argument("--rtol", type=_tolerance, default=1e-4,
                      help="relative tolerance, >= 0 (default 1e-4)")
    cmp_.add_argument("--atol", type=_tolerance, default=1e-5,
                      help="absolute tolerance, >= 0 (default 1e-5)")
    cmp_.add_argument("--seed", type=_int_at_least(0), default=0,
                      help="seed of the random inputs")
    cmp_.set_defaults(run=cmd_compare)
    for command in sub.choices.values():
        _common_options(command)
    return parser


def _common_options(parser) -> None:
    """-q, -v and --json, which every command takes."""
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true",
                          help="no progress: warnings and errors only")
    loudness.add_argument("-v", "--verbose", action="store_true",
                          help="also debug details (each pass's time, each segment compiled)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on stdout")


def version_text() -> str:
    """What `dnnc --version` prints: dnnc's version, each target with whether this host can
    run it and its libraries' versions (or why not), and the default target."""
    import platform

    import onnx

    from ..backends.registry import REGISTRY, default_target

    lines = [f"dnnc {__version__} (Python {platform.python_version()}, NumPy {np.__version__},"
             f" onnx {onnx.__version__})", "targets:"]
    width = max(map(len, REGISTRY))
    for spec in REGISTRY.values():
        lines.append(f"  {spec.name:<{width}}  {'yes' if spec.available() else 'no '}  "
                     f"{spec.about()}")
    lines.append(f"default target: {default_target()}")
    return "\n".join(lines)


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def cmd_compare(args) -> int:
    from .artifact import is_artifact
    from .compare import bisect_passes, compare
    from ..backends.registry import REGISTRY

    if is_artifact(args.model):
        raise UsageError(f"{args.model} is an artifact; compare takes the ONNX model, to run "
                         f"on the reference too")
    if args.bisect_passes and not REGISTRY[args.target].runs_passes:
        raise UsageError("--bisect-passes: the numpy target runs no passes")
    options = dict(rtol=args.rtol, atol=args.atol, seed=args.seed)
    culprit = where = None
    if args.bisect_passes:
        found = bisect_passes(args.model, args.target, args.opt_level,
                              progress=not args.quiet, **options)
        if found is not None:
            culprit, where = found
    else:
        where = compare(args.model, args.target, args.opt_level, progress=not args.quiet,
                        **options)
    diverges = culprit is not None or where is not None
    if args.json:
        _print_json({"target": args.target, "rtol": args.rtol, "atol": args.atol,
                     "divergence": diverges, "pass": culprit,
                     "node": None if where is None else dataclasses.asdict(where)})
    elif not diverges:
        print(f"no divergence: {args.target} matches the reference after every pass"
              if args.bisect_passes else
              f"no divergence: every node's output on {args.target} matches the reference")
    else:
        if culprit is not None:
            print(f"first diverging pass: {culprit}")
        if where is not None:
            print(f"first diverging node: {where.node} ({where.op}), output {where.value}, max "
                  f"abs error {where.max_abs_error:.3g} (rtol {args.rtol:g}, atol "
                  f"{args.atol:g})")
    return EXIT_FINDING if diverges else EXIT_OK


def _cache_option(parser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="compile anew: neither read nor fill the on-disk compile cache "
                             "(DNNC_CACHE_DIR; docs/cli.md)")


def _shape_option(parser) -> None:
    parser.add_argument("--input-shape", action="append", default=[],
                        metavar="NAME=D0,D1,...",
                        help="fix an input's shape (dims may be symbolic names; repeatable)")


def _precision_option(parser) -> None:
    from ..ir.target import PRECISIONS

    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="arithmetic of dense products and convolutions (cuda only): "
                             "fp32 (default), or tf32, fp16, bf16 on tensor cores with fp32 "
                             "accumulation")


def _cpu_options(parser) -> None:
    parser.add_argument("--mcpu", help="CPU to compile for (default: this machine's)")
    parser.add_argument("--mattr", help="CPU features, e.g. +avx2,+fma,-avx512f (default: "
                                        "this machine's)")


EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EXIT_STATUS = [
    (UsageError, EXIT_USAGE, "error"),
    (CompileError, EXIT_FAILED, "error"),   # a stage of dnnc failed on input it accepted
    (DNNCError, EXIT_USAGE, "error"),       # a bad or unsupported model, input or argument
    (OSError, EXIT_USAGE, "error"),         # a path that cannot be read or written
    (Exception, EXIT_FAILED, "internal error"),
]
"""What each failure exits with and how its line starts; the first row whose type matches."""


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    # multi-line messages (UnsupportedOpError's list) are joined: "...: a; b"
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text.replace(":; ", ": ")
    if isinstance(exc, (DNNCError, UsageError, OSError)):
        return text
    return f"{type(exc).__name__}: {text} (a dnnc bug: please report it with the traceback " \
           f"that DNNC_DEBUG=1 prints)"


FORCE_EXIT_SECONDS = 3.0
"""How long a Ctrl-C waits for the KeyboardInterrupt to end the command before dnnc exits
anyway: third-party code may swallow it (Cython's module setup in numpy's lazily imported
random package did, 1 in ~25 tries under load), and a second Ctrl-C exits at once."""


def _force_exit() -> None:
    # on a terminal, first clear the line a progress bar may be drawn on (ANSI erase-line)
    os.write(2, (b"\r\x1b[K" if os.isatty(2) else b"") + b"dnnc: interrupted\n")
    os._exit(EXIT_INTERRUPTED)


def _on_interrupt(signum, frame) -> None:
    if getattr(_on_interrupt, "pending", False):   # a second Ctrl-C
        _force_exit()
    _on_interrupt.pending = True
    watchdog = threading.Timer(FORCE_EXIT_SECONDS, _force_exit)
    watchdog.daemon = True    # never keeps a finished process alive
    watchdog.start()
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `dnnc` console script; returns the exit status (`EXIT_STATUS`)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_interrupt) if in_main_thread else None
    _on_interrupt.pending = False
    try:
        return _main(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main(argv: list[str] | None) -> int:
    debug = os.environ.get("DNNC_DEBUG", "") not in ("", "0")
    level = LOGGER.level
    try:
        args = build_parser().parse_args(argv)
        set_verbosity(args.quiet, args.verbose)
        return args.run(args)
    except BrokenPipeError:  # `dnnc inspect --ir model.onnx | head`
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("dnnc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        status, kind = next((s, k) for t, s, k in EXIT_STATUS if isinstance(exc, t))
        if debug:
            traceback.print_exc()
        print(f"dnnc: {kind}: {_one_line(exc)}", file=sys.stderr)
        return status
    finally:
        LOGGER.setLevel(level)   # main() called in-process leaves the logger as it was


if __name__ == "__main__":
    sys.exit(main())
