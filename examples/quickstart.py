"""dnnc's main job on a model it builds itself: build a zoo model, compile it, run it, compare
with the reference, print the timing.

    python examples/quickstart.py [--model resnet18] [--target numpy]

The reference is onnxruntime when it is installed (the `test` extra), else dnnc's own numpy
target.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dnnc
from dnnc import zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", choices=sorted(zoo.MODELS))
    parser.add_argument("--target", default="llvm", choices=["llvm", "numpy"])
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    model = zoo.build(args.model, batch=args.batch)
    inputs = zoo.inputs_for(model, np.random.default_rng())
    start = time.perf_counter()
    compiled = dnnc.compile(model, target=args.target)
    print(f"compiled {args.model} for {args.target} in {time.perf_counter() - start:.2f} s: "
          f"{compiled}")
    outputs = compiled.run(*inputs.values())

    try:
        import onnxruntime as ort

        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        reference, ref_name = session.run(None, inputs), f"onnxruntime {ort.__version__}"
    except ImportError:
        reference = dnnc.compile(model, target="numpy").run(*inputs.values())
        ref_name = "dnnc numpy target"
    worst = max(float(np.max(np.abs(o.astype(np.float64) - r))) for o, r in zip(outputs, reference))
    for o, r in zip(outputs, reference):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5)
    print(f"outputs match {ref_name} (max abs difference {worst:.2e})")
    timing = compiled.benchmark(*inputs.values(), repeat=5, warmup=1)
    print(f"latency: median {timing['median_ms']:.1f} ms, min {timing['min_ms']:.1f} ms "
          f"over {timing['repeat']} runs (batch {args.batch})")


if __name__ == "__main__":
    main()
