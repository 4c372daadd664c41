"""`dnnc compile`: compile an ONNX model for a target and save it as one artifact (.dnnc),
optionally also writing the generated code (--emit) and the graph after every pass
(--dump-ir).

Compiling is `compiler/driver.py`'s; this module checks the options against the target's
registry entry before any work and reports the result. It never compares a target's name:
what a target can do (emit and the file suffix of each kind it emits, run passes, take
--mcpu) is read from the registry.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .exits import UsageError
from .models import check_model_file, import_graph
from .options import (cache_option, check_writable, example_shape, parse_input_shape,
                      precision_option, print_json, shape_option)

log = logging.getLogger(__name__)

def add_parser(sub, targets: list[str], default: str):
    """The `compile` subcommand's parser; `targets` and `default` are --target's choices."""
    from ...backends.registry import output_kinds

    comp = sub.add_parser("compile", help="compile an ONNX model into an artifact (.dnnc)",
                          description="Compile an ONNX model for a target and save the result "
                                      "as one self-contained artifact file.")
    comp.add_argument("model", help="an .onnx file")
    comp.add_argument("-o", "--output", help="the artifact to write (default: MODEL.dnnc)")
    comp.add_argument("--target", default=default, choices=targets,
                      help=f"target (default {default})")
    comp.add_argument("--opt-level", type=int, default=None, choices=[0, 1, 2, 3],
                      help="optimisation level (default 3)")
    shape_option(comp)
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
    cache_option(comp)
    precision_option(comp)
    comp.add_argument("--mcpu", help="CPU to compile for (default: this machine's)")
    comp.add_argument("--mattr", help="CPU features, e.g. +avx2,+fma,-avx512f (default: "
                                      "this machine's)")
    comp.set_defaults(run=run)
    return comp


def run(args) -> int:
    from ..driver import compile
    from ...backends.registry import REGISTRY

    spec = REGISTRY[args.target]
    shapes = dict(parse_input_shape(s) for s in args.input_shape)
    cpu = _cpu_option(args)
    emits = _emits(args, spec)
    # a machine without the target's device (a GPU) can still write the code --emit asks for
    render_only = bool(emits) and not spec.available()
    if render_only and args.output:
        raise UsageError(f"-o: this machine cannot run the {args.target} target, so no "
                         f"artifact can be compiled here; --emit alone writes the code")
    output = Path(args.output) if args.output else Path(args.model).with_suffix(".dnnc")
    if not render_only:
        spec.require()   # no GPU: one line, before any progress
        check_writable(output, "-o")
    if args.dump_ir and not spec.runs_passes:
        raise UsageError(f"--dump-ir: the {args.target} target runs no passes")
    check_model_file(args.model)
    log.info(f"importing {args.model}")
    graph = import_graph(args.model, shapes)
    symbolic = sorted({d for v in graph.inputs for d in v.type.shape if isinstance(d, str)})
    if emits and symbolic:
        fixed = " ".join(f"--input-shape {v.name}={example_shape(v.type.shape)}"
                         for v in graph.inputs if not v.type.is_static)
        raise UsageError(f"--emit {emits[0][0]}: input dim(s) {', '.join(symbolic)} are "
                         f"symbolic, so no code is compiled before a call gives them sizes; "
                         f"fix them to emit code, e.g. {fixed}")
    log.info(f"compiling {len(graph.nodes)} nodes for {args.target}"
             f"{_machine_words(spec, cpu, render_only)}")
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
    _write_emits(model, emits)
    if not render_only:
        log.info(f"saving {output}")
        model.save(output)
    _report(args, stats, output, emits, render_only)
    return 0


def _cpu_option(args):
    """The Target --mcpu/--mattr describe, or None for the host: `cpu_from` says what they
    mean and refuses unknown CPU or feature names."""
    if args.mcpu is None and args.mattr is None:
        return None
    from ...backends.registry import REGISTRY, using

    if args.target not in using("cpu"):
        raise UsageError(f"--mcpu/--mattr apply to the {', '.join(using('cpu'))} target only")
    try:
        return REGISTRY[args.target].cpu_from(args.mcpu, args.mattr)
    except ValueError as exc:
        raise UsageError(f"--mcpu/--mattr: {exc}") from None


def _emits(args, spec) -> list[tuple[str, Path]]:
    """--emit's (kind, file) pairs, each a kind of code the target generates, written as
    FOLDER/MODEL-STEM.SUFFIX (the suffix the target's registry entry gives the kind)."""
    from ...backends.registry import emit_kinds

    emits = []
    for kind, folder in args.emit:
        if kind not in emit_kinds():
            raise UsageError(f"--emit {kind!r}: one of {', '.join(emit_kinds())}")
        if not spec.generates_code:
            raise UsageError(f"--emit: the {args.target} target generates no code")
        if kind not in spec.emits:
            raise UsageError(f"--emit {kind!r}: the {args.target} target emits "
                             f"{', '.join(spec.emits)}")
        emits.append((kind, Path(folder) / (Path(args.model).stem + spec.emits[kind])))
    return emits


def _machine_words(spec, cpu, render_only: bool) -> str:
    """` (cpu NAME, N-bit vectors)` or ` (ARCH)`: the machine the compile is for, as the
    'compiling' line names it (empty for a target with no machine)."""
    if spec.machine is None:
        return ""
    shown = spec.target(cpu)
    return f" (cpu {shown.cpu}, {shown.vector_bits}-bit vectors)" if shown.cpu else \
        f" ({shown.arch}{', code only: no device here' if render_only else ''})"


def _write_emits(model, emits: list[tuple[str, Path]]) -> None:
    """Write each --emit kind's code into its file."""
    for kind, target_file in emits:
        folder = target_file.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            code = model.source(kind)
            target_file.write_text(code)
        except OSError as exc:
            raise UsageError(f"cannot write into {str(folder)!r}: {exc.strerror or exc}") \
                from exc
        log.info(f"wrote {target_file}" + ("" if code else " (empty: the model needs no "
                                                     "kernel)"))


def _report(args, stats: dict, output: Path, emits: list[tuple[str, Path]],
            render_only: bool) -> None:
    """Print what was compiled and written: the --json object, else one line."""
    if args.json:
        print_json({"output": None if render_only else str(output), "target": args.target,
                    "kernels": stats["kernels"], "host_fallbacks": stats["host_fallbacks"],
                    "arena_bytes": stats["arena_bytes"],
                    "compile_seconds": stats["compile_seconds"],
                    "compile_cache": stats.get("compile_cache", "off"),
                    "tuned_kernels": stats["tuned_kernels"],
                    "emitted": {kind: str(target_file) for kind, target_file in emits}})
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
