"""Channels-last depthwise convolutions and plane means against torch (issue 31, item 3), one
run.

    PYTHONPATH=$PWD python bench/gpu_depthwise.py [--batch 32] [--precision fp16|bf16]
        [--repeat 30] [--trials 5] [--models efficientnet_b0,mobilenet_v2] [--no-variants]

Kernels: the depthwise convolutions of torchvision's efficientnet_b0, mobilenet_v2 and
convnext_tiny (224 x 224 images) at `--batch`, each with a bias, as
- dnnc's channels-last template (`backends/cuda/depthwise_nhwc.py`, a ConvNHWC of group C)
  at its default config and, unless `--no-variants`, a few others of its space (the best
  named);
- dnnc's NCHW depthwise template (`depthwise.py`) on the same convolution, NCHW;
- `torch.nn.functional.conv2d(groups=C)` on channels_last tensors and on NCHW ones (cuDNN,
  `cudnn.benchmark` on);
all in the precision's 16-bit type, timed by CUDA events (bench/gpu_timing.py: median over
`--trials` of the mean of `--repeat` launches, interleaved). GB/s counts the image read and
the output written once. `torch_cl/dnnc` is torch channels_last's time over dnnc's NHWC
default. Each dnnc output is checked against torch's (max |d| / max |torch| within
`model_error_bound`). Weighted rows sum each kernel's time times its count in the model.
Then efficientnet_b0's squeeze-and-excitation pools: the mean over a channels-last plane
(`plane_mean.py`) against torch's `x.mean((2, 3))` on channels_last tensors.
Never imported by dnnc.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dnnc.backends.cuda import device  # noqa: E402
from dnnc.backends.cuda.codegen import render_module  # noqa: E402
from dnnc.backends.cuda.depthwise_nhwc import DepthwiseNHWCConfig as D  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.target import model_error_bound  # noqa: E402
from gpu_conv import kernels, launcher  # noqa: E402
from gpu_timing import cupy_timer, cuda_torch, header, interleaved_ms, torch_timer  # noqa: E402

# (C, H = W of the input, kernel, stride, count in the model)
MODELS = {
    "efficientnet_b0": [(32, 112, 3, 1, 1), (96, 112, 3, 2, 1), (144, 56, 3, 1, 1),
                        (144, 56, 5, 2, 1), (240, 28, 5, 1, 1), (240, 28, 3, 2, 1),
                        (480, 14, 3, 1, 2), (480, 14, 5, 1, 1), (672, 14, 5, 1, 2),
                        (672, 14, 5, 2, 1), (1152, 7, 5, 1, 3), (1152, 7, 3, 1, 1)],
    "mobilenet_v2": [(32, 112, 3, 1, 1), (96, 112, 3, 2, 1), (144, 56, 3, 1, 1),
                     (144, 56, 3, 2, 1), (192, 28, 3, 1, 2), (192, 28, 3, 2, 1),
                     (384, 14, 3, 1, 4), (576, 14, 3, 1, 2), (576, 14, 3, 2, 1),
                     (960, 7, 3, 1, 3)],
    "convnext_tiny": [(96, 56, 7, 1, 3), (192, 28, 7, 1, 3), (384, 14, 7, 1, 9),
                      (768, 7, 7, 1, 3)],
}
# (C, H = W) of efficientnet_b0's SE pools (after each block's depthwise conv) and count
POOLS = [(32, 112, 1), (96, 56, 1), (144, 56, 1), (144, 28, 1), (240, 28, 1), (240, 14, 1),
         (480, 14, 3), (672, 14, 2), (672, 7, 1), (1152, 7, 4)]
VARIANTS = [D(8, 8, 2, 32, 4), D(16, 4, 2, 32, 4), D(8, 4, 1, 64, 4), D(8, 8, 1, 16, 4),
            D(4, 4, 1, 64, 4), D(16, 8, 4, 16, 4), D(8, 2, 2, 128, 4), D(8, 8, 4, 32, 4),
            D(16, 8, 2, 16, 4), D(16, 8, 4, 32, 4), D(8, 16, 4, 32, 4), D(16, 16, 4, 32, 4),
            D(32, 8, 8, 32, 4)]
"""Configs timed beside the default (those outside a shape's space skipped)."""

STORED = {"fp16": T.float16, "bf16": T.bfloat16}


def knobs(config) -> str:
    """A config's knobs without its class name."""
    return str(config).split("(", 1)[-1].rstrip(")")


def depthwise_graph(c, h, k, s, batch, dtype, nhwc: bool, x, w, b) -> Graph:
    """One depthwise conv with a bias, channels-last (ConvNHWC, weights [C, k, k, 1]) or
    NCHW (Conv, [C, 1, k, k]); x, w, b float32 in NCHW / OIHW."""
    g = Graph("g")
    xv = g.add_input("x", T.TensorType(dtype, (batch, h, h, c) if nhwc else x.shape))
    wa = w.transpose(0, 2, 3, 1) if nhwc else w
    wv = Value("w", T.TensorType(dtype, wa.shape), const=np.ascontiguousarray(wa).astype(
        dtype.np))
    bv = Value("b", T.TensorType(dtype, (c,)), const=b.astype(dtype.np))
    g.outputs = [g.add("ConvNHWC" if nhwc else "Conv", xv, wv, bv, group=c, strides=[s, s],
                       pads=[k // 2] * 4)]
    return g


def conv_rows(cp, torch, shape, args, machine, rng) -> tuple[list[float], list[str]]:
    """([dnnc NHWC default, best NHWC, dnnc NCHW, torch channels_last, torch NCHW] ms, the
    printed lines) of one shape."""
    c, h, k, s, _ = shape
    dtype = STORED[args.precision]
    t_dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[args.precision])
    x = rng.uniform(-1, 1, (args.batch, c, h, h)).astype(np.float32)
    w = (rng.uniform(-1, 1, (c, 1, k, k)) / k).astype(np.float32)
    b = rng.uniform(-1, 1, c).astype(np.float32)
    nhwc = depthwise_graph(c, h, k, s, args.batch, dtype, True, x, w, b)
    cases = kernels(nhwc, machine, [] if args.no_variants else VARIANTS)
    nchw = depthwise_graph(c, h, k, s, args.batch, dtype, False, x, w, b)
    cases += [(f"{name} (nchw)", *rest) for name, *rest in kernels(nchw, machine, [])]
    funcs = [(dataclasses.replace(f, name=f"c{n}_{f.name}"), True)
             for n, (_, _, f, _) in enumerate(cases)]
    module = render_module(funcs)
    raw = cp.RawModule(code=module.source, options=("-std=c++17",))
    tx = torch.from_numpy(x).cuda().to(t_dtype)
    tw = torch.from_numpy(w).cuda().to(t_dtype)
    tb = torch.from_numpy(b).cuda().to(t_dtype)
    tx_cl = tx.contiguous(memory_format=torch.channels_last)
    tw_cl = tw.contiguous(memory_format=torch.channels_last)
    f = torch.nn.functional.conv2d
    want = f(tx, tw, tb, stride=s, padding=k // 2, groups=c).float().cpu().numpy()
    nhwc_in = cp.asarray(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).astype(dtype.np)
                         .view(np.uint16))
    nchw_in = cp.asarray(x.astype(dtype.np).view(np.uint16))
    timers = [torch_timer(lambda: f(tx_cl, tw_cl, tb, stride=s, padding=k // 2, groups=c)),
              torch_timer(lambda: f(tx, tw, tb, stride=s, padding=k // 2, groups=c))]
    outs = []
    for (name, _, _, kernel), (func, _) in zip(cases, funcs):
        launch, out = launcher(cp, raw, module, func, kernel,
                               nchw_in if name.endswith("(nchw)") else nhwc_in)
        timers.append(cupy_timer(cp, launch))
        outs.append(out)
    times = interleaved_ms(timers, args.repeat, args.trials)
    torch_cl, torch_nchw = times[:2]
    oh = (h + 2 * (k // 2) - k) // s + 1
    moved = args.batch * c * (h * h + oh * oh) * 2
    lines, best, nchw_ms = [], None, None
    for n, ((name, config, _, _), out, ms) in enumerate(zip(cases, outs, times[2:])):
        got = cp.asnumpy(out).view(dtype.np).astype(np.float32)
        if name.endswith("(nchw)"):
            nchw_ms = ms
        else:
            got = got.transpose(0, 3, 1, 2)
            best = ms if best is None else min(best, ms)
        err = np.abs(got - want).max() / np.abs(want).max()
        ok = "ok" if err <= model_error_bound(args.precision) else "WRONG"
        tag = "default" if n == 0 or name.endswith("(nchw)") else "variant"
        lines.append(f"  {name:<28} {tag:<8} {knobs(config):<58} {ms:8.4f} ms "
                     f"{moved / ms / 1e6:7.1f} GB/s  torch_cl/dnnc {torch_cl / ms:5.2f}  "
                     f"err {err:.1e} {ok}")
    head = (f"C {c:>4} H {h:>3} {k}x{k} s{s} x{shape[-1]}: torch channels_last "
            f"{torch_cl:.4f} ms ({moved / torch_cl / 1e6:.0f} GB/s), NCHW {torch_nchw:.4f} ms")
    return [times[2], best, nchw_ms, torch_cl, torch_nchw], [head] + lines


def pool_row(cp, torch, shape, args, machine, rng) -> tuple[list[float], str]:
    """([dnnc plane mean ms, torch channels_last mean ms], the printed line)."""
    c, h, _ = shape
    dtype = STORED[args.precision]
    t_dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[args.precision])
    x = rng.uniform(-1, 1, (args.batch, h, h, c)).astype(np.float32)
    g = Graph("g")
    xv = g.add_input("x", T.TensorType(dtype, x.shape))
    axes = Value("axes", T.TensorType(T.int64, (2,)), const=np.array([1, 2], np.int64))
    g.outputs = [g.add("ReduceMean", xv, axes, keepdims=1)]
    ((name, config, func, kernel),) = kernels(g, machine, [])
    funcs = [(func, True)]
    module = render_module(funcs)
    raw = cp.RawModule(code=module.source, options=("-std=c++17",))
    launch, out = launcher(cp, raw, module, func, kernel,
                           cp.asarray(x.astype(dtype.np).view(np.uint16)))
    tx = torch.from_numpy(x.transpose(0, 3, 1, 2)).cuda().to(t_dtype).contiguous(
        memory_format=torch.channels_last)
    want = tx.float().mean((2, 3)).cpu().numpy()
    ours, theirs = interleaved_ms([cupy_timer(cp, launch),
                                   torch_timer(lambda: tx.mean((2, 3), keepdim=True))],
                                  args.repeat, args.trials)
    got = cp.asnumpy(out).view(dtype.np).astype(np.float32).reshape(want.shape)
    err = np.abs(got - want).max() / np.abs(want).max()
    ok = "ok" if err <= model_error_bound(args.precision) else "WRONG"
    moved = args.batch * c * h * h * 2
    return [ours, theirs], (
        f"pool C {c:>4} H {h:>3} x{shape[-1]}: {name} {knobs(config)} {ours:.4f} ms "
        f"({moved / ours / 1e6:.0f} GB/s) | torch channels_last mean {theirs:.4f} ms | "
        f"torch/dnnc {theirs / ours:.2f} | err {err:.1e} {ok}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp16", choices=sorted(STORED))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--models", default="efficientnet_b0,mobilenet_v2")
    parser.add_argument("--no-variants", action="store_true")
    args = parser.parse_args(argv)
    cp = device.import_cupy()
    torch = cuda_torch()
    if torch is None:
        print("torch with CUDA is needed (cuDNN is the peer)")
        return 1
    torch.backends.cudnn.benchmark = True
    print(header())
    machine = dataclasses.replace(device.machine(), precision=args.precision)
    rng = np.random.default_rng(0)
    failed = 0
    for model in args.models.split(","):
        print(f"{model} depthwise convs, batch {args.batch}, {args.precision}, {machine.arch}; "
              f"median of {args.trials} x mean of {args.repeat}", flush=True)
        totals = np.zeros(5)
        for shape in MODELS[model]:
            try:
                times, lines = conv_rows(cp, torch, shape, args, machine, rng)
            except Exception as exc:   # one shape's failure must not hide the others
                failed += 1
                print(f"{shape}: error {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                traceback.print_exc(file=sys.stderr)
                continue
            totals += shape[-1] * np.array(times)
            print("\n".join(lines), flush=True)
            failed += any(line.endswith("WRONG") for line in lines)
        print(f"{model} depthwise weighted ({sum(s[-1] for s in MODELS[model])} convs): dnnc "
              f"NHWC default {totals[0]:.3f} ms (best variants {totals[1]:.3f}), dnnc NCHW "
              f"{totals[2]:.3f}, torch channels_last {totals[3]:.3f}, torch NCHW "
              f"{totals[4]:.3f}: torch_cl/dnnc {totals[3] / totals[0]:.2f}", flush=True)
    totals = np.zeros(2)
    for shape in POOLS:
        try:
            times, line = pool_row(cp, torch, shape, args, machine, rng)
        except Exception as exc:
            failed += 1
            print(f"pool {shape}: error {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            traceback.print_exc(file=sys.stderr)
            continue
        totals += shape[-1] * np.array(times)
        print(line, flush=True)
        failed += line.endswith("WRONG")
    print(f"efficientnet_b0 SE pools weighted: dnnc {totals[0]:.3f} ms, torch channels_last "
          f"{totals[1]:.3f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
