"""`dnnc zoo`: write a model of dnnc's zoo (seeded random weights) as an ONNX file, or list
the models and their builder options.

It never compiles or runs a model.
"""

from __future__ import annotations

import ast

from .exits import UsageError
from .options import print_json, symbolic_or_int


def add_parser(sub, targets: list[str], default: str):
    """The `zoo` subcommand's parser (it takes no target)."""
    zoo = sub.add_parser("zoo", help="write a zoo model (seeded random weights) as ONNX",
                         description="Write a model of dnnc's zoo as an ONNX file.")
    zoo.add_argument("name", nargs="?", help="model name (see --list)")
    zoo.add_argument("-o", "--output", help="the .onnx file to write")
    zoo.add_argument("--batch", default="1",
                     help="batch size, or a name for a symbolic batch dim (default 1)")
    zoo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="a builder option, e.g. --set layers=4 (repeatable)")
    zoo.add_argument("--list", action="store_true",
                     help="list the models and their options, with their defaults")
    zoo.set_defaults(run=run)
    return zoo


def run(args) -> int:
    from ... import zoo

    if args.list:
        options = {name: zoo.config_defaults(name) for name in zoo.MODELS}
        if args.json:
            print_json(options)
        for name, defaults in ([] if args.json else options.items()):
            print(f"{name:<14} " + ", ".join(f"{k}={v}" for k, v in defaults.items()))
        return 0
    if not args.name or not args.output:
        raise UsageError("dnnc zoo needs a model NAME and -o FILE (or --list)")
    config = dict(_parse_setting(s) for s in args.set)
    try:
        model = zoo.build(args.name, batch=symbolic_or_int(args.batch, "--batch", 1),
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
        print_json({"output": args.output, "model": args.name,
                    "nodes": len(model.graph.node), "parameters": params})
    else:
        print(f"wrote {args.output}: {args.name}, {len(model.graph.node)} nodes, "
              f"{params:,} parameters")
    return 0


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


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
