"""dnnc (llvm target) next to onnxruntime and OpenVINO, measured in one run.

    python bench/cpu.py [--models zoo,torch,light,mlp,FILE.onnx,...] [--batch 1] [--threads N]
                        [--repeat 20] [--opt-level N] [--mattr -avx512f]
                        [--peers onnxruntime,openvino,openvino-f32] [--float16 half-io]
                        [--load busy|alternate] [--blocks 5] [--new-batch 1,3,8]
                        [--shard K/N] [--ort-spin 0|1] [--alone-blocks 3] [--cpu-time]
                        [--precision fp32|bf16] [--compile-jobs N]

`--models` takes model names and sets, comma-separated: a zoo model (`resnet50`), an ONNX file,
or a set: `zoo` (the zoo's models), `torch` and `torch-dynamo` (torchvision-, timm- and
transformers-style architectures written in torch and exported by torch's TorchScript or
dynamo exporter, built once into ~/.cache/dnnc/bench by bench/torch_models.py; needs the
optional torch and onnxscript), `library` and `library-dynamo` (torchvision's, timm's and
transformers' own modules, random weights, where those are installed: bench/library_models.py)
and `light` (the onnx package's light models). Default: zoo.

`--peers` names the runtimes dnnc is timed against (default: all three, those not installed
left out with a note): `onnxruntime` (CPU provider, fp32), `openvino` (its defaults: bf16
arithmetic on a CPU with native bf16, else f32) and `openvino-f32` (INFERENCE_PRECISION_HINT
f32). Each peer's precision is the one its compiled model reports (OpenVINO's
INFERENCE_PRECISION_HINT), printed per model. All run with the same thread count (`--threads`,
else DNNC_NUM_THREADS or the cores this process may use; onnxruntime's intra-op threads and
OpenVINO's INFERENCE_NUM_THREADS set to match), each alone: `--alone-blocks` blocks of
`--repeat` calls per runtime, interleaved, 0.3 s apart. Prints the median block's latency, the
ratio dnnc / peer (the column after each peer's) per model, and their geometric mean per peer.
"check" compares dnnc's outputs with onnxruntime's (fp32 tolerances).

`--cpu-time` (1 thread only): each call timed by this process's CPU time instead of the wall
clock, so that other jobs on a shared machine, which take the core away mid-call, add nothing
(each runtime computes on one thread: onnxruntime on the caller's, OpenVINO on its one
worker's, both counted). 2-core EPYC beside six other jobs (load 17), resnet18, wall / CPU
ms: onnxruntime 35.3 / 15.9, OpenVINO-f32 48.0 / 15.9 (15.9 and 15.3 when the machine was
quiet).

`--compile-jobs N`: every model of the table compiled first, N processes at once, into dnnc's
compile cache (docs/artifacts.md), so that the table's own compiles load them: the "compile
s" column then reads a cache load, the timings are the same code's. On a many-core host this
takes a table's compile time from the sum of its models' to about the slowest one's.

`--precision bf16`: dnnc compiled at `precision="bf16"` (its products on bf16 operands,
fp32 accumulation: docs/llvm_backend.md, "Precision"), the peers unchanged, so the `openvino`
column is issue 32's bf16 bar; "check" then holds dnnc to `model_error_bound("bf16")` of
onnxruntime's largest output.

`--float16 half-io` (or `float-io`): each model's float16 file instead (`zoo.float16`, as
onnxconverter_common writes it; float16 inputs and outputs, or float32 ones), every runtime
on the same file; "check" then holds dnnc to the documented bound of a half file
(docs/llvm_backend.md, "Half-precision files": `model_error_bound("fp16")` of the largest
output, dnnc computing in float32 where onnxruntime rounds to float16 in places).

`--load busy`: how each runtime degrades beside one unrelated busy process (a Python loop
spinning on one core). The busy process is started once and stopped/continued with
SIGSTOP/SIGCONT, so "alone" and "loaded" blocks interleave (alone, loaded, alone, ... for
dnnc, then for onnxruntime, `--blocks` times); each block is the median of `--repeat` calls,
each condition the median of its blocks, with the blocks' spread (max/min). Prints
slowdown = loaded / alone for both and dnnc's slowdown over the peer's, a row per peer.
`--load alternate`: dnnc and a peer called alternately, call by call (each one's idle
threads are the other's load), next to each timed alone. onnxruntime's workers spin for
10-30 ms after each of its calls (its default `session.intra_op.allow_spinning=1`), taking a
core from whatever runs next; dnnc's stop spinning after 20 us. So dnnc's alternating time
mostly measures onnxruntime's spinning: 2-core EPYC, resnet18 26.8 ms alone, 50.2 alternating,
27.0 with `--ort-spin 0` (its own time unchanged: 24.5 / 23.0 / 22.1); `--ort-spin 0` shows
both runtimes sharing cores politely.
On a machine with more cores, confine the run to two (`taskset -c 2,3 python bench/cpu.py
--load busy`): the thread count and the busy process both follow the affinity mask.

`--new-batch 1,3,8`: dynamic batch sizes. Each model is compiled with a symbolic batch and
called at `--batch` (the compile), then at each new size: the first call's milliseconds (what
a new size costs: no compile when the model is batch-separable, `batch_split_calls`) next to a
steady call of that size's own code (compiled, then timed) and onnxruntime's (the only peer
timed there).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import math
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dnnc  # noqa: E402
from dnnc.compiler.module import call_times_ms, warm_up  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.backends.llvm.cpu import cpu_from, host_target  # noqa: E402
from dnnc.ir.target import model_error_bound  # noqa: E402
from dnnc.testing.fuzz import close  # noqa: E402

DEFAULT_MODELS = ["mlp", "cnn", "resnet18", "resnet50", "mobilenet_v2", "bert_tiny", "bert_base"]
EXPORTS = Path.home() / ".cache" / "dnnc" / "bench"


def expand_models(spec: str) -> list[str]:
    """The model names and files `--models` lists, its sets expanded (module docstring)."""
    out: list[str] = []
    for entry in filter(None, spec.split(",")):
        if entry == "zoo":
            out += DEFAULT_MODELS
        elif entry == "light":
            import onnx

            light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
            out += [str(p) for p in sorted(light.glob("light_*.onnx"))]
        elif entry in ("torch", "torch-dynamo"):
            out += torch_exports("dynamo" if entry == "torch-dynamo" else "torchscript")
        elif entry in ("library", "library-dynamo"):
            out += library_exports("dynamo" if entry == "library-dynamo" else "torchscript")
        else:
            out.append(entry)
    return out


def torch_exports(exporter: str) -> list[str]:
    """bench/torch_models.py's architectures exported by `exporter`, built on first use."""
    try:
        import torch_models
    except ImportError as exc:
        sys.exit(f"--models torch needs the optional torch and onnxscript packages "
                 f"(pip install torch==2.13.0 onnxscript): {exc}")
    return torch_models.export_all(torch_models.MODELS, torch_models.export,
                                   EXPORTS / exporter, exporter)


