"""ONNX importers for norm ops (to be filled)."""
