"""The attention rows of bench/gpu_kernels.py (`--only attention`): bert's and vit's attention
and 1024 / 4096 tokens, as the unfused MatMul -> Softmax -> MatMul chain and as one fused
kernel under its default and other configs (the SIMT template at fp32, the tensor-core one at
tf32, fp16 and bf16), against torch's scaled_dot_product_attention in the same precision
(the math backend at fp32 and tf32, its default backends, flash attention, at fp16 and
bf16), each checked against NumPy (float64). Never imported by dnnc.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dnnc.backends.cuda import device
from dnnc.backends.cuda.attention import AttentionConfig
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.mma_attention import MmaAttentionConfig
from dnnc.backends.cuda.schedules import template_for
from dnnc.backends.lower import lower_group
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.target import Target
from gpu_timing import cuda_torch, event_ms, fp32_only, interleaved_ms, launch_args, \
    load_module, torch_timer

RTOL, ATOL = 1e-4, 1e-5


ATTENTION_SHAPES = (("bert_base b1", 1, 12, 128, 128, 64), ("bert_base b8", 8, 12, 128, 128, 64),
                    ("vit b1", 1, 3, 197, 197, 64), ("vit b32", 32, 3, 197, 197, 64),
                    ("seq 1024", 1, 12, 1024, 1024, 64),
                    ("seq 4096", 1, 12, 4096, 4096, 64))
"""(label, batch, heads, queries, keys, head size) of the attention table (`--attention-shapes
default`): K arriving transposed, [b, h, d, keys], as bert's key projection stores it."""
DECODE_SHAPES = (("gpt2 decode b1", 1, 12, 1, 96, 64), ("gpt2 decode b8", 8, 12, 1, 96, 64),
                 ("llama decode b1", 1, 8, 1, 96, 64), ("llama decode b8", 8, 8, 1, 96, 64))
"""A decode step's attention (`--attention-shapes decode`): one query row against a static
cache of 96 keys (bench/torch_decode.py's prompt 32 and 64 new tokens), K as the cache holds
it, [b, h, keys, d], through a Transpose (as torch_attention imports sdpa)."""
DECODE_VARIANTS = ((8, 128, 32, 1), (8, 128, 16, 1), (8, 256, 32, 1), (8, 64, 16, 1),
                   (8, 128, 16, 1, True, 2), (8, 128, 16, 1, True, 4),
                   (8, 128, 16, 1, False, 4), (8, 256, 32, 1, True, 2),
                   (16, 128, 16, 1, True, 4), (8, 64, 16, 1, True, 4),
                   (8, 64, 16, 2, True, 4), (1, 32, 32, 1), (1, 32, 32, 1, True, 2),
                   (2, 32, 16, 1, True, 4), (4, 64, 16, 1, True, 4),
                   (2, 64, 32, 1, True, 2), (4, 128, 32, 1, True, 2),
                   (32, 128, 32, 4, True, 2))
"""(rows, threads, tile_k, thread_rows[, unroll[, split]]) configs timed at DECODE_SHAPES: one
query row's blocks of the fewest rows (8, or 1, 2, 4: a row group of a warp), the keys split
in 2 to 8 slices; the last is the default before decode shapes had their own."""
ATTENTION_VARIANTS = ((8, 32, 32, 1), (16, 64, 32, 1), (16, 64, 64, 1), (32, 128, 32, 1),
                      (64, 256, 32, 1), (16, 128, 32, 1), (32, 256, 32, 1), (64, 128, 32, 1),
                      (32, 64, 32, 1), (16, 64, 32, 2), (32, 64, 32, 2), (64, 128, 32, 2),
                      (32, 128, 32, 4), (32, 64, 32, 4), (64, 128, 32, 4),
                      (8, 32, 32, 1, False), (32, 128, 32, 1, False), (64, 256, 32, 1, False),
                      (64, 128, 32, 2, False),
                      # the keys split in slices (batch 1's few blocks)
                      (32, 128, 32, 4, True, 2), (32, 128, 32, 4, True, 4),
                      (16, 128, 32, 1, True, 2), (16, 128, 32, 1, True, 4),
                      (32, 128, 16, 4, True, 8))
"""(rows, threads, tile_k, thread_rows[, unroll[, split]]) configs of the SIMT template timed
beside the default."""
MMA_ATTENTION_VARIANTS = ((1, 16), (2, 32), (4, 32), (4, 64), (8, 32), (8, 64), (4, 128))
"""(warps, tile_k) of the tensor-core template timed beside the default (tf32, fp16, bf16)."""
ATTENTION_TOLERANCE = {"tf32": 5e-3, "fp16": 5e-3, "bf16": 4e-2}
"""Largest error at a reduced precision, relative to the output's largest magnitude (fp32:
RTOL and ATOL): the operands' rounding (test_cuda_mma_attention's bound, about 1e-3 at tf32
and fp16 for these inputs) with room."""


