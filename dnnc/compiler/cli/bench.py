"""`dnnc bench`: the median latency (and p90, p99, throughput) of a model on random inputs
for each --batch size, next to onnxruntime's in the same run with the same thread count when
it is installed; with --profile each kernel timed alone, with --trace a Chrome trace of them.

Timing is `CompiledModel`'s (`call_times_ms`, `profile`); this module chooses the inputs,
runs the comparison and prints the table. It never changes how dnnc compiles: only
--threads, through DNNC_NUM_THREADS before the worker pool starts.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from ...version import __version__
from ..module import call_times_ms, warm_up
from .exits import UsageError
from .models import model_for, random_inputs
from .options import (cache_option, check_writable, int_at_least, parse_input_shape,
                      precision_option, print_json, shape_option)

log = logging.getLogger(__name__)

PROFILE_TOP = 10
"""Kernels `bench --profile` lists per batch, the slowest first (the JSON and the trace have
every one)."""


def add_parser(sub, targets: list[str], default: str):
    """The `bench` subcommand's parser; `targets` and `default` are --target's choices."""
    bench = sub.add_parser("bench", help="median latency, next to onnxruntime's",
                           description="Median latency of a model on random inputs, and "
                                       "onnxruntime's in the same run with the same thread "
                                       "count when it is installed.")
    bench.add_argument("model", help="an .onnx file (or a .dnnc artifact: no onnxruntime)")
    bench.add_argument("--target", default=None, choices=targets,
                       help=f"target for an ONNX model (default {default})")
    bench.add_argument("--repeat", type=int_at_least(1), default=50,
                       help="timed calls (default 50)")
    bench.add_argument("--warmup", type=int_at_least(0), default=5,
                       help="untimed calls first (default 5), and more until a new batch "
                            "size runs its own code (compiled in the background meanwhile)")
    bench.add_argument("--batch", help="batch sizes for a symbolic batch dim, e.g. 1,8")
    bench.add_argument("--threads", type=int_at_least(1), default=None,
                       help="threads for dnnc and onnxruntime (default: DNNC_NUM_THREADS, "
                            "else every core this process may use)")
    bench.add_argument("--seed", type=int_at_least(0), default=0,
                       help="seed of the random inputs")
    cache_option(bench)
    bench.add_argument("--no-onnxruntime", action="store_true",
                       help="skip the onnxruntime comparison")
    bench.add_argument("--profile", action="store_true",
                       help="also time each kernel alone and list the slowest")
    bench.add_argument("--trace", metavar="FILE.json",
                       help="write the profile as a Chrome trace (Perfetto, chrome://tracing;"
                            " implies --profile)")
    precision_option(bench)
    shape_option(bench)
    bench.set_defaults(run=run)
    return bench


def run(args) -> int:
    from ..artifact import is_artifact

    if args.threads is not None:
        os.environ["DNNC_NUM_THREADS"] = str(args.threads)  # read when the pool starts
    batches = _batches(args.batch)
    shapes = dict(parse_input_shape(s) for s in args.input_shape)
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
    model = model_for(args, shapes, check)
    machine = model.runtime.target
    session = None
    if not args.no_onnxruntime and not is_artifact(args.model):
        session = _ort_session(args.model, machine.threads)
    ort_version = None
    if session is not None:
        import onnxruntime

        ort_version = onnxruntime.__version__
    if not args.json:
        print(_header(args, model, machine, ort_version))
        print(f"{'batch':>6} {'dnnc ms':>12} {'p90':>9} {'p99':>9} {'items/s':>9} "
              f"{'onnxruntime ms':>15} {'dnnc/ort':>9}")
    rows = []
    lanes: dict[str, list[dict]] = {}   # batch -> its kernels' profile
    rng = np.random.default_rng(args.seed)
    for batch in batches:
        dims = {d: batch for d in batch_dims} if batch is not None else {}
        feeds = random_inputs(model, {}, dims, rng)
        if batch is not None:
            log.info(f"batch {batch}: compiling and warming up")
        label, row = _time_batch(args, model, session, feeds, batch)
        rows.append(row)
        if profile:
            log.info(f"batch {label}: profiling each kernel")
            lanes[f"batch {label}"] = row["profile"] = model.profile(
                *[feeds[n] for n in model.input_names], repeat=args.repeat)
            for kernel in row["profile"]:   # the GPU's roofline share (cuda), in the JSON too
                kernel["roofline"] = roofline(kernel, machine)
        if not args.json:
            print(_format_row(label, row))
    if args.json:
        print_json({"model": args.model, "target": model.target, "cpu": machine.cpu,
                    "vector_bits": machine.vector_bits if machine.cpu else None,
                    "threads": machine.threads, "repeat": args.repeat, "warmup": args.warmup,
                    "onnxruntime": ort_version, "rows": rows})
    else:
        for lane, kernels in lanes.items():
            print(_format_profile(lane, kernels, args.repeat, machine))
    if args.trace is not None:
        _write_trace(args, model, machine, lanes)
    return 0


def _batches(text: str | None) -> list[int | None]:
    """--batch's sizes (None: the model's own batch)."""
    if text is None:
        return [None]
    try:
        batches = [int(b) for b in text.split(",")]
    except ValueError:
        raise UsageError(f"--batch expects sizes like 1,8, not {text!r}") from None
    if min(batches) < 1:
        raise UsageError(f"--batch: a size must be at least 1, not {min(batches)}")
    return batches


def _check_profile(args) -> None:
    """`--profile`/`--trace` need kernels to time, known before any compile."""
    from ..artifact import is_artifact
    from ...backends.registry import REGISTRY, default_target

    option = "--profile" if args.profile else "--trace"
    if is_artifact(args.model):
        raise UsageError(f"{option}: an artifact keeps no kernel list to time; give the "
                         f"ONNX model")
    target = args.target or default_target()
    if not REGISTRY[target].generates_code:
        raise UsageError(f"{option}: the {target} target runs no kernels")
    if args.trace is not None:
        check_writable(Path(args.trace), "--trace")


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


def _header(args, model, machine, ort_version: str | None) -> str:
    """The table's first line: the model, the target and its machine, the settings."""
    header = [f"dnnc bench: {args.model}, target {model.target}"]
    if machine.cpu:
        header.append(f"cpu {machine.cpu} ({machine.vector_bits}-bit vectors)")
    header.append(f"{machine.threads} thread(s), median of {args.repeat} after {args.warmup} "
                  f"warm-up")
    if ort_version is not None:
        header.append(f"onnxruntime {ort_version}")
    return ", ".join(header)


