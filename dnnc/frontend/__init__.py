"""Model frontends: ONNX import (`onnx.py`, one importer module per op family under
`onnx_ops/`), ONNX export (`onnx_export.py`) and define-by-run tracing of NumPy code
(`trace.py`, `trace_numpy.py`; docs/tracing.md)."""
