"""Standard architectures built as ONNX models with seeded random weights.

For examples, tests and benchmarks: `build("resnet50", batch=1)` gives an `onnx.ModelProto` that
onnxruntime runs, written the way exporters write it (PyTorch's Gemm with transB for Linear
heads, Clip for ReLU6, grouped Conv for depthwise, BERT attention as MatMul / Reshape /
Transpose / Softmax, LayerNormalization, GELU through Erf). Weights are scaled (He init for
convolutions, 1/sqrt(fan_in) for linear layers) and BatchNormalization statistics are random
too, so activations stay O(1) through deep nets and no result is trivially zero.

A builder's `batch` is an int or a string (a symbolic batch dim, e.g. "N"); `float16(model)`
gives a model's float16 file. This module depends only on onnx and numpy (and the optional
onnxconverter_common for `float16`): it must never import the rest of dnnc.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17          # the first opset with LayerNormalization
IR_VERSION = 8      # what opset 17 shipped with: every onnxruntime since 1.12 loads it

_META_PREFIX = "dnnc.zoo."


class _ModelBuilder:
    """Collects nodes and seeded initializers; names every value after its layer."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[tuple[str, np.ndarray]] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.metadata: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._scalars: dict[tuple, str] = {}

    def fresh(self, hint: str) -> str:
        n = self._counts.get(hint, 0)
        self._counts[hint] = n + 1
        return f"{hint}_{n}"

    # -- values --------------------------------------------------------------------------------

    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, elem_type: int, shape: list) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def param(self, name: str, array: np.ndarray) -> str:
        array = np.asarray(array)
        # (not np.ascontiguousarray: it turns a 0-d scalar into shape [1])
        self.initializers.append((name, array if array.flags.c_contiguous else array.copy()))
        return name

    def scalar(self, value, dtype=np.float32) -> str:
        """A 0-d initializer, shared by every node that needs the same constant."""
        key = (float(value), np.dtype(dtype).name)
        if key not in self._scalars:
            self._scalars[key] = self.param(self.fresh("const"), np.array(value, dtype))
        return self._scalars[key]

    def weight(self, name: str, shape: tuple, std: float) -> str:
        array = self.rng.standard_normal(shape, np.float32)
        array *= np.float32(std)
        return self.param(name, array)

    def node(self, op: str, inputs: list[str], name: str | None = None, out: str | None = None,
             **attrs) -> str:
        name = name or self.fresh(op.lower())
        out = out or name
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    # -- layers --------------------------------------------------------------------------------

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
             bias: bool = False, gain: float = 2.0, name: str | None = None) -> str:
        """Conv with He-scaled weights (gain 2 for a ReLU after it), padding k // 2."""
        name = name or self.fresh("conv")
        fan_in = cin // group * k * k
        inputs = [x, self.weight(f"{name}.weight", (cout, cin // group, k, k),
                                 math.sqrt(gain / fan_in))]
        if bias:
            inputs.append(self.weight(f"{name}.bias", (cout,), 0.1))
        p = k // 2
        return self.node("Conv", inputs, name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[p, p, p, p], dilations=[1, 1], group=group)

    def batchnorm(self, x: str, c: int, scale: tuple[float, float] = (0.5, 1.5)) -> str:
        """Inference BatchNormalization with random scale, bias, running mean and variance."""
        name = self.fresh("bn")
        rng = self.rng
        gamma = self.param(f"{name}.weight", rng.uniform(*scale, c).astype(np.float32))
        beta = self.param(f"{name}.bias", (0.1 * rng.standard_normal(c)).astype(np.float32))
        mean = self.param(f"{name}.running_mean",
                          (0.1 * rng.standard_normal(c)).astype(np.float32))
        var = self.param(f"{name}.running_var", rng.uniform(0.5, 1.5, c).astype(np.float32))
        return self.node("BatchNormalization", [x, gamma, beta, mean, var], name,
                         epsilon=1e-5, momentum=0.9)

    def relu(self, x: str) -> str:
        return self.node("Relu", [x])

    def relu6(self, x: str) -> str:
        return self.node("Clip", [x, self.scalar(0.0), self.scalar(6.0)])

    def linear_head(self, x: str, cin: int, cout: int, out: str | None = None,
                    name: str | None = None) -> str:
        """PyTorch's nn.Linear on a 2-D input as its exporter writes it: Gemm with transB."""
        name = name or self.fresh("fc")
        w = self.weight(f"{name}.weight", (cout, cin), 1 / math.sqrt(cin))
        b = self.weight(f"{name}.bias", (cout,), 0.1)
        return self.node("Gemm", [x, w, b], name, out=out, alpha=1.0, beta=1.0, transB=1)

    def linear(self, x: str, cin: int, cout: int, name: str) -> str:
        """nn.Linear on a 3-D input as exporters write it: MatMul by [in, out], then Add."""
        w = self.weight(f"{name}.weight", (cin, cout), 1 / math.sqrt(cin))
        b = self.weight(f"{name}.bias", (cout,), 0.1)
        return self.node("Add", [self.node("MatMul", [x, w], f"{name}.matmul"), b],
                         f"{name}.add")

    def layernorm(self, x: str, c: int, name: str, eps: float) -> str:
        rng = self.rng
        scale = self.param(f"{name}.weight",
                           (1 + 0.1 * rng.standard_normal(c)).astype(np.float32))
        bias = self.param(f"{name}.bias", (0.1 * rng.standard_normal(c)).astype(np.float32))
        return self.node("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=eps)

    # -- finishing -----------------------------------------------------------------------------

    def finish(self, config: dict) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="dnnc.zoo", ir_version=IR_VERSION)
        # written in place: make_graph/make_model would copy BERT-Base's 440 MB twice
        for name, array in self.initializers:
            tensor = model.graph.initializer.add()
            tensor.name = name
            tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            tensor.dims.extend(array.shape)
            tensor.raw_data = array.tobytes()
        model.doc_string = f"dnnc zoo model {self.name} with seeded random weights"
        meta = {"model": self.name, "config": json.dumps(config, sort_keys=True, default=str)}
        meta.update(self.metadata)
        helper.set_model_props(model, {_META_PREFIX + k: v for k, v in meta.items()})
        return model


def _check_batch(batch) -> None:
    if isinstance(batch, bool) or not isinstance(batch, (int, str)) or batch == "" or (
            isinstance(batch, int) and batch < 1):
        raise ValueError(f"batch must be a positive int or a symbolic name, not {batch!r}")


def _classifier_tail(b: _ModelBuilder, x: str, channels: int, classes: int, batch) -> None:
    """GlobalAveragePool -> Flatten -> Gemm, the head every torchvision classifier exports."""
    x = b.node("GlobalAveragePool", [x])
    x = b.node("Flatten", [x], axis=1)
    b.linear_head(x, channels, classes, out="logits", name="fc")
    b.output("logits", TensorProto.FLOAT, [batch, classes])


# ---------------------------------------------------------------------------------------------
# Models


def mlp(batch=1, in_features: int = 784, hidden=(256, 128), classes: int = 10,
        seed: int = 0) -> onnx.ModelProto:
    """A multi-layer perceptron: (Gemm -> Relu) per hidden layer, then a Gemm to the logits."""
    _check_batch(batch)
    hidden = (hidden,) if isinstance(hidden, int) else tuple(hidden)
    b = _ModelBuilder("mlp", seed)
    x = b.input("input", TensorProto.FLOAT, [batch, in_features])
    width = in_features
    for h in hidden:
        x = b.relu(b.linear_head(x, width, h))
        width = h
    b.linear_head(x, width, classes, out="logits", name="head")
    b.output("logits", TensorProto.FLOAT, [batch, classes])
    return b.finish(dict(in_features=in_features, hidden=list(hidden), classes=classes,
                         seed=seed, batch=batch))


def cnn(batch=1, channels: int = 3, size: int = 32, width: int = 16, classes: int = 10,
        seed: int = 0) -> onnx.ModelProto:
    """A small CNN: three Conv stages (BatchNorm, Relu, MaxPool), global pooling, a Gemm."""
    _check_batch(batch)
    b = _ModelBuilder("cnn", seed)
    x = b.input("input", TensorProto.FLOAT, [batch, channels, size, size])
    cin = channels
    for stage, cout in enumerate((width, 2 * width, 4 * width)):
        x = b.conv(x, cin, cout, 3, bias=stage == 2)
        if stage < 2:
            x = b.batchnorm(x, cout)
        x = b.relu(x)
        if stage < 2:
            x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        cin = cout
    _classifier_tail(b, x, cin, classes, batch)
    return b.finish(dict(channels=channels, size=size, width=width, classes=classes, seed=seed,
                         batch=batch))


def _basic_block(b: _ModelBuilder, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]:
    out = b.relu(b.batchnorm(b.conv(x, cin, planes, 3, stride), planes))
    # a small last-BN scale keeps the residual stream's variance bounded with depth
    out = b.batchnorm(b.conv(out, planes, planes, 3), planes, scale=(0.2, 0.5))
    if stride != 1 or cin != planes:
        x = b.batchnorm(b.conv(x, cin, planes, 1, stride, gain=1.0), planes)
    return b.relu(b.node("Add", [out, x])), planes


def _bottleneck(b: _ModelBuilder, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]:
    """torchvision's ResNet v1.5 bottleneck: the stride sits on the 3x3 conv."""
    cout = 4 * planes
    out = b.relu(b.batchnorm(b.conv(x, cin, planes, 1), planes))
    out = b.relu(b.batchnorm(b.conv(out, planes, planes, 3, stride), planes))
    out = b.batchnorm(b.conv(out, planes, cout, 1), cout, scale=(0.1, 0.3))
    if stride != 1 or cin != cout:
        x = b.batchnorm(b.conv(x, cin, cout, 1, stride, gain=1.0), cout)
    return b.relu(b.node("Add", [out, x])), cout


def resnet(batch=1, layers=(2, 2, 2, 2), bottleneck: bool = False, size: int = 224,
           width: int = 64, classes: int = 1000, seed: int = 0,
           name: str = "resnet") -> onnx.ModelProto:
    """ResNet (He et al. 2016) as torchvision builds it, BatchNorm kept unfolded."""
    _check_batch(batch)
    b = _ModelBuilder(name, seed)
    x = b.input("input", TensorProto.FLOAT, [batch, 3, size, size])
    x = b.relu(b.batchnorm(b.conv(x, 3, width, 7, 2), width))
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    block = _bottleneck if bottleneck else _basic_block
    cin = width
    for stage, count in enumerate(layers):
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            x, cin = block(b, x, cin, width * 2 ** stage, stride)
    _classifier_tail(b, x, cin, classes, batch)
    return b.finish(dict(layers=list(layers), bottleneck=bottleneck, size=size, width=width,
                         classes=classes, seed=seed, batch=batch))


def resnet18(batch=1, **config) -> onnx.ModelProto:
    """ResNet-18: basic blocks 2-2-2-2 (11.7 M parameters at 1000 classes)."""
    return resnet(batch, layers=(2, 2, 2, 2), bottleneck=False, name="resnet18", **config)


def resnet50(batch=1, **config) -> onnx.ModelProto:
    """ResNet-50: bottleneck blocks 3-4-6-3 (25.6 M parameters at 1000 classes)."""
    return resnet(batch, layers=(3, 4, 6, 3), bottleneck=True, name="resnet50", **config)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: nearest multiple of 8, never 10% below `v`."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def mobilenet_v2(batch=1, size: int = 224, width_mult: float = 1.0, classes: int = 1000,
                 seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (Sandler et al. 2018): inverted residuals, depthwise grouped Conv, Clip as
    ReLU6, linear bottlenecks."""
    _check_batch(batch)
    b = _ModelBuilder("mobilenet_v2", seed)
    x = b.input("input", TensorProto.FLOAT, [batch, 3, size, size])
    cin = _make_divisible(32 * width_mult)
    x = b.relu6(b.batchnorm(b.conv(x, 3, cin, 3, 2), cin))
    # (expansion t, channels c, repeats n, first stride s), the paper's Table 2
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        cout = _make_divisible(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = b.relu6(b.batchnorm(b.conv(y, cin, hidden, 1), hidden))
            y = b.relu6(b.batchnorm(b.conv(y, hidden, hidden, 3, stride, group=hidden), hidden))
            y = b.batchnorm(b.conv(y, hidden, cout, 1, gain=1.0), cout,
                            scale=(0.2, 0.5) if stride == 1 and cin == cout else (0.5, 1.5))
            x = b.node("Add", [x, y]) if stride == 1 and cin == cout else y
            cin = cout
    last = _make_divisible(1280 * max(1.0, width_mult))
    x = b.relu6(b.batchnorm(b.conv(x, cin, last, 1), last))
    _classifier_tail(b, x, last, classes, batch)
    return b.finish(dict(size=size, width_mult=width_mult, classes=classes, seed=seed,
                         batch=batch))


def bert(batch=1, layers: int = 2, hidden: int = 128, heads: int = 2, seq: int = 128,
         intermediate: int | None = None, embeddings: bool = True, vocab: int = 30522,
         max_positions: int = 512, type_vocab: int = 2, eps: float = 1e-12,
         seed: int = 0, name: str = "bert") -> onnx.ModelProto:
    """A BERT encoder (Devlin et al. 2019) as Hugging Face's exporter writes it.

    With `embeddings`, the inputs are `input_ids`, `token_type_ids` and `attention_mask` (int64
    [batch, seq]); without, the input is `hidden_states` (float [batch, seq, hidden]) and no mask.
    The output is `last_hidden_state` [batch, seq, hidden].
    """
    _check_batch(batch)
    if not isinstance(seq, int) or seq < 1 or seq > max_positions:
        raise ValueError(f"seq must be an int in 1..{max_positions}, not {seq!r}")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    intermediate = intermediate or 4 * hidden
    head_dim = hidden // heads
    b = _ModelBuilder(name, seed)
    mask = None
    if embeddings:
        ids = b.input("input_ids", TensorProto.INT64, [batch, seq])
        types = b.input("token_type_ids", TensorProto.INT64, [batch, seq])
        mask_in = b.input("attention_mask", TensorProto.INT64, [batch, seq])
        b.metadata.update({"int_high.input_ids": str(vocab),
                           "int_high.token_type_ids": str(type_vocab),
                           "mask.attention_mask": "1"})
        words = b.weight("embeddings.word_embeddings", (vocab, hidden), 1.0)
        positions = b.weight("embeddings.position_embeddings", (max_positions, hidden), 1.0)
        type_table = b.weight("embeddings.token_type_embeddings", (type_vocab, hidden), 1.0)
        pos_ids = b.param("embeddings.position_ids", np.arange(seq, dtype=np.int64)[None])
        x = b.node("Add", [b.node("Gather", [words, ids], "embeddings.words", axis=0),
                           b.node("Gather", [type_table, types], "embeddings.types", axis=0)])
        x = b.node("Add", [x, b.node("Gather", [positions, pos_ids], "embeddings.positions",
                                     axis=0)])
        x = b.layernorm(x, hidden, "embeddings.LayerNorm", eps)
        # (1 - mask) * -10000 added to the scores, broadcast over heads and query positions
        m = b.node("Unsqueeze", [mask_in, b.param("mask_axes", np.array([1, 2], np.int64))])
        m = b.node("Cast", [m], to=TensorProto.FLOAT)
        m = b.node("Sub", [b.scalar(1.0), m])
        mask = b.node("Mul", [m, b.scalar(-10000.0)], out="extended_attention_mask")
    else:
        x = b.input("hidden_states", TensorProto.FLOAT, [batch, seq, hidden])
    split_shape = b.param("split_heads_shape", np.array([0, 0, heads, head_dim], np.int64))
    merge_shape = b.param("merge_heads_shape", np.array([0, 0, hidden], np.int64))
    scale = b.scalar(math.sqrt(head_dim))
    for i in range(layers):
        p = f"encoder.layer.{i}"

        def heads_of(name: str, perm: list[int]) -> str:
            y = b.linear(x, hidden, hidden, f"{p}.attention.self.{name}")
            y = b.node("Reshape", [y, split_shape], f"{p}.attention.self.{name}.reshape")
            return b.node("Transpose", [y], f"{p}.attention.self.{name}.transpose", perm=perm)

        q = heads_of("query", [0, 2, 1, 3])
        k = heads_of("key", [0, 2, 3, 1])
        v = heads_of("value", [0, 2, 1, 3])
        scores = b.node("Div", [b.node("MatMul", [q, k], f"{p}.attention.self.scores"), scale])
        if mask is not None:
            scores = b.node("Add", [scores, mask])
        probs = b.node("Softmax", [scores], f"{p}.attention.self.softmax", axis=-1)
        ctx = b.node("MatMul", [probs, v], f"{p}.attention.self.context")
        ctx = b.node("Transpose", [ctx], perm=[0, 2, 1, 3])
        ctx = b.node("Reshape", [ctx, merge_shape])
        attn = b.linear(ctx, hidden, hidden, f"{p}.attention.output.dense")
        x = b.layernorm(b.node("Add", [attn, x]), hidden, f"{p}.attention.output.LayerNorm",
                        eps)
        h = b.linear(x, hidden, intermediate, f"{p}.intermediate.dense")
        # exact GELU as the exporters write it: x * 0.5 * (1 + erf(x / sqrt(2)))
        g = b.node("Erf", [b.node("Div", [h, b.scalar(math.sqrt(2.0))])])
        h = b.node("Mul", [b.node("Mul", [h, b.node("Add", [g, b.scalar(1.0)])]),
                           b.scalar(0.5)])
        h = b.linear(h, intermediate, hidden, f"{p}.output.dense")
        x = b.layernorm(b.node("Add", [h, x]), hidden, f"{p}.output.LayerNorm", eps)
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    b.output("last_hidden_state", TensorProto.FLOAT, [batch, seq, hidden])
    return b.finish(dict(layers=layers, hidden=hidden, heads=heads, seq=seq,
                         intermediate=intermediate, embeddings=embeddings, vocab=vocab,
                         seed=seed, batch=batch))


_BERT_TINY = {"layers": 2, "hidden": 128, "heads": 2, "seq": 128}
_BERT_BASE = {"layers": 12, "hidden": 768, "heads": 12, "seq": 128}


def bert_tiny(batch=1, **config) -> onnx.ModelProto:
    """BERT-Tiny (Turc et al. 2019): 2 layers, hidden 128, 2 heads; sequence 128."""
    return bert(batch, **{**_BERT_TINY, "name": "bert_tiny", **config})


def bert_base(batch=1, **config) -> onnx.ModelProto:
    """BERT-Base: 12 layers, hidden 768, 12 heads, intermediate 3072; sequence 128."""
    return bert(batch, **{**_BERT_BASE, "name": "bert_base", **config})


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": mlp,
    "cnn": cnn,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "bert": bert,
    "bert_tiny": bert_tiny,
    "bert_base": bert_base,
}
"""Model name -> builder(batch=1, **config) -> onnx.ModelProto."""


# presets: (the general builder, its parameters the preset fixes, the defaults it changes)
_PRESETS = {
    resnet18: (resnet, ("layers", "bottleneck", "name"), {}),
    resnet50: (resnet, ("layers", "bottleneck", "name"), {}),
    bert_tiny: (bert, (), _BERT_TINY),
    bert_base: (bert, (), _BERT_BASE),
}


def config_options(name: str) -> list[str]:
    """The config keys a model's builder accepts (besides `batch`)."""
    return list(config_defaults(name))


def config_defaults(name: str) -> dict:
    """Each config key a model's builder accepts (besides `batch`) -> its default (None for
    `bert`'s `intermediate`: 4 * hidden)."""
    builder, fixed, changed = _PRESETS.get(MODELS[name], (MODELS[name], (), {}))
    return {k: changed.get(k, p.default) for k, p in inspect.signature(builder).parameters.items()
            if k not in ("batch", "name") and k not in fixed}


def build(name: str, batch=1, **config) -> onnx.ModelProto:
    """Build zoo model `name`; unknown names and config keys raise ValueError."""
    if name not in MODELS:
        raise ValueError(f"unknown zoo model {name!r}; available: {', '.join(MODELS)}")
    unknown = sorted(set(config) - set(config_options(name)))
    if unknown:
        raise ValueError(f"zoo model {name!r} has no option(s) {', '.join(unknown)}; its "
                         f"options are {', '.join(config_options(name))}")
    builder = _PRESETS.get(MODELS[name], (MODELS[name],))[0]
    defaults = {k: p.default for k, p in inspect.signature(builder).parameters.items()}
    for key, value in config.items():
        _check_option(key, value, defaults[key])
    return MODELS[name](batch, **config)


def _check_option(key: str, value, default) -> None:
    """An option takes its default's kind of value: a bool, sizes (ints >= 1; a seed >= 0),
    a tuple of sizes, a positive number; so `layers=-1` or `hidden=(0,)` is refused rather
    than built into a broken model."""
    def size(v, low=1):
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "True or False"
    elif key == "seed":
        ok, kind = size(value, 0), "an int >= 0"
    elif isinstance(default, tuple):
        ok = isinstance(value, (tuple, list)) and all(map(size, value))
        kind = "a tuple of ints >= 1"
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value) and value > 0
        kind = "a number > 0"
    else:   # int sizes, and None defaults that stand for a size (intermediate)
        ok, kind = size(value) or (default is None and value is None), "an int >= 1"
    if not ok:
        raise ValueError(f"option {key} must be {kind}, not {value!r}")


