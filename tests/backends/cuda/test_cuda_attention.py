"""The cuda attention template (dnnc/backends/cuda/attention.py) without and with a GPU.

- which template a FusedAttention kernel gets (heads over 128 fall back to the default), its
  knob space and default;
- small shapes with ragged edges (8 to 40 queries and keys, not multiples of the row and key
  tiles; heads of 16) under a spread of configs, K given both ways, masks finite, -inf (a
  row wholly masked: NaN as Softmax gives; a row whose first tile is masked), broadcast
  three ways: emulated on the CPU (test_cuda_codegen's `run_on_cpu`), rendered as CUDA C
  and run on host threads (test_host_semantics' shim), compiled by `nvcc -ptx`;
- bert_tiny's kernels, the attention one storing through the heads' merge, and the node
  suite's FlexAttention bodies, on the CPU;
- on a GPU (`gpu`): the kernel at bert_base's (128 keys, 12 heads, batch 1 and 8) and
  vit's (197: ragged) shapes against NumPy, and bert_tiny / bert_base whole against
  onnxruntime (rtol 1e-3, atol 1e-4).
"""

import shutil

import numpy as np
import pytest

from cuda_kernels import MACHINE, programs, reference, suite_cases, suite_inputs, zoo_model
from test_cuda_codegen import check_program_on_cpu, poisoned, ptx, run_on_cpu
from dnnc import zoo
from dnnc.backends.cuda.attention import ATTENTION, AttentionConfig, shared_floats
from dnnc.backends.cuda.codegen import render_func, render_module
from dnnc.backends.cuda.device import gpu_of
from dnnc.backends.cuda.schedules import DEFAULT, template_for
from dnnc.backends.lower import lower_group
from dnnc.errors import ConfigError
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph
from dnnc.ir.interpreter import run_graph

pytestmark = pytest.mark.codegen


def attention_graph(b, h, sq, sk, d, dv, k_transposed=1, mask=None, scale=0.25,
                    drop=None) -> Graph:
    g = Graph("attention")
    q = g.add_input("q", T.TensorType(T.float32, (b, h, sq, d)))
    k = g.add_input("k", T.TensorType(T.float32, (b, h, d, sk) if k_transposed
                                      else (b, h, sk, d)))
    v = g.add_input("v", T.TensorType(T.float32, (b, h, sk, dv)))
    inputs = [q, k, v]
    inputs.append(None if mask is None else g.add_input("mask", T.TensorType(T.float32, mask)))
    if drop is not None:   # torch's masked_fill by -inf where true
        inputs.append(g.add_input("drop", T.TensorType(T.bool_, drop)))
    g.outputs = [g.add("FusedAttention", *inputs, scale=scale, k_transposed=k_transposed)]
    return g


def kernel_of(g: Graph, name: str = "k"):
    return lower_group(list(g.nodes), name, outputs=g.outputs)


def scheduled(g: Graph, config, name: str) -> L.PrimFunc:
    kernel = kernel_of(g, name)
    template, problem = template_for(kernel)
    assert template is ATTENTION
    config = template.default(problem, MACHINE) if config is None else \
        template.space(problem, MACHINE).check(config)
    func = template.build(problem, config, MACHINE)
    L.verify(func)
    return func


def random_inputs(g: Graph, rng, masked: str | None) -> list[np.ndarray]:
    """Fresh inputs; the mask: "finite" (as drawn), "-inf" (30% of it -inf, query row 1
    wholly masked, query row 2 masked over its first 16 keys)."""
    xs = [rng.random(v.type.shape) < 0.3 if v.type.dtype is T.bool_ else
          rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]
    if masked == "-inf":
        m = next(x for x, v in zip(xs, g.inputs) if v.name == "mask")
        m[...] = np.where(rng.random(m.shape) < 0.3, -np.inf, m)
        if m.shape[-2] > 2:
            m[..., 1, :] = -np.inf
            m[..., 2, :16] = -np.inf
    return xs


