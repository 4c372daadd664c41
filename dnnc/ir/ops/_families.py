"""Imports every op family module, which registers its ops. Add a new family module here."""

from . import (  # noqa: F401
    attention,
    control,
    conv,
    creation,
    fused,
    elementwise,
    image,
    indexing,
    linalg,
    loss,
    norm,
    packed,
    pool,
    quant,
    quantized,
    reduce,
    rnn,
    shape,
    signal,
    slicing,
)
