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


def import_torchvision():
    """torchvision, also where its wheel's compiled operators were built for another torch
    (the package index here has only the CUDA build of torchvision beside the CPU torch): the
    models are plain Python, and only the fake-tensor registrations of the detection
    operators (nms, roi_align) need the compiled library. Where that library does not load,
    those registrations are left out; the classification models never call them."""
    import sys
    import types

    try:
        import torchvision
    except RuntimeError as e:   # "operator torchvision::nms does not exist"
        if "torchvision::" not in str(e):
            raise
        for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[mod]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType(
            "torchvision._meta_registrations")
        import torchvision
    return torchvision


def library(name: str, *attributes: str):
    """Module `name` with each of `attributes` looked up once, or pytest.skip with the
    reason when any of that fails (torchvision through `import_torchvision`)."""
    import pytest

    try:
        module = import_torchvision() if name == "torchvision" else \
            importlib.import_module(name)
        for attribute in attributes:
            getattr(module, attribute)
    except Exception as exc:   # any failure to import is the environment's, not dnnc's
        pytest.skip(f"{name} cannot be used here: {type(exc).__name__}: {str(exc)[:200]}")
    return module
