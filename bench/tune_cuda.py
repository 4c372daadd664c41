"""A short cuda tune of a dense and a conv task, and what it buys over the default schedules.

    python bench/tune_cuda.py [--trials 40] [--log-dir DIR] [--repeat 50]
                              [--precision fp32|tf32|fp16|bf16] [--only dense_1024,...]

Tasks (one-node ONNX models, float32, batch 1): bert_base's FFN dense (128x768 by 768x3072,
bias and GELU left out), a 1024^3 dense, and resnet50's 3x3 conv of its third stage (256
channels, 14x14, pad 1). Each is tuned with `dnnc.tune(..., "cuda", trials=N)` (candidates
timed with CUDA events in fork-server workers, checked against the default config's outputs),
then compiled twice, default and with the log, both checked against onnxruntime (CPU), and
timed alternately (CuPy in and out: the CUDA graph replay). Prints the GPU and versions, the
tuner's table per task, and per model the default and tuned medians, the speedup and the
best config. With `--precision` (tf32, fp16, bf16) the tasks are tuned and compiled at that
precision (the tensor-core templates' knob spaces), and both compiles are checked against
onnxruntime within that precision's tolerance (`TOLERANCE`), and against each other.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dnnc  # noqa: E402
from dnnc.autotune import records as R  # noqa: E402
from dnnc import zoo  # noqa: E402
from dnnc.autotune.tuner import table  # noqa: E402
from gpu import header  # noqa: E402


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=zoo.IR_VERSION)


def _info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def dense(m: int, k: int, n: int) -> onnx.ModelProto:
    w = (np.random.default_rng(0).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_info("x", [m, k])],
                  [_info("y", [m, n])], [numpy_helper.from_array(w, "w")])


def conv(c: int, size: int, oc: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((oc, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                  [_info("x", [1, c, size, size])], [_info("y", [1, oc, size, size])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])


TASKS = {
    "dense_bert_ffn": lambda: dense(128, 768, 3072),
    "dense_1024": lambda: dense(1024, 1024, 1024),
    "dense_vit_b32_ffn": lambda: dense(6304, 192, 768),
    "conv3x3_resnet50": lambda: conv(256, 14, 256),
}


def device_ms(compiled, x, repeat: int) -> float:
    import cupy

    stream = cupy.cuda.get_current_stream()   # CuPy in and out: the cuda target's default
    for _ in range(5):
        compiled(x)
    stream.synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeat):
        compiled(x)
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / repeat


TOLERANCE = {"fp32": (1e-3, 1e-4), "tf32": (2e-2, 2e-2), "fp16": (2e-2, 2e-2),
             "bf16": (8e-2, 8e-2)}
"""(rtol, atol) against onnxruntime's fp32 output per precision: the products' operands are
rounded (unit roundoff 2^-11 at tf32 and fp16, 2^-8 at bf16) over k up to 3072 terms of
these unit-scale inputs (test_cuda_precision's bound, with room)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--log-dir", default="tune-logs-cuda")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precision", default="fp32", choices=sorted(TOLERANCE))
    parser.add_argument("--only", default=",".join(TASKS), help="tasks, comma-separated")
    args = parser.parse_args()
    options = {} if args.precision == "fp32" else {"precision": args.precision}
    rtol, atol = TOLERANCE[args.precision]
    import cupy
    import onnxruntime as ort

    print(header(), flush=True)
    folder = Path(args.log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.only.split(","):
        model = TASKS[name]()
        log = folder / f"{name}_{args.precision}.jsonl"
        start = time.perf_counter()
        reports = dnnc.tune(model, "cuda", log=log, trials=args.trials, progress=False,
                            **options)
        tune_s = time.perf_counter() - start
        print(f"\n== {name}: {args.trials} trials, {tune_s:.0f} s\n{table(reports)}",
              flush=True)
        x = np.random.default_rng(1).standard_normal(
            [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        ).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        default = dnnc.compile(model, "cuda", **options)
        tuned = dnnc.compile(model, "cuda", tuning_log=log, **options)
        for compiled in (default, tuned):
            np.testing.assert_allclose(compiled(x, to="numpy"), want, rtol=rtol, atol=atol)
        xd = cupy.asarray(x)
        times = {"default": [], "tuned": []}
        for _ in range(args.rounds):
            for which, compiled in (("default", default), ("tuned", tuned)):
                times[which].append(device_ms(compiled, xd, args.repeat))
        d, t = (float(np.median(times[w])) for w in ("default", "tuned"))
        best = R.best_configs(R.read(log), tuned.runtime.target.key)
        rows.append((name, tune_s, d, t, "; ".join(str(c) for c in best.values())))
    print(f"\nprecision {args.precision}")
    print(f"{'task':18} {'tune s':>6} {'default ms':>10} {'tuned ms':>9} {'speedup':>7}  "
          f"best config")
    for name, tune_s, d, t, best in rows:
        print(f"{name:18} {tune_s:6.0f} {d:10.4f} {t:9.4f} {d / t:7.2f}  {best}")


if __name__ == "__main__":
    main()
