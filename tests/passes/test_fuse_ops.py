"""fuse_ops: which nodes group (anchor + elementwise epilogue, elementwise chains), what must
stay apart (a value read twice, a value needed outside), and the fused kernels' results."""

import numpy as np
import pytest

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


def test_conv_takes_its_elementwise_epilogue(rng):
    g = _conv_block(rng)
    assert _names(fusion_groups(g.nodes, set())) == [["conv", "relu", "residual", "relu6"]]


def test_a_value_read_outside_the_group_ends_it(rng):
    g = _conv_block(rng, residual_read_twice=True)
    needed = {id(v) for v in g.outputs}
    assert _names(fusion_groups(g.nodes, needed)) == [["conv"], ["relu", "residual", "relu6"]]


def test_the_shortcut_conv_takes_the_residual_add(rng):
    """Anchors are visited a generation at a time (Kahn's order): the shortcut's conv, which
    reads the block's input, comes before the main branch's second conv, though the graph
    lists it later, and takes the Add."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, 4, 8, 8)))

    def weight(name):
        return Value(name, T.TensorType(T.float32, (4, 4, 1, 1)),
                     const=rng.standard_normal((4, 4, 1, 1)).astype(np.float32))

    main = g.add("Conv", g.add("Relu", g.add("Conv", x, weight("w1"), name="conv1"),
                               name="relu1"), weight("w2"), name="conv2")
    shortcut = g.add("Conv", x, weight("w3"), name="shortcut")
    g.outputs = [g.add("Relu", g.add("Add", main, shortcut, name="add"), name="relu")]
    assert _names(fusion_groups(g.nodes, set())) == [
        ["conv1", "relu1"], ["conv2"], ["shortcut", "add", "relu"]]


def test_no_graph_library_is_imported():
    """The dataflow graph is a list of successors and `graphlib` orders it: networkx, once
    used for a topological sort only, is no dependency."""
    import subprocess
    import sys

    script = ("import sys, dnnc; from dnnc import zoo; "
              "dnnc.compile(zoo.build('cnn'), 'llvm', progress=False); "
              "print('networkx' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr


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


def test_fused_kernels_match_the_reference(rng):
    g = _conv_block(rng)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = dnnc.compile(g, target="numpy").run(x)[0]
    fused = dnnc.compile(g, target="llvm")
    assert fused.stats["kernels"] == 1
    np.testing.assert_allclose(fused.run(x)[0], want, rtol=1e-5, atol=1e-5)
    unfused = dnnc.compile(g, target="llvm", opt_level=1)
    assert unfused.stats["kernels"] == 4
    np.testing.assert_allclose(unfused.run(x)[0], want, rtol=1e-5, atol=1e-5)


def test_a_fused_cast_changes_the_stored_type_safely(rng):
    """MatMul (float32) + Cast(float16): the template's output has the group's type, and a
    reduction long enough to be split in k still sums in float32 before the one cast."""
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


# -- grouping by pattern (TVM's rules), with the order of groups valid --------------------------


def _const(name, array):
    array = np.asarray(array)
    return Value(name, T.TensorType(T.DType.from_numpy(array.dtype), array.shape), const=array)


def _groups(g, max_group=None, **options):
    """fusion_groups of g's nodes as names, checked to be a partition run in a valid order."""
    kwargs = {} if max_group is None else {"max_group": max_group}
    groups = fusion_groups(g.nodes, {id(v) for v in g.outputs}, **kwargs, **options)
    assert sorted(n.name for gr in groups for n in gr) == sorted(n.name for n in g.nodes)
    done = {id(v) for v in g.inputs}
    for group in groups:
        inside = {id(v) for n in group for v in n.outputs}
        for n in group:
            for v in n.inputs:
                assert v is None or v.const is not None or id(v) in done or id(v) in inside, \
                    f"{n.name} reads {v.name} before it is computed"
        done |= inside
    return _names(groups)


