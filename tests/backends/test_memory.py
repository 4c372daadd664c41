"""Memory planning (`backends.memory.plan_memory`): hand-built kernel orders (reuse,
alignment, in-place where legal and never over a value still needed), random orders checked
for overlaps, and whole models compiled with the planner against the numpy reference."""

import re

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value
from dnnc.backends.memory import ALIGN, Step, _best_fit, _Block, aligned, plan_memory


def lifetimes(steps, external=()):
    """value -> (first step, last step), as the planner defines liveness."""
    span = {}
    for k, step in enumerate(steps):
        for v in step.writes:
            if v not in external:
                span[v] = (k, k)
        for v in step.reads:
            if v not in external:
                span[v] = (span[v][0], k)
    return span


def assert_valid(plan, steps, sizes, external=()):
    """Every planned value is aligned, inside the arena, and overlaps no value live at the same
    time, except the input an in-place step overwrites."""
    span = lifetimes(steps, external)
    assert set(plan.offsets) == set(span)
    shared = {frozenset(p) for p in plan.inplace.items()}
    for v, off in plan.offsets.items():
        assert off % ALIGN == 0
        assert off + aligned(sizes[v]) <= plan.arena_bytes
    items = list(plan.offsets.items())
    for i, (a, oa) in enumerate(items):
        for b, ob in items[i + 1:]:
            (sa, ea), (sb, eb) = span[a], span[b]
            if sa <= eb and sb <= ea and frozenset((a, b)) not in shared:
                assert oa + aligned(sizes[a]) <= ob or ob + aligned(sizes[b]) <= oa, \
                    f"{a} and {b} are live together and overlap"


def chain(n, size=1000):
    """x -> v0 -> v1 -> ... -> v{n-1} -> y, one step each."""
    names = ["x"] + [f"v{k}" for k in range(n)] + ["y"]
    steps = [Step([a], [b]) for a, b in zip(names, names[1:])]
    return steps, {v: size for v in names}, {"x", "y"}


def test_a_chain_reuses_two_blocks():
    steps, sizes, external = chain(6)
    plan = plan_memory(steps, sizes, external)
    assert_valid(plan, steps, sizes, external)
    block = aligned(1000)
    assert plan.naive_bytes == 6 * block
    assert plan.live_lower_bound_bytes == 2 * block
    assert plan.arena_bytes == 2 * block
    assert plan.offsets["v0"] == plan.offsets["v2"] == plan.offsets["v4"]
    assert plan.inplace == {}


def test_offsets_and_sizes_are_aligned():
    steps = [Step(["x"], ["a"]), Step(["a"], ["b"]), Step(["a", "b"], ["c"]),
             Step(["c", "a"], ["y"])]
    sizes = {"x": 4, "a": 1, "b": 100, "c": 65, "y": 4}
    plan = plan_memory(steps, sizes, {"x", "y"})
    assert_valid(plan, steps, sizes, {"x", "y"})
    assert all(off % 64 == 0 for off in plan.offsets.values())
    assert plan.naive_bytes == 64 + 128 + 128
    # a, b and c are live together at step 2
    assert plan.live_lower_bound_bytes == 64 + 128 + 128
    assert plan.arena_bytes == 320
    assert aligned(0) == 64 and aligned(64) == 64 and aligned(65) == 128


def test_freed_blocks_are_reused_by_a_smaller_value():
    # big dies after step 1; small (written at step 2) fits in its block
    steps = [Step(["x"], ["big"]), Step(["big"], ["mid"]), Step(["mid"], ["small"]),
             Step(["small", "mid"], ["y"])]
    sizes = {"x": 8, "big": 4096, "mid": 1024, "small": 512, "y": 8}
    plan = plan_memory(steps, sizes, {"x", "y"})
    assert_valid(plan, steps, sizes, {"x", "y"})
    assert plan.arena_bytes == 4096 + 1024 == plan.live_lower_bound_bytes
    assert plan.offsets["big"] <= plan.offsets["small"] < plan.offsets["big"] + 4096


def test_best_fit_coalesces_adjacent_free_blocks():
    # a and b (64 each) die at step 1; c (128) needs both blocks merged to fit below the top
    a, b, c = _Block(64, 0, 1, ["a"]), _Block(64, 0, 1, ["b"]), _Block(128, 2, 2, ["c"])
    d = _Block(64, 0, 2, ["d"])   # keeps the top of the arena busy
    offsets, top = _best_fit([d, a, b, c], 3)
    assert top == 192
    assert offsets[id(c)] in (offsets[id(a)], offsets[id(b)])
    assert {offsets[id(a)], offsets[id(b)]} == {offsets[id(c)], offsets[id(c)] + 64}


