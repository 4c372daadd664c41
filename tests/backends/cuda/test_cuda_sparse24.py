"""2:4 weights on the sparse tensor cores (issue 34, item 4; dnnc/backends/cuda/sparse24.py,
dnnc/passes/sparse24.py): the encoding against the hardware's metadata layout; Sparse24Dense
and Sparse24ConvNHWC kernels (a bias, a fused activation and a residual, a layout tail; a
padded, strided window; the default config and others of the knob space, split k included;
NaN and infinite activations at pruned weights) rendered and run on host threads by
test_host_semantics.py's shim (mma.sp, ldmatrix and cp.async emulated) against the float64
product of the rounded operands, and sm_90's warpgroup product (wgmma.mma_async.sp emulated)
at tiles of one and two warpgroups of 64 to 256 places, split k, the refill first and a 3x3
conv, and its k loop's metadata registers never written under a running wgmma; their NVRTC
compiles for sm_80 and sm_90a (skipped without CuPy); the rewrite's choices (2:4 products
and convs at fp16 / bf16 on cuda; nothing on llvm, at fp32, for grouped convs or for weights
past 2:4); the op's rule on llvm. The `gpu` tests run pruned models and wide warpgroup tiles
on a GPU (skipped without one)."""

import dataclasses
import functools
import random
import shutil

import numpy as np
import pytest

from dnnc.backends.cuda.codegen import render_module
from dnnc.backends.cuda.mma import TensorCoreConfig
from dnnc.errors import ConfigError
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.ops.sparse import covering_rows, decode_2of4, encode_2of4, fits_2of4, kept_columns
from dnnc.ir.target import Target
from cuda_kernels import MACHINE, nvrtc_compiled, programs, renamed

pytestmark = pytest.mark.codegen

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
HALF = {"fp16": T.float16, "bf16": T.bfloat16}
LAYOUTS = ("sparse_weights", "nhwc_conv")


def machine(precision: str) -> Target:
    return dataclasses.replace(MACHINE, precision=precision, half_storage=True,
                               layouts=LAYOUTS)


def pruned_2of4(rng, n, k) -> np.ndarray:
    """Weights [n, k] keeping the 2 largest of every 4 along k, some groups 1 or none."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    groups = w.reshape(n, k // 4, 4)
    smallest = np.argsort(np.abs(groups), axis=-1)[..., :2]
    np.put_along_axis(groups, smallest, 0.0, axis=-1)
    groups[rng.random(groups.shape[:2]) < 0.1, :] = 0.0
    single = rng.random(groups.shape[:2]) < 0.1
    groups[single] = np.where(np.arange(4) == 3, groups[single], 0.0)
    return groups.reshape(n, k)


def _hardware_view(values, meta, n, k) -> np.ndarray:
    """The dense [n, k] of `encode_2of4`'s output read as the PTX ISA lays the metadata out
    (lane 4 g + p, p < 2: row g's kept columns 8 p .. 8 p + 7 of a 32-k step low, row g + 8's
    high), element by element."""
    w = np.zeros((n, k), np.float64)
    v = np.asarray(values, np.float64)
    for j in range(n):
        for c in range(k // 2):
            ks, p, i = c // 16, c % 16 // 8, c % 8
            word = int(meta[j // 16, ks, j % 8, p]) >> (16 * (j % 16 // 8) + 2 * i)
            w[j, 32 * ks + 4 * (c % 16 // 2) + (word & 3)] += v[j, c]
    return w


def test_the_2of4_encoding_decodes_to_the_weights(rng):
    w = pruned_2of4(rng, 32, 64)
    values, meta = encode_2of4(w, T.float16)
    assert values.shape == (32, 32) and meta.shape == (2, 2, 8, 2)
    want = w.astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(_hardware_view(values, meta, 32, 64), want)
    np.testing.assert_array_equal(decode_2of4(values, meta, 64), want)
    # each group's two kept columns ascending, inside the group
    cols = kept_columns(meta, 32, 64).reshape(32, 16, 2)
    assert (cols[..., 0] < cols[..., 1]).all() and (cols // 4 == np.arange(16)[:, None]).all()
    with pytest.raises(ValueError, match="more than 2 nonzeros"):
        encode_2of4(np.ones((16, 32), np.float32), T.float16)
    assert fits_2of4(w) and not fits_2of4(np.ones((16, 32))) and not fits_2of4(w[:8])


# -- Sparse24Dense kernels on the host shim ------------------------------------------------------

def sparse24_graph(rng, places_shape, k, n, precision, bias=True, tail=False):
    """Sparse24Dense (+ bias) -> Relu -> + residual (-> Reshape / Transpose to heads with
    `tail`), stored in the precision's half type; (graph, dense weights [n, k] rounded,
    bias)."""
    half = HALF[precision]
    w = pruned_2of4(rng, n, k) / np.float32(np.sqrt(k))
    values, meta = encode_2of4(w, half)
    g = Graph("sparse24")
    a = g.add_input("a", T.TensorType(half, places_shape + (k,)))
    r = g.add_input("r", T.TensorType(half, places_shape + (n,)))
    inputs = [a, Value("w.kept", T.TensorType(half, values.shape), const=values),
              Value("w.meta", T.TensorType(T.uint32, meta.shape), const=meta)]
    b = None
    if bias:
        b = rng.standard_normal(n).astype(half.np)
        inputs.append(Value("b", T.TensorType(half, (n,)), const=b))
    y = g.add("Add", g.add("Relu", g.add("Sparse24Dense", *inputs, n=n, k=k)), r)
    if tail:   # [b, s, n] -> [b, s, 2, n / 2] -> [b, 2, s, n / 2]
        shape = Value("shape", T.TensorType(T.int64, (4,)), const=np.array(
            list(places_shape) + [2, n // 2], np.int64))
        y = g.add("Transpose", g.add("Reshape", y, shape), perm=[0, 2, 1, 3])
    g.outputs = [y]
    return g, decode_2of4(values, meta, k).astype(np.float64), b


def _want(a, r, w, b, tail, half):
    """The float64 result of the rounded operands (the kernel's, but for its float32 sums'
    order and one rounding to the half type before the residual and at the end)."""
    y = a.astype(np.float64) @ w.T + (0 if b is None else b.astype(np.float64))
    y = np.maximum(y.astype(half.np).astype(np.float64), 0) + r.astype(np.float64)
    if tail:
        y = y.reshape(y.shape[:-1] + (2, -1)).transpose(0, 2, 1, 3)
    return y


def _run_on_host(g, feeds, target, tmp_path, config=None, template="cuda_sparse24"):
    import test_host_semantics as host

    graph, (program,) = programs(g, machine=target, config=config)
    assert [k.schedule[0] for k in program.kernels] == [template]
    module = render_module(program.unique)
    lib = host.host_library(program.unique, tmp_path, module)
    return host.program_on_host(lib, module, program, feeds)[graph.outputs[0].name], program


def _configs(p, target, count):
    """The default and `count` other configs of the problem's space, split k among them."""
    from dnnc.backends.cuda.sparse24 import default, space

    configs = list(space(p, target).configs())
    picked = random.Random(0).sample(configs, min(count, len(configs)))
    split = [c for c in configs if c.split_k > 1][:1]
    return [default(p, target)] + picked + split