def attention_chain(batch: int, heads: int, queries: int, keys: int, d: int,
                    cache: bool = False) -> Graph:
    """bert's attention as exported: MatMul(Q, Kᵀ) / sqrt(d) + mask -> Softmax -> MatMul(., V),
    K given [b, h, d, keys]; with `cache`, [b, h, keys, d] through a Transpose (a decode
    step's static cache)."""
    g = Graph("attention")
    q = g.add_input("q", T.TensorType(T.float32, (batch, heads, queries, d)))
    if cache:
        k = g.add_input("k", T.TensorType(T.float32, (batch, heads, keys, d)))
        kt = g.add("Transpose", k, perm=[0, 1, 3, 2])
    else:
        kt = g.add_input("kt", T.TensorType(T.float32, (batch, heads, d, keys)))
    v = g.add_input("v", T.TensorType(T.float32, (batch, heads, keys, d)))
    mask = g.add_input("mask", T.TensorType(T.float32, (batch, 1, 1, keys)))
    scale = Value("scale", T.TensorType(T.float32, ()), const=np.array(d ** 0.5, np.float32))
    x = g.add("Div", g.add("MatMul", q, kt), scale)
    p = g.add("Softmax", g.add("Add", x, mask), axis=-1)
    g.outputs = [g.add("MatMul", p, v)]
    return g