CASES = [
    # (b, h, sq, sk, d, dv, k_transposed, mask shape, mask kind, config)
    ((2, 3, 40, 37, 16, 16, 1, (2, 1, 1, 37), "finite", AttentionConfig(16, 64, 16))),
    ((1, 2, 8, 8, 16, 12, 0, None, None, AttentionConfig(8, 32, 16))),
    ((2, 1, 33, 21, 16, 16, 0, (33, 21), "-inf", AttentionConfig(32, 128, 32))),
    ((1, 2, 17, 40, 16, 16, 1, (1, 2, 17, 40), "-inf", AttentionConfig(8, 64, 16))),
    ((1, 1, 9, 33, 16, 16, 1, (33,), "finite", AttentionConfig(32, 32, 16))),      # a lane a row
    ((1, 2, 24, 19, 16, 20, 0, (24, 1), "finite", AttentionConfig(8, 256, 32))),     # 32 lanes
    ((2, 2, 31, 25, 16, 16, 1, (2, 1, 31, 25), "-inf", None)),                       # default
    # several rows a thread: 2 rows of 4 lanes (loops rolled), 4 rows of 8 lanes, 2 rows
    # alone
    ((2, 1, 37, 29, 16, 16, 1, (2, 1, 1, 29), "-inf", AttentionConfig(16, 32, 16, 2, False))),
    ((1, 2, 40, 35, 16, 12, 0, (40, 35), "finite", AttentionConfig(32, 64, 32, 4))),
    ((1, 1, 21, 18, 16, 16, 0, None, None, AttentionConfig(64, 32, 16, 2))),
    # the keys split, the slices combined by a second launch: two slices (the last one's
    # second tile wholly past the keys), four, and eight of one tile each (rows of -inf)
    ((2, 3, 40, 33, 16, 16, 1, (2, 1, 1, 33), "finite", AttentionConfig(16, 64, 16, split=2))),
    ((1, 2, 17, 70, 16, 12, 0, (1, 2, 17, 70), "-inf", AttentionConfig(8, 64, 16, split=4))),
    ((1, 1, 33, 128, 16, 16, 1, (33, 128), "-inf",
      AttentionConfig(32, 64, 16, 4, False, split=8))),
    # a decode step's one query row (the cache untransposed): the default (8 rows, keys
    # split), blocks of 1, 2 and 4 rows (a row group of a warp, of 32 or 16 lanes)
    ((2, 3, 1, 70, 16, 16, 0, (2, 1, 1, 70), "-inf", None)),
    ((2, 2, 1, 70, 16, 16, 0, (2, 1, 1, 70), "finite", AttentionConfig(1, 32, 32, split=2))),
    ((1, 2, 3, 33, 16, 16, 1, None, None, AttentionConfig(2, 64, 32))),
    ((1, 2, 1, 40, 16, 12, 0, (1, 2, 1, 40), "finite", AttentionConfig(4, 32, 16, 2))),
]
DROPS = [   # (case index, the boolean drop's shape): torch's masked_fill by -inf
    (0, (40, 37)), (2, (2, 1, 33, 21)), (7, (37, 29)), (10, (2, 1, 40, 33))]


def build_cases(rng):
    """(funcs, arrays by name, expected by name) of every case."""
    funcs, arrays, want = [], {}, {}
    cases = [(f"attn{n}", c, None) for n, c in enumerate(CASES)] + \
        [(f"drop{n}", CASES[n], shape) for n, shape in DROPS]
    for name, (b, h, sq, sk, d, dv, kt, mask, kind, config), drop in cases:
        g = attention_graph(b, h, sq, sk, d, dv, kt, mask, drop=drop)
        func = scheduled(g, config, name)
        xs = random_inputs(g, rng, kind)
        with np.errstate(all="ignore"):
            out = run_graph(g, xs)[0]
        funcs.append(func)
        arrays[func.name] = xs + [poisoned(out.dtype, out.shape)]
        want[func.name] = out
    return funcs, arrays, want


