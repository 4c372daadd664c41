"""ONNX importers for quant ops (to be filled)."""
