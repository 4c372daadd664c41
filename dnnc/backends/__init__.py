"""Targets: `numpy` (the reference interpreter) and, later, `llvm` and `cuda`."""
