"""No stage of a cuda kernel runs a large loop on one thread (issue 31's convnext cliff:
at batch 32 the elementwise tail of a LayerNorm over channels, between two transposes, ran
4.8 million iterations on one GPU thread: 181 ms of a 198 ms model).

The cause was an analysis limit: after its loops were fused to the row count, the stage's
store indices were digits of the fused counter (`i // 28 // 192`, `i // 28 % 192`,
`i % 28`) over more than 65536 iterations, which `carried` did not evaluate and took as
shared. `loop_analysis.mixed_radix` now proves such digits distinct at any extent. Checked
here on the pattern at batches 1 to 256 and on zoo models at batch 32 and 128, without a
GPU: the scheduled kernels' single-thread stages (`threads.single_thread`) must each do
little work."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuda_kernels import programs
from dnnc import zoo
from dnnc.backends import loop_analysis
from dnnc.backends.loop_analysis import mixed_radix, nest_work
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import loop as L

SERIAL_WORK = 4096
"""Iterations a stage may run on one thread (a scalar's bookkeeping, a tiny tail)."""


def serial_stages(func: L.PrimFunc) -> list[int]:
    """The work of each stage of `func` launched as one block of one thread."""
    out = []
    for n in L.walk(func.body):
        if isinstance(n, L.For) and n.kind == L.ForKind.BLOCK_X and n.extent == L.const(1) \
                and isinstance(n.body, L.For) and n.body.kind == L.ForKind.THREAD_X and \
                n.body.extent == L.const(1):
            out.append(nest_work(n.body.body) or 0)
    return out


def heavy_serial(graph) -> list[str]:
    _, progs = programs(graph)
    return [f"{f.name}: {w} iterations on one thread" for p in progs for f, _ in p.unique
            for w in serial_stages(f) if w > SERIAL_WORK]


def convnext_downsample(batch: int, channels: int = 192, size: int = 28):
    """A ConvNeXt block's end and the next stage's LayerNorm2d as torchvision exports it:
    layer scale, residual, Transpose to NHWC, LayerNormalization, Transpose back, the 2x2
    stride-2 Conv."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("gamma", rng.normal(size=(channels, 1, 1))), ("lw", rng.normal(size=channels)),
        ("lb", rng.normal(size=channels)),
        ("cw", rng.normal(size=(2 * channels, channels, 2, 2)) * 0.05),
        ("cb", rng.normal(size=2 * channels)))]
    nodes = [helper.make_node("Mul", ["y", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["a"]),
             helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "lw", "lb"], ["ln"], axis=-1,
                              epsilon=1e-6),
             helper.make_node("Transpose", ["ln"], ["t2"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t2", "cw", "cb"], ["out"], kernel_shape=[2, 2],
                              strides=[2, 2])]
    shape = [batch, channels, size, size]
    graph = helper.make_graph(
        nodes, "convnext_downsample",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "y")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                       [batch, 2 * channels, size // 2, size // 2])], init)
    return import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("channels,size", [(96, 56), (192, 28), (384, 14)])
@pytest.mark.parametrize("batch", [1, 8, 32, 128, 256])
def test_convnext_layernorm_tail_is_parallel_at_every_batch(batch, channels, size):
    """convnext_tiny's three downsampling LayerNorms, at each batch."""
    assert heavy_serial(convnext_downsample(batch, channels, size)) == []


@pytest.mark.parametrize("name,batch", [("cnn", 128), ("resnet18", 32), ("mobilenet_v2", 32),
                                        ("bert_tiny", 32)])
def test_zoo_models_have_no_heavy_serial_stage(name, batch):
    options = {"resnet18": {"size": 32}, "mobilenet_v2": {"size": 32},
               "bert_tiny": {"seq": 16, "vocab": 512}}.get(name, {})
    assert heavy_serial(import_onnx(zoo.build(name, batch=batch, **options))) == []


def test_mixed_radix_digits():
    v = L.Var("v")
    # the fused counter's digits over 32 x 192 x 28 iterations (the cliff's stage)
    digits = (v // 28 // 192, v // 28 % 192, v % 28)
    assert mixed_radix(digits, v, 172032)
    assert loop_analysis.injective(digits, v, 172032)       # the slow check agrees
    assert mixed_radix((v // 28 % 192, v % 28), v, 28 * 192)
    # not injective: a digit missing, or the top one wrapping before the extent
    assert not mixed_radix((v // 28 // 192, v % 28), v, 172032)
    assert not mixed_radix((v // 28 % 192, v % 28), v, 28 * 192 + 1)
    assert not loop_analysis.injective((v // 28 % 192, v % 28), v, 28 * 192 + 1)
    # a divisor that does not divide the digit below: 6 does not divide 1 * 4
    assert not mixed_radix((v % 4, v // 6), v, 100)
    assert not loop_analysis.injective((v % 4, v // 6), v, 100)
    # a modulus then a division or a modulus (fusing three loops: [3, 224, 224] as one)
    assert mixed_radix((v // 50176, v % 50176 // 224, v % 50176 % 224), v, 150528)
    assert not mixed_radix((v // 50176, v % 50176 // 225, v % 50176 % 224), v, 150528)
    assert not mixed_radix((v // 50176, v % 50176 // 224, v % 50176 % 225), v, 150528)
    assert loop_analysis.injective((v // 12, v % 12 // 4, v % 12 % 4), v, 120)
    assert mixed_radix((v // 12, v % 12 // 4, v % 12 % 4), v, 120)
    # other forms are not claimed
    assert not mixed_radix((v * 2 % 7,), v, 7)


def test_mixed_radix_never_claims_what_evaluation_refutes():
    """Random digit sets (divisors and moduli from small factors, nested divisions, some
    without a modulus) over random extents: whenever `mixed_radix` says the digits are
    distinct, evaluating every value agrees (`injective`); it is a proof, never a guess."""
    rng = np.random.default_rng(0)
    v = L.Var("v")
    claimed = 0
    for _ in range(1000):
        digits = []
        for _ in range(rng.integers(1, 4)):
            e = v
            for _ in range(rng.integers(0, 3)):
                e = e // int(rng.choice([1, 2, 3, 4, 6, 7, 8]))
            if rng.random() < 0.7:
                e = e % int(rng.choice([2, 3, 4, 5, 6, 7, 8, 12]))
            # what fusing three loops leaves: a modulus then a division or another modulus
            for _ in range(rng.integers(0, 3)):
                op = "//" if rng.random() < 0.5 else "%"
                e = L.BinOp(op, e, L.const(int(rng.choice([2, 3, 4, 6, 12]))))
            digits.append(e)
        extent = int(rng.integers(1, 400))
        if mixed_radix(tuple(digits), v, extent):
            claimed += 1
            assert loop_analysis.injective(tuple(digits), v, extent), \
                [L.print_expr(d) for d in digits]
    assert claimed > 40   # (the generator reaches the claimed side often enough to test it)
