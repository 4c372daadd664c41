"""Channels-last convolutions on tensor cores against cuDNN (issue 31, item 3), one run.

    PYTHONPATH=$PWD python bench/gpu_conv.py [--batch 32] [--precision fp16|bf16|fp32]
        [--repeat 30] [--trials 5] [--no-variants] [--variant-set tiles|splits|im2col] [--no-nchw]
        [--no-shapes] [--no-model]
        [--shapes C,H,M,k,s;...|resnet18]
        [--models resnet18,mobilenet_v2] [--modes eager,reduce-overhead]

Kernels: resnet50's distinct convolution shapes (torchvision's, 224 x 224 images) at
`--batch`, each as one ConvNHWC kernel (`backends/cuda/conv_nhwc.py`: image and weights
stored in the precision's 16-bit type, the patches copied by cp.async) at its default config
and, unless `--no-variants`, a few other tiles of its space (the best named: what the default
leaves on the table), and, unless `--no-nchw`, the NCHW tensor-core kernel it replaces
(`mma.py`'s conv: patches through registers), against `torch.nn.functional.conv2d` on
channels_last tensors of that type (cuDNN, `cudnn.benchmark` on), all timed by CUDA events
(bench/gpu_timing.py: median over `--trials` of the mean of `--repeat` launches, interleaved).
TFLOP/s = 2 N OH OW M C kh kw / time; `cuDNN/dnnc` is cuDNN's time over dnnc's (the bar:
>= 0.8); the weighted rows sum each kernel's time times its count in resnet50. Each dnnc
output is checked against cuDNN's: max |d| / max |cuDNN| within `model_error_bound`.

(`--no-shapes`: none of those kernel rows; `--shapes C,H,M,k,s;...`: these in their place;
`--shapes resnet18`: resnet18's, with their counts.)

A stem (channels that are not whole 16-byte chunks) is timed as a compile runs it:
`convert_layout`'s rewrite (its input's space to depth, or its channels padded to a chunk;
one kernel, made from the NCHW input) and the ConvNHWC on that, the two launches timed
together; the ConvNHWC on the image as given (3 channels: patches through registers) is the
row `(as given)`.

`--precision fp32`: the SIMT implicit GEMM on NCHW float32 (`backends/cuda/conv.py`, the
fp32 bar of issue 31) at its default and, unless `--no-variants`, `SIMT_VARIANTS` (each
also split where k allows), against cuDNN's fp32 NCHW conv with TF32 off; no model rows.
cuDNN is timed as a CUDA graph of `--repeat` calls (`torch_graph_timer`): issued one by one
from Python, its host side (longer than the kernel at small shapes) was what got timed.

Models (unless `--no-model`): each of the zoo's `--models` at `--batch`, compiled with
`precision=`, against its torch mirror (bench/zoo_torch.py: the same weights) cast to that type and
channels_last, in each of `--modes`; median ms of a call ended by a synchronize.
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

from dnnc.backends.cuda import device, mma  # noqa: E402
from dnnc.backends.cuda.codegen import render_module  # noqa: E402
from dnnc.backends.cuda.dense import DenseConfig  # noqa: E402
from dnnc.backends.cuda.schedules import template_for  # noqa: E402
from dnnc.backends.lower import lower_group  # noqa: E402
from dnnc.ir import types as T  # noqa: E402
from dnnc.ir.graph import Graph, Value  # noqa: E402
from dnnc.ir.target import model_error_bound  # noqa: E402
from dnnc.passes.convert_layout import convert_layout  # noqa: E402
from gpu_timing import cuda_torch, cupy_timer, header, interleaved_ms, kernel_launcher, \
    load_module, median_ms, torch_graph_timer  # noqa: E402

# (C, H = W, M, kernel, stride, count in resnet50), torchvision's v1.5 (stride on the 3x3)
RESNET50 = [
    (3, 224, 64, 7, 2, 1),
    (64, 56, 64, 1, 1, 1), (256, 56, 64, 1, 1, 2), (64, 56, 64, 3, 1, 3),
    (64, 56, 256, 1, 1, 4),
    (256, 56, 128, 1, 1, 1), (128, 56, 128, 3, 2, 1), (128, 28, 512, 1, 1, 4),
    (256, 56, 512, 1, 2, 1), (512, 28, 128, 1, 1, 3), (128, 28, 128, 3, 1, 3),
    (512, 28, 256, 1, 1, 1), (256, 28, 256, 3, 2, 1), (256, 14, 1024, 1, 1, 6),
    (512, 28, 1024, 1, 2, 1), (1024, 14, 256, 1, 1, 5), (256, 14, 256, 3, 1, 5),
    (1024, 14, 512, 1, 1, 1), (512, 14, 512, 3, 2, 1), (512, 7, 2048, 1, 1, 3),
    (1024, 14, 2048, 1, 2, 1), (2048, 7, 512, 1, 1, 2), (512, 7, 512, 3, 1, 2),
]
C = mma.TensorCoreConfig
VARIANTS = [C(256, 128, 32, 4, 2, 3), C(256, 64, 32, 4, 1, 3), C(128, 128, 32, 2, 2, 4),
            C(128, 64, 32, 2, 2, 4), C(64, 128, 32, 2, 2, 4), C(128, 128, 64, 2, 2, 3),
            # warpgroups issuing wgmma (sm_90 only: skipped elsewhere, outside the space)
            C(128, 256, 64, 8, 1, 4, wgmma=True), C(128, 128, 64, 8, 1, 5, wgmma=True),
            C(64, 128, 64, 4, 1, 5, wgmma=True), C(64, 64, 64, 4, 1, 4, wgmma=True),
            C(128, 64, 64, 8, 1, 4, wgmma=True), C(128, 64, 64, 8, 1, 3, wgmma=True),
            C(64, 64, 64, 4, 1, 3, wgmma=True), C(256, 64, 64, 8, 1, 3, wgmma=True)]
"""Other configs timed beside the default (those outside a shape's space are skipped)."""

W = dict(block_k=64, wgmma=True)
SPLIT_VARIANTS = [
    C(128, 128, warps_m=8, warps_n=1, stages=5, split_k=2, refill_first=True, **W),
    C(128, 128, warps_m=8, warps_n=1, stages=5, split_k=2, producer=True, **W),
    C(128, 128, warps_m=8, warps_n=1, stages=4, split_k=3, **W),
    C(128, 256, warps_m=8, warps_n=1, stages=4, split_k=2, **W),
    C(128, 256, warps_m=8, warps_n=1, stages=4, split_k=4, producer=True, **W),
    C(128, 64, warps_m=8, warps_n=1, stages=4, split_k=2, **W),
    C(256, 64, warps_m=8, warps_n=1, stages=4, split_k=2, **W),
    C(256, 128, warps_m=8, warps_n=1, stages=4, split_k=4, **W),
    C(128, 128, warps_m=8, warps_n=1, stages=4, split_k=2, early_refill=True, **W),
    C(128, 64, warps_m=8, warps_n=1, stages=6, split_k=2, producer=True, **W),
    C(64, 256, warps_m=4, warps_n=1, stages=4, split_k=2, **W),
    C(64, 128, warps_m=4, warps_n=1, stages=4, split_k=2, **W),
    C(64, 128, warps_m=4, warps_n=1, stages=4, split_k=3, **W),
    C(64, 128, warps_m=4, warps_n=1, stages=5, split_k=2, producer=True, **W),
    C(64, 64, warps_m=4, warps_n=1, stages=4, split_k=2, **W),
    C(64, 64, warps_m=4, warps_n=1, stages=4, producer=True, staged=True, **W),
    C(64, 64, warps_m=4, warps_n=1, stages=4, split_k=2, producer="tma", **W),
    C(64, 128, warps_m=4, warps_n=1, stages=5, producer="tma", staged=True, **W),
    C(64, 128, warps_m=4, warps_n=1, stages=5, split_k=2, producer="tma", **W),
    C(128, 64, warps_m=8, warps_n=1, stages=8, producer="tma", staged=True, **W),
    C(128, 128, warps_m=8, warps_n=1, stages=5, split_k=2, producer="tma", **W)]
"""`--variant-set splits`: wgmma tiles split along k, with the cp.async producer and (where
the patches are a plain array: a pointwise conv) TMA's, for products of few pixels and deep
k (resnet50's 7 x 7 layers at batch 32: 1568 rows, 32 to 72 k tiles)."""

IM2COL_VARIANTS = [
    C(128, 64, warps_m=8, warps_n=1, stages=6, producer="tma", staged=True, **W),
    C(64, 128, warps_m=4, warps_n=1, stages=5, producer="tma", staged=True, **W),
    C(64, 128, warps_m=4, warps_n=1, stages=8, producer="tma", staged=True, **W),
    C(128, 128, warps_m=8, warps_n=1, stages=5, producer="tma", staged=True, **W),
    C(128, 256, warps_m=8, warps_n=1, stages=4, producer="tma", staged=True, **W),
    C(64, 64, warps_m=4, warps_n=1, stages=8, producer="tma", staged=True, **W),
    C(128, 128, warps_m=8, warps_n=1, stages=5, split_k=2, producer="tma", **W),
    C(128, 64, warps_m=8, warps_n=1, stages=8, split_k=2, producer="tma", **W),
    C(64, 128, warps_m=4, warps_n=1, stages=5, split_k=2, producer="tma", **W)]
"""`--variant-set im2col`: wgmma tiles with the TMA producer, the patches of a conv whose
channels fill 128-byte rows copied in TMA's im2col mode (conv_nhwc.Im2col), unsplit
(staged) and split in 2."""

STORED = {"fp16": T.float16, "bf16": T.bfloat16}
RESNET18 = [(3, 224, 64, 7, 2, 1), (64, 56, 64, 3, 1, 4), (64, 56, 128, 3, 2, 1),
            (64, 56, 128, 1, 2, 1), (128, 28, 128, 3, 1, 3), (128, 28, 256, 3, 2, 1),
            (128, 28, 256, 1, 2, 1), (256, 14, 256, 3, 1, 3), (256, 14, 512, 3, 2, 1),
            (256, 14, 512, 1, 2, 1), (512, 7, 512, 3, 1, 3)]
"""torchvision resnet18's convolutions (C, H = W, M, kernel, stride, count)."""
SIMT_TILES = ((128, 128, 8, 8, 8), (64, 256, 8, 8, 8), (64, 128, 8, 8, 8), (128, 64, 8, 8, 8),
              (128, 256, 8, 8, 8), (128, 128, 16, 8, 8), (64, 64, 8, 8, 8))
"""The tiles (tile_m, tile_n, tile_k, thread_m, thread_n) the fp32 rows time."""


def simt_variants(m: int, n: int, sms: int) -> list:
    """The fp32 conv configs timed beside the default of an m x n product: SIMT_TILES, each
    also split in 2, 4 and 8 where unsplit it has fewer than two blocks an SM (those outside
    a shape's space are skipped)."""
    return [DenseConfig(*tiles, split_k=split) for tiles in SIMT_TILES for split in (1, 2, 4, 8)
            if split == 1 or -(-m // tiles[0]) * -(-n // tiles[1]) < 2 * sms]


FP32_BOUND = 1e-4
"""max |dnnc - cuDNN| / max |cuDNN| an fp32 conv may show (both summing k in fp32)."""


def conv_graph(c, h, m, k, s, batch, dtype, nhwc: bool, rng, arrays=None
               ) -> tuple[Graph, list]:
    """(graph of one ConvNHWC, or Conv on NCHW, with a bias; [x, w, b] as float32 arrays in
    NCHW / OIHW: `arrays`, or drawn from `rng`)."""
    if arrays is None:
        x = rng.uniform(-1, 1, (batch, c, h, h)).astype(np.float32)
        w = (rng.uniform(-1, 1, (m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        b = rng.uniform(-1, 1, m).astype(np.float32)
    else:
        x, w, b = arrays
    np_type = dtype.np
    g = Graph("g")
    xv = g.add_input("x", T.TensorType(dtype, (batch, h, h, c) if nhwc else x.shape))
    wa = w.transpose(0, 2, 3, 1) if nhwc else w
    wv = Value("w", T.TensorType(dtype, wa.shape), const=np.ascontiguousarray(wa).astype(np_type))
    bv = Value("b", T.TensorType(dtype, (m,)), const=b.astype(np_type))
    attrs = dict(strides=[s, s], pads=[k // 2] * 4)
    g.outputs = [g.add("ConvNHWC" if nhwc else "Conv", xv, wv, bv, **attrs)]
    return g, [x, w, b]


def compiled_route(graph: Graph, machine) -> tuple[list, Graph]:
    """(the nodes before the conv, the conv's own graph) of NCHW `graph`'s one Conv as a
    compile runs it: `convert_layout`'s "nhwc_conv" (a stem's channels padded to whole chunks,
    or its input's space to depth), the conv's input made by those nodes (one kernel), the
    ConvNHWC alone a graph of that input."""
    convert_layout(graph, dataclasses.replace(machine, layouts=("nhwc_conv",)))
    at = next(n for n, node in enumerate(graph.nodes) if node.op == "ConvNHWC")
    conv = graph.nodes[at]
    g = Graph("g")
    xv = g.add_input("x", conv.inputs[0].type)
    g.outputs = [g.add("ConvNHWC", xv, *conv.inputs[1:], **conv.attrs)]
    return graph.nodes[:at], g


def kernels(graph: Graph, machine, configs: list) -> list:
    """[(name, config, scheduled PrimFunc, kernel)] of the graph's one node under its
    template's default and each of `configs` inside its space."""
    out = []
    for n, config in enumerate([None] + configs):
        kernel = lower_group(list(graph.nodes), f"k{n}", outputs=graph.outputs)
        template, problem = template_for(kernel, machine=machine)
        space = template.space(problem, machine)
        if config is None:
            config = template.default(problem, machine)
        else:
            try:
                config = space.check(config)
            except Exception:
                continue
            if config == out[0][1]:
                continue
        out.append((template.name, config, template.build(problem, config, machine), kernel))
    return out


def conv_row(cp, torch, shape, args, machine, rng) -> tuple[float, float, float, list[str]]:
    """(dnnc default ms, best dnnc ms, cuDNN ms, printed lines) of one shape."""
    c, h, m, k, s, count = shape
    fp32 = args.precision == "fp32"
    variants = {"splits": SPLIT_VARIANTS, "im2col": IM2COL_VARIANTS}.get(args.variant_set,
                                                                         VARIANTS)
    dtype = T.float32 if fp32 else STORED[args.precision]
    t_dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16",
                              "fp32": "float32"}[args.precision])
    graph, (x, w, b) = conv_graph(c, h, m, k, s, args.batch, dtype, not fp32, rng)
    edge = []   # a stem's: the kernel making its conv's input (compiled_route)
    if fp32:
        n = args.batch * (-(-h // s)) ** 2
        cases = kernels(graph, machine, [] if args.no_variants else
                        simt_variants(m, n, device.gpu_of(machine).sms))
    elif c % 8:
        nchw, _ = conv_graph(c, h, m, k, s, args.batch, dtype, False, rng, (x, w, b))
        edge, routed = compiled_route(nchw, machine)
        cases = kernels(routed, machine, [] if args.no_variants else variants)
        cases += [(f"{name} (as given)", *rest) for name, *rest in kernels(graph, machine, [])]
    else:
        cases = kernels(graph, machine, [] if args.no_variants else variants)
    if not args.no_nchw and not fp32:
        nchw, _ = conv_graph(c, h, m, k, s, args.batch, dtype, False, rng, (x, w, b))
        cases += [(f"{name} (nchw)", *rest) for name, *rest in kernels(nchw, machine, [])]
    funcs = [(dataclasses.replace(f, name=f"c{n}_{f.name}"), True)
             for n, (_, _, f, _) in enumerate(cases)]
    if edge:
        made = lower_group(edge, "edge", outputs=[edge[-1].outputs[0]])
        template, problem = template_for(made, machine=machine)
        funcs.append((template.build(problem, template.default(problem, machine), machine),
                      True))
    module = render_module(funcs)
    raw = load_module(cp, module.source)   # (sm_90a where a variant uses wgmma)
    layout = torch.contiguous_format if fp32 else torch.channels_last
    tx = torch.from_numpy(x).cuda().to(t_dtype).contiguous(memory_format=layout)
    tw = torch.from_numpy(w).cuda().to(t_dtype).contiguous(memory_format=layout)
    tb = torch.from_numpy(b).cuda().to(t_dtype)
    f = torch.nn.functional.conv2d
    want = f(tx, tw, tb, stride=s, padding=k // 2)
    want_np = want.float().cpu().numpy()
    nhwc_in = cp.asarray(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).astype(dtype.np)
                         .view(np.uint16))
    nchw_in = cp.asarray(x.astype(dtype.np).view(np.uint16))
    timers, outs = [torch_graph_timer(lambda: f(tx, tw, tb, stride=s, padding=k // 2))], []
    made_launch = None
    if edge:   # the conv's input as the compile makes it, timed with each routed conv
        made_launch, made_in = kernel_launcher(cp, raw, module, funcs[-1][0], made, nchw_in,
                                               cp.uint16, lambda a: a.view(np.uint16))
    for (name, config, _, kernel), (func, _) in zip(cases, funcs):
        routed_case = made_launch is not None and not name.endswith(")")
        if fp32:
            launch, out = kernel_launcher(cp, raw, module, func, kernel, cp.asarray(x))
        else:
            launch, out = kernel_launcher(cp, raw, module, func, kernel,
                                          made_in if routed_case else
                                          nchw_in if name.endswith("(nchw)") else nhwc_in,
                                          cp.uint16, lambda a: a.view(np.uint16))
        if routed_case:
            launch = (lambda conv: lambda: (made_launch(), conv()))(launch)
        timers.append(cupy_timer(cp, launch))
        outs.append(out)
    times = interleaved_ms(timers, args.repeat, args.trials)
    cudnn = times[0]
    flops = 2 * args.batch * (h // s) ** 2 * m * c * k * k
    lines, best = [], None
    for n, ((name, config, _, _), out, ms) in enumerate(zip(cases, outs, times[1:])):
        got = cp.asnumpy(out).view(dtype.np).astype(np.float32)
        if not name.endswith("(nchw)"):
            got = got if fp32 else got.transpose(0, 3, 1, 2)
            if best is None or ms < best:
                best = ms
        err = np.abs(got - want_np).max() / np.abs(want_np).max()
        ok = "ok" if err <= (FP32_BOUND if fp32 else model_error_bound(args.precision)) \
            else "WRONG"
        tag = "default" if n == 0 or name.endswith("(nchw)") else "variant"
        lines.append(f"  {name:<28} {tag:<8} {mma_text(config):<22} {ms:8.4f} ms "
                     f"{flops / ms / 1e9:7.1f} TF/s  cuDNN/dnnc {cudnn / ms:5.2f}  "
                     f"err {err:.1e} {ok}")
    head = (f"C {c:>4} H {h:>3} M {m:>4} {k}x{k} s{s} x{count}: cuDNN {cudnn:.4f} ms "
            f"({flops / cudnn / 1e9:.1f} TF/s)")
    if edge:
        head += (f"; dnnc's rows but '(as given)': one kernel of {', '.join(n.op for n in edge)}"
                 f" making its input {'x'.join(map(str, cases[0][3].inputs[0].type.shape))},"
                 " then the conv, timed together")
    return times[1], best, cudnn, [head] + lines


PRODUCER_TEXT = {True: " p", "tma": " tma"}


def mma_text(c) -> str:
    if isinstance(c, DenseConfig):
        return f"{c.tile_m}x{c.tile_n}x{c.tile_k} t{c.thread_m}x{c.thread_n}" + \
            (f" k/{c.split_k}" if c.split_k > 1 else "")
    if not isinstance(c, mma.TensorCoreConfig):
        return str(c)[:22]
    return (f"{c.block_m}x{c.block_n}x{c.block_k} w{c.warps_m}x{c.warps_n} s{c.stages}"
            + (f" k/{c.split_k}" if c.split_k > 1 else "") + PRODUCER_TEXT.get(c.producer, "")
            + " rf" * c.refill_first + " st" * c.staged + " cl" * c.cluster_split)


def model_row(torch, name: str, args) -> str:
    """Zoo model `name` at --batch end to end: dnnc against its torch mirror."""
    import dnnc
    from dnnc import zoo
    from gpu_versus import torch_times
    from zoo_torch import module_for

    model = zoo.build(name, batch=args.batch)
    t_dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[args.precision])
    x = torch.randn((args.batch, 3, 224, 224), generator=torch.Generator().manual_seed(0))
    module = module_for(model).cuda()
    with torch.no_grad():
        want = module(x.cuda()).float().cpu().numpy()
    t_module = module.to(t_dtype).to(memory_format=torch.channels_last)
    t_x = x.cuda().to(t_dtype).contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    times = torch_times(t_module, t_x, args.modes.split(","), args.repeat, 5)
    compiled = dnnc.compile(model, "cuda", precision=args.precision, progress=False)
    xc = x.cuda()
    got = compiled.run(xc, to="numpy")[0]

    def call():
        compiled.run(xc)
        torch.cuda.current_stream().synchronize()

    ours = median_ms(call, args.repeat, 5)
    best = min((t for t in times.values() if t), default=float("nan"))
    err = np.abs(got - want).max() / np.abs(want).max()
    cells = " ".join(f"{mode} {t:.3f}" if t else f"{mode} -" for mode, t in times.items())
    transposes = sum(n.op == "Transpose" for n in compiled.runtime.graph.nodes)
    return (f"{name} (zoo) {args.precision} b{args.batch}: dnnc {ours:.3f} ms | torch "
            f"channels_last {cells} | dnnc/best {ours / best:.2f} | rel err {err:.1e} "
            f"(bound {model_error_bound(args.precision):.1e}) | top1 "
            f"{np.mean(got.argmax(1) == want.argmax(1)):.2f} | transposes {transposes}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp16", choices=sorted(STORED) + ["fp32"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--shapes", default=None,
                        help="C,H,M,kernel,stride[;...] in place of resnet50's (a count of 1 each)")
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--variant-set", default="tiles", choices=("tiles", "splits", "im2col"))
    parser.add_argument("--no-nchw", action="store_true")
    parser.add_argument("--no-shapes", action="store_true")
    parser.add_argument("--no-model", action="store_true")
    parser.add_argument("--modes", default="eager")
    parser.add_argument("--models", default="resnet18,mobilenet_v2")
    args = parser.parse_args(argv)
    cp = device.import_cupy()
    torch = cuda_torch()
    if torch is None:
        print("torch with CUDA is needed (cuDNN is the peer)")
        return 1
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False   # (fp32: cuDNN's fp32 kernels, as dnnc's)
    print(header())
    machine = dataclasses.replace(device.machine(), precision=args.precision)
    named = {"resnet50": RESNET50, "resnet18": RESNET18}
    shapes = named.get(args.shapes or "resnet50") or [
        tuple(int(v) for v in text.split(",")) + (1,) for text in args.shapes.split(";")]
    label = args.shapes if args.shapes in named else "resnet50" if args.shapes is None \
        else "these"
    print(f"{label} conv shapes, batch {args.batch}, {args.precision}, {machine.arch}; "
          f"median of {args.trials} x mean of {args.repeat}")
    rng = np.random.default_rng(0)
    totals, failed = np.zeros(3), 0
    for shape in [] if args.no_shapes else shapes:
        try:
            default, best, cudnn, lines = conv_row(cp, torch, shape, args, machine, rng)
        except Exception as exc:   # one shape's failure must not hide the others
            failed += 1
            print(f"{shape}: error {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            traceback.print_exc(file=sys.stderr)
            continue
        totals += shape[-1] * np.array([default, best, cudnn])
        print("\n".join(lines), flush=True)
        failed += any(line.endswith("WRONG") for line in lines)
    if totals[0]:
        print(f"{label} convs weighted: dnnc default {totals[0]:.3f} ms, best variant "
              f"{totals[1]:.3f} ms, cuDNN {totals[2]:.3f} ms: cuDNN/dnnc "
              f"{totals[2] / totals[0]:.2f} (best {totals[2] / totals[1]:.2f})")
    for name in [] if args.no_model or args.precision == "fp32" else args.models.split(","):
        try:
            print(model_row(torch, name, args), flush=True)
        except Exception as exc:
            failed += 1
            print(f"{name}: error {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            traceback.print_exc(file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
