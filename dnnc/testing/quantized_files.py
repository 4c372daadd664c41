"""Quantized ONNX files as users make them (issue 33), for tests and benchmarks:
onnxruntime's `quantize_static` (QDQ format, per-channel int8 weights, int8 activations,
calibrated on a few seeded random inputs, after its recommended `quant_pre_process`, which
folds batch normalisations into convolutions) and `quantize_dynamic` (MatMulInteger after
DynamicQuantizeLinear, int8 weights).

Needs onnxruntime (a test dependency); never used by the compiler itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from .. import zoo

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
                    activations: str = "int8") -> Path:
    """`model` quantized to a QDQ file in `folder` (calibrated on seeded random inputs)."""
    from onnxruntime.quantization import QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as quantize
    from onnxruntime.quantization.shape_inference import quant_pre_process

    folder = Path(folder)
    float_path, pre_path = folder / f"{name}.onnx", folder / f"{name}_pre.onnx"
    out = folder / f"{name}_qdq_{activations}.onnx"
    onnx.save(model, float_path)
    logging.getLogger().setLevel(logging.ERROR)   # (its advice to pre-process, which we do)
    quant_pre_process(str(float_path), str(pre_path))
    kind = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[activations]
    quantize(str(pre_path), str(out), _reader(model, seed), quant_format=QuantFormat.QDQ,
             per_channel=True, activation_type=kind, weight_type=QuantType.QInt8)
    return out


def quantize_dynamic(model: onnx.ModelProto, folder: Path, name: str) -> Path:
    """`model` dynamically quantized (int8 weights) to a file in `folder`."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as quantize

    folder = Path(folder)
    float_path, out = folder / f"{name}.onnx", folder / f"{name}_dynamic.onnx"
    onnx.save(model, float_path)
    quantize(str(float_path), str(out), weight_type=QuantType.QInt8)
    return out


def onnxruntime_outputs(path: Path, feeds: dict, threads: int = 1) -> list[np.ndarray]:
    """onnxruntime's outputs for `feeds` (its default graph optimisations: its int8 kernels)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
