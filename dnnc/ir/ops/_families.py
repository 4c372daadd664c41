"""Imports every op family module, which registers its ops. Add a new family module here."""

from . import (  # noqa: F401
    attention,
    control,
    creation,
    elementwise,
    image,
    indexing,
    linalg,
    loss,
    nn,
    norm,
    packed,
    quant,
    reduce,
    rnn,
    shape,
    signal,
    slicing,
)
