"""The LLVM CPU backend: schedules, the LLVM IR renderer and the JIT runtime.

`FUSION` is what its templates can take as one kernel (the fuse_ops pass reads it from the
`Target`): the dense template stores through layout tails (`dense.LAYOUT_TAILS`)."""

from ...ir.target import Fusion
from .dense import LAYOUT_TAILS

FUSION = Fusion(store_remaps=tuple(sorted(LAYOUT_TAILS.items())))