def test_in_place_is_taken_where_the_input_dies_at_the_step():
    steps = [Step(["x"], ["h"]), Step(["h"], ["r"], inplace=("h",)),
             Step(["r"], ["e"], inplace=("r",)), Step(["e"], ["y"])]
    sizes = {v: 4096 for v in ("x", "h", "r", "e", "y")}
    plan = plan_memory(steps, sizes, {"x", "y"})
    assert_valid(plan, steps, sizes, {"x", "y"})
    assert plan.inplace == {"r": "h", "e": "r"}
    assert plan.offsets["h"] == plan.offsets["r"] == plan.offsets["e"]
    assert plan.arena_bytes == 4096 < plan.live_lower_bound_bytes == 8192


def test_no_in_place_write_over_a_value_still_needed():
    # r = relu(h) could overwrite h, but h is read again by the last step
    steps = [Step(["x"], ["h"]), Step(["h"], ["r"], inplace=("h",)),
             Step(["r", "h"], ["s"], inplace=("r", "h")), Step(["s"], ["y"])]
    sizes = {v: 4096 for v in ("x", "h", "r", "s", "y")}
    plan = plan_memory(steps, sizes, {"x", "y"})
    assert_valid(plan, steps, sizes, {"x", "y"})
    assert "r" not in plan.inplace
    assert plan.offsets["r"] != plan.offsets["h"]
    # at the last step both die: s takes the first candidate, r
    assert plan.inplace == {"s": "r"}


@pytest.mark.parametrize("case", ["external", "size", "two writes", "not named", "no reuse"])
def test_in_place_refused(case):
    sizes = {v: 256 for v in ("x", "h", "r", "q", "y")}
    external = {"x", "y"}
    reuse = True
    if case == "external":    # never write over a model input
        steps = [Step(["x"], ["r"], inplace=("x",)), Step(["r"], ["y"])]
    elif case == "size":
        sizes["r"] = 512
        steps = [Step(["x"], ["h"]), Step(["h"], ["r"], inplace=("h",)), Step(["r"], ["y"])]
    elif case == "two writes":  # a multi-output kernel stores in several loop nests
        steps = [Step(["x"], ["h"]), Step(["h"], ["r", "q"], inplace=("h",)),
                 Step(["r", "q"], ["y"])]
    elif case == "not named":  # the step is not elementwise in that input
        steps = [Step(["x"], ["h"]), Step(["h"], ["r"]), Step(["r"], ["y"])]
    else:
        reuse = False
        steps = [Step(["x"], ["h"]), Step(["h"], ["r"], inplace=("h",)), Step(["r"], ["y"])]
    plan = plan_memory(steps, sizes, external, reuse=reuse)
    assert_valid(plan, steps, sizes, external)
    assert plan.inplace == {}


def test_without_reuse_every_value_has_its_own_block():
    steps, sizes, external = chain(5)
    plan = plan_memory(steps, sizes, external, reuse=False)
    assert plan.arena_bytes == plan.naive_bytes == 5 * aligned(1000)
    assert len(set(plan.offsets.values())) == 5


def test_a_value_read_before_it_is_written_is_an_error():
    with pytest.raises(ValueError, match="no earlier step writes"):
        plan_memory([Step(["ghost"], ["a"]), Step(["a"], ["y"])], {"ghost": 4, "a": 4, "y": 4},
                    {"y"})


def test_a_value_never_read_is_live_during_its_step_only():
    steps = [Step(["x"], ["a", "unused"]), Step(["a"], ["b"]), Step(["b"], ["y"])]
    sizes = {"x": 64, "a": 64, "unused": 640, "b": 640, "y": 64}
    plan = plan_memory(steps, sizes, {"x", "y"})
    assert_valid(plan, steps, sizes, {"x", "y"})
    assert plan.live_lower_bound_bytes == 704 == plan.arena_bytes