def attention_inputs(batch: int, heads: int, queries: int, keys: int, d: int
                     ) -> list[np.ndarray]:
    """Q, Kᵀ [b, h, d, keys], V and the mask (transpose Kᵀ for a `cache` chain's K)."""
    rng = np.random.default_rng(3)
    q, kt, v = (rng.standard_normal(shape, dtype=np.float32) for shape in (
        (batch, heads, queries, d), (batch, heads, d, keys), (batch, heads, keys, d)))
    mask = np.zeros((batch, 1, 1, keys), np.float32)
    for b in range(batch):   # right padding of up to a quarter of the tokens, as bert's
        mask[b, ..., keys - int(rng.integers(0, keys // 4 + 1)):] = -10000.0
    return [q, kt, v, mask]


def attention_reference(q, kt, v, mask) -> np.ndarray:
    s = q.astype(np.float64) @ kt.astype(np.float64) / np.sqrt(q.shape[-1]) + mask
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def chain_kernels(cp, graph: Graph, machine: Target, fused: bool, config, arrays):
    """A function launching every kernel of `graph` compiled for cuda with the
    fuse_attention pass on or off (the fused kernel under `config`, None: its default), its
    output device array, its launch count and the fused kernel's config."""
    from dnnc.backends.cuda.schedules import schedule_kernel
    from dnnc.passes.manager import optimize

    target = dataclasses.replace(machine, fusion=dataclasses.replace(machine.fusion,
                                                                      attention=fused))
    g = optimize(graph, target, 3)
    devices = {id(v): cp.asarray(a) for v, a in zip(g.inputs, arrays)}
    funcs, calls, used = [], [], None
    for n, group in enumerate(g.groups):
        readers = {id(x) for node in g.nodes if node not in group for x in node.inputs
                   if x is not None}
        outputs = [x for node in group for x in node.outputs
                   if id(x) in readers or any(x is o for o in g.outputs)]
        kernel = lower_group(group, f"k{n}_{group[0].op}", outputs=outputs)
        template, problem = template_for(kernel, machine=target)
        chosen = config if group[0].op == "FusedAttention" else None
        if chosen is not None:
            chosen = template.space(problem, target).check(chosen)
        if group[0].op == "FusedAttention":
            used = chosen or template.default(problem, target)
        funcs.append(schedule_kernel(kernel, target, chosen))
        for x in kernel.inputs:
            if x.const is not None:
                devices.setdefault(id(x), cp.asarray(np.ascontiguousarray(x.const)))
        for x in outputs:
            devices[id(x)] = cp.full(x.type.shape, np.nan, np.float32)
        calls.append(kernel)
    module = render_module([(f, True) for f in funcs])
    raw = load_module(cp, module.source)   # (sm_90a where the unfused products use wgmma)
    launches = []
    for func, kernel in zip(funcs, calls):
        info = module.kernels[func.name]
        args = launch_args(cp, info, [devices[id(x)] for x in kernel.inputs + kernel.outputs])
        for lc in info.launches:   # (a tile beyond 48 KiB: its function allowed it first)
            fn = raw.get_function(lc.name)
            device.allow_shared(fn, lc.shared_bytes)
            launches.append((fn, lc, args))

    def launch():
        for fn, lc, args in launches:
            fn(lc.grid, lc.block, args, shared_mem=lc.shared_bytes)

    return launch, devices[id(g.outputs[0])], len(launches), used


def torch_sdpa_ms(arrays, repeat: int, trials: int, precision: str = "fp32"
                  ) -> float | None:
    """torch's scaled_dot_product_attention on the math backend, fp32 (TF32 allowed at tf32),
    or at fp16 / bf16 on its default backends (flash attention) in that dtype; None without a
    CUDA torch."""
    torch = cuda_torch()
    if torch is None:
        return None
    try:   # (torch before 2.2 has no sdpa_kernel)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention
    except ImportError:
        return None

    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    q, kt, v, mask = (torch.from_numpy(a).cuda() for a in arrays)
    k = kt.transpose(-1, -2).contiguous()
    if half is not None:
        q, k, v, mask = (x.to(half) for x in (q, k, v, mask))

    def call():
        if half is not None:
            return scaled_dot_product_attention(q, k, v, attn_mask=mask)
        with sdpa_kernel(SDPBackend.MATH):
            return scaled_dot_product_attention(q, k, v, attn_mask=mask)

    want = attention_reference(*arrays)
    got = call().float().cpu().numpy()
    if precision == "fp32" and not np.allclose(got, want, rtol=RTOL, atol=ATOL):
        print(f"torch sdpa differs from NumPy by {np.max(np.abs(got - want)):.3g}")
    ms = interleaved_ms([torch_timer(call)], repeat, trials)[0]
    fp32_only()   # (TF32 off again, after the timing: at tf32 it is timed with TF32 on)
    return ms


def attention_table(cp, machine: Target, args) -> int:
    """Print the attention rows (the fused kernel's configs against the unfused path and
    torch's sdpa); the number of wrong results."""
    print(f"{'attention':12s} {'shape':24s} {'path / config':52s} {'us':>9s} {'GFLOP/s':>8s} "
          f"{'vs unfused':>10s} {'torch/dnnc':>10s}  check")
    wrong = 0
    decode = getattr(args, "attention_shapes", "default") == "decode"
    for label, batch, heads, queries, keys, d in DECODE_SHAPES if decode else ATTENTION_SHAPES:
        shape = f"{label} [{batch},{heads},{queries}x{keys},{d}]"
        graph = attention_chain(batch, heads, queries, keys, d, cache=decode)
        arrays = attention_inputs(batch, heads, queries, keys, d)
        want = attention_reference(*arrays)
        # (dnnc's inputs: K as the cache holds it where `decode`; torch's sdpa takes Kᵀ's)
        inputs = [arrays[0], np.ascontiguousarray(np.swapaxes(arrays[1], -1, -2)),
                  *arrays[2:]] if decode else arrays
        flops = 4 * batch * heads * queries * keys * d
        precision = machine.precision
        peer = torch_sdpa_ms(arrays, args.repeat, args.trials, precision)
        if peer is not None:
            what = "torch sdpa (math backend, fp32)" if precision == "fp32" else \
                f"torch sdpa ({precision}{' math' if precision == 'tf32' else ''})"
            print(f"{'attention':12s} {shape:24s} {what:52s} "
                  f"{peer * 1e3:9.1f} {flops / peer / 1e6:8.0f}")

        def row(text, launch, out, base_ms):
            nonlocal wrong
            ms = event_ms(cp, launch, args.repeat, args.trials)
            got = cp.asnumpy(out)
            if precision in ATTENTION_TOLERANCE:
                ok = bool(np.max(np.abs(got - want)) <=
                          ATTENTION_TOLERANCE[precision] * np.max(np.abs(want)))
            else:
                ok = np.allclose(got, want, rtol=RTOL, atol=ATOL)
            wrong += not ok
            vs = f"{base_ms / ms:10.2f}" if base_ms else f"{1:10.2f}"
            ratio = "" if peer is None else f"{peer / ms:10.2f}"
            print(f"{'attention':12s} {shape:24s} {text[:52]:52s} {ms * 1e3:9.1f} "
                  f"{flops / ms / 1e6:8.0f} {vs} {ratio:>10s}  "
                  f"{'ok' if ok else 'WRONG: max err %.3g' % np.max(np.abs(got - want))}")
            return ms

        launch, out, n, _ = chain_kernels(cp, graph, machine, False, None, inputs)
        unfused_ms = row(f"dnnc unfused ({n} launches)", launch, out, None)
        measured = set()
        # (at a reduced precision both templates' configs: the tensor-core one takes only
        # attentions of MIN_BLOCKS blocks, the SIMT one's the others)
        variants = [None] + ([] if args.no_variants else
                             ([MmaAttentionConfig(*x) for x in MMA_ATTENTION_VARIANTS]
                              if machine.precision != "fp32" else []) +
                             [AttentionConfig(*x) for x in (
                                 DECODE_VARIANTS if decode else ATTENTION_VARIANTS)])
        for config in variants:
            try:
                launch, out, n, used = chain_kernels(cp, graph, machine, True, config, inputs)
            except Exception as exc:   # a variant outside this problem's space
                print(f"{'attention':12s} {shape:24s} {str(config)[:52]:52s} skipped: "
                      f"{str(exc).splitlines()[0][:60]}")
                continue
            if used in measured:
                continue
            measured.add(used)
            text = ("default: " if config is None else "") + (
                f"fused {used.rows} rows {used.threads} thr tile_k {used.tile_k} "
                f"x{used.thread_rows}{'' if used.unroll else ' rolled'}"
                f"{f' split {used.split}' if used.split > 1 else ''}"
                if isinstance(used, AttentionConfig) else
                f"mma {used.warps} warps tile_k {used.tile_k}")
            row(text, launch, out, unfused_ms)
        cp.get_default_memory_pool().free_all_blocks()
    return wrong
