"""The `dnnc` command (also `python -m dnnc`).

    dnnc zoo NAME -o FILE.onnx [--batch N] [--set key=value ...]   write a zoo model
    dnnc zoo --list                                                 list zoo models and options
    dnnc inspect MODEL.onnx [--ir] [--json] [--input-shape name=1,3,224,224 ...]

A user mistake (a bad file, an unknown op, a bad option) prints one line on stderr and exits
with status 1; argparse's usage errors exit with 2. A traceback means a dnnc bug.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys

from ..errors import DNNCError


class UsageError(Exception):
    """A bad option value the CLI itself found; printed as one line."""


def _symbolic_or_int(text: str):
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if not text.isidentifier():
        raise UsageError(f"{text!r} is neither a size nor a symbolic dim name")
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
    shape = tuple(_symbolic_or_int(d) for d in dims.split(",")) if dims.strip() else ()
    return name, shape


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_zoo(args) -> int:
    from .. import zoo

    if args.list:
        for name in zoo.MODELS:
            print(f"{name:<14} {', '.join(zoo.config_options(name))}")
        return 0
    if not args.name or not args.output:
        raise UsageError("dnnc zoo needs a model NAME and -o FILE (or --list)")
    config = dict(_parse_setting(s) for s in args.set)
    try:
        model = zoo.build(args.name, batch=_symbolic_or_int(args.batch), **config)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    import onnx

    try:
        onnx.save(model, args.output)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output!r}: {exc.strerror or exc}") from exc
    params = sum(_numel(t.dims) for t in model.graph.initializer)
    print(f"wrote {args.output}: {args.name}, {len(model.graph.node)} nodes, "
          f"{params:,} parameters")
    return 0


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def cmd_inspect(args) -> int:
    from ..frontend.onnx import import_onnx
    from .inspect import format_summary, summarize

    shapes = dict(_parse_input_shape(s) for s in args.input_shape)
    graph = import_onnx(args.model, input_shapes=shapes)
    unknown = sorted(set(shapes) - {v.name for v in graph.inputs})
    if unknown:
        raise UsageError(f"--input-shape names {', '.join(unknown)}, but the model's inputs "
                         f"are {', '.join(v.name for v in graph.inputs)}")
    summary = summarize(graph)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(format_summary(summary))
    if args.ir:
        print()
        print(graph)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dnnc", description="dnnc, a deep-learning compiler: build, inspect and compile "
                                 "models.")
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

    ins = sub.add_parser("inspect", help="summarise an ONNX model as dnnc imports it",
                         description="Inputs, outputs, op counts, parameters and estimated "
                                     "FLOPs of a model.")
    ins.add_argument("model", help="an .onnx file")
    ins.add_argument("--ir", action="store_true", help="also print the whole graph IR")
    ins.add_argument("--json", action="store_true", help="print the summary as JSON")
    ins.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                     help="fix an input's shape (dims may be symbolic names; repeatable)")
    ins.set_defaults(run=cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `dnnc` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (DNNCError, UsageError) as exc:
        # one line: multi-line messages (UnsupportedOpError's list) are joined
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"dnnc: error: {message}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `dnnc inspect --ir model.onnx | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
