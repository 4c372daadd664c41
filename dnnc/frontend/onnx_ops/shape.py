"""ONNX importers for shape ops (to be filled)."""
