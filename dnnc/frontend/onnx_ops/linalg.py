"""ONNX importers for linear algebra ops (MatMul, Gemm, MatMulInteger, Einsum, Det)."""

from __future__ import annotations

from ..onnx import direct

direct("MatMul", since=1)
direct("Gemm", since=7)  # before 7 a `broadcast` attribute switched C's broadcasting on
direct("MatMulInteger", since=10)
direct("Einsum", since=12)
direct("Det", since=11)
