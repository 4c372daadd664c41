"""The differential fuzzer: random valid ONNX models, run on a dnnc target and compared with
dnnc's numpy target (the oracle) and with onnxruntime (when installed).

    python -m dnnc.testing.fuzz --cases N --seed S [--target T] [--opt-level L]
                                [--threads K] [--out DIR] [--case I] [--timeout S] [--special]

Each case (`generate.generate(seed, index)`) runs twice on one compiled model: fresh random
inputs, and a new batch size when the batch is symbolic. The target runs in a long-lived worker
process (`worker.py`), restarted after a crash (a signal) or a hang (`--timeout`), so both are
caught and reported; the references run in this process meanwhile. Outputs downstream of a
QuantizeLinear may also differ by their per-element rounding bounds (`rounding.py`). A finding
is saved under
`--out` (model, inputs, what differed) and minimised (`minimize.py`). A difference from
onnxruntime that dnnc's two targets agree on and that matches `KNOWN_DIFFERENCES` is counted
as a known difference, not a failure. `--special` draws the special-values cases (inputs with
+-inf, NaN, huge values, +-0 and subnormals; `generate.generate(..., special=True)`). Exit
status: 0 no finding, 1 a finding, 2 bad usage. See docs/fuzzing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ..ir.target import UNIT_ROUNDOFF
from ..levels import DEFAULT_OPT_LEVEL
from . import rounding, worker as worker_protocol
from .generate import Case, generate
from .op_generators import DYNAMIC_OPS, MASK_OPS, OPS, SPARSE_OPS

# ---------------------------------------------------------------------------------------------
# Tolerances

FLOAT_RTOL = 1e-4
FLOAT_ATOL = 1e-4
"""float32 results agree when |got - want| <= RTOL * |want| + ATOL * max(1, mean |want|).
The cases chain up to ten ops of unit-scale values; reordered float32 sums (dnnc's vectorised
and blocked reductions next to onnxruntime's MLAS, next to NumPy's pairwise sums) differ by a
few ulps per term, and dnnc's polynomial exp/erf by a few ulps: over 300 cases (seed 21, llvm,
opt level 3) the largest |got - want| / (|want| + max(1, mean |want|)) was 4.3e-6 against
the numpy target and 3.6e-6 against onnxruntime (outside known differences), 23x below the
limit. Wrong indexing, races and wrong semantics give errors of the order of the values. The absolute
part scales with the output's mean magnitude so that an element near zero, left by the
cancellation of large terms, is judged against the size of those terms. Integers and
booleans must be equal; NaN matches NaN, and an infinity only the same infinity."""


PRECISION_UNITS = 32
"""At a reduced precision (`--precision`), an output may be off by this many units of the
precision's roundoff (2^-11 at tf32 and fp16, 2^-8 at bf16), relative and absolute (against
the output's scale) where fp32 allows FLOAT_RTOL and FLOAT_ATOL: a check for wrong
code (a misread 16-bit buffer, a lost cast, a wrong fragment: errors of the output's own
size), not for the precision's accuracy contract, which docs/cuda_backend.md states per
kernel and the tests check with derived bounds."""


def tolerance(precision: str) -> tuple[float, float]:
    """(rtol, atol) of `close` for a compile at `precision`."""
    if precision == "fp32":
        return FLOAT_RTOL, FLOAT_ATOL
    unit = PRECISION_UNITS * UNIT_ROUNDOFF[precision]
    return unit, unit


def close(got: np.ndarray, want: np.ndarray, bound: np.ndarray | None = None,
          tol: tuple[float, float] = (FLOAT_RTOL, FLOAT_ATOL)) -> tuple[bool, float]:
    """(whether got matches want, the largest error relative to the tolerance's scale);
    `bound`: the output is downstream of a QuantizeLinear, and each element may also differ
    by its bound (`rounding.bounds`: what rounding at a near-tie upstream can do)."""
    if got.shape != want.shape:
        return False, float("inf")
    bound = np.zeros(want.shape) if bound is None else \
        np.broadcast_to(np.nan_to_num(bound, nan=np.inf), want.shape)   # inf * 0: no bound
    if want.dtype.kind not in "fc":
        if got.dtype.kind in "fc":
            return False, float("inf")
        bad = np.abs(got.astype(np.int64) - want.astype(np.int64)) > bound
        return not bad.any(), float(bad.sum())
    g, w = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(g) & np.isnan(w)
    same_inf = np.isinf(w) & (g == w)
    scale = max(1.0, float(np.mean(np.abs(w[np.isfinite(w)])))) if np.isfinite(w).any() else 1.0
    with np.errstate(invalid="ignore"):
        err = np.abs(g - w)
        limit = tol[0] * np.abs(w) + tol[1] * scale + bound
        # (an infinity matches only itself: the relative limit of an infinite want is inf)
        bad = ~(both_nan | same_inf | (np.isfinite(g) & np.isfinite(w) & (err <= limit)))
    worst = float(np.max(np.where(bad, np.nan_to_num(err, nan=np.inf), 0) / scale)) \
        if g.size else 0.0
    return not bad.any(), worst


# ---------------------------------------------------------------------------------------------
# Known semantic differences from onnxruntime

@dataclass(frozen=True)
class KnownDifference:
    """A place where onnxruntime's result differs from the ONNX spec's reading, which dnnc
    follows. A mismatch with onnxruntime only (dnnc's targets agree with each other) in an
    output that such a node feeds is classified under `name`, never hidden; a `nan_only`
    entry applies only when a differing element is NaN on one side, an `inf_only` one when it
    is infinite or NaN (an overflow upstream is inf there, or NaN after inf - inf), or when
    an op between the node and the output can turn a NaN or inf into an ordinary value
    (`LAUNDERING`: a comparison, Where, Pow, a cast to an integer type)."""

    name: str
    ops: tuple
    applies: object          # fn(attrs, [(shape, constant value or None) per input]) -> bool
    spec: str                # the spec's reading, which dnnc implements
    onnxruntime: str         # what onnxruntime does instead
    nan_only: bool = False
    inf_only: bool = False


def _resize_fractional_align_corners(attrs: dict, inputs: list) -> bool:
    if attrs.get("coordinate_transformation_mode", b"half_pixel") != b"align_corners":
        return False
    (shape, _), scales = inputs[0], inputs[2][1] if len(inputs) > 2 else None
    if scales is None or not len(scales):
        return False   # sizes given: the lengths are whole
    return any(isinstance(n, int) and float(n * s) != int(n * s)
               for n, s in zip(shape, scales.astype(np.float64)))


def _resize_nearest_fractional_downscale(attrs: dict, inputs: list) -> bool:
    if attrs.get("mode", b"nearest") != b"nearest":
        return False
    shape = inputs[0][0]
    scales = inputs[2][1] if len(inputs) > 2 and inputs[2][1] is not None and \
        len(inputs[2][1]) else None
    sizes = inputs[3][1] if len(inputs) > 3 else None
    if scales is not None:
        ratios = [float(s) for s in scales]
    elif sizes is not None:
        ratios = [o / n if isinstance(n, int) else 1.0 for o, n in zip(sizes, shape)]
    else:
        return False
    return any(0 < r < 1 and not float(1 / r).is_integer() for r in ratios)


def _padded(attrs: dict, inputs: list) -> bool:
    return any(attrs.get("pads", ())) or attrs.get("auto_pad", b"NOTSET") != b"NOTSET" or \
        bool(attrs.get("ceil_mode", 0))


def _clip_without_a_bound(attrs: dict, inputs: list) -> bool:
    return len(inputs) < 3 or any(shape is None for shape, _ in inputs[1:])   # "" inputs


def _resize_interpolating(attrs: dict, inputs: list) -> bool:
    return attrs.get("mode", b"nearest") in (b"linear", b"cubic")


KNOWN_DIFFERENCES = [
    KnownDifference(
        "resize-align-corners-fractional", ("Resize",), _resize_fractional_align_corners,
        spec="align_corners maps x_resized to x_resized * (length_original - 1) / "
             "(length_resized - 1), with length_resized = floor(length_original * scale) "
             "(onnx.reference agrees)",
        onnxruntime="when length_original * scale is not whole, onnxruntime samples other "
                    "positions (measured: 5 -> 3 rows at scale 0.75, any mode); whole "
                    "lengths agree"),
    KnownDifference(
        "resize-nearest-fractional-downscale", ("Resize",),
        _resize_nearest_fractional_downscale,
        spec="x_original from the coordinate transformation, then nearest_mode's rounding "
             "(onnx.reference agrees)",
        onnxruntime="downscaling by a ratio whose inverse is not whole (0.6, 1/3, 2/13), "
                    "some outputs take the input pixel before (measured: 6 -> 3 at scale 0.6, "
                    "half_pixel, floor); whole inverses (0.5) and upscaling agree"),
    KnownDifference(
        "nan-in-max", ("MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin"),
        lambda attrs, inputs: True, nan_only=True,
        spec="the spec does not say; dnnc propagates a NaN in a window or reduced slice, as "
             "np.max, the Max op (NaN in, NaN out) and every other dnnc reduction do",
        onnxruntime="ReduceMax, ReduceMin and GlobalMaxPool drop NaNs; MaxPool propagates a "
                    "NaN from some window positions only"),
    KnownDifference(
        "nan-in-resize-taps", ("Resize",), _resize_interpolating, nan_only=True,
        spec="a NaN reaches the outputs whose interpolation reads it (onnx.reference agrees)",
        onnxruntime="linear resize spreads a NaN to a different set of outputs (measured: "
                    "4x4 -> 8x8, half_pixel: 25 NaN outputs where onnx.reference has 16)"),
    KnownDifference(
        "huge-in-batchnorm", ("BatchNormalization",), lambda attrs, inputs: True,
        inf_only=True,
        spec="the operator doc's (x - mean) / sqrt(var + epsilon) * scale + bias, in that "
             "order: near FLT_MAX the division overflows to inf (onnx.reference multiplies "
             "by scale first: finite there too)",
        onnxruntime="x * (scale / sqrt(var + epsilon)) + (bias - mean * scale / ...), folded "
                    "once: finite where the doc's order overflows (measured: x = FLT_MAX, "
                    "var 0.753, scale 0.461: 1.809e38 where the doc's order gives inf)"),
    KnownDifference(
        "uint32-cast-out-of-range", ("Cast",),
        lambda attrs, inputs: attrs.get("to") == onnx.TensorProto.UINT32,
        spec="the spec leaves it open; dnnc gives docs/semantics.md's table on every target: "
             "x >= 2**31 ? s32(x - 2**31) ^ MIN : s32(x) (NaN, -inf, x < -2**31: 2**31; "
             "x >= 2**32: 0), onnxruntime's own result in its vector loop",
        onnxruntime="depends on the element's position: its vector loop (groups of 4) gives "
                    "the table, the last n % 4 elements go through int64 and keep its low 32 "
                    "bits (measured: -FLT_MAX is 2**31 at index 0 of 5 and 0 at index 4; "
                    "5e9 is 0 and 705032704)"),
    KnownDifference(
        "inf-in-clip-without-a-bound", ("Clip",), _clip_without_a_bound, inf_only=True,
        spec="a missing min or max input clips nothing on that side: Clip(inf) is inf "
             "(onnx.reference agrees)",
        onnxruntime="a missing bound is the float's limit: Clip(+-inf) without max (min) is "
                    "+-FLT_MAX (measured: Clip(x, min=-1) of inf is 3.4028235e38)"),
    KnownDifference(
        "subnormal-in-tanh", ("Tanh",), lambda attrs, inputs: True, nan_only=True,
        spec="tanh of a subnormal x is x (to an ulp), so Tanh(1.4e-45) * -inf is -inf",
        onnxruntime="its Tanh returns 0 for the smallest subnormals (1.4e-45 -> 0, -1e-40 -> "
                    "-9.994e-41): 0 times inf further on is NaN (measured; seed 4043 special "
                    "case 1686)"),
    KnownDifference(
        "neg-inf-in-padded-maxpool", ("MaxPool",), _padded, inf_only=True,
        spec="padding takes no part in the max: a window of padding and -inf is -inf "
             "(onnx.reference agrees)",
        onnxruntime="padding counts as the float's lowest value: such a window is -FLT_MAX "
                    "(measured: MaxPool 1x2, pads [0,1,0,0] of [-inf, -inf] gives "
                    "[-3.4028235e38, -inf])"),
]
"""Known differences from onnxruntime, each checked against onnx.reference where it has a
reading; docs/fuzzing.md lists them too."""


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def known_difference(model: onnx.ModelProto, output: str, nan: bool = False,
                     inf: bool = False) -> KnownDifference | None:
    """The known difference some node upstream of `output` matches, if any; `nan` (`inf`):
    a differing element is NaN (infinite) on one side."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: tuple(d.dim_value if d.HasField("dim_value") else d.dim_param
                            for d in v.type.tensor_type.shape.dim)
              for v in list(inferred.graph.value_info) + list(inferred.graph.input) +
              list(inferred.graph.output)}
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and "value" in _attrs(n):
            constants[n.output[0]] = onnx.numpy_helper.to_array(_attrs(n)["value"])
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    seen, stack = set(), [(output, False)]
    while stack:
        name, laundered = stack.pop()
        node = producer.get(name)
        if node is None or (name, laundered) in seen:
            continue
        seen.add((name, laundered))
        inputs = [(shapes.get(i), constants.get(i)) for i in node.input]
        for known in KNOWN_DIFFERENCES:
            if node.op_type in known.ops and (nan or laundered or not known.nan_only) and \
                    (inf or nan or laundered or not known.inf_only) and \
                    known.applies(_attrs(node), inputs):
                return known
        after = laundered or node.op_type in LAUNDERING or \
            node.op_type == "Cast" and _attrs(node).get("to") not in FLOAT_TYPES
        stack.extend((i, after) for i in node.input)
    return None


