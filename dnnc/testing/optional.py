"""Optional libraries in tests: `library(name, *attributes)` is the module, or the calling test
is skipped saying why it cannot be used here.

A library can be installed and still unusable: torchvision built for another torch fails its
import with a RuntimeError (its C++ operators missing), transformers raises on the first model
class it cannot import against the installed torch. pytest.importorskip skips only on
ImportError, so such a test would fail for its environment, not for dnnc. Never used by dnnc
itself; never hides a failure of dnnc's (only the import and the attribute lookups are
guarded).
"""

from __future__ import annotations

import importlib


def library(name: str, *attributes: str):
    """Module `name` with each of `attributes` looked up once, or pytest.skip with the
    reason when any of that fails."""
    import pytest

    try:
        module = importlib.import_module(name)
        for attribute in attributes:
            getattr(module, attribute)
    except Exception as exc:   # any failure to import is the environment's, not dnnc's
        pytest.skip(f"{name} cannot be used here: {type(exc).__name__}: {str(exc)[:200]}")
    return module
