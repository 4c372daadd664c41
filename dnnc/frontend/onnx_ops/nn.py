"""ONNX importers for convolution and pooling ops.

Every opset from 7 maps one-to-one: the attributes these ops gained over time (MaxPool's
storage_order and Indices in 8, ceil_mode in 10, dilations in 10/11; AveragePool's ceil_mode in
10 and dilations in 19; LpPool's ceil_mode and dilations in 18) default to the behaviour the
older opsets had, so an older node is a newer node without them.
"""

from __future__ import annotations

from ..onnx import ImportContext, direct, onnx_op

for _name in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
              "GlobalMaxPool"):
    direct(_name, since=1)
for _name, _since in (("GlobalLpPool", 2), ("LpPool", 2), ("MaxUnpool", 9),
                      ("ConvInteger", 10), ("Col2Im", 18), ("DeformConv", 19),
                      ("CausalConvWithState", 27)):
    direct(_name, since=_since)


@onnx_op("LpPool", since=1)
@onnx_op("GlobalLpPool", since=1)
def import_lp_pool_float_p(ctx: ImportContext):
    # opset 1 wrote p as a float attribute; it became an int in opset 2
    attrs = dict(ctx.attrs)
    p = attrs.get("p", 2)
    if p != int(p):
        raise ctx.fail(f"p must be a whole number, given {p}")
    attrs["p"] = int(p)
    return ctx.emit(ctx.op_type, ctx.inputs, attrs)