def _check_llvm(g, kernels, *arrays, rtol=1e-5, atol=1e-5):
    """The fused llvm build has `kernels` kernels and matches the numpy target."""
    want = dnnc.compile(g, target="numpy").run(*arrays)
    compiled = dnnc.compile(g, target="llvm")
    assert compiled.stats["kernels"] == kernels
    for got, ref in zip(compiled.run(*arrays), want):
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def test_injective_and_elementwise_ops_form_one_loop_nest(rng):
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (4, 6)))
    t = g.add("Transpose", x, perm=[1, 0], name="transpose")
    r = g.add("Reshape", t, _const("shape", np.array([2, 3, 4], np.int64)), name="reshape")
    y = g.add("Relu", r, name="relu")
    g.outputs = [g.add("Add", y, _const("b", np.ones(4, np.float32)), name="add")]
    assert _groups(g) == [["transpose", "reshape", "relu", "add"]]
    _check_llvm(g, 1, rng.standard_normal((4, 6)).astype(np.float32))


def test_a_reduction_takes_its_elementwise_producers(rng):
    """Add(mask) -> ReduceMax: the add is computed where the reduction reads it."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 8, 16)))
    m = g.add_input("m", T.TensorType(T.float32, (1, 1, 16)))
    s = g.add("Add", x, m, name="mask")
    g.outputs = [g.add("ReduceMax", s, _const("axes", np.array([-1], np.int64)), keepdims=1,
                       name="max")]
    assert _groups(g) == [["mask", "max"]]
    _check_llvm(g, 1, rng.standard_normal((2, 8, 16)).astype(np.float32),
                rng.standard_normal((1, 1, 16)).astype(np.float32))


def test_a_reduction_read_by_another_joins_it(rng):
    """mean -> (x - mean)^2 -> mean: the first mean is a scratch stage of the variance's
    kernel; a mean read outside (also a graph output) stays a group of its own."""
    for keep_mean in (False, True):
        g = Graph("g")
        x = g.add_input("x", T.TensorType(T.float32, (6, 50)))
        axes = _const("axes", np.array([1], np.int64))
        mu = g.add("ReduceMean", x, axes, keepdims=1, name="mean")
        d = g.add("Sub", x, mu, name="sub")
        var = g.add("ReduceMean", g.add("Mul", d, d, name="square"), axes, keepdims=0,
                    name="var")
        g.outputs = [var] + ([mu] if keep_mean else [])
        if keep_mean:
            assert _groups(g) == [["mean"], ["sub", "square", "var"]]
        else:
            assert _groups(g) == [["mean", "sub", "square", "var"]]
        _check_llvm(g, 2 if keep_mean else 1, rng.standard_normal((6, 50)).astype(np.float32))


def test_an_expensive_stage_is_not_recomputed_per_read():
    """Exp into a reduction (or under a broadcast) would be computed again for every read."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (8, 16)))
    e = g.add("Exp", x, name="exp")
    g.outputs = [g.add("ReduceSum", e, _const("axes", np.array([1], np.int64)), name="sum")]
    assert _groups(g) == [["exp"], ["sum"]]
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (16,)))
    y = g.add_input("y", T.TensorType(T.float32, (8, 16)))
    g.outputs = [g.add("Add", g.add("Exp", x, name="exp"), y, name="add")]
    assert _groups(g) == [["exp"], ["add"]]
    g = Graph("g")   # a cheap one is inlined under the broadcast
    x = g.add_input("x", T.TensorType(T.float32, (16,)))
    y = g.add_input("y", T.TensorType(T.float32, (8, 16)))
    g.outputs = [g.add("Add", g.add("Neg", x, name="neg"), y, name="add")]
    assert _groups(g) == [["neg", "add"]]


