"""ONNX importers for attention ops (to be filled)."""
