"""Epilogues that change the output's type, fused into the conv / dense / pool templates: a
QuantizeLinear after a convolution (every QDQ model: DQ -> Conv -> Q) stores int8, never into
the float32 accumulators (issue 30, item 5: efficientnet_b0 quantized by onnxruntime wrote
32-byte vectors into an int8 tensor, corrupting the heap, relative error 1.7 on llvm).

The compiled run happens in a child process: the bug this guards against corrupts the heap and
may kill the process instead of failing an assert."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dnnc
from dnnc.ir import loop as L
from dnnc.ir import types as T
from dnnc.backends.llvm.codegen import CodegenError
from dnnc.ir.loop import LoopIRError

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import dnnc

    cin, cout, size, k, stride, group, qtype = (int(a) for a in sys.argv[1:8])
    rng = np.random.default_rng(7)
    qt = TensorProto.INT8 if qtype else TensorProto.UINT8
    zp = np.array(-3 if qtype else 120, np.int8 if qtype else np.uint8)
    w = rng.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int8)
    inits = [numpy_helper.from_array(np.array(0.04, np.float32), "xs"),
             numpy_helper.from_array(zp, "xz"),
             numpy_helper.from_array(w, "wq"),
             numpy_helper.from_array(rng.uniform(1e-3, 3e-3, cout).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(cout, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
             numpy_helper.from_array(zp, "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[k // 2] * 4,
                              strides=[stride] * 2, group=group),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qconv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", qt, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.standard_normal((1, cin, size, size)).astype(np.float32)
    want = dnnc.compile(model, target="numpy")(x).astype(np.int32)
    got = np.asarray(dnnc.compile(model, target="llvm", progress=False)(x)).astype(np.int32)
    diff = np.abs(got - want)
    # one quantum where the float sum lies at a rounding boundary (summation order), no more
    print(int(diff.max()), float(np.mean(diff > 0)))
""")


@pytest.mark.parametrize("cin,cout,size,k,stride,group,signed", [
    (3, 32, 224, 3, 2, 1, 1),     # efficientnet_b0's stem, the reported model's first layer
    (32, 16, 112, 1, 1, 1, 1),    # a 1x1 projection (the [n, c, h*w] view of its input)
    (24, 24, 29, 3, 1, 24, 0),    # depthwise, uint8, odd size (tiles across rows)
    (5, 9, 13, 3, 1, 1, 0),
])
def test_conv_then_quantize_matches_the_reference(cin, cout, size, k, stride, group, signed):
    run = subprocess.run([sys.executable, "-c", CHILD, *map(str, (cin, cout, size, k, stride,
                                                                   group, signed))],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    worst, differing = run.stdout.split()
    assert int(worst) <= 1 and float(differing) < 0.01, run.stdout


def test_codegen_refuses_a_store_of_another_type():
    """The loop-IR verifier runs before every kernel is rendered: a template that stores int8
    into a float32 buffer is a compile-time LoopIRError, not heap corruption at run time."""
    acc = L.Buffer("acc", T.float32, (8,), L.Scope.LOCAL)
    y = L.Buffer("y", T.int8, (8,))
    i = L.Var("i")
    body = L.Allocate(acc, L.seq(
        L.For(i, 8, L.Store(acc, (i,), L.Cast(T.int8, L.const(1.5)))),
        L.For(i, 8, L.Store(y, (i,), L.Cast(T.int8, acc[i])))))
    func = L.PrimFunc("slip", (y,), body, ())
    from dnnc.backends.llvm.codegen import ModuleBuilder
    with pytest.raises(CodegenError, match="storing int8 into float32 buffer acc"):
        ModuleBuilder().add(func)


def test_verifier_accepts_a_reshaped_view_and_refuses_another_size():
    x4 = L.Buffer("x", T.float32, (1, 4, 3, 3))
    x3 = L.Buffer("x", T.float32, (1, 4, 9))
    bad = L.Buffer("x", T.float32, (1, 4, 10))
    out = L.Buffer("out", T.float32, (4,))
    c = L.Var("c")
    ok = L.PrimFunc("view", (x4, out), L.For(c, 4, L.Store(out, (c,), x3[0, c, 8])), ())
    L.verify(ok)
    wrong = L.PrimFunc("view", (x4, out), L.For(c, 4, L.Store(out, (c,), bad[0, c, 8])), ())
    with pytest.raises(LoopIRError, match="accessed with another type"):
        L.verify(wrong)
