"""$MODEL (resnet50 b32 QDQ, the default, or bert_base b8 dynamically quantized, as
bench/gpu_int8.py makes them) at int8 against dnnc's fp16, two dnnc trees (main and a
branch) in one call, each row compiled in its own process at once and timed one after the
other (file turns under $FIN, /tmp/fin by default): `prep` quantizes the model once (and
onnxruntime's int8 output, 16 threads); then `ROW LABEL` (run with the dnnc of the tree it
times first on PYTHONPATH: `fp16`, `int8` as compiled, `int8-64x128` with int8.SHALLOW_TILE
64 x 128, `int8-unroll8` with cuda_dynamic_quantize's unroll 8, `int8-tiles` with each
product's fastest tile in $OUT/int8_tiles.json, bench/gpu_int8_tiles.py's; `int8-fp16` the
int8 file compiled at precision="fp16": its float ops between the integer products stored
half, as TensorRT's int8 with fp16 runs) compiles, waits
for its turn (LABEL names the turn files), takes three medians of 50 calls (inputs on the
device), traces its kernels in the model (bench/gpu_breakdown.py's `traced`) and profiles
them alone; it prints the model's kernels of interest (`FOCUS`: resnet50's 1x1 convs that
add the residual, the conv kernels whose nodes hold an Add, QuantizedAdd in the int8 model;
BERT's DynamicQuantizeLinear kernels) in the model and alone, and writes $OUT/LABEL.json.
bench/gpu_int8_ab.sh drives it (with the GPU int8 tests and the fuzzer's QDQ cases on cuda
while the rows compile). Sessions 55's and 57's resnet50 tables and session 58's BERT one in
docs/cuda_backend.md come from it. Never imported by dnnc.
"""
import json, os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent))
W = Path(os.environ.get("FIN", "/tmp/fin"))
OUT = Path(os.environ.get("OUT", "/tmp/out"))
MODEL = os.environ.get("MODEL", "resnet50")
FOCUS = {
    "resnet50": ("residual convs", lambda r: "conv" in str(r.get("template")) and
                 any("add" in n.lower() for n in r.get("nodes", []))),
    "bert_base": ("quantizations", lambda r: r.get("template") == "cuda_dynamic_quantize")}
"""Per model: the kernels `ROW` reports one by one, and which `profile` records they are."""


def launched(kern: dict, kernel: str) -> list[str]:
    """The `__global__` functions of `kernel` traced in the model: its name, or its name and
    _s<k> where it has several launches."""
    return [k for k in kern if k == kernel or k.startswith(kernel + "_s")]


def wait(p):
    while not p.exists():
        time.sleep(0.2)

if sys.argv[1] == "prep":
    W.mkdir(exist_ok=True)
    from dnnc import zoo
    from gpu_int8 import quantized_file
    from dnnc.testing.quantized_files import onnxruntime_outputs
    import onnx
    t0 = time.perf_counter()
    model, path = quantized_file(MODEL, W)
    onnx.save(model, str(W / "float.onnx")) if not isinstance(model, (str, Path)) else None
    feeds = zoo.inputs_for(model, np.random.default_rng(1))
    np.savez(W / "feeds.npz", **feeds)
    want = np.asarray(onnxruntime_outputs(path, feeds, threads=16)[0])
    np.save(W / "want.npy", want)
    (W / "path").write_text(str(path))
    print(f"prep {time.perf_counter() - t0:.1f}s", flush=True)
    sys.exit(0)

row, name = sys.argv[1], sys.argv[2]
import dnnc
import onnx
from gpu_int8 import on_device, by_template
from gpu_breakdown import traced
feeds = dict(np.load(W / "feeds.npz"))
dev = on_device(feeds)
t0 = time.perf_counter()
if row == "int8-64x128":   # an informative variant: int8's shallow tile 64 x 128 (3 blocks an SM)
    from dataclasses import replace
    from dnnc.backends.cuda import int8 as int8_module
    int8_module.SHALLOW_TILE = replace(int8_module.SHALLOW_TILE, block_m=64, warps_m=4)
