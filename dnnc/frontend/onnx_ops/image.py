"""ONNX importers for image ops (to be filled)."""