def _time_batch(args, model, session, feeds: dict, batch: int | None) -> tuple[str, dict]:
    """One batch size's row of the table: dnnc's median, p90 and p99 and throughput, and
    onnxruntime's median on the same inputs; and the batch as the table labels it. dnnc is
    timed once the size runs its own code (`warm_up`); `batch_split_calls` counts the timed
    segment calls that still ran on another size's code (0 unless warned)."""
    # NumPy in and out, as onnxruntime's: a GPU target's time includes its copies
    args_in = [feeds[n] for n in model.input_names]
    call = lambda: model.run(*args_in, to="numpy")   # noqa: E731
    label = "-" if batch is None else str(batch)
    if batch is None and model.input_types and model.input_types[0].rank:
        label = str(next(iter(feeds.values())).shape[0]) if feeds else "-"
    if not warm_up(model, call, args.warmup):
        log.warning(f"batch {label}: still runs on another batch size's code (its own did "
                    f"not compile); timed as it runs")
    splits = getattr(model.runtime, "split_calls", 0)
    samples = call_times_ms(call, args.repeat, 0)
    splits = getattr(model.runtime, "split_calls", 0) - splits
    ours = float(np.median(samples))
    p90, p99 = (float(np.percentile(samples, q)) for q in (90, 99))
    theirs = None
    if session is not None:
        names = [i.name for i in session.get_inputs()]
        ort_feeds = {n: feeds[n] for n in names if n in feeds}
        theirs = float(np.median(call_times_ms(lambda: session.run(None, ort_feeds),
                                               args.repeat, args.warmup)))
    items = int(label) if label.isdigit() else 1
    return label, {"batch": int(label) if label.isdigit() else None, "dnnc_ms": ours,
                   "dnnc_p90_ms": p90, "dnnc_p99_ms": p99,
                   "throughput_per_s": items * 1e3 / ours,
                   "onnxruntime_ms": theirs, "ratio": ours / theirs if theirs else None,
                   "batch_split_calls": splits}


