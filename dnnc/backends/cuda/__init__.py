"""The CUDA backend: operator-IR kernels rendered as CUDA C and compiled by NVRTC.

`schedules.py` binds each kernel's loops to blocks and threads (templates with knobs, as on
llvm: `dense.py` and `conv.py` tile products in shared memory); `codegen.py` renders the
scheduled PrimFuncs of a program as one CUDA C translation unit and says how each is
launched (its docstring holds the interface the runtime reads).
"""

from ...ir.target import Fusion

FUSION = Fusion(max_group=8)
"""What the cuda target's kernels take as one: any fused group of up to 8 nodes (a reduction
with its injective producers and consumers, as a softmax or layernorm row; templates store
through no layout ops yet)."""
