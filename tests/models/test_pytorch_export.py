"""Files written by PyTorch's two ONNX exporters (TorchScript and dynamo) import and run.

These carry what the zoo does not: the shape arithmetic the exporters emit
(Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and dynamic axes. Needs the optional
`torch` and `onnxscript` packages (`pip install torch==2.13.0 onnxscript`); skipped without them.
"""

import warnings

import numpy as np
import pytest

import dnnc

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")


class Block(torch.nn.Module):
    """A transformer block written the way users write them: view by x.shape, split, softmax."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = self.norm(x + self.proj(att.transpose(1, 2).reshape(b, t, d)))
        return x + self.ffn(x)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.ReLU6(),
            torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def _randomize_bn(model):
    gen = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return model.eval()


def _export(model, example, dynamic, path, dynamo):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            shapes = {"x": {i: torch.export.Dim(name) for i, name in dynamic.items()}}
            torch.onnx.export(model, (example,), str(path), dynamo=True, input_names=["x"],
                              output_names=["y"], dynamic_shapes=shapes, verbose=False)
        else:
            torch.onnx.export(model, (example,), str(path), dynamo=False, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": dynamic},
                              opset_version=17)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("name,make,example_shape,dynamic,run_shapes", [
    ("block", lambda: Block().eval(), (2, 5, 32), {0: "batch", 1: "seq"},
     [(1, 7, 32), (3, 4, 32)]),
    ("convnet", lambda: _randomize_bn(ConvNet()), (2, 3, 16, 16), {0: "batch"},
     [(1, 3, 16, 16), (3, 3, 16, 16)]),
])
def test_exported_model_matches_torch(rng, tmp_path, name, make, example_shape, dynamic,
                                      run_shapes, dynamo):
    torch.manual_seed(0)
    model = make()
    path = tmp_path / f"{name}.onnx"
    _export(model, torch.randn(*example_shape), dynamic, path, dynamo)
    compiled = dnnc.compile(str(path), target="numpy")
    # dynamic axes stay symbolic: no dim of the output is fixed to the example's size
    out_shape = compiled.output_types[0].shape
    assert isinstance(out_shape[0], str), compiled
    for shape in run_shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(compiled(x), expected, rtol=1e-4, atol=1e-5)
