"""torch.export's ExportedProgram -> dnnc Graph: the ahead-of-time path, `dnnc.compile(ep)`
for `torch.export.export(model, args, dynamic_shapes=...)`.

The program is decomposed to core ATen (`run_decompositions` with `torch_fx.DECOMPOSITIONS`,
the table the torch.compile backend gives aot_autograd) and its graph goes through the same FX
importer (`torch_fx.import_fx`): parameters, buffers and constant tensors become constants of
the graph (read once, here), the user inputs its inputs, and a dim declared dynamic with
`torch.export.Dim` (a symbol such as `s77` in the program) a dnnc symbolic dim. The Graph is
then compiled, saved and loaded as an ONNX model's is. This module imports torch (only
`dnnc.compile` given an ExportedProgram imports it) and never compiles or runs a graph.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import ArgumentError, CompileError, UnsupportedTypeError
from ..ir.graph import Graph
from .torch_fx import DECOMPOSITIONS, import_fx, tensor_array

__all__ = ["import_exported"]

FROZEN_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
"""The program inputs whose values it holds: they become the graph's constants."""


def import_exported(program: ExportedProgram, name: str | None = None) -> Graph:
    """The dnnc Graph of `program`: its user inputs the graph's inputs (the program's names,
    dynamic dims symbolic), its user outputs the graph's outputs, its parameters, buffers and
    constant tensors constants. Raises `CompileError` for a program that writes a buffer (a
    graph of dnnc holds no state between calls), `UnsupportedTypeError` for one that takes an
    opaque object or an effect token, and what `import_fx` raises for ops dnnc does not
    import (every one named at once)."""
    if not isinstance(program, ExportedProgram):
        raise ArgumentError(f"import_exported takes a torch.export.ExportedProgram, not "
                            f"{type(program).__name__}")
    program = program.run_decompositions(DECOMPOSITIONS)
    signature = program.graph_signature
    written = [s.target for s in signature.output_specs if s.kind != OutputKind.USER_OUTPUT]
    if written:
        raise CompileError(f"the exported program writes {', '.join(map(str, written))}: "
                           f"dnnc compiles programs without state (export the model in eval "
                           f"mode, its buffers unchanged by a call)")
    frozen = {}
    for i, spec in enumerate(signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in FROZEN_KINDS:
            raise UnsupportedTypeError(f"the exported program's input {spec.arg.name} is a "
                                       f"{spec.kind.name.lower()}, which dnnc does not take")
        value = program.state_dict.get(spec.target)
        if value is None:   # a non-persistent buffer, a tensor constant
            value = program.constants[spec.target]
        # a copy on the host: the compile owns its constants (a CUDA weight read once)
        frozen[i] = tensor_array(value.detach().to("cpu", copy=True))
    with torch.no_grad():
        return import_fx(program.graph_module, frozen, name=name or "exported")
