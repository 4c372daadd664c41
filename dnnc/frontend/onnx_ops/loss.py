"""ONNX importers for loss ops: both map one-to-one from opset 12, where they appeared (13 and
22 only widened their element types)."""

from __future__ import annotations

from ..onnx import direct

direct("NegativeLogLikelihoodLoss", since=12)
direct("SoftmaxCrossEntropyLoss", since=12)
