"""Architectures written in PyTorch and exported by torch's own ONNX exporters, for benchmarks.

    python bench/torch_models.py OUT_DIR [--models gpt2_small,...] [--exporter torchscript|dynamo]

The zoo writes its ONNX itself; real users bring files that torch's exporters wrote (the
Shape/Gather/Concat shape arithmetic, Erf-based GELU, LayerNormalization or its expansion,
Hardswish, SE blocks, ...). torchvision and transformers are not installable beside the CPU
torch build here, so the architectures are written out in plain torch, with the layer shapes of
the originals at reduced depth, random weights (seeded) and batch-norm statistics randomised so
folding them is not a no-op. Needs the optional `torch` and `onnxscript` packages
(`pip install torch==2.13.0 onnxscript`); never a dependency of dnnc.

`bench/cpu.py --models OUT_DIR/gpt2_small.onnx,...` benchmarks the files next to the zoo.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from torch import nn


class DecoderBlock(nn.Module):
    """A GPT-2 block: pre-norm causal self-attention and a GELU MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT2(nn.Module):
    """GPT-2 small's widths (768, 12 heads) at 2 layers; token + position embeddings."""

    def __init__(self, vocab=5000, d=768, heads=12, layers=2, seq=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[DecoderBlock(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos(positions))))


def conv_bn(cin, cout, k, stride=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * nn.functional.hardsigmoid(self.fc2(nn.functional.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand 1x1, depthwise kxk, optional SE, project 1x1."""

    def __init__(self, cin, exp, cout, k, stride, se, act):
        super().__init__()
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            conv_bn(cin, exp, 1, act=act), conv_bn(exp, exp, k, stride, groups=exp, act=act),
            SqueezeExcite(exp) if se else nn.Identity(), conv_bn(exp, cout, 1, act=None))

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV3Small(nn.Module):
    """mobilenet_v3_small's layer table (torchvision), Hardswish and SE included."""

    CONFIG = [  # cin, expand, cout, kernel, stride, se, activation
        (16, 16, 16, 3, 2, True, nn.ReLU), (16, 72, 24, 3, 2, False, nn.ReLU),
        (24, 88, 24, 3, 1, False, nn.ReLU), (24, 96, 40, 5, 2, True, nn.Hardswish),
        (40, 240, 40, 5, 1, True, nn.Hardswish), (40, 240, 40, 5, 1, True, nn.Hardswish),
        (40, 120, 48, 5, 1, True, nn.Hardswish), (48, 144, 48, 5, 1, True, nn.Hardswish),
        (48, 288, 96, 5, 2, True, nn.Hardswish), (96, 576, 96, 5, 1, True, nn.Hardswish),
        (96, 576, 96, 5, 1, True, nn.Hardswish)]

    def __init__(self, classes=1000):
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.Hardswish)
        self.blocks = nn.Sequential(*[InvertedResidual(*c) for c in self.CONFIG])
        self.last = conv_bn(96, 576, 1, act=nn.Hardswish)
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x):
        x = self.last(self.blocks(self.stem(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, act=None))
        self.short = (conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout
                      else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class ResNet18(nn.Module):
    """torchvision's resnet18 layout: 7x7 stem, max pool, 4 stages of 2 basic blocks."""

    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ViTTiny(nn.Module):
    """vit_tiny_patch16_224's widths (192, 3 heads) at 4 layers: patch conv, class token,
    pre-norm encoder blocks with erf GELU."""

    def __init__(self, d=192, heads=3, layers=4, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 16, 16)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 197, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


# name: (constructor, example input, dynamic axes of the input)
MODELS = {
    "gpt2_small": (GPT2, lambda: torch.randint(0, 5000, (1, 64)), {0: "batch"}),
    "mobilenet_v3_small": (MobileNetV3Small, lambda: torch.randn(1, 3, 224, 224), {0: "batch"}),
    "resnet18_torch": (ResNet18, lambda: torch.randn(1, 3, 224, 224), {0: "batch"}),
    "vit_tiny": (ViTTiny, lambda: torch.randn(1, 3, 224, 224), {0: "batch"}),
}


def randomize_batchnorm(model: nn.Module, gen: torch.Generator) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return model


def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    """Model `name` with its seeded weights (in eval mode) and an example input: the same
    weights every call, so an export and a module built later (bench/gpu_torch.py) agree."""
    make, example, _ = MODELS[name]
    gen = torch.manual_seed(0)
    model = randomize_batchnorm(make(), gen).eval()
    return model, example()


def export(name: str, path: Path, exporter: str = "torchscript") -> Path:
    """Export model `name` (seeded weights) to `path` with one of torch's exporters."""
    model, x = build(name)
    return export_module(model, x, path, exporter, MODELS[name][2])


def export_module(model: nn.Module, x: torch.Tensor, path: Path, exporter: str,
                  dynamic: dict) -> Path:
    """`model` called on `x` exported to `path` by torch's `exporter` ("torchscript" or
    "dynamo"), the input's axes in `dynamic` ({axis: name}) symbolic."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            if 0 in dynamic and x.shape[0] == 1:
                # torch.export specializes a dimension of size 1: an example of batch 1
                # would fix the batch axis whatever dynamic_shapes says
                x = torch.cat([x, x])
            # a tuple, by position: a dict must use forward()'s own argument names
            shapes = ({axis: torch.export.Dim(dim) for axis, dim in dynamic.items()},)
            torch.onnx.export(model, (x,), str(path), dynamo=True, input_names=["x"],
                              output_names=["y"], dynamic_shapes=shapes, verbose=False)
        else:
            torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": dynamic},
                              opset_version=17)
    return path


def export_all(models: dict, export, folder: Path, exporter: str, names=None,
               suffix: str = "") -> list[str]:
    """Each model of `names` (default: every one of `models`) exported into `folder` once by
    `export(name, path, exporter)`, as NAME`suffix`.onnx; one that cannot be built or exported here is reported in
    one line and left out, and one whose export failed is remembered (NAME.failed) and not
    tried again (a missing library is not remembered: it may be installed later)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or models:
        path = folder / f"{name}{suffix}.onnx"
        failed = path.with_suffix(".failed")
        if failed.exists():
            print(f"# {name}: not exported ({failed.read_text().strip()})", flush=True)
            continue
        if not path.exists():
            print(f"# exporting {name} with torch's {exporter} exporter", flush=True)
            try:
                export(name, path.with_suffix(".tmp"), exporter)
            except Exception as exc:   # noqa: BLE001 - a library missing or an exporter bug
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                print(f"# {name}: not exported ({why})", flush=True)
                if not isinstance(exc, ImportError):
                    failed.write_text(why + "\n")
                continue
            path.with_suffix(".tmp").rename(path)
        paths.append(str(path))
    return paths


def cli(models: dict, export, doc: str) -> None:
    """`python bench/<module>.py OUT_DIR [--models a,b] [--exporter torchscript|dynamo]`:
    the models exported into OUT_DIR (a dynamo export's name ends in _dynamo), their paths
    printed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default=",".join(models))
    parser.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript")
    args = parser.parse_args()
    suffix = "" if args.exporter == "torchscript" else "_dynamo"
    for path in export_all(models, export, args.out, args.exporter, args.models.split(","),
                           suffix):
        print(path)


if __name__ == "__main__":
    cli(MODELS, export, __doc__)
