"""Row reductions and elementwise stages of the cuda schedules across their knobs.

- warp shuffles: the IR's verifier rules and the renderer's spelling (no GPU);
- softmax, layernorm and reductions over the last axis on rows of 1, 31, 33, 127, 128,
  769, 770 and 5000 under the row template's default and a spread of its configs (a warp a
  row, several rows a block, several warps a row, the row cached in registers or re-read,
  1, 2 or 4 contiguous elements a thread at a time: vector loads and stores where the
  row's length is a multiple, scalar where not), and elementwise chains of 37000, 4099
  and 8198 elements under the vector-width and grid-stride knobs: emulated on the CPU
  (test_cuda_codegen's `run_on_cpu`: shuffles read the other lane's register), rendered as
  CUDA C and run on host threads (test_host_semantics' shim), compiled by `nvcc -ptx`
  where it is on PATH (`codegen`), and run on a GPU against NumPy (`gpu`);
- a float16 chain under the vector knob (vectors of its bits, `ushort2` / `ushort4`) on
  host threads, through nvcc and on a GPU, equal to NumPy's float16.
"""

import shutil

import numpy as np
import pytest

from cuda_kernels import MACHINE
from test_cuda_codegen import poisoned, ptx, run_on_cpu
from dnnc.backends.cuda.codegen import render_func, render_module
from dnnc.backends.cuda.schedules import DEFAULT, ROWS, Config, RowsConfig, template_for
from dnnc.backends.lower import lower_group
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph

LENGTHS = (1, 31, 33, 127, 128, 769, 770, 5000)
ROW_CONFIGS = [
    None,                                                    # the default for the length
    RowsConfig(row_threads=32, row_block=32),                # a warp a row, one row a block
    RowsConfig(row_threads=32, row_block=256),               # 8 rows a block, the last ragged
    RowsConfig(row_threads=64, row_block=128, cache_row=False),   # re-read each pass
    RowsConfig(row_threads=256, row_block=256),              # 8 warps a row: one exchange
    RowsConfig(row_threads=1024, row_block=1024, fuse_rows=False),  # a launch per pass
    RowsConfig(row_threads=32, row_block=128, row_vector=4),   # 4 contiguous a lane
    RowsConfig(row_threads=1024, row_block=1024, row_vector=4),   # ... cached, ragged steps
    RowsConfig(row_threads=64, row_block=64, row_vector=2, cache_row=False),
    RowsConfig(row_threads=128, row_block=256, row_vector=2),   # float2, 4 warps, 2 rows
    RowsConfig(row_threads=32, row_block=64, row_vector=4, cache_row=False),  # re-read
    RowsConfig(row_threads=32, row_block=128, row_vector=1),   # the default before float4
]
SINGLE_ROWS = ((1, 33), (1, 1, 768), (1, 770))
"""Inputs of one row (a decode step's token: no row loop in the lowering, the row template
takes its whole-tensor stages as one row)."""
COLUMN_SHAPES = ((2, 96, 5, 7), (3, 40, 3, 3), (1, 769, 2, 3))
"""[N, C, H, W] inputs of a layernorm over channels through a Transpose to NHWC (ConvNeXt's):
70 rows of 96, 27 of 40, 6 of 769 (a row past the register cache)."""
COLUMN_CONFIGS = [
    None,                                                    # the default: 4 rows a warp
    RowsConfig(row_threads=32, row_block=128, row_interleave=1),   # a warp a row, strided
    RowsConfig(row_threads=16, row_block=64, row_interleave=2),    # 2 rows a warp
    RowsConfig(row_threads=8, row_block=256, row_interleave=8),    # 4 warps a row-group
    RowsConfig(row_threads=64, row_block=1024, row_interleave=16, cache_row=False),
    RowsConfig(row_threads=4, row_block=128, row_interleave=32),   # 32 rows, 4 warps
    RowsConfig(row_threads=1024, row_block=1024, row_interleave=32),   # capped at 1 a block
]
POOL_SHAPES = ((2, 40, 40, 24), (3, 17, 19, 5))
"""[N, H, W, C] inputs of a global average pool through a Transpose to NCHW (a pool in a
channels-last segment): 48 rows of 1600 pixels, 15 rows of 323."""
ELEMENTWISE_CONFIGS = [Config(), Config(vector=2), Config(vector=4), Config(vector=4, threads=64),
                       Config(grid_stride=True, vector=4, threads=64),
                       Config(grid_stride=True, vector=2, threads=64)]


