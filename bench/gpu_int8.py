"""dnnc's int8 kernels on the integer tensor cores against dnnc's fp16 ones (issue 33, item
4), one run on one GPU.

    PYTHONPATH=$PWD python bench/gpu_int8.py [--repeat 20] [--no-kernels] [--no-models]
        [--shapes 8] [--models resnet50,bert_base]
        [--variants mma.sync,no-s2d,unstaged,deep-tiles,staged-f32]
        [--slowest 8] [--sweep] [--quantize]

Kernels: resnet50's distinct convolution shapes (bench/gpu_conv.py's RESNET50; the first
`--shapes` of them, all by default) at batch 32, each as one QuantizedConvPacked (int8
image, per-channel scales, int8 output) compiled for cuda as it comes (`nhwc`: channels-last
where C is whole 16-byte chunks, `backends/cuda/int8_nhwc.py`'s cuda_int8_conv2d_nhwc; the
stem's 3 channels stay NCHW) and with convert_layout's int8 rewrite off (`nchw`:
`backends/cuda/int8.py`'s cuda_int8_conv2d), against the ConvNHWC kernel dnnc runs at
precision="fp16" (fp16 channels-last image and weights), and
BERT-base's dense products at batch 8 x 128 tokens as one QuantizedDense (uint8 activations,
float32 output, as quantize_dynamic's MatMulInteger) against an fp16 MatMul at fp16. Each
kernel's time is `CompiledModel.profile`'s median for the product (the kernel of most flops:
the fp16 side's layout copies are not counted); `fp16/int8` is the speedup of the int8 kernel as
compiled (nhwc), `nchw/nhwc` that of the channels-last int8 kernel over the NCHW one, and
TOPS = 2 M N K / time.

Models (unless `--no-models`; timed first): resnet50 at batch 32 (224 x 224) quantized by
onnxruntime's quantize_static (QDQ, per-channel int8 weights, int8 activations, as
bench/cpu_int8.py builds it) and BERT-base at batch 8 (sequence 128) by quantize_dynamic,
each compiled by dnnc for cuda (`cache=False`: a model from the compile cache cannot be
profiled), against the float model compiled at precision="fp16" (the issue's bar: int8 >=
1.5x fp16); median ms of `CompiledModel.benchmark` with the inputs on the device (CuPy arrays,
outputs left there: `ms`, the bar's figure) and from the host (`host ms`: a resnet50 batch's
19 MB of float32 pixels copied in each call, the same on both sides). Each int8 output is
compared with onnxruntime's int8 run of the same file on the CPU: `mismatch` is the fraction
of elements that differ, `max |d| / step` the largest difference in units of the output's
quantized step (max |ort| / 127). VARIANTS add int8 rows compiled under DNNC_WGMMA=0
(mma.sync) and DNNC_STAGED=0; then each model's kernel time by template and its slowest
kernels (`CompiledModel.profile`, each kernel alone), int8 and fp16. `--sweep` instead times
the channels-last int8 conv at each SWEEP tile (plain and staged) at resnet50's 3x3 and
first two 1x1 shapes; `--quantize` instead times DynamicQuantizeLinear at BERT-base's
shapes, inside a CUDA graph and alone. Never imported by dnnc.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dnnc  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.ops.quantized import pack_conv_groups, pack_groups  # noqa: E402
from gpu_conv import RESNET50, conv_graph  # noqa: E402
from gpu_timing import header  # noqa: E402

BERT_DENSE = [(768, 768, 4), (768, 3072, 1), (3072, 768, 1)]
"""BERT-base's dense products (k, n, count in a layer): q, k, v and the output projection,
the feed-forward's two."""


BERT_QUANTIZE = [((1024, 768), 3), ((1024, 3072), 1)]
"""BERT-base's DynamicQuantizeLinear inputs at batch 8 (shape, count in a layer): the
q/k/v and feed-forward inputs and the attention output [tokens, 768], the second
feed-forward input [tokens, 3072]."""
QUANTIZE_COPIES = 8
"""Independent DynamicQuantizeLinear ops in one graph of `quantize_rows`: its replayed time
over this is one op's time inside a CUDA graph (the graph's own launch shared by eight)."""


