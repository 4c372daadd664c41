"""Every schedule template honours every config of its knob space.

For each template, a kernel it is chosen for (shapes with tails: odd sizes that are no
multiple of a vector, a tile or a slice; a symbolic batch specialised to an odd size): its
default config lies in its space, 20 configs drawn from the space (seeded) are each built
through `schedule_kernel(..., config=...)`, compiled to native code and run against the
graph's NumPy reference; a config outside the space is refused with a ConfigError naming the
template and the knob.
"""

import ctypes
import dataclasses

import numpy as np
import pytest

from dnnc.backends.llvm.codegen import ModuleBuilder
from dnnc.backends.llvm.cpu import host_target
from dnnc.backends.llvm.jit import JITModule
from dnnc.backends.llvm.schedules import schedule_kernel, template_for
from dnnc.backends.lower import lower_group
from dnnc.errors import ConfigError
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.backends.registry import REGISTRY
from dnnc.ir.target import Target
from dnnc.passes.convert_layout import convert_layout
from dnnc.passes.specialize import specialize

CONFIGS = 20
BATCH = 3   # the symbolic batch "N", specialised


def _const(rng, name, shape, scale=1.0):
    array = (rng.standard_normal(shape) * scale).astype(np.float32)
    return Value(name, T.TensorType(T.float32, shape), const=array)


def _graph(inputs):
    g = Graph("g")
    return g, [g.add_input(name, T.TensorType(T.float32, shape)) for name, shape in inputs]


def matmul_bias_relu(rng):
    g, (a,) = _graph([("a", ("N", 7, 45))])
    y = g.add("MatMul", a, _const(rng, "b", (45, 37)))
    g.outputs = [g.add("Relu", g.add("Add", y, _const(rng, "c", (37,))))]
    return g


def gemm_transposed(rng):
    g, (a,) = _graph([("a", (45, 11))])
    g.outputs = [g.add("Gemm", a, _const(rng, "b", (37, 45)), _const(rng, "c", (11, 37)),
                       transA=1, transB=1, alpha=0.5, beta=2.0)]
    return g


def batched_matmul(rng):
    g, (a, b) = _graph([("a", ("N", 9, 45)), ("b", ("N", 45, 20))])
    g.outputs = [g.add("MatMul", a, b)]
    return g


def matmul_heads_first(rng):
    """A projection stored heads-first through its layout tail (as bert's QKV)."""
    g, (x,) = _graph([("x", (BATCH, 5, 24))])
    y = g.add("Add", g.add("MatMul", x, _const(rng, "w", (24, 32))), _const(rng, "c", (32,)))
    shape = Value("shape", T.TensorType(T.int64, (4,)), const=np.array([BATCH, 5, 2, 16]))
    g.outputs = [g.add("Transpose", g.add("Reshape", y, shape), perm=[0, 2, 1, 3])]
    return g


