"""dnnc's call time block by block while another runtime's blocks alternate with it in the same
process, as `bench/cpu.py --alone-blocks` times them: shows whether a peer's threads leave
dnnc's slower after they ran (a median of 3 blocks hides a minority of slow blocks and
reports a majority as the model's time).

    python bench/cpu_interference.py [--model FILE.onnx|zoo name] [--peer openvino-f32]
                                     [--blocks 6] [--repeat 10] [--pin-caller CPU]
                                     [--peer-pinning 0|1]

Prints each block's median milliseconds, dnnc's and the peer's. `--pin-caller` pins the
calling thread to one CPU first (what a pinned peer's calling thread does to the scheduler's
view); `--peer-pinning 0` turns OpenVINO's ENABLE_CPU_PINNING off. Timing only, no checks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu as bench  # noqa: E402
import dnnc  # noqa: E402


def openvino_peer(model, threads: int, f32: bool, pinning: bool) -> bench.Peer:
    """bench/cpu.py's OpenVINO peer with ENABLE_CPU_PINNING set."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
              "ENABLE_CPU_PINNING": pinning}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    core = ov.Core()
    request = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                 config).create_infer_request()
    return bench.Peer("openvino", "f32" if f32 else "default",
                      lambda feeds: list(request.infer(feeds).to_tuple()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--peer", default="openvino-f32", choices=sorted(bench.PEERS))
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--pin-caller", type=int, default=None)
    parser.add_argument("--peer-pinning", type=int, choices=(0, 1), default=None)
    parser.add_argument("--ort-spin", type=int, choices=(0, 1), default=None)
    args = parser.parse_args()
    target = bench.host_target()
    model, inputs, name = bench.load_model(args.model, 1, None)
    compiled = dnnc.compile(model, target="llvm", cpu=target)
    run = lambda: compiled.run(*inputs.values())   # noqa: E731
    if args.peer_pinning is not None and args.peer.startswith("openvino"):
        peer = openvino_peer(model, target.threads, args.peer == "openvino-f32",
                             bool(args.peer_pinning))
    else:
        peer = bench.PEERS[args.peer](model, target.threads, args)
    bench.own_code(compiled, run, name)
    if args.pin_caller is not None:
        os.sched_setaffinity(0, {args.pin_caller})
    print(f"# {name}, {target.threads} threads; dnnc blocks against {args.peer} blocks, "
          f"{args.repeat} calls each, 0.3 s apart (bench/cpu.py's alone blocks)")
    for block in range(args.blocks):
        mine = bench.median_ms(run, args.repeat, pause=0.3)
        theirs = bench.median_ms(lambda: peer.run(inputs), args.repeat, pause=0.3)
        print(f"block {block}: dnnc {mine:7.3f} ms   {args.peer} {theirs:7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
