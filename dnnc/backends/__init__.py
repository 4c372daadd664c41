"""Targets' shared code and their packages: the one compile path every compiled target takes
(`plan.py`: segments -> kernels -> memory plan; `lower.py`, `legalize.py`, `memory.py`, the
template spaces of `space.py` over the problems of `problems.py`), the runtime that runs it
(`executable.py`, with `specialisations.py` and `batch_split.py`) and the contract a target
fulfils for it (`contract.py`), and one package per target, each holding its registry entry
(`entry.py`), runtime and artifact codec (`artifact.py`): `numpy/` (the reference
interpreter), `llvm/` (native code for CPUs through llvmlite) and `cuda/` (CUDA C compiled by
NVRTC through CuPy). The registry that names them is `registry.py` (what an entry declares:
`target_spec.py`; the manifest checks the codecs share: `manifest.py`)."""
