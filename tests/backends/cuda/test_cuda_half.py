"""Half precision stored end to end on cuda (issue 31, item 4): kernels whose tensors are
float16 or bfloat16, without a GPU.

- a float16 / bfloat16 ONNX model's products are scheduled on the real templates (dense,
  gemv, conv2d, attention; the tensor-core ones at the matching precision), not the generic
  default;
- each kernel, rendered, runs on the host-C++ shim (test_host_semantics.py: host threads,
  tensor cores emulated) and, without mma, on the loop-IR emulator (test_cuda_codegen.py's
  `run_on_cpu`), against the NumPy reference of the same half graph within `storage_bound`;
- the llvm target still compiles such a model (its templates refuse 16-bit problems, the
  default one computes them).

Why the bound holds. The reference (the registry's `evaluate`) and the kernel both compute in
float32 from the same 16-bit values (exact: every half value is a float32) and round the
result once to the storage type. Their float32 results differ only by the order of the sums:
at most 2 k 2**-24 S for a product of depth k, S = sum_k |a| |b| (test_cuda_precision.py's
argument; a row's softmax or normalisation the same with S its row's magnitudes). Rounded to
the storage type (unit roundoff u: 2**-11 fp16, 2**-8 bf16), two float32 values that close
land at most one unit in the last place apart, 2 u |want| (plus the difference itself, plus
fp16's subnormal spacing 2**-24 near 0).
"""

import shutil

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dnnc
from dnnc.backends.cuda.codegen import MMA_PRELUDE, render_module
from dnnc.frontend.onnx import import_onnx
from dnnc.ir import loop as L
from dnnc.ir import types as T
from cuda_kernels import programs, reference, renamed
from test_cuda_codegen import poisoned, run_on_cpu
from test_cuda_precision import machine

pytestmark = pytest.mark.codegen

