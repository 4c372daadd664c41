"""Quantized ONNX files as users make them (issue 33), for tests and benchmarks:
onnxruntime's `quantize_static` (QDQ format, per-channel int8 weights, int8 activations,
calibrated on a few seeded random inputs, after its recommended `quant_pre_process`, which
folds batch normalisations into convolutions) and `quantize_dynamic` (MatMulInteger after
DynamicQuantizeLinear; int8 or uint8 weights, per tensor or per channel), weight-only
`quantize_weights` (MatMulNBitsQuantizer: com.microsoft's MatMulNBits), on zoo models or on
transformers' own BERT and GPT-2 exported by torch (`export_transformer`: small configs built
here with seeded random weights, nothing downloaded).

Needs onnxruntime (a test dependency; torch and transformers for `export_transformer`); never
used by the compiler itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from .. import zoo
from ..frontend.onnx import NARROW_FROM_ONNX

CALIBRATION_INPUTS = 4


def _reader(model: onnx.ModelProto, seed: int):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(seed)
            self.feeds = [zoo.inputs_for(model, rng) for _ in range(CALIBRATION_INPUTS)]

        def get_next(self):
            return self.feeds.pop() if self.feeds else None

    return Reader()


def quantize_static(model: onnx.ModelProto, folder: Path, name: str, seed: int = 0,
                    activations: str = "int8", operators: bool = False,
                    preprocess: bool = True, weights: str = "int8") -> Path:
    """`model` quantized to a QDQ file in `folder` (calibrated on seeded random inputs), or
    with `operators` to the operator format (QLinearMatMul, com.microsoft's QGemm,
    QLinearAdd, ...); `preprocess`: after quant_pre_process (whose MatMul + Add fusion makes
    onnxruntime 1.32 write a BERT's QGemm with a uint8 bias, a file it refuses); `activations`
    int8, uint8, int4 or uint4, `weights` int8, int4 or uint4 (for 4-bit types below opset 21
    onnxruntime writes com.microsoft's Q / DQ)."""
    from onnxruntime.quantization import QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as quantize
    from onnxruntime.quantization.shape_inference import quant_pre_process

    folder = Path(folder)
    float_path, pre_path = folder / f"{name}.onnx", folder / f"{name}_pre.onnx"
    out = folder / (f"{name}_{'qop' if operators else 'qdq'}_{activations}"
                    f"{'' if weights == 'int8' else '_' + weights}.onnx")
    onnx.save(model, float_path)
    logging.getLogger().setLevel(logging.ERROR)   # (its advice to pre-process, which we do)
    if preprocess:
        quant_pre_process(str(float_path), str(pre_path))
    else:
        pre_path = float_path
    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int4": QuantType.QInt4,
             "uint4": QuantType.QUInt4}
    kind, weight_kind = types[activations], types[weights]
    quantize(str(pre_path), str(out), _reader(model, seed),
             quant_format=QuantFormat.QOperator if operators else QuantFormat.QDQ,
             per_channel=True, activation_type=kind, weight_type=weight_kind)
    return out


def quantize_dynamic(model: onnx.ModelProto, folder: Path, name: str, weights: str = "int8",
                     per_channel: bool = False) -> Path:
    """`model` dynamically quantized (`weights`: int8 or uint8) to a file in `folder`."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as quantize

    folder = Path(folder)
    float_path = folder / f"{name}.onnx"
    out = folder / f"{name}_dynamic_{weights}{'_pc' if per_channel else ''}.onnx"
    onnx.save(model, float_path)
    kind = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[weights]
    logging.getLogger().setLevel(logging.ERROR)
    # (float32 where its shape inference cannot type a value: an optimized file's contrib ops)
    quantize(str(float_path), str(out), weight_type=kind, per_channel=per_channel,
             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return out


def quantize_weights(model: onnx.ModelProto, bits: int = 4, block_size: int = 128,
                     symmetric: bool = False, accuracy_level: int | None = None,
                     qdq: bool = False, hqq: bool = False) -> onnx.ModelProto:
    """A copy of `model` whose MatMuls of constant weights are com.microsoft's MatMulNBits
    (onnxruntime's weight-only quantizer, MatMulNBitsQuantizer: `bits`-bit codes in blocks of
    `block_size` along K, symmetric or with zero points; `accuracy_level` written as given),
    or with `qdq` (4 bits only) a blocked int4 / uint4 DequantizeLinear feeding each; `hqq`:
    its HQQ algorithm (float zero points; needs torch)."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (HQQWeightOnlyQuantConfig,
                                                                 MatMulNBitsQuantizer)

    logging.getLogger().setLevel(logging.ERROR)
    quantizer = MatMulNBitsQuantizer(onnx.load_from_string(model.SerializeToString()),
                                     bits=bits, block_size=block_size,
                                     is_symmetric=symmetric, accuracy_level=accuracy_level,
                                     quant_format=QuantFormat.QDQ if qdq else
                                     QuantFormat.QOperator,
                                     algo_config=HQQWeightOnlyQuantConfig(
                                         block_size=block_size, bits=bits) if hqq else None)
    quantizer.process()   # (in place: hence the copy)
    return quantizer.model.model


