"""`dnnc inspect`: summarise an ONNX model or an artifact (inputs, outputs, op counts,
parameters, estimated FLOPs), optionally its graph IR, the pass pipeline's effect (--passes)
and a drawing of its kernels (--draw, timed with --profile).

The summaries themselves are `compiler/inspect.py`'s and the drawing `compiler/draw.py`'s;
this module only reads the options, calls them and prints. It never writes a file other than
--draw's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ...errors import UnsupportedOpError
from ...levels import DEFAULT_OPT_LEVEL
from .exits import UsageError, one_line
from .models import import_graph, random_inputs
from .options import check_writable, parse_input_shape, print_json

log = logging.getLogger(__name__)


def add_parser(sub, targets: list[str], default: str):
    """The `inspect` subcommand's parser; `targets` and `default` are --target's choices."""
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
    ins.set_defaults(run=run)
    return ins


def run(args) -> int:
    from ..artifact import is_artifact
    from ..module import load
    from ..inspect import format_passes, format_summary, pass_report, summarize, summarize_onnx
    from ...backends.registry import default_target

    shapes = dict(parse_input_shape(s) for s in args.input_shape)
    artifact = None
    if not (args.passes or args.draw) and (args.target is not None or
                                           args.opt_level is not None):
        raise UsageError("--target and --opt-level go with --passes or --draw")
    if args.profile and not args.draw:
        raise UsageError("--profile goes with --draw (bench --profile times a model)")
    if args.draw:
        if Path(args.draw).suffix.lower() != ".svg":   # it writes SVG, whatever the name
            raise UsageError(f"--draw writes SVG: name the file .svg, not {args.draw!r}")
        check_writable(Path(args.draw), "--draw")
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
            graph = import_graph(args.model, shapes)
        except UnsupportedOpError as exc:
            if args.ir or args.passes or args.draw:   # they need the imported graph
                raise
            from ...frontend.onnx import load_model_proto

            log.warning(one_line(exc))
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
        print_json(doc)
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
    from ...passes.manager import optimize
    from ..draw import draw, kernels_of
    from ..driver import compile
    from ...backends.registry import REGISTRY

    shares = None
    if artifact is not None:
        graph = artifact.graph
    elif args.profile:
        if not REGISTRY[target].generates_code:
            raise UsageError(f"--profile: the {target} target runs no kernels")
        log.info(f"compiling for {target} to profile each kernel")
        model = compile(graph, target=target, opt_level=opt_level, progress=not args.quiet,
                        cache=False)   # a cached compile keeps no kernel list to time
        feeds = random_inputs(model, {}, {}, np.random.default_rng(0))
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


def _artifact_summary(model) -> dict:
    manifest, stats = model.manifest, model.stats
    return {"dnnc_version": manifest["dnnc_version"], "target": model.target,
            "cpu": manifest["target"].get("cpu"), "kernels": stats["kernels"],
            "specializations": stats.get("specializations", 0),
            "host_fallbacks": stats["host_fallbacks"]}