STORAGE = {"fp16": (TensorProto.FLOAT16, np.float16, 2.0 ** -11),
           "bf16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16, 2.0 ** -8)}
"""Storage -> (ONNX element type, NumPy type, unit roundoff)."""


def storage_bound(unit: float, k: int, scale: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The largest difference between a kernel's result and the reference's, both rounded once
    to a storage type of unit roundoff `unit` (the module's docstring)."""
    order = 2 * k * 2.0 ** -24 * scale
    return 2 * unit * np.abs(want) + order + 2.0 ** -24


# -- half models of one kernel ----------------------------------------------------------------

def _model(nodes, x_shape, y_shape, weights, storage: str):
    elem, npt, _ = STORAGE[storage]
    graph = helper.make_graph(
        nodes, "half", [helper.make_tensor_value_info("x", elem, list(x_shape))],
        [helper.make_tensor_value_info("y", elem, list(y_shape))],
        [numpy_helper.from_array(np.asarray(v).astype(npt), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv(rng, n, c, hw, oc, kernel, stride, pad, group=1):
    w = rng.uniform(-1, 1, (oc, c // group, kernel, kernel))
    oh = (hw + 2 * pad - kernel) // stride + 1
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride] * 2,
                            pads=[pad] * 4, group=group)
    return ([node, helper.make_node("Relu", ["c"], ["y"])], (n, c, hw, hw), (n, oc, oh, oh),
            {"w": w, "b": rng.uniform(-1, 1, oc)}, c // group * kernel * kernel)


def _cases(rng):
    """name -> (nodes, x shape, y shape, weights, k: the reduction's depth)."""
    def matmul(x_shape, n):
        k = x_shape[-1]
        return ([helper.make_node("MatMul", ["x", "w"], ["y"])], x_shape,
                tuple(x_shape[:-1]) + (n,), {"w": rng.uniform(-1, 1, (k, n))}, k)

    def gemm_relu(m, k, n):
        return ([helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
                 helper.make_node("Relu", ["g"], ["y"])], (m, k), (m, n),
                {"w": rng.uniform(-1, 1, (n, k)), "b": rng.uniform(-1, 1, n)}, k)

    return {
        "dense_40x100x24": matmul((40, 100), 24),
        "batched_3x20x48x40": matmul((3, 20, 48), 40),
        "gemm_relu_33x70x50": gemm_relu(33, 70, 50),
        "gemv_2x96x48": gemm_relu(2, 96, 48),
        "conv3x3_pad": _conv(rng, 1, 8, 9, 20, 3, 1, 1),
        "conv1x1_stride2": _conv(rng, 2, 24, 8, 16, 1, 2, 0),
        "depthwise3x3": _conv(rng, 1, 12, 7, 12, 3, 1, 1, group=12),
        "grouped3x3": _conv(rng, 1, 8, 6, 8, 3, 1, 1, group=2),
        "softmax": ([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], (6, 50), (6, 50),
                    {}, 50),
        "layernorm": ([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"],
                                        axis=-1, epsilon=1e-5)], (6, 96), (6, 96),
                      {"s": rng.uniform(0.5, 1.5, 96), "b": rng.uniform(-1, 1, 96)}, 96),
    }


TEMPLATES = {
    "dense_40x100x24": "cuda_dense", "batched_3x20x48x40": "cuda_dense",
    "gemm_relu_33x70x50": "cuda_dense", "gemv_2x96x48": "cuda_gemv",
    "conv3x3_pad": "cuda_conv2d", "conv1x1_stride2": "cuda_conv2d",
    "depthwise3x3": "cuda_depthwise", "grouped3x3": "cuda_default",
    "softmax": "cuda_rows", "layernorm": "cuda_rows",
}
"""The template each case's kernel takes at precision fp32 (the products: the tiled ones)."""
PRODUCTS = ("dense_40x100x24", "batched_3x20x48x40", "gemm_relu_33x70x50", "conv3x3_pad",
            "conv1x1_stride2")


def _built(storage: str, precision: str, names):
    """(name, graph, its one Program, the reference's values, k) of each case, scheduled at
    `precision`."""
    rng = np.random.default_rng(31)
    cases = _cases(rng)
    out = []
    for name in names:
        nodes, x_shape, y_shape, weights, k = cases[name]
        graph, (program,) = programs(import_onnx(_model(nodes, x_shape, y_shape, weights,
                                                        storage)), machine=machine(precision))
        x = rng.uniform(-1, 1, x_shape).astype(STORAGE[storage][1])
        out.append((name, graph, program, reference(graph, {"x": x}), k))
    return out


def _scale(graph, values, name: str, k: int, want: np.ndarray) -> np.ndarray:
    """S = sum_k |a| |b| of each output of a product (its row's magnitudes for a row op),
    from the case's input and weights."""
    x = np.abs(values["x"].astype(np.float64))
    consts = {v.name: np.abs(v.const.astype(np.float64)) for v in graph.constants()}
    w = next((a for n, a in consts.items() if a.ndim >= 2), None)
    if name.startswith(("dense", "batched")):
        return x @ w
    if name.startswith(("gemm", "gemv")):
        return x @ w.T + 1.0
    if name.startswith(("conv", "depthwise", "grouped")):
        return np.full(want.shape, float(k) + 1.0)   # |x|, |w| <= 1: a sum of k + 1 terms
    return np.broadcast_to(np.abs(want).sum(axis=-1, keepdims=True) + x.sum(axis=-1,
                                                                         keepdims=True),
                           want.shape)


def _check(storage, name, graph, values, k, got, want) -> list[str]:
    unit = STORAGE[storage][2]
    g, w = got.astype(np.float64), want.astype(np.float64)
    bad = np.abs(g - w) > storage_bound(unit, k, _scale(graph, values, name, k, w), w)
    if bad.any() or np.isnan(g).any():
        return [f"{storage} {name}: {bad.sum()} of {bad.size} outside the bound, e.g. "
                f"{g[bad][:3]} vs {w[bad][:3]}"]
    return []


# -- the problems and templates ---------------------------------------------------------------

@pytest.mark.parametrize("storage", STORAGE)
def test_half_products_take_the_tiled_templates(storage):
    names = list(TEMPLATES)
    chosen = {}
    for name, graph, program, _, _ in _built(storage, "fp32", names):
        (kernel,) = program.kernels
        chosen[name] = kernel.schedule[0]   # (the template schedule_kernel chose)
        assert {p.dtype for p in kernel.func.params} == {T.float16 if storage == "fp16"
                                                         else T.bfloat16}, name
    assert chosen == TEMPLATES
    # at the matching precision the products go to the tensor cores, reading 16-bit operands
    for name, graph, program, _, _ in _built(storage, storage, PRODUCTS):
        (kernel,) = program.kernels
        assert kernel.schedule[0].startswith("cuda_mma_"), name


def test_half_operands_are_staged_in_their_own_type():
    """The tiled product copies 16-bit operands as 16-bit registers (a 64-bit load of 4) and
    widens them into the fp32 shared tiles; Y is stored rounded once."""
    (_, _, program, _, _), = _built("fp16", "fp32", ["dense_40x100x24"])
    source = render_module(program.unique).source
    source = source[source.index("__global__"):]   # the kernel, not the prelude
    assert "unsigned short a_stage[" in source and "unsigned short b_stage[" in source
    assert "float a_tile[" in source and "dnnc_h2f(b_stage[" in source
    assert source.count("dnnc_f2h(") == 1   # the one rounding, at the store


# -- numbers: host shim and emulator ----------------------------------------------------------

def _run_on_host(storage: str, precision: str, names, tmp_path) -> list[str]:
    import test_host_semantics as host

    built = _built(storage, precision, names)
    funcs = []
    for name, _, program, _, _ in built:
        funcs += renamed(program, f"{name}_")
    module = render_module(funcs)
    assert (MMA_PRELUDE in module.source) == (precision != "fp32")
    lib = host.host_library(funcs, tmp_path / f"{storage}_{precision}", module)
    failures = []
    for name, graph, program, values, k in built:
        (kernel,) = program.kernels
        info = module.kernels[f"{name}_{kernel.func.name}"]
        ins = [np.ascontiguousarray(v.const if v.const is not None else values[v.name])
               for v in kernel.inputs]
        (out,) = [poisoned(np.dtype(v.type.dtype.np), v.type.shape) for v in kernel.outputs]
        scratch = [np.full(size, 0xFF, np.uint8) for size in info.workspace]
        host.launch_on_host(lib, info, ins + [out] + scratch)
        failures += _check(storage, name, graph, values, k, out,
                           values[kernel.outputs[0].name])
    return failures


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


@needs_gxx
@pytest.mark.parametrize("storage", STORAGE)
def test_half_kernels_on_host_at_fp32(storage, tmp_path):
    failures = _run_on_host(storage, "fp32", list(TEMPLATES), tmp_path)
    assert not failures, "\n".join(failures)


@needs_gxx
@pytest.mark.parametrize("storage", STORAGE)
def test_half_products_on_tensor_cores_on_host(storage, tmp_path):
    """At the storage's own precision the operands are already in the mma's type: rounding
    them is exact, so the bound is the storage's, not test_cuda_precision's."""
    failures = _run_on_host(storage, storage, PRODUCTS, tmp_path)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("storage", STORAGE)
def test_half_kernels_emulated(storage):
    built = _built(storage, "fp32", list(TEMPLATES))
    funcs, arrays = [], {}
    for name, _, program, values, _ in built:
        (kernel,) = program.kernels
        func = L.PrimFunc(f"{name}_{kernel.func.name}", kernel.func.params, kernel.func.body)
        funcs.append(func)
        arrays[func.name] = [np.ascontiguousarray(v.const if v.const is not None else
                                                  values[v.name]) for v in kernel.inputs] + \
            [poisoned(np.dtype(v.type.dtype.np), v.type.shape) for v in kernel.outputs]
    run_on_cpu(funcs, arrays)
    failures = []
    for (name, graph, program, values, k), func in zip(built, funcs):
        failures += _check(storage, name, graph, values, k, arrays[func.name][-1],
                           values[program.kernels[0].outputs[0].name])
    assert not failures, "\n".join(failures)


def test_llvm_computes_a_half_model_with_its_default_template():
    rng = np.random.default_rng(3)
    nodes, x_shape, y_shape, weights, _ = _cases(rng)["gemm_relu_33x70x50"]
    model = _model(nodes, x_shape, y_shape, weights, "fp16")
    x = rng.uniform(-1, 1, x_shape).astype(np.float16)
    got = dnnc.compile(model, "llvm")(x)
    want = dnnc.compile(model, "numpy")(x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3,
                               atol=1e-3)


# -- whole models stored half (store_half), kernel by kernel on the host shim -----------------

@needs_gxx
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("model", ["mlp", "cnn",
                                   pytest.param("bert_tiny", marks=pytest.mark.emulated_full)])
def test_zoo_kernels_stored_half_on_host(model, precision, tmp_path):
    """Every kernel of a zoo model compiled at fp16 / bf16 for a target storing it half (the
    products on emulated tensor cores), against the NumPy reference of the same half graph:
    within one unit of the storage type's last place of the value (both round once from
    float32) plus one of the kernel's largest output (the float32 sums' order)."""
    import test_host_semantics as host
    from dnnc import zoo
    from cuda_kernels import zoo_model
    from dataclasses import replace

    target = replace(machine(precision), half_storage=True)
    graph, progs = programs(import_onnx(zoo_model(model)), machine=target)
    values = reference(graph, zoo.inputs_for(zoo_model(model), np.random.default_rng(0)))
    unit = STORAGE[precision][2]
    failures, halves = [], 0
    for p, program in enumerate(progs):
        module = render_module(program.unique)
        lib = host.host_library(program.unique, tmp_path / f"p{p}", module)
        for kernel in program.kernels:
            if kernel.anchor.op in ("MatMul", "Gemm", "FusedAttention"):   # the real templates
                assert kernel.schedule[0] in ("cuda_mma_dense", "cuda_gemv",
                                              "cuda_attention"), kernel.schedule
            outs, _ = host.kernel_on_host(lib, module, kernel, values)
            for v, got in zip(kernel.outputs, outs):
                want = np.asarray(values[v.name])
                halves += v.type.dtype is not T.float32
                g, w = got.astype(np.float64), want.astype(np.float64)
                if want.dtype.kind in "biu" or not g.size:
                    np.testing.assert_array_equal(got, want)
                    continue
                bound = 2 * unit * (np.abs(w) + np.abs(w).max()) + 2.0 ** -24
                if np.isnan(g).any() or (np.abs(g - w) > bound).any():
                    failures.append(f"{kernel.func.name} {v.name}: max error "
                                    f"{np.abs(g - w).max():.3g}, bound {bound.min():.3g}")
    assert halves and not failures, "\n".join(failures)


@needs_gxx
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_dynamically_quantized_file_stored_half_on_host(precision, tmp_path):
    """A quantize_dynamic BERT compiled at fp16 / bf16 (int8 products, the float ops between
    them stored half, as TensorRT's int8 with fp16 runs): each quantization reads a half
    node's output as it is (no Cast kernel of its own: store_half's WIDENING_READERS), and
    every kernel on the host shim gives the NumPy reference of the same half graph, the
    quantized values bit for bit, the float ones within the storage bound (as above; a
    DynamicRange's partials by the range they make: the pieces are the kernel's)."""
    pytest.importorskip("onnxruntime")
    import test_host_semantics as host
    from dataclasses import replace
    from dnnc import zoo
    from dnnc.testing.quantized_files import quantize_dynamic

    model = zoo.build("bert_tiny", seq=16, vocab=512)
    path = quantize_dynamic(model, tmp_path, "bert_tiny")
    target = replace(machine(precision), half_storage=True)
    graph, progs = programs(import_onnx(str(path)), machine=target)
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    quantized = [producer.get(id(n.inputs[0])) for n in graph.nodes
                 if n.op == "DynamicQuantizeLinear"]
    assert not any(q is not None and q.op == "Cast" for q in quantized)
    half = STORAGE[precision][1]
    assert sum(n.inputs[0].type.dtype.np == half for n in graph.nodes
               if n.op == "DynamicQuantizeLinear") >= 2   # (the LayerNorms' outputs)
    values = reference(graph, zoo.inputs_for(model, np.random.default_rng(5)))
    unit = STORAGE[precision][2]
    failures = []
    for p, program in enumerate(progs):
        module = render_module(program.unique)
        lib = host.host_library(program.unique, tmp_path / f"p{p}", module)
        for kernel in program.kernels:
            outs, _ = host.kernel_on_host(lib, module, kernel, values)
            for v, got in zip(kernel.outputs, outs):
                want = np.asarray(values[v.name])
                if v.producer.op == "DynamicRange":   # (the pieces are the kernel's)
                    got, want = (np.array([a[0].max(), a[1].min()]) for a in (got, want))
                if want.dtype.kind in "biu" or not got.size:
                    if not np.array_equal(got, want):
                        failures.append(f"{kernel.func.name} {v.name}: "
                                        f"{np.mean(got != want):.3%} differ")
                    continue
                g, w = got.astype(np.float64), want.astype(np.float64)
                bound = 2 * unit * (np.abs(w) + np.abs(w).max()) + 2.0 ** -24
                if np.isnan(g).any() or (np.abs(g - w) > bound).any():
                    failures.append(f"{kernel.func.name} {v.name}: max error "
                                    f"{np.abs(g - w).max():.3g}, bound {bound.min():.3g}")
    assert not failures, "\n".join(failures)


def test_cuda_compiles_store_half_at_fp16_and_bf16_only():
    from dnnc import zoo
    from dnnc.backends.registry import REGISTRY

    assert REGISTRY["cuda"].target(precision="fp16").half_storage
    assert not REGISTRY["llvm"].target().half_storage
    model = zoo.build("mlp", hidden=(64,), in_features=32, classes=16, batch=32)
    # (at tf32 the weights stay float32, rounded to tf32 values by store_tf32: `_tf32`)
    for precision, weights in (("fp32", "float32"), ("tf32", "float32"), ("fp16", "float16"),
                               ("bf16", "bfloat16")):
        compiled = dnnc.compile(model, "cuda", precision=precision, render_only=True)
        loop = compiled.source("loop")
        name = "v_fc_0_weight_tf32" if precision == "tf32" else "v_fc_0_weight"
        assert f"{name}: {weights}[" in loop, precision
        graph = compiled.runtime.graph   # the signature stays float32 at every precision
        assert [v.type.dtype for v in graph.inputs + graph.outputs] == [T.float32, T.float32]


@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenet_v2"])
def test_a_float16_onnx_file_takes_the_real_templates(name):
    """A zoo model as onnxconverter_common.float16 writes it (every tensor float16): its
    products on the tiled, gemv, conv and depthwise templates, none on the default one
    (when the converter is installed: it is not a dependency)."""
    float16 = pytest.importorskip("onnxconverter_common.float16")
    from cuda_kernels import SMALL
    from dnnc import zoo

    import warnings
    with warnings.catch_warnings():   # (it warns of every weight it flushes to 0)
        warnings.simplefilter("ignore")
        model = float16.convert_float_to_float16(zoo.build(name, **SMALL[name]))
    graph, progs = programs(import_onnx(model))
    assert graph.inputs[0].type.dtype is T.float16
    products = [(k.anchor.op, k.schedule[0]) for p in progs for k in p.kernels
                if k.anchor.op in ("Conv", "Gemm", "MatMul")]
    assert products and all(template != "cuda_default" for _, template in products), products
    depthwise = sum(1 for n in graph.nodes if n.op == "Conv" and n.attrs.get("group", 1) > 1)
    assert sum(1 for _, template in products if "depthwise" in template) == depthwise


def _stored_program(model, precision: str):
    """(graph, its one Program) of a float32 model for a cuda target storing it half."""
    from dataclasses import replace
    from dnnc.backends.cuda.schedules import schedule_kernel
    from dnnc.backends.plan import build_program, segment_groups
    from dnnc.ir.segments import Segment, plan_steps
    from dnnc.passes.manager import optimize

    target = replace(machine(precision), half_storage=True)
    graph = optimize(import_onnx(model), target, 3)
    (step,) = [s for s in plan_steps(graph) if isinstance(s, Segment)]
    program = build_program(step, tuple(v.type.shape for v in step.inputs), (),
                            segment_groups(step, graph.groups),
                            lambda k: schedule_kernel(k, target), True)
    return graph, program


@needs_gxx
@pytest.mark.parametrize("product,precision", [("dense_64x256x64", "fp16"),
                                               ("gemm_relu_33x70x50", "fp16"),
                                               ("conv3x3_pad", "bf16"),
                                               ("batched_3x20x48x40", "bf16")])
def test_stored_products_on_host_within_the_gpu_test_bound(product, precision, tmp_path):
    """A float32 product compiled at fp16 / bf16 with half storage (the input cast, the
    weights converted, the output stored half and cast back), the whole program on the host
    shim against the float32 reference: within test_cuda_precision's bound plus the storage's
    roundings of the output and the bias, u (|want| + 1) (measured: at most 0.3 of
    test_cuda_precision's bound alone, which its GPU test keeps)."""
    from test_cuda_precision import PRODUCTS, UNIT, bound
    import test_host_semantics as host

    make, k = PRODUCTS[product]
    model_of = make(np.random.default_rng(12))
    model, x = model_of(False)
    graph, program = _stored_program(model, precision)
    assert any(v.type.dtype is not T.float32 for kern in program.kernels
               for v in kern.outputs)   # (stored half between the kernels)
    module = render_module(program.unique)
    lib = host.host_library(program.unique, tmp_path, module)
    got = host.program_on_host(lib, module, program, {graph.inputs[0].name: x})[
        graph.outputs[0].name]
    fp32 = import_onnx(model)
    want = reference(fp32, {fp32.inputs[0].name: x})[fp32.outputs[0].name]
    abs_model, abs_x = model_of(True)
    abs_graph = import_onnx(abs_model)
    scale = reference(abs_graph, {abs_graph.inputs[0].name: abs_x})[abs_graph.outputs[0].name]
    limit = bound(precision, k, scale, want) + UNIT[precision] * (np.abs(want) + 1.0)
    error = np.abs(got.astype(np.float64) - want)
    assert got.dtype == np.float32 and (error <= limit).all(), error.max()
    assert (error / limit).max() > 0.01


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_an_artifact_keeps_the_half_weights(precision, simulated, tmp_path, monkeypatch):
    """A model stored half saves and loads: its 16-bit constants (bfloat16 too) come back
    bit for bit, its signature float32, its precision recorded (simulated device)."""
    from dnnc import zoo
    from dnnc.backends.cuda import device, executable
    from dnnc.backends.registry import REGISTRY
    from dnnc.compiler.module import CompiledModel
    from dnnc.passes.manager import optimize
    from simulated_device import FAKE, relu_model

    simulated(relu_model([3, 5]))   # (the simulated device in place)
    monkeypatch.setattr(device, "gpu_arch", lambda: FAKE.arch)
    target = REGISTRY["cuda"].target(precision=precision)
    model = zoo.build("mlp", hidden=(16,), in_features=8, classes=4, batch=16)
    rt = executable.CUDARuntime(optimize(import_onnx(model), target, 3),
                                target=target).start()
    CompiledModel(rt.graph, rt, "cuda").save(tmp_path / "m.dnnc")
    loaded = dnnc.load(tmp_path / "m.dnnc")
    half = {"fp16": T.float16, "bf16": T.bfloat16}[precision]
    saved = {v.name: v.const for v in rt.graph.constants()}
    back = {v.name: v for v in loaded.runtime.graph.constants()}
    assert saved and set(back) == set(saved)
    for name, array in saved.items():
        assert back[name].dtype is half
        np.testing.assert_array_equal(back[name].const.view(np.uint16), array.view(np.uint16))
    graph = loaded.runtime.graph
    assert [v.type.dtype for v in graph.inputs + graph.outputs] == [T.float32, T.float32]
    assert loaded.stats["precision"] == precision


@needs_gxx
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_an_additive_mask_of_float32s_lowest_runs_finite_on_host(precision, tmp_path):
    """transformers' additive attention mask, Softmax(scores + (1 - mask) * finfo(float32).min),
    stored half: the constant saturates to the half type's lowest finite value (store_half),
    so the kernels, chained on the host shim, give the float32 model's masked softmax; as
    -inf it made every kept score NaN (0 * -inf)."""
    import test_host_semantics as host
    from dataclasses import replace

    rng = np.random.default_rng(5)
    scores = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    mask = (rng.random((2, 1, 1, 8)) < 0.6).astype(np.float32)
    mask[..., 0] = 1   # every row keeps a position
    lowest = np.finfo(np.float32).min
    nodes = [helper.make_node("Sub", ["one", "mask"], ["kept"]),
             helper.make_node("Mul", ["kept", "lowest"], ["added"]),
             helper.make_node("Add", ["scores", "added"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "masked_softmax",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, scores.shape),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, mask.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, scores.shape)],
        [numpy_helper.from_array(np.float32(1), "one"),
         numpy_helper.from_array(np.float32(lowest), "lowest")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want = np.exp(scores - scores.max(-1, keepdims=True)) * mask
    want /= want.sum(-1, keepdims=True)   # (the float32 model's masked softmax)
    target = replace(machine(precision), half_storage=True)
    optimized, progs = programs(import_onnx(model), machine=target)
    values = {"scores": scores, "mask": mask}
    for p, program in enumerate(progs):   # kernels chained: each reads what ran before
        module = render_module(program.unique)
        lib = host.host_library(program.unique, tmp_path / f"p{p}", module)
        for kernel in program.kernels:
            outs, _ = host.kernel_on_host(lib, module, kernel, values)
            values.update((v.name, a) for v, a in zip(kernel.outputs, outs))
    got = np.asarray(values[optimized.outputs[0].name], np.float64)
    assert np.isfinite(got).all()
    assert (got[np.broadcast_to(mask, got.shape) == 0] == 0).all()
    np.testing.assert_allclose(got, want, atol=4 * STORAGE[precision][2])