# (places shape, k, n, precision, bias, tail)
CASES = [((40,), 128, 64, "fp16", True, False),
         ((2, 12), 64, 48, "bf16", False, False),
         ((2, 24), 256, 32, "fp16", True, True)]


def _product_case(rng, places, k, n, precision, bias, tail):
    """(graph, feeds, the float64 result, its bound) of a CASES row: within 2 units of the
    half type at the output's magnitude (the half roundings before and after the residual)
    plus the sums' float32 order."""
    half = HALF[precision]
    g, w, b = sparse24_graph(rng, places, k, n, precision, bias, tail)
    a = rng.standard_normal(places + (k,)).astype(half.np)
    r = rng.standard_normal(places + (n,)).astype(half.np)
    want = _want(a, r, w, b, tail, half)
    unit = 2.0 ** (-8 if precision == "bf16" else -11)
    return g, {"a": a, "r": r}, want, 2 * unit * (np.abs(want) + 1) + 1e-5


@needs_gxx
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sparse24_kernels_on_host(rng, tmp_path, case):
    """The default config and others of the space, against the float64 product on the
    decoded weights (`_product_case`)."""
    from dnnc.backends.sparse_problems import sparse24_product

    g, feeds, want, bound = _product_case(rng, *CASES[case])
    target = machine(CASES[case][3])
    _, (program,) = programs(g, machine=target)
    p = sparse24_product(program.kernels[0])
    for i, config in enumerate(_configs(p, target, 4)):
        got, _ = _run_on_host(g, feeds, target, tmp_path / str(i), config)
        assert (np.abs(got.astype(np.float64) - want) <= bound).all(), config


def conv24_graph(rng, n, hw, c, m, window, pads, strides, precision, bias=True):
    """Sparse24ConvNHWC (+ bias) -> Relu -> + residual on an NHWC image, stored in the
    precision's half type; (graph, dense OIHW weights rounded, bias, output shape)."""
    half = HALF[precision]
    k = window * window * c
    w = pruned_2of4(rng, m, k) / np.float32(np.sqrt(k / 2))
    values, meta = encode_2of4(w, half)
    out = (hw + pads[0] + pads[2] - window) // strides[0] + 1
    g = Graph("sparse24_conv")
    x = g.add_input("x", T.TensorType(half, (n, hw, hw, c)))
    r = g.add_input("r", T.TensorType(half, (n, out, out, m)))
    inputs = [x, Value("w.kept", T.TensorType(half, values.shape), const=values),
              Value("w.meta", T.TensorType(T.uint32, meta.shape), const=meta)]
    b = None
    if bias:
        b = rng.standard_normal(m).astype(half.np)
        inputs.append(Value("b", T.TensorType(half, (m,)), const=b))
    y = g.add("Sparse24ConvNHWC", *inputs, oc=m, k=k, kernel_shape=[window, window],
              pads=list(pads), strides=list(strides), dilations=[1, 1])
    g.outputs = [g.add("Add", g.add("Relu", y), r)]
    oihw = decode_2of4(values, meta, k).reshape(m, window, window, c).transpose(0, 3, 1, 2)
    return g, oihw.astype(np.float64), b, (n, out, out, m)


def _conv_want(x, r, w, b, pads, strides, half):
    from dnnc.ir.ops.conv import conv

    y = conv(x.astype(np.float64).transpose(0, 3, 1, 2), w, None, pads=list(pads),
             strides=list(strides)).transpose(0, 2, 3, 1)
    y = y + (0 if b is None else b.astype(np.float64))
    return np.maximum(y.astype(half.np).astype(np.float64), 0) + r.astype(np.float64)


# (images, H = W, C, M, window, pads, strides, precision, bias)
CONV_CASES = [(2, 5, 32, 32, 3, (1, 1, 1, 1), (1, 1), "fp16", True),
              (2, 7, 64, 16, 1, (0, 0, 0, 0), (2, 2), "bf16", False),
              (1, 6, 32, 48, 3, (1, 1, 1, 1), (2, 2), "fp16", True)]


