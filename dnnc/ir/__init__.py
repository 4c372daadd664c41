"""The IRs: element and tensor types (`types.py`), the graph IR (`graph.py`), the op registry
(`ops/`) with its FLOP rules (`flops.py`), the operator (loop) IR (`loop/`, built by the ops'
compute rules through `compute.py`), target descriptions (`target.py`) and the reference
interpreter (`interpreter.py`)."""
