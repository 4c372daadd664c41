"""The cuda backend's test tiers: tests marked `gpu` need CuPy and a CUDA GPU and skip cleanly
without them (`pytest -m gpu tests/backends/cuda` runs only those, on a GPU machine); tests
marked `codegen` need the other half of the backend (the package's FUSION, its schedules and
its renderer) but no GPU."""

import importlib.util

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CuPy and a CUDA GPU (skipped without)")
    config.addinivalue_line("markers", "codegen: needs the CUDA schedules and renderer, not a "
                                       "GPU")


def has_codegen() -> bool:
    try:
        import dnnc.backends.cuda as package

        return hasattr(package, "FUSION") and all(
            importlib.util.find_spec(f"dnnc.backends.cuda.{m}") is not None
            for m in ("schedules", "codegen"))
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    from dnnc.backends.cuda import device

    for item in items:
        if item.get_closest_marker("gpu") and not device.available():
            item.add_marker(pytest.mark.skip(reason=f"no GPU: {device.unavailable_reason()}"))
        if item.get_closest_marker("codegen") and not has_codegen():
            item.add_marker(pytest.mark.skip(reason="no CUDA schedules and renderer in this "
                                                    "tree (dnnc/backends/cuda/)"))