def _conv_case(rng, case: int):
    """CONV_CASES[case]: (its graph, the image, the residual, the float64 result, the
    precision's unit roundoff, the precision)."""
    n, hw, c, m, window, pads, strides, precision, bias = CONV_CASES[case]
    half = HALF[precision]
    g, w, b, out = conv24_graph(rng, n, hw, c, m, window, pads, strides, precision, bias)
    x = rng.standard_normal((n, hw, hw, c)).astype(half.np)
    r = rng.standard_normal(out).astype(half.np)
    want = _conv_want(x, r, w, b, pads, strides, half)
    return g, x, r, want, 2.0 ** (-8 if precision == "bf16" else -11), precision


@needs_gxx
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_sparse24_conv_kernels_on_host(rng, tmp_path, case):
    """Sparse24ConvNHWC's implicit GEMM (patches gathered as conv_nhwc.py's: padding, strides)
    at the default config and others, against the float64 conv of the decoded weights."""
    from dnnc.backends.sparse_problems import sparse24_conv_product

    g, x, r, want, unit, precision = _conv_case(rng, case)
    target = machine(precision)
    _, (program,) = programs(g, machine=target)
    p = sparse24_conv_product(program.kernels[0])
    for i, config in enumerate(_configs(p, target, 3)):
        got, program = _run_on_host(g, {"x": x, "r": r}, target, tmp_path / str(i), config,
                                    "cuda_sparse24_conv")
        bound = 2 * unit * (np.abs(want) + 1) + 1e-5
        assert (np.abs(got.astype(np.float64) - want) <= bound).all(), config


W = functools.partial(TensorCoreConfig, wgmma=True)
WIDE = [W(64, 128, 64, 4, 1, 4, staged=True), W(128, 256, 64, 8, 1, 3, staged=True),
        W(256, 128, 64, 8, 1, 4, staged=True), W(128, 128, 128, 8, 1, 3)]
"""Warpgroups of more than 64 places (128 and 256; two m64 tiles a warpgroup in 256 x 128):
the tiles session 46's race made wrong (a k tile's metadata words loaded into the registers
the previous tile's wgmmas still read)."""
# (places shape, k, n, precision, bias, tail, config): warpgroup tiles (sm_90's wgmma knob)
# of one warpgroup, two down the rows, two across the places and four, of 64, 128 and 256
# places, ragged edges, split k and the refill issued first; k tiles of 128 and of 64 (W's
# rows in halves: an odd count of slots too), results direct and staged (transposed)
WARPGROUP_CASES = [((40,), 128, 64, "fp16", True, False, W(64, 64, 128, 4, 1, 3)),
                   ((2, 50), 256, 96, "bf16", True, True,
                    W(128, 128, 128, 8, 2, 3, refill_first=True)),
                   ((72,), 512, 64, "fp16", False, False, W(64, 64, 128, 4, 1, 4, 2)),
                   ((2, 24), 256, 128, "bf16", True, False, W(64, 128, 128, 4, 2, 3)),
                   ((40,), 128, 64, "fp16", True, False, W(64, 64, 64, 4, 1, 3, staged=True)),
                   ((2, 50), 256, 96, "bf16", True, True,
                    W(128, 128, 64, 8, 2, 4, staged=True)),
                   ((72,), 512, 64, "fp16", False, False, W(64, 64, 64, 4, 1, 4, 2)),
                   ((2, 24), 192, 128, "bf16", True, False,
                    W(64, 128, 64, 4, 2, 3, refill_first=True, staged=True)),
                   ((2, 100), 320, 64, "fp16", True, False, WIDE[0]),
                   ((300,), 384, 128, "bf16", False, False, WIDE[1]),
                   ((2, 68), 256, 256, "fp16", True, True, WIDE[2])]


@needs_gxx
@pytest.mark.parametrize("case", range(len(WARPGROUP_CASES)))
def test_sparse24_warpgroup_kernels_on_host(rng, tmp_path, case):
    """The wgmma.mma_async.sp product (the shim's emulation: the kept values through A's
    descriptor, each row's columns from its warp's metadata registers) against the float64
    product on the decoded weights, as the mma.sp product's cases."""
    *shape, config = WARPGROUP_CASES[case]
    g, feeds, want, bound = _product_case(rng, *shape)
    got, program = _run_on_host(g, feeds, machine(shape[3]), tmp_path, config)
    assert "dnnc_wgmma_sp_" in render_module(program.unique).source
    assert (np.abs(got.astype(np.float64) - want) <= bound).all()


def _metadata_rewritten_while_read(func) -> list[str]:
    """The stores of `func`'s k loop into metadata registers (`e_frag`) that a wgmma group
    still running reads (issued, committed, not yet completed by a `WgmmaWait`), the loop
    taken three times in a row (its turns follow one another) and what follows it once."""
    from dnnc.ir import loop as L

    loop = next(n for n in L.walk(func.body) if isinstance(n, L.For) and n.var.name == "kt")
    inside = set(map(id, L.walk(loop.body)))
    events = [n for n in L.walk(func.body) if isinstance(n, (L.Store, L.Wgmma, L.WgmmaCommit,
                                                             L.WgmmaWait))]
    last = max(i for i, n in enumerate(events) if id(n) in inside)
    turn, after = [n for n in events if id(n) in inside], events[last + 1:]
    running, issued, found = [], set(), []
    for n in turn * 3 + after:
        if isinstance(n, L.Store) and n.buffer.name == "e_frag":
            at = n.indices[0].value
            if any(at in group for group in running):
                found.append(f"e_frag[{at}]")
        elif isinstance(n, L.Wgmma):
            issued.add(n.meta.indices[0].value)
        elif isinstance(n, L.WgmmaCommit):
            running, issued = running + [issued], set()
        elif isinstance(n, L.WgmmaWait):
            running = running[len(running) - n.pending:] if n.pending else []
    return found


