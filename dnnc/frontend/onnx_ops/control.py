"""ONNX importers for control ops (to be filled)."""
