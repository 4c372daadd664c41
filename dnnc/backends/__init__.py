"""Targets' shared code and their packages: the one compile path every compiled target takes
(`plan.py`: segments -> kernels -> memory plan; `lower.py`, `legalize.py`, `memory.py`, the
template spaces of `space.py` over the problems of `problems.py`), the `numpy` reference
interpreter (`numpy.py`), and one package per compiled target: `llvm/` (native code for CPUs
through llvmlite) and `cuda/` (CUDA C compiled by NVRTC through CuPy). The registry that names
them is `compiler/targets.py`."""
