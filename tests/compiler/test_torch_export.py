"""The ahead-of-time path: `dnnc.compile(torch.export.export(...))` (`frontend/torch_export.py`)
against eager on seeded random inputs: a residual CNN, a transformer block, a batch declared
dynamic with torch.export.Dim, artifacts saved and loaded, programs dnnc refuses. Skips
without torch."""

import numpy as np
import pytest

import dnnc
from dnnc.errors import ArgumentError, CompileError, UnsupportedOpError

torch = pytest.importorskip("torch")
nn = torch.nn

from torch_modules import Block, ResNetLike, randomize_batch_norm  # noqa: E402


def exported(module, *inputs, dynamic_shapes=None):
    return torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes)


def eager(module, *inputs) -> np.ndarray:
    with torch.no_grad():
        return module(*inputs).numpy()


def test_resnet_like_program_matches_eager_with_weights_as_constants():
    torch.manual_seed(0)
    model = randomize_batch_norm(ResNetLike())
    x = torch.randn(2, 3, 32, 32)
    compiled = dnnc.compile(exported(model, x), "llvm", cache=False)
    assert compiled.input_names == ["x"]   # the weights are constants, not inputs
    assert compiled.output_types[0].shape == (2, 10)
    np.testing.assert_allclose(compiled(x), eager(model, x), rtol=1e-4, atol=1e-5)
    # a second random input through the same compile: no value of the first is baked in
    x = torch.randn(2, 3, 32, 32)
    np.testing.assert_allclose(compiled(x.numpy()), eager(model, x), rtol=1e-4, atol=1e-5)


def test_transformer_block_program_matches_eager():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 7, 32)
    compiled = dnnc.compile(exported(block, x), "llvm", cache=False)
    np.testing.assert_allclose(compiled(x), eager(block, x), rtol=1e-4, atol=1e-5)


def test_non_persistent_buffers_and_tensor_constants_are_constants():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.register_buffer("scale", torch.linspace(0.5, 2, 6), persistent=False)
            self.offset = torch.arange(6.0)   # neither parameter nor buffer: a constant

        def forward(self, x):
            return self.fc(x) * self.scale + self.offset

    torch.manual_seed(0)
    module = Scaled()
    x = torch.randn(3, 6)
    compiled = dnnc.compile(exported(module, x), "llvm", cache=False)
    assert compiled.input_names == ["x"]
    np.testing.assert_allclose(compiled(x), eager(module, x), rtol=1e-5, atol=1e-6)


def test_a_dynamic_batch_is_a_symbolic_dim_and_one_compile_runs_every_size():
    torch.manual_seed(0)
    block = Block()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = exported(block, torch.randn(2, 7, 32), dynamic_shapes=({0: batch},))
    compiled = dnnc.compile(program, "llvm", cache=False)
    (dims,) = [t.shape for t in compiled.input_types]
    assert isinstance(dims[0], str) and dims[1:] == (7, 32)
    assert compiled.output_types[0].shape[0] == dims[0]
    for size in (1, 3, 6):
        x = torch.randn(size, 7, 32)
        np.testing.assert_allclose(compiled(x), eager(block, x), rtol=1e-4, atol=1e-5)


def test_dynamic_batch_and_length():
    torch.manual_seed(0)
    block = Block()
    dims = {0: torch.export.Dim("batch", max=16), 1: torch.export.Dim("length", max=128)}
    program = exported(block, torch.randn(2, 7, 32), dynamic_shapes=(dims,))
    compiled = dnnc.compile(program, "llvm", cache=False)
    assert [type(d) for d in compiled.input_types[0].shape] == [str, str, int]
    for size, length in ((3, 5), (1, 11)):
        x = torch.randn(size, length, 32)
        np.testing.assert_allclose(compiled(x), eager(block, x), rtol=1e-4, atol=1e-5)


def test_artifacts_save_and_load_as_an_onnx_models_do(tmp_path):
    torch.manual_seed(0)
    model = randomize_batch_norm(ResNetLike())
    batch = torch.export.Dim("batch", max=32)
    program = exported(model, torch.randn(2, 3, 32, 32), dynamic_shapes=({0: batch},))
    compiled = dnnc.compile(program, "llvm", cache=False)
    compiled.save(tmp_path / "resnet.dnnc")
    loaded = dnnc.load(tmp_path / "resnet.dnnc")
    assert loaded.input_types == compiled.input_types
    x = torch.randn(3, 3, 32, 32)
    np.testing.assert_allclose(loaded(x), eager(model, x), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(loaded(x), compiled(x))


def test_a_program_that_writes_a_buffer_is_refused():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return x * self.calls

    with pytest.raises(CompileError, match="writes calls"):
        dnnc.compile(exported(Counting(), torch.randn(3)), "llvm", cache=False)


def test_every_op_dnnc_does_not_import_is_named():
    class Sorting(nn.Module):
        def forward(self, x):
            return torch.sort(torch.relu(x)).values + torch.cumprod(x, 0)

    with pytest.raises(UnsupportedOpError, match=r"(?s)aten.sort.default.*aten.cumprod"):
        dnnc.compile(exported(Sorting(), torch.randn(3, 4)), "llvm", cache=False)


def test_input_shapes_are_refused_for_a_program():
    program = exported(nn.Linear(4, 2), torch.randn(3, 4))
    with pytest.raises(ArgumentError, match="torch.export.Dim"):
        dnnc.compile(program, "llvm", input_shapes={"input": (5, 4)})