def library_exports(exporter: str) -> list[str]:
    """bench/library_models.py's torchvision, timm and transformers architectures exported by
    `exporter`, built on first use; those whose library is missing here are left out."""
    try:
        import library_models
    except ImportError as exc:
        sys.exit(f"--models library needs the optional torch and onnxscript packages, and "
                 f"torchvision, timm or transformers for its models: {exc}")
    return library_models.export_all(EXPORTS / f"library-{exporter}", exporter)


def compile_ahead(models: list[str], args, jobs: int) -> None:
    """Every model compiled once into dnnc's compile cache, `jobs` processes at once (the
    exports already written: `expand_models`); a model that fails is left to the table's
    own compile, which reports it."""
    work = [(m, args.batch, args.float16, args.opt_level, args.precision, args.mattr)
            for m in models]
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")   # workers read DNNC_NUM_THREADS afresh
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for name, error in pool.map(_compile_into_cache, work):
            if error:
                print(f"# {name}: not compiled ahead ({error})", flush=True)
    print(f"# {len(models)} models compiled ahead in {time.perf_counter() - start:.0f} s, "
          f"{jobs} at once (the compile column reads the cache)", flush=True)


def _compile_into_cache(work: tuple) -> tuple[str, str | None]:
    name, batch, float16, opt_level, precision, mattr = work
    try:
        model, _, _ = load_model(name, batch, float16)
        cpu = cpu_from(mattr=mattr) if mattr else host_target()
        dnnc.compile(model, target="llvm", opt_level=opt_level, cpu=cpu, precision=precision)
        return name, None
    except Exception as e:   # noqa: BLE001 - reported; the table's compile meets it again
        return name, f"{type(e).__name__}: {e}"