def test_opaque_ops_stay_alone():
    """CumSum is registered OPAQUE: it neither takes its producers nor joins an epilogue."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (2, 16)))
    m = g.add_input("m", T.TensorType(T.float32, (16,)))
    s = g.add("CumSum", g.add("Add", x, m, name="mask"), _const("axis", np.array(1, np.int64)),
              name="cumsum")
    g.outputs = [g.add("Relu", s, name="relu")]
    assert _groups(g) == [["mask"], ["cumsum"], ["relu"]]


@pytest.mark.parametrize("op", ["Softmax", "LayerNormalization"])
def test_softmax_and_layer_norm_take_their_producers(rng, op):
    """Softmax and LayerNormalization are reductions: the mask or residual Add (and a
    Gather feeding it, as BERT's embeddings) is computed where they read it."""
    g = Graph("g")
    table = _const("table", rng.standard_normal((10, 16)).astype(np.float32))
    ids = g.add_input("ids", T.TensorType(T.int64, (2, 5)))
    m = g.add_input("m", T.TensorType(T.float32, (16,)))
    e = g.add("Gather", table, ids, name="gather")
    a = g.add("Add", e, m, name="add")
    extra = [_const("gamma", rng.standard_normal(16).astype(np.float32))] \
        if op == "LayerNormalization" else []
    g.outputs = [g.add(op, a, *extra, axis=-1, name="norm")]
    assert _groups(g) == [["gather", "add", "norm"]]
    _check_llvm(g, 1, rng.integers(0, 10, (2, 5)), rng.standard_normal(16).astype(np.float32))


def _dense_graph(rng, tail, m=24, k=40, n=32):
    """x @ W + b, then `tail(graph, value)`: an anchor, its epilogue and maybe a layout tail."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (1, m, k)))
    w = _const("w", rng.standard_normal((k, n)).astype(np.float32))
    y = g.add("MatMul", x, w, name="matmul")
    y = g.add("Add", y, _const("bias", rng.standard_normal(n).astype(np.float32)), name="bias")
    g.outputs = [tail(g, y)]
    return g, rng.standard_normal((1, m, k)).astype(np.float32)


def _heads(perm, heads=2, size=16):
    def tail(g, y):
        r = g.add("Reshape", y, _const("split", np.array([0, 0, heads, size], np.int64)),
                  name="reshape")
        return g.add("Transpose", r, perm=perm, name="transpose")
    return tail


@pytest.mark.parametrize("heads,size", [(2, 16), (2, 64), (3, 40)])
def test_a_matmul_stores_through_its_layout_tail(rng, heads, size):
    """BERT's Q/K/V: MatMul, bias, Reshape to heads, Transpose: one kernel, the dense template
    writing each element where the transposed layout wants it (heads of 64 columns hold
    whole panels, stored a vector at a time; 16 and 40 split panels)."""
    for perm in ([0, 2, 1, 3], [0, 2, 3, 1]):
        g, x = _dense_graph(rng, _heads(perm, heads, size), n=heads * size)
        remaps = {"MatMul": frozenset({"Reshape", "Transpose"})}
        assert _groups(g, store_remaps=remaps) == [["matmul", "bias", "reshape", "transpose"]]
        assert _groups(g) == [["matmul", "bias"], ["reshape", "transpose"]]   # no remaps given
        _check_llvm(g, 1, x, rtol=1e-4, atol=1e-4)


def test_a_layout_tail_after_a_batched_matmul(rng):
    """BERT's context: batched MatMul, Transpose back, Reshape to [1, seq, hidden]."""
    g = Graph("g")
    p = g.add_input("p", T.TensorType(T.float32, (1, 2, 24, 24)))
    v = g.add_input("v", T.TensorType(T.float32, (1, 2, 24, 16)))
    c = g.add("MatMul", p, v, name="context")
    t = g.add("Transpose", c, perm=[0, 2, 1, 3], name="transpose")
    g.outputs = [g.add("Reshape", t, _const("merge", np.array([0, 0, 32], np.int64)),
                       name="reshape")]
    assert _groups(g, store_remaps={"MatMul": frozenset({"Reshape", "Transpose"})}) == \
        [["context", "transpose", "reshape"]]
    _check_llvm(g, 1, rng.standard_normal((1, 2, 24, 24)).astype(np.float32),
                rng.standard_normal((1, 2, 24, 16)).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_an_epilogue_may_read_a_value_twice_inside_the_group(rng):
    """GELU as exporters write it reads h twice (Div and Mul); both reads are inside the
    group, so h never leaves the registers."""

    def gelu(g, h):
        e = g.add("Erf", g.add("Div", h, _const("sqrt2", np.float32(2 ** 0.5)), name="div"),
                  name="erf")
        one = g.add("Add", e, _const("one", np.float32(1)), name="add1")
        return g.add("Mul", g.add("Mul", h, one, name="mul"), _const("half", np.float32(0.5)),
                     name="half")

    g, x = _dense_graph(rng, gelu)
    assert _groups(g) == [["matmul", "bias", "div", "erf", "add1", "mul", "half"]]
    want = dnnc.compile(g, target="numpy").run(x)[0]
    compiled = dnnc.compile(g, target="llvm", opt_level=2)   # before any Gelu rewrite
    assert compiled.stats["kernels"] == 1
    np.testing.assert_allclose(compiled.run(x)[0], want, rtol=1e-4, atol=1e-4)


def test_a_matmul_read_by_two_groups_is_computed_once(rng):
    g, x = _dense_graph(rng, lambda g, y: g.add("Relu", y, name="relu"))
    mm = g.outputs[0].producer.inputs[0]   # the bias add's value, read by relu and neg too
    g.outputs = g.outputs + [g.add("Neg", mm, name="neg")]
    assert _groups(g) == [["matmul", "bias"], ["relu"], ["neg"]]
    _check_llvm(g, 3, x, rtol=1e-4, atol=1e-4)


def test_no_group_makes_the_order_cyclic(rng):
    """m -> relu -> matmul2 -> add <- relu: adding `add` to m's group would need matmul2
    both after and before that group."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (8, 8)))
    w1 = _const("w1", rng.standard_normal((8, 8)).astype(np.float32))
    w2 = _const("w2", rng.standard_normal((8, 8)).astype(np.float32))
    r = g.add("Relu", g.add("MatMul", x, w1, name="m1"), name="relu")
    z = g.add("MatMul", r, w2, name="m2")
    g.outputs = [g.add("Add", r, z, name="add")]
    assert _groups(g) == [["m1", "relu"], ["m2", "add"]]
    _check_llvm(g, 2, rng.standard_normal((8, 8)).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_max_group_bounds_a_chain():
    g = Graph("g")
    y = g.add_input("x", T.TensorType(T.float32, (5,)))
    for k in range(10):
        y = g.add("Neg", y, name=f"n{k}")
    g.outputs = [y]
    groups = _groups(g, max_group=4)
    assert max(len(gr) for gr in groups) == 4 and len(groups) == 3


def _embedding_sum(slice_after: bool):
    """BERT's embeddings: two table lookups added, then a row reduction; with `slice_after`,
    the token-type lookup is sliced before it is added."""
    rng = np.random.default_rng(3)
    g = Graph("g")
    ids = g.add_input("ids", T.TensorType(T.int64, (1, 8)))
    types = g.add_input("types", T.TensorType(T.int64, (1, 8)))
    word = _const("word", rng.standard_normal((30, 4)).astype(np.float32))
    kind = _const("kind", rng.standard_normal((2, 4)).astype(np.float32))
    w = g.add("Gather", word, ids, axis=0, name="word_lookup")
    t = g.add("Gather", kind, types, axis=0, name="type_lookup")
    if slice_after:
        t = g.add("Slice", t, _const("s0", np.array([0], np.int64)),
                  _const("s1", np.array([8], np.int64)), _const("s2", np.array([2], np.int64)),
                  name="cut")
        w = g.add("Slice", w, _const("w0", np.array([0], np.int64)),
                  _const("w1", np.array([8], np.int64)), _const("w2", np.array([2], np.int64)),
                  name="cut_word")
    s = g.add("Add", w, t, name="sum")
    g.outputs = [g.add("ReduceSum", s, _const("axes", np.array([-1], np.int64)), keepdims=1,
                       name="total")]
    return g


def test_a_gather_is_inlined_only_where_every_element_is_read():
    """A fused gather checks the indices of the elements computed (issue 30, item 3): into a
    consumer that reads all of it (an add, a reduction, another lookup's sum) it is inlined;
    a Slice that may skip rows reads its stored output instead."""
    assert _groups(_embedding_sum(False)) == [["word_lookup", "type_lookup", "sum", "total"]]
    groups = _groups(_embedding_sum(True))
    assert ["type_lookup"] in groups and ["word_lookup"] in groups