@pytest.mark.parametrize("config", WIDE + [W(128, 64, 64, 8, 1, 4, staged=True),
                                           W(64, 64, 128, 4, 1, 3, refill_first=True)])
def test_no_metadata_register_is_rewritten_while_a_wgmma_reads_it(config):
    """PTX forbids writing a wgmma's input registers until a wait completes it, and an H200
    read the metadata register as the wgmma ran: each k tile's words loaded into the
    registers the previous tile's wgmmas still read gave wide tiles wrong products (session
    46). Over k = 1088 (17 k tiles of 64, a k loop and an odd one after it), no store into a
    metadata register meets a group still running that reads it."""
    g, _, _ = sparse24_graph(np.random.default_rng(0), (256,), 1088 if config.block_k == 64
                             else 1152, 256, "fp16", False, False)
    _, (program,) = programs(g, machine=machine("fp16"), config=config)
    assert _metadata_rewritten_while_read(program.kernels[0].func) == []


@pytest.mark.gpu
@pytest.mark.parametrize("config", WIDE, ids=["64x128", "128x256", "256x128", "128x128k128"])
def test_wide_warpgroups_on_the_gpu(config):
    """Warpgroups of 128 and 256 places over k = 3072 (48 k tiles of 64, a k loop NVCC keeps
    rolled: the form in which session 46's race rewrote a running wgmma's metadata register;
    its products were off by 0.05-0.18 of the output's scale) on 1024 x 512 results, each of
    5 launches within `_product_case`'s bound plus one ulp of the Relu's output (the tensor
    cores' float32 sums, in their own order, can round a product to the half next to the
    float64 one's: on an H200 by 0.0029, an ulp at |y| in [2, 4) and the output's rounding)."""
    import cupy as cp
    from dnnc.backends.cuda import device

    if not device.has_wgmma(device.gpu_arch()):
        pytest.skip(f"wgmma needs sm_90, not {device.gpu_arch()}")
    g, feeds, want, bound = _product_case(np.random.default_rng(47), (1024,), 3072, 512,
                                          "fp16", True, False)
    bound = bound + 2 * 2.0 ** -11 * np.abs(want - feeds["r"])   # |Relu(y)|: want - r
    _, (program,) = programs(g, machine=machine("fp16"), config=config)
    (kernel,) = program.kernels
    module = render_module(program.unique)
    arch = device.compile_arch(device.gpu_arch(), module.source)   # sm_90a
    raw = cp.cuda.function.Module()
    raw.load(device.nvrtc_compile(module.source, arch, device.nvrtc_options(arch)))
    info = module.kernels[kernel.func.name]
    ins = [cp.asarray(v.const if v.const is not None else feeds[v.name]) for v in kernel.inputs]
    (out,) = kernel.outputs
    y = cp.full(out.type.shape, np.nan, np.float16)
    args = tuple(ins + [y] + [cp.empty(size, cp.uint8) for size in info.workspace])
    for _ in range(5):
        y[...] = np.nan
        for launch in info.launches:
            fn = raw.get_function(launch.name)
            device.allow_shared(fn, launch.shared_bytes)
            fn(launch.grid, launch.block, args, shared_mem=launch.shared_bytes)
        got = cp.asnumpy(y).astype(np.float64)
        assert (np.abs(got - want) <= bound).all(), np.abs(got - want).max()


@needs_gxx
def test_sparse24_warpgroup_conv_on_host(rng, tmp_path):
    """A padded 3x3 conv of 128 channels (k = 1152: k tiles of 128) on warpgroups."""
    n, hw, c, m, window, pads, strides = 1, 5, 128, 64, 3, (1, 1, 1, 1), (1, 1)
    g, w, b, out = conv24_graph(rng, n, hw, c, m, window, pads, strides, "fp16")
    x = rng.standard_normal((n, hw, hw, c)).astype(np.float16)
    r = rng.standard_normal(out).astype(np.float16)
    want = _conv_want(x, r, w, b, pads, strides, T.float16)
    got, _ = _run_on_host(g, {"x": x, "r": r}, machine("fp16"), tmp_path,
                          W(64, 64, 128, 4, 1, 3), "cuda_sparse24_conv")
    assert (np.abs(got.astype(np.float64) - want) <= 2 * 2.0 ** -11 * (np.abs(want) + 1) +
            1e-5).all()


@pytest.mark.parametrize("rows,places,k", [(768, 1024, 768), (3072, 1024, 768),
                                            (256, 6272, 1024), (64, 100352, 256),
                                            (128, 25088, 1152), (64, 200704, 576)])