def check(arrays, want):
    for name, out in want.items():
        got = arrays[name][-1]
        np.testing.assert_allclose(got, out, rtol=1e-4, atol=1e-5, equal_nan=True,
                                   err_msg=name)


# -- the template and its knobs ------------------------------------------------------------------


def test_fused_attention_kernels_get_the_attention_template():
    kernel = kernel_of(attention_graph(1, 12, 128, 128, 64, 64))
    template, problem = template_for(kernel)
    assert template is ATTENTION
    assert (problem.batch, problem.sq, problem.sk, problem.d) == (12, 128, 128, 64)


def test_heads_over_128_fall_back_to_the_default_template(rng):
    g = attention_graph(1, 1, 5, 6, 130, 8)
    template, problem = template_for(kernel_of(g))
    assert template is DEFAULT
    func = template.build(problem, template.default(problem, MACHINE), MACHINE)
    xs = random_inputs(g, rng, None)
    arrays = {func.name: xs + [poisoned(np.dtype(np.float32), (1, 1, 5, 8))]}
    run_on_cpu([func], arrays)
    np.testing.assert_allclose(arrays[func.name][-1], run_graph(g, xs)[0], rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 12, 128, 64), (8, 12, 128, 64), (1, 3, 197, 64),
                                   (1, 4, 512, 128), (2, 8, 1, 32)])
