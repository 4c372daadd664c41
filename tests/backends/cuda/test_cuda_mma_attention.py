"""The tensor-core attention template (dnnc/backends/cuda/mma_attention.py), without a GPU
and with one.

- which template a FusedAttention kernel gets at each precision (this one at tf32, fp16 and
  bf16; the SIMT one at fp32 and for heads over 128), its default in its space;
- test_cuda_attention's ragged shapes (queries and keys not multiples of the tiles, heads of
  12, 16 and 20 padded to the mma's k step, K given both ways, finite, -inf and broadcast
  masks, a wholly masked row, drop masks) under the default and other configs, rendered as
  CUDA C and run on host threads with the tensor cores emulated (test_host_semantics'
  shim), against the float64 reference within `bound`;
- on a GPU (`gpu`): bert_base's and vit's shapes at batch 8, 1024 tokens, a ragged one,
  compiled (the template table picks this template) and run.

Why the bound holds. Each score s_ij is a product of Q and K rounded to the precision (unit
roundoff u) summed in fp32: |ds_ij| <= (2u + u^2 + 2 d 2^-24) scale sum_k |q_ik| |k_jk| =: D_ij
(test_cuda_precision's product bound). Softmax moves by at most a factor exp(2 max_j D_ij)
- 1 of p_ij under such a change (the numerator by e^ds, the denominator by a weighted mean
of them). The probabilities and V are rounded (u each, their product exact in fp32) and the
sums over keys, and of the row sum l, are fp32 (sk 2^-24 each, relative to sum |p v| and to
l), exp and the division a few ulps. So |o - o_ref| <= ((e^(2 D_i) - 1) + 2u + u^2 +
(3 sk + 16) 2^-24) sum_j p_ij |v_je| + a few ulps of |o_ref|.
"""

import ctypes
from dataclasses import replace

import numpy as np
import pytest

from cuda_kernels import MACHINE
from test_cuda_attention import CASES, DROPS, attention_graph, kernel_of, random_inputs
from test_cuda_codegen import poisoned
from dnnc.backends.cuda.attention import ATTENTION
from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.mma_attention import MMA_ATTENTION, MmaAttentionConfig
from dnnc.backends.cuda.schedules import template_for
from dnnc.ir import loop as L
from dnnc.ir.target import UNIT_ROUNDOFF as UNIT

REDUCED = ("tf32", "fp16", "bf16")
CONFIGS = [None, MmaAttentionConfig(1, 16), MmaAttentionConfig(2, 32), MmaAttentionConfig(4, 16),
           MmaAttentionConfig(1, 64)]


def machine(precision):
    return replace(MACHINE, precision=precision)


def bound(precision, g, xs) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 reference, the bound of the module's docstring), elementwise."""
    node = g.nodes[-1]
    scale, kt = node.attrs["scale"], node.attrs["k_transposed"]
    names = [v.name if v is not None else None for v in node.inputs]
    feed = dict(zip([v.name for v in g.inputs], xs))
    q, k, v = (feed[n].astype(np.float64) for n in names[:3])
    k = k if kt else np.swapaxes(k, -1, -2)          # [.., d, sk]
    s = scale * (q @ k)
    if len(names) > 4 and names[4] is not None:
        s = np.where(feed[names[4]], -np.inf, s)
    if names[3] is not None:
        s = s + feed[names[3]]
    with np.errstate(all="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        want = p @ v
        d, sk = q.shape[-1], v.shape[-2]
        u = UNIT[precision]
        ds = (2 * u + u * u + 2 * d * 2.0 ** -24) * scale * (np.abs(q) @ np.abs(k))
        ds = np.where(np.isfinite(s), ds, 0).max(-1, keepdims=True)
        weight = p @ np.abs(v)
        limit = (np.expm1(2 * ds) + 2 * u + u * u + (3 * sk + 16) * 2.0 ** -24) * weight + \
            8 * 2.0 ** -24 * np.abs(want)
    return want, limit


def run_on_host(funcs_arrays, tmp_path):
    from test_host_semantics import host_library

    pairs = [(f, True) for f, _ in funcs_arrays]
    module = render_module(pairs)
    lib = host_library(pairs, tmp_path, module)
    for func, arrays in funcs_arrays:
        info = module.kernels[func.name]
        buffers = arrays + [np.full(n, 0xFF, np.uint8) for n in info.workspace]
        args = (ctypes.c_void_p * len(buffers))(*[a.ctypes.data for a in buffers])
        for launch in info.launches:
            host = ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p)
            lib.dnnc_launch(host, args, *[ctypes.c_uint(x) for x in launch.grid],
                            ctypes.c_uint(launch.block[0]))


def check(got, want, limit, name) -> float:
    finite = np.isfinite(want)
    assert (np.isnan(got) == np.isnan(want)).all(), f"{name}: NaN where the reference has none"
    err = np.abs(got.astype(np.float64) - want)[finite]
    lim = limit[finite]
    assert (err <= lim).all(), f"{name}: worst {err.max():.3g}, bound there " \
                               f"{lim.flat[(err - lim).argmax()]:.3g}"
    return float((err / np.maximum(lim, 1e-300)).max())


