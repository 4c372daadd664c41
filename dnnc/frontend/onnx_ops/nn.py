"""ONNX importers for nn ops (to be filled)."""