@pytest.mark.parametrize("seed", [3, 17, 29, 101])
def test_random_kernel_orders_never_overlap_live_values(seed):
    rng = np.random.default_rng(seed)
    values = ["x"]
    steps, sizes = [], {"x": 100}
    for k in range(60):
        reads = list(rng.choice(values[-6:], size=min(len(values), int(rng.integers(1, 4))),
                                replace=False))
        out = f"v{k}"
        sizes[out] = int(rng.choice([64, 100, 1000, 4096, 70000]))
        same = tuple(v for v in reads if sizes[v] == sizes[out])
        steps.append(Step(reads, [out], inplace=same if rng.random() < 0.5 else ()))
        values.append(out)
    steps.append(Step([values[-1]], ["y"]))
    sizes["y"] = 4
    plan = plan_memory(steps, sizes, {"x", "y"})
    assert_valid(plan, steps, sizes, {"x", "y"})
    assert plan.arena_bytes <= plan.naive_bytes
    plain = plan_memory([Step(s.reads, s.writes) for s in steps], sizes, {"x", "y"})
    assert_valid(plain, steps, sizes, {"x", "y"})
    assert plain.live_lower_bound_bytes <= plain.arena_bytes <= \
        1.15 * plain.live_lower_bound_bytes


# -- the llvm backend with the planner -----------------------------------------------------------


def _elementwise_graph():
    """h = x @ w; r = Relu(h) (h dies: in place); s = Sigmoid(r); t = s * r (r read again,
    so Sigmoid may not overwrite it; Mul is its last reader); out = t @ w2."""
    rng = np.random.default_rng(7)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (16, 32)))
    w = Value("w", T.TensorType(T.float32, (32, 32)),
              const=rng.standard_normal((32, 32)).astype(np.float32) / 6)
    w2 = Value("w2", T.TensorType(T.float32, (32, 8)),
               const=rng.standard_normal((32, 8)).astype(np.float32) / 6)
    h = g.add("MatMul", x, w, name="h")
    r = g.add("Relu", h, name="r")
    s = g.add("Sigmoid", r, name="s")
    t = g.add("Mul", s, r, name="t")
    g.outputs = [g.add("MatMul", t, w2, name="out")]
    return g


def test_in_place_kernels_run_correctly_reading_their_input_through_the_output():
    # opt level 1: no fusion, so each elementwise node is a kernel of its own
    g = _elementwise_graph()
    x = np.random.default_rng(11).standard_normal((16, 32)).astype(np.float32)
    ref = dnnc.compile(g, target="numpy").run(x)[0]
    model = dnnc.compile(g, target="llvm", opt_level=1, progress=False)
    np.testing.assert_allclose(model.run(x)[0], ref, rtol=1e-5, atol=1e-5)
    (seg,) = model.runtime.compiled_segments()
    by_op = {}
    for k in seg.kernels:
        by_op.setdefault(k.nodes[0].op, k)   # the first MatMul: h
    inplace = seg.memory.inplace
    assert inplace[id(by_op["Relu"].outputs[0])] == id(by_op["MatMul"].outputs[0])
    assert id(by_op["Sigmoid"].outputs[0]) not in inplace    # r is read again by Mul
    assert inplace[id(by_op["Mul"].outputs[0])] == id(by_op["Sigmoid"].outputs[0])
    offsets = seg.memory.offsets
    assert offsets[id(by_op["Sigmoid"].outputs[0])] != offsets[id(by_op["Relu"].outputs[0])]
    assert model.stats["inplace_kernels"] == 2
    ir = model.source("llvm-ir")
    for op, aliased in (("Relu", True), ("Sigmoid", False), ("Mul", True), ("MatMul", False)):
        name = by_op[op].func.name
        define = re.search(rf"define [^\n]*@{name}\(([^)]*)\)", ir)
        assert define is not None, name
        # llvm's in_place.alias_free: the input written over is read through the output
        # (readnone), so every buffer stays noalias
        params = define.group(1)
        assert params.count("ptr") == params.count("noalias"), (op, define.group(0))
        assert ("readnone" in params) == aliased, (op, define.group(0))
    # the same x twice: the arena is reused across calls without stale values mattering
    np.testing.assert_allclose(model.run(x)[0], ref, rtol=1e-5, atol=1e-5)


