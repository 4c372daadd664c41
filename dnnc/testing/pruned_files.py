"""Pruned ONNX files as users make them with `dnnc sparsify` (issue 34), for tests and
benchmarks: a zoo model (resnet50, mobilenet_v2, bert, ...) magnitude-pruned to a sparsity in a
pattern by `compiler/sparsify.py`, depthwise convolutions left dense (as issue 34's bar keeps
mobilenet_v2's), and any layer whose axes the pattern does not divide (resnet50's 7x7x3 first
conv under 2:4) left dense too, as a user would with `--keep`.

Files are written once per (model, batch, sparsity, pattern, options) and reused: the name
says what is in them. `pruned_copy` prunes any ONNX file the same way (torch's exports in
`bench/torch_models.py`'s folder). This module never times or compiles anything.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from .. import zoo
from ..compiler.sparsify import find_layers, parse_pattern, prune


def undivided_layers(model: onnx.ModelProto, pattern: str) -> list[str]:
    """The layers (node names) whose axes `pattern`'s groups or blocks do not divide."""
    parsed = parse_pattern(pattern)
    if parsed.kind == "unstructured":
        return []
    return [l.node for l in find_layers(model) if not parsed.divides(*l.matrix_shape)]


def pruned_model(name: str, sparsity: float | None, pattern: str = "unstructured",
                 batch=1, **config) -> onnx.ModelProto:
    """Zoo model `name` (`zoo.build(name, batch, **config)`) pruned to `sparsity` in
    `pattern` (an N:M pattern implies it: None), the layers it does not fit left dense."""
    model = zoo.build(name, batch=batch, **config)
    return prune(model, sparsity, pattern, keep=undivided_layers(model, pattern)).model


def pruned_copy(path, folder, sparsity: float | None, pattern: str = "unstructured") -> Path:
    """The ONNX file `path` (a torch export, say) pruned as `pruned_model` prunes a zoo model,
    saved in `folder` as NAME_PATTERN_SPARSITY.onnx, or the file already there."""
    sparse = parse_pattern(pattern).fixed_sparsity if sparsity is None else sparsity
    out = Path(folder) / f"{Path(path).stem}_{pattern.replace(':', 'of')}_{sparse:g}.onnx"
    if not out.exists():
        model = onnx.load(path)
        _save(prune(model, sparsity, pattern, keep=undivided_layers(model, pattern)).model,
              out)
    return out


def pruned_file(folder, name: str, sparsity: float | None, pattern: str = "unstructured",
                batch=1, **config) -> Path:
    """`pruned_model(...)` saved in `folder` (made if missing), or the file already there."""
    sparse = parse_pattern(pattern).fixed_sparsity if sparsity is None else sparsity
    tag = "".join(f"_{k}{v}" for k, v in sorted(config.items()))
    path = Path(folder) / f"{name}_b{batch}{tag}_{pattern.replace(':', 'of')}_{sparse:g}.onnx"
    if not path.exists():
        _save(pruned_model(name, sparsity, pattern, batch, **config), path)
    return path


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".partial")
    onnx.save(model, temporary)
    temporary.replace(path)   # a reader never sees half a file
