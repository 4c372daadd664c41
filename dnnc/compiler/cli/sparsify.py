"""`dnnc sparsify`: magnitude-prune a model's Conv, Gemm and MatMul weights to a sparsity (per
layer, unstructured, N:M or in blocks), write the pruned ONNX file, and report each layer's
sparsity and the output error on seeded random inputs.

The pruning and the measurement are `compiler/sparsify.py`'s; this module reads the options
and reports. It never compiles the model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ...backends.registry import REGISTRY
from .exits import UsageError
from .models import check_model_file
from .options import check_writable, int_at_least, print_json


def sparsity(text: str) -> float:
    """An argparse type: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a number, not {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (0.9: 90% of each layer's "
                                         f"weights zero), not {text}")
    return value


def add_parser(sub, targets: list[str], default: str):
    """The `sparsify` subcommand's parser (it takes no target)."""
    sp = sub.add_parser("sparsify", help="magnitude-prune a model's weights to a sparsity",
                        description="Zero the smallest weights of every Conv, Gemm and "
                                    "MatMul layer (per layer), write the pruned model, and "
                                    "report each layer's sparsity and the output error on "
                                    "random inputs.")
    sp.add_argument("model", help="an .onnx file")
    sp.add_argument("-o", "--output", required=True, help="the pruned .onnx file to write")
    sp.add_argument("--sparsity", type=sparsity, default=None,
                    help="fraction of each layer's weights to zero, in [0, 1) (needed "
                         "unless the pattern is N:M, which implies it)")
    sp.add_argument("--pattern", default="unstructured",
                    help="unstructured (default), N:M (2:4: the 2 largest of every 4 along "
                         "the reduction kept) or RxC blocks (4x1: 4 outputs by 1; 1x4)")
    sp.add_argument("--keep", action="append", default=[], metavar="NAME",
                    help="a layer (its node's or its weight's name) to leave dense "
                         "(repeatable)")
    sp.add_argument("--include-depthwise", action="store_true",
                    help="prune depthwise convolutions too (left dense by default)")
    sp.add_argument("--samples", type=int_at_least(0), default=4,
                    help="random inputs the output error is measured on (default 4; 0: "
                         "no measurement)")
    sp.add_argument("--seed", type=int_at_least(0), default=0,
                    help="seed of the random inputs (default 0)")
    reference = next(iter(REGISTRY))   # dnnc's reference target (registered first)
    sp.add_argument("--reference", choices=(reference, "onnxruntime"), default=reference,
                    help="what runs both models for the error: dnnc's numpy reference "
                         "(default) or onnxruntime")
    sp.set_defaults(run=run)
    return sp


def run(args) -> int:
    from ...frontend.onnx import load_model_proto
    from ..sparsify import output_error, parse_pattern, prune

    output = Path(args.output)
    check_writable(output, "-o")
    parse_pattern(args.pattern)   # a bad pattern is refused before the model is read
    if Path(args.model).resolve() == output.resolve():
        raise UsageError("-o: write the pruned model to another file than the dense one")
    check_model_file(args.model)
    model = load_model_proto(args.model)
    pruning = prune(model, args.sparsity, args.pattern, keep=args.keep,
                    include_depthwise=args.include_depthwise, progress=not args.quiet)
    import onnx

    onnx.save(pruning.model, output)
    errors = output_error(model, pruning.model, args.samples, args.seed, args.reference,
                          progress=not args.quiet) if args.samples else []
    zeros, total = pruning.zeros
    if args.json:
        print_json({"output": str(output), "pattern": pruning.pattern.text,
                    "sparsity": pruning.sparsity, "zeros": zeros, "weights": total,
                    "layers": [vars(r) for r in pruning.layers],
                    "reference": args.reference if errors else None,
                    "outputs": [vars(e) for e in errors]})
        return 0
    _print_layers(pruning.layers)
    pruned = sum(not r.dense for r in pruning.layers)
    print(f"wrote {output}: {pruned} of {len(pruning.layers)} layers pruned "
          f"({pruning.pattern.text}, sparsity {pruning.sparsity:g}); {zeros:,} of {total:,} "
          f"layer weights zero ({zeros / max(total, 1):.1%})")
    for e in errors:
        top1 = f", top-1 agrees on {e.top1:.0%}" if e.top1 is not None else ""
        print(f"output {e.name}: relative error {e.relative:.3g}, max abs error "
              f"{e.max_abs:.3g}{top1} ({args.samples} random input(s), seed {args.seed}, "
              f"{args.reference})")
    return 0


def _print_layers(layers) -> None:
    width = max([len(r.node) for r in layers] + [5])
    print(f"{'layer':<{width}}  {'op':<6}  {'weight shape':<16}  {'before':>6}  {'after':>6}")
    for r in layers:
        note = f"  dense: {r.dense}" if r.dense else ""
        print(f"{r.node:<{width}}  {r.op:<6}  {'x'.join(map(str, r.shape)):<16}  "
              f"{r.before:>6.1%}  {r.after:>6.1%}{note}")