def test_the_warpgroup_default_is_a_tile_of_the_table_in_the_space(rows, places, k):
    """On sm_90 the default of BERT-base b8's and resnet50 b32's layers is a WARPGROUP_TILES
    tile that the layer's space holds (its k tiles divide k, its ring fits)."""
    from dnnc.backends.cuda import sparse24
    from dnnc.backends.sparse_problems import sparse24_product

    g, _, _ = sparse24_graph(np.random.default_rng(0), (places,), k, rows, "fp16", True,
                             False)
    _, (program,) = programs(g, machine=machine("fp16"))
    p = sparse24_product(program.kernels[0])
    c = sparse24.default(p, machine("fp16"))
    assert c in [tile for tile, _ in sparse24.WARPGROUP_TILES]
    # W's rows in 64-row tiles where it has 64, two warpgroups of 128 rows where 256-row
    # blocks fill 132 SMs (resnet50's 1024->256 @14), of 64 on BERT's products
    assert c.block_m == {64: 64, 256: 256, 768: 128, 3072: 128}.get(rows, c.block_m)
    space = sparse24.space(p, machine("fp16"))
    assert space.check(c) == c
    assert space.check(WIDE[0]) == WIDE[0]   # 128 places a warpgroup


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sparse24_kernels_compile_with_nvrtc(rng, arch):
    """The host cases' kernels at their defaults (on sm_90 warpgroups where k allows) and a
    few other configs compile, and the warpgroup cases on sm_90 (for sm_90a)."""
    from dnnc.backends.cuda.device import compile_arch
    from dnnc.backends.sparse_problems import sparse24_conv_product, sparse24_product

    funcs = []
    for places, k, n, precision, bias, tail, config in WARPGROUP_CASES if arch == "sm_90" \
            else []:
        g, _, _ = sparse24_graph(rng, places, k, n, precision, bias, tail)
        _, (program,) = programs(g, machine=machine(precision), config=config)
        funcs += renamed(program, f"c{len(funcs)}_")
    for places, k, n, precision, bias, tail in CASES:
        g, _, _ = sparse24_graph(rng, places, k, n, precision, bias, tail)
        target = dataclasses.replace(machine(precision), arch=arch)
        _, (program,) = programs(g, machine=target)
        for config in _configs(sparse24_product(program.kernels[0]), target, 2):
            _, (program,) = programs(g, machine=target, config=config)
            funcs += renamed(program, f"c{len(funcs)}_")
    for n, hw, c, m, window, pads, strides, precision, bias in CONV_CASES:
        g, _, _, _ = conv24_graph(rng, n, hw, c, m, window, pads, strides, precision, bias)
        target = dataclasses.replace(machine(precision), arch=arch)
        _, (program,) = programs(g, machine=target)
        for config in _configs(sparse24_conv_product(program.kernels[0]), target, 1):
            _, (program,) = programs(g, machine=target, config=config)
            funcs += renamed(program, f"c{len(funcs)}_")
    source = render_module(funcs).source
    assert ("dnnc_wgmma_sp_" in source) == (arch == "sm_90")
    nvrtc_compiled(source, compile_arch(arch, source))


# -- the rewrite ------------------------------------------------------------------------------

