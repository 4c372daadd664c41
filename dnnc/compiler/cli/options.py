"""The options several `dnnc` commands share, how their values are read and checked, and what
`--json` prints.

Every option is checked before any work starts: a bad value raises `UsageError`, which `main`
prints as one line and exits 2 with. This module never imports the compiler's heavy parts at
module level (`dnnc --help` stays quick) and never runs a command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from .exits import UsageError


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are `UsageError`s: one line and exit 2 through `main`'s
    table, like every other mistake, instead of a usage text and `sys.exit` from inside."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def int_at_least(low: int):
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


def tolerance(text: str) -> float:
    """An argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a number, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite float > 0 (a time limit: 0 would allow nothing)."""
    value = tolerance(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds, not 0")
    return value


def example_shape(shape) -> str:
    """`N,20` -> `1,20`: a shape for --input-shape with every symbolic dim 1."""
    return ",".join(str(d) if isinstance(d, int) else "1" for d in shape)


def symbolic_or_int(text: str, option: str, low: int):
    """A size (an int >= `low`) or a symbolic dim name, as `option` takes it."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        if int(text) < low:
            raise UsageError(f"{option}: a size must be at least {low}, not {text}")
        return int(text)
    if not text.isidentifier():
        raise UsageError(f"{option}: {text!r} is neither a size nor a symbolic dim name")
    return text


def parse_input_shape(text: str) -> tuple[str, tuple]:
    """`name=1,3,224,224` (dims may be symbolic names: `input=N,3,224,224`)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--input-shape expects name=d0,d1,..., not {text!r}")
    shape = tuple(symbolic_or_int(d, "--input-shape", 0) for d in dims.split(",")) \
        if dims.strip() else ()
    return name, shape


def check_writable(path: Path, option: str) -> None:
    """Refuse a file that cannot be written before spending minutes compiling for it."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{option} {str(path)!r}: folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a folder, not a file")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {str(path)!r}: folder {str(folder)!r} is not writable")


COMMON_FLAGS = ("quiet", "verbose", "json")
"""What `common_options` adds: every command takes them after its name, and `dnnc` before it
(`dnnc -q compile ...`)."""


def common_options(parser) -> None:
    """-q, -v and --json. They are absent from the namespace unless given (a subcommand's
    defaults would overwrite the values given before it); `settle_common_options` fills
    them in."""
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                          help="no progress: warnings and errors only")
    loudness.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                          help="also debug details (each pass's time, each segment compiled)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the result as one JSON object on stdout")


def settle_common_options(args) -> None:
    """-q, -v and --json given before the command or after it (False when neither)."""
    for flag in COMMON_FLAGS:
        setattr(args, flag, getattr(args, flag, False))
    if args.quiet and args.verbose:
        raise UsageError("-q and -v exclude each other (see dnnc --help)")


def cache_option(parser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="compile anew: neither read nor fill the on-disk compile cache "
                             "(DNNC_CACHE_DIR; docs/cli.md)")


def shape_option(parser) -> None:
    parser.add_argument("--input-shape", action="append", default=[],
                        metavar="NAME=D0,D1,...",
                        help="fix an input's shape (dims may be symbolic names; repeatable)")


def precision_option(parser) -> None:
    from ...ir.target import PRECISIONS

    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="arithmetic of dense products and convolutions: fp32 "
                             "(default); cuda: tf32, fp16, bf16 on tensor cores with fp32 "
                             "accumulation, fp16 and bf16 also storing weights and "
                             "activations in that type (inputs and outputs stay float32); "
                             "llvm: bf16 (AVX512_BF16 where the CPU has it). "
                             "Outputs within 16 units of the precision's roundoff of the "
                             "largest fp32 output (fp16 and tf32: 7.8e-3, bf16: 6.3e-2; "
                             "docs/cuda_backend.md, Precision)")


def print_json(doc) -> None:
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
