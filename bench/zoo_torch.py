"""PyTorch mirrors of dnnc's zoo, running the zoo's own weights: bench/gpu.py's torch columns.

`module_for(model)` takes a model `dnnc.zoo` built and returns an `nn.Module` (eval mode) that
computes the same function from ordinary torch layers: nn.Conv2d, nn.BatchNorm2d (eval, not
folded: the zoo keeps BatchNormalization), nn.Linear, nn.LayerNorm, nn.Embedding, and BERT's
attention written out as the zoo writes it (MatMul, Div by sqrt(head_dim), the additive
`(1 - mask) * -10000`, Softmax, MatMul: Hugging Face's eager attention; torch.compile's own
attention pattern pass may turn it into F.scaled_dot_product_attention, eager runs it as
written) with exact (erf) GELU. Its inputs are the ONNX graph's inputs in order: `input` for
the vision models and the MLP; `input_ids`, `token_type_ids`, `attention_mask` (int64) for
BERT, or `hidden_states` when it was built without embeddings.

The architecture comes from the builder's name and config the zoo records in the model's
metadata (`dnnc.zoo.model`, `dnnc.zoo.config`); the weights come from the ONNX initializers by
name, which the mirror rebuilds in the builder's own order (`conv_0`, `bn_0`, ... are numbered
as `_ModelBuilder.fresh` numbers them); each normalisation takes its epsilon from its node.
Loading refuses a shape mismatch, a conv or Gemm whose node disagrees with the mirror (kernel,
strides, pads, groups, transB) and any learned initializer left unused, so a zoo change the
mirror does not follow fails loudly instead of benchmarking another network. Needs torch;
never imported by dnnc.
"""

from __future__ import annotations

import json
import math
from typing import Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper
from torch import nn

# the zoo's metadata keys and its channel rounding, shared so that the mirror cannot drift
from dnnc.zoo import _META_PREFIX, _make_divisible

# initializers that are graph constants, not weights: the zoo's shared scalars (`const_N`, used
# as the literals the mirror writes: 0, 6, sqrt(2), sqrt(head_dim), -10000, ...) and BERT's
# reshape targets and mask axes
_CONSTANTS = {"split_heads_shape", "merge_heads_shape", "mask_axes"}


