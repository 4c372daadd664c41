"""Where dnnc's int8 models spend their time against its fp16 ones, kernel by kernel in the
model: resnet50 b32 (QDQ) and BERT-base b8 (dynamically quantized), as bench/gpu_int8.py
makes the files, each compiled for cuda (int8 as it comes, the float model at
precision="fp16"), timed (`CompiledModel.benchmark`, inputs on the device), then its kernels
traced over 10 calls by bench/gpu_breakdown.py's `traced` (torch.profiler: a kernel's time
in the model, CUDA graph replays included) and timed alone (`CompiledModel.profile`): per
template, then the 40 slowest kernels (ms a call, launches, ms alone, TOPS, template, kernel,
config, first nodes). Writes $OUT/prof.json (every kernel). Session 46's BERT table in
docs/cuda_backend.md comes from it.

    PYTHONPATH=$PWD python bench/gpu_int8_traced.py [resnet50,bert_base]

Never imported by dnnc.
"""
import json, os, sys, tempfile, time, re
from collections import defaultdict
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent))
import dnnc
from dnnc import zoo
from gpu_int8 import quantized_file, on_device
from gpu_breakdown import traced
from gpu_timing import header

OUT = Path(os.environ.get("OUT", "/tmp/out"))
models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["resnet50", "bert_base"]
print(header(), flush=True)
result = {}
with tempfile.TemporaryDirectory() as folder:
    for name in models:
        t0 = time.perf_counter()
        model, path = quantized_file(name, Path(folder))
        feeds = zoo.inputs_for(model, np.random.default_rng(1))
        dev = on_device(feeds)
        print(f"{name}: quantized in {time.perf_counter()-t0:.1f}s", flush=True)
        for side in ("fp16", "int8"):
            t0 = time.perf_counter()
            m = dnnc.compile(model, "cuda", precision="fp16", cache=False) if side == "fp16" \
                else dnnc.compile(str(path), "cuda", cache=False)
            ct = time.perf_counter() - t0
            ms = m.benchmark(*dev, repeat=30)["median_ms"]
            rows = m.profile(*dev, repeat=5)
            alone = defaultdict(lambda: [0.0, 0, "", "", 0.0, []])
            for r in rows:
                a = alone[r["kernel"]]
                a[0] += r["ms"]; a[1] += 1; a[2] = str(r.get("template")); a[3] = str(r.get("config"))
                a[4] += r.get("flops") or 0; a[5] = r.get("nodes", [])[:6]
            import cupy
            kern, cnt = traced(lambda: (m.run(*dev)), 10)
            total = sum(v for k, v in kern.items())
            print(f"\n## {name} {side}: call {ms:.3f} ms; traced kernel sum {total:.3f} ms in "
                  f"{sum(cnt.values())} launches; alone sum {sum(a[0] for a in alone.values()):.3f} "
                  f"in {len(rows)}; compile {ct:.1f}s", flush=True)
            bytmpl = defaultdict(lambda: [0.0, 0])
            for k, v in kern.items():
                t = alone[k][2] if k in alone else "?"
                bytmpl[t][0] += v; bytmpl[t][1] += cnt.get(k, 0)
            for t, (v, c) in sorted(bytmpl.items(), key=lambda kv: -kv[1][0]):
                print(f"   {t:34} {v:8.3f} ms  x{c}")
            for k, v in sorted(kern.items(), key=lambda kv: -kv[1])[:40]:
                a = alone.get(k, [0, 0, "?", "", 0, []])
                tf = a[4] / (v * 1e9) if a[4] and v else 0
                print(f"     {v:7.4f} x{cnt.get(k,0):<3} alone {a[0]:7.4f} {tf:6.1f}T {a[2][:24]:24} "
                      f"{k[:30]:30} {a[3][:100]} {a[5][:3]}")
            result[f"{name}/{side}"] = {"ms": ms, "kernels": {k: [v, cnt.get(k, 0)] for k, v in kern.items()},
                                        "alone": {k: list(v) for k, v in alone.items()}}
            del m
(OUT / "prof.json").write_text(json.dumps(result, default=str))
