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
    dnnc sparsify MODEL.onnx --sparsity S [--pattern unstructured|N:M|RxC] -o PRUNED.onnx
                  [--keep NAME ...] [--include-depthwise] [--samples N] [--seed S]

Every command takes -q (warnings and errors only), -v (debug details too) and --json (its
result as one JSON object on stdout instead of text), after its name or before it
(`dnnc -q compile ...`). Messages go through the `dnnc` logger (`dnnc/log.py`) as `dnnc: ...`
lines on stderr, dnnc's warnings (`errors.DNNCWarning`) as one `dnnc: warning: ...` line each;
results go to stdout.

Every option is checked before any work starts, every failure ends in one line on stderr, and
`main` maps outcomes to exit statuses in one table (`exits.EXIT_STATUS`, docs/cli.md "Exit
codes"): 0 ok, 1 a finding (`compare`: a divergence), 2 bad usage or input, 3 dnnc failed on
valid input (an internal error: a bug to report), 130 interrupted. `DNNC_DEBUG=1` adds the
traceback.

A subcommand is one module here, holding its parser (`add_parser`) beside its command
(`run`); `options.py` holds what several take, `models.py` the model they work on,
`exits.py` how a command ends, `version.py` `--version`. This package never compiles,
optimises or times anything itself: it reads options, calls the compiler and reports.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
import warnings

# numpy imports its random package on first use; Cython's module setup there swallows any
# exception, so a Ctrl-C that lands in it was lost and `dnnc bench` ran on (seen 1 in ~25
# tries under load). Imported here, before any work a user might interrupt.
import numpy.random  # noqa: F401

from ...log import LOGGER, set_verbosity
from . import bench, compare, compile, inspect, run, sparsify, tune, zoo
from .exits import EXIT_INTERRUPTED, EXIT_OK, EXIT_STATUS, on_interrupt, one_line
from .options import Parser, common_options, settle_common_options
from .version import Version

COMMANDS = (zoo, inspect, compile, run, bench, tune, compare, sparsify)
"""The subcommands' modules, in the order `dnnc --help` lists them."""


def build_parser() -> Parser:
    """The `dnnc` parser: `--version`, and each of `COMMANDS`; -q, -v and --json before the
    command or after it."""
    from ...backends.registry import default_target, fastest_first

    targets, default = fastest_first(), default_target()
    parser = Parser(
        prog="dnnc", description="dnnc, a deep-learning compiler: build, inspect and compile "
                                 "models.")
    parser.add_argument("--version", action=Version, help="print dnnc's version, its "
                        "targets with the libraries they use, and the default target")
    common_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        common_options(command.add_parser(sub, targets, default))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `dnnc` console script; returns the exit status (`EXIT_STATUS`)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_interrupt) if in_main_thread else None
    on_interrupt.pending = False
    show = warnings.showwarning
    warnings.showwarning = _one_line_warnings(show)
    try:
        return _main(argv)
    finally:
        warnings.showwarning = show
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _one_line_warnings(fallback):
    """A `warnings.showwarning` that prints dnnc's own warnings (a class of the dnnc
    package: `errors.DNNCWarning`'s) as one `dnnc: warning: ...` line through the dnnc
    logger (shown under -q), without Python's source path and line; others as `fallback`."""
    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.split(".")[0] != "dnnc":
            return fallback(message, category, filename, lineno, file, line)
        text = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
        LOGGER.warning("warning: %s", text)
    return show


def _main(argv: list[str] | None) -> int:
    debug = os.environ.get("DNNC_DEBUG", "") not in ("", "0")
    level = LOGGER.level
    try:
        args = build_parser().parse_args(argv)
        settle_common_options(args)
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
        print(f"dnnc: {kind}: {one_line(exc)}", file=sys.stderr)
        return status
    finally:
        LOGGER.setLevel(level)   # main() called in-process leaves the logger as it was