def _format_row(label: str, row: dict) -> str:
    ours, theirs = row["dnnc_ms"], row["onnxruntime_ms"]
    return (f"{label:>6} {ours:>12.4f} {row['dnnc_p90_ms']:>9.4f} {row['dnnc_p99_ms']:>9.4f} "
            f"{row['throughput_per_s']:>9.1f} "
            f"{(f'{theirs:.4f}' if theirs is not None else 'n/a'):>15} "
            f"{(f'{ours / theirs:.2f}' if theirs else 'n/a'):>9}")


def roofline(kernel: dict, machine) -> float | None:
    """The fraction of its roofline a profiled kernel reaches on a GPU target: the least time
    its FLOPs and bytes take on the card (`ir.target.GPU.roofline_seconds`, tensor cores for
    the tensor-core templates at the target's precision) over its measured time; None on a
    CPU target or where neither count is known."""
    if machine.gpu is None or not kernel.get("ms"):
        return None
    tensor_cores = str(kernel.get("template") or "").startswith("cuda_mma")
    least = machine.gpu.roofline_seconds(kernel.get("flops"), kernel.get("bytes"),
                                         machine.precision, tensor_cores)
    return None if least is None else least / (kernel["ms"] / 1e3)


def _format_profile(lane: str, kernels: list[dict], repeat: int, machine) -> str:
    total = sum(k["ms"] for k in kernels)
    gpu = machine.gpu
    lines = [f"profile, {lane}: {len(kernels)} kernels, each called alone, median of {repeat};"
             f" sum {total:.4f} ms" + (f"; roof: the share of {gpu.name}'s roofline reached"
                                       if gpu is not None else ""),
             f"{'ms':>10} {'share':>6} {'GFLOP/s':>8} {'GB/s':>7}" +
             (f" {'roof':>6}" if gpu is not None else "") + "  kernel (nodes) template {knobs}"]
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
        roof = ""
        if gpu is not None:
            fraction = roofline(k, machine)
            roof = f" {fraction:>6.1%}" if fraction is not None else f" {'-':>6}"
        lines.append(f"{k['ms']:>10.4f} {k['ms'] / (total or 1):>6.1%} {gflops} {gbps}{roof}  "
                     f"{k['kernel']} ({nodes}){knobs}")
    if len(kernels) > PROFILE_TOP:
        lines.append(f"{'':>17}  ... {len(kernels) - PROFILE_TOP} more")
    return "\n".join(lines)


def _write_trace(args, model, machine, lanes: dict[str, list[dict]]) -> None:
    """--trace's Chrome trace of the profiled kernels, a lane per batch size."""
    from ..chrome_trace import chrome_trace

    doc = chrome_trace(lanes, f"dnnc {model.target}: {args.model}",
                       {"model": args.model, "target": model.target, "cpu": machine.cpu,
                        "threads": machine.threads, "repeat": args.repeat,
                        "dnnc_version": __version__})
    Path(args.trace).write_text(json.dumps(doc))
    log.info(f"wrote {args.trace}: {sum(len(k) for k in lanes.values())} kernel events "
             f"(open it in ui.perfetto.dev or chrome://tracing)")

