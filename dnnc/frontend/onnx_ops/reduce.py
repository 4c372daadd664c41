"""ONNX importers for reduce ops (to be filled)."""