def nbits_rounding_bound(x: np.ndarray, scales: np.ndarray, block: int, bits: int,
                         zero: float = 0.0) -> np.ndarray:
    """How far two float32 evaluations of a MatMulNBits, x @ W, may part, element by element
    ([rows of x, N]): each sums K products in its own order (|error| <= K u sum |x w|,
    Higham's gamma_K), onnxruntime's int8 path as exact block sums times two scales plus
    scale * zero point * A's block sum, so |x| (and A's int8 step, max|a| / 254, at
    accuracy_level 4) times the largest term a block holds, scale * (2**bits + |zero
    point|). scales: the node's [N, blocks]; zero: the largest float zero point."""
    k = x.shape[-1]
    rows = np.abs(x).reshape(-1, k).astype(np.float64)
    rows = rows + rows.max(axis=1, keepdims=True) / 254
    magnitude = np.repeat(np.abs(scales.astype(np.float64)).T, block, axis=0)[:k]
    return 2 * (k + 8) * 2.0 ** -24 * (rows @ (magnitude * (2 ** bits + abs(zero))))


def optimize_transformer(model: onnx.ModelProto, folder: Path, name: str, heads: int,
                         hidden: int, level: int = 1) -> onnx.ModelProto:
    """`model` after onnxruntime's transformer optimizer (`model_type="bert"`, its fusions
    into com.microsoft ops: SkipLayerNormalization, BiasGelu / Gelu, ...), as users run it
    before quantize_dynamic."""
    from onnxruntime.transformers import optimizer

    folder = Path(folder)
    path, out = folder / f"{name}_unoptimized.onnx", folder / f"{name}_optimized.onnx"
    onnx.save(model, path)
    logging.getLogger().setLevel(logging.ERROR)
    optimized = optimizer.optimize_model(str(path), model_type="bert", num_heads=heads,
                                         hidden_size=hidden, opt_level=level)
    optimized.save_model_to_file(str(out))
    return onnx.load(str(out))


TRANSFORMERS = {
    # transformers' config class, model class, and the names of its sizes
    "bert": ("BertConfig", "BertModel", ("num_hidden_layers", "hidden_size",
                                         "num_attention_heads", "intermediate_size",
                                         "max_position_embeddings")),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", ("n_layer", "n_embd", "n_head", "n_inner",
                                                "n_positions")),
}


def export_transformer(arch: str, layers: int = 2, hidden: int = 768, heads: int = 12,
                       seq: int = 128, vocab: int = 5000, seed: int = 0) -> onnx.ModelProto:
    """transformers' `arch` ("bert": BertModel's last hidden state, "gpt2": GPT2LMHeadModel's
    logits, no cache) of the given sizes with seeded random weights, exported by torch for
    token ids [1, seq] (BERT: TorchScript exporter, opset 17; GPT-2: dynamo, whose mask code
    TorchScript cannot export), as one in-memory model whose ids `zoo.inputs_for` draws below
    `vocab`."""
    import tempfile
    import warnings

    import torch
    import transformers

    config_name, model_name, sizes = TRANSFORMERS[arch]
    config = getattr(transformers, config_name)(
        vocab_size=vocab, **dict(zip(sizes, (layers, hidden, heads, 4 * hidden, seq))))
    config._attn_implementation = "eager"   # MatMul, Softmax, MatMul, as most files have it
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    decoder = arch == "gpt2"

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            out = self.model(input_ids=ids, return_dict=True,
                             **({"use_cache": False} if decoder else {}))
            return out.logits if decoder else out.last_hidden_state

    ids = torch.randint(0, vocab, (1, seq))
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        path = Path(folder) / f"{arch}.onnx"
        torch.onnx.export(Tokens(), (ids,), str(path), dynamo=decoder, input_names=["input_ids"],
                          output_names=["y"], **({} if decoder else {"opset_version": 17}),
                          **({"verbose": False} if decoder else {}))
        exported = onnx.load(str(path))   # (the dynamo exporter's weights beside it, read in)
    onnx.helper.set_model_props(exported, {f"{zoo._META_PREFIX}int_high.input_ids": str(vocab)})
    return exported


