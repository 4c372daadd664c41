"""`dnnc run`: run an artifact or an ONNX model once on inputs from .npy files (--input) or
random ones (--random), print each output's shape and a summary, optionally save the outputs
(--output-dir).

Every --input, --dim and --random mistake is found before compiling. It never times more
than the one call (that is `dnnc bench`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from ...ir.types import shape_text
from .exits import UsageError
from .models import model_for, random_inputs
from .options import (cache_option, int_at_least, parse_input_shape, precision_option,
                      print_json, shape_option)


def add_parser(sub, targets: list[str], default: str):
    """The `run` subcommand's parser; `targets` and `default` are --target's choices."""
    run_ = sub.add_parser("run", help="run an artifact or an ONNX model once",
                          description="Run a model on inputs from .npy files or random ones; "
                                      "print each output's shape and a summary.")
    run_.add_argument("model", help="a .dnnc artifact or an .onnx file")
    run_.add_argument("--target", default=None, choices=targets,
                      help=f"target for an ONNX model (default {default})")
    run_.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                      help="an input's data (repeatable)")
    run_.add_argument("--random", action="store_true",
                      help="random data for the inputs not given with --input")
    run_.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                      help="size of a symbolic dim for --random (default 1; repeatable)")
    run_.add_argument("--seed", type=int_at_least(0), default=0,
                      help="seed of --random (default 0)")
    run_.add_argument("--output-dir", help="save each output as DIR/NAME.npy")
    precision_option(run_)
    shape_option(run_)
    cache_option(run_)
    run_.set_defaults(run=run)
    return run_


def run(args) -> int:
    shapes = dict(parse_input_shape(s) for s in args.input_shape)
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

    model = model_for(args, shapes, check)
    feeds = {**given, **random_inputs(model, given, dims, np.random.default_rng(args.seed))}
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
        print_json({"target": model.target, "seconds": elapsed, "compile_seconds": jit,
                    "outputs": summaries, "output_dir": args.output_dir})
        return 0
    for o in summaries:
        summary = ""
        if "min" in o:
            summary = f"  min {o['min']:.6g}  max {o['max']:.6g}  mean {o['mean']:.6g}"
            if o["non_finite"]:
                summary += f"  ({o['non_finite']} non-finite)"
        print(f"{o['name']}: {o['dtype']}{shape_text(o['shape'])}{summary}")
    saved = f", outputs saved in {args.output_dir}" if args.output_dir else ""
    compiling = f" (of which {jit:.2f} s compiling for these shapes)" if jit > 0 else ""
    print(f"ran in {elapsed * 1e3:.3f} ms on {model.target}{compiling}{saved}")
    return 0


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
            feeds[name] = _one_array(np.load(file, allow_pickle=False), name, file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--input {name}: cannot read {file!r}: "
                             f"{_why_unreadable(exc, file)}") from exc
    return feeds


def _one_array(loaded, name: str, file: str) -> np.ndarray:
    """The array of an .npy, or of an .npz holding one."""
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        return loaded
    with loaded:
        if len(loaded.files) != 1:
            raise UsageError(f"--input {name}: {file!r} holds {len(loaded.files)} arrays "
                             f"({', '.join(loaded.files)}); give a file of one array")
        return loaded[loaded.files[0]]


def _why_unreadable(exc: Exception, file: str) -> str:
    """Why NumPy could not load `file`, in words: NumPy blames pickles for any file that is
    not an .npy or .npz (allow_pickle=False makes it refuse to try them)."""
    if isinstance(exc, OSError):
        return getattr(exc, "strerror", None) or str(exc)
    with open(file, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        return "an .npy of Python objects (dtype object), which no model input takes"
    if magic.startswith(b"PK"):
        return str(exc)
    return "not a NumPy file (.npy, or .npz of one array; save one with numpy.save)"


def _safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name) or "output"


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
