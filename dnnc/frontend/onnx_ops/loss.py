"""ONNX importers for loss ops (to be filled)."""