class _Weights:
    """The zoo model's initializers and node attributes, handed out to torch layers by name."""

    def __init__(self, model: onnx.ModelProto):
        self.arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.attrs = {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute}
                      for n in model.graph.node}
        self.used: set[str] = set()
        self._counts: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        """The next name `_ModelBuilder.fresh(hint)` gave, when layers are made in its order."""
        n = self._counts.get(hint, 0)
        self._counts[hint] = n + 1
        return f"{hint}_{n}"

    def array(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise ValueError(f"the zoo model has no initializer {name!r}")
        return self.arrays[name]

    def load(self, param: torch.Tensor, name: str, transpose: bool = False) -> None:
        array = self.array(name).T if transpose else self.array(name)
        if tuple(array.shape) != tuple(param.shape):
            raise ValueError(f"initializer {name!r} has shape {tuple(array.shape)}, the mirror's "
                             f"layer {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(torch.from_numpy(array.copy()))
        self.used.add(name)

    def buffer(self, name: str) -> torch.Tensor:
        """A constant the module keeps as a buffer (BERT's position ids)."""
        array = self.array(name)
        self.used.add(name)
        return torch.from_numpy(array.copy())

    def node(self, name: str) -> dict:
        """The attributes of node `name`."""
        if name not in self.attrs:
            raise ValueError(f"the zoo model has no node {name!r}")
        return self.attrs[name]

    def check_node(self, name: str, **expected) -> None:
        attrs = self.node(name)
        for key, value in expected.items():
            if attrs.get(key) != value:
                raise ValueError(f"node {name!r}: {key} is {attrs.get(key)!r}, the mirror "
                                 f"assumes {value!r}")

    def finish(self) -> None:
        learned = {n for n in self.arrays if n not in _CONSTANTS and not n.startswith("const_")}
        unused = sorted(learned - self.used)
        if unused:
            raise ValueError(f"the mirror leaves initializers unused: {', '.join(unused[:8])}"
                             f"{' ...' if len(unused) > 8 else ''}")

    # -- layers, as _ModelBuilder writes them ---------------------------------------------------

    def conv(self, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
             bias: bool = False) -> nn.Conv2d:
        name = self.fresh("conv")
        p = k // 2
        layer = nn.Conv2d(cin, cout, k, stride, p, groups=group, bias=bias)
        self.check_node(name, kernel_shape=[k, k], strides=[stride, stride], pads=[p, p, p, p],
                        dilations=[1, 1], group=group)
        self.load(layer.weight, f"{name}.weight")
        if bias:
            self.load(layer.bias, f"{name}.bias")
        return layer

    def batchnorm(self, c: int) -> nn.BatchNorm2d:
        name = self.fresh("bn")
        layer = nn.BatchNorm2d(c, eps=self.node(name).get("epsilon", 1e-5))   # ONNX's default
        for field in ("weight", "bias", "running_mean", "running_var"):
            self.load(getattr(layer, field), f"{name}.{field}")
        return layer

    def linear_head(self, cin: int, cout: int, name: str | None = None) -> nn.Linear:
        """Gemm with transB: the initializer is nn.Linear's [out, in] weight."""
        name = name or self.fresh("fc")
        layer = nn.Linear(cin, cout)
        self.check_node(name, transB=1)
        self.load(layer.weight, f"{name}.weight")
        self.load(layer.bias, f"{name}.bias")
        return layer

    def linear(self, cin: int, cout: int, name: str) -> nn.Linear:
        """MatMul by an [in, out] initializer, then Add: nn.Linear's weight is its transpose."""
        layer = nn.Linear(cin, cout)
        self.load(layer.weight, f"{name}.weight", transpose=True)
        self.load(layer.bias, f"{name}.bias")
        return layer

    def layernorm(self, c: int, name: str) -> nn.LayerNorm:
        self.check_node(name, axis=-1)
        layer = nn.LayerNorm(c, eps=self.node(name).get("epsilon", 1e-5))   # ONNX's default
        self.load(layer.weight, f"{name}.weight")
        self.load(layer.bias, f"{name}.bias")
        return layer

    def embedding(self, name: str) -> nn.Embedding:
        layer = nn.Embedding(*self.array(name).shape)
        self.load(layer.weight, name)
        return layer


class _ClassifierTail(nn.Sequential):
    """GlobalAveragePool -> Flatten -> Gemm."""

    def __init__(self, w: _Weights, channels: int, classes: int):
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
                         w.linear_head(channels, classes, name="fc"))


def _mlp(w: _Weights, in_features: int, hidden: list[int], classes: int, **_) -> nn.Module:
    layers: list[nn.Module] = []
    width = in_features
    for h in hidden:
        layers += [w.linear_head(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, w.linear_head(width, classes, name="head"))


def _cnn(w: _Weights, channels: int, width: int, classes: int, **_) -> nn.Module:
    layers: list[nn.Module] = []
    cin = channels
    for stage, cout in enumerate((width, 2 * width, 4 * width)):
        layers.append(w.conv(cin, cout, 3, bias=stage == 2))
        if stage < 2:
            layers.append(w.batchnorm(cout))
        layers.append(nn.ReLU())
        if stage < 2:
            layers.append(nn.MaxPool2d(2, 2))
        cin = cout
    return nn.Sequential(*layers, _ClassifierTail(w, cin, classes))


class _Residual(nn.Module):
    """relu(body(x) + shortcut(x)), ResNet's block around its body."""

    def __init__(self, body: nn.Module, shortcut: nn.Module):
        super().__init__()
        self.body, self.shortcut = body, shortcut

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def _shortcut(w: _Weights, cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(w.conv(cin, cout, 1, stride), w.batchnorm(cout))


def _basic_block(w: _Weights, cin: int, planes: int, stride: int) -> tuple[nn.Module, int]:
    body = nn.Sequential(w.conv(cin, planes, 3, stride), w.batchnorm(planes), nn.ReLU(),
                         w.conv(planes, planes, 3), w.batchnorm(planes))
    return _Residual(body, _shortcut(w, cin, planes, stride)), planes


def _bottleneck(w: _Weights, cin: int, planes: int, stride: int) -> tuple[nn.Module, int]:
    cout = 4 * planes
    body = nn.Sequential(w.conv(cin, planes, 1), w.batchnorm(planes), nn.ReLU(),
                         w.conv(planes, planes, 3, stride), w.batchnorm(planes), nn.ReLU(),
                         w.conv(planes, cout, 1), w.batchnorm(cout))
    return _Residual(body, _shortcut(w, cin, cout, stride)), cout


def _resnet(w: _Weights, layers: list[int], bottleneck: bool, width: int, classes: int,
            **_) -> nn.Module:
    stem = [w.conv(3, width, 7, 2), w.batchnorm(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    block = _bottleneck if bottleneck else _basic_block
    blocks, cin = [], width
    for stage, count in enumerate(layers):
        for i in range(count):
            module, cin = block(w, cin, width * 2 ** stage, 2 if stage > 0 and i == 0 else 1)
            blocks.append(module)
    return nn.Sequential(*stem, *blocks, _ClassifierTail(w, cin, classes))


class _InvertedResidual(nn.Module):
    def __init__(self, body: nn.Module, residual: bool):
        super().__init__()
        self.body, self.residual = body, residual

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def _mobilenet_v2(w: _Weights, width_mult: float, classes: int, **_) -> nn.Module:
    cin = _make_divisible(32 * width_mult)
    layers = [w.conv(3, cin, 3, 2), w.batchnorm(cin), nn.ReLU6()]
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        cout = _make_divisible(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            body = []
            if t != 1:
                body += [w.conv(cin, hidden, 1), w.batchnorm(hidden), nn.ReLU6()]
            body += [w.conv(hidden, hidden, 3, stride, group=hidden), w.batchnorm(hidden),
                     nn.ReLU6(), w.conv(hidden, cout, 1), w.batchnorm(cout)]
            layers.append(_InvertedResidual(nn.Sequential(*body), stride == 1 and cin == cout))
            cin = cout
    last = _make_divisible(1280 * max(1.0, width_mult))
    layers += [w.conv(cin, last, 1), w.batchnorm(last), nn.ReLU6()]
    return nn.Sequential(*layers, _ClassifierTail(w, last, classes))


class _BertLayer(nn.Module):
    """One encoder layer, post-norm, attention as the zoo writes it."""

    def __init__(self, w: _Weights, p: str, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = w.linear(hidden, hidden, f"{p}.attention.self.query")
        self.key = w.linear(hidden, hidden, f"{p}.attention.self.key")
        self.value = w.linear(hidden, hidden, f"{p}.attention.self.value")
        self.attention_output = w.linear(hidden, hidden, f"{p}.attention.output.dense")
        self.attention_norm = w.layernorm(hidden, f"{p}.attention.output.LayerNorm")
        self.intermediate = w.linear(hidden, intermediate, f"{p}.intermediate.dense")
        self.output = w.linear(intermediate, hidden, f"{p}.output.dense")
        self.output_norm = w.layernorm(hidden, f"{p}.output.LayerNorm")

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q = self.query(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        # k.transpose(-1, -2), not the zoo's one permute(0, 2, 3, 1): the same values, and
        # inductor's attention pattern (torch 2.13) mistakes that permute for this transpose
        # of the unpermuted key, then fails to compile
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = self.attention_norm(self.attention_output(ctx) + x)
        h = self.output(F.gelu(self.intermediate(x)))   # exact GELU: the zoo's Erf form
        return self.output_norm(h + x)


class _BertEncoder(nn.Module):
    """The layers alone: `hidden_states` in (a zoo BERT built with embeddings=False)."""

    def __init__(self, w: _Weights, layers: int, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.layers = nn.ModuleList(_BertLayer(w, f"encoder.layer.{i}", hidden, heads,
                                               intermediate) for i in range(layers))

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return x


class _Bert(nn.Module):
    """Embeddings (word + token type, then + position; LayerNorm) and the encoder."""

    def __init__(self, w: _Weights, encoder: _BertEncoder, hidden: int):
        super().__init__()
        self.words = w.embedding("embeddings.word_embeddings")
        self.positions = w.embedding("embeddings.position_embeddings")
        self.types = w.embedding("embeddings.token_type_embeddings")
        self.register_buffer("position_ids", w.buffer("embeddings.position_ids"))
        self.norm = w.layernorm(hidden, "embeddings.LayerNorm")
        self.encoder = encoder

    def forward(self, input_ids, token_type_ids, attention_mask):
        x = self.words(input_ids) + self.types(token_type_ids)
        x = self.norm(x + self.positions(self.position_ids))
        # (1 - mask) * -10000, broadcast over heads and query positions, in the embeddings'
        # type (float16 where the module was made half)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        return self.encoder(x, mask)


def _bert(w: _Weights, layers: int, hidden: int, heads: int, intermediate: int,
          embeddings: bool, **_) -> nn.Module:
    encoder = _BertEncoder(w, layers, hidden, heads, intermediate)
    return _Bert(w, encoder, hidden) if embeddings else encoder


MIRRORS: dict[str, Callable[..., nn.Module]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "resnet18": _resnet,
    "resnet50": _resnet,
    "mobilenet_v2": _mobilenet_v2,
    "bert": _bert,
    "bert_tiny": _bert,
    "bert_base": _bert,
}
"""Zoo model name (its builder's `name`, as recorded) -> mirror(weights, **config)."""


def module_for(model: onnx.ModelProto) -> nn.Module:
    """The torch mirror of zoo model `model`, holding its weights, in eval mode.

    Raises ValueError for a model the zoo did not build or one without a mirror."""
    meta = {p.key[len(_META_PREFIX):]: p.value for p in model.metadata_props
            if p.key.startswith(_META_PREFIX)}
    if "model" not in meta or "config" not in meta:
        raise ValueError("not a dnnc zoo model (no dnnc.zoo.model / dnnc.zoo.config metadata)")
    name = meta["model"]
    if name not in MIRRORS:
        raise ValueError(f"no torch mirror of zoo model {name!r}; mirrored: "
                         f"{', '.join(MIRRORS)}")
    weights = _Weights(model)
    module = MIRRORS[name](weights, **json.loads(meta["config"]))
    weights.finish()
    return module.eval()
