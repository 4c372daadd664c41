"""store_tf32: at precision tf32, on a target that stores reduced precision between kernels
(`Target.half_storage`), the float32 values that tensor-core products read are stored as tf32
values (float32 words with their 13 low mantissa bits 0), so that the products need not round
them in their tiles.

A tf32 product rounds each operand element to tf32 (`cvt.rna.tf32.f32`) before the tensor
cores read it: in registers on mma.sync, in shared memory after the copy on wgmma (which
reads its operands from shared memory and ignores their low bits). On an H200 that rounding
pass in shared memory made wgmma at tf32 slower than mma.sync, where with operands that are
tf32 values already it ran 2.5 times as fast (issue 31). The rewrite:

- a product's constant operand (MatMul's or Gemm's B, a ConvNHWC's weights; convert_layout
  rounded a MatMulPacked's already, "tf32_dense") is rounded here,
  once, as its tiles would round it (`packed.round_tf32`: the same products, bit for bit);
- a product's activation operand, traced back through VALUE_PRESERVING ops (a Reshape, a
  Transpose) to the node computing it, gets a RoundTF32 right after that node, which every
  reader of the value then reads: fuse_ops puts it in the producer's epilogue, so the value is
  rounded as it is stored and costs no kernel of its own.

Graph inputs, graph outputs and the outputs of opaque ops (whose kernels take no epilogue:
a MaxPool's) are left as they are (the products reading them round in their
tiles, as before): the caller's values are never changed. The accuracy contract is the one
half storage states (docs/cuda_backend.md, "The accuracy contract with half storage"): each
value so stored is rounded once, off by at most u |y| (u = 2^-11, as fp16's), within the
model bound `16 u max |want|` at tf32. `packed.holds_tf32` is what the templates ask.
This pass must never import a backend: it reads the `Target` only.
"""

from __future__ import annotations

import os

from ..ir import types as T
from ..ir.graph import Graph, Value
from ..ir.ops.packed import VALUE_PRESERVING, holds_tf32, round_tf32
from ..ir.ops.registry import Pattern, get_op
from ..ir.target import Target

PRODUCT_OPERANDS = {"MatMul": (0, 1), "Gemm": (0, 1), "MatMulPacked": (0, 1), "ConvNHWC": (0, 1)}
"""Ops the cuda target runs on tensor cores at tf32 -> the inputs they read as operands (a
ConvNHWC of one group only: a depthwise one runs on the SIMT cores, `tensor_core_operands`)."""


def tensor_core_operands(node) -> tuple[int, ...]:
    """The inputs of `node` that a tensor-core product reads as operands at tf32."""
    if node.op == "ConvNHWC" and (node.attrs.get("group") or 1) != 1:
        return ()
    return PRODUCT_OPERANDS.get(node.op, ())


def store_tf32(graph: Graph, target: Target) -> Graph:
    """Round, once, what tf32 products read (see the module docstring); DNNC_STORE_TF32=0
    turns it off, and convert_layout's "tf32_dense" with it (an A/B switch for
    bench/gpu_env_ab.py)."""
    if target.precision != "tf32" or not target.half_storage or \
            os.environ.get("DNNC_STORE_TF32") == "0" or \
            any(node.subgraphs() for node in graph.nodes):
        return graph
    outputs = {id(v) for v in graph.outputs}
    for node in list(graph.nodes):
        for index in tensor_core_operands(node):
            v = node.inputs[index] if index < len(node.inputs) else None
            if v is None or v.type.dtype != T.float32 or holds_tf32(v):
                continue
            if v.const is not None:   # only this reader's copy: another may want it exact
                node.inputs[index] = Value(f"{v.name}.tf32", v.type, const=round_tf32(v.const))
                continue
            source = v
            while source.producer is not None and source.producer.op in VALUE_PRESERVING:
                source = source.producer.inputs[0]
            if source.producer is None or source.const is not None or \
                    id(source) in outputs or get_op(source.producer.op).pattern is Pattern.OPAQUE:
                continue   # (an opaque op's kernel takes no epilogue: a MaxPool's)
            _round_after(graph, source)
    graph.topological_sort()
    return graph


def _round_after(graph: Graph, value: Value) -> None:
    """Every reader of `value` reads it rounded to tf32 by a new RoundTF32 instead."""
    readers = [n for n in graph.nodes if any(v is value for v in n.inputs)]
    rounded = graph.add_node("RoundTF32", [value], name=graph.fresh_name(f"{value.name}.tf32"))[0]
    for node in readers:
        node.inputs = [rounded if v is value else v for v in node.inputs]