def float16(model: onnx.ModelProto, keep_io_types: bool = False) -> onnx.ModelProto:
    """`model` (changed in place) in float16 as onnxconverter_common's `convert_float_to_float16`
    writes it: weights and activations, and inputs and outputs unless `keep_io_types`. One
    repair: the converter retypes a Cast's output float16 but leaves its `to` float32 (the
    BERT models' attention mask), a file onnxruntime refuses; the Cast is made to float16.
    Needs the optional onnxconverter_common package."""
    from onnxconverter_common.float16 import convert_float_to_float16

    with warnings.catch_warnings():   # (its note for each weight below float16's range)
        warnings.simplefilter("ignore", UserWarning)
        model = convert_float_to_float16(model, keep_io_types=keep_io_types)
    half = {vi.name for vi in list(model.graph.value_info) + list(model.graph.output)
            if vi.type.tensor_type.elem_type == TensorProto.FLOAT16}
    for node in model.graph.node:
        if node.op_type == "Cast" and node.output[0] in half:
            for attr in node.attribute:
                if attr.name == "to" and attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.FLOAT16
    return model


def inputs_for(model: onnx.ModelProto, rng: np.random.Generator | None = None,
               dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for a model's graph inputs, by name, in input order.

    Floats are standard normal; integer ids are uniform below the bound the zoo recorded (the
    vocabulary size); attention masks are ones with random right padding (at least one token
    kept). Symbolic dims take their size from `dims`, else 1.
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    dims = dims or {}
    meta = {p.key[len(_META_PREFIX):]: p.value for p in model.metadata_props
            if p.key.startswith(_META_PREFIX)}
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1)
                      for d in tt.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype.kind == "f":
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif f"mask.{vi.name}" in meta and len(shape) == 2:
            lengths = rng.integers(1, shape[1] + 1, size=shape[0])
            feeds[vi.name] = (np.arange(shape[1])[None] < lengths[:, None]).astype(dtype)
        elif dtype.kind in "iu":
            high = int(meta.get(f"int_high.{vi.name}", 10))
            feeds[vi.name] = rng.integers(0, high, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            raise ValueError(f"cannot make a random input of type {dtype} for {vi.name!r}")
    return feeds
