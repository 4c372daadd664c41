"""The operator IR: target-neutral loop nests that every backend renders.

One package, one concern a module, all names re-exported here (`from dnnc.ir import loop as L;
L.For(...)`):

- `nodes`: Expr, Stmt, Buffer, IterVar, PrimFunc, constructors (`const`, `call`, `seq`, ...),
  `static_shape`
- `traversal`: children, walk, transform, substitute, free_vars, structural_equal
- `printer`: the stable text form (`print_expr`, `print_stmt`, `print_func`)
- `verifier`: `verify` and `LoopIRError`
- `index_checks`: the run-time check of gather indices (`check_index`) and its error record
- `simplifier`: `Bounds`, `bounds`, the `EXPR_RULES` table, `simplify_expr`, `simplify`,
  `divisor` (a power of two known to divide an index: alignment proofs)

Backends must never need a second IR, and this package knows nothing of graphs, ONNX or any
backend.
"""

from .nodes import (
    ARITH, ASYNC_COPY_BYTES, BITWISE, COMPARE, INDEX, INTEGER_MMA, INTRINSICS, LDMATRIX_COUNTS,
    LOGIC, MBARRIER_OPS, MMA_REGISTERS, MMA_SHAPES, PACKS, REDUCE_COMBINERS, SHUFFLES, SPARSE_MMA,
    SPARSE_MMA_REGISTERS, SWIZZLE_BYTES, TILE_PRECISIONS, TILE_REGISTERS, TILE_ROWS, TMA_RANK,
    IM2COL_RANK, WGMMA_K,
    Allocate, AsyncCommit, AsyncWait, Barrier, BinOp, Buffer, Call, Cast, ClusterBarrier, Const,
    CopyAsync, Expr, For, ForKind, If, IterVar, LdMatrix, Let, Load, Mbarrier, Mma, Prefetch,
    PrimFunc, ProxyFence, Reduce, Scope, Select, Seq, Stmt, Store, TensorMap, TileProduct, TmaLoad,
    Var, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait,
    call, const, eq, logical_and, logical_or, loop_nest, maximum, minimum, mma_fragments, ne,
    seq, static_shape)
from .printer import print_expr, print_func, print_stmt
from .simplifier import (EXPR_RULES, UNBOUNDED, Bounds, bounds, divisor, simplify,
                         simplify_expr)
from .traversal import (alpha_normal, children, field_names, free_vars, map_exprs,
                        structural_equal, substitute, transform, walk)
from .verifier import LoopIRError, verify
from . import index_checks

__all__ = [
    # nodes
    "ARITH", "ASYNC_COPY_BYTES", "BITWISE", "COMPARE", "INDEX", "INTEGER_MMA", "INTRINSICS",
    "LDMATRIX_COUNTS",
    "LOGIC", "MBARRIER_OPS", "MMA_REGISTERS", "MMA_SHAPES", "PACKS", "REDUCE_COMBINERS", "SHUFFLES",
    "SPARSE_MMA", "SPARSE_MMA_REGISTERS", "SWIZZLE_BYTES", "TILE_PRECISIONS", "TILE_REGISTERS",
    "TILE_ROWS", "TMA_RANK", "IM2COL_RANK", "WGMMA_K",
    "Allocate", "AsyncCommit", "AsyncWait", "Barrier", "BinOp", "Buffer", "Call", "Cast",
    "ClusterBarrier", "Const",
    "CopyAsync", "Expr", "For", "ForKind", "If", "IterVar", "LdMatrix", "Let", "Load", "Mbarrier",
    "Mma",
    "Prefetch", "PrimFunc", "ProxyFence", "Reduce", "Scope", "Select", "Seq", "Stmt", "Store",
    "TensorMap", "TileProduct", "TmaLoad", "Var", "Wgmma", "WgmmaCommit", "WgmmaFence", "WgmmaWait", "call", "const", "eq",
    "logical_and", "logical_or", "loop_nest", "maximum", "minimum", "mma_fragments", "ne", "seq",
    "static_shape",
    # traversal
    "alpha_normal", "children", "field_names", "free_vars", "map_exprs", "structural_equal",
    "substitute", "transform", "walk",
    # printer
    "print_expr", "print_func", "print_stmt",
    # verifier
    "LoopIRError", "verify",
    # run-time index checks
    "index_checks",
    # simplifier
    "EXPR_RULES", "UNBOUNDED", "Bounds", "bounds", "divisor", "simplify", "simplify_expr",
]