# -- kernels -------------------------------------------------------------------------------------


def row_graph(op: str, shape: tuple, rng) -> Graph:
    g = Graph("g")
    args = [g.add_input("x", T.TensorType(T.float32, shape))]
    attrs = {"axis": -1}
    if op == "LayerNormalization":
        for name in ("scale", "bias"):
            args.append(Value(name, T.TensorType(T.float32, shape[-1:]),
                              const=rng.standard_normal(shape[-1:]).astype(np.float32)))
    elif op.startswith("Reduce"):
        args.append(Value("axes", T.TensorType(T.int64, (1,)), const=np.array([-1])))
        attrs = {"keepdims": 1}
    g.outputs = [g.add(op, *args, **attrs)]
    return g


def channel_layernorm_graph(shape: tuple, rng) -> Graph:
    """Transpose [N, C, H, W] -> [N, H, W, C], then a layernorm over C (ConvNeXt's block)."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    c = shape[1]
    scale, bias = (Value(name, T.TensorType(T.float32, (c,)),
                         const=rng.standard_normal(c).astype(np.float32))
                   for name in ("scale", "bias"))
    t = g.add("Transpose", x, perm=[0, 2, 3, 1])
    g.outputs = [g.add("LayerNormalization", t, scale, bias, axis=-1, epsilon=1e-5)]
    return g


def channel_pool_graph(shape: tuple) -> Graph:
    """Transpose [N, H, W, C] -> [N, C, H, W], then a global average pool (rows: channels)."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    g.outputs = [g.add("GlobalAveragePool", g.add("Transpose", x, perm=[0, 3, 1, 2]))]
    return g


def elementwise_graph(shape: tuple) -> Graph:
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    half = Value("h", T.TensorType(T.float32, ()), const=np.array(0.5, np.float32))
    y = g.add("Tanh", g.add("Mul", x, half))
    g.outputs = [g.add("Relu", g.add("Add", y, x))]
    return g


def scheduled(g: Graph, template, config, name: str):
    """(the PrimFunc of `g` as one kernel under `template` and `config` (its default when
    None), its constant input arrays)."""
    kernel = lower_group(list(g.nodes), name, outputs=g.outputs)
    problem = template.problem(kernel)
    space = template.space(problem, MACHINE)
    config = template.default(problem, MACHINE) if config is None else space.check(config)
    func = template.build(problem, config, MACHINE)
    func = L.PrimFunc(name, func.params, func.body)
    L.verify(func)
    consts = [np.ascontiguousarray(v.const) for v in kernel.inputs if v.const is not None]
    return func, consts