def onnxruntime_outputs(path: Path, feeds: dict, threads: int = 1) -> list[np.ndarray]:
    """onnxruntime's outputs for `feeds` (its default graph optimisations: its int8 kernels)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


CONTRACT_SHARE = 1e-3
"""Issue 33's accuracy contract: at most this share of a quantized file's values differ from
onnxruntime's, each by at most one quantized step."""


def onnxruntime_values(path: Path, feeds: dict) -> dict[str, np.ndarray]:
    """The file's semantics as onnxruntime computes them one op at a time (its graph
    optimisations off: no fused int8 kernels, no conversion of int8 chains to uint8; each
    DequantizeLinear, float op and QuantizeLinear as the file writes it): the graph's inputs
    (`feeds`), its outputs and every QuantizeLinear's output but 4-bit ones, by name."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    named = {o.name for o in model.graph.output}
    four_bit = {t.name for t in model.graph.initializer if t.data_type in NARROW_FROM_ONNX}
    for node in model.graph.node:
        # (not a 4-bit one: onnxruntime's Python binding has no 4-bit arrays)
        if node.op_type == "QuantizeLinear" and node.output[0] not in named and not (
                len(node.input) > 2 and node.input[2] in four_bit or any(
                    a.name == "output_dtype" and a.i in NARROW_FROM_ONNX
                    for a in node.attribute)):
            model.graph.output.append(onnx.ValueInfoProto(name=node.output[0]))
            named.add(node.output[0])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return {**feeds, **{o.name: v for o, v in zip(session.get_outputs(),
                                                   session.run(None, feeds))}}


def local_differences(graph, values: dict) -> dict[str, tuple[str, int, int, int]]:
    """How each node of `graph` (a quantized file's, after fuse_quantized) that writes an
    8-bit value of `values` (`onnxruntime_values`) differs from it when computed from
    `values`' own 8-bit values (the float values between, a float chain's, computed by the
    references from those): node name -> (op, elements that differ, elements, largest
    difference in quantized steps). A product's differences are float32 summation ties (no
    order is the file's); an elementwise chain's float32 arithmetic is defined to the bit."""
    from ..ir.ops.registry import get_op

    def boundary(v) -> bool:
        return v.name in values and v.type.dtype.np in (np.int8, np.uint8)

    computed: dict = {}

    def value(v):
        if v.const is not None:
            return v.const
        if boundary(v) or (v.producer is None and v.name in values):
            return values[v.name]
        if id(v) not in computed:
            node = v.producer
            outs = get_op(node.op).run([None if i is None else value(i) for i in node.inputs],
                                       node.attrs)
            computed.update({id(o): a for o, a in zip(node.outputs, outs)})
        return computed[id(v)]

    found = {}
    for node in graph.nodes:
        out = node.outputs[0]
        if not boundary(out):
            continue
        got = get_op(node.op).run([None if v is None else value(v) for v in node.inputs],
                                  node.attrs)[0].astype(np.int32)
        d = np.abs(got - values[out.name].astype(np.int32))
        found[node.name] = (node.op, int(np.count_nonzero(d)), d.size, int(d.max(initial=0)))
    return found


def contract(got: np.ndarray, want: np.ndarray, step: float) -> tuple[float, float]:
    """(share of elements that differ, largest difference in steps of `step`, the scale of a
    dequantized output) of `got` against `want`."""
    d = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    return float(np.count_nonzero(d) / d.size), float(d.max(initial=0) / step)


def output_steps(path: Path) -> list[float | None]:
    """Each graph output's quantized step: the scale of the DequantizeLinear writing it
    (a scalar), None where no such DequantizeLinear writes it."""
    model = onnx.load(str(path))
    writers = {n.output[0]: n for n in model.graph.node}
    scales = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    steps = []
    for output in model.graph.output:
        node = writers.get(output.name)
        scale = scales.get(node.input[1]) if node is not None and \
            node.op_type == "DequantizeLinear" else None
        steps.append(None if scale is None or scale.size != 1 else float(scale.reshape(())))
    return steps