def test_identical_kernels_differing_in_aliasing_are_rendered_twice():
    # two Relu kernels of the same shape: the first writes in place (its input dies), the
    # second must not (its input is read again), so they cannot share one function
    rng = np.random.default_rng(5)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (8, 16)))
    w = Value("w", T.TensorType(T.float32, (16, 16)),
              const=rng.standard_normal((16, 16)).astype(np.float32) / 4)
    a = g.add("MatMul", x, w, name="a")
    ra = g.add("Relu", a, name="ra")          # a dies here: in place
    b = g.add("MatMul", ra, w, name="b")
    rb = g.add("Relu", b, name="rb")          # b is read again below: not in place
    g.outputs = [g.add("MatMul", g.add("Sub", rb, b, name="d"), w, name="out")]
    xs = rng.standard_normal((8, 16)).astype(np.float32)
    ref = dnnc.compile(g, target="numpy").run(xs)[0]
    model = dnnc.compile(g, target="llvm", opt_level=1, progress=False)
    np.testing.assert_allclose(model.run(xs)[0], ref, rtol=1e-5, atol=1e-5)
    (seg,) = model.runtime.compiled_segments()
    relus = [k for k in seg.kernels if k.nodes[0].op == "Relu"]
    assert [id(k.outputs[0]) in seg.memory.inplace for k in relus] == [True, False]
    assert relus[0].func.name != relus[1].func.name
    # two MatMuls of the same shape (a, b) are still deduplicated
    matmuls = [k for k in seg.kernels if k.nodes[0].op == "MatMul"][:2]
    assert matmuls[0].func.name == matmuls[1].func.name


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("opt_level", [0, 1, 3])
def test_zoo_models_match_numpy(name, opt_level):
    model = zoo.build(name, batch=2)
    inputs = zoo.inputs_for(model, np.random.default_rng(1000 + opt_level))
    ref = dnnc.compile(model, target="numpy").run(*inputs.values())
    compiled = dnnc.compile(model, target="llvm", opt_level=opt_level, progress=False)
    for out, expected in zip(compiled.run(*inputs.values()), ref):
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    stats = compiled.stats
    assert stats["live_lower_bound_bytes"] <= stats["naive_bytes"]
    values = stats["arena_bytes"] - stats["workspace_bytes"]   # kernels' workspace past them
    if opt_level == 0:   # no plan_memory: every intermediate in a block of its own
        assert values == stats["naive_bytes"]
    else:
        assert values <= 1.15 * stats["live_lower_bound_bytes"]
        assert values < stats["naive_bytes"] or name == "mlp"


def test_views_place_parts_inside_their_whole_and_keep_it_live():
    """A concat done in place: parts a and b live inside w (written by no step) at their
    offsets; w's block lives from a's write to w's last read, so c (written while w is live)
    lies outside it, and neither a part nor w is shared in place."""
    steps = [Step(["x"], ["a"]), Step(["x"], ["b"]), Step(["a"], ["c"], ("a",)),
             Step(["w", "c"], ["y"], ("w",))]
    sizes = {"x": 256, "a": 128, "b": 192, "c": 128, "w": 320, "y": 320}
    plan = plan_memory(steps, sizes, external={"x", "y"}, views={"a": ("w", 0),
                                                                  "b": ("w", 128)})
    off = plan.offsets
    assert off["a"] == off["w"] and off["b"] == off["w"] + 128
    assert not (off["w"] < off["c"] + 128 and off["c"] < off["w"] + aligned(320))
    assert plan.inplace == {}


def test_views_of_views_resolve_to_the_outermost_whole():
    steps = [Step(["x"], ["a"]), Step(["a"], ["b"]), Step(["v"], ["c"]), Step(["w"], ["y"])]
    sizes = {"x": 64, "a": 64, "b": 64, "v": 128, "c": 64, "w": 192, "y": 192}
    plan = plan_memory(steps, sizes, external={"x", "y"},
                       views={"a": ("v", 0), "b": ("v", 64), "v": ("w", 0), "c": ("w", 128)})
    off = plan.offsets
    assert (off["a"], off["b"], off["v"], off["c"]) == (off["w"], off["w"] + 64, off["w"],
                                                         off["w"] + 128)


