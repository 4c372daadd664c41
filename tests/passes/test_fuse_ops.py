"""fuse_ops: which nodes group (anchor + elementwise epilogue, elementwise chains), what must
stay apart (a value read twice, a value needed outside), and the fused kernels' results."""

import numpy as np

import dnnc
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.passes.fuse_ops import fusion_groups


def _conv_block(rng, residual_read_twice=False):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 4, 8, 8)))
    w = Value("w", T.TensorType(T.float32, (4, 4, 3, 3)),
              const=(rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32))
    b = Value("b", T.TensorType(T.float32, (4,)), const=rng.standard_normal(4).astype(np.float32))
    y = g.add("Conv", x, w, b, pads=[1, 1, 1, 1], name="conv")
    r = g.add("Relu", y, name="relu")
    s = g.add("Add", r, x, name="residual")
    out = g.add("Clip", s, Value("lo", T.TensorType(T.float32, ()),
                                 const=np.array(0, np.float32)),
                Value("hi", T.TensorType(T.float32, ()), const=np.array(6, np.float32)),
                name="relu6")
    g.outputs = [out] + ([y] if residual_read_twice else [])
    return g


def _names(groups):
    return [[n.name for n in group] for group in groups]


def test_conv_takes_its_elementwise_epilogue():
    g = _conv_block(np.random.default_rng())
    assert _names(fusion_groups(g.nodes, set())) == [["conv", "relu", "residual", "relu6"]]


def test_a_value_read_outside_the_group_ends_it():
    g = _conv_block(np.random.default_rng(), residual_read_twice=True)
    needed = {id(v) for v in g.outputs}
    assert _names(fusion_groups(g.nodes, needed)) == [["conv"], ["relu", "residual", "relu6"]]


def test_a_value_with_two_readers_is_not_fused_into_either():
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (3, 5)))
    e = g.add("Exp", x, name="exp")
    a = g.add("Relu", e, name="relu")
    b = g.add("Neg", e, name="neg")
    g.outputs = [g.add("Add", a, b, name="add")]
    groups = _names(fusion_groups(g.nodes, set()))
    assert ["exp"] in groups                      # exp is read twice: computed once, alone
    assert sum(len(gr) for gr in groups) == 4


def test_fused_kernels_match_the_reference():
    rng = np.random.default_rng()
    g = _conv_block(rng)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = dnnc.compile(g, target="numpy").run(x)[0]
    fused = dnnc.compile(g, target="llvm")
    assert fused.stats["kernels"] == 1
    np.testing.assert_allclose(fused.run(x)[0], want, rtol=1e-5, atol=1e-5)
    unfused = dnnc.compile(g, target="llvm", opt_level=1)
    assert unfused.stats["kernels"] == 4
    np.testing.assert_allclose(unfused.run(x)[0], want, rtol=1e-5, atol=1e-5)


def test_a_fused_cast_changes_the_stored_type_safely():
    """MatMul (float32) + Cast(float16): the template's output has the group's type, and a
    reduction long enough to be split in k still sums in float32 before the one cast."""
    rng = np.random.default_rng()
    g = Graph("g")
    a = g.add_input("a", T.TensorType(T.float32, (2, 7, 600)))
    b = Value("b", T.TensorType(T.float32, (600, 20)),
              const=rng.standard_normal((600, 20)).astype(np.float32))
    g.outputs = [g.add("Cast", g.add("MatMul", a, b), to=T.float16)]
    x = rng.standard_normal((2, 7, 600)).astype(np.float32)
    want = dnnc.compile(g, target="numpy").run(x)[0]
    compiled = dnnc.compile(g, target="llvm")
    assert compiled.stats["kernels"] == 1
    got = compiled.run(x)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3,
                               atol=2e-2)