def load_model(name: str, batch: int, float16: str | None = None):
    """A zoo model by name, or an ONNX file (a path ending in .onnx: torch's exports from
    bench/torch_models.py, onnx's light models) with its symbolic dims set to `batch`,
    converted to float16 (`zoo.float16`) when `float16` says how ("half-io": its inputs and
    outputs too, "float-io": kept float32); the model, its random inputs (seeded) and the
    name to print."""
    import onnx

    if not name.endswith(".onnx"):
        model, stem = zoo.build(name, batch=batch), name
    else:
        model, stem = onnx.load(name), Path(name).stem
        if Path(name).parent.parent.name == "bench" and \
                Path(name).parent.name.endswith("dynamo"):
            stem += "_dynamo"
    if float16:
        model = zoo.float16(model, keep_io_types=float16 == "float-io")
    dims = {d.dim_param: batch for vi in model.graph.input
            for d in vi.type.tensor_type.shape.dim if d.dim_param}
    return model, zoo.inputs_for(model, np.random.default_rng(0), dims), stem


def matches(got: list, want: list, float16: str | None, precision: str = "fp32") -> bool:
    """Whether dnnc's outputs match onnxruntime's: the differential fuzzer's float32
    comparison (`dnnc.testing.fuzz.close`: relative 1e-4, absolute 1e-4 of the output's mean
    magnitude, so that a random-weight resnet50's logits of magnitude ~400, whose near-zero
    elements reordered sums move by 2e-4 in dnnc's NumPy reference too, are held to their
    scale), or the documented bound of a float16 file (docs/llvm_backend.md, "Half-precision
    files") or of a reduced `precision` ("Precision")."""
    if not float16 and precision == "fp32":
        return all(close(np.asarray(o), np.asarray(r))[0] for o, r in zip(got, want))
    bound = model_error_bound("fp16" if float16 else precision)
    return all(o.dtype == r.dtype and np.abs(o.astype(np.float32) - r.astype(np.float32)).max()
               <= bound * np.abs(r.astype(np.float32)).max()
               for o, r in zip(got, want))


def symbolic_model(name: str):
    """The model with a symbolic batch: a zoo model built with batch "N", a file as it is
    (its first input's axis 0 should be symbolic)."""
    import onnx

    if not name.endswith(".onnx"):
        return zoo.build(name, batch="N"), name
    return onnx.load(name), Path(name).stem


def inputs_at(model, n: int) -> dict:
    dims = {d.dim_param: n for vi in model.graph.input
            for d in vi.type.tensor_type.shape.dim if d.dim_param}
    return zoo.inputs_for(model, np.random.default_rng(n), dims)