def _concat_graph(batch, c=16, h=4, w=4):
    """Two branches concatenated, the result concatenated again with a branch of itself
    (densenet's growth: a view of a view); a part read again after the concat (its block must
    outlive the concat's) by an elementwise node that would otherwise write over it in place;
    a part shared by two concats (only one can hold it)."""
    rng = np.random.default_rng(5)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (batch, c, h, w)))

    def conv(v, cin, cout, name):
        wv = Value(f"{name}_w", T.TensorType(T.float32, (cout, cin, 3, 3)),
                   const=(rng.standard_normal((cout, cin, 3, 3)) * 0.2).astype(np.float32))
        return g.add("Relu", g.add("Conv", v, wv, pads=[1, 1, 1, 1], name=name))

    a = conv(x, c, 16, "a")
    b = conv(x, c, 32, "b")
    ab = g.add("Concat", a, b, axis=1, name="ab")
    d = conv(ab, 48, 16, "d")
    abd = g.add("Concat", ab, d, axis=1, name="abd")
    e = g.add("Concat", b, d, axis=1, name="bd")                  # b and d are taken
    late = g.add("Sigmoid", g.add("Neg", a))                      # a read after the concats
    axes = Value("axes", T.TensorType(T.int64, (3,)), const=np.array([1, 2, 3]))
    s = g.add("ReduceSum", abd, axes, keepdims=0)
    t = g.add("ReduceSum", e, axes, keepdims=0)
    u = g.add("ReduceSum", late, axes, keepdims=0)
    g.outputs = [g.add("Add", g.add("Add", s, t), u), abd]
    return g


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("opt_level", [1, 3])
def test_concats_are_done_in_place_where_their_parts_are_contiguous(batch, opt_level):
    g = _concat_graph(batch)
    x = np.random.default_rng(6).standard_normal((batch, 16, 4, 4)).astype(np.float32)
    want = dnnc.compile(g, target="numpy").run(x)
    model = dnnc.compile(g, target="llvm", opt_level=opt_level, progress=False)
    for _ in range(2):   # the arena reused across calls
        for got, ref in zip(model.run(x), want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    (seg,) = model.runtime.compiled_segments()
    concats = [k.nodes[0].name for k in seg.kernels if k.nodes[0].op == "Concat"]
    # batch 1: "ab" in place (a and b written into it, ab itself a view of abd's output,
    # which escapes: the model's output, so "abd" copies); "bd" copies (b is taken);
    # batch 2: no concat's parts are contiguous
    assert sorted(concats) == (["abd", "bd"] if batch == 1 else ["ab", "abd", "bd"])


def _unbind_graph(rows: int, width: int, escape: bool):
    """timm's attention operands: a product's output split along a leading axis of size 3
    into q, k and v, each squeezed (Split and Squeeze: views of the product when the parts
    are contiguous and aligned), combined; `escape` also returns k (a view may not escape),
    and x itself reshaped (a segment input: no view)."""
    rng = np.random.default_rng(7)
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (rows, 8)))
    w = Value("w", T.TensorType(T.float32, (8, 3 * width)),
              const=rng.standard_normal((8, 3 * width)).astype(np.float32))
    qkv = g.add("Reshape", g.add("MatMul", x, w),
                Value("s", T.TensorType(T.int64, (3,)), const=np.array([rows, 3, width])))
    qkv = g.add("Transpose", qkv, perm=[1, 0, 2], name="heads_first")   # [3, rows, width]
    q, k, v = g.add_node("Split", [qkv], {"axis": 0, "num_outputs": 3}, name="unbind",
                         num_outputs=3)
    axes = Value("axes", T.TensorType(T.int64, (1,)), const=np.array([0]))
    q, k, v = (g.add("Squeeze", t, axes, name=f"squeeze_{n}") for t, n in zip((q, k, v), "qkv"))
    flat = g.add("Reshape", x, Value("f", T.TensorType(T.int64, (1,)), const=np.array([-1])),
                 name="flat_input")
    out = g.add("Add", g.add("Mul", q, k), g.add("Sigmoid", v))
    g.outputs = [out, flat] + ([k] if escape else [])
    return g


@pytest.mark.parametrize("rows,width,escape,viewed", [
    (4, 16, False, {"unbind", "squeeze_q", "squeeze_k", "squeeze_v"}),  # 256-byte parts
    (4, 16, True, {"unbind", "squeeze_q", "squeeze_v"}),   # k escapes: its Squeeze copies
    (3, 5, False, {"squeeze_q", "squeeze_k", "squeeze_v"}),   # 60-byte parts: Split copies
])
def test_splits_and_reshapes_are_views_where_their_bytes_are_in_place(rows, width, escape,
                                                                       viewed):
    g = _unbind_graph(rows, width, escape)
    x = np.random.default_rng(8).standard_normal((rows, 8)).astype(np.float32)
    want = dnnc.compile(g, target="numpy").run(x)
    model = dnnc.compile(g, target="llvm", opt_level=1, progress=False)
    for _ in range(2):   # the arena reused across calls
        for got, ref in zip(model.run(x), want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    (seg,) = model.runtime.compiled_segments()
    names = {n.name for k in seg.kernels for n in k.nodes}
    everything = {"unbind", "squeeze_q", "squeeze_k", "squeeze_v", "flat_input"}
    assert everything - names == viewed