LAUNDERING = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "IsNaN",
                        "IsInf", "Where", "ArgMax", "ArgMin", "Pow", "TopK", "Sign"})
"""Ops whose output can be finite and a number where an input is NaN or infinite (a comparison
of NaN is false, Pow(NaN, 0) is 1, a Where picks the other side): a NaN or inf difference
upstream of one (a `nan_only` or `inf_only` known difference) may reach the output as an
ordinary difference. Casts to integer types launder too (`docs/semantics.md`)."""

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16)


# ---------------------------------------------------------------------------------------------
# Running: the target in a worker process, the references here


@dataclass
class Outcome:
    """How one case went: status is pass, mismatch, known, crash, timeout or error."""

    status: str
    cls: str = ""                 # e.g. "numpy:ReduceSum", "SIGSEGV", "CompileError"
    detail: dict = field(default_factory=dict)

    @property
    def finding(self) -> bool:
        return self.status in ("mismatch", "crash", "timeout", "error")


class Worker:
    """A long-lived process that compiles and runs models for the target under test;
    restarted after a crash or a timeout. `argv` replaces the worker command (tests)."""

    def __init__(self, threads: int | None, timeout: float, argv: list[str] | None = None):
        self.threads = threads
        self.timeout = timeout
        self.argv = argv or [sys.executable, "-m", "dnnc.testing.worker"]
        self.proc: subprocess.Popen | None = None
        self.stderr = tempfile.TemporaryFile()
        self.starts = 0

    def _start(self) -> None:
        env = dict(os.environ)
        if self.threads:
            env["DNNC_NUM_THREADS"] = str(self.threads)
        self.stderr.seek(0)
        self.stderr.truncate()
        self.starts += 1
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env, bufsize=0)

    def submit(self, request: dict) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            worker_protocol.write_message(self.proc.stdin, request)
        except BrokenPipeError:
            pass   # it died at once; result() reports how

    def result(self) -> dict:
        """The reply, or {"crash": how} / {"timeout": seconds} after which it is restarted."""
        deadline = time.monotonic() + self.timeout
        reader = _DeadlineReader(self.proc.stdout, deadline)
        try:
            reply = worker_protocol.read_message(reader)
        except TimeoutError:
            self.stop()
            return {"timeout": self.timeout}
        if reply is not None:
            return reply
        code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace")[-1500:]
        self.proc = None
        how = (signal.Signals(-code).name if code < 0 and -code in signal.valid_signals()
               else f"exit {code}")
        return {"crash": how, "stderr": tail}

    @property
    def restarts(self) -> int:
        """Workers started after a crash or a timeout ended the previous one."""
        return max(0, self.starts - 1)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None