def test_template_by_precision():
    kernel = kernel_of(attention_graph(8, 12, 128, 128, 64, 64))
    assert template_for(kernel, machine=MACHINE)[0] is ATTENTION
    for precision in REDUCED:
        template, problem = template_for(kernel, machine=machine(precision))
        assert template is MMA_ATTENTION
        config = template.default(problem, machine(precision))
        assert template.space(problem, machine(precision)).check(config) == config
    big = kernel_of(attention_graph(1, 2, 16, 16, 160, 160))
    assert template_for(big, machine=machine("fp16"))[0] is not MMA_ATTENTION
    # too few blocks of 64 query rows (bert_base at batch 1, 12 x 2): the SIMT template
    few = kernel_of(attention_graph(1, 12, 128, 128, 64, 64))
    assert template_for(few, machine=machine("fp16"))[0] is ATTENTION


@pytest.mark.parametrize("precision", REDUCED)
def test_attention_on_host_threads_within_the_bound(precision, tmp_path):
    rng = np.random.default_rng(31)
    cases = [(f"a{n}", c, None) for n, c in enumerate(CASES)] + \
        [(f"d{n}", CASES[n], shape) for n, shape in DROPS]
    m = machine(precision)
    runs, expected = [], {}
    for c, (name, (b, h, sq, sk, d, dv, kt, mask, kind, _), drop) in enumerate(cases):
        g = attention_graph(b, h, sq, sk, d, dv, kt, mask, drop=drop)
        # (these shapes are too small for the template table to pick it: built directly)
        template, problem = MMA_ATTENTION, MMA_ATTENTION.problem(kernel_of(g, name))
        config = CONFIGS[c % len(CONFIGS)]
        space = template.space(problem, m)
        config = template.default(problem, m) if config is None else space.check(config)
        func = template.build(problem, config, m)
        L.verify(func)
        xs = random_inputs(g, rng, kind)
        want, limit = bound(precision, g, xs)
        runs.append((func, xs + [poisoned(np.dtype(np.float32), want.shape)]))
        expected[func.name] = (want, limit)
    run_on_host(runs, tmp_path)
    worst = max(check(arrays[-1], *expected[func.name], f"{func.name} {precision}")
                for func, arrays in runs)
    # the operands were rounded: the bound is not vacuous, the emulation not fp32
    assert worst > 0.01


@pytest.mark.gpu
@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("shape", [(4, 4, 200, 150, 40, 24, 1), (8, 12, 128, 128, 64, 64, 1),
                                   (8, 3, 197, 197, 64, 64, 0), (1, 4, 1024, 1024, 64, 64, 1)])
def test_attention_on_gpu_within_the_bound(precision, shape, rng):
    import dnnc

    b, h, sq, sk, d, dv, kt = shape
    g = attention_graph(b, h, sq, sk, d, dv, kt, (b, 1, 1, sk), scale=d ** -0.5)
    xs = random_inputs(g, rng, "finite")
    assert template_for(kernel_of(g), machine=machine(precision))[0] is MMA_ATTENTION
    model = dnnc.compile(g, target="cuda", precision=precision, outputs="numpy")
    got = model.run(*xs)[0]
    want, limit = bound(precision, g, xs)
    check(got, want, limit, f"{shape} {precision}")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_16_bit_storage_on_host_threads(precision, tmp_path):
    """Q, K, V, the mask and the output stored in the precision's type (`store_half`): read
    widened, computed as above, the output rounded once more (u |o|)."""
    from dnnc.ir import types as T
    from dnnc.ir.graph import Graph

    dtype = {"fp16": T.float16, "bf16": T.bfloat16}[precision]
    np_type = np.dtype(dtype.np)
    rng = np.random.default_rng(5)
    m = machine(precision)
    runs, expected = [], {}
    for n, (b, h, sq, sk, d, dv, kt) in enumerate([(2, 2, 40, 37, 16, 16, 1),
                                                    (1, 3, 33, 50, 24, 20, 0)]):
        g = Graph("attention")
        shapes = [(b, h, sq, d), (b, h, d, sk) if kt else (b, h, sk, d), (b, h, sk, dv),
                  (b, 1, 1, sk)]
        ins = [g.add_input(name, T.TensorType(dtype, s))
               for name, s in zip(("q", "k", "v", "mask"), shapes)]
        g.outputs = [g.add("FusedAttention", *ins, scale=d ** -0.5, k_transposed=kt)]
        xs = [rng.standard_normal(s).astype(np_type) for s in shapes]
        problem = MMA_ATTENTION.problem(kernel_of(g, f"h{n}"))
        func = MMA_ATTENTION.build(problem, MMA_ATTENTION.default(problem, m), m)
        L.verify(func)
        want, limit = bound(precision, g, [x.astype(np.float32) for x in xs])
        limit = limit + UNIT[precision] * np.abs(want)
        runs.append((func, xs + [poisoned(np_type, want.shape)]))
        expected[func.name] = (want, limit)
    run_on_host(runs, tmp_path)
    for func, arrays in runs:
        check(arrays[-1].astype(np.float32), *expected[func.name], f"{func.name} {precision}")
