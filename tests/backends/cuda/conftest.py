"""The cuda backend's test tiers: tests marked `gpu` need CuPy and a CUDA GPU and skip cleanly
without them (`pytest -m gpu tests/backends/cuda` runs only those, on a GPU machine); tests
marked `codegen` need the other half of the backend (the package's FUSION, its schedules and
its renderer) but no GPU. The machine fixtures: `simulated` (a CUDARuntime factory on
simulated_device.py's stand-in for CuPy), `no_gpu` (CuPy installed, no GPU visible) and
`no_cupy` (no CuPy)."""

import importlib.machinery
import importlib.util
import sys
import types

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


# -- machines: the simulated GPU, and hosts without one -------------------------------------------

@pytest.fixture
def simulated(monkeypatch, tmp_path):
    """A CUDARuntime factory on the simulated device (simulated_device.py)."""
    from simulated_device import install

    return install(monkeypatch, tmp_path)


@pytest.fixture
def no_gpu(monkeypatch):
    """This process as on a machine with CuPy installed but no GPU visible."""
    from dnnc.backends.cuda import device

    fake = types.ModuleType("cupy")
    fake.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    fake.__version__ = "14.2.0"

    def no_device():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    device._probe.cache_clear()
    yield
    device._probe.cache_clear()


@pytest.fixture
def no_cupy(monkeypatch):
    """This process as on a machine without CuPy."""
    from dnnc.backends.cuda import device

    real = device.importlib.util.find_spec
    monkeypatch.setattr(device.importlib.util, "find_spec",
                        lambda name, *a: None if name == "cupy" else real(name, *a))
    device._probe.cache_clear()
    yield
    device._probe.cache_clear()
