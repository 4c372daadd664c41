"""in_place.alias_free: a kernel writing its output over its input (the memory plan's in-place
reuse) reads that input through the output's buffer and keeps `noalias`, so LLVM vectorizes
its loops; functions whose calls alias otherwise are left as the plan gave them."""

import re
from dataclasses import replace

import numpy as np

import dnnc
from dnnc.backends.llvm.in_place import alias_free
from dnnc.backends.plan import Call
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.ir.graph import Graph, Value


def _graph(rng) -> Graph:
    """(x @ w), its Tanh (a kernel of its own at opt level 1, over the product's block: the
    product dies there), @ w2."""
    g = Graph("g")
    x = g.add_input("x", T.TensorType(T.float32, (64, 96)))
    w = Value("w", T.TensorType(T.float32, (96, 256)),
              const=(rng.standard_normal((96, 256)) / 10).astype(np.float32))
    w2 = Value("w2", T.TensorType(T.float32, (256, 8)),
               const=(rng.standard_normal((256, 8)) / 10).astype(np.float32))
    t = g.add("Tanh", g.add("MatMul", x, w, name="h"), name="t")
    g.outputs = [g.add("MatMul", t, w2, name="out")]
    return g


def _define(ir: str, name: str) -> str:
    found = re.search(rf"define [^\n]*@{name}\(([^)]*)\)[^\n]*\{{(.*?)\n\}}", ir, re.S)
    assert found is not None, name
    return found.group(0)


def _in_place_kernel(model):
    (seg,) = model.runtime.compiled_segments()
    kernels = [k for k in seg.kernels if id(k.outputs[0]) in seg.memory.inplace]
    assert len(kernels) == 1
    return seg, kernels[0]


def test_an_in_place_kernel_keeps_noalias_and_vectorizes(rng):
    g = _graph(rng)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    ref = dnnc.compile(g, target="numpy").run(x)[0]
    model = dnnc.compile(g, target="llvm", opt_level=1, progress=False, cache=False)
    np.testing.assert_allclose(model.run(x)[0], ref, rtol=1e-5, atol=1e-6)
    _, kernel = _in_place_kernel(model)
    text = _define(model.source("llvm-ir"), kernel.func.name)
    params = text.split("{")[0]
    assert params.count("ptr") == params.count("noalias")
    assert "readnone" in params               # the input it writes over, read through the output
    assert re.search(r"<\d+ x float>", text)  # its loop vectorized (scalar without noalias)


def _sum_func():
    buffers = [L.Buffer(n, T.float32, (64,)) for n in ("a", "b", "y")]
    i = L.Var("i")
    body = L.For(i, 64, L.Store(buffers[2], (i,), L.Load(buffers[0], (i,)) +
                                L.Load(buffers[1], (i,))))
    return L.PrimFunc("k", tuple(buffers), body)


def _loads(func):
    return sorted({n.buffer.name for n in L.walk(func.body) if isinstance(n, L.Load)})


def test_one_input_at_the_output_s_place_is_read_through_the_output():
    func = _sum_func()
    calls = [Call("k", [("arena", 0), ("arena", 256), ("arena", 0)]),
             Call("k", [("arena", 512), ("arena", 0), ("arena", 512)])]
    ((out, noalias),) = alias_free([(func, False)], calls)
    assert noalias and _loads(out) == ["b", "y"] and out.params == func.params


def test_other_aliasing_keeps_the_function_as_planned():
    func = _sum_func()
    cases = {
        "a different input per call": [Call("k", [("arena", 0), ("arena", 256), ("arena", 0)]),
                                       Call("k", [("arena", 256), ("arena", 0), ("arena", 0)])],
        "two inputs at the output": [Call("k", [("arena", 0), ("arena", 0), ("arena", 0)])],
        "a partial overlap": [Call("k", [("arena", 0), ("arena", 256), ("arena", 64)])],
        "both inputs overlapping": [Call("k", [("arena", 0), ("arena", 128), ("arena", 0)])],
        "no call aliasing": [Call("k", [("arena", 0), ("arena", 256), ("arena", 512)])],
    }
    for why, calls in cases.items():
        assert alias_free([(func, False)], calls) == [(func, False)], why
    assert alias_free([(func, True)], cases["two inputs at the output"]) == [(func, True)]
    other = replace(func, params=func.params[:2] + (L.Buffer("y", T.float32, (8, 8)),))
    calls = [Call("k", [("arena", 0), ("arena", 256), ("arena", 0)])]
    assert alias_free([(other, False)], calls) == [(other, False)]   # another shape
