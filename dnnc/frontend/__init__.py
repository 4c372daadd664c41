"""Model frontends: ONNX import (`onnx.py`, one importer module per op family under
`onnx_ops/`), ONNX export (`onnx_export.py`), define-by-run tracing of NumPy code
(`trace.py`, `trace_numpy.py`; docs/tracing.md) and import of the core-ATen FX graphs
torch.compile hands its backends (`torch_fx.py`, with one converter per ATen op in
`torch_aten.py`, torch's fused attention ops as the attention chain in `torch_attention.py`,
the reshapes around torch's decomposed linear and matmul as one N-D MatMul in
`torch_matmul.py`),
and of `torch.export` programs through the same importer (`torch_export.py`); torch is
optional and only the torch paths import these."""
