"""ONNX importers for shape ops (Reshape, Transpose, Concat, Slice, ...) and Constant."""

from __future__ import annotations

import numpy as np

from ..onnx import ImportContext, onnx_op


@onnx_op("Constant", since=1)
def import_constant(ctx: ImportContext):
    """Constant becomes a constant value, not a node."""
    attrs = ctx.attrs
    if "value" in attrs:
        array = attrs["value"]
    elif "value_float" in attrs:
        array = np.array(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        array = np.array(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        array = np.array(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        array = np.array(attrs["value_ints"], np.int64)
    elif "sparse_value" in attrs:
        array = np.asarray(attrs["sparse_value"])
    else:
        raise ctx.fail(f"has no supported value attribute (given {sorted(attrs)})")
    return ctx.const(array)
