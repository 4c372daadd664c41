"""ONNX importers for rnn ops (to be filled)."""