def expected(g: Graph, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return run_graph(g, [x])[0]


def cases(rng):
    """(label, graph, template, config, input, expected) of every row op, length and config,
    and of the elementwise chain under its configs."""
    out = []
    for op in ("Softmax", "LayerNormalization", "ReduceSum", "ReduceMax"):
        for n in LENGTHS:
            shape = (7, n) if n != 127 else (2, 3, n)
            g = row_graph(op, shape, rng)
            x = (rng.standard_normal(shape) * 3).astype(np.float32)
            want = expected(g, x)
            template = template_for(lower_group(list(g.nodes), "k", outputs=g.outputs))[0]
            for config in ROW_CONFIGS if template is ROWS else [None]:
                out.append((f"{op}{list(shape)} {config}", g, template, config, x, want))
    for op in ("Softmax", "LayerNormalization"):
        for shape in SINGLE_ROWS:
            g = row_graph(op, shape, rng)
            x = (rng.standard_normal(shape) * 3).astype(np.float32)
            want = expected(g, x)
            for config in ROW_CONFIGS:
                out.append((f"{op}{list(shape)} {config}", g, ROWS, config, x, want))
    for shape in COLUMN_SHAPES:
        g = channel_layernorm_graph(shape, rng)
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        want = expected(g, x)
        for config in COLUMN_CONFIGS:
            out.append((f"channel_layernorm{list(shape)} {config}", g, ROWS, config, x, want))
    for shape in POOL_SHAPES:
        g = channel_pool_graph(shape)
        x = (rng.standard_normal(shape) + 1).astype(np.float32)
        want = expected(g, x)
        for config in COLUMN_CONFIGS:
            out.append((f"channel_pool{list(shape)} {config}", g, ROWS, config, x, want))
    for shape in ((1000, 37), (4099,), (2, 4099)):   # whole groups of 4; odd; of 2 only
        g = elementwise_graph(shape)
        x = rng.standard_normal(shape).astype(np.float32)
        for config in ELEMENTWISE_CONFIGS:
            out.append((f"chain{list(shape)} {config}", g, DEFAULT, config, x, expected(g, x)))
    return out


def build_all(rng, keep=lambda label: True):
    """(funcs, arrays by name, expected by name, labels by name) of every case (those whose
    label `keep` accepts)."""
    funcs, arrays, want, labels = [], {}, {}, {}
    for c, (label, g, template, config, x, out) in enumerate(cases(rng)):
        if not keep(label):
            continue
        func, consts = scheduled(g, template, config, f"k{c}")
        funcs.append(func)
        arrays[func.name] = [x] + consts + [poisoned(out.dtype, out.shape)]
        want[func.name] = out
        labels[func.name] = label
    return funcs, arrays, want, labels


def check(arrays, want, labels):
    for name, out in want.items():
        np.testing.assert_allclose(arrays[name][-1], out, rtol=1e-4, atol=1e-5,
                                   err_msg=labels[name])


# -- shuffles in the IR and the renderer -----------------------------------------------------


def _shuffle_func(value: L.Expr, kind=L.ForKind.THREAD_X, dtype=T.float32):
    x = L.Buffer("x", dtype, (64,))
    y = L.Buffer("y", dtype, (64,))
    t = L.Var("t")
    body = L.For(t, 64, L.Store(y, (t,), value(x[t])), kind)
    return L.PrimFunc("f", (x, y), L.For(L.Var("b"), 1, body, L.ForKind.BLOCK_X))


@pytest.mark.parametrize("name,dtype,text", [
    ("shfl_xor", T.float32, "(__shfl_xor_sync(0xffffffffu, x[((long long)(((int)(t))))], 16))"),
    ("shfl_down", T.float64, "(__shfl_down_sync(0xffffffffu, x[((long long)(((int)(t))))], 16))"),
    ("shfl_xor", T.int8, "((signed char)(__shfl_xor_sync(0xffffffffu, x["),   # via int
])
def test_shuffles_render_as_cuda_warp_intrinsics(name, dtype, text):
    func = _shuffle_func(lambda v: L.call(name, v, L.const(16, T.int32)), dtype=dtype)
    L.verify(func)
    source, _ = render_func(func)
    assert text in source


@pytest.mark.parametrize("value,kind,message", [
    (lambda v: L.call("shfl_xor", v, L.const(1, T.int32)), L.ForKind.SERIAL,
     "outside a threadIdx.x loop"),
    (lambda v: L.call("shfl_xor", v, L.const(32, T.int32)), L.ForKind.THREAD_X,
     "lane offset"),
    (lambda v: L.call("shfl_down", v, L.Cast(T.int32, L.Var("t"))), L.ForKind.THREAD_X,
     "lane offset"),
])
def test_the_verifier_refuses_misplaced_shuffles(value, kind, message):
    with pytest.raises(L.LoopIRError, match=message):
        L.verify(_shuffle_func(value, kind))


def test_default_row_geometry_by_length():
    """A softmax row of 128 on a warp (4 a lane, one float4 each way, 4 rows a 128-thread
    block); a layernorm row of 768 on 128 threads (6 each, float4); 5000 on 1024 threads
    (float4); 770 on 128 threads (float2); an odd row of 769 scalar."""
    rng = np.random.default_rng(0)
    for op, n, threads, block, vector in (
            ("Softmax", 128, 32, 128, 4), ("LayerNormalization", 768, 128, 128, 4),
            ("Softmax", 5000, 1024, 1024, 4), ("LayerNormalization", 770, 128, 128, 2),
            ("Softmax", 769, 128, 128, 1)):
        g = row_graph(op, (16, n), rng)
        kernel = lower_group(list(g.nodes), "k", outputs=g.outputs)
        template, problem = template_for(kernel)
        assert template is ROWS
        config = template.default(problem, MACHINE)
        assert (config.row_threads, config.row_block, config.row_vector) == \
            (threads, block, vector)
        func = template.build(problem, config, MACHINE)
        text, k = render_func(func)
        assert len(k.launches) == 1 and k.launches[0].block == (block, 1, 1)
        assert k.workspace == []   # row statistics in registers
        kind = {1: None, 2: "float2", 4: "float4"}[vector]
        assert (f"*reinterpret_cast<{kind}*>(&v_{op}_0[" in text) if kind else \
            "reinterpret_cast" not in text


@pytest.mark.parametrize("op,shape", [("LayerNormalization", (1, 1, 768)),
                                      ("Softmax", (1, 96)), ("LayerNormalization", (1, 770))])
def test_a_single_row_is_one_launch_on_a_rows_threads(op, shape):
    """A row with no row loop (a decode step's one token: its reductions whole-tensor
    stages) on the row template, as a row of a batch is: one launch, the statistics in
    registers (a layernorm of [1, 1, 768] was 3 launches: two one-block reductions and a
    thread an element)."""
    g = row_graph(op, shape, np.random.default_rng(0))
    kernel = lower_group(list(g.nodes), "k", outputs=g.outputs)
    template, problem = template_for(kernel)
    assert template is ROWS
    func = template.build(problem, template.default(problem, MACHINE), MACHINE)
    _, k = render_func(func)
    assert len(k.launches) == 1 and k.workspace == []


@pytest.mark.parametrize("shape,axes,template", [
    ((8, 768), [-1], ROWS), ((4, 64, 7, 7), [2, 3], ROWS),   # a row's own elements
    ((2, 3, 5, 64), [1, 3], ROWS),                           # runs of 64 contiguous
    ((1, 96, 56, 56), [1], DEFAULT),   # NCHW channels: a thread a row reads coalesced
    ((64, 31), [-1], DEFAULT),         # shorter than a warp
])
def test_rows_go_on_warps_when_long_and_contiguous(shape, axes, template):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, shape))
    axes = Value("axes", T.TensorType(T.int64, (len(axes),)), const=np.array(axes))
    g.outputs = [g.add("ReduceMean", x, axes, keepdims=1)]
    assert template_for(lower_group(list(g.nodes), "k", outputs=g.outputs))[0] is template


