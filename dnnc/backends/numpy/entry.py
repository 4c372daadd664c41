"""The `numpy` target's registry entry (`backends/registry.py`)."""

from __future__ import annotations

import numpy as np

from ..target_spec import ArtifactCodec, TargetSpec
from . import artifact
from .runtime import runtime


def about() -> str:
    return f"NumPy {np.__version__}"


SPEC = TargetSpec("numpy", "the NumPy reference interpreter", runtime, returns=("numpy",),
                  codec=ArtifactCodec(artifact.export, artifact.check, artifact.restore),
                  about=about)
