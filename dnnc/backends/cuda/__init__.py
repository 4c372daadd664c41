"""The CUDA backend: operator-IR kernels rendered as CUDA C and compiled by NVRTC.

`schedules.py` binds each kernel's loops to blocks and threads (`threads.py` a stage's
iterations, `rows.py` a row reduction's; templates with knobs, as on llvm: `dense.py` and
`conv.py` tile products in shared memory, `gemv.py` splits short ones along k, `mma.py` runs
products on tensor cores at a reduced precision (`conv_nhwc.py` channels-last convolutions
on it; `depthwise_nhwc.py` and `plane_mean.py` the channels-last depthwise convolutions and
plane means beside them), `attention.py` computes a fused attention in one kernel); `codegen.py` renders the scheduled PrimFuncs of a program as
one CUDA C translation unit and says how each is launched (its docstring holds the interface
the runtime reads; `prelude.py` the device functions it calls); `device.py` finds CuPy and the GPU, describes it (`Target.gpu`), compiles
through NVRTC and caches modules; `executable.py` is the runtime, `tuning.py` what the tuner
measures with.
"""

from ...ir.target import Fusion
from .. import problems
from ..lower import STORE_REMAPS

FUSION = Fusion(max_group=8, store_remaps=tuple(sorted(
    (op, frozenset(STORE_REMAPS))
    for op in problems.DENSE_OPS + ("FusedAttention", "Sparse24Dense", "QuantizedDense"))),
    attention=True,
    range_producers=frozenset({"LayerNormalization", "QuantizedDense", "FusedAttention"}))
"""What the cuda target's kernels take as one: any fused group of up to 8 nodes (a reduction
with its injective producers and consumers, as a softmax or layernorm row), and a dense
product with the layout ops after its epilogue (the dense and gemv templates store through
them: attention's Q, K and V projections write heads-first straight from the accumulators,
int8 ones too: int8.py's QuantizedDense),
and attention fused into one FusedAttention node (`passes/fuse_attention.py`), whose template
(`attention.py`) stores through the layout ops after it too (the heads merged back), as
the 2:4 product's (Sparse24Dense: `sparse24.py`) does; the kernels of layernorms, int8
products and attention take the range of the DynamicQuantizeLinear reading their output
(`range_epilogue.py`)."""
