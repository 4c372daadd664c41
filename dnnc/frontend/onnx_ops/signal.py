"""ONNX importers for signal ops (to be filled)."""
