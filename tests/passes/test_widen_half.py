"""widen_half: on a target whose kernels do not compute in a half type (`Target.half_arithmetic`
leaves it out: llvm), a model's float16 / bfloat16 values are computed in float32: constants
converted at compile time, Casts only at the graph's edges (its declared input and output
types kept), attributes naming the type widened; a target computing in the type (cuda, numpy)
keeps the graph as it is; integer values are untouched."""

import numpy as np

from dnnc.backends.registry import REGISTRY
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.ir.interpreter import run_graph
from dnnc.ir.target import Target
from dnnc.passes.manager import optimize
from dnnc.passes.widen_half import widen_half, widened_types

F32, F16, BF16 = T.float32, T.float16, T.bfloat16
NO_HALF = Target("llvm", half_arithmetic=())


def _const(name, array) -> Value:
    array = np.asarray(array)
    return Value(name, T.TensorType(T.DType.from_numpy(array.dtype), array.shape), const=array)


def half_dense(half: T.DType = F16) -> Graph:
    """A float16 file's dense layer: x (half) -> Gemm(w, b) -> Relu -> y (half), a Cast to the
    half type of an integer Shape (as a float16 file computes a size), a ConstantOfShape
    of a half value, and an integer side output."""
    g = Graph("dense")
    x = g.add_input("x", T.TensorType(half, (4, 8)))
    w = _const("w", np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8).astype(half.np))
    b = _const("b", np.full(6, 0.1, half.np))
    h = g.add("Relu", g.add("Gemm", x, w, b, name="fc", transB=1), name="relu")
    shape = g.add("Shape", h, name="shape")
    size = g.add("Cast", shape, name="size", to=half)
    ones = g.add("ConstantOfShape", shape, name="ones", value=np.ones(1, half.np))
    y = g.add("Mul", g.add("Add", h, ones, name="plus"), g.add("ReduceMax", size, keepdims=0,
                                                               name="top"), name="y")
    g.outputs = [y, shape]
    return g


def test_a_half_model_computes_in_float32_with_casts_at_its_edges_only():
    g = widen_half(half_dense(), NO_HALF)
    g.verify()
    assert str(g) == """\
graph dense(%x: float16[4,8]) {
  const %w: float32[6,8]
  const %b: float32[6]
  %x.float32.0: float32[4,8] = Cast(%x) {to=float32}
  %fc: float32[4,6] = Gemm(%x.float32.0, %w, %b) {alpha=1.0, beta=1.0, transA=0, transB=1}
  %relu: float32[4,6] = Relu(%fc)
  %shape: int64[2] = Shape(%relu) {end=None, start=0}
  %size: float32[2] = Cast(%shape) {to=float32}
  %ones: float32[4,6] = ConstantOfShape(%shape) {value=tensor(float32, [1.0])}
  %plus: float32[4,6] = Add(%relu, %ones)
  %top: float32[] = ReduceMax(%size) {keepdims=0, noop_with_empty_axes=0}
  %y.1: float32[4,6] = Mul(%plus, %top)
  %y: float16[4,6] = Cast(%y.1) {to=float16}
  return %y, %shape
}"""


def test_the_widened_graph_is_the_half_model_computed_in_float32(rng):
    for half in (F16, BF16):
        x = rng.standard_normal((4, 8)).astype(half.np)
        want = run_graph(half_dense(half), [x])
        got = run_graph(widen_half(half_dense(half), NO_HALF), [x])
        assert [a.dtype for a in got] == [half.np, np.int64]
        np.testing.assert_array_equal(got[1], want[1])
        # one rounding to the half type at the output (the reference rounds every step)
        unit = 2.0 ** -11 if half is F16 else 2.0 ** -8
        scale = np.abs(want[0].astype(np.float32)).max()
        assert np.abs(got[0].astype(np.float32) - want[0].astype(np.float32)).max() <= \
            8 * unit * scale


def test_interior_casts_to_the_half_type_go_and_a_float32_model_is_unchanged():
    # keep_io_types=True: float32 at the edges, Casts to float16 after the input and back
    # before the output; widened, both are float32 to float32: dropped
    g = Graph("io")
    x = g.add_input("x", T.TensorType(F32, (3,)))
    h = g.add("Cast", x, name="in", to=F16)
    r = g.add("Relu", g.add("Mul", h, _const("two", np.full(3, 2, np.float16)), name="mul"),
              name="relu")
    g.outputs = [g.add("Cast", r, name="out", to=F32)]
    widen_half(g, NO_HALF)
    assert [n.op for n in g.nodes] == ["Mul", "Relu"]
    assert g.outputs[0].name == "out" and g.outputs[0].dtype is F32
    assert all(v.dtype is F32 for n in g.nodes for v in n.inputs + n.outputs)
    plain = Graph("f32")
    y = plain.add_input("y", T.TensorType(F32, (3,)))
    plain.outputs = [plain.add("Relu", y, name="r")]
    before = str(plain)
    assert str(widen_half(plain, NO_HALF)) == before


def test_a_target_computing_in_the_half_type_keeps_the_graph():
    before = str(half_dense())
    for target in (Target("cuda", arch="sm_90"), Target("numpy"),
                   Target("llvm", half_arithmetic=("float16",))):
        assert str(widen_half(half_dense(), target)) == before
    # bfloat16 still widened where only float16 is computed natively
    g = widen_half(half_dense(BF16), Target("llvm", half_arithmetic=("float16",)))
    assert [n.op for n in g.nodes if BF16 in {v.dtype for v in n.inputs + n.outputs}] == \
        ["Cast", "Cast"]   # (the input's and the output's)


def test_the_targets_say_which_half_types_they_compute_in():
    assert widened_types(REGISTRY["llvm"].target()) == {F16, BF16}
    assert widened_types(REGISTRY["cuda"].target(cpu=Target("cuda", arch="sm_90"))) == set()
    assert widened_types(REGISTRY["numpy"].target()) == set()


def test_the_pipeline_widens_on_llvm():
    g = optimize(half_dense(), REGISTRY["llvm"].target(), opt_level=1)
    inner = [v for n in g.nodes if n.op != "Cast" for v in n.inputs + n.outputs]
    assert all(v.dtype in (F32, T.int64) for v in inner)
    assert [v.dtype for v in g.inputs] == [F16] and g.outputs[0].dtype is F16