def _pruned_graph(rng, kind, precision_dtype=T.float32):
    """A 2:4 pruned product -> Relu in float32: MatMul [8, 128, 768] x [768, 768], Gemm
    (transB, bias) [1024, 768] x [3072, 768]^T, a 1x1 Conv [32, 512, 14, 14] -> 512 (with a
    bias), a strided one, one of 2 groups (stays dense), or a padded 3x3 Conv [32, 256, 14,
    14] -> 256."""
    g = Graph(kind)
    if kind == "matmul":
        a = g.add_input("a", T.TensorType(T.float32, (8, 128, 768)))
        w = pruned_2of4(rng, 768, 768)
        y = g.add("MatMul", a, Value("w", T.TensorType(T.float32, (768, 768)),
                                     const=np.ascontiguousarray(w.T)))
    elif kind == "gemm":
        a = g.add_input("a", T.TensorType(T.float32, (1024, 768)))
        w = pruned_2of4(rng, 3072, 768)
        y = g.add("Gemm", a, Value("w", T.TensorType(T.float32, w.shape), const=w),
                  Value("c", T.TensorType(T.float32, (3072,)),
                        const=rng.standard_normal(3072).astype(np.float32)), transB=1)
    elif kind == "conv3x3":   # 2:4 along the input channels (OHWI), as dnnc sparsify lays it
        a = g.add_input("a", T.TensorType(T.float32, (32, 256, 14, 14)))
        w = pruned_2of4(rng, 256, 9 * 256).reshape(256, 3, 3, 256).transpose(0, 3, 1, 2)
        y = g.add("Conv", a, Value("w", T.TensorType(T.float32, w.shape),
                                   const=np.ascontiguousarray(w)), pads=[1, 1, 1, 1])
    else:
        a = g.add_input("a", T.TensorType(T.float32, (32, 512, 14, 14)))
        w = pruned_2of4(rng, 512, 512).reshape(512, 512, 1, 1)
        groups = 2 if kind == "grouped" else 1
        w = w[:, :512 // groups]
        y = g.add("Conv", a, Value("w", T.TensorType(T.float32, w.shape),
                                   const=np.ascontiguousarray(w)),
                  Value("c", T.TensorType(T.float32, (512,)),
                        const=rng.standard_normal(512).astype(np.float32)),
                  strides=[2, 2] if kind == "strided" else [1, 1], group=groups)
    g.outputs = [g.add("Relu", y)]
    return g


@pytest.mark.parametrize("kind", ["matmul", "gemm", "conv", "strided", "conv3x3"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_2of4_products_take_the_sparse_tensor_cores(rng, kind, precision, monkeypatch):
    """Products and unit 1x1 convs become Sparse24Dense, other convs Sparse24ConvNHWC (their
    Transposes to channels-last and back the only others); the bias an input. Every fitting
    layer taken (DNNC_SPARSE24=1): at the measured GPU_SPARSE24_EFFICIENCY the rule keeps
    these compute-bound layers dense (`test_the_measured_rule_keeps_compute_bound_layers_dense`)."""
    from dnnc.passes.manager import optimize

    monkeypatch.setenv("DNNC_SPARSE24", "1")
    graph = optimize(_pruned_graph(rng, kind), machine(precision))
    ops = [n.op for n in graph.nodes]
    op = "Sparse24ConvNHWC" if kind in ("strided", "conv3x3") else "Sparse24Dense"
    assert op in ops and not {"MatMul", "Gemm", "Conv", "ConvNHWC"} & set(ops), ops
    node = next(n for n in graph.nodes if n.op == op)
    assert node.attrs["structure"] == "2:4" and node.inputs[1].type.dtype is HALF[precision]
    assert (len(node.inputs) > 3 and node.inputs[3] is not None) == \
        (kind not in ("matmul", "conv3x3"))


@pytest.mark.parametrize("case", ["fp32", "llvm", "not 2:4", "grouped", "tiny"])
def test_nothing_changes_elsewhere(rng, case):
    """fp32 on cuda, llvm at any precision, weights of 3 nonzeros in a group, a grouped conv
    and a product too small to gain keep their dense ops."""
    from dnnc.backends.registry import REGISTRY
    from dnnc.passes.manager import optimize

    g = _pruned_graph(rng, "grouped" if case == "grouped" else "matmul")
    if case == "not 2:4":
        w = g.nodes[0].inputs[1]
        w.const[:3, 0] = 1.0   # W = B^T: 3 nonzeros in W[0]'s first group
    if case == "tiny":
        g = Graph("tiny")
        a = g.add_input("a", T.TensorType(T.float32, (4, 64)))
        g.outputs = [g.add("MatMul", a, Value("w", T.TensorType(T.float32, (64, 32)),
                                               const=pruned_2of4(rng, 32, 64).T.copy()))]
    target = {"fp32": Target("cuda", arch="sm_90", layouts=LAYOUTS),
              "llvm": REGISTRY["llvm"].target(precision="bf16")}.get(case, machine("fp16"))
    graph = optimize(g, target)
    assert not {"Sparse24Dense", "Sparse24ConvNHWC"} & {n.op for n in graph.nodes}


# -- on a GPU ---------------------------------------------------------------------------------

def _gpu_model(graph, precision):
    import dnnc

    return dnnc.compile(graph, target="cuda", precision=precision, outputs="numpy")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["matmul", "gemm", "conv", "strided", "conv3x3"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_2of4_pruned_model_on_the_gpu(rng, kind, precision, monkeypatch):
    """A 2:4 pruned product or conv compiled for cuda at fp16 / bf16 with every fitting layer
    taken (DNNC_SPARSE24=1): it takes the sparse tensor cores (Sparse24Dense /
    Sparse24ConvNHWC) and matches the model's fp32 reference within the precision's model
    bound."""
    from dnnc.ir.target import model_error_bound

    monkeypatch.setenv("DNNC_SPARSE24", "1")
    g = _pruned_graph(rng, kind)
    model = _gpu_model(g, precision)
    assert {"Sparse24Dense", "Sparse24ConvNHWC"} & {n.op for n in model.graph.nodes}
    x = rng.standard_normal(g.inputs[0].type.shape).astype(np.float32)
    want = _fp32_reference(g, x)
    got = model(x)
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= model_error_bound(precision), err


def _fp32_reference(g, x) -> np.ndarray:
    from dnnc.ir.interpreter import run_graph

    return np.asarray(run_graph(g, [x])[0], np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sparse24_kernels_on_the_gpu(rng, case):
    """The host cases (bias, residual, layout tail) compiled whole on the device."""
    places, k, n, precision, bias, tail = CASES[case]
    half = HALF[precision]
    g, w, b = sparse24_graph(rng, places, k, n, precision, bias, tail)
    model = _gpu_model(g, precision)
    a = rng.standard_normal(places + (k,)).astype(half.np)
    r = rng.standard_normal(places + (n,)).astype(half.np)
    want = _want(a, r, w, b, tail, half)
    unit = 2.0 ** (-8 if precision == "bf16" else -11)
    got = np.asarray(model(a, r), np.float64)
    assert (np.abs(got - want) <= 2 * unit * (np.abs(want) + 1) + 1e-5).all()


@pytest.mark.parametrize("switch", ["0", "1"])
def test_the_switch_overrides_the_rule(rng, monkeypatch, switch):
    """DNNC_SPARSE24=1 takes a product the rule keeps dense (the fuzzer's small layers), =0
    keeps one the rule takes."""
    from dnnc.passes.manager import optimize

    if switch == "1":
        g = Graph("tiny")
        a = g.add_input("a", T.TensorType(T.float32, (4, 64)))
        g.outputs = [g.add("MatMul", a, Value("w", T.TensorType(T.float32, (64, 32)),
                                               const=pruned_2of4(rng, 32, 64).T.copy()))]
    else:   # a batch-1 product, bound by its weights' bytes: the rule takes it
        g = Graph("gemv")
        a = g.add_input("a", T.TensorType(T.float32, (1, 768)))
        g.outputs = [g.add("MatMul", a, Value("w", T.TensorType(T.float32, (768, 3072)),
                                               const=pruned_2of4(rng, 3072, 768).T.copy()))]
        assert "Sparse24Dense" in [n.op for n in optimize(g, machine("fp16")).nodes]
    monkeypatch.setenv("DNNC_SPARSE24", switch)
    ops = [n.op for n in optimize(g, machine("fp16")).nodes]
    assert ("Sparse24Dense" in ops) == (switch == "1")


def _nonfinite_case(rng, precision, dead=False):
    """(graph, x, want): a bare Sparse24Dense of [24, 128] by 32 outputs, NaN and +-inf
    activations at kept and pruned positions; want the float64 dense product. `dead`: column
    64 pruned in every row (its group keeps 65 and 66), so that no row's sum sees x[:, 64]
    (`covering_rows` 0: the kernel scans its k tiles)."""
    half = HALF[precision]
    places, k, n = 24, 128, 32
    w = pruned_2of4(rng, n, k) / np.float32(np.sqrt(k))
    if dead:
        w[:, 64:68] = np.where(np.isin(np.arange(4), (1, 2)), 0.5, 0.0)
    values, meta = encode_2of4(w, half)
    assert (covering_rows(meta, n, k) == 0) == dead
    g = Graph("sparse24_nan")
    a = g.add_input("a", T.TensorType(half, (places, k)))
    g.outputs = [g.add("Sparse24Dense", a, Value("w.kept", T.TensorType(half, values.shape),
                                                 const=values),
                       Value("w.meta", T.TensorType(T.uint32, meta.shape), const=meta),
                       n=n, k=k)]
    x = rng.standard_normal((places, k)).astype(half.np)
    x[3, 5], x[7, 64], x[7, 65], x[11, 127], x[20, 0] = np.nan, np.inf, -np.inf, np.inf, -np.inf
    x[15, 64] = np.nan   # where `dead`, at no kept weight: only a scan finds it
    dense = decode_2of4(values, meta, k).astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = (x.astype(np.float64)[:, None, :] * dense[None]).sum(-1)
    assert np.isnan(want[3]).all() and np.isfinite(want[0]).all() and np.isnan(want[11]).any()
    return g, x, want


def _check_nonfinite(got, want, precision):
    got = got.astype(np.float64)
    unit = 2.0 ** (-8 if precision == "bf16" else -11)
    assert (np.isnan(got) == np.isnan(want)).all() and \
        (np.isinf(got) == np.isinf(want)).all()
    finite = np.isfinite(want)
    assert (np.abs(got[finite] - want[finite]) <= unit * (np.abs(want[finite]) + 1)).all()


@needs_gxx
@pytest.mark.parametrize("dead", [False, True], ids=["sums", "scanned"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("config", [None, W(64, 64, 128, 4, 1, 3),
                                    W(64, 64, 64, 4, 1, 4, staged=True)],
                         ids=["default", "wgmma", "wgmma_k64_staged"])
def test_nonfinite_activations_at_pruned_weights_make_nan_on_host(rng, tmp_path, precision,
                                                                  config, dead):
    """NaN and +-inf activations at kept and at pruned positions: the outputs are what the
    dense product makes (x * 0 is NaN for a non-finite x), through the flags and the rare
    path's recount; the other places' outputs as without them (mma.sp's warps, the
    default here, and warpgroups). The flags come from the block's sums where its rows keep
    every k, from a scan of each k tile where a column is pruned in every row (`dead`)."""
    g, x, want = _nonfinite_case(rng, precision, dead)
    got, program = _run_on_host(g, {"a": x}, machine(precision), tmp_path, config)
    assert ("scanned" in render_module(program.unique).source) == dead
    _check_nonfinite(got, want, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("dead", [False, True], ids=["sums", "scanned"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_nonfinite_activations_at_pruned_weights_make_nan_on_the_gpu(rng, precision, dead):
    g, x, want = _nonfinite_case(rng, precision, dead)
    _check_nonfinite(np.asarray(_gpu_model(g, precision)(x)), want, precision)


def test_covering_rows_is_the_fewest_rows_that_keep_every_column():
    """16 where each 16 rows keep every column, 32 where rows 0-15 prune one that rows
    16-31 keep, 0 where every row prunes it; the last run is the rows left (48 rows)."""
    w = np.tile(np.array([1.0, 1.0, 0.0, 0.0], np.float32), (48, 8))
    w[1::2] = np.roll(w[1::2], 2, axis=1)      # odd rows keep columns 2, 3 of each group
    assert covering_rows(encode_2of4(w, T.float16)[1], 48, 32) == 16
    w[:16, 4:8] = [1.0, 1.0, 0.0, 0.0]          # rows 0-15 prune columns 6 and 7
    assert covering_rows(encode_2of4(w, T.float16)[1], 48, 32) == 32
    w[32:, 4:8] = [1.0, 1.0, 0.0, 0.0]          # so do rows 32-47, the last run of 32
    assert covering_rows(encode_2of4(w, T.float16)[1], 48, 32) == 64
    w[:, 4:8] = [1.0, 1.0, 0.0, 0.0]
    assert covering_rows(encode_2of4(w, T.float16)[1], 48, 32) == 0


@needs_gxx
def test_nonfinite_activations_in_a_2of4_conv_on_host(rng, tmp_path):
    """The implicit GEMM's patches (a 3x3 window, padded, strided) with a NaN and infinities
    at kept and pruned taps: NaN where the dense conv makes it (elementwise float64 sums)."""
    n, hw, c, m, window, pads, strides = 1, 6, 32, 16, 3, (1, 1, 1, 1), (2, 2)
    g, w, _, out = conv24_graph(rng, n, hw, c, m, window, pads, strides, "fp16", False)
    g.outputs = [g.nodes[0].outputs[0]]   # the conv alone
    x = rng.standard_normal((n, hw, hw, c)).astype(np.float16)
    x[0, 0, 0, 3], x[0, 3, 2, 10], x[0, 5, 5, 31] = np.nan, np.inf, -np.inf
    xp = np.pad(x.astype(np.float64), [(0, 0), (1, 1), (1, 1), (0, 0)])
    want = np.zeros(out)
    with np.errstate(invalid="ignore"):
        for ky in range(3):
            for kx in range(3):
                patch = xp[:, ky:ky + 2 * out[1]:2, kx:kx + 2 * out[2]:2]
                want += (patch[..., None, :] * w[:, :, ky, kx][None, None, None]).sum(-1)
    got, _ = _run_on_host(g, {"x": x}, machine("fp16"), tmp_path, None, "cuda_sparse24_conv")
    assert np.isnan(want).any() and np.isfinite(want).any()
    _check_nonfinite(got, want, "fp16")


def test_the_op_s_rule_and_reference_agree_on_llvm(rng):
    """Sparse24Dense through its compute rule (the default schedule: llvm, its half values
    widened) against `evaluate` and the float64 product of the decoded weights, a NaN and an
    infinity among the activations (x * 0 at a pruned weight is NaN there too)."""
    import dnnc
    from dnnc.ir.ops.registry import get_op

    n, k = 32, 64
    values, meta = encode_2of4(pruned_2of4(rng, n, k), T.float16)
    g = Graph("rule")
    a = g.add_input("a", T.TensorType(T.float32, (5, k)))
    g.outputs = [g.add("Sparse24Dense", a, Value("v", T.TensorType(T.float16, values.shape),
                                                 const=values),
                       Value("m", T.TensorType(T.uint32, meta.shape), const=meta), n=n, k=k)]
    x = rng.standard_normal((5, k)).astype(np.float32)
    x[2, 3], x[4, 7] = np.inf, np.nan
    with np.errstate(invalid="ignore"):
        want = (x.astype(np.float64)[:, None, :] *
                decode_2of4(values, meta, k).astype(np.float64)[None]).sum(-1)
        reference = get_op("Sparse24Dense").evaluate(x, values, meta, n=n, k=k)
    got = dnnc.compile(g, target="llvm")(x)
    for y in (got, reference):
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert np.isnan(want[2]).any() and np.isnan(want[4]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_sparse24_conv_kernels_on_the_gpu(rng, case):
    """The host conv cases (padding, strides, bias, residual) compiled whole on the device."""
    g, x, r, want, unit, precision = _conv_case(rng, case)
    got = np.asarray(_gpu_model(g, precision)(x, r), np.float64)
    assert (np.abs(got - want) <= 2 * unit * (np.abs(want) + 1) + 1e-5).all()


def test_the_rule_reads_a_conv_s_image_once():
    """resnet50's 3x3 64 -> 64 conv at 56 x 56, batch 32: bound by its products with the
    image read once, by its bytes were its patches counted (9 reads a pixel)."""
    from dnnc.passes.sparse24 import GPU_TENSOR_FIGURES, product_seconds

    flops, bandwidth = GPU_TENSOR_FIGURES
    products = 2 * 100352 * 64 * 576 / (2 * flops * 0.6)   # dense, bound by its products
    once = product_seconds(100352, 64, 576, flops, bandwidth, False, reads=32 * 64 * 56 * 56)
    assert once == pytest.approx(products + 2e-6)
    assert product_seconds(100352, 64, 576, flops, bandwidth, False) > 1.5 * once


def test_the_measured_rule_keeps_compute_bound_layers_dense():
    """At the measured efficiency (2:4 / dense 1.21 on an H200 over BERT's and resnet50's
    layers) no product bound by its arithmetic takes 2:4; one bound by its weights' bytes
    (batch 1) does."""
    from dnnc.passes.sparse24 import sparse24_faster

    target = machine("fp16")
    for places, rows, depth in ((1024, 3072, 768), (1024, 768, 3072), (6272, 256, 2304),
                                (100352, 64, 576)):
        assert not sparse24_faster(places, rows, depth, target)
    assert sparse24_faster(1, 3072, 768, target)


def test_a_sparsified_file_runs_2of4_end_to_end(rng, monkeypatch):
    """resnet50 (32 x 32 images) pruned as `dnnc sparsify --pattern 2:4` writes it, compiled
    for cuda at fp16 with every fitting layer taken (DNNC_SPARSE24=1): all its convs but the
    stem run 2:4 (Sparse24Dense, Sparse24ConvNHWC), and the optimised graph's reference
    (the ops' evaluate) matches the pruned file's fp32 one within the fp16 model bound."""
    from dnnc.frontend.onnx import import_onnx
    from dnnc.ir.interpreter import run_graph
    from dnnc.ir.target import model_error_bound
    from dnnc.passes.manager import optimize
    from dnnc.testing.pruned_files import pruned_model

    model = pruned_model("resnet50", None, "2:4", batch=2, size=32)
    graph = import_onnx(model)
    monkeypatch.setenv("DNNC_SPARSE24", "1")
    optimized = optimize(graph, machine("fp16"))
    ops = [n.op for n in optimized.nodes]
    assert ops.count("Sparse24Dense") + ops.count("Sparse24ConvNHWC") == 52
    assert ops.count("ConvNHWC") == 1 and ops.count("Transpose") <= 2
    x = rng.standard_normal(graph.inputs[0].type.shape).astype(np.float32)
    want = np.asarray(run_graph(graph, [x])[0], np.float64)
    got = np.asarray(run_graph(optimized, [x])[0], np.float64)
    assert np.abs(got - want).max() / np.abs(want).max() <= model_error_bound("fp16")
