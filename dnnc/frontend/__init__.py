"""Model importers: ONNX and (later) define-by-run tracing."""
