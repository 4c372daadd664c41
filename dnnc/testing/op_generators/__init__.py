"""The fuzzer's op generators, by family, and `OPS`: each with its weight in the draw.

A generator `fn(g)` appends nodes to the `graph_builder.Builder` `g`, or raises `Rejected` when
it cannot apply to the values at hand (the driver, `generate.py`, rolls back what it added and
draws another). The order and weights of `OPS` are part of every case's identity: changing
them changes the model of each (seed, index), so they must never change in a refactoring.
`SPARSE_OPS` are drawn besides them in sparse cases only (`generate.SPARSE_RATE`), so that
adding them left every other case as it was.
"""

from __future__ import annotations

from .elementwise import gen_binary, gen_cast, gen_clip, gen_exp, gen_gelu, gen_int, gen_unary, \
    gen_where
from .layers import gen_additive_mask, gen_batchnorm, gen_conv, gen_gemm, gen_layernorm, gen_matmul, gen_pool, \
    gen_reduce, gen_resize, gen_softmax, gen_softmax_chain
from .quantized import gen_dynamic, gen_qdq
from .sparse import gen_sparse, gen_sparse24
from .movement import gen_concat, gen_expand, gen_gather, gen_pad, gen_reshape, gen_slice, \
    gen_split, gen_squeeze, gen_transpose

OPS = [  # (weight, generator)
    (8, gen_unary), (1, gen_exp), (2, gen_gelu), (2, gen_clip), (10, gen_binary),
    (4, gen_int), (7, gen_conv), (5, gen_matmul), (3, gen_gemm), (3, gen_softmax),
    (2, gen_layernorm), (2, gen_batchnorm), (4, gen_pool), (4, gen_reshape),
    (3, gen_transpose), (3, gen_concat), (2, gen_split), (3, gen_slice), (2, gen_gather),
    (2, gen_squeeze), (5, gen_reduce), (2, gen_pad), (2, gen_resize), (2, gen_where),
    (2, gen_expand), (2, gen_cast), (5, gen_qdq),
]

SPARSE_OPS = [(6, gen_sparse), (2, gen_sparse24)]
"""Drawn besides OPS in a sparse case: layers with pruned constant weights (issue 34)."""

DYNAMIC_OPS = [(4, gen_dynamic)]
"""Drawn besides OPS only when boosted (`--boost dynamic`): quantize_dynamic's
DynamicQuantizeLinear -> MatMulInteger products (issue 33), so that every other case stays
as it was."""

MASK_OPS = [(4, gen_additive_mask)]
"""Drawn besides OPS only when boosted (`--boost additive_mask`): transformers' additive
attention mask, whose float32 constant a half-stored model must keep finite."""

SPECIAL_OPS = OPS + [(4, gen_softmax_chain)]
"""The draw in special mode (`generate(..., special=True)`): OPS and softmax written by hand
(ReduceMax -> Sub -> Exp -> ReduceSum -> Div), where rows of +-inf or NaN show how each
target's row reductions treat them."""