def ort_session(ort, model, threads: int, spin: str | None):
    """An onnxruntime CPU session of `threads` intra-op threads; `spin` "0" turns off its
    workers' spinning (on by default: they spin 10-30 ms after a call)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if spin is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


@dataclass
class Peer:
    """A runtime dnnc is timed against: its label, the precision it computes in (as the runtime
    reports it for this model), and one call on the inputs (a name -> array dict)."""
    label: str
    precision: str
    run: Callable[[dict], list]


def onnxruntime_peer(model, threads: int, args) -> Peer:
    import onnxruntime as ort

    session = ort_session(ort, model, threads, args.ort_spin)
    # (on a float16 file it rounds to float16 in places: the ops it has float16 kernels for)
    precision = "f16+f32" if getattr(args, "float16", None) else "f32"
    return Peer("onnxruntime", precision, lambda inputs: session.run(None, inputs))


def openvino_peer(model, threads: int, hint: str | None) -> Peer:
    """OpenVINO's CPU plugin on `model`, `threads` threads, latency mode; `hint` None keeps its
    default precision (bf16 where the CPU has native bf16), "f32" asks for fp32."""
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                  config)
    request = compiled.create_infer_request()
    precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    label = "openvino-" + hint if hint else "openvino"
    return Peer(label, precision, lambda inputs: list(request.infer(inputs).to_tuple()))


PEERS = {
    "onnxruntime": onnxruntime_peer,
    "openvino": lambda model, threads, args: openvino_peer(model, threads, None),
    "openvino-f32": lambda model, threads, args: openvino_peer(model, threads, "f32"),
}


def installed_peers(names: str) -> list[str]:
    """The peers `--peers` names whose runtime is installed; a note for each one left out."""
    chosen = []
    for name in filter(None, names.split(",")):
        if name not in PEERS:
            sys.exit(f"--peers: unknown peer {name!r} (known: {', '.join(PEERS)})")
        package = name.split("-")[0]
        try:
            __import__(package)
        except ImportError:
            print(f"# {name}: {package} is not installed here, left out", flush=True)
            continue
        chosen.append(name)
    return chosen


def peer_versions(names: list[str]) -> str:
    packages = dict.fromkeys(name.split("-")[0] for name in names)
    return ", ".join(f"{p} {__import__(p).__version__.split('-')[0]}" for p in packages)


def own_code(compiled, fn, name: str) -> None:
    """Warm `compiled` up until `fn` runs its batch size's own code (`module.warm_up`), so no
    timed call runs on another size's code in slices; say so when it cannot."""
    if not warm_up(compiled, fn, 2):
        print(f"# {name}: still runs on another batch size's code; timed as it runs",
              flush=True)


def median_ms(fn, repeat: int, warmup: int = 2, pause: float = 1.0,
              cpu_time: bool = False) -> float:
    time.sleep(pause)  # let the previous timing's spinning threads (OpenBLAS, onnxruntime) idle
    return float(np.median(cpu_times_ms(fn, repeat, warmup) if cpu_time
                           else call_times_ms(fn, repeat, warmup)))


