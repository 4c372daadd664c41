"""ONNX importers for linalg ops (to be filled)."""
