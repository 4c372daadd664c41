"""ONNX importers for indexing ops (to be filled)."""
