"""The LLVM CPU backend: schedules, the LLVM IR renderer and the JIT runtime.

`FUSION` is what its templates can take as one kernel (the fuse_ops pass reads it from the
`Target`): the dense template stores through layout tails (`dense.LAYOUT_TAILS`); `panels`
gives the `Target` the widths its layouts pack weights in."""

from ...ir.target import Fusion
from . import conv, dense

FUSION = Fusion(store_remaps=tuple(sorted(dense.LAYOUT_TAILS.items())))


def panels(vector_bits: int) -> tuple[tuple[str, int], ...]:
    """The panel widths `convert_layout` packs weights in: the dense and conv templates'
    default `nr` on this vector width (a knob of each template; a packed operand fixes it)."""
    return (("pack_dense", dense.default_panel(vector_bits)),
            ("pack_conv", conv.default_panel(vector_bits)))
