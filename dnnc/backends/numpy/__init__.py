"""The `numpy` target: the graph run by the registry's references, the oracle every other
target is tested against (`runtime.py`); its registry entry (`entry.py`) and artifact codec
(`artifact.py`). It runs no passes and generates no code."""