def conv_bias_relu(rng, c=5, oc=7, k=3, h=9, w=11, **attrs):
    g, (x,) = _graph([("x", ("N", c, h, w))])
    y = g.add("Conv", x, _const(rng, "w", (oc, c // attrs.get("group", 1), k, k), 0.3),
              _const(rng, "c", (oc,)), **attrs)
    g.outputs = [g.add("Relu", y)]
    return g


def pointwise_residual(rng, h=9, w=11, strides=(1, 1), c=6):
    oh, ow = -(-h // strides[0]), -(-w // strides[1])
    g, (x, r) = _graph([("x", ("N", c, h, w)), ("r", ("N", 9, oh, ow))])
    y = g.add("Conv", x, _const(rng, "w", (9, c, 1, 1), 0.3), _const(rng, "c", (9,)),
              strides=list(strides))
    g.outputs = [g.add("Relu", g.add("Add", y, r))]
    return g


def _pruned(rng, name, shape, keep=0.05):
    """A constant of normal weights, each kept with probability `keep` (the rest zero): what
    convert_layout's "sparse_weights" computes sparse."""
    value = _const(rng, name, shape)
    value.const[rng.random(shape) >= keep] = 0.0
    return value


def sparse_pointwise(rng):
    g, (x, r) = _graph([("x", ("N", 40, 9, 11)), ("r", ("N", 33, 9, 11))])
    y = g.add("Conv", x, _pruned(rng, "w", (33, 40, 1, 1)), _const(rng, "b", (33,)),
              kernel_shape=[1, 1])
    g.outputs = [g.add("Relu", g.add("Add", y, r))]
    return g


def sparse_matmul(rng):
    g, (a,) = _graph([("a", ("N", 7, 300))])
    y = g.add("MatMul", a, _pruned(rng, "b", (300, 301)))
    g.outputs = [g.add("Tanh", g.add("Add", y, _const(rng, "c", (301,))))]
    return g


def pool(op, **attrs):
    def build(rng):
        g, (x,) = _graph([("x", ("N", 3, 13, 23))])
        g.outputs = [g.add(op, x, **attrs)]
        return g
    return build


def unary(op, shape, **attrs):
    def build(rng):
        g, (x,) = _graph([("x", shape)])
        g.outputs = [g.add(op, x, **attrs)]
        return g
    return build


# (id, graph builder, layouts packed by convert_layout, the template chosen, rtol = atol: the
# tolerances of test_templates.py and test_default_schedule.py)
CASES = [
    ("dense", matmul_bias_relu, False, "dense", 1e-4),
    ("dense-packed", matmul_bias_relu, True, "dense", 1e-4),
    ("dense-gemm-transposed", gemm_transposed, False, "dense", 1e-4),
    ("dense-batched", batched_matmul, False, "dense", 1e-4),
    ("dense-heads-first", matmul_heads_first, True, "dense", 1e-4),
    ("conv2d", lambda rng: conv_bias_relu(rng, pads=[1, 1, 1, 1], strides=[1, 2]), False,
     "conv2d", 1e-4),
    ("conv2d-packed", lambda rng: conv_bias_relu(rng, oc=20, pads=[2, 1, 0, 1],
                                                 dilations=[2, 1]), True, "conv2d", 1e-4),
    ("pointwise", pointwise_residual, True, "pointwise", 1e-4),
    # small images and strides: the GEMM, pixels as rows
    ("pointwise-gemm", lambda rng: pointwise_residual(rng, 5, 7), True, "pointwise_gemm",
     1e-4),
    ("pointwise-gemm-strided", lambda rng: pointwise_residual(rng, 11, 9, (2, 2)), True,
     "pointwise_gemm", 1e-4),
    # grouped: a group's channel slice a conv of its own (5 and 7 output channels a group:
    # no whole vector; a packed group padded to whole blocks of its own)
    ("conv2d-grouped", lambda rng: conv_bias_relu(rng, c=6, oc=10, group=2, pads=[1, 1, 1, 1],
                                                  strides=[2, 2]), False, "conv2d", 1e-4),
    ("conv2d-grouped-packed", lambda rng: conv_bias_relu(rng, c=9, oc=21, group=3,
                                                         pads=[0, 1, 2, 1]),
     True, "conv2d", 1e-4),
    ("pointwise-grouped", lambda rng: conv_bias_relu(rng, c=12, oc=15, k=1, group=3), False,
     "pointwise", 1e-4),
    ("pointwise-grouped-packed", lambda rng: conv_bias_relu(rng, c=8, oc=36, k=1, group=4),
     True, "pointwise", 1e-4),
    ("depthwise", lambda rng: conv_bias_relu(rng, c=6, oc=6, group=6, pads=[1, 1, 1, 1],
                                             strides=[2, 2]), False, "depthwise", 1e-5),
    # stride 1: the flat plane is in the space (9 x 11 and 5x5: rows narrower than a vector)
    ("depthwise-stride-1", lambda rng: conv_bias_relu(rng, c=6, oc=6, k=5, group=6,
                                                      pads=[2, 1, 2, 0]),
     False, "depthwise", 1e-5),
    # 3x3 stride 1, enough channels and pixels for `winograd_tile` to pick a tile (72 output
    # channels: a partial block; 15 columns: a partial tile)
    ("winograd", lambda rng: conv_bias_relu(rng, c=64, oc=72, pads=[1, 1, 1, 1], h=14, w=15),
     True, "winograd", 1e-4),
    ("pool2d-max", pool("MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
     False, "pool2d", 1e-6),
    ("pool2d-average", pool("AveragePool", kernel_shape=[3, 2], pads=[1, 0, 1, 1],
                            count_include_pad=1), False, "pool2d", 1e-6),
    # precision bf16 ("bf16": weights packed in bf16 pairs; the reference is the packed
    # graph's, products of bf16-rounded operands)
    ("dense-bf16", matmul_bias_relu, "bf16", "dense", 1e-4),
    ("conv2d-bf16", lambda rng: conv_bias_relu(rng, oc=20, pads=[2, 1, 0, 1],
                                               dilations=[2, 1]), "bf16", "conv2d", 1e-4),
    ("pointwise-bf16", pointwise_residual, "bf16", "pointwise", 1e-4),
    ("pointwise-gemm-bf16-strided", lambda rng: pointwise_residual(rng, 11, 9, (2, 2)),
     "bf16", "pointwise_gemm", 1e-4),
    # A packed pair by pair (NCHW: [k, m]): 37 channels, slices of 16 and 32 ending in an
    # odd pair, 49 pixels (a last tile past M)
    ("pointwise-gemm-bf16-odd", lambda rng: pointwise_residual(rng, 7, 7, c=37),
     "bf16", "pointwise_gemm", 1e-4),
    # weights of 95% zeros, in CSR ("sparse_weights"): a 1x1 conv with a residual, a MatMul
    # over two slices of the depth (300 > 256)
    ("sparse-pointwise", sparse_pointwise, True, "sparse", 1e-5),
    ("sparse-dense", sparse_matmul, True, "sparse", 1e-5),
    ("rows-softmax", unary("Softmax", ("N", 5, 37)), False, "rows", 1e-5),
    # the sum of a whole tensor (chunked when parallel) on integer-valued inputs: exact in
    # float32 in every order, where on reals the orders of two configs differ by up to
    # n * eps * sum(|x|) (26k values), more than any fixed tolerance could tell from a bug
    ("rows-sum", unary("ReduceSum", ("N", 67, 131), keepdims=0), False, "rows", 1e-5),
]
INTEGER_INPUTS = {"rows-sum"}


def _machine() -> Target:
    return host_target()


# a machine of each vector width (the features decide it), for templates' defaults and spaces
FEATURES = {128: "+sse2", 256: "+avx,+avx2,+fma", 512: "+avx,+avx2,+fma,+avx512f"}


def _kernel(rng, build, packed, integers=False, cpu=None):
    """The case's graph with its batch specialised, its kernel (every node one group), and
    random inputs (normal, or integers in [-8, 8]); its layouts converted for `cpu` (None:
    this host's; which layouts a precision takes depends on the CPU: AMX keeps 3x3 convs
    from Winograd at bf16)."""
    graph = build(rng)
    shapes = [tuple(BATCH if d == "N" else d for d in v.type.shape) for v in graph.inputs]
    graph = specialize(graph, shapes)
    feeds = [(rng.integers(-8, 8, s, endpoint=True) if integers else rng.standard_normal(s))
             .astype(np.float32) for s in shapes]
    want = run_graph(graph, feeds)
    if packed:
        precision = packed if isinstance(packed, str) else None
        assert convert_layout(graph, REGISTRY["llvm"].target(cpu, precision)) == 1
        if precision:   # the products of bf16-rounded operands
            want = run_graph(graph, feeds)
    kernel = lower_group(graph.nodes, "k", outputs=graph.outputs)
    assert not kernel.func.size_vars
    arrays = {id(v): a for v, a in zip(graph.inputs, feeds)}
    inputs = [v.const if v.const is not None else arrays[id(v)] for v in kernel.inputs]
    return kernel, [np.ascontiguousarray(a) for a in inputs], want


def _run_all(funcs, inputs, outputs_like):
    """Each PrimFunc compiled to native code (one module) and called on `inputs`."""
    mb = ModuleBuilder("configs")
    for f in funcs:
        mb.add(f)
    jit = JITModule(str(mb), host_target(), 2)
    results = []
    for f in funcs:
        outs = [np.full(like.shape, np.nan, np.float32) for like in outputs_like]
        arrays = inputs + outs
        entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
            jit.address(f"{f.name}_packed"))
        entry((ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays]),
              (ctypes.c_int64 * 1)())
        results.append(outs)
    return results


@pytest.mark.parametrize("name,build,packed,template_name,tol", CASES,
                         ids=[c[0] for c in CASES])
def test_every_sampled_config_matches_the_reference(rng, name, build, packed, template_name,
                                                     tol):
    kernel, inputs, want = _kernel(rng, build, packed, name in INTEGER_INPUTS)
    machine = _machine()
    template, problem = template_for(kernel)
    assert template.name == template_name
    space = template.space(problem, machine)
    default = template.default(problem, machine)
    assert space.check(default) == default
    every = list(space.configs())
    configs = space.sample(rng, CONFIGS)
    assert len(configs) == min(CONFIGS, len(every)) and len(set(configs)) == len(configs)
    assert all(c in every for c in configs)
    funcs = []
    for k, config in enumerate(configs):
        func = schedule_kernel(kernel, machine, config=config)
        funcs.append(L.PrimFunc(f"k{k}", func.params, func.body, func.size_vars, func.attrs))
    for config, got in zip(configs, _run_all(funcs, inputs, want)):
        for out, ref in zip(got, want):
            np.testing.assert_allclose(out, ref, rtol=tol, atol=tol,
                                       err_msg=f"{template_name} {config}")


def test_every_template_is_drawn_twenty_configs():
    """The spaces of the cases above are big enough for the sample the test above draws:
    20 configs for every template, where one case's space has fewer (a packed conv's)."""
    rng = np.random.default_rng(0)
    machine = _machine()
    sizes: dict[str, int] = {}
    for name, build, packed, template_name, _ in CASES:
        kernel, _, _ = _kernel(rng, build, packed)
        template, problem = template_for(kernel)
        size = len(list(template.space(problem, machine).configs()))
        sizes[template_name] = max(sizes.get(template_name, 0), size)
    assert sorted(sizes) == ["conv2d", "dense", "depthwise", "pointwise", "pointwise_gemm",
                             "pool2d", "rows", "sparse", "winograd"]
    assert all(size >= CONFIGS for size in sizes.values()), sizes


def _refusal(kernel, config, *words):
    with pytest.raises(ConfigError) as info:
        schedule_kernel(kernel, dataclasses.replace(_machine(), threads=2), config=config)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_config_outside_the_space_is_refused_naming_the_knob(rng):
    kernel, _, _ = _kernel(rng, matmul_bias_relu, False)
    template, problem = template_for(kernel)
    default = template.default(problem, _machine())
    _refusal(kernel, dataclasses.replace(default, mr=9), "'dense'", "mr=9",
             "1, 2, 3, 4, 5, 6, 7, 8")
    _refusal(kernel, dataclasses.replace(default, kc=100), "'dense'", "kc=100", "16, 32, 45")
    _refusal(kernel, dataclasses.replace(default, mr=True), "'dense'", "mr=True")
    # a knob value in its list, but a row block reaching past the last row (m = 21)
    _refusal(kernel, dataclasses.replace(default, mr=8, mc_tiles=4), "'dense'",
             "mc_tiles <= ceil(m / mr)")
    _refusal(kernel, {"mr": 6, "nr": 8}, "'dense'", "misses knob(s) kc, mc_tiles")
    _refusal(kernel, {**dataclasses.asdict(default), "unroll": 2}, "has no knob(s) unroll")


def test_a_config_of_another_template_or_a_packed_panel_is_refused(rng):
    from dnnc.backends.llvm.conv import ConvConfig

    kernel, _, _ = _kernel(rng, matmul_bias_relu, True)
    template, problem = template_for(kernel)
    panel = problem.packed_panel
    default = template.default(problem, _machine())
    assert default.nr == panel
    _refusal(kernel, dataclasses.replace(default, nr=2 * panel), f"nr == {panel}",
             "packed in panels")
    _refusal(kernel, ConvConfig(4, panel), "'dense' takes a DenseConfig, not ConvConfig")


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
@pytest.mark.parametrize("threads", [1, 3, 8])
def test_defaults_lie_in_their_spaces_on_every_machine(vector_bits, threads):
    rng = np.random.default_rng(0)
    machine = Target("llvm", features=FEATURES[vector_bits], threads=threads)
    assert machine.vector_bits == vector_bits
    for name, build, packed, _, _ in CASES:
        kernel, _, _ = _kernel(rng, build, packed)
        template, problem = template_for(kernel)
        default = template.default(problem, machine)
        assert template.space(problem, machine).check(default) == default, name


@dataclasses.dataclass(frozen=True)
class _Tiles:
    x: int
    y: int
    flag: bool


def _tiles_space(size: int):
    from dnnc.backends.space import Constraint, Space

    return Space("tiles", _Tiles, {"x": range(1, size + 1), "y": range(1, size + 1),
                                   "flag": (False, True)},
                 [Constraint("x <= y", lambda c: c.x <= c.y)])


def test_a_space_lists_and_samples_only_valid_distinct_configs(rng):
    small = _tiles_space(4)
    every = list(small.configs())
    assert len(every) == 2 * (4 * 5 // 2) and all(c.x <= c.y for c in every)
    assert sorted(small.sample(rng, 100), key=every.index) == every   # all of them
    # a product too big to list (300 * 300 * 2): drawn at random, distinct and valid
    big = _tiles_space(300)
    drawn = big.sample(rng, 50)
    assert len(set(drawn)) == 50 and all(big.check(c) == c for c in drawn)
    with pytest.raises(ConfigError, match=r"'tiles'.*breaks the constraint: x <= y"):
        big.check(_Tiles(5, 4, True))
    with pytest.raises(ConfigError, match=r"knob flag=1 is not one of its allowed values "
                                          r"False, True"):
        big.check({"x": 1, "y": 2, "flag": 1})
