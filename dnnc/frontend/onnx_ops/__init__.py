"""ONNX importers, one module per op family (mirroring `dnnc/ir/ops/`)."""

from . import (  # noqa: F401
    attention,
    control,
    elementwise,
    image,
    indexing,
    linalg,
    loss,
    microsoft,
    nn,
    norm,
    quant,
    quant_microsoft,
    reduce,
    rnn,
    shape,
    signal,
)