def _const(name, a):
    a = np.asarray(a)
    return Value(name, T.TensorType(T.DType.from_numpy(a.dtype), a.shape), const=a)


def int8_conv(c, h, m, k, s, batch, rng) -> tuple[Graph, np.ndarray]:
    w = rng.integers(-128, 128, (m, c, k, k)).astype(np.int8)
    g = Graph("q")
    x = g.add_input("x", T.TensorType(T.int8, (batch, c, h, h)))
    ins = [x, _const("za", np.int8(3)), _const("w", pack_conv_groups(w)),
           _const("s", w.astype(np.int32).reshape(m, -1).sum(1).astype(np.int32)),
           _const("b", rng.integers(-1000, 1000, m).astype(np.int32)),
           _const("sc", rng.uniform(1e-5, 1e-4, m).astype(np.float32)), _const("yz", np.int8(0))]
    g.outputs = [g.add("QuantizedConvPacked", *ins, kernel_shape=[k, k], strides=[s, s],
                       pads=[k // 2] * 4, oc=m, lo=0, hi=None)]
    return g, rng.integers(-128, 128, (batch, c, h, h)).astype(np.int8)


def int8_dense(rows, k, n, rng) -> tuple[Graph, np.ndarray]:
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    g = Graph("q")
    a = g.add_input("a", T.TensorType(T.uint8, (rows, k)))
    ins = [a, _const("za", np.uint8(120)), _const("w", pack_groups(w)),
           _const("s", w.astype(np.int32).sum(0).astype(np.int32)), None,
           _const("sc", np.float32(1e-4))]
    g.outputs = [g.add("QuantizedDense", *ins, n=n, lo=None, hi=None)]
    return g, rng.integers(0, 256, (rows, k)).astype(np.uint8)


def fp16_dense(rows, k, n, rng) -> tuple[Graph, np.ndarray]:
    g = Graph("f")
    a = g.add_input("a", T.TensorType(T.float16, (rows, k)))
    w = Value("w", T.TensorType(T.float16, (k, n)),
              const=(rng.uniform(-1, 1, (k, n)) / np.sqrt(k)).astype(np.float16))
    g.outputs = [g.add("MatMul", a, w)]
    return g, rng.uniform(-1, 1, (rows, k)).astype(np.float16)


def product_ms(graph: Graph, x: np.ndarray, repeat: int, **options) -> tuple[float, str]:
    """(median ms, template) of the graph's product kernel (its kernel of most flops)."""
    model = dnnc.compile(graph, "cuda", cache=False, **options)
    model(x)
    records = model.profile(x, repeat=repeat)
    best = max(records, key=lambda r: r.get("flops") or 0)
    return best["ms"], best.get("template") or "?"


def nchw_ms(graph: Graph, x: np.ndarray, repeat: int) -> tuple[float, str]:
    """`product_ms` with convert_layout's int8 rewrite off (the conv stays NCHW)."""
    from dnnc.passes import convert_layout

    rewrite = convert_layout._nhwc_int8_conv
    convert_layout._nhwc_int8_conv = lambda node: None
    try:
        return product_ms(graph, x, repeat)
    finally:
        convert_layout._nhwc_int8_conv = rewrite


def kernel_rows(args) -> None:
    rng = np.random.default_rng(0)
    print(f"{'kernel':34} {'nhwc ms':>8} {'TOPS':>6} {'nchw ms':>8} {'fp16 ms':>8} "
          f"{'TFLOPS':>7} {'fp16/int8':>9} {'nchw/nhwc':>9}  templates")
    weighted = np.zeros(3)
    shapes = [("conv", s) for s in RESNET50[:args.shapes]] + [("dense", s) for s in BERT_DENSE]
    for kind, shape in shapes:
        if kind == "conv":
            c, h, m, k, s, count = shape
            oh = (h + 2 * (k // 2) - k) // s + 1
            flops = 2 * 32 * oh * oh * m * c * k * k
            q, xq = int8_conv(c, h, m, k, s, 32, rng)
            f, arrays = conv_graph(c, h, m, k, s, 32, T.float16, True, rng)
            xf = np.ascontiguousarray(arrays[0].transpose(0, 2, 3, 1)).astype(np.float16)
            label = f"conv {c}x{h}^2 -> {m} k{k} s{s}"
        else:
            k, n, count = shape
            flops = 2 * 1024 * k * n
            q, xq = int8_dense(1024, k, n, rng)
            f, xf = fp16_dense(1024, k, n, rng)
            label = f"dense 1024 x {k} -> {n}"
        try:
            ms8, t8 = product_ms(q, xq, args.repeat)
            ms_nchw, t_nchw = nchw_ms(q, xq, args.repeat) if kind == "conv" else (ms8, t8)
            ms16, t16 = product_ms(f, xf, args.repeat, precision="fp16")
        except Exception as exc:   # one shape's failure must not hide the others
            print(f"{label:34} error {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        weighted += count * np.array([ms8, ms_nchw, ms16])
        print(f"{label:34} {ms8:8.4f} {flops / ms8 / 1e9:6.0f} {ms_nchw:8.4f} {ms16:8.4f} "
              f"{flops / ms16 / 1e9:7.0f} {ms16 / ms8:9.2f} {ms_nchw / ms8:9.2f}  "
              f"{t8}, {t_nchw}, {t16}", flush=True)
    print(f"{'weighted by count':34} {weighted[0]:8.3f} {'':6} {weighted[1]:8.3f} "
          f"{weighted[2]:8.3f} {'':7} {weighted[2] / weighted[0]:9.2f} "
          f"{weighted[1] / weighted[0]:9.2f}")


def quantize_rows(args) -> None:
    """Per BERT_QUANTIZE shape: QUANTIZE_COPIES DynamicQuantizeLinear ops of their own
    inputs in one graph, compiled for cuda; `in graph` is its `benchmark` median (a replayed
    CUDA graph, inputs on the device) over the copies, `alone` the median of each op's
    kernel launched by itself (`CompiledModel.profile`: a host launch and events around
    it), GB/s the bytes a quantization must move (x read once, y written) over `in graph`.
    `in graph` includes the call's host side (8 inputs, 24 outputs: about 0.3 ms a call on
    the H200, session 45), so it tells kernels apart only above that."""
    from dnnc.ir.ops.quant import dynamic_quantize_linear

    rng = np.random.default_rng(3)
    print(f"{'DynamicQuantizeLinear':34} {'in graph':>9} {'alone':>8} {'GB/s':>6}  template",
          flush=True)
    for shape, count in BERT_QUANTIZE:
        g = Graph("dq")
        xs = [rng.standard_normal(shape).astype(np.float32) * (k + 1)
              for k in range(QUANTIZE_COPIES)]
        outs = []
        for k in range(QUANTIZE_COPIES):
            x = g.add_input(f"x{k}", T.TensorType(T.float32, shape))
            outs += list(g.add_node("DynamicQuantizeLinear", [x], {}, num_outputs=3))
        g.outputs = outs
        model = dnnc.compile(g, "cuda", cache=False)
        got = model(*xs, to="numpy")
        same = all(np.array_equal(a, b) for k, x in enumerate(xs)
                   for a, b in zip(got[3 * k:3 * k + 3], dynamic_quantize_linear(x)))
        device_xs = on_device(dict(enumerate(xs)))
        ms = model.benchmark(*device_xs, repeat=args.repeat)["median_ms"] / QUANTIZE_COPIES
        records = model.profile(*device_xs, repeat=args.repeat)
        alone = float(np.median([r["ms"] for r in records]))
        size = int(np.prod(shape))
        print(f"{f'{shape[0]} x {shape[1]} (x{count} a layer)':34} {ms * 1e3:7.1f}us "
              f"{alone * 1e3:6.1f}us {5 * size / ms / 1e6:6.0f}  "
              f"{records[0].get('template')} {records[0].get('config')}; outputs "
              f"{'equal to' if same else 'DIFFER from'} the reference", flush=True)


def quantized_file(name: str, folder: Path):
    """(float model, its quantized file) as bench/cpu_int8.py makes them, calibrated on one
    batch (32 images: the scales a benchmark needs, in a quarter of the time)."""
    from dnnc.testing import quantized_files
    from dnnc.testing.quantized_files import quantize_dynamic, quantize_static

    quantized_files.CALIBRATION_INPUTS = 1
    if name == "resnet50":
        model = zoo.build(name, batch=32)
        return model, quantize_static(model, folder, name)
    model = zoo.build(name, batch=8)
    return model, quantize_dynamic(model, folder, name)


VARIANTS = (("int8 mma.sync", {"DNNC_WGMMA": "0"}, {}),
            ("int8 no-s2d", {"DNNC_SPACE_TO_DEPTH": "0"}, {}),
            ("int8 unstaged", {"DNNC_STAGED": "0"}, {}),
            ("int8 deep-tiles", {}, {"int8.SHALLOW_OUTPUTS": float("inf")}),
            ("int8 staged-f32", {}, {"mma.STAGED_OUTPUTS": (T.float16, T.bfloat16, T.int8,
                                                            T.uint8, T.float32)}))
"""Further int8 rows: the model compiled again under these variables and values of
backends/cuda modules (DNNC_WGMMA=0: the integer products on mma.sync, not wgmma;
DNNC_SPACE_TO_DEPTH=0: a strided stem's conv as it comes, not on its input's space to depth
(convert_layout's `_space_to_depth`);
DNNC_STAGED=0: wgmma's 8-bit results stored directly, not staged; deep-tiles: no
int8.SHALLOW_TILE, shallow products on the tile int8.choose's model picks; staged-f32:
float32 results staged too, as a dynamically quantized model's products store them)."""


def on_device(feeds: dict) -> list:
    """The inputs as CuPy arrays (read in place: no copy from the host in a timed call)."""
    import cupy

    return [cupy.asarray(a) for a in feeds.values()]


def model_rows(args) -> None:
    from dnnc.testing.quantized_files import onnxruntime_outputs

    print(f"{'model':22} {'ms':>8} {'fp16 ms':>8} {'fp16/int8':>9} {'host ms':>8} "
          f"{'mismatch':>9} {'max|d|/step':>11}  compile s")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            start = time.perf_counter()
            model, path = quantized_file(name, Path(folder))
            feeds = zoo.inputs_for(model, np.random.default_rng(1))
            device_feeds = on_device(feeds)
            want = np.asarray(onnxruntime_outputs(path, feeds, threads=16)[0])
            t0 = time.perf_counter()
            f16 = dnnc.compile(model, "cuda", precision="fp16", cache=False)
            ms16 = f16.benchmark(*device_feeds, repeat=args.repeat)["median_ms"]
            host16 = f16.benchmark(*feeds.values(), repeat=args.repeat)["median_ms"]
            label = name + (" b32" if name == "resnet50" else " b8")
            print(f"{label + ' fp16':22} {ms16:8.3f} {ms16:8.3f} {1:9.2f} {host16:8.3f} "
                  f"{'':9} {'':11}  {time.perf_counter() - t0:.1f} (quantizing "
                  f"{t0 - start:.1f})", flush=True)
            first = None
            chosen = tuple(v for v in VARIANTS if args.variants and v[0].split()[-1] in
                           args.variants.split(","))
            for variant, env, values in (("int8", {}, {}),) + chosen:
                try:
                    first = int8_row(f"{label} {variant}", path, feeds, device_feeds, want,
                                     ms16, first, env, values, args)
                except Exception as exc:   # one row's failure must not hide the others
                    print(f"{label} {variant}: {type(exc).__name__}: {str(exc)[:300]}",
                          flush=True)
            by_template("fp16", f16, device_feeds, slowest=args.slowest)


def int8_row(label: str, path, feeds, device_feeds, want, ms16, first, env: dict,
             values: dict, args):
    """The int8 file compiled under `env` and `values` (of backends/cuda/int8.py), timed
    (inputs on the device, and from the host), compared with onnxruntime (`mismatch`: the
    fraction of elements that differ; max |d| in units of the output's quantized step, max
    |ort| / 127) and with the first int8 row's outputs; its kernels by template (the first
    row's) and how many took wgmma. Returns its outputs."""
    import importlib

    def place(name):
        module, attr = name.rsplit(".", 1)
        return importlib.import_module(f"dnnc.backends.cuda.{module}"), attr

    saved = {k: os.environ.get(k) for k in env}
    kept = {k: getattr(*place(k)) for k in values}
    os.environ.update(env)
    for k, v in values.items():
        setattr(*place(k), v)
    try:
        t0 = time.perf_counter()
        q8 = dnnc.compile(str(path), "cuda", cache=False)
        seconds = time.perf_counter() - t0
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
        for k, v in kept.items():
            setattr(*place(k), v)
    repeat = args.repeat
    got = np.asarray(q8(**feeds, to="numpy"))
    ms8 = q8.benchmark(*device_feeds, repeat=repeat)["median_ms"]
    host8 = q8.benchmark(*feeds.values(), repeat=repeat)["median_ms"]
    d = np.abs(got.astype(np.float64) - want)
    step = np.abs(want).max() / 127
    records = q8.profile(*device_feeds, repeat=5)
    wgmma = sum(isinstance(r.get("config"), dict) and bool(r["config"].get("wgmma"))
                for r in records)
    same = "" if first is None else \
        f"; outputs {'equal' if np.array_equal(got, first) else 'DIFFER'} to the int8 row's"
    print(f"{label:22} {ms8:8.3f} {ms16:8.3f} {ms16 / ms8:9.2f} {host8:8.3f} "
          f"{np.mean(d > 0):9.2e} {d.max() / step:11.3g}  {seconds:.1f}; {wgmma} kernels on "
          f"wgmma{same}", flush=True)
    if first is None:
        by_template("int8", q8, device_feeds, records, args.slowest)
    return got if first is None else first


def by_template(label: str, model, device_feeds, records=None, slowest: int = 8) -> None:
    """The model's kernel time (`profile`'s median ms, each kernel alone, summed) by
    template, largest first, and its `slowest` kernels (GF: its 10^9 operations, MB: the
    bytes of its parameters)."""
    records = records or model.profile(*device_feeds, repeat=5)
    totals: dict[str, list] = {}
    for r in records:
        entry = totals.setdefault(r.get("template") or "?", [0.0, 0])
        entry[0] += r["ms"]
        entry[1] += 1
    print(f"  {label} kernels: {sum(t[0] for t in totals.values()):.3f} ms in "
          f"{sum(t[1] for t in totals.values())}", flush=True)
    for name, (ms, count) in sorted(totals.items(), key=lambda t: -t[1][0])[:10]:
        print(f"    {name:30} {ms:8.3f} ms in {count} kernels", flush=True)
    for r in sorted(records, key=lambda r: -r["ms"])[:slowest]:
        config = r.get("config")
        config = ",".join(f"{k}={v}" for k, v in config.items() if v) \
            if isinstance(config, dict) else config
        print(f"      {r['ms']:7.4f} {(r.get('flops') or 0) / 1e9:6.2f} GF "
              f"{(r.get('bytes') or 0) / 1e6:6.1f} MB {r.get('kernel')} {r.get('template')} "
              f"{config}", flush=True)


SWEEP = [(128, 128, 64, 2, 2, 3), (128, 128, 64, 2, 4, 3), (128, 128, 128, 2, 2, 3),
         (128, 256, 64, 2, 4, 3), (256, 128, 64, 4, 2, 3), (64, 128, 128, 2, 2, 4),
         (128, 64, 128, 2, 2, 4), (64, 64, 128, 2, 2, 4), (128, 128, 64, 2, 4, 4)]
WGMMA_SWEEP = [(128, 256, 128, 8, 1, 4), (128, 128, 128, 8, 1, 5), (64, 128, 128, 4, 1, 5),
               (64, 64, 128, 4, 1, 4), (128, 128, 128, 8, 1, 4)]
"""(block_m, block_n, block_k bytes, warps_m, warps_n, stages) `--sweep` times (SWEEP also
staged; WGMMA_SWEEP with the wgmma knob, on sm_90), at resnet50's 3x3 and first two 1x1 conv
shapes (cuda_int8_conv2d_nhwc)."""


def with_config(graph: Graph, x: np.ndarray, config, repeat: int) -> float:
    """`product_ms` with every cuda_int8_conv2d_nhwc kernel at `config`."""
    from dataclasses import replace

    from dnnc.backends.cuda import schedules
    from dnnc.backends.cuda.int8_nhwc import INT8_CONV2D_NHWC
    from dnnc.ir.ops.registry import Pattern

    key = ("cuda", Pattern.OUT_FUSABLE)
    saved = schedules.TEMPLATES[key]
    fixed = replace(INT8_CONV2D_NHWC, default=lambda p, machine: config)
    schedules.TEMPLATES[key] = tuple(fixed if t is INT8_CONV2D_NHWC else t for t in saved)
    try:
        return product_ms(graph, x, repeat)[0]
    finally:
        schedules.TEMPLATES[key] = saved


def sweep_rows(args) -> None:
    """Per shape: the default's ms, then each SWEEP config's (plain, staged `s`) and
    WGMMA_SWEEP's (`w`, on sm_90), the best and default / best."""
    from types import SimpleNamespace

    from dnnc.backends.cuda.device import gpu_arch
    from dnnc.backends.cuda.int8_nhwc import INT8_CONV2D_NHWC
    from dnnc.backends.cuda.mma import TensorCoreConfig

    space = set(INT8_CONV2D_NHWC.space(SimpleNamespace(signed=True),
                                       SimpleNamespace(arch=gpu_arch())).configs())
    configs = [TensorCoreConfig(*t, staged=staged) for t in SWEEP for staged in (False, True)]
    configs += [TensorCoreConfig(*t, wgmma=True) for t in WGMMA_SWEEP]
    configs = [c for c in configs if c in space]
    rng = np.random.default_rng(2)
    shapes = [s for s in RESNET50 if s[3] == 3] + [s for s in RESNET50 if s[3] == 1][:2]
    for c, h, m, k, s, count in shapes:
        q, xq = int8_conv(c, h, m, k, s, 32, rng)
        label = f"conv {c}x{h}^2 -> {m} k{k} s{s}"
        base, template = product_ms(q, xq, args.repeat)
        times = {}
        for config in configs:
            name = (f"{config.block_m}x{config.block_n}x{config.block_k}/{config.warps_m}x"
                    f"{config.warps_n}/{config.stages}{'s' * config.staged}"
                    f"{'w' * config.wgmma}")
            try:
                times[name] = with_config(q, xq, config, args.repeat)
            except Exception as exc:   # one config's failure must not hide the others
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        best = min(times, key=times.get) if times else None
        print(f"{label:34} default {base:.4f}  " + " ".join(
            f"{name}={ms:.4f}" for name, ms in times.items()) + (
            f"  best {best} {times[best]:.4f} default/best {base / times[best]:.2f}"
            if best else ""), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--shapes", type=int, default=len(RESNET50))
    parser.add_argument("--models", default="resnet50,bert_base")
    parser.add_argument("--variants", default="mma.sync,unstaged",
                        help="VARIANTS rows to add (comma-separated: mma.sync, unstaged, "
                             "deep-tiles, staged-f32; empty: none): each compiles and times "
                             "the int8 model again")
    parser.add_argument("--slowest", type=int, default=8,
                        help="kernels listed one by one under each model's templates")
    parser.add_argument("--no-kernels", action="store_true")
    parser.add_argument("--no-models", action="store_true")
    parser.add_argument("--sweep", action="store_true",
                        help="only time the SWEEP tiles of the channels-last int8 conv")
    parser.add_argument("--quantize", action="store_true",
                        help="only time DynamicQuantizeLinear at BERT-base's shapes")
    args = parser.parse_args(argv)
    print(header())
    if args.sweep:
        sweep_rows(args)
        return 0
    if args.quantize:
        quantize_rows(args)
        return 0
    if not args.no_models:   # (first: the bar)
        model_rows(args)
    if not args.no_kernels:
        kernel_rows(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
