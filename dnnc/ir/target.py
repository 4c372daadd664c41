"""Targets are data: what a compile is for, readable by every layer.

A `Target` is the one description of the machine a compile is for: the target's name in the
registry (`backends/registry.py`; `TargetSpec.target` builds it), the CPU name and its
complete feature string, the threads the code runs on, a GPU architecture and the GPU's
figures (`GPU`: SM count, throughput, bandwidth) for a GPU target, and the layouts the
target's kernels want (`passes/convert_layout.py` applies them). Passes and runtimes read
their target-dependent choices from it, without importing a backend or comparing names; the
runtime and the passes of one compile get the same Target. Backends probe the machine they
run on (`backends/llvm/cpu.py: host_target`, `backends/cuda/device.py: machine`); this
module never probes anything.

`precision` is the arithmetic a target's dense products and convolutions may use: "fp32"
(the default: fp32 FMAs, exact as the reference's order allows), or "tf32", "fp16", "bf16":
operands rounded to that type, accumulated in fp32 (cuda: on tensor cores,
`backends/cuda/mma.py`; llvm, bf16 only: `vdpbf16ps` or fp32 FMAs, `backends/llvm/bf16.py`).
Each target's registry entry lists the values it takes (`compile(precision=)`).
A target with `half_storage` also stores a float32 model in the half type of precision fp16
or bf16 (weights and activations; `passes/store_half.py`), so that memory traffic halves too.
`half_arithmetic` names the half types a model may hold (a float16 ONNX file) that the
target's kernels compute in; values of the others are widened to float32 at compile time
(`passes/widen_half.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ArgumentError, CompileError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
"""The values of `Target.precision` (and of `dnnc.compile(precision=)`), the default first."""

UNIT_ROUNDOFF = {"tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
"""A reduced precision -> its unit roundoff u (a value rounded to it to nearest is off by at
most u of itself: tf32 and fp16 keep 10 fraction bits, bf16 7)."""

MODEL_ERROR_UNITS = 16
"""The accuracy contract of a whole model at a reduced precision (docs/cuda_backend.md,
"Precision"): each output within MODEL_ERROR_UNITS u of its largest magnitude of the fp32
reference's (`model_error_bound`)."""


def model_error_bound(precision: str) -> float:
    """The largest max|got - want| / max|want| of a model's output at a reduced `precision`
    (tf32, fp16, bf16) against its fp32 reference."""
    return MODEL_ERROR_UNITS * UNIT_ROUNDOFF[precision]


@dataclass(frozen=True)
class Fusion:
    """What a target's kernels can take as one (read by the fuse_ops pass)."""

    max_group: int = 8   # nodes per kernel at most (compile time grows with the expression)
    # anchor op -> the layout ops (Reshape, Transpose, ...) after its epilogue its template
    # can store through, as pairs (hashable)
    store_remaps: tuple[tuple[str, frozenset[str]], ...] = ()
    # scaled dot-product attention chains become one FusedAttention node (the
    # fuse_attention pass), which the target's templates compute in one kernel
    attention: bool = False
    # ops whose kernels take a DynamicQuantizeLinear's range where they store its input (the
    # take_range pass: the quantization then reads the range, one launch fewer)
    range_producers: frozenset[str] = frozenset()


@dataclass(frozen=True)
class GPU:
    """A GPU's figures that templates' defaults read (how many blocks fill it, what a product
    or a copy costs), so that their choices fit an A100, an H100 or an H200. The cuda target's
    `device.py` fills it from the device's properties, or names its reference GPU where no
    GPU is visible."""

    name: str                # as the driver names it: "NVIDIA H100 80GB HBM3"
    sms: int                 # streaming multiprocessors
    fp32_flops: float        # FLOP/s an fp32 (SIMT FMA) matrix product reaches
    tensor_flops: float      # FLOP/s a tf32 tensor-core matrix product reaches
    copy_bytes_per_s: float  # device-to-device copy bandwidth (bytes read + written a second)

    def roofline_seconds(self, flops: float | None, nbytes: float | None,
                         precision: str = "fp32", tensor_cores: bool = False) -> float | None:
        """The least time a kernel of `flops` and `nbytes` (read and written) takes on this
        GPU: its products at the SIMT fp32 rate, or on tensor cores at `precision`'s (tf32:
        `tensor_flops`; fp16 and bf16: twice that, as on the A100, H100 and H200), its bytes
        at the copy bandwidth, whichever is slower; None where neither is known."""
        times = []
        if flops:
            rate = self.fp32_flops if not tensor_cores or precision == "fp32" else \
                self.tensor_flops * (1 if precision == "tf32" else 2)
            times.append(flops / rate)
        if nbytes:
            times.append(nbytes / self.copy_bytes_per_s)
        return max(times) if times else None