class _DeadlineReader:
    """Reads from a pipe, raising TimeoutError past `deadline`."""

    def __init__(self, stream, deadline: float):
        self.stream = stream
        self.deadline = deadline

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0 or not select.select([self.stream], [], [], left)[0]:
            raise TimeoutError
        return self.stream.readinto(buffer)


def numpy_outputs(model: bytes, runs: list[dict]) -> list[list[np.ndarray]]:
    """The oracle: dnnc's numpy target (the op registry's NumPy references)."""
    import dnnc

    compiled = dnnc.compile(model, target="numpy")
    return [compiled.run(**run) for run in runs]


def ort_outputs(model: bytes, runs: list[dict]) -> list[list[np.ndarray]] | None:
    """onnxruntime's results (its graph optimisations off: the plain kernels), or None when
    it is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.set_default_logger_severity(4)   # its refusals are counted, not printed
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return [session.run(None, run) for run in runs]


def differences(got: list[list[np.ndarray]], want: list[list[np.ndarray]],
                names: list[str], bounds: list[dict] | None = None,
                tol: tuple[float, float] = (FLOAT_RTOL, FLOAT_ATOL)) -> list[dict]:
    """Each (run, output) where got and want differ: which, by how much, whether a NaN is
    involved; `bounds`: per run, `rounding.bounds` of the outputs downstream of a
    QuantizeLinear."""
    found = []
    for run, (g_outs, w_outs) in enumerate(zip(got, want)):
        for name, g, w in zip(names, g_outs, w_outs):
            g, w = np.asarray(g), np.asarray(w)
            ok, err = close(g, w, bounds[run].get(name) if bounds else None, tol)
            if not ok:
                comparable = g.shape == w.shape and w.dtype.kind == "f"
                nan = bool(comparable and np.any(np.isnan(g) != np.isnan(w)))
                inf = bool(comparable and np.any(np.isinf(g) != np.isinf(w)))
                found.append({"run": run, "output": name, "error": err, "dtype": str(w.dtype),
                              "got_shape": list(g.shape), "want_shape": list(w.shape),
                              "nan": nan, "inf": inf})
    return found


class Checker:
    """Runs one model with given inputs on the target and the references: an Outcome."""

    def __init__(self, worker: Worker, target: str = "llvm", opt_level: int = DEFAULT_OPT_LEVEL,
                 use_ort: bool = True, precision: str = "fp32"):
        self.worker = worker
        self.target = target
        self.opt_level = opt_level
        # (at a reduced precision onnxruntime, fp32 too, would only repeat the numpy check)
        self.use_ort = use_ort and precision == "fp32"
        self.precision = precision
        self.tol = tolerance(precision)
        self.ort_refusals = 0

    def check(self, model: onnx.ModelProto, runs: list[dict]) -> Outcome:
        data = model.SerializeToString()
        self.worker.submit({"model": data, "runs": runs, "target": self.target,
                            "opt_level": self.opt_level, "precision": self.precision})
        names = [o.name for o in model.graph.output]
        oracle, oracle_error, bounds = None, None, None
        try:   # meanwhile, the references
            oracle = numpy_outputs(data, runs)
            bounds = rounding.bounds(model, runs, None if self.precision == "fp32" else
                                     self.tol[0])
        except Exception as exc:
            oracle_error = (type(exc).__name__, str(exc)[:2000])
        ort_result, ort_error = None, None
        if self.use_ort:
            try:
                ort_result = ort_outputs(data, runs)
            except Exception as exc:
                ort_error = f"{type(exc).__name__}: {str(exc)[:500]}"
        reply = self.worker.result()
        producer = {o: n.op_type for n in model.graph.node for o in n.output}
        if "crash" in reply:
            return Outcome("crash", reply["crash"], {"stderr": reply["stderr"]})
        if "timeout" in reply:
            return Outcome("timeout", "timeout", {"seconds": reply["timeout"]})
        if "error" in reply:
            return Outcome("error", f"{self.target}:{reply['error'][0]}",
                           {"message": reply["error"][1]})
        if oracle_error:
            return Outcome("error", f"numpy:{oracle_error[0]}", {"message": oracle_error[1]})
        got = reply["outputs"]
        diffs = differences(got, oracle, names, bounds, self.tol)
        if diffs:
            return Outcome("mismatch", f"numpy:{producer.get(diffs[0]['output'], '?')}",
                           diffs[0])
        if ort_error is not None:
            self.ort_refusals += 1
            return Outcome("pass", detail={"onnxruntime": ort_error})
        if ort_result is None:
            return Outcome("pass")
        diffs = differences(got, ort_result, names, bounds)
        if not diffs:
            return Outcome("pass")
        for diff in diffs:   # every difference must be a known one
            if known_difference(model, diff["output"], diff["nan"], diff["inf"]) is None:
                return Outcome("mismatch", f"onnxruntime:{producer.get(diff['output'], '?')}",
                               diff)
        return Outcome("known", known_difference(model, diffs[0]["output"], diffs[0]["nan"],
                                                 diffs[0]["inf"]).name, diffs[0])


# ---------------------------------------------------------------------------------------------
# Findings on disk


def save_finding(out: Path, case: Case, runs: list[dict], outcome: Outcome, args) -> Path:
    folder = out / f"seed{case.seed}_case{case.index}"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(case.model, folder / "model.onnx")
    _save_inputs(folder / "inputs.npz", runs)
    info = {"seed": case.seed, "case": case.index, "status": outcome.status,
            "class": outcome.cls, "detail": outcome.detail, "target": args.target,
            "opt_level": args.opt_level, "threads": args.threads, "boost": args.boost,
            "ops": case.ops,
            "symbolic_batch": case.symbolic, "batches": case.batches(),
            "special": case.special,
            "reproduce": f"python -m dnnc.testing.fuzz --seed {case.seed} --case {case.index} "
                         f"--target {args.target} --opt-level {args.opt_level}"
                         + (f" --threads {args.threads}" if args.threads else "")
                         + (" --special" if case.special else "")
                         + "".join(f" --boost {b}" for b in args.boost)}
    (folder / "finding.json").write_text(json.dumps(info, indent=2, default=str))
    return folder


def _save_inputs(path: Path, runs: list[dict]) -> None:
    np.savez(path, **{f"run{r}/{name}": a for r, run in enumerate(runs)
                      for name, a in run.items()})


def load_inputs(path) -> list[dict]:
    """The runs saved by `_save_inputs`: [{input name: array}, ...]."""
    runs: dict[int, dict] = {}
    with np.load(path) as data:
        for key in data.files:
            run, name = key.split("/", 1)
            runs.setdefault(int(run[3:]), {})[name] = data[key]
    return [runs[r] for r in sorted(runs)]


# ---------------------------------------------------------------------------------------------
# The command


class Progress:
    """One updating line on a terminal, plain lines every 10% otherwise."""

    def __init__(self, total: int, stream=sys.stderr, quiet: bool = False):
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.quiet = quiet
        self.start = time.monotonic()
        self.step = max(1, total // 10)

    def update(self, done: int, counts: dict) -> None:
        if self.quiet or (not self.tty and done % self.step and done != self.total):
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / done * (self.total - done) if done else 0.0
        findings = sum(counts.get(k, 0) for k in ("mismatch", "crash", "timeout", "error"))
        line = (f"[{done}/{self.total}] {elapsed:.0f}s elapsed, ETA {eta:.0f}s, "
                f"{findings} finding(s), {counts.get('known', 0)} known difference(s)")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if self.quiet:
            return
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()


def parse_args(argv):
    from ..backends.registry import REGISTRY as TARGETS

    p = argparse.ArgumentParser(prog="python -m dnnc.testing.fuzz",
                                description="Differential fuzzer: random ONNX models on a dnnc "
                                "target against the numpy target and onnxruntime.")
    p.add_argument("--cases", type=int, default=100, help="how many cases (default 100)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    p.add_argument("--start", type=int, default=0, help="index of the first case (default 0)")
    p.add_argument("--case", type=int, default=None,
                   help="run only this case index (reproduce a finding)")
    p.add_argument("--target", default="llvm", help="the target under test (default llvm)")
    p.add_argument("--opt-level", type=int, default=3, help="0..3 (default 3)")
    p.add_argument("--threads", type=int, default=None,
                   help="DNNC_NUM_THREADS for the worker (default: as inherited)")
    p.add_argument("--out", default="fuzz-findings", help="folder for findings")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a case may take before it counts as a hang (default 120)")
    p.add_argument("--no-minimize", action="store_true", help="save findings unminimised")
    p.add_argument("--minimize-seconds", type=float, default=60.0,
                   help="time budget for minimising one finding (default 60)")
    p.add_argument("--no-onnxruntime", action="store_true",
                   help="compare with the numpy target only")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--special", action="store_true",
                   help="special-values cases: inputs with +-inf, NaN, huge values, +-0 and "
                        "subnormals, casts of them to every integer type, softmax over them")
    p.add_argument("--boost", action="append", default=[], metavar="GENERATOR",
                   help="draw this op generator (e.g. qdq; dynamic: quantize_dynamic's products, "
                        "drawn only so; sparse: layers with pruned "
                        "weights in every case) 12 times as often; other cases than without "
                        "it (repeatable)")
    p.add_argument("--precision", default="fp32", choices=("fp32", *UNIT_ROUNDOFF),
                   help="compile at this precision (cuda: tensor cores, half storage; "
                        "llvm: bf16 dense products) and "
                        f"allow {PRECISION_UNITS} units of its roundoff (default fp32)")
    args = p.parse_args(argv)
    problems = []
    if args.cases < 1:
        problems.append(f"--cases must be at least 1, got {args.cases}")
    if args.start < 0 or (args.case is not None and args.case < 0):
        problems.append("--start and --case must be at least 0")
    if args.target not in TARGETS:
        problems.append(f"--target {args.target!r} is not one of {', '.join(TARGETS)}")
    if args.opt_level not in range(4):
        problems.append(f"--opt-level must be 0, 1, 2 or 3, got {args.opt_level}")
    if args.threads is not None and args.threads < 1:
        problems.append(f"--threads must be at least 1, got {args.threads}")
    if args.timeout <= 0:
        problems.append(f"--timeout must be positive, got {args.timeout}")
    known = {fn.__name__[4:] for _, fn in OPS + SPARSE_OPS + MASK_OPS + DYNAMIC_OPS}
    for name in args.boost:
        if name not in known:
            problems.append(f"--boost {name!r} is not one of {', '.join(sorted(known))}")
    if args.minimize_seconds <= 0:
        problems.append(f"--minimize-seconds must be positive, got {args.minimize_seconds}")
    for problem in problems:
        p.error(problem)   # exits with status 2
    return args


def fuzz(args, progress: Progress | None = None, worker_argv=None) -> dict:
    """Run the cases `args` asks for; returns the summary."""
    from .minimize import minimize

    indices = [args.case] if args.case is not None else \
        list(range(args.start, args.start + args.cases))
    worker = Worker(args.threads, args.timeout, worker_argv)
    checker = Checker(worker, args.target, args.opt_level, not args.no_onnxruntime,
                      args.precision)
    progress = progress or Progress(len(indices), quiet=args.quiet)
    counts: dict[str, int] = {}
    classes: dict[str, dict[str, int]] = {}
    findings = []
    start = time.monotonic()
    try:
        for done, index in enumerate(indices, 1):
            case = generate(args.seed, index, tuple(args.boost), special=args.special)
            runs = [case.draw_inputs(r) for r in range(2)]
            outcome = checker.check(case.model, runs)
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
            if outcome.status != "pass":
                by = classes.setdefault(outcome.status, {})
                by[outcome.cls] = by.get(outcome.cls, 0) + 1
            if outcome.finding:
                folder = save_finding(Path(args.out), case, runs, outcome, args)
                note = f"case {index}: {outcome.status} {outcome.cls} -> {folder}"
                if not args.no_minimize and outcome.status != "timeout":
                    small = minimize(case.model, runs, _same_failure(checker, outcome),
                                     max_seconds=args.minimize_seconds)
                    onnx.save(small.model, folder / "minimized.onnx")
                    _save_inputs(folder / "minimized_inputs.npz", small.runs)
                    note += (f" (minimised to {len(small.model.graph.node)} node(s): "
                             f"{', '.join(sorted({n.op_type for n in small.model.graph.node}))})")
                findings.append(note)
                progress.note(note)
            progress.update(done, counts)
    finally:
        worker.stop()
    return {"cases": len(indices), "passed": counts.get("pass", 0),
            "mismatches": classes.get("mismatch", {}), "crashes": classes.get("crash", {}),
            "timeouts": counts.get("timeout", 0), "errors": classes.get("error", {}),
            "known_differences": classes.get("known", {}),
            "onnxruntime_refused": checker.ort_refusals, "worker_restarts": worker.restarts,
            "seconds": round(time.monotonic() - start, 1), "findings": findings}


def _same_failure(checker: Checker, outcome: Outcome):
    """The minimiser's test: the candidate still fails the same way (status and, for crashes
    and errors, the same signal or exception)."""
    def fails(model: onnx.ModelProto, runs: list[dict]) -> bool:
        got = checker.check(model, runs)
        if got.status != outcome.status:
            return False
        if outcome.status == "mismatch":
            return got.cls.split(":")[0] == outcome.cls.split(":")[0]
        return got.cls == outcome.cls
    return fails


def summary_text(s: dict) -> str:
    def by_class(d: dict) -> str:
        return ", ".join(f"{k} x{v}" for k, v in sorted(d.items())) or "none"
    lines = [f"cases {s['cases']}, passed {s['passed']}, "
             f"mismatches {sum(s['mismatches'].values())} ({by_class(s['mismatches'])}), "
             f"crashes {sum(s['crashes'].values())} ({by_class(s['crashes'])}), "
             f"timeouts {s['timeouts']}, errors {sum(s['errors'].values())} "
             f"({by_class(s['errors'])}), known differences "
             f"{sum(s['known_differences'].values())} ({by_class(s['known_differences'])}), "
             f"onnxruntime refused {s['onnxruntime_refused']}, {s['seconds']} s"]
    lines += s["findings"]
    return "\n".join(lines)


def has_finding(s: dict) -> bool:
    return bool(s["mismatches"] or s["crashes"] or s["timeouts"] or s["errors"])


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = fuzz(args)
    print(summary_text(summary))
    return 1 if has_finding(summary) else 0


if __name__ == "__main__":
    sys.exit(main())