def cpu_times_ms(fn, repeat: int, warmup: int) -> list[float]:
    """The process's CPU milliseconds in each of `repeat` calls of `fn` (`--cpu-time`)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) * 1e3)
    return times


class BusyProcess:
    """One unrelated process spinning on a core, switched on and off by signals."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        self.off()

    def on(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        time.sleep(0.05)   # let the scheduler see it running

    def off(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        time.sleep(0.05)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def median_block_ms(fns: dict, repeat: int, blocks: int, cpu_time: bool = False) -> dict:
    """key (a precision, a runtime) -> the median of `blocks` blocks' median call, the blocks
    interleaved; `cpu_time` (1 thread): each call timed by the process's CPU time."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(blocks):
        for key, fn in fns.items():   # a pause first: the previous block's workers go idle
            times[key].append(median_ms(fn, repeat, pause=0.3, cpu_time=cpu_time))
    return {k: float(np.median(v)) for k, v in times.items()}


def block_ms(fn, repeat: int) -> float:
    time.sleep(0.2)   # the previous block's spinning threads (onnxruntime's, dnnc's) go idle
    return float(np.median(call_times_ms(fn, repeat, 2)))


def spread(blocks: list[float]) -> float:
    return max(blocks) / min(blocks)


def load_busy(name: str, ours, peer, label: str, args, busy: BusyProcess) -> dict:
    """Interleaved alone/loaded blocks for dnnc and one peer: medians and spreads."""
    times = {(who, cond): [] for who in ("dnnc", "peer") for cond in ("alone", "busy")}
    for _ in range(args.blocks):
        for who, fn in (("dnnc", ours), ("peer", peer)):
            times[who, "alone"].append(block_ms(fn, args.repeat))
            busy.on()
            times[who, "busy"].append(block_ms(fn, args.repeat))
            busy.off()
    med = {k: float(np.median(v)) for k, v in times.items()}
    slow = {who: med[who, "busy"] / med[who, "alone"] for who in ("dnnc", "peer")}
    print(f"{name:20} {med['dnnc', 'alone']:8.2f} {med['dnnc', 'busy']:8.2f} "
          f"{slow['dnnc']:6.2f}x {med['peer', 'alone']:8.2f} {med['peer', 'busy']:8.2f} "
          f"{slow['peer']:6.2f}x {slow['dnnc'] / slow['peer']:7.2f}  "
          f"{max(spread(v) for v in times.values()):6.2f}  {label}", flush=True)
    return {"ratio": slow["dnnc"] / slow["peer"], "alone": med["dnnc", "alone"] / med["peer", "alone"]}


def load_alternate(name: str, ours, peer, label: str, args) -> dict:
    """dnnc and one peer called alternately (blocks of pairs), next to each alone."""
    alone = {"dnnc": [], "peer": []}
    alt = {"dnnc": [], "peer": []}
    for _ in range(args.blocks):
        alone["dnnc"].append(block_ms(ours, args.repeat))
        alone["peer"].append(block_ms(peer, args.repeat))
        time.sleep(0.2)
        pairs = {"dnnc": [], "peer": []}
        for _ in range(args.repeat + 2):
            for who, fn in (("dnnc", ours), ("peer", peer)):
                start = time.perf_counter()
                fn()
                pairs[who].append((time.perf_counter() - start) * 1e3)
        for who in pairs:
            alt[who].append(float(np.median(pairs[who][2:])))
    a = {w: float(np.median(v)) for w, v in alone.items()}
    b = {w: float(np.median(v)) for w, v in alt.items()}
    print(f"{name:20} {a['dnnc']:8.2f} {b['dnnc']:8.2f} {a['peer']:8.2f} {b['peer']:8.2f} "
          f"{a['dnnc'] / a['peer']:7.2f} {b['dnnc'] / b['peer']:7.2f}  "
          f"{max(spread(v) for d in (alone, alt) for v in d.values()):6.2f}  {label}",
          flush=True)
    return {"ratio": b["dnnc"] / b["peer"], "alone": a["dnnc"] / a["peer"]}


LOAD_HEADERS = {
    "busy": f"{'model':20} {'dnnc ms':>8} {'+busy':>8} {'slow':>7} {'peer ms':>8} {'+busy':>8} "
            f"{'slow':>7} {'dnnc/peer slowdown':>7}  spread  peer",
    "alternate": f"{'model':20} {'dnnc ms':>8} {'alt':>8} {'peer ms':>8} {'alt':>8} "
                 f"{'ratio':>7} {'alt ratio':>7}  spread  peer",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="zoo")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--opt-level", type=int, default=None)
    parser.add_argument("--mattr", default=None,
                        help="edit the host's CPU features for dnnc, e.g. -avx512f to see how "
                             "an AVX2-only machine's code fares (onnxruntime is unchanged)")
    parser.add_argument("--float16", choices=["half-io", "float-io"], default=None,
                        help="time each model's float16 file (module docstring)")
    parser.add_argument("--peers", default="onnxruntime,openvino,openvino-f32",
                        help="runtimes to time dnnc against (module docstring)")
    parser.add_argument("--load", choices=["busy", "alternate"], default=None,
                        help="measure under load (see the module docstring)")
    parser.add_argument("--blocks", type=int, default=5,
                        help="interleaved blocks per condition with --load")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for each runtime (default: DNNC_NUM_THREADS, else the "
                             "cores this process may use)")
    parser.add_argument("--alone-blocks", type=int, default=3,
                        help="interleaved blocks of --repeat calls per runtime, alone")
    parser.add_argument("--ort-spin", choices=["0", "1"], default=None,
                        help="onnxruntime's session.intra_op.allow_spinning (default: its "
                             "own, 1); see --load alternate in the module docstring")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="every N-th model from the K-th (1-based): the runs of one "
                             "table spread over processes on disjoint cores")
    parser.add_argument("--new-batch", default=None,
                        help="batch sizes to call a symbolic-batch model at (module docstring)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time calls by the process's CPU time (1 thread only)")
    parser.add_argument("--compile-jobs", type=int, default=0, metavar="N",
                        help="compile every model first, N at once, into the compile cache")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="dnnc's arithmetic of products (module docstring)")
    args = parser.parse_args(argv)
    if args.cpu_time and (args.threads != 1 or args.load or args.new_batch):
        parser.error("--cpu-time times the alone table at --threads 1 (other threads' CPU "
                     "time would add up, not overlap)")
    if args.threads:
        # read when the worker pool starts (the first host_target() below)
        os.environ["DNNC_NUM_THREADS"] = str(args.threads)
    models = expand_models(args.models)
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        models = models[k - 1::n]
    args.models = ",".join(models)
    if args.new_batch:
        return main_new_batch(args)
    if args.load:
        return main_load(args)
    cpu = cpu_from(mattr=args.mattr) if args.mattr else host_target()
    threads = cpu.threads
    peers = installed_peers(args.peers)
    if args.compile_jobs:
        compile_ahead(args.models.split(","), args, args.compile_jobs)
    print(f"# {platform.machine()} {cpu.cpu} ({cpu.vector_bits}-bit vectors"
          f"{', ' + args.mattr if args.mattr else ''}), {threads} "
          f"threads each; dnnc {dnnc.__version__}, {peer_versions(peers)}, batch {args.batch}"
          f"{'; CPU time' if args.cpu_time else ''}; dnnc precision {args.precision}")
    print(f"{'model':20} {'compile s':>9} {'fallbacks':>9} {'kernels':>8} {'dnnc ms':>9} "
          + "".join(f"{peer + ' ms':>16} {'ratio':>6}" for peer in peers)
          + "  check  precision (" + ", ".join(peers) + ")")
    ratios: dict[str, list[float]] = {peer: [] for peer in peers}
    checked = "onnxruntime" in peers or importlib.util.find_spec("onnxruntime") is not None
    for entry in args.models.split(","):
        model, inputs, name = load_model(entry, args.batch, args.float16)
        start = time.perf_counter()
        compiled = dnnc.compile(model, target="llvm", opt_level=args.opt_level, cpu=cpu,
                                precision=args.precision)
        compile_s = time.perf_counter() - start
        runs = [Peer("dnnc", args.precision, lambda inputs: compiled.run(*inputs.values()))]
        runs += [PEERS[peer](model, threads, args) for peer in peers]
        own_code(compiled, lambda: compiled.run(*inputs.values()), name)
        # blocks of each alone, interleaved (the median block each): a pause before each
        # lets the others' threads stop spinning (onnxruntime's spin 10-30 ms after a call)
        blocks: dict[str, list[float]] = {run.label: [] for run in runs}
        for _ in range(args.alone_blocks):
            for run in runs:
                blocks[run.label].append(median_ms(lambda: run.run(inputs), args.repeat,
                                                   pause=0.3, cpu_time=args.cpu_time))
        ms = {label: float(np.median(times)) for label, times in blocks.items()}
        check = "-"
        if checked:   # onnxruntime's outputs are the reference, timed or not
            ref = (runs[1 + peers.index("onnxruntime")] if "onnxruntime" in peers else
                   onnxruntime_peer(model, threads, args)).run(inputs)
            ok = matches(compiled.run(*inputs.values()), ref, args.float16, args.precision)
            check = "ok" if ok else "MISMATCH"
        for peer in peers:
            ratios[peer].append(ms["dnnc"] / ms[peer])
        print(f"{name:20} {compile_s:9.1f} {compiled.stats['host_fallback_ops']:9d} "
              f"{compiled.stats['kernels']:8d} {ms['dnnc']:9.2f} "
              + "".join(f"{ms[p]:16.2f} {ms['dnnc'] / ms[p]:6.2f}" for p in peers)
              + f"  {check:5}  " + "/".join(run.precision for run in runs[1:]), flush=True)
    for peer, rs in ratios.items():
        print(f"geometric mean dnnc/{peer}: {geomean(rs):.2f}  (worst {max(rs):.2f})")


def geomean(ratios: list[float]) -> float:
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def main_load(args) -> None:
    """Each model under `--load`, against each peer in turn (a row per model and peer)."""
    cpu = host_target()
    threads = cpu.threads
    peers = installed_peers(args.peers)
    print(f"# {platform.machine()} {cpu.cpu}, {os.cpu_count()} cpus, {threads} threads each; "
          f"dnnc {dnnc.__version__}, {peer_versions(peers)}, batch {args.batch}, "
          f"load {args.load}, {args.blocks} blocks of {args.repeat} calls")
    print(LOAD_HEADERS[args.load])
    busy = BusyProcess() if args.load == "busy" else None
    ratios: dict[str, list[float]] = {peer: [] for peer in peers}
    try:
        for entry in args.models.split(","):
            model, inputs, name = load_model(entry, args.batch, args.float16)
            compiled = dnnc.compile(model, target="llvm", opt_level=args.opt_level, cpu=cpu)
            ours = lambda: compiled.run(*inputs.values())   # noqa: E731
            own_code(compiled, ours, name)
            for label in peers:
                peer = PEERS[label](model, threads, args)
                call = lambda: peer.run(inputs)   # noqa: E731
                tail = f"{label} ({peer.precision})"
                row = (load_busy(name, ours, call, tail, args, busy) if busy
                       else load_alternate(name, ours, call, tail, args))
                ratios[label].append(row["ratio"])
    finally:
        if busy:
            busy.close()
    what = "slowdown dnnc/" if busy else "alternating dnnc/"
    for label, rs in ratios.items():
        print(f"geometric mean {what}{label}: {geomean(rs):.2f} (worst {max(rs):.2f})")


def main_new_batch(args) -> None:
    """Each model compiled with a symbolic batch, then called at new sizes (docstring)."""
    import onnxruntime as ort

    cpu = host_target()
    sizes = [int(n) for n in args.new_batch.split(",")]
    print(f"# {platform.machine()} {cpu.cpu}, {cpu.threads} threads each; dnnc "
          f"{dnnc.__version__}, onnxruntime {ort.__version__}; compiled at batch "
          f"{args.batch}, then called at {sizes}")
    print(f"{'model':20} {'batch':>5} {'first ms':>9} {'split':>5} {'split ms':>9} "
          f"{'own ms':>8} {'ort ms':>8} {'split/own':>9}  check")
    for entry in args.models.split(","):
        model, name = symbolic_model(entry)
        session = ort_session(ort, model, cpu.threads, args.ort_spin)
        compiled = dnnc.compile(model, target="llvm", opt_level=args.opt_level, cpu=cpu)
        rt = compiled.runtime
        rt.specialize_after = None   # split for good: each size's own code is timed apart
        start = time.perf_counter()
        compiled.run(*inputs_at(model, args.batch).values())
        print(f"{name:20} {args.batch:5d} {(time.perf_counter() - start) * 1e3:9.0f}  "
              f"(the compile)", flush=True)
        for n in sizes:
            inputs = inputs_at(model, n)
            splits = rt.split_calls
            start = time.perf_counter()
            first = compiled.run(*inputs.values())
            first_ms = (time.perf_counter() - start) * 1e3
            split = rt.split_calls > splits
            ref = session.run(None, inputs)
            ok = all(np.allclose(o, r, rtol=1e-4, atol=1e-5) for o, r in zip(first, ref))
            again = median_ms(lambda: compiled.run(*inputs.values()), args.repeat)
            own_model = dnnc.compile(model, target="llvm", opt_level=args.opt_level, cpu=cpu)
            own_model.runtime.specialize_after = None
            own_code(own_model, lambda: own_model.run(*inputs.values()), name)  # its compile
            own = median_ms(lambda: own_model.run(*inputs.values()), args.repeat)
            peer = median_ms(lambda: session.run(None, inputs), args.repeat)
            print(f"{name:20} {n:5d} {first_ms:9.1f} {'yes' if split else 'no':>5} "
                  f"{again:9.2f} {own:8.2f} {peer:8.2f} {again / own:9.2f}  "
                  f"{'ok' if ok else 'MISMATCH'}", flush=True)


if __name__ == "__main__":
    main()
