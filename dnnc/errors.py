"""The errors dnnc raises for user mistakes and unsupported input, and the warnings it gives.

Every error a user can cause is a `DNNCError`; a bare assertion or a traceback from deep inside the
compiler means a dnnc bug, never a user mistake. Messages name the thing at fault: the ONNX node,
the input, the op and its opset.
"""

from __future__ import annotations


class DNNCError(Exception):
    """Base class of every error dnnc raises on purpose."""


class ModelFormatError(DNNCError):
    """The model file or proto is malformed, truncated or inconsistent."""


class UnsupportedOpError(DNNCError):
    """One or more ops of a model have no importer, or nodes their importer refuses (an
    attribute value or a non-constant input it cannot translate); lists every one of them at
    once.

    `ops` holds (op_type, domain, opset, [node names]) tuples; a refused node's name carries
    the reason in parentheses.
    """

    def __init__(self, ops: list[tuple[str, str, int, list[str]]]):
        self.ops = ops
        lines = []
        for op_type, domain, opset, nodes in ops:
            where = ", ".join(repr(n) for n in nodes[:5])
            more = f" and {len(nodes) - 5} more" if len(nodes) > 5 else ""
            qualified = f"{domain}::{op_type}" if domain else op_type
            lines.append(f"  {qualified} (opset {opset}): nodes {where}{more}")
        super().__init__(f"{len(ops)} unsupported op(s) in the model:\n" + "\n".join(lines))


class UnsupportedTypeError(DNNCError):
    """A tensor element type dnnc does not handle (float8, int2, float4, string, ...; int4 /
    uint4 are held as int8 / uint8, not refused)."""


class ShapeError(DNNCError):
    """Shape or type inference found inputs an op cannot accept."""


class CompileError(DNNCError):
    """A stage of compilation failed; the message names the node or kernel."""


class ConfigError(DNNCError):
    """A schedule config outside its template's knob space: names the template, the knob and
    its allowed values, or the constraint between knobs it breaks."""


class InputError(DNNCError):
    """A compiled model was called with the wrong number, shapes or dtypes of inputs, or with
    values an op cannot take (a gather or scatter index out of range: names the node)."""


class IndexRangeError(IndexError):
    """An op's reference met an index outside [-bound, bound - 1] (a gather or scatter at run
    time). Not a `DNNCError`: the interpreter turns it into an `InputError` naming the node."""

    def __init__(self, index: int, bound: int):
        self.index, self.bound = index, bound
        super().__init__(f"index {index} is out of range for an axis of size {bound} "
                         f"(valid: {-bound} to {bound - 1})")


class ArtifactError(DNNCError):
    """A saved artifact cannot be loaded here: corrupt or truncated, another format or dnnc
    version, or compiled for CPU features this machine lacks (the message names them)."""


class TraceError(DNNCError):
    """`fn` did something tracing cannot record: an unsupported NumPy function, a branch on a
    traced value, a promotion dnnc would compute differently from NumPy."""


class ExportError(DNNCError):
    """The graph has ops or attributes with no ONNX form at the requested opset."""


class ArgumentError(DNNCError, ValueError):
    """An argument of a dnnc function, method or command has the wrong type or value, or does
    not apply (an option of another target, a name the model lacks); the message names it."""


class UnsupportedOpsetError(DNNCError):
    """The model imports a version of the default ONNX domain newer than dnnc knows, whose ops
    may mean something its importers do not implement."""


class OutOfMemoryError(DNNCError, MemoryError):
    """A tensor needs more memory than this machine has: refused at compile time when its
    size is static, reported at call time otherwise; names the node (or the call's dims)."""


class DeviceError(DNNCError):
    """A target's device cannot be used here: its library is not installed (CuPy for the cuda
    target; the message names the pip package) or no device is visible (no CUDA GPU, a driver
    too old); the message says which."""


class DNNCWarning(UserWarning):
    """Base class of every warning dnnc gives on purpose (the `dnnc` command prints each as
    one `dnnc: warning: ...` line)."""


class TuningLogWarning(DNNCWarning):
    """A tuning log's line that could not be read (skipped), a logged config its template no
    longer accepts, or a log with no record for the model and target compiled."""