def test_channel_layernorm_interleaves_rows_in_warps():
    """A layernorm over NCHW's channels through a Transpose (ConvNeXt's block, writing
    NHWC) goes on the row template with 4 rows a warp (a column's 4 consecutive pixels a
    step), 32 threads a row, a block of 4 rows; the butterfly crosses only a row's lanes
    (masks 16, 8, 4), the warps of a row-group through shared memory."""
    rng = np.random.default_rng(0)
    for c in (96, 384, 768):
        g = channel_layernorm_graph((32, c, 7, 7), rng)
        kernel = lower_group(list(g.nodes), "k", outputs=g.outputs)
        template, problem = template_for(kernel)
        assert template is ROWS
        config = template.default(problem, MACHINE)
        assert (config.row_threads, config.row_interleave, config.row_vector) == (32, 4, 1)
        text, k = render_func(template.build(problem, config, MACHINE))
        assert k.launches[0].block == (128, 1, 1)
        assert k.launches[0].grid == (32 * 49 // 4, 1, 1)
        for mask in (16, 8, 4):
            assert f"__shfl_xor_sync(0xffffffffu, acc7[0LL], {mask})" in text
        assert "acc7[0LL], 2)" not in text and "acc7[0LL], 1)" not in text


@pytest.mark.parametrize("shape,threads", [((32, 112, 112, 32), 256), ((32, 56, 56, 96), 64),
                                           ((2, 40, 40, 24), 32)])
def test_few_long_column_rows_interleave(shape, threads):
    """A global pool over channels-last pixels (rows: the channels, their pixels a row of C
    apart) goes on the row template, 4 channels a warp, about 64 pixels a thread (at least
    a warp a row, 256 at most); the pool of many short rows does not (7 x 7 pixels of 1152
    channels at batch 32: a thread a row has work enough)."""
    g = channel_pool_graph(shape)
    kernel = lower_group(list(g.nodes), "k", outputs=g.outputs)
    template, problem = template_for(kernel)
    assert template is ROWS
    config = template.default(problem, MACHINE)
    assert (config.row_threads, config.row_interleave, config.row_block) == \
        (threads, 4, 4 * threads)
    g = channel_pool_graph((32, 7, 7, 1152))
    assert template_for(lower_group(list(g.nodes), "k", outputs=g.outputs))[0] is DEFAULT


_I, _R = L.Var("i"), L.Var("r")


@pytest.mark.parametrize("index,shape,in_order", [
    ((_I,), (64,), True), ((_I + 3,), (70,), True),          # from a start: its own
    ((_R, _I), (5, 64), True),                               # a row's elements
    ((_I * 2,), (128,), False), ((_I // 2,), (64,), False),  # strided, repeated
    ((_I % 16, _I // 16), (16, 4), False),                   # a transpose's walk
])
def test_runs_in_order_finds_contiguous_walks(index, shape, in_order):
    from dnnc.backends.loop_analysis import runs_in_order

    buf = L.Buffer("b", T.float32, shape)
    assert runs_in_order(L.Load(buf, index), _I, 64) == in_order
    assert runs_in_order(L.Store(buf, index, L.const(1.0)), _I, 64) == in_order


@pytest.mark.parametrize("shape,vector,kind", [
    ((64, 1024), 4, "float4"), ((1000, 37), 2, "float2"),   # whole groups: vector accesses
    ((1000, 37), 4, "float4"), ((2, 4099), 2, "float2"),
    ((4099,), 4, None), ((2, 4099), 4, None),                # ragged: scalars
])
def test_vector_knob_loads_and_stores_as_vectors(shape, vector, kind):
    g = elementwise_graph(shape)
    func, _ = scheduled(g, DEFAULT, Config(vector=vector), "k")
    text, _ = render_func(func)
    if kind is None:
        assert "reinterpret_cast" not in text
    else:
        assert text.count(f"*reinterpret_cast<const {kind}*>(&v_x[") == 1
        assert text.count(f"*reinterpret_cast<{kind}*>(&v_Relu_3[") == 1


@pytest.mark.parametrize("n,vector,kind", [(128, 4, "float4"), (5000, 4, "float4"),
                                           (770, 2, "float2"), (769, 4, None),
                                           (770, 4, None)])
def test_row_vector_fills_the_row_cache_with_vector_loads(n, vector, kind):
    g = row_graph("Softmax", (8, n), np.random.default_rng(0))
    threads = 32 if n < 1000 else 1024
    func, _ = scheduled(g, ROWS, RowsConfig(row_threads=threads, row_block=128,
                                            row_vector=vector), "k")
    text, _ = render_func(func)
    assert "float v_x_row" in text
    if kind is None:
        assert "reinterpret_cast" not in text
    else:
        assert f"*reinterpret_cast<const {kind}*>(&v_x[" in text
        assert text.count(f"*reinterpret_cast<{kind}*>(&v_Softmax_0[") == 1


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("n,vector,kind", [(768, 4, "float4"), (768, 2, "float2"),
                                           (770, 2, "float2"), (770, 4, None)])
def test_layernorm_rows_read_and_write_as_vectors(n, vector, kind, cache):
    """The row, scale and bias read, and the result written, a vector at a time (the row
    once when cached, each pass when not); scalars when the row is not a multiple."""
    g = row_graph("LayerNormalization", (8, n), np.random.default_rng(0))
    func, _ = scheduled(g, ROWS, RowsConfig(row_threads=128, row_block=128,
                                            row_vector=vector, cache_row=cache), "k")
    text, _ = render_func(func)
    if kind is None:
        assert "reinterpret_cast" not in text
        return
    for operand in ("x", "scale", "bias"):
        assert f"*reinterpret_cast<const {kind}*>(&v_{operand}[" in text
    reads = text.count(f"*reinterpret_cast<const {kind}*>(&v_x[")
    assert reads == 1 if cache else reads > 1
    assert text.count(f"*reinterpret_cast<{kind}*>(&v_LayerNormalization_0[") == 1


# -- every case emulated on the CPU, compiled by nvcc, run on a GPU --------------------------


SMOKE = ("Softmax[7, 33] ", "LayerNormalization[7, 128] ", "LayerNormalization[1, 1, 768] ", "ReduceMax[7, 770] None",
         "chain[1000, 37] ", "channel_layernorm[2, 96, 5, 7] ", "channel_pool[3, 17, 19, 5] ")
"""The cases of every run: a softmax (a length of no vector width) and a layernorm (float4
rows, scale and bias) under every row config, a reduction's default, the elementwise chain
under every config. Every case runs where nvcc or a GPU is present (`emulated_full`)."""


def smoke(label: str) -> bool:
    return label.startswith(SMOKE)


def test_smoke_rows_and_elementwise_on_cpu():
    funcs, arrays, want, labels = build_all(np.random.default_rng(1), smoke)
    assert len(funcs) == 3 * len(ROW_CONFIGS) + 1 + len(ELEMENTWISE_CONFIGS) + \
        2 * len(COLUMN_CONFIGS)
    run_on_cpu(funcs, arrays)
    check(arrays, want, labels)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_smoke_rows_and_elementwise_on_host(tmp_path):
    """SMOKE's cases as CUDA C, a host thread per CUDA thread."""
    funcs, arrays, want, labels = build_all(np.random.default_rng(3), smoke)
    run_on_host(funcs, arrays, tmp_path)
    check(arrays, want, labels)


@pytest.mark.emulated_full
def test_rows_and_elementwise_on_cpu():
    funcs, arrays, want, labels = build_all(np.random.default_rng(1))
    run_on_cpu(funcs, arrays)
    check(arrays, want, labels)


def run_on_host(funcs, arrays, tmp_path) -> None:
    """The rendered CUDA C of `funcs` on host threads (test_host_semantics' shim: a shuffle
    posts its value and reads its partner's between two block barriers), on their arrays
    in place."""
    import ctypes

    from test_host_semantics import host_library

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


def run_on_gpu(funcs, arrays) -> None:
    """`funcs` compiled by NVRTC and run on the GPU; their outputs (the last array each)
    copied back into `arrays`."""
    import cupy as cp

    module = render_module([(f, True) for f in funcs])
    raw = cp.RawModule(code=module.source, options=("-std=c++17",))
    for func in funcs:
        info = module.kernels[func.name]
        args = [cp.asarray(a) for a in arrays[func.name]]
        args += [cp.full(size, 0xFF, cp.uint8) for size in info.workspace]
        for launch in info.launches:
            raw.get_function(launch.name)(launch.grid, launch.block, tuple(args),
                                          shared_mem=launch.shared_bytes)
        arrays[func.name][-1] = cp.asnumpy(args[len(arrays[func.name]) - 1])


@pytest.mark.emulated_full
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_rows_and_elementwise_on_host(tmp_path):
    """The rendered CUDA C itself, a host thread per CUDA thread."""
    funcs, arrays, want, labels = build_all(np.random.default_rng(3))
    run_on_host(funcs, arrays, tmp_path)
    check(arrays, want, labels)


@pytest.mark.codegen
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_rows_and_elementwise_compile_with_nvcc(tmp_path):
    funcs, _, _, _ = build_all(np.random.default_rng(1))
    funcs += half_chains(np.random.default_rng(1))[0]
    ptx(render_module([(f, True) for f in funcs]).source, tmp_path)


@pytest.mark.gpu
def test_rows_and_elementwise_on_gpu():
    funcs, arrays, want, labels = build_all(np.random.default_rng(2))
    run_on_gpu(funcs, arrays)
    check(arrays, want, labels)


# -- float16: vectors of its bits ----------------------------------------------------------------

HALF_CASES = [((1000, 37), 4, "ushort4"), ((1000, 37), 2, "ushort2"), ((4099,), 4, None),
              ((2, 4099), 2, "ushort2"), ((2, 4099), 4, None), ((1000, 37), 1, None)]
"""(shape, vector, the vector type of the loads and stores or None: scalars)."""


def half_chains(rng):
    """(funcs, arrays, want) of relu(0.5 x + x) in float16 under each HALF_CASES width: the
    kernel computes in float32 and rounds once, as NumPy's float16 arithmetic does for these
    exact-in-float32 operations, so the results must be equal."""
    funcs, arrays, want = [], {}, {}
    for c, (shape, vector, _) in enumerate(HALF_CASES):
        g = Graph("g")
        x = g.add_input("x", T.TensorType(T.float16, shape))
        half = Value("h", T.TensorType(T.float16, ()), const=np.array(0.5, np.float16))
        g.outputs = [g.add("Relu", g.add("Add", g.add("Mul", x, half), x))]
        func, consts = scheduled(g, DEFAULT, Config(vector=vector), f"h{c}")
        xs = (rng.standard_normal(shape) * 30).astype(np.float16)
        funcs.append(func)
        arrays[func.name] = [xs] + consts + [poisoned(np.dtype(np.float16), shape)]
        want[func.name] = expected(g, xs)
    return funcs, arrays, want


def test_float16_chains_load_and_store_their_bits_as_vectors():
    funcs, _, _ = half_chains(np.random.default_rng(0))
    for func, (shape, vector, kind) in zip(funcs, HALF_CASES):
        text, _ = render_func(func)
        if kind is None:
            assert "reinterpret_cast" not in text, (shape, vector)
        else:
            assert text.count(f"*reinterpret_cast<const {kind}*>(&v_x[") == 1
            assert text.count(f"*reinterpret_cast<{kind}*>(&v_Relu_") == 1


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_float16_chains_on_host(tmp_path):
    funcs, arrays, want = half_chains(np.random.default_rng(4))
    run_on_host(funcs, arrays, tmp_path)
    for func, case in zip(funcs, HALF_CASES):
        np.testing.assert_array_equal(arrays[func.name][-1], want[func.name], err_msg=str(case))


@pytest.mark.gpu
def test_float16_chains_on_gpu():
    funcs, arrays, want = half_chains(np.random.default_rng(5))
    run_on_gpu(funcs, arrays)
    for func, case in zip(funcs, HALF_CASES):
        np.testing.assert_array_equal(arrays[func.name][-1], want[func.name], err_msg=str(case))
