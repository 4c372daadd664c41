"""Every argument of the user API is checked where it enters: a wrong type, range or an option
that does not apply raises `ArgumentError` naming the argument (never accepted and ignored);
a tensor too big for this machine is refused at compile time (`OutOfMemoryError` naming the
node and size), and an allocation that fails at call time is a dnnc error too."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import dnnc
from dnnc import zoo
from dnnc.errors import ArgumentError, DNNCError, OutOfMemoryError
from dnnc.ir.target import Target


@pytest.fixture(scope="module")
def mlp():
    """An MLP with a symbolic batch N: input float32[N,4] -> logits float32[N,3]."""
    return zoo.build("mlp", batch="N", hidden=(8,), in_features=4, classes=3)


@pytest.fixture(scope="module")
def compiled(mlp):
    return dnnc.compile(mlp, "numpy")


@pytest.mark.parametrize("options,message", [
    ({"opt_level": 7}, "opt_level must be from 0 to 3, not 7"),
    ({"opt_level": -1}, "opt_level must be from 0 to 3"),
    ({"opt_level": "3"}, "opt_level must be an int, not str"),
    ({"opt_level": True}, "opt_level must be an int, not bool"),
    ({"input_shapes": {"nope": (1, 4)}}, "input_shapes names 'nope', but the model's inputs "
                                         "are input"),
    ({"input_shapes": {"input": (1, 4, 5)}}, r"input_shapes\['input'\] = \(1, 4, 5\) has "
                                             r"rank 3"),
    ({"input_shapes": {"input": (2, 5)}}, r"input_shapes\['input'\]: dim 1 is fixed to 4"),
    ({"input_shapes": {"input": (-1, 4)}}, r"input_shapes\['input'\] must be a tuple of sizes"),
    ({"input_shapes": {"input": (2.5, 4)}}, r"input_shapes\['input'\] must be a tuple"),
    ({"input_shapes": [(2, 4)]}, "input_shapes must be a dict"),
    ({"target": "tpu"}, "target must be one of numpy, llvm, cuda, not 'tpu'"),
    ({"passes": -1, "target": "llvm"}, "passes must be from 0 to 13"),
    ({"passes": 14, "target": "llvm"}, "passes must be from 0 to 13, not 14"),  # 13 at level 3
    ({"passes": 8, "opt_level": 1, "target": "llvm"}, "passes must be from 0 to 7, not 8"),
    ({"passes": 2}, "passes does not apply to the numpy target"),
    ({"dump_ir": "ir"}, "dump_ir does not apply to the numpy target"),
    ({"dump_ir": 3, "target": "llvm"}, "dump_ir must be a path"),
    ({"cpu": "znver3"}, "cpu does not apply to the numpy target"),
    ({"cpu": "znver3", "target": "llvm"}, "cpu must be a dnnc.ir.target.Target .*, not str"),
    ({"cpu": Target("numpy"), "target": "llvm"}, "cpu describes a machine for the 'numpy' "
                                                 "target, not for llvm"),
    ({"progress": "yes"}, "progress must be True, False or None"),
    ({"tuning_log": "no-such-log.jsonl", "target": "llvm"},
     "tuning_log: no file 'no-such-log.jsonl'"),
    ({"tuning_log": 7, "target": "llvm"}, "tuning_log must be a path"),
])
def test_compile_refuses_a_bad_argument_naming_it(mlp, options, message):
    options = {"target": "numpy", **options}
    with pytest.raises(ArgumentError, match=message):
        dnnc.compile(mlp, **options)


def test_compile_takes_what_it_documents(mlp):
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    want = dnnc.compile(mlp, "numpy")(x)
    fixed = dnnc.compile(mlp, "numpy", input_shapes={"input": ("B", 4)}, opt_level=0)
    assert fixed.input_types[0].shape == ("B", 4)
    np.testing.assert_array_equal(fixed(x), want)
    sized = dnnc.compile(mlp, "numpy", input_shapes={"input": (np.int64(2), 4)})
    assert sized.input_types[0].shape == (2, 4) and type(sized.input_types[0].shape[0]) is int


def test_model_of_the_wrong_type_and_shapes_for_a_graph(mlp):
    with pytest.raises(ArgumentError, match="model must be an ONNX file path, bytes, an "
                                            "onnx.ModelProto, a dnnc.Graph or a "
                                            "torch.export.ExportedProgram, not int"):
        dnnc.compile(42, "numpy")
    graph = dnnc.compile(mlp, "numpy").graph
    with pytest.raises(ArgumentError, match="input_shapes applies to ONNX models"):
        dnnc.compile(graph, "numpy", input_shapes={"input": (2, 4)})


def test_argument_error_is_a_dnnc_error_and_a_value_error():
    assert issubclass(ArgumentError, DNNCError) and issubclass(ArgumentError, ValueError)


@pytest.mark.parametrize("call,message", [
    (lambda m, x: m.benchmark(x, repeat=0), "repeat must be at least 1, not 0"),
    (lambda m, x: m.benchmark(x, repeat=2.5), "repeat must be an int, not float"),
    (lambda m, x: m.benchmark(x, warmup=-1), "warmup must be at least 0, not -1"),
    (lambda m, x: m.source("ptx"), "unknown source kind 'ptx': kind must be"),
])
def test_compiled_model_methods(compiled, call, message):
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    with pytest.raises(ArgumentError, match=message):
        call(compiled, x)


@pytest.mark.parametrize("path,kind", [(42, "int"), (None, "NoneType"), (b"m.dnnc", "bytes")])
def test_load_and_save_take_paths(compiled, path, kind):
    message = f"path must be a path \\(str or os.PathLike\\), not {kind}"
    with pytest.raises(ArgumentError, match=message):
        dnnc.load(path)
    with pytest.raises(ArgumentError, match=message):
        compiled.save(path)


@pytest.mark.parametrize("options,message", [
    ({"rtol": -1}, "rtol must be a finite number >= 0, not -1"),
    ({"atol": float("nan")}, "atol must be a finite number >= 0, not nan"),
    ({"seed": -2}, "seed must be at least 0, not -2"),
])
def test_compare_checks_its_tolerances(options, message):
    from dnnc.compiler.compare import bisect_passes, compare

    for find in (compare, bisect_passes):
        with pytest.raises(ArgumentError, match=message):
            find(zoo.build("mlp", hidden=(8,), in_features=4, classes=3), "numpy", **options)


@pytest.mark.parametrize("decorate,message", [
    (lambda f: dnnc.jit(f, target="tpu"), "target must be one of numpy, llvm, cuda"),
    (lambda f: dnnc.jit(target="numpy", opt_level=9)(f), "opt_level must be from 0 to 3"),
    (lambda f: dnnc.jit(f, target="numpy", bogus=1), "dnnc.jit takes the compile options "
                                                     r".*, not bogus"),
    (lambda f: dnnc.jit(f, target="numpy", input_shapes={}), "not input_shapes"),
    (lambda f: dnnc.jit(42), "dnnc.jit decorates a function, not int"),
    (lambda f: dnnc.trace(42, np.ones(2)), "dnnc.trace traces a function, not int"),
])
def test_jit_and_trace_check_when_decorating(decorate, message):
    def add_one(x):
        return x + 1

    with pytest.raises(ArgumentError, match=message):
        decorate(add_one)   # at decoration: no call, no trace needed to find the mistake


def _constant_of_shape(shape_input):
    """y = x + ConstantOfShape(s): `s` an initializer (static) or a graph input."""
    static = not isinstance(shape_input, str)
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos")]
    inputs, inits = [], []
    if static:
        inits = [helper.make_tensor("s", TensorProto.INT64, [len(shape_input)], shape_input)]
        nodes.append(helper.make_node("Add", ["x", "c"], ["y"], name="add"))
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])]
        out = "y"
    else:
        inputs = [helper.make_tensor_value_info("s", TensorProto.INT64, [2])]
        out = "c"
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["numpy", "llvm"])
def test_a_4_tib_constant_is_refused_at_compile_time(target):
    model = _constant_of_shape([1 << 20, 1 << 20])   # float32: 4 TiB
    with pytest.raises(OutOfMemoryError, match=r"ConstantOfShape node 'cos': output 'c' "
                                               r"\(float32\[1048576,1048576\]\) needs 4.00 TiB"):
        dnnc.compile(model, target)


@pytest.mark.parametrize("target", ["numpy", "llvm"])
def test_an_allocation_failing_at_call_time_is_a_dnnc_error(target):
    model = dnnc.compile(_constant_of_shape("s"), target)
    assert model(np.array([2, 3])).shape == (2, 3)
    # 4 PiB: beyond the address space, so no allocator (nor overcommit) can grant it
    with pytest.raises(DNNCError, match="4.00 PiB") as info:
        model(np.array([1 << 25, 1 << 25]))
    # the numpy target names the node; a compiled one the allocation that failed
    assert "'cos'" in str(info.value) or isinstance(info.value, OutOfMemoryError)