if row == "int8-unroll8":   # another: cuda_dynamic_quantize at unroll 8 (its default 4)
    from dataclasses import replace
    from dnnc.backends.cuda import schedules
    from dnnc.backends.cuda.dynamic_quantize import DYNAMIC_QUANTIZE, QuantizeConfig
    from dnnc.ir.ops.registry import Pattern
    fixed = replace(DYNAMIC_QUANTIZE, default=lambda p, machine: QuantizeConfig(unroll=8))
    key = ("cuda", Pattern.OPAQUE)
    schedules.TEMPLATES[key] = tuple(fixed if t is DYNAMIC_QUANTIZE else t
                                     for t in schedules.TEMPLATES[key])
if row == "int8-tiles":   # each product's tile: the fastest bench/gpu_int8_tiles.py timed
    from dataclasses import replace   # for its m x n x k (its kinds' kernels summed)
    from dnnc.backends.cuda import int8 as int8_module
    from dnnc.backends.cuda.mma import TensorCoreConfig
    timed = {}
    for r in json.loads((OUT / "int8_tiles.json").read_text()):
        for us, ok, c in r["tiles"]:
            c = replace(TensorCoreConfig(**c), staged=False)   # (dense_default stages it)
            shape = timed.setdefault((r["m"], r["n"], r["k"]), {})
            shape[c] = shape.get(c, 0.0) + (us * r["count"] if ok else float("inf"))
    fastest = {shape: min(tiles, key=tiles.get) for shape, tiles in timed.items()}
    chosen = int8_module.choose
    int8_module.choose = lambda m, n, k, gpu, with_wgmma=False: fastest.get(
        (m, n, k)) or chosen(m, n, k, gpu, with_wgmma)
if row == "fp16":
    m = dnnc.compile(onnx.load(str(W / "float.onnx")), "cuda", precision="fp16", cache=False)
elif row == "int8-fp16":   # the int8 file with the float ops between stored in fp16
    m = dnnc.compile((W / "path").read_text(), "cuda", precision="fp16", cache=False)
else:
    m = dnnc.compile((W / "path").read_text(), "cuda", cache=False)
seconds = time.perf_counter() - t0
got = np.asarray(m(**feeds, to="numpy"))
(W / f"ready.{name}").touch()
wait(W / f"go.{name}")
ms = [m.benchmark(*dev, repeat=50)["median_ms"] for _ in range(3)]
kern, cnt = traced(lambda: m.run(*dev), 10)
rows = m.profile(*dev, repeat=5)
res = {"name": name, "row": row, "ms": ms, "compile_s": seconds}
if row != "fp16":
    want = np.load(W / "want.npy")
    d = np.abs(got.astype(np.float64) - want)
    res["mismatch"] = float(np.mean(d > 0)); res["max_steps"] = float(d.max() / (np.abs(want).max() / 127))
    np.save(W / f"got.{name}.npy", got)
res["kernels"] = {k: [v, cnt.get(k, 0)] for k, v in kern.items()}
res["alone"] = [{k: (str(v) if k == "config" else v) for k, v in r.items()} for r in rows]
(OUT / f"{name}.json").write_text(json.dumps(res, default=str))
print(f"{name}: median of 50 (3 rounds) {ms}, compile {seconds:.1f}s, traced sum {sum(kern.values()):.3f} ms"
      + (f", mismatch vs ORT {res['mismatch']:.2e}, max |d|/step {res['max_steps']:.3g}" if row != 'fp16' else ""), flush=True)
what, chosen = FOCUS[MODEL]
focus = [r for r in rows if chosen(r)]
functions = sorted({f for r in focus for f in launched(kern, r["kernel"])})   # (deduplicated
# kernels share a function: the trace sums its calls)
print(f"  {name} {what} ({len(focus)}, {sum(cnt.get(f, 0) for f in functions)} launches): in "
      f"the model {1000 * sum(kern[f] for f in functions):.1f} us, alone "
      f"{1000 * sum(r['ms'] for r in focus):.0f} us; in the model, us a launch: " +
      ", ".join(f"{f} {1000 * kern[f] / max(cnt.get(f, 1), 1):.2f} x{cnt.get(f, 0)}"
                for f in functions), flush=True)
by_template(name, m, dev, rows, slowest=5)
(W / f"done.{name}").touch()