def test_the_default_lies_in_the_space(shape):
    b, h, s, d = shape
    kernel = kernel_of(attention_graph(b, h, s, s, d, d))
    _, problem = template_for(kernel)
    config = ATTENTION.default(problem, MACHINE)
    assert ATTENTION.space(problem, MACHINE).check(config) == config
    assert 4 * shared_floats(config, d, d) <= 48 << 10
    _, info = render_func(ATTENTION.build(problem, config, MACHINE))
    launch = info.launches[0]
    assert launch.grid == (b * h * config.split, -(-s // config.rows), 1)
    assert launch.block == (config.threads, 1, 1)
    if config.split == 1:
        assert len(info.launches) == 1 and info.workspace == []
    else:   # few blocks (bert's and vit's heads at batch 1): the keys split
        assert b * h * -(-s // config.rows) < gpu_of(MACHINE).sms and len(info.launches) == 2
        assert info.workspace == [4 * config.split * b * h * s * (d + 2)]


def test_few_blocks_split_the_keys():
    """vit's 3 heads of 197 at batch 1 (21 blocks of 32 rows, 7 key tiles) in 4 slices (8
    would leave one without a key), bert's 12 of 128 (48 blocks, 4 tiles) in 4 of a tile;
    batch 8 (384 blocks) unsplit."""
    for (b, h, s, d), split in (((1, 3, 197, 64), 4), ((1, 12, 128, 64), 4),
                                ((8, 12, 128, 64), 1)):
        _, problem = template_for(kernel_of(attention_graph(b, h, s, s, d, d)))
        assert ATTENTION.default(problem, MACHINE).split == split


@pytest.mark.parametrize("config,message", [
    (AttentionConfig(32, 96, 32), "not one of its allowed values"),
    (AttentionConfig(8, 512, 32), "power of two"),                # 64 lanes a row
    (AttentionConfig(8, 256, 16), "multiple of a row group's lanes"),   # 32 lanes, 16 keys
    (AttentionConfig(8, 128, 32, 4), "power of two"),              # 64 lanes a row group
    (AttentionConfig(64, 32, 32, 4), "scores and accumulators"),   # 4 rows of 16 + 32
    (AttentionConfig(128, 512, 128), "48 KiB"),
])
def test_configs_outside_the_space_are_refused(config, message):
    _, problem = template_for(kernel_of(attention_graph(1, 12, 128, 128, 64, 64)))
    space = ATTENTION.space(problem, MACHINE)
    with pytest.raises(ConfigError, match=message):
        space.check(config)


# -- small shapes: emulated, on host threads, compiled -------------------------------------------


def test_attention_on_cpu():
    funcs, arrays, want = build_cases(np.random.default_rng(11))
    run_on_cpu(funcs, arrays)
    check(arrays, want)
    assert any(np.isnan(w).any() for w in want.values())   # (a wholly masked row was tested)


def test_ranks_two_and_three_on_cpu(rng):
    """No batch dims (a [sq, d] Q), and one folded batch dim with a [sk] mask."""
    funcs, arrays, want = [], {}, {}
    for n, (shapes, k_transposed) in enumerate([
            (((9, 16), (16, 13), (13, 8), (9, 13)), 1),
            (((3, 9, 16), (3, 13, 16), (3, 13, 8), (13,)), 0)]):
        g = Graph("g")
        inputs = [g.add_input(name, T.TensorType(T.float32, shape))
                  for name, shape in zip(("q", "k", "v", "mask"), shapes)]
        g.outputs = [g.add("FusedAttention", *inputs, scale=0.3, k_transposed=k_transposed)]
        func = scheduled(g, None, f"rank{n}")
        xs = random_inputs(g, rng, None)
        want[func.name] = run_graph(g, xs)[0]
        arrays[func.name] = xs + [poisoned(np.dtype(np.float32), want[func.name].shape)]
        funcs.append(func)
    run_on_cpu(funcs, arrays)
    check(arrays, want)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_attention_on_host_threads(tmp_path):
    """The rendered CUDA C itself, a host thread per CUDA thread."""
    import ctypes

    from test_host_semantics import host_library

    funcs, arrays, want = build_cases(np.random.default_rng(12))
    pairs = [(f, True) for f in funcs]
    module = render_module(pairs)
    lib = host_library(pairs, tmp_path, module)
    for func in funcs:
        info = module.kernels[func.name]
        buffers = arrays[func.name] + [np.full(n, 0xFF, np.uint8) for n in info.workspace]
        args = (ctypes.c_void_p * len(buffers))(*[a.ctypes.data for a in buffers])
        for launch in info.launches:
            host = ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p)
            lib.dnnc_launch(host, args, *[ctypes.c_uint(g) for g in launch.grid],
                            ctypes.c_uint(launch.block[0]))
    check(arrays, want)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_attention_compiles_with_nvcc(tmp_path):
    funcs, _, _ = build_cases(np.random.default_rng(13))
    shapes = [(1, 12, 128, 64), (8, 12, 128, 64), (1, 3, 197, 64), (1, 2, 64, 128)]
    funcs += [scheduled(attention_graph(b, h, s, s, d, d, mask=(b, 1, 1, s)), None, f"big{n}")
              for n, (b, h, s, d) in enumerate(shapes)]
    source = render_module([(f, True) for f in funcs]).source
    assert "__shfl_xor_sync" in source and "__shared__" in source
    ptx(source, tmp_path)


@pytest.mark.emulated_full
def test_bert_tiny_kernels_on_cpu(rng):
    """Every kernel of bert_tiny (16 tokens) as the cuda target plans it, the two attention
    kernels storing through the heads' merge, emulated against the reference."""
    model = zoo_model("bert_tiny")
    graph, progs = programs(import_onnx(model))
    attention = [k for p in progs for k in p.kernels if k.anchor.op == "FusedAttention"]
    assert len(attention) == 2
    assert all([n.op for n in k.nodes] == ["FusedAttention", "Transpose", "Reshape"]
               for k in attention)
    values = reference(graph, zoo.inputs_for(model, rng))
    for program in progs:
        check_program_on_cpu(graph, program, values)


FLEX = ["test_flexattention_diff_head_sizes_expanded_ver26", "test_flexattention_expanded_ver26",
        "test_flexattention_gqa_expanded_ver26",
        "test_flexattention_relative_positional_expanded_ver26",
        "test_flexattention_scaled_expanded_ver26", "test_flexattention_score_mod_expanded_ver26"]
"""Node-suite cases whose expanded function bodies hold the attention chain."""


@pytest.mark.parametrize("name", [n if n == "test_flexattention_expanded_ver26" else
                                  pytest.param(n, marks=pytest.mark.emulated_full)
                                  for n in FLEX])
def test_node_suite_attention_chains_on_cpu(name):
    """ONNX's FlexAttention function bodies (score mods, GQA, head sizes) fused into the
    attention template, every kernel emulated against the reference."""
    case = suite_cases([name]).get(name)
    if case is None:
        pytest.skip(f"{name} is not in this onnx's node suite")
    graph, progs = programs(import_onnx(case.model))
    assert sum(n.op == "FusedAttention" for n in graph.nodes) == 1
    assert [template_for(k)[0] for p in progs for k in p.kernels
            if k.anchor.op == "FusedAttention"] == [ATTENTION]
    xs = suite_inputs(case)
    values = reference(graph, {v.name: x for v, x in zip(graph.inputs, xs)})
    for program in progs:
        check_program_on_cpu(graph, program, values)


# -- on a GPU ------------------------------------------------------------------------------------

GPU_SHAPES = [(1, 12, 128, 64), (8, 12, 128, 64), (1, 3, 197, 64), (4, 12, 512, 64),
              (1, 12, 64, 64), (1, 4, 77, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"b{b}h{h}s{s}d{d}"
                                                   for b, h, s, d in GPU_SHAPES])
@pytest.mark.parametrize("masked", [None, "finite", "-inf", "causal"])
def test_attention_kernel_on_gpu(shape, masked, rng):
    """bert_base's, vit's, a long sequence's, GPT-2's (a causal masked_fill) and a head of
    128's attention, each masked four ways."""
    import cupy as cp

    b, h, s, d = shape
    mask = None if masked in (None, "causal") else (b, 1, 1, s)
    g = attention_graph(b, h, s, s, d, d, mask=mask, scale=d ** -0.5,
                        drop=(s, s) if masked == "causal" else None)
    func = scheduled(g, None, "attn")
    xs = random_inputs(g, rng, masked)
    if masked == "causal":
        xs[-1] = np.triu(np.ones((s, s), bool), 1)
    with np.errstate(all="ignore"):
        want = run_graph(g, xs)[0]
    module = render_module([(func, True)])
    raw = cp.RawModule(code=module.source, options=("-std=c++17",))
    info = module.kernels[func.name]   # (its keys split at batch 1: a workspace)
    args = [cp.asarray(x) for x in xs] + [cp.full(want.shape, np.nan, cp.float32)] + \
        [cp.empty(n, cp.uint8) for n in info.workspace]
    for launch in info.launches:
        raw.get_function(launch.name)(launch.grid, launch.block, tuple(args))
    np.testing.assert_allclose(cp.asnumpy(args[len(xs)]), want, rtol=1e-4, atol=1e-5,
                               equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", [("bert_tiny", 1), ("bert_tiny", 4), ("bert_base", 1)])
def test_bert_with_fused_attention_matches_onnxruntime(name, batch, rng):
    import dnnc

    ort = pytest.importorskip("onnxruntime")
    model = zoo.build(name, batch=batch)
    compiled = dnnc.compile(model, "cuda")
    assert any(n.op == "FusedAttention" for n in compiled.graph.nodes)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for _ in range(2):   # the first call captures the CUDA graph, the second replays it
        feeds = zoo.inputs_for(model, rng)
        (out,) = compiled.run(*feeds.values(), to="numpy")
        (want,) = session.run(None, feeds)
        np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-4, err_msg=name)