@dataclass(frozen=True)
class Target:
    name: str                       # the registry's name: "numpy", "llvm", ...
    cpu: str = ""                   # CPU name as LLVM spells it: "znver3", "x86-64-v3"
    # every ISA feature of the architecture with a sign ("+avx2,-avx512f,..."): the CPU name
    # then only tunes, and the `+` ones are all the code may use beyond the baseline, which
    # is what an artifact records and checks at load
    features: str = ""
    threads: int = 1                # threads the code is scheduled for (the worker pool's)
    arch: str = ""                  # GPU architecture ("sm_90"); "" for a CPU
    layouts: tuple[str, ...] = ()   # layout rewrites convert_layout applies, by name
    fusion: Fusion = Fusion()       # what its kernels can take as one (fuse_ops)
    # (layout, panel width) its templates read packed weights in, by default: dense B panels'
    # columns, conv weight blocks' output channels
    panels: tuple[tuple[str, int], ...] = ()
    # the products' arithmetic (PRECISIONS): "fp32", or tensor cores on operands rounded to
    # tf32 / fp16 / bf16 with fp32 accumulation
    precision: str = "fp32"
    # at precision fp16 / bf16, store a float32 model's weights and activations in that type
    # (passes/store_half.py): the target's templates read 16-bit operands
    half_storage: bool = False
    gpu: GPU | None = None          # a GPU target's figures (SMs, throughput); None for a CPU
    # the 16-bit float types ("float16", "bfloat16") its kernels compute on as a model stores
    # them; a model's values of the others are computed in float32, converted at compile time
    # (passes/widen_half.py). The target's entry says, from the machine's features.
    half_arithmetic: tuple[str, ...] = ("float16", "bfloat16")
    # a CPU's multiply-adds of its widest vectors a cycle, which the cost models read
    # (passes/conv_costs.py): 2 (two full-width FMA pipes) unless the host measured fewer
    # (backends/llvm/fma_rate.py: Zen 4 runs AVX-512 in halves, 1)
    fma_ports: int = 2

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ArgumentError(f"Target precision must be one of {', '.join(PRECISIONS)}, "
                                f"not {self.precision!r}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or \
                self.threads < 1:
            raise ArgumentError(f"Target threads must be a positive integer, not "
                                f"{self.threads!r}")
        unsigned = [f for f in self.features.split(",") if f and f[0] not in "+-"]
        if unsigned:
            raise ArgumentError(f"Target features are signed (+avx2 or -avx512f), not "
                                f"{', '.join(map(repr, unsigned))}")
        if isinstance(self.layouts, str):   # ("pack_dense") is a string, not a tuple
            raise ArgumentError(f"Target layouts is a tuple of names, not {self.layouts!r}")

    @property
    def feature_set(self) -> frozenset[str]:
        """The features the code may use (the `+` ones)."""
        return frozenset(f[1:] for f in self.features.split(",") if f.startswith("+"))

    @property
    def vector_bits(self) -> int:
        fs = self.feature_set
        if "avx512f" in fs:
            return 512
        if "avx" in fs or "avx2" in fs:
            return 256
        return 128

    @property
    def key(self) -> str:
        """What tuning results depend on: the target, and its CPU and features or its GPU
        architecture (not the thread count), and its precision where it is not fp32 (so that
        fp32 logs and caches written before precisions existed keep their keys, and a tf32
        record never applies to an fp32 compile). A tuning record applies where the key
        matches."""
        key = f"{self.name}:{self.arch or self.cpu}:{self.features}"
        return key if self.precision == "fp32" else f"{key}:{self.precision}"

    def panel(self, layout: str) -> int:
        """The panel width the target's templates read weights packed by `layout` in (their
        default config's: a knob of the template, which the layout must agree with)."""
        for name, width in self.panels:
            if name == layout:
                return width
        raise CompileError(f"target {self.name} declares no panel width for layout "
                           f"{layout!r} (it has: {', '.join(n for n, _ in self.panels)})")
