"""Imports every op family module, which registers its ops. Add a new family module here."""

from . import (  # noqa: F401
    attention,
    control,
    elementwise,
    image,
    indexing,
    linalg,
    nn,
    quant,
    reduce,
    rnn,
    shape,
    signal,
)
